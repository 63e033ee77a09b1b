#!/bin/sh
# SPDX-License-Identifier: MIT
# GPU check: on a machine with an NVIDIA GPU, build with CUDA, run the whole test
# suite (the cuda suite compares CUDA with the CPU on the same inputs; the unit
# suite then exercises the CUDA backend too), record the registers/spills of every
# attention kernel, run the attention benchmark in GPU mode (paged vs contiguous,
# fraction of device-to-device copy bandwidth), the allocator benchmark (pool vs
# cudaMalloc) and the decoder on the CUDA backend against the CPU.
# Writes everything under OUT_DIR and a summary in OUT_DIR/report.md (the file to
# read when only a few files come back from the machine).
# Budget: under 5 minutes on a 16-core machine (the build dominates).
#
# usage: bench/gpu_check.sh OUT_DIR [BUILD_DIR]
# exit: 0 all ran and tests passed, 1 a step failed, 2 bad usage / no GPU.
set -u

if [ $# -lt 1 ] || [ "$1" = "--help" ] || [ "$1" = "-h" ]; then
    echo "usage: $0 OUT_DIR [BUILD_DIR]   (run from the repository root)" >&2
    exit 2
fi
out=$1
build=${2:-build-gpucheck}
mkdir -p "$out" || exit 1
report="$out/report.md"
status=0

if ! command -v nvidia-smi >/dev/null 2>&1 || ! nvidia-smi -L >"$out/gpu.txt" 2>&1; then
    echo "no NVIDIA GPU visible (nvidia-smi failed); nothing to check" >&2
    exit 2
fi
nvidia-smi --query-gpu=name,memory.total,clocks.max.sm,clocks.max.mem,driver_version \
    --format=csv >>"$out/gpu.txt" 2>&1

{
    echo "# Attention GPU check"
    echo
    echo "- date: $(date -u '+%Y-%m-%d %H:%M UTC')"
    echo "- commit: $(git rev-parse --short HEAD 2>/dev/null || echo unknown)"
    echo "- GPU: $(sed -n 1p "$out/gpu.txt")"
    echo "- nvcc: $(nvcc --version 2>/dev/null | tail -1)"
    echo
} >"$report"

jobs=$(nproc 2>/dev/null || echo 4)
start=$(date +%s)
if [ ! -d "$build" ]; then
    meson setup "$build" -Dcuda=enabled -Dbuildtype=release >"$out/setup.log" 2>&1 || {
        echo "meson setup failed: see setup.log" >>"$report"; exit 1; }
fi
# -Xptxas -v output of the attention .cu files is kept for the register table.
ninja -C "$build" -j "$jobs" >"$out/build.log" 2>&1 || {
    echo "build failed: see build.log" >>"$report"; exit 1; }
echo "- build: $(( $(date +%s) - start )) s" >>"$report"

# Registers and spills per kernel, from the compiled objects.
if command -v cuobjdump >/dev/null 2>&1; then
    for o in "$build"/libpagedkv.a.p/src_attention_attn_*.cu.o \
             "$build"/libpagedkv.so*.p/src_attention_attn_*.cu.o; do
        [ -f "$o" ] && cuobjdump -res-usage "$o" 2>/dev/null
    done >"$out/res_usage.txt"
    {
        echo
        echo "## Registers per thread (cuobjdump -res-usage)"
        echo '```'
        grep -E "Function|REG" "$out/res_usage.txt" | paste - - | \
            sed -E 's/.*Function ([^ :]+).*REG:([0-9]+).*STACK:([0-9]+).*/\2 regs, stack \3: \1/' | \
            sort -u | head -60
        echo '```'
    } >>"$report"
fi

echo >>"$report"
echo "## Tests (all suites, with a device present)" >>"$report"
if timeout 240 meson test -C "$build" --print-errorlogs --num-processes "$jobs" >"$out/tests.log" 2>&1; then
    echo "- meson test: PASS" >>"$report"
else
    echo "- meson test: FAIL (see tests.log)" >>"$report"
    status=1
fi
grep -E "^ *[0-9]+/[0-9]+ " "$out/tests.log" | sed 's/^/    /' >>"$report"
"$build/tests/test_attention_cuda" --verbose >"$out/test_attention_cuda.log" 2>&1

echo >>"$report"
echo "## Attention benchmark (GPU mode)" >>"$report"
cmd="$build/bench/bench_attention --gpu --batch 1,8,64 --context 1024,4096,16384 --max-mib 4096 --min-time 0.2"
echo "command: \`$cmd\`" >>"$report"
echo '```' >>"$report"
if timeout 120 $cmd >"$out/bench_attention_gpu.txt" 2>"$out/bench_attention_gpu.err"; then
    cat "$out/bench_attention_gpu.txt" >>"$report"
    $cmd --json >"$out/bench_attention_gpu.json" 2>/dev/null || true
else
    echo "benchmark failed:" >>"$report"
    cat "$out/bench_attention_gpu.err" >>"$report"
    status=1
fi
echo '```' >>"$report"

echo >>"$report"
echo "## Allocator: pool against cudaMalloc" >>"$report"
echo '```' >>"$report"
timeout 60 "$build/bench/bench_alloc" --quick >>"$report" 2>&1 || status=1
echo '```' >>"$report"

echo >>"$report"
echo "## Decoder: CUDA backend against the CPU (same weights, greedy)" >>"$report"
gen="$build/tools/pkv-generate --model tiny --max-new 32 --seed 3 1 2 3 4 5 6 7 8"
cpu_tokens=$($gen --backend cpu 2>&1 | grep '^tokens:')
cuda_tokens=$($gen --backend cuda 2>&1 | grep '^tokens:')
echo "- cpu:  $cpu_tokens" >>"$report"
echo "- cuda: $cuda_tokens" >>"$report"
if [ -n "$cuda_tokens" ] && [ "$cpu_tokens" = "$cuda_tokens" ]; then
    echo "- same tokens: yes" >>"$report"
else
    echo "- same tokens: NO" >>"$report"
    status=1
fi
echo '```' >>"$report"
timeout 60 $gen --backend cuda --profile >>"$report" 2>&1 || status=1
echo '```' >>"$report"

# ---- replay run mode, every policy on CUDA (issue 16; owner: replay) ----
# A short run-mode replay of every policy: real cudaMalloc / cudaFree per
# request, per token and per regrowth, measured; then the sim calibrated against
# it (achieved bandwidth, compute, per-call cost). gpt2-small, not llama2-7b:
# every policy builds its own model, and 8 x 27 GB of fp32 random weights would
# not fit this script's time budget.
echo >>"$report"
echo "## Replay: run mode of every policy on CUDA, and the calibrated sim" >>"$report"
echo '```' >>"$report"
head -9 traces/conv_small.csv >"$out/replay_run8.csv"
timeout 300 "$build/tools/pkv-replay" --quiet --mode run --cuda --model gpt2-small --kv-mem 2G \
    --policy all --json "$out/replay_run_cuda.json" \
    --calibrate-out "$out/replay_calibration_cuda.json" "$out/replay_run8.csv" >>"$report" 2>&1 || status=1
echo '```' >>"$report"

echo "- total: $(( $(date +%s) - start )) s" >>"$report"
cat "$report"
exit $status

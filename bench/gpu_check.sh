#!/bin/sh
# SPDX-License-Identifier: MIT
# GPU check for one H200 (sm_90) lent for a few minutes. It needs no Criterion,
# OpenBLAS or jemalloc (the GPU machine has none): it builds only what runs on
# the GPU, for sm_90 only, then
#   1. pkv-check: every CUDA kernel and the CUDA decoder against the CPU (verdict);
#   2. registers / spills / global loads in flight per kernel (bench/sass_loads.py);
#   3. compute-sanitizer memcheck and racecheck on pkv-check's small grid;
#   4. bench_attention --gpu, GQA 32/8 and MHA 32/32, batch 1-256, context 1k-32k,
#      fp16, table and JSON from the same run;
#   5. bench_alloc: pool against cudaMalloc/cudaFree (the allocation cost rows);
#   6. the decoder's per-op profile on the CUDA backend;
#   7. replay run mode of every policy on CUDA (tiny model), calibrated sim;
#   8. the same at llama2-7b's shape (random weights, 8 GiB of fp32 K/V).
# Every step has a timeout and the whole run a deadline (DEADLINE_S, default
# 450 s after the start, under 8 minutes); a step that fails or times out is
# recorded and the next one runs. OUT_DIR/report.md is written as the steps
# go, so it exists whatever happens; every step's output is in OUT_DIR/*.log.
#
# usage: bench/gpu_check.sh [--dry-run] OUT_DIR [BUILD_DIR]   (from the repo root)
#   --dry-run  no GPU needed: the same setup and build, the static SASS step,
#              and every GPU step replaced by its program's --help (it must be
#              built and take its options). Run in CI with pkg-config unable to
#              find Criterion, OpenBLAS and jemalloc.
# exit: 0 every step passed, 1 a step failed or timed out, 2 bad usage or no GPU.
set -u

dry=0
if [ "${1:-}" = "--dry-run" ]; then
    dry=1
    shift
fi
if [ $# -lt 1 ] || [ "$1" = "--help" ] || [ "$1" = "-h" ]; then
    sed -n '3,25p' "$0" | sed 's/^# \{0,1\}//' >&2
    exit 2
fi
out=$1
build=${2:-build-gpucheck}
mkdir -p "$out" || exit 2
report="$out/report.md"
start=$(date +%s)
deadline=$((start + ${DEADLINE_S:-450}))
status=0
jobs=$(nproc 2>/dev/null || echo 4)
[ -x /usr/local/cuda/bin/nvcc ] && PATH="$PATH:/usr/local/cuda/bin" && export PATH

if [ $dry -eq 0 ]; then
    if ! command -v nvidia-smi >/dev/null 2>&1 || ! nvidia-smi -L >"$out/gpu.txt" 2>&1; then
        echo "gpu_check: no NVIDIA GPU visible (nvidia-smi failed); use --dry-run here" >&2
        exit 2
    fi
    nvidia-smi --query-gpu=name,memory.total,clocks.max.sm,clocks.max.mem,driver_version \
        --format=csv >>"$out/gpu.txt" 2>&1
else
    echo "dry run: no GPU used" >"$out/gpu.txt"
fi

# The report is assembled from three parts after every step (and on exit), so
# that a run killed at any point still leaves a readable report.md.
{
    echo "# GPU check$( [ $dry -eq 1 ] && echo ' (dry run: GPU steps stubbed)')"
    echo
    echo "- date: $(date -u '+%Y-%m-%d %H:%M UTC')"
    echo "- commit: $(git rev-parse --short HEAD 2>/dev/null || echo unknown)"
    echo "- GPU: $(sed -n 1p "$out/gpu.txt")"
    echo "- nvcc: $(nvcc --version 2>/dev/null | tail -1)"
    echo
    echo "| step | result | seconds | log |"
    echo "|---|---|---|---|"
} >"$out/.head.md"
: >"$out/.steps.md"
: >"$out/.sections.md"
assemble() {
    cat "$out/.head.md" "$out/.steps.md" "$out/.sections.md" >"$report"
}
assemble

# step NAME TIMEOUT_S CMD...: run CMD under a timeout (bounded by the deadline),
# output in OUT/NAME.log, one row in the report. Returns CMD's status.
step() {
    name=$1
    limit=$2
    shift 2
    now=$(date +%s)
    left=$((deadline - now))
    if [ $left -lt 5 ]; then
        echo "| $name | SKIPPED (deadline) | 0 | - |" >>"$out/.steps.md"
        assemble
        status=1
        return 1
    fi
    [ "$limit" -gt "$left" ] && limit=$left
    t0=$(date +%s)
    timeout -k 5 "$limit" "$@" >"$out/$name.log" 2>&1
    rc=$?
    secs=$(($(date +%s) - t0))
    if [ $rc -eq 0 ]; then
        res=PASS
    elif [ $rc -eq 124 ] || [ $rc -eq 137 ]; then
        res="TIMEOUT (${limit} s)"
    else
        res="FAIL (exit $rc)"
    fi
    [ $rc -ne 0 ] && status=1
    echo "| $name | $res | $secs | $name.log |" >>"$out/.steps.md"
    assemble
    return $rc
}

# gpu NAME TIMEOUT_S CMD...: a step that needs the GPU. In a dry run the program
# (the first word that is a file, after any compute-sanitizer prefix) is run with
# --help instead: it must exist and parse its options.
gpu() {
    name=$1
    limit=$2
    shift 2
    if [ $dry -eq 0 ]; then
        step "$name" "$limit" "$@"
        return $?
    fi
    prog=
    for w in "$@"; do
        if [ -f "$w" ] && [ -x "$w" ]; then
            prog=$w
            break
        fi
    done
    if [ -z "$prog" ]; then
        echo "| $name | FAIL (dry run: no built program in: $*) | 0 | - |" >>"$out/.steps.md"
        status=1
        return 1
    fi
    echo "dry run: would run: $*" >"$out/$name.cmd"
    step "$name" 20 "$prog" --help
}

section() {
    {
        echo
        echo "## $1"
        echo
        [ -n "${2:-}" ] && echo "command: \`$2\`" && echo
        echo '```'
        if [ -f "$out/$3" ]; then
            head -c "${4:-20000}" "$out/$3"
        else
            echo "(no output)"
        fi
        echo '```'
    } >>"$out/.sections.md"
    assemble
}

finished=0
finish() {
    [ $finished -eq 1 ] && return
    finished=1
    {
        echo
        echo "- total: $(($(date +%s) - start)) s"
        echo "- verdict: $([ $status -eq 0 ] && echo PASS || echo FAIL)"
    } >>"$out/.steps.md"
    assemble
}
trap finish EXIT
trap 'status=1; echo "| (interrupted) | FAIL | - | - |" >>"$out/.steps.md"; finish; exit 1' INT TERM

# ---- setup and build: sm_90 only, no test framework, no optional libraries ----
if [ ! -f "$build/build.ninja" ]; then
    step setup 90 meson setup "$build" -Dcuda=enabled -Dgpu_archs=90 -Dbuildtype=release \
        -Dtests=false -Dcriterion=disabled -Dblas=auto -Djemalloc=auto -Dbench=true
fi
# Only the programs this script runs (and the library under them).
step build 200 ninja -C "$build" -j "$jobs" tools/pkv-check bench/bench_attention \
    bench/bench_alloc tools/pkv-generate tools/pkv-replay
check="$build/tools/pkv-check"
battn="$build/bench/bench_attention"

# ---- 1. correctness first: a kernel that is wrong is not worth timing ----
gpu pkv_check 90 "$check"
section "pkv-check: CUDA against the CPU" "pkv-check" pkv_check.log

# ---- 2. static: registers, spills, loads in flight (runs here too) ----
if command -v cuobjdump >/dev/null 2>&1; then
    # The library's CUDA objects (meson keeps them under libpagedkv.so*.p or
    # libpagedkv.a.p), each file once.
    objs=$(find "$build" -maxdepth 2 -path '*libpagedkv*' \( -name 'src_attention_attn_*.cu.o' \
        -o -name 'src_runtime_model_ops_cuda.cu.o' \) | awk -F/ '!seen[$NF]++')
    step sass 60 python3 bench/sass_loads.py --arch sm_90 $objs
    section "Registers, spills and global loads in flight per thread (sm_90 SASS)" \
        "bench/sass_loads.py --arch sm_90 <objects>" sass.log
else
    echo "| sass | SKIPPED (no cuobjdump) | 0 | - |" >>"$out/.steps.md"
fi

# ---- 3. memory and race checker on the small grid ----
if command -v compute-sanitizer >/dev/null 2>&1 || [ $dry -eq 1 ]; then
    san=$(command -v compute-sanitizer || echo compute-sanitizer)
    gpu memcheck 75 "$san" --tool memcheck --error-exitcode 9 "$check" --quick \
        --only decode --only splitk --only prefill --only write --only copy --only bad
    section "compute-sanitizer memcheck (pkv-check --quick)" "" memcheck.log 4000
    gpu racecheck 75 "$san" --tool racecheck --error-exitcode 9 "$check" --quick \
        --only splitk --only prefill --only write --only copy --only bad
    section "compute-sanitizer racecheck (pkv-check --quick)" "" racecheck.log 4000
else
    echo "| memcheck, racecheck | SKIPPED (no compute-sanitizer) | 0 | - |" >>"$out/.steps.md"
    status=1
fi

# ---- 4. decode attention bandwidth, GQA 32/8 then MHA ----
grid="--gpu --dtype fp16 --batch 1,16,64,256 --context 1024,4096,16384,32768 --max-mib 2048 --min-time 0.1"
# shellcheck disable=SC2086
gpu bench_gqa 75 "$battn" $grid --heads 32 --kv-heads 8 --json-out "$out/bench_gqa.json"
section "Decode attention, GQA 32/8 (Llama-3-8B heads), fp16" \
    "bench_attention $grid --heads 32 --kv-heads 8" bench_gqa.log
# shellcheck disable=SC2086
gpu bench_mha 75 "$battn" $grid --heads 32 --kv-heads 32 --json-out "$out/bench_mha.json"
section "Decode attention, MHA 32/32, fp16" "bench_attention $grid --heads 32 --kv-heads 32" \
    bench_mha.log

# ---- 5. allocation cost rows: pool against cudaMalloc/cudaFree ----
gpu bench_alloc 45 "$build/bench/bench_alloc" --quick
section "Allocator: pool against cudaMalloc/cudaFree" "bench_alloc --quick" bench_alloc.log

# ---- 6. the decoder on the CUDA backend, per-op profile ----
gpu decoder_profile 45 "$build/tools/pkv-generate" --model tiny --max-new 32 --seed 3 \
    --backend cuda --profile 1 2 3 4 5 6 7 8
section "Decoder on CUDA (tiny, 32 greedy tokens, --profile)" "" decoder_profile.log

# ---- 7. replay run mode of every policy on CUDA (issue 16; owner: replay) ----
# Real cudaMalloc/cudaFree per request, per token and per regrowth, measured in
# the step; then sim calibrated against it (achieved bandwidth, compute,
# per-call cost) and its error per policy. Tiny model, 8 requests: a short step.
head -9 traces/conv_small.csv >"$out/replay_run8.csv"
gpu replay_run_cuda 45 "$build/tools/pkv-replay" --quiet --mode run --cuda --kv-mem 32M \
    --policy all --json "$out/replay_run_cuda.json" \
    --calibrate-out "$out/replay_calibration_cuda.json" "$out/replay_run8.csv"
section "Replay: run mode of every policy on CUDA, calibrated sim" \
    "pkv-replay --mode run --cuda --policy all --calibrate-out" replay_run_cuda.log

# ---- 8. the same at llama2-7b's shape (issue 16) ----
# Random weights (fp32, 27 GB: built once for all nine policies), fp32 K/V of
# 1 MiB per token, an 8 GiB budget, the first 4 requests of conv_small: real
# cudaMalloc per token and per request at sizes an engine sees, realloc-copy's
# GB-sized row copies, vmm's cuMemMap of 2 MiB pages, and the layouts' step
# times at a 7B model's weight and K/V traffic.
head -5 traces/conv_small.csv >"$out/replay_run4.csv"
gpu replay_run_7b 120 "$build/tools/pkv-replay" --quiet --mode run --cuda --model llama2-7b \
    --kv-mem 8G --policy all --json "$out/replay_run_7b.json" \
    --calibrate-out "$out/replay_calibration_7b.json" "$out/replay_run4.csv"
section "Replay: run mode of every policy on CUDA, llama2-7b shape" \
    "pkv-replay --mode run --cuda --model llama2-7b --kv-mem 8G --policy all" replay_run_7b.log

finish
cat "$report"
exit $status

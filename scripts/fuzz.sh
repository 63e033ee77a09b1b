#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# Build the libFuzzer harnesses of tests/fuzz/ with clang (ASan + UBSan, float
# casts included, every report fatal) and run each for a bounded time.
# Usage: scripts/fuzz.sh [SECONDS_PER_TARGET [TARGET...]]
#   SECONDS_PER_TARGET  default 60 (CI); e.g. 1800 for a long run on demand
#   TARGET              fuzz_trace, fuzz_tracegen, fuzz_allocator, fuzz_replay,
#                       fuzz_plugin, fuzz_hybrid (default: all)
# Environment: FUZZ_DIR (default build-fuzz) holds the binaries, the growing
# corpora (seeded from tests/fuzz/corpus/TARGET, which stays small and
# committed) and any crash artifacts; CC (default clang).
# Exit status: 0 when every target ran its time without a finding, 1 otherwise
# (the crashing input is in $FUZZ_DIR/artifacts/, with the command to replay it).
set -euo pipefail
cd "$(dirname "$0")/.."
secs="${1:-60}"
shift || true
targets=("$@")
if ((${#targets[@]} == 0)); then
    targets=(fuzz_trace fuzz_tracegen fuzz_allocator fuzz_replay fuzz_plugin fuzz_hybrid)
fi
cc="${CC:-clang}"
dir="${FUZZ_DIR:-build-fuzz}"
mkdir -p "$dir/artifacts"
command -v "$cc" >/dev/null || { echo "fuzz: $cc not found (scripts/deps.sh --fuzz installs clang)" >&2; exit 2; }

# The library sources each harness needs, compiled into it (no meson build, so
# the harnesses stay independent of the build options).
trace_src=(src/runtime/trace/trace.c src/runtime/trace/rows.c src/runtime/trace/csv.c
           src/runtime/trace/jsonl.c src/runtime/trace/generator.c)
alloc_src=(src/allocator/pool.c src/allocator/seqset.c src/allocator/prefix_cache.c)
hybrid_src=(src/allocator/{status,pool,seqset,lcm,block_hash,sha256,kv_events}.c src/allocator/hybrid*.c)
# The replay harnesses need the whole library without CUDA or BLAS (run mode
# links in but never runs: sim only).
replay_src=(src/allocator/{status,pool,seqset,backend,backend_host,backend_cuda_none,cache}.c
            src/allocator/{prefix_cache,extent,vmm,vmm_budget,vmm_host,vmm_hybrid,vmm_cuda_none,lcm,block_hash,sha256,kv_events}.c
            src/allocator/hybrid*.c
            src/attention/{attn_check,attn_check_window,attn_plan,attn_cpu,attn_cpu_copy}.c
            src/attention/{attn_cpu_quant,attn_cpu_window,attn_cuda_none}.c
            src/runtime/model/{config,config_sizes,model,weights,loader,ops_cpu,contig_kv}.c
            src/runtime/model/{sampler,generate,hetero_cpu,state_store,hybrid_store,slot_store}.c
            "${trace_src[@]}" src/runtime/replay/*.c src/runtime/replay/policies/*.c)
# What meson generates: the build options (no CUDA, no BLAS) and the version.
gen="$dir/gen"
mkdir -p "$gen/pkv"
printf '#pragma once\n#define PKV_HAVE_BLAS 0\n#define PKV_HAVE_CUDA 0\n#define PKV_HAVE_XXHASH 0\n' >"$gen/pkv_config.h"
sed 's/@PKV_VERSION_MAJOR@/0/; s/@PKV_VERSION_MINOR@/0/; s/@PKV_VERSION_PATCH@/0/; s/@PKV_VERSION@/fuzz/' \
    include/pkv/version.h.in >"$gen/pkv/version.h"
flags=(-std=c11 -D_POSIX_C_SOURCE=200809L -DPKV_BUILDING -g -O1 -I"$gen" -Iinclude -I.
       -Isrc/allocator -Isrc/runtime/trace -fno-omit-frame-pointer
       -fsanitize=fuzzer,address,undefined,float-cast-overflow -fno-sanitize-recover=all)
# max_len per target: a few KiB of trace text, a few hundred allocator ops, the
# replay's options + 12 requests (+ a plugin's script of lies).
declare -A srcs=([fuzz_trace]="${trace_src[*]}" [fuzz_tracegen]="${trace_src[*]}"
                 [fuzz_allocator]="${alloc_src[*]}" [fuzz_replay]="${replay_src[*]}"
                 [fuzz_plugin]="${replay_src[*]}" [fuzz_hybrid]="${hybrid_src[*]}")
declare -A maxlen=([fuzz_trace]=4096 [fuzz_tracegen]=128 [fuzz_allocator]=1024 [fuzz_replay]=60
                   [fuzz_plugin]=512 [fuzz_hybrid]=2048)

status=0
for t in "${targets[@]}"; do
    [[ -n "${srcs[$t]:-}" ]] || { echo "fuzz: unknown target $t" >&2; exit 2; }
    # shellcheck disable=SC2086
    "$cc" "${flags[@]}" -o "$dir/$t" "tests/fuzz/$t.c" ${srcs[$t]} -lm
    mkdir -p "$dir/corpus/$t"
    log="$dir/$t.log"
    echo "== $t: ${secs}s"
    set +e
    ASAN_OPTIONS=detect_leaks=1:allocator_may_return_null=1 \
    UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1 \
        "$dir/$t" -max_total_time="$secs" -timeout=10 -rss_limit_mb=2048 \
        -max_len="${maxlen[$t]}" -print_final_stats=1 -artifact_prefix="$dir/artifacts/$t-" \
        "$dir/corpus/$t" "tests/fuzz/corpus/$t" >"$log" 2>&1
    rc=$?
    set -e
    execs=$(sed -nE 's/^stat::number_of_executed_units: *([0-9]+)/\1/p' "$log")
    last=$(grep -E '^#[0-9]+' "$log" | tail -1 || true)
    cov=$(sed -nE 's/.* cov: ([0-9]+).*/\1/p' <<<"$last")
    ft=$(sed -nE 's/.* ft: ([0-9]+).*/\1/p' <<<"$last")
    corp=$(sed -nE 's/.* corp: ([0-9]+)\/.*/\1/p' <<<"$last")
    echo "   $t: rc=$rc executions=${execs:-?} coverage(edges)=${cov:-?} features=${ft:-?} corpus=${corp:-?}"
    if ((rc != 0)); then
        status=1
        echo "   $t FAILED; log tail:" >&2
        tail -40 "$log" >&2
        echo "   replay: $dir/$t $dir/artifacts/$t-*" >&2
    fi
done
exit $status

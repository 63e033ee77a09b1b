#!/bin/sh
# SPDX-License-Identifier: MIT
# Paging vs vAttention-style virtual-contiguous KV on the public traces
# (scripts/fetch_traces.sh, by default into traces/real/), as recorded in docs/BENCHMARKS.md ("vmm vs paged"): paged at
# block 16, contiguous-oracle, and vmm at 2 MiB and 64 KiB pages, in line (vmm-sync) and with
# map-ahead + deferred reclamation, under three costs per map/unmap call (0, 5 and
# 50 us: the cuda-boyer cudaMalloc figure; cuMemMap is not measured on a GPU here).
# usage: bench/replay_vmm_traces.sh BUILD_DIR TRACE_DIR OUT_DIR
#   e.g. bench/replay_vmm_traces.sh build traces/real /tmp/vmmruns
# A trace missing from TRACE_DIR is fetched there first.
set -eu
B=${1:?build dir}
T=${2:?trace dir}
O=${3:?output dir}
mkdir -p "$O"
S=$(cd "$(dirname "$0")/.." && pwd)/scripts/fetch_traces.sh
for f in azure_code_2023.csv azure_conv_2023.csv mooncake_fast25_conversation.jsonl; do
  [ -f "$T/$f" ] || "$S" --dest "$T" "${f%.*}"
done
R="$B/tools/pkv-replay --quiet"
run() { # name trace-file model ctx extra...
  name=$1; tr=$2; model=$3; ctx=$4; shift 4
  $R --model "$model" --max-seq-len "$ctx" --json "$O/$name.json" "$@" "$tr" > "$O/$name.txt"
}
for t in azure_code_2023 azure_conv_2023 mooncake; do
  case $t in
    mooncake) f="$T/mooncake_fast25_conversation.jsonl"; m=llama3-8b; c=131072 ;;
    *) f="$T/$t.csv"; m=llama2-7b; c=8192 ;;
  esac
  run "${t}_paged16" "$f" $m $c --policy paged --block-size 16
  run "${t}_oracle" "$f" $m $c --policy contiguous-oracle
  for us in 0 5 50; do
    for page in 2M 64K; do
      run "${t}_vmm${page}_${us}us" "$f" $m $c --policy vmm-sync --vmm-page $page --alloc-call-us $us
      run "${t}_vmm${page}_hide_${us}us" "$f" $m $c --policy vmm --vmm-page $page \
          --vmm-map-ahead --vmm-defer-reclaim --alloc-call-us $us
    done
  done
done

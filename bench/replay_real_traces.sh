#!/bin/sh
# SPDX-License-Identifier: MIT
# Replay the public traces of ../shared/traces (see SOURCES.md there; not part
# of the project) through every KV policy, as recorded in docs/BENCHMARKS.md.
# usage: bench/replay_real_traces.sh BUILD_DIR TRACE_DIR OUT_DIR
set -eu
B=${1:?build dir}
T=${2:?trace dir}
O=${3:?output dir}
mkdir -p "$O"
R="$B/tools/pkv-replay --quiet --policy all"
for gpu in a100-80g h200-141g; do
  for load in 1 4; do
    for tr in azure_code_2023 azure_conv_2023; do
      # Llama-2-7B shapes (MHA, 0.5 MiB of KV per token) with an 8K context so
      # that the Azure prompts (up to 14K tokens) are mostly served.
      $R --model llama2-7b --max-seq-len 8192 --gpu $gpu --load-scale $load \
         --json "$O/${tr}_${gpu}_x${load}.json" "$T/$tr.csv" > "$O/${tr}_${gpu}_x${load}.txt"
    done
  done
  # Mooncake prompts reach 126K tokens: Llama-3-8B shapes (GQA, 128 KiB per
  # token) with the 128K context of Llama 3.1 8B.
  $R --model llama3-8b --max-seq-len 131072 --gpu $gpu \
     --json "$O/mooncake_${gpu}_x1.json" "$T/mooncake_fast25_conversation.jsonl" \
     > "$O/mooncake_${gpu}_x1.txt"
done

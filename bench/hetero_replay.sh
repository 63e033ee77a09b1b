#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# Heterogeneous models (issue 23): replay the Mooncake FAST'25 conversation trace
# and the Azure 2023 conversation trace with gemma-3-27b and gpt-oss-120b on the
# h100-80g and h200-141g presets (sim mode), every memory layout side by side, and
# print one Markdown table: waste, max batch, throughput (and its ratio to paged),
# TTFT and TPOT per layout. docs/RESEARCH.md "Heterogeneous models" explains it.
#
# Usage: bench/hetero_replay.sh [BUILD_DIR] [REQUESTS] [LOAD_SCALES]
#   BUILD_DIR    a build with tools/pkv-replay (default: build)
#   REQUESTS     replay the first N requests of each trace (default 0: all of it)
#   LOAD_SCALES  pkv-replay --load-scale list (default 1,8: as recorded, and 8x
#                faster, where memory, not arrivals, limits the batch)
# The traces come from scripts/fetch_traces.sh (installed under traces/real).
# JSON reports are left in $OUT (default: a temporary folder, printed).
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
build="${1:-build}"
requests="${2:-0}"
loads="${3:-1,8}"
replay="$root/$build/tools/pkv-replay"
[[ -x "$replay" ]] || { echo "hetero_replay: no $replay (build first)" >&2; exit 2; }
out="${OUT:-$(mktemp -d)}"
mkdir -p "$out"
# Layouts: paged (every layer as full attention) and the hybrid ones this build has.
policies="${POLICIES:-paged,hybrid-partition,hybrid-shared-page,hybrid-lcm,hybrid-vmm}"
"$root/scripts/fetch_traces.sh" azure_conv_2023 mooncake_fast25_conversation >/dev/null
declare -A traces=([azure_conv_2023]="$root/traces/real/azure_conv_2023.csv"
                   [mooncake_conv]="$root/traces/real/mooncake_fast25_conversation.jsonl")
for name in azure_conv_2023 mooncake_conv; do
    src="${traces[$name]}"
    if [[ "$requests" != 0 ]]; then # a prefix: the CSV keeps its header line
        ext="${src##*.}"
        cut="$out/$name.head.$ext"
        if [[ "$ext" == csv ]]; then head -n "$((requests + 1))" "$src" >"$cut"; else head -n "$requests" "$src" >"$cut"; fi
        src="$cut"
    fi
    for model in gemma-3-27b gpt-oss-120b; do
        for gpu in h100-80g h200-141g; do
            # gpt-oss-120b ships MXFP4 expert weights (about 65 GB, what lets it run on
            # one 80 GB GPU), which the replay's one weight dtype cannot express: its
            # KV budget is given as (device memory - 65 GB) x 0.9, the rule
            # pkv-replay applies to fp16 weights (the roofline still reads its
            # weights at 2 bytes, so its absolute step times are pessimistic).
            budget=()
            if [[ "$model" == gpt-oss-120b ]]; then
                mem=$([[ "$gpu" == h100-80g ]] && echo 81559 || echo 143771) # MiB, the presets'
                budget=(--kv-mem "$(( (mem * 1048576 - 65000000000) / 10 * 9 ))")
            fi
            "$replay" -q --policy "$policies" --model "$model" --gpu "$gpu" --load-scale "$loads" \
                "${budget[@]}" --jobs 2 --json "$out/$name.$model.$gpu.json" "$src" >/dev/null
        done
    done
done
echo "reports in $out" >&2
python3 - "$out" <<'PY'
import glob, json, os, sys
rows = []
print("| trace | model | GPU | load | layout | waste % | budget waste % | max batch | tok/s | vs paged | TTFT p50 s | TPOT p50 ms | preempt |")
print("|---|---|---|---|---|---|---|---|---|---|---|---|---|")
for path in sorted(glob.glob(os.path.join(sys.argv[1], "*.json"))):
    trace, model, gpu = os.path.basename(path)[:-5].split(".")[:3]
    d = json.load(open(path))
    base = {}
    for r in d["runs"]:
        if r["policy"] == "paged":
            base[r["point"]["load_scale"]] = r["throughput"]["output_tokens_per_s"]
    for r in d["runs"]:
        m, ld = r["memory"], r["point"]["load_scale"]
        # Budget waste: time-averaged held - needed over the budget (internal
        # fragmentation incl. tokens out of every window, and the reserved tails).
        bw = 1 - m["breakdown"]["token_states"] - m["breakdown"]["free"] - m["breakdown"]["external_frag"]
        tps = r["throughput"]["output_tokens_per_s"]
        # "n/a" when POLICIES leaves paged out (or paged completed nothing).
        vs = f"{tps/base[ld]:.2f}x" if base.get(ld) else "n/a"
        print(f"| {trace} | {model} | {gpu} | {ld:g} | {r['policy']} | {100*m['waste_frac']:.1f} | "
              f"{100*bw:.1f} | {r['batch']['max']} | {tps:.0f} | {vs} | "
              f"{r['latency']['ttft_p50_ms']/1e3:.2f} | {r['latency']['tpot_p50_ms']:.1f} | {r['preemptions']} |")
PY

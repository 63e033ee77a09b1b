#!/usr/bin/env python3
# SPDX-License-Identifier: MIT
# Turn the JSON reports that bench/replay_real_traces.sh writes into the Markdown
# tables of docs/BENCHMARKS.md, so the document is regenerated, never hand-edited.
# usage: bench/replay_tables.py OUT_DIR   (prints Markdown on stdout)
import json
import sys
from pathlib import Path

GiB = 1024.0 ** 3
HEAD = ("| policy | done | peak rsv GiB | peak used GiB | waste | internal | reservation | "
        "external | backend allocs | step p50 / p99 ms | TTFT p50 s | out tok/s | batch | preempt |\n"
        "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |")


def pct(x):
    return f"{100.0 * x:.1f}%"


def seconds(d, r):
    # Older reports hold replay_seconds in the run; stamped ones (pkv-replay's
    # research workflow) keep run-specific wall times in stamp.run_seconds.
    if "replay_seconds" in r:
        return r["replay_seconds"]
    return d["stamp"]["run_seconds"][str(r["point"]["index"])]


def table(path):
    d = json.loads(path.read_text())
    runs = d["runs"]
    first = runs[0]
    cap = first["memory"]["capacity_bytes"] / GiB
    name = path.stem  # e.g. azure_conv_2023_a100-80g_x4
    trace, gpu, load = name.rsplit("_", 2)
    out = [f"#### {trace}, {gpu}, load {load}: KV budget {cap:.2f} GiB, "
           f"{first['kv_bytes_per_token'] // 1024} KiB of KV per token", "", HEAD]
    for r in runs:
        m, lat = r["memory"], r["latency"]
        out.append(
            f"| {r['policy']} | {r['requests']['completed']}/{r['requests']['total']} "
            f"| {m['peak_reserved_bytes'] / GiB:.1f} | {m['peak_used_bytes'] / GiB:.1f} "
            f"| {pct(m['waste_frac'])} | {pct(m['internal_frag_frac'])} "
            f"| {pct(m['reservation_frac'])} | {pct(m['external_frag_frac'])} "
            f"| {r['alloc']['backend_alloc_calls']} "
            f"| {lat['step_p50_ms']:.1f} / {lat['step_p99_ms']:.1f} "
            f"| {lat['ttft_p50_ms'] / 1000.0:.2f} "
            f"| {r['throughput']['output_tokens_per_s']:.0f} | {r['batch']['mean']:.1f} "
            f"| {r['preemptions']} |")
    cached = [r for r in runs if r.get("prefix_cached_tokens")]
    for r in cached:
        total = d["trace"]["prompt_tokens_mean"] * d["trace"]["requests"]
        out.append("")
        out.append(f"{r['policy']}: {r['prefix_cached_tokens']:,} prompt tokens served by the "
                   f"prefix cache (of {total:,.0f}); replay took {seconds(d, r):.1f} s.")
    return "\n".join(out)


def main():
    if len(sys.argv) != 2:
        sys.stderr.write("usage: replay_tables.py OUT_DIR\n")
        return 2
    files = sorted(Path(sys.argv[1]).glob("*.json"))
    if not files:
        sys.stderr.write(f"replay_tables.py: no .json reports in {sys.argv[1]}\n")
        return 2
    print("\n\n".join(table(f) for f in files))
    return 0


if __name__ == "__main__":
    sys.exit(main())

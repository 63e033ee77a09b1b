#!/usr/bin/env python3
# SPDX-License-Identifier: MIT
# Turn the JSON reports that bench/replay_real_traces.sh writes into the Markdown
# tables of docs/BENCHMARKS.md, so the document is regenerated, never hand-edited.
# usage: bench/replay_tables.py OUT_DIR   (prints Markdown on stdout)
# Every table states the model, GPU, KV budget, batching, preemption and the
# allocation cost model it was produced with; undefined figures (a policy that
# completed nothing) print as n/a.
import json
import re
import sys
from pathlib import Path

GiB = 1024.0 ** 3
HEAD = ("| policy | done | peak rsv GiB | peak used GiB | waste | alloc calls | alloc s in steps "
        "| step p50 / p99 ms | TTFT p50 s | TPOT p50 ms | out tok/s | batch | preempt |\n"
        "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
BHEAD = ("| policy | token states | reserved | internal frag | external frag | free "
         "| prefill time | decode time | decode compute util | decode bw util | copied GiB | swap out / in GiB |\n"
         "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |")


def f(x, fmt, scale=1.0):
    return "n/a" if x is None else format(x * scale, fmt)


def pct(x):
    return "n/a" if x is None else f"{100.0 * x:.1f}%"


def caption(d, name):
    c, first = d["config"], d["runs"][0]
    am = c.get("alloc_model") or {}
    parts = [f"model {c['model']}", f"GPU {c['gpu']} (sim, roofline)",
             f"KV budget {c['kv_budget_bytes'] / GiB:.2f} GiB",
             f"{first['kv_bytes_per_token'] // 1024} KiB of KV per token",
             f"load x{c.get('load_scale', 1):g}", f"batching {c.get('batching', 'continuous')}",
             "chunked prefill " + (f"{c['chunked_prefill']} tokens" if c.get("chunked_prefill") else "off"),
             f"preempt {c['preempt']}" + (f" (host pool {c['swap_space_bytes'] / GiB:.0f} GiB)"
                                         if c["preempt"] == "swap" else ""),
             f"alloc cost model: {am.get('name', 'n/a')}"]
    trace = Path(d["trace"]["path"]).stem
    return f"#### {name}: {trace}\n\n" + "; ".join(parts) + "."


def table(path):
    d = json.loads(path.read_text())
    out = [caption(d, path.stem), "", HEAD]
    for r in d["runs"]:
        m, lat = r["memory"], r["latency"]
        out.append(
            f"| {r['policy']} | {r['requests']['completed']}/{r['requests']['total']} "
            f"| {m['peak_reserved_bytes'] / GiB:.1f} | {m['peak_used_bytes'] / GiB:.1f} "
            f"| {pct(m['waste_frac'])} | {r['alloc']['backend_alloc_calls']} "
            f"| {f(r['alloc']['step_seconds'], '.1f')} "
            f"| {f(lat['step_p50_ms'], '.1f')} / {f(lat['step_p99_ms'], '.1f')} "
            f"| {f(lat['ttft_p50_ms'], '.2f', 1e-3)} | {f(lat['tpot_p50_ms'], '.1f')} "
            f"| {f(r['throughput']['output_tokens_per_s'], '.0f')} | {r['batch']['mean']:.1f} "
            f"| {r['preemptions']} |")
    out += ["", "Capacity breakdown (time-averaged share of the KV budget, vLLM fig. 2) and time split:", "", BHEAD]
    for r in d["runs"]:
        b, t = r["memory"]["breakdown"], r["time"]
        out.append(
            f"| {r['policy']} | {pct(b['token_states'])} | {pct(b['reserved'])} "
            f"| {pct(b['internal_frag'])} | {pct(b['external_frag'])} | {pct(b['free'])} "
            f"| {pct(t['prefill_frac'])} | {pct(t['decode_frac'])} "
            f"| {pct(t['decode_compute_util'])} | {pct(t['decode_bw_util'])} "
            f"| {r['copy_bytes'] / GiB:.1f} "
            f"| {r['swap_out_bytes'] / GiB:.1f} / {r['swap_in_bytes'] / GiB:.1f} |")
    for r in d["runs"]:
        if r.get("failure"):
            out.append(f"\n{r['policy']} completed nothing: {r['failure']}.")
        if r.get("prefix_cached_tokens"):
            total = d["trace"]["prompt_tokens_mean"] * d["trace"]["requests"]
            out.append(f"\n{r['policy']}: {r['prefix_cached_tokens']:,} prompt tokens served by the "
                       f"prefix cache (of {total:,.0f}).")
        if r.get("padding_tokens"):
            out.append(f"\n{r['policy']}: {r['padding_tokens']:,} padding tokens computed; padding held "
                       f"{pct(r['memory'].get('padding_frac'))} of the budget (inside token states).")
        if r.get("swap_fallbacks"):
            out.append(f"\n{r['policy']}: {r['swap_fallbacks']} preemptions recomputed because "
                       "the host pool was full.")
    return "\n".join(out)


def sensitivity(files, base):
    """malloc-per-token under constant per-call costs against paged (same trace,
    same load, cuda-boyer run) from the main table."""
    rows = ["#### malloc-per-token against paged, by cost per backend call (azure_conv_2023, a100-80g)",
            "", "| cost per call | load | TPOT p50 ms | paged TPOT p50 ms | TPOT ratio | out tok/s "
            "| paged tok/s | throughput ratio | step p50 ms | paged step p50 ms |",
            "| ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |"]
    pts = []
    for p in files:
        m = re.match(r"x_alloc_(\d+)us_conv_a100-80g_x(\d+)", p.stem)
        if m:
            pts.append((int(m.group(1)), int(m.group(2)), json.loads(p.read_text())["runs"][0]))
    for us, load, r in sorted(pts, key=lambda x: (x[1], x[0])):
        pg = base.get(load)
        if not pg:
            continue
        tp, tq = r["latency"]["tpot_p50_ms"], pg["latency"]["tpot_p50_ms"]
        sp, sq = r["throughput"]["output_tokens_per_s"], pg["throughput"]["output_tokens_per_s"]
        rows.append(f"| {us} us | x{load} | {f(tp, '.1f')} | {f(tq, '.1f')} "
                    f"| {f(tp / tq if tp and tq else None, '.2f')}x | {f(sp, '.0f')} | {f(sq, '.0f')} "
                    f"| {f(sq / sp if sp and sq else None, '.2f')}x "
                    f"| {f(r['latency']['step_p50_ms'], '.1f')} | {f(pg['latency']['step_p50_ms'], '.1f')} |")
    return "\n".join(rows)


def main():
    if len(sys.argv) != 2:
        sys.stderr.write("usage: replay_tables.py OUT_DIR\n")
        return 2
    d = Path(sys.argv[1])
    files = sorted(d.glob("*.json"))
    if not files:
        sys.stderr.write(f"replay_tables.py: no .json reports in {sys.argv[1]}\n")
        return 2
    main_files = [p for p in files if not p.stem.startswith("x_")]
    extra = [p for p in files if p.stem.startswith("x_") and not p.stem.startswith("x_alloc_")]
    base = {}
    for load in (1, 4):
        p = d / f"azure_conv_2023_a100-80g_x{load}.json"
        if p.exists():
            base[load] = next(r for r in json.loads(p.read_text())["runs"] if r["policy"] == "paged")
    out = [table(p) for p in main_files]
    out.append(sensitivity(files, base))
    out += [table(p) for p in extra]
    print("\n\n".join(out))
    return 0


if __name__ == "__main__":
    sys.exit(main())

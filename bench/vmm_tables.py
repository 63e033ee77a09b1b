#!/usr/bin/env python3
# SPDX-License-Identifier: MIT
# Markdown tables from the JSON reports of bench/replay_vmm_traces.sh.
# usage: bench/vmm_tables.py OUT_DIR
import json
import os
import sys

TRACES = [("azure_code_2023", "Azure code 2023 (8,819 requests), Llama-2-7B, 8K context"),
          ("azure_conv_2023", "Azure conversation 2023 (19,366 requests), Llama-2-7B, 8K context"),
          ("mooncake", "Mooncake FAST'25 conversation (12,031 requests), Llama-3-8B, 128K context")]


def load(d, name):
    with open(os.path.join(d, name + ".json")) as f:
        j = json.load(f)
    return j["runs"][0], j["config"]


def row(label, r):
    m, b, a = r["memory"], r["memory"]["breakdown"], r["alloc"]
    pct = lambda x: "%.1f" % (100 * x) if x is not None else "-"
    return "| %s | %d/%d | %s | %s / %s / %s / %s / %s | %s / %s | %.1f | %.0f | %.1f | %.2f | %d |" % (
        label, r["requests"]["completed"], r["requests"]["total"], pct(m["waste_frac"]),
        pct(b["token_states"]), pct(b["reserved"]), pct(b["internal_frag"]),
        pct(b["external_frag"]), pct(b["free"]),
        format(a["backend_alloc_calls"], ","), format(a["backend_free_calls"], ","),
        a["step_seconds"], r["throughput"]["output_tokens_per_s"],
        r["latency"]["tpot_p50_ms"], r["latency"]["ttft_p50_ms"] / 1e3, r["preemptions"])


def main():
    d = sys.argv[1]
    for t, title in TRACES:
        r0, cfg = load(d, t + "_paged16")
        print("#### %s\n" % title)
        print("GPU %s, KV budget %.2f GiB, %d bytes of KV per token.\n" % (
            cfg["gpu"], r0["memory"]["capacity_bytes"] / 2**30, r0["kv_bytes_per_token"]))
        print("| policy | done | waste % | tokens / reserved / internal / external / free "
              "(% of budget) | map / unmap calls | call s in steps | tok/s | TPOT p50 ms "
              "| TTFT p50 s | preempt |")
        print("| --- | ---: | ---: | --- | ---: | ---: | ---: | ---: | ---: | ---: |")
        print(row("paged, block 16", r0))
        print(row("contiguous-oracle", load(d, t + "_oracle")[0]))
        for us in (0, 5, 50):
            for page in ("2M", "64K"):
                # vmm-sync: every map in line; vmm: vAttention as published
                # (map-ahead, eager allocation, deferred reclamation).
                for hide, name in (("", "vmm-sync"), ("_hide", "vmm")):
                    r, _ = load(d, "%s_vmm%s%s_%dus" % (t, page, hide, us))
                    tpp = r["block_size"]
                    print(row("%s %s (%d tok/page), %d us/call" % (
                        name, page.replace("M", " MiB").replace("K", " KiB"), tpp, us), r))
        print()


if __name__ == "__main__":
    main()

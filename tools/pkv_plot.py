#!/usr/bin/env python3
# SPDX-License-Identifier: MIT
"""pkv-plot: figures from pkv-replay outputs (installed as pkv-plot).

  pkv-plot capacity TIMELINE.csv -o OUT.png   KV capacity over time, one panel per run,
                                              one x axis shared by all (pkv-replay --timeline)
  pkv-plot cdf REQUESTS.csv -o OUT.png        latency CDFs per run: TTFT, TPOT, normalized
                                              latency (pkv-replay --requests)
  pkv-plot norm SWEEP.csv -o OUT.png          the vLLM paper's normalized latency (s/token)
                                              against request rate (pkv-replay --csv of a
                                              --load-scale sweep)
  pkv-plot waste SWEEP.csv -o OUT.png         KV memory waste per policy: internal,
                                              reservation, external (pkv-replay --csv)
  pkv-plot slo SLO.csv -o OUT.png             request rate and tokens/s at the SLO per policy
                                              (pkv-replay --slo ... --csv)

Runs under any python3 with matplotlib (scripts/deps.sh --plots installs it).
Exit codes: 0 ok, 1 matplotlib missing or a write failed, 2 bad usage or input.
"""
import argparse
import csv
import math
import os
import sys
import tempfile
from collections import OrderedDict

GIB = float(1 << 30)


def fail(msg, code=2):
    sys.stderr.write("pkv-plot: %s\n" % msg)
    sys.exit(code)


def read_csv(path, need):
    try:
        with open(path, newline="") as f:
            rows = list(csv.DictReader(f))
    except OSError as e:
        fail("%s: %s" % (path, e.strerror))
    if not rows:
        fail("%s has no rows" % path)
    missing = [k for k in need if k not in rows[0]]
    if missing:
        fail("%s: no column %s (is it the right pkv-replay output?)" % (path, ", ".join(missing)))
    return rows


def num(row, key, path):
    try:
        return float(row[key])
    except (TypeError, ValueError):
        fail("%s: bad %s value %r" % (path, key, row[key]))


def run_label(policy, block_size, load_scale=None, kv=None):
    s = policy
    if policy == "paged" and block_size not in ("", "0", None):
        s += " bs%s" % block_size
    if load_scale not in (None, "", "1"):
        s += " x%s" % load_scale
    if kv not in (None, "", "0"):
        s += " %.0fG" % (float(kv) / GIB)
    return s


def thin(n, limit):
    """Indices 0..n-1 keeping at most `limit` evenly spaced ones (and the last)."""
    if n <= limit:
        return list(range(n))
    step = n / float(limit)
    idx = sorted(set(int(i * step) for i in range(limit)) | {n - 1})
    return idx


def pyplot():
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        fail("needs matplotlib: run scripts/deps.sh --plots (Debian: python3-matplotlib; "
             "or pip install matplotlib)", 1)
    return plt


def save(fig, out):
    """Whole or not at all, as pkv-replay writes its reports: a temporary file in the
    target's folder, renamed once every byte is written; a device or a FIFO (an
    existing target that is not a regular file) is written in place."""
    fig.tight_layout(rect=(0, 0, 1, 0.96))
    target = os.path.realpath(out)
    fmt = os.path.splitext(out)[1][1:].lower() or "png"
    tmp = None
    try:
        if os.path.exists(target) and not os.path.isfile(target):
            fig.savefig(out, dpi=130, bbox_inches="tight", format=fmt)
        else:
            fd, tmp = tempfile.mkstemp(prefix=os.path.basename(target) + ".tmp.",
                                       dir=os.path.dirname(target))
            with os.fdopen(fd, "wb") as f:
                fig.savefig(f, dpi=130, bbox_inches="tight", format=fmt)
            mask = os.umask(0)
            os.umask(mask)
            os.chmod(tmp, 0o666 & ~mask)  # mkstemp's 0600 is not a figure's mode
            os.replace(tmp, target)
            tmp = None
    except OSError as e:
        fail("cannot write %s: %s" % (out, e.strerror or e), 1)
    finally:
        if tmp is not None:
            os.unlink(tmp)
    print("wrote %s" % out)


def cmd_capacity(a, plt):
    need = ["policy", "time_s", "used_bytes", "reserved_bytes", "reservation_bytes",
            "free_bytes", "capacity_bytes"]
    rows = read_csv(a.input, need)
    runs = OrderedDict()
    for r in rows:
        key = r.get("point", r["policy"])
        runs.setdefault(key, {"label": run_label(r["policy"], r.get("block_size"),
                                                 r.get("load_scale")), "rows": []})
        runs[key]["rows"].append(r)
    n = len(runs)
    fig, axes = plt.subplots(n, 1, figsize=(10, 1.9 * n + 0.9), sharex=True, squeeze=False)
    colors = ["#2b6cb0", "#90cdf4", "#e53e3e", "#e2e8f0"]
    labels = ["used", "reserved, filled later", "reserved, never filled", "free"]
    tmax = 0.0
    for i, run in enumerate(runs.values()):
        rs = run["rows"]
        keep = thin(len(rs), a.max_points)
        t, layers = [], [[], [], [], []]
        for j in keep:
            r = rs[j]
            used = num(r, "used_bytes", a.input)
            resv = num(r, "reserved_bytes", a.input)
            later = num(r, "reservation_bytes", a.input)
            t.append(num(r, "time_s", a.input))
            layers[0].append(used / GIB)
            layers[1].append(later / GIB)
            layers[2].append(max(0.0, resv - used - later) / GIB)
            layers[3].append(num(r, "free_bytes", a.input) / GIB)
        tmax = max(tmax, t[-1] if t else 0)
        ax = axes[i][0]
        ax.stackplot(t, *layers, colors=colors, labels=labels, step="post")
        ax.set_ylabel("GiB")
        ax.set_title(run["label"], fontsize=9, loc="left")
        ax.set_ylim(0, num(rs[0], "capacity_bytes", a.input) / GIB)
    axes[0][0].legend(loc="upper right", fontsize=7, ncol=4)
    axes[-1][0].set_xlim(0, tmax)
    axes[-1][0].set_xlabel("time (s, simulated)")
    fig.suptitle(a.title or "KV cache capacity over time")
    save(fig, a.out)


def cdf_axis(ax, values, label):
    v = sorted(x for x in values if not math.isnan(x))
    if not v:
        return
    n = len(v)
    keep = thin(n, 2000)
    ax.plot([v[i] for i in keep], [(i + 1) / float(n) for i in keep], label=label)


def cmd_cdf(a, plt):
    metrics = [m.strip() for m in a.metrics.split(",") if m.strip()]
    rows = read_csv(a.input, ["point", "policy", "block_size", "load_scale"] + metrics)
    runs = OrderedDict()
    for r in rows:
        runs.setdefault(r["point"], {"label": run_label(r["policy"], r["block_size"],
                                                        r["load_scale"]),
                                     "v": {m: [] for m in metrics}})
        for m in metrics:
            runs[r["point"]]["v"][m].append(float(r[m]) if r[m] != "" else float("nan"))
    fig, axes = plt.subplots(1, len(metrics), figsize=(4.2 * len(metrics), 3.6), squeeze=False)
    for k, m in enumerate(metrics):
        ax = axes[0][k]
        for run in runs.values():
            cdf_axis(ax, run["v"][m], run["label"])
        ax.set_xscale("log")
        ax.set_xlabel(m.replace("_ms", " (ms)").replace("norm (ms)_per_token", "ms/token"))
        ax.set_ylabel("fraction of requests")
        ax.grid(alpha=0.3)
    axes[0][-1].legend(fontsize=7)
    fig.suptitle(a.title or "Latency CDFs")
    save(fig, a.out)


def series(rows, path, x, y):
    out = OrderedDict()
    for r in rows:
        key = run_label(r["policy"], r["block_size"], None, r.get("point.kv_mem_bytes"))
        out.setdefault(key, []).append((num(r, x, path), num(r, y, path)))
    for v in out.values():
        v.sort()
    return out


def cmd_norm(a, plt):
    rows = read_csv(a.input, ["policy", "block_size", "point.request_rate",
                              "latency.norm_ms_per_token"])
    fig, ax = plt.subplots(figsize=(6.4, 4.2))
    for label, pts in series(rows, a.input, "point.request_rate",
                             "latency.norm_ms_per_token").items():
        ax.plot([p[0] for p in pts], [p[1] / 1e3 for p in pts], marker="o", label=label)
    ax.set_xlabel("request rate (req/s)")
    ax.set_ylabel("normalized latency (s/token)")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7)
    fig.suptitle(a.title or "Normalized latency vs request rate")
    save(fig, a.out)


def cmd_waste(a, plt):
    keys = ["memory.internal_frag_frac", "memory.reservation_frac", "memory.external_frag_frac"]
    rows = read_csv(a.input, ["policy", "block_size"] + keys)
    labels, layers = [], [[] for _ in keys]
    for r in rows:
        labels.append(run_label(r["policy"], r["block_size"], r.get("point.load_scale"),
                                None))
        for k, key in enumerate(keys):
            layers[k].append(100 * num(r, key, a.input))
    fig, ax = plt.subplots(figsize=(max(6.0, 0.9 * len(labels)), 4.2))
    bottom = [0.0] * len(labels)
    names = ["internal fragmentation", "reservation", "external fragmentation"]
    for k, vals in enumerate(layers):
        ax.bar(range(len(labels)), vals, bottom=bottom, label=names[k])
        bottom = [b + v for b, v in zip(bottom, vals)]
    ax.set_xticks(range(len(labels)))
    ax.set_xticklabels(labels, rotation=30, ha="right", fontsize=8)
    ax.set_ylabel("KV memory wasted (% of reserved, time-averaged)")
    ax.legend(fontsize=7)
    fig.suptitle(a.title or "KV cache memory waste")
    save(fig, a.out)


def cmd_slo(a, plt):
    rows = read_csv(a.input, ["policy", "block_size", "slo.met", "point.request_rate",
                              "throughput.output_tokens_per_s"])
    labels = [run_label(r["policy"], r["block_size"], None, r.get("point.kv_mem_bytes"))
              for r in rows]
    met = [r["slo.met"] == "true" for r in rows]
    rate = [num(r, "point.request_rate", a.input) if m else 0 for r, m in zip(rows, met)]
    toks = [num(r, "throughput.output_tokens_per_s", a.input) if m else 0
            for r, m in zip(rows, met)]
    fig, axes = plt.subplots(1, 2, figsize=(max(8.0, 1.6 * len(labels)), 4.0))
    for ax, vals, name in ((axes[0], rate, "request rate at the SLO (req/s)"),
                           (axes[1], toks, "output tokens/s at the SLO")):
        ax.bar(range(len(labels)), vals, color="#2b6cb0")
        ax.set_xticks(range(len(labels)))
        ax.set_xticklabels(labels, rotation=30, ha="right", fontsize=8)
        ax.set_ylabel(name)
        for i, r in enumerate(rows):
            if r.get("slo.bounded") == "false" and met[i]:
                ax.annotate(">=", (i, vals[i]), ha="center", va="bottom", fontsize=8)
    fig.suptitle(a.title or "Throughput at the latency SLO")
    save(fig, a.out)


def main():
    ap = argparse.ArgumentParser(prog="pkv-plot", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="cmd")
    for name in ("capacity", "cdf", "norm", "waste", "slo"):
        p = sub.add_parser(name)
        p.add_argument("input")
        p.add_argument("-o", "--out", required=True)
        p.add_argument("--title", default="")
        if name == "capacity":
            p.add_argument("--max-points", type=int, default=4000,
                           help="points per panel at most (default 4000)")
        if name == "cdf":
            p.add_argument("--metrics", default="ttft_ms,tpot_ms,norm_ms_per_token",
                           help="columns of the --requests CSV to plot")
    a = ap.parse_args()
    if not a.cmd:
        ap.print_usage(sys.stderr)
        sys.exit(2)
    plt = pyplot()
    {"capacity": cmd_capacity, "cdf": cmd_cdf, "norm": cmd_norm, "waste": cmd_waste,
     "slo": cmd_slo}[a.cmd](a, plt)


if __name__ == "__main__":
    main()

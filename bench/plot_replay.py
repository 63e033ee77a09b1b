#!/usr/bin/env python3
# SPDX-License-Identifier: MIT
"""Plot a pkv-replay timeline: per policy, the capacity breakdown of the vLLM
paper's figure 2 over time (token states, reserved for later tokens, internal
fragmentation, external fragmentation, free; one x axis shared by every
policy) and the distribution of step latency. Input: the CSV of
`pkv-replay --timeline FILE`; output: a PNG.

usage: plot_replay.py TIMELINE.csv OUT.png [--title TEXT]
Needs python3-matplotlib (Debian package).
"""
import argparse
import csv
import sys
from collections import OrderedDict


def load(path):
    runs = OrderedDict()
    with open(path, newline="") as f:
        for row in csv.DictReader(f):
            r = runs.setdefault(row["policy"], {k: [] for k in
                                                ("t", "used", "resv", "internal", "ext", "free", "ms")})
            used = int(row["used_bytes"])
            reserved = int(row["reserved_bytes"])
            reservation = int(row["reservation_bytes"])
            ext = int(row["ext_frag_bytes"])
            r["t"].append(float(row["time_s"]))
            r["used"].append(used / 2**30)
            r["resv"].append(reservation / 2**30)
            r["internal"].append((reserved - used - reservation) / 2**30)
            r["ext"].append(ext / 2**30)
            r["free"].append((int(row["free_bytes"]) - ext) / 2**30)
            r["ms"].append(float(row["step_ms"]))
    return runs


def thin(values, limit=4000):
    step = max(1, len(values) // limit)
    return values[::step]


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("timeline")
    ap.add_argument("out")
    ap.add_argument("--title", default="")
    a = ap.parse_args()
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        sys.exit("plot_replay.py: needs matplotlib (apt-get install python3-matplotlib)")
    runs = load(a.timeline)
    if not runs:
        sys.exit("plot_replay.py: %s has no rows" % a.timeline)
    n = len(runs)
    fig, axes = plt.subplots(n, 2, figsize=(12, 2.2 * n + 0.8), squeeze=False,
                             gridspec_kw={"width_ratios": [3, 1]})
    colors = ["#2b6cb0", "#90cdf4", "#e53e3e", "#ed8936", "#e2e8f0"]
    labels = ["token states", "reserved (filled later)", "internal fragmentation",
              "external fragmentation", "free"]
    t_end = max(r["t"][-1] for r in runs.values() if r["t"])
    for i, (policy, r) in enumerate(runs.items()):
        ax = axes[i][0]
        t = thin(r["t"])
        ax.stackplot(t, thin(r["used"]), thin(r["resv"]), thin(r["internal"]), thin(r["ext"]),
                     thin(r["free"]), colors=colors, labels=labels, linewidth=0)
        ax.set_ylabel("GiB")
        ax.set_xlim(0, t_end)  # one time axis for every policy
        ax.set_title(policy, loc="left", fontsize=10)
        if i == n - 1:
            ax.set_xlabel("simulated time (s)")
        h = axes[i][1]
        ms = sorted(r["ms"])
        h.plot(ms, [(k + 1) / len(ms) for k in range(len(ms))], color="#2b6cb0")
        h.set_xscale("log")
        h.set_ylim(0, 1)
        h.set_ylabel("CDF")
        p50, p99 = ms[len(ms) // 2], ms[min(len(ms) - 1, int(0.99 * len(ms)))]
        h.axvline(p50, color="#718096", linestyle=":", linewidth=1)
        h.axvline(p99, color="#e53e3e", linestyle=":", linewidth=1)
        h.set_title("step p50 %.1f / p99 %.1f ms" % (p50, p99), fontsize=9)
        if i == n - 1:
            h.set_xlabel("step latency (ms)")
    handles, names = axes[0][0].get_legend_handles_labels()
    fig.legend(handles, names, loc="upper center", ncol=5, fontsize=8,
               bbox_to_anchor=(0.5, 1.0 - 0.4 / fig.get_figheight()))
    if a.title:
        fig.suptitle(a.title, fontsize=11, y=1.0 - 0.08 / fig.get_figheight())
    fig.tight_layout(rect=(0, 0, 1, 1 - 0.75 / fig.get_figheight()))
    fig.savefig(a.out, dpi=80)


if __name__ == "__main__":
    main()

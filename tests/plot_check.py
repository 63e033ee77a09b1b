#!/usr/bin/env python3
# SPDX-License-Identifier: MIT
"""Checks of the figures themselves (issue 25, items 6 and 7 and the cosmetic list),
run by test_replay_tools.py under an interpreter that has matplotlib, on real
pkv-replay outputs: pagedkv.plot (loaded from the clone, without the package's C
extension) draws the capacity breakdown in the five parts of memory.breakdown.*,
stacked to the capacity; the waste figure has one denominator per axis and its
budget panel adds up to 100 %; the titles name the trace and the model when given
the report; the CDF curves are told apart by their style.

usage: plot_check.py SOURCE_ROOT TIMELINE.csv REQUESTS.csv SWEEP.csv REPORT.json OUTDIR
Prints ok/FAIL lines; exit 1 on a failure.
"""
import importlib.util
import os
import sys

root, tl, rq, sweep, report, outdir = sys.argv[1:7]
spec = importlib.util.spec_from_file_location(
    "pagedkv_plot", os.path.join(root, "python", "pagedkv", "plot.py"))
plot = importlib.util.module_from_spec(spec)
spec.loader.exec_module(plot)
FAILS = []


def check(cond, what):
    print(("ok    " if cond else "FAIL  ") + what)
    if not cond:
        FAILS.append(what)


fig = plot.capacity(tl, os.path.join(outdir, "cap.png"), report=report)
panels = [ax for ax in fig.axes if ax.get_ylabel() == "GiB"]
check(len(panels) >= 2, "capacity: one panel per run (%d)" % len(panels))
names = [t.get_text() for t in fig.legends[0].get_texts()] if fig.legends else []
check(names == [n for _, n, _ in plot.PARTS],
      "capacity: the legend is the five parts of memory.breakdown.* (%s)" % names)
ax = panels[0]
layers = ax.collections
check(len(layers) == 5, "capacity: five stacked layers (%d)" % len(layers))
top = max(p[1] for p in layers[-1].get_paths()[0].vertices)
check(abs(top - ax.get_ylim()[1]) < 1e-6 * ax.get_ylim()[1],
      "capacity: the stack reaches the capacity (%.3f of %.3f GiB)" % (top, ax.get_ylim()[1]))
title = fig._suptitle.get_text() if fig._suptitle else ""
check("conv_small.csv" in title and "llama2-7b" in title,
      "capacity: the title names the trace and the model (%r)" % title)

fig = plot.waste(sweep, os.path.join(outdir, "waste.png"), report=report)
labels = [a.get_ylabel() for a in fig.axes]
check(len(labels) == 2 and "% of reserved" in labels[0] and "% of the KV budget" in labels[1]
      and "budget" not in labels[0] and "reserved" not in labels[1],
      "waste: one denominator per axis (%s)" % labels)


def bar_tops(ax):
    """The top of each stacked bar of `ax`, by x position."""
    tops = {}
    for b in ax.patches:
        x = round(b.get_x() + b.get_width() / 2, 3)
        tops[x] = max(tops.get(x, 0.0), b.get_y() + b.get_height())
    return tops


runs = len(fig.axes[1].get_xticks())
tops = bar_tops(fig.axes[1])
check(runs > 1 and len(tops) == runs and all(abs(t - 100) < 0.2 for t in tops.values()),
      "waste: every run's budget bar adds up to 100 %% (%s)" %
      ", ".join("%.2f" % t for t in tops.values()))
check(all(t <= 100 for t in bar_tops(fig.axes[0]).values()),
      "waste: the reserved panel stays within 100 %")

fig = plot.cdf(rq, os.path.join(outdir, "cdf.png"), report=report)
styles = [(l.get_linestyle(), l.get_linewidth()) for l in fig.axes[0].get_lines()]
check(len(styles) >= 2 and len(set(styles)) == len(styles),
      "cdf: each run's curve has its own style, so one cannot hide another (%s)" % styles)
title = fig._suptitle.get_text() if fig._suptitle else ""
check("conv_small.csv" in title, "cdf: the title names the trace (%r)" % title)

try:
    plot.capacity(sweep, os.path.join(outdir, "x.png"))
    check(False, "capacity of a --csv file: PlotInputError")
except plot.PlotInputError as e:
    check("token_states_bytes" in str(e), "capacity of a --csv file: names the missing column")
sys.exit(1 if FAILS else 0)

# SPDX-License-Identifier: MIT
"""pagedkv.plot: figures from pkv-replay's output files.

The one plotting path of the project: the ``pkv-plot`` command is a thin CLI over
these functions, and the README's and RESEARCH.md's pictures come from them. Pure
Python (the standard library), with matplotlib imported on first use, so that
``import pagedkv`` never needs it and the figures use the matplotlib of the
interpreter that runs them::

    from pagedkv import plot
    plot.capacity("timeline.csv", "capacity.png")  # pkv-replay --timeline
    plot.cdf("requests.csv", "cdf.png")            # pkv-replay --requests
    plot.norm("rate.csv", "norm.png")              # --csv of a --load-scale sweep
    plot.waste("waste.csv", "waste.png")           # --csv
    plot.slo("slo.csv", "slo.png")                 # --csv of an --slo run

Each function returns the matplotlib Figure, saved to ``out`` when it is given.
``report=`` (the ``--json`` file of the same pkv-replay run) puts the trace, the
model, the GPU and the SLO in the default title. Bad input raises
``PlotInputError`` naming the file, the column and the value; a missing
matplotlib raises ``MatplotlibMissing`` (an ImportError) naming the interpreter
and the command that installs it there.
"""
import csv
import json
import math
import os
import sys
import tempfile
from collections import OrderedDict

__all__ = ["capacity", "cdf", "norm", "waste", "slo", "PlotInputError", "MatplotlibMissing",
           "install_hint"]

GIB = float(1 << 30)

# The capacity breakdown (vLLM paper, fig. 2): the timeline's columns, in the
# order they stack, and the report's memory.breakdown.* keys they are.
PARTS = [("token_states", "token states", "#2b6cb0"),
         ("reserved", "reserved, filled later", "#90cdf4"),
         ("internal_frag", "internal fragmentation", "#e53e3e"),
         ("external_frag", "external fragmentation", "#ed8936"),
         ("free", "free", "#e2e8f0")]


class PlotInputError(ValueError):
    """An input file that is not the pkv-replay output a figure needs."""


class MatplotlibMissing(ImportError):
    """matplotlib is not importable by the interpreter running this."""


def install_hint():
    """How to install matplotlib for the interpreter running this (sys.executable).

    scripts/deps.sh --plots installs Debian's python3-matplotlib, which only the
    system interpreter (/usr/bin/python3) sees; a pyenv, conda or venv python
    needs its own pip."""
    exe = sys.executable or "python3"
    hint = "%s -m pip install matplotlib" % exe
    real = os.path.realpath(exe)
    if real.startswith("/usr/bin/python3") and sys.prefix == sys.base_prefix:
        hint += " (or, as root on Debian/Ubuntu: scripts/deps.sh --plots, python3-matplotlib)"
    return "needs matplotlib, which %s (Python %d.%d) cannot import: run %s" % (
        exe, sys.version_info[0], sys.version_info[1], hint)


def _pyplot():
    try:
        import matplotlib
        if "matplotlib.pyplot" not in sys.modules:
            matplotlib.use("Agg")  # files only; an interactive user's backend stays theirs
        import matplotlib.pyplot as plt
    except ImportError as e:
        raise MatplotlibMissing(install_hint()) from e
    return plt


def _read_csv(path, need):
    try:
        with open(path, newline="") as f:
            rows = list(csv.DictReader(f))
    except OSError as e:
        raise PlotInputError("%s: %s" % (path, e.strerror)) from e
    if not rows:
        raise PlotInputError("%s has no rows" % path)
    missing = [k for k in need if k not in rows[0]]
    if missing:
        raise PlotInputError("%s: no column %s (is it the right pkv-replay output, from this "
                             "version?)" % (path, ", ".join(missing)))
    return rows


def _num(row, key, path, line):
    try:
        return float(row[key])
    except (TypeError, ValueError):
        raise PlotInputError("%s:%d: bad %s value %r" % (path, line, key, row[key])) from None


def _thin(n, limit):
    """Indices 0..n-1 keeping at most `limit` evenly spaced ones (and the last)."""
    if n <= limit:
        return list(range(n))
    step = n / float(limit)
    return sorted(set(int(i * step) for i in range(limit)) | {n - 1})


def _label(row, vary, kv=None):
    """A run's name: the policy, with the block size, load scale and budget that
    tell it apart from the other runs of the file (`vary`)."""
    s = row["policy"]
    bs = row.get("block_size")
    # Policies without blocks: 0 in the timeline, 1 (a token) in reports.
    if bs not in (None, "", "0", "1") or (s == "paged" and bs not in (None, "", "0")):
        s += " (block %s)" % bs
    load = row.get("load_scale", row.get("point.load_scale"))
    if "load_scale" in vary and load not in (None, ""):
        s += " x%s" % load
    if kv not in (None, "", "0") and "kv" in vary:
        s += " %.0f GiB" % (float(kv) / GIB)
    return s


def _varying(rows, keys):
    out = set()
    for name, key in keys:
        if len({r.get(key) for r in rows}) > 1:
            out.add(name)
    return out


def _title(base, report, with_slo=False):
    """`base`, plus the trace, model, GPU (and SLO) that `report` (a pkv-replay
    --json file) names."""
    if not report:
        return base
    try:
        with open(report) as f:
            doc = json.load(f)
    except (OSError, ValueError) as e:
        raise PlotInputError("%s: not a pkv-replay --json report (%s)" % (report, e)) from e
    cfg, tr = doc.get("config", {}), doc.get("trace", {})
    bits = [os.path.basename(str(tr.get("path", "?"))), str(cfg.get("model", "?"))]
    if cfg.get("mode") == "sim":
        bits[-1] += " on " + str(cfg.get("gpu", "?"))
    slo = (doc.get("sweep") or {}).get("slo")
    if with_slo and isinstance(slo, dict) and slo.get("spec"):
        bits.append("SLO " + slo["spec"])
    return "%s\n%s" % (base, ", ".join(bits))


def _finish(fig, out, dpi):
    if out:
        _save_whole(fig, out, dpi)
    return fig


def _save_whole(fig, out, dpi):
    """Whole or not at all, as pkv-replay writes its reports: a temporary file in the
    target's folder, renamed once every byte is written (a failed write leaves no
    truncated figure under the final name); a device or a FIFO (an existing target
    that is not a regular file) is written in place. Raises OSError."""
    target = os.path.realpath(out)
    fmt = os.path.splitext(out)[1][1:].lower() or "png"
    if os.path.exists(target) and not os.path.isfile(target):
        fig.savefig(out, dpi=dpi, bbox_inches="tight", format=fmt)
        return
    fd, tmp = tempfile.mkstemp(prefix=os.path.basename(target) + ".tmp.",
                               dir=os.path.dirname(target))
    try:
        with os.fdopen(fd, "wb") as f:
            fig.savefig(f, dpi=dpi, bbox_inches="tight", format=fmt)
        mask = os.umask(0)
        os.umask(mask)
        os.chmod(tmp, 0o666 & ~mask)  # mkstemp's 0600 is not a figure's mode
        os.replace(tmp, target)
        tmp = None
    finally:
        if tmp is not None:
            os.unlink(tmp)


def capacity(timeline, out=None, title=None, report=None, max_points=4000, latency=True,
             dpi=100):
    """Per run, the KV capacity breakdown over time (the five parts of
    memory.breakdown.*, stacked to the capacity: token states, reserved for tokens
    to come, internal and external fragmentation, free), every panel on one time
    axis; with `latency`, the CDF of step latency beside it. `timeline`: the CSV of
    pkv-replay --timeline."""
    plt = _pyplot()
    need = ["policy", "time_s", "step_ms", "capacity_bytes"] + [p + "_bytes" for p, _, _ in PARTS]
    rows = _read_csv(timeline, need)
    vary = _varying(rows, (("block_size", "block_size"), ("load_scale", "load_scale")))
    runs = OrderedDict()
    for line, r in enumerate(rows, 2):
        key = r.get("point") or r["policy"]
        run = runs.setdefault(key, {"label": _label(r, vary), "rows": []})
        run["rows"].append((line, r))
    n = len(runs)
    cols = 2 if latency else 1
    fig, axes = plt.subplots(n, cols, figsize=(12 if latency else 10, 2.1 * n + 1.0),
                             squeeze=False,
                             gridspec_kw={"width_ratios": [3, 1]} if latency else None)
    t_end = 0.0
    for i, run in enumerate(runs.values()):
        rs = run["rows"]
        t, layers, ms = [], [[] for _ in PARTS], []
        for j in _thin(len(rs), max_points):
            line, r = rs[j]
            t.append(_num(r, "time_s", timeline, line))
            for k, (p, _, _) in enumerate(PARTS):
                layers[k].append(_num(r, p + "_bytes", timeline, line) / GIB)
        for line, r in rs:
            ms.append(_num(r, "step_ms", timeline, line))
        t_end = max(t_end, t[-1])
        ax = axes[i][0]
        ax.stackplot(t, *layers, colors=[c for _, _, c in PARTS],
                     labels=[name for _, name, _ in PARTS], step="post", linewidth=0)
        ax.set_ylabel("GiB")
        ax.set_ylim(0, _num(rs[0][1], "capacity_bytes", timeline, rs[0][0]) / GIB)
        ax.set_title(run["label"], loc="left", fontsize=10)
        if latency:
            h = axes[i][1]
            ms.sort()
            keep = _thin(len(ms), 2000)
            h.plot([ms[k] for k in keep], [(k + 1) / float(len(ms)) for k in keep],
                   color="#2b6cb0")
            h.set_xscale("log")
            h.set_ylim(0, 1)
            h.set_ylabel("CDF")
            p50, p99 = ms[len(ms) // 2], ms[min(len(ms) - 1, int(0.99 * len(ms)))]
            h.axvline(p50, color="#718096", linestyle=":", linewidth=1)
            h.axvline(p99, color="#e53e3e", linestyle=":", linewidth=1)
            h.set_title("step p50 %.1f / p99 %.1f ms" % (p50, p99), fontsize=9)
    for i in range(n):
        axes[i][0].set_xlim(0, t_end)  # one time axis for every run
    axes[-1][0].set_xlabel("time (s, simulated or replayed)")
    if latency:
        axes[-1][1].set_xlabel("step latency (ms)")
    # Title (one or two lines) at the top, the legend under it, then the panels.
    h = fig.get_figheight()
    handles, names = axes[0][0].get_legend_handles_labels()
    fig.suptitle(title or _title("KV cache capacity over time (the KV budget, stacked)", report),
                 fontsize=11, y=1.0 - 0.05 / h, va="top")
    fig.legend(handles, names, loc="upper center", ncol=len(PARTS), fontsize=8,
               bbox_to_anchor=(0.5, 1.0 - 0.5 / h))
    fig.tight_layout(rect=(0, 0, 1, 1 - 0.85 / h))
    return _finish(fig, out, dpi)


# Distinct styles, so that a curve lying on another stays visible (policies with
# the same latencies draw the same curve).
_STYLES = [("-", 2.6), ("--", 2.0), (":", 2.4), ("-.", 1.6), ((0, (5, 1)), 1.2),
           ((0, (1, 1)), 1.0)]


def cdf(requests, out=None, title=None, report=None,
        metrics=("ttft_ms", "tpot_ms", "norm_ms_per_token"), dpi=100):
    """Per run, the CDFs of per-request latencies (`requests`: the CSV of
    pkv-replay --requests), one panel per metric."""
    plt = _pyplot()
    metrics = list(metrics)
    rows = _read_csv(requests, ["point", "policy", "block_size", "load_scale"] + metrics)
    vary = _varying(rows, (("block_size", "block_size"), ("load_scale", "load_scale")))
    runs = OrderedDict()
    for line, r in enumerate(rows, 2):
        run = runs.setdefault(r["point"], {"label": _label(r, vary),
                                           "v": {m: [] for m in metrics}})
        for m in metrics:
            run["v"][m].append(_num(r, m, requests, line) if r[m] != "" else float("nan"))
    fig, axes = plt.subplots(1, len(metrics), figsize=(4.4 * len(metrics), 3.8), squeeze=False)
    names = {"ttft_ms": "time to first token (ms)", "tpot_ms": "time per output token (ms)",
             "norm_ms_per_token": "normalized latency (ms/token)", "e2e_ms": "end to end (ms)"}
    for k, m in enumerate(metrics):
        ax = axes[0][k]
        for i, run in enumerate(runs.values()):
            v = sorted(x for x in run["v"][m] if not math.isnan(x))
            if not v:
                continue
            keep = _thin(len(v), 2000)
            style, width = _STYLES[i % len(_STYLES)]
            ax.plot([v[j] for j in keep], [(j + 1) / float(len(v)) for j in keep],
                    linestyle=style, linewidth=width, alpha=0.85, label=run["label"])
        ax.set_xscale("log")
        ax.set_xlabel(names.get(m, m))
        ax.set_ylabel("fraction of requests")
        ax.grid(alpha=0.3)
    axes[0][-1].legend(fontsize=7)
    fig.suptitle(title or _title("Latency CDFs per request", report), fontsize=11)
    fig.tight_layout()
    return _finish(fig, out, dpi)


def _series(rows, path, x, y):
    vary = _varying(rows, (("kv", "point.kv_mem_bytes"), ("block_size", "block_size")))
    out = OrderedDict()
    for line, r in enumerate(rows, 2):
        key = _label({"policy": r["policy"], "block_size": r["block_size"]}, vary,
                     r.get("point.kv_mem_bytes"))
        out.setdefault(key, []).append((_num(r, x, path, line), _num(r, y, path, line)))
    for v in out.values():
        v.sort()
    return out


def norm(sweep, out=None, title=None, report=None, dpi=100):
    """The vLLM paper's normalized latency (s/token) against request rate, per
    policy (`sweep`: the --csv of a --load-scale sweep)."""
    plt = _pyplot()
    rows = _read_csv(sweep, ["policy", "block_size", "point.request_rate",
                             "latency.norm_ms_per_token"])
    fig, ax = plt.subplots(figsize=(6.4, 4.4))
    for i, (label, pts) in enumerate(_series(rows, sweep, "point.request_rate",
                                             "latency.norm_ms_per_token").items()):
        style, width = _STYLES[i % len(_STYLES)]
        ax.plot([p[0] for p in pts], [p[1] / 1e3 for p in pts], marker="o", linestyle=style,
                linewidth=width, label=label)
    ax.set_xlabel("request rate (req/s)")
    ax.set_ylabel("normalized latency (s/token)")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7)
    fig.suptitle(title or _title("Normalized latency vs request rate", report), fontsize=11)
    fig.tight_layout()
    return _finish(fig, out, dpi)


def waste(sweep, out=None, title=None, report=None, dpi=100):
    """Per run, two panels, one denominator each: the waste of the reserved KV
    memory (memory.internal_frag_frac + memory.reservation_frac = the table's
    waste%), and the whole KV budget split into memory.breakdown.*'s five parts
    (external fragmentation is a share of the budget, not of what is reserved).
    `sweep`: pkv-replay's --csv."""
    plt = _pyplot()
    own = ["memory.internal_frag_frac", "memory.reservation_frac"]
    parts = ["memory.breakdown." + p for p, _, _ in PARTS]
    rows = _read_csv(sweep, ["policy", "block_size"] + own + parts)
    vary = _varying(rows, (("load_scale", "point.load_scale"), ("kv", "point.kv_mem_bytes"),
                           ("block_size", "block_size")))
    labels = [_label(r, vary, r.get("point.kv_mem_bytes")) for r in rows]

    def column(key):
        return [100 * _num(r, key, sweep, line) if r[key] != "" else 0.0
                for line, r in enumerate(rows, 2)]

    def stack(ax, layers):  # (key, name, color) bottom to top
        bottom = [0.0] * len(labels)
        for key, name, color in layers:
            vals = column(key)
            ax.bar(x, vals, bottom=bottom, label=name, color=color)
            bottom = [b + v for b, v in zip(bottom, vals)]

    fig, axes = plt.subplots(1, 2, figsize=(max(10.0, 1.3 * len(labels)), 4.6))
    x = range(len(labels))
    ax = axes[0]
    stack(ax, ((own[0], "internal fragmentation", PARTS[2][2]),
               (own[1], "reserved, filled later", PARTS[1][2])))
    ax.set_ylabel("% of reserved KV memory (time-averaged)")
    ax.set_title("waste of what each policy reserved", fontsize=9)
    ax = axes[1]
    stack(ax, [(key, name, color) for key, (_, name, color) in zip(parts, PARTS)])
    ax.set_ylim(0, 100)
    ax.set_ylabel("% of the KV budget (time-averaged)")
    ax.set_title("the whole budget", fontsize=9)
    for ax in axes:
        ax.set_xticks(list(x))
        ax.set_xticklabels(labels, rotation=30, ha="right", fontsize=8)
        ax.legend(fontsize=7)
    fig.suptitle(title or _title("KV cache memory waste", report), fontsize=11)
    fig.tight_layout()
    return _finish(fig, out, dpi)


def slo(sweep, out=None, title=None, report=None, dpi=100):
    """Per policy, the request rate and output tokens/s at the highest load that
    met the SLO (`sweep`: pkv-replay --slo ... --csv); '>=' marks a search that
    met it at the top of the range, a missing bar one that never met it."""
    plt = _pyplot()
    rows = _read_csv(sweep, ["policy", "block_size", "slo.met", "point.request_rate",
                             "throughput.output_tokens_per_s"])
    vary = _varying(rows, (("kv", "point.kv_mem_bytes"), ("block_size", "block_size")))
    labels = [_label(r, vary, r.get("point.kv_mem_bytes")) for r in rows]
    met = [r["slo.met"] == "true" for r in rows]
    rate = [_num(r, "point.request_rate", sweep, i + 2) if m else 0
            for i, (r, m) in enumerate(zip(rows, met))]
    toks = [_num(r, "throughput.output_tokens_per_s", sweep, i + 2) if m else 0
            for i, (r, m) in enumerate(zip(rows, met))]
    fig, axes = plt.subplots(1, 2, figsize=(max(8.0, 1.6 * len(labels)), 4.2))
    for ax, vals, name in ((axes[0], rate, "request rate at the SLO (req/s)"),
                           (axes[1], toks, "output tokens/s at the SLO")):
        ax.bar(range(len(labels)), vals, color="#2b6cb0")
        ax.set_xticks(range(len(labels)))
        ax.set_xticklabels(labels, rotation=30, ha="right", fontsize=8)
        ax.set_ylabel(name)
        for i, r in enumerate(rows):
            if r.get("slo.bounded") == "false" and met[i]:
                ax.annotate(">=", (i, vals[i]), ha="center", va="bottom", fontsize=8)
            elif not met[i]:
                ax.annotate("not met", (i, 0), ha="center", va="bottom", fontsize=7)
    fig.suptitle(title or _title("Throughput at the latency SLO", report, with_slo=True),
                 fontsize=11)
    fig.tight_layout()
    return _finish(fig, out, dpi)

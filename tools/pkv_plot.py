#!/usr/bin/env python3
# SPDX-License-Identifier: MIT
"""pkv-plot: figures from pkv-replay outputs (installed as pkv-plot).

  pkv-plot capacity TIMELINE.csv -o OUT.png   per run, the KV capacity breakdown over
                                              time (token states, reserved for later,
                                              internal and external fragmentation, free:
                                              memory.breakdown.*), one time axis, and the
                                              step latency CDF (pkv-replay --timeline)
  pkv-plot cdf REQUESTS.csv -o OUT.png        latency CDFs per run: TTFT, TPOT, normalized
                                              latency (pkv-replay --requests)
  pkv-plot norm SWEEP.csv -o OUT.png          the vLLM paper's normalized latency (s/token)
                                              against request rate (pkv-replay --csv of a
                                              --load-scale sweep)
  pkv-plot waste SWEEP.csv -o OUT.png         KV memory waste per run: as a share of what
                                              was reserved, and the whole budget's
                                              breakdown (pkv-replay --csv)
  pkv-plot slo SLO.csv -o OUT.png             request rate and tokens/s at the SLO per policy
                                              (pkv-replay --slo ... --csv)

--report REPORT.json (pkv-replay --json of the same run) names the trace, model, GPU
and SLO in the title. The figures are drawn by the pagedkv.plot module (Python:
`from pagedkv import plot`); this command is a thin CLI over it. Needs matplotlib in
the python3 that runs it: the error says which interpreter and how to install it.
Exit codes: 0 ok, 1 matplotlib missing or a write failed, 2 bad usage or input.
"""
import argparse
import importlib.util
import os
import sys


def plot_module():
    """pagedkv.plot, without importing the pagedkv package (its C extension need
    not be built or installed): the file beside this one in a clone
    (tools/../python/pagedkv/plot.py) or installed (bin/../share/pagedkv/plot.py),
    else the installed Python package's."""
    here = os.path.dirname(os.path.realpath(__file__))
    for path in (os.path.join(here, "..", "python", "pagedkv", "plot.py"),
                 os.path.join(here, "..", "share", "pagedkv", "plot.py")):
        if os.path.isfile(path):
            spec = importlib.util.spec_from_file_location("pagedkv_plot", path)
            mod = importlib.util.module_from_spec(spec)
            spec.loader.exec_module(mod)
            return mod
    try:
        from pagedkv import plot
    except ImportError:
        sys.stderr.write("pkv-plot: cannot find pagedkv/plot.py beside %s, nor the pagedkv "
                         "package\n" % here)
        sys.exit(1)
    return plot


def main():
    ap = argparse.ArgumentParser(prog="pkv-plot", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="cmd")
    for name in ("capacity", "cdf", "norm", "waste", "slo"):
        p = sub.add_parser(name)
        p.add_argument("input")
        p.add_argument("-o", "--out", required=True)
        p.add_argument("--title", default="", help="the figure's title (default: what it "
                                                   "shows, and --report's trace and model)")
        p.add_argument("--report", default=None,
                       help="pkv-replay --json of the same run, for the title")
        p.add_argument("--dpi", type=int, default=100)
        if name == "capacity":
            p.add_argument("--max-points", type=int, default=4000,
                           help="points per panel at most (default 4000)")
            p.add_argument("--no-latency", action="store_true",
                           help="no step latency CDF beside each panel")
        if name == "cdf":
            p.add_argument("--metrics", default="ttft_ms,tpot_ms,norm_ms_per_token",
                           help="columns of the --requests CSV to plot")
    a = ap.parse_args()
    if not a.cmd:
        ap.print_usage(sys.stderr)
        sys.exit(2)
    plot = plot_module()
    kw = {"out": a.out, "title": a.title or None, "report": a.report, "dpi": a.dpi}
    if a.cmd == "capacity":
        kw.update(max_points=a.max_points, latency=not a.no_latency)
    if a.cmd == "cdf":
        kw["metrics"] = [m.strip() for m in a.metrics.split(",") if m.strip()]
    try:
        getattr(plot, a.cmd)(a.input, **kw)
    except plot.MatplotlibMissing as e:
        sys.stderr.write("pkv-plot: %s\n" % e)
        sys.exit(1)
    except plot.PlotInputError as e:
        sys.stderr.write("pkv-plot: %s\n" % e)
        sys.exit(2)
    except OSError as e:
        sys.stderr.write("pkv-plot: cannot write %s: %s\n" % (a.out, e.strerror or e))
        sys.exit(1)
    print("wrote %s" % a.out)


if __name__ == "__main__":
    main()

#!/usr/bin/env python3
# SPDX-License-Identifier: MIT
"""Tests of pkv-replay's research workflow (issue 9), driving the tool as a user
would: a sweep equals the individual runs whatever --jobs; three shards merged
equal one run; the SLO search finds the hand-computed load scale; the stamp
holds the commit, command line and trace hash; SIGINT writes a partial report;
timelines stay bounded; sim mode's default efficiency and --sim-efficiency;
bad options exit 2.

usage: test_replay_tools.py PKV_REPLAY SOURCE_ROOT
"""
import csv
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time

TOOL = None
ROOT = None
# The built-in policies that --policy all runs: paged, contiguous-max, -pow2, -oracle,
# malloc-per-request, malloc-per-token, realloc-copy, contiguous-pow2-grow, vmm, vmm-sync,
# hybrid-partition, hybrid-shared-page, hybrid-lcm, hybrid-vmm.
NUM_POLICIES = 14
TMP = None
FAILS = []


def check(cond, what):
    print(("ok    " if cond else "FAIL  ") + what)
    if not cond:
        FAILS.append(what)


def run(*args, expect=0):
    p = subprocess.run([TOOL, *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                       timeout=240)
    if p.returncode != expect:
        print(p.stdout, p.stderr, sep="\n")
    check(p.returncode == expect, "exit %d from pkv-replay %s" % (expect, " ".join(args)))
    return p


def lines(path):
    with open(path) as f:
        return f.read().split("\n")


def tmp(name):
    return os.path.join(TMP, name)


def runs_of(path):
    with open(path) as f:
        return json.load(f)["runs"]


def flat_keys(d, prefix=""):
    out = []
    for k, v in d.items():
        if isinstance(v, dict):
            out += flat_keys(v, prefix + k + ".")
        else:
            out.append(prefix + k)
    return out


def test_sweep_jobs_and_individual_runs():
    trace = os.path.join(ROOT, "traces", "conv_small.csv")
    sweep = ["--policy", "paged,contiguous-pow2", "--block-size", "8,32", "--load-scale", "1,3",
             "--kv-mem", "12G,40G", "-q"]
    outs = []
    for jobs in ("1", "3"):
        j, c = tmp("sweep%s.json" % jobs), tmp("sweep%s.csv" % jobs)
        run(trace, *sweep, "--jobs", jobs, "--json", j, "--csv", c)
        outs.append((j, c))
    check(lines(outs[0][0])[1:] == lines(outs[1][0])[1:],
          "sweep JSON identical with --jobs 1 and 3 (all but the stamp line)")
    check(lines(outs[0][1]) == lines(outs[1][1]), "sweep CSV identical with --jobs 1 and 3")
    runs = runs_of(outs[0][0])
    # 2 budgets x 2 loads x (2 paged block sizes + 1 contiguous) points, in order.
    check([r["point"]["index"] for r in runs] == list(range(12)), "12 points in index order")
    check(len(set(json.dumps(r, sort_keys=True) for r in runs)) == 12, "points differ")
    for r in runs:
        p = r["point"]
        one = tmp("one.json")
        run(trace, "--policy", r["policy"], "--block-size", str(r["block_size"] if
                                                                r["policy"] == "paged" else 16),
            "--load-scale", repr(p["load_scale"]), "--kv-mem", str(p["kv_mem_bytes"]), "-q",
            "--json", one)
        solo = runs_of(one)[0]
        a = {k: v for k, v in r.items() if k != "point"}
        b = {k: v for k, v in solo.items() if k != "point"}
        check(a == b and solo["point"]["request_rate"] == p["request_rate"],
              "point %d (%s, bs %d, x%g, %d B) equals its individual run" %
              (p["index"], r["policy"], r["block_size"], p["load_scale"], p["kv_mem_bytes"]))
    # CSV columns are the JSON keys.
    with open(outs[0][1]) as f:
        header = f.readline().strip().split(",")
    keys = ["point." + k for k in runs[0]["point"]] + flat_keys(
        {k: v for k, v in runs[0].items() if k != "point"})
    check(header == keys + ["stamp.commit", "trace.fnv1a64"], "CSV columns == JSON keys")


def test_shards_merge():
    trace = os.path.join(ROOT, "traces", "parallel_n2to8.csv")
    sweep = ["--policy", "all", "--block-size", "16,32", "--load-scale", "0.5,2", "-q"]
    run(trace, *sweep, "--json", tmp("whole.json"), "--csv", tmp("whole.csv"))
    for k in (1, 2, 3):
        run(trace, *sweep, "--point", "%d/3" % k, "--json", tmp("s%d.json" % k),
            "--csv", tmp("s%d.csv" % k))
    run("merge", "-o", tmp("merged.json"), tmp("s3.json"), tmp("s1.json"), tmp("s2.json"))
    run("merge", "-o", tmp("merged.csv"), tmp("s2.csv"), tmp("s3.csv"), tmp("s1.csv"))
    check(lines(tmp("merged.json"))[1:] == lines(tmp("whole.json"))[1:],
          "3 shards merged == one run, byte for byte but the stamp line (JSON)")
    check(lines(tmp("merged.csv")) == lines(tmp("whole.csv")),
          "3 shards merged == one run, byte for byte (CSV)")
    with open(tmp("merged.json")) as f:
        merged = json.load(f)
    check([s["shard"] for s in merged["stamp"]["merged_from"]] == ["3/3", "1/3", "2/3"],
          "merged stamp lists the shards' stamps")
    check(merged["partial"] is False, "complete merge is not partial")
    p = run("merge", tmp("s1.json"), tmp("s2.json"), expect=0)
    check('"partial": true' in p.stdout, "merge with a shard missing is partial")
    run("merge", tmp("s1.json"), tmp("s1.json"), expect=2)
    run(trace, "--policy", "paged", "-q", "--point", "1/2", "--json", tmp("other.json"))
    run("merge", tmp("s1.json"), tmp("other.json"), expect=2)
    run("merge", tmp("s1.json"), tmp("s1.csv"), expect=2)


def test_slo_hand_computed():
    # N requests of P prompt tokens and one output token each, one second apart,
    # run one at a time (--max-batch 1). Each step is one prefill of P tokens and
    # takes d seconds whatever the cost model (measured below at load 1, where
    # requests never overlap: TTFT = d). At load scale s the gap is g = 1/s; for
    # g < d request i finishes at (i+1)d and waited TTFT_i = d + i(d - g). With
    # N <= 100, p99 is the max, d + (N-1)(d - g). The SLO ttft_p99 <= 3d thus
    # holds iff g >= d - 2d/(N-1) = d/2 for N = 5: s* = 2/d.
    trace = tmp("slo.csv")
    with open(trace, "w") as f:
        f.write("arrival_s,prompt_tokens,output_tokens\n")
        for i in range(5):
            f.write("%d,1000,1\n" % i)
    run(trace, "--max-batch", "1", "-q", "--json", tmp("d.json"))
    d_ms = runs_of(tmp("d.json"))[0]["latency"]["ttft_p50_ms"]
    check(d_ms > 0, "isolated prefill takes d = %.4f ms" % d_ms)
    expect = 2000.0 / d_ms
    tol = 0.01
    run(trace, "--max-batch", "1", "-q", "--policy", "paged,contiguous-oracle",
        "--slo", "ttft_p99<=%.9fms" % (3 * d_ms), "--load-scale", "1,1000",
        "--slo-tol", str(tol), "--json", tmp("slo.json"), "--csv", tmp("slo_out.csv"))
    for r in runs_of(tmp("slo.json")):
        got = r["point"]["load_scale"]
        check(r["slo"]["met"] and r["slo"]["bounded"] and
              expect / (1 + tol) * (1 - 1e-9) <= got <= expect * (1 + 1e-9),
              "%s: highest load meeting the SLO %.4f, hand-computed %.4f" %
              (r["policy"], got, expect))
        check(abs(r["point"]["request_rate"] - got) < 1e-6 * got,
              "request rate there = scale (1 request/s at scale 1)")
        check(r["throughput"]["output_tokens_per_s"] > 0, "tokens/s reported at the SLO load")
    # Unbounded (met at the top) and unmet (fails at the bottom) searches.
    run(trace, "--max-batch", "1", "-q", "--slo", "ttft_p99<=%.9fms" % (3 * d_ms),
        "--load-scale", "1,10", "--json", tmp("slo_top.json"))
    r = runs_of(tmp("slo_top.json"))[0]
    check(r["slo"]["met"] and not r["slo"]["bounded"] and r["point"]["load_scale"] == 10,
          "SLO met at the top of the range: reported as a lower bound")
    run(trace, "--max-batch", "1", "-q", "--slo", "ttft_p99<=%.9fms" % (0.5 * d_ms),
        "--load-scale", "1,10", "--json", tmp("slo_none.json"))
    r = runs_of(tmp("slo_none.json"))[0]
    check(not r["slo"]["met"], "SLO below one prefill is never met")


def fnv1a64(path):
    h = 0xcbf29ce484222325
    with open(path, "rb") as f:
        for b in f.read():
            h = ((h ^ b) * 0x100000001b3) & 0xFFFFFFFFFFFFFFFF
    return "%016x" % h


def test_stamp():
    trace = os.path.join(ROOT, "traces", "shared_prefix.csv")
    out = tmp("stamp.json")
    run(trace, "--policy", "paged", "--watermark", "0.02", "-q", "--json", out,
        "--timeline", tmp("tl.csv"), "--timeline-rows", "10")
    with open(out) as f:
        doc = json.load(f)
    s = doc["stamp"]
    check(s["command"] == " ".join([TOOL, trace, "--policy", "paged", "--watermark", "0.02", "-q",
                                    "--json", out, "--timeline", tmp("tl.csv"),
                                    "--timeline-rows", "10"]),
          "stamp holds the command line")
    head = None
    if shutil.which("git"):
        g = subprocess.run(["git", "-C", ROOT, "rev-parse", "HEAD"], stdout=subprocess.PIPE,
                           stderr=subprocess.DEVNULL, text=True)
        head = g.stdout.strip() if g.returncode == 0 else None
    if head:
        # meson test rebuilds first, so vcs_tag stamped HEAD (-dirty with edits).
        check(s["commit"] in (head, head + "-dirty"),
              "stamp commit is HEAD (%s; HEAD %s)" % (s["commit"], head))
    else:
        check(s["commit"] != "", "stamp commit present without git (%s)" % s["commit"])
    check(s["version"].count(".") == 2, "stamp version")
    check(s["host"]["cores"] == os.cpu_count(), "stamp host cores")
    check(s["host"]["cpu"] != "", "stamp host cpu")
    check(len(s["date"]) == 20 and s["date"].endswith("Z"), "stamp date in UTC")
    check(doc["trace"]["fnv1a64"] == fnv1a64(trace), "trace hash is FNV-1a 64 of the bytes")
    check(doc["config"]["watermark"] == 0.02 and doc["config"]["max_batch"] == 256,
          "config holds effective parameters")
    with open(tmp("tl.csv")) as f:
        rows = f.read().strip().split("\n")
    steps = runs_of(out)[0]["steps"]
    check(steps > 20 and 10 <= len(rows) - 1 <= 20,
          "timeline bounded: %d rows for %d steps (--timeline-rows 10)" % (len(rows) - 1, steps))


def test_sigint_partial():
    # Run mode executes the decoder: minutes for conv_small, so the signal lands
    # mid-replay. SIGTERM (Slurm's signal at a job's time limit) is handled as
    # SIGINT (issue 25, item 10), exiting 128 + 15.
    trace = os.path.join(ROOT, "traces", "conv_small.csv")
    for sig, name, code in ((signal.SIGINT, "SIGINT", 130), (signal.SIGTERM, "SIGTERM", 143)):
        out = tmp("partial_%s.json" % name)
        p = subprocess.Popen([TOOL, trace, "--mode", "run", "--threads", "1", "-q", "--json", out,
                              "--csv", tmp("partial_%s.csv" % name)],
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        time.sleep(2.0)
        p.send_signal(sig)
        try:
            _, err = p.communicate(timeout=60)
        except subprocess.TimeoutExpired:
            p.kill()
            check(False, "%s stops the replay within 60 s" % name)
            continue
        check(p.returncode == code, "%s: exit %d (got %d)" % (name, code, p.returncode))
        check("interrupted (%s)" % name in err, "%s: says it was interrupted" % name)
        if not os.path.exists(out):
            check(False, "%s: the report is written" % name)
            continue
        with open(out) as f:
            doc = json.load(f)
        check(doc["partial"] is True and doc["runs"] and doc["runs"][0]["partial"] is True,
              "%s: the report is written and marked partial" % name)
        r = doc["runs"][0]
        check(r["requests"]["completed"] < r["requests"]["total"] and r["steps"] > 0,
              "%s: the report covers the %d steps replayed" % (name, r["steps"]))
        with open(tmp("partial_%s.csv" % name)) as f:
            check(",true," in f.read().split("\n")[1], "%s: the CSV row says partial" % name)


def test_progress_line():
    # On a terminal the progress line is redrawn at least twice a second even when
    # every step is slow (run mode); off a terminal, or with --quiet, nothing.
    import pty
    trace = os.path.join(ROOT, "traces", "conv_small.csv")
    for quiet in (False, True):
        master, slave = pty.openpty()
        args = [TOOL, trace, "--mode", "run", "--threads", "1"] + (["-q"] if quiet else [])
        p = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=slave)
        os.close(slave)
        time.sleep(2.5)
        p.send_signal(signal.SIGINT)
        out = b""
        deadline = time.time() + 60
        while time.time() < deadline:
            try:
                chunk = os.read(master, 65536)
            except OSError:
                break
            if not chunk:
                break
            out += chunk
        p.wait(timeout=60)
        os.close(master)
        text = out.decode(errors="replace")
        draws = text.count(" requests (")
        if quiet:
            check(draws == 0, "--quiet: no progress line on a terminal")
        else:
            check(draws >= 5, "progress line redrawn %d times in 2.5 s on a terminal" % draws)
            check("sim " in text and "req/s" in text and "ETA" in text,
                  "progress line shows requests, simulated time, rate and ETA")
    p = run(os.path.join(ROOT, "traces", "shared_prefix.csv"))
    check(" requests (" not in p.stderr, "no progress line when stderr is not a terminal")


def python_with_matplotlib():
    """An interpreter that can import matplotlib: this one, or the system's (where
    scripts/deps.sh --plots installs Debian's python3-matplotlib); None if neither."""
    for exe in (sys.executable, "/usr/bin/python3"):
        if exe and os.path.exists(exe) and subprocess.run(
                [exe, "-c", "import matplotlib"], capture_output=True).returncode == 0:
            return exe
    return None


def test_plots():
    # pkv-plot draws every figure from real outputs under an interpreter with
    # matplotlib; under one without it, it names that interpreter and the pip
    # command for it (issue 25, item 2: scripts/deps.sh alone did not help a venv,
    # pyenv or conda python3).
    plot = os.path.join(ROOT, "tools", "pkv_plot.py")
    trace = os.path.join(ROOT, "traces", "conv_small.csv")
    run(trace, "--policy", "paged,contiguous-max", "--load-scale", "1,2", "-q", "--csv",
        tmp("p.csv"), "--timeline", tmp("p_tl.csv"), "--requests", tmp("p_rq.csv"),
        "--json", tmp("p.json"))
    run(trace, "--policy", "paged,contiguous-max", "--load-scale", "0.5,8", "-q",
        "--slo", "ttft_p99<=1s", "--csv", tmp("p_slo.csv"), "--json", tmp("p_slo.json"))
    py = python_with_matplotlib()
    if py is None:
        print("skip  drawing: no python3 here has matplotlib")
    else:
        for cmd, src, rep in (("capacity", "p_tl.csv", "p.json"), ("cdf", "p_rq.csv", "p.json"),
                              ("norm", "p.csv", "p.json"), ("waste", "p.csv", "p.json"),
                              ("slo", "p_slo.csv", "p_slo.json")):
            out = tmp("plot_%s.png" % cmd)
            p = subprocess.run([py, plot, cmd, tmp(src), "-o", out, "--report", tmp(rep)],
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
            check(p.returncode == 0 and os.path.getsize(out) > 10000,
                  "pkv-plot %s draws %s %s" % (cmd, out, p.stderr.strip()))
        p = subprocess.run([py, plot, "norm", tmp("p_tl.csv"), "-o", tmp("x.png")],
                           stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        check(p.returncode == 2 and "no column" in p.stderr,
              "pkv-plot norm on a timeline: bad input, exit 2 naming the column")
        p = subprocess.run([py, os.path.join(ROOT, "tests", "plot_check.py"), ROOT,
                            tmp("p_tl.csv"), tmp("p_rq.csv"), tmp("p.csv"), tmp("p.json"), TMP],
                           stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        print(p.stdout, end="")
        check(p.returncode == 0, "plot_check.py: the figures show what they say")
    # A fresh venv has no matplotlib: the message names its interpreter and pip.
    venv = tmp("venv_noplot")
    v = subprocess.run([sys.executable, "-m", "venv", "--without-pip", venv], capture_output=True)
    vpy = os.path.join(venv, "bin", "python3")
    if v.returncode != 0 or not os.path.exists(vpy):
        print("skip  no venv module here")
    else:
        p = subprocess.run([vpy, plot, "capacity", tmp("p_tl.csv"), "-o", tmp("y.png")],
                           stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        check(p.returncode == 1 and vpy in p.stderr and
              "%s -m pip install matplotlib" % vpy in p.stderr and "deps.sh" not in p.stderr,
              "pkv-plot under a venv python3 without matplotlib: exit 1, names it and its pip "
              "(%s)" % p.stderr.strip())
    with open(tmp("p_rq.csv")) as f:
        n = len(f.read().strip().split("\n")) - 1
    check(n == 4 * 400, "--requests: one row per completed request of each run (%d)" % n)


def test_cost_fields_and_failure():
    # The cost work's figures reach the stamped JSON and CSV (nested as the
    # library's JSON: memory.breakdown.*), a policy that completes nothing is
    # null / an empty cell there (never 0), and --policy all still runs every
    # policy and exits 1.
    trace = os.path.join(ROOT, "traces", "conv_small.csv")
    out, csvp = tmp("fail.json"), tmp("fail.csv")
    p = run(trace, "--policy", "all", "--kv-mem", "8M", "-q", "--json", out, "--csv", csvp,
            expect=1)
    check("completed no request" in p.stderr and "holds no request" in p.stderr,
          "honest failure: stderr names the cause")
    with open(out) as f:
        doc = json.load(f)
    runs = doc["runs"]
    check(len(runs) == NUM_POLICIES and len({r["policy"] for r in runs}) == NUM_POLICIES,
          "--policy all: every policy reported (%d runs)" % len(runs))
    r = runs[0]
    check(r["failure"] and r["memory"]["waste_frac"] is None and
          r["memory"]["breakdown"]["free"] is None and r["latency"]["tpot_p50_ms"] is None and
          r["latency"]["norm_ms_per_token"] is None and r["time"]["prefill_frac"] is None,
          "honest failure: JSON nulls, not zeros")
    with open(csvp) as f:
        rows = list(csv.DictReader(f))
    check(len(rows) == NUM_POLICIES and rows[0]["memory.waste_frac"] == "" and
          rows[0]["memory.breakdown.token_states"] == "" and rows[0]["failure"] != "",
          "honest failure: empty CSV cells, failure text present")
    ok = run(trace, "--policy", "paged,contiguous-max", "--batching", "static",
             "--preempt", "swap", "--swap-space", "1G", "--alloc-call-us", "20", "-q",
             "--json", out, "--csv", csvp)
    with open(out) as f:
        doc = json.load(f)
    c, r = doc["config"], doc["runs"][0]
    check(c["batching"] == "static" and c["swap_space_bytes"] == 1 << 30 and
          c["alloc_model"]["alloc"]["base_us"] == 20 and c["chunked_prefill"] == 0,
          "config holds the cost work's parameters")
    b = r["memory"]["breakdown"]
    check(r["failure"] is None and abs(sum(b.values()) - 1) < 1e-6 and
          r["memory"]["padding_frac"] > 0 and r["padding_tokens"] > 0 and
          r["alloc"]["model"].startswith("constant") and r["alloc"]["step_seconds"] >= 0 and
          0 < r["time"]["prefill_frac"] < 1 and "swap_fallbacks" in r,
          "runs hold breakdown, padding, alloc model, time split and swap")
    with open(csvp) as f:
        rows = list(csv.DictReader(f))
    check(float(rows[0]["memory.breakdown.token_states"]) == b["token_states"] and
          rows[0]["alloc.model"] == r["alloc"]["model"],
          "CSV columns are the JSON keys")
    check("alloc cost model: constant" in ok.stdout and "batching static" in ok.stdout,
          "table header names the cost model and batching")


def test_sim_efficiency():
    # Issue 16: sim mode's default efficiency is each preset's published figures
    # (fractions derived here from the quoted measurements: torchao's batch-1 decode
    # tokens/s moving the fp16 weights, TensorRT-LLM 0.5's 133 ms first-token
    # latency of a 2048-token llama2-7b prompt), shown in the JSON config and the
    # table header; --sim-efficiency peak is the plain roofline.
    trace = os.path.join(ROOT, "traces", "conv_small.csv")
    out = tmp("eff.json")
    l2, l3 = 6738415616.0, 8030261248.0  # llama2-7b, llama3-8b parameters

    def config_eff(*args):
        p = run(trace, "--policy", "paged", "-q", "--json", out, *args)
        with open(out) as f:
            doc = json.load(f)
        return doc["config"]["sim_efficiency"], doc["runs"][0], p

    e, r_default, p = config_eff()
    flops = 2 * l2 * 2048 + 4 * 32 * 32 * 128 * 2048 * 2049 / 2
    # The weights a step reads: all but the token embedding's unused rows.
    l2r, l3r = l2 - 32000 * 4096 + 4096, l3 - 128256 * 4096 + 4096
    check(abs(e["bw_frac"] - l2r * 2 * 107.38 / 2039e9) < 1e-8 and
          abs(e["compute_frac"] - flops / 0.133 / 312e12) < 1e-8 and e["step_overhead_us"] == 0 and
          "torchao" in e["source"], "a100-80g default: the published fractions (%s)" % e)
    check("roofline at 69.6% HBM bandwidth, 69.2% compute" in p.stdout,
          "table header states the factors")
    e, _, _ = config_eff("--gpu", "h100-80g")
    check(abs(e["bw_frac"] - l3r * 2 * 126.90 / 3.35e12) < 1e-8 and
          abs(e["compute_frac"] - flops / 0.036 / 1979e12) < 1e-8,
          "h100-80g default: torchao H100 decode, TRT-LLM FP8 share of compute (%s)" % e)
    e, r_peak, _ = config_eff("--sim-efficiency", "peak")
    check(e["bw_frac"] == 1 and e["compute_frac"] == 1 and e["step_overhead_us"] == 0,
          "--sim-efficiency peak: the plain roofline")
    check(r_peak["latency"]["step_p50_ms"] < r_default["latency"]["step_p50_ms"],
          "the plain roofline steps faster than the published efficiency")
    e, _, _ = config_eff("--sim-efficiency", "0.5,0.25,40")
    check(e["bw_frac"] == 0.5 and e["compute_frac"] == 0.25 and abs(e["step_overhead_us"] - 40) < 1e-9,
          "--sim-efficiency BW,COMPUTE,OVERHEAD_US as given")
    for args in (["--sim-efficiency", "1.5,1,0"], ["--sim-efficiency", "1,1"],
                 ["--sim-efficiency", "fast"], ["--sim-efficiency", "0,1,0"],
                 ["--sim-efficiency", "peak", "--mode", "run"]):
        run(trace, "-q", *args, expect=2)
    p = run(trace, "-q", "--calibration", tmp("none.json"), "--sim-efficiency", "peak", expect=2)
    check("--sim-efficiency" in p.stderr, "--calibration sets the efficiency itself")
    # Issue 21 item 9: the host link at its published achieved share (nvbandwidth:
    # A100 25.13 of 32 GB/s; H100 35.2 and 52.77 GB/s, harmonic mean, of 64), the
    # datasheet under an explicit efficiency.
    e, _, _ = config_eff()
    check(abs(e["host_link_frac"] - 25.13 / 32) < 1e-9, "a100-80g link share (%s)" % e)
    e, _, _ = config_eff("--gpu", "h100-80g")
    check(abs(e["host_link_frac"] - 2 / (1 / 35.2 + 1 / 52.77) / 64) < 1e-9,
          "h100-80g link share (%s)" % e)
    e, _, _ = config_eff("--sim-efficiency", "peak")
    check(e["host_link_frac"] == 1, "peak: the link's datasheet rate")
    # Issue 21 item 5: the default prices cudaMalloc by size (points in the config);
    # a run-mode calibration takes bench_alloc --calibrate's by-size model beside it.
    e, r, _ = config_eff()
    with open(out) as f:
        am = json.load(f)["config"]["alloc_model"]
    check(am["alloc"]["points"] == [[4096, 50], [524288, 50], [2097152, 50], [4294967296, 102400]]
          and am["free"]["points"] == am["alloc"]["points"] and am["alloc"]["sync"] is True,
          "default alloc model: cuda-boyer by size (%s)" % am)
    cal = tmp("cal.json")
    with open(cal, "w") as f:
        f.write('{"model": "llama2-7b", "device": "cuda", "dtype_bytes": 2, '
                '"achieved_bw_bytes_per_s": 1.5e12, "achieved_flops_per_s": 2e14, '
                '"step_overhead_us": 10, "alloc_call_us": 40, "free_call_us": 30, '
                '"steps": 100, "median_rel_err": 0.05}\n')
    e, r, _ = config_eff("--calibration", cal)
    with open(out) as f:
        am = json.load(f)["config"]["alloc_model"]
    check(am["alloc"]["base_us"] == 40 and am["free"]["base_us"] == 30,
          "a calibration alone: its flat per-call costs (%s)" % am)
    e, r, _ = config_eff("--calibration", cal, "--alloc-model", "cuda-boyer")
    with open(out) as f:
        am = json.load(f)["config"]["alloc_model"]
    check(len(am["alloc"]["points"]) == 4 and e["bw_frac"] == 1,
          "--calibration with --alloc-model: the by-size calls, the calibrated rates (%s)" % am)
    h = run("--help")
    check("--sim-efficiency" in h.stdout and "torchao" in h.stdout and "TensorRT-LLM" in h.stdout,
          "--help states the sources")


def test_timeline_breakdown():
    # Issue 25, item 5: the timeline's columns are the report's memory.breakdown.*
    # parts in bytes; they add up to the capacity on every row of every policy,
    # and, time-weighted over every step, they are the report's fractions.
    trace = os.path.join(ROOT, "traces", "conv_small.csv")
    out, tl = tmp("bd.json"), tmp("bd_tl.csv")
    # A small budget at a high load: external fragmentation in the contiguous ones.
    run(trace, "--policy", "all", "--kv-mem", "4G", "--load-scale", "4", "-q", "--json", out,
        "--timeline", tl, "--timeline-rows", "0")
    parts = ["token_states", "reserved", "internal_frag", "external_frag", "free"]
    with open(tl, newline="") as f:
        rows = list(csv.DictReader(f))
    bad = [r for r in rows
           if sum(int(r[p + "_bytes"]) for p in parts) != int(r["capacity_bytes"])]
    check(rows and not bad, "timeline: the five parts add up to capacity_bytes on all %d rows "
          "(%d do not)" % (len(rows), len(bad)))
    check(any(int(r["external_frag_bytes"]) > 0 for r in rows),
          "timeline: some rows have external fragmentation (the case that did not add up)")
    reports = {r["point"]["index"]: r for r in runs_of(out)}
    sizes = {(int(r["point"]), r["block_size"]) for r in rows}
    check(all(str(reports[p]["block_size"]) == b for p, b in sizes),
          "timeline: block_size is the report's (1 without blocks) on every row")
    worst = 0.0
    for point, rep in reports.items():
        rs = [r for r in rows if int(r["point"]) == point]
        w = sum(float(r["step_ms"]) for r in rs)
        for p in parts:
            got = sum(float(r["step_ms"]) * int(r[p + "_bytes"]) / int(r["capacity_bytes"])
                      for r in rs) / w
            worst = max(worst, abs(got - rep["memory"]["breakdown"][p]))
    check(worst < 1e-4, "timeline: time-weighted parts = memory.breakdown.* (worst %.2g)" % worst)


def test_table_says_rejected_and_deviations():
    # Issue 25, items 8 and 11: the table says how many requests were rejected and
    # why, and how often each policy deviated from a fixed schedule.
    trace = os.path.join(ROOT, "traces", "conv_small.csv")
    out = tmp("tab.json")
    p = run(trace, "--policy", "paged,contiguous-max", "--max-seq-len", "1024", "--kv-mem", "4G",
            "--schedule", "fixed-from", "paged", "-q", "--json", out)
    runs = {r["policy"]: r for r in runs_of(out)}
    lines_ = p.stdout.split("\n")
    head = next((l for l in lines_ if l.startswith("policy ") and "done" in l), "")
    check("rejected" in head and "sched dev" in head,
          "table: rejected and sched dev columns (%r)" % head)
    for name, r in runs.items():
        row = next((l.split() for l in lines_ if l.startswith(name + " ")), [])
        check(len(row) > 3 and row[2] == str(r["requests"]["rejected"]) and
              row[-1] == str(r["schedule_deviations"]),
              "table: %s's rejected (%s) and sched dev (%s) are the report's" %
              (name, row[2] if len(row) > 2 else "?", row[-1] if row else "?"))
    longs = runs["paged"]["requests"]["rejected_too_long"]
    check(longs > 0 and ("rejected by every policy: %d longer than the model's context" % longs)
          in p.stdout, "table: says why %d requests were rejected" % longs)
    check(runs["contiguous-max"]["schedule_deviations"] > 0,
          "contiguous-max deviates from paged's schedule at 4 GiB")


def test_fixed_schedule_decodes_every_request():
    # A recorded preemption can take a request from the middle of the replaying
    # policy's running list (its order differs from the recording's): the requests
    # after it still decode in that step. --validate checks that every running
    # request past its prompt decoded; before, they were skipped yet emitted tokens.
    trace = os.path.join(ROOT, "traces", "parallel_n2to8.csv")
    for pol in ("vmm", "paged", "realloc-copy"):
        run(trace, "-q", "--policy", pol, "--load-scale", "2", "--kv-mem", "3G", "--validate",
            "--schedule", "fixed-from contiguous-pow2-grow")  # exit 1 (corrupt) before


def test_bad_usage():
    trace = os.path.join(ROOT, "traces", "conv_small.csv")
    for args in (["--point", "4/3"], ["--point", "0/3"], ["--jobs", "0"],
                 ["--slo", "ttft_p99<=2"], ["--slo", "foo<=1s"], ["--slo", "ttft_p99<=1s"],
                 ["--load-scale", "1,-2"], ["--block-size", "8,,x"], ["--kv-mem", "1Q"], ["--kv-mem", "1.5"],
                 ["--policy", "paged,nope"], ["--batching", "static", "--chunked-prefill", "512"],
                 ["--alloc-model", "none", "--alloc-call-us", "5"], ["--alloc-model", "/nonexistent.json"]):
        run(trace, "-q", *args, expect=2)
    run("merge", expect=2)


def test_timeline_groups():
    # Issue 23: a model with KV cache groups adds each group's needed and held bytes
    # to every timeline row; a group never needs more than it holds, and the needed
    # bytes add up to the token states (which round them down to whole slots).
    trace = os.path.join(ROOT, "traces", "conv_small.csv")
    tl = tmp("grp_tl.csv")
    run(trace, "--policy", "paged,hybrid-lcm", "--model", "gemma-3-27b", "--gpu", "h100-80g",
        "-q", "--timeline", tl, "--timeline-rows", "0")
    with open(tl, newline="") as f:
        rows = list(csv.DictReader(f))
    cols = ["g0_sliding_needed_bytes", "g0_sliding_held_bytes", "g1_full_needed_bytes",
            "g1_full_held_bytes"]
    check(rows and all(c in rows[0] for c in cols), "timeline groups: columns %s" % cols)
    over = [r for r in rows for g in ("g0_sliding", "g1_full")
            if int(r[g + "_needed_bytes"]) > int(r[g + "_held_bytes"])]
    check(not over, "timeline groups: needed <= held on every row (%d not)" % len(over))
    bpt = 425984 + 81920  # gemma-3-27b's bytes per token, both groups, fp16
    off = [r for r in rows if not 0 <= sum(int(r[c]) for c in cols[::2]) - int(r["token_states_bytes"]) < bpt]
    check(not off, "timeline groups: needed bytes sum to the token states (%d rows not)" % len(off))
    check(any(int(r["g0_sliding_held_bytes"]) > int(r["g0_sliding_needed_bytes"]) for r in rows
              if r["policy"] == "paged"),
          "timeline groups: paged holds sliding blocks the model does not need")


def main():
    global TOOL, ROOT, TMP
    TOOL, ROOT = os.path.abspath(sys.argv[1]), os.path.abspath(sys.argv[2])
    with tempfile.TemporaryDirectory() as d:
        TMP = d
        for t in (test_sweep_jobs_and_individual_runs, test_shards_merge, test_slo_hand_computed,
                  test_stamp, test_sigint_partial, test_progress_line, test_plots,
                  test_cost_fields_and_failure, test_sim_efficiency, test_timeline_breakdown,
                  test_table_says_rejected_and_deviations,
                  test_fixed_schedule_decodes_every_request, test_bad_usage,
                  test_timeline_groups):
            print("--", t.__name__)
            t()
    print("%d failure(s)" % len(FAILS))
    return 1 if FAILS else 0


if __name__ == "__main__":
    sys.exit(main())

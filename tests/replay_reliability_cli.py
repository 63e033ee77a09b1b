#!/usr/bin/env python3
# SPDX-License-Identifier: MIT
"""pkv-replay at its edges (issue 20), driven as a user would.
Usage: replay_reliability_cli.py PKV_REPLAY LIAR_SO SOURCE_ROOT

d2  a plugin that breaks the contract stops the run: exit 1, its name, the slot, the value
d3  write errors are named ("cannot write FILE: reason"), exit 1, and a failed
    write leaves the previous report whole (temporary file + rename)
d4  malformed --slo specs: exit 2 naming the term
d5  merge of a binary file: "not a pkv-replay report"
d6  --policy-plugin NAME.so (no '/') is the file in the current directory
"""
import os
import resource
import shutil
import signal
import subprocess
import sys
import tempfile

exe, liar, root = (os.path.abspath(a) for a in sys.argv[1:4])
trace = os.path.join(root, "traces", "conv_small.csv")
forks = os.path.join(root, "traces", "parallel_n2to8.csv")  # n > 1: fork is called
failures = []


def run(*args, env=None, cwd=None, preexec=None):
    e = dict(os.environ)
    e.update(env or {})
    return subprocess.run([exe, *args], capture_output=True, text=True, env=e, cwd=cwd,
                          preexec_fn=preexec, timeout=120)


def expect(name, p, rc, *needles):
    ok = p.returncode == rc and all(n in p.stderr for n in needles)
    print(("ok   " if ok else "FAIL ") + name)
    if not ok:
        failures.append(name)
        print(f"     rc {p.returncode} (want {rc}); stderr: {p.stderr.strip()[-400:]}")


def check(name, cond, detail=""):
    print(("ok   " if cond else "FAIL ") + name)
    if not cond:
        failures.append(name)
        print("     " + detail)


tmp = tempfile.mkdtemp(prefix="pkv-rel-")
try:
    # d2: every lie, named, exit 1 (not 0, not "policy paged", not 2).
    for lie, slot, value in [("cached", "admit", "cached 4294967295 > prompt"),
                             ("granularity", "create", "granularity 4294967295"),
                             ("reserved", "stats", "> capacity"),
                             ("used", "stats", "used"),
                             ("status", "grow", "12345"),
                             ("invalid", "fork", "invalid argument")]:
        for extra in ([], ["--validate"]):
            p = run("-q", "--policy-plugin", liar, forks, *extra, env={"PKV_LIAR": lie})
            expect(f"d2 {lie} {' '.join(extra)}", p, 1, "(policy liar)", "policy 'liar'",
                   f"slot '{slot}'", value)
    p = run("-q", "--policy-plugin", liar, trace, env={"PKV_LIAR": ""})
    expect("d2 an honest plugin runs", p, 0)

    # d3: write errors, named.
    for opt in ("--json", "--csv", "--timeline", "--requests"):
        p = run("-q", opt, "/dev/full", trace)
        expect(f"d3 {opt} /dev/full", p, 1, "cannot write /dev/full: No space left on device")
    p = run("-q", "--json", "/proc/version", trace)
    expect("d3 --json /proc/version", p, 1, "cannot write /proc/version: ")
    p = run("-q", "--json", os.path.join(tmp, "no", "such", "dir.json"), trace)
    expect("d3 --json into a missing folder", p, 1, "cannot write ", "No such file or directory")
    p = run("-q", "--json", tmp, trace)
    expect("d3 --json onto a folder", p, 1, f"cannot write {tmp}: ")
    with open("/dev/full", "w") as full:
        p = subprocess.run([exe, "-q", trace], stdout=full, stderr=subprocess.PIPE, text=True)
    expect("d3 the table to a full stdout", p, 1, "cannot write stdout: No space left on device")
    good = os.path.join(tmp, "good.json")
    p = run("-q", "--json", good, trace)
    expect("d3 a report is written", p, 0)
    before = open(good).read()
    check("d3 ...and is whole", before.rstrip().endswith("}"), before[-80:])
    p = run("-q", "--json", "-", trace)
    expect("d3 --json - to stdout", p, 0)

    def small_files():  # RLIMIT_FSIZE: a write past 1 KiB fails with EFBIG
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
        resource.setrlimit(resource.RLIMIT_FSIZE, (1024, 1024))

    p = run("-q", "--json", good, "--policy", "paged,contiguous-max", trace, preexec=small_files)
    expect("d3 a write that fails half way", p, 1, f"cannot write {good}: File too large")
    check("d3 ...leaves the previous report whole", open(good).read() == before)
    check("d3 ...and no temporary file", sorted(os.listdir(tmp)) == ["good.json"],
          str(os.listdir(tmp)))
    link = os.path.join(tmp, "link.json")
    os.symlink(good, link)
    p = run("-q", "--json", link, trace)
    check("d3 a symlink is written through", p.returncode == 0 and os.path.islink(link),
          p.stderr)
    os.unlink(link)
    p = run("merge", "-o", "/dev/full", good)
    expect("d3 merge -o /dev/full", p, 1, "cannot write /dev/full: No space left on device")

    # d3: pkv-tracegen's trace, the same way.
    tracegen = os.path.join(os.path.dirname(exe), "pkv-tracegen")
    gen = subprocess.run([tracegen, "--out", "/dev/full"], capture_output=True, text=True)
    expect("d3 pkv-tracegen --out /dev/full", gen, 1,
           "pkv-tracegen: cannot write /dev/full: No space left on device")
    with open("/dev/full", "w") as full:
        gen = subprocess.run([tracegen], stdout=full, stderr=subprocess.PIPE, text=True)
    expect("d3 pkv-tracegen to a full stdout", gen, 1, "cannot write stdout")

    # d3: pkv-plot's figures, the same way (when matplotlib is there).
    plot = os.path.join(root, "tools", "pkv_plot.py")
    have_mpl = subprocess.run([sys.executable, "-c", "import matplotlib"],
                              capture_output=True).returncode == 0
    if have_mpl:
        tl = os.path.join(tmp, "tl.csv")
        expect("d3 a timeline for the plots", run("-q", "--timeline", tl, trace), 0)
        fig = os.path.join(tmp, "fig.png")

        def plot_to(out, preexec=None):
            return subprocess.run([sys.executable, plot, "capacity", tl, "-o", out],
                                  capture_output=True, text=True, preexec_fn=preexec)

        expect("d3 pkv-plot -o /dev/full", plot_to("/dev/full"), 1,
               "cannot write /dev/full: No space left on device")
        expect("d3 pkv-plot draws", plot_to(fig), 0)
        drawn = open(fig, "rb").read()
        expect("d3 pkv-plot, a write that fails half way", plot_to(fig, small_files), 1,
               f"cannot write {fig}: File too large")
        check("d3 ...leaves the previous figure whole", open(fig, "rb").read() == drawn)
        os.unlink(tl)
        os.unlink(fig)
    else:
        print("skip d3 pkv-plot (no matplotlib for %s)" % sys.executable)

    # d4: malformed --slo.
    for spec, term in [("ttft_p99<=2s,", "term 2"), ("ttft_p99<=2s,,tpot_p99<=1s", "term 2"),
                       (",ttft_p99<=2s", "term 1"), ("ttft_p99<=2s, ", "term 2"),
                       ("ttft_p99<=2s,ttft_p99<=1s", "'ttft_p99<=1s'"),
                       ("ttft_p99<=2s,ttft_p99<=2s", "bounded twice")]:
        p = run("-q", "--slo", spec, trace)
        expect(f"d4 --slo '{spec}'", p, 2, "--slo", term)
    p = run("-q", "--slo", " ttft_p99<=2s , tpot_p99<=100ms ", "--load-scale", "1,2", trace)
    expect("d4 spaces around terms are fine", p, 0)

    # d5: merge of a binary file.
    binf = os.path.join(tmp, "bin.json")
    with open(binf, "wb") as f:
        f.write(b"\x7fELF\x02\x01\x01\x00" + bytes(range(256)))
    p = run("merge", binf)
    expect("d5 merge of a binary file", p, 2, f"{binf} is not a pkv-replay report", "JSON")
    empty = os.path.join(tmp, "empty.json")
    open(empty, "w").close()
    p = run("merge", empty)
    expect("d5 merge of an empty file", p, 2, f"{empty} is empty")

    # d6: a bare file name is the file in the current directory.
    shutil.copy(liar, os.path.join(tmp, "noentry.so"))
    p = run("-q", "--policy-plugin", "noentry.so", trace, cwd=tmp, env={"PKV_LIAR": ""})
    expect("d6 --policy-plugin noentry.so from its folder", p, 0)
    p = run("-q", "--policy-plugin", "absent.so", trace, cwd=tmp)
    expect("d6 a missing bare name names the file", p, 2, "absent.so")
    p = run("-q", "--policy-plugin", "libc.so.6", trace, cwd=tmp)
    expect("d6 a bare name is not searched on the library path", p, 2, "libc.so.6")
finally:
    shutil.rmtree(tmp, ignore_errors=True)

print(f"{len(failures)} failure(s)")
sys.exit(1 if failures else 0)

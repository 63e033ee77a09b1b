#!/usr/bin/env python3
# SPDX-License-Identifier: MIT
"""Static memory-level parallelism of CUDA kernels, read from `cuobjdump -sass`.

For every kernel (filtered by --match) of one or more object files or binaries,
print: registers and stack bytes (cuobjdump -res-usage), spill instructions
(STL/LDL), global loads (LDG) and 16-byte global loads (LDG.*.128), and the most
global loads in flight per thread: scanning the straight-line code between
labels and branches, the largest number of LDGs issued before the first
instruction that reads a register one of them writes (a load whose result is
consumed before the next one is issued counts once), and the same for 16-byte
loads alone (the K/V rows of the attention kernels). This is a lower bound of
what the hardware keeps in flight (it ignores loads carried across a loop back
edge), and it is what the decode kernel's design promises: 4-8 independent
16-byte loads per thread before their first use.

usage: bench/sass_loads.py [--arch sm_90] [--match REGEX] [--json] FILE...
exit: 0 ok, 1 cuobjdump failed or found no kernel, 2 bad usage.
"""
import json
import re
import shutil
import subprocess
import sys

OP_RE = re.compile(r"^\s*/\*[0-9a-f]{4,}\*/\s+(@!?U?P\w+\s+)?([A-Z][A-Z0-9_.]*)\s*([^;]*);")
REG_RE = re.compile(r"\bR(\d+)\b")


def width_regs(opcode):
    for w, n in ((".128", 4), (".64", 2)):
        if w in opcode:
            return n
    return 1


def demangle(name):
    cxxfilt = shutil.which("c++filt")
    if not cxxfilt:
        return name
    try:
        return subprocess.run([cxxfilt, name], capture_output=True, text=True,
                              check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return name


def analyse(lines):
    """(ldg, ldg128, spills, most loads in flight, most 16-byte loads in flight)."""
    ldg = ldg128 = spills = best = best128 = 0
    pending = []  # (registers written, is 16-byte) of loads not yet used

    def peak():
        return len(pending), sum(1 for p in pending if p[1])
    for line in lines:
        if line.lstrip().startswith(".L_") or "BRA" in line or "EXIT" in line or \
                "BAR" in line or "RET" in line:
            # A label or a control transfer ends the straight-line window.
            n, n128 = peak()
            best, best128 = max(best, n), max(best128, n128)
            pending = []
            if not OP_RE.match(line):
                continue
        m = OP_RE.match(line)
        if not m:
            continue
        op, args = m.group(2), m.group(3)
        regs = [int(r) for r in REG_RE.findall(args)]
        if op.startswith(("STL", "LDL")):
            spills += 1
        is_ldg = op.startswith("LDG")
        # Sources: every register operand, except the destination of an
        # instruction that has one (stores and branches have none).
        has_dest = not op.startswith(("ST", "RED", "BRA", "BAR", "EXIT", "RET", "ISETP",
                                      "FSETP", "DSETP", "HSETP"))
        srcs = set(regs[1:] if has_dest and regs else regs)
        if has_dest and regs and op.startswith(("ISETP", "FSETP")):
            srcs = set(regs)
        if any(p[0] & srcs for p in pending):
            n, n128 = peak()
            best, best128 = max(best, n), max(best128, n128)
            pending = [p for p in pending if not (p[0] & srcs)]
        if is_ldg:
            ldg += 1
            if ".128" in op:
                ldg128 += 1
            if regs:
                base = regs[0]
                pending.append((set(range(base, base + width_regs(op))), ".128" in op))
    n, n128 = peak()
    return ldg, ldg128, spills, max(best, n), max(best128, n128)


def res_usage(cuobjdump, path, arch):
    cmd = [cuobjdump, "-res-usage"] + (["-arch", arch] if arch else []) + [path]
    out = subprocess.run(cmd, capture_output=True, text=True).stdout
    res = {}
    fn = None
    for line in out.splitlines():
        m = re.search(r"Function ([^\s:]+):", line)
        if m:
            fn = m.group(1)
            continue
        m = re.search(r"REG:(\d+) STACK:(\d+) SHARED:(\d+)", line)
        if m and fn:
            res[fn] = tuple(int(x) for x in m.groups())
    return res


def main(argv):
    arch = None
    match = "."
    as_json = False
    files = []
    i = 1
    while i < len(argv):
        a = argv[i]
        if a in ("-h", "--help"):
            print(__doc__)
            return 0
        if a == "--arch" and i + 1 < len(argv):
            arch = argv[i + 1]
            i += 2
            continue
        if a == "--match" and i + 1 < len(argv):
            match = argv[i + 1]
            i += 2
            continue
        if a == "--json":
            as_json = True
        elif a.startswith("-"):
            print(f"sass_loads.py: unknown option {a} (see --help)", file=sys.stderr)
            return 2
        else:
            files.append(a)
        i += 1
    if not files:
        print("sass_loads.py: no input file (see --help)", file=sys.stderr)
        return 2
    cuobjdump = shutil.which("cuobjdump")
    if not cuobjdump:
        print("sass_loads.py: cuobjdump not found on PATH", file=sys.stderr)
        return 1
    rows = []
    for path in files:
        cmd = [cuobjdump, "-sass"] + (["-arch", arch] if arch else []) + [path]
        p = subprocess.run(cmd, capture_output=True, text=True)
        if p.returncode != 0:
            print(f"sass_loads.py: {' '.join(cmd)} failed: {p.stderr.strip()}", file=sys.stderr)
            return 1
        usage = res_usage(cuobjdump, path, arch)
        fn, body, sm = None, [], None
        for line in p.stdout.splitlines() + ["\t\tFunction : <end>"]:
            m = re.search(r"code for (sm_\d+a?)", line)
            if m:
                sm = m.group(1)
            m = re.search(r"Function : (\S+)", line)
            if m:
                if fn and re.search(match, demangle(fn)):
                    ldg, ldg128, spills, best, best128 = analyse(body)
                    reg, stack, shared = usage.get(fn, (-1, -1, -1))
                    rows.append({"file": path, "arch": sm, "kernel": demangle(fn),
                                 "registers": reg, "stack_bytes": stack,
                                 "static_shared_bytes": shared, "spill_instructions": spills,
                                 "ldg": ldg, "ldg_128": ldg128,
                                 "max_loads_in_flight": best,
                                 "max_16b_loads_in_flight": best128})
                fn, body = m.group(1), []
                continue
            body.append(line)
    if not rows:
        print("sass_loads.py: no kernel matched", file=sys.stderr)
        return 1
    if as_json:
        print(json.dumps({"kernels": rows}, indent=1))
        return 0
    print(f"{'arch':6} {'regs':>4} {'stack':>5} {'spill':>5} {'smem':>6} {'LDG':>4} "
          f"{'LDG128':>6} {'inflight':>8} {'infl128':>7}  kernel")
    for r in rows:
        print(f"{r['arch'] or '?':6} {r['registers']:4} {r['stack_bytes']:5} "
              f"{r['spill_instructions']:5} {r['static_shared_bytes']:6} {r['ldg']:4} "
              f"{r['ldg_128']:6} {r['max_loads_in_flight']:8} "
              f"{r['max_16b_loads_in_flight']:7}  {r['kernel']}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))

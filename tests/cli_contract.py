#!/usr/bin/env python3
# SPDX-License-Identifier: MIT
"""The command-line error contract (issue 15): a table of bad inputs, each with
the exit code and the start of the message the tool must print. Files come from
the issue's defects and the fuzzers' finds. Exit codes: 0 ok, 1 runtime
failure, 2 bad usage or input; a bad input file is reported as
"pkv-replay: FILE:LINE: field NAME: message".

usage: cli_contract.py PKV_REPLAY PKV_TRACEGEN
"""
import json
import os
import subprocess
import sys
import tempfile

REPLAY, TRACEGEN = sys.argv[1], sys.argv[2]
HDR = b"arrival_s,prompt_tokens,output_tokens\n"
AZ = b"TIMESTAMP,ContextTokens,GeneratedTokens\n"
MC = b'{"timestamp": 0, "input_length": 3, "output_length": 4'


def rejected_all_policies(expect_completed, expect_rejected):
    """A JSON check: every policy completes / rejects the given counts and
    keeps every fraction in [0, 1]."""
    def check(out):
        runs = json.loads(out)["runs"]
        assert len(runs) == 14, (f"{len(runs)} runs (one per built-in policy, vmm, vmm-sync and "
                                 "the four hybrid ones included)")
        for r in runs:
            req = r["requests"]
            assert req["completed"] == expect_completed, (r["policy"], req)
            assert req["rejected"] == expect_rejected, (r["policy"], req)
            for k, v in r["memory"].items():
                if k.endswith("_frac") and v is not None:  # null: nothing completed
                    assert 0 <= v <= 1, (r["policy"], k, v)
            assert r["memory"]["peak_used_bytes"] <= r["memory"]["capacity_bytes"], r["policy"]
    return check


# (name, argv of pkv-replay, or of pkv-tracegen when it starts with "pkv-tracegen"
#  ({f} = the case's file, {g} = a file written by `gen`), file bytes
#  or None, gen: tracegen argv writing {g} first or None, exit code, stderr prefix
#  ({f} substituted), stdout check or None)
CASES = [
    # Defect 1: 32-bit overflow of prompt + output - 1.
    ("d1 overflowing lengths rejected", ["--quiet", "--policy", "all", "--json", "-", "{f}"],
     HDR + b"0,4294967295,2\n0,3072,4294967295\n0,100,10\n", None, 0, "",
     rejected_all_policies(1, 2)),
    ("d1 tracegen writes them, replay rejects them",
     ["--quiet", "--policy", "all", "--json", "-", "{g}"], None,
     ["--prompt-median", "1e300", "--prompt-max", "4294967295", "--requests", "5"], 1, "",
     rejected_all_policies(0, 5)),
    # Defect 2: non-finite arrivals from the generator.
    ("requests beyond memory", ["pkv-tracegen", "--requests", "4294967296"], None, None, 2,
     "pkv-tracegen: --requests 4294967296 needs", None),
    ("d2 burst-cv 1e200", ["pkv-tracegen", "--arrival", "bursty", "--burst-cv", "1e200", "--requests", "3"], None,
     None, 2, "pkv-tracegen: invalid parameters", None),
    ("d2 burst-cv inf", ["pkv-tracegen", "--arrival", "bursty", "--burst-cv", "inf"], None, None, 2,
     "pkv-tracegen: --burst-cv needs a finite number", None),
    ("d2 rate 1e-320", ["pkv-tracegen", "--rate", "1e-320", "--requests", "3"], None, None, 2,
     "pkv-tracegen: invalid parameters", None),
    ("d2 rate nan", ["pkv-tracegen", "--rate", "nan"], None, None, 2, "pkv-tracegen: --rate needs a finite number",
     None),
    # Defect 3: hash ids through a double.
    ("d3 hash id 1e20", ["{f}"], MC + b', "hash_ids": [1e20]}\n', None, 2,
     "pkv-replay: {f}:1: field hash_ids: block id is not an integer", None),
    ("d3 hash id 2^64", ["{f}"], MC + b', "hash_ids": [18446744073709551616]}\n', None, 2,
     "pkv-replay: {f}:1: field hash_ids: block id out of range", None),
    # Defect 4: NUL bytes.
    ("d4 NUL inside a CSV field", ["{f}"], HDR + b"0,12\x00garbage,5\n", None, 2,
     "pkv-replay: {f}:2: field prompt_tokens: NUL byte", None),
    ("d4 lone NUL", ["{f}"], HDR + b"\x00,12,5\n", None, 2,
     "pkv-replay: {f}:2: field arrival_s: NUL byte", None),
    ("d4 NUL in an Azure timestamp", ["{f}"], AZ + b"2023-11-16 18:15:46\x00,10,5\n", None, 2,
     "pkv-replay: {f}:2: field TIMESTAMP: NUL byte", None),
    ("d4 NUL after a JSON number", ["{f}"],
     b'{"timestamp": 1\x00, "input_length": 3, "output_length": 4}\n', None, 2,
     "pkv-replay: {f}:1: field timestamp: NUL byte", None),  # the key: issue 20, defect 10
    # Defect 6: saved traces load back.
    ("d6 rate 1e-300 trace replays", ["--quiet", "{g}"], None,
     ["--rate", "1e-300", "--requests", "3"], 0, "", None),
    ("d6 request id 2^64-1 loads", ["--quiet", "{f}"],
     b"arrival_s,prompt_tokens,output_tokens,request_id\n0,10,5,18446744073709551615\n", None, 0,
     "", None),
    # Defect 7: Azure timestamps.
    ("d7 Feb 30", ["{f}"], AZ + b"2023-02-30 10:00:00.5,10,5\n", None, 2,
     "pkv-replay: {f}:2: field TIMESTAMP: not a timestamp", None),
    ("d7 Feb 29 of 2023", ["{f}"], AZ + b"2023-02-29 10:00:00,10,5\n", None, 2,
     "pkv-replay: {f}:2: field TIMESTAMP: not a timestamp", None),
    ("d7 fraction with exponent", ["{f}"], AZ + b"2023-11-16 18:15:46.5e-1,10,5\n", None, 2,
     "pkv-replay: {f}:2: field TIMESTAMP: not a timestamp", None),
    # Defect 8: invalid JSON.
    ("d8 trailing comma in the object", ["{f}"], MC + b",}\n", None, 2,
     "pkv-replay: {f}:1: expected a quoted key", None),
    ("d8 trailing comma in hash_ids", ["{f}"], MC + b', "hash_ids": [1, 2,]}\n', None, 2,
     "pkv-replay: {f}:1: field hash_ids: block id is not an integer", None),
    ("d8 nulljunk", ["{f}"], MC + b', "x": nulljunk}\n', None, 2,
     "pkv-replay: {f}:1: expected ',' or '}'", None),
    ("d8 tru", ["{f}"], MC + b', "x": tru}\n', None, 2, "pkv-replay: {f}:1: not a JSON value",
     None),
    # Defect 9 (through the loader; pkv_trace_create is covered in test_trace).
    ("d9 prefix_group -5", ["{f}"],
     b"arrival_s,prompt_tokens,output_tokens,prefix_group\n0,10,5,-5\n", None, 2,
     "pkv-replay: {f}:2: field prefix_group: not a group id", None),
    # Defect 13: usage errors, BOM, long rows.
    ("d13 load-scale 1e-310", ["--load-scale", "1e-310", "{f}"], HDR + b"0,10,5\n1,10,5\n", None,
     2, "pkv-replay: --load-scale 1e-310 does not give valid arrivals", None),
    ("d13 load-scale inf", ["--load-scale", "inf", "{f}"], HDR + b"0,10,5\n", None, 2,
     "pkv-replay: --load-scale must be a finite number > 0", None),
    ("d13 load-scale 0", ["--load-scale", "0", "{f}"], HDR + b"0,10,5\n", None, 2,
     "pkv-replay: --load-scale must be a finite number > 0", None),
    ("d13 UTF-8 BOM accepted", ["--quiet", "{f}"], b"\xef\xbb\xbf" + HDR + b"0,10,5\n", None, 0,
     "", None),
    ("d13 row longer than the header", ["{f}"], HDR + b"0,10,5,7\n", None, 2,
     "pkv-replay: {f}:2: 4 fields, the header has 3", None),
    # The rest of the documented contract.
    ("empty file", ["{f}"], b"", None, 2, "pkv-replay: {f}: empty file", None),
    ("missing file", ["/nonexistent/trace.csv"], None, None, 2,
     "pkv-replay: /nonexistent/trace.csv: cannot open", None),
    ("unknown header", ["{f}"], b"a,b,c\n1,2,3\n", None, 2, "pkv-replay: {f}:1: unknown header",
     None),
    ("missing column", ["{f}"], b"arrival_s,prompt_tokens\n0,1\n", None, 2,
     "pkv-replay: {f}:1: field output_tokens: missing column", None),
    ("truncated row", ["{f}"], HDR + b"0,10\n", None, 2,
     "pkv-replay: {f}:2: field output_tokens: truncated line", None),
    ("unsorted arrivals", ["{f}"], HDR + b"1,10,5\n0,10,5\n", None, 2,
     "pkv-replay: {f}:3: field arrival_s: arrivals are not sorted", None),
    ("unterminated JSON", ["{f}"], MC + b"\n", None, 2,
     "pkv-replay: {f}:1: truncated line", None),
    ("unknown replay option", ["--frobnicate", "{f}"], HDR + b"0,10,5\n", None, 2,
     "pkv-replay: unknown option '--frobnicate'", None),
    ("tracegen requests 1e30", ["pkv-tracegen", "--requests", "1e30"], None, None, 2,
     "pkv-tracegen: --requests needs an integer in 1 .. 4294967296", None),
    ("tracegen prompt-max 2^32", ["pkv-tracegen", "--prompt-max", "4294967296"], None, None, 2,
     "pkv-tracegen: --prompt-max needs an integer in 1 .. 4294967295", None),
    ("tracegen negative n-min", ["pkv-tracegen", "--n-min", "-1"], None, None, 2,
     "pkv-tracegen: --n-min needs an integer", None),
]


def main():
    failed = 0
    with tempfile.TemporaryDirectory() as tmp:
        for i, (name, argv, data, gen, rc_want, prefix, check) in enumerate(CASES):
            f = os.path.join(tmp, f"case{i}.jsonl" if data and data.startswith(b"{") else f"case{i}.csv")
            g = os.path.join(tmp, f"gen{i}.csv")
            if data is not None:
                with open(f, "wb") as fh:
                    fh.write(data)
            if gen is not None:
                r = subprocess.run([TRACEGEN, *gen, "--out", g], capture_output=True)
                if r.returncode != 0:
                    print(f"FAIL {name}: tracegen exit {r.returncode}: {r.stderr.decode()}")
                    failed += 1
                    continue
            tool = REPLAY
            if argv[0] == "pkv-tracegen":
                tool, argv = TRACEGEN, argv[1:]
            args = [a.replace("{f}", f).replace("{g}", g) for a in argv]
            r = subprocess.run([tool, *args], capture_output=True, timeout=60)
            err = r.stderr.decode(errors="replace")
            want = prefix.replace("{f}", f)
            problems = []
            if r.returncode != rc_want:
                problems.append(f"exit {r.returncode}, want {rc_want}")
            if want and not err.startswith(want):
                problems.append(f"stderr {err.strip()[:200]!r} does not start with {want!r}")
            if rc_want == 0 and check is not None and not problems:
                try:
                    check(r.stdout.decode())
                except (AssertionError, ValueError, KeyError) as e:
                    problems.append(f"output check: {e!r}")
            if problems:
                failed += 1
                print(f"FAIL {name}: " + "; ".join(problems))
            else:
                print(f"ok   {name}")
    print(f"{len(CASES) - failed} of {len(CASES)} cases hold the contract")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())

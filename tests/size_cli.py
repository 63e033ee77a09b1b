#!/usr/bin/env python3
# SPDX-License-Identifier: MIT
# pkv-size's contract: the KV bytes per token from the model's shape, and the
# weights' element type: the KV dtype's, except that an 8-bit KV format keeps the
# weights in fp16 (vLLM's kv_cache_dtype is a cache setting, not a weight one),
# unless --weights-dtype says otherwise. Bad input exits 2 naming the option.
import json
import os
import subprocess
import sys
import tempfile

exe = sys.argv[1]
replay = sys.argv[2] if len(sys.argv) > 2 else None


def size(*args):
    r = subprocess.run([exe, "--json", *args], capture_output=True, text=True)
    assert r.returncode == 0, (args, r.returncode, r.stderr)
    return json.loads(r.stdout)


# llama2-7b: 32 layers x 32 kv heads x 128 dims x 2 (K and V).
elems = 2 * 32 * 32 * 128
fp16 = size("--model", "llama2-7b")
params = fp16["params"]
assert fp16["kv_bytes_per_token"] == elems * 2, fp16
assert fp16["weights_bytes"] == params * 2, fp16
fp32 = size("--model", "llama2-7b", "--dtype", "fp32")
assert fp32["weights_bytes"] == params * 4 and fp32["kv_bytes_per_token"] == elems * 4, fp32
for kv in ("int8", "fp8_e4m3", "fp8_e5m2", "fp8"):
    q = size("--model", "llama2-7b", "--dtype", kv)
    assert q["weights_bytes"] == params * 2, (kv, q)  # the weights stay fp16
    assert q["kv_bytes_per_token"] >= elems, (kv, q)  # 1 byte, int8 adds its scales
q = size("--model", "llama2-7b", "--dtype", "int8", "--weights-dtype", "int8")
assert q["weights_bytes"] == params, q
q = size("--model", "llama2-7b", "--dtype", "fp8", "--weights-dtype", "fp32")
assert q["weights_bytes"] == params * 4, q

for bad, word in ((["--dtype", "fp12"], "--dtype"), (["--weights-dtype", "x"], "--weights-dtype"),
                  (["--model", "nope"], "nope")):
    r = subprocess.run([exe, *bad], capture_output=True, text=True)
    assert r.returncode == 2, (bad, r.returncode)
    assert word in r.stderr, (bad, r.stderr)

# Issue 25, item 12: one size grammar for every tool (GB = 10^9; GiB and G = 2^30)
# and one KV budget rule: (memory - weights) x 0.9, pkv-replay's default.
GIB, GB = 1 << 30, 10**9
for text, want in (("80GB", 80 * GB), ("80GiB", 80 * GIB), ("80G", 80 * GIB),
                   ("80gb", 80 * GB), ("141GB", 141 * GB), ("1.5TB", 1500 * GB)):
    got = size("--model", "llama2-7b", "--memory", text)
    assert got["memory_bytes"] == want, (text, got["memory_bytes"], want)
m = size("--model", "llama2-7b", "--memory", "80GiB")
assert m["gpu_util"] == 0.9, m
assert m["kv_budget_bytes"] == int((80 * GIB - m["weights_bytes"]) * 0.9), m
half = size("--model", "llama2-7b", "--memory", "80GiB", "--gpu-util", "0.5")
assert half["kv_budget_bytes"] == int((80 * GIB - m["weights_bytes"]) * 0.5), half
for bad, word in ((["--memory", "80XB"], "--memory"), (["--memory", "1.5"], "--memory"),
                  (["--gpu-util", "1.5"], "--gpu-util"), (["--gpu", "v100"], "--gpu")):
    r = subprocess.run([exe, *bad], capture_output=True, text=True)
    assert r.returncode == 2 and word in r.stderr, (bad, r.returncode, r.stderr)
help_text = subprocess.run([exe, "--help"], capture_output=True, text=True).stdout
assert "GB" in help_text and "GiB" in help_text and "--gpu-util" in help_text, help_text

if replay:
    # The same budget, in bytes, from both tools, for every GPU preset; and
    # pkv-replay takes the sizes pkv-size takes.
    with tempfile.TemporaryDirectory() as d:
        trace = os.path.join(d, "t.csv")
        with open(trace, "w") as f:
            f.write("arrival_s,prompt_tokens,output_tokens\n0,16,4\n0.1,16,4\n")

        def replay_budget(*args):
            """The KV budget pkv-replay replays with, in bytes."""
            r = subprocess.run([replay, "--quiet", "--json", "-", *args, trace],
                               capture_output=True, text=True)
            assert r.returncode == 0, (args, r.returncode, r.stderr)
            return json.loads(r.stdout)["sweep"]["kv_mem_bytes"][0]

        for gpu in ("a100-80g", "h100-80g", "h200-141g"):
            s = size("--model", "llama2-7b", "--gpu", gpu)
            c = replay_budget("--model", "llama2-7b", "--gpu", gpu)
            assert s["kv_budget_bytes"] == c, (gpu, s, c)
        for text, want in (("40GB", 40 * GB), ("40GiB", 40 * GIB), ("40G", 40 * GIB),
                           ("1.5GiB", 3 * GIB // 2)):
            c = replay_budget("--kv-mem", text)
            assert c == want, (text, c, want)
        r = subprocess.run([replay, "--kv-mem", "40XB", trace], capture_output=True, text=True)
        assert r.returncode == 2 and "--kv-mem" in r.stderr, (r.returncode, r.stderr)
print("size_cli: ok")

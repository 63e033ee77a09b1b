#!/usr/bin/env python3
# SPDX-License-Identifier: MIT
# pkv-size's contract: the KV bytes per token from the model's shape, and the
# weights' element type: the KV dtype's, except that an 8-bit KV format keeps the
# weights in fp16 (vLLM's kv_cache_dtype is a cache setting, not a weight one),
# unless --weights-dtype says otherwise. Bad input exits 2 naming the option.
import json
import subprocess
import sys

exe = sys.argv[1]


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
print("size_cli: ok")

#!/usr/bin/env python3
# SPDX-License-Identifier: MIT
# pkv-size for models with KV cache groups (issue 23): one row per group and, per
# context length, one sequence's KV bytes window-aware and with every layer full, each
# equal to a hand computation from the model's published config.json values written
# here (fp16: 2 bytes a value). Uniform models keep their old report (size_cli.py).
import json
import subprocess
import sys

exe = sys.argv[1]


def size(*args):
    r = subprocess.run([exe, "--json", *args], capture_output=True, text=True)
    assert r.returncode == 0, (args, r.returncode, r.stderr)
    return json.loads(r.stdout)


def kept_sliding(n, w):
    return min(n, w)


def kept_chunked(n, c):
    return 0 if n == 0 else (n - 1) % c + 1


# name: list of (kind, layers, bytes per token per layer, window, state bytes per layer)
B = 2
HAND = {
    # layer_types alternate sliding_attention (window 128) / full_attention; 8 KV heads x 64
    "gpt-oss-20b": [("sliding", 12, 2 * 8 * 64 * B, 128, 0), ("full", 12, 2 * 8 * 64 * B, 0, 0)],
    "gpt-oss-120b": [("sliding", 18, 2 * 8 * 64 * B, 128, 0), ("full", 18, 2 * 8 * 64 * B, 0, 0)],
    # 62 layers, sliding_window_pattern 6: 10 global; 16 KV heads x 128; window 1024
    "gemma-3-27b": [("sliding", 52, 2 * 16 * 128 * B, 1024, 0), ("full", 10, 2 * 16 * 128 * B, 0, 0)],
    # 48 layers, every 4th global (NoPE), the others chunked by 8192; 8 KV heads x 128
    "llama-4-scout": [("chunked", 36, 2 * 8 * 128 * B, 8192, 0), ("full", 12, 2 * 8 * 128 * B, 0, 0)],
    # 61 MLA layers: kv_lora_rank 512 + qk_rope_head_dim 64
    "deepseek-v3": [("mla", 61, (512 + 64) * B, 0, 0)],
    # 12 gated-attention layers (2 KV heads x 256); 36 Gated DeltaNet layers in bf16:
    # 32 x 128 x 128 recurrent + (4 - 1) x (2 x 16 x 128 + 32 x 128) conv values
    "qwen3-next-80b": [("full", 12, 2 * 2 * 256 * B, 0, 0),
                       ("state", 36, 0, 0, (32 * 128 * 128 + 3 * (2 * 16 * 128 + 32 * 128)) * 2)],
    # 4 attention layers (8 KV heads x 128); 28 Mamba layers, d_inner 2 x 4096, bf16:
    # d_inner x 16 (SSM) + d_inner x (4 - 1) (conv)
    "jamba-1.5-mini": [("full", 4, 2 * 8 * 128 * B, 0, 0),
                       ("state", 28, 0, 0, (8192 * 16 + 8192 * 3) * 2)],
    "tiny-swa": [("sliding", 2, 2 * 2 * 64 * B, 16, 0), ("full", 2, 2 * 2 * 64 * B, 0, 0)],
    "tiny-mla": [("mla", 4, (64 + 32) * B, 0, 0)],
    "tiny-hybrid": [("full", 1, 2 * 4 * 64 * B, 0, 0), ("sliding", 2, 2 * 4 * 64 * B, 16, 0),
                    ("chunked", 1, 2 * 4 * 64 * B, 32, 0), ("mla", 1, (64 + 32) * B, 0, 0),
                    ("state", 1, 0, 0, 4 * 64 * 64 * 4)],
}


def hand_bytes(groups, n, aware):
    total = 0
    for kind, layers, per_tok, window, state in groups:
        kept = n
        if aware and kind == "sliding":
            kept = kept_sliding(n, window)
        elif aware and kind == "chunked":
            kept = kept_chunked(n, window)
        total += layers * (per_tok * kept + state)
    return total


for name, groups in HAND.items():
    r = size("--model", name)
    assert [g["kind"] for g in r["groups"]] == [g[0] for g in groups], (name, r["groups"])
    for got, want in zip(r["groups"], groups):
        assert got["layers"] == want[1], (name, got)
        assert got["kv_bytes_per_token"] == want[1] * want[2], (name, got)
        assert got["state_bytes_per_seq"] == want[1] * want[4], (name, got)
    assert [x["seq"] for x in r["lengths"]] == [8192, 32768, 131072], r["lengths"]
    for row in r["lengths"]:
        n = row["seq"]
        assert row["kv_bytes_window_aware"] == hand_bytes(groups, n, True), (name, row)
        assert row["kv_bytes_all_full"] == hand_bytes(groups, n, False), (name, row)
    one = size("--model", name, "--seq", "1000", "--batch", "3")
    assert len(one["lengths"]) == 1 and one["lengths"][0]["seq"] == 1000, one
    assert one["lengths"][0]["kv_bytes_total_window_aware"] == 3 * hand_bytes(groups, 1000, True)

# The headline: gemma-3-27b at 128k keeps ~1/6 of the paged cache.
g = size("--model", "gemma-3-27b", "--seq", "131072")["lengths"][0]
assert g["kv_bytes_all_full"] == 62 * 2 * 16 * 128 * 2 * 131072, g
assert g["kv_bytes_window_aware"] == 10 * 2 * 16 * 128 * 2 * 131072 + 52 * 2 * 16 * 128 * 2 * 1024, g

# The budget rule is pkv-replay's: (memory - weights) x 0.9, per length and mode.
m = size("--model", "gpt-oss-20b", "--memory", "80GiB", "--weights-dtype", "fp8")
assert m["params"] == 20910000000 and m["active_params"] == 3610000000, m
assert m["weights_bytes"] == 20910000000, m
budget = int((80 * (1 << 30) - m["weights_bytes"]) * 0.9)
assert m["kv_budget_bytes"] == budget, m
for row in m["lengths"]:
    assert row["requests_fit_window_aware"] == budget // row["kv_bytes_window_aware"], row
    assert row["requests_fit_all_full"] == budget // row["kv_bytes_all_full"], row

# The text report names every group and both costs.
t = subprocess.run([exe, "--model", "tiny-hybrid"], capture_output=True, text=True)
assert t.returncode == 0, t.stderr
for word in ("full", "sliding", "chunked", "mla", "state", "64 + 32", "window-aware",
             "all layers full"):
    assert word in t.stdout, (word, t.stdout)

# Uniform models keep their old report (no groups, no lengths).
u = size("--model", "llama-3.1-8b")
assert "groups" not in u and u["kv_bytes_per_token"] == 2 * 32 * 8 * 128 * 2, u

# Bad combinations name the option.
for bad, word in ((["--model", "gemma-3-27b", "--layers", "4"], "--layers"),
                  (["--model", "deepseek-v3", "--dtype", "int8"], "int8")):
    r = subprocess.run([exe, *bad], capture_output=True, text=True)
    assert r.returncode == 2 and word in r.stderr, (bad, r.returncode, r.stderr)
help_text = subprocess.run([exe, "--help"], capture_output=True, text=True).stdout
for word in ("KV cache groups", "window-aware", "gpt-oss-120b", "tiny-hybrid"):
    assert word in help_text, word
print("size_groups_cli: ok")

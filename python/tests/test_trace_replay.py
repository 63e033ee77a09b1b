# SPDX-License-Identifier: MIT
"""The testbed from Python: every trace format, errors with file:line:field, replay."""
import json
import pathlib
import subprocess

import numpy as np
import pytest

import pagedkv as pkv

ROOT = pathlib.Path(__file__).resolve().parents[2]
CONV = ROOT / "traces" / "conv_small.csv"

FORMATS = {
    "native.csv": ("arrival_s,prompt_tokens,output_tokens\n0,10,5\n1.5,20,6\n", "native"),
    "AzureLLMInferenceTrace_code.csv": (
        "TIMESTAMP,ContextTokens,GeneratedTokens\n"
        "2023-11-16 18:17:03.9799600,4808,10\n2023-11-16 18:17:05.4799600,3180,8\n", "azure"),
    "BurstGPT_1.csv": (
        "Timestamp,Model,Request tokens,Response tokens,Total tokens,Log Type\n"
        "5,ChatGPT,472,18,490,Conversation log\n45,GPT-4,1087,230,1317,Conversation log\n",
        "burstgpt"),
    "conversation_trace.jsonl": (
        '{"timestamp": 0, "input_length": 1500, "output_length": 10, "hash_ids": [0, 1, 2]}\n'
        '{"timestamp": 1500, "input_length": 1200, "output_length": 20, "hash_ids": [0, 1, 3]}\n',
        "mooncake"),
}


@pytest.mark.parametrize("name", sorted(FORMATS))
def test_load_every_format(tmp_path, name):
    text, fmt = FORMATS[name]
    path = tmp_path / name
    path.write_text(text)
    t = pkv.load_trace(path)
    assert t.format == fmt and len(t) == 2 and t.skipped == 0
    r = t.requests
    assert r.dtype == pkv.TRACE_DTYPE and r["arrival_s"][0] == 0 and r["arrival_s"][1] == 1.5 \
        or fmt == "burstgpt"
    assert not r.flags.writeable  # a view of the trace's own memory
    assert (r["prompt_tokens"] >= 1).all()
    assert pkv.parse_trace(text, name).format == fmt
    assert pkv.load_trace(str(path), format=fmt).format == fmt


def test_requests_columns():
    t = pkv.load_trace(CONV)
    r = t.requests
    assert len(t) == 400 and r["request_id"][1] == 1 and r["prompt_tokens"][0] == 992
    assert r["output_tokens"][0] == 106 and r["n"][0] == 1 and r["prefix_group"][0] == -1
    assert (np.diff(r["arrival_s"]) >= 0).all()
    assert "400 requests" in repr(t)


def test_errors_name_file_line_field(tmp_path):
    bad = tmp_path / "bad.csv"
    bad.write_text("arrival_s,prompt_tokens,output_tokens\n0,10,5\n1,abc,5\n")
    with pytest.raises(pkv.FormatError) as e:
        pkv.load_trace(bad)
    assert e.value.file == str(bad) and e.value.line == 3 and e.value.field == "prompt_tokens"
    assert f"{bad}:3:prompt_tokens" in str(e.value) and isinstance(e.value, ValueError)
    t = pkv.load_trace(bad, skip_bad=True)
    assert len(t) == 1 and t.skipped == 1
    with pytest.raises(pkv.FileError) as e:
        pkv.load_trace(tmp_path / "missing.csv")
    assert isinstance(e.value, OSError) and e.value.line == 0
    with pytest.raises(pkv.FormatError):
        pkv.parse_trace("", "empty.csv")
    with pytest.raises(pkv.FormatError):
        pkv.parse_trace("a,b\n1,2\n", "unknown.csv")
    with pytest.raises(pkv.InvalidArgument):
        pkv.load_trace(CONV, format="parquet")


def test_make_generate_save_roundtrip(tmp_path):
    t = pkv.make_trace([0.0, 0.5, 1.0], [10, 20, 30], [1, 2, 3], n=[1, 2, 1])
    assert len(t) == 3 and t.requests["n"].tolist() == [1, 2, 1]
    path = tmp_path / "out.csv"
    t.save(path)
    back = pkv.load_trace(path)
    assert back.requests.tolist() == t.requests.tolist()
    with pytest.raises(pkv.FormatError) as e:
        pkv.make_trace([0.0, 1.0], [10, 0], [1, 1])  # a zero-length prompt
    assert e.value.line == 1
    with pytest.raises(pkv.FormatError):
        pkv.make_trace([1.0, 0.0], [10, 10], [1, 1])  # unsorted
    with pytest.raises(pkv.InvalidArgument):
        pkv.make_trace([0.0], [-5], [1])
    with pytest.raises(pkv.InvalidArgument):
        pkv.make_trace([0.0, 1.0], [1, 2, 3], [1, 1])
    g = pkv.generate_trace(num_requests=50, seed=3, arrival="bursty", burst_cv=2.0)
    g2 = pkv.generate_trace(num_requests=50, seed=3, arrival="bursty", burst_cv=2.0)
    assert len(g) == 50 and g.requests.tolist() == g2.requests.tolist()
    with pytest.raises(pkv.InvalidArgument):
        pkv.generate_trace(num_requests=0)
    with pytest.raises(pkv.InvalidArgument):
        pkv.generate_trace(bogus=1)
    with pytest.raises(pkv.InvalidArgument):
        pkv.generate_trace(arrival="uniform")
    with pytest.raises(pkv.FileError):
        t.save(tmp_path / "no" / "such" / "dir.csv")


def test_replay_report_is_the_tools_json():
    report = pkv.replay(CONV, policies="all", kv_mem_bytes="16G")
    assert set(report) == {"trace", "config", "runs"}
    assert report.policies == list(pkv.POLICIES)
    paged = report["paged"]
    assert paged["requests"]["completed"] == 400 and paged["memory"]["capacity_bytes"] == 16 << 30
    assert 0 <= paged["memory"]["waste_frac"] < report["contiguous-max"]["memory"]["waste_frac"]
    assert report["config"]["kv_budget_bytes"] == 16 << 30
    rows = report.rows()
    assert rows[0]["policy"] == "paged" and "latency.step_p99_ms" in rows[0]
    # the same numbers as the command-line tool, key for key
    tool = ROOT / "build" / "tools" / "pkv-replay"
    if tool.exists():
        out = subprocess.run([str(tool), "--policy", "paged", "--kv-mem", "16G", "--quiet", "--json", "-",
                              str(CONV)], capture_output=True, text=True)
        assert out.returncode == 0, out.stderr
        run = json.loads(out.stdout)["runs"][0]
        for key in ("requests", "memory", "alloc", "batch"):
            assert run[key] == paged[key]


def test_replay_params_and_errors():
    t = pkv.load_trace(CONV)
    a = pkv.replay(t, "paged", block_size=32, kv_mem_bytes=8 << 30, model="llama2-7b",
                   gpu="h100-80g", preempt="swap", max_batch=64, watermark=0.0,
                   prefix_sharing=False)
    assert a["paged"]["block_size"] == 32 and a["config"]["max_batch"] == 64
    assert a["config"]["preempt"] == "swap"
    for bad in (dict(bogus=1), dict(mode="fast"), dict(block_size=-1), dict(block_size="16"),
                dict(kv_mem_bytes="lots"), dict(watermark="x")):
        with pytest.raises(pkv.InvalidArgument):
            pkv.replay(t, **bad)
    with pytest.raises(pkv.NotFound):
        pkv.replay(t, "buddy")
    with pytest.raises(pkv.NotFound):
        pkv.replay(t, model="gpt5")
    with pytest.raises(pkv.InvalidArgument):
        pkv.replay(t, [])
    with pytest.raises(pkv.InvalidArgument):
        pkv.replay(t, block_size=0)
    with pytest.raises(TypeError):
        pkv.replay(42)


def test_replay_frame():
    pd = pytest.importorskip("pandas")
    df = pkv.replay(CONV, ["paged", "contiguous-max"], frame=True, kv_mem_bytes="16G")
    assert isinstance(df, pd.DataFrame) and list(df.index) == ["paged", "contiguous-max"]
    assert df.loc["paged", "requests.completed"] == 400


def test_replay_cost_model_and_batching_params():
    # The cost model reaches the step: per-token allocation at 100 us a call is
    # slower per output token than free calls, and the report names the model.
    t = pkv.load_trace(CONV)
    free_calls = pkv.replay(t, "malloc-per-token", kv_mem_bytes="16G", alloc_model="none")
    paid = pkv.replay(t, "malloc-per-token", kv_mem_bytes="16G", alloc_call_us=100)
    a, b = free_calls["malloc-per-token"], paid["malloc-per-token"]
    assert a["alloc"]["model"] == "none" and b["alloc"]["model"] == "constant 100 us/call"
    assert a["alloc"]["step_seconds"] == 0 and b["alloc"]["step_seconds"] > 0
    assert b["latency"]["tpot_p50_ms"] > a["latency"]["tpot_p50_ms"]
    static = pkv.replay(t, "paged", kv_mem_bytes="16G", batching="static", load_scale=2.0,
                        chunked_prefill=0, swap_space_bytes=1 << 30)
    assert static["config"]["batching"] == "static"
    assert static["paged"]["requests"]["completed"] == 400
    for bad in (dict(batching="dynamic"), dict(alloc_call_us=-1), dict(alloc_model="nope"),
                dict(load_scale=0.0)):
        with pytest.raises(pkv.PagedKVError):
            pkv.replay(t, **bad)


def test_replay_hybrid_policies_and_groups():
    # tiny-swa: a sliding group (window 16) and a full group, 1024 bytes per token
    # each. One request of 8 + 33 tokens, blocks of 4: the last decode append (at
    # position 39) has released sliding blocks 0..5; paged treats every layer as
    # full attention and releases none.
    t = pkv.make_trace([0.0], [8], [33])
    r = pkv.replay(t, ["paged", "hybrid-partition", "hybrid-shared-page"], model="tiny-swa",
                   block_size=4, kv_mem_bytes=1 << 20, watermark=0, alloc_model="none")
    assert r.policies == ["paged", "hybrid-partition", "hybrid-shared-page"]
    g = r.groups("hybrid-partition")
    assert [x["kind"] for x in g] == ["sliding", "full"]
    assert g[0]["window"] == 16 and g[0]["bytes_per_token"] == 1024
    assert g[0]["blocks_released"] == 6 and g[1]["blocks_released"] == 0
    assert r.groups("paged")[0]["blocks_released"] == 0
    assert r["paged"]["memory"]["waste_frac"] > r["hybrid-partition"]["memory"]["waste_frac"]
    assert pkv.replay(t, "paged", model="tiny", kv_mem_bytes=1 << 20).groups("paged") == []

# SPDX-License-Identifier: MIT
"""pagedkv.sweep: a pkv-replay sweep run point by point on an executor (threads,
processes, a Dask cluster) gives the report of one pkv-replay run of the grid, byte for
byte apart from the stamp; bad grids and failing points raise, naming the problem."""
import concurrent.futures
import importlib
import json
import os
import subprocess

import pytest

import pagedkv as pkv

# The module (pagedkv.sweep is the function; its module is pagedkv._sweep).
sweep_module = importlib.import_module("pagedkv._sweep")

# 2 budgets x 2 loads x (paged at 2 block sizes + contiguous-max + vmm) = 16 points.
GRID = {"policy": ["paged", "contiguous-max", "vmm"], "block_size": [16, 32],
        "load_scale": [1, 2.5], "kv_mem": ["3G", "6G"], "max_batch": 32}


@pytest.fixture(scope="module")
def trace_path(tmp_path_factory):
    path = tmp_path_factory.mktemp("sweep") / "small.csv"
    pkv.generate_trace(seed=7, num_requests=60, rate_rps=20.0).save(str(path))
    return str(path)


def one_run(trace_path, grid):
    """The reference: one `pkv-replay [grid] --json - TRACE` run of the whole sweep, by
    the tool's code in the extension and, when the build gave one ($PKV_REPLAY), by
    the installed program too."""
    args = [*sweep_module.grid_args(grid), "--quiet", "--json", "-", trace_path]
    rc, out, err = sweep_module.run_point(args)
    assert rc == 0, err.decode()
    texts = [out.decode()]
    exe = os.environ.get("PKV_REPLAY")
    if exe:
        r = subprocess.run([exe, *args], capture_output=True, text=True, timeout=600)
        assert r.returncode == 0, r.stderr
        texts.append(r.stdout)
    return texts


def without_stamp(text):
    lines = text.split("\n")
    assert lines[0].startswith('{"stamp": '), lines[0]
    return "\n".join(lines[1:])


def check_same(report, references, points):
    assert isinstance(report, pkv.SweepReport)
    for ref in references:
        assert without_stamp(report.json) == without_stamp(ref)
    assert report["sweep"]["points"] == points and len(report["runs"]) == points
    assert [r["point"]["index"] for r in report["runs"]] == list(range(points))
    assert report["partial"] is False
    # Each point ran on its own: the stamp lists one shard per point.
    assert len(report["stamp"]["merged_from"]) == points


def test_sweep_threads_matches_one_run(trace_path):
    refs = one_run(trace_path, GRID)
    report = pkv.sweep(trace_path, GRID)
    check_same(report, refs, 16)
    # The runs differ from each other (the grid is not degenerate).
    assert len({json.dumps(r["memory"]) for r in report["runs"]}) > 4
    rows = report.rows()
    assert rows[0]["point.index"] == 0 and "memory.waste_frac" in rows[0]


def test_sweep_process_pool_and_raw_arguments(trace_path):
    grid = ["--policy", "paged,contiguous-pow2", "--block-size", "8,16", "--kv-mem", "4G"]
    refs = one_run(trace_path, grid)
    with concurrent.futures.ProcessPoolExecutor(max_workers=2) as ex:
        report = pkv.sweep(trace_path, grid, executor=ex)
    check_same(report, refs, 3)


def test_sweep_on_dask_local_cluster(trace_path):
    distributed = pytest.importorskip("distributed")  # python/run_tests.sh installs it
    refs = one_run(trace_path, GRID)
    with distributed.LocalCluster(n_workers=2, threads_per_worker=1, processes=True,
                                  dashboard_address=None) as cluster, \
            distributed.Client(cluster) as client:
        report = pkv.sweep(trace_path, GRID, executor=client.get_executor())
    check_same(report, refs, 16)


def test_grid_arguments():
    import numpy as np
    assert sweep_module.grid_args({"policy": ["paged", "vmm"], "load_scale": np.array([0.5, 2.0]),
                                   "block_size": np.arange(8, 24, 8), "vmm_map_ahead": True,
                                   "validate": False, "kv-mem": "4G"}) == \
        ["--policy", "paged,vmm", "--load-scale", "0.5,2.0", "--block-size", "8,16",
         "--vmm-map-ahead", "--kv-mem", "4G"]
    with pytest.raises(ValueError, match="empty list"):
        sweep_module.grid_args({"policy": []})


def test_bad_grids_are_refused(trace_path):
    with pytest.raises(ValueError, match="--json"):
        pkv.sweep(trace_path, {"json": "out.json"})
    with pytest.raises(ValueError, match="--point"):
        pkv.sweep(trace_path, ["--point", "1/2"])
    with pytest.raises(TypeError, match="file path"):
        pkv.sweep(pkv.load_trace(trace_path), GRID)
    with pytest.raises(TypeError, match="grid"):
        pkv.sweep(trace_path, 42)
    # pkv-replay's own checks, with its message.
    with pytest.raises(pkv.SweepError, match="unknown policy 'nope'") as e:
        pkv.sweep(trace_path, {"policy": ["paged", "nope"]})
    assert e.value.returncode == 2 and e.value.report is None
    with pytest.raises(pkv.SweepError, match="block size must be 1..65536"):
        pkv.sweep(trace_path, {"block_size": [16, 0]})
    with pytest.raises(pkv.SweepError, match="no-such-file.csv"):
        pkv.sweep(trace_path + ".no-such-file.csv", GRID)


def test_failing_point_raises_with_the_report(trace_path):
    # 8M cannot hold one request of llama2-7b at its longest: every run completes
    # nothing, which pkv-replay reports as a failure (exit 1) after writing the runs.
    grid = {"policy": ["paged", "contiguous-max"], "kv_mem": "8M"}
    args = [*sweep_module.grid_args(grid), "--quiet", "--json", "-", trace_path]
    rc, out, _ = sweep_module.run_point(args)
    assert rc == 1
    with pytest.raises(pkv.SweepError, match="completed no request") as e:
        pkv.sweep(trace_path, grid)
    assert e.value.returncode == 1
    assert without_stamp(e.value.report.json) == without_stamp(out.decode())


def test_merge_takes_thousands_of_shards(trace_path, tmp_path):
    # One shard per point is how sweep and Slurm arrays run: pkv-replay merge used
    # to drop every file after the 4096th and call the report partial.
    rc, out, err = sweep_module.run_point(
        ["--point", "1/1", "--quiet", "--json", "-", "--kv-mem", "4G", trace_path])
    assert rc == 0, err.decode()
    lines = out.decode().split("\n")
    n = 4200
    sweep_line = json.loads("{" + lines[3].rstrip(",") + "}")
    sweep_line["sweep"]["points"] = n
    lines[3] = " " + json.dumps(sweep_line)[1:-1] + ","
    run = lines[5]
    assert run.startswith('  {"point": {"index": 0,'), run
    shards = []
    for i in range(n):
        doc = list(lines)
        doc[5] = run.replace('{"index": 0,', '{"index": %d,' % i, 1)
        shards.append("\n".join(doc))
    merged = json.loads(sweep_module.merge(shards))
    assert len(merged["runs"]) == n and merged["partial"] is False
    assert [r["point"]["index"] for r in merged["runs"]] == list(range(n))

# SPDX-License-Identifier: MIT
"""Sweeps beyond one machine: ``pagedkv.sweep(trace, grid, executor)`` runs the points
of a pkv-replay sweep on any ``concurrent.futures.Executor`` and returns the report that
one ``pkv-replay`` run of the whole grid writes, byte for byte apart from the stamp.

How: each point is ``pkv-replay --point K/N`` (N = the number of points, so shard K is
point K-1), run by the tool's own C code built into the extension, and the shards are
joined by ``pkv-replay merge``'s C code. Nothing is re-implemented here; this file only
turns a grid into the tool's arguments and hands the shards around.
"""
import concurrent.futures
import json
import os
import tempfile
from collections.abc import Iterable, Mapping

from . import _testbed

_PROGRAM = "pkv-replay"
# `--point N/N` with N beyond any sweep's point count (indices are uint32) runs no
# point: the tool still checks the options, loads the trace and writes the sweep line,
# which gives the count.
_PROBE = 4294967295
# Options that choose outputs or the tool's own parallelism: sweep owns those.
_REFUSED = {"json", "csv", "timeline", "timeline-rows", "requests", "point", "jobs", "j",
            "quiet", "q", "calibrate-out", "help", "h"}


class SweepError(RuntimeError):
    """A sweep's grid was refused, or some of its points failed. ``returncode`` is
    pkv-replay's exit code (2: bad options or trace, 1: a point failed, 130:
    interrupted), ``stderr`` its messages, ``report`` the merged report of the points
    that wrote one (the document ``pkv-replay`` writes in the same case), or None."""

    def __init__(self, message, returncode, stderr, report=None):
        super().__init__(message)
        self.returncode = returncode
        self.stderr = stderr
        self.report = report


class SweepReport(dict):
    """The sweep's JSON document as a dict (stamp, trace, config, sweep, runs,
    partial); ``.json`` is its exact text, as ``pkv-replay --json`` writes it."""

    def __init__(self, text):
        super().__init__(json.loads(text))
        self.json = text

    def rows(self):
        """One flat dict per run: nested keys joined with '.' (point.policy, ...)."""
        from ._report import _rows
        return _rows(self["runs"])


def _value(v):
    if isinstance(v, bool):
        raise ValueError(f"sweep: a boolean inside a list ({v!r}) is not an option value")
    # repr(float(...)): the shortest text that reads back as the same double (numpy's
    # own repr would be "np.float64(2.5)").
    return repr(float(v)) if isinstance(v, float) else str(v)


def grid_args(grid):
    """pkv-replay's arguments for ``grid``: a mapping of option names (``block_size``
    or ``block-size``) to a value, a list (the sweep's axes: policy, block_size,
    load_scale, kv_mem take comma-separated lists), True (a flag) or False/None
    (left out); or the arguments themselves as a list of str."""
    if isinstance(grid, Mapping):
        args = []
        for key, value in grid.items():
            opt = "--" + str(key).lstrip("-").replace("_", "-")
            if value is True:
                args.append(opt)
            elif value is False or value is None:
                continue
            elif isinstance(value, Iterable) and not isinstance(value, (str, bytes)):
                values = list(value)  # a list, a tuple, a numpy array, a range
                if not values:
                    raise ValueError(f"sweep: {key} is an empty list")
                args += [opt, ",".join(_value(v) for v in values)]
            else:
                args += [opt, _value(value)]
    elif isinstance(grid, (list, tuple)) and all(isinstance(a, str) for a in grid):
        args = list(grid)
    else:
        raise TypeError("sweep: grid must be a mapping of pkv-replay options or a list of "
                        "its arguments, not " + type(grid).__name__)
    for a in args:
        name = a.lstrip("-").split("=", 1)[0]
        if a.startswith("-") and name in _REFUSED:
            raise ValueError(f"sweep: {a} is not a grid option (sweep returns the JSON "
                             "report and runs the points on the executor; run pkv-replay "
                             "for --timeline, --requests, --csv or --calibrate-out)")
    if args[:1] == ["merge"]:
        raise ValueError("sweep: 'merge' is not a grid option")
    return args


def run_point(args):
    """``pkv-replay ARGS`` in a child process: (exit code, stdout, stderr). What the
    executor runs, once per point; module-level so that executors can pickle it."""
    return _testbed._replay_cli([_PROGRAM, *args])


def _text(result):
    rc, out, err = result
    return rc, out.decode(), err.decode(errors="replace")


def _complaints(err):
    """The tool's messages in its stderr (which also holds the table): its lines that
    start with its name."""
    lines = [l for l in err.splitlines() if l.startswith(_PROGRAM)]
    return " / ".join(lines) if lines else err.strip()[-500:]


def merge(shards):
    """The texts of shard reports (``pkv-replay --point K/N --json``) joined by
    ``pkv-replay merge``: the report one run of the whole sweep writes."""
    with tempfile.TemporaryDirectory(prefix="pkv-sweep-") as d:
        files = []
        for i, text in enumerate(shards):
            path = os.path.join(d, f"shard-{i:08d}.json")
            with open(path, "w") as f:
                f.write(text)
            files.append(path)
        rc, out, err = _text(_testbed._replay_cli([_PROGRAM, "merge", *files]))
    if rc != 0:
        raise SweepError(f"sweep: merging the shards failed (exit {rc}): {_complaints(err)}",
                         rc, err)
    return out


def sweep(trace, grid, executor=None):
    """Run the sweep ``pkv-replay [grid options] trace`` with its points spread over
    ``executor`` and return its report (a SweepReport). ``trace`` is a file path that
    every worker can read under that name (the report names and hashes the file, as
    pkv-replay does). ``grid``: see grid_args, e.g. ``{"policy": ["paged", "vmm"],
    "block_size": [16, 32], "load_scale": [1, 2, 4], "kv_mem": ["8G", "16G"],
    "model": "llama2-7b"}``.

    ``executor``: any concurrent.futures.Executor, e.g. a Dask
    ``distributed.Client(...).get_executor()``; workers need this package installed.
    None: a local pool of os.cpu_count() threads, each waiting on the child process
    that runs its point (the points run in parallel; nothing is pickled).

    The result equals ``pkv-replay [grid options] --json - trace`` except the stamp,
    which lists the stamps of the points (as ``pkv-replay merge`` writes). Raises
    SweepError when pkv-replay refuses the options or a point fails (its
    ``report`` then holds the points that ran, as pkv-replay would write them)."""
    if not isinstance(trace, (str, bytes, os.PathLike)):
        raise TypeError("sweep: trace must be a file path that every worker can read "
                        "(save a Trace with Trace.save(path)), not " + type(trace).__name__)
    path = os.fsdecode(trace)
    if path.startswith("-"):
        raise ValueError(f"sweep: trace path {path!r} would read as an option; "
                         "write it as ./" + path)
    options = grid_args(grid)
    own = executor is None
    if own:
        executor = concurrent.futures.ThreadPoolExecutor(max_workers=os.cpu_count() or 1)
    try:
        def shard(k, n):
            return executor.submit(run_point, [*options, "--point", f"{k}/{n}", "--quiet",
                                               "--json", "-", path])

        rc, out, err = _text(shard(_PROBE, _PROBE).result())
        if rc != 0:
            raise SweepError(f"sweep: pkv-replay refused the sweep (exit {rc}): "
                             f"{_complaints(err)}", rc, err)
        points = json.loads(out)["sweep"]["points"]
        futures = [shard(k, points) for k in range(1, points + 1)]
        results = [_text(f.result()) for f in futures]
    finally:
        if own:
            executor.shutdown()
    failed = [(k, r) for k, r in enumerate(results) if r[0] != 0]
    written = [r[1] for r in results if r[1]]
    if not failed:
        return SweepReport(merge(written))
    report = SweepReport(merge(written)) if written else None
    rc = failed[0][1][0]  # as pkv-replay: the exit code of the first failure
    messages = " / ".join(_complaints(r[2]) for _, r in failed)
    raise SweepError(f"sweep: {len(failed)} of {points} points failed (exit {rc}): {messages}",
                     rc, "".join(r[2] for _, r in failed), report)

# SPDX-License-Identifier: MIT
"""Replay from Python: run a trace through KV policies and get the report as a dict
(the same document, key for key, as ``pkv-replay --json``), or a pandas DataFrame."""
import json
import os

import numpy as np

from . import _core, _testbed


class ReplayReport(dict):
    """The replay report: ``{"trace": {...}, "config": {...}, "runs": [...]}`` with one
    run per policy, in the order asked. ``report["paged"]`` is the run of that policy;
    ``to_frame()`` gives one row per policy with flattened columns
    (``memory.waste_frac``, ``latency.step_p99_ms``, ...)."""

    def __getitem__(self, key):
        if key in ("trace", "config", "runs") or not isinstance(key, str):
            return dict.__getitem__(self, key)
        for run in dict.__getitem__(self, "runs"):
            if run["policy"] == key:
                return run
        raise KeyError(key)

    @property
    def policies(self):
        return [run["policy"] for run in self["runs"]]

    def groups(self, policy):
        """Per KV cache group memory of ``policy``'s run (a model with groups, e.g.
        gemma-3-27b): one dict per group with kind, layers, window, bytes_per_token,
        needed_frac, held_frac, tokens_held_mean, peak_held_bytes, blocks_released and
        cached_tokens. [] for a uniform model."""
        return [dict(g) for g in self[policy]["memory"].get("groups", [])]

    def rows(self):
        """One flat dict per run: nested keys joined with '.'."""
        return _rows(self["runs"])

    def to_frame(self):
        """A pandas DataFrame indexed by policy (needs pandas)."""
        try:
            import pandas as pd
        except ImportError as e:  # pragma: no cover - depends on the environment
            raise ImportError("ReplayReport.to_frame needs pandas (pip install pandas); "
                              "report.rows() gives the same rows as dicts") from e
        return pd.DataFrame(self.rows()).set_index("policy")


def _rows(runs):
    """One flat dict per run: nested keys joined with '.' (point.policy, ...)."""
    out = []
    for run in runs:
        row = {}
        _flatten(run, "", row)
        out.append(row)
    return out


def _flatten(d, prefix, out):
    for k, v in d.items():
        if isinstance(v, dict):
            _flatten(v, prefix + k + ".", out)
        else:
            out[prefix + k] = v


def replay(trace, policies="paged", *, frame=False, **params):
    """Replay ``trace`` (a Trace or a path for load_trace) through ``policies``
    ("all", one name, or a list of names from POLICIES) and return a ReplayReport
    (a dict), or its DataFrame with ``frame=True``.

    ``params`` are the fields of pkv_replay_params by name: mode ('sim'|'run'),
    block_size, max_seq_len, preempt ('recompute'|'swap'), max_batch,
    max_tokens_per_step, watermark, model (a MODEL_PRESETS name), gpu (a GPU_PRESETS
    name), kv_mem_bytes (int or "16G"), gpu_util, dtype_bytes, swap_space_bytes,
    batching ('continuous'|'static'), chunked_prefill, load_scale, alloc_model (a
    built-in name such as "cuda-boyer" or "none", or a bench_alloc --calibrate file),
    (policies include the KV cache group layouts "hybrid-partition",
    "hybrid-shared-page", "hybrid-lcm" and "hybrid-vmm"; ReplayReport.groups(policy) gives their
    per-group memory)
    alloc_call_us (a constant cost per backend call), prefix_sharing, run_cuda,
    run_threads, seed, validate. The replay runs in C with the GIL released."""
    name = "<trace>"
    if isinstance(trace, (str, bytes, os.PathLike)):
        name = os.fsdecode(trace)
        trace = _testbed.load_trace(trace)
    elif not isinstance(trace, _testbed.Trace):
        raise TypeError("replay: trace must be a pagedkv.Trace or a path, not "
                        + type(trace).__name__)
    if policies == "all":
        policies = list(_testbed.POLICIES)
    elif isinstance(policies, str):
        policies = [policies]
    report = ReplayReport(json.loads(_testbed._replay_json(trace, list(policies), params, name)))
    return report.to_frame() if frame else report


def make_trace(arrival_s, prompt_tokens, output_tokens, n=1, prefix_group=-1,
               prefix_tokens=0, request_id=None):
    """A Trace from columns (array-likes of one length, or scalars broadcast to it),
    validated as the loaders validate files (pagedkv.FormatError names the bad row)."""
    arrival_s = np.asarray(arrival_s, dtype=np.float64)
    if arrival_s.ndim != 1:
        raise _core.InvalidArgument("make_trace: arrival_s must be 1-D")
    count = arrival_s.shape[0]
    rows = np.zeros(count, dtype=_testbed.TRACE_DTYPE)
    rows["arrival_s"] = arrival_s
    columns = dict(prompt_tokens=prompt_tokens, output_tokens=output_tokens, n=n,
                   prefix_group=prefix_group, prefix_tokens=prefix_tokens,
                   request_id=np.arange(count) if request_id is None else request_id)
    for key, value in columns.items():
        value = np.asarray(value)
        if value.ndim > 1 or (value.ndim == 1 and value.shape[0] != count):
            raise _core.InvalidArgument(f"make_trace: {key} has shape {value.shape}, "
                                        f"expected ({count},) or a scalar")
        if value.size and not np.issubdtype(value.dtype, np.integer):
            raise _core.InvalidArgument(f"make_trace: {key} must hold integers")
        info = np.iinfo(rows.dtype[key])
        if value.size and (value.min() < info.min or value.max() > info.max):
            raise _core.InvalidArgument(f"make_trace: {key} out of range for "
                                        f"{rows.dtype[key]}")
        rows[key] = value
    return _testbed._make_trace(rows)

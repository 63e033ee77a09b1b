# SPDX-License-Identifier: MIT
"""pagedkv: a paged KV-cache manager for LLM inference, from Python.

The allocator, batch-first (all in C, one call per engine step):

    pool = pagedkv.BlockPool(1024)
    seqs = pagedkv.SeqSet(pool, block_size=16)
    cache = pagedkv.KVCache(pool, num_layers=32, kv_heads=8, head_dim=128)
    kv = cache.numpy()      # [layers, blocks, 2, kv_heads, block_size, head_dim], no copy
    step = seqs.step(ids, counts)   # slot_mapping, block_tables, context_lens, copies

The testbed: ``pagedkv.load_trace(path)``, ``pagedkv.replay(trace, policies=...)``,
``pagedkv.sweep(path, grid, executor)`` (a pkv-replay sweep over any executor); loaded
on first use: the allocator alone needs libc and numpy.

Errors are typed (``OutOfBlocks``, ``InvalidArgument``, ``NotFound``, ...), all
subclasses of ``PagedKVError``, with ``.status``, ``.status_name`` and ``.detail``.
"""
from ._core import (  # noqa: F401
    HAVE_BATCH,
    HAVE_CUDA,
    POOL_MAX_BLOCKS,
    HASH_ALGOS,
    BackendError,
    BlockHasher,
    BlockPool,
    BufferTooSmall,
    Busy,
    Corrupt,
    FileError,
    FormatError,
    HybridKV,
    HybridStep,
    InvalidArgument,
    KVCache,
    KV_EVENT_FIELDS,
    LimitExceeded,
    NoDevice,
    NotFound,
    OutOfBlocks,
    OutOfMemory,
    PagedKVError,
    PrefixCache,
    PrefixPool,
    Released,
    SeqSet,
    StepResult,
    Unsupported,
    __version__,
    status_str,
)

# The testbed (traces, replay) is its own extension module, linked to the full library
# (BLAS, OpenMP): imported on the first use of one of these names (PEP 562), so that
# `import pagedkv` and the allocator load libc and numpy only.
_TESTBED = {
    "Trace": "_testbed", "load_trace": "_testbed", "parse_trace": "_testbed",
    "generate_trace": "_testbed", "TRACE_DTYPE": "_testbed", "POLICIES": "_testbed",
    "MODEL_PRESETS": "_testbed", "GPU_PRESETS": "_testbed", "HybridVMM": "_testbed",
    "replay": "_report", "make_trace": "_report", "ReplayReport": "_report",
    "sweep": "_sweep", "SweepReport": "_sweep", "SweepError": "_sweep",
}


def __getattr__(name):
    module = _TESTBED.get(name)
    if module is None:
        raise AttributeError(f"module 'pagedkv' has no attribute '{name}'")
    import importlib

    value = getattr(importlib.import_module("." + module, __name__), name)
    globals()[name] = value  # later look-ups skip this function
    return value


def __dir__():
    return sorted(set(globals()) | set(_TESTBED))


__all__ = [
    "BlockPool", "SeqSet", "PrefixCache", "KVCache", "StepResult", "HybridKV", "HybridVMM", "HybridStep", "Trace",
    "load_trace", "parse_trace", "make_trace", "generate_trace", "replay", "ReplayReport",
    "sweep", "SweepReport", "SweepError",
    "PagedKVError", "InvalidArgument", "OutOfBlocks", "OutOfMemory", "NotFound",
    "Unsupported", "NoDevice", "BackendError", "Corrupt", "BufferTooSmall", "FileError",
    "FormatError", "Busy", "LimitExceeded", "Released", "status_str", "POLICIES", "MODEL_PRESETS", "GPU_PRESETS",
    "TRACE_DTYPE", "HAVE_BATCH", "HAVE_CUDA", "POOL_MAX_BLOCKS",
]

# SPDX-License-Identifier: MIT
"""pagedkv: a paged KV-cache manager for LLM inference, from Python.

The allocator, batch-first (all in C, one call per engine step):

    pool = pagedkv.BlockPool(1024)
    seqs = pagedkv.SeqSet(pool, block_size=16)
    cache = pagedkv.KVCache(pool, num_layers=32, kv_heads=8, head_dim=128)
    kv = cache.numpy()      # [layers, blocks, 2, kv_heads, block_size, head_dim], no copy
    step = seqs.step(ids, counts)   # slot_mapping, block_tables, context_lens, copies

The testbed: ``pagedkv.load_trace(path)``, ``pagedkv.replay(trace, policies=...)``,
``pagedkv.sweep(path, grid, executor)`` (a pkv-replay sweep over any executor).

Errors are typed (``OutOfBlocks``, ``InvalidArgument``, ``NotFound``, ...), all
subclasses of ``PagedKVError``, with ``.status``, ``.status_name`` and ``.detail``.
"""
from ._core import (  # noqa: F401
    GPU_PRESETS,
    HAVE_BATCH,
    HAVE_CUDA,
    MODEL_PRESETS,
    POLICIES,
    POOL_MAX_BLOCKS,
    TRACE_DTYPE,
    HASH_ALGOS,
    BackendError,
    BlockHasher,
    BlockPool,
    BufferTooSmall,
    Busy,
    Corrupt,
    FileError,
    FormatError,
    InvalidArgument,
    KVCache,
    LimitExceeded,
    NoDevice,
    NotFound,
    OutOfBlocks,
    OutOfMemory,
    PagedKVError,
    PrefixCache,
    PrefixPool,
    SeqSet,
    StepResult,
    Trace,
    Unsupported,
    __version__,
    generate_trace,
    load_trace,
    parse_trace,
    status_str,
)
from ._report import ReplayReport, make_trace, replay  # noqa: F401
from .sweep import SweepError, SweepReport, sweep  # noqa: F401  (after .sweep: the function wins)

__all__ = [
    "BlockPool", "SeqSet", "PrefixCache", "KVCache", "StepResult", "Trace",
    "load_trace", "parse_trace", "make_trace", "generate_trace", "replay", "ReplayReport",
    "sweep", "SweepReport", "SweepError",
    "PagedKVError", "InvalidArgument", "OutOfBlocks", "OutOfMemory", "NotFound",
    "Unsupported", "NoDevice", "BackendError", "Corrupt", "BufferTooSmall", "FileError",
    "FormatError", "Busy", "LimitExceeded", "status_str", "POLICIES", "MODEL_PRESETS", "GPU_PRESETS",
    "TRACE_DTYPE", "HAVE_BATCH", "HAVE_CUDA", "POOL_MAX_BLOCKS",
]

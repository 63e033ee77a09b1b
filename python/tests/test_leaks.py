# SPDX-License-Identifier: MIT
"""No leaks: 10^5 create/destroy cycles of every handle keep the interpreter's object
count, the traced Python memory, the process RSS and the pool's state stable."""
import gc
import os
import tracemalloc

import numpy as np

import pagedkv as pkv

CYCLES = 100_000


def rss_bytes():
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def one_cycle(tokens):
    pool = pkv.BlockPool(64)
    s = pkv.SeqSet(pool, 16)
    cache = pkv.PrefixCache(pool, 16)
    cache.attach(s)
    a, _ = cache.create_seq(s, tokens)
    s.append(a, len(tokens))
    cache.insert(s, a, tokens)
    b = s.fork(a)
    s.append(b, 1)
    s.take_copies()
    s.export_padded([a, b])
    s.export_csr([a, b])
    try:
        s.append(a, 10_000)
    except pkv.OutOfBlocks:
        pass
    kv = pkv.KVCache(pool, head_dim=8, dtype="fp32").numpy()
    assert kv.shape[1] == 64


def test_create_destroy_cycles_are_stable():
    tokens = np.arange(40, dtype=np.int32)
    for _ in range(1000):  # warm up caches (numpy, exception types, interned strings)
        one_cycle(tokens)
    gc.collect()
    objects0 = len(gc.get_objects())
    rss0 = rss_bytes()
    tracemalloc.start()
    traced0, _ = tracemalloc.get_traced_memory()
    for _ in range(CYCLES):
        one_cycle(tokens)
    gc.collect()
    traced1, _ = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    objects1 = len(gc.get_objects())
    rss1 = rss_bytes()
    assert abs(objects1 - objects0) < 50, (objects0, objects1)
    assert traced1 - traced0 < 64 << 10, traced1 - traced0
    # one leaked 64-block pool per cycle would be ~25 MB; a leaked arena far more
    assert rss1 - rss0 < 8 << 20, rss1 - rss0


def test_long_lived_pool_state_is_stable():
    pool = pkv.BlockPool(256)
    s = pkv.SeqSet(pool, 16)
    cache = pkv.PrefixCache(pool, 16, 64)
    cache.attach(s)
    tokens = np.arange(100, dtype=np.int32)
    for i in range(CYCLES):
        a, cached = cache.create_seq(s, tokens)
        s.append(a, len(tokens) - cached)
        if i % 7 == 0:
            cache.insert(s, a, tokens)
        b = s.fork(a)
        s.append(b, 3)
        s.take_copies()
        s.free(a)
        s.free(b)
    assert s.live_count == 0
    st = cache.stats()
    assert pool.free_count == pool.capacity - st["entries"] and st["entries"] == 6
    s.validate()
    cache.validate()
    cache.reclaim(pool.capacity)
    assert pool.free_count == pool.capacity
    pool.validate()

# SPDX-License-Identifier: MIT
"""PrefixCache: attach, cached creation, insert, reclaim, stats, errors."""
import numpy as np
import pytest

import pagedkv as pkv


def setup(blocks=16, bs=4, entries=None):
    pool = pkv.BlockPool(blocks)
    s = pkv.SeqSet(pool, bs)
    cache = pkv.PrefixCache(pool, bs) if entries is None else pkv.PrefixCache(pool, bs, entries)
    cache.attach(s)
    return pool, s, cache


def test_hit_after_insert():
    pool, s, cache = setup()
    assert s.prefix_cache is cache and cache.pool is pool and cache.block_size == 4
    prompt = np.arange(10, dtype=np.int32)
    a, cached = cache.create_seq(s, prompt)
    assert cached == 0
    s.append(a, len(prompt))
    assert cache.insert(s, a, prompt) == 2  # two full blocks
    b, cached = cache.create_seq(s, prompt)
    assert cached == 8
    assert (s.block_table(b) == s.block_table(a)[:2]).all()
    s.append(b, len(prompt) - cached)
    st = cache.stats()
    assert st["entries"] == 2 and st["hits"] == 2 and st["inserts"] == 2
    # a prompt of exactly 8 tokens: at most n - 1 cached, so one block
    c, cached = cache.create_seq(s, list(range(8)))
    assert cached == 4
    cache.validate()
    s.validate()
    for i in (a, b, c):
        s.free(i)
    assert cache.stats()["evictable"] == 2
    assert pool.free_count == 14
    cache.reclaim(16)
    assert pool.free_count == 16 and cache.stats()["evictions"] == 2


def test_reclaim_out_of_blocks():
    pool, s, cache = setup(4)
    a = s.create()
    s.append(a, 16)
    with pytest.raises(pkv.OutOfBlocks) as e:
        cache.reclaim(1)
    assert "wanted 1 free blocks" in str(e.value)


def test_match_is_side_effect_free():
    pool, s, cache = setup()
    prompt = np.arange(9, dtype=np.int32)
    a, _ = cache.create_seq(s, prompt)
    s.append(a, 9)
    cache.insert(s, a, prompt)
    if not pkv.HAVE_BATCH:
        with pytest.raises(pkv.Unsupported):
            cache.match(prompt)
        pytest.skip("this build of the core lacks pkv_prefix_cache_match")
    before = cache.stats()
    m = cache.match(prompt)
    assert m["cached_tokens"] == 8 and m["cached_blocks"] == 2
    assert m["new_blocks"] == 1 and m["evictable_hit"] == 0
    assert cache.stats() == before


def test_errors():
    pool, s, cache = setup()
    other = pkv.SeqSet(pool, 4)
    with pytest.raises(pkv.InvalidArgument):
        cache.create_seq(other, [1, 2, 3])  # not attached
    with pytest.raises(pkv.InvalidArgument):
        cache.insert(other, 0, [1])
    with pytest.raises(pkv.Busy):
        pkv.PrefixCache(pool, 4).attach(s)  # already attached elsewhere
    with pytest.raises(pkv.InvalidArgument):
        pkv.PrefixCache(pool, 8).attach(other)  # block size differs
    with pytest.raises(pkv.InvalidArgument):
        cache.attach("set")
    with pytest.raises(pkv.InvalidArgument):
        pkv.PrefixCache(pool, 4, 0)
    e, cached = cache.create_seq(s, [])  # an empty prompt: an empty sequence
    assert cached == 0 and s.length(e) == 0
    a, _ = cache.create_seq(s, [1, 2])
    with pytest.raises(pkv.InvalidArgument):
        cache.insert(s, a, [1, 2])  # longer than the sequence (length 0)
    with pytest.raises(pkv.NotFound):
        cache.insert(s, 12345, [1])
    cache.attach(s)  # attaching twice to the same cache is fine


def test_cache_outlives_attached_sets():
    pool = pkv.BlockPool(8)
    s = pkv.SeqSet(pool, 4)
    cache = pkv.PrefixCache(pool, 4)
    cache.attach(s)
    a, _ = cache.create_seq(s, list(range(5)))
    s.append(a, 5)
    cache.insert(s, a, list(range(5)))
    del cache  # the set keeps it alive
    b, cached = s.prefix_cache.create_seq(s, list(range(5)))
    assert cached == 4
    del s  # set first, then the cache, then the pool: no crash, no leak
    assert pool.free_count == 8


def test_detach():
    pool, s, cache = setup()
    a, _ = cache.create_seq(s, list(range(9)))
    s.append(a, 9)
    cache.insert(s, a, list(range(9)))
    with pytest.raises(pkv.Busy):
        cache.detach(s)  # a still holds cached blocks
    assert s.prefix_cache is cache
    s.free(a)
    cache.detach(s)
    assert s.prefix_cache is None
    with pytest.raises(pkv.NotFound):
        cache.detach(s)
    with pytest.raises(pkv.InvalidArgument):
        cache.create_seq(s, [1, 2])
    other = pkv.PrefixCache(pool, 4)
    other.attach(s)  # free to serve another cache now
    assert s.prefix_cache is other
    assert issubclass(pkv.LimitExceeded, pkv.PagedKVError)

# SPDX-License-Identifier: MIT
"""pagedkv.PrefixPool and pagedkv.BlockHasher: the binding's contract (bad input gets a
typed error naming the problem and changes nothing; events as tuples)."""
import pytest

import pagedkv


def test_bad_arguments_are_named():
    with pytest.raises(pagedkv.InvalidArgument, match="medium"):
        pagedkv.PrefixPool(8, medium="TAPE")
    with pytest.raises(pagedkv.InvalidArgument, match="num_blocks"):
        pagedkv.PrefixPool(1)
    with pytest.raises(pagedkv.InvalidArgument, match="algo"):
        pagedkv.BlockHasher("md5")
    pool = pagedkv.PrefixPool(8)
    with pytest.raises(pagedkv.InvalidArgument, match="bytes"):
        pool.get_cached_block("not bytes")
    with pytest.raises(pagedkv.InvalidArgument, match="1..32 bytes"):
        pool.get_cached_block(b"x" * 33)
    with pytest.raises(pagedkv.OutOfBlocks, match="asked for 8 blocks, 7 free"):
        pool.get_new_blocks(8)
    with pytest.raises(pagedkv.NotFound):
        pool.free_blocks([3])  # never allocated
    a = pool.get_new_blocks(1)
    with pytest.raises(pagedkv.InvalidArgument, match="1 blocks but 2 hashes"):
        pool.cache_blocks(a, [b"h1", b"h2"])
    with pytest.raises(pagedkv.NotFound, match="not in 0..7"):
        pool.refcount(8)
    h = pagedkv.BlockHasher("fnv1a_64")
    with pytest.raises(pagedkv.InvalidArgument, match="needs the parent"):
        h.hash_blocks(list(range(8)), 4, start=4)
    with pytest.raises(pagedkv.InvalidArgument):
        h.hash_blocks(list(range(8)), 4, mm=[(2, 3, b"a"), (3, 1, b"b")])  # overlapping
    pool.validate()


def test_free_blocks_is_all_or_nothing():
    pool = pagedkv.PrefixPool(6)
    a, b = pool.get_new_blocks(2)
    with pytest.raises(pagedkv.NotFound):
        pool.free_blocks([a, a])  # held once, listed twice
    assert pool.refcount(a) == 1 and pool.num_free == 3
    pool.free_blocks([b, a])
    assert pool.free_queue() == [b, a, 3, 4, 5]  # uncached: to the front, in order


def test_hashes_and_parents_are_readable():
    h = pagedkv.BlockHasher("sha256", seed=b"model-v1")
    hs = h.hash_blocks(list(range(12)), 4)
    assert len(hs) == 3 and all(len(x) == 32 for x in hs)
    # incremental: the last block alone, from its parent, is the same hash
    assert h.hash_blocks(list(range(8, 12)), 4, start=8, parent=hs[1]) == [hs[2]]
    assert pagedkv.BlockHasher("sha256", seed=b"model-v2").hash_blocks(list(range(4)), 4) != hs[:1]
    pool = pagedkv.PrefixPool(8, event_capacity=4)
    ids = pool.get_new_blocks(3)
    pool.cache_blocks(ids, hs, tokens=list(range(12)), block_size=4)
    assert pool.block_info(ids[2]) == (1, hs[2], hs[1], 0)
    assert pool.block_info(ids[0])[2] is None
    assert pool.take_events() == [
        ("BlockStored", hs, None, list(range(12)), 4, None, "GPU", 0)]

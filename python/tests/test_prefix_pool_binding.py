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


MEDIA = ("GPU", "CPU", "DISK")


def unpack(packed):
    """take_events_packed's four objects back into take_events' tuples."""
    rec, hb, off, tok = packed
    assert rec.dtype == "int64" and rec.shape[1] == len(pagedkv.KV_EVENT_FIELDS)
    assert off.dtype == "uint32" and tok.dtype == "int32" and off[0] == 0
    col = {f: i for i, f in enumerate(pagedkv.KV_EVENT_FIELDS)}
    o = off.tolist()

    def h(j):
        return hb[o[j]:o[j + 1]]

    out = []
    for r in rec.tolist():
        g = {f: r[i] for f, i in col.items()}
        kind, medium = g["kind"], MEDIA[g["medium"]]
        hashes = [h(g["first_hash"] + k) for k in range(g["num_hashes"])]
        if kind == 1:
            out.append(("BlockStored", hashes, None if g["parent"] < 0 else h(g["parent"]),
                        tok[g["first_token"]:g["first_token"] + g["num_tokens"]].tolist(),
                        g["block_size"], None if g["lora_id"] < 0 else g["lora_id"], medium, g["group"]))
        elif kind == 2:
            out.append(("BlockRemoved", hashes, medium, g["group"]))
        elif kind == 3:
            out.append(("AllBlocksCleared", medium))
        else:
            assert kind == 4
            out.append(("Overflow", g["dropped"]))
    return out


def drive(pool, h):
    """Every kind of event: stored (parent, LoRA, group 1), hashed, lazily and explicitly
    removed, cleared; then more than the buffer holds (Overflow)."""
    a = pool.get_new_blocks(3)
    pool.cache_blocks(a[:2], [b"h0" * 8, b"h1" * 8], parent=b"root", tokens=list(range(8)),
                      block_size=4, lora_id=9, group=1)
    pool.hash_and_cache(h, a[2:], list(range(100, 104)), [b"h1" * 8], 4)
    yield
    pool.free_blocks(a[::-1])
    pool.evict_block(a[2])
    pool.free_blocks(pool.get_new_blocks(pool.num_free))  # the rest evicted lazily
    yield
    pool.reset()
    yield
    for _ in range(3):
        b = pool.get_new_blocks(4)
        pool.hash_and_cache(h, b, list(range(16)), [None] * 4, 4)
        pool.free_blocks(b)
    yield


def test_packed_drain_is_take_events_without_the_tuples():
    h = pagedkv.BlockHasher("fnv1a_64")
    kw = dict(num_groups=2, medium="CPU", event_capacity=8)
    tuples, packed = pagedkv.PrefixPool(10, **kw), pagedkv.PrefixPool(10, **kw)
    seen = set()
    for _ in zip(drive(tuples, h), drive(packed, h)):
        want = tuples.take_events()
        assert want, "every stage emits"
        assert unpack(packed.take_events_packed()) == want
        seen |= {e[0] for e in want}
    assert seen == {"BlockStored", "BlockRemoved", "AllBlocksCleared", "Overflow"}
    empty = packed.take_events_packed()
    assert empty[0].shape == (0, len(pagedkv.KV_EVENT_FIELDS)) and unpack(empty) == []
    packed.validate()


def test_packed_drain_can_leave_token_ids_out():
    pool = pagedkv.PrefixPool(8, event_capacity=8)
    a = pool.get_new_blocks(2)
    pool.cache_blocks(a, [b"x" * 16, b"y" * 16], tokens=(5, 6, 7, 8), block_size=2)
    rec, _, _, tok = pool.take_events_packed(tokens=False)
    assert len(tok) == 0 and rec[0, pagedkv.KV_EVENT_FIELDS.index("num_tokens")] == 0


def test_events_without_token_ids():
    """The cheaper event mode: BlockStored without token ids (it used to be refused)."""
    h = pagedkv.BlockHasher("fnv1a_64")
    pool = pagedkv.PrefixPool(8, event_capacity=8)
    a, b = pool.get_new_blocks(2)
    pool.cache_blocks([a], [b"x" * 16], block_size=4)  # no tokens
    got = pool.hash_and_cache(h, [b], list(range(4)), [b"x" * 16], 4, event_tokens=False)
    assert pool.take_events() == [("BlockStored", [b"x" * 16], None, [], 4, None, "GPU", 0),
                                  ("BlockStored", got, b"x" * 16, [], 4, None, "GPU", 0)]
    assert pool.find_prefix([b"x" * 16] + got) == [a, b]
    pool.validate()


def test_token_lists_are_checked():
    pool = pagedkv.PrefixPool(8, event_capacity=8)
    a = pool.get_new_blocks(1)
    with pytest.raises(pagedkv.InvalidArgument, match="token 1 is not an int32"):
        pool.cache_blocks(a, [b"x" * 16], tokens=[1, 2 ** 40], block_size=2)
    with pytest.raises(TypeError):
        pool.cache_blocks(a, [b"x" * 16], tokens=[1, "2"], block_size=2)
    with pytest.raises(pagedkv.InvalidArgument, match="3 tokens for 1 blocks of 2"):
        pool.cache_blocks(a, [b"x" * 16], tokens=[1, 2, 3], block_size=2)
    assert pool.block_hash(a[0]) is None and pool.take_events() == []


def test_find_hybrid_prefix_follows_each_group_rule():
    # Group 0 full attention, group 1 sliding window 4, block size 2, 5 request
    # blocks; group 1 lost its first two blocks: the hit is 8 tokens, group 1 reuses
    # blocks 2 and 3 and pads the rest with the null block 0.
    pool = pagedkv.PrefixPool(16, num_groups=2)
    h0 = [b"f%d" % i for i in range(5)]
    h1 = [b"s%d" % i for i in range(5)]
    full = pool.get_new_blocks(4)
    pool.cache_blocks(full, h0[:4], group=0)
    win = pool.get_new_blocks(3)
    pool.cache_blocks(win, h1[2:], group=1, parent=h1[1])
    hit, ids = pool.find_hybrid_prefix([("full", 0, 2, h0), ("sliding", 4, 2, h1)], max_tokens=9)
    assert hit == 8
    assert ids[0] == full
    assert ids[1] == [0, 0, win[0], win[1]]
    assert pool.find_prefix(h1, group=1) == []  # a plain chain lookup finds nothing
    with pytest.raises(pagedkv.InvalidArgument, match="kind 'swa'"):
        pool.find_hybrid_prefix([("swa", 4, 2, h1)], max_tokens=9)
    with pytest.raises(pagedkv.InvalidArgument, match="3 groups: the pool has 2"):
        pool.find_hybrid_prefix([("full", 0, 2, h0)] * 3, max_tokens=9)
    with pytest.raises(pagedkv.InvalidArgument, match="block size or window of 0"):
        pool.find_hybrid_prefix([("sliding", 0, 2, h1)], max_tokens=9)

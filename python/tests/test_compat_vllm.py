# SPDX-License-Identifier: MIT
"""vLLM v1's prefix-caching scenarios against pagedkv.compat.vllm.

Ports of the facts (block ids, hits, eviction order, hashes, events) of vLLM's
tests/v1/core/test_prefix_caching.py and test_kv_cache_utils.py, written anew for
our adapter. Scenarios that need what the adapter does not model (hybrid and
sliding-window groups, EAGLE hashes, standalone KVCacheBlock objects, the free
queue's internal links, vLLM's metrics aggregator) are listed in docs/DESIGN.md.
"""
import pytest

import pagedkv
from pagedkv.compat import vllm as V

BS = 16


@pytest.fixture(params=["sha256", "c_sha256", "c_xxh3"])
def hash_fn(request):
    if request.param == "sha256":
        V.init_none_hash(V.sha256)
        return V.sha256
    algo = "sha256" if request.param == "c_sha256" else "xxh3_128"
    if algo not in pagedkv.HASH_ALGOS:
        pytest.skip(f"{algo} not built")
    return pagedkv.BlockHasher(algo, seed=b"test")


def make_request(rid, tokens, hash_fn, block_size=BS, **kw):
    return V.Request(rid, tokens, V.get_request_block_hasher(block_size, hash_fn), **kw)


def manager(num_blocks, block_size=BS, **kw):
    return V.KVCacheManager(num_blocks=num_blocks, block_size=block_size, **kw)


def queue_ids(m):
    return [b.block_id for b in m.block_pool.free_block_queue.get_all_free_blocks()]


def admit(m, req, num_tokens=None):
    computed, num_computed, _ = m.get_computed_blocks(req)
    n = (num_tokens if num_tokens is not None else req.num_tokens) - num_computed
    return computed, num_computed, m.allocate_slots(req, n, num_computed, computed)


# ------------------------------------------------------------ test_prefix_caching


def test_prefill(hash_fn):
    m = manager(11)
    common = [i for i in range(3) for _ in range(16)]
    all0 = common + [3] * 7
    req0 = make_request("0", all0, hash_fn)
    computed, n, blocks = admit(m, req0)
    assert len(req0.block_hashes) == 3
    assert not computed.blocks[0] and n == 0
    assert blocks.get_block_ids() == ([1, 2, 3, 4],)
    if hash_fn is V.sha256:  # the chain is vLLM's hash_block_tokens
        parent = None
        for bid in (1, 2, 3):
            h = V.hash_block_tokens(hash_fn, parent, tuple(all0[(bid - 1) * 16:bid * 16]))
            key = m.block_pool.blocks[bid].block_hash
            assert V.get_block_hash(key) == h and V.get_group_id(key) == 0
            parent = h
    for bid in (1, 2, 3):
        assert m.block_pool.blocks[bid].ref_cnt == 1
    assert m.block_pool.blocks[4].block_hash is None
    assert m.block_pool.blocks[4].ref_cnt == 1

    req1 = make_request("1", common + [3] * 5, hash_fn)
    computed, n, blocks = admit(m, req1)
    assert computed.get_block_ids() == ([1, 2, 3],) and n == 48
    assert blocks.get_block_ids() == ([5],)
    assert all(b.ref_cnt == 2 for b in computed.blocks[0])
    assert m.block_pool.free_block_queue.num_free_blocks == 5

    m.free(req0)
    m.free(req1)
    assert m.block_pool.free_block_queue.num_free_blocks == 10
    # uncached partial blocks first (5, 4), then never used, then the prefix tail first
    assert queue_ids(m) == [5, 4, 6, 7, 8, 9, 10, 3, 2, 1]

    req2 = make_request("2", common + [3] * 6, hash_fn)
    computed, n, blocks = admit(m, req2)
    assert computed.get_block_ids() == ([1, 2, 3],) and n == 48
    assert blocks.get_block_ids() == ([5],)
    assert m.block_pool.free_block_queue.num_free_blocks == 6
    assert all(b.ref_cnt == 0 for b in m.block_pool.free_block_queue.get_all_free_blocks())
    m.free(req2)

    req3 = make_request("3", [99] * (16 * 10), hash_fn)
    computed, n, blocks = admit(m, req3)
    assert not computed.blocks[0] and n == 0
    assert blocks.get_block_ids() == ([5, 4, 6, 7, 8, 9, 10, 3, 2, 1],)
    assert m.block_pool.free_block_queue.num_free_blocks == 0


def test_prefill_plp(hash_fn):
    """Prompt logprobs skip the cache read: their blocks duplicate cached hashes."""
    m = manager(11)
    common = [i for i in range(3) for _ in range(16)]
    req0 = make_request("0", common + [3] * 7, hash_fn, prompt_logprobs=5)
    computed, n, blocks = admit(m, req0)
    assert n == 0 and blocks.get_block_ids() == ([1, 2, 3, 4],)
    req1 = make_request("1", common + [3] * 5, hash_fn)
    computed, n, blocks = admit(m, req1)
    assert computed.get_block_ids() == ([1, 2, 3],) and blocks.get_block_ids() == ([5],)
    m.free(req0)
    m.free(req1)
    req2 = make_request("2", common + [3] * 7, hash_fn, prompt_logprobs=5)
    computed, n, blocks = admit(m, req2)
    assert n == 0 and not computed.blocks[0]
    assert blocks.get_block_ids() == ([5, 4, 6, 7],)
    # Blocks 5, 4, 6 now carry the hashes of 1, 2, 3 too; lookups keep the earliest.
    for new, old in zip((5, 4, 6), (1, 2, 3)):
        assert m.block_pool.blocks[new].block_hash == m.block_pool.blocks[old].block_hash
        key = m.block_pool.blocks[old].block_hash
        assert m.block_pool.cached_block_hash_to_block.get_one_block(key).block_id == old
    assert [b.ref_cnt for b in m.block_pool.blocks[1:4]] == [0, 0, 0]


def test_decode(hash_fn):
    m = manager(11)
    common = [i for i in range(3) for _ in range(16)]
    req0 = make_request("0", common + [3] * 7, hash_fn)
    _, _, blocks = admit(m, req0)
    assert blocks.get_block_ids() == ([1, 2, 3, 4],)
    req0.num_computed_tokens = 55
    for _ in range(4):
        req0.append_output_token_ids(8)
    new = m.allocate_slots(req0, 4)
    assert new is not None and len(new.blocks[0]) == 0
    assert m.req_to_blocks["0"][-1].block_hash is None  # 59 tokens: block 4 not full
    req0.num_computed_tokens = 59
    for _ in range(5 + 10):
        req0.append_output_token_ids(7)
    new = m.allocate_slots(req0, 15)
    assert new is not None and len(new.blocks[0]) == 1
    assert m.req_to_blocks["0"][-2].block_hash is not None  # filled by decoding: cached
    assert m.req_to_blocks["0"][-1].block_hash is None
    # vLLM's path to the same list
    assert m.coordinator.single_type_managers[0].req_to_blocks["0"] is m.req_to_blocks["0"]


def test_evict(hash_fn):
    m = manager(11)
    last = 5 * 16 + 7
    req0 = make_request("0", list(range(last)), hash_fn)
    _, _, blocks = admit(m, req0)
    assert len(blocks.blocks[0]) == 6  # 5 full + 1 partial
    req1 = make_request("1", list(range(last, last + 3 * 16)), hash_fn)
    _, _, blocks = admit(m, req1)
    assert len(blocks.blocks[0]) == 3
    assert m.block_pool.free_block_queue.num_free_blocks == 1
    m.free(req0)
    m.free(req1)
    assert m.block_pool.free_block_queue.num_free_blocks == 10
    assert queue_ids(m) == [6, 10, 5, 4, 3, 2, 1, 9, 8, 7]
    # Touch the first two blocks.
    req2 = make_request("2", list(range(2 * 16 + 3)), hash_fn)
    computed, n, blocks = admit(m, req2)
    assert computed.get_block_ids() == ([1, 2],) and n == 32
    assert blocks.get_block_ids() == ([6],)
    assert m.block_pool.free_block_queue.num_free_blocks == 7


def test_hash_block_correct_reuse(hash_fn):
    """A cached block handed out again loses its hash (lazy eviction)."""
    m = manager(2)  # one usable block
    req = make_request("0", list(range(16)), hash_fn)
    _, _, blocks = admit(m, req)
    assert blocks.get_block_ids() == ([1],)
    assert m.block_pool.blocks[1].block_hash is not None
    m.free(req)
    req = make_request("1", list(range(15)), hash_fn)
    _, _, blocks = admit(m, req)
    assert blocks.get_block_ids() == ([1],)
    assert m.block_pool.blocks[1].block_hash is None


def test_computed_blocks_not_evicted(hash_fn):
    m = manager(3)
    req0 = make_request("0", list(range(16)), hash_fn)
    _, _, blocks = admit(m, req0)
    assert blocks.get_block_ids() == ([1],)
    req1 = make_request("1", list(range(16, 32)), hash_fn)
    _, _, blocks = admit(m, req1)
    assert blocks.get_block_ids() == ([2],)
    m.free(req0)
    m.free(req1)
    req2 = make_request("2", list(range(16 * 2)), hash_fn)
    computed, n, blocks = admit(m, req2)
    assert computed.get_block_ids() == ([1],) and n == 16
    assert blocks.get_block_ids() == ([2],)  # block 1 was hit, not evicted


def test_basic_prefix_caching_disabled(hash_fn):
    m = manager(5, block_size=4, enable_caching=False)
    req1 = make_request("1", list(range(10)), hash_fn, block_size=4)
    computed, n, blocks = admit(m, req1)
    assert not computed.blocks[0] and n == 0
    assert blocks.get_block_ids() == ([1, 2, 3],)
    m.free(req1)
    req2 = make_request("2", list(range(16)), hash_fn, block_size=4)
    computed, n, blocks = admit(m, req2)
    assert not computed.blocks[0] and n == 0
    assert blocks.get_block_ids() == ([4, 3, 2, 1],)  # caching off: freed to the back
    req3 = make_request("3", list(range(4)), hash_fn, block_size=4)
    _, _, blocks = admit(m, req3)
    assert blocks is None  # no room


def test_cache_blocks(hash_fn):
    pool = V.BlockPool(5, enable_caching=True)
    req = make_request("0", list(range(14)), hash_fn, block_size=4)
    blocks = pool.get_new_blocks(2)
    pool.cache_full_blocks(req, blocks, 0, 2, 4, 0)
    assert len(pool.cached_block_hash_to_block) == 2
    assert all(b.block_hash is not None for b in blocks)
    blocks += pool.get_new_blocks(1)
    pool.cache_full_blocks(req, blocks, 2, 3, 4, 0)
    assert len(pool.cached_block_hash_to_block) == 3
    assert blocks[2].block_hash is not None
    assert blocks[2].parent_block_hash == V.get_block_hash(blocks[1].block_hash)


def test_mm_prefix_caching():
    V.init_none_hash(V.sha256)
    m = manager(50)
    common = [i for i in range(3) for _ in range(16)]
    tokens = common + [3] * 5 + [4] * 10  # 63 tokens
    mm = [V.MultiModalFeatureSpec("aaa", V.PlaceholderRange(11, 10)),
          V.MultiModalFeatureSpec("bbb", V.PlaceholderRange(30, 18))]
    req0 = make_request("0", tokens, V.sha256, mm_features=mm)
    computed, n, blocks = admit(m, req0)
    assert n == 0 and blocks.get_block_ids() == ([1, 2, 3, 4],)
    h = req0.block_hashes
    assert len(h) == 3
    assert h[0] == V.hash_block_tokens(V.sha256, None, tokens[:16], ("aaa",))
    assert h[1] == V.hash_block_tokens(V.sha256, h[0], tokens[16:32], ("aaa", "bbb"))
    assert h[2] == V.hash_block_tokens(V.sha256, h[1], tokens[32:48], ("bbb",))
    # Decoding fills block 4. vLLM hashes it starting from the last image, whose end
    # (48) is the block's start, and counts it: so does the adapter.
    req0.num_computed_tokens = 63
    req0.append_output_token_ids([8])
    assert m.allocate_slots(req0, 1) is not None
    assert len(req0.block_hashes) == 4
    assert req0.block_hashes[3] == V.hash_block_tokens(V.sha256, h[2], req0.all_token_ids[48:64],
                                                       ("bbb",))
    # Same tokens, another image: no hit.
    mm2 = [V.MultiModalFeatureSpec("ccc", V.PlaceholderRange(11, 10)),
           V.MultiModalFeatureSpec("ddd", V.PlaceholderRange(30, 18))]
    req1 = make_request("1", tokens, V.sha256, mm_features=mm2)
    computed, n, _ = admit(m, req1)
    assert n == 0 and not computed.blocks[0]


@pytest.mark.parametrize("c_hasher", [False, True])
def test_cache_key_salting(c_hasher):
    V.init_none_hash(V.sha256)
    hash_fn = pagedkv.BlockHasher("sha256") if c_hasher else V.sha256
    m = manager(10)
    tokens = [i for i in range(3) for _ in range(16)] + [3] * 7
    req0 = make_request("0", tokens, hash_fn, cache_salt="salt1")
    computed, n, blocks = admit(m, req0)
    assert n == 0 and blocks.get_block_ids() == ([1, 2, 3, 4],)
    h = req0.block_hashes
    if not c_hasher:
        assert h[0] == V.hash_block_tokens(V.sha256, None, tokens[:16], ("salt1",))
        assert h[1] == V.hash_block_tokens(V.sha256, h[0], tokens[16:32], None)
    # Another salt, or none: the first block differs, so nothing hits.
    for salt in ("salt2", None):
        req = make_request("x", tokens, hash_fn, cache_salt=salt)
        assert req.block_hashes[0] != h[0]
        computed, n, _ = m.get_computed_blocks(req)
        assert n == 0
    req1 = make_request("1", tokens, hash_fn, cache_salt="salt1")
    computed, n, _ = m.get_computed_blocks(req1)
    assert n == 48 and computed.get_block_ids() == ([1, 2, 3],)


def test_lora_changes_every_hash(hash_fn):
    tokens = list(range(48))
    plain = make_request("0", tokens, hash_fn).block_hashes
    lora = make_request("1", tokens, hash_fn, lora_request=V.LoRARequest("a", 1)).block_hashes
    assert all(a != b for a, b in zip(plain, lora))


def test_prefill_not_enough_free_blocks_with_computed_blocks(hash_fn):
    """Hit blocks that sit in the free queue count against the free blocks."""
    m = manager(11)
    common = [i for i in range(3) for _ in range(16)]
    req0 = make_request("0", common, hash_fn)
    admit(m, req0)
    assert m.block_pool.free_block_queue.num_free_blocks == 7
    m.free(req0)
    # 3 cached blocks in the queue; a request hitting them and needing 8 more has 10 free
    # blocks in view but only 7 once its hits leave the queue.
    req1 = make_request("1", common + [9] * (8 * 16), hash_fn)
    computed, n, _ = m.get_computed_blocks(req1)
    assert n == 48
    assert m.allocate_slots(req1, req1.num_tokens - n, n, computed) is None
    assert m.block_pool.free_block_queue.num_free_blocks == 10  # nothing taken
    req2 = make_request("2", common + [9] * (7 * 16), hash_fn)
    computed, n, _ = m.get_computed_blocks(req2)
    assert m.allocate_slots(req2, req2.num_tokens - n, n, computed) is not None
    assert m.block_pool.free_block_queue.num_free_blocks == 0


def test_reset_prefix_cache(hash_fn):
    m = manager(11, enable_kv_cache_events=True)
    req0 = make_request("0", list(range(48)), hash_fn)
    admit(m, req0)
    assert not m.reset_prefix_cache()  # blocks in use
    assert m.block_pool.blocks[1].block_hash is not None
    m.free(req0)
    assert m.reset_prefix_cache()
    assert all(b.block_hash is None for b in m.block_pool.blocks)
    events = m.take_events()
    assert isinstance(events[-1], V.AllBlocksCleared)
    computed, n, _ = m.get_computed_blocks(make_request("1", list(range(48)), hash_fn))
    assert n == 0


def test_prefix_cache_stats():
    V.init_none_hash(V.sha256)
    m = manager(11, log_stats=True)
    req0 = make_request("0", list(range(40)), V.sha256)
    admit(m, req0)
    req1 = make_request("1", list(range(40)), V.sha256)
    admit(m, req1)
    req2 = make_request("2", list(range(10)), V.sha256, prompt_logprobs=1)  # not counted
    admit(m, req2)
    s = m.make_prefix_cache_stats()
    assert (s.requests, s.queries, s.hits) == (2, 80, 32)
    s = m.make_prefix_cache_stats()
    assert (s.requests, s.queries, s.hits) == (0, 0, 0)  # restarted each step


def test_kv_cache_events(hash_fn):
    m = manager(4, enable_kv_cache_events=True)
    tokens = list(range(16 * 2 + 1))
    req = make_request("0", tokens, hash_fn, lora_request=V.LoRARequest("l", 7))
    admit(m, req)
    events = m.take_events()
    assert len(events) == 1 and isinstance(events[0], V.BlockStored)
    ev = events[0]
    assert ev.block_hashes == req.block_hashes[:2]
    assert ev.parent_block_hash is None
    assert ev.token_ids == tokens[:32]
    assert ev.block_size == 16 and ev.lora_id == 7 and ev.medium == "GPU"
    assert m.take_events() == []
    m.free(req)
    req2 = make_request("1", [99] * 33, hash_fn)
    admit(m, req2)  # evicts both cached blocks (the tail first), stores its own two
    events = m.take_events()
    removed = [e for e in events if isinstance(e, V.BlockRemoved)]
    assert [e.block_hashes for e in removed] == [[req.block_hashes[1]], [req.block_hashes[0]]]
    assert isinstance(events[-1], V.BlockStored)


def test_kv_cache_events_without_token_ids(hash_fn):
    """event_token_ids=False: BlockStored as vLLM's, token_ids left out."""
    pool = V.BlockPool(8, enable_kv_cache_events=True, event_token_ids=False)
    req = make_request("0", list(range(16 * 2)), hash_fn)
    blocks = pool.get_new_blocks(2)
    pool.cache_full_blocks(req, blocks, 0, 1, 16, 0)
    pool.cache_full_blocks(req, blocks, 1, 2, 16, 0)
    ev = pool.take_events()
    assert [e.token_ids for e in ev] == [[], []]
    assert [e.block_hashes for e in ev] == [req.block_hashes[:1], req.block_hashes[1:2]]
    assert ev[1].parent_block_hash == req.block_hashes[0] and ev[1].block_size == 16
    assert pool.get_cached_block(req.block_hashes[1], [0]) == [blocks[1]]


def test_kv_events_overflow_is_reported(hash_fn):
    pool = V.BlockPool(20, enable_kv_cache_events=True, event_capacity=2)
    req = make_request("0", list(range(16 * 4)), hash_fn)
    blocks = pool.get_new_blocks(4)
    for i in range(4):
        pool.cache_full_blocks(req, blocks, i, i + 1, 16, 0)
    events = pool.take_events()
    assert [type(e).__name__ for e in events] == ["BlockStored", "BlockStored", "EventsDropped"]
    assert events[-1].dropped == 2
    assert events[1].parent_block_hash == req.block_hashes[0]


def test_block_pool_basics():
    pool = V.BlockPool(10, enable_caching=True)
    assert pool.get_num_free_blocks() == 9  # the null block is never free
    assert pool.null_block.block_id == 0 and pool.null_block.is_null
    assert pool.get_usage() == 0.0
    blocks = pool.get_new_blocks(3)
    assert [b.block_id for b in blocks] == [1, 2, 3]
    assert pool.get_usage() == pytest.approx(3 / 9)
    with pytest.raises(ValueError):
        pool.get_new_blocks(7)
    pool.touch([blocks])  # one list per group, as the manager passes it
    assert [b.ref_cnt for b in blocks] == [2, 2, 2]
    pool.free_blocks(blocks)
    pool.free_blocks([pool.null_block, *blocks])  # the null block is skipped
    assert pool.get_num_free_blocks() == 9
    # Uncached blocks freed go to the front, in the order given.
    assert [b.block_id for b in pool.free_block_queue.get_all_free_blocks()] == [
        1, 2, 3, 4, 5, 6, 7, 8, 9]
    assert not pool.reset_prefix_cache() is False


def test_evict_blocks_drops_hash_only():
    V.init_none_hash(V.sha256)
    pool = V.BlockPool(6)
    req = make_request("0", list(range(32)), V.sha256)
    blocks = pool.get_new_blocks(2)
    pool.cache_full_blocks(req, blocks, 0, 2, 16, 0)
    pool.evict_blocks({blocks[0].block_id})
    assert blocks[0].block_hash is None and blocks[0].ref_cnt == 1
    assert pool.get_cached_block(req.block_hashes[0], [0]) is None
    assert pool.get_cached_block(req.block_hashes[1], [0]) == [blocks[1]]
    with pytest.raises(ValueError):
        pool.evict_blocks({99})


# ------------------------------------------------------------ test_kv_cache_utils


def test_none_hash(monkeypatch):
    monkeypatch.delenv("PYTHONHASHSEED", raising=False)
    V.init_none_hash(V.sha256)
    assert isinstance(V.NONE_HASH, bytes) and V.NONE_HASH != b""
    monkeypatch.setenv("PYTHONHASHSEED", "python hash seed")
    V.init_none_hash(V.sha256)
    assert V.NONE_HASH == V.sha256("python hash seed")


def test_free_queue_order_of_a_fresh_pool_and_popleft():
    pool = V.BlockPool(6)
    q = pool.free_block_queue
    assert q.num_free_blocks == 5
    assert [b.block_id for b in q.get_all_free_blocks()] == [1, 2, 3, 4, 5]
    first = pool.get_new_blocks(1)[0]
    assert first.block_id == 1 and q.num_free_blocks == 4
    # remove from the middle (a hit on a queued cached block) and append back
    V.init_none_hash(V.sha256)
    req = make_request("0", list(range(16)), V.sha256)
    pool.cache_full_blocks(req, [first], 0, 1, 16, 0)
    pool.free_blocks([first])
    assert [b.block_id for b in q.get_all_free_blocks()] == [2, 3, 4, 5, 1]
    pool.touch([first])
    assert [b.block_id for b in q.get_all_free_blocks()] == [2, 3, 4, 5]


def test_generate_block_hash_extra_keys():
    req = V.Request("0", list(range(20)), mm_features=[
        V.MultiModalFeatureSpec("hash1", V.PlaceholderRange(0, 5)),
        V.MultiModalFeatureSpec("hash2", V.PlaceholderRange(10, 5))])
    assert V.generate_block_hash_extra_keys(req, 0, 5, 0) == (("hash1",), 1)
    assert V.generate_block_hash_extra_keys(req, 3, 8, 0) == (("hash1",), 1)
    assert V.generate_block_hash_extra_keys(req, 6, 10, 0) == (None, 1)
    assert V.generate_block_hash_extra_keys(req, 0, 15, 0) == (("hash1", "hash2"), 2)


def test_generate_block_hash_extra_keys_no_mm_and_salt_and_lora():
    req = V.Request("0", list(range(6)))
    assert V.generate_block_hash_extra_keys(req, 0, 2, 5) == (None, 5)
    req = V.Request("0", list(range(20)), cache_salt="salt")
    assert V.generate_block_hash_extra_keys(req, 0, 10, 0) == (("salt",), 0)
    assert V.generate_block_hash_extra_keys(req, 10, 20, 0) == (None, 0)
    req = V.Request("0", list(range(20)), lora_request=V.LoRARequest("lora", 1), cache_salt="s")
    assert V.generate_block_hash_extra_keys(req, 0, 10, 0) == (("lora", "s"), 0)


def test_hash_block_tokens():
    V.init_none_hash(V.sha256)
    parent, tokens, extra = b"parent", (1, 2, 3), ("key1",)
    assert V.hash_block_tokens(V.sha256, parent, tokens, extra) == V.sha256((parent, tokens, extra))
    assert V.hash_block_tokens(V.sha256, None, tokens) == V.sha256((V.NONE_HASH, tokens, None))


@pytest.mark.parametrize("c_hasher", [False, True])
def test_request_block_hasher_and_different_mm_input(c_hasher):
    V.init_none_hash(V.sha256)
    fn = pagedkv.BlockHasher("sha256") if c_hasher else V.sha256
    feats = lambda a, b: [V.MultiModalFeatureSpec(a, V.PlaceholderRange(0, 3)),  # noqa: E731
                          V.MultiModalFeatureSpec(b, V.PlaceholderRange(3, 3))]
    r1 = make_request("1", list(range(6)), fn, block_size=3, mm_features=feats("h1", "h2"))
    r2 = make_request("2", list(range(6)), fn, block_size=3, mm_features=feats("h3", "h2"))
    assert len(r1.block_hashes) == 2
    assert r1.block_hashes[0] != r2.block_hashes[0]
    assert r1.block_hashes[1] != r2.block_hashes[1]  # chained through block 0
    if not c_hasher:
        assert r1.block_hashes[0] == V.hash_block_tokens(V.sha256, None, (0, 1, 2), ("h1",))
    # Incremental: appending tokens hashes the new full blocks only.
    r1.append_output_token_ids([7, 8])
    assert len(r1.block_hashes) == 2
    r1.append_output_token_ids(9)
    assert len(r1.block_hashes) == 3


def test_hash_request_tokens_no_mm_inputs():
    V.init_none_hash(V.sha256)
    req = make_request("0", list(range(6)), V.sha256, block_size=3)
    assert req.block_hashes == [
        V.hash_block_tokens(V.sha256, None, (0, 1, 2), None),
        V.hash_block_tokens(V.sha256, req.block_hashes[0], (3, 4, 5), None)]


def test_block_lookup_several_blocks_per_key():
    V.init_none_hash(V.sha256)
    pool = V.BlockPool(8)
    req = make_request("0", list(range(16)), V.sha256)
    a, b, c = pool.get_new_blocks(3)
    for blk in (a, b, c):
        pool.cache_full_blocks(req, [blk], 0, 1, 16, 0)
    key = V.make_block_hash_with_group_id(req.block_hashes[0], 0)
    assert pool.cached_block_hash_to_block.get_one_block(key) is a
    pool.evict_blocks({a.block_id})
    assert pool.cached_block_hash_to_block.get_one_block(key) is b
    pool.evict_blocks({b.block_id, c.block_id})
    assert key not in pool.cached_block_hash_to_block


def test_block_hash_group_id_roundtrip():
    key = V.make_block_hash_with_group_id(b"\x01" * 32, 5)
    assert V.get_block_hash(key) == b"\x01" * 32 and V.get_group_id(key) == 5


def test_hash_and_cache_is_hash_blocks_plus_cache_blocks():
    """The batched step call hashes like BlockHasher.hash_blocks and refuses bad blocks
    before caching any."""
    algo = "xxh3_128" if "xxh3_128" in pagedkv.HASH_ALGOS else "sha256"
    h = pagedkv.BlockHasher(algo)
    pool = pagedkv.PrefixPool(8, event_capacity=16)
    a, b, c = pool.get_new_blocks(3)
    first = h.hash_blocks(list(range(4)), 4, lora_id=3)[0]
    got = pool.hash_and_cache(h, [a, b], list(range(4)) + list(range(4, 8)), [None, first], 4,
                              lora_id=3)
    assert got == h.hash_blocks(list(range(8)), 4, lora_id=3)
    assert pool.find_prefix(got) == [a, b]
    events = pool.take_events()
    assert [e[0] for e in events] == ["BlockStored", "BlockStored"]
    assert events[1][2] == first and events[1][5] == 3
    with pytest.raises(pagedkv.InvalidArgument):
        pool.hash_and_cache(h, [c, a], list(range(8)), [None, None], 4)  # a is cached
    assert pool.block_hash(c) is None  # nothing cached
    with pytest.raises(pagedkv.InvalidArgument):
        pool.hash_and_cache(h, [c], list(range(3)), [None], 4)

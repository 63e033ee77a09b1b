# SPDX-License-Identifier: MIT
"""pagedkv.HybridKV: KV cache groups of a heterogeneous model from Python. Hand-computed
window release (sliding window 4, block 2), per-group slot mappings and tables in one
step, state slots copied on fork, and errors that name the problem."""
import numpy as np
import pytest

import pagedkv

SLIDING = {"kind": "sliding", "layers": 1, "kv_heads": 1, "head_dim": 1, "window": 4}
FULL = {"kind": "full", "layers": 1, "kv_heads": 1, "head_dim": 1}
STATE = {"kind": "state", "layers": 1, "state_bytes": 100}


def make(groups, layout="partition", budget=1 << 12):
    return pagedkv.HybridKV(groups, budget_bytes=budget, layout=layout, block_size=2,
                            elem_bytes=1, max_seqs=4)


def test_sliding_window_releases_blocks_outside_the_window():
    kv = make([SLIDING, FULL])
    assert kv.num_groups == 2 and kv.kinds == ["sliding", "full"] and kv.block_sizes == [2, 2]
    s = kv.create()
    for _ in range(9):
        kv.step([s], [1])
    # The 9th token's query (position 8) sees 5..8: blocks 0 and 1 are released.
    table = kv.block_table(s, 0)
    assert len(table) == 5 and list(table[:2]) == [-1, -1] and (table[2:] >= 0).all()
    assert (kv.block_table(s, 1) >= 0).all()
    st = kv.group_stats(0)
    assert st["blocks_released"] == 2 and st["blocks_held"] == 3 and st["tokens_held"] == 5
    kv.validate()


def test_step_gives_every_group_its_slots_tables_and_copies():
    kv = make([SLIDING, FULL, STATE])
    a, b = kv.create(), kv.create()
    r = kv.step(np.array([a, b], dtype=np.int32), [3, 2])
    assert r.slot_mapping.shape == (3, 5)
    assert (r.slot_mapping[2] == -1).all()          # the state group keeps no slots
    assert (r.slot_mapping[:2] >= 0).all()
    assert list(r.context_lens) == [3, 2]
    assert r.block_tables[0].shape == (2, 2) and r.block_tables[2] is None
    assert r.state_slots[0] is None and sorted(r.state_slots[2]) == sorted({kv.state_slot(a, 2), kv.state_slot(b, 2)})
    assert all(c.shape == (0, 2) for c in r.copies)
    # A fork copies the state: one (src, dst) pair in the state group's copies.
    c = kv.fork(a)
    r = kv.step([c], [1])
    assert r.copies[2].tolist() == [[kv.state_slot(a, 2), kv.state_slot(c, 2)]]
    kv.free(c)
    kv.validate()


def test_all_or_nothing_and_named_errors():
    kv = make([SLIDING, FULL], budget=64)
    s = kv.create()
    with pytest.raises(pagedkv.OutOfBlocks, match="nothing appended"):
        kv.step([s], [10000])
    assert kv.length(s) == 0
    with pytest.raises(pagedkv.NotFound):
        kv.step([s + 1], [1])
    with pytest.raises(pagedkv.InvalidArgument, match="listed twice"):
        kv.step([s, s], [1, 1])
    with pytest.raises(pagedkv.InvalidArgument, match="group 2 of 2"):
        kv.block_table(s, 2)
    with pytest.raises(pagedkv.InvalidArgument, match="unknown field 'heads'"):
        make([{"kind": "full", "layers": 1, "heads": 1}])
    with pytest.raises(pagedkv.InvalidArgument, match="kind must be"):
        make([{"kind": "swa", "layers": 1}])
    with pytest.raises(pagedkv.InvalidArgument, match="layout 'jenga'"):
        make([FULL], layout="jenga")
    with pytest.raises(pagedkv.InvalidArgument, match="budget 3 bytes"):
        make([FULL], budget=3)  # less than one 4-byte page
    st = make([STATE, FULL])
    with pytest.raises(pagedkv.InvalidArgument, match="state group"):
        st.block_table(st.create(), 0)


def test_truncate_into_released_tokens_raises_released():
    kv = make([SLIDING, FULL])
    s = kv.create()
    kv.step([s], [9])
    kv.step([s], [1])  # this append's query (position 9) releases tokens 0..5
    with pytest.raises(pagedkv.Released):
        kv.truncate(s, 2)
    assert kv.length(s) == 10
    kv.truncate(s, 9)
    kv.validate()


def test_prefix_cache_shares_per_group_rules():
    # Sliding W = 4 and full, block 2: a's 12-token prompt is cached right after its
    # step; b's same prompt hits 10 tokens (<= 11): the full group shares 5 blocks,
    # the sliding one only blocks 3 and 4 (tokens 6..9 its next query sees), -1 before.
    kv = pagedkv.HybridKV([SLIDING, FULL], budget_bytes=1 << 12, layout="partition", block_size=2,
                          elem_bytes=1, max_seqs=4, prefix_cache_blocks=64)
    prompt = np.arange(100, 112, dtype=np.int32)
    a = kv.create()
    kv.step([a], [12])
    assert kv.cache_prefix(a, prompt) == 12  # 6 blocks in each group
    m = kv.prefix_match(prompt)
    assert m == {"cached_tokens": 10, "hit_blocks": [2, 5], "evictable_hit": [0, 0]}
    b, cached = kv.create_cached(prompt)
    assert cached == 10 and kv.length(b) == 10
    ta, tb = kv.block_table(a, 0), kv.block_table(b, 0)
    assert list(tb[:3]) == [-1, -1, -1] and list(tb[3:]) == list(ta[3:5])
    assert list(kv.block_table(b, 1)) == list(kv.block_table(a, 1)[:5])
    kv.step([b], [2])
    st = kv.group_stats(0)
    assert st["prefix_hit_blocks"] == 2 and st["prefix_hit_tokens"] == 4 and st["cached_blocks"] == 6
    kv.free(a)
    kv.free(b)
    assert kv.group_stats(1)["cached_evictable"] == 6
    kv.validate()
    # A different prompt shares nothing.
    c, cached = kv.create_cached(np.arange(12, dtype=np.int32))
    assert cached == 0
    kv.validate()


def test_prefix_cache_with_a_state_group():
    kv = pagedkv.HybridKV([FULL, STATE], budget_bytes=1 << 13, layout="partition", block_size=2,
                          elem_bytes=1, max_seqs=4, prefix_cache_blocks=64)
    assert kv.state_interval == 2
    prompt = np.arange(10, dtype=np.int32)
    a = kv.create()
    kv.step([a], [8])
    assert kv.cache_state(a, prompt[:8]) == 1
    r = kv.step([a], [2])  # the snapshot's copy comes out with the next step
    src, dst = r.copies[1][0]
    assert src == kv.state_slot(a, 1) and dst != src
    kv.cache_prefix(a, prompt)
    b, cached = kv.create_cached(prompt)
    assert cached == 8
    r = kv.step([b], [2])
    assert list(r.copies[1][0]) == [dst, kv.state_slot(b, 1)]  # b starts from the cached state
    with pytest.raises(pagedkv.InvalidArgument, match="state_interval"):
        kv.cache_state(b, prompt[:9])
    kv.validate()


def test_prefix_cache_off_by_default():
    kv = make([FULL])
    s = kv.create()
    kv.step([s], [4])
    with pytest.raises(pagedkv.Unsupported, match="prefix_cache_blocks=0"):
        kv.cache_prefix(s, np.arange(4, dtype=np.int32))
    assert kv.create_cached(np.arange(4, dtype=np.int32))[1] == 0
    assert kv.state_interval == 0


def events_kv(**kw):
    # Full (block 4) and sliding (W = 4, block 2), a pool each; kw overrides.
    args = dict(budget_bytes=256, layout="partition", block_sizes=[4, 2], elem_bytes=1, max_seqs=4,
                prefix_cache_blocks=64, event_capacity=64, medium="CPU")
    args.update(kw)
    return pagedkv.HybridKV([FULL, SLIDING], **args)


def test_kv_events_name_the_group():
    kv = events_kv()
    h = pagedkv.BlockHasher("sha256")
    prompt = list(range(100, 116))
    a = kv.create()
    kv.step([a], [10])
    assert kv.take_events() == []
    kv.cache_prefix(a, np.array(prompt[:10], dtype=np.int32))
    full, swa = h.hash_blocks(prompt, 4), h.hash_blocks(prompt, 2)
    assert kv.take_events() == [
        ("BlockStored", full[:2], None, prompt[:8], 4, None, "CPU", 0),
        ("BlockStored", swa[:5], None, prompt[:10], 2, None, "CPU", 1)]
    kv.step([a], [6])  # the sliding group releases blocks 0-2 (still cached)
    kv.cache_prefix(a, np.array(prompt, dtype=np.int32))
    assert kv.take_events() == [
        ("BlockStored", full[2:4], full[1], prompt[8:16], 4, None, "CPU", 0),
        ("BlockStored", swa[5:8], swa[4], prompt[10:16], 2, None, "CPU", 1)]
    # A reset waits for the sequence (vLLM answers False), then clears every group.
    assert kv.reset_prefix_cache() is False
    kv.free(a)
    assert kv.reset_prefix_cache() is True
    assert kv.take_events() == [("AllBlocksCleared", "CPU")]
    assert kv.group_stats(0)["cached_blocks"] == 0 and kv.group_stats(1)["cached_blocks"] == 0
    kv.validate()


def test_kv_events_eviction_and_overflow():
    kv = events_kv(budget_bytes=64)  # full: 4 blocks, sliding: 8
    h = pagedkv.BlockHasher("sha256")
    prompt = list(range(8))
    a = kv.create()
    kv.step([a], [8])
    kv.cache_prefix(a, np.array(prompt, dtype=np.int32))
    kv.free(a)
    assert len(kv.take_events()) == 2
    b = kv.create()
    kv.step([b], [12])  # full: evicts its leaf; sliding: 2 of its 4
    ev = kv.take_events()
    assert ("BlockRemoved", [h.hash_blocks(prompt, 4)[1]], "CPU", 0) in ev
    removed = [e for e in ev if e[0] == "BlockRemoved" and e[3] == 1]
    assert len(removed) == 2 and all(e[1][0] in h.hash_blocks(prompt, 2) for e in removed)
    assert len(ev) == 3 and kv.events_dropped == 0
    # One slot for two groups' events: the drain ends with the count of the rest.
    kv = events_kv(event_capacity=1)
    a = kv.create()
    kv.step([a], [8])
    kv.cache_prefix(a, np.array(prompt, dtype=np.int32))
    ev = kv.take_events()
    assert [e[0] for e in ev] == ["BlockStored", "Overflow"] and ev[1] == ("Overflow", 1)
    assert kv.events_dropped == 1


def test_kv_events_need_the_prefix_cache():
    with pytest.raises(pagedkv.InvalidArgument, match="prefix_cache_blocks"):
        events_kv(prefix_cache_blocks=0)
    with pytest.raises(pagedkv.InvalidArgument, match="medium"):
        events_kv(medium="TAPE")
    kv = events_kv(event_capacity=0)  # events off: the cache works, nothing to drain
    a = kv.create()
    kv.step([a], [8])
    assert kv.cache_prefix(a, np.arange(8, dtype=np.int32)) == 6
    assert kv.take_events() == []


def test_move_to_swaps_the_window_and_keeps_sharing():
    dev, host = make([FULL, SLIDING, STATE], layout="lcm"), make([FULL, SLIDING, STATE])
    s = dev.create()
    for _ in range(9):
        dev.step([s], [1])
    c = dev.fork(s)
    dev.step([s, c], [0, 0])  # runs the fork's state copy
    # 9 tokens, block 2: full 5 blocks; sliding (query at 8 sees 5..8) 2 holes, 3 live.
    new_ids, pairs = dev.move_to(host, [s, c])
    assert len(new_ids) == 2 and dev.live == 0 and host.live == 2
    assert [p.shape for p in pairs] == [(5, 2), (3, 2), (2, 2)]  # shared blocks once
    assert list(host.block_table(int(new_ids[1]), 1)[:2]) == [-1, -1]
    assert (host.block_table(int(new_ids[0]), 0) == host.block_table(int(new_ids[1]), 0)).all()
    assert sorted(pairs[1][:, 1]) == sorted(host.block_table(int(new_ids[0]), 1)[2:])
    assert host.length(int(new_ids[0])) == 9
    host.validate()
    dev.validate()
    # A model of other groups is refused, naming the difference; nothing moves.
    other = make([FULL, dict(SLIDING, window=8), STATE])
    with pytest.raises(pagedkv.InvalidArgument, match="group 1: window 4 in from, 8 in to"):
        host.move_to(other, new_ids)
    assert host.live == 2

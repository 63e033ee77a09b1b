# SPDX-License-Identifier: MIT
"""The batch calls (one call per engine step) against the C library's own per-sequence
calls, randomized; and every error path of the batch calls."""
import numpy as np
import pytest

import pagedkv as pkv

pytestmark = pytest.mark.skipif(
    not pkv.HAVE_BATCH, reason="this build of the core lacks pkv_seqset_append_batch")

BS = 4


class Side:
    """One pool + set; logical sequence names map to this side's ids."""

    def __init__(self, blocks):
        self.pool = pkv.BlockPool(blocks)
        self.set = pkv.SeqSet(self.pool, BS)
        self.ids = {}

    def tables(self):
        return {name: self.set.block_table(i) for name, i in self.ids.items()}


def check_isomorphic(a, b, copies_a, copies_b):
    """Same sharing structure: one consistent bijection between the two sides' block ids
    maps every table entry and every copy pair."""
    fwd, back = {}, {}

    def pair(x, y):
        x, y = int(x), int(y)
        assert fwd.setdefault(x, y) == y and back.setdefault(y, x) == x, (x, y)

    ta, tb = a.tables(), b.tables()
    for name in ta:
        assert len(ta[name]) == len(tb[name]), name
        for x, y in zip(ta[name], tb[name]):
            pair(x, y)
    assert copies_a.shape == copies_b.shape
    for (sa, da), (sb, db) in zip(copies_a, copies_b):
        pair(sa, sb)
        pair(da, db)


@pytest.mark.parametrize("seed", range(6))
def test_batch_matches_per_sequence_calls(seed):
    rng = np.random.default_rng(seed)
    blocks = int(rng.integers(24, 96))
    A, B = Side(blocks), Side(blocks)   # A: batch calls; B: per-sequence calls
    C = Side(blocks)                    # C: step(), must equal A exactly
    next_name = 0
    for _ in range(300):
        op = rng.random()
        names = list(A.ids)
        if op < 0.15 or not names:
            for side in (A, B, C):
                side.ids[next_name] = side.set.create()
            next_name += 1
        elif op < 0.25:
            parent = names[rng.integers(len(names))]
            for side in (A, B, C):
                side.ids[next_name] = side.set.fork(side.ids[parent])
            next_name += 1
        elif op < 0.35:
            chosen = [n for n in names if rng.random() < 0.3]
            A.set.free_batch(np.array([A.ids[n] for n in chosen], dtype=np.int32))
            C.set.free_batch([C.ids[n] for n in chosen])
            for n in chosen:
                B.set.free(B.ids[n])
                for side in (A, B, C):
                    del side.ids[n]
        else:
            chosen = [n for n in names if rng.random() < 0.7]
            rng.shuffle(chosen)
            counts = rng.integers(0, 3 * BS, size=len(chosen)).astype(np.int32)
            sa = np.array([A.ids[n] for n in chosen], dtype=np.int32)
            need = A.set.blocks_needed_batch(sa, counts)
            assert need == C.set.blocks_needed_batch([C.ids[n] for n in chosen], counts)
            free0 = A.pool.free_count
            if need > free0:
                with pytest.raises(pkv.OutOfBlocks):
                    A.set.append_batch(sa, counts)
                with pytest.raises(pkv.OutOfBlocks):
                    C.set.step([C.ids[n] for n in chosen], counts)
                assert A.pool.free_count == free0  # all or nothing
                continue
            slots = A.set.append_batch(sa, counts)
            assert A.pool.free_count == free0 - need
            step = C.set.step(np.array([C.ids[n] for n in chosen]), counts,
                              tables="csr" if rng.random() < 0.5 else "padded")
            assert (step.slot_mapping == slots).all()
            # B: the same appends one sequence at a time, in order
            slots_b = [B.set.append(B.ids[n], int(c)) for n, c in zip(chosen, counts)]
            slots_b = np.concatenate(slots_b) if slots_b else np.zeros(0, np.int64)
            assert B.pool.free_count == A.pool.free_count
            assert slots.shape == slots_b.shape
            # slots follow each sequence's table
            pos = 0
            for n, c in zip(chosen, counts):
                table, length = A.set.block_table(A.ids[n]), A.set.length(A.ids[n])
                assert length == B.set.length(B.ids[n])
                for p in range(length - int(c), length):
                    assert slots[pos] == table[p // BS] * BS + p % BS
                    pos += 1
            # the step's tables are the exports of the same state
            if step.block_tables is not None:
                t, lens = C.set.export_padded([C.ids[n] for n in chosen])
                assert (step.block_tables == t).all() and (step.context_lens == lens).all()
            else:
                indptr, indices, last = C.set.export_csr([C.ids[n] for n in chosen])
                assert (step.indptr == indptr).all() and (step.indices == indices).all()
                assert (step.last_page_len == last).all()
            copies_a, copies_b = A.set.take_copies(), B.set.take_copies()
            assert (step.copies == copies_a).all()
            check_isomorphic(A, B, copies_a, copies_b)
        for side in (A, B, C):
            side.set.validate(exclusive=True)
        assert A.pool.free_count == B.pool.free_count == C.pool.free_count
        assert {n: t.tolist() for n, t in A.tables().items()} == \
               {n: t.tolist() for n, t in C.tables().items()}


def test_step_shapes_and_copy_pairs():
    pool = pkv.BlockPool(32)
    s = pkv.SeqSet(pool, BS)
    p = s.create()
    s.append(p, 6)
    kids = [s.fork(p) for _ in range(3)]  # 4 sharers of a half-full block
    seqs = np.array([p] + kids, dtype=np.int32)
    assert s.blocks_needed_batch(seqs, np.ones(4, np.int32)) == 3  # n sharers: n - 1 copies
    r = s.step(seqs, np.ones(4, dtype=np.int32))
    assert isinstance(r, pkv.StepResult)
    assert r.slot_mapping.dtype == np.int64 and r.slot_mapping.shape == (4,)
    assert r.block_tables.shape == (4, 2) and r.block_tables.dtype == np.int32
    assert r.context_lens.tolist() == [7] * 4 and r.indptr is None
    assert r.copies.shape == (3, 2) and s.pending_copies == 0
    assert len(set(r.block_tables[:, 1].tolist())) == 4  # everyone has its own last block
    assert (r.block_tables[:, 0] == r.block_tables[0, 0]).all()  # the full block is shared
    r = s.step(seqs, [0, 0, 0, 5], tables="csr")
    assert r.block_tables is None and r.indptr.tolist() == [0, 2, 4, 6, 9]
    assert r.last_page_len.tolist() == [3, 3, 3, 4] and r.slot_mapping.shape == (5,)
    r = s.step([], [])
    assert r.slot_mapping.shape == (0,) and r.copies.shape == (0, 2)


def test_batch_errors_change_nothing():
    pool = pkv.BlockPool(8)
    s = pkv.SeqSet(pool, BS)
    a, b = s.create(), s.create()
    s.append(a, 5)
    state = (pool.free_count, s.length(a), s.length(b))
    with pytest.raises(pkv.InvalidArgument):
        s.append_batch([a, a], [1, 1])  # duplicate
    with pytest.raises(pkv.InvalidArgument):
        s.blocks_needed_batch([a, a], [1, 1])
    with pytest.raises(pkv.InvalidArgument):
        s.append_batch([a, b], [1])  # lengths differ
    with pytest.raises(pkv.InvalidArgument):
        s.append_batch([a, b], [1, -1])
    with pytest.raises(pkv.InvalidArgument):
        s.step([a], [1], tables="coo")
    with pytest.raises(pkv.OutOfBlocks) as e:
        s.append_batch([a, b], [4, 40])
    assert "need" in e.value.detail and "free" in e.value.detail
    with pytest.raises(pkv.OutOfBlocks):
        s.step([a, b], [4, 40])
    c = s.create()
    s.free(c)
    with pytest.raises(pkv.NotFound):
        s.append_batch([a, c], [1, 1])  # stale id
    with pytest.raises(pkv.NotFound):
        s.free_batch([b, c])
    with pytest.raises(pkv.InvalidArgument):
        s.free_batch([b, b])
    assert (pool.free_count, s.length(a), s.length(b)) == state
    s.validate(exclusive=True)


def test_watermark():
    pool = pkv.BlockPool(8)
    s = pkv.SeqSet(pool, BS)
    a = s.create()
    s.set_watermark(4)
    assert s.watermark == 4
    s.append_batch([a], [16])  # leaves exactly 4
    with pytest.raises(pkv.OutOfBlocks):
        s.append_batch([a], [1])
    with pytest.raises(pkv.OutOfBlocks):
        s.append(a, 1)
    s.set_watermark(0)
    s.append(a, 1)


def test_fork_at_truncate_move_group():
    pool = pkv.BlockPool(32)
    host_pool = pkv.BlockPool(32)
    s, host = pkv.SeqSet(pool, BS), pkv.SeqSet(host_pool, BS)
    p = s.create()
    s.append(p, 10)
    c = s.fork_at(p, 6)
    assert s.length(c) == 6 and (s.block_table(c) == s.block_table(p)[:2]).all()
    with pytest.raises(pkv.InvalidArgument):
        s.fork_at(p, 11)
    s.truncate(p, 3)
    assert s.length(p) == 3 and len(s.block_table(p)) == 1
    with pytest.raises(pkv.InvalidArgument):
        s.truncate(p, 4)
    shared = s.block_table(p)[0]
    new_ids, pairs = s.move_group([p, c], host)
    assert new_ids.shape == (2,) and pairs.shape == (2, 2)  # 2 distinct blocks
    assert host.block_table(new_ids[0])[0] == host.block_table(new_ids[1])[0]
    assert shared in pairs[:, 0]
    assert pool.free_count == 32 and host_pool.free_count == 30
    with pytest.raises(pkv.NotFound):
        s.length(p)
    s.validate(exclusive=True)
    host.validate(exclusive=True)


@pytest.mark.parametrize("huge", [2**32 - 1, 2**31 - 16])
@pytest.mark.parametrize("what", ["append_batch", "step", "append", "alloc", "export_padded"])
def test_refused_before_the_output_is_sized(what, huge):
    """Issue 20, defect 7: the library refuses a count of 2**32 - 1 (too long:
    InvalidArgument) or 2**31 - 16 (more blocks than the pool: OutOfBlocks) before the
    wrapper sizes its output from it (it allocated 16 to 32 GiB first: MemoryError, or
    the library's error only after the allocation)."""
    s = Side(8)
    a = s.set.create()
    long_or_big = pkv.InvalidArgument if huge > 2**31 else pkv.OutOfBlocks
    calls = {
        "append_batch": (lambda: s.set.append_batch([a], [huge]), long_or_big),
        "step": (lambda: s.set.step([a], [huge]), long_or_big),
        "append": (lambda: s.set.append(a, huge), long_or_big),
        "alloc": (lambda: s.pool.alloc(huge), pkv.OutOfBlocks),
        "export_padded": (lambda: s.set.export_padded([a], max_blocks=huge), pkv.InvalidArgument),
    }
    call, err = calls[what]
    import tracemalloc  # numpy reports its array data to tracemalloc
    tracemalloc.start()
    try:
        with pytest.raises(err):
            call()
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 1 << 20, f"{what}: {peak} bytes allocated before the refusal"
    assert s.pool.free_count == 8  # nothing changed

# SPDX-License-Identifier: MIT
"""SeqSet per-sequence calls: slots, fork and copy-on-write, copies, move, exports."""
import numpy as np
import pytest

import pagedkv as pkv


def make(blocks=16, bs=4):
    pool = pkv.BlockPool(blocks)
    return pool, pkv.SeqSet(pool, bs)


def slots_from_table(table, bs, start, n):
    return np.array([table[p // bs] * bs + p % bs for p in range(start, start + n)])


def test_append_slots_and_table():
    pool, s = make()
    a = s.create()
    slots = s.append(a, 10)
    assert slots.dtype == np.int64 and slots.shape == (10,)
    table = s.block_table(a)
    assert table.dtype == np.int32 and table.shape == (3,)
    assert (slots == slots_from_table(table, 4, 0, 10)).all()
    assert s.length(a) == 10 and s.blocks_needed(a, 2) == 0 and s.blocks_needed(a, 3) == 1
    assert pool.free_count == 13
    assert s.block_size == 4 and s.pool is pool and s.live_count == 1
    s.validate(exclusive=True)
    s.free(a)
    assert pool.free_count == 16 and s.live_count == 0


def test_fork_copy_on_write_and_copies():
    pool, s = make()
    a = s.create()
    s.append(a, 6)  # blocks: full + half
    b = s.fork(a)
    assert (s.block_table(a) == s.block_table(b)).all()
    assert s.blocks_needed(b, 1) == 1  # CoW of the shared, partly filled block
    s.append(b, 1)
    assert s.pending_copies == 1
    c = s.copies()
    assert c.shape == (1, 2) and c.dtype == np.int32
    assert c[0, 0] == s.block_table(a)[1] and c[0, 1] == s.block_table(b)[1]
    assert s.pending_copies == 1  # copies() leaves the queue
    s.copies_done()
    assert s.pending_copies == 0
    s.append(a, 1)  # a is now the only holder of its half block: in place
    assert s.pending_copies == 0
    s.validate(exclusive=True)
    s.free(a)
    s.free(b)
    assert pool.free_count == 16


def test_take_copies():
    pool, s = make()
    a = s.create()
    s.append(a, 5)
    b = s.fork(a)
    s.append(b, 1)
    taken = s.take_copies()
    assert taken.shape == (1, 2) and s.pending_copies == 0
    assert s.take_copies().shape == (0, 2)


def test_exports():
    pool, s = make(32, 4)
    ids = [s.create() for _ in range(3)]
    for i, n in zip(ids, (1, 4, 9)):
        s.append(i, n)
    e = s.create()  # empty
    table, lens = s.export_padded(ids + [e])
    assert table.shape == (4, 3) and lens.tolist() == [1, 4, 9, 0]
    assert (table[0, 1:] == -1).all() and (table[3] == -1).all()
    assert (table[2] == s.block_table(ids[2])).all()
    table, _ = s.export_padded(ids, max_blocks=5, pad=7)
    assert table.shape == (3, 5) and (table[0, 1:] == 7).all()
    with pytest.raises(pkv.BufferTooSmall):
        s.export_padded(ids, max_blocks=2)
    indptr, indices, last = s.export_csr(np.array(ids + [e]))
    assert indptr.tolist() == [0, 1, 2, 5, 5]
    assert last.tolist() == [1, 4, 1, 0]
    assert (indices[2:5] == s.block_table(ids[2])).all()
    t0, l0 = s.export_padded([])
    assert t0.shape == (0, 1) and l0.shape == (0,)


def test_move_between_pools():
    pool, s = make(16, 4)
    host_pool, host = make(16, 4)
    a = s.create()
    s.append(a, 9)
    table = s.block_table(a)
    new_id, pairs = s.move(a, host)
    assert pairs.shape == (3, 2) and (pairs[:, 0] == table).all()
    assert (pairs[:, 1] == host.block_table(new_id)).all()
    assert pool.free_count == 16 and host_pool.free_count == 13
    with pytest.raises(pkv.NotFound):
        s.length(a)
    with pytest.raises(pkv.InvalidArgument):  # same pool
        host.move(new_id, host)


def test_errors():
    pool, s = make(4, 4)
    with pytest.raises(pkv.InvalidArgument):
        pkv.SeqSet(pool, 0)
    with pytest.raises(pkv.InvalidArgument):
        pkv.SeqSet(pool, 65537)
    with pytest.raises(TypeError):
        pkv.SeqSet("pool", 4)
    a = s.create()
    with pytest.raises(pkv.OutOfBlocks) as e:
        s.append(a, 17)
    assert "needs 5 blocks, pool has 4 free" in str(e.value)
    assert s.length(a) == 0 and pool.free_count == 4  # all or nothing
    s.free(a)
    for call in (lambda: s.free(a), lambda: s.append(a, 1), lambda: s.length(a),
                 lambda: s.fork(a), lambda: s.block_table(a), lambda: s.blocks_needed(a, 1),
                 lambda: s.export_padded([a]), lambda: s.export_csr([a]),
                 lambda: s.free(-1), lambda: s.free(2**31)):
        with pytest.raises(pkv.NotFound):
            call()
    with pytest.raises(pkv.InvalidArgument):
        s.append("x", 1)
    with pytest.raises(pkv.InvalidArgument):
        s.append(0, -1)
    with pytest.raises(pkv.InvalidArgument):
        s.export_padded([0.5])
    with pytest.raises(pkv.InvalidArgument):
        s.export_padded(np.array([2**40]))
    s.validate(exclusive=True)

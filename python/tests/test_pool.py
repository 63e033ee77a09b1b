# SPDX-License-Identifier: MIT
"""BlockPool: every method and every error path."""
import numpy as np
import pytest

import pagedkv as pkv


def test_alloc_release_refcount():
    pool = pkv.BlockPool(8)
    assert pool.capacity == 8 and pool.free_count == 8 and len(pool) == 8
    ids = pool.alloc(3)
    assert ids.dtype == np.int32 and ids.shape == (3,)
    assert len(set(ids.tolist())) == 3 and all(0 <= i < 8 for i in ids)
    assert pool.free_count == 5
    pool.retain(int(ids[0]))
    assert pool.refcount(int(ids[0])) == 2
    pool.release(int(ids[0]))
    pool.release(ids)  # the array form: one reference each
    assert pool.free_count == 8
    assert all(pool.refcount(i) == 0 for i in range(8))
    pool.validate()
    assert pool.alloc(0).shape == (0,)


def test_stats():
    pool = pkv.BlockPool(4)
    pool.alloc(3)
    with pytest.raises(pkv.OutOfBlocks):
        pool.alloc(2)
    s = pool.stats()
    assert s == {"capacity": 4, "free_blocks": 1, "used_blocks": 3, "peak_used": 3,
                 "alloc_failures": 1}


def test_out_of_blocks_changes_nothing_and_says_why():
    pool = pkv.BlockPool(4)
    pool.alloc(3)
    with pytest.raises(pkv.OutOfBlocks) as e:
        pool.alloc(2)
    assert e.value.status == -2 and e.value.status_name == "out of blocks"
    assert "asked for 2 blocks, 1 free" in str(e.value) and e.value.detail
    assert isinstance(e.value, pkv.PagedKVError)
    assert pool.free_count == 1


def test_errors():
    with pytest.raises(pkv.InvalidArgument):
        pkv.BlockPool(0)
    with pytest.raises(pkv.InvalidArgument):
        pkv.BlockPool(-1)
    with pytest.raises(pkv.InvalidArgument):
        pkv.BlockPool(pkv.POOL_MAX_BLOCKS + 1)
    with pytest.raises(ValueError):  # InvalidArgument is a ValueError
        pkv.BlockPool("8")
    pool = pkv.BlockPool(4)
    with pytest.raises(pkv.InvalidArgument):
        pool.alloc(-1)
    with pytest.raises(pkv.NotFound):
        pool.release(0)  # double release / free block
    with pytest.raises(LookupError):  # NotFound is a LookupError
        pool.retain(0)
    with pytest.raises(pkv.NotFound):
        pool.refcount(4)
    with pytest.raises(pkv.NotFound):
        pool.release(2**40)
    ids = pool.alloc(2)
    # release_n: all ids are checked first, so a bad one changes nothing
    with pytest.raises(pkv.NotFound):
        pool.release(np.array([ids[0], ids[0]], dtype=np.int32))
    assert pool.free_count == 2 and pool.refcount(int(ids[0])) == 1
    with pytest.raises(pkv.InvalidArgument):
        pool.release(np.array([1.5]))
    with pytest.raises(pkv.InvalidArgument):
        pool.release(np.zeros((2, 2), dtype=np.int32))
    pool.validate()


def test_repr():
    assert repr(pkv.BlockPool(3)) == "BlockPool(capacity=3, free=3)"

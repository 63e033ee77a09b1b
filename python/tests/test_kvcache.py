# SPDX-License-Identifier: MIT
"""KVCache: the arena as a zero-copy numpy array, checked through the C API both ways."""
import gc

import numpy as np
import pytest

import pagedkv as pkv

L, H, D, B, N = 3, 2, 8, 4, 6


def make(dtype="fp32", layout="HND"):
    pool = pkv.BlockPool(N)
    cache = pkv.KVCache(pool, num_layers=L, kv_heads=H, head_dim=D, block_size=B,
                        dtype=dtype, layout=layout)
    return pool, cache


@pytest.mark.parametrize("layout,shape", [("HND", (L, N, 2, H, B, D)),
                                          ("NHD", (L, N, 2, B, H, D))])
@pytest.mark.parametrize("dtype,np_dtype", [("fp32", np.float32), ("fp16", np.float16),
                                            ("bf16", np.uint16)])
def test_shape_dtype_and_no_copy(layout, shape, dtype, np_dtype):
    pool, cache = make(dtype, layout)
    a = cache.numpy()
    assert a.shape == shape == cache.shape and a.dtype == np_dtype == cache.dtype
    assert a.ctypes.data == cache.data_ptr and a.nbytes == cache.arena_bytes
    assert a.flags.c_contiguous and a.flags.writeable and not a.flags.owndata
    b = np.asarray(cache)  # the buffer protocol gives the same memory
    assert b.shape == shape and b.dtype == np_dtype and b.ctypes.data == cache.data_ptr
    assert memoryview(cache).shape == shape
    assert cache.strides == a.strides
    assert (a == 0).all()  # zeroed at creation
    assert cache.params["layout"] == layout and cache.device == "cpu" and cache.pool is pool


@pytest.mark.parametrize("layout", ["HND", "NHD"])
def test_numpy_write_is_seen_by_the_c_api(layout):
    pool, cache = make("fp32", layout)
    a = cache.numpy()
    rng = np.random.default_rng(0)
    for layer, block, kv in [(0, 0, 0), (2, 5, 1), (1, 3, 0)]:
        values = rng.standard_normal(a.shape[3:]).astype(np.float32)
        a[layer, block, kv] = values
        assert (cache.read_block(layer, block, kv) == values).all()
        # and the C API's block address is where numpy wrote
        assert cache.block_ptr(layer, block, kv) == a[layer, block, kv].ctypes.data


def test_c_write_and_copy_are_seen_through_numpy():
    pool, cache = make("fp16")
    a = cache.numpy()
    values = np.arange(H * B * D, dtype=np.float16).reshape(H, B, D)
    cache.write_block(1, 2, 1, values)
    assert (a[1, 2, 1] == values).all() and (a[1, 2, 0] == 0).all()
    a[:, 4] = 3.0
    cache.copy_blocks(np.array([[4, 0]], dtype=np.int32))  # every layer, K and V
    assert (a[:, 0] == 3.0).all()
    assert cache.backend_stats()["copy_calls"] == 1
    cache.copy_blocks(np.zeros((0, 2), dtype=np.int32))


def test_copy_on_write_through_a_seqset():
    pool, cache = make("fp32")
    s = pkv.SeqSet(pool, B)
    a = cache.numpy()
    p = s.create()
    slots = s.append(p, B + 1)
    blk, off = divmod(int(slots[-1]), B)
    a[:, blk, :, :, off, :] = 7.0  # write the partial block's K/V as a kernel would
    c = s.fork(p)
    s.append(c, 1)
    cache.apply_copies(s)
    dst = s.block_table(c)[1]
    assert dst != blk and (a[:, dst, :, :, off, :] == 7.0).all()
    assert s.pending_copies == 0


def test_array_keeps_the_cache_alive():
    pool, cache = make()
    a = cache.numpy()
    a[0, 0, 0, 0, 0, 0] = 42
    del cache, pool
    gc.collect()
    assert a[0, 0, 0, 0, 0, 0] == 42  # still valid memory: the array holds the cache


def test_transfer_between_caches():
    pool, gpu_like = make()
    host_pool, host = make()
    gpu_like.numpy()[:, 1] = 5.0
    host.transfer(gpu_like, np.array([[1, 3]], dtype=np.int32))
    assert (host.numpy()[:, 3] == 5.0).all()
    other = pkv.KVCache(pkv.BlockPool(N), num_layers=L + 1, kv_heads=H, head_dim=D,
                        block_size=B, dtype="fp32")
    with pytest.raises(pkv.InvalidArgument):
        host.transfer(other, np.array([[0, 0]], dtype=np.int32))


def test_errors():
    pool = pkv.BlockPool(N)
    with pytest.raises(pkv.InvalidArgument):
        pkv.KVCache(pool, dtype="int8")
    with pytest.raises(pkv.InvalidArgument):
        pkv.KVCache(pool, layout="XYZ")
    with pytest.raises(pkv.InvalidArgument):
        pkv.KVCache(pool, head_dim=0)
    with pytest.raises(pkv.InvalidArgument):
        pkv.KVCache(pool, device="tpu")
    with pytest.raises(TypeError):
        pkv.KVCache(pool, 1)  # keyword-only shape
    if not pkv.HAVE_CUDA:
        with pytest.raises(pkv.Unsupported):
            pkv.KVCache(pool, device="cuda")
    else:  # pragma: no cover - GPU machines
        try:
            pkv.KVCache(pool, device="cuda:0", head_dim=8)
        except pkv.NoDevice:
            pass
    cache = pkv.KVCache(pool, num_layers=2, head_dim=8)
    with pytest.raises(pkv.InvalidArgument):
        cache.read_block(2, 0, 0)
    with pytest.raises(pkv.InvalidArgument):
        cache.read_block(-1, 0, 0)
    with pytest.raises(pkv.NotFound):
        cache.read_block(0, N, 0)
    with pytest.raises(pkv.InvalidArgument):
        cache.read_block(0, 0, 2)
    with pytest.raises(pkv.InvalidArgument):
        cache.write_block(0, 0, 0, np.zeros((3, 3)))
    with pytest.raises(pkv.InvalidArgument):
        cache.copy_blocks(np.array([[0, N]], dtype=np.int32))
    with pytest.raises(pkv.InvalidArgument):
        cache.copy_blocks(np.array([0, 1, 2], dtype=np.int32))
    with pytest.raises(pkv.InvalidArgument):
        cache.apply_copies(pkv.SeqSet(pool, 4))  # block size 4 != 16


def test_external_buffer_is_the_cache():
    pool = pkv.BlockPool(N)
    mine = np.zeros((L, N, 2, H, B, D), dtype=np.float16)  # an engine's own tensor
    cache = pkv.KVCache(pool, num_layers=L, kv_heads=H, head_dim=D, block_size=B,
                        dtype="fp16", buffer=mine)
    assert cache.data_ptr == mine.ctypes.data and cache.numpy().ctypes.data == mine.ctypes.data
    assert cache.backend_stats()["alloc_calls"] == 0  # nothing allocated
    values = np.full((H, B, D), 2.5, dtype=np.float16)
    cache.write_block(2, 3, 0, values)
    assert (mine[2, 3, 0] == 2.5).all()
    mine[1, 1, 1] = 4.0
    assert (cache.read_block(1, 1, 1) == 4.0).all()
    cache.copy_blocks(np.array([[1, 5]], dtype=np.int32), stream=None)
    assert (mine[1, 5, 1] == 4.0).all()
    cache.sync()
    del mine
    gc.collect()
    assert (cache.numpy()[1, 5, 1] == 4.0).all()  # the cache keeps the buffer alive


def test_external_buffer_errors():
    pool = pkv.BlockPool(N)
    kw = dict(num_layers=L, kv_heads=H, head_dim=D, block_size=B, dtype="fp16")
    with pytest.raises(pkv.BufferTooSmall) as e:
        pkv.KVCache(pool, buffer=np.zeros((L, N - 1, 2, H, B, D), np.float16), **kw)
    assert "needs" in str(e.value)
    with pytest.raises(pkv.InvalidArgument):  # 4-byte items for an fp16 cache
        pkv.KVCache(pool, buffer=np.zeros((L, N, 2, H, B, D), np.float32), **kw)
    with pytest.raises((BufferError, ValueError)):  # numpy: "not C-contiguous"
        pkv.KVCache(pool, buffer=np.zeros((L, N, 2, H, B, D), np.float16).T, **kw)
    ro = np.zeros((L, N, 2, H, B, D), np.float16)
    ro.flags.writeable = False
    with pytest.raises((BufferError, ValueError)):  # numpy: "read-only"
        pkv.KVCache(pool, buffer=ro, **kw)
    with pytest.raises(pkv.InvalidArgument):
        pkv.KVCache(pool, buffer=np.zeros(10, np.float16), device="cuda", **kw)
    cache = pkv.KVCache(pool, **kw)
    with pytest.raises(pkv.InvalidArgument):
        cache.copy_blocks(np.zeros((0, 2), np.int32), stream="default")

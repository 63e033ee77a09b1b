# SPDX-License-Identifier: MIT
"""KVCache(buffer=...) over an engine's own tensors: DLPack producers (numpy >= 1.22
here; torch and CuPy where installed), __cuda_array_interface__, per-layer lists, and
the checks of shape, strides, dtype and device against the declared layout."""
import sys

import numpy as np
import pytest

import pagedkv as pkv

L, N, H, B, D = 2, 6, 3, 4, 8
KW = dict(num_layers=L, kv_heads=H, head_dim=D, block_size=B)
SHAPES = {  # the tensor each layout names, as vLLM and FlashInfer allocate them
    "HND": (L, N, 2, H, B, D),
    "NHD": (L, N, 2, B, H, D),
    "KV_NHD": (L, 2, N, B, H, D),  # vLLM's FlashAttention backend
}


def half(t, layout, layer, block, kv):
    """The (layer, block, K/V) half block of tensor `t` in `layout`, as a view."""
    return t[layer, kv, block] if layout == "KV_NHD" else t[layer, block, kv]


@pytest.mark.skipif(not hasattr(np.ndarray, "__dlpack__"), reason="numpy < 1.22 has no DLPack")
@pytest.mark.parametrize("layout", sorted(SHAPES))
def test_dlpack_tensor_in_each_layout(layout):
    pool = pkv.BlockPool(N)
    mine = np.zeros(SHAPES[layout], np.float32)
    cache = pkv.KVCache(pool, dtype="fp32", layout=layout, buffer=mine, **KW)
    assert cache.shape == mine.shape and cache.strides == mine.strides
    assert cache.data_ptr == mine.ctypes.data and cache.params["layout"] == layout
    # Every half block the cache addresses is that half of the caller's tensor.
    for layer in range(L):
        for block in range(N):
            for kv in range(2):
                assert cache.block_ptr(layer, block, kv) == \
                    half(mine, layout, layer, block, kv).ctypes.data
    mine[...] = np.arange(mine.size, dtype=np.float32).reshape(mine.shape)
    want = mine.copy()
    cache.copy_blocks(np.array([[1, 4], [5, 0]], np.int32))
    for src, dst in ((1, 4), (5, 0)):
        for layer in range(L):
            for kv in range(2):
                half(want, layout, layer, dst, kv)[...] = half(want, layout, layer, src, kv)
    assert (mine == want).all(), "a copy touched bytes outside its blocks"


def test_right_size_wrong_layout_is_refused():
    # The old check was the byte count only: an NHD tensor passed for an HND cache was
    # accepted and copies then moved the wrong elements.
    pool = pkv.BlockPool(N)
    for declared, given in (("HND", "NHD"), ("NHD", "HND"), ("KV_NHD", "HND"),
                            ("HND", "KV_NHD")):
        t = np.zeros(SHAPES[given], np.float16)
        with pytest.raises(pkv.InvalidArgument, match=f"layout {declared} needs"):
            pkv.KVCache(pool, layout=declared, buffer=t, **KW)
    flat = np.zeros(int(np.prod(SHAPES["HND"])), np.float16)  # right bytes, no shape
    with pytest.raises(pkv.InvalidArgument, match="buffer has shape"):
        pkv.KVCache(pool, buffer=flat, **KW)


def test_strides_dtype_and_device_are_checked():
    pool = pkv.BlockPool(N)
    # The right shape as a transposed view: not C-contiguous.
    t = np.zeros((L, N, 2, H, D, B), np.float16).transpose(0, 1, 2, 3, 5, 4)
    with pytest.raises(pkv.InvalidArgument, match="not C-contiguous: axis 5"):
        pkv.KVCache(pool, buffer=t, **KW)
    with pytest.raises(pkv.InvalidArgument, match="does not hold dtype fp16"):
        pkv.KVCache(pool, buffer=np.zeros(SHAPES["HND"], np.int16), **KW)
    # bf16: numpy has no bfloat16; its uint16 bits stand in (as cache.numpy() exports).
    pkv.KVCache(pool, dtype="bf16", buffer=np.zeros(SHAPES["HND"], np.uint16), **KW)
    with pytest.raises(pkv.InvalidArgument, match="host memory, the cache's device is 'cuda'"):
        pkv.KVCache(pool, buffer=np.zeros(SHAPES["HND"], np.float16), device="cuda", **KW)
    with pytest.raises(pkv.InvalidArgument, match="neither a DLPack producer"):
        pkv.KVCache(pool, buffer=object(), **KW)


def test_the_cache_owns_the_consumed_capsule():
    # DLPack: the capsule is renamed "used_dltensor" and its deleter runs when the
    # cache goes, which drops the producer's reference to the array.
    pool = pkv.BlockPool(N)
    mine = np.zeros(SHAPES["HND"], np.float16)
    before = sys.getrefcount(mine)
    cache = pkv.KVCache(pool, buffer=mine, **KW)
    assert sys.getrefcount(mine) > before
    del cache
    assert sys.getrefcount(mine) == before


@pytest.mark.parametrize("layout", sorted(SHAPES))
def test_one_tensor_per_layer(layout):
    pool = pkv.BlockPool(N)
    layers = [np.zeros(SHAPES[layout][1:], np.float32) for _ in range(L)]
    cache = pkv.KVCache(pool, dtype="fp32", layout=layout, buffer=layers, **KW)
    assert cache.shape == layers[0].shape
    assert cache.data_ptr == tuple(t.ctypes.data for t in layers)
    for layer, t in enumerate(layers):
        t[...] = layer + 1 + np.arange(t.size, dtype=np.float32).reshape(t.shape)
        assert cache.block_ptr(layer, 2, 1) == (t[1, 2] if layout == "KV_NHD" else t[2, 1]).ctypes.data
    want = [t.copy() for t in layers]
    cache.copy_blocks([[3, 0]])
    for w in want:
        for kv in range(2):
            dst = (kv, 0) if layout == "KV_NHD" else (0, kv)
            src = (kv, 3) if layout == "KV_NHD" else (3, kv)
            w[dst] = w[src]
    assert all((t == w).all() for t, w in zip(layers, want))
    # The set's queued copy-on-write copies run on every layer, then leave the queue.
    seqs = pkv.SeqSet(pool, B)
    a = seqs.create()
    seqs.append(a, B + 1)
    b = seqs.fork(a)
    seqs.append(b, 1)  # b's last block is shared: copy-on-write queues one copy
    (src, dst), = seqs.copies()
    cache.apply_copies(seqs)
    assert len(seqs.copies()) == 0
    for t in layers:
        assert (half(t[None], layout, 0, dst, 0) == half(t[None], layout, 0, src, 0)).all()
    # A swap space of the same per-layer shape takes whole blocks.
    swap_layers = [np.zeros_like(t) for t in layers]
    swap = pkv.KVCache(pkv.BlockPool(N), dtype="fp32", layout=layout, buffer=swap_layers, **KW)
    swap.transfer(cache, np.array([[dst, 5]], np.int32))
    for t, s in zip(layers, swap_layers):
        assert (half(s[None], layout, 0, 5, 1) == half(t[None], layout, 0, dst, 1)).all()
    with pytest.raises(pkv.InvalidArgument, match="one per layer is 2"):
        pkv.KVCache(pool, dtype="fp32", layout=layout, buffer=layers[:1], **KW)
    with pytest.raises(pkv.InvalidArgument, match=r"buffer\[1\]"):
        pkv.KVCache(pool, dtype="fp32", layout=layout, buffer=[layers[0], layers[1].reshape(-1)], **KW)
    with pytest.raises(pkv.Unsupported):
        cache.numpy()


class CudaArray:
    """A hand-made __cuda_array_interface__ (v3), as CuPy or Numba describe device memory."""

    def __init__(self, shape, typestr="<f2", ptr=0x7F0000000000, strides=None, **extra):
        self.__cuda_array_interface__ = dict(shape=shape, typestr=typestr, data=(ptr, False),
                                             strides=strides, version=3, **extra)


def test_cuda_array_interface_is_read_and_checked():
    pool = pkv.BlockPool(N)
    # Parsed and checked before any device is touched: the device, then the layout.
    with pytest.raises(pkv.InvalidArgument, match="in CUDA memory, the cache's device is 'cpu'"):
        pkv.KVCache(pool, buffer=CudaArray(SHAPES["HND"]), device="cpu", **KW)
    bad = [
        (CudaArray(SHAPES["NHD"]), "layout HND needs"),
        (CudaArray(SHAPES["HND"], typestr="<f4"), "does not hold dtype fp16"),
        (CudaArray(SHAPES["HND"], typestr="<f2", strides=(2,) * 6), "not C-contiguous"),
        (CudaArray(SHAPES["HND"], strides=(3,) * 6), "not a whole number of items"),
    ]
    for obj, message in bad:
        with pytest.raises(pkv.InvalidArgument, match=message):
            pkv.KVCache(pool, buffer=obj, device="cuda", **KW)
    ro = CudaArray(SHAPES["HND"])
    ro.__cuda_array_interface__["data"] = (0x7F0000000000, True)
    with pytest.raises(pkv.InvalidArgument, match="read-only"):
        pkv.KVCache(pool, buffer=ro, device="cuda", **KW)
    # A well-formed one needs a CUDA device: without one the backend says so.
    if pkv.HAVE_CUDA:
        pytest.skip("a CUDA build: creating the cache would touch the fake pointer")
    with pytest.raises(pkv.Unsupported, match="no CUDA"):
        pkv.KVCache(pool, buffer=CudaArray(SHAPES["HND"]), **KW)  # device inferred: cuda


def test_torch_tensors():
    torch = pytest.importorskip("torch", reason="torch is not installed in this environment")
    pool = pkv.BlockPool(N)
    t = torch.zeros(SHAPES["KV_NHD"], dtype=torch.bfloat16)
    cache = pkv.KVCache(pool, dtype="bf16", layout="KV_NHD", buffer=t, **KW)
    assert cache.data_ptr == t.data_ptr()
    t[1, 0, 2] = 3
    cache.copy_blocks([[2, 5]])
    assert bool((t[1, 0, 5] == 3).all()) and bool((t[1, 1, 5] == 0).all())
    with pytest.raises(pkv.InvalidArgument, match="layout HND needs"):
        pkv.KVCache(pool, dtype="bf16", buffer=t, **KW)
    if not torch.cuda.is_available() or not pkv.HAVE_CUDA:
        pytest.skip("no CUDA device or a build without CUDA: the CUDA tensor path is not run")
    g = torch.zeros(SHAPES["KV_NHD"], dtype=torch.float16, device="cuda")
    stream = torch.cuda.current_stream().cuda_stream
    gc = pkv.KVCache(pool, layout="KV_NHD", buffer=g, stream=stream, **KW)
    g[0, 1, 3] = 2
    gc.copy_blocks([[3, 1]], stream=stream)
    torch.cuda.current_stream().synchronize()
    assert bool((g[0, 1, 1] == 2).all())

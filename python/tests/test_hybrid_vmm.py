# SPDX-License-Identifier: MIT
"""pagedkv.HybridVMM: the hybrid-vmm layout (one VMM space per KV cache group, one
physical budget) from Python: hand-computed page runs of a full + sliding pair,
refusals that change nothing, and argument errors that name the problem."""
import pytest

import pagedkv

PAGE = 4096
FULL = {"kind": "full", "layers": 1, "kv_heads": 2, "head_dim": 64}        # 256 B/token/buffer
SWA = {"kind": "sliding", "layers": 1, "kv_heads": 2, "head_dim": 64, "window": 32}


def test_window_pages_and_budget():
    h = pagedkv.HybridVMM([FULL, SWA], budget_bytes=64 * PAGE, max_seqs=2, max_seq_len=256,
                          page_bytes=PAGE)
    assert h.buffer_token_bytes == [256, 256]
    assert h.page_bytes == [PAGE, PAGE]
    s = h.acquire()
    for n in range(1, 101):
        h.set_length(s, n)
    # 16 tokens a page: full keeps pages 0..6; the window (tokens 68..99) pages 4..6.
    assert h.pages(s) == [(0, 7), (4, 3)]
    b = h.budget
    assert b["bytes_used"] == (14 + 6) * PAGE   # K and V buffers; the window reused its pages
    h.validate()
    h.release(s)
    assert h.pages(s) == [(0, 0), (0, 0)]


def test_refusal_changes_nothing():
    h = pagedkv.HybridVMM([FULL, SWA], budget_bytes=6 * PAGE, max_seqs=1, max_seq_len=256,
                          page_bytes=PAGE)
    s = h.acquire()
    h.set_length(s, 16)                    # one page per buffer in each group: 4 of 6
    with pytest.raises(pagedkv.OutOfBlocks):
        h.set_length(s, 32)                # two per buffer in each group: 8 > 6
    assert h.pages(s) == [(0, 1), (0, 1)]
    assert h.budget["bytes_used"] == 4 * PAGE
    h.validate()


def test_errors_name_the_problem():
    with pytest.raises(pagedkv.InvalidArgument, match="budget_bytes"):
        pagedkv.HybridVMM([FULL])
    with pytest.raises(pagedkv.InvalidArgument, match="group 1: kind"):
        pagedkv.HybridVMM([FULL, {"kind": "bogus"}], budget_bytes=PAGE)
    with pytest.raises(pagedkv.InvalidArgument, match="unknown field 'windw'"):
        pagedkv.HybridVMM([dict(SWA, windw=3)], budget_bytes=PAGE)
    h = pagedkv.HybridVMM([FULL], budget_bytes=8 * PAGE, max_seq_len=64, page_bytes=PAGE)
    with pytest.raises(pagedkv.InvalidArgument, match="slot 0, 65 tokens"):
        s = h.acquire()
        h.set_length(s, 65)
    with pytest.raises(pagedkv.InvalidArgument, match="slot 3"):
        h.release(3)

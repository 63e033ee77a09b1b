#!/usr/bin/env python3
# SPDX-License-Identifier: MIT
"""One engine step and prefix-cache hits from Python: pagedkv against a pure-Python
block manager written the way vLLM v1's is (free list as a doubly linked queue of block
objects, a dict from block hash to block, per-request block lists, a numpy block table
and a vectorized slot mapping), measured side by side in one run.

Step: --seqs running sequences (prompts sharing a system prompt, so the prefix cache
is on and hit) each append one token; pagedkv does it with one SeqSet.step() call
(slot mapping + padded block tables + copy pairs). The baseline allocates a block
where one fills, hashes every block that fills (vLLM caches full blocks every step)
and builds the same slot mapping and table.

Hit: a cached prompt of k full blocks is found again. pagedkv: PrefixCache.create_seq
(hashes the tokens, finds and verifies every block, takes a reference) + SeqSet.free.
Baseline: vLLM's get_computed_blocks with the block hashes precomputed at arrival
(dict lookups, touch: ref++ and removal from the free queue) + free; and the same
including the hashing, which pagedkv's figure includes.

    python3 bench/bench_python.py            # --json for machine-readable output
"""
import argparse
import gc
import json
import platform
import statistics
import sys
import time

import numpy as np

import pagedkv as pkv


# ---------------------------------------------------------------------------------
# The baseline: vLLM v1's block manager shape, in plain Python.

class Block:
    __slots__ = ("block_id", "ref_cnt", "block_hash", "prev", "next")

    def __init__(self, block_id):
        self.block_id = block_id
        self.ref_cnt = 0
        self.block_hash = None
        self.prev = None
        self.next = None


class FreeBlockQueue:
    """Doubly linked list of free blocks (vLLM's FreeKVCacheBlockQueue): O(1) popleft,
    append and remove from the middle (a prefix hit on an evictable block)."""

    def __init__(self, blocks):
        self.num_free = len(blocks)
        self.head = Block(-1)
        self.tail = Block(-1)
        prev = self.head
        for b in blocks:
            prev.next, b.prev = b, prev
            prev = b
        prev.next, self.tail.prev = self.tail, prev

    def popleft(self):
        b = self.head.next
        if b is self.tail:
            raise ValueError("no free blocks")
        self.remove(b)
        return b

    def remove(self, b):
        b.prev.next, b.next.prev = b.next, b.prev
        b.prev = b.next = None
        self.num_free -= 1

    def append(self, b):
        last = self.tail.prev
        last.next, b.prev, b.next, self.tail.prev = b, last, self.tail, b
        self.num_free += 1


class PyBlockManager:
    def __init__(self, num_blocks, block_size, max_seqs, max_blocks_per_seq):
        self.block_size = block_size
        self.blocks = [Block(i) for i in range(num_blocks)]
        self.free_queue = FreeBlockQueue(self.blocks)
        self.cached = {}                 # block hash -> Block
        self.req_blocks = {}             # request id -> [Block]
        self.req_hashes = {}             # request id -> [hash of each full block]
        self.req_tokens = {}             # request id -> [token ids]
        self.table = np.full((max_seqs, max_blocks_per_seq), -1, dtype=np.int32)
        self.row = {}

    def _get_new_blocks(self, n):
        if n > self.free_queue.num_free:
            return None
        out = []
        for _ in range(n):
            b = self.free_queue.popleft()
            if b.block_hash is not None:          # evict it from the prefix cache
                if self.cached.get(b.block_hash) is b:
                    del self.cached[b.block_hash]
                b.block_hash = None
            b.ref_cnt = 1
            out.append(b)
        return out

    def _cache_full_blocks(self, rid):
        blocks, hashes, tokens = self.req_blocks[rid], self.req_hashes[rid], self.req_tokens[rid]
        bs = self.block_size
        while len(hashes) < len(tokens) // bs:
            i = len(hashes)
            parent = hashes[-1] if hashes else None
            h = hash((parent, tuple(tokens[i * bs:(i + 1) * bs])))
            hashes.append(h)
            b = blocks[i]
            if b.block_hash is None:
                b.block_hash = h
                self.cached.setdefault(h, b)

    def hash_blocks(self, tokens):
        bs, parent, out = self.block_size, None, []
        for i in range(len(tokens) // bs):
            parent = hash((parent, tuple(tokens[i * bs:(i + 1) * bs])))
            out.append(parent)
        return out

    def get_computed_blocks(self, hashes):
        hit = []
        for h in hashes:
            b = self.cached.get(h)
            if b is None:
                break
            hit.append(b)
        for b in hit:                               # touch
            if b.ref_cnt == 0:
                self.free_queue.remove(b)
            b.ref_cnt += 1
        return hit

    def add_request(self, rid, prompt, row):
        tokens = list(prompt)
        hashes = self.hash_blocks(tokens)
        hit = self.get_computed_blocks(hashes[:(len(tokens) - 1) // self.block_size])
        need = -(-len(tokens) // self.block_size) - len(hit)
        new = self._get_new_blocks(need)
        self.req_blocks[rid] = hit + new
        self.req_hashes[rid] = [b.block_hash for b in hit]
        self.req_tokens[rid] = tokens
        self.row[rid] = row
        self.table[row, :len(self.req_blocks[rid])] = [b.block_id for b in self.req_blocks[rid]]
        self._cache_full_blocks(rid)

    def free(self, rid):
        for b in reversed(self.req_blocks.pop(rid)):
            b.ref_cnt -= 1
            if b.ref_cnt == 0:
                self.free_queue.append(b)
        del self.req_hashes[rid], self.req_tokens[rid], self.row[rid]

    def step(self, rids, new_tokens, hashing=True):
        """One decode step: one token per request. Returns the slot mapping and the
        block table rows (the worker's persistent numpy table, updated in place)."""
        bs = self.block_size
        positions = np.empty(len(rids), dtype=np.int64)
        rows = np.empty(len(rids), dtype=np.int64)
        for i, rid in enumerate(rids):
            tokens, blocks = self.req_tokens[rid], self.req_blocks[rid]
            pos = len(tokens)
            if pos // bs == len(blocks):           # the last block is full: a new one
                new = self._get_new_blocks(1)
                if new is None:
                    raise MemoryError("out of blocks")
                blocks.append(new[0])
                self.table[self.row[rid], len(blocks) - 1] = new[0].block_id
            tokens.append(new_tokens[i])
            if hashing and (pos + 1) % bs == 0:
                self._cache_full_blocks(rid)
            positions[i] = pos
            rows[i] = self.row[rid]
        block_ids = self.table[rows, positions // bs]
        slots = block_ids.astype(np.int64) * bs + positions % bs
        width = int(positions.max()) // bs + 1 if len(rids) else 0
        return slots, self.table[rows, :width]  # the tables, as wide as the longest


# ---------------------------------------------------------------------------------

RUNS = 11


def loop(fn, times, *args):
    """Call fn(*args) `times` times, dropping each result as an engine would."""
    for _ in range(times):
        fn(*args)


def timed(fn, repeat):
    """Seconds per call (fn makes `repeat` calls): (median, best) of RUNS runs."""
    runs = []
    for _ in range(RUNS):
        gc.disable()
        t0 = time.perf_counter()
        fn()
        runs.append((time.perf_counter() - t0) / repeat)
        gc.enable()
    return statistics.median(runs), min(runs)


def bench_step(args, rng):
    bs, n, steps = args.block_size, args.seqs, args.steps
    system = rng.integers(0, 32000, size=args.system_tokens).astype(np.int32)
    prompts = [np.concatenate([system, rng.integers(0, 32000, size=int(rng.integers(16, 512)))
                               .astype(np.int32)]) for _ in range(n)]
    max_len = max(len(p) for p in prompts) + RUNS * steps + 1
    max_blocks = -(-max_len // bs)
    blocks = n * max_blocks + 64
    ones = np.ones(n, dtype=np.int32)
    tokens = rng.integers(0, 32000, size=n).astype(np.int32).tolist()
    out = {}

    def pagedkv_state():
        """A pool, a set attached to a prefix cache, the prompts through create_seq."""
        pool = pkv.BlockPool(blocks)
        seqs = pkv.SeqSet(pool, bs)
        cache = pkv.PrefixCache(pool, bs)
        cache.attach(seqs)
        ids = []
        for p in prompts:
            sid, cached = cache.create_seq(seqs, p)
            seqs.append(sid, len(p) - cached)
            cache.insert(seqs, sid, p)
            ids.append(sid)
        return pool, seqs, cache, np.array(ids, dtype=np.int32)

    # Each variant starts from the same fresh state (sequences grow RUNS x steps tokens).
    pool, seqs, cache, ids = pagedkv_state()
    out["pagedkv step(), padded tables"] = timed(lambda: loop(seqs.step, steps, ids, ones), steps)
    seqs.validate()
    pool, seqs, cache, ids = pagedkv_state()
    out["pagedkv step(), CSR tables"] = timed(
        lambda: loop(lambda i, c: seqs.step(i, c, tables="csr"), steps, ids, ones), steps)
    pool, seqs, cache, ids = pagedkv_state()
    out["pagedkv append_batch() only"] = timed(
        lambda: loop(seqs.append_batch, steps, ids, ones), steps)

    def python_state():
        py = PyBlockManager(blocks, bs, n, max_blocks)
        for i, p in enumerate(prompts):
            py.add_request(i, p.tolist(), i)
        return py

    rids = list(range(n))
    py = python_state()
    out["python baseline step"] = timed(lambda: loop(py.step, steps, rids, tokens), steps)
    py = python_state()
    out["python baseline step, no hashing"] = timed(
        lambda: loop(lambda r, t: py.step(r, t, hashing=False), steps, rids, tokens), steps)
    return out


def bench_hit(args, rng, k):
    """Per block: a hit on a cached prefix of k full blocks, then its release."""
    bs = args.block_size
    prompt = rng.integers(0, 32000, size=k * bs + 1).astype(np.int32)  # k full + 1
    reps = max(20, 20000 // k)
    out = {}
    pool = pkv.BlockPool(4 * k + 16)
    seqs = pkv.SeqSet(pool, bs)
    cache = pkv.PrefixCache(pool, bs)
    cache.attach(seqs)
    sid, _ = cache.create_seq(seqs, prompt)
    seqs.append(sid, len(prompt))
    cache.insert(seqs, sid, prompt)
    seqs.free(sid)  # the blocks are now held by the cache alone (evictable): the worst case
    sid, cached = cache.create_seq(seqs, prompt)
    assert cached == k * bs
    seqs.free(sid)

    def run_pkv():
        for _ in range(reps):
            seqs.free(cache.create_seq(seqs, prompt)[0])
    med, best = timed(run_pkv, reps)
    out["pagedkv_hit_free"] = (med / k, best / k)

    def run_match():
        for _ in range(reps):
            cache.match(prompt)
    med, best = timed(run_match, reps)
    out["pagedkv_match"] = (med / k, best / k)

    py = PyBlockManager(4 * k + 16, bs, 1, k + 1)
    tokens = prompt.tolist()
    py.add_request(0, tokens, 0)
    py.free(0)
    hashes = py.hash_blocks(tokens)

    def run_py():
        for _ in range(reps):
            hit = py.get_computed_blocks(hashes)
            for b in reversed(hit):
                b.ref_cnt -= 1
                if b.ref_cnt == 0:
                    py.free_queue.append(b)
    med, best = timed(run_py, reps)
    out["python_hit_free"] = (med / k, best / k)

    def run_py_hash():
        for _ in range(reps):
            hit = py.get_computed_blocks(py.hash_blocks(tokens))
            for b in reversed(hit):
                b.ref_cnt -= 1
                if b.ref_cnt == 0:
                    py.free_queue.append(b)
    med, best = timed(run_py_hash, reps)
    out["python_hash_hit_free"] = (med / k, best / k)
    return out


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--seqs", type=int, default=256)
    ap.add_argument("--block-size", type=int, default=16)
    ap.add_argument("--steps", type=int, default=100, help="steps per timed run")
    ap.add_argument("--system-tokens", type=int, default=512)
    ap.add_argument("--hit-blocks", type=int, nargs="+", default=[16, 64, 256])
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args(argv)
    if min(args.seqs, args.block_size, args.steps, *args.hit_blocks) < 1:
        ap.error("sizes must be >= 1")
    if not pkv.HAVE_BATCH:
        print("bench_python: this build lacks the batch calls", file=sys.stderr)
        return 1
    rng = np.random.default_rng(args.seed)
    res = {"python": platform.python_version(), "numpy": np.__version__,
           "seqs": args.seqs, "block_size": args.block_size,
           "step": bench_step(args, rng),
           "hit": {str(k): bench_hit(args, rng, k) for k in args.hit_blocks}}
    if args.json:
        json.dump(res, sys.stdout, indent=1)
        print()
        return 0
    n = args.seqs
    print(f"# one engine step: {n} sequences x 1 token, block {args.block_size}, prefix cache on"
          f" (Python {res['python']}, numpy {res['numpy']})")
    print(f"{'what':34s} {'us/step':>9s} {'best':>9s} {'ns/seq':>8s}")
    for key, (med, best) in res["step"].items():
        print(f"{key:34s} {med * 1e6:9.2f} {best * 1e6:9.2f} {med * 1e9 / n:8.1f}")
    s = res["step"]
    print(f"baseline / pagedkv step (padded): "
          f"{s['python baseline step'][0] / s['pagedkv step(), padded tables'][0]:.1f}x")
    print(f"\n# prefix-cache hit, per block (block {args.block_size})")
    print(f"{'what':34s} " + " ".join(f"{'k=' + k:>10s}" for k in res["hit"]))
    for key in next(iter(res["hit"].values())):
        print(f"{key + ' (ns/block)':34s} " +
              " ".join(f"{res['hit'][k][key][0] * 1e9:10.1f}" for k in res["hit"]))
    return 0


if __name__ == "__main__":
    sys.exit(main())

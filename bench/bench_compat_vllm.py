#!/usr/bin/env python3
# SPDX-License-Identifier: MIT
"""pagedkv.compat.vllm.BlockPool against a faithful pure-Python copy of vLLM v1's
BlockPool algorithm (written here, not imported: installing vllm is too heavy for a
shared CPU machine), side by side in one run, plus a 256-sequence engine step on
pagedkv.PrefixPool with lazy eviction and KV events on.

Operations (median of repeats, per call):
  alloc1     get_new_blocks(1) + free_blocks of it
  alloc128   get_new_blocks(128) + free_blocks of them (reversed)
  hit k      a cached prompt of k blocks found again: get_cached_block per hash
             (stops at the first miss, as find_longest_cache_hit does) + touch + free
  cache128   cache_full_blocks of 128 freshly allocated blocks (+ free)
  step       256 sequences append one token; the filled blocks are hashed and cached
             in one PrefixPool.hash_and_cache call (BlockStored each) and new ones
             allocated from the queue (evicting cached blocks lazily, BlockRemoved);
             events drained once per step: a tuple per event (take_events), packed
             (take_events_packed), and packed without token ids

compat.vllm is measured twice: events with token ids (vLLM's) and without
(BlockPool(..., event_token_ids=False)).

    python3 bench/bench_compat_vllm.py [--json]
"""
import argparse
import gc
import hashlib
import json
import operator
import platform
import statistics
import time

import numpy as np

import pagedkv
from pagedkv.compat import vllm as V


# ------------------------------------------------------------------ the baseline

class PyBlock:
    __slots__ = ("block_id", "ref_cnt", "block_hash", "prev_free_block", "next_free_block",
                 "is_null")

    def __init__(self, block_id):
        self.block_id = block_id
        self.ref_cnt = 0
        self.block_hash = None
        self.prev_free_block = None
        self.next_free_block = None
        self.is_null = False


class PyFreeQueue:
    """vLLM's FreeKVCacheBlockQueue: a doubly linked list with fake head and tail."""

    def __init__(self, blocks):
        self.num_free_blocks = len(blocks)
        self.head = PyBlock(-1)
        self.tail = PyBlock(-1)
        prev = self.head
        for b in blocks:
            prev.next_free_block, b.prev_free_block = b, prev
            prev = b
        prev.next_free_block, self.tail.prev_free_block = self.tail, prev

    def popleft(self):
        b = self.head.next_free_block
        self.remove(b)
        return b

    def popleft_n(self, n):
        out = []
        b = self.head.next_free_block
        for _ in range(n):
            out.append(b)
            nxt = b.next_free_block
            b.prev_free_block = b.next_free_block = None
            b = nxt
        self.head.next_free_block, b.prev_free_block = b, self.head
        self.num_free_blocks -= n
        return out

    def remove(self, b):
        b.prev_free_block.next_free_block = b.next_free_block
        b.next_free_block.prev_free_block = b.prev_free_block
        b.prev_free_block = b.next_free_block = None
        self.num_free_blocks -= 1

    def append_n(self, blocks):
        if not blocks:
            return
        last = self.tail.prev_free_block
        for b in blocks:
            b.prev_free_block, last.next_free_block = last, b
            last = b
        last.next_free_block, self.tail.prev_free_block = self.tail, last
        self.num_free_blocks += len(blocks)

    def prepend_n(self, blocks):
        if not blocks:
            return
        first = self.head.next_free_block
        prev = self.head
        for b in blocks:
            b.prev_free_block, prev.next_free_block = prev, b
            prev = b
        prev.next_free_block, first.prev_free_block = first, prev
        self.num_free_blocks += len(blocks)


class PyBlockPool:
    """vLLM v1 BlockPool's algorithm in plain Python (one group)."""

    def __init__(self, num_blocks, events=True):
        self.blocks = [PyBlock(i) for i in range(num_blocks)]
        self.free_block_queue = PyFreeQueue(self.blocks)
        self.cached = {}
        self.null_block = self.free_block_queue.popleft()
        self.null_block.is_null = True
        self.events_on = events
        self.events = []

    def get_cached_block(self, h, group_ids):
        out = []
        for g in group_ids:
            d = self.cached.get(h + g.to_bytes(4, "big"))
            if not d:
                return None
            out.append(next(iter(d.values())))
        return out

    def cache_full_blocks(self, request, blocks, num_cached, num_full, block_size, group):
        new_hashes = []
        for i, blk in enumerate(blocks[num_cached:num_full]):
            h = request.block_hashes[num_cached + i]
            key = h + group.to_bytes(4, "big")
            blk.block_hash = key
            self.cached.setdefault(key, {})[blk.block_id] = blk
            new_hashes.append(h)
        if self.events_on:
            self.events.append(("BlockStored", new_hashes,
                                request.block_hashes[num_cached - 1] if num_cached else None,
                                request.all_token_ids[num_cached * block_size:num_full * block_size],
                                block_size, None, "GPU"))

    def _maybe_evict(self, b):
        key = b.block_hash
        if key is None:
            return
        d = self.cached.get(key)
        if d is not None and d.pop(b.block_id, None) is not None:
            if not d:
                del self.cached[key]
            b.block_hash = None
            if self.events_on:
                self.events.append(("BlockRemoved", [key[:-4]], "GPU"))

    def get_new_blocks(self, n):
        if n > self.free_block_queue.num_free_blocks:
            raise ValueError("not enough blocks")
        ret = self.free_block_queue.popleft_n(n)
        for b in ret:
            self._maybe_evict(b)
            b.ref_cnt += 1
        return ret

    def touch(self, blocks):
        for b in blocks:
            if b.ref_cnt == 0 and not b.is_null:
                self.free_block_queue.remove(b)
            b.ref_cnt += 1

    def free_blocks(self, ordered):
        with_hash, without = [], []
        for b in ordered:
            b.ref_cnt -= 1
            if b.ref_cnt == 0 and not b.is_null:
                (without if b.block_hash is None else with_hash).append(b)
        self.free_block_queue.prepend_n(without)
        self.free_block_queue.append_n(with_hash)

    def take_events(self):
        ev, self.events = self.events, []
        return ev


# ------------------------------------------------------------------ timing


def median_us(fn, repeat, inner):
    """Median over `repeat` samples of `inner` calls each, the cyclic garbage collector
    paused while a sample runs (as bench_python.py does: an engine's step allocates no
    cycles; a collection landing in one sample measures the process, not the call)."""
    samples = []
    for _ in range(repeat):
        gc.disable()
        t0 = time.perf_counter()
        for _ in range(inner):
            fn()
        samples.append((time.perf_counter() - t0) / inner)
        gc.enable()
    return statistics.median(samples) * 1e6


class Req:
    def __init__(self, rid, tokens, block_size):
        self.request_id = rid
        self.all_token_ids = tokens
        self.lora_request = None
        self.block_hashes = [hashlib.sha256(repr((rid, i)).encode()).digest()
                             for i in range(len(tokens) // block_size)]


def bench_ops(make_pool, repeat):
    pool = make_pool(4096)
    out = {}

    def alloc1():
        pool.free_blocks(pool.get_new_blocks(1))
    out["alloc1"] = median_us(alloc1, repeat, 200)

    def alloc128():
        pool.free_blocks(list(reversed(pool.get_new_blocks(128))))
    out["alloc128"] = median_us(alloc128, repeat, 20)

    for k in (16, 128):
        req = Req(f"hit{k}", list(range(16 * k)), 16)
        blocks = pool.get_new_blocks(k)
        pool.cache_full_blocks(req, blocks, 0, k, 16, 0)
        pool.free_blocks(list(reversed(blocks)))
        pool.take_events()
        hashes = req.block_hashes

        def hit():
            got = []
            for h in hashes:
                b = pool.get_cached_block(h, (0,))
                if b is None:
                    break
                got.append(b[0])
            pool.touch(got)
            pool.free_blocks(list(reversed(got)))
        out[f"hit{k}"] = median_us(hit, repeat, 20)

    reqs = [Req(f"c{i}", list(range(16 * 128)), 16) for i in range(repeat * 5 + 1)]
    counter = [0]

    def cache128():  # requests hashed beforehand: the pool's work only
        counter[0] += 1
        req = reqs[counter[0]]
        blocks = pool.get_new_blocks(128)
        pool.cache_full_blocks(req, blocks, 0, 128, 16, 0)
        pool.free_blocks(list(reversed(blocks)))
        pool.take_events()
    out["cache128"] = median_us(cache128, repeat, 5)
    return out


STEP_VARIANTS = {  # name: (drain, token ids in the events)
    "tuple drain (take_events)": ("tuples", True),
    "packed drain (take_events_packed)": ("packed", True),
    "packed drain, no token ids": ("packed", False),
}


def gatherer(idx):
    """x -> (x[i] for i in idx) as a tuple, in one C call when idx has several entries."""
    if len(idx) == 1:
        i = idx[0]
        return lambda x: (x[i],)
    return operator.itemgetter(*idx) if idx else (lambda x: ())


def make_step(drain="packed", event_tokens=True, seqs=256, block_size=16, num_blocks=4096):
    """One engine step on pagedkv.PrefixPool. Every sequence grows one token a step,
    so the sequences whose block fills at step t are known ahead (an engine knows its
    requests' lengths): bucket them by phase instead of scanning 256 lengths. The
    tokens of the blocks being filled come from a table the step only reads (an engine
    has them from its sampler; drawing random numbers is not the pool's cost).
    drain: "tuples" (take_events: a tuple per event) or "packed" (take_events_packed);
    event_tokens: BlockStored events carry the blocks' token ids. Returns the step,
    warmed up, as a function that returns the number of events it drained."""
    pool = pagedkv.PrefixPool(num_blocks, event_capacity=4096)
    hasher = pagedkv.BlockHasher("xxh3_128" if "xxh3_128" in pagedkv.HASH_ALGOS else "fnv1a_64")
    rng = np.random.default_rng(0)
    start = rng.integers(1, block_size, seqs)  # staggered: about seqs/block_size fills a step
    buckets = [[] for _ in range(block_size)]
    for s in range(seqs):
        buckets[(block_size - int(start[s])) % block_size].append(s)
    bucket_ids = [list(b) for b in buckets]
    # one C call gathers a bucket's entries of a per-sequence list (a tuple)
    gather = [gatherer(b) for b in buckets]
    # the filled blocks' tokens, one row per sequence; a step's rows in one flat array
    # (distinct per round so that hashes differ and the cache keeps turning over)
    rounds = 64
    flat = [[rng.integers(0, 50000, (len(b), block_size), dtype=np.int32).ravel() for b in buckets]
            for _ in range(rounds)]
    tables = [pool.get_new_blocks(1) for _ in range(seqs)]
    last_block = [t[-1] for t in tables]
    last_hash = [None] * seqs
    clock = [0]
    take = (pool.take_events if drain == "tuples"
            else (lambda: pool.take_events_packed(tokens=event_tokens)))

    def step():
        c = clock[0] = clock[0] + 1
        phase = c % block_size
        ids = bucket_ids[phase]
        if ids:
            new = pool.get_new_blocks(len(ids))  # lazy eviction happens here
            # Hash and cache every filled block in one call (one BlockStored each).
            g = gather[phase]
            hashes = pool.hash_and_cache(hasher, g(last_block), flat[(c // block_size) % rounds][phase],
                                         g(last_hash), block_size, event_tokens=event_tokens)
            for s, b, h in zip(ids, new, hashes):
                t = tables[s]
                t.append(b)
                last_block[s] = b
                last_hash[s] = h
                if len(t) > 12:  # retire long sequences: their blocks stay cached
                    pool.free_blocks(t[::-1])
                    t = tables[s] = pool.get_new_blocks(1)
                    last_block[s] = t[0]
                    last_hash[s] = None
        return take()

    # warm up until the queue cycles through cached blocks (lazy eviction is live)
    for _ in range(2000):
        step()
    if drain == "tuples":
        return lambda: len(step())
    return lambda: len(step()[0])


def bench_steps(repeat, inner=16, turn=20):
    """The step variants side by side: `repeat` rounds in which each variant in turn
    runs `turn` samples of `inner` steps (16: every phase once), so that the other
    tenants' load hits them alike while each keeps its caches warm for a while (taking
    turns sample by sample measured the cache misses of switching pools). Short
    samples and the median keep a preempted sample from counting; the best sample is
    closer to what an idle core shows. Returns {variant: (median us, best us, events
    a step)}."""
    steps = {k: make_step(drain, tok) for k, (drain, tok) in STEP_VARIANTS.items()}
    samples = {k: [] for k in steps}
    events = {k: [] for k in steps}
    for _ in range(repeat):
        for k, step in steps.items():
            for _ in range(turn):
                ev = 0
                gc.disable()
                t0 = time.perf_counter()
                for _ in range(inner):
                    ev += step()
                samples[k].append((time.perf_counter() - t0) / inner * 1e6)
                gc.enable()
                events[k].append(ev / inner)
    return {k: (statistics.median(v), min(v), statistics.mean(events[k])) for k, v in samples.items()}


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--repeat", type=int, default=15)
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args(argv)
    ours = bench_ops(lambda n: V.BlockPool(n, enable_kv_cache_events=True), a.repeat)
    base = bench_ops(lambda n: PyBlockPool(n, events=True), a.repeat)
    ours_notok = bench_ops(lambda n: V.BlockPool(n, enable_kv_cache_events=True,
                                                 event_token_ids=False), a.repeat)
    steps = bench_steps(a.repeat)
    res = {"machine": platform.processor() or platform.machine(), "python": platform.python_version(),
           "compat_vllm_us": ours, "compat_vllm_no_token_ids_us": ours_notok, "pure_python_us": base,
           "ratio": {k: base[k] / ours[k] for k in ours},
           "step_us": {k: v[0] for k, v in steps.items()},
           "step_best_us": {k: v[1] for k, v in steps.items()},
           "events_per_step": {k: v[2] for k, v in steps.items()}}
    if a.json:
        print(json.dumps(res, indent=1))
        return
    print(f"{'op':10} {'compat.vllm us':>15} {'pure-Python us':>15} {'ratio':>7} "
          f"{'no token ids us':>16} {'ratio':>7}")
    for k in ours:
        print(f"{k:10} {ours[k]:15.2f} {base[k]:15.2f} {base[k] / ours[k]:6.1f}x "
              f"{ours_notok[k]:16.2f} {base[k] / ours_notok[k]:6.1f}x")
    print("256-sequence step on PrefixPool (lazy eviction, events on); variants take turns, "
          f"{20 * a.repeat} samples of 16 steps each:")
    print(f"  {'variant':36} {'median us':>9} {'ratio':>6} {'best us':>8} {'ratio':>6}  events/step")
    first = next(iter(steps.values()))
    for k, (med, best, ev) in steps.items():
        print(f"  {k:36} {med:9.2f} {first[0] / med:5.2f}x {best:8.2f} {first[1] / best:5.2f}x  {ev:.1f}")


if __name__ == "__main__":
    main()

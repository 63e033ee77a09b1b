#!/usr/bin/env python3
# SPDX-License-Identifier: MIT
"""A scheduler-facing KV-cache manager over pagedkv, shaped like vLLM v1's
KVCacheManager, driving a toy continuous-batching decode loop.

BlockManager is what an engine's scheduler talks to:
  get_computed_blocks(tokens)   computed-prefix lookup (no side effect)
  allocate_prompt(req)          admit: reuse the cached prefix, take the rest, or None
  allocate_slots(seqs, counts)  one call per step: slot mapping, block tables, copies,
                                or None when the pool is short (the caller preempts)
  fork(seq)                     parallel sampling: share every block
  cache_blocks(seq, tokens)     offer written full blocks to the prefix cache
  free(seqs)                    release

The toy model proves the bookkeeping right: each token's K is its id, written at the
slot the manager gave; the next token is a function of the history *read back through
the block tables*, so a wrong slot, table, copy-on-write copy or prefix hit changes the
output, which is checked against a plain-Python reference that knows nothing of paging.
Preemption is by recompute (vLLM's default): the request restarts from its prompt.

    python3 examples/python/block_manager.py --requests 40 --blocks 96
"""
import argparse
import collections
import sys
import time

import numpy as np

import pagedkv as pkv

VOCAB = 1000


def next_token(history_sum, length, sample):
    """The toy model: the next token from the history (its sum and length)."""
    return (int(history_sum) * 31 + length * 7 + sample * 13) % VOCAB


class Request:
    def __init__(self, request_id, prompt, max_tokens, n=1):
        self.request_id = request_id
        self.prompt = np.asarray(prompt, dtype=np.int32)
        self.max_tokens = max_tokens
        self.n = n
        self.reset()

    def reset(self):
        self.seqs = []      # one pagedkv sequence id per sample
        self.outputs = []   # generated tokens per sample
        self.cached_tokens = 0

    @property
    def finished(self):
        return bool(self.outputs) and all(len(o) >= self.max_tokens for o in self.outputs)


class BlockManager:
    """vLLM-v1-style KV cache manager: block pool, prefix cache and KV memory in pagedkv,
    scheduler-facing calls in batches."""

    def __init__(self, num_blocks, block_size, *, enable_caching=True, watermark_blocks=0,
                 num_layers=1, kv_heads=1, head_dim=1):
        self.block_size = block_size
        self.pool = pkv.BlockPool(num_blocks)
        self.seqs = pkv.SeqSet(self.pool, block_size)
        self.prefix = pkv.PrefixCache(self.pool, block_size) if enable_caching else None
        if self.prefix is not None:
            self.prefix.attach(self.seqs)
        if watermark_blocks:
            self.seqs.set_watermark(watermark_blocks)
        self.kv = pkv.KVCache(self.pool, num_layers=num_layers, kv_heads=kv_heads,
                              head_dim=head_dim, block_size=block_size, dtype="fp32")

    # -- lookups --
    def get_computed_blocks(self, tokens):
        """Leading tokens of `tokens` already in the prefix cache (no side effect)."""
        if self.prefix is None:
            return 0
        return self.prefix.match(tokens)["cached_tokens"]

    @property
    def usage(self):
        return 1.0 - self.pool.free_count / self.pool.capacity

    # -- allocation --
    def allocate_prompt(self, req):
        """A sequence for the prompt, sharing its cached prefix; slots of the tokens to
        prefill. None (and nothing held) when the pool cannot take the rest."""
        if self.prefix is not None:
            seq, cached = self.prefix.create_seq(self.seqs, req.prompt)
        else:
            seq, cached = self.seqs.create(), 0
        rest = len(req.prompt) - cached
        try:
            self._make_room(self.seqs.blocks_needed(seq, rest))
            slots = self.seqs.append(seq, rest)
        except pkv.OutOfBlocks:
            self.seqs.free(seq)  # its cached blocks become evictable again
            return None
        req.seqs, req.cached_tokens = [seq], cached
        return slots

    def allocate_slots(self, seq_ids, counts):
        """One engine step: append counts[i] tokens to seq_ids[i] for all i, or None
        when the pool is short even after evicting unused cached blocks."""
        seq_ids = np.asarray(seq_ids, dtype=np.int32)
        counts = np.asarray(counts, dtype=np.int32)
        try:
            self._make_room(self.seqs.blocks_needed_batch(seq_ids, counts))
            return self.seqs.step(seq_ids, counts)
        except pkv.OutOfBlocks:
            return None

    def _make_room(self, need):
        """Evict unused cached blocks (LRU) when the free ones do not cover `need`."""
        need += self.seqs.watermark
        if need > self.pool.free_count and self.prefix is not None:
            self.prefix.reclaim(need)  # OutOfBlocks when even eviction is not enough

    def fork(self, seq):
        return self.seqs.fork(seq)

    def cache_blocks(self, seq, tokens):
        if self.prefix is not None:
            self.prefix.insert(self.seqs, seq, tokens)

    def free(self, seq_ids):
        self.seqs.free_batch(np.asarray(seq_ids, dtype=np.int32))


class ToyEngine:
    """Continuous batching over BlockManager: decode the running requests (one
    allocate_slots call), preempt when short, retire finished ones, admit new ones."""

    def __init__(self, manager, max_batch=64):
        self.m = manager
        self.max_batch = max_batch
        self.waiting = collections.deque()
        self.running = []
        self.done = []
        self.stats = collections.Counter()
        arena = manager.kv.numpy()          # [layers, blocks, 2, heads, block, dim]
        self.K = arena[0, :, 0, 0, :, 0]    # [blocks, block_size]: token ids, a view

    def write(self, slots, tokens):
        b = self.m.block_size
        self.K[slots // b, slots % b] = tokens

    def history_sum(self, table_row, length):
        """Attention, toy-sized: read a sequence's K through its block table."""
        b = self.m.block_size
        nblocks = -(-length // b)
        ks = self.K[table_row[:nblocks]].reshape(-1)[:length]
        return float(ks.sum(dtype=np.float64))

    def step(self):
        self.decode()
        self.retire()
        self.admit()
        self.stats["steps"] += 1

    def decode(self):
        while self.running:
            # a request can finish at its prefill (max_tokens 1): it only retires
            pairs = [(r, s) for r in self.running if not r.finished for s in range(r.n)]
            if not pairs:
                return
            ids = [r.seqs[s] for r, s in pairs]
            res = self.m.allocate_slots(ids, np.ones(len(ids), dtype=np.int32))
            if res is not None:
                break
            self.preempt(self.running.pop())  # the newest request goes back to the queue
        else:
            return
        if len(res.copies):
            self.m.kv.copy_blocks(res.copies)   # copy-on-write before any K/V write
            self.stats["cow_copies"] += len(res.copies)
        last = np.array([r.outputs[s][-1] for r, s in pairs], dtype=np.float32)
        self.write(res.slot_mapping, last)
        for i, (r, s) in enumerate(pairs):
            length = int(res.context_lens[i])
            total = self.history_sum(res.block_tables[i], length)
            r.outputs[s].append(next_token(total, length, s))
        self.stats["decoded_tokens"] += len(pairs)

    def preempt(self, req):
        self.m.free(req.seqs)
        req.reset()
        self.waiting.appendleft(req)
        self.stats["preemptions"] += 1

    def retire(self):
        still = []
        for r in self.running:
            if r.finished:
                full = np.concatenate([r.prompt, np.array(r.outputs[0][:-1], np.int32)])
                self.m.cache_blocks(r.seqs[0], full)
                self.m.free(r.seqs)
                self.done.append(r)
            else:
                still.append(r)
        self.running = still

    def admit(self):
        while self.waiting and len(self.running) < self.max_batch:
            req = self.waiting[0]
            slots = self.m.allocate_prompt(req)
            if slots is None:
                return
            self.waiting.popleft()
            seq, cached = req.seqs[0], req.cached_tokens
            table = self.m.seqs.block_table(seq)
            b = self.m.block_size
            if cached:  # a prefix hit must hand back exactly these tokens' K
                got = self.K[table[:cached // b]].reshape(-1)[:cached]
                assert (got == req.prompt[:cached]).all(), "prefix cache returned wrong K"
                self.stats["prefix_hit_tokens"] += cached
            self.write(slots, req.prompt[cached:].astype(np.float32))  # prefill
            self.m.cache_blocks(seq, req.prompt)
            total = self.history_sum(table, len(req.prompt))
            req.outputs = [[next_token(total, len(req.prompt), 0)]]
            for s in range(1, req.n):  # parallel samples share the prompt's blocks
                req.seqs.append(self.m.fork(seq))
                req.outputs.append([next_token(total, len(req.prompt), s)])
            self.running.append(req)
            self.stats["prefill_tokens"] += len(req.prompt) - cached

    def run(self, requests):
        self.waiting.extend(requests)
        while self.waiting or self.running:
            self.step()
            if self.stats["steps"] > 100_000:
                raise RuntimeError("no progress")


def reference(req):
    """The outputs without any cache: the history is kept in a Python list."""
    outs = []
    for s in range(req.n):
        hist = [int(t) for t in req.prompt]
        out = []
        while len(out) < req.max_tokens:
            out.append(next_token(sum(hist), len(hist), s))
            hist.append(out[-1])
        outs.append(out)
    return outs


def make_requests(count, seed, block_size):
    rng = np.random.default_rng(seed)
    system = rng.integers(0, VOCAB, size=3 * block_size + 5)  # a shared system prompt
    reqs = []
    for i in range(count):
        own = rng.integers(0, VOCAB, size=int(rng.integers(1, 4 * block_size)))
        prompt = np.concatenate([system, own]) if rng.random() < 0.6 else own
        reqs.append(Request(i, prompt, int(rng.integers(1, 3 * block_size)),
                            n=int(rng.choice([1, 1, 2, 3]))))
    return reqs


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--requests", type=int, default=40)
    ap.add_argument("--blocks", type=int, default=96, help="KV blocks in the pool")
    ap.add_argument("--block-size", type=int, default=16)
    ap.add_argument("--max-batch", type=int, default=32)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--no-prefix-caching", action="store_true")
    args = ap.parse_args(argv)
    if args.requests < 1 or args.blocks < 1 or args.block_size < 1 or args.max_batch < 1:
        ap.error("sizes must be >= 1")
    if not pkv.HAVE_BATCH:
        print("block_manager: this pagedkv build lacks the batch calls "
              "(pkv_seqset_append_batch)", file=sys.stderr)
        return 1
    try:
        manager = BlockManager(args.blocks, args.block_size,
                               enable_caching=not args.no_prefix_caching)
    except pkv.PagedKVError as e:
        print(f"block_manager: {e}", file=sys.stderr)
        return 2
    engine = ToyEngine(manager, args.max_batch)
    reqs = make_requests(args.requests, args.seed, args.block_size)
    longest = max(len(r.prompt) + r.max_tokens for r in reqs)
    if -(-longest // args.block_size) * max(r.n for r in reqs) > args.blocks:
        ap.error(f"--blocks {args.blocks} cannot hold the longest request alone")
    t0 = time.perf_counter()
    engine.run(reqs)
    elapsed = time.perf_counter() - t0
    wrong = [r.request_id for r in engine.done if r.outputs != reference(r)]
    manager.seqs.validate()
    st = engine.stats
    print(f"requests {len(engine.done)}  steps {st['steps']}  decoded {st['decoded_tokens']}  "
          f"prefill {st['prefill_tokens']}  prefix-hit tokens {st['prefix_hit_tokens']}  "
          f"cow copies {st['cow_copies']}  preemptions {st['preemptions']}  "
          f"{elapsed * 1e3:.1f} ms")
    if wrong or len(engine.done) != len(reqs):
        print(f"block_manager: FAILED: outputs differ from the reference for {wrong}",
              file=sys.stderr)
        return 1
    print("block_manager: ok, every output equals the reference")
    return 0


if __name__ == "__main__":
    sys.exit(main())

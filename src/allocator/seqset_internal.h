// SPDX-License-Identifier: MIT
// Internal: what other allocator files (the prefix cache) need from a sequence
// set beyond the public API. Dependencies point one way: prefix_cache.c uses the
// set; the set knows no cache, only a hook that someone registered on it.
#ifndef PKV_SEQSET_INTERNAL_H
#define PKV_SEQSET_INTERNAL_H

#include "pkv/seq.h"

// Append one full block that already holds K/V (a prefix-cache hit) to sequence
// `id`, whose length must be a multiple of the block size: the table grows by
// `block` (one more pool reference) and the length by block_size.
// PKV_ERR_LIMIT if the block's refcount cannot grow.
pkv_status pkvi_seq_adopt_block(pkv_seqset *set, pkv_seq_id id, pkv_block_id block);

// Append one hole (PKV_BLOCK_NONE, seq.h) to sequence `id`, whose table must hold
// only holes so far and whose length must be a multiple of the block size: the
// table grows by a released entry and the length by block_size, no pool reference
// taken. A windowed group's prefix hit starts with holes before its window.
pkv_status pkvi_seq_adopt_hole(pkv_seqset *set, pkv_seq_id id);

// Called by the set after a release brought `block`'s refcount down to exactly 1
// (whoever holds the last reference, if anyone besides the set's pins, now holds
// it alone). ctx is the pointer given at registration.
typedef void (*pkvi_unused_hook)(void *ctx, pkv_block_id block);

// Register (fn, ctx) on the set, or clear it with fn = NULL. One hook per set.
void pkvi_seqset_set_hook(pkv_seqset *set, pkvi_unused_hook fn, void *ctx);
// The ctx of the registered hook, NULL if none.
void *pkvi_seqset_hook_ctx(const pkv_seqset *set);

// 1 if some live sequence of the set, or a queued copy's pin, holds a block for
// which held(ctx, block) returns nonzero.
int pkvi_seqset_holds_any(const pkv_seqset *set, int (*held)(const void *ctx, pkv_block_id b),
                          const void *ctx);

// A move of sequences between sets in steps, for a caller that moves several sets
// all or nothing (the hybrid manager's swap): pkv_seq_move_group is plan, then
// reserve, then commit. Plan (checks ids as pkv_seq_move_group, counts the
// distinct live blocks into `blocks`) and reserve (takes new_ids[0..n-1] in `to`,
// caller-owned; different pools, same block size, else PKV_ERR_INVALID_ARG) may
// fail and change nothing a caller sees; after a successful reserve the caller
// checks that `to`'s pool has `blocks` free blocks, then commit cannot fail (but
// for PKV_ERR_CORRUPT): it takes the blocks, fills the tables, frees the sequences
// in `from` and writes `blocks` pairs {src, dst} (increasing src). Abort undoes a
// plan or a reservation. Commit and abort free the plan; ids and new_ids are
// borrowed until then.
typedef struct pkvi_seq_move {
    pkv_seqset *from, *to;   // to: set by reserve
    const pkv_seq_id *ids;   // [n] in from
    pkv_seq_id *new_ids;     // [n] in to (after reserve)
    uint32_t n;
    uint32_t blocks;         // distinct live blocks moved: the blocks `to` takes
    pkv_block_id *uniq;      // [blocks] sorted, distinct, then their dst (uniq + total)
    pkv_block_id *dst;
    unsigned char *used;
} pkvi_seq_move;
pkv_status pkvi_seq_move_plan(pkv_seqset *from, const pkv_seq_id *ids, uint32_t n,
                              pkvi_seq_move *mv);
pkv_status pkvi_seq_move_reserve(pkvi_seq_move *mv, pkv_seqset *to, pkv_seq_id *new_ids);
pkv_status pkvi_seq_move_commit(pkvi_seq_move *mv, pkv_block_copy *pairs);
void pkvi_seq_move_abort(pkvi_seq_move *mv);
// 1 if block b is one of the planned move's live blocks.
int pkvi_seq_move_has_block(const pkvi_seq_move *mv, pkv_block_id b);

#endif // PKV_SEQSET_INTERNAL_H

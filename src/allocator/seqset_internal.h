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

#endif // PKV_SEQSET_INTERNAL_H

// SPDX-License-Identifier: MIT
// Internal: what the prefix cache and a sequence set need from each other beyond
// the public API.
#ifndef PKV_SEQSET_INTERNAL_H
#define PKV_SEQSET_INTERNAL_H

#include "pkv/prefix.h"
#include "pkv/seq.h"

// Append one full block that already holds K/V (a prefix-cache hit) to sequence
// `id`, whose length must be a multiple of the block size: the table grows by
// `block` (one more pool reference) and the length by block_size.
pkv_status pkvi_seq_adopt_block(pkv_seqset *set, pkv_seq_id id, pkv_block_id block);

// The prefix cache attached to the set (NULL: none). The set reports every
// cached block whose refcount its releases bring down to 1.
void pkvi_seqset_set_prefix(pkv_seqset *set, pkv_prefix_cache *cache);
pkv_prefix_cache *pkvi_seqset_prefix(const pkv_seqset *set);

#endif // PKV_SEQSET_INTERNAL_H

// SPDX-License-Identifier: MIT
// Internal: what the prefix cache needs from a sequence set beyond the public API.
#ifndef PKV_SEQSET_INTERNAL_H
#define PKV_SEQSET_INTERNAL_H

#include "pkv/seq.h"

// Append one full block that already holds K/V (a prefix-cache hit) to sequence
// `id`, whose length must be a multiple of the block size: the table grows by
// `block` (one more pool reference) and the length by block_size.
pkv_status pkvi_seq_adopt_block(pkv_seqset *set, pkv_seq_id id, pkv_block_id block);

#endif // PKV_SEQSET_INTERNAL_H

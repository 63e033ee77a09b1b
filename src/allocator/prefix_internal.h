// SPDX-License-Identifier: MIT
// Internal: how a sequence set tells its prefix cache that a block is unused.
#ifndef PKV_PREFIX_INTERNAL_H
#define PKV_PREFIX_INTERNAL_H

#include "pkv/prefix.h"

// `block`'s refcount just dropped to 1. If the cache holds it, only the cache does
// now: the entry becomes evictable. Blocks the cache does not hold are ignored.
void pkvi_prefix_block_unused(pkv_prefix_cache *cache, pkv_block_id block);

#endif // PKV_PREFIX_INTERNAL_H

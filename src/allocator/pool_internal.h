// SPDX-License-Identifier: MIT
// Internal: the pool's layout, for the allocator files whose hot loops read
// refcounts and the free count without a call per block (seqset.c's batch
// append). Only pool.c writes it.
#ifndef PKV_POOL_INTERNAL_H
#define PKV_POOL_INTERNAL_H

#include "pkv/pool.h"

struct pkv_pool {
    uint32_t capacity;
    uint32_t free_top;          // number of ids on free_stack
    uint32_t low_water;         // smallest free_top seen: peak use = capacity - low_water
    uint64_t alloc_failures;
    int32_t *refcount;          // [capacity]; 0 = free
    pkv_block_id *free_stack;   // [capacity]; entries 0..free_top-1 are free blocks
};

#endif // PKV_POOL_INTERNAL_H

// SPDX-License-Identifier: MIT
// Free-extent allocator (internal): carves variable-size extents out of one
// linear range [0, capacity) of abstract units (the replay uses token slots).
// It is the baseline that the contiguous KV policies use, so that external
// fragmentation is measured from real placement, not assumed.
//
// Invariant: the free extents are kept sorted by offset, never overlap, never
// touch (neighbours are always coalesced), and their lengths sum to free_total.
// Allocated extents are not recorded; the caller passes (offset, length) back.
//
// Cost: O(F) per alloc/free where F is the number of free extents (F <= live
// extents + 1), which is small next to the work of a replay step.
//
// Thread-safety: none; one thread at a time per allocator.
#ifndef PKV_ALLOCATOR_EXTENT_H
#define PKV_ALLOCATOR_EXTENT_H

#include <stdint.h>

#include "pkv/status.h"

typedef struct pkvi_extent_alloc pkvi_extent_alloc;

typedef enum pkvi_extent_fit {
    PKVI_EXTENT_FIRST_FIT = 0, // lowest-offset extent that is large enough
    PKVI_EXTENT_BEST_FIT = 1,  // smallest extent that is large enough (ties: lowest offset)
} pkvi_extent_fit;

typedef struct pkvi_extent_stats {
    uint64_t capacity;      // units in the range
    uint64_t free_total;    // units in free extents
    uint64_t largest_free;  // longest free extent
    uint32_t free_extents;  // number of free extents
    uint64_t alloc_calls;   // successful allocations (grows in place not included)
    uint64_t alloc_failures; // allocations refused for lack of a large enough extent
} pkvi_extent_stats;

// A new allocator over [0, capacity) (capacity >= 1), all free. *out is owned by
// the caller; release with pkvi_extent_destroy.
pkv_status pkvi_extent_create(uint64_t capacity, pkvi_extent_fit fit, pkvi_extent_alloc **out);
void pkvi_extent_destroy(pkvi_extent_alloc *ea); // NULL does nothing

// Place `len` (>= 1) units; *offset receives the start. PKV_ERR_OUT_OF_BLOCKS if
// no free extent is large enough (nothing changes), PKV_ERR_OUT_OF_MEMORY if the
// metadata cannot grow.
pkv_status pkvi_extent_alloc_units(pkvi_extent_alloc *ea, uint64_t len, uint64_t *offset);

// Return [offset, offset + len) to the free set. PKV_ERR_INVALID_ARG if the range
// is out of bounds or overlaps a free extent (a double free); nothing changes then.
pkv_status pkvi_extent_free_units(pkvi_extent_alloc *ea, uint64_t offset, uint64_t len);

// Grow the allocated extent [offset, offset + old_len) to new_len in place, if the
// units right after it are free. PKV_ERR_OUT_OF_BLOCKS (nothing changes) if not.
pkv_status pkvi_extent_grow(pkvi_extent_alloc *ea, uint64_t offset, uint64_t old_len,
                            uint64_t new_len);

uint64_t pkvi_extent_free_total(const pkvi_extent_alloc *ea);
uint64_t pkvi_extent_largest_free(const pkvi_extent_alloc *ea); // O(F)
pkv_status pkvi_extent_get_stats(const pkvi_extent_alloc *ea, pkvi_extent_stats *stats);

// Check the invariant above. PKV_OK or PKV_ERR_CORRUPT.
pkv_status pkvi_extent_validate(const pkvi_extent_alloc *ea);

#endif // PKV_ALLOCATOR_EXTENT_H

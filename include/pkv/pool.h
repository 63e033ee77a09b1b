// SPDX-License-Identifier: MIT
// The block pool: N fixed-size KV blocks named by dense ids 0..N-1, each with a
// reference count. The pool is pure metadata: it hands out ids, never memory, so
// an engine that owns its own KV tensor can use it as is; pkv_cache (cache.h)
// binds a pool to memory. Alloc and release are O(1), never allocate and never
// call a memory backend.
//
// Thread-safety: a pool is not internally synchronized. One thread at a time may
// use a pool (and every pkv_seqset bound to it); different pools are independent.
#ifndef PKV_POOL_H
#define PKV_POOL_H

#include <stdint.h>

#include "pkv/status.h"

#ifdef __cplusplus
extern "C" {
#endif

// Block ids are int32 so that they can be written into the int32 block tables
// that attention kernels read. Valid ids are 0..capacity-1.
typedef int32_t pkv_block_id;

// Largest pool the library accepts: ids must stay representable as int32 and
// slot numbers (block * block_size + offset) as int64.
#define PKV_POOL_MAX_BLOCKS ((uint32_t)1 << 30)

typedef struct pkv_pool pkv_pool;

// A snapshot of the pool's counters (plain data, owned by the caller).
typedef struct pkv_pool_stats {
    uint32_t capacity;      // blocks in the pool
    uint32_t free_blocks;   // blocks with refcount 0
    uint32_t used_blocks;   // blocks with refcount >= 1 (capacity - free_blocks, except in
                            // the two-level allocator's group pools, which own part of capacity)
    uint32_t peak_used;     // largest used_blocks seen since creation
    uint64_t alloc_failures; // pkv_pool_alloc calls refused with PKV_ERR_OUT_OF_BLOCKS
    // No per-call counters on the success path: alloc and release stay within a
    // few dozen instructions (docs/BENCHMARKS.md); callers count their own calls.
} pkv_pool_stats;

// Create a pool of num_blocks blocks, all free (1 <= num_blocks <= PKV_POOL_MAX_BLOCKS).
// *out receives a new pool owned by the caller; release it with pkv_pool_destroy.
pkv_status pkv_pool_create(uint32_t num_blocks, pkv_pool **out);

// Destroy a pool. NULL does nothing. Blocks still referenced are simply dropped.
void pkv_pool_destroy(pkv_pool *pool);

// Allocate n blocks, all or nothing: on success ids[0..n-1] hold n distinct
// blocks, each with refcount 1. On PKV_ERR_OUT_OF_BLOCKS nothing changed.
// ids: caller-owned array of at least n entries. n == 0 succeeds and does nothing.
pkv_status pkv_pool_alloc(pkv_pool *pool, uint32_t n, pkv_block_id *ids);

// Add one reference to a live block (refcount >= 1). PKV_ERR_NOT_FOUND for a
// free block or an id out of range; PKV_ERR_LIMIT (nothing changed) when the
// refcount is already INT32_MAX.
pkv_status pkv_pool_retain(pkv_pool *pool, pkv_block_id id);

// Drop one reference; at zero the block returns to the free list.
// PKV_ERR_NOT_FOUND for a free block (a double release) or an id out of range.
pkv_status pkv_pool_release(pkv_pool *pool, pkv_block_id id);

// Release n blocks (ids: borrowed, n entries). All ids are checked first, so an
// invalid id changes nothing; a block listed k times loses k references, and
// then every id must hold at least k references.
pkv_status pkv_pool_release_n(pkv_pool *pool, const pkv_block_id *ids, uint32_t n);

// Reference count of a block (0 = free). Returns -1 for an id out of range or a NULL pool.
int32_t pkv_pool_refcount(const pkv_pool *pool, pkv_block_id id);

uint32_t pkv_pool_capacity(const pkv_pool *pool);   // 0 for NULL
uint32_t pkv_pool_free_count(const pkv_pool *pool); // 0 for NULL

// Copy the counters into *stats (caller-owned).
pkv_status pkv_pool_get_stats(const pkv_pool *pool, pkv_pool_stats *stats);

// Full invariant check, O(capacity): every id on the free list is in range,
// appears once and has refcount 0; every other block has refcount >= 1; the free
// count matches. Returns PKV_OK or PKV_ERR_CORRUPT.
pkv_status pkv_pool_validate(const pkv_pool *pool);

#ifdef __cplusplus
}
#endif

#endif // PKV_POOL_H

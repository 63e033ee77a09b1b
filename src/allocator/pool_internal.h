// SPDX-License-Identifier: MIT
// Internal: the pool's layout, for the allocator files whose hot loops read
// refcounts and the free count without a call per block (seqset.c's batch
// append), and the chunked mode that the two-level allocator (lcm.c) builds a
// KV cache group's pool with. Only pool.c writes the struct.
#ifndef PKV_POOL_INTERNAL_H
#define PKV_POOL_INTERNAL_H

#include "pkv/pool.h"

// Refcount of a fenced id: a page of a chunk (large page) its group does not own.
// Negative, so retain/release/release_n refuse it with their `<= 0` test at no cost.
#define PKVI_POOL_FENCED INT32_MIN
// chunk_used of a chunk the pool does not own.
#define PKVI_CHUNK_FENCED UINT32_MAX

struct pkv_pool {
    uint32_t capacity;          // ids 0..capacity-1 (chunked: num_chunks * chunk_pages)
    uint32_t free_top;          // number of ids on free_stack
    uint32_t low_water;         // smallest free_top seen: peak use = capacity - low_water
    // Chunked mode: 0 in a plain pool, whose alloc/release test only this field.
    // Else ids come in chunks of chunk_pages (chunk c = ids c*k .. c*k+k-1), each
    // either owned (its ids free or live) or fenced (refcount PKVI_POOL_FENCED, off
    // the stack, not counted free).
    uint32_t chunk_pages;
    uint64_t alloc_failures;
    int32_t *refcount;          // [capacity]; 0 = free
    pkv_block_id *free_stack;   // [capacity]; entries 0..free_top-1 are free blocks
    // Chunked mode only (NULL / 0 otherwise).
    uint64_t chunk_magic;       // id / chunk_pages without a divide: pkvi_chunk_div
    uint32_t chunk_shift;
    uint32_t num_chunks;
    uint32_t owned_chunks;
    uint32_t peak_used;         // largest live page count seen (free_top moves with chunks)
    uint32_t *chunk_used;       // [num_chunks] live pages per chunk, PKVI_CHUNK_FENCED if not owned
    uint32_t *free_pos;         // [capacity] index on free_stack of a free id (stale otherwise)
    // [ceil(num_chunks / 64)] bit c: chunk c is owned and has no live page. A bit
    // flip is the only cost of a chunk emptying or filling on the hot path; counting
    // and finding empty chunks (when another group needs one) scan the words.
    uint64_t *empty_bits;
};

// id / k without a divide (Granlund-Montgomery): with l = ceil(log2 k) and
// m = ceil(2^(32+l) / k), floor(id * m / 2^(32+l)) == floor(id / k) for every
// 32-bit id; m < 2^33 and ids are < 2^30, so the product fits in 64 bits.
static inline void pkvi_chunk_div_init(uint32_t k, uint64_t *magic, uint32_t *shift) {
    uint32_t l = 0;
    while (((uint64_t)1 << l) < k) l++;
    *shift = 32 + l;
    *magic = (((uint64_t)1 << *shift) + k - 1) / k;
}

static inline uint32_t pkvi_chunk_div(uint32_t id, uint64_t magic, uint32_t shift) {
    return (uint32_t)(((uint64_t)id * magic) >> shift);
}

// ---- pool.c: chunked mode --------------------------------------------------
// Create a pool of num_chunks chunks of chunk_pages ids each, every chunk fenced
// (no free id): pkvi_pool_chunk_give hands it chunks. num_chunks * chunk_pages
// must be 1..PKV_POOL_MAX_BLOCKS. The public calls work on it unchanged; its
// stats count owned pages only (used = owned - free).
pkv_status pkvi_pool_create_chunked(uint32_t num_chunks, uint32_t chunk_pages, pkv_pool **out);

// Unfence a chunk: its ids become free (the lowest handed out first). O(chunk_pages).
// PKV_ERR_INVALID_ARG for a plain pool or a chunk out of range, PKV_ERR_BUSY when
// the chunk is owned already.
pkv_status pkvi_pool_chunk_give(pkv_pool *pool, uint32_t chunk);

// Fence an owned chunk with no live page: its ids leave the free stack. O(chunk_pages).
// PKV_ERR_INVALID_ARG for a plain pool, an unowned chunk or one out of range,
// PKV_ERR_BUSY when a page of it is live.
pkv_status pkvi_pool_chunk_take(pkv_pool *pool, uint32_t chunk);

// Live pages of a chunk, PKVI_CHUNK_FENCED when not owned (or out of range).
uint32_t pkvi_pool_chunk_used(const pkv_pool *pool, uint32_t chunk);

// Owned chunks with no live page. O(num_chunks / 64).
uint32_t pkvi_pool_empty_chunks(const pkv_pool *pool);

// The lowest-numbered empty owned chunk, PKVI_CHUNK_FENCED when there is none.
// O(num_chunks / 64).
uint32_t pkvi_pool_first_empty_chunk(const pkv_pool *pool);

#endif // PKV_POOL_INTERNAL_H

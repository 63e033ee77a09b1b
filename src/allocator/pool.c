// SPDX-License-Identifier: MIT
// The block pool. Free blocks sit on a LIFO stack of ids, so alloc pops and the
// last release pushes: both O(1), and the most recently freed block (still warm in
// caches) is handed out first. Invariant: a block is on the stack exactly when its
// refcount is 0, and it is there once.
//
// Chunked mode (a KV cache group's pool under the two-level allocator, lcm.c):
// the same stack and refcounts over a fixed id range, of which only the chunks
// the group owns are in play; per-chunk live counters and a bitmap of the empty
// owned chunks are kept in O(1) as pages come and go, so that lcm.c can hand an
// empty chunk to another group after a scan of num_chunks / 64 words. A plain pool pays one predictable test
// of chunk_pages in alloc and release for it.
#include <stdlib.h>

#include "pool_internal.h"

pkv_status pkv_pool_create(uint32_t num_blocks, pkv_pool **out) {
    if (!out) return PKV_ERR_INVALID_ARG;
    *out = NULL;
    if (num_blocks == 0 || num_blocks > PKV_POOL_MAX_BLOCKS) return PKV_ERR_INVALID_ARG;
    pkv_pool *pool = calloc(1, sizeof *pool);
    if (!pool) return PKV_ERR_OUT_OF_MEMORY;
    pool->refcount = calloc(num_blocks, sizeof *pool->refcount);
    pool->free_stack = malloc((size_t)num_blocks * sizeof *pool->free_stack);
    if (!pool->refcount || !pool->free_stack) {
        pkv_pool_destroy(pool);
        return PKV_ERR_OUT_OF_MEMORY;
    }
    // Push in reverse so that a fresh pool hands out 0, 1, 2, ... (easier to read
    // in tests and traces; nothing depends on it).
    for (uint32_t i = 0; i < num_blocks; i++)
        pool->free_stack[i] = (pkv_block_id)(num_blocks - 1 - i);
    pool->capacity = num_blocks;
    pool->free_top = num_blocks;
    pool->low_water = num_blocks;
    *out = pool;
    return PKV_OK;
}

void pkv_pool_destroy(pkv_pool *pool) {
    if (!pool) return;
    free(pool->refcount);
    free(pool->free_stack);
    free(pool->chunk_used);
    free(pool->free_pos);
    free(pool->empty_bits);
    free(pool);
}

// ---- chunked mode's bookkeeping ----------------------------------------------

static inline uint32_t chunk_of(const pkv_pool *pool, pkv_block_id id) {
    return pkvi_chunk_div((uint32_t)id, pool->chunk_magic, pool->chunk_shift);
}

static inline void empty_add(pkv_pool *pool, uint32_t c) {
    pool->empty_bits[c >> 6] |= (uint64_t)1 << (c & 63);
}

static inline void empty_remove(pkv_pool *pool, uint32_t c) {
    pool->empty_bits[c >> 6] &= ~((uint64_t)1 << (c & 63));
}

static inline int is_empty_chunk(const pkv_pool *pool, uint32_t c) {
    return (int)((pool->empty_bits[c >> 6] >> (c & 63)) & 1);
}

static uint32_t popcount64(uint64_t x) { // portable SWAR count
    x -= (x >> 1) & 0x5555555555555555ull;
    x = (x & 0x3333333333333333ull) + ((x >> 2) & 0x3333333333333333ull);
    x = (x + (x >> 4)) & 0x0F0F0F0F0F0F0F0Full;
    return (uint32_t)((x * 0x0101010101010101ull) >> 56);
}

// A page of a chunked pool reached refcount 0.
static inline void chunked_push(pkv_pool *pool, pkv_block_id id) {
    pool->free_pos[id] = pool->free_top;
    pool->free_stack[pool->free_top++] = id;
    uint32_t c = chunk_of(pool, id);
    if (--pool->chunk_used[c] == 0) empty_add(pool, c);
}

// Pop n <= free_top ids off the stack, each with refcount 1; `chunked` (a
// constant at each call) also counts them in their chunks. Returns the new free_top.
static inline uint32_t pop_free(pkv_pool *pool, uint32_t n, pkv_block_id *ids, int chunked) {
    uint32_t top = pool->free_top;
    for (uint32_t i = 0; i < n; i++) {
        pkv_block_id id = pool->free_stack[--top];
        pool->refcount[id] = 1;
        ids[i] = id;
        if (chunked) {
            uint32_t c = chunk_of(pool, id);
            if (pool->chunk_used[c]++ == 0) empty_remove(pool, c);
        }
    }
    pool->free_top = top;
    return top;
}

// pkv_pool_alloc in chunked mode (tested apart so that the plain path stays short).
static pkv_status chunked_alloc(pkv_pool *pool, uint32_t n, pkv_block_id *ids) {
    if (n > pool->free_top) {
        pool->alloc_failures++;
        return PKV_ERR_OUT_OF_BLOCKS;
    }
    // free_top moves with the chunks given and taken: count the live pages.
    uint32_t used = pool->owned_chunks * pool->chunk_pages - pop_free(pool, n, ids, 1);
    if (used > pool->peak_used) pool->peak_used = used;
    return PKV_OK;
}

pkv_status pkvi_pool_create_chunked(uint32_t num_chunks, uint32_t chunk_pages, pkv_pool **out) {
    if (!out) return PKV_ERR_INVALID_ARG;
    *out = NULL;
    if (num_chunks == 0 || chunk_pages == 0 ||
        (uint64_t)num_chunks * chunk_pages > PKV_POOL_MAX_BLOCKS)
        return PKV_ERR_INVALID_ARG;
    pkv_pool *pool = calloc(1, sizeof *pool);
    if (!pool) return PKV_ERR_OUT_OF_MEMORY;
    uint32_t cap = num_chunks * chunk_pages;
    pool->refcount = malloc((size_t)cap * sizeof *pool->refcount);
    pool->free_stack = malloc((size_t)cap * sizeof *pool->free_stack);
    pool->free_pos = malloc((size_t)cap * sizeof *pool->free_pos);
    pool->chunk_used = malloc((size_t)num_chunks * sizeof *pool->chunk_used);
    pool->empty_bits = calloc(((size_t)num_chunks + 63) / 64, sizeof *pool->empty_bits);
    if (!pool->refcount || !pool->free_stack || !pool->free_pos || !pool->chunk_used ||
        !pool->empty_bits) {
        pkv_pool_destroy(pool);
        return PKV_ERR_OUT_OF_MEMORY;
    }
    for (uint32_t i = 0; i < cap; i++) pool->refcount[i] = PKVI_POOL_FENCED;
    for (uint32_t c = 0; c < num_chunks; c++) pool->chunk_used[c] = PKVI_CHUNK_FENCED;
    pkvi_chunk_div_init(chunk_pages, &pool->chunk_magic, &pool->chunk_shift);
    pool->capacity = cap;
    pool->chunk_pages = chunk_pages;
    pool->num_chunks = num_chunks;
    pool->low_water = 0; // unused in chunked mode (peak_used instead)
    *out = pool;
    return PKV_OK;
}

pkv_status pkvi_pool_chunk_give(pkv_pool *pool, uint32_t chunk) {
    if (!pool || !pool->chunk_pages || chunk >= pool->num_chunks) return PKV_ERR_INVALID_ARG;
    if (pool->chunk_used[chunk] != PKVI_CHUNK_FENCED) return PKV_ERR_BUSY;
    const uint32_t k = pool->chunk_pages, first = chunk * k;
    // Highest id first, so that the chunk's lowest id is on top.
    for (uint32_t i = k; i > 0; i--) {
        pkv_block_id id = (pkv_block_id)(first + i - 1);
        pool->refcount[id] = 0;
        pool->free_pos[id] = pool->free_top;
        pool->free_stack[pool->free_top++] = id;
    }
    pool->chunk_used[chunk] = 0;
    empty_add(pool, chunk);
    pool->owned_chunks++;
    return PKV_OK;
}

pkv_status pkvi_pool_chunk_take(pkv_pool *pool, uint32_t chunk) {
    if (!pool || !pool->chunk_pages || chunk >= pool->num_chunks ||
        pool->chunk_used[chunk] == PKVI_CHUNK_FENCED)
        return PKV_ERR_INVALID_ARG;
    if (pool->chunk_used[chunk] != 0) return PKV_ERR_BUSY;
    const uint32_t k = pool->chunk_pages, first = chunk * k;
    for (uint32_t i = 0; i < k; i++) {
        // Every page is free: move the stack's top into its slot.
        pkv_block_id id = (pkv_block_id)(first + i);
        uint32_t at = pool->free_pos[id];
        pkv_block_id last = pool->free_stack[--pool->free_top];
        pool->free_stack[at] = last;
        pool->free_pos[last] = at;
        pool->refcount[id] = PKVI_POOL_FENCED;
    }
    pool->chunk_used[chunk] = PKVI_CHUNK_FENCED;
    empty_remove(pool, chunk);
    pool->owned_chunks--;
    return PKV_OK;
}

uint32_t pkvi_pool_chunk_used(const pkv_pool *pool, uint32_t chunk) {
    if (!pool || !pool->chunk_pages || chunk >= pool->num_chunks) return PKVI_CHUNK_FENCED;
    return pool->chunk_used[chunk];
}

uint32_t pkvi_pool_empty_chunks(const pkv_pool *pool) {
    if (!pool || !pool->chunk_pages) return 0;
    uint32_t n = 0;
    for (uint32_t w = 0; w < (pool->num_chunks + 63) / 64; w++) n += popcount64(pool->empty_bits[w]);
    return n;
}

uint32_t pkvi_pool_first_empty_chunk(const pkv_pool *pool) {
    // Index of the lowest set bit by a de Bruijn multiply (portable, no builtin).
    static const uint8_t debruijn[64] = {
        0,  1,  48, 2,  57, 49, 28, 3,  61, 58, 50, 42, 38, 29, 17, 4,  62, 55, 59, 36, 53, 51,
        43, 22, 45, 39, 33, 30, 24, 18, 12, 5,  63, 47, 56, 27, 60, 41, 37, 16, 54, 35, 52, 21,
        44, 32, 23, 11, 46, 26, 40, 15, 34, 20, 31, 10, 25, 14, 19, 9,  13, 8,  7,  6};
    if (!pool || !pool->chunk_pages) return PKVI_CHUNK_FENCED;
    for (uint32_t w = 0; w < (pool->num_chunks + 63) / 64; w++) {
        uint64_t bits = pool->empty_bits[w];
        if (bits)
            return w * 64 + debruijn[((bits & (~bits + 1)) * 0x03f79d71b4cb0a89ull) >> 58];
    }
    return PKVI_CHUNK_FENCED;
}

// ---- the public calls ------------------------------------------------------------

pkv_status pkv_pool_alloc(pkv_pool *pool, uint32_t n, pkv_block_id *ids) {
    if (!pool || (!ids && n)) return PKV_ERR_INVALID_ARG;
    if (pool->chunk_pages) return chunked_alloc(pool, n, ids);
    if (n > pool->free_top) {
        // Checked before anything is written: all or nothing.
        pool->alloc_failures++;
        return PKV_ERR_OUT_OF_BLOCKS;
    }
    uint32_t top = pop_free(pool, n, ids, 0);
    // A low-water mark rather than a peak counter: one compare on the hot path.
    if (top < pool->low_water) pool->low_water = top;
    return PKV_OK;
}

pkv_status pkv_pool_retain(pkv_pool *pool, pkv_block_id id) {
    if (!pool) return PKV_ERR_INVALID_ARG;
    // The unsigned compare also rejects negative ids.
    if ((uint32_t)id >= pool->capacity || pool->refcount[id] <= 0) return PKV_ERR_NOT_FOUND;
    if (pool->refcount[id] == INT32_MAX) return PKV_ERR_LIMIT; // never wrap to negative
    pool->refcount[id]++;
    return PKV_OK;
}

pkv_status pkv_pool_release(pkv_pool *pool, pkv_block_id id) {
    if (!pool) return PKV_ERR_INVALID_ARG;
    if ((uint32_t)id >= pool->capacity) return PKV_ERR_NOT_FOUND;
    int32_t rc = pool->refcount[id];
    if (rc <= 0) return PKV_ERR_NOT_FOUND; // a double release must not push twice
    pool->refcount[id] = rc - 1;
    if (rc == 1) {
        if (pool->chunk_pages)
            chunked_push(pool, id);
        else
            pool->free_stack[pool->free_top++] = id;
    }
    return PKV_OK;
}

pkv_status pkv_pool_release_n(pkv_pool *pool, const pkv_block_id *ids, uint32_t n) {
    if (!pool || (!ids && n)) return PKV_ERR_INVALID_ARG;
    // Pass 1: drop the references, undoing them all if one id is not live, so an
    // invalid list changes nothing. Blocks are not pushed yet because an id may
    // appear twice.
    for (uint32_t i = 0; i < n; i++) {
        pkv_block_id id = ids[i];
        if ((uint32_t)id >= pool->capacity || pool->refcount[id] <= 0) {
            while (i-- > 0) pool->refcount[ids[i]]++;
            return PKV_ERR_NOT_FOUND;
        }
        pool->refcount[id]--;
    }
    // Pass 2: push each block that reached 0 once; -1 marks "already pushed".
    for (uint32_t i = 0; i < n; i++) {
        pkv_block_id id = ids[i];
        if (pool->refcount[id] == 0) {
            if (pool->chunk_pages)
                chunked_push(pool, id);
            else
                pool->free_stack[pool->free_top++] = id;
            pool->refcount[id] = -1;
        }
    }
    for (uint32_t i = 0; i < n; i++)
        if (pool->refcount[ids[i]] < 0) pool->refcount[ids[i]] = 0;
    return PKV_OK;
}

int32_t pkv_pool_refcount(const pkv_pool *pool, pkv_block_id id) {
    if (!pool || (uint32_t)id >= pool->capacity) return -1;
    int32_t rc = pool->refcount[id];
    return rc < 0 ? 0 : rc; // a fenced page is referenced by nobody
}

uint32_t pkv_pool_capacity(const pkv_pool *pool) { return pool ? pool->capacity : 0; }

uint32_t pkv_pool_free_count(const pkv_pool *pool) { return pool ? pool->free_top : 0; }

pkv_status pkv_pool_get_stats(const pkv_pool *pool, pkv_pool_stats *stats) {
    if (!pool || !stats) return PKV_ERR_INVALID_ARG;
    stats->capacity = pool->capacity;
    stats->free_blocks = pool->free_top;
    if (pool->chunk_pages) {
        stats->used_blocks = pool->owned_chunks * pool->chunk_pages - pool->free_top;
        stats->peak_used = pool->peak_used;
    } else {
        stats->used_blocks = pool->capacity - pool->free_top;
        stats->peak_used = pool->capacity - pool->low_water;
    }
    stats->alloc_failures = pool->alloc_failures;
    return PKV_OK;
}

// Chunked mode's part of the check: a fenced id is off the stack in a fenced
// chunk; every owned chunk's counter equals its live pages (recounted with a real
// divide, which also checks the multiply-shift); the empty bits are exactly the
// owned chunks with none live; free ids are owned pages minus live ones.
static pkv_status validate_chunks(const pkv_pool *pool, const unsigned char *on_stack) {
    const uint32_t k = pool->chunk_pages;
    uint32_t *live = calloc(pool->num_chunks, sizeof *live);
    if (!live) return PKV_ERR_OUT_OF_MEMORY;
    pkv_status st = PKV_OK;
    uint64_t total_live = 0;
    for (uint32_t b = 0; b < pool->capacity && st == PKV_OK; b++) {
        uint32_t c = b / k;
        int fenced = pool->chunk_used[c] == PKVI_CHUNK_FENCED;
        if (chunk_of(pool, (pkv_block_id)b) != c || fenced != (pool->refcount[b] == PKVI_POOL_FENCED) ||
            (on_stack[b] && pool->free_pos[b] >= pool->free_top) ||
            (on_stack[b] && pool->free_stack[pool->free_pos[b]] != (pkv_block_id)b))
            st = PKV_ERR_CORRUPT;
        else if (!fenced && pool->refcount[b] > 0)
            live[c]++, total_live++;
    }
    uint32_t owned = 0, empty = 0;
    for (uint32_t c = 0; c < pool->num_chunks && st == PKV_OK; c++) {
        if (pool->chunk_used[c] == PKVI_CHUNK_FENCED) continue;
        owned++;
        if (live[c] != pool->chunk_used[c] || is_empty_chunk(pool, c) != (live[c] == 0))
            st = PKV_ERR_CORRUPT;
        empty += live[c] == 0;
    }
    // A bit set for a fenced chunk (or past num_chunks) shows as a count mismatch.
    if (st == PKV_OK && (owned != pool->owned_chunks || empty != pkvi_pool_empty_chunks(pool) ||
                         (uint64_t)owned * k - total_live != pool->free_top))
        st = PKV_ERR_CORRUPT;
    free(live);
    return st;
}

pkv_status pkv_pool_validate(const pkv_pool *pool) {
    if (!pool) return PKV_ERR_INVALID_ARG;
    if (pool->free_top > pool->capacity) return PKV_ERR_CORRUPT;
    unsigned char *on_stack = calloc(pool->capacity, 1);
    if (!on_stack) return PKV_ERR_OUT_OF_MEMORY;
    pkv_status st = PKV_OK;
    for (uint32_t i = 0; i < pool->free_top && st == PKV_OK; i++) {
        pkv_block_id id = pool->free_stack[i];
        if ((uint32_t)id >= pool->capacity || on_stack[id] || pool->refcount[id] != 0)
            st = PKV_ERR_CORRUPT; // out of range, duplicate, or free but referenced
        else
            on_stack[id] = 1;
    }
    for (uint32_t b = 0; b < pool->capacity && st == PKV_OK; b++) {
        // Every block is exactly one of: on the stack with refcount 0, live, or
        // (chunked mode) fenced.
        if (pool->chunk_pages && pool->refcount[b] == PKVI_POOL_FENCED) continue;
        if (pool->refcount[b] < 0 || (pool->refcount[b] == 0) != (on_stack[b] != 0))
            st = PKV_ERR_CORRUPT;
    }
    if (st == PKV_OK && pool->chunk_pages) st = validate_chunks(pool, on_stack);
    free(on_stack);
    return st;
}

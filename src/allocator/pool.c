// SPDX-License-Identifier: MIT
// The block pool. Free blocks sit on a LIFO stack of ids, so alloc pops and the
// last release pushes: both O(1), and the most recently freed block (still warm in
// caches) is handed out first. Invariant: a block is on the stack exactly when its
// refcount is 0, and it is there once.
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
    free(pool);
}

pkv_status pkv_pool_alloc(pkv_pool *pool, uint32_t n, pkv_block_id *ids) {
    if (!pool || (!ids && n)) return PKV_ERR_INVALID_ARG;
    uint32_t top = pool->free_top;
    if (n > top) {
        // Checked before anything is written: all or nothing.
        pool->alloc_failures++;
        return PKV_ERR_OUT_OF_BLOCKS;
    }
    for (uint32_t i = 0; i < n; i++) {
        pkv_block_id id = pool->free_stack[--top];
        pool->refcount[id] = 1;
        ids[i] = id;
    }
    pool->free_top = top;
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
    if (rc == 1) pool->free_stack[pool->free_top++] = id;
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
    return pool->refcount[id];
}

uint32_t pkv_pool_capacity(const pkv_pool *pool) { return pool ? pool->capacity : 0; }

uint32_t pkv_pool_free_count(const pkv_pool *pool) { return pool ? pool->free_top : 0; }

pkv_status pkv_pool_get_stats(const pkv_pool *pool, pkv_pool_stats *stats) {
    if (!pool || !stats) return PKV_ERR_INVALID_ARG;
    stats->capacity = pool->capacity;
    stats->free_blocks = pool->free_top;
    stats->used_blocks = pool->capacity - pool->free_top;
    stats->peak_used = pool->capacity - pool->low_water;
    stats->alloc_failures = pool->alloc_failures;
    return PKV_OK;
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
        // Every block is exactly one of: on the stack with refcount 0, or live.
        if (pool->refcount[b] < 0 || (pool->refcount[b] == 0) != (on_stack[b] != 0))
            st = PKV_ERR_CORRUPT;
    }
    free(on_stack);
    return st;
}

// SPDX-License-Identifier: MIT
// Free-extent allocator: a sorted array of free extents with first-fit or
// best-fit placement and eager coalescing. See extent.h for the invariant.
#include <stdlib.h>
#include <string.h>

#include "extent.h"

typedef struct extent {
    uint64_t off;
    uint64_t len;
} extent;

struct pkvi_extent_alloc {
    extent *free; // [count], sorted by off, non-touching
    uint32_t count;
    uint32_t cap;
    uint64_t capacity;
    uint64_t free_total;
    pkvi_extent_fit fit;
    uint64_t alloc_calls;
    uint64_t alloc_failures;
};

pkv_status pkvi_extent_create(uint64_t capacity, pkvi_extent_fit fit, pkvi_extent_alloc **out) {
    if (!out || capacity == 0 || (fit != PKVI_EXTENT_FIRST_FIT && fit != PKVI_EXTENT_BEST_FIT))
        return PKV_ERR_INVALID_ARG;
    pkvi_extent_alloc *ea = calloc(1, sizeof *ea);
    if (!ea) return PKV_ERR_OUT_OF_MEMORY;
    ea->cap = 16;
    ea->free = malloc(ea->cap * sizeof *ea->free);
    if (!ea->free) {
        free(ea);
        return PKV_ERR_OUT_OF_MEMORY;
    }
    ea->free[0] = (extent){0, capacity};
    ea->count = 1;
    ea->capacity = capacity;
    ea->free_total = capacity;
    ea->fit = fit;
    *out = ea;
    return PKV_OK;
}

void pkvi_extent_destroy(pkvi_extent_alloc *ea) {
    if (!ea) return;
    free(ea->free);
    free(ea);
}

// Index of the first free extent whose offset is >= off.
static uint32_t lower_bound(const pkvi_extent_alloc *ea, uint64_t off) {
    uint32_t lo = 0, hi = ea->count;
    while (lo < hi) {
        uint32_t mid = lo + (hi - lo) / 2;
        if (ea->free[mid].off < off)
            lo = mid + 1;
        else
            hi = mid;
    }
    return lo;
}

static void remove_at(pkvi_extent_alloc *ea, uint32_t i) {
    memmove(&ea->free[i], &ea->free[i + 1], (size_t)(ea->count - i - 1) * sizeof *ea->free);
    ea->count--;
}

pkv_status pkvi_extent_alloc_units(pkvi_extent_alloc *ea, uint64_t len, uint64_t *offset) {
    if (!ea || !offset || len == 0) return PKV_ERR_INVALID_ARG;
    uint32_t pick = UINT32_MAX;
    for (uint32_t i = 0; i < ea->count; i++) {
        if (ea->free[i].len < len) continue;
        if (ea->fit == PKVI_EXTENT_FIRST_FIT) {
            pick = i;
            break;
        }
        if (pick == UINT32_MAX || ea->free[i].len < ea->free[pick].len) pick = i;
        if (ea->free[pick].len == len) break; // an exact fit cannot be beaten
    }
    if (pick == UINT32_MAX) {
        ea->alloc_failures++;
        return PKV_ERR_OUT_OF_BLOCKS;
    }
    *offset = ea->free[pick].off;
    ea->free[pick].off += len;
    ea->free[pick].len -= len;
    if (ea->free[pick].len == 0) remove_at(ea, pick);
    ea->free_total -= len;
    ea->alloc_calls++;
    return PKV_OK;
}

pkv_status pkvi_extent_free_units(pkvi_extent_alloc *ea, uint64_t offset, uint64_t len) {
    if (!ea || len == 0 || offset > ea->capacity || len > ea->capacity - offset)
        return PKV_ERR_INVALID_ARG;
    uint32_t i = lower_bound(ea, offset); // free[i-1] is before, free[i] after
    const uint64_t end = offset + len;
    // Overlap with a free neighbour means the range (or part of it) was already free.
    if (i > 0 && ea->free[i - 1].off + ea->free[i - 1].len > offset) return PKV_ERR_INVALID_ARG;
    if (i < ea->count && ea->free[i].off < end) return PKV_ERR_INVALID_ARG;
    const int join_prev = i > 0 && ea->free[i - 1].off + ea->free[i - 1].len == offset;
    const int join_next = i < ea->count && ea->free[i].off == end;
    if (join_prev && join_next) {
        ea->free[i - 1].len += len + ea->free[i].len;
        remove_at(ea, i);
    } else if (join_prev) {
        ea->free[i - 1].len += len;
    } else if (join_next) {
        ea->free[i].off = offset;
        ea->free[i].len += len;
    } else {
        if (ea->count == ea->cap) {
            uint32_t ncap = ea->cap * 2;
            extent *n = realloc(ea->free, (size_t)ncap * sizeof *n);
            if (!n) return PKV_ERR_OUT_OF_MEMORY;
            ea->free = n;
            ea->cap = ncap;
        }
        memmove(&ea->free[i + 1], &ea->free[i], (size_t)(ea->count - i) * sizeof *ea->free);
        ea->free[i] = (extent){offset, len};
        ea->count++;
    }
    ea->free_total += len;
    return PKV_OK;
}

pkv_status pkvi_extent_grow(pkvi_extent_alloc *ea, uint64_t offset, uint64_t old_len,
                            uint64_t new_len) {
    if (!ea || old_len == 0 || new_len < old_len || offset > ea->capacity ||
        old_len > ea->capacity - offset)
        return PKV_ERR_INVALID_ARG;
    if (new_len == old_len) return PKV_OK;
    const uint64_t end = offset + old_len, extra = new_len - old_len;
    uint32_t i = lower_bound(ea, end);
    if (i == ea->count || ea->free[i].off != end || ea->free[i].len < extra)
        return PKV_ERR_OUT_OF_BLOCKS;
    ea->free[i].off += extra;
    ea->free[i].len -= extra;
    if (ea->free[i].len == 0) remove_at(ea, i);
    ea->free_total -= extra;
    return PKV_OK;
}

uint64_t pkvi_extent_free_total(const pkvi_extent_alloc *ea) { return ea ? ea->free_total : 0; }

uint64_t pkvi_extent_largest_free(const pkvi_extent_alloc *ea) {
    uint64_t best = 0;
    if (!ea) return 0;
    for (uint32_t i = 0; i < ea->count; i++)
        if (ea->free[i].len > best) best = ea->free[i].len;
    return best;
}

pkv_status pkvi_extent_get_stats(const pkvi_extent_alloc *ea, pkvi_extent_stats *stats) {
    if (!ea || !stats) return PKV_ERR_INVALID_ARG;
    stats->capacity = ea->capacity;
    stats->free_total = ea->free_total;
    stats->largest_free = pkvi_extent_largest_free(ea);
    stats->free_extents = ea->count;
    stats->alloc_calls = ea->alloc_calls;
    stats->alloc_failures = ea->alloc_failures;
    return PKV_OK;
}

pkv_status pkvi_extent_validate(const pkvi_extent_alloc *ea) {
    if (!ea) return PKV_ERR_INVALID_ARG;
    uint64_t sum = 0;
    for (uint32_t i = 0; i < ea->count; i++) {
        const extent *e = &ea->free[i];
        if (e->len == 0 || e->off > ea->capacity || e->len > ea->capacity - e->off)
            return PKV_ERR_CORRUPT;
        // Strictly after the previous one with a gap: sorted, disjoint, coalesced.
        if (i > 0 && ea->free[i - 1].off + ea->free[i - 1].len >= e->off) return PKV_ERR_CORRUPT;
        sum += e->len;
    }
    return sum == ea->free_total ? PKV_OK : PKV_ERR_CORRUPT;
}

// SPDX-License-Identifier: MIT
// The longest prefix hit common to every KV cache group (include/pkv/hybrid_hit.h).
// Each group answers "can a hit of L tokens be used?" in O(1) from a run-length
// table: run[i] = number of consecutive cached blocks ending at block i. A group
// accepts L when the blocks [first(L), L/B) it needs are all known and cached, i.e.
// run[L/B - 1] >= L/B - first(L). Candidates are the multiples of the block sizes'
// LCM from the top down; full-attention groups cap the top, since they accept every
// L up to their leading run and nothing beyond.
#include <stdlib.h>

#include "pkv/hybrid_hit.h"

static int group_ok(const pkv_hit_group *g) {
    if (!g->block_size || (g->num_blocks && !g->cached)) return 0;
    switch (g->kind) {
    case PKV_LAYER_FULL:
    case PKV_LAYER_MLA:
    case PKV_LAYER_STATE:
        return 1;
    case PKV_LAYER_SLIDING:
    case PKV_LAYER_CHUNKED:
        return g->window > 0;
    }
    return 0;
}

// First block a hit of L tokens needs (L a multiple of the block size, L > 0).
static uint32_t first_needed(const pkv_hit_group *g, uint32_t L) {
    const uint32_t B = g->block_size;
    switch (g->kind) {
    case PKV_LAYER_SLIDING: // the next query (position L) sees L-W+1..L-1 of the past
        return L >= g->window ? (L - g->window + 1) / B : 0;
    case PKV_LAYER_CHUNKED: // ... and a chunked one its chunk's start..L-1
        return (L / g->window) * g->window / B;
    case PKV_LAYER_STATE: // the state after token L-1, cached with block L/B - 1
        return L / B - 1;
    default:
        return 0;
    }
}

pkv_status pkv_hybrid_hit_blocks(const pkv_hit_group *g, uint32_t hit_tokens, uint32_t *first,
                                 uint32_t *count) {
    if (!g || !first || !count || !group_ok(g) || hit_tokens % g->block_size) return PKV_ERR_INVALID_ARG;
    if (hit_tokens == 0) {
        *first = *count = 0;
        return PKV_OK;
    }
    *first = first_needed(g, hit_tokens);
    *count = hit_tokens / g->block_size - *first;
    return PKV_OK;
}

static uint64_t gcd64(uint64_t a, uint64_t b) {
    while (b) {
        uint64_t t = a % b;
        a = b;
        b = t;
    }
    return a;
}

// Does group g accept a hit of L tokens (L > 0, a multiple of its block size)?
static int accepts(const pkv_hit_group *g, const uint32_t *run, uint32_t L) {
    const uint32_t last = L / g->block_size; // one past the last block needed
    if (last > g->num_blocks) return 0;      // a block the caller knows nothing of
    const uint32_t need = last - first_needed(g, L);
    return need == 0 || run[last - 1] >= need;
}

pkv_status pkv_hybrid_longest_hit(const pkv_hit_group *groups, uint32_t num_groups,
                                  uint32_t max_tokens, uint32_t *hit_tokens) {
    if (!groups || !hit_tokens || num_groups == 0 || num_groups > PKV_MAX_KV_GROUPS)
        return PKV_ERR_INVALID_ARG;
    uint64_t align = 1, total = 0;
    for (uint32_t i = 0; i < num_groups; i++) {
        if (!group_ok(&groups[i])) return PKV_ERR_INVALID_ARG;
        const uint64_t b = groups[i].block_size;
        align = align / gcd64(align, b) * b;
        if (align > (1ull << 31)) return PKV_ERR_INVALID_ARG;
        total += groups[i].num_blocks;
    }
    *hit_tokens = 0;
    uint32_t *runs = malloc((total ? total : 1) * sizeof *runs);
    if (!runs) return PKV_ERR_OUT_OF_MEMORY;
    // Run lengths per group, and the cap from the full-attention groups.
    uint64_t top = max_tokens;
    const uint32_t *run[PKV_MAX_KV_GROUPS];
    uint32_t *next = runs;
    for (uint32_t i = 0; i < num_groups; i++) {
        const pkv_hit_group *g = &groups[i];
        uint32_t lead = 0;
        for (uint32_t b = 0; b < g->num_blocks; b++) {
            next[b] = g->cached[b] ? (b ? next[b - 1] : 0) + 1 : 0;
            if (next[b] == b + 1) lead = b + 1;
        }
        run[i] = next;
        next += g->num_blocks;
        if (g->kind == PKV_LAYER_FULL || g->kind == PKV_LAYER_MLA) {
            const uint64_t cap = (uint64_t)lead * g->block_size;
            if (cap < top) top = cap;
        }
    }
    for (uint64_t L = top / align * align; L > 0; L -= align) {
        uint32_t i = 0;
        while (i < num_groups && accepts(&groups[i], run[i], (uint32_t)L)) i++;
        if (i == num_groups) {
            *hit_tokens = (uint32_t)L;
            break;
        }
    }
    free(runs);
    return PKV_OK;
}

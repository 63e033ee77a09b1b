// SPDX-License-Identifier: MIT
// The prefix pool's hybrid lookup (prefix_pool.h, pkv_prefix_pool_find_hybrid_prefix):
// per group, which of the request's blocks are cached; then the common hit
// (hybrid_hit.c) and the blocks each group reuses. Built on the pool's public
// lookups only.
#include <stdlib.h>

#include "pkv/prefix_pool.h"

pkv_status pkv_prefix_pool_find_hybrid_prefix(const pkv_prefix_pool *pool, pkv_hybrid_lookup *groups,
                                              uint32_t num_groups, uint32_t max_tokens,
                                              uint32_t *hit_tokens) {
    if (!pool || !groups || !hit_tokens || num_groups == 0 || num_groups > PKV_MAX_KV_GROUPS)
        return PKV_ERR_INVALID_ARG;
    uint64_t total = 0;
    for (uint32_t g = 0; g < num_groups; g++) {
        if (groups[g].num_hashes && (!groups[g].hashes || !groups[g].ids)) return PKV_ERR_INVALID_ARG;
        total += groups[g].num_hashes;
    }
    uint8_t *cached = malloc(total ? total : 1);
    pkv_block_id *found = malloc((total ? total : 1) * sizeof *found);
    pkv_hit_group rules[PKV_MAX_KV_GROUPS];
    pkv_status st = cached && found ? PKV_OK : PKV_ERR_OUT_OF_MEMORY;
    uint64_t at = 0;
    for (uint32_t g = 0; st == PKV_OK && g < num_groups; g++) {
        rules[g] = groups[g].rule;
        rules[g].num_blocks = groups[g].num_hashes;
        rules[g].cached = cached + at;
        for (uint32_t i = 0; st == PKV_OK && i < groups[g].num_hashes; i++) {
            pkv_status s = pkv_prefix_pool_get_cached_block(pool, g, &groups[g].hashes[i], &found[at + i]);
            cached[at + i] = s == PKV_OK;
            if (s != PKV_OK && s != PKV_ERR_NOT_FOUND) st = s; // a bad hash or group
        }
        at += groups[g].num_hashes;
    }
    uint32_t hit = 0;
    if (st == PKV_OK) st = pkv_hybrid_longest_hit(rules, num_groups, max_tokens, &hit);
    at = 0;
    for (uint32_t g = 0; st == PKV_OK && g < num_groups; g++) {
        uint32_t first = 0, count = 0;
        st = pkv_hybrid_hit_blocks(&rules[g], hit, &first, &count);
        const uint32_t n = hit / rules[g].block_size;
        for (uint32_t i = 0; st == PKV_OK && i < n; i++)
            groups[g].ids[i] = i < first ? PKV_NULL_BLOCK : found[at + i];
        groups[g].num_ids = st == PKV_OK ? n : 0;
        at += groups[g].num_hashes;
    }
    if (st == PKV_OK) *hit_tokens = hit;
    free(cached);
    free(found);
    return st;
}

// SPDX-License-Identifier: MIT
// The LCM layout of the hybrid KV manager (PKV_HYBRID_LCM, Jenga's two-level
// allocator): the page budget becomes one pkvi_lcm (lcm.h) over the token groups,
// whose page is B_g x bytes_per_token_g; each token group's set draws from its
// chunked pool, and make_room grants large pages before an append. Empty large
// pages stay with their group until another group's make_room needs them (lcm.h
// says why), so after_release is not needed.
#include <stdlib.h>

#include "hybrid_internal.h"
#include "lcm.h"
#include "pool_internal.h"

typedef struct lcm_layout {
    pkvi_lcm *lcm;
    uint32_t num;                         // token groups = the allocator's groups
    uint32_t hgroup[PKV_MAX_KV_GROUPS];   // allocator group i is manager group hgroup[i]
} lcm_layout;

static pkv_status build_lcm(pkv_hybrid *h, uint64_t page_budget) {
    lcm_layout *ly = calloc(1, sizeof *ly);
    if (!ly) return PKV_ERR_OUT_OF_MEMORY;
    h->layout_ctx = ly;
    uint64_t bytes[PKV_MAX_KV_GROUPS];
    for (uint32_t g = 0; g < h->num_groups; g++) {
        pkvi_hgroup *hg = &h->groups[g];
        if (!pkvi_hybrid_is_token_group(h, g)) continue;
        hg->block_size = pkvi_hybrid_block_size(h, g);
        hg->page_bytes = hg->block_size * hg->bytes_per_token;
        bytes[ly->num] = hg->page_bytes;
        ly->hgroup[ly->num++] = g;
    }
    // The manager's create has no error text: a too large LCM is PKV_ERR_LIMIT, a
    // budget below one large page PKV_ERR_INVALID_ARG (as for the other layouts).
    pkv_status st = pkvi_lcm_create(bytes, ly->num, page_budget, &ly->lcm, NULL, 0);
    for (uint32_t i = 0; i < ly->num && st == PKV_OK; i++) {
        if (h->num_pools == PKVI_HYBRID_MAX_POOLS) return PKV_ERR_INVALID_ARG;
        pkv_pool *pool = pkvi_lcm_pool(ly->lcm, i);
        h->pools[h->num_pools++] = pool; // so the manager's fit check and validate see it
        const uint32_t g = ly->hgroup[i];
        st = pkvi_hybrid_own_set(h, g, pool, h->groups[g].block_size);
    }
    return st;
}

static pkv_status make_room_lcm(pkv_hybrid *h, const uint32_t *need) {
    const lcm_layout *ly = h->layout_ctx;
    uint32_t want[PKVI_LCM_MAX_GROUPS];
    for (uint32_t i = 0; i < ly->num; i++) want[i] = need[ly->hgroup[i]];
    return pkvi_lcm_reserve(ly->lcm, want);
}

static int by_id(const void *a, const void *b) {
    const pkv_block_id x = *(const pkv_block_id *)a, y = *(const pkv_block_id *)b;
    return (x > y) - (x < y);
}

int pkvi_hybrid_lcm_fits_after_release(const pkv_hybrid *h, const int64_t *need,
                                       const uint32_t *freed, pkv_block_id *const *dead) {
    const lcm_layout *ly = h->layout_ctx;
    if (h->layout != PKV_HYBRID_LCM || !ly) return 0;
    uint32_t want[PKVI_LCM_MAX_GROUPS], fr[PKVI_LCM_MAX_GROUPS], emptied[PKVI_LCM_MAX_GROUPS];
    for (uint32_t i = 0; i < ly->num; i++) {
        const uint32_t g = ly->hgroup[i];
        const int64_t gross = need[g] + freed[g]; // the plan netted the release out
        want[i] = gross > 0 ? (uint32_t)gross : 0;
        fr[i] = freed[g];
        emptied[i] = 0;
        if (!freed[g]) continue; // dead[g] is NULL then
        // A large page empties when the release frees every live small page in it.
        const pkv_pool *pool = pkvi_lcm_pool(ly->lcm, i);
        qsort(dead[g], freed[g], sizeof *dead[g], by_id);
        for (uint32_t j = 0; j < freed[g];) {
            const uint32_t chunk = (uint32_t)dead[g][j] / pool->chunk_pages;
            uint32_t run = 0;
            for (; j < freed[g] && (uint32_t)dead[g][j] / pool->chunk_pages == chunk; j++) run++;
            emptied[i] += run == pkvi_pool_chunk_used(pool, chunk);
        }
    }
    return pkvi_lcm_fits_after(ly->lcm, want, fr, emptied);
}

// The allocator owns the token pools: the sets that release blocks into them go
// first, then the pools leave h->pools so that the teardown does not free them.
static void destroy_lcm(pkv_hybrid *h) {
    lcm_layout *ly = h->layout_ctx;
    if (!ly) return;
    for (uint32_t i = 0; i < ly->num; i++) {
        pkvi_hgroup *hg = &h->groups[ly->hgroup[i]];
        if (hg->owns_set) pkv_seqset_destroy(hg->set);
        hg->set = NULL;
        hg->owns_set = 0;
    }
    for (uint32_t p = 0; p < h->num_pools; p++)
        for (uint32_t i = 0; ly->lcm && i < ly->num; i++)
            if (h->pools[p] == pkvi_lcm_pool(ly->lcm, i)) h->pools[p] = NULL;
    pkvi_lcm_destroy(ly->lcm);
    free(ly);
    h->layout_ctx = NULL;
}

const pkvi_hybrid_layout_ops pkvi_hybrid_lcm_ops = {
    .build = build_lcm,
    .make_room = make_room_lcm,
    .destroy = destroy_lcm,
};

pkvi_lcm *pkvi_hybrid_lcm_allocator(const pkv_hybrid *h) {
    if (!h || h->layout != PKV_HYBRID_LCM || !h->layout_ctx) return NULL;
    return ((const lcm_layout *)h->layout_ctx)->lcm;
}

pkv_status pkvi_hybrid_lcm_validate(const pkv_hybrid *h) {
    if (h->layout != PKV_HYBRID_LCM) return PKV_OK;
    const lcm_layout *ly = h->layout_ctx;
    return ly && ly->lcm ? pkvi_lcm_validate(ly->lcm) : PKV_ERR_CORRUPT;
}

void pkvi_hybrid_lcm_group_stats(const pkv_hybrid *h, uint32_t g, pkv_hybrid_group_stats *stats) {
    if (h->layout != PKV_HYBRID_LCM || !pkvi_hybrid_is_token_group(h, g)) return;
    const lcm_layout *ly = h->layout_ctx;
    pkvi_lcm_stats s;
    pkvi_lcm_get_stats(ly->lcm, &s);
    uint64_t takeable = s.free_large;
    for (uint32_t i = 0; i < ly->num; i++)
        if (ly->hgroup[i] != g) takeable += s.group[i].large_empty;
    stats->free_bytes += takeable * s.large_bytes;
}

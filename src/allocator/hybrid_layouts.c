// SPDX-License-Identifier: MIT
// The fixed layouts of the hybrid KV manager: how the page budget (what the state
// slots leave) becomes pools and sets. PAGED: one pool and one table for every
// token group; PARTITION: a static pool per group by its share of the bytes per
// token; SHARED_PAGE: one pool of equal pages, block sizes per group. The LCM
// layout lives in its own files and plugs in through pkvi_hybrid_layout_ops.
#include "hybrid_internal.h"

static int is_windowed(const pkvi_hgroup *hg) {
    return hg->desc.kind == PKV_LAYER_SLIDING || hg->desc.kind == PKV_LAYER_CHUNKED;
}

static uint64_t sum_bytes_per_token(const pkv_hybrid *h) {
    uint64_t sum = 0;
    for (uint32_t g = 0; g < h->num_groups; g++) sum += h->groups[g].bytes_per_token;
    return sum;
}

// A set of block_size tokens over `pool` for group g.
pkv_status pkvi_hybrid_own_set(pkv_hybrid *h, uint32_t g, pkv_pool *pool,
                               uint32_t block_size) {
    pkvi_hgroup *hg = &h->groups[g];
    hg->pool = pool;
    hg->block_size = block_size;
    hg->windowed = is_windowed(hg);
    pkv_status st = pkv_seqset_create(pool, block_size, &hg->set);
    if (st == PKV_OK) hg->owns_set = 1;
    return st;
}

// Every layer treated as full attention: a page holds block_size tokens of every
// token group, one table serves them all, nothing is released.
static pkv_status build_paged(pkv_hybrid *h, uint64_t page_budget) {
    const uint32_t bs = h->block_size;
    const uint64_t page = bs * sum_bytes_per_token(h);
    pkv_pool *pool;
    pkv_status st = pkvi_hybrid_add_pool(h, page_budget / page, &pool);
    int32_t owner = -1;
    for (uint32_t g = 0; g < h->num_groups && st == PKV_OK; g++) {
        pkvi_hgroup *hg = &h->groups[g];
        if (!pkvi_hybrid_is_token_group(h, g)) continue;
        if (owner < 0) {
            st = pkvi_hybrid_own_set(h, g, pool, bs);
            owner = (int32_t)g;
        } else {
            hg->pool = pool;
            hg->block_size = bs;
            hg->set = h->groups[owner].set;
        }
        hg->windowed = 0;
        hg->page_bytes = bs * hg->bytes_per_token;
    }
    return st;
}

uint32_t pkvi_hybrid_block_size(const pkv_hybrid *h, uint32_t g) {
    return h->block_sizes[g] ? h->block_sizes[g] : h->block_size;
}

// One pool per token group, sized by its share of the bytes per token.
static pkv_status build_partition(pkv_hybrid *h, uint64_t page_budget) {
    const uint64_t sum = sum_bytes_per_token(h);
    pkv_status st = PKV_OK;
    for (uint32_t g = 0; g < h->num_groups && st == PKV_OK; g++) {
        pkvi_hgroup *hg = &h->groups[g];
        if (!pkvi_hybrid_is_token_group(h, g)) continue;
        const uint32_t bs = pkvi_hybrid_block_size(h, g);
        // share = page_budget * bpt / sum without overflow (bpt, sum < 2^31).
        const uint64_t share = page_budget / sum * hg->bytes_per_token +
                               page_budget % sum * hg->bytes_per_token / sum;
        hg->page_bytes = bs * hg->bytes_per_token;
        pkv_pool *pool;
        st = pkvi_hybrid_add_pool(h, share / hg->page_bytes, &pool);
        if (st == PKV_OK) st = pkvi_hybrid_own_set(h, g, pool, bs);
    }
    return st;
}

// vLLM's hybrid manager: one page size P for all, the group with the most bytes
// per token gets block_size tokens per page, every other group as many as fit.
static pkv_status build_shared_page(pkv_hybrid *h, uint64_t page_budget) {
    uint64_t max_bpt = 0;
    for (uint32_t g = 0; g < h->num_groups; g++)
        if (h->groups[g].bytes_per_token > max_bpt) max_bpt = h->groups[g].bytes_per_token;
    const uint64_t page = h->block_size * max_bpt;
    for (uint32_t g = 0; g < h->num_groups; g++)
        if (pkvi_hybrid_is_token_group(h, g) && page / h->groups[g].bytes_per_token > 65536)
            return PKV_ERR_INVALID_ARG; // a block size the sets cannot take
    pkv_pool *pool;
    pkv_status st = pkvi_hybrid_add_pool(h, page_budget / page, &pool);
    for (uint32_t g = 0; g < h->num_groups && st == PKV_OK; g++) {
        pkvi_hgroup *hg = &h->groups[g];
        if (!pkvi_hybrid_is_token_group(h, g)) continue;
        hg->page_bytes = page;
        st = pkvi_hybrid_own_set(h, g, pool, (uint32_t)(page / hg->bytes_per_token));
    }
    return st;
}

static const pkvi_hybrid_layout_ops paged_ops = {.build = build_paged};
static const pkvi_hybrid_layout_ops partition_ops = {.build = build_partition};
static const pkvi_hybrid_layout_ops shared_page_ops = {.build = build_shared_page};

const pkvi_hybrid_layout_ops *pkvi_hybrid_layout_ops_for(pkv_hybrid_layout layout) {
    switch (layout) {
    case PKV_HYBRID_PAGED: return &paged_ops;
    case PKV_HYBRID_PARTITION: return &partition_ops;
    case PKV_HYBRID_SHARED_PAGE: return &shared_page_ops;
    case PKV_HYBRID_LCM: return &pkvi_hybrid_lcm_ops; // hybrid_lcm.c
    }
    return NULL;
}

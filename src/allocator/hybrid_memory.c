// SPDX-License-Identifier: MIT
// The memory map of a hybrid KV manager's groups (hybrid_memory.h): the bytes
// each block id of each token group stands for, derived from the layout's pools.
#include <string.h>

#include "hybrid_internal.h"
#include "hybrid_memory.h"
#include "lcm.h"

// One plain pool per region: the index of `pool` among the regions seen so far
// (a new region when it is new).
static uint32_t region_of(pkvi_hybrid_memory *mem, const pkv_pool **seen, const pkv_pool *pool,
                          uint64_t bytes) {
    for (uint32_t r = 0; r < mem->num_regions; r++)
        if (seen[r] == pool) return r;
    seen[mem->num_regions] = pool;
    mem->region_bytes[mem->num_regions] = bytes;
    return mem->num_regions++;
}

pkv_status pkvi_hybrid_memory_get(const pkv_hybrid *h, pkvi_hybrid_memory *mem) {
    if (!h || !mem) return PKV_ERR_INVALID_ARG;
    memset(mem, 0, sizeof *mem);
    mem->elem_bytes = h->elem_bytes;
    mem->state_slots = h->max_seqs;
    pkvi_lcm *lcm = pkvi_hybrid_lcm_allocator(h);
    pkvi_lcm_stats ls;
    if (lcm) {
        pkvi_lcm_get_stats(lcm, &ls);
        mem->num_regions = 1;
        mem->region_bytes[0] = (uint64_t)ls.num_large * ls.large_bytes;
    }
    // PAGED: one page holds every token group's part, in group order.
    uint64_t paged_page = 0;
    for (uint32_t g = 0; g < h->num_groups; g++)
        if (pkvi_hybrid_is_token_group(h, g)) paged_page += h->groups[g].page_bytes;
    const pkv_pool *seen[PKV_MAX_KV_GROUPS] = {0};
    uint64_t paged_base = 0;
    uint32_t lcm_index = 0; // allocator group i is the i-th token group (hybrid_lcm.c)
    for (uint32_t g = 0; g < h->num_groups; g++) {
        if (!pkvi_hybrid_is_token_group(h, g)) continue;
        const pkvi_hgroup *hg = &h->groups[g];
        pkvi_hybrid_addr *a = &mem->group[g];
        a->owner = pkvi_hybrid_owner(h, g);
        a->page_bytes = hg->page_bytes;
        a->num_blocks = pkv_pool_capacity(hg->pool);
        a->per_chunk = 1;
        switch (h->layout) {
        case PKV_HYBRID_PAGED:
            a->region = region_of(mem, seen, hg->pool, (uint64_t)a->num_blocks * paged_page);
            a->base = paged_base;
            a->page_stride = paged_page;
            paged_base += hg->page_bytes;
            break;
        case PKV_HYBRID_LCM:
            a->region = 0;
            a->page_stride = hg->page_bytes;
            a->per_chunk = ls.group[lcm_index++].pages_per_large;
            a->chunk_bytes = ls.large_bytes;
            continue;
        default: // PARTITION, SHARED_PAGE: a block is one page of its pool
            a->region = region_of(mem, seen, hg->pool, (uint64_t)a->num_blocks * hg->page_bytes);
            a->page_stride = hg->page_bytes;
            break;
        }
        a->chunk_bytes = a->page_stride;
    }
    return PKV_OK;
}

// SPDX-License-Identifier: MIT
// The hybrid KV manager's life cycle: parameters, checking the groups, the state
// slot pools, handing the page budget to the layout (hybrid_layouts.c), and the
// per-sequence records. Invariant after create: every token group has a pool and
// a set (PAGED: the first token group's, shared), every state group a slot pool.
#include <stdlib.h>
#include <string.h>

#include "hybrid_internal.h"

// A group whose token costs more than this is refused as nonsense; it keeps every
// product of the sizing (shares of the budget) inside 64 bits.
#define MAX_BYTES_PER_TOKEN ((uint64_t)1 << 28)

static const char *const layout_names[] = {"paged", "partition", "shared-page", "lcm"};

const char *pkv_hybrid_layout_name(pkv_hybrid_layout layout) {
    return (unsigned)layout < 4 ? layout_names[layout] : "unknown";
}

pkv_status pkv_hybrid_layout_parse(const char *name, pkv_hybrid_layout *layout) {
    if (!name || !layout) return PKV_ERR_INVALID_ARG;
    for (unsigned i = 0; i < 4; i++)
        if (strcmp(name, layout_names[i]) == 0) {
            *layout = (pkv_hybrid_layout)i;
            return PKV_OK;
        }
    return PKV_ERR_INVALID_ARG;
}

void pkv_hybrid_params_default(pkv_hybrid_params *params) {
    if (!params) return;
    memset(params, 0, sizeof *params);
    params->elem_bytes = 2;
    params->layout = PKV_HYBRID_PAGED;
    params->block_size = 16;
    params->max_seqs = 256;
}

// a * b, or 0 when it passes 64 bits (every valid size here is > 0).
static uint64_t mul_or_zero(uint64_t a, uint64_t b) {
    return a && b > UINT64_MAX / a ? 0 : a * b;
}

// Bytes one token costs in a group (all its layers), as model_config.h defines
// pkv_kv_group_bytes_per_token; computed here because the allocator core does not
// link the runtime. 0 for a state group or a size that makes no sense.
static uint64_t group_bytes_per_token(const pkv_kv_group *g, size_t elem) {
    switch (g->kind) {
    case PKV_LAYER_FULL:
    case PKV_LAYER_SLIDING:
    case PKV_LAYER_CHUNKED:
        return mul_or_zero(mul_or_zero(2u * (uint64_t)g->num_layers, g->num_kv_heads),
                           mul_or_zero(g->head_dim, elem));
    case PKV_LAYER_MLA:
        return mul_or_zero((uint64_t)g->num_layers * ((uint64_t)g->latent_dim + g->rope_dim),
                           elem);
    case PKV_LAYER_STATE: return 0;
    }
    return 0;
}

// Check one group and fill its sizes. State groups: page_bytes = the state of every
// layer for one sequence.
static pkv_status init_group(pkvi_hgroup *hg, const pkv_kv_group *desc, size_t elem) {
    memset(hg, 0, sizeof *hg);
    hg->desc = *desc;
    if (desc->num_layers == 0 || (unsigned)desc->kind > PKV_LAYER_STATE) return PKV_ERR_INVALID_ARG;
    if (desc->kind == PKV_LAYER_STATE) {
        hg->page_bytes = mul_or_zero(desc->num_layers, desc->state_bytes);
        return hg->page_bytes ? PKV_OK : PKV_ERR_INVALID_ARG;
    }
    if ((desc->kind == PKV_LAYER_SLIDING || desc->kind == PKV_LAYER_CHUNKED) && desc->window == 0)
        return PKV_ERR_INVALID_ARG;
    hg->bytes_per_token = group_bytes_per_token(desc, elem);
    if (hg->bytes_per_token == 0 || hg->bytes_per_token > MAX_BYTES_PER_TOKEN)
        return PKV_ERR_INVALID_ARG;
    return PKV_OK;
}

pkv_status pkvi_hybrid_add_pool(pkv_hybrid *h, uint64_t blocks, pkv_pool **pool) {
    if (blocks == 0 || blocks > PKV_POOL_MAX_BLOCKS || h->num_pools == PKVI_HYBRID_MAX_POOLS)
        return PKV_ERR_INVALID_ARG;
    pkv_status st = pkv_pool_create((uint32_t)blocks, pool);
    if (st == PKV_OK) h->pools[h->num_pools++] = *pool;
    return st;
}

// Check the parameters that do not depend on the layout's sizing.
static pkv_status check_params(const pkv_hybrid_params *p) {
    if (!p->groups || p->num_groups == 0 || p->num_groups > PKV_MAX_KV_GROUPS ||
        p->elem_bytes == 0 || p->block_size == 0 || p->block_size > 65536 ||
        (unsigned)p->layout > PKV_HYBRID_LCM)
        return PKV_ERR_INVALID_ARG;
    int tokens = 0, states = 0;
    for (uint32_t g = 0; g < p->num_groups; g++) {
        if (p->groups[g].kind == PKV_LAYER_STATE) states++;
        else tokens++;
        if (p->block_sizes[g] > 65536) return PKV_ERR_INVALID_ARG;
        if (p->block_sizes[g] &&
            (p->layout == PKV_HYBRID_PAGED || p->layout == PKV_HYBRID_SHARED_PAGE ||
             p->groups[g].kind == PKV_LAYER_STATE))
            return PKV_ERR_INVALID_ARG;
    }
    for (uint32_t g = p->num_groups; g < PKV_MAX_KV_GROUPS; g++)
        if (p->block_sizes[g]) return PKV_ERR_INVALID_ARG;
    if (tokens == 0 || (states && p->max_seqs == 0)) return PKV_ERR_INVALID_ARG;
    return PKV_OK;
}

// The state groups' slot pools; returns through *page_budget what is left.
static pkv_status build_state_pools(pkv_hybrid *h, uint64_t budget, uint64_t *page_budget) {
    uint64_t used = 0;
    for (uint32_t g = 0; g < h->num_groups; g++) {
        pkvi_hgroup *hg = &h->groups[g];
        if (hg->desc.kind != PKV_LAYER_STATE) continue;
        uint64_t bytes = mul_or_zero(hg->page_bytes, h->max_seqs);
        if (bytes == 0 || bytes > budget - used) return PKV_ERR_INVALID_ARG;
        used += bytes;
        pkv_status st = pkvi_hybrid_add_pool(h, h->max_seqs, &hg->pool);
        if (st != PKV_OK) return st;
    }
    *page_budget = budget - used;
    return PKV_OK;
}

pkv_status pkv_hybrid_create(const pkv_hybrid_params *params, pkv_hybrid **out) {
    if (!out) return PKV_ERR_INVALID_ARG;
    *out = NULL;
    if (!params) return PKV_ERR_INVALID_ARG;
    pkv_status st = check_params(params);
    if (st != PKV_OK) return st;
    const pkvi_hybrid_layout_ops *ops = pkvi_hybrid_layout_ops_for(params->layout);
    if (!ops) return PKV_ERR_UNSUPPORTED;
    pkv_hybrid *h = calloc(1, sizeof *h);
    if (!h) return PKV_ERR_OUT_OF_MEMORY;
    h->layout = params->layout;
    h->elem_bytes = params->elem_bytes;
    h->block_size = params->block_size;
    memcpy(h->block_sizes, params->block_sizes, sizeof h->block_sizes);
    h->max_seqs = params->max_seqs;
    h->num_groups = params->num_groups;
    h->ops = ops;
    uint64_t page_budget = 0;
    for (uint32_t g = 0; g < h->num_groups && st == PKV_OK; g++)
        st = init_group(&h->groups[g], &params->groups[g], params->elem_bytes);
    if (st == PKV_OK) st = build_state_pools(h, params->budget_bytes, &page_budget);
    if (st == PKV_OK) st = ops->build(h, page_budget);
    if (st == PKV_OK) st = pkvi_hybrid_prefix_init(h, params);
    if (st == PKV_OK) st = pkv_pool_create(1, &h->id_pool);
    if (st == PKV_OK) st = pkv_seqset_create(h->id_pool, 1, &h->ids);
    if (st != PKV_OK) {
        pkv_hybrid_destroy(h);
        return st;
    }
    *out = h;
    return PKV_OK;
}

void pkvi_hybrid_teardown(pkv_hybrid *h) {
    for (uint32_t g = 0; g < h->num_groups; g++) {
        pkvi_hgroup *hg = &h->groups[g];
        if (hg->owns_set) pkv_seqset_destroy(hg->set);
        hg->set = NULL;
        hg->owns_set = 0;
        free(hg->copies);
        hg->copies = NULL;
        hg->num_copies = hg->cap_copies = 0;
    }
    for (uint32_t i = 0; i < h->num_pools; i++) pkv_pool_destroy(h->pools[i]);
    h->num_pools = 0;
}

void pkv_hybrid_destroy(pkv_hybrid *h) {
    if (!h) return;
    pkvi_hybrid_prefix_teardown(h); // before the sets, whose releases it hears
    if (h->ops && h->ops->destroy) h->ops->destroy(h);
    pkvi_hybrid_teardown(h);
    pkv_seqset_destroy(h->ids);
    pkv_pool_destroy(h->id_pool);
    free(h->recs);
    free(h->old_len);
    free(h->gids);
    free(h->mark);
    free(h->fill);
    free(h);
}

pkv_hybrid_layout pkv_hybrid_get_layout(const pkv_hybrid *h) {
    return h ? h->layout : PKV_HYBRID_PAGED;
}
uint32_t pkv_hybrid_num_groups(const pkv_hybrid *h) { return h ? h->num_groups : 0; }
uint32_t pkv_hybrid_live_count(const pkv_hybrid *h) { return h ? pkv_seqset_live_count(h->ids) : 0; }

pkv_status pkv_hybrid_group_info(const pkv_hybrid *h, uint32_t g, pkv_kv_group *group,
                                 uint32_t *block_size) {
    if (!h || g >= h->num_groups) return PKV_ERR_INVALID_ARG;
    if (group) *group = h->groups[g].desc;
    if (block_size) *block_size = h->groups[g].block_size;
    return PKV_OK;
}

uint32_t pkvi_hybrid_owner(const pkv_hybrid *h, uint32_t g) {
    for (uint32_t o = 0; o < h->num_groups; o++)
        if (h->groups[o].owns_set && h->groups[o].set == h->groups[g].set) return o;
    return g;
}

int pkvi_hybrid_is_token_group(const pkv_hybrid *h, uint32_t g) {
    return g < h->num_groups && h->groups[g].desc.kind != PKV_LAYER_STATE;
}

pkvi_hrecord *pkvi_hybrid_rec(const pkv_hybrid *h, pkv_seq_id id) {
    if (!h || id < 0) return NULL;
    uint32_t idx = (uint32_t)id & 0xFFFFFu; // seq.h: the low 20 bits name the slot
    if (idx >= h->cap_recs) return NULL;
    pkvi_hrecord *r = &h->recs[idx];
    return r->live && r->id == id ? r : NULL;
}

// Size the batch scratch for k sequences.
pkv_status pkvi_hybrid_reserve_scratch(pkv_hybrid *h, uint32_t k) {
    if (k <= h->cap_scratch) return PKV_OK;
    uint32_t *ol = realloc(h->old_len, (size_t)k * sizeof *ol);
    if (!ol) return PKV_ERR_OUT_OF_MEMORY;
    h->old_len = ol;
    pkv_seq_id *gi = realloc(h->gids, (size_t)k * sizeof *gi);
    if (!gi) return PKV_ERR_OUT_OF_MEMORY;
    h->gids = gi;
    h->cap_scratch = k;
    return PKV_OK;
}

void pkvi_hybrid_released(pkv_hybrid *h) {
    if (h->ops->after_release) h->ops->after_release(h);
}

// SPDX-License-Identifier: MIT
// pkv/hybrid_vmm.h: one VMM space per KV cache group under one shared budget. A
// length change is made all or nothing across the groups in two passes: first
// every group unmaps what it no longer keeps (that only frees), then every group
// maps what it newly needs; the budget check before both covers the total, so the
// second pass cannot run short (reclaim never loses bytes: a released page's bytes
// become headroom for any member).
#include <stdlib.h>
#include <string.h>

#include "pkv/hybrid_vmm.h"
#include "vmm_impl.h"

typedef struct hv_group {
    pkv_kv_group desc;
    pkv_vmm_space *space;
    uint64_t token_bytes; // per buffer: one token (token groups) or the state (STATE)
    uint32_t buffers;
} hv_group;

struct pkv_hybrid_vmm {
    pkv_hybrid_vmm_params params;
    uint32_t num_groups;
    hv_group g[PKV_MAX_KV_GROUPS];
    pkv_vmm_budget *budget;
    uint8_t *taken;   // [max_seqs]
    uint32_t *length; // [max_seqs]
    uint32_t *from;   // [max_seqs]: first query position of the last step (length - 1)
};

void pkv_hybrid_vmm_params_default(pkv_hybrid_vmm_params *p) {
    if (!p) return;
    memset(p, 0, sizeof *p);
    p->elem_bytes = 2;
    p->max_seqs = 1;
    p->max_seq_len = 4096;
    p->device = -1;
    p->host_mode = PKV_VMM_HOST_MEMFD;
}

static int is_state(const hv_group *g) { return g->desc.kind == PKV_LAYER_STATE; }

// Buffers and bytes per buffer of a group; 0 when the group is invalid.
static int shape(hv_group *g, size_t elem) {
    const pkv_kv_group *d = &g->desc;
    uint64_t per = 0;
    switch (d->kind) {
    case PKV_LAYER_SLIDING:
    case PKV_LAYER_CHUNKED:
        if (d->window == 0) return 0;
        /* fall through */
    case PKV_LAYER_FULL:
        g->buffers = 2 * d->num_layers;
        per = (uint64_t)d->num_kv_heads * d->head_dim; // < 2^64: two 32-bit factors
        per = per > ((uint64_t)1 << 40) / elem ? 0 : per * elem; // 0: refused below
        break;
    case PKV_LAYER_MLA:
        g->buffers = d->num_layers;
        per = ((uint64_t)d->latent_dim + d->rope_dim) * elem;
        break;
    case PKV_LAYER_STATE:
        g->buffers = d->num_layers;
        per = d->state_bytes;
        break;
    default: return 0;
    }
    g->token_bytes = per;
    return d->num_layers > 0 && d->num_layers <= PKV_MAX_LAYERS && per > 0 &&
           per <= ((uint64_t)1 << 40);
}

void pkv_hybrid_vmm_destroy(pkv_hybrid_vmm *h) {
    if (!h) return;
    for (uint32_t i = 0; i < h->num_groups; i++) pkv_vmm_space_destroy(h->g[i].space);
    pkv_vmm_budget_destroy(h->budget);
    free(h->taken);
    free(h->length);
    free(h->from);
    free(h);
}

pkv_status pkv_hybrid_vmm_create(const pkv_hybrid_vmm_params *p, pkv_hybrid_vmm **out) {
    if (!out) return PKV_ERR_INVALID_ARG;
    *out = NULL;
    if (!p || !p->groups || p->num_groups == 0 || p->num_groups > PKV_MAX_KV_GROUPS ||
        p->elem_bytes == 0 || p->budget_bytes == 0 || p->max_seqs == 0 || p->max_seq_len == 0)
        return PKV_ERR_INVALID_ARG;
    pkv_hybrid_vmm *h = calloc(1, sizeof *h);
    if (!h) return PKV_ERR_OUT_OF_MEMORY;
    h->params = *p;
    h->params.groups = NULL; // copied into g[]
    h->num_groups = p->num_groups;
    int tokens = 0;
    for (uint32_t i = 0; i < p->num_groups; i++) {
        h->g[i].desc = p->groups[i];
        if (!shape(&h->g[i], p->elem_bytes)) {
            pkv_hybrid_vmm_destroy(h);
            return PKV_ERR_INVALID_ARG;
        }
        tokens += !is_state(&h->g[i]);
    }
    h->taken = calloc(p->max_seqs, 1);
    h->length = calloc(p->max_seqs, sizeof *h->length);
    h->from = calloc(p->max_seqs, sizeof *h->from);
    pkv_status st = tokens ? PKV_OK : PKV_ERR_INVALID_ARG;
    if (st == PKV_OK && (!h->taken || !h->length || !h->from)) st = PKV_ERR_OUT_OF_MEMORY;
    if (st == PKV_OK) st = pkv_vmm_budget_create(p->budget_bytes, &h->budget);
    for (uint32_t i = 0; i < h->num_groups && st == PKV_OK; i++) {
        hv_group *g = &h->g[i];
        pkv_vmm_params vp = pkv_vmm_params_default();
        vp.num_slots = p->max_seqs;
        vp.num_buffers = g->buffers;
        if (!is_state(g) && g->token_bytes > UINT64_MAX / p->max_seq_len) {
            st = PKV_ERR_INVALID_ARG; // a row of max_seq_len tokens passes 64 bits
            break;
        }
        vp.buffer_bytes = is_state(g) ? g->token_bytes : g->token_bytes * p->max_seq_len;
        vp.page_bytes = p->page_bytes;
        vp.max_pages = 0; // the shared budget bounds them
        vp.host_mode = p->host_mode;
        st = p->device < 0 ? pkv_vmm_space_create_host(&vp, &g->space)
                           : pkv_vmm_space_create_cuda(p->device, &vp, &g->space);
        if (st == PKV_OK) st = pkv_vmm_budget_attach(h->budget, g->space);
    }
    if (st != PKV_OK) {
        pkv_hybrid_vmm_destroy(h);
        return st;
    }
    *out = h;
    return PKV_OK;
}

// Pages [lo, hi) group g keeps for a sequence of n tokens whose queries start at
// position `from` (< n; n - 1 but in a step of several tokens): the tokens from
// the first query's window on (a state group: its whole row while the sequence
// lives).
static void kept_pages(const hv_group *g, uint32_t from, uint32_t n, int alive, uint64_t *lo,
                       uint64_t *hi) {
    uint64_t page = g->space->info.page_bytes;
    *lo = *hi = 0;
    if (!alive) return;
    if (is_state(g)) {
        *hi = (g->token_bytes + page - 1) / page;
        return;
    }
    if (n == 0) return;
    uint64_t kept = pkv_kv_group_tokens_kept(&g->desc, (uint64_t)from + 1);
    *lo = ((uint64_t)from + 1 - kept) * g->token_bytes / page;
    *hi = ((uint64_t)n * g->token_bytes + page - 1) / page;
}

// Does the budget cover every group moving from its current range to [lo, hi)?
// Each group's pages it gives up or caches serve it first; what is left of every
// member's cache and the budget's headroom serve the rest, by bytes.
static int fits(const pkv_hybrid_vmm *h, uint32_t slot, const uint64_t *lo, const uint64_t *hi) {
    uint64_t fresh_bytes = 0, room;
    pkv_vmm_budget_stats bs;
    pkv_vmm_budget_get_stats(h->budget, &bs);
    room = bs.bytes - bs.bytes_used;
    for (uint32_t i = 0; i < h->num_groups; i++) {
        const pkv_vmm_space *s = h->g[i].space;
        uint64_t olo = s->slot_first[slot], ohi = olo + s->slot_pages[slot];
        uint64_t klo = olo > lo[i] ? olo : lo[i], khi = ohi < hi[i] ? ohi : hi[i];
        uint64_t kept = khi > klo ? khi - klo : 0, nb = s->info.num_buffers;
        uint64_t need = (hi[i] - lo[i] - kept) * nb;
        uint64_t cached = s->num_free + (ohi - olo - kept) * nb;
        if (need > cached) fresh_bytes += (need - cached) * s->info.page_bytes;
        else room += (cached - need) * s->info.page_bytes;
    }
    return fresh_bytes <= room;
}

// Move every group of `slot` to [lo, hi): unmaps first, then maps.
static pkv_status apply(pkv_hybrid_vmm *h, uint32_t slot, const uint64_t *lo, const uint64_t *hi) {
    if (!fits(h, slot, lo, hi)) return PKV_ERR_OUT_OF_BLOCKS;
    uint64_t klo[PKV_MAX_KV_GROUPS], khi[PKV_MAX_KV_GROUPS];
    pkv_status first = PKV_OK;
    for (uint32_t i = 0; i < h->num_groups; i++) {
        pkv_vmm_space *s = h->g[i].space;
        uint64_t page = s->info.page_bytes;
        uint64_t olo = s->slot_first[slot], ohi = olo + s->slot_pages[slot];
        klo[i] = olo > lo[i] ? olo : lo[i];
        khi[i] = ohi < hi[i] ? ohi : hi[i];
        if (khi[i] < klo[i]) khi[i] = klo[i];
        pkv_status st = pkv_vmm_slot_map_range(s, slot, klo[i] * page, khi[i] * page);
        if (st != PKV_OK && first == PKV_OK) first = st; // a failed unmap: the page is lost
    }
    for (uint32_t i = 0; i < h->num_groups; i++) {
        pkv_vmm_space *s = h->g[i].space;
        uint64_t page = s->info.page_bytes;
        pkv_status st = pkv_vmm_slot_map_range(s, slot, lo[i] * page, hi[i] * page);
        if (st == PKV_OK) continue;
        for (uint32_t j = 0; j < i; j++) { // back to the kept runs
            uint64_t pj = h->g[j].space->info.page_bytes;
            (void)pkv_vmm_slot_map_range(h->g[j].space, slot, klo[j] * pj, khi[j] * pj);
        }
        return st;
    }
    return first;
}

static pkv_status move_to(pkv_hybrid_vmm *h, uint32_t slot, uint32_t from, uint32_t n, int alive) {
    uint64_t lo[PKV_MAX_KV_GROUPS], hi[PKV_MAX_KV_GROUPS];
    for (uint32_t i = 0; i < h->num_groups; i++)
        kept_pages(&h->g[i], from, n, alive, &lo[i], &hi[i]);
    return apply(h, slot, lo, hi);
}

pkv_status pkv_hybrid_vmm_acquire(pkv_hybrid_vmm *h, uint32_t *slot) {
    if (!h || !slot) return PKV_ERR_INVALID_ARG;
    uint32_t s = 0;
    while (s < h->params.max_seqs && h->taken[s]) s++;
    if (s == h->params.max_seqs) return PKV_ERR_OUT_OF_BLOCKS;
    for (uint32_t i = 0; i < h->num_groups; i++) {
        uint32_t got;
        pkv_status st = pkv_vmm_slot_acquire(h->g[i].space, &got);
        if (st == PKV_OK && got == s) continue;
        if (st == PKV_OK) (void)pkv_vmm_slot_release(h->g[i].space, got);
        for (uint32_t j = 0; j < i; j++) (void)pkv_vmm_slot_release(h->g[j].space, s);
        return st == PKV_OK ? PKV_ERR_CORRUPT : st; // the spaces' slots disagree
    }
    pkv_status st = move_to(h, s, 0, 0, 1);
    if (st != PKV_OK) {
        for (uint32_t i = 0; i < h->num_groups; i++) (void)pkv_vmm_slot_release(h->g[i].space, s);
        return st;
    }
    h->taken[s] = 1;
    h->length[s] = 0;
    h->from[s] = 0;
    *slot = s;
    return PKV_OK;
}

pkv_status pkv_hybrid_vmm_set_step(pkv_hybrid_vmm *h, uint32_t slot, uint32_t first, uint32_t n) {
    if (!h || slot >= h->params.max_seqs || !h->taken[slot] || n > h->params.max_seq_len ||
        (n > 0 && first >= n) || (n == 0 && first != 0))
        return PKV_ERR_INVALID_ARG;
    pkv_status st = move_to(h, slot, first, n, 1);
    if (st == PKV_OK || st == PKV_ERR_BACKEND) {
        h->length[slot] = n;
        h->from[slot] = first;
    }
    return st;
}

pkv_status pkv_hybrid_vmm_set_length(pkv_hybrid_vmm *h, uint32_t slot, uint32_t n) {
    return pkv_hybrid_vmm_set_step(h, slot, n ? n - 1 : 0, n);
}

pkv_status pkv_hybrid_vmm_release(pkv_hybrid_vmm *h, uint32_t slot) {
    if (!h || slot >= h->params.max_seqs || !h->taken[slot]) return PKV_ERR_INVALID_ARG;
    pkv_status first = PKV_OK;
    for (uint32_t i = 0; i < h->num_groups; i++) {
        pkv_status st = pkv_vmm_slot_release(h->g[i].space, slot);
        if (st != PKV_OK && first == PKV_OK) first = st;
    }
    h->taken[slot] = 0;
    h->length[slot] = 0;
    h->from[slot] = 0;
    return first;
}

pkv_vmm_space *pkv_hybrid_vmm_space(const pkv_hybrid_vmm *h, uint32_t group) {
    return h && group < h->num_groups ? h->g[group].space : NULL;
}

uint64_t pkv_hybrid_vmm_buffer_token_bytes(const pkv_hybrid_vmm *h, uint32_t group) {
    return h && group < h->num_groups ? h->g[group].token_bytes : 0;
}

pkv_status pkv_hybrid_vmm_budget_stats(const pkv_hybrid_vmm *h, pkv_vmm_budget_stats *stats) {
    if (!h) return PKV_ERR_INVALID_ARG;
    return pkv_vmm_budget_get_stats(h->budget, stats);
}

pkv_status pkv_hybrid_vmm_validate(const pkv_hybrid_vmm *h) {
    if (!h) return PKV_ERR_INVALID_ARG;
    for (uint32_t i = 0; i < h->num_groups; i++) {
        const pkv_vmm_space *s = h->g[i].space;
        pkv_status st = pkv_vmm_validate(s);
        if (st != PKV_OK) return st;
        for (uint32_t slot = 0; slot < h->params.max_seqs; slot++) {
            uint64_t lo, hi;
            kept_pages(&h->g[i], h->from[slot], h->length[slot], h->taken[slot], &lo, &hi);
            uint64_t n = s->slot_pages[slot];
            if (s->slot_taken[slot] != h->taken[slot] || n != hi - lo ||
                (n && s->slot_first[slot] != lo))
                return PKV_ERR_CORRUPT;
        }
    }
    return PKV_OK;
}

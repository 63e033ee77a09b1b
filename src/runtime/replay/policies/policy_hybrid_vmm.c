// SPDX-License-Identifier: MIT
// The `hybrid-vmm` KV policy (issue 23): the `vmm` policy's design (vAttention,
// policy_vmm.c) applied to a model's KV cache groups. Per token group (FULL,
// SLIDING, CHUNKED, MLA), every sequence owns a virtual buffer per buffer of the
// group (K and V of each layer: 2 x layers buffers; MLA: one latent per layer,
// layers buffers) and physical pages of page_bytes are mapped behind it as the
// group's tokens fill it: a "page group" of the group's buffers, one page each,
// holds page_bytes / (bytes per token and buffer) tokens. A SLIDING or CHUNKED
// group unmaps the page groups wholly before its window (pkv/hybrid.h's rule: an
// append at p makes the tokens before first_live(p) dead; the page group of tokens
// j*T .. j*T + T - 1 goes once j*T + T <= first_live(p)). A STATE group has a
// buffer per layer, as pkv_hybrid_vmm maps it, and maps layers x ceil(one layer's
// state bytes / page_bytes) pages per sequence at admission.
//
// Physical pages are one budget of interchangeable pages (capacity / page_bytes)
// shared by every group, so there is no external fragmentation. The vmm machinery
// is shared (vmm_common.h): the page, the pricing of one call per page, map-ahead
// (the next page group mapped by a background thread when a decode fills a
// group's last one, admission maps and the unmaps overlapped). Deferred
// reclamation (vmm's reuse of finished rows) is not modelled: a finished request
// unmaps its pages.
//
// Swap: swap_out unmaps a request's mapped page groups and keeps its rows'
// extents; swap_in maps exactly those again (a windowed group its window, not its
// context); request_slots is those pages.
//
// Forks: no sharing between rows, as in vmm: a request's rows are mapped for the
// prompt at admission and the fork copies the prompt's kept tokens into each
// sample's row (counted as device copies).
//
// Accounting in slots of cfg->bytes_per_token (one token of every group):
// reserved = the mapped bytes, rounded up; used = the bytes of the tokens each
// group keeps (pkv_kv_group_tokens_kept) plus the states, rounded down. For a
// uniform model (one FULL group) it is `vmm` without deferred reclamation.
#include <stdlib.h>
#include <string.h>

#include "src/runtime/replay/policies/vmm_common.h"
#include "src/runtime/replay/replay_internal.h"

typedef struct hvmm {
    pkv_policy_host host;
    uint64_t page;           // page_bytes
    int map_ahead;
    uint32_t ng;             // groups
    pkv_kv_group g[PKV_MAX_KV_GROUPS];
    uint64_t gbpt[PKV_MAX_KV_GROUPS];     // bytes per token of the group (0: state)
    uint32_t buffers[PKV_MAX_KV_GROUPS];  // pages per page group (state: pages per sequence)
    uint64_t tpp[PKV_MAX_KV_GROUPS];      // tokens per page group (0: state group)
    uint64_t state_bytes[PKV_MAX_KV_GROUPS]; // per sequence (state groups)
    uint64_t bpt, capacity_slots;
    uint64_t pages_cap, pages_used;
    uint32_t max_seq_len, num_requests;
    uint64_t *seq_base;      // [num_requests]: first row of the request
    uint32_t *nrows;         // [num_requests]: rows mapped (0: not admitted, or swapped out)
    uint32_t *out_rows;      // [num_requests]: rows of a swapped-out request (their lo,
                             // hi and len kept: swap_in maps the same page groups again)
    uint32_t *len;           // [rows]
    uint32_t *lo, *hi;       // [rows x ng]: page groups lo..hi-1 are mapped
    uint64_t held[PKV_MAX_KV_GROUPS];     // page groups (state: rows) held
    uint64_t released[PKV_MAX_KV_GROUPS]; // page groups unmapped by the window rule
    uint64_t used_bytes;     // kept bytes over every row
    uint64_t map_calls, unmap_calls;
    double copy_bytes;
} hvmm;

static uint64_t ceil_div64(uint64_t a, uint64_t b) { return (a + b - 1) / b; }

static int windowed(const pkv_kv_group *k) {
    return k->kind == PKV_LAYER_SLIDING || k->kind == PKV_LAYER_CHUNKED;
}

// pkv/hybrid.h's window rule: the first token the query at p still sees.
static uint64_t first_live(const pkv_kv_group *k, uint64_t p) {
    if (k->kind == PKV_LAYER_SLIDING) return p >= k->window ? p - k->window + 1 : 0;
    if (k->kind == PKV_LAYER_CHUNKED) return p / k->window * k->window;
    return 0;
}

// Buffers, tokens per page group and state pages of each group; -1 when a token
// of a buffer does not fit a page.
static int shape(hvmm *v, const pkv_policy_config *cfg) {
    v->ng = cfg->num_groups;
    for (uint32_t g = 0; g < v->ng; g++) {
        const pkv_kv_group *k = &cfg->groups[g];
        v->g[g] = *k;
        v->gbpt[g] = cfg->group_bytes_per_token[g];
        if (k->kind == PKV_LAYER_STATE) {
            v->state_bytes[g] = pkv_kv_group_state_bytes(k);
            // Whole pages per layer: layers do not share a page (pkv_hybrid_vmm).
            const uint64_t pages = (uint64_t)k->num_layers * ceil_div64(k->state_bytes, v->page);
            if (pages == 0 || pages > UINT32_MAX) return -1;
            v->buffers[g] = (uint32_t)pages;
            v->tpp[g] = 0;
            continue;
        }
        const uint32_t per_layer = k->kind == PKV_LAYER_MLA ? 1 : 2;
        v->buffers[g] = per_layer * k->num_layers;
        if (v->buffers[g] == 0 || v->gbpt[g] % v->buffers[g] != 0) return -1;
        v->tpp[g] = v->page / (v->gbpt[g] / v->buffers[g]);
        if (v->tpp[g] == 0) return -1;
    }
    return v->ng ? 0 : -1;
}

static uint64_t pg_for(const hvmm *v, uint32_t g, uint64_t tokens) { return ceil_div64(tokens, v->tpp[g]); }

// Bytes one row of len tokens keeps: each group's kept tokens, and its states.
static uint64_t row_kept(const hvmm *v, uint32_t len) {
    uint64_t b = 0;
    for (uint32_t g = 0; g < v->ng; g++)
        b += v->tpp[g] ? pkv_kv_group_tokens_kept(&v->g[g], len) * v->gbpt[g] : v->state_bytes[g];
    return b;
}

// Pages one row takes at admission with len tokens (states included).
static uint64_t admit_pages(const hvmm *v, uint32_t len) {
    uint64_t p = 0;
    for (uint32_t g = 0; g < v->ng; g++) p += (v->tpp[g] ? pg_for(v, g, len) : 1) * v->buffers[g];
    return p;
}

// Most pages one row holds growing to final_len: every page group of a full group
// (plus one mapped ahead when the last token fills one); a windowed group's window, its partly dead first page
// group and the one mapped ahead, at most; never less than admission's.
static uint64_t peak_pages(const hvmm *v, uint32_t len, uint32_t final_len) {
    uint64_t p = 0;
    for (uint32_t g = 0; g < v->ng; g++) {
        if (!v->tpp[g]) {
            p += v->buffers[g];
            continue;
        }
        uint64_t n = pg_for(v, g, final_len);
        if (v->map_ahead && final_len < v->max_seq_len && pg_for(v, g, (uint64_t)final_len + 1) > n)
            n++; // mapped ahead after the last token (as vmm's final_groups)
        if (windowed(&v->g[g])) {
            const uint64_t w = pg_for(v, g, v->g[g].window) + 1 + (v->map_ahead ? 1 : 0);
            if (w < n) n = w;
        }
        if (n < pg_for(v, g, len)) n = pg_for(v, g, len);
        p += n * v->buffers[g];
    }
    return p;
}

// Pages the watermark (wm slots) asks to keep free.
static uint64_t wm_pages(const hvmm *v, uint64_t wm) {
    uint64_t p = 0;
    for (uint32_t g = 0; g < v->ng; g++)
        if (v->tpp[g]) p += pg_for(v, g, wm) * v->buffers[g];
    return p;
}

static uint64_t free_pages(const hvmm *v) { return v->pages_cap - v->pages_used; }

// Map (is_unmap 0) or unmap n page groups of group g.
static void move_pages(hvmm *v, uint32_t g, int is_unmap, uint64_t n, int overlap) {
    const uint64_t pages = n * v->buffers[g];
    if (is_unmap) {
        v->unmap_calls += pages;
        v->pages_used -= pages;
        v->held[g] -= n;
    } else {
        v->map_calls += pages;
        v->pages_used += pages;
        v->held[g] += n;
    }
    pkvi_vmm_charge(&v->host, is_unmap, v->page, pages, overlap);
}

static uint32_t *lo_of(hvmm *v, uint64_t row) { return &v->lo[row * v->ng]; }
static uint32_t *hi_of(hvmm *v, uint64_t row) { return &v->hi[row * v->ng]; }

static pkv_status hvmm_admit(void *pp, uint32_t r, const pkv_policy_admit *a, uint64_t wm,
                             uint64_t *ext_frag, uint32_t *cached) {
    hvmm *v = pp;
    *cached = 0;
    *ext_frag = 0; // interchangeable pages
    const uint32_t rows = a->n > a->nseq ? a->n : a->nseq;
    if ((uint64_t)rows * admit_pages(v, a->len) + wm_pages(v, wm) > free_pages(v))
        return PKV_ERR_OUT_OF_BLOCKS;
    const uint64_t b = v->seq_base[r];
    for (uint32_t i = 0; i < rows; i++) {
        uint32_t *lo = lo_of(v, b + i), *hi = hi_of(v, b + i);
        for (uint32_t g = 0; g < v->ng; g++) {
            lo[g] = 0;
            hi[g] = (uint32_t)(v->tpp[g] ? pg_for(v, g, a->len) : 1);
            move_pages(v, g, 0, hi[g], v->map_ahead); // eager allocation
        }
        v->len[b + i] = i < a->nseq ? a->len : 0;
        if (i < a->nseq) v->used_bytes += row_kept(v, a->len);
    }
    if (a->nseq > 1 && !a->independent)
        v->copy_bytes += (double)(a->nseq - 1) * (double)row_kept(v, a->prompt);
    v->nrows[r] = rows;
    return PKV_OK;
}

static pkv_status hvmm_fork(void *pp, uint32_t r, uint32_t n) {
    hvmm *v = pp;
    const uint64_t b = v->seq_base[r];
    if (n > v->nrows[r]) return PKV_ERR_INVALID_ARG;
    for (uint32_t i = 1; i < n; i++) { // the rows were mapped at admission
        v->len[b + i] = v->len[b];
        const uint64_t k = row_kept(v, v->len[b]);
        v->used_bytes += k;
        v->copy_bytes += (double)k;
    }
    return PKV_OK;
}

static pkv_status hvmm_grow(void *pp, uint32_t r, uint32_t child) {
    hvmm *v = pp;
    if (child >= v->nrows[r]) return PKV_ERR_INVALID_ARG;
    const uint64_t i = v->seq_base[r] + child;
    const uint32_t p = v->len[i];
    if ((uint64_t)p + 1 > v->max_seq_len) return PKV_ERR_INVALID_ARG; // outgrew the reservation
    uint32_t *lo = lo_of(v, i), *hi = hi_of(v, i);
    // The query at p: windowed groups unmap the page groups it can no longer see.
    for (uint32_t g = 0; g < v->ng; g++) {
        if (!v->tpp[g] || !windowed(&v->g[g])) continue;
        uint64_t dead = first_live(&v->g[g], p) / v->tpp[g];
        if (dead > hi[g]) dead = hi[g];
        if (dead > lo[g]) {
            move_pages(v, g, 1, dead - lo[g], v->map_ahead);
            v->released[g] += dead - lo[g];
            lo[g] = (uint32_t)dead;
        }
    }
    // Not mapped ahead (map-ahead off, or memory was short then): map now.
    uint64_t need = 0;
    for (uint32_t g = 0; g < v->ng; g++)
        if (v->tpp[g] && pg_for(v, g, (uint64_t)p + 1) > hi[g]) need += v->buffers[g];
    if (need > free_pages(v)) return PKV_ERR_OUT_OF_BLOCKS;
    const uint64_t before = row_kept(v, p);
    v->len[i] = p + 1;
    // May shrink (a chunked group's kept tokens drop at a chunk boundary): subtract
    // first, which cannot wrap (used_bytes holds this row's `before`).
    v->used_bytes = v->used_bytes - before + row_kept(v, p + 1);
    for (uint32_t g = 0; g < v->ng; g++) {
        if (!v->tpp[g]) continue;
        if (pg_for(v, g, (uint64_t)p + 1) > hi[g]) {
            move_pages(v, g, 0, 1, 0);
            hi[g]++;
        }
        // Map-ahead: the group's last page group is full; map the next during the
        // next step, if memory allows (else the next grow maps it in line).
        if (v->map_ahead && (uint64_t)p + 1 < v->max_seq_len && pg_for(v, g, (uint64_t)p + 2) > hi[g] &&
            free_pages(v) >= v->buffers[g]) {
            move_pages(v, g, 0, 1, 1);
            hi[g]++;
        }
    }
    return PKV_OK;
}

// Swap-out: the rows' mapped page groups (a windowed group only its window's) go to
// the host; the rows keep their extents, so swap_in maps exactly those again.
static pkv_status hvmm_swap_out(void *pp, uint32_t r) {
    hvmm *v = pp;
    if (!v->nrows[r]) return PKV_ERR_INVALID_ARG;
    const uint64_t b = v->seq_base[r];
    for (uint32_t i = 0; i < v->nrows[r]; i++) {
        const uint32_t *lo = lo_of(v, b + i), *hi = hi_of(v, b + i);
        for (uint32_t g = 0; g < v->ng; g++) move_pages(v, g, 1, hi[g] - lo[g], v->map_ahead);
        if (v->len[b + i]) v->used_bytes -= row_kept(v, v->len[b + i]);
    }
    v->out_rows[r] = v->nrows[r];
    v->nrows[r] = 0;
    return PKV_OK;
}

// Swap-in: the same page groups mapped again, the rows at the engine's length (a
// sample that grew in the preempting step drops that token and any page group it
// opened), with the watermark kept free.
static pkv_status hvmm_swap_in(void *pp, uint32_t r, const pkv_policy_admit *a, uint64_t wm,
                               uint64_t *ext_frag) {
    hvmm *v = pp;
    *ext_frag = 0;
    const uint32_t rows = v->out_rows[r];
    if (!rows) return PKV_ERR_INVALID_ARG;
    const uint64_t b = v->seq_base[r];
    uint64_t need = 0;
    for (uint32_t i = 0; i < rows; i++) {
        uint32_t *lo = lo_of(v, b + i), *hi = hi_of(v, b + i);
        if (v->len[b + i] > a->len) {
            v->len[b + i] = a->len;
            for (uint32_t g = 0; g < v->ng; g++) {
                const uint64_t n = v->tpp[g] ? pg_for(v, g, a->len) : 1;
                if (n < hi[g]) hi[g] = (uint32_t)(n > lo[g] ? n : lo[g]);
            }
        }
        for (uint32_t g = 0; g < v->ng; g++) need += (uint64_t)(hi[g] - lo[g]) * v->buffers[g];
    }
    if (need + wm_pages(v, wm) > free_pages(v)) return PKV_ERR_OUT_OF_BLOCKS;
    for (uint32_t i = 0; i < rows; i++) {
        const uint32_t *lo = lo_of(v, b + i), *hi = hi_of(v, b + i);
        for (uint32_t g = 0; g < v->ng; g++) move_pages(v, g, 0, hi[g] - lo[g], v->map_ahead);
        if (v->len[b + i]) v->used_bytes += row_kept(v, v->len[b + i]);
    }
    v->nrows[r] = rows;
    v->out_rows[r] = 0;
    return PKV_OK;
}

// What a swap moves: the request's mapped pages, in slots (rounded up).
static uint64_t hvmm_request_slots(const void *pp, uint32_t r, uint32_t nseq, uint32_t len,
                                   uint32_t prompt) {
    const hvmm *v = pp;
    (void)prompt;
    const uint64_t b = v->seq_base[r];
    uint64_t pages = 0;
    for (uint32_t i = 0; i < v->nrows[r]; i++) {
        const uint32_t *lo = &v->lo[(b + i) * v->ng], *hi = &v->hi[(b + i) * v->ng];
        for (uint32_t g = 0; g < v->ng; g++) pages += (uint64_t)(hi[g] - lo[g]) * v->buffers[g];
    }
    return v->nrows[r] ? ceil_div64(pages * v->page, v->bpt) : (uint64_t)(nseq ? nseq : 1) * len;
}

static void hvmm_release(void *pp, uint32_t r) {
    hvmm *v = pp;
    const uint64_t b = v->seq_base[r];
    if (v->out_rows[r]) { // dropped while swapped out: nothing is mapped
        for (uint32_t i = 0; i < v->out_rows[r]; i++) {
            uint32_t *lo = lo_of(v, b + i), *hi = hi_of(v, b + i);
            for (uint32_t g = 0; g < v->ng; g++) lo[g] = hi[g] = 0;
            v->len[b + i] = 0;
        }
        v->out_rows[r] = 0;
        return;
    }
    for (uint32_t i = 0; i < v->nrows[r]; i++) {
        uint32_t *lo = lo_of(v, b + i), *hi = hi_of(v, b + i);
        for (uint32_t g = 0; g < v->ng; g++) {
            move_pages(v, g, 1, hi[g] - lo[g], v->map_ahead);
            lo[g] = hi[g] = 0;
        }
        if (v->len[b + i]) v->used_bytes -= row_kept(v, v->len[b + i]); // counted rows hold tokens
        v->len[b + i] = 0;
    }
    v->nrows[r] = 0;
}

static int hvmm_fits_alone(const void *pp, const pkv_policy_admit *a, uint64_t wm) {
    const hvmm *v = pp;
    const uint32_t rows = a->n > a->nseq ? a->n : a->nseq;
    if ((uint64_t)rows * admit_pages(v, a->len) + wm_pages(v, wm) > v->pages_cap) return 0;
    return (uint64_t)rows * peak_pages(v, a->len, a->final_len) <= v->pages_cap;
}

static uint64_t hvmm_reservation(const void *pp, uint32_t r, uint32_t nseq, uint32_t len,
                                 uint32_t final_len) {
    const hvmm *v = pp;
    (void)nseq;
    (void)len;
    const uint64_t b = v->seq_base[r];
    uint64_t bytes = 0;
    for (uint32_t i = 0; i < v->nrows[r]; i++) {
        const uint32_t *hi = &v->hi[(b + i) * v->ng];
        for (uint32_t g = 0; g < v->ng; g++) {
            if (!v->tpp[g]) continue;
            const uint64_t res = hi[g] * v->tpp[g];
            const uint64_t fillable = res < final_len ? res : final_len;
            bytes += (fillable > v->len[b + i] ? fillable - v->len[b + i] : 0) * v->gbpt[g];
        }
    }
    return bytes / v->bpt;
}

static void hvmm_stats(const void *pp, pkv_policy_stats *s) {
    const hvmm *v = pp;
    const uint64_t reserved = ceil_div64(v->pages_used * v->page, v->bpt);
    s->reserved = reserved < v->capacity_slots ? reserved : v->capacity_slots;
    const uint64_t used = v->used_bytes / v->bpt;
    s->used = used < s->reserved ? used : s->reserved;
    s->free = v->capacity_slots - s->reserved;
    s->copy_slots = (uint64_t)(v->copy_bytes / (double)v->bpt);
    s->cow_copies = 0;
    s->cached_tokens = 0;
    s->num_groups = v->ng;
    for (uint32_t g = 0; g < v->ng; g++) {
        s->groups[g].bytes_held = v->held[g] * v->buffers[g] * v->page;
        s->groups[g].tokens_held = v->held[g] * v->tpp[g];
        s->groups[g].blocks_held = v->held[g];
        s->groups[g].blocks_released = v->released[g];
        s->groups[g].cached_tokens = 0;
    }
}

// Every mapped page is unmapped once: map - unmap calls equal the pages held; each
// row's mapped page groups cover what its groups keep; the sums agree.
static pkv_status hvmm_validate(const void *pp) {
    const hvmm *v = pp;
    if (v->pages_used > v->pages_cap || v->map_calls - v->unmap_calls != v->pages_used)
        return PKV_ERR_CORRUPT;
    uint64_t held[PKV_MAX_KV_GROUPS] = {0}, pages = 0, used = 0;
    for (uint32_t r = 0; r < v->num_requests; r++) {
        const uint64_t b = v->seq_base[r];
        for (uint32_t i = 0; i < v->nrows[r]; i++) {
            const uint32_t len = v->len[b + i];
            const uint32_t *lo = &v->lo[(b + i) * v->ng], *hi = &v->hi[(b + i) * v->ng];
            if (len > v->max_seq_len) return PKV_ERR_CORRUPT;
            for (uint32_t g = 0; g < v->ng; g++) {
                if (lo[g] > hi[g]) return PKV_ERR_CORRUPT;
                if (v->tpp[g] && (pg_for(v, g, len) > hi[g] ||
                                  (uint64_t)lo[g] * v->tpp[g] > len - pkv_kv_group_tokens_kept(&v->g[g], len)))
                    return PKV_ERR_CORRUPT;
                held[g] += hi[g] - lo[g];
                pages += (uint64_t)(hi[g] - lo[g]) * v->buffers[g];
            }
            if (len) used += row_kept(v, len); // a sample's row before the fork: nothing
        }
    }
    if (pages != v->pages_used || used != v->used_bytes) return PKV_ERR_CORRUPT;
    for (uint32_t g = 0; g < v->ng; g++)
        if (held[g] != v->held[g]) return PKV_ERR_CORRUPT;
    return PKV_OK;
}

static void hvmm_destroy(void *pp) {
    hvmm *v = pp;
    if (!v) return;
    free(v->seq_base);
    free(v->nrows);
    free(v->out_rows);
    free(v->len);
    free(v->lo);
    free(v->hi);
    free(v);
}

static pkv_status hvmm_create(const pkv_policy_config *cfg, pkv_policy_info *info, void **out) {
    if (!cfg || !info || !out || cfg->bytes_per_token == 0 || cfg->max_seq_len == 0)
        return PKV_ERR_INVALID_ARG;
    hvmm *v = calloc(1, sizeof *v);
    if (!v) return PKV_ERR_OUT_OF_MEMORY;
    int defer;
    if (pkvi_vmm_params(cfg, 0, &v->page, &v->map_ahead, &defer) != 0 || shape(v, cfg) != 0) {
        free(v);
        return PKV_ERR_INVALID_ARG;
    }
    v->host = cfg->host;
    v->bpt = cfg->bytes_per_token;
    v->max_seq_len = cfg->max_seq_len;
    v->pages_cap = cfg->capacity_bytes / v->page;
    v->capacity_slots = v->pages_cap * v->page / v->bpt;
    if (v->capacity_slots == 0 || v->pages_cap < admit_pages(v, 1)) {
        free(v);
        return PKV_ERR_OUT_OF_BLOCKS; // the budget holds not one page group of every group
    }
    v->num_requests = cfg->num_requests;
    const size_t nr = cfg->num_requests ? cfg->num_requests : 1;
    uint64_t total = 0;
    for (uint32_t r = 0; r < cfg->num_requests; r++) total += cfg->max_seqs[r];
    const size_t rows = total ? total : 1;
    v->seq_base = malloc(nr * sizeof *v->seq_base);
    v->nrows = calloc(nr, sizeof *v->nrows);
    v->out_rows = calloc(nr, sizeof *v->out_rows);
    v->len = calloc(rows, sizeof *v->len);
    v->lo = calloc(rows * v->ng, sizeof *v->lo);
    v->hi = calloc(rows * v->ng, sizeof *v->hi);
    if (!v->seq_base || !v->nrows || !v->out_rows || !v->len || !v->lo || !v->hi) {
        hvmm_destroy(v);
        return PKV_ERR_OUT_OF_MEMORY;
    }
    total = 0;
    for (uint32_t r = 0; r < cfg->num_requests; r++) {
        v->seq_base[r] = total;
        total += cfg->max_seqs[r];
    }
    info->capacity_slots = v->capacity_slots;
    // The allocation unit: the smallest page group, in tokens.
    uint64_t gran = UINT32_MAX;
    for (uint32_t g = 0; g < v->ng; g++)
        if (v->tpp[g] && v->tpp[g] < gran) gran = v->tpp[g];
    info->granularity = gran <= v->capacity_slots ? (uint32_t)gran : 1;
    info->uses_arena = 0; // every page is mapped by a call of its own
    *out = v;
    return PKV_OK;
}

// Stateless bound: the peak pages of the request's rows, in slots.
static uint64_t hvmm_need(const pkv_policy_config *cfg, const pkv_policy_admit *a) {
    hvmm v;
    memset(&v, 0, sizeof v);
    int defer;
    if (!cfg || cfg->bytes_per_token == 0 || pkvi_vmm_params(cfg, 0, &v.page, &v.map_ahead, &defer) != 0 ||
        shape(&v, cfg) != 0)
        return UINT64_MAX;
    const uint32_t rows = a->n > a->nseq ? a->n : a->nseq;
    return ceil_div64((uint64_t)rows * peak_pages(&v, a->len, a->final_len) * v.page, cfg->bytes_per_token);
}

const pkv_policy_vtable pkvi_policy_hybrid_vmm_vtable = {
    .abi_version = PKV_POLICY_ABI_VERSION,
    .name = "hybrid-vmm",
    .create = hvmm_create,
    .destroy = hvmm_destroy,
    .need = hvmm_need,
    .fits_alone = hvmm_fits_alone,
    .admit = hvmm_admit,
    .fork = hvmm_fork,
    .grow = hvmm_grow,
    .release = hvmm_release,
    .stats = hvmm_stats,
    .reservation = hvmm_reservation,
    .request_slots = hvmm_request_slots,
    .validate = hvmm_validate,
    .swap_out = hvmm_swap_out,
    .swap_in = hvmm_swap_in,
};

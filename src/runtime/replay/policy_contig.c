// SPDX-License-Identifier: MIT
// The contiguous KV policies and the per-call backend baselines. Every sequence
// owns one extent of token slots, placed by the free-extent allocator
// (src/allocator/extent.c) in one range of the budget, so a request that finds
// enough free slots but no extent long enough is blocked by measured external
// fragmentation. Extent size per sequence:
// - contiguous-max:      max_seq_len, reserved at admission;
// - contiguous-oracle:   final length (prompt + output - 1), reserved at admission;
// - contiguous-pow2:     Orca's Pow2: next power of two of prompt + output
//                        (capped at max_seq_len), reserved at admission;
// - contiguous-pow2-grow: next power of two of the current length; when the
//                        sequence outgrows it, regrown in place if the following
//                        slots are free, else moved (new extent, copy, free old);
// - malloc-per-request:  final length, one backend allocation per sequence;
// - realloc-copy:        current length, and every new token allocates a new
//                        extent one slot longer, copies, and frees the old one.
// (malloc-per-token, token-granular storage, is policy_token.c.)
// A request's n sequences all get their extents at admission (fork copies the
// prompt into them), so a fork never needs memory.
//
// Backend calls: the contiguous-* policies carve one arena (one alloc, one free,
// before the first step and after the last); malloc-per-request and
// realloc-copy make one call per extent they allocate or free, each charged to
// the step through pkvi_policy_charge. Their placement is modelled with the
// same first-fit allocator standing in for the device allocator's address space.
#include <stdlib.h>

#include "src/allocator/extent.h"
#include "replay_internal.h"

typedef struct contig {
    pkvi_policy base;
    pkvi_extent_alloc *ea;
    uint32_t max_seq_len;
    int per_call; // malloc-* policies: count a backend call per extent
    uint64_t *seq_base;  // [num_requests]
    uint32_t *nalloc;    // [num_requests]: extents held
    uint64_t *off;       // [sum of n]
    uint64_t *size;      // [sum of n]
    uint32_t *len;       // [sum of n]
    uint64_t used, reserved;
    uint64_t alloc_calls, free_calls, copy_slots;
} contig;

static uint64_t next_pow2(uint64_t x) {
    uint64_t p = 1;
    while (p < x) p <<= 1;
    return p;
}

static uint64_t pow2_capped(uint64_t x, uint32_t max_seq_len) {
    const uint64_t s = next_pow2(x ? x : 1);
    return s < max_seq_len ? s : (x > max_seq_len ? x : max_seq_len);
}

// Extent size for a sequence of `kind` holding len tokens that will reach
// final_len (the request's prompt + output = final_len + 1).
static uint64_t extent_of(pkv_policy kind, uint32_t max_seq_len, uint32_t len, uint32_t final_len) {
    switch (kind) {
    case PKV_POLICY_CONTIG_MAX: return max_seq_len;
    case PKV_POLICY_CONTIG_POW2: return pow2_capped((uint64_t)final_len + 1, max_seq_len);
    case PKV_POLICY_CONTIG_POW2_GROW: return pow2_capped(len, max_seq_len);
    case PKV_POLICY_CONTIG_ORACLE:
    case PKV_POLICY_MALLOC_PER_REQUEST: return final_len;
    default: return len ? len : 1; // realloc-copy
    }
}

static uint64_t extent_for(const contig *c, uint32_t len, uint32_t final_len) {
    return extent_of(c->base.kind, c->max_seq_len, len, final_len);
}

static int kind_grows(pkv_policy kind) {
    return kind == PKV_POLICY_CONTIG_POW2_GROW || kind == PKV_POLICY_REALLOC_COPY;
}

static int grows(const contig *c) { return kind_grows(c->base.kind); }

uint64_t pkvi_contig_need(pkv_policy kind, uint32_t max_seq_len, const pkvi_admit *a) {
    const uint64_t fin = extent_of(kind, max_seq_len, a->final_len, a->final_len);
    const uint64_t adm = (uint64_t)a->n * extent_of(kind, max_seq_len, a->len, a->final_len);
    uint64_t peak = (uint64_t)a->n * fin;
    // A move holds the old extent and the new one; a lone pow2-grow sequence
    // at the start of an empty budget always grows in place.
    if (kind == PKV_POLICY_REALLOC_COPY || (kind == PKV_POLICY_CONTIG_POW2_GROW && a->n > 1))
        peak += fin;
    return peak > adm ? peak : adm;
}

static void put_extent(contig *c, uint64_t off, uint64_t size) {
    pkvi_extent_free_units(c->ea, off, size);
    c->reserved -= size;
    if (c->per_call) {
        c->free_calls++;
        pkvi_policy_charge(&c->base, 1, size);
    }
}

static pkv_status get_extent(contig *c, uint64_t size, uint64_t *off) {
    pkv_status st = pkvi_extent_alloc_units(c->ea, size, off);
    if (st != PKV_OK) return st;
    c->reserved += size;
    if (c->per_call) {
        c->alloc_calls++;
        pkvi_policy_charge(&c->base, 0, size);
    }
    return PKV_OK;
}

static pkv_status contig_admit(pkvi_policy *pp, uint32_t r, const pkvi_admit *a, uint64_t wm,
                               uint64_t *ext_frag) {
    contig *c = (contig *)pp;
    *ext_frag = 0;
    const uint64_t size = extent_for(c, a->len, a->final_len);
    const uint32_t count = a->n; // every sequence's extent, now
    const uint64_t free_total = pkvi_extent_free_total(c->ea);
    if ((uint64_t)count * size + wm > free_total) return PKV_ERR_OUT_OF_BLOCKS;
    const uint64_t b = c->seq_base[r];
    const pkvi_charges saved = c->base.charges;
    for (uint32_t i = 0; i < count; i++) {
        if (get_extent(c, size, &c->off[b + i]) != PKV_OK) {
            // Enough free slots, no extent long enough: external fragmentation.
            // The rolled-back extents cost nothing: an engine checks before it calls.
            for (uint32_t j = 0; j < i; j++) {
                put_extent(c, c->off[b + j], size);
                if (c->per_call) {
                    c->alloc_calls--;
                    c->free_calls--;
                }
            }
            c->base.charges = saved;
            *ext_frag = free_total;
            return PKV_ERR_OUT_OF_BLOCKS;
        }
        c->size[b + i] = size;
    }
    for (uint32_t i = 0; i < count; i++) {
        c->len[b + i] = i < a->nseq ? a->len : 0; // the rest are filled by the fork
        c->used += c->len[b + i];
    }
    c->nalloc[r] = count;
    c->base.last_cached = 0;
    return PKV_OK;
}

static void contig_commit(pkvi_policy *pp, uint32_t r, uint32_t prompt) {
    (void)pp; // contiguous policies share nothing between requests
    (void)r;
    (void)prompt;
}

static pkv_status contig_fork(pkvi_policy *pp, uint32_t r, uint32_t n) {
    contig *c = (contig *)pp;
    const uint64_t b = c->seq_base[r];
    if (n > c->nalloc[r]) return PKV_ERR_INVALID_ARG;
    for (uint32_t i = 1; i < n; i++) { // copy the prompt's KV into each sample
        c->len[b + i] = c->len[b];
        c->used += c->len[b];
        c->copy_slots += c->len[b];
    }
    return PKV_OK;
}

static pkv_status contig_grow(pkvi_policy *pp, uint32_t r, uint32_t child) {
    contig *c = (contig *)pp;
    const uint64_t i = c->seq_base[r] + child;
    if (c->len[i] + 1 <= c->size[i] && c->base.kind != PKV_POLICY_REALLOC_COPY) {
        c->len[i]++;
        c->used++;
        return PKV_OK;
    }
    if (!grows(c)) return PKV_ERR_INVALID_ARG; // a fixed extent cannot overflow
    const uint64_t new_size = c->base.kind == PKV_POLICY_REALLOC_COPY
                                  ? (uint64_t)c->len[i] + 1
                                  : extent_for(c, c->len[i] + 1, 0);
    if (c->base.kind == PKV_POLICY_CONTIG_POW2_GROW &&
        pkvi_extent_grow(c->ea, c->off[i], c->size[i], new_size) == PKV_OK) {
        c->reserved += new_size - c->size[i];
        c->size[i] = new_size;
    } else {
        // cudaMalloc has no realloc: allocate, copy, free.
        uint64_t off;
        pkv_status st = get_extent(c, new_size, &off);
        if (st != PKV_OK) return st;
        c->copy_slots += c->len[i];
        put_extent(c, c->off[i], c->size[i]);
        c->off[i] = off;
        c->size[i] = new_size;
    }
    c->len[i]++;
    c->used++;
    return PKV_OK;
}

static void contig_release(pkvi_policy *pp, uint32_t r) {
    contig *c = (contig *)pp;
    const uint64_t b = c->seq_base[r];
    for (uint32_t i = 0; i < c->nalloc[r]; i++) {
        put_extent(c, c->off[b + i], c->size[b + i]);
        c->used -= c->len[b + i];
        c->len[b + i] = 0;
    }
    c->nalloc[r] = 0;
}

static int contig_fits_alone(const pkvi_policy *pp, const pkvi_admit *a, uint64_t wm) {
    const contig *c = (const contig *)pp;
    const uint64_t cap = c->base.capacity_slots;
    if ((uint64_t)a->n * extent_for(c, a->len, a->final_len) + wm > cap) return 0;
    return pkvi_contig_need(c->base.kind, c->max_seq_len, a) <= cap;
}

static void contig_sample(const pkvi_policy *pp, uint32_t r, uint32_t nseq, uint32_t len,
                          uint32_t final_len, pkvi_mem_sample *s) {
    const contig *c = (const contig *)pp;
    (void)nseq;
    (void)len;
    const uint64_t b = c->seq_base[r];
    s->used = s->reserved = s->reservation = 0;
    for (uint32_t i = 0; i < c->nalloc[r]; i++) {
        const uint64_t fillable = c->size[b + i] < final_len ? c->size[b + i] : final_len;
        s->used += c->len[b + i];
        s->reserved += c->size[b + i];
        s->reservation += fillable - c->len[b + i];
    }
}

static void contig_totals(const pkvi_policy *pp, pkvi_mem_sample *s) {
    const contig *c = (const contig *)pp;
    s->used = c->used;
    s->reserved = c->reserved;
    s->reservation = 0;
}

static uint64_t contig_free_slots(const pkvi_policy *pp) {
    return pkvi_extent_free_total(((const contig *)pp)->ea);
}

static void contig_counts(const pkvi_policy *pp, pkvi_alloc_counts *out) {
    const contig *c = (const contig *)pp;
    out->alloc_calls = c->per_call ? c->alloc_calls : 1; // else: the one arena
    out->free_calls = c->per_call ? c->free_calls : 1;
    out->copy_slots = c->copy_slots;
    out->cow_copies = 0;
    out->cached_tokens = 0;
}

static pkv_seq_id contig_seq_of(const pkvi_policy *pp, uint32_t r, uint32_t child) {
    (void)pp;
    (void)r;
    (void)child;
    return -1;
}

static pkv_status contig_validate(const pkvi_policy *pp) {
    const contig *c = (const contig *)pp;
    pkv_status st = pkvi_extent_validate(c->ea);
    if (st != PKV_OK) return st;
    if (c->reserved + pkvi_extent_free_total(c->ea) != c->base.capacity_slots) return PKV_ERR_CORRUPT;
    return c->used <= c->reserved ? PKV_OK : PKV_ERR_CORRUPT;
}

static void contig_destroy(pkvi_policy *pp) {
    contig *c = (contig *)pp;
    if (!c) return;
    pkvi_extent_destroy(c->ea);
    free(c->seq_base);
    free(c->nalloc);
    free(c->off);
    free(c->size);
    free(c->len);
    free(c);
}

static const pkvi_policy_ops contig_ops = {
    contig_admit,  contig_commit, contig_fork,   contig_grow,       contig_release, contig_fits_alone,
    contig_sample, contig_totals, contig_free_slots, contig_counts,  contig_seq_of,
    contig_validate, contig_destroy,
};

pkv_status pkvi_policy_contig_create(const pkvi_policy_config *cfg, pkvi_policy **out) {
    if (!cfg || !out || cfg->bytes_per_token == 0 || cfg->max_seq_len == 0 ||
        cfg->kind == PKV_POLICY_PAGED || cfg->kind == PKV_POLICY_MALLOC_PER_TOKEN ||
        cfg->kind >= PKV_POLICY_COUNT)
        return PKV_ERR_INVALID_ARG;
    const uint64_t slots = cfg->capacity_bytes / cfg->bytes_per_token;
    if (slots == 0) return PKV_ERR_INVALID_ARG;
    contig *c = calloc(1, sizeof *c);
    if (!c) return PKV_ERR_OUT_OF_MEMORY;
    c->base.ops = &contig_ops;
    c->base.kind = cfg->kind;
    c->base.capacity_slots = slots;
    c->base.granularity = 1;
    c->max_seq_len = cfg->max_seq_len;
    c->per_call = cfg->kind == PKV_POLICY_MALLOC_PER_REQUEST || cfg->kind == PKV_POLICY_REALLOC_COPY;
    pkvi_policy_init_costs(&c->base, cfg);
    pkv_status st = pkvi_extent_create(slots, PKVI_EXTENT_FIRST_FIT, &c->ea);
    if (st != PKV_OK) {
        contig_destroy(&c->base);
        return st;
    }
    const size_t nr = cfg->num_requests ? cfg->num_requests : 1;
    c->seq_base = malloc(nr * sizeof *c->seq_base);
    c->nalloc = calloc(nr, sizeof *c->nalloc);
    uint64_t total = 0;
    if (c->seq_base)
        for (size_t i = 0; i < cfg->num_requests; i++) {
            c->seq_base[i] = total;
            total += cfg->max_seqs[i];
        }
    if (!total) total = 1;
    c->off = malloc(total * sizeof *c->off);
    c->size = malloc(total * sizeof *c->size);
    c->len = calloc(total, sizeof *c->len);
    if (!c->seq_base || !c->nalloc || !c->off || !c->size || !c->len) {
        contig_destroy(&c->base);
        return PKV_ERR_OUT_OF_MEMORY;
    }
    *out = &c->base;
    return PKV_OK;
}

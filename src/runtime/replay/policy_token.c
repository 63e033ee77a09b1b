// SPDX-License-Identifier: MIT
// malloc-per-token: token-granular KV storage, the anti-pattern of allocating
// device memory for every token instead of preallocating. Every token of every
// sequence is its own backend allocation of one token's K/V (kv_bytes_per_token
// bytes), made in the step that writes the token and freed, one call per token,
// when the request ends. Nothing is ever copied: a fork's samples point at the
// prompt's tokens, which stay shared until the request ends.
//
// Memory: every slot held holds a token (no internal fragmentation, no
// reservation), and a one-token extent always fits any free slot, so there is no
// external fragmentation either; what it costs is the calls.
#include <stdlib.h>

#include "replay_internal.h"

typedef struct token_policy {
    pkvi_policy base;
    uint64_t *owned;     // [num_requests]: token allocations the request holds
    uint32_t *nseq;      // [num_requests]: live sequences
    uint64_t used;       // sum of owned
    uint64_t alloc_calls, free_calls;
} token_policy;

static void charge_calls(token_policy *t, int is_free, uint64_t count) {
    if (is_free)
        t->free_calls += count;
    else
        t->alloc_calls += count;
    pkvi_policy_charge_calls(&t->base, is_free, 1, count);
}

// Tokens a request holds after admission (its samples share the prompt).
static uint64_t admit_tokens(const pkvi_admit *a) {
    if (a->independent) return (uint64_t)a->nseq * a->len;
    return a->len + (uint64_t)(a->nseq - 1) * (a->len - a->prompt);
}

uint64_t pkvi_token_need(const pkvi_admit *a) {
    return a->final_len + (uint64_t)(a->n - 1) * (a->final_len - a->prompt);
}

static pkv_status token_admit(pkvi_policy *pp, uint32_t r, const pkvi_admit *a, uint64_t wm,
                              uint64_t *ext_frag) {
    token_policy *t = (token_policy *)pp;
    *ext_frag = 0; // any free slot fits a one-token allocation
    const uint64_t need = admit_tokens(a);
    if (need + wm > t->base.capacity_slots - t->used) return PKV_ERR_OUT_OF_BLOCKS;
    charge_calls(t, 0, need);
    t->owned[r] = need;
    t->nseq[r] = a->nseq;
    t->used += need;
    t->base.last_cached = 0;
    return PKV_OK;
}

static void token_commit(pkvi_policy *pp, uint32_t r, uint32_t prompt) {
    (void)pp;
    (void)r;
    (void)prompt;
}

static pkv_status token_fork(pkvi_policy *pp, uint32_t r, uint32_t n) {
    token_policy *t = (token_policy *)pp;
    if (t->nseq[r] != 1) return PKV_ERR_INVALID_ARG;
    t->nseq[r] = n; // the samples point at the prompt's tokens: no call, no copy
    return PKV_OK;
}

static pkv_status token_grow(pkvi_policy *pp, uint32_t r, uint32_t child) {
    token_policy *t = (token_policy *)pp;
    if (child >= t->nseq[r]) return PKV_ERR_INVALID_ARG;
    if (t->used >= t->base.capacity_slots) return PKV_ERR_OUT_OF_BLOCKS;
    charge_calls(t, 0, 1);
    t->owned[r]++;
    t->used++;
    return PKV_OK;
}

static void token_release(pkvi_policy *pp, uint32_t r) {
    token_policy *t = (token_policy *)pp;
    charge_calls(t, 1, t->owned[r]);
    t->used -= t->owned[r];
    t->owned[r] = 0;
    t->nseq[r] = 0;
}

static int token_fits_alone(const pkvi_policy *pp, const pkvi_admit *a, uint64_t wm) {
    const uint64_t cap = pp->capacity_slots;
    return admit_tokens(a) + wm <= cap && pkvi_token_need(a) <= cap;
}

static void token_sample(const pkvi_policy *pp, uint32_t r, uint32_t nseq, uint32_t len,
                         uint32_t final_len, pkvi_mem_sample *s) {
    const token_policy *t = (const token_policy *)pp;
    (void)nseq;
    (void)len;
    (void)final_len;
    s->used = s->reserved = t->owned[r];
    s->reservation = 0;
}

static void token_totals(const pkvi_policy *pp, pkvi_mem_sample *s) {
    const token_policy *t = (const token_policy *)pp;
    s->used = s->reserved = t->used;
    s->reservation = 0;
}

static uint64_t token_free_slots(const pkvi_policy *pp) {
    const token_policy *t = (const token_policy *)pp;
    return t->base.capacity_slots - t->used;
}

static void token_counts(const pkvi_policy *pp, pkvi_alloc_counts *c) {
    const token_policy *t = (const token_policy *)pp;
    c->alloc_calls = t->alloc_calls;
    c->free_calls = t->free_calls;
    c->copy_slots = 0;
    c->cow_copies = 0;
    c->cached_tokens = 0;
}

static pkv_seq_id token_seq_of(const pkvi_policy *pp, uint32_t r, uint32_t child) {
    (void)pp;
    (void)r;
    (void)child;
    return -1;
}

static pkv_status token_validate(const pkvi_policy *pp) {
    const token_policy *t = (const token_policy *)pp;
    return t->used <= t->base.capacity_slots && t->alloc_calls - t->free_calls == t->used
               ? PKV_OK
               : PKV_ERR_CORRUPT;
}

static void token_destroy(pkvi_policy *pp) {
    token_policy *t = (token_policy *)pp;
    if (!t) return;
    free(t->owned);
    free(t->nseq);
    free(t);
}

static const pkvi_policy_ops token_ops = {
    token_admit,  token_commit, token_fork,       token_grow,   token_release,
    token_fits_alone, token_sample, token_totals, token_free_slots, token_counts,
    token_seq_of, token_validate, token_destroy,
};

pkv_status pkvi_policy_token_create(const pkvi_policy_config *cfg, pkvi_policy **out) {
    if (!cfg || !out || cfg->bytes_per_token == 0 || cfg->kind != PKV_POLICY_MALLOC_PER_TOKEN)
        return PKV_ERR_INVALID_ARG;
    const uint64_t slots = cfg->capacity_bytes / cfg->bytes_per_token;
    if (slots == 0) return PKV_ERR_INVALID_ARG;
    token_policy *t = calloc(1, sizeof *t);
    if (!t) return PKV_ERR_OUT_OF_MEMORY;
    t->base.ops = &token_ops;
    t->base.kind = cfg->kind;
    t->base.capacity_slots = slots;
    t->base.granularity = 1;
    pkvi_policy_init_costs(&t->base, cfg);
    const size_t nr = cfg->num_requests ? cfg->num_requests : 1;
    t->owned = calloc(nr, sizeof *t->owned);
    t->nseq = calloc(nr, sizeof *t->nseq);
    if (!t->owned || !t->nseq) {
        token_destroy(&t->base);
        return PKV_ERR_OUT_OF_MEMORY;
    }
    *out = &t->base;
    return PKV_OK;
}

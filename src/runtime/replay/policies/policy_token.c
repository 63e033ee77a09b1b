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

#include "src/runtime/replay/replay_internal.h"

typedef struct token_policy {
    uint64_t capacity_slots;
    uint64_t bytes_per_token;
    pkv_policy_host host;
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
    if (count)
        t->host.backend_calls(t->host.ctx, is_free ? PKV_BACKEND_CALL_FREE : PKV_BACKEND_CALL_ALLOC,
                              t->bytes_per_token, count);
}

// Tokens a request holds after admission (its samples share the prompt).
static uint64_t admit_tokens(const pkv_policy_admit *a) {
    if (a->independent) return (uint64_t)a->nseq * a->len;
    return a->len + (uint64_t)(a->nseq - 1) * (a->len - a->prompt);
}

static uint64_t need_of(const pkv_policy_admit *a) {
    return a->final_len + (uint64_t)(a->n - 1) * (a->final_len - a->prompt);
}

static uint64_t token_need(const pkv_policy_config *cfg, const pkv_policy_admit *a) {
    (void)cfg;
    return need_of(a);
}

static pkv_status token_admit(void *pp, uint32_t r, const pkv_policy_admit *a, uint64_t wm,
                              uint64_t *ext_frag, uint32_t *cached) {
    token_policy *t = pp;
    *ext_frag = 0; // any free slot fits a one-token allocation
    *cached = 0;
    const uint64_t need = admit_tokens(a);
    if (need + wm > t->capacity_slots - t->used) return PKV_ERR_OUT_OF_BLOCKS;
    charge_calls(t, 0, need);
    t->owned[r] = need;
    t->nseq[r] = a->nseq;
    t->used += need;
    return PKV_OK;
}

static pkv_status token_fork(void *pp, uint32_t r, uint32_t n) {
    token_policy *t = pp;
    if (t->nseq[r] != 1) return PKV_ERR_INVALID_ARG;
    t->nseq[r] = n; // the samples point at the prompt's tokens: no call, no copy
    return PKV_OK;
}

static pkv_status token_grow(void *pp, uint32_t r, uint32_t child) {
    token_policy *t = pp;
    if (child >= t->nseq[r]) return PKV_ERR_INVALID_ARG;
    if (t->used >= t->capacity_slots) return PKV_ERR_OUT_OF_BLOCKS;
    charge_calls(t, 0, 1);
    t->owned[r]++;
    t->used++;
    return PKV_OK;
}

static void token_release(void *pp, uint32_t r) {
    token_policy *t = pp;
    charge_calls(t, 1, t->owned[r]);
    t->used -= t->owned[r];
    t->owned[r] = 0;
    t->nseq[r] = 0;
}

static int token_fits_alone(const void *pp, const pkv_policy_admit *a, uint64_t wm) {
    const uint64_t cap = ((const token_policy *)pp)->capacity_slots;
    return admit_tokens(a) + wm <= cap && need_of(a) <= cap;
}

// Every slot held holds a token: nothing is reserved for later.
static uint64_t token_reservation(const void *pp, uint32_t r, uint32_t nseq, uint32_t len,
                                  uint32_t final_len) {
    (void)pp;
    (void)r;
    (void)nseq;
    (void)len;
    (void)final_len;
    return 0;
}

// The samples share the prompt's tokens: a swap moves them once.
static uint64_t token_request_slots(const void *pp, uint32_t r, uint32_t nseq, uint32_t len,
                                    uint32_t prompt) {
    (void)pp;
    (void)r;
    if (nseq <= 1) return len;
    return prompt + (uint64_t)nseq * (len - prompt);
}

static void token_stats(const void *pp, pkv_policy_stats *s) {
    const token_policy *t = pp;
    s->used = s->reserved = t->used;
    s->free = t->capacity_slots - t->used;
    s->copy_slots = 0;
    s->cow_copies = 0;
    s->cached_tokens = 0;
}

static pkv_status token_validate(const void *pp) {
    const token_policy *t = pp;
    return t->used <= t->capacity_slots && t->alloc_calls - t->free_calls == t->used
               ? PKV_OK
               : PKV_ERR_CORRUPT;
}

static void token_destroy(void *pp) {
    token_policy *t = pp;
    if (!t) return;
    free(t->owned);
    free(t->nseq);
    free(t);
}

static pkv_status token_create(const pkv_policy_config *cfg, pkv_policy_info *info, void **out) {
    if (!cfg || !info || !out || cfg->bytes_per_token == 0) return PKV_ERR_INVALID_ARG;
    const uint64_t slots = cfg->capacity_bytes / cfg->bytes_per_token;
    if (slots == 0) return PKV_ERR_OUT_OF_BLOCKS;
    token_policy *t = calloc(1, sizeof *t);
    if (!t) return PKV_ERR_OUT_OF_MEMORY;
    t->capacity_slots = slots;
    t->bytes_per_token = cfg->bytes_per_token;
    t->host = cfg->host;
    const size_t nr = cfg->num_requests ? cfg->num_requests : 1;
    t->owned = calloc(nr, sizeof *t->owned);
    t->nseq = calloc(nr, sizeof *t->nseq);
    if (!t->owned || !t->nseq) {
        token_destroy(t);
        return PKV_ERR_OUT_OF_MEMORY;
    }
    info->capacity_slots = slots;
    info->granularity = 1;
    info->uses_arena = 0;
    *out = t;
    return PKV_OK;
}

const pkv_policy_vtable pkvi_policy_token_vtable = {
    .abi_version = PKV_POLICY_ABI_VERSION,
    .name = "malloc-per-token",
    .create = token_create,
    .destroy = token_destroy,
    .need = token_need,
    .fits_alone = token_fits_alone,
    .admit = token_admit,
    .fork = token_fork,
    .grow = token_grow,
    .release = token_release,
    .stats = token_stats,
    .reservation = token_reservation,
    .request_slots = token_request_slots,
    .validate = token_validate,
};

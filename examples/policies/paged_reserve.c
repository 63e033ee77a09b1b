// SPDX-License-Identifier: MIT
// paged-reserve: paged blocks (cfg->block_size tokens, any free block serves,
// so no external fragmentation), but every request reserves at admission all
// the blocks it will ever need (its final length is known from the trace), as
// an output-length oracle would let a server do. It never preempts; it pays in
// reservation. Against the built-in `paged` (blocks on demand) it separates
// what paging buys (no fragmentation) from what on-demand growth buys (no
// reservation): run both with --schedule fixed-from paged.
//
// Sharing: a request's samples (n > 1) share the prompt's full blocks; the
// prompt's partial last block is copied into each sample at the fork.
// External policy, pkv/policy.h only.
//
// Build: cc -std=c11 -shared -fPIC $(pkg-config --cflags pagedkv) paged_reserve.c -o paged_reserve.so
#include <stdlib.h>
#include <string.h>

#include "pkv/policy.h"

typedef struct req {
    uint64_t blocks;   // blocks held
    uint64_t used;     // distinct token states stored
    uint32_t shared;   // tokens in the shared full prompt blocks
    uint32_t final_len, n, nseq;
} req;

typedef struct reserve {
    uint64_t B, capacity_blocks, free_blocks;
    req *reqs; // [num_requests]
    uint32_t num_requests;
    uint32_t *lens; // [sum of n]: tokens per sequence
    uint64_t *base; // [num_requests]
    uint64_t used, copy_slots;
} reserve;

static uint64_t ceil_div(uint64_t a, uint64_t b) { return (a + b - 1) / b; }

// Blocks a request of n samples reaching final_len holds, sharing full prompt blocks.
static uint64_t blocks_for(uint64_t B, const pkv_policy_admit *a) {
    const uint64_t shared = a->prompt / B;
    return shared + (uint64_t)a->n * (ceil_div(a->final_len, B) - shared);
}

static void reserve_destroy(void *state) {
    reserve *p = state;
    if (!p) return;
    free(p->reqs);
    free(p->lens);
    free(p->base);
    free(p);
}

static pkv_status reserve_create(const pkv_policy_config *cfg, pkv_policy_info *info, void **out) {
    if (!cfg || !info || !out || cfg->bytes_per_token == 0 || cfg->block_size == 0)
        return PKV_ERR_INVALID_ARG;
    const uint64_t blocks = cfg->capacity_bytes / cfg->bytes_per_token / cfg->block_size;
    if (blocks == 0) return PKV_ERR_INVALID_ARG;
    reserve *p = calloc(1, sizeof *p);
    if (!p) return PKV_ERR_OUT_OF_MEMORY;
    p->B = cfg->block_size;
    p->capacity_blocks = p->free_blocks = blocks;
    const size_t nr = cfg->num_requests ? cfg->num_requests : 1;
    p->num_requests = cfg->num_requests;
    p->reqs = calloc(nr, sizeof *p->reqs);
    p->base = malloc(nr * sizeof *p->base);
    uint64_t total = 0;
    if (p->base)
        for (size_t i = 0; i < cfg->num_requests; i++) {
            p->base[i] = total;
            total += cfg->max_seqs[i];
        }
    p->lens = calloc(total ? total : 1, sizeof *p->lens);
    if (!p->reqs || !p->base || !p->lens) {
        reserve_destroy(p);
        return PKV_ERR_OUT_OF_MEMORY;
    }
    info->capacity_slots = blocks * p->B;
    info->granularity = cfg->block_size;
    info->uses_arena = 1;
    *out = p;
    return PKV_OK;
}

static uint64_t reserve_need(const pkv_policy_config *cfg, const pkv_policy_admit *a) {
    return blocks_for(cfg->block_size, a) * cfg->block_size;
}

static int reserve_fits_alone(const void *state, const pkv_policy_admit *a, uint64_t wm) {
    const reserve *p = state;
    return blocks_for(p->B, a) + ceil_div(wm, p->B) <= p->capacity_blocks;
}

// Distinct tokens of a request whose nseq sequences hold len tokens.
static uint64_t distinct(const req *q, uint32_t nseq, uint32_t len) {
    if (nseq <= 1) return len;
    return q->shared + (uint64_t)nseq * (len - q->shared);
}

static pkv_status reserve_admit(void *state, uint32_t r, const pkv_policy_admit *a, uint64_t wm,
                                uint64_t *ext_frag, uint32_t *cached) {
    reserve *p = state;
    *ext_frag = 0; // any free block serves
    *cached = 0;
    const uint64_t need = blocks_for(p->B, a);
    if (need + ceil_div(wm, p->B) > p->free_blocks) return PKV_ERR_OUT_OF_BLOCKS;
    req *q = &p->reqs[r];
    q->blocks = need;
    q->shared = (uint32_t)(a->prompt / p->B * p->B);
    q->final_len = a->final_len;
    q->n = a->n;
    q->nseq = a->nseq;
    for (uint32_t i = 0; i < a->nseq; i++) p->lens[p->base[r] + i] = a->len;
    q->used = distinct(q, a->nseq, a->len);
    p->used += q->used;
    p->free_blocks -= need;
    return PKV_OK;
}

static pkv_status reserve_fork(void *state, uint32_t r, uint32_t n) {
    reserve *p = state;
    req *q = &p->reqs[r];
    if (q->nseq != 1 || n > q->n) return PKV_ERR_INVALID_ARG;
    const uint32_t len = p->lens[p->base[r]];
    for (uint32_t i = 1; i < n; i++) p->lens[p->base[r] + i] = len;
    p->copy_slots += (uint64_t)(n - 1) * (len - q->shared); // the partial block, per sample
    p->used -= q->used;
    q->nseq = n;
    q->used = distinct(q, n, len);
    p->used += q->used;
    return PKV_OK;
}

static pkv_status reserve_grow(void *state, uint32_t r, uint32_t child) {
    reserve *p = state;
    req *q = &p->reqs[r];
    if (child >= q->nseq || p->lens[p->base[r] + child] >= q->final_len) return PKV_ERR_INVALID_ARG;
    p->lens[p->base[r] + child]++; // its block is already reserved
    q->used++;
    p->used++;
    return PKV_OK;
}

static void reserve_release(void *state, uint32_t r) {
    reserve *p = state;
    req *q = &p->reqs[r];
    p->free_blocks += q->blocks;
    p->used -= q->used;
    memset(q, 0, sizeof *q);
}

static void reserve_stats(const void *state, pkv_policy_stats *s) {
    const reserve *p = state;
    memset(s, 0, sizeof *s);
    s->used = p->used;
    s->reserved = (p->capacity_blocks - p->free_blocks) * p->B;
    s->free = p->free_blocks * p->B;
    s->copy_slots = p->copy_slots;
}

// What it will still store: its final distinct tokens minus what it holds.
static uint64_t reserve_reservation(const void *state, uint32_t r, uint32_t nseq, uint32_t len,
                                    uint32_t final_len) {
    const reserve *p = state;
    const req *q = &p->reqs[r];
    (void)nseq;
    (void)len;
    if (!q->blocks) return 0;
    const uint64_t end = q->n > 1 ? q->shared + (uint64_t)q->n * (final_len - q->shared) : final_len;
    return end - q->used;
}

static uint64_t reserve_request_slots(const void *state, uint32_t r, uint32_t nseq, uint32_t len,
                                      uint32_t prompt) {
    const reserve *p = state;
    (void)prompt;
    return distinct(&p->reqs[r], nseq, len);
}

static pkv_status reserve_validate(const void *state) {
    const reserve *p = state;
    uint64_t blocks = 0, used = 0;
    for (uint32_t r = 0; r < p->num_requests; r++) {
        const req *q = &p->reqs[r];
        if (q->used > q->blocks * p->B) return PKV_ERR_CORRUPT;
        blocks += q->blocks;
        used += q->used;
    }
    return blocks + p->free_blocks == p->capacity_blocks && used == p->used ? PKV_OK : PKV_ERR_CORRUPT;
}

static const pkv_policy_vtable reserve_vtable = {
    .abi_version = PKV_POLICY_ABI_VERSION,
    .name = "paged-reserve",
    .create = reserve_create,
    .destroy = reserve_destroy,
    .need = reserve_need,
    .fits_alone = reserve_fits_alone,
    .admit = reserve_admit,
    .fork = reserve_fork,
    .grow = reserve_grow,
    .release = reserve_release,
    .stats = reserve_stats,
    .reservation = reserve_reservation,
    .request_slots = reserve_request_slots,
    .validate = reserve_validate,
};

const pkv_policy_vtable *pkv_policy_plugin_entry(uint32_t host_abi);
const pkv_policy_vtable *pkv_policy_plugin_entry(uint32_t host_abi) {
    return host_abi == PKV_POLICY_ABI_VERSION ? &reserve_vtable : NULL;
}

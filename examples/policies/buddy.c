// SPDX-License-Identifier: MIT
// A binary buddy allocator as a KV policy (external, pkv/policy.h only): the
// baseline Orca's evaluation stands for. Every sequence reserves, at admission,
// one block of the next power of two of prompt + output tokens (uncapped: a
// buddy block is always a power of two), carved from the arena by splitting
// larger blocks in halves; a freed block merges with its buddy whenever both
// are free. Compared with contiguous-pow2 (first-fit extents of the same
// sizes), the buddy's alignment adds external fragmentation: a free block of
// the right size must also sit at an offset aligned to its size.
//
// The arena (capacity slots) is cut into aligned power-of-two top blocks, the
// largest first (offset 0 has every alignment, and each following block starts
// at a multiple of its own size), so buddies never cross a top block.
//
// Build: cc -std=c11 -shared -fPIC $(pkg-config --cflags pagedkv) buddy.c -o buddy.so
#include <stdlib.h>
#include <string.h>

#include "pkv/policy.h"

enum { MAX_ORDER = 48 };

typedef struct offs {
    uint64_t *v;
    size_t n, cap;
} offs;

typedef struct buddy {
    uint64_t capacity, free_total;
    offs free[MAX_ORDER + 1]; // free blocks of 2^k slots, by order k
    uint64_t top_off[64];     // the top blocks: offset and order
    uint32_t top_order[64], ntop;
    uint64_t *base;           // [num_requests]: first sequence slot of request r
    uint32_t *count;          // [num_requests]
    uint64_t *off;            // [sum of n]
    uint32_t *order;          // [sum of n]
    uint32_t *len;            // [sum of n]
    uint64_t used, reserved, copy_slots;
} buddy;

static uint32_t order_of(uint64_t slots) {
    uint32_t k = 0;
    while (((uint64_t)1 << k) < slots) k++;
    return k;
}

static int push(offs *o, uint64_t x) {
    if (o->n == o->cap) {
        size_t c = o->cap ? o->cap * 2 : 16;
        uint64_t *p = realloc(o->v, c * sizeof *p);
        if (!p) return -1;
        o->v = p;
        o->cap = c;
    }
    o->v[o->n++] = x;
    return 0;
}

// Remove x from o if present; 1 if it was.
static int take(offs *o, uint64_t x) {
    for (size_t i = 0; i < o->n; i++)
        if (o->v[i] == x) {
            o->v[i] = o->v[--o->n];
            return 1;
        }
    return 0;
}

// The order of the top block that holds offset x.
static uint32_t top_of(const buddy *b, uint64_t x) {
    for (uint32_t i = 0; i < b->ntop; i++)
        if (x >= b->top_off[i] && x - b->top_off[i] < ((uint64_t)1 << b->top_order[i]))
            return b->top_order[i];
    return 0;
}

// A block of order k at the lowest free offset of the smallest order that has one.
static int block_alloc(buddy *b, uint32_t k, uint64_t *out) {
    uint32_t j = k;
    while (j <= MAX_ORDER && b->free[j].n == 0) j++;
    if (j > MAX_ORDER) return -1;
    size_t best = 0;
    for (size_t i = 1; i < b->free[j].n; i++)
        if (b->free[j].v[i] < b->free[j].v[best]) best = i;
    const uint64_t x = b->free[j].v[best];
    b->free[j].v[best] = b->free[j].v[--b->free[j].n];
    while (j > k) { // split: keep the low half, free the high one
        j--;
        if (push(&b->free[j], x + ((uint64_t)1 << j)) != 0) return -2;
    }
    b->free_total -= (uint64_t)1 << k;
    *out = x;
    return 0;
}

static int block_free(buddy *b, uint64_t x, uint32_t k) {
    b->free_total += (uint64_t)1 << k;
    const uint32_t top = top_of(b, x);
    while (k < top && take(&b->free[k], x ^ ((uint64_t)1 << k))) {
        x &= ~((uint64_t)1 << k); // merged with its buddy
        k++;
    }
    return push(&b->free[k], x);
}

static void buddy_destroy(void *state) {
    buddy *b = state;
    if (!b) return;
    for (int k = 0; k <= MAX_ORDER; k++) free(b->free[k].v);
    free(b->base);
    free(b->count);
    free(b->off);
    free(b->order);
    free(b->len);
    free(b);
}

static pkv_status buddy_create(const pkv_policy_config *cfg, pkv_policy_info *info, void **out) {
    if (!cfg || !info || !out || cfg->bytes_per_token == 0) return PKV_ERR_INVALID_ARG;
    const uint64_t slots = cfg->capacity_bytes / cfg->bytes_per_token;
    if (slots == 0 || slots >> MAX_ORDER) return PKV_ERR_INVALID_ARG;
    buddy *b = calloc(1, sizeof *b);
    if (!b) return PKV_ERR_OUT_OF_MEMORY;
    b->capacity = slots;
    uint64_t at = 0;
    for (int k = MAX_ORDER; k >= 0; k--) // slots in binary: one top block per set bit
        if (slots & ((uint64_t)1 << k)) {
            b->top_off[b->ntop] = at;
            b->top_order[b->ntop++] = (uint32_t)k;
            if (push(&b->free[k], at) != 0) {
                buddy_destroy(b);
                return PKV_ERR_OUT_OF_MEMORY;
            }
            at += (uint64_t)1 << k;
        }
    b->free_total = slots;
    const size_t nr = cfg->num_requests ? cfg->num_requests : 1;
    b->base = malloc(nr * sizeof *b->base);
    b->count = calloc(nr, sizeof *b->count);
    uint64_t total = 0;
    if (b->base)
        for (size_t i = 0; i < cfg->num_requests; i++) {
            b->base[i] = total;
            total += cfg->max_seqs[i];
        }
    if (!total) total = 1;
    b->off = malloc(total * sizeof *b->off);
    b->order = malloc(total * sizeof *b->order);
    b->len = calloc(total, sizeof *b->len);
    if (!b->base || !b->count || !b->off || !b->order || !b->len) {
        buddy_destroy(b);
        return PKV_ERR_OUT_OF_MEMORY;
    }
    info->capacity_slots = slots;
    info->granularity = 1;
    info->uses_arena = 1;
    *out = b;
    return PKV_OK;
}

// Block order of a sequence of the request: prompt + output = final_len + 1.
static uint32_t seq_order(const pkv_policy_admit *a) { return order_of((uint64_t)a->final_len + 1); }

static uint64_t buddy_need(const pkv_policy_config *cfg, const pkv_policy_admit *a) {
    (void)cfg;
    return (uint64_t)a->n << seq_order(a);
}

// n blocks of order k fit the empty arena if the top blocks hold n of them.
static int buddy_fits_alone(const void *state, const pkv_policy_admit *a, uint64_t wm) {
    const buddy *b = state;
    const uint32_t k = seq_order(a);
    if (((uint64_t)a->n << k) + wm > b->capacity) return 0;
    uint64_t room = 0;
    for (uint32_t i = 0; i < b->ntop; i++)
        if (b->top_order[i] >= k) room += (uint64_t)1 << (b->top_order[i] - k);
    return room >= a->n;
}

static pkv_status buddy_admit(void *state, uint32_t r, const pkv_policy_admit *a, uint64_t wm,
                              uint64_t *ext_frag, uint32_t *cached) {
    buddy *b = state;
    *ext_frag = 0;
    *cached = 0;
    const uint32_t k = seq_order(a);
    const uint64_t base = b->base[r], free_total = b->free_total;
    if (((uint64_t)a->n << k) + wm > free_total) return PKV_ERR_OUT_OF_BLOCKS;
    for (uint32_t i = 0; i < a->n; i++) {
        const int rc = block_alloc(b, k, &b->off[base + i]);
        if (rc != 0) {
            for (uint32_t j = 0; j < i; j++)
                if (block_free(b, b->off[base + j], k) != 0) return PKV_ERR_OUT_OF_MEMORY;
            if (rc == -2) return PKV_ERR_OUT_OF_MEMORY;
            *ext_frag = free_total; // free slots, but no aligned block that large
            return PKV_ERR_OUT_OF_BLOCKS;
        }
        b->order[base + i] = k;
        b->len[base + i] = i < a->nseq ? a->len : 0;
        b->used += b->len[base + i];
    }
    b->reserved += (uint64_t)a->n << k;
    b->count[r] = a->n;
    return PKV_OK;
}

static pkv_status buddy_fork(void *state, uint32_t r, uint32_t n) {
    buddy *b = state;
    const uint64_t base = b->base[r];
    if (n > b->count[r]) return PKV_ERR_INVALID_ARG;
    for (uint32_t i = 1; i < n; i++) {
        b->len[base + i] = b->len[base];
        b->used += b->len[base];
        b->copy_slots += b->len[base];
    }
    return PKV_OK;
}

static pkv_status buddy_grow(void *state, uint32_t r, uint32_t child) {
    buddy *b = state;
    const uint64_t i = b->base[r] + child;
    if (child >= b->count[r] || b->len[i] >= ((uint64_t)1 << b->order[i])) return PKV_ERR_INVALID_ARG;
    b->len[i]++;
    b->used++;
    return PKV_OK;
}

static void buddy_release(void *state, uint32_t r) {
    buddy *b = state;
    const uint64_t base = b->base[r];
    for (uint32_t i = 0; i < b->count[r]; i++) {
        block_free(b, b->off[base + i], b->order[base + i]);
        b->reserved -= (uint64_t)1 << b->order[base + i];
        b->used -= b->len[base + i];
        b->len[base + i] = 0;
    }
    b->count[r] = 0;
}

static void buddy_stats(const void *state, pkv_policy_stats *s) {
    const buddy *b = state;
    memset(s, 0, sizeof *s);
    s->used = b->used;
    s->reserved = b->reserved;
    s->free = b->free_total;
    s->copy_slots = b->copy_slots;
}

static uint64_t buddy_reservation(const void *state, uint32_t r, uint32_t nseq, uint32_t len,
                                  uint32_t final_len) {
    const buddy *b = state;
    (void)nseq;
    (void)len;
    uint64_t later = 0;
    for (uint32_t i = 0; i < b->count[r]; i++) {
        const uint64_t k = b->base[r] + i, size = (uint64_t)1 << b->order[k];
        later += (size < final_len ? size : final_len) - b->len[k];
    }
    return later;
}

// Free blocks are aligned, inside the arena, and sum to free_total.
static pkv_status buddy_validate(const void *state) {
    const buddy *b = state;
    uint64_t sum = 0;
    for (uint32_t k = 0; k <= MAX_ORDER; k++)
        for (size_t i = 0; i < b->free[k].n; i++) {
            const uint64_t x = b->free[k].v[i], size = (uint64_t)1 << k;
            if (x % size || x + size > b->capacity || top_of(b, x) < k) return PKV_ERR_CORRUPT;
            sum += size;
        }
    if (sum != b->free_total || b->reserved + sum != b->capacity || b->used > b->reserved)
        return PKV_ERR_CORRUPT;
    return PKV_OK;
}

// Run mode: the decoder keeps each sequence's K/V in its buddy block.
static void buddy_extent_of(const void *state, uint32_t r, uint32_t child, uint64_t *offset,
                            uint64_t *slots) {
    const buddy *b = state;
    const int held = child < b->count[r];
    *offset = held ? b->off[b->base[r] + child] : 0;
    *slots = held ? (uint64_t)1 << b->order[b->base[r] + child] : 0;
}

static const pkv_policy_vtable buddy_vtable = {
    .abi_version = PKV_POLICY_ABI_VERSION,
    .name = "buddy",
    .create = buddy_create,
    .destroy = buddy_destroy,
    .need = buddy_need,
    .fits_alone = buddy_fits_alone,
    .admit = buddy_admit,
    .fork = buddy_fork,
    .grow = buddy_grow,
    .release = buddy_release,
    .stats = buddy_stats,
    .reservation = buddy_reservation,
    .validate = buddy_validate,
    .extent_of = buddy_extent_of,
};

const pkv_policy_vtable *pkv_policy_plugin_entry(uint32_t host_abi);
const pkv_policy_vtable *pkv_policy_plugin_entry(uint32_t host_abi) {
    return host_abi == PKV_POLICY_ABI_VERSION ? &buddy_vtable : NULL;
}

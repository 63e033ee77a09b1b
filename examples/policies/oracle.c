// SPDX-License-Identifier: MIT
// contiguous-oracle written again as an external policy, against the installed
// headers only (pkv/policy.h): every sequence reserves exactly the tokens it
// will hold (prompt + output - 1) at admission, in one extent placed first-fit
// in one arena of the budget. tests/test_replay_policy.c checks that it gives
// the same figures as the built-in "contiguous-oracle", field by field.
//
// Build: cc -std=c11 -shared -fPIC $(pkg-config --cflags pagedkv) oracle.c -o oracle.so
// Run:   pkv-replay --policy-plugin ./oracle.so TRACE
#include <stdlib.h>
#include <string.h>

#include "pkv/policy.h"

// ---- a first-fit free-extent list over [0, capacity) slots ----

typedef struct extent {
    uint64_t off, len;
} extent;

typedef struct freelist {
    extent *v; // sorted by offset, never touching (neighbours coalesced)
    size_t n, cap;
    uint64_t total;
} freelist;

static int fl_take(freelist *f, uint64_t len, uint64_t *off) {
    for (size_t i = 0; i < f->n; i++) {
        if (f->v[i].len < len) continue;
        *off = f->v[i].off; // the low end of the first extent that fits
        f->v[i].off += len;
        f->v[i].len -= len;
        if (f->v[i].len == 0) {
            memmove(&f->v[i], &f->v[i + 1], (f->n - i - 1) * sizeof *f->v);
            f->n--;
        }
        f->total -= len;
        return 0;
    }
    return -1;
}

static int fl_give(freelist *f, uint64_t off, uint64_t len) {
    size_t i = 0;
    while (i < f->n && f->v[i].off < off) i++;
    const int prev = i > 0 && f->v[i - 1].off + f->v[i - 1].len == off;
    const int next = i < f->n && f->v[i].off == off + len;
    if (prev && next) {
        f->v[i - 1].len += len + f->v[i].len;
        memmove(&f->v[i], &f->v[i + 1], (f->n - i - 1) * sizeof *f->v);
        f->n--;
    } else if (prev) {
        f->v[i - 1].len += len;
    } else if (next) {
        f->v[i].off = off;
        f->v[i].len += len;
    } else {
        if (f->n == f->cap) {
            size_t c = f->cap ? f->cap * 2 : 64;
            extent *p = realloc(f->v, c * sizeof *p);
            if (!p) return -1;
            f->v = p;
            f->cap = c;
        }
        memmove(&f->v[i + 1], &f->v[i], (f->n - i) * sizeof *f->v);
        f->v[i] = (extent){off, len};
        f->n++;
    }
    f->total += len;
    return 0;
}

// ---- the policy ----

typedef struct oracle {
    uint64_t capacity;
    freelist free;
    uint64_t *base;  // [num_requests]: first sequence slot of request r
    uint32_t *count; // [num_requests]: extents held
    uint64_t *off, *size;
    uint32_t *len;   // [sum of n]: tokens stored per sequence
    uint64_t used, reserved, copy_slots;
} oracle;

static void oracle_destroy(void *state) {
    oracle *o = state;
    if (!o) return;
    free(o->free.v);
    free(o->base);
    free(o->count);
    free(o->off);
    free(o->size);
    free(o->len);
    free(o);
}

static pkv_status oracle_create(const pkv_policy_config *cfg, pkv_policy_info *info, void **out) {
    if (!cfg || !info || !out || cfg->bytes_per_token == 0) return PKV_ERR_INVALID_ARG;
    const uint64_t slots = cfg->capacity_bytes / cfg->bytes_per_token;
    if (slots == 0) return PKV_ERR_INVALID_ARG;
    oracle *o = calloc(1, sizeof *o);
    if (!o) return PKV_ERR_OUT_OF_MEMORY;
    o->capacity = slots;
    const size_t nr = cfg->num_requests ? cfg->num_requests : 1;
    o->base = malloc(nr * sizeof *o->base);
    o->count = calloc(nr, sizeof *o->count);
    uint64_t total = 0;
    if (o->base)
        for (size_t i = 0; i < cfg->num_requests; i++) {
            o->base[i] = total;
            total += cfg->max_seqs[i];
        }
    if (!total) total = 1;
    o->off = malloc(total * sizeof *o->off);
    o->size = malloc(total * sizeof *o->size);
    o->len = calloc(total, sizeof *o->len);
    if (!o->base || !o->count || !o->off || !o->size || !o->len || fl_give(&o->free, 0, slots)) {
        oracle_destroy(o);
        return PKV_ERR_OUT_OF_MEMORY;
    }
    info->capacity_slots = slots;
    info->granularity = 1;
    info->uses_arena = 1;
    *out = o;
    return PKV_OK;
}

static uint64_t oracle_need(const pkv_policy_config *cfg, const pkv_policy_admit *a) {
    (void)cfg;
    return (uint64_t)a->n * a->final_len;
}

static int oracle_fits_alone(const void *state, const pkv_policy_admit *a, uint64_t wm) {
    const oracle *o = state;
    return (uint64_t)a->n * a->final_len + wm <= o->capacity;
}

static pkv_status oracle_admit(void *state, uint32_t r, const pkv_policy_admit *a, uint64_t wm,
                               uint64_t *ext_frag, uint32_t *cached) {
    oracle *o = state;
    *ext_frag = 0;
    *cached = 0;
    const uint64_t size = a->final_len, b = o->base[r];
    const uint64_t free_total = o->free.total;
    if ((uint64_t)a->n * size + wm > free_total) return PKV_ERR_OUT_OF_BLOCKS;
    for (uint32_t i = 0; i < a->n; i++) {
        if (fl_take(&o->free, size, &o->off[b + i]) != 0) {
            // Enough free slots but no extent long enough: external fragmentation.
            for (uint32_t j = 0; j < i; j++)
                if (fl_give(&o->free, o->off[b + j], size) != 0) return PKV_ERR_OUT_OF_MEMORY;
            *ext_frag = free_total;
            return PKV_ERR_OUT_OF_BLOCKS;
        }
        o->size[b + i] = size;
        o->len[b + i] = i < a->nseq ? a->len : 0; // the rest are filled by the fork
        o->used += o->len[b + i];
    }
    o->reserved += (uint64_t)a->n * size;
    o->count[r] = a->n;
    return PKV_OK;
}

static pkv_status oracle_fork(void *state, uint32_t r, uint32_t n) {
    oracle *o = state;
    const uint64_t b = o->base[r];
    if (n > o->count[r]) return PKV_ERR_INVALID_ARG;
    for (uint32_t i = 1; i < n; i++) { // each sample gets a copy of the prompt
        o->len[b + i] = o->len[b];
        o->used += o->len[b];
        o->copy_slots += o->len[b];
    }
    return PKV_OK;
}

static pkv_status oracle_grow(void *state, uint32_t r, uint32_t child) {
    oracle *o = state;
    const uint64_t i = o->base[r] + child;
    if (child >= o->count[r] || o->len[i] >= o->size[i]) return PKV_ERR_INVALID_ARG; // never overflows
    o->len[i]++;
    o->used++;
    return PKV_OK;
}

static void oracle_release(void *state, uint32_t r) {
    oracle *o = state;
    const uint64_t b = o->base[r];
    for (uint32_t i = 0; i < o->count[r]; i++) {
        fl_give(&o->free, o->off[b + i], o->size[b + i]); // cannot grow: it coalesces or reuses
        o->reserved -= o->size[b + i];
        o->used -= o->len[b + i];
        o->len[b + i] = 0;
    }
    o->count[r] = 0;
}

static void oracle_stats(const void *state, pkv_policy_stats *s) {
    const oracle *o = state;
    memset(s, 0, sizeof *s);
    s->used = o->used;
    s->reserved = o->reserved;
    s->free = o->free.total;
    s->copy_slots = o->copy_slots;
}

static uint64_t oracle_reservation(const void *state, uint32_t r, uint32_t nseq, uint32_t len,
                                   uint32_t final_len) {
    const oracle *o = state;
    (void)nseq;
    (void)len;
    uint64_t later = 0;
    for (uint32_t i = 0; i < o->count[r]; i++) {
        const uint64_t k = o->base[r] + i;
        later += (o->size[k] < final_len ? o->size[k] : final_len) - o->len[k];
    }
    return later;
}

static pkv_status oracle_validate(const void *state) {
    const oracle *o = state;
    uint64_t sum = 0;
    for (size_t i = 0; i < o->free.n; i++) {
        if (i && o->free.v[i - 1].off + o->free.v[i - 1].len >= o->free.v[i].off) return PKV_ERR_CORRUPT;
        sum += o->free.v[i].len;
    }
    if (sum != o->free.total || o->reserved + sum != o->capacity || o->used > o->reserved)
        return PKV_ERR_CORRUPT;
    return PKV_OK;
}

static const pkv_policy_vtable oracle_vtable = {
    .abi_version = PKV_POLICY_ABI_VERSION,
    .name = "oracle-plugin",
    .create = oracle_create,
    .destroy = oracle_destroy,
    .need = oracle_need,
    .fits_alone = oracle_fits_alone,
    .admit = oracle_admit,
    .fork = oracle_fork,
    .grow = oracle_grow,
    .release = oracle_release,
    .stats = oracle_stats,
    .reservation = oracle_reservation,
    .validate = oracle_validate,
};

// The entry point pkv-replay looks up (PKV_POLICY_PLUGIN_ENTRY).
const pkv_policy_vtable *pkv_policy_plugin_entry(uint32_t host_abi);
const pkv_policy_vtable *pkv_policy_plugin_entry(uint32_t host_abi) {
    return host_abi == PKV_POLICY_ABI_VERSION ? &oracle_vtable : NULL;
}

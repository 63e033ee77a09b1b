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
// the step by the engine (pkv_policy_host.backend_calls). Where their extents
// go is the replay's device memory model (params.device_mem, device_mem.c): by
// default `cuda` (each allocation rounded to 2 MiB pages, no placement, so no
// external fragmentation), or `arena` (the same first-fit allocator as the
// contiguous-* policies), or `torch-caching` (PyTorch's caching allocator: only
// its segment cudaMallocs are backend calls). Run mode always uses the arena.
#include <stdlib.h>

#include "src/allocator/extent.h"
#include "src/runtime/replay/replay_internal.h"

typedef struct contig {
    pkv_policy kind;
    uint64_t capacity_slots;
    uint64_t bytes_per_token;
    pkv_policy_host host;
    pkvi_extent_alloc *ea;   // arena placement (NULL with a device memory model)
    pkvi_devmem *dm;         // cuda / torch-caching (per-call policies, sim mode)
    pkv_device_mem dm_kind;  // ARENA when dm is NULL
    uint32_t max_seq_len;
    int per_call; // malloc-* policies: count a backend call per extent
    uint64_t *seq_base;  // [num_requests]
    uint32_t *nalloc;    // [num_requests]: extents held
    uint64_t *off;       // [sum of n]
    uint64_t *size;      // [sum of n]
    uint32_t *len;       // [sum of n]
    uint64_t used, reserved;
    uint64_t copy_slots;
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
    return extent_of(c->kind, c->max_seq_len, len, final_len);
}

static int kind_grows(pkv_policy kind) {
    return kind == PKV_POLICY_CONTIG_POW2_GROW || kind == PKV_POLICY_REALLOC_COPY;
}

static int grows(const contig *c) { return kind_grows(c->kind); }

static int kind_per_call(pkv_policy kind) {
    return kind == PKV_POLICY_MALLOC_PER_REQUEST || kind == PKV_POLICY_REALLOC_COPY;
}

// The device memory model of a `kind` policy created for cfg.
static pkv_device_mem contig_dm(pkv_policy kind, const pkv_policy_config *cfg) {
    if (!kind_per_call(kind) || !cfg->params || cfg->run_mode) return PKV_DEVICE_MEM_ARENA;
    return pkvi_device_mem_of(cfg->params);
}

// Slots an extent of `slots` holds under device model dm (bpt bytes per slot):
// whole slots of its rounded bytes (a lone torch-caching request: its segment).
static uint64_t held_slots(pkv_device_mem dm, uint64_t bpt, uint64_t slots) {
    return dm == PKV_DEVICE_MEM_ARENA ? slots : pkvi_devmem_rounded(dm, slots * bpt) / bpt;
}

static uint64_t contig_need(pkv_policy kind, uint32_t max_seq_len, pkv_device_mem dm, uint64_t bpt,
                            const pkv_policy_admit *a) {
    const uint64_t fin = held_slots(dm, bpt, extent_of(kind, max_seq_len, a->final_len, a->final_len));
    const uint64_t adm =
        (uint64_t)a->n * held_slots(dm, bpt, extent_of(kind, max_seq_len, a->len, a->final_len));
    uint64_t peak = (uint64_t)a->n * fin;
    // A move holds the old extent and the new one; a lone pow2-grow sequence
    // at the start of an empty budget always grows in place.
    if (kind == PKV_POLICY_REALLOC_COPY || (kind == PKV_POLICY_CONTIG_POW2_GROW && a->n > 1))
        peak += fin;
    return peak > adm ? peak : adm;
}

// One backend call per extent for the malloc-* policies, through the engine
// (arena model; the device memory models make their own).
static void call(contig *c, pkv_backend_call kind, uint64_t size, uint64_t count) {
    if (!c->per_call || c->dm || count == 0) return;
    c->host.backend_calls(c->host.ctx, kind, size * c->bytes_per_token, count);
}

// pkvi_devmem_calls: a device model's cudaMalloc / cudaFree, through the engine.
static void dm_call(void *ctx, pkv_backend_call kind, uint64_t bytes) {
    contig *c = ctx;
    c->host.backend_calls(c->host.ctx, kind, bytes, 1);
}

// Free slots: the arena's, or what the device model has not handed out.
static uint64_t free_slots(const contig *c) {
    return c->dm ? c->capacity_slots - c->reserved : pkvi_extent_free_total(c->ea);
}

// `charge` 0: a rollback that the engine never sees (it checks before it calls).
static void put_extent(contig *c, uint64_t off, uint64_t size, int charge) {
    c->reserved -= size;
    if (c->dm) {
        pkvi_devmem_free(c->dm, off);
        return;
    }
    pkvi_extent_free_units(c->ea, off, size);
    if (charge) call(c, PKV_BACKEND_CALL_FREE, size, 1);
}

// An extent of `*size` slots; with a device model, *size becomes the slots the
// allocation holds (its rounded bytes, whole slots).
static pkv_status get_extent(contig *c, uint64_t *size, uint64_t *off, int charge) {
    if (c->dm) {
        uint64_t held;
        pkv_status st = pkvi_devmem_alloc(c->dm, *size * c->bytes_per_token, off, &held);
        if (st != PKV_OK) return st;
        *size = held / c->bytes_per_token;
        c->reserved += *size;
        return PKV_OK;
    }
    pkv_status st = pkvi_extent_alloc_units(c->ea, *size, off);
    if (st != PKV_OK) return st;
    c->reserved += *size;
    if (charge) call(c, PKV_BACKEND_CALL_ALLOC, *size, 1);
    return PKV_OK;
}

static pkv_status contig_admit(void *pp, uint32_t r, const pkv_policy_admit *a, uint64_t wm,
                               uint64_t *ext_frag, uint32_t *cached) {
    contig *c = pp;
    *ext_frag = 0;
    *cached = 0;
    const uint64_t size = extent_for(c, a->len, a->final_len);
    const uint32_t count = a->n; // every sequence's extent, now
    const uint64_t free_total = free_slots(c);
    // A device model's allocation holds its size rounded (cuda: to the 2 MiB granule):
    // check with what it will hold, so that a refused admission does not reach the
    // model, which charges every call it sees (an engine checks before it calls).
    const uint64_t holds = held_slots(c->dm_kind, c->bytes_per_token, size);
    if ((uint64_t)count * holds + wm > free_total) return PKV_ERR_OUT_OF_BLOCKS;
    const uint64_t b = c->seq_base[r];
    for (uint32_t i = 0; i < count; i++) {
        uint64_t got = size;
        pkv_status st = get_extent(c, &got, &c->off[b + i], 0);
        if (st != PKV_OK || (c->dm && free_slots(c) < wm)) {
            if (st == PKV_OK) put_extent(c, c->off[b + i], got, 0);
            // Enough free slots, no extent long enough: external fragmentation
            // (arena, torch-caching; cuda: the granule rounding, not external).
            // The arena charges its rolled-back extents nothing (an engine checks
            // before it calls); torch-caching charges the cudaMalloc PyTorch would
            // have made; cuda's check above leaves it nothing to roll back.
            for (uint32_t j = 0; j < i; j++) put_extent(c, c->off[b + j], c->size[b + j], 0);
            if (st != PKV_OK && st != PKV_ERR_OUT_OF_BLOCKS) return st;
            *ext_frag = c->dm_kind == PKV_DEVICE_MEM_CUDA ? 0 : free_total;
            return PKV_ERR_OUT_OF_BLOCKS;
        }
        c->size[b + i] = got;
    }
    call(c, PKV_BACKEND_CALL_ALLOC, size, count);
    for (uint32_t i = 0; i < count; i++) {
        c->len[b + i] = i < a->nseq ? a->len : 0; // the rest are filled by the fork
        c->used += c->len[b + i];
    }
    c->nalloc[r] = count;
    return PKV_OK;
}

static pkv_status contig_fork(void *pp, uint32_t r, uint32_t n) {
    contig *c = pp;
    const uint64_t b = c->seq_base[r];
    if (n > c->nalloc[r]) return PKV_ERR_INVALID_ARG;
    for (uint32_t i = 1; i < n; i++) { // copy the prompt's KV into each sample
        c->len[b + i] = c->len[b];
        c->used += c->len[b];
        c->copy_slots += c->len[b];
    }
    return PKV_OK;
}

static pkv_status contig_grow(void *pp, uint32_t r, uint32_t child) {
    contig *c = pp;
    const uint64_t i = c->seq_base[r] + child;
    if (c->len[i] + 1 <= c->size[i] && c->kind != PKV_POLICY_REALLOC_COPY) {
        c->len[i]++;
        c->used++;
        return PKV_OK;
    }
    if (!grows(c)) return PKV_ERR_INVALID_ARG; // a fixed extent cannot overflow
    const uint64_t new_size = c->kind == PKV_POLICY_REALLOC_COPY
                                  ? (uint64_t)c->len[i] + 1
                                  : extent_for(c, c->len[i] + 1, 0);
    if (c->kind == PKV_POLICY_CONTIG_POW2_GROW &&
        pkvi_extent_grow(c->ea, c->off[i], c->size[i], new_size) == PKV_OK) {
        c->reserved += new_size - c->size[i];
        c->size[i] = new_size;
    } else {
        // cudaMalloc has no realloc: allocate, copy, free.
        uint64_t off, got = new_size;
        pkv_status st = get_extent(c, &got, &off, 1);
        if (st != PKV_OK) return st;
        c->copy_slots += c->len[i];
        put_extent(c, c->off[i], c->size[i], 1);
        c->off[i] = off;
        c->size[i] = got;
    }
    c->len[i]++;
    c->used++;
    return PKV_OK;
}

static void contig_release(void *pp, uint32_t r) {
    contig *c = pp;
    const uint64_t b = c->seq_base[r];
    for (uint32_t i = 0; i < c->nalloc[r]; i++) {
        put_extent(c, c->off[b + i], c->size[b + i], 1);
        c->used -= c->len[b + i];
        c->len[b + i] = 0;
    }
    c->nalloc[r] = 0;
}

static int contig_fits_alone(const void *pp, const pkv_policy_admit *a, uint64_t wm) {
    const contig *c = pp;
    const uint64_t cap = c->capacity_slots;
    const uint64_t one = held_slots(c->dm_kind, c->bytes_per_token, extent_for(c, a->len, a->final_len));
    if ((uint64_t)a->n * one + wm > cap) return 0;
    return contig_need(c->kind, c->max_seq_len, c->dm_kind, c->bytes_per_token, a) <= cap;
}

static uint64_t contig_reservation(const void *pp, uint32_t r, uint32_t nseq, uint32_t len,
                                   uint32_t final_len) {
    const contig *c = pp;
    (void)nseq;
    (void)len;
    const uint64_t b = c->seq_base[r];
    uint64_t later = 0;
    for (uint32_t i = 0; i < c->nalloc[r]; i++) {
        const uint64_t fillable = c->size[b + i] < final_len ? c->size[b + i] : final_len;
        later += fillable - c->len[b + i];
    }
    return later;
}

static void contig_stats(const void *pp, pkv_policy_stats *s) {
    const contig *c = pp;
    s->used = c->used;
    s->reserved = c->reserved;
    s->free = free_slots(c);
    s->copy_slots = c->copy_slots;
    s->cow_copies = 0;
    s->cached_tokens = 0;
}

static void contig_extent_of(const void *pp, uint32_t r, uint32_t child, uint64_t *off,
                             uint64_t *slots) {
    const contig *c = pp;
    const int held = child < c->nalloc[r];
    *off = held ? c->off[c->seq_base[r] + child] : 0;
    *slots = held ? c->size[c->seq_base[r] + child] : 0;
}

static pkv_status contig_validate(const void *pp) {
    const contig *c = pp;
    pkv_status st = c->dm ? pkvi_devmem_validate(c->dm) : pkvi_extent_validate(c->ea);
    if (st != PKV_OK) return st;
    if (c->reserved + free_slots(c) != c->capacity_slots) return PKV_ERR_CORRUPT;
    return c->used <= c->reserved ? PKV_OK : PKV_ERR_CORRUPT;
}

static void contig_destroy(void *pp) {
    contig *c = pp;
    if (!c) return;
    pkvi_extent_destroy(c->ea);
    pkvi_devmem_destroy(c->dm);
    free(c->seq_base);
    free(c->nalloc);
    free(c->off);
    free(c->size);
    free(c->len);
    free(c);
}

static pkv_status contig_create(pkv_policy kind, const pkv_policy_config *cfg,
                                pkv_policy_info *info, void **out) {
    if (!cfg || !info || !out || cfg->bytes_per_token == 0 || cfg->max_seq_len == 0)
        return PKV_ERR_INVALID_ARG;
    const uint64_t slots = cfg->capacity_bytes / cfg->bytes_per_token;
    if (slots == 0) return PKV_ERR_OUT_OF_BLOCKS;
    contig *c = calloc(1, sizeof *c);
    if (!c) return PKV_ERR_OUT_OF_MEMORY;
    c->kind = kind;
    c->capacity_slots = slots;
    c->bytes_per_token = cfg->bytes_per_token;
    c->host = cfg->host;
    c->max_seq_len = cfg->max_seq_len;
    c->per_call = kind_per_call(kind);
    c->dm_kind = contig_dm(kind, cfg);
    pkv_status st = c->dm_kind != PKV_DEVICE_MEM_ARENA
                        ? pkvi_devmem_create(c->dm_kind, slots * cfg->bytes_per_token, dm_call, c, &c->dm)
                        : pkvi_extent_create(slots, PKVI_EXTENT_FIRST_FIT, &c->ea);
    if (st != PKV_OK) {
        contig_destroy(c);
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
        contig_destroy(c);
        return PKV_ERR_OUT_OF_MEMORY;
    }
    info->capacity_slots = slots;
    info->granularity = 1;
    info->uses_arena = !c->per_call; // contiguous-*: one arena; malloc-*: a call per extent
    *out = c;
    return PKV_OK;
}

// One table per kind; they differ in the extent size only.
#define CONTIG_VTABLE(ident, KIND, NAME)                                                           \
    static pkv_status ident##_create(const pkv_policy_config *cfg, pkv_policy_info *info,         \
                                     void **out) {                                                 \
        return contig_create(KIND, cfg, info, out);                                                \
    }                                                                                              \
    static uint64_t ident##_need(const pkv_policy_config *cfg, const pkv_policy_admit *a) {        \
        return contig_need(KIND, cfg->max_seq_len, contig_dm(KIND, cfg), cfg->bytes_per_token, a);  \
    }                                                                                              \
    const pkv_policy_vtable pkvi_policy_##ident##_vtable = {                                       \
        .abi_version = PKV_POLICY_ABI_VERSION,                                                     \
        .name = NAME,                                                                              \
        .create = ident##_create,                                                                  \
        .destroy = contig_destroy,                                                                 \
        .need = ident##_need,                                                                      \
        .fits_alone = contig_fits_alone,                                                           \
        .admit = contig_admit,                                                                     \
        .fork = contig_fork,                                                                       \
        .grow = contig_grow,                                                                       \
        .release = contig_release,                                                                 \
        .stats = contig_stats,                                                                     \
        .reservation = contig_reservation,                                                         \
        .validate = contig_validate,                                                               \
        .extent_of = contig_extent_of,                                                             \
    };

CONTIG_VTABLE(contig_max, PKV_POLICY_CONTIG_MAX, "contiguous-max")
CONTIG_VTABLE(contig_pow2, PKV_POLICY_CONTIG_POW2, "contiguous-pow2")
CONTIG_VTABLE(contig_oracle, PKV_POLICY_CONTIG_ORACLE, "contiguous-oracle")
CONTIG_VTABLE(malloc_per_request, PKV_POLICY_MALLOC_PER_REQUEST, "malloc-per-request")
CONTIG_VTABLE(realloc_copy, PKV_POLICY_REALLOC_COPY, "realloc-copy")
CONTIG_VTABLE(contig_pow2_grow, PKV_POLICY_CONTIG_POW2_GROW, "contiguous-pow2-grow")

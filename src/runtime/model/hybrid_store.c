// SPDX-License-Identifier: MIT
// The model's KV store over a hybrid KV manager's pools (pkv/model.h, "hybrid
// store"): host memory laid out as the manager's layout addresses its blocks
// (src/allocator/hybrid_memory.h), a step that runs the manager's queued copies
// and then the decoder with a PKVI_KV_HYBRID target, and the per-layer
// resolution of that target (which group, which table, which strides) for
// hetero_cpu.c. The K/V thus lives where the manager says its blocks are: a block
// the window rule released and another sequence took again is overwritten by
// that sequence, so a read of a released block cannot go unnoticed.
#include <stdlib.h>
#include <string.h>

#include "hybrid_store.h"
#include "model_internal.h"
#include "src/allocator/clock.h"
#include "src/allocator/hybrid_memory.h"

struct pkv_model_hybrid_store {
    pkv_model *model;
    pkv_hybrid *kv;
    pkvi_hybrid_memory mem;
    float *region[PKV_MAX_KV_GROUPS];      // [mem.num_regions], carved from `arena`
    void *arena;                           // every region, one allocation
    pkv_backend *backend;                  // borrowed: arena's allocator; NULL: malloc
    uint32_t num_groups;
    pkv_kv_group groups[PKV_MAX_KV_GROUPS];
    uint32_t block_size[PKV_MAX_KV_GROUPS];
    uint8_t layer_group[PKV_MAX_LAYERS];
    uint64_t layer_off[PKV_MAX_LAYERS];    // floats from a page's start to the layer's K
    int32_t state_group;                   // the first state group, -1 without
    pkv_model_state_store *states;         // keyed by the state_group slot
    // Per step: each owner group's padded tables, the state keys, a copy buffer.
    int32_t *table[PKV_MAX_KV_GROUPS];
    uint64_t cap_table[PKV_MAX_KV_GROUPS];
    uint32_t max_blocks[PKV_MAX_KV_GROUPS];
    pkv_seq_id *keys;
    uint32_t cap_keys;
    pkv_block_copy *copies;
    uint32_t cap_copies;
    int fault;                             // a released block was read (hetero_cpu.c)
};

#define TRY(expr)                                                                        \
    do {                                                                                 \
        pkv_status st_ = (expr);                                                         \
        if (st_ != PKV_OK) return st_;                                                   \
    } while (0)

static int same_group(const pkv_kv_group *a, const pkv_kv_group *b) {
    return a->kind == b->kind && a->num_layers == b->num_layers &&
           a->num_kv_heads == b->num_kv_heads && a->head_dim == b->head_dim &&
           a->window == b->window && a->latent_dim == b->latent_dim &&
           a->rope_dim == b->rope_dim && a->sinks == b->sinks && a->state_bytes == b->state_bytes;
}

// Floats of one layer of group g per token in a page.
static uint64_t layer_floats_per_token(const pkv_kv_group *g) {
    if (g->kind == PKV_LAYER_MLA) return (uint64_t)g->latent_dim + g->rope_dim;
    return 2ull * g->num_kv_heads * g->head_dim;
}

// The model's groups against the manager's, and each layer's place in its page.
static pkv_status bind_groups(pkv_model_hybrid_store *s) {
    const pkv_model_config *c = &s->model->cfg;
    uint32_t n = 0;
    TRY(pkv_model_kv_groups(c, s->groups, &n));
    if (n != pkv_hybrid_num_groups(s->kv)) return PKV_ERR_INVALID_ARG;
    s->num_groups = n;
    s->state_group = -1;
    for (uint32_t g = 0; g < n; g++) {
        pkv_kv_group hg;
        TRY(pkv_hybrid_group_info(s->kv, g, &hg, &s->block_size[g]));
        if (!same_group(&hg, &s->groups[g])) return PKV_ERR_INVALID_ARG;
        if (hg.kind == PKV_LAYER_STATE && s->state_group < 0) s->state_group = (int32_t)g;
        // Every attention layer keeps the model's kv_heads x head_dim per token
        // (hetero_cpu.c's loop); anything else is not this model's cache.
        if (hg.kind != PKV_LAYER_STATE && hg.kind != PKV_LAYER_MLA &&
            (hg.num_kv_heads != c->num_kv_heads || hg.head_dim != c->head_dim))
            return PKV_ERR_INVALID_ARG;
    }
    uint32_t seen[PKV_MAX_KV_GROUPS] = {0};
    for (uint32_t l = 0; l < c->num_layers; l++) {
        const uint32_t g = c->num_kv_groups ? c->layer_group[l] : 0;
        s->layer_group[l] = (uint8_t)g;
        s->layer_off[l] =
            (uint64_t)seen[g]++ * s->block_size[g] * layer_floats_per_token(&s->groups[g]);
    }
    return PKV_OK;
}

// Every byte figure of the map times k: the map of the same manager with elements
// k times wider (bytes per token, pages and LCM's large page all scale by k, so
// every block keeps its place).
static void scale_memory(pkvi_hybrid_memory *mem, uint64_t k) {
    mem->elem_bytes *= k;
    for (uint32_t r = 0; r < mem->num_regions; r++) mem->region_bytes[r] *= k;
    for (uint32_t g = 0; g < PKV_MAX_KV_GROUPS; g++) {
        pkvi_hybrid_addr *a = &mem->group[g];
        a->base *= k;
        a->page_bytes *= k;
        a->page_stride *= k;
        a->chunk_bytes *= k;
    }
}

pkv_status pkvi_hybrid_store_create(pkv_model *model, pkv_hybrid *kv, pkv_dtype dtype,
                                    int widen, pkv_backend *backend,
                                    pkv_model_hybrid_store **out) {
    if (!out) return PKV_ERR_INVALID_ARG;
    *out = NULL;
    if (!model || !kv) return PKV_ERR_INVALID_ARG;
    // The heterogeneous loop is the CPU decoder's and reads fp32 host memory.
    if (model->params.device != PKV_DEVICE_CPU || dtype != PKV_DTYPE_F32)
        return PKV_ERR_UNSUPPORTED;
    pkv_model_hybrid_store *s = calloc(1, sizeof *s);
    if (!s) return PKV_ERR_OUT_OF_MEMORY;
    s->model = model;
    s->kv = kv;
    pkv_status st = pkvi_hybrid_memory_get(kv, &s->mem);
    const size_t es = pkv_dtype_size(dtype);
    if (st == PKV_OK && widen && s->mem.elem_bytes && es % s->mem.elem_bytes == 0)
        scale_memory(&s->mem, es / s->mem.elem_bytes);
    if (st == PKV_OK && s->mem.elem_bytes != es) st = PKV_ERR_INVALID_ARG;
    if (st == PKV_OK) st = bind_groups(s);
    // One allocation for every region (the arena a replay counts as one call),
    // zeroed: untouched host pages would read as the shared zero page.
    const uint64_t total = pkv_model_hybrid_store_bytes(s);
    if (st == PKV_OK && (total == 0 || total > SIZE_MAX)) st = PKV_ERR_OUT_OF_MEMORY;
    if (st == PKV_OK && backend) {
        st = pkv_backend_alloc(backend, (size_t)total, &s->arena);
        if (st == PKV_OK) s->backend = backend;
        if (st == PKV_OK) st = pkv_backend_memset(backend, s->arena, 0, (size_t)total);
    } else if (st == PKV_OK && !(s->arena = calloc(1, (size_t)total))) {
        st = PKV_ERR_OUT_OF_MEMORY;
    }
    for (uint64_t r = 0, at = 0; r < s->mem.num_regions && st == PKV_OK; r++) {
        s->region[r] = (float *)((char *)s->arena + at);
        at += s->mem.region_bytes[r];
    }
    if (st == PKV_OK && s->state_group >= 0)
        st = pkv_model_state_store_create(model, s->mem.state_slots, &s->states);
    if (st != PKV_OK) {
        pkv_model_hybrid_store_destroy(s);
        return st;
    }
    *out = s;
    return PKV_OK;
}

pkv_status pkv_model_hybrid_store_create(pkv_model *model, pkv_hybrid *kv, pkv_dtype dtype,
                                         pkv_model_hybrid_store **out) {
    return pkvi_hybrid_store_create(model, kv, dtype, 0, NULL, out);
}

void pkv_model_hybrid_store_destroy(pkv_model_hybrid_store *s) {
    if (!s) return;
    if (s->backend)
        pkv_backend_free(s->backend, s->arena, (size_t)pkv_model_hybrid_store_bytes(s));
    else
        free(s->arena);
    for (uint32_t g = 0; g < PKV_MAX_KV_GROUPS; g++) free(s->table[g]);
    pkv_model_state_store_destroy(s->states);
    free(s->keys);
    free(s->copies);
    free(s);
}

uint64_t pkv_model_hybrid_store_bytes(const pkv_model_hybrid_store *s) {
    uint64_t sum = 0;
    for (uint32_t r = 0; s && r < s->mem.num_regions; r++) sum += s->mem.region_bytes[r];
    return sum;
}

pkv_status pkvi_hybrid_store_region(pkv_model_hybrid_store *s, uint32_t r, float **data,
                                    uint64_t *bytes) {
    if (!s || !data || !bytes || r >= s->mem.num_regions) return PKV_ERR_INVALID_ARG;
    *data = s->region[r];
    *bytes = s->mem.region_bytes[r];
    return PKV_OK;
}

pkv_status pkvi_hybrid_store_states(pkv_model_hybrid_store *s, int32_t *group,
                                    pkv_model_state_store **states) {
    if (!s || !group || !states) return PKV_ERR_INVALID_ARG;
    *group = s->state_group;
    *states = s->states;
    return PKV_OK;
}

pkv_status pkvi_hybrid_store_block(const pkv_model_hybrid_store *s, uint32_t g, uint32_t b,
                                   uint32_t *r, uint64_t *offset, uint64_t *bytes) {
    if (!s || g >= s->num_groups || s->groups[g].kind == PKV_LAYER_STATE) return PKV_ERR_INVALID_ARG;
    const pkvi_hybrid_addr *a = &s->mem.group[g];
    if (b >= a->num_blocks || !r || !offset || !bytes) return PKV_ERR_INVALID_ARG;
    *r = a->region;
    *offset = pkvi_hybrid_block_offset(a, b);
    *bytes = a->page_bytes;
    return PKV_OK;
}

static pkv_status reserve(void **buf, uint64_t *cap, uint64_t need, size_t each) {
    if (need <= *cap) return PKV_OK;
    if (need > SIZE_MAX / each) return PKV_ERR_OUT_OF_MEMORY;
    void *p = realloc(*buf, (size_t)need * each);
    if (!p) return PKV_ERR_OUT_OF_MEMORY;
    *buf = p;
    *cap = need;
    return PKV_OK;
}

static pkv_status take_copies(pkv_model_hybrid_store *s, uint32_t g, uint32_t *n) {
    *n = pkv_hybrid_pending_copies(s->kv, g);
    if (*n == 0) return PKV_OK;
    uint64_t cap = s->cap_copies;
    TRY(reserve((void **)&s->copies, &cap, *n, sizeof *s->copies));
    s->cap_copies = (uint32_t)cap;
    return pkv_hybrid_take_copies(s->kv, g, s->copies, s->cap_copies, n);
}

pkv_status pkvi_hybrid_store_apply_copies(pkv_model_hybrid_store *s, uint32_t g,
                                          const pkv_block_copy *copies, uint32_t n,
                                          uint64_t *copied) {
    if (!s || g >= s->num_groups || (n && !copies)) return PKV_ERR_INVALID_ARG;
    uint64_t bytes = 0;
    if (s->groups[g].kind == PKV_LAYER_STATE) {
        // The first state group's copies {src slot, dst slot} go to the states (dst
        // gets src's, or none when src holds none); the others' name the same forks.
        if ((int32_t)g != s->state_group) return PKV_OK;
        for (uint32_t i = 0; i < n; i++) {
            const int64_t src = copies[i].src, dst = copies[i].dst;
            if (src == dst) continue;
            pkv_model_state_store_release(s->states, dst); // a stale entry, if any
            if (pkv_model_state_store_tokens(s->states, src) > 0) {
                TRY(pkv_model_state_store_fork(s->states, src, dst));
                bytes += pkvi_state_store_entry_bytes(s->states);
            }
        }
        if (copied) *copied += bytes;
        return PKV_OK;
    }
    // Every group on g's table (PAGED: every token group's part of the page).
    const uint32_t o = s->mem.group[g].owner;
    for (uint32_t h = 0; h < s->num_groups; h++) {
        const pkvi_hybrid_addr *a = &s->mem.group[h];
        if (s->groups[h].kind == PKV_LAYER_STATE || a->owner != o) continue;
        char *base = (char *)s->region[a->region];
        for (uint32_t i = 0; i < n; i++) {
            if ((uint32_t)copies[i].src >= a->num_blocks || (uint32_t)copies[i].dst >= a->num_blocks)
                return PKV_ERR_INVALID_ARG;
            memcpy(base + pkvi_hybrid_block_offset(a, (uint32_t)copies[i].dst),
                   base + pkvi_hybrid_block_offset(a, (uint32_t)copies[i].src),
                   (size_t)a->page_bytes);
            bytes += a->page_bytes;
        }
    }
    if (copied) *copied += bytes;
    return PKV_OK;
}

// Take and run every queued copy (a PAGED alias's queue is its owner's).
static pkv_status run_copies(pkv_model_hybrid_store *s) {
    for (uint32_t g = 0; g < s->num_groups; g++) {
        if (s->groups[g].kind != PKV_LAYER_STATE && s->mem.group[g].owner != g) continue;
        uint32_t n = 0;
        TRY(take_copies(s, g, &n));
        TRY(pkvi_hybrid_store_apply_copies(s, g, s->copies, n, NULL));
    }
    return PKV_OK;
}

// Each owner group's padded table of the step's sequences (-1: released, -2 past
// the end: neither is ever read).
static pkv_status export_tables(pkv_model_hybrid_store *s, uint32_t S, const pkv_seq_id *seqs) {
    for (uint32_t g = 0; g < s->num_groups; g++) {
        if (s->groups[g].kind == PKV_LAYER_STATE || s->mem.group[g].owner != g) continue;
        uint32_t mb = 0;
        uint64_t total = 0;
        TRY(pkv_hybrid_export_size(s->kv, g, seqs, S, &mb, &total));
        if (mb == 0) mb = 1;
        TRY(reserve((void **)&s->table[g], &s->cap_table[g], (uint64_t)S * mb, sizeof(int32_t)));
        TRY(pkv_hybrid_export_padded(s->kv, g, seqs, S, mb, -2, s->table[g], NULL));
        s->max_blocks[g] = mb;
    }
    return PKV_OK;
}

// The state store's key of each sequence: its slot in the first state group. A
// sequence whose step starts at position 0 starts from a zero state, whatever a
// freed sequence that held the slot left there.
static pkv_status state_keys(pkv_model_hybrid_store *s, uint32_t S, const pkv_seq_id *seqs,
                             const uint32_t *counts) {
    if (s->state_group < 0) return PKV_OK;
    uint64_t cap = s->cap_keys;
    TRY(reserve((void **)&s->keys, &cap, S, sizeof *s->keys));
    s->cap_keys = (uint32_t)cap;
    for (uint32_t i = 0; i < S; i++) {
        int32_t slot = -1;
        TRY(pkv_hybrid_state_slot(s->kv, seqs[i], (uint32_t)s->state_group, &slot));
        s->keys[i] = slot;
        if ((uint32_t)s->model->meta.lens[i] == counts[i])
            pkv_model_state_store_release(s->states, slot);
    }
    return PKV_OK;
}

pkv_status pkv_model_prefill_hybrid(pkv_model *m, pkv_model_hybrid_store *s, uint32_t S,
                                    const pkv_seq_id *seqs, const uint32_t *counts,
                                    const int32_t *tokens, float *logits, int32_t *next_tokens) {
    if (!m || !s || s->model != m || S == 0 || !seqs || !counts || !tokens)
        return PKV_ERR_INVALID_ARG;
    if (m->params.device != PKV_DEVICE_CPU) return PKV_ERR_UNSUPPORTED;
    const double t0 = pkvi_now_seconds();
    // Copies first: a forked sequence's fresh block gets its parent's tokens before
    // this step writes into it.
    TRY(run_copies(s));
    uint64_t T = 0;
    uint32_t max_len = 1;
    for (uint32_t i = 0; i < S; i++) {
        uint32_t len = 0;
        TRY(pkv_hybrid_seq_length(s->kv, seqs[i], &len));
        if (counts[i] == 0 || counts[i] > len) return PKV_ERR_INVALID_ARG;
        if (m->cfg.pos == PKV_POS_LEARNED && len > m->cfg.max_seq_len) return PKV_ERR_INVALID_ARG;
        max_len = len > max_len ? len : max_len;
        T += counts[i];
    }
    if (T > INT32_MAX) return PKV_ERR_INVALID_ARG;
    TRY(pkvi_scratch_reserve(m, (uint32_t)T, S, 1));
    for (uint32_t i = 0; i < S; i++) {
        uint32_t len = 0;
        TRY(pkv_hybrid_seq_length(s->kv, seqs[i], &len));
        m->meta.lens[i] = (int32_t)len;
    }
    uint32_t nt = 0;
    TRY(pkvi_fill_tokens(m, S, counts, tokens, &nt));
    TRY(export_tables(s, S, seqs));
    TRY(state_keys(s, S, seqs, counts));
    pkvi_kv_target kv;
    memset(&kv, 0, sizeof kv);
    kv.kind = PKVI_KV_HYBRID;
    kv.dtype = PKV_DTYPE_F32;
    kv.max_len = max_len;
    kv.hybrid = s;
    kv.h_fault = &s->fault;
    pkvi_call call = {S, nt, nt == S, NULL, NULL, NULL, NULL};
    // The states are the store's own: hand them to the model for this step only.
    pkv_model_state_store *caller_states = m->states;
    m->states = s->states;
    pkv_status st = pkvi_states_bind(m, S, s->state_group >= 0 ? s->keys : NULL, NULL, counts,
                                     &call);
    if (st == PKV_OK) st = pkvi_run_step(m, &call, &kv, t0, logits, next_tokens);
    m->states = caller_states;
    return st;
}

pkv_status pkv_model_decode_hybrid(pkv_model *m, pkv_model_hybrid_store *s, uint32_t S,
                                   const pkv_seq_id *seqs, const int32_t *tokens, float *logits,
                                   int32_t *next_tokens) {
    if (!m || S == 0) return PKV_ERR_INVALID_ARG;
    uint32_t *ones = NULL;
    TRY(pkvi_ones_for(m, S, &ones));
    return pkv_model_prefill_hybrid(m, s, S, seqs, ones, tokens, logits, next_tokens);
}

void pkvi_hybrid_layer_target(const pkvi_kv_target *kv, uint32_t layer, pkvi_kv_target *out,
                              float **kc, float **vc) {
    pkv_model_hybrid_store *s = kv->hybrid;
    const uint32_t g = s->layer_group[layer];
    const pkvi_hybrid_addr *a = &s->mem.group[g];
    const pkv_kv_group *grp = &s->groups[g];
    const uint32_t B = s->block_size[g];
    *out = *kv;
    out->h_table = s->table[a->owner];
    out->max_blocks = s->max_blocks[a->owner];
    out->block_size = B;
    out->h_per_chunk = a->per_chunk;
    out->h_page = a->page_stride / sizeof(float);
    out->h_chunk = a->chunk_bytes / sizeof(float);
    out->h_fault = &s->fault;
    float *k = s->region[a->region] + a->base / sizeof(float) + s->layer_off[layer];
    *kc = k;
    if (grp->kind == PKV_LAYER_MLA) {
        // latent + rope contiguous per token; hetero_cpu.c's latent_io walks it in
        // rows of head_dim
        out->head_stride = s->model->cfg.head_dim;
        out->token_stride = (uint64_t)grp->latent_dim + grp->rope_dim;
        *vc = NULL;
    } else {
        out->head_stride = (uint64_t)B * grp->head_dim;
        out->token_stride = grp->head_dim;
        *vc = k + (uint64_t)grp->num_kv_heads * B * grp->head_dim;
    }
}

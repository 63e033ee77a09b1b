// SPDX-License-Identifier: MIT
// Run mode's hybrid-vmm layout over a real pkv_hybrid_vmm (run_hybrid_vmm.h).
// Layer l of group g is the i-th of its group's layers: K in buffer 2i and V in
// buffer 2i + 1 of g's space (MLA and state layers: buffer i), every row a slot.
// A step of a sequence computing positions first..ctx-1 maps, per group, the
// tokens from the first query's window to ctx (pkv_hybrid_vmm_set_step), so a
// prefill chunk's early queries find their keys and the next step unmaps them.
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "run_hybrid_vmm.h"
#include "src/allocator/clock.h"
#include "src/runtime/model/slot_store.h"

enum { FORK_PENDING = 1, RESUMES = 2 };

struct pkvi_run_hvmm {
    pkv_model *model;
    pkv_hybrid_vmm *kv;
    pkvi_slot_kv *store;
    uint32_t num_groups;
    pkv_kv_group groups[PKV_MAX_KV_GROUPS];
    uint32_t num_slots;
    uint32_t *len;         // [num_slots] tokens of the slot's sequence after its last sync
    uint32_t *dead;        // [num_slots] released by the policy, released at the next sync
    uint32_t ndead;
    uint64_t *base;        // [num_requests] first pair of request r
    pkv_seq_id *slot;      // [pairs] slot of (r, child), -1 if none
    uint8_t *fork_pending; // [pairs] FORK_PENDING: must copy child 0's rows first;
                           // RESUMES: swapped in, its rows come back after the sync
    const uint32_t *max_seqs;
    uint32_t *lens;        // [num_slots] the forward's lengths
    double step_s;         // seconds of the manager's calls made in syncs
    double copy_s;         // seconds of a sync's fork copies (not calls: left out)
};

static pkv_status slots_for(const pkvi_run_hvmm_params *p, const pkv_kv_group *g, uint32_t ng,
                            uint64_t pairs, uint32_t *out) {
    // Least memory a live sequence holds: a page in every buffer of every group.
    uint64_t least = 0;
    for (uint32_t i = 0; i < ng; i++) {
        const uint64_t bufs = g[i].kind == PKV_LAYER_MLA || g[i].kind == PKV_LAYER_STATE
                                  ? g[i].num_layers : 2ull * g[i].num_layers;
        const uint64_t per = g[i].kind == PKV_LAYER_STATE
                                 ? (g[i].state_bytes + p->page_bytes - 1) / p->page_bytes : 1;
        least += bufs * per * p->page_bytes;
    }
    const uint64_t live = least ? p->budget_bytes / least : 0;
    const uint64_t n = live < pairs ? live : pairs;
    if (n == 0) return PKV_ERR_OUT_OF_BLOCKS;
    *out = n > UINT32_MAX / 2 ? UINT32_MAX / 2 : (uint32_t)n;
    return PKV_OK;
}

// The store over the spaces' buffers: each layer's rows.
static pkv_status make_store(pkvi_run_hvmm *h, const pkv_model_config *c, uint32_t max_len) {
    pkvi_slot_layer layers[PKV_MAX_LAYERS];
    uint32_t seen[PKV_MAX_KV_GROUPS] = {0};
    for (uint32_t l = 0; l < c->num_layers; l++) {
        const uint32_t g = c->num_kv_groups ? c->layer_group[l] : 0;
        const pkv_vmm_space *sp = pkv_hybrid_vmm_space(h->kv, g);
        pkv_vmm_info info;
        pkv_status st = pkv_vmm_get_info(sp, &info);
        if (st != PKV_OK) return st;
        const int kv_pair = h->groups[g].kind != PKV_LAYER_MLA && h->groups[g].kind != PKV_LAYER_STATE;
        const uint32_t i = seen[g]++;
        void *k = NULL, *v = NULL;
        st = pkv_vmm_buffer_ptr(sp, kv_pair ? 2 * i : i, &k);
        if (st == PKV_OK && kv_pair) st = pkv_vmm_buffer_ptr(sp, 2 * i + 1, &v);
        if (st != PKV_OK) return st;
        layers[l] = (pkvi_slot_layer){k, v, info.buffer_bytes / sizeof(float)};
    }
    return pkvi_slot_kv_create(h->model, h->num_slots, max_len, layers, &h->store);
}

pkv_status pkvi_run_hvmm_create(const pkvi_run_hvmm_params *p, pkvi_run_hvmm **out) {
    if (!p || !out || !p->model || (p->num_requests && !p->max_seqs)) return PKV_ERR_INVALID_ARG;
    *out = NULL;
    pkv_model_config c;
    pkv_status st = pkv_model_get_config(p->model, &c);
    if (st != PKV_OK) return st;
    pkvi_run_hvmm *h = calloc(1, sizeof *h);
    if (!h) return PKV_ERR_OUT_OF_MEMORY;
    h->model = p->model;
    h->max_seqs = p->max_seqs;
    uint64_t pairs = 0;
    h->base = malloc((size_t)(p->num_requests ? p->num_requests : 1) * sizeof *h->base);
    if (!h->base) st = PKV_ERR_OUT_OF_MEMORY;
    for (uint32_t r = 0; st == PKV_OK && r < p->num_requests; r++) {
        h->base[r] = pairs;
        pairs += p->max_seqs[r];
    }
    if (st == PKV_OK) st = pkv_model_kv_groups(&c, h->groups, &h->num_groups);
    if (st == PKV_OK) st = slots_for(p, h->groups, h->num_groups, pairs, &h->num_slots);
    if (st == PKV_OK) {
        h->slot = malloc((size_t)(pairs ? pairs : 1) * sizeof *h->slot);
        h->fork_pending = calloc((size_t)(pairs ? pairs : 1), 1);
        h->len = calloc(h->num_slots, sizeof *h->len);
        h->lens = calloc(h->num_slots, sizeof *h->lens);
        h->dead = malloc((size_t)h->num_slots * sizeof *h->dead);
        if (!h->slot || !h->fork_pending || !h->len || !h->lens || !h->dead)
            st = PKV_ERR_OUT_OF_MEMORY;
    }
    for (uint64_t i = 0; st == PKV_OK && i < pairs; i++) h->slot[i] = -1;
    if (st == PKV_OK) {
        pkv_hybrid_vmm_params hp;
        pkv_hybrid_vmm_params_default(&hp);
        hp.groups = h->groups;
        hp.num_groups = h->num_groups;
        hp.elem_bytes = sizeof(float);
        hp.budget_bytes = p->budget_bytes;
        hp.max_seqs = h->num_slots;
        hp.max_seq_len = p->max_seq_len;
        hp.page_bytes = p->page_bytes;
        st = pkv_hybrid_vmm_create(&hp, &h->kv);
    }
    if (st == PKV_OK) st = make_store(h, &c, p->max_seq_len);
    if (st != PKV_OK) {
        pkvi_run_hvmm_destroy(h);
        return st;
    }
    *out = h;
    return PKV_OK;
}

void pkvi_run_hvmm_destroy(pkvi_run_hvmm *h) {
    if (!h) return;
    pkvi_slot_kv_destroy(h->store);
    pkv_hybrid_vmm_destroy(h->kv);
    free(h->len);
    free(h->lens);
    free(h->dead);
    free(h->base);
    free(h->slot);
    free(h->fork_pending);
    free(h);
}

pkv_status pkvi_run_hvmm_create_for(pkv_model *model, pkvi_policy *pol, pkvi_run_hvmm **out) {
    const pkv_policy_config *cfg = &pol->cfg;
    const pkv_replay_params *rp = cfg->params;
    if (!rp || cfg->elem_bytes == 0 || sizeof(float) % cfg->elem_bytes != 0) return PKV_ERR_INVALID_ARG;
    const uint64_t widen = sizeof(float) / cfg->elem_bytes;
    if (cfg->capacity_bytes > UINT64_MAX / widen || rp->vmm_page_bytes > UINT64_MAX / widen)
        return PKV_ERR_INVALID_ARG;
    const pkvi_run_hvmm_params p = {model, cfg->capacity_bytes * widen, rp->vmm_page_bytes * widen,
                                    cfg->max_seq_len, cfg->num_requests, cfg->max_seqs};
    const pkv_status st = pkvi_run_hvmm_create(&p, out);
    if (st == PKV_ERR_OUT_OF_BLOCKS)
        snprintf(pol->why, sizeof pol->why, "hybrid-vmm run: pkv_hybrid_vmm's budget of %llu "
                 "bytes holds no sequence the policy admits (policy and library disagree)",
                 (unsigned long long)p.budget_bytes);
    return st;
}

pkv_hybrid_vmm *pkvi_run_hvmm_manager(const pkvi_run_hvmm *h) { return h ? h->kv : NULL; }

pkv_seq_id pkvi_run_hvmm_slot(const pkvi_run_hvmm *h, uint32_t r, uint32_t child) {
    return h->slot[h->base[r] + child];
}

pkv_status pkvi_run_hvmm_fork(pkvi_run_hvmm *h, uint32_t r, uint32_t n) {
    if (h->slot[h->base[r]] < 0) return PKV_ERR_CORRUPT; // the parent has no rows
    for (uint32_t c = 1; c < n; c++) {
        if (h->slot[h->base[r] + c] >= 0) return PKV_ERR_CORRUPT;
        h->fork_pending[h->base[r] + c] = FORK_PENDING;
    }
    return PKV_OK;
}

void pkvi_run_hvmm_resume(pkvi_run_hvmm *h, uint32_t r, uint32_t n) {
    for (uint32_t c = 0; c < n && c < h->max_seqs[r]; c++)
        if (h->slot[h->base[r] + c] < 0) h->fork_pending[h->base[r] + c] = RESUMES;
}

void pkvi_run_hvmm_release(pkvi_run_hvmm *h, uint32_t r) {
    for (uint32_t c = 0; c < h->max_seqs[r]; c++) {
        pkv_seq_id *s = &h->slot[h->base[r] + c];
        if (*s >= 0) h->dead[h->ndead++] = (uint32_t)*s; // room for every slot
        *s = -1;
        h->fork_pending[h->base[r] + c] = 0;
    }
}

// Copy the tokens the parent keeps at length n (every group; a state group its
// state) into the child's rows, mapped for n tokens first.
static pkv_status copy_rows(pkvi_run_hvmm *h, uint32_t parent, uint32_t child, uint32_t n,
                            uint64_t *copied) {
    pkv_status st = pkv_hybrid_vmm_set_length(h->kv, child, n);
    for (uint32_t g = 0; st == PKV_OK && g < h->num_groups; g++) {
        const pkv_vmm_space *sp = pkv_hybrid_vmm_space(h->kv, g);
        const uint64_t tb = pkv_hybrid_vmm_buffer_token_bytes(h->kv, g);
        uint64_t from = 0, to = tb; // a state: its row
        if (h->groups[g].kind != PKV_LAYER_STATE) {
            from = (n - pkv_kv_group_tokens_kept(&h->groups[g], n)) * tb;
            to = (uint64_t)n * tb;
        }
        pkv_vmm_info info;
        if ((st = pkv_vmm_get_info(sp, &info)) != PKV_OK) break;
        for (uint32_t b = 0; b < info.num_buffers && to > from; b++) {
            void *base;
            if ((st = pkv_vmm_buffer_ptr(sp, b, &base)) != PKV_OK) break;
            char *row = base;
            const double t0 = pkvi_now_seconds();
            memcpy(row + (uint64_t)child * info.buffer_bytes + from,
                   row + (uint64_t)parent * info.buffer_bytes + from, (size_t)(to - from));
            h->copy_s += pkvi_now_seconds() - t0;
            *copied += to - from;
        }
    }
    return st;
}

// The library refused what the policy admitted: say so, naming the sequence.
static void refused(char *why, size_t cap, const pkvi_step_seq *s, pkv_status st) {
    snprintf(why, cap, "hybrid-vmm run: pkv_hybrid_vmm refused request %u sequence %u at %u "
             "tokens (%s) that the policy admitted (policy and library disagree)", s->r,
             s->child, s->ctx, pkv_status_str(st));
}

pkv_status pkvi_run_hvmm_sync(pkvi_run_hvmm *h, const pkvi_step_seq *seqs, uint32_t n,
                              uint64_t *copied, char *why, size_t cap) {
    const double t0 = pkvi_now_seconds();
    h->copy_s = 0;
    pkv_status st = PKV_OK;
    for (; h->ndead > 0 && st == PKV_OK; h->ndead--) {
        h->len[h->dead[h->ndead - 1]] = 0;
        st = pkv_hybrid_vmm_release(h->kv, h->dead[h->ndead - 1]);
    }
    // The forks first, from the parents' rows as they were before this step.
    for (uint32_t i = 0; i < n && st == PKV_OK; i++) {
        const pkvi_step_seq *s = &seqs[i];
        pkv_seq_id *m = &h->slot[h->base[s->r] + s->child];
        uint8_t *f = &h->fork_pending[h->base[s->r] + s->child];
        const pkv_seq_id parent = h->slot[h->base[s->r]];
        if (*f != FORK_PENDING) continue;
        uint32_t slot;
        if (parent < 0 || *m >= 0) st = PKV_ERR_CORRUPT;
        if (st == PKV_OK && (st = pkv_hybrid_vmm_acquire(h->kv, &slot)) == PKV_OK) {
            *m = (pkv_seq_id)slot;
            st = copy_rows(h, (uint32_t)parent, slot, h->len[parent], copied);
            h->len[slot] = h->len[parent];
        }
        *f = 0;
        if (st == PKV_ERR_OUT_OF_BLOCKS) refused(why, cap, s, st);
    }
    for (uint32_t i = 0; i < n && st == PKV_OK; i++) {
        const pkvi_step_seq *s = &seqs[i];
        pkv_seq_id *m = &h->slot[h->base[s->r] + s->child];
        const uint32_t first = s->ctx - s->new_tokens;
        uint8_t *f = &h->fork_pending[h->base[s->r] + s->child];
        if (*m < 0 && first > 0 && *f != RESUMES) {
            snprintf(why, cap, "hybrid-vmm run: request %u sequence %u resumes at position %u "
                     "without its rows (neither swapped in nor recomputed)", s->r, s->child, first);
            return PKV_ERR_CORRUPT;
        }
        uint32_t slot;
        if (*m < 0 && (st = pkv_hybrid_vmm_acquire(h->kv, &slot)) == PKV_OK) {
            *m = (pkv_seq_id)slot;
            h->len[slot] = first; // a swap-in: run_swap.c writes its rows back after the sync
            *f = 0;
        }
        if (st == PKV_OK && h->len[*m] != first) st = PKV_ERR_CORRUPT; // rows out of step
        if (st == PKV_OK) st = pkv_hybrid_vmm_set_step(h->kv, (uint32_t)*m, first, s->ctx);
        if (st == PKV_OK) h->len[*m] = s->ctx;
        if (st == PKV_ERR_OUT_OF_BLOCKS) refused(why, cap, s, st);
    }
    h->step_s += pkvi_now_seconds() - t0 - h->copy_s;
    return st;
}

pkv_status pkvi_run_hvmm_forward(pkvi_run_hvmm *h, uint32_t S, const pkv_seq_id *slots,
                                 const uint32_t *counts, const int32_t *tokens,
                                 int32_t *next_tokens) {
    if (S > h->num_slots) return PKV_ERR_CORRUPT;
    for (uint32_t i = 0; i < S; i++) {
        if (slots[i] < 0 || (uint32_t)slots[i] >= h->num_slots) return PKV_ERR_CORRUPT;
        h->lens[i] = h->len[slots[i]];
    }
    // pkv_seq_id and uint32_t slots: the same values, not the same type.
    uint32_t *u = malloc((size_t)S * 2 * sizeof *u);
    if (!u) return PKV_ERR_OUT_OF_MEMORY;
    for (uint32_t i = 0; i < S; i++) {
        u[i] = (uint32_t)slots[i];
        u[S + i] = counts ? counts[i] : 1;
    }
    pkv_status st = pkvi_model_forward_slots(h->model, h->store, S, u, h->lens, u + S, tokens,
                                             next_tokens);
    free(u);
    return st;
}

void pkvi_run_hvmm_finish(pkvi_run_hvmm *h, pkv_vmm_stats *calls, double *step_seconds) {
    for (; h->ndead > 0; h->ndead--) (void)pkv_hybrid_vmm_release(h->kv, h->dead[h->ndead - 1]);
    memset(calls, 0, sizeof *calls);
    for (uint32_t g = 0; g < h->num_groups; g++) {
        pkv_vmm_stats s;
        if (pkv_vmm_get_stats(pkv_hybrid_vmm_space(h->kv, g), &s) != PKV_OK) continue;
        calls->map_calls += s.map_calls;
        calls->unmap_calls += s.unmap_calls;
        calls->map_seconds += s.map_seconds;
        calls->unmap_seconds += s.unmap_seconds;
    }
    *step_seconds = h->step_s;
}

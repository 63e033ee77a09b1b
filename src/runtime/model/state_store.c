// SPDX-License-Identifier: MIT
// State layers (PKV_LAYER_STATE, issue 23) and the caller-owned store of their states.
// A state layer keeps no K/V per token: each sequence carries, per state layer and KV
// head, one head_dim x head_dim fp32 matrix S updated token by token (S = a S + k v^T,
// o = q^T S / sqrt(hd); the math is documented in pkv/model.h). The store maps the
// caller's sequence ids to entries with a linear scan: it is meant for a batch's worth
// of sequences (tens to hundreds), and a scan over max_seqs ids costs far less than the
// layer's O(hd^2) update per token. Each entry records how many tokens its state has
// absorbed, so that a step that does not continue the state (a stale id, a replayed
// step) is refused before any layer runs instead of silently computing wrong numbers.
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <math.h>

#include "model_internal.h"

#define NO_ID (-1)

struct pkv_model_state_store {
    const pkv_model *model;
    uint32_t max_seqs;
    uint64_t floats_each; // one entry: state layers x kv_heads x hd x hd
    int64_t *ids;         // [max_seqs] the caller's id of each entry, NO_ID = free
    uint32_t *tokens;     // [max_seqs] tokens the entry's state has absorbed
    uint32_t *call_entry; // [max_seqs] scratch: the entry of each sequence of a step
    float *state;         // [max_seqs][floats_each]
};

void pkvi_set_error(pkv_model *m, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(m->last_error, sizeof m->last_error, fmt, ap);
    va_end(ap);
}

const char *pkv_model_last_error(const pkv_model *m) { return m ? m->last_error : ""; }

int pkvi_layer_is_state(const pkv_model_config *c, uint32_t l) {
    return c->num_kv_groups && c->kv_groups[c->layer_group[l]].kind == PKV_LAYER_STATE;
}

uint32_t pkvi_state_layers(const pkv_model_config *c) {
    uint32_t n = 0;
    for (uint32_t l = 0; l < c->num_layers; l++) n += (uint32_t)pkvi_layer_is_state(c, l);
    return n;
}

// Index of state layer l among the model's state layers (its slice of an entry).
static uint32_t state_index(const pkv_model_config *c, uint32_t layer) {
    uint32_t n = 0;
    for (uint32_t l = 0; l < layer; l++) n += (uint32_t)pkvi_layer_is_state(c, l);
    return n;
}

static uint64_t head_floats(const pkv_model_config *c) {
    return (uint64_t)c->head_dim * c->head_dim;
}

pkv_status pkv_model_state_store_create(const pkv_model *model, uint32_t max_seqs,
                                        pkv_model_state_store **out) {
    if (!out) return PKV_ERR_INVALID_ARG;
    *out = NULL;
    if (!model || max_seqs == 0) return PKV_ERR_INVALID_ARG;
    const pkv_model_config *c = &model->cfg;
    const uint64_t each = (uint64_t)pkvi_state_layers(c) * c->num_kv_heads * head_floats(c);
    if (each && (uint64_t)max_seqs > SIZE_MAX / sizeof(float) / each) return PKV_ERR_OUT_OF_MEMORY;
    pkv_model_state_store *s = calloc(1, sizeof *s);
    if (!s) return PKV_ERR_OUT_OF_MEMORY;
    s->model = model;
    s->max_seqs = max_seqs;
    s->floats_each = each;
    s->ids = malloc((size_t)max_seqs * sizeof *s->ids);
    s->tokens = calloc(max_seqs, sizeof *s->tokens);
    s->call_entry = calloc(max_seqs, sizeof *s->call_entry);
    s->state = calloc(each ? (size_t)max_seqs * each : 1, sizeof(float));
    if (!s->ids || !s->tokens || !s->call_entry || !s->state) {
        pkv_model_state_store_destroy(s);
        return PKV_ERR_OUT_OF_MEMORY;
    }
    for (uint32_t i = 0; i < max_seqs; i++) s->ids[i] = NO_ID;
    *out = s;
    return PKV_OK;
}

void pkv_model_state_store_destroy(pkv_model_state_store *s) {
    if (!s) return;
    free(s->ids);
    free(s->tokens);
    free(s->call_entry);
    free(s->state);
    free(s);
}

// Entry of id, or UINT32_MAX.
static uint32_t find(const pkv_model_state_store *s, int64_t id) {
    for (uint32_t i = 0; i < s->max_seqs; i++)
        if (s->ids[i] == id) return i;
    return UINT32_MAX;
}

static float *entry_state(const pkv_model_state_store *s, uint32_t e) {
    return s->state + (size_t)e * s->floats_each;
}

// Claim a free entry for id with a zero state, or UINT32_MAX when the store is full.
static uint32_t claim(pkv_model_state_store *s, int64_t id) {
    const uint32_t e = find(s, NO_ID);
    if (e == UINT32_MAX) return e;
    s->ids[e] = id;
    s->tokens[e] = 0;
    memset(entry_state(s, e), 0, (size_t)s->floats_each * sizeof(float));
    return e;
}

uint64_t pkvi_state_store_entry_bytes(const pkv_model_state_store *s) {
    return s ? s->floats_each * sizeof(float) : 0;
}

pkv_status pkvi_state_store_entry(pkv_model_state_store *s, int64_t id, int create, float **state,
                                  uint32_t **tokens) {
    if (!s || id < 0) return PKV_ERR_INVALID_ARG;
    uint32_t e = find(s, id);
    if (e == UINT32_MAX && create) e = claim(s, id);
    if (e == UINT32_MAX) return create ? PKV_ERR_LIMIT : PKV_ERR_NOT_FOUND;
    *state = entry_state(s, e);
    *tokens = &s->tokens[e];
    return PKV_OK;
}

pkv_status pkv_model_state_store_fork(pkv_model_state_store *s, int64_t parent, int64_t child) {
    if (!s || parent < 0 || child < 0 || parent == child) return PKV_ERR_INVALID_ARG;
    const uint32_t p = find(s, parent);
    if (p == UINT32_MAX) return PKV_ERR_NOT_FOUND;
    if (find(s, child) != UINT32_MAX) return PKV_ERR_BUSY;
    const uint32_t e = claim(s, child);
    if (e == UINT32_MAX) return PKV_ERR_LIMIT;
    memcpy(entry_state(s, e), entry_state(s, p), (size_t)s->floats_each * sizeof(float));
    s->tokens[e] = s->tokens[p];
    return PKV_OK;
}

pkv_status pkv_model_state_store_release(pkv_model_state_store *s, int64_t id) {
    if (!s || id < 0) return PKV_ERR_INVALID_ARG;
    const uint32_t e = find(s, id);
    if (e == UINT32_MAX) return PKV_ERR_NOT_FOUND;
    s->ids[e] = NO_ID;
    s->tokens[e] = 0;
    return PKV_OK;
}

uint32_t pkv_model_state_store_tokens(const pkv_model_state_store *s, int64_t id) {
    if (!s || id < 0) return 0;
    const uint32_t e = find(s, id);
    return e == UINT32_MAX ? 0 : s->tokens[e];
}

pkv_status pkv_model_set_state_store(pkv_model *m, pkv_model_state_store *store) {
    if (!m) return PKV_ERR_INVALID_ARG;
    if (store && store->model != m) {
        pkvi_set_error(m, "pkv_model_set_state_store: the store was created for another model");
        return PKV_ERR_INVALID_ARG;
    }
    m->states = store;
    return PKV_OK;
}

pkv_status pkvi_states_bind(pkv_model *m, uint32_t S, const pkv_seq_id *seqs,
                            const uint32_t *rows, const uint32_t *counts, pkvi_call *call) {
    call->states = NULL;
    call->state_entry = NULL;
    if (pkvi_state_layers(&m->cfg) == 0) return PKV_OK;
    pkv_model_state_store *s = m->states;
    if (!s) {
        pkvi_set_error(m, "model '%s' has a state layer: give it a state store first "
                          "(pkv_model_set_state_store)", m->cfg.name);
        return PKV_ERR_INVALID_ARG;
    }
    if (S > s->max_seqs) {
        pkvi_set_error(m, "a step of %u sequences, the state store holds %u", S, s->max_seqs);
        return PKV_ERR_LIMIT;
    }
    // Check every sequence first and claim entries only then, so that a refused step
    // leaves the store as it was.
    uint32_t fresh = 0, free_entries = 0;
    for (uint32_t e = 0; e < s->max_seqs; e++) free_entries += s->ids[e] == NO_ID;
    for (uint32_t i = 0; i < S; i++) {
        const int64_t id = seqs ? (int64_t)seqs[i] : (int64_t)rows[i];
        const uint32_t start = (uint32_t)m->meta.lens[i] - counts[i];
        const uint32_t e = find(s, id);
        s->call_entry[i] = e;
        if (e == UINT32_MAX && start == 0 && ++fresh <= free_entries) continue;
        if (e == UINT32_MAX) {
            pkvi_set_error(m, start == 0 ? "state store full: no entry for sequence %lld"
                                         : "sequence %lld continues at position %u but holds "
                                           "no state (fork it into the store)",
                           (long long)id, start);
            return start == 0 ? PKV_ERR_LIMIT : PKV_ERR_INVALID_ARG;
        }
        if (s->tokens[e] != start) {
            pkvi_set_error(m, "sequence %lld: its state holds %u tokens but the step starts at "
                              "position %u (release a stale id, do not replay a step)",
                           (long long)id, s->tokens[e], start);
            return PKV_ERR_INVALID_ARG;
        }
    }
    for (uint32_t i = 0; i < S; i++)
        if (s->call_entry[i] == UINT32_MAX)
            s->call_entry[i] = claim(s, seqs ? (int64_t)seqs[i] : (int64_t)rows[i]);
    call->states = s;
    call->state_entry = s->call_entry;
    return PKV_OK;
}

void pkvi_states_commit(pkv_model *m, const pkvi_call *call) {
    if (!call->states) return;
    for (uint32_t i = 0; i < call->num_seqs; i++)
        call->states->tokens[call->state_entry[i]] = (uint32_t)m->meta.lens[i];
}

pkv_status pkvi_states_nocache_begin(pkv_model *m, uint32_t S, pkv_model_state_store **saved) {
    *saved = m->states;
    if (pkvi_state_layers(&m->cfg) == 0) return PKV_OK;
    if (!m->nocache_states || m->nocache_states->max_seqs < S) {
        pkv_model_state_store_destroy(m->nocache_states);
        m->nocache_states = NULL;
        pkv_status st = pkv_model_state_store_create(m, S, &m->nocache_states);
        if (st != PKV_OK) return st;
    }
    m->states = m->nocache_states;
    return PKV_OK;
}

void pkvi_states_nocache_end(pkv_model *m, uint32_t S, pkv_model_state_store *saved) {
    if (m->nocache_states)
        for (uint32_t i = 0; i < S; i++) pkv_model_state_store_release(m->nocache_states, i);
    m->states = saved;
}

// Decay of KV head h: 1 - 2^-(2 + h) (pkv/model.h).
static float decay_of(uint32_t h) { return 1.0f - ldexpf(1.0f, -(int)(2 + h)); }

pkv_status pkvi_state_layer_cpu(pkv_model *m, uint32_t layer, const pkvi_call *call) {
    const pkv_model_config *c = &m->cfg;
    const pkvi_scratch *s = &m->s;
    const pkv_model_state_store *st = call->states;
    if (!st && !call->state_at) return PKV_ERR_INVALID_ARG; // pkvi_states_bind refuses this first
    const uint32_t H = c->num_heads, kvh = c->num_kv_heads, hd = c->head_dim, rep = H / kvh;
    const uint64_t hf = head_floats(c);
    const uint64_t base = (uint64_t)state_index(c, layer) * kvh * hf;
    const float scale = 1.0f / sqrtf((float)hd);
    // Tokens are packed sequence by sequence in position order, so one pass in t runs
    // each sequence's recurrence in order.
    for (uint32_t t = 0; t < call->num_tokens; t++) {
        float *S0 = call->state_at ? call->state_at(call->state_ctx, layer, (uint32_t)s->tseq[t])
                                   : entry_state(st, call->state_entry[s->tseq[t]]) + base;
        for (uint32_t kh = 0; kh < kvh; kh++) {
            float *Sh = S0 + kh * hf;
            const float a = decay_of(kh);
            const float *k = s->k + ((size_t)t * kvh + kh) * hd;
            const float *v = s->v + ((size_t)t * kvh + kh) * hd;
            for (uint32_t i = 0; i < hd; i++)
                for (uint32_t j = 0; j < hd; j++) Sh[i * hd + j] = a * Sh[i * hd + j] + k[i] * v[j];
        }
        for (uint32_t h = 0; h < H; h++) {
            const float *Sh = S0 + (h / rep) * hf;
            const float *q = s->q + ((size_t)t * H + h) * hd;
            float *out = s->att + ((size_t)t * H + h) * hd;
            memset(out, 0, hd * sizeof(float));
            for (uint32_t i = 0; i < hd; i++)
                for (uint32_t j = 0; j < hd; j++) out[j] += q[i] * Sh[i * hd + j];
            for (uint32_t j = 0; j < hd; j++) out[j] *= scale;
        }
    }
    return PKV_OK;
}

// SPDX-License-Identifier: MIT
// The CPU decoder over per-layer slot rows (slot_store.h): each layer names its
// own rows (a VMM space's buffer per layer and K/V, a slot stride per group), so
// one store covers groups of different row sizes. A step fills the decoder's
// metadata from the caller's lengths and runs the layers with a PKVI_KV_SLOTS
// target; hetero_cpu.c asks pkvi_slot_layer_target for each layer's rows, which
// it then reads as a contiguous store's (token-major rows at row_off), and the
// state layers read their state in place through pkvi_call.state_at.
#include <stdlib.h>
#include <string.h>

#include "model_internal.h"
#include "slot_store.h"
#include "src/allocator/clock.h"

struct pkvi_slot_kv {
    pkv_model *model;
    uint32_t num_slots;
    pkvi_slot_layer layer[PKV_MAX_LAYERS];
    uint64_t state_floats; // one state layer's state (kv_heads x head_dim^2)
    const uint32_t *call_slots; // the step's slots (borrowed during the step)
    uint32_t call_seqs;
};

#define TRY(expr)                                                                        \
    do {                                                                                 \
        pkv_status st_ = (expr);                                                         \
        if (st_ != PKV_OK) return st_;                                                   \
    } while (0)

// Floats of one token in layer l's K row (0: a state layer).
static uint64_t token_floats(const pkv_model_config *c, uint32_t l) {
    if (pkvi_layer_is_state(c, l)) return 0;
    if (pkvi_layer_is_mla(c, l)) {
        uint32_t r = 0, dr = 0;
        pkvi_mla_layer_floats(c, &r, &dr);
        return (uint64_t)r + dr;
    }
    return (uint64_t)c->num_kv_heads * c->head_dim;
}

pkv_status pkvi_slot_kv_create(pkv_model *model, uint32_t num_slots, uint32_t max_len,
                               const pkvi_slot_layer *layers, pkvi_slot_kv **out) {
    if (!out) return PKV_ERR_INVALID_ARG;
    *out = NULL;
    if (!model || !layers || num_slots == 0 || max_len == 0) return PKV_ERR_INVALID_ARG;
    if (model->params.device != PKV_DEVICE_CPU) return PKV_ERR_UNSUPPORTED;
    const pkv_model_config *c = &model->cfg;
    if (!pkvi_hetero_supported(c)) return PKV_ERR_INVALID_ARG;
    const uint64_t state = (uint64_t)c->num_kv_heads * c->head_dim * c->head_dim;
    for (uint32_t l = 0; l < c->num_layers; l++) {
        const pkvi_slot_layer *y = &layers[l];
        const uint64_t tf = token_floats(c, l);
        const int needs_v = tf && !pkvi_layer_is_mla(c, l);
        const uint64_t row = tf ? tf * max_len : state;
        if (!y->k || (needs_v && !y->v) || y->slot_floats < row) return PKV_ERR_INVALID_ARG;
    }
    pkvi_slot_kv *s = calloc(1, sizeof *s);
    if (!s) return PKV_ERR_OUT_OF_MEMORY;
    s->model = model;
    s->num_slots = num_slots;
    s->state_floats = state;
    memcpy(s->layer, layers, c->num_layers * sizeof *layers);
    *out = s;
    return PKV_OK;
}

void pkvi_slot_kv_destroy(pkvi_slot_kv *kv) { free(kv); }

// pkvi_call.state_at: the state of state layer `layer` of the step's sequence i.
static float *state_at(const void *ctx, uint32_t layer, uint32_t i) {
    const pkvi_slot_kv *s = ctx;
    const pkvi_slot_layer *y = &s->layer[layer];
    return y->k + (uint64_t)s->call_slots[i] * y->slot_floats;
}

void pkvi_slot_layer_target(pkv_model *m, const pkvi_kv_target *kv, uint32_t layer,
                            pkvi_kv_target *out, float **kc, float **vc) {
    const pkvi_slot_kv *s = kv->slots;
    const pkvi_slot_layer *y = &s->layer[layer];
    const pkv_model_config *c = &m->cfg;
    // The rows of this layer: the sequences' row offsets in its slot stride.
    for (uint32_t i = 0; i < s->call_seqs; i++)
        m->s.row_off[i] = (int64_t)((uint64_t)s->call_slots[i] * y->slot_floats);
    *out = *kv;
    out->kind = PKVI_KV_CONTIG;
    out->ck = y->k;
    out->cv = y->v;
    out->c_layer_stride = 0;
    out->c_head_stride = c->head_dim; // MLA: latent_io walks the latent in rows of head_dim
    out->c_token_stride = token_floats(c, layer);
    *kc = y->k;
    *vc = y->v;
}

pkv_status pkvi_model_forward_slots(pkv_model *m, pkvi_slot_kv *kv, uint32_t S,
                                    const uint32_t *slots, const uint32_t *lens,
                                    const uint32_t *counts, const int32_t *tokens,
                                    int32_t *next_tokens) {
    if (!m || !kv || kv->model != m || S == 0 || !slots || !lens || !counts || !tokens)
        return PKV_ERR_INVALID_ARG;
    const double t0 = pkvi_now_seconds();
    const pkv_model_config *c = &m->cfg;
    uint64_t T = 0;
    uint32_t max_len = 1;
    for (uint32_t i = 0; i < S; i++) {
        if (slots[i] >= kv->num_slots || counts[i] == 0 || counts[i] > lens[i])
            return PKV_ERR_INVALID_ARG;
        if (c->pos == PKV_POS_LEARNED && lens[i] > c->max_seq_len) return PKV_ERR_INVALID_ARG;
        max_len = lens[i] > max_len ? lens[i] : max_len;
        T += counts[i];
    }
    if (T > INT32_MAX) return PKV_ERR_INVALID_ARG;
    TRY(pkvi_scratch_reserve(m, (uint32_t)T, S, 1));
    for (uint32_t i = 0; i < S; i++) m->meta.lens[i] = (int32_t)lens[i];
    uint32_t nt = 0;
    TRY(pkvi_fill_tokens(m, S, counts, tokens, &nt));
    // A sequence that starts now starts from a zero state (the slot's state row
    // keeps whatever its last holder or a reused page left there).
    for (uint32_t l = 0; l < c->num_layers; l++) {
        if (!pkvi_layer_is_state(c, l)) continue;
        const pkvi_slot_layer *y = &kv->layer[l];
        for (uint32_t i = 0; i < S; i++)
            if (lens[i] == counts[i])
                memset(y->k + (uint64_t)slots[i] * y->slot_floats, 0,
                       (size_t)kv->state_floats * sizeof(float));
    }
    pkvi_kv_target t;
    memset(&t, 0, sizeof t);
    t.kind = PKVI_KV_SLOTS;
    t.dtype = PKV_DTYPE_F32;
    t.max_len = max_len;
    t.slots = kv;
    kv->call_slots = slots;
    kv->call_seqs = S;
    pkvi_call call = {S, nt, nt == S, NULL, NULL, state_at, kv};
    pkv_status st = pkvi_run_step(m, &call, &t, t0, NULL, next_tokens);
    kv->call_slots = NULL;
    kv->call_seqs = 0;
    return st;
}

// SPDX-License-Identifier: MIT
// The weight block of a decoder: one allocation of pkvi_weights_count floats,
// carved into named tensors in a fixed order, and its deterministic random
// initialization. Invariant: the carved tensors tile the block exactly, so the
// block's size equals pkv_model_param_count(config).
#include <math.h>
#include <string.h>

#include "model_internal.h"

// Element counts of every tensor, in block order. Absent tensors count 0.
typedef struct layout {
    uint64_t wte, wpe, ln1_w, ln1_b, wqkv, bqkv, wo, bo, ln2_w, ln2_b, w_up, b_up, w_gate,
        w_down, b_down, lnf_w, lnf_b, lm_head, sinks, w_mla;
} layout;

// 1 when some layer's group has attention sinks (gpt-oss): then every layer has a
// row of per-head sink logits, read only by those layers.
static int has_sinks(const pkv_model_config *c) {
    for (uint32_t i = 0; i < c->num_kv_groups; i++)
        if (c->kv_groups[i].sinks) return 1;
    return 0;
}

static layout layout_of(const pkv_model_config *c) {
    const uint64_t L = c->num_layers, d = c->d_model, ff = c->d_ff, V = c->vocab_size;
    const uint64_t qd = (uint64_t)c->num_heads * c->head_dim;
    const uint64_t kvd = (uint64_t)c->num_kv_heads * c->head_dim;
    const int ln = c->norm == PKV_NORM_LAYERNORM, bias = c->use_bias != 0;
    const int gelu = c->ffn == PKV_FFN_GELU;
    layout l;
    l.wte = V * d;
    l.wpe = c->pos == PKV_POS_LEARNED ? (uint64_t)c->max_seq_len * d : 0;
    l.ln1_w = L * d;
    l.ln1_b = ln ? L * d : 0;
    l.wqkv = L * (qd + 2 * kvd) * d;
    l.bqkv = bias ? L * (qd + 2 * kvd) : 0;
    l.wo = L * d * qd;
    l.bo = bias ? L * d : 0;
    l.ln2_w = L * d;
    l.ln2_b = ln ? L * d : 0;
    l.w_up = L * ff * d;
    l.b_up = gelu && bias ? L * ff : 0;
    l.w_gate = gelu ? 0 : L * ff * d;
    l.w_down = L * d * ff;
    l.b_down = gelu && bias ? L * d : 0;
    l.lnf_w = d;
    l.lnf_b = ln ? d : 0;
    l.lm_head = c->tied_embeddings ? 0 : V * d;
    l.sinks = has_sinks(c) ? L * c->num_heads : 0;
    l.w_mla = L * pkvi_mla_layer_floats(c, NULL, NULL);
    return l;
}

static uint64_t layout_total(const layout *l) {
    return l->wte + l->wpe + l->ln1_w + l->ln1_b + l->wqkv + l->bqkv + l->wo + l->bo +
           l->ln2_w + l->ln2_b + l->w_up + l->b_up + l->w_gate + l->w_down + l->b_down +
           l->lnf_w + l->lnf_b + l->lm_head + l->sinks + l->w_mla;
}

uint64_t pkvi_weights_count(const pkv_model_config *c) {
    layout l = layout_of(c);
    return layout_total(&l);
}

void pkvi_weights_carve(const pkv_model_config *c, float *base, pkvi_weights *w) {
    layout l = layout_of(c);
    float *p = base;
#define CARVE(name)                      \
    do {                                 \
        w->name = l.name ? p : NULL;     \
        p += l.name;                     \
    } while (0)
    CARVE(wte);
    CARVE(wpe);
    CARVE(ln1_w);
    CARVE(ln1_b);
    CARVE(wqkv);
    CARVE(bqkv);
    CARVE(wo);
    CARVE(bo);
    CARVE(ln2_w);
    CARVE(ln2_b);
    CARVE(w_up);
    CARVE(b_up);
    CARVE(w_gate);
    CARVE(w_down);
    CARVE(b_down);
    CARVE(lnf_w);
    CARVE(lnf_b);
    CARVE(lm_head);
    CARVE(sinks);
    CARVE(w_mla);
#undef CARVE
    if (!w->lm_head) w->lm_head = w->wte;
}

// splitmix64: a tiny, well-mixed generator; the stream depends only on the seed.
static uint64_t splitmix64(uint64_t *state) {
    uint64_t z = (*state += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

static void fill_uniform(float *p, uint64_t n, float half_width, uint64_t *state) {
    for (uint64_t i = 0; i < n; i++) {
        // 24 random bits -> [-1, 1)
        float u = (float)(splitmix64(state) >> 40) * (1.0f / 8388608.0f) - 1.0f;
        p[i] = u * half_width;
    }
}

static void fill_const(float *p, uint64_t n, float v) {
    for (uint64_t i = 0; i < n; i++) p[i] = v;
}

void pkvi_weights_init_random(const pkv_model_config *c, uint64_t seed, float *base) {
    layout l = layout_of(c);
    pkvi_weights w;
    pkvi_weights_carve(c, base, &w);
    uint64_t state = seed ^ 0x5DEECE66Dull;
    // Uniform with std 0.02 (GPT-2's init): half width 0.02 * sqrt(3). Biases are
    // random too (smaller) so that a bias path that is skipped changes the output.
    const float hw = 0.02f * 1.7320508f, bw = 0.01f;
    fill_uniform(w.wte, l.wte, hw, &state);
    if (w.wpe) fill_uniform(w.wpe, l.wpe, hw, &state);
    fill_const(w.ln1_w, l.ln1_w, 1.0f);
    if (w.ln1_b) fill_const(w.ln1_b, l.ln1_b, 0.0f);
    fill_uniform(w.wqkv, l.wqkv, hw, &state);
    if (w.bqkv) fill_uniform(w.bqkv, l.bqkv, bw, &state);
    fill_uniform(w.wo, l.wo, hw, &state);
    if (w.bo) fill_uniform(w.bo, l.bo, bw, &state);
    fill_const(w.ln2_w, l.ln2_w, 1.0f);
    if (w.ln2_b) fill_const(w.ln2_b, l.ln2_b, 0.0f);
    fill_uniform(w.w_up, l.w_up, hw, &state);
    if (w.b_up) fill_uniform(w.b_up, l.b_up, bw, &state);
    if (w.w_gate) fill_uniform(w.w_gate, l.w_gate, hw, &state);
    fill_uniform(w.w_down, l.w_down, hw, &state);
    if (w.b_down) fill_uniform(w.b_down, l.b_down, bw, &state);
    fill_const(w.lnf_w, l.lnf_w, 1.0f);
    if (w.lnf_b) fill_const(w.lnf_b, l.lnf_b, 0.0f);
    if (l.lm_head) fill_uniform(w.lm_head, l.lm_head, hw, &state);
    // Sink logits of the order of the scores' spread, so that the sink shifts weight.
    if (w.sinks) fill_uniform(w.sinks, l.sinks, 2.0f, &state);
    if (w.w_mla) fill_uniform(w.w_mla, l.w_mla, hw, &state);
}

// SPDX-License-Identifier: MIT
// A naive reference decoder for the runtime tests: plain loops, one token at a
// time, every tensor addressed by its own pointer (Q, K, V separate), written
// independently of src/runtime. Also small configs shared by the model tests.
#ifndef PKV_TEST_MODEL_REF_H
#define PKV_TEST_MODEL_REF_H

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "pkv/model.h"

#define REF_MAX_LAYERS 8

typedef struct ref_layer {
    const float *ln1_w, *ln1_b, *ln2_w, *ln2_b; // [d]
    const float *wq, *wk, *wv;                  // [q_dim][d], [kv_dim][d], [kv_dim][d]
    const float *bq, *bk, *bv;                  // [q_dim], [kv_dim], [kv_dim] or NULL
    const float *wo, *bo;                       // [d][q_dim], [d]
    const float *w_up, *b_up, *w_gate;          // [ff][d], [ff], [ff][d]
    const float *w_down, *b_down;               // [d][ff], [d]
    const float *sinks;                         // [heads] attention-sink logits or NULL
    // MLA layers: [heads dr][d] rotated query part, [r + dr][d] latent and rotated key,
    // [heads hd][r] key and value up-projections (NULL for other layers)
    const float *w_qr, *w_dkv, *w_uk, *w_uv;
    int state; // a state layer (linear attention with decay, pkv/model.h)
} ref_layer;

typedef struct ref_model {
    pkv_model_config c;
    const float *wte, *wpe, *lnf_w, *lnf_b, *lm_head;
    ref_layer layer[REF_MAX_LAYERS];
} ref_model;

static inline void ref_norm(const pkv_model_config *c, const float *x, const float *w, const float *b,
                     float *y) {
    const uint32_t d = c->d_model;
    double mean = 0.0, var = 0.0;
    if (c->norm == PKV_NORM_LAYERNORM) {
        for (uint32_t i = 0; i < d; i++) mean += x[i];
        mean /= d;
    }
    for (uint32_t i = 0; i < d; i++) var += (x[i] - mean) * (x[i] - mean);
    var /= d;
    for (uint32_t i = 0; i < d; i++)
        y[i] = (float)((x[i] - mean) / sqrt(var + c->norm_eps)) * w[i] + (b ? b[i] : 0.0f);
}

// y[n] = W[n][k] x[k] + b
static inline void ref_matvec(uint32_t n, uint32_t k, const float *w, const float *b, const float *x,
                       float *y) {
    for (uint32_t j = 0; j < n; j++) {
        double acc = b ? b[j] : 0.0;
        for (uint32_t i = 0; i < k; i++) acc += (double)w[(size_t)j * k + i] * x[i];
        y[j] = (float)acc;
    }
}

static inline void ref_rope(float *v, uint32_t hd, uint32_t pos, double theta) {
    for (uint32_t i = 0; i < hd; i += 2) {
        double a = pos / pow(theta, (double)i / hd);
        double x0 = v[i], x1 = v[i + 1];
        v[i] = (float)(x0 * cos(a) - x1 * sin(a));
        v[i + 1] = (float)(x0 * sin(a) + x1 * cos(a));
    }
}

// First key position a query at t sees in layer l: the layer's group rule (sliding
// window W: t - W + 1; chunk C: the chunk's start), 0 for full attention.
static inline uint32_t ref_first_key(const pkv_model_config *c, uint32_t l, uint32_t t) {
    if (!c->num_kv_groups) return 0;
    const pkv_kv_group *g = &c->kv_groups[c->layer_group[l]];
    if (g->kind == PKV_LAYER_SLIDING) return t + 1 >= g->window ? t + 1 - g->window : 0;
    if (g->kind == PKV_LAYER_CHUNKED) return t - t % g->window;
    return 0;
}

// An MLA layer's attention for the query at t, K and V expanded from the latents (not
// absorbed as the runtime does): k_j = [W_uk c_j, k_r j], v_j = W_uv c_j, per head.
// Lat: [t + 1][r + dr] latents with their rotated keys; q [heads][hd]; qr [heads][dr].
static inline void ref_mla_attend(const pkv_model_config *c, const ref_layer *L, uint32_t r,
                                  uint32_t dr, const float *Lat, uint32_t t, const float *q,
                                  const float *qr, float *att) {
    const uint32_t H = c->num_heads, hd = c->head_dim, n = r + dr;
    double *sc = calloc(t + 1, sizeof(double)), *kn = calloc(hd, sizeof(double));
    for (uint32_t hh = 0; hh < H; hh++) {
        double mx = -INFINITY, sum = 0.0;
        for (uint32_t j = 0; j <= t; j++) {
            const float *cj = Lat + (size_t)j * n;
            double s = 0.0;
            for (uint32_t a = 0; a < hd; a++) {
                kn[a] = 0.0;
                for (uint32_t b = 0; b < r; b++) kn[a] += (double)L->w_uk[((size_t)hh * hd + a) * r + b] * cj[b];
                s += q[hh * hd + a] * kn[a];
            }
            for (uint32_t b = 0; b < dr; b++) s += (double)qr[hh * dr + b] * cj[r + b];
            sc[j] = s / sqrt((double)(hd + dr));
            if (sc[j] > mx) mx = sc[j];
        }
        for (uint32_t j = 0; j <= t; j++) sum += exp(sc[j] - mx);
        for (uint32_t a = 0; a < hd; a++) {
            double acc = 0.0;
            for (uint32_t j = 0; j <= t; j++) {
                double v = 0.0;
                for (uint32_t b = 0; b < r; b++)
                    v += (double)L->w_uv[((size_t)hh * hd + a) * r + b] * Lat[(size_t)j * n + b];
                acc += exp(sc[j] - mx) / sum * v;
            }
            att[hh * hd + a] = (float)acc;
        }
    }
    free(sc), free(kn);
}

// A state layer's output for the query at t in its parallel form (the runtime runs the
// recurrence S_t = a S_{t-1} + k_t v_t^T instead): per query head, o_t = sum over j <= t
// of a^(t - j) (q_t . k_j) v_j / sqrt(hd), a = 1 - 2^-(2 + kv head). Kl, Vl: [t + 1][kvd].
static inline void ref_state_attend(const pkv_model_config *c, const float *Kl, const float *Vl,
                                    uint32_t t, const float *q, float *att) {
    const uint32_t H = c->num_heads, KH = c->num_kv_heads, hd = c->head_dim, kvd = KH * hd;
    for (uint32_t hh = 0; hh < H; hh++) {
        const uint32_t kh = hh / (H / KH);
        const double a = 1.0 - pow(2.0, -(double)(2 + kh));
        for (uint32_t i = 0; i < hd; i++) {
            double acc = 0.0;
            for (uint32_t j = 0; j <= t; j++) {
                double s = 0.0;
                for (uint32_t e = 0; e < hd; e++)
                    s += (double)q[hh * hd + e] * Kl[(size_t)j * kvd + kh * hd + e];
                acc += pow(a, (double)(t - j)) * s * Vl[(size_t)j * kvd + kh * hd + i];
            }
            att[hh * hd + i] = (float)(acc / sqrt((double)hd));
        }
    }
}

// Logits after every position of tokens[0..n-1]: logits_all [n][vocab].
static inline void ref_forward(const ref_model *r, const int32_t *tokens, uint32_t n, float *logits_all) {
    const pkv_model_config *c = &r->c;
    const uint32_t d = c->d_model, H = c->num_heads, KH = c->num_kv_heads, hd = c->head_dim;
    const uint32_t qd = H * hd, kvd = KH * hd, ff = c->d_ff;
    float *x = calloc((size_t)n * d, sizeof(float)), *h = calloc(d, sizeof(float));
    float *K = calloc((size_t)c->num_layers * n * kvd, sizeof(float));
    float *Vv = calloc((size_t)c->num_layers * n * kvd, sizeof(float));
    float *q = calloc(qd, sizeof(float)), *att = calloc(qd, sizeof(float));
    float *o = calloc(d, sizeof(float)), *f1 = calloc(ff, sizeof(float));
    float *f2 = calloc(ff, sizeof(float)), *sc = calloc(n, sizeof(float));
    for (uint32_t t = 0; t < n; t++) {
        float *xt = x + (size_t)t * d;
        for (uint32_t i = 0; i < d; i++)
            xt[i] = r->wte[(size_t)tokens[t] * d + i] + (r->wpe ? r->wpe[(size_t)t * d + i] : 0.0f);
        for (uint32_t l = 0; l < c->num_layers; l++) {
            const ref_layer *L = &r->layer[l];
            float *Kl = K + (size_t)l * n * kvd, *Vl = Vv + (size_t)l * n * kvd;
            ref_norm(c, xt, L->ln1_w, L->ln1_b, h);
            ref_matvec(qd, d, L->wq, L->bq, h, q);
            if (L->w_dkv) { // MLA: the latent (with its rotated key) replaces K and V
                const pkv_kv_group *g = &c->kv_groups[c->layer_group[l]];
                const uint32_t r = g->latent_dim, dr = g->rope_dim;
                float *qr = calloc((size_t)H * dr, sizeof(float));
                ref_matvec(H * dr, d, L->w_qr, NULL, h, qr);
                ref_matvec(r + dr, d, L->w_dkv, NULL, h, Kl + (size_t)t * (r + dr));
                for (uint32_t hh = 0; hh < H; hh++) ref_rope(qr + hh * dr, dr, t, c->rope_theta);
                ref_rope(Kl + (size_t)t * (r + dr) + r, dr, t, c->rope_theta);
                ref_mla_attend(c, L, r, dr, Kl, t, q, qr, att);
                free(qr);
                goto attended;
            }
            ref_matvec(kvd, d, L->wk, L->bk, h, Kl + (size_t)t * kvd);
            ref_matvec(kvd, d, L->wv, L->bv, h, Vl + (size_t)t * kvd);
            if (L->state) { // no rotation: the decay orders the tokens
                ref_state_attend(c, Kl, Vl, t, q, att);
                goto attended;
            }
            if (c->pos == PKV_POS_ROPE) {
                for (uint32_t hh = 0; hh < H; hh++) ref_rope(q + hh * hd, hd, t, c->rope_theta);
                for (uint32_t hh = 0; hh < KH; hh++)
                    ref_rope(Kl + (size_t)t * kvd + hh * hd, hd, t, c->rope_theta);
            }
            for (uint32_t hh = 0; hh < H; hh++) {
                uint32_t kh = hh / (H / KH);
                const uint32_t j0 = ref_first_key(c, l, t);
                // A sink is one more logit in the softmax, with no value behind it.
                const double sink = L->sinks ? L->sinks[hh] : -INFINITY;
                double mx = sink, sum = 0.0;
                for (uint32_t j = j0; j <= t; j++) {
                    double s = 0.0;
                    for (uint32_t i = 0; i < hd; i++)
                        s += (double)q[hh * hd + i] * Kl[(size_t)j * kvd + kh * hd + i];
                    sc[j] = (float)(s / sqrt((double)hd));
                    if (sc[j] > mx) mx = sc[j];
                }
                if (L->sinks) sum += exp(sink - mx);
                for (uint32_t j = j0; j <= t; j++) sum += exp(sc[j] - mx);
                for (uint32_t i = 0; i < hd; i++) {
                    double acc = 0.0;
                    for (uint32_t j = j0; j <= t; j++)
                        acc += exp(sc[j] - mx) / sum * Vl[(size_t)j * kvd + kh * hd + i];
                    att[hh * hd + i] = (float)acc;
                }
            }
        attended:
            ref_matvec(d, qd, L->wo, L->bo, att, o);
            for (uint32_t i = 0; i < d; i++) xt[i] += o[i];
            ref_norm(c, xt, L->ln2_w, L->ln2_b, h);
            if (c->ffn == PKV_FFN_GELU) {
                ref_matvec(ff, d, L->w_up, L->b_up, h, f1);
                for (uint32_t i = 0; i < ff; i++) {
                    double v = f1[i];
                    f1[i] = (float)(0.5 * v * (1.0 + tanh(0.7978845608028654 * (v + 0.044715 * v * v * v))));
                }
            } else {
                ref_matvec(ff, d, L->w_gate, NULL, h, f1);
                ref_matvec(ff, d, L->w_up, NULL, h, f2);
                for (uint32_t i = 0; i < ff; i++) f1[i] = (float)(f1[i] / (1.0 + exp(-(double)f1[i])) * f2[i]);
            }
            ref_matvec(d, ff, L->w_down, L->b_down, f1, o);
            for (uint32_t i = 0; i < d; i++) xt[i] += o[i];
        }
        ref_norm(c, xt, r->lnf_w, r->lnf_b, h);
        ref_matvec(c->vocab_size, d, r->lm_head, NULL, h, logits_all + (size_t)t * c->vocab_size);
    }
    free(x), free(h), free(K), free(Vv), free(q), free(att), free(o), free(f1), free(f2), free(sc);
}

// A small Llama-style config with GQA (8 query heads over 2 kv heads), untied head.
static inline pkv_model_config small_llama_config(void) {
    pkv_model_config c;
    memset(&c, 0, sizeof c);
    strcpy(c.name, "small-llama");
    c.num_layers = 2;
    c.d_model = 128;
    c.num_heads = 8;
    c.num_kv_heads = 2;
    c.head_dim = 16;
    c.d_ff = 344;
    c.vocab_size = 300;
    c.max_seq_len = 512;
    c.norm = PKV_NORM_RMSNORM;
    c.ffn = PKV_FFN_SWIGLU;
    c.pos = PKV_POS_ROPE;
    c.tied_embeddings = 0;
    c.use_bias = 0;
    c.norm_eps = 1e-5f;
    c.rope_theta = 10000.0f;
    return c;
}

static inline float max_abs_diff(const float *a, const float *b, size_t n) {
    float m = 0.0f;
    for (size_t i = 0; i < n; i++) {
        float e = fabsf(a[i] - b[i]);
        if (!(e <= m)) m = e; // NaN propagates as a failure
    }
    return m;
}

#endif // PKV_TEST_MODEL_REF_H

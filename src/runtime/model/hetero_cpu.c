// SPDX-License-Identifier: MIT
// The CPU decoder's attention for layers that are not plain full attention (issue 23):
// sliding-window and chunked-local layers attend only to the positions their window
// lets a query see (the KV store still holds every token: the mask is by position),
// and layers with attention sinks add one learned logit per query head to the softmax
// (gpt-oss); MLA layers (DeepSeek-V2/V3) keep one latent c (latent_dim) plus a rotated
// key k_r (rope_dim) per token and attend with the up-projections absorbed: score =
// (W_uk^T q_n) . c + q_r . k_r, output W_uv (sum of weights x c). The model's pkv_cache
// is uniform (kv_heads x head_dim per token), so an MLA layer's latent fills the first
// K heads' rows of its token, the rest of the row unused (a hybrid store, per-group
// pools of a pkv_hybrid, keeps just latent + rope per token: hybrid_store.c).
// One loop serves the paged, contiguous and hybrid stores, decode and prefill, so the cached
// path and pkv_model_forward_nocache (prefill over a contiguous scratch store) compute
// the same math. fp32 stores only. State layers: state_store.c.
#include <stdlib.h>
#include <math.h>
#include <string.h>

#include "model_internal.h"

// The group of layer l (a uniform model: one full group without sinks).
static pkv_kv_group layer_group(const pkv_model_config *c, uint32_t l) {
    if (c->num_kv_groups) return c->kv_groups[c->layer_group[l]];
    pkv_kv_group g;
    memset(&g, 0, sizeof g);
    g.kind = PKV_LAYER_FULL;
    g.num_layers = c->num_layers;
    g.num_kv_heads = c->num_kv_heads;
    g.head_dim = c->head_dim;
    return g;
}

int pkvi_layer_is_plain(const pkv_model_config *c, uint32_t l) {
    const pkv_kv_group g = layer_group(c, l);
    return g.kind == PKV_LAYER_FULL && !g.sinks;
}

int pkvi_layer_is_mla(const pkv_model_config *c, uint32_t l) {
    return layer_group(c, l).kind == PKV_LAYER_MLA;
}

uint64_t pkvi_mla_layer_floats(const pkv_model_config *c, uint32_t *latent, uint32_t *rope) {
    for (uint32_t i = 0; i < c->num_kv_groups; i++) {
        const pkv_kv_group *g = &c->kv_groups[i];
        if (g->kind != PKV_LAYER_MLA) continue;
        if (latent) *latent = g->latent_dim;
        if (rope) *rope = g->rope_dim;
        const uint64_t r = g->latent_dim, dr = g->rope_dim, H = c->num_heads, hd = c->head_dim,
                       d = c->d_model;
        return H * dr * d + (r + dr) * d + 2 * H * hd * r; // W_qr, W_dkv, W_uk, W_uv
    }
    return 0;
}

int pkvi_hetero_supported(const pkv_model_config *c) {
    uint32_t r = 0, dr = 0;
    const int has_mla = pkvi_mla_layer_floats(c, &r, &dr) != 0;
    const uint64_t kvd = (uint64_t)c->num_kv_heads * c->head_dim;
    for (uint32_t i = 0; i < c->num_kv_groups; i++) {
        const pkv_kv_group *g = &c->kv_groups[i];
        // A state layer's state: kv_heads matrices of head_dim^2 fp32 (state_store.c).
        if (g->kind == PKV_LAYER_STATE &&
            g->state_bytes != (uint64_t)c->num_kv_heads * c->head_dim * c->head_dim * sizeof(float))
            return 0;
        if (g->kind == PKV_LAYER_MLA && (g->latent_dim != r || g->rope_dim != dr)) return 0;
    }
    if (has_mla && (c->pos != PKV_POS_ROPE || dr % 2 != 0 || (uint64_t)r + dr > kvd ||
                    (uint64_t)c->num_heads * dr > kvd))
        return 0;
    return 1;
}

// First position a query at p sees (the header's window rules).
static uint32_t window_start(const pkv_kv_group *g, uint32_t p) {
    if (g->kind == PKV_LAYER_SLIDING) return p + 1 > g->window ? p + 1 - g->window : 0;
    if (g->kind == PKV_LAYER_CHUNKED) return p / g->window * g->window;
    return 0;
}

// Element offset of (sequence i, kv head h, position j) from the layer's K (or V) base.
static uint64_t key_offset(const pkv_model *m, const pkvi_kv_target *kv, uint32_t i, uint32_t h,
                           uint32_t j) {
    const pkvi_scratch *s = &m->s;
    if (kv->kind == PKVI_KV_HYBRID) {
        // A released block (a hole, negative) must never be read: that is the bug
        // the hybrid store's tests prove absent. Flag it (the layer then fails) and
        // read block 0 of the group instead of memory outside it.
        const int32_t block = kv->h_table[(size_t)i * kv->max_blocks + j / kv->block_size];
        uint64_t off = 0;
        if (block < 0)
            *kv->h_fault = 1;
        else
            off = (uint64_t)((uint32_t)block / kv->h_per_chunk) * kv->h_chunk +
                  (uint64_t)((uint32_t)block % kv->h_per_chunk) * kv->h_page;
        return off + h * kv->head_stride + (uint64_t)(j % kv->block_size) * kv->token_stride;
    }
    if (kv->kind == PKVI_KV_PAGED) {
        const uint64_t block = (uint64_t)s->table[(size_t)i * kv->max_blocks + j / kv->block_size];
        return block * kv->block_stride + h * kv->head_stride +
               (uint64_t)(j % kv->block_size) * kv->token_stride;
    }
    return (uint64_t)s->row_off[i] + h * kv->c_head_stride + (uint64_t)j * kv->c_token_stride;
}

// Write the layer's new K/V (s->k, s->v) at each token's position.
static void write_kv(pkv_model *m, const pkvi_call *call, const pkvi_kv_target *kv, float *kc,
                     float *vc) {
    const pkvi_scratch *s = &m->s;
    const uint32_t kvh = m->cfg.num_kv_heads, hd = m->cfg.head_dim;
    for (uint32_t t = 0; t < call->num_tokens; t++) {
        const uint32_t i = (uint32_t)s->tseq[t], p = (uint32_t)s->pos[t];
        for (uint32_t h = 0; h < kvh; h++) {
            const uint64_t off = key_offset(m, kv, i, h, p);
            memcpy(kc + off, s->k + ((size_t)t * kvh + h) * hd, hd * sizeof(float));
            memcpy(vc + off, s->v + ((size_t)t * kvh + h) * hd, hd * sizeof(float));
        }
    }
}

// Copy the latent vector [n] of (sequence i, position p) to (to_cache 1) or from the
// store, across the K heads' rows of hd values.
static void latent_io(const pkv_model *m, const pkvi_kv_target *kv, float *kc, uint32_t i,
                      uint32_t p, float *vec, uint32_t n, int to_cache) {
    const uint32_t hd = m->cfg.head_dim;
    for (uint32_t h = 0; h * hd < n; h++) {
        const uint32_t len = n - h * hd < hd ? n - h * hd : hd;
        float *row = kc + key_offset(m, kv, i, h, p);
        if (to_cache)
            memcpy(row, vec + h * hd, len * sizeof(float));
        else
            memcpy(vec + h * hd, row, len * sizeof(float));
    }
}

// An MLA layer: project the latent and the rotated parts, store the latent, attend.
static pkv_status mla_attention(pkv_model *m, uint32_t layer, const pkvi_call *call,
                                const pkvi_kv_target *kv, float *kc) {
    const pkv_model_config *c = &m->cfg;
    pkvi_scratch *s = &m->s;
    uint32_t r = 0, dr = 0;
    const uint64_t per_layer = pkvi_mla_layer_floats(c, &r, &dr);
    const uint32_t H = c->num_heads, hd = c->head_dim, d = c->d_model, T = call->num_tokens;
    const uint32_t n = r + dr;
    const float *w_qr = m->w.w_mla + (size_t)layer * per_layer; // [H dr][d]
    const float *w_dkv = w_qr + (size_t)H * dr * d;               // [r + dr][d]
    const float *w_uk = w_dkv + (size_t)n * d;                    // [H hd][r]
    const float *w_uv = w_uk + (size_t)H * hd * r;                // [H hd][r]
    float *qr = s->k, *ckr = s->v; // [T][H dr], [T][r + dr]: the K/V scratch is free here
    pkv_status st = m->ops->linear(m, T, d, H * dr, s->h, w_qr, NULL, qr, 0);
    if (st == PKV_OK) st = m->ops->linear(m, T, d, n, s->h, w_dkv, NULL, ckr, 0);
    if (st != PKV_OK) return st;
    for (uint32_t t = 0; t < T; t++) {
        const int32_t p = s->pos[t];
        for (uint32_t h = 0; h < H; h++)
            pkvi_rope_head(qr + ((size_t)t * H + h) * dr, dr, p, c->rope_theta);
        pkvi_rope_head(ckr + (size_t)t * n + r, dr, p, c->rope_theta);
        latent_io(m, kv, kc, (uint32_t)s->tseq[t], (uint32_t)p, ckr + (size_t)t * n, n, 1);
    }
    float *buf = malloc((size_t)(2 * r + n) * sizeof(float));
    if (!buf) return PKV_ERR_OUT_OF_MEMORY;
    float *qlat = buf, *acc = buf + r, *lat = buf + 2 * r;
    const float scale = 1.0f / sqrtf((float)(hd + dr));
    for (uint32_t t = 0; t < T; t++) {
        const uint32_t i = (uint32_t)s->tseq[t], p = (uint32_t)s->pos[t];
        for (uint32_t h = 0; h < H; h++) {
            const float *qn = s->q + ((size_t)t * H + h) * hd;
            const float *qh = qr + ((size_t)t * H + h) * dr;
            // W_uk absorbed into the query: qlat = W_uk[h]^T q_n.
            memset(qlat, 0, r * sizeof(float));
            for (uint32_t a = 0; a < hd; a++)
                for (uint32_t b = 0; b < r; b++) qlat[b] += qn[a] * w_uk[((size_t)h * hd + a) * r + b];
            float mx = -INFINITY, denom = 0.0f;
            for (uint32_t pass = 0; pass < 2; pass++) {
                if (pass) memset(acc, 0, r * sizeof(float));
                for (uint32_t j = 0; j <= p; j++) {
                    latent_io(m, kv, kc, i, j, lat, n, 0);
                    float dot = 0.0f;
                    for (uint32_t b = 0; b < r; b++) dot += qlat[b] * lat[b];
                    for (uint32_t b = 0; b < dr; b++) dot += qh[b] * lat[r + b];
                    dot *= scale;
                    if (!pass) {
                        if (dot > mx) mx = dot;
                        continue;
                    }
                    const float w = expf(dot - mx);
                    denom += w;
                    for (uint32_t b = 0; b < r; b++) acc[b] += w * lat[b];
                }
            }
            // W_uv applied once to the weighted latent.
            float *out = s->att + ((size_t)t * H + h) * hd;
            for (uint32_t a = 0; a < hd; a++) {
                float v = 0.0f;
                for (uint32_t b = 0; b < r; b++) v += w_uv[((size_t)h * hd + a) * r + b] * acc[b];
                out[a] = v / denom;
            }
        }
    }
    free(buf);
    return PKV_OK;
}

// One attention layer (not a state layer) over K at kc and V at vc.
static pkv_status attend_layer(pkv_model *m, uint32_t layer, const pkvi_call *call,
                               const pkvi_kv_target *kv, const pkv_kv_group g, float *kc,
                               float *vc) {
    const pkv_model_config *c = &m->cfg;
    pkvi_scratch *s = &m->s;
    const uint32_t H = c->num_heads, kvh = c->num_kv_heads, hd = c->head_dim, rep = H / kvh;
    if (g.kind == PKV_LAYER_MLA) return mla_attention(m, layer, call, kv, kc);
    write_kv(m, call, kv, kc, vc);
    const float scale = 1.0f / sqrtf((float)hd);
    const float *sinks = g.sinks ? m->w.sinks + (size_t)layer * H : NULL;
    for (uint32_t t = 0; t < call->num_tokens; t++) {
        const uint32_t i = (uint32_t)s->tseq[t], p = (uint32_t)s->pos[t];
        const uint32_t lo = window_start(&g, p);
        for (uint32_t h = 0; h < H; h++) {
            const float *q = s->q + ((size_t)t * H + h) * hd;
            float *out = s->att + ((size_t)t * H + h) * hd;
            const uint32_t kh = h / rep;
            // Two passes (max, then the weighted sum) keep memory O(1) per query.
            float mx = sinks ? sinks[h] : -INFINITY;
            for (uint32_t j = lo; j <= p; j++) {
                const float *k = kc + key_offset(m, kv, i, kh, j);
                float dot = 0.0f;
                for (uint32_t d = 0; d < hd; d++) dot += q[d] * k[d];
                dot *= scale;
                if (dot > mx) mx = dot;
            }
            float denom = sinks ? expf(sinks[h] - mx) : 0.0f;
            memset(out, 0, hd * sizeof(float));
            for (uint32_t j = lo; j <= p; j++) {
                const uint64_t off = key_offset(m, kv, i, kh, j);
                const float *k = kc + off, *v = vc + off;
                float dot = 0.0f;
                for (uint32_t d = 0; d < hd; d++) dot += q[d] * k[d];
                const float w = expf(dot * scale - mx);
                denom += w;
                for (uint32_t d = 0; d < hd; d++) out[d] += w * v[d];
            }
            for (uint32_t d = 0; d < hd; d++) out[d] /= denom;
        }
    }
    return PKV_OK;
}

pkv_status pkvi_hetero_attention_cpu(pkv_model *m, uint32_t layer, const pkvi_call *call,
                                     const pkvi_kv_target *kv) {
    if (kv->dtype != PKV_DTYPE_F32) return PKV_ERR_UNSUPPORTED;
    const pkv_kv_group g = layer_group(&m->cfg, layer);
    if (g.kind == PKV_LAYER_STATE) return pkvi_state_layer_cpu(m, layer, call);
    float *kc, *vc;
    if (kv->kind == PKVI_KV_HYBRID) {
        pkvi_kv_target lt;
        pkvi_hybrid_layer_target(kv, layer, &lt, &kc, &vc);
        *lt.h_fault = 0;
        pkv_status st = attend_layer(m, layer, call, &lt, g, kc, vc);
        if (st == PKV_OK && *lt.h_fault) {
            pkvi_set_error(m, "layer %u (%s) read a block its group released", layer,
                           pkv_layer_kind_name(g.kind));
            return PKV_ERR_CORRUPT;
        }
        return st;
    }
    if (kv->kind == PKVI_KV_SLOTS) {
        pkvi_kv_target lt;
        pkvi_slot_layer_target(m, kv, layer, &lt, &kc, &vc);
        return attend_layer(m, layer, call, &lt, g, kc, vc);
    }
    if (kv->kind == PKVI_KV_PAGED) {
        kc = (float *)kv->base + kv->layer_stride * layer;
        vc = kc + kv->kv_stride;
    } else {
        kc = (float *)kv->ck + kv->c_layer_stride * layer;
        vc = (float *)kv->cv + kv->c_layer_stride * layer;
    }
    return attend_layer(m, layer, call, kv, g, kc, vc);
}

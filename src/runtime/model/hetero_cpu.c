// SPDX-License-Identifier: MIT
// The CPU decoder's attention for layers that are not plain full attention (issue 23):
// sliding-window and chunked-local layers attend only to the positions their window
// lets a query see (the KV store still holds every token: the mask is by position),
// and layers with attention sinks add one learned logit per query head to the softmax
// (gpt-oss). One loop serves the paged and the contiguous store, decode and prefill,
// so the cached path and pkv_model_forward_nocache (which runs prefill over a
// contiguous scratch store) compute the same math. fp32 stores only.
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

pkv_status pkvi_hetero_attention_cpu(pkv_model *m, uint32_t layer, const pkvi_call *call,
                                     const pkvi_kv_target *kv) {
    const pkv_model_config *c = &m->cfg;
    pkvi_scratch *s = &m->s;
    if (kv->dtype != PKV_DTYPE_F32) return PKV_ERR_UNSUPPORTED;
    const pkv_kv_group g = layer_group(c, layer);
    const uint32_t H = c->num_heads, kvh = c->num_kv_heads, hd = c->head_dim, rep = H / kvh;
    float *kc, *vc;
    if (kv->kind == PKVI_KV_PAGED) {
        kc = (float *)kv->base + kv->layer_stride * layer;
        vc = kc + kv->kv_stride;
    } else {
        kc = (float *)kv->ck + kv->c_layer_stride * layer;
        vc = (float *)kv->cv + kv->c_layer_stride * layer;
    }
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

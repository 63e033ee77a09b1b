// SPDX-License-Identifier: MIT
// Causal attention of packed query tokens over a contiguous K/V store, in plain
// C: the prefill of the contiguous layout and the whole-sequence pass of the
// no-cache path. Token t (batch sequence tseq[t], position pos[t]) attends to
// positions 0..pos[t] of its row. Two passes over the keys (max, then
// exp-weighted sum) keep the softmax exact in fp32 without a scores buffer.
// fp16 / bf16 stores are widened element by element.
#include <math.h>
#include <string.h>

#include "src/attention/half.h"
#include "model_internal.h"

// Element i of a store of `dtype`, widened to fp32.
static inline float load(const void *p, pkv_dtype dtype, uint64_t i) {
    if (dtype == PKV_DTYPE_F32) return ((const float *)p)[i];
    uint16_t h = ((const uint16_t *)p)[i];
    return dtype == PKV_DTYPE_F16 ? pkvi_f16_to_f32(h) : pkvi_bf16_to_f32(h);
}

void pkvi_causal_attention_contig_cpu(const pkv_model_config *c, const pkvi_call *call,
                                      const int32_t *tseq, const int32_t *pos,
                                      const int64_t *row_off, const float *q, const void *ck,
                                      const void *cv, pkv_dtype dtype, uint64_t head_stride,
                                      float *att) {
    // q, att: [T][num_heads][hd]; ck, cv: [kv_heads][arena][hd] (one layer)
    const uint32_t hd = c->head_dim, H = c->num_heads, group = c->num_heads / c->num_kv_heads;
    const float scale = 1.0f / sqrtf((float)hd);
    for (uint32_t t = 0; t < call->num_tokens; t++) {
        const uint64_t row = (uint64_t)row_off[tseq[t]];
        const uint32_t n = (uint32_t)pos[t] + 1;
        for (uint32_t h = 0; h < H; h++) {
            const float *qh = q + ((size_t)t * H + h) * hd;
            const uint64_t base = row + (h / group) * head_stride;
            float *o = att + ((size_t)t * H + h) * hd;
            float mx = -INFINITY;
            for (uint32_t j = 0; j < n; j++) {
                float sc = 0.0f;
                for (uint32_t i = 0; i < hd; i++) sc += qh[i] * load(ck, dtype, base + (size_t)j * hd + i);
                sc *= scale;
                if (sc > mx) mx = sc;
            }
            memset(o, 0, hd * sizeof(float));
            float sum = 0.0f;
            for (uint32_t j = 0; j < n; j++) {
                float sc = 0.0f;
                for (uint32_t i = 0; i < hd; i++) sc += qh[i] * load(ck, dtype, base + (size_t)j * hd + i);
                float p = expf(sc * scale - mx);
                sum += p;
                for (uint32_t i = 0; i < hd; i++) o[i] += p * load(cv, dtype, base + (size_t)j * hd + i);
            }
            for (uint32_t i = 0; i < hd; i++) o[i] /= sum;
        }
    }
}

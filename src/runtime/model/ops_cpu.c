// SPDX-License-Identifier: MIT
// The CPU op table of the decoder: OpenBLAS cblas_sgemm for every linear layer
// (a plain-C tiled GEMM in builds without BLAS), plain C norms, RoPE and
// activations, and the attention engineer's CPU kernels for the caches.
// Invariant: every op reads and writes host memory only; "device" pointers of a
// CPU model are host pointers.
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "src/attention/half.h"
#include "src/attention/quant.h"
#include "model_internal.h"
#if PKV_HAVE_BLAS
#include <cblas.h>
#endif

static pkv_status cpu_init(pkv_model *m) {
    (void)m;
    return PKV_OK;
}

static void cpu_fini(pkv_model *m) { (void)m; }

static pkv_status cpu_alloc(pkv_model *m, size_t bytes, void **ptr) {
    (void)m;
    // 64-byte alignment for vector loads; round the size up as aligned_alloc wants.
    size_t rounded = (bytes + 63) & ~(size_t)63;
    void *p = NULL;
    if (posix_memalign(&p, 64, rounded ? rounded : 64) != 0) return PKV_ERR_OUT_OF_MEMORY;
    *ptr = p;
    return PKV_OK;
}

static void cpu_release(pkv_model *m, void *ptr) {
    (void)m;
    free(ptr);
}

static pkv_status cpu_copy(pkv_model *m, void *dst, const void *src, size_t bytes) {
    (void)m;
    if (bytes) memmove(dst, src, bytes);
    return PKV_OK;
}

static pkv_status cpu_sync(pkv_model *m) {
    (void)m;
    return PKV_OK;
}

static pkv_status cpu_embed(pkv_model *m, uint32_t T, float *x) {
    const uint32_t d = m->cfg.d_model;
    for (uint32_t t = 0; t < T; t++) {
        const float *e = m->w.wte + (size_t)m->s.tok[t] * d;
        float *o = x + (size_t)t * d;
        if (m->w.wpe) {
            const float *p = m->w.wpe + (size_t)m->s.pos[t] * d;
            for (uint32_t i = 0; i < d; i++) o[i] = e[i] + p[i];
        } else {
            memcpy(o, e, (size_t)d * sizeof(float));
        }
    }
    return PKV_OK;
}

static pkv_status cpu_norm(pkv_model *m, uint32_t rows, const float *x, const float *w,
                           const float *b, float *y) {
    const uint32_t d = m->cfg.d_model;
    const float eps = m->cfg.norm_eps;
    for (uint32_t r = 0; r < rows; r++) {
        const float *xr = x + (size_t)r * d;
        float *yr = y + (size_t)r * d;
        if (m->cfg.norm == PKV_NORM_LAYERNORM) {
            double mean = 0.0, var = 0.0;
            for (uint32_t i = 0; i < d; i++) mean += xr[i];
            mean /= d;
            for (uint32_t i = 0; i < d; i++) var += (xr[i] - mean) * (xr[i] - mean);
            var /= d;
            float inv = (float)(1.0 / sqrt(var + eps)), mu = (float)mean;
            for (uint32_t i = 0; i < d; i++) yr[i] = (xr[i] - mu) * inv * w[i] + (b ? b[i] : 0.0f);
        } else {
            double ss = 0.0;
            for (uint32_t i = 0; i < d; i++) ss += (double)xr[i] * xr[i];
            float inv = (float)(1.0 / sqrt(ss / d + eps));
            for (uint32_t i = 0; i < d; i++) yr[i] = xr[i] * inv * w[i];
        }
    }
    return PKV_OK;
}

#if !PKV_HAVE_BLAS
// Plain-C GEMM for builds without BLAS (the GPU machine has none):
// y[T][n] (+)= x[T][k] . w[n][k]^T. Tiles of 4 rows of x by 4 rows of w share
// every load between 16 dot products; each dot product keeps 8 independent
// partial sums (lanes) so that the compiler can vectorize without reassociating.
#define GEMM_LANES 8
static void gemm_tile(uint32_t ta, uint32_t nb, uint32_t k, const float *x, const float *w,
                      float *y, uint32_t n, int accumulate) {
    float acc[4][4][GEMM_LANES] = {{{0}}};
    uint32_t k8 = k / GEMM_LANES * GEMM_LANES;
    for (uint32_t i = 0; i < k8; i += GEMM_LANES)
        for (uint32_t a = 0; a < 4; a++)
            for (uint32_t b = 0; b < 4; b++)
                for (uint32_t l = 0; l < GEMM_LANES; l++)
                    acc[a][b][l] += x[(size_t)(a < ta ? a : 0) * k + i + l] *
                                    w[(size_t)(b < nb ? b : 0) * k + i + l];
    for (uint32_t a = 0; a < ta; a++)
        for (uint32_t b = 0; b < nb; b++) {
            float s = 0.0f;
            for (uint32_t l = 0; l < GEMM_LANES; l++) s += acc[a][b][l];
            for (uint32_t i = k8; i < k; i++) s += x[(size_t)a * k + i] * w[(size_t)b * k + i];
            float *o = y + (size_t)a * n + b;
            *o = accumulate ? *o + s : s;
        }
}
#endif

static pkv_status cpu_linear(pkv_model *m, uint32_t T, uint32_t k, uint32_t n, const float *x,
                             const float *w, const float *b, float *y, int accumulate) {
    (void)m;
#if PKV_HAVE_BLAS
    // y[T][n] = x[T][k] . w[n][k]^T: row-major, B transposed.
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, (int)T, (int)n, (int)k, 1.0f, x,
                (int)k, w, (int)k, accumulate ? 1.0f : 0.0f, y, (int)n);
#else
    for (uint32_t t = 0; t < T; t += 4)
        for (uint32_t j = 0; j < n; j += 4)
            gemm_tile(T - t < 4 ? T - t : 4, n - j < 4 ? n - j : 4, k, x + (size_t)t * k,
                      w + (size_t)j * k, y + (size_t)t * n + j, n, accumulate);
#endif
    if (b)
        for (uint32_t t = 0; t < T; t++) {
            float *yt = y + (size_t)t * n;
            for (uint32_t j = 0; j < n; j++) yt[j] += b[j];
        }
    return PKV_OK;
}

// Rotate interleaved pairs (2i, 2i+1) of one head by pos * theta^(-2i/hd)
// (the llama2.c / Meta convention). The angle is computed in double so that
// long positions keep their precision.
void pkvi_rope_head(float *v, uint32_t hd, int32_t pos, double theta) {
    for (uint32_t i = 0; i < hd / 2; i++) {
        double freq = pow(theta, -2.0 * (double)i / (double)hd);
        double a = (double)pos * freq;
        float c = (float)cos(a), s = (float)sin(a);
        float x0 = v[2 * i], x1 = v[2 * i + 1];
        v[2 * i] = x0 * c - x1 * s;
        v[2 * i + 1] = x0 * s + x1 * c;
    }
}

static pkv_status cpu_rope(pkv_model *m, uint32_t T, float *q, float *k) {
    const pkv_model_config *c = &m->cfg;
    for (uint32_t t = 0; t < T; t++) {
        int32_t p = m->s.pos[t];
        for (uint32_t h = 0; h < c->num_heads; h++)
            pkvi_rope_head(q + ((size_t)t * c->num_heads + h) * c->head_dim, c->head_dim, p,
                      c->rope_theta);
        for (uint32_t h = 0; h < c->num_kv_heads; h++)
            pkvi_rope_head(k + ((size_t)t * c->num_kv_heads + h) * c->head_dim, c->head_dim, p,
                      c->rope_theta);
    }
    return PKV_OK;
}

static pkv_status cpu_act(pkv_model *m, uint32_t T, float *a, const float *b) {
    const size_t n = (size_t)T * m->cfg.d_ff;
    if (!b) {
        // GELU, tanh approximation (GPT-2).
        const float k0 = 0.7978845608f; // sqrt(2 / pi)
        for (size_t i = 0; i < n; i++) {
            float x = a[i];
            a[i] = 0.5f * x * (1.0f + tanhf(k0 * (x + 0.044715f * x * x * x)));
        }
    } else {
        for (size_t i = 0; i < n; i++) {
            float x = a[i];
            a[i] = x / (1.0f + expf(-x)) * b[i];
        }
    }
    return PKV_OK;
}

static pkv_status cpu_gather_last(pkv_model *m, uint32_t S, const float *x, float *xl) {
    const uint32_t d = m->cfg.d_model;
    for (uint32_t i = 0; i < S; i++)
        memcpy(xl + (size_t)i * d, x + (size_t)m->s.last[i] * d, (size_t)d * sizeof(float));
    return PKV_OK;
}

static pkv_attn_shape shape_of(const pkv_model *m, pkv_dtype dtype) {
    pkv_attn_shape sh;
    sh.num_heads = m->cfg.num_heads;
    sh.num_kv_heads = m->cfg.num_kv_heads;
    sh.head_dim = m->cfg.head_dim;
    sh.dtype = dtype;
    sh.scale = 1.0f / sqrtf((float)m->cfg.head_dim);
    sh.num_threads = m->params.num_threads;
    return sh;
}

static void to_half(const float *src, uint16_t *dst, size_t n, pkv_dtype dtype) {
    if (dtype == PKV_DTYPE_F16)
        for (size_t i = 0; i < n; i++) dst[i] = pkvi_f32_to_f16(src[i]);
    else
        for (size_t i = 0; i < n; i++) dst[i] = pkvi_f32_to_bf16(src[i]);
}

static void from_half(const uint16_t *src, float *dst, size_t n, pkv_dtype dtype) {
    if (dtype == PKV_DTYPE_F16)
        for (size_t i = 0; i < n; i++) dst[i] = pkvi_f16_to_f32(src[i]);
    else
        for (size_t i = 0; i < n; i++) dst[i] = pkvi_bf16_to_f32(src[i]);
}

// Attention of one layer in the store's dtype: q, k and v are rounded to it
// first (the attention calls take q, out and the cache in one dtype), the
// output is widened back into s->att.
static pkv_status attend(pkv_model *m, uint32_t layer, const pkvi_call *call,
                         const pkvi_kv_target *kv, const void *q, const void *k, const void *v,
                         void *att) {
    const pkv_model_config *c = &m->cfg;
    pkvi_scratch *s = &m->s;
    const pkv_attn_shape sh = shape_of(m, kv->dtype);
    const uint32_t hd = c->head_dim, kvh = c->num_kv_heads;
    const size_t es = pkv_dtype_size(kv->dtype);
    if (kv->kind == PKVI_KV_PAGED) {
        char *kc = (char *)kv->base + kv->layer_stride * layer * es;
        char *vc = kc + kv->kv_stride * es;
        pkv_status st = pkv_attn_cache_write_cpu(&sh, call->num_tokens, k, v, s->slots, kc, vc,
                                                 kv->block_stride, kv->head_stride,
                                                 kv->token_stride, kv->block_size, kv->num_blocks);
        if (st != PKV_OK) return st;
        pkv_attn_paged_kv pk = {kc, vc, kv->block_stride, kv->head_stride, kv->token_stride,
                                kv->block_size, kv->num_blocks, s->table, kv->max_blocks,
                                s->lens};
        if (call->all_single) return pkv_attn_decode_paged_cpu(&sh, call->num_seqs, q, &pk, att);
        return pkv_attn_prefill_paged_cpu(&sh, call->num_seqs, s->indptr, q, &pk, att);
    }
    // Contiguous: the store's strides; sequence i's row starts at row_off[i].
    const uint64_t token_stride = kv->c_token_stride, head_stride = kv->c_head_stride,
                   layer_stride = kv->c_layer_stride;
    char *kc = (char *)kv->ck + layer_stride * layer * es;
    char *vc = (char *)kv->cv + layer_stride * layer * es;
    for (uint32_t t = 0; t < call->num_tokens; t++) {
        uint64_t row = (uint64_t)s->row_off[s->tseq[t]], p = (uint64_t)s->pos[t];
        for (uint32_t h = 0; h < kvh; h++) {
            uint64_t off = (row + h * head_stride + p * token_stride) * es;
            size_t src = ((size_t)t * kvh + h) * hd * es;
            memcpy(kc + off, (const char *)k + src, hd * es);
            memcpy(vc + off, (const char *)v + src, hd * es);
        }
    }
    pkv_attn_contig_kv ck = {kc, vc, 0, head_stride, token_stride, kv->max_len, s->lens, s->row_off};
    if (call->all_single) return pkv_attn_decode_contig_cpu(&sh, call->num_seqs, q, &ck, att);
    return pkv_attn_prefill_contig_cpu(&sh, call->num_seqs, s->indptr, q, &ck, att);
}

// max|x| / fp8 max over n values, or 1 for an all-zero (or non-finite) input.
static float calibrate(const float *x, size_t n, pkv_dtype dt) {
    float amax = 0.0f;
    for (size_t i = 0; i < n; i++) amax = fabsf(x[i]) > amax ? fabsf(x[i]) : amax;
    return amax > 0.0f && isfinite(amax) ? amax / pkvi_quant_max(dt) : 1.0f;
}

// 8-bit store, paged or contiguous: q, k, v and the output stay fp32; the writer
// quantizes and the attention dequantizes on the fly. A contiguous store is
// written as a paged cache of one-token blocks (its slots; pkvi_kv_target), so
// both kinds quantize with the same code.
static pkv_status attend_quant(pkv_model *m, uint32_t layer, const pkvi_call *call,
                               const pkvi_kv_target *kv) {
    pkvi_scratch *s = &m->s;
    const pkv_attn_shape sh = shape_of(m, PKV_DTYPE_F32);
    pkv_attn_kv_quant qz = kv->quant;
    if (kv->dtype != PKV_DTYPE_INT8) {
        float *sc = m->kv_scales + 2 * (size_t)layer;
        const size_t n = (size_t)call->num_tokens * m->kv_dim;
        if (sc[0] == 0.0f) sc[0] = calibrate(s->k, n, kv->dtype);
        if (sc[1] == 0.0f) sc[1] = calibrate(s->v, n, kv->dtype);
        qz.k_scale = sc[0];
        qz.v_scale = sc[1];
    }
    if (kv->kind == PKVI_KV_CONTIG) {
        char *kc = (char *)kv->ck + kv->c_layer_stride * layer; // 1-byte elements
        char *vc = (char *)kv->cv + kv->c_layer_stride * layer;
        pkv_status st = pkv_attn_cache_write_quant_cpu(&sh, &qz, call->num_tokens, s->k, s->v,
                                                       s->slots, kc, vc, kv->c_token_stride,
                                                       kv->c_head_stride, kv->c_token_stride, 1,
                                                       kv->num_blocks);
        if (st != PKV_OK) return st;
        pkv_attn_contig_kv ck = {kc, vc, 0, kv->c_head_stride, kv->c_token_stride, kv->max_len,
                                 s->lens, s->row_off};
        if (call->all_single)
            return pkv_attn_decode_contig_quant_cpu(&sh, &qz, call->num_seqs, s->q, &ck, s->att);
        return pkv_attn_prefill_contig_quant_cpu(&sh, &qz, call->num_seqs, s->indptr, s->q, &ck,
                                                 s->att);
    }
    char *kc = (char *)kv->base + kv->layer_stride * layer;
    char *vc = kc + kv->kv_stride;
    pkv_status st = pkv_attn_cache_write_quant_cpu(&sh, &qz, call->num_tokens, s->k, s->v,
                                                   s->slots, kc, vc, kv->block_stride,
                                                   kv->head_stride, kv->token_stride,
                                                   kv->block_size, kv->num_blocks);
    if (st != PKV_OK) return st;
    pkv_attn_paged_kv pk = {kc, vc, kv->block_stride, kv->head_stride, kv->token_stride,
                            kv->block_size, kv->num_blocks, s->table, kv->max_blocks, s->lens};
    if (call->all_single)
        return pkv_attn_decode_paged_quant_cpu(&sh, &qz, call->num_seqs, s->q, &pk, s->att);
    return pkv_attn_prefill_paged_quant_cpu(&sh, &qz, call->num_seqs, s->indptr, s->q, &pk,
                                            s->att);
}

static pkv_status cpu_attention(pkv_model *m, uint32_t layer, const pkvi_call *call,
                                const pkvi_kv_target *kv) {
    pkvi_scratch *s = &m->s;
    // A hybrid store's layers all go through the one loop that resolves their group.
    if (kv->kind == PKVI_KV_HYBRID || kv->kind == PKVI_KV_SLOTS ||
        !pkvi_layer_is_plain(&m->cfg, layer))
        return pkvi_hetero_attention_cpu(m, layer, call, kv);
    if (pkv_dtype_is_quantized(kv->dtype)) return attend_quant(m, layer, call, kv);
    if (kv->dtype == PKV_DTYPE_F32) return attend(m, layer, call, kv, s->q, s->k, s->v, s->att);
    const size_t T = call->num_tokens;
    to_half(s->q, s->q16, T * m->q_dim, kv->dtype);
    to_half(s->k, s->k16, T * m->kv_dim, kv->dtype);
    to_half(s->v, s->v16, T * m->kv_dim, kv->dtype);
    pkv_status st = attend(m, layer, call, kv, s->q16, s->k16, s->v16, s->att16);
    if (st != PKV_OK) return st;
    from_half(s->att16, s->att, T * m->q_dim, kv->dtype);
    return PKV_OK;
}

const pkvi_ops pkvi_model_cpu_ops = {
    "cpu",        cpu_init,  cpu_fini, cpu_alloc, cpu_release,     cpu_copy,
    cpu_copy,     cpu_copy,  cpu_sync, cpu_embed, cpu_norm,        cpu_linear,
    cpu_rope,     cpu_act,   cpu_gather_last, cpu_attention,
};

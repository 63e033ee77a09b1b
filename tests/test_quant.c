// SPDX-License-Identifier: MIT
// Unit tests of the 8-bit KV cache (int8 with per-token-per-head scales, fp8 e4m3 /
// e5m2 with per-tensor scales): the codecs (exhaustive over every fp8 byte, round
// to nearest even against a brute-force search, zeros, subnormals, saturation,
// NaN), the cache geometry with scales inside the block, the quantizing cache
// write, decode and prefill against double-precision references, and copy-on-
// write / swap moving the scales with the data.
//
// Two references for attention:
//  - "as stored": computed in double from the dequantized values the cache holds
//    (read back through the documented layout, not through the kernel's code), so
//    only fp32 arithmetic separates it from the kernel: |err| <= 3e-5 + 2^-11 |ref|
//    (fp16 output rounding where the q/out dtype is fp16), as tests/test_attention.c.
//  - "fp32 original": the values before quantization. The bound is derived from the
//    format: with dk = max |k - deq(k)| and dv likewise (per row: int8 s / 2 =
//    max|x| / 254; fp8 half an ulp, 2^-4 |x| for e4m3 and 2^-3 |x| for e5m2, plus
//    the subnormal step), a score moves by at most delta = scale * sum|q| * dk, every
//    softmax weight by a factor within e^(+-2 delta), so
//      |out - ref| <= (e^(2 delta) - 1) max|v| + dv   (+ the fp32 tolerance).
//    The test checks that bound, and that the error is not zero (the quantization
//    is really there).
#include <criterion/criterion.h>
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "pkv/attention.h"
#include "pkv/backend.h"
#include "pkv/cache.h"
#include "pkv/pool.h"
#include "pkv/seq.h"
#include "src/attention/half.h"
#include "src/attention/quant.h"

#define ATOL 3e-5

static uint64_t rng_state = 0x243f6a8885a308d3ull;

static uint64_t rng_next(void) { // splitmix64
    uint64_t z = (rng_state += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

static double rng_unit(void) { // [-1, 1)
    return (double)(rng_next() >> 11) / (double)(1ull << 53) * 2.0 - 1.0;
}

static const pkv_dtype qtypes[3] = {PKV_DTYPE_INT8, PKV_DTYPE_FP8_E4M3, PKV_DTYPE_FP8_E5M2};

// ---------------------------------------------------------------- codecs

// The exact value of an fp8 byte from its fields (independent of quant.h).
static double fp8_value(uint8_t b, int e4m3) {
    int mb = e4m3 ? 3 : 2;
    int bias = e4m3 ? 7 : 15;
    int e = (b & 0x7f) >> mb;
    int m = b & ((1 << mb) - 1);
    double s = (b & 0x80) ? -1.0 : 1.0;
    if (e4m3 && (b & 0x7f) == 0x7f) return NAN;
    if (!e4m3 && e == 31) return m ? NAN : s * INFINITY;
    if (e == 0) return s * ldexp((double)m, 1 - bias - mb);
    return s * ldexp(1.0 + (double)m / (1 << mb), e - bias);
}

Test(quant, fp8_decode_exhaustive) {
    for (int e4m3 = 0; e4m3 < 2; e4m3++) {
        for (int b = 0; b < 256; b++) {
            double want = fp8_value((uint8_t)b, e4m3);
            float got = pkvi_fp8_to_f32((uint8_t)b, e4m3);
            if (isnan(want)) {
                cr_assert(isnan(got), "e4m3=%d byte %#x: want NaN, got %g", e4m3, b, got);
            } else {
                cr_assert_eq((double)got, want, "e4m3=%d byte %#x: %g != %g", e4m3, b, got, want);
            }
        }
    }
}

Test(quant, fp8_encode_roundtrip_every_code) {
    for (int e4m3 = 0; e4m3 < 2; e4m3++) {
        for (int b = 0; b < 256; b++) {
            double x = fp8_value((uint8_t)b, e4m3);
            uint8_t c = pkvi_f32_to_fp8((float)x, e4m3);
            if (isnan(x)) {
                cr_assert(isnan(fp8_value(c, e4m3)), "NaN must stay NaN (%#x -> %#x)", b, c);
            } else if (isinf(x)) {
                // e5m2 inf saturates (SATFINITE) to +-57344.
                cr_assert_eq(fp8_value(c, e4m3), x > 0 ? 57344.0 : -57344.0);
            } else {
                cr_assert_eq(c, (uint8_t)b, "e4m3=%d: %g encodes to %#x, not %#x", e4m3, x, c, b);
            }
        }
    }
}

// Brute force: the nearest finite code, ties to the even mantissa (low bit 0).
static uint8_t nearest_code(double x, int e4m3) {
    double best = INFINITY;
    int bc = 0;
    for (int b = 0; b < 256; b++) {
        double v = fp8_value((uint8_t)b, e4m3);
        if (!isfinite(v) || (v == 0.0 && signbit(v) != signbit(x))) continue;
        double d = fabs(v - x);
        if (d < best || (d == best && (b & 1) == 0)) {
            best = d;
            bc = b;
        }
    }
    return (uint8_t)bc;
}

Test(quant, fp8_encode_round_nearest_even) {
    for (int e4m3 = 0; e4m3 < 2; e4m3++) {
        const double max = e4m3 ? 448.0 : 57344.0;
        for (int i = 0; i < 20000; i++) {
            // Log-uniform magnitudes across the subnormal, normal and saturating range.
            double mag = ldexp(1.0, (int)(rng_next() % 40) - (e4m3 ? 12 : 20)) * (1 + fabs(rng_unit()));
            double x = rng_unit() < 0 ? -mag : mag;
            if (i % 7 == 0) { // exact midpoints between neighbouring codes
                uint8_t c = nearest_code(x, e4m3);
                double a = fp8_value(c, e4m3);
                double b = fp8_value((uint8_t)(c + 1), e4m3);
                if (isfinite(b) && fabs(b) <= max) x = (a + b) / 2;
            }
            float xf = (float)x;
            uint8_t got = pkvi_f32_to_fp8(xf, e4m3);
            uint8_t want = fabs((double)xf) >= max ? (uint8_t)((xf < 0 ? 0x80 : 0) | (e4m3 ? 0x7e : 0x7b))
                                                   : nearest_code((double)xf, e4m3);
            cr_assert_eq(got, want, "e4m3=%d x=%.9g: got %#x (%g) want %#x (%g)", e4m3, (double)xf,
                         got, fp8_value(got, e4m3), want, fp8_value(want, e4m3));
        }
    }
}

Test(quant, fp8_special_values) {
    for (int e4m3 = 0; e4m3 < 2; e4m3++) {
        const float max = e4m3 ? 448.0f : 57344.0f;
        cr_assert_eq(pkvi_f32_to_fp8(0.0f, e4m3), 0x00);
        cr_assert_eq(pkvi_f32_to_fp8(-0.0f, e4m3), 0x80, "-0 keeps its sign");
        cr_assert_eq(pkvi_fp8_to_f32(pkvi_f32_to_fp8(1e9f, e4m3), e4m3), max, "saturates");
        cr_assert_eq(pkvi_fp8_to_f32(pkvi_f32_to_fp8(-INFINITY, e4m3), e4m3), -max, "-inf saturates");
        cr_assert_eq(pkvi_fp8_to_f32(pkvi_f32_to_fp8(max * 1.03f, e4m3), e4m3), max);
        cr_assert(isnan(pkvi_fp8_to_f32(pkvi_f32_to_fp8(NAN, e4m3), e4m3)), "NaN stays NaN");
        cr_assert(isnan(pkvi_fp8_to_f32(pkvi_f32_to_fp8(-NAN, e4m3), e4m3)));
        // fp32 subnormals are far below the fp8 subnormal step: they round to +-0.
        cr_assert_eq(pkvi_f32_to_fp8(1e-40f, e4m3), 0x00);
        cr_assert_eq(pkvi_f32_to_fp8(-1e-40f, e4m3), 0x80);
        // The smallest fp8 subnormal, and half of it (a tie: to even = 0).
        float tiny = e4m3 ? 0x1p-9f : 0x1p-16f;
        cr_assert_eq(pkvi_f32_to_fp8(tiny, e4m3), 0x01);
        cr_assert_eq(pkvi_f32_to_fp8(tiny / 2, e4m3), 0x00);
        cr_assert_eq(pkvi_f32_to_fp8(tiny * 1.5f, e4m3), 0x02, "1.5 steps: tie to even (2)");
    }
    cr_assert_eq(pkvi_f32_to_fp8(1.0f, 1), 0x38);
    cr_assert_eq(pkvi_f32_to_fp8(448.0f, 1), 0x7e);
    cr_assert_eq(pkvi_f32_to_fp8(1.0f, 0), 0x3c);
    cr_assert_eq(pkvi_f32_to_fp8(57344.0f, 0), 0x7b);
}

// |x - q s| <= s / 2, the max maps to +-127, -128 never appears.
static void check_int8_row(const float *x, uint32_t n, float slack) {
    uint8_t q[512];
    float back[512];
    float s = -1.0f;
    pkvi_quantize_row(PKV_DTYPE_INT8, x, n, 1.0f, q, &s);
    pkvi_dequantize_row(PKV_DTYPE_INT8, q, n, s, back);
    float amax = 0.0f;
    for (uint32_t i = 0; i < n; i++) amax = fabsf(x[i]) > amax ? fabsf(x[i]) : amax;
    cr_assert_eq(s, amax / 127.0f);
    int saw_max = 0;
    for (uint32_t i = 0; i < n; i++) {
        cr_assert_neq((int8_t)q[i], -128);
        saw_max |= abs((int8_t)q[i]) == 127;
        cr_assert_leq(fabsf(back[i] - x[i]), s * 0.5f * (1.0f + 1e-6f) + slack,
                      "x=%g q=%d s=%g back=%g", x[i], (int8_t)q[i], s, back[i]);
    }
    if (amax > 0.0f) cr_assert(saw_max, "the largest value maps to +-127");
}

Test(quant, int8_rows) {
    float x[512];
    for (int rep = 0; rep < 200; rep++) {
        uint32_t n = 1 + (uint32_t)(rng_next() % 512);
        double mag = ldexp(1.0, (int)(rng_next() % 60) - 30);
        for (uint32_t i = 0; i < n; i++) x[i] = (float)(rng_unit() * mag);
        check_int8_row(x, n, 0.0f);
    }
    // Huge values: the scale stays finite, nothing overflows.
    for (uint32_t i = 0; i < 64; i++) x[i] = (float)(rng_unit() * 3.0e38);
    x[5] = 3.4e38f;
    check_int8_row(x, 64, 0.0f);
    // Subnormal rows: the scale is itself subnormal (rounded), so allow its
    // rounding (an absolute 127 x 2^-149 on the product) on top of s / 2.
    for (uint32_t i = 0; i < 64; i++) x[i] = (float)(rng_unit() * 1e-39);
    check_int8_row(x, 64, 127.0f * 0x1p-149f);
}

Test(quant, int8_zero_and_nonfinite_rows) {
    float x[16] = {0};
    uint8_t q[16];
    float back[16];
    float s = -1.0f;
    pkvi_quantize_row(PKV_DTYPE_INT8, x, 16, 1.0f, q, &s);
    cr_assert_eq(s, 0.0f, "a zero row has scale 0");
    pkvi_dequantize_row(PKV_DTYPE_INT8, q, 16, s, back);
    for (int i = 0; i < 16; i++) cr_assert_eq(back[i], 0.0f);
    for (int bad = 0; bad < 3; bad++) {
        for (int i = 0; i < 16; i++) x[i] = 0.5f;
        x[7] = bad == 0 ? NAN : bad == 1 ? INFINITY : -INFINITY;
        pkvi_quantize_row(PKV_DTYPE_INT8, x, 16, 1.0f, q, &s);
        cr_assert(isnan(s), "a NaN or inf in the row makes its scale NaN");
        pkvi_dequantize_row(PKV_DTYPE_INT8, q, 16, s, back);
        for (int i = 0; i < 16; i++) cr_assert(isnan(back[i]), "the whole row reads back as NaN");
    }
}

// ---------------------------------------------------------------- geometry

Test(quant, geometry_counts_scales) {
    pkv_cache_params p = pkv_cache_params_default();
    p.num_layers = 32;
    p.kv_heads = 8;
    p.head_dim = 128;
    p.block_size = 16;
    p.dtype = PKV_DTYPE_F16;
    uint64_t f16 = pkv_cache_bytes_per_block(&p);
    cr_assert_eq(f16, 2ull * 32 * 8 * 16 * 128 * 2);
    p.dtype = PKV_DTYPE_FP8_E4M3;
    cr_assert_eq(pkv_cache_bytes_per_block(&p), f16 / 2);
    cr_assert_eq(pkv_cache_bytes_per_token(&p), 2ull * 32 * 8 * 128);
    p.dtype = PKV_DTYPE_INT8;
    cr_assert_eq(pkv_cache_bytes_per_token(&p), 2ull * 32 * 8 * (128 + 4));
    cr_assert_eq(pkv_cache_bytes_per_block(&p), 2ull * 32 * (8 * 16 * 128 + 8 * 16 * 4));
    // Padding: head_dim 3, block 3, 1 head: data 9 -> 16, scales 12 -> 16.
    p.num_layers = 1;
    p.kv_heads = 1;
    p.head_dim = 3;
    p.block_size = 3;
    cr_assert_eq(pkv_cache_bytes_per_block(&p), 2ull * (16 + 16));

    pkv_pool *pool;
    pkv_backend *host;
    pkv_cache *cache;
    cr_assert_eq(pkv_pool_create(5, &pool), PKV_OK);
    cr_assert_eq(pkv_backend_create_host(&host), PKV_OK);
    p.num_layers = 2;
    p.kv_heads = 2;
    p.head_dim = 8;
    p.block_size = 4;
    cr_assert_eq(pkv_cache_create(&p, pool, host, &cache), PKV_OK);
    pkv_cache_geometry g;
    cr_assert_eq(pkv_cache_get_geometry(cache, &g), PKV_OK);
    cr_assert_eq(g.scale_offset, 64);             // 2 x 4 x 8 bytes of data
    cr_assert_eq(g.half_block_bytes, 64 + 32);    // + 2 x 4 fp32 scales
    cr_assert_eq(g.kv_stride, g.half_block_bytes); // bytes = elements
    cr_assert_eq(g.block_stride, 2 * g.half_block_bytes);
    cr_assert_eq(g.layer_stride, 5 * g.block_stride);
    cr_assert_eq(g.scale_head_stride, 4);
    cr_assert_eq(g.scale_token_stride, 1);
    cr_assert_eq(pkv_cache_arena_bytes(cache), 5 * pkv_cache_bytes_per_block(&p));
    void *b3;
    cr_assert_eq(pkv_cache_block_ptr(cache, 1, 3, PKV_V, &b3), PKV_OK);
    cr_assert_eq((char *)b3 - (char *)pkv_cache_data(cache),
                 (ptrdiff_t)(g.layer_stride + 3 * g.block_stride + g.kv_stride));
    pkv_cache_destroy(cache);
    // External arena: int8 needs 16-byte alignment (the fp32 scales).
    static _Alignas(16) unsigned char ext[5 * 2 * 2 * 96 + 16];
    cr_assert_eq(pkv_cache_create_external(&p, pool, host, ext + 4, sizeof ext - 4, &cache),
                 PKV_ERR_INVALID_ARG);
    cr_assert_eq(pkv_cache_create_external(&p, pool, host, ext, sizeof ext, &cache), PKV_OK);
    pkv_cache_destroy(cache);
    pkv_backend_destroy(host);
    pkv_pool_destroy(pool);
}

Test(quant, dtype_names) {
    pkv_dtype d;
    const char *names[] = {"fp32", "fp16", "bf16", "int8", "fp8_e4m3", "fp8_e5m2"};
    for (int i = 0; i < 6; i++) {
        cr_assert_eq(pkv_dtype_from_name(names[i], &d), PKV_OK);
        cr_assert_str_eq(pkv_dtype_name(d), names[i]);
        cr_assert_eq(pkv_dtype_is_quantized(d), i >= 3);
    }
    cr_assert_eq(pkv_dtype_from_name("fp8", &d), PKV_OK);
    cr_assert_eq(d, PKV_DTYPE_FP8_E4M3, "fp8 means e4m3, as vLLM");
    cr_assert_eq(pkv_dtype_from_name("int4", &d), PKV_ERR_INVALID_ARG);
}

// ---------------------------------------------------------------- attention

// One layer of a pkv_cache of an 8-bit dtype filled through the quantizing write,
// with the fp32 originals kept for the references.
typedef struct qcase {
    pkv_dtype qd;             // storage dtype
    pkv_attn_shape sh;        // q/out dtype fp32 or fp16
    pkv_attn_kv_quant qz;
    pkv_pool *pool;
    pkv_backend *host;
    pkv_cache *cache;
    pkv_cache_geometry g;
    uint32_t num_seqs, max_blocks, bs;
    int32_t lens[4];
    int32_t *tables;          // [num_seqs][max_blocks]
    float *korig, *vorig;     // [num_seqs][max_len][kv_heads][dim]
    uint32_t max_len;
    float *q;                 // [rows][heads][dim] fp32 (rounded to sh.dtype)
    void *qdt;                // q in sh.dtype
} qcase;

static float outlier_value(uint32_t d, int outliers) {
    double x = rng_unit();
    // Real models' K has a few channels 10-50x larger than the rest.
    if (outliers && (d % 37 == 3)) x *= 40.0;
    return (float)x;
}

static void qcase_make(qcase *c, pkv_dtype qd, pkv_dtype qdt, uint32_t heads, uint32_t kvh,
                       uint32_t dim, uint32_t bs, uint32_t num_seqs, const int32_t *lens,
                       pkv_layout layout, int outliers) {
    memset(c, 0, sizeof *c);
    c->qd = qd;
    c->bs = bs;
    c->num_seqs = num_seqs;
    c->sh.num_heads = heads;
    c->sh.num_kv_heads = kvh;
    c->sh.head_dim = dim;
    c->sh.dtype = qdt;
    c->sh.scale = 1.0f / sqrtf((float)dim);
    c->sh.num_threads = 2;
    uint32_t total = 0;
    c->max_len = 1;
    for (uint32_t s = 0; s < num_seqs; s++) {
        c->lens[s] = lens[s];
        uint32_t nb = ((uint32_t)lens[s] + bs - 1) / bs;
        c->max_blocks = nb > c->max_blocks ? nb : c->max_blocks;
        c->max_len = (uint32_t)lens[s] > c->max_len ? (uint32_t)lens[s] : c->max_len;
        total += nb;
    }
    uint32_t nblocks = total + 2;
    cr_assert_eq(pkv_pool_create(nblocks, &c->pool), PKV_OK);
    cr_assert_eq(pkv_backend_create_host(&c->host), PKV_OK);
    pkv_cache_params p = pkv_cache_params_default();
    p.kv_heads = kvh;
    p.head_dim = dim;
    p.block_size = bs;
    p.dtype = qd;
    p.layout = layout;
    cr_assert_eq(pkv_cache_create(&p, c->pool, c->host, &c->cache), PKV_OK);
    cr_assert_eq(pkv_cache_get_geometry(c->cache, &c->g), PKV_OK);
    // Poison: 0x7f is NaN for both fp8 formats, and a huge scale (3.4e38) for int8.
    memset(pkv_cache_data(c->cache), 0x7f, (size_t)pkv_cache_arena_bytes(c->cache));
    // Per-tensor fp8 scales as calculate_kv_scales: max|x| / fp8 max (set below).
    c->tables = calloc((size_t)num_seqs * c->max_blocks, sizeof(int32_t));
    // Blocks in reverse order, so tables are not the identity.
    uint32_t next = nblocks - 1;
    for (uint32_t s = 0; s < num_seqs; s++) {
        uint32_t nb = ((uint32_t)lens[s] + bs - 1) / bs;
        for (uint32_t b = 0; b < c->max_blocks; b++)
            c->tables[s * c->max_blocks + b] = b < nb ? (int32_t)next-- : -1;
    }
    size_t n = (size_t)num_seqs * c->max_len * kvh * dim;
    c->korig = calloc(n, sizeof(float));
    c->vorig = calloc(n, sizeof(float));
    float kmax = 0.0f, vmax = 0.0f;
    for (size_t i = 0; i < n; i++) {
        c->korig[i] = outlier_value((uint32_t)(i % dim), outliers);
        c->vorig[i] = outlier_value((uint32_t)(i % dim), outliers) * 0.5f;
        kmax = fmaxf(kmax, fabsf(c->korig[i]));
        vmax = fmaxf(vmax, fabsf(c->vorig[i]));
    }
    c->qz.kv_dtype = qd;
    c->qz.k_scale = kmax / pkvi_quant_max(qd);
    c->qz.v_scale = vmax / pkvi_quant_max(qd);
    c->qz.scale_offset = c->g.scale_offset;
    c->qz.scale_head_stride = c->g.scale_head_stride;
    c->qz.scale_token_stride = c->g.scale_token_stride;
    // Write every sequence's tokens through the quantizing write, k/v in sh.dtype =
    // fp32 here (the write's input dtype is the shape's).
    pkv_attn_shape wsh = c->sh;
    wsh.dtype = PKV_DTYPE_F32;
    char *kc = pkv_cache_data(c->cache);
    for (uint32_t s = 0; s < num_seqs; s++) {
        for (uint32_t t = 0; t < (uint32_t)lens[s]; t++) {
            int64_t slot = (int64_t)c->tables[s * c->max_blocks + t / bs] * bs + t % bs;
            size_t off = (((size_t)s * c->max_len + t) * kvh) * dim;
            cr_assert_eq(pkv_attn_cache_write_quant_cpu(&wsh, &c->qz, 1, c->korig + off,
                                                        c->vorig + off, &slot, kc,
                                                        kc + c->g.kv_stride, c->g.block_stride,
                                                        c->g.head_stride, c->g.token_stride, bs,
                                                        nblocks),
                         PKV_OK);
        }
    }
    uint32_t rows = 0;
    for (uint32_t s = 0; s < num_seqs; s++) rows += (uint32_t)lens[s];
    size_t qn = (size_t)rows * heads * dim;
    c->q = calloc(qn, sizeof(float));
    c->qdt = calloc(qn, sizeof(float));
    for (size_t i = 0; i < qn; i++) {
        float x = (float)rng_unit() * 2.0f;
        if (qdt == PKV_DTYPE_F16) {
            ((uint16_t *)c->qdt)[i] = pkvi_f32_to_f16(x);
            x = pkvi_f16_to_f32(((uint16_t *)c->qdt)[i]);
        } else {
            ((float *)c->qdt)[i] = x;
        }
        c->q[i] = x;
    }
}

static void qcase_free(qcase *c) {
    pkv_cache_destroy(c->cache);
    pkv_backend_destroy(c->host);
    pkv_pool_destroy(c->pool);
    free(c->tables);
    free(c->korig);
    free(c->vorig);
    free(c->q);
    free(c->qdt);
}

// The dequantized value the cache holds for (seq s, token t, head h, dim d), read
// through the layout documented in cache.h.
static double stored(const qcase *c, int v, uint32_t s, uint32_t t, uint32_t h, uint32_t d) {
    const uint8_t *base = (const uint8_t *)pkv_cache_data(c->cache) + (v ? c->g.kv_stride : 0);
    size_t blk = (size_t)c->tables[s * c->max_blocks + t / c->bs] * c->g.block_stride;
    uint8_t byte = base[blk + h * c->g.head_stride + (t % c->bs) * c->g.token_stride + d];
    if (c->qd == PKV_DTYPE_INT8) {
        float sc;
        memcpy(&sc, base + blk + c->g.scale_offset + 4 * (h * c->bs + t % c->bs), 4);
        return (double)(int8_t)byte * sc;
    }
    return fp8_value(byte, c->qd == PKV_DTYPE_FP8_E4M3) * (v ? c->qz.v_scale : c->qz.k_scale);
}

static double orig(const qcase *c, int v, uint32_t s, uint32_t t, uint32_t h, uint32_t d) {
    const float *a = v ? c->vorig : c->korig;
    return a[(((size_t)s * c->max_len + t) * c->sh.num_kv_heads + h) * c->sh.head_dim + d];
}

// Attention of query row qrow (head hq) of sequence s over its first ctx tokens,
// from the stored (as_stored) or original values; also the derived bound's parts.
static double ref_attend(const qcase *c, int as_stored, uint32_t s, uint32_t ctx, const float *qrow,
                         uint32_t hq, uint32_t d_out, double *bound) {
    const uint32_t dim = c->sh.head_dim;
    const uint32_t h = hq / (c->sh.num_heads / c->sh.num_kv_heads);
    double mx = -INFINITY, sum = 0.0, acc = 0.0;
    double *sc = calloc(ctx, sizeof(double));
    double qabs = 0.0, dk = 0.0, dv = 0.0, vmax = 0.0;
    for (uint32_t d = 0; d < dim; d++) qabs += fabs(qrow[d]);
    for (uint32_t t = 0; t < ctx; t++) {
        double dot = 0.0;
        for (uint32_t d = 0; d < dim; d++) {
            double k = as_stored ? stored(c, 0, s, t, h, d) : orig(c, 0, s, t, h, d);
            dot += (double)qrow[d] * k;
            dk = fmax(dk, fabs(stored(c, 0, s, t, h, d) - orig(c, 0, s, t, h, d)));
            dv = fmax(dv, fabs(stored(c, 1, s, t, h, d) - orig(c, 1, s, t, h, d)));
            vmax = fmax(vmax, fabs(orig(c, 1, s, t, h, d)));
        }
        sc[t] = dot * c->sh.scale;
        mx = fmax(mx, sc[t]);
    }
    for (uint32_t t = 0; t < ctx; t++) {
        double e = exp(sc[t] - mx);
        sum += e;
        acc += e * (as_stored ? stored(c, 1, s, t, h, d_out) : orig(c, 1, s, t, h, d_out));
    }
    free(sc);
    double delta = c->sh.scale * qabs * dk;
    *bound = (exp(2 * delta) - 1) * vmax + dv;
    return acc / sum;
}

static double out_value(const qcase *c, const void *out, size_t i) {
    return c->sh.dtype == PKV_DTYPE_F16 ? pkvi_f16_to_f32(((const uint16_t *)out)[i])
                                        : ((const float *)out)[i];
}

static pkv_attn_paged_kv paged_of(const qcase *c) {
    const char *kc = pkv_cache_data(c->cache);
    pkv_attn_paged_kv kv = {kc, kc + c->g.kv_stride, c->g.block_stride, c->g.head_stride,
                            c->g.token_stride, c->bs, pkv_pool_capacity(c->pool), c->tables,
                            c->max_blocks, c->lens};
    return kv;
}

// Decode (last token of each sequence as the query) vs both references.
static void check_decode(qcase *c, double *max_err_orig) {
    pkv_attn_paged_kv kv = paged_of(c);
    const uint32_t H = c->sh.num_heads, D = c->sh.head_dim;
    size_t es = pkv_dtype_size(c->sh.dtype);
    void *out = calloc((size_t)c->num_seqs * H * D, es);
    cr_assert_eq(pkv_attn_decode_paged_quant_cpu(&c->sh, &c->qz, c->num_seqs, c->qdt, &kv, out),
                 PKV_OK);
    double u = c->sh.dtype == PKV_DTYPE_F16 ? ldexp(1.0, -11) : 0.0;
    double nonzero = 0.0;
    for (uint32_t s = 0; s < c->num_seqs; s++) {
        for (uint32_t h = 0; h < H; h++) {
            const float *qrow = c->q + ((size_t)s * H + h) * D;
            for (uint32_t d = 0; d < D; d++) {
                double got = out_value(c, out, ((size_t)s * H + h) * D + d);
                double bound;
                double ref = ref_attend(c, 1, s, (uint32_t)c->lens[s], qrow, h, d, &bound);
                cr_assert_leq(fabs(got - ref), ATOL + u * fabs(ref),
                              "%s s=%u h=%u d=%u: %g vs stored-ref %g", pkv_dtype_name(c->qd), s,
                              h, d, got, ref);
                double ref0 = ref_attend(c, 0, s, (uint32_t)c->lens[s], qrow, h, d, &bound);
                cr_assert_leq(fabs(got - ref0), bound + ATOL + u * fabs(ref0),
                              "%s: |%g - %g| over the derived bound %g", pkv_dtype_name(c->qd),
                              got, ref0, bound);
                nonzero = fmax(nonzero, fabs(ref - ref0));
                if (max_err_orig) *max_err_orig = fmax(*max_err_orig, fabs(got - ref0));
            }
        }
    }
    cr_assert_gt(nonzero, 0.0, "quantization must change something");
    free(out);
}

Test(quant, decode_paged_vs_references) {
    const int32_t lens[3] = {1, 37, 70};
    for (int i = 0; i < 3; i++) {
        for (int layout = 0; layout < 2; layout++) {
            for (int outl = 0; outl < 2; outl++) {
                qcase c;
                qcase_make(&c, qtypes[i], layout ? PKV_DTYPE_F16 : PKV_DTYPE_F32, 4, 2, 40, 16,
                           3, lens, layout ? PKV_LAYOUT_NHD : PKV_LAYOUT_HND, outl);
                check_decode(&c, NULL);
                qcase_free(&c);
            }
        }
    }
}

Test(quant, decode_gqa_mqa_odd_dims) {
    const int32_t lens[2] = {50, 9};
    const uint32_t shapes[][4] = {{8, 1, 128, 16}, {6, 3, 13, 5}, {2, 2, 64, 1}};
    for (int i = 0; i < 3; i++) {
        for (int sh = 0; sh < 3; sh++) {
            qcase c;
            qcase_make(&c, qtypes[i], PKV_DTYPE_F32, shapes[sh][0], shapes[sh][1], shapes[sh][2],
                       shapes[sh][3], 2, lens, PKV_LAYOUT_HND, 0);
            check_decode(&c, NULL);
            qcase_free(&c);
        }
    }
}

// Contiguous decode over the same bytes (a "cache" whose one block per sequence is
// its whole row) equals the paged decode bit for bit.
Test(quant, contig_equals_paged) {
    for (int i = 0; i < 3; i++) {
        const uint32_t H = 4, KVH = 2, D = 32, L = 45;
        const int32_t lens[2] = {45, 20};
        qcase c;
        qcase_make(&c, qtypes[i], PKV_DTYPE_F32, H, KVH, D, L, 2, lens, PKV_LAYOUT_HND, 1);
        pkv_attn_paged_kv kv = paged_of(&c);
        float *o1 = calloc(2 * H * D, sizeof(float));
        float *o2 = calloc(2 * H * D, sizeof(float));
        cr_assert_eq(pkv_attn_decode_paged_quant_cpu(&c.sh, &c.qz, 2, c.q, &kv, o1), PKV_OK);
        // Sequence s lives in block tables[s][0] (block_size = L): contiguous view of
        // the blocks in table order needs seq_stride = block_stride and a base per
        // sequence, so decode them one at a time.
        for (uint32_t s = 0; s < 2; s++) {
            const char *base = (const char *)kv.k_cache + (size_t)c.tables[s * c.max_blocks] * kv.block_stride;
            pkv_attn_contig_kv ck = {base, base + c.g.kv_stride, kv.block_stride, kv.head_stride,
                                     kv.token_stride, L, c.lens + s, NULL};
            cr_assert_eq(pkv_attn_decode_contig_quant_cpu(&c.sh, &c.qz, 1, c.q + s * H * D, &ck,
                                                          o2 + s * H * D),
                         PKV_OK);
        }
        cr_assert_eq(memcmp(o1, o2, 2 * H * D * sizeof(float)), 0, "%s", pkv_dtype_name(qtypes[i]));
        // One call with per-sequence row offsets (the blocks as carved rows) reads
        // the same bytes, scales included.
        const int64_t offs[2] = {(int64_t)c.tables[0] * (int64_t)kv.block_stride,
                                 (int64_t)c.tables[c.max_blocks] * (int64_t)kv.block_stride};
        pkv_attn_contig_kv carved = {kv.k_cache, kv.v_cache, 0, kv.head_stride, kv.token_stride,
                                     L, c.lens, offs};
        memset(o2, 0, 2 * H * D * sizeof(float));
        cr_assert_eq(pkv_attn_decode_contig_quant_cpu(&c.sh, &c.qz, 2, c.q, &carved, o2), PKV_OK);
        cr_assert_eq(memcmp(o1, o2, 2 * H * D * sizeof(float)), 0, "%s: seq_offsets",
                     pkv_dtype_name(qtypes[i]));
        free(o1);
        free(o2);
        qcase_free(&c);
    }
}

// The contiguous prefill (the runtime's 8-bit contiguous store) over the same
// bytes as carved rows equals the paged prefill bit for bit, with prompts that
// are a sequence's last tokens (chunked prefill) as well as whole sequences; its
// bad arguments are refused before anything is read.
Test(quant, prefill_contig_equals_paged) {
    for (int i = 0; i < 3; i++) {
        const uint32_t H = 8, KVH = 2, D = 40, L = 50;
        const int32_t lens[2] = {50, 23};
        qcase c;
        qcase_make(&c, qtypes[i], PKV_DTYPE_F16, H, KVH, D, L, 2, lens, PKV_LAYOUT_HND, 1);
        pkv_attn_paged_kv kv = paged_of(&c);
        const int32_t indptr[3] = {0, 17, 40}; // 17 of 50 tokens, then all 23
        const size_t bytes = 40 * H * D * 2;
        void *o1 = calloc(1, bytes), *o2 = calloc(1, bytes);
        cr_assert_eq(pkv_attn_prefill_paged_quant_cpu(&c.sh, &c.qz, 2, indptr, c.qdt, &kv, o1),
                     PKV_OK);
        const int64_t offs[2] = {(int64_t)c.tables[0] * (int64_t)kv.block_stride,
                                 (int64_t)c.tables[c.max_blocks] * (int64_t)kv.block_stride};
        pkv_attn_contig_kv ck = {kv.k_cache, kv.v_cache, 0, kv.head_stride, kv.token_stride,
                                 L, c.lens, offs};
        cr_assert_eq(pkv_attn_prefill_contig_quant_cpu(&c.sh, &c.qz, 2, indptr, c.qdt, &ck, o2),
                     PKV_OK);
        cr_assert_eq(memcmp(o1, o2, bytes), 0, "%s", pkv_dtype_name(qtypes[i]));
        // Bad input: no indptr, one not starting at 0, a prompt longer than its
        // sequence, a negative row offset, a zero fp8 scale / unknown kind.
        cr_assert_eq(pkv_attn_prefill_contig_quant_cpu(&c.sh, &c.qz, 2, NULL, c.qdt, &ck, o2),
                     PKV_ERR_INVALID_ARG);
        const int32_t bad_start[3] = {1, 17, 40}, too_long[3] = {0, 17, 41};
        cr_assert_eq(pkv_attn_prefill_contig_quant_cpu(&c.sh, &c.qz, 2, bad_start, c.qdt, &ck, o2),
                     PKV_ERR_INVALID_ARG);
        cr_assert_eq(pkv_attn_prefill_contig_quant_cpu(&c.sh, &c.qz, 2, too_long, c.qdt, &ck, o2),
                     PKV_ERR_INVALID_ARG);
        const int64_t neg[2] = {offs[0], -16};
        pkv_attn_contig_kv bad = ck;
        bad.seq_offsets = neg;
        cr_assert_eq(pkv_attn_prefill_contig_quant_cpu(&c.sh, &c.qz, 2, indptr, c.qdt, &bad, o2),
                     PKV_ERR_INVALID_ARG);
        pkv_attn_kv_quant bq = c.qz;
        bq.kv_dtype = PKV_DTYPE_F16;
        cr_assert_eq(pkv_attn_prefill_contig_quant_cpu(&c.sh, &bq, 2, indptr, c.qdt, &ck, o2),
                     PKV_ERR_INVALID_ARG);
        // The CUDA twin checks first too: head_dim 40 is not a CUDA one.
        cr_assert_eq(pkv_attn_prefill_contig_quant_cuda_ex(&c.sh, &c.qz, 2, indptr, 40, c.qdt,
                                                           &ck, o2, NULL),
                     PKV_ERR_UNSUPPORTED);
        free(o1);
        free(o2);
        qcase_free(&c);
    }
}

// The block size changes only the rows' addresses, never the sums: block 5 (seven
// block boundaries inside each 32-token tile, scales read per block) and one block
// per sequence give bit-identical outputs. head_dim 40 takes the 16-byte widening
// steps and the 8-byte tail, 13 the scalar tail.
Test(quant, block_size_does_not_change_output) {
    const int32_t lens[2] = {77, 40};
    const uint32_t dims[2] = {40, 13};
    for (int i = 0; i < 3; i++) {
        for (int di = 0; di < 2; di++) {
            const uint32_t H = 4, KVH = 2, D = dims[di];
            float *o[2];
            for (int b = 0; b < 2; b++) {
                qcase c;
                rng_state = 0x243f6a8885a308d3ull; // same K/V and q for both block sizes
                qcase_make(&c, qtypes[i], PKV_DTYPE_F32, H, KVH, D, b ? 80 : 5, 2, lens,
                           PKV_LAYOUT_HND, 1);
                pkv_attn_paged_kv kv = paged_of(&c);
                o[b] = calloc(2 * H * D, sizeof(float));
                cr_assert_eq(pkv_attn_decode_paged_quant_cpu(&c.sh, &c.qz, 2, c.q, &kv, o[b]),
                             PKV_OK);
                qcase_free(&c);
            }
            cr_assert_eq(memcmp(o[0], o[1], 2 * H * D * sizeof(float)), 0, "%s head_dim %u",
                         pkv_dtype_name(qtypes[i]), D);
            free(o[0]);
            free(o[1]);
        }
    }
}

// A stored e4m3 NaN code (S.1111.111) reads as NaN wherever it sits: in the
// sixteen-byte steps (whose widening leaves NaN to a per-row fix-up) and in the
// tail. A NaN in a K row makes that head's scores, hence its whole output, NaN;
// a NaN in a V row makes only its own channel NaN. MHA (fused loads) and GQA
// (rows widened once per group) both.
Test(quant, e4m3_nan_codes_read_as_nan) {
    const int32_t lens[1] = {37};
    const uint32_t kvhs[2] = {2, 1};
    const uint32_t dims[3] = {5, 16 + 3, 40 - 1}; // a channel in a 16-byte step, the tail
    for (int g = 0; g < 2; g++) {
        for (int v = 0; v < 2; v++) {
            for (int di = 0; di < 3; di++) {
                const uint32_t H = 2, KVH = kvhs[g], D = 40, bs = 16;
                qcase c;
                qcase_make(&c, PKV_DTYPE_FP8_E4M3, PKV_DTYPE_F32, H, KVH, D, bs, 1, lens,
                           PKV_LAYOUT_HND, 0);
                const uint32_t t = 20, h = 0;
                uint8_t *base = (uint8_t *)pkv_cache_data(c.cache) + (v ? c.g.kv_stride : 0);
                base[(size_t)c.tables[t / bs] * c.g.block_stride + h * c.g.head_stride +
                     (t % bs) * c.g.token_stride + dims[di]] = (di & 1) ? 0xff : 0x7f;
                pkv_attn_paged_kv kv = paged_of(&c);
                float *o = calloc(H * D, sizeof(float));
                cr_assert_eq(pkv_attn_decode_paged_quant_cpu(&c.sh, &c.qz, 1, c.q, &kv, o),
                             PKV_OK);
                // Query heads reading kv head 0: all of them under GQA, head 0 under MHA.
                const uint32_t readers = KVH == 1 ? H : 1;
                for (uint32_t q = 0; q < H; q++) {
                    for (uint32_t d = 0; d < D; d++) {
                        const int want = q < readers && (!v || d == dims[di]);
                        cr_assert_eq(isnan(o[q * D + d]) != 0, want,
                                     "%s NaN at channel %u, kv heads %u: out[%u][%u] = %g",
                                     v ? "V" : "K", dims[di], KVH, q, d, o[q * D + d]);
                    }
                }
                free(o);
                qcase_free(&c);
            }
        }
    }
}

// Every stored byte through the decode's widening (the AVX2 sixteen- and
// eight-byte steps and the scalar tail, on x86; the portable loops elsewhere), for
// each 8-bit format: four identical V rows hold the codes (rotated so that e4m3's
// NaN codes also land in the eight-byte step and the tail), K is zero, so every
// weight is 1 and out[d] is the code's value exactly (the sums 2r, 3r, 4r of a
// value of at most 4 significant bits are exact). MHA reads rows in the fused
// loops, GQA widens them once per group.
Test(quant, every_code_through_decode) {
    const int32_t lens[1] = {4};
    const uint32_t D = 256 + 8 + 3, rot[3] = {0, 121, 119};
    const uint32_t shapes[2][2] = {{2, 2}, {4, 1}}; // heads, kv heads
    for (int i = 0; i < 3; i++) {
        for (int sh = 0; sh < 2; sh++) {
            for (int r = 0; r < 3; r++) {
                const uint32_t H = shapes[sh][0], KVH = shapes[sh][1];
                qcase c;
                qcase_make(&c, qtypes[i], PKV_DTYPE_F32, H, KVH, D, 4, 1, lens, PKV_LAYOUT_HND, 0);
                c.qz.k_scale = c.qz.v_scale = 1.0f;
                uint8_t *blk = (uint8_t *)pkv_cache_data(c.cache) +
                               (size_t)c.tables[0] * c.g.block_stride;
                const float one = 1.0f;
                for (uint32_t h = 0; h < KVH; h++) {
                    for (uint32_t t = 0; t < 4; t++) {
                        uint8_t *k = blk + h * c.g.head_stride + t * c.g.token_stride;
                        uint8_t *v = k + c.g.kv_stride;
                        for (uint32_t d = 0; d < D; d++) {
                            k[d] = 0;
                            v[d] = (uint8_t)((d + rot[r]) % 256);
                        }
                        if (qtypes[i] == PKV_DTYPE_INT8) {
                            const size_t sc = c.g.scale_offset +
                                              (h * c.g.scale_head_stride + t * c.g.scale_token_stride) * 4;
                            memcpy(blk + sc, &one, 4);
                            memcpy(blk + c.g.kv_stride + sc, &one, 4);
                        }
                    }
                }
                pkv_attn_paged_kv kv = paged_of(&c);
                float *o = calloc((size_t)H * D, sizeof(float));
                cr_assert_eq(pkv_attn_decode_paged_quant_cpu(&c.sh, &c.qz, 1, c.q, &kv, o), PKV_OK);
                for (uint32_t q = 0; q < H; q++) {
                    for (uint32_t d = 0; d < D; d++) {
                        const uint8_t b = (uint8_t)((d + rot[r]) % 256);
                        const double want = qtypes[i] == PKV_DTYPE_INT8
                                                ? (double)(int8_t)b
                                                : fp8_value(b, qtypes[i] == PKV_DTYPE_FP8_E4M3);
                        const double got = o[(size_t)q * D + d];
                        cr_assert(isnan(want) ? isnan(got) : got == want,
                                  "%s heads %u/%u: byte %#x at channel %u reads %.9g, want %.9g",
                                  pkv_dtype_name(qtypes[i]), H, KVH, b, d, got, want);
                    }
                }
                free(o);
                qcase_free(&c);
            }
        }
    }
}

// Prefill: every token of each sequence is a query row over its causal prefix.
Test(quant, prefill_vs_reference) {
    for (int i = 0; i < 3; i++) {
        const int32_t lens[2] = {21, 34};
        qcase c;
        qcase_make(&c, qtypes[i], PKV_DTYPE_F32, 4, 2, 24, 8, 2, lens, PKV_LAYOUT_HND, 0);
        pkv_attn_paged_kv kv = paged_of(&c);
        const uint32_t H = 4, D = 24;
        int32_t indptr[3] = {0, 21, 55};
        float *out = calloc(55 * H * D, sizeof(float));
        cr_assert_eq(pkv_attn_prefill_paged_quant_cpu(&c.sh, &c.qz, 2, indptr, c.q, &kv, out),
                     PKV_OK);
        for (uint32_t s = 0; s < 2; s++) {
            for (uint32_t j = 0; j < (uint32_t)lens[s]; j++) {
                uint32_t r = (uint32_t)indptr[s] + j;
                for (uint32_t h = 0; h < H; h++) {
                    for (uint32_t d = 0; d < D; d += 5) {
                        double bound;
                        double ref = ref_attend(&c, 1, s, j + 1, c.q + ((size_t)r * H + h) * D, h,
                                                d, &bound);
                        double got = out[((size_t)r * H + h) * D + d];
                        cr_assert_leq(fabs(got - ref), ATOL, "%s row %u: %g vs %g",
                                      pkv_dtype_name(c.qd), r, got, ref);
                    }
                }
            }
        }
        free(out);
        qcase_free(&c);
    }
}

// ---------------------------------------------------------------- CoW, swap

// Copy-on-write through the sequence API and the cache's batched copy, then a
// transfer to a second (swap) cache and back: the child's decode over the copied
// block and the swapped-back blocks equals the parent's, because the scales moved.
Test(quant, cow_and_swap_keep_scales) {
    for (int i = 0; i < 3; i++) {
        const uint32_t H = 2, KVH = 2, D = 16, B = 4;
        pkv_pool *pool, *pool2;
        pkv_backend *host;
        pkv_cache *cache, *swap;
        pkv_seqset *set;
        cr_assert_eq(pkv_pool_create(8, &pool), PKV_OK);
        cr_assert_eq(pkv_pool_create(8, &pool2), PKV_OK);
        cr_assert_eq(pkv_backend_create_host(&host), PKV_OK);
        pkv_cache_params p = pkv_cache_params_default();
        p.num_layers = 2;
        p.kv_heads = KVH;
        p.head_dim = D;
        p.block_size = B;
        p.dtype = qtypes[i];
        cr_assert_eq(pkv_cache_create(&p, pool, host, &cache), PKV_OK);
        cr_assert_eq(pkv_cache_create(&p, pool2, host, &swap), PKV_OK);
        cr_assert_eq(pkv_seqset_create(pool, B, &set), PKV_OK);
        pkv_cache_geometry g;
        pkv_cache_get_geometry(cache, &g);
        pkv_attn_kv_quant qz = {qtypes[i], 0.01f, 0.02f, g.scale_offset, g.scale_head_stride,
                                g.scale_token_stride};
        pkv_attn_shape sh = {H, KVH, D, PKV_DTYPE_F32, 0.25f, 1};
        pkv_seq_id parent, child;
        int64_t slots[6];
        cr_assert_eq(pkv_seq_create(set, &parent), PKV_OK);
        cr_assert_eq(pkv_seq_append(set, parent, 6, slots), PKV_OK); // 1 full + 2 of 4
        float k[6 * KVH * D], v[6 * KVH * D];
        for (size_t j = 0; j < sizeof k / sizeof k[0]; j++) {
            k[j] = (float)rng_unit() * (1 + (float)(j % 5)); // rows of different ranges
            v[j] = (float)rng_unit();
        }
        for (uint32_t l = 0; l < 2; l++) {
            char *kc = (char *)pkv_cache_data(cache) + g.layer_stride * l;
            cr_assert_eq(pkv_attn_cache_write_quant_cpu(&sh, &qz, 6, k, v, slots, kc,
                                                        kc + g.kv_stride, g.block_stride,
                                                        g.head_stride, g.token_stride, B, 8),
                         PKV_OK);
        }
        cr_assert_eq(pkv_seq_fork(set, parent, &child), PKV_OK);
        int64_t cslot;
        cr_assert_eq(pkv_seq_append(set, child, 1, &cslot), PKV_OK); // CoW of the partial block
        cr_assert_eq(pkv_cache_apply_copies(cache, set, NULL), PKV_OK);
        int32_t pt[2], ct[2], lens[2] = {6, 6};
        uint32_t nb = 2;
        const pkv_block_id *blocks;
        cr_assert_eq(pkv_seq_block_table(set, parent, &blocks, &nb), PKV_OK);
        pt[0] = blocks[0];
        pt[1] = blocks[1];
        cr_assert_eq(pkv_seq_block_table(set, child, &blocks, &nb), PKV_OK);
        ct[0] = blocks[0];
        ct[1] = blocks[1];
        cr_assert_neq(pt[1], ct[1], "the partial block was copied");
        float q[H * D], o1[H * D], o2[H * D], o3[H * D];
        for (uint32_t j = 0; j < H * D; j++) q[j] = (float)rng_unit();
        for (uint32_t l = 0; l < 2; l++) {
            const char *kc = (const char *)pkv_cache_data(cache) + g.layer_stride * l;
            pkv_attn_paged_kv kv = {kc, kc + g.kv_stride, g.block_stride, g.head_stride,
                                    g.token_stride, B, 8, pt, 2, lens};
            cr_assert_eq(pkv_attn_decode_paged_quant_cpu(&sh, &qz, 1, q, &kv, o1), PKV_OK);
            kv.block_tables = ct;
            cr_assert_eq(pkv_attn_decode_paged_quant_cpu(&sh, &qz, 1, q, &kv, o2), PKV_OK);
            cr_assert_eq(memcmp(o1, o2, sizeof o1), 0, "CoW copy decodes as its source");
            // Swap out both parent blocks to blocks 5, 6 of the swap cache, poison the
            // originals, swap back into 3, 4 (free in the first pool's arena).
            pkv_block_copy out[2] = {{pt[0], 5}, {pt[1], 6}};
            pkv_block_copy in[2] = {{5, 3}, {6, 4}};
            if (l == 0) {
                cr_assert_eq(pkv_cache_transfer(swap, cache, out, 2, NULL), PKV_OK);
                cr_assert_eq(pkv_cache_transfer(cache, swap, in, 2, NULL), PKV_OK);
            }
            int32_t st[2] = {3, 4};
            kv.block_tables = st;
            cr_assert_eq(pkv_attn_decode_paged_quant_cpu(&sh, &qz, 1, q, &kv, o3), PKV_OK);
            cr_assert_eq(memcmp(o1, o3, sizeof o1), 0, "swapped blocks decode as before");
        }
        pkv_seqset_destroy(set);
        pkv_cache_destroy(swap);
        pkv_cache_destroy(cache);
        pkv_backend_destroy(host);
        pkv_pool_destroy(pool2);
        pkv_pool_destroy(pool);
    }
}

// ---------------------------------------------------------------- bad input

Test(quant, bad_arguments) {
    const int32_t lens[1] = {5};
    qcase c;
    qcase_make(&c, PKV_DTYPE_FP8_E4M3, PKV_DTYPE_F32, 2, 1, 16, 4, 1, lens, PKV_LAYOUT_HND, 0);
    pkv_attn_paged_kv kv = paged_of(&c);
    float out[32];
    pkv_attn_kv_quant bad = c.qz;
    bad.k_scale = 0.0f;
    cr_assert_eq(pkv_attn_decode_paged_quant_cpu(&c.sh, &bad, 1, c.q, &kv, out), PKV_ERR_INVALID_ARG);
    bad = c.qz;
    bad.v_scale = INFINITY;
    cr_assert_eq(pkv_attn_decode_paged_quant_cpu(&c.sh, &bad, 1, c.q, &kv, out), PKV_ERR_INVALID_ARG);
    bad = c.qz;
    bad.kv_dtype = PKV_DTYPE_F16;
    cr_assert_eq(pkv_attn_decode_paged_quant_cpu(&c.sh, &bad, 1, c.q, &kv, out), PKV_ERR_INVALID_ARG);
    cr_assert_eq(pkv_attn_decode_paged_quant_cpu(&c.sh, NULL, 1, c.q, &kv, out), PKV_ERR_INVALID_ARG);
    pkv_attn_shape s8 = c.sh;
    s8.dtype = PKV_DTYPE_INT8; // q and out cannot be 8-bit
    cr_assert_eq(pkv_attn_decode_paged_quant_cpu(&s8, &c.qz, 1, c.q, &kv, out), PKV_ERR_INVALID_ARG);
    int64_t slot = 1000;
    char *kc = pkv_cache_data(c.cache);
    cr_assert_eq(pkv_attn_cache_write_quant_cpu(&c.sh, &c.qz, 1, c.korig, c.vorig, &slot, kc,
                                                kc + c.g.kv_stride, c.g.block_stride,
                                                c.g.head_stride, c.g.token_stride, 4,
                                                pkv_pool_capacity(c.pool)),
                 PKV_ERR_INVALID_ARG, "slot out of range");
    // The CUDA twins run the same checks (with or without CUDA in the build): this
    // head_dim 16 is not a CUDA one, a zero scale is refused before any launch.
    cr_assert_eq(pkv_attn_decode_paged_quant_cuda(&c.sh, &c.qz, 1, c.q, &kv, out, NULL),
                 PKV_ERR_UNSUPPORTED);
    int32_t indptr[2] = {0, 1};
    cr_assert_eq(pkv_attn_prefill_paged_quant_cuda(&c.sh, &c.qz, 1, indptr, c.q, &kv, out, NULL),
                 PKV_ERR_UNSUPPORTED);
    slot = 0;
    bad = c.qz;
    bad.k_scale = 0.0f;
    cr_assert_eq(pkv_attn_cache_write_quant_cuda(&c.sh, &bad, 1, c.korig, c.vorig, &slot, kc,
                                                 kc + c.g.kv_stride, c.g.block_stride,
                                                 c.g.head_stride, c.g.token_stride, 4,
                                                 pkv_pool_capacity(c.pool), NULL),
                 PKV_ERR_INVALID_ARG);
    // The plain CPU writer refuses an 8-bit q/k/v dtype.
    cr_assert_eq(pkv_attn_cache_write_cpu(&s8, 1, c.korig, c.vorig, &slot, kc, kc + c.g.kv_stride,
                                          c.g.block_stride, c.g.head_stride, c.g.token_stride, 4,
                                          pkv_pool_capacity(c.pool)),
                 PKV_ERR_INVALID_ARG);
    qcase_free(&c);
}

// ---------------------------------------------------------------- runtime

#include "pkv/generate.h"
#include "pkv/model.h"

// The tiny model through pkv_generate with each 8-bit cache: it runs, the logits
// stay close to the fp32 cache's (teacher forcing is not needed for the first
// token: same prompt, so the prefill logits are compared directly), fp8 scales get
// calibrated by the first forward pass, and a negative scale is refused.
Test(quant, runtime_generate) {
    pkv_model_config cfg;
    cr_assert_eq(pkv_model_preset("tiny", &cfg), PKV_OK);
    pkv_model_params mp = pkv_model_params_default();
    mp.num_threads = 1;
    pkv_model *m;
    cr_assert_eq(pkv_model_create(&cfg, &mp, &m), PKV_OK);
    const int32_t prompt[8] = {1, 50, 7, 300, 22, 9, 411, 3};
    pkv_gen_request req = {prompt, 8};
    const uint32_t N = 12, V = cfg.vocab_size;
    int32_t t32[12], tq[12];
    float *l32 = calloc((size_t)N * V, sizeof(float)), *lq = calloc((size_t)N * V, sizeof(float));
    cr_assert(l32 && lq);
    pkv_gen_params gp = pkv_gen_params_default();
    gp.max_new_tokens = N;
    pkv_gen_output o32 = {t32, l32, 0, 0};
    cr_assert_eq(pkv_generate(m, &gp, 1, &req, &o32, NULL), PKV_OK);
    float *sc = calloc(2 * (size_t)cfg.num_layers, sizeof(float));
    for (int i = 0; i < 3; i++) {
        cr_assert_eq(pkv_model_set_kv_scales(m, sc), PKV_OK); // 0: recalibrate
        gp.kv_dtype = qtypes[i];
        pkv_gen_output oq = {tq, lq, 0, 0};
        cr_assert_eq(pkv_generate(m, &gp, 1, &req, &oq, NULL), PKV_OK, "%s", pkv_dtype_name(qtypes[i]));
        cr_assert_eq(oq.num_tokens, N);
        double worst = 0.0;
        for (uint32_t j = 0; j < V; j++) worst = fmax(worst, fabs(lq[j] - l32[j]));
        cr_assert_lt(worst, 0.05, "%s: first-token logits moved by %g", pkv_dtype_name(qtypes[i]), worst);
        float got[64];
        cr_assert_eq(pkv_model_get_kv_scales(m, got), PKV_OK);
        for (uint32_t l = 0; l < 2 * cfg.num_layers; l++) {
            if (qtypes[i] == PKV_DTYPE_INT8) cr_assert_eq(got[l], 0.0f, "int8 needs no tensor scale");
            else cr_assert_gt(got[l], 0.0f, "fp8 scales calibrated by the first pass");
        }
    }
    sc[0] = -1.0f;
    cr_assert_eq(pkv_model_set_kv_scales(m, sc), PKV_ERR_INVALID_ARG);
    // The 8-bit contiguous store against the paged one: tests/test_model_quant.c.
    free(sc);
    free(l32);
    free(lq);
    pkv_model_destroy(m);
}

// Decode with sh.num_threads = nt into a new buffer.
static void *decode_threads(qcase *c, uint32_t nt) {
    pkv_attn_paged_kv kv = paged_of(c);
    size_t bytes = (size_t)c->num_seqs * c->sh.num_heads * c->sh.head_dim *
                   pkv_dtype_size(c->sh.dtype);
    void *out = calloc(1, bytes);
    c->sh.num_threads = nt;
    cr_assert_eq(pkv_attn_decode_paged_quant_cpu(&c->sh, &c->qz, c->num_seqs, c->qdt, &kv, out),
                 PKV_OK);
    return out;
}

// A paged work item takes several adjacent kv heads when there are few threads
// to feed (one thread: every head of a row in one item, up to 64 KiB of rows per
// block; two threads and one sequence: two heads), one head when there are as
// many threads as (row, kv head) pairs. Each head's output is the same bits either
// way: GQA 1, 4 and 8, kv head counts 3 and 6 (not multiples of 2 or 4), both
// block layouts, block 5 and 16, lengths 1, 45 and 70.
Test(quant, kv_heads_per_item_do_not_change_output) {
    const int32_t lens[3] = {45, 1, 70};
    const uint32_t shapes[][4] = {{8, 8, 32, 16}, {24, 6, 40, 5}, {12, 3, 13, 16}, {32, 4, 64, 16}};
    for (int i = 0; i < 3; i++) {
        for (int sh = 0; sh < 4; sh++) {
            for (int layout = 0; layout < 2; layout++) {
                for (uint32_t seqs = 1; seqs <= 3; seqs += 2) {
                    qcase c;
                    qcase_make(&c, qtypes[i], PKV_DTYPE_F16, shapes[sh][0], shapes[sh][1],
                               shapes[sh][2], shapes[sh][3], seqs, lens,
                               layout ? PKV_LAYOUT_NHD : PKV_LAYOUT_HND, 1);
                    const uint32_t one_head = seqs * shapes[sh][1];
                    void *a = decode_threads(&c, one_head);
                    void *b = decode_threads(&c, 1);
                    void *d = decode_threads(&c, 2);
                    size_t bytes = (size_t)seqs * shapes[sh][0] * shapes[sh][2] * 2;
                    cr_assert_eq(memcmp(a, b, bytes), 0, "%s shape %d layout %d seqs %u: 1 thread",
                                 pkv_dtype_name(qtypes[i]), sh, layout, seqs);
                    cr_assert_eq(memcmp(a, d, bytes), 0, "%s shape %d layout %d seqs %u: 2 threads",
                                 pkv_dtype_name(qtypes[i]), sh, layout, seqs);
                    if (sh == 2 && seqs == 3) { // the smallest reference
                        c.sh.num_threads = 1;
                        check_decode(&c, NULL); // and the merged items match the references
                    }
                    free(a);
                    free(b);
                    free(d);
                    qcase_free(&c);
                }
            }
        }
    }
}

// SPDX-License-Identifier: MIT
// CPU attention over 8-bit KV caches (int8 with per-token scales, fp8 e4m3 / e5m2
// with per-tensor scales): the quantizing cache write, and decode / prefill that
// dequantize on the fly. Same math as attn_cpu.c (tiles of TILE_T tokens, online
// softmax in fp32, a GQA group of query heads per K/V row read), with the scales
// folded out of the inner loops: the score of token t is
//   kscale_t * (q' . k_t),  q' = q * softmax scale * (fp8: k_scale * 256 for e4m3)
// and its value row enters the accumulator with weight p_t * vscale_t, the fp8
// tensor scale being applied once to the output. So the inner loops only widen
// bytes to fp32 (vpmovsxbd / vcvtph2ps on AVX2) and fuse multiply-add.
// Invariant: no allocation; scratch on the calling thread's stack; every slot is
// checked before the first byte is written.
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC optimize("O3", "fp-contract=fast")
#endif

#include <math.h>
#include <stdint.h>
#include <string.h>
#ifdef _OPENMP
#include <omp.h>
#endif

#include "attn_internal.h"
#include "half.h"
#include "quant.h"

#define TILE_T 32u
#define MAX_GROUP PKVI_ATTN_CPU_MAX_GROUP
#define PF_STEPS 2u // software prefetch distance, in (tile, kv head) steps (as attn_cpu.c)

#if defined(__GNUC__) && !defined(__clang__) && defined(__x86_64__) && defined(__linux__)
#include <immintrin.h>
#define QX86 1
#define QAVX2 __attribute__((target("avx2,fma,f16c")))
#else
#define QX86 0
#endif

#if defined(__GNUC__)
#define QINLINE static inline __attribute__((always_inline))
#else
#define QINLINE static inline
#endif

enum { KIND_INT8 = 0, KIND_E4M3 = 1, KIND_E5M2 = 2 };

static int kind_of(pkv_dtype dt) {
    return dt == PKV_DTYPE_INT8 ? KIND_INT8 : dt == PKV_DTYPE_FP8_E4M3 ? KIND_E4M3 : KIND_E5M2;
}

// A stored byte as the fp32 that the inner loops use: the int8 value, or the fp8
// value / 256 (e4m3) or the fp8 value (e5m2); see quant.h.
QINLINE float raw1(uint8_t b, int kind) {
    if (kind == KIND_INT8) {
        return (float)(int8_t)b;
    }
    if (kind == KIND_E4M3) {
        return pkvi_e4m3_to_f32_div256(b);
    }
    return pkvi_f16_to_f32(pkvi_fp8_to_f16_bits(b, 0));
}

// Portable row kernels (any CPU): widen a row into buf, then plain fp32 loops
// with eight partial sums, which -O3 vectorizes.
QINLINE void raw_row(const uint8_t *src, uint32_t n, int kind, float *buf) {
    for (uint32_t i = 0; i < n; i++) {
        buf[i] = raw1(src[i], kind);
    }
}

QINLINE float dot_f(const float *a, const float *b, uint32_t n) {
    float part[8] = {0, 0, 0, 0, 0, 0, 0, 0};
    uint32_t i = 0;
    for (; i + 8 <= n; i += 8) {
        for (uint32_t j = 0; j < 8; j++) {
            part[j] += a[i + j] * b[i + j];
        }
    }
    float s = 0.0f;
    for (; i < n; i++) {
        s += a[i] * b[i];
    }
    return s + ((part[0] + part[4]) + (part[1] + part[5])) + ((part[2] + part[6]) + (part[3] + part[7]));
}

QINLINE void axpy_f(float *restrict y, float a, const float *restrict x, uint32_t n) {
    for (uint32_t i = 0; i < n; i++) {
        y[i] += a * x[i];
    }
}

#if QX86
// Eight stored bytes widened to fp32 lanes (the raw1 values).
QAVX2 QINLINE __m256 load8(const uint8_t *p, int kind) {
    __m128i b = _mm_loadl_epi64((const __m128i *)(const void *)p);
    if (kind == KIND_INT8) {
        return _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(b));
    }
    if (kind == KIND_E5M2) {
        return _mm256_cvtph_ps(_mm_slli_epi16(_mm_cvtepu8_epi16(b), 8));
    }
    // s.eeee.mmm -> s.0.eeee.mmm.0000000 as load16 does (see there). The e4m3 NaN
    // (eeee.mmm all ones) becomes 0x3f80 there; or-ing 0x7e00 into it makes an fp16 NaN.
    __m128i h = _mm_and_si128(_mm_slli_epi16(_mm_cvtepi8_epi16(b), 7), _mm_set1_epi16(-16385));
    __m128i nan = _mm_and_si128(
        _mm_cmpeq_epi16(_mm_and_si128(h, _mm_set1_epi16(0x7fff)), _mm_set1_epi16(0x3f80)),
        _mm_set1_epi16(0x7e00));
    return _mm256_cvtph_ps(_mm_or_si128(h, nan));
}

// Sixteen stored bytes widened to two groups of eight fp32 lanes: one 16-byte
// load, and the fp8 bit twiddling done once on sixteen 16-bit lanes instead of
// twice on eight (what the decode of a row costs is what limits e4m3 when the
// rows stream from memory at two threads). e4m3's NaN code (S.1111.111) is not
// fixed up per element here: it widens to a finite +-1.875 * 2^-8, and *nan
// collects max(byte | 0x80), which is 0xff iff a NaN code went by (two
// operations per sixteen bytes instead of four per eight); the caller then
// puts the NaNs back (e4m3_nan_seen, nan_fix). Rows without NaN, the only ones
// a cache write produces from finite input, cost nothing more.
QAVX2 QINLINE void load16(const uint8_t *p, int kind, __m256 *lo, __m256 *hi, __m128i *nan) {
    if (kind == KIND_INT8) { // vpmovsxbd from memory: no shuffle to split a 16-byte load
        *lo = load8(p, KIND_INT8);
        *hi = load8(p + 8, KIND_INT8);
        return;
    }
    __m128i b = _mm_loadu_si128((const __m128i *)(const void *)p);
    if (kind == KIND_E5M2) { // the byte is the high half of an fp16
        const __m128i z = _mm_setzero_si128();
        *lo = _mm256_cvtph_ps(_mm_unpacklo_epi8(z, b));
        *hi = _mm256_cvtph_ps(_mm_unpackhi_epi8(z, b));
        return;
    }
    *nan = _mm_max_epu8(*nan, _mm_or_si128(b, _mm_set1_epi8((char)0x80)));
    // s.eeee.mmm -> s.0.eeee.mmm.0000000 on all sixteen lanes: sign-extend each byte
    // to 16 bits and shift up 7, which puts the sign on bits 15 (wanted) and 14
    // (cleared; it is the top of fp16's five exponent bits, which e4m3's four
    // leave 0). Two operations where a zero-extension needs three (shift up 8,
    // arithmetic shift down 1, clear bit 14).
    __m256i h = _mm256_and_si256(_mm256_slli_epi16(_mm256_cvtepi8_epi16(b), 7),
                                 _mm256_set1_epi16(-16385));
    *lo = _mm256_cvtph_ps(_mm256_castsi256_si128(h));
    *hi = _mm256_cvtph_ps(_mm256_extracti128_si256(h, 1));
}

// Whether load16 saw an e4m3 NaN code (see there).
QAVX2 QINLINE int e4m3_nan_seen(__m128i nan) {
    return _mm_movemask_epi8(_mm_cmpeq_epi8(nan, _mm_set1_epi8(-1))) != 0;
}

// Puts back the NaNs load16 widened as finite numbers: y[i] = NaN wherever
// x[i] (i < n) is an e4m3 NaN code, as an exact widening would have made it (a
// NaN term makes a NaN sum whatever its weight).
static void nan_fix(const uint8_t *x, uint32_t n, float *y) {
    for (uint32_t i = 0; i < n; i++) {
        if ((x[i] & 0x7fu) == 0x7fu) {
            y[i] = NAN;
        }
    }
}

static int has_nan_code(const uint8_t *x, uint32_t n) {
    for (uint32_t i = 0; i < n; i++) {
        if ((x[i] & 0x7fu) == 0x7fu) {
            return 1;
        }
    }
    return 0;
}

QAVX2 QINLINE float hsum(__m256 v) {
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_shuffle_ps(s, s, 1));
    return _mm_cvtss_f32(s);
}

// out[r] = q . raw(k[r]) for four rows.
QAVX2 QINLINE void dot4_k(const float *q, const uint8_t *const *k, uint32_t n, int kind,
                          float *out) {
    __m256 a0 = _mm256_setzero_ps();
    __m256 a1 = a0;
    __m256 a2 = a0;
    __m256 a3 = a0;
    __m128i nan = _mm_setzero_si128();
    uint32_t i = 0;
    for (; i + 16 <= n; i += 16) { // the same order of sums as eight at a time
        const __m256 x0 = _mm256_loadu_ps(q + i);
        const __m256 x1 = _mm256_loadu_ps(q + i + 8);
        __m256 lo, hi;
        load16(k[0] + i, kind, &lo, &hi, &nan);
        a0 = _mm256_fmadd_ps(x1, hi, _mm256_fmadd_ps(x0, lo, a0));
        load16(k[1] + i, kind, &lo, &hi, &nan);
        a1 = _mm256_fmadd_ps(x1, hi, _mm256_fmadd_ps(x0, lo, a1));
        load16(k[2] + i, kind, &lo, &hi, &nan);
        a2 = _mm256_fmadd_ps(x1, hi, _mm256_fmadd_ps(x0, lo, a2));
        load16(k[3] + i, kind, &lo, &hi, &nan);
        a3 = _mm256_fmadd_ps(x1, hi, _mm256_fmadd_ps(x0, lo, a3));
    }
    for (; i + 8 <= n; i += 8) {
        __m256 x = _mm256_loadu_ps(q + i);
        a0 = _mm256_fmadd_ps(x, load8(k[0] + i, kind), a0);
        a1 = _mm256_fmadd_ps(x, load8(k[1] + i, kind), a1);
        a2 = _mm256_fmadd_ps(x, load8(k[2] + i, kind), a2);
        a3 = _mm256_fmadd_ps(x, load8(k[3] + i, kind), a3);
    }
    out[0] = hsum(a0);
    out[1] = hsum(a1);
    out[2] = hsum(a2);
    out[3] = hsum(a3);
    const uint32_t n16 = i - i % 16;
    for (; i < n; i++) {
        for (uint32_t r = 0; r < 4; r++) {
            out[r] += q[i] * raw1(k[r][i], kind);
        }
    }
    if (kind == KIND_E4M3 && e4m3_nan_seen(nan)) {
        for (uint32_t r = 0; r < 4; r++) {
            out[r] = has_nan_code(k[r], n16) ? NAN : out[r];
        }
    }
}

// y += sum_r p[r] raw(x[r]) for four rows.
QAVX2 QINLINE void axpy4_k(float *y, const float *p, const uint8_t *const *x, uint32_t n,
                           int kind) {
    const __m256 p0 = _mm256_set1_ps(p[0]);
    const __m256 p1 = _mm256_set1_ps(p[1]);
    const __m256 p2 = _mm256_set1_ps(p[2]);
    const __m256 p3 = _mm256_set1_ps(p[3]);
    __m128i nan = _mm_setzero_si128();
    uint32_t i = 0;
    for (; i + 16 <= n; i += 16) {
        __m256 a = _mm256_loadu_ps(y + i);
        __m256 b = _mm256_loadu_ps(y + i + 8);
        __m256 lo, hi;
        load16(x[0] + i, kind, &lo, &hi, &nan);
        a = _mm256_fmadd_ps(p0, lo, a);
        b = _mm256_fmadd_ps(p0, hi, b);
        load16(x[1] + i, kind, &lo, &hi, &nan);
        a = _mm256_fmadd_ps(p1, lo, a);
        b = _mm256_fmadd_ps(p1, hi, b);
        load16(x[2] + i, kind, &lo, &hi, &nan);
        a = _mm256_fmadd_ps(p2, lo, a);
        b = _mm256_fmadd_ps(p2, hi, b);
        load16(x[3] + i, kind, &lo, &hi, &nan);
        a = _mm256_fmadd_ps(p3, lo, a);
        b = _mm256_fmadd_ps(p3, hi, b);
        _mm256_storeu_ps(y + i, a);
        _mm256_storeu_ps(y + i + 8, b);
    }
    if (kind == KIND_E4M3 && e4m3_nan_seen(nan)) {
        for (uint32_t r = 0; r < 4; r++) {
            nan_fix(x[r], i, y);
        }
    }
    for (; i + 8 <= n; i += 8) {
        __m256 a = _mm256_loadu_ps(y + i);
        a = _mm256_fmadd_ps(p0, load8(x[0] + i, kind), a);
        a = _mm256_fmadd_ps(p1, load8(x[1] + i, kind), a);
        a = _mm256_fmadd_ps(p2, load8(x[2] + i, kind), a);
        a = _mm256_fmadd_ps(p3, load8(x[3] + i, kind), a);
        _mm256_storeu_ps(y + i, a);
    }
    for (; i < n; i++) {
        for (uint32_t r = 0; r < 4; r++) {
            y[i] += p[r] * raw1(x[r][i], kind);
        }
    }
}

// Four rows widened once into dst ([4][n] fp32): with a GQA group of several
// query heads the rows are then read from L1 by each head instead of widened again.
QAVX2 QINLINE void widen4_k(const uint8_t *const *x, uint32_t n, int kind, float *dst) {
    for (uint32_t r = 0; r < 4; r++) {
        __m128i nan = _mm_setzero_si128();
        uint32_t i = 0;
        for (; i + 16 <= n; i += 16) {
            __m256 lo, hi;
            load16(x[r] + i, kind, &lo, &hi, &nan);
            _mm256_storeu_ps(dst + (size_t)r * n + i, lo);
            _mm256_storeu_ps(dst + (size_t)r * n + i + 8, hi);
        }
        if (kind == KIND_E4M3 && e4m3_nan_seen(nan)) {
            nan_fix(x[r], i, dst + (size_t)r * n);
        }
        for (; i + 8 <= n; i += 8) {
            _mm256_storeu_ps(dst + (size_t)r * n + i, load8(x[r] + i, kind));
        }
        for (; i < n; i++) {
            dst[(size_t)r * n + i] = raw1(x[r][i], kind);
        }
    }
}

QAVX2 static void widen4_avx2(const uint8_t *const *x, uint32_t n, int kind, float *dst) {
    switch (kind) {
    case KIND_INT8: widen4_k(x, n, KIND_INT8, dst); break;
    case KIND_E4M3: widen4_k(x, n, KIND_E4M3, dst); break;
    default: widen4_k(x, n, KIND_E5M2, dst); break;
    }
}

// out[r] = q . x[r] for four fp32 rows [4][n].
QAVX2 static void dot4_f32(const float *q, const float *x, uint32_t n, float *out) {
    __m256 a0 = _mm256_setzero_ps();
    __m256 a1 = a0;
    __m256 a2 = a0;
    __m256 a3 = a0;
    uint32_t i = 0;
    for (; i + 8 <= n; i += 8) {
        __m256 v = _mm256_loadu_ps(q + i);
        a0 = _mm256_fmadd_ps(v, _mm256_loadu_ps(x + i), a0);
        a1 = _mm256_fmadd_ps(v, _mm256_loadu_ps(x + n + i), a1);
        a2 = _mm256_fmadd_ps(v, _mm256_loadu_ps(x + 2 * (size_t)n + i), a2);
        a3 = _mm256_fmadd_ps(v, _mm256_loadu_ps(x + 3 * (size_t)n + i), a3);
    }
    out[0] = hsum(a0);
    out[1] = hsum(a1);
    out[2] = hsum(a2);
    out[3] = hsum(a3);
    for (; i < n; i++) {
        for (uint32_t r = 0; r < 4; r++) {
            out[r] += q[i] * x[(size_t)r * n + i];
        }
    }
}

// y += sum_r p[r] x[r] for four fp32 rows [4][n].
QAVX2 static void axpy4_f32(float *y, const float *p, const float *x, uint32_t n) {
    const __m256 p0 = _mm256_set1_ps(p[0]);
    const __m256 p1 = _mm256_set1_ps(p[1]);
    const __m256 p2 = _mm256_set1_ps(p[2]);
    const __m256 p3 = _mm256_set1_ps(p[3]);
    uint32_t i = 0;
    for (; i + 8 <= n; i += 8) {
        __m256 a = _mm256_loadu_ps(y + i);
        a = _mm256_fmadd_ps(p0, _mm256_loadu_ps(x + i), a);
        a = _mm256_fmadd_ps(p1, _mm256_loadu_ps(x + n + i), a);
        a = _mm256_fmadd_ps(p2, _mm256_loadu_ps(x + 2 * (size_t)n + i), a);
        a = _mm256_fmadd_ps(p3, _mm256_loadu_ps(x + 3 * (size_t)n + i), a);
        _mm256_storeu_ps(y + i, a);
    }
    for (; i < n; i++) {
        for (uint32_t r = 0; r < 4; r++) {
            y[i] += p[r] * x[(size_t)r * n + i];
        }
    }
}

// The kind as a compile-time constant in each instance, so load8 has no branch.
QAVX2 static void dot4_avx2(const float *q, const uint8_t *const *k, uint32_t n, int kind,
                            float *out) {
    switch (kind) {
    case KIND_INT8: dot4_k(q, k, n, KIND_INT8, out); break;
    case KIND_E4M3: dot4_k(q, k, n, KIND_E4M3, out); break;
    default: dot4_k(q, k, n, KIND_E5M2, out); break;
    }
}

QAVX2 static void axpy4_avx2(float *y, const float *p, const uint8_t *const *x, uint32_t n,
                             int kind) {
    switch (kind) {
    case KIND_INT8: axpy4_k(y, p, x, n, KIND_INT8); break;
    case KIND_E4M3: axpy4_k(y, p, x, n, KIND_E4M3); break;
    default: axpy4_k(y, p, x, n, KIND_E5M2); break;
    }
}

static int cpu_has_avx2(void) {
    return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") &&
           __builtin_cpu_supports("f16c");
}
#else
static int cpu_has_avx2(void) { return 0; }
#endif

// q / out rows (fp32, fp16 or bf16) to and from fp32.
static void q_to_f32(pkv_dtype dt, const void *src, uint32_t n, float *dst) {
    const uint16_t *h = (const uint16_t *)src;
    if (dt == PKV_DTYPE_F16) {
        for (uint32_t i = 0; i < n; i++) {
            dst[i] = pkvi_f16_to_f32(h[i]);
        }
    } else if (dt == PKV_DTYPE_BF16) {
        for (uint32_t i = 0; i < n; i++) {
            dst[i] = pkvi_bf16_to_f32(h[i]);
        }
    } else {
        memcpy(dst, src, (size_t)n * sizeof(float));
    }
}

static void q_from_f32(pkv_dtype dt, const float *src, uint32_t n, void *dst) {
    uint16_t *h = (uint16_t *)dst;
    if (dt == PKV_DTYPE_F16) {
        for (uint32_t i = 0; i < n; i++) {
            h[i] = pkvi_f32_to_f16(src[i]);
        }
    } else if (dt == PKV_DTYPE_BF16) {
        for (uint32_t i = 0; i < n; i++) {
            h[i] = pkvi_f32_to_bf16(src[i]);
        }
    } else {
        memcpy(dst, src, (size_t)n * sizeof(float));
    }
}

// Where one (sequence, kv head)'s rows and scales are. table == NULL: contiguous.
typedef struct qview {
    const uint8_t *k, *v;   // token 0's row (contiguous) or the head inside block 0
    const uint8_t *ks, *vs; // int8: the scale of token 0 / of the head in block 0
    const int32_t *table;   // [blocks of this sequence] or NULL
    size_t block_stride;    // bytes (rows and scales move together)
    size_t token_stride;    // bytes
    size_t scale_token;     // bytes between tokens' scales
    size_t head_stride;     // bytes between kv heads' rows
    size_t scale_head;      // bytes between kv heads' scales
    uint32_t block_size;
    int int8;
} qview;

typedef struct qwork {
    float q[PKV_ATTN_CPU_MAX_HEAD_DIM];   // [heads x group][head_dim], scaled
    float acc[PKV_ATTN_CPU_MAX_HEAD_DIM]; // [heads x group][head_dim]
    float row[PKV_ATTN_CPU_MAX_HEAD_DIM]; // one widened row, or four ([4][head_dim], AVX2)
    float p[MAX_GROUP][TILE_T];
    float m[MAX_GROUP];
    float l[MAX_GROUP];
    float ksc[TILE_T]; // per-token K scales of the tile (1 for fp8)
    float vsc[TILE_T];
} qwork;

static inline float load_scale(const uint8_t *p) {
    float f;
    memcpy(&f, p, sizeof f); // the caller's scale_offset need not be 4-byte aligned
    return f;
}

// Row addresses (and int8 scales) of tokens t0..t0+n-1. The paged table is
// walked one block span at a time, as attn_cpu.c's row_addrs does: one table read
// and no division per block rather than per token, so the paged path costs the
// contiguous one's address arithmetic plus one step per block boundary.
static void rows_of(const qview *qv, uint32_t t0, uint32_t n, const uint8_t **kr,
                    const uint8_t **vr, float *ks, float *vs) {
    const uint32_t bs = qv->table ? qv->block_size : UINT32_MAX;
    uint32_t blk = qv->table ? t0 / bs : 0;
    uint32_t in = qv->table ? t0 % bs : t0;
    for (uint32_t i = 0; i < n;) {
        // Block ids are int32; widen before multiplying by the byte stride.
        const size_t base = qv->table ? (size_t)qv->table[blk] * qv->block_stride : 0;
        const uint32_t span = bs - in < n - i ? bs - in : n - i;
        const uint8_t *k = qv->k + base + (size_t)in * qv->token_stride;
        const uint8_t *v = qv->v + base + (size_t)in * qv->token_stride;
        for (uint32_t j = 0; j < span; j++) {
            kr[i + j] = k + (size_t)j * qv->token_stride;
            vr[i + j] = v + (size_t)j * qv->token_stride;
        }
        if (ks != NULL) {
            const size_t sc = base + (size_t)in * qv->scale_token;
            for (uint32_t j = 0; j < span; j++) {
                const size_t o = sc + (size_t)j * qv->scale_token;
                ks[i + j] = qv->int8 ? load_scale(qv->ks + o) : 1.0f;
                vs[i + j] = qv->int8 ? load_scale(qv->vs + o) : 1.0f;
            }
        }
        i += span;
        in = 0;
        blk++;
    }
}

// Prefetch the int8 scales of tokens t0..t0+n-1: a 64-byte line holds 16 of a
// head's 4-byte scales, and paged scales sit at the end of each block, where no
// hardware stream prefetcher follows them (fp8 has none).
static void prefetch_scales(const qview *qv, uint32_t t0, uint32_t n) {
#if defined(__GNUC__)
    if (!qv->int8) {
        return;
    }
    for (uint32_t t = t0; t < t0 + n; t += 16) {
        size_t o = (size_t)t * qv->scale_token;
        if (qv->table != NULL) {
            o = (size_t)qv->table[t / qv->block_size] * qv->block_stride +
                (size_t)(t % qv->block_size) * qv->scale_token;
        }
        __builtin_prefetch(qv->ks + o, 0, 3);
        __builtin_prefetch(qv->vs + o, 0, 3);
    }
#else
    (void)qv;
    (void)t0;
    (void)n;
#endif
}

#if QX86 // used by the AVX2 loops only
static inline void prefetch_row(const uint8_t *p, size_t bytes) {
#if defined(__GNUC__)
    for (size_t off = 0; off < bytes; off += 64) {
        __builtin_prefetch(p + off, 0, 3);
    }
#else
    (void)p;
    (void)bytes;
#endif
}
#endif

// qv moved to kv head h of the item (rows and int8 scales).
static qview head_view(const qview *qv, uint32_t h) {
    qview v = *qv;
    v.k += h * qv->head_stride;
    v.v += h * qv->head_stride;
    v.ks += h * qv->scale_head;
    v.vs += h * qv->scale_head;
    return v;
}

// out[g] = softmax(q[g] . K) V for heads * group consecutive query heads; query
// heads h * group .. h * group + group - 1 read kv head h of qv. As attn_cpu.c's
// attend: the tiles are walked once and, per tile, each kv head with its own
// running max, sum and accumulator (the same operations per head as one head
// per item), so a paged item reads a block's adjacent head rows back to back.
static void attend_q(const pkv_attn_shape *shape, const pkv_attn_kv_quant *qz, const qview *qv,
                     uint32_t len, const void *q, void *out, uint32_t group, uint32_t heads,
                     int avx2) {
    qwork w;
    const int kind = kind_of(qz->kv_dtype);
    const uint32_t d = shape->head_dim;
    const uint32_t nq = heads * group;
    const float bias = kind == KIND_E4M3 ? 256.0f : 1.0f;
    const float kmul = qv->int8 ? 1.0f : qz->k_scale * bias;
    const float vmul = qv->int8 ? 1.0f : qz->v_scale * bias;
    q_to_f32(shape->dtype, q, nq * d, w.q);
    const float qs = shape->scale * kmul;
    for (uint32_t i = 0; i < nq * d; i++) {
        w.q[i] *= qs;
    }
    memset(w.acc, 0, (size_t)nq * d * sizeof(float));
    for (uint32_t g = 0; g < nq; g++) {
        w.m[g] = -INFINITY;
        w.l[g] = 0.0f;
    }
    const uint8_t *kr[TILE_T];
    const uint8_t *vr[TILE_T];
    const uint8_t *kn[TILE_T];
    const uint8_t *vn[TILE_T];
    // Several query heads per row: widen each group of four rows once (fits the
    // row buffer while 4 d <= PKV_ATTN_CPU_MAX_HEAD_DIM); one head: fused loads.
    const int widen = avx2 && group > 1 && 4 * d <= PKV_ATTN_CPU_MAX_HEAD_DIM;
    (void)widen;
    for (uint32_t t0 = 0; t0 < len; t0 += TILE_T) {
        const uint32_t n = len - t0 < TILE_T ? len - t0 : TILE_T;
        for (uint32_t h = 0; h < heads; h++) {
            const qview hv = head_view(qv, h);
            float *const qh = w.q + (size_t)h * group * d;
            float *const acc = w.acc + (size_t)h * group * d;
            float (*const p)[TILE_T] = w.p + (size_t)h * group;
            float *const m = w.m + (size_t)h * group;
            float *const l = w.l + (size_t)h * group;
            rows_of(&hv, t0, n, kr, vr, w.ksc, w.vsc);
            // Prefetch PF_STEPS (tile, kv head) steps ahead, as attn_cpu.c.
            uint32_t nn = 0;
            const uint32_t ps = h + PF_STEPS;
            const uint32_t tp = t0 + ps / heads * TILE_T;
            if (tp < len) {
                const qview pv = head_view(qv, ps % heads);
                nn = len - tp < TILE_T ? len - tp : TILE_T;
                rows_of(&pv, tp, nn, kn, vn, NULL, NULL);
                prefetch_scales(&pv, tp, nn);
            }
            uint32_t i = 0;
#if QX86
            for (; widen && i + 4 <= n; i += 4) {
                for (uint32_t r = i; r < i + 4 && r < nn; r++) {
                    prefetch_row(kn[r], d);
                }
                widen4_avx2(kr + i, d, kind, w.row);
                for (uint32_t g = 0; g < group; g++) {
                    float s4[4];
                    dot4_f32(qh + (size_t)g * d, w.row, d, s4);
                    for (uint32_t r = 0; r < 4; r++) {
                        p[g][i + r] = s4[r] * w.ksc[i + r];
                    }
                }
            }
            for (; avx2 && i + 4 <= n; i += 4) {
                for (uint32_t r = i; r < i + 4 && r < nn; r++) {
                    prefetch_row(kn[r], d);
                }
                for (uint32_t g = 0; g < group; g++) {
                    float s4[4];
                    dot4_avx2(qh + (size_t)g * d, kr + i, d, kind, s4);
                    for (uint32_t r = 0; r < 4; r++) {
                        p[g][i + r] = s4[r] * w.ksc[i + r];
                    }
                }
            }
#endif
            for (; i < n; i++) {
                raw_row(kr[i], d, kind, w.row);
                for (uint32_t g = 0; g < group; g++) {
                    p[g][i] = dot_f(qh + (size_t)g * d, w.row, d) * w.ksc[i];
                }
            }
            for (uint32_t g = 0; g < group; g++) {
                float mx = m[g];
                for (uint32_t j = 0; j < n; j++) {
                    mx = p[g][j] > mx ? p[g][j] : mx;
                }
                if (mx != m[g]) {
                    float alpha = expf(m[g] - mx); // 0 on the first tile
                    for (uint32_t j = 0; j < d; j++) {
                        acc[(size_t)g * d + j] *= alpha;
                    }
                    l[g] *= alpha;
                    m[g] = mx;
                }
                float sum = 0.0f;
                for (uint32_t j = 0; j < n; j++) {
                    float e = expf(p[g][j] - mx);
                    sum += e;
                    p[g][j] = e * w.vsc[j]; // the row's V scale rides on its weight
                }
                l[g] += sum;
            }
            i = 0;
#if QX86
            for (; widen && i + 4 <= n; i += 4) {
                for (uint32_t r = i; r < i + 4 && r < nn; r++) {
                    prefetch_row(vn[r], d);
                }
                widen4_avx2(vr + i, d, kind, w.row);
                for (uint32_t g = 0; g < group; g++) {
                    const float p4[4] = {p[g][i], p[g][i + 1], p[g][i + 2], p[g][i + 3]};
                    axpy4_f32(acc + (size_t)g * d, p4, w.row, d);
                }
            }
            for (; avx2 && i + 4 <= n; i += 4) {
                for (uint32_t r = i; r < i + 4 && r < nn; r++) {
                    prefetch_row(vn[r], d);
                }
                for (uint32_t g = 0; g < group; g++) {
                    const float p4[4] = {p[g][i], p[g][i + 1], p[g][i + 2], p[g][i + 3]};
                    axpy4_avx2(acc + (size_t)g * d, p4, vr + i, d, kind);
                }
            }
#endif
            for (; i < n; i++) {
                raw_row(vr[i], d, kind, w.row);
                for (uint32_t g = 0; g < group; g++) {
                    axpy_f(acc + (size_t)g * d, p[g][i], w.row, d);
                }
            }
        }
    }
    for (uint32_t g = 0; g < nq; g++) {
        const float f = vmul / w.l[g];
        for (uint32_t j = 0; j < d; j++) {
            w.acc[(size_t)g * d + j] *= f;
        }
    }
    q_from_f32(shape->dtype, w.acc, nq * d, out);
}

static qview paged_qview(const pkv_attn_kv_quant *qz, const pkv_attn_paged_kv *kv, uint32_t s,
                         uint32_t kvh) {
    qview v;
    size_t head = (size_t)kvh * kv->head_stride;
    size_t sc = (size_t)qz->scale_offset + (size_t)kvh * qz->scale_head_stride * sizeof(float);
    v.k = (const uint8_t *)kv->k_cache + head;
    v.v = (const uint8_t *)kv->v_cache + head;
    v.ks = (const uint8_t *)kv->k_cache + sc;
    v.vs = (const uint8_t *)kv->v_cache + sc;
    v.table = kv->block_tables + (size_t)s * kv->max_blocks_per_seq;
    v.block_stride = kv->block_stride;
    v.token_stride = kv->token_stride;
    v.scale_token = qz->scale_token_stride * sizeof(float);
    v.head_stride = kv->head_stride;
    v.scale_head = qz->scale_head_stride * sizeof(float);
    v.block_size = kv->block_size;
    v.int8 = qz->kv_dtype == PKV_DTYPE_INT8;
    return v;
}

static qview contig_qview(const pkv_attn_kv_quant *qz, const pkv_attn_contig_kv *kv, uint32_t s,
                          uint32_t kvh) {
    qview v;
    size_t base = kv->seq_offsets ? (size_t)kv->seq_offsets[s] : (size_t)s * kv->seq_stride;
    size_t sc = base + (size_t)qz->scale_offset +
                (size_t)kvh * qz->scale_head_stride * sizeof(float);
    v.k = (const uint8_t *)kv->k_cache + base + (size_t)kvh * kv->head_stride;
    v.v = (const uint8_t *)kv->v_cache + base + (size_t)kvh * kv->head_stride;
    v.ks = (const uint8_t *)kv->k_cache + sc;
    v.vs = (const uint8_t *)kv->v_cache + sc;
    v.table = NULL;
    v.block_stride = 0;
    v.token_stride = kv->token_stride;
    v.scale_token = qz->scale_token_stride * sizeof(float);
    v.head_stride = kv->head_stride;
    v.scale_head = qz->scale_head_stride * sizeof(float);
    v.block_size = 1;
    v.int8 = qz->kv_dtype == PKV_DTYPE_INT8;
    return v;
}

// One work item per (row, kv heads, query sub-group). rows = sequences (decode) or
// packed prompt rows (prefill, q_indptr != NULL). A paged item takes the adjacent
// kv heads of pkvi_attn_cpu_item_heads (attn_cpu.c), a contiguous one a single head.
static void run_items(const pkv_attn_shape *shape, const pkv_attn_kv_quant *qz, uint32_t num_seqs, const int32_t *q_indptr,
                      uint64_t rows, const void *q, const pkv_attn_paged_kv *pkv,
                      const pkv_attn_contig_kv *ckv, void *out) {
    const size_t es = pkv_dtype_size(shape->dtype);
    const uint32_t group = pkvi_attn_cpu_item_group(shape);
    const uint32_t subs = shape->num_heads / shape->num_kv_heads / group;
    const size_t run = pkv ? pkvi_attn_cpu_head_run(pkv, 1, shape->head_dim) : 0;
    const uint32_t heads = pkvi_attn_cpu_item_heads(shape, group, rows, run);
    const uint32_t kv_items = shape->num_kv_heads / heads;
    const uint64_t items = rows * kv_items * subs;
    const int nt = pkvi_attn_cpu_thread_count(shape, items);
    const int avx2 = cpu_has_avx2();
    const int32_t *lens = pkv ? pkv->seq_lens : ckv->seq_lens;
    (void)nt;
#ifdef _OPENMP
#pragma omp parallel for schedule(dynamic, 1) num_threads(nt)
#endif
    for (int64_t it = 0; it < (int64_t)items; it++) {
        uint32_t sub = (uint32_t)((uint64_t)it % subs);
        uint32_t kvh = (uint32_t)((uint64_t)it / subs % kv_items) * heads;
        uint64_t r = (uint64_t)it / subs / kv_items;
        uint32_t s = (uint32_t)r;
        uint32_t len;
        if (q_indptr != NULL) {
            s = pkvi_attn_find_seq(q_indptr, num_seqs, (int64_t)r);
            // Row j of an n-token prompt is position len - n + j: it sees 0..that.
            int64_t n = (int64_t)q_indptr[s + 1] - q_indptr[s];
            len = (uint32_t)(lens[s] - n + ((int64_t)r - q_indptr[s]) + 1);
        } else {
            len = (uint32_t)lens[s];
        }
        uint32_t h0 = kvh * (shape->num_heads / shape->num_kv_heads) + sub * group;
        size_t off = ((size_t)r * shape->num_heads + h0) * shape->head_dim * es;
        qview v = pkv ? paged_qview(qz, pkv, s, kvh) : contig_qview(qz, ckv, s, kvh);
        attend_q(shape, qz, &v, len, (const char *)q + off, (char *)out + off, group, heads,
                 avx2);
    }
}

pkv_status pkv_attn_decode_paged_quant_cpu(const pkv_attn_shape *shape,
                                           const pkv_attn_kv_quant *quant, uint32_t num_seqs,
                                           const void *q, const pkv_attn_paged_kv *kv,
                                           void *out) {
    pkv_status st = pkvi_attn_check_cpu_paged(shape, quant, 1, kv, num_seqs, q, out, 0, NULL);
    if (st != PKV_OK) return st;
    run_items(shape, quant, num_seqs, NULL, num_seqs, q, kv, NULL, out);
    return PKV_OK;
}

pkv_status pkv_attn_decode_contig_quant_cpu(const pkv_attn_shape *shape,
                                            const pkv_attn_kv_quant *quant, uint32_t num_seqs,
                                            const void *q, const pkv_attn_contig_kv *kv,
                                            void *out) {
    pkv_status st = pkvi_attn_check_cpu_contig(shape, quant, 1, kv, num_seqs, q, out, 0, NULL);
    if (st != PKV_OK) return st;
    run_items(shape, quant, num_seqs, NULL, num_seqs, q, NULL, kv, out);
    return PKV_OK;
}

pkv_status pkv_attn_prefill_paged_quant_cpu(const pkv_attn_shape *shape,
                                            const pkv_attn_kv_quant *quant, uint32_t num_seqs,
                                            const int32_t *q_indptr, const void *q,
                                            const pkv_attn_paged_kv *kv, void *out) {
    pkv_status st = pkvi_attn_check_cpu_paged(shape, quant, 1, kv, num_seqs, q, out, 1, q_indptr);
    if (st != PKV_OK) return st;
    run_items(shape, quant, num_seqs, q_indptr, (uint64_t)q_indptr[num_seqs], q, kv, NULL, out);
    return PKV_OK;
}

pkv_status pkv_attn_prefill_contig_quant_cpu(const pkv_attn_shape *shape,
                                             const pkv_attn_kv_quant *quant, uint32_t num_seqs,
                                             const int32_t *q_indptr, const void *q,
                                             const pkv_attn_contig_kv *kv, void *out) {
    pkv_status st = pkvi_attn_check_cpu_contig(shape, quant, 1, kv, num_seqs, q, out, 1, q_indptr);
    if (st != PKV_OK) return st;
    run_items(shape, quant, num_seqs, q_indptr, (uint64_t)q_indptr[num_seqs], q, NULL, kv, out);
    return PKV_OK;
}

// Quantize one head row (src in shape->dtype) into dst, its int8 scale into *sc.
static void write_row(const pkv_attn_shape *shape, const pkv_attn_kv_quant *qz, const void *src,
                      float tensor_scale, uint8_t *dst, uint8_t *sc, float *tmp) {
    float row_scale = 0.0f;
    q_to_f32(shape->dtype, src, shape->head_dim, tmp);
    pkvi_quantize_row(qz->kv_dtype, tmp, shape->head_dim, tensor_scale, dst, &row_scale);
    if (qz->kv_dtype == PKV_DTYPE_INT8) {
        memcpy(sc, &row_scale, sizeof row_scale);
    }
}

pkv_status pkv_attn_cache_write_quant_cpu(const pkv_attn_shape *shape,
                                          const pkv_attn_kv_quant *qz, uint32_t num_tokens,
                                          const void *k, const void *v, const int64_t *slots,
                                          void *k_cache, void *v_cache, uint64_t block_stride,
                                          uint64_t head_stride, uint64_t token_stride,
                                          uint32_t block_size, uint32_t num_blocks) {
    pkv_status st = pkvi_attn_check_write_args(shape, k, v, slots, k_cache, v_cache, block_size,
                                               num_blocks);
    if (st == PKV_OK) st = pkvi_attn_check_quant(qz);
    if (st == PKV_OK && shape->head_dim > PKV_ATTN_CPU_MAX_HEAD_DIM) st = PKV_ERR_UNSUPPORTED;
    if (st != PKV_OK) return st;
    const uint64_t num_slots = (uint64_t)num_blocks * block_size;
    for (uint32_t i = 0; i < num_tokens; i++) {
        if (slots[i] >= 0 && (uint64_t)slots[i] >= num_slots) {
            return PKV_ERR_INVALID_ARG;
        }
    }
    const size_t row = (size_t)shape->head_dim * pkv_dtype_size(shape->dtype);
    const uint32_t kvh = shape->num_kv_heads;
    float tmp[PKV_ATTN_CPU_MAX_HEAD_DIM];
    for (uint32_t i = 0; i < num_tokens; i++) {
        if (slots[i] < 0) {
            continue; // padding
        }
        uint64_t blk = (uint64_t)slots[i] / block_size;
        uint64_t off = (uint64_t)slots[i] % block_size;
        for (uint32_t h = 0; h < kvh; h++) {
            size_t dst = (size_t)(blk * block_stride + h * head_stride + off * token_stride);
            size_t sc = (size_t)(blk * block_stride + qz->scale_offset +
                                 (h * qz->scale_head_stride + off * qz->scale_token_stride) *
                                     sizeof(float));
            size_t src = ((size_t)i * kvh + h) * row;
            write_row(shape, qz, (const char *)k + src, qz->k_scale, (uint8_t *)k_cache + dst,
                      (uint8_t *)k_cache + sc, tmp);
            write_row(shape, qz, (const char *)v + src, qz->v_scale, (uint8_t *)v_cache + dst,
                      (uint8_t *)v_cache + sc, tmp);
        }
    }
    return PKV_OK;
}

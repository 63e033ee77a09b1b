// SPDX-License-Identifier: MIT
// Row kernels of the CPU attention (included by attn_cpu.c only): K/V rows to
// fp32, dot products and axpy over head_dim, one row or four at a time, and the
// fused AVX2 + FMA + F16C versions for 16-bit rows. Every function is static and
// meant to be inlined into each target clone of attend. Invariant: the summation
// order depends only on n (and on the ISA path), never on where a row lives, so
// paged and contiguous callers get bit-identical results.
#ifndef PKV_ATTN_CPU_ROWS_H
#define PKV_ATTN_CPU_ROWS_H

#include <stdint.h>
#include <string.h>

#include "attn_internal.h"
#include "half.h"

// x86-64 with GCC: attend is also built for AVX2 + FMA machines (x86-64-v3,
// chosen at load time through an ifunc), and fp16 rows are converted with the
// F16C instruction when the CPU has it. Elsewhere: the portable loops only.
#if defined(__GNUC__) && !defined(__clang__) && defined(__x86_64__) && defined(__linux__)
#include <immintrin.h>
#define PKVI_X86 1
#define PKVI_CLONES __attribute__((target_clones("arch=x86-64-v3", "default")))
#else
#define PKVI_X86 0
#define PKVI_CLONES
#endif
// The row loops must be inlined into each clone of attend to get its ISA.
#if defined(__GNUC__)
#define PKVI_HOT static inline __attribute__((always_inline))
#else
#define PKVI_HOT static inline
#endif

#define CHUNK 8u      // fixed-width inner chunks that the compiler vectorizes

#if PKVI_X86
__attribute__((target("avx2,f16c"))) static void f16_to_f32_f16c(const uint16_t *h, uint32_t n,
                                                                 float *dst) {
    uint32_t i = 0;
    for (; i + 8 <= n; i += 8) {
        __m128i x = _mm_loadu_si128((const __m128i *)(const void *)(h + i));
        _mm256_storeu_ps(dst + i, _mm256_cvtph_ps(x));
    }
    for (; i < n; i++) {
        dst[i] = pkvi_f16_to_f32(h[i]);
    }
}
#endif

#if PKVI_X86
// Fused 16-bit row kernels for AVX2 + FMA + F16C CPUs: the K/V rows are widened
// to fp32 in registers (fp16 by vcvtph2ps, bf16 by a 16-bit shift), never stored.
#define PKVI_AVX2 __attribute__((target("avx2,fma,f16c")))

PKVI_AVX2 static inline __m256 load8_f16(const uint16_t *p) {
    return _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(const void *)p));
}

PKVI_AVX2 static inline __m256 load8_bf16(const uint16_t *p) {
    __m256i w = _mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i *)(const void *)p));
    return _mm256_castsi256_ps(_mm256_slli_epi32(w, 16));
}

PKVI_AVX2 static inline float hsum8(__m256 v) {
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_shuffle_ps(s, s, 1));
    return _mm_cvtss_f32(s);
}

static inline float load1_16(const uint16_t *p, int bf16) {
    return bf16 ? pkvi_bf16_to_f32(*p) : pkvi_f16_to_f32(*p);
}

// out[r] = q . k[r] for four 16-bit rows of n elements.
PKVI_AVX2 static void dot4_16(const float *q, const uint16_t *const *k, uint32_t n, int bf16,
                              float *out) {
    __m256 a0 = _mm256_setzero_ps();
    __m256 a1 = a0;
    __m256 a2 = a0;
    __m256 a3 = a0;
    uint32_t i = 0;
    if (bf16) {
        for (; i + 8 <= n; i += 8) {
            __m256 x = _mm256_loadu_ps(q + i);
            a0 = _mm256_fmadd_ps(x, load8_bf16(k[0] + i), a0);
            a1 = _mm256_fmadd_ps(x, load8_bf16(k[1] + i), a1);
            a2 = _mm256_fmadd_ps(x, load8_bf16(k[2] + i), a2);
            a3 = _mm256_fmadd_ps(x, load8_bf16(k[3] + i), a3);
        }
    } else {
        for (; i + 8 <= n; i += 8) {
            __m256 x = _mm256_loadu_ps(q + i);
            a0 = _mm256_fmadd_ps(x, load8_f16(k[0] + i), a0);
            a1 = _mm256_fmadd_ps(x, load8_f16(k[1] + i), a1);
            a2 = _mm256_fmadd_ps(x, load8_f16(k[2] + i), a2);
            a3 = _mm256_fmadd_ps(x, load8_f16(k[3] + i), a3);
        }
    }
    out[0] = hsum8(a0);
    out[1] = hsum8(a1);
    out[2] = hsum8(a2);
    out[3] = hsum8(a3);
    for (; i < n; i++) {
        for (uint32_t r = 0; r < 4; r++) {
            out[r] += q[i] * load1_16(k[r] + i, bf16);
        }
    }
}

// y += p[0] x[0] + ... + p[3] x[3] for four 16-bit rows of n elements.
PKVI_AVX2 static void axpy4_16(float *y, const float *p, const uint16_t *const *x, uint32_t n,
                               int bf16) {
    const __m256 p0 = _mm256_set1_ps(p[0]);
    const __m256 p1 = _mm256_set1_ps(p[1]);
    const __m256 p2 = _mm256_set1_ps(p[2]);
    const __m256 p3 = _mm256_set1_ps(p[3]);
    uint32_t i = 0;
    if (bf16) {
        for (; i + 8 <= n; i += 8) {
            __m256 a = _mm256_loadu_ps(y + i);
            a = _mm256_fmadd_ps(p0, load8_bf16(x[0] + i), a);
            a = _mm256_fmadd_ps(p1, load8_bf16(x[1] + i), a);
            a = _mm256_fmadd_ps(p2, load8_bf16(x[2] + i), a);
            a = _mm256_fmadd_ps(p3, load8_bf16(x[3] + i), a);
            _mm256_storeu_ps(y + i, a);
        }
    } else {
        for (; i + 8 <= n; i += 8) {
            __m256 a = _mm256_loadu_ps(y + i);
            a = _mm256_fmadd_ps(p0, load8_f16(x[0] + i), a);
            a = _mm256_fmadd_ps(p1, load8_f16(x[1] + i), a);
            a = _mm256_fmadd_ps(p2, load8_f16(x[2] + i), a);
            a = _mm256_fmadd_ps(p3, load8_f16(x[3] + i), a);
            _mm256_storeu_ps(y + i, a);
        }
    }
    for (; i < n; i++) {
        for (uint32_t r = 0; r < 4; r++) {
            y[i] += p[r] * load1_16(x[r] + i, bf16);
        }
    }
}
#endif

// Whether this CPU has AVX2 + FMA + F16C (hardware fp16 conversion and the fused
// 16-bit kernels); asked once per call.
static int cpu_has_f16c(void) {
#if PKVI_X86
    return __builtin_cpu_supports("f16c") && __builtin_cpu_supports("avx2") &&
           __builtin_cpu_supports("fma");
#else
    return 0;
#endif
}

PKVI_HOT void to_f32(pkv_dtype dt, const void *src, uint32_t n, float *dst, int f16c) {
    uint32_t i = 0;
#if PKVI_X86
    if (dt == PKV_DTYPE_F16 && f16c) {
        f16_to_f32_f16c((const uint16_t *)src, n, dst);
        return;
    }
#else
    (void)f16c;
#endif
    if (dt == PKV_DTYPE_F16) {
        const uint16_t *h = (const uint16_t *)src;
        for (; i + CHUNK <= n; i += CHUNK) {
            for (uint32_t j = 0; j < CHUNK; j++) {
                dst[i + j] = pkvi_f16_to_f32(h[i + j]);
            }
        }
        for (; i < n; i++) {
            dst[i] = pkvi_f16_to_f32(h[i]);
        }
    } else if (dt == PKV_DTYPE_BF16) {
        const uint16_t *h = (const uint16_t *)src;
        for (; i + CHUNK <= n; i += CHUNK) {
            for (uint32_t j = 0; j < CHUNK; j++) {
                dst[i + j] = pkvi_bf16_to_f32(h[i + j]);
            }
        }
        for (; i < n; i++) {
            dst[i] = pkvi_bf16_to_f32(h[i]);
        }
    } else {
        memcpy(dst, src, (size_t)n * sizeof(float));
    }
}

static void from_f32(pkv_dtype dt, const float *src, uint32_t n, void *dst) {
    if (dt == PKV_DTYPE_F16) {
        uint16_t *h = (uint16_t *)dst;
        for (uint32_t i = 0; i < n; i++) {
            h[i] = pkvi_f32_to_f16(src[i]);
        }
    } else if (dt == PKV_DTYPE_BF16) {
        uint16_t *h = (uint16_t *)dst;
        for (uint32_t i = 0; i < n; i++) {
            h[i] = pkvi_f32_to_bf16(src[i]);
        }
    } else {
        memcpy(dst, src, (size_t)n * sizeof(float));
    }
}

// A K or V row as fp32: fp32 rows are used in place, others converted into buf.
PKVI_HOT const float *row_f32(pkv_dtype dt, const void *src, uint32_t n, float *buf, int f16c) {
    if (dt == PKV_DTYPE_F32) {
        return (const float *)src;
    }
    to_f32(dt, src, n, buf, f16c);
    return buf;
}

#if defined(__GNUC__)
// Eight lanes as a GCC vector: each clone of attend lowers it to its own ISA
// (one AVX register, or two SSE ones). memcpy makes the loads unaligned-safe.
typedef float v8f __attribute__((vector_size(32)));

// Dot product with eight independent partial sums (a fixed order, so no
// -ffast-math is needed for SIMD).
PKVI_HOT float dot(const float *a, const float *b, uint32_t n) {
    v8f acc = {0, 0, 0, 0, 0, 0, 0, 0};
    uint32_t i = 0;
    for (; i + CHUNK <= n; i += CHUNK) {
        v8f x;
        v8f y;
        memcpy(&x, a + i, sizeof x);
        memcpy(&y, b + i, sizeof y);
        acc += x * y;
    }
    float s = 0.0f;
    for (; i < n; i++) {
        s += a[i] * b[i];
    }
    return s + ((acc[0] + acc[4]) + (acc[1] + acc[5])) + ((acc[2] + acc[6]) + (acc[3] + acc[7]));
}
#else
PKVI_HOT float dot(const float *a, const float *b, uint32_t n) {
    float part[CHUNK] = {0};
    uint32_t i = 0;
    for (; i + CHUNK <= n; i += CHUNK) {
        for (uint32_t j = 0; j < CHUNK; j++) {
            part[j] += a[i + j] * b[i + j];
        }
    }
    float s = 0.0f;
    for (; i < n; i++) {
        s += a[i] * b[i];
    }
    for (uint32_t j = 0; j < CHUNK; j++) {
        s += part[j];
    }
    return s;
}
#endif

// Four K rows against one query: the query is loaded once per four rows.
PKVI_HOT void dot4(const float *q, const float *const *k, uint32_t n, float *out) {
#if defined(__GNUC__)
    v8f a0 = {0, 0, 0, 0, 0, 0, 0, 0};
    v8f a1 = a0;
    v8f a2 = a0;
    v8f a3 = a0;
    uint32_t i = 0;
    for (; i + CHUNK <= n; i += CHUNK) {
        v8f x;
        v8f y0;
        v8f y1;
        v8f y2;
        v8f y3;
        memcpy(&x, q + i, sizeof x);
        memcpy(&y0, k[0] + i, sizeof x);
        memcpy(&y1, k[1] + i, sizeof x);
        memcpy(&y2, k[2] + i, sizeof x);
        memcpy(&y3, k[3] + i, sizeof x);
        a0 += x * y0;
        a1 += x * y1;
        a2 += x * y2;
        a3 += x * y3;
    }
    const v8f *a[4] = {&a0, &a1, &a2, &a3};
    for (uint32_t r = 0; r < 4; r++) {
        const v8f v = *a[r];
        float s = 0.0f;
        for (uint32_t j = i; j < n; j++) {
            s += q[j] * k[r][j];
        }
        out[r] = s + ((v[0] + v[4]) + (v[1] + v[5])) + ((v[2] + v[6]) + (v[3] + v[7]));
    }
#else
    for (uint32_t r = 0; r < 4; r++) {
        out[r] = dot(q, k[r], n);
    }
#endif
}

// y += p[0] x[0] + ... + p[3] x[3]: y is loaded and stored once per four rows.
PKVI_HOT void axpy4(float *restrict y, const float *p, const float *const *x, uint32_t n) {
    const float p0 = p[0];
    const float p1 = p[1];
    const float p2 = p[2];
    const float p3 = p[3];
    const float *x0 = x[0];
    const float *x1 = x[1];
    const float *x2 = x[2];
    const float *x3 = x[3];
    uint32_t i = 0;
    for (; i + CHUNK <= n; i += CHUNK) {
        for (uint32_t j = 0; j < CHUNK; j++) {
            y[i + j] += ((p0 * x0[i + j] + p1 * x1[i + j]) + (p2 * x2[i + j] + p3 * x3[i + j]));
        }
    }
    for (; i < n; i++) {
        y[i] += ((p0 * x0[i] + p1 * x1[i]) + (p2 * x2[i] + p3 * x3[i]));
    }
}

PKVI_HOT void axpy(float *restrict y, float a, const float *restrict x, uint32_t n) {
    uint32_t i = 0;
    for (; i + CHUNK <= n; i += CHUNK) {
        for (uint32_t j = 0; j < CHUNK; j++) {
            y[i + j] += a * x[i + j];
        }
    }
    for (; i < n; i++) {
        y[i] += a * x[i];
    }
}

PKVI_HOT void scale_row(float *y, float a, uint32_t n) {
    for (uint32_t i = 0; i < n; i++) {
        y[i] *= a;
    }
}

#endif // PKV_ATTN_CPU_ROWS_H

// SPDX-License-Identifier: MIT
// 8-bit KV element codecs for the CPU paths (attention, runtime, tests): symmetric
// int8 with a per-row scale, OCP fp8 e4m3fn and e5m2. Internal header, plain C11,
// static inline.
// Invariants (tests/test_quant.c checks each):
// - fp8 encode rounds to nearest, ties to even, subnormals included; finite
//   overflow and +-inf saturate to +-max (448 / 57344: CUDA's __NV_SATFINITE, what
//   vLLM and FlashInfer use for the KV cache); NaN encodes as NaN; -0 keeps its sign.
// - fp8 decode is exact. The SIMD paths go through fp16 bit patterns: e5m2 is the
//   high byte of an fp16, e4m3's byte shifted left by 7 is an fp16 equal to the
//   value / 256 (vcvtph2ps, the 256 folded into a scale); the scalar e4m3 decode
//   builds the same value / 256 as fp32 bits directly (cheaper than widening fp16).
// - int8: q = rint(x / s), s = max|x| / 127, |q| <= 127 (-128 is never written);
//   |x - q s| <= s / 2 (+ the rounding of s itself, for subnormal rows). A zero
//   row has s = 0; a row with a NaN or inf has s = NaN.
#ifndef PKV_ATTENTION_QUANT_H
#define PKV_ATTENTION_QUANT_H

#include <math.h>
#include <stdint.h>

#include "half.h"
#include "pkv/cache.h"

#define PKVI_FP8_E4M3_MAX 448.0f
#define PKVI_FP8_E5M2_MAX 57344.0f
#define PKVI_INT8_MAX 127.0f

// The largest finite value of an 8-bit dtype (127 for int8).
static inline float pkvi_quant_max(pkv_dtype dt) {
    return dt == PKV_DTYPE_FP8_E4M3   ? PKVI_FP8_E4M3_MAX
           : dt == PKV_DTYPE_FP8_E5M2 ? PKVI_FP8_E5M2_MAX
                                      : PKVI_INT8_MAX;
}

// fp32 -> fp8. e4m3: 1 sign, 4 exponent (bias 7), 3 mantissa bits; e5m2: 5 (bias
// 15) and 2. Round to nearest even on the fp32 bits, rebias the exponent.
static inline uint8_t pkvi_f32_to_fp8(float f, int e4m3) {
    uint32_t x = pkvi_f32_bits(f);
    uint8_t sign = (uint8_t)((x >> 24) & 0x80u);
    uint32_t ax = x & 0x7fffffffu;
    const uint32_t mbits = e4m3 ? 3u : 2u;
    const int bias = e4m3 ? 7 : 15;
    if (ax > 0x7f800000u) {
        return (uint8_t)(sign | (e4m3 ? 0x7fu : 0x7eu)); // NaN
    }
    const float a = pkvi_bits_f32(ax);
    if (a >= (e4m3 ? PKVI_FP8_E4M3_MAX : PKVI_FP8_E5M2_MAX)) {
        return (uint8_t)(sign | (e4m3 ? 0x7eu : 0x7bu)); // saturate (inf too)
    }
    const float min_normal = e4m3 ? 0x1p-6f : 0x1p-14f;
    if (a < min_normal) {
        // Subnormal step 2^(1 - bias - mbits); rintf rounds ties to even. A result
        // of 2^mbits is the smallest normal, whose code is exactly that integer.
        float q = rintf(a * (e4m3 ? 0x1p9f : 0x1p16f));
        return (uint8_t)(sign | (uint8_t)q);
    }
    const uint32_t shift = 23u - mbits;
    ax += (1u << (shift - 1u)) - 1u + ((ax >> shift) & 1u); // carry may bump the exponent
    uint32_t e = (ax >> 23) + (uint32_t)bias - 127u; // >= 1: a is normal in fp8
    uint32_t m = (ax >> shift) & ((1u << mbits) - 1u);
    return (uint8_t)(sign | (e << mbits) | m);
}

// The fp16 bit pattern of an fp8 byte: e5m2 exactly; e4m3 scaled by 2^-8, with
// the e4m3 NaN (S.1111.111) mapped to an fp16 NaN.
static inline uint16_t pkvi_fp8_to_f16_bits(uint8_t b, int e4m3) {
    if (!e4m3) {
        return (uint16_t)((uint16_t)b << 8);
    }
    uint16_t sign = (uint16_t)((b & 0x80u) << 8);
    uint16_t mag = (uint16_t)((b & 0x7fu) << 7);
    return (uint16_t)(sign | mag | (mag == 0x3f80u ? 0x7e00u : 0u));
}

// What pkvi_fp8_to_f16_bits's fp16 must be multiplied by: 256 for e4m3, 1 for e5m2.
static inline float pkvi_fp8_bias(int e4m3) {
    return e4m3 ? 256.0f : 1.0f;
}

// An e4m3 byte's value / 256 (pkvi_fp8_to_f16_bits's fp16, widened), built as fp32
// bits directly rather than through the fp16 widening: a normal code's exponent
// and mantissa fields move up 20 bits and the exponent is rebiased by
// 127 - 7 - 8 = 112; a subnormal one (exponent field 0) is its 3-bit mantissa
// times 2^-9 / 256, an exact product; S.1111.111 is NaN. Branch-free selects.
static inline float pkvi_e4m3_to_f32_div256(uint8_t b) {
    const uint32_t mag = b & 0x7fu;
    const uint32_t normal = (mag << 20) + (112u << 23);
    const uint32_t sub = pkvi_f32_bits((float)mag * 0x1p-17f);
    uint32_t bits = mag >= 8u ? normal : sub;
    bits = mag == 0x7fu ? 0x7fc00000u : bits;
    return pkvi_bits_f32(bits | (uint32_t)(b & 0x80u) << 24);
}

static inline float pkvi_fp8_to_f32(uint8_t b, int e4m3) {
    if (e4m3) {
        return pkvi_e4m3_to_f32_div256(b) * 256.0f; // exact: a power of two, |x| <= 448
    }
    return pkvi_f16_to_f32(pkvi_fp8_to_f16_bits(b, 0));
}

// The int8 scale of a row of n values: max|x| / 127; 0 for a zero row, NaN if a
// value is NaN or infinite.
static inline float pkvi_int8_row_scale(const float *x, uint32_t n) {
    float amax = 0.0f;
    int bad = 0;
    for (uint32_t i = 0; i < n; i++) {
        float a = fabsf(x[i]);
        bad |= !(a <= 3.4028235e38f); // NaN or inf
        amax = a > amax ? a : amax;
    }
    return bad ? NAN : amax / PKVI_INT8_MAX;
}

// One value to int8 under scale s (finite, > 0): rint(x / s) clamped to +-127.
static inline int8_t pkvi_f32_to_int8(float x, float s) {
    float q = rintf(x / s);
    q = q > PKVI_INT8_MAX ? PKVI_INT8_MAX : q;
    q = q < -PKVI_INT8_MAX ? -PKVI_INT8_MAX : q;
    return (int8_t)q;
}

// Quantize a row of n fp32 values into dst (n bytes). int8: writes the row's
// scale to *row_scale (see pkvi_int8_row_scale) and q = x / it (0 for a zero or
// non-finite row; the NaN scale marks the latter). fp8: x / tensor_scale.
static inline void pkvi_quantize_row(pkv_dtype dt, const float *x, uint32_t n,
                                     float tensor_scale, uint8_t *dst, float *row_scale) {
    if (dt == PKV_DTYPE_INT8) {
        float s = pkvi_int8_row_scale(x, n);
        *row_scale = s;
        int ok = s > 0.0f; // false for 0 and NaN
        for (uint32_t i = 0; i < n; i++) {
            dst[i] = (uint8_t)(ok ? pkvi_f32_to_int8(x[i], s) : 0);
        }
        return;
    }
    const int e4m3 = dt == PKV_DTYPE_FP8_E4M3;
    for (uint32_t i = 0; i < n; i++) {
        dst[i] = pkvi_f32_to_fp8(x[i] / tensor_scale, e4m3);
    }
}

// The inverse: dst[i] = the dequantized value (scale: the row's for int8, the
// tensor's for fp8).
static inline void pkvi_dequantize_row(pkv_dtype dt, const uint8_t *src, uint32_t n, float scale,
                                       float *dst) {
    if (dt == PKV_DTYPE_INT8) {
        for (uint32_t i = 0; i < n; i++) {
            dst[i] = (float)(int8_t)src[i] * scale;
        }
        return;
    }
    const int e4m3 = dt == PKV_DTYPE_FP8_E4M3;
    for (uint32_t i = 0; i < n; i++) {
        dst[i] = pkvi_fp8_to_f32(src[i], e4m3) * scale;
    }
}

#endif // PKV_ATTENTION_QUANT_H

// SPDX-License-Identifier: MIT
// fp16 / bf16 <-> fp32 conversion for the CPU paths (attention, runtime, tests).
// Internal header: plain C11, static inline, no intrinsics, so that the compiler
// can vectorize loops that call these (every branch is a select on integers).
// Invariant: fp32 -> fp16/bf16 rounds to nearest, ties to even; overflow gives
// +-inf, NaN stays NaN (quiet), fp16 subnormals are produced and read exactly.
#ifndef PKV_ATTENTION_HALF_H
#define PKV_ATTENTION_HALF_H

#include <stdint.h>
#include <string.h>

static inline uint32_t pkvi_f32_bits(float f) {
    uint32_t u;
    memcpy(&u, &f, sizeof u);
    return u;
}

static inline float pkvi_bits_f32(uint32_t u) {
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
}

// fp16 -> fp32, exact, and without fp32 subnormal arithmetic (which costs ~100
// cycles per operation on x86): normal values only need the exponent rebiased
// by 127 - 15 = 112 (twice for inf/NaN, to reach 255); a subnormal m * 2^-24 is
// computed as (0.5 + m * 2^-24) - 0.5, both normal fp32 numbers.
static inline float pkvi_f16_to_f32(uint16_t h) {
    uint32_t em = h & 0x7fffu;
    uint32_t sign = (uint32_t)(h & 0x8000u) << 16;
    // All-ones masks instead of ?: so that loops calling this stay branch-free.
    uint32_t is_special = 0u - (uint32_t)(em >= 0x7c00u);
    uint32_t is_sub = 0u - (uint32_t)(em < 0x400u);
    uint32_t norm = (em << 13) + (112u << 23) + (is_special & (112u << 23));
    uint32_t sub = pkvi_f32_bits(pkvi_bits_f32(0x3f000000u | em) - 0.5f);
    return pkvi_bits_f32(((sub & is_sub) | (norm & ~is_sub)) | sign);
}

// fp32 -> fp16, round to nearest even.
static inline uint16_t pkvi_f32_to_f16(float f) {
    uint32_t x = pkvi_f32_bits(f);
    uint32_t sign = (x >> 16) & 0x8000u;
    uint32_t ax = x & 0x7fffffffu;
    if (ax > 0x7f800000u) {
        return (uint16_t)(sign | 0x7e00u | ((ax >> 13) & 0x3ffu)); // quiet NaN
    }
    if (ax >= 0x477ff000u) { // >= 65520 (the tie above 65504) rounds to inf
        return (uint16_t)(sign | 0x7c00u);
    }
    if (ax < 0x38800000u) { // below 2^-14: fp16 subnormal or zero
        // Adding 0.5 (whose ulp is 2^-24, the fp16 subnormal step) lets the FPU
        // round |f| / 2^-24 to an integer with ties to even in the low bits.
        float t = pkvi_bits_f32(ax) + 0.5f;
        return (uint16_t)(sign | (pkvi_f32_bits(t) - 0x3f000000u));
    }
    uint32_t odd = (ax >> 13) & 1u;
    ax += 0xc8000fffu + odd; // rebias exponent by (15 - 127) and round half to even
    return (uint16_t)(sign | (ax >> 13));
}

static inline float pkvi_bf16_to_f32(uint16_t h) {
    return pkvi_bits_f32((uint32_t)h << 16);
}

// fp32 -> bf16, round to nearest even; NaN stays a quiet NaN.
static inline uint16_t pkvi_f32_to_bf16(float f) {
    uint32_t x = pkvi_f32_bits(f);
    if ((x & 0x7fffffffu) > 0x7f800000u) {
        return (uint16_t)((x >> 16) | 0x40u);
    }
    x += 0x7fffu + ((x >> 16) & 1u);
    return (uint16_t)(x >> 16);
}

#endif // PKV_ATTENTION_HALF_H

// SPDX-License-Identifier: MIT
// What the kernel-against-CPU check programs of tests/emu share (quant_check.c,
// window_check.c): a seeded generator, dtype stores and loads through the
// library's own conversions, device uploads and a CHECK that counts a failure and
// leaves the case. Built against the emulator (suite emu) and the real runtime
// (suite cuda) alike, so only the CUDA runtime API is used.
#ifndef PKV_EMU_CHECK_UTIL_H
#define PKV_EMU_CHECK_UTIL_H

#include <stdint.h>
#include <stdio.h>

#include <cuda_runtime.h>

#include "pkv/cache.h"
#include "src/attention/half.h"

static uint64_t rng = 0x2545f4914f6cdd1dull;

// xorshift64; its shifts wrap on purpose (`rnd` is in .ci/ubsan-integer.supp).
static uint64_t rnd(void) {
    rng ^= rng << 13;
    rng ^= rng >> 7;
    rng ^= rng << 17;
    return rng;
}

static double unit(void) { // [-1, 1)
    return (double)(rnd() >> 11) / (double)(1ull << 53) * 2.0 - 1.0;
}

static unsigned cases, failures;

// A device copy of n host bytes (NULL on failure).
static void *dev_copy(const void *h, size_t n) {
    void *d = NULL;
    if (cudaMalloc(&d, n ? n : 1) != cudaSuccess) return NULL;
    if (n && cudaMemcpy(d, h, n, cudaMemcpyHostToDevice) != cudaSuccess) return NULL;
    return d;
}

static void store(pkv_dtype dt, void *p, size_t i, float x) {
    if (dt == PKV_DTYPE_F32) ((float *)p)[i] = x;
    else if (dt == PKV_DTYPE_F16) ((uint16_t *)p)[i] = pkvi_f32_to_f16(x);
    else ((uint16_t *)p)[i] = pkvi_f32_to_bf16(x);
}

static double load(pkv_dtype dt, const void *p, size_t i) {
    if (dt == PKV_DTYPE_F32) return ((const float *)p)[i];
    if (dt == PKV_DTYPE_F16) return pkvi_f16_to_f32(((const uint16_t *)p)[i]);
    return pkvi_bf16_to_f32(((const uint16_t *)p)[i]);
}

#define CHECK(cond, ...)                                                                       \
    do {                                                                                       \
        if (!(cond)) {                                                                         \
            failures++;                                                                        \
            printf("FAIL %s:%d: ", __FILE__, __LINE__);                                        \
            printf(__VA_ARGS__);                                                               \
            printf("\n");                                                                      \
            return;                                                                            \
        }                                                                                      \
    } while (0)

#endif // PKV_EMU_CHECK_UTIL_H

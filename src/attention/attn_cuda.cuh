// SPDX-License-Identifier: MIT
// Device helpers shared by the attention .cu files: 16-byte vector loads turned
// into fp32, fp32 back to the storage type, warp reductions, and the host check
// that a pointer or stride allows 16-byte vector access. Element types are the
// only template parameters besides head_dim.
#ifndef PKV_ATTN_CUDA_CUH
#define PKV_ATTN_CUDA_CUH

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <stdint.h>

#include "attn_internal.h"

// Elements of T in one 16-byte vector.
template <typename T> struct pkvi_vec {
    static constexpr int n = 16 / (int)sizeof(T);
};

template <typename T> __device__ __forceinline__ void pkvi_unpack(const uint4 &u, float *f);

template <> __device__ __forceinline__ void pkvi_unpack<float>(const uint4 &u, float *f) {
    f[0] = __uint_as_float(u.x);
    f[1] = __uint_as_float(u.y);
    f[2] = __uint_as_float(u.z);
    f[3] = __uint_as_float(u.w);
}

template <> __device__ __forceinline__ void pkvi_unpack<__half>(const uint4 &u, float *f) {
    const __half2 *h = reinterpret_cast<const __half2 *>(&u);
#pragma unroll
    for (int i = 0; i < 4; i++) {
        float2 t = __half22float2(h[i]);
        f[2 * i] = t.x;
        f[2 * i + 1] = t.y;
    }
}

template <>
__device__ __forceinline__ void pkvi_unpack<__nv_bfloat16>(const uint4 &u, float *f) {
    const __nv_bfloat162 *h = reinterpret_cast<const __nv_bfloat162 *>(&u);
#pragma unroll
    for (int i = 0; i < 4; i++) {
        float2 t = __bfloat1622float2(h[i]);
        f[2 * i] = t.x;
        f[2 * i + 1] = t.y;
    }
}

// 8-bit KV formats (quant.h's codecs), as the kernels name them.
enum pkvi_q8_kind { PKVI_Q8_INT8 = 0, PKVI_Q8_E4M3 = 1, PKVI_Q8_E5M2 = 2 };

static inline int pkvi_q8_kind_of(pkv_dtype dt) {
    return dt == PKV_DTYPE_INT8 ? PKVI_Q8_INT8 : dt == PKV_DTYPE_FP8_E4M3 ? PKVI_Q8_E4M3 : PKVI_Q8_E5M2;
}

// What the fp8 values that pkvi_q8_unpack returns must be multiplied by: e4m3 is
// decoded as an fp16 equal to the value / 256 (quant.h: pkvi_fp8_to_f16_bits).
static inline float pkvi_q8_bias(int kind) {
    return kind == PKVI_Q8_E4M3 ? 256.0f : 1.0f;
}

// int8 scales are read as aligned floats: each block's (row's) scales start 4-byte
// aligned. base_stride: bytes between blocks or fixed rows (0: none).
static inline bool pkvi_q8_scales_aligned(const pkv_attn_kv_quant *qz, const void *kc,
                                          const void *vc, uint64_t base_stride) {
    return qz->kv_dtype != PKV_DTYPE_INT8 ||
           (((uintptr_t)kc + qz->scale_offset) % 4 == 0 &&
            ((uintptr_t)vc + qz->scale_offset) % 4 == 0 && base_stride % 4 == 0);
}

// Bytes 0-1 (hi: 2-3) of w as the high bytes of two fp16s: the e5m2 bit patterns.
__device__ __forceinline__ uint32_t pkvi_q8_spread(uint32_t w, bool hi) {
    const uint32_t x = hi ? w >> 16 : w;
    return ((x << 8) & 0xff00u) | ((x << 16) & 0xff000000u);
}

// Eight 8-bit values (b.x bytes 0-3, then b.y) as fp32 before any scale: int8 as
// integers, fp8 through fp16 bit patterns two at a time (e5m2 exactly, e4m3 / 256
// with its NaN S.1111.111 kept NaN). `kind` is uniform across the warp.
__device__ __forceinline__ void pkvi_q8_unpack(const uint2 &b, int kind, float *f) {
    if (kind == PKVI_Q8_INT8) {
#pragma unroll
        for (int e = 0; e < 8; e++) {
            const uint32_t w = e < 4 ? b.x : b.y;
            f[e] = (float)(int8_t)(uint8_t)(w >> (8 * (e % 4)));
        }
        return;
    }
    uint4 h;
    h.x = pkvi_q8_spread(b.x, false);
    h.y = pkvi_q8_spread(b.x, true);
    h.z = pkvi_q8_spread(b.y, false);
    h.w = pkvi_q8_spread(b.y, true);
    if (kind == PKVI_Q8_E4M3) {
        const uint32_t in[4] = {h.x, h.y, h.z, h.w};
        uint32_t out[4];
#pragma unroll
        for (int i = 0; i < 4; i++) {
            uint32_t w = (in[i] & 0x80008000u) | ((in[i] >> 1) & 0x3f803f80u);
            w |= (w & 0x7fffu) == 0x3f80u ? 0x7e00u : 0u;
            w |= (w & 0x7fff0000u) == 0x3f800000u ? 0x7e000000u : 0u;
            out[i] = w;
        }
        h.x = out[0];
        h.y = out[1];
        h.z = out[2];
        h.w = out[3];
    }
    pkvi_unpack<__half>(h, f);
}

template <typename T> __device__ __forceinline__ float pkvi_to_f32(T x);
template <> __device__ __forceinline__ float pkvi_to_f32<float>(float x) { return x; }
template <> __device__ __forceinline__ float pkvi_to_f32<__half>(__half x) {
    return __half2float(x);
}
template <> __device__ __forceinline__ float pkvi_to_f32<__nv_bfloat16>(__nv_bfloat16 x) {
    return __bfloat162float(x);
}

template <typename T> __device__ __forceinline__ T pkvi_from_f32(float x);
template <> __device__ __forceinline__ float pkvi_from_f32<float>(float x) { return x; }
template <> __device__ __forceinline__ __half pkvi_from_f32<__half>(float x) {
    return __float2half_rn(x);
}
template <> __device__ __forceinline__ __nv_bfloat16 pkvi_from_f32<__nv_bfloat16>(float x) {
    return __float2bfloat16_rn(x);
}

// Reductions over aligned groups of `width` lanes (a power of two up to 32).
__device__ __forceinline__ float pkvi_group_sum(float x, int width) {
    for (int off = width / 2; off > 0; off /= 2) {
        x += __shfl_xor_sync(0xffffffffu, x, off);
    }
    return x;
}

__device__ __forceinline__ float pkvi_warp_max(float x) {
    for (int off = 16; off > 0; off /= 2) {
        x = fmaxf(x, __shfl_xor_sync(0xffffffffu, x, off));
    }
    return x;
}

static inline bool pkvi_aligned16(const void *p) {
    return ((uintptr_t)p & 15u) == 0;
}

// A stride in elements allows 16-byte vectors if its byte size is a multiple of 16.
static inline bool pkvi_stride16(uint64_t elems, size_t es) {
    return (elems * es) % 16u == 0;
}

// The runtime could not start: no device, no driver, a stub library. What
// cudaPeekAtLastError reports then is no caller's pending error but the
// absence of a device (issue 20, defect 9: it was taken for one, and the
// launchers returned PKV_OK without running anything).
static inline bool pkvi_cuda_unavailable(cudaError_t e) {
    return e == cudaErrorNoDevice || e == cudaErrorInsufficientDriver ||
           e == cudaErrorInitializationError || e == cudaErrorStubLibrary ||
           e == cudaErrorDevicesUnavailable || e == cudaErrorSystemDriverMismatch ||
           e == cudaErrorCompatNotSupportedOnDevice;
}

// Launch errors without touching a caller's pending error: take
// pkvi_launch_begin() before the launches and pass it to pkvi_launch_status()
// after them. With nothing pending before, an error pending after is ours: it is
// cleared and reported. With an error already pending (someone else's, not ours
// to clear), it is left for its owner; a launch of ours that fails then is only
// seen at the next synchronizing call, like an execution error. Without a usable
// device nothing ran: PKV_ERR_NO_DEVICE, whatever came before.
static inline cudaError_t pkvi_launch_begin(void) {
    return cudaPeekAtLastError();
}

static inline pkv_status pkvi_launch_status(cudaError_t before) {
    const cudaError_t after = cudaPeekAtLastError();
    if (pkvi_cuda_unavailable(before) || pkvi_cuda_unavailable(after)) {
        return PKV_ERR_NO_DEVICE;
    }
    if (before != cudaSuccess || after == cudaSuccess) {
        return PKV_OK;
    }
    (void)cudaGetLastError();
    return PKV_ERR_BACKEND;
}

#endif // PKV_ATTN_CUDA_CUH

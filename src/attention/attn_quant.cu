// SPDX-License-Identifier: MIT
// The quantizing cache write for 8-bit KV caches (int8 with per-token-per-head fp32
// scales beside the data, fp8 e4m3 / e5m2 with per-tensor scales): same arguments,
// layout and rounding as the CPU call (attn_cpu_quant.c, quant.h), so the cache
// bytes it writes are identical. Decode and prefill over 8-bit caches run the
// decode kernel of attn_decode.cu (C = uint8_t).
// Invariant: every slot read from device memory is bound-checked.
#include <stdint.h>

#include "attn_cuda.cuh"

namespace {

// fp32 -> fp8, round to nearest even, saturating (quant.h: pkvi_f32_to_fp8).
static __device__ __forceinline__ uint8_t f32_to_fp8(float f, int kind) {
    const bool e4m3 = kind == PKVI_Q8_E4M3;
    uint32_t x = __float_as_uint(f);
    const uint32_t sign = (x >> 24) & 0x80u;
    uint32_t ax = x & 0x7fffffffu;
    const uint32_t mbits = e4m3 ? 3u : 2u;
    if (ax > 0x7f800000u) {
        return (uint8_t)(sign | (e4m3 ? 0x7fu : 0x7eu));
    }
    const float a = __uint_as_float(ax);
    if (a >= (e4m3 ? 448.0f : 57344.0f)) {
        return (uint8_t)(sign | (e4m3 ? 0x7eu : 0x7bu));
    }
    if (a < (e4m3 ? 0.015625f : 6.103515625e-05f)) {
        const float q = rintf(a * (e4m3 ? 512.0f : 65536.0f));
        return (uint8_t)(sign | (uint32_t)q);
    }
    const uint32_t shift = 23u - mbits;
    ax += (1u << (shift - 1u)) - 1u + ((ax >> shift) & 1u);
    const uint32_t e = (ax >> 23) + (e4m3 ? 7u : 15u) - 127u;
    const uint32_t m = (ax >> shift) & ((1u << mbits) - 1u);
    return (uint8_t)(sign | (e << mbits) | m);
}

// One warp quantizes one (token, kv head) row of K and one of V. Lanes own the
// elements lane, lane + 32, ...; int8's max|x| is a warp reduction.
// Grid: (tokens, kv_heads); block: 32 threads.
template <typename T>
static __global__ void __launch_bounds__(32)
    quant_write_kernel(const T *k, const T *v, const int64_t *slots, uint8_t *kc, uint8_t *vc,
                       uint64_t block_stride, uint64_t head_stride, uint64_t token_stride,
                       uint64_t scale_offset, uint64_t scale_hs, uint64_t scale_ts,
                       uint32_t block_size, uint64_t num_slots, uint32_t kv_heads, uint32_t d,
                       int kind, float k_scale, float v_scale) {
    const uint32_t i = blockIdx.x;
    const uint32_t h = blockIdx.y;
    const int64_t slot = slots[i];
    if (slot < 0 || (uint64_t)slot >= num_slots) {
        return;
    }
    const uint64_t blk = (uint64_t)slot / block_size;
    const uint64_t off = (uint64_t)slot % block_size;
    const uint64_t dst = blk * block_stride + h * head_stride + off * token_stride;
    const uint64_t sc = blk * block_stride + scale_offset + (h * scale_hs + off * scale_ts) * 4u;
    const uint64_t src = ((uint64_t)i * kv_heads + h) * d;
    for (int which = 0; which < 2; which++) {
        const T *x = which ? v : k;
        uint8_t *c = which ? vc : kc;
        float s = which ? v_scale : k_scale;
        if (kind == PKVI_Q8_INT8) {
            float amax = 0.0f;
            int bad = 0;
            for (uint32_t j = threadIdx.x; j < d; j += 32) {
                const float a = fabsf(pkvi_to_f32<T>(x[src + j]));
                bad |= !(a <= 3.4028235e38f);
                amax = fmaxf(amax, a);
            }
            amax = pkvi_warp_max(amax);
            bad = __shfl_xor_sync(0xffffffffu, bad, 16) | bad;
            bad = __shfl_xor_sync(0xffffffffu, bad, 8) | bad;
            bad = __shfl_xor_sync(0xffffffffu, bad, 4) | bad;
            bad = __shfl_xor_sync(0xffffffffu, bad, 2) | bad;
            bad = __shfl_xor_sync(0xffffffffu, bad, 1) | bad;
            s = bad ? __uint_as_float(0x7fc00000u) : amax / 127.0f;
            const bool ok = s > 0.0f;
            for (uint32_t j = threadIdx.x; j < d; j += 32) {
                float q = ok ? rintf(pkvi_to_f32<T>(x[src + j]) / s) : 0.0f;
                q = fminf(fmaxf(q, -127.0f), 127.0f);
                c[dst + j] = (uint8_t)(int8_t)q;
            }
            if (threadIdx.x == 0) {
                *reinterpret_cast<float *>(c + sc) = s;
            }
        } else {
            for (uint32_t j = threadIdx.x; j < d; j += 32) {
                c[dst + j] = f32_to_fp8(pkvi_to_f32<T>(x[src + j]) / s, kind);
            }
        }
    }
}

} // namespace

extern "C" pkv_status pkv_attn_cache_write_quant_cuda(
    const pkv_attn_shape *shape, const pkv_attn_kv_quant *quant, uint32_t num_tokens,
    const void *k, const void *v, const int64_t *slots, void *k_cache, void *v_cache,
    uint64_t block_stride, uint64_t head_stride, uint64_t token_stride, uint32_t block_size,
    uint32_t num_blocks, void *stream) {
    pkv_status st = pkvi_attn_check_write_args(shape, k, v, slots, k_cache, v_cache, block_size,
                                               num_blocks);
    if (st == PKV_OK) st = pkvi_attn_check_quant(quant);
    if (st != PKV_OK) return st;
    if (!pkvi_q8_scales_aligned(quant, k_cache, v_cache, block_stride)) {
        return PKV_ERR_UNSUPPORTED;
    }
    if (num_tokens == 0) {
        return PKV_OK;
    }
    if (num_tokens > (uint32_t)INT32_MAX || shape->num_kv_heads > 65535) {
        return PKV_ERR_UNSUPPORTED;
    }
    cudaStream_t cs = static_cast<cudaStream_t>(stream);
    const cudaError_t before = pkvi_launch_begin();
    // Grid: one warp per (token, kv head).
    dim3 grid(num_tokens, shape->num_kv_heads);
    const uint64_t num_slots = (uint64_t)num_blocks * block_size;
    const int kind = pkvi_q8_kind_of(quant->kv_dtype);
    uint8_t *kc = static_cast<uint8_t *>(k_cache);
    uint8_t *vc = static_cast<uint8_t *>(v_cache);
    if (shape->dtype == PKV_DTYPE_F32) {
        quant_write_kernel<float><<<grid, 32, 0, cs>>>(
            static_cast<const float *>(k), static_cast<const float *>(v), slots, kc, vc,
            block_stride, head_stride, token_stride, quant->scale_offset,
            quant->scale_head_stride, quant->scale_token_stride, block_size, num_slots,
            shape->num_kv_heads, shape->head_dim, kind, quant->k_scale, quant->v_scale);
    } else if (shape->dtype == PKV_DTYPE_F16) {
        quant_write_kernel<__half><<<grid, 32, 0, cs>>>(
            static_cast<const __half *>(k), static_cast<const __half *>(v), slots, kc, vc,
            block_stride, head_stride, token_stride, quant->scale_offset,
            quant->scale_head_stride, quant->scale_token_stride, block_size, num_slots,
            shape->num_kv_heads, shape->head_dim, kind, quant->k_scale, quant->v_scale);
    } else {
        quant_write_kernel<__nv_bfloat16><<<grid, 32, 0, cs>>>(
            static_cast<const __nv_bfloat16 *>(k), static_cast<const __nv_bfloat16 *>(v), slots,
            kc, vc, block_stride, head_stride, token_stride, quant->scale_offset,
            quant->scale_head_stride, quant->scale_token_stride, block_size, num_slots,
            shape->num_kv_heads, shape->head_dim, kind, quant->k_scale, quant->v_scale);
    }
    return pkvi_launch_status(before);
}

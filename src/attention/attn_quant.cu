// SPDX-License-Identifier: MIT
// CUDA kernels for 8-bit KV caches (int8 with per-token-per-head fp32 scales beside
// the data, fp8 e4m3 / e5m2 with per-tensor scales): the quantizing cache write,
// and decode / prefill that dequantize on the fly and accumulate in fp32. Same
// arguments, layout and rounding as the CPU calls (attn_cpu_quant.c, quant.h), so
// the cache bytes they write are identical and the outputs agree to fp32 rounding.
// Written for correctness first (one warp per K/V row, four warps per query head),
// not tuned: no GPU figure has been measured for them.
// Invariant: every id read from device memory (slots, block ids, lengths) is
// bound-checked; a sequence whose length or block ids are invalid gets NaN rows.
#include <stdint.h>

#include "attn_cuda.cuh"

#define QWARPS 4 // warps per thread block of the attention kernels

namespace {

enum { KIND_INT8 = 0, KIND_E4M3 = 1, KIND_E5M2 = 2 };

static int kind_of(pkv_dtype dt) {
    return dt == PKV_DTYPE_INT8 ? KIND_INT8 : dt == PKV_DTYPE_FP8_E4M3 ? KIND_E4M3 : KIND_E5M2;
}

// fp8 byte -> exact fp32 value (quant.h's codec, from the fields).
static __device__ __forceinline__ float fp8_to_f32(uint32_t b, int kind) {
    const uint32_t sign = (b & 0x80u) << 24;
    if (kind == KIND_E4M3) {
        const uint32_t e = (b >> 3) & 15u;
        const uint32_t m = b & 7u;
        if ((b & 0x7fu) == 0x7fu) {
            return __uint_as_float(0x7fc00000u | sign);
        }
        if (e == 0) {
            return __uint_as_float(sign | 0x3f800000u) * ((float)m * 0.001953125f); // m 2^-9
        }
        return __uint_as_float(sign | ((e + 120u) << 23) | (m << 20));
    }
    const uint32_t e = (b >> 2) & 31u;
    const uint32_t m = b & 3u;
    if (e == 31u) {
        return __uint_as_float(sign | (m ? 0x7fc00000u : 0x7f800000u));
    }
    if (e == 0) {
        return __uint_as_float(sign | 0x3f800000u) * ((float)m * 1.52587890625e-05f); // m 2^-16
    }
    return __uint_as_float(sign | ((e + 112u) << 23) | (m << 21));
}

// A stored byte as its dequantized value before the row's / tensor's scale.
static __device__ __forceinline__ float raw8(uint8_t b, int kind) {
    return kind == KIND_INT8 ? (float)(int8_t)b : fp8_to_f32(b, kind);
}

// fp32 -> fp8, round to nearest even, saturating (quant.h: pkvi_f32_to_fp8).
static __device__ __forceinline__ uint8_t f32_to_fp8(float f, int kind) {
    const bool e4m3 = kind == KIND_E4M3;
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
        if (kind == KIND_INT8) {
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

// Decode (q_indptr == NULL: row = sequence) or prefill (row = packed prompt row,
// its sequence found in q_indptr) of one query head over its K/V rows. Each warp
// takes every QWARPS-th token, lanes own head_dim / 32 dims each (D = 64, 128 or
// 256); the warps' online-softmax states merge through shared memory at the end.
// Grid: (rows, num_heads); block: 32 x QWARPS threads.
template <int D, typename T>
static __global__ void __launch_bounds__(32 * QWARPS)
    quant_attend_kernel(const T *q, T *out, const uint8_t *kc, const uint8_t *vc,
                        const int32_t *tables, const int32_t *seq_lens, const int32_t *q_indptr,
                        uint32_t num_seqs, uint32_t max_blocks, uint32_t block_size,
                        uint32_t num_blocks, uint64_t block_stride, uint64_t head_stride,
                        uint64_t token_stride, uint64_t scale_offset, uint64_t scale_hs,
                        uint64_t scale_ts, uint32_t num_heads, uint32_t kv_heads, float sm_scale,
                        int kind, float k_scale, float v_scale) {
    constexpr int J = D / 32;
    __shared__ float s_m[QWARPS];
    __shared__ float s_l[QWARPS];
    __shared__ float s_acc[QWARPS][D];
    const uint32_t r = blockIdx.x;
    const uint32_t h = blockIdx.y;
    const uint32_t warp = threadIdx.x / 32;
    const uint32_t lane = threadIdx.x % 32;
    uint32_t s = r;
    int64_t ctx = 0;
    if (q_indptr != NULL) {
        uint32_t lo = 0;
        uint32_t hi = num_seqs;
        while (hi - lo > 1) {
            const uint32_t mid = lo + (hi - lo) / 2;
            if ((int64_t)q_indptr[mid] <= (int64_t)r) {
                lo = mid;
            } else {
                hi = mid;
            }
        }
        s = lo;
        const int64_t n = (int64_t)q_indptr[s + 1] - q_indptr[s];
        ctx = (int64_t)seq_lens[s] - n + ((int64_t)r - q_indptr[s]) + 1;
    } else {
        ctx = seq_lens[s];
    }
    const uint32_t kvh = h / (num_heads / kv_heads);
    const bool int8 = kind == KIND_INT8;
    const float kmul = int8 ? 1.0f : k_scale;
    const float vmul = int8 ? 1.0f : v_scale;
    bool bad = ctx < 1 || (uint64_t)ctx > (uint64_t)max_blocks * block_size;
    const int32_t *table = tables + (uint64_t)s * max_blocks;
    float qv[J];
    for (int j = 0; j < J; j++) {
        qv[j] = pkvi_to_f32<T>(q[((uint64_t)r * num_heads + h) * D + lane + 32 * j]) * sm_scale *
                kmul;
    }
    float m = -INFINITY;
    float l = 0.0f;
    float acc[J];
    for (int j = 0; j < J; j++) {
        acc[j] = 0.0f;
    }
    for (int64_t t = warp; !bad && t < ctx; t += QWARPS) {
        const int32_t b = table[t / block_size];
        if (b < 0 || (uint32_t)b >= num_blocks) {
            bad = true; // the same for every lane of the warp
            break;
        }
        const uint64_t in = (uint64_t)(t % block_size);
        const uint64_t row = (uint64_t)b * block_stride + kvh * head_stride + in * token_stride;
        const uint64_t sc = (uint64_t)b * block_stride + scale_offset + (kvh * scale_hs + in * scale_ts) * 4u;
        const float ks = int8 ? *reinterpret_cast<const float *>(kc + sc) : 1.0f;
        const float vs = int8 ? *reinterpret_cast<const float *>(vc + sc) : 1.0f;
        float dot = 0.0f;
        for (int j = 0; j < J; j++) {
            dot += qv[j] * raw8(kc[row + lane + 32 * j], kind);
        }
        dot = pkvi_group_sum(dot, 32) * ks;
        const float mn = fmaxf(m, dot);
        const float alpha = __expf(m - mn); // 0 on the first token (m = -inf)
        const float p = __expf(dot - mn);
        l = l * alpha + p;
        for (int j = 0; j < J; j++) {
            acc[j] = acc[j] * alpha + p * vs * raw8(vc[row + lane + 32 * j], kind);
        }
        m = mn;
    }
    bad = __syncthreads_or(bad);
    if (lane == 0) {
        s_m[warp] = m;
        s_l[warp] = l;
    }
    for (int j = 0; j < J; j++) {
        s_acc[warp][lane + 32 * j] = acc[j];
    }
    __syncthreads();
    float mx = -INFINITY;
    for (int w = 0; w < QWARPS; w++) {
        mx = fmaxf(mx, s_m[w]);
    }
    float den = 0.0f;
    for (int w = 0; w < QWARPS; w++) {
        den += s_m[w] == -INFINITY ? 0.0f : __expf(s_m[w] - mx) * s_l[w];
    }
    for (uint32_t x = threadIdx.x; x < (uint32_t)D; x += 32 * QWARPS) {
        float num = 0.0f;
        for (int w = 0; w < QWARPS; w++) {
            num += s_m[w] == -INFINITY ? 0.0f : __expf(s_m[w] - mx) * s_acc[w][x];
        }
        const float o = bad ? __uint_as_float(0x7fc00000u) : num / den * vmul;
        out[((uint64_t)r * num_heads + h) * D + x] = pkvi_from_f32<T>(o);
    }
}

template <int D, typename T>
static void launch_attend(uint32_t rows, const pkv_attn_shape *sh, const pkv_attn_kv_quant *qz,
                   const void *q, void *out, const pkv_attn_paged_kv *kv, const int32_t *q_indptr,
                   uint32_t num_seqs, cudaStream_t st) {
    // Grid: one block per (query row, query head); 4 warps share its tokens.
    dim3 grid(rows, sh->num_heads);
    quant_attend_kernel<D, T><<<grid, 32 * QWARPS, 0, st>>>(
        static_cast<const T *>(q), static_cast<T *>(out),
        static_cast<const uint8_t *>(kv->k_cache), static_cast<const uint8_t *>(kv->v_cache),
        kv->block_tables, kv->seq_lens, q_indptr, num_seqs, kv->max_blocks_per_seq,
        kv->block_size, kv->num_blocks, kv->block_stride, kv->head_stride, kv->token_stride,
        qz->scale_offset, qz->scale_head_stride, qz->scale_token_stride, sh->num_heads,
        sh->num_kv_heads, sh->scale, kind_of(qz->kv_dtype), qz->k_scale, qz->v_scale);
}

template <typename T>
static void launch_attend_d(uint32_t rows, const pkv_attn_shape *sh, const pkv_attn_kv_quant *qz,
                     const void *q, void *out, const pkv_attn_paged_kv *kv,
                     const int32_t *q_indptr, uint32_t num_seqs, cudaStream_t st) {
    switch (sh->head_dim) {
    case 64: launch_attend<64, T>(rows, sh, qz, q, out, kv, q_indptr, num_seqs, st); break;
    case 128: launch_attend<128, T>(rows, sh, qz, q, out, kv, q_indptr, num_seqs, st); break;
    default: launch_attend<256, T>(rows, sh, qz, q, out, kv, q_indptr, num_seqs, st); break;
    }
}

static pkv_status attend(uint32_t rows, const pkv_attn_shape *sh, const pkv_attn_kv_quant *qz,
                  const void *q, void *out, const pkv_attn_paged_kv *kv, const int32_t *q_indptr,
                  uint32_t num_seqs, void *stream) {
    if (rows == 0) {
        return PKV_OK;
    }
    if (rows > (uint32_t)INT32_MAX || sh->num_heads > 65535) {
        return PKV_ERR_UNSUPPORTED;
    }
    cudaStream_t st = static_cast<cudaStream_t>(stream);
    const cudaError_t before = pkvi_launch_begin();
    if (sh->dtype == PKV_DTYPE_F32) {
        launch_attend_d<float>(rows, sh, qz, q, out, kv, q_indptr, num_seqs, st);
    } else if (sh->dtype == PKV_DTYPE_F16) {
        launch_attend_d<__half>(rows, sh, qz, q, out, kv, q_indptr, num_seqs, st);
    } else {
        launch_attend_d<__nv_bfloat16>(rows, sh, qz, q, out, kv, q_indptr, num_seqs, st);
    }
    return pkvi_launch_status(before);
}

// int8 scales are read as aligned floats on the device.
static bool scales_aligned(const pkv_attn_kv_quant *qz, const void *kc, const void *vc,
                    uint64_t block_stride) {
    return qz->kv_dtype != PKV_DTYPE_INT8 ||
           (((uintptr_t)kc + qz->scale_offset) % 4 == 0 &&
            ((uintptr_t)vc + qz->scale_offset) % 4 == 0 && block_stride % 4 == 0);
}

} // namespace

extern "C" pkv_status pkv_attn_decode_paged_quant_cuda(const pkv_attn_shape *shape,
                                                       const pkv_attn_kv_quant *quant,
                                                       uint32_t num_seqs, const void *q,
                                                       const pkv_attn_paged_kv *kv, void *out,
                                                       void *stream) {
    pkv_status st = pkvi_attn_check_shape(shape, 1);
    if (st == PKV_OK) st = pkvi_attn_check_quant(quant);
    if (st == PKV_OK) st = pkvi_attn_check_paged_desc(kv);
    if (st == PKV_OK && (q == NULL || out == NULL)) st = PKV_ERR_INVALID_ARG;
    if (st != PKV_OK) return st;
    if (!scales_aligned(quant, kv->k_cache, kv->v_cache, kv->block_stride)) {
        return PKV_ERR_UNSUPPORTED;
    }
    return attend(num_seqs, shape, quant, q, out, kv, NULL, num_seqs, stream);
}

extern "C" pkv_status pkv_attn_prefill_paged_quant_cuda(const pkv_attn_shape *shape,
                                                        const pkv_attn_kv_quant *quant,
                                                        uint32_t num_seqs,
                                                        const int32_t *q_indptr, const void *q,
                                                        const pkv_attn_paged_kv *kv, void *out,
                                                        void *stream) {
    pkv_status st = pkvi_attn_check_shape(shape, 1);
    if (st == PKV_OK) st = pkvi_attn_check_quant(quant);
    if (st == PKV_OK) st = pkvi_attn_check_paged_desc(kv);
    if (st == PKV_OK && (q == NULL || out == NULL || q_indptr == NULL)) st = PKV_ERR_INVALID_ARG;
    if (st != PKV_OK) return st;
    if (!scales_aligned(quant, kv->k_cache, kv->v_cache, kv->block_stride)) {
        return PKV_ERR_UNSUPPORTED;
    }
    if (num_seqs == 0) {
        return PKV_OK;
    }
    // The packed row count lives on the device: read it back (one synchronization
    // of `stream`, as pkv_attn_prefill_paged_cuda).
    cudaStream_t cs = static_cast<cudaStream_t>(stream);
    int32_t rows = 0;
    if (cudaMemcpyAsync(&rows, q_indptr + num_seqs, sizeof rows, cudaMemcpyDeviceToHost, cs) !=
            cudaSuccess ||
        cudaStreamSynchronize(cs) != cudaSuccess) {
        return PKV_ERR_BACKEND;
    }
    if (rows < 0) {
        return PKV_ERR_INVALID_ARG;
    }
    return attend((uint32_t)rows, shape, quant, q, out, kv, q_indptr, num_seqs, stream);
}

extern "C" pkv_status pkv_attn_cache_write_quant_cuda(
    const pkv_attn_shape *shape, const pkv_attn_kv_quant *quant, uint32_t num_tokens,
    const void *k, const void *v, const int64_t *slots, void *k_cache, void *v_cache,
    uint64_t block_stride, uint64_t head_stride, uint64_t token_stride, uint32_t block_size,
    uint32_t num_blocks, void *stream) {
    pkv_status st = pkvi_attn_check_write_args(shape, k, v, slots, k_cache, v_cache, block_size,
                                               num_blocks);
    if (st == PKV_OK) st = pkvi_attn_check_quant(quant);
    if (st != PKV_OK) return st;
    if (!scales_aligned(quant, k_cache, v_cache, block_stride)) {
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
    const int kind = kind_of(quant->kv_dtype);
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

// SPDX-License-Identifier: MIT
// CUDA decode for the layer kinds of heterogeneous models (issue 23): paged
// decode under a sliding or chunked-local window with gpt-oss attention sinks,
// and MLA decode over a paged latent cache. Both are one kernel, span_kernel,
// which attends a query head to a span of its sequence's context: the window's
// tokens (or all of them, for MLA) of one kv head, V rows either a separate
// cache (window) or the first dv elements of the K row (MLA's latent).
// Design, chosen for being checkable rather than fast (docs/KERNELS.md): one
// thread block per (sequence, query head); each of its 4 warps walks every 4th
// token of the span with its own online softmax, a lane holding elements
// lane + 32 j of q, the accumulator and the rows (coalesced scalar loads, so no
// alignment rule); the warps' partial (max, sum, output) are merged at the end,
// the sink joining the merge as one more logit without a value. GQA and MLA
// heads re-read their kv head's rows (no head grouping, no split-K).
// Invariant: only blocks holding tokens of the span are read, every block id and
// length read from device memory is bound-checked first, and a sequence with a
// bad one gets NaN rows.
#include <math.h>
#include <stdint.h>

#include "attn_cuda.cuh"

#define WARPS 4
#define THREADS (WARPS * 32)

// Kernels and helpers have internal linkage (plain functions are static too:
// nvcc's host object gives functions of an anonymous namespace external linkage).
namespace {

// Everything a launch needs; passed by value (kernel parameter space).
struct span_args {
    const void *q;            // [num_seqs][num_heads][dk]
    void *out;                // [num_seqs][num_heads][dv]
    const char *k;            // K rows' base (bytes); MLA: the latent cache
    const char *v;            // V rows' base; MLA: == k
    const int32_t *tables;    // [num_seqs][max_blocks]
    const int32_t *lens;      // [num_seqs]
    const float *sinks;       // [num_heads] or NULL
    uint64_t block_stride;    // elements
    uint64_t head_stride;     // elements (MLA: 0, one kv head)
    uint64_t token_stride;    // elements
    uint32_t max_blocks;
    uint32_t num_blocks;
    uint32_t block_size;
    uint32_t cap;             // most tokens a sequence may have
    uint32_t num_heads;
    uint32_t group;           // query heads per kv head
    uint32_t kind;            // pkv_attn_window_kind
    uint32_t window;
    uint32_t dk;              // elements of a K row (and of q)
    uint32_t dv;              // elements of a V row (and of out)
    float scale;
};

// EK, EV: K and V row elements per lane (dk <= 32 EK, dv <= 32 EV).
template <typename T, int EK, int EV>
__global__ void __launch_bounds__(THREADS) span_kernel(const __grid_constant__ span_args a) {
    __shared__ float s_m[WARPS];
    __shared__ float s_l[WARPS];
    __shared__ float s_o[WARPS][EV * 32];
    const int warp = threadIdx.x / 32;
    const int lane = threadIdx.x % 32;
    const uint32_t s = blockIdx.x;
    const uint32_t h = blockIdx.y;
    const uint32_t kvh = h / a.group;
    T *o = reinterpret_cast<T *>(a.out) + ((uint64_t)s * a.num_heads + h) * a.dv;
    const int64_t len = a.lens[s];
    bool bad = len < 1 || len > (int64_t)a.cap;
    if (bad) { // uniform over the block: every thread returns
        for (uint32_t e = threadIdx.x; e < a.dv; e += THREADS) {
            o[e] = pkvi_from_f32<T>(__int_as_float(0x7fc00000));
        }
        return;
    }
    const uint32_t begin =
        pkvi_attn_window_begin((pkv_attn_window_kind)a.kind, a.window, (uint32_t)len - 1u);

    // q in registers, pre-scaled: elements lane + 32 j.
    const T *q = reinterpret_cast<const T *>(a.q) + ((uint64_t)s * a.num_heads + h) * a.dk;
    float qf[EK];
#pragma unroll
    for (int j = 0; j < EK; j++) {
        const uint32_t e = (uint32_t)(lane + 32 * j);
        qf[j] = e < a.dk ? pkvi_to_f32<T>(__ldg(q + e)) * a.scale : 0.0f;
    }
    float acc[EV];
#pragma unroll
    for (int j = 0; j < EV; j++) {
        acc[j] = 0.0f;
    }
    float m = -INFINITY;
    float l = 0.0f;
    const int32_t *table = a.tables + (uint64_t)s * a.max_blocks;
    const T *kh = reinterpret_cast<const T *>(a.k) + (uint64_t)kvh * a.head_stride;
    const T *vh = reinterpret_cast<const T *>(a.v) + (uint64_t)kvh * a.head_stride;
    // Tokens begin + warp, begin + warp + WARPS, ...: the loop bound and the block
    // id are the same for every lane of a warp, so the shuffles see all 32.
    for (uint32_t t = begin + (uint32_t)warp; t < (uint32_t)len; t += WARPS) {
        const int32_t blk = table[t / a.block_size];
        if (blk < 0 || (uint32_t)blk >= a.num_blocks) {
            bad = true;
            break;
        }
        // int32 block id widened before the multiply: caches exceed 2^31 elements.
        const uint64_t off = (uint64_t)blk * a.block_stride + (t % a.block_size) * a.token_stride;
        const T *kr = kh + off;
        float d = 0.0f;
#pragma unroll
        for (int j = 0; j < EK; j++) {
            const uint32_t e = (uint32_t)(lane + 32 * j);
            if (e < a.dk) {
                d += qf[j] * pkvi_to_f32<T>(__ldg(kr + e));
            }
        }
        d = pkvi_group_sum(d, 32);
        const float m_new = fmaxf(m, d);
        const float alpha = expf(m - m_new); // 0 on the first token (m = -inf)
        const float p = expf(d - m_new);
        l = l * alpha + p;
        m = m_new;
        const T *vr = vh + off;
#pragma unroll
        for (int j = 0; j < EV; j++) {
            const uint32_t e = (uint32_t)(lane + 32 * j);
            const float x = e < a.dv ? pkvi_to_f32<T>(__ldg(vr + e)) : 0.0f;
            acc[j] = acc[j] * alpha + p * x;
        }
    }
    if (lane == 0) {
        s_m[warp] = m;
        s_l[warp] = l;
    }
#pragma unroll
    for (int j = 0; j < EV; j++) {
        s_o[warp][lane + 32 * j] = acc[j];
    }
    const bool any_bad = __syncthreads_or(bad) != 0;
    // Merge the warps, the sink as one more logit with a zero value row. A warp
    // without tokens has m = -inf, l = 0 and weighs exp(-inf) = 0; the last token
    // is always in the span, so mx is finite (or NaN with the data).
    const float sink = a.sinks != nullptr ? a.sinks[h] : -INFINITY;
    float mx = sink;
#pragma unroll
    for (int w = 0; w < WARPS; w++) {
        mx = fmaxf(mx, s_m[w]);
    }
    float wt[WARPS];
    float den = a.sinks != nullptr ? expf(sink - mx) : 0.0f;
#pragma unroll
    for (int w = 0; w < WARPS; w++) {
        wt[w] = expf(s_m[w] - mx);
        den += wt[w] * s_l[w];
    }
    const float inv = 1.0f / den;
    for (uint32_t e = threadIdx.x; e < a.dv; e += THREADS) {
        float x = 0.0f;
#pragma unroll
        for (int w = 0; w < WARPS; w++) {
            x += wt[w] * s_o[w][e];
        }
        o[e] = pkvi_from_f32<T>(any_bad ? __int_as_float(0x7fc00000) : x * inv);
    }
}

template <typename T, int EK, int EV>
pkv_status launch_span(const span_args &a, uint32_t num_seqs, cudaStream_t stream) {
    const cudaError_t before = pkvi_launch_begin();
    // Grid: (sequence, query head); 4 warps per block split the span's tokens.
    const dim3 grid(num_seqs, a.num_heads);
    span_kernel<T, EK, EV><<<grid, THREADS, 0, stream>>>(a);
    return pkvi_launch_status(before);
}

// The instantiations: window head_dim 64 / 128 / 256, MLA rows up to 128 + 128
// (small test models) and up to 512 + 64 (DeepSeek-V2/V3).
template <typename T> pkv_status dispatch(const span_args &a, uint32_t num_seqs, cudaStream_t st) {
    if (a.dk <= 64 && a.dv <= 64) return launch_span<T, 2, 2>(a, num_seqs, st);
    if (a.dk <= 128 && a.dv <= 128) return launch_span<T, 4, 4>(a, num_seqs, st);
    if (a.dk <= 256 && a.dv <= 256) return launch_span<T, 8, 8>(a, num_seqs, st);
    static_assert(18 * 32 >= PKVI_ATTN_CUDA_MLA_MAX_ROW && 16 * 32 >= PKVI_ATTN_CUDA_MLA_MAX_LATENT,
                  "the largest instantiation holds the largest MLA rows");
    if (a.dk <= PKVI_ATTN_CUDA_MLA_MAX_ROW && a.dv <= PKVI_ATTN_CUDA_MLA_MAX_LATENT) {
        return launch_span<T, 18, 16>(a, num_seqs, st);
    }
    return PKV_ERR_UNSUPPORTED;
}

static pkv_status run(pkv_dtype dt, const span_args &a, uint32_t num_seqs, void *stream) {
    if (num_seqs == 0) {
        return PKV_OK;
    }
    if (num_seqs > (uint32_t)INT32_MAX || a.num_heads > 65535u) {
        return PKV_ERR_UNSUPPORTED; // grid.x / grid.y limits
    }
    cudaStream_t st = static_cast<cudaStream_t>(stream);
    switch (dt) {
    case PKV_DTYPE_F32:
        return dispatch<float>(a, num_seqs, st);
    case PKV_DTYPE_F16:
        return dispatch<__half>(a, num_seqs, st);
    default:
        return dispatch<__nv_bfloat16>(a, num_seqs, st);
    }
}

static span_args args_of(const pkv_attn_shape *shape, uint32_t dv, const void *q,
                         const pkv_attn_paged_kv *kv, void *out) {
    span_args a = {};
    a.q = q;
    a.out = out;
    a.k = static_cast<const char *>(kv->k_cache);
    a.v = static_cast<const char *>(kv->v_cache);
    a.tables = kv->block_tables;
    a.lens = kv->seq_lens;
    a.block_stride = kv->block_stride;
    a.head_stride = kv->head_stride;
    a.token_stride = kv->token_stride;
    a.max_blocks = kv->max_blocks_per_seq;
    a.num_blocks = kv->num_blocks;
    a.block_size = kv->block_size;
    a.cap = (uint32_t)((uint64_t)kv->max_blocks_per_seq * kv->block_size > INT32_MAX
                           ? INT32_MAX
                           : (uint64_t)kv->max_blocks_per_seq * kv->block_size);
    a.num_heads = shape->num_heads;
    a.group = shape->num_heads / shape->num_kv_heads;
    a.kind = PKV_ATTN_WINDOW_FULL;
    a.dk = shape->head_dim;
    a.dv = dv;
    a.scale = shape->scale;
    return a;
}

} // namespace

extern "C" pkv_status pkv_attn_decode_paged_window_cuda(const pkv_attn_shape *shape,
                                                        const pkv_attn_window *window,
                                                        uint32_t num_seqs, const void *q,
                                                        const pkv_attn_paged_kv *kv, void *out,
                                                        void *stream) {
    pkv_status st = pkvi_attn_check_window_cuda(shape, window, kv, q, out);
    if (st != PKV_OK) return st;
    span_args a = args_of(shape, shape->head_dim, q, kv, out);
    a.kind = (uint32_t)window->kind;
    a.window = window->window;
    a.sinks = window->sinks;
    return run(shape->dtype, a, num_seqs, stream);
}

extern "C" pkv_status pkv_attn_decode_mla_paged_cuda(const pkv_attn_mla_shape *shape,
                                                     uint32_t num_seqs, const void *q,
                                                     const pkv_attn_paged_kv *kv, void *out,
                                                     void *stream) {
    pkv_attn_shape sh;
    pkv_attn_paged_kv latent;
    pkv_status st = pkvi_attn_check_mla_cuda(shape, kv, q, out, &sh, &latent);
    if (st != PKV_OK) return st;
    return run(sh.dtype, args_of(&sh, shape->latent_dim, q, &latent, out), num_seqs, stream);
}

// SPDX-License-Identifier: MIT
// CUDA decode attention over paged and contiguous caches, split-K (flash-decoding)
// with a merge kernel, and causal prefill through the paged cache (the same kernel
// with one query row per thread block). One thread block = one (query row, kv
// head, head group, context partition); it reads every K/V row of its partition
// once with 16-byte vector loads and scores it against all query heads of the
// group (GQA), with an online softmax across tiles of TILE tokens.
// Invariant: every block id and length read from device memory is bound-checked
// before the row it names is touched; a sequence with a bad one gets NaN rows.
#include <math.h>
#include <stdint.h>

#include "attn_cuda.cuh"

#define THREADS 128
#define TILE 128 // tokens scored between two softmax rescales
#define GMAX PKVI_ATTN_CUDA_MAX_GROUP

// Everything a launch needs; passed by value (kernel parameter space).
struct dec_args {
    const void *q;            // [rows][num_heads][D]
    void *out;                // [rows][num_heads][D]
    const char *k;            // cache bases, bytes
    const char *v;
    const int32_t *tables;    // paged: [num_seqs][max_blocks]; NULL = contiguous
    const int32_t *lens;      // [num_seqs]
    const int32_t *q_indptr;  // prefill: [num_seqs + 1]; NULL = decode
    uint64_t seq_stride;      // contiguous, elements
    uint64_t block_stride;    // paged, elements
    uint64_t head_stride;     // elements
    uint64_t token_stride;    // elements
    uint32_t max_blocks;      // paged table row width
    uint32_t num_blocks;
    uint32_t block_shift;     // log2(block_size)
    uint32_t cap;             // most tokens a sequence may have
    uint32_t num_seqs;
    uint32_t num_heads;
    uint32_t group;           // query heads per kv head
    uint32_t hpc;             // query heads per thread block (<= GMAX)
    uint32_t gpk;             // head groups per kv head
    float scale;
    uint32_t part_len;        // tokens per partition
    uint32_t parts;           // partitions (1 = no split-K)
    float *ws_o;              // [num_seqs][num_heads][parts][D] normalized partial outputs
    float *ws_ml;             // [num_seqs][num_heads][parts][2] running max, sum
};

// Address of token t's row (head offset already in base), or NULL for a block id
// outside the cache.
template <typename T>
__device__ __forceinline__ const T *row_at(const dec_args &a, const char *base,
                                           const int32_t *table, uint32_t t) {
    const T *b = reinterpret_cast<const T *>(base);
    if (table == nullptr) {
        return b + (uint64_t)t * a.token_stride;
    }
    int32_t blk = table[t >> a.block_shift];
    if (blk < 0 || (uint32_t)blk >= a.num_blocks) {
        return nullptr;
    }
    // int32 block id widened before the multiply: caches exceed 2^31 elements.
    uint64_t in = t & ((1u << a.block_shift) - 1u);
    return b + (uint64_t)blk * a.block_stride + in * a.token_stride;
}

// G: query heads per thread block rounded up to a power of two (1, 2, 4, 8), so
// that MHA does not pay registers for an 8-head accumulator.
template <typename T, int D, int G>
__global__ void __launch_bounds__(THREADS, 1) decode_kernel(const __grid_constant__ dec_args a) {
    constexpr int VEC = pkvi_vec<T>::n;          // elements per 16-byte load
    constexpr int VPR = D / VEC;                 // loads per row
    constexpr int LPR = VPR < 32 ? VPR : 32;     // lanes per row
    constexpr int NV = VPR / LPR;                // loads per lane per row
    constexpr int NRG = THREADS / LPR;           // rows in flight per block
    constexpr int EL = NV * VEC;                 // row elements per lane
    __shared__ float s_q[G][D];               // scaled queries
    __shared__ float s_p[G][TILE];            // scores, then probabilities
    __shared__ float s_m[G], s_l[G], s_alpha[G];
    __shared__ float s_red[NRG][D];

    const int tid = threadIdx.x;
    const int rg = tid / LPR;
    const int ln = tid % LPR;
    const int warp = tid / 32;
    const int lane = tid % 32;
    const uint32_t row = blockIdx.x; // query row (decode: the sequence)
    const uint32_t kvh = blockIdx.y / a.gpk;
    const uint32_t h0 = kvh * a.group + (blockIdx.y % a.gpk) * a.hpc;
    const uint32_t part = blockIdx.z;

    // Which sequence and how much of its context this row sees.
    uint32_t s = row;
    int64_t len = 0;
    bool bad = false;
    if (a.q_indptr != nullptr) {
        uint32_t lo = 0, hi = a.num_seqs; // q_indptr[lo] <= row < q_indptr[hi]
        while (hi - lo > 1) {
            uint32_t mid = (lo + hi) / 2;
            if ((int64_t)a.q_indptr[mid] <= (int64_t)row) {
                lo = mid;
            } else {
                hi = mid;
            }
        }
        s = lo;
        int64_t n = (int64_t)a.q_indptr[s + 1] - a.q_indptr[s];
        int64_t j = (int64_t)row - a.q_indptr[s];
        len = (int64_t)a.lens[s] - n + j + 1;
        bad = n < 0 || j < 0 || j >= n || a.lens[s] > (int64_t)a.cap || a.lens[s] < n;
    } else {
        len = a.lens[s];
    }
    bad = bad || len < 1 || len > (int64_t)a.cap;
    const uint32_t start = part * a.part_len;
    if (bad) {
        if (a.parts == 1) { // the merge kernel poisons split outputs itself
            for (uint32_t i = tid; i < a.hpc * D; i += THREADS) {
                T *o = reinterpret_cast<T *>(a.out) + ((uint64_t)row * a.num_heads + h0) * D;
                o[i] = pkvi_from_f32<T>(__int_as_float(0x7fc00000));
            }
        }
        return;
    }
    if (start >= (uint64_t)len) {
        return; // this partition is past the end of this sequence
    }
    const uint32_t end = min((uint64_t)len, (uint64_t)start + a.part_len);

    const T *q = reinterpret_cast<const T *>(a.q) + ((uint64_t)row * a.num_heads + h0) * D;
    for (uint32_t i = tid; i < a.hpc * D; i += THREADS) {
        s_q[i / D][i % D] = pkvi_to_f32<T>(q[i]) * a.scale;
    }
    if (tid < G) {
        s_m[tid] = -INFINITY;
        s_l[tid] = 0.0f;
    }
    const int32_t *table = nullptr;
    const char *kb;
    const char *vb;
    const size_t es = sizeof(T);
    if (a.tables != nullptr) {
        table = a.tables + (uint64_t)s * a.max_blocks;
        kb = a.k + (uint64_t)kvh * a.head_stride * es;
        vb = a.v + (uint64_t)kvh * a.head_stride * es;
    } else {
        uint64_t off = ((uint64_t)s * a.seq_stride + (uint64_t)kvh * a.head_stride) * es;
        kb = a.k + off;
        vb = a.v + off;
    }
    float acc[G][EL];
#pragma unroll
    for (int g = 0; g < G; g++) {
#pragma unroll
        for (int e = 0; e < EL; e++) {
            acc[g][e] = 0.0f;
        }
    }
    __syncthreads();

    for (uint32_t t0 = start; t0 < end; t0 += TILE) {
        const uint32_t n = min((uint32_t)TILE, end - t0);
        // Scores: each group of LPR lanes takes one K row, dots it with every head.
        // The loop bound is the same for every lane, so that the shuffles inside
        // always see the full warp; lanes past the tile compute on zeros.
        // Unrolled by two so that the next rows' loads are issued before this
        // row's shuffles (more bytes in flight per thread block).
#pragma unroll 2
        for (uint32_t i0 = 0; i0 < n; i0 += NRG) {
            const uint32_t i = i0 + rg;
            const T *kr = i < n ? row_at<T>(a, kb, table, t0 + i) : nullptr;
            float kf[EL];
            if (kr == nullptr) {
                bad = bad || i < n;
#pragma unroll
                for (int e = 0; e < EL; e++) {
                    kf[e] = 0.0f;
                }
            } else {
#pragma unroll
                for (int j = 0; j < NV; j++) {
                    uint4 u = __ldg(reinterpret_cast<const uint4 *>(kr + (j * LPR + ln) * VEC));
                    pkvi_unpack<T>(u, kf + j * VEC);
                }
            }
#pragma unroll
            for (int g = 0; g < G; g++) {
                if (g < (int)a.hpc) {
                    float dot = 0.0f;
#pragma unroll
                    for (int j = 0; j < NV; j++) {
#pragma unroll
                        for (int e = 0; e < VEC; e++) {
                            dot += kf[j * VEC + e] * s_q[g][(j * LPR + ln) * VEC + e];
                        }
                    }
                    dot = pkvi_group_sum(dot, LPR);
                    if (ln == 0 && i < n) {
                        s_p[g][i] = dot;
                    }
                }
            }
        }
        __syncthreads();
        // Online softmax: one warp per head.
        for (uint32_t g = warp; g < a.hpc; g += THREADS / 32) {
            float mx = -INFINITY;
            for (uint32_t i = lane; i < n; i += 32) {
                mx = fmaxf(mx, s_p[g][i]);
            }
            mx = pkvi_warp_max(mx);
            const float m_old = s_m[g];
            const float m_new = fmaxf(m_old, mx);
            const float alpha = m_old == -INFINITY ? 0.0f : expf(m_old - m_new);
            float sum = 0.0f;
            for (uint32_t i = lane; i < n; i += 32) {
                float p = expf(s_p[g][i] - m_new);
                s_p[g][i] = p;
                sum += p;
            }
            sum = pkvi_group_sum(sum, 32);
            __syncwarp();
            if (lane == 0) {
                s_l[g] = s_l[g] * alpha + sum;
                s_m[g] = m_new;
                s_alpha[g] = alpha;
            }
        }
        __syncthreads();
        // Values: rescale, then accumulate this tile's rows.
#pragma unroll
        for (int g = 0; g < G; g++) {
            if (g < (int)a.hpc) {
                const float al = s_alpha[g];
#pragma unroll
                for (int e = 0; e < EL; e++) {
                    acc[g][e] *= al;
                }
            }
        }
#pragma unroll 2
        for (uint32_t i = rg; i < n; i += NRG) {
            const T *vr = row_at<T>(a, vb, table, t0 + i);
            if (vr == nullptr) {
                bad = true;
                continue;
            }
            float vf[EL];
#pragma unroll
            for (int j = 0; j < NV; j++) {
                uint4 u = __ldg(reinterpret_cast<const uint4 *>(vr + (j * LPR + ln) * VEC));
                pkvi_unpack<T>(u, vf + j * VEC);
            }
#pragma unroll
            for (int g = 0; g < G; g++) {
                if (g < (int)a.hpc) {
                    const float p = s_p[g][i];
#pragma unroll
                    for (int e = 0; e < EL; e++) {
                        acc[g][e] += p * vf[e];
                    }
                }
            }
        }
        __syncthreads(); // s_p is rewritten by the next tile
    }

    const bool any_bad = __syncthreads_or(bad) != 0;
    const float nan = __int_as_float(0x7fc00000);
    // Sum the row groups' partial outputs, one head at a time.
#pragma unroll
    for (int g = 0; g < G; g++) {
        if (g < (int)a.hpc) {
#pragma unroll
            for (int j = 0; j < NV; j++) {
#pragma unroll
                for (int e = 0; e < VEC; e++) {
                    s_red[rg][(j * LPR + ln) * VEC + e] = acc[g][j * VEC + e];
                }
            }
            __syncthreads();
            const float inv_l = 1.0f / s_l[g];
            const uint64_t hrow = (uint64_t)row * a.num_heads + h0 + g;
            for (int d = tid; d < D; d += THREADS) {
                float x = 0.0f;
#pragma unroll
                for (int r = 0; r < NRG; r++) {
                    x += s_red[r][d];
                }
                x = any_bad ? nan : x * inv_l;
                if (a.parts == 1) {
                    reinterpret_cast<T *>(a.out)[hrow * D + d] = pkvi_from_f32<T>(x);
                } else {
                    a.ws_o[(hrow * a.parts + part) * D + d] = x;
                }
            }
            if (a.parts > 1 && tid == 0) {
                a.ws_ml[(hrow * a.parts + part) * 2] = s_m[g];
                a.ws_ml[(hrow * a.parts + part) * 2 + 1] = any_bad ? nan : s_l[g];
            }
            __syncthreads();
        }
    }
}

// Merge split-K partitions: out = sum_p w_p o_p / sum_p w_p, w_p = l_p exp(m_p - M).
template <typename T, int D> __global__ void __launch_bounds__(THREADS) merge_kernel(const __grid_constant__ dec_args a) {
    const uint32_t s = blockIdx.x;
    const uint64_t hrow = (uint64_t)s * a.num_heads + blockIdx.y;
    const int64_t len = a.lens[s];
    T *out = reinterpret_cast<T *>(a.out) + hrow * D;
    const float nan = __int_as_float(0x7fc00000);
    if (len < 1 || len > (int64_t)a.cap) {
        for (int d = threadIdx.x; d < D; d += THREADS) {
            out[d] = pkvi_from_f32<T>(nan);
        }
        return;
    }
    const uint32_t np = (uint32_t)((len + a.part_len - 1) / a.part_len);
    const float *ml = a.ws_ml + hrow * a.parts * 2;
    float m = -INFINITY;
    bool bad = false;
    for (uint32_t p = 0; p < np; p++) {
        m = fmaxf(m, ml[2 * p]);
        bad = bad || isnan(ml[2 * p + 1]);
    }
    float l = 0.0f;
    for (uint32_t p = 0; p < np; p++) {
        l += ml[2 * p + 1] * expf(ml[2 * p] - m);
    }
    const float inv = 1.0f / l;
    for (int d = threadIdx.x; d < D; d += THREADS) {
        float x = 0.0f;
        for (uint32_t p = 0; p < np; p++) {
            x += ml[2 * p + 1] * expf(ml[2 * p] - m) * a.ws_o[(hrow * a.parts + p) * D + d];
        }
        out[d] = pkvi_from_f32<T>(bad ? nan : x * inv);
    }
}

template <typename T, int D>
static pkv_status launch_t(const dec_args &a, uint32_t rows, uint32_t kv_heads,
                           cudaStream_t stream) {
    // Grid: x = query rows (sequences in decode), y = kv heads x head groups,
    // z = context partitions; THREADS threads each.
    dim3 grid(rows, kv_heads * a.gpk, a.parts);
    if (a.hpc == 1) {
        decode_kernel<T, D, 1><<<grid, THREADS, 0, stream>>>(a);
    } else if (a.hpc == 2) {
        decode_kernel<T, D, 2><<<grid, THREADS, 0, stream>>>(a);
    } else if (a.hpc <= 4) {
        decode_kernel<T, D, 4><<<grid, THREADS, 0, stream>>>(a);
    } else {
        decode_kernel<T, D, GMAX><<<grid, THREADS, 0, stream>>>(a);
    }
    if (a.parts > 1) {
        // Grid: one block per (sequence, query head), threads over head_dim.
        dim3 mgrid(rows, a.num_heads);
        merge_kernel<T, D><<<mgrid, THREADS, 0, stream>>>(a);
    }
    return pkvi_launch_status();
}

template <typename T>
static pkv_status launch_d(const dec_args &a, uint32_t d, uint32_t rows, uint32_t kvh,
                           cudaStream_t st) {
    switch (d) {
    case 64:
        return launch_t<T, 64>(a, rows, kvh, st);
    case 128:
        return launch_t<T, 128>(a, rows, kvh, st);
    default:
        return launch_t<T, 256>(a, rows, kvh, st);
    }
}

static pkv_status launch(const pkv_attn_shape *sh, const dec_args &a, uint32_t rows,
                         cudaStream_t st) {
    if (rows > (uint32_t)INT32_MAX || (uint64_t)sh->num_kv_heads * a.gpk > 65535u) {
        return PKV_ERR_UNSUPPORTED; // beyond the grid limits
    }
    cudaGetLastError(); // a stale error from someone else's call is not ours
    switch (sh->dtype) {
    case PKV_DTYPE_F32:
        return launch_d<float>(a, sh->head_dim, rows, sh->num_kv_heads, st);
    case PKV_DTYPE_F16:
        return launch_d<__half>(a, sh->head_dim, rows, sh->num_kv_heads, st);
    default:
        return launch_d<__nv_bfloat16>(a, sh->head_dim, rows, sh->num_kv_heads, st);
    }
}

// Fill the shape part of the arguments and the split-K plan.
static pkv_status plan(const pkv_attn_shape *sh, uint32_t num_seqs, uint32_t max_context,
                       const pkv_attn_cuda_opts *opts, dec_args *a) {
    pkvi_attn_cuda_groups(sh, &a->hpc, &a->gpk);
    a->num_seqs = num_seqs;
    a->num_heads = sh->num_heads;
    a->group = sh->num_heads / sh->num_kv_heads;
    a->scale = sh->scale;
    a->cap = max_context;
    uint32_t n = 1;
    if (opts != nullptr && opts->workspace != nullptr && opts->num_splits != 1) {
        n = opts->num_splits;
        if (n == 0) {
            uint32_t sms = opts->num_sms;
            if (sms == 0) {
                int dev = 0;
                int count = 0;
                if (cudaGetDevice(&dev) != cudaSuccess ||
                    cudaDeviceGetAttribute(&count, cudaDevAttrMultiProcessorCount, dev) !=
                        cudaSuccess) {
                    cudaGetLastError();
                    return PKV_ERR_NO_DEVICE;
                }
                sms = (uint32_t)count;
            }
            pkv_status st = pkv_attn_cuda_num_splits(sh, num_seqs, max_context, sms, &n);
            if (st != PKV_OK) {
                return st;
            }
        }
        if (n > PKVI_ATTN_MAX_SPLITS) {
            n = PKVI_ATTN_MAX_SPLITS;
        }
        size_t need = 0;
        while (n > 1 && (pkv_attn_cuda_workspace_bytes(sh, num_seqs, n, &need) != PKV_OK ||
                         need > opts->workspace_bytes)) {
            n--;
        }
        if (!pkvi_aligned16(opts->workspace)) {
            return PKV_ERR_INVALID_ARG;
        }
    }
    pkvi_attn_partition(max_context, n, &a->part_len, &a->parts);
    if (a->parts > 1) {
        a->ws_o = static_cast<float *>(opts->workspace);
        a->ws_ml = a->ws_o + (uint64_t)num_seqs * sh->num_heads * a->parts * sh->head_dim;
    }
    return PKV_OK;
}

static pkv_status check_paged(const pkv_attn_shape *sh, const void *q,
                              const pkv_attn_paged_kv *kv, const void *out) {
    pkv_status st = pkvi_attn_check_shape(sh, 1);
    if (st == PKV_OK) {
        st = pkvi_attn_check_paged_desc(kv);
    }
    if (st != PKV_OK) {
        return st;
    }
    if (q == nullptr || out == nullptr) {
        return PKV_ERR_INVALID_ARG;
    }
    uint32_t b = kv->block_size;
    if ((b & (b - 1)) != 0 || b > 256) {
        return PKV_ERR_UNSUPPORTED;
    }
    if ((uint64_t)kv->max_blocks_per_seq * b > (uint64_t)INT32_MAX) {
        return PKV_ERR_INVALID_ARG;
    }
    size_t es = pkv_dtype_size(sh->dtype);
    if (!pkvi_aligned16(q) || !pkvi_aligned16(out) || !pkvi_aligned16(kv->k_cache) ||
        !pkvi_aligned16(kv->v_cache) || !pkvi_stride16(kv->block_stride, es) ||
        !pkvi_stride16(kv->head_stride, es) || !pkvi_stride16(kv->token_stride, es)) {
        return PKV_ERR_UNSUPPORTED; // 16-byte vector loads need 16-byte aligned rows
    }
    return PKV_OK;
}

static void paged_args(const pkv_attn_shape *sh, const void *q, const pkv_attn_paged_kv *kv,
                       void *out, dec_args *a) {
    a->q = q;
    a->out = out;
    a->k = static_cast<const char *>(kv->k_cache);
    a->v = static_cast<const char *>(kv->v_cache);
    a->tables = kv->block_tables;
    a->lens = kv->seq_lens;
    a->block_stride = kv->block_stride;
    a->head_stride = kv->head_stride;
    a->token_stride = kv->token_stride;
    a->max_blocks = kv->max_blocks_per_seq;
    a->num_blocks = kv->num_blocks;
    uint32_t shift = 0;
    while ((1u << shift) < kv->block_size) {
        shift++;
    }
    a->block_shift = shift;
    (void)sh;
}

extern "C" pkv_status pkv_attn_decode_paged_cuda_ex(const pkv_attn_shape *shape,
                                                    uint32_t num_seqs, const void *q,
                                                    const pkv_attn_paged_kv *kv, void *out,
                                                    const pkv_attn_cuda_opts *opts,
                                                    void *stream) {
    pkv_status st = check_paged(shape, q, kv, out);
    if (st != PKV_OK || num_seqs == 0) {
        return st;
    }
    dec_args a = {};
    paged_args(shape, q, kv, out, &a);
    st = plan(shape, num_seqs, kv->max_blocks_per_seq * kv->block_size, opts, &a);
    if (st != PKV_OK) {
        return st;
    }
    return launch(shape, a, num_seqs, static_cast<cudaStream_t>(stream));
}

extern "C" pkv_status pkv_attn_decode_paged_cuda(const pkv_attn_shape *shape, uint32_t num_seqs,
                                                 const void *q, const pkv_attn_paged_kv *kv,
                                                 void *out, void *stream) {
    return pkv_attn_decode_paged_cuda_ex(shape, num_seqs, q, kv, out, nullptr, stream);
}

extern "C" pkv_status pkv_attn_decode_contig_cuda_ex(const pkv_attn_shape *shape,
                                                     uint32_t num_seqs, const void *q,
                                                     const pkv_attn_contig_kv *kv, void *out,
                                                     const pkv_attn_cuda_opts *opts,
                                                     void *stream) {
    pkv_status st = pkvi_attn_check_shape(shape, 1);
    if (st == PKV_OK) {
        st = pkvi_attn_check_contig_desc(kv);
    }
    if (st != PKV_OK) {
        return st;
    }
    if (q == nullptr || out == nullptr || kv->max_seq_len > (uint32_t)INT32_MAX) {
        return PKV_ERR_INVALID_ARG;
    }
    size_t es = pkv_dtype_size(shape->dtype);
    if (!pkvi_aligned16(q) || !pkvi_aligned16(out) || !pkvi_aligned16(kv->k_cache) ||
        !pkvi_aligned16(kv->v_cache) || !pkvi_stride16(kv->seq_stride, es) ||
        !pkvi_stride16(kv->head_stride, es) || !pkvi_stride16(kv->token_stride, es)) {
        return PKV_ERR_UNSUPPORTED;
    }
    if (num_seqs == 0) {
        return PKV_OK;
    }
    dec_args a = {};
    a.q = q;
    a.out = out;
    a.k = static_cast<const char *>(kv->k_cache);
    a.v = static_cast<const char *>(kv->v_cache);
    a.tables = nullptr;
    a.lens = kv->seq_lens;
    a.seq_stride = kv->seq_stride;
    a.head_stride = kv->head_stride;
    a.token_stride = kv->token_stride;
    st = plan(shape, num_seqs, kv->max_seq_len, opts, &a);
    if (st != PKV_OK) {
        return st;
    }
    return launch(shape, a, num_seqs, static_cast<cudaStream_t>(stream));
}

extern "C" pkv_status pkv_attn_decode_contig_cuda(const pkv_attn_shape *shape,
                                                  uint32_t num_seqs, const void *q,
                                                  const pkv_attn_contig_kv *kv, void *out,
                                                  void *stream) {
    return pkv_attn_decode_contig_cuda_ex(shape, num_seqs, q, kv, out, nullptr, stream);
}

// Prefill: one thread block per (prompt token, kv head, head group), no split-K.
// The grid needs the packed row count, q_indptr[num_seqs], which lives on the
// device: it is read back once, synchronizing `stream`.
extern "C" pkv_status pkv_attn_prefill_paged_cuda(const pkv_attn_shape *shape,
                                                  uint32_t num_seqs, const int32_t *q_indptr,
                                                  const void *q, const pkv_attn_paged_kv *kv,
                                                  void *out, void *stream) {
    pkv_status st = check_paged(shape, q, kv, out);
    if (st != PKV_OK) {
        return st;
    }
    if (q_indptr == nullptr) {
        return PKV_ERR_INVALID_ARG;
    }
    if (num_seqs == 0) {
        return PKV_OK;
    }
    cudaStream_t cs = static_cast<cudaStream_t>(stream);
    int32_t rows = 0;
    cudaGetLastError();
    if (cudaMemcpyAsync(&rows, q_indptr + num_seqs, sizeof rows, cudaMemcpyDeviceToHost, cs) !=
            cudaSuccess ||
        cudaStreamSynchronize(cs) != cudaSuccess) {
        cudaGetLastError();
        return PKV_ERR_BACKEND;
    }
    if (rows < 0) {
        return PKV_ERR_INVALID_ARG;
    }
    if (rows == 0) {
        return PKV_OK;
    }
    dec_args a = {};
    paged_args(shape, q, kv, out, &a);
    a.q_indptr = q_indptr;
    st = plan(shape, num_seqs, kv->max_blocks_per_seq * kv->block_size, nullptr, &a);
    if (st != PKV_OK) {
        return st;
    }
    return launch(shape, a, (uint32_t)rows, cs);
}

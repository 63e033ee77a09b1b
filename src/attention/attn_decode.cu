// SPDX-License-Identifier: MIT
// CUDA decode attention over paged and contiguous caches, split-K (flash-decoding)
// with a merge kernel, and causal prefill through the paged cache (the same kernel
// with one query row per thread block). One thread block = one (query row, kv
// head, head group, context partition); it reads every K/V row of its partition
// once with 16-byte vector loads and scores it against all query heads of the
// group (GQA), with an online softmax across tiles of TILE tokens.
// Built for bandwidth (docs/KERNELS.md): the block ids of a tile are resolved once
// into shared memory, the next tile's fetched while this one is scored; every
// thread issues U independent 16-byte loads (U rows) before it uses any, with no
// branch between them; q lives in registers; the dot products of U rows x G
// heads are reduced across a row's lanes by butterfly transpose-reductions, at
// most 32 sums at a time (G = 8: 4 rows per reduction, so 8 loads fit beside q).
// Invariant: every block id and length read from device memory is bound-checked
// before the row it names is touched; a sequence with a bad one gets NaN rows.
#include <math.h>
#include <stdint.h>

#include "attn_cuda.cuh"

#define THREADS 128
#define TILE 128 // tokens scored between two softmax rescales
#define GMAX PKVI_ATTN_CUDA_MAX_GROUP

// Kernels and helpers have internal linkage: no generic symbol leaves the library
// (plain functions are static too: nvcc's host object gives functions of an
// anonymous namespace external linkage).
namespace {

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
    const int64_t *offsets;   // contiguous: [num_seqs] row offsets, elements; NULL = seq_stride * s
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
    // 8-bit caches (decode_kernel<T, uint8_t, ...>); else kmul = vmul = 1.
    int q8_kind;              // PKVI_Q8_INT8 / _E4M3 / _E5M2
    float kmul;               // folded into q: fp8 k_scale x bias, int8 1
    float vmul;               // applied to the output: fp8 v_scale x bias, int8 1
    uint64_t scale_offset;    // int8: bytes from a block's (row's) base to its scales
    uint64_t scale_hs;        // int8: floats between kv heads' scales
    uint64_t scale_ts;        // int8: floats between tokens' scales
};

// Rows each thread takes per step: 8 with one 16-byte load each (NV = 1); rows
// of two loads (fp32 D = 256) 8 too, but 4 at G = 8, where 16 loads (64
// registers) do not fit beside q and the accumulators (128); 16 rows of an 8-bit
// cache (Q8), one load per two rows. Never more rows per step than a tile has
// (NRG: row groups of the block). The scores of a step are reduced in chunks of
// `chunk` rows, at most 32 dot products (G x chunk) each, so that G = 8 holds the
// partial sums of 4 rows, not of all U (issue 24: 8 loads in flight at G = 8).
template <int G, bool Q8, int NRG, int NV> struct rows_per_step {
    static constexpr int want = Q8 ? 16 : (G >= 8 && NV > 1 ? 4 : 8);
    static constexpr int u = want * NRG > TILE ? TILE / NRG : want;
    static constexpr int chunk = G * u > 32 ? 32 / G : u;
    static_assert(u % chunk == 0, "whole chunks per step");
};

// 8-bit rows: lanes pair up (ln, ln ^ 1) over two rows A, B of a step. Each loads
// the 16 bytes of its chunk ln / 2 of its own row (even lane: A, odd: B), then
// they swap halves, so that every lane holds its 8 elements ln * 8 .. + 7 of
// both rows: the element ownership of a 16-bit cache (8 per lane), with half the
// loads for the same rows. Out: ra, rb (8 bytes each). Whole warp (shuffles).
__device__ __forceinline__ void q8_swap(const uint4 &own, int ln, uint2 *ra, uint2 *rb) {
    const bool odd = (ln & 1) != 0;
    uint2 send;
    send.x = odd ? own.x : own.z;
    send.y = odd ? own.y : own.w;
    uint2 got;
    got.x = __shfl_xor_sync(0xffffffffu, send.x, 1);
    got.y = __shfl_xor_sync(0xffffffffu, send.y, 1);
    if (odd) {
        *ra = got;
        rb->x = own.z;
        rb->y = own.w;
    } else {
        ra->x = own.x;
        ra->y = own.y;
        *rb = got;
    }
}

// N elements of T at p (16-byte aligned) as fp32, with 16-byte loads.
template <typename T, int N> __device__ __forceinline__ void load_f32(const T *p, float *f) {
    constexpr int PV = pkvi_vec<T>::n;
    static_assert(N % PV == 0, "whole 16-byte vectors");
#pragma unroll
    for (int i = 0; i < N / PV; i++) {
        pkvi_unpack<T>(__ldg(reinterpret_cast<const uint4 *>(p + i * PV)), f + i * PV);
    }
}

// A step's rows as this lane's 16-byte loads: L = U loads of one row each
// (16/32-bit caches: C = T) or U / 2 loads of a row pair (8-bit: C = uint8_t).
// load() issues them all before any is used; row() turns row u into fp32 (this
// lane's EL elements, before any scale), 8-bit pairs swapped once per step.
template <typename T, typename C, int U, int NV, int LPR> struct step_loads {
    static constexpr bool Q8 = sizeof(C) == 1;
    static constexpr int L = Q8 ? U / 2 : U;
    static constexpr int VEC = Q8 ? 8 : pkvi_vec<T>::n;
    static_assert(!Q8 || (NV == 1 && U % 2 == 0), "8-bit: one row pair per load");
    uint4 r[L][NV];
    uint2 h[Q8 ? U : 1];

    // Row of load l: U rows (rg + u NRG), 8-bit pairs u = 2l, 2l + 1 split by lane parity.
    static __device__ __forceinline__ int row_of(int l, int ln) {
        return Q8 ? 2 * l + (ln & 1) : l;
    }
    __device__ __forceinline__ void load(int l, const C *rowp, int ln) {
#pragma unroll
        for (int j = 0; j < NV; j++) {
            const C *p = Q8 ? rowp + (ln >> 1) * 16 : rowp + (j * LPR + ln) * VEC;
            r[l][j] = __ldg(reinterpret_cast<const uint4 *>(p));
        }
    }
    __device__ __forceinline__ void swap(int ln) {
        if constexpr (Q8) {
#pragma unroll
            for (int l = 0; l < L; l++) {
                q8_swap(r[l][0], ln, &h[2 * l], &h[2 * l + 1]);
            }
        }
    }
    __device__ __forceinline__ void row(int u, int kind, float *f) const {
        if constexpr (Q8) {
            pkvi_q8_unpack(h[u], kind, f);
        } else {
#pragma unroll
            for (int j = 0; j < NV; j++) {
                pkvi_unpack<T>(r[u][j], f + j * VEC);
            }
        }
    }
};

// Butterfly transpose-reduction: the N values of every lane are summed over each
// aligned group of L lanes (N, L powers of two) with N - N/L shuffles instead of
// N log2(L). Step O sends half of the C values still held to the partner lane and
// keeps the other half, so afterwards lane l of a group holds the sums of values
// l * N/L .. l * N/L + N/L - 1 in v[0..N/L-1] (N >= L), or of value l / (L/N)
// in v[0] (N < L, the last log2(L/N) steps are plain sums).
template <int N, int C, int O> struct tsum {
    static __device__ __forceinline__ void run(float (&v)[N], int lane) {
        const bool hi = (lane & O) != 0;
        if constexpr (C > 1) {
#pragma unroll
            for (int k = 0; k < C / 2; k++) {
                const float send = hi ? v[k] : v[k + C / 2];
                const float keep = hi ? v[k + C / 2] : v[k];
                v[k] = keep + __shfl_xor_sync(0xffffffffu, send, O);
            }
        } else {
            v[0] += __shfl_xor_sync(0xffffffffu, v[0], O);
        }
        if constexpr (O > 1) {
            tsum<N, (C > 1 ? C / 2 : 1), O / 2>::run(v, lane);
        }
    }
};

// Block ids of the tile [t0, t0 + n) into ids[0..] (thread j loads entry j), each
// checked: an id outside the cache becomes 0 (a valid address, never used for
// output) and sets *bad. Only blocks holding tokens of the tile are read.
__device__ __forceinline__ int32_t tile_block_id(const dec_args &a, const int32_t *table,
                                                 uint32_t t0, uint32_t n, int j, bool *bad) {
    const uint32_t b0 = t0 >> a.block_shift;
    const uint32_t nb = ((t0 + n - 1) >> a.block_shift) - b0 + 1;
    if ((uint32_t)j >= nb) {
        return 0;
    }
    const int32_t blk = table[b0 + (uint32_t)j];
    if (blk < 0 || (uint32_t)blk >= a.num_blocks) {
        *bad = true;
        return 0;
    }
    return blk;
}

// Element offset of token t's row from the head's base: through the tile's block
// ids (paged) or directly (contiguous). Branch-free for the loads that follow.
__device__ __forceinline__ uint64_t row_off(const dec_args &a, bool paged, const int32_t *ids,
                                            uint32_t t0, uint32_t t) {
    if (!paged) {
        return (uint64_t)t * a.token_stride;
    }
    // int32 block id widened before the multiply: caches exceed 2^31 elements.
    const uint64_t blk = (uint64_t)ids[(t >> a.block_shift) - (t0 >> a.block_shift)];
    uint64_t in = t & ((1u << a.block_shift) - 1u);
    return blk * a.block_stride + in * a.token_stride;
}

// T: q and out; C: the cache's elements, T or uint8_t (an 8-bit cache, its format
// in a.q8_kind: rows dequantized on the fly, int8 scales read per tile).
// G: query heads per thread block rounded up to a power of two (1, 2, 4, 8), so
// that MHA does not pay registers for an 8-head accumulator.
template <typename T, typename C, int D, int G>
__global__ void __launch_bounds__(THREADS, 1) decode_kernel(const __grid_constant__ dec_args a) {
    constexpr bool Q8 = sizeof(C) == 1;
    constexpr int VEC = Q8 ? 8 : pkvi_vec<T>::n; // row elements a lane owns per load
    constexpr int VPR = D / VEC;                 // such chunks per row
    constexpr int LPR = VPR < 32 ? VPR : 32;     // lanes per row
    constexpr int NV = VPR / LPR;                // chunks per lane per row
    constexpr int NRG = THREADS / LPR;           // row groups (rows per load slot)
    constexpr int EL = NV * VEC;                 // row elements per lane
    constexpr int U = rows_per_step<G, Q8, NRG, NV>::u; // rows per thread per step
    constexpr int UC = rows_per_step<G, Q8, NRG, NV>::chunk; // rows per reduction
    constexpr int N = G * UC;                    // dot products per lane per reduction
    constexpr int STEP = U * NRG;                // rows per block per step
    using loads = step_loads<T, C, U, NV, LPR>;
    static_assert(THREADS >= TILE, "one thread per block id of a tile");
    __shared__ float s_p[2][G][TILE];            // scores, then probabilities (2 tiles)
    __shared__ int32_t s_ids[2][TILE];           // block ids of this tile and the next
    __shared__ float s_m[G], s_l[G], s_alpha[G];
    __shared__ float s_red[NRG][D];
    __shared__ float s_sc[Q8 ? 2 : 1][Q8 ? TILE : 1]; // int8: the tile's K, V row scales
    static_assert(sizeof(s_p) + sizeof(s_ids) + sizeof(s_red) + 3 * sizeof(s_m) +
                          sizeof(s_sc) <= 48 * 1024,
                  "static shared memory is capped at 48 KiB");

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

    // q in registers, pre-scaled (fp8: by the K tensor scale too): this lane's
    // elements of every head of the group.
    float qf[G][EL];
    const T *q = reinterpret_cast<const T *>(a.q) + ((uint64_t)row * a.num_heads + h0) * D;
    const float qs = a.scale * a.kmul;
#pragma unroll
    for (int g = 0; g < G; g++) {
#pragma unroll
        for (int j = 0; j < NV; j++) {
            float f[VEC];
            if (g < (int)a.hpc) {
                load_f32<T, VEC>(q + g * D + (j * LPR + ln) * VEC, f);
            } else {
#pragma unroll
                for (int e = 0; e < VEC; e++) {
                    f[e] = 0.0f;
                }
            }
#pragma unroll
            for (int e = 0; e < VEC; e++) {
                qf[g][j * VEC + e] = f[e] * qs;
            }
        }
    }
    if (tid < G) {
        s_m[tid] = -INFINITY;
        s_l[tid] = 0.0f;
    }
    const bool paged = a.tables != nullptr;
    const int32_t *table = nullptr;
    const char *kb;
    const char *vb;
    const size_t es = sizeof(C);
    // int8 scales: byte offset of kv head kvh's scales from a block's (row's) base.
    uint64_t sc0 = a.scale_offset + (uint64_t)kvh * a.scale_hs * 4u;
    if (paged) {
        table = a.tables + (uint64_t)s * a.max_blocks;
        kb = a.k + (uint64_t)kvh * a.head_stride * es;
        vb = a.v + (uint64_t)kvh * a.head_stride * es;
        s_ids[0][tid] = tile_block_id(a, table, start, min((uint32_t)TILE, end - start), tid, &bad);
    } else {
        // A carved row's offset is data: a negative or misaligned one (16-byte
        // loads) poisons the sequence like a bad block id, before any load.
        int64_t row0 = a.offsets ? a.offsets[s] : (int64_t)((uint64_t)s * a.seq_stride);
        if (row0 < 0 || ((uint64_t)row0 * es) % 16 != 0) {
            bad = true;
            row0 = 0;
        }
        uint64_t off = ((uint64_t)row0 + (uint64_t)kvh * a.head_stride) * es;
        kb = a.k + off;
        vb = a.v + off;
        sc0 += (uint64_t)row0 * es;
    }
    const C *kt = reinterpret_cast<const C *>(kb);
    const C *vt = reinterpret_cast<const C *>(vb);
    const bool int8 = Q8 && a.q8_kind == PKVI_Q8_INT8;
    float acc[G][EL];
#pragma unroll
    for (int g = 0; g < G; g++) {
#pragma unroll
        for (int e = 0; e < EL; e++) {
            acc[g][e] = 0.0f;
        }
    }
    __syncthreads();

    int buf = 0;
    for (uint32_t t0 = start; t0 < end; t0 += TILE, buf ^= 1) {
        const uint32_t n = min((uint32_t)TILE, end - t0);
        const int32_t *ids = s_ids[buf];
        // The next tile's block ids: loaded now, stored after the first barrier,
        // so their latency hides behind this tile's scores.
        int32_t next_id = 0;
        const uint32_t t1 = t0 + TILE;
        if (paged && t1 < end) {
            next_id = tile_block_id(a, table, t1, min((uint32_t)TILE, end - t1), tid, &bad);
        }
        // int8: the K and V scales of token t0 + tid, stored for the softmax after
        // the scores (their latency hides behind them), as the cache lays them out.
        float ksc = 1.0f, vsc = 1.0f;
        if (int8 && (uint32_t)tid < n) {
            const uint32_t t = t0 + tid;
            uint64_t o = sc0 + (uint64_t)t * a.scale_ts * 4u;
            if (paged) {
                const uint64_t blk = (uint64_t)ids[(t >> a.block_shift) - (t0 >> a.block_shift)];
                o = sc0 + blk * a.block_stride +
                    (uint64_t)(t & ((1u << a.block_shift) - 1u)) * a.scale_ts * 4u;
            }
            ksc = __ldg(reinterpret_cast<const float *>(a.k + o));
            vsc = __ldg(reinterpret_cast<const float *>(a.v + o));
        }
        // Scores. Step: each thread loads U rows (rg, rg + NRG, ...) before using
        // any; rows past the tile load row n - 1 instead (no branch) and are not
        // stored. The loop bound is uniform, so the shuffles see the full warp.
        for (uint32_t i0 = 0; i0 < n; i0 += STEP) {
            loads kr;
#pragma unroll
            for (int l = 0; l < loads::L; l++) {
                const int u = loads::row_of(l, ln);
                const uint32_t i = min(i0 + rg + (uint32_t)(u * NRG), n - 1);
                kr.load(l, kt + row_off(a, paged, ids, t0, t0 + i), ln);
            }
            kr.swap(ln);
            // Rows c .. c + UC - 1: their G x UC dot products, reduced and stored
            // before the next chunk's (the step's loads are all issued already).
            // A sum's lane tree is tsum's whatever the chunk: the same bits.
#pragma unroll
            for (int c = 0; c < U; c += UC) {
                float dot[N];
#pragma unroll
                for (int u = 0; u < UC; u++) {
                    float kf[EL];
                    kr.row(c + u, a.q8_kind, kf);
#pragma unroll
                    for (int g = 0; g < G; g++) {
                        float d = 0.0f;
#pragma unroll
                        for (int e = 0; e < EL; e++) {
                            d += kf[e] * qf[g][e];
                        }
                        dot[g * UC + u] = d;
                    }
                }
                tsum<N, N, LPR / 2>::run(dot, ln);
                // This lane now holds the sums of values ln * N / LPR + k (see tsum).
                constexpr int HELD = N >= LPR ? N / LPR : 1;   // sums per lane
                constexpr int SPREAD = N >= LPR ? 1 : LPR / N; // lanes per sum
                const bool owner = ln % SPREAD == 0;
#pragma unroll
                for (int k = 0; k < HELD; k++) {
                    const int idx = ln / SPREAD * HELD + k;
                    const int g = idx / UC;
                    const uint32_t i = i0 + rg + (uint32_t)((c + idx % UC) * NRG);
                    if (owner && i < n) {
                        s_p[buf][g][i] = dot[k];
                    }
                }
            }
        }
        if (int8) {
            s_sc[0][tid] = ksc; // the previous tile's readers are past its last barrier
            s_sc[1][tid] = vsc;
        }
        __syncthreads();
        if (paged && t1 < end) {
            s_ids[buf ^ 1][tid] = next_id; // every reader of this buffer is past the barrier
        }
        // Online softmax: one warp per head.
        for (uint32_t g = warp; g < a.hpc; g += THREADS / 32) {
            float mx = -INFINITY;
            for (uint32_t i = lane; i < n; i += 32) {
                float x = s_p[buf][g][i];
                if (int8) {
                    x *= s_sc[0][i]; // the row's K scale (read by this lane only)
                    s_p[buf][g][i] = x;
                }
                mx = fmaxf(mx, x);
            }
            mx = pkvi_warp_max(mx);
            const float m_old = s_m[g];
            const float m_new = fmaxf(m_old, mx);
            const float alpha = m_old == -INFINITY ? 0.0f : expf(m_old - m_new);
            float sum = 0.0f;
            for (uint32_t i = lane; i < n; i += 32) {
                float p = expf(s_p[buf][g][i] - m_new);
                sum += p;
                // int8: the row's V scale rides on its weight, not on the sum.
                s_p[buf][g][i] = int8 ? p * s_sc[1][i] : p;
            }
            sum = pkvi_group_sum(sum, 32);
            if (lane == 0) {
                s_l[g] = s_l[g] * alpha + sum;
                s_m[g] = m_new;
                s_alpha[g] = alpha;
            }
        }
        __syncthreads();
        // Values: rescale, then accumulate this tile's rows, U loads in flight.
        // No barrier after this phase: the next tile writes the other s_p and
        // s_ids buffers, and its first barrier orders s_alpha.
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
        for (uint32_t i0 = 0; i0 < n; i0 += STEP) {
            loads vr;
#pragma unroll
            for (int l = 0; l < loads::L; l++) {
                const int u = loads::row_of(l, ln);
                const uint32_t i = min(i0 + rg + (uint32_t)(u * NRG), n - 1);
                vr.load(l, vt + row_off(a, paged, ids, t0, t0 + i), ln);
            }
            vr.swap(ln);
#pragma unroll
            for (int u = 0; u < U; u++) {
                const uint32_t i = i0 + rg + (uint32_t)(u * NRG);
                float vf[EL];
                vr.row(u, a.q8_kind, vf);
#pragma unroll
                for (int g = 0; g < G; g++) {
                    if (g < (int)a.hpc) {
                        const float p = i < n ? s_p[buf][g][i] : 0.0f;
#pragma unroll
                        for (int e = 0; e < EL; e++) {
                            acc[g][e] += p * vf[e];
                        }
                    }
                }
            }
        }
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
            const float inv_l = a.vmul / s_l[g]; // fp8: the V tensor scale too
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
// Grid: one block per (query row, query head), flattened into x (no 65535 limit).
template <typename T, int D>
__global__ void __launch_bounds__(THREADS) merge_kernel(const __grid_constant__ dec_args a) {
    const uint64_t hrow = blockIdx.x;
    const uint32_t s = (uint32_t)(hrow / a.num_heads);
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

// The split-K plan of one call: with opts->num_splits 0, the wave-aware plan from
// the occupancy of the decode kernel about to be launched (attn_plan.c). Host work
// only (no allocation, copy or synchronization): safe inside a CUDA graph capture.
struct split_req {
    const pkv_attn_cuda_opts *opts; // NULL: no split
    uint32_t max_context;
};

template <typename K>
pkv_status plan(const pkv_attn_shape *sh, uint32_t num_seqs, const split_req &req, K kernel,
                dec_args *a) {
    const pkv_attn_cuda_opts *opts = req.opts;
    uint32_t n = 1;
    if (opts != nullptr && opts->workspace != nullptr && opts->num_splits != 1) {
        if (!pkvi_aligned16(opts->workspace)) {
            return PKV_ERR_INVALID_ARG;
        }
        // The most partitions the workspace holds (its size is linear in them).
        uint32_t fit = PKVI_ATTN_MAX_SPLITS;
        size_t need = 0;
        while (fit > 1 && (pkv_attn_cuda_workspace_bytes(sh, num_seqs, fit, &need) != PKV_OK ||
                           need > opts->workspace_bytes)) {
            fit--;
        }
        n = opts->num_splits;
        if (n == 0) {
            int sms = (int)opts->num_sms;
            int per_sm = 0;
            int dev = 0;
            if ((sms == 0 &&
                 (cudaGetDevice(&dev) != cudaSuccess ||
                  cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev) !=
                      cudaSuccess)) ||
                cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, kernel, THREADS, 0) !=
                    cudaSuccess) {
                return PKV_ERR_NO_DEVICE; // these calls set no sticky error
            }
            // Planned within what the workspace holds, not cut down after.
            pkv_status st = pkvi_attn_num_splits(sh, num_seqs, req.max_context, (uint32_t)sms,
                                                 per_sm > 0 ? (uint32_t)per_sm : 1u, fit, &n);
            if (st != PKV_OK) {
                return st;
            }
        }
        if (n > fit) {
            n = fit;
        }
    }
    pkvi_attn_partition(req.max_context, n, &a->part_len, &a->parts);
    if (a->parts > 1) {
        a->ws_o = static_cast<float *>(opts->workspace);
        a->ws_ml = a->ws_o + (uint64_t)num_seqs * sh->num_heads * a->parts * sh->head_dim;
    }
    return PKV_OK;
}

template <typename T, typename C, int D, int G>
pkv_status launch_g(const pkv_attn_shape *sh, dec_args a, uint32_t rows, const split_req &req,
                    cudaStream_t stream) {
    pkv_status st = plan(sh, a.num_seqs, req, decode_kernel<T, C, D, G>, &a);
    if (st != PKV_OK) {
        return st;
    }
    if ((uint64_t)rows * a.num_heads > (uint64_t)INT32_MAX) {
        return PKV_ERR_UNSUPPORTED; // merge grid beyond 2^31 - 1 blocks
    }
    const cudaError_t before = pkvi_launch_begin();
    // Grid: x = query rows (sequences in decode), y = kv heads x head groups,
    // z = context partitions; THREADS threads each.
    dim3 grid(rows, sh->num_kv_heads * a.gpk, a.parts);
    decode_kernel<T, C, D, G><<<grid, THREADS, 0, stream>>>(a);
    if (a.parts > 1) {
        // Grid: one block per (row, query head), threads over head_dim.
        merge_kernel<T, D><<<(unsigned)(rows * a.num_heads), THREADS, 0, stream>>>(a);
    }
    return pkvi_launch_status(before);
}

template <typename T, typename C, int D>
pkv_status launch_t(const pkv_attn_shape *sh, const dec_args &a, uint32_t rows,
                    const split_req &req, cudaStream_t stream) {
    if (a.hpc == 1) {
        return launch_g<T, C, D, 1>(sh, a, rows, req, stream);
    } else if (a.hpc == 2) {
        return launch_g<T, C, D, 2>(sh, a, rows, req, stream);
    } else if (a.hpc <= 4) {
        return launch_g<T, C, D, 4>(sh, a, rows, req, stream);
    }
    return launch_g<T, C, D, GMAX>(sh, a, rows, req, stream);
}

template <typename T, typename C>
pkv_status launch_d(const pkv_attn_shape *sh, const dec_args &a, uint32_t rows,
                    const split_req &req, cudaStream_t st) {
    switch (sh->head_dim) {
    case 64:
        return launch_t<T, C, 64>(sh, a, rows, req, st);
    case 128:
        return launch_t<T, C, 128>(sh, a, rows, req, st);
    default:
        return launch_t<T, C, 256>(sh, a, rows, req, st);
    }
}

// The cache's element type: T itself, or bytes of an 8-bit cache (qz != NULL).
template <typename T>
pkv_status launch_c(const pkv_attn_shape *sh, const dec_args &a, uint32_t rows,
                    const split_req &req, const pkv_attn_kv_quant *qz, cudaStream_t st) {
    if (qz != nullptr) {
        return launch_d<T, uint8_t>(sh, a, rows, req, st);
    }
    return launch_d<T, T>(sh, a, rows, req, st);
}

// Shape fields, the grid limits, then the dtype dispatch (which plans split-K
// with the chosen kernel's occupancy and launches).
// qz: an 8-bit cache's format and scales (NULL: the cache is in sh->dtype).
static pkv_status launch(const pkv_attn_shape *sh, dec_args a, uint32_t num_seqs,
                         uint32_t rows, const split_req &req, cudaStream_t st,
                         const pkv_attn_kv_quant *qz = nullptr) {
    pkvi_attn_cuda_groups(sh, &a.hpc, &a.gpk);
    a.kmul = 1.0f;
    a.vmul = 1.0f;
    if (qz != nullptr) {
        a.q8_kind = pkvi_q8_kind_of(qz->kv_dtype);
        if (a.q8_kind == PKVI_Q8_INT8) {
            a.scale_offset = qz->scale_offset;
            a.scale_hs = qz->scale_head_stride;
            a.scale_ts = qz->scale_token_stride;
        } else {
            a.kmul = qz->k_scale * pkvi_q8_bias(a.q8_kind);
            a.vmul = qz->v_scale * pkvi_q8_bias(a.q8_kind);
        }
    }
    a.num_seqs = num_seqs;
    a.num_heads = sh->num_heads;
    a.group = sh->num_heads / sh->num_kv_heads;
    a.scale = sh->scale;
    split_req r = req;
    if (req.opts != nullptr && req.opts->max_context != 0) {
        if (req.opts->max_context > req.max_context) {
            return PKV_ERR_INVALID_ARG;
        }
        r.max_context = req.opts->max_context; // the caller's tight bound plans the split
    }
    a.cap = r.max_context;
    if (rows > (uint32_t)INT32_MAX || (uint64_t)sh->num_kv_heads * a.gpk > 65535u) {
        return PKV_ERR_UNSUPPORTED; // beyond the grid limits
    }
    switch (sh->dtype) {
    case PKV_DTYPE_F32:
        return launch_c<float>(sh, a, rows, r, qz, st);
    case PKV_DTYPE_F16:
        return launch_c<__half>(sh, a, rows, r, qz, st);
    default:
        return launch_c<__nv_bfloat16>(sh, a, rows, r, qz, st);
    }
}

// es: bytes per cache element (the shape's dtype, or 1 for an 8-bit cache).
static pkv_status check_paged(const pkv_attn_shape *sh, const void *q,
                              const pkv_attn_paged_kv *kv, const void *out, size_t es) {
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
    if (!pkvi_aligned16(q) || !pkvi_aligned16(out) || !pkvi_aligned16(kv->k_cache) ||
        !pkvi_aligned16(kv->v_cache) || !pkvi_stride16(kv->block_stride, es) ||
        !pkvi_stride16(kv->head_stride, es) || !pkvi_stride16(kv->token_stride, es)) {
        return PKV_ERR_UNSUPPORTED; // 16-byte vector loads need 16-byte aligned rows
    }
    return PKV_OK;
}

static dec_args paged_args(const void *q, const pkv_attn_paged_kv *kv, void *out) {
    dec_args a = {};
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
    uint32_t shift = 0;
    while ((1u << shift) < kv->block_size) {
        shift++;
    }
    a.block_shift = shift;
    return a;
}

} // namespace

extern "C" pkv_status pkv_attn_decode_paged_cuda_ex(const pkv_attn_shape *shape,
                                                    uint32_t num_seqs, const void *q,
                                                    const pkv_attn_paged_kv *kv, void *out,
                                                    const pkv_attn_cuda_opts *opts,
                                                    void *stream) {
    pkv_status st = check_paged(shape, q, kv, out, pkv_dtype_size(shape->dtype));
    if (st != PKV_OK || num_seqs == 0) {
        return st;
    }
    split_req req = {opts, kv->max_blocks_per_seq * kv->block_size};
    return launch(shape, paged_args(q, kv, out), num_seqs, num_seqs, req,
                  static_cast<cudaStream_t>(stream));
}

extern "C" pkv_status pkv_attn_decode_paged_cuda(const pkv_attn_shape *shape, uint32_t num_seqs,
                                                 const void *q, const pkv_attn_paged_kv *kv,
                                                 void *out, void *stream) {
    return pkv_attn_decode_paged_cuda_ex(shape, num_seqs, q, kv, out, nullptr, stream);
}

// A prefill launch of either layout once its descriptor is checked: no split-K,
// num_rows packed query rows (the caller's count: no read-back); quant: an 8-bit
// cache (NULL: 16-bit).
static pkv_status launch_prefill(const pkv_attn_shape *shape, dec_args a, uint32_t num_seqs,
                                 const int32_t *q_indptr, uint32_t num_rows,
                                 uint32_t max_context, void *stream,
                                 const pkv_attn_kv_quant *quant = nullptr) {
    if (q_indptr == nullptr) {
        return PKV_ERR_INVALID_ARG;
    }
    if (num_seqs == 0 || num_rows == 0) {
        return PKV_OK;
    }
    a.q_indptr = q_indptr;
    split_req req = {nullptr, max_context};
    return launch(shape, a, num_seqs, num_rows, req, static_cast<cudaStream_t>(stream), quant);
}

// The host checks of a contiguous call and its launch arguments.
static pkv_status contig_args(const pkv_attn_shape *shape, const void *q,
                              const pkv_attn_contig_kv *kv, void *out, dec_args *a,
                              size_t es) {
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
    if (!pkvi_aligned16(q) || !pkvi_aligned16(out) || !pkvi_aligned16(kv->k_cache) ||
        !pkvi_aligned16(kv->v_cache) ||
        (kv->seq_offsets == nullptr && !pkvi_stride16(kv->seq_stride, es)) ||
        !pkvi_stride16(kv->head_stride, es) || !pkvi_stride16(kv->token_stride, es)) {
        return PKV_ERR_UNSUPPORTED; // (seq_stride is unused with seq_offsets)
    }
    *a = dec_args{};
    a->q = q;
    a->out = out;
    a->k = static_cast<const char *>(kv->k_cache);
    a->v = static_cast<const char *>(kv->v_cache);
    a->tables = nullptr;
    a->lens = kv->seq_lens;
    a->seq_stride = kv->seq_stride;
    a->offsets = kv->seq_offsets;
    a->head_stride = kv->head_stride;
    a->token_stride = kv->token_stride;
    return PKV_OK;
}

extern "C" pkv_status pkv_attn_decode_contig_cuda_ex(const pkv_attn_shape *shape,
                                                     uint32_t num_seqs, const void *q,
                                                     const pkv_attn_contig_kv *kv, void *out,
                                                     const pkv_attn_cuda_opts *opts,
                                                     void *stream) {
    dec_args a;
    pkv_status st = contig_args(shape, q, kv, out, &a, pkv_dtype_size(shape->dtype));
    if (st != PKV_OK || num_seqs == 0) {
        return st;
    }
    split_req req = {opts, kv->max_seq_len};
    return launch(shape, a, num_seqs, num_seqs, req, static_cast<cudaStream_t>(stream));
}

extern "C" pkv_status pkv_attn_prefill_contig_cuda_ex(const pkv_attn_shape *shape,
                                                      uint32_t num_seqs, const int32_t *q_indptr,
                                                      uint32_t num_rows, const void *q,
                                                      const pkv_attn_contig_kv *kv, void *out,
                                                      void *stream) {
    dec_args a;
    pkv_status st = contig_args(shape, q, kv, out, &a, pkv_dtype_size(shape->dtype));
    if (st != PKV_OK) {
        return st;
    }
    return launch_prefill(shape, a, num_seqs, q_indptr, num_rows, kv->max_seq_len, stream);
}

extern "C" pkv_status pkv_attn_decode_contig_cuda(const pkv_attn_shape *shape,
                                                  uint32_t num_seqs, const void *q,
                                                  const pkv_attn_contig_kv *kv, void *out,
                                                  void *stream) {
    return pkv_attn_decode_contig_cuda_ex(shape, num_seqs, q, kv, out, nullptr, stream);
}

// Prefill: one thread block per (prompt token, kv head, head group), no split-K.
extern "C" pkv_status pkv_attn_prefill_paged_cuda_ex(const pkv_attn_shape *shape,
                                                     uint32_t num_seqs, const int32_t *q_indptr,
                                                     uint32_t num_rows, const void *q,
                                                     const pkv_attn_paged_kv *kv, void *out,
                                                     void *stream) {
    pkv_status st = check_paged(shape, q, kv, out, pkv_dtype_size(shape->dtype));
    if (st != PKV_OK) {
        return st;
    }
    return launch_prefill(shape, paged_args(q, kv, out), num_seqs, q_indptr, num_rows,
                          kv->max_blocks_per_seq * kv->block_size, stream);
}

// The packed row count q_indptr[num_seqs], read back from the device (one
// synchronization of `stream`).
static pkv_status read_rows(const int32_t *q_indptr, uint32_t num_seqs, cudaStream_t cs,
                            int32_t *rows) {
    if (cudaMemcpyAsync(rows, q_indptr + num_seqs, sizeof *rows, cudaMemcpyDeviceToHost, cs) !=
            cudaSuccess ||
        cudaStreamSynchronize(cs) != cudaSuccess) {
        return PKV_ERR_BACKEND;
    }
    return *rows < 0 ? PKV_ERR_INVALID_ARG : PKV_OK;
}

// The grid needs the packed row count, q_indptr[num_seqs], which lives on the
// device: it is read back once, synchronizing `stream`.
extern "C" pkv_status pkv_attn_prefill_paged_cuda(const pkv_attn_shape *shape,
                                                  uint32_t num_seqs, const int32_t *q_indptr,
                                                  const void *q, const pkv_attn_paged_kv *kv,
                                                  void *out, void *stream) {
    pkv_status st = check_paged(shape, q, kv, out, pkv_dtype_size(shape->dtype));
    if (st != PKV_OK) {
        return st;
    }
    if (q_indptr == nullptr) {
        return PKV_ERR_INVALID_ARG;
    }
    if (num_seqs == 0) {
        return PKV_OK;
    }
    int32_t rows = 0;
    st = read_rows(q_indptr, num_seqs, static_cast<cudaStream_t>(stream), &rows);
    if (st != PKV_OK) {
        return st;
    }
    return pkv_attn_prefill_paged_cuda_ex(shape, num_seqs, q_indptr, (uint32_t)rows, q, kv, out,
                                          stream);
}

// ---- 8-bit caches: the same kernels with C = uint8_t ----------------------------
// Checks as the 16-bit calls (strides in bytes), the format, and 4-byte aligned
// int8 scales (base_stride: bytes between blocks or fixed rows, 0 = none).
static pkv_status check_q8(const pkv_attn_shape *shape, const pkv_attn_kv_quant *quant,
                           const void *kc, const void *vc, uint64_t base_stride) {
    pkv_status st = pkvi_attn_check_shape(shape, 1);
    if (st == PKV_OK) {
        st = pkvi_attn_check_quant(quant);
    }
    if (st == PKV_OK && !pkvi_q8_scales_aligned(quant, kc, vc, base_stride)) {
        st = PKV_ERR_UNSUPPORTED;
    }
    return st;
}

extern "C" pkv_status pkv_attn_decode_paged_quant_cuda_ex(
    const pkv_attn_shape *shape, const pkv_attn_kv_quant *quant, uint32_t num_seqs,
    const void *q, const pkv_attn_paged_kv *kv, void *out, const pkv_attn_cuda_opts *opts,
    void *stream) {
    pkv_status st = check_paged(shape, q, kv, out, 1);
    if (st == PKV_OK) {
        st = check_q8(shape, quant, kv->k_cache, kv->v_cache, kv->block_stride);
    }
    if (st != PKV_OK || num_seqs == 0) {
        return st;
    }
    split_req req = {opts, kv->max_blocks_per_seq * kv->block_size};
    return launch(shape, paged_args(q, kv, out), num_seqs, num_seqs, req,
                  static_cast<cudaStream_t>(stream), quant);
}

extern "C" pkv_status pkv_attn_decode_paged_quant_cuda(const pkv_attn_shape *shape,
                                                       const pkv_attn_kv_quant *quant,
                                                       uint32_t num_seqs, const void *q,
                                                       const pkv_attn_paged_kv *kv, void *out,
                                                       void *stream) {
    return pkv_attn_decode_paged_quant_cuda_ex(shape, quant, num_seqs, q, kv, out, nullptr,
                                               stream);
}

extern "C" pkv_status pkv_attn_decode_contig_quant_cuda_ex(
    const pkv_attn_shape *shape, const pkv_attn_kv_quant *quant, uint32_t num_seqs,
    const void *q, const pkv_attn_contig_kv *kv, void *out, const pkv_attn_cuda_opts *opts,
    void *stream) {
    dec_args a;
    pkv_status st = contig_args(shape, q, kv, out, &a, 1);
    if (st == PKV_OK) {
        // Carved rows start 16-byte aligned (the kernel checks each offset).
        st = check_q8(shape, quant, kv->k_cache, kv->v_cache,
                      kv->seq_offsets != nullptr ? 0 : kv->seq_stride);
    }
    if (st != PKV_OK || num_seqs == 0) {
        return st;
    }
    split_req req = {opts, kv->max_seq_len};
    return launch(shape, a, num_seqs, num_seqs, req, static_cast<cudaStream_t>(stream), quant);
}

extern "C" pkv_status pkv_attn_decode_contig_quant_cuda(const pkv_attn_shape *shape,
                                                        const pkv_attn_kv_quant *quant,
                                                        uint32_t num_seqs, const void *q,
                                                        const pkv_attn_contig_kv *kv, void *out,
                                                        void *stream) {
    return pkv_attn_decode_contig_quant_cuda_ex(shape, quant, num_seqs, q, kv, out, nullptr,
                                                stream);
}

extern "C" pkv_status pkv_attn_prefill_paged_quant_cuda_ex(
    const pkv_attn_shape *shape, const pkv_attn_kv_quant *quant, uint32_t num_seqs,
    const int32_t *q_indptr, uint32_t num_rows, const void *q, const pkv_attn_paged_kv *kv,
    void *out, void *stream) {
    pkv_status st = check_paged(shape, q, kv, out, 1);
    if (st == PKV_OK) {
        st = check_q8(shape, quant, kv->k_cache, kv->v_cache, kv->block_stride);
    }
    if (st != PKV_OK) {
        return st;
    }
    return launch_prefill(shape, paged_args(q, kv, out), num_seqs, q_indptr, num_rows,
                          kv->max_blocks_per_seq * kv->block_size, stream, quant);
}

// The contiguous twin of the prefill above (the runtime's 8-bit contiguous store):
// the caller's row count, no read-back.
extern "C" pkv_status pkv_attn_prefill_contig_quant_cuda_ex(
    const pkv_attn_shape *shape, const pkv_attn_kv_quant *quant, uint32_t num_seqs,
    const int32_t *q_indptr, uint32_t num_rows, const void *q, const pkv_attn_contig_kv *kv,
    void *out, void *stream) {
    dec_args a;
    pkv_status st = contig_args(shape, q, kv, out, &a, 1);
    if (st == PKV_OK) {
        st = check_q8(shape, quant, kv->k_cache, kv->v_cache,
                      kv->seq_offsets != nullptr ? 0 : kv->seq_stride);
    }
    if (st != PKV_OK) {
        return st;
    }
    return launch_prefill(shape, a, num_seqs, q_indptr, num_rows, kv->max_seq_len, stream, quant);
}

// Reads the packed row count back, as pkv_attn_prefill_paged_cuda.
extern "C" pkv_status pkv_attn_prefill_paged_quant_cuda(const pkv_attn_shape *shape,
                                                        const pkv_attn_kv_quant *quant,
                                                        uint32_t num_seqs,
                                                        const int32_t *q_indptr, const void *q,
                                                        const pkv_attn_paged_kv *kv, void *out,
                                                        void *stream) {
    pkv_status st = check_paged(shape, q, kv, out, 1);
    if (st == PKV_OK) {
        st = check_q8(shape, quant, kv->k_cache, kv->v_cache, kv->block_stride);
    }
    if (st != PKV_OK) {
        return st;
    }
    if (q_indptr == nullptr) {
        return PKV_ERR_INVALID_ARG;
    }
    if (num_seqs == 0) {
        return PKV_OK;
    }
    int32_t rows = 0;
    st = read_rows(q_indptr, num_seqs, static_cast<cudaStream_t>(stream), &rows);
    if (st != PKV_OK) {
        return st;
    }
    return pkv_attn_prefill_paged_quant_cuda_ex(shape, quant, num_seqs, q_indptr, (uint32_t)rows,
                                                q, kv, out, stream);
}

// SPDX-License-Identifier: MIT
// The CUDA op table of the decoder: cuBLAS SGEMM for every linear layer, the
// attention library's CUDA kernels for the paged and contiguous caches (decode
// and prefill), and small kernels of our own for embeddings, norms, RoPE,
// activations and the contiguous-store write.
// Invariant: every op is enqueued on the model's one stream, so they run in
// program order; only download and sync wait for the device.
#include <cuda_runtime.h>
#include <cublas_v2.h>
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "model_internal.h"

typedef struct cuda_state {
    cublasHandle_t blas;
    cudaStream_t stream;
    // Split-K workspace of the decode attention (flash-decoding): grown on the
    // first call that needs more, reused by every layer (one stream, in order).
    void *ws;
    size_t ws_bytes;
    // fp8 calibration: max|x| of one pass's K or V, as float bits (allocated on
    // the first fp8 pass that needs it).
    unsigned *amax;
} cuda_state;

// At most this much device memory for split-K partials; past it the kernel's
// plan uses fewer splits (large batches need none).
#define WS_CAP ((size_t)64 << 20)

// Decode-attention options with a workspace for the heuristic's splits.
// Split-K options for a decode call whose longest context is max_len: planned
// from that length, so that every layout (and table width) splits alike.
static pkv_attn_cuda_opts split_opts(cuda_state *s, const pkv_attn_shape *sh, uint32_t num_seqs,
                                     uint32_t max_len) {
    pkv_attn_cuda_opts o = {NULL, 0, 0, 0, max_len};
    size_t need = 0;
    if (pkv_attn_cuda_workspace_bytes(sh, num_seqs, 64, &need) != PKV_OK || need > WS_CAP)
        need = WS_CAP;
    if (need > s->ws_bytes) {
        void *p = NULL;
        if (cudaMalloc(&p, need) != cudaSuccess) {
            cudaGetLastError(); // our failed allocation; run without split-K
            return o;
        }
        cudaFree(s->ws); // synchronizes: rare (only when the batch grows)
        s->ws = p;
        s->ws_bytes = need;
    }
    o.workspace = s->ws;
    o.workspace_bytes = s->ws_bytes;
    return o;
}

static cuda_state *st_of(pkv_model *m) { return (cuda_state *)m->dev; }

static pkv_status check(cudaError_t e) {
    return e == cudaSuccess ? PKV_OK : PKV_ERR_BACKEND;
}

// A launch error (bad configuration) shows up here; execution errors surface
// at the next synchronizing call.
static pkv_status launched(void) { return check(cudaGetLastError()); }

static pkv_status cuda_init(pkv_model *m) {
    int count = 0;
    if (cudaGetDeviceCount(&count) != cudaSuccess || count <= m->params.cuda_device ||
        m->params.cuda_device < 0) {
        cudaGetLastError(); // clear the sticky "no device" error
        return PKV_ERR_NO_DEVICE;
    }
    if (cudaSetDevice(m->params.cuda_device) != cudaSuccess) return PKV_ERR_NO_DEVICE;
    cuda_state *s = (cuda_state *)calloc(1, sizeof *s);
    if (!s) return PKV_ERR_OUT_OF_MEMORY;
    if (cudaStreamCreateWithFlags(&s->stream, cudaStreamNonBlocking) != cudaSuccess) {
        free(s);
        return PKV_ERR_BACKEND;
    }
    if (cublasCreate(&s->blas) != CUBLAS_STATUS_SUCCESS) {
        cudaStreamDestroy(s->stream);
        free(s);
        return PKV_ERR_BACKEND;
    }
    cublasSetStream(s->blas, s->stream);
    // Full fp32 math: the CUDA backend is checked against the CPU one.
    cublasSetMathMode(s->blas, CUBLAS_DEFAULT_MATH);
    m->dev = s;
    return PKV_OK;
}

static void cuda_fini(pkv_model *m) {
    cuda_state *s = st_of(m);
    if (!s) return;
    cudaStreamSynchronize(s->stream);
    cudaFree(s->ws);
    cudaFree(s->amax);
    cublasDestroy(s->blas);
    cudaStreamDestroy(s->stream);
    free(s);
    m->dev = NULL;
}

static pkv_status cuda_alloc(pkv_model *m, size_t bytes, void **ptr) {
    (void)m;
    void *p = NULL;
    if (cudaMalloc(&p, bytes ? bytes : 1) != cudaSuccess) {
        cudaGetLastError();
        return PKV_ERR_OUT_OF_MEMORY;
    }
    *ptr = p;
    return PKV_OK;
}

static void cuda_release(pkv_model *m, void *ptr) {
    if (m->dev) cudaStreamSynchronize(st_of(m)->stream);
    cudaFree(ptr);
}

static pkv_status cuda_upload(pkv_model *m, void *dst, const void *src, size_t bytes) {
    // From pageable host memory the call returns once the source is staged, so
    // the host may refill its metadata right after.
    return check(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyHostToDevice, st_of(m)->stream));
}

static pkv_status cuda_download(pkv_model *m, void *dst, const void *src, size_t bytes) {
    cudaStream_t s = st_of(m)->stream;
    pkv_status st = check(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToHost, s));
    if (st == PKV_OK) st = check(cudaStreamSynchronize(s));
    return st;
}

static pkv_status cuda_copy(pkv_model *m, void *dst, const void *src, size_t bytes) {
    return check(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice, st_of(m)->stream));
}

static pkv_status cuda_sync(pkv_model *m) { return check(cudaStreamSynchronize(st_of(m)->stream)); }

// ---- kernels ----------------------------------------------------------------

#define THREADS 256

// Sum (or max) over a block of THREADS threads; every thread gets the result.
static __device__ float block_reduce(float v, int is_max) {
    __shared__ float warp_part[THREADS / 32];
    for (int o = 16; o > 0; o >>= 1) {
        float other = __shfl_xor_sync(0xffffffffu, v, o);
        v = is_max ? fmaxf(v, other) : v + other;
    }
    int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
    if (lane == 0) warp_part[warp] = v;
    __syncthreads();
    v = warp_part[0];
    for (int w = 1; w < (int)(blockDim.x / 32); w++)
        v = is_max ? fmaxf(v, warp_part[w]) : v + warp_part[w];
    __syncthreads();
    return v;
}

static __global__ void embed_kernel(uint32_t d, const int32_t *tok, const int32_t *pos,
                             const float *wte, const float *wpe, float *x) {
    // x: [T][d]; wte: [vocab][d]; wpe: [max_seq_len][d] or NULL
    uint32_t t = blockIdx.x;
    const float *e = wte + (size_t)tok[t] * d;
    const float *p = wpe ? wpe + (size_t)pos[t] * d : NULL;
    for (uint32_t i = threadIdx.x; i < d; i += blockDim.x)
        x[(size_t)t * d + i] = e[i] + (p ? p[i] : 0.0f);
}

static __global__ void norm_kernel(uint32_t d, int rms, float eps, const float *x, const float *w,
                            const float *b, float *y) {
    // x, y: [rows][d]; w, b: [d]
    const float *xr = x + (size_t)blockIdx.x * d;
    float *yr = y + (size_t)blockIdx.x * d;
    float mean = 0.0f;
    if (!rms) {
        float s = 0.0f;
        for (uint32_t i = threadIdx.x; i < d; i += blockDim.x) s += xr[i];
        mean = block_reduce(s, 0) / d;
    }
    float ss = 0.0f;
    for (uint32_t i = threadIdx.x; i < d; i += blockDim.x) ss += (xr[i] - mean) * (xr[i] - mean);
    float inv = rsqrtf(block_reduce(ss, 0) / d + eps);
    for (uint32_t i = threadIdx.x; i < d; i += blockDim.x)
        yr[i] = (xr[i] - mean) * inv * w[i] + (b ? b[i] : 0.0f);
}

static __global__ void bias_kernel(uint32_t n, const float *b, float *y) {
    // y: [T][n]; b: [n]
    for (uint32_t j = threadIdx.x; j < n; j += blockDim.x) y[(size_t)blockIdx.x * n + j] += b[j];
}

static __global__ void rope_kernel(uint32_t heads, uint32_t kv_heads, uint32_t hd, double theta,
                            const int32_t *pos, float *q, float *k) {
    // q: [T][heads][hd]; k: [T][kv_heads][hd]; interleaved pairs (2i, 2i+1)
    uint32_t t = blockIdx.x, half = hd / 2;
    for (uint32_t e = threadIdx.x; e < (heads + kv_heads) * half; e += blockDim.x) {
        uint32_t h = e / half, i = e % half;
        float *v = h < heads ? q + ((size_t)t * heads + h) * hd
                             : k + ((size_t)t * kv_heads + (h - heads)) * hd;
        double a = (double)pos[t] * pow(theta, -2.0 * (double)i / (double)hd);
        float c = (float)cos(a), s = (float)sin(a);
        float x0 = v[2 * i], x1 = v[2 * i + 1];
        v[2 * i] = x0 * c - x1 * s;
        v[2 * i + 1] = x0 * s + x1 * c;
    }
}

static __global__ void act_kernel(size_t n, float *a, const float *b) {
    // a, b: [T][d_ff]; b NULL = GELU (tanh form), else SwiGLU silu(a) * b
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n;
         i += (size_t)gridDim.x * blockDim.x) {
        float x = a[i];
        a[i] = b ? x / (1.0f + expf(-x)) * b[i]
                 : 0.5f * x * (1.0f + tanhf(0.7978845608f * (x + 0.044715f * x * x * x)));
    }
}

static __global__ void gather_kernel(uint32_t d, const int32_t *last, const float *x, float *xl) {
    // x: [T][d]; xl: [S][d]
    for (uint32_t i = threadIdx.x; i < d; i += blockDim.x)
        xl[(size_t)blockIdx.x * d + i] = x[(size_t)last[blockIdx.x] * d + i];
}

// Store element types: fp32, fp16 (__half) and bf16 (__nv_bfloat16).
__device__ __forceinline__ float widen(float x) { return x; }
__device__ __forceinline__ float widen(__half x) { return __half2float(x); }
__device__ __forceinline__ float widen(__nv_bfloat16 x) { return __bfloat162float(x); }
__device__ __forceinline__ void narrow(float x, __half *d) { *d = __float2half_rn(x); }
__device__ __forceinline__ void narrow(float x, __nv_bfloat16 *d) { *d = __float2bfloat16_rn(x); }

template <typename H>
static __global__ void to_half_kernel(size_t n, const float *src, H *dst) {
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n;
         i += (size_t)gridDim.x * blockDim.x)
        narrow(src[i], &dst[i]);
}

template <typename H>
static __global__ void from_half_kernel(size_t n, const H *src, float *dst) {
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n;
         i += (size_t)gridDim.x * blockDim.x)
        dst[i] = widen(src[i]);
}

template <typename T>
static __global__ void contig_write_kernel(uint32_t kvh, uint32_t hd, uint64_t head_stride,
                                    uint64_t token_stride, const int32_t *tseq, const int32_t *pos,
                                    const int64_t *row_off, const T *k, const T *v, T *ck, T *cv) {
    // k, v: [T][kvh][hd] -> the store's rows of one layer, at row_off
    uint32_t t = blockIdx.x, h = blockIdx.y;
    size_t dst = (size_t)row_off[tseq[t]] + h * head_stride + (size_t)pos[t] * token_stride;
    size_t src = ((size_t)t * kvh + h) * hd;
    for (uint32_t i = threadIdx.x; i < hd; i += blockDim.x) {
        ck[dst + i] = k[src + i];
        cv[dst + i] = v[src + i];
    }
}

// *amax = max(*amax, max|x|) over n values, as float bits: non-negative floats
// order as their bit patterns. NaNs are skipped (fmaxf), as the CPU model's
// calibration skips them; an inf wins.
static __global__ void amax_kernel(size_t n, const float *x, unsigned *amax) {
    float a = 0.0f;
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n;
         i += (size_t)gridDim.x * blockDim.x)
        a = fmaxf(a, fabsf(x[i]));
    a = block_reduce(a, 1);
    if (threadIdx.x == 0) atomicMax(amax, __float_as_uint(a));
}

// ---- ops --------------------------------------------------------------------

static pkv_status cuda_embed(pkv_model *m, uint32_t T, float *x) {
    // Grid: one block per token, threads over d_model.
    embed_kernel<<<T, THREADS, 0, st_of(m)->stream>>>(m->cfg.d_model, m->s.tok, m->s.pos,
                                                      m->w.wte, m->w.wpe, x);
    return launched();
}

static pkv_status cuda_norm(pkv_model *m, uint32_t rows, const float *x, const float *w,
                            const float *b, float *y) {
    // Grid: one block per row, THREADS threads reduce over d_model.
    norm_kernel<<<rows, THREADS, 0, st_of(m)->stream>>>(
        m->cfg.d_model, m->cfg.norm == PKV_NORM_RMSNORM, m->cfg.norm_eps, x, w, b, y);
    return launched();
}

static pkv_status cuda_linear(pkv_model *m, uint32_t T, uint32_t k, uint32_t n, const float *x,
                              const float *w, const float *b, float *y, int accumulate) {
    // Row-major y[T][n] = x[T][k] w[n][k]^T, seen column-major: y is (n x T, ld n),
    // w is (k x n, ld k) used transposed, x is (k x T, ld k): y = w^T x.
    const float one = 1.0f, beta = accumulate ? 1.0f : 0.0f;
    if (cublasSgemm(st_of(m)->blas, CUBLAS_OP_T, CUBLAS_OP_N, (int)n, (int)T, (int)k, &one, w,
                    (int)k, x, (int)k, &beta, y, (int)n) != CUBLAS_STATUS_SUCCESS)
        return PKV_ERR_BACKEND;
    if (b) {
        // Grid: one block per token row, threads over n.
        bias_kernel<<<T, THREADS, 0, st_of(m)->stream>>>(n, b, y);
        return launched();
    }
    return PKV_OK;
}

static pkv_status cuda_rope(pkv_model *m, uint32_t T, float *q, float *k) {
    // Grid: one block per token, threads over (head, pair).
    rope_kernel<<<T, THREADS, 0, st_of(m)->stream>>>(m->cfg.num_heads, m->cfg.num_kv_heads,
                                                     m->cfg.head_dim, m->cfg.rope_theta,
                                                     m->s.pos, q, k);
    return launched();
}

static pkv_status cuda_act(pkv_model *m, uint32_t T, float *a, const float *b) {
    size_t n = (size_t)T * m->cfg.d_ff;
    unsigned blocks = (unsigned)((n + THREADS - 1) / THREADS);
    if (blocks > 65535u) blocks = 65535u;
    // Grid: 1-D grid-stride over T * d_ff elements.
    act_kernel<<<blocks, THREADS, 0, st_of(m)->stream>>>(n, a, b);
    return launched();
}

static pkv_status cuda_gather_last(pkv_model *m, uint32_t S, const float *x, float *xl) {
    // Grid: one block per sequence, threads over d_model.
    gather_kernel<<<S, THREADS, 0, st_of(m)->stream>>>(m->cfg.d_model, m->s.last, x, xl);
    return launched();
}

static unsigned grid_for(size_t n) {
    size_t blocks = (n + THREADS - 1) / THREADS;
    return (unsigned)(blocks > 65535 ? 65535 : blocks ? blocks : 1);
}

// Round n fp32 values to the store's 16-bit dtype.
static pkv_status narrow_n(pkv_model *m, size_t n, pkv_dtype dtype, const float *src, uint16_t *dst) {
    cudaStream_t stream = st_of(m)->stream;
    // Grid: 1-D grid-stride over n elements.
    if (dtype == PKV_DTYPE_F16)
        to_half_kernel<__half><<<grid_for(n), THREADS, 0, stream>>>(n, src, (__half *)dst);
    else
        to_half_kernel<__nv_bfloat16><<<grid_for(n), THREADS, 0, stream>>>(n, src, (__nv_bfloat16 *)dst);
    return launched();
}

// Widen n 16-bit values of dtype back to fp32.
static pkv_status widen_n(pkv_model *m, size_t n, pkv_dtype dtype, const uint16_t *src, float *dst) {
    cudaStream_t stream = st_of(m)->stream;
    // Grid: 1-D grid-stride over n elements.
    if (dtype == PKV_DTYPE_F16)
        from_half_kernel<__half><<<grid_for(n), THREADS, 0, stream>>>(n, (const __half *)src, dst);
    else
        from_half_kernel<__nv_bfloat16><<<grid_for(n), THREADS, 0, stream>>>(
            n, (const __nv_bfloat16 *)src, dst);
    return launched();
}

// Write the new tokens' K/V into their rows of one layer.
template <typename T>
static pkv_status contig_write(pkv_model *m, const pkvi_call *call, const pkvi_kv_target *kv,
                               const void *k, const void *v, void *kc, void *vc) {
    const pkv_model_config *c = &m->cfg;
    pkvi_scratch *s = &m->s;
    const uint32_t hd = c->head_dim, kvh = c->num_kv_heads;
    // Grid: (token, kv head), threads over head_dim.
    contig_write_kernel<T><<<dim3(call->num_tokens, kvh), 128, 0, st_of(m)->stream>>>(
        kvh, hd, kv->c_head_stride, kv->c_token_stride, s->tseq, s->pos, s->row_off, (const T *)k,
        (const T *)v, (T *)kc, (T *)vc);
    return launched();
}

// One layer's attention in the store's dtype; q/k/v/att are fp32 or 16-bit scratch.
static pkv_status attend(pkv_model *m, uint32_t layer, const pkvi_call *call,
                         const pkvi_kv_target *kv, const void *q, const void *k, const void *v,
                         void *att) {
    const pkv_model_config *c = &m->cfg;
    pkvi_scratch *s = &m->s;
    cudaStream_t stream = st_of(m)->stream;
    const size_t es = pkv_dtype_size(kv->dtype);
    pkv_attn_shape sh;
    sh.num_heads = c->num_heads;
    sh.num_kv_heads = c->num_kv_heads;
    sh.head_dim = c->head_dim;
    sh.dtype = kv->dtype;
    sh.scale = 1.0f / sqrtf((float)c->head_dim);
    sh.num_threads = 0;
    if (kv->kind == PKVI_KV_PAGED) {
        char *kc = (char *)kv->base + kv->layer_stride * layer * es;
        char *vc = kc + kv->kv_stride * es;
        pkv_status st = pkv_attn_cache_write_cuda(&sh, call->num_tokens, k, v, s->slots, kc, vc,
                                                  kv->block_stride, kv->head_stride,
                                                  kv->token_stride, kv->block_size,
                                                  kv->num_blocks, stream);
        if (st != PKV_OK) return st;
        pkv_attn_paged_kv pk = {kc, vc, kv->block_stride, kv->head_stride, kv->token_stride,
                                kv->block_size, kv->num_blocks, s->table, kv->max_blocks,
                                s->lens};
        if (call->all_single) {
            pkv_attn_cuda_opts o = split_opts(st_of(m), &sh, call->num_seqs, kv->max_len);
            return pkv_attn_decode_paged_cuda_ex(&sh, call->num_seqs, q, &pk, att, &o, stream);
        }
        // The packed row count is the call's token count: no read-back, no sync.
        return pkv_attn_prefill_paged_cuda_ex(&sh, call->num_seqs, s->indptr, call->num_tokens, q,
                                              &pk, att, stream);
    }
    // The store's strides; sequence i's row at row_off[i].
    const uint64_t head_stride = kv->c_head_stride, layer_stride = kv->c_layer_stride;
    char *kc = (char *)kv->ck + layer_stride * layer * es;
    char *vc = (char *)kv->cv + layer_stride * layer * es;
    pkv_status st;
    if (kv->dtype == PKV_DTYPE_F32) st = contig_write<float>(m, call, kv, k, v, kc, vc);
    else if (kv->dtype == PKV_DTYPE_F16) st = contig_write<__half>(m, call, kv, k, v, kc, vc);
    else st = contig_write<__nv_bfloat16>(m, call, kv, k, v, kc, vc);
    if (st != PKV_OK) return st;
    pkv_attn_contig_kv ck = {kc, vc, 0, head_stride, kv->c_token_stride, kv->max_len, s->lens, s->row_off};
    if (call->all_single) {
        pkv_attn_cuda_opts o = split_opts(st_of(m), &sh, call->num_seqs, kv->max_len);
        return pkv_attn_decode_contig_cuda_ex(&sh, call->num_seqs, q, &ck, att, &o, stream);
    }
    // The packed row count is the call's token count: no read-back, no sync.
    return pkv_attn_prefill_contig_cuda_ex(&sh, call->num_seqs, s->indptr, call->num_tokens, q,
                                           &ck, att, stream);
}

// An fp8 tensor scale from one pass's n device values (the CPU model's rule):
// max|x| / the fp8 max, or 1 for an all-zero or non-finite input. Reads the
// maximum back: one synchronization, on the first pass of a layer only.
static pkv_status calibrate(pkv_model *m, const float *x, size_t n, pkv_dtype dt, float *scale) {
    cuda_state *cs = st_of(m);
    if (!cs->amax && cudaMalloc((void **)&cs->amax, sizeof *cs->amax) != cudaSuccess) {
        cudaGetLastError();
        return PKV_ERR_OUT_OF_MEMORY;
    }
    pkv_status st = check(cudaMemsetAsync(cs->amax, 0, sizeof *cs->amax, cs->stream));
    if (st != PKV_OK) return st;
    // Grid: 1-D grid-stride over n values, one atomic per block.
    amax_kernel<<<grid_for(n), THREADS, 0, cs->stream>>>(n, x, cs->amax);
    st = launched();
    unsigned bits = 0;
    if (st == PKV_OK)
        st = check(cudaMemcpyAsync(&bits, cs->amax, sizeof bits, cudaMemcpyDeviceToHost,
                                   cs->stream));
    if (st == PKV_OK) st = check(cudaStreamSynchronize(cs->stream));
    if (st != PKV_OK) return st;
    float amax;
    memcpy(&amax, &bits, sizeof amax);
    const float fmax = dt == PKV_DTYPE_FP8_E4M3 ? 448.0f : 57344.0f;
    *scale = amax > 0.0f && isfinite(amax) ? amax / fmax : 1.0f;
    return PKV_OK;
}

// 8-bit store, paged or contiguous, as the CPU model's: q, k, v and the output
// stay fp32, the cache write quantizes (a contiguous store as a paged cache of
// one-token blocks: pkvi_kv_target) and the decode kernel dequantizes on the fly.
static pkv_status attend_quant_contig(pkv_model *m, uint32_t layer, const pkvi_call *call,
                                      const pkvi_kv_target *kv, const pkv_attn_shape *sh,
                                      const pkv_attn_kv_quant *qz) {
    pkvi_scratch *s = &m->s;
    cudaStream_t stream = st_of(m)->stream;
    char *kc = (char *)kv->ck + kv->c_layer_stride * layer; // 1-byte elements
    char *vc = (char *)kv->cv + kv->c_layer_stride * layer;
    pkv_status st = pkv_attn_cache_write_quant_cuda(sh, qz, call->num_tokens, s->k, s->v, s->slots,
                                                    kc, vc, kv->c_token_stride, kv->c_head_stride,
                                                    kv->c_token_stride, 1, kv->num_blocks, stream);
    if (st != PKV_OK) return st;
    pkv_attn_contig_kv ck = {kc, vc, 0, kv->c_head_stride, kv->c_token_stride, kv->max_len,
                             s->lens, s->row_off};
    if (call->all_single) {
        pkv_attn_cuda_opts o = split_opts(st_of(m), sh, call->num_seqs, kv->max_len);
        return pkv_attn_decode_contig_quant_cuda_ex(sh, qz, call->num_seqs, s->q, &ck, s->att, &o,
                                                    stream);
    }
    // The packed row count is the call's token count: no read-back, no sync.
    return pkv_attn_prefill_contig_quant_cuda_ex(sh, qz, call->num_seqs, s->indptr,
                                                 call->num_tokens, s->q, &ck, s->att, stream);
}

static pkv_status attend_quant(pkv_model *m, uint32_t layer, const pkvi_call *call,
                               const pkvi_kv_target *kv) {
    const pkv_model_config *c = &m->cfg;
    pkvi_scratch *s = &m->s;
    cudaStream_t stream = st_of(m)->stream;
    pkv_attn_shape sh = {c->num_heads, c->num_kv_heads, c->head_dim, PKV_DTYPE_F32,
                         1.0f / sqrtf((float)c->head_dim), 0};
    pkv_attn_kv_quant qz = kv->quant;
    if (kv->dtype != PKV_DTYPE_INT8) {
        float *sc = m->kv_scales + 2 * (size_t)layer;
        const size_t n = (size_t)call->num_tokens * m->kv_dim;
        pkv_status st = PKV_OK;
        if (sc[0] == 0.0f) st = calibrate(m, s->k, n, kv->dtype, &sc[0]);
        if (st == PKV_OK && sc[1] == 0.0f) st = calibrate(m, s->v, n, kv->dtype, &sc[1]);
        if (st != PKV_OK) return st;
        qz.k_scale = sc[0];
        qz.v_scale = sc[1];
    }
    if (kv->kind == PKVI_KV_CONTIG) return attend_quant_contig(m, layer, call, kv, &sh, &qz);
    char *kc = (char *)kv->base + kv->layer_stride * layer; // 1-byte elements
    char *vc = kc + kv->kv_stride;
    pkv_status st = pkv_attn_cache_write_quant_cuda(&sh, &qz, call->num_tokens, s->k, s->v,
                                                    s->slots, kc, vc, kv->block_stride,
                                                    kv->head_stride, kv->token_stride,
                                                    kv->block_size, kv->num_blocks, stream);
    if (st != PKV_OK) return st;
    pkv_attn_paged_kv pk = {kc, vc, kv->block_stride, kv->head_stride, kv->token_stride,
                            kv->block_size, kv->num_blocks, s->table, kv->max_blocks, s->lens};
    if (call->all_single) {
        pkv_attn_cuda_opts o = split_opts(st_of(m), &sh, call->num_seqs, kv->max_len);
        return pkv_attn_decode_paged_quant_cuda_ex(&sh, &qz, call->num_seqs, s->q, &pk, s->att,
                                                   &o, stream);
    }
    return pkv_attn_prefill_paged_quant_cuda_ex(&sh, &qz, call->num_seqs, s->indptr,
                                                call->num_tokens, s->q, &pk, s->att, stream);
}

static pkv_status cuda_attention(pkv_model *m, uint32_t layer, const pkvi_call *call,
                                 const pkvi_kv_target *kv) {
    pkvi_scratch *s = &m->s;
    if (pkv_dtype_is_quantized(kv->dtype)) return attend_quant(m, layer, call, kv);
    if (kv->dtype == PKV_DTYPE_F32) return attend(m, layer, call, kv, s->q, s->k, s->v, s->att);
    const size_t T = call->num_tokens;
    pkv_status st = narrow_n(m, T * m->q_dim, kv->dtype, s->q, s->q16);
    if (st == PKV_OK) st = narrow_n(m, T * m->kv_dim, kv->dtype, s->k, s->k16);
    if (st == PKV_OK) st = narrow_n(m, T * m->kv_dim, kv->dtype, s->v, s->v16);
    if (st == PKV_OK) st = attend(m, layer, call, kv, s->q16, s->k16, s->v16, s->att16);
    if (st == PKV_OK) st = widen_n(m, T * m->q_dim, kv->dtype, s->att16, s->att);
    return st;
}

extern "C" const pkvi_ops pkvi_model_cuda_ops = {
    "cuda",        cuda_init,     cuda_fini, cuda_alloc, cuda_release, cuda_upload,
    cuda_download, cuda_copy,     cuda_sync, cuda_embed, cuda_norm,    cuda_linear,
    cuda_rope,     cuda_act,      cuda_gather_last, cuda_attention,
};

// SPDX-License-Identifier: MIT
// CUDA attention against the CPU implementation on the same inputs (suite cuda).
// Without a CUDA build the *_cuda entry points must report PKV_ERR_UNSUPPORTED;
// with one but without a device every test skips with a message.
// Tolerance, CUDA vs CPU: both accumulate in fp32 in different orders, and each
// is within 3e-5 + u|ref| of the exact result (tests/test_attention.c), so they
// may differ by twice that: 6e-5 + 2u|x| (u = 0, 2^-11, 2^-8 for fp32/fp16/bf16).
#include <criterion/criterion.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "pkv/attention.h"
#include "pkv_config.h"
#include "src/attention/half.h"

#if PKV_HAVE_CUDA
#include <cuda_runtime_api.h>
#endif

Test(attention_cuda, entry_points_exist_and_check_arguments) {
    pkv_attn_shape sh = {4, 3, 128, PKV_DTYPE_F16, 0.1f, 0}; // 3 does not divide 4
    int32_t lens[1] = {1};
    int32_t table[1] = {0};
    char dummy[16] = {0};
    pkv_attn_paged_kv kv = {dummy, dummy, 8, 8, 8, 16, 1, table, 1, lens};
    pkv_status st = pkv_attn_decode_paged_cuda(&sh, 1, dummy, &kv, dummy, NULL);
#if PKV_HAVE_CUDA
    cr_assert_eq(st, PKV_ERR_INVALID_ARG, "heads that do not divide: %s", pkv_status_str(st));
    sh.num_kv_heads = 4;
    sh.head_dim = 96;
    st = pkv_attn_decode_paged_cuda(&sh, 1, dummy, &kv, dummy, NULL);
    cr_assert_eq(st, PKV_ERR_UNSUPPORTED, "head_dim 96 on CUDA: %s", pkv_status_str(st));
    sh.head_dim = 128;
    kv.block_size = 24; // not a power of two
    st = pkv_attn_decode_paged_cuda(&sh, 1, dummy, &kv, dummy, NULL);
    cr_assert_eq(st, PKV_ERR_UNSUPPORTED, "block size 24 on CUDA: %s", pkv_status_str(st));
    kv.block_size = 16;
    st = pkv_attn_decode_paged_cuda(&sh, 1, NULL, &kv, dummy, NULL);
    cr_assert_eq(st, PKV_ERR_INVALID_ARG, "NULL q: %s", pkv_status_str(st));
#else
    cr_assert_eq(st, PKV_ERR_UNSUPPORTED, "a build without CUDA must say so: %s",
                 pkv_status_str(st));
    cr_assert_eq(pkv_attn_cache_write_cuda(&sh, 0, NULL, NULL, NULL, NULL, NULL, 0, 0, 0, 1, 1,
                                           NULL),
                 PKV_ERR_UNSUPPORTED);
    cr_assert_eq(pkv_attn_copy_blocks_cuda(PKV_DTYPE_F16, NULL, 1, 0, 0, 0, 1, NULL, 0, NULL),
                 PKV_ERR_UNSUPPORTED);
    cr_assert_eq(pkv_attn_prefill_paged_cuda_ex(&sh, 1, lens, 1, dummy, &kv, dummy, NULL),
                 PKV_ERR_UNSUPPORTED);
#endif
}

#if PKV_HAVE_CUDA

static uint64_t rng_state = 0x1234567887654321ull;

static uint64_t rng_next(void) { // splitmix64
    uint64_t z = (rng_state += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

static double rng_unit(void) {
    return (double)(rng_next() >> 11) / (double)(1ull << 53) * 2.0 - 1.0;
}

static void store(pkv_dtype dt, void *base, size_t i, double x) {
    if (dt == PKV_DTYPE_F32) {
        ((float *)base)[i] = (float)x;
    } else if (dt == PKV_DTYPE_F16) {
        ((uint16_t *)base)[i] = pkvi_f32_to_f16((float)x);
    } else {
        ((uint16_t *)base)[i] = pkvi_f32_to_bf16((float)x);
    }
}

static double load(pkv_dtype dt, const void *base, size_t i) {
    if (dt == PKV_DTYPE_F32) {
        return ((const float *)base)[i];
    }
    if (dt == PKV_DTYPE_F16) {
        return pkvi_f16_to_f32(((const uint16_t *)base)[i]);
    }
    return pkvi_bf16_to_f32(((const uint16_t *)base)[i]);
}

static void need_device(void) {
    int n = 0;
    cudaError_t e = cudaGetDeviceCount(&n);
    if (e != cudaSuccess || n == 0) {
        cr_skip_test("no CUDA device: %s", e != cudaSuccess ? cudaGetErrorString(e) : "0 devices");
    }
}

static void *dev_copy(const void *host, size_t bytes) {
    void *d = NULL;
    cr_assert_eq(cudaMalloc(&d, bytes ? bytes : 1), cudaSuccess);
    if (bytes) {
        cr_assert_eq(cudaMemcpy(d, host, bytes, cudaMemcpyHostToDevice), cudaSuccess);
    }
    return d;
}

static void compare(pkv_dtype dt, const void *cpu, const void *gpu, size_t n, const char *what) {
    double u = dt == PKV_DTYPE_F32 ? 0.0 : dt == PKV_DTYPE_F16 ? ldexp(1.0, -11) : ldexp(1.0, -8);
    for (size_t i = 0; i < n; i++) {
        double a = load(dt, cpu, i);
        double b = load(dt, gpu, i);
        cr_assert(fabs(a - b) <= 6e-5 + 2 * u * fabs(a), "%s: element %zu: cpu %.8g cuda %.8g",
                  what, i, a, b);
    }
}

// One paged decode case on both: shuffled tables, NaN in unused slots.
static void run_case(pkv_dtype dt, uint32_t heads, uint32_t kvh, uint32_t dim, uint32_t bs,
                     uint32_t nseq, const int32_t *lens, uint32_t splits, int prefill) {
    const size_t es = pkv_dtype_size(dt);
    uint32_t max_blocks = 1;
    uint32_t total = 0;
    for (uint32_t s = 0; s < nseq; s++) {
        uint32_t nb = ((uint32_t)lens[s] + bs - 1) / bs;
        max_blocks = nb > max_blocks ? nb : max_blocks;
        total += nb;
    }
    uint32_t nblk = total + 2;
    int32_t *perm = calloc(nblk, sizeof(int32_t));
    for (uint32_t i = 0; i < nblk; i++) {
        perm[i] = (int32_t)i;
    }
    for (uint32_t i = nblk; i > 1; i--) {
        uint32_t j = (uint32_t)(rng_next() % i);
        int32_t t = perm[i - 1];
        perm[i - 1] = perm[j];
        perm[j] = t;
    }
    int32_t *table = calloc((size_t)nseq * max_blocks, sizeof(int32_t));
    uint32_t next = 0;
    for (uint32_t s = 0; s < nseq; s++) {
        for (uint32_t b = 0; b < max_blocks; b++) {
            table[s * max_blocks + b] =
                b < ((uint32_t)lens[s] + bs - 1) / bs ? perm[next++] : (int32_t)0x7fffffff;
        }
    }
    size_t bstride = (size_t)kvh * bs * dim;
    size_t cn = (size_t)nblk * bstride;
    void *kc = calloc(cn, es);
    void *vc = calloc(cn, es);
    for (size_t i = 0; i < cn; i++) {
        store(dt, kc, i, NAN);
        store(dt, vc, i, NAN);
    }
    for (uint32_t s = 0; s < nseq; s++) {
        for (uint32_t t = 0; t < (uint32_t)lens[s]; t++) {
            for (uint32_t h = 0; h < kvh; h++) {
                size_t base = (size_t)table[s * max_blocks + t / bs] * bstride +
                              (size_t)h * bs * dim + (size_t)(t % bs) * dim;
                for (uint32_t d = 0; d < dim; d++) {
                    store(dt, kc, base + d, rng_unit());
                    store(dt, vc, base + d, rng_unit());
                }
            }
        }
    }
    // Prefill: the last min(len, 7) tokens of each sequence are the prompt.
    int32_t *indptr = calloc(nseq + 1, sizeof(int32_t));
    for (uint32_t s = 0; s < nseq; s++) {
        indptr[s + 1] = indptr[s] + (prefill ? (lens[s] < 7 ? lens[s] : 7) : 1);
    }
    uint32_t rows = (uint32_t)indptr[nseq];
    size_t qn = (size_t)rows * heads * dim;
    void *q = calloc(qn, es);
    for (size_t i = 0; i < qn; i++) {
        store(dt, q, i, rng_unit());
    }
    pkv_attn_shape sh = {heads, kvh, dim, dt, (float)(1.0 / sqrt(dim)), 0};
    pkv_attn_paged_kv kv = {kc, vc, bstride, (uint64_t)bs * dim, dim, bs, nblk, table,
                            max_blocks, lens};
    void *cpu = calloc(qn, es);
    void *gpu = calloc(qn, es);
    pkv_status st = prefill ? pkv_attn_prefill_paged_cpu(&sh, nseq, indptr, q, &kv, cpu)
                            : pkv_attn_decode_paged_cpu(&sh, nseq, q, &kv, cpu);
    cr_assert_eq(st, PKV_OK);
    pkv_attn_paged_kv dkv = kv;
    dkv.k_cache = dev_copy(kc, cn * es);
    dkv.v_cache = dev_copy(vc, cn * es);
    dkv.block_tables = dev_copy(table, (size_t)nseq * max_blocks * sizeof(int32_t));
    dkv.seq_lens = dev_copy(lens, nseq * sizeof(int32_t));
    void *dq = dev_copy(q, qn * es);
    void *dout = dev_copy(NULL, qn * es);
    void *dind = dev_copy(indptr, (nseq + 1) * sizeof(int32_t));
    void *ws = NULL;
    pkv_attn_cuda_opts opts = {NULL, 0, splits, 0, 0};
    if (splits != 1) {
        size_t bytes = 0;
        cr_assert_eq(pkv_attn_cuda_workspace_bytes(&sh, nseq, splits ? splits : 64, &bytes),
                     PKV_OK);
        ws = dev_copy(NULL, bytes);
        opts.workspace = ws;
        opts.workspace_bytes = bytes;
    }
    st = prefill ? pkv_attn_prefill_paged_cuda(&sh, nseq, dind, dq, &dkv, dout, NULL)
                 : pkv_attn_decode_paged_cuda_ex(&sh, nseq, dq, &dkv, dout, &opts, NULL);
    cr_assert_eq(st, PKV_OK, "cuda: %s", pkv_status_str(st));
    cr_assert_eq(cudaDeviceSynchronize(), cudaSuccess);
    cr_assert_eq(cudaMemcpy(gpu, dout, qn * es, cudaMemcpyDeviceToHost), cudaSuccess);
    char what[128];
    snprintf(what, sizeof what, "%s %s heads %u/%u dim %u block %u splits %u",
             prefill ? "prefill" : "decode", pkv_dtype_name(dt), heads, kvh, dim, bs, splits);
    compare(dt, cpu, gpu, qn, what);
    if (prefill) {
        // The _ex call takes the row count from the host: same bytes, no read-back.
        void *again = calloc(qn, es);
        cr_assert_eq(cudaMemset(dout, 0, qn * es), cudaSuccess);
        cr_assert_eq(pkv_attn_prefill_paged_cuda_ex(&sh, nseq, dind, rows, dq, &dkv, dout, NULL),
                     PKV_OK);
        cr_assert_eq(cudaMemcpy(again, dout, qn * es, cudaMemcpyDeviceToHost), cudaSuccess);
        cr_assert_eq(memcmp(again, gpu, qn * es), 0, "%s: prefill_ex differs", what);
        free(again);
    }
    if (!prefill) {
        // The contiguous twin on the same data laid out [seq][kv_head][max_len][dim].
        uint32_t max_len = max_blocks * bs;
        size_t ccn = (size_t)nseq * kvh * max_len * dim;
        void *ck = calloc(ccn, es);
        void *cv = calloc(ccn, es);
        for (uint32_t s = 0; s < nseq; s++) {
            for (uint32_t h = 0; h < kvh; h++) {
                for (uint32_t t = 0; t < (uint32_t)lens[s]; t++) {
                    size_t src = (size_t)table[s * max_blocks + t / bs] * bstride +
                                 (size_t)h * bs * dim + (size_t)(t % bs) * dim;
                    size_t dst = (((size_t)s * kvh + h) * max_len + t) * dim;
                    memcpy((char *)ck + dst * es, (char *)kc + src * es, dim * es);
                    memcpy((char *)cv + dst * es, (char *)vc + src * es, dim * es);
                }
            }
        }
        pkv_attn_contig_kv ckv = {dev_copy(ck, ccn * es), dev_copy(cv, ccn * es),
                                  (uint64_t)kvh * max_len * dim, (uint64_t)max_len * dim, dim,
                                  max_len, dkv.seq_lens, NULL};
        cr_assert_eq(cudaMemset(dout, 0, qn * es), cudaSuccess);
        st = pkv_attn_decode_contig_cuda_ex(&sh, nseq, dq, &ckv, dout, &opts, NULL);
        cr_assert_eq(st, PKV_OK, "contig cuda: %s", pkv_status_str(st));
        cr_assert_eq(cudaMemcpy(gpu, dout, qn * es, cudaMemcpyDeviceToHost), cudaSuccess);
        compare(dt, cpu, gpu, qn, "contiguous");
        cudaFree((void *)ckv.k_cache);
        cudaFree((void *)ckv.v_cache);
        free(ck);
        free(cv);
    }
    cudaFree(ws);
    cudaFree(dind);
    cudaFree(dout);
    cudaFree(dq);
    cudaFree((void *)dkv.k_cache);
    cudaFree((void *)dkv.v_cache);
    cudaFree((void *)dkv.block_tables);
    cudaFree((void *)dkv.seq_lens);
    free(cpu);
    free(gpu);
    free(q);
    free(indptr);
    free(kc);
    free(vc);
    free(table);
    free(perm);
}

static const pkv_dtype dts[3] = {PKV_DTYPE_F32, PKV_DTYPE_F16, PKV_DTYPE_BF16};

Test(attention_cuda, decode_matches_cpu_all_dtypes_dims_blocks) {
    need_device();
    const uint32_t dims[3] = {64, 128, 256};
    const uint32_t bss[4] = {8, 16, 32, 256};
    for (int di = 0; di < 3; di++) {
        for (int i = 0; i < 3; i++) {
            for (int b = 0; b < 4; b++) {
                int32_t lens[5] = {1, (int32_t)bss[b] - 1, (int32_t)bss[b],
                                   (int32_t)bss[b] + 1, 1000};
                run_case(dts[di], 8, 2, dims[i], bss[b], 5, lens, 1, 0);
            }
        }
    }
}

Test(attention_cuda, split_k_and_head_groups_match_cpu) {
    need_device();
    int32_t lens[3] = {5000, 600, 1};
    for (int di = 0; di < 3; di++) {
        run_case(dts[di], 32, 8, 128, 16, 3, lens, 0, 0);  // heuristic
        run_case(dts[di], 32, 1, 128, 16, 3, lens, 7, 0);  // MQA, 4 head groups, 7 splits
        run_case(dts[di], 16, 16, 64, 32, 3, lens, 64, 0); // MHA, many splits
        run_case(dts[di], 4, 2, 256, 16, 3, lens, 0, 0);   // group of 2
        run_case(dts[di], 12, 2, 128, 8, 3, lens, 3, 0);   // group of 6 in an 8-wide block
    }
}

Test(attention_cuda, prefill_matches_cpu) {
    need_device();
    int32_t lens[4] = {40, 3, 17, 300};
    for (int di = 0; di < 3; di++) {
        run_case(dts[di], 8, 2, 128, 16, 4, lens, 1, 1);
        run_case(dts[di], 4, 4, 64, 8, 4, lens, 1, 1);
    }
}

Test(attention_cuda, cache_write_and_copy_blocks_match_cpu) {
    need_device();
    const pkv_dtype dt = PKV_DTYPE_BF16;
    const size_t es = 2;
    pkv_attn_shape sh = {8, 2, 128, dt, 0.1f, 0};
    const uint32_t bs = 16;
    const uint32_t nblk = 9;
    const uint64_t bstride = 2ull * bs * 128;
    size_t cn = nblk * bstride;
    int64_t slots[5] = {3, -1, 143, 16, 77};
    size_t tn = (size_t)5 * 2 * 128;
    uint16_t *k = calloc(tn, es);
    uint16_t *v = calloc(tn, es);
    for (size_t i = 0; i < tn; i++) {
        store(dt, k, i, rng_unit());
        store(dt, v, i, rng_unit());
    }
    void *cpu_k = calloc(cn, es);
    void *cpu_v = calloc(cn, es);
    cr_assert_eq(pkv_attn_cache_write_cpu(&sh, 5, k, v, slots, cpu_k, cpu_v, bstride, bs * 128,
                                          128, bs, nblk),
                 PKV_OK);
    void *dk = dev_copy(NULL, cn * es);
    void *dv = dev_copy(NULL, cn * es);
    cr_assert_eq(cudaMemset(dk, 0, cn * es), cudaSuccess);
    cr_assert_eq(cudaMemset(dv, 0, cn * es), cudaSuccess);
    void *dkin = dev_copy(k, tn * es);
    void *dvin = dev_copy(v, tn * es);
    void *dslots = dev_copy(slots, sizeof slots);
    cr_assert_eq(pkv_attn_cache_write_cuda(&sh, 5, dkin, dvin, dslots, dk, dv, bstride, bs * 128,
                                           128, bs, nblk, NULL),
                 PKV_OK);
    void *back = calloc(cn, es);
    cr_assert_eq(cudaMemcpy(back, dk, cn * es, cudaMemcpyDeviceToHost), cudaSuccess);
    cr_assert_eq(memcmp(back, cpu_k, cn * es), 0, "cache write K differs");
    cr_assert_eq(cudaMemcpy(back, dv, cn * es, cudaMemcpyDeviceToHost), cudaSuccess);
    cr_assert_eq(memcmp(back, cpu_v, cn * es), 0, "cache write V differs");
    // Block copy over 2 "layers" of the K array (each layer = 4 blocks + 1 spare).
    pkv_block_copy cp[2] = {{0, 3}, {2, 1}};
    cr_assert_eq(pkv_attn_copy_blocks_cpu(dt, cpu_k, 2, 4 * bstride, bstride, bstride - 5, 4, cp,
                                          2),
                 PKV_OK);
    void *dcp = dev_copy(cp, sizeof cp);
    cr_assert_eq(pkv_attn_copy_blocks_cuda(dt, dk, 2, 4 * bstride, bstride, bstride - 5, 4, dcp,
                                           2, NULL),
                 PKV_OK);
    cr_assert_eq(cudaMemcpy(back, dk, cn * es, cudaMemcpyDeviceToHost), cudaSuccess);
    cr_assert_eq(memcmp(back, cpu_k, cn * es), 0, "block copy differs");
    cudaFree(dk);
    cudaFree(dv);
    cudaFree(dkin);
    cudaFree(dvin);
    cudaFree(dslots);
    cudaFree(dcp);
    free(back);
    free(cpu_k);
    free(cpu_v);
    free(k);
    free(v);
}

// Device tables with a bad block id or length: the kernel must not read out of
// bounds; the rows of that sequence come back NaN, the others correct.
Test(attention_cuda, bad_device_tables_poison_only_their_sequence) {
    need_device();
    const uint32_t dim = 64;
    const uint32_t bs = 16;
    float *kc = calloc((size_t)2 * bs * dim, sizeof(float));
    for (size_t i = 0; i < (size_t)2 * bs * dim; i++) {
        kc[i] = (float)rng_unit();
    }
    int32_t table[2 * 2] = {0, 1, 1, 99}; // seq 1's second block is out of range
    int32_t lens[2] = {20, 20};
    pkv_attn_shape sh = {1, 1, dim, PKV_DTYPE_F32, 0.125f, 0};
    float q[2 * 64];
    for (int i = 0; i < 2 * 64; i++) {
        q[i] = (float)rng_unit();
    }
    pkv_attn_paged_kv kv = {kc, kc, (uint64_t)bs * dim, (uint64_t)bs * dim, dim, bs, 2, table, 2,
                            lens};
    float cpu[64];
    cr_assert_eq(pkv_attn_decode_paged_cpu(&sh, 1, q, &kv, cpu), PKV_OK);
    pkv_attn_paged_kv dkv = kv;
    dkv.k_cache = dkv.v_cache = dev_copy(kc, (size_t)2 * bs * dim * sizeof(float));
    dkv.block_tables = dev_copy(table, sizeof table);
    dkv.seq_lens = dev_copy(lens, sizeof lens);
    void *dq = dev_copy(q, sizeof q);
    void *dout = dev_copy(NULL, sizeof q);
    cr_assert_eq(pkv_attn_decode_paged_cuda(&sh, 2, dq, &dkv, dout, NULL), PKV_OK);
    float gpu[2 * 64];
    cr_assert_eq(cudaMemcpy(gpu, dout, sizeof gpu, cudaMemcpyDeviceToHost), cudaSuccess);
    compare(PKV_DTYPE_F32, cpu, gpu, 64, "the valid sequence");
    for (int d = 0; d < 64; d++) {
        cr_assert(isnan(gpu[64 + d]), "the sequence with a bad block id must come back NaN");
    }
    cudaFree((void *)dkv.k_cache);
    cudaFree((void *)dkv.block_tables);
    cudaFree((void *)dkv.seq_lens);
    cudaFree(dq);
    cudaFree(dout);
    free(kc);
}

// A CUDA error pending before the call (a failed cudaMalloc: someone else's) is
// still pending after a successful decode: the library clears only its own.
Test(attention_cuda, a_callers_pending_error_is_left_pending) {
    need_device();
    float kc[16 * 64];
    for (int i = 0; i < 16 * 64; i++) {
        kc[i] = (float)rng_unit();
    }
    int32_t table[1] = {0};
    int32_t lens[1] = {9};
    float q[64];
    for (int i = 0; i < 64; i++) {
        q[i] = (float)rng_unit();
    }
    pkv_attn_shape sh = {1, 1, 64, PKV_DTYPE_F32, 0.125f, 0};
    pkv_attn_paged_kv kv = {kc, kc, 16 * 64, 16 * 64, 64, 16, 1, table, 1, lens};
    float cpu[64];
    cr_assert_eq(pkv_attn_decode_paged_cpu(&sh, 1, q, &kv, cpu), PKV_OK);
    pkv_attn_paged_kv dkv = kv;
    dkv.k_cache = dkv.v_cache = dev_copy(kc, sizeof kc);
    dkv.block_tables = dev_copy(table, sizeof table);
    dkv.seq_lens = dev_copy(lens, sizeof lens);
    void *dq = dev_copy(q, sizeof q);
    void *dout = dev_copy(NULL, sizeof q);
    (void)cudaGetLastError();
    void *huge = NULL;
    cudaError_t pending = cudaMalloc(&huge, (size_t)1 << 62);
    cr_assert_neq(pending, cudaSuccess, "a 4 EiB allocation cannot succeed");
    cr_assert_eq(pkv_attn_decode_paged_cuda(&sh, 1, dq, &dkv, dout, NULL), PKV_OK);
    cr_assert_eq(cudaGetLastError(), pending, "the caller's error must still be pending");
    float gpu[64];
    cr_assert_eq(cudaMemcpy(gpu, dout, sizeof gpu, cudaMemcpyDeviceToHost), cudaSuccess);
    compare(PKV_DTYPE_F32, cpu, gpu, 64, "after a pending error");
    cudaFree((void *)dkv.k_cache);
    cudaFree((void *)dkv.block_tables);
    cudaFree((void *)dkv.seq_lens);
    cudaFree(dq);
    cudaFree(dout);
}

#else // !PKV_HAVE_CUDA

Test(attention_cuda, device_comparisons_need_a_cuda_build) {
    cr_skip_test("built without CUDA: CUDA-vs-CPU comparisons are not compiled");
}

#endif

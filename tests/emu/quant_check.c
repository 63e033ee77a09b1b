// SPDX-License-Identifier: MIT
// The CUDA 8-bit KV kernels (src/attention/attn_quant.cu) against the CPU calls on
// the same inputs: the quantizing cache write must produce the same bytes (data and
// int8 scales), decode and prefill the same outputs within fp32 rounding
// (|gpu - cpu| <= 2e-5 + 2e-5 |cpu|, plus the output dtype's half ulp), over int8 /
// e4m3 / e5m2, q in fp32 / fp16 / bf16, head_dim 64 / 128 / 256, GQA, shuffled block
// tables with NaN-poisoned unused blocks, HND and NHD, and a bad block id (NaN rows).
// Built twice: against the CPU emulator of the .cu files (suite emu, runs
// everywhere) and, in a CUDA build, against the real runtime (suite cuda, exit 77 =
// skipped without a device). Exit 0 pass, 1 mismatch or CUDA failure.
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cuda_runtime.h>

#include "pkv/attention.h"
#include "pkv/cache.h"
#include "check_util.h"
#include "src/attention/quant.h"

// One case: S sequences, write every token on both sides, compare the arenas,
// then decode (and prefill of the last `pre` tokens) on both sides.
static void run_case(pkv_dtype kvdt, pkv_dtype qdt, uint32_t H, uint32_t KVH, uint32_t D,
                     uint32_t B, int nhd, int bad_block) {
    cases++;
    const uint32_t S = 3;
    const int32_t lens[3] = {1, 37, 70};
    uint32_t maxb = (70 + B - 1) / B, nb = S * maxb + 2;
    pkv_cache_params p = pkv_cache_params_default();
    p.kv_heads = KVH;
    p.head_dim = D;
    p.block_size = B;
    p.dtype = kvdt;
    p.layout = nhd ? PKV_LAYOUT_NHD : PKV_LAYOUT_HND;
    // The geometry without a cache: a 1-block pool would do, but the strides only
    // depend on the params and the block count.
    uint64_t blk = pkv_cache_bytes_per_block(&p); // one layer: 2 halves
    uint64_t half = blk / 2;
    uint64_t scale_off = kvdt == PKV_DTYPE_INT8 ? ((uint64_t)KVH * B * D + 15) / 16 * 16 : 0;
    size_t arena = (size_t)(nb * blk);
    uint8_t *host = malloc(arena), *back = malloc(arena);
    int32_t *table = malloc((size_t)S * maxb * sizeof *table);
    uint32_t total = 0;
    for (uint32_t s = 0; s < S; s++) total += (uint32_t)lens[s];
    int64_t *slots = malloc(total * sizeof *slots);
    const size_t qes = pkv_dtype_size(qdt);
    void *k = malloc((size_t)total * KVH * D * qes), *v = malloc((size_t)total * KVH * D * qes);
    void *q = malloc((size_t)total * H * D * qes);
    void *o_cpu = malloc((size_t)total * H * D * qes), *o_gpu = malloc((size_t)total * H * D * qes);
    if (!host || !back || !table || !slots || !k || !v || !q || !o_cpu || !o_gpu) exit(1);
    memset(host, 0x7f, arena); // NaN fp8, huge int8 scales: padding must not be read
    for (uint32_t i = 0; i < S * maxb; i++) table[i] = (int32_t)((i * 7u + 3u) % nb);
    uint32_t t0 = 0;
    for (uint32_t s = 0; s < S; s++)
        for (uint32_t t = 0; t < (uint32_t)lens[s]; t++)
            slots[t0++] = (int64_t)table[s * maxb + t / B] * B + t % B;
    for (size_t i = 0; i < (size_t)total * KVH * D; i++) {
        float x = (float)unit() * ((i % D) % 29 == 5 ? 12.0f : 1.0f); // outlier channels
        store(qdt, k, i, x);
        store(qdt, v, i, (float)unit());
    }
    if (total > 5) store(qdt, k, 3 * D + 1, 0.0f); // a few special values
    for (size_t i = 0; i < (size_t)total * H * D; i++) store(qdt, q, i, (float)unit());
    pkv_attn_shape sh = {H, KVH, D, qdt, 1.0f / sqrtf((float)D), 1};
    pkv_attn_kv_quant qz = {kvdt, 12.0f / pkvi_quant_max(kvdt), 1.0f / pkvi_quant_max(kvdt),
                            scale_off, kvdt == PKV_DTYPE_INT8 ? B : 0,
                            kvdt == PKV_DTYPE_INT8 ? 1 : 0};
    const uint64_t bs = blk, hs = nhd ? D : (uint64_t)B * D, ts = nhd ? (uint64_t)KVH * D : D;
    // CPU side.
    pkv_status st = pkv_attn_cache_write_quant_cpu(&sh, &qz, total, k, v, slots, host,
                                                   host + half, bs, hs, ts, B, nb);
    CHECK(st == PKV_OK, "cpu write: %s", pkv_status_str(st));
    // Device side: same poisoned arena, same write.
    uint8_t *darena = NULL;
    CHECK(cudaMalloc((void **)&darena, arena) == cudaSuccess, "cudaMalloc");
    uint8_t *poison = malloc(arena);
    memset(poison, 0x7f, arena);
    CHECK(cudaMemcpy(darena, poison, arena, cudaMemcpyHostToDevice) == cudaSuccess, "upload");
    free(poison);
    void *dk = dev_copy(k, (size_t)total * KVH * D * qes), *dv = dev_copy(v, (size_t)total * KVH * D * qes);
    void *dq = dev_copy(q, (size_t)total * H * D * qes);
    int64_t *dslots = dev_copy(slots, total * sizeof *slots);
    CHECK(dk && dv && dq && dslots, "device buffers");
    st = pkv_attn_cache_write_quant_cuda(&sh, &qz, total, dk, dv, dslots, darena, darena + half,
                                         bs, hs, ts, B, nb, NULL);
    CHECK(st == PKV_OK, "cuda write: %s", pkv_status_str(st));
    CHECK(cudaMemcpy(back, darena, arena, cudaMemcpyDeviceToHost) == cudaSuccess, "download");
    size_t first = arena;
    for (size_t i = 0; i < arena; i++)
        if (back[i] != host[i]) {
            first = i;
            break;
        }
    CHECK(first == arena, "%s q=%s D=%u: cache bytes differ at %zu (gpu %#x cpu %#x)",
          pkv_dtype_name(kvdt), pkv_dtype_name(qdt), D, first, back[first], host[first]);
    // Decode: the last token of each sequence is the query; then prefill of all.
    int32_t lens_b[3] = {lens[0], lens[1], lens[2]};
    int32_t *dtable = dev_copy(table, (size_t)S * maxb * sizeof *table);
    int32_t *dlens = dev_copy(lens_b, sizeof lens_b);
    pkv_attn_paged_kv hkv = {host, host + half, bs, hs, ts, B, nb, table, maxb, lens_b};
    pkv_attn_paged_kv dkv = {darena, darena + half, bs, hs, ts, B, nb, dtable, maxb, dlens};
    void *dout = NULL;
    CHECK(cudaMalloc(&dout, (size_t)total * H * D * qes) == cudaSuccess, "cudaMalloc out");
    const double u = qdt == PKV_DTYPE_F32 ? 0 : qdt == PKV_DTYPE_F16 ? ldexp(1, -10) : ldexp(1, -7);
    for (int pre = 0; pre < 2; pre++) {
        uint32_t rows = pre ? total : S;
        int32_t indptr[4] = {0, lens[0], lens[0] + lens[1], (int32_t)total};
        int32_t *dind = dev_copy(indptr, sizeof indptr);
        st = pre ? pkv_attn_prefill_paged_quant_cpu(&sh, &qz, S, indptr, q, &hkv, o_cpu)
                 : pkv_attn_decode_paged_quant_cpu(&sh, &qz, S, q, &hkv, o_cpu);
        CHECK(st == PKV_OK, "cpu attend: %s", pkv_status_str(st));
        st = pre ? pkv_attn_prefill_paged_quant_cuda(&sh, &qz, S, dind, dq, &dkv, dout, NULL)
                 : pkv_attn_decode_paged_quant_cuda(&sh, &qz, S, dq, &dkv, dout, NULL);
        CHECK(st == PKV_OK, "cuda attend: %s", pkv_status_str(st));
        CHECK(cudaMemcpy(o_gpu, dout, (size_t)rows * H * D * qes, cudaMemcpyDeviceToHost) ==
                  cudaSuccess, "download out");
        for (size_t i = 0; i < (size_t)rows * H * D; i++) {
            double a = load(qdt, o_gpu, i), b = load(qdt, o_cpu, i);
            CHECK(fabs(a - b) <= 2e-5 + (2e-5 + u) * fabs(b), "%s q=%s D=%u H=%u/%u B=%u %s %s: "
                  "out[%zu] gpu %.9g cpu %.9g", pkv_dtype_name(kvdt), pkv_dtype_name(qdt), D, H,
                  KVH, B, nhd ? "NHD" : "HND", pre ? "prefill" : "decode", i, a, b);
        }
        cudaFree(dind);
    }
    if (bad_block) {
        // A block id past the cache in sequence 1's table: its rows are NaN, the
        // others unchanged.
        table[1 * maxb + 1] = (int32_t)nb + 5;
        CHECK(cudaMemcpy(dtable, table, (size_t)S * maxb * sizeof *table, cudaMemcpyHostToDevice) ==
                  cudaSuccess, "upload table");
        st = pkv_attn_decode_paged_quant_cuda(&sh, &qz, S, dq, &dkv, dout, NULL);
        CHECK(st == PKV_OK, "cuda decode (bad block): %s", pkv_status_str(st));
        CHECK(cudaMemcpy(o_gpu, dout, (size_t)S * H * D * qes, cudaMemcpyDeviceToHost) == cudaSuccess,
              "download");
        CHECK(isnan(load(qdt, o_gpu, (size_t)1 * H * D)), "bad block id must give NaN rows");
        CHECK(!isnan(load(qdt, o_gpu, 0)), "other sequences stay finite");
    }
    cudaFree(darena), cudaFree(dk), cudaFree(dv), cudaFree(dq), cudaFree(dslots);
    cudaFree(dtable), cudaFree(dlens), cudaFree(dout);
    free(host), free(back), free(table), free(slots), free(k), free(v), free(q), free(o_cpu),
        free(o_gpu);
}

int main(int argc, char **argv) {
    int quick = argc > 1 && strcmp(argv[1], "--quick") == 0;
    int n = 0;
    if (cudaGetDeviceCount(&n) != cudaSuccess || n == 0) {
        printf("quant-check: no CUDA device: skipped\n");
        return 77;
    }
    const pkv_dtype kv[3] = {PKV_DTYPE_INT8, PKV_DTYPE_FP8_E4M3, PKV_DTYPE_FP8_E5M2};
    const pkv_dtype qd[3] = {PKV_DTYPE_F32, PKV_DTYPE_F16, PKV_DTYPE_BF16};
    const uint32_t dims[3] = {64, 128, 256};
    for (int a = 0; a < 3; a++) {
        for (int b = 0; b < 3; b++) {
            for (int c = 0; c < (quick ? 1 : 3); c++) {
                run_case(kv[a], qd[b], 8, 2, dims[c], 16, 0, c == 0);
            }
        }
        run_case(kv[a], PKV_DTYPE_F16, 4, 4, 128, 8, 1, 0); // NHD, MHA, block 8
        run_case(kv[a], PKV_DTYPE_F32, 8, 1, 64, 32, 0, 1); // MQA, block 32
    }
    printf("quant-check: %u cases, %u failed: %s\n", cases, failures, failures ? "FAIL" : "PASS");
    return failures ? 1 : 0;
}

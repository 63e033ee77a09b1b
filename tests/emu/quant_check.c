// SPDX-License-Identifier: MIT
// The CUDA 8-bit KV kernels (src/attention/attn_quant.cu) against the CPU calls on
// the same inputs: the quantizing cache write must produce the same bytes (data and
// int8 scales), decode and prefill the same outputs within fp32 rounding
// (|gpu - cpu| <= 2e-5 + 2e-5 |cpu|, plus the output dtype's half ulp), over int8 /
// e4m3 / e5m2, q in fp32 / fp16 / bf16, head_dim 64 / 128 / 256, GQA, shuffled block
// tables with NaN-poisoned unused blocks, HND and NHD, and a bad block id (NaN rows);
// decode through the decode kernel's 8-bit fast path: GQA 1 / 4 / 8, split-K edges
// (contexts at and around the 256-token partitions, more partitions than a short
// sequence has), paged and contiguous (fixed rows and carved seq_offsets rows, built
// from the same bytes with their int8 scales beside each row), and the decoder's
// 8-bit contiguous store layout (run_store_case).
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

// |gpu - cpu| within fp32 rounding plus the output dtype's half ulp (u), for n values.
static int outputs_agree(pkv_dtype qdt, const void *gpu, const void *cpu, size_t n, double u,
                         const char *what) {
    for (size_t i = 0; i < n; i++) {
        double a = load(qdt, gpu, i), b = load(qdt, cpu, i);
        if (!(fabs(a - b) <= 2e-5 + (2e-5 + u) * fabs(b)) && !(isnan(a) && isnan(b))) {
            failures++;
            printf("FAIL %s: out[%zu] gpu %.9g cpu %.9g\n", what, i, a, b);
            return 0;
        }
    }
    return 1;
}

// The split-K workspace for `splits` partitions (0: the heuristic's at most 64).
static void *workspace(const pkv_attn_shape *sh, uint32_t S, uint32_t splits, size_t *bytes) {
    void *ws = NULL;
    if (pkv_attn_cuda_workspace_bytes(sh, S, splits ? splits : 64, bytes) != PKV_OK ||
        cudaMalloc(&ws, *bytes) != cudaSuccess)
        return NULL;
    return ws;
}

// The paged arena's sequences as a contiguous cache: row s holds [KVH][cap][D]
// bytes, then (int8) the fp32 scales [KVH][cap] at scale_offset; rows at a fixed
// stride or (carved) in reverse order at seq_offsets. *half: bytes of the K side
// (V follows).
static uint8_t *contig_from_paged(const uint8_t *arena, uint64_t kv_half, const int32_t *table,
                                  uint32_t maxb, const int32_t *lens, uint32_t S, uint32_t KVH,
                                  uint32_t D, uint32_t B, uint64_t hs, uint64_t ts,
                                  uint64_t scale_off, int int8, uint32_t cap, int carved,
                                  uint64_t *row_bytes, int64_t *offsets, uint64_t *half) {
    const uint64_t data = (uint64_t)KVH * cap * D;
    const uint64_t sc_off = (data + 15) / 16 * 16;
    *row_bytes = (sc_off + (int8 ? (uint64_t)KVH * cap * 4 : 0) + 15) / 16 * 16;
    *half = *row_bytes * S;
    uint8_t *c = malloc((size_t)(2 * *half));
    if (!c) exit(1);
    memset(c, 0x7f, (size_t)(2 * *half)); // unused slots: NaN fp8, huge int8 scales
    for (uint32_t s = 0; s < S; s++) {
        offsets[s] = (int64_t)((carved ? S - 1 - s : s) * *row_bytes);
        for (int side = 0; side < 2; side++) {
            uint8_t *row = c + side * *half + offsets[s];
            const uint8_t *src = arena + side * kv_half;
            for (uint32_t t = 0; t < (uint32_t)lens[s]; t++) {
                const uint64_t blk = (uint64_t)table[s * maxb + t / B], in = t % B;
                for (uint32_t h = 0; h < KVH; h++) {
                    memcpy(row + ((uint64_t)h * cap + t) * D,
                           src + blk * (2 * kv_half) + h * hs + in * ts, D);
                    if (int8)
                        memcpy(row + sc_off + ((uint64_t)h * cap + t) * 4,
                               src + blk * (2 * kv_half) + scale_off + (h * B + in) * 4, 4);
                }
            }
        }
    }
    return c;
}

// One case: S sequences of lens[], write every token on both sides, compare the
// arenas, then decode (and prefill of every token) on both sides; with splits != 1
// also split-K decode (splits partitions, 0 = the plan's) of the paged cache and
// of the same sequences as a contiguous cache (carved: rows at seq_offsets).
static void run_case_lens(pkv_dtype kvdt, pkv_dtype qdt, uint32_t H, uint32_t KVH, uint32_t D,
                          uint32_t B, int nhd, int bad_block, uint32_t S, const int32_t *lens,
                          uint32_t splits, int carved) {
    cases++;
    uint32_t longest = 1;
    for (uint32_t s = 0; s < S; s++) longest = (uint32_t)lens[s] > longest ? (uint32_t)lens[s] : longest;
    uint32_t maxb = (longest + B - 1) / B, nb = S * maxb + 2;
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
    int32_t *dtable = dev_copy(table, (size_t)S * maxb * sizeof *table);
    int32_t *dlens = dev_copy(lens, S * sizeof *lens);
    pkv_attn_paged_kv hkv = {host, host + half, bs, hs, ts, B, nb, table, maxb, lens};
    pkv_attn_paged_kv dkv = {darena, darena + half, bs, hs, ts, B, nb, dtable, maxb, dlens};
    void *dout = NULL;
    CHECK(cudaMalloc(&dout, (size_t)total * H * D * qes) == cudaSuccess, "cudaMalloc out");
    const double u = qdt == PKV_DTYPE_F32 ? 0 : qdt == PKV_DTYPE_F16 ? ldexp(1, -10) : ldexp(1, -7);
    int32_t *indptr = malloc((S + 1) * sizeof *indptr);
    if (!indptr) exit(1);
    indptr[0] = 0;
    for (uint32_t s = 0; s < S; s++) indptr[s + 1] = indptr[s] + lens[s];
    for (int pre = 0; pre < 2; pre++) {
        uint32_t rows = pre ? total : S;
        int32_t *dind = dev_copy(indptr, (S + 1) * sizeof *indptr);
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
    free(indptr);
    if (splits != 1) {
        char what[160];
        snprintf(what, sizeof what, "%s q=%s D=%u H=%u/%u B=%u splits %u %s", pkv_dtype_name(kvdt),
                 pkv_dtype_name(qdt), D, H, KVH, B, splits, carved ? "carved" : "fixed rows");
        size_t wsb = 0;
        void *ws = workspace(&sh, S, splits, &wsb);
        CHECK(ws != NULL, "workspace");
        pkv_attn_cuda_opts opts = {ws, wsb, splits, 0, 0};
        // Paged, split-K.
        st = pkv_attn_decode_paged_quant_cpu(&sh, &qz, S, q, &hkv, o_cpu);
        CHECK(st == PKV_OK, "cpu decode: %s", pkv_status_str(st));
        st = pkv_attn_decode_paged_quant_cuda_ex(&sh, &qz, S, dq, &dkv, dout, &opts, NULL);
        CHECK(st == PKV_OK, "cuda split decode: %s", pkv_status_str(st));
        CHECK(cudaMemcpy(o_gpu, dout, (size_t)S * H * D * qes, cudaMemcpyDeviceToHost) ==
                  cudaSuccess, "download out");
        if (!outputs_agree(qdt, o_gpu, o_cpu, (size_t)S * H * D, u, what)) return;
        // Contiguous, the same bytes, split-K.
        uint64_t row_bytes = 0, chalf = 0;
        int64_t *offs = malloc(S * sizeof *offs);
        if (!offs) exit(1);
        const uint32_t cap = longest + 3;
        uint8_t *hc = contig_from_paged(host, half, table, maxb, lens, S, KVH, D, B, hs, ts,
                                        scale_off, kvdt == PKV_DTYPE_INT8, cap, carved,
                                        &row_bytes, offs, &chalf);
        uint8_t *dc = dev_copy(hc, (size_t)(2 * chalf));
        int64_t *doffs = dev_copy(offs, S * sizeof *offs);
        CHECK(dc && doffs, "device contiguous cache");
        const uint64_t csc = ((uint64_t)KVH * cap * D + 15) / 16 * 16;
        pkv_attn_kv_quant cqz = qz;
        cqz.scale_offset = kvdt == PKV_DTYPE_INT8 ? csc : 0;
        cqz.scale_head_stride = kvdt == PKV_DTYPE_INT8 ? cap : 0;
        pkv_attn_contig_kv hck = {hc, hc + chalf, row_bytes, (uint64_t)cap * D, D, cap, lens,
                                  carved ? offs : NULL};
        pkv_attn_contig_kv dck = {dc, dc + chalf, row_bytes, (uint64_t)cap * D, D, cap, dlens,
                                  carved ? doffs : NULL};
        st = pkv_attn_decode_contig_quant_cpu(&sh, &cqz, S, q, &hck, o_cpu);
        CHECK(st == PKV_OK, "cpu contig decode: %s", pkv_status_str(st));
        st = pkv_attn_decode_contig_quant_cuda_ex(&sh, &cqz, S, dq, &dck, dout, &opts, NULL);
        CHECK(st == PKV_OK, "cuda contig decode: %s", pkv_status_str(st));
        CHECK(cudaMemcpy(o_gpu, dout, (size_t)S * H * D * qes, cudaMemcpyDeviceToHost) ==
                  cudaSuccess, "download out");
        if (!outputs_agree(qdt, o_gpu, o_cpu, (size_t)S * H * D, u, what)) return;
        cudaFree(dc), cudaFree(doffs), cudaFree(ws);
        free(hc), free(offs);
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

// The decoder's 8-bit contiguous store (src/runtime/model/contig_kv.c), as the CUDA
// model drives it: an arena of `A` token slots, int8 as token-major slots (the kv
// heads' rows, then their fp32 scales, padded to 16 bytes), fp8 head-major
// [KVH][A][D]; written by the quantizing write as one-token blocks (slot = the
// row's first slot + position), read by the contiguous decode (split-K plan) and
// prefill (the last `chunk` tokens of each row) at seq_offsets. Same bytes and
// outputs as the CPU calls.
static void run_store_case(pkv_dtype kvdt, pkv_dtype qdt, uint32_t H, uint32_t KVH, uint32_t D) {
    cases++;
    enum { S = 3 };
    const int32_t lens[S] = {1, 37, 70};
    const uint64_t first[S] = {150, 3, 60}; // rows out of order, gaps between them
    const uint32_t A = 230, chunk = 9;
    const int int8 = kvdt == PKV_DTYPE_INT8;
    const uint64_t slot = int8 ? ((uint64_t)KVH * (D + 4) + 15) / 16 * 16 : (uint64_t)KVH * D;
    const uint64_t ts = int8 ? slot : D, hs = int8 ? D : (uint64_t)A * D, half = slot * A;
    const pkv_attn_kv_quant qz = {kvdt, 3.0f / pkvi_quant_max(kvdt), 1.0f / pkvi_quant_max(kvdt),
                                  int8 ? (uint64_t)KVH * D : 0, int8 ? 1 : 0, int8 ? slot / 4 : 0};
    uint32_t total = 0, rows = 0;
    for (int s = 0; s < S; s++) total += (uint32_t)lens[s];
    int64_t slots[37 + 70 + 1], offs[S];
    int32_t indptr[S + 1] = {0};
    for (int s = 0, t0 = 0; s < S; s++) {
        for (int32_t t = 0; t < lens[s]; t++) slots[t0++] = (int64_t)(first[s] + (uint64_t)t);
        offs[s] = (int64_t)(first[s] * ts); // the row's first slot, in bytes
        const uint32_t n = (uint32_t)lens[s] < chunk ? (uint32_t)lens[s] : chunk;
        indptr[s + 1] = indptr[s] + (int32_t)n;
    }
    rows = (uint32_t)indptr[S];
    const size_t qes = pkv_dtype_size(qdt);
    void *k = malloc((size_t)total * KVH * D * qes), *v = malloc((size_t)total * KVH * D * qes);
    void *q = malloc((size_t)rows * H * D * qes);
    void *o_cpu = malloc((size_t)rows * H * D * qes), *o_gpu = malloc((size_t)rows * H * D * qes);
    uint8_t *host = malloc((size_t)(2 * half)), *back = malloc((size_t)(2 * half));
    if (!k || !v || !q || !o_cpu || !o_gpu || !host || !back) exit(1);
    for (size_t i = 0; i < (size_t)total * KVH * D; i++) {
        store(qdt, k, i, (float)unit() * ((i % D) % 23 == 4 ? 3.0f : 0.5f));
        store(qdt, v, i, (float)unit());
    }
    for (size_t i = 0; i < (size_t)rows * H * D; i++) store(qdt, q, i, (float)unit());
    memset(host, 0x7f, (size_t)(2 * half)); // unused slots and padding must not be read
    uint8_t *dstore = dev_copy(host, (size_t)(2 * half));
    void *dk = dev_copy(k, (size_t)total * KVH * D * qes), *dv = dev_copy(v, (size_t)total * KVH * D * qes);
    void *dq = dev_copy(q, (size_t)rows * H * D * qes);
    int64_t *dslots = dev_copy(slots, total * sizeof *slots), *doffs = dev_copy(offs, sizeof offs);
    int32_t *dlens = dev_copy(lens, sizeof lens), *dind = dev_copy(indptr, sizeof indptr);
    void *dout = NULL;
    CHECK(dstore && dk && dv && dq && dslots && doffs && dlens && dind &&
              cudaMalloc(&dout, (size_t)rows * H * D * qes) == cudaSuccess, "device buffers");
    pkv_attn_shape sh = {H, KVH, D, qdt, 1.0f / sqrtf((float)D), 1};
    pkv_status st = pkv_attn_cache_write_quant_cpu(&sh, &qz, total, k, v, slots, host, host + half,
                                                   ts, hs, ts, 1, A);
    CHECK(st == PKV_OK, "cpu store write: %s", pkv_status_str(st));
    st = pkv_attn_cache_write_quant_cuda(&sh, &qz, total, dk, dv, dslots, dstore, dstore + half,
                                         ts, hs, ts, 1, A, NULL);
    CHECK(st == PKV_OK, "cuda store write: %s", pkv_status_str(st));
    CHECK(cudaMemcpy(back, dstore, (size_t)(2 * half), cudaMemcpyDeviceToHost) == cudaSuccess,
          "download");
    CHECK(memcmp(back, host, (size_t)(2 * half)) == 0, "%s D=%u: store bytes differ",
          pkv_dtype_name(kvdt), D);
    char what[128];
    snprintf(what, sizeof what, "store %s q=%s D=%u H=%u/%u", pkv_dtype_name(kvdt),
             pkv_dtype_name(qdt), D, H, KVH);
    const double u = qdt == PKV_DTYPE_F32 ? 0 : qdt == PKV_DTYPE_F16 ? ldexp(1, -10) : ldexp(1, -7);
    pkv_attn_contig_kv hck = {host, host + half, 0, hs, ts, 80, lens, offs};
    pkv_attn_contig_kv dck = {dstore, dstore + half, 0, hs, ts, 80, dlens, doffs};
    st = pkv_attn_prefill_contig_quant_cpu(&sh, &qz, S, indptr, q, &hck, o_cpu);
    CHECK(st == PKV_OK, "cpu store prefill: %s", pkv_status_str(st));
    st = pkv_attn_prefill_contig_quant_cuda_ex(&sh, &qz, S, dind, rows, dq, &dck, dout, NULL);
    CHECK(st == PKV_OK, "cuda store prefill: %s", pkv_status_str(st));
    CHECK(cudaMemcpy(o_gpu, dout, (size_t)rows * H * D * qes, cudaMemcpyDeviceToHost) == cudaSuccess,
          "download out");
    if (!outputs_agree(qdt, o_gpu, o_cpu, (size_t)rows * H * D, u, what)) return;
    size_t wsb = 0;
    void *ws = workspace(&sh, S, 0, &wsb);
    CHECK(ws != NULL, "workspace");
    pkv_attn_cuda_opts opts = {ws, wsb, 0, 0, 0};
    st = pkv_attn_decode_contig_quant_cpu(&sh, &qz, S, q, &hck, o_cpu);
    CHECK(st == PKV_OK, "cpu store decode: %s", pkv_status_str(st));
    st = pkv_attn_decode_contig_quant_cuda_ex(&sh, &qz, S, dq, &dck, dout, &opts, NULL);
    CHECK(st == PKV_OK, "cuda store decode: %s", pkv_status_str(st));
    CHECK(cudaMemcpy(o_gpu, dout, (size_t)S * H * D * qes, cudaMemcpyDeviceToHost) == cudaSuccess,
          "download out");
    if (!outputs_agree(qdt, o_gpu, o_cpu, (size_t)S * H * D, u, what)) return;
    cudaFree(dstore), cudaFree(dk), cudaFree(dv), cudaFree(dq), cudaFree(dslots), cudaFree(doffs);
    cudaFree(dlens), cudaFree(dind), cudaFree(dout), cudaFree(ws);
    free(k), free(v), free(q), free(o_cpu), free(o_gpu), free(host), free(back);
}

static void run_case(pkv_dtype kvdt, pkv_dtype qdt, uint32_t H, uint32_t KVH, uint32_t D,
                     uint32_t B, int nhd, int bad_block) {
    static const int32_t lens[3] = {1, 37, 70};
    run_case_lens(kvdt, qdt, H, KVH, D, B, nhd, bad_block, 3, lens, 1, 0);
}

int main(int argc, char **argv) {
    // --quick: one head dim per format; --sanitizer (sanitizer builds, tens of times
    // slower): also one query dtype and one GQA split-K case of up to 257 tokens, so
    // every path (both scale kinds, NHD, MQA, split-K, contiguous rows) still runs once.
    const char *opt = argc > 1 ? argv[1] : "";
    if (strcmp(opt, "--help") == 0 || strcmp(opt, "-h") == 0) {
        printf("usage: quant-check [--quick | --sanitizer]\n"
               "The 8-bit KV kernels (cache write, decode, prefill) against the CPU calls.\n"
               "exit: 0 pass, 1 mismatch or CUDA failure, 2 bad usage, 77 no CUDA device\n");
        return 0;
    }
    if (argc > 2 || (argc == 2 && strcmp(opt, "--quick") != 0 && strcmp(opt, "--sanitizer") != 0)) {
        fprintf(stderr, "quant-check: unknown argument '%s' (see --help)\n", argc > 2 ? argv[2] : opt);
        return 2;
    }
    int sanitizer = strcmp(opt, "--sanitizer") == 0;
    int quick = sanitizer || strcmp(opt, "--quick") == 0;
    int n = 0;
    if (cudaGetDeviceCount(&n) != cudaSuccess || n == 0) {
        printf("quant-check: no CUDA device: skipped\n");
        return 77;
    }
    const pkv_dtype kv[3] = {PKV_DTYPE_INT8, PKV_DTYPE_FP8_E4M3, PKV_DTYPE_FP8_E5M2};
    const pkv_dtype qd[3] = {PKV_DTYPE_F32, PKV_DTYPE_F16, PKV_DTYPE_BF16};
    const uint32_t dims[3] = {64, 128, 256};
    for (int a = 0; a < 3; a++) {
        for (int b = sanitizer ? 1 : 0; b < (sanitizer ? 2 : 3); b++) {
            for (int c = 0; c < (quick ? 1 : 3); c++) {
                run_case(kv[a], qd[b], 8, 2, dims[c], 16, 0, c == 0);
            }
        }
        run_case(kv[a], PKV_DTYPE_F16, 4, 4, 128, 8, 1, 0); // NHD, MHA, block 8
        // The decoder's 8-bit contiguous store: MHA and GQA 4.
        run_store_case(kv[a], qd[a], 4, 4, 64);
        if (!sanitizer) run_store_case(kv[a], PKV_DTYPE_F32, 8, 2, 128);
        run_case(kv[a], PKV_DTYPE_F32, 8, 1, 64, 32, 0, 1); // MQA, block 32
        // The fast path's plans: GQA 1 / 4 / 8 (2 kv heads), split-K at and around
        // the 256-token partitions (3 partitions of 256 over 600 tokens: sequence
        // 0 has 1, sequence 1 ends one short of the first boundary, 2 on it, 3 one
        // past), the wave-aware plan (0), paged and contiguous, fixed and carved.
        // --sanitizer: 2 partitions over at most 300 tokens. (The table maps logical
        // block i to (7i + 3) mod blocks: the block counts, 192 and 97, are prime to 7,
        // so no two logical blocks share one.)
        static const int32_t edge[5] = {1, 255, 256, 257, 600}, edge_small[5] = {1, 255, 256, 257, 300};
        static const uint32_t groups[3] = {1, 4, 8};
        for (int g = 0; g < 3; g++) {
            if (sanitizer && g != 1) continue;
            run_case_lens(kv[a], qd[(a + g) % 3], 2 * groups[g], 2, 128, 16, g == 1, 0, 5,
                          sanitizer ? edge_small : edge, sanitizer ? 2 : 3, g != 0);
        }
        if (!quick) {
            run_case_lens(kv[a], PKV_DTYPE_BF16, 8, 2, 256, 32, 0, 0, 5, edge, 0, 1);
            run_case_lens(kv[a], PKV_DTYPE_F16, 16, 2, 64, 8, 0, 0, 5, edge, 64, 0);
        }
    }
    printf("quant-check: %u cases, %u failed: %s\n", cases, failures, failures ? "FAIL" : "PASS");
    return failures ? 1 : 0;
}

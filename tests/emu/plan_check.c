// SPDX-License-Identifier: MIT
// The split-K plans the decode calls choose on the emulator are the ones an H200
// would run: the emulator answers cudaOccupancyMaxActiveBlocksPerMultiprocessor
// from each kernel's ptxas figures (tests/emu/kernel_resources.h) and reports 132
// SMs, and the plan fills whole waves of (SMs x resident blocks) from the occupancy
// of the kernel actually launched (attn_plan.c). The split count is read from the
// decode kernel's grid (z). Expected counts are worked out by hand in each case's
// comment from the plan's cost model, waves x (partition + 128), docs/KERNELS.md.
// Contexts are planned through opts.max_context with one-token sequences, so that
// 32k-token plans cost nothing to run. Every decode runs inside the emulator's
// capture check (include/pkv/attention.h: the decode calls are safe to capture in
// a CUDA graph). Exit 0 pass, 1 a plan or an output differs or a call breaks the capture.
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cuda_runtime.h>

#include "pkv/attention.h"
#include "src/attention/half.h"

static unsigned failures;

static void *dev_alloc(size_t n) {
    void *d = NULL;
    if (cudaMalloc(&d, n) != cudaSuccess) {
        fprintf(stderr, "plan_check: cudaMalloc(%zu) failed\n", n);
        exit(1);
    }
    return d;
}

// One decode of `seqs` one-token sequences planned for `max_context` tokens;
// checks the decode grid's partitions against `want` and every output against
// its kv head's only V row (softmax over one token).
static void check(const char *what, pkv_dtype dt, uint32_t heads, uint32_t kvh, uint32_t dim,
                  uint32_t seqs, uint32_t max_context, uint32_t want) {
    const uint32_t bs = 16;
    const uint32_t width = max_context / bs; // table width: the descriptor's bound
    const size_t es = pkv_dtype_size(dt);
    const size_t row = (size_t)kvh * bs * dim; // one block of one layer
    size_t cache_elems = row * seqs;
    size_t q_elems = (size_t)seqs * heads * dim;
    void *hk = calloc(cache_elems, es);
    void *hq = calloc(q_elems, es);
    void *hout = calloc(q_elems, es);
    int32_t *table = calloc((size_t)seqs * width, sizeof(int32_t));
    int32_t *lens = calloc(seqs, sizeof(int32_t));
    if (!hk || !hq || !hout || !table || !lens) {
        fprintf(stderr, "plan_check: host out of memory\n");
        exit(1);
    }
    // Sequence s owns block s; token 0 of kv head h holds the value s + h / 8.
    for (uint32_t s = 0; s < seqs; s++) {
        table[(size_t)s * width] = (int32_t)s;
        lens[s] = 1;
        for (uint32_t h = 0; h < kvh; h++) {
            for (uint32_t d = 0; d < dim; d++) {
                size_t i = s * row + (size_t)h * bs * dim + d;
                float x = (float)(s % 8) + (float)h / 8.0f;
                if (dt == PKV_DTYPE_F16) {
                    ((uint16_t *)hk)[i] = pkvi_f32_to_f16(x);
                } else if (dt == PKV_DTYPE_BF16) {
                    ((uint16_t *)hk)[i] = pkvi_f32_to_bf16(x);
                } else {
                    ((float *)hk)[i] = x;
                }
            }
        }
    }
    void *dk = dev_alloc(cache_elems * es);
    void *dq = dev_alloc(q_elems * es);
    void *dout = dev_alloc(q_elems * es);
    int32_t *dtable = dev_alloc((size_t)seqs * width * sizeof(int32_t));
    int32_t *dlens = dev_alloc(seqs * sizeof(int32_t));
    cudaMemcpy(dk, hk, cache_elems * es, cudaMemcpyHostToDevice);
    cudaMemcpy(dq, hq, q_elems * es, cudaMemcpyHostToDevice);
    cudaMemcpy(dtable, table, (size_t)seqs * width * sizeof(int32_t), cudaMemcpyHostToDevice);
    cudaMemcpy(dlens, lens, seqs * sizeof(int32_t), cudaMemcpyHostToDevice);
    pkv_attn_shape sh = {heads, kvh, dim, dt, 1.0f, 1};
    size_t ws_bytes = 0;
    pkv_attn_cuda_workspace_bytes(&sh, seqs, 64, &ws_bytes);
    pkv_attn_cuda_opts opts = {dev_alloc(ws_bytes), ws_bytes, 0, 0, max_context};
    pkv_attn_paged_kv kv = {dk, dk, row, (uint64_t)bs * dim, dim, bs, seqs, dtable, width,
                            dlens};
    uint64_t before = pkvemu_launch_count();
    // Documented as safe to capture in a CUDA graph: no allocation, copy or sync.
    pkvemu_capture_begin("pkv_attn_decode_paged_cuda_ex");
    pkv_status st = pkv_attn_decode_paged_cuda_ex(&sh, seqs, dq, &kv, dout, &opts, NULL);
    pkvemu_capture_end();
    uint64_t launches = pkvemu_launch_count() - before;
    unsigned grid[3] = {0, 0, 0};
    pkvemu_launch_grid(launches == 2 ? 1 : 0, grid); // the decode, before a merge
    int ok = st == PKV_OK && (launches == 1 || launches == 2) && grid[2] == want &&
             (want > 1) == (launches == 2);
    // The prefill twin with the row count from the host is capture-safe too; one
    // prompt token per sequence gives the decode's outputs, bit for bit (one token:
    // weight 1, and the values s + h / 8 are exact in every dtype).
    int32_t *indptr = calloc(seqs + 1, sizeof(int32_t));
    for (uint32_t s = 0; indptr && s <= seqs; s++) {
        indptr[s] = (int32_t)s;
    }
    int32_t *dindptr = dev_alloc((seqs + 1) * sizeof(int32_t));
    void *dout2 = dev_alloc(q_elems * es);
    cudaMemcpy(dindptr, indptr, (seqs + 1) * sizeof(int32_t), cudaMemcpyHostToDevice);
    pkvemu_capture_begin("pkv_attn_prefill_paged_cuda_ex");
    pkv_status st2 = pkv_attn_prefill_paged_cuda_ex(&sh, seqs, dindptr, seqs, dq, &kv, dout2,
                                                    NULL);
    pkvemu_capture_end();
    void *hout2 = malloc(q_elems * es);
    cudaMemcpy(hout, dout, q_elems * es, cudaMemcpyDeviceToHost);
    cudaMemcpy(hout2, dout2, q_elems * es, cudaMemcpyDeviceToHost);
    ok = ok && indptr && hout2 && st2 == PKV_OK && memcmp(hout, hout2, q_elems * es) == 0;
    cudaFree(dindptr), cudaFree(dout2);
    free(indptr), free(hout2);
    size_t bad_at = q_elems;
    for (size_t i = 0; ok && i < q_elems; i++) {
        uint32_t s = (uint32_t)(i / ((size_t)heads * dim));
        uint32_t h = (uint32_t)(i / dim % heads) / (heads / kvh);
        float want_x = (float)(s % 8) + (float)h / 8.0f;
        float x = dt == PKV_DTYPE_F16    ? pkvi_f16_to_f32(((uint16_t *)hout)[i])
                  : dt == PKV_DTYPE_BF16 ? pkvi_bf16_to_f32(((uint16_t *)hout)[i])
                                         : ((float *)hout)[i];
        if (!(fabsf(x - want_x) <= 1e-2f)) {
            ok = 0;
            bad_at = i;
        }
    }
    printf("%-4s %s: %u splits (want %u), %llu launch(es)%s\n", ok ? "ok" : "FAIL", what,
           grid[2], want, (unsigned long long)launches,
           bad_at < q_elems ? ", wrong output" : "");
    failures += !ok;
    cudaFree(dk), cudaFree(dq), cudaFree(dout), cudaFree(dtable), cudaFree(dlens);
    cudaFree(opts.workspace);
    free(hk), free(hq), free(hout), free(table), free(lens);
}

int main(void) {
    // fp16 D=128 G=4 kernel: 183 registers -> 2 blocks/SM, waves of 264 blocks.
    // 8 seqs x 8 kv heads = 64 blocks: 4 splits = 256 blocks in one wave (5, the
    // one-wave target rounded up, gives 320 = 1.21 waves and costs a second wave).
    check("GQA 32/8 fp16 D128, batch 8, 32k", PKV_DTYPE_F16, 32, 8, 128, 8, 32768, 4);
    // 40 x 8 = 320 blocks = 1.21 waves unsplit (2 waves of 32k); 4 splits: 5 waves
    // of 8k (1280 blocks) cost 5 x 8320 against 2 x 32896.
    check("GQA 32/8 fp16 D128, batch 40, 32k", PKV_DTYPE_F16, 32, 8, 128, 40, 32768, 4);
    // G=8 kernel (252 registers -> 2 blocks/SM): the same waves as G=4.
    check("GQA 64/8 fp16 D128, batch 40, 32k", PKV_DTYPE_F16, 64, 8, 128, 40, 32768, 4);
    // 64 x 8 = 512 blocks = 1.94 waves: no split (2 partitions make 3.9 waves of 2k).
    check("GQA 32/8 fp16 D128, batch 64, 4k", PKV_DTYPE_F16, 32, 8, 128, 64, 4096, 1);
    // fp16 D=128 G=1 (MHA) kernel: 124 registers -> 4 blocks/SM, waves of 528:
    // 8 x 32 = 256 blocks, 2 splits = 512 in one wave. At 2 blocks/SM (the G=4
    // kernel's occupancy) the same batch would not split: the launched kernel's
    // occupancy decides.
    check("MHA 32/32 fp16 D128, batch 8, 32k", PKV_DTYPE_F16, 32, 32, 128, 8, 32768, 2);
    // fp32 D=128 G=1: 73 registers -> 6 blocks/SM, waves of 792: 3 splits = 768.
    check("MHA 32/32 fp32 D128, batch 8, 32k", PKV_DTYPE_F32, 32, 32, 128, 8, 32768, 3);
    // One sequence, 4k: 8 blocks; at most 4096 / 512 = 8 partitions.
    check("GQA 32/8 bf16 D128, batch 1, 4k", PKV_DTYPE_BF16, 32, 8, 128, 1, 4096, 8);
    // Short contexts are not split (fewer than 2 x 512 tokens).
    check("GQA 32/8 fp16 D64, batch 1, 992", PKV_DTYPE_F16, 32, 8, 64, 1, 992, 1);
    if (failures != 0) {
        printf("plan_check: %u plan(s) differ\n", failures);
        return 1;
    }
    printf("plan_check: every plan is the H200's\n");
    return 0;
}

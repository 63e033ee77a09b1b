// SPDX-License-Identifier: MIT
// The CUDA window / sink and MLA decode (src/attention/attn_window.cu) against the
// CPU calls on the same inputs (issue 23): sliding windows shorter and longer than
// the context and not multiples of the block, chunked windows with queries exactly
// at a chunk start, gpt-oss sinks of +-large values, GQA 1 / 4 / 8, head_dim 64 /
// 128 / 256, fp32 / fp16 / bf16, MLA 512 + 64 and small dims. Tables hold -1
// (PKV_BLOCK_NONE) before each window; every slot outside the window is NaN,
// so a read of one poisons the output. A bad block id inside a window must give
// NaN rows for its sequence only. |gpu - cpu| <= 2e-5 + (2e-5 + u) |cpu|, u the
// output dtype's ulp. Built against the CPU emulator (suite emu). Exit 0 pass,
// 1 mismatch or CUDA failure, 77 no device.
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cuda_runtime.h>

#include "pkv/attention.h"
#include "check_util.h"

// The first token a query at p sees (the test's own rule, by search).
static uint32_t first_seen(const pkv_attn_window *w, uint32_t p) {
    uint32_t t = 0;
    while (!(w->kind == PKV_ATTN_WINDOW_FULL ||
             (w->kind == PKV_ATTN_WINDOW_SLIDING && p - t < w->window) ||
             (w->kind == PKV_ATTN_WINDOW_CHUNKED && t / w->window == p / w->window))) {
        t++;
    }
    return t;
}

enum { S = 5 };
static const int32_t kLens[S] = {1, 33, 64, 97, 130}; // 32, 64, 96: chunk starts (p = len - 1)

// One paged case for either call. mla: latent + rope rows, one kv head, V = the
// row's first `latent` elements; else H / KVH heads of D. bad: a block id past the
// cache inside sequence 3's window.
static void run_case(pkv_dtype dt, uint32_t H, uint32_t KVH, uint32_t D, uint32_t B,
                     pkv_attn_window win, const float *sinks, int mla, uint32_t latent, int bad) {
    cases++;
    const uint32_t dk = D, dv = mla ? latent : D;
    const uint32_t kvh = mla ? 1 : KVH;
    uint32_t width = (130 + B - 1) / B, nb = S * width + 3;
    const uint64_t hs = mla ? 0 : (uint64_t)B * dk, ts = dk, bs = (uint64_t)kvh * B * dk;
    const size_t es = pkv_dtype_size(dt), elems = (size_t)nb * bs;
    void *k = malloc(elems * es), *v = malloc(elems * es);
    int32_t *table = malloc((size_t)S * width * sizeof *table);
    void *q = malloc((size_t)S * H * dk * es);
    void *o_cpu = malloc((size_t)S * H * dv * es), *o_gpu = malloc((size_t)S * H * dv * es);
    if (!k || !v || !table || !q || !o_cpu || !o_gpu) exit(1);
    for (size_t i = 0; i < elems; i++) {
        store(dt, k, i, NAN);
        store(dt, v, i, NAN);
    }
    uint32_t next = 0;
    for (uint32_t s = 0; s < S; s++) {
        const uint32_t first = first_seen(&win, (uint32_t)kLens[s] - 1);
        const uint32_t used = ((uint32_t)kLens[s] + B - 1) / B;
        for (uint32_t b = 0; b < width; b++) {
            // Scattered ids (a stride coprime with nb), -1 before the window.
            table[s * width + b] = b < first / B ? -1 : b < used ? (int32_t)((next++ * 7u + 2u) % nb) : -1;
        }
        for (uint32_t t = first; t < (uint32_t)kLens[s]; t++) {
            for (uint32_t h = 0; h < kvh; h++) {
                size_t at = (size_t)table[s * width + t / B] * bs + h * hs + (t % B) * ts;
                for (uint32_t d = 0; d < dk; d++) {
                    store(dt, k, at + d, (float)unit());
                    store(dt, v, at + d, (float)unit());
                }
            }
        }
    }
    for (size_t i = 0; i < (size_t)S * H * dk; i++) store(dt, q, i, (float)(2.0 * unit()));
    int32_t lens[S];
    memcpy(lens, kLens, sizeof lens);
    pkv_attn_paged_kv hkv = {k, mla ? NULL : v, bs, hs, ts, B, nb, table, width, lens};
    pkv_attn_shape sh = {H, KVH, D, dt, 1.0f / sqrtf((float)dk), 1};
    pkv_attn_mla_shape msh = {H, latent, D - latent, dt, 1.0f / sqrtf((float)dk), 1};
    win.sinks = sinks; // host sinks for the CPU call, device ones below
    pkv_status st = mla ? pkv_attn_decode_mla_paged_cpu(&msh, S, q, &hkv, o_cpu)
                        : pkv_attn_decode_paged_window_cpu(&sh, &win, S, q, &hkv, o_cpu);
    CHECK(st == PKV_OK, "cpu: %s", pkv_status_str(st));
    if (bad) {
        // Inside sequence 3's window (its last block): the CPU call refuses it,
        // the kernel must poison that sequence only.
        table[3 * width + (kLens[3] - 1) / B] = (int32_t)nb + 4;
    }
    void *dk_ = dev_copy(k, elems * es), *dv_ = dev_copy(v, elems * es), *dq = dev_copy(q, (size_t)S * H * dk * es);
    int32_t *dtable = dev_copy(table, (size_t)S * width * sizeof *table), *dlens = dev_copy(lens, sizeof lens);
    float *dsinks = sinks ? dev_copy(sinks, H * sizeof(float)) : NULL;
    void *dout = NULL;
    CHECK(dk_ && dv_ && dq && dtable && dlens && (!sinks || dsinks) &&
              cudaMalloc(&dout, (size_t)S * H * dv * es) == cudaSuccess, "device buffers");
    pkv_attn_paged_kv dkv = {dk_, mla ? NULL : dv_, bs, hs, ts, B, nb, dtable, width, dlens};
    pkv_attn_window dwin = win;
    dwin.sinks = dsinks;
    st = mla ? pkv_attn_decode_mla_paged_cuda(&msh, S, dq, &dkv, dout, NULL)
             : pkv_attn_decode_paged_window_cuda(&sh, &dwin, S, dq, &dkv, dout, NULL);
    CHECK(st == PKV_OK, "cuda: %s", pkv_status_str(st));
    CHECK(cudaMemcpy(o_gpu, dout, (size_t)S * H * dv * es, cudaMemcpyDeviceToHost) == cudaSuccess,
          "download");
    const double u = dt == PKV_DTYPE_F32 ? 0 : dt == PKV_DTYPE_F16 ? ldexp(1, -10) : ldexp(1, -7);
    for (uint32_t s = 0; s < S; s++) {
        for (size_t i = (size_t)s * H * dv; i < (size_t)(s + 1) * H * dv; i++) {
            double a = load(dt, o_gpu, i), c = load(dt, o_cpu, i);
            if (bad && s == 3) {
                CHECK(isnan(a), "bad block id: out[%zu] = %g, want NaN", i, a);
                continue;
            }
            CHECK(fabs(a - c) <= 2e-5 + (2e-5 + u) * fabs(c),
                  "%s %s kind %d window %u sinks %d H=%u/%u D=%u dv=%u B=%u: seq %u out[%zu] gpu "
                  "%.9g cpu %.9g",
                  mla ? "mla" : "window", pkv_dtype_name(dt), (int)win.kind, win.window,
                  sinks != NULL, H, kvh, D, dv, B, s, i, a, c);
        }
    }
    cudaFree(dk_), cudaFree(dv_), cudaFree(dq), cudaFree(dtable), cudaFree(dlens);
    cudaFree(dsinks), cudaFree(dout);
    free(k), free(v), free(table), free(q), free(o_cpu), free(o_gpu);
}

int main(int argc, char **argv) {
    const char *opt = argc > 1 ? argv[1] : "";
    if (strcmp(opt, "--help") == 0 || strcmp(opt, "-h") == 0) {
        printf("usage: window-check [--quick]\n"
               "The sliding-window, chunked, sink and MLA decode kernels against the CPU calls.\n"
               "exit: 0 pass, 1 mismatch or CUDA failure, 2 bad usage, 77 no CUDA device\n");
        return 0;
    }
    if (argc > 2 || (argc == 2 && strcmp(opt, "--quick") != 0)) {
        fprintf(stderr, "window-check: unknown argument '%s' (see --help)\n", argc > 2 ? argv[2] : opt);
        return 2;
    }
    int quick = strcmp(opt, "--quick") == 0;
    int n = 0;
    if (cudaGetDeviceCount(&n) != cudaSuccess || n == 0) {
        printf("window-check: no CUDA device: skipped\n");
        return 77;
    }
    const pkv_dtype dts[3] = {PKV_DTYPE_F32, PKV_DTYPE_F16, PKV_DTYPE_BF16};
    const uint32_t dims[3] = {64, 128, 256};
    const uint32_t heads[3][2] = {{4, 4}, {8, 2}, {8, 1}}; // GQA 1, 4, 8
    const float sinks[8] = {-1e4f, 40.0f, -2.5f, 0.0f, 1e4f, 3.0f, -40.0f, 0.5f};
    const pkv_attn_window wins[5] = {{PKV_ATTN_WINDOW_SLIDING, 5, NULL},
                                     {PKV_ATTN_WINDOW_SLIDING, 37, NULL},
                                     {PKV_ATTN_WINDOW_SLIDING, 300, NULL},
                                     {PKV_ATTN_WINDOW_CHUNKED, 32, NULL},
                                     {PKV_ATTN_WINDOW_CHUNKED, 20, NULL}};
    for (int w = 0; w < 5; w++) {
        for (int d = 0; d < 3; d++) {
            const uint32_t *g = heads[(w + d) % 3];
            run_case(dts[d], g[0], g[1], dims[(w + d) % 3], w % 2 ? 16 : 12, wins[w],
                     (w + d) % 2 ? sinks : NULL, 0, 0, w == 0 && d == 0);
        }
    }
    pkv_attn_window full = {PKV_ATTN_WINDOW_FULL, 0, NULL};
    run_case(PKV_DTYPE_BF16, 8, 2, 128, 16, full, sinks, 0, 0, 0); // gpt-oss full layers
    // MLA: DeepSeek's 512 + 64, then small dims (rope 0 included).
    for (int d = 0; d < (quick ? 1 : 3); d++) {
        run_case(dts[d], 16, 1, 576, 16, full, NULL, 1, 512, d == 0);
    }
    run_case(PKV_DTYPE_F32, 4, 1, 24, 8, full, NULL, 1, 16, 0);
    run_case(PKV_DTYPE_F16, 3, 1, 40, 5, full, NULL, 1, 40, 0);
    run_case(PKV_DTYPE_BF16, 8, 1, 96, 16, full, NULL, 1, 64, 0);
    printf("window-check: %u cases, %u failed: %s\n", cases, failures, failures ? "FAIL" : "PASS");
    return failures ? 1 : 0;
}

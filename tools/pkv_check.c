// SPDX-License-Identifier: MIT
// pkv-check: the CUDA kernels against the CPU implementation on this machine's
// GPU, with no test framework: decode (paged and contiguous, every dtype, head
// dim and a range of block sizes), split-K decode, causal prefill, cache write,
// batched block copy, bad device tables (NaN rows, nothing else touched) and the
// decoder's greedy tokens (CUDA backend against the CPU backend). One line per
// group and a verdict. Run it first on a new GPU machine.
// The same file, compiled with PKV_CHECK_EMU, is the `emu` test suite: its CUDA
// calls then go to the CPU emulator of tests/emu (the decoder group is left out
// there, since the runtime's own kernels are not emulated).
// Tolerance, CUDA vs CPU: both accumulate in fp32 in different orders, each within
// 3e-5 + u|ref| of the exact result, so they may differ by 6e-5 + 2u|x|
// (u = 0, 2^-11, 2^-8 for fp32 / fp16 / bf16); the error column is the largest
// |cuda - cpu| over that bound (<= 1 passes). Byte-moving kernels must match exactly.
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "pkv/attention.h"
#include "pkv/generate.h"
#include "pkv/model.h"
#include "pkv/model_config.h"
#include "pkv_config.h"
#include "src/attention/half.h"

#if PKV_HAVE_CUDA || defined(PKV_CHECK_EMU)
#define HAVE_DEVICE_CODE 1
#include <cuda_runtime.h>
#else
#define HAVE_DEVICE_CODE 0
#endif

#if defined(__GNUC__) && !defined(__clang__)
// Messages are cut to their buffers on purpose.
#pragma GCC diagnostic ignored "-Wformat-truncation"
#endif

#define EXIT_NO_DEVICE 77 // the automake / meson "skipped" code

static void usage(FILE *f) {
    fprintf(f,
            "usage: pkv-check [options]\n"
            "Runs the CUDA attention kernels and the CUDA decoder against the CPU on the\n"
            "same inputs and prints one line per group and a verdict.\n"
            "  --quick      shorter contexts (a smaller grid, for sanitizers)\n"
            "  --only G     run group G only: decode, splitk, prefill, write, copy, bad,\n"
            "               errors, decoder (may be repeated)\n"
            "  --max-cases N  run only the first N decode / split-K / prefill cases\n"
            "               (a racecheck of one split-K case: --only splitk --max-cases 1)\n"
            "  --json       one JSON object on stdout\n"
            "  --verbose    one line per case\n"
            "  --help       this text\n"
            "exit: 0 every case matches, 1 a mismatch or a CUDA failure, 2 bad usage,\n"
            "      77 nothing to check: a build without CUDA or no CUDA device.\n");
}

typedef struct group {
    const char *name;
    unsigned cases;
    unsigned failed;
    double worst; // largest error / tolerance
    char first[200];
} group;

typedef struct ctx {
    int quick;
    int verbose;
    unsigned max_cases; // 0: no limit; else run_case runs only the first max_cases
    unsigned ran;
    group *g;
    uint64_t rng;
} ctx;

#if HAVE_DEVICE_CODE

static void fail(ctx *c, const char *fmt, const char *what, double x) {
    group *g = c->g;
    if (g->first[0] == '\0') {
        char buf[160];
        snprintf(buf, sizeof buf, fmt, x);
        snprintf(g->first, sizeof g->first, "%s: %s", what, buf);
    }
}

static void case_done(ctx *c, int ok, double err, const char *what) {
    group *g = c->g;
    g->cases++;
    g->failed += ok ? 0u : 1u;
    if (err > g->worst || isnan(err)) {
        g->worst = isnan(err) ? INFINITY : err;
    }
    if (c->verbose) {
        fprintf(stderr, "  %-8s %-4s err %.3g  %s\n", g->name, ok ? "ok" : "FAIL", err, what);
    }
}


static uint64_t rng_next(ctx *c) { // splitmix64
    uint64_t z = (c->rng += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

static double rng_unit(ctx *c) {
    return (double)(rng_next(c) >> 11) / (double)(1ull << 53) * 2.0 - 1.0;
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

// Device buffers of one case, freed together.
typedef struct dev_list {
    void *p[16];
    int n;
    int bad; // an allocation or copy failed
} dev_list;

static void *dev_copy(dev_list *l, const void *host, size_t bytes) {
    void *d = NULL;
    if (l->n >= 16 || cudaMalloc(&d, bytes ? bytes : 1) != cudaSuccess) {
        l->bad = 1;
        return NULL;
    }
    l->p[l->n++] = d;
    if (host != NULL && bytes > 0 &&
        cudaMemcpy(d, host, bytes, cudaMemcpyHostToDevice) != cudaSuccess) {
        l->bad = 1;
    }
    return d;
}

static void dev_free(dev_list *l) {
    for (int i = 0; i < l->n; i++) {
        cudaFree(l->p[i]);
    }
    l->n = 0;
}

// Largest |cpu - gpu| over the tolerance; NaN against a number counts as infinite.
static double compare(pkv_dtype dt, const void *cpu, const void *gpu, size_t n, size_t *where) {
    double u = dt == PKV_DTYPE_F32 ? 0.0 : dt == PKV_DTYPE_F16 ? ldexp(1.0, -11) : ldexp(1.0, -8);
    double worst = 0.0;
    for (size_t i = 0; i < n; i++) {
        double a = load(dt, cpu, i);
        double b = load(dt, gpu, i);
        double r;
        if (isnan(a) || isnan(b)) {
            r = isnan(a) && isnan(b) ? 0.0 : INFINITY;
        } else {
            r = fabs(a - b) / (6e-5 + 2 * u * fabs(a));
        }
        if (r > worst) {
            worst = r;
            *where = i;
        }
    }
    return worst;
}

// One paged decode (or prefill) case on both: shuffled tables, NaN in unused
// slots; each is also checked through the contiguous twin.
static void run_case(ctx *c, pkv_dtype dt, uint32_t heads, uint32_t kvh, uint32_t dim,
                     uint32_t bs, uint32_t nseq, const int32_t *lens, uint32_t splits,
                     int prefill) {
    if (c->max_cases != 0 && c->ran >= c->max_cases) {
        return; // --max-cases: a sanitizer run on the first cases only
    }
    c->ran++;
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
    int32_t *table = calloc((size_t)nseq * max_blocks, sizeof(int32_t));
    size_t bstride = (size_t)kvh * bs * dim;
    size_t cn = (size_t)nblk * bstride;
    void *kc = calloc(cn, es);
    void *vc = calloc(cn, es);
    int32_t *indptr = calloc(nseq + 1, sizeof(int32_t));
    char what[160];
    snprintf(what, sizeof what, "%s %s heads %u/%u dim %u block %u splits %u",
             prefill ? "prefill" : "decode", pkv_dtype_name(dt), heads, kvh, dim, bs, splits);
    if (!perm || !table || !kc || !vc || !indptr) {
        fail(c, "%g: host out of memory", what, 0);
        case_done(c, 0, INFINITY, what);
        free(perm), free(table), free(kc), free(vc), free(indptr);
        return;
    }
    for (uint32_t i = 0; i < nblk; i++) {
        perm[i] = (int32_t)i;
    }
    for (uint32_t i = nblk; i > 1; i--) {
        uint32_t j = (uint32_t)(rng_next(c) % i);
        int32_t t = perm[i - 1];
        perm[i - 1] = perm[j];
        perm[j] = t;
    }
    uint32_t next = 0;
    for (uint32_t s = 0; s < nseq; s++) {
        for (uint32_t b = 0; b < max_blocks; b++) {
            table[s * max_blocks + b] =
                b < ((uint32_t)lens[s] + bs - 1) / bs ? perm[next++] : (int32_t)0x7fffffff;
        }
    }
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
                    store(dt, kc, base + d, rng_unit(c));
                    store(dt, vc, base + d, rng_unit(c));
                }
            }
        }
    }
    // Prefill: the last min(len, 7) tokens of each sequence are the prompt.
    for (uint32_t s = 0; s < nseq; s++) {
        indptr[s + 1] = indptr[s] + (prefill ? (lens[s] < 7 ? lens[s] : 7) : 1);
    }
    uint32_t rows = (uint32_t)indptr[nseq];
    size_t qn = (size_t)rows * heads * dim;
    void *q = calloc(qn, es);
    void *cpu = calloc(qn, es);
    void *gpu = calloc(qn, es);
    for (size_t i = 0; q && i < qn; i++) {
        store(dt, q, i, rng_unit(c));
    }
    pkv_attn_shape sh = {heads, kvh, dim, dt, (float)(1.0 / sqrt(dim)), 1};
    pkv_attn_paged_kv kv = {kc, vc, bstride, (uint64_t)bs * dim, dim, bs, nblk, table,
                            max_blocks, lens};
    dev_list dl = {{0}, 0, 0};
    double err = INFINITY;
    size_t where = 0;
    pkv_status st = PKV_ERR_OUT_OF_MEMORY;
    if (q && cpu && gpu) {
        st = prefill ? pkv_attn_prefill_paged_cpu(&sh, nseq, indptr, q, &kv, cpu)
                     : pkv_attn_decode_paged_cpu(&sh, nseq, q, &kv, cpu);
    }
    if (st != PKV_OK) {
        fail(c, "cpu reference: %g", what, (double)st);
        goto done;
    }
    pkv_attn_paged_kv dkv = kv;
    dkv.k_cache = dev_copy(&dl, kc, cn * es);
    dkv.v_cache = dev_copy(&dl, vc, cn * es);
    dkv.block_tables = dev_copy(&dl, table, (size_t)nseq * max_blocks * sizeof(int32_t));
    dkv.seq_lens = dev_copy(&dl, lens, nseq * sizeof(int32_t));
    void *dq = dev_copy(&dl, q, qn * es);
    void *dout = dev_copy(&dl, NULL, qn * es);
    void *dind = dev_copy(&dl, indptr, (nseq + 1) * sizeof(int32_t));
    // Odd split counts plan from the call's exact longest context (opts.max_context)
    // rather than the table width: the same outputs either way.
    uint32_t longest = 1;
    for (uint32_t s = 0; s < nseq; s++) longest = (uint32_t)lens[s] > longest ? (uint32_t)lens[s] : longest;
    pkv_attn_cuda_opts opts = {NULL, 0, splits, 0, splits % 2 ? longest : 0};
    if (splits != 1) {
        size_t bytes = 0;
        if (pkv_attn_cuda_workspace_bytes(&sh, nseq, splits ? splits : 64,
                                          &bytes) != PKV_OK) {
            dl.bad = 1;
        }
        opts.workspace = dev_copy(&dl, NULL, bytes);
        opts.workspace_bytes = bytes;
    }
    if (dl.bad) {
        fail(c, "device allocation or copy failed%.0g", what, 0);
        goto done;
    }
    st = prefill ? pkv_attn_prefill_paged_cuda(&sh, nseq, dind, dq, &dkv, dout, NULL)
                 : pkv_attn_decode_paged_cuda_ex(&sh, nseq, dq, &dkv, dout, &opts, NULL);
    if (st != PKV_OK || cudaDeviceSynchronize() != cudaSuccess ||
        cudaMemcpy(gpu, dout, qn * es, cudaMemcpyDeviceToHost) != cudaSuccess) {
        fail(c, "CUDA call failed (status %g)", what, (double)st);
        goto done;
    }
    if (prefill) {
        // The same through the _ex call, which takes the row count from the host.
        void *first = malloc(qn * es);
        if (first == NULL || (memcpy(first, gpu, qn * es), 0) ||
            cudaMemset(dout, 0, qn * es) != cudaSuccess ||
            pkv_attn_prefill_paged_cuda_ex(&sh, nseq, dind, rows, dq, &dkv, dout, NULL) !=
                PKV_OK ||
            cudaMemcpy(gpu, dout, qn * es, cudaMemcpyDeviceToHost) != cudaSuccess ||
            memcmp(first, gpu, qn * es) != 0) {
            free(first);
            fail(c, "prefill _ex (host row count) differs from the plain call%.0g", what, 0);
            goto done;
        }
        free(first);
    }
    err = compare(dt, cpu, gpu, qn, &where);
    if (!(err <= 1.0)) {
        char w[200];
        snprintf(w, sizeof w, "%s: element %zu cpu %.8g cuda %.8g", what, where,
                 load(dt, cpu, where), load(dt, gpu, where));
        fail(c, "error/tolerance %g", w, err);
    }
    if (err <= 1.0) {
        // The contiguous twin (decode or prefill) on the same data, laid out [seq][kv_head][max_len][dim]
        // (seq_stride) for block sizes below 32, else as variable rows carved from
        // one [kv_head][arena][dim] arena in reverse order with gaps (seq_offsets).
        uint32_t max_len = max_blocks * bs;
        const int carved = bs >= 32;
        int64_t *offs = calloc(nseq, sizeof *offs);
        uint64_t arena = 0;
        for (uint32_t i = 0; i < nseq; i++) { // the last sequence first
            const uint32_t s = nseq - 1 - i;
            offs[s] = (int64_t)arena * dim;
            arena += (uint64_t)lens[s] + 3;
        }
        const uint64_t head_stride = carved ? arena * dim : (uint64_t)max_len * dim;
        size_t ccn = carved ? (size_t)kvh * arena * dim : (size_t)nseq * kvh * max_len * dim;
        char *ck = calloc(ccn, es);
        char *cv = calloc(ccn, es);
        if (!ck || !cv || !offs) {
            free(ck), free(cv), free(offs);
            err = INFINITY;
            fail(c, "host out of memory%.0g", what, 0);
            goto done;
        }
        for (uint32_t s = 0; s < nseq; s++) {
            const uint64_t row = carved ? (uint64_t)offs[s] : (uint64_t)s * kvh * head_stride;
            for (uint32_t h = 0; h < kvh; h++) {
                for (uint32_t t = 0; t < (uint32_t)lens[s]; t++) {
                    size_t src = (size_t)table[s * max_blocks + t / bs] * bstride +
                                 (size_t)h * bs * dim + (size_t)(t % bs) * dim;
                    size_t dst = row + h * head_stride + (size_t)t * dim;
                    memcpy(ck + dst * es, (char *)kc + src * es, dim * es);
                    memcpy(cv + dst * es, (char *)vc + src * es, dim * es);
                }
            }
        }
        pkv_attn_contig_kv ckv = {dev_copy(&dl, ck, ccn * es), dev_copy(&dl, cv, ccn * es),
                                  (uint64_t)kvh * head_stride, head_stride, dim,
                                  max_len, dkv.seq_lens,
                                  carved ? dev_copy(&dl, offs, nseq * sizeof *offs) : NULL};
        free(offs);
        free(ck);
        free(cv);
        if (dl.bad || cudaMemset(dout, 0, qn * es) != cudaSuccess) {
            err = INFINITY;
            fail(c, "device allocation failed%.0g", "contiguous", 0);
            goto done;
        }
        st = prefill ? pkv_attn_prefill_contig_cuda_ex(&sh, nseq, dind, rows, dq, &ckv, dout, NULL)
                     : pkv_attn_decode_contig_cuda_ex(&sh, nseq, dq, &ckv, dout, &opts, NULL);
        if (st != PKV_OK || cudaMemcpy(gpu, dout, qn * es, cudaMemcpyDeviceToHost) != cudaSuccess) {
            err = INFINITY;
            fail(c, "contiguous CUDA call failed (status %g)", what, (double)st);
            goto done;
        }
        double e2 = compare(dt, cpu, gpu, qn, &where);
        if (!(e2 <= 1.0)) {
            char w[200];
            snprintf(w, sizeof w, "contiguous %s: element %zu cpu %.8g cuda %.8g", what, where,
                     load(dt, cpu, where), load(dt, gpu, where));
            fail(c, "error/tolerance %g", w, e2);
        }
        err = e2 > err || isnan(e2) ? e2 : err;
    }
done:
    case_done(c, err <= 1.0, err, what);
    dev_free(&dl);
    free(cpu), free(gpu), free(q), free(indptr), free(kc), free(vc), free(table), free(perm);
}

static const pkv_dtype dts[3] = {PKV_DTYPE_F32, PKV_DTYPE_F16, PKV_DTYPE_BF16};

static void group_decode(ctx *c) {
    const uint32_t dims[3] = {64, 128, 256};
    const uint32_t bss[4] = {8, 16, 32, 256};
    for (int di = 0; di < 3; di++) {
        for (int i = 0; i < 3; i++) {
            for (int b = 0; b < 4; b++) {
                int32_t lens[5] = {1, (int32_t)bss[b] - 1, (int32_t)bss[b], (int32_t)bss[b] + 1,
                                   c->quick ? 300 : 1000};
                run_case(c, dts[di], 8, 2, dims[i], bss[b], 5, lens, 1, 0);
            }
        }
    }
    // Llama-3-8B's GQA 32/8 and an MHA shape at fp16, no split.
    int32_t lens[3] = {c->quick ? 700 : 2100, 33, 1};
    run_case(c, PKV_DTYPE_F16, 32, 8, 128, 16, 3, lens, 1, 0);
    run_case(c, PKV_DTYPE_F16, 32, 32, 128, 16, 3, lens, 1, 0);
}

static void group_splitk(ctx *c) {
    int32_t lens[3] = {c->quick ? 1700 : 5000, 600, 1};
    for (int di = 0; di < 3; di++) {
        run_case(c, dts[di], 32, 8, 128, 16, 3, lens, 0, 0);  // heuristic
        run_case(c, dts[di], 32, 1, 128, 16, 3, lens, 7, 0);  // MQA, 4 head groups, 7 splits
        run_case(c, dts[di], 16, 16, 64, 32, 3, lens, 64, 0); // MHA, many splits
        run_case(c, dts[di], 4, 2, 256, 16, 3, lens, 0, 0);   // group of 2
        run_case(c, dts[di], 12, 2, 128, 8, 3, lens, 3, 0);   // group of 6
        run_case(c, dts[di], 24, 2, 64, 32, 3, lens, 0, 0);   // group of 12: 2 x 6, padded to 8
    }
}

static void group_prefill(ctx *c) {
    int32_t lens[4] = {40, 3, 17, 300};
    for (int di = 0; di < 3; di++) {
        run_case(c, dts[di], 8, 2, 128, 16, 4, lens, 1, 1);
        run_case(c, dts[di], 4, 4, 64, 8, 4, lens, 1, 1);
    }
}

// Cache write: every dtype, 16-byte aligned strides (vector path) and odd
// strides (element path); slots include padding (-1) and one past the cache.
static void group_write(ctx *c) {
    for (int di = 0; di < 3; di++) {
        for (int odd = 0; odd < 2; odd++) {
            const pkv_dtype dt = dts[di];
            const size_t es = pkv_dtype_size(dt);
            const uint32_t dim = odd ? 66 : 128, kvh = 2, bs = 16, nblk = 9, nt = 6;
            pkv_attn_shape sh = {8, kvh, dim, dt, 0.1f, 1};
            const uint64_t ts = dim + (odd ? 1 : 0), hs = bs * ts, bstride = kvh * hs + (odd ? 3 : 0);
            size_t cn = nblk * bstride;
            size_t tn = (size_t)nt * kvh * dim;
            char what[96];
            snprintf(what, sizeof what, "cache write %s %s strides", pkv_dtype_name(dt),
                     odd ? "odd" : "16-byte");
            char *k = calloc(tn, es), *v = calloc(tn, es);
            char *cpu_k = calloc(cn, es), *cpu_v = calloc(cn, es), *back = calloc(cn, es);
            int ok = 0;
            dev_list dl = {{0}, 0, 0};
            if (k && v && cpu_k && cpu_v && back) {
                for (size_t i = 0; i < tn; i++) {
                    store(dt, k, i, rng_unit(c));
                    store(dt, v, i, rng_unit(c));
                }
                // Slot 4 is one past the cache: the kernel skips it, the CPU call
                // refuses it, so the CPU twin gets -1 (skip) there.
                int64_t slots[6] = {3, -1, 143, 16, (int64_t)nblk * bs, 0};
                int64_t cpu_slots[6] = {3, -1, 143, 16, -1, 0};
                void *dk = dev_copy(&dl, cpu_k, cn * es), *dv = dev_copy(&dl, cpu_v, cn * es);
                void *dkin = dev_copy(&dl, k, tn * es), *dvin = dev_copy(&dl, v, tn * es);
                void *dslots = dev_copy(&dl, slots, sizeof slots);
                ok = !dl.bad &&
                     pkv_attn_cache_write_cpu(&sh, nt, k, v, cpu_slots, cpu_k, cpu_v, bstride,
                                              hs, ts, bs, nblk) == PKV_OK &&
                     pkv_attn_cache_write_cuda(&sh, nt, dkin, dvin, dslots, dk, dv, bstride, hs,
                                               ts, bs, nblk, NULL) == PKV_OK &&
                     cudaMemcpy(back, dk, cn * es, cudaMemcpyDeviceToHost) == cudaSuccess &&
                     memcmp(back, cpu_k, cn * es) == 0 &&
                     cudaMemcpy(back, dv, cn * es, cudaMemcpyDeviceToHost) == cudaSuccess &&
                     memcmp(back, cpu_v, cn * es) == 0;
            }
            if (!ok) {
                fail(c, "bytes differ from the CPU's%.0g", what, 0);
            }
            case_done(c, ok, ok ? 0.0 : INFINITY, what);
            dev_free(&dl);
            free(k), free(v), free(cpu_k), free(cpu_v), free(back);
        }
    }
}

// The CUDA block copy of cp[0..2] over `bytes` bytes of `host` (filled by the
// caller) against the CPU one: every byte the same, including any past the
// cache (a guard), which neither may touch.
static int copy_matches(pkv_dtype dt, void *host, size_t bytes, uint64_t layers, uint64_t ls,
                        uint64_t bstride, uint64_t elems, uint64_t nb, const pkv_block_copy *cp) {
    dev_list dl = {{0}, 0, 0};
    void *back = malloc(bytes);
    void *d = dev_copy(&dl, host, bytes);
    void *dcp = dev_copy(&dl, cp, 3 * sizeof *cp);
    const int ok = back && !dl.bad &&
                   pkv_attn_copy_blocks_cpu(dt, host, layers, ls, bstride, elems, nb, cp, 3) ==
                       PKV_OK &&
                   pkv_attn_copy_blocks_cuda(dt, d, layers, ls, bstride, elems, nb, dcp, 3, NULL) ==
                       PKV_OK &&
                   cudaMemcpy(back, d, bytes, cudaMemcpyDeviceToHost) == cudaSuccess &&
                   memcmp(back, host, bytes) == 0;
    dev_free(&dl);
    free(back);
    return ok;
}

// Block copy of 8-bit caches (int8, fp8 e4m3 / e5m2; issue 20, defect 11: a
// 2-byte unit counted in bytes went twice as far). Strides in bytes: the
// issue's 206 / 198 and a 16-byte multiple; the buffer is followed by guard
// bytes that must come back untouched.
static void copy_8bit(ctx *c) {
    static const pkv_dtype q8[3] = {PKV_DTYPE_INT8, PKV_DTYPE_FP8_E4M3, PKV_DTYPE_FP8_E5M2};
    enum { GUARD = 4096 };
    for (int di = 0; di < 3; di++) {
        for (int odd = 0; odd < 2; odd++) {
            const pkv_dtype dt = q8[di];
            const uint64_t bstride = odd ? 206 : 256, layers = 2, nb = 6;
            const uint64_t ls = nb * bstride + (odd ? 3 : 0), elems = odd ? 198 : 240;
            const size_t all = (size_t)(layers * ls) + GUARD;
            char what[96];
            snprintf(what, sizeof what, "block copy %s %s strides", pkv_dtype_name(dt),
                     odd ? "odd (206 B)" : "16-byte");
            unsigned char *host = malloc(all);
            // The last block is a source: a read past it lands in the guard
            // (sources and destinations are disjoint: the pairs run in parallel).
            const pkv_block_copy cp[3] = {{5, 0}, {2, 1}, {4, 3}};
            int ok = 0;
            if (host) {
                for (size_t i = 0; i < all; i++) {
                    host[i] = (unsigned char)rng_next(c);
                }
                ok = copy_matches(dt, host, all, layers, ls, bstride, elems, nb, cp);
            }
            if (!ok) {
                fail(c, "bytes differ from the CPU's (or past the cache)%.0g", what, 0);
            }
            case_done(c, ok, ok ? 0.0 : INFINITY, what);
            free(host);
        }
    }
}

// Block copy over several layers, vector and element paths.
static void group_copy(ctx *c) {
    for (int di = 0; di < 3; di++) {
        for (int odd = 0; odd < 2; odd++) {
            const pkv_dtype dt = dts[di];
            const size_t es = pkv_dtype_size(dt);
            const uint64_t bstride = odd ? 1037 : 2048, layers = 3, nb = 6;
            const uint64_t ls = nb * bstride + (odd ? 5 : 8), elems = bstride - (odd ? 2 : 8);
            size_t n = (size_t)(layers * ls);
            char what[96];
            snprintf(what, sizeof what, "block copy %s %s strides", pkv_dtype_name(dt),
                     odd ? "odd" : "16-byte");
            char *host = calloc(n, es);
            int ok = 0;
            if (host) {
                for (size_t i = 0; i < n; i++) {
                    store(dt, host, i, rng_unit(c));
                }
                const pkv_block_copy cp[3] = {{0, 3}, {2, 1}, {5, 4}};
                ok = copy_matches(dt, host, n * es, layers, ls, bstride, elems, nb, cp);
            }
            if (!ok) {
                fail(c, "bytes differ from the CPU's%.0g", what, 0);
            }
            case_done(c, ok, ok ? 0.0 : INFINITY, what);
            free(host);
        }
    }
    copy_8bit(c);
}

// Device tables with a bad block id or length: that sequence's rows come back
// NaN, the others correct (and, under a memory checker, nothing is read outside).
static void group_bad(ctx *c) {
    const uint32_t dim = 64, bs = 16;
    float *kc = calloc((size_t)2 * bs * dim, sizeof(float));
    if (!kc) {
        return;
    }
    for (size_t i = 0; i < (size_t)2 * bs * dim; i++) {
        kc[i] = (float)rng_unit(c);
    }
    // 0, 1: paged (a bad block id, a bad length); 2, 3: contiguous rows at
    // seq_offsets (a negative offset, one not 16-byte aligned); 4: paged, a
    // context longer than the caller's opts.max_context.
    for (int variant = 0; variant < 5; variant++) {
        int32_t table[2 * 2] = {0, 1, 1, 99}; // seq 1's second block is out of range
        int32_t lens[2] = {20, 20};
        const int64_t offs[2] = {0, variant == 2 ? -(int64_t)dim : 1};
        if (variant == 1) {
            table[3] = 0;
            lens[1] = 33; // longer than 2 blocks of 16
        }
        if (variant == 4) {
            table[3] = 0; // valid blocks; seq 1's 20 tokens exceed max_context 10
            lens[0] = 10;
        }
        const pkv_attn_cuda_opts tight = {NULL, 0, 1, 0, 10};
        pkv_attn_shape sh = {1, 1, dim, PKV_DTYPE_F32, 0.125f, 1};
        float q[2 * 64];
        for (int i = 0; i < 2 * 64; i++) {
            q[i] = (float)rng_unit(c);
        }
        pkv_attn_paged_kv kv = {kc, kc, (uint64_t)bs * dim, (uint64_t)bs * dim, dim, bs, 2,
                                table, 2, lens};
        pkv_attn_contig_kv ckv = {kc, kc, 0, (uint64_t)2 * bs * dim, dim, 2 * bs, lens, offs};
        float cpu[64];
        float gpu[2 * 64];
        const char *names[5] = {"bad block id poisons its sequence",
                                "bad length poisons its sequence",
                                "negative row offset poisons its sequence",
                                "misaligned row offset poisons its sequence",
                                "a context over opts.max_context poisons its sequence"};
        const char *what = names[variant];
        dev_list dl = {{0}, 0, 0};
        const int contig = variant == 2 || variant == 3;
        int ok = (contig ? pkv_attn_decode_contig_cpu(&sh, 1, q, &ckv, cpu)
                         : pkv_attn_decode_paged_cpu(&sh, 1, q, &kv, cpu)) == PKV_OK;
        pkv_attn_paged_kv dkv = kv;
        pkv_attn_contig_kv dckv = ckv;
        dkv.k_cache = dkv.v_cache = dev_copy(&dl, kc, (size_t)2 * bs * dim * sizeof(float));
        dckv.k_cache = dckv.v_cache = dkv.k_cache;
        dkv.block_tables = dev_copy(&dl, table, sizeof table);
        dkv.seq_lens = dckv.seq_lens = dev_copy(&dl, lens, sizeof lens);
        dckv.seq_offsets = dev_copy(&dl, offs, sizeof offs);
        void *dq = dev_copy(&dl, q, sizeof q);
        void *dout = dev_copy(&dl, NULL, sizeof q);
        ok = ok && !dl.bad &&
             (contig      ? pkv_attn_decode_contig_cuda(&sh, 2, dq, &dckv, dout, NULL)
              : variant < 4 ? pkv_attn_decode_paged_cuda(&sh, 2, dq, &dkv, dout, NULL)
                            : pkv_attn_decode_paged_cuda_ex(&sh, 2, dq, &dkv, dout, &tight, NULL)) ==
                 PKV_OK &&
             cudaMemcpy(gpu, dout, sizeof gpu, cudaMemcpyDeviceToHost) == cudaSuccess;
        size_t where = 0;
        double err = ok ? compare(PKV_DTYPE_F32, cpu, gpu, 64, &where) : INFINITY;
        ok = ok && err <= 1.0;
        for (int d = 0; ok && d < 64; d++) {
            ok = isnan(gpu[64 + d]);
        }
        if (!ok) {
            fail(c, "valid row error %g or bad row not NaN", what, err);
        }
        case_done(c, ok, ok ? err : INFINITY, what);
        dev_free(&dl);
    }
    free(kc);
}

// A CUDA error pending before a call (here a failed cudaMalloc, someone else's)
// must still be pending after a successful attention call: the library may not
// clear what it did not cause.
static void group_errors(ctx *c) {
    const char *what = "a caller's pending CUDA error survives a decode call";
    const uint32_t dim = 64, bs = 16;
    float kc[16 * 64];
    for (int i = 0; i < 16 * 64; i++) {
        kc[i] = (float)rng_unit(c);
    }
    int32_t table[1] = {0};
    int32_t lens[1] = {9};
    float q[64];
    for (int i = 0; i < 64; i++) {
        q[i] = (float)rng_unit(c);
    }
    pkv_attn_shape sh = {1, 1, dim, PKV_DTYPE_F32, 0.125f, 1};
    pkv_attn_paged_kv kv = {kc, kc, (uint64_t)bs * dim, (uint64_t)bs * dim, dim, bs, 1, table, 1,
                            lens};
    float cpu[64];
    float gpu[64];
    dev_list dl = {{0}, 0, 0};
    pkv_attn_paged_kv dkv = kv;
    dkv.k_cache = dkv.v_cache = dev_copy(&dl, kc, sizeof kc);
    dkv.block_tables = dev_copy(&dl, table, sizeof table);
    dkv.seq_lens = dev_copy(&dl, lens, sizeof lens);
    void *dq = dev_copy(&dl, q, sizeof q);
    void *dout = dev_copy(&dl, NULL, sizeof q);
    (void)cudaGetLastError();
    void *huge = NULL;
    cudaError_t pending = cudaMalloc(&huge, (size_t)1 << 62); // fails, and stays pending
    int ok = !dl.bad && pending != cudaSuccess &&
             pkv_attn_decode_paged_cpu(&sh, 1, q, &kv, cpu) == PKV_OK &&
             pkv_attn_decode_paged_cuda(&sh, 1, dq, &dkv, dout, NULL) == PKV_OK;
    cudaError_t after = cudaGetLastError();
    ok = ok && after == pending &&
         cudaMemcpy(gpu, dout, sizeof gpu, cudaMemcpyDeviceToHost) == cudaSuccess;
    size_t where = 0;
    double err = ok ? compare(PKV_DTYPE_F32, cpu, gpu, 64, &where) : INFINITY;
    ok = ok && err <= 1.0;
    if (!ok) {
        fail(c, "pending error lost or result wrong (error/tolerance %g)", what, err);
    }
    case_done(c, ok, ok ? err : INFINITY, what);
    dev_free(&dl);
}

#if !defined(PKV_CHECK_EMU)
// The decoder, greedy, on both backends with the same weights: same tokens.
static void group_decoder(ctx *c) {
    pkv_model_config cfg;
    if (pkv_model_preset("tiny", &cfg) != PKV_OK) {
        fail(c, "no tiny preset%.0g", "decoder", 0);
        case_done(c, 0, INFINITY, "decoder");
        return;
    }
    const int32_t prompt[8] = {1, 2, 3, 4, 5, 6, 7, 8};
    const pkv_kv_mode modes[2] = {PKV_KV_PAGED, PKV_KV_CONTIGUOUS};
    const pkv_dtype kvd[2] = {PKV_DTYPE_F32, PKV_DTYPE_F16};
    for (int mi = 0; mi < 2; mi++) {
        for (int ki = 0; ki < 2; ki++) {
            enum { N = 32 };
            int32_t toks[2][N];
            uint32_t ntok[2] = {0, 0};
            int ok = 1;
            for (int dev = 0; dev < 2 && ok; dev++) {
                pkv_model_params mp = pkv_model_params_default();
                mp.device = dev ? PKV_DEVICE_CUDA : PKV_DEVICE_CPU;
                mp.seed = 3;
                mp.num_threads = 1;
                pkv_model *m = NULL;
                if (pkv_model_create(&cfg, &mp, &m) != PKV_OK) {
                    ok = 0;
                    break;
                }
                pkv_gen_params gp = pkv_gen_params_default();
                gp.kv_mode = modes[mi];
                gp.kv_dtype = kvd[ki];
                gp.max_new_tokens = N;
                pkv_gen_request req = {prompt, 8};
                pkv_gen_output out = {toks[dev], NULL, 0, 0};
                ok = pkv_generate(m, &gp, 1, &req, &out, NULL) == PKV_OK;
                ntok[dev] = out.num_tokens;
                pkv_model_destroy(m);
            }
            ok = ok && ntok[0] == ntok[1] && memcmp(toks[0], toks[1], ntok[0] * sizeof(int32_t)) == 0;
            char what[96];
            snprintf(what, sizeof what, "decoder tiny %s kv %s, 32 greedy tokens",
                     pkv_kv_mode_name(modes[mi]), pkv_dtype_name(kvd[ki]));
            if (!ok) {
                fail(c, "CUDA tokens differ from the CPU's (or a call failed)%.0g", what, 0);
            }
            case_done(c, ok, ok ? 0.0 : INFINITY, what);
        }
    }
}
#endif

#endif // HAVE_DEVICE_CODE

int main(int argc, char **argv) {
    ctx c = {0, 0, 0, 0, NULL, 0x1234567887654321ull};
    int json = 0;
    const char *only[8];
    int nonly = 0;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (strcmp(a, "--help") == 0 || strcmp(a, "-h") == 0) {
            usage(stdout);
            return 0;
        } else if (strcmp(a, "--quick") == 0) {
            c.quick = 1;
        } else if (strcmp(a, "--json") == 0) {
            json = 1;
        } else if (strcmp(a, "--verbose") == 0) {
            c.verbose = 1;
        } else if (strcmp(a, "--max-cases") == 0 && i + 1 < argc) {
            char *end;
            unsigned long n = strtoul(argv[++i], &end, 10);
            if (*argv[i] == '\0' || *end != '\0' || n == 0 || n > 1000000) {
                fprintf(stderr, "pkv-check: --max-cases: '%s' is not a count of 1..1000000\n",
                        argv[i]);
                return 2;
            }
            c.max_cases = (unsigned)n;
        } else if (strcmp(a, "--only") == 0 && i + 1 < argc && nonly < 8) {
            only[nonly++] = argv[++i];
        } else {
            fprintf(stderr, "pkv-check: unknown or incomplete option '%s' (see --help)\n", a);
            return 2;
        }
    }
    static const char *const names[] = {"decode", "splitk", "prefill", "write",
                                        "copy",   "bad",    "errors",  "decoder"};
    for (int i = 0; i < nonly; i++) {
        int known = 0;
        for (size_t j = 0; j < sizeof names / sizeof names[0]; j++) {
            known |= strcmp(only[i], names[j]) == 0;
        }
        if (!known) {
            fprintf(stderr, "pkv-check: unknown group '%s' (see --help)\n", only[i]);
            return 2;
        }
    }
#if !HAVE_DEVICE_CODE
    (void)c;
    (void)json;
    fprintf(stderr, "pkv-check: this build has no CUDA (meson -Dcuda=enabled); nothing to check\n");
    return EXIT_NO_DEVICE;
#else
    int ndev = 0;
    cudaError_t e = cudaGetDeviceCount(&ndev);
    if (e != cudaSuccess || ndev == 0) {
        // Without any NVIDIA driver the runtime reports cudaErrorInsufficientDriver
        // (35), whose text ("CUDA driver version is insufficient for CUDA runtime
        // version") sends a user to upgrade a driver that is not there.
        const char *why = e == cudaSuccess ? "0 devices"
                          : (int)e == 35
                              ? "no NVIDIA driver, or one older than this build's CUDA runtime: "
                                "nvidia-smi shows the driver and the CUDA version it supports"
                              : cudaGetErrorString(e);
        fprintf(stderr, "pkv-check: no CUDA device (%s); nothing to check\n", why);
        return EXIT_NO_DEVICE;
    }
    struct cudaDeviceProp prop;
    char devname[256] = "unknown";
    if (cudaGetDeviceProperties(&prop, 0) == cudaSuccess) {
        snprintf(devname, sizeof devname, "%s (sm_%d%d, %d SMs)", prop.name, prop.major,
                 prop.minor, prop.multiProcessorCount);
    }
    group groups[8];
    void (*const fns[8])(ctx *) = {group_decode, group_splitk, group_prefill, group_write,
                                   group_copy,   group_bad,    group_errors,
#if defined(PKV_CHECK_EMU)
                                   NULL
#else
                                   group_decoder
#endif
    };
    int ng = 0;
    for (int i = 0; i < 8; i++) {
        int run = fns[i] != NULL && nonly == 0;
        for (int j = 0; j < nonly; j++) {
            run |= fns[i] != NULL && strcmp(only[j], names[i]) == 0;
        }
        if (!run) {
            continue;
        }
        group *g = &groups[ng++];
        memset(g, 0, sizeof *g);
        g->name = names[i];
        c.g = g;
        fns[i](&c);
    }
    unsigned cases = 0;
    unsigned failed = 0;
    for (int i = 0; i < ng; i++) {
        cases += groups[i].cases;
        failed += groups[i].failed;
    }
    const char *verdict = failed == 0 && cases > 0 ? "PASS" : "FAIL";
    if (json) {
        printf("{\"device\": \"%s\", \"quick\": %s, \"groups\": [", devname,
               c.quick ? "true" : "false");
        for (int i = 0; i < ng; i++) {
            group *g = &groups[i];
            printf("%s{\"group\": \"%s\", \"cases\": %u, \"failed\": %u, \"worst\": %.6g, "
                   "\"first_failure\": \"",
                   i ? ", " : "", g->name, g->cases, g->failed, isinf(g->worst) ? -1.0 : g->worst);
            for (const char *p = g->first; *p; p++) {
                if (*p == '"' || *p == '\\') {
                    putchar('\\');
                }
                putchar(*p);
            }
            printf("\"}");
        }
        printf("], \"cases\": %u, \"failed\": %u, \"verdict\": \"%s\"}\n", cases, failed, verdict);
    } else {
        printf("pkv-check on %s%s\n", devname, c.quick ? " (quick grid)" : "");
        printf("%-8s %6s %6s %12s  %s\n", "group", "cases", "failed", "worst/tol", "first failure");
        for (int i = 0; i < ng; i++) {
            group *g = &groups[i];
            printf("%-8s %6u %6u %12.4g  %s\n", g->name, g->cases, g->failed, g->worst,
                   g->first[0] ? g->first : "-");
        }
        printf("verdict: %s (%u cases, %u failed)\n", verdict, cases, failed);
    }
    return failed == 0 && cases > 0 ? 0 : 1;
#endif
}

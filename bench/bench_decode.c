// SPDX-License-Identifier: MIT
// Decode-step latency of the tiny model on the CPU, paged against contiguous
// cache in one run, at several batch sizes and context lengths, and the share
// of each step spent outside the math: block management (pkv_seq_append /
// row append), block-table export, slot computation and metadata set-up. The
// contexts are filled by appending slots and zeroing the K/V memory rather
// than by a real prefill: a decode step's cost does not depend on the values.
// Paged and contiguous steps alternate, so that both see the same machine noise.
//
// Threads: by default one thread for BLAS and one for attention. The tiny
// model's decode GEMMs are matrix-vector products of microseconds, where thread
// hand-off costs more than it saves, and on a shared 2-core machine an OpenMP
// team that spin-waits beside OpenBLAS's own threads slows steps down tenfold.
//
// usage: bench_decode [--steps N] [--threads N] [--kv-dtype fp32|fp16|bf16] [--quick]
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "pkv/backend.h"
#include "pkv/cache.h"
#include "pkv/model.h"
#include "pkv/pool.h"
#include "pkv/seq.h"
#include "pkv_config.h"
#include "bench_clock.h"
#if PKV_HAVE_BLAS
#include <cblas.h>
#endif

static int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

#define CHECK(expr)                                                                       \
    do {                                                                                  \
        pkv_status st_ = (expr);                                                          \
        if (st_ != PKV_OK) {                                                              \
            fprintf(stderr, "bench_decode: %s failed: %s\n", #expr, pkv_status_str(st_)); \
            exit(1);                                                                      \
        }                                                                                 \
    } while (0)

typedef struct result {
    double step_med;   // median wall time of one decode step (append + forward)
    double book_share; // (append + in-forward bookkeeping) / step time, summed over steps
} result;

// Both layouts for one (batch, context) point. Steps alternate between them so
// that both see the same machine noise.
typedef struct point {
    uint32_t batch;
    pkv_backend *be;
    pkv_pool *pool;
    pkv_seqset *set;
    pkv_cache *cache;
    pkv_seq_id *ids;
    pkv_contig_kv *kv;
    uint32_t *rows;
    int32_t *tok_p, *tok_c;
    double *t[2], book[2], total[2];
} point;

static void point_init(point *pt, pkv_model *m, uint32_t batch, uint32_t ctx, uint32_t steps,
                       uint32_t block, pkv_dtype dtype) {
    memset(pt, 0, sizeof *pt);
    pt->batch = batch;
    pkv_cache_params cp;
    CHECK(pkv_model_cache_params(m, block, &cp));
    cp.dtype = dtype;
    uint32_t blocks = batch * ((ctx + steps + block - 1) / block + 1);
    CHECK(pkv_backend_create_host(&pt->be));
    CHECK(pkv_pool_create(blocks, &pt->pool));
    CHECK(pkv_seqset_create(pt->pool, block, &pt->set));
    CHECK(pkv_cache_create(&cp, pt->pool, pt->be, &pt->cache));
    CHECK(pkv_backend_memset(pt->be, pkv_cache_data(pt->cache), 0, pkv_cache_arena_bytes(pt->cache)));
    // The contiguous store reserves the longest length up front, as a max-length policy does.
    CHECK(pkv_contig_kv_create(m, batch, ctx + steps, dtype, &pt->kv));
    pt->ids = malloc(batch * sizeof *pt->ids);
    pt->rows = malloc(batch * sizeof *pt->rows);
    pt->tok_p = malloc(batch * sizeof *pt->tok_p);
    pt->tok_c = malloc(batch * sizeof *pt->tok_c);
    for (uint32_t i = 0; i < batch; i++) {
        CHECK(pkv_seq_create(pt->set, &pt->ids[i]));
        CHECK(pkv_seq_append(pt->set, pt->ids[i], ctx - 1, NULL));
        pt->rows[i] = i;
        CHECK(pkv_contig_kv_append(pt->kv, i, ctx - 1));
        pt->tok_p[i] = pt->tok_c[i] = (int32_t)(i % 97);
    }
    pt->t[0] = malloc(steps * sizeof(double));
    pt->t[1] = malloc(steps * sizeof(double));
}

static void point_free(point *pt) {
    free(pt->t[0]);
    free(pt->t[1]);
    free(pt->ids);
    free(pt->rows);
    free(pt->tok_p);
    free(pt->tok_c);
    pkv_contig_kv_destroy(pt->kv);
    pkv_cache_destroy(pt->cache);
    pkv_seqset_destroy(pt->set);
    pkv_pool_destroy(pt->pool);
    pkv_backend_destroy(pt->be);
}

// One decode step of layout `which` (0 paged, 1 contiguous); `s` < 0 is warm-up.
static void point_step(point *pt, pkv_model *m, int which, int s) {
    pkv_model_profile before, after;
    pkv_model_get_profile(m, &before);
    double t0 = now();
    for (uint32_t i = 0; i < pt->batch; i++) {
        if (which == 0) CHECK(pkv_seq_append(pt->set, pt->ids[i], 1, NULL));
        else CHECK(pkv_contig_kv_append(pt->kv, i, 1));
    }
    double t1 = now();
    if (which == 0)
        CHECK(pkv_model_decode_paged(m, pt->cache, pt->set, pt->batch, pt->ids, pt->tok_p, NULL,
                                     pt->tok_p));
    else
        CHECK(pkv_model_decode_contig(m, pt->kv, pt->batch, pt->rows, pt->tok_c, NULL, pt->tok_c));
    double t2 = now();
    pkv_model_get_profile(m, &after);
    if (s < 0) return;
    pt->t[which][s] = t2 - t0;
    pt->book[which] += (t1 - t0) + (after.bookkeeping - before.bookkeeping);
    pt->total[which] += t2 - t0;
}

static result point_result(point *pt, int which, uint32_t steps) {
    qsort(pt->t[which], steps, sizeof(double), cmp_double);
    result r = {pt->t[which][steps / 2], pt->book[which] / pt->total[which]};
    return r;
}

int main(int argc, char **argv) {
    uint32_t steps = 31, threads = 1;
    pkv_dtype dtype = PKV_DTYPE_F32;
    int quick = 0;
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "--steps") == 0 && i + 1 < argc) {
            steps = (uint32_t)strtoul(argv[++i], NULL, 10);
            if (steps == 0) steps = 1;
        } else if (strcmp(argv[i], "--threads") == 0 && i + 1 < argc) {
            threads = (uint32_t)strtoul(argv[++i], NULL, 10);
        } else if (strcmp(argv[i], "--kv-dtype") == 0 && i + 1 < argc) {
            const char *d = argv[++i];
            if (strcmp(d, "fp32") == 0) dtype = PKV_DTYPE_F32;
            else if (strcmp(d, "fp16") == 0) dtype = PKV_DTYPE_F16;
            else if (strcmp(d, "bf16") == 0) dtype = PKV_DTYPE_BF16;
            else {
                fprintf(stderr, "bench_decode: unknown --kv-dtype '%s'\n", d);
                return 2;
            }
        } else if (strcmp(argv[i], "--quick") == 0) {
            quick = 1;
        } else {
            fprintf(stderr, "usage: bench_decode [--steps N] [--threads N] [--kv-dtype T] [--quick]\n");
            return 2;
        }
    }
    pkv_model_config c;
    CHECK(pkv_model_preset("tiny", &c));
    pkv_model_params p = pkv_model_params_default();
    p.num_threads = threads; // 0 = all cores
#if PKV_HAVE_BLAS && defined(OPENBLAS_VERSION)
    if (threads) openblas_set_num_threads((int)threads);
#endif
    pkv_model *m = NULL;
    CHECK(pkv_model_create(&c, &p, &m));
    const uint32_t batches[] = {1, 4, 16}, contexts[] = {128, 512, 1024};
    const uint32_t nb = quick ? 2 : 3, nc = quick ? 2 : 3, block = 16, warmup = 3;
    printf("decode step latency, model tiny (%u layers, d_model %u, %u heads, vocab %u), CPU, "
           "block %u, KV %s, median of %u steps, %u thread(s) (0 = all)\n",
           c.num_layers, c.d_model, c.num_heads, c.vocab_size, block, pkv_dtype_name(dtype), steps,
           threads);
    printf("%5s %6s | %10s %10s %8s | %10s %10s | %12s %12s\n", "batch", "ctx", "paged ms",
           "contig ms", "p/c", "paged tok/s", "contig tok/s", "paged book%", "contig book%");
    double worst = 0;
    for (uint32_t bi = 0; bi < nb; bi++)
        for (uint32_t ci = 0; ci < nc; ci++) {
            uint32_t b = batches[bi], ctx = contexts[ci];
            point pt;
            point_init(&pt, m, b, ctx, steps + warmup, block, dtype);
            for (int st = -(int)warmup; st < (int)steps; st++) {
                point_step(&pt, m, 0, st);
                point_step(&pt, m, 1, st);
            }
            result rp = point_result(&pt, 0, steps), rc = point_result(&pt, 1, steps);
            point_free(&pt);
            if (rp.book_share > worst) worst = rp.book_share;
            printf("%5u %6u | %10.3f %10.3f %8.3f | %10.0f %10.0f | %11.3f%% %11.3f%%\n", b, ctx,
                   1e3 * rp.step_med, 1e3 * rc.step_med, rp.step_med / rc.step_med,
                   b / rp.step_med, b / rc.step_med, 100 * rp.book_share, 100 * rc.book_share);
        }
    printf("largest paged bookkeeping share: %.3f%% of the step (goal < 2%%)\n", 100 * worst);
    pkv_model_destroy(m);
    return 0;
}

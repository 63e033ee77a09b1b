// SPDX-License-Identifier: MIT
// Allocator benchmark: what one KV block costs to get and give back from the
// pool, against the general-purpose allocators an engine would otherwise call
// (glibc malloc, jemalloc's mallocx, and cudaMalloc when a GPU is present), for
// the same block bytes. Everything is measured side by side in one run; the
// table's ratio column is (other allocator's ns) / (pool's ns).
//
// jemalloc is loaded with dlopen(RTLD_LOCAL) so that it does not replace the
// process's malloc: the "glibc" rows stay glibc.
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "pkv/pkv.h"
#include "src/allocator/lcm.h" // internal: the two-level allocator's rows (issue 23)

typedef struct options {
    int json;
    int quick;
    size_t block_bytes;  // bytes per block for the malloc-family rows
    long callgrind_ops;  // > 0: only run pool alloc/free this many times (for callgrind)
} options;

typedef struct row {
    const char *name;
    double ns;           // per operation (an alloc+free pair, or the op named)
    double ratio;        // ns / pool alloc+free ns of the same batch; 0 = not shown
} row;

static double now_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return 1e9 * (double)ts.tv_sec + (double)ts.tv_nsec;
}

static volatile uintptr_t sink; // keeps results alive so the compiler cannot drop work

static void die(const char *what, pkv_status st) {
    fprintf(stderr, "bench_alloc: %s: %s\n", what, pkv_status_str(st));
    exit(1);
}

// Each benchmark runs `iters` iterations `reps` times and keeps the fastest rep
// (the one least disturbed by the other core's work).
#define REPS 5

static double bench_pool_batch(pkv_pool *pool, uint32_t batch, long iters) {
    pkv_block_id ids[128];
    double best = 1e300;
    for (int r = 0; r < REPS; r++) {
        double t0 = now_ns();
        for (long i = 0; i < iters; i++) {
            if (batch == 1) {
                pkv_status st = pkv_pool_alloc(pool, 1, ids);
                sink += (uintptr_t)ids[0];
                if (st != PKV_OK || pkv_pool_release(pool, ids[0]) != PKV_OK) die("pool", st);
            } else {
                if (pkv_pool_alloc(pool, batch, ids) != PKV_OK) die("pool", PKV_ERR_OUT_OF_BLOCKS);
                sink += (uintptr_t)ids[batch - 1];
                pkv_pool_release_n(pool, ids, batch);
            }
        }
        double t = (now_ns() - t0) / (double)iters;
        if (t < best) best = t;
    }
    return best;
}

// The two-level allocator (issue 23's hybrid-lcm layout): one small page allocated
// and freed through a KV cache group's pool per iteration, the large-page layer
// asked for room when the pool is short (as pkv_hybrid does), over two groups of
// 3 and 4 KiB pages (large pages of 12 KiB holding 4 or 3) and ONE large page,
// the group switching every `period` iterations: each switch finds no unowned
// large page, so the other group's empty one is reclaimed and carved again (the
// take/return path, O(pages per large page)). period 1 is the worst case, and
// every iteration empties and refills a large page (its counter and empty bit
// flip). Reps alternate with the fixed pool's batch-1 loop (`pool`) so that both
// see the same load; *pool_ns and the return value are each the best rep.
static double bench_lcm(pkv_pool *pool, uint32_t period, long iters, double *pool_ns) {
    const uint64_t bytes[2] = {3072, 4096};
    pkvi_lcm *lcm;
    pkv_status st = pkvi_lcm_create(bytes, 2, 12288, &lcm, NULL, 0);
    if (st != PKV_OK) die("lcm", st);
    pkv_pool *pools[2] = {pkvi_lcm_pool(lcm, 0), pkvi_lcm_pool(lcm, 1)};
    double best = 1e300;
    *pool_ns = 1e300;
    // Each side runs REPS reps of iters / REPS (the same length and count: a longer
    // rep is more likely to be disturbed on a loaded machine, and only the best counts).
    const long per = iters / REPS;
    uint32_t g = 0, left = period; // a countdown, not i / period: no divide in the loop
    for (int r = 0; r < 2 * REPS; r++) {
        double p = bench_pool_batch(pool, 1, per);
        if (p < *pool_ns) *pool_ns = p;
        for (int q = 0; q < REPS; q++) {
            double t0 = now_ns();
            for (long i = 0; i < per; i++) {
                if (left-- == 0) g ^= 1, left = period - 1;
                pkv_block_id id;
                st = pkv_pool_free_count(pools[g]) ? PKV_OK : pkvi_lcm_reserve_group(lcm, g, 1);
                if (st == PKV_OK) st = pkv_pool_alloc(pools[g], 1, &id);
                if (st != PKV_OK) die("lcm", st);
                sink += (uintptr_t)id;
                if ((st = pkv_pool_release(pools[g], id)) != PKV_OK) die("lcm release", st);
            }
            double t = (now_ns() - t0) / (double)per;
            if (t < best) best = t;
        }
    }
    pkvi_lcm_stats s;
    pkvi_lcm_get_stats(lcm, &s);
    if (s.reclaims < (uint64_t)(iters / period) - 1) die("lcm: large pages did not move", PKV_ERR_CORRUPT);
    pkvi_lcm_destroy(lcm);
    return best;
}

typedef void *(*alloc_fn)(void *ctx, size_t bytes);
typedef void (*free_fn)(void *ctx, void *p, size_t bytes);

static double bench_malloc_batch(alloc_fn a, free_fn f, void *ctx, size_t bytes, uint32_t batch,
                                 long iters) {
    void *ptrs[128];
    double best = 1e300;
    for (int r = 0; r < REPS; r++) {
        double t0 = now_ns();
        for (long i = 0; i < iters; i++) {
            for (uint32_t k = 0; k < batch; k++) {
                ptrs[k] = a(ctx, bytes);
                if (!ptrs[k]) die("malloc", PKV_ERR_OUT_OF_MEMORY);
                // Touch the first line as an engine would; without it glibc may
                // hand back pages it never faulted in, and that is not the case we model.
                *(volatile char *)ptrs[k] = 1;
            }
            for (uint32_t k = 0; k < batch; k++) f(ctx, ptrs[k], bytes);
        }
        double t = (now_ns() - t0) / (double)iters;
        if (t < best) best = t;
    }
    return best;
}

static void *glibc_alloc(void *ctx, size_t bytes) { (void)ctx; return malloc(bytes); }
static void glibc_free(void *ctx, void *p, size_t bytes) { (void)ctx; (void)bytes; free(p); }

typedef struct jemalloc_api {
    void *(*mallocx)(size_t, int);
    void (*dallocx)(void *, int);
} jemalloc_api;

static void *je_alloc(void *ctx, size_t bytes) { return ((jemalloc_api *)ctx)->mallocx(bytes, 0); }
static void je_free(void *ctx, void *p, size_t bytes) {
    (void)bytes;
    ((jemalloc_api *)ctx)->dallocx(p, 0);
}

static void *backend_alloc(void *ctx, size_t bytes) {
    void *p = NULL;
    return pkv_backend_alloc(ctx, bytes, &p) == PKV_OK ? p : NULL;
}
static void backend_free(void *ctx, void *p, size_t bytes) { pkv_backend_free(ctx, p, bytes); }

static int load_jemalloc(jemalloc_api *je) {
#ifdef PKV_JEMALLOC_PATH
    void *h = dlopen(PKV_JEMALLOC_PATH, RTLD_NOW | RTLD_LOCAL);
    if (!h) return 0;
    *(void **)&je->mallocx = dlsym(h, "mallocx");
    *(void **)&je->dallocx = dlsym(h, "dallocx");
    return je->mallocx && je->dallocx;
#else
    (void)je;
    return 0;
#endif
}

// Append one token at a time to sequences of 2048 tokens, freeing and
// restarting: the block allocations amortize over block_size tokens as they do
// in a decode loop.
static double bench_append(pkv_seqset *set, long iters) {
    double best = 1e300;
    for (int r = 0; r < REPS; r++) {
        pkv_seq_id id;
        pkv_seq_create(set, &id);
        double t0 = now_ns();
        for (long i = 0; i < iters; i++) {
            int64_t slot;
            pkv_status st = pkv_seq_append(set, id, 1, &slot);
            if (st != PKV_OK) die("append", st);
            sink += (uintptr_t)slot;
            if ((i & 2047) == 2047) {
                pkv_seq_free(set, id);
                pkv_seq_create(set, &id);
            }
        }
        double t = (now_ns() - t0) / (double)iters;
        pkv_seq_free(set, id);
        if (t < best) best = t;
    }
    return best;
}

// Fork a 2048-token sequence (128 blocks of 16) and free the child.
static double bench_fork(pkv_seqset *set, long iters) {
    pkv_seq_id parent;
    pkv_seq_create(set, &parent);
    if (pkv_seq_append(set, parent, 2048, NULL) != PKV_OK) die("append", PKV_ERR_OUT_OF_BLOCKS);
    double best = 1e300;
    for (int r = 0; r < REPS; r++) {
        double t0 = now_ns();
        for (long i = 0; i < iters; i++) {
            pkv_seq_id child;
            pkv_status st = pkv_seq_fork(set, parent, &child);
            if (st != PKV_OK) die("fork", st);
            pkv_seq_free(set, child);
        }
        double t = (now_ns() - t0) / (double)iters;
        if (t < best) best = t;
    }
    pkv_seq_free(set, parent);
    return best;
}

// The engine-step row (issue 10): 256 running sequences decode one token each,
// block 16, the set attached to a prefix cache (every sequence starts with a
// shared 64-token system prompt taken from the cache). One step = decide
// (blocks needed) + append with the slot mapping + take the copy list; a
// sequence that reaches 1024 tokens retires and a new request takes its place
// through the cache, as in a server's steady state. mode 0: 256 single calls
// (blocks_needed + append each); mode 1: blocks_needed_batch + append_batch;
// mode 2: append_batch alone (it is all or nothing: an engine may ask
// blocks_needed_batch only when the append is refused). Same work in all three.
#define STEP_SEQS 256
#define STEP_MAX_LEN 1024
#define STEP_PROMPT 65 // 64 cached tokens + the one that is always computed

typedef struct step_world {
    pkv_pool *pool;
    pkv_seqset *set;
    pkv_prefix_cache *cache;
    pkv_seq_id ids[STEP_SEQS];
    uint32_t counts[STEP_SEQS], lens[STEP_SEQS];
    int64_t slots[STEP_SEQS];
    int32_t prompt[STEP_PROMPT];
} step_world;

static void step_admit(step_world *w, int i, uint32_t len) {
    uint32_t cached;
    pkv_status st =
        pkv_seq_create_cached(w->set, w->cache, w->prompt, STEP_PROMPT, &w->ids[i], &cached);
    if (st == PKV_OK) st = pkv_seq_append(w->set, w->ids[i], len - cached, NULL);
    if (st != PKV_OK) die("engine step admit", st);
    w->lens[i] = len;
}

static void step_world_init(step_world *w) {
    pkv_status st = pkv_pool_create(STEP_SEQS * (STEP_MAX_LEN / 16 + 2) + 64, &w->pool);
    if (st == PKV_OK) st = pkv_seqset_create(w->pool, 16, &w->set);
    if (st == PKV_OK) st = pkv_prefix_cache_create(w->pool, 16, 1024, &w->cache);
    if (st == PKV_OK) st = pkv_prefix_cache_attach(w->cache, w->set);
    if (st != PKV_OK) die("engine step setup", st);
    for (int i = 0; i < STEP_PROMPT; i++) w->prompt[i] = 1000 + i;
    pkv_seq_id first;
    uint32_t cached;
    st = pkv_seq_create_cached(w->set, w->cache, w->prompt, STEP_PROMPT, &first, &cached);
    if (st == PKV_OK) st = pkv_seq_append(w->set, first, STEP_PROMPT, NULL);
    if (st == PKV_OK)
        st = pkv_prefix_cache_insert(w->cache, w->set, first, w->prompt, STEP_PROMPT, NULL);
    if (st == PKV_OK) st = pkv_seq_free(w->set, first);
    if (st != PKV_OK) die("engine step prompt", st);
    // Staggered lengths so that block boundaries and retirements spread over steps.
    for (int i = 0; i < STEP_SEQS; i++) {
        step_admit(w, i, STEP_PROMPT + (uint32_t)(i * 37) % (STEP_MAX_LEN - STEP_PROMPT));
        w->counts[i] = 1;
    }
}

static void step_world_free(step_world *w) {
    pkv_seqset_destroy(w->set);
    pkv_prefix_cache_destroy(w->cache);
    pkv_pool_destroy(w->pool);
}

static void engine_step(step_world *w, int mode) {
    pkv_block_copy copies[STEP_SEQS];
    uint32_t need = 0, ncopies;
    pkv_status st;
    if (mode) {
        st = mode == 1 ? pkv_seqset_blocks_needed_batch(w->set, w->ids, w->counts, STEP_SEQS, &need)
                       : PKV_OK;
        if (st == PKV_OK)
            st = pkv_seqset_append_batch(w->set, w->ids, w->counts, STEP_SEQS, w->slots);
        if (st != PKV_OK) die("engine step (batch)", st);
    } else {
        for (int i = 0; i < STEP_SEQS; i++) {
            uint32_t one;
            st = pkv_seq_blocks_needed(w->set, w->ids[i], 1, &one);
            need += one;
            if (st == PKV_OK) st = pkv_seq_append(w->set, w->ids[i], 1, &w->slots[i]);
            if (st != PKV_OK) die("engine step (single)", st);
        }
    }
    st = pkv_seqset_take_copies(w->set, copies, STEP_SEQS, &ncopies);
    if (st != PKV_OK) die("copies", st);
    sink += (uintptr_t)w->slots[STEP_SEQS - 1] + need + ncopies;
    for (int i = 0; i < STEP_SEQS; i++)
        if (++w->lens[i] == STEP_MAX_LEN) {
            if ((st = pkv_seq_free(w->set, w->ids[i])) != PKV_OK) die("retire", st);
            step_admit(w, i, STEP_PROMPT);
        }
}

// ns per step for each mode: the best of short reps of 200 steps (short, so that
// most reps run without being preempted on a shared machine); the modes run
// interleaved on identical worlds.
static void bench_engine_step(long steps, double ns[3]) {
    const long per_rep = 200, reps = steps / per_rep > REPS ? steps / per_rep : REPS;
    step_world *w[3];
    for (int v = 0; v < 3; v++) {
        w[v] = calloc(1, sizeof *w[v]);
        if (!w[v]) die("engine step", PKV_ERR_OUT_OF_MEMORY);
        step_world_init(w[v]);
    }
    ns[0] = ns[1] = ns[2] = 1e300;
    for (long r = 0; r < reps; r++)
        for (int v = 0; v < 3; v++) {
            double t0 = now_ns();
            for (long i = 0; i < per_rep; i++) engine_step(w[v], v);
            double t = (now_ns() - t0) / (double)per_rep;
            if (t < ns[v]) ns[v] = t;
        }
    for (int v = 0; v < 3; v++) {
        step_world_free(w[v]);
        free(w[v]);
    }
}

static void usage(FILE *out) {
    fprintf(out,
            "usage: bench_alloc [--quick] [--json] [--block-bytes N] [--callgrind N]\n"
            "\n"
            "Times pool alloc+free (1, 16, 128 blocks), append of one token and fork of a\n"
            "2k-token sequence, against glibc malloc/free, jemalloc mallocx/dallocx and (with\n"
            "a GPU) cudaMalloc/cudaFree of block-sized buffers, side by side in one run; and\n"
            "one engine step (256 sequences decode one token, block 16, prefix cache on) as\n"
            "batch calls vs 256 single calls (ns per step; x column: single / batch); and\n"
            "the two-level (hybrid-lcm) allocator's reserve+alloc+free of one small page\n"
            "with a large page moving between two groups every 64 or every 1 iterations\n"
            "(x column: its ns / the pool's batch-1 ns, measured just before it).\n"
            "bench_alloc --calibrate FILE.json [--backend host|cuda]: fit the per-call cost\n"
            "of backend alloc/free by size (piecewise linear, 4 KiB-256 MiB, the shape of the\n"
            "default cuda-boyer model) that pkv-replay --alloc-model FILE.json reads.\n"
            "\n"
            "  --block-bytes N  bytes per block for malloc rows (default 262144: 16 tokens of\n"
            "                   one Llama-2-7B layer's K and V in fp16, 2x32x128x2x16)\n"
            "  --quick          fewer iterations (a smoke run)\n"
            "  --json           one JSON object on stdout instead of the table\n"
            "  --callgrind N    only N pool alloc+free pairs of 1 block (run under\n"
            "                   valgrind --tool=callgrind to count instructions per call)\n");
}

static int parse(int argc, char **argv, options *o) {
    o->json = 0;
    o->quick = 0;
    o->block_bytes = 2u * 32 * 128 * 2 * 16;
    o->callgrind_ops = 0;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--help") || !strcmp(argv[i], "-h")) {
            usage(stdout);
            exit(0);
        } else if (!strcmp(argv[i], "--json")) {
            o->json = 1;
        } else if (!strcmp(argv[i], "--quick")) {
            o->quick = 1;
        } else if (!strcmp(argv[i], "--block-bytes") && i + 1 < argc) {
            char *end;
            unsigned long long v = strtoull(argv[++i], &end, 10);
            if (*end || v == 0 || v > (1ull << 34)) {
                fprintf(stderr, "bench_alloc: --block-bytes: '%s' is not a size in 1..2^34\n", argv[i]);
                return 0;
            }
            o->block_bytes = (size_t)v;
        } else if (!strcmp(argv[i], "--callgrind") && i + 1 < argc) {
            o->callgrind_ops = strtol(argv[++i], NULL, 10);
            if (o->callgrind_ops <= 0) {
                fprintf(stderr, "bench_alloc: --callgrind needs a positive count\n");
                return 0;
            }
        } else {
            fprintf(stderr, "bench_alloc: unknown or incomplete option '%s'\n", argv[i]);
            usage(stderr);
            return 0;
        }
    }
    return 1;
}

int alloc_calibrate_main(int argc, char **argv); // alloc_calibrate.c

int main(int argc, char **argv) {
    // --calibrate FILE.json: the allocation cost model for pkv-replay (alloc_calibrate.c).
    for (int i = 1; i < argc; i++)
        if (!strcmp(argv[i], "--calibrate")) return alloc_calibrate_main(argc, argv);
    options o;
    if (!parse(argc, argv, &o)) return 2;

    pkv_pool *pool;
    pkv_status st = pkv_pool_create(4096, &pool);
    if (st != PKV_OK) die("pool", st);
    if (o.callgrind_ops > 0) {
        pkv_block_id id;
        for (long i = 0; i < o.callgrind_ops; i++) {
            pkv_pool_alloc(pool, 1, &id);
            pkv_pool_release(pool, id);
        }
        pkv_pool_destroy(pool);
        return 0;
    }
    pkv_seqset *set;
    if ((st = pkv_seqset_create(pool, 16, &set)) != PKV_OK) die("seqset", st);

    const long scale = o.quick ? 10 : 1;
    const long it1 = 2000000 / scale, itb = 100000 / scale, itm = 20000 / scale;
    const uint32_t batches[3] = {1, 16, 128};
    row rows[32];
    int n = 0;

    jemalloc_api je;
    int have_je = load_jemalloc(&je);
    pkv_backend *cuda = NULL;
    int have_cuda = pkv_backend_create_cuda(0, &cuda) == PKV_OK;

    for (int b = 0; b < 3; b++) {
        uint32_t batch = batches[b];
        long iters = batch == 1 ? it1 : itb / batch * 4;
        long miters = batch == 1 ? itm * 10 : itm / batch * 8;
        double pool_ns = bench_pool_batch(pool, batch, iters) / batch;
        static char names[3][6][64];
        snprintf(names[b][0], 64, "pool alloc+free, batch %u", batch);
        rows[n++] = (row){names[b][0], pool_ns, 1.0};
        double g = bench_malloc_batch(glibc_alloc, glibc_free, NULL, o.block_bytes, batch, miters) / batch;
        snprintf(names[b][1], 64, "glibc malloc+free, batch %u", batch);
        rows[n++] = (row){names[b][1], g, g / pool_ns};
        if (have_je) {
            double j = bench_malloc_batch(je_alloc, je_free, &je, o.block_bytes, batch, miters) / batch;
            snprintf(names[b][2], 64, "jemalloc mallocx+dallocx, batch %u", batch);
            rows[n++] = (row){names[b][2], j, j / pool_ns};
        }
        if (have_cuda) {
            long citers = miters / 20 + 1;
            double c = bench_malloc_batch(backend_alloc, backend_free, cuda, o.block_bytes, batch, citers) / batch;
            snprintf(names[b][3], 64, "cudaMalloc+cudaFree, batch %u", batch);
            rows[n++] = (row){names[b][3], c, c / pool_ns};
        }
    }
    // The two-level rows, each beside the pool's batch-1 loop run in alternation.
    static const uint32_t periods[2] = {64, 1};
    static char lcm_names[2][2][64];
    for (int k = 0; k < 2; k++) {
        double p1, l1 = bench_lcm(pool, periods[k], k ? it1 / 8 : it1 / 2, &p1);
        snprintf(lcm_names[k][0], 64, "pool alloc+free, batch 1 (beside next)");
        rows[n++] = (row){lcm_names[k][0], p1, 1.0};
        snprintf(lcm_names[k][1], 64, "hybrid-lcm alloc+free, move every %u", periods[k]);
        rows[n++] = (row){lcm_names[k][1], l1, l1 / p1};
    }
    rows[n++] = (row){"seq append 1 token (block 16)", bench_append(set, it1), 0};
    rows[n++] = (row){"seq fork+free of 2048 tokens", bench_fork(set, itb / 4), 0};
    double step[3];
    bench_engine_step(itb / 4, step);
    rows[n++] = (row){"engine step 256 seqs: 256 single calls", step[0], 0};
    rows[n++] = (row){"engine step: blocks_needed+append batch", step[1], step[0] / step[1]};
    rows[n++] = (row){"engine step: append_batch alone", step[2], step[0] / step[2]};

    if (o.json) {
        printf("{\"block_bytes\": %zu, \"jemalloc\": %s, \"cuda\": %s, \"rows\": [", o.block_bytes,
               have_je ? "true" : "false", have_cuda ? "true" : "false");
        for (int i = 0; i < n; i++)
            printf("%s{\"name\": \"%s\", \"ns_per_op\": %.3f, \"ratio_vs_pool\": %.3f}",
                   i ? ", " : "", rows[i].name, rows[i].ns, rows[i].ratio);
        printf("]}\n");
    } else {
        printf("block bytes for malloc rows: %zu (pool rows move block ids only)%s%s\n",
               o.block_bytes, have_je ? "" : "; jemalloc not found",
               have_cuda ? "" : "; no CUDA device: cudaMalloc rows skipped");
        printf("%-40s %14s %14s\n", "operation (per block)", "ns/op", "x pool");
        for (int i = 0; i < n; i++) {
            if (rows[i].ratio > 0)
                printf("%-40s %14.2f %14.1f\n", rows[i].name, rows[i].ns, rows[i].ratio);
            else
                printf("%-40s %14.2f %14s\n", rows[i].name, rows[i].ns, "-");
        }
    }
    pkv_backend_destroy(cuda);
    pkv_seqset_destroy(set);
    pkv_pool_destroy(pool);
    return 0;
}

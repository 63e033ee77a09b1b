// SPDX-License-Identifier: MIT
// bench_alloc --calibrate FILE.json: measure what one backend allocation and
// one free cost on this machine at 4 KiB .. 256 MiB, fit the shape of the
// built-in cuda-boyer model to each (piecewise linear in size, one point per
// measured size, made non-decreasing), and write the pkv_alloc_model that
// `pkv-replay --alloc-model FILE.json` reads.
//
// Backends: the host backend always; the CUDA backend (cudaMalloc/cudaFree)
// when a GPU is present, which is then the one written unless --backend host.
// Each size is measured as an engine would use it: `live` buffers allocated
// one after the other and held (so an allocator cannot hand back the block it
// just took), then freed one by one; the median call of REPS rounds is kept.
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "pkv/pkv.h"

int alloc_calibrate_main(int argc, char **argv);

enum { REPS = 5, LIVE_MAX = 64 };

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

typedef struct point {
    size_t bytes;
    double alloc_s, free_s; // median seconds per call
} point;

// Median per-call seconds of alloc and free of `bytes`, `live` buffers at a time.
static int measure(pkv_backend *be, size_t bytes, int live, point *out) {
    double a[REPS], f[REPS];
    void *p[LIVE_MAX];
    for (int r = 0; r < REPS; r++) {
        double t0 = now_s();
        for (int i = 0; i < live; i++) {
            if (pkv_backend_alloc(be, bytes, &p[i]) != PKV_OK) {
                for (int j = 0; j < i; j++) pkv_backend_free(be, p[j], bytes);
                return -1;
            }
        }
        double t1 = now_s();
        for (int i = 0; i < live; i++) pkv_backend_free(be, p[i], bytes);
        double t2 = now_s();
        a[r] = (t1 - t0) / live;
        f[r] = (t2 - t1) / live;
    }
    qsort(a, REPS, sizeof a[0], cmp_double);
    qsort(f, REPS, sizeof f[0], cmp_double);
    out->bytes = bytes;
    out->alloc_s = a[REPS / 2];
    out->free_s = f[REPS / 2];
    return 0;
}

// The same shape as the built-in cuda-boyer model: piecewise linear in size
// through one point per measured size (pkv_alloc_call_cost.points). A call
// never gets cheaper with size, so the medians are made non-decreasing by
// isotonic regression (pool adjacent violators: a run of sizes whose medians
// decrease is replaced by their mean) before they become the points.
static void fit(const point *pt, int n, int use_free, pkv_alloc_call_cost *c) {
    double val[PKV_ALLOC_COST_MAX_POINTS];
    int len[PKV_ALLOC_COST_MAX_POINTS], blocks = 0;
    for (int i = 0; i < n && i < PKV_ALLOC_COST_MAX_POINTS; i++) {
        val[blocks] = use_free ? pt[i].free_s : pt[i].alloc_s;
        len[blocks++] = 1;
        while (blocks > 1 && val[blocks - 2] > val[blocks - 1]) { // merge the violators
            const int a = len[blocks - 2], b = len[blocks - 1];
            val[blocks - 2] = (val[blocks - 2] * a + val[blocks - 1] * b) / (a + b);
            len[blocks - 2] = a + b;
            blocks--;
        }
    }
    memset(c, 0, sizeof *c);
    int i = 0;
    for (int k = 0; k < blocks; k++)
        for (int j = 0; j < len[k]; j++, i++) {
            c->point_bytes[i] = pt[i].bytes;
            c->point_s[i] = val[k];
        }
    c->num_points = (uint32_t)i;
    c->sync = 1; // cudaFree synchronizes; a host call stalls the (CPU) step
}

static void cpu_model(char *buf, size_t cap) {
    snprintf(buf, cap, "unknown CPU");
    FILE *f = fopen("/proc/cpuinfo", "r");
    if (!f) return;
    char line[256];
    while (fgets(line, sizeof line, f)) {
        if (!strncmp(line, "model name", 10)) {
            char *c = strchr(line, ':');
            if (c) {
                c += 2;
                c[strcspn(c, "\n")] = '\0';
                snprintf(buf, cap, "%s", c);
            }
            break;
        }
    }
    fclose(f);
}

int alloc_calibrate_main(int argc, char **argv) {
    const char *path = NULL, *want = NULL;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--calibrate") && i + 1 < argc) {
            path = argv[++i];
        } else if (!strcmp(argv[i], "--backend") && i + 1 < argc) {
            want = argv[++i];
            if (strcmp(want, "host") && strcmp(want, "cuda")) {
                fprintf(stderr, "bench_alloc: --backend must be host or cuda, got '%s'\n", want);
                return 2;
            }
        } else {
            fprintf(stderr, "usage: bench_alloc --calibrate FILE.json [--backend host|cuda]\n"
                            "unknown or incomplete option '%s'\n", argv[i]);
            return 2;
        }
    }
    if (!path) {
        fprintf(stderr, "usage: bench_alloc --calibrate FILE.json [--backend host|cuda]\n");
        return 2;
    }
    pkv_backend *be = NULL;
    pkv_status st;
    int cuda = 0;
    if (!want || !strcmp(want, "cuda")) {
        st = pkv_backend_create_cuda(0, &be);
        if (st == PKV_OK) {
            cuda = 1;
        } else if (want) {
            fprintf(stderr, "bench_alloc: no CUDA backend: %s\n", pkv_status_str(st));
            return 1;
        }
    }
    if (!be && (st = pkv_backend_create_host(&be)) != PKV_OK) {
        fprintf(stderr, "bench_alloc: host backend: %s\n", pkv_status_str(st));
        return 1;
    }
    // 4 KiB .. 256 MiB: a token of a small model up to a whole 128K-token
    // sequence of Llama-3-8B shapes.
    static const size_t sizes[] = {4u << 10,  64u << 10, 512u << 10, 2u << 20,
                                   8u << 20,  32u << 20, 128u << 20, 256u << 20};
    enum { NS = sizeof sizes / sizeof sizes[0] };
    point pt[NS];
    int n = 0;
    printf("backend %s: median seconds per call, %d rounds\n", cuda ? "cuda" : "host", REPS);
    printf("%12s %12s %12s\n", "bytes", "alloc us", "free us");
    for (int i = 0; i < NS; i++) {
        const int live = sizes[i] >= (64u << 20) ? 4 : sizes[i] >= (8u << 20) ? 16 : LIVE_MAX;
        if (measure(be, sizes[i], live, &pt[n]) != 0) {
            printf("%12zu   (allocation failed; size skipped)\n", sizes[i]);
            continue;
        }
        printf("%12zu %12.2f %12.2f\n", pt[n].bytes, pt[n].alloc_s * 1e6, pt[n].free_s * 1e6);
        n++;
    }
    pkv_backend_destroy(be);
    if (n < 2) {
        fprintf(stderr, "bench_alloc: fewer than two sizes measured; no model written\n");
        return 1;
    }
    pkv_alloc_model m = pkv_alloc_model_none();
    char cpu[128], day[16];
    cpu_model(cpu, sizeof cpu);
    time_t now = time(NULL);
    strftime(day, sizeof day, "%Y-%m-%d", gmtime(&now));
    snprintf(m.name, sizeof m.name, "%.8s calibrated %s on %.60s", cuda ? "cuda" : "host", day,
             cuda ? "GPU 0" : cpu);
    fit(pt, n, 0, &m.alloc);
    fit(pt, n, 1, &m.free);
    FILE *f = fopen(path, "w");
    if (!f) {
        fprintf(stderr, "bench_alloc: cannot write %s\n", path);
        return 1;
    }
    // The model object, with the raw medians it was fitted to (the reader skips
    // them; "measured") written over its closing brace.
    pkv_alloc_model_write_json(f, &m);
    fseek(f, -1, SEEK_CUR);
    fprintf(f, ",\n \"backend\": \"%s\", \"host_cpu\": \"%s\", \"measured\": [",
            cuda ? "cuda" : "host", cpu);
    for (int i = 0; i < n; i++)
        fprintf(f, "%s\n  {\"bytes\": %zu, \"alloc_us\": %.4f, \"free_us\": %.4f}", i ? "," : "",
                pt[i].bytes, pt[i].alloc_s * 1e6, pt[i].free_s * 1e6);
    fputs("]}\n", f);
    if (fclose(f) != 0) {
        fprintf(stderr, "bench_alloc: cannot write %s\n", path);
        return 1;
    }
    printf("fit (piecewise, non-decreasing):\n%12s %12s %12s\n", "bytes", "alloc us", "free us");
    for (uint32_t i = 0; i < m.alloc.num_points; i++)
        printf("%12llu %12.2f %12.2f\n", (unsigned long long)m.alloc.point_bytes[i],
               m.alloc.point_s[i] * 1e6, m.free.point_s[i] * 1e6);
    printf("-> %s (pkv-replay --alloc-model %s)\n", path, path);
    return 0;
}

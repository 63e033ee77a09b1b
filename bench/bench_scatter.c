// SPDX-License-Identifier: MIT
// bench_scatter: what a paged KV layout costs the memory system alone, with no
// attention math. A buffer is read in runs of R bytes, once in address order and
// once in a shuffled order of the same runs (a paged cache's head runs are
// block_size x head_dim x element bytes: 4 KiB for fp16 at block 16 and head_dim
// 128, 2 KiB for 8-bit), each line software-prefetched one run ahead as the CPU
// attention does. Same bytes, same instructions; only the order of the runs
// differs. Sequential and shuffled reads alternate; per run size the table gives
// the best wall time of each, the median CPU time of all threads, and the
// shuffled/sequential ratios. Exit 0 ok, 1 runtime failure, 2 bad usage.
#if defined(__linux__)
#define _DEFAULT_SOURCE 1 // madvise(MADV_HUGEPAGE)
#include <sys/mman.h>
#endif
#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#ifdef _OPENMP
#include <omp.h>
#endif

#include "bench_clock.h"

#define MAX_RUNS 8
#define MAX_REPS 64

typedef struct opts {
    uint32_t runs[MAX_RUNS]; // run sizes, bytes (multiples of 64)
    uint32_t nruns;
    uint32_t mib;
    uint32_t threads;
    uint32_t reps;
} opts;

static void usage(FILE *f) {
    fprintf(f, "usage: bench_scatter [options]\n"
               "Read a buffer in runs, in order and shuffled, side by side.\n"
               "  --run LIST     run sizes in bytes, multiples of 64 (default 2048,4096,65536)\n"
               "  --mib N        buffer size (default 512)\n"
               "  --threads N    reader threads, each a share of the runs (default 2)\n"
               "  --reps N       alternating repetitions per run size (default 5, max 64)\n"
               "  --help         this text\n"
               "Exit: 0 ok, 1 runtime failure, 2 bad usage.\n");
}

static int parse_u32(const char *s, uint32_t *out) {
    if (s == NULL) {
        return -1;
    }
    char *end = NULL;
    errno = 0;
    unsigned long v = strtoul(s, &end, 10);
    if (errno != 0 || end == s || *end != '\0' || v == 0 || v > 0x7fffffffUL) {
        return -1;
    }
    *out = (uint32_t)v;
    return 0;
}

static int parse_args(int argc, char **argv, opts *o) {
    *o = (opts){{2048, 4096, 65536}, 3, 512, 2, 5};
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        const char *v = i + 1 < argc ? argv[i + 1] : NULL;
        int bad = 0;
        if (strcmp(a, "--help") == 0) {
            usage(stdout);
            return 1;
        } else if (strcmp(a, "--run") == 0 && v != NULL) {
            char buf[128];
            bad = strlen(v) >= sizeof buf;
            o->nruns = 0;
            if (!bad) {
                strcpy(buf, v);
                for (char *t = strtok(buf, ","); t && !bad; t = strtok(NULL, ",")) {
                    bad = o->nruns == MAX_RUNS || parse_u32(t, &o->runs[o->nruns]) != 0 ||
                          o->runs[o->nruns] % 64 != 0;
                    o->nruns++;
                }
            }
            bad = bad || o->nruns == 0;
        } else if (strcmp(a, "--mib") == 0) {
            bad = parse_u32(v, &o->mib) != 0 || o->mib > 16384;
        } else if (strcmp(a, "--threads") == 0) {
            bad = parse_u32(v, &o->threads) != 0 || o->threads > 256;
        } else if (strcmp(a, "--reps") == 0) {
            bad = parse_u32(v, &o->reps) != 0 || o->reps > MAX_REPS;
        } else {
            fprintf(stderr, "bench_scatter: unknown option or missing value: %s\n", a);
            return 2;
        }
        if (bad) {
            fprintf(stderr, "bench_scatter: bad value for %s: '%s'\n", a, v ? v : "");
            return 2;
        }
        i++;
    }
    return 0;
}

// Sum of the 64-bit words of runs order[0..n-1], each line prefetched one run
// ahead (spread over the current run's lines, as the attention row loops do).
static uint64_t read_runs(const char *buf, const uint32_t *order, size_t n, size_t run) {
    uint64_t acc[8] = {0, 0, 0, 0, 0, 0, 0, 0};
    for (size_t c = 0; c < n; c++) {
        const uint64_t *p = (const uint64_t *)(const void *)(buf + (size_t)order[c] * run);
        const char *next = c + 1 < n ? buf + (size_t)order[c + 1] * run : NULL;
        for (size_t i = 0; i < run / 8; i += 8) {
#if defined(__GNUC__)
            if (next != NULL) {
                __builtin_prefetch(next + i * 8, 0, 3);
            }
#endif
            for (size_t j = 0; j < 8; j++) {
                acc[j] += p[i + j];
            }
        }
    }
    return acc[0] + acc[1] + acc[2] + acc[3] + acc[4] + acc[5] + acc[6] + acc[7];
}

static volatile uint64_t sink;

// One pass over every run in `order`, split over threads; wall and CPU seconds.
static void pass(const char *buf, const uint32_t *order, size_t n, size_t run, int nt,
                 double *wall, double *cpu) {
    double u0 = cpu_now();
    double t0 = now();
    uint64_t s = 0;
#ifdef _OPENMP
#pragma omp parallel for num_threads(nt) schedule(static) reduction(+ : s)
#endif
    for (int t = 0; t < nt; t++) {
        size_t lo = n / (size_t)nt * (size_t)t;
        size_t hi = t == nt - 1 ? n : n / (size_t)nt * (size_t)(t + 1);
        s += read_runs(buf, order + lo, hi - lo, run);
    }
    *wall = now() - t0;
    *cpu = cpu_now() - u0;
    sink = s;
}

static int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a;
    double y = *(const double *)b;
    return (x > y) - (x < y);
}

int main(int argc, char **argv) {
    opts o;
    int pr = parse_args(argc, argv, &o);
    if (pr != 0) {
        if (pr == 2) {
            usage(stderr);
        }
        return pr == 1 ? 0 : 2;
    }
    int nt = 1;
#ifdef _OPENMP
    nt = (int)o.threads;
#endif
    const size_t bytes = (size_t)o.mib << 20;
    char *buf = NULL;
    if (posix_memalign((void **)&buf, 2u << 20, bytes) != 0) {
        fprintf(stderr, "bench_scatter: out of memory (%u MiB)\n", o.mib);
        return 1;
    }
#if defined(__linux__) && defined(MADV_HUGEPAGE)
    (void)madvise(buf, bytes, MADV_HUGEPAGE); // as bench_attention's caches
#endif
    memset(buf, 1, bytes);
    printf("bench_scatter: %u MiB, %d threads, %u alternating reps; best wall time, median "
           "CPU time\n",
           o.mib, nt, o.reps);
    printf("%8s %10s %10s %7s %10s %10s %7s\n", "run_B", "seq_GBs", "shuf_GBs", "wall_x",
           "seq_cpu_ms", "shuf_cpu_ms", "cpu_x");
    uint64_t rng = 88172645463325252ull;
    for (uint32_t ri = 0; ri < o.nruns; ri++) {
        const size_t run = o.runs[ri];
        const size_t n = bytes / run;
        uint32_t *seq = malloc(n * sizeof *seq);
        uint32_t *shuf = malloc(n * sizeof *shuf);
        if (seq == NULL || shuf == NULL || n == 0) {
            fprintf(stderr, "bench_scatter: run %zu: out of memory or larger than the buffer\n",
                    run);
            free(seq);
            free(shuf);
            free(buf);
            return 1;
        }
        for (size_t i = 0; i < n; i++) {
            seq[i] = shuf[i] = (uint32_t)i;
        }
        for (size_t i = n; i > 1; i--) { // xorshift64 Fisher-Yates, as bench_attention
            rng ^= rng << 13;
            rng ^= rng >> 7;
            rng ^= rng << 17;
            size_t j = (size_t)(rng % i);
            uint32_t t = shuf[i - 1];
            shuf[i - 1] = shuf[j];
            shuf[j] = t;
        }
        double ws[MAX_REPS], wr[MAX_REPS], us[MAX_REPS], ur[MAX_REPS];
        double w, u;
        pass(buf, seq, n, run, nt, &w, &u); // warm-up
        for (uint32_t r = 0; r < o.reps; r++) {
            pass(buf, seq, n, run, nt, &ws[r], &us[r]);
            pass(buf, shuf, n, run, nt, &wr[r], &ur[r]);
        }
        qsort(ws, o.reps, sizeof(double), cmp_double);
        qsort(wr, o.reps, sizeof(double), cmp_double);
        qsort(us, o.reps, sizeof(double), cmp_double);
        qsort(ur, o.reps, sizeof(double), cmp_double);
        const double us_med = us[o.reps / 2];
        const double ur_med = ur[o.reps / 2];
        printf("%8zu %10.2f %10.2f %7.3f %10.1f %10.1f %7.3f\n", run, (double)bytes / ws[0] / 1e9,
               (double)bytes / wr[0] / 1e9, wr[0] / ws[0], us_med * 1e3, ur_med * 1e3,
               ur_med / us_med);
        free(seq);
        free(shuf);
    }
    free(buf);
    return 0;
}

// SPDX-License-Identifier: MIT
// bench_attention: decode attention over a paged cache (block table, shuffled
// blocks) and over a contiguous cache holding the same K/V, timed side by side in
// one run, with the achieved K/V bandwidth as a fraction of a large copy measured
// in the same run (memcpy on the CPU with the same thread count, device-to-device
// cudaMemcpy on the GPU). Prints a table, or JSON with --json. The 8-bit KV
// dtypes (int8 with per-token fp32 scales beside the data, fp8_e4m3 / e5m2) run the
// *_quant_cpu (--gpu: *_quant_cuda_ex) calls with q and out in fp16, so they compare
// with the fp16 rows.
#if defined(__linux__)
#define _DEFAULT_SOURCE 1 // madvise(MADV_HUGEPAGE)
#include <sys/mman.h>
#endif
#include <errno.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>
#ifdef _OPENMP
#include <omp.h>
#endif

#include "pkv/attention.h"
#include "pkv_config.h"
#include "src/attention/half.h"
#include "bench_clock.h"
#if PKV_HAVE_CUDA
#include <cuda_runtime_api.h>
#endif

#define MAX_LIST 16

typedef struct opts {
    uint32_t batches[MAX_LIST];
    uint32_t nbatch;
    uint32_t contexts[MAX_LIST];
    uint32_t nctx;
    pkv_dtype dtypes[6];
    uint32_t ndtype;
    uint32_t heads;
    uint32_t kv_heads;
    uint32_t dim;
    uint32_t block;
    uint32_t threads;
    uint64_t max_bytes; // skip grid points whose K/V (per layout) exceed this
    double min_time;    // seconds of timed calls per point and layout
    int json;
    const char *json_out; // also write the JSON here (same run as the table)
    int gpu;
} opts;

static void usage(FILE *f) {
    fprintf(f,
            "usage: bench_attention [options]\n"
            "Decode attention, paged vs contiguous, with bandwidth vs a large copy.\n"
            "  --batch LIST      batch sizes, comma separated (default 1,4,16,64)\n"
            "  --context LIST    context lengths (default 128,512,1024,2048,4096,8192)\n"
            "  --dtype LIST      fp16,bf16,fp32,int8,fp8_e4m3,fp8_e5m2 (default fp16,bf16;\n"
            "                    the 8-bit ones with q and out in fp16)\n"
            "  --heads N         query heads (default 32)\n"
            "  --kv-heads N      K/V heads (default = heads, i.e. MHA)\n"
            "  --head-dim N      (default 128)\n"
            "  --block N         tokens per block (default 16)\n"
            "  --threads N       CPU threads (default 0 = all cores)\n"
            "  --max-mib N       skip points with more K/V than this per layout (default 1024)\n"
            "  --min-time S      seconds of timed calls per point and layout (default 0.3)\n"
            "  --quick           batch 1,16; context 128,1024,4096; min-time 0.05\n"
            "  --gpu             time the CUDA kernels instead (needs a CUDA build and device)\n"
            "  --json            one JSON object on stdout instead of the table\n"
            "  --json-out FILE   also write that JSON object to FILE (same run as the table)\n"
            "  --help            this text\n"
            "Exit: 0 ok, 1 runtime failure, 2 bad usage.\n");
}

static int parse_u32(const char *s, uint32_t *out) {
    char *end = NULL;
    errno = 0;
    unsigned long v = strtoul(s, &end, 10);
    if (errno != 0 || end == s || *end != '\0' || v == 0 || v > 0x7fffffffUL) {
        return -1;
    }
    *out = (uint32_t)v;
    return 0;
}

static int parse_list(const char *s, uint32_t *out, uint32_t *n) {
    char buf[256];
    if (strlen(s) >= sizeof buf) {
        return -1;
    }
    strcpy(buf, s);
    *n = 0;
    for (char *tok = strtok(buf, ","); tok; tok = strtok(NULL, ",")) {
        if (*n == MAX_LIST || parse_u32(tok, &out[*n]) != 0) {
            return -1;
        }
        (*n)++;
    }
    return *n ? 0 : -1;
}

static int parse_dtypes(const char *s, opts *o) {
    char buf[64];
    if (strlen(s) >= sizeof buf) {
        return -1;
    }
    strcpy(buf, s);
    o->ndtype = 0;
    for (char *tok = strtok(buf, ","); tok; tok = strtok(NULL, ",")) {
        pkv_dtype d;
        if (pkv_dtype_from_name(tok, &d) != PKV_OK) {
            return -1;
        }
        if (o->ndtype == 6) {
            return -1;
        }
        o->dtypes[o->ndtype++] = d;
    }
    return o->ndtype ? 0 : -1;
}

// Returns 0 ok, 1 help printed, 2 bad usage (message printed).
static int parse_args(int argc, char **argv, opts *o) {
    const uint32_t b[4] = {1, 4, 16, 64};
    const uint32_t c[6] = {128, 512, 1024, 2048, 4096, 8192};
    memset(o, 0, sizeof *o);
    memcpy(o->batches, b, sizeof b);
    o->nbatch = 4;
    memcpy(o->contexts, c, sizeof c);
    o->nctx = 6;
    o->dtypes[0] = PKV_DTYPE_F16;
    o->dtypes[1] = PKV_DTYPE_BF16;
    o->ndtype = 2;
    o->heads = 32;
    o->dim = 128;
    o->block = 16;
    o->max_bytes = 1024ull << 20;
    o->min_time = 0.3;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        const char *v = i + 1 < argc ? argv[i + 1] : NULL;
        uint32_t x = 0;
        int bad = 0;
        if (strcmp(a, "--help") == 0 || strcmp(a, "-h") == 0) {
            usage(stdout);
            return 1;
        } else if (strcmp(a, "--json") == 0) {
            o->json = 1;
        } else if (strcmp(a, "--gpu") == 0) {
            o->gpu = 1;
        } else if (strcmp(a, "--quick") == 0) {
            const uint32_t qb[2] = {1, 16};
            const uint32_t qc[3] = {128, 1024, 4096};
            memcpy(o->batches, qb, sizeof qb);
            o->nbatch = 2;
            memcpy(o->contexts, qc, sizeof qc);
            o->nctx = 3;
            o->min_time = 0.05;
        } else if (v == NULL) {
            fprintf(stderr, "bench_attention: unknown option or missing value: %s\n", a);
            return 2;
        } else {
            i++;
            if (strcmp(a, "--batch") == 0) {
                bad = parse_list(v, o->batches, &o->nbatch);
            } else if (strcmp(a, "--context") == 0) {
                bad = parse_list(v, o->contexts, &o->nctx);
            } else if (strcmp(a, "--dtype") == 0) {
                bad = parse_dtypes(v, o);
            } else if (strcmp(a, "--heads") == 0) {
                bad = parse_u32(v, &o->heads);
            } else if (strcmp(a, "--kv-heads") == 0) {
                bad = parse_u32(v, &o->kv_heads);
            } else if (strcmp(a, "--head-dim") == 0) {
                bad = parse_u32(v, &o->dim);
            } else if (strcmp(a, "--block") == 0) {
                bad = parse_u32(v, &o->block);
            } else if (strcmp(a, "--threads") == 0) {
                bad = parse_u32(v, &o->threads);
            } else if (strcmp(a, "--max-mib") == 0) {
                bad = parse_u32(v, &x);
                o->max_bytes = (uint64_t)x << 20;
            } else if (strcmp(a, "--json-out") == 0) {
                o->json_out = v;
            } else if (strcmp(a, "--min-time") == 0) {
                char *end = NULL;
                o->min_time = strtod(v, &end);
                bad = (end == v || *end != '\0' || !(o->min_time > 0 && o->min_time < 100));
            } else {
                fprintf(stderr, "bench_attention: unknown option: %s\n", a);
                return 2;
            }
            if (bad) {
                fprintf(stderr, "bench_attention: bad value for %s: '%s'\n", a, v);
                return 2;
            }
        }
    }
    if (o->kv_heads == 0) {
        o->kv_heads = o->heads;
    }
    if (o->heads % o->kv_heads != 0) {
        fprintf(stderr, "bench_attention: --kv-heads %u does not divide --heads %u\n",
                o->kv_heads, o->heads);
        return 2;
    }
    return 0;
}

static uint64_t rng = 88172645463325252ull;

static float rand_unit(void) { // xorshift64 -> [-1, 1)
    rng ^= rng << 13;
    rng ^= rng >> 7;
    rng ^= rng << 17;
    return (float)(rng >> 40) * (2.0f / 16777216.0f) - 1.0f;
}

// Values like real activations ([-1, 1), no subnormals, no NaN). Timing does not
// depend on the values, so a random 8 MiB pattern is repeated over large buffers.
static void fill(pkv_dtype dt, void *p, size_t bytes) {
    const size_t pattern = bytes < (8u << 20) ? bytes : (8u << 20);
    if (pkv_dtype_is_quantized(dt)) {
        uint8_t *b = (uint8_t *)p;
        for (size_t i = 0; i < pattern; i++) {
            // int8 values, or fp8 codes below the top exponent (no NaN / inf).
            b[i] = (uint8_t)((uint32_t)(int32_t)(rand_unit() * 127.0f) &
                             (dt == PKV_DTYPE_INT8 ? 0xffu : 0xb7u));
        }
    } else if (dt == PKV_DTYPE_F32) {
        float *f = (float *)p;
        for (size_t i = 0; i < pattern / 4; i++) {
            f[i] = rand_unit();
        }
    } else {
        uint16_t *h = (uint16_t *)p;
        for (size_t i = 0; i < pattern / 2; i++) {
            float x = rand_unit();
            h[i] = dt == PKV_DTYPE_F16 ? pkvi_f32_to_f16(x) : pkvi_f32_to_bf16(x);
        }
    }
    for (size_t off = pattern; off < bytes; off += pattern) {
        memcpy((char *)p + off, p, bytes - off < pattern ? bytes - off : pattern);
    }
}

// One grid point's buffers, host or device.
typedef struct point {
    size_t kv_bytes; // K + V bytes of the context, one layout
    double t_paged;  // seconds per call (median)
    double t_contig;
} point;

static int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a;
    double y = *(const double *)b;
    return (x > y) - (x < y);
}

typedef struct result {
    pkv_dtype dt;
    uint32_t batch, ctx;
    double tp, tc;     // seconds, best of the timed calls
    double mp, mc;     // seconds, medians
    double cp, cc;     // CPU seconds of all threads per call (cpu_now), medians
    double kv_bytes;   // K + V bytes read per call
    int skipped;
} result;

#define MAX_SAMPLES 4096

// Alternate paged and contiguous calls until each has run min_time. Reports the
// best (minimum) time of each, the figure least disturbed by other processes on a
// shared machine, the medians, and the median CPU time of the calls: on a machine
// whose cores are shared with other work, a call's wall time includes the time its
// threads waited for a core, while its CPU time counts only the cycles they ran
// (memory stalls included), so the CPU-time ratio is the one that other load
// moves least.
typedef pkv_status (*call_fn)(void *ctx, int paged);

static double median_of(double *x, int n) {
    qsort(x, (size_t)n, sizeof(double), cmp_double);
    return x[n / 2];
}

static int time_pair(call_fn fn, void *ctx, double min_time, result *r) {
    static double sp[MAX_SAMPLES];
    static double sc[MAX_SAMPLES];
    static double up[MAX_SAMPLES];
    static double uc[MAX_SAMPLES];
    if (fn(ctx, 1) != PKV_OK || fn(ctx, 0) != PKV_OK) { // warm-up
        return -1;
    }
    double total_p = 0;
    double total_c = 0;
    int n = 0;
    while (n < MAX_SAMPLES && (n < 3 || total_p < min_time || total_c < min_time)) {
        double u0 = cpu_now();
        double t0 = now();
        pkv_status a = fn(ctx, 1);
        double t1 = now();
        double u1 = cpu_now();
        pkv_status b = fn(ctx, 0);
        double t2 = now();
        double u2 = cpu_now();
        if (a != PKV_OK || b != PKV_OK) {
            return -1;
        }
        sp[n] = t1 - t0;
        sc[n] = t2 - t1;
        up[n] = u1 - u0;
        uc[n] = u2 - u1;
        total_p += sp[n];
        total_c += sc[n];
        n++;
    }
    r->mp = median_of(sp, n);
    r->mc = median_of(sc, n);
    r->tp = sp[0];
    r->tc = sc[0];
    r->cp = median_of(up, n);
    r->cc = median_of(uc, n);
    return 0;
}

typedef struct cpu_ctx {
    pkv_attn_shape sh;
    const pkv_attn_kv_quant *qz; // 8-bit cache, or NULL
    uint32_t batch;
    const void *q;
    void *out;
    pkv_attn_paged_kv pkv;
    pkv_attn_contig_kv ckv;
} cpu_ctx;

static pkv_status cpu_call(void *p, int paged) {
    cpu_ctx *c = (cpu_ctx *)p;
    if (c->qz != NULL) {
        return paged ? pkv_attn_decode_paged_quant_cpu(&c->sh, c->qz, c->batch, c->q, &c->pkv, c->out)
                     : pkv_attn_decode_contig_quant_cpu(&c->sh, c->qz, c->batch, c->q, &c->ckv,
                                                        c->out);
    }
    return paged ? pkv_attn_decode_paged_cpu(&c->sh, c->batch, c->q, &c->pkv, c->out)
                 : pkv_attn_decode_contig_cpu(&c->sh, c->batch, c->q, &c->ckv, c->out);
}

// 8-bit caches: ctx is {paged context, contiguous context} (their scale offsets
// differ: per block vs per sequence).
static pkv_status cpu_call_q8(void *p, int paged) {
    cpu_ctx **c = (cpu_ctx **)p;
    return cpu_call(c[paged ? 0 : 1], paged);
}

// Cache buffers: 2 MiB aligned and, on Linux, backed by transparent huge pages
// when the system allows it (as a real KV arena would be): both layouts get the
// same treatment, so TLB misses of scattered blocks are not what is measured.
static void *alloc_big(size_t bytes) {
    void *p = NULL;
    if (posix_memalign(&p, 2u << 20, bytes ? bytes : 1) != 0) {
        return NULL;
    }
#if defined(__linux__) && defined(MADV_HUGEPAGE)
    (void)madvise(p, bytes, MADV_HUGEPAGE);
#endif
    return p;
}

// Multi-threaded memcpy of `bytes`, same thread count as the kernels; returns
// bytes moved (read + written) per second, best of several runs.
static double cpu_copy_bw(size_t bytes, uint32_t threads) {
    char *a = alloc_big(bytes);
    char *b = alloc_big(bytes);
    if (!a || !b) {
        free(a);
        free(b);
        return 0;
    }
    memset(a, 1, bytes);
    memset(b, 2, bytes);
    int nt = 1;
#ifdef _OPENMP
    nt = threads ? (int)threads : omp_get_max_threads();
#endif
    (void)threads;
    double best = 1e30;
    for (int r = 0; r < 5; r++) {
        double t0 = now();
#ifdef _OPENMP
#pragma omp parallel for num_threads(nt) schedule(static)
#endif
        for (int i = 0; i < nt; i++) {
            size_t lo = bytes / (size_t)nt * (size_t)i;
            size_t hi = i == nt - 1 ? bytes : bytes / (size_t)nt * (size_t)(i + 1);
            memcpy(b + lo, a + lo, hi - lo);
        }
        double t = now() - t0;
        best = t < best ? t : best;
    }
    volatile char sink = b[bytes / 2];
    (void)sink;
    free(a);
    free(b);
    return 2.0 * (double)bytes / best;
}

static void shuffle(int32_t *a, uint32_t n) {
    for (uint32_t i = n; i > 1; i--) {
        rng ^= rng << 13;
        rng ^= rng >> 7;
        rng ^= rng << 17;
        uint32_t j = (uint32_t)(rng % i);
        int32_t t = a[i - 1];
        a[i - 1] = a[j];
        a[j] = t;
    }
}

// Host-side inputs of one point: shuffled table, both layouts with the same data.
typedef struct host_data {
    int32_t *table;
    int32_t *lens;
    void *pk, *pv, *ck, *cv, *q, *out;
    uint32_t nblocks, max_blocks;
    size_t bytes; // one of the four caches
    size_t scale_bytes; // int8: 4 (see scale_bytes), else 0
} host_data;

static void free_host(host_data *h) {
    free(h->table);
    free(h->lens);
    free(h->pk);
    free(h->pv);
    free(h->ck);
    free(h->cv);
    free(h->q);
    free(h->out);
    memset(h, 0, sizeof *h);
}

// Bytes of the int8 scales per token and kv head (after the data of each paged
// block, and of each contiguous sequence): 4 for int8, else 0.
static size_t scale_bytes(pkv_dtype dt) { return dt == PKV_DTYPE_INT8 ? sizeof(float) : 0; }

// Set every int8 scale of n_units units (blocks or sequences) of unit_bytes, whose
// scales start scale_off bytes into the unit, to a typical 1/127.
static void fill_scales(void *base, size_t n_units, size_t unit_bytes, size_t scale_off,
                        size_t n_scales) {
    const float s = 1.0f / 127.0f;
    for (size_t u = 0; u < n_units; u++) {
        for (size_t i = 0; i < n_scales; i++) {
            memcpy((char *)base + u * unit_bytes + scale_off + i * sizeof s, &s, sizeof s);
        }
    }
}

static int make_host(const opts *o, pkv_dtype dt, uint32_t batch, uint32_t ctx, host_data *h) {
    size_t es = pkv_dtype_size(dt);
    const size_t sb = scale_bytes(dt);
    memset(h, 0, sizeof *h);
    h->max_blocks = (ctx + o->block - 1) / o->block;
    h->nblocks = batch * h->max_blocks;
    h->table = malloc((size_t)h->nblocks * sizeof(int32_t));
    h->lens = malloc(batch * sizeof(int32_t));
    h->scale_bytes = sb;
    size_t row = (size_t)o->dim * es;
    // Data plus int8 scales: nblocks x block == batch x cap tokens either way.
    h->bytes = (size_t)h->nblocks * o->block * o->kv_heads * (row + sb);
    h->pk = alloc_big(h->bytes);
    h->pv = alloc_big(h->bytes);
    h->ck = alloc_big(h->bytes);
    h->cv = alloc_big(h->bytes);
    // q and out: fp16 for the 8-bit caches.
    const pkv_dtype qdt = pkv_dtype_is_quantized(dt) ? PKV_DTYPE_F16 : dt;
    size_t qbytes = (size_t)batch * o->heads * o->dim * pkv_dtype_size(qdt);
    h->q = malloc(qbytes);
    h->out = malloc(qbytes);
    if (!h->table || !h->lens || !h->pk || !h->pv || !h->ck || !h->cv || !h->q || !h->out) {
        free_host(h);
        return -1;
    }
    for (uint32_t i = 0; i < h->nblocks; i++) {
        h->table[i] = (int32_t)i;
    }
    shuffle(h->table, h->nblocks); // physical blocks scattered as after many requests
    for (uint32_t s = 0; s < batch; s++) {
        h->lens[s] = (int32_t)ctx;
    }
    fill(dt, h->ck, h->bytes);
    fill(dt, h->cv, h->bytes);
    fill(qdt, h->q, qbytes);
    // Paged copy of the contiguous data: HND blocks [kv_heads][block][dim] (int8:
    // then the block's scales; contiguous: a sequence's scales after its data).
    uint32_t cap = h->max_blocks * o->block;
    const size_t blk_bytes = (size_t)o->kv_heads * o->block * (row + sb);
    const size_t seq_bytes = (size_t)o->kv_heads * cap * (row + sb);
    for (uint32_t s = 0; s < batch; s++) {
        for (uint32_t kh = 0; kh < o->kv_heads; kh++) {
            for (uint32_t b = 0; b < h->max_blocks; b++) {
                size_t phys = (size_t)h->table[s * h->max_blocks + b];
                size_t dst = phys * blk_bytes + (size_t)kh * o->block * row;
                size_t src = (size_t)s * seq_bytes + ((size_t)kh * cap + (size_t)b * o->block) * row;
                memcpy((char *)h->pk + dst, (char *)h->ck + src, o->block * row);
                memcpy((char *)h->pv + dst, (char *)h->cv + src, o->block * row);
            }
        }
    }
    if (sb) {
        fill_scales(h->pk, h->nblocks, blk_bytes, (size_t)o->kv_heads * o->block * row,
                    (size_t)o->kv_heads * o->block);
        fill_scales(h->pv, h->nblocks, blk_bytes, (size_t)o->kv_heads * o->block * row,
                    (size_t)o->kv_heads * o->block);
        fill_scales(h->ck, batch, seq_bytes, (size_t)o->kv_heads * cap * row,
                    (size_t)o->kv_heads * cap);
        fill_scales(h->cv, batch, seq_bytes, (size_t)o->kv_heads * cap * row,
                    (size_t)o->kv_heads * cap);
    }
    return 0;
}

static void set_descs(const opts *o, uint32_t batch, const host_data *h, const void *pk,
                      const void *pv, const void *ck, const void *cv, const int32_t *table,
                      const int32_t *lens, pkv_attn_paged_kv *pkv, pkv_attn_contig_kv *ckv) {
    uint32_t cap = h->max_blocks * o->block;
    // Element strides; for the 8-bit dtypes an element is a byte and int8's
    // scales (4 bytes per token and head) widen the block and the sequence.
    const uint64_t sb = h->scale_bytes;
    *pkv = (pkv_attn_paged_kv){pk,
                               pv,
                               (uint64_t)o->kv_heads * o->block * (o->dim + sb),
                               (uint64_t)o->block * o->dim,
                               o->dim,
                               o->block,
                               h->nblocks,
                               table,
                               h->max_blocks,
                               lens};
    *ckv = (pkv_attn_contig_kv){ck, cv, (uint64_t)o->kv_heads * cap * (o->dim + sb),
                                (uint64_t)cap * o->dim, o->dim, cap, lens, NULL};
    (void)batch;
}

#if PKV_HAVE_CUDA
typedef struct gpu_ctx {
    pkv_attn_shape sh;
    uint32_t batch;
    const void *q;
    void *out;
    pkv_attn_paged_kv pkv;
    pkv_attn_contig_kv ckv;
    pkv_attn_cuda_opts co;
    const pkv_attn_kv_quant *qz;  // 8-bit cache (paged scale geometry), or NULL
    const pkv_attn_kv_quant *cqz; // its contiguous scale geometry
} gpu_ctx;

// One timed call: launch and wait, so that host timers bracket the kernel(s).
static pkv_status gpu_call(void *p, int paged) {
    gpu_ctx *c = (gpu_ctx *)p;
    pkv_status st;
    if (c->qz != NULL) {
        st = paged ? pkv_attn_decode_paged_quant_cuda_ex(&c->sh, c->qz, c->batch, c->q, &c->pkv,
                                                         c->out, &c->co, NULL)
                   : pkv_attn_decode_contig_quant_cuda_ex(&c->sh, c->cqz, c->batch, c->q,
                                                          &c->ckv, c->out, &c->co, NULL);
    } else {
        st = paged ? pkv_attn_decode_paged_cuda_ex(&c->sh, c->batch, c->q, &c->pkv, c->out,
                                                   &c->co, NULL)
                   : pkv_attn_decode_contig_cuda_ex(&c->sh, c->batch, c->q, &c->ckv, c->out,
                                                    &c->co, NULL);
    }
    if (st == PKV_OK && cudaDeviceSynchronize() != cudaSuccess) {
        st = PKV_ERR_BACKEND;
    }
    return st;
}

static double gpu_copy_bw(size_t bytes) {
    void *a = NULL;
    void *b = NULL;
    if (cudaMalloc(&a, bytes) != cudaSuccess || cudaMalloc(&b, bytes) != cudaSuccess) {
        cudaFree(a);
        return 0;
    }
    cudaMemset(a, 1, bytes);
    cudaEvent_t e0, e1;
    cudaEventCreate(&e0);
    cudaEventCreate(&e1);
    float best = 1e30f;
    for (int r = 0; r < 10; r++) {
        cudaEventRecord(e0, NULL);
        cudaMemcpy(b, a, bytes, cudaMemcpyDeviceToDevice);
        cudaEventRecord(e1, NULL);
        cudaEventSynchronize(e1);
        float ms = 0;
        cudaEventElapsedTime(&ms, e0, e1);
        best = ms < best ? ms : best;
    }
    cudaEventDestroy(e0);
    cudaEventDestroy(e1);
    cudaFree(a);
    cudaFree(b);
    return 2.0 * (double)bytes / (best * 1e-3);
}

static void *up(const void *h, size_t bytes) {
    void *d = NULL;
    if (cudaMalloc(&d, bytes) != cudaSuccess) {
        return NULL;
    }
    if (cudaMemcpy(d, h, bytes, cudaMemcpyHostToDevice) != cudaSuccess) {
        cudaFree(d);
        return NULL;
    }
    return d;
}

static int run_gpu_point(const opts *o, const host_data *h, pkv_dtype dt, uint32_t batch,
                         result *r, uint32_t *splits) {
    gpu_ctx c;
    memset(&c, 0, sizeof c);
    // 8-bit caches: q and out in fp16, the scale geometry of the CPU rows (main).
    const int q8 = pkv_dtype_is_quantized(dt);
    const pkv_dtype qdt = q8 ? PKV_DTYPE_F16 : dt;
    const uint32_t cap = h->max_blocks * o->block;
    const pkv_attn_kv_quant qz = {dt, 0.01f, 0.01f, (uint64_t)o->kv_heads * o->block * o->dim,
                                  o->block, 1};
    const pkv_attn_kv_quant cqz = {dt, 0.01f, 0.01f, (uint64_t)o->kv_heads * cap * o->dim, cap,
                                   1};
    c.qz = q8 ? &qz : NULL;
    c.cqz = q8 ? &cqz : NULL;
    c.sh = (pkv_attn_shape){o->heads, o->kv_heads, o->dim, qdt,
                            (float)(1.0 / sqrt((double)o->dim)), 0};
    c.batch = batch;
    size_t qbytes = (size_t)batch * o->heads * o->dim * pkv_dtype_size(qdt);
    void *pk = up(h->pk, h->bytes), *pv = up(h->pv, h->bytes);
    void *ck = up(h->ck, h->bytes), *cv = up(h->cv, h->bytes);
    void *tab = up(h->table, (size_t)h->nblocks * sizeof(int32_t));
    void *lens = up(h->lens, batch * sizeof(int32_t));
    void *dq = up(h->q, qbytes);
    void *dout = up(h->out, qbytes);
    int dev = 0;
    int sms = 0;
    cudaGetDevice(&dev);
    cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev);
    uint32_t ns = 1;
    size_t wsb = 0;
    void *ws = NULL;
    pkv_attn_cuda_num_splits(&c.sh, batch, h->max_blocks * o->block, (uint32_t)sms, &ns);
    pkv_attn_cuda_workspace_bytes(&c.sh, batch, ns, &wsb);
    if (wsb && cudaMalloc(&ws, wsb) != cudaSuccess) {
        ws = NULL;
    }
    int rc = -1;
    if (pk && pv && ck && cv && tab && lens && dq && dout && (wsb == 0 || ws)) {
        c.q = dq;
        c.out = dout;
        set_descs(o, batch, h, pk, pv, ck, cv, tab, lens, &c.pkv, &c.ckv);
        c.co = (pkv_attn_cuda_opts){ws, wsb, 0, (uint32_t)sms, 0};
        rc = time_pair(gpu_call, &c, o->min_time, r);
    }
    *splits = ns;
    cudaFree(pk);
    cudaFree(pv);
    cudaFree(ck);
    cudaFree(cv);
    cudaFree(tab);
    cudaFree(lens);
    cudaFree(dq);
    cudaFree(dout);
    cudaFree(ws);
    return rc;
}
#endif

static void print_json(FILE *f, const opts *op, const char *mode, int nt, double copy_bw,
                       const result *res, const uint32_t *splits, uint32_t nres) {
    const opts o = *op;
    fprintf(f, "{\"bench\":\"attention\",\"mode\":\"%s\",\"threads\":%d,\"heads\":%u,"
           "\"kv_heads\":%u,\"head_dim\":%u,\"block\":%u,\"copy_bandwidth_gbs\":%.3f,"
           "\"points\":[",
           mode, o.gpu ? 0 : nt, o.heads, o.kv_heads, o.dim, o.block, copy_bw / 1e9);
    int first = 1;
    for (uint32_t i = 0; i < nres; i++) {
        const result *r = &res[i];
        if (r->skipped) {
            continue;
        }
        fprintf(f, "%s{\"dtype\":\"%s\",\"batch\":%u,\"context\":%u,\"kv_bytes\":%.0f,"
               "\"paged_us\":%.3f,\"contig_us\":%.3f,\"paged_median_us\":%.3f,"
               "\"contig_median_us\":%.3f,\"ratio\":%.4f,\"paged_gbs\":%.3f,"
               "\"contig_gbs\":%.3f,\"paged_frac_copy\":%.4f,\"contig_frac_copy\":%.4f,"
               "\"splits\":%u",
               first ? "" : ",", pkv_dtype_name(r->dt), r->batch, r->ctx, r->kv_bytes,
               r->tp * 1e6, r->tc * 1e6, r->mp * 1e6, r->mc * 1e6, r->tp / r->tc,
               r->kv_bytes / r->tp / 1e9,
               r->kv_bytes / r->tc / 1e9, r->kv_bytes / r->tp / copy_bw,
               r->kv_bytes / r->tc / copy_bw, splits[i]);
        if (!o.gpu) { // the host threads' CPU time is the kernel's only on the CPU
            fprintf(f, ",\"paged_cpu_us\":%.3f,\"contig_cpu_us\":%.3f,\"cpu_ratio\":%.4f",
                    r->cp * 1e6, r->cc * 1e6, r->cp / r->cc);
        }
        fprintf(f, "}");
        first = 0;
    }
    fprintf(f, "]}\n");
}

int main(int argc, char **argv) {
    opts o;
    int pr = parse_args(argc, argv, &o);
    if (pr == 1) {
        return 0;
    }
    if (pr != 0) {
        usage(stderr);
        return 2;
    }
    if (o.gpu) {
#if PKV_HAVE_CUDA
        int n = 0;
        if (cudaGetDeviceCount(&n) != cudaSuccess || n == 0) {
            fprintf(stderr, "bench_attention: --gpu: no CUDA device\n");
            return 1;
        }
#else
        fprintf(stderr, "bench_attention: --gpu: this build has no CUDA\n");
        return 1;
#endif
    }
    const int progress = isatty(STDERR_FILENO);
    double copy_bw = 0;
    size_t copy_bytes = 256u << 20;
#if PKV_HAVE_CUDA
    if (o.gpu) {
        copy_bytes = 1024u << 20;
        copy_bw = gpu_copy_bw(copy_bytes);
    } else
#endif
    {
        copy_bw = cpu_copy_bw(copy_bytes, o.threads);
    }
    if (copy_bw <= 0) {
        fprintf(stderr, "bench_attention: copy bandwidth measurement failed\n");
        return 1;
    }
    int nt = 1;
#ifdef _OPENMP
    nt = o.threads ? (int)o.threads : omp_get_max_threads();
#endif
    result res[3 * MAX_LIST * MAX_LIST];
    uint32_t splits[3 * MAX_LIST * MAX_LIST];
    uint32_t nres = 0;
    for (uint32_t di = 0; di < o.ndtype; di++) {
        for (uint32_t bi = 0; bi < o.nbatch; bi++) {
            for (uint32_t ci = 0; ci < o.nctx; ci++) {
                result *r = &res[nres];
                memset(r, 0, sizeof *r);
                r->dt = o.dtypes[di];
                r->batch = o.batches[bi];
                r->ctx = o.contexts[ci];
                splits[nres] = 1;
                size_t es = pkv_dtype_size(r->dt);
                r->kv_bytes = 2.0 * r->batch * (double)r->ctx * o.kv_heads *
                              ((double)o.dim * (double)es + (double)scale_bytes(r->dt));
                nres++;
                if (r->kv_bytes > (double)o.max_bytes) {
                    r->skipped = 1;
                    continue;
                }
                if (progress) {
                    fprintf(stderr, "\r%s batch %u context %u ...      ", pkv_dtype_name(r->dt),
                            r->batch, r->ctx);
                }
                host_data h;
                if (make_host(&o, r->dt, r->batch, r->ctx, &h) != 0) {
                    fprintf(stderr, "bench_attention: out of host memory at batch %u ctx %u\n",
                            r->batch, r->ctx);
                    return 1;
                }
                int rc;
#if PKV_HAVE_CUDA
                if (o.gpu) {
                    rc = run_gpu_point(&o, &h, r->dt, r->batch, r, &splits[nres - 1]);
                } else
#endif
                {
                    cpu_ctx c;
                    const int q8 = pkv_dtype_is_quantized(r->dt);
                    c.sh = (pkv_attn_shape){o.heads, o.kv_heads, o.dim,
                                            q8 ? PKV_DTYPE_F16 : r->dt,
                                            (float)(1.0 / sqrt((double)o.dim)), o.threads};
                    // int8 scales: after the data of each block / sequence.
                    const uint32_t cap = h.max_blocks * o.block;
                    const pkv_attn_kv_quant qz = {r->dt, 0.01f, 0.01f,
                                                  (uint64_t)o.kv_heads * o.block * o.dim,
                                                  o.block, 1};
                    const pkv_attn_kv_quant cqz = {r->dt, 0.01f, 0.01f,
                                                   (uint64_t)o.kv_heads * cap * o.dim, cap, 1};
                    c.batch = r->batch;
                    c.q = h.q;
                    c.out = h.out;
                    set_descs(&o, r->batch, &h, h.pk, h.pv, h.ck, h.cv, h.table, h.lens, &c.pkv,
                              &c.ckv);
                    c.qz = q8 ? &qz : NULL;
                    // The contiguous calls take their own scale geometry: time
                    // them through a second context that differs only there.
                    cpu_ctx cc = c;
                    cc.qz = q8 ? &cqz : NULL;
                    rc = q8 ? time_pair(cpu_call_q8, (cpu_ctx *[2]){&c, &cc}, o.min_time, r)
                            : time_pair(cpu_call, &c, o.min_time, r);
                }
                free_host(&h);
                if (rc != 0) {
                    fprintf(stderr, "bench_attention: attention call failed at batch %u ctx %u\n",
                            r->batch, r->ctx);
                    return 1;
                }
            }
        }
    }
    if (progress) {
        fprintf(stderr, "\r%60s\r", "");
    }
    const char *mode = o.gpu ? "gpu" : "cpu";
    if (o.json_out != NULL) {
        FILE *jf = fopen(o.json_out, "w");
        if (jf == NULL) {
            fprintf(stderr, "bench_attention: cannot write %s\n", o.json_out);
            return 1;
        }
        print_json(jf, &o, mode, nt, copy_bw, res, splits, nres);
        fclose(jf);
    }
    if (o.json) {
        print_json(stdout, &o, mode, nt, copy_bw, res, splits, nres);
        return 0;
    }
    printf("decode attention (%s, %d threads): %u heads, %u kv heads, head_dim %u, block %u\n",
           mode, o.gpu ? 0 : nt, o.heads, o.kv_heads, o.dim, o.block);
    printf("copy bandwidth (%s, read + write): %.2f GB/s\n",
           o.gpu ? "cudaMemcpy device-to-device" : "memcpy", copy_bw / 1e9);
    printf("times: best of the timed calls (medians in --json); K/V MiB = bytes one call\n"
           "reads (points below the last-level cache size may be served from cache).\n");
    if (!o.gpu) {
        printf("cpu_ratio: paged/contiguous median CPU time of all threads per call (counts\n"
               "the cycles the calls ran, not time spent waiting for a core).\n");
    }
    printf("%-5s %5s %7s %7s %11s %11s %7s %9s %9s %7s %7s%s\n", "dtype", "batch", "context",
           "KV_MiB", "paged_us", "contig_us", "ratio", "paged_GBs", "contig_GB", "p_copy",
           "c_copy", o.gpu ? " splits" : " cpu_ratio");
    for (uint32_t i = 0; i < nres; i++) {
        const result *r = &res[i];
        if (r->skipped) {
            printf("%-5s %5u %7u   skipped: %.0f MiB of K/V per layout > --max-mib\n",
                   pkv_dtype_name(r->dt), r->batch, r->ctx, r->kv_bytes / 1048576.0);
            continue;
        }
        printf("%-5s %5u %7u %7.0f %11.1f %11.1f %7.3f %9.2f %9.2f %6.1f%% %6.1f%%",
               pkv_dtype_name(r->dt), r->batch, r->ctx, r->kv_bytes / 1048576.0, r->tp * 1e6, r->tc * 1e6, r->tp / r->tc,
               r->kv_bytes / r->tp / 1e9, r->kv_bytes / r->tc / 1e9,
               100.0 * r->kv_bytes / r->tp / copy_bw, 100.0 * r->kv_bytes / r->tc / copy_bw);
        if (o.gpu) {
            printf(" %6u", splits[i]);
        } else {
            printf(" %9.3f", r->cp / r->cc);
        }
        printf("\n");
    }
    return 0;
}

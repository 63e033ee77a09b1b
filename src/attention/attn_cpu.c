// SPDX-License-Identifier: MIT
// CPU decode and prefill attention over paged and contiguous caches. One routine
// (attend) does the math for every entry point: it walks a sequence's context in
// tiles of TILE_T tokens and, per tile, each of the item's adjacent kv heads in
// turn, scoring each K row against the group of query heads that share it (GQA
// reads each K/V row once per group) and folding the tile into that head's online
// (running-max) softmax. A paged item takes several kv heads
// (pkvi_attn_cpu_item_heads), so that it reads a block's adjacent head rows as one
// run instead of one head's 2-4 KiB per block. The entry points differ only in how
// a token's row address is computed (row_addrs). The window, sink and MLA calls
// (attn_cpu_window.c) run the same routine over a span of the context
// (pkvi_attn_cpu_opts). Invariant: no allocation; all scratch lives in one
// work_state on the calling thread's stack (~53 KiB).
// The build is -O2, where GCC 12 vectorizes only loops that need no epilogue; the
// row kernels (attn_cpu_rows.h, included below) need -O3's vectorizer, and FMA
// contraction, which ISO C mode turns off.
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC optimize("O3", "fp-contract=fast")
#endif

#include <math.h>
#include <stdint.h>
#include <string.h>
#ifdef _OPENMP
#include <omp.h>
#endif

#include "attn_cpu_rows.h"
#include "attn_internal.h"
#include "half.h"

#define TILE_T 32u    // tokens scored before one softmax rescale
#define MAX_GROUP PKVI_ATTN_CPU_MAX_GROUP
#ifndef PF_STEPS
#define PF_STEPS 2u   // software prefetch distance, in (tile, kv head) steps
#endif

typedef struct work_state {
    float q[PKV_ATTN_CPU_MAX_HEAD_DIM];   // [heads x group][head_dim], already scaled
    float acc[PKV_ATTN_CPU_MAX_HEAD_DIM]; // [heads x group][dv], unnormalized (dv <= head_dim)
    float row[PKV_ATTN_CPU_MAX_HEAD_DIM]; // [4][head_dim] (or [head_dim]): K or V rows in fp32
    float p[MAX_GROUP][TILE_T];           // scores, then probabilities, of a tile
    float m[MAX_GROUP];                   // running max per query head
    float l[MAX_GROUP];                   // running sum of exp per query head
} work_state;

// Where the K/V rows of a sequence's first kv head are (the item's other heads
// are head_stride bytes apart). table == NULL: contiguous rows.
typedef struct kv_view {
    const char *k;          // byte address of token 0's row (contiguous) or of the
    const char *v;          // head inside block 0 (paged)
    const int32_t *table;   // [blocks of this sequence] or NULL
    size_t block_stride;    // bytes
    size_t token_stride;    // bytes
    size_t head_stride;     // bytes
    uint32_t block_size;
} kv_view;

static inline void prefetch(const void *p) {
#if defined(__GNUC__)
    __builtin_prefetch(p, 0, 3);
#else
    (void)p;
#endif
}

// Prefetch rows[i .. min(i + 4, end) - 1], every 64-byte line of each.
static inline void prefetch_rows(const void *const *rows, uint32_t i, uint32_t end,
                                 size_t row_bytes) {
    uint32_t stop = i + 4 < end ? i + 4 : end;
    for (uint32_t r = i; r < stop; r++) {
        for (size_t off = 0; off < row_bytes; off += 64) {
            prefetch((const char *)rows[r] + off);
        }
    }
}

// Row addresses of tokens t0..t0+n-1: the only place paged and contiguous differ.
static void row_addrs(const kv_view *kv, uint32_t t0, uint32_t n, const void **kr,
                      const void **vr) {
    if (kv->table == NULL) {
        for (uint32_t i = 0; i < n; i++) {
            size_t off = (size_t)(t0 + i) * kv->token_stride;
            kr[i] = kv->k + off;
            vr[i] = kv->v + off;
        }
        return;
    }
    uint32_t blk = t0 / kv->block_size;
    uint32_t in = t0 % kv->block_size;
    // Block ids are int32; widen before multiplying by the byte stride.
    size_t base = (size_t)kv->table[blk] * kv->block_stride;
    for (uint32_t i = 0; i < n; i++) {
        size_t off = base + (size_t)in * kv->token_stride;
        kr[i] = kv->k + off;
        vr[i] = kv->v + off;
        if (++in == kv->block_size && i + 1 < n) {
            in = 0;
            base = (size_t)kv->table[++blk] * kv->block_stride;
        }
    }
}

// What one work item reads of its context: tokens begin..end-1, V rows of dv
// elements (head_dim, except MLA: V is the first dv elements of the K row), and
// an optional learned sink logit per query head (NULL: none).
typedef struct span {
    uint32_t begin;
    uint32_t end;
    uint32_t dv;
    const float *sinks; // [group] or NULL
} span;

// kv moved to the item's kv head h.
static inline kv_view head_view(const kv_view *kv, uint32_t h) {
    kv_view v = *kv;
    v.k += h * kv->head_stride;
    v.v += h * kv->head_stride;
    return v;
}

// out[g] = softmax(q[g] . K[begin..end-1]) V for the heads * group query heads
// whose rows start at q (head_dim apart) and out (dv apart); query heads
// h * group .. h * group + group - 1 read kv head h of `kv`. Each kv head keeps its
// own running max, sum and accumulator, so the result of every head is the one a
// single-head item gives (same operations in the same order). A sink joins the
// softmax as one more logit with a zero value row: starting the running max at the
// sink and the running sum at e^0 = 1 makes the final division by l the division
// by e^sink + sum_j e^s_j, rescaled stably like every other term.
PKVI_CLONES static void attend(const pkv_attn_shape *shape, const kv_view *kv, const span *sp,
                               const void *q, void *out, uint32_t group, uint32_t heads,
                               int f16c) {
    work_state w;
    const pkv_dtype dt = shape->dtype;
    const uint32_t d = shape->head_dim;
    const uint32_t dv = sp->dv;
    const uint32_t len = sp->end;
    const uint32_t nq = heads * group;
    to_f32(dt, q, nq * d, w.q, f16c);
    scale_row(w.q, shape->scale, nq * d);
    memset(w.acc, 0, (size_t)nq * dv * sizeof(float));
    for (uint32_t g = 0; g < nq; g++) {
        w.m[g] = sp->sinks ? sp->sinks[g] : -INFINITY;
        w.l[g] = sp->sinks ? 1.0f : 0.0f;
    }
    const void *kr[TILE_T];
    const void *vr[TILE_T];
    const void *kn[TILE_T]; // the rows to prefetch
    const void *vn[TILE_T];
    const int quad = 4 * d <= PKV_ATTN_CPU_MAX_HEAD_DIM;
    // f16c != 0 means AVX2 + FMA + F16C: 16-bit rows go through the fused kernels.
    const int fused = f16c && dt != PKV_DTYPE_F32;
    (void)fused;
    const size_t row_bytes = (size_t)d * pkv_dtype_size(dt);
    const size_t vrow_bytes = (size_t)dv * pkv_dtype_size(dt);
    for (uint32_t t0 = sp->begin; t0 < len; t0 += TILE_T) {
        const uint32_t n = len - t0 < TILE_T ? len - t0 : TILE_T;
        for (uint32_t h = 0; h < heads; h++) {
            const kv_view hv = head_view(kv, h);
            row_addrs(&hv, t0, n, kr, vr);
            float *const qh = w.q + (size_t)h * group * d;
            float *const acc = w.acc + (size_t)h * group * dv;
            float (*const p)[TILE_T] = w.p + (size_t)h * group;
            float *const m = w.m + (size_t)h * group;
            float *const l = w.l + (size_t)h * group;
            // Software prefetch of the rows PF_STEPS (tile, kv head) steps ahead (the
            // block table is known): with blocks scattered in memory the hardware
            // prefetcher loses the stream at every block boundary (a 16-token fp16 head
            // block is one 4 KiB page). The prefetches are spread over this step's row
            // loops, K rows during the scores and V rows during the values, four rows
            // at a time: issued all at once at the step start they overflow the core's
            // miss queue and are dropped (docs/BENCHMARKS.md, section 2).
            uint32_t nn = 0;
            const uint32_t ps = h + PF_STEPS;
            const uint32_t tp = t0 + ps / heads * TILE_T;
            if (tp < len) {
                const kv_view pv = head_view(kv, ps % heads);
                nn = len - tp < TILE_T ? len - tp : TILE_T;
                row_addrs(&pv, tp, nn, kn, vn);
            }
            uint32_t i = 0;
            // Rows four at a time while four converted rows fit the row buffer.
    #if PKVI_X86
            for (; fused && i + 4 <= n; i += 4) {
                prefetch_rows(kn, i, nn, row_bytes);
                const uint16_t *k4[4] = {kr[i], kr[i + 1], kr[i + 2], kr[i + 3]};
                for (uint32_t g = 0; g < group; g++) {
                    float s4[4];
                    dot4_16(qh + (size_t)g * d, k4, d, dt == PKV_DTYPE_BF16, s4);
                    for (uint32_t r = 0; r < 4; r++) {
                        p[g][i + r] = s4[r];
                    }
                }
            }
    #endif
            for (; quad && i + 4 <= n; i += 4) {
                prefetch_rows(kn, i, nn, row_bytes);
                const float *k4[4];
                for (uint32_t r = 0; r < 4; r++) {
                    k4[r] = row_f32(dt, kr[i + r], d, w.row + (size_t)r * d, f16c);
                }
                for (uint32_t g = 0; g < group; g++) {
                    float s4[4];
                    dot4(qh + (size_t)g * d, k4, d, s4);
                    for (uint32_t r = 0; r < 4; r++) {
                        p[g][i + r] = s4[r];
                    }
                }
            }
            for (; i < n; i++) {
                prefetch_rows(kn, i, i + 1 < nn ? i + 1 : nn, row_bytes);
                const float *k = row_f32(dt, kr[i], d, w.row, f16c);
                for (uint32_t g = 0; g < group; g++) {
                    p[g][i] = dot(qh + (size_t)g * d, k, d);
                }
            }
            for (uint32_t g = 0; g < group; g++) {
                float mx = m[g];
                for (uint32_t i = 0; i < n; i++) {
                    mx = p[g][i] > mx ? p[g][i] : mx;
                }
                if (mx != m[g]) {
                    // exp(-inf) = 0 on the first tile without a sink: acc and l are
                    // still zero.
                    float alpha = expf(m[g] - mx);
                    scale_row(acc + (size_t)g * dv, alpha, dv);
                    l[g] *= alpha;
                    m[g] = mx;
                }
                float sum = 0.0f;
                for (uint32_t i = 0; i < n; i++) {
                    float e = expf(p[g][i] - mx);
                    p[g][i] = e;
                    sum += e;
                }
                l[g] += sum;
            }
            i = 0;
    #if PKVI_X86
            for (; fused && i + 4 <= n; i += 4) {
                prefetch_rows(vn, i, nn, vrow_bytes);
                const uint16_t *v4[4] = {vr[i], vr[i + 1], vr[i + 2], vr[i + 3]};
                for (uint32_t g = 0; g < group; g++) {
                    const float p4[4] = {p[g][i], p[g][i + 1], p[g][i + 2], p[g][i + 3]};
                    axpy4_16(acc + (size_t)g * dv, p4, v4, dv, dt == PKV_DTYPE_BF16);
                }
            }
    #endif
            for (; quad && i + 4 <= n; i += 4) {
                prefetch_rows(vn, i, nn, vrow_bytes);
                const float *v4[4];
                for (uint32_t r = 0; r < 4; r++) {
                    v4[r] = row_f32(dt, vr[i + r], dv, w.row + (size_t)r * dv, f16c);
                }
                for (uint32_t g = 0; g < group; g++) {
                    const float p4[4] = {p[g][i], p[g][i + 1], p[g][i + 2], p[g][i + 3]};
                    axpy4(acc + (size_t)g * dv, p4, v4, dv);
                }
            }
            for (; i < n; i++) {
                prefetch_rows(vn, i, i + 1 < nn ? i + 1 : nn, vrow_bytes);
                const float *v = row_f32(dt, vr[i], dv, w.row, f16c);
                for (uint32_t g = 0; g < group; g++) {
                    axpy(acc + (size_t)g * dv, p[g][i], v, dv);
                }
            }
        }
    }
    for (uint32_t g = 0; g < nq; g++) {
        scale_row(w.acc + (size_t)g * dv, 1.0f / w.l[g], dv);
    }
    from_f32(dt, w.acc, nq * dv, out);
}

// Query heads per work item: the whole GQA group if its scratch fits. Shared with
// the 8-bit driver (attn_cpu_quant.c), whose scratch has the same bound.
uint32_t pkvi_attn_cpu_item_group(const pkv_attn_shape *shape) {
    uint32_t g = shape->num_heads / shape->num_kv_heads;
    uint32_t cap = PKV_ATTN_CPU_MAX_HEAD_DIM / shape->head_dim;
    if (cap > PKVI_ATTN_CPU_MAX_GROUP) {
        cap = PKVI_ATTN_CPU_MAX_GROUP;
    }
    while (g > cap) { // largest divisor of the group that fits, so items are equal
        uint32_t x = cap;
        while (g % x != 0) {
            x--;
        }
        g = x;
    }
    return g;
}

// The bytes one kv head of a paged cache reads in one place before its rows jump
// to another block: a block's rows of the head (rows packed, HND) or one row
// (NHD); 0 when the next head's rows do not start where this run ends.
size_t pkvi_attn_cpu_head_run(const pkv_attn_paged_kv *kv, size_t es, uint32_t head_dim) {
    const size_t row = (size_t)head_dim * es;
    const size_t run = kv->token_stride * es == row ? kv->block_size * row : row;
    return kv->head_stride * es == run ? run : 0;
}

// Adjacent kv heads per work item: 1 unless the heads' runs are back to back
// (run_bytes from pkvi_attn_cpu_head_run, not 0) and short. Reading one head's
// 2-4 KiB per block and then jumping to the next block costs 1.6-2x per byte
// against reading in order on the machines measured, 1.0x at 64 KiB runs
// (docs/BENCHMARKS.md, bench_scatter); an item that takes x heads reads x runs
// back to back. x stops at PKVI_ATTN_CPU_RUN_BYTES of run, at the scratch bound
// (x group head_dim <= PKV_ATTN_CPU_MAX_HEAD_DIM floats, x group <=
// PKVI_ATTN_CPU_MAX_GROUP) and where fewer than two items per thread would be left,
// and divides num_kv_heads so that items are equal.
uint32_t pkvi_attn_cpu_item_heads(const pkv_attn_shape *shape, uint32_t group, uint64_t rows,
                                  size_t run_bytes) {
    const uint32_t kvh = shape->num_kv_heads;
    if (group * kvh != shape->num_heads || run_bytes == 0) {
        return 1; // query sub-groups, or heads that are not back to back
    }
    const uint64_t nt = (uint64_t)pkvi_attn_cpu_thread_count(shape, rows * kvh);
    uint32_t best = 1;
    for (uint32_t x = 2; x <= kvh && best * run_bytes < PKVI_ATTN_CPU_RUN_BYTES; x++) {
        if (kvh % x != 0) {
            continue;
        }
        if ((uint64_t)x * group * shape->head_dim > PKV_ATTN_CPU_MAX_HEAD_DIM ||
            x * group > PKVI_ATTN_CPU_MAX_GROUP || rows * (kvh / x) < 2 * nt) {
            break;
        }
        best = x;
    }
    return best;
}

int pkvi_attn_cpu_thread_count(const pkv_attn_shape *shape, uint64_t items) {
#ifdef _OPENMP
    int nt = shape->num_threads ? (int)shape->num_threads : omp_get_max_threads();
    if ((uint64_t)nt > items) {
        nt = (int)items;
    }
    return nt < 1 ? 1 : nt;
#else
    (void)shape;
    (void)items;
    return 1;
#endif
}

static kv_view paged_view(const void *desc, size_t es, uint32_t s, uint32_t kvh) {
    const pkv_attn_paged_kv *kv = desc;
    kv_view v;
    size_t head = (size_t)kvh * kv->head_stride * es;
    v.k = (const char *)kv->k_cache + head;
    v.v = (const char *)kv->v_cache + head;
    v.table = kv->block_tables + (size_t)s * kv->max_blocks_per_seq;
    v.block_stride = kv->block_stride * es;
    v.token_stride = kv->token_stride * es;
    v.head_stride = kv->head_stride * es;
    v.block_size = kv->block_size;
    return v;
}

static kv_view contig_view(const void *desc, size_t es, uint32_t s, uint32_t kvh) {
    const pkv_attn_contig_kv *kv = desc;
    const size_t row = kv->seq_offsets ? (size_t)kv->seq_offsets[s] : (size_t)s * kv->seq_stride;
    size_t base = (row + (size_t)kvh * kv->head_stride) * es;
    kv_view v;
    v.k = (const char *)kv->k_cache + base;
    v.v = (const char *)kv->v_cache + base;
    v.table = NULL; // one "block" as long as the sequence
    v.block_stride = 0;
    v.token_stride = kv->token_stride * es;
    v.head_stride = kv->head_stride * es;
    v.block_size = 1;
    return v;
}

// Decode or prefill for either layout: one work item per (query row, kv heads,
// query sub-group), spread over threads. Decode (q_indptr NULL): row s is
// sequence s, over its whole context. Prefill: rows are the packed prompt rows,
// and row j of an n-token prompt is position len - n + j, seeing tokens 0..that.
// The layouts differ only in `view` and in the kv heads an item takes (`run`: the
// bytes one kv head reads before its rows jump elsewhere, 0 for a contiguous
// sequence, whose heads' rows are long runs already). opts (NULL: full causal
// attention, no sinks, V as wide as K) narrows each query's span to its window.
static void run_items(const pkv_attn_shape *shape, const pkvi_attn_cpu_opts *opts,
                      uint32_t num_seqs, const int32_t *q_indptr, const void *q,
                      const void *desc, const int32_t *seq_lens, size_t run,
                      kv_view (*view)(const void *, size_t, uint32_t, uint32_t), void *out) {
    const size_t es = pkv_dtype_size(shape->dtype);
    const uint32_t dv = opts && opts->v_dim ? opts->v_dim : shape->head_dim;
    const uint32_t group = pkvi_attn_cpu_item_group(shape);
    const uint32_t subs = shape->num_heads / shape->num_kv_heads / group;
    const uint64_t rows = q_indptr ? (uint64_t)q_indptr[num_seqs] : num_seqs;
    const uint32_t heads = pkvi_attn_cpu_item_heads(shape, group, rows, run);
    const uint32_t kv_items = shape->num_kv_heads / heads;
    const uint64_t items = rows * kv_items * subs;
    const int nt = pkvi_attn_cpu_thread_count(shape, items);
    const int f16c = cpu_has_f16c();
    (void)nt;
#ifdef _OPENMP
#pragma omp parallel for schedule(dynamic, 1) num_threads(nt)
#endif
    for (int64_t it = 0; it < (int64_t)items; it++) {
        uint32_t sub = (uint32_t)((uint64_t)it % subs);
        uint32_t kvh = (uint32_t)((uint64_t)it / subs % kv_items) * heads;
        int64_t r = (int64_t)((uint64_t)it / subs / kv_items);
        uint32_t s, ctx;
        if (q_indptr != NULL) {
            s = pkvi_attn_find_seq(q_indptr, num_seqs, r);
            int64_t n = (int64_t)q_indptr[s + 1] - q_indptr[s];
            ctx = (uint32_t)(seq_lens[s] - n + (r - q_indptr[s]) + 1);
        } else {
            s = (uint32_t)r;
            ctx = (uint32_t)seq_lens[s];
        }
        uint32_t h0 = kvh * (shape->num_heads / shape->num_kv_heads) + sub * group;
        size_t head_row = (size_t)r * shape->num_heads + h0;
        kv_view v = view(desc, es, s, kvh);
        span sp = {0, ctx, dv, NULL};
        if (opts != NULL) {
            sp.begin = pkvi_attn_window_begin(opts->kind, opts->window, ctx - 1);
            sp.sinks = opts->sinks ? opts->sinks + h0 : NULL;
        }
        attend(shape, &v, &sp, (const char *)q + head_row * shape->head_dim * es,
               (char *)out + head_row * dv * es, group, heads, f16c);
    }
}

pkv_status pkv_attn_decode_paged_cpu(const pkv_attn_shape *shape, uint32_t num_seqs,
                                     const void *q, const pkv_attn_paged_kv *kv, void *out) {
    pkv_status st = pkvi_attn_check_cpu_paged(shape, NULL, 0, kv, num_seqs, q, out, 0, NULL);
    if (st != PKV_OK) return st;
    run_items(shape, NULL, num_seqs, NULL, q, kv, kv->seq_lens,
              pkvi_attn_cpu_head_run(kv, pkv_dtype_size(shape->dtype), shape->head_dim),
              paged_view, out);
    return PKV_OK;
}

pkv_status pkv_attn_decode_contig_cpu(const pkv_attn_shape *shape, uint32_t num_seqs,
                                      const void *q, const pkv_attn_contig_kv *kv, void *out) {
    pkv_status st = pkvi_attn_check_cpu_contig(shape, NULL, 0, kv, num_seqs, q, out, 0, NULL);
    if (st != PKV_OK) return st;
    run_items(shape, NULL, num_seqs, NULL, q, kv, kv->seq_lens, 0, contig_view, out);
    return PKV_OK;
}

pkv_status pkv_attn_prefill_paged_cpu(const pkv_attn_shape *shape, uint32_t num_seqs,
                                      const int32_t *q_indptr, const void *q,
                                      const pkv_attn_paged_kv *kv, void *out) {
    pkv_status st = pkvi_attn_check_cpu_paged(shape, NULL, 0, kv, num_seqs, q, out, 1, q_indptr);
    if (st != PKV_OK) return st;
    run_items(shape, NULL, num_seqs, q_indptr, q, kv, kv->seq_lens,
              pkvi_attn_cpu_head_run(kv, pkv_dtype_size(shape->dtype), shape->head_dim),
              paged_view, out);
    return PKV_OK;
}

pkv_status pkv_attn_prefill_contig_cpu(const pkv_attn_shape *shape, uint32_t num_seqs,
                                       const int32_t *q_indptr, const void *q,
                                       const pkv_attn_contig_kv *kv, void *out) {
    pkv_status st = pkvi_attn_check_cpu_contig(shape, NULL, 0, kv, num_seqs, q, out, 1, q_indptr);
    if (st != PKV_OK) return st;
    run_items(shape, NULL, num_seqs, q_indptr, q, kv, kv->seq_lens, 0, contig_view, out);
    return PKV_OK;
}

void pkvi_attn_cpu_run_paged(const pkv_attn_shape *shape, const pkvi_attn_cpu_opts *opts,
                             uint32_t num_seqs, const int32_t *q_indptr, const void *q,
                             const pkv_attn_paged_kv *kv, void *out) {
    run_items(shape, opts, num_seqs, q_indptr, q, kv, kv->seq_lens,
              pkvi_attn_cpu_head_run(kv, pkv_dtype_size(shape->dtype), shape->head_dim),
              paged_view, out);
}

void pkvi_attn_cpu_run_contig(const pkv_attn_shape *shape, const pkvi_attn_cpu_opts *opts,
                              uint32_t num_seqs, const int32_t *q_indptr, const void *q,
                              const pkv_attn_contig_kv *kv, void *out) {
    run_items(shape, opts, num_seqs, q_indptr, q, kv, kv->seq_lens, 0, contig_view, out);
}

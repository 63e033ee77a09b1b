// SPDX-License-Identifier: MIT
// Unit tests of the CPU attention (src/attention): decode over paged and
// contiguous caches, prefill, cache write, block copy, the fp16/bf16 conversions
// and the CUDA split-K plan, against naive double-precision references written
// here. Unused cache slots hold NaN, so any read of padding poisons the result.
//
// Tolerances, |out - ref| <= ATOL + u * |ref| with ATOL = 3e-5:
//  - ref is computed in double from the values as stored (q, K, V already rounded
//    to the dtype), so the only errors are the kernel's fp32 arithmetic and the
//    final rounding of the output to the dtype.
//  - fp32 arithmetic: dots of <= 256 terms and softmax sums of <= ~5000 terms with
//    outputs in [-1, 1]; the observed error is ~1e-6, the bound 3e-5 leaves room
//    for worst-case accumulation (n * eps ~ 5000 * 6e-8 = 3e-4 relative on the
//    sum is the pessimistic bound; random-sign errors grow as sqrt(n)).
//  - output rounding: u = 0 for fp32, 2^-11 for fp16, 2^-8 for bf16 (half an ulp
//    relative, as round-to-nearest gives).
#include <criterion/criterion.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "pkv/attention.h"
#include "pkv/backend.h"
#include "pkv/cache.h"
#include "pkv/pool.h"
#include "pkv/seq.h"
#include "src/attention/attn_internal.h"
#include "src/attention/half.h"

#define ATOL 3e-5

// ---------------------------------------------------------------- helpers

static uint64_t rng_state = 0x9e3779b97f4a7c15ull;

static uint64_t rng_next(void) { // splitmix64
    uint64_t z = (rng_state += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

static double rng_unit(void) { // [-1, 1)
    return (double)(rng_next() >> 11) / (double)(1ull << 53) * 2.0 - 1.0;
}

static uint32_t rng_below(uint32_t n) {
    return (uint32_t)(rng_next() % n);
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

static double unit_roundoff(pkv_dtype dt) {
    return dt == PKV_DTYPE_F32 ? 0.0 : dt == PKV_DTYPE_F16 ? ldexp(1.0, -11) : ldexp(1.0, -8);
}

static void *xcalloc(size_t n, size_t size) {
    void *p = calloc(n ? n : 1, size);
    cr_assert_not_null(p);
    return p;
}

static void shuffle_i32(int32_t *a, uint32_t n) {
    for (uint32_t i = n; i > 1; i--) {
        uint32_t j = rng_below(i);
        int32_t t = a[i - 1];
        a[i - 1] = a[j];
        a[j] = t;
    }
}

// A paged cache of one layer with K and V in separate arrays, its tables, and q.
typedef struct pcase {
    pkv_attn_shape sh;
    uint32_t num_seqs;
    int32_t *lens;     // [num_seqs]
    int32_t *tables;   // [num_seqs][max_blocks]
    void *kc;          // [num_blocks][block_stride]
    void *vc;
    void *q;           // [num_seqs][heads][dim]
    pkv_attn_paged_kv kv;
    size_t cache_elems;
} pcase;

// Lens given; blocks shuffled; with `share`, every sequence after the first
// reuses the first sequence's full blocks for its first tokens (a shared prefix).
// nhd: token-major layout inside a block instead of the default head-major one.
static pcase make_case(pkv_dtype dt, uint32_t heads, uint32_t kv_heads, uint32_t dim,
                       uint32_t bs, uint32_t num_seqs, const int32_t *lens, int share,
                       int nhd, double qscale) {
    pcase c;
    memset(&c, 0, sizeof c);
    c.sh.num_heads = heads;
    c.sh.num_kv_heads = kv_heads;
    c.sh.head_dim = dim;
    c.sh.dtype = dt;
    c.sh.scale = (float)(1.0 / sqrt((double)dim));
    c.num_seqs = num_seqs;
    c.lens = xcalloc(num_seqs, sizeof(int32_t));
    uint32_t max_blocks = 1;
    uint32_t total = 0;
    for (uint32_t s = 0; s < num_seqs; s++) {
        c.lens[s] = lens[s];
        uint32_t nb = ((uint32_t)lens[s] + bs - 1) / bs;
        max_blocks = nb > max_blocks ? nb : max_blocks;
        total += nb;
    }
    max_blocks += 2; // padding columns that hold garbage ids
    uint32_t num_blocks = total + 3; // some blocks no one uses
    int32_t *perm = xcalloc(num_blocks, sizeof(int32_t));
    for (uint32_t i = 0; i < num_blocks; i++) {
        perm[i] = (int32_t)i;
    }
    shuffle_i32(perm, num_blocks);
    c.tables = xcalloc((size_t)num_seqs * max_blocks, sizeof(int32_t));
    uint32_t next = 0;
    uint32_t shared_full = (uint32_t)lens[0] / bs;
    for (uint32_t s = 0; s < num_seqs; s++) {
        int32_t *row = c.tables + (size_t)s * max_blocks;
        uint32_t nb = ((uint32_t)lens[s] + bs - 1) / bs;
        for (uint32_t b = 0; b < max_blocks; b++) {
            row[b] = b < nb ? perm[next++] : (int32_t)(0x7fff0000 + b); // garbage beyond
        }
        if (share && s > 0) {
            uint32_t full = (uint32_t)lens[s] / bs;
            uint32_t n = full < shared_full ? full : shared_full;
            for (uint32_t b = 0; b < n; b++) {
                row[b] = c.tables[b];
            }
        }
    }
    free(perm);
    uint64_t block_stride = (uint64_t)kv_heads * bs * dim;
    c.kv.block_stride = block_stride;
    c.kv.head_stride = nhd ? dim : (uint64_t)bs * dim;
    c.kv.token_stride = nhd ? (uint64_t)kv_heads * dim : dim;
    c.kv.block_size = bs;
    c.kv.num_blocks = num_blocks;
    c.kv.max_blocks_per_seq = max_blocks;
    c.kv.block_tables = c.tables;
    c.kv.seq_lens = c.lens;
    c.cache_elems = (size_t)num_blocks * block_stride;
    size_t es = pkv_dtype_size(dt);
    c.kc = xcalloc(c.cache_elems, es);
    c.vc = xcalloc(c.cache_elems, es);
    for (size_t i = 0; i < c.cache_elems; i++) { // poison every slot
        store(dt, c.kc, i, NAN);
        store(dt, c.vc, i, NAN);
    }
    for (uint32_t s = 0; s < num_seqs; s++) {
        const int32_t *row = c.tables + (size_t)s * max_blocks;
        for (uint32_t t = 0; t < (uint32_t)lens[s]; t++) {
            for (uint32_t h = 0; h < kv_heads; h++) {
                size_t base = (size_t)row[t / bs] * block_stride + h * c.kv.head_stride +
                              (t % bs) * c.kv.token_stride;
                for (uint32_t d = 0; d < dim; d++) {
                    store(dt, c.kc, base + d, rng_unit());
                    store(dt, c.vc, base + d, rng_unit());
                }
            }
        }
    }
    c.kv.k_cache = c.kc;
    c.kv.v_cache = c.vc;
    size_t qn = (size_t)num_seqs * heads * dim;
    c.q = xcalloc(qn, es);
    for (size_t i = 0; i < qn; i++) {
        store(dt, c.q, i, rng_unit() * qscale);
    }
    return c;
}

static void free_case(pcase *c) {
    free(c->lens);
    free(c->tables);
    free(c->kc);
    free(c->vc);
    free(c->q);
}

// Naive reference in double: query row q_row (head h) of sequence s over its
// first `len` tokens, read through the table with this test's own address math.
static void ref_one(const pcase *c, const void *q, size_t q_row, uint32_t s, uint32_t h,
                    uint32_t len, double *out) {
    const pkv_attn_shape *sh = &c->sh;
    uint32_t dim = sh->head_dim;
    uint32_t kvh = h / (sh->num_heads / sh->num_kv_heads);
    const int32_t *row = c->tables + (size_t)s * c->kv.max_blocks_per_seq;
    double *sc = xcalloc(len, sizeof(double));
    double mx = -INFINITY;
    for (uint32_t t = 0; t < len; t++) {
        size_t base = (size_t)row[t / c->kv.block_size] * c->kv.block_stride +
                      kvh * c->kv.head_stride + (t % c->kv.block_size) * c->kv.token_stride;
        double acc = 0.0;
        for (uint32_t d = 0; d < dim; d++) {
            acc += load(sh->dtype, q, q_row * dim + d) * load(sh->dtype, c->kc, base + d);
        }
        sc[t] = acc * (double)sh->scale;
        mx = sc[t] > mx ? sc[t] : mx;
    }
    double sum = 0.0;
    for (uint32_t t = 0; t < len; t++) {
        sc[t] = exp(sc[t] - mx);
        sum += sc[t];
    }
    for (uint32_t d = 0; d < dim; d++) {
        out[d] = 0.0;
    }
    for (uint32_t t = 0; t < len; t++) {
        size_t base = (size_t)row[t / c->kv.block_size] * c->kv.block_stride +
                      kvh * c->kv.head_stride + (t % c->kv.block_size) * c->kv.token_stride;
        for (uint32_t d = 0; d < dim; d++) {
            out[d] += sc[t] / sum * load(sh->dtype, c->vc, base + d);
        }
    }
    free(sc);
}

// Largest tolerance-scaled error of out (rows = query rows) against the
// reference; > 1 means a violation.
static double check_decode(const pcase *c, const void *out, const char *what) {
    uint32_t dim = c->sh.head_dim;
    double *ref = xcalloc(dim, sizeof(double));
    double worst = 0.0;
    double u = unit_roundoff(c->sh.dtype);
    for (uint32_t s = 0; s < c->num_seqs; s++) {
        for (uint32_t h = 0; h < c->sh.num_heads; h++) {
            size_t qrow = (size_t)s * c->sh.num_heads + h;
            ref_one(c, c->q, qrow, s, h, (uint32_t)c->lens[s], ref);
            for (uint32_t d = 0; d < dim; d++) {
                double got = load(c->sh.dtype, out, qrow * dim + d);
                double e = fabs(got - ref[d]) / (ATOL + u * fabs(ref[d]));
                if (!(e <= 1.0)) {
                    double want = ref[d];
                    free(ref);
                    cr_assert_fail("%s: seq %u head %u dim %u: got %.9g want %.9g", what, s, h,
                                   d, got, want);
                }
                worst = e > worst ? e : worst;
            }
        }
    }
    free(ref);
    return worst;
}

static void *run_paged(const pcase *c) {
    size_t n = (size_t)c->num_seqs * c->sh.num_heads * c->sh.head_dim;
    void *out = xcalloc(n, pkv_dtype_size(c->sh.dtype));
    pkv_status st = pkv_attn_decode_paged_cpu(&c->sh, c->num_seqs, c->q, &c->kv, out);
    cr_assert_eq(st, PKV_OK, "decode_paged_cpu: %s", pkv_status_str(st));
    return out;
}

static const pkv_dtype all_dtypes[3] = {PKV_DTYPE_F32, PKV_DTYPE_F16, PKV_DTYPE_BF16};

// ---------------------------------------------------------------- conversions

Test(attention_half, f16_decode_encode_round_trips_every_value) {
    for (uint32_t h = 0; h < 65536; h++) {
        float f = pkvi_f16_to_f32((uint16_t)h);
        if ((h & 0x7c00u) == 0x7c00u && (h & 0x3ffu) != 0) {
            cr_assert(isnan(f), "0x%04x must decode to NaN", h);
            cr_assert(isnan(pkvi_f16_to_f32(pkvi_f32_to_f16(f))));
            continue;
        }
        cr_assert_eq(pkvi_f32_to_f16(f), h, "0x%04x -> %g -> 0x%04x", h, (double)f,
                     pkvi_f32_to_f16(f));
    }
    cr_assert_eq(pkvi_f16_to_f32(0x3c00u), 1.0f);
    cr_assert_eq(pkvi_f16_to_f32(0x0001u), ldexpf(1.0f, -24)); // smallest subnormal
    cr_assert_eq(pkvi_f16_to_f32(0x7bffu), 65504.0f);
    cr_assert(isinf(pkvi_f16_to_f32(0xfc00u)) && pkvi_f16_to_f32(0xfc00u) < 0);
}

// Property check of rounding: the result is a nearest representable value and,
// on a tie, the even one.
static void check_nearest(float f, uint16_t got, float (*dec)(uint16_t), const char *name) {
    double x = f;
    double g = dec(got);
    uint16_t up = (uint16_t)(got + 1);
    // Sign-magnitude: below a zero lies the smallest value of the other sign.
    uint16_t dn = (got & 0x7fffu) ? (uint16_t)(got - 1) : (uint16_t)((got ^ 0x8000u) | 1u);
    double eg = fabs(g - x);
    double eu = fabs((double)dec(up) - x);
    double ed = fabs((double)dec(dn) - x);
    if (isinf(g)) {
        return; // overflow: checked separately
    }
    cr_assert(eg <= eu && eg <= ed, "%s(%.10g) = 0x%04x (%.10g) is not nearest", name, x, got, g);
    if (eg == eu || eg == ed) {
        cr_assert((got & 1u) == 0, "%s(%.10g) tie not to even: 0x%04x", name, x, got);
    }
}

Test(attention_half, f32_to_f16_and_bf16_round_to_nearest_even) {
    for (int i = 0; i < 200000; i++) {
        // Exponents from fp16 subnormal range to near overflow, both signs.
        float f = (float)ldexp(rng_unit(), (int)rng_below(44) - 26);
        check_nearest(f, pkvi_f32_to_f16(f), pkvi_f16_to_f32, "f16");
        float b = (float)ldexp(rng_unit(), (int)rng_below(200) - 100);
        check_nearest(b, pkvi_f32_to_bf16(b), pkvi_bf16_to_f32, "bf16");
    }
    // Exact ties: 1 + 2^-11 lies halfway between 1 and 1 + 2^-10 -> even (1).
    cr_assert_eq(pkvi_f32_to_f16(1.0f + ldexpf(1.0f, -11)), 0x3c00u);
    cr_assert_eq(pkvi_f32_to_f16(1.0f + 3 * ldexpf(1.0f, -11)), 0x3c02u);
    cr_assert_eq(pkvi_f32_to_f16(65519.0f), 0x7bffu);
    cr_assert_eq(pkvi_f32_to_f16(65520.0f), 0x7c00u); // the tie rounds up to inf
    cr_assert_eq(pkvi_f32_to_f16(-1e9f), 0xfc00u);
    cr_assert_eq(pkvi_f32_to_f16(ldexpf(1.0f, -25)), 0x0000u); // tie with 0 -> even
    cr_assert_eq(pkvi_f32_to_f16(ldexpf(3.0f, -25)), 0x0002u);
    cr_assert(isnan(pkvi_f16_to_f32(pkvi_f32_to_f16(NAN))));
    cr_assert_eq(pkvi_f32_to_bf16(1.0f + ldexpf(1.0f, -8)), 0x3f80u);
    cr_assert_eq(pkvi_f32_to_bf16(1.0f + 3 * ldexpf(1.0f, -8)), 0x3f82u);
    cr_assert_eq(pkvi_f32_to_bf16(3.4028e38f), 0x7f80u);
    cr_assert(isnan(pkvi_bf16_to_f32(pkvi_f32_to_bf16(NAN))));
}

// ---------------------------------------------------------------- decode vs reference

Test(attention_decode, lengths_around_block_edges_all_dtypes_and_head_layouts) {
    const uint32_t heads_kv[3][2] = {{4, 4}, {8, 2}, {4, 1}}; // MHA, GQA, MQA
    const uint32_t bss[4] = {1, 8, 16, 32};
    for (int di = 0; di < 3; di++) {
        for (int hk = 0; hk < 3; hk++) {
            for (int bi = 0; bi < 4; bi++) {
                uint32_t bs = bss[bi];
                int32_t lens[6] = {1, (int32_t)(bs > 1 ? bs - 1 : 2), (int32_t)bs,
                                   (int32_t)bs + 1, (int32_t)(3 * bs + 5), 97};
                pcase c = make_case(all_dtypes[di], heads_kv[hk][0], heads_kv[hk][1], 64, bs,
                                    6, lens, 1, bi == 2, 1.0);
                void *out = run_paged(&c);
                char what[96];
                snprintf(what, sizeof what, "%s heads %u/%u block %u",
                         pkv_dtype_name(all_dtypes[di]), heads_kv[hk][0], heads_kv[hk][1], bs);
                check_decode(&c, out, what);
                free(out);
                free_case(&c);
            }
        }
    }
}

Test(attention_decode, head_dims_and_odd_block_sizes) {
    const uint32_t dims[5] = {1, 13, 128, 256, 100};
    const uint32_t bss[5] = {5, 16, 64, 256, 3};
    for (int i = 0; i < 5; i++) {
        for (int di = 0; di < 3; di++) {
            int32_t lens[3] = {(int32_t)bss[i] + 1, 300, 2};
            pcase c = make_case(all_dtypes[di], 4, 2, dims[i], bss[i], 3, lens, 1, 0, 1.0);
            void *out = run_paged(&c);
            char what[96];
            snprintf(what, sizeof what, "%s dim %u block %u", pkv_dtype_name(all_dtypes[di]),
                     dims[i], bss[i]);
            check_decode(&c, out, what);
            free(out);
            free_case(&c);
        }
    }
}

Test(attention_decode, long_contexts_several_thousand_tokens) {
    for (int di = 0; di < 3; di++) {
        int32_t lens[2] = {5000, 4097};
        pcase c = make_case(all_dtypes[di], 8, 2, 128, 16, 2, lens, 1, 0, 1.0);
        void *out = run_paged(&c);
        check_decode(&c, out, pkv_dtype_name(all_dtypes[di]));
        free(out);
        free_case(&c);
    }
}

// Scores of several hundred: exp() would overflow without the running max, and a
// wrong rescale of earlier tiles shows as a large error.
Test(attention_decode, large_logits_need_the_running_max) {
    int32_t lens[3] = {700, 33, 64};
    pcase c = make_case(PKV_DTYPE_F32, 4, 4, 64, 16, 3, lens, 0, 0, 1.0);
    c.sh.scale = 40.0f;
    void *out = run_paged(&c);
    check_decode(&c, out, "scale 40");
    for (size_t i = 0; i < (size_t)3 * 4 * 64; i++) {
        cr_assert(isfinite(((float *)out)[i]));
    }
    free(out);
    free_case(&c);
}

// A GQA group larger than one work item's scratch is cut into sub-groups.
Test(attention_decode, large_gqa_group_is_split_correctly) {
    int32_t lens[2] = {77, 40};
    pcase c = make_case(PKV_DTYPE_BF16, 64, 1, 128, 16, 2, lens, 0, 0, 1.0);
    void *out = run_paged(&c);
    check_decode(&c, out, "64 heads on one kv head, dim 128");
    free(out);
    free_case(&c);
}

Test(attention_decode, thread_count_does_not_change_results) {
    int32_t lens[4] = {100, 1, 513, 64};
    pcase c = make_case(PKV_DTYPE_F16, 8, 4, 64, 16, 4, lens, 1, 0, 1.0);
    c.sh.num_threads = 1;
    void *a = run_paged(&c);
    c.sh.num_threads = 0;
    void *b = run_paged(&c);
    c.sh.num_threads = 3;
    void *d = run_paged(&c);
    size_t bytes = (size_t)4 * 8 * 64 * 2;
    cr_assert_eq(memcmp(a, b, bytes), 0);
    cr_assert_eq(memcmp(a, d, bytes), 0);
    free(a);
    free(b);
    free(d);
    free_case(&c);
}

// Decode (plain, or under `win` when not NULL) with sh.num_threads = nt.
static void *decode_threads(pcase *c, uint32_t nt, const pkv_attn_window *win) {
    void *out = xcalloc((size_t)c->num_seqs * c->sh.num_heads * c->sh.head_dim,
                        pkv_dtype_size(c->sh.dtype));
    c->sh.num_threads = nt;
    pkv_status st = win ? pkv_attn_decode_paged_window_cpu(&c->sh, win, c->num_seqs, c->q,
                                                           &c->kv, out)
                        : pkv_attn_decode_paged_cpu(&c->sh, c->num_seqs, c->q, &c->kv, out);
    cr_assert_eq(st, PKV_OK, "%s", pkv_status_str(st));
    return out;
}

// A paged work item takes several adjacent kv heads when there are few threads
// to feed (one thread: every head of a row, up to 64 KiB of rows per block; two
// threads and one sequence: fewer), one head when there are as many threads as
// (row, kv head) pairs. Each head's output is the same bits either way, and the
// merged items match the reference: GQA 1, 4 and 8, kv head counts 3 and 6 (not
// multiples of 2 or 4), both block layouts, block 5 and 16, lengths 1, 33 and 300,
// and a sliding window with sinks over tables whose entries before the window are
// PKV_BLOCK_NONE.
Test(attention_decode, kv_heads_per_item_do_not_change_output) {
    const int32_t lens[3] = {300, 1, 33};
    const uint32_t shapes[][4] = {{8, 8, 64, 16}, {24, 6, 40, 5}, {12, 3, 13, 16}, {32, 4, 64, 16}};
    float sinks[32];
    for (int h = 0; h < 32; h++) {
        sinks[h] = (float)(rng_unit() * 2.0);
    }
    const pkv_attn_window win = {PKV_ATTN_WINDOW_SLIDING, 50, sinks};
    for (int di = 0; di < 3; di++) {
        for (int sh = 0; sh < 4; sh++) {
            for (int nhd = 0; nhd < 2; nhd++) {
                for (uint32_t seqs = 1; seqs <= 3; seqs += 2) {
                    const uint32_t *x = shapes[sh];
                    pcase c = make_case(all_dtypes[di], x[0], x[1], x[2], x[3], seqs, lens, 0,
                                        nhd, 1.0);
                    const size_t bytes = (size_t)seqs * x[0] * x[2] * pkv_dtype_size(c.sh.dtype);
                    char what[96];
                    snprintf(what, sizeof what, "%s heads %u/%u dim %u block %u nhd %d seqs %u",
                             pkv_dtype_name(all_dtypes[di]), x[0], x[1], x[2], x[3], nhd, seqs);
                    for (int w = 0; w < 2; w++) {
                        const pkv_attn_window *wp = w ? &win : NULL;
                        void *a = decode_threads(&c, seqs * x[1], wp);
                        void *b = decode_threads(&c, 1, wp);
                        void *d = decode_threads(&c, 2, wp);
                        cr_assert_eq(memcmp(a, b, bytes), 0, "%s window %d: 1 thread", what, w);
                        cr_assert_eq(memcmp(a, d, bytes), 0, "%s window %d: 2 threads", what, w);
                        if (w == 0) {
                            check_decode(&c, b, what);
                        }
                        free(a);
                        free(b);
                        free(d);
                        // Tokens before the window: their blocks are never read.
                        for (uint32_t s = 0; s < seqs; s++) {
                            int32_t first = lens[s] > 50 ? (lens[s] - 50) / (int32_t)x[3] : 0;
                            for (int32_t blk = 0; blk < first; blk++) {
                                c.tables[s * c.kv.max_blocks_per_seq + (uint32_t)blk] =
                                    PKV_BLOCK_NONE;
                            }
                        }
                    }
                    free_case(&c);
                }
            }
        }
    }
}

// ---------------------------------------------------------------- contiguous twin

// Copy the paged data into a contiguous [seq][kv_head][max_len][dim] cache (NaN
// beyond each length) and check that both give bit-identical outputs.
Test(attention_contig, equals_paged_bit_for_bit) {
    for (int di = 0; di < 3; di++) {
        int32_t lens[5] = {1, 15, 16, 17, 2500};
        pcase c = make_case(all_dtypes[di], 8, 2, 128, 16, 5, lens, 1, 0, 1.0);
        const pkv_dtype dt = c.sh.dtype;
        const uint32_t dim = 128;
        const uint32_t kvh = 2;
        const uint32_t max_len = 2600;
        size_t es = pkv_dtype_size(dt);
        size_t n = (size_t)5 * kvh * max_len * dim;
        void *kc = xcalloc(n, es);
        void *vc = xcalloc(n, es);
        for (size_t i = 0; i < n; i++) {
            store(dt, kc, i, NAN);
            store(dt, vc, i, NAN);
        }
        for (uint32_t s = 0; s < 5; s++) {
            const int32_t *row = c.tables + (size_t)s * c.kv.max_blocks_per_seq;
            for (uint32_t h = 0; h < kvh; h++) {
                for (uint32_t t = 0; t < (uint32_t)lens[s]; t++) {
                    size_t src = (size_t)row[t / 16] * c.kv.block_stride + h * c.kv.head_stride +
                                 (t % 16) * c.kv.token_stride;
                    size_t dst = (((size_t)s * kvh + h) * max_len + t) * dim;
                    memcpy((char *)kc + dst * es, (char *)c.kc + src * es, dim * es);
                    memcpy((char *)vc + dst * es, (char *)c.vc + src * es, dim * es);
                }
            }
        }
        pkv_attn_contig_kv ck = {kc, vc, (uint64_t)kvh * max_len * dim, (uint64_t)max_len * dim,
                                 dim, max_len, c.lens, NULL};
        void *paged = run_paged(&c);
        size_t on = (size_t)5 * 8 * dim;
        void *contig = xcalloc(on, es);
        cr_assert_eq(pkv_attn_decode_contig_cpu(&c.sh, 5, c.q, &ck, contig), PKV_OK);
        cr_assert_eq(memcmp(paged, contig, on * es), 0, "%s: paged != contiguous",
                     pkv_dtype_name(dt));
        check_decode(&c, contig, "contiguous");
        free(paged);
        free(contig);
        free(kc);
        free(vc);
        free_case(&c);
    }
}

// Rows of different capacities carved from one [kv_head][arena][dim] arena, in
// reverse sequence order with gaps (NaN) between them, read through seq_offsets:
// the same outputs as the paged call, bit for bit, with seq_stride ignored.
Test(attention_contig, carved_rows_at_offsets_equal_paged) {
    for (int di = 0; di < 3; di++) {
        int32_t lens[4] = {1, 33, 16, 300};
        pcase c = make_case(all_dtypes[di], 8, 2, 64, 16, 4, lens, 1, 0, 1.0);
        const pkv_dtype dt = c.sh.dtype;
        const uint32_t dim = 64, kvh = 2;
        const size_t es = pkv_dtype_size(dt);
        int64_t offs[4];
        uint64_t arena = 0;
        for (uint32_t i = 0; i < 4; i++) { // the last sequence first
            offs[3 - i] = (int64_t)(arena * dim);
            arena += (uint64_t)lens[3 - i] + 5;
        }
        const size_t n = (size_t)kvh * arena * dim;
        void *kc = xcalloc(n, es);
        void *vc = xcalloc(n, es);
        for (size_t i = 0; i < n; i++) {
            store(dt, kc, i, NAN);
            store(dt, vc, i, NAN);
        }
        for (uint32_t s = 0; s < 4; s++) {
            const int32_t *row = c.tables + (size_t)s * c.kv.max_blocks_per_seq;
            for (uint32_t h = 0; h < kvh; h++)
                for (uint32_t t = 0; t < (uint32_t)lens[s]; t++) {
                    size_t src = (size_t)row[t / 16] * c.kv.block_stride + h * c.kv.head_stride +
                                 (t % 16) * c.kv.token_stride;
                    size_t dst = (size_t)offs[s] + h * arena * dim + (size_t)t * dim;
                    memcpy((char *)kc + dst * es, (char *)c.kc + src * es, dim * es);
                    memcpy((char *)vc + dst * es, (char *)c.vc + src * es, dim * es);
                }
        }
        pkv_attn_contig_kv ck = {kc, vc, UINT64_MAX / 4, (uint64_t)arena * dim, dim, 300, c.lens, offs};
        void *paged = run_paged(&c);
        const size_t on = (size_t)4 * 8 * dim;
        void *contig = xcalloc(on, es);
        cr_assert_eq(pkv_attn_decode_contig_cpu(&c.sh, 4, c.q, &ck, contig), PKV_OK);
        cr_assert_eq(memcmp(paged, contig, on * es), 0, "%s: paged != carved contiguous",
                     pkv_dtype_name(dt));
        check_decode(&c, contig, "carved contiguous");
        // Prefill of the last min(len, 3) tokens of each: the same bits as paged.
        int32_t indptr[5] = {0};
        for (uint32_t s = 0; s < 4; s++) indptr[s + 1] = indptr[s] + (lens[s] < 3 ? lens[s] : 3);
        const size_t pn = (size_t)indptr[4] * 8 * dim;
        void *pq = xcalloc(pn, es), *po1 = xcalloc(pn, es), *po2 = xcalloc(pn, es);
        for (size_t i = 0; i < pn; i++) store(dt, pq, i, (float)((i * 2654435761u) % 1000) / 500.0f - 1.0f);
        cr_assert_eq(pkv_attn_prefill_paged_cpu(&c.sh, 4, indptr, pq, &c.kv, po1), PKV_OK);
        cr_assert_eq(pkv_attn_prefill_contig_cpu(&c.sh, 4, indptr, pq, &ck, po2), PKV_OK);
        cr_assert_eq(memcmp(po1, po2, pn * es), 0, "%s: paged prefill != carved contiguous prefill",
                     pkv_dtype_name(dt));
        indptr[4] = indptr[3] + lens[3] + 1; // more rows than the sequence has
        cr_assert_eq(pkv_attn_prefill_contig_cpu(&c.sh, 4, indptr, pq, &ck, po2), PKV_ERR_INVALID_ARG);
        free(pq);
        free(po1);
        free(po2);
        // A negative offset is refused and nothing is written.
        offs[2] = -(int64_t)dim;
        memset(contig, 0xab, on * es);
        cr_assert_eq(pkv_attn_decode_contig_cpu(&c.sh, 4, c.q, &ck, contig), PKV_ERR_INVALID_ARG);
        for (size_t i = 0; i < on * es; i++)
            cr_assert_eq(((unsigned char *)contig)[i], 0xab, "output written on a refused call");
        free(paged);
        free(contig);
        free(kc);
        free(vc);
        free_case(&c);
    }
}

// ---------------------------------------------------------------- prefill

// Prefill of packed prompts equals decode of each prompt token with the context
// cut at its position, and the reference with the causal mask.
Test(attention_prefill, equals_decode_token_by_token) {
    for (int di = 0; di < 3; di++) {
        int32_t lens[4] = {40, 17, 1, 70};
        int32_t prompt[4] = {40, 5, 1, 0}; // whole, tail (cached prefix), one, none
        pcase c = make_case(all_dtypes[di], 6, 3, 64, 8, 4, lens, 0, 0, 1.0);
        const pkv_dtype dt = c.sh.dtype;
        const size_t es = pkv_dtype_size(dt);
        const uint32_t dim = 64;
        const uint32_t heads = 6;
        int32_t indptr[5] = {0};
        for (int s = 0; s < 4; s++) {
            indptr[s + 1] = indptr[s] + prompt[s];
        }
        uint32_t rows = (uint32_t)indptr[4];
        size_t rn = (size_t)rows * heads * dim;
        void *q = xcalloc(rn, es);
        for (size_t i = 0; i < rn; i++) {
            store(dt, q, i, rng_unit());
        }
        void *out = xcalloc(rn, es);
        cr_assert_eq(pkv_attn_prefill_paged_cpu(&c.sh, 4, indptr, q, &c.kv, out), PKV_OK);
        double *ref = xcalloc(dim, sizeof(double));
        void *one = xcalloc((size_t)heads * dim, es);
        for (uint32_t s = 0; s < 4; s++) {
            for (int32_t j = 0; j < prompt[s]; j++) {
                uint32_t r = (uint32_t)(indptr[s] + j);
                int32_t ctx = lens[s] - prompt[s] + j + 1;
                // Decode of this row alone, through sequence s's table.
                pkv_attn_paged_kv kv1 = c.kv;
                kv1.block_tables = c.tables + (size_t)s * c.kv.max_blocks_per_seq;
                kv1.seq_lens = &ctx;
                const char *qrow = (const char *)q + (size_t)r * heads * dim * es;
                cr_assert_eq(pkv_attn_decode_paged_cpu(&c.sh, 1, qrow, &kv1, one), PKV_OK);
                cr_assert_eq(memcmp(one, (char *)out + (size_t)r * heads * dim * es,
                                    (size_t)heads * dim * es),
                             0, "%s seq %u token %d: prefill != decode", pkv_dtype_name(dt), s,
                             j);
                for (uint32_t h = 0; h < heads; h++) {
                    ref_one(&c, q, (size_t)r * heads + h, s, h, (uint32_t)ctx, ref);
                    for (uint32_t d = 0; d < dim; d++) {
                        double got = load(dt, out, ((size_t)r * heads + h) * dim + d);
                        double tol = ATOL + unit_roundoff(dt) * fabs(ref[d]);
                        cr_assert(fabs(got - ref[d]) <= tol, "%s seq %u tok %d: %g vs %g",
                                  pkv_dtype_name(dt), s, j, got, ref[d]);
                    }
                }
            }
        }
        free(one);
        free(ref);
        free(q);
        free(out);
        free_case(&c);
    }
}

// ---------------------------------------------------------------- cache write / copy

Test(attention_cache, write_puts_rows_in_their_slots_and_skips_negative) {
    for (int di = 0; di < 3; di++) {
        const pkv_dtype dt = all_dtypes[di];
        const size_t es = pkv_dtype_size(dt);
        pkv_attn_shape sh = {4, 2, 24, dt, 0.2f, 0};
        const uint32_t bs = 8;
        const uint32_t nblk = 5;
        const uint64_t bstride = 2ull * bs * 24; // HND: [kv_heads][bs][dim]
        size_t n = nblk * bstride;
        void *kc = xcalloc(n, es);
        void *vc = xcalloc(n, es);
        int64_t slots[6] = {0, 39, -1, 17, 8, 23};
        size_t tn = (size_t)6 * 2 * 24;
        void *k = xcalloc(tn, es);
        void *v = xcalloc(tn, es);
        for (size_t i = 0; i < tn; i++) {
            store(dt, k, i, rng_unit());
            store(dt, v, i, rng_unit());
        }
        cr_assert_eq(pkv_attn_cache_write_cpu(&sh, 6, k, v, slots, kc, vc, bstride, bs * 24, 24,
                                              bs, nblk),
                     PKV_OK);
        size_t written = 0;
        for (int i = 0; i < 6; i++) {
            if (slots[i] < 0) {
                continue;
            }
            for (uint32_t h = 0; h < 2; h++) {
                size_t dst = (size_t)(slots[i] / bs) * bstride + h * bs * 24 +
                             (size_t)(slots[i] % bs) * 24;
                size_t src = ((size_t)i * 2 + h) * 24;
                cr_assert_eq(memcmp((char *)kc + dst * es, (char *)k + src * es, 24 * es), 0);
                cr_assert_eq(memcmp((char *)vc + dst * es, (char *)v + src * es, 24 * es), 0);
                written += 24;
            }
        }
        size_t nonzero = 0; // nothing else was touched
        for (size_t i = 0; i < n * es; i++) {
            nonzero += ((unsigned char *)kc)[i] != 0;
        }
        cr_assert_leq(nonzero, written * es);
        // One bad slot: refused, and nothing written.
        int64_t bad[2] = {3, 40};
        memset(kc, 0, n * es);
        cr_assert_eq(pkv_attn_cache_write_cpu(&sh, 2, k, v, bad, kc, vc, bstride, bs * 24, 24, bs,
                                              nblk),
                     PKV_ERR_INVALID_ARG);
        for (size_t i = 0; i < n * es; i++) {
            cr_assert_eq(((unsigned char *)kc)[i], 0, "a refused write must write nothing");
        }
        free(kc);
        free(vc);
        free(k);
        free(v);
    }
}

Test(attention_cache, copy_blocks_copies_every_layer) {
    const uint32_t layers = 3;
    const uint32_t nblk = 6;
    const uint64_t bstride = 40;
    const uint64_t lstride = nblk * bstride;
    float *base = xcalloc(layers * lstride, sizeof(float));
    for (size_t i = 0; i < layers * lstride; i++) {
        base[i] = (float)i;
    }
    pkv_block_copy cp[2] = {{1, 4}, {5, 0}};
    cr_assert_eq(pkv_attn_copy_blocks_cpu(PKV_DTYPE_F32, base, layers, lstride, bstride, 30,
                                          nblk, cp, 2),
                 PKV_OK);
    for (uint32_t l = 0; l < layers; l++) {
        for (uint32_t b = 0; b < nblk; b++) {
            for (uint32_t e = 0; e < bstride; e++) {
                uint32_t src = b;
                if (e < 30 && b == 4) {
                    src = 1;
                } else if (e < 30 && b == 0) {
                    src = 5;
                }
                float want = (float)(l * lstride + src * bstride + e);
                cr_assert_eq(base[l * lstride + b * bstride + e], want, "layer %u block %u el %u",
                             l, b, e);
            }
        }
    }
    pkv_block_copy bad[3] = {{0, 6}, {2, 2}, {-1, 3}};
    for (int i = 0; i < 3; i++) {
        cr_assert_eq(pkv_attn_copy_blocks_cpu(PKV_DTYPE_F32, base, layers, lstride, bstride, 30,
                                              nblk, &bad[i], 1),
                     PKV_ERR_INVALID_ARG);
    }
    cr_assert_eq(pkv_attn_copy_blocks_cpu(PKV_DTYPE_F32, base, layers, lstride, bstride, 41, nblk,
                                          cp, 1),
                 PKV_ERR_INVALID_ARG, "block_elems > block_stride");
    cr_assert_eq(pkv_attn_copy_blocks_cpu(PKV_DTYPE_F32, NULL, layers, lstride, bstride, 30, nblk,
                                          cp, 1),
                 PKV_ERR_INVALID_ARG);
    cr_assert_eq(pkv_attn_copy_blocks_cpu(PKV_DTYPE_F32, base, 0, lstride, bstride, 30, nblk, cp,
                                          1),
                 PKV_ERR_INVALID_ARG, "zero layers");
    cr_assert_eq(pkv_attn_copy_blocks_cpu(PKV_DTYPE_F32, base, layers, lstride, bstride, 0, nblk,
                                          cp, 1),
                 PKV_ERR_INVALID_ARG, "zero block_elems");
    cr_assert_eq(pkv_attn_copy_blocks_cpu(PKV_DTYPE_F32, base, layers, lstride, bstride, 30, nblk,
                                          NULL, 1),
                 PKV_ERR_INVALID_ARG, "NULL copies");
    cr_assert_eq(pkv_attn_copy_blocks_cpu(PKV_DTYPE_F32, base, layers, lstride, bstride, 30, 0, cp,
                                          1),
                 PKV_ERR_INVALID_ARG, "zero blocks");
    cr_assert_eq(pkv_attn_copy_blocks_cpu((pkv_dtype)7, base, layers, lstride, bstride, 30, nblk,
                                          cp, 1),
                 PKV_ERR_INVALID_ARG);
    free(base);
}

// ---------------------------------------------------------------- real allocator

// Block tables from pkv_seqset, storage from pkv_cache on the host backend, K/V
// written through the slots pkv_seq_append returns, a fork that shares blocks and
// a copy-on-write executed by pkv_attn_copy_blocks_cpu.
Test(attention_alloc, decode_through_pool_seqset_and_cache) {
    const uint32_t bs = 16;
    const uint32_t kvh = 2;
    const uint32_t heads = 4;
    const uint32_t dim = 64;
    const pkv_dtype dt = PKV_DTYPE_F16;
    const size_t es = 2;
    pkv_pool *pool = NULL;
    pkv_seqset *set = NULL;
    pkv_backend *be = NULL;
    pkv_cache *cache = NULL;
    cr_assert_eq(pkv_pool_create(64, &pool), PKV_OK);
    cr_assert_eq(pkv_seqset_create(pool, bs, &set), PKV_OK);
    cr_assert_eq(pkv_backend_create_host(&be), PKV_OK);
    pkv_cache_params cp = pkv_cache_params_default();
    cp.num_layers = 2;
    cp.kv_heads = kvh;
    cp.head_dim = dim;
    cp.block_size = bs;
    cp.dtype = dt;
    cr_assert_eq(pkv_cache_create(&cp, pool, be, &cache), PKV_OK);
    pkv_cache_geometry g;
    cr_assert_eq(pkv_cache_get_geometry(cache, &g), PKV_OK);
    char *data = pkv_cache_data(cache);
    const uint32_t layer = 1;
    char *kc = data + g.layer_stride * layer * es;
    char *vc = kc + g.kv_stride * es;
    uint64_t arena_elems = pkv_cache_arena_bytes(cache) / es;
    for (uint64_t i = 0; i < arena_elems; i++) {
        store(dt, data, i, NAN);
    }
    pkv_attn_shape sh = {heads, kvh, dim, dt, 0.125f, 0};
    // Append tokens in steps and write their K/V; seq 1 is a fork of seq 0 at 37
    // tokens, so it shares two full blocks and copies the partial third on write.
    pkv_seq_id ids[2];
    cr_assert_eq(pkv_seq_create(set, &ids[0]), PKV_OK);
    int64_t slots[64];
    size_t tn = (size_t)64 * kvh * dim;
    void *k = xcalloc(tn, es);
    void *v = xcalloc(tn, es);
    // (sequence index, tokens): seq 1 forks seq 0 after the first append.
    const uint32_t plan[3][2] = {{0, 37}, {0, 20}, {1, 9}};
    for (int step = 0; step < 3; step++) {
        if (step == 1) {
            cr_assert_eq(pkv_seq_fork(set, ids[0], &ids[1]), PKV_OK);
        }
        uint32_t s = plan[step][0];
        uint32_t n = plan[step][1];
        cr_assert_eq(pkv_seq_append(set, ids[s], n, slots), PKV_OK);
        pkv_block_copy copies[8];
        uint32_t nc = 0;
        cr_assert_eq(pkv_seqset_take_copies(set, copies, 8, &nc), PKV_OK);
        cr_assert_eq(nc, step == 1 ? 1u : 0u, "the shared partial block is copied once");
        cr_assert_eq(pkv_attn_copy_blocks_cpu(dt, data, cp.num_layers, g.layer_stride,
                                              g.block_stride, 2 * g.kv_stride, 64, copies, nc),
                     PKV_OK);
        for (size_t i = 0; i < (size_t)n * kvh * dim; i++) {
            store(dt, k, i, rng_unit());
            store(dt, v, i, rng_unit());
        }
        cr_assert_eq(pkv_attn_cache_write_cpu(&sh, n, k, v, slots, kc, vc, g.block_stride,
                                              g.head_stride, g.token_stride, bs, 64),
                     PKV_OK);
    }
    cr_assert_eq(pkv_seqset_validate(set, 1), PKV_OK);
    int32_t table[2 * 8];
    int32_t lens[2];
    cr_assert_eq(pkv_seqset_export_padded(set, ids, 2, 8, -1, table, lens), PKV_OK);
    cr_assert_eq(lens[0], 57);
    cr_assert_eq(lens[1], 46);
    cr_assert_eq(table[0], table[8], "the fork shares its first block");
    pcase c;
    memset(&c, 0, sizeof c);
    c.sh = sh;
    c.num_seqs = 2;
    c.lens = lens;
    c.tables = table;
    c.kc = kc;
    c.vc = vc;
    c.kv = (pkv_attn_paged_kv){kc, vc, g.block_stride, g.head_stride, g.token_stride, bs, 64,
                               table, 8, lens};
    c.q = xcalloc((size_t)2 * heads * dim, es);
    for (size_t i = 0; i < (size_t)2 * heads * dim; i++) {
        store(dt, c.q, i, rng_unit());
    }
    void *out = run_paged(&c);
    check_decode(&c, out, "allocator-built tables");
    free(out);
    free(c.q);
    free(k);
    free(v);
    pkv_cache_destroy(cache);
    pkv_backend_destroy(be);
    pkv_seqset_destroy(set);
    pkv_pool_destroy(pool);
}

// ---------------------------------------------------------------- bad arguments

// Every refusal must leave `out` untouched (a sentinel byte pattern).
static void expect_refused(pkv_status got, pkv_status want, const void *out, size_t bytes,
                           const char *what) {
    cr_assert_eq(got, want, "%s: got %s, want %s", what, pkv_status_str(got),
                 pkv_status_str(want));
    for (size_t i = 0; i < bytes; i++) {
        cr_assert_eq(((const unsigned char *)out)[i], 0xab, "%s: out was written", what);
    }
}

Test(attention_args, decode_paged_refuses_every_bad_argument) {
    int32_t lens[2] = {20, 9};
    pcase c = make_case(PKV_DTYPE_F32, 4, 2, 16, 8, 2, lens, 0, 0, 1.0);
    size_t bytes = (size_t)2 * 4 * 16 * 4;
    unsigned char *out = xcalloc(bytes, 1);
    memset(out, 0xab, bytes);
#define PAGED(sh, kv, q_, o_, what, want)                                                    \
    expect_refused(pkv_attn_decode_paged_cpu((sh), 2, (q_), (kv), (o_)), (want), out, bytes, \
                   what)
    pkv_attn_shape sh = c.sh;
    pkv_attn_paged_kv kv = c.kv;
    PAGED(NULL, &kv, c.q, out, "NULL shape", PKV_ERR_INVALID_ARG);
    PAGED(&sh, NULL, c.q, out, "NULL kv", PKV_ERR_INVALID_ARG);
    PAGED(&sh, &kv, NULL, out, "NULL q", PKV_ERR_INVALID_ARG);
    expect_refused(pkv_attn_decode_paged_cpu(&sh, 2, c.q, &kv, NULL), PKV_ERR_INVALID_ARG, out,
                   bytes, "NULL out");
    sh.num_kv_heads = 3;
    PAGED(&sh, &kv, c.q, out, "kv heads do not divide heads", PKV_ERR_INVALID_ARG);
    sh.num_kv_heads = 0;
    PAGED(&sh, &kv, c.q, out, "zero kv heads", PKV_ERR_INVALID_ARG);
    sh = c.sh;
    sh.num_heads = 0;
    PAGED(&sh, &kv, c.q, out, "zero heads", PKV_ERR_INVALID_ARG);
    sh = c.sh;
    sh.head_dim = 0;
    PAGED(&sh, &kv, c.q, out, "head_dim 0", PKV_ERR_INVALID_ARG);
    sh.head_dim = PKV_ATTN_CPU_MAX_HEAD_DIM + 1;
    PAGED(&sh, &kv, c.q, out, "head_dim too large", PKV_ERR_UNSUPPORTED);
    sh = c.sh;
    sh.dtype = (pkv_dtype)3;
    PAGED(&sh, &kv, c.q, out, "bad dtype", PKV_ERR_INVALID_ARG);
    sh = c.sh;
    sh.scale = NAN;
    PAGED(&sh, &kv, c.q, out, "NaN scale", PKV_ERR_INVALID_ARG);
    sh = c.sh;
    kv.k_cache = NULL;
    PAGED(&sh, &kv, c.q, out, "NULL k_cache", PKV_ERR_INVALID_ARG);
    kv = c.kv;
    kv.v_cache = NULL;
    PAGED(&sh, &kv, c.q, out, "NULL v_cache", PKV_ERR_INVALID_ARG);
    kv = c.kv;
    kv.block_tables = NULL;
    PAGED(&sh, &kv, c.q, out, "NULL block_tables", PKV_ERR_INVALID_ARG);
    kv = c.kv;
    kv.seq_lens = NULL;
    PAGED(&sh, &kv, c.q, out, "NULL seq_lens", PKV_ERR_INVALID_ARG);
    kv = c.kv;
    kv.block_size = 0;
    PAGED(&sh, &kv, c.q, out, "block_size 0", PKV_ERR_INVALID_ARG);
    kv = c.kv;
    kv.num_blocks = 0;
    PAGED(&sh, &kv, c.q, out, "num_blocks 0", PKV_ERR_INVALID_ARG);
    kv = c.kv;
    kv.max_blocks_per_seq = 0;
    PAGED(&sh, &kv, c.q, out, "max_blocks 0", PKV_ERR_INVALID_ARG);
    kv = c.kv;
    kv.max_blocks_per_seq = 2; // seq 0 needs 3 blocks of 8
    PAGED(&sh, &kv, c.q, out, "length beyond the table", PKV_ERR_INVALID_ARG);
    kv = c.kv;
    int32_t bad_lens[2] = {20, 0};
    kv.seq_lens = bad_lens;
    PAGED(&sh, &kv, c.q, out, "length 0", PKV_ERR_INVALID_ARG);
    bad_lens[1] = -5;
    PAGED(&sh, &kv, c.q, out, "negative length", PKV_ERR_INVALID_ARG);
    kv = c.kv;
    int32_t saved = c.tables[1];
    c.tables[1] = -1;
    PAGED(&sh, &kv, c.q, out, "block id -1", PKV_ERR_INVALID_ARG);
    c.tables[1] = (int32_t)c.kv.num_blocks;
    PAGED(&sh, &kv, c.q, out, "block id == num_blocks", PKV_ERR_INVALID_ARG);
    c.tables[1] = saved;
#undef PAGED
    // Zero sequences: nothing to do, nothing written.
    expect_refused(pkv_attn_decode_paged_cpu(&c.sh, 0, c.q, &c.kv, out), PKV_OK, out, bytes,
                   "zero sequences");
    free(out);
    free_case(&c);
}

Test(attention_args, decode_contig_and_prefill_refuse_bad_arguments) {
    int32_t lens[2] = {20, 9};
    pcase c = make_case(PKV_DTYPE_BF16, 4, 2, 16, 8, 2, lens, 0, 0, 1.0);
    size_t bytes = (size_t)2 * 4 * 16 * 2;
    unsigned char *out = xcalloc(bytes, 1);
    memset(out, 0xab, bytes);
    uint16_t kc[2 * 2 * 32 * 16];
    int32_t clens[2] = {20, 9};
    pkv_attn_contig_kv ck = {kc, kc, 2 * 32 * 16, 32 * 16, 16, 32, clens, NULL};
    pkv_attn_contig_kv ck2 = ck;
    expect_refused(pkv_attn_decode_contig_cpu(NULL, 2, c.q, &ck, out), PKV_ERR_INVALID_ARG, out,
                   bytes, "contig NULL shape");
    expect_refused(pkv_attn_decode_contig_cpu(&c.sh, 2, c.q, NULL, out), PKV_ERR_INVALID_ARG,
                   out, bytes, "contig NULL kv");
    expect_refused(pkv_attn_decode_contig_cpu(&c.sh, 2, NULL, &ck, out), PKV_ERR_INVALID_ARG,
                   out, bytes, "contig NULL q");
    ck2.k_cache = NULL;
    expect_refused(pkv_attn_decode_contig_cpu(&c.sh, 2, c.q, &ck2, out), PKV_ERR_INVALID_ARG,
                   out, bytes, "contig NULL k");
    ck2 = ck;
    ck2.seq_lens = NULL;
    expect_refused(pkv_attn_decode_contig_cpu(&c.sh, 2, c.q, &ck2, out), PKV_ERR_INVALID_ARG,
                   out, bytes, "contig NULL lens");
    ck2 = ck;
    ck2.max_seq_len = 19;
    expect_refused(pkv_attn_decode_contig_cpu(&c.sh, 2, c.q, &ck2, out), PKV_ERR_INVALID_ARG,
                   out, bytes, "contig length beyond max_seq_len");
    clens[1] = 0;
    expect_refused(pkv_attn_decode_contig_cpu(&c.sh, 2, c.q, &ck, out), PKV_ERR_INVALID_ARG, out,
                   bytes, "contig length 0");
    // Prefill: 3 + 2 prompt rows.
    size_t pbytes = (size_t)5 * 4 * 16 * 2;
    unsigned char *pout = xcalloc(pbytes, 1);
    memset(pout, 0xab, pbytes);
    void *q = xcalloc(pbytes, 1);
    int32_t ip[3] = {0, 3, 5};
    cr_assert_eq(pkv_attn_prefill_paged_cpu(&c.sh, 2, ip, q, &c.kv, pout), PKV_OK);
    memset(pout, 0xab, pbytes);
    expect_refused(pkv_attn_prefill_paged_cpu(&c.sh, 2, NULL, q, &c.kv, pout),
                   PKV_ERR_INVALID_ARG, pout, pbytes, "prefill NULL indptr");
    int32_t ip1[3] = {1, 3, 5};
    expect_refused(pkv_attn_prefill_paged_cpu(&c.sh, 2, ip1, q, &c.kv, pout),
                   PKV_ERR_INVALID_ARG, pout, pbytes, "prefill indptr[0] != 0");
    int32_t ip2[3] = {0, 3, 2};
    expect_refused(pkv_attn_prefill_paged_cpu(&c.sh, 2, ip2, q, &c.kv, pout),
                   PKV_ERR_INVALID_ARG, pout, pbytes, "prefill decreasing indptr");
    int32_t ip3[3] = {0, 3, 13};
    expect_refused(pkv_attn_prefill_paged_cpu(&c.sh, 2, ip3, q, &c.kv, pout),
                   PKV_ERR_INVALID_ARG, pout, pbytes, "prefill prompt longer than sequence");
    expect_refused(pkv_attn_prefill_paged_cpu(&c.sh, 2, ip, NULL, &c.kv, pout),
                   PKV_ERR_INVALID_ARG, pout, pbytes, "prefill NULL q");
    c.lens[0] = 100; // beyond the table
    expect_refused(pkv_attn_prefill_paged_cpu(&c.sh, 2, ip, q, &c.kv, pout),
                   PKV_ERR_INVALID_ARG, pout, pbytes, "prefill length beyond table");
    free(q);
    free(pout);
    free(out);
    free_case(&c);
}

Test(attention_args, cache_write_refuses_bad_arguments) {
    pkv_attn_shape sh = {2, 2, 8, PKV_DTYPE_F32, 1.0f, 0};
    float kc[4 * 2 * 4 * 8];
    float k[2 * 8] = {0};
    int64_t slots[1] = {0};
    pkv_status want = PKV_ERR_INVALID_ARG;
    cr_assert_eq(pkv_attn_cache_write_cpu(NULL, 1, k, k, slots, kc, kc, 64, 32, 8, 4, 4), want);
    cr_assert_eq(pkv_attn_cache_write_cpu(&sh, 1, NULL, k, slots, kc, kc, 64, 32, 8, 4, 4), want);
    cr_assert_eq(pkv_attn_cache_write_cpu(&sh, 1, k, NULL, slots, kc, kc, 64, 32, 8, 4, 4), want);
    cr_assert_eq(pkv_attn_cache_write_cpu(&sh, 1, k, k, NULL, kc, kc, 64, 32, 8, 4, 4), want);
    cr_assert_eq(pkv_attn_cache_write_cpu(&sh, 1, k, k, slots, NULL, kc, 64, 32, 8, 4, 4), want);
    cr_assert_eq(pkv_attn_cache_write_cpu(&sh, 1, k, k, slots, kc, NULL, 64, 32, 8, 4, 4), want);
    cr_assert_eq(pkv_attn_cache_write_cpu(&sh, 1, k, k, slots, kc, kc, 64, 32, 8, 0, 4), want);
    cr_assert_eq(pkv_attn_cache_write_cpu(&sh, 1, k, k, slots, kc, kc, 64, 32, 8, 4, 0), want);
    sh.dtype = (pkv_dtype)9;
    cr_assert_eq(pkv_attn_cache_write_cpu(&sh, 1, k, k, slots, kc, kc, 64, 32, 8, 4, 4), want);
    sh.dtype = PKV_DTYPE_F32;
    sh.num_kv_heads = 0;
    cr_assert_eq(pkv_attn_cache_write_cpu(&sh, 1, k, k, slots, kc, kc, 64, 32, 8, 4, 4), want);
    sh.num_kv_heads = 2;
    sh.head_dim = 0;
    cr_assert_eq(pkv_attn_cache_write_cpu(&sh, 1, k, k, slots, kc, kc, 64, 32, 8, 4, 4), want);
    sh.head_dim = 8;
    slots[0] = 16; // 4 blocks x 4 tokens = slots 0..15
    cr_assert_eq(pkv_attn_cache_write_cpu(&sh, 1, k, k, slots, kc, kc, 64, 32, 8, 4, 4), want);
    slots[0] = 15;
    cr_assert_eq(pkv_attn_cache_write_cpu(&sh, 1, k, k, slots, kc, kc, 64, 32, 8, 4, 4), PKV_OK);
}

// ---------------------------------------------------------------- CUDA plan (host math)

Test(attention_plan, split_k_heuristic) {
    pkv_attn_shape sh = {32, 8, 128, PKV_DTYPE_F16, 0.088f, 0};
    uint32_t n = 0;
    // 64 seqs x 8 kv heads = 512 thread blocks >= 2 x 132 SMs: no split.
    cr_assert_eq(pkv_attn_cuda_num_splits(&sh, 64, 4096, 132, &n), PKV_OK);
    cr_assert_eq(n, 1);
    // One sequence, 32k tokens: 8 thread blocks -> split to reach 264, capped at 64.
    cr_assert_eq(pkv_attn_cuda_num_splits(&sh, 1, 32768, 132, &n), PKV_OK);
    cr_assert(n > 1 && n <= 64, "n = %u", n);
    uint32_t part = 0;
    uint32_t parts = 0;
    pkvi_attn_partition(32768, n, &part, &parts);
    cr_assert_eq(parts, n);
    cr_assert_geq(part, 512u);
    cr_assert_eq(part % 256, 0);
    cr_assert_geq((uint64_t)part * parts, 32768u);
    // Short contexts are never split.
    cr_assert_eq(pkv_attn_cuda_num_splits(&sh, 1, 1000, 132, &n), PKV_OK);
    cr_assert_eq(n, 1);
    // 4k context at batch 1: at most 4096 / 512 = 8 partitions.
    cr_assert_eq(pkv_attn_cuda_num_splits(&sh, 1, 4096, 132, &n), PKV_OK);
    cr_assert_eq(n, 8);
    // Groups larger than 8 query heads use several thread blocks per kv head.
    uint32_t hpc = 0;
    uint32_t gpk = 0;
    pkv_attn_shape mqa = {32, 1, 128, PKV_DTYPE_F16, 0.088f, 0};
    pkvi_attn_cuda_groups(&mqa, &hpc, &gpk);
    cr_assert_eq(hpc, 8);
    cr_assert_eq(gpk, 4);
    cr_assert_eq(pkv_attn_cuda_num_splits(NULL, 1, 1000, 132, &n), PKV_ERR_INVALID_ARG);
    cr_assert_eq(pkv_attn_cuda_num_splits(&sh, 1, 1000, 0, &n), PKV_ERR_INVALID_ARG);
    cr_assert_eq(pkv_attn_cuda_num_splits(&sh, 1, 0, 132, &n), PKV_ERR_INVALID_ARG);
    size_t bytes = 1;
    cr_assert_eq(pkv_attn_cuda_workspace_bytes(&sh, 3, 1, &bytes), PKV_OK);
    cr_assert_eq(bytes, 0);
    cr_assert_eq(pkv_attn_cuda_workspace_bytes(&sh, 3, 5, &bytes), PKV_OK);
    cr_assert_eq(bytes, (size_t)3 * 32 * 5 * (128 + 2) * 4);
    cr_assert_eq(pkv_attn_cuda_workspace_bytes(&sh, 3, 0, &bytes), PKV_ERR_INVALID_ARG);
}

// Modelled time of a plan as docs/KERNELS.md states it: whole waves of `wave`
// blocks, each as long as a partition plus one tile of fixed cost.
static uint64_t wave_cost(uint64_t ctas, uint64_t wave, uint32_t max_context, uint32_t n) {
    uint32_t part = 0;
    uint32_t parts = 0;
    pkvi_attn_partition(max_context, n, &part, &parts);
    return (ctas * parts + wave - 1) / wave * ((uint64_t)part + 128u);
}

// Issue 24: the split count fills whole waves. The one-wave rule it replaces gave
// 5 splits at batch 8 (320 blocks = 1.21 waves of 264) and none at batch 40.
Test(attention_plan, split_k_fills_whole_waves) {
    pkv_attn_shape sh = {32, 8, 128, PKV_DTYPE_F16, 0.088f, 0};
    uint32_t n = 0;
    cr_assert_eq(pkv_attn_cuda_num_splits(&sh, 8, 32768, 132, &n), PKV_OK);
    cr_assert_eq(n, 4, "batch 8: 4 x 64 = 256 blocks, one wave; got %u", n);
    cr_assert_eq(pkv_attn_cuda_num_splits(&sh, 40, 32768, 132, &n), PKV_OK);
    cr_assert_eq(n, 4, "batch 40: 1.21 waves unsplit, 4.85 waves of 8k split; got %u", n);
    // Huge grids (2^32 - 1 sequences x 2^32 - 1 heads) are not split, and the cost
    // arithmetic does not wrap.
    pkv_attn_shape huge = {UINT32_MAX, UINT32_MAX, 128, PKV_DTYPE_F16, 0.088f, 0};
    cr_assert_eq(pkv_attn_cuda_num_splits(&huge, UINT32_MAX, UINT32_MAX, 132, &n), PKV_OK);
    cr_assert_eq(n, 1);
    // At 4 blocks per SM a wave is 528 blocks: 8 splits of batch 8 fill it.
    cr_assert_eq(pkvi_attn_num_splits(&sh, 8, 32768, 132, 4, 64, &n), PKV_OK);
    cr_assert_eq(n, 8);
    // A workspace that holds 3 partitions: the best plan of 1..3, not a cut-down 8.
    cr_assert_eq(pkvi_attn_num_splits(&sh, 8, 32768, 132, 4, 3, &n), PKV_OK);
    cr_assert_eq(n, 3);
    // Over a grid of batches, contexts and occupancies: the plan is never worse in
    // the model than no split, than the one-wave rule, or than any other count.
    const uint32_t ctxs[4] = {1024, 4096, 32768, 131072};
    for (uint32_t bpsm = 1; bpsm <= 6; bpsm++) {
        for (uint32_t c = 0; c < 4; c++) {
            for (uint32_t b = 1; b <= 300; b += 7) {
                cr_assert_eq(pkvi_attn_num_splits(&sh, b, ctxs[c], 132, bpsm, 64, &n), PKV_OK);
                uint64_t ctas = (uint64_t)b * 8;
                uint64_t wave = 132ull * bpsm;
                uint64_t got = wave_cost(ctas, wave, ctxs[c], n);
                uint32_t most = ctxs[c] / 512 < 64 ? ctxs[c] / 512 : 64;
                cr_assert(n >= 1 && (n == 1 || n <= most), "b %u ctx %u: n = %u", b, ctxs[c], n);
                for (uint32_t other = 1; other <= most; other++) {
                    cr_assert_leq(got, wave_cost(ctas, wave, ctxs[c], other),
                                  "b %u ctx %u bpsm %u: %u splits beat %u", b, ctxs[c], bpsm,
                                  other, n);
                }
            }
        }
    }
}

// Issue 15, defect 12: 2^16 sequences x 2^16 heads x 2^16 splits x head_dim 16382
// is exactly 2^64 bytes; it wrapped to 0 and came back OK.
Test(attention, workspace_bytes_refuses_sizes_that_wrap) {
    pkv_attn_shape sh = {65536, 1, 16382, PKV_DTYPE_F16, 0.1f, 0};
    size_t bytes = 123;
    cr_assert_eq(pkv_attn_cuda_workspace_bytes(&sh, 65536, 65536, &bytes), PKV_ERR_INVALID_ARG,
                 "a size of 2^64 bytes must be refused");
    cr_assert_eq(bytes, 123, "nothing written on error");
    cr_assert_eq(pkv_attn_cuda_workspace_bytes(&sh, 65536, UINT32_MAX, &bytes),
                 PKV_ERR_INVALID_ARG);
    // Just below the wrap: (2^16 - 1) splits fit in 64 bits (not in a 32-bit size_t).
    pkv_status st = pkv_attn_cuda_workspace_bytes(&sh, 65536, 65535, &bytes);
    if (sizeof(size_t) >= 8) {
        cr_assert_eq(st, PKV_OK);
        cr_assert_eq((uint64_t)bytes, 65536ull * 65536ull * 65535ull * (16382ull + 2) * 4);
    } else {
        cr_assert_eq(st, PKV_ERR_INVALID_ARG);
    }
}

// SPDX-License-Identifier: MIT
// Unit tests of the attention calls for heterogeneous layers (issue 23): decode and
// prefill under sliding and chunked-local windows, gpt-oss attention sinks, and MLA
// decode over a paged latent cache, against naive double-precision references
// written here with their own window rule (a token t is visible from position p
// when p - t < W, or when t and p share a chunk).
//
// What the caches look like: blocks shuffled; every slot no sequence uses is NaN;
// the table entries before a window's first block are PKV_BLOCK_NONE (-1) and the
// blocks they named are gone (NaN-filled blocks nobody points to); the tokens of
// the window's first block that lie before the window are NaN too (they are live
// in the real cache, but the result must not depend on them). Any read of a token
// outside the window therefore poisons the output.
//
// Tolerance |out - ref| <= ATOL + u |ref|: as tests/test_attention.c (fp32
// accumulation, u = half an ulp of the output dtype).
#include <criterion/criterion.h>
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "pkv/attention.h"
#include "src/attention/half.h"

#define ATOL 3e-5
#define NONE (-1) // PKV_BLOCK_NONE as an int32 table entry

// ---------------------------------------------------------------- helpers

static uint64_t seed = 0x2545f4914f6cdd1dull;

static uint64_t next_u64(void) { // xorshift64*
    seed ^= seed >> 12;
    seed ^= seed << 25;
    seed ^= seed >> 27;
    return seed * 0x2545f4914f6cdd1dull;
}

static double uniform(void) { // [-1, 1)
    return (double)(next_u64() >> 11) * 0x1p-52 - 1.0;
}

static void *zalloc(size_t n, size_t size) {
    void *p = calloc(n ? n : 1, size);
    cr_assert_not_null(p);
    return p;
}

static void put(pkv_dtype dt, void *a, size_t i, double x) {
    switch (dt) {
    case PKV_DTYPE_F16:
        ((uint16_t *)a)[i] = pkvi_f32_to_f16((float)x);
        break;
    case PKV_DTYPE_BF16:
        ((uint16_t *)a)[i] = pkvi_f32_to_bf16((float)x);
        break;
    default:
        ((float *)a)[i] = (float)x;
    }
}

static double get(pkv_dtype dt, const void *a, size_t i) {
    switch (dt) {
    case PKV_DTYPE_F16:
        return pkvi_f16_to_f32(((const uint16_t *)a)[i]);
    case PKV_DTYPE_BF16:
        return pkvi_bf16_to_f32(((const uint16_t *)a)[i]);
    default:
        return ((const float *)a)[i];
    }
}

// n elements of dt, every one NaN: what no call may read.
static void *poisoned(pkv_dtype dt, size_t n) {
    void *p = zalloc(n, pkv_dtype_size(dt));
    for (size_t i = 0; i < n; i++) put(dt, p, i, NAN);
    return p;
}

// The descriptor's table fields, for tables of `width` entries per sequence.
static void set_table(pkv_attn_paged_kv *kv, uint32_t bs, uint32_t nblocks, uint32_t width,
                      const int32_t *table, const int32_t *lens) {
    kv->block_size = bs;
    kv->num_blocks = nblocks;
    kv->max_blocks_per_seq = width;
    kv->block_tables = table;
    kv->seq_lens = lens;
}

static double half_ulp(pkv_dtype dt) {
    return dt == PKV_DTYPE_F16 ? 0x1p-11 : dt == PKV_DTYPE_BF16 ? 0x1p-8 : 0.0;
}

static const pkv_dtype kDtypes[] = {PKV_DTYPE_F32, PKV_DTYPE_F16, PKV_DTYPE_BF16};

// The test's own visibility rule (written independently of the library's
// begin-of-window arithmetic).
static int visible(const pkv_attn_window *w, uint32_t t, uint32_t p) {
    if (t > p) return 0;
    if (w->kind == PKV_ATTN_WINDOW_SLIDING) return p - t < w->window;
    if (w->kind == PKV_ATTN_WINDOW_CHUNKED) return t / w->window == p / w->window;
    return 1;
}

// First visible token of a query at p, by search.
static uint32_t first_visible(const pkv_attn_window *w, uint32_t p) {
    uint32_t t = 0;
    while (!visible(w, t, p)) t++;
    return t;
}

// ------------------------------------------------------ a windowed paged cache

// One layer's paged cache whose sequences keep only the blocks their earliest
// query (`first_q[s]`) can see.
typedef struct wcase {
    pkv_attn_shape sh;
    pkv_attn_window win;
    uint32_t num_seqs;
    int32_t *lens;   // [num_seqs]
    int32_t *table;  // [num_seqs][max_blocks]
    void *k;         // [num_blocks][kv_heads][block_size][dim]
    void *v;
    void *q;         // [rows][heads][dim]
    float *sinks;    // [heads] or NULL
    pkv_attn_paged_kv kv;
} wcase;

static size_t slot(const wcase *c, uint32_t s, uint32_t t, uint32_t kvh) {
    const int32_t blk = c->table[(size_t)s * c->kv.max_blocks_per_seq + t / c->kv.block_size];
    return (size_t)blk * c->kv.block_stride + kvh * c->kv.head_stride +
           (t % c->kv.block_size) * c->kv.token_stride;
}

// q_rows: query rows (num_seqs for decode); first_q[s]: the earliest query position
// of sequence s (decode: lens[s] - 1).
static wcase build(pkv_dtype dt, uint32_t heads, uint32_t kv_heads, uint32_t dim, uint32_t bs,
                   pkv_attn_window win, uint32_t n, const int32_t *lens, const uint32_t *first_q,
                   uint32_t q_rows) {
    wcase c;
    memset(&c, 0, sizeof c);
    c.sh = (pkv_attn_shape){heads, kv_heads, dim, dt, (float)(1.0 / sqrt(dim)), 0};
    c.win = win;
    c.num_seqs = n;
    c.lens = zalloc(n, sizeof(int32_t));
    uint32_t width = 1;
    for (uint32_t s = 0; s < n; s++) {
        c.lens[s] = lens[s];
        uint32_t nb = ((uint32_t)lens[s] + bs - 1) / bs;
        width = nb + 1 > width ? nb + 1 : width;
    }
    // Every block id a full-attention table would need, plus spares: the ids
    // before each window stay allocated (and NaN) but unreferenced.
    uint32_t nblocks = width * n + 2;
    uint32_t *perm = zalloc(nblocks, sizeof(uint32_t));
    for (uint32_t i = 0; i < nblocks; i++) perm[i] = i;
    for (uint32_t i = nblocks; i > 1; i--) {
        uint32_t j = (uint32_t)(next_u64() % i);
        uint32_t x = perm[i - 1];
        perm[i - 1] = perm[j];
        perm[j] = x;
    }
    c.table = zalloc((size_t)n * width, sizeof(int32_t));
    uint32_t used = 0;
    for (uint32_t s = 0; s < n; s++) {
        uint32_t nb = ((uint32_t)lens[s] + bs - 1) / bs;
        uint32_t b0 = first_visible(&win, first_q[s]) / bs;
        for (uint32_t b = 0; b < width; b++) {
            int32_t *e = &c.table[(size_t)s * width + b];
            *e = b < b0 ? NONE : b < nb ? (int32_t)perm[used++] : (int32_t)(0x7ffffff0u + b);
        }
    }
    free(perm);
    set_table(&c.kv, bs, nblocks, width, c.table, c.lens);
    c.kv.token_stride = dim;
    c.kv.head_stride = (uint64_t)bs * dim;
    c.kv.block_stride = (uint64_t)kv_heads * bs * dim;
    const size_t es = pkv_dtype_size(dt);
    c.k = poisoned(dt, (size_t)nblocks * c.kv.block_stride);
    c.v = poisoned(dt, (size_t)nblocks * c.kv.block_stride);
    // Only tokens some query of the sequence can see get values.
    for (uint32_t s = 0; s < n; s++) {
        for (uint32_t t = first_visible(&win, first_q[s]); t < (uint32_t)lens[s]; t++) {
            for (uint32_t h = 0; h < kv_heads; h++) {
                size_t at = slot(&c, s, t, h);
                for (uint32_t d = 0; d < dim; d++) {
                    put(dt, c.k, at + d, uniform());
                    put(dt, c.v, at + d, uniform());
                }
            }
        }
    }
    c.kv.k_cache = c.k;
    c.kv.v_cache = c.v;
    const size_t qn = (size_t)q_rows * heads * dim;
    c.q = zalloc(qn, es);
    for (size_t i = 0; i < qn; i++) put(dt, c.q, i, 2.0 * uniform());
    return c;
}

static wcase build_decode(pkv_dtype dt, uint32_t heads, uint32_t kv_heads, uint32_t dim,
                          uint32_t bs, pkv_attn_window win, uint32_t n, const int32_t *lens) {
    uint32_t *fq = zalloc(n, sizeof(uint32_t));
    for (uint32_t s = 0; s < n; s++) fq[s] = (uint32_t)lens[s] - 1;
    wcase c = build(dt, heads, kv_heads, dim, bs, win, n, lens, fq, n);
    free(fq);
    return c;
}

static void with_sinks(wcase *c, const float *values, uint32_t count) {
    c->sinks = zalloc(c->sh.num_heads, sizeof(float));
    for (uint32_t h = 0; h < c->sh.num_heads; h++) c->sinks[h] = values[h % count];
    c->win.sinks = c->sinks;
}

static void drop(wcase *c) {
    free(c->lens);
    free(c->table);
    free(c->k);
    free(c->v);
    free(c->q);
    free(c->sinks);
}

// Reference: query row `row` (head h) of sequence s at position p.
static void reference(const wcase *c, size_t row, uint32_t s, uint32_t h, uint32_t p,
                      double *out) {
    const uint32_t dim = c->sh.head_dim;
    const uint32_t kvh = h / (c->sh.num_heads / c->sh.num_kv_heads);
    const pkv_dtype dt = c->sh.dtype;
    double mx = c->win.sinks ? c->win.sinks[h] : -INFINITY;
    double *w = zalloc(p + 1, sizeof(double));
    for (uint32_t t = 0; t <= p; t++) {
        if (!visible(&c->win, t, p)) continue;
        size_t at = slot(c, s, t, kvh);
        double dotp = 0.0;
        for (uint32_t d = 0; d < dim; d++) {
            dotp += get(dt, c->q, (row * c->sh.num_heads + h) * dim + d) * get(dt, c->k, at + d);
        }
        w[t] = dotp * c->sh.scale;
        mx = w[t] > mx ? w[t] : mx;
    }
    double denom = c->win.sinks ? exp(c->win.sinks[h] - mx) : 0.0;
    for (uint32_t t = 0; t <= p; t++) {
        if (visible(&c->win, t, p)) {
            w[t] = exp(w[t] - mx);
            denom += w[t];
        }
    }
    for (uint32_t d = 0; d < dim; d++) out[d] = 0.0;
    for (uint32_t t = 0; t <= p; t++) {
        if (!visible(&c->win, t, p)) continue;
        size_t at = slot(c, s, t, kvh);
        for (uint32_t d = 0; d < dim; d++) out[d] += w[t] / denom * get(dt, c->v, at + d);
    }
    free(w);
}

static void expect_row(const wcase *c, const void *out, size_t row, uint32_t s, uint32_t p,
                       const char *what) {
    const uint32_t dim = c->sh.head_dim;
    double *ref = zalloc(dim, sizeof(double));
    for (uint32_t h = 0; h < c->sh.num_heads; h++) {
        reference(c, row, s, h, p, ref);
        for (uint32_t d = 0; d < dim; d++) {
            double got = get(c->sh.dtype, out, (row * c->sh.num_heads + h) * dim + d);
            double tol = ATOL + half_ulp(c->sh.dtype) * fabs(ref[d]);
            if (!(fabs(got - ref[d]) <= tol)) {
                double want = ref[d];
                free(ref);
                cr_assert_fail("%s: seq %u pos %u head %u dim %u: got %.9g want %.9g", what, s, p,
                               h, d, got, want);
            }
        }
    }
    free(ref);
}

static void *decode(const wcase *c) {
    void *out = zalloc((size_t)c->num_seqs * c->sh.num_heads * c->sh.head_dim,
                       pkv_dtype_size(c->sh.dtype));
    pkv_status st = pkv_attn_decode_paged_window_cpu(&c->sh, &c->win, c->num_seqs, c->q, &c->kv,
                                                     out);
    cr_assert_eq(st, PKV_OK, "decode_paged_window_cpu: %s", pkv_status_str(st));
    return out;
}

static void check_decode(const wcase *c, const char *what) {
    void *out = decode(c);
    for (uint32_t s = 0; s < c->num_seqs; s++) {
        expect_row(c, out, s, s, (uint32_t)c->lens[s] - 1, what);
    }
    free(out);
}

// ---------------------------------------------------------------- windows

Test(attn_window, sliding_windows_smaller_and_larger_than_the_context) {
    // Windows 1, below a block, not a block multiple, a block multiple, equal to
    // and beyond some contexts; lengths around block edges.
    const uint32_t windows[] = {1, 5, 16, 37, 64, 300};
    const int32_t lens[] = {1, 15, 16, 17, 40, 64, 65, 129, 250};
    const uint32_t groups[][2] = {{4, 4}, {8, 2}, {8, 1}}; // GQA 1, 4, 8
    for (size_t wi = 0; wi < sizeof windows / sizeof *windows; wi++) {
        for (size_t di = 0; di < 3; di++) {
            const uint32_t *g = groups[(wi + di) % 3];
            pkv_attn_window w = {PKV_ATTN_WINDOW_SLIDING, windows[wi], NULL};
            wcase c = build_decode(kDtypes[di], g[0], g[1], 32, 16, w, 9, lens);
            check_decode(&c, "sliding");
            drop(&c);
        }
    }
}

Test(attn_window, chunked_windows_at_chunk_starts_and_ends) {
    // Chunk 32 with block 16 and block 12 (chunks not aligned to blocks): queries
    // exactly at a chunk start (one visible token), just before and after.
    const int32_t lens[] = {1, 2, 31, 32, 33, 64, 65, 96, 97, 100};
    const uint32_t block_sizes[] = {16, 12, 7};
    const uint32_t chunks[] = {32, 20, 1};
    for (size_t i = 0; i < 3; i++) {
        for (size_t di = 0; di < 3; di++) {
            pkv_attn_window w = {PKV_ATTN_WINDOW_CHUNKED, chunks[i], NULL};
            wcase c = build_decode(kDtypes[di], 8, 2, 24, block_sizes[i], w, 10, lens);
            check_decode(&c, "chunked");
            drop(&c);
        }
    }
}

Test(attn_window, gqa_groups_one_four_eight_with_odd_dims) {
    const int32_t lens[] = {200, 77, 3};
    const uint32_t shapes[][3] = {{5, 5, 7}, {12, 3, 40}, {16, 2, 64}, {8, 1, 128}};
    for (size_t i = 0; i < 4; i++) {
        pkv_attn_window w = {PKV_ATTN_WINDOW_SLIDING, 50, NULL};
        wcase c = build_decode(kDtypes[i % 3], shapes[i][0], shapes[i][1], shapes[i][2], 8, w, 3,
                               lens);
        check_decode(&c, "gqa");
        drop(&c);
    }
}

Test(attn_window, sinks_of_any_size_join_the_denominator) {
    // +-1e4 and +-40 overflow exp() in fp32 without the running max starting at the
    // sink; a sink of 1e4 gives (almost) zero output, -1e4 none at all.
    const float sinks[] = {-1e4f, -40.0f, -1.5f, 0.0f, 2.0f, 40.0f, 1e4f, 7.25f};
    const int32_t lens[] = {1, 9, 33, 130};
    const pkv_attn_window wins[] = {{PKV_ATTN_WINDOW_FULL, 0, NULL},
                                    {PKV_ATTN_WINDOW_SLIDING, 20, NULL},
                                    {PKV_ATTN_WINDOW_CHUNKED, 16, NULL}};
    for (size_t wi = 0; wi < 3; wi++) {
        for (size_t di = 0; di < 3; di++) {
            wcase c = build_decode(kDtypes[di], 8, 2, 16, 8, wins[wi], 4, lens);
            with_sinks(&c, sinks, 8);
            check_decode(&c, "sinks");
            drop(&c);
        }
    }
}

Test(attn_window, a_sink_is_exactly_one_more_logit_with_a_zero_value) {
    // One token of value v and score s against a sink k: out = v e^s / (e^s + e^k).
    const float kv_row[4] = {1.0f, -2.0f, 0.5f, 4.0f};
    float k[4];
    float q[4] = {1.0f, 0.0f, 0.0f, 0.0f};
    memcpy(k, kv_row, sizeof k); // score = q . k = 1 (scale 1)
    int32_t table[1] = {0};
    int32_t len = 1;
    pkv_attn_paged_kv kv = {k, kv_row, 4, 4, 4, 1, 1, table, 1, &len};
    pkv_attn_shape sh = {1, 1, 4, PKV_DTYPE_F32, 1.0f, 1};
    float sink = 1.0f; // e^1 / (e^1 + e^1) = 1/2
    pkv_attn_window w = {PKV_ATTN_WINDOW_FULL, 0, &sink};
    float out[4];
    cr_assert_eq(pkv_attn_decode_paged_window_cpu(&sh, &w, 1, q, &kv, out), PKV_OK);
    for (int d = 0; d < 4; d++) {
        cr_assert_float_eq(out[d], kv_row[d] * 0.5f, 1e-6f, "dim %d: %g", d, out[d]);
    }
}

Test(attn_window, full_window_without_sinks_is_the_plain_decode_bit_for_bit) {
    const int32_t lens[] = {5, 100, 33};
    for (size_t di = 0; di < 3; di++) {
        pkv_attn_window w = {PKV_ATTN_WINDOW_FULL, 0, NULL};
        wcase c = build_decode(kDtypes[di], 8, 2, 64, 16, w, 3, lens);
        void *a = decode(&c);
        size_t bytes = (size_t)3 * 8 * 64 * pkv_dtype_size(kDtypes[di]);
        void *b = zalloc(bytes, 1);
        cr_assert_eq(pkv_attn_decode_paged_cpu(&c.sh, 3, c.q, &c.kv, b), PKV_OK);
        cr_assert_eq(memcmp(a, b, bytes), 0, "dtype %d", (int)kDtypes[di]);
        free(a);
        free(b);
        drop(&c);
    }
}

Test(attn_window, contig_twin_equals_paged_bit_for_bit) {
    const int32_t lens[] = {70, 9, 128};
    const pkv_attn_window wins[] = {{PKV_ATTN_WINDOW_SLIDING, 23, NULL},
                                    {PKV_ATTN_WINDOW_CHUNKED, 32, NULL}};
    const float sinks[] = {0.5f, -3.0f, 9.0f};
    for (size_t wi = 0; wi < 2; wi++) {
        wcase c = build_decode(PKV_DTYPE_BF16, 6, 3, 32, 16, wins[wi], 3, lens);
        with_sinks(&c, sinks, 3);
        void *paged = decode(&c);
        // Copy each sequence's tokens into [seq][kv_head][128][dim] rows (NaN
        // where the paged cache has no value, as there).
        const uint32_t cap = 128;
        const size_t es = pkv_dtype_size(c.sh.dtype);
        const size_t row_elems = (size_t)3 * cap * 32;
        void *k = poisoned(c.sh.dtype, 3 * row_elems);
        void *v = poisoned(c.sh.dtype, 3 * row_elems);
        for (uint32_t s = 0; s < 3; s++) {
            uint32_t b0 = first_visible(&c.win, (uint32_t)lens[s] - 1);
            for (uint32_t t = b0; t < (uint32_t)lens[s]; t++) {
                for (uint32_t h = 0; h < 3; h++) {
                    size_t dst = s * row_elems + ((size_t)h * cap + t) * 32;
                    memcpy((char *)k + dst * es, (char *)c.k + slot(&c, s, t, h) * es, 32 * es);
                    memcpy((char *)v + dst * es, (char *)c.v + slot(&c, s, t, h) * es, 32 * es);
                }
            }
        }
        pkv_attn_contig_kv ck = {0};
        ck.k_cache = k;
        ck.v_cache = v;
        ck.seq_stride = row_elems;
        ck.head_stride = (uint64_t)cap * 32;
        ck.token_stride = 32;
        ck.max_seq_len = cap;
        ck.seq_lens = c.lens;
        void *contig = zalloc((size_t)3 * 6 * 32, es);
        cr_assert_eq(pkv_attn_decode_contig_window_cpu(&c.sh, &c.win, 3, c.q, &ck, contig), PKV_OK);
        cr_assert_eq(memcmp(paged, contig, (size_t)3 * 6 * 32 * es), 0);
        free(k);
        free(v);
        free(paged);
        free(contig);
        drop(&c);
    }
}

Test(attn_window, prefill_sees_each_rows_window) {
    // Two prompts: 40 new tokens after 60 cached, and a whole 37-token prompt; each
    // table keeps blocks from the first prompt row's window on.
    const int32_t lens[] = {100, 37};
    const int32_t indptr[] = {0, 40, 77};
    const pkv_attn_window wins[] = {{PKV_ATTN_WINDOW_SLIDING, 24, NULL},
                                    {PKV_ATTN_WINDOW_CHUNKED, 16, NULL}};
    const float sinks[] = {1.0f, -2.0f};
    for (size_t wi = 0; wi < 2; wi++) {
        for (size_t di = 0; di < 3; di++) {
            uint32_t fq[2] = {60, 0};
            wcase c = build(kDtypes[di], 4, 2, 16, 8, wins[wi], 2, lens, fq, 77);
            if (di == 1) with_sinks(&c, sinks, 2);
            void *out = zalloc((size_t)77 * 4 * 16, pkv_dtype_size(c.sh.dtype));
            pkv_status st = pkv_attn_prefill_paged_window_cpu(&c.sh, &c.win, 2, indptr, c.q,
                                                              &c.kv, out);
            cr_assert_eq(st, PKV_OK, "%s", pkv_status_str(st));
            for (uint32_t s = 0; s < 2; s++) {
                for (int32_t r = indptr[s]; r < indptr[s + 1]; r++) {
                    uint32_t p = (uint32_t)(lens[s] - (indptr[s + 1] - r));
                    expect_row(&c, out, (size_t)r, s, p, "prefill");
                }
            }
            free(out);
            drop(&c);
        }
    }
}

Test(attn_window, bad_windows_and_tables_are_refused) {
    const int32_t lens[] = {40};
    pkv_attn_window w = {PKV_ATTN_WINDOW_SLIDING, 10, NULL};
    wcase c = build_decode(PKV_DTYPE_F32, 2, 1, 8, 8, w, 1, lens);
    float out[16];
    // The window starts at token 30, block 3: entries 0..2 are -1 and accepted.
    cr_assert_eq(c.table[0], NONE);
    cr_assert_eq(c.table[2], NONE);
    cr_assert_eq(pkv_attn_decode_paged_window_cpu(&c.sh, &c.win, 1, c.q, &c.kv, out), PKV_OK);
    // The plain call reads every block and refuses the released ones.
    cr_assert_eq(pkv_attn_decode_paged_cpu(&c.sh, 1, c.q, &c.kv, out), PKV_ERR_INVALID_ARG);
    // Window 16 starts at token 24, still block 3; window 17 at token 23, block 2,
    // whose -1 is now an error.
    pkv_attn_window edge = {PKV_ATTN_WINDOW_SLIDING, 16, NULL};
    cr_assert_eq(pkv_attn_decode_paged_window_cpu(&c.sh, &edge, 1, c.q, &c.kv, out), PKV_OK);
    pkv_attn_window wider = {PKV_ATTN_WINDOW_SLIDING, 17, NULL};
    cr_assert_eq(pkv_attn_decode_paged_window_cpu(&c.sh, &wider, 1, c.q, &c.kv, out),
                 PKV_ERR_INVALID_ARG);
    pkv_attn_window full = {PKV_ATTN_WINDOW_FULL, 0, NULL};
    cr_assert_eq(pkv_attn_decode_paged_window_cpu(&c.sh, &full, 1, c.q, &c.kv, out),
                 PKV_ERR_INVALID_ARG);
    pkv_attn_window zero = {PKV_ATTN_WINDOW_CHUNKED, 0, NULL};
    cr_assert_eq(pkv_attn_decode_paged_window_cpu(&c.sh, &zero, 1, c.q, &c.kv, out),
                 PKV_ERR_INVALID_ARG);
    pkv_attn_window odd = {(pkv_attn_window_kind)7, 10, NULL};
    cr_assert_eq(pkv_attn_decode_paged_window_cpu(&c.sh, &odd, 1, c.q, &c.kv, out),
                 PKV_ERR_INVALID_ARG);
    cr_assert_eq(pkv_attn_decode_paged_window_cpu(&c.sh, NULL, 1, c.q, &c.kv, out),
                 PKV_ERR_INVALID_ARG);
    const float bad_sinks[2][2] = {{0.0f, NAN}, {INFINITY, 0.0f}};
    for (int i = 0; i < 2; i++) {
        pkv_attn_window ws = {PKV_ATTN_WINDOW_SLIDING, 10, bad_sinks[i]};
        cr_assert_eq(pkv_attn_decode_paged_window_cpu(&c.sh, &ws, 1, c.q, &c.kv, out),
                     PKV_ERR_INVALID_ARG);
    }
    // A block id in the window out of range.
    c.table[4] = (int32_t)c.kv.num_blocks;
    cr_assert_eq(pkv_attn_decode_paged_window_cpu(&c.sh, &c.win, 1, c.q, &c.kv, out),
                 PKV_ERR_INVALID_ARG);
    drop(&c);
}

// ---------------------------------------------------------------- MLA

// A paged latent cache: `n` sequences of lens[s] tokens, one vector of
// latent + rope elements per token (token-major blocks, padded rows of `pad`).
typedef struct mcase {
    pkv_attn_mla_shape sh;
    uint32_t n;
    int32_t *lens;
    int32_t *table;
    void *cache;
    void *q; // [n][heads][latent + rope]
    pkv_attn_paged_kv kv;
} mcase;

static size_t mla_slot(const mcase *c, uint32_t s, uint32_t t) {
    const int32_t blk = c->table[(size_t)s * c->kv.max_blocks_per_seq + t / c->kv.block_size];
    return (size_t)blk * c->kv.block_stride + (t % c->kv.block_size) * c->kv.token_stride;
}

static mcase build_mla(pkv_dtype dt, uint32_t heads, uint32_t latent, uint32_t rope,
                       uint32_t bs, uint32_t n, const int32_t *lens) {
    mcase c;
    memset(&c, 0, sizeof c);
    const uint32_t dk = latent + rope;
    c.sh = (pkv_attn_mla_shape){heads, latent, rope, dt, (float)(1.0 / sqrt(dk)), 0};
    c.n = n;
    c.lens = zalloc(n, sizeof(int32_t));
    uint32_t width = 1;
    for (uint32_t s = 0; s < n; s++) {
        c.lens[s] = lens[s];
        uint32_t nb = ((uint32_t)lens[s] + bs - 1) / bs;
        width = nb > width ? nb : width;
    }
    const uint32_t nblocks = width * n + 1;
    c.table = zalloc((size_t)n * width, sizeof(int32_t));
    for (uint32_t i = 0; i < n * width; i++) {
        // Reverse order, so that consecutive table entries are far apart.
        c.table[i] = (int32_t)(nblocks - 1 - i);
    }
    set_table(&c.kv, bs, nblocks, width, c.table, c.lens);
    c.kv.token_stride = dk + 3; // padded rows: the padding is NaN
    c.kv.block_stride = (uint64_t)bs * c.kv.token_stride;
    const size_t es = pkv_dtype_size(dt);
    c.cache = poisoned(dt, (size_t)nblocks * c.kv.block_stride);
    for (uint32_t s = 0; s < n; s++) {
        for (uint32_t t = 0; t < (uint32_t)lens[s]; t++) {
            for (uint32_t d = 0; d < dk; d++) put(dt, c.cache, mla_slot(&c, s, t) + d, uniform());
        }
    }
    c.kv.k_cache = c.cache;
    c.kv.v_cache = NULL; // unused: V is the latent part of the same vector
    const size_t qn = (size_t)n * heads * dk;
    c.q = zalloc(qn, es);
    for (size_t i = 0; i < qn; i++) put(dt, c.q, i, 3.0 * uniform());
    return c;
}

static void drop_mla(mcase *c) {
    free(c->lens);
    free(c->table);
    free(c->cache);
    free(c->q);
}

static void *run_mla(const mcase *c) {
    void *out = zalloc((size_t)c->n * c->sh.num_heads * c->sh.latent_dim,
                       pkv_dtype_size(c->sh.dtype));
    pkv_status st = pkv_attn_decode_mla_paged_cpu(&c->sh, c->n, c->q, &c->kv, out);
    cr_assert_eq(st, PKV_OK, "decode_mla_paged_cpu: %s", pkv_status_str(st));
    return out;
}

static void check_mla(const mcase *c, const char *what) {
    void *out = run_mla(c);
    const uint32_t dk = c->sh.latent_dim + c->sh.rope_dim;
    const uint32_t dl = c->sh.latent_dim;
    const pkv_dtype dt = c->sh.dtype;
    double *ref = zalloc(dl, sizeof(double));
    for (uint32_t s = 0; s < c->n; s++) {
        const uint32_t len = (uint32_t)c->lens[s];
        double *w = zalloc(len, sizeof(double));
        for (uint32_t h = 0; h < c->sh.num_heads; h++) {
            const size_t qrow = ((size_t)s * c->sh.num_heads + h) * dk;
            double mx = -INFINITY;
            for (uint32_t t = 0; t < len; t++) {
                double x = 0.0;
                for (uint32_t d = 0; d < dk; d++) {
                    x += get(dt, c->q, qrow + d) * get(dt, c->cache, mla_slot(c, s, t) + d);
                }
                w[t] = x * c->sh.scale;
                mx = w[t] > mx ? w[t] : mx;
            }
            double sum = 0.0;
            for (uint32_t t = 0; t < len; t++) sum += (w[t] = exp(w[t] - mx));
            for (uint32_t d = 0; d < dl; d++) {
                ref[d] = 0.0;
                for (uint32_t t = 0; t < len; t++) {
                    ref[d] += w[t] / sum * get(dt, c->cache, mla_slot(c, s, t) + d);
                }
                double got = get(dt, out, ((size_t)s * c->sh.num_heads + h) * dl + d);
                double tol = ATOL + half_ulp(dt) * fabs(ref[d]);
                cr_assert(fabs(got - ref[d]) <= tol, "%s: seq %u head %u dim %u: got %.9g want %.9g",
                          what, s, h, d, got, ref[d]);
            }
        }
        free(w);
    }
    free(ref);
    free(out);
}

Test(attn_mla, deepseek_dims_512_plus_64) {
    const int32_t lens[] = {1, 17, 100};
    for (size_t di = 0; di < 3; di++) {
        mcase c = build_mla(kDtypes[di], 16, 512, 64, 16, 3, lens);
        check_mla(&c, "512+64");
        drop_mla(&c);
    }
}

Test(attn_mla, small_dims_odd_blocks_and_no_rope) {
    const int32_t lens[] = {5, 64, 33, 2};
    const uint32_t dims[][3] = {{8, 4, 3}, {16, 0, 16}, {7, 5, 5}, {64, 16, 1}}; // latent, rope, heads
    for (size_t i = 0; i < 4; i++) {
        mcase c = build_mla(kDtypes[i % 3], dims[i][2], dims[i][0], dims[i][1], 1 + 4 * (uint32_t)i,
                            4, lens);
        check_mla(&c, "small");
        drop_mla(&c);
    }
}

// Why MLA can store a latent: attention over K and V expanded per head by the
// up-projections equals attention over the latent with the absorbed query, once
// its output goes through W_UV. Here in fp32 with random weights:
//   k_j^h = [c_j W_UK^h, r_j], v_j^h = c_j W_UV^h,
//   q_abs^h = W_UK^h q_nope^h (latent), the cache vector [c_j, r_j].
Test(attn_mla, absorbed_attention_equals_expanded_attention) {
    enum { H = 4, L = 32, R = 8, DN = 16, DV = 24, T = 45 };
    const double scale = 1.0 / sqrt((double)(DN + R));
    float *wuk = zalloc((size_t)H * L * DN, sizeof(float)); // [H][L][DN]
    float *wuv = zalloc((size_t)H * L * DV, sizeof(float)); // [H][L][DV]
    float *lat = zalloc((size_t)T * (L + R), sizeof(float)); // [T][L + R]
    float *qn = zalloc((size_t)H * DN, sizeof(float));       // [H][DN]
    float *qr = zalloc((size_t)H * R, sizeof(float));        // [H][R]
    for (size_t i = 0; i < (size_t)H * L * DN; i++) wuk[i] = (float)(0.3 * uniform());
    for (size_t i = 0; i < (size_t)H * L * DV; i++) wuv[i] = (float)(0.3 * uniform());
    for (size_t i = 0; i < (size_t)T * (L + R); i++) lat[i] = (float)uniform();
    for (size_t i = 0; i < (size_t)H * DN; i++) qn[i] = (float)(2.0 * uniform());
    for (size_t i = 0; i < (size_t)H * R; i++) qr[i] = (float)uniform();

    // Expanded attention, in double.
    double expanded[H][DV];
    for (int h = 0; h < H; h++) {
        double s[T];
        double mx = -INFINITY;
        for (int t = 0; t < T; t++) {
            double x = 0.0;
            for (int e = 0; e < DN; e++) {
                double k = 0.0;
                for (int l = 0; l < L; l++) k += (double)lat[t * (L + R) + l] * wuk[(h * L + l) * DN + e];
                x += (double)qn[h * DN + e] * k;
            }
            for (int r = 0; r < R; r++) x += (double)qr[h * R + r] * lat[t * (L + R) + L + r];
            s[t] = x * scale;
            mx = s[t] > mx ? s[t] : mx;
        }
        double sum = 0.0;
        for (int t = 0; t < T; t++) sum += (s[t] = exp(s[t] - mx));
        for (int e = 0; e < DV; e++) {
            double o = 0.0;
            for (int t = 0; t < T; t++) {
                double v = 0.0;
                for (int l = 0; l < L; l++) v += (double)lat[t * (L + R) + l] * wuv[(h * L + l) * DV + e];
                o += s[t] / sum * v;
            }
            expanded[h][e] = o;
        }
    }

    // Absorbed: q = [W_UK^h q_nope^h, q_rope^h]; the latent cache in blocks of 8.
    float *q = zalloc((size_t)H * (L + R), sizeof(float));
    for (int h = 0; h < H; h++) {
        for (int l = 0; l < L; l++) {
            double x = 0.0;
            for (int e = 0; e < DN; e++) x += (double)wuk[(h * L + l) * DN + e] * qn[h * DN + e];
            q[h * (L + R) + l] = (float)x;
        }
        for (int r = 0; r < R; r++) q[h * (L + R) + L + r] = qr[h * R + r];
    }
    enum { BS = 8, NB = (T + BS - 1) / BS };
    int32_t table[NB];
    for (int b = 0; b < NB; b++) table[b] = NB - 1 - b;
    float *cache = zalloc((size_t)NB * BS * (L + R), sizeof(float));
    for (int t = 0; t < T; t++) {
        memcpy(cache + ((size_t)table[t / BS] * BS + t % BS) * (L + R), lat + (size_t)t * (L + R),
               (L + R) * sizeof(float));
    }
    int32_t len = T;
    pkv_attn_paged_kv kv = {cache, NULL, (uint64_t)BS * (L + R), 0, L + R, BS, NB, table, NB, &len};
    pkv_attn_mla_shape sh = {H, L, R, PKV_DTYPE_F32, (float)scale, 1};
    float *o_lat = zalloc((size_t)H * L, sizeof(float));
    cr_assert_eq(pkv_attn_decode_mla_paged_cpu(&sh, 1, q, &kv, o_lat), PKV_OK);
    for (int h = 0; h < H; h++) {
        for (int e = 0; e < DV; e++) {
            double o = 0.0;
            for (int l = 0; l < L; l++) o += (double)o_lat[h * L + l] * wuv[(h * L + l) * DV + e];
            cr_assert(fabs(o - expanded[h][e]) <= 1e-4 + 1e-4 * fabs(expanded[h][e]),
                      "head %d dim %d: absorbed %.9g expanded %.9g", h, e, o, expanded[h][e]);
        }
    }
    free(wuk);
    free(wuv);
    free(lat);
    free(qn);
    free(qr);
    free(q);
    free(cache);
    free(o_lat);
}

Test(attn_mla, bad_arguments_are_refused) {
    const int32_t lens[] = {10};
    mcase c = build_mla(PKV_DTYPE_F32, 2, 8, 4, 4, 1, lens);
    float out[16];
    pkv_attn_mla_shape sh = c.sh;
    cr_assert_eq(pkv_attn_decode_mla_paged_cpu(NULL, 1, c.q, &c.kv, out), PKV_ERR_INVALID_ARG);
    cr_assert_eq(pkv_attn_decode_mla_paged_cpu(&sh, 1, c.q, NULL, out), PKV_ERR_INVALID_ARG);
    cr_assert_eq(pkv_attn_decode_mla_paged_cpu(&sh, 1, NULL, &c.kv, out), PKV_ERR_INVALID_ARG);
    sh.latent_dim = 0;
    cr_assert_eq(pkv_attn_decode_mla_paged_cpu(&sh, 1, c.q, &c.kv, out), PKV_ERR_INVALID_ARG);
    sh = c.sh;
    sh.num_heads = 0;
    cr_assert_eq(pkv_attn_decode_mla_paged_cpu(&sh, 1, c.q, &c.kv, out), PKV_ERR_INVALID_ARG);
    sh = c.sh;
    sh.latent_dim = PKV_ATTN_CPU_MAX_HEAD_DIM;
    cr_assert_eq(pkv_attn_decode_mla_paged_cpu(&sh, 1, c.q, &c.kv, out), PKV_ERR_UNSUPPORTED);
    sh = c.sh;
    sh.dtype = PKV_DTYPE_INT8;
    cr_assert_eq(pkv_attn_decode_mla_paged_cpu(&sh, 1, c.q, &c.kv, out), PKV_ERR_INVALID_ARG);
    c.table[2] = -1; // a released block inside the context
    cr_assert_eq(pkv_attn_decode_mla_paged_cpu(&c.sh, 1, c.q, &c.kv, out), PKV_ERR_INVALID_ARG);
    drop_mla(&c);
}

// SPDX-License-Identifier: MIT
// Tests of the decoder model: weight layout, random init, the forward pass
// against a naive reference written in tests/model_ref.h (GPT-2 style and
// Llama style with GQA), the step API on both stores, the llama2.c loader and
// every error path. Tolerance: logits within 1e-4 absolute of the reference
// (they are O(1); fp32 summation order alone moves them by ~1e-6).
#include <criterion/criterion.h>
#include <stdio.h>
#include <unistd.h>

#include "src/runtime/model/model_internal.h"
#include "model_ref.h"
#include "pkv/backend.h"
#include "pkv/cache.h"
#include "pkv/pool.h"
#include "pkv/seq.h"

#define TOL 1e-4f

static pkv_model *make(const pkv_model_config *c, uint64_t seed) {
    pkv_model_params p = pkv_model_params_default();
    p.seed = seed;
    pkv_model *m = NULL;
    cr_assert_eq(pkv_model_create(c, &p, &m), PKV_OK);
    return m;
}

static pkv_model_config tiny(void) {
    pkv_model_config c;
    cr_assert_eq(pkv_model_preset("tiny", &c), PKV_OK);
    return c;
}

// The reference view of a model's carved weights (Q, K, V split by row ranges).
static ref_model ref_of(const pkv_model *m) {
    ref_model r;
    memset(&r, 0, sizeof r);
    const pkv_model_config *c = &m->cfg;
    const pkvi_weights *w = &m->w;
    const size_t d = c->d_model, qd = m->q_dim, kvd = m->kv_dim, ff = c->d_ff, qkv = qd + 2 * kvd;
    cr_assert_leq(c->num_layers, REF_MAX_LAYERS);
    r.c = *c;
    r.wte = w->wte;
    r.wpe = w->wpe;
    r.lnf_w = w->lnf_w;
    r.lnf_b = w->lnf_b;
    r.lm_head = w->lm_head;
    for (size_t l = 0; l < c->num_layers; l++) {
        ref_layer *L = &r.layer[l];
        L->ln1_w = w->ln1_w + l * d;
        L->ln1_b = w->ln1_b ? w->ln1_b + l * d : NULL;
        L->ln2_w = w->ln2_w + l * d;
        L->ln2_b = w->ln2_b ? w->ln2_b + l * d : NULL;
        L->wq = w->wqkv + l * qkv * d;
        L->wk = L->wq + qd * d;
        L->wv = L->wk + kvd * d;
        if (w->bqkv) {
            L->bq = w->bqkv + l * qkv;
            L->bk = L->bq + qd;
            L->bv = L->bk + kvd;
        }
        L->wo = w->wo + l * d * qd;
        L->bo = w->bo ? w->bo + l * d : NULL;
        L->w_up = w->w_up + l * ff * d;
        L->b_up = w->b_up ? w->b_up + l * ff : NULL;
        L->w_gate = w->w_gate ? w->w_gate + l * ff * d : NULL;
        L->w_down = w->w_down + l * d * ff;
        L->b_down = w->b_down ? w->b_down + l * d : NULL;
    }
    return r;
}

static void fill_tokens(int32_t *t, uint32_t n, uint32_t vocab, uint32_t salt) {
    for (uint32_t i = 0; i < n; i++) t[i] = (int32_t)((i * 7919u + salt * 104729u + 13u) % vocab);
}

Test(model, weight_count_equals_param_count) {
    const char *const *names = pkv_model_preset_names();
    for (int i = 0; names[i]; i++) {
        pkv_model_config c;
        cr_assert_eq(pkv_model_preset(names[i], &c), PKV_OK);
        // A published count (MoE, MLA, state layers) is not the runtime's weight layout.
        if (c.total_params) continue;
        cr_expect_eq(pkvi_weights_count(&c), pkv_model_param_count(&c), "%s", names[i]);
        cr_expect_eq(pkv_model_weight_bytes(&c), 4 * pkv_model_param_count(&c), "%s", names[i]);
    }
    pkv_model_config c = small_llama_config();
    cr_expect_eq(pkvi_weights_count(&c), pkv_model_param_count(&c));
    // DESIGN.md's example, which pkv-size prints: GPT-3 175B, fp16, 2048 tokens.
    pkv_model_config g3;
    pkv_model_preset("gpt3-175b", &g3);
    cr_expect_eq(pkv_model_kv_bytes_per_token(&g3, 2) * 2048, 9663676416ull);
    // gpt2-small has the published ~124M parameters.
    pkv_model_config g;
    pkv_model_preset("gpt2-small", &g);
    cr_expect(pkv_model_param_count(&g) > 124000000ull && pkv_model_param_count(&g) < 125000000ull);
}

Test(model, carved_tensors_tile_the_block) {
    pkv_model_config c = tiny();
    pkv_model *m = make(&c, 3);
    // Tensors follow each other with no gap: the last ends at the block's end.
    const float *end = m->weights_mem + pkvi_weights_count(&c);
    cr_expect_eq(m->w.lnf_b + c.d_model, end);
    cr_expect_eq(m->w.lm_head, m->w.wte, "tiny ties the LM head to the embedding");
    pkv_model_destroy(m);
    c = small_llama_config();
    m = make(&c, 3);
    cr_expect_null(m->w.wpe);
    cr_expect_null(m->w.bqkv);
    cr_expect_eq(m->w.lm_head + (size_t)c.vocab_size * c.d_model,
                 m->weights_mem + pkvi_weights_count(&c));
    pkv_model_destroy(m);
}

Test(model, same_seed_same_weights_other_seed_differs) {
    pkv_model_config c = tiny();
    pkv_model *a = make(&c, 42), *b = make(&c, 42), *o = make(&c, 43);
    size_t n = (size_t)pkvi_weights_count(&c);
    cr_expect_eq(memcmp(a->weights_mem, b->weights_mem, n * sizeof(float)), 0);
    cr_expect_neq(memcmp(a->weights_mem, o->weights_mem, n * sizeof(float)), 0);
    // Init statistics: uniform with std 0.02 for the embedding.
    double s2 = 0.0;
    size_t ne = (size_t)c.vocab_size * c.d_model;
    for (size_t i = 0; i < ne; i++) s2 += (double)a->w.wte[i] * a->w.wte[i];
    cr_expect_float_eq(sqrt(s2 / ne), 0.02, 0.001);
    pkv_model_destroy(a);
    pkv_model_destroy(b);
    pkv_model_destroy(o);
}

// The no-cache forward pass against the naive reference at every prefix length.
static void check_against_reference(const pkv_model_config *c, uint32_t n) {
    pkv_model *m = make(c, 7);
    ref_model r = ref_of(m);
    int32_t *tok = malloc(n * sizeof *tok);
    fill_tokens(tok, n, c->vocab_size, 1);
    float *ref = malloc((size_t)n * c->vocab_size * sizeof(float));
    float *got = malloc((size_t)c->vocab_size * sizeof(float));
    ref_forward(&r, tok, n, ref);
    for (uint32_t len = 1; len <= n; len += 5) {
        int32_t next = -1;
        cr_assert_eq(pkv_model_forward_nocache(m, 1, &len, tok, got, &next), PKV_OK);
        const float *want = ref + (size_t)(len - 1) * c->vocab_size;
        float e = max_abs_diff(got, want, c->vocab_size);
        cr_expect_leq(e, TOL, "%s len %u: max |logit - ref| = %g", c->name, len, e);
        cr_expect_eq(next, pkv_argmax(got, c->vocab_size));
    }
    free(tok);
    free(ref);
    free(got);
    pkv_model_destroy(m);
}

Test(model, gpt2_style_matches_naive_reference) {
    pkv_model_config c = tiny();
    check_against_reference(&c, 21);
}

Test(model, llama_style_gqa_matches_naive_reference) {
    pkv_model_config c = small_llama_config();
    check_against_reference(&c, 26);
}

// A paged prefill of two prompts in one call, then single-token decodes of the
// two in reverse order, against the reference logits at every step.
static void check_paged_steps(const pkv_model_config *c, uint32_t block_size, pkv_layout layout) {
    pkv_model *m = make(c, 11);
    ref_model r = ref_of(m);
    const uint32_t V = c->vocab_size, lens[2] = {9, 20}, extra = 6;
    int32_t toks[2][40];
    fill_tokens(toks[0], lens[0] + extra, V, 2);
    fill_tokens(toks[1], lens[1] + extra, V, 3);
    float *ref0 = malloc((size_t)40 * V * sizeof(float)), *ref1 = malloc((size_t)40 * V * sizeof(float));
    ref_forward(&r, toks[0], lens[0] + extra, ref0);
    ref_forward(&r, toks[1], lens[1] + extra, ref1);
    pkv_backend *be = NULL;
    pkv_pool *pool = NULL;
    pkv_seqset *set = NULL;
    pkv_cache *cache = NULL;
    pkv_cache_params cp;
    cr_assert_eq(pkv_model_cache_params(m, block_size, &cp), PKV_OK);
    cp.layout = layout; // the model reads strides from the cache's geometry
    cr_assert_eq(pkv_backend_create_host(&be), PKV_OK);
    cr_assert_eq(pkv_pool_create(64, &pool), PKV_OK);
    cr_assert_eq(pkv_seqset_create(pool, block_size, &set), PKV_OK);
    cr_assert_eq(pkv_cache_create(&cp, pool, be, &cache), PKV_OK);
    // NaN everywhere first: a read of any slot that was not written shows up.
    cr_assert_eq(pkv_backend_memset(be, pkv_cache_data(cache), 0xff, pkv_cache_arena_bytes(cache)),
                 PKV_OK);
    // A decoy sequence takes the first blocks so that the tables are not 0, 1, 2...
    pkv_seq_id decoy, s[2];
    cr_assert_eq(pkv_seq_create(set, &decoy), PKV_OK);
    cr_assert_eq(pkv_seq_append(set, decoy, 3 * block_size, NULL), PKV_OK);
    for (int i = 0; i < 2; i++) {
        cr_assert_eq(pkv_seq_create(set, &s[i]), PKV_OK);
        cr_assert_eq(pkv_seq_append(set, s[i], lens[i], NULL), PKV_OK);
    }
    int32_t packed[40];
    memcpy(packed, toks[0], lens[0] * sizeof(int32_t));
    memcpy(packed + lens[0], toks[1], lens[1] * sizeof(int32_t));
    float *logits = malloc((size_t)2 * V * sizeof(float));
    cr_assert_eq(pkv_model_prefill_paged(m, cache, set, 2, s, lens, packed, logits, NULL), PKV_OK);
    cr_expect_leq(max_abs_diff(logits, ref0 + (size_t)(lens[0] - 1) * V, V), TOL);
    cr_expect_leq(max_abs_diff(logits + V, ref1 + (size_t)(lens[1] - 1) * V, V), TOL);
    for (uint32_t j = 0; j < extra; j++) {
        pkv_seq_id order[2] = {s[1], s[0]};
        int32_t step[2] = {toks[1][lens[1] + j], toks[0][lens[0] + j]};
        for (int i = 0; i < 2; i++) cr_assert_eq(pkv_seq_append(set, order[i], 1, NULL), PKV_OK);
        cr_assert_eq(pkv_model_decode_paged(m, cache, set, 2, order, step, logits, NULL), PKV_OK);
        float e1 = max_abs_diff(logits, ref1 + (size_t)(lens[1] + j) * V, V);
        float e0 = max_abs_diff(logits + V, ref0 + (size_t)(lens[0] + j) * V, V);
        cr_expect_leq(e1, TOL, "%s B=%u step %u seq1: %g", c->name, block_size, j, e1);
        cr_expect_leq(e0, TOL, "%s B=%u step %u seq0: %g", c->name, block_size, j, e0);
    }
    cr_expect_eq(pkv_seqset_validate(set, 1), PKV_OK);
    free(logits);
    free(ref0);
    free(ref1);
    pkv_cache_destroy(cache);
    pkv_seqset_destroy(set);
    pkv_pool_destroy(pool);
    pkv_backend_destroy(be);
    pkv_model_destroy(m);
}

Test(model, paged_prefill_and_decode_match_reference) {
    pkv_model_config c = tiny();
    check_paged_steps(&c, 16, PKV_LAYOUT_HND);
    pkv_model_config l = small_llama_config();
    check_paged_steps(&l, 4, PKV_LAYOUT_HND);
    check_paged_steps(&l, 4, PKV_LAYOUT_NHD);
}

// Two 24-token sequences of `m`'s vocabulary and the reference logits at every
// position of each ([24][vocab], malloc'd).
static void two_references(pkv_model *m, int32_t t0[24], int32_t t1[24], float **r0, float **r1) {
    ref_model r = ref_of(m);
    const uint32_t V = r.c.vocab_size;
    fill_tokens(t0, 24, V, 4);
    fill_tokens(t1, 24, V, 5);
    *r0 = malloc((size_t)24 * V * sizeof(float));
    *r1 = malloc((size_t)24 * V * sizeof(float));
    ref_forward(&r, t0, 24, *r0);
    ref_forward(&r, t1, 24, *r1);
}

Test(model, contiguous_steps_with_scattered_rows_match_reference) {
    pkv_model_config c = small_llama_config();
    pkv_model *m = make(&c, 5);
    const uint32_t V = c.vocab_size;
    int32_t t0[24], t1[24];
    float *r0, *r1;
    two_references(m, t0, t1, &r0, &r1);
    pkv_contig_kv *kv = NULL;
    cr_assert_eq(pkv_contig_kv_create(m, 5, 32, PKV_DTYPE_F32, &kv), PKV_OK);
    cr_expect_eq(pkv_contig_kv_bytes(kv), 2ull * 2 * 5 * 2 * 32 * 16 * 4);
    // NaN in every slot first (0xff bytes): results must not read unwritten slots.
    memset(kv->k, 0xff, kv->bytes_each);
    memset(kv->v, 0xff, kv->bytes_each);
    // Rows 4 and 1: not consecutive, so decode goes one row at a time.
    uint32_t rows[2] = {4, 1}, counts[2] = {7, 15};
    int32_t packed[22];
    memcpy(packed, t0, 7 * sizeof(int32_t));
    memcpy(packed + 7, t1, 15 * sizeof(int32_t));
    cr_assert_eq(pkv_contig_kv_append(kv, 4, 7), PKV_OK);
    cr_assert_eq(pkv_contig_kv_append(kv, 1, 15), PKV_OK);
    float *lg = malloc((size_t)2 * V * sizeof(float));
    cr_assert_eq(pkv_model_prefill_contig(m, kv, 2, rows, counts, packed, lg, NULL), PKV_OK);
    cr_expect_leq(max_abs_diff(lg, r0 + 6 * V, V), TOL);
    cr_expect_leq(max_abs_diff(lg + V, r1 + 14 * V, V), TOL);
    for (uint32_t j = 0; j < 5; j++) {
        int32_t step[2] = {t0[7 + j], t1[15 + j]};
        pkv_contig_kv_append(kv, 4, 1);
        pkv_contig_kv_append(kv, 1, 1);
        cr_assert_eq(pkv_model_decode_contig(m, kv, 2, rows, step, lg, NULL), PKV_OK);
        cr_expect_leq(max_abs_diff(lg, r0 + (7 + j) * V, V), TOL, "step %u", j);
        cr_expect_leq(max_abs_diff(lg + V, r1 + (15 + j) * V, V), TOL, "step %u", j);
    }
    // A copied row continues exactly like its source.
    cr_assert_eq(pkv_contig_kv_copy_row(kv, 4, 2), PKV_OK);
    uint32_t len = 0;
    cr_assert_eq(pkv_contig_kv_length(kv, 2, &len), PKV_OK);
    cr_expect_eq(len, 12);
    uint32_t row2 = 2;
    cr_assert_eq(pkv_contig_kv_append(kv, 2, 1), PKV_OK);
    cr_assert_eq(pkv_model_decode_contig(m, kv, 1, &row2, &t0[12], lg, NULL), PKV_OK);
    cr_expect_leq(max_abs_diff(lg, r0 + 12 * V, V), TOL);
    free(lg);
    free(r0);
    free(r1);
    pkv_contig_kv_destroy(kv);
    pkv_model_destroy(m);
}

// An arena store whose extents are placed, moved and regrown like an engine's
// contiguous allocator would: rows at arbitrary offsets (not in row order), a
// row moved (allocate-copy-free) and one regrown in place between decode steps,
// and a fork copied into a third extent, all matching the reference.
Test(model, contiguous_arena_rows_placed_and_moved_match_reference) {
    pkv_model_config c = small_llama_config();
    pkv_model *m = make(&c, 5);
    const uint32_t V = c.vocab_size;
    int32_t t0[24], t1[24];
    float *r0, *r1;
    two_references(m, t0, t1, &r0, &r1);
    pkv_contig_kv *kv = NULL;
    cr_assert_eq(pkv_contig_kv_create_arena(m, 4, 100, PKV_DTYPE_F32, &kv), PKV_OK);
    cr_expect_eq(pkv_contig_kv_bytes(kv), 2ull * 2 * 2 * 100 * 16 * 4); // layers, kv heads, dim
    memset(kv->k, 0xff, kv->bytes_each); // NaN: unwritten slots must not be read
    memset(kv->v, 0xff, kv->bytes_each);
    // Row 0 high in the arena, row 3 low: placement order is not row order.
    cr_assert_eq(pkv_contig_kv_place(kv, 0, 61, 8), PKV_OK);
    cr_assert_eq(pkv_contig_kv_place(kv, 3, 5, 17), PKV_OK);
    // Errors leave everything as it was.
    cr_expect_eq(pkv_contig_kv_place(kv, 1, 60, 4), PKV_ERR_BUSY, "overlaps row 0");
    cr_expect_eq(pkv_contig_kv_place(kv, 1, 97, 4), PKV_ERR_INVALID_ARG, "past the arena");
    cr_expect_eq(pkv_contig_kv_place(kv, 4, 0, 1), PKV_ERR_INVALID_ARG, "no such row");
    cr_expect_eq(pkv_contig_kv_append(kv, 1, 1), PKV_ERR_BUFFER_TOO_SMALL, "no extent yet");
    uint32_t rows[2] = {0, 3}, counts[2] = {7, 15};
    int32_t packed[22];
    memcpy(packed, t0, 7 * sizeof(int32_t));
    memcpy(packed + 7, t1, 15 * sizeof(int32_t));
    cr_assert_eq(pkv_contig_kv_append(kv, 0, 7), PKV_OK);
    cr_assert_eq(pkv_contig_kv_append(kv, 3, 15), PKV_OK);
    cr_expect_eq(pkv_contig_kv_place(kv, 0, 80, 8), PKV_ERR_BUSY, "row 0 holds tokens");
    float *lg = malloc((size_t)2 * V * sizeof(float));
    cr_assert_eq(pkv_model_prefill_contig(m, kv, 2, rows, counts, packed, lg, NULL), PKV_OK);
    cr_expect_leq(max_abs_diff(lg, r0 + 6 * V, V), TOL);
    cr_expect_leq(max_abs_diff(lg + V, r1 + 14 * V, V), TOL);
    for (uint32_t j = 0; j < 6; j++) {
        if (j == 1) {
            // Row 0 is full (8 of 8): realloc-copy to a longer extent elsewhere.
            cr_expect_eq(pkv_contig_kv_move_row(kv, 0, 62, 12), PKV_ERR_BUSY, "overlaps itself");
            cr_expect_eq(pkv_contig_kv_move_row(kv, 0, 30, 7), PKV_ERR_BUFFER_TOO_SMALL);
            cr_assert_eq(pkv_contig_kv_move_row(kv, 0, 30, 14), PKV_OK);
            // Its old slots are free now.
            cr_assert_eq(pkv_contig_kv_place(kv, 2, 61, 8), PKV_OK);
            cr_assert_eq(pkv_contig_kv_place(kv, 2, 0, 0), PKV_OK);
        }
        if (j == 2) cr_assert_eq(pkv_contig_kv_move_row(kv, 3, 5, 25), PKV_OK); // regrow in place
        int32_t step[2] = {t0[7 + j], t1[15 + j]};
        cr_assert_eq(pkv_contig_kv_append(kv, 0, 1), PKV_OK);
        cr_assert_eq(pkv_contig_kv_append(kv, 3, 1), PKV_OK);
        cr_assert_eq(pkv_model_decode_contig(m, kv, 2, rows, step, lg, NULL), PKV_OK);
        cr_expect_leq(max_abs_diff(lg, r0 + (7 + j) * V, V), TOL, "step %u", j);
        cr_expect_leq(max_abs_diff(lg + V, r1 + (15 + j) * V, V), TOL, "step %u", j);
    }
    // A fork copies the row into its own extent and continues like its source.
    cr_expect_eq(pkv_contig_kv_place(kv, 1, 41, 5), PKV_ERR_BUSY, "overlaps row 0's new extent");
    cr_assert_eq(pkv_contig_kv_place(kv, 1, 50, 16), PKV_OK);
    cr_expect_eq(pkv_contig_kv_copy_row(kv, 3, 1), PKV_ERR_BUFFER_TOO_SMALL, "21 tokens, 16 slots");
    cr_assert_eq(pkv_contig_kv_copy_row(kv, 0, 1), PKV_OK);
    uint32_t row1 = 1, len = 0;
    cr_assert_eq(pkv_contig_kv_length(kv, 1, &len), PKV_OK);
    cr_expect_eq(len, 13);
    cr_assert_eq(pkv_contig_kv_append(kv, 1, 1), PKV_OK);
    cr_assert_eq(pkv_model_decode_contig(m, kv, 1, &row1, &t0[13], lg, NULL), PKV_OK);
    cr_expect_leq(max_abs_diff(lg, r0 + 13 * V, V), TOL);
    // A fixed-row store's rows do not move.
    pkv_contig_kv *fixed = NULL;
    cr_assert_eq(pkv_contig_kv_create(m, 2, 8, PKV_DTYPE_F32, &fixed), PKV_OK);
    cr_expect_eq(pkv_contig_kv_place(fixed, 0, 0, 0), PKV_ERR_UNSUPPORTED);
    cr_expect_eq(pkv_contig_kv_move_row(fixed, 0, 8, 8), PKV_ERR_UNSUPPORTED);
    pkv_contig_kv_destroy(fixed);
    free(lg);
    free(r0);
    free(r1);
    pkv_contig_kv_destroy(kv);
    pkv_model_destroy(m);
}

// ---- the arena store against a reference model ----

// What an arena store should hold: extents, lengths, and the tag written into
// each stored token (the same in every layer, head and element, K and V).
typedef struct arena_ref {
    uint64_t off[6];
    uint32_t cap[6], len[6];
    float tag[6][64];
} arena_ref;

static float *arena_elem(pkv_contig_kv *kv, int v, uint32_t layer, uint32_t row, uint32_t head,
                         uint32_t t) {
    float *base = v ? kv->v : kv->k;
    return base + layer * kv->layer_stride + kv->off[row] * kv->row_unit + head * kv->head_stride +
           (uint64_t)t * kv->token_stride;
}

// The store's bookkeeping and every stored token's K/V equal the reference's.
static void arena_check(pkv_contig_kv *kv, const pkv_model_config *c, const arena_ref *ref, int step) {
    for (uint32_t r = 0; r < 6; r++) {
        cr_assert_eq(kv->cap[r], ref->cap[r], "step %d row %u capacity", step, r);
        cr_assert_eq(kv->len[r], ref->len[r], "step %d row %u length", step, r);
        if (ref->cap[r]) cr_assert_eq(kv->off[r], ref->off[r], "step %d row %u offset", step, r);
        for (uint32_t t = 0; t < ref->len[r]; t++)
            for (uint32_t l = 0; l < c->num_layers; l++)
                for (uint32_t h = 0; h < c->num_kv_heads; h++)
                    for (int v = 0; v < 2; v++) {
                        const float *e = arena_elem(kv, v, l, r, h, t);
                        for (uint32_t d = 0; d < c->head_dim; d++)
                            cr_assert_eq(e[d], ref->tag[r][t], "step %d row %u token %u layer %u head %u",
                                         step, r, t, l, h);
                    }
    }
}

// A 64-bit LCG step (wraps modulo 2^64 by design: rng_next is in the CI's
// integer-sanitizer suppressions).
static uint64_t rng_next(uint64_t *x) {
    *x = *x * 6364136223846793005ull + 1442695040888963407ull;
    return *x;
}

static int arena_overlaps(const arena_ref *ref, uint32_t self, uint64_t off, uint64_t cap) {
    for (uint32_t r = 0; r < 6; r++)
        if (r != self && ref->cap[r] && off < ref->off[r] + ref->cap[r] && ref->off[r] < off + cap)
            return 1;
    return 0;
}

// Random place / unplace / move / append / reset / copy on a 64-slot arena with
// six rows, each checked against the reference: the status it must return (an
// overlap refused exactly when extents meet, errors changing nothing), and the
// K/V of every stored token carried by moves and copies.
Test(model, contiguous_arena_random_ops_match_a_reference_model) {
    pkv_model_config c = small_llama_config();
    pkv_model *m = make(&c, 5);
    pkv_contig_kv *kv = NULL;
    cr_assert_eq(pkv_contig_kv_create_arena(m, 6, 64, PKV_DTYPE_F32, &kv), PKV_OK);
    arena_ref ref;
    memset(&ref, 0, sizeof ref);
    uint64_t x = 12345;
    float next_tag = 1.0f;
    int moved = 0, refused = 0;
    for (int step = 0; step < 4000; step++) {
        rng_next(&x);
        const uint32_t op = (uint32_t)(x >> 60) % 6, row = (uint32_t)(x >> 40) % 6;
        const uint64_t off = (x >> 20) % 70;
        const uint32_t cap = (uint32_t)(x >> 8) % 13, n = (uint32_t)(x >> 4) % 4, other = (uint32_t)x % 6;
        pkv_status want = PKV_OK, got;
        const int bad_extent = cap == 0 || off > 64 || cap > 64 - off;
        switch (op) {
        case 0: // place (capacity 0: take the extent away)
            if (ref.len[row]) want = PKV_ERR_BUSY;
            else if (cap && bad_extent) want = PKV_ERR_INVALID_ARG;
            else if (cap && arena_overlaps(&ref, row, off, cap)) want = PKV_ERR_BUSY;
            got = pkv_contig_kv_place(kv, row, off, cap);
            if (want == PKV_OK) {
                ref.off[row] = cap ? off : 0;
                ref.cap[row] = cap;
            }
            break;
        case 1: { // move, keeping the tokens
            const int same = off == ref.off[row];
            if (!ref.cap[row]) want = PKV_ERR_INVALID_ARG;
            else if (cap < ref.len[row]) want = PKV_ERR_BUFFER_TOO_SMALL;
            else if (bad_extent) want = PKV_ERR_INVALID_ARG;
            else if (arena_overlaps(&ref, row, off, cap)) want = PKV_ERR_BUSY;
            else if (!same && off < ref.off[row] + ref.cap[row] && ref.off[row] < off + cap)
                want = PKV_ERR_BUSY; // allocate-copy-free: never over its old extent
            got = pkv_contig_kv_move_row(kv, row, off, cap);
            if (want == PKV_OK) {
                moved += !same && ref.len[row] > 0;
                ref.off[row] = off;
                ref.cap[row] = cap;
            }
            break;
        }
        case 2: // append n tokens and write their K/V, as a forward pass would
            if (n > ref.cap[row] - ref.len[row]) want = PKV_ERR_BUFFER_TOO_SMALL;
            got = pkv_contig_kv_append(kv, row, n);
            if (want == PKV_OK)
                for (uint32_t i = 0; i < n; i++) {
                    const uint32_t t = ref.len[row]++;
                    ref.tag[row][t] = next_tag;
                    for (uint32_t l = 0; l < c.num_layers; l++)
                        for (uint32_t h = 0; h < c.num_kv_heads; h++)
                            for (int v = 0; v < 2; v++) {
                                float *e = arena_elem(kv, v, l, row, h, t);
                                for (uint32_t d = 0; d < c.head_dim; d++) e[d] = next_tag;
                            }
                    next_tag += 1.0f;
                }
            break;
        case 3: // reset
            got = pkv_contig_kv_reset(kv, row);
            ref.len[row] = 0;
            break;
        default: // copy row -> other (a fork)
            if (row != other && ref.len[row] > ref.cap[other]) want = PKV_ERR_BUFFER_TOO_SMALL;
            got = pkv_contig_kv_copy_row(kv, row, other);
            if (want == PKV_OK && row != other) {
                memcpy(ref.tag[other], ref.tag[row], ref.len[row] * sizeof(float));
                ref.len[other] = ref.len[row];
            }
            break;
        }
        refused += want != PKV_OK;
        cr_assert_eq(got, want, "step %d: op %u row %u off %llu cap %u n %u other %u: %s, want %s", step, op,
                     row, (unsigned long long)off, cap, n, other, pkv_status_str(got), pkv_status_str(want));
        arena_check(kv, &c, &ref, step);
    }
    // The run covered what it claims to: moves that carried tokens, and refusals.
    cr_assert_gt(moved, 20, "only %d moves with tokens", moved);
    cr_assert_gt(refused, 200, "only %d refusals", refused);
    pkv_contig_kv_destroy(kv);
    pkv_model_destroy(m);
}

// ---- llama2.c checkpoint --------------------------------------------------

typedef struct ckpt {
    int32_t hdr[7];
    float *data; // all tensors in file order
    size_t count;
} ckpt;

// Build a checkpoint of small_llama_config in memory with a deterministic pattern.
static ckpt make_ckpt(int shared) {
    pkv_model_config c = small_llama_config();
    ckpt k;
    k.hdr[0] = (int32_t)c.d_model;
    k.hdr[1] = (int32_t)c.d_ff;
    k.hdr[2] = (int32_t)c.num_layers;
    k.hdr[3] = (int32_t)c.num_heads;
    k.hdr[4] = (int32_t)c.num_kv_heads;
    k.hdr[5] = shared ? (int32_t)c.vocab_size : -(int32_t)c.vocab_size;
    k.hdr[6] = (int32_t)c.max_seq_len;
    size_t L = c.num_layers, d = c.d_model, V = c.vocab_size, h = c.d_ff, kvd = 32, hs = 16;
    k.count = V * d + L * d + L * d * d + 2 * L * kvd * d + L * d * d + L * d + 3 * L * h * d + d +
              c.max_seq_len * hs + (shared ? 0 : V * d);
    k.data = malloc(k.count * sizeof(float));
    uint64_t st = 99;
    for (size_t i = 0; i < k.count; i++) {
        st = st * 6364136223846793005ull + 1442695040888963407ull;
        k.data[i] = ((float)(st >> 40) / 16777216.0f - 0.5f) * 0.07f;
    }
    // Norm scales near 1 as in trained models.
    size_t off_att = V * d, off_ffn = V * d + L * d + 2 * L * d * d + 2 * L * kvd * d;
    size_t off_fin = off_ffn + L * d + 3 * L * h * d;
    for (size_t i = 0; i < L * d; i++) k.data[off_att + i] += 1.0f, k.data[off_ffn + i] += 1.0f;
    for (size_t i = 0; i < d; i++) k.data[off_fin + i] += 1.0f;
    return k;
}

static void write_ckpt(const char *path, const ckpt *k, size_t bytes_cut, int extra) {
    FILE *f = fopen(path, "wb");
    cr_assert_not_null(f);
    fwrite(k->hdr, sizeof k->hdr, 1, f);
    fwrite(k->data, sizeof(float), k->count - bytes_cut / 4, f);
    if (extra) fwrite(k->data, 1, 4, f);
    fclose(f);
}

// The reference over the checkpoint's own arrays, addressed in file order.
static ref_model ref_of_ckpt(const ckpt *k, int shared) {
    ref_model r;
    memset(&r, 0, sizeof r);
    r.c = small_llama_config();
    r.c.tied_embeddings = shared;
    size_t L = 2, d = 128, V = 300, h = 344, kvd = 32, hs = 16;
    const float *p = k->data;
    r.wte = p;
    p += V * d;
    for (size_t l = 0; l < L; l++) r.layer[l].ln1_w = p + l * d;
    p += L * d;
    for (size_t l = 0; l < L; l++) r.layer[l].wq = p + l * d * d;
    p += L * d * d;
    for (size_t l = 0; l < L; l++) r.layer[l].wk = p + l * kvd * d;
    p += L * kvd * d;
    for (size_t l = 0; l < L; l++) r.layer[l].wv = p + l * kvd * d;
    p += L * kvd * d;
    for (size_t l = 0; l < L; l++) r.layer[l].wo = p + l * d * d;
    p += L * d * d;
    for (size_t l = 0; l < L; l++) r.layer[l].ln2_w = p + l * d;
    p += L * d;
    for (size_t l = 0; l < L; l++) r.layer[l].w_gate = p + l * h * d;
    p += L * h * d;
    for (size_t l = 0; l < L; l++) r.layer[l].w_down = p + l * d * h;
    p += L * d * h;
    for (size_t l = 0; l < L; l++) r.layer[l].w_up = p + l * h * d;
    p += L * h * d;
    r.lnf_w = p;
    p += d;
    p += 512 * hs;
    r.lm_head = shared ? r.wte : p;
    return r;
}

static void tmp_path(char *buf, size_t cap, const char *tag) {
    snprintf(buf, cap, "/tmp/pkv_test_%s_%ld.bin", tag, (long)getpid());
}

Test(loader, llama2c_file_matches_reference_on_its_tensors) {
    for (int shared = 0; shared <= 1; shared++) {
        ckpt k = make_ckpt(shared);
        char path[128];
        tmp_path(path, sizeof path, "ok");
        write_ckpt(path, &k, 0, 0);
        pkv_model_params p = pkv_model_params_default();
        pkv_model *m = NULL;
        char err[256];
        cr_assert_eq(pkv_model_load_llama2c(path, &p, &m, err, sizeof err), PKV_OK, "%s", err);
        pkv_model_config c;
        pkv_model_get_config(m, &c);
        cr_expect_str_eq(c.name, "llama2c");
        cr_expect_eq(c.num_kv_heads, 2);
        cr_expect_eq(c.tied_embeddings, shared);
        ref_model r = ref_of_ckpt(&k, shared);
        int32_t tok[14];
        fill_tokens(tok, 14, 300, 9);
        float ref[14 * 300], got[300];
        ref_forward(&r, tok, 14, ref);
        uint32_t n = 14;
        cr_assert_eq(pkv_model_forward_nocache(m, 1, &n, tok, got, NULL), PKV_OK);
        float e = max_abs_diff(got, ref + 13 * 300, 300);
        cr_expect_leq(e, TOL, "shared=%d: %g", shared, e);
        // Save and reload: the same bytes come back.
        char path2[128];
        tmp_path(path2, sizeof path2, "resave");
        cr_assert_eq(pkv_model_save_llama2c(m, path2), PKV_OK);
        pkv_model *m2 = NULL;
        cr_assert_eq(pkv_model_load_llama2c(path2, &p, &m2, err, sizeof err), PKV_OK, "%s", err);
        cr_expect_eq(memcmp(m->weights_mem, m2->weights_mem, pkvi_weights_count(&c) * 4), 0);
        pkv_model_destroy(m2);
        pkv_model_destroy(m);
        unlink(path);
        unlink(path2);
        free(k.data);
    }
}

Test(loader, errors_name_the_file_and_problem) {
    pkv_model_params p = pkv_model_params_default();
    pkv_model *m = (pkv_model *)0x1;
    char err[256];
    cr_expect_eq(pkv_model_load_llama2c("/nonexistent/dir/x.bin", &p, &m, err, sizeof err), PKV_ERR_IO);
    cr_expect_null(m);
    cr_expect(strstr(err, "/nonexistent/dir/x.bin") && strstr(err, "cannot open"), "%s", err);

    ckpt k = make_ckpt(1);
    char path[128];
    tmp_path(path, sizeof path, "bad");
    write_ckpt(path, &k, 400, 0);
    cr_expect_eq(pkv_model_load_llama2c(path, &p, &m, err, sizeof err), PKV_ERR_FORMAT);
    cr_expect(strstr(err, path) && strstr(err, "truncated"), "%s", err);
    write_ckpt(path, &k, 0, 1);
    cr_expect_eq(pkv_model_load_llama2c(path, &p, &m, err, sizeof err), PKV_ERR_FORMAT);
    cr_expect(strstr(err, "trailing"), "%s", err);
    // Header fields that are zero or inconsistent.
    ckpt bad = k;
    bad.hdr[3] = 0;
    write_ckpt(path, &bad, 0, 0);
    cr_expect_eq(pkv_model_load_llama2c(path, &p, &m, err, sizeof err), PKV_ERR_FORMAT);
    cr_expect(strstr(err, "n_heads"), "%s", err);
    bad = k;
    bad.hdr[4] = 3; // 3 does not divide 8 heads
    write_ckpt(path, &bad, 0, 0);
    cr_expect_eq(pkv_model_load_llama2c(path, &p, &m, err, sizeof err), PKV_ERR_FORMAT);
    cr_expect(strstr(err, "mismatch"), "%s", err);
    bad = k;
    bad.hdr[2] = 3; // one layer more than the data holds
    write_ckpt(path, &bad, 0, 0);
    cr_expect_eq(pkv_model_load_llama2c(path, &p, &m, err, sizeof err), PKV_ERR_FORMAT);
    // A file shorter than the header.
    FILE *f = fopen(path, "wb");
    fwrite("abc", 1, 3, f);
    fclose(f);
    cr_expect_eq(pkv_model_load_llama2c(path, &p, &m, err, sizeof err), PKV_ERR_FORMAT);
    cr_expect(strstr(err, "header"), "%s", err);
    cr_expect_eq(pkv_model_load_llama2c(NULL, &p, &m, NULL, 0), PKV_ERR_INVALID_ARG);
    unlink(path);
    free(k.data);
    // GPT-2 style weights have no llama2.c form.
    pkv_model_config c = tiny();
    pkv_model *g = make(&c, 1);
    cr_expect_eq(pkv_model_save_llama2c(g, path), PKV_ERR_UNSUPPORTED);
    pkv_model_destroy(g);
}

// ---- error paths ------------------------------------------------------------

Test(model, create_errors) {
    pkv_model_config c = tiny();
    pkv_model_params p = pkv_model_params_default();
    pkv_model *m = NULL;
    cr_expect_eq(pkv_model_create(NULL, &p, &m), PKV_ERR_INVALID_ARG);
    cr_expect_eq(pkv_model_create(&c, NULL, &m), PKV_ERR_INVALID_ARG);
    cr_expect_eq(pkv_model_create(&c, &p, NULL), PKV_ERR_INVALID_ARG);
    pkv_model_config bad = c;
    bad.num_kv_heads = 3;
    cr_expect_eq(pkv_model_create(&bad, &p, &m), PKV_ERR_INVALID_ARG);
    p.device = (pkv_device)9;
    cr_expect_eq(pkv_model_create(&c, &p, &m), PKV_ERR_INVALID_ARG);
    p.device = PKV_DEVICE_CUDA;
    pkv_status st = pkv_model_create(&c, &p, &m);
    if (st == PKV_OK) pkv_model_destroy(m); // a machine with a GPU
    else cr_expect(st == PKV_ERR_UNSUPPORTED || st == PKV_ERR_NO_DEVICE, "%s", pkv_status_str(st));
    pkv_model_destroy(NULL);
    cr_expect_str_eq(pkv_device_name(PKV_DEVICE_CUDA), "cuda");
    cr_expect_eq(pkv_argmax(NULL, 3), -1);
    float v[4] = {1, 5, 5, 2};
    cr_expect_eq(pkv_argmax(v, 4), 1);
}

Test(model, step_errors) {
    pkv_model_config c = small_llama_config();
    pkv_model *m = make(&c, 1);
    pkv_backend *be = NULL;
    pkv_pool *pool = NULL;
    pkv_seqset *set = NULL;
    pkv_cache *cache = NULL, *wrong = NULL;
    pkv_cache_params cp;
    pkv_model_cache_params(m, 8, &cp);
    pkv_backend_create_host(&be);
    pkv_pool_create(16, &pool);
    pkv_seqset_create(pool, 8, &set);
    cr_assert_eq(pkv_cache_create(&cp, pool, be, &cache), PKV_OK);
    pkv_cache_params wp = cp;
    wp.head_dim = 32;
    pkv_pool *pool2 = NULL;
    pkv_pool_create(4, &pool2);
    cr_assert_eq(pkv_cache_create(&wp, pool2, be, &wrong), PKV_OK);
    pkv_seq_id s;
    pkv_seq_create(set, &s);
    pkv_seq_append(set, s, 4, NULL);
    int32_t tok[4] = {1, 2, 3, 4};
    uint32_t n4 = 4, n5 = 5;
    float lg[300];
    cr_expect_eq(pkv_model_prefill_paged(m, cache, set, 1, &s, &n5, tok, lg, NULL), PKV_ERR_INVALID_ARG,
                 "more new tokens than the sequence holds");
    cr_expect_eq(pkv_model_prefill_paged(m, wrong, set, 1, &s, &n4, tok, lg, NULL), PKV_ERR_INVALID_ARG,
                 "a cache of another shape and pool");
    cr_expect_eq(pkv_model_prefill_paged(m, cache, set, 0, &s, &n4, tok, lg, NULL), PKV_ERR_INVALID_ARG);
    int32_t badtok[4] = {1, 2, 300, 4};
    cr_expect_eq(pkv_model_prefill_paged(m, cache, set, 1, &s, &n4, badtok, lg, NULL), PKV_ERR_INVALID_ARG,
                 "token id out of the vocabulary");
    pkv_seq_id ghost = 7;
    cr_expect_eq(pkv_model_decode_paged(m, cache, set, 1, &ghost, tok, lg, NULL), PKV_ERR_NOT_FOUND);
    cr_expect_eq(pkv_model_prefill_paged(m, cache, set, 1, &s, &n4, tok, lg, NULL), PKV_OK);
    // Contiguous store.
    pkv_contig_kv *kv = NULL;
    cr_expect_eq(pkv_contig_kv_create(m, 0, 8, PKV_DTYPE_F32, &kv), PKV_ERR_INVALID_ARG);
    cr_assert_eq(pkv_contig_kv_create(m, 2, 8, PKV_DTYPE_F32, &kv), PKV_OK);
    cr_expect_eq(pkv_contig_kv_append(kv, 0, 9), PKV_ERR_BUFFER_TOO_SMALL);
    cr_expect_eq(pkv_contig_kv_append(kv, 2, 1), PKV_ERR_INVALID_ARG);
    uint32_t row = 0, len = 99;
    cr_expect_eq(pkv_contig_kv_length(kv, 0, &len), PKV_OK);
    cr_expect_eq(len, 0);
    cr_expect_eq(pkv_model_decode_contig(m, kv, 1, &row, tok, lg, NULL), PKV_ERR_INVALID_ARG,
                 "a row with no slot appended");
    row = 5;
    cr_expect_eq(pkv_model_decode_contig(m, kv, 1, &row, tok, lg, NULL), PKV_ERR_INVALID_ARG);
    pkv_model *other = make(&c, 2);
    row = 0;
    pkv_contig_kv_append(kv, 0, 1);
    cr_expect_eq(pkv_model_decode_contig(other, kv, 1, &row, tok, lg, NULL), PKV_ERR_INVALID_ARG,
                 "a store of another model");
    cr_expect_eq(pkv_model_forward_nocache(m, 1, &n4, NULL, lg, NULL), PKV_ERR_INVALID_ARG);
    uint32_t zero = 0;
    cr_expect_eq(pkv_model_forward_nocache(m, 1, &zero, tok, lg, NULL), PKV_ERR_INVALID_ARG);
    // Learned positions end at max_seq_len.
    pkv_model_config t = tiny();
    t.max_seq_len = 8;
    pkv_model *gm = make(&t, 1);
    int32_t nine[9] = {0};
    uint32_t n9 = 9;
    cr_expect_eq(pkv_model_forward_nocache(gm, 1, &n9, nine, NULL, NULL), PKV_ERR_INVALID_ARG);
    pkv_model_destroy(gm);
    pkv_model_destroy(other);
    pkv_contig_kv_destroy(kv);
    pkv_cache_destroy(cache);
    pkv_cache_destroy(wrong);
    pkv_seqset_destroy(set);
    pkv_pool_destroy(pool);
    pkv_pool_destroy(pool2);
    pkv_backend_destroy(be);
    pkv_model_destroy(m);
}

Test(model, profile_counts_calls_and_tokens) {
    pkv_model_config c = tiny();
    pkv_model_params p = pkv_model_params_default();
    p.profile = 1;
    pkv_model *m = NULL;
    cr_assert_eq(pkv_model_create(&c, &p, &m), PKV_OK);
    int32_t tok[10] = {1, 2, 3, 4, 5, 6, 7, 8, 9, 10};
    uint32_t n = 10;
    cr_assert_eq(pkv_model_forward_nocache(m, 1, &n, tok, NULL, NULL), PKV_OK);
    pkv_model_profile pr;
    pkv_model_get_profile(m, &pr);
    cr_expect_eq(pr.forward_calls, 1);
    cr_expect_eq(pr.tokens, 10);
    cr_expect(pr.gemm_ffn > 0 && pr.gemm_qkv > 0 && pr.attention > 0 && pr.lm_head > 0);
    cr_expect_leq(pr.attention + pr.gemm_qkv + pr.gemm_out + pr.gemm_ffn + pr.lm_head + pr.other +
                      pr.bookkeeping,
                  pr.total * 1.0001 + 1e-6);
    pkv_model_reset_profile(m);
    pkv_model_get_profile(m, &pr);
    cr_expect_eq(pr.forward_calls, 0);
    pkv_model_destroy(m);
}

// Chunked prefill: a sequence prefilled in two calls (the second attends to the
// K/V the first wrote), as a scheduler does for long prompts or after a prefix
// hit, on both stores.
Test(model, chunked_prefill_matches_reference) {
    pkv_model_config c = small_llama_config();
    pkv_model *m = make(&c, 13);
    ref_model r = ref_of(m);
    const uint32_t V = c.vocab_size, n1 = 10, n2 = 7;
    int32_t tok[17];
    fill_tokens(tok, n1 + n2, V, 6);
    float *ref = malloc((size_t)(n1 + n2) * V * sizeof(float)), lg[300];
    ref_forward(&r, tok, n1 + n2, ref);
    pkv_backend *be = NULL;
    pkv_pool *pool = NULL;
    pkv_seqset *set = NULL;
    pkv_cache *cache = NULL;
    pkv_cache_params cp;
    pkv_model_cache_params(m, 4, &cp);
    pkv_backend_create_host(&be);
    pkv_pool_create(16, &pool);
    pkv_seqset_create(pool, 4, &set);
    cr_assert_eq(pkv_cache_create(&cp, pool, be, &cache), PKV_OK);
    pkv_seq_id s;
    pkv_seq_create(set, &s);
    pkv_seq_append(set, s, n1, NULL);
    cr_assert_eq(pkv_model_prefill_paged(m, cache, set, 1, &s, &n1, tok, lg, NULL), PKV_OK);
    cr_expect_leq(max_abs_diff(lg, ref + (n1 - 1) * V, V), TOL);
    pkv_seq_append(set, s, n2, NULL);
    cr_assert_eq(pkv_model_prefill_paged(m, cache, set, 1, &s, &n2, tok + n1, lg, NULL), PKV_OK);
    float e = max_abs_diff(lg, ref + (n1 + n2 - 1) * V, V);
    cr_expect_leq(e, TOL, "paged second chunk: %g", e);
    pkv_contig_kv *kv = NULL;
    cr_assert_eq(pkv_contig_kv_create(m, 1, 32, PKV_DTYPE_F32, &kv), PKV_OK);
    uint32_t row = 0;
    pkv_contig_kv_append(kv, 0, n1);
    cr_assert_eq(pkv_model_prefill_contig(m, kv, 1, &row, &n1, tok, lg, NULL), PKV_OK);
    pkv_contig_kv_append(kv, 0, n2);
    cr_assert_eq(pkv_model_prefill_contig(m, kv, 1, &row, &n2, tok + n1, lg, NULL), PKV_OK);
    e = max_abs_diff(lg, ref + (n1 + n2 - 1) * V, V);
    cr_expect_leq(e, TOL, "contiguous second chunk: %g", e);
    free(ref);
    pkv_contig_kv_destroy(kv);
    pkv_cache_destroy(cache);
    pkv_seqset_destroy(set);
    pkv_pool_destroy(pool);
    pkv_backend_destroy(be);
    pkv_model_destroy(m);
}

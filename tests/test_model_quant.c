// SPDX-License-Identifier: MIT
// The decoder's 8-bit contiguous store (int8, fp8_e4m3, fp8_e5m2) against its
// 8-bit paged store: both quantize with the same writer and dequantize with the
// same attention code, so the same steps give the same tokens and logits. Covers
// pkv_generate's two layouts, the step API over an arena store whose rows move
// (realloc-copy) and fork (row copy) with their int8 scales, the store's byte
// count, and the refusals.
#include <criterion/criterion.h>
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "model_ref.h"
#include "pkv/backend.h"
#include "pkv/cache.h"
#include "pkv/generate.h"
#include "pkv/model.h"
#include "pkv/pool.h"
#include "pkv/seq.h"

static const pkv_dtype qtypes[3] = {PKV_DTYPE_INT8, PKV_DTYPE_FP8_E4M3, PKV_DTYPE_FP8_E5M2};

static pkv_model *make_model(const pkv_model_config *c) {
    pkv_model_params mp = pkv_model_params_default();
    mp.num_threads = 1;
    mp.seed = 11;
    pkv_model *m = NULL;
    cr_assert_eq(pkv_model_create(c, &mp, &m), PKV_OK);
    return m;
}

// fp8 tensor scales back to "calibrate on the first pass", so that every run
// starts from the same state.
static void reset_scales(pkv_model *m, uint32_t layers) {
    float zero[2 * 64] = {0};
    cr_assert_leq(layers, 64u);
    cr_assert_eq(pkv_model_set_kv_scales(m, zero), PKV_OK);
}

static pkv_model_config tiny_config(void) {
    pkv_model_config c;
    cr_assert_eq(pkv_model_preset("tiny", &c), PKV_OK); // GPT-2 style, MHA, head_dim 64
    return c;
}

// Two requests of different lengths, greedy, through both layouts: equal tokens,
// equal logits at every step.
Test(model_quant, generate_contig_equals_paged) {
    const pkv_model_config cfgs[2] = {tiny_config(), small_llama_config()};
    for (int ci = 0; ci < 2; ci++) {
        const pkv_model_config *c = &cfgs[ci];
        pkv_model *m = make_model(c);
        const int32_t p0[9] = {1, 50, 7, 200, 22, 9, 211, 3, 4}, p1[4] = {5, 6, 7, 8};
        const pkv_gen_request req[2] = {{p0, 9}, {p1, 4}};
        const uint32_t N = 10, V = c->vocab_size;
        for (int i = 0; i < 3; i++) {
            int32_t tok[2][2][10];
            float *lg[2][2];
            for (int layout = 0; layout < 2; layout++) {
                pkv_gen_params gp = pkv_gen_params_default();
                gp.max_new_tokens = N;
                gp.kv_dtype = qtypes[i];
                gp.kv_mode = layout ? PKV_KV_CONTIGUOUS : PKV_KV_PAGED;
                gp.block_size = 4;
                pkv_gen_output out[2];
                for (int r = 0; r < 2; r++) {
                    lg[layout][r] = calloc((size_t)N * V, sizeof(float));
                    out[r] = (pkv_gen_output){tok[layout][r], lg[layout][r], 0, 0};
                }
                reset_scales(m, c->num_layers);
                cr_assert_eq(pkv_generate(m, &gp, 2, req, out, NULL), PKV_OK, "%s %s",
                             c->name, pkv_dtype_name(qtypes[i]));
                cr_assert_eq(out[0].num_tokens, N);
                cr_assert_eq(out[1].num_tokens, N);
            }
            for (int r = 0; r < 2; r++) {
                cr_assert_eq(memcmp(tok[0][r], tok[1][r], N * sizeof(int32_t)), 0,
                             "%s %s request %d: tokens differ", c->name,
                             pkv_dtype_name(qtypes[i]), r);
                float worst = max_abs_diff(lg[0][r], lg[1][r], (size_t)N * V);
                cr_assert_leq(worst, 1e-5f, "%s %s request %d: logits differ by %g", c->name,
                              pkv_dtype_name(qtypes[i]), r, worst);
                free(lg[0][r]);
                free(lg[1][r]);
            }
        }
        pkv_model_destroy(m);
    }
}

// The step API over an arena store: two prompts prefilled together, row 0 moved
// to another offset (its K/V and int8 scales copied), row 0 forked into row 2
// (copied), then decode steps of all three; the paged reference forks with
// copy-on-write. Same next tokens and logits at every step.
Test(model_quant, arena_moves_and_forks_keep_scales) {
    const pkv_model_config c = small_llama_config();
    pkv_model *m = make_model(&c);
    const uint32_t V = c.vocab_size, STEPS = 6;
    const int32_t prompts[12] = {3, 1, 4, 1, 5, 9, 2, 6, 10, 20, 30, 40};
    const uint32_t counts[2] = {8, 4};
    for (int i = 0; i < 3; i++) {
        const pkv_dtype dt = qtypes[i];
        // Paged reference.
        reset_scales(m, c.num_layers);
        pkv_cache_params cp;
        cr_assert_eq(pkv_model_cache_params(m, 4, &cp), PKV_OK);
        cp.dtype = dt;
        pkv_pool *pool;
        pkv_backend *host;
        pkv_seqset *set;
        pkv_cache *cache;
        cr_assert_eq(pkv_pool_create(32, &pool), PKV_OK);
        cr_assert_eq(pkv_backend_create_host(&host), PKV_OK);
        cr_assert_eq(pkv_seqset_create(pool, 4, &set), PKV_OK);
        cr_assert_eq(pkv_cache_create(&cp, pool, host, &cache), PKV_OK);
        pkv_seq_id seq[3];
        for (int s = 0; s < 2; s++) {
            cr_assert_eq(pkv_seq_create(set, &seq[s]), PKV_OK);
            cr_assert_eq(pkv_seq_append(set, seq[s], counts[s], NULL), PKV_OK);
        }
        float *lp = calloc((size_t)3 * V, sizeof(float)), *lc = calloc((size_t)3 * V, sizeof(float));
        int32_t np[3], nc[3];
        cr_assert_eq(pkv_model_prefill_paged(m, cache, set, 2, seq, counts, prompts, lp, np), PKV_OK);
        // Contiguous store: rows placed out of order, row 0 high in the arena.
        reset_scales(m, c.num_layers);
        pkv_contig_kv *kv;
        cr_assert_eq(pkv_contig_kv_create_arena(m, 3, 96, dt, &kv), PKV_OK);
        cr_assert_eq(pkv_contig_kv_place(kv, 0, 70, 20), PKV_OK);
        cr_assert_eq(pkv_contig_kv_place(kv, 1, 0, 20), PKV_OK);
        cr_assert_eq(pkv_contig_kv_place(kv, 2, 40, 20), PKV_OK);
        const uint32_t rows[3] = {0, 1, 2};
        for (int s = 0; s < 2; s++) cr_assert_eq(pkv_contig_kv_append(kv, rows[s], counts[s]), PKV_OK);
        cr_assert_eq(pkv_model_prefill_contig(m, kv, 2, rows, counts, prompts, lc, nc), PKV_OK);
        cr_assert_eq(memcmp(np, nc, 2 * sizeof(int32_t)), 0, "%s: prefill tokens", pkv_dtype_name(dt));
        cr_assert_leq(max_abs_diff(lp, lc, 2 * (size_t)V), 1e-5f, "%s: prefill logits", pkv_dtype_name(dt));
        // Move row 0 (allocate-copy-free) and fork it into row 2.
        cr_assert_eq(pkv_contig_kv_move_row(kv, 0, 20, 20), PKV_OK);
        cr_assert_eq(pkv_contig_kv_copy_row(kv, 0, 2), PKV_OK);
        cr_assert_eq(pkv_seq_fork(set, seq[0], &seq[2]), PKV_OK);
        np[2] = np[0];
        nc[2] = nc[0];
        for (uint32_t step = 0; step < STEPS; step++) {
            for (int s = 0; s < 3; s++) {
                cr_assert_eq(pkv_seq_append(set, seq[s], 1, NULL), PKV_OK);
                cr_assert_eq(pkv_contig_kv_append(kv, rows[s], 1), PKV_OK);
            }
            if (step == 0) np[2] = nc[2] = 77; // the fork takes another path from here
            int32_t tp[3], tc[3];
            memcpy(tp, np, sizeof tp);
            memcpy(tc, nc, sizeof tc);
            cr_assert_eq(pkv_model_decode_paged(m, cache, set, 3, seq, tp, lp, np), PKV_OK);
            cr_assert_eq(pkv_model_decode_contig(m, kv, 3, rows, tc, lc, nc), PKV_OK);
            cr_assert_eq(memcmp(np, nc, sizeof np), 0, "%s step %u: tokens", pkv_dtype_name(dt), step);
            float worst = max_abs_diff(lp, lc, 3 * (size_t)V);
            cr_assert_leq(worst, 1e-5f, "%s step %u: logits differ by %g", pkv_dtype_name(dt), step,
                          worst);
        }
        pkv_contig_kv_destroy(kv);
        pkv_cache_destroy(cache);
        pkv_seqset_destroy(set);
        pkv_backend_destroy(host);
        pkv_pool_destroy(pool);
        free(lp);
        free(lc);
    }
    pkv_model_destroy(m);
}

// Bytes held: fp8 one byte per element; int8 a token slot of kv_heads x (head_dim
// + 4) bytes padded to 16, per layer, K and V.
Test(model_quant, store_bytes) {
    const pkv_model_config c = small_llama_config(); // 2 layers, 2 kv heads, head_dim 16
    pkv_model *m = make_model(&c);
    pkv_contig_kv *kv;
    cr_assert_eq(pkv_contig_kv_create(m, 3, 10, PKV_DTYPE_FP8_E4M3, &kv), PKV_OK);
    cr_assert_eq(pkv_contig_kv_bytes(kv), 2ull * 2 * 30 * 2 * 16);
    pkv_contig_kv_destroy(kv);
    cr_assert_eq(pkv_contig_kv_create(m, 3, 10, PKV_DTYPE_INT8, &kv), PKV_OK);
    cr_assert_eq(pkv_contig_kv_bytes(kv), 2ull * 2 * 30 * 48); // 2 x (16 + 4) = 40 -> 48
    pkv_contig_kv_destroy(kv);
    pkv_model_destroy(m);
}

// Refusals: an unknown dtype, an 8-bit arena past the writer's 32-bit slot count
// (refused before any allocation), a step longer than a row, and nothing changes.
Test(model_quant, bad_input) {
    const pkv_model_config c = small_llama_config();
    pkv_model *m = make_model(&c);
    pkv_contig_kv *kv = NULL;
    cr_assert_eq(pkv_contig_kv_create(m, 2, 8, (pkv_dtype)77, &kv), PKV_ERR_INVALID_ARG);
    cr_assert_null(kv);
    for (int i = 0; i < 3; i++) {
        cr_assert_eq(pkv_contig_kv_create_arena(m, 2, (uint64_t)UINT32_MAX + 1, qtypes[i], &kv),
                     PKV_ERR_UNSUPPORTED, "%s", pkv_dtype_name(qtypes[i]));
        cr_assert_null(kv);
    }
    cr_assert_eq(pkv_contig_kv_create(m, 1, 4, PKV_DTYPE_INT8, &kv), PKV_OK);
    const uint32_t row = 0, five = 5;
    const int32_t toks[5] = {1, 2, 3, 4, 5};
    cr_assert_eq(pkv_contig_kv_append(kv, row, 5), PKV_ERR_BUFFER_TOO_SMALL);
    cr_assert_eq(pkv_contig_kv_append(kv, row, 4), PKV_OK);
    cr_assert_eq(pkv_model_prefill_contig(m, kv, 1, &row, &five, toks, NULL, NULL),
                 PKV_ERR_INVALID_ARG, "more new tokens than the row holds");
    const int32_t bad_tok = (int32_t)c.vocab_size;
    cr_assert_eq(pkv_model_decode_contig(m, kv, 1, &row, &bad_tok, NULL, NULL), PKV_ERR_INVALID_ARG);
    uint32_t len = 0;
    cr_assert_eq(pkv_contig_kv_length(kv, row, &len), PKV_OK);
    cr_assert_eq(len, 4);
    pkv_contig_kv_destroy(kv);
    pkv_model_destroy(m);
}

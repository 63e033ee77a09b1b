// SPDX-License-Identifier: MIT
// Generation tests: the KV cache is right. Generation with a cache (paged or
// contiguous) produces the same tokens as full recompute without a cache, and
// the logits each token came from agree within 1e-4 absolute, for several batch
// compositions and block sizes; paged and contiguous give identical tokens;
// n-way forked sampling equals n independent requests with fewer blocks; EOS
// and the token limit stop outputs; errors are reported.
#include <criterion/criterion.h>

#include "model_ref.h"
#include "pkv/generate.h"

#define TOL 1e-4f

typedef struct run {
    uint32_t num_out, max_new, vocab;
    int32_t *tokens;  // [num_out][max_new]
    float *logits;    // [num_out][max_new][vocab]
    pkv_gen_output *out;
    pkv_gen_stats stats;
} run;

static void run_free(run *r) {
    free(r->tokens);
    free(r->logits);
    free(r->out);
}

static pkv_status run_gen(pkv_model *m, const pkv_gen_params *p, uint32_t R,
                          const pkv_gen_request *req, run *r) {
    pkv_model_config c;
    pkv_model_get_config(m, &c);
    r->num_out = R * p->n;
    r->max_new = p->max_new_tokens;
    r->vocab = c.vocab_size;
    r->tokens = calloc((size_t)r->num_out * r->max_new, sizeof(int32_t));
    r->logits = calloc((size_t)r->num_out * r->max_new * r->vocab, sizeof(float));
    r->out = calloc(r->num_out, sizeof *r->out);
    for (uint32_t o = 0; o < r->num_out; o++) {
        r->out[o].tokens = r->tokens + (size_t)o * r->max_new;
        r->out[o].logits = r->logits + (size_t)o * r->max_new * r->vocab;
    }
    return pkv_generate(m, p, R, req, r->out, &r->stats);
}

// Same tokens; logits within TOL at every generated position.
static void expect_same(const run *a, const run *b, const char *what) {
    cr_assert_eq(a->num_out, b->num_out);
    for (uint32_t o = 0; o < a->num_out; o++) {
        cr_expect_eq(a->out[o].num_tokens, b->out[o].num_tokens, "%s output %u", what, o);
        for (uint32_t i = 0; i < a->out[o].num_tokens && i < b->out[o].num_tokens; i++)
            cr_expect_eq(a->out[o].tokens[i], b->out[o].tokens[i], "%s output %u token %u", what, o, i);
        size_t n = (size_t)a->out[o].num_tokens * a->vocab;
        float e = max_abs_diff(a->out[o].logits, b->out[o].logits, n);
        cr_expect_leq(e, TOL, "%s output %u: max |logit diff| = %g", what, o, e);
    }
}

static pkv_model *make(const pkv_model_config *c, uint64_t seed) {
    pkv_model_params p = pkv_model_params_default();
    p.seed = seed;
    pkv_model *m = NULL;
    cr_assert_eq(pkv_model_create(c, &p, &m), PKV_OK);
    return m;
}

static void prompts(uint32_t R, const uint32_t *lens, uint32_t vocab, int32_t *store,
                    pkv_gen_request *req) {
    for (uint32_t r = 0; r < R; r++) {
        for (uint32_t i = 0; i < lens[r]; i++)
            store[i] = (int32_t)((i * 31u + r * 977u + 5u) % vocab);
        req[r].prompt = store;
        req[r].prompt_len = lens[r];
        store += lens[r];
    }
}

// For one batch composition: none (recompute) vs paged (two block sizes) vs
// contiguous, greedy.
static void cache_equals_recompute(const pkv_model_config *c, uint32_t R, const uint32_t *lens,
                                   uint32_t max_new) {
    pkv_model *m = make(c, 21);
    int32_t store[256];
    pkv_gen_request req[8];
    prompts(R, lens, c->vocab_size, store, req);
    pkv_gen_params p = pkv_gen_params_default();
    p.max_new_tokens = max_new;
    run none, paged16, paged3, contig;
    p.kv_mode = PKV_KV_NONE;
    cr_assert_eq(run_gen(m, &p, R, req, &none), PKV_OK);
    p.kv_mode = PKV_KV_PAGED;
    p.block_size = 16;
    cr_assert_eq(run_gen(m, &p, R, req, &paged16), PKV_OK);
    p.block_size = 3;
    cr_assert_eq(run_gen(m, &p, R, req, &paged3), PKV_OK);
    p.kv_mode = PKV_KV_CONTIGUOUS;
    cr_assert_eq(run_gen(m, &p, R, req, &contig), PKV_OK);
    for (uint32_t o = 0; o < R; o++) cr_expect_eq(none.out[o].num_tokens, max_new);
    expect_same(&paged16, &none, "paged B=16 vs recompute");
    expect_same(&paged3, &none, "paged B=3 vs recompute");
    expect_same(&contig, &none, "contiguous vs recompute");
    expect_same(&paged16, &contig, "paged vs contiguous");
    cr_expect_eq(paged16.stats.decode_steps, max_new - 1);
    uint64_t prompt_total = 0;
    for (uint32_t r = 0; r < R; r++) prompt_total += lens[r];
    cr_expect_eq(paged16.stats.prompt_tokens, prompt_total);
    cr_expect_eq(paged16.stats.generated_tokens, (uint64_t)R * max_new);
    cr_expect_gt(paged16.stats.peak_blocks, 0);
    run_free(&none);
    run_free(&paged16);
    run_free(&paged3);
    run_free(&contig);
    pkv_model_destroy(m);
}

Test(generate, cache_equals_recompute_single_prompt) {
    pkv_model_config c;
    pkv_model_preset("tiny", &c);
    uint32_t lens[1] = {7};
    cache_equals_recompute(&c, 1, lens, 10);
}

Test(generate, cache_equals_recompute_mixed_batch) {
    pkv_model_config c;
    pkv_model_preset("tiny", &c);
    uint32_t lens[4] = {1, 16, 33, 5};
    cache_equals_recompute(&c, 4, lens, 8);
}

Test(generate, cache_equals_recompute_llama_gqa) {
    pkv_model_config c = small_llama_config();
    uint32_t lens[3] = {12, 2, 40};
    cache_equals_recompute(&c, 3, lens, 12);
}

// Greedy generation is a chain: each token is the argmax of the logits it was
// recorded with, and those logits are the full forward pass over the prefix
// (which test_model checks against the naive reference).
Test(generate, greedy_tokens_follow_reference_argmax) {
    pkv_model_config c = small_llama_config();
    pkv_model *m = make(&c, 4);
    int32_t prompt[6] = {3, 14, 15, 92, 65, 35};
    pkv_gen_request req = {prompt, 6};
    pkv_gen_params p = pkv_gen_params_default();
    p.max_new_tokens = 5;
    run r;
    cr_assert_eq(run_gen(m, &p, 1, &req, &r), PKV_OK);
    int32_t seq[16];
    memcpy(seq, prompt, sizeof prompt);
    memcpy(seq + 6, r.out[0].tokens, 5 * sizeof(int32_t));
    for (uint32_t i = 0; i < 5; i++) {
        cr_expect_eq(r.out[0].tokens[i], pkv_argmax(r.out[0].logits + (size_t)i * c.vocab_size, c.vocab_size));
        float lg[300];
        uint32_t len = 6 + i;
        cr_assert_eq(pkv_model_forward_nocache(m, 1, &len, seq, lg, NULL), PKV_OK);
        cr_expect_leq(max_abs_diff(lg, r.out[0].logits + (size_t)i * c.vocab_size, c.vocab_size), TOL);
    }
    run_free(&r);
    pkv_model_destroy(m);
}

// n-way forked sampling == n independent single-sample requests, fewer blocks.
static void fork_equals_independent(pkv_kv_mode mode, uint32_t prompt_len) {
    pkv_model_config c;
    pkv_model_preset("tiny", &c);
    pkv_model *m = make(&c, 8);
    int32_t prompt[64];
    for (uint32_t i = 0; i < prompt_len; i++) prompt[i] = (int32_t)((i * 13 + 1) % c.vocab_size);
    const uint32_t n = 4;
    pkv_gen_request one = {prompt, prompt_len}, many[4] = {one, one, one, one};
    pkv_gen_params p = pkv_gen_params_default();
    p.kv_mode = mode;
    p.block_size = 8;
    p.max_new_tokens = 9;
    p.temperature = 0.9f;
    p.top_k = 50;
    p.seed = 1234;
    p.n = n;
    run forked, indep;
    cr_assert_eq(run_gen(m, &p, 1, &one, &forked), PKV_OK);
    p.n = 1;
    cr_assert_eq(run_gen(m, &p, n, many, &indep), PKV_OK);
    expect_same(&forked, &indep, "forked vs independent");
    // Sampling differs between outputs (else the test proves little).
    int differ = 0;
    for (uint32_t i = 0; i < 9; i++) differ |= forked.out[0].tokens[i] != forked.out[1].tokens[i];
    cr_expect(differ, "outputs 0 and 1 sampled the same tokens");
    cr_expect_eq(forked.stats.prompt_tokens, prompt_len, "the prompt is prefilled once");
    cr_expect_eq(indep.stats.prompt_tokens, (uint64_t)n * prompt_len);
    if (mode == PKV_KV_PAGED) {
        cr_expect_lt(forked.stats.peak_blocks, indep.stats.peak_blocks, "forked %u vs independent %u",
                     forked.stats.peak_blocks, indep.stats.peak_blocks);
        // Copy-on-write happens once per child exactly when the last prompt block is partial.
        cr_expect_eq(forked.stats.cow_copies, prompt_len % 8 ? n - 1 : 0);
        cr_expect_eq(indep.stats.cow_copies, 0);
    }
    run_free(&forked);
    run_free(&indep);
    pkv_model_destroy(m);
}

Test(generate, forked_sampling_equals_independent_paged) {
    fork_equals_independent(PKV_KV_PAGED, 21);
    fork_equals_independent(PKV_KV_PAGED, 24); // full last block: no copy
}

Test(generate, forked_sampling_equals_independent_contiguous) {
    fork_equals_independent(PKV_KV_CONTIGUOUS, 21);
}

Test(generate, eos_and_limit_stop_outputs) {
    pkv_model_config c;
    pkv_model_preset("tiny", &c);
    pkv_model *m = make(&c, 2);
    int32_t prompt[5] = {1, 2, 3, 4, 5};
    pkv_gen_request req = {prompt, 5};
    pkv_gen_params p = pkv_gen_params_default();
    p.max_new_tokens = 8;
    run full;
    cr_assert_eq(run_gen(m, &p, 1, &req, &full), PKV_OK);
    cr_expect_eq(full.out[0].num_tokens, 8);
    cr_expect_eq(full.out[0].hit_eos, 0);
    // Stop at the 4th token: take its value as EOS (first occurrence).
    int32_t eos = full.out[0].tokens[3];
    uint32_t first = 0;
    while (full.out[0].tokens[first] != eos) first++;
    for (int mode = 0; mode <= 2; mode++) {
        p.kv_mode = (pkv_kv_mode)mode;
        p.eos_token = eos;
        run r;
        cr_assert_eq(run_gen(m, &p, 1, &req, &r), PKV_OK);
        cr_expect_eq(r.out[0].num_tokens, first + 1, "%s", pkv_kv_mode_name(p.kv_mode));
        cr_expect_eq(r.out[0].hit_eos, 1);
        cr_expect_eq(r.out[0].tokens[first], eos);
        run_free(&r);
    }
    // max_new_tokens = 1: only the prefill's token, no decode step; with n = 2
    // the fork source stops at once too.
    p.eos_token = -1;
    p.kv_mode = PKV_KV_PAGED;
    p.max_new_tokens = 1;
    p.n = 2;
    run one;
    cr_assert_eq(run_gen(m, &p, 1, &req, &one), PKV_OK);
    cr_expect_eq(one.out[0].num_tokens, 1);
    cr_expect_eq(one.out[1].num_tokens, 1);
    cr_expect_eq(one.stats.decode_steps, 0);
    cr_expect_eq(one.out[0].tokens[0], full.out[0].tokens[0]);
    run_free(&one);
    run_free(&full);
    pkv_model_destroy(m);
}

Test(generate, errors) {
    pkv_model_config c;
    pkv_model_preset("tiny", &c);
    pkv_model *m = make(&c, 2);
    int32_t prompt[40] = {0};
    pkv_gen_request req = {prompt, 40};
    pkv_gen_params p = pkv_gen_params_default();
    run r;
    p.num_blocks = 2; // 40 + 16 tokens need 4 blocks of 16
    cr_expect_eq(run_gen(m, &p, 1, &req, &r), PKV_ERR_OUT_OF_BLOCKS);
    run_free(&r);
    p = pkv_gen_params_default();
    p.max_new_tokens = 0;
    cr_expect_eq(run_gen(m, &p, 1, &req, &r), PKV_ERR_INVALID_ARG);
    run_free(&r);
    p = pkv_gen_params_default();
    p.n = 0;
    cr_expect_eq(pkv_generate(m, &p, 1, &req, NULL, NULL), PKV_ERR_INVALID_ARG);
    p.n = 1;
    p.max_new_tokens = c.max_seq_len; // prompt + new beyond the learned positions
    cr_expect_eq(run_gen(m, &p, 1, &req, &r), PKV_ERR_INVALID_ARG);
    run_free(&r);
    p = pkv_gen_params_default();
    int32_t bad[2] = {1, 512};
    pkv_gen_request breq = {bad, 2};
    cr_expect_eq(run_gen(m, &p, 1, &breq, &r), PKV_ERR_INVALID_ARG);
    run_free(&r);
    pkv_gen_request empty = {prompt, 0};
    cr_expect_eq(run_gen(m, &p, 1, &empty, &r), PKV_ERR_INVALID_ARG);
    run_free(&r);
    p.temperature = -1.0f;
    cr_expect_eq(run_gen(m, &p, 1, &req, &r), PKV_ERR_INVALID_ARG);
    run_free(&r);
    p = pkv_gen_params_default();
    p.kv_mode = (pkv_kv_mode)7;
    cr_expect_eq(run_gen(m, &p, 1, &req, &r), PKV_ERR_INVALID_ARG);
    run_free(&r);
    cr_expect_str_eq(pkv_kv_mode_name(PKV_KV_CONTIGUOUS), "contiguous");
    pkv_model_destroy(m);
}

// fp16 / bf16 stores: paged and contiguous agree (same rounding of q, k, v and
// of the attention output; only summation order differs: 1e-3), and both stay
// close to the fp32 recompute on the first token's logits (the rounding of q,
// K, V and the attention output; bf16's 8-bit mantissa is the coarser).
static void half_cache(pkv_dtype dtype, float tol_vs_fp32) {
    pkv_model_config c;
    pkv_model_preset("tiny", &c);
    pkv_model *m = make(&c, 21);
    int32_t store[256];
    pkv_gen_request req[3];
    uint32_t lens[3] = {5, 19, 34};
    prompts(3, lens, c.vocab_size, store, req);
    pkv_gen_params p = pkv_gen_params_default();
    p.max_new_tokens = 6;
    run ref, paged, paged3, contig;
    p.kv_mode = PKV_KV_NONE;
    cr_assert_eq(run_gen(m, &p, 3, req, &ref), PKV_OK);
    p.kv_dtype = dtype;
    p.kv_mode = PKV_KV_PAGED;
    cr_assert_eq(run_gen(m, &p, 3, req, &paged), PKV_OK);
    p.block_size = 3;
    cr_assert_eq(run_gen(m, &p, 3, req, &paged3), PKV_OK);
    p.kv_mode = PKV_KV_CONTIGUOUS;
    cr_assert_eq(run_gen(m, &p, 3, req, &contig), PKV_OK);
    for (uint32_t o = 0; o < 3; o++) {
        cr_expect_eq(memcmp(paged.out[o].tokens, contig.out[o].tokens, 6 * sizeof(int32_t)), 0,
                     "%s output %u: paged and contiguous tokens differ", pkv_dtype_name(dtype), o);
        cr_expect_eq(memcmp(paged.out[o].tokens, paged3.out[o].tokens, 6 * sizeof(int32_t)), 0);
        float e = max_abs_diff(paged.out[o].logits, contig.out[o].logits, (size_t)6 * c.vocab_size);
        cr_expect_leq(e, 1e-3f, "%s output %u: paged vs contiguous %g", pkv_dtype_name(dtype), o, e);
        // Against fp32: the logits of the first token (same prefix for both).
        float e0 = max_abs_diff(paged.out[o].logits, ref.out[o].logits, c.vocab_size);
        cr_expect_leq(e0, tol_vs_fp32, "%s output %u: vs fp32 %g", pkv_dtype_name(dtype), o, e0);
        cr_expect_gt(e0, 0.0f, "a %s cache must round something", pkv_dtype_name(dtype));
        if (getenv("PKV_TEST_VERBOSE"))
            cr_log_info("%s output %u: paged-contig %g, vs fp32 %g", pkv_dtype_name(dtype), o, e, e0);
    }
    // A 16-bit cache holds the same blocks in half the bytes.
    pkv_gen_params p32 = pkv_gen_params_default();
    p32.max_new_tokens = 6;
    run full;
    cr_assert_eq(run_gen(m, &p32, 3, req, &full), PKV_OK);
    cr_expect_eq(paged.stats.peak_blocks, full.stats.peak_blocks);
    cr_expect_eq(2 * paged.stats.kv_bytes_peak, full.stats.kv_bytes_peak);
    run_free(&full);
    run_free(&ref);
    run_free(&paged);
    run_free(&paged3);
    run_free(&contig);
    pkv_model_destroy(m);
}

// Measured: fp16 3e-4, bf16 2.3e-3 from fp32; the bounds leave ~8x margin.
Test(generate, fp16_cache) { half_cache(PKV_DTYPE_F16, 2e-3f); }
Test(generate, bf16_cache) { half_cache(PKV_DTYPE_BF16, 2e-2f); }

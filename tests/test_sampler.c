// SPDX-License-Identifier: MIT
// Sampler tests: greedy is argmax; top-k restricts the support to the k largest
// logits; seeded draws are reproducible and streams differ; the empirical
// distribution matches softmax(logits / T) (chi-square bound); bad input fails.
#include <criterion/criterion.h>
#include <math.h>

#include "pkv/generate.h"

Test(sampler, greedy_is_argmax_and_uses_no_randomness) {
    pkv_sampler *s = NULL;
    cr_assert_eq(pkv_sampler_create(5, 0.0f, 0, &s), PKV_OK);
    float lg[5] = {0.1f, 2.0f, -1.0f, 3.5f, 3.4f};
    uint64_t rng = 77, before = rng;
    int32_t t = -1;
    cr_assert_eq(pkv_sampler_sample(s, lg, &rng, &t), PKV_OK);
    cr_expect_eq(t, 3);
    cr_expect_eq(rng, before);
    pkv_sampler_destroy(s);
}

Test(sampler, top_k_keeps_only_the_k_largest) {
    const uint32_t V = 50;
    float lg[50];
    for (uint32_t i = 0; i < V; i++) lg[i] = (float)((i * 37) % V) * 0.01f; // a permutation
    pkv_sampler *s = NULL;
    cr_assert_eq(pkv_sampler_create(V, 100.0f, 3, &s), PKV_OK); // nearly uniform over the top 3
    uint64_t rng = pkv_rng_init(5, 0);
    int seen[50] = {0};
    for (int i = 0; i < 3000; i++) {
        int32_t t;
        cr_assert_eq(pkv_sampler_sample(s, lg, &rng, &t), PKV_OK);
        cr_assert(t >= 0 && (uint32_t)t < V);
        seen[t]++;
    }
    int distinct = 0;
    for (uint32_t i = 0; i < V; i++) {
        if (seen[i]) {
            distinct++;
            cr_expect_geq(lg[i], 0.47f, "token %u (logit %g) is outside the top 3", i, lg[i]);
        }
    }
    cr_expect_eq(distinct, 3);
    pkv_sampler_destroy(s);
    // top_k = 1 is greedy at any temperature.
    cr_assert_eq(pkv_sampler_create(V, 2.0f, 1, &s), PKV_OK);
    int32_t t;
    cr_assert_eq(pkv_sampler_sample(s, lg, &rng, &t), PKV_OK);
    cr_expect_float_eq(lg[t], 0.49f, 1e-6);
    pkv_sampler_destroy(s);
}

Test(sampler, matches_softmax_distribution) {
    const uint32_t V = 6;
    float lg[6] = {1.0f, 0.5f, 0.0f, -0.5f, 2.0f, 1.5f};
    const float T = 0.7f;
    double p[6], z = 0;
    for (uint32_t i = 0; i < V; i++) z += p[i] = exp(lg[i] / T);
    pkv_sampler *s = NULL;
    cr_assert_eq(pkv_sampler_create(V, T, 0, &s), PKV_OK);
    uint64_t rng = pkv_rng_init(9, 3);
    const int N = 20000;
    int cnt[6] = {0};
    for (int i = 0; i < N; i++) {
        int32_t t;
        pkv_sampler_sample(s, lg, &rng, &t);
        cnt[t]++;
    }
    double chi2 = 0;
    for (uint32_t i = 0; i < V; i++) {
        double e = N * p[i] / z;
        chi2 += (cnt[i] - e) * (cnt[i] - e) / e;
    }
    // 5 degrees of freedom: P(chi2 > 25) ~ 1e-4 for a correct sampler.
    cr_expect_lt(chi2, 25.0, "chi2 = %g", chi2);
    pkv_sampler_destroy(s);
}

Test(sampler, seeded_streams_reproduce_and_differ) {
    cr_expect_eq(pkv_rng_init(1, 2), pkv_rng_init(1, 2));
    cr_expect_neq(pkv_rng_init(1, 2), pkv_rng_init(1, 3));
    cr_expect_neq(pkv_rng_init(1, 2), pkv_rng_init(2, 2));
    float lg[100];
    for (int i = 0; i < 100; i++) lg[i] = 0.0f;
    pkv_sampler *s = NULL;
    cr_assert_eq(pkv_sampler_create(100, 1.0f, 0, &s), PKV_OK);
    uint64_t a = pkv_rng_init(4, 0), b = pkv_rng_init(4, 0), c = pkv_rng_init(4, 1);
    int same_ab = 1, same_ac = 1;
    for (int i = 0; i < 20; i++) {
        int32_t ta, tb, tc;
        pkv_sampler_sample(s, lg, &a, &ta);
        pkv_sampler_sample(s, lg, &b, &tb);
        pkv_sampler_sample(s, lg, &c, &tc);
        same_ab &= ta == tb;
        same_ac &= ta == tc;
    }
    cr_expect(same_ab);
    cr_expect(!same_ac);
    pkv_sampler_destroy(s);
}

Test(sampler, errors) {
    pkv_sampler *s = NULL;
    cr_expect_eq(pkv_sampler_create(0, 1.0f, 0, &s), PKV_ERR_INVALID_ARG);
    cr_expect_eq(pkv_sampler_create(4, -0.1f, 0, &s), PKV_ERR_INVALID_ARG);
    cr_expect_eq(pkv_sampler_create(4, NAN, 0, &s), PKV_ERR_INVALID_ARG);
    cr_expect_eq(pkv_sampler_create(4, 1.0f, 0, NULL), PKV_ERR_INVALID_ARG);
    cr_assert_eq(pkv_sampler_create(4, 1.0f, 0, &s), PKV_OK);
    float lg[4] = {0, NAN, 0, 0};
    uint64_t rng = 1;
    int32_t t;
    cr_expect_eq(pkv_sampler_sample(s, lg, &rng, &t), PKV_ERR_INVALID_ARG);
    cr_expect_eq(pkv_sampler_sample(s, NULL, &rng, &t), PKV_ERR_INVALID_ARG);
    pkv_sampler_destroy(s);
    pkv_sampler_destroy(NULL);
}

// SPDX-License-Identifier: MIT
// Prefix hits across KV cache groups (hybrid_hit.h): hand-computed cases for each
// layer kind's rule, mixed block sizes, the prefix pool's hybrid lookup, bad input,
// and a randomized comparison with a token-level reference that states the rules
// directly (which tokens the next query needs) instead of in blocks.
#include <criterion/criterion.h>
#include <stdlib.h>
#include <string.h>

#include "pkv/hybrid_hit.h"
#include "pkv/prefix_pool.h"

static pkv_hit_group G(pkv_layer_kind kind, uint32_t window, uint32_t block, const uint8_t *cached,
                       uint32_t n) {
    return (pkv_hit_group){.kind = kind, .window = window, .block_size = block, .num_blocks = n,
                           .cached = cached};
}

static uint32_t hit(const pkv_hit_group *g, uint32_t n, uint32_t max_tokens) {
    uint32_t h = 12345;
    cr_assert_eq(pkv_hybrid_longest_hit(g, n, max_tokens, &h), PKV_OK);
    return h;
}

Test(hybrid_hit, full_attention_is_the_leading_run) {
    const uint8_t c[] = {1, 1, 1, 0, 1};
    pkv_hit_group g = G(PKV_LAYER_FULL, 0, 4, c, 5);
    cr_expect_eq(hit(&g, 1, 100), 12);
    cr_expect_eq(hit(&g, 1, 11), 8); // capped, then down to a block boundary
    const uint8_t all[] = {1, 1, 1, 1, 1};
    g.cached = all;
    cr_expect_eq(hit(&g, 1, 19), 16);
    cr_expect_eq(hit(&g, 1, 3), 0);
}

Test(hybrid_hit, sliding_window_needs_only_the_window) {
    // W 4, B 2: a hit of L needs tokens L-3..L-1. Blocks 0 and 1 evicted.
    const uint8_t c[] = {0, 0, 1, 1};
    pkv_hit_group g = G(PKV_LAYER_SLIDING, 4, 2, c, 4);
    cr_expect_eq(hit(&g, 1, 100), 8); // tokens 5..7: blocks 2, 3
    // A hole inside: L=12 needs blocks 4,5 (5 missing), L=10 blocks 3,4 (4 missing),
    // L=8 blocks 2,3: hit.
    const uint8_t h[] = {1, 0, 1, 1, 0, 1};
    g = G(PKV_LAYER_SLIDING, 4, 2, h, 6);
    cr_expect_eq(hit(&g, 1, 100), 8);
    // With a full group whose run stops at block 2 (tokens 0..3): L=4 needs sliding
    // tokens 1..3 = blocks 0, 1 (1 missing); L=2 needs block 0: hit 2.
    const uint8_t f[] = {1, 1, 0, 1, 1, 1};
    pkv_hit_group two[2] = {G(PKV_LAYER_FULL, 0, 2, f, 6), g};
    cr_expect_eq(hit(two, 2, 100), 2);
}

Test(hybrid_hit, chunked_needs_the_current_chunk_only) {
    // C 8, B 4. L=16 starts a new chunk: the next query needs nothing of the past.
    const uint8_t c[] = {0, 0, 1, 0};
    pkv_hit_group g = G(PKV_LAYER_CHUNKED, 8, 4, c, 4);
    cr_expect_eq(hit(&g, 1, 16), 16);
    // Capped at 15: L=12 needs tokens 8..11 = block 2: cached.
    cr_expect_eq(hit(&g, 1, 15), 12);
    const uint8_t d[] = {1, 1, 0, 1};
    g.cached = d;
    cr_expect_eq(hit(&g, 1, 15), 8); // L=12 needs block 2 (missing); L=8 nothing
}

Test(hybrid_hit, state_needs_the_state_at_the_boundary) {
    const uint8_t f[] = {1, 1, 1}, s[] = {0, 1, 0};
    pkv_hit_group g[2] = {G(PKV_LAYER_FULL, 0, 4, f, 3), G(PKV_LAYER_STATE, 0, 4, s, 3)};
    cr_expect_eq(hit(g, 2, 100), 8);
    uint32_t first = 9, count = 9;
    cr_assert_eq(pkv_hybrid_hit_blocks(&g[1], 8, &first, &count), PKV_OK);
    cr_expect_eq(first, 1);
    cr_expect_eq(count, 1);
}

Test(hybrid_hit, mixed_block_sizes_align_to_their_lcm) {
    // Full B 4 (run of 5 blocks: 20 tokens), sliding W 5 B 6: hits are multiples of
    // 12. L=12: sliding needs tokens 8..11 = block 1: cached; L=24 is above the cap.
    const uint8_t f[] = {1, 1, 1, 1, 1, 0}, w[] = {1, 1, 1, 1};
    pkv_hit_group g[2] = {G(PKV_LAYER_FULL, 0, 4, f, 6), G(PKV_LAYER_SLIDING, 5, 6, w, 4)};
    cr_expect_eq(hit(g, 2, 100), 12);
    const uint8_t f2[] = {1, 1, 1, 1, 1, 1};
    g[0].cached = f2;
    cr_expect_eq(hit(g, 2, 100), 24);
}

Test(hybrid_hit, hit_blocks_per_kind) {
    uint32_t first, count;
    pkv_hit_group s = G(PKV_LAYER_SLIDING, 4, 2, NULL, 0);
    cr_assert_eq(pkv_hybrid_hit_blocks(&s, 8, &first, &count), PKV_OK);
    cr_expect(first == 2 && count == 2);
    pkv_hit_group c = G(PKV_LAYER_CHUNKED, 8, 4, NULL, 0);
    cr_assert_eq(pkv_hybrid_hit_blocks(&c, 12, &first, &count), PKV_OK);
    cr_expect(first == 2 && count == 1);
    pkv_hit_group f = G(PKV_LAYER_MLA, 0, 4, NULL, 0);
    cr_assert_eq(pkv_hybrid_hit_blocks(&f, 12, &first, &count), PKV_OK);
    cr_expect(first == 0 && count == 3);
    cr_assert_eq(pkv_hybrid_hit_blocks(&f, 0, &first, &count), PKV_OK);
    cr_expect(first == 0 && count == 0);
    cr_expect_eq(pkv_hybrid_hit_blocks(&f, 13, &first, &count), PKV_ERR_INVALID_ARG);
}

Test(hybrid_hit, bad_input_is_refused) {
    const uint8_t c[] = {1};
    uint32_t h;
    pkv_hit_group g = G(PKV_LAYER_FULL, 0, 0, c, 1);
    cr_expect_eq(pkv_hybrid_longest_hit(&g, 1, 10, &h), PKV_ERR_INVALID_ARG); // block 0
    g = G(PKV_LAYER_SLIDING, 0, 4, c, 1);
    cr_expect_eq(pkv_hybrid_longest_hit(&g, 1, 10, &h), PKV_ERR_INVALID_ARG); // window 0
    g = G((pkv_layer_kind)9, 0, 4, c, 1);
    cr_expect_eq(pkv_hybrid_longest_hit(&g, 1, 10, &h), PKV_ERR_INVALID_ARG); // kind
    g = G(PKV_LAYER_FULL, 0, 4, NULL, 1);
    cr_expect_eq(pkv_hybrid_longest_hit(&g, 1, 10, &h), PKV_ERR_INVALID_ARG); // no bitmap
    pkv_hit_group big[2] = {G(PKV_LAYER_FULL, 0, 65537, c, 1), G(PKV_LAYER_FULL, 0, 65539, c, 1)};
    cr_expect_eq(pkv_hybrid_longest_hit(big, 2, 10, &h), PKV_ERR_INVALID_ARG); // LCM > 2^31
    cr_expect_eq(pkv_hybrid_longest_hit(big, 0, 10, &h), PKV_ERR_INVALID_ARG);
    cr_expect_eq(pkv_hybrid_longest_hit(NULL, 1, 10, &h), PKV_ERR_INVALID_ARG);
}

// Token-level reference: L is a hit when it is aligned in every group and every
// token the next query (position L) needs lies in a known, cached block.
static int ref_accepts(const pkv_hit_group *g, uint32_t L) {
    const uint32_t B = g->block_size;
    if (L % B) return 0;
    if (L == 0) return 1;
    if (g->kind == PKV_LAYER_STATE) return L / B <= g->num_blocks && g->cached[L / B - 1];
    uint32_t lo = 0;
    if (g->kind == PKV_LAYER_SLIDING) lo = L + 1 > g->window ? L + 1 - g->window : 0;
    if (g->kind == PKV_LAYER_CHUNKED) lo = L - L % g->window;
    for (uint32_t t = lo; t < L; t++)
        if (t / B >= g->num_blocks || !g->cached[t / B]) return 0;
    return L / B <= g->num_blocks;
}

Test(hybrid_hit, randomized_against_token_reference) {
    srand(23);
    uint8_t bits[PKV_MAX_KV_GROUPS][64];
    for (int iter = 0; iter < 20000; iter++) {
        uint32_t n = 1 + (uint32_t)rand() % 4;
        pkv_hit_group g[PKV_MAX_KV_GROUPS];
        static const uint32_t sizes[] = {1, 2, 3, 4, 6, 8};
        for (uint32_t i = 0; i < n; i++) {
            g[i].kind = (pkv_layer_kind)(rand() % 5);
            g[i].window = 1 + (uint32_t)rand() % 20;
            g[i].block_size = sizes[rand() % 6];
            g[i].num_blocks = (uint32_t)rand() % 40;
            int density = rand() % 4; // 0: sparse .. 3: almost all cached
            for (uint32_t b = 0; b < g[i].num_blocks; b++) bits[i][b] = rand() % 4 <= density;
            g[i].cached = bits[i];
        }
        uint32_t max_tokens = (uint32_t)rand() % 120, want = 0;
        for (uint32_t L = max_tokens; L > 0 && !want; L--) {
            uint32_t i = 0;
            while (i < n && ref_accepts(&g[i], L)) i++;
            if (i == n) want = L;
        }
        uint32_t got;
        cr_assert_eq(pkv_hybrid_longest_hit(g, n, max_tokens, &got), PKV_OK);
        cr_assert_eq(got, want, "iteration %d: hit %u, reference %u", iter, got, want);
    }
}

static pkv_block_hash H(uint64_t v) {
    pkv_block_hash h;
    memset(&h, 0, sizeof h);
    h.len = 8;
    for (int i = 0; i < 8; i++) h.bytes[i] = (uint8_t)(v >> (8 * i));
    return h;
}

Test(hybrid_hit, prefix_pool_hybrid_lookup) {
    // Group 0 full attention, group 1 sliding window 4, both block size 2; a request
    // of 5 blocks. Group 0 caches blocks 0..3, group 1 only blocks 2..4 (its early
    // blocks left the window and were evicted): the hit is 8 tokens, group 1 reuses
    // blocks 2 and 3 and pads 0 and 1 with the null block.
    pkv_prefix_pool_params prm = pkv_prefix_pool_params_default(16);
    prm.num_groups = 2;
    pkv_prefix_pool *p;
    cr_assert_eq(pkv_prefix_pool_create(&prm, &p), PKV_OK);
    pkv_block_hash h0[5], h1[5];
    for (int i = 0; i < 5; i++) h0[i] = H(100 + i), h1[i] = H(200 + i);
    pkv_block_id b0[4], b1[3];
    cr_assert_eq(pkv_prefix_pool_get_new_blocks(p, 4, b0), PKV_OK);
    cr_assert_eq(pkv_prefix_pool_get_new_blocks(p, 3, b1), PKV_OK);
    cr_assert_eq(pkv_prefix_pool_cache_blocks(p, &(pkv_block_store){.group = 0, .n = 4, .blocks = b0,
                                                 .hashes = h0, .block_size = 2, .lora_id = PKV_NO_LORA}),
                 PKV_OK);
    cr_assert_eq(pkv_prefix_pool_cache_blocks(p, &(pkv_block_store){.group = 1, .n = 3, .blocks = b1,
                                                 .hashes = h1 + 2, .parent = &h1[1], .block_size = 2,
                                                 .lora_id = PKV_NO_LORA}),
                 PKV_OK);
    pkv_block_id ids0[5], ids1[5];
    pkv_hybrid_lookup q[2] = {
        {.rule = {.kind = PKV_LAYER_FULL, .block_size = 2}, .hashes = h0, .num_hashes = 5, .ids = ids0},
        {.rule = {.kind = PKV_LAYER_SLIDING, .window = 4, .block_size = 2}, .hashes = h1, .num_hashes = 5,
         .ids = ids1},
    };
    uint32_t hit_tokens = 0;
    cr_assert_eq(pkv_prefix_pool_find_hybrid_prefix(p, q, 2, 9, &hit_tokens), PKV_OK);
    cr_expect_eq(hit_tokens, 8);
    cr_expect_eq(q[0].num_ids, 4);
    cr_expect_eq(q[1].num_ids, 4);
    for (int i = 0; i < 4; i++) cr_expect_eq(ids0[i], b0[i]);
    cr_expect_eq(ids1[0], PKV_NULL_BLOCK);
    cr_expect_eq(ids1[1], PKV_NULL_BLOCK);
    cr_expect_eq(ids1[2], b1[0]);
    cr_expect_eq(ids1[3], b1[1]);
    // The longest plain prefix of group 1 is 0 blocks: only the hybrid rule hits.
    uint32_t plain = 9;
    cr_assert_eq(pkv_prefix_pool_find_prefix(p, 1, h1, 5, ids1, &plain), PKV_OK);
    cr_expect_eq(plain, 0);
    // A group the pool does not have is refused.
    pkv_hybrid_lookup three[3] = {q[0], q[1], q[1]};
    cr_expect_eq(pkv_prefix_pool_find_hybrid_prefix(p, three, 3, 9, &hit_tokens), PKV_ERR_INVALID_ARG);
    cr_expect_eq(pkv_prefix_pool_validate(p), PKV_OK);
    pkv_prefix_pool_destroy(p);
}

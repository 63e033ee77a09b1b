// SPDX-License-Identifier: MIT
// The hybrid KV manager's prefix cache (pkv/hybrid.h, "Prefix cache"): hand-computed
// hits per group kind (full, sliding with its holes before the window, chunked,
// MLA, a state model: hits only where a state is cached), the n - 1 rule, the
// probe, eviction under pressure (leaf first for full groups, oldest first for
// sliding ones, LCM large pages, cached states giving way to sequences) with
// pkv_hybrid_validate after every step, a randomized test against a token-level
// reference (states included), and a sweep over the four layouts.
#include <criterion/criterion.h>
#include <stdlib.h>
#include <string.h>

#include "hybrid_fixture.h"
#include "pkv/hybrid.h"

// Parameters at elem 1 and max_seqs 16; tests change what they need before create.
static pkv_hybrid_params params_for(const pkv_kv_group *groups, uint32_t n, pkv_hybrid_layout layout,
                                    uint64_t budget, uint32_t block_size, uint32_t cache_blocks) {
    pkv_hybrid_params p = hybrid_test_params(groups, n, layout, budget, block_size);
    p.max_seqs = 16;
    p.prefix_cache_blocks = cache_blocks;
    return p;
}

static pkv_hybrid *make_cached(const pkv_kv_group *groups, uint32_t n, pkv_hybrid_layout layout,
                               uint64_t budget, uint32_t block_size, uint32_t cache_blocks) {
    const pkv_hybrid_params p = params_for(groups, n, layout, budget, block_size, cache_blocks);
    pkv_hybrid *h = NULL;
    cr_assert_eq(pkv_hybrid_create(&p, &h), PKV_OK, "create %s", pkv_hybrid_layout_name(layout));
    return h;
}

static void ok(const pkv_hybrid *h) { cr_assert_eq(pkv_hybrid_validate(h), PKV_OK); }

// A sequence holding tokens[0..n-1], offered to the cache right after its append.
static pkv_seq_id computed(pkv_hybrid *h, const int32_t *tokens, uint32_t n) {
    pkv_seq_id id;
    cr_assert_eq(pkv_hybrid_seq_create(h, &id), PKV_OK);
    cr_assert_eq(pkv_hybrid_append(h, id, n, NULL), PKV_OK);
    cr_assert_eq(pkv_hybrid_cache_prefix(h, id, tokens, n, NULL), PKV_OK);
    ok(h);
    return id;
}

static uint32_t hit_of(pkv_hybrid *h, const int32_t *tokens, uint32_t n, pkv_seq_id *id) {
    uint32_t cached = 99999;
    cr_assert_eq(pkv_hybrid_seq_create_cached(h, tokens, n, id, &cached), PKV_OK);
    uint32_t len = 0;
    cr_assert_eq(pkv_hybrid_seq_length(h, *id, &len), PKV_OK);
    cr_assert_eq(len, cached, "the new sequence holds the hit");
    ok(h);
    return cached;
}

static const pkv_block_id *table(const pkv_hybrid *h, pkv_seq_id id, uint32_t g, uint32_t *nb,
                                 uint32_t *holes) {
    const pkv_block_id *t;
    cr_assert_eq(pkv_hybrid_block_table(h, id, g, &t, nb, holes), PKV_OK);
    return t;
}

static int32_t prompt[64] = {11, 12, 13, 14, 15, 16, 17, 18, 19, 20, 21, 22, 23, 24, 25, 26,
                             27, 28, 29, 30, 31, 32, 33, 34, 35, 36, 37, 38, 39, 40};

Test(hybrid_prefix, full_group_shares_whole_blocks_up_to_n_minus_1) {
    pkv_kv_group gs[1] = {hybrid_test_group(PKV_LAYER_FULL, 1, 0)};
    pkv_hybrid *h = make_cached(gs, 1, PKV_HYBRID_PARTITION, 1 << 12, 4, 64);
    pkv_seq_id a = computed(h, prompt, 10); // blocks 0 (0-3), 1 (4-7) cached; 2 partial
    pkv_hybrid_group_stats st;
    cr_assert_eq(pkv_hybrid_group_stats_get(h, 0, &st), PKV_OK);
    cr_assert_eq(st.cached_blocks, 2);
    cr_assert_eq(st.cached_evictable, 0, "a still holds them");
    uint32_t nb, holes;
    const pkv_block_id *ta = table(h, a, 0, &nb, &holes);
    const pkv_block_id a0 = ta[0], a1 = ta[1];
    // The same 10 tokens: L <= 9, a multiple of 4: 8.
    pkv_seq_id b, c, d, e;
    cr_assert_eq(hit_of(h, prompt, 10, &b), 8);
    const pkv_block_id *tb = table(h, b, 0, &nb, &holes);
    cr_assert_eq(nb, 2);
    cr_assert_eq(holes, 0);
    cr_assert(tb[0] == a0 && tb[1] == a1);
    // 9 tokens: L <= 8: still 8. 8 tokens: L <= 7: 4 (the last token is computed).
    cr_assert_eq(hit_of(h, prompt, 9, &c), 8);
    cr_assert_eq(hit_of(h, prompt, 8, &d), 4);
    // A prompt that differs at token 5 shares block 0 only.
    int32_t other[10];
    memcpy(other, prompt, sizeof other);
    other[5] = 999;
    cr_assert_eq(hit_of(h, other, 10, &e), 4);
    cr_assert_eq(pkv_hybrid_group_stats_get(h, 0, &st), PKV_OK);
    cr_assert_eq(st.prefix_hit_blocks, 2 + 2 + 1 + 1);
    cr_assert_eq(st.prefix_hit_tokens, 6 * 4);
    // Appending after a hit grows the table past the shared blocks.
    cr_assert_eq(pkv_hybrid_append(h, b, 2, NULL), PKV_OK);
    ok(h);
    pkv_hybrid_destroy(h);
}

Test(hybrid_prefix, sliding_group_shares_only_the_window_with_holes_before) {
    // Sliding W = 4, B = 2, a 12-token prompt: its 6 full blocks are cached right
    // after the append (the window rule releases only at the next one). n = 12:
    // L <= 11 -> 10; the query at 10 sees 7..10, so it needs tokens 7..9 of the
    // past: blocks 3 (6-7) and 4 (8-9); blocks 0..2 are holes.
    pkv_kv_group gs[1] = {hybrid_test_group(PKV_LAYER_SLIDING, 1, 4)};
    pkv_hybrid *h = make_cached(gs, 1, PKV_HYBRID_PARTITION, 1 << 12, 2, 64);
    pkv_seq_id a = computed(h, prompt, 12);
    uint32_t nb, holes;
    const pkv_block_id *ta = table(h, a, 0, &nb, &holes);
    pkv_block_id a3 = ta[3], a4 = ta[4];
    pkv_hybrid_group_stats st;
    cr_assert_eq(pkv_hybrid_group_stats_get(h, 0, &st), PKV_OK);
    cr_assert_eq(st.cached_blocks, 6);
    pkv_hybrid_prefix_match m;
    cr_assert_eq(pkv_hybrid_prefix_match_get(h, prompt, 12, &m), PKV_OK);
    cr_assert_eq(m.cached_tokens, 10);
    cr_assert_eq(m.hit_blocks[0], 2);
    cr_assert_eq(m.evictable_hit[0], 0);
    pkv_seq_id b;
    cr_assert_eq(hit_of(h, prompt, 12, &b), 10);
    const pkv_block_id *tb = table(h, b, 0, &nb, &holes);
    cr_assert_eq(nb, 5);
    cr_assert_eq(holes, 3);
    cr_assert(tb[0] == PKV_BLOCK_NONE && tb[2] == PKV_BLOCK_NONE);
    cr_assert(tb[3] == a3 && tb[4] == a4);
    // Visible tokens counted once: a's last token (11) sees 8..11, b's (9) 6..9;
    // blocks 3 (6-7), 4 (8-9, shared) and 5 (10-11): 2 + 2 + 2.
    cr_assert_eq(pkv_hybrid_group_stats_get(h, 0, &st), PKV_OK);
    cr_assert_eq(st.tokens_visible, 6);
    // a decodes: the query at 12 sees 9..12, blocks 0..3 die; 0..2 become cache
    // only (b does not hold them), 3 stays shared with b.
    cr_assert_eq(pkv_hybrid_append(h, a, 1, NULL), PKV_OK);
    ok(h);
    cr_assert_eq(pkv_hybrid_group_stats_get(h, 0, &st), PKV_OK);
    cr_assert_eq(st.cached_evictable, 3);
    // b appends the rest of its prompt and decodes: the window rule works on the
    // holes it started with.
    cr_assert_eq(pkv_hybrid_append(h, b, 2, NULL), PKV_OK);
    cr_assert_eq(pkv_hybrid_append(h, b, 1, NULL), PKV_OK);
    ok(h);
    table(h, b, 0, &nb, &holes);
    cr_assert_eq(holes, 4, "the query at 12 sees 9..12");
    pkv_hybrid_destroy(h);
}

Test(hybrid_prefix, sliding_group_hits_after_its_early_blocks_were_evicted) {
    // W = 4, B = 2, a pool of 8 blocks. a computes 12 tokens (6 blocks), then frees:
    // 6 cache-only blocks, evicted oldest first: 0, 1, 2, ... (released in order).
    pkv_kv_group gs[1] = {hybrid_test_group(PKV_LAYER_SLIDING, 1, 4)};
    pkv_hybrid *h = make_cached(gs, 1, PKV_HYBRID_PARTITION, 8 * 2 * 2, 2, 64);
    pkv_seq_id a = computed(h, prompt, 12);
    cr_assert_eq(pkv_hybrid_seq_free(h, a), PKV_OK);
    ok(h);
    // An unrelated sequence of 10 tokens (5 blocks; 2 free): 3 evictions, blocks 0..2.
    pkv_seq_id x;
    cr_assert_eq(pkv_hybrid_seq_create(h, &x), PKV_OK);
    cr_assert_eq(pkv_hybrid_append(h, x, 10, NULL), PKV_OK);
    ok(h);
    pkv_hybrid_group_stats st;
    cr_assert_eq(pkv_hybrid_group_stats_get(h, 0, &st), PKV_OK);
    cr_assert_eq(st.prefix_evictions, 3);
    cr_assert_eq(st.cached_blocks, 3);
    // Blocks 3 and 4 (tokens 6..9) remain: a hit of 10 needs nothing else.
    pkv_seq_id b;
    cr_assert_eq(hit_of(h, prompt, 12, &b), 10);
    // A hit of 4 would need blocks 0 and 1: gone. A 6-token prompt finds nothing.
    pkv_seq_id c;
    cr_assert_eq(hit_of(h, prompt, 6, &c), 0);
    pkv_hybrid_destroy(h);
}

Test(hybrid_prefix, chunked_group_shares_the_current_chunk) {
    // Chunk C = 4, B = 2, 11 tokens: L <= 10 -> 10; the query at 10 is in chunk
    // 8..11: it needs block 4 (8-9); blocks 0..3 are holes.
    pkv_kv_group gs[1] = {hybrid_test_group(PKV_LAYER_CHUNKED, 1, 4)};
    pkv_hybrid *h = make_cached(gs, 1, PKV_HYBRID_PARTITION, 1 << 12, 2, 64);
    pkv_seq_id a = computed(h, prompt, 11);
    uint32_t nb, holes;
    const pkv_block_id a4 = table(h, a, 0, &nb, &holes)[4];
    pkv_seq_id b;
    cr_assert_eq(hit_of(h, prompt, 11, &b), 10);
    const pkv_block_id *tb = table(h, b, 0, &nb, &holes);
    cr_assert_eq(nb, 5);
    cr_assert_eq(holes, 4);
    cr_assert_eq(tb[4], a4);
    // 9 tokens: L <= 8 -> 8, the query at 8 starts a chunk: no block needed at all.
    pkv_seq_id c;
    cr_assert_eq(hit_of(h, prompt, 9, &c), 8);
    table(h, c, 0, &nb, &holes);
    cr_assert_eq(nb, 4);
    cr_assert_eq(holes, 4);
    pkv_hybrid_destroy(h);
}

Test(hybrid_prefix, mla_and_full_groups_cap_a_sliding_group) {
    // Full (B = 4) + MLA (B = 2) + sliding W = 4 (B = 2), LCM layout: the hit is a
    // multiple of 4, the full group's leading run caps it. a computes 10 tokens:
    // full caches 2 blocks (0-7), MLA 5, sliding 5. n = 10: L = 8.
    pkv_kv_group gs[3] = {hybrid_test_group(PKV_LAYER_FULL, 1, 0), hybrid_test_group(PKV_LAYER_MLA, 1, 0),
                          hybrid_test_group(PKV_LAYER_SLIDING, 1, 4)};
    pkv_hybrid_params p = params_for(gs, 3, PKV_HYBRID_LCM, 1 << 12, 2, 64);
    p.block_sizes[0] = 4;
    pkv_hybrid *h = NULL;
    cr_assert_eq(pkv_hybrid_create(&p, &h), PKV_OK);
    computed(h, prompt, 10);
    pkv_seq_id b;
    cr_assert_eq(hit_of(h, prompt, 10, &b), 8);
    uint32_t nb, holes;
    table(h, b, 0, &nb, &holes);
    cr_assert(nb == 2 && holes == 0);
    table(h, b, 1, &nb, &holes);
    cr_assert(nb == 4 && holes == 0);
    table(h, b, 2, &nb, &holes);
    cr_assert(nb == 4 && holes == 2, "the query at 8 sees 5..8: blocks 2, 3");
    pkv_hybrid_prefix_match m;
    cr_assert_eq(pkv_hybrid_prefix_match_get(h, prompt, 10, &m), PKV_OK);
    cr_assert(m.cached_tokens == 8 && m.hit_blocks[0] == 2 && m.hit_blocks[1] == 4 &&
              m.hit_blocks[2] == 2);
    pkv_hybrid_destroy(h);
}

// The state group's queued copies (take them all): *n of them into c.
static uint32_t state_copies(pkv_hybrid *h, uint32_t g, pkv_block_copy *c) {
    uint32_t n = 0;
    cr_assert_eq(pkv_hybrid_take_copies(h, g, c, 8, &n), PKV_OK);
    return n;
}

Test(hybrid_prefix, a_state_model_hits_only_where_a_state_is_cached) {
    // Full (B = 2) + state: the state interval is 2. a appends 8 tokens and caches
    // its state there (a copy from its slot into the snapshot's), then 2 more
    // tokens and offers all 10 (5 full blocks).
    pkv_kv_group gs[2] = {hybrid_test_group(PKV_LAYER_FULL, 1, 0), hybrid_test_group(PKV_LAYER_STATE, 1, 0)};
    pkv_hybrid *h = make_cached(gs, 2, PKV_HYBRID_PARTITION, 1 << 13, 2, 64);
    cr_assert_eq(pkv_hybrid_state_interval(h), 2);
    pkv_seq_id a;
    cr_assert_eq(pkv_hybrid_seq_create(h, &a), PKV_OK);
    cr_assert_eq(pkv_hybrid_append(h, a, 8, NULL), PKV_OK);
    int32_t a_slot;
    cr_assert_eq(pkv_hybrid_state_slot(h, a, 1, &a_slot), PKV_OK);
    uint32_t snaps = 0;
    cr_assert_eq(pkv_hybrid_cache_state(h, a, prompt, 7, &snaps), PKV_ERR_INVALID_ARG, "n != length");
    cr_assert_eq(pkv_hybrid_cache_state(h, a, prompt, 8, &snaps), PKV_OK);
    cr_assert_eq(snaps, 1);
    pkv_block_copy c[8];
    cr_assert_eq(state_copies(h, 1, c), 1);
    cr_assert_eq(c[0].src, a_slot);
    const pkv_block_id snap = c[0].dst;
    cr_assert_neq(snap, a_slot);
    ok(h);
    cr_assert_eq(pkv_hybrid_append(h, a, 2, NULL), PKV_OK);
    uint32_t inserted = 0;
    cr_assert_eq(pkv_hybrid_cache_prefix(h, a, prompt, 10, &inserted), PKV_OK);
    cr_assert_eq(inserted, 5, "the full group's blocks");
    ok(h);
    // 10 tokens: L <= 9; 8 is the largest boundary with both blocks and a state.
    pkv_seq_id b;
    cr_assert_eq(hit_of(h, prompt, 10, &b), 8);
    int32_t b_slot;
    cr_assert_eq(pkv_hybrid_state_slot(h, b, 1, &b_slot), PKV_OK);
    cr_assert_eq(state_copies(h, 1, c), 1, "b's state starts as the cached one");
    cr_assert(c[0].src == snap && c[0].dst == b_slot);
    pkv_hybrid_group_stats st;
    cr_assert_eq(pkv_hybrid_group_stats_get(h, 1, &st), PKV_OK);
    cr_assert_eq(st.cached_blocks, 1);
    cr_assert_eq(st.prefix_hit_blocks, 1);
    cr_assert_eq(st.prefix_hit_tokens, 8);
    // 8 tokens: L <= 7 -> 6 has blocks but no state, 4 and 2 neither: no hit.
    pkv_seq_id d;
    cr_assert_eq(hit_of(h, prompt, 8, &d), 0);
    cr_assert_eq(state_copies(h, 1, c), 0);
    pkv_hybrid_destroy(h);
}

Test(hybrid_prefix, cached_states_give_way_to_sequences) {
    // Two state slots (max_seqs 2): a holds one, its snapshot the other. A second
    // sequence needs a slot: the snapshot (left to the cache once its copy ran) is
    // evicted; with both slots held by sequences nothing is cached.
    pkv_kv_group gs[2] = {hybrid_test_group(PKV_LAYER_FULL, 1, 0), hybrid_test_group(PKV_LAYER_STATE, 1, 0)};
    pkv_hybrid_params p = params_for(gs, 2, PKV_HYBRID_LCM, 2 * 100 + 256, 2, 8);
    p.max_seqs = 2;
    pkv_hybrid *h = NULL;
    cr_assert_eq(pkv_hybrid_create(&p, &h), PKV_OK);
    pkv_seq_id a, b, c;
    cr_assert_eq(pkv_hybrid_seq_create(h, &a), PKV_OK);
    cr_assert_eq(pkv_hybrid_append(h, a, 4, NULL), PKV_OK);
    uint32_t snaps = 0;
    cr_assert_eq(pkv_hybrid_cache_state(h, a, prompt, 4, &snaps), PKV_OK);
    cr_assert_eq(snaps, 1);
    ok(h);
    // Its copy has not run: the snapshot is pinned, no slot for b.
    cr_assert_eq(pkv_hybrid_seq_create(h, &b), PKV_ERR_OUT_OF_BLOCKS);
    pkv_block_copy cp[8];
    cr_assert_eq(state_copies(h, 1, cp), 1);
    ok(h);
    pkv_hybrid_group_stats st;
    cr_assert_eq(pkv_hybrid_group_stats_get(h, 1, &st), PKV_OK);
    cr_assert_eq(st.cached_evictable, 1);
    cr_assert_eq(pkv_hybrid_seq_create(h, &b), PKV_OK);
    ok(h);
    cr_assert_eq(pkv_hybrid_group_stats_get(h, 1, &st), PKV_OK);
    cr_assert_eq(st.cached_blocks, 0);
    cr_assert_eq(st.prefix_evictions, 1);
    cr_assert_eq(pkv_hybrid_cache_state(h, a, prompt, 4, &snaps), PKV_OK);
    cr_assert_eq(snaps, 0, "every slot is a sequence's");
    cr_assert_eq(pkv_hybrid_seq_create(h, &c), PKV_ERR_OUT_OF_BLOCKS);
    ok(h);
    pkv_hybrid_destroy(h);
}

Test(hybrid_prefix, a_hit_on_the_last_free_state_takes_that_state_as_its_slot) {
    // Two state slots: a holds one, the state cached at 4 the other. b's prompt hits
    // at 4; its own slot could only come from evicting the very state it starts
    // from, so that state becomes b's slot: no copy queued, the cache lets it go.
    // (A miss would evict it and succeed: a hit must not do worse.)
    pkv_kv_group gs[2] = {hybrid_test_group(PKV_LAYER_FULL, 1, 0), hybrid_test_group(PKV_LAYER_STATE, 1, 0)};
    pkv_hybrid_params p = params_for(gs, 2, PKV_HYBRID_LCM, 2 * 100 + 256, 2, 8);
    p.max_seqs = 2;
    pkv_hybrid *h = NULL;
    cr_assert_eq(pkv_hybrid_create(&p, &h), PKV_OK);
    pkv_seq_id a, b, c;
    cr_assert_eq(pkv_hybrid_seq_create(h, &a), PKV_OK);
    cr_assert_eq(pkv_hybrid_append(h, a, 4, NULL), PKV_OK);
    uint32_t snaps = 0, inserted = 0;
    cr_assert_eq(pkv_hybrid_cache_state(h, a, prompt, 4, &snaps), PKV_OK);
    cr_assert_eq(snaps, 1);
    pkv_block_copy cp[8];
    cr_assert_eq(state_copies(h, 1, cp), 1);
    const pkv_block_id snap = cp[0].dst;
    cr_assert_eq(pkv_hybrid_cache_prefix(h, a, prompt, 4, &inserted), PKV_OK);
    cr_assert_eq(inserted, 2);
    ok(h);
    cr_assert_eq(hit_of(h, prompt, 5, &b), 4);
    int32_t b_slot;
    cr_assert_eq(pkv_hybrid_state_slot(h, b, 1, &b_slot), PKV_OK);
    cr_assert_eq(b_slot, snap, "b starts in the cached state's own slot");
    cr_assert_eq(state_copies(h, 1, cp), 0, "so nothing is copied");
    pkv_hybrid_group_stats st;
    cr_assert_eq(pkv_hybrid_group_stats_get(h, 1, &st), PKV_OK);
    cr_assert_eq(st.cached_blocks, 0, "the cache gave the state up");
    cr_assert_eq(st.prefix_hit_blocks, 1);
    cr_assert_eq(st.prefix_hit_tokens, 4);
    uint32_t nb, holes;
    table(h, b, 0, &nb, &holes);
    cr_assert(nb == 2 && holes == 0, "the full group's two blocks are shared");
    // Both slots are sequences' now: nothing more to give.
    cr_assert_eq(pkv_hybrid_seq_create_cached(h, prompt, 5, &c, &snaps), PKV_ERR_OUT_OF_BLOCKS);
    ok(h);
    cr_assert_eq(pkv_hybrid_seq_free(h, b), PKV_OK);
    cr_assert_eq(pkv_hybrid_seq_create(h, &c), PKV_OK, "b's slot went back to the pool");
    ok(h);
    pkv_hybrid_destroy(h);
}

Test(hybrid_prefix, without_a_cache) {
    pkv_kv_group gs[1] = {hybrid_test_group(PKV_LAYER_FULL, 1, 0)};
    pkv_hybrid *h = make_cached(gs, 1, PKV_HYBRID_PARTITION, 1 << 12, 2, 0);
    pkv_seq_id a;
    cr_assert_eq(pkv_hybrid_seq_create(h, &a), PKV_OK);
    cr_assert_eq(pkv_hybrid_append(h, a, 10, NULL), PKV_OK);
    cr_assert_eq(pkv_hybrid_cache_prefix(h, a, prompt, 10, NULL), PKV_ERR_UNSUPPORTED);
    pkv_seq_id b;
    cr_assert_eq(hit_of(h, prompt, 10, &b), 0);
    cr_assert_eq(pkv_hybrid_cache_prefix(h, a, prompt, 11, NULL), PKV_ERR_UNSUPPORTED);
    pkv_hybrid_destroy(h);
}

Test(hybrid_prefix, bad_arguments) {
    pkv_kv_group gs[1] = {hybrid_test_group(PKV_LAYER_FULL, 1, 0)};
    pkv_hybrid *h = make_cached(gs, 1, PKV_HYBRID_PARTITION, 1 << 12, 2, 8);
    pkv_seq_id a;
    cr_assert_eq(pkv_hybrid_seq_create(h, &a), PKV_OK);
    cr_assert_eq(pkv_hybrid_append(h, a, 4, NULL), PKV_OK);
    cr_assert_eq(pkv_hybrid_cache_prefix(h, a, prompt, 5, NULL), PKV_ERR_INVALID_ARG, "n > length");
    cr_assert_eq(pkv_hybrid_cache_prefix(h, a, NULL, 4, NULL), PKV_ERR_INVALID_ARG);
    cr_assert_eq(pkv_hybrid_cache_prefix(h, a + 1, prompt, 4, NULL), PKV_ERR_NOT_FOUND);
    uint32_t c;
    cr_assert_eq(pkv_hybrid_seq_create_cached(h, NULL, 3, &a, &c), PKV_ERR_INVALID_ARG);
    cr_assert_eq(pkv_hybrid_prefix_match_get(h, prompt, 3, NULL), PKV_ERR_INVALID_ARG);
    pkv_hybrid_params p = params_for(gs, 1, PKV_HYBRID_PARTITION, 1 << 12, 2, 4);
    p.prefix_hash = (pkv_hash_algo)7;
    pkv_hybrid *bad = NULL;
    cr_assert_eq(pkv_hybrid_create(&p, &bad), PKV_ERR_INVALID_ARG);
    cr_assert_null(bad);
    pkv_hybrid_destroy(h);
}

Test(hybrid_prefix, full_group_evicts_leaf_first_under_pressure) {
    // One full group, B = 2, 8 blocks. a computes 8 tokens (4 blocks) and frees:
    // 4 cache-only blocks. x then needs 6 blocks (4 free): 2 evictions, the chain's
    // tail (blocks 3 and 2), so the 4-token head still hits.
    pkv_kv_group gs[1] = {hybrid_test_group(PKV_LAYER_FULL, 1, 0)};
    pkv_hybrid *h = make_cached(gs, 1, PKV_HYBRID_PARTITION, 8 * 2 * 2, 2, 64);
    pkv_seq_id a = computed(h, prompt, 8);
    cr_assert_eq(pkv_hybrid_seq_free(h, a), PKV_OK);
    ok(h);
    pkv_seq_id x;
    cr_assert_eq(pkv_hybrid_seq_create(h, &x), PKV_OK);
    uint32_t need = 0;
    cr_assert_eq(pkv_hybrid_blocks_needed(h, x, 12, &need), PKV_OK);
    cr_assert_eq(need, 6);
    cr_assert_eq(pkv_hybrid_append(h, x, 12, NULL), PKV_OK);
    ok(h);
    pkv_hybrid_group_stats st;
    cr_assert_eq(pkv_hybrid_group_stats_get(h, 0, &st), PKV_OK);
    cr_assert_eq(st.prefix_evictions, 2);
    cr_assert_eq(st.cached_blocks, 2);
    cr_assert_eq(st.blocks_held + st.cached_blocks + st.free_bytes / st.page_bytes, 8,
                 "no block lost");
    pkv_seq_id b;
    cr_assert_eq(hit_of(h, prompt, 8, &b), 4);
    // Too much: 3 more blocks with none free and the hit's 2 in use: refused,
    // nothing changed.
    cr_assert_eq(pkv_hybrid_append(h, x, 6, NULL), PKV_ERR_OUT_OF_BLOCKS);
    ok(h);
    // b frees: its blocks are the cache's again and x can grow by 2 blocks.
    cr_assert_eq(pkv_hybrid_seq_free(h, b), PKV_OK);
    cr_assert_eq(pkv_hybrid_append(h, x, 4, NULL), PKV_OK);
    ok(h);
    cr_assert_eq(pkv_hybrid_group_stats_get(h, 0, &st), PKV_OK);
    cr_assert_eq(st.cached_blocks, 0);
    cr_assert_eq(st.free_bytes, 0);
    pkv_hybrid_destroy(h);
}

Test(hybrid_prefix, shared_pool_evicts_the_oldest_across_groups) {
    // Shared page: full (2 bytes/token) and sliding W = 2 (2 bytes/token), B = 2
    // for both, one pool of 8 pages. a computes 8 tokens: 4 + 4 blocks cached, then
    // decodes one token: sliding blocks 0..2 die (query at 8 sees 7..8) and become
    // cache-only first; then a frees. x needs 3 blocks beyond the free ones: the
    // sliding group's released blocks 0..2 go (the oldest), the full chain stays.
    pkv_kv_group gs[2] = {hybrid_test_group(PKV_LAYER_FULL, 1, 0), hybrid_test_group(PKV_LAYER_SLIDING, 1, 2)};
    pkv_hybrid *h = make_cached(gs, 2, PKV_HYBRID_SHARED_PAGE, 12 * 2 * 2, 2, 64);
    pkv_seq_id a = computed(h, prompt, 8);
    cr_assert_eq(pkv_hybrid_append(h, a, 1, NULL), PKV_OK);
    ok(h);
    cr_assert_eq(pkv_hybrid_seq_free(h, a), PKV_OK);
    ok(h);
    pkv_hybrid_group_stats f, s;
    cr_assert_eq(pkv_hybrid_group_stats_get(h, 0, &f), PKV_OK);
    cr_assert_eq(f.cached_evictable, 4);
    cr_assert_eq(f.free_bytes / f.page_bytes, 4, "12 - 8 cached");
    pkv_seq_id x;
    cr_assert_eq(pkv_hybrid_seq_create(h, &x), PKV_OK);
    // 7 tokens: 4 blocks per group, 8 in all: 4 free + 3 ... the window rule
    // frees nothing of x before its first query, so 4 evictions.
    cr_assert_eq(pkv_hybrid_append(h, x, 7, NULL), PKV_OK);
    ok(h);
    cr_assert_eq(pkv_hybrid_group_stats_get(h, 0, &f), PKV_OK);
    cr_assert_eq(pkv_hybrid_group_stats_get(h, 1, &s), PKV_OK);
    cr_assert_eq(s.prefix_evictions, 3, "the sliding group's dead blocks first");
    cr_assert_eq(f.prefix_evictions, 1, "then the full chain's tail");
    cr_assert_eq(f.cached_blocks, 3);
    cr_assert_eq(s.cached_blocks, 1);
    pkv_hybrid_destroy(h);
}

Test(hybrid_prefix, a_full_groups_lost_block_takes_the_windowed_block_along) {
    // Shared page, full and sliding W = 4, both B = 2, 10 pages. a computes 8 tokens
    // (4 + 4 blocks cached) and frees: the full group's blocks are released first
    // (older), its chain evicts leaf first. x takes 4 blocks (2 free): 2 evictions.
    // The first takes full block 3; then no hit of this prompt can pass 6 tokens,
    // so sliding block 3 (tokens 6-7) is useless and goes next, before full block 2.
    // A prompt of 8 then hits 6 (full 0..2, sliding 1..2), not 4.
    pkv_kv_group gs[2] = {hybrid_test_group(PKV_LAYER_FULL, 1, 0), hybrid_test_group(PKV_LAYER_SLIDING, 1, 4)};
    pkv_hybrid *h = make_cached(gs, 2, PKV_HYBRID_SHARED_PAGE, 10 * 2 * 2, 2, 64);
    pkv_seq_id a = computed(h, prompt, 8);
    cr_assert_eq(pkv_hybrid_seq_free(h, a), PKV_OK);
    pkv_seq_id x;
    cr_assert_eq(pkv_hybrid_seq_create(h, &x), PKV_OK);
    cr_assert_eq(pkv_hybrid_append(h, x, 4, NULL), PKV_OK);
    ok(h);
    pkv_hybrid_group_stats f, s;
    cr_assert_eq(pkv_hybrid_group_stats_get(h, 0, &f), PKV_OK);
    cr_assert_eq(pkv_hybrid_group_stats_get(h, 1, &s), PKV_OK);
    cr_assert(f.prefix_evictions == 1 && s.prefix_evictions == 1);
    pkv_seq_id b;
    cr_assert_eq(hit_of(h, prompt, 8, &b), 6);
    pkv_hybrid_destroy(h);
}

Test(hybrid_prefix, lcm_eviction_empties_a_large_page_for_another_group) {
    // LCM over full and sliding W = 2, both B = 2 at 2 bytes per token: 4-byte
    // pages, so a large page is one small page. Budget 8 large pages. a computes 8
    // tokens (4 + 4 pages) and frees: 8 cache-only pages, 4 large pages per group,
    // none unowned. x then decodes to 12 tokens: the full group needs 6 pages, the
    // sliding one at most 2 live: the full group evicts its own 4, then 2 large
    // pages must come from the sliding group, whose cached pages go (its own 2
    // oldest for its own needs, the other 2 to empty large pages for the full one).
    pkv_kv_group gs[2] = {hybrid_test_group(PKV_LAYER_FULL, 1, 0), hybrid_test_group(PKV_LAYER_SLIDING, 1, 2)};
    pkv_hybrid *h = make_cached(gs, 2, PKV_HYBRID_LCM, 8 * 4, 2, 64);
    pkv_seq_id a = computed(h, prompt, 8);
    cr_assert_eq(pkv_hybrid_seq_free(h, a), PKV_OK);
    ok(h);
    pkv_seq_id x;
    cr_assert_eq(pkv_hybrid_seq_create(h, &x), PKV_OK);
    cr_assert_eq(pkv_hybrid_append(h, x, 2, NULL), PKV_OK);
    for (uint32_t i = 2; i < 12; i++) {
        cr_assert_eq(pkv_hybrid_append(h, x, 1, NULL), PKV_OK, "token %u", i);
        ok(h);
    }
    pkv_hybrid_group_stats f, s;
    cr_assert_eq(pkv_hybrid_group_stats_get(h, 0, &f), PKV_OK);
    cr_assert_eq(pkv_hybrid_group_stats_get(h, 1, &s), PKV_OK);
    cr_assert_eq(f.blocks_held, 6);
    cr_assert_eq(f.prefix_evictions, 4);
    cr_assert_eq(s.prefix_evictions, 4);
    cr_assert_eq(f.cached_blocks + s.cached_blocks, 0);
    // Nothing left to evict: one more full block does not fit.
    cr_assert_eq(pkv_hybrid_append(h, x, 4, NULL), PKV_ERR_OUT_OF_BLOCKS);
    ok(h);
    pkv_hybrid_destroy(h);
}

// ---- randomized: hits against a token-level reference ----
// Random groups (full, sliding, chunked, MLA, sometimes a state group) under every
// layout; prompts cut from three base texts, sometimes diverged; random appends,
// frees, offers (cache_prefix, and cache_state at state-interval boundaries). A
// simulated memory per group receives each token through the slot mappings and
// each state group a running hash per slot (copies run as an engine runs them,
// before the next append): every live block must hold its sequence's tokens and
// every slot its sequence's state, so a wrong shared block or a missed state copy
// is caught. Without eviction the hit must equal a token-level reference: the
// largest L <= n - 1, a multiple of every block size (and of the state interval),
// such that every group has cached what its rule needs for L.

#define R_MAX_LEN 40
// Sanitizer builds (clang's integer checks above all) run these tests many times
// slower: fewer random worlds there, each still a full run.
#if defined(__SANITIZE_ADDRESS__)
#define R_SEEDS 12u
#elif defined(__has_feature)
#if __has_feature(address_sanitizer) || __has_feature(undefined_behavior_sanitizer)
#define R_SEEDS 12u
#endif
#endif
#ifndef R_SEEDS
#define R_SEEDS 60u
#endif
#define R_MAX_SEQS 6
#define R_MAX_KEYS 4096

typedef struct rkey {
    uint32_t g, len;
    int32_t tok[R_MAX_LEN];
} rkey;

typedef struct rworld {
    uint64_t rng;
    pkv_hybrid *h;
    uint32_t ng, S;  // S: the state interval (0: no state group)
    pkv_kv_group groups[3];
    uint32_t bs[3];  // 0 for a state group
    int32_t *mem[3]; // token group: [ids * B] the token in each slot; state: [slots]
    rkey *keys;      // the reference cache: (group, prefix) pairs cached
    uint32_t nkeys;
    pkv_seq_id ids[R_MAX_SEQS];
    int32_t tok[R_MAX_SEQS][R_MAX_LEN];
    uint32_t len[R_MAX_SEQS];
    int live[R_MAX_SEQS];
} rworld;

static uint32_t rnd(rworld *w, uint32_t n) {
    w->rng ^= w->rng << 13;
    w->rng ^= w->rng >> 7;
    w->rng ^= w->rng << 17;
    return (uint32_t)(w->rng % n);
}

static int is_state_group(const rworld *w, uint32_t g) { return w->groups[g].kind == PKV_LAYER_STATE; }

// The state after tokens[0..n-1]: a running hash from 0.
static int32_t state_after(const int32_t *tok, uint32_t n) {
    uint32_t x = 0;
    for (uint32_t i = 0; i < n; i++) x = (x ^ (uint32_t)tok[i]) * 16777619u;
    return (int32_t)x; // the bits, as an engine stores them
}

static int has_key(const rworld *w, uint32_t g, const int32_t *tok, uint32_t len) {
    for (uint32_t i = 0; i < w->nkeys; i++)
        if (w->keys[i].g == g && w->keys[i].len == len &&
            memcmp(w->keys[i].tok, tok, len * sizeof *tok) == 0)
            return 1;
    return 0;
}

static void add_key(rworld *w, uint32_t g, const int32_t *tok, uint32_t len) {
    if (has_key(w, g, tok, len)) return;
    cr_assert_lt(w->nkeys, R_MAX_KEYS);
    rkey *k = &w->keys[w->nkeys++];
    k->g = g;
    k->len = len;
    memcpy(k->tok, tok, len * sizeof *k->tok);
}

// First token a query at p sees in group g (the window rule, written again).
static uint32_t ref_first(const pkv_kv_group *k, uint32_t p) {
    if (k->kind == PKV_LAYER_SLIDING) return p + 1 > k->window ? p + 1 - k->window : 0;
    if (k->kind == PKV_LAYER_CHUNKED) return p - p % k->window;
    return 0;
}

static uint32_t ref_hit(const rworld *w, const int32_t *tok, uint32_t n) {
    uint32_t align = 1;
    for (uint32_t g = 0; g < w->ng; g++) {
        if (is_state_group(w, g)) continue;
        uint32_t a = align, b = w->bs[g];
        while (b) {
            uint32_t t = a % b;
            a = b;
            b = t;
        }
        align = align / a * w->bs[g];
    }
    for (uint32_t L = n ? (n - 1) / align * align : 0; L > 0; L -= align) {
        int all = 1;
        for (uint32_t g = 0; g < w->ng && all; g++) {
            if (is_state_group(w, g)) {
                all = has_key(w, g, tok, L);
                continue;
            }
            const uint32_t B = w->bs[g];
            for (uint32_t i = ref_first(&w->groups[g], L) / B; i < L / B && all; i++)
                all = has_key(w, g, tok, (i + 1) * B);
        }
        if (all) return L;
    }
    return 0;
}

static int32_t *state_of(rworld *w, uint32_t s, uint32_t g) {
    int32_t slot;
    cr_assert_eq(pkv_hybrid_state_slot(w->h, w->ids[s], g, &slot), PKV_OK);
    return &w->mem[g][slot];
}

// Sequence s grew by n tokens from `from`: its tokens through the slots, its states.
static void write_slots(rworld *w, uint32_t s, uint32_t from, uint32_t n, const int64_t *slots) {
    for (uint32_t g = 0; g < w->ng; g++) {
        if (is_state_group(w, g)) {
            int32_t *st = state_of(w, s, g);
            uint32_t x = (uint32_t)*st;
            for (uint32_t t = 0; t < n; t++) x = (x ^ (uint32_t)w->tok[s][from + t]) * 16777619u;
            *st = (int32_t)x;
            continue;
        }
        for (uint32_t t = 0; t < n; t++) w->mem[g][slots[g * n + t]] = w->tok[s][from + t];
    }
}

// Run every group's queued copies, as an engine does before its next append.
static void run_copies(rworld *w) {
    for (uint32_t g = 0; g < w->ng; g++) {
        uint32_t nc = 0;
        pkv_block_copy c[64];
        const pkv_status tst = pkv_hybrid_take_copies(w->h, g, c, 64, &nc);
        cr_assert_eq(tst, PKV_OK, "take_copies group %u: %s", g, pkv_status_str(tst));
        const size_t unit = is_state_group(w, g) ? 1 : w->bs[g];
        for (uint32_t i = 0; i < nc; i++)
            memcpy(w->mem[g] + (size_t)c[i].dst * unit, w->mem[g] + (size_t)c[i].src * unit,
                   unit * sizeof *w->mem[g]);
    }
}

// Every live block of every sequence holds the sequence's tokens, every state
// slot its state.
static void check_data(rworld *w) {
    for (uint32_t s = 0; s < R_MAX_SEQS; s++) {
        if (!w->live[s]) continue;
        for (uint32_t g = 0; g < w->ng; g++) {
            if (is_state_group(w, g)) {
                cr_assert_eq(*state_of(w, s, g), state_after(w->tok[s], w->len[s]),
                             "seq %u state group %u at %u", s, g, w->len[s]);
                continue;
            }
            uint32_t nb, holes;
            const pkv_block_id *t = table(w->h, w->ids[s], g, &nb, &holes);
            for (uint32_t p = holes * w->bs[g]; p < w->len[s]; p++)
                cr_assert_eq(w->mem[g][(size_t)t[p / w->bs[g]] * w->bs[g] + p % w->bs[g]],
                             w->tok[s][p], "seq %u group %u token %u", s, g, p);
        }
    }
}

static void ref_insert(rworld *w, uint32_t s, uint32_t n) {
    for (uint32_t g = 0; g < w->ng; g++) {
        if (is_state_group(w, g)) continue;
        uint32_t nb, holes;
        table(w->h, w->ids[s], g, &nb, &holes);
        const int chained = w->groups[g].kind == PKV_LAYER_FULL || w->groups[g].kind == PKV_LAYER_MLA;
        for (uint32_t i = 0; i < n / w->bs[g]; i++) {
            const uint32_t len = (i + 1) * w->bs[g];
            if (has_key(w, g, w->tok[s], len)) continue;
            if (i < holes) {
                if (chained) break;
                continue;
            }
            add_key(w, g, w->tok[s], len);
        }
    }
}

// Over a whole randomized test: hits seen, holes in hit tables, state hits,
// evictions (the test checks that it exercised them).
static uint64_t seen_hits, seen_windowed_holes, seen_state_hits, seen_evictions;

// Offer sequence s (length n) to the cache, and its state at a state boundary.
static void offer(rworld *w, uint32_t s, uint32_t n) {
    ref_insert(w, s, n); // under eviction: a superset of the cache
    cr_assert_eq(pkv_hybrid_cache_prefix(w->h, w->ids[s], w->tok[s], n, NULL), PKV_OK);
    if (!w->S || n % w->S || n == 0) return;
    uint32_t snaps = 0;
    cr_assert_eq(pkv_hybrid_cache_state(w->h, w->ids[s], w->tok[s], n, &snaps), PKV_OK);
    for (uint32_t g = 0; g < w->ng; g++)
        if (is_state_group(w, g)) add_key(w, g, w->tok[s], n);
    run_copies(w);
}

static void run_random(pkv_hybrid_layout layout, uint64_t seed, int evicting) {
    rworld w = {.rng = seed * 2654435761u + 1};
    w.keys = calloc(R_MAX_KEYS, sizeof *w.keys);
    w.ng = 1 + rnd(&w, 3);
    const uint32_t base_bs = 1 + rnd(&w, 3);
    pkv_hybrid_params p;
    pkv_hybrid_params_default(&p);
    for (uint32_t g = 0; g < w.ng; g++) {
        // Group 0: full or MLA; a state group only last.
        const uint32_t kind = g == 0 ? rnd(&w, 2) * 3 : rnd(&w, g + 1 == w.ng ? 5 : 4);
        const pkv_layer_kind kinds[5] = {PKV_LAYER_FULL, PKV_LAYER_SLIDING, PKV_LAYER_CHUNKED,
                                         PKV_LAYER_MLA, PKV_LAYER_STATE};
        w.groups[g] = hybrid_test_group(kinds[kind], 1 + rnd(&w, 2), 2 + rnd(&w, 6));
        if ((layout == PKV_HYBRID_PARTITION || layout == PKV_HYBRID_LCM) && kind != 4)
            p.block_sizes[g] = base_bs * (1 + rnd(&w, 2));
    }
    p.groups = w.groups;
    p.num_groups = w.ng;
    p.elem_bytes = 1;
    p.layout = layout;
    p.block_size = base_bs;
    p.budget_bytes = evicting ? 600 : 1 << 16;
    p.max_seqs = evicting ? R_MAX_SEQS + 2 : 1024; // evicting: few spare state slots
    p.budget_bytes += (uint64_t)p.max_seqs * 100 * 2; // the state slots, if any
    p.prefix_cache_blocks = evicting ? 1 + rnd(&w, 30) : 4096;
    p.prefix_hash = PKV_HASH_FNV1A_64;
    pkv_hybrid *h = NULL;
    if (pkv_hybrid_create(&p, &h) != PKV_OK) { // a budget too small for this draw
        free(w.keys);
        return;
    }
    w.h = h;
    w.S = pkv_hybrid_state_interval(h);
    for (uint32_t g = 0; g < w.ng; g++) {
        pkv_hybrid_group_stats st;
        pkv_hybrid_group_info(h, g, NULL, &w.bs[g]);
        pkv_hybrid_group_stats_get(h, g, &st);
        uint32_t cap = (uint32_t)(st.capacity_bytes / st.page_bytes) + 64;
        if (layout == PKV_HYBRID_LCM) cap = 4096; // chunked ids run past the capacity
        w.mem[g] = calloc((size_t)cap * (w.bs[g] ? w.bs[g] : 1), sizeof *w.mem[g]);
        // In PAGED every token group is treated as full attention.
        if (layout == PKV_HYBRID_PAGED && !is_state_group(&w, g)) w.groups[g].kind = PKV_LAYER_FULL;
    }
    // Prompts from three base texts over a small alphabet, cut and diverged.
    int32_t base[3][R_MAX_LEN];
    for (uint32_t b = 0; b < 3; b++)
        for (uint32_t i = 0; i < R_MAX_LEN; i++) base[b][i] = (int32_t)(b * 100 + i % 7);
    int64_t slots[3 * R_MAX_LEN];
    for (uint32_t step = 0; step < 300; step++) {
        const uint32_t s = rnd(&w, R_MAX_SEQS);
        if (!w.live[s]) {
            const uint32_t n = 1 + rnd(&w, R_MAX_LEN - 8);
            memcpy(w.tok[s], base[rnd(&w, 3)], sizeof w.tok[s]);
            if (rnd(&w, 3) == 0) w.tok[s][rnd(&w, n)] = 1000 + (int32_t)step;
            const uint32_t expect = ref_hit(&w, w.tok[s], n);
            pkv_hybrid_prefix_match m;
            cr_assert_eq(pkv_hybrid_prefix_match_get(h, w.tok[s], n, &m), PKV_OK);
            uint32_t cached;
            pkv_status st = pkv_hybrid_seq_create_cached(h, w.tok[s], n, &w.ids[s], &cached);
            if (st == PKV_ERR_OUT_OF_BLOCKS) { // every state slot held by a sequence
                cr_assert(evicting && w.S);
                continue;
            }
            cr_assert_eq(st, PKV_OK);
            cr_assert_eq(cached, m.cached_tokens, "the probe agrees");
            if (evicting) cr_assert_leq(cached, expect, "never more than was cached");
            else cr_assert_eq(cached, expect, "step %u: n %u", step, n);
            w.live[s] = 1;
            w.len[s] = cached;
            seen_hits += cached > 0;
            seen_state_hits += cached > 0 && w.S;
            for (uint32_t g = 0; g < w.ng; g++) {
                uint32_t nb, holes;
                if (is_state_group(&w, g)) {
                    *state_of(&w, s, g) = 0; // a new state, unless the hit's copy fills it
                    continue;
                }
                table(h, w.ids[s], g, &nb, &holes);
                seen_windowed_holes += holes;
            }
            run_copies(&w);
            check_data(&w); // the shared blocks and states hold this prompt's
            // An engine chunks its prefill at a state boundary to cache the state there.
            uint32_t at = cached;
            if (w.S && rnd(&w, 2) && n / w.S * w.S > cached) {
                at = n / w.S * w.S;
                if (pkv_hybrid_append(h, w.ids[s], at - cached, slots) != PKV_OK) {
                    cr_assert(evicting);
                    cr_assert_eq(pkv_hybrid_seq_free(h, w.ids[s]), PKV_OK);
                    w.live[s] = 0;
                    continue;
                }
                write_slots(&w, s, cached, at - cached, slots);
                w.len[s] = at;
                offer(&w, s, at);
            }
            st = pkv_hybrid_append(h, w.ids[s], n - at, slots);
            if (st == PKV_ERR_OUT_OF_BLOCKS) {
                cr_assert(evicting);
                cr_assert_eq(pkv_hybrid_seq_free(h, w.ids[s]), PKV_OK);
                w.live[s] = 0;
            } else {
                cr_assert_eq(st, PKV_OK);
                write_slots(&w, s, at, n - at, slots);
                w.len[s] = n;
                if (rnd(&w, 4)) offer(&w, s, n);
            }
        } else if (rnd(&w, 3) == 0) {
            cr_assert_eq(pkv_hybrid_seq_free(h, w.ids[s]), PKV_OK);
            w.live[s] = 0;
        } else if (w.len[s] + 2 < R_MAX_LEN) {
            const uint32_t n = 1 + rnd(&w, 2);
            for (uint32_t t = 0; t < n; t++) w.tok[s][w.len[s] + t] = 500 + (int32_t)rnd(&w, 3);
            pkv_status st = pkv_hybrid_append(h, w.ids[s], n, slots);
            if (st == PKV_OK) {
                write_slots(&w, s, w.len[s], n, slots);
                w.len[s] += n;
            } else {
                cr_assert(evicting && st == PKV_ERR_OUT_OF_BLOCKS);
            }
        }
        run_copies(&w);
        cr_assert_eq(pkv_hybrid_validate(h), PKV_OK, "step %u", step);
        check_data(&w);
    }
    for (uint32_t g = 0; g < w.ng; g++) {
        pkv_hybrid_group_stats st;
        pkv_hybrid_group_stats_get(h, g, &st);
        seen_evictions += st.prefix_evictions;
        free(w.mem[g]);
    }
    free(w.keys);
    pkv_hybrid_destroy(h);
}

Test(hybrid_prefix, randomized_hits_match_a_token_level_reference, .timeout = 300) {
    const pkv_hybrid_layout layouts[4] = {PKV_HYBRID_PAGED, PKV_HYBRID_PARTITION,
                                          PKV_HYBRID_SHARED_PAGE, PKV_HYBRID_LCM};
    for (uint64_t seed = 1; seed <= R_SEEDS; seed++) run_random(layouts[seed % 4], seed, 0);
    cr_log_info("hits %llu, holes %llu, state hits %llu", (unsigned long long)seen_hits,
                (unsigned long long)seen_windowed_holes, (unsigned long long)seen_state_hits);
    cr_assert_gt(seen_hits, 500, "the test must exercise hits");
    cr_assert_gt(seen_windowed_holes, 100, "... windowed hits with holes");
    cr_assert_gt(seen_state_hits, 50, "... and hits with a cached state");
}

Test(hybrid_prefix, randomized_under_pressure_loses_no_block, .timeout = 300) {
    const pkv_hybrid_layout layouts[4] = {PKV_HYBRID_PAGED, PKV_HYBRID_PARTITION,
                                          PKV_HYBRID_SHARED_PAGE, PKV_HYBRID_LCM};
    for (uint64_t seed = 1; seed <= R_SEEDS; seed++) run_random(layouts[seed % 4], seed, 1);
    cr_log_info("hits %llu, evictions %llu", (unsigned long long)seen_hits,
                (unsigned long long)seen_evictions);
    cr_assert_gt(seen_hits, 100, "the test must exercise hits");
    cr_assert_gt(seen_evictions, 100, "... and evictions");
}

Test(hybrid_prefix, layout_sweep_full_plus_sliding) {
    // The same model and requests under every layout: a full and a sliding group
    // (W = 4), block size 2 everywhere (shared-page: equal bytes per token gives
    // equal block sizes). a computes 12 tokens; b's prompt is the same: L = 10,
    // the full group shares 5 blocks, the sliding one 2 (PAGED: one table, 5).
    const pkv_hybrid_layout layouts[4] = {PKV_HYBRID_PAGED, PKV_HYBRID_PARTITION,
                                          PKV_HYBRID_SHARED_PAGE, PKV_HYBRID_LCM};
    pkv_kv_group gs[2] = {hybrid_test_group(PKV_LAYER_FULL, 1, 0), hybrid_test_group(PKV_LAYER_SLIDING, 1, 4)};
    for (uint32_t l = 0; l < 4; l++) {
        pkv_hybrid *h = make_cached(gs, 2, layouts[l], 1 << 12, 2, 64);
        computed(h, prompt, 12);
        pkv_seq_id b;
        cr_assert_eq(hit_of(h, prompt, 12, &b), 10, "%s", pkv_hybrid_layout_name(layouts[l]));
        pkv_hybrid_group_stats f, s;
        cr_assert_eq(pkv_hybrid_group_stats_get(h, 0, &f), PKV_OK);
        cr_assert_eq(pkv_hybrid_group_stats_get(h, 1, &s), PKV_OK);
        cr_assert_eq(f.prefix_hit_blocks, 5);
        cr_assert_eq(s.prefix_hit_blocks, layouts[l] == PKV_HYBRID_PAGED ? 5 : 2,
                     "%s", pkv_hybrid_layout_name(layouts[l]));
        cr_assert_eq(pkv_hybrid_append(h, b, 3, NULL), PKV_OK);
        ok(h);
        pkv_hybrid_destroy(h);
    }
}

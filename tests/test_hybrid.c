// SPDX-License-Identifier: MIT
// The hybrid KV manager (hybrid.h): the group rules with hand-computed
// expectations (which blocks a sliding or chunked group keeps, the block sizes of
// the shared-page layout, the pool sizes of the partition and paged layouts), the
// state groups, the all-or-nothing batch append, and the error paths. The
// randomized model test is in test_hybrid_model.c.
#include <criterion/criterion.h>
#include <string.h>

#include "hybrid_fixture.h"
#include "pkv/hybrid.h"
#include "src/allocator/hybrid_internal.h" // white-box: validate_catches_a_leaked_reference

static pkv_hybrid *make(const pkv_kv_group *groups, uint32_t n, pkv_hybrid_layout layout,
                        uint64_t budget, uint32_t block_size) {
    const pkv_hybrid_params p = hybrid_test_params(groups, n, layout, budget, block_size);
    pkv_hybrid *h = NULL;
    cr_assert_eq(pkv_hybrid_create(&p, &h), PKV_OK, "create %s", pkv_hybrid_layout_name(layout));
    return h;
}

static pkv_seq_id new_seq(pkv_hybrid *h) {
    pkv_seq_id id;
    cr_assert_eq(pkv_hybrid_seq_create(h, &id), PKV_OK);
    return id;
}

static void append_one_by_one(pkv_hybrid *h, pkv_seq_id id, uint32_t n) {
    for (uint32_t i = 0; i < n; i++) cr_assert_eq(pkv_hybrid_append(h, id, 1, NULL), PKV_OK);
}

static uint32_t holes(const pkv_hybrid *h, pkv_seq_id id, uint32_t g, uint32_t *num_blocks) {
    const pkv_block_id *t;
    uint32_t first;
    cr_assert_eq(pkv_hybrid_block_table(h, id, g, &t, num_blocks, &first), PKV_OK);
    for (uint32_t j = 0; j < *num_blocks; j++)
        cr_assert_eq(t[j] == PKV_BLOCK_NONE, j < first, "entry %u", j);
    return first;
}

Test(hybrid, sliding_window_4_block_2_keeps_the_window) {
    // Sliding W = 4, B = 2. The 9th token is appended at p = 8: that query sees
    // 5..8, so tokens 0..4 are dead and blocks 0 (0-1) and 1 (2-3) are released;
    // block 2 (4-5) still holds token 5. A full group beside it keeps everything.
    pkv_kv_group gs[2] = {hybrid_test_group(PKV_LAYER_SLIDING, 1, 4), hybrid_test_group(PKV_LAYER_FULL, 1, 0)};
    pkv_hybrid *h = make(gs, 2, PKV_HYBRID_PARTITION, 1 << 12, 2);
    pkv_seq_id id = new_seq(h);
    append_one_by_one(h, id, 9);
    uint32_t nb;
    cr_assert_eq(holes(h, id, 0, &nb), 2);
    cr_assert_eq(nb, 5);
    cr_assert_eq(holes(h, id, 1, &nb), 0);
    pkv_hybrid_group_stats st;
    cr_assert_eq(pkv_hybrid_group_stats_get(h, 0, &st), PKV_OK);
    cr_assert_eq(st.blocks_held, 3);
    cr_assert_eq(st.blocks_released, 2);
    cr_assert_eq(st.tokens_held, 5, "tokens 4..8");
    cr_assert_eq(st.used_bytes, 3 * 2 * 2, "3 blocks x 2 tokens x 2 bytes");
    // One more token (query at 9 sees 6..9): block 2 goes too.
    cr_assert_eq(pkv_hybrid_append(h, id, 1, NULL), PKV_OK);
    cr_assert_eq(holes(h, id, 0, &nb), 3);
    // Decoding on stays bounded: at most ceil((W - 1 + 1) / B) + 1 = 3 blocks live.
    for (uint32_t i = 0; i < 40; i++) {
        cr_assert_eq(pkv_hybrid_append(h, id, 1, NULL), PKV_OK);
        const uint32_t released = holes(h, id, 0, &nb);
        cr_assert_leq(nb - released, 3);
    }
    cr_assert_eq(pkv_hybrid_validate(h), PKV_OK);
    pkv_hybrid_destroy(h);
}

Test(hybrid, one_prefill_releases_on_the_next_append) {
    // 9 tokens in one append are 9 queries starting at p = 0: nothing is dead yet.
    // The next append (query at 9, sees 6..9) releases blocks 0..2.
    pkv_kv_group gs[1] = {hybrid_test_group(PKV_LAYER_SLIDING, 1, 4)};
    pkv_hybrid *h = make(gs, 1, PKV_HYBRID_SHARED_PAGE, 1 << 12, 2);
    pkv_seq_id id = new_seq(h);
    cr_assert_eq(pkv_hybrid_append(h, id, 9, NULL), PKV_OK);
    uint32_t nb;
    cr_assert_eq(holes(h, id, 0, &nb), 0);
    cr_assert_eq(pkv_hybrid_append(h, id, 1, NULL), PKV_OK);
    cr_assert_eq(holes(h, id, 0, &nb), 3);
    pkv_hybrid_destroy(h);
}

Test(hybrid, chunked_8_block_4_keeps_the_current_chunk) {
    // Chunk C = 8, B = 4. The 15th token (p = 14) sees 8..14: blocks 0, 1 dead.
    // The 17th (p = 16) starts chunk 2 and sees only 16: blocks 0..3 dead.
    pkv_kv_group gs[1] = {hybrid_test_group(PKV_LAYER_CHUNKED, 1, 8)};
    pkv_hybrid *h = make(gs, 1, PKV_HYBRID_PARTITION, 1 << 12, 4);
    pkv_seq_id id = new_seq(h);
    append_one_by_one(h, id, 15);
    uint32_t nb;
    cr_assert_eq(holes(h, id, 0, &nb), 2);
    cr_assert_eq(nb, 4);
    append_one_by_one(h, id, 2);
    cr_assert_eq(holes(h, id, 0, &nb), 4);
    cr_assert_eq(nb, 5);
    // Truncating to 15 would need 8..14 back for the query at 15: refused.
    cr_assert_eq(pkv_hybrid_seq_truncate(h, id, 15), PKV_ERR_RELEASED);
    // Truncating to 16 (the query at 16 sees 16 only) is fine.
    cr_assert_eq(pkv_hybrid_seq_truncate(h, id, 16), PKV_OK);
    cr_assert_eq(pkv_hybrid_validate(h), PKV_OK);
    pkv_hybrid_destroy(h);
}

Test(hybrid, sliding_truncate_into_the_released_window_is_refused) {
    pkv_kv_group gs[1] = {hybrid_test_group(PKV_LAYER_SLIDING, 1, 4)};
    pkv_hybrid *h = make(gs, 1, PKV_HYBRID_PARTITION, 1 << 12, 2);
    pkv_seq_id id = new_seq(h);
    append_one_by_one(h, id, 9); // holes: blocks 0, 1 (tokens 0..3)
    // A query at 7 sees 4..7: fine. At 6 it sees 3..6, and token 3 is gone.
    cr_assert_eq(pkv_hybrid_seq_truncate(h, id, 6), PKV_ERR_RELEASED);
    uint32_t len;
    cr_assert_eq(pkv_hybrid_seq_length(h, id, &len), PKV_OK);
    cr_assert_eq(len, 9, "refused: nothing changed");
    cr_assert_eq(pkv_hybrid_seq_truncate(h, id, 7), PKV_OK);
    cr_assert_eq(pkv_hybrid_validate(h), PKV_OK);
    pkv_hybrid_destroy(h);
}

Test(hybrid, shared_page_block_sizes_make_equal_pages) {
    // elem 2: full 2 layers x 2 heads x 4 dims: 2*2*2*4*2 = 64 bytes per token;
    // sliding 3 layers x 1 x 4: 48; MLA 1 layer x (8 + 4): 24. B = 16 for the
    // largest: P = 16 * 64 = 1024, so full 16, sliding floor(1024/48) = 21 (16
    // bytes of each page unused), MLA floor(1024/24) = 42 (16 unused).
    pkv_kv_group gs[4] = {
        {.kind = PKV_LAYER_FULL, .num_layers = 2, .num_kv_heads = 2, .head_dim = 4},
        {.kind = PKV_LAYER_SLIDING, .num_layers = 3, .num_kv_heads = 1, .head_dim = 4, .window = 64},
        {.kind = PKV_LAYER_MLA, .num_layers = 1, .latent_dim = 8, .rope_dim = 4},
        {.kind = PKV_LAYER_STATE, .num_layers = 2, .state_bytes = 50},
    };
    pkv_hybrid_params p;
    pkv_hybrid_params_default(&p);
    p.groups = gs;
    p.num_groups = 4;
    p.layout = PKV_HYBRID_SHARED_PAGE;
    p.max_seqs = 10;
    p.budget_bytes = 10 * 100 + 100 * 1024 + 1000; // states, 100 pages, a rest
    pkv_hybrid *h;
    cr_assert_eq(pkv_hybrid_create(&p, &h), PKV_OK);
    const uint32_t want_bs[4] = {16, 21, 42, 0};
    for (uint32_t g = 0; g < 4; g++) {
        uint32_t bs;
        cr_assert_eq(pkv_hybrid_group_info(h, g, NULL, &bs), PKV_OK);
        cr_assert_eq(bs, want_bs[g], "group %u", g);
    }
    pkv_seq_id id = new_seq(h);
    cr_assert_eq(pkv_hybrid_append(h, id, 22, NULL), PKV_OK);
    pkv_hybrid_group_stats st;
    cr_assert_eq(pkv_hybrid_group_stats_get(h, 1, &st), PKV_OK);
    cr_assert_eq(st.page_bytes, 1024);
    cr_assert_eq(st.capacity_bytes, 100 * 1024, "one shared pool of 100 pages");
    cr_assert_eq(st.blocks_held, 2);
    cr_assert_eq(st.padding_bytes, 2 * 16);
    cr_assert_eq(st.free_bytes, (100 - 2 - 2 - 1) * 1024, "full 2, sliding 2, MLA 1 page");
    cr_assert_eq(pkv_hybrid_group_stats_get(h, 3, &st), PKV_OK);
    cr_assert_eq(st.capacity_bytes, 10 * 100);
    cr_assert_eq(st.used_bytes, 100);
    // Block sizes are fixed by the layout: a per-group one is refused.
    pkv_hybrid *bad = (pkv_hybrid *)1;
    p.block_sizes[0] = 8;
    cr_assert_eq(pkv_hybrid_create(&p, &bad), PKV_ERR_INVALID_ARG);
    cr_assert_null(bad);
    pkv_hybrid_destroy(h);
}

Test(hybrid, partition_and_paged_pool_sizes) {
    // elem 2: full 64 bytes per token, sliding 2*6*2*4*2 = 192 (sum 256). State:
    // 10 seqs x 2 layers x 100 = 2000 bytes. Budget 1,000,000: pages get 998,000.
    pkv_kv_group gs[3] = {
        {.kind = PKV_LAYER_FULL, .num_layers = 2, .num_kv_heads = 2, .head_dim = 4},
        {.kind = PKV_LAYER_SLIDING, .num_layers = 6, .num_kv_heads = 2, .head_dim = 4, .window = 32},
        {.kind = PKV_LAYER_STATE, .num_layers = 2, .state_bytes = 100},
    };
    pkv_hybrid_params p;
    pkv_hybrid_params_default(&p);
    p.groups = gs;
    p.num_groups = 3;
    p.max_seqs = 10;
    p.budget_bytes = 1000000;
    p.layout = PKV_HYBRID_PARTITION;
    p.block_sizes[1] = 8;
    pkv_hybrid *h;
    cr_assert_eq(pkv_hybrid_create(&p, &h), PKV_OK);
    // Full: 998000 * 64/256 = 249500 bytes / (16 * 64) = 243 blocks.
    // Sliding: 748500 bytes / (8 * 192) = 487 blocks.
    pkv_hybrid_group_stats st;
    cr_assert_eq(pkv_hybrid_group_stats_get(h, 0, &st), PKV_OK);
    cr_assert_eq(st.capacity_bytes, 243 * 1024);
    cr_assert_eq(pkv_hybrid_group_stats_get(h, 1, &st), PKV_OK);
    cr_assert_eq(st.capacity_bytes, 487 * 1536);
    cr_assert_eq(st.block_size, 8);
    cr_assert_eq(pkv_hybrid_group_stats_get(h, 2, &st), PKV_OK);
    cr_assert_eq(st.capacity_bytes, 2000);
    pkv_hybrid_destroy(h);
    // Paged: a page is 16 tokens of both groups, 16 * 256 = 4096 bytes: 243 pages;
    // one table: both groups get the same slots, nothing is released.
    p.layout = PKV_HYBRID_PAGED;
    p.block_sizes[1] = 0;
    cr_assert_eq(pkv_hybrid_create(&p, &h), PKV_OK);
    cr_assert_eq(pkv_hybrid_group_stats_get(h, 1, &st), PKV_OK);
    cr_assert_eq(st.capacity_bytes, 243 * 16 * 192, "the sliding group's part of 243 pages");
    pkv_seq_id id = new_seq(h);
    int64_t slots[3 * 40];
    cr_assert_eq(pkv_hybrid_append(h, id, 40, slots), PKV_OK);
    for (uint32_t t = 0; t < 40; t++) {
        cr_assert_eq(slots[t], slots[40 + t]);
        cr_assert_eq(slots[80 + t], -1, "a state group has no slot");
    }
    cr_assert_eq(pkv_hybrid_append(h, id, 40, NULL), PKV_OK);
    uint32_t nb;
    cr_assert_eq(holes(h, id, 1, &nb), 0, "paged never releases");
    cr_assert_eq(pkv_hybrid_validate(h), PKV_OK);
    pkv_hybrid_destroy(h);
}

Test(hybrid, state_groups_fork_copies_and_refuse_truncate) {
    pkv_kv_group gs[2] = {hybrid_test_group(PKV_LAYER_FULL, 1, 0), hybrid_test_group(PKV_LAYER_STATE, 1, 0)};
    pkv_hybrid_params p = hybrid_test_params(gs, 2, PKV_HYBRID_PARTITION, 2 * 100 + 64 * 32, 16);
    p.max_seqs = 2;
    pkv_hybrid *h;
    cr_assert_eq(pkv_hybrid_create(&p, &h), PKV_OK);
    pkv_seq_id a, b, c;
    cr_assert_eq(pkv_hybrid_seq_create(h, &a), PKV_OK);
    cr_assert_eq(pkv_hybrid_append(h, a, 5, NULL), PKV_OK);
    cr_assert_eq(pkv_hybrid_seq_fork(h, a, &b), PKV_OK);
    int32_t sa, sb;
    cr_assert_eq(pkv_hybrid_state_slot(h, a, 1, &sa), PKV_OK);
    cr_assert_eq(pkv_hybrid_state_slot(h, b, 1, &sb), PKV_OK);
    cr_assert_neq(sa, sb);
    cr_assert_eq(pkv_hybrid_state_slot(h, a, 0, &sa), PKV_ERR_INVALID_ARG, "a token group");
    cr_assert_eq(pkv_hybrid_pending_copies(h, 1), 1);
    // Both slots in use: a third sequence finds no state slot, and nothing changes.
    cr_assert_eq(pkv_hybrid_seq_create(h, &c), PKV_ERR_OUT_OF_BLOCKS);
    cr_assert_eq(pkv_hybrid_seq_fork(h, a, &c), PKV_ERR_OUT_OF_BLOCKS);
    cr_assert_eq(pkv_hybrid_live_count(h), 2);
    pkv_block_copy cp[2];
    uint32_t n;
    cr_assert_eq(pkv_hybrid_take_copies(h, 1, cp, 0, &n), PKV_ERR_BUFFER_TOO_SMALL);
    cr_assert_eq(n, 1);
    // The parent frees before the copy ran: its slot stays pinned, not reusable.
    cr_assert_eq(pkv_hybrid_seq_free(h, a), PKV_OK);
    cr_assert_eq(pkv_hybrid_seq_create(h, &c), PKV_ERR_OUT_OF_BLOCKS);
    cr_assert_eq(pkv_hybrid_validate(h), PKV_OK);
    cr_assert_eq(pkv_hybrid_take_copies(h, 1, cp, 2, &n), PKV_OK);
    cr_assert_eq(n, 1);
    cr_assert_eq(cp[0].src, sa);
    cr_assert_eq(cp[0].dst, sb);
    cr_assert_eq(pkv_hybrid_seq_create(h, &c), PKV_OK, "the pin is gone");
    // A recurrent state cannot be rolled back.
    cr_assert_eq(pkv_hybrid_seq_truncate(h, b, 3), PKV_ERR_UNSUPPORTED);
    cr_assert_eq(pkv_hybrid_seq_truncate(h, b, 5), PKV_OK, "to its own length: a no-op");
    cr_assert_eq(pkv_hybrid_validate(h), PKV_OK);
    pkv_hybrid_destroy(h);
}

Test(hybrid, batch_append_is_all_or_nothing_across_groups) {
    // Shared page, B = 2 for both groups (same bytes per token), 6 pages of 4
    // bytes. Two sequences of 2 tokens hold one page per group each: 4 pages.
    pkv_kv_group gs[2] = {hybrid_test_group(PKV_LAYER_FULL, 1, 0), hybrid_test_group(PKV_LAYER_SLIDING, 1, 64)};
    pkv_hybrid *h = make(gs, 2, PKV_HYBRID_SHARED_PAGE, 6 * 4, 2);
    pkv_seq_id a, b;
    cr_assert_eq(pkv_hybrid_seq_create(h, &a), PKV_OK);
    cr_assert_eq(pkv_hybrid_seq_create(h, &b), PKV_OK);
    cr_assert_eq(pkv_hybrid_append(h, a, 2, NULL), PKV_OK); // 2 pages
    cr_assert_eq(pkv_hybrid_append(h, b, 2, NULL), PKV_OK); // 4 pages
    pkv_seq_id ids[2] = {a, b};
    uint32_t counts[2] = {1, 1}, need[2];
    cr_assert_eq(pkv_hybrid_blocks_needed_batch(h, ids, counts, 2, need), PKV_OK);
    cr_assert_eq(need[0], 2);
    cr_assert_eq(need[1], 2);
    pkv_hybrid_group_stats before, after;
    cr_assert_eq(pkv_hybrid_group_stats_get(h, 0, &before), PKV_OK);
    // 4 pages needed, 2 free: each group alone would fit, both do not.
    cr_assert_eq(pkv_hybrid_append_batch(h, ids, counts, 2, NULL), PKV_ERR_OUT_OF_BLOCKS);
    cr_assert_eq(pkv_hybrid_group_stats_get(h, 0, &after), PKV_OK);
    cr_assert_eq(after.free_bytes, before.free_bytes);
    uint32_t len;
    cr_assert_eq(pkv_hybrid_seq_length(h, a, &len), PKV_OK);
    cr_assert_eq(len, 2);
    uint32_t nb;
    holes(h, a, 1, &nb);
    cr_assert_eq(nb, 1, "the sliding group did not grow either");
    counts[1] = 0;
    cr_assert_eq(pkv_hybrid_append_batch(h, ids, counts, 2, NULL), PKV_OK);
    pkv_seq_id dup[2] = {a, a};
    cr_assert_eq(pkv_hybrid_append_batch(h, dup, counts, 2, NULL), PKV_ERR_INVALID_ARG);
    cr_assert_eq(pkv_hybrid_validate(h), PKV_OK);
    pkv_hybrid_destroy(h);
}

Test(hybrid, window_release_makes_room_in_a_full_pool) {
    // Sliding W = 2, B = 1, a pool of 2 blocks: at steady state every append takes
    // one block and releases one. Without counting the release the pool is full.
    pkv_kv_group gs[1] = {hybrid_test_group(PKV_LAYER_SLIDING, 1, 2)};
    pkv_hybrid *h = make(gs, 1, PKV_HYBRID_PARTITION, 2 * 2, 1);
    pkv_seq_id id = new_seq(h);
    cr_assert_eq(pkv_hybrid_append(h, id, 2, NULL), PKV_OK); // both blocks
    uint32_t need;
    for (uint32_t i = 0; i < 10; i++) {
        cr_assert_eq(pkv_hybrid_blocks_needed(h, id, 1, &need), PKV_OK);
        cr_assert_eq(need, 0, "one new block, one released");
        cr_assert_eq(pkv_hybrid_append(h, id, 1, NULL), PKV_OK, "step %u", i);
    }
    cr_assert_eq(pkv_hybrid_append(h, id, 2, NULL), PKV_ERR_OUT_OF_BLOCKS);
    cr_assert_eq(pkv_hybrid_validate(h), PKV_OK);
    pkv_hybrid_destroy(h);
}

Test(hybrid, exports_per_group_show_holes) {
    pkv_kv_group gs[2] = {hybrid_test_group(PKV_LAYER_SLIDING, 1, 2), hybrid_test_group(PKV_LAYER_FULL, 1, 0)};
    pkv_hybrid *h = make(gs, 2, PKV_HYBRID_PARTITION, 1 << 10, 2);
    pkv_seq_id id = new_seq(h);
    append_one_by_one(h, id, 6); // query at 5 sees 4..5: blocks 0, 1 released
    const pkv_block_id *t;
    uint32_t nb, first;
    cr_assert_eq(pkv_hybrid_block_table(h, id, 0, &t, &nb, &first), PKV_OK);
    cr_assert_eq(first, 2);
    uint32_t maxb;
    uint64_t total;
    cr_assert_eq(pkv_hybrid_export_size(h, 0, &id, 1, &maxb, &total), PKV_OK);
    cr_assert_eq(maxb, 3);
    int32_t table[4], lens[1];
    cr_assert_eq(pkv_hybrid_export_padded(h, 0, &id, 1, 4, -9, table, lens), PKV_OK);
    int32_t want[4] = {-1, -1, t[2], -9};
    cr_assert_arr_eq(table, want, sizeof want);
    cr_assert_eq(lens[0], 6);
    int32_t indptr[2], indices[3], last[1], fb[1];
    cr_assert_eq(pkv_hybrid_export_csr(h, 0, &id, 1, indptr, indices, 3, last, fb), PKV_OK);
    cr_assert_eq(indptr[1], 1);
    cr_assert_eq(indices[0], t[2]);
    cr_assert_eq(fb[0], 2);
    cr_assert_eq(last[0], 2);
    cr_assert_eq(pkv_hybrid_export_csr(h, 1, &id, 1, indptr, indices, 3, last, fb), PKV_OK);
    cr_assert_eq(indptr[1], 3);
    cr_assert_eq(fb[0], 0);
    cr_assert_eq(pkv_hybrid_export_csr(h, 2, &id, 1, indptr, indices, 3, last, fb),
                 PKV_ERR_INVALID_ARG, "no group 2");
    cr_assert_eq(pkv_hybrid_export_size(h, 0, &(pkv_seq_id){id + 1}, 1, &maxb, &total),
                 PKV_ERR_NOT_FOUND);
    pkv_hybrid_destroy(h);
}

Test(hybrid, create_refuses_bad_parameters) {
    pkv_kv_group ok = hybrid_test_group(PKV_LAYER_FULL, 1, 0);
    pkv_hybrid_params p;
    pkv_hybrid_params_default(&p);
    p.groups = &ok;
    p.num_groups = 1;
    p.budget_bytes = 1 << 20;
    pkv_hybrid *h = (pkv_hybrid *)1;
    cr_assert_eq(pkv_hybrid_create(NULL, &h), PKV_ERR_INVALID_ARG);
    cr_assert_null(h);
    pkv_hybrid_params q = p;
    q.num_groups = 0;
    cr_assert_eq(pkv_hybrid_create(&q, &h), PKV_ERR_INVALID_ARG, "no group");
    pkv_kv_group only_state = hybrid_test_group(PKV_LAYER_STATE, 1, 0);
    q = p;
    q.groups = &only_state;
    cr_assert_eq(pkv_hybrid_create(&q, &h), PKV_ERR_INVALID_ARG, "no token group");
    pkv_kv_group no_window = hybrid_test_group(PKV_LAYER_SLIDING, 1, 0);
    q = p;
    q.groups = &no_window;
    cr_assert_eq(pkv_hybrid_create(&q, &h), PKV_ERR_INVALID_ARG, "window 0");
    q = p;
    q.block_size = 0;
    cr_assert_eq(pkv_hybrid_create(&q, &h), PKV_ERR_INVALID_ARG, "block size 0");
    q = p;
    q.block_sizes[0] = 8;
    cr_assert_eq(pkv_hybrid_create(&q, &h), PKV_ERR_INVALID_ARG, "per-group block size in paged");
    q = p;
    q.budget_bytes = 10;
    cr_assert_eq(pkv_hybrid_create(&q, &h), PKV_ERR_INVALID_ARG, "budget below one page");
    q = p;
    q.layout = PKV_HYBRID_LCM;
    q.budget_bytes = 10;
    cr_assert_eq(pkv_hybrid_create(&q, &h), PKV_ERR_INVALID_ARG, "lcm: budget below one large page");
    q = p;
    q.layout = (pkv_hybrid_layout)9;
    cr_assert_eq(pkv_hybrid_create(&q, &h), PKV_ERR_INVALID_ARG);
    pkv_hybrid_layout l;
    cr_assert_eq(pkv_hybrid_layout_parse("shared-page", &l), PKV_OK);
    cr_assert_eq(l, PKV_HYBRID_SHARED_PAGE);
    cr_assert_eq(pkv_hybrid_layout_parse("jenga", &l), PKV_ERR_INVALID_ARG);
    cr_assert_str_eq(pkv_hybrid_layout_name(PKV_HYBRID_PARTITION), "partition");
    cr_assert_str_eq(pkv_hybrid_layout_name((pkv_hybrid_layout)9), "unknown");
    cr_assert_eq(pkv_hybrid_create(&p, &h), PKV_OK);
    pkv_seq_id id = new_seq(h);
    cr_assert_eq(pkv_hybrid_seq_free(h, id), PKV_OK);
    cr_assert_eq(pkv_hybrid_seq_free(h, id), PKV_ERR_NOT_FOUND, "a stale id");
    cr_assert_eq(pkv_hybrid_append(h, id, 1, NULL), PKV_ERR_NOT_FOUND);
    pkv_hybrid_destroy(h);
    pkv_hybrid_destroy(NULL);
}

Test(hybrid, validate_catches_a_leaked_reference_and_a_wrong_hole) {
    pkv_kv_group gs[2] = {hybrid_test_group(PKV_LAYER_FULL, 1, 0), hybrid_test_group(PKV_LAYER_SLIDING, 1, 2)};
    pkv_hybrid *h = make(gs, 2, PKV_HYBRID_SHARED_PAGE, 1 << 10, 2);
    pkv_seq_id id = new_seq(h);
    append_one_by_one(h, id, 5);
    cr_assert_eq(pkv_hybrid_validate(h), PKV_OK);
    const pkv_block_id *t;
    uint32_t nb, first;
    cr_assert_eq(pkv_hybrid_block_table(h, id, 0, &t, &nb, &first), PKV_OK);
    // A reference nobody holds (on the pool both groups share): a leak.
    cr_assert_eq(pkv_pool_retain(h->groups[0].pool, t[0]), PKV_OK);
    cr_assert_eq(pkv_hybrid_validate(h), PKV_ERR_CORRUPT);
    cr_assert_eq(pkv_pool_release(h->groups[0].pool, t[0]), PKV_OK);
    cr_assert_eq(pkv_hybrid_validate(h), PKV_OK);
    // The full group must never have holes: release one behind the manager's back.
    uint32_t released;
    cr_assert_eq(pkv_seq_release_before(h->groups[0].set, h->recs[id & 0xFFFFF].gid[0], 2,
                                        &released), PKV_OK);
    cr_assert_eq(released, 1);
    cr_assert_eq(pkv_hybrid_validate(h), PKV_ERR_CORRUPT);
    pkv_hybrid_destroy(h);
}

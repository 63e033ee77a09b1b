// SPDX-License-Identifier: MIT
// The hybrid KV manager's LCM layout (PKV_HYBRID_LCM, src/allocator/hybrid_lcm.c):
// hand-computed large pages, ownership and lazy return for a full + sliding model,
// then a randomized test of pkv_hybrid with the LCM layout (random groups, appends,
// batch appends, forks, truncates and frees) checked against the window rule and
// the large-page ownership after every operation.
#include <criterion/criterion.h>
#include <stdlib.h>
#include <string.h>

#include "hybrid_fixture.h"
#include "pkv/hybrid.h"
#include "src/allocator/hybrid_internal.h"
#include "src/allocator/lcm.h"

// MLA latent 2 + 1 and 10-byte states: page sizes whose LCM stays small.
static pkv_kv_group group(pkv_layer_kind kind, uint32_t layers, uint32_t window) {
    return hybrid_test_group_sized(kind, layers, window, 2, 10);
}

static pkv_status make(const pkv_kv_group *groups, uint32_t n, uint64_t budget, uint32_t bs,
                       pkv_hybrid **h) {
    pkv_hybrid_params p = hybrid_test_params(groups, n, PKV_HYBRID_LCM, budget, bs);
    p.max_seqs = 8;
    return pkv_hybrid_create(&p, h);
}

static const pkv_block_id *table(pkv_hybrid *h, pkv_seq_id id, uint32_t g, uint32_t *n,
                                 uint32_t *holes) {
    const pkv_block_id *t;
    cr_assert_eq(pkv_hybrid_block_table(h, id, g, &t, n, holes), PKV_OK);
    return t;
}

// Full (3 layers: 6 bytes per token) and sliding (window 4, 4 layers: 8 bytes per
// token), blocks of 4 tokens: pages of 24 and 32 bytes, large pages of LCM = 96
// bytes holding 4 and 3 of them. Budget 3 x 96 + 50: three large pages, 50 bytes
// lost to the rounding.
Test(hybrid_lcm, full_and_sliding_by_hand) {
    const pkv_kv_group groups[2] = {group(PKV_LAYER_FULL, 3, 0), group(PKV_LAYER_SLIDING, 4, 4)};
    pkv_hybrid *h = NULL;
    cr_assert_eq(make(groups, 2, 3 * 96 + 50, 4, &h), PKV_OK);
    pkvi_lcm *l = pkvi_hybrid_lcm_allocator(h);
    cr_assert_not_null(l);
    pkvi_lcm_stats s;
    cr_assert_eq(pkvi_lcm_get_stats(l, &s), PKV_OK);
    cr_assert_eq(s.large_bytes, 96);
    cr_assert_eq(s.num_large, 3);
    cr_assert_eq(s.rounding_bytes, 50);
    cr_assert_eq(s.group[0].pages_per_large, 4);
    cr_assert_eq(s.group[1].pages_per_large, 3);

    pkv_seq_id a, b;
    cr_assert_eq(pkv_hybrid_seq_create(h, &a), PKV_OK);
    // 5 tokens: 2 blocks in each group, one large page each (0: full, 1: sliding).
    cr_assert_eq(pkv_hybrid_append(h, a, 5, NULL), PKV_OK);
    cr_assert_eq(pkvi_lcm_owner(l, 0), 0);
    cr_assert_eq(pkvi_lcm_owner(l, 1), 1);
    cr_assert_eq(pkvi_lcm_owner(l, 2), PKVI_LCM_NO_GROUP);
    uint32_t n, holes;
    const pkv_block_id *t = table(h, a, 0, &n, &holes);
    cr_assert_eq(n, 2);
    for (uint32_t j = 0; j < n; j++) cr_assert(t[j] >= 0 && t[j] < 4, "full block in large page 0");
    t = table(h, a, 1, &n, &holes);
    for (uint32_t j = 0; j < n; j++) cr_assert(t[j] >= 3 && t[j] < 6, "sliding block in large page 1");
    pkv_hybrid_group_stats gs;
    cr_assert_eq(pkv_hybrid_group_stats_get(h, 0, &gs), PKV_OK);
    cr_assert_eq(gs.free_bytes, 2 * 24 + 96, "two free pages of its own and the unowned large page");
    cr_assert_eq(gs.capacity_bytes, 3 * 96);
    // 8 more (13): full 4 blocks (fits in large page 0), sliding 4 blocks: its
    // large page holds 3, so it takes large page 2.
    cr_assert_eq(pkv_hybrid_append(h, a, 8, NULL), PKV_OK);
    cr_assert_eq(pkvi_lcm_owner(l, 2), 1);
    // One more (14): the query at 13 sees 10..13, so sliding blocks 0 and 1 die.
    cr_assert_eq(pkv_hybrid_append(h, a, 1, NULL), PKV_OK);
    t = table(h, a, 1, &n, &holes);
    cr_assert_eq(n, 4);
    cr_assert_eq(holes, 2);
    // b needs 2 full blocks: the full group's large page is full, none is unowned,
    // and the sliding group's are not empty (large page 1 still holds block 2).
    cr_assert_eq(pkv_hybrid_seq_create(h, &b), PKV_OK);
    cr_assert_eq(pkv_hybrid_append(h, b, 5, NULL), PKV_ERR_OUT_OF_BLOCKS);
    cr_assert_eq(pkvi_lcm_get_stats(l, &s), PKV_OK);
    cr_assert_eq(s.free_large, 0);
    cr_assert_eq(s.reclaims, 0);
    cr_assert_eq(pkv_hybrid_validate(h), PKV_OK);
    // a goes: its large pages stay with their groups (lazy return) ...
    cr_assert_eq(pkv_hybrid_seq_free(h, a), PKV_OK);
    cr_assert_eq(pkvi_lcm_get_stats(l, &s), PKV_OK);
    cr_assert_eq(s.group[0].large_owned, 1);
    cr_assert_eq(s.group[1].large_owned, 2);
    cr_assert_eq(s.group[1].large_empty, 2);
    cr_assert_eq(s.stranded_bytes, 0);
    cr_assert_eq(pkv_hybrid_validate(h), PKV_OK);
    pkv_hybrid_destroy(h);
}

// The same model: an empty large page moves to the group that needs it.
Test(hybrid_lcm, an_empty_large_page_moves_on_demand) {
    const pkv_kv_group groups[2] = {group(PKV_LAYER_FULL, 3, 0), group(PKV_LAYER_SLIDING, 4, 4)};
    pkv_hybrid *h = NULL;
    cr_assert_eq(make(groups, 2, 3 * 96, 4, &h), PKV_OK);
    pkvi_lcm *l = pkvi_hybrid_lcm_allocator(h);
    pkv_seq_id c, d;
    cr_assert_eq(pkv_hybrid_seq_create(h, &c), PKV_OK);
    cr_assert_eq(pkv_hybrid_seq_create(h, &d), PKV_OK);
    // c: 9 tokens, 3 blocks each: full in large page 0, sliding fills large page 1.
    cr_assert_eq(pkv_hybrid_append(h, c, 9, NULL), PKV_OK);
    // d: 1 token: full's 4th page of large page 0, sliding takes large page 2.
    cr_assert_eq(pkv_hybrid_append(h, d, 1, NULL), PKV_OK);
    cr_assert_eq(pkvi_lcm_owner(l, 2), 1);
    cr_assert_eq(pkv_hybrid_seq_free(h, d), PKV_OK);
    pkvi_lcm_stats s;
    cr_assert_eq(pkvi_lcm_get_stats(l, &s), PKV_OK);
    cr_assert_eq(s.group[1].large_empty, 1, "large page 2 empties and stays (lazy)");
    cr_assert_eq(pkvi_lcm_owner(l, 2), 1);
    // c to 13 tokens: full's 4th block fits; the query at 9 kills sliding block 0,
    // whose page serves block 3.
    cr_assert_eq(pkv_hybrid_append(h, c, 4, NULL), PKV_OK);
    cr_assert_eq(pkvi_lcm_get_stats(l, &s), PKV_OK);
    cr_assert_eq(s.reclaims, 0);
    // c to 17: the full group needs a 5th block and so a large page; the sliding
    // group needs none net (block 1 dies, block 4 comes): its empty large page moves.
    cr_assert_eq(pkv_hybrid_append(h, c, 4, NULL), PKV_OK);
    cr_assert_eq(pkvi_lcm_get_stats(l, &s), PKV_OK);
    cr_assert_eq(pkvi_lcm_owner(l, 2), 0);
    cr_assert_eq(s.reclaims, 1, "an empty sliding large page went to the full group");
    cr_assert_eq(s.group[0].large_owned, 2);
    cr_assert_eq(s.group[1].large_owned, 1);
    uint32_t n, holes;
    const pkv_block_id *t = table(h, c, 0, &n, &holes);
    cr_assert_eq(n, 5);
    cr_assert(t[4] >= 8 && t[4] < 12, "the 5th full block is in large page 2 (ids 8..11)");
    cr_assert_eq(pkv_hybrid_validate(h), PKV_OK);
    pkv_hybrid_destroy(h);
}

// The same model, three large pages: a large page that the window release of the
// same append empties serves the other group in that append. The release used to
// come after the room check, so the full group's append was refused here.
Test(hybrid_lcm, a_large_page_the_release_empties_serves_the_same_append) {
    const pkv_kv_group groups[2] = {group(PKV_LAYER_FULL, 3, 0), group(PKV_LAYER_SLIDING, 4, 4)};
    pkv_hybrid *h = NULL;
    cr_assert_eq(make(groups, 2, 3 * 96, 4, &h), PKV_OK);
    pkvi_lcm *l = pkvi_hybrid_lcm_allocator(h);
    pkv_seq_id a;
    cr_assert_eq(pkv_hybrid_seq_create(h, &a), PKV_OK);
    // 16 tokens in one append (no query before them, nothing released): full
    // blocks 0..3 fill large page 0; the sliding group's 4 blocks take large pages
    // 1 and 2, three in one of them (dead_page), one in the other. No large page
    // is left.
    cr_assert_eq(pkv_hybrid_append(h, a, 16, NULL), PKV_OK);
    cr_assert_eq(pkvi_lcm_owner(l, 0), 0);
    cr_assert_eq(pkvi_lcm_owner(l, 1), 1);
    cr_assert_eq(pkvi_lcm_owner(l, 2), 1);
    uint32_t n, holes;
    const pkv_block_id *t = table(h, a, 1, &n, &holes);
    cr_assert_eq(holes, 0);
    const uint32_t dead_page = (uint32_t)t[0] / 3; // sliding ids: 3 per large page
    cr_assert(t[1] / 3 == (int32_t)dead_page && t[2] / 3 == (int32_t)dead_page &&
                  t[3] / 3 != (int32_t)dead_page,
              "sliding blocks 0..2 share a large page");

    // 17 more tokens (33: 9 blocks per group) would need 5 full blocks (two large
    // pages) and 5 sliding ones (2 free in large page 2, so one more large page):
    // three large pages, and the release empties only large page 1. Refused, and
    // the release is not done either.
    cr_assert_eq(pkv_hybrid_append(h, a, 17, NULL), PKV_ERR_OUT_OF_BLOCKS);
    table(h, a, 1, &n, &holes);
    cr_assert_eq(holes, 0, "a refused append releases nothing");
    pkv_hybrid_group_stats gs;
    cr_assert_eq(pkv_hybrid_group_stats_get(h, 1, &gs), PKV_OK);
    cr_assert_eq(gs.blocks_released, 0);

    // One token (query at 16 sees 13..16): sliding blocks 0..2 die, emptying
    // dead_page; the full group's 5th block needs a large page: that one.
    cr_assert_eq(pkv_hybrid_append(h, a, 1, NULL), PKV_OK);
    table(h, a, 1, &n, &holes);
    cr_assert_eq(holes, 3);
    cr_assert_eq(pkvi_lcm_owner(l, dead_page), 0, "the emptied large page went to the full group");
    t = table(h, a, 0, &n, &holes);
    cr_assert_eq(n, 5);
    cr_assert_eq((uint32_t)t[4] / 4, dead_page, "the 5th full block is in it (4 ids per page)");
    pkvi_lcm_stats s;
    cr_assert_eq(pkvi_lcm_get_stats(l, &s), PKV_OK);
    cr_assert_eq(s.reclaims, 1);
    cr_assert_eq(pkv_hybrid_validate(h), PKV_OK);
    pkv_hybrid_destroy(h);
}

Test(hybrid_lcm, create_errors) {
    const pkv_kv_group groups[2] = {group(PKV_LAYER_FULL, 3, 0), group(PKV_LAYER_SLIDING, 4, 4)};
    pkv_hybrid *h = (pkv_hybrid *)1;
    cr_assert_eq(make(groups, 2, 95, 4, &h), PKV_ERR_INVALID_ARG, "below one large page of 96");
    cr_assert_null(h);
    // Pages of 2 x 3 x 65519 and 2 x 4 x 65521 bytes (primes): the LCM passes 1 GiB.
    pkv_hybrid_params p = hybrid_test_params(groups, 2, PKV_HYBRID_LCM, (uint64_t)1 << 40, 16);
    p.block_sizes[0] = 65519;
    p.block_sizes[1] = 65521;
    cr_assert_eq(pkv_hybrid_create(&p, &h), PKV_ERR_LIMIT);
    // State groups take their slots first and stay out of the large pages.
    const pkv_kv_group with_state[2] = {group(PKV_LAYER_FULL, 1, 0), group(PKV_LAYER_STATE, 1, 0)};
    cr_assert_eq(make(with_state, 2, 8 * 10 + 2 * 8, 4, &h), PKV_OK); // 8 slots + 2 pages of 8
    pkvi_lcm_stats s;
    cr_assert_eq(pkvi_lcm_get_stats(pkvi_hybrid_lcm_allocator(h), &s), PKV_OK);
    cr_assert_eq(s.num_groups, 1);
    cr_assert_eq(s.num_large, 2);
    pkv_hybrid_destroy(h);
}

// ---- randomized ------------------------------------------------------------------

#define RMAX_G 4
#define RMAX_SEQS 6

typedef struct rseq {
    int live;
    pkv_seq_id id;
    uint32_t len;
    uint32_t holes[RMAX_G];
} rseq;

typedef struct rworld {
    uint64_t rng;
    pkv_hybrid *h;
    pkvi_lcm *lcm;
    uint32_t ng, bs[RMAX_G], lg[RMAX_G]; // lg: allocator group of a token group
    pkv_kv_group groups[RMAX_G];
    rseq seqs[RMAX_SEQS];
    uint64_t refused, appended;
} rworld;

static uint32_t rr(rworld *w, uint32_t n) {
    w->rng ^= w->rng << 13, w->rng ^= w->rng >> 7, w->rng ^= w->rng << 17;
    return (uint32_t)(w->rng % n);
}

static int is_tok(const rworld *w, uint32_t g) { return w->groups[g].kind != PKV_LAYER_STATE; }

// Blocks the window rule has released once the query at p ran (independent of the library).
static uint32_t dead(const rworld *w, uint32_t g, uint32_t p) {
    const pkv_kv_group *k = &w->groups[g];
    if (k->kind == PKV_LAYER_STATE) return 0; // no blocks (its block size is 0)
    uint32_t first = 0;
    if (k->kind == PKV_LAYER_SLIDING) first = p + 1 > k->window ? p + 1 - k->window : 0;
    else if (k->kind == PKV_LAYER_CHUNKED) first = p - p % k->window;
    return first / w->bs[g];
}

static void rcheck(rworld *w) {
    cr_assert_eq(pkv_hybrid_validate(w->h), PKV_OK);
    pkvi_lcm_stats s;
    cr_assert_eq(pkvi_lcm_get_stats(w->lcm, &s), PKV_OK);
    for (uint32_t i = 0; i < RMAX_SEQS; i++) {
        rseq *q = &w->seqs[i];
        if (!q->live) continue;
        for (uint32_t g = 0; g < w->ng; g++) {
            if (!is_tok(w, g)) continue;
            uint32_t n, holes;
            const pkv_block_id *t = table(w->h, q->id, g, &n, &holes);
            cr_assert_eq(n, (q->len + w->bs[g] - 1) / w->bs[g]);
            cr_assert_eq(holes, q->holes[g], "group %u holes", g);
            const uint32_t k = s.group[w->lg[g]].pages_per_large;
            for (uint32_t j = holes; j < n; j++)
                cr_assert_eq(pkvi_lcm_owner(w->lcm, (uint32_t)t[j] / k), (int)w->lg[g],
                             "block %d of group %u lies in a large page the group does not own", t[j], g);
        }
    }
}

static rseq *pick_live(rworld *w) {
    uint32_t start = rr(w, RMAX_SEQS);
    for (uint32_t i = 0; i < RMAX_SEQS; i++)
        if (w->seqs[(start + i) % RMAX_SEQS].live) return &w->seqs[(start + i) % RMAX_SEQS];
    return NULL;
}

static rseq *pick_free(rworld *w) {
    for (uint32_t i = 0; i < RMAX_SEQS; i++)
        if (!w->seqs[i].live) return &w->seqs[i];
    return NULL;
}

// Large pages a batch would take at least: sum of ceil(deficit / k) per group.
static uint64_t large_deficit(rworld *w, const uint32_t *need) {
    pkvi_lcm_stats s;
    pkvi_lcm_get_stats(w->lcm, &s);
    uint64_t want = 0;
    for (uint32_t g = 0; g < w->ng; g++) {
        if (!is_tok(w, g)) continue;
        const pkvi_lcm_group_stats *gs = &s.group[w->lg[g]];
        if (need[g] > gs->free_pages)
            want += (need[g] - gs->free_pages + gs->pages_per_large - 1) / gs->pages_per_large;
    }
    return want;
}

static void r_append(rworld *w) {
    rseq *batch[3];
    pkv_seq_id ids[3];
    uint32_t counts[3], k = 0;
    for (uint32_t t = 1 + rr(w, 3); t > 0; t--) {
        rseq *q = pick_live(w);
        if (!q) break;
        int dup = 0;
        for (uint32_t i = 0; i < k; i++) dup |= batch[i] == q;
        if (dup) continue;
        batch[k] = q, ids[k] = q->id, counts[k] = rr(w, 7), k++;
    }
    if (!k) return;
    uint32_t need[RMAX_G];
    cr_assert_eq(pkv_hybrid_blocks_needed_batch(w->h, ids, counts, k, need), PKV_OK);
    pkvi_lcm_stats before;
    pkvi_lcm_get_stats(w->lcm, &before);
    const uint64_t deficit = large_deficit(w, need);
    pkv_status st = pkv_hybrid_append_batch(w->h, ids, counts, k, NULL);
    if (st == PKV_ERR_OUT_OF_BLOCKS) {
        w->refused++;
        cr_assert_gt(deficit, before.free_large, "refused although unowned large pages cover it");
        pkvi_lcm_stats after;
        pkvi_lcm_get_stats(w->lcm, &after);
        after.reserve_failures = before.reserve_failures; // the one counter a refusal moves
        cr_assert_eq(memcmp(&after, &before, sizeof after), 0, "a refused append moves nothing");
        return;
    }
    cr_assert_eq(st, PKV_OK);
    w->appended++;
    for (uint32_t i = 0; i < k; i++) {
        rseq *q = batch[i];
        for (uint32_t g = 0; g < w->ng; g++) {
            uint32_t d = dead(w, g, q->len);
            if (is_tok(w, g) && counts[i] && d > q->holes[g]) q->holes[g] = d;
        }
        q->len += counts[i];
    }
}

static void r_op(rworld *w) {
    uint32_t r = rr(w, 100);
    rseq *q;
    if (r < 15 && (q = pick_free(w))) {
        cr_assert_eq(pkv_hybrid_seq_create(w->h, &q->id), PKV_OK);
        q->live = 1, q->len = 0;
        memset(q->holes, 0, sizeof q->holes);
    } else if (r < 70) {
        r_append(w);
    } else if (r < 80 && (q = pick_live(w))) {
        rseq *c = pick_free(w);
        if (!c) return;
        pkv_status st = pkv_hybrid_seq_fork(w->h, q->id, &c->id);
        cr_assert(st == PKV_OK || st == PKV_ERR_OUT_OF_BLOCKS);
        if (st == PKV_OK) *c = (rseq){1, c->id, q->len, {0}}, memcpy(c->holes, q->holes, sizeof c->holes);
        for (uint32_t g = 0; g < w->ng; g++) {
            pkv_block_copy cp[64];
            uint32_t n;
            cr_assert_eq(pkv_hybrid_take_copies(w->h, g, cp, 64, &n), PKV_OK);
        }
    } else if (r < 88 && (q = pick_live(w))) {
        uint32_t len = q->len ? rr(w, q->len + 1) : 0;
        pkv_status st = pkv_hybrid_seq_truncate(w->h, q->id, len);
        cr_assert(st == PKV_OK || st == PKV_ERR_RELEASED || st == PKV_ERR_UNSUPPORTED, "%s",
                  pkv_status_str(st));
        if (st == PKV_OK) q->len = len;
    } else if ((q = pick_live(w))) {
        cr_assert_eq(pkv_hybrid_seq_free(w->h, q->id), PKV_OK);
        q->live = 0;
    }
    for (uint32_t g = 0; g < w->ng; g++) { // copy-on-write copies: run (nothing to run here)
        pkv_block_copy cp[64];
        uint32_t n;
        cr_assert_eq(pkv_hybrid_take_copies(w->h, g, cp, 64, &n), PKV_OK);
    }
}

static void r_world(uint64_t seed, uint32_t ops) {
    rworld *w = calloc(1, sizeof *w);
    cr_assert_not_null(w);
    w->rng = seed * 0x9E3779B97F4A7C15ull + 3;
    w->ng = 2 + rr(w, RMAX_G - 1);
    static const pkv_layer_kind kinds[] = {PKV_LAYER_FULL, PKV_LAYER_SLIDING, PKV_LAYER_CHUNKED,
                                           PKV_LAYER_MLA, PKV_LAYER_STATE};
    for (uint32_t g = 0; g < w->ng; g++) {
        pkv_layer_kind k = kinds[rr(w, g == 0 ? 4 : 5)];
        w->groups[g] = group(k, 1 + rr(w, 3), k == PKV_LAYER_SLIDING || k == PKV_LAYER_CHUNKED ? 2 + rr(w, 8) : 0);
    }
    // A few large pages: find the LCM from a generous budget, then shrink.
    pkv_hybrid_params p = hybrid_test_params(w->groups, w->ng, PKV_HYBRID_LCM, (uint64_t)1 << 24, 1 + rr(w, 4));
    for (uint32_t g = 0; g < w->ng; g++)
        if (is_tok(w, g)) p.block_sizes[g] = rr(w, 4);
    p.max_seqs = 8;
    cr_assert_eq(pkv_hybrid_create(&p, &w->h), PKV_OK, "seed %lu", (unsigned long)seed);
    const uint64_t large = pkvi_lcm_large_bytes(pkvi_hybrid_lcm_allocator(w->h));
    pkv_hybrid_destroy(w->h);
    p.budget_bytes = 8 * 10 * 3 * 3 + large * (2 + rr(w, 8)) + rr(w, (uint32_t)large);
    cr_assert_eq(pkv_hybrid_create(&p, &w->h), PKV_OK, "seed %lu", (unsigned long)seed);
    w->lcm = pkvi_hybrid_lcm_allocator(w->h);
    uint32_t li = 0;
    for (uint32_t g = 0; g < w->ng; g++) {
        cr_assert_eq(pkv_hybrid_group_info(w->h, g, NULL, &w->bs[g]), PKV_OK);
        if (is_tok(w, g)) w->lg[g] = li++;
    }
    for (uint32_t i = 0; i < ops; i++) {
        r_op(w);
        rcheck(w);
    }
    pkvi_lcm_stats s;
    pkvi_lcm_get_stats(w->lcm, &s);
    cr_log_info("seed %lu: %u groups, %u large pages: %lu appends, %lu refused, %lu reclaims",
                (unsigned long)seed, w->ng, s.num_large, (unsigned long)w->appended,
                (unsigned long)w->refused, (unsigned long)s.reclaims);
    pkv_hybrid_destroy(w->h);
    free(w);
}

Test(hybrid_lcm, randomized_groups_and_operations, .timeout = 300) {
    for (uint64_t seed = 1; seed <= 30; seed++) r_world(seed, 1500);
}

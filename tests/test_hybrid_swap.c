// SPDX-License-Identifier: MIT
// Swap for the hybrid KV manager (hybrid.h, "swap"): pkv_hybrid_move and its
// sizing probe. Hand cases on a tiny-swa-like model (a full group of block 4, a
// sliding group of window 4 and block 2, a state group) under every pair of
// layouts: the sliding group moves only its window's blocks, holes stay holes,
// forked sequences keep their sharing, a round trip gives the same tables up to
// block ids; the all-or-nothing error paths leave both managers as they were.
// A randomized test drives two managers with appends, forks, frees and moves
// against a reference that labels blocks itself (copy-on-write and the window
// rule computed here) and checks the managers' tables and blocks_held against it.
#include <criterion/criterion.h>
#include <string.h>

#include "hybrid_fixture.h"
#include "pkv/hybrid.h"

#define NG 3 // full (block 4), sliding W 4 (block 2), state

// Bytes per token at elem 1: 2 x layers x heads x head_dim.
static const pkv_kv_group GROUPS[NG] = {
    {.kind = PKV_LAYER_FULL, .num_layers = 1, .num_kv_heads = 1, .head_dim = 1},    // 2 B/token
    {.kind = PKV_LAYER_SLIDING, .num_layers = 2, .num_kv_heads = 1, .head_dim = 1,
     .window = 4},                                                                   // 4 B/token
    {.kind = PKV_LAYER_STATE, .num_layers = 1, .state_bytes = 100},
};

// Every layout gives the full group block 4 and the sliding group block 2:
// SHARED_PAGE's page is block_size 2 x 4 bytes = 8 bytes, i.e. 4 full tokens.
static pkv_hybrid *make(pkv_hybrid_layout layout, uint64_t budget, uint32_t max_seqs) {
    pkv_hybrid_params p = hybrid_test_params(GROUPS, NG, layout, budget, 2);
    p.max_seqs = max_seqs;
    if (layout == PKV_HYBRID_PARTITION || layout == PKV_HYBRID_LCM) {
        p.block_sizes[0] = 4;
        p.block_sizes[1] = 2;
    }
    pkv_hybrid *h = NULL;
    cr_assert_eq(pkv_hybrid_create(&p, &h), PKV_OK, "create %s", pkv_hybrid_layout_name(layout));
    uint32_t b0, b1;
    pkv_hybrid_group_info(h, 0, NULL, &b0);
    pkv_hybrid_group_info(h, 1, NULL, &b1);
    cr_assert(b0 == 4 && b1 == 2, "%s: block sizes %u %u", pkv_hybrid_layout_name(layout), b0, b1);
    return h;
}

static const pkv_hybrid_layout LAYOUTS[3] = {PKV_HYBRID_PARTITION, PKV_HYBRID_SHARED_PAGE,
                                             PKV_HYBRID_LCM};

static pkv_seq_id grown(pkv_hybrid *h, uint32_t len) {
    pkv_seq_id id;
    cr_assert_eq(pkv_hybrid_seq_create(h, &id), PKV_OK);
    for (uint32_t i = 0; i < len; i++) cr_assert_eq(pkv_hybrid_append(h, id, 1, NULL), PKV_OK);
    return id;
}

static void take_all_copies(pkv_hybrid *h) {
    for (uint32_t g = 0; g < pkv_hybrid_num_groups(h); g++) {
        pkv_block_copy c[64];
        uint32_t n;
        cr_assert_eq(pkv_hybrid_take_copies(h, g, c, 64, &n), PKV_OK);
    }
}

static uint64_t held(const pkv_hybrid *h, uint32_t g) {
    pkv_hybrid_group_stats s;
    cr_assert_eq(pkv_hybrid_group_stats_get(h, g, &s), PKV_OK);
    return s.blocks_held;
}

// Everything a failed move must not change: live count, per group blocks held
// and free bytes, every listed sequence's length and tables.
typedef struct snap {
    uint32_t live;
    uint64_t held[NG], free_bytes[NG];
    uint32_t len[8];
    pkv_block_id table[8][NG][32];
} snap;

static void take_snap(const pkv_hybrid *h, const pkv_seq_id *ids, uint32_t n, snap *s) {
    memset(s, 0, sizeof *s);
    s->live = pkv_hybrid_live_count(h);
    for (uint32_t g = 0; g < NG; g++) {
        pkv_hybrid_group_stats st;
        pkv_hybrid_group_stats_get(h, g, &st);
        s->held[g] = st.blocks_held;
        s->free_bytes[g] = st.free_bytes;
    }
    for (uint32_t i = 0; i < n; i++) {
        cr_assert_eq(pkv_hybrid_seq_length(h, ids[i], &s->len[i]), PKV_OK);
        for (uint32_t g = 0; g < 2; g++) {
            const pkv_block_id *t;
            uint32_t nb;
            cr_assert_eq(pkv_hybrid_block_table(h, ids[i], g, &t, &nb, NULL), PKV_OK);
            memcpy(s->table[i][g], t, nb * sizeof *t);
        }
        pkv_hybrid_state_slot(h, ids[i], 2, &s->table[i][2][0]);
    }
}

static void same_snap(const snap *a, const snap *b, const char *what) {
    cr_assert_eq(memcmp(a, b, sizeof *a), 0, "%s changed", what);
}

// Table of `id` in group g with its holes; returns the entry count.
static uint32_t table_of(const pkv_hybrid *h, pkv_seq_id id, uint32_t g, const pkv_block_id **t,
                         uint32_t *holes) {
    uint32_t nb;
    cr_assert_eq(pkv_hybrid_block_table(h, id, g, t, &nb, holes), PKV_OK);
    return nb;
}

// a's sequences in `ha` and b's in `hb` have the same lengths, holes and tables up
// to a renaming of blocks that is one-to-one in each group (sharing kept).
static void same_up_to_ids(const pkv_hybrid *ha, const pkv_seq_id *a, const pkv_hybrid *hb,
                           const pkv_seq_id *b, uint32_t n) {
    for (uint32_t g = 0; g < 2; g++) {
        pkv_block_id fwd[4096], bwd[4096];
        memset(fwd, 0xff, sizeof fwd);
        memset(bwd, 0xff, sizeof bwd);
        for (uint32_t i = 0; i < n; i++) {
            uint32_t la, lb, ha_holes, hb_holes;
            cr_assert_eq(pkv_hybrid_seq_length(ha, a[i], &la), PKV_OK);
            cr_assert_eq(pkv_hybrid_seq_length(hb, b[i], &lb), PKV_OK);
            cr_assert_eq(la, lb, "seq %u: length %u vs %u", i, la, lb);
            const pkv_block_id *ta, *tb;
            uint32_t na = table_of(ha, a[i], g, &ta, &ha_holes);
            uint32_t nb = table_of(hb, b[i], g, &tb, &hb_holes);
            cr_assert(na == nb && ha_holes == hb_holes, "seq %u group %u: %u/%u entries, %u/%u holes",
                      i, g, na, nb, ha_holes, hb_holes);
            for (uint32_t j = 0; j < na; j++) {
                if (j < ha_holes) {
                    cr_assert(ta[j] == PKV_BLOCK_NONE && tb[j] == PKV_BLOCK_NONE);
                    continue;
                }
                cr_assert(ta[j] >= 0 && ta[j] < 4096 && tb[j] >= 0 && tb[j] < 4096);
                if (fwd[ta[j]] < 0) fwd[ta[j]] = tb[j];
                if (bwd[tb[j]] < 0) bwd[tb[j]] = ta[j];
                cr_assert(fwd[ta[j]] == tb[j] && bwd[tb[j]] == ta[j],
                          "seq %u group %u entry %u: sharing differs", i, g, j);
            }
        }
    }
}

// 20 tokens: full group 5 blocks; sliding W 4, B 2: the query at 19 sees 16..19,
// so blocks 0..7 are holes and 2 are live; the state group 1 slot. A uniform move
// would carry 10 sliding blocks.
Test(hybrid_swap, sliding_group_moves_its_window_every_layout_pair) {
    for (int f = 0; f < 3; f++)
        for (int t = 0; t < 3; t++) {
            pkv_hybrid *dev = make(LAYOUTS[f], 1 << 14, 4), *host = make(LAYOUTS[t], 1 << 14, 4);
            pkv_seq_id id = grown(dev, 20), back[1], moved[1];
            pkv_hybrid_move_size sz;
            cr_assert_eq(pkv_hybrid_move_size_get(dev, &id, 1, host, &sz), PKV_OK);
            cr_assert(sz.blocks[0] == 5 && sz.blocks[1] == 2 && sz.blocks[2] == 1,
                      "%d->%d: %u %u %u", f, t, sz.blocks[0], sz.blocks[1], sz.blocks[2]);
            cr_assert_eq(sz.bytes[0], 5 * 4 * 2);
            cr_assert_eq(sz.bytes[1], 2 * 2 * 4, "the window's 2 blocks, not 10");
            cr_assert_eq(sz.bytes[2], 100);
            cr_assert_eq(sz.total_bytes, 40 + 16 + 100);
            cr_assert_eq(sz.num_pairs, 8);
            pkv_block_copy pairs[8];
            uint32_t off[NG + 1], np;
            cr_assert_eq(pkv_hybrid_move(dev, &id, 1, host, moved, pairs, 8, off, &np), PKV_OK);
            cr_assert(np == 8 && off[0] == 0 && off[1] == 5 && off[2] == 7 && off[3] == 8);
            for (uint32_t k = 1; k < 5; k++) cr_assert_lt(pairs[k - 1].src, pairs[k].src);
            cr_assert_eq(pkv_hybrid_validate(dev), PKV_OK);
            cr_assert_eq(pkv_hybrid_validate(host), PKV_OK);
            cr_assert_eq(pkv_hybrid_live_count(dev), 0);
            for (uint32_t g = 0; g < NG; g++) cr_assert_eq(held(dev, g), 0, "group %u", g);
            cr_assert(held(host, 0) == 5 && held(host, 1) == 2 && held(host, 2) == 1);
            uint32_t holes;
            const pkv_block_id *tb;
            cr_assert_eq(table_of(host, moved[0], 1, &tb, &holes), 10);
            cr_assert_eq(holes, 8);
            cr_assert_eq(pkv_hybrid_seq_length(dev, id, &holes), PKV_ERR_NOT_FOUND);
            int32_t slot;
            pkv_hybrid_state_slot(host, moved[0], 2, &slot);
            cr_assert(pairs[7].dst == slot);
            // The moved sequence goes on decoding in `to` under the window rule.
            cr_assert_eq(pkv_hybrid_append(host, moved[0], 1, NULL), PKV_OK);
            cr_assert_eq(pkv_hybrid_seq_truncate(host, moved[0], 20), PKV_ERR_UNSUPPORTED);
            // And back: identical up to block ids.
            pkv_seq_id again = grown(dev, 21);
            pkv_block_copy more[16];
            pkv_status st = pkv_hybrid_move(host, moved, 1, dev, back, more, 16, off, &np);
            cr_assert_eq(st, PKV_OK, "%d->%d back: %s (%u pairs)", t, f, pkv_status_str(st), np);
            same_up_to_ids(dev, &again, dev, back, 1);
            cr_assert_eq(pkv_hybrid_validate(dev), PKV_OK);
            cr_assert_eq(pkv_hybrid_validate(host), PKV_OK);
            cr_assert_eq(pkv_hybrid_live_count(host), 0);
            pkv_hybrid_destroy(dev);
            pkv_hybrid_destroy(host);
        }
}

Test(hybrid_swap, round_trip_returns_the_same_tables) {
    for (int f = 0; f < 3; f++) {
        pkv_hybrid *dev = make(LAYOUTS[f], 1 << 14, 8), *host = make(LAYOUTS[(f + 1) % 3], 1 << 14, 8);
        pkv_seq_id ids[3] = {grown(dev, 7), grown(dev, 13), grown(dev, 0)};
        pkv_seq_id h_ids[3], d_ids[3];
        pkv_block_copy pairs[64];
        uint32_t off[NG + 1], np;
        cr_assert_eq(pkv_hybrid_move(dev, ids, 3, host, h_ids, pairs, 64, off, &np), PKV_OK);
        cr_assert_eq(pkv_hybrid_move(host, h_ids, 3, dev, d_ids, pairs, 64, off, &np), PKV_OK);
        // Rebuild the originals in a third manager to compare against.
        pkv_hybrid *ref = make(LAYOUTS[f], 1 << 14, 8);
        pkv_seq_id r[3] = {grown(ref, 7), grown(ref, 13), grown(ref, 0)};
        same_up_to_ids(ref, r, dev, d_ids, 3);
        cr_assert_eq(pkv_hybrid_validate(dev), PKV_OK);
        cr_assert_eq(pkv_hybrid_validate(host), PKV_OK);
        pkv_hybrid_destroy(ref);
        pkv_hybrid_destroy(dev);
        pkv_hybrid_destroy(host);
    }
}

// A parent of 8 tokens (full: 2 blocks; sliding: holes 0-1, live 2-3) forked 3
// times, each child appending 3 tokens one at a time: full gets one new block per
// child (8-11); sliding: the query at 10 sees 7..10, so each child holds block 3
// (shared) and its own blocks 4 and 5. Distinct blocks: full 2 + 3 = 5, sliding
// parent's 2 + 3 x 2 = 8; state 4 slots. Moving them one by one would take 11 and 12.
Test(hybrid_swap, forked_samples_keep_their_sharing) {
    for (int f = 0; f < 3; f++) {
        pkv_hybrid *dev = make(LAYOUTS[f], 1 << 14, 8), *host = make(LAYOUTS[2 - f], 1 << 14, 8);
        pkv_seq_id ids[4];
        ids[0] = grown(dev, 8);
        for (int c = 1; c < 4; c++) {
            cr_assert_eq(pkv_hybrid_seq_fork(dev, ids[0], &ids[c]), PKV_OK);
            for (int k = 0; k < 3; k++) cr_assert_eq(pkv_hybrid_append(dev, ids[c], 1, NULL), PKV_OK);
        }
        pkv_seq_id moved[4];
        pkv_block_copy pairs[32];
        uint32_t off[NG + 1], np;
        // The children's state copies have not run: their slots hold nothing yet.
        snap before, after;
        take_snap(dev, ids, 4, &before);
        cr_assert_eq(pkv_hybrid_move(dev, ids, 4, host, moved, pairs, 32, off, &np), PKV_ERR_BUSY);
        take_snap(dev, ids, 4, &after);
        same_snap(&before, &after, "dev after BUSY");
        cr_assert_eq(pkv_hybrid_live_count(host), 0);
        // Only the parent: its slot is a copy's source, which may be moved.
        pkv_hybrid_move_size sz;
        cr_assert_eq(pkv_hybrid_move_size_get(dev, ids, 1, host, &sz), PKV_OK);
        take_all_copies(dev);
        cr_assert_eq(pkv_hybrid_move_size_get(dev, ids, 4, host, &sz), PKV_OK);
        cr_assert(sz.blocks[0] == 5 && sz.blocks[1] == 8 && sz.blocks[2] == 4);
        cr_assert_eq(pkv_hybrid_move(dev, ids, 4, host, moved, pairs, 32, off, &np), PKV_OK);
        cr_assert_eq(np, 5 + 8 + 4);
        cr_assert(held(host, 0) == 5 && held(host, 1) == 8 && held(host, 2) == 4);
        const pkv_block_id *tp, *tc;
        uint32_t hp, hc;
        table_of(host, moved[0], 0, &tp, &hp);
        for (int c = 1; c < 4; c++) {
            table_of(host, moved[c], 0, &tc, &hc);
            cr_assert(tc[0] == tp[0] && tc[1] == tp[1], "child %d shares the prompt", c);
            cr_assert_eq(table_of(host, moved[c], 1, &tc, &hc), 6);
            cr_assert_eq(hc, 3);
        }
        cr_assert_eq(pkv_hybrid_validate(dev), PKV_OK);
        cr_assert_eq(pkv_hybrid_validate(host), PKV_OK);
        for (uint32_t g = 0; g < NG; g++) cr_assert_eq(held(dev, g), 0);
        pkv_hybrid_destroy(dev);
        pkv_hybrid_destroy(host);
    }
}

// `to` holds one sequence and has room for little more; every short resource
// refuses the move and neither manager changes.
Test(hybrid_swap, too_few_blocks_or_slots_change_nothing) {
    for (int f = 0; f < 3; f++)
        for (int t = 0; t < 3; t++) {
            pkv_hybrid *dev = make(LAYOUTS[f], 1 << 14, 4);
            // host: 2 state slots (200 bytes) + a small page budget.
            pkv_hybrid *host = make(LAYOUTS[t], 200 + 96, 2);
            pkv_seq_id ids[2] = {grown(dev, 40), grown(dev, 3)}, moved[2];
            pkv_seq_id resident = grown(host, 2);
            snap d0, h0, d1, h1;
            take_snap(dev, ids, 2, &d0);
            take_snap(host, &resident, 1, &h0);
            pkv_block_copy pairs[64];
            uint32_t off[NG + 1], np;
            // 40 tokens: 10 full blocks, more than host's pages hold (a slot is free).
            cr_assert_eq(pkv_hybrid_move(dev, ids, 1, host, moved, pairs, 64, off, &np),
                         PKV_ERR_OUT_OF_BLOCKS, "%d->%d", f, t);
            take_snap(dev, ids, 2, &d1);
            take_snap(host, &resident, 1, &h1);
            same_snap(&d0, &d1, "from");
            same_snap(&h0, &h1, "to");
            cr_assert_eq(pkv_hybrid_validate(dev), PKV_OK);
            cr_assert_eq(pkv_hybrid_validate(host), PKV_OK);
            // The state slots: one left in host, two sequences to move.
            cr_assert_eq(pkv_hybrid_move(dev, ids + 1, 1, host, moved, pairs, 64, off, &np), PKV_OK);
            pkv_seq_id id3 = grown(dev, 1);
            take_snap(dev, &id3, 1, &d0);
            take_snap(host, moved, 1, &h0);
            cr_assert_eq(pkv_hybrid_move(dev, &id3, 1, host, moved + 1, pairs, 64, off, &np),
                         PKV_ERR_OUT_OF_BLOCKS);
            take_snap(dev, &id3, 1, &d1);
            take_snap(host, moved, 1, &h1);
            same_snap(&d0, &d1, "from (slots)");
            same_snap(&h0, &h1, "to (slots)");
            cr_assert_eq(pkv_hybrid_validate(dev), PKV_OK);
            cr_assert_eq(pkv_hybrid_validate(host), PKV_OK);
            pkv_hybrid_destroy(dev);
            pkv_hybrid_destroy(host);
        }
}

Test(hybrid_swap, bad_arguments_are_refused_and_change_nothing) {
    pkv_hybrid *dev = make(PKV_HYBRID_LCM, 1 << 14, 4), *host = make(PKV_HYBRID_PARTITION, 1 << 14, 4);
    pkv_seq_id ids[2] = {grown(dev, 9), grown(dev, 5)}, moved[2];
    pkv_block_copy pairs[16];
    uint32_t off[NG + 1], np = 0;
    snap d0, d1;
    take_snap(dev, ids, 2, &d0);
    // Buffer too small: the count is reported, nothing moves.
    cr_assert_eq(pkv_hybrid_move(dev, ids, 2, host, moved, pairs, 3, off, &np),
                 PKV_ERR_BUFFER_TOO_SMALL);
    // 9 tokens: full 3 blocks, sliding (query at 8 sees 5..8) 2 holes + 3 live;
    // 5 tokens: full 2, sliding 3 live (query at 4 sees 1..4); 2 state slots.
    cr_assert_eq(np, 3 + 2 + 3 + 3 + 2);
    pkv_seq_id dup[2] = {ids[0], ids[0]};
    cr_assert_eq(pkv_hybrid_move(dev, dup, 2, host, moved, pairs, 16, off, &np), PKV_ERR_INVALID_ARG);
    pkv_seq_id stale = grown(dev, 1);
    pkv_hybrid_seq_free(dev, stale);
    pkv_seq_id with_stale[2] = {ids[0], stale};
    cr_assert_eq(pkv_hybrid_move(dev, with_stale, 2, host, moved, pairs, 16, off, &np),
                 PKV_ERR_NOT_FOUND);
    cr_assert_eq(pkv_hybrid_move(dev, ids, 2, dev, moved, pairs, 16, off, &np), PKV_ERR_INVALID_ARG);
    take_snap(dev, ids, 2, &d1);
    same_snap(&d0, &d1, "from");
    cr_assert_eq(pkv_hybrid_live_count(host), 0);
    cr_assert_eq(pkv_hybrid_validate(host), PKV_OK);

    // Mismatches, each named.
    char why[160];
    cr_assert_eq(pkv_hybrid_move_check(dev, host, why, sizeof why), PKV_OK);
    cr_assert_str_empty(why);
    pkv_kv_group other[NG];
    memcpy(other, GROUPS, sizeof other);
    other[1].window = 8;
    pkv_hybrid_params p = hybrid_test_params(other, NG, PKV_HYBRID_PARTITION, 1 << 14, 2);
    p.max_seqs = 4;
    p.block_sizes[0] = 4;
    p.block_sizes[1] = 2;
    pkv_hybrid *wide = NULL;
    cr_assert_eq(pkv_hybrid_create(&p, &wide), PKV_OK);
    cr_assert_eq(pkv_hybrid_move_check(dev, wide, why, sizeof why), PKV_ERR_INVALID_ARG);
    cr_assert(strstr(why, "group 1"), "%s", why);
    cr_assert_eq(pkv_hybrid_move(dev, ids, 2, wide, moved, pairs, 16, off, &np), PKV_ERR_INVALID_ARG);
    pkv_hybrid_destroy(wide);
    other[1].window = 4;
    p.block_sizes[0] = 8;
    cr_assert_eq(pkv_hybrid_create(&p, &wide), PKV_OK);
    cr_assert_eq(pkv_hybrid_move_check(dev, wide, why, sizeof why), PKV_ERR_INVALID_ARG);
    cr_assert(strstr(why, "block size 4 in from, 8 in to"), "%s", why);
    pkv_hybrid_move_size sz;
    cr_assert_eq(pkv_hybrid_move_size_get(dev, ids, 2, wide, &sz), PKV_ERR_INVALID_ARG);
    pkv_hybrid_destroy(wide);
    p.block_sizes[0] = 0;
    p.block_sizes[1] = 0;
    p.layout = PKV_HYBRID_PAGED;
    cr_assert_eq(pkv_hybrid_create(&p, &wide), PKV_OK);
    cr_assert_eq(pkv_hybrid_move_check(dev, wide, why, sizeof why), PKV_ERR_INVALID_ARG);
    cr_assert(strstr(why, "paged"), "%s", why);
    pkv_hybrid_destroy(wide);
    take_snap(dev, ids, 2, &d1);
    same_snap(&d0, &d1, "from after mismatches");
    pkv_hybrid_destroy(dev);
    pkv_hybrid_destroy(host);
}

// PAGED to PAGED: one table, its pairs under the first token group move whole pages.
Test(hybrid_swap, paged_moves_whole_pages_under_the_first_group) {
    pkv_hybrid_params p = hybrid_test_params(GROUPS, NG, PKV_HYBRID_PAGED, 1 << 14, 4);
    p.max_seqs = 4;
    pkv_hybrid *a = NULL, *b = NULL;
    cr_assert_eq(pkv_hybrid_create(&p, &a), PKV_OK);
    cr_assert_eq(pkv_hybrid_create(&p, &b), PKV_OK);
    pkv_seq_id id = grown(a, 10), moved;
    pkv_hybrid_move_size sz;
    cr_assert_eq(pkv_hybrid_move_size_get(a, &id, 1, b, &sz), PKV_OK);
    // 3 pages of 4 tokens x (2 + 4) bytes; the alias counts its own part.
    cr_assert(sz.blocks[0] == 3 && sz.blocks[1] == 3 && sz.bytes[0] == 24 && sz.bytes[1] == 48);
    cr_assert_eq(sz.num_pairs, 3 + 1);
    pkv_block_copy pairs[8];
    uint32_t off[NG + 1], np;
    cr_assert_eq(pkv_hybrid_move(a, &id, 1, b, &moved, pairs, 8, off, &np), PKV_OK);
    cr_assert(off[1] == 3 && off[2] == 3 && off[3] == 4);
    const pkv_block_id *t0, *t1;
    uint32_t h0, h1;
    cr_assert_eq(table_of(b, moved, 0, &t0, &h0), 3);
    cr_assert_eq(table_of(b, moved, 1, &t1, &h1), 3);
    cr_assert(t0 == t1 && h0 == 0 && h1 == 0, "one table for both token groups");
    cr_assert_eq(pkv_hybrid_validate(a), PKV_OK);
    cr_assert_eq(pkv_hybrid_validate(b), PKV_OK);
    pkv_hybrid_destroy(a);
    pkv_hybrid_destroy(b);
}

// Blocks from's prefix cache holds stay cached there; to's cache is not fed.
Test(hybrid_swap, cached_blocks_stay_in_the_source_cache) {
    // No state group: blocks only.
    pkv_hybrid_params p = hybrid_test_params(GROUPS, 2, PKV_HYBRID_PARTITION, 1 << 12, 2);
    p.block_sizes[0] = 4;
    p.prefix_cache_blocks = 64;
    pkv_hybrid *a = NULL, *b = NULL;
    cr_assert_eq(pkv_hybrid_create(&p, &a), PKV_OK);
    cr_assert_eq(pkv_hybrid_create(&p, &b), PKV_OK);
    int32_t tok[12];
    for (int i = 0; i < 12; i++) tok[i] = 100 + i;
    pkv_seq_id id, moved;
    cr_assert_eq(pkv_hybrid_seq_create(a, &id), PKV_OK);
    cr_assert_eq(pkv_hybrid_append(a, id, 12, NULL), PKV_OK);
    uint32_t inserted;
    cr_assert_eq(pkv_hybrid_cache_prefix(a, id, tok, 12, &inserted), PKV_OK);
    cr_assert_eq(inserted, 3 + 6);
    pkv_block_copy pairs[16];
    uint32_t off[3], np;
    cr_assert_eq(pkv_hybrid_move(a, &id, 1, b, &moved, pairs, 16, off, &np), PKV_OK);
    cr_assert_eq(np, 3 + 6, "nothing released yet: the whole prompt moves");
    pkv_hybrid_group_stats s;
    for (uint32_t g = 0; g < 2; g++) {
        cr_assert_eq(pkv_hybrid_group_stats_get(a, g, &s), PKV_OK);
        cr_assert_eq(s.cached_blocks, g ? 6 : 3);
        cr_assert_eq(s.cached_evictable, s.cached_blocks, "only the cache holds them now");
        cr_assert_eq(pkv_hybrid_group_stats_get(b, g, &s), PKV_OK);
        cr_assert_eq(s.cached_blocks, 0);
    }
    pkv_seq_id hit;
    uint32_t cached;
    cr_assert_eq(pkv_hybrid_seq_create_cached(a, tok, 12, &hit, &cached), PKV_OK);
    cr_assert_eq(cached, 8, "the source still hits");
    cr_assert_eq(pkv_hybrid_validate(a), PKV_OK);
    cr_assert_eq(pkv_hybrid_validate(b), PKV_OK);
    pkv_hybrid_destroy(a);
    pkv_hybrid_destroy(b);
}

// ---- randomized: two managers, appends, forks, frees and moves ----

#define RSEQS 12
#define RMAXLEN 96
#define RLABELS (1 << 16)

// A sequence of the reference: which manager holds it and, per token group, a
// label per table entry (0: a hole). Two entries share a block iff they share a
// label; the labels move with the sequence.
typedef struct rseq {
    int live, mgr;
    pkv_seq_id id;
    uint32_t len, holes[2];
    uint32_t lab[2][RMAXLEN];
} rseq;

typedef struct rworld {
    uint64_t rng;
    pkv_hybrid *h[2];
    int paged;
    uint32_t bs[2];
    rseq s[RSEQS];
    uint32_t next_label;
    uint32_t moves_ok, moves_refused;
    // Check scratch: label -> block and block -> label, stamped per check.
    int32_t l2b[RLABELS];
    uint32_t lstamp[RLABELS];
    int32_t b2l[4096];
    uint32_t bstamp[4096];
    uint32_t stamp;
} rworld;

static uint32_t rnd(rworld *w, uint32_t n) {
    w->rng = w->rng * 6364136223846793005ull + 1442695040888963407ull;
    return (uint32_t)(w->rng >> 33) % n;
}

static uint32_t nblocks(uint32_t len, uint32_t b) { return (len + b - 1) / b; }

// 1 if another live sequence of manager m holds label l in group g.
static int shared_label(const rworld *w, const rseq *self, uint32_t g, uint32_t l) {
    for (int i = 0; i < RSEQS; i++) {
        const rseq *o = &w->s[i];
        if (o == self || !o->live || o->mgr != self->mgr) continue;
        for (uint32_t j = o->holes[g]; j < nblocks(o->len, w->bs[g]); j++)
            if (o->lab[g][j] == l) return 1;
    }
    return 0;
}

// The reference's append: the window rule at the first query, copy-on-write of a
// shared partial last block, new blocks.
static void ref_append(rworld *w, rseq *r, uint32_t n) {
    for (uint32_t g = 0; g < 2; g++) {
        const uint32_t b = w->bs[g];
        if (g == 1 && !w->paged) {
            const uint32_t first_live = r->len >= 4 ? r->len - 3 : 0; // W = 4
            for (uint32_t j = r->holes[g]; j < first_live / b; j++) r->lab[g][j] = 0;
            if (first_live / b > r->holes[g]) r->holes[g] = first_live / b;
        }
        const uint32_t old = nblocks(r->len, b);
        if (r->len % b && shared_label(w, r, g, r->lab[g][old - 1]))
            r->lab[g][old - 1] = ++w->next_label;
        for (uint32_t j = old; j < nblocks(r->len + n, b); j++) r->lab[g][j] = ++w->next_label;
    }
    r->len += n;
}

static void take_copies_all(pkv_hybrid *h) {
    for (uint32_t g = 0; g < NG; g++) {
        pkv_block_copy c[256];
        uint32_t n;
        cr_assert_eq(pkv_hybrid_take_copies(h, g, c, 256, &n), PKV_OK);
    }
}

// Everything the reference knows, against both managers.
static void rcheck(rworld *w) {
    for (int m = 0; m < 2; m++) {
        const pkv_hybrid *h = w->h[m];
        cr_assert_eq(pkv_hybrid_validate(h), PKV_OK);
        uint32_t live = 0;
        for (int i = 0; i < RSEQS; i++) live += w->s[i].live && w->s[i].mgr == m;
        cr_assert_eq(pkv_hybrid_live_count(h), live);
        for (uint32_t g = 0; g < 2; g++) {
            w->stamp++;
            uint64_t distinct = 0;
            for (int i = 0; i < RSEQS; i++) {
                const rseq *r = &w->s[i];
                if (!r->live || r->mgr != m) continue;
                uint32_t len;
                cr_assert_eq(pkv_hybrid_seq_length(h, r->id, &len), PKV_OK);
                cr_assert_eq(len, r->len);
                const pkv_block_id *t;
                uint32_t holes;
                cr_assert_eq(table_of(h, r->id, g, &t, &holes), nblocks(r->len, w->bs[g]));
                cr_assert_eq(holes, r->holes[g], "seq %d group %u holes", i, g);
                for (uint32_t j = holes; j < nblocks(r->len, w->bs[g]); j++) {
                    const uint32_t l = r->lab[g][j];
                    cr_assert(l > 0 && t[j] >= 0 && t[j] < 4096);
                    if (w->lstamp[l] != w->stamp) {
                        w->lstamp[l] = w->stamp;
                        w->l2b[l] = t[j];
                        distinct++;
                    }
                    if (w->bstamp[t[j]] != w->stamp) {
                        w->bstamp[t[j]] = w->stamp;
                        w->b2l[t[j]] = (int32_t)l;
                    }
                    cr_assert(w->l2b[l] == t[j] && w->b2l[t[j]] == (int32_t)l,
                              "manager %d group %u seq %d entry %u (label %u, block %d; label's "
                              "block %d, block's label %d): sharing differs from the reference",
                              m, g, i, j, l, t[j], w->l2b[l], w->b2l[t[j]]);
                }
            }
            cr_assert_eq(held(h, g), distinct, "manager %d group %u blocks_held", m, g);
        }
        cr_assert_eq(held(h, 2), live, "manager %d state slots", m);
    }
}

static rseq *pick(rworld *w, int live) {
    int start = (int)rnd(w, RSEQS);
    for (int k = 0; k < RSEQS; k++) {
        rseq *r = &w->s[(start + k) % RSEQS];
        if (r->live == live) return r;
    }
    return NULL;
}

static void rop_move(rworld *w) {
    const int m = (int)rnd(w, 2);
    pkv_seq_id ids[3], new_ids[3];
    rseq *who[3];
    uint32_t n = 0, want = 1 + rnd(w, 3);
    for (int i = 0; i < RSEQS && n < want; i++) {
        rseq *r = &w->s[(i + (int)rnd(w, RSEQS)) % RSEQS];
        int dup = 0;
        for (uint32_t k = 0; k < n; k++) dup |= who[k] == r;
        if (r->live && r->mgr == m && !dup) who[n] = r, ids[n++] = r->id;
    }
    if (!n) return;
    // Expected pairs: distinct labels per token group, a slot per sequence.
    uint32_t expect = n;
    w->stamp++;
    for (uint32_t g = 0; g < 2; g++) {
        if (g == 1 && w->paged) continue; // the alias has no pairs of its own
        for (uint32_t k = 0; k < n; k++)
            for (uint32_t j = who[k]->holes[g]; j < nblocks(who[k]->len, w->bs[g]); j++) {
                const uint32_t l = who[k]->lab[g][j];
                if (w->lstamp[l] != w->stamp) w->lstamp[l] = w->stamp, expect++;
            }
    }
    pkv_hybrid_move_size sz;
    cr_assert_eq(pkv_hybrid_move_size_get(w->h[m], ids, n, w->h[1 - m], &sz), PKV_OK);
    cr_assert_eq(sz.num_pairs, expect);
    pkv_block_copy pairs[256];
    uint32_t off[NG + 1], np;
    pkv_status st = pkv_hybrid_move(w->h[m], ids, n, w->h[1 - m], new_ids, pairs, 256, off, &np);
    cr_assert_eq(np, expect);
    if (st == PKV_ERR_OUT_OF_BLOCKS) {
        w->moves_refused++;
        return;
    }
    cr_assert_eq(st, PKV_OK, "%s", pkv_status_str(st));
    w->moves_ok++;
    // The moved sequences share among themselves only: their labels are renamed
    // (one new label per old one), so they share nothing with those left behind or
    // already in `to`.
    w->stamp++;
    for (uint32_t g = 0; g < 2; g++)
        for (uint32_t k = 0; k < n; k++)
            for (uint32_t j = who[k]->holes[g]; j < nblocks(who[k]->len, w->bs[g]); j++) {
                uint32_t *l = &who[k]->lab[g][j];
                if (w->lstamp[*l] != w->stamp) {
                    w->lstamp[*l] = w->stamp;
                    w->l2b[*l] = (int32_t)++w->next_label;
                }
                *l = (uint32_t)w->l2b[*l];
            }
    for (uint32_t k = 0; k < n; k++) who[k]->mgr = 1 - m, who[k]->id = new_ids[k];
}

static void rop(rworld *w) {
    const uint32_t op = rnd(w, 10);
    rseq *r = pick(w, 1);
    if (op < 2 || !r) { // create
        rseq *f = pick(w, 0);
        if (!f) return;
        const int m = (int)rnd(w, 2);
        pkv_seq_id id;
        pkv_status st = pkv_hybrid_seq_create(w->h[m], &id);
        if (st == PKV_ERR_OUT_OF_BLOCKS) return; // no state slot
        cr_assert_eq(st, PKV_OK);
        memset(f, 0, sizeof *f);
        *f = (rseq){.live = 1, .mgr = m, .id = id};
    } else if (op < 5) { // append
        const uint32_t n = 1 + rnd(w, 5);
        if (r->len + n > RMAXLEN) return;
        pkv_status st = pkv_hybrid_append(w->h[r->mgr], r->id, n, NULL);
        if (st == PKV_ERR_OUT_OF_BLOCKS) return;
        cr_assert_eq(st, PKV_OK);
        ref_append(w, r, n);
    } else if (op < 6) { // fork
        rseq *f = pick(w, 0);
        if (!f) return;
        pkv_seq_id id;
        pkv_status st = pkv_hybrid_seq_fork(w->h[r->mgr], r->id, &id);
        if (st == PKV_ERR_OUT_OF_BLOCKS) return;
        cr_assert_eq(st, PKV_OK);
        *f = *r;
        f->id = id;
    } else if (op < 7) { // free
        cr_assert_eq(pkv_hybrid_seq_free(w->h[r->mgr], r->id), PKV_OK);
        r->live = 0;
    } else {
        rop_move(w);
    }
    take_copies_all(w->h[0]);
    take_copies_all(w->h[1]);
}

Test(hybrid_swap, randomized_moves_between_two_managers_match_a_reference) {
    static rworld w; // large scratch
    uint32_t ok = 0, refused = 0;
    for (uint64_t seed = 1; seed <= 80; seed++) {
        memset(&w, 0, sizeof w);
        w.rng = seed * 0x9E3779B97F4A7C15ull;
        w.paged = seed % 5 == 0;
        for (int m = 0; m < 2; m++) {
            // Small budgets, so that appends and moves run out now and then.
            const uint64_t budget = 6 * 100 + 200 + 100 * rnd(&w, 8);
            if (w.paged) {
                pkv_hybrid_params p = hybrid_test_params(GROUPS, NG, PKV_HYBRID_PAGED, budget, 4);
                p.max_seqs = 6;
                cr_assert_eq(pkv_hybrid_create(&p, &w.h[m]), PKV_OK);
            } else {
                w.h[m] = make(LAYOUTS[rnd(&w, 3)], budget + 400, 6); // LCM: a large page
            }
        }
        w.bs[0] = 4;
        w.bs[1] = w.paged ? 4 : 2;
        for (int i = 0; i < 300; i++) {
            rop(&w);
            rcheck(&w);
        }
        ok += w.moves_ok;
        refused += w.moves_refused;
        pkv_hybrid_destroy(w.h[0]);
        pkv_hybrid_destroy(w.h[1]);
    }
    cr_assert(ok > 100 && refused > 10, "moves: %u done, %u refused", ok, refused);
}

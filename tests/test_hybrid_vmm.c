// SPDX-License-Identifier: MIT
// pkv/hybrid_vmm.h on host memory: a hand-computed gemma-like pair of groups (the
// window's pages and the budget's bytes), states mapped for a sequence's life,
// all-or-nothing refusals, and a random walk of five group kinds and several
// sequences against the plain rule that a length change fits exactly when the
// mapped bytes afterwards fit the budget, with every kept token's content checked.
#include <criterion/criterion.h>
#include <stdint.h>
#include <string.h>
#include <unistd.h>

#include "pkv/hybrid_vmm.h"

static uint64_t rng_state;
static uint64_t rng_next(void) { // splitmix64
    uint64_t z = (rng_state += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

static const uint64_t PG = 4096; // page_bytes of every test (a multiple of the system page)

static pkv_kv_group group(pkv_layer_kind kind, uint32_t layers, uint32_t window) {
    pkv_kv_group g;
    memset(&g, 0, sizeof g);
    g.kind = kind;
    g.num_layers = layers;
    if (kind == PKV_LAYER_MLA) {
        g.latent_dim = 96;
        g.rope_dim = 32; // 128 elements x 2 bytes: 256 bytes per token and layer
    } else if (kind == PKV_LAYER_STATE) {
        g.state_bytes = 3 * PG / 2; // 2 pages per layer
    } else {
        g.num_kv_heads = 2;
        g.head_dim = 64; // 256 bytes per token and buffer at 2 bytes
        g.window = window;
    }
    return g;
}

static pkv_hybrid_vmm *make(const pkv_kv_group *groups, uint32_t n, uint64_t budget_pages,
                            uint32_t max_seqs) {
    pkv_hybrid_vmm_params p;
    pkv_hybrid_vmm_params_default(&p);
    p.groups = groups;
    p.num_groups = n;
    p.budget_bytes = budget_pages * PG;
    p.max_seqs = max_seqs;
    p.max_seq_len = 256;
    p.page_bytes = PG;
    pkv_hybrid_vmm *h = NULL;
    pkv_status st = pkv_hybrid_vmm_create(&p, &h);
    cr_assert_eq(st, PKV_OK, "create: %s", pkv_status_str(st));
    return h;
}

static uint64_t used_pages(const pkv_hybrid_vmm *h) {
    pkv_vmm_budget_stats bs;
    cr_assert_eq(pkv_hybrid_vmm_budget_stats(h, &bs), PKV_OK);
    return bs.bytes_used / PG;
}

Test(hybrid_vmm, params_are_checked) {
    pkv_kv_group ok[2] = {group(PKV_LAYER_FULL, 1, 0), group(PKV_LAYER_SLIDING, 1, 32)};
    pkv_hybrid_vmm_params p;
    pkv_hybrid_vmm_params_default(&p);
    pkv_hybrid_vmm *h = (pkv_hybrid_vmm *)1;
    cr_assert_eq(pkv_hybrid_vmm_create(&p, &h), PKV_ERR_INVALID_ARG, "no groups");
    cr_assert_null(h);
    p.groups = ok;
    p.num_groups = 2;
    cr_assert_eq(pkv_hybrid_vmm_create(&p, &h), PKV_ERR_INVALID_ARG, "budget 0");
    p.budget_bytes = 64 * PG;
    pkv_kv_group bad[2] = {ok[0], group(PKV_LAYER_SLIDING, 1, 0)};
    p.groups = bad;
    cr_assert_eq(pkv_hybrid_vmm_create(&p, &h), PKV_ERR_INVALID_ARG, "window 0");
    pkv_kv_group states[1] = {group(PKV_LAYER_STATE, 1, 0)};
    p.groups = states;
    p.num_groups = 1;
    cr_assert_eq(pkv_hybrid_vmm_create(&p, &h), PKV_ERR_INVALID_ARG, "no token group");
    pkv_kv_group huge[1] = {group(PKV_LAYER_FULL, 1, 0)};
    huge[0].num_kv_heads = 1u << 20;
    huge[0].head_dim = 1u << 19; // 2^40 bytes per token and buffer at 2 bytes
    p.groups = huge;
    p.num_groups = 1;
    p.max_seq_len = (1u << 24) + 1; // a row past 64 bits: refused, not wrapped
    cr_assert_eq(pkv_hybrid_vmm_create(&p, &h), PKV_ERR_INVALID_ARG, "row overflow");
    huge[0].num_kv_heads = UINT32_MAX;
    huge[0].head_dim = UINT32_MAX; // a token past 2^40 bytes
    p.max_seq_len = 1;
    cr_assert_eq(pkv_hybrid_vmm_create(&p, &h), PKV_ERR_INVALID_ARG, "token overflow");
    p.max_seq_len = 4096;
    p.groups = ok;
    p.num_groups = 2;
    p.page_bytes = 1000; // not a multiple of the system page
    cr_assert_eq(pkv_hybrid_vmm_create(&p, &h), PKV_ERR_INVALID_ARG);
    p.page_bytes = PG;
    cr_assert_eq(pkv_hybrid_vmm_create(&p, &h), PKV_OK);
    cr_assert_eq(pkv_hybrid_vmm_buffer_token_bytes(h, 0), 256);
    cr_assert_null(pkv_hybrid_vmm_space(h, 2));
    uint32_t s;
    cr_assert_eq(pkv_hybrid_vmm_set_length(h, 0, 4), PKV_ERR_INVALID_ARG, "not acquired");
    cr_assert_eq(pkv_hybrid_vmm_acquire(h, &s), PKV_OK);
    cr_assert_eq(pkv_hybrid_vmm_acquire(h, &s), PKV_ERR_OUT_OF_BLOCKS, "max_seqs 1");
    cr_assert_eq(pkv_hybrid_vmm_set_length(h, s, 4097), PKV_ERR_INVALID_ARG, "past max_seq_len");
    cr_assert_eq(pkv_hybrid_vmm_release(h, s), PKV_OK);
    cr_assert_eq(pkv_hybrid_vmm_release(h, s), PKV_ERR_INVALID_ARG);
    pkv_hybrid_vmm_destroy(h);
    pkv_hybrid_vmm_destroy(NULL);
}

// Full + sliding (W = 32), 256 bytes per token and buffer: 16 tokens a page. At
// 100 tokens the full group maps pages 0..6 of each of its 2 buffers (14 pages);
// the window keeps tokens 68..99: pages 4..6 (6 pages). Growing token by token,
// the window never held more than 3 pages a buffer, so 20 pages exist in all.
Test(hybrid_vmm, a_window_keeps_its_pages_and_the_budget_counts_both_groups) {
    pkv_kv_group gs[2] = {group(PKV_LAYER_FULL, 1, 0), group(PKV_LAYER_SLIDING, 1, 32)};
    pkv_hybrid_vmm *h = make(gs, 2, 64, 2);
    uint32_t s;
    cr_assert_eq(pkv_hybrid_vmm_acquire(h, &s), PKV_OK);
    void *swa_k;
    pkv_vmm_buffer_ptr(pkv_hybrid_vmm_space(h, 1), 0, &swa_k);
    for (uint32_t n = 1; n <= 100; n++) {
        cr_assert_eq(pkv_hybrid_vmm_set_length(h, s, n), PKV_OK, "n %u", n);
        // Write token n - 1's K row of the sliding layer: slot s's row, token-major.
        uint8_t *row = (uint8_t *)swa_k + (uint64_t)s * 256 * 256 + (uint64_t)(n - 1) * 256;
        memset(row, (int)(n & 0xff), 256);
        cr_assert_eq(pkv_hybrid_vmm_validate(h), PKV_OK, "n %u", n);
    }
    pkv_vmm_space *full = pkv_hybrid_vmm_space(h, 0), *swa = pkv_hybrid_vmm_space(h, 1);
    cr_assert_eq(pkv_vmm_slot_first_page(full, s), 0);
    cr_assert_eq(pkv_vmm_slot_pages(full, s), 7);
    cr_assert_eq(pkv_vmm_slot_first_page(swa, s), 4);
    cr_assert_eq(pkv_vmm_slot_pages(swa, s), 3);
    for (uint32_t t = 68; t < 100; t++) {
        const uint8_t *row = (const uint8_t *)swa_k + (uint64_t)s * 256 * 256 + (uint64_t)t * 256;
        cr_assert_eq(row[0], (t + 1) & 0xff, "token %u kept its K row", t);
        cr_assert_eq(row[255], (t + 1) & 0xff);
    }
    cr_assert_eq(used_pages(h), 14 + 6 + 0, "the window's front pages were reused");
    pkv_vmm_stats st;
    pkv_vmm_get_stats(swa, &st);
    cr_assert_eq(st.pages_created, 6);
    cr_assert_eq(st.unmap_calls, 2 * 4, "pages 0..3 of both buffers left the window");
    cr_assert_eq(pkv_hybrid_vmm_release(h, s), PKV_OK);
    cr_assert_eq(pkv_hybrid_vmm_validate(h), PKV_OK);
    pkv_hybrid_vmm_destroy(h);
}

// A state group maps its 2 pages x 2 layers at acquire, for the sequence's life;
// a length change the budget cannot cover is refused whole, in every group.
Test(hybrid_vmm, states_live_with_the_sequence_and_refusals_change_nothing) {
    pkv_kv_group gs[3] = {group(PKV_LAYER_FULL, 1, 0), group(PKV_LAYER_CHUNKED, 1, 32),
                          group(PKV_LAYER_STATE, 2, 0)};
    pkv_hybrid_vmm *h = make(gs, 3, 14, 3);
    uint32_t a, b, c;
    cr_assert_eq(pkv_hybrid_vmm_acquire(h, &a), PKV_OK);
    cr_assert_eq(used_pages(h), 4, "2 layers x 2 pages of state");
    cr_assert_eq(pkv_hybrid_vmm_acquire(h, &b), PKV_OK);
    cr_assert_eq(used_pages(h), 8);
    // 40 tokens: full pages 0..2 (x2 = 6), chunk 32..39 on page 2 (x2 = 2): 8 more
    // than the 6 left: refused, nothing changes.
    cr_assert_eq(pkv_hybrid_vmm_set_length(h, a, 40), PKV_ERR_OUT_OF_BLOCKS);
    cr_assert_eq(pkv_vmm_slot_pages(pkv_hybrid_vmm_space(h, 0), a), 0);
    cr_assert_eq(used_pages(h), 8);
    cr_assert_eq(pkv_hybrid_vmm_validate(h), PKV_OK);
    // 16 tokens: full page 0 (2), chunk 0..15 page 0 (2): fits (12 of 14).
    cr_assert_eq(pkv_hybrid_vmm_set_length(h, a, 16), PKV_OK);
    cr_assert_eq(used_pages(h), 12);
    cr_assert_eq(pkv_hybrid_vmm_acquire(h, &c), PKV_ERR_OUT_OF_BLOCKS, "4 state pages, 2 left");
    cr_assert_eq(pkv_hybrid_vmm_validate(h), PKV_OK);
    cr_assert_eq(pkv_hybrid_vmm_release(h, b), PKV_OK); // its 4 state pages are cached
    cr_assert_eq(pkv_hybrid_vmm_set_length(h, a, 32), PKV_OK, "grows into b's pages");
    cr_assert_eq(pkv_hybrid_vmm_validate(h), PKV_OK);
    pkv_vmm_budget_stats bs;
    pkv_hybrid_vmm_budget_stats(h, &bs);
    cr_assert_eq(bs.pages_reclaimed, 2, "two of the state group's cached pages released");
    pkv_hybrid_vmm_destroy(h);
}

// Kept tokens of group g for a sequence of n tokens: [first, n).
static uint32_t first_kept(const pkv_kv_group *g, uint32_t n) {
    if (n == 0) return 0;
    if (g->kind == PKV_LAYER_SLIDING) return n > g->window ? n - g->window : 0;
    if (g->kind == PKV_LAYER_CHUNKED) return (n - 1) / g->window * g->window;
    return 0;
}

static uint64_t pages_mapped_after(const pkv_kv_group *gs, uint32_t ng, const uint8_t *alive,
                                   const uint32_t *len, uint32_t seqs) {
    uint64_t pages = 0;
    for (uint32_t i = 0; i < ng; i++) {
        uint64_t buffers = gs[i].kind == PKV_LAYER_FULL || gs[i].kind == PKV_LAYER_SLIDING ||
                                   gs[i].kind == PKV_LAYER_CHUNKED
                               ? 2u * gs[i].num_layers
                               : gs[i].num_layers;
        for (uint32_t s = 0; s < seqs; s++) {
            if (!alive[s]) continue;
            if (gs[i].kind == PKV_LAYER_STATE) {
                pages += buffers * ((gs[i].state_bytes + PG - 1) / PG);
                continue;
            }
            if (len[s] == 0) continue;
            uint64_t lo = (uint64_t)first_kept(&gs[i], len[s]) * 256 / PG;
            uint64_t hi = ((uint64_t)len[s] * 256 + PG - 1) / PG;
            pages += buffers * (hi - lo);
        }
    }
    return pages;
}

static uint8_t *token_row(pkv_hybrid_vmm *h, uint32_t g, uint32_t slot, uint32_t t) {
    void *base;
    pkv_vmm_buffer_ptr(pkv_hybrid_vmm_space(h, g), 0, &base);
    return (uint8_t *)base + (uint64_t)slot * 256 * 256 + (uint64_t)t * 256;
}

// Five kinds, four sequences, random lengths up and down, acquire and release; the
// reference: a change is accepted exactly when every mapped page afterwards fits
// the budget (cached pages of any group give way), and every token kept across a
// change keeps its content.
Test(hybrid_vmm, random_walk_matches_the_byte_rule) {
    pkv_kv_group gs[5] = {group(PKV_LAYER_FULL, 1, 0), group(PKV_LAYER_SLIDING, 2, 40),
                          group(PKV_LAYER_CHUNKED, 1, 48), group(PKV_LAYER_MLA, 2, 0),
                          group(PKV_LAYER_STATE, 1, 0)};
    const uint32_t seqs = 4;
    const uint64_t budget = 70;
    rng_state = 99;
    pkv_hybrid_vmm *h = make(gs, 5, budget, seqs);
    uint8_t alive[4] = {0};
    uint32_t len[4] = {0};
    uint64_t refused = 0, accepted = 0;
    for (int step = 0; step < 3000; step++) {
        uint32_t s = (uint32_t)(rng_next() % seqs);
        int op = (int)(rng_next() % 12);
        uint8_t alive2[4];
        uint32_t len2[4];
        memcpy(alive2, alive, sizeof alive);
        memcpy(len2, len, sizeof len);
        pkv_status st;
        if (!alive[s]) {
            uint32_t lowest = 0;
            while (alive[lowest]) lowest++;
            alive2[lowest] = 1;
            len2[lowest] = 0;
            uint32_t got = 99;
            st = pkv_hybrid_vmm_acquire(h, &got);
            if (st == PKV_OK) cr_assert_eq(got, lowest);
            s = lowest;
        } else if (op == 0) {
            alive2[s] = 0;
            len2[s] = 0;
            st = pkv_hybrid_vmm_release(h, s);
            cr_assert_eq(st, PKV_OK);
        } else {
            uint32_t n = op < 8 ? len[s] + 1 + (uint32_t)(rng_next() % 24)
                                : (uint32_t)(rng_next() % 257);
            if (n > 256) n = 256;
            len2[s] = n;
            st = pkv_hybrid_vmm_set_length(h, s, n);
        }
        int fits = pages_mapped_after(gs, 5, alive2, len2, seqs) <= budget;
        if (!fits) {
            cr_assert_eq(st, PKV_ERR_OUT_OF_BLOCKS, "step %d", step);
            refused++;
        } else {
            cr_assert_eq(st, PKV_OK, "step %d: %s", step, pkv_status_str(st));
            accepted++;
            // Tokens kept before and after keep their stamps; then restamp.
            for (uint32_t i = 0; i < 4; i++) {
                if (gs[i].kind == PKV_LAYER_STATE || !alive2[s]) continue;
                uint32_t lo_old = first_kept(&gs[i], len[s]), hi_old = alive[s] ? len[s] : 0;
                uint32_t lo_new = first_kept(&gs[i], len2[s]);
                for (uint32_t t = lo_new; t < len2[s]; t++) {
                    uint8_t *r = token_row(h, i, s, t);
                    if (t >= lo_old && t < hi_old)
                        cr_assert_eq(*(uint32_t *)r, (s << 24) | (i << 16) | t,
                                     "step %d group %u token %u", step, i, t);
                    *(uint32_t *)r = (s << 24) | (i << 16) | t;
                }
            }
            memcpy(alive, alive2, sizeof alive);
            memcpy(len, len2, sizeof len);
        }
        cr_assert_eq(pkv_hybrid_vmm_validate(h), PKV_OK, "step %d", step);
        cr_assert_leq(used_pages(h), budget);
    }
    cr_assert_gt(refused, 100, "the walk must reach the budget");
    cr_assert_gt(accepted, 1000);
    pkv_hybrid_vmm_destroy(h);
}

// set_step maps what a prefill chunk's queries read: the window of its first
// query on. A full and a sliding group (window 32) of one layer at 256 bytes per
// token and buffer: 16 tokens a page. A prefill of positions 0..63: the query at 0
// reads token 0, so every group maps pages 0..3 of both buffers; set_length(64)
// would have mapped the sliding group from token 32 (pages 2..3). The next decode
// (positions 64, length 65) unmaps the sliding group's pages 0..1 (first_live 33)
// and maps page 4 in both groups. A chunk starting at 70 of a sequence at 70 on
// another slot maps from 39 (page 2); first >= n and a first without tokens are refused.
Test(hybrid_vmm, set_step_maps_a_chunks_windows) {
    pkv_kv_group g[2] = {group(PKV_LAYER_FULL, 1, 0), group(PKV_LAYER_SLIDING, 1, 32)};
    pkv_hybrid_vmm *h = make(g, 2, 64, 2);
    uint32_t s;
    cr_assert_eq(pkv_hybrid_vmm_acquire(h, &s), PKV_OK);
    cr_assert_eq(pkv_hybrid_vmm_set_step(h, s, 0, 64), PKV_OK);
    cr_assert_eq(pkv_hybrid_vmm_validate(h), PKV_OK);
    const pkv_vmm_space *full = pkv_hybrid_vmm_space(h, 0), *slide = pkv_hybrid_vmm_space(h, 1);
    cr_assert_eq(pkv_vmm_slot_first_page(slide, s), 0);
    cr_assert_eq(pkv_vmm_slot_pages(slide, s), 4);
    cr_assert_eq(used_pages(h), 16);
    cr_assert_eq(pkv_hybrid_vmm_set_step(h, s, 64, 65), PKV_OK); // == set_length(65)
    cr_assert_eq(pkv_hybrid_vmm_validate(h), PKV_OK);
    cr_assert_eq(pkv_vmm_slot_first_page(slide, s), 2);
    cr_assert_eq(pkv_vmm_slot_pages(slide, s), 3);
    cr_assert_eq(pkv_vmm_slot_pages(full, s), 5);
    uint32_t t;
    cr_assert_eq(pkv_hybrid_vmm_acquire(h, &t), PKV_OK);
    cr_assert_eq(pkv_hybrid_vmm_set_step(h, t, 70, 80), PKV_OK);
    cr_assert_eq(pkv_vmm_slot_first_page(slide, t), 2); // token 39 / 16
    cr_assert_eq(pkv_vmm_slot_pages(slide, t), 3);
    cr_assert_eq(pkv_hybrid_vmm_validate(h), PKV_OK);
    cr_assert_eq(pkv_hybrid_vmm_set_step(h, t, 80, 80), PKV_ERR_INVALID_ARG);
    cr_assert_eq(pkv_hybrid_vmm_set_step(h, t, 3, 0), PKV_ERR_INVALID_ARG);
    cr_assert_eq(pkv_vmm_slot_first_page(slide, t), 2); // refused: nothing changed
    cr_assert_eq(pkv_hybrid_vmm_validate(h), PKV_OK);
    pkv_hybrid_vmm_destroy(h);
}

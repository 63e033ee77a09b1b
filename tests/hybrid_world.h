// SPDX-License-Identifier: MIT
// The world of the hybrid KV manager's randomized model test, shared by the
// Criterion test (tests/test_hybrid_model.c: seeded random choices) and the
// libFuzzer harness (tests/fuzz/fuzz_hybrid.c: the input's bytes are the choices).
// The includer defines HW_CHECK(cond, fmt, ...) (fail with the message).
//
// Randomized model-based test of the hybrid KV manager: random group sets (full,
// sliding, chunked, MLA, state; random windows, shapes and block sizes) under
// every fixed layout, driven by random create / append / batch append / fork /
// truncate / free, and checked after every operation against a reference model
// written here: each sequence is an array of token values plus, per group, the
// number of blocks the window rule has released (computed from the rule, not from
// the manager), and a running state value per state group.
//
// Token data lives in a simulated cache per group (`mem`, indexed by slot), state
// in a simulated state pool per state group. After each call the queued copies
// run first and then the appended tokens are written through the returned slot
// mappings, as an engine step does; reading every live token back through the
// block tables must give the model's tokens, and every state slot the model's
// state. pkv_hybrid_validate checks every pool's refcounts exactly (no block lost
// or leaked, no block in two groups' tables), and a refused append must have been
// short (its blocks_needed above some pool's free count) and changed nothing.
//
// Half the worlds have a prefix cache (pkv/hybrid.h, "Prefix cache"): sequences
// are also created from a live sequence's prefix (pkv_hybrid_seq_create_cached:
// the hit's blocks must hold the source's tokens, the holes be where the rule
// puts them, the state be the source's state at the hit once the queued copy
// ran) and offered (cache_prefix, cache_state at a state boundary). Blocks only
// the cache holds count as free for the fit checks (an append evicts them), and
// at the end every block is free or the cache's.
#ifndef PKV_TEST_HYBRID_WORLD_H
#define PKV_TEST_HYBRID_WORLD_H

#include <stdlib.h>
#include <string.h>

#include "pkv/hybrid.h"

#ifndef HW_CHECK
#error "define HW_CHECK(cond, fmt, ...) before including hybrid_world.h"
#endif

#define MAX_SEQS 10
#define MAX_LEN 160
#define MAX_G 4

typedef struct ref_seq {
    int live;
    pkv_seq_id id;
    uint32_t len;
    int32_t tok[MAX_LEN];
    uint32_t holes[MAX_G]; // blocks the window rule released, per group
    int64_t state;         // running state value (same for every state group)
} ref_seq;

typedef struct world {
    uint64_t rng;
    const uint8_t *in; // fuzzing: the choices, one byte each (0 once used up)
    size_t in_len, in_pos;
    pkv_hybrid *h;
    pkv_hybrid_layout layout;
    uint32_t ng, max_seqs;
    pkv_kv_group groups[MAX_G];
    uint32_t bs[MAX_G];
    uint32_t cap[MAX_G];  // blocks (or slots) of the group's pool
    int32_t *mem[MAX_G];  // token groups: [cap * bs] token values; state: [cap] states
    int has_state;
    int cache;            // 1: the manager has a prefix cache
    uint32_t state_interval;
    ref_seq seqs[MAX_SEQS];
    int32_t next_tok;
} world;

static uint32_t rnd(world *w, uint32_t n) { // 0..n-1
    if (w->in) return (w->in_pos < w->in_len ? w->in[w->in_pos++] : 0) % n;
    w->rng ^= w->rng << 13;
    w->rng ^= w->rng >> 7;
    w->rng ^= w->rng << 17;
    return (uint32_t)(w->rng % n);
}

static int is_state(const world *w, uint32_t g) { return w->groups[g].kind == PKV_LAYER_STATE; }

// The window rule, written independently of the library: the first token a
// query at p still sees (0 in PAGED, which releases nothing).
static uint32_t first_live(const world *w, uint32_t g, uint32_t p) {
    const pkv_kv_group *k = &w->groups[g];
    if (w->layout == PKV_HYBRID_PAGED) return 0;
    if (k->kind == PKV_LAYER_SLIDING) return p + 1 > k->window ? p + 1 - k->window : 0;
    if (k->kind == PKV_LAYER_CHUNKED) return p - p % k->window;
    return 0;
}

// Blocks of token group g released when a sequence of length p is appended to.
static uint32_t dead_blocks(const world *w, uint32_t g, uint32_t p) {
    return is_state(w, g) ? 0 : first_live(w, g, p) / w->bs[g];
}

// Choose groups, layout and sizes (from the seed, or from w->in when set) and
// build the manager.
static void random_world(world *w, uint64_t seed) {
    w->rng = seed * 0x9E3779B97F4A7C15ull + 1;
    w->layout = (pkv_hybrid_layout)rnd(w, 3);
    w->ng = 1 + rnd(w, MAX_G);
    uint64_t sum_bpt = 0, states = 0;
    for (uint32_t g = 0; g < w->ng; g++) {
        pkv_kv_group *k = &w->groups[g];
        k->kind = (pkv_layer_kind)rnd(w, 5);
        if (g == 0 && k->kind == PKV_LAYER_STATE) k->kind = PKV_LAYER_SLIDING; // one token group
        k->num_layers = 1 + rnd(w, 3);
        if (k->kind == PKV_LAYER_STATE) {
            k->state_bytes = 1 + rnd(w, 64);
            states += k->num_layers * k->state_bytes;
        } else if (k->kind == PKV_LAYER_MLA) {
            k->latent_dim = 1 + rnd(w, 8);
            k->rope_dim = rnd(w, 4);
            sum_bpt += k->num_layers * (k->latent_dim + k->rope_dim);
        } else {
            k->num_kv_heads = 1 + rnd(w, 2);
            k->head_dim = 1 + rnd(w, 4);
            if (k->kind != PKV_LAYER_FULL) k->window = 1 + rnd(w, 12);
            sum_bpt += 2ull * k->num_layers * k->num_kv_heads * k->head_dim;
        }
        w->has_state |= k->kind == PKV_LAYER_STATE;
    }
    pkv_hybrid_params p;
    pkv_hybrid_params_default(&p);
    p.groups = w->groups;
    p.num_groups = w->ng;
    p.elem_bytes = 1;
    p.layout = w->layout;
    p.block_size = 1 + rnd(w, 5);
    if (w->layout == PKV_HYBRID_PARTITION)
        for (uint32_t g = 0; g < w->ng; g++)
            if (!is_state(w, g)) p.block_sizes[g] = rnd(w, 5);
    w->max_seqs = p.max_seqs = 4 + rnd(w, MAX_SEQS - 3);
    w->cache = (int)rnd(w, 2);
    p.prefix_cache_blocks = w->cache ? 1 + rnd(w, 40) : 0;
    p.prefix_hash = PKV_HASH_FNV1A_64;
    // Roughly 20..80 blocks of every token group, whatever the layout.
    p.budget_bytes = states * p.max_seqs + sum_bpt * 5 * (20 + rnd(w, 60));
    HW_CHECK(pkv_hybrid_create(&p, &w->h) == PKV_OK, "seed %llu", (unsigned long long)seed);
    w->state_interval = pkv_hybrid_state_interval(w->h);
    for (uint32_t g = 0; g < w->ng; g++) {
        pkv_hybrid_group_stats st;
        HW_CHECK(pkv_hybrid_group_info(w->h, g, NULL, &w->bs[g]) == PKV_OK, "");
        HW_CHECK(pkv_hybrid_group_stats_get(w->h, g, &st) == PKV_OK, "");
        w->cap[g] = (uint32_t)(st.capacity_bytes / st.page_bytes);
        w->mem[g] = calloc((size_t)w->cap[g] * (w->bs[g] ? w->bs[g] : 1), sizeof(int32_t));
        HW_CHECK(w->mem[g] != NULL, "");
    }
}

static uint32_t live_count(const world *w) {
    uint32_t n = 0;
    for (uint32_t i = 0; i < MAX_SEQS; i++) n += w->seqs[i].live;
    return n;
}

// Run every queued copy on the simulated memory. In PAGED one queue serves every
// token group (one page holds all their layers).
static void run_copies(world *w) {
    for (uint32_t g = 0; g < w->ng; g++) {
        pkv_block_copy c[256];
        uint32_t n;
        HW_CHECK(pkv_hybrid_take_copies(w->h, g, c, 256, &n) == PKV_OK, "");
        for (uint32_t i = 0; i < n; i++) {
            if (is_state(w, g)) {
                w->mem[g][c[i].dst] = w->mem[g][c[i].src];
                continue;
            }
            for (uint32_t o = 0; o < w->ng; o++) {
                if (is_state(w, o) || (o != g && w->layout != PKV_HYBRID_PAGED)) continue;
                const uint32_t b = w->bs[o];
                memcpy(w->mem[o] + (size_t)c[i].dst * b, w->mem[o] + (size_t)c[i].src * b,
                       b * sizeof(int32_t));
            }
        }
    }
}

// Everything the model knows, checked against the manager.
static void check_all(world *w) {
    HW_CHECK(pkv_hybrid_validate(w->h) == PKV_OK, "");
    HW_CHECK(pkv_hybrid_live_count(w->h) == live_count(w), "");
    uint64_t tokens[MAX_G] = {0}, held[MAX_G] = {0};
    uint8_t *seen[MAX_G]; // distinct blocks (slots) the live sequences hold
    for (uint32_t g = 0; g < w->ng; g++) {
        seen[g] = calloc(w->cap[g], 1);
        HW_CHECK(seen[g] != NULL, "");
    }
    for (uint32_t i = 0; i < MAX_SEQS; i++) {
        const ref_seq *s = &w->seqs[i];
        if (!s->live) continue;
        uint32_t len;
        HW_CHECK(pkv_hybrid_seq_length(w->h, s->id, &len) == PKV_OK, "");
        HW_CHECK(len == s->len, "");
        for (uint32_t g = 0; g < w->ng; g++) {
            if (is_state(w, g)) {
                int32_t slot;
                HW_CHECK(pkv_hybrid_state_slot(w->h, s->id, g, &slot) == PKV_OK, "");
                HW_CHECK(w->mem[g][slot] == (int32_t)s->state, "state of group %u", g);
                held[g] += !seen[g][slot];
                seen[g][slot] = 1;
                continue;
            }
            const pkv_block_id *t;
            uint32_t nb, first;
            const uint32_t b = w->bs[g];
            HW_CHECK(pkv_hybrid_block_table(w->h, s->id, g, &t, &nb, &first) == PKV_OK, "");
            HW_CHECK(nb == (s->len + b - 1) / b, "");
            HW_CHECK(first == s->holes[g], "group %u (kind %d, window %u, B %u): released", g, w->groups[g].kind, w->groups[g].window, b);
            for (uint32_t p = first * b; p < s->len; p++)
                HW_CHECK(w->mem[g][(size_t)t[p / b] * b + p % b] == s->tok[p], "group %u token %u", g, p);
            tokens[g] += s->len - first * b;
            for (uint32_t j = first; j < nb; j++) {
                held[g] += !seen[g][t[j]];
                seen[g][t[j]] = 1;
            }
        }
    }
    for (uint32_t g = 0; g < w->ng; g++) {
        pkv_hybrid_group_stats st;
        HW_CHECK(pkv_hybrid_group_stats_get(w->h, g, &st) == PKV_OK, "");
        HW_CHECK(st.tokens_held == tokens[g], "");
        // Queued copies pin blocks no table holds: only a drained queue compares.
        if (pkv_hybrid_pending_copies(w->h, g) == 0)
            HW_CHECK(st.blocks_held == held[g], "group %u: %llu blocks held, the tables hold %llu", g,
                     (unsigned long long)st.blocks_held, (unsigned long long)held[g]);
        free(seen[g]);
        HW_CHECK(st.used_bytes <= st.capacity_bytes, "");
    }
}

static ref_seq *pick_live(world *w) {
    uint32_t n = live_count(w);
    if (n == 0) return NULL;
    uint32_t k = rnd(w, n);
    for (uint32_t i = 0; i < MAX_SEQS; i++)
        if (w->seqs[i].live) {
            if (k == 0) return &w->seqs[i];
            k--;
        }
    return NULL;
}

static ref_seq *free_ref(world *w) {
    for (uint32_t i = 0; i < MAX_SEQS; i++)
        if (!w->seqs[i].live) return &w->seqs[i];
    return NULL;
}

static void op_create(world *w) {
    ref_seq *s = free_ref(w);
    if (!s) return;
    pkv_seq_id id;
    pkv_status st = pkv_hybrid_seq_create(w->h, &id);
    if (w->has_state && live_count(w) == w->max_seqs) {
        HW_CHECK(st == PKV_ERR_OUT_OF_BLOCKS, "no state slot left");
        return;
    }
    HW_CHECK(st == PKV_OK, "");
    memset(s, 0, sizeof *s);
    s->live = 1;
    s->id = id;
    for (uint32_t g = 0; g < w->ng; g++) // a fresh slot holds garbage: give it the state
        if (is_state(w, g)) {
            int32_t slot;
            pkv_hybrid_state_slot(w->h, id, g, &slot);
            w->mem[g][slot] = 0;
        }
}

static void op_fork(world *w) {
    ref_seq *p = pick_live(w), *c = free_ref(w);
    if (!p || !c) return;
    pkv_seq_id id;
    pkv_status st = pkv_hybrid_seq_fork(w->h, p->id, &id);
    if (w->has_state && live_count(w) == w->max_seqs) {
        HW_CHECK(st == PKV_ERR_OUT_OF_BLOCKS, "");
        return;
    }
    HW_CHECK(st == PKV_OK, "");
    *c = *p;
    c->id = id;
    run_copies(w);
}

// Of the groups sharing g's pool, what `field` of their stats adds up to: the
// prefix cache's blocks of every cache on the pool (PAGED: the one table's, which
// every token group repeats; SHARED_PAGE: each token group's own cache).
static uint64_t pool_cached(world *w, uint32_t g, int evictable_only) {
    uint64_t sum = 0;
    for (uint32_t o = 0; o < w->ng; o++) {
        if (o != g && (is_state(w, g) || is_state(w, o) || w->layout != PKV_HYBRID_SHARED_PAGE))
            continue;
        pkv_hybrid_group_stats st;
        HW_CHECK(pkv_hybrid_group_stats_get(w->h, o, &st) == PKV_OK, "");
        sum += evictable_only ? st.cached_evictable : st.cached_blocks;
    }
    return sum;
}

// Free blocks of each token group's pool (groups on one pool see the same), with
// the blocks only the prefix cache holds (an append evicts them).
static void free_blocks(world *w, uint64_t *out) {
    for (uint32_t g = 0; g < w->ng; g++) {
        pkv_hybrid_group_stats st;
        HW_CHECK(pkv_hybrid_group_stats_get(w->h, g, &st) == PKV_OK, "");
        out[g] = st.free_bytes / st.page_bytes + pool_cached(w, g, 1);
    }
}

static void op_append(world *w) {
    ref_seq *batch[3];
    pkv_seq_id ids[3];
    uint32_t counts[3], k = 1 + rnd(w, 3), total = 0;
    for (uint32_t i = 0; i < k; i++) {
        batch[i] = pick_live(w);
        if (!batch[i]) return;
        for (uint32_t j = 0; j < i; j++)
            if (batch[j] == batch[i] && rnd(w, 4)) return; // mostly avoid duplicates
        ids[i] = batch[i]->id;
        counts[i] = rnd(w, 8) ? 1 + rnd(w, 3) : rnd(w, 12);
        if (batch[i]->len + counts[i] > MAX_LEN) counts[i] = 0;
        total += counts[i];
    }
    for (uint32_t i = 0; i < k; i++)
        for (uint32_t j = 0; j < i; j++)
            if (batch[j] == batch[i]) {
                HW_CHECK(pkv_hybrid_append_batch(w->h, ids, counts, k, NULL) == PKV_ERR_INVALID_ARG, "a sequence twice in a batch");
                return;
            }
    uint32_t need[MAX_G];
    uint64_t before[MAX_G], after[MAX_G];
    HW_CHECK(pkv_hybrid_blocks_needed_batch(w->h, ids, counts, k, need) == PKV_OK, "");
    free_blocks(w, before);
    // What each pool loses at most: PAGED and SHARED_PAGE have one pool for every
    // token group (PAGED: one table, counted once), PARTITION one per group.
    uint64_t pool_need[MAX_G] = {0};
    int pool_rep[MAX_G] = {0}; // the group that stands for its pool
    int first_token = -1;
    for (uint32_t g = 0; g < w->ng; g++) {
        if (is_state(w, g)) continue;
        if (first_token < 0) first_token = (int)g;
        pool_rep[g] = w->layout == PKV_HYBRID_PARTITION || (int)g == first_token;
        if (w->layout == PKV_HYBRID_PARTITION) pool_need[g] = need[g];
        else if (w->layout == PKV_HYBRID_SHARED_PAGE) pool_need[first_token] += need[g];
        else if ((int)g == first_token) pool_need[g] = need[g];
    }
    int fits = 1;
    for (uint32_t g = 0; g < w->ng; g++)
        if (pool_need[g] > before[g]) fits = 0;
    int64_t slots[MAX_G * 3 * 12];
    pkv_status st = pkv_hybrid_append_batch(w->h, ids, counts, k, slots);
    free_blocks(w, after);
    if (st == PKV_ERR_OUT_OF_BLOCKS) {
        HW_CHECK(!fits, "refused although blocks_needed fits every pool");
        for (uint32_t g = 0; g < w->ng; g++) HW_CHECK(after[g] == before[g], "");
        return; // check_all confirms that no table changed
    }
    HW_CHECK(st == PKV_OK, "");
    // One group per pool: its figure is exact enough to decide. (A shared pool
    // adds figures clamped at 0, so a group that frees more than it takes can let
    // a batch through that the sum says would not fit.)
    if (w->layout != PKV_HYBRID_SHARED_PAGE)
        HW_CHECK(fits, "an append that blocks_needed said could not fit went through");
    for (uint32_t g = 0; g < w->ng; g++)
        if (pool_rep[g]) HW_CHECK(after[g] + pool_need[g] >= before[g], "drop <= need");
    run_copies(w);
    uint32_t at = 0;
    for (uint32_t i = 0; i < k; i++) {
        ref_seq *s = batch[i];
        for (uint32_t g = 0; g < w->ng; g++) {
            const uint32_t dead = dead_blocks(w, g, s->len);
            if (!is_state(w, g) && counts[i] && dead > s->holes[g]) s->holes[g] = dead;
        }
        for (uint32_t t = 0; t < counts[i]; t++) {
            const int32_t v = ++w->next_tok;
            s->tok[s->len] = v;
            for (uint32_t g = 0; g < w->ng; g++) {
                const int64_t slot = slots[(size_t)g * total + at];
                if (is_state(w, g)) {
                    HW_CHECK(slot == -1, "");
                    continue;
                }
                const pkv_block_id *tb;
                uint32_t nb, first;
                pkv_hybrid_block_table(w->h, s->id, g, &tb, &nb, &first);
                const uint32_t b = w->bs[g];
                HW_CHECK(slot == (int64_t)tb[s->len / b] * b + s->len % b, "slot mapping");
                w->mem[g][slot] = v;
            }
            s->state = (s->state * 31 + v) % 1000003;
            s->len++;
            at++;
        }
        for (uint32_t g = 0; g < w->ng; g++)
            if (is_state(w, g) && counts[i]) {
                int32_t slot;
                pkv_hybrid_state_slot(w->h, s->id, g, &slot);
                w->mem[g][slot] = (int32_t)s->state;
            }
    }
}

static void op_truncate(world *w) {
    ref_seq *s = pick_live(w);
    if (!s) return;
    const uint32_t len = rnd(w, s->len + 1);
    pkv_status want = PKV_OK;
    if (len < s->len && w->has_state) want = PKV_ERR_UNSUPPORTED;
    else if (len < s->len)
        for (uint32_t g = 0; g < w->ng; g++)
            if (!is_state(w, g) && s->holes[g] * w->bs[g] > first_live(w, g, len))
                want = PKV_ERR_RELEASED;
    pkv_status got = pkv_hybrid_seq_truncate(w->h, s->id, len);
    HW_CHECK(got == want, "truncate %u -> %u: %s, want %s (layout %s)", s->len, len, pkv_status_str(got), pkv_status_str(want), pkv_hybrid_layout_name(w->layout));
    if (want == PKV_OK) s->len = len;
    if (want == PKV_OK) run_copies(w);
}

// The state after tokens[0..n-1] as op_append computes it.
static int64_t state_after(const int32_t *tok, uint32_t n) {
    int64_t s = 0;
    for (uint32_t i = 0; i < n; i++) s = (s * 31 + tok[i]) % 1000003;
    return s;
}

// A new sequence from a live one's first n tokens: the longest cached prefix.
static void op_create_cached(world *w) {
    ref_seq *src = pick_live(w), *c = free_ref(w);
    if (!w->cache || !src || !c) return;
    const uint32_t n = rnd(w, 2) ? src->len : rnd(w, src->len + 1);
    pkv_hybrid_prefix_match m;
    HW_CHECK(pkv_hybrid_prefix_match_get(w->h, src->tok, n, &m) == PKV_OK, "");
    pkv_seq_id id;
    uint32_t hit = 0;
    pkv_status st = pkv_hybrid_seq_create_cached(w->h, src->tok, n, &id, &hit);
    if (w->has_state && live_count(w) == w->max_seqs) {
        HW_CHECK(st == PKV_ERR_OUT_OF_BLOCKS, "no state slot left");
        return;
    }
    HW_CHECK(st == PKV_OK, "create_cached of %u tokens: %s (layout %s)", n, pkv_status_str(st),
             pkv_hybrid_layout_name(w->layout));
    HW_CHECK(hit == m.cached_tokens, "the probe agrees");
    HW_CHECK(hit == 0 || hit < n, "the last prompt token is computed");
    const ref_seq *s = src; // c may alias nothing live; copy the prefix first
    memset(c->holes, 0, sizeof c->holes);
    memmove(c->tok, s->tok, hit * sizeof *c->tok);
    c->live = 1;
    c->id = id;
    c->len = hit;
    c->state = state_after(c->tok, hit);
    for (uint32_t g = 0; g < w->ng; g++) {
        if (is_state(w, g)) { // a fresh slot: zero; after a hit the cached state
            int32_t slot;     // fills it (a queued copy, or it is that state's slot)
            pkv_hybrid_state_slot(w->h, id, g, &slot);
            if (hit == 0) w->mem[g][slot] = 0;
            continue;
        }
        HW_CHECK(hit % w->bs[g] == 0, "a hit ends on a block boundary");
        c->holes[g] = dead_blocks(w, g, hit); // the tables look as after appending hit
    }
    run_copies(w);
}

// Offer a live sequence's first tokens to the cache, and its state at a boundary.
static void op_offer(world *w) {
    ref_seq *s = pick_live(w);
    if (!w->cache || !s) return;
    const uint32_t n = rnd(w, 2) ? s->len : rnd(w, s->len + 1);
    HW_CHECK(pkv_hybrid_cache_prefix(w->h, s->id, s->tok, n, NULL) == PKV_OK, "");
    const uint32_t S = w->state_interval;
    if (S && s->len && s->len % S == 0) {
        HW_CHECK(pkv_hybrid_cache_state(w->h, s->id, s->tok, s->len, NULL) == PKV_OK, "");
        run_copies(w);
    }
}

static void op_free(world *w) {
    ref_seq *s = pick_live(w);
    if (!s) return;
    HW_CHECK(pkv_hybrid_seq_free(w->h, s->id) == PKV_OK, "");
    HW_CHECK(pkv_hybrid_seq_free(w->h, s->id) == PKV_ERR_NOT_FOUND, "");
    s->live = 0;
}

// Build a world and run `ops` operations (fuzzing: until the input is used up),
// then free everything and check that every block came back.
static void run_world(const uint8_t *in, size_t in_len, uint64_t seed, uint32_t ops) {
    world w;
    memset(&w, 0, sizeof w);
    w.in = in;
    w.in_len = in_len;
    random_world(&w, seed);
    for (uint32_t i = 0; i < ops && (!in || w.in_pos < in_len); i++) {
        uint32_t r = rnd(&w, w.cache ? 24 : 20);
        if (r < 3) op_create(&w);
        else if (r < 13) op_append(&w);
        else if (r < 15) op_fork(&w);
        else if (r < 18) op_truncate(&w);
        else if (r < 20) op_free(&w);
        else if (r < 22) op_create_cached(&w);
        else op_offer(&w);
        check_all(&w);
    }
    for (uint32_t i = 0; i < MAX_SEQS; i++)
        if (w.seqs[i].live) HW_CHECK(pkv_hybrid_seq_free(w.h, w.seqs[i].id) == PKV_OK, "");
    for (uint32_t i = 0; i < MAX_SEQS; i++) w.seqs[i].live = 0;
    check_all(&w);
    for (uint32_t g = 0; g < w.ng; g++) { // no block lost: free, or the cache's
        pkv_hybrid_group_stats st;
        HW_CHECK(pkv_hybrid_group_stats_get(w.h, g, &st) == PKV_OK, "");
        HW_CHECK(st.free_bytes + pool_cached(&w, g, 0) * st.page_bytes == st.capacity_bytes,
                 "seed %llu group %u", (unsigned long long)seed, g);
        free(w.mem[g]);
    }
    pkv_hybrid_destroy(w.h);
}

#endif // PKV_TEST_HYBRID_WORLD_H

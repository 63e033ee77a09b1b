// SPDX-License-Identifier: MIT
// The decoder over a hybrid KV manager's per-group pools (pkv/model.h, hybrid
// store): for tiny (uniform), tiny-swa, tiny-mla and tiny-hybrid under every
// layout, several sequences of different lengths prefill, decode well past the
// sliding window and the chunk, fork and are replaced, and every step's logits
// must equal the paged uniform store's and, at checkpoints, a full recompute
// (pkv_model_forward_nocache). After every step every byte of the store that no
// live block uses is poisoned with NaN, so a step that read a released (or never
// written) block would give NaN or different logits; sliding groups must hold a
// bounded number of blocks while the sequences grow, and blocks their window
// released must be taken again by some sequence. Tolerance as test_model.c:
// 1e-4 absolute on O(1) logits.
#include <criterion/criterion.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "pkv/model.h"
#include "src/runtime/model/hybrid_store.h"

#define TOL 1e-4f
#define MAXS 8
#define MAXLEN 128
#define PAGED_BLOCK 16

typedef struct world {
    pkv_model *m;
    uint32_t V;
    pkv_kv_group groups[PKV_MAX_KV_GROUPS];
    uint32_t num_groups;
    pkv_hybrid *h;
    pkv_model_hybrid_store *hs;
    // the paged uniform store, the reference every step
    pkv_backend *be;
    pkv_pool *pool;
    pkv_seqset *set;
    pkv_cache *cache;
    pkv_model_state_store *pstates;
    uint32_t n;                        // sequences, live ones first... all live
    pkv_seq_id hid[MAXS], pid[MAXS];
    int32_t toks[MAXS][MAXLEN];
    uint32_t len[MAXS];
    uint64_t rng;
    float *lh, *lp, *ln;               // [MAXS][V] hybrid, paged, no-cache logits
    // Sliding groups: blocks held after the last step, blocks the window released
    // while their sequence lived, and how many of those a sequence took again.
    uint8_t *held[PKV_MAX_KV_GROUPS], *released[PKV_MAX_KV_GROUPS];
    uint64_t reused;
} world;

#define TRACKED_BLOCKS (1u << 16)

static int32_t rand_token(world *w) {
    w->rng = w->rng * 6364136223846793005ull + 1442695040888963407ull;
    return (int32_t)((w->rng >> 33) % w->V);
}

static void world_init(world *w, const char *preset, pkv_hybrid_layout layout) {
    memset(w, 0, sizeof *w);
    w->rng = 7;
    pkv_model_config c;
    cr_assert_eq(pkv_model_preset(preset, &c), PKV_OK);
    pkv_model_params mp = pkv_model_params_default();
    cr_assert_eq(pkv_model_create(&c, &mp, &w->m), PKV_OK, "%s", preset);
    w->V = c.vocab_size;
    cr_assert_eq(pkv_model_kv_groups(&c, w->groups, &w->num_groups), PKV_OK);
    pkv_hybrid_params hp;
    pkv_hybrid_params_default(&hp);
    hp.groups = w->groups;
    hp.num_groups = w->num_groups;
    hp.elem_bytes = sizeof(float);
    hp.layout = layout;
    hp.budget_bytes = 8u << 20;
    hp.block_size = 8;
    hp.max_seqs = MAXS;
    // Different block sizes per group where the layout takes them (LCM: pages of
    // different sizes in one large page).
    if (layout == PKV_HYBRID_PARTITION || layout == PKV_HYBRID_LCM)
        for (uint32_t g = 0; g < w->num_groups; g++)
            if (w->groups[g].kind != PKV_LAYER_STATE) hp.block_sizes[g] = g % 2 ? 16 : 8;
    cr_assert_eq(pkv_hybrid_create(&hp, &w->h), PKV_OK, "%s %s", preset,
                 pkv_hybrid_layout_name(layout));
    cr_assert_eq(pkv_model_hybrid_store_create(w->m, w->h, PKV_DTYPE_F32, &w->hs), PKV_OK);
    pkv_cache_params cp;
    cr_assert_eq(pkv_model_cache_params(w->m, PAGED_BLOCK, &cp), PKV_OK);
    cr_assert_eq(pkv_backend_create_host(&w->be), PKV_OK);
    cr_assert_eq(pkv_pool_create(256, &w->pool), PKV_OK);
    cr_assert_eq(pkv_seqset_create(w->pool, PAGED_BLOCK, &w->set), PKV_OK);
    cr_assert_eq(pkv_cache_create(&cp, w->pool, w->be, &w->cache), PKV_OK);
    cr_assert_eq(pkv_model_state_store_create(w->m, MAXS, &w->pstates), PKV_OK);
    cr_assert_eq(pkv_model_set_state_store(w->m, w->pstates), PKV_OK);
    w->lh = malloc((size_t)3 * MAXS * w->V * sizeof(float));
    cr_assert_not_null(w->lh);
    w->lp = w->lh + (size_t)MAXS * w->V;
    w->ln = w->lp + (size_t)MAXS * w->V;
    for (uint32_t g = 0; g < w->num_groups; g++) {
        if (w->groups[g].kind != PKV_LAYER_SLIDING) continue;
        w->held[g] = calloc(TRACKED_BLOCKS, 1);
        w->released[g] = calloc(TRACKED_BLOCKS, 1);
        cr_assert(w->held[g] && w->released[g]);
    }
}

static void world_fini(world *w) {
    cr_assert_eq(pkv_hybrid_validate(w->h), PKV_OK);
    pkv_model_set_state_store(w->m, NULL);
    pkv_model_state_store_destroy(w->pstates);
    pkv_cache_destroy(w->cache);
    pkv_seqset_destroy(w->set);
    pkv_pool_destroy(w->pool);
    pkv_backend_destroy(w->be);
    pkv_model_hybrid_store_destroy(w->hs);
    pkv_hybrid_destroy(w->h);
    pkv_model_destroy(w->m);
    free(w->lh);
    for (uint32_t g = 0; g < PKV_MAX_KV_GROUPS; g++) {
        free(w->held[g]);
        free(w->released[g]);
    }
}

// Sliding groups after a step in which no sequence was freed: a block held before
// and not now was released by the window; one of those held again was reused.
static void track_reuse(world *w) {
    for (uint32_t g = 0; g < w->num_groups; g++) {
        if (!w->held[g]) continue;
        uint8_t *now = calloc(TRACKED_BLOCKS, 1);
        cr_assert_not_null(now);
        for (uint32_t i = 0; i < w->n; i++) {
            const pkv_block_id *table = NULL;
            uint32_t nb = 0, first = 0;
            cr_assert_eq(pkv_hybrid_block_table(w->h, w->hid[i], g, &table, &nb, &first), PKV_OK);
            for (uint32_t j = first; j < nb; j++) {
                cr_assert_lt((uint32_t)table[j], TRACKED_BLOCKS);
                now[table[j]] = 1;
            }
        }
        for (uint32_t b = 0; b < TRACKED_BLOCKS; b++) {
            if (now[b] && !w->held[g][b] && w->released[g][b]) w->reused++, w->released[g][b] = 0;
            if (!now[b] && w->held[g][b]) w->released[g][b] = 1;
        }
        free(w->held[g]);
        w->held[g] = now;
    }
}

// NaN into every byte of the store that no live block of any group uses: the
// memory of released and never used blocks (LCM: also other groups' large pages).
static void poison_free_memory(world *w) {
    uint8_t *live[PKV_MAX_KV_GROUPS] = {0};
    float *data[PKV_MAX_KV_GROUPS] = {0};
    uint64_t bytes[PKV_MAX_KV_GROUPS] = {0};
    uint32_t regions = 0;
    while (regions < PKV_MAX_KV_GROUPS &&
           pkvi_hybrid_store_region(w->hs, regions, &data[regions], &bytes[regions]) == PKV_OK) {
        live[regions] = calloc(bytes[regions] / sizeof(float), 1);
        cr_assert_not_null(live[regions]);
        regions++;
    }
    cr_assert_gt(regions, 0);
    for (uint32_t i = 0; i < w->n; i++) {
        for (uint32_t g = 0; g < w->num_groups; g++) {
            if (w->groups[g].kind == PKV_LAYER_STATE) continue;
            const pkv_block_id *table = NULL;
            uint32_t nb = 0, first = 0;
            cr_assert_eq(pkv_hybrid_block_table(w->h, w->hid[i], g, &table, &nb, &first), PKV_OK);
            for (uint32_t j = first; j < nb; j++) {
                uint32_t r = 0;
                uint64_t off = 0, len = 0;
                cr_assert_eq(pkvi_hybrid_store_block(w->hs, g, (uint32_t)table[j], &r, &off, &len),
                             PKV_OK);
                memset(live[r] + off / sizeof(float), 1, len / sizeof(float));
            }
        }
    }
    for (uint32_t r = 0; r < regions; r++) {
        for (uint64_t f = 0; f < bytes[r] / sizeof(float); f++)
            if (!live[r][f]) data[r][f] = NAN;
        free(live[r]);
    }
}

static void check_close(const world *w, const float *a, const float *b, uint32_t S,
                        const char *what, uint32_t step) {
    for (uint64_t k = 0; k < (uint64_t)S * w->V; k++) {
        cr_assert(isfinite(a[k]), "%s step %u: logit %llu is not finite", what, step,
                  (unsigned long long)k);
        cr_assert(fabsf(a[k] - b[k]) <= TOL, "%s step %u: logit %llu %g vs %g", what, step,
                  (unsigned long long)k, a[k], b[k]);
    }
}

// Logits of every sequence, full recompute.
static void nocache(world *w, uint32_t S, const uint32_t *idx) {
    int32_t *packed = malloc((size_t)MAXS * MAXLEN * sizeof(int32_t));
    uint32_t lens[MAXS], at = 0;
    for (uint32_t k = 0; k < S; k++) {
        lens[k] = w->len[idx[k]];
        memcpy(packed + at, w->toks[idx[k]], lens[k] * sizeof(int32_t));
        at += lens[k];
    }
    cr_assert_eq(pkv_model_forward_nocache(w->m, S, lens, packed, w->ln, NULL), PKV_OK);
    free(packed);
}

// Prefill sequences idx[0..S-1] (already created, tokens set) in both stores.
static void prefill(world *w, uint32_t S, const uint32_t *idx, uint32_t step) {
    pkv_seq_id hs[MAXS], ps[MAXS];
    uint32_t counts[MAXS];
    int32_t packed[MAXS * MAXLEN];
    uint32_t at = 0;
    for (uint32_t k = 0; k < S; k++) {
        const uint32_t i = idx[k];
        hs[k] = w->hid[i];
        ps[k] = w->pid[i];
        counts[k] = w->len[i];
        cr_assert_eq(pkv_hybrid_append(w->h, hs[k], counts[k], NULL), PKV_OK);
        cr_assert_eq(pkv_seq_append(w->set, ps[k], counts[k], NULL), PKV_OK);
        memcpy(packed + at, w->toks[i], counts[k] * sizeof(int32_t));
        at += counts[k];
    }
    cr_assert_eq(pkv_model_prefill_hybrid(w->m, w->hs, S, hs, counts, packed, w->lh, NULL), PKV_OK,
                 "%s", pkv_model_last_error(w->m));
    cr_assert_eq(pkv_model_prefill_paged(w->m, w->cache, w->set, S, ps, counts, packed, w->lp, NULL),
                 PKV_OK);
    check_close(w, w->lh, w->lp, S, "prefill vs paged", step);
    nocache(w, S, idx);
    check_close(w, w->lh, w->ln, S, "prefill vs no-cache", step);
}

static void new_seq(world *w, uint32_t len) {
    const uint32_t i = w->n++;
    cr_assert_lt(i, MAXS);
    cr_assert_eq(pkv_hybrid_seq_create(w->h, &w->hid[i]), PKV_OK);
    cr_assert_eq(pkv_seq_create(w->set, &w->pid[i]), PKV_OK);
    w->len[i] = len;
    for (uint32_t j = 0; j < len; j++) w->toks[i][j] = rand_token(w);
}

static void fork_seq(world *w, uint32_t parent) {
    const uint32_t i = w->n++;
    cr_assert_lt(i, MAXS);
    cr_assert_eq(pkv_hybrid_seq_fork(w->h, w->hid[parent], &w->hid[i]), PKV_OK);
    cr_assert_eq(pkv_seq_fork(w->set, w->pid[parent], &w->pid[i]), PKV_OK);
    if (pkv_model_state_store_tokens(w->pstates, w->pid[parent]) > 0) // a model with states
        cr_assert_eq(pkv_model_state_store_fork(w->pstates, w->pid[parent], w->pid[i]), PKV_OK);
    w->len[i] = w->len[parent];
    memcpy(w->toks[i], w->toks[parent], w->len[i] * sizeof(int32_t));
}

static void free_seq(world *w, uint32_t i) {
    cr_assert_eq(pkv_hybrid_seq_free(w->h, w->hid[i]), PKV_OK);
    cr_assert_eq(pkv_seq_free(w->set, w->pid[i]), PKV_OK);
    pkv_model_state_store_release(w->pstates, w->pid[i]);
    w->n--;
    w->hid[i] = w->hid[w->n];
    w->pid[i] = w->pid[w->n];
    w->len[i] = w->len[w->n];
    memcpy(w->toks[i], w->toks[w->n], w->len[i] * sizeof(int32_t));
}

// One decode step of every sequence, compared with the paged store (and with the
// no-cache recompute when `full`).
static void decode(world *w, uint32_t step, int full) {
    pkv_seq_id hs[MAXS], ps[MAXS];
    uint32_t ones[MAXS], idx[MAXS];
    int32_t tok[MAXS];
    for (uint32_t i = 0; i < w->n; i++) {
        tok[i] = rand_token(w);
        w->toks[i][w->len[i]++] = tok[i];
        hs[i] = w->hid[i];
        ps[i] = w->pid[i];
        ones[i] = 1;
        idx[i] = i;
        cr_assert_eq(pkv_seq_append(w->set, ps[i], 1, NULL), PKV_OK);
    }
    cr_assert_eq(pkv_hybrid_append_batch(w->h, hs, ones, w->n, NULL), PKV_OK);
    cr_assert_eq(pkv_model_decode_hybrid(w->m, w->hs, w->n, hs, tok, w->lh, NULL), PKV_OK, "%s",
                 pkv_model_last_error(w->m));
    cr_assert_eq(pkv_model_decode_paged(w->m, w->cache, w->set, w->n, ps, tok, w->lp, NULL), PKV_OK);
    check_close(w, w->lh, w->lp, w->n, "decode vs paged", step);
    if (full) {
        nocache(w, w->n, idx);
        check_close(w, w->lh, w->ln, w->n, "decode vs no-cache", step);
    }
}

// A sliding group holds at most ceil(W / B) + 1 blocks per sequence while
// appending one token per step (pkv/hybrid.h), forks sharing theirs.
static void check_sliding_bounded(const world *w, pkv_hybrid_layout layout) {
    for (uint32_t g = 0; g < w->num_groups; g++) {
        if (w->groups[g].kind != PKV_LAYER_SLIDING || layout == PKV_HYBRID_PAGED) continue;
        pkv_hybrid_group_stats st;
        cr_assert_eq(pkv_hybrid_group_stats_get(w->h, g, &st), PKV_OK);
        const uint64_t per_seq = (w->groups[g].window + st.block_size - 1) / st.block_size + 1;
        cr_assert_leq(st.blocks_held, per_seq * w->n, "group %u holds %llu blocks", g,
                      (unsigned long long)st.blocks_held);
    }
}

static void run_scenario(const char *preset, pkv_hybrid_layout layout) {
    world w;
    world_init(&w, preset, layout);
    const uint32_t prompt[3] = {5, 23, 40}, idx3[3] = {0, 1, 2};
    for (int i = 0; i < 3; i++) new_seq(&w, prompt[i]);
    prefill(&w, 3, idx3, 0);
    poison_free_memory(&w);
    const uint32_t steps = 40;
    for (uint32_t step = 1; step <= steps; step++) {
        if (step == 6) fork_seq(&w, 1);   // shares blocks, CoW on the partly filled one
        if (step == 15) fork_seq(&w, 2);  // after its early blocks were released
        if (step == 22) {                 // a freed sequence's slot and blocks go to a new one
            free_seq(&w, 0);
            new_seq(&w, 12);
            const uint32_t last = w.n - 1;
            prefill(&w, 1, &last, step);
            poison_free_memory(&w);
        }
        decode(&w, step, step % 8 == 0 || step == steps);
        track_reuse(&w);
        if (step == 22) // the freed sequence's blocks were not the window's
            for (uint32_t g = 0; g < w.num_groups; g++)
                if (w.held[g]) memset(w.released[g], 0, TRACKED_BLOCKS);
        check_sliding_bounded(&w, layout);
        poison_free_memory(&w);
    }
    for (uint32_t g = 0; g < w.num_groups; g++) {
        pkv_hybrid_group_stats st;
        cr_assert_eq(pkv_hybrid_group_stats_get(w.h, g, &st), PKV_OK);
        const int windowed = w.groups[g].kind == PKV_LAYER_SLIDING ||
                             w.groups[g].kind == PKV_LAYER_CHUNKED;
        if (windowed && layout != PKV_HYBRID_PAGED)
            cr_assert_gt(st.blocks_released, 0, "group %u released nothing", g);
    }
    // A block the window released went to a sequence again (and was written there,
    // so a stale read of it would have seen another sequence's K/V).
    int sliding = 0;
    for (uint32_t g = 0; g < w.num_groups; g++) sliding |= w.groups[g].kind == PKV_LAYER_SLIDING;
    if (sliding && layout != PKV_HYBRID_PAGED)
        cr_assert_gt(w.reused, 0, "no released sliding block was reused");
    world_fini(&w);
}

#define LAYOUT_TESTS(name, preset)                                                                 \
    Test(model_hybrid, name##_paged, .timeout = 300) { run_scenario(preset, PKV_HYBRID_PAGED); }     \
    Test(model_hybrid, name##_partition, .timeout = 300) {                                         \
        run_scenario(preset, PKV_HYBRID_PARTITION);                                                \
    }                                                                                              \
    Test(model_hybrid, name##_shared_page, .timeout = 300) {                                       \
        run_scenario(preset, PKV_HYBRID_SHARED_PAGE);                                              \
    }                                                                                              \
    Test(model_hybrid, name##_lcm, .timeout = 300) { run_scenario(preset, PKV_HYBRID_LCM); }

LAYOUT_TESTS(tiny, "tiny")
LAYOUT_TESTS(tiny_swa, "tiny-swa")
LAYOUT_TESTS(tiny_mla, "tiny-mla")
LAYOUT_TESTS(tiny_hybrid, "tiny-hybrid")

static pkv_hybrid *make_hybrid(const char *preset, pkv_hybrid_layout layout, size_t elem_bytes) {
    pkv_model_config c;
    pkv_kv_group groups[PKV_MAX_KV_GROUPS];
    uint32_t n = 0;
    cr_assert_eq(pkv_model_preset(preset, &c), PKV_OK);
    cr_assert_eq(pkv_model_kv_groups(&c, groups, &n), PKV_OK);
    pkv_hybrid_params hp;
    pkv_hybrid_params_default(&hp);
    hp.groups = groups;
    hp.num_groups = n;
    hp.elem_bytes = elem_bytes;
    hp.layout = layout;
    hp.budget_bytes = 4u << 20;
    hp.max_seqs = 4;
    pkv_hybrid *h = NULL;
    cr_assert_eq(pkv_hybrid_create(&hp, &h), PKV_OK);
    return h;
}

Test(model_hybrid, create_checks_groups_dtype_and_sizes_the_pools) {
    pkv_model_config c;
    cr_assert_eq(pkv_model_preset("tiny-swa", &c), PKV_OK);
    pkv_model_params mp = pkv_model_params_default();
    pkv_model *m = NULL;
    cr_assert_eq(pkv_model_create(&c, &mp, &m), PKV_OK);
    pkv_model_hybrid_store *s = (pkv_model_hybrid_store *)1;
    // Another model's groups, another element size, another dtype.
    pkv_hybrid *other = make_hybrid("tiny-hybrid", PKV_HYBRID_PARTITION, 4);
    cr_assert_eq(pkv_model_hybrid_store_create(m, other, PKV_DTYPE_F32, &s), PKV_ERR_INVALID_ARG);
    cr_assert_null(s);
    pkv_hybrid_destroy(other);
    pkv_hybrid *half = make_hybrid("tiny-swa", PKV_HYBRID_PARTITION, 2);
    cr_assert_eq(pkv_model_hybrid_store_create(m, half, PKV_DTYPE_F32, &s), PKV_ERR_INVALID_ARG);
    cr_assert_eq(pkv_model_hybrid_store_create(m, half, PKV_DTYPE_F16, &s), PKV_ERR_UNSUPPORTED);
    pkv_hybrid_destroy(half);
    cr_assert_eq(pkv_model_hybrid_store_create(NULL, NULL, PKV_DTYPE_F32, &s), PKV_ERR_INVALID_ARG);
    // The store's bytes are the manager's pools: SHARED_PAGE's shared pool, the sum
    // of PARTITION's, PAGED's pages (each group's part, stats count per group), LCM's
    // large pages (within the budget).
    const pkv_hybrid_layout layouts[4] = {PKV_HYBRID_PAGED, PKV_HYBRID_PARTITION,
                                          PKV_HYBRID_SHARED_PAGE, PKV_HYBRID_LCM};
    for (int k = 0; k < 4; k++) {
        pkv_hybrid *h = make_hybrid("tiny-swa", layouts[k], 4);
        cr_assert_eq(pkv_model_hybrid_store_create(m, h, PKV_DTYPE_F32, &s), PKV_OK);
        pkv_hybrid_group_stats g0, g1;
        cr_assert_eq(pkv_hybrid_group_stats_get(h, 0, &g0), PKV_OK);
        cr_assert_eq(pkv_hybrid_group_stats_get(h, 1, &g1), PKV_OK);
        const uint64_t bytes = pkv_model_hybrid_store_bytes(s);
        if (layouts[k] == PKV_HYBRID_PARTITION || layouts[k] == PKV_HYBRID_PAGED)
            cr_assert_eq(bytes, g0.capacity_bytes + g1.capacity_bytes);
        else if (layouts[k] == PKV_HYBRID_LCM)
            cr_assert(bytes > 0 && bytes <= (4u << 20), "%llu", (unsigned long long)bytes);
        else
            cr_assert_eq(bytes, g0.capacity_bytes, "%s: %llu vs %llu",
                         pkv_hybrid_layout_name(layouts[k]), (unsigned long long)bytes,
                         (unsigned long long)g0.capacity_bytes);
        pkv_model_hybrid_store_destroy(s);
        pkv_hybrid_destroy(h);
    }
    pkv_model_hybrid_store_destroy(NULL);
    pkv_model_destroy(m);
}

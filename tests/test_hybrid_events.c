// SPDX-License-Identifier: MIT
// KV events of the hybrid KV manager's prefix cache (pkv/hybrid.h, "Prefix cache",
// Events): hand-computed BlockStored events per group on a full + sliding model
// with different block sizes (hashes from block_hash.h's pkv_hash_block, parents,
// token ids, block sizes, a windowed run after released blocks), BlockRemoved under
// pressure naming the group and hash, state snapshots as the state group's
// blocks, a full cache, overflow, the reset, bad parameters, and a randomized
// test that replays the event stream into a set of (group, hash) and checks it
// against the caches (pkv_hybrid_cached_block and the stats) after every
// operation, in every layout.
#include <criterion/criterion.h>
#include <stdlib.h>
#include <string.h>

#include "hybrid_fixture.h"
#include "pkv/hybrid.h"

// One group of one layer of 1 head x head_dim 1 (2 bytes per token at elem 1).
// Full (block 4) + sliding (window 4, block 2) under PARTITION: each pool gets half
// of the budget (bytes per token 2 each), so budget 2 x blocks x 8 bytes gives the
// full group `blocks` blocks and the sliding group twice as many.
static const pkv_kv_group swa[2] = {{.kind = PKV_LAYER_FULL, .num_layers = 1, .num_kv_heads = 1, .head_dim = 1},
                                    {.kind = PKV_LAYER_SLIDING, .num_layers = 1, .num_kv_heads = 1,
                                     .head_dim = 1, .window = 4}};

static pkv_hybrid_params swa_params(uint32_t full_blocks, uint32_t event_capacity) {
    pkv_hybrid_params p = hybrid_test_params(swa, 2, PKV_HYBRID_PARTITION, 2ull * full_blocks * 8, 16);
    p.block_sizes[0] = 4;
    p.block_sizes[1] = 2;
    p.prefix_cache_blocks = 64;
    p.event_capacity = event_capacity;
    p.medium = PKV_MEDIUM_CPU;
    return p;
}

static pkv_hybrid *create(const pkv_hybrid_params *p) {
    pkv_hybrid *h = NULL;
    cr_assert_eq(pkv_hybrid_create(p, &h), PKV_OK);
    return h;
}

static pkv_hasher *sha(void) {
    pkv_hasher *x = NULL;
    cr_assert_eq(pkv_hasher_create(PKV_HASH_SHA256, NULL, 0, &x), PKV_OK);
    return x;
}

// out[i] = the chained hash of block i of tokens at block size bs, i < nb.
static void chain_hashes(const pkv_hasher *x, const int32_t *tokens, uint32_t bs, uint32_t nb,
                         pkv_block_hash *out) {
    for (uint32_t i = 0; i < nb; i++)
        cr_assert_eq(pkv_hash_block(x, i ? &out[i - 1] : NULL, tokens + (size_t)i * bs, bs, NULL, 0,
                                    &out[i]),
                     PKV_OK);
}

static int32_t prompt[32];

// F[0..nf-1]: the prompt's chained hashes at block size 4 (the full group's), S[0..ns-1]
// at block size 2 (the sliding group's).
static void prompt_hashes(pkv_block_hash *F, uint32_t nf, pkv_block_hash *S, uint32_t ns) {
    pkv_hasher *x = sha();
    chain_hashes(x, prompt, 4, nf, F);
    chain_hashes(x, prompt, 2, ns, S);
    pkv_hasher_destroy(x);
}

static int same_hash(const pkv_block_hash *a, const pkv_block_hash *b) {
    return a->len == b->len && memcmp(a->bytes, b->bytes, a->len) == 0;
}

// e is a BlockStored of group g, block size bs, hashes want[0..nh-1], the token ids
// tokens[0..nh*bs-1], parent (NULL: none).
static void expect_stored(const pkv_kv_event *e, uint32_t g, uint32_t bs, const pkv_block_hash *want,
                          uint32_t nh, const int32_t *tokens, const pkv_block_hash *parent) {
    cr_assert_eq(e->kind, PKV_EVENT_BLOCK_STORED);
    cr_assert_eq(e->group, g);
    cr_assert_eq(e->block_size, bs);
    cr_assert_eq(e->medium, PKV_MEDIUM_CPU);
    cr_assert_eq(e->lora_id, PKV_NO_LORA);
    cr_assert_eq(e->num_hashes, nh, "group %u: %u hashes, want %u", g, e->num_hashes, nh);
    for (uint32_t i = 0; i < nh; i++) cr_assert(same_hash(&e->hashes[i], &want[i]), "group %u hash %u", g, i);
    cr_assert_eq(e->num_tokens, nh * bs);
    cr_assert_arr_eq(e->tokens, tokens, (size_t)nh * bs * sizeof *tokens);
    cr_assert_eq(e->has_parent, parent != NULL);
    if (parent) cr_assert(same_hash(&e->parent, parent));
}

static const pkv_kv_event *drain(pkv_hybrid *h, uint32_t *n) {
    const pkv_kv_event *ev = NULL;
    cr_assert_eq(pkv_hybrid_take_events(h, &ev, n), PKV_OK);
    return ev;
}

static int cached(const pkv_hybrid *h, uint32_t g, const pkv_block_hash *key) {
    return pkv_hybrid_cached_block(h, g, key, NULL) == PKV_OK;
}

// A new sequence of n tokens (not offered to the cache).
static pkv_seq_id appended(pkv_hybrid *h, uint32_t n) {
    pkv_seq_id id;
    cr_assert_eq(pkv_hybrid_seq_create(h, &id), PKV_OK);
    cr_assert_eq(pkv_hybrid_append(h, id, n, NULL), PKV_OK);
    return id;
}

static int32_t prompt[32] = {11, 12, 13, 14, 15, 16, 17, 18, 19, 20, 21, 22, 23, 24, 25, 26,
                             27, 28, 29, 30, 31, 32, 33, 34, 35, 36, 37, 38, 39, 40, 41, 42};

static void stored_per_group(pkv_hybrid_layout layout) {
    pkv_hybrid_params p = swa_params(16, 64);
    p.layout = layout;
    pkv_hybrid *h = create(&p);
    pkv_block_hash F[4], S[8];
    prompt_hashes(F, 4, S, 8);
    const pkv_seq_id a = appended(h, 10);
    uint32_t n, inserted;
    const pkv_kv_event *ev = drain(h, &n);
    cr_assert_eq(n, 0, "an append stores nothing");
    cr_assert_eq(pkv_hybrid_cache_prefix(h, a, prompt, 10, &inserted), PKV_OK);
    cr_assert_eq(inserted, 2 + 5);
    ev = drain(h, &n);
    cr_assert_eq(n, 2);
    expect_stored(&ev[0], 0, 4, F, 2, prompt, NULL);  // full: blocks 0-1, a chain from the root
    expect_stored(&ev[1], 1, 2, S, 5, prompt, NULL);  // sliding: blocks 0-4, none released yet
    ev = drain(h, &n);
    cr_assert_eq(n, 0, "a drain empties the buffer");

    // Offering the same prefix again refreshes: no event.
    cr_assert_eq(pkv_hybrid_cache_prefix(h, a, prompt, 10, NULL), PKV_OK);
    ev = drain(h, &n);
    cr_assert_eq(n, 0);

    // 6 more tokens: the sliding group releases blocks 0-2 (first live token 7 for
    // the query at 10); they stay cached. The new blocks continue each chain.
    cr_assert_eq(pkv_hybrid_append(h, a, 6, NULL), PKV_OK);
    cr_assert_eq(pkv_hybrid_cache_prefix(h, a, prompt, 16, NULL), PKV_OK);
    ev = drain(h, &n);
    cr_assert_eq(n, 2);
    expect_stored(&ev[0], 0, 4, F + 2, 2, prompt + 8, &F[1]);
    expect_stored(&ev[1], 1, 2, S + 5, 3, prompt + 10, &S[4]);
    cr_assert(cached(h, 1, &S[0]) && cached(h, 0, &F[3]));
    cr_assert_eq(pkv_hybrid_validate(h), PKV_OK);
    pkv_hybrid_destroy(h);
}

Test(hybrid_events, stored_per_group_with_hashes_parents_tokens_and_block_sizes) {
    stored_per_group(PKV_HYBRID_PARTITION);
}

Test(hybrid_events, stored_per_group_under_lcm) { stored_per_group(PKV_HYBRID_LCM); }

Test(hybrid_events, a_windowed_run_after_released_blocks_names_its_uncached_parent) {
    const pkv_hybrid_params p = swa_params(16, 64);
    pkv_hybrid *h = create(&p);
    pkv_block_hash F[3], S[6];
    prompt_hashes(F, 3, S, 6);
    const pkv_seq_id b = appended(h, 8);
    // The query at 8 sees 5..: sliding blocks 0-1 are released (never cached).
    cr_assert_eq(pkv_hybrid_append(h, b, 4, NULL), PKV_OK);
    uint32_t n;
    cr_assert_eq(pkv_hybrid_cache_prefix(h, b, prompt, 12, NULL), PKV_OK);
    const pkv_kv_event *ev = drain(h, &n);
    cr_assert_eq(n, 2);
    expect_stored(&ev[0], 0, 4, F, 3, prompt, NULL);
    expect_stored(&ev[1], 1, 2, S + 2, 4, prompt + 4, &S[1]);
    cr_assert(!cached(h, 1, &S[1]) && !cached(h, 1, &S[0]), "the parent is not cached");
    pkv_hybrid_destroy(h);
}

Test(hybrid_events, a_full_cache_reports_what_it_took) {
    pkv_hybrid_params p = swa_params(16, 64);
    p.prefix_cache_blocks = 3; // per group; the live sequence holds every entry
    pkv_hybrid *h = create(&p);
    pkv_block_hash F[4], S[8];
    prompt_hashes(F, 4, S, 8);
    const pkv_seq_id a = appended(h, 16);
    uint32_t n, inserted;
    cr_assert_eq(pkv_hybrid_cache_prefix(h, a, prompt, 16, &inserted), PKV_OK);
    cr_assert_eq(inserted, 6);
    const pkv_kv_event *ev = drain(h, &n);
    cr_assert_eq(n, 2);
    expect_stored(&ev[0], 0, 4, F, 3, prompt, NULL); // the chain stops at block 3
    expect_stored(&ev[1], 1, 2, S, 3, prompt, NULL); // blocks 3-7 find no room
    cr_assert(!cached(h, 0, &F[3]) && !cached(h, 1, &S[3]));
    pkv_hybrid_destroy(h);
}

Test(hybrid_events, eviction_under_pressure_removes_the_right_group_and_hash) {
    // Full pool: 4 blocks; sliding pool: 8.
    const pkv_hybrid_params p = swa_params(4, 64);
    pkv_hybrid *h = create(&p);
    pkv_block_hash F[2], S[4];
    prompt_hashes(F, 2, S, 4);
    uint32_t n;
    const pkv_seq_id a = appended(h, 8);
    cr_assert_eq(pkv_hybrid_cache_prefix(h, a, prompt, 8, NULL), PKV_OK);
    cr_assert_eq(pkv_hybrid_seq_free(h, a), PKV_OK);
    drain(h, &n);
    cr_assert_eq(n, 2);
    // 12 tokens: the full group needs 3 of its 4 blocks (2 cached: evict 1, the
    // leaf F1), the sliding group 6 of its 8 (4 cached: evict 2 of them).
    appended(h, 12);
    const pkv_kv_event *ev = drain(h, &n);
    cr_assert_eq(n, 3);
    uint32_t full_removed = 0, swa_removed = 0;
    for (uint32_t i = 0; i < n; i++) {
        cr_assert_eq(ev[i].kind, PKV_EVENT_BLOCK_REMOVED);
        cr_assert_eq(ev[i].num_hashes, 1);
        cr_assert_eq(ev[i].medium, PKV_MEDIUM_CPU);
        if (ev[i].group == 0) {
            cr_assert(same_hash(&ev[i].hashes[0], &F[1]), "the full group evicts its leaf");
            full_removed++;
            continue;
        }
        cr_assert_eq(ev[i].group, 1);
        int known = 0;
        for (uint32_t j = 0; j < 4; j++) known |= same_hash(&ev[i].hashes[0], &S[j]);
        cr_assert(known);
        cr_assert(!cached(h, 1, &ev[i].hashes[0]), "a removed hash is gone");
        swa_removed++;
    }
    cr_assert_eq(full_removed, 1);
    cr_assert_eq(swa_removed, 2);
    cr_assert(cached(h, 0, &F[0]) && !cached(h, 0, &F[1]));
    pkv_hybrid_group_stats gs;
    cr_assert_eq(pkv_hybrid_group_stats_get(h, 1, &gs), PKV_OK);
    cr_assert_eq(gs.cached_blocks, 2);
    cr_assert_eq(pkv_hybrid_validate(h), PKV_OK);
    pkv_hybrid_destroy(h);
}

Test(hybrid_events, a_full_buffer_ends_the_drain_with_an_overflow_record) {
    pkv_hybrid_params p = swa_params(16, 1);
    pkv_hybrid *h = create(&p);
    pkv_seq_id a;
    uint32_t n;
    cr_assert_eq(pkv_hybrid_seq_create(h, &a), PKV_OK);
    cr_assert_eq(pkv_hybrid_append(h, a, 8, NULL), PKV_OK);
    cr_assert_eq(pkv_hybrid_cache_prefix(h, a, prompt, 8, NULL), PKV_OK); // 2 events, room for 1
    const pkv_kv_event *ev = drain(h, &n);
    cr_assert_eq(n, 2);
    cr_assert_eq(ev[0].kind, PKV_EVENT_BLOCK_STORED);
    cr_assert_eq(ev[0].group, 0);
    cr_assert_eq(ev[1].kind, PKV_EVENT_OVERFLOW);
    cr_assert_eq(ev[1].dropped, 1);
    cr_assert_eq(pkv_hybrid_events_dropped(h), 1);
    // The next drain starts over.
    cr_assert_eq(pkv_hybrid_append(h, a, 8, NULL), PKV_OK);
    cr_assert_eq(pkv_hybrid_cache_prefix(h, a, prompt, 16, NULL), PKV_OK);
    ev = drain(h, &n);
    cr_assert_eq(n, 2);
    cr_assert_eq(ev[1].dropped, 1);
    cr_assert_eq(pkv_hybrid_events_dropped(h), 2);
    pkv_hybrid_destroy(h);

    // The payload bounds an event's hashes and token ids: 2 full blocks carry 8.
    p = swa_params(16, 8);
    p.event_payload = 6;
    h = create(&p);
    cr_assert_eq(pkv_hybrid_seq_create(h, &a), PKV_OK);
    cr_assert_eq(pkv_hybrid_append(h, a, 8, NULL), PKV_OK);
    cr_assert_eq(pkv_hybrid_cache_prefix(h, a, prompt, 8, NULL), PKV_OK);
    ev = drain(h, &n);
    cr_assert_eq(n, 1);
    cr_assert_eq(ev[0].kind, PKV_EVENT_OVERFLOW);
    cr_assert_eq(ev[0].dropped, 2);
    pkv_hybrid_destroy(h);
}

static uint32_t take_all_copies(pkv_hybrid *h) {
    pkv_block_copy c[64];
    uint32_t total = 0, k;
    for (uint32_t g = 0; g < pkv_hybrid_num_groups(h); g++) {
        cr_assert_eq(pkv_hybrid_take_copies(h, g, c, 64, &k), PKV_OK);
        total += k;
    }
    return total;
}

Test(hybrid_events, state_snapshots_are_the_state_groups_blocks) {
    const pkv_kv_group groups[2] = {hybrid_test_group(PKV_LAYER_FULL, 1, 0), hybrid_test_group(PKV_LAYER_STATE, 1, 0)};
    pkv_hybrid_params p = hybrid_test_params(groups, 2, PKV_HYBRID_PARTITION, 2 * 100 + 64 * 8, 4);
    p.max_seqs = 2;
    p.prefix_cache_blocks = 16;
    p.event_capacity = 16;
    p.medium = PKV_MEDIUM_CPU;
    pkv_hybrid *h = create(&p);
    cr_assert_eq(pkv_hybrid_state_interval(h), 4);
    pkv_hasher *x = sha();
    pkv_block_hash K[2];
    chain_hashes(x, prompt, 4, 2, K); // the state interval equals the full group's block size
    pkv_seq_id a, b;
    uint32_t n, snaps;
    cr_assert_eq(pkv_hybrid_seq_create(h, &a), PKV_OK);
    cr_assert_eq(pkv_hybrid_append(h, a, 4, NULL), PKV_OK);
    cr_assert_eq(pkv_hybrid_cache_state(h, a, prompt, 4, &snaps), PKV_OK);
    cr_assert_eq(snaps, 1);
    const pkv_kv_event *ev = drain(h, &n);
    cr_assert_eq(n, 1);
    expect_stored(&ev[0], 1, 4, K, 1, prompt, NULL);
    take_all_copies(h);
    cr_assert_eq(pkv_hybrid_append(h, a, 4, NULL), PKV_OK);
    // One slot is the sequence's, one the first snapshot's: the second snapshot
    // takes the first one's slot.
    cr_assert_eq(pkv_hybrid_cache_state(h, a, prompt, 8, &snaps), PKV_OK);
    cr_assert_eq(snaps, 1);
    ev = drain(h, &n);
    cr_assert_eq(n, 2);
    cr_assert_eq(ev[0].kind, PKV_EVENT_BLOCK_REMOVED);
    cr_assert_eq(ev[0].group, 1);
    cr_assert(same_hash(&ev[0].hashes[0], &K[0]));
    expect_stored(&ev[1], 1, 4, K + 1, 1, prompt + 4, &K[0]);
    take_all_copies(h);
    // A new sequence needs the snapshot's slot: it gives way, with its event.
    cr_assert_eq(pkv_hybrid_seq_create(h, &b), PKV_OK);
    ev = drain(h, &n);
    cr_assert_eq(n, 1);
    cr_assert_eq(ev[0].kind, PKV_EVENT_BLOCK_REMOVED);
    cr_assert_eq(ev[0].group, 1);
    cr_assert(same_hash(&ev[0].hashes[0], &K[1]));
    cr_assert(!cached(h, 1, &K[1]));
    cr_assert_eq(pkv_hybrid_validate(h), PKV_OK);
    pkv_hasher_destroy(x);
    pkv_hybrid_destroy(h);
}

Test(hybrid_events, reset_clears_every_group_once_nothing_holds_a_cached_block) {
    const pkv_hybrid_params p = swa_params(16, 64);
    pkv_hybrid *h = create(&p);
    pkv_seq_id a;
    uint32_t n;
    cr_assert_eq(pkv_hybrid_seq_create(h, &a), PKV_OK);
    cr_assert_eq(pkv_hybrid_append(h, a, 12, NULL), PKV_OK);
    cr_assert_eq(pkv_hybrid_cache_prefix(h, a, prompt, 12, NULL), PKV_OK);
    drain(h, &n);
    cr_assert_eq(pkv_hybrid_reset_prefix_cache(h), PKV_ERR_BUSY);
    drain(h, &n);
    cr_assert_eq(n, 0, "a refused reset emits nothing");
    pkv_hybrid_group_stats gs;
    cr_assert_eq(pkv_hybrid_group_stats_get(h, 0, &gs), PKV_OK);
    cr_assert_eq(gs.cached_blocks, 3, "a refused reset changes nothing");
    cr_assert_eq(pkv_hybrid_seq_free(h, a), PKV_OK);
    cr_assert_eq(pkv_hybrid_reset_prefix_cache(h), PKV_OK);
    const pkv_kv_event *ev = drain(h, &n);
    cr_assert_eq(n, 1);
    cr_assert_eq(ev[0].kind, PKV_EVENT_ALL_BLOCKS_CLEARED);
    cr_assert_eq(ev[0].medium, PKV_MEDIUM_CPU);
    for (uint32_t g = 0; g < 2; g++) {
        cr_assert_eq(pkv_hybrid_group_stats_get(h, g, &gs), PKV_OK);
        cr_assert_eq(gs.cached_blocks, 0);
        cr_assert_eq(gs.prefix_evictions, g == 0 ? 3 : 6);
        cr_assert_eq(gs.free_bytes, gs.capacity_bytes, "every block is free again");
    }
    cr_assert_eq(pkv_hybrid_validate(h), PKV_OK);
    pkv_hybrid_destroy(h);
}

Test(hybrid_events, parameters_and_arguments) {
    pkv_hybrid_params p = swa_params(16, 8);
    pkv_hybrid *h = NULL;
    p.prefix_cache_blocks = 0;
    cr_assert_eq(pkv_hybrid_create(&p, &h), PKV_ERR_INVALID_ARG, "events need the cache");
    cr_assert_null(h);
    p = swa_params(16, 8);
    p.medium = (pkv_medium)7;
    cr_assert_eq(pkv_hybrid_create(&p, &h), PKV_ERR_INVALID_ARG);
    pkv_hybrid_params_default(&p);
    cr_assert_eq(p.event_capacity, 0);
    cr_assert_eq(p.event_payload, 0);
    cr_assert_eq(p.medium, PKV_MEDIUM_GPU);

    // Events off: a cache works and the drain is empty.
    p = swa_params(16, 0);
    h = create(&p);
    pkv_seq_id a;
    uint32_t n = 9;
    const pkv_kv_event *ev;
    cr_assert_eq(pkv_hybrid_seq_create(h, &a), PKV_OK);
    cr_assert_eq(pkv_hybrid_append(h, a, 8, NULL), PKV_OK);
    cr_assert_eq(pkv_hybrid_cache_prefix(h, a, prompt, 8, NULL), PKV_OK);
    cr_assert_eq(pkv_hybrid_take_events(h, &ev, &n), PKV_OK);
    cr_assert_eq(n, 0);
    cr_assert_eq(pkv_hybrid_events_dropped(h), 0);
    cr_assert_eq(pkv_hybrid_take_events(NULL, &ev, &n), PKV_ERR_INVALID_ARG);
    cr_assert_eq(pkv_hybrid_take_events(h, NULL, &n), PKV_ERR_INVALID_ARG);
    cr_assert_eq(pkv_hybrid_take_events(h, &ev, NULL), PKV_ERR_INVALID_ARG);
    pkv_block_hash k = {0};
    cr_assert_eq(pkv_hybrid_cached_block(h, 2, &k, NULL), PKV_ERR_INVALID_ARG);
    cr_assert_eq(pkv_hybrid_cached_block(h, 0, NULL, NULL), PKV_ERR_INVALID_ARG);
    cr_assert_eq(pkv_hybrid_cached_block(h, 0, &k, NULL), PKV_ERR_NOT_FOUND);
    cr_assert_eq(pkv_hybrid_reset_prefix_cache(NULL), PKV_ERR_INVALID_ARG);
    pkv_hybrid_destroy(h);
    p = swa_params(16, 0);
    p.prefix_cache_blocks = 0;
    h = create(&p);
    cr_assert_eq(pkv_hybrid_reset_prefix_cache(h), PKV_ERR_UNSUPPORTED);
    cr_assert_eq(pkv_hybrid_cached_block(h, 0, &k, NULL), PKV_ERR_UNSUPPORTED);
    pkv_hybrid_destroy(h);
}

// ---- randomized: the event stream replayed into a set equals the caches ----

#define REF_CAP 4096
typedef struct ref_set {
    uint32_t group[REF_CAP];
    pkv_block_hash hash[REF_CAP];
    uint32_t n;
} ref_set;

static int32_t ref_find(const ref_set *r, uint32_t g, const pkv_block_hash *k) {
    for (uint32_t i = 0; i < r->n; i++)
        if (r->group[i] == g && same_hash(&r->hash[i], k)) return (int32_t)i;
    return -1;
}

static uint64_t seen_stored, seen_removed, seen_cleared, seen_parents;

// Apply a drain: a stored hash must be new and chain from its parent over its
// tokens; a removed one must be there.
static void replay(pkv_hybrid *h, const pkv_hasher *x, ref_set *r) {
    uint32_t n;
    const pkv_kv_event *ev = drain(h, &n);
    for (uint32_t i = 0; i < n; i++) {
        const pkv_kv_event *e = &ev[i];
        cr_assert_neq(e->kind, PKV_EVENT_OVERFLOW, "the buffer is large enough");
        if (e->kind == PKV_EVENT_ALL_BLOCKS_CLEARED) {
            r->n = 0;
            seen_cleared++;
            continue;
        }
        cr_assert_eq(e->num_hashes, e->kind == PKV_EVENT_BLOCK_REMOVED ? 1 : e->num_hashes);
        if (e->kind == PKV_EVENT_BLOCK_REMOVED) {
            const int32_t at = ref_find(r, e->group, &e->hashes[0]);
            cr_assert(at >= 0, "removed (group %u) a hash never stored", e->group);
            r->group[at] = r->group[r->n - 1];
            r->hash[at] = r->hash[--r->n];
            seen_removed++;
            continue;
        }
        uint32_t bs = 0;
        cr_assert_eq(pkv_hybrid_group_info(h, e->group, NULL, &bs), PKV_OK);
        if (bs == 0) bs = pkv_hybrid_state_interval(h);
        cr_assert_eq(e->block_size, bs);
        cr_assert_eq(e->num_tokens, e->num_hashes * bs);
        seen_parents += e->has_parent != 0;
        for (uint32_t j = 0; j < e->num_hashes; j++) {
            const pkv_block_hash *parent = j ? &e->hashes[j - 1] : e->has_parent ? &e->parent : NULL;
            pkv_block_hash want;
            cr_assert_eq(pkv_hash_block(x, parent, e->tokens + (size_t)j * bs, bs, NULL, 0, &want), PKV_OK);
            cr_assert(same_hash(&want, &e->hashes[j]), "group %u: a stored hash is its tokens' chain", e->group);
            cr_assert(ref_find(r, e->group, &e->hashes[j]) < 0, "group %u stored a hash twice", e->group);
            cr_assert_lt(r->n, REF_CAP);
            r->group[r->n] = e->group;
            r->hash[r->n++] = e->hashes[j];
            seen_stored++;
        }
    }
}

// The set equals the caches: every member is cached, and each group has as many
// entries as members. A PAGED token group other than the first shows the one
// table's cache, which events name by the first token group: it is skipped.
static void check_set(const pkv_hybrid *h, const ref_set *r) {
    uint64_t count[PKV_MAX_KV_GROUPS] = {0};
    for (uint32_t i = 0; i < r->n; i++) {
        cr_assert(cached(h, r->group[i], &r->hash[i]), "group %u: an event says cached, the cache says not",
                  r->group[i]);
        count[r->group[i]]++;
    }
    int first_token = 1;
    for (uint32_t g = 0; g < pkv_hybrid_num_groups(h); g++) {
        pkv_kv_group desc;
        pkv_hybrid_group_stats gs;
        cr_assert_eq(pkv_hybrid_group_info(h, g, &desc, NULL), PKV_OK);
        cr_assert_eq(pkv_hybrid_group_stats_get(h, g, &gs), PKV_OK);
        const int token = desc.kind != PKV_LAYER_STATE;
        if (token && !first_token && pkv_hybrid_get_layout(h) == PKV_HYBRID_PAGED) {
            cr_assert_eq(count[g], 0, "events name the PAGED table by its first group");
            continue;
        }
        if (token) first_token = 0;
        cr_assert_eq(gs.cached_blocks, count[g], "group %u: %llu cached, %llu reported", g,
                     (unsigned long long)gs.cached_blocks, (unsigned long long)count[g]);
    }
}

typedef struct rworld {
    pkv_seq_id id[8];
    int32_t tok[8][64];
    uint32_t len[8];
    int live[8];
    uint64_t s;
} rworld;

static uint32_t rnd(rworld *w, uint32_t n) {
    w->s = w->s * 6364136223846793005ull + 1442695040888963407ull;
    return (uint32_t)(w->s >> 33) % n;
}

static void run_random(const pkv_kv_group *groups, uint32_t ng, pkv_hybrid_layout layout, uint64_t seed) {
    pkv_hybrid_params p = hybrid_test_params(groups, ng, layout, 12 * 100 + 48 * 8 * ng,
                                             layout == PKV_HYBRID_PAGED || layout == PKV_HYBRID_SHARED_PAGE ? 2 : 4);
    if (layout == PKV_HYBRID_PARTITION || layout == PKV_HYBRID_LCM)
        for (uint32_t g = 0; g < ng; g++)
            if (groups[g].kind != PKV_LAYER_STATE) p.block_sizes[g] = g % 2 ? 2 : 4;
    p.max_seqs = 12;
    p.prefix_cache_blocks = 24;
    p.event_capacity = 4096;
    p.event_payload = 1 << 16;
    pkv_hybrid *h = create(&p);
    pkv_hasher *x = sha();
    const uint32_t S = pkv_hybrid_state_interval(h);
    static ref_set r;
    r.n = 0;
    rworld w = {.s = seed};
    for (int step = 0; step < 400; step++) {
        const uint32_t s = rnd(&w, 8), op = rnd(&w, 10);
        if (!w.live[s] && op < 8) { // a new sequence: one of 3 prompt families
            const uint32_t fam = rnd(&w, 3);
            for (uint32_t i = 0; i < 64; i++) w.tok[s][i] = i < 20 ? (int32_t)(fam * 100 + i) : (int32_t)rnd(&w, 4);
            const uint32_t n = 8 + rnd(&w, 24);
            uint32_t hit = 0;
            pkv_status st = rnd(&w, 2) ? pkv_hybrid_seq_create_cached(h, w.tok[s], n, &w.id[s], &hit)
                                       : pkv_hybrid_seq_create(h, &w.id[s]);
            if (st == PKV_OK) w.live[s] = 1, w.len[s] = hit;
        } else if (w.live[s] && op < 5) { // append, then offer what is computed
            const uint32_t add = 1 + rnd(&w, 12);
            if (w.len[s] + add <= 64 && pkv_hybrid_append(h, w.id[s], add, NULL) == PKV_OK) {
                w.len[s] += add;
                take_all_copies(h);
                if (rnd(&w, 3)) cr_assert_eq(pkv_hybrid_cache_prefix(h, w.id[s], w.tok[s], w.len[s], NULL), PKV_OK);
                if (S && w.len[s] % S == 0)
                    cr_assert_eq(pkv_hybrid_cache_state(h, w.id[s], w.tok[s], w.len[s], NULL), PKV_OK);
            }
        } else if (w.live[s] && op < 9) {
            cr_assert_eq(pkv_hybrid_seq_free(h, w.id[s]), PKV_OK);
            w.live[s] = 0;
        } else if (op == 9 && rnd(&w, 8) == 0) {
            const pkv_status st = pkv_hybrid_reset_prefix_cache(h);
            cr_assert(st == PKV_OK || st == PKV_ERR_BUSY);
        }
        take_all_copies(h);
        replay(h, x, &r);
        check_set(h, &r);
        cr_assert_eq(pkv_hybrid_validate(h), PKV_OK);
    }
    pkv_hasher_destroy(x);
    pkv_hybrid_destroy(h);
}

Test(hybrid_events, randomized_event_stream_replays_into_the_caches_contents, .timeout = 300) {
    const pkv_kv_group fs[2] = {hybrid_test_group(PKV_LAYER_FULL, 1, 0), hybrid_test_group(PKV_LAYER_SLIDING, 1, 4)};
    const pkv_kv_group fcs[3] = {hybrid_test_group(PKV_LAYER_FULL, 1, 0), hybrid_test_group(PKV_LAYER_SLIDING, 1, 6),
                                 hybrid_test_group(PKV_LAYER_STATE, 1, 0)};
    const pkv_kv_group ch[2] = {hybrid_test_group(PKV_LAYER_CHUNKED, 1, 8), hybrid_test_group(PKV_LAYER_FULL, 1, 0)};
    seen_stored = seen_removed = seen_cleared = seen_parents = 0;
    for (uint64_t seed = 1; seed <= 3; seed++) {
        for (int layout = PKV_HYBRID_PAGED; layout <= PKV_HYBRID_LCM; layout++) {
            run_random(fs, 2, (pkv_hybrid_layout)layout, seed);
            run_random(fcs, 3, (pkv_hybrid_layout)layout, seed + 10);
            run_random(ch, 2, (pkv_hybrid_layout)layout, seed + 20);
        }
    }
    // The streams exercised every kind of event.
    cr_assert_gt(seen_stored, 100);
    cr_assert_gt(seen_removed, 20);
    cr_assert_gt(seen_cleared, 0);
    cr_assert_gt(seen_parents, 10);
}

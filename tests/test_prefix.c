// SPDX-License-Identifier: MIT
// Prefix cache: hits share blocks, the chain hash and token check refuse wrong
// matches, eviction is LRU and only touches blocks the cache alone holds, and a
// randomized run reads every sequence's tokens back through its blocks.
#include <criterion/criterion.h>
#include <stdlib.h>
#include <string.h>

#include "pkv/prefix.h"

#define B 4u

static pkv_pool *pool;
static pkv_seqset *set;
static pkv_prefix_cache *pc;

static void setup(void) {
    cr_assert_eq(pkv_pool_create(32, &pool), PKV_OK);
    cr_assert_eq(pkv_seqset_create(pool, B, &set), PKV_OK);
    cr_assert_eq(pkv_prefix_cache_create(pool, B, 16, &pc), PKV_OK);
    cr_assert_eq(pkv_prefix_cache_attach(pc, set), PKV_OK);
}

static void teardown(void) {
    cr_assert_eq(pkv_prefix_cache_validate(pc), PKV_OK);
    pkv_seqset_destroy(set); // attached sets go before their cache
    pkv_prefix_cache_destroy(pc);
    cr_assert_eq(pkv_pool_free_count(pool), 32, "blocks lost");
    cr_assert_eq(pkv_pool_validate(pool), PKV_OK);
    pkv_pool_destroy(pool);
}

TestSuite(prefix, .init = setup, .fini = teardown);

// A prompt: create through the cache, then append what was not cached.
static pkv_seq_id prompt(const int32_t *tokens, uint32_t n, uint32_t *cached) {
    pkv_seq_id id;
    cr_assert_eq(pkv_seq_create_cached(set, pc, tokens, n, &id, cached), PKV_OK);
    cr_assert_eq(pkv_seq_append(set, id, n - *cached, NULL), PKV_OK);
    return id;
}

static const pkv_block_id *table_of(pkv_seq_id id) {
    const pkv_block_id *t;
    uint32_t n;
    cr_assert_eq(pkv_seq_block_table(set, id, &t, &n), PKV_OK);
    return t;
}

Test(prefix, hit_shares_whole_blocks) {
    int32_t a[14] = {1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14};
    uint32_t cached, inserted;
    pkv_seq_id sa = prompt(a, 14, &cached);
    cr_assert_eq(cached, 0);
    cr_assert_eq(pkv_prefix_cache_insert(pc, set, sa, a, 14, &inserted), PKV_OK);
    cr_assert_eq(inserted, 3, "three full blocks, the partial one is not cached");
    int32_t b[10] = {1, 2, 3, 4, 5, 6, 7, 8, 99, 98};
    pkv_seq_id sb = prompt(b, 10, &cached);
    cr_assert_eq(cached, 2 * B);
    cr_assert_eq(table_of(sb)[0], table_of(sa)[0]);
    cr_assert_eq(table_of(sb)[1], table_of(sa)[1]);
    cr_assert_neq(table_of(sb)[2], table_of(sa)[2]);
    cr_assert_eq(pkv_pool_refcount(pool, table_of(sa)[0]), 3, "A, B and the cache");
    pkv_prefix_stats st;
    cr_assert_eq(pkv_prefix_cache_get_stats(pc, &st), PKV_OK);
    cr_assert_eq(st.entries, 3);
    cr_assert_eq(st.hits, 2);
    cr_assert_eq(st.evictable, 0);
    // Inserting B adds only its new full block (2); the shared ones are refreshed.
    cr_assert_eq(pkv_prefix_cache_insert(pc, set, sb, b, 10, &inserted), PKV_OK);
    cr_assert_eq(inserted, 0, "b's block 2 is partial: 10 tokens = 2 full blocks");
}

Test(prefix, last_prompt_token_is_never_cached) {
    int32_t a[12] = {1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12};
    uint32_t cached;
    pkv_seq_id sa = prompt(a, 12, &cached);
    cr_assert_eq(pkv_prefix_cache_insert(pc, set, sa, a, 12, NULL), PKV_OK);
    pkv_seq_id sb = prompt(a, 12, &cached);
    cr_assert_eq(cached, 2 * B, "3 blocks cached, but the last token must be computed");
    pkv_seq_id sc = prompt(a, 1, &cached);
    cr_assert_eq(cached, 0);
    (void)sb;
    (void)sc;
}

Test(prefix, chain_and_tokens_must_match) {
    int32_t a[9] = {1, 2, 3, 4, 5, 6, 7, 8, 0};
    int32_t b[9] = {9, 2, 3, 4, 5, 6, 7, 8, 0}; // same block 1, different block 0
    uint32_t cached;
    pkv_seq_id sa = prompt(a, 9, &cached);
    cr_assert_eq(pkv_prefix_cache_insert(pc, set, sa, a, 8, NULL), PKV_OK);
    pkv_seq_id sb = prompt(b, 9, &cached);
    cr_assert_eq(cached, 0, "block 1 alone must not match under another prefix");
    (void)sb;
}

Test(prefix, eviction_is_lru_and_spares_blocks_in_use) {
    int32_t p[3][5] = {{1, 1, 1, 1, 0}, {2, 2, 2, 2, 0}, {3, 3, 3, 3, 0}};
    pkv_seq_id s[3];
    uint32_t cached;
    for (int i = 0; i < 3; i++) {
        s[i] = prompt(p[i], 5, &cached);
        cr_assert_eq(pkv_prefix_cache_insert(pc, set, s[i], p[i], 4, NULL), PKV_OK);
    }
    pkv_block_id first[3];
    for (int i = 0; i < 3; i++) first[i] = table_of(s[i])[0];
    for (int i = 0; i < 3; i++) cr_assert_eq(pkv_seq_free(set, s[i]), PKV_OK);
    cr_assert_eq(pkv_pool_free_count(pool), 32 - 3, "cached blocks stay out of the free list");
    // Use prompt 0 again: a hit, and it becomes the most recently used.
    pkv_seq_id again = prompt(p[0], 5, &cached);
    cr_assert_eq(cached, B);
    cr_assert_eq(pkv_seq_free(set, again), PKV_OK);
    // Reclaim one block: the oldest unused is prompt 1's.
    cr_assert_eq(pkv_prefix_cache_reclaim(pc, 32 - 2), PKV_OK);
    cr_assert_eq(pkv_pool_refcount(pool, first[1]), 0, "LRU entry evicted");
    cr_assert_eq(pkv_pool_refcount(pool, first[0]), 1);
    cr_assert_eq(pkv_pool_refcount(pool, first[2]), 1);
    // A block in use is never evicted.
    pkv_seq_id hold = prompt(p[2], 5, &cached);
    (void)hold; // freed with the set at teardown
    cr_assert_eq(cached, B);
    uint32_t used_by_hold = 2; // one cached block shared, one fresh for the 5th token
    cr_assert_eq(pkv_prefix_cache_reclaim(pc, 32), PKV_ERR_OUT_OF_BLOCKS);
    cr_assert_eq(pkv_pool_free_count(pool), 32 - used_by_hold);
    cr_assert_eq(pkv_pool_refcount(pool, first[2]), 2);
    pkv_prefix_stats st;
    cr_assert_eq(pkv_prefix_cache_get_stats(pc, &st), PKV_OK);
    cr_assert_eq(st.evictions, 2);
    cr_assert_eq(st.entries, 1);
}

// Reclaiming one block of a cached 3-block prompt takes the chain's last block:
// the first two stay cached and still hit.
Test(prefix, chains_are_evicted_leaf_first) {
    int32_t a[13] = {1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13};
    uint32_t cached;
    pkv_seq_id sa = prompt(a, 13, &cached);
    cr_assert_eq(pkv_prefix_cache_insert(pc, set, sa, a, 12, NULL), PKV_OK);
    pkv_block_id blocks[3] = {table_of(sa)[0], table_of(sa)[1], table_of(sa)[2]};
    cr_assert_eq(pkv_seq_free(set, sa), PKV_OK);
    cr_assert_eq(pkv_prefix_cache_reclaim(pc, pkv_pool_free_count(pool) + 1), PKV_OK);
    cr_assert_eq(pkv_pool_refcount(pool, blocks[2]), 0, "the leaf went first");
    cr_assert_eq(pkv_pool_refcount(pool, blocks[0]), 1);
    cr_assert_eq(pkv_pool_refcount(pool, blocks[1]), 1);
    pkv_seq_id again = prompt(a, 13, &cached);
    cr_assert_eq(cached, 2 * B, "the rest of the chain still hits");
    cr_assert_eq(pkv_seq_free(set, again), PKV_OK);
    cr_assert_eq(pkv_prefix_cache_reclaim(pc, 32), PKV_OK, "and it can all go, leaf first");
}

Test(prefix, full_cache_makes_room_or_stops) {
    pkv_prefix_cache *small;
    pkv_seqset *set2;
    cr_assert_eq(pkv_prefix_cache_create(pool, B, 2, &small), PKV_OK);
    cr_assert_eq(pkv_seqset_create(pool, B, &set2), PKV_OK);
    cr_assert_eq(pkv_prefix_cache_attach(small, set2), PKV_OK);
    cr_assert_eq(pkv_prefix_cache_insert(small, set, 0, NULL, 0, NULL), PKV_ERR_INVALID_ARG,
                 "set is attached to another cache");
    int32_t a[12] = {1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12};
    pkv_seq_id sa;
    cr_assert_eq(pkv_seq_create(set2, &sa), PKV_OK);
    cr_assert_eq(pkv_seq_append(set2, sa, 12, NULL), PKV_OK);
    uint32_t inserted;
    cr_assert_eq(pkv_prefix_cache_insert(small, set2, sa, a, 12, &inserted), PKV_OK);
    cr_assert_eq(inserted, 2, "room for two; both in use, nothing to evict");
    cr_assert_eq(pkv_prefix_cache_validate(small), PKV_OK);
    cr_assert_eq(pkv_seq_free(set2, sa), PKV_OK);
    int32_t b[8] = {7, 7, 7, 7, 8, 8, 8, 8};
    pkv_seq_id sb;
    cr_assert_eq(pkv_seq_create(set2, &sb), PKV_OK);
    cr_assert_eq(pkv_seq_append(set2, sb, 8, NULL), PKV_OK);
    cr_assert_eq(pkv_prefix_cache_insert(small, set2, sb, b, 8, &inserted), PKV_OK);
    cr_assert_eq(inserted, 2, "the unused entries made room");
    cr_assert_eq(pkv_prefix_cache_validate(small), PKV_OK);
    cr_assert_eq(pkv_seq_free(set2, sb), PKV_OK);
    pkv_seqset_destroy(set2);
    pkv_prefix_cache_destroy(small);
}

Test(prefix, bad_args) {
    pkv_prefix_cache *c = (pkv_prefix_cache *)1;
    cr_assert_eq(pkv_prefix_cache_create(NULL, B, 4, &c), PKV_ERR_INVALID_ARG);
    cr_assert_null(c);
    cr_assert_eq(pkv_prefix_cache_create(pool, 0, 4, &c), PKV_ERR_INVALID_ARG);
    cr_assert_eq(pkv_prefix_cache_create(pool, B, 0, &c), PKV_ERR_INVALID_ARG);
    pkv_seqset *other;
    cr_assert_eq(pkv_seqset_create(pool, 2 * B, &other), PKV_OK);
    pkv_seq_id id;
    uint32_t cached;
    int32_t t[4] = {0};
    cr_assert_eq(pkv_prefix_cache_attach(pc, other), PKV_ERR_INVALID_ARG, "block size differs");
    cr_assert_eq(pkv_seq_create_cached(other, pc, t, 4, &id, &cached), PKV_ERR_INVALID_ARG);
    pkv_seqset_destroy(other);
    cr_assert_eq(pkv_seqset_create(pool, B, &other), PKV_OK);
    cr_assert_eq(pkv_seq_create_cached(other, pc, t, 4, &id, &cached), PKV_ERR_INVALID_ARG,
                 "not attached");
    pkv_seqset_destroy(other);
    cr_assert_eq(pkv_seq_create_cached(set, pc, NULL, 4, &id, &cached), PKV_ERR_INVALID_ARG);
    cr_assert_eq(pkv_prefix_cache_insert(pc, set, 1234, t, 4, NULL), PKV_ERR_NOT_FOUND);
    cr_assert_eq(pkv_seq_create_cached(set, pc, t, 4, &id, &cached), PKV_OK);
    cr_assert_eq(pkv_prefix_cache_insert(pc, set, id, t, 4, NULL), PKV_ERR_INVALID_ARG,
                 "more tokens than the sequence has");
    cr_assert_eq(pkv_seq_free(set, id), PKV_OK);
    cr_assert_eq(pkv_prefix_cache_reclaim(NULL, 1), PKV_ERR_INVALID_ARG);
    cr_assert_eq(pkv_prefix_cache_get_stats(pc, NULL), PKV_ERR_INVALID_ARG);
    pkv_prefix_cache_destroy(NULL);
}

// Random prompts built from a few shared prefixes; each token's "K/V" is its id
// written into a simulated cache. Wrong sharing would read back wrong ids.
Test(prefix, randomized_reads_back_every_token, .timeout = 120) {
    enum { POOL = 64, SEQS = 8, MAXLEN = 40, OPS = 20000 };
    pkv_pool *p;
    pkv_seqset *s;
    pkv_prefix_cache *c;
    cr_assert_eq(pkv_pool_create(POOL, &p), PKV_OK);
    cr_assert_eq(pkv_seqset_create(p, B, &s), PKV_OK);
    cr_assert_eq(pkv_prefix_cache_create(p, B, 24, &c), PKV_OK);
    cr_assert_eq(pkv_prefix_cache_attach(c, s), PKV_OK);
    static int32_t mem[POOL * B];
    int32_t toks[SEQS][MAXLEN];
    uint32_t lens[SEQS] = {0};
    pkv_seq_id ids[SEQS];
    int live[SEQS] = {0};
    uint64_t rng = 42, hits = 0, refused = 0;
#define RND(n) ((uint32_t)((rng = rng * 6364136223846793005ull + 1442695040888963407ull) >> 33) % (n))
    for (int op = 0; op < OPS; op++) {
        int k = (int)RND(SEQS);
        if (live[k]) {
            cr_assert_eq(pkv_prefix_cache_insert(c, s, ids[k], toks[k], lens[k], NULL), PKV_OK);
            cr_assert_eq(pkv_seq_free(s, ids[k]), PKV_OK);
            live[k] = 0;
        } else {
            // Prefix family f (shared first 12 tokens), then random tokens.
            uint32_t f = RND(3), n = 1 + RND(MAXLEN);
            for (uint32_t i = 0; i < n; i++)
                toks[k][i] = i < 12 ? (int32_t)(f * 100 + i) : (int32_t)(1000 + RND(5));
            uint32_t cached;
            cr_assert_eq(pkv_seq_create_cached(s, c, toks[k], n, &ids[k], &cached), PKV_OK);
            hits += cached / B;
            uint32_t need;
            cr_assert_eq(pkv_seq_blocks_needed(s, ids[k], n - cached, &need), PKV_OK);
            if (pkv_prefix_cache_reclaim(c, need) != PKV_OK) {
                refused++;
                cr_assert_eq(pkv_seq_free(s, ids[k]), PKV_OK);
                continue;
            }
            int64_t slots[MAXLEN];
            cr_assert_eq(pkv_seq_append(s, ids[k], n - cached, slots), PKV_OK);
            for (uint32_t i = 0; i < n - cached; i++) mem[slots[i]] = toks[k][cached + i];
            lens[k] = n;
            live[k] = 1;
        }
        for (int j = 0; j < SEQS; j++) {
            if (!live[j]) continue;
            const pkv_block_id *t;
            uint32_t nb;
            cr_assert_eq(pkv_seq_block_table(s, ids[j], &t, &nb), PKV_OK);
            for (uint32_t i = 0; i < lens[j]; i++)
                cr_assert_eq(mem[t[i / B] * B + i % B], toks[j][i], "op %d seq %d token %u", op, j, i);
        }
        cr_assert_eq(pkv_prefix_cache_validate(c), PKV_OK);
        cr_assert_eq(pkv_seqset_validate(s, 0), PKV_OK);
    }
    cr_assert_gt(hits, 100, "the run must actually hit the cache");
    cr_log_info("prefix randomized: %lu block hits, %lu refused prompts", (unsigned long)hits,
                (unsigned long)refused);
    pkv_seqset_destroy(s);
    pkv_prefix_cache_destroy(c);
    cr_assert_eq(pkv_pool_free_count(p), POOL);
    pkv_pool_destroy(p);
#undef RND
}

// ---- issue 10: the admission probe; issue 15: defects 5 and 10, BUSY ----

// The probe reports what create_cached + append would find and take, and changes
// nothing: stats, refcounts, free count and eviction order stay as they were.
Test(prefix, match_probe_has_no_side_effects) {
    int32_t a[14] = {1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14};
    uint32_t cached;
    pkv_seq_id sa = prompt(a, 14, &cached);
    cr_assert_eq(pkv_prefix_cache_insert(pc, set, sa, a, 12, NULL), PKV_OK);
    pkv_block_id b0 = table_of(sa)[0], b1 = table_of(sa)[1], b2 = table_of(sa)[2];
    cr_assert_eq(pkv_seq_truncate(set, sa, 8), PKV_OK); // b2 left to the cache alone
    int32_t q[11] = {1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11};
    pkv_prefix_stats before, after;
    cr_assert_eq(pkv_prefix_cache_get_stats(pc, &before), PKV_OK);
    cr_assert_eq(before.evictable, 1);
    const uint32_t free_before = pkv_pool_free_count(pool);
    pkv_prefix_match m;
    for (int probe = 0; probe < 5; probe++) {
        cr_assert_eq(pkv_prefix_cache_match(pc, q, 11, &m), PKV_OK);
        cr_assert_eq(m.cached_tokens, 2 * B, "the last token is never cached");
        cr_assert_eq(m.cached_blocks, 2);
        cr_assert_eq(m.new_blocks, 1);
        cr_assert_eq(m.evictable_hit, 0, "b0 and b1 are in use by sa");
        cr_assert_eq(pkv_prefix_cache_match(pc, a, 13, &m), PKV_OK);
        cr_assert_eq(m.cached_blocks, 3);
        cr_assert_eq(m.evictable_hit, 1, "b2 is held by the cache alone");
        cr_assert_eq(m.new_blocks, 1);
    }
    cr_assert_eq(pkv_prefix_cache_get_stats(pc, &after), PKV_OK);
    cr_assert_eq(memcmp(&before, &after, sizeof before), 0, "statistics unchanged");
    cr_assert_eq(pkv_pool_free_count(pool), free_before);
    cr_assert_eq(pkv_pool_refcount(pool, b0), 2);
    cr_assert_eq(pkv_pool_refcount(pool, b1), 2);
    cr_assert_eq(pkv_pool_refcount(pool, b2), 1);
    cr_assert_eq(pkv_prefix_cache_validate(pc), PKV_OK);
    // What the probe said is what admission does.
    cr_assert_eq(pkv_prefix_cache_match(pc, q, 11, &m), PKV_OK);
    uint32_t free_now = pkv_pool_free_count(pool);
    pkv_seq_id sq = prompt(q, 11, &cached);
    cr_assert_eq(cached, m.cached_tokens);
    cr_assert_eq(free_now - pkv_pool_free_count(pool), m.new_blocks);
    cr_assert_eq(pkv_prefix_cache_match(pc, NULL, 0, &m), PKV_OK);
    cr_assert_eq(m.cached_blocks + m.new_blocks, 0);
    cr_assert_eq(pkv_prefix_cache_match(pc, NULL, 3, &m), PKV_ERR_INVALID_ARG);
    cr_assert_eq(pkv_prefix_cache_match(NULL, q, 3, &m), PKV_ERR_INVALID_ARG);
    cr_assert_eq(pkv_seq_free(set, sq), PKV_OK);
}

// Defect 5: a set re-attached to a second cache used to leave the first one
// unable to see its blocks go unused (evictable 0 while it alone held 2, validate
// CORRUPT, reclaim stuck). Now the second attach is refused with BUSY.
Test(prefix, attaching_to_a_second_cache_is_refused) {
    pkv_prefix_cache *second;
    cr_assert_eq(pkv_prefix_cache_create(pool, B, 8, &second), PKV_OK);
    int32_t a[9] = {1, 2, 3, 4, 5, 6, 7, 8, 9};
    uint32_t cached;
    pkv_seq_id sa = prompt(a, 9, &cached);
    cr_assert_eq(pkv_prefix_cache_insert(pc, set, sa, a, 8, NULL), PKV_OK);
    cr_assert_eq(pkv_prefix_cache_attach(second, set), PKV_ERR_BUSY);
    cr_assert_eq(pkv_prefix_cache_attach(pc, set), PKV_OK, "again to the same cache: no-op");
    cr_assert_eq(pkv_seq_free(set, sa), PKV_OK);
    pkv_prefix_stats st;
    cr_assert_eq(pkv_prefix_cache_get_stats(pc, &st), PKV_OK);
    cr_assert_eq(st.evictable, 2, "the first cache saw both blocks go unused");
    cr_assert_eq(pkv_prefix_cache_validate(pc), PKV_OK);
    cr_assert_eq(pkv_prefix_cache_reclaim(pc, 32), PKV_OK, "and can reclaim them");
    pkv_prefix_cache_destroy(second);
}

Test(prefix, detach_waits_for_cached_blocks) {
    pkv_prefix_cache *second;
    cr_assert_eq(pkv_prefix_cache_create(pool, B, 8, &second), PKV_OK);
    int32_t a[9] = {1, 2, 3, 4, 5, 6, 7, 8, 9};
    uint32_t cached;
    pkv_seq_id sa = prompt(a, 9, &cached);
    cr_assert_eq(pkv_prefix_cache_insert(pc, set, sa, a, 8, NULL), PKV_OK);
    cr_assert_eq(pkv_prefix_cache_detach(second, set), PKV_ERR_NOT_FOUND, "not attached there");
    cr_assert_eq(pkv_prefix_cache_detach(pc, set), PKV_ERR_BUSY, "sa holds cached blocks");
    cr_assert_eq(pkv_seq_truncate(set, sa, 0), PKV_OK);
    cr_assert_eq(pkv_prefix_cache_detach(pc, set), PKV_OK);
    uint32_t n;
    cr_assert_eq(pkv_seq_create_cached(set, pc, a, 9, &sa, &n), PKV_ERR_INVALID_ARG, "detached");
    cr_assert_eq(pkv_prefix_cache_attach(second, set), PKV_OK, "free to move on");
    cr_assert_eq(pkv_prefix_cache_detach(second, set), PKV_OK);
    cr_assert_eq(pkv_prefix_cache_attach(pc, set), PKV_OK); // for teardown's validate
    cr_assert_eq(pkv_prefix_cache_detach(NULL, set), PKV_ERR_INVALID_ARG);
    pkv_prefix_cache_destroy(second);
}

// Which of blocks[0..n-1] are still cached (pool refcount 1 = the cache's).
static unsigned cached_mask(const pkv_block_id *blocks, int n) {
    unsigned m = 0;
    for (int i = 0; i < n; i++) m |= (unsigned)(pkv_pool_refcount(pool, blocks[i]) == 1) << i;
    return m;
}

// Defect 10: cache [P, C1] at t1 and [Q] at t2, hit P alone at t3. Evicting C1
// used to put P at the head, so P (used at t3) went before Q (used at t2).
Test(prefix, eviction_keeps_lru_order_for_parents) {
    int32_t pc1[9] = {1, 1, 1, 1, 2, 2, 2, 2, 0}, q[5] = {3, 3, 3, 3, 0};
    int32_t p_alone[6] = {1, 1, 1, 1, 9, 0};
    uint32_t cached;
    pkv_seq_id s1 = prompt(pc1, 9, &cached); // t1
    cr_assert_eq(pkv_prefix_cache_insert(pc, set, s1, pc1, 8, NULL), PKV_OK);
    pkv_block_id blocks[3] = {table_of(s1)[0], table_of(s1)[1], -1}; // P, C1, Q
    cr_assert_eq(pkv_seq_free(set, s1), PKV_OK);
    pkv_seq_id s2 = prompt(q, 5, &cached); // t2
    cr_assert_eq(pkv_prefix_cache_insert(pc, set, s2, q, 4, NULL), PKV_OK);
    blocks[2] = table_of(s2)[0];
    cr_assert_eq(pkv_seq_free(set, s2), PKV_OK);
    pkv_seq_id s3 = prompt(p_alone, 6, &cached); // t3: P hits, C1 does not
    cr_assert_eq(cached, B);
    cr_assert_eq(pkv_seq_free(set, s3), PKV_OK);
    cr_assert_eq(cached_mask(blocks, 3), 7u);
    uint32_t f = pkv_pool_free_count(pool);
    cr_assert_eq(pkv_prefix_cache_reclaim(pc, f + 1), PKV_OK);
    cr_assert_eq(cached_mask(blocks, 3), 5u, "C1 first: the only evictable leaf of P's chain");
    cr_assert_eq(pkv_prefix_cache_reclaim(pc, f + 2), PKV_OK);
    cr_assert_eq(cached_mask(blocks, 3), 1u, "then Q (t2), not P (t3)");
    cr_assert_eq(pkv_prefix_cache_validate(pc), PKV_OK);
    cr_assert_eq(pkv_prefix_cache_reclaim(pc, f + 3), PKV_OK);
    cr_assert_eq(cached_mask(blocks, 3), 0u);
}

// Rollback, positional forks and batch steps over cached prompts: truncating into
// a cached block and appending other tokens must copy it first, so every live
// sequence and every later cache hit reads back the right tokens.
typedef struct rb_world {
    pkv_seqset *s;
    pkv_prefix_cache *c;
    int32_t *mem; // [pool * B] the simulated K/V: one token id per slot
} rb_world;

// Take the queued copies and run them on mem, then write tokens at slots.
static void rb_write(rb_world *w, const int64_t *slots, const int32_t *toks, uint32_t n) {
    pkv_block_copy cp[64];
    uint32_t nc;
    cr_assert_eq(pkv_seqset_take_copies(w->s, cp, 64, &nc), PKV_OK);
    for (uint32_t i = 0; i < nc; i++)
        memcpy(w->mem + (size_t)cp[i].dst * B, w->mem + (size_t)cp[i].src * B, B * sizeof(int32_t));
    for (uint32_t i = 0; i < n; i++) w->mem[slots[i]] = toks[i];
}

// Append toks[0..n-1] to id, reclaiming cache entries if needed; 0 if refused.
static int rb_append(rb_world *w, pkv_seq_id id, const int32_t *toks, uint32_t n) {
    uint32_t need;
    int64_t slots[64];
    cr_assert_eq(pkv_seq_blocks_needed(w->s, id, n, &need), PKV_OK);
    if (pkv_prefix_cache_reclaim(w->c, need) != PKV_OK) return 0;
    cr_assert_eq(pkv_seq_append(w->s, id, n, slots), PKV_OK);
    rb_write(w, slots, toks, n);
    return 1;
}

Test(prefix, randomized_rollback_forks_and_batches, .timeout = 120) {
    enum { POOL = 96, SEQS = 8, MAXLEN = 48, OPS = 20000 };
    pkv_pool *p;
    rb_world w;
    cr_assert_eq(pkv_pool_create(POOL, &p), PKV_OK);
    cr_assert_eq(pkv_seqset_create(p, B, &w.s), PKV_OK);
    cr_assert_eq(pkv_prefix_cache_create(p, B, 32, &w.c), PKV_OK);
    cr_assert_eq(pkv_prefix_cache_attach(w.c, w.s), PKV_OK);
    w.mem = calloc(POOL * B, sizeof(int32_t));
    cr_assert_not_null(w.mem);
    int32_t toks[SEQS][MAXLEN + 8];
    uint32_t lens[SEQS] = {0};
    pkv_seq_id ids[SEQS];
    int live[SEQS] = {0};
    uint64_t rng = 7, truncs = 0, forks = 0, batches = 0, hits = 0;
#define RND(n) ((uint32_t)((rng = rng * 6364136223846793005ull + 1442695040888963407ull) >> 33) % (n))
    for (int op = 0; op < OPS; op++) {
        int k = (int)RND(SEQS);
        uint32_t r = RND(100);
        if (!live[k]) { // admit a prompt of one of three families through the cache
            uint32_t f = RND(3), n = 1 + RND(MAXLEN / 2);
            for (uint32_t i = 0; i < n; i++)
                toks[k][i] = i < 12 ? (int32_t)(f * 100 + i) : (int32_t)(1000 + RND(5));
            uint32_t cached;
            cr_assert_eq(pkv_seq_create_cached(w.s, w.c, toks[k], n, &ids[k], &cached), PKV_OK);
            hits += cached / B;
            if (!rb_append(&w, ids[k], toks[k] + cached, n - cached)) {
                cr_assert_eq(pkv_seq_free(w.s, ids[k]), PKV_OK);
                continue;
            }
            lens[k] = n;
            live[k] = 1;
        } else if (r < 25) { // offer to the cache, maybe finish
            cr_assert_eq(pkv_prefix_cache_insert(w.c, w.s, ids[k], toks[k], lens[k], NULL), PKV_OK);
            if (RND(2)) {
                cr_assert_eq(pkv_seq_free(w.s, ids[k]), PKV_OK);
                live[k] = 0;
            }
        } else if (r < 55) { // speculative decoding: drafts rejected, others appended
            uint32_t len = RND(lens[k] + 1), extra = RND(6);
            if (len + extra > MAXLEN) extra = MAXLEN - len;
            cr_assert_eq(pkv_seq_truncate(w.s, ids[k], len), PKV_OK);
            lens[k] = len;
            int32_t fresh[8];
            for (uint32_t i = 0; i < extra; i++) fresh[i] = (int32_t)(5000 + RND(1000));
            if (rb_append(&w, ids[k], fresh, extra)) {
                memcpy(toks[k] + len, fresh, extra * sizeof(int32_t));
                lens[k] += extra;
            }
            truncs++;
        } else if (r < 75) { // fork a prefix into a free slot
            int e = -1;
            for (int j = 0; j < SEQS && e < 0; j++)
                if (!live[j]) e = j;
            if (e < 0) continue;
            uint32_t len = RND(lens[k] + 1);
            cr_assert_eq(pkv_seq_fork_at(w.s, ids[k], len, &ids[e]), PKV_OK);
            memcpy(toks[e], toks[k], len * sizeof(int32_t));
            lens[e] = len;
            live[e] = 1;
            forks++;
        } else { // one engine step: every live sequence below MAXLEN decodes a token
            pkv_seq_id b[SEQS];
            uint32_t cnt[SEQS], nb = 0, need;
            int who[SEQS];
            int32_t val[SEQS];
            for (int j = 0; j < SEQS; j++)
                if (live[j] && lens[j] < MAXLEN) {
                    b[nb] = ids[j], cnt[nb] = 1, who[nb] = j, val[nb] = (int32_t)(9000 + RND(99));
                    nb++;
                }
            cr_assert_eq(pkv_seqset_blocks_needed_batch(w.s, b, cnt, nb, &need), PKV_OK);
            if (pkv_prefix_cache_reclaim(w.c, need) != PKV_OK) continue;
            int64_t slots[SEQS];
            uint32_t before = pkv_pool_free_count(p);
            cr_assert_eq(pkv_seqset_append_batch(w.s, b, cnt, nb, slots), PKV_OK);
            cr_assert_eq(before - pkv_pool_free_count(p), need);
            rb_write(&w, slots, val, nb);
            for (uint32_t i = 0; i < nb; i++) toks[who[i]][lens[who[i]]++] = val[i];
            batches++;
        }
        for (int j = 0; j < SEQS; j++) {
            if (!live[j]) continue;
            const pkv_block_id *t;
            uint32_t nbk;
            cr_assert_eq(pkv_seq_block_table(w.s, ids[j], &t, &nbk), PKV_OK);
            for (uint32_t i = 0; i < lens[j]; i++)
                cr_assert_eq(w.mem[t[i / B] * B + i % B], toks[j][i], "op %d seq %d token %u", op, j, i);
        }
        cr_assert_eq(pkv_prefix_cache_validate(w.c), PKV_OK);
        cr_assert_eq(pkv_seqset_validate(w.s, 0), PKV_OK);
    }
    cr_assert_gt(hits, 100);
    cr_assert_gt(truncs, 100);
    cr_assert_gt(forks, 100);
    cr_assert_gt(batches, 100);
    pkv_seqset_destroy(w.s);
    pkv_prefix_cache_destroy(w.c);
    cr_assert_eq(pkv_pool_free_count(p), POOL);
    pkv_pool_destroy(p);
    free(w.mem);
#undef RND
}

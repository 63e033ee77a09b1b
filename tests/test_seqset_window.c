// SPDX-License-Identifier: MIT
// Window release in a sequence set (pkv_seq_release_before): released blocks become
// holes (PKV_BLOCK_NONE) at the front of a table, and every other call of the set
// (fork, fork_at, truncate, free, moves, exports, the prefix cache, copy-on-write,
// validate) handles them. Block size 2 throughout, so the expected tables are
// written out by hand. Every test ends with the pool fully free (no block lost).
#include <criterion/criterion.h>
#include <string.h>

#include "pkv/prefix.h"
#include "pkv/seq.h"

#define B 2u
#define CAP 32u

static pkv_pool *pool;
static pkv_seqset *set;

static void setup(void) {
    cr_assert_eq(pkv_pool_create(CAP, &pool), PKV_OK);
    cr_assert_eq(pkv_seqset_create(pool, B, &set), PKV_OK);
}

static void teardown(void) {
    cr_assert_eq(pkv_seqset_validate(set, 1), PKV_OK);
    pkv_seqset_destroy(set);
    cr_assert_eq(pkv_pool_free_count(pool), CAP, "destroying the set must free every block");
    pkv_pool_destroy(pool);
}

TestSuite(seqwin, .init = setup, .fini = teardown);

static pkv_seq_id new_seq(uint32_t len) {
    pkv_seq_id id;
    cr_assert_eq(pkv_seq_create(set, &id), PKV_OK);
    cr_assert_eq(pkv_seq_append(set, id, len, NULL), PKV_OK);
    return id;
}

static const pkv_block_id *table_of(pkv_seq_id id, uint32_t *n) {
    const pkv_block_id *t;
    cr_assert_eq(pkv_seq_block_table(set, id, &t, n), PKV_OK);
    return t;
}

static uint32_t holes_of(pkv_seq_id id) {
    uint32_t h;
    cr_assert_eq(pkv_seq_released_blocks(set, id, &h), PKV_OK);
    return h;
}

Test(seqwin, release_before_makes_holes_of_whole_blocks_only) {
    pkv_seq_id id = new_seq(9); // 5 blocks: tokens 0-1, 2-3, 4-5, 6-7, 8
    uint32_t n, released = 99;
    pkv_block_id before[5];
    memcpy(before, table_of(id, &n), sizeof before);
    int64_t slot8 = (int64_t)before[4] * B;
    cr_assert_eq(pkv_seq_release_before(set, id, 5, &released), PKV_OK);
    cr_assert_eq(released, 2, "tokens 0..3 dead: blocks 0 and 1 (block 2 holds token 5)");
    const pkv_block_id *t = table_of(id, &n);
    cr_assert_eq(n, 5, "the table keeps its length");
    cr_assert_eq(t[0], PKV_BLOCK_NONE);
    cr_assert_eq(t[1], PKV_BLOCK_NONE);
    for (uint32_t j = 2; j < 5; j++) cr_assert_eq(t[j], before[j]);
    cr_assert_eq(pkv_pool_free_count(pool), CAP - 3);
    cr_assert_eq(holes_of(id), 2);
    // Idempotent, never backwards, and the partly filled last block stays.
    cr_assert_eq(pkv_seq_release_before(set, id, 4, &released), PKV_OK);
    cr_assert_eq(released, 0);
    cr_assert_eq(pkv_seq_release_before(set, id, 9, &released), PKV_OK);
    cr_assert_eq(released, 2, "blocks 2 and 3; block 4 holds token 8, still live");
    t = table_of(id, &n);
    cr_assert_eq(t[4], before[4]);
    cr_assert_eq(pkv_seq_release_before(set, id, 10, NULL), PKV_ERR_INVALID_ARG);
    cr_assert_eq(pkv_seq_release_before(set, id + 1, 0, NULL), PKV_ERR_NOT_FOUND);
    // Appending goes on where it was: the slot of token 9 follows token 8's.
    int64_t slot;
    cr_assert_eq(pkv_seq_append(set, id, 1, &slot), PKV_OK);
    cr_assert_eq(slot, slot8 + 1);
    cr_assert_eq(pkv_seqset_validate(set, 1), PKV_OK);
    cr_assert_eq(pkv_seq_free(set, id), PKV_OK);
}

Test(seqwin, fork_shares_live_blocks_and_copies_holes) {
    pkv_seq_id p = new_seq(7), c;
    cr_assert_eq(pkv_seq_release_before(set, p, 4, NULL), PKV_OK); // blocks 0, 1
    cr_assert_eq(pkv_seq_fork(set, p, &c), PKV_OK);
    uint32_t n;
    const pkv_block_id *pt = table_of(p, &n), *ct = table_of(c, &n);
    cr_assert_eq(n, 4);
    cr_assert_eq(ct[0], PKV_BLOCK_NONE);
    cr_assert_eq(ct[1], PKV_BLOCK_NONE);
    cr_assert_eq(holes_of(c), 2);
    for (uint32_t j = 2; j < 4; j++) {
        cr_assert_eq(ct[j], pt[j]);
        cr_assert_eq(pkv_pool_refcount(pool, ct[j]), 2);
    }
    cr_assert_eq(pkv_seqset_validate(set, 1), PKV_OK);
    // Appending into the shared partial last block copies it (copy-on-write), holes
    // or not; the parent keeps its table.
    pkv_block_id last = pt[3];
    cr_assert_eq(pkv_seq_append(set, c, 1, NULL), PKV_OK);
    cr_assert_eq(pkv_seqset_pending_copies(set), 1);
    const pkv_block_copy *cp;
    cr_assert_eq(pkv_seqset_copies(set, &cp, &n), PKV_OK);
    cr_assert_eq(cp[0].src, last);
    cr_assert_eq(pkv_seqset_copies_done(set), PKV_OK);
    // A window release in the child drops only the child's reference.
    cr_assert_eq(pkv_seq_release_before(set, c, 6, NULL), PKV_OK);
    cr_assert_eq(pkv_pool_refcount(pool, pt[2]), 1, "the parent still holds block 2");
    cr_assert_eq(pkv_seqset_validate(set, 1), PKV_OK);
    cr_assert_eq(pkv_seq_free(set, p), PKV_OK);
    cr_assert_eq(pkv_seq_free(set, c), PKV_OK);
}

Test(seqwin, fork_at_and_truncate_refuse_released_tokens) {
    pkv_seq_id id = new_seq(9), c;
    cr_assert_eq(pkv_seq_release_before(set, id, 6, NULL), PKV_OK); // holes 0, 1, 2
    uint32_t free_before = pkv_pool_free_count(pool), n;
    // Keeping 5 tokens would end in released block 2 (token 4 is gone).
    cr_assert_eq(pkv_seq_truncate(set, id, 5), PKV_ERR_RELEASED);
    cr_assert_eq(pkv_seq_fork_at(set, id, 3, &c), PKV_ERR_RELEASED);
    cr_assert_eq(pkv_seqset_live_count(set), 1, "no child was created");
    table_of(id, &n);
    cr_assert_eq(n, 5, "refused truncate changed nothing");
    cr_assert_eq(pkv_pool_free_count(pool), free_before);
    // A cut at a block boundary keeps whole holes: allowed.
    cr_assert_eq(pkv_seq_fork_at(set, id, 4, &c), PKV_OK);
    table_of(c, &n);
    cr_assert_eq(n, 2);
    cr_assert_eq(holes_of(c), 2);
    cr_assert_eq(pkv_seq_append(set, c, 1, NULL), PKV_OK); // a fresh block 2
    cr_assert_eq(holes_of(c), 2);
    // Truncate past the holes releases live blocks only.
    cr_assert_eq(pkv_seq_truncate(set, id, 7), PKV_OK); // keeps blocks 0-3, 3 live
    const pkv_block_id *t = table_of(id, &n);
    cr_assert_eq(n, 4);
    cr_assert_eq(t[2], PKV_BLOCK_NONE);
    cr_assert_neq(t[3], PKV_BLOCK_NONE);
    cr_assert_eq(pkv_seq_truncate(set, id, 6), PKV_OK); // every kept entry a hole
    cr_assert_eq(holes_of(id), 3);
    cr_assert_eq(pkv_seq_truncate(set, id, 2), PKV_OK);
    cr_assert_eq(holes_of(id), 1);
    cr_assert_eq(pkv_seqset_validate(set, 1), PKV_OK);
    cr_assert_eq(pkv_seq_free(set, id), PKV_OK);
    cr_assert_eq(pkv_seq_free(set, c), PKV_OK);
}

Test(seqwin, exports_write_holes_as_minus_one_and_csr_live_skips_them) {
    pkv_seq_id a = new_seq(5), b = new_seq(3);
    cr_assert_eq(pkv_seq_release_before(set, a, 4, NULL), PKV_OK); // a: holes 0, 1
    uint32_t n, maxb;
    uint64_t total;
    const pkv_block_id *ta = table_of(a, &n), *tb = table_of(b, &n);
    pkv_seq_id ids[2] = {a, b};
    cr_assert_eq(pkv_seqset_export_size(set, ids, 2, &maxb, &total), PKV_OK);
    cr_assert_eq(maxb, 3);
    cr_assert_eq(total, 5, "holes count as entries");
    int32_t table[6], lens[2];
    cr_assert_eq(pkv_seqset_export_padded(set, ids, 2, 3, -7, table, lens), PKV_OK);
    int32_t want[6] = {-1, -1, ta[2], tb[0], tb[1], -7};
    cr_assert_arr_eq(table, want, sizeof want);
    cr_assert_eq(lens[0], 5);
    int32_t indptr[3], indices[5], last[2], first[2];
    cr_assert_eq(pkv_seqset_export_csr(set, ids, 2, indptr, indices, 5, last),
                 PKV_ERR_UNSUPPORTED, "the plain CSR form cannot express holes");
    cr_assert_eq(pkv_seqset_export_csr_live(set, ids, 2, indptr, indices, 5, last, first),
                 PKV_OK);
    int32_t want_ptr[3] = {0, 1, 3}, want_idx[3] = {ta[2], tb[0], tb[1]};
    cr_assert_arr_eq(indptr, want_ptr, sizeof want_ptr);
    cr_assert_arr_eq(indices, want_idx, sizeof want_idx);
    cr_assert_eq(first[0], 2);
    cr_assert_eq(first[1], 0);
    cr_assert_eq(last[0], 1);
    cr_assert_eq(last[1], 1);
    cr_assert_eq(pkv_seqset_export_csr_live(set, ids, 2, indptr, indices, 2, last, first),
                 PKV_ERR_BUFFER_TOO_SMALL);
    cr_assert_eq(pkv_seqset_export_csr_live(set, ids, 2, indptr, indices, 5, last, NULL),
                 PKV_ERR_INVALID_ARG);
    // Without holes the plain form is unchanged.
    cr_assert_eq(pkv_seqset_export_csr(set, &b, 1, indptr, indices, 5, last), PKV_OK);
    cr_assert_eq(indptr[1], 2);
    cr_assert_eq(pkv_seq_free(set, a), PKV_OK);
    cr_assert_eq(pkv_seq_free(set, b), PKV_OK);
}

Test(seqwin, move_group_moves_live_blocks_and_keeps_holes) {
    pkv_pool *host;
    pkv_seqset *hset;
    cr_assert_eq(pkv_pool_create(CAP, &host), PKV_OK);
    cr_assert_eq(pkv_seqset_create(host, B, &hset), PKV_OK);
    pkv_seq_id p = new_seq(7), c;
    cr_assert_eq(pkv_seq_release_before(set, p, 4, NULL), PKV_OK); // p: holes 0, 1
    cr_assert_eq(pkv_seq_fork(set, p, &c), PKV_OK);
    cr_assert_eq(pkv_seq_release_before(set, c, 6, NULL), PKV_OK); // c: holes 0..2
    pkv_seq_id ids[2] = {p, c}, moved[2];
    pkv_block_copy pairs[8];
    uint32_t np, n;
    cr_assert_eq(pkv_seq_move_group(set, ids, 2, hset, moved, pairs, 8, &np), PKV_OK);
    cr_assert_eq(np, 2, "live blocks 2 (p only) and 3 (shared) move once each");
    cr_assert_eq(pkv_pool_free_count(pool), CAP);
    cr_assert_eq(pkv_pool_free_count(host), CAP - 2);
    cr_assert_eq(pkv_seqset_validate(hset, 1), PKV_OK);
    const pkv_block_id *tp, *tc;
    cr_assert_eq(pkv_seq_block_table(hset, moved[0], &tp, &n), PKV_OK);
    cr_assert_eq(n, 4);
    cr_assert_eq(tp[1], PKV_BLOCK_NONE);
    cr_assert_neq(tp[2], PKV_BLOCK_NONE);
    cr_assert_eq(pkv_seq_block_table(hset, moved[1], &tc, &n), PKV_OK);
    cr_assert_eq(tc[2], PKV_BLOCK_NONE);
    cr_assert_eq(tc[3], tp[3], "the shared block stays shared");
    uint32_t h;
    cr_assert_eq(pkv_seq_released_blocks(hset, moved[1], &h), PKV_OK);
    cr_assert_eq(h, 3);
    pkv_seqset_destroy(hset);
    cr_assert_eq(pkv_pool_free_count(host), CAP);
    pkv_pool_destroy(host);
}

Test(seqwin, batch_append_and_free_skip_holes) {
    pkv_seq_id a = new_seq(4), b = new_seq(4);
    cr_assert_eq(pkv_seq_release_before(set, a, 4, NULL), PKV_OK); // a: all holes
    pkv_seq_id ids[2] = {a, b};
    uint32_t counts[2] = {3, 1}, need;
    cr_assert_eq(pkv_seqset_blocks_needed_batch(set, ids, counts, 2, &need), PKV_OK);
    cr_assert_eq(need, 3);
    int64_t slots[4];
    cr_assert_eq(pkv_seqset_append_batch(set, ids, counts, 2, slots), PKV_OK);
    uint32_t n;
    const pkv_block_id *t = table_of(a, &n);
    cr_assert_eq(n, 4);
    cr_assert_eq(slots[0], (int64_t)t[2] * B);
    cr_assert_eq(slots[2], (int64_t)t[3] * B);
    cr_assert_eq(pkv_seqset_validate(set, 1), PKV_OK);
    cr_assert_eq(pkv_seqset_free_batch(set, ids, 2), PKV_OK);
    cr_assert_eq(pkv_pool_free_count(pool), CAP);
}

Test(seqwin, prefix_cache_insert_stops_at_an_uncached_hole) {
    pkv_prefix_cache *pc;
    cr_assert_eq(pkv_prefix_cache_create(pool, B, 16, &pc), PKV_OK);
    cr_assert_eq(pkv_prefix_cache_attach(pc, set), PKV_OK);
    const int32_t tokens[6] = {1, 2, 3, 4, 5, 6};
    pkv_seq_id a = new_seq(6), b = new_seq(6);
    uint32_t inserted;
    // a: block 0 released before insert: nothing can be chained after it.
    cr_assert_eq(pkv_seq_release_before(set, a, 2, NULL), PKV_OK);
    cr_assert_eq(pkv_prefix_cache_insert(pc, set, a, tokens, 6, &inserted), PKV_OK);
    cr_assert_eq(inserted, 0);
    // b: inserted first, then released: the cache keeps the blocks (evictable).
    cr_assert_eq(pkv_prefix_cache_insert(pc, set, b, tokens, 6, &inserted), PKV_OK);
    cr_assert_eq(inserted, 3);
    uint32_t n;
    pkv_block_id b0 = table_of(b, &n)[0];
    cr_assert_eq(pkv_seq_release_before(set, b, 4, NULL), PKV_OK);
    cr_assert_eq(pkv_pool_refcount(pool, b0), 1, "the cache's reference only");
    pkv_prefix_stats st;
    cr_assert_eq(pkv_prefix_cache_get_stats(pc, &st), PKV_OK);
    cr_assert_eq(st.entries, 3, "released blocks stay cached");
    cr_assert_eq(pkv_prefix_cache_validate(pc), PKV_OK);
    // Re-inserting b walks through its cached holes and refreshes the chain.
    cr_assert_eq(pkv_prefix_cache_insert(pc, set, b, tokens, 6, &inserted), PKV_OK);
    cr_assert_eq(inserted, 0);
    cr_assert_eq(pkv_seq_free(set, a), PKV_OK);
    cr_assert_eq(pkv_seq_free(set, b), PKV_OK);
    cr_assert_eq(pkv_seqset_validate(set, 0), PKV_OK);
    pkv_seqset_destroy(set);
    pkv_prefix_cache_destroy(pc);
    cr_assert_eq(pkv_seqset_create(pool, B, &set), PKV_OK); // for teardown
}

Test(seqwin, empty_sequences_free_without_touching_a_table) {
    // An empty sequence has no table (NULL): freeing it, or destroying the set with
    // it, must not form NULL + holes (undefined; the UBSan build and fuzz_hybrid
    // caught it once).
    pkv_seq_id a = new_seq(0), b = new_seq(0), c;
    cr_assert_eq(pkv_seq_release_before(set, a, 0, NULL), PKV_OK);
    cr_assert_eq(pkv_seq_fork(set, a, &c), PKV_OK);
    cr_assert_eq(pkv_seq_truncate(set, c, 0), PKV_OK);
    cr_assert_eq(pkv_seq_free(set, a), PKV_OK);
    cr_assert_eq(pkv_seq_free(set, c), PKV_OK);
    (void)b; // left for the set's destroy in teardown
}

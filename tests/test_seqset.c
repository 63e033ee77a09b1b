// SPDX-License-Identifier: MIT
// Unit tests of sequences and block tables: appends at block boundaries, fork and
// copy-on-write, exports, and every error path. Every test ends with the set freed
// and the pool fully free again (no block lost).
#include <criterion/criterion.h>
#include <criterion/parameterized.h>
#include <stdlib.h>
#include <string.h>

#include "pkv/seq.h"
#include "src/allocator/pool_internal.h" // white-box: fork_refuses_a_saturated_refcount

#define B 16u

static pkv_pool *pool;
static pkv_seqset *set;

static void setup(void) {
    cr_assert_eq(pkv_pool_create(64, &pool), PKV_OK);
    cr_assert_eq(pkv_seqset_create(pool, B, &set), PKV_OK);
}

static void teardown(void) {
    cr_assert_eq(pkv_seqset_validate(set, 1), PKV_OK);
    pkv_seqset_destroy(set);
    cr_assert_eq(pkv_pool_free_count(pool), 64, "destroying the set must free every block");
    cr_assert_eq(pkv_pool_validate(pool), PKV_OK);
    pkv_pool_destroy(pool);
}

TestSuite(seqset, .init = setup, .fini = teardown);

static pkv_seq_id new_seq(uint32_t len) {
    pkv_seq_id id;
    cr_assert_eq(pkv_seq_create(set, &id), PKV_OK);
    cr_assert_eq(pkv_seq_append(set, id, len, NULL), PKV_OK);
    return id;
}

static uint32_t num_blocks(pkv_seq_id id) {
    const pkv_block_id *t;
    uint32_t n;
    cr_assert_eq(pkv_seq_block_table(set, id, &t, &n), PKV_OK);
    return n;
}

static uint32_t seq_len(pkv_seq_id id) {
    uint32_t len;
    cr_assert_eq(pkv_seq_length(set, id, &len), PKV_OK);
    return len;
}

Test(seqset, create_rejects_bad_args) {
    pkv_seqset *s = (pkv_seqset *)1;
    cr_assert_eq(pkv_seqset_create(NULL, B, &s), PKV_ERR_INVALID_ARG);
    cr_assert_null(s);
    cr_assert_eq(pkv_seqset_create(pool, 0, &s), PKV_ERR_INVALID_ARG);
    cr_assert_eq(pkv_seqset_create(pool, 65537, &s), PKV_ERR_INVALID_ARG);
    cr_assert_eq(pkv_seqset_create(pool, B, NULL), PKV_ERR_INVALID_ARG);
    pkv_seqset_destroy(NULL);
    cr_assert_eq(pkv_seqset_block_size(set), B);
    cr_assert_eq(pkv_seqset_pool(set), pool);
    cr_assert_eq(pkv_seqset_block_size(NULL), 0);
}

// Lengths around block boundaries, in one append and token by token.
static const uint32_t boundary_lengths[] = {0, 1, B - 1, B, B + 1, 2 * B - 1, 2 * B, 2 * B + 1, 20 * B + 3};

Test(seqset, append_takes_blocks_only_when_the_last_fills) {
    for (size_t k = 0; k < sizeof boundary_lengths / sizeof boundary_lengths[0]; k++) {
        uint32_t len = boundary_lengths[k];
        uint32_t expect = (len + B - 1) / B;
        pkv_seq_id one = new_seq(len);
        cr_assert_eq(seq_len(one), len);
        cr_assert_eq(num_blocks(one), expect, "len %u", len);
        pkv_seq_id tok = new_seq(0);
        for (uint32_t i = 0; i < len; i++) {
            uint32_t before = pkv_pool_free_count(pool);
            cr_assert_eq(pkv_seq_append(set, tok, 1, NULL), PKV_OK);
            uint32_t taken = before - pkv_pool_free_count(pool);
            cr_assert_eq(taken, i % B == 0 ? 1u : 0u, "token %u of len %u", i, len);
        }
        cr_assert_eq(num_blocks(tok), expect);
        cr_assert_eq(pkv_seq_free(set, one), PKV_OK);
        cr_assert_eq(pkv_seq_free(set, tok), PKV_OK);
        cr_assert_eq(pkv_pool_free_count(pool), 64);
    }
}

Test(seqset, slots_follow_the_block_table) {
    pkv_seq_id id = new_seq(B - 3);
    int64_t slots[2 * B];
    cr_assert_eq(pkv_seq_append(set, id, 2 * B, slots), PKV_OK);
    const pkv_block_id *t;
    uint32_t n;
    cr_assert_eq(pkv_seq_block_table(set, id, &t, &n), PKV_OK);
    cr_assert_eq(n, 3);
    for (uint32_t i = 0; i < 2 * B; i++) {
        uint32_t pos = B - 3 + i;
        cr_assert_eq(slots[i], (int64_t)t[pos / B] * B + pos % B, "token %u", i);
    }
}

Test(seqset, blocks_needed_predicts_append) {
    pkv_seq_id id = new_seq(B + 5);
    uint32_t need;
    cr_assert_eq(pkv_seq_blocks_needed(set, id, B - 5, &need), PKV_OK);
    cr_assert_eq(need, 0);
    cr_assert_eq(pkv_seq_blocks_needed(set, id, B - 4, &need), PKV_OK);
    cr_assert_eq(need, 1);
    pkv_seq_id child;
    cr_assert_eq(pkv_seq_fork(set, id, &child), PKV_OK);
    cr_assert_eq(pkv_seq_blocks_needed(set, child, 1, &need), PKV_OK);
    cr_assert_eq(need, 1, "the copy-on-write block counts");
    cr_assert_eq(pkv_seq_blocks_needed(set, child, 0, &need), PKV_OK);
    cr_assert_eq(need, 0);
    uint32_t before = pkv_pool_free_count(pool);
    cr_assert_eq(pkv_seq_append(set, child, 1, NULL), PKV_OK);
    cr_assert_eq(before - pkv_pool_free_count(pool), 1);
    cr_assert_eq(pkv_seq_blocks_needed(set, 999, 1, &need), PKV_ERR_NOT_FOUND);
    cr_assert_eq(pkv_seq_blocks_needed(set, id, 1, NULL), PKV_ERR_INVALID_ARG);
    uint32_t n;
    pkv_block_copy c[1];
    cr_assert_eq(pkv_seqset_take_copies(set, c, 1, &n), PKV_OK);
}

Test(seqset, fork_shares_every_block) {
    pkv_seq_id parent = new_seq(3 * B + 2);
    uint32_t free_before = pkv_pool_free_count(pool);
    pkv_seq_id child;
    cr_assert_eq(pkv_seq_fork(set, parent, &child), PKV_OK);
    cr_assert_eq(pkv_pool_free_count(pool), free_before, "fork takes no blocks");
    cr_assert_eq(seq_len(child), 3 * B + 2);
    const pkv_block_id *tp, *tc;
    uint32_t np, nc;
    cr_assert_eq(pkv_seq_block_table(set, parent, &tp, &np), PKV_OK);
    cr_assert_eq(pkv_seq_block_table(set, child, &tc, &nc), PKV_OK);
    cr_assert_eq(np, nc);
    for (uint32_t i = 0; i < np; i++) {
        cr_assert_eq(tp[i], tc[i]);
        cr_assert_eq(pkv_pool_refcount(pool, tp[i]), 2);
    }
    cr_assert_eq(pkv_seqset_live_count(set), 2);
}

// Fork, then append on both sides: the first writer into the shared partial block
// copies it; the last sharer writes in place; full shared blocks are never copied.
Test(seqset, copy_on_write_on_partial_last_block) {
    pkv_seq_id parent = new_seq(2 * B + 5);
    const pkv_block_id *t;
    uint32_t n;
    cr_assert_eq(pkv_seq_block_table(set, parent, &t, &n), PKV_OK);
    pkv_block_id full0 = t[0], full1 = t[1], partial = t[2];
    pkv_seq_id child;
    cr_assert_eq(pkv_seq_fork(set, parent, &child), PKV_OK);

    int64_t slot;
    cr_assert_eq(pkv_seq_append(set, child, 1, &slot), PKV_OK);
    cr_assert_eq(pkv_seqset_pending_copies(set), 1);
    cr_assert_eq(pkv_seq_block_table(set, child, &t, &n), PKV_OK);
    cr_assert_eq(t[0], full0, "full blocks stay shared");
    cr_assert_eq(t[1], full1);
    cr_assert_neq(t[2], partial, "the partial block was remapped");
    pkv_block_id copy_dst = t[2];
    cr_assert_eq(slot, (int64_t)copy_dst * B + 5);
    cr_assert_eq(pkv_pool_refcount(pool, partial), 2, "the parent and the copy's pin");
    cr_assert_eq(pkv_pool_refcount(pool, copy_dst), 2, "the child and the copy's pin");
    cr_assert_eq(pkv_pool_refcount(pool, full0), 2);

    // The parent is now the only holder: it appends in place, no second copy.
    cr_assert_eq(pkv_seq_append(set, parent, 1, &slot), PKV_OK);
    cr_assert_eq(slot, (int64_t)partial * B + 5);
    cr_assert_eq(pkv_seqset_pending_copies(set), 1);

    pkv_block_copy copies[2];
    uint32_t taken = 0;
    cr_assert_eq(pkv_seqset_take_copies(set, copies, 0, &taken), PKV_ERR_BUFFER_TOO_SMALL);
    cr_assert_eq(pkv_seqset_pending_copies(set), 1, "a refused take keeps the queue");
    cr_assert_eq(pkv_seqset_take_copies(set, copies, 2, &taken), PKV_OK);
    cr_assert_eq(taken, 1);
    cr_assert_eq(copies[0].src, partial);
    cr_assert_eq(copies[0].dst, copy_dst);
    cr_assert_eq(pkv_seqset_pending_copies(set), 0);
    cr_assert_eq(pkv_pool_refcount(pool, partial), 1, "pins dropped");
    cr_assert_eq(pkv_pool_refcount(pool, copy_dst), 1);
}

// A queued copy pins its blocks: freeing every sequence that held them does not
// return them to the pool until the copies ran, so a later allocation (an append,
// a swap-in) can never be handed a block a pending copy still reads or writes.
Test(seqset, queued_copies_pin_their_blocks) {
    pkv_seq_id a = new_seq(2), b, c;
    cr_assert_eq(pkv_seq_fork(set, a, &b), PKV_OK);
    cr_assert_eq(pkv_seq_append(set, a, 1, NULL), PKV_OK); // copy src -> dst
    const pkv_block_copy *q;
    uint32_t n;
    cr_assert_eq(pkv_seqset_copies(set, &q, &n), PKV_OK);
    cr_assert_eq(n, 1);
    pkv_block_copy queued = q[0];
    uint32_t free_before = pkv_pool_free_count(pool);
    cr_assert_eq(pkv_seq_free(set, b), PKV_OK); // src's last sequence
    cr_assert_eq(pkv_seq_free(set, a), PKV_OK); // dst's only sequence
    cr_assert_eq(pkv_pool_free_count(pool), free_before, "pinned blocks stay allocated");
    // Take every free block: none of them may be the copy's src or dst.
    cr_assert_eq(pkv_seq_create(set, &c), PKV_OK);
    cr_assert_eq(pkv_seq_append(set, c, pkv_pool_free_count(pool) * B, NULL), PKV_OK);
    const pkv_block_id *t;
    uint32_t nb;
    cr_assert_eq(pkv_seq_block_table(set, c, &t, &nb), PKV_OK);
    for (uint32_t i = 0; i < nb; i++) {
        cr_assert_neq(t[i], queued.src);
        cr_assert_neq(t[i], queued.dst);
    }
    cr_assert_eq(pkv_seqset_validate(set, 1), PKV_OK, "pins count as references");
    cr_assert_eq(pkv_seqset_copies_done(set), PKV_OK);
    cr_assert_eq(pkv_pool_free_count(pool), 2, "done: both pinned blocks come back");
    cr_assert_eq(pkv_seqset_copies_done(NULL), PKV_ERR_INVALID_ARG);
    cr_assert_eq(pkv_seqset_copies(set, NULL, &n), PKV_ERR_INVALID_ARG);
}

// n-way fork of a partial block: the first n-1 appends copy, the last sharer
// writes in place even though pins are outstanding.
Test(seqset, last_sharer_appends_in_place_despite_pins) {
    pkv_seq_id s[4];
    s[0] = new_seq(B + 3);
    for (int i = 1; i < 4; i++) cr_assert_eq(pkv_seq_fork(set, s[0], &s[i]), PKV_OK);
    const pkv_block_id *t;
    uint32_t n;
    cr_assert_eq(pkv_seq_block_table(set, s[0], &t, &n), PKV_OK);
    pkv_block_id partial = t[1];
    for (int i = 0; i < 4; i++) cr_assert_eq(pkv_seq_append(set, s[i], 1, NULL), PKV_OK);
    cr_assert_eq(pkv_seqset_pending_copies(set), 3, "n - 1 copies");
    cr_assert_eq(pkv_seq_block_table(set, s[3], &t, &n), PKV_OK);
    cr_assert_eq(t[1], partial, "the last sharer kept the original block");
    const pkv_block_copy *q;
    cr_assert_eq(pkv_seqset_copies(set, &q, &n), PKV_OK);
    for (uint32_t i = 0; i < n; i++)
        for (uint32_t j = 0; j < n; j++) {
            if (i != j) cr_assert_neq(q[i].dst, q[j].dst, "a dst twice");
            cr_assert_neq(q[i].dst, q[j].src, "a dst that is also a src");
        }
    cr_assert_eq(pkv_seqset_copies_done(set), PKV_OK);
}

Test(seqset, fork_at_block_boundary_never_copies) {
    pkv_seq_id parent = new_seq(2 * B);
    pkv_seq_id child;
    cr_assert_eq(pkv_seq_fork(set, parent, &child), PKV_OK);
    cr_assert_eq(pkv_seq_append(set, child, 1, NULL), PKV_OK);
    cr_assert_eq(pkv_seq_append(set, parent, B + 1, NULL), PKV_OK);
    cr_assert_eq(pkv_seqset_pending_copies(set), 0, "full shared blocks are never copied");
    cr_assert_eq(num_blocks(child), 3);
    cr_assert_eq(num_blocks(parent), 4);
}

Test(seqset, fork_of_empty_and_nested_forks) {
    pkv_seq_id e = new_seq(0), e2;
    cr_assert_eq(pkv_seq_fork(set, e, &e2), PKV_OK);
    cr_assert_eq(pkv_seq_append(set, e2, 1, NULL), PKV_OK);
    cr_assert_eq(pkv_seqset_pending_copies(set), 0);
    pkv_seq_id a = new_seq(7), b, c;
    cr_assert_eq(pkv_seq_fork(set, a, &b), PKV_OK);
    cr_assert_eq(pkv_seq_fork(set, b, &c), PKV_OK);
    const pkv_block_id *t;
    uint32_t n;
    cr_assert_eq(pkv_seq_block_table(set, a, &t, &n), PKV_OK);
    cr_assert_eq(pkv_pool_refcount(pool, t[0]), 3);
    // Free order independence: free the root first, the shared block survives.
    cr_assert_eq(pkv_seq_free(set, a), PKV_OK);
    cr_assert_eq(pkv_seq_append(set, c, 1, NULL), PKV_OK); // b and c share: copy
    cr_assert_eq(pkv_seq_append(set, b, 1, NULL), PKV_OK); // b alone now: in place
    cr_assert_eq(pkv_seqset_pending_copies(set), 1);
    cr_assert_eq(pkv_seqset_validate(set, 1), PKV_OK);
    uint32_t taken;
    pkv_block_copy cp[1];
    cr_assert_eq(pkv_seqset_take_copies(set, cp, 1, &taken), PKV_OK);
}

Test(seqset, out_of_blocks_changes_nothing) {
    pkv_seq_id big = new_seq(60 * B + 3); // 61 blocks of 64
    pkv_seq_id child;
    cr_assert_eq(pkv_seq_fork(set, big, &child), PKV_OK);
    pkv_seq_id other = new_seq(2 * B); // 63 used, 1 free
    uint32_t free_before = pkv_pool_free_count(pool);
    cr_assert_eq(free_before, 1);
    // child needs a CoW block and a new block: 2 > 1.
    int64_t slots[B];
    slots[0] = -42;
    cr_assert_eq(pkv_seq_append(set, child, B, slots), PKV_ERR_OUT_OF_BLOCKS);
    cr_assert_eq(slots[0], -42, "no slot written on failure");
    cr_assert_eq(pkv_pool_free_count(pool), free_before);
    cr_assert_eq(seq_len(child), 60 * B + 3);
    cr_assert_eq(pkv_seqset_pending_copies(set), 0);
    const pkv_block_id *tb, *tc;
    uint32_t nb, nc;
    cr_assert_eq(pkv_seq_block_table(set, big, &tb, &nb), PKV_OK);
    cr_assert_eq(pkv_seq_block_table(set, child, &tc, &nc), PKV_OK);
    cr_assert_eq(memcmp(tb, tc, nb * sizeof *tb), 0, "still sharing everything");
    cr_assert_eq(pkv_seq_append(set, other, 2 * B, NULL), PKV_ERR_OUT_OF_BLOCKS);
    cr_assert_eq(seq_len(other), 2 * B);
    cr_assert_eq(pkv_seqset_validate(set, 1), PKV_OK);
    // One block fits: the CoW alone.
    cr_assert_eq(pkv_seq_append(set, child, 1, NULL), PKV_OK);
    cr_assert_eq(pkv_pool_free_count(pool), 0);
    uint32_t taken;
    pkv_block_copy cp[1];
    cr_assert_eq(pkv_seqset_take_copies(set, cp, 1, &taken), PKV_OK);
}

Test(seqset, invalid_ids_are_refused) {
    pkv_seq_id id = new_seq(3), out;
    cr_assert_eq(pkv_seq_free(set, id), PKV_OK);
    cr_assert_eq(pkv_seq_free(set, id), PKV_ERR_NOT_FOUND, "double free");
    cr_assert_eq(pkv_seq_append(set, id, 1, NULL), PKV_ERR_NOT_FOUND);
    cr_assert_eq(pkv_seq_fork(set, id, &out), PKV_ERR_NOT_FOUND);
    cr_assert_eq(pkv_seq_fork(set, -1, &out), PKV_ERR_NOT_FOUND);
    cr_assert_eq(pkv_seq_append(set, 12345, 1, NULL), PKV_ERR_NOT_FOUND);
    uint32_t len;
    cr_assert_eq(pkv_seq_length(set, id, &len), PKV_ERR_NOT_FOUND);
    const pkv_block_id *t;
    uint32_t n;
    cr_assert_eq(pkv_seq_block_table(set, id, &t, &n), PKV_ERR_NOT_FOUND);
    cr_assert_eq(pkv_seq_create(NULL, &out), PKV_ERR_INVALID_ARG);
    cr_assert_eq(pkv_seq_create(set, NULL), PKV_ERR_INVALID_ARG);
    cr_assert_eq(pkv_seq_append(NULL, 0, 1, NULL), PKV_ERR_INVALID_ARG);
    cr_assert_eq(pkv_seq_free(NULL, 0), PKV_ERR_INVALID_ARG);
    cr_assert_eq(pkv_seq_fork(set, 0, NULL), PKV_ERR_INVALID_ARG);
    cr_assert_eq(pkv_seq_length(set, 0, NULL), PKV_ERR_INVALID_ARG);
    cr_assert_eq(pkv_seq_block_table(set, 0, NULL, &n), PKV_ERR_INVALID_ARG);
    // A retired slot is reused under a new generation: the old id stays dead.
    pkv_seq_id again;
    cr_assert_eq(pkv_seq_create(set, &again), PKV_OK);
    cr_assert_neq(again, id);
    cr_assert_eq(again & 0xfffff, id & 0xfffff, "same slot");
    cr_assert_geq(again, 0);
    cr_assert_eq(pkv_seq_append(set, id, 1, NULL), PKV_ERR_NOT_FOUND);
    cr_assert_eq(seq_len(again), 0);
    cr_assert_eq(num_blocks(again), 0);
}

Test(seqset, huge_append_is_refused) {
    pkv_seq_id id = new_seq(1);
    cr_assert_eq(pkv_seq_append(set, id, UINT32_MAX, NULL), PKV_ERR_INVALID_ARG);
    cr_assert_eq(seq_len(id), 1);
}

Test(seqset, export_padded_and_csr) {
    pkv_seq_id a = new_seq(2 * B + 1), b = new_seq(0), c = new_seq(B);
    pkv_seq_id ids[3] = {a, b, c};
    int32_t table[3 * 4], lens[3];
    cr_assert_eq(pkv_seqset_export_padded(set, ids, 3, 4, -1, table, lens), PKV_OK);
    const pkv_block_id *ta, *tc;
    uint32_t na, nc;
    cr_assert_eq(pkv_seq_block_table(set, a, &ta, &na), PKV_OK);
    cr_assert_eq(pkv_seq_block_table(set, c, &tc, &nc), PKV_OK);
    int32_t expect[12] = {ta[0], ta[1], ta[2], -1, -1, -1, -1, -1, tc[0], -1, -1, -1};
    cr_assert_eq(memcmp(table, expect, sizeof expect), 0);
    cr_assert_eq(lens[0], 2 * B + 1);
    cr_assert_eq(lens[1], 0);
    cr_assert_eq(lens[2], B);
    cr_assert_eq(pkv_seqset_export_padded(set, ids, 3, 2, -1, table, NULL),
                 PKV_ERR_BUFFER_TOO_SMALL);
    pkv_seq_id bad[2] = {a, 77};
    cr_assert_eq(pkv_seqset_export_padded(set, bad, 2, 4, -1, table, lens), PKV_ERR_NOT_FOUND);

    int32_t indptr[4], indices[4], last[3];
    cr_assert_eq(pkv_seqset_export_csr(set, ids, 3, indptr, indices, 4, last), PKV_OK);
    int32_t e_indptr[4] = {0, 3, 3, 4}, e_indices[4] = {ta[0], ta[1], ta[2], tc[0]};
    int32_t e_last[3] = {1, 0, (int32_t)B};
    cr_assert_eq(memcmp(indptr, e_indptr, sizeof indptr), 0);
    cr_assert_eq(memcmp(indices, e_indices, sizeof indices), 0);
    cr_assert_eq(memcmp(last, e_last, sizeof last), 0);
    cr_assert_eq(pkv_seqset_export_csr(set, ids, 3, indptr, indices, 3, last),
                 PKV_ERR_BUFFER_TOO_SMALL);
    cr_assert_eq(pkv_seqset_export_csr(set, bad, 2, indptr, indices, 4, last), PKV_ERR_NOT_FOUND);
    cr_assert_eq(pkv_seqset_export_csr(set, ids, 3, NULL, indices, 4, last), PKV_ERR_INVALID_ARG);
}

Test(seqset, validate_catches_a_leaked_reference) {
    pkv_seq_id id = new_seq(B + 1);
    const pkv_block_id *t;
    uint32_t n;
    cr_assert_eq(pkv_seq_block_table(set, id, &t, &n), PKV_OK);
    cr_assert_eq(pkv_seqset_validate(set, 1), PKV_OK);
    cr_assert_eq(pkv_pool_retain(pool, t[0]), PKV_OK); // a reference nobody owns
    cr_assert_eq(pkv_seqset_validate(set, 1), PKV_ERR_CORRUPT);
    cr_assert_eq(pkv_seqset_validate(set, 0), PKV_OK, "non-exclusive: extra users allowed");
    cr_assert_eq(pkv_pool_release(pool, t[0]), PKV_OK);
    pkv_block_id stray;
    cr_assert_eq(pkv_pool_alloc(pool, 1, &stray), PKV_OK); // a block nobody owns
    cr_assert_eq(pkv_seqset_validate(set, 1), PKV_ERR_CORRUPT);
    cr_assert_eq(pkv_pool_release(pool, stray), PKV_OK);
    cr_assert_eq(pkv_seqset_validate(NULL, 1), PKV_ERR_INVALID_ARG);
}

// ---- issue 10: batch calls, stale ids, fork_at, truncate, watermark, group move ----

static pkv_block_id block_at(pkv_seq_id id, uint32_t i) {
    const pkv_block_id *t;
    uint32_t n;
    cr_assert_eq(pkv_seq_block_table(set, id, &t, &n), PKV_OK);
    cr_assert_lt(i, n);
    return t[i];
}

// Four forked samples with a shared partial block: summing the single-sequence
// predictions says 4, the batch call says 3 and the batch takes exactly 3.
Test(seqset, batch_blocks_needed_counts_shared_blocks_once) {
    pkv_seq_id s[4];
    s[0] = new_seq(B + 3);
    for (int i = 1; i < 4; i++) cr_assert_eq(pkv_seq_fork(set, s[0], &s[i]), PKV_OK);
    uint32_t sum = 0, one, batch;
    for (int i = 0; i < 4; i++) {
        cr_assert_eq(pkv_seq_blocks_needed(set, s[i], 1, &one), PKV_OK);
        sum += one;
    }
    cr_assert_eq(sum, 4, "each alone would copy");
    const uint32_t counts[4] = {1, 1, 1, 1};
    cr_assert_eq(pkv_seqset_blocks_needed_batch(set, s, counts, 4, &batch), PKV_OK);
    cr_assert_eq(batch, 3, "the last sharer writes in place");
    uint32_t before = pkv_pool_free_count(pool);
    int64_t slots[4];
    cr_assert_eq(pkv_seqset_append_batch(set, s, counts, 4, slots), PKV_OK);
    cr_assert_eq(before - pkv_pool_free_count(pool), batch);
    cr_assert_eq(pkv_seqset_pending_copies(set), 3);
    for (int i = 0; i < 4; i++)
        cr_assert_eq(slots[i], (int64_t)block_at(s[i], 1) * B + 3, "slot of sample %d", i);
    cr_assert_eq(pkv_seqset_copies_done(set), PKV_OK);
}

Test(seqset, batch_slots_are_in_batch_order) {
    pkv_seq_id a = new_seq(B - 1), b = new_seq(0);
    const pkv_seq_id ids[2] = {b, a};
    const uint32_t counts[2] = {2, 3};
    int64_t slots[5];
    cr_assert_eq(pkv_seqset_append_batch(set, ids, counts, 2, slots), PKV_OK);
    cr_assert_eq(slots[0], (int64_t)block_at(b, 0) * B);
    cr_assert_eq(slots[1], (int64_t)block_at(b, 0) * B + 1);
    cr_assert_eq(slots[2], (int64_t)block_at(a, 0) * B + B - 1);
    cr_assert_eq(slots[3], (int64_t)block_at(a, 1) * B);
    cr_assert_eq(slots[4], (int64_t)block_at(a, 1) * B + 1);
    cr_assert_eq(seq_len(a), B + 2);
    cr_assert_eq(pkv_seqset_append_batch(set, ids, counts, 0, NULL), PKV_OK, "empty batch");
    cr_assert_eq(pkv_seqset_append_batch(set, NULL, NULL, 0, NULL), PKV_OK);
    cr_assert_eq(pkv_seqset_append_batch(set, NULL, counts, 1, NULL), PKV_ERR_INVALID_ARG);
}

Test(seqset, batch_is_all_or_nothing) {
    pkv_seq_id a = new_seq(B), b = new_seq(B), c;
    cr_assert_eq(pkv_seq_fork(set, b, &c), PKV_OK);
    cr_assert_eq(pkv_seq_truncate(set, c, B - 2), PKV_OK); // c shares a partial block
    uint32_t free_before = pkv_pool_free_count(pool);
    const pkv_seq_id ids[3] = {a, c, b};
    uint32_t counts[3] = {1, 1, free_before * B}; // b alone takes every free block
    uint32_t need;
    cr_assert_eq(pkv_seqset_blocks_needed_batch(set, ids, counts, 3, &need), PKV_OK);
    cr_assert_eq(need, 1 + 1 + free_before);
    cr_assert_eq(pkv_seqset_append_batch(set, ids, counts, 3, NULL), PKV_ERR_OUT_OF_BLOCKS);
    cr_assert_eq(pkv_pool_free_count(pool), free_before, "a refused batch takes nothing");
    cr_assert_eq(seq_len(a), B);
    cr_assert_eq(seq_len(b), B);
    cr_assert_eq(seq_len(c), B - 2);
    cr_assert_eq(pkv_seqset_pending_copies(set), 0, "and queues no copy");
    // Duplicates and stale ids are refused before anything happens.
    const pkv_seq_id dup[2] = {a, a};
    cr_assert_eq(pkv_seqset_append_batch(set, dup, counts, 2, NULL), PKV_ERR_INVALID_ARG);
    cr_assert_eq(pkv_seqset_blocks_needed_batch(set, dup, counts, 2, &need), PKV_ERR_INVALID_ARG);
    cr_assert_eq(pkv_seqset_free_batch(set, dup, 2), PKV_ERR_INVALID_ARG);
    pkv_seq_id gone = new_seq(1);
    cr_assert_eq(pkv_seq_free(set, gone), PKV_OK);
    const pkv_seq_id stale[2] = {a, gone};
    counts[1] = 1;
    cr_assert_eq(pkv_seqset_append_batch(set, stale, counts, 2, NULL), PKV_ERR_NOT_FOUND);
    cr_assert_eq(seq_len(a), B, "the live sequence before the stale one did not grow");
    cr_assert_eq(pkv_seqset_free_batch(set, stale, 2), PKV_ERR_NOT_FOUND);
    cr_assert_eq(seq_len(a), B, "free_batch freed nothing");
    const pkv_seq_id all[3] = {a, b, c};
    cr_assert_eq(pkv_seqset_free_batch(set, all, 3), PKV_OK);
    cr_assert_eq(pkv_seqset_live_count(set), 0);
    cr_assert_eq(pkv_pool_free_count(pool), 64);
}

// Issue 10 gap 4: create, free, create, then append on the old id used to grow
// the new sequence.
Test(seqset, stale_ids_are_rejected_everywhere) {
    pkv_seq_id old = new_seq(3);
    cr_assert_eq(pkv_seq_free(set, old), PKV_OK);
    pkv_seq_id fresh = new_seq(5);
    cr_assert_eq(fresh & 0xfffff, old & 0xfffff, "the slot is reused");
    uint32_t u, cap = 4;
    uint64_t total;
    const pkv_block_id *t;
    int64_t slot;
    pkv_seq_id child;
    int32_t table[4], lens[1], indptr[2], indices[4], last[1];
    pkv_block_copy pairs[4];
    cr_assert_eq(pkv_seq_append(set, old, 1, &slot), PKV_ERR_NOT_FOUND);
    cr_assert_eq(pkv_seq_blocks_needed(set, old, 1, &u), PKV_ERR_NOT_FOUND);
    cr_assert_eq(pkv_seq_length(set, old, &u), PKV_ERR_NOT_FOUND);
    cr_assert_eq(pkv_seq_block_table(set, old, &t, &u), PKV_ERR_NOT_FOUND);
    cr_assert_eq(pkv_seq_fork(set, old, &child), PKV_ERR_NOT_FOUND);
    cr_assert_eq(pkv_seq_fork_at(set, old, 0, &child), PKV_ERR_NOT_FOUND);
    cr_assert_eq(pkv_seq_truncate(set, old, 0), PKV_ERR_NOT_FOUND);
    cr_assert_eq(pkv_seq_free(set, old), PKV_ERR_NOT_FOUND);
    cr_assert_eq(pkv_seqset_export_padded(set, &old, 1, 4, -1, table, lens), PKV_ERR_NOT_FOUND);
    cr_assert_eq(pkv_seqset_export_csr(set, &old, 1, indptr, indices, 4, last), PKV_ERR_NOT_FOUND);
    cr_assert_eq(pkv_seqset_export_size(set, &old, 1, &u, &total), PKV_ERR_NOT_FOUND);
    cr_assert_eq(pkv_seqset_blocks_needed_batch(set, &old, &cap, 1, &u), PKV_ERR_NOT_FOUND);
    cr_assert_eq(pkv_seqset_free_batch(set, &old, 1), PKV_ERR_NOT_FOUND);
    pkv_pool *p2;
    pkv_seqset *s2;
    pkv_seq_id moved;
    cr_assert_eq(pkv_pool_create(8, &p2), PKV_OK);
    cr_assert_eq(pkv_seqset_create(p2, B, &s2), PKV_OK);
    cr_assert_eq(pkv_seq_move_group(set, &old, 1, s2, &moved, pairs, 4, &u), PKV_ERR_NOT_FOUND);
    cr_assert_eq(pkv_seq_move(set, old, s2, &moved, pairs, 4, &u), PKV_ERR_NOT_FOUND);
    pkv_seqset_destroy(s2);
    pkv_pool_destroy(p2);
    cr_assert_eq(seq_len(fresh), 5, "the new sequence was not touched");
    cr_assert_eq(pkv_seq_append(set, -1, 1, NULL), PKV_ERR_NOT_FOUND);
    cr_assert_eq(pkv_seq_append(set, INT32_MAX, 1, NULL), PKV_ERR_NOT_FOUND);
}

// A slot reused many times never revives an old id (until the 11-bit generation
// wraps after 2048 lives, which is the documented limit).
Test(seqset, generations_do_not_repeat_within_2048_lives) {
    pkv_seq_id first = new_seq(0), id = first;
    for (int i = 0; i < 2047; i++) {
        cr_assert_eq(pkv_seq_free(set, id), PKV_OK);
        cr_assert_eq(pkv_seq_create(set, &id), PKV_OK);
        cr_assert_neq(id, first, "life %d", i + 1);
        cr_assert_eq(pkv_seq_length(set, first, &(uint32_t){0}), PKV_ERR_NOT_FOUND);
    }
}

Test(seqset, id_space_limit, .timeout = 60) {
    // 2^20 live sequences at most: the next create says PKV_ERR_LIMIT.
    pkv_seq_id id;
    for (uint32_t i = 0; i < (1u << 20); i++)
        if (pkv_seq_create(set, &id) != PKV_OK) cr_assert_fail("create %u failed", i);
    cr_assert_eq(pkv_seq_create(set, &id), PKV_ERR_LIMIT);
    cr_assert_eq(pkv_seq_fork(set, id, &id), PKV_ERR_LIMIT);
    cr_assert_eq(pkv_seqset_live_count(set), 1u << 20);
}

Test(seqset, fork_at_shares_a_prefix) {
    pkv_seq_id p = new_seq(3 * B + 4), c0, c1, c2;
    cr_assert_eq(pkv_seq_fork_at(set, p, 3 * B + 5, &c0), PKV_ERR_INVALID_ARG, "past the end");
    uint32_t before = pkv_pool_free_count(pool);
    cr_assert_eq(pkv_seq_fork_at(set, p, B + 2, &c1), PKV_OK);
    cr_assert_eq(pkv_seq_fork_at(set, p, 2 * B, &c2), PKV_OK);
    cr_assert_eq(pkv_seq_fork_at(set, p, 0, &c0), PKV_OK);
    cr_assert_eq(pkv_pool_free_count(pool), before, "forks take no blocks");
    cr_assert_eq(seq_len(c1), B + 2);
    cr_assert_eq(num_blocks(c1), 2);
    cr_assert_eq(num_blocks(c0), 0);
    cr_assert_eq(block_at(c1, 1), block_at(p, 1), "the partial block is shared");
    cr_assert_eq(pkv_pool_refcount(pool, block_at(p, 1)), 3);
    // The child appends into the shared block: copy-on-write.
    int64_t slot;
    cr_assert_eq(pkv_seq_append(set, c1, 1, &slot), PKV_OK);
    cr_assert_eq(pkv_seqset_pending_copies(set), 1);
    cr_assert_neq(block_at(c1, 1), block_at(p, 1));
    cr_assert_eq(slot, (int64_t)block_at(c1, 1) * B + 2);
    // A fork at a block boundary appends into a fresh block: no copy.
    cr_assert_eq(pkv_seq_append(set, c2, 1, NULL), PKV_OK);
    cr_assert_eq(pkv_seqset_pending_copies(set), 1);
    cr_assert_eq(pkv_seqset_copies_done(set), PKV_OK);
}

Test(seqset, truncate_releases_the_suffix) {
    pkv_seq_id a = new_seq(3 * B + 1);
    uint32_t before = pkv_pool_free_count(pool);
    cr_assert_eq(pkv_seq_truncate(set, a, 3 * B + 2), PKV_ERR_INVALID_ARG, "cannot grow");
    cr_assert_eq(pkv_seq_truncate(set, a, B + 3), PKV_OK);
    cr_assert_eq(seq_len(a), B + 3);
    cr_assert_eq(num_blocks(a), 2);
    cr_assert_eq(pkv_pool_free_count(pool), before + 2);
    // Not shared: appending again writes in place into the kept partial block.
    int64_t slot;
    cr_assert_eq(pkv_seq_append(set, a, 1, &slot), PKV_OK);
    cr_assert_eq(slot, (int64_t)block_at(a, 1) * B + 3);
    cr_assert_eq(pkv_seqset_pending_copies(set), 0);
    // Shared with a fork: the kept block is copied before it is written.
    pkv_seq_id f;
    cr_assert_eq(pkv_seq_fork(set, a, &f), PKV_OK);
    cr_assert_eq(pkv_seq_truncate(set, a, B + 1), PKV_OK);
    cr_assert_eq(pkv_seq_append(set, a, 1, &slot), PKV_OK);
    cr_assert_eq(pkv_seqset_pending_copies(set), 1, "a shared kept block is copied");
    cr_assert_eq(seq_len(f), B + 4, "the fork keeps its tokens");
    cr_assert_eq(pkv_seqset_copies_done(set), PKV_OK);
    cr_assert_eq(pkv_seq_truncate(set, f, 0), PKV_OK);
    cr_assert_eq(num_blocks(f), 0);
    cr_assert_eq(pkv_seq_truncate(NULL, f, 0), PKV_ERR_INVALID_ARG);
}

Test(seqset, watermark_refuses_growth_below_it) {
    cr_assert_eq(pkv_seqset_set_watermark(set, 10), PKV_OK);
    cr_assert_eq(pkv_seqset_watermark(set), 10);
    cr_assert_eq(pkv_seqset_set_watermark(NULL, 1), PKV_ERR_INVALID_ARG);
    pkv_seq_id a = new_seq(54 * B); // leaves exactly 10 free
    cr_assert_eq(pkv_pool_free_count(pool), 10);
    cr_assert_eq(pkv_seq_append(set, a, 1, NULL), PKV_ERR_OUT_OF_BLOCKS, "would leave 9");
    const uint32_t one = 1;
    cr_assert_eq(pkv_seqset_append_batch(set, &a, &one, 1, NULL), PKV_ERR_OUT_OF_BLOCKS);
    cr_assert_eq(pkv_pool_free_count(pool), 10);
    pkv_seq_id f;
    cr_assert_eq(pkv_seq_fork(set, a, &f), PKV_OK, "forks take nothing");
    cr_assert_eq(pkv_seq_truncate(set, f, B + 1), PKV_OK);
    cr_assert_eq(pkv_seq_append(set, f, 1, NULL), PKV_ERR_OUT_OF_BLOCKS, "a copy is growth too");
    cr_assert_eq(pkv_seq_free(set, f), PKV_OK);
    cr_assert_eq(pkv_seq_truncate(set, a, 54 * B - 2), PKV_OK);
    cr_assert_eq(pkv_seq_append(set, a, 2, NULL), PKV_OK, "no new block needed");
    cr_assert_eq(pkv_seqset_set_watermark(set, 0), PKV_OK);
    cr_assert_eq(pkv_seq_append(set, a, 1, NULL), PKV_OK, "0 disables it");
}

Test(seqset, too_small_buffers_report_the_size_needed) {
    pkv_seq_id s[3];
    s[0] = new_seq(B + 1);
    cr_assert_eq(pkv_seq_fork(set, s[0], &s[1]), PKV_OK);
    cr_assert_eq(pkv_seq_fork(set, s[0], &s[2]), PKV_OK);
    const uint32_t ones[3] = {1, 1, 1};
    cr_assert_eq(pkv_seqset_append_batch(set, s, ones, 3, NULL), PKV_OK);
    uint32_t n = 0;
    pkv_block_copy copies[2];
    cr_assert_eq(pkv_seqset_take_copies(set, copies, 1, &n), PKV_ERR_BUFFER_TOO_SMALL);
    cr_assert_eq(n, 2, "the number needed");
    cr_assert_eq(pkv_seqset_take_copies(set, copies, n, &n), PKV_OK);
    pkv_seq_id long_one = new_seq(5 * B);
    const pkv_seq_id ids[2] = {s[0], long_one};
    uint32_t mx;
    uint64_t total;
    cr_assert_eq(pkv_seqset_export_size(set, ids, 2, &mx, &total), PKV_OK);
    cr_assert_eq(mx, 5);
    cr_assert_eq(total, 7);
    int32_t table[10], indptr[3], indices[7], last[2];
    cr_assert_eq(pkv_seqset_export_padded(set, ids, 2, mx - 1, -1, table, NULL),
                 PKV_ERR_BUFFER_TOO_SMALL);
    cr_assert_eq(pkv_seqset_export_padded(set, ids, 2, mx, -1, table, NULL), PKV_OK);
    cr_assert_eq(pkv_seqset_export_csr(set, ids, 2, indptr, indices, 6, last),
                 PKV_ERR_BUFFER_TOO_SMALL);
    cr_assert_eq(pkv_seqset_export_csr(set, ids, 2, indptr, indices, (uint32_t)total, last), PKV_OK);
}

// Issue 10 gap 3: four samples on 6 distinct blocks take 6 blocks on swap-out.
Test(seqset, move_group_keeps_sharing) {
    pkv_pool *hp;
    pkv_seqset *host;
    cr_assert_eq(pkv_pool_create(16, &hp), PKV_OK);
    cr_assert_eq(pkv_seqset_create(hp, B, &host), PKV_OK);
    pkv_seq_id s[4];
    s[0] = new_seq(2 * B + 3); // 3 blocks, the last partial and shared by all four
    for (int i = 1; i < 4; i++) cr_assert_eq(pkv_seq_fork(set, s[0], &s[i]), PKV_OK);
    const uint32_t counts[4] = {0, 1, 1, 1};
    cr_assert_eq(pkv_seqset_append_batch(set, s, counts, 4, NULL), PKV_OK); // 3 copies
    cr_assert_eq(pkv_seqset_copies_done(set), PKV_OK);
    uint32_t distinct = 6; // 2 full shared + the original partial + 3 copies
    uint32_t dev_free = pkv_pool_free_count(pool);
    pkv_block_copy pairs[8];
    pkv_seq_id moved[4];
    uint32_t np = 0;
    cr_assert_eq(pkv_seq_move_group(set, s, 4, host, moved, pairs, distinct - 1, &np),
                 PKV_ERR_BUFFER_TOO_SMALL);
    cr_assert_eq(np, distinct, "reports the pairs needed");
    cr_assert_eq(pkv_seqset_live_count(host), 0, "and changed nothing");
    const pkv_seq_id dup[2] = {s[0], s[0]};
    cr_assert_eq(pkv_seq_move_group(set, dup, 2, host, moved, pairs, 8, &np), PKV_ERR_INVALID_ARG);
    cr_assert_eq(pkv_seq_move_group(set, s, 4, set, moved, pairs, 8, &np), PKV_ERR_INVALID_ARG);
    cr_assert_eq(pkv_seqset_set_watermark(host, 11), PKV_OK);
    cr_assert_eq(pkv_seq_move_group(set, s, 4, host, moved, pairs, 8, &np), PKV_ERR_OUT_OF_BLOCKS,
                 "16 - 6 < 11");
    cr_assert_eq(pkv_seqset_set_watermark(host, 0), PKV_OK);
    // Remember each sample's device table to check the pairs.
    pkv_block_id before[4][3];
    for (int i = 0; i < 4; i++)
        for (uint32_t j = 0; j < 3; j++) before[i][j] = block_at(s[i], j);
    cr_assert_eq(pkv_seq_move_group(set, s, 4, host, moved, pairs, 8, &np), PKV_OK);
    cr_assert_eq(np, distinct);
    cr_assert_eq(pkv_pool_free_count(hp), 16 - distinct, "6 device blocks -> 6 host blocks");
    cr_assert_eq(pkv_pool_free_count(pool), dev_free + distinct);
    cr_assert_eq(pkv_seqset_live_count(set), 0);
    for (int i = 0; i < 4; i++) {
        const pkv_block_id *t;
        uint32_t nb, len;
        cr_assert_eq(pkv_seq_block_table(host, moved[i], &t, &nb), PKV_OK);
        cr_assert_eq(pkv_seq_length(host, moved[i], &len), PKV_OK);
        cr_assert_eq(len, i == 0 ? 2 * B + 3 : 2 * B + 4);
        for (uint32_t j = 0; j < nb; j++) {
            int found = 0;
            for (uint32_t k = 0; k < np; k++)
                found += pairs[k].src == before[i][j] && pairs[k].dst == t[j];
            cr_assert_eq(found, 1, "sample %d block %u maps through one pair", i, j);
        }
        for (uint32_t j = 0; j < 2; j++)
            cr_assert_eq(pkv_pool_refcount(hp, t[j]), 4, "full blocks shared by all four");
    }
    cr_assert_eq(pkv_seqset_validate(host, 1), PKV_OK);
    // And back again, still 6.
    pkv_seq_id back[4];
    cr_assert_eq(pkv_seq_move_group(host, moved, 4, set, back, pairs, 8, &np), PKV_OK);
    cr_assert_eq(np, distinct);
    cr_assert_eq(pkv_pool_free_count(hp), 16);
    cr_assert_eq(pkv_seqset_free_batch(set, back, 4), PKV_OK);
    pkv_seqset_destroy(host);
    pkv_pool_destroy(hp);
}

// Issue 15, defect 11 through the set: a fork that would push a refcount past
// INT32_MAX is refused whole.
Test(seqset, fork_refuses_a_saturated_refcount) {
    pkv_seq_id a = new_seq(2 * B);
    pkv_block_id b1 = block_at(a, 1);
    pool->refcount[b1] = INT32_MAX; // white-box (pool_internal.h): 2^31 retains take minutes
    uint32_t before = pkv_pool_refcount(pool, block_at(a, 0));
    pkv_seq_id f;
    cr_assert_eq(pkv_seq_fork(set, a, &f), PKV_ERR_LIMIT);
    cr_assert_eq((uint32_t)pkv_pool_refcount(pool, block_at(a, 0)), before, "nothing retained");
    cr_assert_eq(pkv_seqset_live_count(set), 1);
    cr_assert_eq(pkv_seq_fork_at(set, a, B, &f), PKV_OK, "the first block alone is fine");
    pool->refcount[b1] = 1; // the references the set holds: teardown's exclusive check
}

// Issue 20, defect 8: an empty sequence (no block table yet) in a moved group.
// The old code called memcpy(uniq + t, NULL, 0), undefined behaviour that the
// sanitizer builds of CI (-fsanitize=undefined, halt_on_error) stop on.
Test(seqset, move_group_with_empty_sequences) {
    pkv_pool *hp;
    pkv_seqset *host;
    cr_assert_eq(pkv_pool_create(16, &hp), PKV_OK);
    cr_assert_eq(pkv_seqset_create(hp, B, &host), PKV_OK);
    pkv_seq_id s[3];
    cr_assert_eq(pkv_seq_create(set, &s[0]), PKV_OK); // empty
    s[1] = new_seq(B + 1);
    cr_assert_eq(pkv_seq_create(set, &s[2]), PKV_OK); // empty
    pkv_block_copy pairs[4];
    pkv_seq_id moved[3];
    uint32_t np = 99;
    cr_assert_eq(pkv_seq_move_group(set, s, 3, host, moved, pairs, 4, &np), PKV_OK);
    cr_assert_eq(np, 2, "the one non-empty sequence's two blocks");
    const uint32_t want[3] = {0, B + 1, 0};
    for (int i = 0; i < 3; i++) {
        uint32_t len;
        cr_assert_eq(pkv_seq_length(host, moved[i], &len), PKV_OK);
        cr_assert_eq(len, want[i], "sequence %d: %u tokens", i, len);
    }
    cr_assert_eq(pkv_pool_free_count(hp), 14);
    // Only empty sequences: nothing to copy, nothing taken.
    pkv_seq_id e[2], me[2];
    cr_assert_eq(pkv_seq_create(set, &e[0]), PKV_OK);
    cr_assert_eq(pkv_seq_create(set, &e[1]), PKV_OK);
    cr_assert_eq(pkv_seq_move_group(set, e, 2, host, me, pairs, 0, &np), PKV_OK);
    cr_assert_eq(np, 0);
    cr_assert_eq(pkv_pool_free_count(hp), 14);
    pkv_seqset_destroy(host);
    pkv_pool_destroy(hp);
}

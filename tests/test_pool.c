// SPDX-License-Identifier: MIT
// Unit tests of the block pool: every function and every error path.
#include <criterion/criterion.h>
#include <stdlib.h>

#include "pkv/pool.h"
#include "src/allocator/pool_internal.h" // white-box: see retain_stops_at_int32_max

static pkv_pool *make_pool(uint32_t n) {
    pkv_pool *pool = NULL;
    cr_assert_eq(pkv_pool_create(n, &pool), PKV_OK);
    cr_assert_not_null(pool);
    return pool;
}

Test(pool, create_rejects_bad_sizes) {
    pkv_pool *pool = (pkv_pool *)1;
    cr_assert_eq(pkv_pool_create(0, &pool), PKV_ERR_INVALID_ARG);
    cr_assert_null(pool, "out must be cleared on failure");
    cr_assert_eq(pkv_pool_create(PKV_POOL_MAX_BLOCKS + 1, &pool), PKV_ERR_INVALID_ARG);
    cr_assert_eq(pkv_pool_create(4, NULL), PKV_ERR_INVALID_ARG);
    pkv_pool_destroy(NULL); // must do nothing
}

Test(pool, fresh_pool_is_all_free_and_valid) {
    pkv_pool *pool = make_pool(8);
    cr_assert_eq(pkv_pool_capacity(pool), 8);
    cr_assert_eq(pkv_pool_free_count(pool), 8);
    for (int b = 0; b < 8; b++) cr_assert_eq(pkv_pool_refcount(pool, b), 0);
    cr_assert_eq(pkv_pool_validate(pool), PKV_OK);
    pkv_pool_destroy(pool);
}

Test(pool, alloc_gives_distinct_live_blocks) {
    pkv_pool *pool = make_pool(8);
    pkv_block_id ids[8];
    cr_assert_eq(pkv_pool_alloc(pool, 5, ids), PKV_OK);
    cr_assert_eq(pkv_pool_free_count(pool), 3);
    for (int i = 0; i < 5; i++) {
        cr_assert(ids[i] >= 0 && ids[i] < 8);
        cr_assert_eq(pkv_pool_refcount(pool, ids[i]), 1);
        for (int j = 0; j < i; j++) cr_assert_neq(ids[i], ids[j]);
    }
    cr_assert_eq(pkv_pool_validate(pool), PKV_OK);
    pkv_pool_destroy(pool);
}

Test(pool, alloc_is_all_or_nothing) {
    pkv_pool *pool = make_pool(4);
    pkv_block_id ids[5] = {-7, -7, -7, -7, -7};
    cr_assert_eq(pkv_pool_alloc(pool, 5, ids), PKV_ERR_OUT_OF_BLOCKS);
    cr_assert_eq(pkv_pool_free_count(pool), 4, "a failed alloc must take nothing");
    for (int i = 0; i < 5; i++) cr_assert_eq(ids[i], -7, "a failed alloc must write nothing");
    cr_assert_eq(pkv_pool_alloc(pool, 4, ids), PKV_OK);
    cr_assert_eq(pkv_pool_alloc(pool, 1, ids + 4), PKV_ERR_OUT_OF_BLOCKS);
    pkv_pool_stats st;
    cr_assert_eq(pkv_pool_get_stats(pool, &st), PKV_OK);
    cr_assert_eq(st.alloc_failures, 2);
    cr_assert_eq(st.peak_used, 4);
    cr_assert_eq(st.used_blocks, 4);
    cr_assert_eq(pkv_pool_validate(pool), PKV_OK);
    pkv_pool_destroy(pool);
}

Test(pool, alloc_zero_and_null_args) {
    pkv_pool *pool = make_pool(4);
    cr_assert_eq(pkv_pool_alloc(pool, 0, NULL), PKV_OK);
    cr_assert_eq(pkv_pool_alloc(pool, 1, NULL), PKV_ERR_INVALID_ARG);
    pkv_block_id id;
    cr_assert_eq(pkv_pool_alloc(NULL, 1, &id), PKV_ERR_INVALID_ARG);
    cr_assert_eq(pkv_pool_free_count(pool), 4);
    cr_assert_eq(pkv_pool_get_stats(pool, NULL), PKV_ERR_INVALID_ARG);
    cr_assert_eq(pkv_pool_get_stats(NULL, &(pkv_pool_stats){0}), PKV_ERR_INVALID_ARG);
    cr_assert_eq(pkv_pool_capacity(NULL), 0);
    cr_assert_eq(pkv_pool_free_count(NULL), 0);
    cr_assert_eq(pkv_pool_refcount(NULL, 0), -1);
    cr_assert_eq(pkv_pool_validate(NULL), PKV_ERR_INVALID_ARG);
    pkv_pool_destroy(pool);
}

Test(pool, retain_release_refcounts) {
    pkv_pool *pool = make_pool(2);
    pkv_block_id id;
    cr_assert_eq(pkv_pool_alloc(pool, 1, &id), PKV_OK);
    cr_assert_eq(pkv_pool_retain(pool, id), PKV_OK);
    cr_assert_eq(pkv_pool_refcount(pool, id), 2);
    cr_assert_eq(pkv_pool_release(pool, id), PKV_OK);
    cr_assert_eq(pkv_pool_free_count(pool), 1, "still referenced once");
    cr_assert_eq(pkv_pool_release(pool, id), PKV_OK);
    cr_assert_eq(pkv_pool_free_count(pool), 2);
    cr_assert_eq(pkv_pool_refcount(pool, id), 0);
    cr_assert_eq(pkv_pool_validate(pool), PKV_OK);
    pkv_pool_destroy(pool);
}

Test(pool, bad_ids_and_double_release_are_refused) {
    pkv_pool *pool = make_pool(2);
    pkv_block_id id;
    cr_assert_eq(pkv_pool_alloc(pool, 1, &id), PKV_OK);
    cr_assert_eq(pkv_pool_release(pool, id), PKV_OK);
    cr_assert_eq(pkv_pool_release(pool, id), PKV_ERR_NOT_FOUND, "double release");
    cr_assert_eq(pkv_pool_retain(pool, id), PKV_ERR_NOT_FOUND, "retain of a free block");
    cr_assert_eq(pkv_pool_release(pool, -1), PKV_ERR_NOT_FOUND);
    cr_assert_eq(pkv_pool_release(pool, 2), PKV_ERR_NOT_FOUND);
    cr_assert_eq(pkv_pool_retain(pool, 99), PKV_ERR_NOT_FOUND);
    cr_assert_eq(pkv_pool_retain(NULL, 0), PKV_ERR_INVALID_ARG);
    cr_assert_eq(pkv_pool_release(NULL, 0), PKV_ERR_INVALID_ARG);
    cr_assert_eq(pkv_pool_refcount(pool, 2), -1);
    cr_assert_eq(pkv_pool_free_count(pool), 2, "no error may change the free list");
    cr_assert_eq(pkv_pool_validate(pool), PKV_OK);
    pkv_pool_destroy(pool);
}

// Issue 15, defect 11: the refcount used to wrap to INT32_MIN. 2^31 retains
// would take minutes under the sanitizers, so the test reaches into the pool's
// layout (src/allocator/pool_internal.h) to start next to the limit.
Test(pool, retain_stops_at_int32_max) {
    pkv_pool *pool = make_pool(2);
    pkv_block_id id;
    cr_assert_eq(pkv_pool_alloc(pool, 1, &id), PKV_OK);
    pool->refcount[id] = INT32_MAX - 1;
    cr_assert_eq(pkv_pool_retain(pool, id), PKV_OK);
    cr_assert_eq(pkv_pool_refcount(pool, id), INT32_MAX);
    cr_assert_eq(pkv_pool_retain(pool, id), PKV_ERR_LIMIT);
    cr_assert_eq(pkv_pool_refcount(pool, id), INT32_MAX, "a refused retain changes nothing");
    cr_assert_eq(pkv_pool_validate(pool), PKV_OK);
    cr_assert_eq(pkv_pool_release(pool, id), PKV_OK);
    cr_assert_eq(pkv_pool_retain(pool, id), PKV_OK, "room again after one release");
    pool->refcount[id] = 1;
    cr_assert_eq(pkv_pool_release(pool, id), PKV_OK);
    cr_assert_eq(pkv_pool_free_count(pool), 2);
    pkv_pool_destroy(pool);
}

Test(pool, release_n_checks_everything_first) {
    pkv_pool *pool = make_pool(4);
    pkv_block_id ids[4];
    cr_assert_eq(pkv_pool_alloc(pool, 3, ids), PKV_OK);
    pkv_block_id bad[3] = {ids[0], ids[1], 3}; // block 3 is free
    cr_assert_eq(pkv_pool_release_n(pool, bad, 3), PKV_ERR_NOT_FOUND);
    cr_assert_eq(pkv_pool_refcount(pool, ids[0]), 1, "a refused release_n changes nothing");
    cr_assert_eq(pkv_pool_refcount(pool, ids[1]), 1);
    // A duplicate needs two references.
    pkv_block_id dup[2] = {ids[2], ids[2]};
    cr_assert_eq(pkv_pool_release_n(pool, dup, 2), PKV_ERR_NOT_FOUND);
    cr_assert_eq(pkv_pool_refcount(pool, ids[2]), 1);
    cr_assert_eq(pkv_pool_retain(pool, ids[2]), PKV_OK);
    cr_assert_eq(pkv_pool_release_n(pool, dup, 2), PKV_OK);
    cr_assert_eq(pkv_pool_refcount(pool, ids[2]), 0);
    cr_assert_eq(pkv_pool_release_n(pool, ids, 2), PKV_OK);
    cr_assert_eq(pkv_pool_free_count(pool), 4);
    cr_assert_eq(pkv_pool_validate(pool), PKV_OK);
    cr_assert_eq(pkv_pool_release_n(pool, NULL, 1), PKV_ERR_INVALID_ARG);
    cr_assert_eq(pkv_pool_release_n(pool, NULL, 0), PKV_OK);
    pkv_pool_destroy(pool);
}

Test(pool, freed_blocks_are_reused_lifo_and_never_lost) {
    enum { N = 64 };
    pkv_pool *pool = make_pool(N);
    pkv_block_id ids[N];
    cr_assert_eq(pkv_pool_alloc(pool, N, ids), PKV_OK);
    cr_assert_eq(pkv_pool_free_count(pool), 0);
    // Release in a scrambled order: free-order independence.
    for (int i = 0; i < N; i++) cr_assert_eq(pkv_pool_release(pool, ids[(i * 37) % N]), PKV_OK);
    cr_assert_eq(pkv_pool_free_count(pool), N);
    pkv_block_id again;
    cr_assert_eq(pkv_pool_alloc(pool, 1, &again), PKV_OK);
    cr_assert_eq(again, ids[((N - 1) * 37) % N], "the last block freed is handed out first");
    cr_assert_eq(pkv_pool_release(pool, again), PKV_OK);
    cr_assert_eq(pkv_pool_alloc(pool, N, ids), PKV_OK, "every block is still there");
    cr_assert_eq(pkv_pool_validate(pool), PKV_OK);
    pkv_pool_destroy(pool);
}

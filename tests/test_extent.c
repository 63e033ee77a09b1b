// SPDX-License-Identifier: MIT
// Tests for the free-extent allocator (src/allocator/extent.c): placement
// rules, coalescing, in-place growth, error paths, and a randomized run checked
// against a naive occupancy bitmap after every operation.
#include <criterion/criterion.h>
#include <stdlib.h>

#include "../src/allocator/extent.h"

Test(extent, create_rejects_bad_args) {
    pkvi_extent_alloc *ea = NULL;
    cr_expect_eq(pkvi_extent_create(0, PKVI_EXTENT_FIRST_FIT, &ea), PKV_ERR_INVALID_ARG);
    cr_expect_eq(pkvi_extent_create(10, (pkvi_extent_fit)7, &ea), PKV_ERR_INVALID_ARG);
    cr_expect_eq(pkvi_extent_create(10, PKVI_EXTENT_FIRST_FIT, NULL), PKV_ERR_INVALID_ARG);
    pkvi_extent_destroy(NULL);
}

Test(extent, first_fit_places_lowest_and_coalesces) {
    pkvi_extent_alloc *ea;
    cr_assert_eq(pkvi_extent_create(100, PKVI_EXTENT_FIRST_FIT, &ea), PKV_OK);
    uint64_t a, b, c;
    cr_assert_eq(pkvi_extent_alloc_units(ea, 10, &a), PKV_OK);
    cr_assert_eq(pkvi_extent_alloc_units(ea, 20, &b), PKV_OK);
    cr_assert_eq(pkvi_extent_alloc_units(ea, 30, &c), PKV_OK);
    cr_expect_eq(a, 0);
    cr_expect_eq(b, 10);
    cr_expect_eq(c, 30);
    cr_expect_eq(pkvi_extent_free_total(ea), 40);
    // Free the middle: two free extents (10..30 and 60..100); largest is 40.
    cr_assert_eq(pkvi_extent_free_units(ea, b, 20), PKV_OK);
    pkvi_extent_stats s;
    pkvi_extent_get_stats(ea, &s);
    cr_expect_eq(s.free_extents, 2);
    cr_expect_eq(s.largest_free, 40);
    // 15 fits the hole at 10 under first fit.
    uint64_t d;
    cr_assert_eq(pkvi_extent_alloc_units(ea, 15, &d), PKV_OK);
    cr_expect_eq(d, 10);
    // Free everything: one extent of 100 again.
    cr_assert_eq(pkvi_extent_free_units(ea, a, 10), PKV_OK);
    cr_assert_eq(pkvi_extent_free_units(ea, d, 15), PKV_OK);
    cr_assert_eq(pkvi_extent_free_units(ea, c, 30), PKV_OK);
    pkvi_extent_get_stats(ea, &s);
    cr_expect_eq(s.free_extents, 1);
    cr_expect_eq(s.largest_free, 100);
    cr_expect_eq(pkvi_extent_validate(ea), PKV_OK);
    pkvi_extent_destroy(ea);
}

Test(extent, best_fit_takes_smallest_hole) {
    pkvi_extent_alloc *ea;
    cr_assert_eq(pkvi_extent_create(100, PKVI_EXTENT_BEST_FIT, &ea), PKV_OK);
    uint64_t o[5];
    // [0,30) [30,40) [40,60) [60,65) [65,100)
    const uint64_t sz[5] = {30, 10, 20, 5, 35};
    for (int i = 0; i < 5; i++) cr_assert_eq(pkvi_extent_alloc_units(ea, sz[i], &o[i]), PKV_OK);
    cr_assert_eq(pkvi_extent_free_units(ea, o[0], 30), PKV_OK); // hole 30 at 0
    cr_assert_eq(pkvi_extent_free_units(ea, o[2], 20), PKV_OK); // hole 20 at 40
    uint64_t x;
    cr_assert_eq(pkvi_extent_alloc_units(ea, 18, &x), PKV_OK);
    cr_expect_eq(x, 40, "best fit should pick the 20-slot hole, got %llu", (unsigned long long)x);
    pkvi_extent_destroy(ea);
}

Test(extent, external_fragmentation_refuses_large_request) {
    pkvi_extent_alloc *ea;
    cr_assert_eq(pkvi_extent_create(40, PKVI_EXTENT_FIRST_FIT, &ea), PKV_OK);
    uint64_t o[4];
    for (int i = 0; i < 4; i++) cr_assert_eq(pkvi_extent_alloc_units(ea, 10, &o[i]), PKV_OK);
    cr_assert_eq(pkvi_extent_free_units(ea, o[0], 10), PKV_OK);
    cr_assert_eq(pkvi_extent_free_units(ea, o[2], 10), PKV_OK);
    // 20 slots free, but in two holes of 10: a 15-slot request cannot be placed.
    uint64_t x = 99;
    cr_expect_eq(pkvi_extent_free_total(ea), 20);
    cr_expect_eq(pkvi_extent_alloc_units(ea, 15, &x), PKV_ERR_OUT_OF_BLOCKS);
    cr_expect_eq(x, 99, "a failed allocation must not write the offset");
    pkvi_extent_stats s;
    pkvi_extent_get_stats(ea, &s);
    cr_expect_eq(s.alloc_failures, 1);
    cr_expect_eq(pkvi_extent_validate(ea), PKV_OK);
    pkvi_extent_destroy(ea);
}

Test(extent, grow_in_place_only_into_free_neighbour) {
    pkvi_extent_alloc *ea;
    cr_assert_eq(pkvi_extent_create(64, PKVI_EXTENT_FIRST_FIT, &ea), PKV_OK);
    uint64_t a, b;
    cr_assert_eq(pkvi_extent_alloc_units(ea, 8, &a), PKV_OK);
    cr_assert_eq(pkvi_extent_grow(ea, a, 8, 16), PKV_OK);
    cr_assert_eq(pkvi_extent_alloc_units(ea, 8, &b), PKV_OK);
    cr_expect_eq(b, 16);
    // a is now followed by b: no room to grow in place.
    cr_expect_eq(pkvi_extent_grow(ea, a, 16, 17), PKV_ERR_OUT_OF_BLOCKS);
    cr_expect_eq(pkvi_extent_grow(ea, b, 8, 48), PKV_OK);
    cr_expect_eq(pkvi_extent_grow(ea, b, 48, 49), PKV_ERR_OUT_OF_BLOCKS, "past the end");
    cr_expect_eq(pkvi_extent_free_total(ea), 0);
    cr_expect_eq(pkvi_extent_grow(ea, b, 48, 40), PKV_ERR_INVALID_ARG, "shrinking is not growth");
    cr_expect_eq(pkvi_extent_validate(ea), PKV_OK);
    pkvi_extent_destroy(ea);
}

Test(extent, double_free_and_out_of_range_are_rejected) {
    pkvi_extent_alloc *ea;
    cr_assert_eq(pkvi_extent_create(32, PKVI_EXTENT_FIRST_FIT, &ea), PKV_OK);
    uint64_t a;
    cr_assert_eq(pkvi_extent_alloc_units(ea, 8, &a), PKV_OK);
    cr_assert_eq(pkvi_extent_free_units(ea, a, 8), PKV_OK);
    cr_expect_eq(pkvi_extent_free_units(ea, a, 8), PKV_ERR_INVALID_ARG, "double free");
    cr_expect_eq(pkvi_extent_free_units(ea, 30, 8), PKV_ERR_INVALID_ARG, "past the end");
    cr_expect_eq(pkvi_extent_free_units(ea, 0, 0), PKV_ERR_INVALID_ARG);
    cr_expect_eq(pkvi_extent_alloc_units(ea, 0, &a), PKV_ERR_INVALID_ARG);
    cr_expect_eq(pkvi_extent_alloc_units(ea, 33, &a), PKV_ERR_OUT_OF_BLOCKS);
    cr_expect_eq(pkvi_extent_free_total(ea), 32, "failed calls change nothing");
    pkvi_extent_destroy(ea);
}

// Randomized: every operation is mirrored in a bitmap; the allocator must agree
// on free totals, never hand out an occupied unit, and stay valid.
Test(extent, randomized_against_bitmap) {
    enum { CAP = 512, LIVE = 64 };
    for (int fit = 0; fit < 2; fit++) {
        pkvi_extent_alloc *ea;
        cr_assert_eq(pkvi_extent_create(CAP, (pkvi_extent_fit)fit, &ea), PKV_OK);
        unsigned char used[CAP] = {0};
        uint64_t off[LIVE], len[LIVE];
        int live[LIVE] = {0};
        uint64_t seed = 12345 + (uint64_t)fit;
        for (int step = 0; step < 20000; step++) {
            seed = seed * 6364136223846793005ull + 1442695040888963407ull;
            const int k = (int)((seed >> 33) % LIVE);
            if (live[k]) {
                if ((seed >> 20) & 1) {
                    cr_assert_eq(pkvi_extent_free_units(ea, off[k], len[k]), PKV_OK);
                    for (uint64_t u = 0; u < len[k]; u++) used[off[k] + u] = 0;
                    live[k] = 0;
                } else {
                    uint64_t nl = len[k] + 1 + ((seed >> 40) % 8);
                    int can = off[k] + nl <= CAP;
                    for (uint64_t u = off[k] + len[k]; can && u < off[k] + nl; u++) can = !used[u];
                    pkv_status st = pkvi_extent_grow(ea, off[k], len[k], nl);
                    cr_assert_eq(st == PKV_OK, can, "grow disagrees with the bitmap");
                    if (st == PKV_OK) {
                        for (uint64_t u = off[k] + len[k]; u < off[k] + nl; u++) used[u] = 1;
                        len[k] = nl;
                    }
                }
            } else {
                uint64_t l = 1 + (seed >> 44) % 40, o;
                // The bitmap's longest free run decides whether it must succeed.
                uint64_t run = 0, best = 0;
                for (int u = 0; u < CAP; u++) {
                    run = used[u] ? 0 : run + 1;
                    if (run > best) best = run;
                }
                pkv_status st = pkvi_extent_alloc_units(ea, l, &o);
                cr_assert_eq(st == PKV_OK, best >= l, "alloc disagrees with the bitmap");
                if (st == PKV_OK) {
                    for (uint64_t u = o; u < o + l; u++) {
                        cr_assert_eq(used[u], 0, "unit %llu handed out twice", (unsigned long long)u);
                        used[u] = 1;
                    }
                    off[k] = o;
                    len[k] = l;
                    live[k] = 1;
                }
            }
            uint64_t free_units = 0;
            for (int u = 0; u < CAP; u++) free_units += !used[u];
            cr_assert_eq(pkvi_extent_free_total(ea), free_units);
            cr_assert_eq(pkvi_extent_validate(ea), PKV_OK);
        }
        pkvi_extent_destroy(ea);
    }
}

// SPDX-License-Identifier: MIT
// The two-level allocator (src/allocator/lcm.c) and the pool's chunked mode it
// builds on: hand-computed cases, then a randomized model-based test of reserve,
// alloc, retain, release and trim over 2-5 groups against a reference model.
#include <criterion/criterion.h>
#include <stdlib.h>
#include <string.h>

#include "pkv/pool.h"
#include "src/allocator/lcm.h"
#include "src/allocator/pool_internal.h"

static pkvi_lcm *make_lcm(const uint64_t *bytes, uint32_t n, uint64_t budget) {
    pkvi_lcm *l = NULL;
    char err[256];
    pkv_status st = pkvi_lcm_create(bytes, n, budget, &l, err, sizeof err);
    cr_assert_eq(st, PKV_OK, "create: %s (%s)", pkv_status_str(st), err);
    return l;
}

// ---- the pool's chunked mode --------------------------------------------------------

Test(lcm, chunk_divide_matches_the_divide) {
    // The multiply-shift that replaces id / k on the hot path, at every k up to
    // 4096, at chunk boundaries and at the largest id a pool can have.
    uint64_t rng = 88172645463325252ull;
    for (uint32_t k = 1; k <= 4096 + 64; k++) {
        uint32_t kk = k <= 4096 ? k : (uint32_t)(rng % PKV_POOL_MAX_BLOCKS) + 1;
        uint64_t magic;
        uint32_t shift;
        pkvi_chunk_div_init(kk, &magic, &shift);
        uint32_t ids[8] = {0, kk - 1, kk, PKV_POOL_MAX_BLOCKS - 1,
                           (PKV_POOL_MAX_BLOCKS - 1) / kk * kk, (PKV_POOL_MAX_BLOCKS - 1) / kk * kk - 1};
        for (int r = 0; r < 2; r++) {
            rng ^= rng << 13, rng ^= rng >> 7, rng ^= rng << 17;
            ids[6 + r] = (uint32_t)(rng % PKV_POOL_MAX_BLOCKS);
        }
        for (int i = 0; i < 8; i++)
            cr_assert_eq(pkvi_chunk_div(ids[i], magic, shift), ids[i] / kk, "k %u id %u", kk, ids[i]);
    }
}

Test(lcm, chunked_pool_fences_what_it_does_not_own) {
    pkv_pool *p = NULL;
    cr_assert_eq(pkvi_pool_create_chunked(3, 4, &p), PKV_OK); // ids 0..11, chunks {0..3} {4..7} {8..11}
    cr_assert_eq(pkv_pool_capacity(p), 12);
    cr_assert_eq(pkv_pool_free_count(p), 0, "every chunk starts fenced");
    cr_assert_eq(pkv_pool_validate(p), PKV_OK);
    pkv_block_id ids[4];
    cr_assert_eq(pkv_pool_alloc(p, 1, ids), PKV_ERR_OUT_OF_BLOCKS);
    cr_assert_eq(pkvi_pool_chunk_give(p, 1), PKV_OK);
    cr_assert_eq(pkvi_pool_chunk_give(p, 1), PKV_ERR_BUSY);
    cr_assert_eq(pkvi_pool_chunk_give(p, 3), PKV_ERR_INVALID_ARG);
    cr_assert_eq(pkv_pool_free_count(p), 4);
    cr_assert_eq(pkv_pool_alloc(p, 3, ids), PKV_OK);
    cr_assert_eq(ids[0], 4, "a given chunk hands out its lowest id first");
    cr_assert_eq(ids[1], 5);
    cr_assert_eq(ids[2], 6);
    cr_assert_eq(pkvi_pool_chunk_used(p, 1), 3);
    cr_assert_eq(pkvi_pool_chunk_used(p, 0), PKVI_CHUNK_FENCED);
    // Fenced ids: refused by retain, release and release_n, read as refcount 0.
    for (pkv_block_id f = 0; f < 4; f++) {
        cr_assert_eq(pkv_pool_retain(p, f), PKV_ERR_NOT_FOUND);
        cr_assert_eq(pkv_pool_release(p, f), PKV_ERR_NOT_FOUND);
        cr_assert_eq(pkv_pool_refcount(p, f), 0);
    }
    pkv_block_id mix[2] = {4, 9};
    cr_assert_eq(pkv_pool_release_n(p, mix, 2), PKV_ERR_NOT_FOUND);
    cr_assert_eq(pkv_pool_refcount(p, 4), 1, "a refused release_n changes nothing");
    cr_assert_eq(pkvi_pool_chunk_take(p, 1), PKV_ERR_BUSY, "a chunk with live pages stays");
    pkv_pool_stats st;
    cr_assert_eq(pkv_pool_get_stats(p, &st), PKV_OK);
    cr_assert_eq(st.free_blocks, 1);
    cr_assert_eq(st.used_blocks, 3, "fenced pages are neither free nor used");
    cr_assert_eq(st.peak_used, 3);
    cr_assert_eq(pkv_pool_validate(p), PKV_OK);
    cr_assert_eq(pkv_pool_release_n(p, ids, 2), PKV_OK);
    cr_assert_eq(pkv_pool_release(p, ids[2]), PKV_OK);
    cr_assert_eq(pkvi_pool_chunk_used(p, 1), 0);
    cr_assert_eq(pkvi_pool_empty_chunks(p), 1);
    cr_assert_eq(pkvi_pool_first_empty_chunk(p), 1);
    cr_assert_eq(pkvi_pool_chunk_take(p, 1), PKV_OK);
    cr_assert_eq(pkvi_pool_chunk_take(p, 1), PKV_ERR_INVALID_ARG, "already fenced");
    cr_assert_eq(pkv_pool_free_count(p), 0);
    cr_assert_eq(pkv_pool_retain(p, 4), PKV_ERR_NOT_FOUND);
    cr_assert_eq(pkv_pool_validate(p), PKV_OK);
    // A plain pool has no chunks.
    pkv_pool *plain = NULL;
    cr_assert_eq(pkv_pool_create(4, &plain), PKV_OK);
    cr_assert_eq(pkvi_pool_chunk_give(plain, 0), PKV_ERR_INVALID_ARG);
    cr_assert_eq(pkvi_pool_chunk_take(plain, 0), PKV_ERR_INVALID_ARG);
    pkv_pool_destroy(plain);
    pkv_pool_destroy(p);
}

Test(lcm, empty_chunks_past_one_bitmap_word) {
    pkv_pool *p = NULL;
    cr_assert_eq(pkvi_pool_create_chunked(130, 2, &p), PKV_OK);
    cr_assert_eq(pkvi_pool_first_empty_chunk(p), PKVI_CHUNK_FENCED);
    for (uint32_t c = 130; c > 0; c--) cr_assert_eq(pkvi_pool_chunk_give(p, c - 1), PKV_OK);
    cr_assert_eq(pkvi_pool_empty_chunks(p), 130);
    cr_assert_eq(pkvi_pool_first_empty_chunk(p), 0);
    pkv_block_id ids[2];
    cr_assert_eq(pkv_pool_alloc(p, 1, ids), PKV_OK); // chunk 0's id 0 (given last)
    cr_assert_eq(ids[0], 0);
    cr_assert_eq(pkvi_pool_empty_chunks(p), 129);
    cr_assert_eq(pkvi_pool_first_empty_chunk(p), 1);
    for (uint32_t c = 1; c <= 64; c++) cr_assert_eq(pkvi_pool_chunk_take(p, c), PKV_OK);
    cr_assert_eq(pkvi_pool_first_empty_chunk(p), 65, "in the second bitmap word");
    cr_assert_eq(pkvi_pool_empty_chunks(p), 65);
    for (uint32_t c = 65; c < 129; c++) cr_assert_eq(pkvi_pool_chunk_take(p, c), PKV_OK);
    cr_assert_eq(pkvi_pool_first_empty_chunk(p), 129, "in the third word");
    cr_assert_eq(pkv_pool_validate(p), PKV_OK);
    cr_assert_eq(pkv_pool_release(p, ids[0]), PKV_OK);
    cr_assert_eq(pkvi_pool_first_empty_chunk(p), 0);
    cr_assert_eq(pkvi_pool_empty_chunks(p), 2);
    cr_assert_eq(pkv_pool_validate(p), PKV_OK);
    pkv_pool_destroy(p);
}

Test(lcm, chunked_pool_validate_sees_a_wrong_counter) {
    pkv_pool *p = NULL;
    cr_assert_eq(pkvi_pool_create_chunked(2, 3, &p), PKV_OK);
    cr_assert_eq(pkvi_pool_chunk_give(p, 0), PKV_OK);
    pkv_block_id id;
    cr_assert_eq(pkv_pool_alloc(p, 1, &id), PKV_OK);
    p->chunk_used[0] = 2;
    cr_assert_eq(pkv_pool_validate(p), PKV_ERR_CORRUPT);
    p->chunk_used[0] = 1;
    p->refcount[4] = 0; // a fenced id that looks free
    cr_assert_eq(pkv_pool_validate(p), PKV_ERR_CORRUPT);
    p->refcount[4] = PKVI_POOL_FENCED;
    cr_assert_eq(pkv_pool_validate(p), PKV_OK);
    pkv_pool_destroy(p);
}

// ---- the large-page layer: hand-computed cases ------------------------------------

Test(lcm, three_and_four_kib_make_twelve_kib_large_pages) {
    const uint64_t bytes[2] = {3072, 4096};
    pkvi_lcm *l = make_lcm(bytes, 2, 5 * 12288 + 100);
    pkvi_lcm_stats s;
    cr_assert_eq(pkvi_lcm_get_stats(l, &s), PKV_OK);
    cr_assert_eq(s.large_bytes, 12288);
    cr_assert_eq(s.num_large, 5);
    cr_assert_eq(s.free_large, 5);
    cr_assert_eq(s.rounding_bytes, 100);
    cr_assert_eq(s.group[0].pages_per_large, 4);
    cr_assert_eq(s.group[1].pages_per_large, 3);
    cr_assert_eq(pkv_pool_capacity(pkvi_lcm_pool(l, 0)), 20);
    cr_assert_eq(pkv_pool_capacity(pkvi_lcm_pool(l, 1)), 15);

    // Group 0 wants 5 pages: ceil(5 / 4) = 2 large pages, 0 and 1 (ids 0..7).
    const uint32_t need5[2] = {5, 0};
    cr_assert_eq(pkvi_lcm_reserve(l, need5), PKV_OK);
    cr_assert_eq(pkvi_lcm_owner(l, 0), 0);
    cr_assert_eq(pkvi_lcm_owner(l, 1), 0);
    cr_assert_eq(pkvi_lcm_owner(l, 2), PKVI_LCM_NO_GROUP);
    pkv_pool *p0 = pkvi_lcm_pool(l, 0), *p1 = pkvi_lcm_pool(l, 1);
    cr_assert_eq(pkv_pool_free_count(p0), 8);
    pkv_block_id a[5];
    cr_assert_eq(pkv_pool_alloc(p0, 5, a), PKV_OK);
    // Large page 1 was given last, so its ids are on top of the stack, lowest first.
    const pkv_block_id expect[5] = {4, 5, 6, 7, 0};
    for (int i = 0; i < 5; i++) cr_assert_eq(a[i], expect[i], "a[%d] = %d", i, a[i]);
    cr_assert_eq(pkv_pool_retain(p0, 8), PKV_ERR_NOT_FOUND, "id 8 is large page 2's: fenced");
    cr_assert_eq(pkvi_lcm_get_stats(l, &s), PKV_OK);
    cr_assert_eq(s.group[0].large_owned, 2);
    cr_assert_eq(s.group[0].free_pages, 3);
    cr_assert_eq(s.group[0].used_pages, 5);
    cr_assert_eq(s.group[0].stranded_pages, 3, "large page 0 holds one live page, three free");
    cr_assert_eq(s.stranded_bytes, 3 * 3072);
    cr_assert_eq(s.used_bytes, 5 * 3072);

    // Group 1 takes the other three large pages: 9 pages of 4 KiB.
    const uint32_t need9[2] = {0, 9};
    cr_assert_eq(pkvi_lcm_reserve(l, need9), PKV_OK);
    cr_assert_eq(pkvi_lcm_get_stats(l, &s), PKV_OK);
    cr_assert_eq(s.free_large, 0);
    cr_assert_eq(s.group[1].large_owned, 3);
    cr_assert_eq(s.group[1].large_empty, 3);
    cr_assert_eq(s.group[1].stranded_pages, 0, "empty large pages are reclaimable, not stranded");
    // One more page of group 1: no unowned large page, group 0 has none empty.
    const uint32_t need10[2] = {0, 10};
    cr_assert_eq(pkvi_lcm_reserve(l, need10), PKV_ERR_OUT_OF_BLOCKS);
    cr_assert_eq(pkv_pool_free_count(p1), 9, "a refused reserve moves nothing");
    // Group 0 frees large page 0's only live page (id 0): it empties and is lent.
    cr_assert_eq(pkv_pool_release(p0, 0), PKV_OK);
    cr_assert_eq(pkvi_lcm_get_stats(l, &s), PKV_OK);
    cr_assert_eq(s.group[0].large_empty, 1);
    cr_assert_eq(s.group[0].stranded_pages, 0);
    cr_assert_eq(pkvi_lcm_reserve(l, need10), PKV_OK);
    cr_assert_eq(pkvi_lcm_owner(l, 0), 1, "large page 0 went from group 0 to group 1");
    cr_assert_eq(pkv_pool_free_count(p0), 0);
    cr_assert_eq(pkv_pool_free_count(p1), 12);
    cr_assert_eq(pkv_pool_retain(p0, 1), PKV_ERR_NOT_FOUND, "group 0's ids of large page 0 are fenced");
    pkv_block_id b[12];
    cr_assert_eq(pkv_pool_alloc(p1, 12, b), PKV_OK);
    int saw0to2 = 0;
    for (int i = 0; i < 12; i++) saw0to2 += b[i] >= 0 && b[i] <= 2;
    cr_assert_eq(saw0to2, 3, "group 1's ids of large page 0 are 0, 1, 2");
    cr_assert_eq(pkvi_lcm_get_stats(l, &s), PKV_OK);
    cr_assert_eq(s.reclaims, 1);
    cr_assert_eq(s.reserve_failures, 1);
    cr_assert_eq(pkvi_lcm_validate(l), PKV_OK);
    pkvi_lcm_destroy(l);
}

Test(lcm, reserve_is_all_or_nothing_across_groups) {
    const uint64_t bytes[3] = {2048, 3072, 6144}; // LCM 6144: k = 3, 2, 1
    pkvi_lcm *l = make_lcm(bytes, 3, 4 * 6144);
    const uint32_t too_much[3] = {3, 2, 3}; // 1 + 1 + 3 = 5 large pages of 4
    cr_assert_eq(pkvi_lcm_reserve(l, too_much), PKV_ERR_OUT_OF_BLOCKS);
    pkvi_lcm_stats s;
    cr_assert_eq(pkvi_lcm_get_stats(l, &s), PKV_OK);
    cr_assert_eq(s.free_large, 4, "groups 0 and 1 could be served, but nothing may move");
    const uint32_t fits[3] = {3, 2, 2};
    cr_assert_eq(pkvi_lcm_reserve(l, fits), PKV_OK);
    cr_assert_eq(pkvi_lcm_get_stats(l, &s), PKV_OK);
    cr_assert_eq(s.free_large, 0);
    // Group 2 needs one more; groups 0 and 1 have an empty large page each but
    // still need their pages in the same call: refused.
    const uint32_t keep0[3] = {3, 2, 3};
    cr_assert_eq(pkvi_lcm_reserve(l, keep0), PKV_ERR_OUT_OF_BLOCKS);
    cr_assert_eq(pkvi_lcm_owner(l, 0), 0);
    // Without group 0's need, its empty large page moves.
    const uint32_t free0[3] = {0, 2, 3};
    cr_assert_eq(pkvi_lcm_reserve(l, free0), PKV_OK);
    cr_assert_eq(pkvi_lcm_get_stats(l, &s), PKV_OK);
    cr_assert_eq(s.group[0].large_owned, 0);
    cr_assert_eq(s.group[2].large_owned, 3);
    cr_assert_eq(pkvi_lcm_validate(l), PKV_OK);
    uint32_t back = 0;
    cr_assert_eq(pkvi_lcm_trim(l, &back), PKV_OK);
    cr_assert_eq(back, 4, "nothing was live: every large page comes back");
    cr_assert_eq(pkvi_lcm_reserve_group(l, 1, 8), PKV_OK);
    cr_assert_eq(pkvi_lcm_reserve_group(l, 1, 9), PKV_ERR_OUT_OF_BLOCKS);
    cr_assert_eq(pkvi_lcm_reserve_group(l, 3, 1), PKV_ERR_INVALID_ARG);
    cr_assert_eq(pkvi_lcm_validate(l), PKV_OK);
    pkvi_lcm_destroy(l);
}

Test(lcm, create_refuses_with_a_reason) {
    pkvi_lcm *l = (pkvi_lcm *)1;
    char err[256];
    const uint64_t primes[2] = {1000003, 999983}; // LCM ~ 1e12 bytes
    cr_assert_eq(pkvi_lcm_create(primes, 2, (uint64_t)1 << 40, &l, err, sizeof err), PKV_ERR_LIMIT);
    cr_assert_null(l);
    cr_assert(strstr(err, "1 GiB") && strstr(err, "1000003, 999983"), "err: %s", err);
    const uint64_t huge[2] = {UINT64_MAX, UINT64_MAX - 1}; // must not wrap
    cr_assert_eq(pkvi_lcm_create(huge, 2, UINT64_MAX, &l, err, sizeof err), PKV_ERR_LIMIT);
    const uint64_t almost[2] = {(uint64_t)1 << 29, 3}; // 1.5 GiB
    cr_assert_eq(pkvi_lcm_create(almost, 2, UINT64_MAX, &l, err, sizeof err), PKV_ERR_LIMIT);
    const uint64_t at_limit[2] = {(uint64_t)1 << 30, 1 << 20}; // exactly 1 GiB: accepted
    cr_assert_eq(pkvi_lcm_create(at_limit, 2, (uint64_t)1 << 31, &l, err, sizeof err), PKV_OK, "%s", err);
    pkvi_lcm_destroy(l);
    const uint64_t zero[2] = {4096, 0};
    cr_assert_eq(pkvi_lcm_create(zero, 2, 1 << 20, &l, err, sizeof err), PKV_ERR_INVALID_ARG);
    cr_assert(strstr(err, "group 1"), "err: %s", err);
    const uint64_t ok[2] = {4096, 6144};
    cr_assert_eq(pkvi_lcm_create(ok, 2, 12287, &l, err, sizeof err), PKV_ERR_INVALID_ARG);
    cr_assert(strstr(err, "12288"), "err: %s", err);
    cr_assert_eq(pkvi_lcm_create(ok, 0, 1 << 20, &l, err, sizeof err), PKV_ERR_INVALID_ARG);
    cr_assert_eq(pkvi_lcm_create(ok, PKVI_LCM_MAX_GROUPS + 1, 1 << 20, &l, NULL, 0),
                 PKV_ERR_INVALID_ARG);
    const uint64_t tiny[2] = {1, 2}; // 2^31 pages of 1 byte: over the pool's id range
    cr_assert_eq(pkvi_lcm_create(tiny, 2, (uint64_t)1 << 31, &l, err, sizeof err), PKV_ERR_LIMIT);
    pkvi_lcm_destroy(NULL);
}

// ---- randomized model-based test ---------------------------------------------------

#define MAX_LARGE 24
#define MAX_K 12
#define MAX_IDS (MAX_LARGE * MAX_K)

typedef struct model {
    uint64_t rng;
    uint32_t groups, num_large, k[PKVI_LCM_MAX_GROUPS];
    int owner[MAX_LARGE];                         // group or -1
    int32_t refs[PKVI_LCM_MAX_GROUPS][MAX_IDS];   // live references per id
    pkvi_lcm *lcm;
    uint64_t reserves_ok, reserves_refused, moves;
} model;

static uint32_t rnd(model *m, uint32_t n) {
    m->rng ^= m->rng >> 12, m->rng ^= m->rng << 25, m->rng ^= m->rng >> 27;
    return (uint32_t)((m->rng * 2685821657736338717ull) >> 33) % n;
}

static uint32_t live_in(const model *m, uint32_t g, uint32_t L) {
    uint32_t n = 0;
    for (uint32_t i = 0; i < m->k[g]; i++) n += m->refs[g][L * m->k[g] + i] > 0;
    return n;
}

static uint32_t model_free(const model *m, uint32_t g) {
    uint32_t n = 0;
    for (uint32_t L = 0; L < m->num_large; L++)
        if (m->owner[L] == (int)g) n += m->k[g] - live_in(m, g, L);
    return n;
}

// Whether the reference allows need[]: short groups take ceil(deficit / k) large
// pages, from the unowned ones or an empty one of a group that keeps its own need.
static int model_can(const model *m, const uint32_t *need) {
    uint64_t want = 0, have = 0;
    for (uint32_t L = 0; L < m->num_large; L++) have += m->owner[L] < 0;
    for (uint32_t g = 0; g < m->groups; g++) {
        uint32_t f = model_free(m, g);
        if (need[g] > f) {
            want += (need[g] - f + m->k[g] - 1) / m->k[g];
            continue;
        }
        uint32_t empty = 0;
        for (uint32_t L = 0; L < m->num_large; L++)
            empty += m->owner[L] == (int)g && live_in(m, g, L) == 0;
        uint32_t by_need = (f - need[g]) / m->k[g];
        have += empty < by_need ? empty : by_need;
    }
    return want <= have;
}

// Everything the allocator says agrees with the model.
static void check(const model *m) {
    cr_assert_eq(pkvi_lcm_validate(m->lcm), PKV_OK);
    pkvi_lcm_stats s;
    cr_assert_eq(pkvi_lcm_get_stats(m->lcm, &s), PKV_OK);
    uint32_t unowned = 0;
    for (uint32_t L = 0; L < m->num_large; L++) {
        int o = pkvi_lcm_owner(m->lcm, L);
        cr_assert_eq(o == PKVI_LCM_NO_GROUP ? -1 : o, m->owner[L], "large page %u", L);
        unowned += m->owner[L] < 0;
    }
    cr_assert_eq(s.free_large, unowned);
    uint64_t stranded = 0, used = 0;
    for (uint32_t g = 0; g < m->groups; g++) {
        pkv_pool *p = pkvi_lcm_pool(m->lcm, g);
        uint32_t nlive = 0, owned = 0, empty = 0;
        for (uint32_t id = 0; id < m->num_large * m->k[g]; id++) {
            // Every id is fenced (not owned), free or in use, as the model says.
            cr_assert_eq(pkv_pool_refcount(p, (pkv_block_id)id), m->refs[g][id], "group %u id %u", g, id);
            nlive += m->refs[g][id] > 0;
        }
        for (uint32_t L = 0; L < m->num_large; L++)
            if (m->owner[L] == (int)g) {
                owned++;
                uint32_t lv = live_in(m, g, L);
                empty += lv == 0;
                if (lv) stranded += (uint64_t)(m->k[g] - lv) * s.group[g].page_bytes;
            }
        cr_assert_eq(pkv_pool_free_count(p), model_free(m, g), "no block lost in group %u", g);
        cr_assert_eq(s.group[g].large_owned, owned);
        cr_assert_eq(s.group[g].large_empty, empty);
        cr_assert_eq(s.group[g].used_pages, nlive);
        used += (uint64_t)nlive * s.group[g].page_bytes;
    }
    cr_assert_eq(s.stranded_bytes, stranded);
    cr_assert_eq(s.used_bytes, used);
}

static void op_reserve(model *m) {
    uint32_t need[PKVI_LCM_MAX_GROUPS] = {0};
    for (uint32_t g = 0; g < m->groups; g++)
        if (rnd(m, 3) == 0) need[g] = rnd(m, m->k[g] * 3 + 1);
    int can = model_can(m, need);
    int before[MAX_LARGE];
    memcpy(before, m->owner, sizeof before);
    pkv_status st = pkvi_lcm_reserve(m->lcm, need);
    cr_assert_eq(st, can ? PKV_OK : PKV_ERR_OUT_OF_BLOCKS);
    if (st != PKV_OK) {
        m->reserves_refused++;
        return; // check() compares ownership with the unchanged model
    }
    m->reserves_ok++;
    for (uint32_t L = 0; L < m->num_large; L++) {
        int o = pkvi_lcm_owner(m->lcm, L);
        int now = o == PKVI_LCM_NO_GROUP ? -1 : o;
        if (now != before[L]) {
            // Only unowned or empty large pages move, and only to a group.
            cr_assert(before[L] < 0 || live_in(m, (uint32_t)before[L], L) == 0, "large page %u had live pages", L);
            m->moves++;
        }
        m->owner[L] = now;
    }
    for (uint32_t g = 0; g < m->groups; g++)
        cr_assert_geq(model_free(m, g), need[g], "group %u", g);
}

static void op_alloc(model *m) {
    uint32_t g = rnd(m, m->groups), n = 1 + rnd(m, 6);
    pkv_block_id ids[8];
    uint32_t f = model_free(m, g);
    pkv_status st = pkv_pool_alloc(pkvi_lcm_pool(m->lcm, g), n, ids);
    cr_assert_eq(st, n <= f ? PKV_OK : PKV_ERR_OUT_OF_BLOCKS);
    for (uint32_t i = 0; st == PKV_OK && i < n; i++) {
        uint32_t L = (uint32_t)ids[i] / m->k[g];
        cr_assert_eq(m->owner[L], (int)g, "id %d of group %u is in large page %u it does not own", ids[i], g, L);
        cr_assert_eq(m->refs[g][ids[i]], 0);
        m->refs[g][ids[i]] = 1;
    }
}

// A random id of group g in a given state: 1 live, 0 free, -1 fenced; -1 if none.
static int32_t pick(model *m, uint32_t g, int state) {
    uint32_t n = m->num_large * m->k[g], start = rnd(m, n);
    for (uint32_t i = 0; i < n; i++) {
        uint32_t id = (start + i) % n;
        int owned = m->owner[id / m->k[g]] == (int)g;
        int s = !owned ? -1 : m->refs[g][id] > 0;
        if (s == state) return (int32_t)id;
    }
    return -1;
}

static void op_release(model *m) {
    uint32_t g = rnd(m, m->groups);
    pkv_pool *p = pkvi_lcm_pool(m->lcm, g);
    int32_t id = pick(m, g, 1);
    if (id >= 0) {
        cr_assert_eq(pkv_pool_release(p, id), PKV_OK);
        m->refs[g][id]--;
    }
    int32_t f = pick(m, g, rnd(m, 2) ? 0 : -1); // free or fenced: refused either way
    if (f >= 0) {
        cr_assert_eq(pkv_pool_release(p, f), PKV_ERR_NOT_FOUND);
        cr_assert_eq(pkv_pool_retain(p, f), PKV_ERR_NOT_FOUND);
    }
}

static void op_retain(model *m) {
    uint32_t g = rnd(m, m->groups);
    int32_t id = pick(m, g, 1);
    if (id < 0) return;
    cr_assert_eq(pkv_pool_retain(pkvi_lcm_pool(m->lcm, g), id), PKV_OK);
    m->refs[g][id]++;
}

static void op_trim(model *m) {
    uint32_t back = 0;
    cr_assert_eq(pkvi_lcm_trim(m->lcm, &back), PKV_OK);
    uint32_t expect = 0;
    for (uint32_t L = 0; L < m->num_large; L++)
        if (m->owner[L] >= 0 && live_in(m, (uint32_t)m->owner[L], L) == 0) {
            m->owner[L] = -1;
            expect++;
        }
    cr_assert_eq(back, expect);
}

static void run_model(uint64_t seed, uint32_t ops) {
    model *m = calloc(1, sizeof *m);
    cr_assert_not_null(m);
    m->rng = seed * 0x9E3779B97F4A7C15ull + 7;
    m->groups = 2 + rnd(m, 4);
    // Page sizes from multiples of 1 KiB whose LCM keeps k <= MAX_K.
    static const uint64_t kib[] = {1, 2, 3, 4, 6, 12};
    uint64_t bytes[PKVI_LCM_MAX_GROUPS];
    for (uint32_t g = 0; g < m->groups; g++) bytes[g] = 1024 * kib[rnd(m, 6)];
    uint64_t lcm = 0;
    m->lcm = NULL;
    m->num_large = 1 + rnd(m, MAX_LARGE);
    // The budget: num_large large pages and a remainder the rounding loses.
    pkvi_lcm *probe = make_lcm(bytes, m->groups, (uint64_t)1 << 30);
    lcm = pkvi_lcm_large_bytes(probe);
    pkvi_lcm_destroy(probe);
    m->lcm = make_lcm(bytes, m->groups, lcm * m->num_large + rnd(m, (uint32_t)lcm));
    for (uint32_t g = 0; g < m->groups; g++) m->k[g] = (uint32_t)(lcm / bytes[g]);
    for (uint32_t L = 0; L < MAX_LARGE; L++) m->owner[L] = -1;
    check(m);
    for (uint32_t i = 0; i < ops; i++) {
        uint32_t r = rnd(m, 100);
        if (r < 25) op_reserve(m);
        else if (r < 55) op_alloc(m);
        else if (r < 90) op_release(m);
        else if (r < 97) op_retain(m);
        else op_trim(m);
        check(m);
    }
    cr_log_info("seed %lu: %u groups, %u large pages: %lu reserves, %lu refused, %lu large-page moves",
                (unsigned long)seed, m->groups, m->num_large, (unsigned long)m->reserves_ok,
                (unsigned long)m->reserves_refused, (unsigned long)m->moves);
    cr_assert_gt(m->moves, 0, "the run must move large pages");
    pkvi_lcm_destroy(m->lcm);
    free(m);
}

Test(lcm, randomized_against_a_model, .timeout = 300) {
    for (uint64_t seed = 1; seed <= 40; seed++) run_model(seed, 3000);
}

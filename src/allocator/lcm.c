// SPDX-License-Identifier: MIT
// The two-level allocator (lcm.h): large pages of LCM bytes owned by at most one
// KV cache group each, carved into that group's small pages in its chunked pool.
// Invariant: large page L is on the unowned stack exactly when no pool has chunk
// L unfenced, and otherwise exactly one pool (its owner's) has.
#include "lcm.h"

#include <stdio.h>
#include <stdlib.h>

#include "pool_internal.h"

struct pkvi_lcm {
    uint32_t num_groups;
    uint32_t num_large;
    uint32_t num_free;           // unowned large pages: free_large[0..num_free-1]
    uint64_t budget_bytes;
    uint64_t large_bytes;
    uint64_t reclaims;
    uint64_t reserve_failures;
    uint64_t page_bytes[PKVI_LCM_MAX_GROUPS];
    pkv_pool *pools[PKVI_LCM_MAX_GROUPS]; // owned
    uint8_t *owner;              // [num_large] group, or PKVI_LCM_NO_GROUP
    uint32_t *free_large;        // [num_large] stack of unowned large pages
};

static uint64_t gcd64(uint64_t a, uint64_t b) {
    while (b) {
        uint64_t t = a % b;
        a = b;
        b = t;
    }
    return a;
}

// "3072, 4096" into buf, for error sentences.
static void list_sizes(const uint64_t *bytes, uint32_t n, char *buf, size_t cap) {
    size_t at = 0;
    buf[0] = '\0';
    for (uint32_t g = 0; g < n && at < cap; g++) {
        int w = snprintf(buf + at, cap - at, "%s%llu", g ? ", " : "", (unsigned long long)bytes[g]);
        if (w < 0) break;
        at += (size_t)w;
    }
}

static pkv_status fail(pkv_status st, char *err, size_t err_cap, const char *what,
                       const uint64_t *bytes, uint32_t n) {
    if (err && err_cap) {
        char sizes[256];
        list_sizes(bytes, n, sizes, sizeof sizes);
        snprintf(err, err_cap, "%s (groups' page bytes: %s)", what, sizes);
    }
    return st;
}

pkv_status pkvi_lcm_create(const uint64_t *page_bytes, uint32_t num_groups, uint64_t budget_bytes,
                           pkvi_lcm **out, char *err, size_t err_cap) {
    if (err && err_cap) err[0] = '\0';
    if (!out) return PKV_ERR_INVALID_ARG;
    *out = NULL;
    if (!page_bytes || num_groups == 0 || num_groups > PKVI_LCM_MAX_GROUPS) {
        if (err && err_cap)
            snprintf(err, err_cap, "need 1..%d groups with their page bytes, got %u",
                     PKVI_LCM_MAX_GROUPS, num_groups);
        return PKV_ERR_INVALID_ARG;
    }
    char what[160];
    uint64_t lcm = 1;
    for (uint32_t g = 0; g < num_groups; g++) {
        if (page_bytes[g] == 0) {
            snprintf(what, sizeof what, "group %u has a page of 0 bytes", g);
            return fail(PKV_ERR_INVALID_ARG, err, err_cap, what, page_bytes, num_groups);
        }
        // lcm * (p / gcd) without overflow: both factors are checked against the limit
        // before they are multiplied (lcm <= 2^30 here, so the test itself cannot wrap).
        uint64_t f = page_bytes[g] / gcd64(lcm, page_bytes[g]);
        if (f > PKVI_LCM_MAX_LARGE_BYTES / lcm) {
            snprintf(what, sizeof what, "the LCM of the page sizes exceeds %llu bytes (1 GiB)",
                     (unsigned long long)PKVI_LCM_MAX_LARGE_BYTES);
            return fail(PKV_ERR_LIMIT, err, err_cap, what, page_bytes, num_groups);
        }
        lcm *= f;
    }
    uint64_t num_large = budget_bytes / lcm;
    if (num_large == 0) {
        snprintf(what, sizeof what, "a budget of %llu bytes holds no large page of %llu bytes",
                 (unsigned long long)budget_bytes, (unsigned long long)lcm);
        return fail(PKV_ERR_INVALID_ARG, err, err_cap, what, page_bytes, num_groups);
    }
    for (uint32_t g = 0; g < num_groups; g++) {
        if (num_large * (lcm / page_bytes[g]) > PKV_POOL_MAX_BLOCKS) {
            snprintf(what, sizeof what, "group %u would have %llu pages, over the pool's %u", g,
                     (unsigned long long)(num_large * (lcm / page_bytes[g])), PKV_POOL_MAX_BLOCKS);
            return fail(PKV_ERR_LIMIT, err, err_cap, what, page_bytes, num_groups);
        }
    }
    pkvi_lcm *l = calloc(1, sizeof *l);
    if (!l) return PKV_ERR_OUT_OF_MEMORY;
    l->num_groups = num_groups;
    l->num_large = (uint32_t)num_large;
    l->budget_bytes = budget_bytes;
    l->large_bytes = lcm;
    l->owner = malloc(num_large);
    l->free_large = malloc(num_large * sizeof *l->free_large);
    pkv_status st = l->owner && l->free_large ? PKV_OK : PKV_ERR_OUT_OF_MEMORY;
    for (uint32_t g = 0; g < num_groups && st == PKV_OK; g++) {
        l->page_bytes[g] = page_bytes[g];
        st = pkvi_pool_create_chunked(l->num_large, (uint32_t)(lcm / page_bytes[g]), &l->pools[g]);
    }
    if (st != PKV_OK) {
        pkvi_lcm_destroy(l);
        return st;
    }
    // Large page 0 on top: taken first (easier to read in tests).
    for (uint32_t i = 0; i < l->num_large; i++) {
        l->owner[i] = PKVI_LCM_NO_GROUP;
        l->free_large[i] = l->num_large - 1 - i;
    }
    l->num_free = l->num_large;
    *out = l;
    return PKV_OK;
}

void pkvi_lcm_destroy(pkvi_lcm *lcm) {
    if (!lcm) return;
    for (uint32_t g = 0; g < lcm->num_groups; g++) pkv_pool_destroy(lcm->pools[g]);
    free(lcm->owner);
    free(lcm->free_large);
    free(lcm);
}

pkv_pool *pkvi_lcm_pool(const pkvi_lcm *lcm, uint32_t g) {
    return lcm && g < lcm->num_groups ? lcm->pools[g] : NULL;
}

uint64_t pkvi_lcm_large_bytes(const pkvi_lcm *lcm) { return lcm ? lcm->large_bytes : 0; }

int pkvi_lcm_owner(const pkvi_lcm *lcm, uint32_t large) {
    return lcm && large < lcm->num_large ? lcm->owner[large] : -1;
}

// Empty large pages group h can give away and still hold need free pages, when it
// had free_extra more free pages of which empty_extra more empty large pages (a
// release not done yet; 0 and 0 for the pool as it is).
static uint32_t spare_of(const pkvi_lcm *lcm, uint32_t h, uint32_t need, uint32_t free_extra,
                         uint32_t empty_extra) {
    const pkv_pool *p = lcm->pools[h];
    const uint64_t free = (uint64_t)p->free_top + free_extra;
    if (free <= need) return 0;
    const uint64_t by_need = (free - need) / p->chunk_pages;
    const uint64_t empty = (uint64_t)pkvi_pool_empty_chunks(p) + empty_extra;
    return (uint32_t)(by_need < empty ? by_need : empty);
}

// The large pages each group must get (chunks) and may give (spare) for need;
// 1 when the unowned and spare large pages cover them. freed / emptied (NULL: none)
// as spare_of's extras, per group.
static int plan_reserve(const pkvi_lcm *lcm, const uint32_t *need, const uint32_t *freed,
                        const uint32_t *emptied, uint32_t *chunks, uint32_t *spare,
                        uint64_t *want_out) {
    uint64_t want = 0, have = lcm->num_free;
    for (uint32_t g = 0; g < lcm->num_groups; g++) {
        const pkv_pool *p = lcm->pools[g];
        const uint64_t free = (uint64_t)p->free_top + (freed ? freed[g] : 0);
        const uint64_t deficit = need[g] > free ? need[g] - free : 0;
        chunks[g] = (uint32_t)((deficit + p->chunk_pages - 1) / p->chunk_pages);
        want += chunks[g];
    }
    *want_out = want;
    if (want == 0) return 1;
    // A group that is short has no spare (its empty large pages are part of its free
    // count), so taking from the others never undoes a reservation.
    for (uint32_t h = 0; h < lcm->num_groups; h++) {
        spare[h] = chunks[h] ? 0
                             : spare_of(lcm, h, need[h], freed ? freed[h] : 0,
                                        emptied ? emptied[h] : 0);
        if (have < want) have += spare[h];
    }
    return have >= want;
}

// Fence an empty large page of group h and return it to the unowned stack.
static void reclaim_one(pkvi_lcm *lcm, uint32_t h) {
    pkv_pool *p = lcm->pools[h];
    uint32_t L = pkvi_pool_first_empty_chunk(p);
    pkvi_pool_chunk_take(p, L); // empty and owned: cannot fail
    lcm->owner[L] = PKVI_LCM_NO_GROUP;
    lcm->free_large[lcm->num_free++] = L;
    lcm->reclaims++;
}

pkv_status pkvi_lcm_reserve(pkvi_lcm *lcm, const uint32_t *need) {
    if (!lcm || !need) return PKV_ERR_INVALID_ARG;
    uint32_t chunks[PKVI_LCM_MAX_GROUPS], spare[PKVI_LCM_MAX_GROUPS];
    uint64_t want;
    const int fits = plan_reserve(lcm, need, NULL, NULL, chunks, spare, &want);
    if (want == 0) return PKV_OK;
    if (!fits) {
        lcm->reserve_failures++;
        return PKV_ERR_OUT_OF_BLOCKS;
    }
    uint32_t h = 0;
    for (uint32_t g = 0; g < lcm->num_groups; g++)
        for (uint32_t c = 0; c < chunks[g]; c++) {
            if (lcm->num_free == 0) {
                while (spare[h] == 0) h++;
                reclaim_one(lcm, h);
                spare[h]--;
            }
            uint32_t L = lcm->free_large[--lcm->num_free];
            pkvi_pool_chunk_give(lcm->pools[g], L); // unowned, so fenced: cannot fail
            lcm->owner[L] = (uint8_t)g;
        }
    return PKV_OK;
}

int pkvi_lcm_fits_after(const pkvi_lcm *lcm, const uint32_t *need, const uint32_t *freed,
                        const uint32_t *emptied) {
    uint32_t chunks[PKVI_LCM_MAX_GROUPS], spare[PKVI_LCM_MAX_GROUPS];
    uint64_t want;
    return lcm && need && plan_reserve(lcm, need, freed, emptied, chunks, spare, &want);
}

pkv_status pkvi_lcm_reserve_group(pkvi_lcm *lcm, uint32_t g, uint32_t n) {
    if (!lcm || g >= lcm->num_groups) return PKV_ERR_INVALID_ARG;
    if (lcm->pools[g]->free_top >= n) return PKV_OK;
    uint32_t need[PKVI_LCM_MAX_GROUPS] = {0};
    need[g] = n;
    return pkvi_lcm_reserve(lcm, need);
}

pkv_status pkvi_lcm_trim(pkvi_lcm *lcm, uint32_t *returned) {
    if (!lcm) return PKV_ERR_INVALID_ARG;
    uint64_t before = lcm->reclaims;
    for (uint32_t h = 0; h < lcm->num_groups; h++)
        for (uint32_t n = pkvi_pool_empty_chunks(lcm->pools[h]); n > 0; n--) reclaim_one(lcm, h);
    if (returned) *returned = (uint32_t)(lcm->reclaims - before);
    return PKV_OK;
}

pkv_status pkvi_lcm_get_stats(const pkvi_lcm *lcm, pkvi_lcm_stats *s) {
    if (!lcm || !s) return PKV_ERR_INVALID_ARG;
    *s = (pkvi_lcm_stats){0};
    s->budget_bytes = lcm->budget_bytes;
    s->large_bytes = lcm->large_bytes;
    s->rounding_bytes = lcm->budget_bytes - (uint64_t)lcm->num_large * lcm->large_bytes;
    s->reclaims = lcm->reclaims;
    s->reserve_failures = lcm->reserve_failures;
    s->num_large = lcm->num_large;
    s->free_large = lcm->num_free;
    s->num_groups = lcm->num_groups;
    for (uint32_t g = 0; g < lcm->num_groups; g++) {
        const pkv_pool *p = lcm->pools[g];
        pkvi_lcm_group_stats *gs = &s->group[g];
        gs->page_bytes = lcm->page_bytes[g];
        gs->pages_per_large = p->chunk_pages;
        gs->large_owned = p->owned_chunks;
        gs->large_empty = pkvi_pool_empty_chunks(p);
        gs->free_pages = p->free_top;
        gs->used_pages = p->owned_chunks * p->chunk_pages - p->free_top;
        gs->stranded_pages = p->free_top - gs->large_empty * p->chunk_pages;
        s->stranded_bytes += (uint64_t)gs->stranded_pages * gs->page_bytes;
        s->used_bytes += (uint64_t)gs->used_pages * gs->page_bytes;
    }
    return PKV_OK;
}

pkv_status pkvi_lcm_validate(const pkvi_lcm *lcm) {
    if (!lcm) return PKV_ERR_INVALID_ARG;
    for (uint32_t g = 0; g < lcm->num_groups; g++) {
        pkv_status st = pkv_pool_validate(lcm->pools[g]);
        if (st != PKV_OK) return st;
    }
    if (lcm->num_free > lcm->num_large) return PKV_ERR_CORRUPT;
    unsigned char *unowned = calloc(lcm->num_large, 1);
    if (!unowned) return PKV_ERR_OUT_OF_MEMORY;
    pkv_status st = PKV_OK;
    for (uint32_t i = 0; i < lcm->num_free && st == PKV_OK; i++) {
        uint32_t L = lcm->free_large[i];
        if (L >= lcm->num_large || unowned[L] || lcm->owner[L] != PKVI_LCM_NO_GROUP)
            st = PKV_ERR_CORRUPT;
        else
            unowned[L] = 1;
    }
    uint64_t owned = 0;
    for (uint32_t L = 0; L < lcm->num_large && st == PKV_OK; L++) {
        uint8_t o = lcm->owner[L];
        if (o != PKVI_LCM_NO_GROUP && (o >= lcm->num_groups || unowned[L])) st = PKV_ERR_CORRUPT;
        if (o == PKVI_LCM_NO_GROUP && !unowned[L]) st = PKV_ERR_CORRUPT; // lost
        for (uint32_t g = 0; g < lcm->num_groups && st == PKV_OK; g++)
            if ((pkvi_pool_chunk_used(lcm->pools[g], L) != PKVI_CHUNK_FENCED) != (o == g))
                st = PKV_ERR_CORRUPT;
        owned += o != PKVI_LCM_NO_GROUP;
    }
    if (st == PKV_OK && owned + lcm->num_free != lcm->num_large) st = PKV_ERR_CORRUPT;
    free(unowned);
    return st;
}

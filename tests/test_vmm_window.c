// SPDX-License-Identifier: MIT
// The hybrid-vmm primitives of pkv/vmm.h on the host, both commit modes: a row
// that unmaps its front as its window slides (pkv_vmm_slot_map_range), and several
// spaces (one per KV cache group) drawing on one physical budget
// (pkv_vmm_budget), with other members' cached pages reclaimed when one needs
// room. Hand-computed cases, then a random walk over two spaces of different page
// sizes against a reference of ranges and page counts, with every kept page's
// content checked.
#include <criterion/criterion.h>
#include <stdint.h>
#include <string.h>
#include <unistd.h>

#include "pkv/vmm.h"

static const pkv_vmm_host_mode modes[2] = {PKV_VMM_HOST_MEMFD, PKV_VMM_HOST_MPROTECT};

static uint64_t rng_state;
static uint64_t rng_next(void) { // splitmix64
    uint64_t z = (rng_state += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

static uint64_t sys_page(void) { return (uint64_t)sysconf(_SC_PAGESIZE); }

static pkv_vmm_space *make(pkv_vmm_host_mode mode, uint32_t slots, uint32_t buffers,
                           uint64_t page, uint64_t row_pages, uint64_t max_pages) {
    pkv_vmm_params p = pkv_vmm_params_default();
    p.num_slots = slots;
    p.num_buffers = buffers;
    p.page_bytes = page;
    p.buffer_bytes = row_pages * page;
    p.max_pages = max_pages;
    p.host_mode = mode;
    pkv_vmm_space *s = NULL;
    pkv_status st = pkv_vmm_space_create_host(&p, &s);
    cr_assert_eq(st, PKV_OK, "create (%d): %s", (int)mode, pkv_status_str(st));
    return s;
}

static uint8_t *page_ptr(pkv_vmm_space *s, uint32_t slot, uint32_t buffer, uint64_t page) {
    pkv_vmm_info info;
    pkv_vmm_get_info(s, &info);
    void *base = NULL;
    pkv_vmm_buffer_ptr(s, buffer, &base);
    return (uint8_t *)base + slot * info.buffer_bytes + page * info.page_bytes;
}

// A window of 2 pages slides along a row of 8 (2 buffers): the front pages are
// unmapped, the kept ones keep their content and physical pages, and at a budget of
// exactly 2 x 2 pages the slide reuses the page it gives up (no new page created).
Test(vmm_window, a_sliding_window_unmaps_its_front_and_reuses_the_page) {
    for (int m = 0; m < 2; m++) {
        const uint64_t pg = sys_page();
        pkv_vmm_space *s = make(modes[m], 1, 2, pg, 8, 4);
        uint32_t a;
        cr_assert_eq(pkv_vmm_slot_acquire(s, &a), PKV_OK);
        cr_assert_eq(pkv_vmm_slot_map_range(s, a, 0, 2 * pg), PKV_OK);
        for (uint64_t w = 1; w + 2 <= 8; w++) {
            int64_t kept[2];
            for (uint32_t b = 0; b < 2; b++) {
                memset(page_ptr(s, a, b, w), (int)(16 * w + b), pg);
                kept[b] = pkv_vmm_page_physical(s, a, b, w);
            }
            // Tokens [w * pg + 1, (w + 2) * pg): the window now starts inside page w.
            cr_assert_eq(pkv_vmm_slot_map_range(s, a, w * pg + 1, (w + 2) * pg), PKV_OK,
                         "mode %d slide %llu", m, (unsigned long long)w);
            cr_assert_eq(pkv_vmm_slot_first_page(s, a), w);
            cr_assert_eq(pkv_vmm_slot_pages(s, a), 2);
            for (uint32_t b = 0; b < 2; b++) {
                cr_assert_eq(pkv_vmm_page_physical(s, a, b, w - 1), -1, "front unmapped");
                cr_assert_eq(pkv_vmm_page_physical(s, a, b, w), kept[b], "kept page stays");
                const uint8_t *p = page_ptr(s, a, b, w);
                cr_assert(p[0] == 16 * w + b && p[pg - 1] == 16 * w + b, "content kept");
            }
            cr_assert_eq(pkv_vmm_validate(s), PKV_OK);
        }
        pkv_vmm_stats st;
        pkv_vmm_get_stats(s, &st);
        cr_assert_eq(st.pages_created, 4, "the budget's 4 pages served every slide");
        cr_assert_eq(st.pages_mapped, 4);
        cr_assert_eq(st.map_calls, 4 + 2 * 6, "one page per buffer per slide");
        cr_assert_eq(st.unmap_calls, 2 * 6);
        // resize maps the first bytes again: pages 0..7 at a budget of 4 are refused,
        // and nothing changes.
        cr_assert_eq(pkv_vmm_slot_resize(s, a, 8 * pg), PKV_ERR_OUT_OF_BLOCKS);
        cr_assert_eq(pkv_vmm_slot_first_page(s, a), 6);
        cr_assert_eq(pkv_vmm_slot_pages(s, a), 2);
        cr_assert_eq(pkv_vmm_slot_resize(s, a, pg), PKV_OK, "back to page 0 only");
        cr_assert_eq(pkv_vmm_slot_first_page(s, a), 0);
        cr_assert_eq(pkv_vmm_slot_pages(s, a), 1);
        cr_assert_eq(pkv_vmm_validate(s), PKV_OK);
        pkv_vmm_space_destroy(s);
    }
}

// Bad ranges and slots are refused and change nothing; an empty range unmaps all.
Test(vmm_window, bad_ranges_change_nothing) {
    const uint64_t pg = sys_page();
    pkv_vmm_space *s = make(PKV_VMM_HOST_MEMFD, 2, 1, pg, 4, 3);
    uint32_t a;
    pkv_vmm_slot_acquire(s, &a);
    cr_assert_eq(pkv_vmm_slot_map_range(s, a, pg, 3 * pg), PKV_OK);
    cr_assert_eq(pkv_vmm_slot_map_range(s, a, 0, 4 * pg + 1), PKV_ERR_INVALID_ARG,
                 "past the reservation");
    cr_assert_eq(pkv_vmm_slot_map_range(s, 1, 0, pg), PKV_ERR_INVALID_ARG, "slot not taken");
    cr_assert_eq(pkv_vmm_slot_map_range(s, 9, 0, pg), PKV_ERR_INVALID_ARG, "no such slot");
    cr_assert_eq(pkv_vmm_slot_map_range(NULL, 0, 0, pg), PKV_ERR_INVALID_ARG);
    cr_assert_eq(pkv_vmm_slot_map_range(s, a, 0, 4 * pg), PKV_ERR_OUT_OF_BLOCKS,
                 "4 pages against a budget of 3");
    cr_assert_eq(pkv_vmm_slot_first_page(s, a), 1);
    cr_assert_eq(pkv_vmm_slot_pages(s, a), 2);
    cr_assert_eq(pkv_vmm_slot_map_range(s, a, 0, 3 * pg), PKV_OK, "3 fit: grows at the front");
    cr_assert_eq(pkv_vmm_slot_first_page(s, a), 0);
    cr_assert_eq(pkv_vmm_slot_map_range(s, a, 2 * pg, 2 * pg), PKV_OK, "empty range");
    cr_assert_eq(pkv_vmm_slot_pages(s, a), 0);
    cr_assert_eq(pkv_vmm_slot_first_page(s, a), 0);
    cr_assert_eq(pkv_vmm_validate(s), PKV_OK);
    cr_assert_eq(pkv_vmm_slot_first_page(NULL, 0), 0);
    pkv_vmm_space_destroy(s);
}

// The budget's own contract: arguments, joining before the first page, leaving on
// destroy, and a budget destroyed before its spaces.
Test(vmm_window, budget_arguments_and_membership) {
    const uint64_t pg = sys_page();
    pkv_vmm_budget *b = (pkv_vmm_budget *)1;
    cr_assert_eq(pkv_vmm_budget_create(0, &b), PKV_ERR_INVALID_ARG);
    cr_assert_null(b);
    cr_assert_eq(pkv_vmm_budget_create(pg, NULL), PKV_ERR_INVALID_ARG);
    cr_assert_eq(pkv_vmm_budget_create(3 * pg, &b), PKV_OK);
    pkv_vmm_space *x = make(PKV_VMM_HOST_MEMFD, 1, 1, pg, 4, 0);
    pkv_vmm_space *y = make(PKV_VMM_HOST_MEMFD, 1, 1, pg, 4, 0);
    cr_assert_eq(pkv_vmm_budget_attach(NULL, x), PKV_ERR_INVALID_ARG);
    cr_assert_eq(pkv_vmm_budget_attach(b, NULL), PKV_ERR_INVALID_ARG);
    uint32_t sx, sy;
    pkv_vmm_slot_acquire(x, &sx);
    pkv_vmm_slot_acquire(y, &sy);
    cr_assert_eq(pkv_vmm_slot_resize(y, sy, pg), PKV_OK);
    cr_assert_eq(pkv_vmm_budget_attach(b, y), PKV_ERR_INVALID_ARG, "y has a page already");
    cr_assert_eq(pkv_vmm_slot_release(y, sy), PKV_OK);
    cr_assert_eq(pkv_vmm_budget_attach(b, y), PKV_ERR_INVALID_ARG, "a cached page exists");
    cr_assert_eq(pkv_vmm_budget_attach(b, x), PKV_OK);
    cr_assert_eq(pkv_vmm_budget_attach(b, x), PKV_ERR_INVALID_ARG, "already a member");
    cr_assert_eq(pkv_vmm_slot_resize(x, sx, 4 * pg), PKV_ERR_OUT_OF_BLOCKS, "4 > 3 pages");
    cr_assert_eq(pkv_vmm_slot_resize(x, sx, 3 * pg), PKV_OK);
    pkv_vmm_budget_stats bs;
    cr_assert_eq(pkv_vmm_budget_get_stats(b, &bs), PKV_OK);
    cr_assert_eq(bs.bytes_used, 3 * pg);
    cr_assert_eq(bs.num_spaces, 1);
    cr_assert_eq(pkv_vmm_budget_get_stats(NULL, &bs), PKV_ERR_INVALID_ARG);
    pkv_vmm_space_destroy(x); // leaves the budget
    cr_assert_eq(pkv_vmm_budget_get_stats(b, &bs), PKV_OK);
    cr_assert_eq(bs.bytes_used, 0);
    cr_assert_eq(bs.bytes_used_peak, 3 * pg);
    cr_assert_eq(bs.num_spaces, 0);
    pkv_vmm_space *z = make(PKV_VMM_HOST_MEMFD, 1, 1, pg, 4, 0);
    cr_assert_eq(pkv_vmm_budget_attach(b, z), PKV_OK);
    pkv_vmm_budget_destroy(b); // z goes on alone, under its own max_pages
    uint32_t sz;
    pkv_vmm_slot_acquire(z, &sz);
    cr_assert_eq(pkv_vmm_slot_resize(z, sz, 4 * pg), PKV_OK);
    pkv_vmm_space_destroy(z);
    pkv_vmm_space_destroy(y);
    pkv_vmm_budget_destroy(NULL);
}

// A gemma-like pair: a full-attention space (pages of 2 system pages) and a
// sliding one (1 system page) under one budget of 8 system pages. The sliding
// group's released pages stay cached in its space; when the full group needs
// them they are reclaimed (memfd: a punch-hole call each), counted in the budget.
Test(vmm_window, a_group_reclaims_the_pages_another_group_gave_up) {
    for (int m = 0; m < 2; m++) {
        const uint64_t pg = sys_page();
        pkv_vmm_budget *b = NULL;
        cr_assert_eq(pkv_vmm_budget_create(8 * pg, &b), PKV_OK);
        pkv_vmm_space *full = make(modes[m], 1, 1, 2 * pg, 8, 0);
        pkv_vmm_space *swa = make(modes[m], 1, 1, pg, 16, 0);
        cr_assert_eq(pkv_vmm_budget_attach(b, full), PKV_OK);
        cr_assert_eq(pkv_vmm_budget_attach(b, swa), PKV_OK);
        uint32_t f, w;
        pkv_vmm_slot_acquire(full, &f);
        pkv_vmm_slot_acquire(swa, &w);
        cr_assert_eq(pkv_vmm_slot_map_range(swa, w, 0, 6 * pg), PKV_OK); // 6 of 8
        cr_assert_eq(pkv_vmm_slot_map_range(full, f, 0, 2 * pg), PKV_OK); // 8 of 8
        cr_assert_eq(pkv_vmm_slot_map_range(full, f, 0, 4 * pg), PKV_ERR_OUT_OF_BLOCKS,
                     "nothing cached anywhere: the budget is full");
        cr_assert_eq(pkv_vmm_slot_map_range(swa, w, 4 * pg, 6 * pg), PKV_OK,
                     "the window leaves pages 0..3: cached in swa");
        pkv_vmm_stats before;
        pkv_vmm_get_stats(swa, &before);
        cr_assert_eq(before.pages_created, 6);
        cr_assert_eq(pkv_vmm_slot_map_range(full, f, 0, 6 * pg), PKV_OK,
                     "2 more full pages = 4 system pages: swa's 4 cached ones reclaimed");
        pkv_vmm_stats after;
        pkv_vmm_get_stats(swa, &after);
        cr_assert_eq(after.pages_created, 2, "swa keeps only its window");
        cr_assert_eq(after.destroy_calls - before.destroy_calls, m == 0 ? 4u : 0u,
                     "memfd punches each page out; mprotect gave it back at unmap");
        pkv_vmm_budget_stats bs;
        pkv_vmm_budget_get_stats(b, &bs);
        cr_assert_eq(bs.bytes_used, 8 * pg);
        cr_assert_eq(bs.pages_reclaimed, 4);
        cr_assert_eq(pkv_vmm_validate(full), PKV_OK);
        cr_assert_eq(pkv_vmm_validate(swa), PKV_OK);
        // swa grows again: its released ids are made again (the budget has no room
        // left, and full caches nothing): refused, nothing changes.
        cr_assert_eq(pkv_vmm_slot_map_range(swa, w, 4 * pg, 7 * pg), PKV_ERR_OUT_OF_BLOCKS);
        cr_assert_eq(pkv_vmm_slot_map_range(full, f, 0, 4 * pg), PKV_OK); // caches 1 page
        cr_assert_eq(pkv_vmm_slot_map_range(swa, w, 4 * pg, 8 * pg), PKV_OK,
                     "full's cached 2-page page makes room for 2 swa pages");
        pkv_vmm_budget_get_stats(b, &bs);
        cr_assert_eq(bs.bytes_used, 8 * pg);
        cr_assert_eq(bs.pages_reclaimed, 5);
        cr_assert_eq(pkv_vmm_validate(full), PKV_OK);
        cr_assert_eq(pkv_vmm_validate(swa), PKV_OK);
        pkv_vmm_space_destroy(full);
        pkv_vmm_space_destroy(swa);
        pkv_vmm_budget_destroy(b);
    }
}

// Reference of one space in the walk: the mapped run of each slot and the page
// counts the budget sees.
typedef struct ref_space {
    pkv_vmm_space *s;
    uint64_t page;    // bytes
    uint32_t buffers;
    uint64_t row_pages, max_pages;
    int taken[4];
    uint64_t lo[4], hi[4];
    uint64_t cached;  // created, unmapped
    uint64_t live;    // created and not released (mapped + cached)
} ref_space;

// Which (slot, page, buffer) a page was written as: a page mapped into another
// row, or replaced while kept, shows.
static uint64_t stamp(uint32_t slot, uint64_t page, uint32_t buffer) {
    return ((uint64_t)slot << 12) | (page << 4) | buffer;
}

static uint64_t mapped_of(const ref_space *r) {
    uint64_t n = 0;
    for (int i = 0; i < 4; i++) n += (r->hi[i] - r->lo[i]) * r->buffers;
    return n;
}

// Random map_range / resize / acquire / release over two spaces of different page
// sizes and one budget; after every step the ranges, the pages that exist, the
// budget's bytes and each kept page's stamp are checked, and both spaces validate.
Test(vmm_window, random_walk_over_two_groups_matches_a_reference) {
    for (int m = 0; m < 2; m++) {
        rng_state = 7 + (uint64_t)m;
        const uint64_t pg = sys_page(), budget_bytes = 40 * pg;
        pkv_vmm_budget *b = NULL;
        cr_assert_eq(pkv_vmm_budget_create(budget_bytes, &b), PKV_OK);
        ref_space r[2] = {{.page = pg, .buffers = 2, .row_pages = 12, .max_pages = 30},
                          {.page = 2 * pg, .buffers = 3, .row_pages = 6, .max_pages = 0}};
        for (int i = 0; i < 2; i++) {
            r[i].s = make(modes[m], 4, r[i].buffers, r[i].page, r[i].row_pages, r[i].max_pages);
            if (!r[i].max_pages) r[i].max_pages = 4 * r[i].buffers * r[i].row_pages;
            cr_assert_eq(pkv_vmm_budget_attach(b, r[i].s), PKV_OK);
        }
        uint64_t refused = 0, reclaimed = 0, slid = 0;
        for (int step = 0; step < 2500; step++) {
            ref_space *x = &r[rng_next() % 2], *o = x == &r[0] ? &r[1] : &r[0];
            uint32_t slot = (uint32_t)(rng_next() % 4);
            int op = (int)(rng_next() % 10);
            if (!x->taken[slot]) {
                uint32_t got, lowest = 0;
                while (x->taken[lowest]) lowest++;
                cr_assert_eq(pkv_vmm_slot_acquire(x->s, &got), PKV_OK);
                cr_assert_eq(got, lowest, "lowest free slot first");
                x->taken[got] = 1;
                x->lo[got] = x->hi[got] = 0;
            } else if (op == 0) {
                cr_assert_eq(pkv_vmm_slot_release(x->s, slot), PKV_OK);
                x->cached += (x->hi[slot] - x->lo[slot]) * x->buffers;
                x->taken[slot] = 0;
                x->lo[slot] = x->hi[slot] = 0;
            } else {
                uint64_t row = x->row_pages * x->page;
                uint64_t first = rng_next() % (row + 1), end = rng_next() % (row + 1);
                if (op < 3) first = 0; // a resize
                uint64_t lo = first / x->page, hi = (end + x->page - 1) / x->page;
                if (end <= first) lo = hi = 0;
                uint64_t olo = x->lo[slot], ohi = x->hi[slot];
                uint64_t klo = olo > lo ? olo : lo, khi = ohi < hi ? ohi : hi;
                uint64_t kept = khi > klo ? khi - klo : 0;
                uint64_t need = (hi - lo - kept) * x->buffers;
                uint64_t freed = (ohi - olo - kept) * x->buffers;
                uint64_t fresh = need > x->cached + freed ? need - x->cached - freed : 0;
                uint64_t used = r[0].live * r[0].page + r[1].live * r[1].page;
                uint64_t room = budget_bytes - used + o->cached * o->page;
                int ok = fresh <= x->max_pages - x->live && fresh * x->page <= room;
                pkv_status st = op < 3 ? pkv_vmm_slot_resize(x->s, slot, end)
                                       : pkv_vmm_slot_map_range(x->s, slot, first, end);
                if (!ok) {
                    cr_assert_eq(st, PKV_ERR_OUT_OF_BLOCKS, "step %d", step);
                    refused++;
                } else {
                    cr_assert_eq(st, PKV_OK, "step %d: %s", step, pkv_status_str(st));
                    slid += lo > olo && kept > 0;
                    x->cached = x->cached + freed - (need - fresh);
                    x->live += fresh;
                    // Fresh pages beyond the budget's headroom come from o's cache,
                    // largest page first: o is the only other member.
                    uint64_t headroom = budget_bytes - used;
                    while (headroom < fresh * x->page) {
                        cr_assert_gt(o->cached, 0);
                        o->cached--;
                        o->live--;
                        headroom += o->page;
                        reclaimed++;
                    }
                    x->lo[slot] = lo;
                    x->hi[slot] = hi;
                    // Stamp the new pages; the kept ones keep their stamps.
                    for (uint64_t p = lo; p < hi; p++)
                        if (p < klo || p >= khi || kept == 0)
                            for (uint32_t bf = 0; bf < x->buffers; bf++)
                                *(uint64_t *)page_ptr(x->s, slot, bf, p) =
                                    ((uint64_t)step << 20) | stamp(slot, p, bf);
                }
            }
            pkv_vmm_budget_stats bs;
            pkv_vmm_budget_get_stats(b, &bs);
            cr_assert_eq(bs.bytes_used, r[0].live * r[0].page + r[1].live * r[1].page,
                         "step %d", step);
            cr_assert_leq(bs.bytes_used, budget_bytes);
            cr_assert_eq(bs.pages_reclaimed, reclaimed, "step %d", step);
            for (int i = 0; i < 2; i++) {
                cr_assert_eq(pkv_vmm_validate(r[i].s), PKV_OK, "step %d space %d", step, i);
                pkv_vmm_stats st;
                pkv_vmm_get_stats(r[i].s, &st);
                cr_assert_eq(st.pages_mapped, mapped_of(&r[i]), "step %d", step);
                cr_assert_eq(st.pages_created, r[i].live, "step %d space %d", step, i);
                for (uint32_t sl = 0; sl < 4; sl++) {
                    cr_assert_eq(pkv_vmm_slot_pages(r[i].s, sl), r[i].hi[sl] - r[i].lo[sl]);
                    if (r[i].hi[sl] > r[i].lo[sl])
                        cr_assert_eq(pkv_vmm_slot_first_page(r[i].s, sl), r[i].lo[sl]);
                    for (uint64_t p = r[i].lo[sl]; p < r[i].hi[sl]; p++)
                        for (uint32_t bf = 0; bf < r[i].buffers; bf++) {
                            uint64_t v = *(uint64_t *)page_ptr(r[i].s, sl, bf, p);
                            cr_assert_eq(v & 0xfffff, stamp(sl, p, bf), "step %d: page %llu",
                                         step, (unsigned long long)p);
                        }
                }
            }
        }
        cr_assert_gt(refused, 20, "the walk must reach the budget");
        cr_assert_gt(reclaimed, 20, "and reclaim across groups");
        cr_assert_gt(slid, 50, "and slide windows");
        for (int i = 0; i < 2; i++) pkv_vmm_space_destroy(r[i].s);
        pkv_vmm_budget_destroy(b);
    }
}

// With several members caching, the largest cached page goes first, so the fewest
// release calls make the room: one 4-page page rather than four 1-page ones.
Test(vmm_window, reclaim_releases_the_largest_cached_page_first) {
    const uint64_t pg = sys_page();
    pkv_vmm_budget *b = NULL;
    cr_assert_eq(pkv_vmm_budget_create(12 * pg, &b), PKV_OK);
    pkv_vmm_space *small = make(PKV_VMM_HOST_MEMFD, 1, 1, pg, 8, 0);
    pkv_vmm_space *large = make(PKV_VMM_HOST_MEMFD, 1, 1, 4 * pg, 2, 0);
    pkv_vmm_space *need = make(PKV_VMM_HOST_MEMFD, 1, 1, 4 * pg, 1, 0);
    pkv_vmm_space *all[3] = {small, large, need};
    uint32_t slot[3];
    for (int i = 0; i < 3; i++) {
        cr_assert_eq(pkv_vmm_budget_attach(b, all[i]), PKV_OK);
        pkv_vmm_slot_acquire(all[i], &slot[i]);
    }
    cr_assert_eq(pkv_vmm_slot_resize(small, slot[0], 4 * pg), PKV_OK);     // 4
    cr_assert_eq(pkv_vmm_slot_resize(large, slot[1], 2 * 4 * pg), PKV_OK); // 12
    cr_assert_eq(pkv_vmm_slot_release(small, slot[0]), PKV_OK); // 4 cached 1-page pages
    cr_assert_eq(pkv_vmm_slot_resize(large, slot[1], 4 * pg), PKV_OK); // 1 cached 4-page page
    cr_assert_eq(pkv_vmm_slot_resize(need, slot[2], 4 * pg), PKV_OK);
    pkv_vmm_budget_stats bs;
    pkv_vmm_budget_get_stats(b, &bs);
    cr_assert_eq(bs.pages_reclaimed, 1, "one large page, not four small ones");
    pkv_vmm_stats st;
    pkv_vmm_get_stats(small, &st);
    cr_assert_eq(st.pages_created, 4, "the small pages stay cached");
    for (int i = 0; i < 3; i++) {
        cr_assert_eq(pkv_vmm_validate(all[i]), PKV_OK);
        pkv_vmm_space_destroy(all[i]);
    }
    pkv_vmm_budget_destroy(b);
}

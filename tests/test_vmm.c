// SPDX-License-Identifier: MIT
// The VMM space (vAttention-style virtual-contiguous KV) on the host, both commit
// modes: commit/release accounting against a reference model, content surviving
// growth across page boundaries while other slots churn, exhaustion statuses that
// change nothing, and the contiguous decode kernel on a VMM cache giving exactly
// what it gives on an ordinary contiguous cache.
#include <criterion/criterion.h>
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "pkv/attention.h"
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
                           uint64_t row_pages, uint64_t max_pages) {
    pkv_vmm_params p = pkv_vmm_params_default();
    p.num_slots = slots;
    p.num_buffers = buffers;
    p.page_bytes = 2 * sys_page();
    p.buffer_bytes = row_pages * p.page_bytes;
    p.max_pages = max_pages;
    p.host_mode = mode;
    pkv_vmm_space *s = NULL;
    pkv_status st = pkv_vmm_space_create_host(&p, &s);
    cr_assert_eq(st, PKV_OK, "create (%d): %s", (int)mode, pkv_status_str(st));
    return s;
}

Test(vmm, params_are_checked) {
    pkv_vmm_params p = pkv_vmm_params_default();
    pkv_vmm_space *s = (pkv_vmm_space *)1;
    cr_assert_eq(pkv_vmm_space_create_host(NULL, &s), PKV_ERR_INVALID_ARG);
    cr_assert_null(s, "*out is cleared on failure");
    p.num_slots = 0;
    cr_assert_eq(pkv_vmm_space_create_host(&p, &s), PKV_ERR_INVALID_ARG);
    p = pkv_vmm_params_default();
    p.page_bytes = sys_page() + 1; // not a multiple of the granularity
    cr_assert_eq(pkv_vmm_space_create_host(&p, &s), PKV_ERR_INVALID_ARG);
    p = pkv_vmm_params_default();
    p.host_mode = (pkv_vmm_host_mode)7;
    cr_assert_eq(pkv_vmm_space_create_host(&p, &s), PKV_ERR_INVALID_ARG);
    p = pkv_vmm_params_default();
    p.buffer_bytes = UINT64_MAX - 3; // overflows when rounded
    cr_assert_eq(pkv_vmm_space_create_host(&p, &s), PKV_ERR_INVALID_ARG);
    // Rounding: a row of 1 byte becomes one page; the default page is the granularity.
    p = pkv_vmm_params_default();
    p.buffer_bytes = 1;
    p.num_slots = 3;
    p.num_buffers = 4;
    cr_assert_eq(pkv_vmm_space_create_host(&p, &s), PKV_OK);
    pkv_vmm_info info;
    cr_assert_eq(pkv_vmm_get_info(s, &info), PKV_OK);
    cr_assert_eq(info.page_bytes, sys_page());
    cr_assert_eq(info.buffer_bytes, sys_page());
    cr_assert_eq(info.pages_per_row, 1);
    cr_assert_eq(info.max_pages, 12, "default budget backs every row: %llu",
                 (unsigned long long)info.max_pages);
    cr_assert_eq(info.reserved_bytes, 12 * sys_page());
    void *b0, *b1;
    cr_assert_eq(pkv_vmm_buffer_ptr(s, 0, &b0), PKV_OK);
    cr_assert_eq(pkv_vmm_buffer_ptr(s, 1, &b1), PKV_OK);
    cr_assert_eq((char *)b1 - (char *)b0, 3 * (ptrdiff_t)sys_page(), "buffer = [slots][row]");
    cr_assert_eq(pkv_vmm_buffer_ptr(s, 4, &b0), PKV_ERR_INVALID_ARG);
    cr_assert_eq(pkv_vmm_slot_resize(s, 0, 1), PKV_ERR_INVALID_ARG, "slot not acquired");
    pkv_vmm_space_destroy(s);
    pkv_vmm_space_destroy(NULL);
    cr_assert_str_eq(pkv_vmm_name(NULL), "none");
}

// Random acquire / resize / release against a reference of pages per slot; the
// space's invariant check after every step (each physical page free or mapped
// once: nothing leaked, nothing mapped twice) and every counter derived from the
// reference.
Test(vmm, accounting_matches_a_reference) {
    for (int m = 0; m < 2; m++) {
        rng_state = 42 + (uint64_t)m;
        const uint32_t slots = 6, buffers = 3;
        const uint64_t row_pages = 5, budget = 24; // far less than 6 x 3 x 5 = 90
        pkv_vmm_space *s = make(modes[m], slots, buffers, row_pages, budget);
        pkv_vmm_info info;
        pkv_vmm_get_info(s, &info);
        int taken[6] = {0};
        uint64_t ref_pages[6] = {0};
        uint64_t maps = 0, unmaps = 0, ref_peak = 0, created_max = 0, refused = 0;
        for (int step = 0; step < 3000; step++) {
            uint32_t slot = (uint32_t)(rng_next() % slots);
            uint64_t total = 0;
            for (uint32_t i = 0; i < slots; i++) total += ref_pages[i];
            int op = (int)(rng_next() % 10);
            if (!taken[slot] && op < 8) {
                uint32_t got = 99;
                cr_assert_eq(pkv_vmm_slot_acquire(s, &got), PKV_OK);
                uint32_t lowest = 0;
                while (taken[lowest]) lowest++;
                cr_assert_eq(got, lowest, "lowest free slot first");
                taken[got] = 1;
            } else if (taken[slot] && op < 8) {
                uint64_t bytes = rng_next() % (info.buffer_bytes + 1);
                uint64_t want = (bytes + info.page_bytes - 1) / info.page_bytes;
                pkv_status st = pkv_vmm_slot_resize(s, slot, bytes);
                uint64_t have = ref_pages[slot];
                if (want > have && (want - have) * buffers > budget - total * buffers) {
                    cr_assert_eq(st, PKV_ERR_OUT_OF_BLOCKS, "step %d: over budget", step);
                    refused++;
                } else {
                    cr_assert_eq(st, PKV_OK, "step %d: %s", step, pkv_status_str(st));
                    if (want > have) maps += (want - have) * buffers;
                    else unmaps += (have - want) * buffers;
                    ref_pages[slot] = want;
                }
            } else if (taken[slot]) {
                cr_assert_eq(pkv_vmm_slot_release(s, slot), PKV_OK);
                unmaps += ref_pages[slot] * buffers;
                ref_pages[slot] = 0;
                taken[slot] = 0;
            } else {
                cr_assert_eq(pkv_vmm_slot_release(s, slot), PKV_ERR_INVALID_ARG);
            }
            cr_assert_eq(pkv_vmm_validate(s), PKV_OK, "step %d", step);
            total = 0;
            for (uint32_t i = 0; i < slots; i++) {
                cr_assert_eq(pkv_vmm_slot_pages(s, i), ref_pages[i], "step %d slot %u", step, i);
                total += ref_pages[i];
            }
            if (total * buffers > ref_peak) ref_peak = total * buffers;
            pkv_vmm_stats st;
            pkv_vmm_get_stats(s, &st);
            cr_assert_eq(st.pages_mapped, total * buffers);
            cr_assert_eq(st.map_calls, maps, "step %d", step);
            cr_assert_eq(st.unmap_calls, unmaps, "step %d", step);
            cr_assert_eq(st.pages_mapped_peak, ref_peak);
            cr_assert_leq(st.pages_created, budget);
            // Physical pages are created only when the free stack is empty: never
            // more than the peak of mapped pages.
            cr_assert_eq(st.pages_created, ref_peak, "step %d: created %llu peak %llu", step,
                         (unsigned long long)st.pages_created, (unsigned long long)ref_peak);
            created_max = st.pages_created;
            cr_assert_eq(st.pages_lost, 0);
        }
        cr_assert_gt(maps, 500, "the walk must exercise mapping");
        cr_assert_eq(created_max, budget, "and reach the budget");
        cr_assert_gt(refused, 10, "and be refused past it");
        pkv_vmm_space_destroy(s);
    }
}

// Each slot's rows hold a pattern; growing across page boundaries (while other
// slots release pages that get reused) keeps every byte already written.
Test(vmm, content_survives_growth_across_pages) {
    for (int m = 0; m < 2; m++) {
        rng_state = 7;
        const uint32_t slots = 4, buffers = 2;
        const uint64_t row_pages = 6;
        pkv_vmm_space *s = make(modes[m], slots, buffers, row_pages, 0);
        pkv_vmm_info info;
        pkv_vmm_get_info(s, &info);
        uint64_t len[4] = {0};
        for (uint32_t i = 0; i < slots; i++) {
            uint32_t got;
            cr_assert_eq(pkv_vmm_slot_acquire(s, &got), PKV_OK);
        }
        unsigned char *buf[2];
        pkv_vmm_buffer_ptr(s, 0, (void **)&buf[0]);
        pkv_vmm_buffer_ptr(s, 1, (void **)&buf[1]);
        for (int step = 0; step < 400; step++) {
            uint32_t slot = (uint32_t)(rng_next() % slots);
            if (rng_next() % 5 == 0 && slot != 0) { // churn: others shrink to 0 and regrow
                cr_assert_eq(pkv_vmm_slot_resize(s, slot, 0), PKV_OK);
                len[slot] = 0;
                continue;
            }
            uint64_t grow = 1 + rng_next() % (info.page_bytes / 2 + 1); // crosses pages often
            if (len[slot] + grow > info.buffer_bytes) continue;
            cr_assert_eq(pkv_vmm_slot_resize(s, slot, len[slot] + grow), PKV_OK);
            for (uint32_t b = 0; b < buffers; b++) {
                unsigned char *r = buf[b] + (uint64_t)slot * info.buffer_bytes;
                for (uint64_t i = len[slot]; i < len[slot] + grow; i++)
                    r[i] = (unsigned char)(i * 31 + slot * 7 + b * 3 + 1);
            }
            len[slot] += grow;
            for (uint32_t t = 0; t < slots; t++) {
                for (uint32_t b = 0; b < buffers; b++) {
                    const unsigned char *r = buf[b] + (uint64_t)t * info.buffer_bytes;
                    for (uint64_t i = 0; i < len[t]; i++)
                        cr_assert_eq(r[i], (unsigned char)(i * 31 + t * 7 + b * 3 + 1),
                                     "mode %d step %d slot %u buffer %u byte %llu", m, step, t,
                                     b, (unsigned long long)i);
                }
            }
        }
        cr_assert_gt(len[0], 2 * info.page_bytes, "slot 0 grew across pages");
        cr_assert_eq(pkv_vmm_validate(s), PKV_OK);
        pkv_vmm_space_destroy(s);
    }
}

Test(vmm, exhaustion_gives_a_status_and_changes_nothing) {
    for (int m = 0; m < 2; m++) {
        pkv_vmm_space *s = make(modes[m], 2, 2, 4, 5); // 5 pages, rows of 4
        pkv_vmm_info info;
        pkv_vmm_get_info(s, &info);
        uint32_t a, b, c;
        cr_assert_eq(pkv_vmm_slot_acquire(s, &a), PKV_OK);
        cr_assert_eq(pkv_vmm_slot_acquire(s, &b), PKV_OK);
        cr_assert_eq(pkv_vmm_slot_acquire(s, &c), PKV_ERR_OUT_OF_BLOCKS, "every slot taken");
        cr_assert_eq(pkv_vmm_slot_resize(s, a, 2 * info.page_bytes), PKV_OK); // 4 pages
        pkv_vmm_stats before, after;
        pkv_vmm_get_stats(s, &before);
        // Slot b needs 2 pages (2 buffers), 1 is left: refused before any call.
        cr_assert_eq(pkv_vmm_slot_resize(s, b, 1), PKV_ERR_OUT_OF_BLOCKS);
        // Past the virtual reservation: the request outgrew its max length.
        cr_assert_eq(pkv_vmm_slot_resize(s, a, info.buffer_bytes + 1), PKV_ERR_INVALID_ARG);
        pkv_vmm_get_stats(s, &after);
        cr_assert_eq(after.map_calls, before.map_calls, "no map call was made");
        cr_assert_eq(after.pages_mapped, 4);
        cr_assert_eq(pkv_vmm_slot_pages(s, b), 0);
        cr_assert_eq(pkv_vmm_slot_pages(s, a), 2);
        cr_assert_eq(pkv_vmm_validate(s), PKV_OK);
        // Shrinking a to one page per buffer leaves 3 free: b gets one page per
        // buffer, not two.
        cr_assert_eq(pkv_vmm_slot_resize(s, a, 1), PKV_OK);
        cr_assert_eq(pkv_vmm_slot_resize(s, b, info.page_bytes + 1), PKV_ERR_OUT_OF_BLOCKS);
        cr_assert_eq(pkv_vmm_slot_resize(s, b, info.page_bytes), PKV_OK);
        cr_assert_eq(pkv_vmm_slot_pages(s, b), 1);
        cr_assert_eq(pkv_vmm_validate(s), PKV_OK);
        pkv_vmm_space_destroy(s);
    }
}

// Released physical pages are reused before new ones are created (vAttention keeps
// its handles), and in MEMFD mode the same physical page keeps its bytes.
Test(vmm, released_pages_are_reused) {
    pkv_vmm_space *s = make(PKV_VMM_HOST_MEMFD, 2, 1, 2, 0);
    pkv_vmm_info info;
    pkv_vmm_get_info(s, &info);
    uint32_t a, b;
    pkv_vmm_slot_acquire(s, &a);
    pkv_vmm_slot_acquire(s, &b);
    cr_assert_eq(pkv_vmm_slot_resize(s, a, info.page_bytes), PKV_OK);
    unsigned char *base;
    pkv_vmm_buffer_ptr(s, 0, (void **)&base);
    memset(base, 0xab, info.page_bytes);
    int64_t phys = pkv_vmm_page_physical(s, a, 0, 0);
    cr_assert_geq(phys, 0);
    cr_assert_eq(pkv_vmm_slot_release(s, a), PKV_OK);
    cr_assert_eq(pkv_vmm_page_physical(s, a, 0, 0), -1);
    cr_assert_eq(pkv_vmm_slot_resize(s, b, 1), PKV_OK);
    cr_assert_eq(pkv_vmm_page_physical(s, b, 0, 0), phys, "the freed page is reused");
    cr_assert_eq(base[info.buffer_bytes], 0xab, "a physical page keeps its bytes");
    pkv_vmm_stats st;
    pkv_vmm_get_stats(s, &st);
    cr_assert_eq(st.create_calls, 1);
    cr_assert_eq(st.map_calls, 2);
    cr_assert_eq(st.unmap_calls, 1);
    cr_assert_eq(st.reserve_calls, 1);
    pkv_vmm_reset_stats(s);
    pkv_vmm_get_stats(s, &st);
    cr_assert_eq(st.map_calls, 0);
    cr_assert_eq(st.pages_mapped, 1, "gauges survive a reset");
    pkv_vmm_space_destroy(s);
}

// Decode attention: the contiguous kernel over a VMM space (token-major rows,
// pages committed only up to each sequence's length, so a read past it faults)
// gives bit-for-bit what it gives over an ordinary malloc'd contiguous cache.
Test(vmm, contiguous_attention_runs_unchanged_on_a_vmm_cache) {
    for (int m = 0; m < 2; m++) {
        rng_state = 99;
        const uint32_t layers = 2, seqs = 3, kvh = 2, heads = 4, dim = 64, max_len = 700;
        const int32_t lens[3] = {1, 333, 700};
        const uint64_t row_elems = (uint64_t)max_len * kvh * dim; // [token][kv_head][dim]
        pkv_vmm_params p = pkv_vmm_params_default();
        p.num_slots = seqs;
        p.num_buffers = 2 * layers;
        p.buffer_bytes = row_elems * sizeof(float);
        p.page_bytes = 4 * sys_page();
        p.host_mode = modes[m];
        pkv_vmm_space *s = NULL;
        cr_assert_eq(pkv_vmm_space_create_host(&p, &s), PKV_OK);
        pkv_vmm_info info;
        pkv_vmm_get_info(s, &info);
        size_t plain_elems = (size_t)seqs * row_elems;
        float *plain = malloc(2 * layers * plain_elems * sizeof(float));
        float *q = malloc((size_t)seqs * heads * dim * sizeof(float));
        float *out_a = malloc((size_t)seqs * heads * dim * sizeof(float));
        float *out_b = malloc((size_t)seqs * heads * dim * sizeof(float));
        cr_assert(plain && q && out_a && out_b);
        for (size_t i = 0; i < 2 * layers * plain_elems; i++) plain[i] = NAN; // unused: NaN
        for (uint32_t i = 0; i < seqs; i++) {
            uint32_t slot;
            cr_assert_eq(pkv_vmm_slot_acquire(s, &slot), PKV_OK);
            cr_assert_eq(slot, i);
            uint64_t bytes = (uint64_t)lens[i] * kvh * dim * sizeof(float);
            cr_assert_eq(pkv_vmm_slot_resize(s, slot, bytes), PKV_OK);
            for (uint32_t b = 0; b < 2 * layers; b++) {
                float *row;
                pkv_vmm_buffer_ptr(s, b, (void **)&row);
                row += (uint64_t)slot * (info.buffer_bytes / sizeof(float));
                float *ref = plain + b * plain_elems + (uint64_t)slot * row_elems;
                for (uint64_t e = 0; e < (uint64_t)lens[i] * kvh * dim; e++) {
                    float v = (float)((double)(rng_next() >> 11) / 9007199254740992.0 - 0.5);
                    row[e] = ref[e] = v;
                }
            }
        }
        for (size_t i = 0; i < (size_t)seqs * heads * dim; i++)
            q[i] = (float)((double)(rng_next() >> 11) / 9007199254740992.0 - 0.5);
        pkv_attn_shape sh = {heads, kvh, dim, PKV_DTYPE_F32, 0.125f, 2};
        for (uint32_t l = 0; l < layers; l++) {
            pkv_attn_contig_kv a = {plain + 2 * l * plain_elems,
                                    plain + (2 * l + 1) * plain_elems,
                                    row_elems, dim, (uint64_t)kvh * dim, max_len, lens, NULL};
            void *k, *v;
            pkv_vmm_buffer_ptr(s, 2 * l, &k);
            pkv_vmm_buffer_ptr(s, 2 * l + 1, &v);
            pkv_attn_contig_kv b = {k, v, info.buffer_bytes / sizeof(float), dim,
                                    (uint64_t)kvh * dim, max_len, lens, NULL};
            cr_assert_eq(pkv_attn_decode_contig_cpu(&sh, seqs, q, &a, out_a), PKV_OK);
            cr_assert_eq(pkv_attn_decode_contig_cpu(&sh, seqs, q, &b, out_b), PKV_OK);
            for (size_t i = 0; i < (size_t)seqs * heads * dim; i++) {
                cr_assert(isfinite(out_a[i]), "layer %u elem %zu: NaN read", l, i);
                cr_assert_eq(memcmp(&out_a[i], &out_b[i], sizeof(float)), 0,
                             "mode %d layer %u elem %zu: %g vs %g", m, l, i, out_a[i],
                             out_b[i]);
            }
        }
        pkv_vmm_stats st;
        pkv_vmm_get_stats(s, &st);
        // Only each sequence's prefix is committed: internal fragmentation < 1 page/row.
        uint64_t want = 0;
        for (uint32_t i = 0; i < seqs; i++)
            want += ((uint64_t)lens[i] * kvh * dim * 4 + info.page_bytes - 1) / info.page_bytes;
        cr_assert_eq(st.pages_mapped, want * 2 * layers);
        cr_assert_lt(st.pages_mapped, (uint64_t)seqs * 2 * layers * info.pages_per_row);
        free(plain);
        free(q);
        free(out_a);
        free(out_b);
        pkv_vmm_space_destroy(s);
    }
}

// ---- the bookkeeping alone, over a fake implementation that fails on demand ----

#include "src/allocator/vmm_impl.h"

typedef struct fake {
    int maps, unmaps;        // calls so far
    int fail_map_at;         // the map call (1-based) that fails; 0 = none
    int fail_unmap_at;
} fake;

static pkv_status fake_reserve(pkv_vmm_space *s, uint64_t bytes, uint64_t align, void **base) {
    (void)s;
    (void)bytes;
    *base = (void *)(uintptr_t)align; // never dereferenced
    return PKV_OK;
}
static void fake_unreserve(pkv_vmm_space *s, void *base, uint64_t bytes) {
    (void)s;
    (void)base;
    (void)bytes;
}
static pkv_status fake_map(pkv_vmm_space *s, void *addr, uint32_t id) {
    fake *f = s->impl;
    (void)addr;
    (void)id;
    return ++f->maps == f->fail_map_at ? PKV_ERR_BACKEND : PKV_OK;
}
static pkv_status fake_unmap(pkv_vmm_space *s, void *addr, uint32_t id) {
    fake *f = s->impl;
    (void)addr;
    (void)id;
    return ++f->unmaps == f->fail_unmap_at ? PKV_ERR_BACKEND : PKV_OK;
}
static const pkvi_vmm_ops fake_ops = {
    .name = "fake", .reserve = fake_reserve, .unreserve = fake_unreserve,
    .map = fake_map, .unmap = fake_unmap,
};

static pkv_vmm_space *make_fake(fake *f, uint64_t max_pages) {
    pkv_vmm_params p = pkv_vmm_params_default();
    p.max_pages = max_pages;
    p.num_slots = 2;
    p.num_buffers = 3;
    p.page_bytes = 4096;
    p.buffer_bytes = 8 * 4096;
    pkv_vmm_space *s = NULL;
    cr_assert_eq(pkvi_vmm_space_new(&fake_ops, f, 4096, &p, &s), PKV_OK);
    return s;
}

// A map that fails halfway through a growth rolls the whole call back: the slot
// keeps its size, every page is free or mapped once, nothing is lost.
Test(vmm, failed_map_rolls_back_the_call) {
    fake f = {0};
    pkv_vmm_space *s = make_fake(&f, 0);
    uint32_t a;
    pkv_vmm_slot_acquire(s, &a);
    cr_assert_eq(pkv_vmm_slot_resize(s, a, 4096), PKV_OK); // 3 maps
    f.fail_map_at = f.maps + 5; // growing to 3 pages: the 2nd buffer of page 2 fails
    cr_assert_eq(pkv_vmm_slot_resize(s, a, 3 * 4096), PKV_ERR_BACKEND);
    cr_assert_eq(pkv_vmm_slot_pages(s, a), 1, "the slot keeps its previous size");
    cr_assert_eq(pkv_vmm_validate(s), PKV_OK);
    pkv_vmm_stats st;
    pkv_vmm_get_stats(s, &st);
    cr_assert_eq(st.pages_mapped, 3);
    cr_assert_eq(st.unmap_calls, 4, "the 4 pages the failed call mapped were unmapped");
    cr_assert_eq(st.pages_lost, 0);
    cr_assert_eq(pkv_vmm_slot_resize(s, a, 3 * 4096), PKV_OK, "and it can grow again");
    pkv_vmm_space_destroy(s);
}

// A page whose unmap fails is never handed out again (it may still be mapped).
Test(vmm, failed_unmap_loses_the_page_not_the_invariant) {
    fake f = {0};
    pkv_vmm_space *s = make_fake(&f, 13);
    uint32_t a, b;
    pkv_vmm_slot_acquire(s, &a);
    pkv_vmm_slot_acquire(s, &b);
    cr_assert_eq(pkv_vmm_slot_resize(s, a, 2 * 4096), PKV_OK); // 6 pages
    const int64_t lost = pkv_vmm_page_physical(s, a, 0, 1); // unmapped first: last page, buffer 0
    f.fail_unmap_at = 1;
    cr_assert_eq(pkv_vmm_slot_release(s, a), PKV_ERR_BACKEND);
    pkv_vmm_stats st;
    pkv_vmm_get_stats(s, &st);
    cr_assert_eq(st.pages_lost, 1);
    cr_assert_eq(st.pages_mapped, 0);
    cr_assert_eq(pkv_vmm_validate(s), PKV_OK);
    // Budget 13, 1 lost: b takes all 12 others (4 pages x 3 buffers), not 15, and
    // the lost one is not among them.
    cr_assert_eq(pkv_vmm_slot_resize(s, b, 5 * 4096), PKV_ERR_OUT_OF_BLOCKS);
    cr_assert_eq(pkv_vmm_slot_resize(s, b, 4 * 4096), PKV_OK);
    for (uint32_t buf = 0; buf < 3; buf++)
        for (uint64_t pg = 0; pg < 4; pg++)
            cr_assert_neq(pkv_vmm_page_physical(s, b, buf, pg), lost);
    pkv_vmm_space_destroy(s);
}

// The invariant check fails on a double map and on a leaked page.
Test(vmm, validate_catches_double_maps_and_leaks) {
    fake f = {0};
    pkv_vmm_space *s = make_fake(&f, 0);
    uint32_t a;
    pkv_vmm_slot_acquire(s, &a);
    cr_assert_eq(pkv_vmm_slot_resize(s, a, 2 * 4096), PKV_OK);
    cr_assert_eq(pkv_vmm_slot_resize(s, a, 4096), PKV_OK); // 3 pages on the free stack
    cr_assert_eq(pkv_vmm_validate(s), PKV_OK);
    int32_t *row0 = s->page_table; // (slot 0, buffer 0)
    const int32_t keep = row0[0];
    row0[0] = s->page_table[s->info.pages_per_row]; // buffer 1's first page
    cr_assert_eq(pkv_vmm_validate(s), PKV_ERR_CORRUPT, "one page mapped twice");
    row0[0] = keep;
    s->num_free--; // a free page forgotten
    cr_assert_eq(pkv_vmm_validate(s), PKV_ERR_CORRUPT, "a leaked page");
    s->num_free++;
    cr_assert_eq(pkv_vmm_validate(s), PKV_OK);
    pkv_vmm_space_destroy(s);
}

// SPDX-License-Identifier: MIT
// The VMM space's bookkeeping, shared by the host and CUDA implementations: request
// slots, one page table per (slot, buffer) row, a stack of physical pages that exist
// but are unmapped (reused before a new one is created, as vAttention keeps its
// physical handles), the physical budget, and the counters and timers of every call.
// Invariant (pkv_vmm_validate): each physical page that exists is either on the
// free stack, lost, or in exactly one page-table entry, and each id a shared
// budget's reclaim released is on the released stack; a slot maps the same
// contiguous run of pages (slot_first, slot_pages) in every buffer.
#include <stdlib.h>
#include <string.h>

#include "vmm_impl.h"

pkv_vmm_params pkv_vmm_params_default(void) {
    pkv_vmm_params p;
    memset(&p, 0, sizeof p);
    p.num_slots = 1;
    p.num_buffers = 1;
    p.buffer_bytes = (uint64_t)2 << 20;
    p.page_bytes = 0;
    p.max_pages = 0;
    p.host_mode = PKV_VMM_HOST_MEMFD;
    return p;
}

static void free_tables(pkv_vmm_space *s) {
    free(s->slot_taken);
    free(s->slot_first);
    free(s->slot_pages);
    free(s->released);
    free(s->is_released);
    free(s->page_table);
    free(s->free_pages);
}

static pkv_status geometry(const pkv_vmm_params *p, uint64_t gran, pkv_vmm_info *info) {
    if (p->num_slots == 0 || p->num_buffers == 0 || p->buffer_bytes == 0 || gran == 0)
        return PKV_ERR_INVALID_ARG;
    uint64_t page = p->page_bytes ? p->page_bytes : gran;
    if (page % gran != 0) return PKV_ERR_INVALID_ARG;
    if (p->buffer_bytes > UINT64_MAX - page) return PKV_ERR_INVALID_ARG;
    uint64_t per_row = (p->buffer_bytes + page - 1) / page;
    uint64_t rows = (uint64_t)p->num_slots * p->num_buffers;
    if (per_row > UINT64_MAX / rows) return PKV_ERR_INVALID_ARG;
    uint64_t entries = rows * per_row;
    // Page ids are int32 in the tables; the virtual size must fit in 64 bits.
    if (entries > (uint64_t)INT32_MAX || entries > SIZE_MAX / sizeof(int32_t))
        return PKV_ERR_INVALID_ARG;
    if (per_row * page > UINT64_MAX / rows) return PKV_ERR_INVALID_ARG;
    uint64_t max_pages = p->max_pages ? p->max_pages : entries;
    if (max_pages > entries) max_pages = entries; // more could never be mapped
    memset(info, 0, sizeof *info);
    info->granularity = gran;
    info->page_bytes = page;
    info->buffer_bytes = per_row * page;
    info->pages_per_row = per_row;
    info->max_pages = max_pages;
    info->reserved_bytes = rows * per_row * page;
    info->num_slots = p->num_slots;
    info->num_buffers = p->num_buffers;
    return PKV_OK;
}

static void space_free(pkv_vmm_space *s) {
    if (s->ops->destroy) s->ops->destroy(s);
    free_tables(s);
    free(s);
}

pkv_status pkvi_vmm_space_new(const pkvi_vmm_ops *ops, void *impl, uint64_t granularity,
                              const pkv_vmm_params *params, pkv_vmm_space **out) {
    pkv_vmm_space *s = calloc(1, sizeof *s);
    if (!s) {
        pkv_vmm_space tmp = {.ops = ops, .impl = impl};
        if (ops->destroy) ops->destroy(&tmp);
        return PKV_ERR_OUT_OF_MEMORY;
    }
    s->ops = ops;
    s->impl = impl;
    pkv_status st = geometry(params, granularity, &s->info);
    if (st != PKV_OK) {
        space_free(s);
        return st;
    }
    uint64_t entries = (uint64_t)s->info.num_slots * s->info.num_buffers * s->info.pages_per_row;
    s->slot_taken = calloc(s->info.num_slots, 1);
    s->slot_first = calloc(s->info.num_slots, sizeof *s->slot_first);
    s->slot_pages = calloc(s->info.num_slots, sizeof *s->slot_pages);
    s->page_table = malloc((size_t)entries * sizeof *s->page_table);
    s->free_pages = malloc((size_t)s->info.max_pages * sizeof *s->free_pages);
    s->released = malloc((size_t)s->info.max_pages * sizeof *s->released);
    s->is_released = calloc((size_t)s->info.max_pages, 1);
    if (!s->slot_taken || !s->slot_first || !s->slot_pages || !s->page_table ||
        !s->free_pages || !s->released || !s->is_released) {
        space_free(s);
        return PKV_ERR_OUT_OF_MEMORY;
    }
    for (uint64_t i = 0; i < entries; i++) s->page_table[i] = -1;
    if (ops->prepare && (st = ops->prepare(s)) != PKV_OK) {
        space_free(s);
        return st;
    }
    void *base = NULL;
    double t0 = pkvi_now_seconds();
    st = ops->reserve(s, s->info.reserved_bytes, s->info.page_bytes, &base);
    s->stats.reserve_seconds += pkvi_now_seconds() - t0;
    s->stats.reserve_calls++;
    if (st != PKV_OK) {
        space_free(s);
        return st;
    }
    s->base = base;
    *out = s;
    return PKV_OK;
}

static int32_t *row(const pkv_vmm_space *s, uint32_t slot, uint32_t buffer) {
    return s->page_table + ((uint64_t)slot * s->info.num_buffers + buffer) * s->info.pages_per_row;
}

static void *page_addr(const pkv_vmm_space *s, uint32_t slot, uint32_t buffer, uint64_t page) {
    uint64_t off = ((uint64_t)buffer * s->info.num_slots + slot) * s->info.buffer_bytes +
                   page * s->info.page_bytes;
    return s->base + off;
}

static pkv_status do_unmap(pkv_vmm_space *s, uint32_t slot, uint32_t buffer, uint64_t page) {
    int32_t *r = row(s, slot, buffer);
    int32_t id = r[page];
    double t0 = pkvi_now_seconds();
    pkv_status st = s->ops->unmap(s, page_addr(s, slot, buffer, page), (uint32_t)id);
    s->stats.unmap_seconds += pkvi_now_seconds() - t0;
    s->stats.unmap_calls++;
    // A page whose unmap failed may still be mapped there: it is never handed out
    // again (counted as lost), so no physical page can end up mapped twice.
    r[page] = -1;
    s->stats.pages_mapped--;
    if (st == PKV_OK)
        s->free_pages[s->num_free++] = (uint32_t)id;
    else
        s->stats.pages_lost++;
    return st;
}

// One physical page: the free stack first, else one within the budgets (the
// space's max_pages, then the shared budget, which may release other members'
// cached pages); an id a reclaim released is made again before a new id.
static pkv_status take_page(pkv_vmm_space *s, uint32_t *id) {
    if (s->num_free > 0) {
        *id = s->free_pages[--s->num_free];
        return PKV_OK;
    }
    if (pkvi_vmm_live_pages(s) >= s->info.max_pages) return PKV_ERR_OUT_OF_BLOCKS;
    if (s->budget && !pkvi_vmm_budget_make_room(s->budget, s, s->info.page_bytes))
        return PKV_ERR_OUT_OF_BLOCKS;
    int reuse = s->num_released > 0;
    uint32_t n = reuse ? s->released[s->num_released - 1] : s->num_created;
    if (s->ops->create) {
        double t0 = pkvi_now_seconds();
        pkv_status st = s->ops->create(s, n);
        s->stats.create_seconds += pkvi_now_seconds() - t0;
        s->stats.create_calls++;
        if (st != PKV_OK) return st;
    }
    if (reuse) {
        s->num_released--;
        s->is_released[n] = 0;
    } else {
        s->num_created++;
    }
    s->stats.pages_created++;
    if (s->budget) pkvi_vmm_budget_charge(s->budget, (int64_t)s->info.page_bytes);
    *id = n;
    return PKV_OK;
}

int pkvi_vmm_release_one(pkv_vmm_space *s) {
    if (s->num_free == 0) return 0;
    uint32_t id = s->free_pages[--s->num_free];
    if (s->ops->release_page) {
        double t0 = pkvi_now_seconds();
        pkv_status st = s->ops->release_page(s, id);
        s->stats.destroy_seconds += pkvi_now_seconds() - t0;
        s->stats.destroy_calls++;
        if (st != PKV_OK) { // still holds its memory: keep it cached
            s->free_pages[s->num_free++] = id;
            return 0;
        }
    }
    s->released[s->num_released++] = id;
    s->is_released[id] = 1;
    s->stats.pages_created--;
    if (s->budget) pkvi_vmm_budget_charge(s->budget, -(int64_t)s->info.page_bytes);
    return 1;
}

static pkv_status do_map(pkv_vmm_space *s, uint32_t slot, uint32_t buffer, uint64_t page) {
    uint32_t id;
    pkv_status st = take_page(s, &id);
    if (st != PKV_OK) return st;
    double t0 = pkvi_now_seconds();
    st = s->ops->map(s, page_addr(s, slot, buffer, page), id);
    s->stats.map_seconds += pkvi_now_seconds() - t0;
    s->stats.map_calls++;
    if (st != PKV_OK) {
        s->free_pages[s->num_free++] = id;
        return st;
    }
    row(s, slot, buffer)[page] = (int32_t)id;
    if (++s->stats.pages_mapped > s->stats.pages_mapped_peak)
        s->stats.pages_mapped_peak = s->stats.pages_mapped;
    return PKV_OK;
}

// Page `p` of every buffer of `slot` (a "page group": one token range of every layer).
static pkv_status unmap_group(pkv_vmm_space *s, uint32_t slot, uint64_t p) {
    pkv_status first = PKV_OK;
    for (uint32_t b = 0; b < s->info.num_buffers; b++) {
        pkv_status st = do_unmap(s, slot, b, p);
        if (st != PKV_OK && first == PKV_OK) first = st;
    }
    return first;
}

static pkv_status map_group(pkv_vmm_space *s, uint32_t slot, uint64_t p) {
    for (uint32_t b = 0; b < s->info.num_buffers; b++) {
        pkv_status st = do_map(s, slot, b, p);
        if (st == PKV_OK) continue;
        for (uint32_t c = 0; c < b; c++) (void)do_unmap(s, slot, c, p);
        return st;
    }
    return PKV_OK;
}

// Can `pages` new physical pages be had, with `freed` more on the free stack?
static int can_take(const pkv_vmm_space *s, uint64_t pages, uint64_t freed) {
    uint64_t cached = s->num_free + freed;
    if (pages <= cached) return 1;
    uint64_t fresh = pages - cached;
    if (fresh > s->info.max_pages - pkvi_vmm_live_pages(s)) return 0;
    if (!s->budget) return 1;
    uint64_t room = pkvi_vmm_budget_room(s->budget, s);
    return fresh <= room / s->info.page_bytes;
}

// Make pages [lo, hi) of every row of `slot` exactly the mapped ones. The pages
// leaving the range are unmapped first (onto the free stack, so a sliding window
// reuses them), then the new ones are mapped from the kept run outwards; a failed
// map unmaps this call's new pages, leaving the kept run.
static pkv_status set_range(pkv_vmm_space *s, uint32_t slot, uint64_t lo, uint64_t hi) {
    if (hi <= lo) lo = hi = 0;
    uint64_t old_lo = s->slot_first[slot], old_hi = old_lo + s->slot_pages[slot];
    uint64_t keep_lo = old_lo > lo ? old_lo : lo, keep_hi = old_hi < hi ? old_hi : hi;
    if (keep_hi <= keep_lo) keep_lo = keep_hi = lo; // nothing kept: grow from lo
    uint64_t kept = keep_hi - keep_lo;
    uint64_t nb = s->info.num_buffers;
    if (!can_take(s, (hi - lo - kept) * nb, (old_hi - old_lo - kept) * nb))
        return PKV_ERR_OUT_OF_BLOCKS; // before any call: nothing changes
    pkv_status first = PKV_OK;
    for (uint64_t end = old_hi; end > old_lo; end--) { // from the back, as a shrink does
        uint64_t p = end - 1;
        if (p >= keep_lo && p < keep_hi) continue;
        pkv_status st = unmap_group(s, slot, p);
        if (st != PKV_OK && first == PKV_OK) first = st;
    }
    s->slot_first[slot] = keep_lo;
    s->slot_pages[slot] = kept;
    pkv_status st = PKV_OK;
    uint64_t p = keep_lo;
    while (st == PKV_OK && p > lo && (st = map_group(s, slot, p - 1)) == PKV_OK) p--;
    uint64_t q = keep_hi;
    while (st == PKV_OK && q < hi && (st = map_group(s, slot, q)) == PKV_OK) q++;
    if (st != PKV_OK) { // roll this call's new pages back: the kept run stays
        for (uint64_t r = p; r < keep_lo; r++) (void)unmap_group(s, slot, r);
        for (uint64_t r = keep_hi; r < q; r++) (void)unmap_group(s, slot, r);
        if (kept == 0) s->slot_first[slot] = 0;
        return st;
    }
    s->slot_first[slot] = hi > lo ? lo : 0;
    s->slot_pages[slot] = hi - lo;
    return first;
}

void pkv_vmm_space_destroy(pkv_vmm_space *s) {
    if (!s) return;
    for (uint32_t slot = 0; slot < s->info.num_slots; slot++) (void)set_range(s, slot, 0, 0);
    if (s->budget) pkvi_vmm_budget_leave(s->budget, s);
    if (s->ops->destroy_page) {
        for (uint32_t id = 0; id < s->num_created; id++) {
            if (s->is_released[id]) continue; // its memory went back already
            double t0 = pkvi_now_seconds();
            s->ops->destroy_page(s, id);
            s->stats.destroy_seconds += pkvi_now_seconds() - t0;
            s->stats.destroy_calls++;
        }
    }
    if (s->base) s->ops->unreserve(s, s->base, s->info.reserved_bytes);
    space_free(s);
}

pkv_status pkv_vmm_get_info(const pkv_vmm_space *s, pkv_vmm_info *info) {
    if (!s || !info) return PKV_ERR_INVALID_ARG;
    *info = s->info;
    return PKV_OK;
}

const char *pkv_vmm_name(const pkv_vmm_space *s) { return s ? s->ops->name : "none"; }

pkv_status pkv_vmm_buffer_ptr(const pkv_vmm_space *s, uint32_t buffer, void **ptr) {
    if (!ptr) return PKV_ERR_INVALID_ARG;
    *ptr = NULL;
    if (!s || buffer >= s->info.num_buffers) return PKV_ERR_INVALID_ARG;
    *ptr = s->base + (uint64_t)buffer * s->info.num_slots * s->info.buffer_bytes;
    return PKV_OK;
}

pkv_status pkv_vmm_slot_acquire(pkv_vmm_space *s, uint32_t *slot) {
    if (!s || !slot) return PKV_ERR_INVALID_ARG;
    for (uint32_t i = 0; i < s->info.num_slots; i++) {
        if (!s->slot_taken[i]) {
            s->slot_taken[i] = 1;
            *slot = i;
            return PKV_OK;
        }
    }
    return PKV_ERR_OUT_OF_BLOCKS;
}

static uint64_t pages_for(const pkv_vmm_space *s, uint64_t bytes) {
    return (bytes + s->info.page_bytes - 1) / s->info.page_bytes;
}

pkv_status pkv_vmm_slot_map_range(pkv_vmm_space *s, uint32_t slot, uint64_t first_byte,
                                  uint64_t end_byte) {
    if (!s || slot >= s->info.num_slots || !s->slot_taken[slot]) return PKV_ERR_INVALID_ARG;
    if (end_byte > s->info.buffer_bytes) return PKV_ERR_INVALID_ARG; // outgrew the reservation
    if (end_byte <= first_byte) return set_range(s, slot, 0, 0);
    return set_range(s, slot, first_byte / s->info.page_bytes, pages_for(s, end_byte));
}

pkv_status pkv_vmm_slot_resize(pkv_vmm_space *s, uint32_t slot, uint64_t bytes) {
    return pkv_vmm_slot_map_range(s, slot, 0, bytes);
}

uint64_t pkv_vmm_slot_pages(const pkv_vmm_space *s, uint32_t slot) {
    if (!s || slot >= s->info.num_slots) return 0;
    return s->slot_pages[slot];
}

uint64_t pkv_vmm_slot_first_page(const pkv_vmm_space *s, uint32_t slot) {
    if (!s || slot >= s->info.num_slots) return 0;
    return s->slot_first[slot];
}

pkv_status pkv_vmm_slot_release(pkv_vmm_space *s, uint32_t slot) {
    if (!s || slot >= s->info.num_slots || !s->slot_taken[slot]) return PKV_ERR_INVALID_ARG;
    pkv_status st = set_range(s, slot, 0, 0);
    s->slot_taken[slot] = 0;
    return st == PKV_OK ? PKV_OK : PKV_ERR_BACKEND;
}

int64_t pkv_vmm_page_physical(const pkv_vmm_space *s, uint32_t slot, uint32_t buffer,
                              uint64_t page) {
    if (!s || slot >= s->info.num_slots || buffer >= s->info.num_buffers ||
        page >= s->info.pages_per_row)
        return -1;
    return row(s, slot, buffer)[page];
}

pkv_status pkv_vmm_validate(const pkv_vmm_space *s) {
    if (!s) return PKV_ERR_INVALID_ARG;
    if (s->num_created > s->info.max_pages || s->num_released > s->num_created ||
        s->num_free > pkvi_vmm_live_pages(s))
        return PKV_ERR_CORRUPT;
    uint8_t *seen = calloc(s->num_created ? s->num_created : 1, 1);
    if (!seen) return PKV_ERR_OUT_OF_MEMORY;
    pkv_status st = PKV_OK;
    uint64_t mapped = 0;
    for (uint32_t i = 0; i < s->num_free && st == PKV_OK; i++) {
        uint32_t id = s->free_pages[i];
        if (id >= s->num_created || s->is_released[id] || seen[id]++) st = PKV_ERR_CORRUPT;
    }
    for (uint32_t i = 0; i < s->num_released && st == PKV_OK; i++) {
        uint32_t id = s->released[i];
        if (id >= s->num_created || !s->is_released[id] || seen[id]++) st = PKV_ERR_CORRUPT;
    }
    for (uint32_t slot = 0; slot < s->info.num_slots && st == PKV_OK; slot++) {
        uint64_t lo = s->slot_first[slot], hi = lo + s->slot_pages[slot];
        if (!s->slot_taken[slot] && hi > lo) st = PKV_ERR_CORRUPT;
        if (hi > s->info.pages_per_row) st = PKV_ERR_CORRUPT;
        for (uint32_t b = 0; b < s->info.num_buffers && st == PKV_OK; b++) {
            const int32_t *r = row(s, slot, b);
            for (uint64_t p = 0; p < s->info.pages_per_row; p++) {
                int32_t id = r[p];
                int inside = p >= lo && p < hi; // mapped exactly in the slot's run
                if (inside != (id >= 0) ||
                    (id >= 0 && ((uint32_t)id >= s->num_created || s->is_released[id] ||
                                 seen[id]++))) {
                    st = PKV_ERR_CORRUPT;
                    break;
                }
                mapped += id >= 0;
            }
        }
    }
    // Every page that exists was seen exactly once (no leak), and the gauges agree.
    uint64_t live = pkvi_vmm_live_pages(s);
    if (st == PKV_OK && (mapped + s->num_free + s->stats.pages_lost != live ||
                         mapped != s->stats.pages_mapped || live != s->stats.pages_created))
        st = PKV_ERR_CORRUPT;
    free(seen);
    return st;
}

pkv_status pkv_vmm_get_stats(const pkv_vmm_space *s, pkv_vmm_stats *stats) {
    if (!s || !stats) return PKV_ERR_INVALID_ARG;
    *stats = s->stats;
    return PKV_OK;
}

void pkv_vmm_reset_stats(pkv_vmm_space *s) {
    if (!s) return;
    pkv_vmm_stats keep = s->stats;
    memset(&s->stats, 0, sizeof s->stats);
    s->stats.pages_mapped = keep.pages_mapped;
    s->stats.pages_mapped_peak = keep.pages_mapped;
    s->stats.pages_created = keep.pages_created;
    s->stats.pages_lost = keep.pages_lost;
}

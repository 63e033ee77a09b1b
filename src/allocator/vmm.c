// SPDX-License-Identifier: MIT
// The VMM space's bookkeeping, shared by the host and CUDA implementations: request
// slots, one page table per (slot, buffer) row, a stack of physical pages that exist
// but are unmapped (reused before a new one is created, as vAttention keeps its
// physical handles), the physical budget, and the counters and timers of every call.
// Invariant (pkv_vmm_validate): each created physical page is either on the free
// stack or in exactly one page-table entry; a slot maps the same number of pages in
// every buffer, all of them a prefix of the row.
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
    free(s->slot_pages);
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
    s->slot_pages = calloc(s->info.num_slots, sizeof *s->slot_pages);
    s->page_table = malloc((size_t)entries * sizeof *s->page_table);
    s->free_pages = malloc((size_t)s->info.max_pages * sizeof *s->free_pages);
    if (!s->slot_taken || !s->slot_pages || !s->page_table || !s->free_pages) {
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

// One physical page: the free stack first, else a new one within the budget.
static pkv_status take_page(pkv_vmm_space *s, uint32_t *id) {
    if (s->num_free > 0) {
        *id = s->free_pages[--s->num_free];
        return PKV_OK;
    }
    if (s->num_created >= s->info.max_pages) return PKV_ERR_OUT_OF_BLOCKS;
    uint32_t n = s->num_created;
    if (s->ops->create) {
        double t0 = pkvi_now_seconds();
        pkv_status st = s->ops->create(s, n);
        s->stats.create_seconds += pkvi_now_seconds() - t0;
        s->stats.create_calls++;
        if (st != PKV_OK) return st;
    }
    s->num_created++;
    s->stats.pages_created++;
    *id = n;
    return PKV_OK;
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

static pkv_status shrink(pkv_vmm_space *s, uint32_t slot, uint64_t to) {
    pkv_status first = PKV_OK;
    while (s->slot_pages[slot] > to) {
        uint64_t p = s->slot_pages[slot] - 1;
        for (uint32_t b = 0; b < s->info.num_buffers; b++) {
            pkv_status st = do_unmap(s, slot, b, p);
            if (st != PKV_OK && first == PKV_OK) first = st;
        }
        s->slot_pages[slot] = p;
    }
    return first;
}

static pkv_status grow(pkv_vmm_space *s, uint32_t slot, uint64_t to) {
    uint64_t from = s->slot_pages[slot];
    uint64_t need = (to - from) * s->info.num_buffers;
    uint64_t avail = s->num_free + (s->info.max_pages - s->num_created);
    if (need > avail) return PKV_ERR_OUT_OF_BLOCKS; // before any call: nothing changes
    for (uint64_t p = from; p < to; p++) {
        for (uint32_t b = 0; b < s->info.num_buffers; b++) {
            pkv_status st = do_map(s, slot, b, p);
            if (st == PKV_OK) continue;
            // Roll back this call's pages: the buffers of page p mapped so far, then
            // whole pages down to `from`.
            for (uint32_t c = 0; c < b; c++) (void)do_unmap(s, slot, c, p);
            s->slot_pages[slot] = p;
            (void)shrink(s, slot, from);
            return st;
        }
        s->slot_pages[slot] = p + 1;
    }
    return PKV_OK;
}

void pkv_vmm_space_destroy(pkv_vmm_space *s) {
    if (!s) return;
    for (uint32_t slot = 0; slot < s->info.num_slots; slot++) (void)shrink(s, slot, 0);
    if (s->ops->destroy_page) {
        for (uint32_t id = 0; id < s->num_created; id++) {
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

pkv_status pkv_vmm_slot_resize(pkv_vmm_space *s, uint32_t slot, uint64_t bytes) {
    if (!s || slot >= s->info.num_slots || !s->slot_taken[slot]) return PKV_ERR_INVALID_ARG;
    if (bytes > s->info.buffer_bytes) return PKV_ERR_INVALID_ARG; // outgrew the reservation
    uint64_t to = (bytes + s->info.page_bytes - 1) / s->info.page_bytes;
    if (to > s->slot_pages[slot]) return grow(s, slot, to);
    return shrink(s, slot, to);
}

uint64_t pkv_vmm_slot_pages(const pkv_vmm_space *s, uint32_t slot) {
    if (!s || slot >= s->info.num_slots) return 0;
    return s->slot_pages[slot];
}

pkv_status pkv_vmm_slot_release(pkv_vmm_space *s, uint32_t slot) {
    if (!s || slot >= s->info.num_slots || !s->slot_taken[slot]) return PKV_ERR_INVALID_ARG;
    pkv_status st = shrink(s, slot, 0);
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
    if (s->num_created > s->info.max_pages || s->num_free > s->num_created)
        return PKV_ERR_CORRUPT;
    uint8_t *seen = calloc(s->num_created ? s->num_created : 1, 1);
    if (!seen) return PKV_ERR_OUT_OF_MEMORY;
    pkv_status st = PKV_OK;
    uint64_t mapped = 0;
    for (uint32_t i = 0; i < s->num_free && st == PKV_OK; i++) {
        uint32_t id = s->free_pages[i];
        if (id >= s->num_created || seen[id]++) st = PKV_ERR_CORRUPT;
    }
    for (uint32_t slot = 0; slot < s->info.num_slots && st == PKV_OK; slot++) {
        uint64_t n = s->slot_pages[slot];
        if (!s->slot_taken[slot] && n) st = PKV_ERR_CORRUPT;
        for (uint32_t b = 0; b < s->info.num_buffers && st == PKV_OK; b++) {
            const int32_t *r = row(s, slot, b);
            for (uint64_t p = 0; p < s->info.pages_per_row; p++) {
                int32_t id = r[p];
                if ((p < n) != (id >= 0) || (id >= 0 && ((uint32_t)id >= s->num_created ||
                                                         seen[id]++))) {
                    st = PKV_ERR_CORRUPT;
                    break;
                }
                mapped += id >= 0;
            }
        }
    }
    // Every created page was seen exactly once (no leak), and the gauge agrees.
    if (st == PKV_OK && (mapped + s->num_free + s->stats.pages_lost != s->num_created ||
                         mapped != s->stats.pages_mapped ||
                         s->num_created != s->stats.pages_created))
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

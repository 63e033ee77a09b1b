// SPDX-License-Identifier: MIT
// Internal: the function table behind pkv_vmm_space. vmm.c owns the bookkeeping
// (slots, the per-row page tables, the physical free list, the budget) and counts
// and times every call; an implementation (vmm_host.c, vmm_cuda.c) only reserves,
// creates, maps and unmaps.
#ifndef PKV_VMM_IMPL_H
#define PKV_VMM_IMPL_H

#include "clock.h"
#include "pkv/vmm.h"

typedef struct pkvi_vmm_ops {
    const char *name;
    // Called once after the geometry is fixed, before the reservation (optional).
    pkv_status (*prepare)(pkv_vmm_space *s);
    // Reserve `bytes` of inaccessible virtual memory aligned to `align`.
    pkv_status (*reserve)(pkv_vmm_space *s, uint64_t bytes, uint64_t align, void **base);
    void (*unreserve)(pkv_vmm_space *s, void *base, uint64_t bytes);
    // Make physical page `id` exist (optional: NULL when there is nothing to create).
    pkv_status (*create)(pkv_vmm_space *s, uint32_t id);
    void (*destroy_page)(pkv_vmm_space *s, uint32_t id); // optional, pairs with create
    // Give an unmapped page's memory back to the system before the space ends, for a
    // shared budget's reclaim (optional: NULL when an unmapped page holds none).
    pkv_status (*release_page)(pkv_vmm_space *s, uint32_t id);
    // Map physical page `id` at `addr` (page aligned, page_bytes long) / unmap it.
    pkv_status (*map)(pkv_vmm_space *s, void *addr, uint32_t id);
    pkv_status (*unmap)(pkv_vmm_space *s, void *addr, uint32_t id);
    void (*destroy)(pkv_vmm_space *s); // releases impl state (optional)
} pkvi_vmm_ops;

// The space: geometry, bookkeeping and counters. impl is the implementation's.
struct pkv_vmm_space {
    const pkvi_vmm_ops *ops;
    void *impl;
    pkv_vmm_info info;
    char *base;               // the reservation, info.reserved_bytes long
    uint8_t *slot_taken;      // [num_slots]
    uint64_t *slot_first;     // [num_slots] first mapped page of every row of the slot
    uint64_t *slot_pages;     // [num_slots] pages mapped per buffer, from slot_first on
    int32_t *page_table;      // [num_slots][num_buffers][pages_per_row], physical id or -1
    uint32_t *free_pages;     // stack of created, unmapped physical ids
    uint32_t num_free;
    uint32_t num_created;     // ids 0..num_created-1 were made; all exist but the released
    uint32_t *released;       // stack of ids whose page a budget reclaim released (re-made first)
    uint32_t num_released;
    uint8_t *is_released;     // [max_pages]: 1 while the id is on that stack
    pkv_vmm_budget *budget;   // shared physical budget, or NULL
    pkv_vmm_stats stats;
};

// Physical pages of `s` that exist now (mapped, cached free or lost).
static inline uint64_t pkvi_vmm_live_pages(const pkv_vmm_space *s) {
    return (uint64_t)s->num_created - s->num_released;
}

// The shared budget (vmm_budget.c). Bytes another member could give back now
// (its cached free pages) plus the budget's own headroom; `self` is left out.
uint64_t pkvi_vmm_budget_room(const pkv_vmm_budget *b, const pkv_vmm_space *self);
// Make `bytes` fit under the budget by releasing other members' cached free pages;
// 0 when they cannot. Then pkvi_vmm_budget_charge when the page exists.
int pkvi_vmm_budget_make_room(pkv_vmm_budget *b, const pkv_vmm_space *self, uint64_t bytes);
void pkvi_vmm_budget_charge(pkv_vmm_budget *b, int64_t bytes);
void pkvi_vmm_budget_leave(pkv_vmm_budget *b, pkv_vmm_space *s);
// Release one of `s`'s cached free pages (its memory back to the system): 0 if none.
int pkvi_vmm_release_one(pkv_vmm_space *s);

// Build a space over `ops` (impl owned by the space from here on, released through
// ops->destroy even on failure). Validates params against `granularity`.
pkv_status pkvi_vmm_space_new(const pkvi_vmm_ops *ops, void *impl, uint64_t granularity,
                              const pkv_vmm_params *params, pkv_vmm_space **out);

#endif // PKV_VMM_IMPL_H

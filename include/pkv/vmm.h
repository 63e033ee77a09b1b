// SPDX-License-Identifier: MIT
// Virtual-memory contiguous KV (the vAttention design, ASPLOS 2025), beside paging.
// A VMM space reserves one large virtual range, split into num_buffers buffers
// (vAttention: one for K and one for V of every layer, so 2 x num_layers), each
// holding num_slots request slots of buffer_bytes:
//
//   buffer j, slot s starts at base + (j * num_slots + s) * buffer_bytes
//
// so buffer j is a [num_slots][buffer_bytes] tensor whose row s is one request's
// whole (virtual, max-length) cache of that layer's K or V. Physical memory is
// committed in pages of page_bytes behind each (slot, buffer) row from its start, as
// the sequence grows, and released when it shrinks or finishes; a windowed layer's
// row may also unmap its front (pkv_vmm_slot_map_range). A slot always has the same
// contiguous run of pages mapped in every buffer: tokens span every layer. Several
// spaces (one per KV cache group of a heterogeneous model) can share one physical
// budget (pkv_vmm_budget, at the end of this header).
//
// Because each row is contiguous in virtual memory, a kernel written for a
// contiguous cache reads it unchanged: with the token-major layout
// [slot][token][kv_head][head_dim] in each buffer, pass to pkv_attn_decode_contig_*
//   k_cache = buffer(2l), v_cache = buffer(2l + 1),
//   seq_stride = buffer_bytes / elem, token_stride = kv_heads * head_dim, head_stride = head_dim
// (token-major so that growth is a prefix of the row; vAttention uses the same).
//
// Implementations: host memory (always present) and CUDA device memory through the
// driver VMM API (cuMemAddressReserve / cuMemCreate / cuMemMap / cuMemSetAccess /
// cuMemUnmap / cuMemRelease), present when the library was built with CUDA.
// Every reserve, physical create, map, unmap and physical destroy call is counted
// and timed in pkv_vmm_stats, like pkv_backend_stats for the allocation calls.
//
// Thread-safety: one thread at a time per space (counters are not atomic).
#ifndef PKV_VMM_H
#define PKV_VMM_H

#include <stddef.h>
#include <stdint.h>

#include "pkv/status.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct pkv_vmm_space pkv_vmm_space;

// How the host implementation commits physical memory behind the reservation
// (the reservation itself is always mmap(PROT_NONE, MAP_NORESERVE)).
typedef enum pkv_vmm_host_mode {
    // A memfd of max_pages pages is the physical memory; a page is mapped in place
    // with mmap(MAP_SHARED | MAP_FIXED) and unmapped by mapping an inaccessible
    // anonymous range back over it. A physical page keeps its identity and content
    // after unmapping, like a CUDA physical allocation handle. Default.
    PKV_VMM_HOST_MEMFD = 0,
    // Pages are committed in place: mprotect(READ | WRITE) then
    // madvise(MADV_POPULATE_WRITE) where the kernel has it; released with
    // madvise(MADV_DONTNEED) then mprotect(NONE). Physical page ids are then
    // bookkeeping only (the kernel picks the frames).
    PKV_VMM_HOST_MPROTECT = 1,
} pkv_vmm_host_mode;

typedef struct pkv_vmm_params {
    uint32_t num_slots;          // request slots (>= 1)
    uint32_t num_buffers;        // buffers per slot (>= 1); 2 x num_layers for K and V
    uint64_t buffer_bytes;       // virtual bytes of one (slot, buffer) row (>= 1), rounded
                                 // up to page_bytes: max_seq_len x bytes per token per buffer
    uint64_t page_bytes;         // physical page; 0 = the implementation's granularity
                                 // (host: system page; CUDA: cuMemGetAllocationGranularity
                                 // minimum, 2 MiB). Must be a multiple of the granularity.
    uint64_t max_pages;          // physical budget in pages over the whole space; 0 = every
                                 // row fully backed (num_slots x num_buffers x pages per row)
    pkv_vmm_host_mode host_mode; // host implementation only
} pkv_vmm_params;

// Defaults: 1 slot, 1 buffer, buffer_bytes 2 MiB, page_bytes 0, max_pages 0, MEMFD.
pkv_vmm_params pkv_vmm_params_default(void);

// Counters since creation (or the last pkv_vmm_reset_stats). A call that failed
// still counts and its time is still charged.
typedef struct pkv_vmm_stats {
    uint64_t reserve_calls;      // virtual reservations (mmap PROT_NONE / cuMemAddressReserve)
    double reserve_seconds;
    uint64_t create_calls;       // physical page creations (memfd pages are created with
                                 // the memfd: fallocate; CUDA: cuMemCreate); none in MPROTECT
    double create_seconds;
    uint64_t map_calls;          // one per page mapped (CUDA: cuMemMap + cuMemSetAccess)
    double map_seconds;
    uint64_t unmap_calls;        // one per page unmapped (CUDA: cuMemUnmap)
    double unmap_seconds;
    uint64_t destroy_calls;      // physical releases (cuMemRelease) and the unreserve
    double destroy_seconds;
    uint64_t pages_mapped;       // pages mapped now, over every slot and buffer
    uint64_t pages_mapped_peak;  // largest pages_mapped seen
    uint64_t pages_created;      // physical pages that exist now (mapped or cached free)
    uint64_t pages_lost;         // pages whose unmap failed: never reused (0 unless the
                                 // system or driver refused an unmap)
} pkv_vmm_stats;

// What a space is, after rounding. Plain data.
typedef struct pkv_vmm_info {
    uint64_t granularity;        // smallest page the implementation allows
    uint64_t page_bytes;         // physical page in use
    uint64_t buffer_bytes;       // row size, a multiple of page_bytes
    uint64_t pages_per_row;      // buffer_bytes / page_bytes
    uint64_t max_pages;          // physical budget in pages
    uint64_t reserved_bytes;     // num_slots x num_buffers x buffer_bytes of virtual memory
    uint32_t num_slots;
    uint32_t num_buffers;
} pkv_vmm_info;

// A host space. PKV_ERR_INVALID_ARG for bad params (zero counts, a page that is not
// a multiple of the granularity, a size that overflows), PKV_ERR_OUT_OF_MEMORY when
// the reservation or the memfd cannot be made, PKV_ERR_UNSUPPORTED when the host has
// no memfd (MEMFD mode). *out is owned by the caller.
pkv_status pkv_vmm_space_create_host(const pkv_vmm_params *params, pkv_vmm_space **out);

// A CUDA space on device `device`. PKV_ERR_UNSUPPORTED in a build without CUDA or
// when the device has no virtual memory management; PKV_ERR_NO_DEVICE when no such
// device (or no driver) is usable. The driver API is reached through the CUDA
// runtime's driver entry points, so the library does not link libcuda itself.
pkv_status pkv_vmm_space_create_cuda(int device, const pkv_vmm_params *params,
                                     pkv_vmm_space **out);

// Unmap every page, release every physical page and the reservation. NULL does nothing.
void pkv_vmm_space_destroy(pkv_vmm_space *space);

pkv_status pkv_vmm_get_info(const pkv_vmm_space *space, pkv_vmm_info *info);
const char *pkv_vmm_name(const pkv_vmm_space *space); // "host-memfd", "host-mprotect", "cuda"

// Base of buffer `buffer`: a [num_slots][buffer_bytes] range (borrowed; a device
// address for CUDA). Only the mapped prefix of each row may be touched.
pkv_status pkv_vmm_buffer_ptr(const pkv_vmm_space *space, uint32_t buffer, void **ptr);

// Take a free slot (lowest index first). PKV_ERR_OUT_OF_BLOCKS when every slot is
// taken; nothing changes. A fresh slot has no page mapped.
pkv_status pkv_vmm_slot_acquire(pkv_vmm_space *space, uint32_t *slot);

// Back the first `bytes` of every row of `slot` with physical memory and nothing
// beyond (pages a pkv_vmm_slot_map_range left unmapped at the front are mapped
// again): maps ceil(bytes / page_bytes) - mapped pages per buffer when growing
// (content of the pages already mapped is kept), unmaps the excess when shrinking
// (those pages go back to the physical free list). All or nothing:
// PKV_ERR_OUT_OF_BLOCKS when the physical budget cannot cover the growth;
// PKV_ERR_INVALID_ARG when bytes exceed the row's virtual reservation
// (buffer_bytes: the request outgrew its max length) or the slot is not taken;
// PKV_ERR_BACKEND (or PKV_ERR_OUT_OF_MEMORY when the system has no memory to
// commit) when a map call fails: pages mapped by the failed call are unmapped again,
// so the slot keeps its previous size. When shrinking, a failed unmap still shrinks
// the slot; that page is counted in pages_lost and never handed out again.
pkv_status pkv_vmm_slot_resize(pkv_vmm_space *space, uint32_t slot, uint64_t bytes);

// Pages mapped per buffer for `slot` (0 for a free slot or a bad index), from
// pkv_vmm_slot_first_page on.
uint64_t pkv_vmm_slot_pages(const pkv_vmm_space *space, uint32_t slot);

// Back exactly the pages of every row of `slot` that hold bytes [first_byte,
// end_byte) (pages first_byte / page_bytes .. ceil(end_byte / page_bytes) - 1) and
// unmap every other page of the rows: a sliding-window or chunked-local layer's
// row unmaps the pages that left its window from the front while it grows at the
// back (the hybrid-vmm layout of docs/DESIGN.md). Pages in both the old and the new
// range keep their mapping and content; an empty range (end_byte <= first_byte)
// unmaps everything and keeps the slot. pkv_vmm_slot_resize(s, slot, bytes) is
// pkv_vmm_slot_map_range(s, slot, 0, bytes). The pages the call unmaps are counted
// as free before the budget check, so a window that slides by a page reuses the
// page it gives up. PKV_ERR_INVALID_ARG when end_byte exceeds buffer_bytes or the
// slot is not taken; PKV_ERR_OUT_OF_BLOCKS when the physical budget (the space's
// max_pages and, when the space is in a pkv_vmm_budget, the shared one) cannot
// cover the new pages: nothing changes. A failed map call (PKV_ERR_BACKEND /
// PKV_ERR_OUT_OF_MEMORY) unmaps this call's new pages again; the pages that left
// the range are unmapped already, so the slot keeps the overlap of its old and new
// ranges (see pkv_vmm_slot_first_page).
pkv_status pkv_vmm_slot_map_range(pkv_vmm_space *space, uint32_t slot, uint64_t first_byte,
                                  uint64_t end_byte);

// First mapped page of `slot`'s rows (0 for a free slot, a bad index or no page
// mapped). The mapped pages are first .. first + pkv_vmm_slot_pages - 1.
uint64_t pkv_vmm_slot_first_page(const pkv_vmm_space *space, uint32_t slot);

// Unmap every page of `slot` and free the slot. PKV_ERR_INVALID_ARG for a slot that
// is not taken; PKV_ERR_BACKEND when an unmap failed (the slot is freed anyway and the
// page counted in pages_lost).
pkv_status pkv_vmm_slot_release(pkv_vmm_space *space, uint32_t slot);

// Physical page behind page `page` of row (slot, buffer), or -1 when unmapped or
// out of range. For tests and tools: two rows never share a physical page.
int64_t pkv_vmm_page_physical(const pkv_vmm_space *space, uint32_t slot, uint32_t buffer,
                              uint64_t page);

// Full invariant check: every physical page is either free or mapped exactly once,
// the free list has no duplicates, pages_mapped equals the sum over slots, free
// slots map nothing. PKV_ERR_CORRUPT on any violation.
pkv_status pkv_vmm_validate(const pkv_vmm_space *space);

pkv_status pkv_vmm_get_stats(const pkv_vmm_space *space, pkv_vmm_stats *stats);
void pkv_vmm_reset_stats(pkv_vmm_space *space); // keeps the pages_* gauges (peak = now)

// ---- A physical budget shared by several spaces (the hybrid-vmm layout) ----
//
// A heterogeneous model (docs/DESIGN.md, "KV cache groups") needs one space per KV
// cache group: rows of different bytes per token, and sliding groups that unmap
// their front. A budget makes those spaces draw on one amount of physical memory,
// as the groups of one GPU do: the bytes of the physical pages that exist in its
// member spaces (mapped, cached free or lost) never exceed budget bytes. A space
// that needs a page beyond the budget first takes its own cached free pages, then
// releases other members' cached free pages (memfd: the page's memory is punched
// out of the memfd; CUDA: cuMemRelease; each counted in that space's destroy_calls
// and timed), so a page one group gave up can back another group's growth. Each
// space's own max_pages still applies. MPROTECT spaces give their memory back at
// unmap already, so reclaiming their cached pages costs no call.
//
// Ownership: the caller owns the budget and its spaces; destroying a space leaves
// its budget (its pages stop counting). Thread-safety: one thread at a time over
// the budget and every member space.
typedef struct pkv_vmm_budget pkv_vmm_budget;

typedef struct pkv_vmm_budget_stats {
    uint64_t bytes;              // the budget
    uint64_t bytes_used;         // physical bytes that exist now over the members
    uint64_t bytes_used_peak;    // largest bytes_used seen
    uint64_t pages_reclaimed;    // cached free pages released to make room for another member
    uint32_t num_spaces;         // members now
} pkv_vmm_budget_stats;

// PKV_ERR_INVALID_ARG for 0 bytes or a NULL out; PKV_ERR_OUT_OF_MEMORY.
pkv_status pkv_vmm_budget_create(uint64_t bytes, pkv_vmm_budget **out);
// Spaces still in the budget leave it (their own max_pages then bounds them alone).
// NULL does nothing.
void pkv_vmm_budget_destroy(pkv_vmm_budget *budget);
// Put `space` under `budget`. PKV_ERR_INVALID_ARG when either is NULL, the space is
// in a budget already or has created a physical page (join before the first map).
pkv_status pkv_vmm_budget_attach(pkv_vmm_budget *budget, pkv_vmm_space *space);
pkv_status pkv_vmm_budget_get_stats(const pkv_vmm_budget *budget, pkv_vmm_budget_stats *stats);

#ifdef __cplusplus
}
#endif

#endif // PKV_VMM_H

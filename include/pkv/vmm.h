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
// the sequence grows, and released when it shrinks or finishes. A slot always has
// the same number of pages mapped in every buffer: tokens span every layer.
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
// beyond: maps ceil(bytes / page_bytes) - mapped pages per buffer when growing
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

// Pages mapped per buffer for `slot` (0 for a free slot or a bad index).
uint64_t pkv_vmm_slot_pages(const pkv_vmm_space *space, uint32_t slot);

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

#ifdef __cplusplus
}
#endif

#endif // PKV_VMM_H

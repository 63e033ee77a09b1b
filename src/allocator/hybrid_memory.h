// SPDX-License-Identifier: MIT
// Internal: where the memory of each KV cache group of a hybrid KV manager
// (pkv/hybrid.h) lies, as its layout addresses it, for a store that keeps the
// K/V in memory laid out like the manager's pools (the model's hybrid store,
// src/runtime/model/hybrid_store.c). The manager owns no K/V memory itself: it
// hands out block ids; this file says which bytes each id stands for, so that a
// block the window rule released and another sequence took again is the same
// memory in both.
//
// Regions: PAGED and SHARED_PAGE have one (their one pool), PARTITION one per
// token group, LCM one (the large pages: large page L at L x large bytes).
// Block b of token group g lies at byte
//   base + (b / per_chunk) x chunk_bytes + (b % per_chunk) x page_stride
// of region `region`, page_bytes long: PAGED puts every token group's part of a
// block side by side in one page (base = the bytes of the groups before it);
// LCM numbers small pages k_g per large page (per_chunk = k_g, chunk_bytes = the
// large page); the others have per_chunk 1.
#ifndef PKV_HYBRID_MEMORY_H
#define PKV_HYBRID_MEMORY_H

#include "pkv/hybrid.h"

typedef struct pkvi_hybrid_addr {
    uint32_t region;      // index of the region holding the group's blocks
    uint32_t owner;       // the token group whose table (and copy queue) g uses:
                          // g itself, or in PAGED the first token group
    uint64_t base;        // bytes from the region start to block 0's part of g
    uint64_t page_bytes;  // bytes of g's part of a block (B_g x bytes per token)
    uint64_t page_stride; // bytes between blocks b and b + 1 of one chunk
    uint32_t per_chunk;   // blocks per chunk (LCM: small pages per large page; else 1)
    uint64_t chunk_bytes; // bytes between chunks
    uint32_t num_blocks;  // block ids 0..num_blocks-1
} pkvi_hybrid_addr;

typedef struct pkvi_hybrid_memory {
    size_t elem_bytes;                            // as given at create
    uint32_t state_slots;                         // slots of each state group (max_seqs)
    uint32_t num_regions;
    uint64_t region_bytes[PKV_MAX_KV_GROUPS];     // [num_regions]
    pkvi_hybrid_addr group[PKV_MAX_KV_GROUPS];    // token groups only (state: zeroed)
} pkvi_hybrid_memory;

// Fill *mem for h. PKV_ERR_INVALID_ARG for NULL.
pkv_status pkvi_hybrid_memory_get(const pkv_hybrid *h, pkvi_hybrid_memory *mem);

// Byte offset of block b of group g in its region (the formula above).
static inline uint64_t pkvi_hybrid_block_offset(const pkvi_hybrid_addr *a, uint32_t b) {
    return a->base + (uint64_t)(b / a->per_chunk) * a->chunk_bytes +
           (uint64_t)(b % a->per_chunk) * a->page_stride;
}

#endif // PKV_HYBRID_MEMORY_H

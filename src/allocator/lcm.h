// SPDX-License-Identifier: MIT
// Internal: the two-level (Jenga-style, arXiv 2503.18292) allocator for KV cache
// groups whose pages differ in size. The memory budget is cut into large pages of
// LCM(page bytes of every group) bytes; a large page is owned by at most one
// group and then carved into that group's small pages (k_g = large / page_g of
// them, so no byte of a large page is lost). Group g's small pages live in one
// chunked pkv_pool (pool_internal.h) whose chunk L is large page L: ids
// L*k_g .. L*k_g + k_g - 1, fenced while g does not own L. Callers allocate and
// release small pages with the ordinary pool calls after pkvi_lcm_reserve has
// made room.
//
// Returning empty large pages is lazy: a large page whose last small page is
// freed stays with its group (an O(1) counter update in the pool) and moves to
// another group only when that group's reserve finds no unowned large page.
// Eager return would cost O(k_g) stack removals on the release path and thrash
// when a group frees and then reallocates around a large-page boundary, as
// decode does; lazy return costs nothing until memory is actually short. Stats
// separate reclaimable memory (empty large pages) from stranded memory (free
// small pages inside partly used large pages, usable by their group only).
//
// Thread-safety: as pkv_pool: one thread at a time per allocator and its pools.
#ifndef PKV_LCM_H
#define PKV_LCM_H

#include <stddef.h>
#include <stdint.h>

#include "pkv/pool.h"

#define PKVI_LCM_MAX_GROUPS 8
// Largest large page accepted: beyond it the rounding of the budget to whole
// large pages and a group's partly used large page cost too much memory.
#define PKVI_LCM_MAX_LARGE_BYTES ((uint64_t)1 << 30)
#define PKVI_LCM_NO_GROUP 0xFFu // owner of a large page no group holds

typedef struct pkvi_lcm pkvi_lcm;

typedef struct pkvi_lcm_group_stats {
    uint64_t page_bytes;      // small page bytes
    uint32_t pages_per_large; // k_g
    uint32_t large_owned;     // large pages the group owns
    uint32_t large_empty;     // ... of which no small page is live (reclaimable)
    uint32_t free_pages;      // free small pages (in every owned large page)
    uint32_t used_pages;      // live small pages
    uint32_t stranded_pages;  // free small pages in partly used large pages
} pkvi_lcm_group_stats;

typedef struct pkvi_lcm_stats {
    uint64_t budget_bytes;
    uint64_t large_bytes;     // LCM of the groups' page bytes
    uint64_t rounding_bytes;  // budget - num_large * large_bytes: lost to the LCM rounding
    uint64_t stranded_bytes;  // sum of stranded_pages * page_bytes: only one group can use them
    uint64_t used_bytes;      // sum of used_pages * page_bytes
    uint64_t reclaims;        // empty large pages moved from one group to another
    uint64_t reserve_failures;
    uint32_t num_large;
    uint32_t free_large;      // owned by no group
    uint32_t num_groups;
    pkvi_lcm_group_stats group[PKVI_LCM_MAX_GROUPS];
} pkvi_lcm_stats;

// Create the allocator: page_bytes[num_groups] (borrowed; each > 0, 1 <= num_groups
// <= PKVI_LCM_MAX_GROUPS), budget_bytes of memory. Large pages: floor(budget / LCM).
// PKV_ERR_LIMIT when the LCM passes PKVI_LCM_MAX_LARGE_BYTES or a group's pool
// would pass PKV_POOL_MAX_BLOCKS ids; PKV_ERR_INVALID_ARG for a bad argument or a
// budget below one large page. err (caller-owned, err_cap bytes, may be NULL) gets
// a sentence naming the problem and the groups' page sizes.
pkv_status pkvi_lcm_create(const uint64_t *page_bytes, uint32_t num_groups, uint64_t budget_bytes,
                           pkvi_lcm **out, char *err, size_t err_cap);
void pkvi_lcm_destroy(pkvi_lcm *lcm);

// Group g's pool (borrowed, lives as long as lcm); NULL for g out of range.
pkv_pool *pkvi_lcm_pool(const pkvi_lcm *lcm, uint32_t g);
uint64_t pkvi_lcm_large_bytes(const pkvi_lcm *lcm);

// Make every group's pool hold at least need[g] free small pages (need: borrowed,
// num_groups entries), taking unowned large pages and, when there are none,
// empty large pages of groups whose own need leaves them spare. All or nothing:
// PKV_ERR_OUT_OF_BLOCKS and nothing moved when the needs cannot all be met.
pkv_status pkvi_lcm_reserve(pkvi_lcm *lcm, const uint32_t *need);

// Would pkvi_lcm_reserve(need) succeed once group g's pool had freed[g] more free
// small pages, emptied[g] more of its large pages then empty (a release the caller
// has not done yet)? Changes nothing. 1: yes.
int pkvi_lcm_fits_after(const pkvi_lcm *lcm, const uint32_t *need, const uint32_t *freed,
                        const uint32_t *emptied);

// pkvi_lcm_reserve with need[g] = n and 0 for every other group; O(1) when the
// pool has n free pages.
pkv_status pkvi_lcm_reserve_group(pkvi_lcm *lcm, uint32_t g, uint32_t n);

// Return every empty large page to the unowned set (what eager return would have
// done); the count returned goes to *returned (may be NULL).
pkv_status pkvi_lcm_trim(pkvi_lcm *lcm, uint32_t *returned);

// Owner of large page L: a group index, PKVI_LCM_NO_GROUP, or -1 out of range.
int pkvi_lcm_owner(const pkvi_lcm *lcm, uint32_t large);

pkv_status pkvi_lcm_get_stats(const pkvi_lcm *lcm, pkvi_lcm_stats *stats);

// Full check, O(num_large + pool ids): every pool valid; each large page owned by
// exactly the group whose pool has it unfenced, or by none and then on the unowned
// stack once; the counts add up. PKV_OK or PKV_ERR_CORRUPT.
pkv_status pkvi_lcm_validate(const pkvi_lcm *lcm);

#endif // PKV_LCM_H

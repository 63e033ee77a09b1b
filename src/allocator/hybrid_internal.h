// SPDX-License-Identifier: MIT
// Internal: the hybrid KV manager's state (include/pkv/hybrid.h), shared by the
// hybrid*.c files, and the hook through which a layout owns its pools.
// A token group keeps its tables in a pkv_seqset over a pkv_pool; which pool, and
// whether groups share one, is the layout's business (hybrid_layouts.c, and the
// LCM layout's own files). Everything else (the window rule, planning an append
// over every group, exports, stats) sees only groups, sets and pools.
#ifndef PKV_HYBRID_INTERNAL_H
#define PKV_HYBRID_INTERNAL_H

#include "pkv/hybrid.h"

// Token pools (PARTITION: one per token group) and one slot pool per state group.
#define PKVI_HYBRID_MAX_POOLS (2 * PKV_MAX_KV_GROUPS)

// One KV cache group of the manager.
typedef struct pkvi_hgroup {
    pkv_kv_group desc;         // as given at create
    uint64_t bytes_per_token;  // pkv_kv_group_bytes_per_token (0: state group)
    uint32_t block_size;       // tokens per block (0: state group)
    uint64_t page_bytes;       // bytes one block (state: one slot) occupies
    pkv_pool *pool;            // borrowed from h->pools: the pool this group draws from
    pkv_seqset *set;           // token groups: the tables (PAGED: every token group
                               // names the first token group's set); NULL for state
    int owns_set;              // 1: this group created `set` (and destroys it)
    int windowed;              // 1: the window rule releases blocks (SLIDING/CHUNKED,
                               // every layout but PAGED)
    uint64_t released;         // blocks released by the window rule since create
    // State groups: queued fork copies {src slot, dst slot}, each pinning both slots.
    pkv_block_copy *copies;    // [cap_copies]
    uint32_t num_copies, cap_copies;
} pkvi_hgroup;

// What the manager keeps per sequence, indexed by the low 20 bits of its id.
typedef struct pkvi_hrecord {
    int live;
    pkv_seq_id id;                       // the manager's id of this life of the slot
    uint32_t len;                        // tokens, the same in every group
    pkv_seq_id gid[PKV_MAX_KV_GROUPS];   // token group: the id in its set (PAGED: the
                                         // shared set's id); state group: its slot
} pkvi_hrecord;

// A layout: how the page budget becomes pools and sets. build is required; the
// other slots are optional (NULL: the pools are fixed, nothing to do).
typedef struct pkvi_hybrid_layout_ops {
    // Create h->pools and every token group's pool, set, block_size and page_bytes
    // from `page_budget` bytes (the budget left after the state slots). On error
    // the caller destroys whatever was created (pkvi_hybrid_teardown).
    pkv_status (*build)(pkv_hybrid *h, uint64_t page_budget);
    // An append needs need[g] more free blocks in token group g's pool (num_groups
    // entries, 0 for state groups and for groups aliasing another's set; groups on
    // one pool add up) and some pool has fewer: make room, all or nothing
    // (PKV_ERR_OUT_OF_BLOCKS leaves every pool as it was). Called before the append
    // changes anything; the manager checks the pools again afterwards. The LCM
    // layout grants large pages to the groups' pools here.
    pkv_status (*make_room)(pkv_hybrid *h, const uint32_t *need);
    // Blocks were returned to the pools of some groups (free, truncate, window
    // release, copies taken): the LCM layout hands empty large pages back here.
    void (*after_release)(pkv_hybrid *h);
    // Free layout_ctx (the pools and sets are torn down by the caller).
    void (*destroy)(pkv_hybrid *h);
} pkvi_hybrid_layout_ops;

struct pkv_hybrid {
    pkv_hybrid_layout layout;
    size_t elem_bytes;
    uint32_t block_size;                      // params.block_size
    uint32_t block_sizes[PKV_MAX_KV_GROUPS];  // params.block_sizes
    uint32_t max_seqs;
    uint32_t num_groups;
    pkvi_hgroup groups[PKV_MAX_KV_GROUPS];
    pkv_pool *pools[PKVI_HYBRID_MAX_POOLS];   // owned; [num_pools]
    uint32_t num_pools;
    const pkvi_hybrid_layout_ops *ops;
    void *layout_ctx;                         // the layout's own state (LCM)
    // Sequence ids: a set of empty sequences over a one-block pool hands them out
    // with seq.h's generation rules; recs[id & 0xFFFFF] is the sequence's record.
    pkv_pool *id_pool;
    pkv_seqset *ids;
    pkvi_hrecord *recs;                       // [cap_recs]
    uint32_t cap_recs;
    // Batch scratch: per-sequence lengths before the append, [cap_scratch].
    uint32_t *old_len;
    pkv_seq_id *gids;
    uint32_t cap_scratch;
};

// ---- hybrid_layouts.c ----
// The ops of a layout; NULL for an unknown one.
const pkvi_hybrid_layout_ops *pkvi_hybrid_layout_ops_for(pkv_hybrid_layout layout);
// Give token group g its own set of block_size tokens over `pool`.
pkv_status pkvi_hybrid_own_set(pkv_hybrid *h, uint32_t g, pkv_pool *pool, uint32_t block_size);
// Group g's block size: block_sizes[g], or block_size when that is 0.
uint32_t pkvi_hybrid_block_size(const pkv_hybrid *h, uint32_t g);

// ---- hybrid_lcm.c ----
// The LCM layout (the two-level allocator, lcm.h).
extern const pkvi_hybrid_layout_ops pkvi_hybrid_lcm_ops;
// LCM layout: its two-level allocator (allocator group i is the i-th token group);
// NULL for other layouts. Borrowed.
struct pkvi_lcm *pkvi_hybrid_lcm_allocator(const pkv_hybrid *h);
// LCM layout: pkvi_lcm_validate of its allocator (PKV_OK for other layouts).
pkv_status pkvi_hybrid_lcm_validate(const pkv_hybrid *h);
// LCM layout: group g's free_bytes also counts the large pages it could take
// (unowned ones and other groups' empty ones). Nothing for other layouts.
void pkvi_hybrid_lcm_group_stats(const pkv_hybrid *h, uint32_t g, pkv_hybrid_group_stats *stats);
// Create a pool of `blocks` blocks owned by h (PKV_ERR_INVALID_ARG: 0 blocks or
// more than PKV_POOL_MAX_BLOCKS). *pool receives it.
pkv_status pkvi_hybrid_add_pool(pkv_hybrid *h, uint64_t blocks, pkv_pool **pool);

// ---- hybrid.c ----
// Destroy every set, pool and state queue of h (not h itself).
void pkvi_hybrid_teardown(pkv_hybrid *h);
// The record of a live id, NULL if the id is not live.
pkvi_hrecord *pkvi_hybrid_rec(const pkv_hybrid *h, pkv_seq_id id);
// The group whose set token group g uses (g itself unless g is a PAGED alias).
uint32_t pkvi_hybrid_owner(const pkv_hybrid *h, uint32_t g);
// 1 if g is a valid group index of a token (not state) group.
int pkvi_hybrid_is_token_group(const pkv_hybrid *h, uint32_t g);
// Size the batch scratch (old_len, gids) for k sequences.
pkv_status pkvi_hybrid_reserve_scratch(pkv_hybrid *h, uint32_t k);
// Tell the layout that blocks went back to the pools.
void pkvi_hybrid_released(pkv_hybrid *h);

// ---- hybrid_window.c ----
// First token a query at position p still sees in group g (0: every token).
uint32_t pkvi_hybrid_first_live(const pkvi_hgroup *g, uint32_t p);

#endif // PKV_HYBRID_INTERNAL_H

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
#include "kv_events.h"

typedef struct pkvi_hcache pkvi_hcache; // hybrid_prefix_cache.c

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
    pkvi_hcache *cache;        // prefix cache of the set this group owns; NULL without
                               // one (and for aliases and state groups)
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
    // Prefix cache (hybrid_prefix.c): the block hasher (NULL: no cache), the clock
    // every group's cache takes its LRU ticks from, and the state interval S (the
    // LCM of the token groups' block sizes: states are cached at multiples of it;
    // 0: no state caching, then a model with a state group never hits).
    pkv_hasher *hasher;
    uint64_t clock;
    uint32_t state_interval;
    int has_state;
    // KV events (hybrid_events.c): off (capacity 0) without params.event_capacity.
    pkvi_event_buf events;
    pkv_medium medium;
    // Batch scratch: per-sequence lengths before the append, [cap_scratch].
    uint32_t *old_len;
    pkv_seq_id *gids;
    uint32_t cap_scratch;
    // Statistics scratch (hybrid_check.c), [cap_marks] per block of a pool: a
    // block is counted in this call when mark[b] == epoch (so no O(capacity)
    // clearing per call), and fill[b] is then the most tokens a holder sees in it.
    uint32_t *mark, *fill;
    uint32_t cap_marks, epoch;
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
// LCM layout: would an append fit once its window release is done? need: the
// plan's net blocks per group (the release netted out); freed[g]: blocks the
// release returns to group g's pool, whose ids are dead[g][0..freed[g]-1] (sorted
// here). A large page the release empties can then go to another group. 0 for
// other layouts. Changes nothing else.
int pkvi_hybrid_lcm_fits_after_release(const pkv_hybrid *h, const int64_t *need,
                                       const uint32_t *freed, pkv_block_id *const *dead);
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

// ---- hybrid_seq.c ----
// pkv_hybrid_seq_create, but state group g with given[g] >= 0 takes a reference on
// that slot (a live one: a cached state handed over) instead of a fresh slot.
pkv_status pkvi_hybrid_seq_create_given(pkv_hybrid *h, const pkv_block_id *given,
                                        pkv_seq_id *id);
// Room in every state group's copy queue for one more copy.
pkv_status pkvi_hybrid_reserve_state_copies(pkv_hybrid *h);
// Queue state group g's copy {src, dst} (room reserved), pinning both slots.
void pkvi_hybrid_queue_state_copy(pkv_hybrid *h, uint32_t g, pkv_block_id src, pkv_block_id dst);
// A new manager id and its cleared record (not live yet; its groups are the
// caller's to fill): undo with pkvi_hybrid_record_drop.
pkv_status pkvi_hybrid_record_new(pkv_hybrid *h, pkv_seq_id *id, pkvi_hrecord **r);
// The record's token group ids are filled: give PAGED aliases theirs, make it live.
void pkvi_hybrid_record_live(pkv_hybrid *h, pkvi_hrecord *r);
// Retire a record (live or not) and its id; its groups must hold nothing.
void pkvi_hybrid_record_drop(pkv_hybrid *h, pkv_seq_id id);

// ---- hybrid_append.c ----
// 1 if every pool has the net blocks need[g] (num_groups entries, owners only) its
// groups need, after the layout made room and cache-only prefix blocks were
// evicted as an append would (pkv/hybrid.h); 0 if they cannot be had.
int pkvi_hybrid_fit(pkv_hybrid *h, const int64_t *need);

// ---- hybrid_prefix.c ----
// Create the caches after the layout built the sets (nothing when
// prefix_cache_blocks is 0). On error the caller destroys h.
pkv_status pkvi_hybrid_prefix_init(pkv_hybrid *h, const pkv_hybrid_params *params);
// Drop every cache and its references; unhooks the sets first. Idempotent.
void pkvi_hybrid_prefix_teardown(pkv_hybrid *h);
// Evict one cache-only block that helps an append needing need[g] more free blocks
// in group g's pool (num_groups entries): the oldest of the groups on a short
// pool, else (LCM: large pages) the oldest of any group. 0 if none is left.
int pkvi_hybrid_prefix_evict_for(pkv_hybrid *h, const int64_t *need);
// Cache-only blocks (evictable) of every cache on `pool`.
uint64_t pkvi_hybrid_prefix_evictable(const pkv_hybrid *h, const pkv_pool *pool);
// A free state slot of state group g in *slot, evicting a cached state when none is
// free. PKV_ERR_OUT_OF_BLOCKS when none can be had.
pkv_status pkvi_hybrid_take_slot(pkv_hybrid *h, uint32_t g, pkv_block_id *slot);
// State group g's queued copies released their pins on src and dst: tell its cache
// about a cached state left to it alone.
void pkvi_hybrid_prefix_unpinned(pkv_hybrid *h, uint32_t g, pkv_block_id src, pkv_block_id dst);

// ---- hybrid_events.c ----
// Check the event params, make the buffer and hand it to every cache (after the
// caches exist). PKV_ERR_INVALID_ARG: a bad medium.
pkv_status pkvi_hybrid_events_init(pkv_hybrid *h, const pkv_hybrid_params *params);
// BlockStored of group g: hashes[0..nh-1], their nh x block_size token ids, parent
// (NULL: none).
void pkvi_hybrid_emit_stored(pkv_hybrid *h, uint32_t g, const pkv_block_hash *parent,
                             const pkv_block_hash *hashes, uint32_t nh, const int32_t *tokens,
                             uint32_t block_size);

// ---- hybrid_prefix_cache.c: one group's cache of full blocks (see the file) ----
typedef struct pkvi_hcache_stats {
    uint32_t entries, evictable;
    uint64_t hit_blocks, hit_tokens, inserts, evictions;
} pkvi_hcache_stats;
// A cache over `pool` (borrowed) of at most max_entries blocks (clamped to the
// pool's capacity); chained: FULL/MLA (leaf-first eviction). clock: borrowed.
pkv_status pkvi_hcache_create(pkv_pool *pool, uint32_t max_entries, int chained,
                              uint64_t *clock, pkvi_hcache **out);
// Release every reference and free. NULL does nothing.
void pkvi_hcache_destroy(pkvi_hcache *c);
// Report every eviction from now on as a BlockRemoved of `group` into `events`
// (borrowed; NULL: report nothing).
void pkvi_hcache_set_events(pkvi_hcache *c, pkvi_event_buf *events, uint32_t group,
                            pkv_medium medium);
// The set hook (seqset_internal.h): `block`'s refcount just dropped to 1.
void pkvi_hcache_block_unused(void *ctx, pkv_block_id block);
// The entry cached under key, or -1.
int32_t pkvi_hcache_find(const pkvi_hcache *c, const pkv_block_hash *key);
pkv_block_id pkvi_hcache_block(const pkvi_hcache *c, int32_t entry);
// 1 if only the cache holds the entry's block.
int pkvi_hcache_is_evictable(const pkvi_hcache *c, int32_t entry);
// Cache `block` (a live block of a sequence, or -1 for a hole) under key, chained
// to entry `parent` (-1: none). *entry: the entry now holding key (an existing one
// is refreshed instead), or -1 when nothing was cached (a hole, a block caching
// another key, a full cache with nothing evictable). PKV_ERR_LIMIT: refcount full.
pkv_status pkvi_hcache_insert(pkvi_hcache *c, const pkv_block_hash *key, pkv_block_id block,
                              int32_t parent, int32_t *entry);
// A hit: sequence `id` of `set` adopts the entry's block (pkvi_seq_adopt_block).
pkv_status pkvi_hcache_adopt(pkvi_hcache *c, int32_t entry, pkv_seqset *set, pkv_seq_id id);
// Take a reference on the entry's block (a hit about to use it): the entry leaves
// the eviction order. PKV_ERR_LIMIT: its refcount is full.
pkv_status pkvi_hcache_hold(pkvi_hcache *c, int32_t entry);
// Count a hit of `tokens` tokens in the statistics.
void pkvi_hcache_count_hit(pkvi_hcache *c, uint32_t tokens);
// Drop a held entry (pkvi_hcache_hold) from the cache, its block kept by the
// holder: a BlockRemoved, and the cache's reference released (the hold's stays).
void pkvi_hcache_give_up(pkvi_hcache *c, int32_t entry);
// Evict the least recently used evictable entry other than `keep`; 0 if none.
// *evicted (optional): its key.
int pkvi_hcache_evict_oldest(pkvi_hcache *c, int32_t keep, pkv_block_hash *evicted);
// The entry under key, if evictable now, goes to the front of the eviction order:
// no hit can use it any more.
void pkvi_hcache_demote(pkvi_hcache *c, const pkv_block_hash *key);
// The last use of the entry evict_oldest(-1) would take, UINT64_MAX if none.
uint64_t pkvi_hcache_oldest(const pkvi_hcache *c);
void pkvi_hcache_get_stats(const pkvi_hcache *c, pkvi_hcache_stats *stats);
// refs[block]++ for every block the cache holds.
void pkvi_hcache_count_refs(const pkvi_hcache *c, uint32_t *refs);
// Table, heap, chains and refcounts agree. PKV_OK, CORRUPT or OUT_OF_MEMORY.
pkv_status pkvi_hcache_validate(const pkvi_hcache *c);

// ---- hybrid_append.c ----
// First token a query at position p still sees in group g (0: every token).
uint32_t pkvi_hybrid_first_live(const pkvi_hgroup *g, uint32_t p);

#endif // PKV_HYBRID_INTERNAL_H

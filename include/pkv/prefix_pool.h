// SPDX-License-Identifier: MIT
// Prefix pool: a block pool with a prefix cache inside, with vLLM v1 BlockPool's
// semantics, so that an engine can swap it in for vLLM's (python: pagedkv.compat.vllm).
//
// Blocks are ids 0..num_blocks-1. Block 0 is the null block: never handed out, never
// queued, for padding block tables (sliding windows, skipped blocks); freeing or
// touching it does nothing.
//
// Free queue (an intrusive doubly linked list, O(1) per block): every block with
// refcount 0 is in it, in eviction order, the head handed out first. With caching:
//   - free_blocks takes a request's blocks in eviction priority order (vLLM's
//     manager passes them tail first); those that reach refcount 0 without a hash
//     go to the FRONT (in the given order), those with a hash to the BACK (in the
//     given order), so a cached sequence's tail is evicted before its head;
//   - a cached block with refcount 0 stays in the queue with its hash: a hit
//     (touch) takes it back out; get_new_blocks evicts it lazily when the queue
//     hands it out (its hash is dropped, a BlockRemoved event is emitted). No
//     explicit reclaim is ever needed: free count = queue length.
// Without caching every freed block goes to the back (vLLM's order for that case).
//
// Cache: (hash, group) -> blocks. Several blocks may carry one hash (a request
// recomputes a block already cached); lookups return the earliest cached of them.
// A group is a KV cache group (hybrid models): the same hash in two groups is two
// entries; single-group engines use group 0.
//
// Events (when params.event_capacity > 0): BlockStored on cache_blocks, BlockRemoved
// on every eviction (lazy or explicit), AllBlocksCleared on reset, into a bounded
// buffer the engine drains with pkv_prefix_pool_take_events each step. Overflow is
// never silent: an event that does not fit is dropped and counted, and the next
// drain ends with a PKV_EVENT_OVERFLOW record giving the count (stats.events_dropped
// keeps the total); a router that sees it must resynchronise (as after a restart).
//
// Thread-safety: none inside; one thread at a time per pool.
#ifndef PKV_PREFIX_POOL_H
#define PKV_PREFIX_POOL_H

#include <stdint.h>

#include "pkv/block_hash.h"
#include "pkv/hybrid_hit.h"
#include "pkv/pool.h"
#include "pkv/status.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct pkv_prefix_pool pkv_prefix_pool;

#define PKV_NULL_BLOCK ((pkv_block_id)0)

// Where the blocks live, as events report it (vLLM's medium: "GPU", "CPU", ...).
typedef enum pkv_medium {
    PKV_MEDIUM_GPU = 0,
    PKV_MEDIUM_CPU = 1,
    PKV_MEDIUM_DISK = 2,
} pkv_medium;

typedef struct pkv_prefix_pool_params {
    uint32_t num_blocks;      // blocks including the null block (>= 2)
    uint32_t num_groups;      // KV cache groups a hash may be cached under (>= 1)
    int enable_caching;       // 0: a plain pool (no hashes, freed blocks to the back)
    pkv_medium medium;        // reported in events
    uint32_t event_capacity;  // events buffered between drains; 0 = events off
    uint32_t event_payload;   // hashes + token ids buffered between drains (0: 64 per event)
} pkv_prefix_pool_params;

// Caching on, one group, GPU, events off.
pkv_prefix_pool_params pkv_prefix_pool_params_default(uint32_t num_blocks);

pkv_status pkv_prefix_pool_create(const pkv_prefix_pool_params *params, pkv_prefix_pool **out);
void pkv_prefix_pool_destroy(pkv_prefix_pool *pool); // NULL does nothing

// Take n blocks from the head of the free queue, each with refcount 1 and no hash;
// a cached block among them is evicted first (BlockRemoved). ids: caller-owned, n
// entries. PKV_ERR_OUT_OF_BLOCKS (nothing changed) if n > the free count.
pkv_status pkv_prefix_pool_get_new_blocks(pkv_prefix_pool *pool, uint32_t n, pkv_block_id *ids);

// Drop one reference from each of ids[0..n-1] (borrowed), given in eviction priority
// order (first = evicted first), queueing those that reach 0 as described above.
// The null block is skipped. All ids are checked first: PKV_ERR_NOT_FOUND (nothing
// changed) for an id out of range or one with fewer references than it is listed.
pkv_status pkv_prefix_pool_free_blocks(pkv_prefix_pool *pool, const pkv_block_id *ids, uint32_t n);

// A hit: add one reference to each of ids[0..n-1], taking a block with refcount 0
// out of the free queue (it keeps its hash). The null block is skipped.
// PKV_ERR_NOT_FOUND (nothing changed) for an id out of range; PKV_ERR_LIMIT at INT32_MAX.
pkv_status pkv_prefix_pool_touch(pkv_prefix_pool *pool, const pkv_block_id *ids, uint32_t n);

// Full blocks to cache: blocks[i] holds tokens [i*block_size, (i+1)*block_size) of
// tokens and is cached under hashes[i] in `group`; parent is the hash of the block
// before blocks[0] (NULL: blocks[0] starts the sequence). Pointers borrowed.
typedef struct pkv_block_store {
    uint32_t group;
    uint32_t n;
    const pkv_block_id *blocks;     // [n]; null blocks are skipped
    const pkv_block_hash *hashes;   // [n]
    const pkv_block_hash *parent;   // NULL or the chain's previous hash
    const int32_t *tokens;          // [n * block_size] for the event, or NULL: the event
                                    // then carries no token ids (num_tokens 0; cheaper)
    uint32_t block_size;
    int64_t lora_id;                // PKV_NO_LORA or the adapter id, for the event
} pkv_block_store;

// Cache the blocks (one BlockStored event for the call). Every block must be live
// (refcount >= 1) and carry no hash yet; checked first: PKV_ERR_INVALID_ARG (nothing
// changed) otherwise, or for a group >= num_groups or a hash of length 0.
// PKV_ERR_UNSUPPORTED when caching is off.
pkv_status pkv_prefix_pool_cache_blocks(pkv_prefix_pool *pool, const pkv_block_store *store);

// The earliest cached block under (hash, group): *id, or PKV_ERR_NOT_FOUND.
pkv_status pkv_prefix_pool_get_cached_block(const pkv_prefix_pool *pool, uint32_t group,
                                            const pkv_block_hash *hash, pkv_block_id *id);

// get_computed_blocks: the longest run hashes[0..k-1] that is cached in `group`;
// ids[0..k-1] (caller-owned, n entries) receive the blocks, *hits = k. No side
// effect: no reference, no queue move, no statistic (touch the blocks to use them,
// pkv_prefix_pool_record to count the query).
pkv_status pkv_prefix_pool_find_prefix(const pkv_prefix_pool *pool, uint32_t group,
                                       const pkv_block_hash *hashes, uint32_t n, pkv_block_id *ids,
                                       uint32_t *hits);

// Drop the hash of block `id` (vLLM's evict_blocks): it is no longer found; a block
// in use stays in use, a queued one stays queued as a plain free block. BlockRemoved
// if it was cached; PKV_OK either way. PKV_ERR_NOT_FOUND for an id out of range.
pkv_status pkv_prefix_pool_evict_block(pkv_prefix_pool *pool, pkv_block_id id);

// Forget every hash (AllBlocksCleared). PKV_ERR_BUSY (nothing changed) while any
// block other than the null block is in use, as vLLM's reset_prefix_cache refuses.
pkv_status pkv_prefix_pool_reset(pkv_prefix_pool *pool);

// A block's state: refcount (0 = queued), whether it is cached, its hash, group
// and its parent's hash (len 0 for a first block). PKV_ERR_NOT_FOUND out of range.
typedef struct pkv_block_info {
    int32_t refcount;
    int cached;
    uint32_t group;
    pkv_block_hash hash;
    pkv_block_hash parent;
} pkv_block_info;
pkv_status pkv_prefix_pool_block_info(const pkv_prefix_pool *pool, pkv_block_id id,
                                      pkv_block_info *info);

uint32_t pkv_prefix_pool_num_free(const pkv_prefix_pool *pool);  // queue length; 0 for NULL
uint32_t pkv_prefix_pool_capacity(const pkv_prefix_pool *pool);  // num_blocks; 0 for NULL
int32_t pkv_prefix_pool_refcount(const pkv_prefix_pool *pool, pkv_block_id id); // -1 out of range

// The free queue, head first: ids (caller-owned, cap entries) receives up to cap
// ids; *n the queue length. PKV_ERR_BUFFER_TOO_SMALL if cap < *n.
pkv_status pkv_prefix_pool_free_queue(const pkv_prefix_pool *pool, pkv_block_id *ids, uint32_t cap,
                                      uint32_t *n);

// Token-level statistics, as vLLM's PrefixCacheStats: a scheduler records each
// lookup with the request's token count and the tokens it found cached.
typedef struct pkv_prefix_pool_stats {
    uint32_t capacity, free_blocks, cached_blocks;
    uint64_t requests, queries, hits;                       // requests, tokens asked, tokens hit
    uint64_t preempted_requests, preempted_queries, preempted_hits; // of preempted requests
    uint64_t evictions;       // hashes dropped (lazy, explicit or by reset)
    uint64_t events_dropped;  // events lost to a full buffer since creation
} pkv_prefix_pool_stats;

pkv_status pkv_prefix_pool_record(pkv_prefix_pool *pool, uint64_t query_tokens,
                                  uint64_t hit_tokens, int preempted);
// Copy the statistics; reset != 0 zeroes the request/query/hit counters afterwards
// (vLLM's make_prefix_cache_stats hands out and restarts them each step).
pkv_status pkv_prefix_pool_get_stats(pkv_prefix_pool *pool, pkv_prefix_pool_stats *stats, int reset);

typedef enum pkv_kv_event_kind {
    PKV_EVENT_BLOCK_STORED = 1,
    PKV_EVENT_BLOCK_REMOVED = 2,
    PKV_EVENT_ALL_BLOCKS_CLEARED = 3,
    PKV_EVENT_OVERFLOW = 4,       // events were dropped here: `dropped` says how many
} pkv_kv_event_kind;

// One event. Arrays are borrowed from the pool, valid until the pool next emits an
// event (i.e. until the next mutating call after the drain).
typedef struct pkv_kv_event {
    pkv_kv_event_kind kind;
    uint32_t group;
    pkv_medium medium;
    uint32_t num_hashes;
    const pkv_block_hash *hashes;  // [num_hashes]: stored or removed blocks
    int has_parent;                // BlockStored: 1 if parent is set
    pkv_block_hash parent;
    uint32_t num_tokens;           // BlockStored: block_size token ids per block stored,
                                   // null blocks included (their hashes are not)
    const int32_t *tokens;         // [num_tokens]
    uint32_t block_size;
    int64_t lora_id;               // PKV_NO_LORA or the adapter id
    uint64_t dropped;              // OVERFLOW: events lost since the previous drain
} pkv_kv_event;

// Drain the events emitted since the last drain, oldest first: *events (borrowed,
// see above) and *n. Events off: *n = 0.
pkv_status pkv_prefix_pool_take_events(pkv_prefix_pool *pool, const pkv_kv_event **events,
                                       uint32_t *n);

// O(num_blocks) check: queue links, free count, refcounts, cache table and
// duplicate lists agree. PKV_OK or PKV_ERR_CORRUPT.
pkv_status pkv_prefix_pool_validate(const pkv_prefix_pool *pool);

// Hybrid models (issue 23): the longest prefix hit common to several KV cache
// groups of this pool, vLLM's hybrid coordinator. Group g of the array is the pool's
// group g; its request block hashes (computed at its own block size) are
// hashes[0..num_hashes-1]. Every hash is looked up on its own (a sliding-window
// group may have lost early blocks and still hit), the hit follows hybrid_hit.h's
// rules (rule.cached is ignored: the pool fills it), and ids[0..hit / block_size - 1]
// (caller-owned, num_hashes entries) receive the blocks to reuse, PKV_NULL_BLOCK for
// those the group does not need (before its window; every block of a state group but
// the last). Read-only, like find_prefix: touch the non-null blocks to use them.
typedef struct pkv_hybrid_lookup {
    pkv_hit_group rule;             // kind, window, block_size (num_blocks, cached: unused)
    const pkv_block_hash *hashes;   // the request's full blocks in this group
    uint32_t num_hashes;
    pkv_block_id *ids;              // out: num_hashes entries
    uint32_t num_ids;               // out: hit_tokens / block_size
} pkv_hybrid_lookup;
// PKV_ERR_INVALID_ARG: NULL, num_groups 0 or above the pool's groups or
// PKV_MAX_KV_GROUPS, a bad rule (hybrid_hit.h) or hash; PKV_ERR_OUT_OF_MEMORY.
pkv_status pkv_prefix_pool_find_hybrid_prefix(const pkv_prefix_pool *pool, pkv_hybrid_lookup *groups,
                                              uint32_t num_groups, uint32_t max_tokens,
                                              uint32_t *hit_tokens);

#ifdef __cplusplus
}
#endif

#endif // PKV_PREFIX_POOL_H

// SPDX-License-Identifier: MIT
// Prefix cache: reuse the KV blocks of a prompt prefix that an earlier request
// already computed (system prompts, few-shot examples, multi-turn chat).
//
// Only full blocks are cached. A block is keyed by a hash chained over the
// prefix: key(i) = H(key(i-1), tokens of block i), so a block matches only when
// the whole prefix before it matches too. The cache stores each block's token ids
// and compares them on a hit, so a hash collision can never hand out wrong K/V.
//
// The cache holds one pool reference on every block it keeps. A cached block that
// no sequence uses any more (refcount 1: the cache's own) stays reusable until the
// pool runs dry; then pkv_prefix_cache_reclaim evicts the least recently used such
// blocks, leaf first: a block whose successor in a chain is still cached stays, so
// freeing one block never strands the rest of a shared prompt. A block's "use" is
// its insert, a refresh by insert, or the moment its last sequence released it;
// a parent that becomes a leaf when its child is evicted keeps its own last use,
// so a hot shared prefix is not evicted before colder blocks. The pool itself
// knows nothing of the cache: its alloc/free fast path is unchanged.
//
// Thread-safety: as for the pool; one thread at a time for the cache, its pool and
// its sets.
#ifndef PKV_PREFIX_H
#define PKV_PREFIX_H

#include <stdint.h>

#include "pkv/pool.h"
#include "pkv/seq.h"
#include "pkv/status.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct pkv_prefix_cache pkv_prefix_cache;

typedef struct pkv_prefix_stats {
    uint32_t entries;       // blocks the cache holds now
    uint32_t evictable;     // of those, held by the cache alone (reclaimable, leaves first)
    uint64_t lookups;       // blocks looked up by pkv_seq_create_cached
    uint64_t hits;          // of those, found
    uint64_t inserts;       // blocks added
    uint64_t evictions;     // blocks released by eviction
} pkv_prefix_stats;

// Create a cache over `pool` (borrowed) for sets of `block_size` tokens per block,
// holding at most max_entries blocks (>= 1). *out is owned by the caller.
pkv_status pkv_prefix_cache_create(pkv_pool *pool, uint32_t block_size, uint32_t max_entries,
                                   pkv_prefix_cache **out);

// Release every block the cache holds and free it. NULL does nothing.
void pkv_prefix_cache_destroy(pkv_prefix_cache *cache);

// Attach `set` (same pool and block size) to the cache: from now on the set tells
// the cache when a cached block it releases is left to the cache alone (a hook the
// cache registers on the set), which is what keeps eviction cheap. create_cached
// and insert accept attached sets only. A set serves one cache: attaching it to
// a second one gives PKV_ERR_BUSY (detach it first); attaching it again to the
// same cache is a no-op. Destroy (or detach) the attached sets before the cache.
// Releasing a cached block through pkv_pool_release directly, behind the set's
// back, is not seen by the cache.
pkv_status pkv_prefix_cache_attach(pkv_prefix_cache *cache, pkv_seqset *set);

// Detach `set` from the cache. PKV_ERR_NOT_FOUND if it is not attached to this
// cache; PKV_ERR_BUSY (nothing changed) while one of its sequences or queued
// copies still holds a block the cache holds, since its release would go unseen.
pkv_status pkv_prefix_cache_detach(pkv_prefix_cache *cache, pkv_seqset *set);

// The result of an admission probe (plain data, caller-owned).
typedef struct pkv_prefix_match {
    uint32_t cached_tokens;  // leading tokens that need no prefill (as create_cached reports)
    uint32_t cached_blocks;  // blocks that would be shared from the cache
    uint32_t new_blocks;     // blocks the remaining n - cached_tokens tokens would take
    uint32_t evictable_hit;  // of cached_blocks, how many are now evictable (held by the
                             // cache alone): admitting would make them unreclaimable
} pkv_prefix_match;

// Side-effect-free admission probe: what pkv_seq_create_cached + appending the rest
// of tokens[0..n-1] would find and take. Takes no reference, changes no statistic and
// no LRU order. A scheduler admits when new_blocks <= free blocks + what
// pkv_prefix_cache_reclaim could free (stats.evictable - evictable_hit).
// tokens: borrowed, n entries.
pkv_status pkv_prefix_cache_match(const pkv_prefix_cache *cache, const int32_t *tokens,
                                  uint32_t n, pkv_prefix_match *match);

// Create a sequence in `set` (attached to the cache) that starts
// with the longest cached prefix of tokens[0..n-1], sharing those blocks
// (refcount + 1). *cached_tokens receives how many leading tokens need no prefill:
// a multiple of block_size, and at most n - 1, so the last prompt token is always
// computed (its logits start generation). The caller then appends and prefills the
// remaining n - *cached_tokens tokens. tokens: borrowed, n entries.
pkv_status pkv_seq_create_cached(pkv_seqset *set, pkv_prefix_cache *cache, const int32_t *tokens,
                                 uint32_t n, pkv_seq_id *id, uint32_t *cached_tokens);

// Offer the full blocks of sequence `id` for reuse, once their K/V is written.
// tokens[0..n-1] are the sequence's first n token ids (n <= its length); blocks
// already cached are refreshed in the LRU order. When the cache is full the least
// recently used evictable entry makes room; if none is evictable the rest is not
// cached (not an error). A block the window rule released (PKV_BLOCK_NONE, seq.h)
// ends the chain unless it was cached before. *inserted (optional) receives the
// number of new entries.
// PKV_ERR_LIMIT if a block's refcount cannot take the cache's reference (the
// entries added before it stay).
pkv_status pkv_prefix_cache_insert(pkv_prefix_cache *cache, const pkv_seqset *set, pkv_seq_id id,
                                   const int32_t *tokens, uint32_t n, uint32_t *inserted);

// Make at least `need` blocks free in the pool by evicting least recently used
// entries that only the cache holds. PKV_OK when the pool has `need` free blocks
// afterwards, else PKV_ERR_OUT_OF_BLOCKS (entries evicted on the way stay evicted).
pkv_status pkv_prefix_cache_reclaim(pkv_prefix_cache *cache, uint32_t need);

pkv_status pkv_prefix_cache_get_stats(const pkv_prefix_cache *cache, pkv_prefix_stats *stats);

// Structure check, O(entries + table): table, eviction list, child counts and
// block refcounts agree. PKV_OK, PKV_ERR_CORRUPT or PKV_ERR_OUT_OF_MEMORY.
pkv_status pkv_prefix_cache_validate(const pkv_prefix_cache *cache);

#ifdef __cplusplus
}
#endif

#endif // PKV_PREFIX_H

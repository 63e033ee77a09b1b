// SPDX-License-Identifier: MIT
// Hybrid KV manager: the KV cache groups of a heterogeneous model (model_config.h)
// over block pools, one block table per group and sequence, the group's rule
// applied to it. vLLM v1's hybrid KV cache manager and SGLang's state pool, in C.
//
// Groups. A model's layers form KV cache groups (pkv_kv_group): FULL and MLA
// groups keep every token; SLIDING (window W) and CHUNKED (chunk C) groups keep
// only what a future query can still see; STATE groups keep a fixed state per
// sequence and nothing per token. Every token group g has a block size B_g in
// tokens and a page (one block, all the group's layers) of B_g x bytes_per_token_g
// bytes; bytes_per_token_g is pkv_kv_group_bytes_per_token(group, elem_bytes).
//
// Window rule (the one place the kinds differ). The next query of a sequence is
// the first token the next append writes, p = the length before that append. A
// query at p sees p - W + 1 .. p (SLIDING) or floor(p / C) * C .. p (CHUNKED), so
// every token before first_live(p) = max(0, p - W + 1), resp. floor(p / C) * C, is
// dead, and block j (tokens j*B .. j*B + B - 1) is dead once j*B + B <= first_live.
// Appending to a sequence of length p first releases the dead blocks of its
// windowed groups (pkv_seq_release_before): their table entries become holes,
// PKV_BLOCK_NONE (seq.h), and the blocks return to the pool unless still shared.
// Holes are always a prefix of the table; the partly filled last block is never a
// hole. A sliding group of window W thus holds at most ceil((W - 1 + n) / B) + 1
// blocks per sequence while appending n tokens per step, whatever its length.
// FULL and MLA groups never release; the PAGED layout releases nothing at all.
//
// Layouts (pkv_hybrid_layout): how the memory budget becomes pools. In every
// layout the state groups first take max_seqs state slots each (a pool of slots of
// the group's state bytes, all its layers); the rest of the budget becomes pages.
// - PKV_HYBRID_PAGED: every attention layer is treated as full attention (today's
//   behaviour, kept so old results reproduce): one pool whose page holds one block
//   of every token group, B tokens x sum of the token groups' bytes per token; one
//   block table shared by every token group; no window release.
// - PKV_HYBRID_PARTITION: one static pool per token group; group g gets the share
//   bytes_per_token_g / sum of bytes_per_token of the page budget and block size
//   B_g (block_sizes[g], or block_size).
// - PKV_HYBRID_SHARED_PAGE: vLLM's hybrid manager: one pool of equal pages of
//   P = block_size x max_g bytes_per_token_g bytes shared by every token group;
//   group g's block size is B_g = floor(P / bytes_per_token_g) tokens (the group
//   with the most bytes per token gets block_size; the rest of a page that
//   B_g x bytes_per_token_g leaves unused is counted as padding in the stats).
// - PKV_HYBRID_LCM: Jenga's two-level allocator (large pages of the LCM of the
//   token groups' page sizes, carved into per-group small pages, returned to the
//   shared pool when empty). Group g's block size is B_g (block_sizes[g], or
//   block_size). An empty large page stays with its group until another group's
//   append needs it (lazy return); a group's free_bytes counts the large pages it
//   could take. PKV_ERR_LIMIT from pkv_hybrid_create when the LCM passes 1 GiB.
//
// Sequences. One id (pkv_seq_id, same generation rules as seq.h) names a
// sequence in every group. Appends return one slot mapping per group; state
// groups write -1 for each token (they keep no per-token slot). Copies are queued
// per group: block copies (copy-on-write, seq.h) for token groups, state copies
// {src slot, dst slot} (fork) for state groups; the caller runs them and takes them
// as with pkv_seqset_take_copies.
//
// Prefix cache (optional: params.prefix_cache_blocks > 0). Each token group that
// owns a table (PAGED: the one table, under the rule of a full group) keeps a
// cache of full blocks keyed by the chained block hash of its own block size
// (block_hash.h, no extra keys, algorithm params.prefix_hash: SHA-256 by default,
// and the cache trusts the hash as vLLM and the prefix pool do, so pick a
// collision-resistant one where prompts may be adversarial). A cached block holds
// one pool reference. Blocks are looked up one hash at a time, so a windowed group
// that lost (or never cached) its early blocks can still hit.
// - Insert (pkv_hybrid_cache_prefix): the full blocks of tokens 0..n-1 of a live
//   sequence, once their K/V is written. Call it right after the prompt's append:
//   the window rule releases a windowed group's dead blocks only at the next
//   append, so the prompt's blocks are still there to cache; blocks already
//   released (holes) are skipped. FULL and MLA groups (and PAGED) cache a chain:
//   block i only if block i-1 is cached, so eviction can go leaf first.
// - Hit (pkv_hybrid_seq_create_cached): the longest L <= n - 1 (the last prompt
//   token is always computed: its logits start generation) that every group
//   accepts under hybrid_hit.h's rules (FULL/MLA every block before L, SLIDING the
//   blocks of tokens L-W+1..L-1, CHUNKED those of L's chunk up to L-1), a multiple
//   of every token group's block size. Each group's table starts with the blocks
//   it needs (shared, refcount + 1) after leading holes for the ones it does not
//   (PKV_BLOCK_NONE: exactly the blocks the window rule would have released, so
//   the tables look as after appending L tokens).
// - States (a model with a state group): a recurrent state cannot be rebuilt from
//   blocks, so a hit at L also needs the state after token L-1 cached. States are
//   cached at multiples of the state interval S = the LCM of the token groups'
//   block sizes (pkv_hybrid_state_interval; 0 above 2^20: then such a model never
//   hits): pkv_hybrid_cache_state, called when a sequence's length is such a
//   boundary (an engine chunks its prefill there), snapshots each state group's
//   state into a slot of the group's own pool held by the cache (a queued state
//   copy {the sequence's slot, the snapshot's}, as fork queues one). A hit at L
//   gives the new sequence's slot a queued copy {the snapshot's slot, its slot}.
//   Snapshots use state slots no sequence holds (max_seqs of them) and are evicted,
//   oldest first, when a sequence needs a slot or the cache is full. A hit whose
//   sequence could only get a slot by evicting the very state it starts from takes
//   that state's slot instead (no copy; the cache gives the state up, a
//   BlockRemoved), so a hit never fails where a miss would succeed.
// - Eviction: a block only the cache holds (its sequences are gone or released
//   it) is evictable. When an append (or a batch) does not fit, the manager
//   evicts before it fails: for each short pool, the least recently released
//   evictable blocks of the groups drawing on it, oldest first across those groups
//   (one clock for the manager, so the groups' hit lengths shrink together, as
//   Jenga asks: the shortest group hit is the hit). A windowed group's old blocks
//   leave before its recent ones (they were released earlier); a FULL/MLA group
//   evicts leaf first (a block whose successor is cached stays; it becomes a leaf
//   under its own last use), so no cached block is ever unreachable. Blocks no
//   rule can use go first: when a FULL/MLA group loses block i of a prefix, a
//   windowed group of the same block size moves its block i of that prefix (the
//   same hash) to the front of its order, since no hit can reach it. LCM: evicting
//   a group's small pages may empty a large page that another group then takes;
//   a short group evicts from its own cache first, then the oldest blocks of any
//   group until the large pages fit. A refused append may leave blocks evicted
//   (the sequences and their blocks are unchanged; the cache lost entries it
//   could not have kept anyway). An insert into a group whose cache is full
//   evicts that group's oldest evictable block, or stops.
// - Accounting: a cache-only block is in neither blocks_held nor free_bytes of
//   pkv_hybrid_group_stats; cached_evictable counts it.
// - Events (params.event_capacity > 0): vLLM's KV events, for engines that route
//   requests by cache contents, in one bounded buffer for the manager (every
//   group's events in emission order) drained with pkv_hybrid_take_events. An
//   event's group is the group index as in params.groups (PAGED: the first token
//   group, whose table every token group shares), block_size that group's B_g.
//   BlockStored when pkv_hybrid_cache_prefix adds entries: per group and call, one
//   event per run of consecutive new blocks, with their hashes, the token ids of
//   those blocks, and as parent the chained hash of the block before the run (none
//   for a run starting at block 0). A FULL/MLA group's new blocks are one run that
//   continues its cached chain. A windowed group may add several runs in one call
//   (blocks cached already or released split them), and a run's parent need not be
//   cached: the hash is chained, so it names the prefix all the same. A refresh
//   (cached already) emits nothing. BlockRemoved, one hash each, whenever an entry
//   leaves a cache: eviction for an append, a full cache's insert, a sequence's
//   state slot; none at destroy. States: a snapshot is a BlockStored of the state
//   group with one hash (the prefix hash at the boundary n, chained at S tokens per
//   block), the last S token ids, block_size S and parent the hash at n - S (none
//   at n = S); its eviction a BlockRemoved. AllBlocksCleared on
//   pkv_hybrid_reset_prefix_cache. A full buffer drops events, counts them, and
//   the next drain ends with an OVERFLOW record: the consumer must resynchronise.
//
// Ownership: the manager owns its pools, sets and state pool; every pointer it
// returns points into it (borrowed, valid until the next call that changes it).
// Arrays passed in are borrowed for the call.
// Thread-safety: not synchronized. One thread at a time per manager; different
// managers are independent.
#ifndef PKV_HYBRID_H
#define PKV_HYBRID_H

#include <stddef.h>
#include <stdint.h>

#include "pkv/block_hash.h"
#include "pkv/model_config.h"
#include "pkv/pool.h"
#include "pkv/prefix_pool.h"
#include "pkv/seq.h"
#include "pkv/status.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct pkv_hybrid pkv_hybrid;

typedef enum pkv_hybrid_layout {
    PKV_HYBRID_PAGED = 0,       // every layer full attention, one table (pre-0.3.0)
    PKV_HYBRID_PARTITION = 1,   // one static pool per group, by bytes-per-token share
    PKV_HYBRID_SHARED_PAGE = 2, // one pool of equal pages, block size per group
    PKV_HYBRID_LCM = 3,         // Jenga: LCM large pages carved per group
} pkv_hybrid_layout;

// "paged", "partition", "shared-page", "lcm"; "unknown" for another value.
const char *pkv_hybrid_layout_name(pkv_hybrid_layout layout);

// Parse one of the names above. PKV_ERR_INVALID_ARG for NULL or another name.
pkv_status pkv_hybrid_layout_parse(const char *name, pkv_hybrid_layout *layout);

// What pkv_hybrid_create builds. Plain data; fill it with pkv_hybrid_params_default
// and then set the fields.
typedef struct pkv_hybrid_params {
    const pkv_kv_group *groups; // [num_groups], borrowed for the create call (copied)
    uint32_t num_groups;        // 1..PKV_MAX_KV_GROUPS; at least one token group
                                // (kind != PKV_LAYER_STATE)
    size_t elem_bytes;          // stored bytes per element (2: fp16/bf16, 1: fp8)
    pkv_hybrid_layout layout;
    uint64_t budget_bytes;      // memory for every group's pages and states together
    uint32_t block_size;        // tokens per block (1..65536); default 16. PAGED:
                                // the one table's; SHARED_PAGE: the block size of the
                                // group with the most bytes per token
    uint32_t block_sizes[PKV_MAX_KV_GROUPS]; // PARTITION, LCM: group g's block size,
                                // 0 = block_size; must be 0 for PAGED and SHARED_PAGE
    uint32_t max_seqs;          // state slots per state group (live sequences with a
                                // state); default 256; ignored without state groups
    uint32_t prefix_cache_blocks; // 0: no prefix cache (default); else the most blocks
                                // the cache may hold per token group (clamped to the
                                // blocks of the group's pool)
    pkv_hash_algo prefix_hash;  // the cache's block hash; default PKV_HASH_SHA256
    // KV events (the "Prefix cache" rules at the top; they need the cache):
    pkv_medium medium;          // reported in events; default PKV_MEDIUM_GPU
    uint32_t event_capacity;    // events buffered between drains; 0 = events off (default)
    uint32_t event_payload;     // hashes + token ids buffered between drains (0: 64 per
                                // event), as pkv_prefix_pool_params
} pkv_hybrid_params;

// Defaults: no groups, elem_bytes 2, PAGED, budget 0, block_size 16, block_sizes
// all 0, max_seqs 256, no prefix cache, prefix_hash SHA-256, medium GPU, events off.
void pkv_hybrid_params_default(pkv_hybrid_params *params);

// Build a manager. *out is owned by the caller (pkv_hybrid_destroy).
// PKV_ERR_INVALID_ARG names the problem through the fields above: no or too many
// groups, no token group, a group with 0 layers or 0 bytes per token / state, a
// SLIDING or CHUNKED group with window 0, elem_bytes 0, a block size out of range
// (SHARED_PAGE: also a derived B_g > 65536), block_sizes set for PAGED or
// SHARED_PAGE, max_seqs 0 with a state group, or a budget too small for the state
// slots plus one page in every pool (or so large that a pool would pass
// PKV_POOL_MAX_BLOCKS; LCM: a budget below one large page). PKV_ERR_LIMIT (LCM):
// the large page, the LCM of the token groups' page bytes, would pass 1 GiB.
// PKV_ERR_UNSUPPORTED: prefix_hash is an algorithm this build lacks (with the
// cache on); PKV_ERR_INVALID_ARG for an unknown one, for a medium that is none of
// pkv_medium's, and for event_capacity > 0 without a prefix cache (events report
// the cache's contents: without one there is nothing to report, and a router fed
// an empty stream would believe the engine caches nothing).
pkv_status pkv_hybrid_create(const pkv_hybrid_params *params, pkv_hybrid **out);

// Release everything. NULL does nothing.
void pkv_hybrid_destroy(pkv_hybrid *h);

pkv_hybrid_layout pkv_hybrid_get_layout(const pkv_hybrid *h); // PAGED for NULL
uint32_t pkv_hybrid_num_groups(const pkv_hybrid *h);          // 0 for NULL
uint32_t pkv_hybrid_live_count(const pkv_hybrid *h);          // live sequences

// Group g as given at create (*group, caller-owned) and its block size in tokens
// (*block_size; 0 for a state group). Either output may be NULL.
// PKV_ERR_INVALID_ARG for g >= num_groups.
pkv_status pkv_hybrid_group_info(const pkv_hybrid *h, uint32_t g, pkv_kv_group *group,
                                 uint32_t *block_size);

// ---- sequences ----

// Create an empty sequence in every group; each state group gives it a state slot.
// PKV_ERR_OUT_OF_BLOCKS (nothing changed) when a state group has no free slot;
// PKV_ERR_LIMIT at 2^20 live sequences.
pkv_status pkv_hybrid_seq_create(pkv_hybrid *h, pkv_seq_id *id);

// Free a sequence: its blocks in every group and its state slots. A state slot
// still pinned by a queued state copy returns once the copies are taken.
pkv_status pkv_hybrid_seq_free(pkv_hybrid *h, pkv_seq_id id);

// Fork: *child shares every live block of `parent` in every token group (holes
// stay holes) and gets a fresh state slot in every state group, with a queued
// state copy {parent's slot, child's slot} (take it with pkv_hybrid_take_copies).
// All or nothing: PKV_ERR_OUT_OF_BLOCKS when a state group has no free slot,
// PKV_ERR_LIMIT as pkv_seq_fork.
pkv_status pkv_hybrid_seq_fork(pkv_hybrid *h, pkv_seq_id parent, pkv_seq_id *child);

// Length in tokens (the same in every group).
pkv_status pkv_hybrid_seq_length(const pkv_hybrid *h, pkv_seq_id id, uint32_t *len);

// Append n tokens to `id` in every group: release the blocks the window rule kills
// for the queries of this append (first query p = the length before it; n = 0
// has no query and changes nothing), then grow
// the tables (copy-on-write as seq.h). All or nothing over every group:
// PKV_ERR_OUT_OF_BLOCKS (some pool short, counting the blocks the release returns
// to it and, under LCM, the large pages it empties, which another group may then
// take) leaves every group and pool unchanged, the release included;
// PKV_ERR_OUT_OF_MEMORY (host metadata) undoes the appends but may leave the
// release done (those blocks were dead for this append's queries anyway).
// slots: optional, caller-owned, num_groups x n entries: slots[g * n + t] is the
// slot (seq.h) of new token t in group g, -1 in a state group. In PAGED every
// token group gets the same slots (one page holds all of them).
pkv_status pkv_hybrid_append(pkv_hybrid *h, pkv_seq_id id, uint32_t n, int64_t *slots);

// Append counts[i] tokens to seqs[i] for every i, as pkv_hybrid_append on each in
// order, all or nothing over the batch and every group. A seq id may appear once
// (else PKV_ERR_INVALID_ARG; an id not live: PKV_ERR_NOT_FOUND). slots: optional,
// caller-owned, num_groups x total entries, total = sum(counts): row g is group
// g's slot mapping of the whole batch in order (seqs[0]'s tokens first), -1 in a
// state group's row.
pkv_status pkv_hybrid_append_batch(pkv_hybrid *h, const pkv_seq_id *seqs,
                                   const uint32_t *counts, uint32_t num_seqs, int64_t *slots);

// For a batch as pkv_hybrid_append_batch would take it: blocks[g] (caller-owned,
// num_groups entries) receives how many blocks group g's pool would lose, i.e. the
// new blocks and copies minus the released blocks that this batch's sequences hold
// alone (a dead block a forked sibling still shares is not counted as returned, so
// the figure is an upper bound when siblings share dead blocks). Groups sharing a
// pool (PAGED: every token group; SHARED_PAGE) each report their own part: the
// pool loses their sum (PAGED: the one table's figure, under every token group).
// 0 for state groups. Same id checks as the batch append.
pkv_status pkv_hybrid_blocks_needed_batch(const pkv_hybrid *h, const pkv_seq_id *seqs,
                                          const uint32_t *counts, uint32_t num_seqs,
                                          uint32_t *blocks);

// pkv_hybrid_blocks_needed_batch for one sequence.
pkv_status pkv_hybrid_blocks_needed(const pkv_hybrid *h, pkv_seq_id id, uint32_t n,
                                    uint32_t *blocks);

// Drop every token at position >= len in every group (len <= length, else
// PKV_ERR_INVALID_ARG). PKV_ERR_RELEASED (nothing changed) when some windowed
// group already released a token that the next query, at position len, would see
// (first_live(len) < the tokens that group released); PKV_ERR_UNSUPPORTED (nothing
// changed, and checked first) when len < length and the model has a state group:
// a recurrent state cannot be rolled back.
pkv_status pkv_hybrid_seq_truncate(pkv_hybrid *h, pkv_seq_id id, uint32_t len);

// ---- per-group views ----

// Group g's block table of `id`: *table (borrowed, valid until the next call that
// changes this sequence) has *num_blocks = ceil(len / B_g) entries, the first
// *first_live of them PKV_BLOCK_NONE (released). PKV_ERR_INVALID_ARG for a state
// group. first_live may be NULL.
pkv_status pkv_hybrid_block_table(const pkv_hybrid *h, pkv_seq_id id, uint32_t g,
                                  const pkv_block_id **table, uint32_t *num_blocks,
                                  uint32_t *first_live);

// The state slot (0..max_seqs-1) of `id` in state group g. PKV_ERR_INVALID_ARG if
// g is not a state group.
pkv_status pkv_hybrid_state_slot(const pkv_hybrid *h, pkv_seq_id id, uint32_t g,
                                 int32_t *slot);

// Export sizes of group g for seqs[0..num_seqs-1], as pkv_seqset_export_size
// (holes count as entries in *max_blocks and *total_blocks).
pkv_status pkv_hybrid_export_size(const pkv_hybrid *h, uint32_t g, const pkv_seq_id *seqs,
                                  uint32_t num_seqs, uint32_t *max_blocks,
                                  uint64_t *total_blocks);

// Group g's padded table, as pkv_seqset_export_padded: table[i * max_blocks + j]
// is block j of seqs[i], -1 (PKV_BLOCK_NONE) for a released block, pad_value past
// the end; lens (optional) the lengths. PKV_ERR_INVALID_ARG for a state group.
pkv_status pkv_hybrid_export_padded(const pkv_hybrid *h, uint32_t g, const pkv_seq_id *seqs,
                                    uint32_t num_seqs, uint32_t max_blocks, int32_t pad_value,
                                    int32_t *table, int32_t *lens);

// Group g's CSR form with live blocks only, as pkv_seqset_export_csr_live:
// indices[indptr[i] .. indptr[i+1]-1] are logical blocks first_block[i] ..
// ceil(len / B_g) - 1 of seqs[i]; last_page_len as pkv_seqset_export_csr.
// PKV_ERR_INVALID_ARG for a state group.
pkv_status pkv_hybrid_export_csr(const pkv_hybrid *h, uint32_t g, const pkv_seq_id *seqs,
                                 uint32_t num_seqs, int32_t *indptr, int32_t *indices,
                                 uint32_t indices_cap, int32_t *last_page_len,
                                 int32_t *first_block);

// Number of queued copies of group g (token group: copy-on-write block copies;
// state group: fork state copies). In PAGED every token group shows the one
// table's queue.
uint32_t pkv_hybrid_pending_copies(const pkv_hybrid *h, uint32_t g);

// Take group g's queued copies into copies[0..*n-1] (caller-owned, cap entries)
// and empty the queue, as pkv_seqset_take_copies (PKV_ERR_BUFFER_TOO_SMALL: *n is
// the number needed, nothing taken). State copies are {src slot, dst slot}: copy
// the state of every layer of the group, in queue order (a fork of a fork whose
// copy has not run yet copies from a slot an earlier copy fills). Run them before
// the next append; the contract of pkv_seqset_copies applies to both kinds (the
// pins keep src and dst from being handed out again until the copies are taken).
pkv_status pkv_hybrid_take_copies(pkv_hybrid *h, uint32_t g, pkv_block_copy *copies,
                                  uint32_t cap, uint32_t *n);

// ---- prefix cache (params.prefix_cache_blocks > 0; the rules at the top) ----

// Offer the full blocks of tokens[0..n-1] (borrowed; the sequence's first n token
// ids, n <= its length) of live sequence `id` to every token group's cache, once
// their K/V is written. Blocks already cached are refreshed, released ones
// skipped; a full cache evicts its oldest evictable block or stops (not an
// error). *inserted (optional): new entries over all token groups (states:
// pkv_hybrid_cache_state). PKV_ERR_UNSUPPORTED without a cache;
// PKV_ERR_INVALID_ARG for n > length; PKV_ERR_LIMIT if a block's refcount cannot
// take the cache's reference (the entries added before it stay).
pkv_status pkv_hybrid_cache_prefix(pkv_hybrid *h, pkv_seq_id id, const int32_t *tokens,
                                   uint32_t n, uint32_t *inserted);

// Snapshot every state group's state of live sequence `id`, whose length n is a
// multiple of pkv_hybrid_state_interval (> 0), as the state after tokens[0..n-1]
// (borrowed): once the queued state copies run (pkv_hybrid_take_copies, before the
// next append), the cache holds it for hits at n. A prefix cached already is
// refreshed; no slot to spare (every slot held by a sequence or a pinned state)
// caches nothing (not an error). *cached (optional): snapshots taken. Without a
// state group: nothing (PKV_OK when n is the length). PKV_ERR_UNSUPPORTED without a
// cache; PKV_ERR_INVALID_ARG for n != length or not a multiple of the interval;
// PKV_ERR_OUT_OF_MEMORY (host) for the copy queue.
pkv_status pkv_hybrid_cache_state(pkv_hybrid *h, pkv_seq_id id, const int32_t *tokens, uint32_t n,
                                  uint32_t *cached);

// The state interval S (the rules at the top): 0 without a prefix cache, without a
// state group, or when S would pass 2^20 (then nothing hits).
uint32_t pkv_hybrid_state_interval(const pkv_hybrid *h);

// What pkv_hybrid_seq_create_cached would find (plain data, caller-owned).
typedef struct pkv_hybrid_prefix_match {
    uint32_t cached_tokens;                       // the hit L
    uint32_t hit_blocks[PKV_MAX_KV_GROUPS];       // blocks group g would share (a state
                                                  // group: 1, the cached state, when
                                                  // L > 0; a PAGED alias repeats the
                                                  // one table's figure)
    uint32_t evictable_hit[PKV_MAX_KV_GROUPS];    // of those, held by the cache alone
                                                  // now: the hit makes them unreclaimable
} pkv_hybrid_prefix_match;

// Side-effect-free admission probe for tokens[0..n-1] (borrowed): no reference,
// no statistic, no LRU change. Without a cache the hit is 0. An admission check
// adds the evictable blocks (stats) less evictable_hit to each pool's free blocks.
pkv_status pkv_hybrid_prefix_match_get(const pkv_hybrid *h, const int32_t *tokens, uint32_t n,
                                       pkv_hybrid_prefix_match *match);

// Create a sequence that starts with the longest cached prefix of tokens[0..n-1]
// (borrowed) in every group: *cached_tokens = L (a multiple of every token group's
// block size, <= n - 1, 0 without a cache), the tables as described at the top,
// the length L, and per state group a queued copy of the cached state into the
// sequence's slot (take it with pkv_hybrid_take_copies before the next append), or
// the cached state's own slot when it was the last one to be had (top: "States").
// The caller then appends and prefills tokens L..n-1. Errors as
// pkv_hybrid_seq_create (nothing changed), PKV_ERR_LIMIT if a block's refcount
// cannot grow.
pkv_status pkv_hybrid_seq_create_cached(pkv_hybrid *h, const int32_t *tokens, uint32_t n,
                                        pkv_seq_id *id, uint32_t *cached_tokens);

// Drain the KV events emitted since the last drain, every group's in emission
// order (the "Prefix cache" rules at the top), as pkv_prefix_pool_take_events:
// *events (borrowed, valid until the next call that changes the manager) and *n,
// ending with a PKV_EVENT_OVERFLOW record when events were dropped. Events off:
// *n = 0. PKV_ERR_INVALID_ARG for NULL.
pkv_status pkv_hybrid_take_events(pkv_hybrid *h, const pkv_kv_event **events, uint32_t *n);

// Whether group g's cache holds `hash` (a block of B_g tokens; a state group: the
// state at a multiple of the state interval): PKV_OK and *block (optional) the
// block or state slot holding it, else PKV_ERR_NOT_FOUND. Read-only (no LRU
// change): a consumer of the events can check its view against it. A PAGED token
// group reads the one table's cache. PKV_ERR_INVALID_ARG for NULL or g >=
// num_groups; PKV_ERR_UNSUPPORTED without a cache.
pkv_status pkv_hybrid_cached_block(const pkv_hybrid *h, uint32_t g, const pkv_block_hash *hash,
                                   pkv_block_id *block);

// Events lost to a full buffer since create (0 for NULL or with events off).
uint64_t pkv_hybrid_events_dropped(const pkv_hybrid *h);

// vLLM's reset_prefix_cache: drop every cache entry of every group (token blocks
// and states) and emit one PKV_EVENT_ALL_BLOCKS_CLEARED (group 0: it covers every
// group) instead of a BlockRemoved per entry. Refused with PKV_ERR_BUSY (nothing
// changed) while a sequence or a queued copy holds a cached block or state (as
// vLLM refuses while blocks are in use): take the copies and free the sequences
// that share cached blocks first. Dropped entries count as prefix_evictions.
// PKV_ERR_UNSUPPORTED without a cache.
pkv_status pkv_hybrid_reset_prefix_cache(pkv_hybrid *h);

// A snapshot of one group's memory (plain data, caller-owned).
typedef struct pkv_hybrid_group_stats {
    pkv_layer_kind kind;
    uint32_t block_size;       // tokens per block (0: state group)
    uint64_t page_bytes;       // bytes one block (or state slot) occupies in memory:
                               // SHARED_PAGE: the shared page; PAGED: the group's
                               // part of the shared page (B x its bytes per token)
    uint64_t capacity_bytes;   // bytes of the pool the group draws from (shared
                               // pools: the whole pool, counted under every group)
    uint64_t used_bytes;       // blocks_held x page_bytes (state: slots in use)
    uint64_t free_bytes;       // free bytes of that pool (shared: the whole pool's;
                               // LCM: its free pages and the large pages it could take)
    uint64_t padding_bytes;    // of used_bytes, what no token can use: blocks_held x
                               // (page_bytes - block_size x bytes per token), i.e.
                               // SHARED_PAGE's rounding (0 in the other layouts)
    uint64_t blocks_held;      // distinct blocks (state: slots) held by the live
                               // sequences and queued copies of the group
    uint64_t blocks_released;  // blocks released by the window rule since create
    uint64_t tokens_held;      // sum over live sequences of tokens in live blocks
    uint64_t tokens_visible;   // tokens the last token of some live sequence sees
                               // (the window rule at its length - 1; every token for
                               // FULL/MLA), a block shared by several sequences
                               // (fork, prefix hit) counted once: per distinct block,
                               // the most any holder sees in it
    // Prefix cache (0 without one; a PAGED alias shows the one table's cache):
    uint64_t cached_blocks;    // blocks (state group: states) the cache holds now
    uint64_t cached_evictable; // of those, held by the cache alone (reclaimable)
    uint64_t prefix_hit_blocks; // since create: blocks shared by create_cached
    uint64_t prefix_hit_tokens; // since create: tokens in those blocks (state group:
                               // the hit length of each cached state used)
    uint64_t prefix_inserts;   // since create: blocks added to the cache
    uint64_t prefix_evictions; // since create: blocks evicted from it
} pkv_hybrid_group_stats;

// Fill *stats for group g. O(capacity + blocks held) (it counts distinct blocks).
pkv_status pkv_hybrid_group_stats_get(const pkv_hybrid *h, uint32_t g,
                                      pkv_hybrid_group_stats *stats);

// Full check: every pool and set (pkv_seqset_validate), every pool's refcounts
// equal to the references of the sets, copies and prefix caches that use it (no
// block lost or leaked), each cache's table, eviction order and chains, every live sequence of the same length in every group with holes only
// where the window rule allows, every state slot held once (plus pins).
// PKV_OK, PKV_ERR_CORRUPT or PKV_ERR_OUT_OF_MEMORY.
pkv_status pkv_hybrid_validate(const pkv_hybrid *h);

// ---- swap: moving sequences to another manager (0.3.0) ----
//
// An engine that preempts a sequence can move it to a second manager of the same
// groups (a host "swap" manager; layouts may differ, e.g. LCM on the device and
// PARTITION on the host) instead of recomputing it, and move it back later. Per
// group the move is pkv_seq_move_group: each token group moves only the live
// blocks of its tables (holes stay holes: a SLIDING group moves its window's
// blocks, not the whole context) and a block shared by k of the moved sequences
// becomes one block in `to` shared by the same k; each state group moves the
// sequence's state slot. The new sequences have the same lengths, tables (block
// ids aside) and holes. The caller copies the data of each pair {src, dst} (src in
// from's pool of the group, dst in to's; pkv_cache_transfer on the group's caches)
// before from's pools are written again.
// - Queued copies: a copy-on-write copy or a state copy of `from` whose dst a moved
//   sequence holds has not written its data yet: the move refuses with
//   PKV_ERR_BUSY (nothing changed); take and run from's copies first
//   (pkv_hybrid_take_copies). A queued copy that only reads a moved block or slot
//   keeps its pin in `from` and may run later.
// - Prefix cache: blocks from's cache also holds stay cached in `from` (the move
//   drops only the sequences' references); to's cache is not fed (call
//   pkv_hybrid_cache_prefix in `to` if wanted). To make room, `to` evicts its
//   cache-only blocks and states as an append does (a refused move may leave some
//   evicted).
// - LCM: `to` takes large pages for its groups as an append does, before anything
//   changes, so the move is all or nothing there too.
// - PAGED: one table serves every token group, so a PAGED manager moves only to
//   and from another PAGED one; its pairs, under the first token group, move
//   whole pages (every token group's part).
// Thread-safety: a move changes both managers; neither may be in use by another
// thread during it (the probe and the check only read them).

// PKV_OK when sequences of `from` can move to `to`: the same number of groups, each
// of the same kind and shape (pkv_kv_group equal) and block size, the same
// elem_bytes, both PAGED or neither, and two different managers. Else
// PKV_ERR_INVALID_ARG and reason (optional, caller-owned, cap bytes) receives a
// NUL-terminated sentence naming the first mismatch ("" when compatible).
pkv_status pkv_hybrid_move_check(const pkv_hybrid *from, const pkv_hybrid *to, char *reason,
                                 size_t cap);

// What moving a set of sequences would take (plain data, caller-owned).
typedef struct pkv_hybrid_move_size {
    uint32_t blocks[PKV_MAX_KV_GROUPS]; // token group: distinct live blocks moved, i.e.
                                        // blocks to's group g takes (a PAGED alias
                                        // repeats the one table's figure); state
                                        // group: slots (one per sequence)
    uint64_t bytes[PKV_MAX_KV_GROUPS];  // bytes group g's data occupies in those:
                                        // blocks x B_g x bytes_per_token_g; state
                                        // group: slots x its state (every layer)
    uint64_t total_bytes;               // sum of bytes[]: what the transfer copies
    uint32_t num_pairs;                 // pairs pkv_hybrid_move writes (its cap)
} pkv_hybrid_move_size;

// Side-effect-free probe of pkv_hybrid_move(from, ids[0..n-1], to) (ids borrowed):
// *size as above, whatever to's free space; `to` may be NULL (the figures do not
// depend on it: a manager of the same groups is assumed). Same checks as the move
// (PKV_ERR_INVALID_ARG for a mismatch or a duplicate id, PKV_ERR_NOT_FOUND for a
// stale one).
pkv_status pkv_hybrid_move_size_get(const pkv_hybrid *from, const pkv_seq_id *ids, uint32_t n,
                                    const pkv_hybrid *to, pkv_hybrid_move_size *size);

// Move sequences ids[0..n-1] (borrowed) of `from` to `to` (the rules above).
// new_ids[i] (caller-owned, n entries) receives ids[i]'s id in `to`; ids[i] is no
// longer live in `from`. pairs (caller-owned, cap entries): group g's pairs are
// pairs[offsets[g] .. offsets[g + 1] - 1] (offsets: caller-owned, num_groups + 1
// entries): a token group's {src block, dst block} per distinct block moved, in
// increasing src order; a state group's {src slot, dst slot} per sequence, in ids
// order; none for a PAGED alias. *npairs = offsets[num_groups], the total.
// All or nothing over every group and both managers: PKV_ERR_BUFFER_TOO_SMALL
// (cap < *npairs; offsets and *npairs filled), PKV_ERR_NOT_FOUND (a stale id),
// PKV_ERR_INVALID_ARG (a duplicate id, a mismatch as pkv_hybrid_move_check),
// PKV_ERR_BUSY (a queued copy writes a moved block or slot), PKV_ERR_OUT_OF_BLOCKS
// (to's pools or state slots too few, counting what its layout and cache can
// free), PKV_ERR_OUT_OF_MEMORY / PKV_ERR_LIMIT (host metadata, ids) change neither
// manager (but for entries to's cache evicted to make room).
pkv_status pkv_hybrid_move(pkv_hybrid *from, const pkv_seq_id *ids, uint32_t n, pkv_hybrid *to,
                           pkv_seq_id *new_ids, pkv_block_copy *pairs, uint32_t cap,
                           uint32_t *offsets, uint32_t *npairs);

#ifdef __cplusplus
}
#endif

#endif // PKV_HYBRID_H

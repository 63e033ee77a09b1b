// SPDX-License-Identifier: MIT
// Sequences and their block tables. A pkv_seqset holds many sequences that draw
// blocks from one pool. Each sequence has a length in tokens and a block table
// (logical block i -> physical block id). Appending tokens takes a new block only
// when the last one is full. Forking shares every block (refcount + 1); appending
// into a shared, partly filled last block copies it first (copy-on-write): a fresh
// block is taken, the pair (src, dst) is queued, and the sequence is remapped.
// Full shared blocks are never copied. Queued copies are taken by the caller in one
// batch (pkv_seqset_take_copies) so that an engine can run them as one kernel, or
// executed through a cache (pkv_cache_apply_copies in cache.h).
//
// Slots: the token at position p of a sequence lives in slot
//   table[p / block_size] * block_size + p % block_size,
// the vLLM "slot mapping" that cache-write kernels consume.
//
// An engine step is one call: pkv_seqset_blocks_needed_batch to decide, then
// pkv_seqset_append_batch (all or nothing across the batch) which returns the
// slot mapping of the whole batch, then pkv_seqset_take_copies for its
// copy-on-write list; finished sequences go with pkv_seqset_free_batch.
//
// Thread-safety: not synchronized. A seqset and its pool are used by one thread
// at a time.
#ifndef PKV_SEQ_H
#define PKV_SEQ_H

#include <stddef.h>
#include <stdint.h>

#include "pkv/pool.h"
#include "pkv/status.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct pkv_seqset pkv_seqset;

// Sequence ids are int32 >= 0 and carry a generation: the low 20 bits name a
// slot (at most 2^20 live sequences per set), the 11 bits above count how often
// that slot was freed. An id used after pkv_seq_free gives PKV_ERR_NOT_FOUND from
// every call, even once its slot serves a new sequence (freed slots are reused
// oldest first; an id could only alias after its slot was reused 2048 times).
typedef int32_t pkv_seq_id;

// A block table entry whose block was released because no future query can see its
// tokens (pkv_seq_release_before): a hole. Holes are always a prefix of the table.
#define PKV_BLOCK_NONE ((pkv_block_id)-1)

// A queued block copy for copy-on-write: copy every layer of block src into dst.
typedef struct pkv_block_copy {
    pkv_block_id src;
    pkv_block_id dst;
} pkv_block_copy;

// Create a set of sequences over `pool` (borrowed: it must outlive the set) with
// `block_size` tokens per block (1..65536). *out is owned by the caller.
pkv_status pkv_seqset_create(pkv_pool *pool, uint32_t block_size, pkv_seqset **out);

// Destroy the set, releasing every block its sequences and queued copies still
// hold. NULL does nothing.
void pkv_seqset_destroy(pkv_seqset *set);

uint32_t pkv_seqset_block_size(const pkv_seqset *set);
pkv_pool *pkv_seqset_pool(const pkv_seqset *set);  // borrowed
uint32_t pkv_seqset_live_count(const pkv_seqset *set); // live sequences

// Create an empty sequence (length 0, no blocks). *id receives its id.
// PKV_ERR_LIMIT when 2^20 sequences are live.
pkv_status pkv_seq_create(pkv_seqset *set, pkv_seq_id *id);

// Free a sequence: release its blocks and retire its id.
pkv_status pkv_seq_free(pkv_seqset *set, pkv_seq_id id);

// Number of blocks that appending n tokens to `id` would take from the pool,
// copy-on-write included. Lets a scheduler check before it commits. For several
// sequences use pkv_seqset_blocks_needed_batch: summing this over forked siblings
// over-counts (the last sharer of a block appends in place).
pkv_status pkv_seq_blocks_needed(const pkv_seqset *set, pkv_seq_id id, uint32_t n,
                                 uint32_t *blocks);

// Append n tokens. Takes new blocks only when the last block fills, and copies a
// shared, partly filled last block first. All or nothing: PKV_ERR_OUT_OF_BLOCKS
// (the pool is short, or would drop below the watermark) or PKV_ERR_OUT_OF_MEMORY
// leaves the sequence and pool unchanged.
// slots: optional caller-owned array of n entries that receives the slot of each
// new token (see the top of this file); NULL if not wanted.
pkv_status pkv_seq_append(pkv_seqset *set, pkv_seq_id id, uint32_t n, int64_t *slots);

// Fork: create a new sequence that shares every block of `parent` (refcount + 1)
// and has the same length. Takes no blocks from the pool. PKV_ERR_LIMIT if a
// block's refcount is at INT32_MAX (nothing changed).
pkv_status pkv_seq_fork(pkv_seqset *set, pkv_seq_id parent, pkv_seq_id *child);

// ---- batch calls: one call per engine step ----

// Blocks the whole batch would take from the pool if appended now: appending
// counts[i] tokens to seqs[i] for every i, in order, copy-on-write included, with a
// block shared by several sequences of the batch counted once (forked siblings: the
// last sharer writes in place, so n sharers cost n-1 copies). Equals the pool's
// free-count drop that pkv_seqset_append_batch would cause. seqs/counts: borrowed,
// num_seqs entries. A seq id may appear at most once (else PKV_ERR_INVALID_ARG);
// an id that is not live gives PKV_ERR_NOT_FOUND. O(num_seqs); the set keeps a
// scratch array of num_seqs entries, grown on first use (PKV_ERR_OUT_OF_MEMORY if
// that fails).
pkv_status pkv_seqset_blocks_needed_batch(const pkv_seqset *set, const pkv_seq_id *seqs,
                                          const uint32_t *counts, uint32_t num_seqs,
                                          uint32_t *blocks);

// Append counts[i] tokens to seqs[i] for every i: all or nothing across the whole
// batch (on any error no sequence and no pool block changed; PKV_ERR_OUT_OF_BLOCKS
// when the batch needs more blocks than the pool has above the watermark).
// slots: optional, caller-owned, sum(counts) entries: the slot mapping of the
// batch in order (seqs[0]'s new tokens first), as pkv_seq_append writes it.
// Copy-on-write copies are queued as for pkv_seq_append; take them with
// pkv_seqset_take_copies. The result is exactly that of pkv_seq_append called on
// each sequence in order (same tables, slots and copies).
pkv_status pkv_seqset_append_batch(pkv_seqset *set, const pkv_seq_id *seqs,
                                   const uint32_t *counts, uint32_t num_seqs, int64_t *slots);

// Free seqs[0..num_seqs-1]. Every id is checked first: a stale or unknown id gives
// PKV_ERR_NOT_FOUND and frees nothing. Duplicates: PKV_ERR_INVALID_ARG.
pkv_status pkv_seqset_free_batch(pkv_seqset *set, const pkv_seq_id *seqs, uint32_t num_seqs);

// Refuse growth that would leave fewer than `blocks` free blocks in the pool:
// pkv_seq_append, pkv_seqset_append_batch and pkv_seq_move / pkv_seq_move_group
// into this set then return PKV_ERR_OUT_OF_BLOCKS and change nothing. Growth of 0
// blocks is never refused; fork, fork_at and truncate take no blocks. 0 (the
// default) disables it. vLLM's watermark: room for running sequences to grow.
pkv_status pkv_seqset_set_watermark(pkv_seqset *set, uint32_t blocks);
uint32_t pkv_seqset_watermark(const pkv_seqset *set); // 0 for NULL

// ---- rollback and positional forks ----

// Create *child sharing the first `len` tokens of parent (len <= parent length,
// else PKV_ERR_INVALID_ARG). Full blocks are shared; a partial last block is
// shared too, and copy-on-write applies when either side appends into it (the
// copy carries the parent's later tokens of that block along; the child's
// appends overwrite them). Takes no blocks. pkv_seq_fork is fork_at(parent length).
// Released blocks (holes) are shared as holes; PKV_ERR_RELEASED if the child's
// last block would be a hole that is not full (see pkv_seq_release_before).
pkv_status pkv_seq_fork_at(pkv_seqset *set, pkv_seq_id parent, uint32_t len, pkv_seq_id *child);

// Drop every token at position >= len (len <= length, else PKV_ERR_INVALID_ARG):
// blocks past it are released (returned to the pool unless shared, e.g. with a
// fork or the prefix cache). A kept, partly filled last block that is shared is
// copied on the next append into it, so shared or cached K/V is never
// overwritten. Speculative-decoding rollback, llama.cpp's seq_rm of a suffix.
// PKV_ERR_RELEASED (nothing changed) when the kept last block would be a released
// block that is not full: those tokens are gone (see pkv_seq_release_before).
pkv_status pkv_seq_truncate(pkv_seqset *set, pkv_seq_id id, uint32_t len);

// ---- window release (0.3.0): sliding-window and chunked-local layers ----

// Release every block of `id` whose tokens all lie before first_live_token
// (entry j with (j + 1) * block_size <= first_live_token): the table entry becomes
// PKV_BLOCK_NONE (a hole) and the block returns to the pool unless it is still
// shared (a fork, the prefix cache, a queued copy's pin). The length and the slots
// of later tokens do not change. Entries already released stay holes, so the call
// is idempotent and the holes stay a prefix of the table; the partly filled last
// block is never released. first_live_token <= length, else PKV_ERR_INVALID_ARG.
// *released (optional) receives the number of blocks released by this call.
// With holes: fork and fork_at copy them as holes; fork_at / truncate to a length
// len whose last kept block would be a hole that is not full (len % block_size !=
// 0 and ceil(len / block_size) <= holes) give PKV_ERR_RELEASED; moves keep them as holes and move only live
// blocks; pkv_seqset_export_padded writes -1 for them; pkv_seqset_export_csr
// refuses a sequence with holes (PKV_ERR_UNSUPPORTED): use
// pkv_seqset_export_csr_live; the prefix cache's insert stops at a hole it had not
// cached before.
pkv_status pkv_seq_release_before(pkv_seqset *set, pkv_seq_id id, uint32_t first_live_token,
                                  uint32_t *released);

// Number of leading holes (released blocks) of `id`'s table.
pkv_status pkv_seq_released_blocks(const pkv_seqset *set, pkv_seq_id id, uint32_t *holes);

// Length in tokens of a sequence (0 for an empty one).
pkv_status pkv_seq_length(const pkv_seqset *set, pkv_seq_id id, uint32_t *len);

// The sequence's block table. *table points into the set (borrowed; valid until
// the next call that changes this sequence); *num_blocks = ceil(len / block_size).
pkv_status pkv_seq_block_table(const pkv_seqset *set, pkv_seq_id id,
                               const pkv_block_id **table, uint32_t *num_blocks);

// Number of queued copy-on-write copies.
uint32_t pkv_seqset_pending_copies(const pkv_seqset *set);

// The queued copies, in the order they were queued: *copies points into the set
// (borrowed, valid until the next call that changes the set), *n entries.
// A queued copy pins both its blocks (one pool reference each) until
// pkv_seqset_copies_done, so neither can be freed and handed out again before the
// copy has run: within one queue no dst appears twice and no dst is another
// copy's src, so the copies may run in parallel. The pins do not count as sharers:
// the last sequence sharing a block still appends into it in place.
// Contract (as in vLLM): execute the queued copies before any K/V is written for
// the tokens appended since they were queued, write K/V only for sequences still
// live, and fork only sequences whose K/V is written.
pkv_status pkv_seqset_copies(const pkv_seqset *set, const pkv_block_copy **copies, uint32_t *n);

// The caller has executed every queued copy: empty the queue and drop the pins
// (a block whose last holder was its pin returns to the pool). With an
// asynchronous copy (a CUDA stream) "executed" means enqueued on the stream that
// every later K/V write of this pool goes through: stream order then keeps a
// reused block from being written before its copy has read it.
pkv_status pkv_seqset_copies_done(pkv_seqset *set);

// pkv_seqset_copies + pkv_seqset_copies_done in one call: copy the queue into
// copies[0..*n-1] (caller-owned, `cap` entries) and empty it. Since the pins are
// gone when this returns, execute the copies before the next call that allocates
// from the pool. PKV_ERR_BUFFER_TOO_SMALL if cap is too small: *n receives the
// number of entries needed and nothing is taken.
pkv_status pkv_seqset_take_copies(pkv_seqset *set, pkv_block_copy *copies, uint32_t cap,
                                  uint32_t *n);

// Move sequence `id` of `from` into a new sequence *new_id of `to` (swap out to a
// host pool, or back in): takes ceil(len / block_size) fresh blocks from `to`'s
// pool (all or nothing: PKV_ERR_OUT_OF_BLOCKS, also below `to`'s watermark,
// changes nothing), frees the sequence in `from` (its blocks return to the pool
// unless shared), and writes one pair {src = block in `from`, dst = block in
// `to`} per table entry, in increasing src order, into pairs[0..*n-1]
// (caller-owned, `cap` entries; PKV_ERR_BUFFER_TOO_SMALL changes nothing and sets
// *n to the number needed).
// Forked sequences lose their sharing this way: move them together with
// pkv_seq_move_group.
// The caller moves the data with pkv_cache_transfer before anything is written
// into `from`'s pool again, and executes `from`'s queued copies before the move
// (the moved sequence's last block may be a copy's dst still waiting for its data).
// Both sets must have the same block size and different pools.
pkv_status pkv_seq_move(pkv_seqset *from, pkv_seq_id id, pkv_seqset *to, pkv_seq_id *new_id,
                        pkv_block_copy *pairs, uint32_t cap, uint32_t *n);

// Move seqs ids[0..n-1] of `from` to `to` keeping the sharing between them: a block
// shared by k of them becomes one block in `to` shared by the same k (four samples
// on 6 distinct blocks take 6 blocks in `to`, not 12). new_ids[i] (caller-owned, n
// entries) receives the id in `to` of ids[i]. pairs: one {src, dst} per distinct
// block moved, in increasing src order (caller-owned, cap entries); *npairs
// receives their number, also on PKV_ERR_BUFFER_TOO_SMALL, when nothing changes.
// All or nothing: a stale id (PKV_ERR_NOT_FOUND), a duplicate
// (PKV_ERR_INVALID_ARG), too few blocks in `to` (PKV_ERR_OUT_OF_BLOCKS) change
// nothing. The same rules as pkv_seq_move otherwise (run `from`'s queued copies
// first, then pkv_cache_transfer the pairs before `from`'s pool is written again;
// different pools, same block size). References that are not the group's own (a
// prefix cache's, another sequence's) stay in `from`.
pkv_status pkv_seq_move_group(pkv_seqset *from, const pkv_seq_id *ids, uint32_t n,
                              pkv_seqset *to, pkv_seq_id *new_ids,
                              pkv_block_copy *pairs, uint32_t cap, uint32_t *npairs);

// Sizes of the exports below for seqs[0..num_seqs-1] (borrowed): *max_blocks the
// longest block table (the max_blocks that pkv_seqset_export_padded needs),
// *total_blocks the sum (the indices_cap that pkv_seqset_export_csr needs).
// Either output may be NULL.
pkv_status pkv_seqset_export_size(const pkv_seqset *set, const pkv_seq_id *seqs,
                                  uint32_t num_seqs, uint32_t *max_blocks,
                                  uint64_t *total_blocks);

// Export block tables of seqs[0..num_seqs-1] as a padded int32 matrix (vLLM style):
// table[i * max_blocks + j] = block j of seqs[i], unused entries = pad_value.
// table: caller-owned, num_seqs * max_blocks entries. lens: optional caller-owned
// array of num_seqs lengths (int32, the context_lens of attention kernels).
// PKV_ERR_BUFFER_TOO_SMALL if some sequence has more than max_blocks blocks
// (pkv_seqset_export_size gives the max_blocks needed).
pkv_status pkv_seqset_export_padded(const pkv_seqset *set, const pkv_seq_id *seqs,
                                    uint32_t num_seqs, uint32_t max_blocks,
                                    int32_t pad_value, int32_t *table, int32_t *lens);

// Export the CSR form (FlashInfer style) of seqs[0..num_seqs-1]:
// indptr[num_seqs + 1], indices[indptr[num_seqs]] = the blocks, and
// last_page_len[num_seqs] = tokens in each sequence's last block (0 for an empty
// sequence, else 1..block_size). All three arrays are caller-owned; indices has
// `indices_cap` entries, PKV_ERR_BUFFER_TOO_SMALL (and nothing written) if short
// (pkv_seqset_export_size gives the total needed).
pkv_status pkv_seqset_export_csr(const pkv_seqset *set, const pkv_seq_id *seqs,
                                 uint32_t num_seqs, int32_t *indptr, int32_t *indices,
                                 uint32_t indices_cap, int32_t *last_page_len);

// The CSR form of live blocks only: as pkv_seqset_export_csr, but indices hold
// each sequence's live blocks, logical blocks first_block[i] .. ceil(len / block_size)
// - 1 of seqs[i] (first_block: caller-owned, num_seqs entries, the number of
// released blocks before them). indptr[i + 1] - indptr[i] + first_block[i] is the
// full table length; last_page_len as pkv_seqset_export_csr. An attention kernel
// maps a token position t to indices[indptr[i] + t / block_size - first_block[i]].
pkv_status pkv_seqset_export_csr_live(const pkv_seqset *set, const pkv_seq_id *seqs,
                                      uint32_t num_seqs, int32_t *indptr, int32_t *indices,
                                      uint32_t indices_cap, int32_t *last_page_len,
                                      int32_t *first_block);

// Full check of this set against its pool, O(capacity + blocks held): the pool is
// valid (pkv_pool_validate); every sequence's table has ceil(len / block_size)
// entries, holes only as a prefix of full blocks; every block referenced by a sequence or pinned by a queued copy has a
// refcount at least the number of those references. With `exclusive` != 0 (this set is the
// pool's only user) refcounts must equal those references exactly, so a lost or
// leaked block is caught. Returns PKV_OK, PKV_ERR_CORRUPT, or PKV_ERR_OUT_OF_MEMORY
// if the scratch counts cannot be allocated.
pkv_status pkv_seqset_validate(const pkv_seqset *set, int exclusive);

#ifdef __cplusplus
}
#endif

#endif // PKV_SEQ_H

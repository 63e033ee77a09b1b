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

// Sequence ids are small dense integers, reused after pkv_seq_free.
typedef int32_t pkv_seq_id;

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
pkv_status pkv_seq_create(pkv_seqset *set, pkv_seq_id *id);

// Free a sequence: release its blocks and retire its id.
pkv_status pkv_seq_free(pkv_seqset *set, pkv_seq_id id);

// Number of blocks that appending n tokens to `id` would take from the pool,
// copy-on-write included. Lets a scheduler check before it commits.
pkv_status pkv_seq_blocks_needed(const pkv_seqset *set, pkv_seq_id id, uint32_t n,
                                 uint32_t *blocks);

// Append n tokens. Takes new blocks only when the last block fills, and copies a
// shared, partly filled last block first. All or nothing: PKV_ERR_OUT_OF_BLOCKS
// (or PKV_ERR_OUT_OF_MEMORY) leaves the sequence and pool unchanged.
// slots: optional caller-owned array of n entries that receives the slot of each
// new token (see the top of this file); NULL if not wanted.
pkv_status pkv_seq_append(pkv_seqset *set, pkv_seq_id id, uint32_t n, int64_t *slots);

// Fork: create a new sequence that shares every block of `parent` (refcount + 1)
// and has the same length. Takes no blocks from the pool.
pkv_status pkv_seq_fork(pkv_seqset *set, pkv_seq_id parent, pkv_seq_id *child);

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
// (a block whose last holder was its pin returns to the pool).
pkv_status pkv_seqset_copies_done(pkv_seqset *set);

// pkv_seqset_copies + pkv_seqset_copies_done in one call: copy the queue into
// copies[0..*n-1] (caller-owned, `cap` entries) and empty it. Since the pins are
// gone when this returns, execute the copies before the next call that allocates
// from the pool. PKV_ERR_BUFFER_TOO_SMALL if cap is too small, and then nothing
// is taken.
pkv_status pkv_seqset_take_copies(pkv_seqset *set, pkv_block_copy *copies, uint32_t cap,
                                  uint32_t *n);

// Move sequence `id` of `from` into a new sequence *new_id of `to` (swap out to a
// host pool, or back in): takes ceil(len / block_size) fresh blocks from `to`'s
// pool (all or nothing: PKV_ERR_OUT_OF_BLOCKS changes nothing), frees the sequence
// in `from` (its blocks return to the pool unless shared), and writes one pair
// {src = block in `from`, dst = block in `to`} per table entry into pairs[0..*n-1]
// (caller-owned, `cap` entries; PKV_ERR_BUFFER_TOO_SMALL changes nothing).
// The caller moves the data with pkv_cache_transfer before anything is written
// into `from`'s pool again, and executes `from`'s queued copies before the move
// (the moved sequence's last block may be a copy's dst still waiting for its data).
// Both sets must have the same block size and different pools.
pkv_status pkv_seq_move(pkv_seqset *from, pkv_seq_id id, pkv_seqset *to, pkv_seq_id *new_id,
                        pkv_block_copy *pairs, uint32_t cap, uint32_t *n);

// Export block tables of seqs[0..num_seqs-1] as a padded int32 matrix (vLLM style):
// table[i * max_blocks + j] = block j of seqs[i], unused entries = pad_value.
// table: caller-owned, num_seqs * max_blocks entries. lens: optional caller-owned
// array of num_seqs lengths (int32, the context_lens of attention kernels).
// PKV_ERR_BUFFER_TOO_SMALL if some sequence has more than max_blocks blocks.
pkv_status pkv_seqset_export_padded(const pkv_seqset *set, const pkv_seq_id *seqs,
                                    uint32_t num_seqs, uint32_t max_blocks,
                                    int32_t pad_value, int32_t *table, int32_t *lens);

// Export the CSR form (FlashInfer style) of seqs[0..num_seqs-1]:
// indptr[num_seqs + 1], indices[indptr[num_seqs]] = the blocks, and
// last_page_len[num_seqs] = tokens in each sequence's last block (0 for an empty
// sequence, else 1..block_size). All three arrays are caller-owned; indices has
// `indices_cap` entries, PKV_ERR_BUFFER_TOO_SMALL (and nothing written) if short.
pkv_status pkv_seqset_export_csr(const pkv_seqset *set, const pkv_seq_id *seqs,
                                 uint32_t num_seqs, int32_t *indptr, int32_t *indices,
                                 uint32_t indices_cap, int32_t *last_page_len);

// Full check of this set against its pool, O(capacity + blocks held): the pool is
// valid (pkv_pool_validate); every sequence's table has ceil(len / block_size)
// entries; every block referenced by a sequence or pinned by a queued copy has a
// refcount at least the number of those references. With `exclusive` != 0 (this set is the
// pool's only user) refcounts must equal those references exactly, so a lost or
// leaked block is caught. Returns PKV_OK, PKV_ERR_CORRUPT, or PKV_ERR_OUT_OF_MEMORY
// if the scratch counts cannot be allocated.
pkv_status pkv_seqset_validate(const pkv_seqset *set, int exclusive);

#ifdef __cplusplus
}
#endif

#endif // PKV_SEQ_H

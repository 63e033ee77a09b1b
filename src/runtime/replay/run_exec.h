// SPDX-License-Identifier: MIT
// Internal: the run-mode executor's state (run.c), shared with its swap copies
// (run_swap.c). Not installed.
#ifndef PKV_RUNTIME_REPLAY_RUN_EXEC_H
#define PKV_RUNTIME_REPLAY_RUN_EXEC_H

#include "pkv/backend.h"
#include "pkv/cache.h"
#include "pkv/model.h"
#include "pkv/vmm.h"
#include "replay_internal.h"
#include "run_hybrid_vmm.h"

// Live real allocations of one size (a free call frees any of them).
typedef struct bucket {
    uint64_t bytes;
    void **ptr;
    size_t n, cap;
} bucket;

enum { COPY_CHUNK = 4u << 20 }; // bytes per executed copy (scratch holds two)

typedef struct run_exec {
    pkvi_executor base;
    pkvi_policy *pol;   // borrowed
    pkv_seqset *set;    // the policy's, or `own`
    pkv_seqset *own;    // per-token table (block size 1), NULL for table policies
    pkv_pool *own_pool;
    pkv_contig_kv *store; // extent policies: their rows in one arena (else NULL)
    void *store_mem;      // the store's K and V halves: one backend allocation
    uint64_t store_bytes;
    uint32_t *free_rows;  // [max_rows] store rows not in use (a stack)
    uint32_t nfree;
    uint8_t *fork_pending; // [sum of n]: (r, child) must copy child 0's K/V first
    pkv_model_hybrid_store *hstore; // hybrid policies: the store over their manager
    pkvi_run_hvmm *hvmm;  // hybrid-vmm (CPU): a real pkv_hybrid_vmm (run_hybrid_vmm.h)
    pkv_vmm_space *vmm;   // vmm policy: each sequence a slot of a VMM space, store
                          // rows = slots (vAttention's layout); else NULL
    uint64_t vmm_tb;      // K/V bytes of one token in one layer buffer (K or V)
    uint32_t *dead;       // [dead_cap] slots the policy released: unmapped next step
    uint32_t ndead, dead_cap;
    double vmm_step_s;    // map and unmap seconds spent inside steps
    uint64_t *mbase;    // [num_requests]: first entry of request r in mseq
    pkv_seq_id *mseq;   // [sum of n]: mirror sequence (table) or store row (extent
                        // policies) of (r, child), -1 if none
    uint64_t *hbase;    // [num_requests]: first entry of request r in hashed
    uint32_t *hashed;   // [sum of n]: highest position of (r, child) already hashed
    pkv_model *model;
    int model_borrowed; // params.run_model: not ours to destroy
    pkv_backend *backend;
    pkv_cache *cache;
    void *scratch;      // [2][COPY_CHUNK] for executed copies
    uint64_t copied;    // K/V bytes copied (report.run.copied_bytes)
    pkv_hybrid *hyb;    // hybrid policies: the manager the store lays out (borrowed)
    // --preempt swap (run_swap.c): each swapped-out request's K/V in host memory.
    struct run_saved *saved; // [num_requests], NULL until the first swap
    double swap_s;      // seconds of swap-outs since the last step (charged to it)
    uint64_t swapped;   // K/V bytes copied out to the host and back in
    pkv_status err;     // a hook's failure, returned by the next step
    uint32_t layers;    // cache layers (paged, token table)
    uint64_t half_block; // cache: bytes of a block's K (or V) in one layer
    uint64_t row_bytes; // store: K/V bytes of one token, every layer
    uint64_t block_bytes; // paged: K/V bytes of one block, every layer (from the cache)
    bucket *buckets;
    size_t nbuckets, bucket_cap;
    int cuda;
    uint32_t vocab;
    uint64_t seed;
    uint64_t token_hash, tokens;
    pkv_seq_id *ids;    // [cap]
    uint32_t *counts;   // [cap]
    int32_t *next;      // [cap]
    const pkvi_step_seq **order; // [cap]: the batch entry of each model row
    int32_t *tokens_in; // [tok_cap]
    uint32_t *rows;     // [cap]: store rows of the model call (extent policies)
    uint8_t *pending;   // [cap]: batch entry's row is not at its extent yet
    uint32_t cap;
    uint64_t tok_cap;
} run_exec;

static inline pkv_seq_id *pkvi_run_mirror(run_exec *x, uint32_t r, uint32_t child) {
    return &x->mseq[x->mbase[r] + child];
}

// run.c: run the copies the policy has taken and not yet run (paged: its
// copy-on-write blocks; hybrid: its manager's), so that memory holds what the
// tables say (a swap-out reads it).
pkv_status pkvi_run_flush_copies(run_exec *x);
// ---- run_swap.c: --preempt swap moves the K/V for real ----
// The executor hooks (pkvi_executor.on_swap_out / on_swap_drop / on_swap_in).
void pkvi_run_on_swap_out(pkvi_executor *e, uint32_t r, uint32_t nseq, uint32_t len);
void pkvi_run_on_swap_drop(pkvi_executor *e, uint32_t r);
void pkvi_run_on_swap_in(pkvi_executor *e, uint32_t r);
// The tokens (r, child) holds when it was swapped in and its K/V is not back
// yet (0: nothing to restore). The layout gives it a place for them (a table of
// that many tokens, a row at its extent with its pages mapped) and then calls
// pkvi_run_swap_restore, in the step that first runs it, before its tokens.
uint32_t pkvi_run_swap_pending(const run_exec *x, uint32_t r, uint32_t child);
// Write (r, child)'s saved K/V into `where`: a sequence of x->set, a store row,
// or the hybrid manager's sequence.
pkv_status pkvi_run_swap_restore(run_exec *x, uint32_t r, uint32_t child, pkv_seq_id where);
// Request r is released while swapped in and not yet run: its copy goes.
void pkvi_run_swap_release(run_exec *x, uint32_t r);
void pkvi_run_swap_free(run_exec *x); // every copy

#endif // PKV_RUNTIME_REPLAY_RUN_EXEC_H

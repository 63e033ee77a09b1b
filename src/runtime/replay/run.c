// SPDX-License-Identifier: MIT
// The run-mode step executor: executes each scheduled step with the decoder
// (include/pkv/model.h) on a host or CUDA backend and measures its wall time,
// for every policy, each with the layout it stands for:
// - a policy that keeps block tables (pkv_policy_vtable.seqset: `paged`) is run
//   over its own pool and tables, bound to memory by one pkv_cache;
// - a policy that reports its extents (pkv_policy_vtable.extent_of: every
//   contiguous-* policy, malloc-per-request, realloc-copy) is run over a
//   contiguous store (pkv_contig_kv arena of the policy's capacity, one backend
//   allocation) in which each sequence's K/V sits in exactly the extent the
//   policy placed it in, read by the contiguous decode kernel; a fork copies the
//   parent's K/V into each sample's extent and an extent that moves
//   (pow2-grow's regrowth, realloc-copy's every token) has its K/V copied to the
//   new one, for real, at the start of the next step (timed in it);
// - the vmm policy (vAttention) is run over a real VMM space (pkv/vmm.h: host
//   memfd pages, or the CUDA driver's cuMemMap): every sequence owns a slot, a
//   virtually contiguous max-length row in each layer's K and V buffer; physical
//   pages are mapped behind it as it grows (at the start of the step that needs
//   them, timed in it) and unmapped once the policy releases it (at the start of
//   the next step); the contiguous kernel reads the rows in place, token-major;
// - the hybrid policies with a manager of their own (hybrid-partition,
//   hybrid-shared-page, hybrid-lcm; CPU runs) are run over the model's hybrid
//   store (pkv/model.h): host memory laid out as the policy's pkv_hybrid
//   addresses its blocks (fp32 elements: the manager's byte map widened from the
//   trace's dtype, as paged's fp32 cache sits over a pool sized in it), so the
//   window rule frees blocks for real and other sequences reuse them; the copies
//   the policy takes from its manager are run on the store at the start of the
//   next step (timed in it);
// - hybrid-vmm (CPU runs) is run over a real pkv_hybrid_vmm (run_hybrid_vmm.c:
//   host memfd spaces, one per KV cache group, on the policy's budget and page
//   widened to fp32): a slot per sequence, the pages each step reads mapped and
//   those that left a window unmapped at its start (timed in it), forks copying
//   the parent's rows; the decoder reads the spaces' buffers in place;
// - every other policy (malloc-per-token, hybrid-vmm on CUDA, a hybrid policy on
//   CUDA, plugins with neither) is run over a
//   per-token table that the executor keeps (a pkv_seqset of block size 1 over
//   one arena of the policy's capacity): malloc-per-token's real layout. Forks
//   share the prompt in this table; the copies the policy reports are executed
//   as device copies of the same byte count, timed in the step.
// Swap (--preempt swap, run_swap.c): a request preempted by swap has its K/V
// copied from whichever layout above into host memory before its memory goes,
// and written back where the layout places it after the swap-in, before it runs
// again (both timed in the steps in which they happen): it continues from what
// it computed, so its tokens are recompute's.
// Backend calls: the calls a policy reports (malloc-per-request,
// malloc-per-token, realloc-copy) are made for real on the backend (host
// allocator; cudaMalloc/cudaFree), held while the policy holds them, timed, and
// charged to the step in which they happen. The arena (cache) is one call. For
// vmm the real calls are the space's page maps and unmaps (its modelled calls,
// with map-ahead and deferred reclamation, are sim mode's); so for hybrid-vmm.
// Token ids are synthetic (a hash of request, sequence and position), so every
// layout computes the same math; the greedy next token of every computed
// position goes into an order-independent hash (report.run.token_hash) that
// must be the same for every policy on the same trace, model and seed.
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "pkv/backend.h"
#include "pkv/cache.h"
#include "pkv/model.h"
#include "pkv/vmm.h"
#include "pkv_config.h"
#include "replay_internal.h"
#include "run_exec.h"
#include "src/allocator/clock.h"
#include "src/runtime/model/hybrid_store.h"
#include "src/runtime/model/model_internal.h"

#if PKV_HAVE_CUDA
#include <cuda_runtime_api.h>
#endif

static uint64_t mix(uint64_t h) {
    h ^= h >> 33;
    h *= 0xff51afd7ed558ccdull;
    h ^= h >> 33;
    h *= 0xc4ceb9fe1a85ec53ull;
    h ^= h >> 33;
    return h;
}

// Input token of (r, child) at pos: a sample's tokens past the prompt differ
// from its siblings'; the prompt is the same for all of them.
static int32_t token_at(const run_exec *x, uint32_t r, uint32_t child, uint32_t pos, uint32_t prompt) {
    const uint64_t c = pos < prompt ? 0 : child;
    return (int32_t)(mix(x->seed ^ ((uint64_t)r << 32) ^ (c << 24) ^ pos) % x->vocab);
}

static pkv_status reserve(run_exec *x, uint32_t n, uint64_t tokens) {
    if (n > x->cap) {
        uint32_t c = x->cap ? x->cap : 64;
        while (c < n) c *= 2;
        pkv_seq_id *a = realloc(x->ids, c * sizeof *a);
        if (!a) return PKV_ERR_OUT_OF_MEMORY;
        x->ids = a;
        uint32_t *b = realloc(x->counts, c * sizeof *b);
        if (!b) return PKV_ERR_OUT_OF_MEMORY;
        x->counts = b;
        int32_t *nx = realloc(x->next, c * sizeof *nx);
        if (!nx) return PKV_ERR_OUT_OF_MEMORY;
        x->next = nx;
        const pkvi_step_seq **o = realloc(x->order, c * sizeof *o);
        if (!o) return PKV_ERR_OUT_OF_MEMORY;
        x->order = o;
        uint32_t *rw = realloc(x->rows, c * sizeof *rw);
        if (!rw) return PKV_ERR_OUT_OF_MEMORY;
        x->rows = rw;
        uint8_t *pd = realloc(x->pending, c * sizeof *pd);
        if (!pd) return PKV_ERR_OUT_OF_MEMORY;
        x->pending = pd;
        x->cap = c;
    }
    if (tokens > x->tok_cap) {
        uint64_t c = x->tok_cap ? x->tok_cap : 4096;
        while (c < tokens) c *= 2;
        int32_t *t = realloc(x->tokens_in, (size_t)c * sizeof *t);
        if (!t) return PKV_ERR_OUT_OF_MEMORY;
        x->tokens_in = t;
        x->tok_cap = c;
    }
    return PKV_OK;
}

static pkv_status sync_device(const run_exec *x) {
#if PKV_HAVE_CUDA
    if (x->cuda && cudaDeviceSynchronize() != cudaSuccess) return PKV_ERR_BACKEND;
#else
    (void)x;
#endif
    return PKV_OK;
}

// ---- real backend calls ----

static bucket *bucket_of(run_exec *x, uint64_t bytes, int create) {
    for (size_t i = 0; i < x->nbuckets; i++)
        if (x->buckets[i].bytes == bytes) return &x->buckets[i];
    if (!create) return NULL;
    if (x->nbuckets == x->bucket_cap) {
        size_t c = x->bucket_cap ? x->bucket_cap * 2 : 16;
        bucket *b = realloc(x->buckets, c * sizeof *b);
        if (!b) return NULL;
        x->buckets = b;
        x->bucket_cap = c;
    }
    bucket *b = &x->buckets[x->nbuckets++];
    memset(b, 0, sizeof *b);
    b->bytes = bytes;
    return b;
}

// pkvi_policy.real_calls: allocate or free `count` blocks of `bytes` on the
// backend; the seconds they took. An allocation that fails is not retried: the
// budget already bounds what the policy holds, so a failure means the device
// has less than the budget (the measured time still counts).
static double real_calls(void *ctx, pkv_backend_call kind, uint64_t bytes, uint64_t count) {
    run_exec *x = ctx;
    const double t0 = pkvi_now_seconds();
    bucket *b = bucket_of(x, bytes, kind == PKV_BACKEND_CALL_ALLOC);
    if (b && kind == PKV_BACKEND_CALL_ALLOC) {
        if (b->n + count > b->cap) {
            size_t c = b->cap ? b->cap : 64;
            while (c < b->n + count) c *= 2;
            void **p = realloc(b->ptr, c * sizeof *p);
            if (p) {
                b->ptr = p;
                b->cap = c;
            }
        }
        for (uint64_t i = 0; i < count && b->n < b->cap; i++)
            if (pkv_backend_alloc(x->backend, (size_t)bytes, &b->ptr[b->n]) == PKV_OK) b->n++;
    } else if (b) {
        for (uint64_t i = 0; i < count && b->n > 0; i++)
            pkv_backend_free(x->backend, b->ptr[--b->n], (size_t)bytes);
    }
    if (x->cuda) sync_device(x); // cudaFree synchronizes; make the measure honest for both
    return pkvi_now_seconds() - t0;
}

static void free_all_calls(run_exec *x) {
    for (size_t i = 0; i < x->nbuckets; i++) {
        bucket *b = &x->buckets[i];
        while (b->n > 0) pkv_backend_free(x->backend, b->ptr[--b->n], (size_t)b->bytes);
        free(b->ptr);
    }
    free(x->buckets);
    x->buckets = NULL;
    x->nbuckets = x->bucket_cap = 0;
}

// ---- the per-token table (policies without their own) ----

static pkv_seq_id *mirror(run_exec *x, uint32_t r, uint32_t child) { return pkvi_run_mirror(x, r, child); }

static pkv_status run_on_fork(pkvi_executor *e, uint32_t r, uint32_t n) {
    run_exec *x = (run_exec *)e;
    // The samples share the prompt's outputs: they are hashed once, as child 0's.
    for (uint32_t c = 1; c < n; c++) x->hashed[x->hbase[r] + c] = x->hashed[x->hbase[r]];
    if (x->hvmm) return pkvi_run_hvmm_fork(x->hvmm, r, n);
    if (x->vmm) {
        // Each sample takes a slot now; its pages are mapped and the prompt
        // copied at the start of the next step, which times both.
        for (uint32_t c = 1; c < n; c++) {
            pkv_seq_id *m = mirror(x, r, c);
            uint32_t slot;
            pkv_status st = *m >= 0 ? PKV_ERR_CORRUPT : pkv_vmm_slot_acquire(x->vmm, &slot);
            if (st != PKV_OK) return st;
            *m = (pkv_seq_id)slot;
            x->fork_pending[x->mbase[r] + c] = 1;
        }
        return PKV_OK;
    }
    if (x->store) {
        // Each sample's row takes its extent now, as the policy forked into it;
        // the copy runs at the start of the next step, which times it.
        for (uint32_t c = 1; c < n; c++) {
            pkv_seq_id *m = mirror(x, r, c);
            uint64_t off, slots;
            x->pol->vt->extent_of(x->pol->state, r, c, &off, &slots);
            if (*m >= 0 || x->nfree == 0 || slots == 0 || slots > UINT32_MAX) return PKV_ERR_CORRUPT;
            const uint32_t row = x->free_rows[x->nfree - 1];
            pkv_status st = pkv_contig_kv_place(x->store, row, off, (uint32_t)slots);
            if (st != PKV_OK) return st;
            x->nfree--;
            *m = (pkv_seq_id)row;
            x->fork_pending[x->mbase[r] + c] = 1;
        }
        return PKV_OK;
    }
    if (!x->own) return PKV_OK;
    const pkv_seq_id parent = *mirror(x, r, 0);
    if (parent < 0) return PKV_ERR_CORRUPT;
    for (uint32_t c = 1; c < n; c++) {
        pkv_status st = pkv_seq_fork(x->own, parent, mirror(x, r, c));
        if (st != PKV_OK) return st;
    }
    return PKV_OK;
}

static void run_on_release(pkvi_executor *e, uint32_t r) {
    run_exec *x = (run_exec *)e;
    pkvi_run_swap_release(x, r);
    if (x->hvmm) pkvi_run_hvmm_release(x->hvmm, r);
    if (!x->own && !x->store) return;
    const uint32_t n = x->pol->cfg.max_seqs[r];
    for (uint32_t c = 0; c < n; c++) {
        pkv_seq_id *m = mirror(x, r, c);
        if (*m >= 0 && x->vmm) {
            // Unmapped at the start of the next step (timed there); dead slots
            // stay taken until then. dead has room for every slot.
            pkv_contig_kv_reset(x->store, (uint32_t)*m);
            x->dead[x->ndead++] = (uint32_t)*m;
        } else if (*m >= 0 && x->store) {
            // Its extent is free for other rows; the row id goes back on the stack.
            pkv_contig_kv_reset(x->store, (uint32_t)*m);
            pkv_contig_kv_place(x->store, (uint32_t)*m, 0, 0);
            x->free_rows[x->nfree++] = (uint32_t)*m;
        } else if (*m >= 0) {
            pkv_seq_free(x->own, *m);
        }
        *m = -1;
        if (x->fork_pending) x->fork_pending[x->mbase[r] + c] = 0;
    }
}

// Extent policies: copy each new sample's parent into it, then give every batch
// entry a store row at the extent the policy holds for it now, in an order that
// never overlaps a row not yet moved (the policy made its moves one after
// another: one of the pending ones is always possible).
static pkv_status sync_rows(run_exec *x, const pkvi_step_batch *b) {
    // The forks first, into the extents the samples had when they forked (the
    // policy copied there, then moved what grew since).
    for (uint32_t i = 0; i < b->num_seqs; i++) {
        const pkvi_step_seq *s = &b->seqs[i];
        uint8_t *f = &x->fork_pending[x->mbase[s->r] + s->child];
        if (!*f) continue;
        const pkv_seq_id parent = *mirror(x, s->r, 0), child = *mirror(x, s->r, s->child);
        if (parent < 0 || child < 0) return PKV_ERR_CORRUPT;
        pkv_status st = pkv_contig_kv_copy_row(x->store, (uint32_t)parent, (uint32_t)child);
        if (st != PKV_OK) return st;
        x->copied += x->store->len[parent] * x->row_bytes;
        *f = 0;
    }
    uint32_t left = 0;
    for (uint32_t i = 0; i < b->num_seqs; i++) {
        const pkvi_step_seq *s = &b->seqs[i];
        pkv_seq_id *m = mirror(x, s->r, s->child);
        if (*m < 0) {
            if (x->nfree == 0) return PKV_ERR_CORRUPT; // more live sequences than slots
            *m = (pkv_seq_id)x->free_rows[--x->nfree];
        }
        x->pending[i] = 1;
        left++;
    }
    while (left > 0) {
        uint32_t done = 0;
        for (uint32_t i = 0; i < b->num_seqs; i++) {
            if (!x->pending[i]) continue;
            const pkvi_step_seq *s = &b->seqs[i];
            const uint32_t row = (uint32_t)*mirror(x, s->r, s->child);
            uint64_t off, slots;
            x->pol->vt->extent_of(x->pol->state, s->r, s->child, &off, &slots);
            if (slots == 0 || slots > UINT32_MAX) return PKV_ERR_CORRUPT;
            pkv_status st = PKV_OK;
            const int moves = x->store->cap[row] != 0 && x->store->off[row] != off;
            if (x->store->cap[row] == 0)
                st = pkv_contig_kv_place(x->store, row, off, (uint32_t)slots);
            else if (x->store->off[row] != off || x->store->cap[row] != slots)
                st = pkv_contig_kv_move_row(x->store, row, off, (uint32_t)slots);
            if (st == PKV_ERR_BUSY) continue; // another row still sits there: later
            if (st != PKV_OK) return st;
            if (moves) x->copied += x->store->len[row] * x->row_bytes;
            x->pending[i] = 0;
            left--;
            done++;
        }
        if (done == 0) return PKV_ERR_CORRUPT; // extents that overlap for good
    }
    // Sequences swapped in: their K/V back into the rows just placed.
    for (uint32_t i = 0; i < b->num_seqs; i++) {
        const pkvi_step_seq *s = &b->seqs[i];
        const uint32_t len = pkvi_run_swap_pending(x, s->r, s->child);
        if (!len) continue;
        const uint32_t row = (uint32_t)*mirror(x, s->r, s->child);
        pkv_status st = pkvi_run_swap_restore(x, s->r, s->child, (pkv_seq_id)row);
        if (st != PKV_OK) return st;
        x->store->len[row] = len;
    }
    return PKV_OK;
}

// vmm: one map or unmap call of the space, its time added to vmm_step_s.
static pkv_status vmm_call(run_exec *x, uint32_t slot, int release, uint64_t bytes) {
    const double t0 = pkvi_now_seconds();
    pkv_status st = release ? pkv_vmm_slot_release(x->vmm, slot) : pkv_vmm_slot_resize(x->vmm, slot, bytes);
    x->vmm_step_s += pkvi_now_seconds() - t0;
    return st;
}

// vmm: unmap what the policy released, then map every batch entry's slot up to
// its length after this step (a new sample first copies its parent's K/V into
// pages mapped for them). The map and unmap calls are real and inside the
// measured step.
static pkv_status sync_vmm(run_exec *x, const pkvi_step_batch *b) {
    pkv_status st = PKV_OK;
    while (x->ndead > 0 && st == PKV_OK)
        if ((st = vmm_call(x, x->dead[x->ndead - 1], 1, 0)) == PKV_OK) x->ndead--;
    for (uint32_t i = 0; i < b->num_seqs && st == PKV_OK; i++) {
        const pkvi_step_seq *s = &b->seqs[i];
        pkv_seq_id *m = mirror(x, s->r, s->child);
        uint32_t slot;
        if (*m < 0 && (st = pkv_vmm_slot_acquire(x->vmm, &slot)) == PKV_OK) *m = (pkv_seq_id)slot;
        const uint32_t back = st == PKV_OK ? pkvi_run_swap_pending(x, s->r, s->child) : 0;
        if (back) { // swapped in: pages for its tokens, then its K/V back
            st = vmm_call(x, (uint32_t)*m, 0, (uint64_t)back * x->vmm_tb);
            if (st == PKV_OK) st = pkvi_run_swap_restore(x, s->r, s->child, *m);
            if (st == PKV_OK) x->store->len[*m] = back;
        }
        uint8_t *f = &x->fork_pending[x->mbase[s->r] + s->child];
        const pkv_seq_id parent = *mirror(x, s->r, 0);
        if (st == PKV_OK && *f) {
            if (parent < 0) return PKV_ERR_CORRUPT;
            const uint32_t n = x->store->len[parent];
            st = vmm_call(x, (uint32_t)*m, 0, (uint64_t)n * x->vmm_tb);
            if (st == PKV_OK) st = pkv_contig_kv_copy_row(x->store, (uint32_t)parent, (uint32_t)*m);
            if (st != PKV_OK) return st;
            x->copied += (uint64_t)n * x->row_bytes;
            *f = 0;
        }
        if (st == PKV_OK)
            st = vmm_call(x, (uint32_t)*m, 0, ((uint64_t)x->store->len[*m] + s->new_tokens) * x->vmm_tb);
    }
    return st;
}

// The sequence to run for batch entry s; in the per-token table, create it
// when it first appears and append the step's new slots; in the store, append
// them to its row (placed by sync_rows).
static pkv_status seq_for(run_exec *x, const pkvi_step_seq *s, pkv_seq_id *id) {
    const int back = pkvi_run_swap_pending(x, s->r, s->child) != 0; // swapped in, not run since
    if (x->hvmm) { // the sync acquired and mapped its rows
        if ((*id = pkvi_run_hvmm_slot(x->hvmm, s->r, s->child)) < 0) return PKV_ERR_CORRUPT;
        return back ? pkvi_run_swap_restore(x, s->r, s->child, *id) : PKV_OK;
    }
    if (x->hstore) { // the policy appended the step's tokens to its manager
        *id = pkvi_policy_hybrid_seq(x->pol, s->r, s->child);
        if (*id < 0) return PKV_ERR_CORRUPT;
        return back ? pkvi_run_swap_restore(x, s->r, s->child, *id) : PKV_OK;
    }
    if (x->store) {
        *id = *mirror(x, s->r, s->child);
        if (*id < 0) return PKV_ERR_CORRUPT;
        return pkv_contig_kv_append(x->store, (uint32_t)*id, s->new_tokens);
    }
    if (!x->own) {
        *id = s->id;
        if (s->id < 0) return PKV_ERR_CORRUPT;
        return back ? pkvi_run_swap_restore(x, s->r, s->child, s->id) : PKV_OK;
    }
    pkv_seq_id *m = mirror(x, s->r, s->child);
    pkv_status st;
    if (*m < 0 && (st = pkv_seq_create(x->own, m)) != PKV_OK) return st;
    *id = *m;
    if (back) { // its tokens first, then their K/V back
        if ((st = pkv_seq_append(x->own, *m, pkvi_run_swap_pending(x, s->r, s->child), NULL)) != PKV_OK ||
            (st = pkvi_run_swap_restore(x, s->r, s->child, *m)) != PKV_OK)
            return st;
    }
    return pkv_seq_append(x->own, *m, s->new_tokens, NULL);
}

// The policy's copies of this step, executed as device copies of that many
// bytes through the scratch buffer (table policies copy their own blocks).
static pkv_status execute_copies(run_exec *x, uint64_t bytes) {
    while (bytes > 0) {
        const uint64_t n = bytes < COPY_CHUNK ? bytes : COPY_CHUNK;
        const pkv_copy_region reg = {0, COPY_CHUNK, n};
        pkv_status st = pkv_backend_copy(x->backend, x->scratch, &reg, 1, NULL);
        if (st != PKV_OK) return st;
        bytes -= n;
    }
    return PKV_OK;
}

// Hybrid policies: run the copies the policy took from its manager since the
// last step (copy-on-write blocks, forks' states), in order, on the store, and
// count what the store copied (its pages and states, as they are stored).
static pkv_status hybrid_copies(run_exec *x) {
    const pkv_block_copy *c;
    const uint8_t *g;
    const uint32_t n = pkvi_policy_hybrid_take_kept(x->pol, &c, &g);
    for (uint32_t i = 0; i < n; i++) {
        pkv_status st = pkvi_hybrid_store_apply_copies(x->hstore, g[i], &c[i], 1, &x->copied);
        if (st != PKV_OK) return st;
    }
    return PKV_OK;
}

pkv_status pkvi_run_flush_copies(run_exec *x) {
    if (x->hstore) return hybrid_copies(x);
    if (x->store || x->own || x->hvmm) return PKV_OK; // copies run in their syncs / are modelled
    const pkv_block_copy *copies;
    uint32_t nc = x->pol->vt->take_copies ? x->pol->vt->take_copies(x->pol->state, &copies) : 0;
    pkv_status st = nc ? pkv_cache_copy_blocks(x->cache, copies, nc, NULL) : PKV_OK;
    if (st == PKV_OK) x->copied += (uint64_t)nc * x->block_bytes;
    return st;
}

// Each position once: a preempted request recomputes positions it had hashed.
static void hash_outputs(run_exec *x, uint32_t n) {
    for (uint32_t i = 0; i < n; i++) {
        const pkvi_step_seq *s = x->order[i];
        uint32_t *h = &x->hashed[x->hbase[s->r] + s->child];
        if (s->ctx <= *h) continue;
        *h = s->ctx;
        // Order-independent: a sum of per-position hashes.
        x->token_hash += mix(((uint64_t)s->r << 40) ^ ((uint64_t)s->child << 28) ^ s->ctx ^
                             ((uint64_t)(uint32_t)x->next[i] << 44));
        x->tokens++;
    }
}

// Decode sequences come first in the batch (new_tokens == 1, pushed while
// growing), then prefills; b->num_decode_seqs says where prefills start.
static pkv_status run_step(pkvi_executor *e, const pkvi_step_batch *b, double *seconds,
                           pkvi_step_time *parts) {
    run_exec *x = (run_exec *)e;
    const uint32_t nd = b->num_decode_seqs, np = b->num_seqs - nd;
    uint64_t ptok = 0;
    for (uint32_t i = nd; i < b->num_seqs; i++) ptok += b->seqs[i].new_tokens;
    pkv_status st = reserve(x, b->num_seqs, ptok > nd ? ptok : nd);
    if (st != PKV_OK) return st;
    if (x->err != PKV_OK) return x->err; // a swap hook failed
    const double t0 = pkvi_now_seconds();
    if (x->hvmm) { // released, acquired, forks copied, pages mapped and unmapped
        st = pkvi_run_hvmm_sync(x->hvmm, b->seqs, b->num_seqs, &x->copied, x->pol->why, sizeof x->pol->why);
        if (st != PKV_OK) return st;
    } else if (x->vmm) {
        if ((st = sync_vmm(x, b)) != PKV_OK) return st; // pages mapped, forks copied
    } else if (x->store) {
        if ((st = sync_rows(x, b)) != PKV_OK) return st; // the copies, on the real rows
    } else if (!x->own) { // paged, hybrid: the copies the policy took
        if ((st = pkvi_run_flush_copies(x)) != PKV_OK) return st;
    } else if ((st = execute_copies(x, b->copy_bytes)) != PKV_OK) {
        return st;
    } else {
        x->copied += b->copy_bytes;
    }
    const pkv_trace_request *reqs = pkv_trace_requests(x->pol->cfg.trace);
    if (np) {
        uint64_t k = 0;
        for (uint32_t i = 0; i < np; i++) {
            const pkvi_step_seq *s = &b->seqs[nd + i];
            if ((st = seq_for(x, s, &x->ids[i])) != PKV_OK) return st;
            x->counts[i] = s->new_tokens;
            x->order[i] = s;
            for (uint32_t j = 0; j < s->new_tokens; j++)
                x->tokens_in[k++] = token_at(x, s->r, s->child, s->ctx - s->new_tokens + j,
                                             reqs[s->r].prompt_tokens);
        }
        if (x->hvmm) {
            st = pkvi_run_hvmm_forward(x->hvmm, np, x->ids, x->counts, x->tokens_in, x->next);
        } else if (x->hstore) {
            st = pkv_model_prefill_hybrid(x->model, x->hstore, np, x->ids, x->counts, x->tokens_in,
                                          NULL, x->next);
        } else if (x->store) {
            for (uint32_t i = 0; i < np; i++) x->rows[i] = (uint32_t)x->ids[i];
            st = pkv_model_prefill_contig(x->model, x->store, np, x->rows, x->counts, x->tokens_in,
                                          NULL, x->next);
        } else {
            st = pkv_model_prefill_paged(x->model, x->cache, x->set, np, x->ids, x->counts,
                                         x->tokens_in, NULL, x->next);
        }
        if (st != PKV_OK) return st;
        hash_outputs(x, np);
    }
    if (nd) {
        for (uint32_t i = 0; i < nd; i++) {
            const pkvi_step_seq *s = &b->seqs[i];
            if ((st = seq_for(x, s, &x->ids[i])) != PKV_OK) return st;
            x->order[i] = s;
            x->tokens_in[i] = token_at(x, s->r, s->child, s->ctx - 1, reqs[s->r].prompt_tokens);
        }
        if (x->hvmm) {
            st = pkvi_run_hvmm_forward(x->hvmm, nd, x->ids, NULL, x->tokens_in, x->next);
        } else if (x->hstore) {
            st = pkv_model_decode_hybrid(x->model, x->hstore, nd, x->ids, x->tokens_in, NULL, x->next);
        } else if (x->store) {
            for (uint32_t i = 0; i < nd; i++) x->rows[i] = (uint32_t)x->ids[i];
            st = pkv_model_decode_contig(x->model, x->store, nd, x->rows, x->tokens_in, NULL, x->next);
        } else {
            st = pkv_model_decode_paged(x->model, x->cache, x->set, nd, x->ids, x->tokens_in, NULL,
                                        x->next);
        }
        if (st != PKV_OK) return st;
        hash_outputs(x, nd);
    }
    if ((st = sync_device(x)) != PKV_OK) return st;
    *seconds = pkvi_now_seconds() - t0 + x->swap_s; // with this step's swap-outs
    x->swap_s = 0;
    memset(parts, 0, sizeof *parts); // measured: no model to split a mixed step by
    if (b->prefill_tokens)
        parts->prefill_s = *seconds;
    else
        parts->decode_s = *seconds;
    return PKV_OK;
}

// The store's arena goes back to the backend (counted and timed as a free).
static void free_store(run_exec *x) {
    pkvi_run_hvmm_destroy(x->hvmm);
    x->hvmm = NULL;
    pkv_model_hybrid_store_destroy(x->hstore);
    x->hstore = NULL;
    pkv_contig_kv_destroy(x->store);
    x->store = NULL;
    pkv_vmm_space_destroy(x->vmm);
    x->vmm = NULL;
    if (x->store_mem) pkv_backend_free(x->backend, x->store_mem, (size_t)x->store_bytes);
    x->store_mem = NULL;
}

static void run_destroy(pkvi_executor *e) {
    run_exec *x = (run_exec *)e;
    if (!x) return;
    if (x->pol) {
        x->pol->real_calls = NULL;
        x->pol->real_ctx = NULL;
    }
    free_all_calls(x);
    pkv_cache_destroy(x->cache);
    free_store(x);
    pkvi_run_swap_free(x);
    pkv_seqset_destroy(x->own);
    pkv_pool_destroy(x->own_pool);
    if (x->scratch) pkv_backend_free(x->backend, x->scratch, 2 * (size_t)COPY_CHUNK);
    if (!x->model_borrowed) pkv_model_destroy(x->model);
    pkv_backend_destroy(x->backend);
    free(x->mbase);
    free(x->mseq);
    free(x->hbase);
    free(x->hashed);
    free(x->ids);
    free(x->counts);
    free(x->next);
    free(x->order);
    free(x->tokens_in);
    free(x->rows);
    free(x->pending);
    free(x->free_rows);
    free(x->fork_pending);
    free(x->dead);
    free(x);
}

// params.run_model stands for params.model on the run's device: the same
// config field by field (the name aside: a loaded file may say "custom").
static int borrowed_model_ok(const pkv_replay_params *p) {
    pkv_model_config c;
    if (pkv_model_get_config(p->run_model, &c) != PKV_OK) return 0;
    const pkv_model_config *w = &p->model;
    const pkv_device dev = p->run_cuda ? PKV_DEVICE_CUDA : PKV_DEVICE_CPU;
    return pkv_model_device(p->run_model) == dev && c.num_layers == w->num_layers &&
           c.d_model == w->d_model && c.num_heads == w->num_heads &&
           c.num_kv_heads == w->num_kv_heads && c.head_dim == w->head_dim && c.d_ff == w->d_ff &&
           c.vocab_size == w->vocab_size && c.max_seq_len == w->max_seq_len && c.norm == w->norm &&
           c.ffn == w->ffn && c.pos == w->pos && c.tied_embeddings == w->tied_embeddings &&
           c.use_bias == w->use_bias && c.norm_eps == w->norm_eps && c.rope_theta == w->rope_theta;
}

// vmm: a VMM space of the policy's page size with a slot per live sequence (and
// as many again for slots released but not yet unmapped), one max_seq_len row in
// each of the 2 x layers buffers, and as many physical pages as the budget holds;
// the store reads its buffers in place.
static pkv_status create_vmm(run_exec *x, const pkv_replay_params *p, const pkv_cache_params *cp) {
    const size_t es = pkv_dtype_size(cp->dtype);
    const uint32_t max_len = x->pol->cfg.max_seq_len;
    x->vmm_tb = (uint64_t)cp->kv_heads * cp->head_dim * es;
    if (p->vmm_page_bytes == 0) return PKV_ERR_INVALID_ARG;
    // A live sequence holds at least one page in each of the 2L buffers, and so
    // does a released one until it is unmapped: twice the budget's page groups
    // bound the slots (virtual memory and the space's page table grow with them).
    const uint64_t groups = x->pol->cfg.capacity_bytes / (2ull * cp->num_layers * p->vmm_page_bytes);
    const uint64_t live = groups < x->nfree ? groups : x->nfree;
    if (live == 0) return PKV_ERR_OUT_OF_BLOCKS;
    if (live > UINT32_MAX / 2) return PKV_ERR_INVALID_ARG;
    pkv_vmm_params vp = pkv_vmm_params_default();
    vp.num_slots = (uint32_t)(2 * live);
    vp.num_buffers = 2 * cp->num_layers;
    vp.buffer_bytes = (uint64_t)max_len * x->vmm_tb;
    vp.page_bytes = p->vmm_page_bytes;
    vp.max_pages = x->pol->cfg.capacity_bytes / p->vmm_page_bytes;
    if (vp.max_pages < vp.num_buffers) return PKV_ERR_OUT_OF_BLOCKS;
    pkv_status st = x->cuda ? pkv_vmm_space_create_cuda(0, &vp, &x->vmm)
                            : pkv_vmm_space_create_host(&vp, &x->vmm);
    pkv_vmm_info info;
    void *k0 = NULL, *v0 = NULL;
    if (st == PKV_OK) st = pkv_vmm_get_info(x->vmm, &info);
    if (st == PKV_OK) st = pkv_vmm_buffer_ptr(x->vmm, 0, &k0);
    if (st == PKV_OK) st = pkv_vmm_buffer_ptr(x->vmm, 1, &v0);
    if (st != PKV_OK) return st;
    // Buffer j is at base + j x slots x row bytes: layer l's K is buffer 2l.
    const uint64_t row = info.buffer_bytes / es;
    st = pkvi_contig_kv_wrap_slots(x->model, vp.num_slots, max_len, cp->dtype, k0, v0,
                                   2ull * vp.num_slots * row, row, &x->store);
    x->dead = malloc((size_t)vp.num_slots * sizeof *x->dead);
    if (st == PKV_OK && !x->dead) st = PKV_ERR_OUT_OF_MEMORY;
    if (st == PKV_OK) pkv_vmm_reset_stats(x->vmm); // the replay's calls, not the reservation
    return st;
}

pkv_status pkvi_executor_run_create(const pkv_replay_params *p, pkvi_policy *pol,
                                    pkvi_executor **out) {
    if (!p || !pol || !out) return PKV_ERR_INVALID_ARG;
    run_exec *x = calloc(1, sizeof *x);
    if (!x) return PKV_ERR_OUT_OF_MEMORY;
    x->base.needs_seqs = 1;
    x->base.step = run_step;
    x->base.destroy = run_destroy;
    x->base.on_fork = run_on_fork;
    x->base.on_release = run_on_release;
    x->base.on_swap_out = pkvi_run_on_swap_out;
    x->base.on_swap_drop = pkvi_run_on_swap_drop;
    x->base.on_swap_in = pkvi_run_on_swap_in;
    x->pol = pol;
    x->cuda = p->run_cuda;
    x->vocab = p->model.vocab_size;
    x->seed = p->seed;
    pkv_status st = PKV_OK;
    {
        const uint32_t nr = pol->cfg.num_requests;
        x->hbase = malloc((size_t)(nr ? nr : 1) * sizeof *x->hbase);
        uint64_t total = 0;
        if (x->hbase)
            for (uint32_t r = 0; r < nr; r++) {
                x->hbase[r] = total;
                total += pol->cfg.max_seqs[r];
            }
        x->hashed = calloc((size_t)(total ? total : 1), sizeof *x->hashed);
        if (!x->hbase || !x->hashed) st = PKV_ERR_OUT_OF_MEMORY;
    }
    x->set = pol->vt->seqset ? pol->vt->seqset(pol->state) : NULL;
    const uint64_t slots = pol->info.capacity_slots;
    if (st == PKV_OK && !x->set) {
        // (r, child) -> table sequence or store row.
        const uint32_t nr = pol->cfg.num_requests;
        x->mbase = malloc((size_t)(nr ? nr : 1) * sizeof *x->mbase);
        uint64_t total = 0;
        if (x->mbase)
            for (uint32_t r = 0; r < nr; r++) {
                x->mbase[r] = total;
                total += pol->cfg.max_seqs[r];
            }
        x->mseq = malloc((size_t)(total ? total : 1) * sizeof *x->mseq);
        x->fork_pending = calloc((size_t)(total ? total : 1), sizeof *x->fork_pending);
        if (!x->mbase || !x->mseq || !x->fork_pending) st = PKV_ERR_OUT_OF_MEMORY;
        if (!x->mbase) total = 0;
        for (uint64_t i = 0; st == PKV_OK && i < total; i++) x->mseq[i] = -1;
        // Live sequences: at most one per pair and one per slot.
        const uint64_t rows = total < slots ? total : slots;
        x->nfree = (uint32_t)(rows < UINT32_MAX ? (rows ? rows : 1) : UINT32_MAX);
        x->free_rows = malloc((size_t)x->nfree * sizeof *x->free_rows);
        if (!x->free_rows) st = PKV_ERR_OUT_OF_MEMORY;
        for (uint32_t i = 0; st == PKV_OK && i < x->nfree; i++) x->free_rows[i] = x->nfree - 1 - i;
    }
    pkv_model_params mp = pkv_model_params_default();
    mp.device = p->run_cuda ? PKV_DEVICE_CUDA : PKV_DEVICE_CPU;
    mp.seed = p->seed;
    mp.num_threads = p->run_threads;
    if (st == PKV_OK)
        st = p->run_cuda ? pkv_backend_create_cuda(0, &x->backend) : pkv_backend_create_host(&x->backend);
    if (st == PKV_OK && p->run_model) {
        st = borrowed_model_ok(p) ? PKV_OK : PKV_ERR_INVALID_ARG;
        x->model = p->run_model;
        x->model_borrowed = 1;
    } else if (st == PKV_OK) {
        st = pkv_model_create(&p->model, &mp, &x->model);
    }
    pkv_cache_params cp;
    if (st == PKV_OK) st = pkv_model_cache_params(x->model, x->set ? pkv_seqset_block_size(x->set) : 1, &cp);
    // Extent policies on their contiguous rows (the store holds fp32/fp16/bf16
    // only: an 8-bit KV runs them through the per-token table instead).
    const int quantized = st == PKV_OK && pkv_dtype_is_quantized(cp.dtype);
    const int use_vmm = st == PKV_OK && !x->set && (pol->vt == &pkvi_policy_vmm_vtable || pol->vt == &pkvi_policy_vmm_sync_vtable) && !quantized;
    const int use_store = st == PKV_OK && !x->set && pol->vt->extent_of && !quantized;
    // Hybrid policies on the CPU over their manager's pools (the store is the CPU
    // decoder's fp32 host memory: on CUDA they stay on the per-token table).
    pkv_hybrid *hyb = NULL;
    if (st == PKV_OK && !x->set && !p->run_cuda && cp.dtype == PKV_DTYPE_F32)
        hyb = pkvi_policy_hybrid_run(pol);
    // hybrid-vmm on the CPU over a real pkv_hybrid_vmm (fp32, the CPU decoder's).
    const int use_hvmm = st == PKV_OK && !x->set && !p->run_cuda && cp.dtype == PKV_DTYPE_F32 &&
                         pol->vt == &pkvi_policy_hybrid_vmm_vtable;
    if (st == PKV_OK && !x->set && !use_store && !use_vmm && !hyb && !use_hvmm) {
        if (slots > PKV_POOL_MAX_BLOCKS) st = PKV_ERR_INVALID_ARG;
        if (st == PKV_OK) st = pkv_pool_create((uint32_t)slots, &x->own_pool);
        if (st == PKV_OK) st = pkv_seqset_create(x->own_pool, 1, &x->own);
        if (st == PKV_OK) st = pkv_backend_alloc(x->backend, 2 * (size_t)COPY_CHUNK, &x->scratch);
        x->set = x->own;
    }
    // The counters cover the replay only: the weights and the copy scratch are
    // not KV memory.
    if (st == PKV_OK) pkv_backend_reset_stats(x->backend);
    if (st == PKV_OK) {
        x->row_bytes = 2ull * cp.num_layers * cp.kv_heads * cp.head_dim * pkv_dtype_size(cp.dtype);
    }
    if (st == PKV_OK && use_hvmm) {
        st = pkvi_run_hvmm_create_for(x->model, pol, &x->hvmm);
    } else if (st == PKV_OK && use_vmm) {
        st = create_vmm(x, p, &cp);
    } else if (st == PKV_OK && hyb) {
        st = pkvi_hybrid_store_create(x->model, hyb, PKV_DTYPE_F32, 1, x->backend, &x->hstore);
        x->hyb = hyb;
    } else if (st == PKV_OK && use_store) {
        // One backend allocation (the arena sim counts), K half then V half.
        const uint64_t half = pkvi_contig_kv_arena_bytes(x->model, slots, cp.dtype);
        if (half == 0 || half > SIZE_MAX / 2) st = PKV_ERR_OUT_OF_MEMORY;
        x->store_bytes = 2 * half;
        if (st == PKV_OK) st = pkv_backend_alloc(x->backend, (size_t)x->store_bytes, &x->store_mem);
        // Touched now: untouched host pages would read as the shared zero page.
        if (st == PKV_OK) st = pkv_backend_memset(x->backend, x->store_mem, 0, (size_t)x->store_bytes);
        if (st == PKV_OK)
            st = pkvi_contig_kv_wrap(x->model, x->nfree, slots, cp.dtype, x->store_mem,
                                     (char *)x->store_mem + half, &x->store);
    } else if (st == PKV_OK) {
        st = pkv_cache_create(&cp, pkv_seqset_pool(x->set), x->backend, &x->cache);
        pkv_cache_geometry g;
        if (st == PKV_OK && (st = pkv_cache_get_geometry(x->cache, &g)) == PKV_OK)
        {
            x->block_bytes = 2 * g.half_block_bytes * cp.num_layers; // 8-bit scales included
            x->half_block = g.half_block_bytes;
            x->layers = cp.num_layers;
        }
    }
    if (st != PKV_OK) {
        run_destroy(&x->base);
        return st;
    }
    // vmm's modelled calls stay models: its real calls are the space's.
    pol->real_calls = x->vmm || x->hvmm ? NULL : real_calls;
    pol->real_ctx = x;
    *out = &x->base;
    return PKV_OK;
}

pkv_status pkvi_executor_run_alloc_stats(pkvi_executor *e, pkv_replay_report *rep) {
    run_exec *x = (run_exec *)e;
    snprintf(rep->run.layout, sizeof rep->run.layout, "%s",
             x->hvmm ? "hybrid-vmm" : x->hstore ? "hybrid" : x->vmm ? "vmm" : x->store ? "contiguous"
                                       : x->own ? "token-table" : "paged");
    pkv_vmm_stats vs;
    memset(&vs, 0, sizeof vs);
    const int vmm = x->vmm != NULL || x->hvmm != NULL;
    if (x->hvmm) pkvi_run_hvmm_finish(x->hvmm, &vs, &x->vmm_step_s);
    if (x->vmm) {
        // Slots released after the last step: unmapped now, outside every step.
        const double in_steps = x->vmm_step_s;
        for (; x->ndead > 0; x->ndead--) vmm_call(x, x->dead[x->ndead - 1], 1, 0);
        x->vmm_step_s = in_steps;
        pkv_status st = pkv_vmm_get_stats(x->vmm, &vs);
        if (st != PKV_OK) return st;
    }
    // Free what is left and the arena first so that their frees are counted too.
    free_all_calls(x);
    pkv_cache_destroy(x->cache);
    x->cache = NULL;
    free_store(x);
    pkv_backend_stats s;
    pkv_status st = pkv_backend_get_stats(x->backend, &s);
    if (st != PKV_OK) return st;
    // vmm: the page maps and unmaps are its allocation calls, all inside steps
    // but those of the slots released after the last one.
    rep->alloc.backend_alloc_calls = s.alloc_calls + vs.map_calls;
    rep->alloc.backend_free_calls = s.free_calls + vs.unmap_calls;
    rep->alloc.backend_alloc_seconds = s.alloc_seconds + vs.map_seconds;
    rep->alloc.backend_free_seconds = s.free_seconds + vs.unmap_seconds;
    if (vmm) rep->alloc.step_seconds = x->vmm_step_s;
    rep->alloc.seconds_measured = 1;
    rep->run.token_hash = x->token_hash;
    rep->run.tokens = x->tokens;
    rep->run.copied_bytes = x->copied;
    return PKV_OK;
}

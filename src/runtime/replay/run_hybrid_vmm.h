// SPDX-License-Identifier: MIT
// Run mode's hybrid-vmm layout (run_hybrid_vmm.c): the decoder over a real
// pkv_hybrid_vmm (pkv/hybrid_vmm.h, host memfd spaces, one per KV cache group,
// under one budget), fp32 K/V as the CPU decoder stores it. Each live sequence
// owns a slot; before each step every batch sequence's rows are set to what its
// step reads (pkv_hybrid_vmm_set_step: pages mapped as rows grow, unmapped as
// windows slide), slots of released sequences are released and a fork's samples
// get copies of their parent's rows; the calls are timed. The decoder reads
// the spaces' buffers in place (src/runtime/model/slot_store.h), so a read of a
// page a window gave up faults.
#ifndef PKV_REPLAY_RUN_HYBRID_VMM_H
#define PKV_REPLAY_RUN_HYBRID_VMM_H

#include <stddef.h>
#include <stdint.h>

#include "pkv/hybrid_vmm.h"
#include "pkv/model.h"
#include "replay_internal.h"

typedef struct pkvi_run_hvmm pkvi_run_hvmm;

typedef struct pkvi_run_hvmm_params {
    pkv_model *model;             // borrowed: a CPU model with groups its loop runs
    uint64_t budget_bytes;        // physical memory of every group (fp32 bytes)
    uint64_t page_bytes;          // physical page (fp32 bytes)
    uint32_t max_seq_len;         // tokens a row holds
    uint32_t num_requests;
    const uint32_t *max_seqs;     // [num_requests] sequences of each request (borrowed)
} pkvi_run_hvmm_params;

// PKV_ERR_INVALID_ARG for params the spaces refuse (a page below the host's);
// PKV_ERR_OUT_OF_BLOCKS when the budget holds not one sequence's pages.
pkv_status pkvi_run_hvmm_create(const pkvi_run_hvmm_params *p, pkvi_run_hvmm **out);
void pkvi_run_hvmm_destroy(pkvi_run_hvmm *h); // NULL does nothing

// The layout for the hybrid-vmm policy `pol` (borrowed): the policy's budget and
// page (its config and the replay's vmm_page_bytes) widened from its KV element
// bytes to fp32, as the CPU decoder stores K/V, so the real spaces hold the same
// pages the policy counts; its max_seq_len and requests. A budget that holds no
// sequence's pages (PKV_ERR_OUT_OF_BLOCKS) is named in pol->why.
pkv_status pkvi_run_hvmm_create_for(pkv_model *model, pkvi_policy *pol, pkvi_run_hvmm **out);

// The manager (borrowed): its spaces and budget, for reports and tests.
pkv_hybrid_vmm *pkvi_run_hvmm_manager(const pkvi_run_hvmm *h);

// Request r forked into n sequences: samples 1..n-1 copy sample 0's rows at the
// next sync. Request r was released: its slots are released at the next sync.
pkv_status pkvi_run_hvmm_fork(pkvi_run_hvmm *h, uint32_t r, uint32_t n);
void pkvi_run_hvmm_release(pkvi_run_hvmm *h, uint32_t r);
// Request r's first n sequences were swapped back in: at the next sync each gets
// a slot mapped for its step at the length it resumes from (its rows are the
// caller's to write back: run_swap.c).
void pkvi_run_hvmm_resume(pkvi_run_hvmm *h, uint32_t r, uint32_t n);

// Before a step of n sequences: release, acquire, copy the forks' rows (their
// bytes added to *copied) and map what each sequence's step reads, all timed
// (pkvi_run_hvmm_step_seconds). A refusal by the library is named in why[cap]:
// PKV_ERR_OUT_OF_BLOCKS where the budget is short (the policy admitted what the
// real spaces cannot hold), PKV_ERR_CORRUPT for a sequence that resumes without
// its rows and was not swapped in (pkvi_run_hvmm_resume).
pkv_status pkvi_run_hvmm_sync(pkvi_run_hvmm *h, const pkvi_step_seq *seqs, uint32_t n,
                              uint64_t *copied, char *why, size_t cap);

// The slot of (r, child) after the sync (-1: none).
pkv_seq_id pkvi_run_hvmm_slot(const pkvi_run_hvmm *h, uint32_t r, uint32_t child);

// The decoder over the step's S sequences (slots from pkvi_run_hvmm_slot), their
// lengths those of the sync; counts NULL: one token each (a decode).
pkv_status pkvi_run_hvmm_forward(pkvi_run_hvmm *h, uint32_t S, const pkv_seq_id *slots,
                                 const uint32_t *counts, const int32_t *tokens,
                                 int32_t *next_tokens);

// Release the slots still dead (outside any step); then the spaces' map and
// unmap calls and seconds together, and the seconds of the calls made in syncs.
void pkvi_run_hvmm_finish(pkvi_run_hvmm *h, pkv_vmm_stats *calls, double *step_seconds);

#endif // PKV_REPLAY_RUN_HYBRID_VMM_H

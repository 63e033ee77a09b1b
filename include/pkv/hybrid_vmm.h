// SPDX-License-Identifier: MIT
// The hybrid-vmm layout as a library (issue 23): the vAttention design applied to a
// model's KV cache groups. Each group gets its own VMM space (pkv/vmm.h), with rows
// of that group's bytes per token, and every space draws on one physical budget
// (pkv_vmm_budget), so memory one group gives up backs another's growth:
//
//   FULL, SLIDING, CHUNKED  2 x layers buffers (K and V of each layer), a row of
//                           max_seq_len x kv_heads x head_dim x elem_bytes
//   MLA                     layers buffers, a row of max_seq_len x (latent + rope) x elem
//   STATE                   layers buffers, a row of state_bytes, mapped whole while
//                           the sequence lives
//
// A sequence is one slot index, the same in every space. pkv_hybrid_vmm_set_length
// maps, per token group, exactly the pages of the tokens the group keeps at that
// length (pkv_kv_group_tokens_kept: a sliding window's last W tokens, a chunk's
// tokens, every token for FULL and MLA), unmapping the front of a windowed row as
// it slides (pkv_hybrid_vmm_set_step: what a prefill chunk's queries read, the
// window of its first query on). Buffer b of group g is pkv_vmm_buffer_ptr(pkv_hybrid_vmm_space(h, g), b):
// token t of slot s sits at row s, byte t x (bytes per token of one buffer), as in
// pkv/vmm.h; contiguous attention kernels read it unchanged.
//
// No prefix cache, fork or swap here: rows are private to a sequence (vAttention
// shares nothing between rows). The replay's `hybrid-vmm` policy models the same
// arrangement with the step's costs (docs/DESIGN.md).
//
// Ownership: the caller owns the manager; spaces are borrowed from it.
// Thread-safety: one thread at a time per manager.
#ifndef PKV_HYBRID_VMM_H
#define PKV_HYBRID_VMM_H

#include <stddef.h>
#include <stdint.h>

#include "pkv/model_config.h"
#include "pkv/status.h"
#include "pkv/vmm.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct pkv_hybrid_vmm pkv_hybrid_vmm;

typedef struct pkv_hybrid_vmm_params {
    const pkv_kv_group *groups;  // [num_groups], copied by create
    uint32_t num_groups;         // 1..PKV_MAX_KV_GROUPS, at least one token group
    size_t elem_bytes;           // stored bytes per element (2: fp16/bf16, 1: 8-bit)
    uint64_t budget_bytes;       // physical memory of every group together (> 0)
    uint32_t max_seqs;           // slots (sequences at once), >= 1
    uint32_t max_seq_len;        // tokens a row can hold (its virtual size), >= 1
    uint64_t page_bytes;         // physical page; 0 = the implementation's granularity
    int device;                  // -1: host memory; else this CUDA device
    pkv_vmm_host_mode host_mode; // host only
} pkv_hybrid_vmm_params;

// Defaults: no groups, elem_bytes 2, budget 0, max_seqs 1, max_seq_len 4096,
// page_bytes 0, device -1 (host), MEMFD.
void pkv_hybrid_vmm_params_default(pkv_hybrid_vmm_params *params);

// PKV_ERR_INVALID_ARG: no or too many groups, no token group, an invalid group (0
// layers, a SLIDING/CHUNKED window of 0, a token group of 0 bytes per token, a STATE
// group of 0 state bytes, a token of a buffer above 2^40 bytes, a row of max_seq_len
// tokens beyond 64 bits), elem_bytes 0, budget 0, max_seqs or max_seq_len 0, a page
// the implementation refuses; pkv_vmm_space_create_* statuses otherwise (CUDA:
// PKV_ERR_UNSUPPORTED in a build without it, PKV_ERR_NO_DEVICE).
pkv_status pkv_hybrid_vmm_create(const pkv_hybrid_vmm_params *params, pkv_hybrid_vmm **out);
void pkv_hybrid_vmm_destroy(pkv_hybrid_vmm *h); // NULL does nothing

// A new sequence of length 0 (lowest free slot): its state groups' rows are mapped.
// PKV_ERR_OUT_OF_BLOCKS when no slot is free or the budget cannot hold its states
// (nothing changes).
pkv_status pkv_hybrid_vmm_acquire(pkv_hybrid_vmm *h, uint32_t *slot);

// Map what every token group keeps for a sequence of `num_tokens` tokens and
// nothing else (a windowed group unmaps the pages wholly before its kept tokens).
// All or nothing across the groups: PKV_ERR_OUT_OF_BLOCKS when the budget cannot
// cover the new pages after this call's own unmaps (nothing changes);
// PKV_ERR_INVALID_ARG for a slot not acquired or num_tokens > max_seq_len. Kept
// pages keep their content; a page mapped again (a shorter length that reaches
// back before a window's front) has undefined content. A failed map call
// (PKV_ERR_BACKEND) leaves each group with the overlap of its old and new ranges.
pkv_status pkv_hybrid_vmm_set_length(pkv_hybrid_vmm *h, uint32_t slot, uint32_t num_tokens);

// What a step of a sequence computing positions first..n-1 reads (a prefill
// chunk of n - first tokens, all written before any is attended to): per token
// group the tokens from the window of the query at `first` on, up to n, and
// nothing else (pkv_hybrid_vmm_set_length(n) is set_step(n - 1, n)). A later
// set_length or set_step unmaps what it no longer keeps. The same statuses, and
// PKV_ERR_INVALID_ARG for first >= n (n > 0) or first != 0 (n == 0).
pkv_status pkv_hybrid_vmm_set_step(pkv_hybrid_vmm *h, uint32_t slot, uint32_t first, uint32_t n);

// Unmap every row of the sequence and free its slot. PKV_ERR_INVALID_ARG for a slot
// not acquired.
pkv_status pkv_hybrid_vmm_release(pkv_hybrid_vmm *h, uint32_t slot);

// Group g's space (borrowed; NULL for a bad group) and the bytes one token takes in
// one of its buffers (a state group: its state bytes per layer).
pkv_vmm_space *pkv_hybrid_vmm_space(const pkv_hybrid_vmm *h, uint32_t group);
uint64_t pkv_hybrid_vmm_buffer_token_bytes(const pkv_hybrid_vmm *h, uint32_t group);

// The shared budget's counters.
pkv_status pkv_hybrid_vmm_budget_stats(const pkv_hybrid_vmm *h, pkv_vmm_budget_stats *stats);

// Every space's invariant, the slots agreeing across spaces, each token group's
// mapped range equal to what the sequence's last set_length / set_step keeps. PKV_ERR_CORRUPT otherwise.
pkv_status pkv_hybrid_vmm_validate(const pkv_hybrid_vmm *h);

#ifdef __cplusplus
}
#endif

#endif // PKV_HYBRID_VMM_H

// SPDX-License-Identifier: MIT
// Internal interfaces of the replay: the KV policy interface that the scheduler
// drives (one table of functions per policy), and the step executor that turns
// one scheduled step into a duration (roofline model in sim mode, the decoder in
// run mode). Not installed.
#ifndef PKV_RUNTIME_REPLAY_INTERNAL_H
#define PKV_RUNTIME_REPLAY_INTERNAL_H

#include <stdint.h>

#include "pkv/replay.h"
#include "pkv/seq.h"

// ---- policies ----

// What a request needs when it is (re)admitted. A new request has one sequence of
// `len` = prompt tokens; a preempted one comes back with `nseq` sequences that
// share the prompt and each hold `len` tokens.
typedef struct pkvi_admit {
    uint32_t prompt;     // prompt tokens (shared by the request's sequences)
    uint32_t len;        // tokens each sequence holds after admission
    uint32_t final_len;  // tokens each sequence will hold at the end (prompt + output - 1)
    uint32_t nseq;       // sequences now (1 for a new request)
    uint32_t n;          // sequences after the fork (the trace's n)
    int independent;     // restore: rebuild each sequence alone (run mode), no sharing
} pkvi_admit;

// A memory sample in token slots.
typedef struct pkvi_mem_sample {
    uint64_t used;        // distinct physical slots holding a token state
    uint64_t reserved;    // slots held for live sequences
    uint64_t reservation; // reserved slots that live sequences will fill later
} pkvi_mem_sample;

// Backend calls as the policy counts them (sim mode) or as its backend measured.
typedef struct pkvi_alloc_counts {
    uint64_t alloc_calls, free_calls;
    uint64_t copy_slots; // token slots copied on device (CoW, fork copies, regrowth)
    uint64_t cow_copies; // CoW block copies
    uint64_t cached_tokens; // prompt tokens found in the prefix cache
} pkvi_alloc_counts;

typedef struct pkvi_policy pkvi_policy;

// A sequence in a step, for executors that need them (run mode).
typedef struct pkvi_step_seq {
    pkv_seq_id id;
    uint32_t new_tokens; // tokens computed for it in this step
    uint32_t ctx;        // its length after the step's appends
} pkvi_step_seq;

typedef struct pkvi_policy_ops {
    // Admit request r; all or nothing. PKV_ERR_OUT_OF_BLOCKS if it does not fit
    // with `watermark` slots left free; *ext_frag (slots) is then the free space
    // the request could not use because no extent was large enough (0 for paged).
    pkv_status (*admit)(pkvi_policy *p, uint32_t r, const pkvi_admit *a, uint64_t watermark,
                        uint64_t *ext_frag);
    // Request r's prefill step (of `prompt` tokens) has ended: its K/V exist now.
    void (*commit)(pkvi_policy *p, uint32_t r, uint32_t prompt);
    // Fork request r's single sequence into n (after its prefill).
    pkv_status (*fork)(pkvi_policy *p, uint32_t r, uint32_t n);
    // Append one token to sequence `child` of request r. PKV_ERR_OUT_OF_BLOCKS if
    // memory is short (nothing changed).
    pkv_status (*grow)(pkvi_policy *p, uint32_t r, uint32_t child);
    // Free every sequence of request r.
    void (*release)(pkvi_policy *p, uint32_t r);
    // 1 if request r could run alone in an empty budget (admission with the
    // watermark, then growth to final_len).
    int (*fits_alone)(const pkvi_policy *p, const pkvi_admit *a, uint64_t watermark);
    // Slots stored / reserved / to be filled for request r (its `nseq` sequences
    // of `len` tokens that will reach final_len).
    void (*sample)(const pkvi_policy *p, uint32_t r, uint32_t nseq, uint32_t len,
                   uint32_t final_len, pkvi_mem_sample *s);
    // Totals over the whole policy (used and reserved must match the sum of samples
    // for paged sharing; the engine uses these for used/reserved).
    void (*totals)(const pkvi_policy *p, pkvi_mem_sample *s);
    uint64_t (*free_slots)(const pkvi_policy *p);
    void (*counts)(const pkvi_policy *p, pkvi_alloc_counts *c);
    // Sequence id of (r, child) for executors (paged only; -1 otherwise).
    pkv_seq_id (*seq_of)(const pkvi_policy *p, uint32_t r, uint32_t child);
    pkv_status (*validate)(const pkvi_policy *p);
    void (*destroy)(pkvi_policy *p);
} pkvi_policy_ops;

// Seconds of backend calls, from the cost model: pending ones (not yet charged
// to a step; the engine takes them) and totals.
typedef struct pkvi_charges {
    double sync_s, async_s;         // pending: synchronizing / overlapping calls
    double alloc_total_s, free_total_s;
} pkvi_charges;

struct pkvi_policy {
    const pkvi_policy_ops *ops;
    pkv_policy kind;
    uint64_t capacity_slots; // budget in token slots
    uint32_t granularity;    // slots per allocation unit (block size for paged, else 1)
    uint32_t last_cached;    // prompt tokens the last admit found already cached
    const pkv_alloc_model *cost; // borrowed; NULL: calls cost nothing (run mode)
    uint64_t bytes_per_token;
    pkvi_charges charges;
};

// Charge `count` backend calls (is_free: 0 alloc, 1 free) of `slots` token
// slots each to the pending step.
static inline void pkvi_policy_charge_calls(pkvi_policy *p, int is_free, uint64_t slots,
                                            uint64_t count) {
    if (!p->cost || count == 0) return;
    const pkv_alloc_call_cost *c = is_free ? &p->cost->free : &p->cost->alloc;
    const double s = (double)count * pkv_alloc_call_seconds(c, slots * p->bytes_per_token);
    if (c->sync)
        p->charges.sync_s += s;
    else
        p->charges.async_s += s;
    if (is_free)
        p->charges.free_total_s += s;
    else
        p->charges.alloc_total_s += s;
}

static inline void pkvi_policy_charge(pkvi_policy *p, int is_free, uint64_t slots) {
    pkvi_policy_charge_calls(p, is_free, slots, 1);
}

typedef struct pkvi_policy_config {
    pkv_policy kind;
    uint64_t capacity_bytes;
    uint64_t bytes_per_token;
    uint32_t block_size;
    uint32_t max_seq_len;
    uint32_t num_requests;
    const uint32_t *max_seqs; // [num_requests]: the n of each request
    const pkv_trace *trace;   // borrowed: token ids for prefix sharing
    int prefix_sharing;
    const pkv_alloc_model *cost; // borrowed, may be NULL
    // vmm policy: physical page, buffers (2 x layers: K and V per layer), map-ahead.
    uint64_t vmm_page_bytes;
    uint32_t vmm_buffers;
    int vmm_map_ahead;
    int vmm_defer_reclaim;
} pkvi_policy_config;

static inline void pkvi_policy_init_costs(pkvi_policy *p, const pkvi_policy_config *c) {
    p->cost = c->cost;
    p->bytes_per_token = c->bytes_per_token;
}

// ---- defined in policy_paged.c / policy_contig.c / policy_token.c ----
pkv_status pkvi_policy_paged_create(const pkvi_policy_config *c, pkvi_policy **out);
pkv_status pkvi_policy_contig_create(const pkvi_policy_config *c, pkvi_policy **out);
pkv_status pkvi_policy_token_create(const pkvi_policy_config *c, pkvi_policy **out);
// Defined in policy_vmm.c (vAttention-style virtual-contiguous KV).
pkv_status pkvi_policy_vmm_create(const pkvi_policy_config *c, pkvi_policy **out);
uint64_t pkvi_vmm_need(uint64_t page_bytes, uint64_t token_bytes_per_buffer, int map_ahead,
                       uint32_t max_seq_len, const pkvi_admit *a);
// Slots a request needs at its peak when it runs alone (watermark excluded).
uint64_t pkvi_paged_need(uint32_t block_size, const pkvi_admit *a);
uint64_t pkvi_contig_need(pkv_policy kind, uint32_t max_seq_len, const pkvi_admit *a);
uint64_t pkvi_token_need(const pkvi_admit *a);
// The paged policy's seqset (for the run executor's cache), NULL for others.
pkv_seqset *pkvi_policy_paged_seqset(pkvi_policy *p);
// Take the CoW copies the last grow calls queued (paged; run executors apply them).
uint32_t pkvi_policy_paged_take_copies(pkvi_policy *p, const pkv_block_copy **copies);

// ---- step executors ----

typedef struct pkvi_step_batch {
    uint32_t num_prefill_seqs;
    uint64_t prefill_tokens;       // tokens computed by prefills (incl. recompute)
    double prefill_attn_pairs;     // sum over prefills of (query, key) pairs
    uint64_t prefill_ctx_tokens;   // context tokens prefills read
    uint32_t num_decode_seqs;
    uint64_t decode_ctx_tokens;    // sum of decode sequences' context lengths
    uint64_t swap_bytes;           // host <-> device bytes this step
    uint64_t copy_bytes;           // device copies this step (CoW and friends)
    // Only for executors with needs_seqs: the sequences (prefills first).
    const pkvi_step_seq *seqs;
    uint32_t num_seqs;
} pkvi_step_batch;

// What an executor says about a step besides its duration.
typedef struct pkvi_step_time {
    double prefill_s, decode_s; // the step split in proportion of its modelled parts
                                // (run mode: all to prefill if it has one, else decode)
    double flops, bytes;        // sim: modelled work (0 in run mode)
} pkvi_step_time;

typedef struct pkvi_executor pkvi_executor;
struct pkvi_executor {
    int needs_seqs;
    double peak_flops, mem_bw;  // sim: the GPU's, for utilization (0 in run mode)
    pkv_status (*step)(pkvi_executor *e, const pkvi_step_batch *b, double *seconds,
                       pkvi_step_time *parts);
    void (*destroy)(pkvi_executor *e);
};

// Roofline model of params->model on params->gpu (defined in roofline.c).
pkv_status pkvi_executor_roofline_create(const pkv_replay_params *params, pkvi_executor **out);

// The decoder over the paged policy's pool (defined in run.c). The
// policy is borrowed and must outlive the executor.
pkv_status pkvi_executor_run_create(const pkv_replay_params *params, pkvi_policy *policy,
                                    pkvi_executor **out);
// Backend counters of a run executor into rep->alloc (frees the KV arena first).
pkv_status pkvi_executor_run_alloc_stats(pkvi_executor *e, pkv_replay_report *rep);

#endif // PKV_RUNTIME_REPLAY_INTERNAL_H

// SPDX-License-Identifier: MIT
// Internal interfaces of the replay: the engine's handle on a KV policy (whose
// interface is public: pkv/policy.h), and the step executor that turns
// one scheduled step into a duration (roofline model in sim mode, the decoder in
// run mode). Not installed.
#ifndef PKV_RUNTIME_REPLAY_INTERNAL_H
#define PKV_RUNTIME_REPLAY_INTERNAL_H

#include <stdint.h>

#include "pkv/hybrid.h"
#include "pkv/policy.h"
#include "pkv/replay.h"
#include "pkv/seq.h"

// ---- policies ----
// Every policy, built-in or plugin, is a pkv_policy_vtable (pkv/policy.h); the
// engine holds it in a pkvi_policy and calls nothing else.

typedef pkv_policy_admit pkvi_admit;

// Seconds of backend calls, from the cost model: pending ones (not yet charged
// to a step; the engine takes them) and totals.
typedef struct pkvi_charges {
    double sync_s, async_s;         // pending: synchronizing / overlapping calls
    double alloc_total_s, free_total_s;
} pkvi_charges;

// The engine's handle on one policy.
typedef struct pkvi_policy {
    const pkv_policy_vtable *vt; // borrowed (static storage)
    void *state;                 // owned: vt->destroy
    pkv_policy_config cfg;       // cfg.host.ctx points at this struct
    pkv_policy_info info;
    const pkv_alloc_model *cost; // borrowed; NULL: calls cost nothing (run mode)
    pkvi_charges charges;
    uint64_t alloc_calls, free_calls; // the policy's backend calls (arena excluded)
    // Run mode: make the calls for real (the executor's backend) and return the
    // seconds they took; NULL in sim mode.
    double (*real_calls)(void *ctx, pkv_backend_call kind, uint64_t bytes, uint64_t count);
    void *real_ctx;
    // Checks of the policy's answers (policy_check.c): its last stats, and why
    // it broke the contract ("policy 'NAME': slot 'SLOT': rule"; empty if not).
    pkv_policy_stats last;
    char why[160];
} pkvi_policy;

// Create vt's policy for cfg (cfg.host is set here) into *p, which must not
// move afterwards (the host callback points at it).
pkv_status pkvi_policy_open(pkvi_policy *p, const pkv_policy_vtable *vt, const pkv_policy_config *cfg,
                            const pkv_alloc_model *cost);
void pkvi_policy_close(pkvi_policy *p);

// ---- policy_check.c: the engine calls a policy's status- and stats-returning
// slots through these, which check what pkv/policy.h promises every time. On a
// broken rule: PKV_ERR_CORRUPT (OUT_OF_MEMORY stays itself) and p->why says it.
pkv_status pkvi_policy_check_create(pkvi_policy *p, pkv_status st, uint64_t budget_slots);
pkv_status pkvi_policy_admit(pkvi_policy *p, uint32_t r, const pkv_policy_admit *a,
                             uint64_t watermark, uint64_t *ext_frag, uint32_t *cached);
pkv_status pkvi_policy_swap_in(pkvi_policy *p, uint32_t r, const pkv_policy_admit *a,
                               uint64_t watermark, uint64_t *ext_frag);
pkv_status pkvi_policy_fork(pkvi_policy *p, uint32_t r, uint32_t n);
pkv_status pkvi_policy_grow(pkvi_policy *p, uint32_t r, uint32_t child);
pkv_status pkvi_policy_stats(pkvi_policy *p, pkv_policy_stats *s);
pkv_status pkvi_policy_validate(pkvi_policy *p); // PKV_OK if the slot is NULL
// Every step: the sum of the running requests' reservation() fits reserved - used.
pkv_status pkvi_policy_check_reservation(pkvi_policy *p, const pkv_policy_stats *s,
                                        uint64_t reservation);

// The built-in tables (policies/policy_paged.c, policy_contig.c, policy_token.c).
extern const pkv_policy_vtable pkvi_policy_paged_vtable;
extern const pkv_policy_vtable pkvi_policy_contig_max_vtable;
extern const pkv_policy_vtable pkvi_policy_contig_pow2_vtable;
extern const pkv_policy_vtable pkvi_policy_contig_oracle_vtable;
extern const pkv_policy_vtable pkvi_policy_malloc_per_request_vtable;
extern const pkv_policy_vtable pkvi_policy_realloc_copy_vtable;
extern const pkv_policy_vtable pkvi_policy_contig_pow2_grow_vtable;
extern const pkv_policy_vtable pkvi_policy_token_vtable;
extern const pkv_policy_vtable pkvi_policy_vmm_vtable; // policy_vmm.c (vAttention)
extern const pkv_policy_vtable pkvi_policy_vmm_sync_vtable; // its synchronous ablation
// policies/policy_hybrid.c: KV cache groups over pkv_hybrid's layouts.
extern const pkv_policy_vtable pkvi_policy_hybrid_partition_vtable;
extern const pkv_policy_vtable pkvi_policy_hybrid_shared_page_vtable;
extern const pkv_policy_vtable pkvi_policy_hybrid_lcm_vtable;
extern const pkv_policy_vtable pkvi_policy_hybrid_vmm_vtable;
// Run mode over the model's hybrid store (run.c): the manager of a hybrid-partition,
// -shared-page or -lcm policy (NULL for any other), which from now on keeps the
// copies it takes; the manager's id of (r, child) (-1 if none); the copies taken
// since the last call, in order, group by group (borrowed until the next call).
pkv_hybrid *pkvi_policy_hybrid_run(pkvi_policy *pol);
pkv_seq_id pkvi_policy_hybrid_seq(const pkvi_policy *pol, uint32_t r, uint32_t child);
uint32_t pkvi_policy_hybrid_take_kept(pkvi_policy *pol, const pkv_block_copy **copies,
                                      const uint8_t **groups);

// The device memory model a malloc-per-request / realloc-copy replay of p uses
// (DEFAULT resolved; arena in run mode), and the label of p's allocator in
// reports (report.memory.device_mem). Defined in params.c.
pkv_device_mem pkvi_device_mem_of(const pkv_replay_params *p);
const char *pkvi_device_mem_label(const pkv_replay_params *p);

// ---- device memory models (device_mem.c) ----
// The cudaMalloc-style policies' allocator in sim mode: "cuda" (2 MiB granules,
// no placement) and "torch-caching" (PyTorch's caching allocator over a device
// of capacity bytes). Each allocation gets a handle; the device calls it makes
// (cudaMalloc / cudaFree of a segment) go to `calls`.
typedef struct pkvi_devmem pkvi_devmem;
typedef void (*pkvi_devmem_calls)(void *ctx, pkv_backend_call kind, uint64_t bytes);
pkv_status pkvi_devmem_create(pkv_device_mem kind, uint64_t capacity_bytes, pkvi_devmem_calls calls,
                              void *ctx, pkvi_devmem **out);
void pkvi_devmem_destroy(pkvi_devmem *m);
// Allocate `bytes` (> 0): *handle and *held, the bytes it occupies (rounded,
// split remainder excluded). PKV_ERR_OUT_OF_BLOCKS when the device cannot.
pkv_status pkvi_devmem_alloc(pkvi_devmem *m, uint64_t bytes, uint64_t *handle, uint64_t *held);
void pkvi_devmem_free(pkvi_devmem *m, uint64_t handle);
// Bytes an allocation of `bytes` takes from an empty device (stateless, for
// need(): cuda, its 2 MiB pages; torch-caching, the segment it cudaMallocs).
uint64_t pkvi_devmem_rounded(pkv_device_mem kind, uint64_t bytes);
// Bytes held by live allocations; bytes obtained from the device (segments).
uint64_t pkvi_devmem_held(const pkvi_devmem *m);
uint64_t pkvi_devmem_segments(const pkvi_devmem *m);
pkv_status pkvi_devmem_validate(const pkvi_devmem *m);

// ---- groups.c: the model's KV cache groups as the replay counts them ----
typedef struct pkvi_groups {
    uint32_t n;                              // groups (1 FULL group for a uniform model)
    int hetero;                              // the model has groups (num_kv_groups > 0)
    uint32_t elem_bytes;                     // stored bytes per KV element
    pkv_kv_group g[PKV_MAX_KV_GROUPS];       // [n]
    uint64_t bpt[PKV_MAX_KV_GROUPS];         // [n] bytes per token (uniform: the slot)
    uint64_t state_bytes[PKV_MAX_KV_GROUPS]; // [n] per sequence (state groups)
} pkvi_groups;
pkv_status pkvi_groups_init(pkvi_groups *G, const pkv_replay_params *p, uint64_t bytes_per_token);
// Distinct tokens group g keeps for nseq sequences of len tokens (shared: forked
// samples sharing a prompt of `prompt` tokens).
uint64_t pkvi_groups_kept(const pkvi_groups *G, uint32_t g, uint32_t nseq, uint32_t len,
                          uint32_t prompt, int shared);
// Bytes the model needs for such a request, every group (states included); each
// group's part is added to per_group[g] (optional, [n]).
uint64_t pkvi_groups_needed_bytes(const pkvi_groups *G, uint32_t nseq, uint32_t len,
                                  uint32_t prompt, int shared, uint64_t *per_group);
// The same for a request whose prefill computed positions [first, end) in this step
// (end = len once the prompt is done): each windowed group needs, besides what
// the next query sees, every token one of the chunk's queries saw.
uint64_t pkvi_groups_chunk_bytes(const pkvi_groups *G, uint32_t nseq, uint32_t len,
                                 uint32_t prompt, int shared, uint32_t first, uint32_t end,
                                 uint64_t *per_group);
// One decode of a sequence of ctx context tokens: adds the KV bytes its attention
// reads and writes to *bytes and the (layer, key) pairs it scores to *layer_keys.
void pkvi_groups_decode_read(const pkvi_groups *G, uint32_t ctx, double *bytes,
                             double *layer_keys);
// A prefill chunk of n queries at positions first .. first + n - 1: adds the KV bytes
// its attention reads (the keys its queries see, each once) and writes (n tokens)
// to *bytes, and the (layer, query, key) triples it scores to *layer_keys.
void pkvi_groups_prefill_read(const pkvi_groups *G, uint32_t first, uint32_t n, double *bytes,
                              double *layer_keys);

// ---- step executors ----

// A sequence in a step, for executors that need them (run mode).
typedef struct pkvi_step_seq {
    pkv_seq_id id;       // the policy's sequence id (-1: the policy keeps none)
    uint32_t r, child;   // request and sequence within it
    uint32_t new_tokens; // tokens computed for it in this step
    uint32_t ctx;        // its length after the step's appends
} pkvi_step_seq;

typedef struct pkvi_step_batch {
    uint32_t num_prefill_seqs;
    uint64_t prefill_tokens;       // tokens computed by prefills (incl. recompute)
    double prefill_attn_pairs;     // sum over prefills of (query, key) pairs
    uint64_t prefill_ctx_tokens;   // context tokens prefills read
    uint32_t num_decode_seqs;
    uint64_t decode_ctx_tokens;    // sum of decode sequences' context lengths
    // Models with KV cache groups only (groups.c): the decodes' KV bytes read and
    // written and (layer, key) pairs scored, each group over the keys it sees.
    double decode_kv_bytes, decode_layer_keys;
    // The same for the prefills: each query over the keys its group lets it see.
    double prefill_kv_bytes, prefill_layer_keys;
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
    // Optional (run mode): request r forked into n sequences / was released.
    pkv_status (*on_fork)(pkvi_executor *e, uint32_t r, uint32_t n);
    void (*on_release)(pkvi_executor *e, uint32_t r);
    // Optional (run mode), --preempt swap with room in the host pool: request r,
    // nseq sequences of len computed tokens each, is about to be swapped out
    // (called before the policy's swap_out or release: its memory still holds
    // them); on_swap_drop: that swap fell back to recompute (keep nothing);
    // on_swap_in: r was swapped back in (the policy holds it again), its K/V
    // must be back before it runs. A failure is returned by the next step.
    void (*on_swap_out)(pkvi_executor *e, uint32_t r, uint32_t nseq, uint32_t len);
    void (*on_swap_drop)(pkvi_executor *e, uint32_t r);
    void (*on_swap_in)(pkvi_executor *e, uint32_t r);
};

// Roofline model of params->model on params->gpu (defined in roofline.c).
pkv_status pkvi_executor_roofline_create(const pkv_replay_params *params, pkvi_executor **out);

// The decoder over the policy's seqset and pool (defined in run.c). The
// policy is borrowed and must outlive the executor.
pkv_status pkvi_executor_run_create(const pkv_replay_params *params, pkvi_policy *policy,
                                    pkvi_executor **out);
// Backend counters of a run executor into rep->alloc (frees the KV arena first).
pkv_status pkvi_executor_run_alloc_stats(pkvi_executor *e, pkv_replay_report *rep);

#endif // PKV_RUNTIME_REPLAY_INTERNAL_H

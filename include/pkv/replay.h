// SPDX-License-Identifier: MIT
// Trace replay: run a request trace through a continuous-batching scheduler
// with one KV-cache policy and report memory, allocation and latency figures
// whose exact meaning is given in DESIGN.md ("What the numbers mean") and in
// docs/BENCHMARKS.md, section 4.
//
// Modes: PKV_REPLAY_SIM runs only the memory manager and scheduler, with step
// time from a roofline model of (model preset, GPU preset); PKV_REPLAY_RUN
// executes the decoder (runtime/model.h) for every policy, makes the backend
// calls the policy stands for for real, and measures each step's wall time.
//
// Policies (one interface, pkv/policy.h, chosen by name or given as a table;
// references in DESIGN.md): "paged"
// (pkv_pool + pkv_seqset, block_size tokens per block), "contiguous-max"
// (max_seq_len per sequence), "contiguous-pow2" (Orca's Pow2: the power of two
// of prompt + output, reserved at admission), "contiguous-oracle" (exactly the
// tokens the sequence will hold), "malloc-per-request" (one backend allocation
// per sequence), "malloc-per-token" (one backend allocation per token, no copy,
// freed when the request ends), "realloc-copy" (a new allocation one token
// longer and a copy of the whole cache per token) and "contiguous-pow2-grow"
// (the power of two of the current length, regrown in place or by a copy).
// Contiguous policies place extents in one range of the budget with a
// free-extent allocator, so external fragmentation is measured; malloc-per-request
// and realloc-copy go through a device memory model (pkv_device_mem; cudaMalloc's
// 2 MiB pages by default). "vmm-sync" is vmm with every page map in line.
//
// Costs charged to the step in which they happen (sim mode): backend calls
// (from a pkv_alloc_model), device copies (a serialized kernel of their own),
// swap in both directions (host link). A step is the sum of its kernels'
// rooflines (docs/POLICIES.md, "Step time"). A run that completes no request reports NaN for every
// figure that needs one (JSON null) and says why in report.failure.
//
// Thread-safety: pkv_replay_run is reentrant; concurrent runs share nothing
// (the trace is only read).
#ifndef PKV_REPLAY_H
#define PKV_REPLAY_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "pkv/cache.h"
#include "pkv/model_config.h"
#include "pkv/policy.h"
#include "pkv/status.h"
#include "pkv/trace.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef enum pkv_policy {
    PKV_POLICY_PAGED = 0,
    PKV_POLICY_CONTIG_MAX = 1,
    PKV_POLICY_CONTIG_POW2 = 2,
    PKV_POLICY_CONTIG_ORACLE = 3,
    PKV_POLICY_MALLOC_PER_REQUEST = 4,
    PKV_POLICY_MALLOC_PER_TOKEN = 5,
    PKV_POLICY_REALLOC_COPY = 6,
    PKV_POLICY_CONTIG_POW2_GROW = 7,
    PKV_POLICY_VMM = 8,          // vAttention as published: virtual reservation, pages
                                 // mapped on demand by a background thread, one step
                                 // ahead (map-ahead, eager allocation of the prompt) and
                                 // deferred reclamation; the calls hide behind compute
    PKV_POLICY_VMM_SYNC = 9,     // ablation: the same pages mapped and unmapped in line,
                                 // each call stalling its step, no reuse of mappings
    // KV cache groups (0.3.0, issue 23; pkv/hybrid.h), each group's window rule
    // applied; for a uniform model each behaves as paged (partition, shared-page,
    // lcm: with the manager's per-group prefix cache; vmm: without one).
    PKV_POLICY_HYBRID_PARTITION = 10,   // one static pool per group
    PKV_POLICY_HYBRID_SHARED_PAGE = 11, // one pool of equal pages (vLLM's hybrid manager)
    PKV_POLICY_HYBRID_LCM = 12,         // Jenga: LCM large pages carved per group
    PKV_POLICY_HYBRID_VMM = 13,         // vmm per group: virtual buffers, pages mapped as
                                        // they fill, unmapped outside a window
    PKV_POLICY_COUNT = 14,
} pkv_policy;

// "paged", "contiguous-max", ... ("unknown" for a bad value).
const char *pkv_policy_name(pkv_policy policy);
// PKV_ERR_NOT_FOUND for an unknown name.
pkv_status pkv_policy_from_name(const char *name, pkv_policy *policy);

typedef enum pkv_preempt_mode {
    PKV_PREEMPT_RECOMPUTE = 0, // free the request's memory, recompute its tokens later
    PKV_PREEMPT_SWAP = 1,      // copy its KV to a bounded host pool (swap_space_bytes)
                               // and back; recompute when the pool is full
} pkv_preempt_mode;

const char *pkv_preempt_mode_name(pkv_preempt_mode mode); // "recompute" / "swap"

typedef enum pkv_batching {
    PKV_BATCHING_CONTINUOUS = 0, // iteration-level scheduling (Orca, vLLM)
    PKV_BATCHING_STATIC = 1,     // a batch padded to its longest prompt and output,
                                 // nothing admitted until all of it finishes
} pkv_batching;

const char *pkv_batching_name(pkv_batching batching); // "continuous" / "static"

// How device memory serves the per-allocation policies (malloc-per-request and
// realloc-copy) in sim mode; sources in docs/POLICIES.md, "Device memory models".
// The contiguous-* policies always place extents in one arena they carve from the
// budget, and run mode always places in an arena (its layout is real).
typedef enum pkv_device_mem {
    PKV_DEVICE_MEM_DEFAULT = 0, // cuda
    PKV_DEVICE_MEM_CUDA = 1,    // cudaMalloc: 2 MiB physical pages mapped into a virtual
                                // range: each allocation rounded up to 2 MiB, no
                                // external fragmentation beyond that granule
    PKV_DEVICE_MEM_ARENA = 2,   // first-fit in one preallocated range (a contiguous
                                // allocator inside an engine's reserved pool)
    PKV_DEVICE_MEM_TORCH_CACHING = 3, // PyTorch's CUDA caching allocator (torch.cat
                                // in a Hugging Face loop): 512-byte rounding, small
                                // and large pools, best-fit over cached blocks,
                                // splitting, cudaMalloc only when no cached block fits
} pkv_device_mem;

// "cuda" (also for DEFAULT), "arena", "torch-caching"; "unknown" for a bad value.
const char *pkv_device_mem_name(pkv_device_mem mem);
// PKV_ERR_NOT_FOUND for an unknown name.
pkv_status pkv_device_mem_from_name(const char *name, pkv_device_mem *mem);

// Most points a piecewise cost (pkv_alloc_call_cost.points) may have.
#define PKV_ALLOC_COST_MAX_POINTS 8

// Cost of one backend call of `bytes`. With num_points == 0: base_s +
// per_byte_s x bytes seconds. With num_points >= 1 (base_s and per_byte_s
// ignored): piecewise linear in bytes through (point_bytes[i], point_s[i]),
// point_bytes strictly increasing and point_s non-decreasing; below the first
// point the first point's cost, above the last the last segment's line
// continued (flat with one point). sync = 1: the call synchronizes the device
// (cudaFree, and cudaMalloc when it must), so its time adds to the step's;
// sync = 0: it overlaps the step's device work and only the part longer than the
// step shows.
typedef struct pkv_alloc_call_cost {
    double base_s;
    double per_byte_s;
    int sync;
    uint32_t num_points;
    uint64_t point_bytes[PKV_ALLOC_COST_MAX_POINTS];
    double point_s[PKV_ALLOC_COST_MAX_POINTS];
} pkv_alloc_call_cost;

// A cost model for backend allocation and free calls (sim mode). Plain data.
typedef struct pkv_alloc_model {
    char name[96];            // where it comes from, shown in reports
    pkv_alloc_call_cost alloc;
    pkv_alloc_call_cost free;
} pkv_alloc_model;

// No cost (name "none").
pkv_alloc_model pkv_alloc_model_none(void);
// A constant `seconds` per call of either kind, synchronizing (name "constant N us").
pkv_alloc_model pkv_alloc_model_constant(double seconds);
// Built-in models: "none", "cuda-boyer" (the default: cudaMalloc/cudaFree
// piecewise in size, 50 us flat to 2 MiB as Boyer measured to 512 KiB, then 50 us
// per further 2 MiB page, extrapolated; docs/POLICIES.md "Allocation cost"),
// "cuda-boyer-flat" (50 us per call whatever the size, the model before issue
// 21 item 5). PKV_ERR_NOT_FOUND otherwise.
pkv_status pkv_alloc_model_builtin(const char *name, pkv_alloc_model *model);
// Check a call cost: finite non-negative numbers, num_points <= the maximum,
// points increasing in bytes and non-decreasing in cost. PKV_ERR_INVALID_ARG if not.
pkv_status pkv_alloc_call_cost_check(const pkv_alloc_call_cost *cost);
// Read a model written by `bench_alloc --calibrate` (JSON, keys in DESIGN.md).
// On PKV_ERR_FORMAT / PKV_ERR_IO, `err` (optional, err_len bytes) says
// "path:line: field: problem".
pkv_status pkv_alloc_model_load(const char *path, pkv_alloc_model *model, char *err,
                                size_t err_len);
// Write `model` as the JSON object pkv_alloc_model_load reads (no newline).
pkv_status pkv_alloc_model_write_json(FILE *out, const pkv_alloc_model *model);
// Seconds one call of `bytes` costs under `cost`.
double pkv_alloc_call_seconds(const pkv_alloc_call_cost *cost, uint64_t bytes);

typedef enum pkv_replay_mode {
    PKV_REPLAY_SIM = 0,
    PKV_REPLAY_RUN = 1,
} pkv_replay_mode;

// A GPU for the roofline model. Nominal datasheet figures (see roofline.c).
typedef struct pkv_gpu_spec {
    char name[32];
    uint64_t mem_bytes;      // device memory
    double mem_bw;           // HBM bandwidth, bytes/s
    double peak_flops;       // dense fp16/bf16 tensor flops/s
    double host_link_bw;     // host <-> device bytes/s (PCIe), for swap
} pkv_gpu_spec;

// "a100-80g", "h100-80g", "h200-141g". PKV_ERR_NOT_FOUND for an unknown name.
pkv_status pkv_gpu_preset(const char *name, pkv_gpu_spec *spec);
const char *const *pkv_gpu_preset_names(void); // NULL-terminated, static

// Parse a size, the grammar every pagedkv tool accepts: a non-negative decimal
// number (a fraction only before a unit) and a unit, letters in any case: none or
// B = bytes; K, M, G, T or KiB, MiB, GiB, TiB = powers of 1024 ("40G" = "40GiB");
// KB, MB, GB, TB = powers of 1000 ("80GB" = 80e9). A fraction rounds to the nearest
// byte ("1.5G"). PKV_ERR_INVALID_ARG for anything else or overflow.
pkv_status pkv_size_parse(const char *text, uint64_t *bytes);

// One step as the replay sees it (for timelines). Plain data.
typedef struct pkv_replay_step {
    uint64_t index;          // 0-based step number
    double time_s;           // simulated (sim) or replay (run) clock at the step's end
    double step_s;           // the step's duration
    uint32_t running;        // sequences in the step (prefilled + decoded)
    uint32_t waiting;        // requests waiting (new or preempted) after admission
    uint64_t used_bytes;     // token states stored (distinct physical slots)
    uint64_t reserved_bytes; // held by the policy for live sequences
    uint64_t reservation_bytes; // reserved slots that will be filled later (chunked
                                // prefill: prompt slots no chunk has computed yet)
    uint64_t ext_frag_bytes; // free bytes the queue head could not use (0 if none)
    uint64_t free_bytes;     // capacity - reserved
    uint64_t capacity_bytes;
    // Capacity breakdown (vLLM paper, fig. 2): these five add up to capacity_bytes.
    // token states = used; reserved = reservation; internal = reserved_bytes -
    // used - reservation; external = ext_frag; free = free_bytes - external.
    uint64_t internal_frag_bytes;
    uint64_t idle_free_bytes;    // free_bytes - ext_frag_bytes
    double alloc_s;              // backend-call seconds charged to this step
    uint32_t prefill_tokens;     // tokens prefilled in this step (incl. padding)
    // The step's modelled work (the roofline's count, in both modes; for
    // calibration): flops and bytes moved.
    double work_flops, work_bytes;
    // A model with KV cache groups (0.3.0; num_groups 0 for a uniform model): per
    // group, what the model needs this step (the sum over groups is used_bytes
    // before its rounding to whole slots) and what the layout holds for it (a
    // group-unaware policy: every reserved slot at the group's bytes per token).
    uint32_t num_groups;
    struct pkv_replay_step_group {
        uint64_t needed_bytes;
        uint64_t held_bytes;
    } groups[PKV_MAX_KV_GROUPS];
} pkv_replay_step;

// A recorded schedule (opaque): the admissions, preemptions and rejections a
// replay made, by step. Replaying it with another policy (params.schedule)
// gives every policy the same admission and step sequence, so that memory
// effects are separated from timing effects (docs/POLICIES.md, "Fixed schedule").
typedef struct pkv_replay_schedule pkv_replay_schedule;

// Sim mode: what share of the GPU's peak a step achieves, and a fixed cost per
// step (kernel launches, scheduling). Each kernel of a step takes max(flops /
// (peak_flops x compute_frac), bytes / (mem_bw x bw_frac)); the step, their sum
// + step_overhead_s. Plain data.
// All three numbers 0 (what pkv_replay_params_default() sets) means "the
// published figures of params.gpu" (pkv_sim_efficiency_for_gpu), resolved when
// the replay starts, so that changing params.gpu changes them too; otherwise
// each must be in its range. pkv_sim_efficiency_peak() is the plain roofline.
typedef struct pkv_sim_efficiency {
    double bw_frac;         // (0, 1], or 0 with the others 0: the GPU's default
    double compute_frac;    // (0, 1], or 0 as above
    double step_overhead_s; // >= 0
    char source[96];        // where the figures come from (shown in reports)
} pkv_sim_efficiency;

// The plain roofline: 1, 1, 0 (100 % of the datasheet peak, no overhead), an
// upper bound on speed.
pkv_sim_efficiency pkv_sim_efficiency_peak(void);

// The default efficiency of a GPU preset, from published whole-step
// measurements of real inference engines (sources in docs/POLICIES.md, "Sim
// efficiency", and in roofline.c): bw_frac from batch-1 decode, compute_frac
// from a batch-1 prefill, each derived with the roofline's own work count so
// that sim mode reproduces the measured step (H100 and H200 compute: the share
// of the FP8 peak of an FP8 prefill, no fp16 figure being found); overhead 0
// (the measured steps include it). Never 1.
// `gpu` must equal a preset (name, mem_bw and peak_flops): a GPU of one's own
// gets the plain roofline and PKV_ERR_NOT_FOUND, *eff still written.
pkv_status pkv_sim_efficiency_for_gpu(const pkv_gpu_spec *gpu, pkv_sim_efficiency *eff);

// A calibration of sim mode against run mode on one machine and model
// (pkv_replay_calibrate): the achieved bandwidth and compute, the per-step
// overhead, and the measured cost of one backend call. Plain data.
typedef struct pkv_replay_calibration {
    char model[32];          // the model preset it was measured with
    char device[16];         // "cpu" or "cuda"
    uint32_t dtype_bytes;    // of the run (4: fp32)
    double achieved_bw;      // bytes/s
    double achieved_flops;   // flop/s
    double step_overhead_s;
    pkv_alloc_model alloc;   // measured per-call costs (constant per call, synchronizing)
    uint64_t steps;          // steps fitted
    double median_rel_err;   // of the fitted step times
} pkv_replay_calibration;
// Where a replay stands, passed to on_progress after every step. Plain data.
typedef struct pkv_replay_progress {
    uint64_t steps;          // steps done
    uint64_t requests_done;  // completed + rejected
    uint64_t requests_total; // requests in the trace
    double time_s;           // simulated (sim) or replay (run) clock
} pkv_replay_progress;

// A completed request, passed to on_request. Plain data; times on the replay clock.
typedef struct pkv_replay_request_done {
    uint64_t index;          // 0-based position in the trace
    double arrival_s;
    double first_token_s;    // end of its prefill step
    double finish_s;         // end of the step that emitted its last token
    uint32_t prompt_tokens;
    uint32_t output_tokens;  // per sample
    uint32_t n;              // samples
} pkv_replay_request_done;

typedef struct pkv_replay_params {
    pkv_replay_mode mode;          // default PKV_REPLAY_SIM
    pkv_policy policy;             // default paged
    // A policy of one's own (pkv/policy.h; borrowed, outlives the call): when
    // set, it is replayed instead of `policy`. Default NULL.
    const pkv_policy_vtable *custom_policy;
    // Fixed schedule (borrowed, outlives the call; from pkv_replay_schedule_record
    // on the same trace): admit, preempt and reject exactly where it did, step by
    // step, instead of deciding from arrival times. Default NULL (own schedule).
    const pkv_replay_schedule *schedule;
    uint32_t block_size;           // paged: tokens per block, default 16
    uint32_t max_seq_len;          // 0 (default): the model's context window
    pkv_preempt_mode preempt;      // default recompute
    uint32_t max_batch;            // max sequences per step, default 256
    uint32_t max_tokens_per_step;  // prefill + decode tokens per step, default 8192
    double watermark;              // fraction of capacity kept free at admission, 0.01
    pkv_model_config model;        // default preset "llama2-7b"
    pkv_gpu_spec gpu;              // default preset "a100-80g"
    pkv_sim_efficiency sim_eff;    // default all 0: the published figures of `gpu`
                                   // (pkv_sim_efficiency_for_gpu); the plain roofline:
                                   // sim_eff = pkv_sim_efficiency_peak()
    uint64_t kv_mem_bytes;         // 0 (default): (gpu.mem - weights) x gpu_util
    double gpu_util;               // default 0.9
    uint32_t dtype_bytes;          // bytes per KV and weight element, default 2 (fp16)
    pkv_dtype kv_dtype;            // 0 (PKV_DTYPE_F32, the default): KV elements of
                                   // dtype_bytes like the weights; PKV_DTYPE_INT8,
                                   // _FP8_E4M3 or _FP8_E5M2: an 8-bit KV cache (sim mode
                                   // only; int8 counts its per-token scales), the
                                   // weights staying at dtype_bytes
    // Sim mode: what backend calls cost; default pkv_alloc_model_builtin("cuda-boyer").
    pkv_alloc_model alloc_model;
    uint64_t swap_space_bytes;     // host pool for PKV_PREEMPT_SWAP, default 4 GiB (vLLM)
    pkv_batching batching;         // default continuous
    pkv_device_mem device_mem;     // sim, malloc-per-request and realloc-copy: the device
                                   // allocator model; default PKV_DEVICE_MEM_DEFAULT (cuda)
    int copy_overlap;              // sim: device copies run on a second stream during the
                                   // step's linear layers, sharing their HBM bandwidth
                                   // (docs/POLICIES.md, "Step time"); default 0: each
                                   // copy is serialized device work before the attention
    uint32_t chunked_prefill;      // 0 (default): off; else prefill + decode tokens per
                                   // step, long prompts split across steps
    double load_scale;             // arrivals divided by this (> 0, and every scaled arrival
                                   // finite, else PKV_ERR_INVALID_ARG), default 1
    int prefix_sharing;            // paged, hybrid-partition / -shared-page / -lcm, sim
                                   // mode: prefix cache over the trace's shared prefixes
                                   // (prefix_group, Mooncake hash_ids); default 1
    uint64_t vmm_page_bytes;       // vmm: physical page per layer buffer (K or V of one
                                   // layer), a multiple of 4 KiB; default 2 MiB
    int vmm_map_ahead;             // vmm: map the next page during the step before it is
                                   // needed, and a new request's prompt pages ahead of its
                                   // prefill (vAttention's overlap and eager allocation);
                                   // default 1 (vmm-sync: always 0)
    int vmm_defer_reclaim;         // vmm: a finished request's pages stay mapped for the
                                   // next request (vAttention's deferred reclamation);
                                   // default 1 (vmm-sync: always 0)
    // Run mode.
    int run_cuda;                  // 1: CUDA backend, 0 (default): host
    uint32_t run_threads;          // CPU threads, 0 = all
    uint64_t seed;                 // weights and token ids in run mode, default 1
    // Run mode: a decoder to run (borrowed, NULL = build one from model, seed,
    // run_cuda and run_threads for this call). Its config must equal `model` and
    // its device the run's (else PKV_ERR_INVALID_ARG); it must not be used
    // elsewhere during the call. A sweep of many points builds one per worker
    // thread instead of one per point (a 7B model's random weights take seconds).
    struct pkv_model *run_model;
    int validate;                  // 1: check every invariant after every step (slow)
    // Optional callbacks (may be NULL); `user` is passed back. on_progress runs
    // after every step (keep it cheap); a nonzero return stops the replay, which
    // then reports what it replayed so far with report.partial = 1.
    void (*on_step)(void *user, const pkv_replay_step *step);
    int (*on_progress)(void *user, const pkv_replay_progress *progress);
    // Called once per completed request, in completion order (latency CDFs).
    void (*on_request)(void *user, const pkv_replay_request_done *request);
    void *user;
} pkv_replay_params;

pkv_replay_params pkv_replay_params_default(void);

// The efficiency a sim replay of `params` uses: params->sim_eff, or, when it is
// all 0 (the default), pkv_sim_efficiency_for_gpu(&params->gpu) (the plain
// roofline for a GPU of one's own). PKV_ERR_INVALID_ARG for a number out of range.
pkv_status pkv_replay_sim_efficiency(const pkv_replay_params *params, pkv_sim_efficiency *eff);

// The share of params->gpu.host_link_bw that swaps reach in sim mode: a GPU
// preset's published achieved fraction (nvbandwidth figures, docs/POLICIES.md
// "Host link") when params->sim_eff is the default (all 0) and the link is the
// preset's; 1 otherwise (an explicit efficiency, a GPU of one's own, NULL). Pure.
double pkv_replay_host_link_frac(const pkv_replay_params *params);

// KV bytes per token for these params (pkv_cache_bytes_per_token of the KV dtype:
// dtype_bytes, or kv_dtype when it is 8-bit); 0 for invalid params.
uint64_t pkv_replay_kv_bytes_per_token(const pkv_replay_params *params);

// KV budget in bytes for these params (kv_mem_bytes, or the GPU formula above).
// PKV_ERR_INVALID_ARG if the weights do not fit the GPU.
pkv_status pkv_replay_kv_budget(const pkv_replay_params *params, uint64_t *bytes);

// The report of one run. Plain data. Fractions are in [0, 1].
typedef struct pkv_replay_report {
    char policy[32];
    char mode[8];              // "sim" or "run"
    uint32_t block_size;       // paged: tokens per block; others: 1 (token granularity)
    uint64_t kv_bytes_per_token;
    struct {
        uint64_t total;        // requests in the trace
        uint64_t completed;
        uint64_t rejected;     // longer than max_seq_len, or larger than the budget alone
        uint64_t rejected_too_long;  // final length > max_seq_len, or n > max_batch
        uint64_t rejected_no_memory; // could not run alone in the budget
    } requests;
    // Empty when a request completed; else why none did, e.g. "KV budget 8 MiB
    // holds no request of this trace: the smallest needs 40 MiB".
    char failure[192];
    struct {
        uint64_t capacity_bytes;
        uint64_t peak_reserved_bytes;
        uint64_t peak_used_bytes;
        double waste_frac;          // time-avg (reserved - used) / reserved
        double internal_frag_frac;  // time-avg never-filled reserved / reserved
        double reservation_frac;    // time-avg filled-later reserved / reserved
        double external_frag_frac;  // time-avg unusable free bytes / capacity
        struct {                    // time-avg shares of the capacity; they sum to 1
            double token_states;    // slots holding a token's K/V
            double reserved;        // reserved, filled later by a live sequence
            double internal_frag;   // reserved, never filled
            double external_frag;   // free, but the queue head could not use it
            double free;            // free and usable
        } breakdown;
        double padding_frac;        // static batching: time-avg share of the capacity
                                    // holding padding tokens (part of token_states)
        char device_mem[16];        // the allocator placing the KV: "pool" (paged),
                                    // "arena", "cuda", "torch-caching", "vmm", "token"
                                    // (malloc-per-token), "custom" (a plugin)
        // Per KV cache group (0.3.0, issue 23), only for a model with groups
        // (model.num_kv_groups > 0; num_groups 0 otherwise, so that a uniform
        // model's report is what it was). For such a model "used" (token states)
        // is what the model needs: per group the keys the step's queries attend to
        // (pkv_kv_group_tokens_kept of a decoded sequence; a prefill chunk's
        // queries together see from their first one's window on; a forked
        // request's prompt once), so that the
        // blocks a layout holds for tokens that left a window count as internal
        // fragmentation (waste), as Jenga counts them.
        uint32_t num_groups;
        struct pkv_replay_group_report {
            char kind[12];             // pkv_layer_kind_name
            uint32_t layers;           // layers in the group
            uint32_t window;           // sliding window / chunk (0: none)
            uint64_t bytes_per_token;  // at the KV dtype (0: state group)
            double needed_frac;        // time-avg bytes the model needs / capacity
            double held_frac;          // time-avg bytes the group's blocks hold / capacity
                                       // (a group-unaware policy: reserved slots x
                                       // bytes_per_token, every layer keeps every token)
            double tokens_held_mean;   // time-avg token slots held
            uint64_t peak_held_bytes;
            uint64_t blocks_released;  // blocks freed by the window rule
            uint64_t cached_tokens;    // prompt tokens served from a prefix cache
                                       // (group-unaware policies: the policy's total)
        } groups[PKV_MAX_KV_GROUPS];
    } memory;
    struct {
        uint64_t backend_alloc_calls;
        uint64_t backend_free_calls;
        double backend_alloc_seconds; // run: measured; sim: from alloc_model
        double backend_free_seconds;
        double step_seconds;          // the part charged to steps: what lengthened
                                      // them (the arena of paged and contiguous-* is
                                      // set up before the first)
        double overlapped_seconds;    // calls made during steps that their device work
                                      // hid (overlapping calls up to the step's length)
        int seconds_measured;         // 1 in run mode, 0 in sim mode
        char model[96];               // sim: alloc_model.name; run: "measured"
    } alloc;
    struct {
        double step_p50_ms, step_p90_ms, step_p99_ms, step_max_ms;
        double ttft_p50_ms, ttft_p99_ms;
        double tpot_p50_ms, tpot_p99_ms;
        // The vLLM paper's normalized latency: mean over completed requests of
        // (completion - arrival) / output tokens, in ms per token.
        double norm_ms_per_token;
    } latency;
    struct {
        double output_tokens_per_s;  // completed output tokens / makespan
        uint64_t output_tokens;
        double makespan_s;           // first arrival to last completion
    } throughput;
    struct {
        double mean;  // sequences per step, over steps with work
        uint32_t max;
    } batch;
    struct {
        double prefill_frac;       // share of busy time spent in prefill (a mixed step
                                   // is split in proportion of its modelled parts)
        double decode_frac;        // 1 - prefill_frac
        double decode_compute_util; // sim: decode-phase steps' (no prefill; a decode
                                    // or a swap) flops / (time x peak)
        double decode_bw_util;      // sim: their bytes (kernels, copies, swaps) /
                                    // (time x bandwidth); NaN in run
        double busy_s;              // sum of step durations
    } time;
    uint64_t padding_tokens;  // static batching: padding tokens computed
    uint64_t steps;
    uint64_t preemptions;     // requests preempted (each time)
    uint64_t forks;           // child sequences created for n > 1
    uint64_t cow_copies;      // copy-on-write block copies (paged)
    uint64_t prefix_cached_tokens; // paged: prompt tokens served by the prefix cache
    uint64_t copy_bytes;      // KV bytes copied on device: CoW, fork copies, regrowth
    uint64_t swap_bytes;      // KV bytes moved to and from the host pool (out + in)
    uint64_t swap_out_bytes, swap_in_bytes;
    uint64_t swap_fallbacks;  // preemptions that recomputed because the pool was full
    double replay_seconds;    // host wall time of the replay itself
    // "own", or "fixed-from NAME" when params.schedule was set (NAME: the policy
    // that recorded it).
    char schedule[48];
    // Fixed schedule: events this policy could not follow (an admission it had
    // to delay, a preemption of its own, a rejection the reference did not
    // make, a recorded preemption of a request it was not running). 0: it
    // replayed exactly the recorded schedule. Always 0 for "own".
    uint64_t schedule_deviations;
    struct {
        // Run mode: an order-independent hash of the greedy next token at every
        // position the decoder computed (each position once), and how many. The
        // layout must not change the math: every policy gives the same hash on
        // the same trace, model and seed when they complete the same requests.
        uint64_t token_hash;
        uint64_t tokens;
        // The layout the K/V lived in: "paged" (the policy's block tables),
        // "contiguous" (each sequence in the extent the policy placed it in, read
        // by the contiguous kernel), "vmm" (a slot of a VMM space per sequence,
        // pages mapped as it grows), "hybrid" (a hybrid policy's pools),
        // "hybrid-vmm" (a slot of a pkv_hybrid_vmm, windows unmapped as they
        // slide) or "token-table" (a block-size-1 table); and
        // the K/V bytes the executor copied (forks, moves, copy-on-write).
        char layout[16];
        uint64_t copied_bytes;
    } run;
    int partial;              // 1: on_progress stopped the replay before the trace ended
} pkv_replay_report;

// Replay `trace` (borrowed) with `params` into *report (caller-owned).
// PKV_ERR_INVALID_ARG for bad params (named by nothing else: check the ranges
// above), PKV_ERR_UNSUPPORTED for run mode where the build lacks it, or with
// static batching or chunked prefill. Memory pressure never fails the call:
// requests are preempted, requests that can never fit are rejected, and a run
// that completes none returns PKV_OK with report->failure set. The policy's
// answers are checked every step, in every mode (the rules of pkv/policy.h
// that are cheap: a status its slot may return, used <= reserved <= capacity,
// cached <= prompt, 1 <= granularity <= capacity): one that breaks them stops
// the run with PKV_ERR_CORRUPT (PKV_ERR_OUT_OF_MEMORY if a slot returned that)
// and report->failure naming the policy, the slot and the value, e.g.
// "policy 'mine': slot 'admit': cached 4294967295 > prompt 12 (request 3)".
// report->failure is empty after every other error.
pkv_status pkv_replay_run(const pkv_trace *trace, const pkv_replay_params *params,
                          pkv_replay_report *report);

// Replay `trace` with `params` (its policy is the reference; params->schedule
// must be NULL) and record the schedule it took into *out (owned by the caller:
// pkv_replay_schedule_destroy). report: optional, receives the reference run's
// report. Errors as pkv_replay_run.
pkv_status pkv_replay_schedule_record(const pkv_trace *trace, const pkv_replay_params *params,
                                      pkv_replay_schedule **out, pkv_replay_report *report);
void pkv_replay_schedule_destroy(pkv_replay_schedule *schedule); // NULL does nothing
// Steps and events a schedule holds (for reports and tests).
uint64_t pkv_replay_schedule_steps(const pkv_replay_schedule *schedule);
uint64_t pkv_replay_schedule_events(const pkv_replay_schedule *schedule);

// Fit a calibration to run-mode steps (borrowed, n entries, from on_step of
// run-mode replays of one model on one machine): achieved bandwidth, compute
// and per-step overhead minimizing the duration-weighted relative error of
// max(flops / C, bytes / B) + overhead against each step's measured time
// (without its charged backend calls). alloc_s / alloc_calls, free_s /
// free_calls: measured call totals for the per-call cost (0 calls: none; the
// tool passes the calls made inside steps, not the arena's).
// PKV_ERR_INVALID_ARG with fewer than 8 usable steps.
pkv_status pkv_replay_calibrate(const pkv_replay_step *steps, size_t n, double alloc_s,
                                uint64_t alloc_calls, double free_s, uint64_t free_calls,
                                pkv_replay_calibration *out);
// Write / read a calibration as JSON (keys in docs/POLICIES.md, "Calibration").
// On PKV_ERR_FORMAT / PKV_ERR_IO, `err` (optional) says "path: field: problem".
pkv_status pkv_replay_calibration_write(FILE *out, const pkv_replay_calibration *cal);
pkv_status pkv_replay_calibration_load(const char *path, pkv_replay_calibration *cal, char *err,
                                       size_t err_len);
// Make params' sim mode model the calibrated machine: gpu rates, efficiency 1
// with the overhead, the alloc model, the model preset and dtype.
pkv_status pkv_replay_params_apply_calibration(pkv_replay_params *params,
                                               const pkv_replay_calibration *cal,
                                               const char *source);

// Write {"trace": {...}, "config": {...}, "runs": [...]} to `out` (borrowed).
// trace_name: shown as trace.path (borrowed). reports: num_reports entries.
pkv_status pkv_replay_write_json(FILE *out, const char *trace_name, const pkv_trace *trace,
                                 const pkv_replay_params *params,
                                 const pkv_replay_report *reports, size_t num_reports);

// Write report->memory.groups as a JSON array (no newline): one object per group
// with the keys of pkv_replay_group_report ("kind", "layers", "window",
// "bytes_per_token", "needed_frac", "held_frac", "tokens_held_mean",
// "peak_held_bytes", "blocks_released", "cached_tokens"). pkv_replay_write_json
// and pkv-replay's --json write it as memory.groups for a model with groups.
pkv_status pkv_replay_write_groups_json(FILE *out, const pkv_replay_report *report);

// Write a human-readable table of the reports, one row per policy.
pkv_status pkv_replay_write_table(FILE *out, const pkv_replay_report *reports,
                                  size_t num_reports);

#ifdef __cplusplus
}
#endif

#endif // PKV_REPLAY_H

// SPDX-License-Identifier: MIT
// The replay engine's state, shared by its files: engine.c (the step loop:
// arrivals, decode, preempt, time, retire, and the report), admit.c (admission
// under continuous or static batching, and prefill, chunked or whole) and
// replay.c (pkv_replay_run: parameters, policy and executor set-up). Not
// installed.
#ifndef PKV_RUNTIME_REPLAY_ENGINE_H
#define PKV_RUNTIME_REPLAY_ENGINE_H

#include <stdint.h>

#include "replay_internal.h"

enum { RS_PENDING = 0, RS_WAITING, RS_RUNNING, RS_DONE, RS_REJECTED };

typedef struct req_state {
    uint32_t emitted;  // tokens emitted so far
    uint32_t nseq;     // live sequences (0 when not admitted)
    uint8_t status;
    uint8_t restore;   // 1: preempted, comes back with nseq sequences
    uint8_t swapped;   // restore by swap-in rather than recompute
    uint8_t fresh;     // its prefill (or swap-in) completed in the current step
    uint8_t prefilling; // admitted, prompt not fully computed yet (chunked)
    uint32_t pad_prompt, pad_output; // static batching: padded lengths (0: none)
    uint32_t pf_len;   // tokens sequence 0 holds once the prefill completes
    uint32_t pf_done;  // tokens of sequence 0 computed (or cached) so far
    uint32_t pf_first; // the first position the latest prefill chunk computed
    uint64_t pf_step;  // 1 + the step that ran that chunk (0: none yet)
    uint64_t pf_extra; // restored samples' own tokens, computed with the last chunk
    double pf_extra_pairs;
    uint64_t pf_extra_ctx;
    uint64_t swap_bytes; // bytes it holds in the host pool
    double first_token_s;
} req_state;

// Schedule events (fixed-schedule mode), in the order the reference made them.
// EV_ROUND: the step ended without running (its preemptions left nothing
// running and the queue head was dropped); the events after it belong to the
// next call of engine_step, which has the same step index.
enum { EV_ADMIT = 0, EV_PREEMPT, EV_REJECT_LONG, EV_REJECT_MEM, EV_ROUND };

typedef struct sched_event {
    uint64_t step; // index of the step (0-based) in which it happened
    uint32_t r;
    uint8_t kind;
    // EV_PREEMPT made by decode(): the sequence whose growth failed (request
    // at_r, sequence at_c), so that a replay preempts at the same point of the
    // step, between the same allocations (placement depends on their order);
    // at_r = UINT32_MAX: none.
    uint32_t at_r, at_c;
} sched_event;

struct pkv_replay_schedule {
    sched_event *ev; // [n]
    size_t n, cap;
    uint64_t steps;  // steps the reference executed
    char ref[32];    // the reference policy's name
};

typedef struct dvec {
    double *v;
    size_t n, cap;
} dvec;

// Time-weighted sums over steps (weights: step durations).
typedef struct accum {
    double w;                 // sum of dt over steps with reserved memory
    double waste, internal, reservation, ext;
    double wb;                // sum of dt over all steps (breakdown)
    double b_tok, b_resv, b_int, b_ext, b_free, b_pad;
    double prefill_s, decode_s, busy_s;
    double dec_s, dec_flops, dec_bytes; // decode-only steps
    double alloc_step_s;   // backend-call time that lengthened steps
    double alloc_hidden_s; // backend-call time overlapped by steps' device work
    // Per KV cache group (models with groups): time-weighted bytes needed and held,
    // tokens held.
    double g_need[PKV_MAX_KV_GROUPS], g_held[PKV_MAX_KV_GROUPS], g_tok[PKV_MAX_KV_GROUPS];
} accum;

typedef struct engine {
    const pkv_replay_params *prm;
    const pkv_trace_request *reqs;
    uint32_t n;
    pkvi_policy *pol;    // &polh
    pkvi_policy polh;
    pkvi_executor *ex;
    pkvi_executor *work; // run mode: the roofline, for each step's modelled work
    uint64_t bpt;        // KV bytes per token
    pkvi_groups groups;  // the model's KV cache groups (groups.c)
    uint64_t g_peak_held[PKV_MAX_KV_GROUPS];
    uint32_t max_len;    // max_seq_len
    uint64_t wm_slots;   // watermark in slots
    double t;            // the clock
    req_state *st;
    uint32_t *running;   // admission order, oldest first
    uint32_t run_count;
    uint64_t run_seqs;   // sum of n over running requests (batch limit)
    uint32_t *wq;        // ring buffer of waiting requests, [n + 1]
    uint32_t wq_head, wq_len;
    pkvi_step_seq *seqs; // run-mode step sequences
    uint32_t seqs_cap, num_seqs;
    // The step being built.
    pkvi_step_batch b;
    int preempted;
    uint64_t ext_frag;
    uint64_t budget_left; // chunked prefill: tokens left in this step
    // Totals.
    uint32_t ai;          // next arrival
    uint64_t finished, steps, batch_sum;
    uint32_t batch_max;
    uint64_t peak_used, peak_reserved, copy_slots_seen;
    uint64_t preemptions, forks, padding_tokens;
    uint64_t swap_used, swap_out, swap_in, swap_fallbacks;
    uint64_t rejected, rejected_long, rejected_mem, completed, output_tokens;
    uint64_t min_need_slots;  // smallest need among requests rejected for memory
    uint64_t min_long_len;    // shortest final length among too-long rejects
    double last_finish;
    // Fixed schedule: recording (rec) or replaying (fixed, from event fi, at
    // schedule step sk; queued[r]: r is in the waiting queue).
    pkv_replay_schedule *rec;
    const pkv_replay_schedule *fixed;
    size_t fi;
    uint64_t sk, deviations;
    const sched_event **due; // [n]: recorded preemptions of this step left for decode()
    uint32_t num_due;
    uint32_t grow_r, grow_c; // the sequence decode() is growing (UINT32_MAX: none)
    uint8_t *queued;
    uint32_t nwait;  // fixed schedule: arrived requests (r < ai) not admitted, for timelines
    int rec_failed;  // an event could not be recorded (out of memory)
    double norm_sum;      // sum over completed requests of (finish - arrival) / output tokens
    dvec step_s, ttft, tpot;
    accum acc;
} engine;

static inline double arrival(const engine *e, uint32_t r) {
    return e->reqs[r].arrival_s / e->prm->load_scale;
}

static inline void wq_push_back(engine *e, uint32_t r) {
    if (e->queued) e->queued[r] = 1;
    e->wq[(e->wq_head + e->wq_len) % (e->n + 1)] = r;
    e->wq_len++;
}

static inline void wq_push_front(engine *e, uint32_t r) {
    if (e->queued) e->queued[r] = 1;
    e->wq_head = (e->wq_head + e->n) % (e->n + 1);
    e->wq[e->wq_head] = r;
    e->wq_len++;
}

static inline uint32_t wq_front(const engine *e) { return e->wq[e->wq_head]; }
static inline uint32_t wq_at(const engine *e, uint32_t i) { return e->wq[(e->wq_head + i) % (e->n + 1)]; }

static inline void wq_pop_front(engine *e) {
    if (e->queued) e->queued[e->wq[e->wq_head]] = 0;
    e->wq_head = (e->wq_head + 1) % (e->n + 1);
    e->wq_len--;
}

// Every status change goes through here, so that a fixed schedule can count the
// arrived requests that wait (the own schedule's queue length).
static inline void set_status(engine *e, uint32_t r, uint8_t status) {
    const uint8_t old = e->st[r].status;
    if (e->fixed && r < e->ai) {
        e->nwait -= old == RS_PENDING || old == RS_WAITING;
        e->nwait += status == RS_PENDING || status == RS_WAITING;
    }
    e->st[r].status = status;
}

// Lengths as the engine runs them: static batching pads them.
static inline uint32_t prompt_of(const engine *e, uint32_t r) {
    return e->st[r].pad_prompt ? e->st[r].pad_prompt : e->reqs[r].prompt_tokens;
}
static inline uint32_t output_of(const engine *e, uint32_t r) {
    return e->st[r].pad_output ? e->st[r].pad_output : e->reqs[r].output_tokens;
}
// In 64 bits: prompt + output of a valid trace can pass 2^32 (issue 15). Arrival
// rejects a request whose final length exceeds max_len (a uint32), so every
// admitted request's final length fits a uint32.
static inline uint64_t final_len(const engine *e, uint32_t r) {
    return (uint64_t)prompt_of(e, r) + output_of(e, r) - 1;
}
static inline uint32_t width(const engine *e, uint32_t r) { return output_of(e, r) > 1 ? e->reqs[r].n : 1; }

// ---- defined in admit.c ----
// What request r needs when it is (re)admitted now.
void pkvi_engine_make_admit(const engine *e, uint32_t r, pkvi_admit *a);
// Peak slots a request needs alone under the policy (watermark excluded).
uint64_t pkvi_engine_need_slots(const engine *e, const pkvi_admit *a);
// Slots a request's KV occupies (what a swap moves).
uint64_t pkvi_engine_request_slots(const engine *e, uint32_t r, uint32_t nseq, uint32_t len);
// Chunked prefill: running requests still prefilling compute their next chunk.
pkv_status pkvi_engine_prefill(engine *e);
// Admit waiting requests (continuous or static batching) and start their prefill.
pkv_status pkvi_engine_admit(engine *e);

// ---- defined in engine.c ----
// Record an event when recording a schedule (-1 when out of memory).
int pkvi_engine_record(engine *e, uint32_t r, int kind);
// Add sequence `child` of request r to the step's list (run-mode executors);
// -1 when out of memory.
int pkvi_engine_push_seq(engine *e, uint32_t r, uint32_t child, uint32_t new_tokens, uint32_t ctx);
// Release request r in the policy and in the executor (run mode mirrors it).
void pkvi_engine_release(engine *e, uint32_t r);
// Replay the whole trace into *rep; budget (bytes) for the failure message.
pkv_status pkvi_engine_run(engine *e, uint64_t budget, pkv_replay_report *rep);
// A run that completed nothing: NaN figures, and why into rep->failure.
void pkvi_engine_report_failed(const engine *e, uint64_t budget, pkv_replay_report *rep);

#endif // PKV_RUNTIME_REPLAY_ENGINE_H

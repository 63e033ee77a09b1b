// SPDX-License-Identifier: MIT
// The replay engine: a scheduler with iteration-level (continuous) or static
// batching that drives one KV policy and one step executor over a trace.
//
// One step is engine_step():
//   arrivals(): requests that arrived by now join the queue (or are rejected
//     when they can never run: too long, too many samples, too big alone);
//   decode(): every running sequence appends the slot of its last emitted token
//     (oldest request first); when memory is short, preempt() takes the newest
//     running request (recompute: its memory is freed and it is requeued at the
//     head; swap: its KV also moves to the bounded host pool, both directions
//     charged to the host link; a full pool falls back to recompute);
//   prefill(): running requests whose prompt is still being prefilled in chunks
//     (--chunked-prefill) compute their next chunk;
//   admit(): if nothing was preempted, waiting requests are admitted in FCFS
//     order while the policy can hold them with `watermark` of the capacity left
//     free, within max_batch sequences and the step's token budget (the first
//     prefill of a step may exceed it alone); static batching admits a whole
//     padded batch, and only when nothing runs;
//   time(): memory is sampled, the executor gives the step's duration, and the
//     backend calls the policy made since the last step are charged (a
//     synchronizing call adds its time; an overlapping one shows only where it is
//     longer than the step);
//   retire(): prefills that completed emit their first token (n > 1 requests
//     fork), decodes emit one token each, and finished requests free their memory
//     (those frees are charged to the next step, which they delay).
// A sequence of a request with P prompt and O output tokens holds P + e - 1
// tokens after emitting e tokens (the last token is emitted, never fed back), so
// its final length is P + O - 1. A restored request recomputes (or swaps in)
// exactly the tokens it held and emits nothing in that step.
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "replay_internal.h"
#include "src/allocator/clock.h"

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
    uint64_t pf_extra; // restored samples' own tokens, computed with the last chunk
    double pf_extra_pairs;
    uint64_t pf_extra_ctx;
    uint64_t swap_bytes; // bytes it holds in the host pool
    double first_token_s;
} req_state;

typedef struct dvec {
    double *v;
    size_t n, cap;
} dvec;

static int dvec_push(dvec *d, double x) {
    if (d->n == d->cap) {
        size_t c = d->cap ? d->cap * 2 : 4096;
        double *p = realloc(d->v, c * sizeof *p);
        if (!p) return -1;
        d->v = p;
        d->cap = c;
    }
    d->v[d->n++] = x;
    return 0;
}

static int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

// Nearest-rank percentile of a sorted array (NaN for an empty one).
static double percentile(const dvec *d, double pct) {
    if (d->n == 0) return NAN;
    size_t rank = (size_t)ceil(pct / 100.0 * (double)d->n);
    if (rank < 1) rank = 1;
    if (rank > d->n) rank = d->n;
    return d->v[rank - 1];
}

// Time-weighted sums over steps (weights: step durations).
typedef struct accum {
    double w;                 // sum of dt over steps with reserved memory
    double waste, internal, reservation, ext;
    double wb;                // sum of dt over all steps (breakdown)
    double b_tok, b_resv, b_int, b_ext, b_free;
    double prefill_s, decode_s, busy_s;
    double dec_s, dec_flops, dec_bytes; // decode-only steps
    double alloc_step_s;
} accum;

typedef struct engine {
    const pkv_replay_params *prm;
    const pkv_trace_request *reqs;
    uint32_t n;
    pkvi_policy *pol;
    pkvi_executor *ex;
    uint64_t bpt;        // KV bytes per token
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
    uint32_t min_long_len;    // shortest final length among too-long rejects
    double last_finish;
    dvec step_s, ttft, tpot;
    accum acc;
} engine;

static double arrival(const engine *e, uint32_t r) {
    return e->reqs[r].arrival_s / e->prm->load_scale;
}

static void wq_push_back(engine *e, uint32_t r) {
    e->wq[(e->wq_head + e->wq_len) % (e->n + 1)] = r;
    e->wq_len++;
}

static void wq_push_front(engine *e, uint32_t r) {
    e->wq_head = (e->wq_head + e->n) % (e->n + 1);
    e->wq[e->wq_head] = r;
    e->wq_len++;
}

static uint32_t wq_front(const engine *e) { return e->wq[e->wq_head]; }
static uint32_t wq_at(const engine *e, uint32_t i) { return e->wq[(e->wq_head + i) % (e->n + 1)]; }

static void wq_pop_front(engine *e) {
    e->wq_head = (e->wq_head + 1) % (e->n + 1);
    e->wq_len--;
}

// Lengths as the engine runs them: static batching pads them.
static uint32_t prompt_of(const engine *e, uint32_t r) {
    return e->st[r].pad_prompt ? e->st[r].pad_prompt : e->reqs[r].prompt_tokens;
}
static uint32_t output_of(const engine *e, uint32_t r) {
    return e->st[r].pad_output ? e->st[r].pad_output : e->reqs[r].output_tokens;
}
static uint32_t final_len(const engine *e, uint32_t r) { return prompt_of(e, r) + output_of(e, r) - 1; }
static uint32_t width(const engine *e, uint32_t r) { return output_of(e, r) > 1 ? e->reqs[r].n : 1; }

static void make_admit(const engine *e, uint32_t r, pkvi_admit *a) {
    const req_state *s = &e->st[r];
    a->prompt = prompt_of(e, r);
    a->final_len = final_len(e, r);
    a->n = width(e, r); // a one-token request never forks
    if (s->restore) {
        a->len = a->prompt + s->emitted - 1;
        a->nseq = s->nseq;
    } else {
        a->len = a->prompt;
        a->nseq = 1;
    }
    // Run mode recomputes every restored sequence in full: a shared partial
    // prompt block would be copied before the prefill that fills it.
    a->independent = e->prm->mode == PKV_REPLAY_RUN;
}

// Peak slots a request needs alone under the policy (watermark excluded).
static uint64_t need_slots(const engine *e, pkv_policy kind, const pkvi_admit *a) {
    switch (kind) {
    case PKV_POLICY_PAGED: return pkvi_paged_need(e->prm->block_size, a);
    case PKV_POLICY_MALLOC_PER_TOKEN: return pkvi_token_need(a);
    case PKV_POLICY_VMM:
        return pkvi_vmm_need(e->prm->vmm_page_bytes, e->bpt / (2ull * e->prm->model.num_layers),
                             e->prm->vmm_map_ahead, e->max_len, a);
    default: return pkvi_contig_need(kind, e->max_len, a);
    }
}

// Slots a request's KV occupies (what a swap moves): the prompt's full blocks
// are shared by the paged policy's forks.
static uint64_t request_slots(const engine *e, uint32_t r, uint32_t nseq, uint32_t len) {
    const uint32_t g = e->pol->granularity;
    uint64_t shared = g > 1 ? (uint64_t)prompt_of(e, r) / g * g : 0;
    if (nseq <= 1) return len;
    return shared + (uint64_t)nseq * (len - shared);
}

static void reject(engine *e, uint32_t r, int no_memory) {
    e->st[r].status = RS_REJECTED;
    e->rejected++;
    e->finished++;
    if (no_memory) {
        pkvi_admit a;
        make_admit(e, r, &a);
        a.len = a.prompt;
        a.nseq = 1;
        const uint64_t need = need_slots(e, e->prm->policy, &a);
        if (need < e->min_need_slots) e->min_need_slots = need;
        e->rejected_mem++;
    } else {
        if (final_len(e, r) < e->min_long_len) e->min_long_len = final_len(e, r);
        e->rejected_long++;
    }
}

static int push_seq(engine *e, pkv_seq_id id, uint32_t new_tokens, uint32_t ctx) {
    if (e->num_seqs == e->seqs_cap) {
        uint32_t c = e->seqs_cap ? e->seqs_cap * 2 : 256;
        pkvi_step_seq *p = realloc(e->seqs, c * sizeof *p);
        if (!p) return -1;
        e->seqs = p;
        e->seqs_cap = c;
    }
    e->seqs[e->num_seqs++] = (pkvi_step_seq){id, new_tokens, ctx};
    return 0;
}

// ---- arrivals ----

// Requests that arrived by now join the queue; those that can never run are
// rejected on arrival.
static void arrivals(engine *e) {
    const pkvi_policy_ops *ops = e->pol->ops;
    while (e->ai < e->n && arrival(e, e->ai) <= e->t) {
        const uint32_t r = e->ai++;
        pkvi_admit a;
        make_admit(e, r, &a);
        if (final_len(e, r) > e->max_len || a.n > e->prm->max_batch) {
            reject(e, r, 0);
        } else if (!ops->fits_alone(e->pol, &a, e->wm_slots)) {
            reject(e, r, 1);
        } else {
            e->st[r].status = RS_WAITING;
            wq_push_back(e, r);
        }
    }
}

// ---- preempt ----

// Preempt the newest running request; returns it.
static uint32_t preempt(engine *e) {
    const uint32_t v = e->running[--e->run_count];
    req_state *s = &e->st[v];
    e->pol->ops->release(e->pol, v);
    e->run_seqs -= width(e, v);
    s->status = RS_WAITING;
    s->swapped = 0;
    if (s->prefilling) {
        // Caught mid-prefill (chunked): nothing emitted; it starts over.
        s->prefilling = 0;
        s->nseq = 0;
    } else {
        s->restore = 1;
        if (e->prm->preempt == PKV_PREEMPT_SWAP) {
            const uint64_t bytes =
                request_slots(e, v, s->nseq, prompt_of(e, v) + s->emitted - 1) * e->bpt;
            if (e->swap_used + bytes <= e->prm->swap_space_bytes) {
                s->swapped = 1;
                s->swap_bytes = bytes;
                e->swap_used += bytes;
                e->swap_out += bytes;
                e->b.swap_bytes += bytes; // swap-out: charged to this step
            } else {
                e->swap_fallbacks++; // host pool full: recompute instead
            }
        }
    }
    e->preemptions++;
    e->preempted = 1;
    wq_push_front(e, v);
    return v;
}

// ---- decode ----

// Grow every decoding sequence by its last emitted token; preempt when short.
static pkv_status decode(engine *e) {
    const pkvi_policy_ops *ops = e->pol->ops;
    for (uint32_t i = 0; i < e->run_count; i++) {
        const uint32_t r = e->running[i];
        req_state *s = &e->st[r];
        if (s->prefilling) continue; // still computing its prompt (chunked)
        int gone = 0;
        for (uint32_t c = 0; c < s->nseq && !gone; c++) {
            for (;;) {
                pkv_status st = ops->grow(e->pol, r, c);
                if (st == PKV_OK) break;
                if (st != PKV_ERR_OUT_OF_BLOCKS) return st;
                if (e->run_count == 1) {
                    // Alone and still short (fragmented extents): it can never
                    // finish; drop it rather than fail the run.
                    ops->release(e->pol, r);
                    e->run_count = 0;
                    e->run_seqs = 0;
                    s->nseq = 0;
                    reject(e, r, 1);
                    gone = 1;
                    break;
                }
                if (preempt(e) == r) {
                    gone = 1;
                    break;
                }
            }
        }
        if (gone) break; // r was the newest (the tail): nobody after it to grow
        const uint32_t ctx = prompt_of(e, r) + s->emitted;
        e->b.num_decode_seqs += s->nseq;
        e->b.decode_ctx_tokens += (uint64_t)s->nseq * ctx;
        if (e->ex->needs_seqs)
            for (uint32_t c = 0; c < s->nseq; c++)
                if (push_seq(e, ops->seq_of(e->pol, r, c), 1, ctx) != 0) return PKV_ERR_OUT_OF_MEMORY;
    }
    if (e->prm->chunked_prefill) {
        const uint64_t d = e->b.num_decode_seqs;
        e->budget_left = d < e->prm->chunked_prefill ? e->prm->chunked_prefill - d : 0;
    }
    return PKV_OK;
}

// ---- prefill ----

// Compute the next chunk of request r's prefill (all of it without chunking).
static pkv_status prefill_chunk(engine *e, uint32_t r) {
    req_state *s = &e->st[r];
    uint64_t c = s->pf_len - s->pf_done;
    if (e->prm->chunked_prefill) {
        if (c > e->budget_left) c = e->budget_left;
        e->budget_left -= c;
    }
    const double nc = (double)c, done = (double)s->pf_done;
    e->b.num_prefill_seqs += 1;
    e->b.prefill_tokens += c;
    e->b.prefill_attn_pairs += nc * done + nc * (nc + 1) / 2;
    e->b.prefill_ctx_tokens += s->pf_done + c;
    if (e->ex->needs_seqs &&
        push_seq(e, e->pol->ops->seq_of(e->pol, r, 0), (uint32_t)c, (uint32_t)(s->pf_done + c)) != 0)
        return PKV_ERR_OUT_OF_MEMORY;
    s->pf_done += (uint32_t)c;
    if (s->pf_done == s->pf_len) {
        // The restored samples' own tokens go with the last chunk.
        e->b.num_prefill_seqs += s->nseq - 1;
        e->b.prefill_tokens += s->pf_extra;
        e->b.prefill_attn_pairs += s->pf_extra_pairs;
        e->b.prefill_ctx_tokens += s->pf_extra_ctx;
        if (e->ex->needs_seqs && s->pf_extra) {
            const uint32_t own = (uint32_t)(s->pf_extra / (s->nseq - 1));
            for (uint32_t ch = 1; ch < s->nseq; ch++)
                if (push_seq(e, e->pol->ops->seq_of(e->pol, r, ch), own, s->pf_len) != 0)
                    return PKV_ERR_OUT_OF_MEMORY;
        }
        s->prefilling = 0;
        s->fresh = 1;
    }
    return PKV_OK;
}

// Chunked prefill: running requests still prefilling continue, oldest first.
static pkv_status prefill(engine *e) {
    if (!e->prm->chunked_prefill) return PKV_OK;
    for (uint32_t i = 0; i < e->run_count && e->budget_left > 0; i++) {
        const uint32_t r = e->running[i];
        if (!e->st[r].prefilling) continue;
        pkv_status st = prefill_chunk(e, r);
        if (st != PKV_OK) return st;
    }
    return PKV_OK;
}

// ---- admit ----

// Start request r (admitted by the policy with `a`): swap it in, or set up its
// prefill and compute its first chunk.
static pkv_status start(engine *e, uint32_t r, const pkvi_admit *a) {
    req_state *s = &e->st[r];
    s->status = RS_RUNNING;
    s->nseq = a->nseq;
    e->running[e->run_count++] = r;
    e->run_seqs += a->n;
    s->pf_len = a->len;
    if (s->restore && s->swapped) {
        e->b.num_prefill_seqs += a->nseq;
        e->b.swap_bytes += s->swap_bytes; // swap-in: charged to this step
        e->swap_in += s->swap_bytes;
        e->swap_used -= s->swap_bytes;
        s->swap_bytes = 0;
        s->fresh = 1;
        return PKV_OK;
    }
    // Recompute / prefill: sequence 0 computes its tokens past any cached
    // prefix; the other sequences their tokens past the shared prompt.
    const uint32_t own = a->independent ? a->len : a->len - a->prompt;
    s->pf_done = e->pol->last_cached;
    s->pf_extra = 0;
    s->pf_extra_pairs = 0;
    s->pf_extra_ctx = 0;
    if (own > 0)
        for (uint32_t c = 1; c < a->nseq; c++) {
            const double nk = (double)own;
            s->pf_extra += own;
            s->pf_extra_pairs += nk * (a->len - own) + nk * (nk + 1) / 2;
            s->pf_extra_ctx += a->len;
        }
    s->prefilling = 1;
    return prefill_chunk(e, r);
}

// Continuous batching: FCFS while the policy, the batch and the token budget allow.
static pkv_status admit_continuous(engine *e) {
    const pkv_replay_params *prm = e->prm;
    while (!e->preempted && e->wq_len > 0) {
        const uint32_t r = wq_front(e);
        const req_state *s = &e->st[r];
        pkvi_admit a;
        make_admit(e, r, &a);
        if (e->run_seqs + a.n > prm->max_batch) break;
        const int swap_in = s->restore && s->swapped;
        if (prm->chunked_prefill) {
            if (!swap_in && e->budget_left == 0) break;
        } else {
            const uint32_t own = a.independent ? a.len : a.len - a.prompt; // samples' tokens
            const uint64_t cost = swap_in ? 0 : (uint64_t)a.len + (uint64_t)(a.nseq - 1) * own;
            if (e->b.prefill_tokens > 0 &&
                e->b.prefill_tokens + e->b.num_decode_seqs + cost > prm->max_tokens_per_step)
                break;
        }
        uint64_t ef = 0;
        pkv_status st = e->pol->ops->admit(e->pol, r, &a, e->wm_slots, &ef);
        if (st == PKV_ERR_OUT_OF_BLOCKS) {
            e->ext_frag = ef;
            break;
        }
        if (st != PKV_OK) return st;
        wq_pop_front(e);
        if ((st = start(e, r, &a)) != PKV_OK) return st;
    }
    return PKV_OK;
}

// Static batching: when nothing runs, take the longest FCFS prefix of the queue
// whose members, each padded to the batch's longest prompt and output, fit the
// batch limit and the budget; admit them all; nothing else until they finish.
static pkv_status admit_static(engine *e) {
    if (e->run_count > 0 || e->wq_len == 0) return PKV_OK;
    uint32_t k = 0, max_p = 0, max_o = 0;
    uint64_t seqs = 0;
    for (uint32_t i = 0; i < e->wq_len; i++) {
        const uint32_t r = wq_at(e, i);
        const uint32_t p = prompt_of(e, r), o = output_of(e, r);
        const uint32_t np = p > max_p ? p : max_p, no = o > max_o ? o : max_o;
        if (np + no - 1 > e->max_len || seqs + e->reqs[r].n > e->prm->max_batch) break;
        // Would the first i + 1 requests, all padded to (np, no), fit?
        uint64_t need = 0;
        for (uint32_t j = 0; j <= i; j++) {
            const uint32_t q = wq_at(e, j);
            pkvi_admit a = {np, np, np + no - 1, 1, no > 1 ? e->reqs[q].n : 1, 0};
            need += need_slots(e, e->prm->policy, &a);
        }
        if (i > 0 && need + e->wm_slots > e->pol->capacity_slots) break;
        k = i + 1;
        max_p = np;
        max_o = no;
        seqs += e->reqs[r].n;
    }
    for (uint32_t i = 0; i < k; i++) {
        const uint32_t r = wq_front(e);
        req_state *s = &e->st[r];
        if (!s->restore) {
            s->pad_prompt = max_p;
            s->pad_output = max_o;
        }
        pkvi_admit a;
        make_admit(e, r, &a);
        uint64_t ef = 0;
        pkv_status st = e->pol->ops->admit(e->pol, r, &a, e->wm_slots, &ef);
        if (st == PKV_ERR_OUT_OF_BLOCKS) {
            if (!s->restore) s->pad_prompt = s->pad_output = 0;
            e->ext_frag = ef;
            break;
        }
        if (st != PKV_OK) return st;
        wq_pop_front(e);
        if ((st = start(e, r, &a)) != PKV_OK) return st;
    }
    return PKV_OK;
}

static pkv_status admit(engine *e) {
    return e->prm->batching == PKV_BATCHING_STATIC ? admit_static(e) : admit_continuous(e);
}

// ---- time ----

// Sample memory, time the step, charge the backend calls, advance the clock.
static pkv_status time_step(engine *e, double *dt_out) {
    const pkv_replay_params *prm = e->prm;
    const pkvi_policy_ops *ops = e->pol->ops;
    const uint64_t cap = e->pol->capacity_slots;
    pkvi_mem_sample tot;
    ops->totals(e->pol, &tot);
    uint64_t reservation = 0;
    for (uint32_t i = 0; i < e->run_count; i++) {
        const uint32_t r = e->running[i];
        const req_state *s = &e->st[r];
        pkvi_mem_sample m;
        // After growth a decoded sequence holds P + e tokens; one that was
        // prefilled or restored (or still is) what its prefill fills.
        const uint32_t len = (s->fresh || s->prefilling) ? s->pf_len : prompt_of(e, r) + s->emitted;
        ops->sample(e->pol, r, s->nseq, len, final_len(e, r), &m);
        reservation += m.reservation;
    }
    pkvi_alloc_counts cnt;
    ops->counts(e->pol, &cnt);
    e->b.copy_bytes = (cnt.copy_slots - e->copy_slots_seen) * e->bpt;
    e->copy_slots_seen = cnt.copy_slots;
    e->b.seqs = e->seqs;
    e->b.num_seqs = e->num_seqs;
    double dt = 0;
    pkvi_step_time parts;
    pkv_status status = e->ex->step(e->ex, &e->b, &dt, &parts);
    if (status != PKV_OK) return status;
    if (prm->mode == PKV_REPLAY_SIM) {
        const pkv_block_copy *cp;
        (void)pkvi_policy_paged_take_copies(e->pol, &cp); // sim: nothing to move
    }
    // Backend calls since the last step: a synchronizing call stalls the
    // device; an overlapping one hides behind the step's device work.
    pkvi_charges *ch = &e->pol->charges;
    const double exec = dt;
    dt = (dt > ch->async_s ? dt : ch->async_s) + ch->sync_s;
    const double alloc_s = dt - exec;
    e->acc.alloc_step_s += ch->sync_s + ch->async_s;
    ch->sync_s = ch->async_s = 0;
    e->t += dt;
    const uint64_t used = tot.used, reserved = tot.reserved;
    if (prm->validate) {
        pkv_status vs = ops->validate(e->pol);
        if (vs != PKV_OK) return vs;
        if (used > reserved || reserved > cap || reservation > reserved - used) return PKV_ERR_CORRUPT;
    }
    if (used > e->peak_used) e->peak_used = used;
    if (reserved > e->peak_reserved) e->peak_reserved = reserved;
    const uint64_t ext = e->ext_frag < cap - reserved ? e->ext_frag : cap - reserved;
    const uint64_t internal = reserved - used - reservation;
    accum *A = &e->acc;
    if (reserved > 0 && dt > 0) {
        const double rs = (double)reserved;
        A->w += dt;
        A->waste += dt * (double)(reserved - used) / rs;
        A->reservation += dt * (double)reservation / rs;
        A->internal += dt * (double)internal / rs;
        A->ext += dt * (double)ext / (double)cap;
    }
    if (dt > 0) {
        const double c = (double)cap;
        A->wb += dt;
        A->b_tok += dt * (double)used / c;
        A->b_resv += dt * (double)reservation / c;
        A->b_int += dt * (double)internal / c;
        A->b_ext += dt * (double)ext / c;
        A->b_free += dt * (double)(cap - reserved - ext) / c;
        A->busy_s += dt;
        const double ps = parts.prefill_s, ds = parts.decode_s;
        const double pshare = ps + ds > 0 ? ps / (ps + ds) : (e->b.prefill_tokens ? 1.0 : 0.0);
        A->prefill_s += dt * pshare;
        A->decode_s += dt * (1 - pshare);
        if (e->b.prefill_tokens == 0 && e->b.num_decode_seqs > 0) {
            A->dec_s += dt;
            A->dec_flops += parts.flops;
            A->dec_bytes += parts.bytes;
        }
    }
    const uint32_t batch = e->b.num_decode_seqs + e->b.num_prefill_seqs;
    e->batch_sum += batch;
    if (batch > e->batch_max) e->batch_max = batch;
    if (dvec_push(&e->step_s, dt) != 0) return PKV_ERR_OUT_OF_MEMORY;
    if (prm->on_step) {
        pkv_replay_step ps;
        memset(&ps, 0, sizeof ps);
        ps.index = e->steps;
        ps.time_s = e->t;
        ps.step_s = dt;
        ps.running = batch;
        ps.waiting = e->wq_len;
        ps.used_bytes = used * e->bpt;
        ps.reserved_bytes = reserved * e->bpt;
        ps.reservation_bytes = reservation * e->bpt;
        ps.ext_frag_bytes = ext * e->bpt;
        ps.free_bytes = (cap - reserved) * e->bpt;
        ps.capacity_bytes = cap * e->bpt;
        ps.internal_frag_bytes = internal * e->bpt;
        ps.idle_free_bytes = (cap - reserved - ext) * e->bpt;
        ps.alloc_s = alloc_s;
        ps.prefill_tokens = (uint32_t)e->b.prefill_tokens;
        prm->on_step(prm->user, &ps);
    }
    *dt_out = dt;
    return PKV_OK;
}

// ---- retire ----

// Emit tokens, fork, finish.
static pkv_status retire(engine *e) {
    const pkvi_policy_ops *ops = e->pol->ops;
    uint32_t keep = 0;
    for (uint32_t i = 0; i < e->run_count; i++) {
        const uint32_t r = e->running[i];
        req_state *s = &e->st[r];
        const pkv_trace_request *q = &e->reqs[r];
        if (s->prefilling) { // mid-prefill: nothing to emit yet
            e->running[keep++] = r;
            continue;
        }
        if (s->fresh) {
            s->fresh = 0;
            if (s->restore) {
                s->restore = 0; // restored state; it decodes from the next step
            } else {
                s->emitted = 1;
                s->first_token_s = e->t;
                ops->commit(e->pol, r, prompt_of(e, r)); // its prompt K/V exist now
                if (output_of(e, r) > 1 && q->n > 1) {
                    pkv_status st = ops->fork(e->pol, r, q->n);
                    if (st != PKV_OK) return st;
                    s->nseq = q->n;
                    e->forks += q->n - 1;
                }
            }
        } else {
            s->emitted++;
        }
        if (s->emitted >= output_of(e, r)) {
            ops->release(e->pol, r);
            e->run_seqs -= width(e, r);
            s->nseq = 0;
            s->status = RS_DONE;
            e->completed++;
            e->finished++;
            e->output_tokens += (uint64_t)q->output_tokens * q->n;
            e->padding_tokens += (uint64_t)q->n * ((prompt_of(e, r) - q->prompt_tokens) +
                                                   (output_of(e, r) - q->output_tokens));
            e->last_finish = e->t;
            if (dvec_push(&e->ttft, (s->first_token_s - arrival(e, r)) * 1e3) != 0 ||
                (q->output_tokens > 1 &&
                 dvec_push(&e->tpot, (e->t - s->first_token_s) * 1e3 / (q->output_tokens - 1)) != 0))
                return PKV_ERR_OUT_OF_MEMORY;
        } else {
            e->running[keep++] = r;
        }
    }
    e->run_count = keep;
    return PKV_OK;
}

// ---- one step, the loop, the report ----

static pkv_status engine_step(engine *e) {
    arrivals(e);
    if (e->run_count == 0 && e->wq_len == 0) {
        // Idle until the next arrival; pending frees complete meanwhile.
        pkvi_charges *ch = &e->pol->charges;
        const double busy = e->t + ch->sync_s + ch->async_s;
        e->acc.alloc_step_s += ch->sync_s + ch->async_s;
        ch->sync_s = ch->async_s = 0;
        if (e->ai < e->n) e->t = arrival(e, e->ai) > busy ? arrival(e, e->ai) : busy;
        return PKV_OK;
    }
    memset(&e->b, 0, sizeof e->b);
    e->num_seqs = 0;
    e->preempted = 0;
    e->ext_frag = 0;
    e->budget_left = 0;
    pkv_status st;
    if ((st = decode(e)) != PKV_OK) return st;
    if ((st = prefill(e)) != PKV_OK) return st;
    if ((st = admit(e)) != PKV_OK) return st;
    if (e->run_count == 0) {
        // Nothing runs and the head cannot be admitted into empty memory: drop
        // it so that the replay always makes progress.
        if (e->wq_len > 0) {
            const uint32_t r = wq_front(e);
            wq_pop_front(e);
            if (e->st[r].swap_bytes) {
                e->swap_used -= e->st[r].swap_bytes;
                e->st[r].swap_bytes = 0;
            }
            reject(e, r, 1);
        }
        return PKV_OK;
    }
    double dt;
    if ((st = time_step(e, &dt)) != PKV_OK) return st;
    if ((st = retire(e)) != PKV_OK) return st;
    e->steps++;
    if (e->prm->on_progress && (e->steps & 4095) == 0)
        e->prm->on_progress(e->prm->user, (double)e->finished / (double)e->n);
    return PKV_OK;
}

static void human(char *buf, size_t cap, uint64_t b) {
    const char *units[] = {"B", "KiB", "MiB", "GiB", "TiB"};
    double v = (double)b;
    int u = 0;
    while (v >= 1024 && u < 4) {
        v /= 1024;
        u++;
    }
    snprintf(buf, cap, (v == floor(v)) ? "%.0f %s" : "%.1f %s", v, units[u]);
}

// Why a run completed nothing, into rep->failure.
static void explain_failure(const engine *e, uint64_t budget, pkv_replay_report *rep) {
    char have[32], need[32];
    human(have, sizeof have, budget);
    if (e->rejected_mem > 0) {
        human(need, sizeof need, e->min_need_slots * e->bpt);
        snprintf(rep->failure, sizeof rep->failure,
                 "KV budget %s holds no request of this trace: the smallest needs %s%s", have, need,
                 e->prm->watermark > 0 ? " plus the watermark" : "");
    } else if (e->rejected_long > 0) {
        snprintf(rep->failure, sizeof rep->failure,
                 "no request of this trace fits max_seq_len %u and max_batch %u (the shortest "
                 "holds %u tokens)",
                 e->max_len, e->prm->max_batch, e->min_long_len);
    } else {
        snprintf(rep->failure, sizeof rep->failure, "no request completed");
    }
}

static void report_failed(pkv_replay_report *rep) {
    const double nan = NAN;
    rep->memory.waste_frac = rep->memory.internal_frag_frac = nan;
    rep->memory.reservation_frac = rep->memory.external_frag_frac = nan;
    rep->memory.breakdown.token_states = rep->memory.breakdown.reserved = nan;
    rep->memory.breakdown.internal_frag = rep->memory.breakdown.external_frag = nan;
    rep->memory.breakdown.free = nan;
    rep->latency.step_p50_ms = rep->latency.step_p90_ms = nan;
    rep->latency.step_p99_ms = rep->latency.step_max_ms = nan;
    rep->latency.ttft_p50_ms = rep->latency.ttft_p99_ms = nan;
    rep->latency.tpot_p50_ms = rep->latency.tpot_p99_ms = nan;
    rep->throughput.output_tokens_per_s = rep->throughput.makespan_s = nan;
    rep->time.prefill_frac = rep->time.decode_frac = nan;
    rep->time.decode_compute_util = rep->time.decode_bw_util = nan;
}

static double ratio(double a, double b) { return b > 0 ? a / b : NAN; }

static pkv_status engine_run(engine *e, uint64_t budget, pkv_replay_report *rep) {
    const pkvi_policy_ops *ops = e->pol->ops;
    pkv_status status = PKV_OK;
    e->t = arrival(e, 0);
    e->last_finish = e->t;
    e->min_need_slots = UINT64_MAX;
    e->min_long_len = UINT32_MAX;
    while (e->finished < e->n)
        if ((status = engine_step(e)) != PKV_OK) goto out;
    if (e->prm->on_progress) e->prm->on_progress(e->prm->user, 1.0);
    rep->requests.total = e->n;
    rep->requests.completed = e->completed;
    rep->requests.rejected = e->rejected;
    rep->requests.rejected_too_long = e->rejected_long;
    rep->requests.rejected_no_memory = e->rejected_mem;
    rep->memory.capacity_bytes = e->pol->capacity_slots * e->bpt;
    rep->memory.peak_reserved_bytes = e->peak_reserved * e->bpt;
    rep->memory.peak_used_bytes = e->peak_used * e->bpt;
    const accum *A = &e->acc;
    if (A->w > 0) {
        rep->memory.waste_frac = A->waste / A->w;
        rep->memory.internal_frag_frac = A->internal / A->w;
        rep->memory.reservation_frac = A->reservation / A->w;
        rep->memory.external_frag_frac = A->ext / A->w;
    }
    rep->memory.breakdown.token_states = ratio(A->b_tok, A->wb);
    rep->memory.breakdown.reserved = ratio(A->b_resv, A->wb);
    rep->memory.breakdown.internal_frag = ratio(A->b_int, A->wb);
    rep->memory.breakdown.external_frag = ratio(A->b_ext, A->wb);
    rep->memory.breakdown.free = ratio(A->b_free, A->wb);
    // qsort must not see NULL, which an empty vector (nothing completed) holds.
    if (e->step_s.n) qsort(e->step_s.v, e->step_s.n, sizeof(double), cmp_double);
    if (e->ttft.n) qsort(e->ttft.v, e->ttft.n, sizeof(double), cmp_double);
    if (e->tpot.n) qsort(e->tpot.v, e->tpot.n, sizeof(double), cmp_double);
    rep->latency.step_p50_ms = percentile(&e->step_s, 50) * 1e3;
    rep->latency.step_p90_ms = percentile(&e->step_s, 90) * 1e3;
    rep->latency.step_p99_ms = percentile(&e->step_s, 99) * 1e3;
    rep->latency.step_max_ms = e->step_s.n ? e->step_s.v[e->step_s.n - 1] * 1e3 : NAN;
    rep->latency.ttft_p50_ms = percentile(&e->ttft, 50);
    rep->latency.ttft_p99_ms = percentile(&e->ttft, 99);
    rep->latency.tpot_p50_ms = percentile(&e->tpot, 50);
    rep->latency.tpot_p99_ms = percentile(&e->tpot, 99);
    rep->throughput.output_tokens = e->output_tokens;
    rep->throughput.makespan_s = e->last_finish - arrival(e, 0);
    rep->throughput.output_tokens_per_s = ratio((double)e->output_tokens, rep->throughput.makespan_s);
    rep->batch.mean = e->steps ? (double)e->batch_sum / (double)e->steps : 0;
    rep->batch.max = e->batch_max;
    rep->time.busy_s = A->busy_s;
    rep->time.prefill_frac = ratio(A->prefill_s, A->prefill_s + A->decode_s);
    rep->time.decode_frac = ratio(A->decode_s, A->prefill_s + A->decode_s);
    rep->time.decode_compute_util = e->ex->peak_flops > 0 ? ratio(A->dec_flops, A->dec_s * e->ex->peak_flops) : NAN;
    rep->time.decode_bw_util = e->ex->mem_bw > 0 ? ratio(A->dec_bytes, A->dec_s * e->ex->mem_bw) : NAN;
    rep->steps = e->steps;
    rep->preemptions = e->preemptions;
    rep->forks = e->forks;
    rep->padding_tokens = e->padding_tokens;
    pkvi_alloc_counts cnt;
    ops->counts(e->pol, &cnt);
    rep->cow_copies = cnt.cow_copies;
    rep->prefix_cached_tokens = cnt.cached_tokens;
    rep->copy_bytes = cnt.copy_slots * e->bpt;
    rep->alloc.backend_alloc_calls = cnt.alloc_calls;
    rep->alloc.backend_free_calls = cnt.free_calls;
    rep->alloc.step_seconds = A->alloc_step_s;
    rep->swap_out_bytes = e->swap_out;
    rep->swap_in_bytes = e->swap_in;
    rep->swap_bytes = e->swap_out + e->swap_in;
    rep->swap_fallbacks = e->swap_fallbacks;
    if (e->completed == 0) {
        report_failed(rep);
        explain_failure(e, budget, rep);
    }
out:
    free(e->step_s.v);
    free(e->ttft.v);
    free(e->tpot.v);
    return status;
}

static int params_ok(const pkv_replay_params *p) {
    return (unsigned)p->policy < PKV_POLICY_COUNT && p->block_size >= 1 && p->block_size <= 65536 &&
           (p->preempt == PKV_PREEMPT_RECOMPUTE || p->preempt == PKV_PREEMPT_SWAP) &&
           (p->mode == PKV_REPLAY_SIM || p->mode == PKV_REPLAY_RUN) && p->max_batch >= 1 &&
           p->max_tokens_per_step >= 1 && p->watermark >= 0 && p->watermark < 1 &&
           (p->dtype_bytes == 1 || p->dtype_bytes == 2 || p->dtype_bytes == 4) &&
           (p->batching == PKV_BATCHING_CONTINUOUS || p->batching == PKV_BATCHING_STATIC) &&
           !(p->batching == PKV_BATCHING_STATIC && p->chunked_prefill) &&
           p->load_scale > 0 && isfinite(p->load_scale) && p->alloc_model.alloc.base_s >= 0 &&
           p->alloc_model.alloc.per_byte_s >= 0 && p->alloc_model.free.base_s >= 0 &&
           p->alloc_model.free.per_byte_s >= 0 && pkv_model_config_validate(&p->model) == PKV_OK &&
           (p->policy != PKV_POLICY_VMM ||
            (p->vmm_page_bytes >= 4096 && p->vmm_page_bytes % 4096 == 0));
}

// Policies that carve one arena: one backend alloc before the first step and
// one free after the last.
static int uses_arena(pkv_policy k) {
    return k != PKV_POLICY_MALLOC_PER_REQUEST && k != PKV_POLICY_MALLOC_PER_TOKEN &&
           k != PKV_POLICY_REALLOC_COPY;
}

// A budget below one allocation unit: no policy can exist, every request is
// rejected for memory.
static void report_no_capacity(engine *e, uint64_t budget, pkv_replay_report *rep) {
    e->min_need_slots = UINT64_MAX;
    for (uint32_t r = 0; r < e->n; r++) {
        pkvi_admit a;
        make_admit(e, r, &a);
        const uint64_t need = need_slots(e, e->prm->policy, &a);
        if (need < e->min_need_slots) e->min_need_slots = need;
    }
    e->rejected = e->rejected_mem = e->n;
    rep->requests.total = e->n;
    rep->requests.rejected = rep->requests.rejected_no_memory = e->n;
    rep->memory.capacity_bytes = budget;
    report_failed(rep);
    explain_failure(e, budget, rep);
}

pkv_status pkv_replay_run(const pkv_trace *trace, const pkv_replay_params *params,
                          pkv_replay_report *report) {
    if (!trace || !params || !report || pkv_trace_count(trace) == 0 || !params_ok(params))
        return PKV_ERR_INVALID_ARG;
    if (pkv_trace_count(trace) > UINT32_MAX - 1) return PKV_ERR_INVALID_ARG;
    if (params->mode == PKV_REPLAY_RUN &&
        (params->policy != PKV_POLICY_PAGED || params->chunked_prefill ||
         params->batching != PKV_BATCHING_CONTINUOUS))
        return PKV_ERR_UNSUPPORTED;
    const double wall0 = pkvi_now_seconds();
    pkv_replay_params prm = *params;
    uint64_t budget;
    pkv_status st = pkv_replay_kv_budget(&prm, &budget);
    if (st != PKV_OK) return st;
    engine e;
    memset(&e, 0, sizeof e);
    e.prm = &prm;
    e.reqs = pkv_trace_requests(trace);
    e.n = (uint32_t)pkv_trace_count(trace);
    e.bpt = pkv_model_kv_bytes_per_token(&prm.model, prm.dtype_bytes);
    e.max_len = prm.max_seq_len ? prm.max_seq_len : prm.model.max_seq_len;
    uint32_t *max_seqs = malloc((size_t)e.n * sizeof *max_seqs);
    e.st = calloc(e.n, sizeof *e.st);
    e.running = malloc((size_t)e.n * sizeof *e.running);
    e.wq = malloc(((size_t)e.n + 1) * sizeof *e.wq);
    if (!max_seqs || !e.st || !e.running || !e.wq) {
        st = PKV_ERR_OUT_OF_MEMORY;
        goto done;
    }
    for (uint32_t i = 0; i < e.n; i++) max_seqs[i] = e.reqs[i].n;
    memset(report, 0, sizeof *report);
    snprintf(report->policy, sizeof report->policy, "%s", pkv_policy_name(prm.policy));
    snprintf(report->mode, sizeof report->mode, "%s", prm.mode == PKV_REPLAY_SIM ? "sim" : "run");
    report->block_size = prm.policy == PKV_POLICY_PAGED ? prm.block_size : 1;
    // vmm: tokens per page of one layer buffer (its allocation unit).
    const uint64_t vmm_tb = e.bpt / (2ull * prm.model.num_layers);
    if (prm.policy == PKV_POLICY_VMM && vmm_tb > 0 && prm.vmm_page_bytes / vmm_tb <= UINT32_MAX)
        report->block_size = (uint32_t)(prm.vmm_page_bytes / vmm_tb);
    report->kv_bytes_per_token = e.bpt;
    snprintf(report->alloc.model, sizeof report->alloc.model, "%s",
             prm.mode == PKV_REPLAY_SIM ? prm.alloc_model.name : "measured");
    const uint64_t unit = prm.policy == PKV_POLICY_PAGED ? prm.block_size : 1;
    // vmm: one page in each of the 2 x layers buffers.
    if (budget / e.bpt < unit ||
        (prm.policy == PKV_POLICY_VMM &&
         budget / (2ull * prm.model.num_layers) < prm.vmm_page_bytes)) {
        report_no_capacity(&e, budget, report);
        goto done;
    }
    pkvi_policy_config pc = {
        .kind = prm.policy,
        .capacity_bytes = budget,
        .bytes_per_token = e.bpt,
        .block_size = prm.block_size,
        .max_seq_len = e.max_len,
        .num_requests = e.n,
        .max_seqs = max_seqs,
        .trace = trace,
        .prefix_sharing = prm.prefix_sharing && prm.mode == PKV_REPLAY_SIM,
        .cost = prm.mode == PKV_REPLAY_SIM ? &prm.alloc_model : NULL,
        .vmm_page_bytes = prm.vmm_page_bytes,
        .vmm_buffers = 2 * prm.model.num_layers,
        .vmm_map_ahead = prm.vmm_map_ahead,
        .vmm_defer_reclaim = prm.vmm_defer_reclaim,
    };
    st = prm.policy == PKV_POLICY_PAGED             ? pkvi_policy_paged_create(&pc, &e.pol)
         : prm.policy == PKV_POLICY_MALLOC_PER_TOKEN ? pkvi_policy_token_create(&pc, &e.pol)
         : prm.policy == PKV_POLICY_VMM              ? pkvi_policy_vmm_create(&pc, &e.pol)
                                                     : pkvi_policy_contig_create(&pc, &e.pol);
    if (st != PKV_OK) goto done;
    e.wm_slots = (uint64_t)ceil(prm.watermark * (double)e.pol->capacity_slots);
    st = prm.mode == PKV_REPLAY_SIM ? pkvi_executor_roofline_create(&prm, &e.ex)
                                    : pkvi_executor_run_create(&prm, e.pol, &e.ex);
    if (st != PKV_OK) goto done;
    st = engine_run(&e, budget, report);
    if (st != PKV_OK) goto done;
    if (prm.mode == PKV_REPLAY_SIM) {
        double a = e.pol->charges.alloc_total_s, f = e.pol->charges.free_total_s;
        if (uses_arena(prm.policy)) { // the arena, outside every step
            a += pkv_alloc_call_seconds(&prm.alloc_model.alloc, report->memory.capacity_bytes);
            f += pkv_alloc_call_seconds(&prm.alloc_model.free, report->memory.capacity_bytes);
        }
        report->alloc.backend_alloc_seconds = a;
        report->alloc.backend_free_seconds = f;
        report->alloc.seconds_measured = 0;
    } else {
        st = pkvi_executor_run_alloc_stats(e.ex, report);
        if (st != PKV_OK) goto done;
    }
done:
    if (e.ex) e.ex->destroy(e.ex);
    if (e.pol) e.pol->ops->destroy(e.pol);
    free(max_seqs);
    free(e.st);
    free(e.running);
    free(e.wq);
    free(e.seqs);
    if (st == PKV_OK) report->replay_seconds = pkvi_now_seconds() - wall0;
    return st;
}

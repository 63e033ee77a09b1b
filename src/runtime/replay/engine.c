// SPDX-License-Identifier: MIT
// The replay engine: a continuous-batching scheduler with iteration-level
// scheduling that drives one KV policy and one step executor over a trace.
//
// One step:
//   1. every running sequence appends the slot of its last emitted token
//      (oldest request first); when memory is short the newest running request
//      is preempted (recompute: its memory is freed and it is requeued at the
//      head of the queue; swap: its KV also moves to an unbounded host pool);
//   2. if nothing was preempted, waiting requests are admitted in FCFS order
//      while the policy can hold their prefill with `watermark` of the capacity
//      left free, within max_batch sequences and max_tokens_per_step tokens
//      (the first prefill of a step may exceed the token limit alone);
//   3. memory is sampled (used <= reserved <= capacity), the executor gives the
//      step's duration and the clock advances;
//   4. prefills emit their first token (n > 1 requests fork then), decodes emit
//      one token each, and finished requests free their memory.
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
    uint8_t fresh;     // admitted in the current step
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

// Nearest-rank percentile of a sorted array (0 for an empty one).
static double percentile(const dvec *d, double pct) {
    if (d->n == 0) return 0;
    size_t rank = (size_t)ceil(pct / 100.0 * (double)d->n);
    if (rank < 1) rank = 1;
    if (rank > d->n) rank = d->n;
    return d->v[rank - 1];
}

typedef struct engine {
    const pkv_replay_params *prm;
    const pkv_trace_request *reqs;
    uint32_t n;
    pkvi_policy *pol;
    pkvi_executor *ex;
    uint64_t bpt;        // KV bytes per token
    uint32_t max_len;    // max_seq_len
    uint64_t wm_slots;   // watermark in slots
    req_state *st;
    uint32_t *running;   // admission order, oldest first
    uint32_t run_count;
    uint64_t run_seqs;   // sum of n over running requests (batch limit)
    uint32_t *wq;        // ring buffer of waiting requests, [n + 1]
    uint32_t wq_head, wq_len;
    pkvi_step_seq *seqs; // run-mode step sequences
    uint32_t seqs_cap, num_seqs;
    uint64_t preemptions, forks, swap_slots_total;
    uint64_t rejected, completed, output_tokens;
} engine;

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

static void wq_pop_front(engine *e) {
    e->wq_head = (e->wq_head + 1) % (e->n + 1);
    e->wq_len--;
}

// In 64 bits: prompt + output of a valid trace can pass 2^32 (issue 15).
// Admission rejects a request whose final length exceeds max_len (a uint32),
// so every admitted request's final length fits a uint32.
static uint64_t final_len(const pkv_trace_request *q) {
    return (uint64_t)q->prompt_tokens + q->output_tokens - 1;
}

static void make_admit(const engine *e, uint32_t r, pkvi_admit *a) {
    const pkv_trace_request *q = &e->reqs[r];
    const req_state *s = &e->st[r];
    a->prompt = q->prompt_tokens;
    a->final_len = final_len(q) > UINT32_MAX ? UINT32_MAX : (uint32_t)final_len(q);
    a->n = q->output_tokens > 1 ? q->n : 1; // a one-token request never forks
    if (s->restore) {
        a->len = q->prompt_tokens + s->emitted - 1;
        a->nseq = s->nseq;
    } else {
        a->len = q->prompt_tokens;
        a->nseq = 1;
    }
    // Run mode recomputes every restored sequence in full: a shared partial
    // prompt block would be copied before the prefill that fills it.
    a->independent = e->prm->mode == PKV_REPLAY_RUN;
}

// Slots a request's KV occupies (what a swap moves): the prompt's full blocks
// are shared by the paged policy's forks.
static uint64_t request_slots(const engine *e, uint32_t r, uint32_t nseq, uint32_t len) {
    const uint32_t g = e->pol->granularity;
    uint64_t shared = g > 1 ? (uint64_t)e->reqs[r].prompt_tokens / g * g : 0;
    if (nseq <= 1) return len;
    return shared + (uint64_t)nseq * (len - shared);
}

static void reject(engine *e, uint32_t r) {
    e->st[r].status = RS_REJECTED;
    e->rejected++;
}

// Preempt the newest running request.
static uint32_t preempt_newest(engine *e) {
    const uint32_t v = e->running[--e->run_count];
    req_state *s = &e->st[v];
    const pkv_trace_request *q = &e->reqs[v];
    e->pol->ops->release(e->pol, v);
    e->run_seqs -= q->output_tokens > 1 ? q->n : 1;
    s->status = RS_WAITING;
    s->restore = 1;
    s->swapped = e->prm->preempt == PKV_PREEMPT_SWAP;
    if (s->swapped) e->swap_slots_total += request_slots(e, v, s->nseq, q->prompt_tokens + s->emitted - 1);
    e->preemptions++;
    wq_push_front(e, v);
    return v;
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

static pkv_status engine_run(engine *e, pkv_replay_report *rep) {
    const pkv_replay_params *prm = e->prm;
    const pkvi_policy_ops *ops = e->pol->ops;
    const uint64_t cap_slots = e->pol->capacity_slots;
    dvec step_s = {0}, ttft = {0}, tpot = {0};
    pkv_status status = PKV_OK;
    double t = e->reqs[0].arrival_s, last_finish = t;
    uint32_t ai = 0;
    uint64_t finished = 0, steps = 0, batch_sum = 0;
    uint32_t batch_max = 0;
    double w_sum = 0, waste_sum = 0, internal_sum = 0, reservation_sum = 0, ext_sum = 0;
    uint64_t peak_used = 0, peak_reserved = 0, copy_slots_seen = 0;
    while (finished < e->n) {
        // Arrivals up to now; requests that can never run are rejected on arrival.
        while (ai < e->n && e->reqs[ai].arrival_s <= t) {
            const pkv_trace_request *q = &e->reqs[ai];
            pkvi_admit a;
            make_admit(e, ai, &a);
            const uint32_t seqs = a.n;
            if (final_len(q) > e->max_len || seqs > prm->max_batch ||
                !ops->fits_alone(e->pol, &a, e->wm_slots)) {
                reject(e, ai);
                finished++;
            } else {
                e->st[ai].status = RS_WAITING;
                wq_push_back(e, ai);
            }
            ai++;
        }
        if (e->run_count == 0 && e->wq_len == 0) {
            if (ai < e->n) t = e->reqs[ai].arrival_s;
            continue;
        }
        pkvi_step_batch b;
        memset(&b, 0, sizeof b);
        e->num_seqs = 0;
        int preempted = 0;
        // 1. Decode growth, oldest first; preempt the newest when memory is short.
        for (uint32_t i = 0; i < e->run_count; i++) {
            const uint32_t r = e->running[i];
            req_state *s = &e->st[r];
            int gone = 0;
            for (uint32_t c = 0; c < s->nseq && !gone; c++) {
                for (;;) {
                    pkv_status st = ops->grow(e->pol, r, c);
                    if (st == PKV_OK) break;
                    if (st != PKV_ERR_OUT_OF_BLOCKS) {
                        status = st;
                        goto out;
                    }
                    if (e->run_count == 1) {
                        // Alone and still short (fragmented extents): it can never
                        // finish; drop it rather than fail the run.
                        ops->release(e->pol, r);
                        e->run_count = 0;
                        e->run_seqs = 0;
                        s->nseq = 0;
                        reject(e, r);
                        finished++;
                        gone = 1;
                        break;
                    }
                    preempted = 1;
                    if (preempt_newest(e) == r) {
                        gone = 1;
                        break;
                    }
                }
            }
            if (gone) break; // r was the newest (the tail): nobody after it to grow
            const uint32_t ctx = e->reqs[r].prompt_tokens + s->emitted;
            b.num_decode_seqs += s->nseq;
            b.decode_ctx_tokens += (uint64_t)s->nseq * ctx;
            if (e->ex->needs_seqs)
                for (uint32_t c = 0; c < s->nseq; c++)
                    if (push_seq(e, ops->seq_of(e->pol, r, c), 1, ctx) != 0) {
                        status = PKV_ERR_OUT_OF_MEMORY;
                        goto out;
                    }
        }
        // 2. Admission, FCFS, unless this step had to preempt.
        uint64_t ext_frag = 0;
        while (!preempted && e->wq_len > 0) {
            const uint32_t r = wq_front(e);
            req_state *s = &e->st[r];
            pkvi_admit a;
            make_admit(e, r, &a);
            if (e->run_seqs + a.n > prm->max_batch) break;
            const int swap_in = s->restore && s->swapped;
            const uint32_t own = a.independent ? a.len : a.len - a.prompt; // children's tokens
            uint64_t cost = swap_in ? 0 : (uint64_t)a.len + (uint64_t)(a.nseq - 1) * own;
            if (b.prefill_tokens > 0 &&
                b.prefill_tokens + b.num_decode_seqs + cost > prm->max_tokens_per_step)
                break;
            uint64_t ef = 0;
            pkv_status st = ops->admit(e->pol, r, &a, e->wm_slots, &ef);
            if (st == PKV_ERR_OUT_OF_BLOCKS) {
                ext_frag = ef;
                break;
            }
            if (st != PKV_OK) {
                status = st;
                goto out;
            }
            wq_pop_front(e);
            s->status = RS_RUNNING;
            s->nseq = a.nseq;
            s->fresh = 1;
            e->running[e->run_count++] = r;
            e->run_seqs += a.n;
            b.num_prefill_seqs += a.nseq;
            if (swap_in) {
                b.swap_bytes += request_slots(e, r, a.nseq, a.len) * e->bpt;
                e->swap_slots_total += request_slots(e, r, a.nseq, a.len);
                continue;
            }
            // Recompute / prefill: child 0 computes its tokens past any cached
            // prefix; the other sequences their tokens past the shared prompt.
            const uint32_t cached = e->pol->last_cached;
            const double new0 = (double)(a.len - cached);
            b.prefill_tokens += (uint64_t)(a.len - cached);
            b.prefill_attn_pairs += new0 * cached + new0 * (new0 + 1) / 2;
            b.prefill_ctx_tokens += a.len;
            if (e->ex->needs_seqs &&
                push_seq(e, ops->seq_of(e->pol, r, 0), a.len - cached, a.len) != 0) {
                status = PKV_ERR_OUT_OF_MEMORY;
                goto out;
            }
            for (uint32_t c = 1; c < a.nseq; c++) {
                const double nk = (double)own;
                if (own == 0) break; // nothing of their own yet
                b.prefill_tokens += own;
                b.prefill_attn_pairs += nk * (a.len - own) + nk * (nk + 1) / 2;
                b.prefill_ctx_tokens += a.len;
                if (e->ex->needs_seqs &&
                    push_seq(e, ops->seq_of(e->pol, r, c), own, a.len) != 0) {
                    status = PKV_ERR_OUT_OF_MEMORY;
                    goto out;
                }
            }
        }
        if (e->run_count == 0) {
            // Nothing runs and the head cannot be admitted into empty memory: drop
            // it so that the replay always makes progress.
            if (e->wq_len > 0) {
                uint32_t r = wq_front(e);
                wq_pop_front(e);
                reject(e, r);
                finished++;
            }
            continue;
        }
        // 3. Sample memory, time the step.
        pkvi_mem_sample tot;
        ops->totals(e->pol, &tot);
        uint64_t reservation = 0;
        for (uint32_t i = 0; i < e->run_count; i++) {
            const uint32_t r = e->running[i];
            pkvi_mem_sample s;
            // After growth a decoded sequence holds P + e tokens; a restored one
            // P + e - 1; a new one P (e = 0).
            const uint32_t len = e->reqs[r].prompt_tokens + e->st[r].emitted -
                                 (e->st[r].fresh && e->st[r].restore ? 1 : 0);
            ops->sample(e->pol, r, e->st[r].nseq, len, (uint32_t)final_len(&e->reqs[r]), &s);
            reservation += s.reservation;
        }
        pkvi_alloc_counts cnt;
        ops->counts(e->pol, &cnt);
        b.copy_bytes = (cnt.copy_slots - copy_slots_seen) * e->bpt;
        copy_slots_seen = cnt.copy_slots;
        b.seqs = e->seqs;
        b.num_seqs = e->num_seqs;
        double dt = 0;
        if ((status = e->ex->step(e->ex, &b, &dt)) != PKV_OK) goto out;
        if (prm->mode == PKV_REPLAY_SIM) {
            const pkv_block_copy *cp;
            (void)pkvi_policy_paged_take_copies(e->pol, &cp); // sim: nothing to move
        }
        t += dt;
        const uint64_t used = tot.used, reserved = tot.reserved;
        if (prm->validate) {
            pkv_status vs = ops->validate(e->pol);
            if (vs != PKV_OK) {
                status = vs;
                goto out;
            }
            if (used > reserved || reserved > cap_slots || reservation > reserved - used) {
                status = PKV_ERR_CORRUPT;
                goto out;
            }
        }
        if (used > peak_used) peak_used = used;
        if (reserved > peak_reserved) peak_reserved = reserved;
        if (reserved > 0 && dt > 0) {
            const double rs = (double)reserved;
            w_sum += dt;
            waste_sum += dt * (double)(reserved - used) / rs;
            reservation_sum += dt * (double)reservation / rs;
            internal_sum += dt * (double)(reserved - used - reservation) / rs;
            ext_sum += dt * (double)ext_frag / (double)cap_slots;
        }
        const uint32_t batch = b.num_decode_seqs + b.num_prefill_seqs;
        batch_sum += batch;
        if (batch > batch_max) batch_max = batch;
        if (dvec_push(&step_s, dt) != 0) {
            status = PKV_ERR_OUT_OF_MEMORY;
            goto out;
        }
        // 4. Emit tokens, fork, finish.
        uint32_t keep = 0;
        for (uint32_t i = 0; i < e->run_count; i++) {
            const uint32_t r = e->running[i];
            req_state *s = &e->st[r];
            const pkv_trace_request *q = &e->reqs[r];
            if (s->fresh) {
                s->fresh = 0;
                if (s->restore) {
                    s->restore = 0; // restored state; it decodes from the next step
                } else {
                    s->emitted = 1;
                    s->first_token_s = t;
                    ops->commit(e->pol, r, q->prompt_tokens); // its prompt K/V exist now
                    if (q->output_tokens > 1 && q->n > 1) {
                        if ((status = ops->fork(e->pol, r, q->n)) != PKV_OK) goto out;
                        s->nseq = q->n;
                        e->forks += q->n - 1;
                    }
                }
            } else {
                s->emitted++;
            }
            if (s->emitted >= q->output_tokens) {
                ops->release(e->pol, r);
                e->run_seqs -= q->output_tokens > 1 ? q->n : 1;
                s->nseq = 0;
                s->status = RS_DONE;
                e->completed++;
                finished++;
                e->output_tokens += (uint64_t)q->output_tokens * q->n;
                last_finish = t;
                if (dvec_push(&ttft, (s->first_token_s - q->arrival_s) * 1e3) != 0 ||
                    (q->output_tokens > 1 &&
                     dvec_push(&tpot, (t - s->first_token_s) * 1e3 / (q->output_tokens - 1)) != 0)) {
                    status = PKV_ERR_OUT_OF_MEMORY;
                    goto out;
                }
            } else {
                e->running[keep++] = r;
            }
        }
        e->run_count = keep;
        if (prm->on_step) {
            pkv_replay_step ps;
            ps.index = steps;
            ps.time_s = t;
            ps.step_s = dt;
            ps.running = batch;
            ps.waiting = e->wq_len;
            ps.used_bytes = used * e->bpt;
            ps.reserved_bytes = reserved * e->bpt;
            ps.reservation_bytes = reservation * e->bpt;
            ps.ext_frag_bytes = ext_frag * e->bpt;
            ps.free_bytes = (cap_slots - reserved) * e->bpt;
            ps.capacity_bytes = cap_slots * e->bpt;
            prm->on_step(prm->user, &ps);
        }
        steps++;
        if (prm->on_progress && (steps & 4095) == 0)
            prm->on_progress(prm->user, (double)finished / (double)e->n);
    }
    if (prm->on_progress) prm->on_progress(prm->user, 1.0);
    // Report.
    rep->requests.total = e->n;
    rep->requests.completed = e->completed;
    rep->requests.rejected = e->rejected;
    rep->memory.capacity_bytes = cap_slots * e->bpt;
    rep->memory.peak_reserved_bytes = peak_reserved * e->bpt;
    rep->memory.peak_used_bytes = peak_used * e->bpt;
    if (w_sum > 0) {
        rep->memory.waste_frac = waste_sum / w_sum;
        rep->memory.internal_frag_frac = internal_sum / w_sum;
        rep->memory.reservation_frac = reservation_sum / w_sum;
        rep->memory.external_frag_frac = ext_sum / w_sum;
    }
    // qsort must not see NULL, which an empty vector (nothing completed) holds.
    if (step_s.n) qsort(step_s.v, step_s.n, sizeof(double), cmp_double);
    if (ttft.n) qsort(ttft.v, ttft.n, sizeof(double), cmp_double);
    if (tpot.n) qsort(tpot.v, tpot.n, sizeof(double), cmp_double);
    rep->latency.step_p50_ms = percentile(&step_s, 50) * 1e3;
    rep->latency.step_p90_ms = percentile(&step_s, 90) * 1e3;
    rep->latency.step_p99_ms = percentile(&step_s, 99) * 1e3;
    rep->latency.step_max_ms = step_s.n ? step_s.v[step_s.n - 1] * 1e3 : 0;
    rep->latency.ttft_p50_ms = percentile(&ttft, 50);
    rep->latency.ttft_p99_ms = percentile(&ttft, 99);
    rep->latency.tpot_p50_ms = percentile(&tpot, 50);
    rep->latency.tpot_p99_ms = percentile(&tpot, 99);
    rep->throughput.output_tokens = e->output_tokens;
    rep->throughput.makespan_s = last_finish - e->reqs[0].arrival_s;
    rep->throughput.output_tokens_per_s =
        rep->throughput.makespan_s > 0 ? (double)e->output_tokens / rep->throughput.makespan_s : 0;
    rep->batch.mean = steps ? (double)batch_sum / (double)steps : 0;
    rep->batch.max = batch_max;
    rep->steps = steps;
    rep->preemptions = e->preemptions;
    rep->forks = e->forks;
    {
        pkvi_alloc_counts cnt;
        ops->counts(e->pol, &cnt);
        rep->cow_copies = cnt.cow_copies;
        rep->prefix_cached_tokens = cnt.cached_tokens;
        rep->copy_bytes = cnt.copy_slots * e->bpt;
        rep->alloc.backend_alloc_calls = cnt.alloc_calls;
        rep->alloc.backend_free_calls = cnt.free_calls;
    }
    rep->swap_bytes = e->swap_slots_total * e->bpt;
out:
    free(step_s.v);
    free(ttft.v);
    free(tpot.v);
    return status;
}

static int params_ok(const pkv_replay_params *p) {
    return (unsigned)p->policy < PKV_POLICY_COUNT && p->block_size >= 1 && p->block_size <= 65536 &&
           (p->preempt == PKV_PREEMPT_RECOMPUTE || p->preempt == PKV_PREEMPT_SWAP) &&
           (p->mode == PKV_REPLAY_SIM || p->mode == PKV_REPLAY_RUN) && p->max_batch >= 1 &&
           p->max_tokens_per_step >= 1 && p->watermark >= 0 && p->watermark < 1 &&
           (p->dtype_bytes == 1 || p->dtype_bytes == 2 || p->dtype_bytes == 4) &&
           p->sim_alloc_call_s >= 0 && pkv_model_config_validate(&p->model) == PKV_OK;
}

pkv_status pkv_replay_run(const pkv_trace *trace, const pkv_replay_params *params,
                          pkv_replay_report *report) {
    if (!trace || !params || !report || pkv_trace_count(trace) == 0 || !params_ok(params))
        return PKV_ERR_INVALID_ARG;
    if (pkv_trace_count(trace) > UINT32_MAX - 1) return PKV_ERR_INVALID_ARG;
    if (params->mode == PKV_REPLAY_RUN && params->policy != PKV_POLICY_PAGED)
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
    };
    st = prm.policy == PKV_POLICY_PAGED ? pkvi_policy_paged_create(&pc, &e.pol)
                                        : pkvi_policy_contig_create(&pc, &e.pol);
    if (st != PKV_OK) goto done;
    e.wm_slots = (uint64_t)ceil(prm.watermark * (double)e.pol->capacity_slots);
    st = prm.mode == PKV_REPLAY_SIM ? pkvi_executor_roofline_create(&prm, &e.ex)
                                    : pkvi_executor_run_create(&prm, e.pol, &e.ex);
    if (st != PKV_OK) goto done;
    memset(report, 0, sizeof *report);
    snprintf(report->policy, sizeof report->policy, "%s", pkv_policy_name(prm.policy));
    snprintf(report->mode, sizeof report->mode, "%s", prm.mode == PKV_REPLAY_SIM ? "sim" : "run");
    report->block_size = prm.policy == PKV_POLICY_PAGED ? prm.block_size : 1;
    report->kv_bytes_per_token = e.bpt;
    st = engine_run(&e, report);
    if (st != PKV_OK) goto done;
    if (prm.mode == PKV_REPLAY_SIM) {
        report->alloc.backend_alloc_seconds = (double)report->alloc.backend_alloc_calls * prm.sim_alloc_call_s;
        report->alloc.backend_free_seconds = (double)report->alloc.backend_free_calls * prm.sim_alloc_call_s;
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

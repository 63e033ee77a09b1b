// SPDX-License-Identifier: MIT
// The replay engine: a scheduler with iteration-level (continuous) or static
// batching that drives one KV policy and one step executor over a trace.
// (Admission and prefill are in admit.c, pkv_replay_run in replay.c.)
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
#include <inttypes.h>
#include <stdlib.h>
#include <string.h>

#include "engine.h"

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

int pkvi_engine_record(engine *e, uint32_t r, int kind) {
    pkv_replay_schedule *s = e->rec;
    if (!s) return 0;
    if (s->n == s->cap) {
        size_t c = s->cap ? s->cap * 2 : 1024;
        sched_event *p = realloc(s->ev, c * sizeof *p);
        if (!p) return -1;
        s->ev = p;
        s->cap = c;
    }
    const int at = (kind == EV_PREEMPT || kind == EV_REJECT_MEM) && e->grow_r != UINT32_MAX;
    s->ev[s->n++] = (sched_event){e->steps, r, (uint8_t)kind, at ? e->grow_r : UINT32_MAX,
                                  at ? e->grow_c : 0};
    return 0;
}

static void reject(engine *e, uint32_t r, int no_memory) {
    if (pkvi_engine_record(e, r, no_memory ? EV_REJECT_MEM : EV_REJECT_LONG) != 0) e->rec_failed = 1;
    set_status(e, r, RS_REJECTED);
    e->rejected++;
    e->finished++;
    if (no_memory) {
        pkvi_admit a;
        pkvi_engine_make_admit(e, r, &a);
        a.len = a.prompt;
        a.nseq = 1;
        const uint64_t need = pkvi_engine_need_slots(e, &a);
        if (need < e->min_need_slots) e->min_need_slots = need;
        e->rejected_mem++;
    } else {
        if (final_len(e, r) < e->min_long_len) e->min_long_len = final_len(e, r);
        e->rejected_long++;
    }
}

// The policy's sequence id of (r, child), or -1 where it keeps none.
static pkv_seq_id seq_id(const engine *e, uint32_t r, uint32_t child) {
    return e->pol->vt->seq_of ? e->pol->vt->seq_of(e->pol->state, r, child) : -1;
}

int pkvi_engine_push_seq(engine *e, uint32_t r, uint32_t child, uint32_t new_tokens, uint32_t ctx) {
    const pkv_seq_id id = seq_id(e, r, child);
    if (e->num_seqs == e->seqs_cap) {
        uint32_t c = e->seqs_cap ? e->seqs_cap * 2 : 256;
        pkvi_step_seq *p = realloc(e->seqs, c * sizeof *p);
        if (!p) return -1;
        e->seqs = p;
        e->seqs_cap = c;
    }
    e->seqs[e->num_seqs++] = (pkvi_step_seq){id, r, child, new_tokens, ctx};
    return 0;
}

void pkvi_engine_release(engine *e, uint32_t r) {
    e->pol->vt->release(e->pol->state, r);
    if (e->ex->on_release) e->ex->on_release(e->ex, r);
}

// ---- arrivals ----

// Requests that arrived by now join the queue; those that can never run are
// rejected on arrival.
static void arrivals(engine *e) {
    while (e->ai < e->n && arrival(e, e->ai) <= e->t) {
        const uint32_t r = e->ai++;
        pkvi_admit a;
        pkvi_engine_make_admit(e, r, &a);
        if (final_len(e, r) > e->max_len || a.n > e->prm->max_batch) {
            reject(e, r, 0);
        } else if (!e->pol->vt->fits_alone(e->pol->state, &a, e->wm_slots)) {
            reject(e, r, 1);
        } else {
            set_status(e, r, RS_WAITING);
            wq_push_back(e, r);
        }
    }
}

// ---- preempt ----

// Preempt running[i] (the newest unless a fixed schedule says otherwise);
// returns it. `requeue` 0: a fixed schedule readmits it when it says so.
static uint32_t preempt_at(engine *e, uint32_t i, int requeue) {
    const uint32_t v = e->running[i];
    memmove(&e->running[i], &e->running[i + 1], (size_t)(e->run_count - i - 1) * sizeof *e->running);
    e->run_count--;
    if (pkvi_engine_record(e, v, EV_PREEMPT) != 0) e->rec_failed = 1;
    req_state *s = &e->st[v];
    // A swap's size is asked before the release: a policy may measure what the
    // request's sequences hold (the hybrid policies: their live blocks).
    const int swap = e->prm->preempt == PKV_PREEMPT_SWAP && !s->prefilling;
    const uint64_t swap_bytes =
        swap ? pkvi_engine_request_slots(e, v, s->nseq, prompt_of(e, v) + s->emitted - 1) * e->bpt
             : 0;
    // A policy with swap slots keeps what the swap moves (swap_in brings exactly
    // that back); else, or when it cannot, the request is released.
    const int room = swap && e->swap_used + swap_bytes <= e->prm->swap_space_bytes;
    if (room && e->ex->on_swap_out)
        e->ex->on_swap_out(e->ex, v, s->nseq, prompt_of(e, v) + s->emitted - 1);
    const int kept = room && e->pol->vt->swap_out && e->pol->vt->swap_out(e->pol->state, v) == PKV_OK;
    if (kept) {
        if (e->ex->on_release) e->ex->on_release(e->ex, v);
    } else {
        pkvi_engine_release(e, v);
    }
    e->run_seqs -= width(e, v);
    set_status(e, v, RS_WAITING);
    s->swapped = 0;
    if (s->prefilling) {
        // Caught mid-prefill (chunked): nothing emitted; it starts over.
        s->prefilling = 0;
        s->nseq = 0;
    } else {
        s->restore = 1;
        if (e->prm->preempt == PKV_PREEMPT_SWAP) {
            if (kept || (room && !e->pol->vt->swap_out)) {
                s->swapped = 1;
                s->swap_bytes = swap_bytes;
                e->swap_used += swap_bytes;
                e->swap_out += swap_bytes;
                e->b.swap_bytes += swap_bytes; // swap-out: charged to this step
            } else {
                e->swap_fallbacks++; // host pool full (or swap_out refused): recompute instead
                if (room && e->ex->on_swap_drop) e->ex->on_swap_drop(e->ex, v);
            }
        }
    }
    e->preemptions++;
    e->preempted = 1;
    if (requeue) wq_push_front(e, v);
    return v;
}

static uint32_t preempt(engine *e) {
    if (e->fixed) e->deviations++; // a preemption the schedule did not make
    return preempt_at(e, e->run_count - 1, 1);
}

// ---- decode ----

// Running[i] can never finish (alone and still short: fragmented extents): it
// is released and rejected rather than failing the run.
static void drop_running(engine *e, uint32_t i) {
    const uint32_t r = e->running[i];
    pkvi_engine_release(e, r);
    memmove(&e->running[i], &e->running[i + 1], (size_t)(e->run_count - i - 1) * sizeof *e->running);
    e->run_count--;
    e->run_seqs -= width(e, r);
    e->st[r].nseq = 0;
    reject(e, r, 1);
}

// Fixed schedule: the recorded preemptions (and drops) due before sequence (r, c) grows
// (all that are left when r = UINT32_MAX). Returns 1 if r itself was preempted;
// *i follows r's position in running.
static int preempt_due(engine *e, uint32_t r, uint32_t c, uint32_t *i) {
    int self = 0;
    uint32_t keep = 0;
    for (uint32_t k = 0; k < e->num_due; k++) {
        const sched_event *ev = e->due[k];
        if (r != UINT32_MAX && (ev->at_r != r || ev->at_c != c)) {
            e->due[keep++] = ev;
            continue;
        }
        uint32_t j = 0;
        while (j < e->run_count && e->running[j] != ev->r) j++;
        if (j == e->run_count) {
            // A rejection after this step's preemption of the same request
            // (nothing ran and it could not come back): it is waiting now.
            const req_state *s = &e->st[ev->r];
            if (ev->kind != EV_PREEMPT && s->status == RS_WAITING && !e->queued[ev->r])
                reject(e, ev->r, ev->kind == EV_REJECT_MEM);
            else
                e->deviations++; // not running here
            continue;
        }
        if (ev->r == r) self = 1;
        else if (r != UINT32_MAX && j < *i) (*i)--;
        if (ev->kind == EV_PREEMPT) preempt_at(e, j, 0);
        else drop_running(e, j);
    }
    e->num_due = keep;
    return self;
}

// Grow every decoding sequence by its last emitted token; preempt when short.
static pkv_status decode(engine *e) {
    for (uint32_t i = 0; i < e->run_count;) {
        const uint32_t r = e->running[i];
        req_state *s = &e->st[r];
        if (s->prefilling) { // still computing its prompt (chunked)
            i++;
            continue;
        }
        int gone = 0, due = 0;
        for (uint32_t c = 0; c < s->nseq && !gone; c++) {
            if (e->num_due && preempt_due(e, r, c, &i)) {
                gone = due = 1;
                break;
            }
            e->grow_r = r;
            e->grow_c = c;
            for (;;) {
                pkv_status st = pkvi_policy_grow(e->pol, r, c);
                if (st == PKV_OK) break;
                if (st != PKV_ERR_OUT_OF_BLOCKS) return st;
                if (e->run_count == 1) {
                    drop_running(e, 0); // alone and still short
                    gone = 1;
                    break;
                }
                if (preempt(e) == r) {
                    gone = 1;
                    break;
                }
            }
        }
        e->grow_r = UINT32_MAX;
        // A recorded preemption (fixed schedule) may take r from anywhere in the
        // running list: running[i] now holds the next request, still to grow. A
        // preemption of our own takes the newest, so r was the tail: nobody after it.
        if (due) continue;
        if (gone) break;
        const uint32_t ctx = prompt_of(e, r) + s->emitted;
        e->b.num_decode_seqs += s->nseq;
        e->b.decode_ctx_tokens += (uint64_t)s->nseq * ctx;
        if (e->groups.hetero) {
            double kb = 0, lk = 0;
            pkvi_groups_decode_read(&e->groups, ctx, &kb, &lk);
            e->b.decode_kv_bytes += kb * s->nseq;
            e->b.decode_layer_keys += lk * s->nseq;
        }
        if (e->ex->needs_seqs)
            for (uint32_t c = 0; c < s->nseq; c++)
                if (pkvi_engine_push_seq(e, r, c, 1, ctx) != 0) return PKV_ERR_OUT_OF_MEMORY;
        i++;
    }
    e->grow_r = UINT32_MAX;
    if (e->num_due) (void)preempt_due(e, UINT32_MAX, 0, NULL); // their point never came
    if (e->prm->validate) {
        // Every running request past its prompt decoded this step, each sequence once.
        uint64_t want = 0;
        for (uint32_t i = 0; i < e->run_count; i++)
            if (!e->st[e->running[i]].prefilling) want += e->st[e->running[i]].nseq;
        if (want != e->b.num_decode_seqs) return PKV_ERR_CORRUPT;
    }
    if (e->prm->chunked_prefill) {
        const uint64_t d = e->b.num_decode_seqs;
        e->budget_left = d < e->prm->chunked_prefill ? e->prm->chunked_prefill - d : 0;
    }
    return PKV_OK;
}

// ---- time ----

// Per-group figures of one step (models with groups): what each group needs and
// holds; a group-unaware policy holds every reserved slot in every group.
// Bytes group g's blocks hold: the policy's count, or for a group-unaware policy
// every reserved slot at the group's bytes per token.
static uint64_t group_held(const engine *e, const pkv_policy_stats *tot, uint64_t reserved,
                           uint32_t g) {
    return tot->num_groups ? tot->groups[g].bytes_held : reserved * e->groups.bpt[g];
}

static void group_sample(engine *e, const pkv_policy_stats *tot, uint64_t reserved,
                         const uint64_t *need_g, double dt) {
    accum *A = &e->acc;
    for (uint32_t g = 0; g < e->groups.n; g++) {
        const int own = tot->num_groups != 0;
        const uint64_t held = group_held(e, tot, reserved, g);
        const uint64_t tok = own ? tot->groups[g].tokens_held : reserved;
        A->g_need[g] += dt * (double)need_g[g];
        A->g_held[g] += dt * (double)held;
        A->g_tok[g] += dt * (double)tok;
        if (held > e->g_peak_held[g]) e->g_peak_held[g] = held;
    }
}

// Sample memory, time the step, charge the backend calls, advance the clock.
static pkv_status time_step(engine *e, double *dt_out) {
    const pkv_replay_params *prm = e->prm;
    const uint64_t cap = e->pol->info.capacity_slots;
    pkv_policy_stats tot;
    if (pkvi_policy_stats(e->pol, &tot) != PKV_OK) return PKV_ERR_CORRUPT; // policy_check.c
    uint64_t reservation = 0, padding = 0, uncomputed = 0;
    uint64_t need_g[PKV_MAX_KV_GROUPS] = {0}, need_bytes = 0;
    for (uint32_t i = 0; i < e->run_count; i++) {
        const uint32_t r = e->running[i];
        const req_state *s = &e->st[r];
        if (s->pad_prompt) {
            // Padding stored per sequence: the prompt's pad tokens, and the tokens
            // generated past the request's own output (its final length).
            const pkv_trace_request *q = &e->reqs[r];
            const uint32_t held = (s->fresh || s->prefilling) ? s->pf_len : prompt_of(e, r) + s->emitted;
            const uint32_t pp = prompt_of(e, r) - q->prompt_tokens;
            const uint32_t real_end = pp + q->prompt_tokens + q->output_tokens - 1;
            padding += (uint64_t)s->nseq * (pp + (held > real_end ? held - real_end : 0));
        }
        // After growth a decoded sequence holds P + e tokens; one that was
        // prefilled or restored (or still is) what its prefill fills.
        const uint32_t len = (s->fresh || s->prefilling) ? s->pf_len : prompt_of(e, r) + s->emitted;
        const uint64_t rv = e->pol->vt->reservation(e->pol->state, r, s->nseq, len, (uint32_t)final_len(e, r));
        // Saturate: a lying plugin's huge values must not wrap past the check below.
        reservation = rv > UINT64_MAX - reservation ? UINT64_MAX : reservation + rv;
        // Chunked prefill: the whole prompt was allocated at admission, but the
        // tokens no chunk has computed yet hold no K/V: reservation, not used.
        if (s->prefilling) uncomputed += s->pf_len - s->pf_done + s->pf_extra;
        // What the model needs of it, group by group (forked samples share the prompt
        // in sim mode; run mode restores each sequence alone).
        // A prefill chunk run in this step needs what its own queries see (a whole
        // window before its first one): a sliding group's early prompt blocks are
        // in use until the step ends, not waste.
        const int shared = prm->mode == PKV_REPLAY_SIM;
        if (e->groups.hetero && s->pf_step == e->steps + 1 && (s->fresh || s->prefilling))
            need_bytes += pkvi_groups_chunk_bytes(&e->groups, s->nseq, len, prompt_of(e, r), shared,
                                                  s->pf_first, s->prefilling ? s->pf_done : len, need_g);
        else if (e->groups.hetero)
            need_bytes += pkvi_groups_needed_bytes(&e->groups, s->nseq, len, prompt_of(e, r),
                                                   shared, need_g);
    }
    e->b.copy_bytes = (tot.copy_slots - e->copy_slots_seen) * e->bpt;
    e->copy_slots_seen = tot.copy_slots;
    e->b.seqs = e->seqs;
    e->b.num_seqs = e->num_seqs;
    double dt = 0;
    pkvi_step_time parts;
    pkv_status status = e->ex->step(e->ex, &e->b, &dt, &parts);
    if (status != PKV_OK) return status;
    double work_flops = parts.flops, work_bytes = parts.bytes;
    if (e->work) {
        double wdt;
        pkvi_step_time wp;
        if ((status = e->work->step(e->work, &e->b, &wdt, &wp)) != PKV_OK) return status;
        work_flops = wp.flops;
        work_bytes = wp.bytes;
    }
    if (prm->mode == PKV_REPLAY_SIM && e->pol->vt->take_copies) {
        const pkv_block_copy *cp;
        (void)e->pol->vt->take_copies(e->pol->state, &cp); // sim: nothing to move
    }
    // Backend calls since the last step: a synchronizing call stalls the
    // device; an overlapping one hides behind the step's device work.
    pkvi_charges *ch = &e->pol->charges;
    const double exec = dt;
    dt = (dt > ch->async_s ? dt : ch->async_s) + ch->sync_s;
    const double alloc_s = dt - exec;
    // Charged: what lengthened the step; overlapped: the calls' time it hid
    // (an overlapping call hides up to the step's device time).
    e->acc.alloc_step_s += alloc_s;
    e->acc.alloc_hidden_s += ch->async_s < exec ? ch->async_s : exec;
    ch->sync_s = ch->async_s = 0;
    e->t += dt;
    if (prm->validate && (status = pkvi_policy_validate(e->pol)) != PKV_OK) return status;
    if ((status = pkvi_policy_check_reservation(e->pol, &tot, reservation)) != PKV_OK) return status;
    // Chunked prefill: prompt tokens that no chunk has computed yet are held for the
    // tokens to come (reservation), not token states.
    const uint64_t reserved = tot.reserved;
    uint64_t used;
    if (e->groups.hetero) {
        // A model with groups: token states are what the model needs (groups.c: the
        // step's queries and the next ones), whatever the policy thinks it keeps; what
        // a layout holds beyond that (tokens out of every window) is internal
        // fragmentation.
        // Requests sharing blocks (a prefix cache) are counted each: a group needs
        // at most what it stores, its held bytes (a group-unaware policy: each
        // distinct token slot it stores, at the group's bytes per token).
        const uint64_t stored = tot.used - (uncomputed < tot.used ? uncomputed : tot.used);
        need_bytes = 0;
        for (uint32_t g = 0; g < e->groups.n; g++) {
            const uint64_t cap_g = tot.num_groups ? tot.groups[g].bytes_held : stored * e->groups.bpt[g];
            if (need_g[g] > cap_g) need_g[g] = cap_g;
            need_bytes += need_g[g];
        }
        const uint64_t room = reserved > reservation ? reserved - reservation : 0;
        const uint64_t pending = uncomputed < room ? uncomputed : room;
        reservation += pending;
        used = need_bytes / e->bpt < room - pending ? need_bytes / e->bpt : room - pending;
    } else {
        used = tot.used - (uncomputed < tot.used ? uncomputed : tot.used);
        reservation += tot.used - used;
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
        A->b_pad += dt * (double)(padding < used ? padding : used) / c;
        if (e->groups.hetero) group_sample(e, &tot, reserved, need_g, dt);
        A->busy_s += dt;
        const double ps = parts.prefill_s, ds = parts.decode_s;
        const double pshare = ps + ds > 0 ? ps / (ps + ds) : (e->b.prefill_tokens ? 1.0 : 0.0);
        A->prefill_s += dt * pshare;
        A->decode_s += dt * (1 - pshare);
        // Decode-phase steps: no prefill, and a decode or a swap (a step that
        // only swaps a sequence back in is decode time spent on the link).
        if (e->b.prefill_tokens == 0 && (e->b.num_decode_seqs > 0 || e->b.swap_bytes > 0)) {
            A->dec_s += dt;
            A->dec_flops += parts.flops;
            // Swapped bytes cross HBM once (read out, or written in) besides the link.
            A->dec_bytes += parts.bytes + (double)e->b.swap_bytes;
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
        ps.waiting = e->fixed ? e->nwait : e->wq_len;
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
        ps.work_flops = work_flops;
        ps.work_bytes = work_bytes;
        if (e->groups.hetero) {
            ps.num_groups = e->groups.n;
            for (uint32_t g = 0; g < e->groups.n; g++) {
                ps.groups[g].needed_bytes = need_g[g];
                ps.groups[g].held_bytes = group_held(e, &tot, reserved, g);
            }
        }
        prm->on_step(prm->user, &ps);
    }
    *dt_out = dt;
    return PKV_OK;
}

// ---- retire ----

// Emit tokens, fork, finish.
static pkv_status retire(engine *e) {
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
                if (e->pol->vt->commit) // its prompt K/V exist now
                    e->pol->vt->commit(e->pol->state, r, prompt_of(e, r));
                if (output_of(e, r) > 1 && q->n > 1) {
                    pkv_status st = pkvi_policy_fork(e->pol, r, q->n);
                    if (st == PKV_OK && e->ex->on_fork) st = e->ex->on_fork(e->ex, r, q->n);
                    if (st != PKV_OK) return st;
                    s->nseq = q->n;
                    e->forks += q->n - 1;
                }
            }
        } else {
            s->emitted++;
        }
        if (s->emitted >= output_of(e, r)) {
            pkvi_engine_release(e, r);
            e->run_seqs -= width(e, r);
            s->nseq = 0;
            set_status(e, r, RS_DONE);
            e->completed++;
            e->finished++;
            e->output_tokens += (uint64_t)q->output_tokens * q->n;
            e->padding_tokens += (uint64_t)q->n * ((prompt_of(e, r) - q->prompt_tokens) +
                                                   (output_of(e, r) - q->output_tokens));
            e->last_finish = e->t;
            e->norm_sum += (e->t - arrival(e, r)) / q->output_tokens;
            if (dvec_push(&e->ttft, (s->first_token_s - arrival(e, r)) * 1e3) != 0 ||
                (q->output_tokens > 1 &&
                 dvec_push(&e->tpot, (e->t - s->first_token_s) * 1e3 / (q->output_tokens - 1)) != 0))
                return PKV_ERR_OUT_OF_MEMORY;
            if (e->prm->on_request) {
                const pkv_replay_request_done rd = {r, arrival(e, r), s->first_token_s, e->t,
                                                    q->prompt_tokens, q->output_tokens, q->n};
                e->prm->on_request(e->prm->user, &rd);
            }
        } else {
            e->running[keep++] = r;
        }
    }
    e->run_count = keep;
    return PKV_OK;
}

// ---- fixed schedule ----

// Apply the recorded events of schedule step sk: rejections and preemptions
// now, admissions join the queue (admit() takes them as usual, so a policy that
// cannot hold one delays it: a deviation). With nothing running or waiting,
// jump to the next step that has an event. A request is never served before
// it arrives: admitting it moves the clock to its arrival if need be.
static void fixed_events(engine *e) {
    const pkv_replay_schedule *S = e->fixed;
    if (e->run_count == 0 && e->wq_len == 0 && e->fi < S->n && S->ev[e->fi].step > e->sk)
        e->sk = S->ev[e->fi].step;
    while (e->fi < S->n && S->ev[e->fi].step <= e->sk) {
        const sched_event *ev = &S->ev[e->fi++];
        if (ev->kind == EV_ROUND) break; // the rest in the next round of this step
        const uint32_t r = ev->r;
        req_state *s = &e->st[r];
        const int idle = s->status == RS_PENDING || (s->status == RS_WAITING && !e->queued[r]);
        const int in_decode = ev->at_r != UINT32_MAX && ev->at_r < e->n &&
                              e->st[ev->at_r].status == RS_RUNNING && !e->st[ev->at_r].prefilling;
        if ((ev->kind == EV_REJECT_LONG || ev->kind == EV_REJECT_MEM) && s->status == RS_RUNNING) {
            // Dropped at its point in decode(), or rejected once decode() has
            // preempted it (at_r: none).
            e->due[e->num_due++] = ev;
        } else if (ev->kind == EV_REJECT_LONG || ev->kind == EV_REJECT_MEM) {
            if (idle) reject(e, r, ev->kind == EV_REJECT_MEM);
            else e->deviations++;
        } else if (ev->kind == EV_PREEMPT) {
            uint32_t i = 0;
            while (i < e->run_count && e->running[i] != r) i++;
            if (i < e->run_count && in_decode) e->due[e->num_due++] = ev; // at its point in decode()
            else if (i < e->run_count) preempt_at(e, i, 0);
            else e->deviations++;
        } else if (s->status == RS_PENDING) {
            pkvi_admit a;
            pkvi_engine_make_admit(e, r, &a);
            if (final_len(e, r) > e->max_len || a.n > e->prm->max_batch) {
                reject(e, r, 0);
                e->deviations++;
            } else if (!e->pol->vt->fits_alone(e->pol->state, &a, e->wm_slots)) {
                reject(e, r, 1);
                e->deviations++;
            } else {
                set_status(e, r, RS_WAITING);
                if (arrival(e, r) > e->t) e->t = arrival(e, r);
                wq_push_back(e, r);
            }
        } else if (idle) {
            wq_push_back(e, r); // a preempted request's readmission
        } else if (s->status != RS_WAITING) {
            e->deviations++; // running or finished here, not in the reference
        }
    }
}

// The schedule is exhausted and nothing runs: what is left was never admitted.
static void fixed_abandon(engine *e) {
    for (uint32_t r = 0; r < e->n; r++)
        if (e->st[r].status == RS_PENDING || e->st[r].status == RS_WAITING) {
            reject(e, r, 1);
            e->deviations++;
        }
}

// ---- one step, the loop, the report ----

static pkv_status engine_step(engine *e) {
    if (e->fixed) {
        fixed_events(e);
        // Arrived by now: counted as waiting until admitted (timelines).
        while (e->ai < e->n && arrival(e, e->ai) <= e->t) {
            const uint8_t s = e->st[e->ai].status;
            e->nwait += s == RS_PENDING || s == RS_WAITING;
            e->ai++;
        }
    } else {
        arrivals(e);
    }
    if (e->run_count == 0 && e->wq_len == 0) {
        // Idle until the next arrival; pending frees complete meanwhile (they
        // delay the next step only if they outlast the gap; not charged to a step).
        pkvi_charges *ch = &e->pol->charges;
        const double busy = e->t + ch->sync_s + ch->async_s;
        ch->sync_s = ch->async_s = 0;
        if (e->fixed) {
            e->t = busy; // the next admission moves the clock to its arrival
            if (e->fi >= e->fixed->n) fixed_abandon(e);
        } else if (e->ai < e->n) {
            e->t = arrival(e, e->ai) > busy ? arrival(e, e->ai) : busy;
        }
        return PKV_OK;
    }
    memset(&e->b, 0, sizeof e->b);
    e->num_seqs = 0;
    e->preempted = 0;
    e->ext_frag = 0;
    e->budget_left = 0;
    pkv_status st;
    if ((st = decode(e)) != PKV_OK) return st;
    if ((st = pkvi_engine_prefill(e)) != PKV_OK) return st;
    if ((st = pkvi_engine_admit(e)) != PKV_OK) return st;
    if (e->fixed) e->deviations += e->wq_len; // recorded admissions it had to delay
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
            // What a policy's swap_out kept goes with it.
            if (e->st[r].swapped && e->pol->vt->swap_out) e->pol->vt->release(e->pol->state, r);
            reject(e, r, 1);
            if (e->fixed) e->deviations++;
        }
        if (pkvi_engine_record(e, 0, EV_ROUND) != 0) e->rec_failed = 1;
        return PKV_OK;
    }
    double dt;
    if ((st = time_step(e, &dt)) != PKV_OK) return st;
    if ((st = retire(e)) != PKV_OK) return st;
    e->steps++;
    e->sk++;
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
                 "holds %" PRIu64 " tokens)",
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
    rep->memory.padding_frac = nan;
    rep->latency.step_p50_ms = rep->latency.step_p90_ms = nan;
    rep->latency.step_p99_ms = rep->latency.step_max_ms = nan;
    rep->latency.ttft_p50_ms = rep->latency.ttft_p99_ms = nan;
    rep->latency.tpot_p50_ms = rep->latency.tpot_p99_ms = nan;
    rep->latency.norm_ms_per_token = nan;
    rep->throughput.output_tokens_per_s = rep->throughput.makespan_s = nan;
    rep->time.prefill_frac = rep->time.decode_frac = nan;
    rep->time.decode_compute_util = rep->time.decode_bw_util = nan;
}

void pkvi_engine_report_failed(const engine *e, uint64_t budget, pkv_replay_report *rep) {
    report_failed(rep);
    explain_failure(e, budget, rep);
}

static double ratio(double a, double b) { return b > 0 ? a / b : NAN; }

// memory.groups: the time averages of group_sample and the policy's counts.
static void report_groups(const engine *e, const pkv_policy_stats *cnt, pkv_replay_report *rep) {
    const accum *A = &e->acc;
    const double cap = (double)rep->memory.capacity_bytes;
    rep->memory.num_groups = e->groups.n;
    for (uint32_t g = 0; g < e->groups.n; g++) {
        struct pkv_replay_group_report *o = &rep->memory.groups[g];
        const pkv_kv_group *k = &e->groups.g[g];
        snprintf(o->kind, sizeof o->kind, "%s", pkv_layer_kind_name(k->kind));
        o->layers = k->num_layers;
        o->window = k->window;
        o->bytes_per_token = e->groups.bpt[g];
        o->needed_frac = ratio(A->g_need[g], A->wb * cap);
        o->held_frac = ratio(A->g_held[g], A->wb * cap);
        o->tokens_held_mean = ratio(A->g_tok[g], A->wb);
        o->peak_held_bytes = e->g_peak_held[g];
        o->blocks_released = cnt->num_groups ? cnt->groups[g].blocks_released : 0;
        o->cached_tokens = cnt->num_groups ? cnt->groups[g].cached_tokens : cnt->cached_tokens;
    }
}

pkv_status pkvi_engine_run(engine *e, uint64_t budget, pkv_replay_report *rep) {
    pkv_status status = PKV_OK;
    e->t = arrival(e, 0);
    e->last_finish = e->t;
    e->min_need_slots = UINT64_MAX;
    e->min_long_len = UINT64_MAX;
    while (e->finished < e->n) {
        const uint64_t before = e->steps;
        if ((status = engine_step(e)) != PKV_OK) goto out;
        if (e->prm->on_progress && e->steps != before) {
            // After every step (not after an idle jump to the next arrival).
            const pkv_replay_progress pg = {e->steps, e->finished, e->n, e->t};
            if (e->prm->on_progress(e->prm->user, &pg)) {
                rep->partial = 1; // the report covers what was replayed so far
                break;
            }
        }
    }
    if (e->rec_failed) {
        status = PKV_ERR_OUT_OF_MEMORY;
        goto out;
    }
    if (e->rec) e->rec->steps = e->steps;
    rep->schedule_deviations = e->deviations;
    rep->requests.total = e->n;
    rep->requests.completed = e->completed;
    rep->requests.rejected = e->rejected;
    rep->requests.rejected_too_long = e->rejected_long;
    rep->requests.rejected_no_memory = e->rejected_mem;
    rep->memory.capacity_bytes = e->pol->info.capacity_slots * e->bpt;
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
    rep->memory.padding_frac = ratio(A->b_pad, A->wb);
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
    rep->latency.norm_ms_per_token = ratio(e->norm_sum * 1e3, (double)e->completed);
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
    pkv_policy_stats cnt = {0}; // a policy fills what it has: the per-group counts may stay 0
    e->pol->vt->stats(e->pol->state, &cnt);
    rep->cow_copies = cnt.cow_copies;
    rep->prefix_cached_tokens = cnt.cached_tokens;
    if (e->groups.hetero) report_groups(e, &cnt, rep);
    rep->copy_bytes = cnt.copy_slots * e->bpt;
    // The arena (uses_arena) is one call each way, outside every step.
    rep->alloc.backend_alloc_calls = e->pol->alloc_calls + (e->pol->info.uses_arena ? 1 : 0);
    rep->alloc.backend_free_calls = e->pol->free_calls + (e->pol->info.uses_arena ? 1 : 0);
    rep->alloc.step_seconds = A->alloc_step_s;
    rep->alloc.overlapped_seconds = A->alloc_hidden_s;
    rep->swap_out_bytes = e->swap_out;
    rep->swap_in_bytes = e->swap_in;
    rep->swap_bytes = e->swap_out + e->swap_in;
    rep->swap_fallbacks = e->swap_fallbacks;
    if (e->completed == 0) {
        pkvi_engine_report_failed(e, budget, rep);
    }
out:
    free(e->step_s.v);
    free(e->ttft.v);
    free(e->tpot.v);
    return status;
}

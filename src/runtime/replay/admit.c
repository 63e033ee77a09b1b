// SPDX-License-Identifier: MIT
// Admission and prefill: which waiting requests start in a step (continuous
// batching: FCFS within the policy's memory, the batch limit and the step's
// token budget; static batching: a whole batch padded to its longest prompt and
// output, only when nothing runs), and how much of each prompt a step computes
// (all of it, or chunks of --chunked-prefill tokens).
#include <string.h>

#include "engine.h"

void pkvi_engine_make_admit(const engine *e, uint32_t r, pkvi_admit *a) {
    const req_state *s = &e->st[r];
    a->prompt = prompt_of(e, r);
    a->final_len = final_len(e, r) > UINT32_MAX ? UINT32_MAX : (uint32_t)final_len(e, r);
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
uint64_t pkvi_engine_need_slots(const engine *e, const pkvi_admit *a) {
    return e->pol->vt->need(&e->pol->cfg, a);
}

// Slots a request's KV occupies (what a swap moves): the policy says what its
// sequences share (the paged policy's forks share the prompt's full blocks,
// malloc-per-token's the whole prompt); by default nothing is shared.
uint64_t pkvi_engine_request_slots(const engine *e, uint32_t r, uint32_t nseq, uint32_t len) {
    if (e->pol->vt->request_slots)
        return e->pol->vt->request_slots(e->pol->state, r, nseq, len, prompt_of(e, r));
    return (uint64_t)(nseq ? nseq : 1) * len;
}

// Admit request r, or swap it back in through the policy's swap_in when its
// swap_out kept it (nothing computed, no prefix lookup: *cached 0).
static pkv_status admit_or_swap_in(engine *e, uint32_t r, const pkvi_admit *a, uint64_t *ef,
                                   uint32_t *cached) {
    const req_state *s = &e->st[r];
    if (s->restore && s->swapped && e->pol->vt->swap_in) {
        *cached = 0;
        return pkvi_policy_swap_in(e->pol, r, a, e->wm_slots, ef);
    }
    return pkvi_policy_admit(e->pol, r, a, e->wm_slots, ef, cached);
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
    if (e->groups.hetero)
        pkvi_groups_prefill_read(&e->groups, s->pf_done, (uint32_t)c, &e->b.prefill_kv_bytes,
                                 &e->b.prefill_layer_keys);
    if (e->ex->needs_seqs &&
        pkvi_engine_push_seq(e, r, 0, (uint32_t)c, (uint32_t)(s->pf_done + c)) != 0)
        return PKV_ERR_OUT_OF_MEMORY;
    s->pf_first = s->pf_done;
    s->pf_step = e->steps + 1;
    s->pf_done += (uint32_t)c;
    if (s->pf_done == s->pf_len) {
        // The restored samples' own tokens go with the last chunk.
        e->b.num_prefill_seqs += s->nseq - 1;
        e->b.prefill_tokens += s->pf_extra;
        e->b.prefill_attn_pairs += s->pf_extra_pairs;
        e->b.prefill_ctx_tokens += s->pf_extra_ctx;
        // Each restored sample computes its own tokens, the last `own` positions.
        const uint32_t own = s->pf_extra ? (uint32_t)(s->pf_extra / (s->nseq - 1)) : 0;
        for (uint32_t ch = 1; own && ch < s->nseq; ch++) {
            if (e->groups.hetero)
                pkvi_groups_prefill_read(&e->groups, s->pf_len - own, own, &e->b.prefill_kv_bytes,
                                         &e->b.prefill_layer_keys);
            if (e->ex->needs_seqs && pkvi_engine_push_seq(e, r, ch, own, s->pf_len) != 0)
                return PKV_ERR_OUT_OF_MEMORY;
        }
        s->prefilling = 0;
        s->fresh = 1;
    }
    return PKV_OK;
}

// Chunked prefill: running requests still prefilling continue, oldest first.
pkv_status pkvi_engine_prefill(engine *e) {
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
static pkv_status start(engine *e, uint32_t r, const pkvi_admit *a, uint32_t cached) {
    req_state *s = &e->st[r];
    if (pkvi_engine_record(e, r, EV_ADMIT) != 0) return PKV_ERR_OUT_OF_MEMORY;
    set_status(e, r, RS_RUNNING);
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
        if (e->ex->on_swap_in) e->ex->on_swap_in(e->ex, r);
        return PKV_OK;
    }
    // Recompute / prefill: sequence 0 computes its tokens past any cached
    // prefix; the other sequences their tokens past the shared prompt.
    const uint32_t own = a->independent ? a->len : a->len - a->prompt;
    s->pf_done = cached;
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
        pkvi_engine_make_admit(e, r, &a);
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
        uint32_t cached = 0;
        pkv_status st = admit_or_swap_in(e, r, &a, &ef, &cached);
        if (st == PKV_ERR_OUT_OF_BLOCKS) {
            e->ext_frag = ef;
            break;
        }
        if (st != PKV_OK) return st;
        wq_pop_front(e);
        if ((st = start(e, r, &a, cached)) != PKV_OK) return st;
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
            need += pkvi_engine_need_slots(e, &a);
        }
        if (i > 0 && need + e->wm_slots > e->pol->info.capacity_slots) break;
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
        pkvi_engine_make_admit(e, r, &a);
        uint64_t ef = 0;
        uint32_t cached = 0;
        pkv_status st = admit_or_swap_in(e, r, &a, &ef, &cached);
        if (st == PKV_ERR_OUT_OF_BLOCKS) {
            if (!s->restore) s->pad_prompt = s->pad_output = 0;
            e->ext_frag = ef;
            break;
        }
        if (st != PKV_OK) return st;
        wq_pop_front(e);
        if ((st = start(e, r, &a, cached)) != PKV_OK) return st;
    }
    return PKV_OK;
}

pkv_status pkvi_engine_admit(engine *e) {
    return e->prm->batching == PKV_BATCHING_STATIC ? admit_static(e) : admit_continuous(e);
}

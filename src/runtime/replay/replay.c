// SPDX-License-Identifier: MIT
// pkv_replay_run: checks the parameters, sets up the policy and the executor
// (roofline in sim mode, the decoder in run mode), runs the engine, and adds
// the backend-call totals to the report.
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "engine.h"
#include "src/allocator/clock.h"

static int params_ok(const pkv_replay_params *p) {
    pkv_sim_efficiency eff;
    return ((unsigned)p->policy < PKV_POLICY_COUNT || p->custom_policy) && p->block_size >= 1 && p->block_size <= 65536 &&
           (p->preempt == PKV_PREEMPT_RECOMPUTE || p->preempt == PKV_PREEMPT_SWAP) &&
           (p->mode == PKV_REPLAY_SIM || p->mode == PKV_REPLAY_RUN) && p->max_batch >= 1 &&
           p->max_tokens_per_step >= 1 && p->watermark >= 0 && p->watermark < 1 &&
           (p->dtype_bytes == 1 || p->dtype_bytes == 2 || p->dtype_bytes == 4) &&
           (p->kv_dtype == PKV_DTYPE_F32 ||
            (pkv_dtype_is_quantized(p->kv_dtype) && p->mode == PKV_REPLAY_SIM)) &&
           (p->batching == PKV_BATCHING_CONTINUOUS || p->batching == PKV_BATCHING_STATIC) &&
           (unsigned)p->device_mem <= PKV_DEVICE_MEM_TORCH_CACHING &&
           !(p->batching == PKV_BATCHING_STATIC && p->chunked_prefill) &&
           p->load_scale > 0 && isfinite(p->load_scale) &&
           pkv_alloc_call_cost_check(&p->alloc_model.alloc) == PKV_OK &&
           pkv_alloc_call_cost_check(&p->alloc_model.free) == PKV_OK &&
           pkv_replay_sim_efficiency(p, &eff) == PKV_OK &&
           pkv_model_config_validate(&p->model) == PKV_OK &&
           ((p->policy != PKV_POLICY_VMM && p->policy != PKV_POLICY_VMM_SYNC &&
             p->policy != PKV_POLICY_HYBRID_VMM) ||
            (p->vmm_page_bytes >= 4096 && p->vmm_page_bytes % 4096 == 0));
}

// A budget below one allocation unit: no policy can exist, every request is
// rejected for memory.
static void report_no_capacity(engine *e, uint64_t budget, pkv_replay_report *rep) {
    e->min_need_slots = UINT64_MAX;
    for (uint32_t r = 0; r < e->n; r++) {
        pkvi_admit a;
        pkvi_engine_make_admit(e, r, &a);
        const uint64_t need = pkvi_engine_need_slots(e, &a);
        if (need < e->min_need_slots) e->min_need_slots = need;
    }
    e->rejected = e->rejected_mem = e->n;
    rep->requests.total = e->n;
    rep->requests.rejected = rep->requests.rejected_no_memory = e->n;
    rep->memory.capacity_bytes = budget;
    pkvi_engine_report_failed(e, budget, rep);
}

// Arrivals are divided by the load scale as the engine runs: a tiny scale can
// push the last arrival to infinity, and a step loop waiting for it would never
// end (issue 15, defect 13). Arrivals are sorted, so the last one decides.
static int scaled_arrivals_finite(const pkv_trace *trace, double load_scale) {
    const pkv_trace_request *q = pkv_trace_requests(trace);
    return isfinite(q[pkv_trace_count(trace) - 1].arrival_s / load_scale);
}

// A schedule recorded on another trace names requests this one lacks.
static int schedule_ok(const pkv_replay_schedule *s, uint32_t n) {
    for (size_t i = 0; i < s->n; i++)
        if (s->ev[i].r >= n) return 0;
    return 1;
}

// pkv_replay_run, recording the schedule into `rec` when it is not NULL.
static pkv_status replay(const pkv_trace *trace, const pkv_replay_params *params,
                         pkv_replay_report *report, pkv_replay_schedule *rec) {
    if (report) memset(report, 0, sizeof *report); // failure stays empty unless set below
    if (!trace || !params || !report || pkv_trace_count(trace) == 0 || !params_ok(params))
        return PKV_ERR_INVALID_ARG;
    if (pkv_trace_count(trace) > UINT32_MAX - 1) return PKV_ERR_INVALID_ARG;
    if (!scaled_arrivals_finite(trace, params->load_scale)) return PKV_ERR_INVALID_ARG;
    if (params->schedule && (rec || !schedule_ok(params->schedule, (uint32_t)pkv_trace_count(trace))))
        return PKV_ERR_INVALID_ARG;
    const pkv_policy_vtable *vt =
        params->custom_policy ? params->custom_policy : pkv_policy_builtin(params->policy);
    if (pkv_policy_vtable_check(vt, NULL, 0) != PKV_OK) return PKV_ERR_INVALID_ARG;
    if (params->mode == PKV_REPLAY_RUN &&
        (params->chunked_prefill || params->batching != PKV_BATCHING_CONTINUOUS))
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
    e.bpt = pkv_replay_kv_bytes_per_token(&prm);
    if (pkvi_groups_init(&e.groups, &prm, e.bpt) != PKV_OK) return PKV_ERR_INVALID_ARG;
    e.max_len = prm.max_seq_len ? prm.max_seq_len : prm.model.max_seq_len;
    uint32_t *max_seqs = malloc((size_t)e.n * sizeof *max_seqs);
    e.st = calloc(e.n, sizeof *e.st);
    e.running = malloc((size_t)e.n * sizeof *e.running);
    e.wq = malloc(((size_t)e.n + 1) * sizeof *e.wq);
    e.rec = rec;
    e.fixed = prm.schedule;
    e.grow_r = UINT32_MAX;
    if (e.fixed) {
        e.queued = calloc(e.n, 1);
        e.due = malloc(((size_t)e.n + 1) * sizeof *e.due);
    }
    if (!max_seqs || !e.st || !e.running || !e.wq || (e.fixed && (!e.queued || !e.due))) {
        st = PKV_ERR_OUT_OF_MEMORY;
        goto done;
    }
    for (uint32_t i = 0; i < e.n; i++) max_seqs[i] = e.reqs[i].n;
    memset(report, 0, sizeof *report);
    snprintf(report->policy, sizeof report->policy, "%s", vt->name);
    if (e.fixed)
        snprintf(report->schedule, sizeof report->schedule, "fixed-from %s", e.fixed->ref);
    else
        snprintf(report->schedule, sizeof report->schedule, "own");
    snprintf(report->mode, sizeof report->mode, "%s", prm.mode == PKV_REPLAY_SIM ? "sim" : "run");
    report->kv_bytes_per_token = e.bpt;
    snprintf(report->memory.device_mem, sizeof report->memory.device_mem, "%s",
             pkvi_device_mem_label(&prm));
    snprintf(report->alloc.model, sizeof report->alloc.model, "%s",
             prm.mode == PKV_REPLAY_SIM ? prm.alloc_model.name : "measured");
    pkv_policy_config pc = {
        .abi_version = PKV_POLICY_ABI_VERSION,
        .capacity_bytes = budget,
        .bytes_per_token = e.bpt,
        .block_size = prm.block_size,
        .max_seq_len = e.max_len,
        .num_requests = e.n,
        .max_seqs = max_seqs,
        .trace = trace,
        .prefix_sharing = prm.prefix_sharing && prm.mode == PKV_REPLAY_SIM,
        .run_mode = prm.mode == PKV_REPLAY_RUN,
        .params = &prm,
        .num_groups = e.groups.n,
        .elem_bytes = e.groups.elem_bytes,
    };
    memcpy(pc.groups, e.groups.g, sizeof pc.groups);
    memcpy(pc.group_bytes_per_token, e.groups.bpt, sizeof pc.group_bytes_per_token);
    e.pol = &e.polh;
    st = pkvi_policy_open(e.pol, vt, &pc, prm.mode == PKV_REPLAY_SIM ? &prm.alloc_model : NULL);
    if (st == PKV_ERR_OUT_OF_BLOCKS) {
        // A budget below one allocation unit: every request is rejected for memory.
        report->block_size = budget / e.bpt >= 1 ? prm.block_size : 1;
        report_no_capacity(&e, budget, report);
        st = PKV_OK;
        goto done;
    }
    if (st != PKV_OK) goto done;
    report->block_size = e.pol->info.granularity;
    e.wm_slots = (uint64_t)ceil(prm.watermark * (double)e.pol->info.capacity_slots);
    st = prm.mode == PKV_REPLAY_SIM ? pkvi_executor_roofline_create(&prm, &e.ex)
                                    : pkvi_executor_run_create(&prm, e.pol, &e.ex);
    // Run mode counts each step's modelled work too (calibration).
    if (st == PKV_OK && prm.mode == PKV_REPLAY_RUN) st = pkvi_executor_roofline_create(&prm, &e.work);
    if (st != PKV_OK) goto done;
    st = pkvi_engine_run(&e, budget, report);
    if (st != PKV_OK) goto done;
    if (prm.mode == PKV_REPLAY_SIM) {
        double a = e.pol->charges.alloc_total_s, f = e.pol->charges.free_total_s;
        if (e.pol->info.uses_arena) { // the arena, outside every step
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
    // A policy that broke its contract is named with the rule (policy_check.c).
    if (st != PKV_OK && e.pol && e.pol->why[0])
        snprintf(report->failure, sizeof report->failure, "%s", e.pol->why);
    if (e.ex) e.ex->destroy(e.ex);
    if (e.work) e.work->destroy(e.work);
    if (e.pol) pkvi_policy_close(e.pol);
    free(max_seqs);
    free(e.st);
    free(e.running);
    free(e.wq);
    free(e.seqs);
    free(e.queued);
    free(e.due);
    if (st == PKV_OK) report->replay_seconds = pkvi_now_seconds() - wall0;
    return st;
}

pkv_status pkv_replay_run(const pkv_trace *trace, const pkv_replay_params *params,
                          pkv_replay_report *report) {
    return replay(trace, params, report, NULL);
}

pkv_status pkv_replay_schedule_record(const pkv_trace *trace, const pkv_replay_params *params,
                                      pkv_replay_schedule **out, pkv_replay_report *report) {
    if (!out || !params || params->schedule) return PKV_ERR_INVALID_ARG;
    *out = NULL;
    pkv_replay_schedule *s = calloc(1, sizeof *s);
    pkv_replay_report *rep = report ? report : malloc(sizeof *rep);
    if (!s || !rep) {
        free(s);
        if (!report) free(rep);
        return PKV_ERR_OUT_OF_MEMORY;
    }
    pkv_status st = replay(trace, params, rep, s);
    if (st == PKV_OK) snprintf(s->ref, sizeof s->ref, "%s", rep->policy);
    if (!report) free(rep);
    if (st != PKV_OK) {
        pkv_replay_schedule_destroy(s);
        return st;
    }
    *out = s;
    return PKV_OK;
}

void pkv_replay_schedule_destroy(pkv_replay_schedule *s) {
    if (!s) return;
    free(s->ev);
    free(s);
}

uint64_t pkv_replay_schedule_steps(const pkv_replay_schedule *s) { return s ? s->steps : 0; }
uint64_t pkv_replay_schedule_events(const pkv_replay_schedule *s) { return s ? s->n : 0; }

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
    return (unsigned)p->policy < PKV_POLICY_COUNT && p->block_size >= 1 && p->block_size <= 65536 &&
           (p->preempt == PKV_PREEMPT_RECOMPUTE || p->preempt == PKV_PREEMPT_SWAP) &&
           (p->mode == PKV_REPLAY_SIM || p->mode == PKV_REPLAY_RUN) && p->max_batch >= 1 &&
           p->max_tokens_per_step >= 1 && p->watermark >= 0 && p->watermark < 1 &&
           (p->dtype_bytes == 1 || p->dtype_bytes == 2 || p->dtype_bytes == 4) &&
           (p->kv_dtype == PKV_DTYPE_F32 ||
            (pkv_dtype_is_quantized(p->kv_dtype) && p->mode == PKV_REPLAY_SIM)) &&
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
        pkvi_engine_make_admit(e, r, &a);
        const uint64_t need = pkvi_engine_need_slots(e, e->prm->policy, &a);
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

pkv_status pkv_replay_run(const pkv_trace *trace, const pkv_replay_params *params,
                          pkv_replay_report *report) {
    if (!trace || !params || !report || pkv_trace_count(trace) == 0 || !params_ok(params))
        return PKV_ERR_INVALID_ARG;
    if (pkv_trace_count(trace) > UINT32_MAX - 1) return PKV_ERR_INVALID_ARG;
    if (!scaled_arrivals_finite(trace, params->load_scale)) return PKV_ERR_INVALID_ARG;
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
    e.bpt = pkv_replay_kv_bytes_per_token(&prm);
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
    st = pkvi_engine_run(&e, budget, report);
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

// SPDX-License-Identifier: MIT
// Run mode for every policy: the tiny decoder executes each policy's schedule
// on the CPU (and on CUDA in the cuda suite, skipped without a device), with
// --validate. Checked: the greedy tokens are the same whatever the layout (one
// hash over every computed position), run and sim take the same scheduling
// decisions step by step on a trace whose requests all arrive at 0, the memory
// accounting is the same in both modes, and the backend calls a policy stands
// for are made for real, counted and timed.
#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "pkv/backend.h"
#include "pkv/model.h"
#include "pkv/replay.h"
#include "pkv/trace.h"
#include "replay_helpers.h"

// Timing-independent: every request arrives at 0; some fork (n = 2, 3).
static pkv_trace *trace_at_zero(void) {
    enum { N = 14 };
    pkv_trace_request rq[N];
    uint64_t x = 99;
    for (int i = 0; i < N; i++) {
        x = x * 6364136223846793005ull + 1442695040888963407ull;
        const uint32_t n = (i % 5 == 1) ? 2 : (i % 7 == 3) ? 3 : 1;
        rq[i] = (pkv_trace_request){0, 6 + (uint32_t)(x >> 35) % 60, 2 + (uint32_t)(x >> 50) % 14, n, -1, 0,
                                    (uint64_t)i};
    }
    pkv_trace *t = NULL;
    pkv_trace_error err;
    cr_assert_eq(pkv_trace_create(rq, N, &t, &err), PKV_OK, "%s", err.message);
    return t;
}

static pkv_replay_params params(pkv_policy policy, pkv_replay_mode mode, uint64_t kv) {
    pkv_replay_params p = pkv_replay_params_default();
    cr_assert_eq(pkv_model_preset("tiny", &p.model), PKV_OK);
    p.mode = mode;
    p.policy = policy;
    p.dtype_bytes = 4; // the decoder keeps K/V in fp32: the same bytes per token in both modes
    p.kv_mem_bytes = kv;
    p.max_seq_len = 256;
    p.prefix_sharing = 0; // run mode computes every prompt
    p.run_threads = 2;
    p.validate = 1;
    p.device_mem = PKV_DEVICE_MEM_ARENA; // run mode places extents in an arena: sim alike
    return p;
}


static pkv_replay_report replay(const pkv_trace *t, pkv_replay_params p, steps *rec) {
    memset(rec, 0, sizeof *rec);
    p.on_step = record_steps;
    p.user = rec;
    pkv_replay_report rep;
    pkv_status st = pkv_replay_run(t, &p, &rep);
    cr_assert_eq(st, PKV_OK, "%s %s: %s", pkv_policy_name(p.policy), p.mode ? "run" : "sim",
                 pkv_status_str(st));
    return rep;
}

// The same decisions: the same steps, batches, queue and memory at every step.
static void assert_same_schedule(const steps *a, const steps *b, const char *name) {
    cr_assert_eq(a->n, b->n, "%s: %zu sim steps, %zu run steps", name, a->n, b->n);
    for (size_t i = 0; i < a->n; i++) {
        const pkv_replay_step *x = &a->v[i], *y = &b->v[i];
        cr_assert(x->running == y->running && x->waiting == y->waiting && x->used_bytes == y->used_bytes &&
                      x->reserved_bytes == y->reserved_bytes && x->reservation_bytes == y->reservation_bytes &&
                      x->ext_frag_bytes == y->ext_frag_bytes && x->prefill_tokens == y->prefill_tokens,
                  "%s: step %zu differs: running %u/%u waiting %u/%u used %llu/%llu reserved %llu/%llu", name, i,
                  x->running, y->running, x->waiting, y->waiting, (unsigned long long)x->used_bytes,
                  (unsigned long long)y->used_bytes, (unsigned long long)x->reserved_bytes,
                  (unsigned long long)y->reserved_bytes);
    }
}

static int per_call(pkv_policy k) {
    return k == PKV_POLICY_MALLOC_PER_REQUEST || k == PKV_POLICY_MALLOC_PER_TOKEN || k == PKV_POLICY_REALLOC_COPY ||
           k == PKV_POLICY_VMM || k == PKV_POLICY_VMM_SYNC || // vmm: a map call per page and buffer
           k == PKV_POLICY_HYBRID_VMM;
}

static void every_policy(int cuda) {
    pkv_trace *t = trace_at_zero();
    // Ample: every policy holds every request at once (tiny: 8 KiB per token).
    const uint64_t ample = 64ull << 20;
    uint64_t paged_hash = 0, paged_tokens = 0;
    for (int k = 0; k < PKV_POLICY_COUNT; k++) {
        const pkv_policy pol = (pkv_policy)k;
        const char *name = pkv_policy_name(pol);
        steps ss, sr;
        pkv_replay_params ps = params(pol, PKV_REPLAY_SIM, ample);
        ps.alloc_model = pkv_alloc_model_none();
        pkv_replay_report sim = replay(t, ps, &ss);
        pkv_replay_params pr = params(pol, PKV_REPLAY_RUN, ample);
        pr.run_cuda = cuda;
        pkv_replay_report run = replay(t, pr, &sr);
        cr_assert_eq(run.requests.completed, 14, "%s: %u completed (sim %u) %s", name,
                     (unsigned)run.requests.completed, (unsigned)sim.requests.completed, run.failure);
        cr_assert_str_eq(run.mode, "run");
        assert_same_schedule(&ss, &sr, name);
        cr_assert_eq(run.memory.peak_used_bytes, sim.memory.peak_used_bytes, "%s", name);
        cr_assert_eq(run.memory.peak_reserved_bytes, sim.memory.peak_reserved_bytes, "%s", name);
        cr_assert_float_eq(run.memory.breakdown.token_states + run.memory.breakdown.reserved +
                               run.memory.breakdown.internal_frag + run.memory.breakdown.external_frag +
                               run.memory.breakdown.free,
                           1.0, 1e-9, "%s", name);
        // Layout must not change the math.
        cr_assert_gt(run.run.tokens, 0, "%s", name);
        if (pol == PKV_POLICY_PAGED) {
            paged_hash = run.run.token_hash;
            paged_tokens = run.run.tokens;
        } else {
            cr_assert_eq(run.run.tokens, paged_tokens, "%s: %llu positions vs paged's %llu", name,
                         (unsigned long long)run.run.tokens, (unsigned long long)paged_tokens);
            cr_assert_eq(run.run.token_hash, paged_hash, "%s computed other tokens than paged", name);
        }
        // Each policy on the layout it stands for, its copies executed on it.
        // The hybrid policies with a manager run over the model's hybrid store on
        // the CPU, hybrid-vmm over a real pkv_hybrid_vmm (on CUDA, a per-token table).
        const int hybrid = pol == PKV_POLICY_HYBRID_PARTITION || pol == PKV_POLICY_HYBRID_SHARED_PAGE ||
                           pol == PKV_POLICY_HYBRID_LCM || pol == PKV_POLICY_HYBRID_VMM;
        const int hybrid_store = hybrid && pol != PKV_POLICY_HYBRID_VMM && !cuda;
        const char *layout = pol == PKV_POLICY_PAGED              ? "paged"
                             : hybrid_store                        ? "hybrid"
                             : pol == PKV_POLICY_HYBRID_VMM && !cuda ? "hybrid-vmm"
                             : pol == PKV_POLICY_MALLOC_PER_TOKEN || hybrid ? "token-table"
                             : pol == PKV_POLICY_VMM || pol == PKV_POLICY_VMM_SYNC ? "vmm"
                                                                  : "contiguous";
        cr_assert_str_eq(run.run.layout, layout, "%s", name);
        // Paged copy-on-write copies whole blocks; sim counts the filled slots.
        if (strcmp(layout, "paged") == 0)
            cr_assert_geq(run.run.copied_bytes, sim.copy_bytes, "%s", name);
        else if (!hybrid) // (the hybrids' sim counts the manager's block copies in the
                          // trace's dtype, their run the store's fp32 blocks or the
                          // token table's fork copies: not comparable)
            cr_assert_eq(run.run.copied_bytes, sim.copy_bytes, "%s: copied %llu bytes, sim counts %llu", name,
                         (unsigned long long)run.run.copied_bytes, (unsigned long long)sim.copy_bytes);
        if (pol == PKV_POLICY_REALLOC_COPY || pol == PKV_POLICY_CONTIG_MAX)
            cr_assert_gt(run.run.copied_bytes, 0, "%s: the trace forks (and realloc-copy moves)", name);
        // Backend calls: measured, and for the per-call policies made for real,
        // one per call the policy counts in sim (plus the run's table arena).
        cr_assert(run.alloc.seconds_measured);
        if (pol == PKV_POLICY_VMM || pol == PKV_POLICY_VMM_SYNC ||
            (pol == PKV_POLICY_HYBRID_VMM && !cuda)) {
            // Its real calls are the VMM spaces' page maps (sim's count them with
            // its own page accounting): every page mapped is unmapped again.
            cr_assert_gt(run.alloc.backend_alloc_calls, 0, "vmm maps pages");
            cr_assert_eq(run.alloc.backend_free_calls, run.alloc.backend_alloc_calls, "vmm unmaps them all");
            cr_assert_gt(run.alloc.step_seconds, 0, "vmm maps inside steps");
            free(ss.v);
            free(sr.v);
            continue;
        }
        cr_assert_eq(run.alloc.backend_alloc_calls, sim.alloc.backend_alloc_calls + (per_call(pol) ? 1 : 0),
                     "%s: %llu calls in run, %llu in sim", name, (unsigned long long)run.alloc.backend_alloc_calls,
                     (unsigned long long)sim.alloc.backend_alloc_calls);
        cr_assert_eq(run.alloc.backend_free_calls, run.alloc.backend_alloc_calls, "%s", name);
        cr_assert_gt(run.alloc.backend_alloc_seconds, 0, "%s", name);
        if (per_call(pol)) cr_assert_gt(run.alloc.step_seconds, 0, "%s: calls charged to steps", name);
        cr_assert_gt(run.latency.step_p50_ms, 0, "%s", name);
        free(ss.v);
        free(sr.v);
    }
    pkv_trace_destroy(t);
}

Test(replay_run_all, every_policy_on_the_cpu, .timeout = 300) { every_policy(0); }

// A tight budget: the contiguous policies preempt and fragment the same way in
// both modes (the paged policy restores forks differently in run mode, where
// every sample is recomputed alone, so it is compared at ample memory only).
Test(replay_run_all, tight_budget_same_decisions, .timeout = 300) {
    pkv_trace *t = trace_at_zero();
    const pkv_policy pols[] = {PKV_POLICY_CONTIG_ORACLE, PKV_POLICY_MALLOC_PER_REQUEST, PKV_POLICY_CONTIG_POW2};
    uint64_t tight = 0;
    for (size_t i = 0; i < sizeof pols / sizeof pols[0]; i++) {
        steps ss, sr;
        pkv_replay_params ps = params(pols[i], PKV_REPLAY_SIM, 2ull << 20);
        ps.alloc_model = pkv_alloc_model_none();
        pkv_replay_report sim = replay(t, ps, &ss);
        pkv_replay_report run = replay(t, params(pols[i], PKV_REPLAY_RUN, 2ull << 20), &sr);
        tight += sim.preemptions + (uint64_t)(sim.memory.external_frag_frac > 0);
        assert_same_schedule(&ss, &sr, pkv_policy_name(pols[i]));
        cr_assert_eq(run.preemptions, sim.preemptions);
        free(ss.v);
        free(sr.v);
    }
    cr_assert_gt(tight, 0, "the budget is not tight: the test shows nothing");
    pkv_trace_destroy(t);
}

// A borrowed decoder (params.run_model, as a sweep shares one per worker) runs
// the same math as one built for the call; one of another shape is refused.
Test(replay_run_all, borrowed_model_same_tokens_and_checked) {
    pkv_trace *t = trace_at_zero();
    const uint64_t ample = 64ull << 20;
    steps rec;
    pkv_replay_params p = params(PKV_POLICY_CONTIG_POW2_GROW, PKV_REPLAY_RUN, ample);
    pkv_replay_report own = replay(t, p, &rec);
    free(rec.v);
    pkv_model *m = NULL;
    pkv_model_params mp = pkv_model_params_default();
    mp.seed = p.seed;
    cr_assert_eq(pkv_model_create(&p.model, &mp, &m), PKV_OK);
    p.run_model = m;
    for (int i = 0; i < 2; i++) { // reused: nothing of one replay leaks into the next
        pkv_replay_report borrowed = replay(t, p, &rec);
        free(rec.v);
        cr_assert_eq(borrowed.run.token_hash, own.run.token_hash, "replay %d", i);
        cr_assert_eq(borrowed.run.tokens, own.run.tokens);
        cr_assert_eq(borrowed.run.copied_bytes, own.run.copied_bytes);
    }
    pkv_replay_params bad = p;
    bad.model.d_ff += 1; // the model says one shape, the params another
    pkv_replay_report rep;
    cr_assert_eq(pkv_replay_run(t, &bad, &rep), PKV_ERR_INVALID_ARG);
    bad = p;
    bad.run_cuda = 1; // a CPU model for a CUDA run
    pkv_status st = pkv_replay_run(t, &bad, &rep);
    cr_assert(st == PKV_ERR_INVALID_ARG || st == PKV_ERR_NO_DEVICE || st == PKV_ERR_UNSUPPORTED ||
                  st == PKV_ERR_BACKEND,
              "a CPU model in a CUDA run: %s", pkv_status_str(st));
    cr_assert_neq(st, PKV_OK);
    pkv_model_destroy(m);
    pkv_trace_destroy(t);
}

Test(replay_run_cuda, every_policy_on_cuda, .timeout = 300) {
    pkv_backend *b = NULL;
    pkv_status st = pkv_backend_create_cuda(0, &b);
    if (st != PKV_OK) cr_skip_test("no CUDA device (%s): run mode on CUDA skipped", pkv_status_str(st));
    pkv_backend_destroy(b);
    every_policy(1);
}

// The fit recovers a known machine from steps it generated itself.
Test(replay_calibration, fit_recovers_a_known_machine) {
    enum { N = 400 };
    pkv_replay_step s[N];
    memset(s, 0, sizeof s);
    const double B = 12e9, C = 80e9, O = 40e-6;
    uint64_t x = 5;
    for (int i = 0; i < N; i++) {
        x = x * 6364136223846793005ull + 1442695040888963407ull;
        s[i].work_bytes = 1e6 + (double)(x >> 40) * 50;       // 1 .. 50 MB
        // Intensity 0.5 .. 15.5 flop/byte around the ridge (C / B = 6.7): both
        // regimes hold a good share of the time, so both rates are determined.
        s[i].work_flops = s[i].work_bytes * (0.5 + (double)((x >> 20) % 16));
        s[i].alloc_s = (i % 3) * 1e-3;                         // charged calls: not the executor's
        s[i].step_s = (s[i].work_flops / C > s[i].work_bytes / B ? s[i].work_flops / C : s[i].work_bytes / B) +
                      O + s[i].alloc_s;
    }
    pkv_replay_calibration cal;
    cr_assert_eq(pkv_replay_calibrate(s, N, 2e-3, 1000, 1e-3, 1000, &cal), PKV_OK);
    cr_assert_float_eq(cal.achieved_bw / B, 1.0, 0.03, "B %g", cal.achieved_bw);
    cr_assert_float_eq(cal.achieved_flops / C, 1.0, 0.03, "C %g", cal.achieved_flops);
    cr_assert_float_eq(cal.step_overhead_s / O, 1.0, 0.15, "overhead %g", cal.step_overhead_s);
    cr_assert_lt(cal.median_rel_err, 0.02);
    cr_assert_float_eq(cal.alloc.alloc.base_s, 2e-6, 1e-12);
    cr_assert_eq(cal.steps, N);
    cr_assert_eq(pkv_replay_calibrate(s, 4, 0, 0, 0, 0, &cal), PKV_ERR_INVALID_ARG, "too few steps");
}

Test(replay_calibration, file_round_trip_and_clear_errors) {
    pkv_replay_calibration cal, back;
    memset(&cal, 0, sizeof cal);
    snprintf(cal.model, sizeof cal.model, "tiny");
    snprintf(cal.device, sizeof cal.device, "cpu");
    cal.dtype_bytes = 4;
    cal.achieved_bw = 9.5e9;
    cal.achieved_flops = 3.25e10;
    cal.step_overhead_s = 125e-6;
    cal.alloc.alloc.base_s = 1.5e-6;
    cal.alloc.free.base_s = 0.5e-6;
    cal.steps = 77;
    char path[] = "/tmp/pkv_cal_XXXXXX";
    int fd = mkstemp(path);
    cr_assert(fd >= 0);
    FILE *f = fdopen(fd, "w");
    cr_assert_eq(pkv_replay_calibration_write(f, &cal), PKV_OK);
    fclose(f);
    char err[256];
    cr_assert_eq(pkv_replay_calibration_load(path, &back, err, sizeof err), PKV_OK, "%s", err);
    cr_assert_str_eq(back.model, "tiny");
    cr_assert_float_eq(back.achieved_bw, 9.5e9, 1);
    cr_assert_float_eq(back.step_overhead_s, 125e-6, 1e-12);
    cr_assert_float_eq(back.alloc.free.base_s, 0.5e-6, 1e-15);
    // Applied, sim mode models this machine.
    pkv_replay_params p = pkv_replay_params_default();
    cr_assert_eq(pkv_replay_params_apply_calibration(&p, &back, path), PKV_OK);
    cr_assert_eq(p.gpu.mem_bw, 9.5e9);
    cr_assert_eq(p.dtype_bytes, 4);
    cr_assert_str_eq(p.model.name, "tiny");
    p.kv_mem_bytes = 8ull << 20;
    pkv_trace_request one = {0, 10, 5, 1, -1, 0, 0};
    pkv_trace *t = NULL;
    pkv_trace_error terr;
    cr_assert_eq(pkv_trace_create(&one, 1, &t, &terr), PKV_OK);
    pkv_replay_report rep;
    cr_assert_eq(pkv_replay_run(t, &p, &rep), PKV_OK);
    cr_assert_geq(rep.latency.step_p50_ms, 0.125, "every step pays the overhead");
    pkv_trace_destroy(t);
    // A broken file names the file, the line and the field.
    f = fopen(path, "w");
    fputs("{\"model\": \"tiny\",\n \"device\": \"cpu\", \"dtype_bytes\": 4,\n \"achieved_bw_bytes_per_s\": -3}\n", f);
    fclose(f);
    cr_assert_eq(pkv_replay_calibration_load(path, &back, err, sizeof err), PKV_ERR_FORMAT);
    cr_assert(strstr(err, ":3: achieved_bw_bytes_per_s"), "%s", err);
    f = fopen(path, "w");
    fputs("{\"model\": \"tiny\", \"device\": \"cpu\"}", f);
    fclose(f);
    cr_assert_eq(pkv_replay_calibration_load(path, &back, err, sizeof err), PKV_ERR_FORMAT);
    cr_assert(strstr(err, "dtype_bytes: missing"), "%s", err);
    f = fopen(path, "w");
    fputs("{\"modle\": \"tiny\"}", f);
    fclose(f);
    cr_assert_eq(pkv_replay_calibration_load(path, &back, err, sizeof err), PKV_ERR_FORMAT);
    cr_assert(strstr(err, "modle: unknown key"), "%s", err);
    unlink(path);
    cr_assert_eq(pkv_replay_calibration_load("/nonexistent/cal.json", &back, err, sizeof err), PKV_ERR_IO);
}

// SPDX-License-Identifier: MIT
// Tests for the public policy interface (pkv/policy.h) and the fixed schedule:
// the external oracle in examples/policies/ gives exactly the built-in
// contiguous-oracle's figures (every report field and every step), the buddy
// and paged-reserve examples run under --validate, malformed tables are
// refused with a reason, and under a schedule fixed from `paged` every policy
// that deviates nowhere stores the same token states at every step.
// PKV_POLICY_DIR names the folder of the example modules, PKV_SOURCE_ROOT the
// source tree (meson sets both).
#include <criterion/criterion.h>
#include <dlfcn.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "pkv/policy.h"
#include "pkv/replay.h"
#include "pkv/trace.h"
#include "replay_helpers.h"

static const pkv_policy_vtable *load(const char *name) {
    const char *dir = getenv("PKV_POLICY_DIR");
    cr_assert(dir, "PKV_POLICY_DIR is not set");
    char path[1024];
    snprintf(path, sizeof path, "%s/%s.so", dir, name);
    void *h = dlopen(path, RTLD_NOW | RTLD_LOCAL);
    cr_assert(h, "dlopen %s: %s", path, dlerror());
    void *sym = dlsym(h, PKV_POLICY_PLUGIN_ENTRY);
    cr_assert(sym, "%s exports no %s", path, PKV_POLICY_PLUGIN_ENTRY);
    pkv_policy_plugin_entry_fn entry;
    memcpy(&entry, &sym, sizeof entry);
    cr_assert_null(entry(PKV_POLICY_ABI_VERSION + 1), "a plugin must refuse an ABI it does not speak");
    const pkv_policy_vtable *vt = entry(PKV_POLICY_ABI_VERSION);
    char why[160];
    cr_assert_eq(pkv_policy_vtable_check(vt, why, sizeof why), PKV_OK, "%s", why);
    return vt; // the module stays loaded for the test's life
}

static pkv_trace *load_trace(const char *name) {
    const char *root = getenv("PKV_SOURCE_ROOT");
    cr_assert(root, "PKV_SOURCE_ROOT is not set");
    char path[1024];
    snprintf(path, sizeof path, "%s/traces/%s", root, name);
    pkv_trace_load_options lo = pkv_trace_load_options_default();
    pkv_trace *t = NULL;
    pkv_trace_error err;
    cr_assert_eq(pkv_trace_load(path, &lo, &t, &err), PKV_OK, "%s: %s", path, err.message);
    return t;
}


static void run(const pkv_trace *t, pkv_replay_params p, pkv_replay_report *rep, steps *rec) {
    if (rec) {
        memset(rec, 0, sizeof *rec);
        p.on_step = record_steps;
        p.user = rec;
    }
    pkv_status st = pkv_replay_run(t, &p, rep);
    cr_assert_eq(st, PKV_OK, "%s: %s", p.custom_policy ? p.custom_policy->name : pkv_policy_name(p.policy),
                 pkv_status_str(st));
}

// Every field but the name and the host wall time.
static void assert_same_report(pkv_replay_report a, pkv_replay_report b, const char *what) {
    memset(a.policy, 0, sizeof a.policy);
    memset(b.policy, 0, sizeof b.policy);
    memset(a.memory.device_mem, 0, sizeof a.memory.device_mem); // "custom" for a plugin
    memset(b.memory.device_mem, 0, sizeof b.memory.device_mem);
    a.replay_seconds = b.replay_seconds = 0;
    cr_assert_eq(a.steps, b.steps, "%s: steps %llu vs %llu", what, (unsigned long long)a.steps,
                 (unsigned long long)b.steps);
    cr_assert_eq(a.memory.peak_used_bytes, b.memory.peak_used_bytes, "%s: peak_used", what);
    cr_assert_eq(a.memory.peak_reserved_bytes, b.memory.peak_reserved_bytes, "%s: peak_reserved", what);
    cr_assert_eq(a.preemptions, b.preemptions, "%s: preemptions", what);
    cr_assert_eq(a.alloc.backend_alloc_calls, b.alloc.backend_alloc_calls, "%s: alloc calls", what);
    cr_assert_eq(memcmp(&a, &b, sizeof a), 0, "%s: the reports differ", what);
}

static void assert_same_steps(const steps *a, const steps *b, const char *what) {
    cr_assert_eq(a->n, b->n, "%s: %zu vs %zu steps", what, a->n, b->n);
    for (size_t i = 0; i < a->n; i++) {
        const pkv_replay_step *x = &a->v[i], *y = &b->v[i];
        cr_assert_eq(memcmp(x, y, sizeof *x), 0,
                     "%s: step %zu differs: t %.9g/%.9g run %u/%u wait %u/%u used %llu/%llu res %llu/%llu "
                     "ext %llu/%llu alloc %g/%g",
                     what, i, x->time_s, y->time_s, x->running, y->running, x->waiting, y->waiting,
                     (unsigned long long)x->used_bytes, (unsigned long long)y->used_bytes,
                     (unsigned long long)x->reserved_bytes, (unsigned long long)y->reserved_bytes,
                     (unsigned long long)x->ext_frag_bytes, (unsigned long long)y->ext_frag_bytes,
                     x->alloc_s, y->alloc_s);
    }
}

// A tight budget (preemptions, external fragmentation) and an ample one, under
// continuous batching with recompute and swap, and static batching.
Test(policy_plugin, external_oracle_equals_builtin, .timeout = 240) {
    const pkv_policy_vtable *ext = load("oracle");
    pkv_trace *t = load_trace("conv_small.csv");
    const uint64_t budgets[] = {2ull << 30, 3ull << 30, 16ull << 30};
    for (int mode = 0; mode < 3; mode++)
        for (size_t bi = 0; bi < 3; bi++) {
            pkv_replay_params p = pkv_replay_params_default();
            p.kv_mem_bytes = budgets[bi];
            p.validate = 1;
            if (mode == 1) p.preempt = PKV_PREEMPT_SWAP;
            if (mode == 2) p.batching = PKV_BATCHING_STATIC;
            p.policy = PKV_POLICY_CONTIG_ORACLE;
            pkv_replay_report a, b;
            steps sa, sb;
            run(t, p, &a, &sa);
            p.custom_policy = ext;
            run(t, p, &b, &sb);
            cr_assert_str_eq(b.policy, "oracle-plugin");
            char what[64];
            snprintf(what, sizeof what, "mode %d budget %zu", mode, bi);
            assert_same_report(a, b, what);
            assert_same_steps(&sa, &sb, what);
            if (bi == 0 && mode == 0)
                cr_assert_gt(a.preemptions + (uint64_t)(a.memory.external_frag_frac > 0), 0,
                             "the tight budget must exercise preemption or fragmentation");
            free(sa.v);
            free(sb.v);
        }
    pkv_trace_destroy(t);
}

// The breakdown's five parts add up to the capacity at every step.
static void assert_breakdown(const steps *s, const char *what) {
    for (size_t i = 0; i < s->n; i++) {
        const pkv_replay_step *x = &s->v[i];
        cr_assert_eq(x->used_bytes + x->reservation_bytes + x->internal_frag_bytes + x->ext_frag_bytes +
                         x->idle_free_bytes,
                     x->capacity_bytes, "%s: step %zu breakdown", what, i);
    }
}

Test(policy_plugin, buddy_and_paged_reserve_run_validated, .timeout = 240) {
    const pkv_policy_vtable *buddy = load("buddy"), *resv = load("paged_reserve");
    pkv_trace *t = load_trace("parallel_n2to8.csv");
    pkv_replay_params p = pkv_replay_params_default();
    p.kv_mem_bytes = 3ull << 30;
    p.validate = 1;
    pkv_replay_report pow2, bud, paged, rsv;
    steps s;
    p.policy = PKV_POLICY_CONTIG_POW2;
    run(t, p, &pow2, NULL);
    p.policy = PKV_POLICY_PAGED;
    run(t, p, &paged, NULL);
    p.custom_policy = buddy;
    run(t, p, &bud, &s);
    assert_breakdown(&s, "buddy");
    free(s.v);
    p.custom_policy = resv;
    run(t, p, &rsv, &s);
    assert_breakdown(&s, "paged-reserve");
    free(s.v);
    cr_assert_eq(bud.requests.completed + bud.requests.rejected, bud.requests.total);
    cr_assert_eq(rsv.requests.completed + rsv.requests.rejected, rsv.requests.total);
    cr_assert_gt(bud.requests.completed, 0);
    // Buddy blocks are powers of two too, uncapped, and aligned: no less
    // internal fragmentation than Pow2's extents.
    cr_assert_geq(bud.memory.internal_frag_frac + 1e-12, pow2.memory.internal_frag_frac);
    // paged-reserve reserves the final length up front: it never grows, so it
    // never preempts, and it holds reservation that paged does not.
    cr_assert_eq(rsv.preemptions, 0);
    cr_assert_gt(rsv.memory.reservation_frac, paged.memory.reservation_frac);
    cr_assert_eq(rsv.memory.external_frag_frac, 0);
    pkv_trace_destroy(t);
}

static pkv_status fake_create(const pkv_policy_config *c, pkv_policy_info *i, void **s) {
    (void)c;
    (void)i;
    (void)s;
    return PKV_ERR_INVALID_ARG;
}

Test(policy_plugin, malformed_tables_are_refused_with_a_reason) {
    pkv_policy_vtable vt = *pkv_policy_builtin(PKV_POLICY_PAGED);
    char why[160];
    cr_assert_eq(pkv_policy_vtable_check(&vt, why, sizeof why), PKV_OK);
    vt.abi_version = PKV_POLICY_ABI_VERSION + 1;
    cr_assert_eq(pkv_policy_vtable_check(&vt, why, sizeof why), PKV_ERR_INVALID_ARG);
    cr_assert(strstr(why, "ABI"), "%s", why);
    vt.abi_version = PKV_POLICY_ABI_VERSION;
    vt.grow = NULL;
    cr_assert_eq(pkv_policy_vtable_check(&vt, why, sizeof why), PKV_ERR_INVALID_ARG);
    cr_assert(strstr(why, "'grow'"), "%s", why);
    cr_assert_eq(pkv_policy_vtable_check(NULL, why, sizeof why), PKV_ERR_INVALID_ARG);
    cr_assert_null(pkv_policy_builtin(PKV_POLICY_COUNT));
    for (int k = 0; k < PKV_POLICY_COUNT; k++)
        cr_assert_str_eq(pkv_policy_builtin(k)->name, pkv_policy_name((pkv_policy)k));
    // The engine refuses such a table, and a create that fails fails the run.
    pkv_trace_request rq = {0, 4, 4, 1, -1, 0, 0};
    pkv_trace *t = NULL;
    pkv_trace_error err;
    cr_assert_eq(pkv_trace_create(&rq, 1, &t, &err), PKV_OK);
    pkv_replay_params p = pkv_replay_params_default();
    p.kv_mem_bytes = 1ull << 30;
    p.custom_policy = &vt;
    pkv_replay_report rep;
    cr_assert_eq(pkv_replay_run(t, &p, &rep), PKV_ERR_INVALID_ARG);
    vt.grow = pkv_policy_builtin(PKV_POLICY_PAGED)->grow;
    vt.create = fake_create;
    cr_assert_eq(pkv_replay_run(t, &p, &rep), PKV_ERR_INVALID_ARG);
    pkv_trace_destroy(t);
}

// A trace whose timing matters: n = 1 (no sharing), arrivals spread so that
// slower steps see more arrivals per step.
static pkv_trace *spread_trace(void) {
    enum { N = 120 };
    pkv_trace_request rq[N];
    uint64_t x = 12345;
    for (int i = 0; i < N; i++) {
        x = x * 6364136223846793005ull + 1442695040888963407ull;
        rq[i] = (pkv_trace_request){0.004 * i, 64 + (uint32_t)(x >> 33) % 900,
                                    8 + (uint32_t)(x >> 45) % 200, 1, -1, 0, (uint64_t)i};
    }
    pkv_trace *t = NULL;
    pkv_trace_error err;
    cr_assert_eq(pkv_trace_create(rq, N, &t, &err), PKV_OK, "%s", err.message);
    return t;
}

static int same_used(const steps *a, const steps *b) {
    if (a->n != b->n) return 0;
    for (size_t i = 0; i < a->n; i++)
        if (a->v[i].used_bytes != b->v[i].used_bytes) return 0;
    return 1;
}

Test(fixed_schedule, every_policy_stores_the_same_tokens_at_every_step, .timeout = 240) {
    const pkv_policy_vtable *plugins[] = {load("oracle"), load("buddy"), load("paged_reserve")};
    pkv_trace *t = spread_trace();
    pkv_replay_params p = pkv_replay_params_default(); // cuda-boyer: by size, 50 us to 2 MiB
    p.kv_mem_bytes = 96ull << 30; // ample: even contiguous-max holds all 120 at once
    p.max_seq_len = 1200;
    p.validate = 1;
    p.prefix_sharing = 0;
    p.policy = PKV_POLICY_PAGED;
    pkv_replay_report ref, own_paged;
    pkv_replay_schedule *sched = NULL;
    cr_assert_eq(pkv_replay_schedule_record(t, &p, &sched, &ref), PKV_OK);
    cr_assert_eq(pkv_replay_schedule_steps(sched), ref.steps);
    cr_assert_geq(pkv_replay_schedule_events(sched), 120);
    steps own_ref, fixed_ref;
    run(t, p, &own_paged, &own_ref);
    // Replaying paged's own schedule with paged changes nothing.
    pkv_replay_params f = p;
    f.schedule = sched;
    pkv_replay_report fr;
    run(t, f, &fr, &fixed_ref);
    cr_assert_str_eq(fr.schedule, "fixed-from paged");
    cr_assert_eq(fr.schedule_deviations, 0);
    memcpy(fr.schedule, own_paged.schedule, sizeof fr.schedule);
    assert_same_report(own_paged, fr, "paged fixed from itself");
    assert_same_steps(&own_ref, &fixed_ref, "paged fixed from itself");
    int own_differs = 0;
    for (int k = 0; k < PKV_POLICY_COUNT + 3; k++) {
        pkv_replay_params q = p;
        if (k < PKV_POLICY_COUNT) q.policy = (pkv_policy)k;
        else q.custom_policy = plugins[k - PKV_POLICY_COUNT];
        pkv_replay_report own, fixed;
        steps so, sf;
        run(t, q, &own, &so);
        q.schedule = sched;
        run(t, q, &fixed, &sf);
        const char *name = fixed.policy;
        cr_assert_eq(fixed.schedule_deviations, 0, "%s deviated", name);
        cr_assert_eq(fixed.preemptions, 0, "%s", name);
        cr_assert_eq(fixed.requests.completed, 120, "%s", name);
        cr_assert_eq(fixed.steps, ref.steps, "%s: %llu steps", name, (unsigned long long)fixed.steps);
        cr_assert_eq(fixed.memory.peak_used_bytes, ref.memory.peak_used_bytes, "%s: peak_used %llu vs %llu",
                     name, (unsigned long long)fixed.memory.peak_used_bytes,
                     (unsigned long long)ref.memory.peak_used_bytes);
        cr_assert(same_used(&sf, &fixed_ref), "%s: token states differ at some step", name);
        own_differs |= !same_used(&so, &own_ref);
        free(so.v);
        free(sf.v);
    }
    // Without the fixed schedule, step times (50 us per call) change the batches.
    cr_assert(own_differs, "no policy's own schedule differed: the test shows nothing");
    free(own_ref.v);
    free(fixed_ref.v);
    pkv_replay_schedule_destroy(sched);
    pkv_trace_destroy(t);
}

// A policy that cannot hold the schedule delays admissions (deviations) and
// still finishes every request; a schedule from another trace is refused.
Test(fixed_schedule, a_policy_that_cannot_follow_deviates_and_finishes, .timeout = 240) {
    pkv_trace *t = spread_trace();
    pkv_replay_params p = pkv_replay_params_default();
    p.kv_mem_bytes = 2ull << 30; // 4096 slots: contiguous-max holds one request at a time
    p.max_seq_len = 2048;
    p.validate = 1;
    pkv_replay_schedule *sched = NULL;
    cr_assert_eq(pkv_replay_schedule_record(t, &p, &sched, NULL), PKV_OK);
    p.schedule = sched;
    p.policy = PKV_POLICY_CONTIG_MAX;
    pkv_replay_report rep;
    run(t, p, &rep, NULL);
    cr_assert_gt(rep.schedule_deviations, 0);
    cr_assert_eq(rep.requests.completed + rep.requests.rejected, 120);
    cr_assert_gt(rep.requests.completed, 0);
    pkv_trace_request one = {0, 4, 4, 1, -1, 0, 0};
    pkv_trace *small = NULL;
    pkv_trace_error err;
    cr_assert_eq(pkv_trace_create(&one, 1, &small, &err), PKV_OK);
    cr_assert_eq(pkv_replay_run(small, &p, &rep), PKV_ERR_INVALID_ARG);
    pkv_replay_schedule *again = NULL;
    cr_assert_eq(pkv_replay_schedule_record(t, &p, &again, NULL), PKV_ERR_INVALID_ARG,
                 "recording while replaying a schedule must be refused");
    pkv_trace_destroy(small);
    pkv_replay_schedule_destroy(sched);
    pkv_trace_destroy(t);
}

// Every policy replaying its own schedule follows it exactly, under memory
// pressure (preemptions) and with first-fit placement: realloc-copy's
// preemptions happen between its moves within a decode, so the replay must
// preempt at that point (not at the step's start), else the extents land
// elsewhere and the schedule drifts. Recompute and swap.
Test(fixed_schedule, every_policy_replays_its_own_schedule_exactly, .timeout = 240) {
    pkv_trace *t = load_trace("conv_small.csv");
    for (int mode = 0; mode < 2; mode++)
        for (int k = 0; k < PKV_POLICY_COUNT; k++) {
            pkv_replay_params p = pkv_replay_params_default();
            p.kv_mem_bytes = 2ull << 30;
            p.policy = (pkv_policy)k;
            p.device_mem = PKV_DEVICE_MEM_ARENA; // placement order matters most here
            if (mode == 1) p.preempt = PKV_PREEMPT_SWAP;
            pkv_replay_report own, fixed;
            pkv_replay_schedule *sched = NULL;
            cr_assert_eq(pkv_replay_schedule_record(t, &p, &sched, &own), PKV_OK);
            p.schedule = sched;
            run(t, p, &fixed, NULL);
            const char *name = fixed.policy;
            cr_expect_eq(fixed.schedule_deviations, 0, "%s (mode %d): %llu deviations", name, mode,
                         (unsigned long long)fixed.schedule_deviations);
            cr_expect_eq(fixed.preemptions, own.preemptions, "%s (mode %d): %llu vs %llu preemptions",
                         name, mode, (unsigned long long)fixed.preemptions,
                         (unsigned long long)own.preemptions);
            cr_expect_eq(fixed.steps, own.steps, "%s (mode %d)", name, mode);
            if (k == PKV_POLICY_REALLOC_COPY) cr_expect_gt(own.preemptions, 0, "no pressure: shows nothing");
            pkv_replay_schedule_destroy(sched);
        }
    pkv_trace_destroy(t);
}

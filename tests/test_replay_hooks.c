// SPDX-License-Identifier: MIT
// Tests for the replay hooks the research driver builds on: on_progress after
// every step (monotone counters; a nonzero return stops the replay and the
// report says partial), on_request once per completed request, and the
// normalized latency that must equal the mean over those requests.
#include <criterion/criterion.h>
#include <math.h>
#include <stdlib.h>

#include "pkv/replay.h"
#include "pkv/trace.h"

static pkv_trace *generated(uint64_t seed, uint32_t n) {
    pkv_tracegen_params g = pkv_tracegen_params_default();
    g.num_requests = n;
    g.seed = seed;
    pkv_trace *t = NULL;
    cr_assert_eq(pkv_trace_generate(&g, &t), PKV_OK);
    return t;
}

typedef struct watch {
    uint64_t calls, stop_at, last_steps, last_done;
    double last_t;
    int monotone;
    // on_request
    uint64_t requests;
    double norm_sum;
    int ordered;
} watch;

static int on_progress(void *user, const pkv_replay_progress *p) {
    watch *w = user;
    w->calls++;
    if (p->steps != w->last_steps + 1 || p->requests_done < w->last_done || p->time_s < w->last_t)
        w->monotone = 0;
    w->last_steps = p->steps;
    w->last_done = p->requests_done;
    w->last_t = p->time_s;
    return w->stop_at && p->steps >= w->stop_at;
}

static void on_request(void *user, const pkv_replay_request_done *r) {
    watch *w = user;
    w->requests++;
    if (!(r->arrival_s <= r->first_token_s && r->first_token_s <= r->finish_s)) w->ordered = 0;
    w->norm_sum += (r->finish_s - r->arrival_s) * 1e3 / r->output_tokens;
}

static void replay(const pkv_trace *t, pkv_policy policy, uint64_t stop_at, watch *w,
                   pkv_replay_report *rep) {
    pkv_replay_params p = pkv_replay_params_default();
    p.policy = policy;
    p.kv_mem_bytes = 4ull << 30;
    p.on_progress = on_progress;
    p.on_request = on_request;
    p.user = w;
    *w = (watch){.stop_at = stop_at, .monotone = 1, .ordered = 1};
    cr_assert_eq(pkv_replay_run(t, &p, rep), PKV_OK);
}

Test(replay_hooks, progress_after_every_step_and_requests_match_the_report) {
    pkv_trace *t = generated(3, 300);
    for (int pol = 0; pol < PKV_POLICY_COUNT; pol++) {
        watch w;
        pkv_replay_report rep;
        replay(t, (pkv_policy)pol, 0, &w, &rep);
        cr_expect_eq(rep.partial, 0, "%s", rep.policy);
        cr_expect_eq(w.calls, rep.steps, "%s: one progress call per step", rep.policy);
        cr_expect(w.monotone, "%s: steps, requests done and clock never go back", rep.policy);
        cr_expect_eq(w.last_done, rep.requests.total, "%s: all requests done at the end",
                     rep.policy);
        cr_expect_eq(w.requests, rep.requests.completed, "%s: on_request per completion",
                     rep.policy);
        cr_expect(w.ordered, "%s: arrival <= first token <= finish", rep.policy);
        const double mean = w.norm_sum / (double)w.requests;
        cr_expect(rep.latency.norm_ms_per_token > 0 &&
                      fabs(rep.latency.norm_ms_per_token - mean) <= 1e-9 * mean,
                  "%s: normalized latency %.9g == mean over requests %.9g", rep.policy,
                  rep.latency.norm_ms_per_token, mean);
    }
    pkv_trace_destroy(t);
}

Test(replay_hooks, nonzero_progress_stops_with_a_partial_report) {
    pkv_trace *t = generated(5, 400);
    watch full, cut;
    pkv_replay_report a, b;
    replay(t, PKV_POLICY_PAGED, 0, &full, &a);
    cr_assert_gt(a.steps, 100);
    replay(t, PKV_POLICY_PAGED, 50, &cut, &b);
    cr_expect_eq(b.partial, 1);
    cr_expect_eq(b.steps, 50, "stopped right after step 50, got %llu",
                 (unsigned long long)b.steps);
    cr_expect_eq(cut.calls, 50);
    cr_expect_lt(b.requests.completed, a.requests.completed);
    cr_expect_eq(cut.requests, b.requests.completed, "the partial report counts what finished");
    cr_expect_eq(b.requests.total, a.requests.total);
    cr_expect(b.memory.peak_reserved_bytes <= a.memory.peak_reserved_bytes);
    // Stopping is deterministic.
    replay(t, PKV_POLICY_PAGED, 50, &cut, &b);
    cr_expect_eq(b.steps, 50, "deterministic stop");
    pkv_trace_destroy(t);
}

Test(replay_hooks, callbacks_are_optional) {
    pkv_trace *t = generated(7, 50);
    pkv_replay_params p = pkv_replay_params_default();
    pkv_replay_report rep;
    cr_assert_eq(pkv_replay_run(t, &p, &rep), PKV_OK);
    cr_expect_eq(rep.partial, 0);
    cr_expect_eq(rep.requests.completed + rep.requests.rejected, rep.requests.total);
    pkv_trace_destroy(t);
}

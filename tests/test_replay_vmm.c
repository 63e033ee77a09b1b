// SPDX-License-Identifier: MIT
// The replay's `vmm` policy (vAttention-style virtual-contiguous KV): memory and
// map/unmap calls on a hand-computed trace, with and without map-ahead, the cost
// model charging those calls, exhaustion, and invariants on generated traces.
#include <criterion/criterion.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "pkv/replay.h"
#include "pkv/trace.h"
#include "replay_helpers.h"

// One layer, one kv head, head_dim 1024, fp16: 2 buffers (K, V) of 2048 bytes per
// token, 4096 bytes per token in all. With 8 KiB pages a page holds 4 tokens of
// one buffer and a page group (K page + V page) 4 tokens: like paged block 4.
#define TB 2048u
#define BPT 4096u
static pkv_replay_params vmm_params(uint64_t kv_bytes, uint64_t page, int ahead) {
    pkv_replay_params p = pkv_replay_params_default();
    cr_assert_eq(pkv_model_preset("tiny", &p.model), PKV_OK);
    p.model.num_layers = 1;
    p.model.num_heads = 1;
    p.model.num_kv_heads = 1;
    p.model.head_dim = 1024;
    p.model.d_model = 1024;
    p.policy = PKV_POLICY_VMM;
    p.kv_mem_bytes = kv_bytes;
    p.watermark = 0;
    p.max_seq_len = 16;
    p.vmm_page_bytes = page;
    p.vmm_map_ahead = ahead;
    p.vmm_defer_reclaim = 0; // the tests of deferred reclamation turn it on
    p.validate = 1;
    p.alloc_model = pkv_alloc_model_constant(10e-6);
    return p;
}

#define MAX_STEPS 16
typedef struct recorder {
    uint64_t n;
    pkv_replay_step s[MAX_STEPS];
} recorder;

static void record(void *user, const pkv_replay_step *s) {
    recorder *r = user;
    if (r->n < MAX_STEPS) r->s[r->n] = *s;
    r->n++;
}

// R0: prompt 5, output 5 (ends at 9 tokens); R1: prompt 3, output 2, n = 2 (each
// sample ends at 4). Steps: 1 prefill both (R1 forks after it); 2: R0 6, R1 4+4,
// R1 ends; 3: R0 7; 4: R0 8; 5: R0 9, ends.
static const pkv_trace_request hand[2] = {
    {0.0, 5, 5, 1, -1, 0, 0},
    {0.0, 3, 2, 2, -1, 0, 1},
};

// Without map-ahead, groups of 4 tokens (slots):
//   step 1: R0 maps 2 groups (8 slots: 5 used, 3 to fill); R1 maps one group for
//           each of its 2 rows (the sample's row is empty until the fork copies
//           the 3 prompt tokens): reserved 16, used 8, reservation 3 + 1 + 4 = 8.
//   step 2: R0 6, R1 4 + 4: 16 / 14 / 2.  step 3: R1's rows unmapped: 8 / 7 / 1.
//   step 4: 8 / 8 / 0.  step 5: R0 maps a 3rd group: 12 / 9 / 0.
//   Map calls: (2 + 2 + 1) groups x 2 buffers = 10; unmaps the same.
Test(replay_vmm, hand_computed_trace) {
    pkv_trace *t = make_trace(hand, 2);
    pkv_replay_params p = vmm_params(1u << 20, 8192, 0);
    recorder rec = {0};
    p.on_step = record;
    p.user = &rec;
    pkv_replay_report rep;
    cr_assert_eq(pkv_replay_run(t, &p, &rep), PKV_OK);
    cr_assert_str_eq(rep.policy, "vmm");
    cr_assert_eq(rep.requests.completed, 2);
    cr_assert_eq(rep.block_size, 4, "tokens per page of one buffer: %u", rep.block_size);
    cr_assert_eq(rec.n, 5);
    const uint64_t want[5][3] = {{16, 8, 8}, {16, 14, 2}, {8, 7, 1}, {8, 8, 0}, {12, 9, 0}};
    for (int i = 0; i < 5; i++) {
        cr_assert_eq(rec.s[i].reserved_bytes, want[i][0] * BPT, "step %d reserved %llu", i + 1,
                     (unsigned long long)(rec.s[i].reserved_bytes / BPT));
        cr_assert_eq(rec.s[i].used_bytes, want[i][1] * BPT, "step %d used", i + 1);
        cr_assert_eq(rec.s[i].reservation_bytes, want[i][2] * BPT, "step %d reservation", i + 1);
        cr_assert_eq(rec.s[i].ext_frag_bytes, 0);
    }
    cr_assert_eq(rep.alloc.backend_alloc_calls, 10);
    cr_assert_eq(rep.alloc.backend_free_calls, 10);
    cr_assert_eq(rep.copy_bytes, 3 * BPT, "the fork copies the 3 prompt tokens");
    cr_assert_eq(rep.memory.peak_reserved_bytes, 16 * BPT);
    cr_assert_eq(rep.memory.peak_used_bytes, 14 * BPT);
    cr_assert_eq(rep.memory.capacity_bytes, 1u << 20, "1 MiB is 64 whole groups of 16 KiB");
    // Cost model: 10 us per call; the 8 admission maps stall step 1, the 2 of
    // step 5 stall it; R1's 4 unmaps delay step 3 (frees go to the next step).
    cr_assert_float_eq(rec.s[0].alloc_s, 80e-6, 1e-12, "%g", rec.s[0].alloc_s);
    cr_assert_float_eq(rec.s[1].alloc_s, 0, 1e-12);
    cr_assert_float_eq(rec.s[2].alloc_s, 40e-6, 1e-12, "%g", rec.s[2].alloc_s);
    cr_assert_float_eq(rec.s[4].alloc_s, 20e-6, 1e-12, "%g", rec.s[4].alloc_s);
    // Totals: the 10 map calls, likewise frees. (Before the policy interface the
    // seconds also held an arena call that the call count did not: the policy
    // says now that it has none, info.uses_arena = 0, so both agree.)
    cr_assert_float_eq(rep.alloc.backend_alloc_seconds, 100e-6, 1e-12);
    cr_assert_float_eq(rep.alloc.backend_free_seconds, 100e-6, 1e-12);
    pkv_trace_destroy(t);
}

// With map-ahead a decode that fills its row's last group maps the next one in
// the same step, overlapping it:
//   step 2: R1's rows reach 4 = full: one group ahead each: reserved 24, used 14,
//           reservation 2 (R0's) + 0 (R1's groups ahead will never be filled).
//   step 3: 8 / 7 / 1.  step 4: R0 reaches 8: a 3rd group ahead: 12 / 8 / 1.
//   step 5: R0 9 uses it without a call: 12 / 9 / 0.
//   Maps: 8 + 4 + 2 = 14; unmaps 14. The ahead maps overlap their steps.
Test(replay_vmm, map_ahead_maps_one_group_early_and_overlaps) {
    pkv_trace *t = make_trace(hand, 2);
    pkv_replay_params p = vmm_params(1u << 20, 8192, 1);
    recorder rec = {0};
    p.on_step = record;
    p.user = &rec;
    pkv_replay_report rep;
    cr_assert_eq(pkv_replay_run(t, &p, &rep), PKV_OK);
    cr_assert_eq(rec.n, 5);
    const uint64_t want[5][3] = {{16, 8, 8}, {24, 14, 2}, {8, 7, 1}, {12, 8, 1}, {12, 9, 0}};
    for (int i = 0; i < 5; i++) {
        cr_assert_eq(rec.s[i].reserved_bytes, want[i][0] * BPT, "step %d reserved %llu", i + 1,
                     (unsigned long long)(rec.s[i].reserved_bytes / BPT));
        cr_assert_eq(rec.s[i].used_bytes, want[i][1] * BPT, "step %d used", i + 1);
        cr_assert_eq(rec.s[i].reservation_bytes, want[i][2] * BPT, "step %d reservation", i + 1);
    }
    cr_assert_eq(rep.alloc.backend_alloc_calls, 14);
    cr_assert_eq(rep.alloc.backend_free_calls, 14);
    // Eager allocation: the 8 admission maps (80 us) are made by the background
    // thread too, so step 1 shows only what exceeds its own work.
    cr_assert_lt(rec.s[0].alloc_s, 80e-6 - 1e-9, "admission maps overlap: %g", rec.s[0].alloc_s);
    cr_assert_eq(rec.s[4].alloc_s, 0, "step 5 found its group mapped: %g", rec.s[4].alloc_s);
    // Overlapping calls only show where longer than the step's own work (which is
    // > 0), so the 4 (step 2) and 2 (step 4) ahead maps show less than in line.
    cr_assert_lt(rec.s[1].alloc_s, 40e-6 - 1e-9, "step 2: %g", rec.s[1].alloc_s);
    cr_assert_lt(rec.s[3].alloc_s, 20e-6 - 1e-9, "step 4: %g", rec.s[3].alloc_s);
    cr_assert_eq(rep.memory.peak_reserved_bytes, 24 * BPT);
    pkv_trace_destroy(t);
}

// A budget of 2 groups (32 KiB): R0 needs 3 groups alone and is rejected for
// memory, R1 (2 rows of 1 group) completes. Below one group nothing runs.
Test(replay_vmm, exhaustion_rejects_what_cannot_fit) {
    pkv_trace *t = make_trace(hand, 2);
    pkv_replay_params p = vmm_params(2 * 2 * 8192, 8192, 0);
    pkv_replay_report rep;
    cr_assert_eq(pkv_replay_run(t, &p, &rep), PKV_OK);
    cr_assert_eq(rep.requests.completed, 1);
    cr_assert_eq(rep.requests.rejected_no_memory, 1);
    p.kv_mem_bytes = 8192; // one page: not a whole group of 2 buffers
    cr_assert_eq(pkv_replay_run(t, &p, &rep), PKV_OK);
    cr_assert_eq(rep.requests.completed, 0);
    cr_assert_eq(rep.requests.rejected_no_memory, 2);
    cr_assert_neq(rep.failure[0], '\0', "a run that completes nothing says why");
    p.vmm_page_bytes = 5000; // not a multiple of 4 KiB
    cr_assert_eq(pkv_replay_run(t, &p, &rep), PKV_ERR_INVALID_ARG);
    pkv_trace_destroy(t);
}

Test(replay_vmm, policy_name_round_trips) {
    pkv_policy pol;
    cr_assert_eq(pkv_policy_from_name("vmm", &pol), PKV_OK);
    cr_assert_eq(pol, PKV_POLICY_VMM);
    cr_assert_str_eq(pkv_policy_name(PKV_POLICY_VMM), "vmm");
    pkv_replay_params d = pkv_replay_params_default();
    cr_assert_eq(d.vmm_page_bytes, 2u << 20, "vAttention's 2 MiB by default");
    cr_assert_eq(d.vmm_map_ahead, 1, "vAttention's overlap by default");
    cr_assert_eq(d.vmm_defer_reclaim, 1);
    cr_assert_eq(pkv_policy_from_name("vmm-sync", &pol), PKV_OK);
    cr_assert_eq(pol, PKV_POLICY_VMM_SYNC);
    cr_assert_str_eq(pkv_policy_name(PKV_POLICY_VMM_SYNC), "vmm-sync");
}

// vAttention as published (the default vmm) against its synchronous ablation,
// on one request P3 O3 (5 tokens: 2 page groups of 4 tokens, 2 calls each at
// 10 us). vmm-sync: step 1 maps group 1 (20 us) in line, step 3 maps group 2
// (20 us): 40 us charged, the 4 unmaps after the last step. vmm: the prompt's
// group is mapped by the background thread while the request waits (eager
// allocation) and group 2 one step ahead (map-ahead, in step 2), both behind
// steps longer than 20 us: nothing charged, 40 us overlapped; the pages stay
// mapped for a next request (deferred reclamation): no unmap.
Test(replay_vmm, default_vmm_hides_mapping_behind_compute) {
    const pkv_trace_request one[1] = {{0.0, 3, 3, 1, -1, 0, 0}};
    pkv_trace *t = make_trace(one, 1);
    pkv_replay_params p = vmm_params(1u << 20, 8192, 1);
    p.vmm_defer_reclaim = 1;
    p.gpu.mem_bw = 1e9; // steps of milliseconds: longer than any map here
    recorder base = {0}, sync = {0}, async = {0};
    pkv_replay_report rb, rs, ra;
    p.alloc_model = pkv_alloc_model_none();
    p.on_step = record;
    p.user = &base;
    cr_assert_eq(pkv_replay_run(t, &p, &rb), PKV_OK);
    p.alloc_model = pkv_alloc_model_constant(10e-6);
    p.user = &async;
    cr_assert_eq(pkv_replay_run(t, &p, &ra), PKV_OK);
    p.policy = PKV_POLICY_VMM_SYNC;
    p.user = &sync;
    cr_assert_eq(pkv_replay_run(t, &p, &rs), PKV_OK);
    cr_assert_eq(base.n, 3);
    for (int s = 0; s < 3; s++) cr_assert_gt(base.s[s].step_s, 20e-6, "step %d too short to hide a map", s);
    const double extra[3] = {20e-6, 0, 20e-6};
    for (int s = 0; s < 3; s++) {
        cr_expect_float_eq(sync.s[s].step_s - base.s[s].step_s, extra[s], 1e-12, "vmm-sync step %d", s + 1);
        cr_expect_float_eq(async.s[s].step_s, base.s[s].step_s, 1e-12, "vmm step %d", s + 1);
    }
    cr_expect_float_eq(rs.alloc.step_seconds, 40e-6, 1e-12);
    cr_expect_float_eq(rs.alloc.overlapped_seconds, 0, 1e-12);
    cr_expect_eq(rs.alloc.backend_alloc_calls, 4);
    cr_expect_eq(rs.alloc.backend_free_calls, 4);
    cr_expect_float_eq(ra.alloc.step_seconds, 0, 1e-12);
    cr_expect_float_eq(ra.alloc.overlapped_seconds, 40e-6, 1e-12);
    cr_expect_eq(ra.alloc.backend_alloc_calls, 4);
    cr_expect_eq(ra.alloc.backend_free_calls, 0);
    cr_expect_str_eq(rs.policy, "vmm-sync");
    pkv_trace_destroy(t);
}

// Generated traces under memory pressure (preemption, forks, prefix groups):
// every invariant after every step (validate), the capacity breakdown adds up,
// and a bigger page never wastes less than a smaller one.
Test(replay_vmm, generated_traces_keep_invariants) {
    pkv_tracegen_params g = pkv_tracegen_params_default();
    g.num_requests = 300;
    g.seed = 11;
    pkv_trace *t = NULL;
    cr_assert_eq(pkv_trace_generate(&g, &t), PKV_OK);
    double waste[2];
    const uint64_t pages[2] = {64 << 10, 2 << 20};
    for (int mode = 0; mode < 3; mode++) { // plain, map-ahead, map-ahead + deferred
        const int ahead = mode >= 1, defer = mode == 2;
        for (int i = 0; i < 2; i++) {
            pkv_replay_params p = pkv_replay_params_default();
            p.policy = PKV_POLICY_VMM;
            p.kv_mem_bytes = (uint64_t)3 << 30; // tight for llama2-7b: preemptions
            p.vmm_page_bytes = pages[i];
            p.vmm_map_ahead = ahead;
            p.vmm_defer_reclaim = defer;
            p.validate = 1;
            pkv_replay_report rep;
            cr_assert_eq(pkv_replay_run(t, &p, &rep), PKV_OK);
            cr_assert_eq(rep.requests.completed + rep.requests.rejected, 300);
            cr_assert_gt(rep.requests.completed, 200);
            const double sum = rep.memory.breakdown.token_states + rep.memory.breakdown.reserved +
                               rep.memory.breakdown.internal_frag +
                               rep.memory.breakdown.external_frag + rep.memory.breakdown.free;
            cr_assert_float_eq(sum, 1.0, 1e-9, "breakdown sums to %g", sum);
            cr_assert_eq(rep.memory.breakdown.external_frag, 0);
            if (defer)
                cr_assert_geq(rep.alloc.backend_alloc_calls, rep.alloc.backend_free_calls);
            else
                cr_assert_eq(rep.alloc.backend_alloc_calls, rep.alloc.backend_free_calls,
                             "every mapped page is unmapped");
            cr_assert_eq(rep.alloc.backend_alloc_calls % 64, 0, "whole groups of 64 buffers");
            cr_assert_eq(rep.alloc.backend_free_calls % 64, 0);
            waste[i] = rep.memory.waste_frac;
        }
        cr_assert_lt(waste[0], waste[1], "mode %d: 64 KiB pages waste less than 2 MiB (%g vs %g)",
                     mode, waste[0], waste[1]);
    }
    pkv_trace_destroy(t);
}

// Deferred reclamation. The hand trace plus R2 (prompt 4, output 2: ends at 5
// tokens, 2 groups) arriving at 1 s, after the others finished.
//   Ample memory: nothing is ever unmapped; R2 takes one of R1's idle rows (1
//   group, the best fit for its 4-token prompt: no map) and maps a 2nd group
//   when it reaches 5 tokens. Maps 10 + 2 = 12, unmaps 0.
//   A budget of 4 groups: step 5's 3rd group for R0 finds none unmapped (2 used,
//   2 idle): R1's last idle row gives one up (2 unmaps, then 2 maps). R2 reuses
//   R1's other idle row, and its 2nd group comes from R0's idle row (2 unmaps,
//   2 maps). Maps 8 + 2 + 2 = 12, unmaps 4.
Test(replay_vmm, deferred_reclamation_reuses_idle_rows) {
    const pkv_trace_request reqs[3] = {hand[0], hand[1], {1.0, 4, 2, 1, -1, 0, 2}};
    pkv_trace *t = make_trace(reqs, 3);
    const uint64_t budgets[2] = {1u << 20, 4 * 2 * 8192};
    const uint64_t maps[2] = {12, 12}, unmaps[2] = {0, 4};
    for (int i = 0; i < 2; i++) {
        pkv_replay_params p = vmm_params(budgets[i], 8192, 0);
        p.vmm_defer_reclaim = 1;
        recorder rec = {0};
        p.on_step = record;
        p.user = &rec;
        pkv_replay_report rep;
        cr_assert_eq(pkv_replay_run(t, &p, &rep), PKV_OK);
        cr_assert_eq(rep.requests.completed, 3, "budget %d", i);
        cr_assert_eq(rep.alloc.backend_alloc_calls, maps[i], "budget %d: %llu maps", i,
                     (unsigned long long)rep.alloc.backend_alloc_calls);
        cr_assert_eq(rep.alloc.backend_free_calls, unmaps[i], "budget %d: %llu unmaps", i,
                     (unsigned long long)rep.alloc.backend_free_calls);
        // R2's admission step (the 6th) reused a mapped row: no call in it.
        cr_assert_eq(rec.n, 7);
        cr_assert_eq(rec.s[5].alloc_s, 0, "budget %d: %g", i, rec.s[5].alloc_s);
        // Idle rows are free memory, not reserved: R2's step holds 1 group.
        cr_assert_eq(rec.s[5].reserved_bytes, 4 * BPT);
        cr_assert_eq(rec.s[5].used_bytes, 4 * BPT);
    }
    // Without it: R2 maps its row, every release unmaps: 14 and 14.
    pkv_replay_params p = vmm_params(1u << 20, 8192, 0);
    pkv_replay_report rep;
    cr_assert_eq(pkv_replay_run(t, &p, &rep), PKV_OK);
    cr_assert_eq(rep.alloc.backend_alloc_calls, 14);
    cr_assert_eq(rep.alloc.backend_free_calls, 14);
    pkv_trace_destroy(t);
}

// SPDX-License-Identifier: MIT
// Tests for the replay engine: hand-computed memory and backend-call figures
// for each policy on a tiny trace, metric identities checked at every step of
// generated traces, external fragmentation, preemption (recompute and swap),
// prefix sharing, determinism, the JSON keys, sizes, run mode on the tiny
// model, and sim mode's default efficiency per GPU (the published figures).
#include <criterion/criterion.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "pkv/replay.h"
#include "pkv/trace.h"
#include "replay_helpers.h"

// tiny_replay_params (replay_helpers.h): KV of 4 bytes per token, 2 (K, V) x 1 layer
// x 1 kv head x head_dim 1 x 2 bytes (fp16), so slots and bytes are easy to relate.

#define MAX_STEPS 64
typedef struct recorder {
    uint64_t n;
    pkv_replay_step s[MAX_STEPS];
} recorder;

static void record(void *user, const pkv_replay_step *s) {
    recorder *r = user;
    if (r->n < MAX_STEPS) r->s[r->n] = *s;
    r->n++;
}

// Expected per-step (reserved, used, reservation) in slots.
typedef struct expect_step {
    uint64_t reserved, used, reservation;
} expect_step;

typedef struct expect_run {
    pkv_policy policy;
    expect_step steps[5];
    uint64_t peak_reserved, peak_used; // slots
    uint64_t allocs, frees, cow, copy_slots;
} expect_run;

// The hand-computed trace. Two requests arrive at 0 with ample memory:
//   R0: prompt 5, output 5 -> its sequence ends at 5 + 5 - 1 = 9 tokens;
//   R1: prompt 3, output 2, n = 2 -> forks after prefill, each ends at 4 tokens.
// Steps (a sequence holds P + e - 1 tokens after emitting e; every step first
// appends the slot of the last emitted token):
//   1: prefill R0 (5) and R1 (3); both emit token 1; R1 forks (1 fork).
//   2: R0 -> 6; R1's two sequences -> 4 each; R1 emits its 2nd token, finishes.
//   3: R0 -> 7.  4: R0 -> 8.  5: R0 -> 9, emits its 5th token, finishes.
// paged, block 4: step 1 R0 holds 2 blocks (8 slots, 5 used; 3 to be filled),
//   R1 1 block (3 used, 1 to fill): reserved 12, used 8, reservation 4.
//   Step 2: R1's first child writes into the shared partial block: copy-on-write
//   copies its 3 tokens to a new block (1 CoW, 3 slots copied); the second child
//   then owns the old block. R0 2 blocks (6 used), R1 2 blocks (4 + 4 used):
//   reserved 16, used 14, reservation 2 (R0's 7th, 8th slot).
//   Step 3: 8 / 7 / 1; step 4: 8 / 8 / 0; step 5: a 3rd block, 12 / 9 / 0, so 3
//   slots are internal fragmentation (below one block). Backend: one arena.
// contiguous-oracle: extents of the final length: R0 9, R1 4 + 4 (both samples
//   reserved at admission; the fork copies R1's 3 prompt tokens: 3 slots).
//   1: 17 / 8 / (9-5) + (4-3) + (4-0) = 9;  2: 17 / 14 / 3;  3: 9 / 7 / 2;
//   4: 9 / 8 / 1;  5: 9 / 9 / 0.
// contiguous-pow2 (Orca): next power of two of prompt + output, capped at
//   max_seq_len 16: R0 pow2(10) = 16, R1 pow2(5) = 8 per sample.
//   1: 32 / 8 / (9-5) + (4-3) + 4 = 9;  2: 32 / 14 / 3;  3: 16 / 7 / 2;
//   4: 16 / 8 / 1;  5: 16 / 9 / 0. Copies: the fork's 3.
// contiguous-pow2-grow: next power of two of the current length: R0 8, R1 4 + 4.
//   1: 16 / 8 / (8-5) + 1 + 4 = 8;  2: 16 / 14 / 2;  3: 8 / 7 / 1;  4: 8 / 8 / 0;
//   5: R0 needs 9 > 8 -> 16 slots, grown in place (R1's extents right after it
//   are free by then): 16 / 9 / 0 (7 slots never filled). Copies: the fork's 3.
// contiguous-max (16 per sequence): 1: 48 / 8 / (9-5) + 1 + 4 = 9;
//   2: 48 / 14 / 3;  3: 16 / 7 / 2;  4: 16 / 8 / 1;  5: 16 / 9 / 0.
// malloc-per-request: the oracle's memory, one backend call per sequence:
//   3 allocations (R0, R1 x 2), 3 frees.
// malloc-per-token: one call per token, never a copy; the fork's samples point
//   at R1's prompt. Admission: 5 + 3 calls. 1: 8 / 8 / 0. 2: R0 6, R1 3 + 1 + 1:
//   11 / 11 / 0 (3 calls); R1 ends, 5 frees. 3, 4, 5: 7, 8, 9 (1 call each);
//   R0 frees 9 at the end. Allocs 8 + 3 + 3 = 14, frees 5 + 9 = 14.
// realloc-copy: extents of the current length. Admission allocates R0 5,
//   R1 3 + 3 (3 calls). 1: 11 / 8 / (3-0) = 3 (the 2nd sample is empty until the
//   fork). 2: every sequence grows by reallocation (3 allocs, 3 frees, copies of
//   5 + 3 + 3 slots): 6 + 4 + 4 = 14 / 14 / 0. R1 frees 2. 3, 4, 5: R0 grows to
//   7, 8, 9 (copies of 6, 7, 8; 1 alloc + 1 free each): 7/7/0, 8/8/0, 9/9/0.
//   R0 frees 1 at the end. Allocs 3 + 3 + 3 = 9, frees 3 + 2 + 3 + 1 = 9,
//   copied slots 3 (fork) + 11 + 6 + 7 + 8 = 35.
static const expect_run expected[] = {
    {PKV_POLICY_PAGED, {{12, 8, 4}, {16, 14, 2}, {8, 7, 1}, {8, 8, 0}, {12, 9, 0}}, 16, 14, 1, 1, 1, 3},
    {PKV_POLICY_CONTIG_ORACLE, {{17, 8, 9}, {17, 14, 3}, {9, 7, 2}, {9, 8, 1}, {9, 9, 0}}, 17, 14, 1, 1, 0, 3},
    {PKV_POLICY_CONTIG_POW2, {{32, 8, 9}, {32, 14, 3}, {16, 7, 2}, {16, 8, 1}, {16, 9, 0}}, 32, 14, 1, 1, 0, 3},
    {PKV_POLICY_CONTIG_POW2_GROW, {{16, 8, 8}, {16, 14, 2}, {8, 7, 1}, {8, 8, 0}, {16, 9, 0}}, 16, 14, 1, 1, 0, 3},
    {PKV_POLICY_CONTIG_MAX, {{48, 8, 9}, {48, 14, 3}, {16, 7, 2}, {16, 8, 1}, {16, 9, 0}}, 48, 14, 1, 1, 0, 3},
    {PKV_POLICY_MALLOC_PER_REQUEST, {{17, 8, 9}, {17, 14, 3}, {9, 7, 2}, {9, 8, 1}, {9, 9, 0}}, 17, 14, 3, 3, 0, 3},
    {PKV_POLICY_MALLOC_PER_TOKEN, {{8, 8, 0}, {11, 11, 0}, {7, 7, 0}, {8, 8, 0}, {9, 9, 0}}, 11, 11, 14, 14, 0, 0},
    {PKV_POLICY_REALLOC_COPY, {{11, 8, 3}, {14, 14, 0}, {7, 7, 0}, {8, 8, 0}, {9, 9, 0}}, 14, 14, 9, 9, 0, 35},
};

Test(replay_hand, every_policy_matches_the_hand_computation) {
    const pkv_trace_request r[2] = {{0, 5, 5, 1, -1, 0, 0}, {0, 3, 2, 2, -1, 0, 1}};
    pkv_trace *t = make_trace(r, 2);
    for (size_t k = 0; k < sizeof expected / sizeof expected[0]; k++) {
        const expect_run *x = &expected[k];
        pkv_replay_params p = tiny_replay_params(x->policy, 1000);
        recorder rec = {0};
        p.on_step = record;
        p.user = &rec;
        pkv_replay_report rep;
        cr_assert_eq(pkv_replay_run(t, &p, &rep), PKV_OK, "%s", pkv_policy_name(x->policy));
        const char *name = rep.policy;
        cr_assert_eq(rec.n, 5, "%s: %llu steps", name, (unsigned long long)rec.n);
        double w = 0, waste = 0, internal = 0, reservation = 0;
        for (int s = 0; s < 5; s++) {
            cr_expect_eq(rec.s[s].reserved_bytes, x->steps[s].reserved * 4, "%s step %d reserved %llu",
                         name, s + 1, (unsigned long long)rec.s[s].reserved_bytes / 4);
            cr_expect_eq(rec.s[s].used_bytes, x->steps[s].used * 4, "%s step %d used %llu", name,
                         s + 1, (unsigned long long)rec.s[s].used_bytes / 4);
            cr_expect_eq(rec.s[s].reservation_bytes, x->steps[s].reservation * 4,
                         "%s step %d reservation %llu", name, s + 1,
                         (unsigned long long)rec.s[s].reservation_bytes / 4);
            const double rs = (double)rec.s[s].reserved_bytes, dt = rec.s[s].step_s;
            cr_assert_gt(dt, 0);
            w += dt;
            waste += dt * (rs - (double)rec.s[s].used_bytes) / rs;
            reservation += dt * (double)rec.s[s].reservation_bytes / rs;
            internal += dt * (rs - (double)rec.s[s].used_bytes - (double)rec.s[s].reservation_bytes) / rs;
        }
        // The report's fractions are these per-step values, time-weighted.
        cr_expect_float_eq(rep.memory.waste_frac, waste / w, 1e-12, "%s waste", name);
        cr_expect_float_eq(rep.memory.reservation_frac, reservation / w, 1e-12, "%s", name);
        cr_expect_float_eq(rep.memory.internal_frag_frac, internal / w, 1e-12, "%s", name);
        cr_expect_float_eq(rep.memory.waste_frac,
                           rep.memory.internal_frag_frac + rep.memory.reservation_frac, 1e-12);
        cr_expect_eq(rep.memory.external_frag_frac, 0, "%s: ample memory", name);
        cr_expect_eq(rep.memory.peak_reserved_bytes, x->peak_reserved * 4, "%s peak reserved", name);
        cr_expect_eq(rep.memory.peak_used_bytes, x->peak_used * 4, "%s peak used", name);
        cr_expect_eq(rep.alloc.backend_alloc_calls, x->allocs, "%s allocs %llu", name,
                     (unsigned long long)rep.alloc.backend_alloc_calls);
        cr_expect_eq(rep.alloc.backend_free_calls, x->frees, "%s frees %llu", name,
                     (unsigned long long)rep.alloc.backend_free_calls);
        cr_expect_eq(rep.alloc.backend_alloc_seconds, 0, "sim mode does not invent seconds");
        cr_expect_eq(rep.alloc.seconds_measured, 0);
        cr_expect_eq(rep.cow_copies, x->cow, "%s cow", name);
        cr_expect_eq(rep.copy_bytes, x->copy_slots * 4, "%s copied %llu slots", name,
                     (unsigned long long)rep.copy_bytes / 4);
        cr_expect_eq(rep.forks, 1);
        cr_expect_eq(rep.requests.completed, 2);
        cr_expect_eq(rep.preemptions, 0);
        cr_expect_eq(rep.throughput.output_tokens, 5 + 2 * 2);
        cr_expect_eq(rep.batch.max, 3, "%s: R0 + R1's two samples in step 2", name);
        cr_expect_eq(rep.steps, 5);
    }
    pkv_trace_destroy(t);
}

Test(replay_hand, modelled_alloc_seconds_are_calls_times_cost) {
    const pkv_trace_request r[2] = {{0, 5, 5, 1, -1, 0, 0}, {0, 3, 2, 2, -1, 0, 1}};
    pkv_trace *t = make_trace(r, 2);
    pkv_replay_params p = tiny_replay_params(PKV_POLICY_REALLOC_COPY, 1000);
    p.alloc_model = pkv_alloc_model_constant(1e-6);
    pkv_replay_report rep;
    cr_assert_eq(pkv_replay_run(t, &p, &rep), PKV_OK);
    cr_expect_float_eq(rep.alloc.backend_alloc_seconds, 9e-6, 1e-15);
    cr_expect_eq(rep.alloc.seconds_measured, 0);
    pkv_trace_destroy(t);
}

// A: P5 O2 (6 slots), B: P1 O6 (6), C: P5 O2 (6), D: P9 O2 (10) on 20 slots.
// Oracle places A [0,6), B [6,12), C [12,18); D waits (2 free). After step 2 A
// and C are gone: 14 slots free in holes of 6 and 8, D needs 10: external
// fragmentation of 14 slots in steps 3..6, until B finishes.
Test(replay_frag, external_fragmentation_is_measured) {
    const pkv_trace_request r[4] = {{0, 5, 2, 1, -1, 0, 0}, {0, 1, 6, 1, -1, 0, 1},
                                    {0, 5, 2, 1, -1, 0, 2}, {0, 9, 2, 1, -1, 0, 3}};
    pkv_trace *t = make_trace(r, 4);
    pkv_replay_params p = tiny_replay_params(PKV_POLICY_CONTIG_ORACLE, 20);
    recorder rec = {0};
    p.on_step = record;
    p.user = &rec;
    pkv_replay_report rep;
    cr_assert_eq(pkv_replay_run(t, &p, &rep), PKV_OK);
    cr_expect_eq(rep.requests.completed, 4);
    cr_assert_geq(rec.n, 6);
    cr_expect_eq(rec.s[0].ext_frag_bytes, 0, "2 free slots: lack of memory, not fragmentation");
    cr_expect_eq(rec.s[1].ext_frag_bytes, 0);
    for (int s = 2; s < 6; s++)
        cr_expect_eq(rec.s[s].ext_frag_bytes, 14 * 4, "step %d ext %llu", s + 1,
                     (unsigned long long)rec.s[s].ext_frag_bytes);
    cr_expect_gt(rep.memory.external_frag_frac, 0);
    cr_expect_leq(rep.memory.external_frag_frac, 1);
    // Paged on the same budget never has external fragmentation.
    p = tiny_replay_params(PKV_POLICY_PAGED, 20);
    p.block_size = 2;
    cr_assert_eq(pkv_replay_run(t, &p, &rep), PKV_OK);
    cr_expect_eq(rep.memory.external_frag_frac, 0);
    cr_expect_eq(rep.requests.completed, 4);
    pkv_trace_destroy(t);
}

// ---- identities on generated traces ----

typedef struct checker {
    uint64_t steps;
    uint32_t block_size;
    int paged;
    uint64_t bpt;
} checker;

static void check_step(void *user, const pkv_replay_step *s) {
    checker *c = user;
    c->steps++;
    cr_assert_leq(s->used_bytes, s->reserved_bytes, "used <= reserved at step %llu",
                  (unsigned long long)s->index);
    cr_assert_leq(s->reserved_bytes, s->capacity_bytes, "reserved <= capacity");
    cr_assert_leq(s->reservation_bytes, s->reserved_bytes - s->used_bytes);
    cr_assert_eq(s->free_bytes + s->reserved_bytes, s->capacity_bytes);
    cr_assert_leq(s->ext_frag_bytes, s->free_bytes);
    cr_assert_gt(s->step_s, 0);
    if (c->paged) {
        // Internal fragmentation below one block per live sequence.
        const uint64_t internal = s->reserved_bytes - s->used_bytes - s->reservation_bytes;
        cr_assert_lt(internal, (uint64_t)s->running * c->block_size * c->bpt + 1,
                     "paged internal fragmentation %llu bytes for %u sequences",
                     (unsigned long long)internal, s->running);
        cr_assert_eq(s->ext_frag_bytes, 0);
    }
}

static void check_fracs(const pkv_replay_report *r) {
    const double f[] = {r->memory.waste_frac, r->memory.internal_frag_frac,
                        r->memory.reservation_frac, r->memory.external_frag_frac};
    for (int i = 0; i < 4; i++) cr_expect(f[i] >= 0 && f[i] <= 1, "%s: fraction %d = %g", r->policy, i, f[i]);
    cr_expect_float_eq(r->memory.waste_frac, r->memory.internal_frag_frac + r->memory.reservation_frac, 1e-9);
    cr_expect_leq(r->memory.peak_used_bytes, r->memory.peak_reserved_bytes);
    cr_expect_leq(r->memory.peak_reserved_bytes, r->memory.capacity_bytes);
    cr_expect_leq(r->latency.step_p50_ms, r->latency.step_p99_ms);
    cr_expect_leq(r->latency.step_p99_ms, r->latency.step_max_ms);
    cr_expect_leq(r->batch.mean, r->batch.max);
}

static pkv_trace *generated(uint64_t seed, uint64_t n, double parallel, double prefix) {
    pkv_tracegen_params g = pkv_tracegen_params_default();
    g.seed = seed;
    g.num_requests = n;
    g.rate_rps = 20;
    g.prompt_median = 300;
    g.prompt_max = 2000;
    g.output_median = 60;
    g.output_max = 400;
    g.parallel_frac = parallel;
    g.n_min = 2;
    g.n_max = 8;
    g.prefix_frac = prefix;
    g.prefix_groups = 3;
    g.prefix_tokens = 200;
    pkv_trace *t;
    cr_assert_eq(pkv_trace_generate(&g, &t), PKV_OK);
    return t;
}

static void identities_on(pkv_trace *t, uint64_t kv_mem, pkv_preempt_mode mode, int expect_preempt) {
    for (int k = 0; k < PKV_POLICY_COUNT; k++) {
        pkv_replay_params p = pkv_replay_params_default(); // llama2-7b, fp16
        p.policy = (pkv_policy)k;
        p.kv_mem_bytes = kv_mem;
        p.preempt = mode;
        p.validate = 1;
        checker c = {0, p.block_size, k == PKV_POLICY_PAGED,
                     pkv_model_kv_bytes_per_token(&p.model, 2)};
        p.on_step = check_step;
        p.user = &c;
        pkv_replay_report rep;
        pkv_status rst = pkv_replay_run(t, &p, &rep);
        cr_assert_eq(rst, PKV_OK, "%s: %s", pkv_policy_name(p.policy), pkv_status_str(rst));
        check_fracs(&rep);
        cr_expect_eq(rep.steps, c.steps);
        cr_expect_eq(rep.requests.completed + rep.requests.rejected, rep.requests.total);
        if (!expect_preempt) {
            cr_expect_eq(rep.requests.completed, rep.requests.total, "%s: ample memory", rep.policy);
            cr_expect_eq(rep.preemptions, 0, "%s", rep.policy);
        }
        if (expect_preempt && k == PKV_POLICY_PAGED) {
            cr_expect_gt(rep.preemptions, 0, "tight memory must preempt");
            cr_expect_eq(rep.requests.completed, rep.requests.total, "preemption never drops work");
            if (mode == PKV_PREEMPT_SWAP)
                cr_expect_gt(rep.swap_bytes, 0);
            else
                cr_expect_eq(rep.swap_bytes, 0);
        }
    }
}

Test(replay_identities, ample_memory_completes_everything, .timeout = 240) {
    pkv_trace *t = generated(11, 300, 0.3, 0.3);
    identities_on(t, 1ull << 40, PKV_PREEMPT_RECOMPUTE, 0); // 1 TiB: nobody waits for memory
    pkv_trace_destroy(t);
}

Test(replay_identities, tight_memory_preempts_by_recompute, .timeout = 240) {
    pkv_trace *t = generated(12, 300, 0.3, 0.5); // prefixes: the cache must give way too
    identities_on(t, 3ull << 30, PKV_PREEMPT_RECOMPUTE, 1);
    pkv_trace_destroy(t);
}

Test(replay_identities, tight_memory_preempts_by_swap, .timeout = 240) {
    pkv_trace *t = generated(13, 300, 0.3, 0.0);
    identities_on(t, 3ull << 30, PKV_PREEMPT_SWAP, 1);
    pkv_trace_destroy(t);
}

Test(replay_identities, rejects_requests_longer_than_max_seq_len) {
    const pkv_trace_request r[2] = {{0, 10, 10, 1, -1, 0, 0}, {0, 15, 5, 1, -1, 0, 1}};
    pkv_trace *t = make_trace(r, 2);
    pkv_replay_params p = tiny_replay_params(PKV_POLICY_PAGED, 1000);
    pkv_replay_report rep;
    cr_assert_eq(pkv_replay_run(t, &p, &rep), PKV_OK);
    // 15 + 5 - 1 = 19 > 16 tokens: rejected; 10 + 10 - 1 = 19 too.
    cr_expect_eq(rep.requests.rejected, 2);
    cr_expect_eq(rep.requests.completed, 0);
    p.max_seq_len = 32;
    cr_assert_eq(pkv_replay_run(t, &p, &rep), PKV_OK);
    cr_expect_eq(rep.requests.completed, 2);
    pkv_trace_destroy(t);
}

// A load scale that pushes an arrival to infinity is refused up front: the step
// loop would otherwise wait for that arrival forever (issue 15, defect 13).
Test(replay_identities, load_scale_that_overflows_arrivals_is_refused, .timeout = 30) {
    const pkv_trace_request r[2] = {{0, 4, 2, 1, -1, 0, 0}, {1.0, 4, 2, 1, -1, 0, 1}};
    pkv_trace *t = make_trace(r, 2);
    pkv_replay_params p = tiny_replay_params(PKV_POLICY_PAGED, 1000);
    pkv_replay_report rep;
    p.load_scale = 1e-310;
    cr_expect_eq(pkv_replay_run(t, &p, &rep), PKV_ERR_INVALID_ARG);
    p.load_scale = 1e-300; // 1e300 s: finite, so it runs
    cr_assert_eq(pkv_replay_run(t, &p, &rep), PKV_OK);
    cr_expect_eq(rep.requests.completed, 2);
    pkv_trace_destroy(t);
}

// Prefix sharing goes through the library's prefix cache. Requests of group 5
// share their first 64 prompt tokens (4 blocks of 16); each has 100 prompt and 20
// output tokens (119 at the end). r0 arrives at 0, r1..r7 just after step 1.
//   Step 1: r0 prefills 100 tokens (nothing cached); its 6 full blocks enter the
//   cache when the step ends. Step 2: r1..r7 find the 4 group blocks (64 tokens
//   each, 448 in all; block 5 holds r0's own tokens and does not match) and
//   prefill 36 tokens each. At step k (2..20) r0 holds 99 + k tokens and r1..r7
//   98 + k each: used = 64 (shared, once) + (35 + k) + 7 x (34 + k) = 337 + 8k,
//   the peak 497 at step 20 (r0 ends then). Without sharing: (99 + k) + 7 x
//   (98 + k) = 785 + 8k, peak 945.
// The same requests all arriving at 0 share nothing: blocks become reusable only
// when the prefill step that fills them has ended.
Test(replay_prefix, prefix_cache_shares_group_prefixes) {
    pkv_trace_request r[8];
    for (int i = 0; i < 8; i++)
        r[i] = (pkv_trace_request){i ? 1e-9 : 0, 100, 20, 1, 5, 64, (uint64_t)i};
    pkv_trace *t = make_trace(r, 8);
    pkv_replay_params p = tiny_replay_params(PKV_POLICY_PAGED, 4096);
    p.max_seq_len = 256;
    p.block_size = 16;
    pkv_replay_report shared, alone;
    cr_assert_eq(pkv_replay_run(t, &p, &shared), PKV_OK);
    cr_expect_eq(shared.requests.completed, 8);
    cr_expect_eq(shared.prefix_cached_tokens, 7 * 64);
    cr_expect_eq(shared.memory.peak_used_bytes, 497 * 4, "peak used %llu slots",
                 (unsigned long long)shared.memory.peak_used_bytes / 4);
    p.prefix_sharing = 0;
    cr_assert_eq(pkv_replay_run(t, &p, &alone), PKV_OK);
    cr_expect_eq(alone.prefix_cached_tokens, 0);
    cr_expect_eq(alone.memory.peak_used_bytes, 945 * 4, "peak used %llu slots",
                 (unsigned long long)alone.memory.peak_used_bytes / 4);
    pkv_trace_destroy(t);

    for (int i = 0; i < 8; i++) r[i].arrival_s = 0;
    t = make_trace(r, 8);
    p.prefix_sharing = 1;
    cr_assert_eq(pkv_replay_run(t, &p, &shared), PKV_OK);
    cr_expect_eq(shared.prefix_cached_tokens, 0, "same-step prefills cannot share");
    cr_expect_eq(shared.memory.peak_used_bytes, 8 * 119 * 4);
    pkv_trace_destroy(t);
}

// Mooncake hash ids drive the cache too: two requests whose first two 512-token
// blocks agree share 1024 tokens once the first one's prefill has ended.
Test(replay_prefix, mooncake_hash_ids_are_shared) {
    const char *text =
        "{\"timestamp\": 0, \"input_length\": 1100, \"output_length\": 50, \"hash_ids\": [0, 1, 2]}\n"
        "{\"timestamp\": 1000, \"input_length\": 1300, \"output_length\": 5, \"hash_ids\": [0, 1, 9]}\n"
        "{\"timestamp\": 2000, \"input_length\": 600, \"output_length\": 5, \"hash_ids\": [4, 5]}\n";
    pkv_trace *t = NULL;
    pkv_trace_error err;
    cr_assert_eq(pkv_trace_parse(text, strlen(text), "m.jsonl", NULL, &t, &err), PKV_OK);
    pkv_replay_params p = tiny_replay_params(PKV_POLICY_PAGED, 1 << 14);
    p.max_seq_len = 2048;
    p.block_size = 16;
    pkv_replay_report rep;
    cr_assert_eq(pkv_replay_run(t, &p, &rep), PKV_OK);
    cr_expect_eq(rep.requests.completed, 3);
    cr_expect_eq(rep.prefix_cached_tokens, 1024, "cached %llu", (unsigned long long)rep.prefix_cached_tokens);
    pkv_trace_destroy(t);
}

Test(replay_determinism, same_seed_same_report, .timeout = 120) {
    for (int k = 0; k < PKV_POLICY_COUNT; k++) {
        pkv_trace *a = generated(21, 200, 0.3, 0.3), *b = generated(21, 200, 0.3, 0.3);
        pkv_replay_params p = pkv_replay_params_default();
        p.policy = (pkv_policy)k;
        p.kv_mem_bytes = 4ull << 30;
        pkv_replay_report x, y;
        cr_assert_eq(pkv_replay_run(a, &p, &x), PKV_OK);
        cr_assert_eq(pkv_replay_run(b, &p, &y), PKV_OK);
        x.replay_seconds = y.replay_seconds = 0; // host wall time, the only non-modelled field
        cr_expect_eq(memcmp(&x, &y, sizeof x), 0, "%s: reports differ", x.policy);
        pkv_trace_destroy(a);
        pkv_trace_destroy(b);
    }
}

Test(replay_json, has_every_required_key) {
    const pkv_trace_request r[2] = {{0, 5, 5, 1, -1, 0, 0}, {0, 3, 2, 2, -1, 0, 1}};
    pkv_trace *t = make_trace(r, 2);
    pkv_replay_params p = tiny_replay_params(PKV_POLICY_PAGED, 1000);
    pkv_replay_report rep[2];
    cr_assert_eq(pkv_replay_run(t, &p, &rep[0]), PKV_OK);
    p.policy = PKV_POLICY_CONTIG_MAX;
    cr_assert_eq(pkv_replay_run(t, &p, &rep[1]), PKV_OK);
    char *buf = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&buf, &len);
    cr_assert_not_null(f);
    cr_assert_eq(pkv_replay_write_json(f, "x \"quoted\".csv", t, &p, rep, 2), PKV_OK);
    fclose(f);
    const char *keys[] = {
        "{\"trace\": {", "\"path\": \"x \\\"quoted\\\".csv\"", "\"runs\": [",
        "\"policy\": \"paged\"", "\"policy\": \"contiguous-max\"", "\"block_size\": 4",
        "\"requests\": {\"total\": 2, \"completed\": 2", "\"memory\": {\"capacity_bytes\": ",
        "\"peak_reserved_bytes\": ", "\"peak_used_bytes\": ", "\"waste_frac\": ",
        "\"internal_frag_frac\": ", "\"reservation_frac\": ", "\"external_frag_frac\": ",
        "\"alloc\": {\"backend_alloc_calls\": 1, \"backend_free_calls\": 1, \"backend_alloc_seconds\": 0",
        "\"latency\": {\"step_p50_ms\": ", "\"step_p99_ms\": ", "\"ttft_p50_ms\": ",
        "\"tpot_p50_ms\": ", "\"throughput\": {\"output_tokens_per_s\": ", "\"batch\": {\"mean\": ",
        "\"max\": 3}", "\"preemptions\": 0", "\"forks\": 1", "\"cow_copies\": 1",
        // tiny_replay_params keeps the a100-80g preset: its published factors.
        "\"sim_efficiency\": {\"bw_frac\": 0.6959", "\"compute_frac\": 0.6916", "\"step_overhead_us\": 0",
        "\"source\": \"torchao A100",
    };
    for (size_t i = 0; i < sizeof keys / sizeof keys[0]; i++)
        cr_expect(strstr(buf, keys[i]) != NULL, "JSON lacks %s", keys[i]);
    free(buf);
    pkv_trace_destroy(t);
}

Test(replay_params, sizes_parse_with_binary_suffixes) {
    uint64_t v;
    cr_expect_eq(pkv_size_parse("512", &v), PKV_OK);
    cr_expect_eq(v, 512);
    cr_expect_eq(pkv_size_parse("4K", &v), PKV_OK);
    cr_expect_eq(v, 4096);
    cr_expect_eq(pkv_size_parse("3M", &v), PKV_OK);
    cr_expect_eq(v, 3ull << 20);
    cr_expect_eq(pkv_size_parse("40G", &v), PKV_OK);
    cr_expect_eq(v, 40ull << 30);
    cr_expect_eq(pkv_size_parse("2T", &v), PKV_OK);
    cr_expect_eq(v, 2ull << 40);
    cr_expect_eq(pkv_size_parse("", &v), PKV_ERR_INVALID_ARG);
    cr_expect_eq(pkv_size_parse("G", &v), PKV_ERR_INVALID_ARG);
    cr_expect_eq(pkv_size_parse("-1G", &v), PKV_ERR_INVALID_ARG);
    cr_expect_eq(pkv_size_parse("99999999T", &v), PKV_ERR_INVALID_ARG, "overflow");
}

// Issue 25, item 12: one grammar for every tool. GB is 10^9 and GiB (and G) 2^30,
// as pkv-size always read them; pkv-replay refused "40GB" before.
Test(replay_params, sizes_parse_decimal_and_binary_units) {
    uint64_t v;
    const struct { const char *text; uint64_t bytes; } ok[] = {
        {"40GB", 40000000000ull},     {"40gb", 40000000000ull},   {"40GiB", 40ull << 30},
        {"40gib", 40ull << 30},       {"40G", 40ull << 30},       {"512B", 512},
        {"1.5G", 3ull << 29},         {"1.5GiB", 3ull << 29},     {"0.5GB", 500000000ull},
        {"141GB", 141000000000ull},   {"64KiB", 65536},           {"2MB", 2000000},
        {"1TB", 1000000000000ull},    {"0.1K", 102},              {"0", 0},
    };
    for (size_t i = 0; i < sizeof ok / sizeof ok[0]; i++) {
        cr_expect_eq(pkv_size_parse(ok[i].text, &v), PKV_OK, "%s", ok[i].text);
        cr_expect_eq(v, ok[i].bytes, "%s: %llu", ok[i].text, (unsigned long long)v);
    }
    const char *bad[] = {"1.5", "1.", ".5G", "1GBB", "1iB", "1Gi", "1 G", "1e9", "1X", "G",
                         "18446744073709551616", "17179869184GiB", "20000000TB", "1.5B"};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++)
        cr_expect_eq(pkv_size_parse(bad[i], &v), PKV_ERR_INVALID_ARG, "%s", bad[i]);
}

Test(replay_params, budget_and_presets) {
    pkv_replay_params p = pkv_replay_params_default();
    uint64_t b;
    cr_assert_eq(pkv_replay_kv_budget(&p, &b), PKV_OK);
    // (80 GiB - 6,738,415,616 x 2 bytes of llama2-7b weights) x 0.9.
    const double expect = ((double)(81920ull << 20) - 6738415616.0 * 2) * 0.9;
    cr_expect_float_eq((double)b, expect, 1.0);
    p.kv_mem_bytes = 123;
    cr_assert_eq(pkv_replay_kv_budget(&p, &b), PKV_OK);
    cr_expect_eq(b, 123);
    pkv_gpu_spec g;
    for (const char *const *n = pkv_gpu_preset_names(); *n; n++) {
        cr_assert_eq(pkv_gpu_preset(*n, &g), PKV_OK);
        cr_expect_gt(g.mem_bw, 1e12);
        cr_expect_gt(g.peak_flops, 1e14);
    }
    cr_expect_eq(pkv_gpu_preset("v100", &g), PKV_ERR_NOT_FOUND);
    // A model larger than the GPU has no budget.
    p = pkv_replay_params_default();
    cr_assert_eq(pkv_model_preset("gpt3-175b", &p.model), PKV_OK);
    cr_expect_eq(pkv_replay_kv_budget(&p, &b), PKV_ERR_INVALID_ARG);
    pkv_policy pol;
    cr_expect_eq(pkv_policy_from_name("contiguous-pow2", &pol), PKV_OK);
    cr_expect_eq(pol, PKV_POLICY_CONTIG_POW2);
    cr_expect_eq(pkv_policy_from_name("buddy", &pol), PKV_ERR_NOT_FOUND);
}

Test(replay_params, bad_params_are_rejected) {
    const pkv_trace_request r[1] = {{0, 5, 5, 1, -1, 0, 0}};
    pkv_trace *t = make_trace(r, 1);
    pkv_replay_report rep;
    pkv_replay_params p = tiny_replay_params(PKV_POLICY_PAGED, 1000);
    p.block_size = 0;
    cr_expect_eq(pkv_replay_run(t, &p, &rep), PKV_ERR_INVALID_ARG);
    p = tiny_replay_params(PKV_POLICY_PAGED, 1000);
    p.watermark = 1.5;
    cr_expect_eq(pkv_replay_run(t, &p, &rep), PKV_ERR_INVALID_ARG);
    p = tiny_replay_params(PKV_POLICY_CONTIG_MAX, 1000);
    p.mode = PKV_REPLAY_RUN;
    p.batching = PKV_BATCHING_STATIC;
    cr_expect_eq(pkv_replay_run(t, &p, &rep), PKV_ERR_UNSUPPORTED, "run mode batches continuously");
    cr_expect_eq(pkv_replay_run(NULL, &p, &rep), PKV_ERR_INVALID_ARG);
    pkv_trace_destroy(t);
}

// Run mode: the tiny decoder on the CPU executes every step; its backend
// counters are measured (one arena allocation and one free).
Test(replay_run, tiny_model_on_cpu, .timeout = 240) {
    const pkv_trace_request r[4] = {{0, 20, 6, 1, -1, 0, 0}, {0, 9, 5, 3, -1, 0, 1},
                                    {0.001, 33, 4, 1, -1, 0, 2}, {0.002, 5, 7, 2, -1, 0, 3}};
    pkv_trace *t = make_trace(r, 4);
    pkv_replay_params p = pkv_replay_params_default();
    p.mode = PKV_REPLAY_RUN;
    cr_assert_eq(pkv_model_preset("tiny", &p.model), PKV_OK);
    p.dtype_bytes = 4;
    p.kv_mem_bytes = 1 << 20;
    p.run_threads = 1;
    p.validate = 1;
    pkv_replay_report rep;
    pkv_status st = pkv_replay_run(t, &p, &rep);
    cr_assert_eq(st, PKV_OK, "run mode: %s", pkv_status_str(st));
    cr_expect_eq(rep.requests.completed, 4);
    cr_expect_str_eq(rep.mode, "run");
    cr_expect_eq(rep.alloc.seconds_measured, 1);
    cr_expect_eq(rep.alloc.backend_alloc_calls, 1, "the cache's one arena");
    cr_expect_eq(rep.alloc.backend_free_calls, 1);
    cr_expect_gt(rep.alloc.backend_alloc_seconds, 0);
    cr_expect_gt(rep.latency.step_p50_ms, 0);
    cr_expect_eq(rep.forks, 2 + 1);
    cr_expect_gt(rep.cow_copies, 0, "forked samples copy their shared partial block");
    pkv_trace_destroy(t);
}

// Sim efficiency (issue 16). The published figures behind each preset's default,
// as docs/POLICIES.md ("Sim efficiency") quotes them, turned into fractions here
// from their own arithmetic: a batch-1 decode step moves the fp16 weights it
// reads (every weight but the token embedding's unused rows: params - vocab x
// d_model + d_model, x 2 bytes) in 1 / (tokens/s); a 2048-token prefill does 2 x
// params x 2048 + 4 x layers x heads x head_dim x 2048 x 2049 / 2 flops in the
// first-token latency.
#define LLAMA2_7B_PARAMS 6738415616.0 // llama2-7b: 32 layers, 32 heads, head_dim 128
#define LLAMA3_8B_PARAMS 8030261248.0
#define LLAMA2_7B_READ (LLAMA2_7B_PARAMS - 32000.0 * 4096 + 4096) // vocab 32000, untied
#define LLAMA3_8B_READ (LLAMA3_8B_PARAMS - 128256.0 * 4096 + 4096) // vocab 128256, untied
static double llama2_7b_prefill_flops(double t) {
    return 2 * LLAMA2_7B_PARAMS * t + 4.0 * 32 * 32 * 128 * (t * (t + 1) / 2);
}

Test(replay_sim_eff, defaults_are_the_published_figures) {
    pkv_gpu_spec g;
    pkv_sim_efficiency e;
    // A100-80GB: torchao Llama-2-7B bf16 107.38 tokens/s; TensorRT-LLM 0.5 LLaMA 7B
    // fp16, 2048 tokens, 133 ms to the first token.
    cr_assert_eq(pkv_gpu_preset("a100-80g", &g), PKV_OK);
    cr_assert_eq(pkv_sim_efficiency_for_gpu(&g, &e), PKV_OK);
    cr_expect_float_eq(e.bw_frac, LLAMA2_7B_READ * 2 * 107.38 / 2039e9, 1e-12);
    cr_expect_float_eq(e.compute_frac, llama2_7b_prefill_flops(2048) / 0.133 / 312e12, 1e-12);
    cr_expect_eq(e.step_overhead_s, 0);
    cr_expect(e.bw_frac > 0.695 && e.bw_frac < 0.697 && e.compute_frac > 0.68 && e.compute_frac < 0.70,
              "a100: %g, %g", e.bw_frac, e.compute_frac);
    cr_expect(strstr(e.source, "torchao") && strstr(e.source, "TensorRT-LLM"), "%s", e.source);
    // H100: torchao Llama-3.1-8B bf16 126.90 tokens/s; no fp16 prefill figure: the
    // share of the FP8 dense peak (1979 TFLOPS) TensorRT-LLM 0.5 reached with its
    // FP8 row (LLaMA 7B, 2048 tokens, 36 ms), 0.403.
    cr_assert_eq(pkv_gpu_preset("h100-80g", &g), PKV_OK);
    cr_assert_eq(pkv_sim_efficiency_for_gpu(&g, &e), PKV_OK);
    const double h100_bw = LLAMA3_8B_READ * 2 * 126.90 / 3.35e12;
    const double h100_compute = llama2_7b_prefill_flops(2048) / 0.036 / 1979e12;
    cr_expect_float_eq(e.bw_frac, h100_bw, 1e-12);
    cr_expect_float_eq(e.compute_frac, h100_compute, 1e-12);
    cr_expect(e.compute_frac > 0.40 && e.compute_frac < 0.41, "h100 compute %g", e.compute_frac);
    cr_expect_eq(e.step_overhead_s, 0);
    // H200: the H100's fractions (no H200 figure).
    cr_assert_eq(pkv_gpu_preset("h200-141g", &g), PKV_OK);
    cr_assert_eq(pkv_sim_efficiency_for_gpu(&g, &e), PKV_OK);
    cr_expect_float_eq(e.bw_frac, h100_bw, 1e-12);
    cr_expect_float_eq(e.compute_frac, h100_compute, 1e-12);
    // Every preset has figures and a source that names them.
    for (const char *const *n = pkv_gpu_preset_names(); *n; n++) {
        cr_assert_eq(pkv_gpu_preset(*n, &g), PKV_OK);
        cr_expect_eq(pkv_sim_efficiency_for_gpu(&g, &e), PKV_OK, "%s", *n);
        // No preset runs at 100 % of a datasheet peak by default.
        cr_expect(e.bw_frac > 0 && e.bw_frac < 1 && e.compute_frac > 0 && e.compute_frac < 1, "%s", *n);
        cr_expect_gt(strlen(e.source), 10, "%s", *n);
    }
}

Test(replay_sim_eff, default_follows_the_gpu_and_a_gpu_of_ones_own_is_the_plain_roofline) {
    pkv_replay_params p = pkv_replay_params_default();
    pkv_sim_efficiency e, want;
    cr_expect(p.sim_eff.bw_frac == 0 && p.sim_eff.compute_frac == 0 && p.sim_eff.step_overhead_s == 0,
              "the default is 'the GPU's own'");
    cr_assert_eq(pkv_replay_sim_efficiency(&p, &e), PKV_OK);
    cr_assert_eq(pkv_sim_efficiency_for_gpu(&p.gpu, &want), PKV_OK);
    cr_expect(e.bw_frac == want.bw_frac && e.compute_frac == want.compute_frac);
    cr_assert_eq(pkv_gpu_preset("h100-80g", &p.gpu), PKV_OK); // after the default: follows
    cr_assert_eq(pkv_replay_sim_efficiency(&p, &e), PKV_OK);
    cr_assert_eq(pkv_sim_efficiency_for_gpu(&p.gpu, &want), PKV_OK);
    cr_expect(e.bw_frac == want.bw_frac && e.compute_frac == want.compute_frac && e.compute_frac < 1);
    // Other rates under a preset's name, or another name: no published figures.
    p.gpu.mem_bw = 1e12;
    cr_expect_eq(pkv_sim_efficiency_for_gpu(&p.gpu, &e), PKV_ERR_NOT_FOUND);
    cr_expect(e.bw_frac == 1 && e.compute_frac == 1 && e.step_overhead_s == 0);
    cr_assert_eq(pkv_replay_sim_efficiency(&p, &e), PKV_OK);
    cr_expect(e.bw_frac == 1 && e.compute_frac == 1 && e.step_overhead_s == 0, "plain roofline");
    cr_expect(strstr(e.source, "no published") != NULL, "%s", e.source);
    // Explicit values are used as given; out of range is refused.
    p.sim_eff = pkv_sim_efficiency_peak();
    p.sim_eff.bw_frac = 0.5;
    cr_assert_eq(pkv_replay_sim_efficiency(&p, &e), PKV_OK);
    cr_expect(e.bw_frac == 0.5 && e.compute_frac == 1);
    const double bad[][3] = {{0.5, 0, 0}, {0, 0, 1e-6}, {1.5, 1, 0}, {1, -0.1, 0}, {1, 1, -1}, {1, 1, NAN}};
    const pkv_trace_request r[1] = {{0, 5, 5, 1, -1, 0, 0}};
    pkv_trace *t = make_trace(r, 1);
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        pkv_replay_params q = tiny_replay_params(PKV_POLICY_PAGED, 1000);
        q.sim_eff.bw_frac = bad[i][0];
        q.sim_eff.compute_frac = bad[i][1];
        q.sim_eff.step_overhead_s = bad[i][2];
        cr_expect_eq(pkv_replay_sim_efficiency(&q, &e), PKV_ERR_INVALID_ARG, "case %zu", i);
        pkv_replay_report rep;
        cr_expect_eq(pkv_replay_run(t, &q, &rep), PKV_ERR_INVALID_ARG, "case %zu", i);
    }
    pkv_trace_destroy(t);
}

// The first step of a one-request replay: llama2-7b on the a100-80g, no call costs.
static pkv_replay_step first_step(pkv_replay_params p, uint32_t prompt, uint32_t output, steps *rec) {
    const pkv_trace_request r[1] = {{0, prompt, output, 1, -1, 0, 0}};
    pkv_trace *t = make_trace(r, 1);
    p.alloc_model = pkv_alloc_model_none();
    memset(rec, 0, sizeof *rec);
    p.on_step = record_steps;
    p.user = rec;
    pkv_replay_report rep;
    cr_assert_eq(pkv_replay_run(t, &p, &rep), PKV_OK);
    cr_assert_eq(rep.requests.completed, 1);
    cr_assert_geq(rec->n, 1);
    pkv_trace_destroy(t);
    return rec->v[0];
}

// With the defaults, sim mode reproduces the published steps it was derived
// from; with pkv_sim_efficiency_peak() it is the plain roofline again.
Test(replay_sim_eff, sim_reproduces_the_published_steps_and_peak_is_the_plain_roofline) {
    steps rec;
    pkv_replay_params p = pkv_replay_params_default();
    pkv_replay_step s = first_step(p, 2048, 1, &rec);
    cr_expect_eq(s.prefill_tokens, 2048);
    cr_expect_float_eq(s.step_s, 0.133, 1e-12, "TensorRT-LLM's 133 ms, got %.9g s", s.step_s);
    free(rec.v);
    // Decode at batch 1 and a few tokens of context: torchao's 107.38 tokens/s, but
    // for the KV the measurement's bytes left out (< 0.1 % here).
    first_step(p, 8, 6, &rec);
    cr_assert_geq(rec.n, 3);
    for (size_t i = 1; i < rec.n; i++)
        cr_expect_float_eq(rec.v[i].step_s * 107.38, 1.0, 1e-3, "step %zu: %g s", i, rec.v[i].step_s);
    free(rec.v);
    // Peak: flops / 312 TFLOPS exactly.
    p.sim_eff = pkv_sim_efficiency_peak();
    s = first_step(p, 2048, 1, &rec);
    cr_expect_float_eq(s.step_s, llama2_7b_prefill_flops(2048) / 312e12, 1e-12, "%.9g", s.step_s);
    free(rec.v);
    // And the decode step: bytes / 2039 GB/s exactly, the bytes being the roofline's own count.
    first_step(p, 8, 6, &rec);
    for (size_t i = 1; i < rec.n; i++)
        cr_expect_float_eq(rec.v[i].step_s, rec.v[i].work_bytes / 2039e9, 1e-12, "step %zu", i);
    free(rec.v);
}

// A calibration replaces the rates and the efficiency: the published defaults
// are not applied on top of measured rates.
Test(replay_sim_eff, calibration_overrides_the_defaults) {
    pkv_replay_calibration cal;
    memset(&cal, 0, sizeof cal);
    snprintf(cal.model, sizeof cal.model, "llama2-7b");
    snprintf(cal.device, sizeof cal.device, "cuda");
    cal.dtype_bytes = 2;
    cal.achieved_bw = 9.5e11;
    cal.achieved_flops = 2e14;
    cal.step_overhead_s = 125e-6;
    cal.alloc = pkv_alloc_model_none();
    pkv_replay_params p = pkv_replay_params_default();
    cr_assert_eq(pkv_replay_params_apply_calibration(&p, &cal, "cal.json"), PKV_OK);
    pkv_sim_efficiency e;
    cr_assert_eq(pkv_replay_sim_efficiency(&p, &e), PKV_OK);
    cr_expect(e.bw_frac == 1 && e.compute_frac == 1 && e.step_overhead_s == 125e-6);
    cr_expect_str_eq(e.source, "cal.json");
    steps rec;
    pkv_replay_step s = first_step(p, 2048, 1, &rec);
    cr_expect_float_eq(s.step_s, llama2_7b_prefill_flops(2048) / 2e14 + 125e-6, 1e-12, "%.9g", s.step_s);
    free(rec.v);
    // Even with the overhead at 0 the calibration's 1, 1 hold (0 overhead is not "default").
    cal.step_overhead_s = 0;
    p = pkv_replay_params_default();
    cr_assert_eq(pkv_replay_params_apply_calibration(&p, &cal, NULL), PKV_OK);
    s = first_step(p, 2048, 1, &rec);
    cr_expect_float_eq(s.step_s, llama2_7b_prefill_flops(2048) / 2e14, 1e-12, "%.9g", s.step_s);
    free(rec.v);
}

// SPDX-License-Identifier: MIT
// Shared by the replay harnesses (fuzz_replay, fuzz_plugin): parameters and a
// small trace from the input's bytes, and the report's invariants (what
// pkv-replay --validate and a careful reader of the report expect).
#ifndef PKV_FUZZ_REPLAY_H
#define PKV_FUZZ_REPLAY_H

#include <math.h>
#include <stdint.h>
#include <string.h>

#include "fuzz_common.h"
#include "pkv/replay.h"
#include "pkv/trace.h"

#define FUZZ_REPLAY_OPTION_BYTES 12
#define FUZZ_REPLAY_MAX_REQUESTS 12

// Parameters from d[0..FUZZ_REPLAY_OPTION_BYTES-1]: a model of 4 bytes per
// token so that a byte of budget is a few slots (preemption, swap, rejections
// all reachable), every option of the scheduler, --validate on.
static inline pkv_replay_params fuzz_replay_params(const uint8_t *d) {
    pkv_replay_params p = pkv_replay_params_default();
    CHECK(pkv_model_preset("tiny", &p.model) == PKV_OK, "tiny preset");
    p.model.num_layers = 1;
    p.model.num_heads = 1;
    p.model.num_kv_heads = 1;
    p.model.head_dim = 1;
    p.policy = (pkv_policy)(d[0] % PKV_POLICY_COUNT);
    p.block_size = 1u << (d[1] % 6);
    p.kv_mem_bytes = 4ull * (4 + (uint64_t)d[2] * 2); // 4 .. 514 slots
    p.max_seq_len = 8 + d[3];
    p.preempt = (d[4] & 1) ? PKV_PREEMPT_SWAP : PKV_PREEMPT_RECOMPUTE;
    p.swap_space_bytes = 4ull * 8 * (d[4] >> 1);
    p.batching = (d[5] & 1) ? PKV_BATCHING_STATIC : PKV_BATCHING_CONTINUOUS;
    p.chunked_prefill = (!(d[5] & 1) && (d[5] & 2)) ? 1u + (d[5] >> 2) : 0;
    p.max_batch = 1 + d[6] % 16;
    p.max_tokens_per_step = 1 + (uint32_t)d[7] * 4;
    p.watermark = (d[8] % 5) * 0.05;
    p.prefix_sharing = d[9] & 1;
    p.load_scale = 0.25 + (d[9] >> 1) * 0.05;
    if (d[10] & 1) p.alloc_model = pkv_alloc_model_none();
    p.vmm_page_bytes = 4096ull * (1 + d[11] % 4);
    p.validate = 1;
    return p;
}

// A trace of up to FUZZ_REPLAY_MAX_REQUESTS requests, 4 bytes each; NULL when
// the bytes make none (or an invalid one: pkv_trace_create refuses it).
static inline pkv_trace *fuzz_replay_trace(const uint8_t *d, size_t size) {
    pkv_trace_request rq[FUZZ_REPLAY_MAX_REQUESTS];
    size_t n = 0;
    double t = 0;
    for (size_t i = 0; i + 4 <= size && n < FUZZ_REPLAY_MAX_REQUESTS; i += 4, n++) {
        t += d[i] * 0.004;
        const uint32_t prompt = 1 + d[i + 1];
        const int64_t group = (int64_t)(d[i + 3] >> 2) % 3 - 1;
        rq[n] = (pkv_trace_request){t, prompt, 1 + d[i + 2] % 48, 1 + d[i + 3] % 4, group,
                                    group >= 0 ? (uint32_t)(d[i + 3] >> 4) % (prompt + 1) : 0,
                                    (uint64_t)n};
    }
    if (n == 0) return NULL;
    pkv_trace *tr = NULL;
    pkv_trace_error err;
    return pkv_trace_create(rq, n, &tr, &err) == PKV_OK ? tr : NULL;
}

static inline int fuzz_frac_ok(double x) { return isnan(x) || (x >= -1e-9 && x <= 1 + 1e-9); }

// The report of a run that returned PKV_OK.
static inline void fuzz_check_report(const pkv_replay_report *r, const pkv_trace *t) {
    const pkv_trace_request *q = pkv_trace_requests(t);
    const size_t n = pkv_trace_count(t);
    CHECK(r->requests.total == n, "total %llu of %zu", (unsigned long long)r->requests.total, n);
    CHECK(r->requests.completed + r->requests.rejected == n, "completed %llu + rejected %llu != %zu",
          (unsigned long long)r->requests.completed, (unsigned long long)r->requests.rejected, n);
    CHECK(r->requests.rejected == r->requests.rejected_too_long + r->requests.rejected_no_memory,
          "rejections do not add up");
    CHECK((r->requests.completed == 0) == (r->failure[0] != 0), "failure '%s' with %llu completed",
          r->failure, (unsigned long long)r->requests.completed);
    CHECK(memchr(r->failure, 0, sizeof r->failure) != NULL, "failure unterminated");
    CHECK(r->memory.peak_used_bytes <= r->memory.peak_reserved_bytes &&
              r->memory.peak_reserved_bytes <= r->memory.capacity_bytes,
          "peaks: used %llu reserved %llu capacity %llu", (unsigned long long)r->memory.peak_used_bytes,
          (unsigned long long)r->memory.peak_reserved_bytes,
          (unsigned long long)r->memory.capacity_bytes);
    const double fr[] = {r->memory.waste_frac, r->memory.internal_frag_frac, r->memory.reservation_frac,
                         r->memory.external_frag_frac, r->memory.padding_frac,
                         r->memory.breakdown.token_states, r->memory.breakdown.reserved,
                         r->memory.breakdown.internal_frag, r->memory.breakdown.external_frag,
                         r->memory.breakdown.free, r->time.prefill_frac, r->time.decode_frac};
    for (size_t i = 0; i < sizeof fr / sizeof fr[0]; i++)
        CHECK(fuzz_frac_ok(fr[i]), "fraction %zu is %.17g", i, fr[i]);
    const double sum = r->memory.breakdown.token_states + r->memory.breakdown.reserved +
                       r->memory.breakdown.internal_frag + r->memory.breakdown.external_frag +
                       r->memory.breakdown.free;
    CHECK(isnan(sum) || fabs(sum - 1) < 1e-6, "breakdown sums to %.17g", sum);
    uint64_t most = 0;
    for (size_t i = 0; i < n; i++) most += (uint64_t)q[i].output_tokens * q[i].n;
    CHECK(r->throughput.output_tokens <= most, "output tokens %llu > %llu",
          (unsigned long long)r->throughput.output_tokens, (unsigned long long)most);
    CHECK(r->swap_bytes == r->swap_out_bytes + r->swap_in_bytes, "swap bytes");
    CHECK(r->swap_in_bytes <= r->swap_out_bytes, "swapped in more than out");
    CHECK(!r->partial, "partial without on_progress");
}

#endif // PKV_FUZZ_REPLAY_H

// SPDX-License-Identifier: MIT
// libFuzzer harness for the trace generator's parameters. The input is read as
// a params struct (doubles taken as raw bit patterns, so NaN, inf, subnormals
// and huge values all occur). The generator either refuses (INVALID_ARG) or
// returns a trace that passes the loader's checks and the save-and-reload
// oracle. Requests are capped at 64 to keep each run fast.
#include <stdint.h>

#include "fuzz_common.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

typedef struct reader {
    const uint8_t *p;
    size_t n;
} reader;

static uint64_t take(reader *r, size_t bytes) {
    uint64_t v = 0;
    for (size_t i = 0; i < bytes; i++) {
        v = v << 8 | (r->n ? *r->p : 0);
        if (r->n) r->p++, r->n--;
    }
    return v;
}

// A double: one selector byte picks a raw bit pattern or a small decimal value,
// so both the extremes and ordinary values show up often.
static double take_double(reader *r) {
    const uint8_t sel = (uint8_t)take(r, 1);
    if (sel < 64) {
        uint64_t bits = take(r, 8);
        double d;
        memcpy(&d, &bits, sizeof d);
        return d;
    }
    return (double)(int64_t)(take(r, 2)) / (double)(1u << (sel % 16)) - (sel & 1 ? 1 : 0);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    reader r = {data, size};
    pkv_tracegen_params p = pkv_tracegen_params_default();
    p.seed = take(&r, 8);
    p.num_requests = take(&r, 1) % 65; // 0 must be refused
    p.arrival = (pkv_arrival_kind)(take(&r, 1) % 3); // 2 is not a kind: refused
    p.rate_rps = take_double(&r);
    p.burst_cv = take_double(&r);
    p.prompt_median = take_double(&r);
    p.prompt_sigma = take_double(&r);
    p.prompt_max = (uint32_t)take(&r, 4);
    p.output_median = take_double(&r);
    p.output_sigma = take_double(&r);
    p.output_max = (uint32_t)take(&r, 4);
    p.parallel_frac = take_double(&r);
    p.n_min = (uint32_t)take(&r, 4);
    p.n_max = (uint32_t)take(&r, 4);
    p.prefix_frac = take_double(&r);
    p.prefix_groups = (uint32_t)take(&r, 4);
    p.prefix_tokens = (uint32_t)take(&r, 4);
    pkv_trace *t = NULL;
    pkv_status st = pkv_trace_generate(&p, &t);
    if (st != PKV_OK) {
        CHECK(st == PKV_ERR_INVALID_ARG || st == PKV_ERR_OUT_OF_MEMORY, "status %d", (int)st);
        CHECK(t == NULL, "failed generate wrote *out");
        return 0;
    }
    CHECK(pkv_trace_count(t) == p.num_requests, "count %zu want %llu", pkv_trace_count(t),
          (unsigned long long)p.num_requests);
    const pkv_trace_request *q = pkv_trace_requests(t);
    for (size_t i = 0; i < pkv_trace_count(t); i++) {
        CHECK(q[i].prompt_tokens <= (p.prompt_max > UINT32_MAX - p.prefix_tokens
                                         ? UINT32_MAX
                                         : p.prompt_max + p.prefix_tokens),
              "prompt %u", q[i].prompt_tokens);
        CHECK(q[i].output_tokens <= p.output_max, "output %u > max %u", q[i].output_tokens,
              p.output_max);
        CHECK(q[i].n == 1 || (q[i].n >= p.n_min && q[i].n <= p.n_max), "n %u", q[i].n);
        CHECK(q[i].prefix_group < (int64_t)p.prefix_groups, "group %lld",
              (long long)q[i].prefix_group);
    }
    // Deterministic: the same params give the same trace.
    pkv_trace *t2 = NULL;
    CHECK(pkv_trace_generate(&p, &t2) == PKV_OK, "second generate failed");
    const pkv_trace_request *q2 = pkv_trace_requests(t2);
    for (size_t i = 0; i < pkv_trace_count(t); i++)
        CHECK(q2[i].arrival_s == q[i].arrival_s && q2[i].prompt_tokens == q[i].prompt_tokens &&
                  q2[i].output_tokens == q[i].output_tokens && q2[i].n == q[i].n &&
                  q2[i].prefix_group == q[i].prefix_group &&
                  q2[i].prefix_tokens == q[i].prefix_tokens && q2[i].request_id == q[i].request_id,
              "not deterministic at request %zu", i);
    pkv_trace_destroy(t2);
    fuzz_check_round_trip(t);
    pkv_trace_destroy(t);
    return 0;
}

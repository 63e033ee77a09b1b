// SPDX-License-Identifier: MIT
// Shared by the libFuzzer harnesses: a check that aborts with a message (the
// fuzzer reports an abort as a crash and keeps the input), and the trace
// save-and-reload oracle.
#ifndef PKV_FUZZ_COMMON_H
#define PKV_FUZZ_COMMON_H

#include <float.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "pkv/trace.h"

#define CHECK(cond, ...)                                                                           \
    do {                                                                                           \
        if (!(cond)) {                                                                             \
            fprintf(stderr, "%s:%d: check failed: %s: ", __FILE__, __LINE__, #cond);               \
            fprintf(stderr, __VA_ARGS__);                                                          \
            fputc('\n', stderr);                                                                   \
            abort();                                                                               \
        }                                                                                          \
    } while (0)

// Every request obeys trace.h's invariants.
static inline void fuzz_check_trace_valid(const pkv_trace *t) {
    const pkv_trace_request *r = pkv_trace_requests(t);
    const size_t n = pkv_trace_count(t);
    CHECK(n >= 1 && r != NULL, "empty trace returned OK");
    for (size_t i = 0; i < n; i++) {
        CHECK(isfinite(r[i].arrival_s) && r[i].arrival_s >= 0, "request %zu arrival %g", i,
              r[i].arrival_s);
        CHECK(i == 0 || r[i].arrival_s >= r[i - 1].arrival_s, "request %zu unsorted", i);
        CHECK(r[i].prompt_tokens >= 1 && r[i].output_tokens >= 1 && r[i].n >= 1,
              "request %zu zero length", i);
        CHECK(r[i].prefix_group >= -1, "request %zu group %lld", i, (long long)r[i].prefix_group);
        CHECK(r[i].prefix_tokens <= r[i].prompt_tokens, "request %zu prefix > prompt", i);
        CHECK(r[i].prefix_group >= 0 || r[i].prefix_tokens == 0, "request %zu prefix without group", i);
    }
}

static inline char *fuzz_save(const pkv_trace *t, size_t *len) {
    char *buf = NULL;
    FILE *f = open_memstream(&buf, len);
    CHECK(f != NULL, "open_memstream");
    CHECK(pkv_trace_write_csv(t, f) == PKV_OK, "write_csv failed");
    CHECK(fclose(f) == 0, "fclose");
    return buf;
}

// The oracle: a valid trace, saved, loads back as the same requests (arrivals
// to the writer's microsecond resolution below 1e15 s, exactly above), and
// saving that gives the same bytes; pkv_trace_create accepts its requests.
static inline void fuzz_check_round_trip(const pkv_trace *t) {
    fuzz_check_trace_valid(t);
    size_t l1 = 0, l2 = 0;
    char *b1 = fuzz_save(t, &l1);
    pkv_trace *u = NULL;
    pkv_trace_error err;
    memset(&err, 0, sizeof err);
    pkv_status st = pkv_trace_parse(b1, l1, "saved.csv", NULL, &u, &err);
    CHECK(st == PKV_OK, "saved trace does not load: %llu %s: %s", (unsigned long long)err.line,
          err.field, err.message);
    CHECK(pkv_trace_get_format(u) == PKV_TRACE_NATIVE, "reloaded format");
    CHECK(pkv_trace_count(u) == pkv_trace_count(t), "count %zu vs %zu", pkv_trace_count(u),
          pkv_trace_count(t));
    const pkv_trace_request *x = pkv_trace_requests(t), *y = pkv_trace_requests(u);
    for (size_t i = 0; i < pkv_trace_count(t); i++) {
        if (x[i].arrival_s < 1e15)
            // %.6f rounds to the microsecond (0.5e-6), then reading the decimal
            // back rounds once more to the nearest double (half an ulp, about
            // DBL_EPSILON x value / 2): 135275849.2321555 comes back as ...23215601.
            CHECK(fabs(x[i].arrival_s - y[i].arrival_s) <=
                      0.5e-6 * (1 + 1e-9) + DBL_EPSILON * fabs(x[i].arrival_s),
                  "arrival %zu: %.17g -> %.17g", i, x[i].arrival_s, y[i].arrival_s);
        else
            CHECK(x[i].arrival_s == y[i].arrival_s, "arrival %zu: %.17g -> %.17g", i,
                  x[i].arrival_s, y[i].arrival_s);
        CHECK(x[i].prompt_tokens == y[i].prompt_tokens && x[i].output_tokens == y[i].output_tokens &&
                  x[i].n == y[i].n && x[i].prefix_group == y[i].prefix_group &&
                  x[i].prefix_tokens == y[i].prefix_tokens && x[i].request_id == y[i].request_id,
              "request %zu changed in the round trip", i);
    }
    char *b2 = fuzz_save(u, &l2);
    CHECK(l1 == l2 && memcmp(b1, b2, l1) == 0, "second save differs");
    pkv_trace *c = NULL;
    st = pkv_trace_create(x, pkv_trace_count(t), &c, &err);
    CHECK(st == PKV_OK, "pkv_trace_create refuses a loaded trace: %s: %s", err.field, err.message);
    pkv_trace_destroy(c);
    pkv_trace_destroy(u);
    free(b1);
    free(b2);
}

#endif // PKV_FUZZ_COMMON_H

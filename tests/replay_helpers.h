// SPDX-License-Identifier: MIT
// Helpers shared by the replay tests (test_replay*.c): a trace from an array of
// requests, and a step recorder for pkv_replay_params.on_step that keeps every
// step. Header-only: each test program includes it once, after Criterion.
#ifndef PKV_TESTS_REPLAY_HELPERS_H
#define PKV_TESTS_REPLAY_HELPERS_H

#include <stdlib.h>

#include "pkv/replay.h"
#include "pkv/trace.h"

// A validated trace of r[0..n-1]; the test fails if pkv_trace_create refuses it.
static inline pkv_trace *make_trace(const pkv_trace_request *r, size_t n) {
    pkv_trace *t = NULL;
    pkv_trace_error err;
    cr_assert_eq(pkv_trace_create(r, n, &t, &err), PKV_OK, "%s", err.message);
    return t;
}

// Every step of a run, in order (v[0..n-1]); free v with free().
typedef struct steps {
    pkv_replay_step *v;
    size_t n, cap;
} steps;

// on_step callback: user is a steps *, zero-initialized before the run.
static inline void record_steps(void *user, const pkv_replay_step *s) {
    steps *r = user;
    if (r->n == r->cap) {
        r->cap = r->cap ? r->cap * 2 : 256;
        r->v = realloc(r->v, r->cap * sizeof *r->v);
        cr_assert(r->v);
    }
    r->v[r->n++] = *s;
}

#endif // PKV_TESTS_REPLAY_HELPERS_H

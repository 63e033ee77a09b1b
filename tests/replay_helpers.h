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

// A model whose KV is 4 bytes per token (1 layer, 1 kv head, head_dim 1, fp16), so
// slots and bytes are easy to relate: `kv_slots` tokens of budget, block 4,
// max_seq_len 16, no watermark, every invariant checked, no allocation cost (tests
// that charge calls set their own model), and the arena device memory model for
// malloc-per-request and realloc-copy (token-exact placement: the cuda model's 2 MiB
// granule would be half a million of these tokens).
static inline pkv_replay_params tiny_replay_params(pkv_policy policy, uint64_t kv_slots) {
    pkv_replay_params p = pkv_replay_params_default();
    cr_assert_eq(pkv_model_preset("tiny", &p.model), PKV_OK);
    p.model.num_layers = 1;
    p.model.num_heads = 1;
    p.model.num_kv_heads = 1;
    p.model.head_dim = 1;
    p.policy = policy;
    p.kv_mem_bytes = kv_slots * 4;
    p.watermark = 0;
    p.max_seq_len = 16;
    p.block_size = 4;
    p.validate = 1;
    p.alloc_model = pkv_alloc_model_none();
    p.device_mem = PKV_DEVICE_MEM_ARENA;
    return p;
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

// SPDX-License-Identifier: MIT
// The run-mode step executor: executes each scheduled step with the decoder
// (include/pkv/model.h) over the paged policy's own pool and block tables, bound
// to memory by one pkv_cache on a host or CUDA backend, and measures the step's
// wall time. Token ids are synthetic (a hash of sequence and position): the
// replay measures memory and time, not text. Backend counters come from the
// real pkv_backend, so the one arena allocation is measured, not modelled.
#include <stdlib.h>
#include <string.h>

#include "pkv/backend.h"
#include "pkv/cache.h"
#include "pkv/model.h"
#include "pkv_config.h"
#include "replay_internal.h"
#include "src/allocator/clock.h"

#if PKV_HAVE_CUDA
#include <cuda_runtime_api.h>
#endif

typedef struct run_exec {
    pkvi_executor base;
    pkvi_policy *pol;   // borrowed
    pkv_seqset *set;    // borrowed from the policy
    pkv_model *model;
    pkv_backend *backend;
    pkv_cache *cache;
    int cuda;
    uint32_t vocab;
    uint64_t seed;
    pkv_seq_id *ids;    // [cap]
    uint32_t *counts;   // [cap]
    int32_t *tokens;    // [tok_cap]
    uint32_t cap;
    uint64_t tok_cap;
} run_exec;

static int32_t token_at(const run_exec *x, pkv_seq_id id, uint32_t pos) {
    uint64_t h = x->seed ^ ((uint64_t)(uint32_t)id * 0x9e3779b97f4a7c15ull) ^ ((uint64_t)pos << 20);
    h ^= h >> 33;
    h *= 0xff51afd7ed558ccdull;
    h ^= h >> 33;
    return (int32_t)(h % x->vocab);
}

static pkv_status reserve(run_exec *x, uint32_t n, uint64_t tokens) {
    if (n > x->cap) {
        uint32_t c = x->cap ? x->cap : 64;
        while (c < n) c *= 2;
        pkv_seq_id *a = realloc(x->ids, c * sizeof *a);
        if (!a) return PKV_ERR_OUT_OF_MEMORY;
        x->ids = a;
        uint32_t *b = realloc(x->counts, c * sizeof *b);
        if (!b) return PKV_ERR_OUT_OF_MEMORY;
        x->counts = b;
        x->cap = c;
    }
    if (tokens > x->tok_cap) {
        uint64_t c = x->tok_cap ? x->tok_cap : 4096;
        while (c < tokens) c *= 2;
        int32_t *t = realloc(x->tokens, (size_t)c * sizeof *t);
        if (!t) return PKV_ERR_OUT_OF_MEMORY;
        x->tokens = t;
        x->tok_cap = c;
    }
    return PKV_OK;
}

static pkv_status sync_device(const run_exec *x) {
#if PKV_HAVE_CUDA
    if (x->cuda && cudaDeviceSynchronize() != cudaSuccess) return PKV_ERR_BACKEND;
#else
    (void)x;
#endif
    return PKV_OK;
}

// Decode sequences come first in the batch (new_tokens == 1, pushed while
// growing), then prefills; b->num_decode_seqs says where prefills start.
static pkv_status run_step(pkvi_executor *e, const pkvi_step_batch *b, double *seconds,
                           pkvi_step_time *parts) {
    run_exec *x = (run_exec *)e;
    const uint32_t nd = b->num_decode_seqs, np = b->num_seqs - nd;
    uint64_t ptok = 0;
    for (uint32_t i = nd; i < b->num_seqs; i++) ptok += b->seqs[i].new_tokens;
    pkv_status st = reserve(x, b->num_seqs, ptok > nd ? ptok : nd);
    if (st != PKV_OK) return st;
    const double t0 = pkvi_now_seconds();
    const pkv_block_copy *copies;
    uint32_t nc = pkvi_policy_paged_take_copies(x->pol, &copies);
    if (nc && (st = pkv_cache_copy_blocks(x->cache, copies, nc)) != PKV_OK) return st;
    if (np) {
        uint64_t k = 0;
        for (uint32_t i = 0; i < np; i++) {
            const pkvi_step_seq *s = &b->seqs[nd + i];
            x->ids[i] = s->id;
            x->counts[i] = s->new_tokens;
            for (uint32_t j = 0; j < s->new_tokens; j++)
                x->tokens[k++] = token_at(x, s->id, s->ctx - s->new_tokens + j);
        }
        st = pkv_model_prefill_paged(x->model, x->cache, x->set, np, x->ids, x->counts, x->tokens,
                                     NULL, NULL);
        if (st != PKV_OK) return st;
    }
    if (nd) {
        for (uint32_t i = 0; i < nd; i++) {
            x->ids[i] = b->seqs[i].id;
            x->tokens[i] = token_at(x, b->seqs[i].id, b->seqs[i].ctx - 1);
        }
        st = pkv_model_decode_paged(x->model, x->cache, x->set, nd, x->ids, x->tokens, NULL, NULL);
        if (st != PKV_OK) return st;
    }
    if ((st = sync_device(x)) != PKV_OK) return st;
    *seconds = pkvi_now_seconds() - t0;
    memset(parts, 0, sizeof *parts); // measured: no model to split a mixed step by
    if (b->prefill_tokens)
        parts->prefill_s = *seconds;
    else
        parts->decode_s = *seconds;
    return PKV_OK;
}

static void run_destroy(pkvi_executor *e) {
    run_exec *x = (run_exec *)e;
    if (!x) return;
    pkv_cache_destroy(x->cache);
    pkv_model_destroy(x->model);
    pkv_backend_destroy(x->backend);
    free(x->ids);
    free(x->counts);
    free(x->tokens);
    free(x);
}

pkv_status pkvi_executor_run_create(const pkv_replay_params *p, pkvi_policy *pol,
                                    pkvi_executor **out) {
    if (!p || !pol || !out) return PKV_ERR_INVALID_ARG;
    pkv_seqset *set = pkvi_policy_paged_seqset(pol);
    if (!set) return PKV_ERR_UNSUPPORTED; // run mode drives the paged policy only
    run_exec *x = calloc(1, sizeof *x);
    if (!x) return PKV_ERR_OUT_OF_MEMORY;
    x->base.needs_seqs = 1;
    x->base.step = run_step;
    x->base.destroy = run_destroy;
    x->pol = pol;
    x->set = set;
    x->cuda = p->run_cuda;
    x->vocab = p->model.vocab_size;
    x->seed = p->seed;
    pkv_model_params mp = pkv_model_params_default();
    mp.device = p->run_cuda ? PKV_DEVICE_CUDA : PKV_DEVICE_CPU;
    mp.seed = p->seed;
    mp.num_threads = p->run_threads;
    pkv_status st = p->run_cuda ? pkv_backend_create_cuda(0, &x->backend)
                                : pkv_backend_create_host(&x->backend);
    if (st == PKV_OK) st = pkv_model_create(&p->model, &mp, &x->model);
    pkv_cache_params cp;
    if (st == PKV_OK) st = pkv_model_cache_params(x->model, pkv_seqset_block_size(set), &cp);
    // The counters cover the replay only: the model's weights are not KV memory.
    if (st == PKV_OK) pkv_backend_reset_stats(x->backend);
    if (st == PKV_OK) st = pkv_cache_create(&cp, pkv_seqset_pool(set), x->backend, &x->cache);
    if (st != PKV_OK) {
        run_destroy(&x->base);
        return st;
    }
    *out = &x->base;
    return PKV_OK;
}

pkv_status pkvi_executor_run_alloc_stats(pkvi_executor *e, pkv_replay_report *rep) {
    run_exec *x = (run_exec *)e;
    // Free the arena first so that its free call is counted and timed too.
    pkv_cache_destroy(x->cache);
    x->cache = NULL;
    pkv_backend_stats s;
    pkv_status st = pkv_backend_get_stats(x->backend, &s);
    if (st != PKV_OK) return st;
    rep->alloc.backend_alloc_calls = s.alloc_calls;
    rep->alloc.backend_free_calls = s.free_calls;
    rep->alloc.backend_alloc_seconds = s.alloc_seconds;
    rep->alloc.backend_free_seconds = s.free_seconds;
    rep->alloc.seconds_measured = 1;
    return PKV_OK;
}

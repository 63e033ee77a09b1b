// SPDX-License-Identifier: MIT
// The generation loop: one prefill for every prompt, forks for n > 1, then one
// decode step for all live outputs per iteration, on the KV mode chosen at run
// time. Invariant: every prompt is prefilled exactly once; after each step every
// live output's store holds K/V for all its tokens except the last sampled one,
// which the next step feeds.
#include <stdlib.h>
#include <string.h>

#include "pkv/backend.h"
#include "pkv/cache.h"
#include "pkv/generate.h"
#include "pkv/pool.h"
#include "pkv/seq.h"
#include "model_internal.h"
#include "src/allocator/clock.h"

const char *pkv_kv_mode_name(pkv_kv_mode mode) {
    switch (mode) {
    case PKV_KV_PAGED: return "paged";
    case PKV_KV_CONTIGUOUS: return "contiguous";
    case PKV_KV_NONE: return "none";
    }
    return "unknown";
}

pkv_gen_params pkv_gen_params_default(void) {
    pkv_gen_params p;
    memset(&p, 0, sizeof p);
    p.kv_mode = PKV_KV_PAGED;
    p.block_size = 16;
    p.num_blocks = 0;
    p.max_new_tokens = 16;
    p.eos_token = -1;
    p.n = 1;
    p.temperature = 0.0f;
    p.top_k = 0;
    p.seed = 1;
    p.kv_dtype = PKV_DTYPE_F32;
    return p;
}

// Everything one pkv_generate call owns; released by gen_free.
typedef struct gen {
    pkv_model *model;
    pkv_model_config cfg;
    const pkv_gen_params *p;
    uint32_t R, O;          // requests, outputs (R * n)
    pkv_sampler *sampler;
    uint64_t *rng;          // [O]
    uint32_t *active;       // [O] live output ids
    uint32_t num_active;
    int32_t *last;          // [O] each output's last sampled token
    uint32_t *gen_len;      // [O] tokens generated so far
    float *logits;          // [O][vocab]
    int32_t *step_tok;      // [O]
    uint32_t *step_idx;     // [O] per-batch store index (row or seq id)
    // paged
    pkv_backend *backend;
    pkv_pool *pool;
    pkv_seqset *set;
    pkv_cache *cache;
    pkv_seq_id *seq;        // [O]
    // contiguous
    pkv_contig_kv *ckv;
    // none: whole sequences, packed per step
    int32_t *full;          // [O][max_total]
    uint32_t max_total;
    int32_t *packed;        // [O * max_total]
} gen;

static void gen_free(gen *g) {
    pkv_sampler_destroy(g->sampler);
    pkv_cache_destroy(g->cache);
    pkv_seqset_destroy(g->set);
    pkv_pool_destroy(g->pool);
    pkv_backend_destroy(g->backend);
    pkv_contig_kv_destroy(g->ckv);
    free(g->rng);
    free(g->active);
    free(g->last);
    free(g->gen_len);
    free(g->logits);
    free(g->step_tok);
    free(g->step_idx);
    free(g->seq);
    free(g->full);
    free(g->packed);
}

#define TRY(expr)                                                                        \
    do {                                                                                 \
        pkv_status st_ = (expr);                                                         \
        if (st_ != PKV_OK) return st_;                                                   \
    } while (0)

static pkv_status check_args(const pkv_model_config *c, const pkv_gen_params *p, uint32_t R,
                             const pkv_gen_request *req, const pkv_gen_output *out) {
    if (R == 0 || !req || !out || p->n == 0 || p->max_new_tokens == 0) return PKV_ERR_INVALID_ARG;
    if ((unsigned)p->kv_mode > PKV_KV_NONE || pkv_dtype_size(p->kv_dtype) == 0)
        return PKV_ERR_INVALID_ARG;
    if (p->kv_mode == PKV_KV_PAGED && p->block_size == 0) return PKV_ERR_INVALID_ARG;
    if ((uint64_t)R * p->n > UINT32_MAX / 2) return PKV_ERR_INVALID_ARG;
    for (uint32_t r = 0; r < R; r++) {
        if (!req[r].prompt || req[r].prompt_len == 0) return PKV_ERR_INVALID_ARG;
        if (c->pos == PKV_POS_LEARNED &&
            (uint64_t)req[r].prompt_len + p->max_new_tokens > c->max_seq_len)
            return PKV_ERR_INVALID_ARG;
        for (uint32_t i = 0; i < req[r].prompt_len; i++)
            if (req[r].prompt[i] < 0 || (uint32_t)req[r].prompt[i] >= c->vocab_size)
                return PKV_ERR_INVALID_ARG;
    }
    for (uint64_t o = 0; o < (uint64_t)R * p->n; o++)
        if (!out[o].tokens) return PKV_ERR_INVALID_ARG;
    return PKV_OK;
}

// Record token `tok` (sampled from `lg`) for output o; drop o from the live set
// when it is done. Returns whether it stays live.
static int record(gen *g, pkv_gen_output *out, uint32_t o, int32_t tok, const float *lg) {
    const uint32_t V = g->cfg.vocab_size;
    pkv_gen_output *ob = &out[o];
    if (ob->logits)
        memcpy(ob->logits + (size_t)g->gen_len[o] * V, lg, (size_t)V * sizeof(float));
    ob->tokens[g->gen_len[o]++] = tok;
    ob->num_tokens = g->gen_len[o];
    g->last[o] = tok;
    if (g->p->eos_token >= 0 && tok == g->p->eos_token) {
        ob->hit_eos = 1;
        return 0;
    }
    return g->gen_len[o] < g->p->max_new_tokens;
}

static pkv_status setup_store(gen *g, const pkv_gen_request *req, uint32_t max_prompt) {
    const pkv_gen_params *p = g->p;
    const uint32_t O = g->O;
    if (p->kv_mode == PKV_KV_PAGED) {
        uint64_t blocks = p->num_blocks;
        if (blocks == 0)
            for (uint32_t r = 0; r < g->R; r++)
                blocks += (uint64_t)p->n *
                          ((req[r].prompt_len + p->max_new_tokens + p->block_size - 1) / p->block_size);
        if (blocks == 0 || blocks > PKV_POOL_MAX_BLOCKS) return PKV_ERR_INVALID_ARG;
        pkv_cache_params cp;
        TRY(pkv_model_cache_params(g->model, p->block_size, &cp));
        cp.dtype = p->kv_dtype;
        if (pkv_model_device(g->model) == PKV_DEVICE_CUDA)
            TRY(pkv_backend_create_cuda(g->model->params.cuda_device, &g->backend));
        else
            TRY(pkv_backend_create_host(&g->backend));
        TRY(pkv_pool_create((uint32_t)blocks, &g->pool));
        TRY(pkv_seqset_create(g->pool, p->block_size, &g->set));
        TRY(pkv_cache_create(&cp, g->pool, g->backend, &g->cache));
        g->seq = malloc((size_t)O * sizeof *g->seq);
        if (!g->seq) return PKV_ERR_OUT_OF_MEMORY;
    } else if (p->kv_mode == PKV_KV_CONTIGUOUS) {
        TRY(pkv_contig_kv_create(g->model, O, max_prompt + p->max_new_tokens, p->kv_dtype, &g->ckv));
    } else {
        g->max_total = max_prompt + p->max_new_tokens;
        g->full = malloc((size_t)O * g->max_total * sizeof *g->full);
        g->packed = malloc((size_t)O * g->max_total * sizeof *g->packed);
        if (!g->full || !g->packed) return PKV_ERR_OUT_OF_MEMORY;
    }
    return PKV_OK;
}

// Prefill every prompt once and take each output's first token.
static pkv_status prefill(gen *g, const pkv_gen_request *req, pkv_gen_output *out,
                          uint64_t *prompt_tokens) {
    const pkv_gen_params *p = g->p;
    const uint32_t R = g->R, n = p->n, V = g->cfg.vocab_size;
    uint64_t total = 0;
    for (uint32_t r = 0; r < R; r++) total += req[r].prompt_len;
    *prompt_tokens = total;
    int32_t *tokens = malloc((size_t)total * sizeof *tokens);
    uint32_t *counts = malloc((size_t)R * sizeof *counts);
    uint32_t *idx = malloc((size_t)R * sizeof *idx);
    pkv_seq_id *ids = malloc((size_t)R * sizeof *ids);
    pkv_status st = tokens && counts && idx && ids ? PKV_OK : PKV_ERR_OUT_OF_MEMORY;
    uint64_t t = 0;
    for (uint32_t r = 0; st == PKV_OK && r < R; r++) {
        memcpy(tokens + t, req[r].prompt, (size_t)req[r].prompt_len * sizeof *tokens);
        t += req[r].prompt_len;
        counts[r] = req[r].prompt_len;
        idx[r] = r * n; // the request's first output carries the prompt
        if (p->kv_mode == PKV_KV_PAGED) {
            st = pkv_seq_create(g->set, &ids[r]);
            if (st == PKV_OK) g->seq[r * n] = ids[r];
            if (st == PKV_OK) st = pkv_seq_append(g->set, ids[r], counts[r], NULL);
        } else if (p->kv_mode == PKV_KV_CONTIGUOUS) {
            st = pkv_contig_kv_append(g->ckv, idx[r], counts[r]);
        }
    }
    if (st == PKV_OK) {
        if (p->kv_mode == PKV_KV_PAGED)
            st = pkv_model_prefill_paged(g->model, g->cache, g->set, R, ids, counts, tokens,
                                         g->logits, NULL);
        else if (p->kv_mode == PKV_KV_CONTIGUOUS)
            st = pkv_model_prefill_contig(g->model, g->ckv, R, idx, counts, tokens, g->logits,
                                          NULL);
        else
            st = pkv_model_forward_nocache(g->model, R, counts, tokens, g->logits, NULL);
    }
    // Fork after the prefill: the children share (paged) or copy (contiguous)
    // the prompt's K/V, so nothing is computed twice.
    g->num_active = 0;
    for (uint32_t r = 0; st == PKV_OK && r < R; r++) {
        for (uint32_t s = 1; st == PKV_OK && s < n; s++) {
            uint32_t o = r * n + s;
            if (p->kv_mode == PKV_KV_PAGED)
                st = pkv_seq_fork(g->set, ids[r], &g->seq[o]);
            else if (p->kv_mode == PKV_KV_CONTIGUOUS)
                st = pkv_contig_kv_copy_row(g->ckv, r * n, o);
        }
        // Sample only after every fork: an output that stops at its first token
        // frees its sequence, which may be the one the others fork from.
        for (uint32_t s = 0; st == PKV_OK && s < n; s++) {
            uint32_t o = r * n + s;
            if (p->kv_mode == PKV_KV_NONE)
                memcpy(g->full + (size_t)o * g->max_total, req[r].prompt,
                       (size_t)req[r].prompt_len * sizeof(int32_t));
            int32_t tok = 0;
            const float *lg = g->logits + (size_t)r * V;
            st = pkv_sampler_sample(g->sampler, lg, &g->rng[o], &tok);
            if (st != PKV_OK) break;
            if (record(g, out, o, tok, lg)) g->active[g->num_active++] = o;
            else if (p->kv_mode == PKV_KV_PAGED) st = pkv_seq_free(g->set, g->seq[o]);
            else if (p->kv_mode == PKV_KV_CONTIGUOUS) st = pkv_contig_kv_reset(g->ckv, o);
        }
    }
    free(tokens);
    free(counts);
    free(idx);
    free(ids);
    return st;
}

static pkv_status decode_step(gen *g, const pkv_gen_request *req, pkv_gen_output *out,
                              uint64_t *cow) {
    const pkv_gen_params *p = g->p;
    const uint32_t A = g->num_active, V = g->cfg.vocab_size, n = p->n;
    for (uint32_t i = 0; i < A; i++) {
        uint32_t o = g->active[i];
        g->step_tok[i] = g->last[o];
        if (p->kv_mode == PKV_KV_PAGED) {
            TRY(pkv_seq_append(g->set, g->seq[o], 1, NULL));
        } else if (p->kv_mode == PKV_KV_CONTIGUOUS) {
            TRY(pkv_contig_kv_append(g->ckv, o, 1));
            g->step_idx[i] = o;
        }
    }
    if (p->kv_mode == PKV_KV_PAGED) {
        *cow += pkv_seqset_pending_copies(g->set);
        // The seq ids of this batch, packed (g->step_idx reused as int32 ids).
        pkv_seq_id *ids = (pkv_seq_id *)g->step_idx;
        for (uint32_t i = 0; i < A; i++) ids[i] = g->seq[g->active[i]];
        TRY(pkv_model_decode_paged(g->model, g->cache, g->set, A, ids, g->step_tok, g->logits,
                                   NULL));
    } else if (p->kv_mode == PKV_KV_CONTIGUOUS) {
        TRY(pkv_model_decode_contig(g->model, g->ckv, A, g->step_idx, g->step_tok, g->logits,
                                    NULL));
    } else {
        // No cache: every live sequence in full, prompt + everything generated.
        uint64_t t = 0;
        for (uint32_t i = 0; i < A; i++) {
            uint32_t o = g->active[i], plen = req[o / n].prompt_len;
            int32_t *f = g->full + (size_t)o * g->max_total;
            memcpy(f + plen, out[o].tokens, (size_t)g->gen_len[o] * sizeof(int32_t));
            g->step_idx[i] = plen + g->gen_len[o];
            memcpy(g->packed + t, f, (size_t)g->step_idx[i] * sizeof(int32_t));
            t += g->step_idx[i];
        }
        TRY(pkv_model_forward_nocache(g->model, A, g->step_idx, g->packed, g->logits, NULL));
    }
    uint32_t kept = 0;
    for (uint32_t i = 0; i < A; i++) {
        uint32_t o = g->active[i];
        const float *lg = g->logits + (size_t)i * V;
        int32_t tok = 0;
        TRY(pkv_sampler_sample(g->sampler, lg, &g->rng[o], &tok));
        if (record(g, out, o, tok, lg)) {
            g->active[kept++] = o;
        } else {
            if (p->kv_mode == PKV_KV_PAGED) TRY(pkv_seq_free(g->set, g->seq[o]));
            if (p->kv_mode == PKV_KV_CONTIGUOUS) TRY(pkv_contig_kv_reset(g->ckv, o));
        }
    }
    g->num_active = kept;
    return PKV_OK;
}

pkv_status pkv_generate(pkv_model *model, const pkv_gen_params *params, uint32_t R,
                        const pkv_gen_request *req, pkv_gen_output *out, pkv_gen_stats *stats) {
    if (!model || !params) return PKV_ERR_INVALID_ARG;
    gen g;
    memset(&g, 0, sizeof g);
    g.model = model;
    g.p = params;
    TRY(pkv_model_get_config(model, &g.cfg));
    TRY(check_args(&g.cfg, params, R, req, out));
    g.R = R;
    g.O = R * params->n;
    const uint32_t O = g.O;
    uint32_t max_prompt = 0;
    for (uint32_t r = 0; r < R; r++)
        if (req[r].prompt_len > max_prompt) max_prompt = req[r].prompt_len;
    for (uint32_t o = 0; o < O; o++) {
        out[o].num_tokens = 0;
        out[o].hit_eos = 0;
    }
    pkv_gen_stats st_local;
    memset(&st_local, 0, sizeof st_local);
    pkv_status st = pkv_sampler_create(g.cfg.vocab_size, params->temperature, params->top_k,
                                       &g.sampler);
    if (st == PKV_OK) {
        g.rng = malloc((size_t)O * sizeof *g.rng);
        g.active = malloc((size_t)O * sizeof *g.active);
        g.last = malloc((size_t)O * sizeof *g.last);
        g.gen_len = calloc(O, sizeof *g.gen_len);
        g.logits = malloc((size_t)O * g.cfg.vocab_size * sizeof *g.logits);
        g.step_tok = malloc((size_t)O * sizeof *g.step_tok);
        g.step_idx = malloc((size_t)O * sizeof *g.step_idx);
        if (!g.rng || !g.active || !g.last || !g.gen_len || !g.logits || !g.step_tok ||
            !g.step_idx)
            st = PKV_ERR_OUT_OF_MEMORY;
    }
    for (uint32_t o = 0; st == PKV_OK && o < O; o++) g.rng[o] = pkv_rng_init(params->seed, o);
    if (st == PKV_OK) st = setup_store(&g, req, max_prompt);
    double t0 = pkvi_now_seconds();
    if (st == PKV_OK) st = prefill(&g, req, out, &st_local.prompt_tokens);
    double t1 = pkvi_now_seconds();
    st_local.prefill_seconds = t1 - t0;
    while (st == PKV_OK && g.num_active > 0) {
        st = decode_step(&g, req, out, &st_local.cow_copies);
        st_local.decode_steps++;
    }
    st_local.decode_seconds = pkvi_now_seconds() - t1;
    for (uint32_t o = 0; o < O; o++) st_local.generated_tokens += out[o].num_tokens;
    if (g.pool) {
        pkv_pool_stats ps;
        if (pkv_pool_get_stats(g.pool, &ps) == PKV_OK) {
            pkv_cache_params cp;
            st_local.peak_blocks = ps.peak_used;
            if (pkv_cache_get_params(g.cache, &cp) == PKV_OK)
                st_local.kv_bytes_peak = (uint64_t)ps.peak_used * pkv_cache_bytes_per_block(&cp);
        }
    }
    if (g.ckv) st_local.kv_bytes_peak = pkv_contig_kv_bytes(g.ckv);
    if (stats) *stats = st_local;
    gen_free(&g);
    return st;
}

// SPDX-License-Identifier: MIT
// The decoder engine: model creation, scratch management and the one forward
// pass that every store (paged, contiguous, none) and every device runs. The
// forward pass prepares metadata on the host (positions, slots, block tables),
// uploads it once, and then calls only the device op table, so the CPU and CUDA
// backends share this code. Invariant: a forward call either fills every
// requested output or returns an error; it never leaves scratch smaller than
// the capacities it records.
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "model_internal.h"
#include "src/allocator/clock.h"

const char *pkv_device_name(pkv_device device) {
    switch (device) {
    case PKV_DEVICE_CPU: return "cpu";
    case PKV_DEVICE_CUDA: return "cuda";
    }
    return "unknown";
}

pkv_model_params pkv_model_params_default(void) {
    pkv_model_params p;
    memset(&p, 0, sizeof p);
    p.device = PKV_DEVICE_CPU;
    p.cuda_device = 0;
    p.seed = 1;
    p.num_threads = 0;
    p.profile = 0;
    return p;
}

uint64_t pkv_model_weight_bytes(const pkv_model_config *config) {
    if (pkv_model_config_validate(config) != PKV_OK) return 0;
    return pkvi_weights_count(config) * sizeof(float);
}

int32_t pkv_argmax(const float *logits, uint32_t n) {
    if (!logits || n == 0) return -1;
    uint32_t best = 0;
    for (uint32_t i = 1; i < n; i++)
        if (logits[i] > logits[best]) best = i;
    return (int32_t)best;
}

pkv_status pkvi_model_alloc(const pkv_model_config *c, const pkv_model_params *p,
                            pkv_model **out) {
    if (!c || !p || !out) return PKV_ERR_INVALID_ARG;
    *out = NULL;
    if (pkv_model_config_validate(c) != PKV_OK) return PKV_ERR_INVALID_ARG;
    // Layers with groups run on the CPU (hetero_cpu.c): full, sliding, chunked, sinks,
    // MLA, state layers (state_store.c).
    if (c->num_kv_groups && p->device != PKV_DEVICE_CPU) return PKV_ERR_UNSUPPORTED;
    if (!pkvi_hetero_supported(c)) return PKV_ERR_UNSUPPORTED;
    const pkvi_ops *ops = NULL;
    if (p->device == PKV_DEVICE_CPU) {
        ops = &pkvi_model_cpu_ops;
    } else if (p->device == PKV_DEVICE_CUDA) {
#if PKV_HAVE_CUDA
        ops = &pkvi_model_cuda_ops;
#else
        return PKV_ERR_UNSUPPORTED;
#endif
    } else {
        return PKV_ERR_INVALID_ARG;
    }
    uint64_t count = pkvi_weights_count(c);
    if (count > (uint64_t)SIZE_MAX / sizeof(float)) return PKV_ERR_OUT_OF_MEMORY;
    pkv_model *m = calloc(1, sizeof *m);
    if (!m) return PKV_ERR_OUT_OF_MEMORY;
    m->cfg = *c;
    m->params = *p;
    m->ops = ops;
    m->q_dim = c->num_heads * c->head_dim;
    m->kv_dim = c->num_kv_heads * c->head_dim;
    pkv_status st = ops->init(m);
    if (st != PKV_OK) {
        free(m);
        return st;
    }
    void *mem = NULL;
    st = ops->alloc(m, (size_t)count * sizeof(float), &mem);
    if (st != PKV_OK) {
        ops->fini(m);
        free(m);
        return st;
    }
    m->weights_mem = mem;
    pkvi_weights_carve(c, m->weights_mem, &m->w);
    *out = m;
    return PKV_OK;
}

pkv_status pkvi_model_set_weights(pkv_model *m, const float *host_block) {
    size_t bytes = (size_t)pkvi_weights_count(&m->cfg) * sizeof(float);
    return m->ops->upload(m, m->weights_mem, host_block, bytes);
}

pkv_status pkvi_model_get_weights(const pkv_model *m, float *host_block) {
    size_t bytes = (size_t)pkvi_weights_count(&m->cfg) * sizeof(float);
    return m->ops->download((pkv_model *)m, host_block, m->weights_mem, bytes);
}

pkv_status pkv_model_create(const pkv_model_config *config, const pkv_model_params *params,
                            pkv_model **out) {
    if (!out) return PKV_ERR_INVALID_ARG;
    *out = NULL;
    pkv_model *m = NULL;
    pkv_status st = pkvi_model_alloc(config, params, &m);
    if (st != PKV_OK) return st;
    if (params->device == PKV_DEVICE_CPU) {
        pkvi_weights_init_random(config, params->seed, m->weights_mem);
    } else {
        float *host = malloc((size_t)pkvi_weights_count(config) * sizeof(float));
        if (!host) {
            pkv_model_destroy(m);
            return PKV_ERR_OUT_OF_MEMORY;
        }
        pkvi_weights_init_random(config, params->seed, host);
        st = pkvi_model_set_weights(m, host);
        free(host);
        if (st != PKV_OK) {
            pkv_model_destroy(m);
            return st;
        }
    }
    *out = m;
    return PKV_OK;
}

static void scratch_free(pkv_model *m) {
    pkvi_scratch *s = &m->s;
    void *dev[] = {s->x, s->h, s->q, s->k, s->v, s->att, s->ff, s->ff2, s->xl, s->logits,
                   s->q16, s->k16, s->v16, s->att16, s->tok, s->pos, s->tseq, s->lens, s->indptr, s->last, s->row_off,
                   s->table, s->slots};
    for (size_t i = 0; i < sizeof dev / sizeof dev[0]; i++)
        if (dev[i] && m->params.device != PKV_DEVICE_CPU) m->ops->release(m, dev[i]);
    pkvi_meta *h = &m->meta;
    void *host[] = {h->tok, h->pos, h->tseq, h->lens, h->indptr, h->last, h->row_off, h->table,
                    h->slots, h->logits};
    for (size_t i = 0; i < sizeof host / sizeof host[0]; i++) free(host[i]);
    if (m->params.device == PKV_DEVICE_CPU) {
        void *act[] = {s->x,  s->h,      s->q,   s->k,   s->v,   s->att,  s->ff,
                       s->ff2, s->xl, s->logits, s->q16, s->k16, s->v16, s->att16};
        for (size_t i = 0; i < sizeof act / sizeof act[0]; i++) m->ops->release(m, act[i]);
    }
    memset(s, 0, sizeof *s);
    memset(h, 0, sizeof *h);
}

void pkv_model_destroy(pkv_model *m) {
    if (!m) return;
    pkv_contig_kv_destroy(m->nocache_kv);
    pkv_model_state_store_destroy(m->nocache_states);
    scratch_free(m);
    free(m->ones);
    free(m->kv_scales);
    if (m->weights_mem) m->ops->release(m, m->weights_mem);
    m->ops->fini(m);
    free(m);
}

pkv_status pkv_model_get_config(const pkv_model *m, pkv_model_config *config) {
    if (!m || !config) return PKV_ERR_INVALID_ARG;
    *config = m->cfg;
    return PKV_OK;
}

pkv_device pkv_model_device(const pkv_model *m) {
    return m ? m->params.device : PKV_DEVICE_CPU;
}

pkv_status pkv_model_cache_params(const pkv_model *m, uint32_t block_size,
                                  pkv_cache_params *p) {
    if (!m || !p || block_size == 0) return PKV_ERR_INVALID_ARG;
    *p = pkv_cache_params_default();
    p->num_layers = m->cfg.num_layers;
    p->kv_heads = m->cfg.num_kv_heads;
    p->head_dim = m->cfg.head_dim;
    p->block_size = block_size;
    p->dtype = PKV_DTYPE_F32;
    p->layout = PKV_LAYOUT_HND;
    return PKV_OK;
}

pkv_status pkv_model_get_profile(const pkv_model *m, pkv_model_profile *profile) {
    if (!m || !profile) return PKV_ERR_INVALID_ARG;
    *profile = m->prof;
    return PKV_OK;
}

void pkv_model_reset_profile(pkv_model *m) {
    if (m) memset(&m->prof, 0, sizeof m->prof);
}

// ---- scratch ----------------------------------------------------------------

static uint32_t grow(uint32_t need, uint32_t have) {
    uint32_t c = have ? have : 16;
    while (c < need) c = c > UINT32_MAX / 2 ? need : c * 2;
    return c;
}

// Make scratch hold T tokens, S sequences and `table` block-table entries.
// Buffers only grow, so steady-state decode never allocates.
static pkv_status scratch_reserve(pkv_model *m, uint32_t T, uint32_t S, uint32_t table) {
    pkvi_scratch *s = &m->s;
    if (T <= s->cap_tokens && S <= s->cap_seqs && table <= s->cap_table && s->x) return PKV_OK;
    uint32_t ct = grow(T, s->cap_tokens), cs = grow(S, s->cap_seqs),
             cb = grow(table, s->cap_table);
    scratch_free(m);
    const pkv_model_config *c = &m->cfg;
    const int cpu = m->params.device == PKV_DEVICE_CPU;
    pkv_status st = PKV_OK;
#define DEV(field, n, type)                                                              \
    do {                                                                                 \
        void *p_ = NULL;                                                                 \
        if (st == PKV_OK) st = m->ops->alloc(m, (size_t)(n) * sizeof(type), &p_);        \
        s->field = p_;                                                                   \
    } while (0)
#define HOST(field, n, type)                                                             \
    do {                                                                                 \
        m->meta.field = malloc((size_t)(n) * sizeof(type));                              \
        if (!m->meta.field && st == PKV_OK) st = PKV_ERR_OUT_OF_MEMORY;                  \
    } while (0)
    DEV(x, (size_t)ct * c->d_model, float);
    DEV(h, (size_t)ct * c->d_model, float);
    DEV(q, (size_t)ct * m->q_dim, float);
    DEV(k, (size_t)ct * m->kv_dim, float);
    DEV(v, (size_t)ct * m->kv_dim, float);
    DEV(att, (size_t)ct * m->q_dim, float);
    DEV(ff, (size_t)ct * c->d_ff, float);
    DEV(ff2, (size_t)ct * c->d_ff, float);
    DEV(xl, (size_t)cs * c->d_model, float);
    DEV(logits, (size_t)cs * c->vocab_size, float);
    DEV(q16, (size_t)ct * m->q_dim, uint16_t);
    DEV(k16, (size_t)ct * m->kv_dim, uint16_t);
    DEV(v16, (size_t)ct * m->kv_dim, uint16_t);
    DEV(att16, (size_t)ct * m->q_dim, uint16_t);
    HOST(tok, ct, int32_t);
    HOST(pos, ct, int32_t);
    HOST(tseq, ct, int32_t);
    HOST(slots, ct, int64_t);
    HOST(lens, cs, int32_t);
    HOST(indptr, cs + 1, int32_t);
    HOST(last, cs, int32_t);
    HOST(row_off, cs, int64_t);
    HOST(table, cb, int32_t);
    HOST(logits, (size_t)cs * c->vocab_size, float);
    if (cpu) {
        // The CPU ops read the host metadata directly: no copy, no second buffer.
        s->tok = m->meta.tok;
        s->pos = m->meta.pos;
        s->tseq = m->meta.tseq;
        s->slots = m->meta.slots;
        s->lens = m->meta.lens;
        s->indptr = m->meta.indptr;
        s->last = m->meta.last;
        s->row_off = m->meta.row_off;
        s->table = m->meta.table;
    } else {
        DEV(tok, ct, int32_t);
        DEV(pos, ct, int32_t);
        DEV(tseq, ct, int32_t);
        DEV(slots, ct, int64_t);
        DEV(lens, cs, int32_t);
        DEV(indptr, cs + 1, int32_t);
        DEV(last, cs, int32_t);
        DEV(row_off, cs, int64_t);
        DEV(table, cb, int32_t);
    }
#undef DEV
#undef HOST
    if (st != PKV_OK) {
        scratch_free(m);
        return st;
    }
    s->cap_tokens = ct;
    s->cap_seqs = cs;
    s->cap_table = cb;
    return PKV_OK;
}

static pkv_status upload_meta(pkv_model *m, uint32_t T, uint32_t S, uint32_t table) {
    if (m->params.device == PKV_DEVICE_CPU) return PKV_OK;
    pkvi_scratch *s = &m->s;
    pkvi_meta *h = &m->meta;
    pkv_status st = PKV_OK;
#define UP(field, n)                                                                     \
    if (st == PKV_OK && (n) > 0)                                                         \
        st = m->ops->upload(m, s->field, h->field, (size_t)(n) * sizeof *h->field);
    UP(tok, T);
    UP(pos, T);
    UP(tseq, T);
    UP(slots, T);
    UP(lens, S);
    UP(indptr, S + 1);
    UP(last, S);
    if (table == 0) UP(row_off, S); // contiguous stores only
    UP(table, table);
#undef UP
    return st;
}

// ---- forward ----------------------------------------------------------------

typedef struct timer {
    pkv_model *m;
    double t0;
} timer;

// Per-op timing: on a device with asynchronous ops the clock is only meaningful
// after a synchronization, which params.profile opts into.
static void tick(timer *t) {
    if (!t->m->params.profile) return;
    t->m->ops->sync(t->m);
    t->t0 = pkvi_now_seconds();
}

static void tock(timer *t, double *acc) {
    if (!t->m->params.profile) return;
    t->m->ops->sync(t->m);
    double t1 = pkvi_now_seconds();
    *acc += t1 - t->t0;
    t->t0 = t1;
}

#define TRY(expr)                                                                        \
    do {                                                                                 \
        pkv_status st_ = (expr);                                                         \
        if (st_ != PKV_OK) return st_;                                                   \
    } while (0)

// The math of one forward pass, after the metadata is in scratch.
static pkv_status run_layers(pkv_model *m, const pkvi_call *call, const pkvi_kv_target *kv,
                             float *logits_host) {
    const pkv_model_config *c = &m->cfg;
    const pkvi_ops *ops = m->ops;
    const pkvi_weights *w = &m->w;
    pkvi_scratch *s = &m->s;
    pkv_model_profile *pr = &m->prof;
    const uint32_t T = call->num_tokens, S = call->num_seqs, d = c->d_model;
    const uint32_t qd = m->q_dim, kvd = m->kv_dim, ff = c->d_ff;
    const uint32_t qkv_rows = qd + 2 * kvd;
    const int ln = c->norm == PKV_NORM_LAYERNORM;
    timer t = {m, 0.0};
    tick(&t);
    TRY(ops->embed(m, T, s->x));
    tock(&t, &pr->other);
    for (uint32_t l = 0; l < c->num_layers; l++) {
        const float *wqkv = w->wqkv + (size_t)l * qkv_rows * d;
        const float *bqkv = w->bqkv ? w->bqkv + (size_t)l * qkv_rows : NULL;
        TRY(ops->norm(m, T, s->x, w->ln1_w + (size_t)l * d, ln ? w->ln1_b + (size_t)l * d : NULL,
                      s->h));
        tock(&t, &pr->other);
        // Q, K and V are three GEMMs over row ranges of the fused weight, so that
        // each lands contiguous ([T][heads][hd]) as the attention calls expect.
        // An MLA layer projects its latent inside the attention op (hetero_cpu.c).
        const int mla = pkvi_layer_is_mla(c, l);
        // A state layer's q and k are not rotated: the decay orders its tokens.
        const int state = pkvi_layer_is_state(c, l);
        TRY(ops->linear(m, T, d, qd, s->h, wqkv, bqkv, s->q, 0));
        if (!mla) {
            TRY(ops->linear(m, T, d, kvd, s->h, wqkv + (size_t)qd * d, bqkv ? bqkv + qd : NULL,
                            s->k, 0));
            TRY(ops->linear(m, T, d, kvd, s->h, wqkv + (size_t)(qd + kvd) * d,
                            bqkv ? bqkv + qd + kvd : NULL, s->v, 0));
        }
        tock(&t, &pr->gemm_qkv);
        if (c->pos == PKV_POS_ROPE && !mla && !state) {
            TRY(ops->rope(m, T, s->q, s->k));
            tock(&t, &pr->other);
        }
        TRY(ops->attention(m, l, call, kv));
        tock(&t, &pr->attention);
        TRY(ops->linear(m, T, qd, d, s->att, w->wo + (size_t)l * d * qd,
                        w->bo ? w->bo + (size_t)l * d : NULL, s->x, 1));
        tock(&t, &pr->gemm_out);
        TRY(ops->norm(m, T, s->x, w->ln2_w + (size_t)l * d, ln ? w->ln2_b + (size_t)l * d : NULL,
                      s->h));
        tock(&t, &pr->other);
        if (c->ffn == PKV_FFN_GELU) {
            TRY(ops->linear(m, T, d, ff, s->h, w->w_up + (size_t)l * ff * d,
                            w->b_up ? w->b_up + (size_t)l * ff : NULL, s->ff, 0));
            tock(&t, &pr->gemm_ffn);
            TRY(ops->act(m, T, s->ff, NULL));
        } else {
            TRY(ops->linear(m, T, d, ff, s->h, w->w_gate + (size_t)l * ff * d, NULL, s->ff, 0));
            TRY(ops->linear(m, T, d, ff, s->h, w->w_up + (size_t)l * ff * d, NULL, s->ff2, 0));
            tock(&t, &pr->gemm_ffn);
            TRY(ops->act(m, T, s->ff, s->ff2));
        }
        tock(&t, &pr->other);
        TRY(ops->linear(m, T, ff, d, s->ff, w->w_down + (size_t)l * d * ff,
                        w->b_down ? w->b_down + (size_t)l * d : NULL, s->x, 1));
        tock(&t, &pr->gemm_ffn);
    }
    // Only each sequence's last token needs logits.
    TRY(ops->gather_last(m, S, s->x, s->xl));
    TRY(ops->norm(m, S, s->xl, w->lnf_w, ln ? w->lnf_b : NULL, s->h));
    TRY(ops->linear(m, S, d, c->vocab_size, s->h, w->lm_head, NULL, s->logits, 0));
    TRY(ops->download(m, logits_host, s->logits, (size_t)S * c->vocab_size * sizeof(float)));
    tock(&t, &pr->lm_head);
    return PKV_OK;
}

// Fill tok/tseq/indptr/last/pos for the packed tokens; lens[] must be set.
// Checks every token id and position.
static pkv_status fill_tokens(pkv_model *m, uint32_t S, const uint32_t *counts,
                              const int32_t *tokens, uint32_t *T_out) {
    pkvi_meta *h = &m->meta;
    uint32_t t = 0;
    h->indptr[0] = 0;
    for (uint32_t i = 0; i < S; i++) {
        uint32_t len = (uint32_t)h->lens[i], n = counts[i];
        for (uint32_t j = 0; j < n; j++, t++) {
            int32_t tok = tokens[t];
            if (tok < 0 || (uint32_t)tok >= m->cfg.vocab_size) return PKV_ERR_INVALID_ARG;
            h->tok[t] = tok;
            h->pos[t] = (int32_t)(len - n + j);
            h->tseq[t] = (int32_t)i;
        }
        h->indptr[i + 1] = (int32_t)t;
        h->last[i] = (int32_t)t - 1;
    }
    *T_out = t;
    return PKV_OK;
}

// Shared checks: counts[i] >= 1, count <= len, learned positions within range.
static pkv_status check_counts(const pkv_model *m, uint32_t S, const uint32_t *counts,
                               const uint32_t *lens, uint64_t *total) {
    uint64_t T = 0;
    for (uint32_t i = 0; i < S; i++) {
        if (counts[i] == 0 || counts[i] > lens[i]) return PKV_ERR_INVALID_ARG;
        if (m->cfg.pos == PKV_POS_LEARNED && lens[i] > m->cfg.max_seq_len)
            return PKV_ERR_INVALID_ARG;
        T += counts[i];
    }
    if (T > INT32_MAX) return PKV_ERR_INVALID_ARG;
    *total = T;
    return PKV_OK;
}

static pkv_status finish(pkv_model *m, uint32_t S, float *logits, int32_t *next_tokens,
                         const float *host_logits) {
    const uint32_t V = m->cfg.vocab_size;
    if (logits && logits != host_logits)
        memcpy(logits, host_logits, (size_t)S * V * sizeof(float));
    if (next_tokens)
        for (uint32_t i = 0; i < S; i++) next_tokens[i] = pkv_argmax(host_logits + (size_t)i * V, V);
    return PKV_OK;
}

// The per-layer fp8 tensor scales (0 = calibrate on the first pass), allocated
// on the first step into an 8-bit store of either kind.
static pkv_status kv_scales_ready(pkv_model *m) {
    if (m->kv_scales) return PKV_OK;
    m->kv_scales = calloc((size_t)2 * m->cfg.num_layers, sizeof(float));
    return m->kv_scales ? PKV_OK : PKV_ERR_OUT_OF_MEMORY;
}

pkv_status pkv_model_prefill_paged(pkv_model *m, pkv_cache *cache, pkv_seqset *set,
                                   uint32_t S, const pkv_seq_id *seqs, const uint32_t *counts,
                                   const int32_t *tokens, float *logits, int32_t *next_tokens) {
    if (!m || !cache || !set || S == 0 || !seqs || !counts || !tokens) return PKV_ERR_INVALID_ARG;
    double t0 = pkvi_now_seconds();
    pkv_cache_params cp;
    pkv_cache_geometry g;
    TRY(pkv_cache_get_params(cache, &cp));
    TRY(pkv_cache_get_geometry(cache, &g));
    if (cp.num_layers != m->cfg.num_layers || cp.kv_heads != m->cfg.num_kv_heads ||
        cp.head_dim != m->cfg.head_dim || pkv_dtype_size(cp.dtype) == 0 ||
        cp.block_size != pkv_seqset_block_size(set) ||
        pkv_cache_pool(cache) != pkv_seqset_pool(set))
        return PKV_ERR_INVALID_ARG;
    if (pkv_dtype_is_quantized(cp.dtype)) TRY(kv_scales_ready(m));
    pkv_backend_kind want =
        m->params.device == PKV_DEVICE_CPU ? PKV_BACKEND_HOST : PKV_BACKEND_CUDA;
    if (pkv_backend_get_kind(pkv_cache_backend(cache)) != want) return PKV_ERR_INVALID_ARG;
    // Copy-on-write copies queued by the caller's appends must land before any
    // K/V of this step is written into the fresh blocks.
    if (pkv_seqset_pending_copies(set) > 0) TRY(pkv_cache_apply_copies(cache, set, NULL));

    const uint32_t B = cp.block_size;
    uint32_t max_blocks = 1, max_len = 1;
    // Lengths first, into a small stack batch, so that scratch can be sized.
    uint64_t T = 0;
    for (uint32_t i = 0; i < S; i++) {
        uint32_t len = 0;
        TRY(pkv_seq_length(set, seqs[i], &len));
        if (counts[i] == 0 || counts[i] > len) return PKV_ERR_INVALID_ARG;
        if (m->cfg.pos == PKV_POS_LEARNED && len > m->cfg.max_seq_len) return PKV_ERR_INVALID_ARG;
        uint32_t nb = (len + B - 1) / B;
        if (nb > max_blocks) max_blocks = nb;
        if (len > max_len) max_len = len;
        T += counts[i];
    }
    if (T > INT32_MAX || (uint64_t)S * max_blocks > INT32_MAX) return PKV_ERR_INVALID_ARG;
    TRY(scratch_reserve(m, (uint32_t)T, S, S * max_blocks));
    pkvi_meta *h = &m->meta;
    TRY(pkv_seqset_export_padded(set, seqs, S, max_blocks, 0, h->table, h->lens));
    uint32_t nt = 0;
    TRY(fill_tokens(m, S, counts, tokens, &nt));
    for (uint32_t t = 0; t < nt; t++) {
        uint32_t p = (uint32_t)h->pos[t], i = (uint32_t)h->tseq[t];
        int64_t block = h->table[(size_t)i * max_blocks + p / B];
        h->slots[t] = block * B + p % B;
    }
    TRY(upload_meta(m, nt, S, S * max_blocks));
    pkvi_kv_target kv;
    memset(&kv, 0, sizeof kv);
    kv.kind = PKVI_KV_PAGED;
    kv.dtype = cp.dtype;
    kv.base = pkv_cache_data(cache);
    kv.layer_stride = g.layer_stride;
    kv.kv_stride = g.kv_stride;
    kv.block_stride = g.block_stride;
    kv.head_stride = g.head_stride;
    kv.token_stride = g.token_stride;
    kv.block_size = B;
    kv.num_blocks = pkv_pool_capacity(pkv_cache_pool(cache));
    kv.max_blocks = max_blocks;
    kv.max_len = max_len;
    kv.quant.kv_dtype = cp.dtype;
    kv.quant.scale_offset = g.scale_offset;
    kv.quant.scale_head_stride = g.scale_head_stride;
    kv.quant.scale_token_stride = g.scale_token_stride;
    pkvi_call call = {S, nt, nt == S, NULL, NULL, NULL, NULL};
    TRY(pkvi_states_bind(m, S, seqs, NULL, counts, &call));
    double t1 = pkvi_now_seconds();
    m->prof.bookkeeping += t1 - t0;
    float *host_logits = logits ? logits : h->logits;
    pkv_status st = run_layers(m, &call, &kv, host_logits);
    if (st == PKV_OK) pkvi_states_commit(m, &call);
    m->prof.total += pkvi_now_seconds() - t0;
    m->prof.forward_calls++;
    m->prof.tokens += nt;
    if (st != PKV_OK) return st;
    return finish(m, S, logits, next_tokens, host_logits);
}

// counts of 1 for a decode step, in a buffer of their own that only grows (it
// must not live in scratch, which a prefill call may reallocate).
static pkv_status ones_for(pkv_model *m, uint32_t S, uint32_t **out) {
    if (S > m->ones_cap) {
        uint32_t cap = grow(S, m->ones_cap);
        uint32_t *p = realloc(m->ones, (size_t)cap * sizeof *p);
        if (!p) return PKV_ERR_OUT_OF_MEMORY;
        for (uint32_t i = 0; i < cap; i++) p[i] = 1;
        m->ones = p;
        m->ones_cap = cap;
    }
    *out = m->ones;
    return PKV_OK;
}

pkv_status pkv_model_set_kv_scales(pkv_model *m, const float *scales) {
    if (!m || !scales) return PKV_ERR_INVALID_ARG;
    const uint32_t n = 2 * m->cfg.num_layers;
    for (uint32_t i = 0; i < n; i++)
        if (!(scales[i] >= 0.0f) || !isfinite(scales[i])) return PKV_ERR_INVALID_ARG;
    if (!m->kv_scales) {
        m->kv_scales = calloc(n, sizeof(float));
        if (!m->kv_scales) return PKV_ERR_OUT_OF_MEMORY;
    }
    memcpy(m->kv_scales, scales, (size_t)n * sizeof(float));
    return PKV_OK;
}

pkv_status pkv_model_get_kv_scales(const pkv_model *m, float *scales) {
    if (!m || !scales) return PKV_ERR_INVALID_ARG;
    const uint32_t n = 2 * m->cfg.num_layers;
    for (uint32_t i = 0; i < n; i++) scales[i] = m->kv_scales ? m->kv_scales[i] : 0.0f;
    return PKV_OK;
}

pkv_status pkv_model_decode_paged(pkv_model *m, pkv_cache *cache, pkv_seqset *set, uint32_t S,
                                  const pkv_seq_id *seqs, const int32_t *tokens, float *logits,
                                  int32_t *next_tokens) {
    if (!m || S == 0) return PKV_ERR_INVALID_ARG;
    uint32_t *ones = NULL;
    TRY(ones_for(m, S, &ones));
    return pkv_model_prefill_paged(m, cache, set, S, seqs, ones, tokens, logits, next_tokens);
}

pkv_status pkv_model_prefill_contig(pkv_model *m, pkv_contig_kv *kv, uint32_t S,
                                    const uint32_t *rows, const uint32_t *counts,
                                    const int32_t *tokens, float *logits, int32_t *next_tokens) {
    if (!m || !kv || kv->model != m || S == 0 || !rows || !counts || !tokens)
        return PKV_ERR_INVALID_ARG;
    double t0 = pkvi_now_seconds();
    uint64_t T = 0;
    uint32_t max_len = 0;
    for (uint32_t i = 0; i < S; i++) {
        if (rows[i] >= kv->max_rows) return PKV_ERR_INVALID_ARG;
        uint32_t len = kv->len[rows[i]];
        if (counts[i] == 0 || counts[i] > len) return PKV_ERR_INVALID_ARG;
        if (m->cfg.pos == PKV_POS_LEARNED && len > m->cfg.max_seq_len) return PKV_ERR_INVALID_ARG;
        T += counts[i];
        max_len = len > max_len ? len : max_len;
    }
    if (T > INT32_MAX) return PKV_ERR_INVALID_ARG;
    TRY(scratch_reserve(m, (uint32_t)T, S, 1));
    pkvi_meta *h = &m->meta;
    for (uint32_t i = 0; i < S; i++) {
        h->lens[i] = (int32_t)kv->len[rows[i]];
        h->row_off[i] = (int64_t)(kv->off[rows[i]] * kv->row_unit);
    }
    uint32_t nt = 0;
    TRY(fill_tokens(m, S, counts, tokens, &nt));
    const int quantized = pkv_dtype_is_quantized(kv->dtype);
    if (quantized) {
        TRY(kv_scales_ready(m));
        // The 8-bit writer's slot of each new token (contig_kv.c: row r starts at
        // token slot off[r] x row_unit / token_stride).
        const uint64_t slots_per_unit = kv->row_unit / kv->token_stride;
        for (uint32_t t = 0; t < nt; t++)
            h->slots[t] = (int64_t)(kv->off[rows[h->tseq[t]]] * slots_per_unit) + h->pos[t];
    }
    TRY(upload_meta(m, nt, S, 0));
    pkvi_kv_target t;
    memset(&t, 0, sizeof t);
    t.kind = PKVI_KV_CONTIG;
    t.dtype = kv->dtype;
    t.ck = kv->k;
    t.cv = kv->v;
    t.c_layer_stride = kv->layer_stride;
    t.c_head_stride = kv->head_stride;
    t.c_token_stride = kv->token_stride;
    t.max_len = max_len;
    t.quant = kv->quant;
    t.num_blocks = quantized ? (uint32_t)kv->arena : 0; // store_new keeps it 32-bit
    pkvi_call call = {S, nt, nt == S, NULL, NULL, NULL, NULL};
    TRY(pkvi_states_bind(m, S, NULL, rows, counts, &call));
    m->prof.bookkeeping += pkvi_now_seconds() - t0;
    float *host_logits = logits ? logits : h->logits;
    pkv_status st = run_layers(m, &call, &t, host_logits);
    if (st == PKV_OK) pkvi_states_commit(m, &call);
    m->prof.total += pkvi_now_seconds() - t0;
    m->prof.forward_calls++;
    m->prof.tokens += nt;
    if (st != PKV_OK) return st;
    return finish(m, S, logits, next_tokens, host_logits);
}

pkv_status pkv_model_decode_contig(pkv_model *m, pkv_contig_kv *kv, uint32_t S,
                                   const uint32_t *rows, const int32_t *tokens, float *logits,
                                   int32_t *next_tokens) {
    if (!m || S == 0 || !rows) return PKV_ERR_INVALID_ARG;
    uint32_t *ones = NULL;
    TRY(ones_for(m, S, &ones));
    return pkv_model_prefill_contig(m, kv, S, rows, ones, tokens, logits, next_tokens);
}

pkv_status pkv_model_forward_nocache(pkv_model *m, uint32_t S, const uint32_t *lens,
                                     const int32_t *tokens, float *logits,
                                     int32_t *next_tokens) {
    if (!m || S == 0 || !lens || !tokens) return PKV_ERR_INVALID_ARG;
    uint32_t max_len = 0;
    uint64_t total = 0;
    for (uint32_t i = 0; i < S; i++) {
        if (lens[i] == 0) return PKV_ERR_INVALID_ARG;
        if (lens[i] > max_len) max_len = lens[i];
        total += lens[i];
    }
    TRY(check_counts(m, S, lens, lens, &total));
    pkv_contig_kv *kv = m->nocache_kv;
    if (!kv || kv->max_rows < S || kv->max_len < max_len) {
        uint32_t rows = kv && kv->max_rows > S ? kv->max_rows : S;
        uint32_t len = kv && kv->max_len > max_len ? kv->max_len : max_len;
        pkv_contig_kv_destroy(kv);
        m->nocache_kv = NULL;
        TRY(pkv_contig_kv_create(m, rows, len, PKV_DTYPE_F32, &m->nocache_kv));
        kv = m->nocache_kv;
    }
    // Row indices 0..S-1; kept in a small heap array because meta may be resized.
    uint32_t *rows = malloc((size_t)S * sizeof *rows);
    if (!rows) return PKV_ERR_OUT_OF_MEMORY;
    for (uint32_t i = 0; i < S; i++) {
        rows[i] = i;
        kv->len[i] = lens[i];
    }
    // State layers recompute from zero in the model's own store, keyed by the rows.
    pkv_model_state_store *caller_states = NULL;
    pkv_status st = pkvi_states_nocache_begin(m, S, &caller_states);
    if (st == PKV_OK)
        st = pkv_model_prefill_contig(m, kv, S, rows, lens, tokens, logits, next_tokens);
    pkvi_states_nocache_end(m, S, caller_states);
    for (uint32_t i = 0; i < S; i++) kv->len[i] = 0;
    free(rows);
    return st;
}

// ---- shared with hybrid_store.c (model_internal.h) ----------------------------

pkv_status pkvi_scratch_reserve(pkv_model *m, uint32_t T, uint32_t S, uint32_t table) {
    return scratch_reserve(m, T, S, table);
}

pkv_status pkvi_fill_tokens(pkv_model *m, uint32_t S, const uint32_t *counts,
                            const int32_t *tokens, uint32_t *T_out) {
    return fill_tokens(m, S, counts, tokens, T_out);
}

pkv_status pkvi_ones_for(pkv_model *m, uint32_t S, uint32_t **out) { return ones_for(m, S, out); }

pkv_status pkvi_run_step(pkv_model *m, const pkvi_call *call, const pkvi_kv_target *kv,
                         double t0, float *logits, int32_t *next_tokens) {
    m->prof.bookkeeping += pkvi_now_seconds() - t0;
    float *host_logits = logits ? logits : m->meta.logits;
    pkv_status st = run_layers(m, call, kv, host_logits);
    if (st == PKV_OK) pkvi_states_commit(m, call);
    m->prof.total += pkvi_now_seconds() - t0;
    m->prof.forward_calls++;
    m->prof.tokens += call->num_tokens;
    if (st != PKV_OK) return st;
    return finish(m, call->num_seqs, logits, next_tokens, host_logits);
}

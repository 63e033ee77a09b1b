// SPDX-License-Identifier: MIT
// The replay's view of a model's KV cache groups (issue 23): each group's bytes
// per token at the replay's KV dtype, the tokens a group must keep for a request
// (the window rule, pkv_kv_group_tokens_kept, counting a forked request's shared
// prompt once), and what one decode step's attention reads per group. The engine
// uses it for the per-group memory breakdown and for "used" (the token states
// the model needs), the roofline for decode attention. Policy-independent: what
// a layout holds comes from the policy's stats; what the model needs, from here.
#include <math.h>
#include <string.h>

#include "replay_internal.h"

pkv_status pkvi_groups_init(pkvi_groups *G, const pkv_replay_params *p, uint64_t bytes_per_token) {
    memset(G, 0, sizeof *G);
    pkv_status st = pkv_model_kv_groups(&p->model, G->g, &G->n);
    if (st != PKV_OK) return st;
    G->hetero = p->model.num_kv_groups > 0;
    G->elem_bytes = pkv_dtype_is_quantized(p->kv_dtype) ? 1 : p->dtype_bytes;
    if (!G->hetero) {
        // A uniform model: one full group whose token is the replay's slot (int8's
        // scales included), so that every figure stays what it was before groups.
        G->bpt[0] = bytes_per_token;
        return PKV_OK;
    }
    for (uint32_t g = 0; g < G->n; g++) {
        G->bpt[g] = pkv_kv_group_bytes_per_token(&G->g[g], G->elem_bytes);
        G->state_bytes[g] = pkv_kv_group_state_bytes(&G->g[g]);
    }
    return PKV_OK;
}

uint64_t pkvi_groups_kept(const pkvi_groups *G, uint32_t g, uint32_t nseq, uint32_t len,
                          uint32_t prompt, int shared) {
    if (nseq == 0) return 0;
    const uint64_t k = pkv_kv_group_tokens_kept(&G->g[g], len);
    if (nseq == 1 || !shared) return (uint64_t)nseq * k;
    // Forked samples share the prompt: the kept tokens [len - k, len) that lie in
    // the prompt are stored once, the rest once per sample.
    const uint64_t first = (uint64_t)len - k;
    const uint64_t in_prompt = prompt > first ? prompt - first : 0;
    return in_prompt + (uint64_t)nseq * (k - in_prompt);
}

uint64_t pkvi_groups_needed_bytes(const pkvi_groups *G, uint32_t nseq, uint32_t len,
                                  uint32_t prompt, int shared, uint64_t *per_group) {
    uint64_t total = 0;
    for (uint32_t g = 0; g < G->n; g++) {
        const uint64_t b = G->g[g].kind == PKV_LAYER_STATE
                               ? (uint64_t)nseq * G->state_bytes[g]
                               : pkvi_groups_kept(G, g, nseq, len, prompt, shared) * G->bpt[g];
        if (per_group) per_group[g] += b;
        total += b;
    }
    return total;
}

uint64_t pkvi_groups_chunk_bytes(const pkvi_groups *G, uint32_t nseq, uint32_t len,
                                 uint32_t prompt, int shared, uint32_t first, uint32_t end,
                                 uint64_t *per_group) {
    uint64_t total = 0;
    for (uint32_t g = 0; g < G->n; g++) {
        uint64_t b;
        if (G->g[g].kind == PKV_LAYER_STATE) {
            b = (uint64_t)nseq * G->state_bytes[g];
        } else {
            // The chunk's first query (at `first`) sees the most of the past: the
            // tokens_kept(first + 1) keys up to itself, then every position up to end.
            const uint64_t seen = end > first ? (uint64_t)(end - first) - 1 +
                                                    pkv_kv_group_tokens_kept(&G->g[g], (uint64_t)first + 1)
                                              : 0;
            // Done: the next query (and forked samples) may need more than the chunk saw.
            const uint64_t next = end == len ? pkvi_groups_kept(G, g, nseq, len, prompt, shared) : 0;
            b = (seen > next ? seen : next) * G->bpt[g];
        }
        if (per_group) per_group[g] += b;
        total += b;
    }
    return total;
}

void pkvi_groups_decode_read(const pkvi_groups *G, uint32_t ctx, double *bytes,
                             double *layer_keys) {
    // As the uniform roofline counts a decode (ctx context tokens read, one new
    // token written), per group: a sliding layer reads only its window, a chunked
    // one its chunk (pkv_kv_group_tokens_kept of ctx), full and MLA layers every
    // token; a state layer reads and writes its state.
    for (uint32_t g = 0; g < G->n; g++) {
        const pkv_kv_group *k = &G->g[g];
        if (k->kind == PKV_LAYER_STATE) {
            *bytes += 2.0 * (double)G->state_bytes[g];
            continue;
        }
        const double keys = (double)pkv_kv_group_tokens_kept(k, ctx);
        *bytes += (keys + 1) * (double)G->bpt[g];
        *layer_keys += keys * (double)k->num_layers;
    }
}

// Keys the queries at positions 0 .. x - 1 see together in group k (each query its
// tokens_kept(q + 1), itself included), in closed form: a full or MLA layer q + 1, a
// sliding one min(q + 1, W), a chunked one (q mod C) + 1.
static double keys_before(const pkv_kv_group *k, double x) {
    const double w = (double)k->window;
    switch (k->kind) {
    case PKV_LAYER_SLIDING:
        return x <= w ? x * (x + 1) / 2 : w * (w + 1) / 2 + (x - w) * w;
    case PKV_LAYER_CHUNKED: {
        const double whole = floor(x / w), r = x - whole * w;
        return whole * w * (w + 1) / 2 + r * (r + 1) / 2;
    }
    default:
        return x * (x + 1) / 2;
    }
}

void pkvi_groups_prefill_read(const pkvi_groups *G, uint32_t first, uint32_t n, double *bytes,
                              double *layer_keys) {
    if (n == 0) return;
    for (uint32_t g = 0; g < G->n; g++) {
        const pkv_kv_group *k = &G->g[g];
        if (k->kind == PKV_LAYER_STATE) { // the state read and written once per chunk
            *bytes += 2.0 * (double)G->state_bytes[g];
            continue;
        }
        // Read: from the first query's first key to the last query (n - 1 past the
        // first query's kept keys); written: the n new tokens.
        const double seen = (double)(n - 1) + (double)pkv_kv_group_tokens_kept(k, (uint64_t)first + 1);
        *bytes += (seen + (double)n) * (double)G->bpt[g];
        *layer_keys += (keys_before(k, (double)first + n) - keys_before(k, (double)first)) *
                       (double)k->num_layers;
    }
}

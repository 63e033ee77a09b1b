// SPDX-License-Identifier: MIT
// What a model shape implies: its consistency check, parameter counts, and the KV
// bytes per token and per sequence, group by group for heterogeneous models (issue 23:
// sliding-window and chunked layers keep only their window, MLA one latent per token,
// state layers a fixed state per sequence). Plain arithmetic on pkv_model_config;
// every product is checked, so a shape too large for 64 bits is refused (validate) or
// yields 0, never a wrapped number.
#include <string.h>

#include "pkv/model_config.h"

// a * b, or 0 with *overflow set when it does not fit in 64 bits.
static uint64_t mul_checked(uint64_t a, uint64_t b, int *overflow) {
    if (a != 0 && b > UINT64_MAX / a) {
        *overflow = 1;
        return 0;
    }
    return a * b;
}

static uint64_t add_checked(uint64_t a, uint64_t b, int *overflow) {
    if (b > UINT64_MAX - a) {
        *overflow = 1;
        return 0;
    }
    return a + b;
}

const char *pkv_layer_kind_name(pkv_layer_kind kind) {
    switch (kind) {
    case PKV_LAYER_FULL: return "full";
    case PKV_LAYER_SLIDING: return "sliding";
    case PKV_LAYER_CHUNKED: return "chunked";
    case PKV_LAYER_MLA: return "mla";
    case PKV_LAYER_STATE: return "state";
    }
    return "unknown";
}

static int is_attention_kind(pkv_layer_kind k) {
    return k == PKV_LAYER_FULL || k == PKV_LAYER_SLIDING || k == PKV_LAYER_CHUNKED;
}

// A group's fields fit its kind: the kind's own sizes non-zero, every other kind's zero.
static int group_shape_ok(const pkv_kv_group *g) {
    if ((unsigned)g->kind > PKV_LAYER_STATE || g->num_layers == 0 || g->sinks > 1) return 0;
    const int attn = is_attention_kind(g->kind), windowed = g->kind == PKV_LAYER_SLIDING ||
                                                          g->kind == PKV_LAYER_CHUNKED;
    if (attn != (g->num_kv_heads != 0) || attn != (g->head_dim != 0)) return 0;
    if (windowed != (g->window != 0)) return 0;
    if (g->kind == PKV_LAYER_MLA ? g->latent_dim == 0 : (g->latent_dim | g->rope_dim) != 0)
        return 0;
    if ((g->kind == PKV_LAYER_STATE) != (g->state_bytes != 0)) return 0;
    if (g->sinks && !attn) return 0; // a sink is a softmax term: attention layers only
    return 1;
}

// Bytes per token of a group (elem_bytes per value), 0 on overflow (*overflow set).
static uint64_t group_token_bytes(const pkv_kv_group *g, uint64_t elem_bytes, int *overflow) {
    uint64_t per_layer = 0;
    if (is_attention_kind(g->kind))
        per_layer = mul_checked(2ull * g->num_kv_heads, g->head_dim, overflow);
    else if (g->kind == PKV_LAYER_MLA)
        per_layer = (uint64_t)g->latent_dim + g->rope_dim;
    return mul_checked(mul_checked(per_layer, g->num_layers, overflow), elem_bytes, overflow);
}

static uint64_t group_state_bytes(const pkv_kv_group *g, int *overflow) {
    return g->kind == PKV_LAYER_STATE ? mul_checked(g->state_bytes, g->num_layers, overflow) : 0;
}

// The groups: every layer in range and counted, the counts equal to the groups' layers,
// the sums of bytes per token (at 8 bytes a value, the largest dtype) and of state in
// 64 bits.
static int groups_ok(const pkv_model_config *c) {
    if (c->num_kv_groups == 0) return 1;
    if (c->num_kv_groups > PKV_MAX_KV_GROUPS || c->num_layers > PKV_MAX_LAYERS) return 0;
    uint32_t count[PKV_MAX_KV_GROUPS] = {0};
    for (uint32_t l = 0; l < c->num_layers; l++) {
        if (c->layer_group[l] >= c->num_kv_groups) return 0;
        count[c->layer_group[l]]++;
    }
    int overflow = 0;
    uint64_t token = 0, state = 0;
    for (uint32_t i = 0; i < c->num_kv_groups; i++) {
        const pkv_kv_group *g = &c->kv_groups[i];
        if (!group_shape_ok(g) || count[i] != g->num_layers) return 0;
        token = add_checked(token, group_token_bytes(g, 8, &overflow), &overflow);
        state = add_checked(state, group_state_bytes(g, &overflow), &overflow);
    }
    return !overflow;
}

pkv_status pkv_model_config_validate(const pkv_model_config *c) {
    if (!c) return PKV_ERR_INVALID_ARG;
    if (c->num_layers == 0 || c->d_model == 0 || c->num_heads == 0 || c->num_kv_heads == 0 ||
        c->head_dim == 0 || c->d_ff == 0 || c->vocab_size == 0 || c->max_seq_len == 0)
        return PKV_ERR_INVALID_ARG;
    if (c->num_heads % c->num_kv_heads != 0) return PKV_ERR_INVALID_ARG;
    if (c->pos == PKV_POS_ROPE && c->head_dim % 2 != 0) return PKV_ERR_INVALID_ARG;
    if ((unsigned)c->norm > PKV_NORM_RMSNORM || (unsigned)c->ffn > PKV_FFN_SWIGLU ||
        (unsigned)c->pos > PKV_POS_ROPE)
        return PKV_ERR_INVALID_ARG;
    if (!groups_ok(c)) return PKV_ERR_INVALID_ARG;
    // Published counts: active <= total, and active only beside a total.
    if (c->active_params && (c->total_params == 0 || c->active_params > c->total_params))
        return PKV_ERR_INVALID_ARG;
    return PKV_OK;
}

uint64_t pkv_model_param_count(const pkv_model_config *c) {
    if (pkv_model_config_validate(c) != PKV_OK) return 0;
    if (c->total_params) return c->total_params;
    const uint64_t d = c->d_model, q = (uint64_t)c->num_heads * c->head_dim,
                   kv = (uint64_t)c->num_kv_heads * c->head_dim, ff = c->d_ff;
    const uint64_t bias = c->use_bias ? 1 : 0;
    // Attention: Q, K, V projections and the output projection.
    uint64_t attn = d * q + 2 * d * kv + q * d + bias * (q + 2 * kv + d);
    // FFN: GELU has up and down; SwiGLU has gate, up and down.
    uint64_t ffn = c->ffn == PKV_FFN_SWIGLU ? 3 * d * ff : 2 * d * ff + bias * (ff + d);
    // Norms: LayerNorm has scale and shift, RMSNorm only a scale; two per layer.
    uint64_t norm = (c->norm == PKV_NORM_LAYERNORM ? 2 : 1) * d;
    uint64_t layers = (uint64_t)c->num_layers * (attn + ffn + 2 * norm);
    uint64_t embed = (uint64_t)c->vocab_size * d;
    uint64_t pos = c->pos == PKV_POS_LEARNED ? (uint64_t)c->max_seq_len * d : 0;
    uint64_t head = c->tied_embeddings ? 0 : (uint64_t)c->vocab_size * d;
    return embed + pos + layers + norm + head;
}

uint64_t pkv_model_active_param_count(const pkv_model_config *c) {
    if (pkv_model_config_validate(c) != PKV_OK) return 0;
    return c->active_params ? c->active_params : pkv_model_param_count(c);
}

pkv_status pkv_model_kv_groups(const pkv_model_config *c, pkv_kv_group *groups,
                               uint32_t *num_groups) {
    if (!groups || !num_groups || pkv_model_config_validate(c) != PKV_OK)
        return PKV_ERR_INVALID_ARG;
    if (c->num_kv_groups) {
        memcpy(groups, c->kv_groups, c->num_kv_groups * sizeof *groups);
        *num_groups = c->num_kv_groups;
        return PKV_OK;
    }
    memset(groups, 0, sizeof *groups);
    groups[0].kind = PKV_LAYER_FULL;
    groups[0].num_layers = c->num_layers;
    groups[0].num_kv_heads = c->num_kv_heads;
    groups[0].head_dim = c->head_dim;
    *num_groups = 1;
    return PKV_OK;
}

uint64_t pkv_kv_group_bytes_per_token(const pkv_kv_group *g, size_t elem_bytes) {
    if (!g || !group_shape_ok(g)) return 0;
    int overflow = 0;
    const uint64_t b = group_token_bytes(g, (uint64_t)elem_bytes, &overflow);
    return overflow ? 0 : b;
}

uint64_t pkv_kv_group_state_bytes(const pkv_kv_group *g) {
    if (!g || !group_shape_ok(g)) return 0;
    int overflow = 0;
    const uint64_t b = group_state_bytes(g, &overflow);
    return overflow ? 0 : b;
}

uint64_t pkv_kv_group_tokens_kept(const pkv_kv_group *g, uint64_t len) {
    if (!g || !group_shape_ok(g)) return 0;
    switch (g->kind) {
    case PKV_LAYER_SLIDING: return len < g->window ? len : g->window;
    case PKV_LAYER_CHUNKED: return len == 0 ? 0 : (len - 1) % g->window + 1;
    case PKV_LAYER_STATE: return 0;
    default: return len; // FULL, MLA
    }
}

uint64_t pkv_model_kv_bytes_for_len(const pkv_model_config *c, size_t elem_bytes, uint64_t len,
                                    int window_aware) {
    pkv_kv_group groups[PKV_MAX_KV_GROUPS];
    uint32_t n = 0;
    if (pkv_model_kv_groups(c, groups, &n) != PKV_OK) return 0;
    int overflow = 0;
    uint64_t total = 0;
    for (uint32_t i = 0; i < n; i++) {
        const uint64_t tokens = window_aware ? pkv_kv_group_tokens_kept(&groups[i], len) : len;
        const uint64_t kv = mul_checked(group_token_bytes(&groups[i], elem_bytes, &overflow),
                                        tokens, &overflow);
        total = add_checked(total, kv, &overflow);
        total = add_checked(total, group_state_bytes(&groups[i], &overflow), &overflow);
    }
    return overflow ? 0 : total;
}

uint64_t pkv_model_kv_bytes_per_token(const pkv_model_config *c, size_t elem_bytes) {
    if (pkv_model_config_validate(c) != PKV_OK) return 0;
    if (c->num_kv_groups == 0)
        return 2ull * c->num_layers * c->num_kv_heads * c->head_dim * (uint64_t)elem_bytes;
    int overflow = 0;
    uint64_t total = 0;
    for (uint32_t i = 0; i < c->num_kv_groups; i++)
        total = add_checked(total, group_token_bytes(&c->kv_groups[i], elem_bytes, &overflow),
                            &overflow);
    return overflow ? 0 : total;
}

// SPDX-License-Identifier: MIT
// Decoder model shapes: the named presets (real published shapes) and the sizes
// that follow from them. Used by the runtime to build a model, by the KV-size
// calculator, and by the replay simulator's cost model. Plain data, no state.
#ifndef PKV_MODEL_CONFIG_H
#define PKV_MODEL_CONFIG_H

#include <stddef.h>
#include <stdint.h>

#include "pkv/status.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef enum pkv_norm_kind { PKV_NORM_LAYERNORM = 0, PKV_NORM_RMSNORM = 1 } pkv_norm_kind;
typedef enum pkv_ffn_kind { PKV_FFN_GELU = 0, PKV_FFN_SWIGLU = 1 } pkv_ffn_kind;
typedef enum pkv_pos_kind { PKV_POS_LEARNED = 0, PKV_POS_ROPE = 1 } pkv_pos_kind;

// Heterogeneous models (0.3.0, issue 23). Layers differ in what they keep per token:
// a KV cache group is a set of layers of one kind and one shape; the allocator keeps
// one block table per group and applies the group's rule (which tokens stay).
#define PKV_MAX_KV_GROUPS 8
#define PKV_MAX_LAYERS 128 // layer_group's length: configs with groups have <= this many layers

typedef enum pkv_layer_kind {
    PKV_LAYER_FULL = 0,    // causal attention over every past token: keeps every token
    PKV_LAYER_SLIDING = 1, // sliding window: a query at position p sees positions
                           // p - window + 1 .. p (itself included): keeps the last window
    PKV_LAYER_CHUNKED = 2, // chunked local attention (Llama 4): a query at position p sees
                           // the positions of its own chunk, floor(p / window) * window .. p
    PKV_LAYER_MLA = 3,     // multi-head latent attention (DeepSeek-V2/V3): one vector of
                           // latent_dim + rope_dim values per token (no separate K and V)
    PKV_LAYER_STATE = 4,   // linear attention / state-space layer (Mamba, Gated DeltaNet):
                           // a fixed state of state_bytes per sequence, nothing per token
} pkv_layer_kind;

// One KV cache group. Plain data.
typedef struct pkv_kv_group {
    pkv_layer_kind kind;
    uint32_t num_layers;   // layers of the model in this group (> 0)
    uint32_t num_kv_heads; // FULL / SLIDING / CHUNKED: K/V heads per layer; else 0
    uint32_t head_dim;     // FULL / SLIDING / CHUNKED: K and V head dimension; else 0
    uint32_t window;       // SLIDING: window in tokens; CHUNKED: chunk in tokens; else 0
    uint32_t latent_dim;   // MLA: compressed KV dimension (kv_lora_rank); else 0
    uint32_t rope_dim;     // MLA: decoupled RoPE key dimension (qk_rope_head_dim); else 0
    uint32_t sinks;        // 1: a learned attention-sink logit per query head joins the
                           // softmax (gpt-oss); stores nothing per token
    uint64_t state_bytes;  // STATE: bytes of one layer's state per sequence; else 0
} pkv_kv_group;

const char *pkv_layer_kind_name(pkv_layer_kind kind); // "full", "sliding", "chunked", "mla", "state"

typedef struct pkv_model_config {
    char name[32];          // preset name, or "custom"
    uint32_t num_layers;
    uint32_t d_model;       // hidden size
    uint32_t num_heads;     // query heads
    uint32_t num_kv_heads;  // K/V heads (== num_heads for MHA; divides it)
    uint32_t head_dim;      // usually d_model / num_heads
    uint32_t d_ff;          // FFN inner size
    uint32_t vocab_size;
    uint32_t max_seq_len;   // context window (learned positions need this many rows)
    pkv_norm_kind norm;
    pkv_ffn_kind ffn;
    pkv_pos_kind pos;
    int tied_embeddings;    // 1: the LM head reuses the token embedding
    int use_bias;           // 1: linear layers have biases (GPT-2 style)
    float norm_eps;
    float rope_theta;       // RoPE base (10000 for Llama 2, 500000 for Llama 3)
    // Heterogeneous layers (0.3.0). num_kv_groups == 0: every layer is full attention
    // with num_kv_heads x head_dim (every model before 0.3.0). Else layer l belongs to
    // kv_groups[layer_group[l]], each group has >= 1 layer and their layers add up to
    // num_layers; num_kv_heads / head_dim above stay the attention layers' query-side
    // shape (num_heads x head_dim) for the weights and the roofline.
    uint32_t num_kv_groups;
    pkv_kv_group kv_groups[PKV_MAX_KV_GROUPS];
    uint8_t layer_group[PKV_MAX_LAYERS];
    // Published parameter counts, for models whose shape above does not give them
    // (mixture of experts, MLA projections, state layers): total_params is what the
    // weights occupy, active_params what one token reads (MoE: the routed experts).
    // 0: computed from the shape (pkv_model_param_count), active = total.
    uint64_t total_params;
    uint64_t active_params;
} pkv_model_config;

// Fill *config with the preset `name`: "tiny" (the default test model), "gpt2-small",
// "llama2-7b", "llama2-13b", "llama2-70b", "llama3-8b", "gpt3-175b", and (0.3.0) the
// heterogeneous and current presets, each from its published config.json (sources in
// src/runtime/model/config.c and docs/DESIGN.md): "llama-3.1-8b", "llama-3.1-70b",
// "gpt-oss-20b", "gpt-oss-120b", "gemma-3-27b", "llama-4-scout", "deepseek-v3",
// "qwen3-next-80b", "jamba-1.5-mini", and the runtime's "tiny-swa", "tiny-mla",
// "tiny-hybrid".
// PKV_ERR_NOT_FOUND for an unknown name.
pkv_status pkv_model_preset(const char *name, pkv_model_config *config);

// The preset names, NULL-terminated (static storage).
const char *const *pkv_model_preset_names(void);

// Check a config for consistency (non-zero sizes, kv heads divide heads, ...).
// PKV_ERR_INVALID_ARG if not.
pkv_status pkv_model_config_validate(const pkv_model_config *config);

// Number of weights (parameters) of the model, embeddings and LM head included.
uint64_t pkv_model_param_count(const pkv_model_config *config);

// KV-cache bytes per token: 2 x num_layers x num_kv_heads x head_dim x elem_bytes for a
// uniform model; for one with groups, the sum of every group's bytes per token
// (pkv_kv_group_bytes_per_token), i.e. what a token costs when every layer keeps it.
uint64_t pkv_model_kv_bytes_per_token(const pkv_model_config *config, size_t elem_bytes);

// Parameters one token reads (active_params, or the total for a dense model).
uint64_t pkv_model_active_param_count(const pkv_model_config *config);

// The model's KV cache groups: a copy of config->kv_groups, or for a uniform config
// one PKV_LAYER_FULL group of every layer. groups has room for PKV_MAX_KV_GROUPS.
pkv_status pkv_model_kv_groups(const pkv_model_config *config, pkv_kv_group *groups,
                               uint32_t *num_groups);

// Bytes one token costs in a group, all its layers together: 2 x layers x heads x
// head_dim x elem_bytes (FULL, SLIDING, CHUNKED); layers x (latent_dim + rope_dim) x
// elem_bytes (MLA); 0 (STATE). 0 for an invalid group.
uint64_t pkv_kv_group_bytes_per_token(const pkv_kv_group *group, size_t elem_bytes);

// Bytes of a group's state per sequence, all its layers together (STATE: layers x
// state_bytes; 0 for the others).
uint64_t pkv_kv_group_state_bytes(const pkv_kv_group *group);

// Tokens a group holds for a sequence of `len` tokens at the step that wrote its last
// token, i.e. the keys that last query attends to (token-exact, before block rounding;
// the peak: older tokens may go before the next append): FULL, MLA: len; SLIDING:
// min(len, window); CHUNKED: the tokens of the last token's chunk, ((len - 1) mod
// window) + 1 (0 for len 0); STATE: 0.
uint64_t pkv_kv_group_tokens_kept(const pkv_kv_group *group, uint64_t len);

// KV bytes one sequence of `len` tokens holds, every group and its state included.
// window_aware 1: each group keeps pkv_kv_group_tokens_kept tokens; 0: every attention
// group keeps all `len` (an allocator that treats every layer as full attention);
// state groups count their state either way. 0 for an invalid config or a sum beyond
// 64 bits.
uint64_t pkv_model_kv_bytes_for_len(const pkv_model_config *config, size_t elem_bytes,
                                    uint64_t len, int window_aware);

#ifdef __cplusplus
}
#endif

#endif // PKV_MODEL_CONFIG_H

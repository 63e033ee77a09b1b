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
} pkv_model_config;

// Fill *config with the preset `name`: "tiny" (the default test model), "gpt2-small",
// "llama2-7b", "llama2-13b", "llama2-70b", "llama3-8b", "gpt3-175b".
// PKV_ERR_NOT_FOUND for an unknown name.
pkv_status pkv_model_preset(const char *name, pkv_model_config *config);

// The preset names, NULL-terminated (static storage).
const char *const *pkv_model_preset_names(void);

// Check a config for consistency (non-zero sizes, kv heads divide heads, ...).
// PKV_ERR_INVALID_ARG if not.
pkv_status pkv_model_config_validate(const pkv_model_config *config);

// Number of weights (parameters) of the model, embeddings and LM head included.
uint64_t pkv_model_param_count(const pkv_model_config *config);

// KV-cache bytes per token: 2 x num_layers x num_kv_heads x head_dim x elem_bytes.
uint64_t pkv_model_kv_bytes_per_token(const pkv_model_config *config, size_t elem_bytes);

#ifdef __cplusplus
}
#endif

#endif // PKV_MODEL_CONFIG_H

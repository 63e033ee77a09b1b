// SPDX-License-Identifier: MIT
// Model presets with their published shapes, and the sizes derived from them.
// Sources: GPT-2 (Radford et al. 2019), GPT-3 (Brown et al. 2020, table 2.1),
// Llama 2 (Touvron et al. 2023), Llama 3 (Meta 2024) model cards / config.json.
#include <string.h>

#include "pkv/model_config.h"

typedef struct preset {
    const char *name;
    pkv_model_config config;
} preset;

#define GPT2_STYLE PKV_NORM_LAYERNORM, PKV_FFN_GELU, PKV_POS_LEARNED, 1, 1, 1e-5f, 10000.0f, .num_kv_groups = 0
#define LLAMA_STYLE(theta) PKV_NORM_RMSNORM, PKV_FFN_SWIGLU, PKV_POS_ROPE, 0, 0, 1e-5f, theta, .num_kv_groups = 0

static const preset presets[] = {
    // name           layers  d_model heads kv  hd   d_ff   vocab   ctx
    {"tiny",        {"tiny", 4, 256, 4, 4, 64, 1024, 512, 2048, GPT2_STYLE}},
    {"gpt2-small",  {"gpt2-small", 12, 768, 12, 12, 64, 3072, 50257, 1024, GPT2_STYLE}},
    {"llama2-7b",   {"llama2-7b", 32, 4096, 32, 32, 128, 11008, 32000, 4096, LLAMA_STYLE(10000.0f)}},
    {"llama2-13b",  {"llama2-13b", 40, 5120, 40, 40, 128, 13824, 32000, 4096, LLAMA_STYLE(10000.0f)}},
    {"llama2-70b",  {"llama2-70b", 80, 8192, 64, 8, 128, 28672, 32000, 4096, LLAMA_STYLE(10000.0f)}},
    {"llama3-8b",   {"llama3-8b", 32, 4096, 32, 8, 128, 14336, 128256, 8192, LLAMA_STYLE(500000.0f)}},
    {"gpt3-175b",   {"gpt3-175b", 96, 12288, 96, 96, 128, 49152, 50257, 2048, GPT2_STYLE}},
};

#define NUM_PRESETS (sizeof presets / sizeof presets[0])

static const char *const preset_names[NUM_PRESETS + 1] = {
    "tiny", "gpt2-small", "llama2-7b", "llama2-13b", "llama2-70b", "llama3-8b", "gpt3-175b", NULL,
};

pkv_status pkv_model_preset(const char *name, pkv_model_config *config) {
    if (!name || !config) return PKV_ERR_INVALID_ARG;
    for (size_t i = 0; i < NUM_PRESETS; i++) {
        if (strcmp(presets[i].name, name) == 0) {
            *config = presets[i].config;
            return PKV_OK;
        }
    }
    return PKV_ERR_NOT_FOUND;
}

const char *const *pkv_model_preset_names(void) { return preset_names; }

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
    return PKV_OK;
}

uint64_t pkv_model_param_count(const pkv_model_config *c) {
    if (pkv_model_config_validate(c) != PKV_OK) return 0;
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

uint64_t pkv_model_kv_bytes_per_token(const pkv_model_config *c, size_t elem_bytes) {
    if (pkv_model_config_validate(c) != PKV_OK) return 0;
    return 2ull * c->num_layers * c->num_kv_heads * c->head_dim * (uint64_t)elem_bytes;
}

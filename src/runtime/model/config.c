// SPDX-License-Identifier: MIT
// Model presets with their published shapes. Sources: GPT-2 (Radford et al. 2019),
// GPT-3 (Brown et al. 2020, table 2.1), Llama 2 (Touvron et al. 2023), Llama 3 (Meta
// 2024) model cards / config.json; the heterogeneous presets (0.3.0, issue 23) cite
// their config.json on huggingface.co beside each entry (docs/DESIGN.md, "Heterogeneous
// models", has the same table). The sizes that follow from a shape are in
// config_sizes.c. Invariant: every preset passes pkv_model_config_validate.
#include <string.h>

#include "pkv/model_config.h"

// Which group each layer belongs to: every preset with groups repeats a pattern.
typedef uint8_t (*layer_pattern)(uint32_t layer);

typedef struct preset {
    const char *name;
    pkv_model_config config;
    layer_pattern pattern; // NULL: no groups (every layer full attention)
} preset;

#define GPT2_STYLE PKV_NORM_LAYERNORM, PKV_FFN_GELU, PKV_POS_LEARNED, 1, 1, 1e-5f, 10000.0f
#define LLAMA_STYLE(theta) PKV_NORM_RMSNORM, PKV_FFN_SWIGLU, PKV_POS_ROPE, 0, 0, 1e-5f, theta
// RMSNorm, gated FFN (three matrices: SwiGLU, or Gemma's GeGLU, which counts alike), RoPE.
#define RMS_STYLE(tied, eps, theta) PKV_NORM_RMSNORM, PKV_FFN_SWIGLU, PKV_POS_ROPE, tied, 0, eps, theta

// Every layer full attention of the shape above (the designator also zeroes the rest).
#define UNIFORM .num_kv_groups = 0
// One KV cache group: kind, layers, then the kind's shape.
#define G_FULL(n, kv, hd, sinks) {PKV_LAYER_FULL, n, kv, hd, 0, 0, 0, sinks, 0}
#define G_SLIDING(n, kv, hd, w, sinks) {PKV_LAYER_SLIDING, n, kv, hd, w, 0, 0, sinks, 0}
#define G_CHUNKED(n, kv, hd, c) {PKV_LAYER_CHUNKED, n, kv, hd, c, 0, 0, 0, 0}
#define G_MLA(n, latent, rope) {PKV_LAYER_MLA, n, 0, 0, 0, latent, rope, 0, 0}
#define G_STATE(n, bytes) {PKV_LAYER_STATE, n, 0, 0, 0, 0, 0, 0, bytes}

// Layer patterns, from each config's own fields.
static uint8_t alternate_sliding_full(uint32_t l) { return l % 2 == 0 ? 0 : 1; }
static uint8_t gemma3_pattern(uint32_t l) { return (l + 1) % 6 == 0 ? 1 : 0; }
static uint8_t llama4_pattern(uint32_t l) { return l % 4 == 3 ? 1 : 0; }
static uint8_t qwen3_next_pattern(uint32_t l) { return (l + 1) % 4 == 0 ? 0 : 1; }
static uint8_t jamba_pattern(uint32_t l) { return l % 8 == 4 ? 0 : 1; }
static uint8_t tiny_hybrid_pattern(uint32_t l) {
    static const uint8_t g[6] = {1, 2, 3, 4, 0, 1}; // sliding, chunked, mla, state, full, sliding
    return g[l % 6];
}

// Bytes of one Gated DeltaNet layer's state (vLLM's gated_delta_net_state_shape, in the
// model dtype bf16 as vLLM keeps it by default, mamba_ssm_cache_dtype "auto"): the
// recurrent state num_v_heads x head_v_dim x head_k_dim plus the conv state
// (conv_kernel - 1) x (2 x num_k_heads x head_k_dim + num_v_heads x head_v_dim).
#define GDN_STATE_BYTES(kh, vh, kd, vd, conv) \
    (((uint64_t)(vh) * (vd) * (kd) + ((uint64_t)(conv) - 1) * (2ull * (kh) * (kd) + (uint64_t)(vh) * (vd))) * 2)
// Bytes of one Mamba-1 layer's state (vLLM's mamba1_state_shape, bf16): d_inner x d_state
// (SSM) plus d_inner x (d_conv - 1) (conv), d_inner = expand x hidden.
#define MAMBA1_STATE_BYTES(d_inner, d_state, d_conv) \
    (((uint64_t)(d_inner) * (d_state) + (uint64_t)(d_inner) * ((d_conv) - 1)) * 2)

static const preset presets[] = {
    // name           layers  d_model heads kv  hd   d_ff   vocab   ctx
    {"tiny",        {"tiny", 4, 256, 4, 4, 64, 1024, 512, 2048, GPT2_STYLE, UNIFORM}, NULL},
    {"gpt2-small",  {"gpt2-small", 12, 768, 12, 12, 64, 3072, 50257, 1024, GPT2_STYLE, UNIFORM}, NULL},
    {"llama2-7b",   {"llama2-7b", 32, 4096, 32, 32, 128, 11008, 32000, 4096, LLAMA_STYLE(10000.0f), UNIFORM}, NULL},
    {"llama2-13b",  {"llama2-13b", 40, 5120, 40, 40, 128, 13824, 32000, 4096, LLAMA_STYLE(10000.0f), UNIFORM}, NULL},
    {"llama2-70b",  {"llama2-70b", 80, 8192, 64, 8, 128, 28672, 32000, 4096, LLAMA_STYLE(10000.0f), UNIFORM}, NULL},
    {"llama3-8b",   {"llama3-8b", 32, 4096, 32, 8, 128, 14336, 128256, 8192, LLAMA_STYLE(500000.0f), UNIFORM}, NULL},
    {"gpt3-175b",   {"gpt3-175b", 96, 12288, 96, 96, 128, 49152, 50257, 2048, GPT2_STYLE, UNIFORM}, NULL},

    // --- 0.3.0: current and heterogeneous models (issue 23) ---
    // https://huggingface.co/meta-llama/Llama-3.1-8B/blob/main/config.json
    {"llama-3.1-8b", {"llama-3.1-8b", 32, 4096, 32, 8, 128, 14336, 128256, 131072,
                      LLAMA_STYLE(500000.0f), UNIFORM}, NULL},
    // https://huggingface.co/meta-llama/Llama-3.1-70B/blob/main/config.json
    {"llama-3.1-70b", {"llama-3.1-70b", 80, 8192, 64, 8, 128, 28672, 128256, 131072,
                       LLAMA_STYLE(500000.0f), UNIFORM}, NULL},
    // https://huggingface.co/openai/gpt-oss-20b/blob/main/config.json: layer_types alternate
    // sliding_attention (sliding_window 128) and full_attention, attention sinks on every
    // layer; MoE (32 experts, 4 per token, intermediate_size 2880 per expert). Parameters:
    // the model card's 20.91B total, 3.61B active.
    {"gpt-oss-20b", {"gpt-oss-20b", 24, 2880, 64, 8, 64, 2880, 201088, 131072,
                     RMS_STYLE(0, 1e-5f, 150000.0f), .num_kv_groups = 2,
                     .kv_groups = {G_SLIDING(12, 8, 64, 128, 1), G_FULL(12, 8, 64, 1)},
                     .total_params = 20910000000ull, .active_params = 3610000000ull},
     alternate_sliding_full},
    // https://huggingface.co/openai/gpt-oss-120b/blob/main/config.json: as gpt-oss-20b with
    // 36 layers and 128 experts; model card: 116.83B total, 5.13B active.
    {"gpt-oss-120b", {"gpt-oss-120b", 36, 2880, 64, 8, 64, 2880, 201088, 131072,
                      RMS_STYLE(0, 1e-5f, 150000.0f), .num_kv_groups = 2,
                      .kv_groups = {G_SLIDING(18, 8, 64, 128, 1), G_FULL(18, 8, 64, 1)},
                      .total_params = 116830000000ull, .active_params = 5130000000ull},
     alternate_sliding_full},
    // https://huggingface.co/google/gemma-3-27b-it/blob/main/config.json (text_config):
    // sliding_window 1024, sliding_window_pattern 6 (layers 5, 11, ..., 59 global: 10 of
    // 62), tied embeddings, GeGLU FFN. Dense: parameters from the shape (~27.0B).
    {"gemma-3-27b", {"gemma-3-27b", 62, 5376, 32, 16, 128, 21504, 262208, 131072,
                     RMS_STYLE(1, 1e-6f, 1000000.0f), .num_kv_groups = 2,
                     .kv_groups = {G_SLIDING(52, 16, 128, 1024, 0), G_FULL(10, 16, 128, 0)}},
     gemma3_pattern},
    // https://huggingface.co/meta-llama/Llama-4-Scout-17B-16E-Instruct/blob/main/config.json
    // (text_config): attention_chunk_size 8192 on the RoPE layers, no_rope_layers
    // [1, 1, 1, 0] x 12: every 4th layer is NoPE with global attention; 16 experts of
    // intermediate_size 8192. Model card: 109B total, 17B active.
    {"llama-4-scout", {"llama-4-scout", 48, 5120, 40, 8, 128, 8192, 202048, 10485760,
                       LLAMA_STYLE(500000.0f), .num_kv_groups = 2,
                       .kv_groups = {G_CHUNKED(36, 8, 128, 8192), G_FULL(12, 8, 128, 0)},
                       .total_params = 109000000000ull, .active_params = 17000000000ull},
     llama4_pattern},
    // https://huggingface.co/deepseek-ai/DeepSeek-V3/blob/main/config.json: MLA on all 61
    // layers, kv_lora_rank 512, qk_rope_head_dim 64 (head_dim here: v_head_dim 128);
    // moe_intermediate_size 2048 per routed expert. Paper / model card: 671B total, 37B
    // active.
    {"deepseek-v3", {"deepseek-v3", 61, 7168, 128, 128, 128, 2048, 129280, 163840,
                     RMS_STYLE(0, 1e-6f, 10000.0f), .num_kv_groups = 1,
                     .kv_groups = {G_MLA(61, 512, 64)},
                     .total_params = 671000000000ull, .active_params = 37000000000ull},
     NULL},
    // https://huggingface.co/Qwen/Qwen3-Next-80B-A3B-Instruct/blob/main/config.json:
    // full_attention_interval 4 (12 gated-attention layers, 16 heads, 2 KV heads, head_dim
    // 256) and 36 Gated DeltaNet layers (linear_num_key_heads 16, linear_num_value_heads
    // 32, linear_key_head_dim = linear_value_head_dim = 128, linear_conv_kernel_dim 4);
    // moe_intermediate_size 512. Model card: 80B total, 3B active.
    {"qwen3-next-80b", {"qwen3-next-80b", 48, 2048, 16, 2, 256, 512, 151936, 262144,
                        RMS_STYLE(0, 1e-6f, 10000000.0f), .num_kv_groups = 2,
                        .kv_groups = {G_FULL(12, 2, 256, 0),
                                      G_STATE(36, GDN_STATE_BYTES(16, 32, 128, 128, 4))},
                        .total_params = 80000000000ull, .active_params = 3000000000ull},
     qwen3_next_pattern},
    // https://huggingface.co/ai21labs/AI21-Jamba-1.5-Mini/blob/main/config.json:
    // attn_layer_period 8, attn_layer_offset 4 (4 attention layers, 32 heads, 8 KV heads,
    // head_dim 4096 / 32), 28 Mamba layers (mamba_expand 2, mamba_d_state 16, mamba_d_conv
    // 4); 16 experts of intermediate_size 14336. Jamba has no positional encoding (pos
    // only shapes the unused weight layout here). Model card: 52B total, 12B active.
    {"jamba-1.5-mini", {"jamba-1.5-mini", 32, 4096, 32, 8, 128, 14336, 65536, 262144,
                        RMS_STYLE(0, 1e-6f, 10000.0f), .num_kv_groups = 2,
                        .kv_groups = {G_FULL(4, 8, 128, 0),
                                      G_STATE(28, MAMBA1_STATE_BYTES(2 * 4096, 16, 4))},
                        .total_params = 52000000000ull, .active_params = 12000000000ull},
     jamba_pattern},

    // The runtime's heterogeneous test models (tiny's size, Llama style for RoPE):
    // sliding window 16 with sinks alternating with full layers; MLA with a 64 + 32 latent;
    // and one of each kind, the state layer holding 4 heads x 64 x 64 fp32 (the runtime's
    // decayed outer-product state).
    {"tiny-swa", {"tiny-swa", 4, 256, 4, 2, 64, 1024, 512, 2048, LLAMA_STYLE(10000.0f),
                  .num_kv_groups = 2,
                  .kv_groups = {G_SLIDING(2, 2, 64, 16, 1), G_FULL(2, 2, 64, 1)}},
     alternate_sliding_full},
    {"tiny-mla", {"tiny-mla", 4, 256, 4, 4, 64, 1024, 512, 2048, LLAMA_STYLE(10000.0f),
                  .num_kv_groups = 1, .kv_groups = {G_MLA(4, 64, 32)}},
     NULL},
    {"tiny-hybrid", {"tiny-hybrid", 6, 256, 4, 4, 64, 1024, 512, 2048, LLAMA_STYLE(10000.0f),
                     .num_kv_groups = 5,
                     .kv_groups = {G_FULL(1, 4, 64, 0), G_SLIDING(2, 4, 64, 16, 1),
                                   G_CHUNKED(1, 4, 64, 32), G_MLA(1, 64, 32),
                                   G_STATE(1, 4ull * 64 * 64 * sizeof(float))}},
     tiny_hybrid_pattern},
};

#define NUM_PRESETS (sizeof presets / sizeof presets[0])

static const char *const preset_names[NUM_PRESETS + 1] = {
    "tiny", "gpt2-small", "llama2-7b", "llama2-13b", "llama2-70b", "llama3-8b", "gpt3-175b",
    "llama-3.1-8b", "llama-3.1-70b", "gpt-oss-20b", "gpt-oss-120b", "gemma-3-27b",
    "llama-4-scout", "deepseek-v3", "qwen3-next-80b", "jamba-1.5-mini", "tiny-swa", "tiny-mla",
    "tiny-hybrid", NULL,
};

pkv_status pkv_model_preset(const char *name, pkv_model_config *config) {
    if (!name || !config) return PKV_ERR_INVALID_ARG;
    for (size_t i = 0; i < NUM_PRESETS; i++) {
        if (strcmp(presets[i].name, name) == 0) {
            *config = presets[i].config;
            if (presets[i].pattern)
                for (uint32_t l = 0; l < config->num_layers; l++)
                    config->layer_group[l] = presets[i].pattern(l);
            return PKV_OK;
        }
    }
    return PKV_ERR_NOT_FOUND;
}

const char *const *pkv_model_preset_names(void) { return preset_names; }

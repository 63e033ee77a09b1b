// SPDX-License-Identifier: MIT
// KV cache groups of the model description (issue 23): every preset's per-sequence KV
// bytes at 8k, 32k and 128k tokens, window-aware and not, against a hand computation
// from the published config values written out below (not from the functions under
// test); the rules of each layer kind (tokens kept at the window's edges); and the
// consistency check refusing malformed groups.
#include <criterion/criterion.h>
#include <string.h>

#include "pkv/model_config.h"

// A preset's KV cache by what its layers keep, from its config.json: bytes per token of
// the layers that keep every token (full attention, MLA), of the sliding-window layers
// and of the chunked layers (fp16 / bf16: 2 bytes a value), and the state per sequence.
typedef struct hand {
    const char *name;
    uint64_t full_tok, sliding_tok, window, chunked_tok, chunk, state;
} hand;

static const hand hands[] = {
    // uniform presets: 2 (K, V) x layers x kv_heads x head_dim x 2 bytes
    {"tiny", 2ull * 4 * 4 * 64 * 2, 0, 0, 0, 0, 0},
    {"gpt2-small", 2ull * 12 * 12 * 64 * 2, 0, 0, 0, 0, 0},
    {"llama2-7b", 2ull * 32 * 32 * 128 * 2, 0, 0, 0, 0, 0},
    {"llama2-13b", 2ull * 40 * 40 * 128 * 2, 0, 0, 0, 0, 0},
    {"llama2-70b", 2ull * 80 * 8 * 128 * 2, 0, 0, 0, 0, 0},
    {"llama3-8b", 2ull * 32 * 8 * 128 * 2, 0, 0, 0, 0, 0},
    {"gpt3-175b", 2ull * 96 * 96 * 128 * 2, 0, 0, 0, 0, 0},
    {"llama-3.1-8b", 2ull * 32 * 8 * 128 * 2, 0, 0, 0, 0, 0},
    {"llama-3.1-70b", 2ull * 80 * 8 * 128 * 2, 0, 0, 0, 0, 0},
    // gpt-oss: half the layers sliding (window 128), half full; 8 KV heads x 64
    {"gpt-oss-20b", 2ull * 12 * 8 * 64 * 2, 2ull * 12 * 8 * 64 * 2, 128, 0, 0, 0},
    {"gpt-oss-120b", 2ull * 18 * 8 * 64 * 2, 2ull * 18 * 8 * 64 * 2, 128, 0, 0, 0},
    // gemma-3-27b: 62 layers, every 6th global (10), 52 local with window 1024; 16 x 128
    {"gemma-3-27b", 2ull * 10 * 16 * 128 * 2, 2ull * 52 * 16 * 128 * 2, 1024, 0, 0, 0},
    // llama-4-scout: 48 layers, every 4th global (12), 36 chunked by 8192; 8 x 128
    {"llama-4-scout", 2ull * 12 * 8 * 128 * 2, 0, 0, 2ull * 36 * 8 * 128 * 2, 8192, 0},
    // deepseek-v3: 61 MLA layers of kv_lora_rank 512 + qk_rope_head_dim 64 values
    {"deepseek-v3", 61ull * (512 + 64) * 2, 0, 0, 0, 0, 0},
    // qwen3-next-80b: 12 attention layers (2 KV heads x 256); 36 Gated DeltaNet layers,
    // each 32 x 128 x 128 recurrent + 3 x (2 x 16 x 128 + 32 x 128) conv values in bf16
    {"qwen3-next-80b", 2ull * 12 * 2 * 256 * 2, 0, 0, 0, 0,
     36ull * (32 * 128 * 128 + 3 * (2 * 16 * 128 + 32 * 128)) * 2},
    // jamba-1.5-mini: 4 attention layers (8 x 128); 28 Mamba layers, d_inner 8192:
    // 8192 x 16 SSM + 8192 x 3 conv values in bf16
    {"jamba-1.5-mini", 2ull * 4 * 8 * 128 * 2, 0, 0, 0, 0, 28ull * (8192 * 16 + 8192 * 3) * 2},
    // the runtime's tiny models
    {"tiny-swa", 2ull * 2 * 2 * 64 * 2, 2ull * 2 * 2 * 64 * 2, 16, 0, 0, 0},
    {"tiny-mla", 4ull * (64 + 32) * 2, 0, 0, 0, 0, 0},
    // tiny-hybrid: 1 full + 1 MLA keep all; 2 sliding (16); 1 chunked (32); 1 state of
    // 4 heads x 64 x 64 fp32
    {"tiny-hybrid", 2ull * 1 * 4 * 64 * 2 + 1ull * (64 + 32) * 2, 2ull * 2 * 4 * 64 * 2, 16,
     2ull * 1 * 4 * 64 * 2, 32, 4ull * 64 * 64 * 4},
};
#define NUM_HANDS (sizeof hands / sizeof hands[0])

static uint64_t min_u64(uint64_t a, uint64_t b) { return a < b ? a : b; }

static uint64_t hand_bytes(const hand *h, uint64_t len, int window_aware) {
    if (!window_aware) return (h->full_tok + h->sliding_tok + h->chunked_tok) * len + h->state;
    uint64_t b = h->full_tok * len + h->state;
    if (h->sliding_tok) b += h->sliding_tok * min_u64(len, h->window);
    if (h->chunked_tok && len) b += h->chunked_tok * ((len - 1) % h->chunk + 1);
    return b;
}

Test(model_groups, every_preset_has_a_hand_computation) {
    size_t n = 0;
    for (const char *const *p = pkv_model_preset_names(); *p; p++, n++) {
        int found = 0;
        for (size_t i = 0; i < NUM_HANDS; i++) found |= strcmp(hands[i].name, *p) == 0;
        cr_expect(found, "preset %s has no hand computation here", *p);
        pkv_model_config c;
        cr_assert_eq(pkv_model_preset(*p, &c), PKV_OK);
        cr_expect_eq(pkv_model_config_validate(&c), PKV_OK, "%s", *p);
    }
    cr_expect_eq(n, NUM_HANDS);
}

Test(model_groups, kv_bytes_at_8k_32k_128k_match_the_configs) {
    static const uint64_t lens[] = {8192, 32768, 131072, 1, 1000, 8193};
    for (size_t i = 0; i < NUM_HANDS; i++) {
        pkv_model_config c;
        cr_assert_eq(pkv_model_preset(hands[i].name, &c), PKV_OK, "%s", hands[i].name);
        for (size_t j = 0; j < sizeof lens / sizeof lens[0]; j++) {
            for (int aware = 0; aware <= 1; aware++) {
                const uint64_t want = hand_bytes(&hands[i], lens[j], aware);
                const uint64_t got = pkv_model_kv_bytes_for_len(&c, 2, lens[j], aware);
                cr_expect_eq(got, want, "%s len %llu window_aware %d: %llu, by hand %llu",
                             hands[i].name, (unsigned long long)lens[j], aware,
                             (unsigned long long)got, (unsigned long long)want);
            }
        }
        // Bytes per token: every layer keeping the token.
        cr_expect_eq(pkv_model_kv_bytes_per_token(&c, 2),
                     hands[i].full_tok + hands[i].sliding_tok + hands[i].chunked_tok, "%s",
                     hands[i].name);
    }
}

// The figures the issue quotes, as published per-sequence sizes (fp16/bf16), within 1%:
// gpt-oss-120b at 128k is 128k x 36 864 + 128 x 36 864 bytes (~4.5 GiB), Gemma 3 27B at
// 128k ~ 10.7 GB full-cache vs ~1.9 GB window-aware; DeepSeek-V3 70 272 B per token.
Test(model_groups, headline_figures) {
    pkv_model_config c;
    pkv_model_preset("gemma-3-27b", &c);
    const double full = (double)pkv_model_kv_bytes_for_len(&c, 2, 131072, 0);
    const double aware = (double)pkv_model_kv_bytes_for_len(&c, 2, 131072, 1);
    // 62 x 2 x 16 x 128 x 2 x 131072 = 66 571 993 088; window-aware: 10 global layers at
    // 131072 tokens + 52 local at 1024 = 10 737 418 240 + 436 207 616.
    cr_expect(full > 66571993088.0 * 0.99 && full < 66571993088.0 * 1.01, "%f", full);
    cr_expect(aware > 11173625856.0 * 0.99 && aware < 11173625856.0 * 1.01, "%f", aware);
    pkv_model_preset("deepseek-v3", &c);
    cr_expect_eq(pkv_model_kv_bytes_per_token(&c, 2), 70272);
}

Test(model_groups, layer_patterns_follow_the_configs) {
    pkv_model_config c;
    pkv_model_preset("gpt-oss-20b", &c);
    cr_expect_eq(c.kv_groups[c.layer_group[0]].kind, PKV_LAYER_SLIDING);
    cr_expect_eq(c.kv_groups[c.layer_group[1]].kind, PKV_LAYER_FULL);
    cr_expect_eq(c.kv_groups[c.layer_group[23]].kind, PKV_LAYER_FULL);
    pkv_model_preset("gemma-3-27b", &c);
    for (uint32_t l = 0; l < 62; l++)
        cr_expect_eq(c.kv_groups[c.layer_group[l]].kind,
                     l == 5 || l == 11 || l == 17 || l == 23 || l == 29 || l == 35 || l == 41 ||
                             l == 47 || l == 53 || l == 59
                         ? PKV_LAYER_FULL
                         : PKV_LAYER_SLIDING,
                     "gemma layer %u", l);
    pkv_model_preset("llama-4-scout", &c);
    cr_expect_eq(c.kv_groups[c.layer_group[3]].kind, PKV_LAYER_FULL);
    cr_expect_eq(c.kv_groups[c.layer_group[2]].kind, PKV_LAYER_CHUNKED);
    cr_expect_eq(c.kv_groups[c.layer_group[47]].kind, PKV_LAYER_FULL);
    pkv_model_preset("qwen3-next-80b", &c);
    cr_expect_eq(c.kv_groups[c.layer_group[3]].kind, PKV_LAYER_FULL);
    cr_expect_eq(c.kv_groups[c.layer_group[0]].kind, PKV_LAYER_STATE);
    pkv_model_preset("jamba-1.5-mini", &c);
    cr_expect_eq(c.kv_groups[c.layer_group[4]].kind, PKV_LAYER_FULL);
    cr_expect_eq(c.kv_groups[c.layer_group[12]].kind, PKV_LAYER_FULL);
    cr_expect_eq(c.kv_groups[c.layer_group[5]].kind, PKV_LAYER_STATE);
}

Test(model_groups, tokens_kept_at_the_edges) {
    const pkv_kv_group sliding = {PKV_LAYER_SLIDING, 1, 2, 8, 16, 0, 0, 0, 0};
    const uint64_t s_len[] = {0, 1, 15, 16, 17, 1000};
    const uint64_t s_want[] = {0, 1, 15, 16, 16, 16};
    for (size_t i = 0; i < 6; i++)
        cr_expect_eq(pkv_kv_group_tokens_kept(&sliding, s_len[i]), s_want[i], "sliding %llu",
                     (unsigned long long)s_len[i]);
    // Chunked 32: the last token's chunk, from its first position to the token.
    const pkv_kv_group chunked = {PKV_LAYER_CHUNKED, 1, 2, 8, 32, 0, 0, 0, 0};
    const uint64_t c_len[] = {0, 1, 31, 32, 33, 63, 64, 65};
    const uint64_t c_want[] = {0, 1, 31, 32, 1, 31, 32, 1};
    for (size_t i = 0; i < 8; i++)
        cr_expect_eq(pkv_kv_group_tokens_kept(&chunked, c_len[i]), c_want[i], "chunked %llu",
                     (unsigned long long)c_len[i]);
    const pkv_kv_group full = {PKV_LAYER_FULL, 1, 2, 8, 0, 0, 0, 0, 0};
    const pkv_kv_group mla = {PKV_LAYER_MLA, 1, 0, 0, 0, 64, 32, 0, 0};
    const pkv_kv_group state = {PKV_LAYER_STATE, 3, 0, 0, 0, 0, 0, 0, 100};
    for (uint64_t len = 0; len < 40; len += 13) {
        cr_expect_eq(pkv_kv_group_tokens_kept(&full, len), len);
        cr_expect_eq(pkv_kv_group_tokens_kept(&mla, len), len);
        cr_expect_eq(pkv_kv_group_tokens_kept(&state, len), 0);
    }
    cr_expect_eq(pkv_kv_group_bytes_per_token(&mla, 2), (64 + 32) * 2);
    cr_expect_eq(pkv_kv_group_bytes_per_token(&state, 2), 0);
    cr_expect_eq(pkv_kv_group_state_bytes(&state), 300);
    cr_expect_eq(pkv_kv_group_state_bytes(&full), 0);
    cr_expect_eq(pkv_kv_group_bytes_per_token(&sliding, 4), 2 * 2 * 8 * 4);
}

Test(model_groups, uniform_model_is_one_full_group) {
    pkv_model_config c;
    pkv_model_preset("llama2-70b", &c);
    pkv_kv_group g[PKV_MAX_KV_GROUPS];
    uint32_t n = 0;
    cr_assert_eq(pkv_model_kv_groups(&c, g, &n), PKV_OK);
    cr_expect_eq(n, 1);
    cr_expect_eq(g[0].kind, PKV_LAYER_FULL);
    cr_expect_eq(g[0].num_layers, 80);
    cr_expect_eq(g[0].num_kv_heads, 8);
    cr_expect_eq(g[0].head_dim, 128);
    cr_expect_eq(pkv_model_active_param_count(&c), pkv_model_param_count(&c));
    pkv_model_preset("gpt-oss-120b", &c);
    cr_assert_eq(pkv_model_kv_groups(&c, g, &n), PKV_OK);
    cr_expect_eq(n, 2);
    cr_expect_eq(g[0].window, 128);
    cr_expect_eq(g[0].sinks, 1);
    cr_expect_eq(pkv_model_param_count(&c), 116830000000ull);
    cr_expect_eq(pkv_model_active_param_count(&c), 5130000000ull);
    cr_expect_str_eq(pkv_layer_kind_name(PKV_LAYER_FULL), "full");
    cr_expect_str_eq(pkv_layer_kind_name(PKV_LAYER_SLIDING), "sliding");
    cr_expect_str_eq(pkv_layer_kind_name(PKV_LAYER_CHUNKED), "chunked");
    cr_expect_str_eq(pkv_layer_kind_name(PKV_LAYER_MLA), "mla");
    cr_expect_str_eq(pkv_layer_kind_name(PKV_LAYER_STATE), "state");
    cr_expect_str_eq(pkv_layer_kind_name((pkv_layer_kind)9), "unknown");
    cr_expect_eq(pkv_model_kv_groups(NULL, g, &n), PKV_ERR_INVALID_ARG);
}

// tiny-hybrid, then one field broken: validate must refuse each.
static pkv_model_config hybrid(void) {
    pkv_model_config c;
    cr_assert_eq(pkv_model_preset("tiny-hybrid", &c), PKV_OK);
    return c;
}

#define EXPECT_REFUSED(what, stmt)                                                     \
    do {                                                                               \
        pkv_model_config c = hybrid();                                                 \
        stmt;                                                                          \
        cr_expect_eq(pkv_model_config_validate(&c), PKV_ERR_INVALID_ARG, "%s", what); \
        cr_expect_eq(pkv_model_kv_bytes_for_len(&c, 2, 100, 1), 0, "%s", what);        \
    } while (0)

Test(model_groups, validate_refuses_bad_groups) {
    pkv_model_config ok = hybrid();
    cr_assert_eq(pkv_model_config_validate(&ok), PKV_OK);
    // tiny-hybrid's groups: 0 full, 1 sliding (2 layers), 2 chunked, 3 mla, 4 state.
    EXPECT_REFUSED("unknown kind", c.kv_groups[0].kind = (pkv_layer_kind)7);
    EXPECT_REFUSED("too many groups", c.num_kv_groups = PKV_MAX_KV_GROUPS + 1);
    EXPECT_REFUSED("a group with no layers", (c.num_kv_groups = 6, c.kv_groups[5] = c.kv_groups[0],
                                              c.kv_groups[5].num_layers = 0));
    EXPECT_REFUSED("layer in no group", c.layer_group[2] = 5);
    EXPECT_REFUSED("layer count differs from the map", c.kv_groups[1].num_layers = 3);
    EXPECT_REFUSED("layers beyond PKV_MAX_LAYERS", c.num_layers = PKV_MAX_LAYERS + 1);
    EXPECT_REFUSED("sliding without a window", c.kv_groups[1].window = 0);
    EXPECT_REFUSED("chunked without a chunk", c.kv_groups[2].window = 0);
    EXPECT_REFUSED("full with a window", c.kv_groups[0].window = 8);
    EXPECT_REFUSED("full without heads", c.kv_groups[0].num_kv_heads = 0);
    EXPECT_REFUSED("sliding without head_dim", c.kv_groups[1].head_dim = 0);
    EXPECT_REFUSED("full with a latent", c.kv_groups[0].latent_dim = 8);
    EXPECT_REFUSED("mla without a latent", c.kv_groups[3].latent_dim = 0);
    EXPECT_REFUSED("mla with kv heads", c.kv_groups[3].num_kv_heads = 4);
    EXPECT_REFUSED("mla with sinks", c.kv_groups[3].sinks = 1);
    EXPECT_REFUSED("sinks not 0 or 1", c.kv_groups[1].sinks = 2);
    EXPECT_REFUSED("state without bytes", c.kv_groups[4].state_bytes = 0);
    EXPECT_REFUSED("state with a window", c.kv_groups[4].window = 4);
    EXPECT_REFUSED("full with state bytes", c.kv_groups[0].state_bytes = 4);
    EXPECT_REFUSED("bytes per token beyond 64 bits",
                   (c.kv_groups[0].num_kv_heads = UINT32_MAX, c.kv_groups[0].head_dim = UINT32_MAX));
    pkv_model_config q;
    pkv_model_preset("qwen3-next-80b", &q);
    q.kv_groups[1].state_bytes = UINT64_MAX / 8; // x 36 layers: beyond 64 bits
    cr_expect_eq(pkv_model_config_validate(&q), PKV_ERR_INVALID_ARG, "state beyond 64 bits");
    cr_expect_eq(pkv_kv_group_state_bytes(&q.kv_groups[1]), 0);
    EXPECT_REFUSED("active above total", (c.total_params = 10, c.active_params = 11));
    EXPECT_REFUSED("active without total", c.active_params = 11);
    // Group-level calls refuse a malformed group too.
    pkv_kv_group bad = {PKV_LAYER_SLIDING, 1, 2, 8, 0, 0, 0, 0, 0};
    cr_expect_eq(pkv_kv_group_bytes_per_token(&bad, 2), 0);
    cr_expect_eq(pkv_kv_group_tokens_kept(&bad, 5), 0);
    cr_expect_eq(pkv_kv_group_bytes_per_token(NULL, 2), 0);
    // Layers past num_layers are not part of the model: what they hold does not matter.
    ok.layer_group[PKV_MAX_LAYERS - 1] = 200;
    cr_expect_eq(pkv_model_config_validate(&ok), PKV_OK);
}

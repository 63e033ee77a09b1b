// SPDX-License-Identifier: MIT
// pkv-size: the KV-cache size calculator. KV bytes per token =
// 2 x layers x kv_heads x head_dim x bytes per element (DESIGN.md); a request
// of `seq` tokens holds seq times that, a batch holds batch times that. Given
// a memory size (or a GPU preset) it also says how many such requests fit in the
// KV budget, (memory - weights) x 0.9: pkv-replay's default budget rule.
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "pkv/model.h"
#include "pkv/replay.h"
#include "cli.h"
#include "size_groups.h"

static void usage(FILE *f) {
    fprintf(f,
            "usage: pkv-size [options]\n"
            "KV-cache bytes for a model: 2 x layers x kv_heads x head_dim x dtype bytes per token.\n"
            "  --model NAME       preset (default tiny): ");
    const char *const *names = pkv_model_preset_names();
    for (int i = 0; names[i]; i++) fprintf(f, "%s%s", i ? ", " : "", names[i]);
    fprintf(f,
            "\n"
            "  --layers N         override the number of layers\n"
            "  --kv-heads N       override the number of K/V heads (GQA / MQA)\n"
            "  --head-dim N       override the head dimension\n"
            "  --params N         override the parameter count (for the weights)\n"
            "  --seq N            tokens per request (default: the model's context)\n"
            "  --batch N          requests (default 1)\n"
            "  --dtype T          KV element type: fp32, fp16, bf16, int8, fp8_e4m3, fp8_e5m2\n"
            "                     (fp8 = fp8_e4m3; default fp16). int8 adds its scales\n"
            "  --block N          tokens per cache block, for the bytes per block (default 16)\n"
            "  --weights-dtype T  weight element type (default: same as --dtype, but fp16\n"
            "                     when --dtype is an 8-bit KV format)\n"
            "  --memory SIZE      device memory, e.g. 80GB, 141GB, 80GiB: how many requests\n"
            "                     of --seq tokens fit in the KV budget\n"
            "  --gpu NAME         device memory of a GPU preset, as pkv-replay --gpu: ");
    const char *const *gpus = pkv_gpu_preset_names();
    for (int i = 0; gpus[i]; i++) fprintf(f, "%s%s", i ? ", " : "", gpus[i]);
    fprintf(f,
            "\n"
            "  --gpu-util F       share of (memory - weights) given to the KV cache, as\n"
            "                     pkv-replay's default budget (default 0.9)\n"
            "  --json             one JSON object on stdout\n"
            "Models with KV cache groups (gpt-oss, gemma-3, llama-4-scout, deepseek-v3,\n"
            "qwen3-next, jamba, tiny-swa/-mla/-hybrid) print one row per group (kind, layers,\n"
            "kv heads x head dim or MLA latent + rope dims, window, kv bytes per token, state\n"
            "bytes per sequence) and, per context length (--seq N, default 8192, 32768 and\n"
            "131072), one sequence's KV bytes window-aware (sliding / chunked layers keep only\n"
            "their window, state layers their state) and with every layer kept full (a\n"
            "uniform paged cache), token-exact; --json gives them as \"groups\" and\n"
            "\"lengths\". Shape overrides, int8 and --block apply to uniform models only.\n"
            "  --help             this text\n"
            CLI_SIZE_UNITS
            "example: pkv-size --model gpt3-175b --seq 2048 --dtype fp16\n");
}

// Element bytes of a dtype name (pkv_dtype_from_name's names); 0 if unknown.
static int dtype_bytes(const char *s) {
    pkv_dtype d;
    return pkv_dtype_from_name(s, &d) == PKV_OK ? (int)pkv_dtype_size(d) : 0;
}

static double gib(uint64_t b) { return (double)b / 1073741824.0; }

// A model with KV cache groups: size_groups.c's report (exit status).
static int report_groups(const pkv_model_config *c, const char *dtype, const char *wdtype,
                         int overridden, uint64_t seq, uint64_t batch, uint64_t params,
                         int have_memory, uint64_t memory, double gpu_util, int json) {
    if (overridden) {
        fprintf(stderr, "pkv-size: --layers, --kv-heads and --head-dim apply to uniform models; "
                        "'%s' has KV cache groups\n", c->name);
        return 2;
    }
    pkv_dtype kvd;
    pkv_dtype_from_name(dtype, &kvd);
    if (kvd == PKV_DTYPE_INT8) {
        fprintf(stderr, "pkv-size: --dtype int8 (per-token scales of uniform K/V) is not defined "
                        "for '%s', a model with KV cache groups: use fp8\n", c->name);
        return 2;
    }
    static const uint64_t defaults[] = {8192, 32768, 131072};
    size_groups_opts o = {0};
    o.dtype = dtype;
    o.elem_bytes = (uint64_t)dtype_bytes(dtype);
    o.seqs = seq ? &seq : defaults;
    o.num_seqs = seq ? 1 : 3;
    o.batch = batch;
    o.params = params ? params : pkv_model_param_count(c);
    const int kv_quantized = pkv_dtype_is_quantized(kvd);
    o.weights_bytes = o.params * (uint64_t)dtype_bytes(wdtype ? wdtype : kv_quantized ? "fp16" : dtype);
    o.have_memory = have_memory;
    o.memory_bytes = memory;
    o.gpu_util = gpu_util;
    o.json = json;
    return size_groups_report(c, &o);
}

int main(int argc, char **argv) {
    const char *model = "tiny", *dtype = "fp16", *wdtype = NULL;
    uint64_t layers = 0, kv_heads = 0, head_dim = 0, params = 0, seq = 0, batch = 1, memory = 0;
    uint64_t block = 16;
    double gpu_util = 0.9; // pkv_replay_params_default's: the same budget rule
    int json = 0, have_memory = 0;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        const char *v = i + 1 < argc ? argv[i + 1] : NULL;
        int ok = 1;
        if (strcmp(a, "--help") == 0 || strcmp(a, "-h") == 0) {
            usage(stdout);
            return 0;
        } else if (strcmp(a, "--json") == 0) {
            json = 1;
            continue;
        } else if (strcmp(a, "--model") == 0) {
            model = v;
            ok = v != NULL;
        } else if (strcmp(a, "--dtype") == 0) {
            dtype = v;
            ok = v && dtype_bytes(v);
        } else if (strcmp(a, "--weights-dtype") == 0) {
            wdtype = v;
            ok = v && dtype_bytes(v);
        } else if (strcmp(a, "--layers") == 0) {
            ok = cli_parse_u64(v, &layers) && layers > 0 && layers < (1u << 20);
        } else if (strcmp(a, "--kv-heads") == 0) {
            ok = cli_parse_u64(v, &kv_heads) && kv_heads > 0 && kv_heads < (1u << 20);
        } else if (strcmp(a, "--head-dim") == 0) {
            ok = cli_parse_u64(v, &head_dim) && head_dim > 0 && head_dim < (1u << 20);
        } else if (strcmp(a, "--params") == 0) {
            ok = cli_parse_u64(v, &params);
        } else if (strcmp(a, "--seq") == 0) {
            ok = cli_parse_u64(v, &seq) && seq > 0 && seq < (1ull << 40);
        } else if (strcmp(a, "--block") == 0) {
            ok = cli_parse_u64(v, &block) && block > 0 && block <= 65536;
        } else if (strcmp(a, "--batch") == 0) {
            ok = cli_parse_u64(v, &batch) && batch > 0 && batch < (1ull << 32);
        } else if (strcmp(a, "--memory") == 0) {
            ok = v && pkv_size_parse(v, &memory) == PKV_OK && memory > 0;
            have_memory = 1;
        } else if (strcmp(a, "--gpu") == 0) {
            pkv_gpu_spec g;
            ok = v && pkv_gpu_preset(v, &g) == PKV_OK;
            if (ok) memory = g.mem_bytes;
            have_memory = 1;
        } else if (strcmp(a, "--gpu-util") == 0) {
            char *end = NULL;
            gpu_util = v ? strtod(v, &end) : 0;
            ok = v && end != v && *end == '\0' && gpu_util > 0 && gpu_util <= 1;
        } else {
            fprintf(stderr, "pkv-size: unknown option '%s' (see --help)\n", a);
            return 2;
        }
        if (!ok) {
            fprintf(stderr, "pkv-size: bad or missing value for %s: '%s'\n", a, v ? v : "");
            return 2;
        }
        i++;
    }
    pkv_model_config c;
    if (pkv_model_preset(model, &c) != PKV_OK) {
        fprintf(stderr, "pkv-size: unknown model '%s' (see --help for the presets)\n", model);
        return 2;
    }
    if (c.num_kv_groups) return report_groups(&c, dtype, wdtype, layers || kv_heads || head_dim,
                                              seq, batch, params, have_memory, memory, gpu_util,
                                              json);
    int custom = layers || kv_heads || head_dim;
    if (layers) c.num_layers = (uint32_t)layers;
    if (kv_heads) {
        c.num_kv_heads = (uint32_t)kv_heads;
        if (c.num_kv_heads > c.num_heads) c.num_heads = c.num_kv_heads;
    }
    if (head_dim) c.head_dim = (uint32_t)head_dim;
    if (!seq) seq = c.max_seq_len;
    const uint64_t eb = (uint64_t)dtype_bytes(dtype);
    // An 8-bit KV cache is a cache setting (vLLM's kv_cache_dtype), not the model's:
    // its weights stay fp16 unless --weights-dtype says otherwise.
    pkv_dtype kvd;
    const int kv_quantized = pkv_dtype_from_name(dtype, &kvd) == PKV_OK && pkv_dtype_is_quantized(kvd);
    const uint64_t wb = (uint64_t)dtype_bytes(wdtype ? wdtype : kv_quantized ? "fp16" : dtype);
    if (pkv_model_config_validate(&c) != PKV_OK) {
        fprintf(stderr, "pkv-size: inconsistent shape: %u query heads, %u kv heads (kv heads must "
                        "divide query heads)\n", c.num_heads, c.num_kv_heads);
        return 2;
    }
    // The cache's own geometry: int8's per-token scales and block padding included.
    pkv_cache_params cp = pkv_cache_params_default();
    cp.num_layers = c.num_layers;
    cp.kv_heads = c.num_kv_heads;
    cp.head_dim = c.head_dim;
    cp.block_size = (uint32_t)block;
    pkv_dtype_from_name(dtype, &cp.dtype);
    const uint64_t per_token = pkv_cache_bytes_per_token(&cp);
    const uint64_t per_block = pkv_cache_bytes_per_block(&cp);
    if (per_token == 0 || per_block == 0) {
        fprintf(stderr, "pkv-size: the KV cache of this shape does not fit in 64 bits\n");
        return 2;
    }
    const uint64_t per_request = per_token * seq, total = per_request * batch;
    // Parameters: the preset's unless the shape was overridden (then only --params).
    const uint64_t nparams = params ? params : (custom ? 0 : pkv_model_param_count(&c));
    const uint64_t weights = nparams * wb;
    // The KV budget: (memory - weights) x utilization, pkv_replay_kv_budget's rule
    // (tests/size_cli.py checks that both tools give the same bytes).
    uint64_t fit = 0, left = 0;
    if (have_memory && memory > weights) {
        left = (uint64_t)((double)(memory - weights) * gpu_util);
        fit = per_request ? left / per_request : 0;
    }
    if (json) {
        printf("{\"model\": \"%s\", \"custom_shape\": %s, \"layers\": %u, \"kv_heads\": %u, "
               "\"head_dim\": %u, \"dtype\": \"%s\", \"elem_bytes\": %" PRIu64 ", \"seq\": %" PRIu64
               ", \"batch\": %" PRIu64 ", \"block_size\": %" PRIu64 ", \"kv_bytes_per_block\": %" PRIu64
               ", \"kv_bytes_per_token\": %" PRIu64
               ", \"kv_bytes_per_request\": %" PRIu64 ", \"kv_bytes_total\": %" PRIu64
               ", \"params\": %" PRIu64 ", \"weights_bytes\": %" PRIu64,
               c.name, custom ? "true" : "false", c.num_layers, c.num_kv_heads, c.head_dim, dtype,
               eb, seq, batch, block, per_block, per_token, per_request, total, nparams, weights);
        if (have_memory)
            printf(", \"memory_bytes\": %" PRIu64 ", \"gpu_util\": %g, \"kv_budget_bytes\": %" PRIu64
                   ", \"requests_fit\": %" PRIu64,
                   memory, gpu_util, left, fit);
        printf("}\n");
        return 0;
    }
    printf("model              %s%s\n", c.name, custom ? " (shape overridden)" : "");
    printf("layers             %u\n", c.num_layers);
    printf("kv heads           %u (query heads %u)\n", c.num_kv_heads, c.num_heads);
    printf("head dim           %u\n", c.head_dim);
    printf("dtype              %s (%" PRIu64 " bytes)\n", dtype, eb);
    printf("seq                %" PRIu64 " tokens\n", seq);
    printf("batch              %" PRIu64 "\n", batch);
    printf("kv per token       %" PRIu64 " bytes%s\n", per_token,
           cp.dtype == PKV_DTYPE_INT8 ? " (int8 data + one fp32 scale per token, layer, K/V and kv head)" : "");
    printf("kv per block       %" PRIu64 " bytes (block %" PRIu64 " tokens, padding included)\n",
           per_block, block);
    printf("kv per request     %" PRIu64 " bytes (%.3f GiB)\n", per_request, gib(per_request));
    printf("kv total           %" PRIu64 " bytes (%.3f GiB)\n", total, gib(total));
    if (nparams)
        printf("weights            %" PRIu64 " bytes (%.3f GiB, %" PRIu64 " params x %" PRIu64 ")\n",
               weights, gib(weights), nparams, wb);
    else
        printf("weights            unknown (shape overridden; give --params)\n");
    if (have_memory) {
        printf("memory             %" PRIu64 " bytes (%.3f GiB)\n", memory, gib(memory));
        if (memory <= weights)
            printf("requests that fit  0 (the weights alone need %.3f GiB)\n", gib(weights));
        else
            printf("kv budget          %" PRIu64 " bytes (%.3f GiB: (memory - weights) x %g)\n"
                   "requests that fit  %" PRIu64 " of %" PRIu64 " tokens\n",
                   left, gib(left), gpu_util, fit, seq);
    }
    return 0;
}

// SPDX-License-Identifier: MIT
// pkv-generate: run the decoder on a prompt of token ids (or the bytes of a
// text) and print the generated ids, the prefill time and the decode time per
// token; with --no-cache it also runs the full-recompute path on the same
// prompt, so the O(n) cached step and the O(n^2) recompute are side by side.
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "pkv/generate.h"
#include "pkv/model.h"
#include "cli.h"

static void usage(FILE *f) {
    fprintf(f,
            "usage: pkv-generate [options] TOKEN_ID...\n"
            "Generate tokens with the pagedkv decoder (random weights from --seed, or --load).\n"
            "  --model NAME          preset (default tiny): ");
    const char *const *names = pkv_model_preset_names();
    for (int i = 0; names[i]; i++) fprintf(f, "%s%s", i ? ", " : "", names[i]);
    fprintf(f,
            "\n"
            "  --load FILE           weights from a llama2.c checkpoint instead of a preset\n"
            "  --text STRING         prompt = the bytes of STRING (needs vocab >= 256)\n"
            "  --max-new N           tokens to generate (default 16)\n"
            "  --seed N              seed of the random weights and of sampling (default 1)\n"
            "  --layout L            paged | contiguous (default paged)\n"
            "  --block-size N        paged block size in tokens (default 16)\n"
            "  --kv-dtype T          KV cache element type: fp32, fp16, bf16, or 8-bit int8,\n"
            "                        fp8_e4m3, fp8_e5m2 (paged or contiguous; default fp32)\n"
            "  --no-cache            recompute the whole sequence every step; also runs the\n"
            "                        cached path to show both timings and check equal tokens\n"
            "  --backend B           cpu | cuda (default cpu)\n"
            "  --temperature T       0 = greedy (default 0)\n"
            "  --top-k K             sample among the K largest logits (default 0 = all)\n"
            "  --n N                 parallel samples of the prompt (fork after prefill)\n"
            "  --eos ID              stop a sample after this token\n"
            "  --threads N           CPU attention threads, 0 = all cores (default 1: decode of\n"
            "                        small models is memory-bound and an OpenMP team that\n"
            "                        spin-waits next to BLAS threads costs more than it saves)\n"
            "  --profile             share of time in attention, QKV/output/FFN GEMMs, the rest\n"
            "  --json                one JSON object on stdout\n"
            "  --help                this text\n"
            "exit status: 0 ok, 1 runtime failure, 2 bad usage or input\n"
            "example: pkv-generate --model tiny --max-new 8 1 2 3 4\n");
}

typedef struct timing {
    pkv_gen_stats st;
    pkv_model_profile prof;
} timing;

static double per_token_ms(const pkv_gen_stats *s, uint32_t n) {
    uint64_t decoded = s->generated_tokens > n ? s->generated_tokens - n : 0;
    return decoded ? 1e3 * s->decode_seconds / (double)decoded : 0.0;
}

static int run(pkv_model *m, const pkv_gen_params *p, const pkv_gen_request *req,
               pkv_gen_output *out, timing *t) {
    pkv_model_reset_profile(m);
    pkv_status st = pkv_generate(m, p, 1, req, out, &t->st);
    if (st != PKV_OK) {
        fprintf(stderr, "pkv-generate: generation (%s) failed: %s\n", pkv_kv_mode_name(p->kv_mode),
                pkv_status_str(st));
        return 1;
    }
    pkv_model_get_profile(m, &t->prof);
    return 0;
}

static void print_profile(const pkv_model_profile *pr, int json) {
    const double tot = pr->total > 0 ? pr->total : 1e-30;
    const char *names[7] = {"attention", "gemm_qkv", "gemm_out", "gemm_ffn", "lm_head", "other", "bookkeeping"};
    double v[7] = {pr->attention, pr->gemm_qkv, pr->gemm_out, pr->gemm_ffn, pr->lm_head, pr->other,
                   pr->bookkeeping};
    double rest = pr->total;
    for (int i = 0; i < 7; i++) rest -= v[i];
    if (json) {
        printf(", \"profile\": {");
        for (int i = 0; i < 7; i++) printf("%s\"%s_s\": %.6f", i ? ", " : "", names[i], v[i]);
        printf(", \"untimed_s\": %.6f, \"total_s\": %.6f}", rest > 0 ? rest : 0.0, pr->total);
        return;
    }
    printf("profile (share of forward time, %.3f ms total):\n", 1e3 * pr->total);
    for (int i = 0; i < 7; i++) printf("  %-12s %6.2f %%  %9.3f ms\n", names[i], 100 * v[i] / tot, 1e3 * v[i]);
    printf("  %-12s %6.2f %%  %9.3f ms\n", "untimed", 100 * (rest > 0 ? rest : 0) / tot,
           1e3 * (rest > 0 ? rest : 0));
}

int main(int argc, char **argv) {
    const char *model_name = "tiny", *load = NULL, *text = NULL;
    pkv_gen_params gp = pkv_gen_params_default();
    pkv_model_params mp = pkv_model_params_default();
    mp.num_threads = 1;
    int no_cache = 0, json = 0;
    uint64_t v = 0;
    int32_t *prompt = calloc((size_t)argc + 1, sizeof *prompt);
    uint32_t plen = 0;
    if (!prompt) return 1;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *val = i + 1 < argc ? argv[i + 1] : NULL;
        int ok = 1, takes = 1;
        if (strcmp(a, "--help") == 0 || strcmp(a, "-h") == 0) {
            usage(stdout);
            free(prompt);
            return 0;
        } else if (strcmp(a, "--no-cache") == 0) {
            no_cache = 1, takes = 0;
        } else if (strcmp(a, "--json") == 0) {
            json = 1, takes = 0;
        } else if (strcmp(a, "--profile") == 0) {
            mp.profile = 1, takes = 0;
        } else if (strcmp(a, "--model") == 0) {
            model_name = val, ok = val != NULL;
        } else if (strcmp(a, "--load") == 0) {
            load = val, ok = val != NULL;
        } else if (strcmp(a, "--text") == 0) {
            text = val, ok = val != NULL && *val;
        } else if (strcmp(a, "--max-new") == 0) {
            ok = cli_parse_u64(val, &v) && v > 0 && v < (1u << 24), gp.max_new_tokens = (uint32_t)v;
        } else if (strcmp(a, "--seed") == 0) {
            ok = cli_parse_u64(val, &v), gp.seed = mp.seed = v;
        } else if (strcmp(a, "--block-size") == 0) {
            ok = cli_parse_u64(val, &v) && v > 0 && v <= 65536, gp.block_size = (uint32_t)v;
        } else if (strcmp(a, "--n") == 0) {
            ok = cli_parse_u64(val, &v) && v > 0 && v <= 1024, gp.n = (uint32_t)v;
        } else if (strcmp(a, "--top-k") == 0) {
            ok = cli_parse_u64(val, &v) && v < (1u << 31), gp.top_k = (uint32_t)v;
        } else if (strcmp(a, "--eos") == 0) {
            ok = cli_parse_u64(val, &v) && v < (1u << 31), gp.eos_token = (int32_t)v;
        } else if (strcmp(a, "--threads") == 0) {
            ok = cli_parse_u64(val, &v) && v < 4096, mp.num_threads = (uint32_t)v;
        } else if (strcmp(a, "--temperature") == 0) {
            char *end = NULL;
            gp.temperature = val ? strtof(val, &end) : -1.0f;
            ok = val && end && !*end && gp.temperature >= 0.0f && gp.temperature < 1e6f;
        } else if (strcmp(a, "--layout") == 0) {
            ok = val && (strcmp(val, "paged") == 0 || strcmp(val, "contiguous") == 0);
            if (ok) gp.kv_mode = strcmp(val, "paged") == 0 ? PKV_KV_PAGED : PKV_KV_CONTIGUOUS;
        } else if (strcmp(a, "--kv-dtype") == 0) {
            ok = val && pkv_dtype_from_name(val, &gp.kv_dtype) == PKV_OK;
        } else if (strcmp(a, "--backend") == 0) {
            ok = val && (strcmp(val, "cpu") == 0 || strcmp(val, "cuda") == 0);
            if (ok) mp.device = strcmp(val, "cpu") == 0 ? PKV_DEVICE_CPU : PKV_DEVICE_CUDA;
        } else if (a[0] == '-' && a[1] == '-') {
            fprintf(stderr, "pkv-generate: unknown option '%s' (see --help)\n", a);
            free(prompt);
            return 2;
        } else {
            takes = 0;
            ok = cli_parse_u64(a, &v) && v < (1u << 31);
            if (!ok) {
                fprintf(stderr, "pkv-generate: '%s' is not a token id (a non-negative integer)\n", a);
                free(prompt);
                return 2;
            }
            prompt[plen++] = (int32_t)v;
        }
        if (!ok) {
            fprintf(stderr, "pkv-generate: bad or missing value for %s: '%s'\n", a, val ? val : "");
            free(prompt);
            return 2;
        }
        i += takes;
    }
    if (text) {
        if (plen) {
            fprintf(stderr, "pkv-generate: give either --text or token ids, not both\n");
            free(prompt);
            return 2;
        }
        size_t n = strlen(text);
        free(prompt);
        prompt = malloc(n * sizeof *prompt);
        if (!prompt) return 1;
        for (size_t i = 0; i < n; i++) prompt[plen++] = (unsigned char)text[i];
    }
    if (plen == 0) {
        fprintf(stderr, "pkv-generate: no prompt: give token ids or --text (see --help)\n");
        free(prompt);
        return 2;
    }
    // Build the model: a preset whose fp32 weights fit this machine, or a file.
    pkv_model *m = NULL;
    pkv_model_config c;
    pkv_status st;
    if (load) {
        char err[512];
        st = pkv_model_load_llama2c(load, &mp, &m, err, sizeof err);
        if (st != PKV_OK) {
            fprintf(stderr, "pkv-generate: %s\n", err);
            free(prompt);
            return st == PKV_ERR_IO || st == PKV_ERR_FORMAT ? 2 : 1;
        }
    } else {
        if (pkv_model_preset(model_name, &c) != PKV_OK) {
            fprintf(stderr, "pkv-generate: unknown model '%s' (see --help for the presets)\n", model_name);
            free(prompt);
            return 2;
        }
        uint64_t wbytes = pkv_model_weight_bytes(&c);
        long pages = sysconf(_SC_PHYS_PAGES), psize = sysconf(_SC_PAGE_SIZE);
        uint64_t phys = pages > 0 && psize > 0 ? (uint64_t)pages * (uint64_t)psize : 0;
        // Leave a quarter of the machine for activations, the KV cache and the OS.
        if (mp.device == PKV_DEVICE_CPU && phys && wbytes > phys / 4 * 3) {
            fprintf(stderr,
                    "pkv-generate: model %s needs %.1f GiB of fp32 weights; this machine has %.1f GiB "
                    "of memory. Use pkv-size or the replay simulator for this model.\n",
                    model_name, (double)wbytes / 1073741824.0, (double)phys / 1073741824.0);
            free(prompt);
            return 2;
        }
        st = pkv_model_create(&c, &mp, &m);
        if (st != PKV_OK) {
            fprintf(stderr, "pkv-generate: cannot create model %s on %s: %s\n", model_name,
                    pkv_device_name(mp.device), pkv_status_str(st));
            free(prompt);
            return 1;
        }
    }
    pkv_model_get_config(m, &c);
    for (uint32_t i = 0; i < plen; i++)
        if ((uint32_t)prompt[i] >= c.vocab_size) {
            fprintf(stderr, "pkv-generate: token %d is outside the vocabulary of %s (%u ids)%s\n",
                    prompt[i], c.name, c.vocab_size, text ? "; --text needs vocab >= 256" : "");
            pkv_model_destroy(m);
            free(prompt);
            return 2;
        }
    if (c.pos == PKV_POS_LEARNED && (uint64_t)plen + gp.max_new_tokens > c.max_seq_len) {
        fprintf(stderr, "pkv-generate: prompt (%u) + --max-new (%u) exceeds the context of %s (%u)\n",
                plen, gp.max_new_tokens, c.name, c.max_seq_len);
        pkv_model_destroy(m);
        free(prompt);
        return 2;
    }
    const uint32_t O = gp.n, N = gp.max_new_tokens;
    int32_t *toks = calloc((size_t)O * N, sizeof *toks), *toks_nc = calloc((size_t)O * N, sizeof *toks);
    pkv_gen_output *out = calloc(O, sizeof *out), *out_nc = calloc(O, sizeof *out);
    if (!toks || !toks_nc || !out || !out_nc) return 1;
    for (uint32_t o = 0; o < O; o++) {
        out[o].tokens = toks + (size_t)o * N;
        out_nc[o].tokens = toks_nc + (size_t)o * N;
    }
    pkv_gen_request req = {prompt, plen};
    // One untimed token first: thread pools and scratch buffers start here, not
    // inside the prefill time.
    uint32_t one = 1;
    st = pkv_model_forward_nocache(m, 1, &one, prompt, NULL, NULL);
    if (st != PKV_OK) {
        fprintf(stderr, "pkv-generate: forward pass failed: %s\n", pkv_status_str(st));
        free(toks), free(toks_nc), free(out), free(out_nc), free(prompt);
        pkv_model_destroy(m);
        return 1;
    }
    timing t_cache, t_nc;
    int rc = run(m, &gp, &req, out, &t_cache);
    int match = 1;
    if (rc == 0 && no_cache) {
        pkv_gen_params np = gp;
        np.kv_mode = PKV_KV_NONE;
        rc = run(m, &np, &req, out_nc, &t_nc);
        for (uint32_t o = 0; rc == 0 && o < O; o++)
            match &= out[o].num_tokens == out_nc[o].num_tokens &&
                     memcmp(out[o].tokens, out_nc[o].tokens, out[o].num_tokens * sizeof(int32_t)) == 0;
    }
    if (rc == 0) {
        const pkv_gen_output *shown = no_cache ? out_nc : out;
        const timing *tm = no_cache ? &t_nc : &t_cache;
        const char *layout = no_cache ? "none" : pkv_kv_mode_name(gp.kv_mode);
        if (json) {
            printf("{\"model\": \"%s\", \"backend\": \"%s\", \"layout\": \"%s\", \"block_size\": %u, "
                   "\"kv_dtype\": \"%s\", \"prompt_tokens\": %u, \"n\": %u, \"outputs\": [",
                   c.name, pkv_device_name(mp.device), layout, gp.block_size,
                   pkv_dtype_name(gp.kv_dtype), plen, O);
            for (uint32_t o = 0; o < O; o++) {
                printf("%s[", o ? ", " : "");
                for (uint32_t i = 0; i < shown[o].num_tokens; i++) printf("%s%d", i ? ", " : "", shown[o].tokens[i]);
                printf("]");
            }
            printf("], \"prefill_ms\": %.4f, \"decode_ms_per_token\": %.4f, \"decode_steps\": %u, "
                   "\"peak_blocks\": %u, \"kv_bytes_peak\": %" PRIu64 ", \"cow_copies\": %" PRIu64,
                   1e3 * tm->st.prefill_seconds, per_token_ms(&tm->st, O), tm->st.decode_steps,
                   t_cache.st.peak_blocks, t_cache.st.kv_bytes_peak, t_cache.st.cow_copies);
            if (no_cache)
                printf(", \"cached_layout\": \"%s\", \"cached_prefill_ms\": %.4f, "
                       "\"cached_decode_ms_per_token\": %.4f, \"tokens_match_cached\": %s",
                       pkv_kv_mode_name(gp.kv_mode), 1e3 * t_cache.st.prefill_seconds,
                       per_token_ms(&t_cache.st, O), match ? "true" : "false");
            if (mp.profile) print_profile(&tm->prof, 1);
            printf("}\n");
        } else {
            printf("model: %s (%u layers, d_model %u, %u heads / %u kv heads, vocab %u), backend %s, "
                   "layout %s",
                   c.name, c.num_layers, c.d_model, c.num_heads, c.num_kv_heads, c.vocab_size,
                   pkv_device_name(mp.device), layout);
            if (!no_cache && gp.kv_mode == PKV_KV_PAGED) printf(" (block %u)", gp.block_size);
            if (!no_cache) printf(", kv %s", pkv_dtype_name(gp.kv_dtype));
            printf("\nprompt: %u tokens\n", plen);
            for (uint32_t o = 0; o < O; o++) {
                printf("tokens:");
                for (uint32_t i = 0; i < shown[o].num_tokens; i++) printf(" %d", shown[o].tokens[i]);
                printf("%s\n", shown[o].hit_eos ? " (eos)" : "");
            }
            printf("prefill: %.3f ms (%u tokens)\n", 1e3 * tm->st.prefill_seconds, plen);
            printf("decode: %.3f ms/token (%" PRIu64 " tokens, %u steps)\n", per_token_ms(&tm->st, O),
                   tm->st.generated_tokens, tm->st.decode_steps);
            if (no_cache) {
                printf("with cache (%s): prefill %.3f ms, decode %.3f ms/token; recompute / cache = "
                       "%.1fx per token; tokens %s\n",
                       pkv_kv_mode_name(gp.kv_mode), 1e3 * t_cache.st.prefill_seconds,
                       per_token_ms(&t_cache.st, O),
                       per_token_ms(&t_cache.st, O) > 0 ? per_token_ms(&t_nc.st, O) / per_token_ms(&t_cache.st, O) : 0.0,
                       match ? "identical" : "DIFFER");
            } else if (gp.kv_mode == PKV_KV_PAGED) {
                printf("kv: peak %u blocks (%" PRIu64 " bytes), %" PRIu64 " copy-on-write copies\n",
                       t_cache.st.peak_blocks, t_cache.st.kv_bytes_peak, t_cache.st.cow_copies);
            } else {
                printf("kv: contiguous store of %" PRIu64 " bytes\n", t_cache.st.kv_bytes_peak);
            }
            if (mp.profile) print_profile(&tm->prof, 0);
        }
        if (!match) {
            fprintf(stderr, "pkv-generate: cached and recomputed tokens differ\n");
            rc = 1;
        }
    }
    free(toks);
    free(toks_nc);
    free(out);
    free(out_nc);
    free(prompt);
    pkv_model_destroy(m);
    return rc;
}

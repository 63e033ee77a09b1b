// SPDX-License-Identifier: MIT
// bench_kv_quant: what an 8-bit KV cache costs in accuracy (issue 13).
//  1. Attention: decode over a paged cache per storage dtype against a double
//     precision reference on the original fp32 K/V, on random K/V and on K/V
//     with outlier channels (a few K channels ~20x larger, V channels ~4x, as
//     real models have). Per output row (sequence, head): relative L2 error
//     ||out - ref|| / ||ref||; reported: max and mean over rows.
//  2. Decoder: a model with random weights, greedy decoding from a few prompts.
//     The fp32 cache's run is the reference; each dtype is teacher-forced on the
//     reference tokens (same inputs every step) and we report the KL divergence
//     KL(p_fp32 || p_dtype) of the next-token distributions (mean, max over
//     steps), the greedy (argmax) agreement per step, and, free running, the
//     number of tokens generated identically before the first divergence.
// fp8 scales are per layer, from the first forward pass (calculate_kv_scales);
// int8 scales are per token and head. fp16 / bf16 are shown as baselines.
// Tables on stdout, --json for one JSON object.
#include <errno.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "pkv/pkv.h"
#include "src/attention/half.h"
#include "src/attention/quant.h"

static const pkv_dtype dtypes[] = {PKV_DTYPE_F16, PKV_DTYPE_BF16, PKV_DTYPE_INT8,
                                   PKV_DTYPE_FP8_E4M3, PKV_DTYPE_FP8_E5M2};
#define NDT 5

static uint64_t rng_state = 0x853c49e6748fea9bull;

static double rng_unit(void) { // [-1, 1), splitmix64
    uint64_t z = (rng_state += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    z ^= z >> 31;
    return (double)(z >> 11) / (double)(1ull << 53) * 2.0 - 1.0;
}

static void usage(FILE *f) {
    fprintf(f, "usage: bench_kv_quant [--model NAME] [--steps N] [--prompts N] [--context N] [--json]\n"
               "Accuracy of 8-bit KV caches: attention error vs fp32 and decoder KL / greedy\n"
               "agreement vs an fp32 cache.\n"
               "  --model NAME   preset with random weights (default tiny)\n"
               "  --steps N      decode steps per prompt (default 300)\n"
               "  --prompts N    prompts (default 4)\n"
               "  --context N    attention test context length (default 1024)\n"
               "  --seed N       model weights seed (default 1)\n"
               "  --json         one JSON object instead of the tables\n"
               "Exit: 0 ok, 1 runtime failure, 2 bad usage.\n");
}

#define TRY(x)                                                                                 \
    do {                                                                                       \
        pkv_status st_ = (x);                                                                  \
        if (st_ != PKV_OK) {                                                                   \
            fprintf(stderr, "bench_kv_quant: %s failed: %s\n", #x, pkv_status_str(st_));      \
            exit(1);                                                                           \
        }                                                                                      \
    } while (0)

// ---------------------------------------------------------------- attention

typedef struct att_err {
    double max_rel, mean_rel;
} att_err;

// Decode attention of S sequences of `ctx` tokens (H heads, KVH kv heads, dim D,
// block B) on a pkv_cache of dtype dt, vs the double reference on k/v.
static att_err attention_error(pkv_dtype dt, int outliers, uint32_t ctx) {
    const uint32_t S = 4, H = 8, KVH = 2, D = 128, B = 16;
    const uint32_t nb = S * ((ctx + B - 1) / B);
    pkv_pool *pool;
    pkv_backend *host;
    pkv_cache *cache;
    TRY(pkv_pool_create(nb, &pool));
    TRY(pkv_backend_create_host(&host));
    pkv_cache_params p = pkv_cache_params_default();
    p.kv_heads = KVH;
    p.head_dim = D;
    p.block_size = B;
    p.dtype = dt;
    TRY(pkv_cache_create(&p, pool, host, &cache));
    pkv_cache_geometry g;
    TRY(pkv_cache_get_geometry(cache, &g));
    const size_t n = (size_t)S * ctx * KVH * D; // [S][ctx][KVH][D]
    float *k = malloc(n * sizeof *k), *v = malloc(n * sizeof *v);
    float *q = malloc((size_t)S * H * D * sizeof *q);
    int32_t *table = malloc((size_t)nb * sizeof *table);
    int32_t *lens = malloc(S * sizeof *lens);
    int64_t *slots = malloc((size_t)S * ctx * sizeof *slots);
    if (!k || !v || !q || !table || !lens || !slots) exit(1);
    for (size_t i = 0; i < n; i++) {
        uint32_t d = (uint32_t)(i % D);
        double kx = rng_unit(), vx = rng_unit();
        if (outliers && d % 32 == 7) kx *= 20.0; // 4 of 128 K channels
        if (outliers && d % 64 == 11) vx *= 4.0;
        k[i] = (float)kx;
        v[i] = (float)vx;
    }
    for (size_t i = 0; i < (size_t)S * H * D; i++) q[i] = (float)rng_unit();
    for (uint32_t b = 0; b < nb; b++) table[b] = (int32_t)((b * 7919u) % nb); // scattered
    for (uint32_t s = 0; s < S; s++) {
        lens[s] = (int32_t)ctx;
        for (uint32_t t = 0; t < ctx; t++)
            slots[(size_t)s * ctx + t] =
                (int64_t)table[s * (nb / S) + t / B] * B + t % B;
    }
    float kmax = 0.0f, vmax = 0.0f;
    for (size_t i = 0; i < n; i++) {
        kmax = fmaxf(kmax, fabsf(k[i]));
        vmax = fmaxf(vmax, fabsf(v[i]));
    }
    char *kc = pkv_cache_data(cache);
    pkv_attn_shape sh = {H, KVH, D, PKV_DTYPE_F32, 1.0f / sqrtf((float)D), 0};
    pkv_attn_kv_quant qz = {dt, kmax / pkvi_quant_max(dt), vmax / pkvi_quant_max(dt),
                            g.scale_offset, g.scale_head_stride, g.scale_token_stride};
    pkv_attn_paged_kv kv = {kc, kc + g.kv_stride, g.block_stride, g.head_stride, g.token_stride,
                            B, nb, table, nb / S, lens};
    float *out = malloc((size_t)S * H * D * sizeof *out);
    if (!out) exit(1);
    if (pkv_dtype_is_quantized(dt)) {
        TRY(pkv_attn_cache_write_quant_cpu(&sh, &qz, S * ctx, k, v, slots, kc, kc + g.kv_stride,
                                           g.block_stride, g.head_stride, g.token_stride, B, nb));
        TRY(pkv_attn_decode_paged_quant_cpu(&sh, &qz, S, q, &kv, out));
    } else {
        // 16-bit baselines: q, K, V and out all in dt (the plain API's contract).
        uint16_t *k16 = malloc(n * 2), *v16 = malloc(n * 2);
        uint16_t *q16 = malloc((size_t)S * H * D * 2), *o16 = malloc((size_t)S * H * D * 2);
        if (!k16 || !v16 || !q16 || !o16) exit(1);
        uint16_t (*to)(float) = dt == PKV_DTYPE_F16 ? pkvi_f32_to_f16 : pkvi_f32_to_bf16;
        float (*from)(uint16_t) = dt == PKV_DTYPE_F16 ? pkvi_f16_to_f32 : pkvi_bf16_to_f32;
        for (size_t i = 0; i < n; i++) k16[i] = to(k[i]), v16[i] = to(v[i]);
        for (size_t i = 0; i < (size_t)S * H * D; i++) q16[i] = to(q[i]);
        pkv_attn_shape s16 = sh;
        s16.dtype = dt;
        TRY(pkv_attn_cache_write_cpu(&s16, S * ctx, k16, v16, slots, kc, kc + g.kv_stride * 2,
                                     g.block_stride, g.head_stride, g.token_stride, B, nb));
        kv.v_cache = kc + g.kv_stride * 2;
        TRY(pkv_attn_decode_paged_cpu(&s16, S, q16, &kv, o16));
        for (size_t i = 0; i < (size_t)S * H * D; i++) out[i] = from(o16[i]);
        free(k16), free(v16), free(q16), free(o16);
    }
    att_err e = {0, 0};
    double *sc = malloc(ctx * sizeof *sc), *ref = malloc(D * sizeof *ref);
    if (!sc || !ref) exit(1);
    for (uint32_t s = 0; s < S; s++) {
        for (uint32_t h = 0; h < H; h++) {
            const float *qr = q + ((size_t)s * H + h) * D;
            uint32_t kh = h / (H / KVH);
            double mx = -INFINITY, sum = 0.0;
            for (uint32_t t = 0; t < ctx; t++) {
                const float *kr = k + (((size_t)s * ctx + t) * KVH + kh) * D;
                double dot = 0.0;
                for (uint32_t d = 0; d < D; d++) dot += (double)qr[d] * kr[d];
                sc[t] = dot / sqrt((double)D);
                mx = fmax(mx, sc[t]);
            }
            for (uint32_t d = 0; d < D; d++) ref[d] = 0.0;
            for (uint32_t t = 0; t < ctx; t++) {
                double w = exp(sc[t] - mx);
                sum += w;
                const float *vr = v + (((size_t)s * ctx + t) * KVH + kh) * D;
                for (uint32_t d = 0; d < D; d++) ref[d] += w * vr[d];
            }
            double num = 0.0, den = 0.0;
            for (uint32_t d = 0; d < D; d++) {
                double r = ref[d] / sum, o = out[((size_t)s * H + h) * D + d];
                num += (o - r) * (o - r);
                den += r * r;
            }
            double rel = sqrt(num / den);
            e.max_rel = fmax(e.max_rel, rel);
            e.mean_rel += rel / (S * H);
        }
    }
    free(sc), free(ref), free(out), free(k), free(v), free(q), free(table), free(lens), free(slots);
    pkv_cache_destroy(cache);
    pkv_backend_destroy(host);
    pkv_pool_destroy(pool);
    return e;
}

// ---------------------------------------------------------------- decoder

typedef struct dec_acc {
    double kl_sum, kl_max;
    uint64_t steps, agree, free_prefix, free_match, free_total;
} dec_acc;

// One paged session: a cache of dtype dt for one sequence of up to cap tokens.
typedef struct session {
    pkv_pool *pool;
    pkv_backend *host;
    pkv_cache *cache;
    pkv_seqset *set;
    pkv_seq_id id;
} session;

static void session_open(session *s, pkv_model *m, pkv_dtype dt, uint32_t cap) {
    const uint32_t B = 16;
    pkv_cache_params cp;
    TRY(pkv_model_cache_params(m, B, &cp));
    cp.dtype = dt;
    TRY(pkv_pool_create((cap + B - 1) / B, &s->pool));
    TRY(pkv_backend_create_host(&s->host));
    TRY(pkv_cache_create(&cp, s->pool, s->host, &s->cache));
    TRY(pkv_seqset_create(s->pool, B, &s->set));
    TRY(pkv_seq_create(s->set, &s->id));
    // fp8: recalibrate the per-layer scales on this session's first forward pass.
    pkv_model_config c;
    TRY(pkv_model_get_config(m, &c));
    float *zeros = calloc(2 * (size_t)c.num_layers, sizeof(float));
    if (!zeros) exit(1);
    TRY(pkv_model_set_kv_scales(m, zeros));
    free(zeros);
}

static void session_close(session *s) {
    pkv_seqset_destroy(s->set);
    pkv_cache_destroy(s->cache);
    pkv_backend_destroy(s->host);
    pkv_pool_destroy(s->pool);
}

// Run prompt then `steps` decode steps. forced != NULL: feed forced[i] at step i
// (teacher forcing), else feed the argmax. logits: [steps + 1][V] written,
// tokens: [steps + 1] the argmax after the prompt and after each step.
static void run_session(pkv_model *m, pkv_dtype dt, const int32_t *prompt, uint32_t plen,
                        uint32_t steps, const int32_t *forced, float *logits, int32_t *tokens,
                        uint32_t V) {
    session s;
    session_open(&s, m, dt, plen + steps + 1);
    TRY(pkv_seq_append(s.set, s.id, plen, NULL));
    TRY(pkv_model_prefill_paged(m, s.cache, s.set, 1, &s.id, &plen, prompt, logits, tokens));
    for (uint32_t i = 0; i < steps; i++) {
        int32_t tok = forced ? forced[i] : tokens[i];
        TRY(pkv_seq_append(s.set, s.id, 1, NULL));
        TRY(pkv_model_decode_paged(m, s.cache, s.set, 1, &s.id, &tok,
                                   logits + (size_t)(i + 1) * V, tokens + i + 1));
    }
    session_close(&s);
}

// KL(p || q) of two logit rows (softmax in double).
static double kl_logits(const float *a, const float *b, uint32_t V) {
    double ma = -INFINITY, mb = -INFINITY, za = 0.0, zb = 0.0;
    for (uint32_t i = 0; i < V; i++) ma = fmax(ma, a[i]), mb = fmax(mb, b[i]);
    for (uint32_t i = 0; i < V; i++) za += exp(a[i] - ma), zb += exp(b[i] - mb);
    double kl = 0.0;
    for (uint32_t i = 0; i < V; i++) {
        double lp = a[i] - ma - log(za), lq = b[i] - mb - log(zb);
        kl += exp(lp) * (lp - lq);
    }
    return kl > 0.0 ? kl : 0.0;
}

int main(int argc, char **argv) {
    const char *model_name = "tiny";
    uint32_t steps = 300, prompts = 4, ctx = 1024;
    uint64_t seed = 1;
    int json = 0;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        const char *val = i + 1 < argc ? argv[i + 1] : NULL;
        char *end = NULL;
        if (strcmp(a, "--help") == 0) {
            usage(stdout);
            return 0;
        } else if (strcmp(a, "--json") == 0) {
            json = 1;
            continue;
        } else if (strcmp(a, "--model") == 0 && val) {
            model_name = val;
        } else if ((strcmp(a, "--steps") == 0 || strcmp(a, "--prompts") == 0 ||
                    strcmp(a, "--context") == 0 || strcmp(a, "--seed") == 0) && val) {
            errno = 0;
            unsigned long long x = strtoull(val, &end, 10);
            if (errno || !end || *end || x == 0 || x > 100000) {
                fprintf(stderr, "bench_kv_quant: bad value for %s: '%s'\n", a, val);
                return 2;
            }
            if (a[2] == 's' && a[3] == 't') steps = (uint32_t)x;
            else if (a[2] == 'p') prompts = (uint32_t)x;
            else if (a[2] == 'c') ctx = (uint32_t)x;
            else seed = x;
        } else {
            fprintf(stderr, "bench_kv_quant: unknown or incomplete option '%s' (see --help)\n", a);
            return 2;
        }
        i++;
    }
    pkv_model_config c;
    if (pkv_model_preset(model_name, &c) != PKV_OK) {
        fprintf(stderr, "bench_kv_quant: unknown model '%s'\n", model_name);
        return 2;
    }
    // 1. Attention error.
    att_err att[2][NDT];
    for (int o = 0; o < 2; o++)
        for (int d = 0; d < NDT; d++) att[o][d] = attention_error(dtypes[d], o, ctx);

    // 2. Decoder.
    pkv_model_params mp = pkv_model_params_default();
    mp.seed = seed;
    mp.num_threads = 1;
    pkv_model *m;
    TRY(pkv_model_create(&c, &mp, &m));
    const uint32_t V = c.vocab_size, plen = 16;
    if (c.pos == PKV_POS_LEARNED && plen + steps + 1 > c.max_seq_len) steps = c.max_seq_len - plen - 1;
    float *ref = malloc((size_t)(steps + 1) * V * sizeof *ref);
    float *got = malloc((size_t)(steps + 1) * V * sizeof *got);
    int32_t *rtok = malloc((steps + 1) * sizeof *rtok), *gtok = malloc((steps + 1) * sizeof *gtok);
    int32_t prompt[16];
    if (!ref || !got || !rtok || !gtok) return 1;
    dec_acc acc[NDT];
    memset(acc, 0, sizeof acc);
    for (uint32_t pr = 0; pr < prompts; pr++) {
        for (uint32_t i = 0; i < plen; i++) prompt[i] = (int32_t)((rng_unit() + 1.0) / 2.0 * (V - 1));
        run_session(m, PKV_DTYPE_F32, prompt, plen, steps, NULL, ref, rtok, V);
        for (int d = 0; d < NDT; d++) {
            dec_acc *a = &acc[d];
            run_session(m, dtypes[d], prompt, plen, steps, rtok, got, gtok, V);
            for (uint32_t i = 0; i <= steps; i++) {
                double kl = kl_logits(ref + (size_t)i * V, got + (size_t)i * V, V);
                a->kl_sum += kl;
                a->kl_max = fmax(a->kl_max, kl);
                a->agree += gtok[i] == rtok[i];
                a->steps++;
            }
            run_session(m, dtypes[d], prompt, plen, steps, NULL, got, gtok, V);
            uint32_t prefix = 0;
            while (prefix <= steps && gtok[prefix] == rtok[prefix]) prefix++;
            uint64_t match = 0;
            for (uint32_t i = 0; i <= steps; i++) match += gtok[i] == rtok[i];
            a->free_prefix += prefix;
            a->free_match += match;
            a->free_total += steps + 1;
        }
    }
    pkv_model_destroy(m);
    free(ref), free(got), free(rtok), free(gtok);

    if (json) {
        printf("{\"model\": \"%s\", \"seed\": %llu, \"steps\": %u, \"prompts\": %u, \"context\": %u, "
               "\"dtypes\": [",
               c.name, (unsigned long long)seed, steps, prompts, ctx);
        for (int d = 0; d < NDT; d++) {
            const dec_acc *a = &acc[d];
            printf("%s{\"dtype\": \"%s\", \"attn_random_max_rel\": %.6g, \"attn_random_mean_rel\": %.6g, "
                   "\"attn_outlier_max_rel\": %.6g, \"attn_outlier_mean_rel\": %.6g, "
                   "\"kl_mean\": %.6g, \"kl_max\": %.6g, \"greedy_agreement\": %.6f, "
                   "\"free_run_prefix_mean\": %.2f, \"free_run_match\": %.6f}",
                   d ? ", " : "", pkv_dtype_name(dtypes[d]), att[0][d].max_rel, att[0][d].mean_rel,
                   att[1][d].max_rel, att[1][d].mean_rel, a->kl_sum / (double)a->steps, a->kl_max,
                   (double)a->agree / (double)a->steps, (double)a->free_prefix / prompts,
                   (double)a->free_match / (double)a->free_total);
        }
        printf("]}\n");
        return 0;
    }
    printf("Attention vs fp32 reference (decode, 4 seqs x 8 heads (2 kv), head_dim 128, "
           "context %u): relative L2 error per output row\n", ctx);
    printf("%-10s %14s %14s %14s %14s\n", "dtype", "random max", "random mean", "outlier max",
           "outlier mean");
    for (int d = 0; d < NDT; d++)
        printf("%-10s %14.3e %14.3e %14.3e %14.3e\n", pkv_dtype_name(dtypes[d]), att[0][d].max_rel,
               att[0][d].mean_rel, att[1][d].max_rel, att[1][d].mean_rel);
    printf("\nDecoder '%s' (random weights, seed %llu), %u prompts x %u steps, vs the fp32 cache\n",
           c.name, (unsigned long long)seed, prompts, steps);
    printf("%-10s %12s %12s %12s %18s %14s\n", "dtype", "KL mean", "KL max", "greedy agree",
           "free-run prefix", "free-run match");
    for (int d = 0; d < NDT; d++) {
        const dec_acc *a = &acc[d];
        printf("%-10s %12.3e %12.3e %11.2f%% %18.1f %13.2f%%\n", pkv_dtype_name(dtypes[d]),
               a->kl_sum / (double)a->steps, a->kl_max, 100.0 * (double)a->agree / (double)a->steps,
               (double)a->free_prefix / prompts, 100.0 * (double)a->free_match / (double)a->free_total);
    }
    return 0;
}

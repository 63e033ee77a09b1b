// SPDX-License-Identifier: MIT
// pkv-replay: replay a request trace through one or every KV-cache policy and
// print the comparison (table on stdout, --json for machines, --timeline CSV
// per step for plots). Exit codes: 0 ok, 1 runtime failure, 2 bad usage or input.
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "pkv/replay.h"
#include "pkv/trace.h"

static void usage(FILE *f) {
    fputs(
        "usage: pkv-replay [options] TRACE\n"
        "Replay TRACE (native CSV, Azure 2023 CSV, BurstGPT CSV or Mooncake .jsonl)\n"
        "through KV-cache policies and report memory, allocation calls and latency.\n"
        "\n"
        "Trace:\n"
        "  --format F          auto (default), native, azure, burstgpt, mooncake\n"
        "  --skip-bad          skip (and count) bad rows instead of failing\n"
        "  --load-scale X      replay X times faster (arrival times divided by X; default 1)\n"
        "Policy and scheduler:\n"
        "  --policy P          paged (default), contiguous-max, contiguous-pow2,\n"
        "                      contiguous-oracle, malloc-per-request, malloc-per-token, all\n"
        "  --block-size N      paged block size in tokens (default 16)\n"
        "  --max-seq-len N     longest sequence; contiguous-max reserves it (default: model's)\n"
        "  --preempt M         recompute (default) or swap\n"
        "  --max-batch N       max sequences per step (default 256)\n"
        "  --max-tokens N      max prefill + decode tokens per step (default 8192)\n"
        "  --watermark F       fraction of the budget kept free at admission (default 0.01)\n"
        "  --no-prefix-sharing paged: do not share prefix_group blocks\n"
        "Mode and hardware:\n"
        "  --mode M            sim (default: roofline model) or run (execute the decoder)\n"
        "  --model NAME        model preset (sim default llama2-7b, run default tiny)\n"
        "  --gpu NAME          a100-80g (default), h100-80g, h200-141g (sim)\n"
        "  --kv-mem SIZE       KV budget, e.g. 40G (K/M/G/T = powers of 1024); default\n"
        "                      (GPU memory - weights) x --gpu-util in sim, 64M in run mode\n"
        "  --gpu-util F        utilization factor for the default budget (default 0.9)\n"
        "  --alloc-call-us X   sim: model each backend alloc/free call as X microseconds\n"
        "                      (default 0: allocation seconds are not modelled)\n"
        "  --cuda              run mode on the CUDA backend (default: CPU)\n"
        "  --threads N         run mode CPU attention threads (default: all)\n"
        "  --seed N            run mode weights and token ids (default 1)\n"
        "Output:\n"
        "  --json FILE         write the JSON report ('-' = stdout; the table then goes to stderr)\n"
        "  --timeline FILE     write one CSV row per step\n"
        "  --validate          check every invariant after every step (slow)\n"
        "  --quiet             no progress bar\n"
        "  --help              this text\n",
        f);
}

typedef struct progress {
    const char *policy;
    int enabled;
    int last;
} progress;

typedef struct timeline {
    FILE *f;
    const char *policy;
} timeline;

typedef struct ctx {
    progress prog;
    timeline tl;
} ctx;

static void on_progress(void *user, double frac) {
    progress *p = &((ctx *)user)->prog;
    if (!p->enabled) return;
    int pct = (int)(frac * 100);
    if (pct == p->last) return;
    p->last = pct;
    char bar[41];
    int fill = pct * 40 / 100;
    for (int i = 0; i < 40; i++) bar[i] = i < fill ? '#' : ' ';
    bar[40] = '\0';
    fprintf(stderr, "\r%-18s [%s] %3d%%", p->policy, bar, pct);
    if (pct >= 100) fputc('\n', stderr);
    fflush(stderr);
}

static void on_step(void *user, const pkv_replay_step *s) {
    timeline *t = &((ctx *)user)->tl;
    fprintf(t->f, "%s,%llu,%.6f,%u,%u,%llu,%llu,%llu,%llu,%llu,%llu,%.6f\n", t->policy,
            (unsigned long long)s->index, s->time_s, s->running, s->waiting,
            (unsigned long long)s->used_bytes, (unsigned long long)s->reserved_bytes,
            (unsigned long long)s->reservation_bytes, (unsigned long long)s->ext_frag_bytes,
            (unsigned long long)s->free_bytes, (unsigned long long)s->capacity_bytes,
            s->step_s * 1e3);
}

static int parse_u32(const char *s, uint32_t *v, uint32_t min) {
    char *end;
    unsigned long long x = strtoull(s, &end, 10);
    if (!*s || *end || x > UINT32_MAX || x < min || s[0] == '-') return -1;
    *v = (uint32_t)x;
    return 0;
}

static int parse_f(const char *s, double *v) {
    char *end;
    *v = strtod(s, &end);
    return (!*s || *end) ? -1 : 0;
}

#define BAD(...)                                                                                   \
    do {                                                                                           \
        fprintf(stderr, "pkv-replay: " __VA_ARGS__);                                               \
        fputc('\n', stderr);                                                                       \
        return 2;                                                                                  \
    } while (0)

int main(int argc, char **argv) {
    pkv_replay_params prm = pkv_replay_params_default();
    pkv_trace_load_options lo = pkv_trace_load_options_default();
    const char *trace_path = NULL, *json_path = NULL, *timeline_path = NULL, *policy = "paged";
    const char *model = NULL, *gpu = NULL;
    int quiet = 0, have_kv = 0;
    double load_scale = 1;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        const char *v = i + 1 < argc ? argv[i + 1] : NULL;
#define NEED()                                                                                     \
    do {                                                                                           \
        if (!v) BAD("%s needs a value (see --help)", a);                                           \
        i++;                                                                                       \
    } while (0)
        if (!strcmp(a, "--help") || !strcmp(a, "-h")) {
            usage(stdout);
            return 0;
        } else if (!strcmp(a, "--format")) {
            NEED();
            if (!strcmp(v, "auto")) lo.format = PKV_TRACE_AUTO;
            else if (!strcmp(v, "native")) lo.format = PKV_TRACE_NATIVE;
            else if (!strcmp(v, "azure")) lo.format = PKV_TRACE_AZURE;
            else if (!strcmp(v, "burstgpt")) lo.format = PKV_TRACE_BURSTGPT;
            else if (!strcmp(v, "mooncake")) lo.format = PKV_TRACE_MOONCAKE;
            else BAD("unknown --format '%s'", v);
        } else if (!strcmp(a, "--load-scale")) {
            NEED();
            if (parse_f(v, &load_scale) || !(load_scale > 0) || !isfinite(load_scale))
                BAD("--load-scale must be a finite number > 0, got '%s'", v);
        } else if (!strcmp(a, "--skip-bad")) {
            lo.skip_bad = 1;
        } else if (!strcmp(a, "--policy")) {
            NEED();
            pkv_policy p;
            if (strcmp(v, "all") && pkv_policy_from_name(v, &p) != PKV_OK)
                BAD("unknown --policy '%s' (see --help)", v);
            policy = v;
        } else if (!strcmp(a, "--block-size")) {
            NEED();
            if (parse_u32(v, &prm.block_size, 1) || prm.block_size > 65536)
                BAD("--block-size must be 1..65536, got '%s'", v);
        } else if (!strcmp(a, "--max-seq-len")) {
            NEED();
            if (parse_u32(v, &prm.max_seq_len, 1)) BAD("--max-seq-len must be >= 1, got '%s'", v);
        } else if (!strcmp(a, "--preempt")) {
            NEED();
            if (!strcmp(v, "recompute")) prm.preempt = PKV_PREEMPT_RECOMPUTE;
            else if (!strcmp(v, "swap")) prm.preempt = PKV_PREEMPT_SWAP;
            else BAD("--preempt must be recompute or swap, got '%s'", v);
        } else if (!strcmp(a, "--max-batch")) {
            NEED();
            if (parse_u32(v, &prm.max_batch, 1)) BAD("--max-batch must be >= 1, got '%s'", v);
        } else if (!strcmp(a, "--max-tokens")) {
            NEED();
            if (parse_u32(v, &prm.max_tokens_per_step, 1)) BAD("--max-tokens must be >= 1, got '%s'", v);
        } else if (!strcmp(a, "--watermark")) {
            NEED();
            if (parse_f(v, &prm.watermark) || !(prm.watermark >= 0 && prm.watermark < 1))
                BAD("--watermark must be in [0, 1), got '%s'", v);
        } else if (!strcmp(a, "--no-prefix-sharing")) {
            prm.prefix_sharing = 0;
        } else if (!strcmp(a, "--mode")) {
            NEED();
            if (!strcmp(v, "sim")) prm.mode = PKV_REPLAY_SIM;
            else if (!strcmp(v, "run")) prm.mode = PKV_REPLAY_RUN;
            else BAD("--mode must be sim or run, got '%s'", v);
        } else if (!strcmp(a, "--model")) {
            NEED();
            model = v;
        } else if (!strcmp(a, "--gpu")) {
            NEED();
            gpu = v;
        } else if (!strcmp(a, "--kv-mem")) {
            NEED();
            if (pkv_size_parse(v, &prm.kv_mem_bytes) != PKV_OK || prm.kv_mem_bytes == 0)
                BAD("--kv-mem must be a size like 512M or 40G (K/M/G/T = powers of 1024), got '%s'", v);
            have_kv = 1;
        } else if (!strcmp(a, "--gpu-util")) {
            NEED();
            if (parse_f(v, &prm.gpu_util) || !(prm.gpu_util > 0 && prm.gpu_util <= 1))
                BAD("--gpu-util must be in (0, 1], got '%s'", v);
        } else if (!strcmp(a, "--alloc-call-us")) {
            NEED();
            if (parse_f(v, &prm.sim_alloc_call_s) || !(prm.sim_alloc_call_s >= 0))
                BAD("--alloc-call-us must be >= 0, got '%s'", v);
            prm.sim_alloc_call_s *= 1e-6;
        } else if (!strcmp(a, "--cuda")) {
            prm.run_cuda = 1;
        } else if (!strcmp(a, "--threads")) {
            NEED();
            if (parse_u32(v, &prm.run_threads, 0)) BAD("--threads must be >= 0, got '%s'", v);
        } else if (!strcmp(a, "--seed")) {
            NEED();
            char *end;
            prm.seed = strtoull(v, &end, 10);
            if (!*v || *end) BAD("--seed must be an integer, got '%s'", v);
        } else if (!strcmp(a, "--json")) {
            NEED();
            json_path = v;
        } else if (!strcmp(a, "--timeline")) {
            NEED();
            timeline_path = v;
        } else if (!strcmp(a, "--validate")) {
            prm.validate = 1;
        } else if (!strcmp(a, "--quiet") || !strcmp(a, "-q")) {
            quiet = 1;
        } else if (a[0] == '-' && a[1] != '\0') {
            BAD("unknown option '%s' (see --help)", a);
        } else if (!trace_path) {
            trace_path = a;
        } else {
            BAD("more than one trace given ('%s' and '%s')", trace_path, a);
        }
#undef NEED
    }
    if (!trace_path) {
        usage(stderr);
        return 2;
    }
    if (!model) model = prm.mode == PKV_REPLAY_RUN ? "tiny" : "llama2-7b";
    if (pkv_model_preset(model, &prm.model) != PKV_OK) BAD("unknown --model '%s'", model);
    if (gpu && pkv_gpu_preset(gpu, &prm.gpu) != PKV_OK)
        BAD("unknown --gpu '%s' (a100-80g, h100-80g, h200-141g)", gpu);
    if (prm.mode == PKV_REPLAY_RUN) {
        prm.dtype_bytes = 4; // the decoder keeps weights and KV in fp32
        if (!have_kv) prm.kv_mem_bytes = 64ull << 20;
        if (strcmp(policy, "paged") != 0)
            BAD("--mode run executes the paged policy only (got --policy %s)", policy);
        // Learned positions cap the sequence length at the model's context.
        if (prm.max_seq_len == 0 || prm.max_seq_len > prm.model.max_seq_len)
            prm.max_seq_len = prm.model.max_seq_len;
    }
    uint64_t budget;
    if (pkv_replay_kv_budget(&prm, &budget) != PKV_OK)
        BAD("model %s does not fit %s (use --kv-mem)", prm.model.name, prm.gpu.name);

    pkv_trace *trace = NULL;
    pkv_trace_error err;
    pkv_status st = pkv_trace_load(trace_path, &lo, &trace, &err);
    if (st != PKV_OK) {
        if (st == PKV_ERR_FORMAT || st == PKV_ERR_IO)
        {
            char where[32] = "";
            if (err.line) snprintf(where, sizeof where, ":%llu", (unsigned long long)err.line);
            fprintf(stderr, "pkv-replay: %s%s%s%s: %s\n", err.file, where,
                    err.field[0] ? ": field " : "", err.field, err.message);
        }
        else
            fprintf(stderr, "pkv-replay: %s: %s\n", trace_path, pkv_status_str(st));
        return st == PKV_ERR_OUT_OF_MEMORY ? 1 : 2;
    }
    const pkv_trace_format loaded_format = pkv_trace_get_format(trace);
    if (load_scale != 1) {
        // Same requests, arrivals compressed in time: a heavier load.
        const size_t n = pkv_trace_count(trace);
        pkv_trace_request *scaled = malloc(n * sizeof *scaled);
        pkv_trace *t2 = NULL;
        if (!scaled) {
            pkv_trace_destroy(trace);
            fprintf(stderr, "pkv-replay: out of memory\n");
            return 1;
        }
        memcpy(scaled, pkv_trace_requests(trace), n * sizeof *scaled);
        for (size_t i = 0; i < n; i++) scaled[i].arrival_s /= load_scale;
        st = pkv_trace_create(scaled, n, &t2, &err);
        free(scaled);
        pkv_trace_destroy(trace);
        if (st == PKV_ERR_FORMAT) // a tiny scale divides arrivals up to inf
            BAD("--load-scale %g does not give valid arrivals: %s", load_scale, err.message);
        if (st != PKV_OK) {
            fprintf(stderr, "pkv-replay: %s\n", pkv_status_str(st));
            return 1;
        }
        trace = t2;
    }
    const int tty = isatty(fileno(stderr)) && !quiet;
    FILE *table_out = json_path && !strcmp(json_path, "-") ? stderr : stdout;
    ctx c = {{NULL, tty, -1}, {NULL, NULL}};
    if (timeline_path) {
        c.tl.f = fopen(timeline_path, "w");
        if (!c.tl.f) {
            pkv_trace_destroy(trace);
            BAD("cannot write --timeline %s", timeline_path);
        }
        fputs("policy,step,time_s,running,waiting,used_bytes,reserved_bytes,reservation_bytes,"
              "ext_frag_bytes,free_bytes,capacity_bytes,step_ms\n",
              c.tl.f);
        prm.on_step = on_step;
    }
    prm.on_progress = on_progress;
    prm.user = &c;
    pkv_replay_report reports[PKV_POLICY_COUNT];
    size_t nrep = 0;
    int rc = 0;
    fprintf(table_out,
            "trace %s: %zu requests (%s, %llu skipped, load x%g); mode %s, model %s, %s, KV budget "
            "%.2f GiB\n",
            trace_path, pkv_trace_count(trace), pkv_trace_format_name(loaded_format),
            (unsigned long long)pkv_trace_skipped(trace), load_scale,
            prm.mode == PKV_REPLAY_SIM ? "sim" : "run",
            prm.model.name,
            prm.mode == PKV_REPLAY_SIM ? prm.gpu.name : (prm.run_cuda ? "cuda" : "cpu"),
            (double)budget / (1024.0 * 1024 * 1024));
    for (int p = 0; p < PKV_POLICY_COUNT; p++) {
        if (strcmp(policy, "all") != 0 && strcmp(policy, pkv_policy_name((pkv_policy)p)) != 0) continue;
        prm.policy = (pkv_policy)p;
        c.prog.policy = pkv_policy_name(prm.policy);
        c.prog.last = -1;
        c.tl.policy = c.prog.policy;
        st = pkv_replay_run(trace, &prm, &reports[nrep]);
        if (st != PKV_OK) {
            fprintf(stderr, "pkv-replay: policy %s failed: %s\n", pkv_policy_name(prm.policy),
                    pkv_status_str(st));
            rc = st == PKV_ERR_INVALID_ARG ? 2 : 1;
            break;
        }
        nrep++;
    }
    if (nrep) pkv_replay_write_table(table_out, reports, nrep);
    if (nrep && prm.mode == PKV_REPLAY_SIM)
        fprintf(table_out, "(sim mode: step times from the roofline model; allocation seconds %s)\n",
                prm.sim_alloc_call_s > 0 ? "modelled from --alloc-call-us" : "not modelled");
    if (json_path && nrep) {
        FILE *jf = strcmp(json_path, "-") ? fopen(json_path, "w") : stdout;
        if (!jf) {
            fprintf(stderr, "pkv-replay: cannot write --json %s\n", json_path);
            rc = rc ? rc : 1;
        } else {
            if (pkv_replay_write_json(jf, trace_path, trace, &prm, reports, nrep) != PKV_OK) rc = 1;
            if (jf != stdout && fclose(jf) != 0) rc = 1;
        }
    }
    if (c.tl.f && fclose(c.tl.f) != 0) rc = rc ? rc : 1;
    pkv_trace_destroy(trace);
    return rc;
}

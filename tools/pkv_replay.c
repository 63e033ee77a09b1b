// SPDX-License-Identifier: MIT
// pkv-replay: replay a request trace through one or every KV-cache policy and
// print the comparison (table on stdout, --json for machines, --timeline CSV
// per step for plots). Exit codes: 0 ok, 1 runtime failure, 2 bad usage or input.
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
        "  --policy P          paged (default), contiguous-max, contiguous-pow2 (Orca Pow2),\n"
        "                      contiguous-oracle, malloc-per-request, malloc-per-token,\n"
        "                      realloc-copy, contiguous-pow2-grow, vmm (vAttention), all\n"
        "  --block-size N      paged block size in tokens (default 16)\n"
        "  --max-seq-len N     longest sequence; contiguous-max reserves it (default: model's)\n"
        "  --preempt M         recompute (default) or swap\n"
        "  --swap-space SIZE   host pool for --preempt swap (default 4G); a full pool recomputes\n"
        "  --batching B        continuous (default) or static (padded batches, HF generate)\n"
        "  --chunked-prefill N split prompts across steps, N tokens per step (default off)\n"
        "  --max-batch N       max sequences per step (default 256)\n"
        "  --max-tokens N      max prefill + decode tokens per step (default 8192)\n"
        "  --watermark F       fraction of the budget kept free at admission (default 0.01)\n"
        "  --no-prefix-sharing paged: do not share prefix_group blocks\n"
        "  --vmm-page SIZE     vmm: physical page per layer K or V buffer, a multiple of 4K\n"
        "                      (default 2M as vAttention; 64K models its smaller pages)\n"
        "  --vmm-map-ahead     vmm: map the next page one step ahead, overlapping the step\n"
        "  --vmm-defer-reclaim vmm: keep a finished request's pages mapped for the next one\n"
        "Mode and hardware:\n"
        "  --mode M            sim (default: roofline model) or run (execute the decoder)\n"
        "  --model NAME        model preset (sim default llama2-7b, run default tiny)\n"
        "  --gpu NAME          a100-80g (default), h100-80g, h200-141g (sim)\n"
        "  --kv-mem SIZE       KV budget, e.g. 40G (K/M/G/T = powers of 1024); default\n"
        "                      (GPU memory - weights) x --gpu-util in sim, 64M in run mode\n"
        "  --gpu-util F        utilization factor for the default budget (default 0.9)\n"
        "  --alloc-model M     sim: cost of backend alloc/free calls: cuda-boyer (default,\n"
        "                      50 us/call, synchronizing; see DESIGN.md), none, or a FILE.json\n"
        "                      written by bench_alloc --calibrate\n"
        "  --alloc-call-us X   sim: a constant X microseconds per call instead\n"
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
    fprintf(t->f, "%s,%llu,%.6f,%u,%u,%llu,%llu,%llu,%llu,%llu,%llu,%.6f,%llu,%.6f\n", t->policy,
            (unsigned long long)s->index, s->time_s, s->running, s->waiting,
            (unsigned long long)s->used_bytes, (unsigned long long)s->reserved_bytes,
            (unsigned long long)s->reservation_bytes, (unsigned long long)s->ext_frag_bytes,
            (unsigned long long)s->free_bytes, (unsigned long long)s->capacity_bytes,
            s->step_s * 1e3, (unsigned long long)s->internal_frag_bytes, s->alloc_s * 1e3);
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
    const char *alloc_model = NULL;
    double alloc_call_us = -1;
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
            if (parse_f(v, &load_scale) || !(load_scale > 0))
                BAD("--load-scale must be > 0, got '%s'", v);
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
        } else if (!strcmp(a, "--vmm-page")) {
            NEED();
            if (pkv_size_parse(v, &prm.vmm_page_bytes) != PKV_OK || prm.vmm_page_bytes < 4096 ||
                prm.vmm_page_bytes % 4096 != 0)
                BAD("--vmm-page must be a multiple of 4K, e.g. 64K or 2M, got '%s'", v);
        } else if (!strcmp(a, "--vmm-map-ahead")) {
            prm.vmm_map_ahead = 1;
        } else if (!strcmp(a, "--vmm-defer-reclaim")) {
            prm.vmm_defer_reclaim = 1;
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
            if (parse_f(v, &alloc_call_us) || !(alloc_call_us >= 0 && alloc_call_us < 1e12))
                BAD("--alloc-call-us must be >= 0, got '%s'", v);
        } else if (!strcmp(a, "--alloc-model")) {
            NEED();
            alloc_model = v;
        } else if (!strcmp(a, "--swap-space")) {
            NEED();
            if (pkv_size_parse(v, &prm.swap_space_bytes) != PKV_OK)
                BAD("--swap-space must be a size like 4G (K/M/G/T = powers of 1024), got '%s'", v);
        } else if (!strcmp(a, "--batching")) {
            NEED();
            if (!strcmp(v, "continuous")) prm.batching = PKV_BATCHING_CONTINUOUS;
            else if (!strcmp(v, "static")) prm.batching = PKV_BATCHING_STATIC;
            else BAD("--batching must be continuous or static, got '%s'", v);
        } else if (!strcmp(a, "--chunked-prefill")) {
            NEED();
            if (parse_u32(v, &prm.chunked_prefill, 1))
                BAD("--chunked-prefill must be a token count >= 1, got '%s'", v);
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
    if (alloc_model && alloc_call_us >= 0)
        BAD("give --alloc-model or --alloc-call-us, not both");
    if (alloc_call_us >= 0) prm.alloc_model = pkv_alloc_model_constant(alloc_call_us * 1e-6);
    if (alloc_model && pkv_alloc_model_builtin(alloc_model, &prm.alloc_model) != PKV_OK) {
        char err[256];
        pkv_status ms = pkv_alloc_model_load(alloc_model, &prm.alloc_model, err, sizeof err);
        if (ms != PKV_OK)
            BAD("--alloc-model: %s", err[0] ? err : pkv_status_str(ms));
    }
    if (prm.batching == PKV_BATCHING_STATIC && prm.chunked_prefill)
        BAD("--chunked-prefill needs --batching continuous");
    prm.load_scale = load_scale;
    if (!model) model = prm.mode == PKV_REPLAY_RUN ? "tiny" : "llama2-7b";
    if (pkv_model_preset(model, &prm.model) != PKV_OK) BAD("unknown --model '%s'", model);
    if (gpu && pkv_gpu_preset(gpu, &prm.gpu) != PKV_OK)
        BAD("unknown --gpu '%s' (a100-80g, h100-80g, h200-141g)", gpu);
    if (prm.mode == PKV_REPLAY_RUN) {
        prm.dtype_bytes = 4; // the decoder keeps weights and KV in fp32
        if (!have_kv) prm.kv_mem_bytes = 64ull << 20;
        if (strcmp(policy, "paged") != 0)
            BAD("--mode run executes the paged policy only (got --policy %s)", policy);
        if (prm.chunked_prefill || prm.batching != PKV_BATCHING_CONTINUOUS)
            BAD("--mode run supports continuous batching without --chunked-prefill only");
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
    // --load-scale divides arrival times inside the replay (prm.load_scale), so
    // the trace keeps everything it was loaded with (Mooncake hash ids included).
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
              "ext_frag_bytes,free_bytes,capacity_bytes,step_ms,internal_frag_bytes,alloc_ms\n",
              c.tl.f);
        prm.on_step = on_step;
    }
    prm.on_progress = on_progress;
    prm.user = &c;
    pkv_replay_report reports[PKV_POLICY_COUNT];
    size_t nrep = 0;
    int rc = 0;
    char chunk[32] = "off";
    if (prm.chunked_prefill) snprintf(chunk, sizeof chunk, "%u tokens", prm.chunked_prefill);
    fprintf(table_out,
            "trace %s: %zu requests (%s, %llu skipped, load x%g)\n"
            "mode %s, model %s, GPU %s, KV budget %.2f GiB; batching %s, chunked prefill %s; "
            "preempt %s (host pool %.1f GiB); alloc cost model: %s; step time: %s\n",
            trace_path, pkv_trace_count(trace), pkv_trace_format_name(loaded_format),
            (unsigned long long)pkv_trace_skipped(trace), load_scale,
            prm.mode == PKV_REPLAY_SIM ? "sim" : "run", prm.model.name,
            prm.mode == PKV_REPLAY_SIM ? prm.gpu.name : (prm.run_cuda ? "cuda (measured)" : "cpu (measured)"),
            (double)budget / (1024.0 * 1024 * 1024), pkv_batching_name(prm.batching), chunk,
            pkv_preempt_mode_name(prm.preempt), (double)prm.swap_space_bytes / (1024.0 * 1024 * 1024),
            prm.mode == PKV_REPLAY_SIM ? prm.alloc_model.name : "measured",
            prm.mode == PKV_REPLAY_SIM ? "roofline model" : "measured wall time");
    for (int p = 0; p < PKV_POLICY_COUNT; p++) {
        if (strcmp(policy, "all") != 0 && strcmp(policy, pkv_policy_name((pkv_policy)p)) != 0) continue;
        prm.policy = (pkv_policy)p;
        c.prog.policy = pkv_policy_name(prm.policy);
        c.prog.last = -1;
        c.tl.policy = c.prog.policy;
        st = pkv_replay_run(trace, &prm, &reports[nrep]);
        if (st != PKV_OK) {
            // Every policy runs even when one fails; the others are still reported.
            fprintf(stderr, "pkv-replay: policy %s failed: %s\n", pkv_policy_name(prm.policy),
                    pkv_status_str(st));
            if (!rc) rc = st == PKV_ERR_INVALID_ARG ? 2 : 1;
            continue;
        }
        if (reports[nrep].failure[0]) {
            fprintf(stderr, "pkv-replay: policy %s completed no request: %s\n",
                    reports[nrep].policy, reports[nrep].failure);
            if (!rc) rc = 1;
        }
        nrep++;
    }
    if (nrep) pkv_replay_write_table(table_out, reports, nrep);
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

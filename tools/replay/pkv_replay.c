// SPDX-License-Identifier: MIT
// pkv-replay: replay a request trace through one or every KV-cache policy and
// print the comparison (table on stdout, --json / --csv for machines, --timeline
// CSV per step for plots). Lists of block sizes, load scales and budgets run as
// a sweep (tools/replay/replay_*.c hold the sweep, SLO search, stamp, progress and
// merge; this file parses options and wires them). Exit codes: 0 ok, 1 runtime
// failure, 2 bad usage or input, 130 interrupted by SIGINT or 143 by SIGTERM (the
// report written is partial).
#include <dlfcn.h>
#include <math.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "pkv/policy.h"
#include "pkv/replay.h"
#include "pkv/trace.h"
#include "cli.h"
#include "out_file.h"
#include "replay_tools.h"

static void usage(FILE *f) {
    fputs(
        "usage: pkv-replay [options] TRACE\n"
        "       pkv-replay merge [-o OUT] SHARD.json... | SHARD.csv...\n"
        "Replay TRACE (native CSV, Azure 2023 CSV, BurstGPT CSV or Mooncake .jsonl)\n"
        "through KV-cache policies and report memory, allocation calls and latency.\n"
        "\n"
        "Trace:\n"
        "  --format F          auto (default), native, azure, burstgpt, mooncake\n"
        "  --skip-bad          skip (and count) bad rows instead of failing\n"
        "  --load-scale X,...  replay X times faster (arrival times divided by X; default 1)\n"
        "Policy and scheduler:\n"
        "  --policy P,...      paged (default), contiguous-max, contiguous-pow2 (Orca Pow2),\n"
        "                      contiguous-oracle, malloc-per-request, malloc-per-token,\n"
        "                      realloc-copy, contiguous-pow2-grow, vmm (vAttention), vmm-sync\n"
        "                      (vmm with every map in line), hybrid-partition, hybrid-shared-page,\n"
        "                      hybrid-lcm (Jenga), hybrid-vmm (vmm per group)\n"
        "                      (KV cache groups, window rules applied: docs/RESEARCH.md), all\n"
        "  --policy-plugin F   also replay the policy in shared object F (exports\n"
        "                      pkv_policy_plugin_entry, see docs/POLICIES.md); up to 8;\n"
        "                      without --policy only the plugins run\n"
        "  --schedule S        own (default: each policy schedules by arrival time) or\n"
        "                      'fixed-from P': every policy replays the admissions,\n"
        "                      preemptions and steps that policy P took (one point only);\n"
        "                      a policy short of memory cannot follow it and deviates: the\n"
        "                      table's 'sched dev' counts the events (0: it followed it)\n"
        , f);
    fputs( // two literals: ISO C caps one at 4095 bytes
        "  --block-size N,...  paged block size in tokens (default 16)\n"
        "  --max-seq-len N     longest sequence; contiguous-max reserves it (default: model's)\n"
        "  --preempt M         recompute (default) or swap\n"
        "  --swap-space SIZE   host pool for --preempt swap (default 4G); a full pool recomputes\n"
        "  --batching B        continuous (default) or static (padded batches, HF generate)\n"
        "  --chunked-prefill N split prompts across steps, N tokens per step (default off)\n"
        "  --max-batch N       max sequences per step (default 256)\n"
        "  --max-tokens N      max prefill + decode tokens per step (default 8192)\n"
        "  --watermark F       fraction of the budget kept free at admission (default 0.01)\n"
        "  --no-prefix-sharing paged, hybrid-partition/-shared-page/-lcm: do not share\n"
        "                      prefix_group blocks\n"
        "  --vmm-page SIZE     vmm: physical page per layer K or V buffer, a multiple of 4K\n"
        "                      (default 2M as vAttention; 64K models its smaller pages)\n"
        "  --vmm-no-map-ahead  vmm: map pages in line, not one step ahead on a background\n"
        "                      thread (map-ahead and eager allocation are the default)\n"
        "  --vmm-no-defer-reclaim vmm: unmap a finished request's pages (default: kept\n"
        "                      mapped for the next request); vmm-sync turns all three off\n"
        "  --device-mem M      sim, malloc-per-request and realloc-copy: cuda (default: 2 MiB\n"
        "                      pages, no external fragmentation), arena (first-fit in one\n"
        "                      range) or torch-caching (PyTorch's caching allocator)\n"
        "  --copy-overlap      sim: device copies on a second stream during the linear layers\n"
        "                      (default: serialized before the attention that reads them)\n",
        f);
    // Two literals: one would pass the 4095 characters ISO C asks compilers to support.
    fputs(
        "Mode and hardware:\n"
        "  --mode M            sim (default: roofline model) or run (execute the decoder,\n"
        "                      each policy on its own K/V layout: paged tables, contiguous\n"
        "                      rows at its extents, a VMM space, the hybrid manager's\n"
        "                      pools, or a per-token table)\n"
        "  --model NAME        model preset (sim default llama2-7b, run default tiny)\n"
        "  --gpu NAME          a100-80g (default), h100-80g, h200-141g (sim)\n"
        "  --kv-dtype T        sim: KV element type, fp16 (default) or 8-bit int8, fp8_e4m3,\n"
        "                      fp8_e5m2: capacity and roofline KV bytes per token\n"
        "  --kv-mem SIZE,...   KV budget, e.g. 40GiB or 40G (2^30), 40GB (10^9); default\n"
        "                      (GPU memory - weights) x --gpu-util in sim, 64M in run mode\n"
        "  --gpu-util F        utilization factor for the default budget (default 0.9)\n"
        "  --alloc-model M     sim: cost of backend alloc/free calls: cuda-boyer (default,\n"
        "                      by size: 50 us to 2 MiB, +50 us per further 2 MiB, synchronizing;\n"
        "                      see POLICIES.md), cuda-boyer-flat (50 us whatever the size), none,\n"
        "                      or a FILE.json written by bench_alloc --calibrate\n"
        "  --alloc-call-us X   sim: a flat X microseconds per call, whatever the size\n"
        "  --calibrate-out F   run mode: fit sim mode to the measured steps (achieved\n"
        "                      bandwidth, compute, per-step overhead, per-call cost), write\n"
        "                      the calibration to F, and report the calibrated sim's error\n"
        "  --calibration F     sim mode: model the machine and model calibrated in F\n"
        "                      (with --alloc-model FILE.json: its by-size call costs)\n"
        "  --sim-efficiency E  sim: the share of the GPU's datasheet peak a step reaches.\n"
        "                      preset (default): what real engines reached on whole steps\n"
        "                      (published figures, docs/POLICIES.md 'Sim efficiency'):\n",
        f);
    for (const char *const *n = pkv_gpu_preset_names(); *n; n++) {
        pkv_gpu_spec g;
        pkv_sim_efficiency e;
        if (pkv_gpu_preset(*n, &g) != PKV_OK || pkv_sim_efficiency_for_gpu(&g, &e) != PKV_OK) continue;
        fprintf(f, "                        %s: %.0f%% HBM bandwidth, %.0f%% compute, %g us/step\n"
                   "                        %s\n",
                *n, 100 * e.bw_frac, 100 * e.compute_frac, e.step_overhead_s * 1e6, e.source);
    }
    fputs(
        "                      peak: the plain roofline (100%, 100%, 0 us/step)\n"
        "                      BW,COMPUTE,OVERHEAD_US: fractions in (0, 1], microseconds\n"
        "  --cuda              run mode on the CUDA backend (default: CPU)\n"
        "  --threads N         run mode CPU attention threads (default: all)\n"
        "  --seed N            run mode weights and token ids (default 1)\n"
        "Sweeps (lists run as their cross product, output in point order):\n"
        "  --jobs N            run N points at once on threads (default 1; results do not\n"
        "                      depend on N; run mode always uses 1)\n"
        "  --point K/N         run only shard K of N (points K-1, K-1+N, ...); join the\n"
        "                      shards' files with 'pkv-replay merge'\n"
        "  --slo SPEC          per policy point, the highest load scale in [min, max] of\n"
        "                      --load-scale that meets SPEC, by bisection, e.g.\n"
        "                      'ttft_p99<=2s,tpot_p50<=100ms' (metrics: ttft_p50/p99,\n"
        "                      tpot_p50/p99, step_p50/p90/p99/max, norm_latency)\n"
        "  --slo-tol F         stop the bisection when hi/lo <= 1 + F (default 0.01)\n"
        "Output:\n"
        "  --json FILE         write the JSON report ('-' = stdout; the table then goes to stderr)\n"
        "  --csv FILE          one row per run, columns = the JSON keys ('-' = stdout)\n"
        "  --timeline FILE     write CSV rows of the steps of every run\n"
        "  --timeline-rows N   at most 2N rows per run, evenly thinned (default 2000; 0 = all)\n"
        "  --requests FILE     one CSV row per completed request of every run (latency CDFs)\n"
        "  --validate          check every invariant after every step (slow)\n"
        "  -q, --quiet         no progress bar\n"
        "  --help              this text\n"
        CLI_SIZE_UNITS,
        f);
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

// dlopen FILE and take its table; 0 on success, else a message in why.
static int load_plugin(const char *path, const pkv_policy_vtable **vt, char *why, size_t why_len) {
    // A path argument names a file: dlopen searches the library path for a
    // name without a '/', so "mine.so" becomes "./mine.so" (issue 20, defect 6).
    char local[4096];
    const char *file = path; // messages keep the user's spelling
    if (!strchr(path, '/')) {
        if ((size_t)snprintf(local, sizeof local, "./%s", path) >= sizeof local) {
            snprintf(why, why_len, "%s: path too long", path);
            return -1;
        }
        file = local;
    }
    // RTLD_LOCAL: two plugins may use the same symbol names.
    void *h = dlopen(file, RTLD_NOW | RTLD_LOCAL);
    if (!h) {
        snprintf(why, why_len, "%s", dlerror());
        return -1;
    }
    pkv_policy_plugin_entry_fn entry;
    void *sym = dlsym(h, PKV_POLICY_PLUGIN_ENTRY);
    if (!sym) {
        snprintf(why, why_len, "%s: no symbol %s", path, PKV_POLICY_PLUGIN_ENTRY);
        dlclose(h);
        return -1;
    }
    memcpy(&entry, &sym, sizeof entry); // ISO C has no object-to-function pointer cast
    *vt = entry(PKV_POLICY_ABI_VERSION);
    char check[160];
    if (!*vt) {
        // Which ABI was it built for? Ask for the older ones, newest first, so that
        // the refusal names both versions (a table it returns is only read).
        uint32_t old = 0;
        for (uint32_t v = PKV_POLICY_ABI_VERSION - 1; v >= 1 && !old; v--) {
            const pkv_policy_vtable *o = entry(v);
            if (o && o->abi_version == v) old = v;
        }
        if (old)
            snprintf(why, why_len,
                     "%s: built for policy ABI %u, this pkv-replay speaks policy ABI %u "
                     "(rebuild it against this version's pkv/policy.h)",
                     path, old, PKV_POLICY_ABI_VERSION);
        else
            snprintf(why, why_len, "%s: %s returned NULL (it does not speak policy ABI %u)", path,
                     PKV_POLICY_PLUGIN_ENTRY, PKV_POLICY_ABI_VERSION);
    } else if (pkv_policy_vtable_check(*vt, check, sizeof check) != PKV_OK) {
        snprintf(why, why_len, "%s: %s", path, check);
    } else {
        return 0; // the handle stays open for the process's life: the table lives in it
    }
    dlclose(h);
    return -1;
}

// Run mode with --calibrate-out: fit sim to the steps of every point, write the
// calibration, and print the calibrated sim's error against each run.
static int calibrate(const char *path, const pkv_trace *trace, const pkv_replay_params *prm,
                     const rt_result *results, size_t n, FILE *out) {
    size_t steps = 0;
    double as = 0, fs = 0;
    uint64_t ac = 0, fc = 0;
    // Per-call cost: the calls made inside steps (the arena, one call each way
    // outside the steps, is left out), alloc and free together.
    for (size_t i = 0; i < n; i++) {
        if (!results[i].ran) continue;
        steps += results[i].timeline.n;
        const pkv_replay_report *r = &results[i].report;
        if (r->alloc.backend_alloc_calls > 1) {
            as += r->alloc.step_seconds;
            ac += r->alloc.backend_alloc_calls - 1 + r->alloc.backend_free_calls - 1;
        }
    }
    fs = as;
    fc = ac;
    pkv_replay_step *all = malloc((steps ? steps : 1) * sizeof *all);
    if (!all) return 1;
    size_t k = 0;
    for (size_t i = 0; i < n; i++)
        if (results[i].ran)
            for (size_t j = 0; j < results[i].timeline.n; j++) all[k++] = results[i].timeline.rows[j];
    pkv_replay_calibration cal;
    pkv_status st = pkv_replay_calibrate(all, k, as, ac, fs, fc, &cal);
    free(all);
    if (st != PKV_OK) {
        fprintf(stderr, "pkv-replay: calibration to %s failed: %s\n", path, pkv_status_str(st));
        return 1;
    }
    snprintf(cal.model, sizeof cal.model, "%s", prm->model.name);
    snprintf(cal.device, sizeof cal.device, "%s", prm->run_cuda ? "cuda" : "cpu");
    cal.dtype_bytes = prm->dtype_bytes;
    out_file o;
    if (out_open(&o, "pkv-replay", path) != 0) return 1;
    (void)pkv_replay_calibration_write(o.f, &cal); // a write error shows at the close
    if (out_close(&o) != 0) return 1;
    fprintf(out,
            "\ncalibration %s: achieved %.3g GB/s, %.3g GFLOP/s, %.1f us/step overhead, %.3g us/alloc, "
            "%.3g us/free (%llu steps, median fit error %.1f%%)\n",
            path, cal.achieved_bw / 1e9, cal.achieved_flops / 1e9, cal.step_overhead_s * 1e6,
            cal.alloc.alloc.base_s * 1e6, cal.alloc.free.base_s * 1e6, (unsigned long long)cal.steps,
            cal.median_rel_err * 100);
    fprintf(out, "%-22s %11s %11s %7s %11s %11s %7s %11s %11s %7s\n", "calibrated sim vs run", "run p50 ms",
            "sim p50 ms", "err%", "run tok/s", "sim tok/s", "err%", "run TPOT", "sim TPOT", "err%");
    for (size_t i = 0; i < n; i++) {
        const rt_result *r = &results[i];
        if (!r->ran) continue;
        pkv_replay_params sp = *prm; // the same trace, budget and scheduler, in sim mode
        sp.mode = PKV_REPLAY_SIM;
        sp.policy = r->point.policy;
        sp.custom_policy = r->point.custom;
        if (r->point.block_size) sp.block_size = r->point.block_size;
        if (r->point.kv_mem_bytes) sp.kv_mem_bytes = r->point.kv_mem_bytes;
        sp.load_scale = r->point.load_scale;
        sp.on_step = NULL;
        sp.on_progress = NULL;
        sp.on_request = NULL;
        sp.validate = 0;
        sp.prefix_sharing = 0;
        pkv_replay_params_apply_calibration(&sp, &cal, path);
        pkv_replay_report s;
        if (pkv_replay_run(trace, &sp, &s) != PKV_OK) continue;
        const pkv_replay_report *m = &r->report;
#define ERR(a, b) (100.0 * ((b) - (a)) / (a))
        fprintf(out, "%-22s %11.3f %11.3f %+7.1f %11.1f %11.1f %+7.1f %11.3f %11.3f %+7.1f\n", m->policy,
                m->latency.step_p50_ms, s.latency.step_p50_ms, ERR(m->latency.step_p50_ms, s.latency.step_p50_ms),
                m->throughput.output_tokens_per_s, s.throughput.output_tokens_per_s,
                ERR(m->throughput.output_tokens_per_s, s.throughput.output_tokens_per_s), m->latency.tpot_p50_ms,
                s.latency.tpot_p50_ms, ERR(m->latency.tpot_p50_ms, s.latency.tpot_p50_ms));
#undef ERR
    }
    return 0;
}

#define BAD(...)                                                                                   \
    do {                                                                                           \
        fprintf(stderr, "pkv-replay: " __VA_ARGS__);                                               \
        fputc('\n', stderr);                                                                       \
        return 2;                                                                                  \
    } while (0)

int rt_replay_main(int argc, char **argv) {
    pkv_replay_params prm = pkv_replay_params_default();
    pkv_trace_load_options lo = pkv_trace_load_options_default();
    if (argc > 1 && !strcmp(argv[1], "merge")) return rt_merge_main(argc - 1, argv + 1);
    const char *trace_path = NULL, *json_path = NULL, *timeline_path = NULL, *csv_path = NULL,
               *requests_path = NULL;
    const char *model = NULL, *gpu = NULL, *format = "auto";
    int quiet = 0, have_kv = 0, have_policy = 0;
    const char *fixed_from = NULL, *calibrate_out = NULL, *calibration = NULL, *sim_efficiency = NULL;
    char err[256];
    rt_axes axes;
    memset(&axes, 0, sizeof axes);
    axes.policies[PKV_POLICY_PAGED] = 1;
    axes.block_sizes[0] = 16;
    axes.num_block_sizes = 1;
    axes.load_scales[0] = 1;
    axes.num_load_scales = 1;
    axes.num_kv_mems = 1; // kv_mems[0] = 0: the default budget
    uint32_t jobs = 1, shard_k = 1, shard_n = 1, timeline_rows = 2000;
    int have_slo = 0;
    rt_slo slo;
    double slo_tol = 0.01;
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
            format = v;
            if (!strcmp(v, "auto")) lo.format = PKV_TRACE_AUTO;
            else if (!strcmp(v, "native")) lo.format = PKV_TRACE_NATIVE;
            else if (!strcmp(v, "azure")) lo.format = PKV_TRACE_AZURE;
            else if (!strcmp(v, "burstgpt")) lo.format = PKV_TRACE_BURSTGPT;
            else if (!strcmp(v, "mooncake")) lo.format = PKV_TRACE_MOONCAKE;
            else BAD("unknown --format '%s'", v);
        } else if (!strcmp(a, "--load-scale")) {
            NEED();
            if (rt_parse_load_scales(v, &axes, err, sizeof err)) BAD("--load-scale %s", err);
        } else if (!strcmp(a, "--skip-bad")) {
            lo.skip_bad = 1;
        } else if (!strcmp(a, "--policy")) {
            NEED();
            if (rt_parse_policies(v, &axes, err, sizeof err)) BAD("--policy: %s", err);
            have_policy = 1;
        } else if (!strcmp(a, "--policy-plugin")) {
            NEED();
            if (axes.num_plugins == 8) BAD("at most 8 --policy-plugin");
            char why[512];
            if (load_plugin(v, &axes.plugins[axes.num_plugins], why, sizeof why) != 0)
                BAD("--policy-plugin %s", why);
            axes.num_plugins++;
        } else if (!strcmp(a, "--schedule")) {
            NEED();
            if (!strcmp(v, "own")) fixed_from = NULL;
            else if (!strncmp(v, "fixed-from ", 11) && v[11]) fixed_from = v + 11;
            else if (!strcmp(v, "fixed-from") && i + 1 < argc) fixed_from = argv[++i];
            else BAD("--schedule must be 'own' or 'fixed-from POLICY', got '%s'", v);
        } else if (!strcmp(a, "--sim-efficiency")) {
            NEED();
            sim_efficiency = v;
            if (!strcmp(v, "preset")) {
                prm.sim_eff = pkv_replay_params_default().sim_eff; // all 0: the GPU's own
            } else if (!strcmp(v, "peak")) {
                prm.sim_eff = pkv_sim_efficiency_peak();
            } else {
                double f[3];
                char *end = NULL;
                const char *q = v;
                int k = 0;
                for (; k < 3; k++) {
                    f[k] = strtod(q, &end);
                    if (end == q || (k < 2 ? *end != ',' : *end != '\0')) break;
                    q = end + 1;
                }
                if (k < 3 || !(f[0] > 0 && f[0] <= 1) || !(f[1] > 0 && f[1] <= 1) ||
                    !(f[2] >= 0 && isfinite(f[2])))
                    BAD("--sim-efficiency must be preset, peak or BW,COMPUTE,OVERHEAD_US (fractions "
                        "in (0, 1], microseconds >= 0), got '%s'", v);
                prm.sim_eff.bw_frac = f[0];
                prm.sim_eff.compute_frac = f[1];
                prm.sim_eff.step_overhead_s = f[2] * 1e-6;
                snprintf(prm.sim_eff.source, sizeof prm.sim_eff.source, "--sim-efficiency %.60s", v);
            }
        } else if (!strcmp(a, "--calibrate-out")) {
            NEED();
            calibrate_out = v;
        } else if (!strcmp(a, "--calibration")) {
            NEED();
            calibration = v;
        } else if (!strcmp(a, "--block-size")) {
            NEED();
            if (rt_parse_block_sizes(v, &axes, err, sizeof err)) BAD("--block-size: %s", err);
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
        } else if (!strcmp(a, "--kv-dtype")) {
            NEED();
            if (!strcmp(v, "fp16")) prm.kv_dtype = PKV_DTYPE_F32; // the default: as the weights
            else if (pkv_dtype_from_name(v, &prm.kv_dtype) != PKV_OK ||
                     !pkv_dtype_is_quantized(prm.kv_dtype))
                BAD("--kv-dtype must be fp16, int8, fp8_e4m3 or fp8_e5m2, got '%s'", v);
        } else if (!strcmp(a, "--no-prefix-sharing")) {
            prm.prefix_sharing = 0;
        } else if (!strcmp(a, "--vmm-page")) {
            NEED();
            if (pkv_size_parse(v, &prm.vmm_page_bytes) != PKV_OK || prm.vmm_page_bytes < 4096 ||
                prm.vmm_page_bytes % 4096 != 0)
                BAD("--vmm-page must be a multiple of 4K, e.g. 64K or 2M, got '%s'", v);
        } else if (!strcmp(a, "--vmm-map-ahead")) {
            prm.vmm_map_ahead = 1; // the default since vmm models vAttention as published
        } else if (!strcmp(a, "--vmm-defer-reclaim")) {
            prm.vmm_defer_reclaim = 1;
        } else if (!strcmp(a, "--vmm-no-map-ahead")) {
            prm.vmm_map_ahead = 0;
        } else if (!strcmp(a, "--vmm-no-defer-reclaim")) {
            prm.vmm_defer_reclaim = 0;
        } else if (!strcmp(a, "--device-mem")) {
            NEED();
            if (pkv_device_mem_from_name(v, &prm.device_mem) != PKV_OK)
                BAD("--device-mem must be cuda, arena or torch-caching, got '%s'", v);
        } else if (!strcmp(a, "--copy-overlap")) {
            prm.copy_overlap = 1;
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
            if (rt_parse_kv_mems(v, &axes, err, sizeof err)) BAD("--kv-mem: %s", err);
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
                BAD("--swap-space must be a size like 4G, 4GiB or 4GB, got '%s'", v);
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
        } else if (!strcmp(a, "--timeline-rows")) {
            NEED();
            if (parse_u32(v, &timeline_rows, 0)) BAD("--timeline-rows must be >= 0, got '%s'", v);
        } else if (!strcmp(a, "--requests")) {
            NEED();
            requests_path = v;
        } else if (!strcmp(a, "--csv")) {
            NEED();
            csv_path = v;
        } else if (!strcmp(a, "--jobs") || !strcmp(a, "-j")) {
            NEED();
            if (parse_u32(v, &jobs, 1) || jobs > 1024) BAD("--jobs must be 1..1024, got '%s'", v);
        } else if (!strcmp(a, "--point")) {
            NEED();
            if (rt_parse_shard(v, &shard_k, &shard_n))
                BAD("--point must be K/N with 1 <= K <= N, got '%s'", v);
        } else if (!strcmp(a, "--slo")) {
            NEED();
            if (rt_slo_parse(v, &slo, err, sizeof err)) BAD("%s", err);
            have_slo = 1;
        } else if (!strcmp(a, "--slo-tol")) {
            NEED();
            if (parse_f(v, &slo_tol) || !(slo_tol > 0 && slo_tol < 1))
                BAD("--slo-tol must be in (0, 1), got '%s'", v);
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
        char merr[256] = "";
        pkv_status ms = pkv_alloc_model_load(alloc_model, &prm.alloc_model, merr, sizeof merr);
        if (ms != PKV_OK)
            BAD("--alloc-model: %s", merr[0] ? merr : pkv_status_str(ms));
    }
    if (prm.batching == PKV_BATCHING_STATIC && prm.chunked_prefill)
        BAD("--chunked-prefill needs --batching continuous");
    if (axes.num_plugins && !have_policy) axes.policies[PKV_POLICY_PAGED] = 0; // plugins only
    if (calibrate_out && prm.mode != PKV_REPLAY_RUN) BAD("--calibrate-out needs --mode run");
    if (calibration && prm.mode != PKV_REPLAY_SIM) BAD("--calibration is for sim mode");
    // --alloc-model with --calibration: by-size call costs (bench_alloc --calibrate on
    // the same machine) replace the calibration's flat per-call ones.
    if (calibration && (gpu || alloc_call_us >= 0 || sim_efficiency))
        BAD("--calibration sets the machine and call costs: drop --gpu / --alloc-call-us / "
            "--sim-efficiency");
    if (sim_efficiency && prm.mode != PKV_REPLAY_SIM) BAD("--sim-efficiency is for sim mode");
    const int model_given = model != NULL;
    if (!model) model = prm.mode == PKV_REPLAY_RUN ? "tiny" : "llama2-7b";
    if (pkv_model_preset(model, &prm.model) != PKV_OK) BAD("unknown --model '%s'", model);
    if (gpu && pkv_gpu_preset(gpu, &prm.gpu) != PKV_OK)
        BAD("unknown --gpu '%s' (a100-80g, h100-80g, h200-141g)", gpu);
    if (calibration) {
        pkv_replay_calibration cal;
        char cerr[300];
        pkv_status cs = pkv_replay_calibration_load(calibration, &cal, cerr, sizeof cerr);
        if (cs != PKV_OK) BAD("--calibration: %s", cerr[0] ? cerr : pkv_status_str(cs));
        const pkv_model_config want = prm.model;
        const pkv_alloc_model by_size = prm.alloc_model;
        if (pkv_replay_params_apply_calibration(&prm, &cal, calibration) != PKV_OK)
            BAD("--calibration %s: unknown model '%s'", calibration, cal.model);
        if (model_given && strcmp(want.name, prm.model.name) != 0)
            BAD("--calibration %s was measured with model %s, not %s", calibration, cal.model, want.name);
        if (alloc_model) prm.alloc_model = by_size;
        prm.prefix_sharing = 0; // as the run it was measured with
        if (!have_kv) axes.kv_mems[0] = 64ull << 20;
    }
    if (prm.mode == PKV_REPLAY_RUN) {
        prm.dtype_bytes = 4; // the decoder keeps weights and KV in fp32
        if (prm.kv_dtype != PKV_DTYPE_F32) BAD("--kv-dtype is a sim mode option");
        if (!have_kv) axes.kv_mems[0] = 64ull << 20;
        if (prm.chunked_prefill || prm.batching != PKV_BATCHING_CONTINUOUS)
            BAD("--mode run supports continuous batching without --chunked-prefill only");
        // Learned positions cap the sequence length at the model's context.
        if (prm.max_seq_len == 0 || prm.max_seq_len > prm.model.max_seq_len)
            prm.max_seq_len = prm.model.max_seq_len;
        jobs = 1; // measured step times: one replay at a time
    }
    prm.block_size = axes.block_sizes[0];
    for (size_t k = 0; k < axes.num_kv_mems; k++) {
        uint64_t budget;
        pkv_replay_params q = prm;
        q.kv_mem_bytes = axes.kv_mems[k];
        if (pkv_replay_kv_budget(&q, &budget) != PKV_OK)
            BAD("model %s does not fit %s (use --kv-mem)", prm.model.name, prm.gpu.name);
    }
    double slo_lo = axes.load_scales[0], slo_hi = axes.load_scales[0];
    for (size_t i = 1; i < axes.num_load_scales; i++) {
        slo_lo = fmin(slo_lo, axes.load_scales[i]);
        slo_hi = fmax(slo_hi, axes.load_scales[i]);
    }
    if (json_path && csv_path && !strcmp(json_path, "-") && !strcmp(csv_path, "-"))
        BAD("--json - and --csv - would both write to stdout: give one a file");
    if (have_slo && (timeline_path || requests_path))
        BAD("--timeline and --requests record single runs; an --slo search makes many "
            "(sweep --load-scale instead)");
    if (have_slo && !(slo_hi > slo_lo))
        BAD("--slo searches between the smallest and the largest --load-scale: give two, "
            "e.g. --load-scale 0.25,16");

    rt_stamp stamp;
    if (rt_stamp_init(&stamp, argc, argv) != 0) {
        fprintf(stderr, "pkv-replay: out of memory\n");
        return 1;
    }
    if (shard_n > 1) snprintf(stamp.shard, sizeof stamp.shard, "%u/%u", shard_k, shard_n);
    uint64_t trace_hash = 0;
    pkv_trace *trace = NULL;
    pkv_trace_error terr;
    memset(&terr, 0, sizeof terr);
    pkv_status st = pkv_trace_load(trace_path, &lo, &trace, &terr);
    if (st == PKV_OK && rt_fnv1a64_file(trace_path, &trace_hash) != 0) st = PKV_ERR_IO;
    if (st != PKV_OK) {
        if ((st == PKV_ERR_FORMAT || st == PKV_ERR_IO) && terr.file[0]) {
            char where[32] = "";
            if (terr.line) snprintf(where, sizeof where, ":%llu", (unsigned long long)terr.line);
            fprintf(stderr, "pkv-replay: %s%s%s%s: %s\n", terr.file, where,
                    terr.field[0] ? ": field " : "", terr.field, terr.message);
        } else {
            fprintf(stderr, "pkv-replay: %s: %s\n", trace_path, pkv_status_str(st));
        }
        pkv_trace_destroy(trace);
        rt_stamp_free(&stamp);
        return st == PKV_ERR_OUT_OF_MEMORY ? 1 : 2;
    }
    // Arrivals are divided by the load scale: a tiny scale pushes the last one
    // to infinity, which the replay refuses. Say which option is at fault.
    const double last_arrival = pkv_trace_requests(trace)[pkv_trace_count(trace) - 1].arrival_s;
    for (size_t i = 0; i < axes.num_load_scales; i++) {
        if (!isfinite(last_arrival / axes.load_scales[i])) {
            pkv_trace_destroy(trace);
            rt_stamp_free(&stamp);
            BAD("--load-scale %g does not give valid arrivals: the last arrival, %g s, becomes "
                "infinite",
                axes.load_scales[i], last_arrival);
        }
    }
    // --schedule fixed-from P: record P's schedule at the one point of the run.
    pkv_replay_schedule *sched = NULL;
    if (fixed_from) {
        const pkv_policy_vtable *ref = NULL;
        pkv_policy k;
        if (pkv_policy_from_name(fixed_from, &k) == PKV_OK) ref = pkv_policy_builtin(k);
        for (size_t i = 0; i < axes.num_plugins && !ref; i++)
            if (!strcmp(axes.plugins[i]->name, fixed_from)) ref = axes.plugins[i];
        const char *why = !ref ? "unknown policy"
                          : (axes.num_kv_mems > 1 || axes.num_load_scales > 1 || axes.num_block_sizes > 1 || have_slo)
                              ? "a schedule belongs to one budget, load scale and block size (no sweep, no --slo)"
                              : NULL;
        if (why) {
            pkv_trace_destroy(trace);
            rt_stamp_free(&stamp);
            BAD("--schedule fixed-from %s: %s", fixed_from, why);
        }
        pkv_replay_params rp = prm;
        rp.custom_policy = ref;
        rp.kv_mem_bytes = axes.kv_mems[0];
        rp.load_scale = axes.load_scales[0];
        st = pkv_replay_schedule_record(trace, &rp, &sched, NULL);
        if (st != PKV_OK) {
            fprintf(stderr, "pkv-replay: recording the schedule of %s failed: %s\n", ref->name,
                    pkv_status_str(st));
            pkv_trace_destroy(trace);
            rt_stamp_free(&stamp);
            return st == PKV_ERR_INVALID_ARG ? 2 : 1;
        }
        prm.schedule = sched;
    }
    // The points: the sweep's cross product, or one SLO search per point
    // without its load scale; then this shard's share of them.
    rt_axes run_axes = axes;
    if (have_slo) run_axes.num_load_scales = 1;
    rt_point *points = NULL;
    const size_t num_points = rt_points(&run_axes, &points);
    size_t mine = 0;
    rt_result *results = calloc(num_points ? num_points : 1, sizeof *results);
    if (!points || !results) {
        fprintf(stderr, "pkv-replay: out of memory\n");
        free(points);
        free(results);
        pkv_trace_destroy(trace);
        rt_stamp_free(&stamp);
        return 1;
    }
    for (size_t i = 0; i < num_points; i++)
        if (i % shard_n == shard_k - 1) results[mine++].point = points[i];
    free(points);

    const int tty = isatty(fileno(stderr)) && !quiet;
    FILE *table_out = (json_path && !strcmp(json_path, "-")) || (csv_path && !strcmp(csv_path, "-"))
                          ? stderr
                          : stdout;
    char chunk[32] = "off";
    if (prm.chunked_prefill) snprintf(chunk, sizeof chunk, "%u tokens", prm.chunked_prefill);
    char step_time[192] = "measured wall time";
    pkv_sim_efficiency eff;
    if (prm.mode == PKV_REPLAY_SIM && pkv_replay_sim_efficiency(&prm, &eff) == PKV_OK)
        snprintf(step_time, sizeof step_time, "roofline at %.1f%% HBM bandwidth, %.1f%% compute, %g us/step (%s)",
                 100 * eff.bw_frac, 100 * eff.compute_frac, eff.step_overhead_s * 1e6, eff.source);
    fprintf(table_out,
            "trace %s: %zu requests (%s, %llu skipped); %zu point%s%s\n"
            "mode %s, model %s, GPU %s, KV %s; batching %s, chunked prefill %s; preempt %s (host pool "
            "%.1f GiB); alloc cost model: %s; step time: %s\n",
            trace_path, pkv_trace_count(trace), pkv_trace_format_name(pkv_trace_get_format(trace)),
            (unsigned long long)pkv_trace_skipped(trace), mine, mine == 1 ? "" : "s",
            shard_n > 1 ? " (this shard)" : "", prm.mode == PKV_REPLAY_SIM ? "sim" : "run",
            prm.model.name,
            prm.mode == PKV_REPLAY_SIM ? prm.gpu.name : (prm.run_cuda ? "cuda (measured)" : "cpu (measured)"),
            prm.kv_dtype != PKV_DTYPE_F32 ? pkv_dtype_name(prm.kv_dtype)
                                          : (prm.dtype_bytes == 4 ? "fp32" : prm.dtype_bytes == 2 ? "fp16" : "8-bit"),
            pkv_batching_name(prm.batching), chunk, pkv_preempt_mode_name(prm.preempt),
            (double)prm.swap_space_bytes / (1024.0 * 1024 * 1024),
            prm.mode == PKV_REPLAY_SIM ? prm.alloc_model.name : "measured",
            step_time);
    fflush(table_out);
    rt_install_stop_signals();
    struct timespec w0, w1;
    clock_gettime(CLOCK_MONOTONIC, &w0);
    const rt_job job = {
        .trace = trace,
        .base = &prm,
        .results = results,
        .num = mine,
        .jobs = jobs,
        // Calibration fits every step: no downsampling then.
        .timeline_limit = calibrate_out ? 0 : timeline_path ? timeline_rows : SIZE_MAX,
        .keep_requests = requests_path != NULL && !have_slo,
        .slo = have_slo ? &slo : NULL,
        .slo_lo = slo_lo,
        .slo_hi = slo_hi,
        .slo_tol = slo_tol,
        .progress = tty,
    };
    st = rt_run(&job);
    clock_gettime(CLOCK_MONOTONIC, &w1);
    int rc = 0;
    // Every point runs even when one fails (rt_run goes on); each failure is
    // named, and the points that ran are still reported.
    for (size_t i = 0; i < mine; i++) {
        const rt_result *r = &results[i];
        if (r->status != PKV_OK) {
            // A policy that broke its contract: the library names it, the slot
            // and the value (report.failure); PKV_ERR_CORRUPT: exit 1.
            const char *why = r->report.failure[0] ? r->report.failure : pkv_status_str(r->status);
            fprintf(stderr, "pkv-replay: point %u (policy %s) failed: %s\n", r->point.index,
                    rt_point_policy(&r->point), why);
            if (!rc) rc = r->status == PKV_ERR_INVALID_ARG ? 2 : 1;
        } else if (r->ran && r->report.failure[0] && !r->report.partial) {
            // (An interrupted run may not have completed a request yet: that is
            // the interruption, exit 130, not a failure of the policy.)
            fprintf(stderr, "pkv-replay: point %u (policy %s) completed no request: %s\n",
                    r->point.index, r->report.policy, r->report.failure);
            if (!rc) rc = 1;
        }
    }
    if (st != PKV_OK && !rc) {
        fprintf(stderr, "pkv-replay: replay failed: %s\n", pkv_status_str(st));
        rc = st == PKV_ERR_INVALID_ARG ? 2 : 1;
    }
    int wrc = 0; // output files: written whenever a point ran (failed runs hold nulls)
    const rt_doc doc = {
        .stamp = &stamp,
        .wall_s = (double)(w1.tv_sec - w0.tv_sec) + 1e-9 * (double)(w1.tv_nsec - w0.tv_nsec),
        .trace_path = trace_path,
        .trace = trace,
        .trace_hash = trace_hash,
        .format_option = format,
        .skip_bad = lo.skip_bad,
        .base = &prm,
        .axes = &axes,
        .num_points = num_points,
        .slo = have_slo ? &slo : NULL,
        .slo_lo = slo_lo,
        .slo_hi = slo_hi,
        .slo_tol = slo_tol,
        .results = results,
        .num_results = mine,
    };
    rt_print_table(table_out, &doc);
    if (sched) {
        fprintf(table_out, "schedule: fixed from %s (%llu steps, %llu events; deviations: the "
                           "table's sched dev)\n", fixed_from,
                (unsigned long long)pkv_replay_schedule_steps(sched),
                (unsigned long long)pkv_replay_schedule_events(sched));
    }
    if (calibrate_out && !rc && calibrate(calibrate_out, trace, &prm, results, mine, table_out) != 0) rc = 1;
    if (rt_stop_requested)
        fprintf(stderr, "pkv-replay: interrupted (%s); the report covers what was replayed (partial)\n",
                rt_stop_requested == SIGTERM ? "SIGTERM" : "SIGINT");
    // Every output whole or not at all, every failure named (out_file.h).
    out_file o;
    if (json_path) {
        if (out_open(&o, "pkv-replay", json_path) != 0) {
            wrc = 1;
        } else {
            rt_doc_write_json(o.f, &doc);
            if (out_close(&o) != 0) wrc = 1;
        }
    }
    if (csv_path) {
        if (out_open(&o, "pkv-replay", csv_path) != 0) {
            wrc = 1;
        } else {
            rt_doc_write_csv(o.f, &doc);
            if (out_close(&o) != 0) wrc = 1;
        }
    }
    if (timeline_path) {
        if (out_open(&o, "pkv-replay", timeline_path) != 0) {
            wrc = 1;
        } else {
            const pkv_replay_report *first = NULL; // one model per invocation
            for (size_t i = 0; i < mine && !first; i++)
                if (results[i].ran) first = &results[i].report;
            rt_timeline_header(o.f, first);
            for (size_t i = 0; i < mine; i++)
                if (results[i].ran) rt_timeline_write(o.f, &results[i]);
            if (out_close(&o) != 0) wrc = 1;
        }
    }
    if (requests_path) {
        if (out_open(&o, "pkv-replay", requests_path) != 0) {
            wrc = 1;
        } else {
            rt_requests_header(o.f);
            for (size_t i = 0; i < mine; i++)
                if (results[i].ran) rt_requests_write(o.f, &results[i]);
            if (out_close(&o) != 0) wrc = 1;
        }
    }
    for (size_t i = 0; i < mine; i++) {
        rt_timeline_free(&results[i].timeline);
        free(results[i].requests);
    }
    free(results);
    pkv_replay_schedule_destroy(sched);
    pkv_trace_destroy(trace);
    rt_stamp_free(&stamp);
    if (out_check_stdout("pkv-replay") != 0) wrc = 1; // the table (or a report on "-")
    if (wrc && !rc) rc = 1;
    if (rc == 0 && rt_stop_requested) rc = 128 + rt_stop_requested; // 130 SIGINT, 143 SIGTERM
    return rc;
}

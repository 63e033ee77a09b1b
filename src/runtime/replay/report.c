// SPDX-License-Identifier: MIT
// Replay output: the JSON document ({"trace", "config", "runs"}; key names and
// nesting are a contract documented in docs/BENCHMARKS.md) and the text table.
#include <math.h>
#include <string.h>

#include "replay_internal.h"

// JSON has no NaN or infinity; the report never produces them, but be safe.
static void num(FILE *f, double v) {
    if (isfinite(v))
        fprintf(f, "%.9g", v);
    else
        fputs("null", f);
}

// `key` (the separator and quoted name, e.g. ", \"step_p50_ms\": ") then the number.
static void field(FILE *f, const char *key, double v) {
    fputs(key, f);
    num(f, v);
}

static void str(FILE *f, const char *s) {
    fputc('"', f);
    for (; *s; s++) {
        unsigned char c = (unsigned char)*s;
        if (c == '"' || c == '\\')
            fprintf(f, "\\%c", c);
        else if (c < 0x20)
            fprintf(f, "\\u%04x", c);
        else
            fputc(c, f);
    }
    fputc('"', f);
}

static void write_run(FILE *f, const pkv_replay_report *r) {
    fputs("    {\"policy\": ", f);
    str(f, r->policy);
    fputs(", \"mode\": ", f);
    str(f, r->mode);
    fprintf(f, ", \"block_size\": %u, \"kv_bytes_per_token\": %llu,\n", r->block_size,
            (unsigned long long)r->kv_bytes_per_token);
    fprintf(f, "     \"requests\": {\"total\": %llu, \"completed\": %llu, \"rejected\": %llu},\n",
            (unsigned long long)r->requests.total, (unsigned long long)r->requests.completed,
            (unsigned long long)r->requests.rejected);
    fprintf(f,
            "     \"memory\": {\"capacity_bytes\": %llu, \"peak_reserved_bytes\": %llu, "
            "\"peak_used_bytes\": %llu, \"waste_frac\": ",
            (unsigned long long)r->memory.capacity_bytes,
            (unsigned long long)r->memory.peak_reserved_bytes,
            (unsigned long long)r->memory.peak_used_bytes);
    num(f, r->memory.waste_frac);
    field(f, ", \"internal_frag_frac\": ", r->memory.internal_frag_frac);
    field(f, ", \"reservation_frac\": ", r->memory.reservation_frac);
    field(f, ", \"external_frag_frac\": ", r->memory.external_frag_frac);
    fprintf(f, "},\n     \"alloc\": {\"backend_alloc_calls\": %llu, \"backend_free_calls\": %llu, "
               "\"backend_alloc_seconds\": ",
            (unsigned long long)r->alloc.backend_alloc_calls,
            (unsigned long long)r->alloc.backend_free_calls);
    num(f, r->alloc.backend_alloc_seconds);
    field(f, ", \"backend_free_seconds\": ", r->alloc.backend_free_seconds);
    fprintf(f, ", \"seconds_measured\": %s},\n", r->alloc.seconds_measured ? "true" : "false");
    field(f, "     \"latency\": {\"step_p50_ms\": ", r->latency.step_p50_ms);
    field(f, ", \"step_p90_ms\": ", r->latency.step_p90_ms);
    field(f, ", \"step_p99_ms\": ", r->latency.step_p99_ms);
    field(f, ", \"step_max_ms\": ", r->latency.step_max_ms);
    field(f, ", \"ttft_p50_ms\": ", r->latency.ttft_p50_ms);
    field(f, ", \"ttft_p99_ms\": ", r->latency.ttft_p99_ms);
    field(f, ", \"tpot_p50_ms\": ", r->latency.tpot_p50_ms);
    field(f, ", \"tpot_p99_ms\": ", r->latency.tpot_p99_ms);
    field(f, ", \"norm_ms_per_token\": ", r->latency.norm_ms_per_token);
    field(f, "},\n     \"throughput\": {\"output_tokens_per_s\": ", r->throughput.output_tokens_per_s);
    fprintf(f, ", \"output_tokens\": %llu, \"makespan_s\": ",
            (unsigned long long)r->throughput.output_tokens);
    num(f, r->throughput.makespan_s);
    field(f, "},\n     \"batch\": {\"mean\": ", r->batch.mean);
    fprintf(f, ", \"max\": %u},\n", r->batch.max);
    fprintf(f,
            "     \"steps\": %llu, \"preemptions\": %llu, \"forks\": %llu, \"cow_copies\": %llu, "
            "\"copy_bytes\": %llu, \"swap_bytes\": %llu, \"prefix_cached_tokens\": %llu, "
            "\"replay_seconds\": ",
            (unsigned long long)r->steps, (unsigned long long)r->preemptions,
            (unsigned long long)r->forks, (unsigned long long)r->cow_copies,
            (unsigned long long)r->copy_bytes, (unsigned long long)r->swap_bytes,
            (unsigned long long)r->prefix_cached_tokens);
    num(f, r->replay_seconds);
    fprintf(f, ", \"partial\": %s}", r->partial ? "true" : "false");
}

pkv_status pkv_replay_write_json(FILE *f, const char *trace_name, const pkv_trace *trace,
                                 const pkv_replay_params *p, const pkv_replay_report *reports,
                                 size_t n) {
    if (!f || !trace || !p || (!reports && n)) return PKV_ERR_INVALID_ARG;
    const pkv_trace_request *q = pkv_trace_requests(trace);
    const size_t count = pkv_trace_count(trace);
    double prompt = 0, output = 0;
    uint64_t samples = 0, grouped = 0;
    for (size_t i = 0; i < count; i++) {
        prompt += q[i].prompt_tokens;
        output += q[i].output_tokens;
        samples += q[i].n;
        grouped += q[i].prefix_group >= 0;
    }
    fputs("{\"trace\": {\"path\": ", f);
    str(f, trace_name ? trace_name : "");
    fputs(", \"format\": ", f);
    str(f, pkv_trace_format_name(pkv_trace_get_format(trace)));
    fprintf(f, ", \"requests\": %zu, \"skipped_rows\": %llu, \"samples\": %llu, "
               "\"prefix_grouped\": %llu, \"duration_s\": ",
            count, (unsigned long long)pkv_trace_skipped(trace), (unsigned long long)samples,
            (unsigned long long)grouped);
    num(f, count ? q[count - 1].arrival_s - q[0].arrival_s : 0);
    field(f, ", \"prompt_tokens_mean\": ", count ? prompt / (double)count : 0);
    field(f, ", \"output_tokens_mean\": ", count ? output / (double)count : 0);
    uint64_t budget = 0;
    pkv_replay_kv_budget(p, &budget);
    fputs("},\n \"config\": {\"mode\": ", f);
    str(f, p->mode == PKV_REPLAY_SIM ? "sim" : "run");
    fputs(", \"model\": ", f);
    str(f, p->model.name);
    fputs(", \"gpu\": ", f);
    str(f, p->mode == PKV_REPLAY_SIM ? p->gpu.name : (p->run_cuda ? "cuda" : "cpu"));
    fprintf(f, ", \"kv_budget_bytes\": %llu, \"gpu_util\": ", (unsigned long long)budget);
    num(f, p->gpu_util);
    fprintf(f, ", \"dtype_bytes\": %u, \"max_seq_len\": %u, \"max_batch\": %u, "
               "\"max_tokens_per_step\": %u, \"watermark\": ",
            p->dtype_bytes, p->max_seq_len ? p->max_seq_len : p->model.max_seq_len, p->max_batch,
            p->max_tokens_per_step);
    num(f, p->watermark);
    fputs(", \"preempt\": ", f);
    str(f, pkv_preempt_mode_name(p->preempt));
    fprintf(f, ", \"prefix_sharing\": %s, \"sim_alloc_call_s\": ",
            p->prefix_sharing ? "true" : "false");
    num(f, p->sim_alloc_call_s);
    fputs("},\n \"runs\": [\n", f);
    for (size_t i = 0; i < n; i++) {
        write_run(f, &reports[i]);
        fputs(i + 1 < n ? ",\n" : "\n", f);
    }
    fputs(" ]}\n", f);
    return ferror(f) ? PKV_ERR_IO : PKV_OK;
}

static void human_bytes(char *buf, size_t cap, uint64_t b) {
    const char *units[] = {"B", "KiB", "MiB", "GiB", "TiB"};
    double v = (double)b;
    int u = 0;
    while (v >= 1024 && u < 4) {
        v /= 1024;
        u++;
    }
    snprintf(buf, cap, u ? "%.1f %s" : "%.0f %s", v, units[u]);
}

pkv_status pkv_replay_write_table(FILE *f, const pkv_replay_report *r, size_t n) {
    if (!f || (!r && n)) return PKV_ERR_INVALID_ARG;
    fprintf(f, "%-18s %13s %10s %10s %6s %6s %6s %6s %9s %9s %8s %8s %8s %9s %7s %6s %6s\n",
            "policy", "done", "peak_rsv", "peak_used", "waste", "intern", "resv", "extern",
            "allocs", "frees", "step_p50", "step_p99", "ttft_p50", "tok/s", "batch", "preempt",
            "cow");
    for (size_t i = 0; i < n; i++) {
        char rsv[16], used[16], done[24];
        human_bytes(rsv, sizeof rsv, r[i].memory.peak_reserved_bytes);
        human_bytes(used, sizeof used, r[i].memory.peak_used_bytes);
        snprintf(done, sizeof done, "%llu/%llu", (unsigned long long)r[i].requests.completed,
                 (unsigned long long)r[i].requests.total);
        fprintf(f,
                "%-18s %13s %10s %10s %5.1f%% %5.1f%% %5.1f%% %5.1f%% %9llu %9llu %8.2f %8.2f "
                "%8.1f %9.0f %7.1f %6llu %6llu\n",
                r[i].policy, done, rsv, used, 100 * r[i].memory.waste_frac,
                100 * r[i].memory.internal_frag_frac, 100 * r[i].memory.reservation_frac,
                100 * r[i].memory.external_frag_frac,
                (unsigned long long)r[i].alloc.backend_alloc_calls,
                (unsigned long long)r[i].alloc.backend_free_calls, r[i].latency.step_p50_ms,
                r[i].latency.step_p99_ms, r[i].latency.ttft_p50_ms,
                r[i].throughput.output_tokens_per_s, r[i].batch.mean,
                (unsigned long long)r[i].preemptions, (unsigned long long)r[i].cow_copies);
    }
    return ferror(f) ? PKV_ERR_IO : PKV_OK;
}

// SPDX-License-Identifier: MIT
// The pkv-replay JSON document and CSV file. One line per top-level section so
// that `pkv-replay merge` can join shards line by line: the stamp (the only
// run-specific line), trace, config, sweep, one line per run in point order, and
// the closing line with the partial flag.
#include <string.h>

#include "replay_tools.h"

int rt_doc_partial(const rt_doc *d) {
    for (size_t i = 0; i < d->num_results; i++)
        if (!d->results[i].ran || d->results[i].report.partial) return 1;
    return 0;
}

static void trace_line(FILE *f, const rt_doc *d) {
    const pkv_trace_request *q = pkv_trace_requests(d->trace);
    const size_t n = pkv_trace_count(d->trace);
    double prompt = 0, output = 0;
    for (size_t i = 0; i < n; i++) {
        prompt += q[i].prompt_tokens;
        output += q[i].output_tokens;
    }
    fputs(" \"trace\": {\"path\": ", f);
    rt_json_str(f, d->trace_path);
    fputs(", \"format\": ", f);
    rt_json_str(f, pkv_trace_format_name(pkv_trace_get_format(d->trace)));
    fprintf(f, ", \"fnv1a64\": \"%016llx\", \"requests\": %zu, \"skipped_rows\": %llu, "
               "\"duration_s\": ",
            (unsigned long long)d->trace_hash, n, (unsigned long long)pkv_trace_skipped(d->trace));
    rt_json_num(f, n ? q[n - 1].arrival_s - q[0].arrival_s : 0);
    fputs(", \"prompt_tokens_mean\": ", f);
    rt_json_num(f, n ? prompt / (double)n : 0);
    fputs(", \"output_tokens_mean\": ", f);
    rt_json_num(f, n ? output / (double)n : 0);
    fputs("},\n", f);
}

static void config_line(FILE *f, const rt_doc *d) {
    const pkv_replay_params *p = d->base;
    const int sim = p->mode == PKV_REPLAY_SIM;
    fputs(" \"config\": {\"mode\": ", f);
    rt_json_str(f, sim ? "sim" : "run");
    fputs(", \"format\": ", f);
    rt_json_str(f, d->format_option);
    fprintf(f, ", \"skip_bad\": %s, \"model\": ", d->skip_bad ? "true" : "false");
    rt_json_str(f, p->model.name);
    fputs(", \"gpu\": ", f);
    rt_json_str(f, sim ? p->gpu.name : (p->run_cuda ? "cuda" : "cpu"));
    fputs(", \"gpu_util\": ", f);
    rt_json_num(f, p->gpu_util);
    fprintf(f, ", \"kv_dtype\": \"%s\"", p->kv_dtype != PKV_DTYPE_F32 ? pkv_dtype_name(p->kv_dtype) : "as dtype_bytes");
    fprintf(f, ", \"dtype_bytes\": %u, \"max_seq_len\": %u, \"max_batch\": %u, "
               "\"max_tokens_per_step\": %u, \"watermark\": ",
            p->dtype_bytes, p->max_seq_len ? p->max_seq_len : p->model.max_seq_len, p->max_batch,
            p->max_tokens_per_step);
    rt_json_num(f, p->watermark);
    fputs(", \"preempt\": ", f);
    rt_json_str(f, pkv_preempt_mode_name(p->preempt));
    fprintf(f, ", \"prefix_sharing\": %s, \"swap_space_bytes\": %llu, \"batching\": ",
            p->prefix_sharing ? "true" : "false", (unsigned long long)p->swap_space_bytes);
    rt_json_str(f, pkv_batching_name(p->batching));
    fprintf(f, ", \"chunked_prefill\": %u, \"alloc_model\": ", p->chunked_prefill);
    if (sim) // the whole model, so a run can be repeated from the stamp alone
        pkv_alloc_model_write_json(f, &p->alloc_model);
    else
        fputs("null", f); // run mode measures the calls
    fputs(", \"sim_efficiency\": ", f);
    pkv_sim_efficiency eff;
    if (sim && pkv_replay_sim_efficiency(p, &eff) == PKV_OK) { // the factors the roofline used
        fputs("{\"bw_frac\": ", f);
        rt_json_num(f, eff.bw_frac);
        fputs(", \"compute_frac\": ", f);
        rt_json_num(f, eff.compute_frac);
        fputs(", \"step_overhead_us\": ", f);
        rt_json_num(f, eff.step_overhead_s * 1e6);
        fputs(", \"host_link_frac\": ", f);
        rt_json_num(f, pkv_replay_host_link_frac(p));
        fputs(", \"source\": ", f);
        rt_json_str(f, eff.source);
        fputc('}', f);
    } else {
        fputs("null", f); // run mode measures the steps
    }
    fprintf(f, ", \"run_threads\": %u, \"seed\": %llu, \"validate\": %s},\n", p->run_threads,
            (unsigned long long)p->seed, p->validate ? "true" : "false");
}

static void sweep_line(FILE *f, const rt_doc *d) {
    const rt_axes *a = d->axes;
    fputs(" \"sweep\": {\"policies\": [", f);
    int first = 1;
    for (int p = 0; p < PKV_POLICY_COUNT; p++) {
        if (!a->policies[p]) continue;
        if (!first) fputs(", ", f);
        rt_json_str(f, pkv_policy_name((pkv_policy)p));
        first = 0;
    }
    fputs("], \"block_sizes\": [", f);
    for (size_t i = 0; i < a->num_block_sizes; i++)
        fprintf(f, "%s%u", i ? ", " : "", a->block_sizes[i]);
    fputs("], \"load_scales\": [", f);
    for (size_t i = 0; i < a->num_load_scales; i++) {
        if (i) fputs(", ", f);
        rt_json_num(f, a->load_scales[i]);
    }
    fputs("], \"kv_mem_bytes\": [", f);
    for (size_t i = 0; i < a->num_kv_mems; i++) {
        uint64_t b = a->kv_mems[i];
        if (b == 0) { // the default budget, as the replay computes it
            pkv_replay_params p = *d->base;
            p.kv_mem_bytes = 0;
            if (pkv_replay_kv_budget(&p, &b) != PKV_OK) b = 0;
        }
        fprintf(f, "%s%llu", i ? ", " : "", (unsigned long long)b);
    }
    fprintf(f, "], \"points\": %zu, \"slo\": ", d->num_points);
    if (d->slo) {
        fputs("{\"spec\": ", f);
        rt_json_str(f, d->slo->text);
        fputs(", \"load_scale_lo\": ", f);
        rt_json_num(f, d->slo_lo);
        fputs(", \"load_scale_hi\": ", f);
        rt_json_num(f, d->slo_hi);
        fputs(", \"tolerance\": ", f);
        rt_json_num(f, d->slo_tol);
        fputc('}', f);
    } else {
        fputs("null", f);
    }
    fputs("},\n", f);
}

void rt_doc_write_json(FILE *f, const rt_doc *d) {
    fputs("{\"stamp\": ", f);
    rt_stamp_write(f, d->stamp, d->wall_s, d->results, d->num_results);
    fputs(",\n", f);
    trace_line(f, d);
    config_line(f, d);
    sweep_line(f, d);
    fputs(" \"runs\": [\n", f);
    size_t last = d->num_results;
    for (size_t i = 0; i < d->num_results; i++)
        if (d->results[i].ran) last = i;
    for (size_t i = 0; i < d->num_results; i++) {
        if (!d->results[i].ran) continue;
        fputs("  ", f);
        rt_record_json(f, &d->results[i], d->slo != NULL);
        fputs(i == last ? "\n" : ",\n", f);
    }
    fprintf(f, " ],\n \"partial\": %s}\n", rt_doc_partial(d) ? "true" : "false");
}

void rt_doc_write_csv(FILE *f, const rt_doc *d) {
    rt_record_csv_header(f, d->slo != NULL);
    for (size_t i = 0; i < d->num_results; i++)
        if (d->results[i].ran)
            rt_record_csv_row(f, &d->results[i], d->slo != NULL, d->stamp->commit, d->trace_hash);
}

// "%*.*f", or n/a where the figure is undefined (a run that completed nothing).
static void cell(FILE *f, int width, int prec, double v) {
    if (v == v && v - v == 0)
        fprintf(f, " %*.*f", width, prec, v);
    else
        fprintf(f, " %*s", width, "n/a");
}

static void gib(char *buf, size_t cap, uint64_t b) {
    snprintf(buf, cap, "%.2f", (double)b / (1024.0 * 1024 * 1024));
}

void rt_print_table(FILE *f, const rt_doc *d) {
    const rt_axes *a = d->axes;
    const int plain = !d->slo && a->num_block_sizes == 1 && a->num_load_scales == 1 &&
                      a->num_kv_mems == 1;
    size_t ran = 0;
    for (size_t i = 0; i < d->num_results; i++) ran += d->results[i].ran;
    if (ran == 0) return;
    if (plain) {
        pkv_replay_report reps[PKV_POLICY_COUNT];
        size_t n = 0;
        for (size_t i = 0; i < d->num_results && n < PKV_POLICY_COUNT; i++)
            if (d->results[i].ran) reps[n++] = d->results[i].report;
        fprintf(f, "load x%g, KV budget %.2f GiB\n", a->load_scales[0],
                (double)reps[0].memory.capacity_bytes / (1024.0 * 1024 * 1024));
        pkv_replay_write_table(f, reps, n);
    } else if (!d->slo) {
        fprintf(f, "%5s %-20s %5s %7s %8s %13s %8s %9s %6s %9s %9s %9s %9s %7s\n", "point",
                "policy", "block", "load", "kv_GiB", "done", "rejected", "rsv_GiB", "waste%",
                "ttft_p99", "tpot_p50", "norm_lat", "tok/s", "preempt");
        uint64_t too_long = 0, no_mem = 0;
        for (size_t i = 0; i < d->num_results; i++) {
            const rt_result *r = &d->results[i];
            if (!r->ran) continue;
            char kv[16], rsv[16], done[32];
            gib(kv, sizeof kv, r->report.memory.capacity_bytes);
            gib(rsv, sizeof rsv, r->report.memory.peak_reserved_bytes);
            snprintf(done, sizeof done, "%llu/%llu%s",
                     (unsigned long long)r->report.requests.completed,
                     (unsigned long long)r->report.requests.total, r->report.partial ? "*" : "");
            fprintf(f, "%5u %-20s %5u %7g %8s %13s %8llu %9s", r->point.index, r->report.policy,
                    r->report.block_size, r->point.load_scale, kv, done,
                    (unsigned long long)r->report.requests.rejected, rsv);
            if (r->report.requests.rejected_too_long > too_long)
                too_long = r->report.requests.rejected_too_long;
            if (r->report.requests.rejected_no_memory > no_mem)
                no_mem = r->report.requests.rejected_no_memory;
            cell(f, 6, 1, 100 * r->report.memory.waste_frac);
            cell(f, 9, 1, r->report.latency.ttft_p99_ms);
            cell(f, 9, 2, r->report.latency.tpot_p50_ms);
            cell(f, 9, 2, r->report.latency.norm_ms_per_token);
            cell(f, 9, 0, r->report.throughput.output_tokens_per_s);
            fprintf(f, " %7llu\n", (unsigned long long)r->report.preemptions);
        }
        fputs("(latencies in ms, norm_lat in ms per output token; * = partial; n/a: completed "
              "nothing)\n",
              f);
        if (too_long || no_mem)
            fprintf(f, "(rejected: up to %llu requests longer than the model's context "
                       "(--max-seq-len) or wider than --max-batch, up to %llu needing more KV "
                       "memory than the budget; per run: requests.rejected_* in --json/--csv)\n",
                    (unsigned long long)too_long, (unsigned long long)no_mem);
    } else {
        fprintf(f, "SLO %s, load scale searched in [%g, %g]\n", d->slo->text, d->slo_lo, d->slo_hi);
        fprintf(f, "%5s %-20s %5s %8s %10s %9s %9s %9s %9s %9s %6s\n", "point", "policy", "block",
                "kv_GiB", "max_load", "req/s", "tok/s", "ttft_p99", "tpot_p50", "norm_lat",
                "probes");
        for (size_t i = 0; i < d->num_results; i++) {
            const rt_result *r = &d->results[i];
            if (!r->ran) continue;
            char kv[16], load[32];
            gib(kv, sizeof kv, r->report.memory.capacity_bytes);
            if (!r->slo_met)
                snprintf(load, sizeof load, "< %g", r->point.load_scale);
            else
                snprintf(load, sizeof load, "%s%.4g%s", r->slo_bounded ? "" : ">= ",
                         r->point.load_scale, r->report.partial ? "*" : "");
            fprintf(f, "%5u %-20s %5u %8s %10s %9.3f %9.0f", r->point.index, r->report.policy,
                    r->report.block_size, kv, load, r->slo_met ? r->request_rate : 0.0,
                    r->slo_met ? r->report.throughput.output_tokens_per_s : 0.0);
            cell(f, 9, 1, r->report.latency.ttft_p99_ms);
            cell(f, 9, 2, r->report.latency.tpot_p50_ms);
            cell(f, 9, 2, r->report.latency.norm_ms_per_token);
            fprintf(f, " %6u\n", r->slo_probes);
        }
        fputs("(max_load: highest load scale meeting the SLO; req/s and tok/s there; "
              "* = interrupted)\n",
              f);
    }
}

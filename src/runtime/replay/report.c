// SPDX-License-Identifier: MIT
// Replay output: the JSON document ({"trace", "config", "runs"}; key names and
// nesting are a contract: docs/DESIGN.md "What the numbers mean") and the
// text tables (units in the headers; n/a where a figure is undefined).
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

pkv_status pkv_replay_write_groups_json(FILE *f, const pkv_replay_report *r) {
    if (!f || !r || r->memory.num_groups > PKV_MAX_KV_GROUPS) return PKV_ERR_INVALID_ARG;
    fputc('[', f);
    for (uint32_t g = 0; g < r->memory.num_groups; g++) {
        const struct pkv_replay_group_report *o = &r->memory.groups[g];
        fprintf(f, "%s{\"kind\": ", g ? ", " : "");
        str(f, o->kind);
        fprintf(f, ", \"layers\": %u, \"window\": %u, \"bytes_per_token\": %llu", o->layers,
                o->window, (unsigned long long)o->bytes_per_token);
        field(f, ", \"needed_frac\": ", o->needed_frac);
        field(f, ", \"held_frac\": ", o->held_frac);
        field(f, ", \"tokens_held_mean\": ", o->tokens_held_mean);
        fprintf(f, ", \"peak_held_bytes\": %llu, \"blocks_released\": %llu, \"cached_tokens\": %llu}",
                (unsigned long long)o->peak_held_bytes, (unsigned long long)o->blocks_released,
                (unsigned long long)o->cached_tokens);
    }
    fputc(']', f);
    return ferror(f) ? PKV_ERR_IO : PKV_OK;
}

static void write_run(FILE *f, const pkv_replay_report *r) {
    fputs("    {\"policy\": ", f);
    str(f, r->policy);
    fputs(", \"mode\": ", f);
    str(f, r->mode);
    fprintf(f, ", \"block_size\": %u, \"kv_bytes_per_token\": %llu,\n", r->block_size,
            (unsigned long long)r->kv_bytes_per_token);
    fprintf(f, "     \"requests\": {\"total\": %llu, \"completed\": %llu, \"rejected\": %llu, "
               "\"rejected_too_long\": %llu, \"rejected_no_memory\": %llu},\n",
            (unsigned long long)r->requests.total, (unsigned long long)r->requests.completed,
            (unsigned long long)r->requests.rejected,
            (unsigned long long)r->requests.rejected_too_long,
            (unsigned long long)r->requests.rejected_no_memory);
    fputs("     \"failure\": ", f);
    if (r->failure[0])
        str(f, r->failure);
    else
        fputs("null", f);
    fputs(",\n", f);
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
    field(f, ",\n                \"breakdown\": {\"token_states\": ", r->memory.breakdown.token_states);
    field(f, ", \"reserved\": ", r->memory.breakdown.reserved);
    field(f, ", \"internal_frag\": ", r->memory.breakdown.internal_frag);
    field(f, ", \"external_frag\": ", r->memory.breakdown.external_frag);
    field(f, ", \"free\": ", r->memory.breakdown.free);
    field(f, "}, \"padding_frac\": ", r->memory.padding_frac);
    fprintf(f, ", \"device_mem\": \"%s\"", r->memory.device_mem);
    if (r->memory.num_groups) {
        fputs(",\n                \"groups\": ", f);
        (void)pkv_replay_write_groups_json(f, r);
    }
    fprintf(f, "},\n     \"alloc\": {\"backend_alloc_calls\": %llu, \"backend_free_calls\": %llu, "
               "\"backend_alloc_seconds\": ",
            (unsigned long long)r->alloc.backend_alloc_calls,
            (unsigned long long)r->alloc.backend_free_calls);
    num(f, r->alloc.backend_alloc_seconds);
    field(f, ", \"backend_free_seconds\": ", r->alloc.backend_free_seconds);
    field(f, ", \"step_seconds\": ", r->alloc.step_seconds);
    field(f, ", \"overlapped_seconds\": ", r->alloc.overlapped_seconds);
    fprintf(f, ", \"seconds_measured\": %s, \"model\": ", r->alloc.seconds_measured ? "true" : "false");
    str(f, r->alloc.model);
    fputs("},\n", f);
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
    field(f, "     \"time\": {\"busy_s\": ", r->time.busy_s);
    field(f, ", \"prefill_frac\": ", r->time.prefill_frac);
    field(f, ", \"decode_frac\": ", r->time.decode_frac);
    field(f, ", \"decode_compute_util\": ", r->time.decode_compute_util);
    field(f, ", \"decode_bw_util\": ", r->time.decode_bw_util);
    fprintf(f, "},\n     \"swap_out_bytes\": %llu, \"swap_in_bytes\": %llu, \"swap_fallbacks\": %llu, "
               "\"padding_tokens\": %llu,\n",
            (unsigned long long)r->swap_out_bytes, (unsigned long long)r->swap_in_bytes,
            (unsigned long long)r->swap_fallbacks, (unsigned long long)r->padding_tokens);
    fprintf(f,
            "     \"steps\": %llu, \"preemptions\": %llu, \"forks\": %llu, \"cow_copies\": %llu, "
            "\"copy_bytes\": %llu, \"swap_bytes\": %llu, \"prefix_cached_tokens\": %llu, "
            "\"replay_seconds\": ",
            (unsigned long long)r->steps, (unsigned long long)r->preemptions,
            (unsigned long long)r->forks, (unsigned long long)r->cow_copies,
            (unsigned long long)r->copy_bytes, (unsigned long long)r->swap_bytes,
            (unsigned long long)r->prefix_cached_tokens);
    num(f, r->replay_seconds);
    fputs(", \"schedule\": ", f);
    str(f, r->schedule[0] ? r->schedule : "own");
    fprintf(f, ", \"schedule_deviations\": %llu", (unsigned long long)r->schedule_deviations);
    if (!strcmp(r->mode, "run"))
        fprintf(f,
                ", \"run\": {\"token_hash\": \"%016llx\", \"tokens\": %llu, \"layout\": \"%s\", "
                "\"copied_bytes\": %llu}",
                (unsigned long long)r->run.token_hash, (unsigned long long)r->run.tokens, r->run.layout,
                (unsigned long long)r->run.copied_bytes);
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
    fprintf(f, ", \"prefix_sharing\": %s, \"swap_space_bytes\": %llu, \"batching\": ",
            p->prefix_sharing ? "true" : "false", (unsigned long long)p->swap_space_bytes);
    str(f, pkv_batching_name(p->batching));
    fprintf(f, ", \"chunked_prefill\": %u, \"load_scale\": ", p->chunked_prefill);
    num(f, p->load_scale);
    fprintf(f, ", \"vmm_page_bytes\": %llu, \"vmm_map_ahead\": %s, \"vmm_defer_reclaim\": %s",
            (unsigned long long)p->vmm_page_bytes, p->vmm_map_ahead ? "true" : "false",
            p->vmm_defer_reclaim ? "true" : "false");
    fputs(",\n            \"alloc_model\": ", f);
    if (p->mode == PKV_REPLAY_SIM)
        pkv_alloc_model_write_json(f, &p->alloc_model);
    else
        fputs("null", f);
    fputs(",\n            \"sim_efficiency\": ", f);
    pkv_sim_efficiency eff;
    if (p->mode == PKV_REPLAY_SIM && pkv_replay_sim_efficiency(p, &eff) == PKV_OK) {
        field(f, "{\"bw_frac\": ", eff.bw_frac);
        field(f, ", \"compute_frac\": ", eff.compute_frac);
        field(f, ", \"step_overhead_us\": ", eff.step_overhead_s * 1e6);
        field(f, ", \"host_link_frac\": ", pkv_replay_host_link_frac(p));
        fputs(", \"source\": ", f);
        str(f, eff.source);
        fputc('}', f);
    } else {
        fputs("null", f);
    }
    fputs("},\n \"runs\": [\n", f);
    for (size_t i = 0; i < n; i++) {
        write_run(f, &reports[i]);
        fputs(i + 1 < n ? ",\n" : "\n", f);
    }
    fputs(" ]}\n", f);
    return ferror(f) ? PKV_ERR_IO : PKV_OK;
}

// A number with `prec` decimals, or "n/a" when it is undefined (NaN).
static void cell(FILE *f, int width, int prec, double v) {
    if (isfinite(v))
        fprintf(f, " %*.*f", width, prec, v);
    else
        fprintf(f, " %*s", width, "n/a");
}

static const double GiB = 1024.0 * 1024.0 * 1024.0;

// Whether any run replayed a fixed schedule (then the first table shows each
// policy's deviations from it: with many, its figures mix memory and timing).
static int any_fixed(const pkv_replay_report *r, size_t n) {
    for (size_t i = 0; i < n; i++)
        if (strncmp(r[i].schedule, "fixed", 5) == 0) return 1;
    return 0;
}

// Under the first table: why requests were rejected (its rejected column).
static void rejections(FILE *f, const pkv_replay_report *r, size_t n) {
    int same = 1;
    uint64_t any = 0;
    for (size_t i = 0; i < n; i++) {
        any += r[i].requests.rejected;
        same &= r[i].requests.rejected_too_long == r[0].requests.rejected_too_long &&
                r[i].requests.rejected_no_memory == r[0].requests.rejected_no_memory;
    }
    if (!any) return;
    for (size_t i = 0; i < (same ? 1 : n); i++) {
        const uint64_t lng = r[i].requests.rejected_too_long, mem = r[i].requests.rejected_no_memory;
        if (!lng && !mem) continue;
        fprintf(f, "rejected by %s:", same ? "every policy" : r[i].policy);
        if (lng)
            fprintf(f, " %llu longer than the model's context (--max-seq-len) or wider than "
                       "--max-batch%s",
                    (unsigned long long)lng, mem ? ";" : "");
        if (mem)
            fprintf(f, " %llu needing more KV memory than the whole budget", (unsigned long long)mem);
        fputc('\n', f);
    }
}

// Models with KV cache groups: what each group needs and holds, per policy.
static void group_table(FILE *f, const pkv_replay_report *r, size_t n) {
    size_t any = 0;
    for (size_t i = 0; i < n; i++) any += r[i].memory.num_groups;
    if (!any) return;
    fprintf(f, "\n%-20s %-5s %-8s %6s %7s %7s %7s %9s %10s\n", "policy", "group", "kind", "window",
            "need%", "held%", "peak", "tokens", "released");
    fprintf(f, "%-20s %-5s %-8s %6s %7s %7s %7s %9s %10s\n", "", "", "", "", "", "", "GiB", "held",
            "blocks");
    for (size_t i = 0; i < n; i++)
        for (uint32_t g = 0; g < r[i].memory.num_groups; g++) {
            const struct pkv_replay_group_report *o = &r[i].memory.groups[g];
            fprintf(f, "%-20s %-5u %-8s %6u", g ? "" : r[i].policy, g, o->kind, o->window);
            cell(f, 7, 1, 100 * o->needed_frac);
            cell(f, 7, 1, 100 * o->held_frac);
            cell(f, 7, 2, (double)o->peak_held_bytes / GiB);
            cell(f, 9, 0, o->tokens_held_mean);
            fprintf(f, " %10llu\n", (unsigned long long)o->blocks_released);
        }
    fputs("(per KV cache group, time-averaged shares of the KV budget: need: the tokens its\n"
          " next query can see; held: the blocks it holds (a policy that treats every layer\n"
          " as full attention holds every reserved slot in every group); released: blocks\n"
          " freed as they left the window)\n",
          f);
}

pkv_status pkv_replay_write_table(FILE *f, const pkv_replay_report *r, size_t n) {
    if (!f || (!r && n)) return PKV_ERR_INVALID_ARG;
    const int fixed = any_fixed(r, n);
    fprintf(f, "%-20s %13s %8s %8s %8s %7s %10s %9s %8s %8s %8s %8s %9s %6s %7s%s\n", "policy",
            "done", "rejected", "rsv GiB", "used GiB", "waste%", "allocs", "alloc s", "step p50",
            "step p99", "TTFT p50", "TPOT p50", "tok/s", "batch", "preempt",
            fixed ? " sched dev" : "");
    fprintf(f, "%-20s %13s %8s %8s %8s %7s %10s %9s %8s %8s %8s %8s %9s %6s %7s%s\n", "", "", "",
            "peak", "peak", "", "(calls)", "in steps", "ms", "ms", "s", "ms", "", "mean", "",
            fixed ? "  (events)" : "");
    for (size_t i = 0; i < n; i++) {
        char done[24];
        snprintf(done, sizeof done, "%llu/%llu", (unsigned long long)r[i].requests.completed,
                 (unsigned long long)r[i].requests.total);
        fprintf(f, "%-20s %13s %8llu", r[i].policy, done, (unsigned long long)r[i].requests.rejected);
        cell(f, 8, 2, (double)r[i].memory.peak_reserved_bytes / GiB);
        cell(f, 8, 2, (double)r[i].memory.peak_used_bytes / GiB);
        cell(f, 7, 1, 100 * r[i].memory.waste_frac);
        fprintf(f, " %10llu", (unsigned long long)r[i].alloc.backend_alloc_calls);
        cell(f, 9, 3, r[i].alloc.step_seconds);
        cell(f, 8, 2, r[i].latency.step_p50_ms);
        cell(f, 8, 2, r[i].latency.step_p99_ms);
        cell(f, 8, 2, r[i].latency.ttft_p50_ms / 1e3);
        cell(f, 8, 2, r[i].latency.tpot_p50_ms);
        cell(f, 9, 0, r[i].throughput.output_tokens_per_s);
        cell(f, 6, 1, r[i].batch.mean);
        fprintf(f, " %7llu", (unsigned long long)r[i].preemptions);
        if (fixed) fprintf(f, " %9llu", (unsigned long long)r[i].schedule_deviations);
        fputc('\n', f);
    }
    fputs("(done: completed / requests in the trace; rsv: reserved by the policy; waste: share\n"
          " of the reserved KV memory holding no token state, time-averaged; allocs: backend\n"
          " allocation calls, alloc s: their cost charged to steps; tok/s: output tokens per\n"
          " second; batch: sequences per step)\n",
          f);
    rejections(f, r, n);
    if (fixed)
        fputs("(sched dev: events of the fixed schedule a policy could not follow: an admission\n"
              " delayed, a preemption added; above 0 its figures mix memory and timing effects,\n"
              " docs/POLICIES.md \"Fixed schedule\")\n",
              f);
    // The capacity breakdown (vLLM paper, fig. 2) and where the time goes.
    fprintf(f, "\n%-20s %-39s | %-35s | %s\n", "", "KV budget, % time-averaged",
            "busy time %, decode utilization %", "GiB moved");
    fprintf(f, "%-20s %7s %7s %7s %7s %7s | %8s %8s %8s %8s | %8s %8s %8s\n", "policy",
            "tokens", "reservd", "intern", "extern", "free", "prefill", "decode", "dec cmp",
            "dec bw", "copied", "swap out", "swap in");
    for (size_t i = 0; i < n; i++) {
        fprintf(f, "%-20s", r[i].policy);
        cell(f, 7, 1, 100 * r[i].memory.breakdown.token_states);
        cell(f, 7, 1, 100 * r[i].memory.breakdown.reserved);
        cell(f, 7, 1, 100 * r[i].memory.breakdown.internal_frag);
        cell(f, 7, 1, 100 * r[i].memory.breakdown.external_frag);
        cell(f, 7, 1, 100 * r[i].memory.breakdown.free);
        fputs(" |", f);
        cell(f, 8, 1, 100 * r[i].time.prefill_frac);
        cell(f, 8, 1, 100 * r[i].time.decode_frac);
        cell(f, 8, 2, 100 * r[i].time.decode_compute_util);
        cell(f, 8, 1, 100 * r[i].time.decode_bw_util);
        fputs(" |", f);
        cell(f, 8, 2, (double)r[i].copy_bytes / GiB);
        cell(f, 8, 2, (double)r[i].swap_out_bytes / GiB);
        cell(f, 8, 2, (double)r[i].swap_in_bytes / GiB);
        fputc('\n', f);
    }
    fputs("(tokens: token states; reservd: reserved for tokens to come; intern, extern:\n"
          " internal and external fragmentation; free: the rest (the five add up to 100);\n"
          " prefill, decode: shares of the busy time; dec cmp, dec bw: the decode steps' compute\n"
          " and HBM bandwidth utilization; copied: K/V copied (copy-on-write, regrowth); swap:\n"
          " to and from the host pool)\n",
          f);
    group_table(f, r, n);
    for (size_t i = 0; i < n; i++) {
        if (r[i].failure[0]) fprintf(f, "%s: completed nothing: %s\n", r[i].policy, r[i].failure);
        if (r[i].run.layout[0]) // run mode: what the decoder actually ran on
            fprintf(f, "%s: ran on the %s layout, %llu positions computed (token hash %016llx), "
                       "%.3f GiB of K/V copied\n",
                    r[i].policy, r[i].run.layout, (unsigned long long)r[i].run.tokens,
                    (unsigned long long)r[i].run.token_hash, (double)r[i].run.copied_bytes / GiB);
        if (r[i].padding_tokens)
            fprintf(f, "%s: static batching computed %llu padding tokens; padding held %.1f%% of "
                       "the KV budget (time-averaged, inside token states)\n",
                    r[i].policy, (unsigned long long)r[i].padding_tokens, 100 * r[i].memory.padding_frac);
    }
    return ferror(f) ? PKV_ERR_IO : PKV_OK;
}

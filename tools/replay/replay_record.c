// SPDX-License-Identifier: MIT
// One run of a sweep as a JSON line and as a CSV row, both written from one
// table of the report's fields so that the CSV columns are exactly the JSON
// keys (nested keys joined with dots, any depth: memory.breakdown.free). A field
// added to pkv_replay_report appears in both outputs once it has a row here.
// Undefined figures (NaN: a run that completed nothing) are JSON null and an
// empty CSV cell, never 0; so is an empty `failure`.
#include <stddef.h>
#include <string.h>

#include "replay_tools.h"

typedef enum { T_STR, T_STR_OPT, T_U32, T_U64, T_F64, T_BOOL } ftype; // T_STR_OPT: "" = null

typedef struct field {
    const char *key; // "group.name" or "name"
    ftype type;
    size_t offset;
} field;

#define F(key, type, member) {key, type, offsetof(pkv_replay_report, member)}
static const field fields[] = {
    F("policy", T_STR, policy),
    F("mode", T_STR, mode),
    F("block_size", T_U32, block_size),
    F("kv_bytes_per_token", T_U64, kv_bytes_per_token),
    F("requests.total", T_U64, requests.total),
    F("requests.completed", T_U64, requests.completed),
    F("requests.rejected", T_U64, requests.rejected),
    F("requests.rejected_too_long", T_U64, requests.rejected_too_long),
    F("requests.rejected_no_memory", T_U64, requests.rejected_no_memory),
    F("failure", T_STR_OPT, failure),
    F("memory.capacity_bytes", T_U64, memory.capacity_bytes),
    F("memory.peak_reserved_bytes", T_U64, memory.peak_reserved_bytes),
    F("memory.peak_used_bytes", T_U64, memory.peak_used_bytes),
    F("memory.waste_frac", T_F64, memory.waste_frac),
    F("memory.internal_frag_frac", T_F64, memory.internal_frag_frac),
    F("memory.reservation_frac", T_F64, memory.reservation_frac),
    F("memory.external_frag_frac", T_F64, memory.external_frag_frac),
    F("memory.breakdown.token_states", T_F64, memory.breakdown.token_states),
    F("memory.breakdown.reserved", T_F64, memory.breakdown.reserved),
    F("memory.breakdown.internal_frag", T_F64, memory.breakdown.internal_frag),
    F("memory.breakdown.external_frag", T_F64, memory.breakdown.external_frag),
    F("memory.breakdown.free", T_F64, memory.breakdown.free),
    F("memory.padding_frac", T_F64, memory.padding_frac),
    F("memory.device_mem", T_STR, memory.device_mem),
    F("alloc.backend_alloc_calls", T_U64, alloc.backend_alloc_calls),
    F("alloc.backend_free_calls", T_U64, alloc.backend_free_calls),
    F("alloc.backend_alloc_seconds", T_F64, alloc.backend_alloc_seconds),
    F("alloc.backend_free_seconds", T_F64, alloc.backend_free_seconds),
    F("alloc.step_seconds", T_F64, alloc.step_seconds),
    F("alloc.overlapped_seconds", T_F64, alloc.overlapped_seconds),
    F("alloc.seconds_measured", T_BOOL, alloc.seconds_measured),
    F("alloc.model", T_STR, alloc.model),
    F("latency.step_p50_ms", T_F64, latency.step_p50_ms),
    F("latency.step_p90_ms", T_F64, latency.step_p90_ms),
    F("latency.step_p99_ms", T_F64, latency.step_p99_ms),
    F("latency.step_max_ms", T_F64, latency.step_max_ms),
    F("latency.ttft_p50_ms", T_F64, latency.ttft_p50_ms),
    F("latency.ttft_p99_ms", T_F64, latency.ttft_p99_ms),
    F("latency.tpot_p50_ms", T_F64, latency.tpot_p50_ms),
    F("latency.tpot_p99_ms", T_F64, latency.tpot_p99_ms),
    F("latency.norm_ms_per_token", T_F64, latency.norm_ms_per_token),
    F("throughput.output_tokens_per_s", T_F64, throughput.output_tokens_per_s),
    F("throughput.output_tokens", T_U64, throughput.output_tokens),
    F("throughput.makespan_s", T_F64, throughput.makespan_s),
    F("batch.mean", T_F64, batch.mean),
    F("batch.max", T_U32, batch.max),
    F("time.busy_s", T_F64, time.busy_s),
    F("time.prefill_frac", T_F64, time.prefill_frac),
    F("time.decode_frac", T_F64, time.decode_frac),
    F("time.decode_compute_util", T_F64, time.decode_compute_util),
    F("time.decode_bw_util", T_F64, time.decode_bw_util),
    F("swap_out_bytes", T_U64, swap_out_bytes),
    F("swap_in_bytes", T_U64, swap_in_bytes),
    F("swap_fallbacks", T_U64, swap_fallbacks),
    F("padding_tokens", T_U64, padding_tokens),
    F("steps", T_U64, steps),
    F("preemptions", T_U64, preemptions),
    F("forks", T_U64, forks),
    F("cow_copies", T_U64, cow_copies),
    F("prefix_cached_tokens", T_U64, prefix_cached_tokens),
    F("copy_bytes", T_U64, copy_bytes),
    F("swap_bytes", T_U64, swap_bytes),
    F("partial", T_BOOL, partial),
    F("schedule", T_STR, schedule),
    F("schedule_deviations", T_U64, schedule_deviations),
    F("run.token_hash", T_U64, run.token_hash),
    F("run.tokens", T_U64, run.tokens),
    F("run.layout", T_STR, run.layout),
    F("run.copied_bytes", T_U64, run.copied_bytes),
    // replay_seconds (host wall time) is left out on purpose: it differs from
    // run to run, and it lives in the stamp's wall_seconds instead.
};
#undef F
enum { NUM_FIELDS = sizeof fields / sizeof fields[0] };

// RFC 4180: quoted when it holds a comma, a quote or a line break (a failure
// message or a calibration file's path may).
static void csv_str(FILE *f, const char *s) {
    if (!strpbrk(s, ",\"\r\n")) {
        fputs(s, f);
        return;
    }
    fputc('"', f);
    for (; *s; s++) {
        if (*s == '"') fputc('"', f);
        fputc(*s, f);
    }
    fputc('"', f);
}

static void value(FILE *f, const pkv_replay_report *r, const field *d, int csv) {
    const char *base = (const char *)r + d->offset;
    switch (d->type) {
    case T_STR:
    case T_STR_OPT:
        if (csv)
            csv_str(f, base); // "" for an absent T_STR_OPT: an empty cell
        else if (d->type == T_STR_OPT && !base[0])
            fputs("null", f);
        else
            rt_json_str(f, base);
        break;
    case T_U32: fprintf(f, "%u", *(const uint32_t *)(const void *)base); break;
    case T_U64:
        fprintf(f, "%llu", (unsigned long long)*(const uint64_t *)(const void *)base);
        break;
    case T_F64:
        if (csv) {
            double v = *(const double *)(const void *)base;
            if (v == v) fprintf(f, "%.9g", v); // empty cell for NaN
        } else {
            rt_json_num(f, *(const double *)(const void *)base);
        }
        break;
    case T_BOOL:
        fputs(*(const int *)(const void *)base ? "true" : "false", f);
        break;
    }
}

static void point_json(FILE *f, const rt_result *r) {
    fprintf(f, "{\"index\": %u, \"load_scale\": ", r->point.index);
    rt_json_num(f, r->point.load_scale);
    fprintf(f, ", \"kv_mem_bytes\": %llu, \"request_rate\": ",
            (unsigned long long)r->point.kv_mem_bytes);
    rt_json_num(f, r->request_rate);
    fputc('}', f);
}

// Close the innermost open object: drop the last "name." of the open prefix.
static void close_one(FILE *f, const char *open, size_t *open_len) {
    fputc('}', f);
    size_t k = *open_len - 1;
    while (k && open[k - 1] != '.') k--;
    *open_len = k;
}

void rt_record_json(FILE *f, const rt_result *r, int slo) {
    fputs("{\"point\": ", f);
    point_json(f, r);
    if (slo)
        fprintf(f, ", \"slo\": {\"met\": %s, \"bounded\": %s, \"probes\": %u}",
                r->slo_met ? "true" : "false", r->slo_bounded ? "true" : "false", r->slo_probes);
    // Keys in table order; consecutive keys that share a dotted prefix share
    // its objects. `open` is the prefix of objects now open (ends with '.').
    const char *open = "";
    size_t open_len = 0;
    for (size_t i = 0; i < NUM_FIELDS; i++) {
        const char *key = fields[i].key;
        // Close the open objects that this key is not inside.
        while (open_len && strncmp(open, key, open_len) != 0) close_one(f, open, &open_len);
        fputs(", ", f);
        // Open the objects between them and the key's own name.
        const char *name = key + open_len;
        for (const char *dot; (dot = strchr(name, '.')) != NULL; name = dot + 1) {
            fprintf(f, "\"%.*s\": {", (int)(dot - name), name);
            open = key;
            open_len = (size_t)(dot + 1 - key);
        }
        fprintf(f, "\"%s\": ", name);
        value(f, &r->report, &fields[i], 0);
        // memory.groups (models with KV cache groups): an array, after memory's last
        // scalar; JSON only (a CSV row has no room for a list).
        if (!strcmp(key, "memory.device_mem") && r->report.memory.num_groups) {
            fputs(", \"groups\": ", f);
            (void)pkv_replay_write_groups_json(f, &r->report);
        }
    }
    while (open_len) close_one(f, open, &open_len);
    fputc('}', f);
}

void rt_record_csv_header(FILE *f, int slo) {
    fputs("point.index,point.load_scale,point.kv_mem_bytes,point.request_rate", f);
    if (slo) fputs(",slo.met,slo.bounded,slo.probes", f);
    for (size_t i = 0; i < NUM_FIELDS; i++) fprintf(f, ",%s", fields[i].key);
    fputs(",stamp.commit,trace.fnv1a64\n", f);
}

void rt_record_csv_row(FILE *f, const rt_result *r, int slo, const char *commit,
                       uint64_t trace_hash) {
    fprintf(f, "%u,%.9g,%llu,%.9g", r->point.index, r->point.load_scale,
            (unsigned long long)r->point.kv_mem_bytes, r->request_rate);
    if (slo)
        fprintf(f, ",%s,%s,%u", r->slo_met ? "true" : "false", r->slo_bounded ? "true" : "false",
                r->slo_probes);
    for (size_t i = 0; i < NUM_FIELDS; i++) {
        fputc(',', f);
        value(f, &r->report, &fields[i], 1);
    }
    fprintf(f, ",%s,%016llx\n", commit, (unsigned long long)trace_hash);
}

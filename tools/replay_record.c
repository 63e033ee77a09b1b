// SPDX-License-Identifier: MIT
// One run of a sweep as a JSON line and as a CSV row, both written from one
// table of the report's fields so that the CSV columns are exactly the JSON
// keys (nested keys joined with dots). A field added to pkv_replay_report
// appears in both outputs once it has a row here.
#include <stddef.h>
#include <string.h>

#include "replay_tools.h"

typedef enum { T_STR, T_U32, T_U64, T_F64, T_BOOL } ftype;

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
    F("memory.capacity_bytes", T_U64, memory.capacity_bytes),
    F("memory.peak_reserved_bytes", T_U64, memory.peak_reserved_bytes),
    F("memory.peak_used_bytes", T_U64, memory.peak_used_bytes),
    F("memory.waste_frac", T_F64, memory.waste_frac),
    F("memory.internal_frag_frac", T_F64, memory.internal_frag_frac),
    F("memory.reservation_frac", T_F64, memory.reservation_frac),
    F("memory.external_frag_frac", T_F64, memory.external_frag_frac),
    F("alloc.backend_alloc_calls", T_U64, alloc.backend_alloc_calls),
    F("alloc.backend_free_calls", T_U64, alloc.backend_free_calls),
    F("alloc.backend_alloc_seconds", T_F64, alloc.backend_alloc_seconds),
    F("alloc.backend_free_seconds", T_F64, alloc.backend_free_seconds),
    F("alloc.seconds_measured", T_BOOL, alloc.seconds_measured),
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
    F("steps", T_U64, steps),
    F("preemptions", T_U64, preemptions),
    F("forks", T_U64, forks),
    F("cow_copies", T_U64, cow_copies),
    F("prefix_cached_tokens", T_U64, prefix_cached_tokens),
    F("copy_bytes", T_U64, copy_bytes),
    F("swap_bytes", T_U64, swap_bytes),
    F("partial", T_BOOL, partial),
    // replay_seconds (host wall time) is left out on purpose: it differs from
    // run to run, and it lives in the stamp's wall_seconds instead.
};
#undef F
enum { NUM_FIELDS = sizeof fields / sizeof fields[0] };

static void value(FILE *f, const pkv_replay_report *r, const field *d, int csv) {
    const char *base = (const char *)r + d->offset;
    switch (d->type) {
    case T_STR:
        if (csv)
            fputs(base, f); // policy and mode names never hold a comma or a quote
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

void rt_record_json(FILE *f, const rt_result *r, int slo) {
    fputs("{\"point\": ", f);
    point_json(f, r);
    if (slo)
        fprintf(f, ", \"slo\": {\"met\": %s, \"bounded\": %s, \"probes\": %u}",
                r->slo_met ? "true" : "false", r->slo_bounded ? "true" : "false", r->slo_probes);
    const char *group = NULL;
    size_t glen = 0;
    for (size_t i = 0; i < NUM_FIELDS; i++) {
        const field *d = &fields[i];
        const char *dot = strchr(d->key, '.');
        const size_t gl = dot ? (size_t)(dot - d->key) : 0;
        const int same = group && dot && gl == glen && !strncmp(group, d->key, gl);
        if (!same) {
            if (group) fputc('}', f); // close the previous group
            group = NULL;
        }
        fputs(", ", f);
        if (dot && !same) {
            fprintf(f, "\"%.*s\": {", (int)gl, d->key);
            group = d->key;
            glen = gl;
        }
        fprintf(f, "\"%s\": ", dot ? dot + 1 : d->key);
        value(f, &r->report, d, 0);
    }
    if (group) fputc('}', f);
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

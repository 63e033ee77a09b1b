// SPDX-License-Identifier: MIT
// Latency SLOs for the throughput-at-SLO search: "metric<=value[unit]" terms
// joined by commas, each naming a latency figure of the report.
#include <math.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>

#include "replay_tools.h"

#define M(name, member) {name, offsetof(pkv_replay_report, member)}
static const struct {
    const char *name;
    size_t offset;
} metrics[] = {
    M("ttft_p50", latency.ttft_p50_ms),   M("ttft_p99", latency.ttft_p99_ms),
    M("tpot_p50", latency.tpot_p50_ms),   M("tpot_p99", latency.tpot_p99_ms),
    M("step_p50", latency.step_p50_ms),   M("step_p90", latency.step_p90_ms),
    M("step_p99", latency.step_p99_ms),   M("step_max", latency.step_max_ms),
    M("norm_latency", latency.norm_ms_per_token),
};
#undef M

int rt_slo_parse(const char *text, rt_slo *slo, char *err, size_t cap) {
    memset(slo, 0, sizeof *slo);
    if (strlen(text) >= sizeof slo->text) {
        snprintf(err, cap, "--slo too long");
        return -1;
    }
    snprintf(slo->text, sizeof slo->text, "%s", text);
    char buf[256];
    snprintf(buf, sizeof buf, "%s", text);
    // Terms split at every comma (strtok would merge ",," and drop a trailing
    // one): an empty term is an error, not nothing (issue 20, defect 4).
    char *next = buf;
    for (size_t k = 1; next; k++) {
        char *t = next, *comma = strchr(t, ',');
        next = comma ? comma + 1 : NULL;
        if (comma) *comma = '\0';
        while (*t == ' ') t++;
        for (size_t n = strlen(t); n && t[n - 1] == ' '; n--) t[n - 1] = '\0';
        if (!*t) {
            snprintf(err, cap, "--slo: term %zu of '%s' is empty (a stray comma?)", k, text);
            return -1;
        }
        char term[sizeof buf];
        snprintf(term, sizeof term, "%s", t);
        char *op = strstr(t, "<=");
        if (!op) {
            snprintf(err, cap, "--slo term '%s' must read metric<=value, e.g. ttft_p99<=2s", t);
            return -1;
        }
        *op = '\0';
        size_t m = 0;
        while (m < sizeof metrics / sizeof metrics[0] && strcmp(metrics[m].name, t)) m++;
        if (m == sizeof metrics / sizeof metrics[0]) {
            snprintf(err, cap,
                     "--slo: unknown metric '%s' (ttft_p50, ttft_p99, tpot_p50, tpot_p99, "
                     "step_p50, step_p90, step_p99, step_max, norm_latency)",
                     t);
            return -1;
        }
        for (size_t j = 0; j < slo->num_terms; j++)
            if (slo->terms[j].offset == metrics[m].offset) {
                snprintf(err, cap, "--slo: term '%s': metric '%s' is bounded twice (one bound each)",
                         term, t);
                return -1;
            }
        const char *v = op + 2;
        char *end;
        double x = strtod(v, &end);
        double unit_ms;
        if (!strcmp(end, "s"))
            unit_ms = 1e3;
        else if (!strcmp(end, "ms"))
            unit_ms = 1;
        else if (!strcmp(end, "us"))
            unit_ms = 1e-3;
        else {
            snprintf(err, cap, "--slo: '%s' needs a number with a unit s, ms or us (e.g. 100ms)", v);
            return -1;
        }
        if (end == v || !(x >= 0) || !isfinite(x)) {
            snprintf(err, cap, "--slo: bad value '%s'", v);
            return -1;
        }
        if (slo->num_terms == RT_SLO_MAX) {
            snprintf(err, cap, "--slo: at most %d terms", RT_SLO_MAX);
            return -1;
        }
        // The table's name, not t: its length is known to fit (the longest is 12).
        const size_t name_len = strlen(metrics[m].name);
        if (name_len >= sizeof slo->terms[0].metric) {
            snprintf(err, cap, "--slo: metric name %s too long (internal)", metrics[m].name);
            return -1;
        }
        memcpy(slo->terms[slo->num_terms].metric, metrics[m].name, name_len + 1);
        slo->terms[slo->num_terms].offset = metrics[m].offset;
        slo->terms[slo->num_terms].limit_ms = x * unit_ms;
        slo->num_terms++;
    }
    if (slo->num_terms == 0) {
        snprintf(err, cap, "--slo: no terms in '%s'", text);
        return -1;
    }
    return 0;
}

int rt_slo_met(const rt_slo *slo, const pkv_replay_report *r) {
    if (r->partial || r->requests.completed == 0) return 0;
    for (size_t i = 0; i < slo->num_terms; i++) {
        const double v = *(const double *)(const void *)((const char *)r + slo->terms[i].offset);
        if (!(v <= slo->terms[i].limit_ms)) return 0;
    }
    return 1;
}

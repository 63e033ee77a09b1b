// SPDX-License-Identifier: MIT
// The parameter space of a sweep: comma-separated lists for policy, block size,
// load scale and KV budget, their cross product in a fixed order (the output
// order, whatever the number of threads or shards), shards K/N by point index,
// and bounded per-run timelines.
#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "replay_tools.h"

// Calls item(token) for each comma-separated token; -1 at the first failure.
typedef int (*item_fn)(const char *tok, rt_axes *a, char *err, size_t cap);

static int each_item(const char *text, rt_axes *a, item_fn item, char *err, size_t cap) {
    char buf[1024];
    if (strlen(text) >= sizeof buf) {
        snprintf(err, cap, "list too long");
        return -1;
    }
    snprintf(buf, sizeof buf, "%s", text);
    char *save = NULL;
    int any = 0;
    for (char *t = strtok_r(buf, ",", &save); t; t = strtok_r(NULL, ",", &save)) {
        if (item(t, a, err, cap) != 0) return -1;
        any = 1;
    }
    if (!any) {
        snprintf(err, cap, "empty list '%s'", text);
        return -1;
    }
    return 0;
}

static int policy_item(const char *t, rt_axes *a, char *err, size_t cap) {
    if (!strcmp(t, "all")) {
        for (int p = 0; p < PKV_POLICY_COUNT; p++) a->policies[p] = 1;
        return 0;
    }
    pkv_policy p;
    if (pkv_policy_from_name(t, &p) != PKV_OK) {
        snprintf(err, cap, "unknown policy '%s' (see --help)", t);
        return -1;
    }
    a->policies[p] = 1;
    return 0;
}

int rt_parse_policies(const char *text, rt_axes *a, char *err, size_t cap) {
    memset(a->policies, 0, sizeof a->policies);
    return each_item(text, a, policy_item, err, cap);
}

static int block_item(const char *t, rt_axes *a, char *err, size_t cap) {
    char *end;
    errno = 0;
    unsigned long long v = strtoull(t, &end, 10);
    if (!*t || *end || errno || t[0] == '-' || v < 1 || v > 65536) {
        snprintf(err, cap, "block size must be 1..65536, got '%s'", t);
        return -1;
    }
    if (a->num_block_sizes == sizeof a->block_sizes / sizeof a->block_sizes[0]) {
        snprintf(err, cap, "too many block sizes");
        return -1;
    }
    a->block_sizes[a->num_block_sizes++] = (uint32_t)v;
    return 0;
}

int rt_parse_block_sizes(const char *text, rt_axes *a, char *err, size_t cap) {
    a->num_block_sizes = 0;
    return each_item(text, a, block_item, err, cap);
}

static int load_item(const char *t, rt_axes *a, char *err, size_t cap) {
    char *end;
    double v = strtod(t, &end);
    if (!*t || *end || !(v > 0) || !isfinite(v)) {
        snprintf(err, cap, "must be a finite number > 0, got '%s'", t);
        return -1;
    }
    if (a->num_load_scales == sizeof a->load_scales / sizeof a->load_scales[0]) {
        snprintf(err, cap, "too many load scales");
        return -1;
    }
    a->load_scales[a->num_load_scales++] = v;
    return 0;
}

int rt_parse_load_scales(const char *text, rt_axes *a, char *err, size_t cap) {
    a->num_load_scales = 0;
    return each_item(text, a, load_item, err, cap);
}

static int kv_item(const char *t, rt_axes *a, char *err, size_t cap) {
    uint64_t v;
    if (pkv_size_parse(t, &v) != PKV_OK || v == 0) {
        snprintf(err, cap, "KV budget must be a size like 40G, 40GiB (2^30 bytes) or 40GB (10^9), got '%s'", t);
        return -1;
    }
    if (a->num_kv_mems == sizeof a->kv_mems / sizeof a->kv_mems[0]) {
        snprintf(err, cap, "too many KV budgets");
        return -1;
    }
    a->kv_mems[a->num_kv_mems++] = v;
    return 0;
}

int rt_parse_kv_mems(const char *text, rt_axes *a, char *err, size_t cap) {
    a->num_kv_mems = 0;
    return each_item(text, a, kv_item, err, cap);
}

int rt_parse_shard(const char *text, uint32_t *k, uint32_t *n) {
    char *end;
    errno = 0;
    unsigned long long a = strtoull(text, &end, 10);
    if (end == text || *end != '/' || text[0] == '-' || errno) return -1;
    const char *b = end + 1;
    unsigned long long c = strtoull(b, &end, 10);
    if (end == b || *end || b[0] == '-' || errno) return -1;
    if (c < 1 || c > UINT32_MAX || a < 1 || a > c) return -1;
    *k = (uint32_t)a;
    *n = (uint32_t)c;
    return 0;
}

size_t rt_points(const rt_axes *a, rt_point **out) {
    size_t np = 0;
    for (int p = 0; p < PKV_POLICY_COUNT; p++)
        if (a->policies[p]) np += p == PKV_POLICY_PAGED ? a->num_block_sizes : 1;
    np += a->num_plugins * a->num_block_sizes; // a plugin may use the block size
    const size_t total = a->num_kv_mems * a->num_load_scales * np;
    rt_point *v = calloc(total ? total : 1, sizeof *v);
    *out = v;
    if (!v) return 0;
    size_t i = 0;
    for (size_t k = 0; k < a->num_kv_mems; k++)
        for (size_t l = 0; l < a->num_load_scales; l++)
            for (int p = 0; p < PKV_POLICY_COUNT; p++) {
                if (!a->policies[p]) continue;
                const size_t nb = p == PKV_POLICY_PAGED ? a->num_block_sizes : 1;
                for (size_t b = 0; b < nb; b++) {
                    v[i] = (rt_point){(uint32_t)i, (pkv_policy)p,
                                      p == PKV_POLICY_PAGED ? a->block_sizes[b] : 0,
                                      a->load_scales[l], a->kv_mems[k], NULL};
                    i++;
                }
            }
    // Plugins follow the built-in policies of each (budget, load) group.
    if (a->num_plugins) {
        rt_point *w = calloc(total ? total : 1, sizeof *w);
        if (!w) {
            free(v);
            *out = NULL;
            return 0;
        }
        size_t j = 0, from = 0;
        const size_t nbuiltin = np - a->num_plugins * a->num_block_sizes;
        for (size_t k = 0; k < a->num_kv_mems; k++)
            for (size_t l = 0; l < a->num_load_scales; l++) {
                for (size_t q = 0; q < nbuiltin; q++) w[j++] = v[from++];
                for (size_t g = 0; g < a->num_plugins; g++)
                    for (size_t b = 0; b < a->num_block_sizes; b++)
                        w[j++] = (rt_point){0, PKV_POLICY_PAGED, a->block_sizes[b], a->load_scales[l],
                                            a->kv_mems[k], a->plugins[g]};
            }
        for (size_t q = 0; q < total; q++) w[q].index = (uint32_t)q;
        free(v);
        *out = w;
    }
    return total;
}

double rt_request_rate(const pkv_trace *trace, double scale) {
    const size_t n = pkv_trace_count(trace);
    const pkv_trace_request *q = pkv_trace_requests(trace);
    if (n < 2) return 0;
    const double d = (q[n - 1].arrival_s - q[0].arrival_s) / scale;
    return d > 0 ? (double)(n - 1) / d : 0;
}

void rt_timeline_add(rt_timeline *t, const pkv_replay_step *s) {
    if (t->stride == 0) t->stride = 1;
    if (s->index % t->stride != 0) return;
    if (t->limit && t->n == 2 * t->limit) {
        // Full: keep every other row (multiples of 2 x stride), double the stride.
        size_t k = 0;
        for (size_t i = 0; i < t->n; i += 2) t->rows[k++] = t->rows[i];
        t->n = k;
        t->stride *= 2;
        if (s->index % t->stride != 0) return;
    }
    if (t->n == t->cap) {
        size_t c = t->cap ? t->cap * 2 : 1024;
        if (t->limit && c > 2 * t->limit) c = 2 * t->limit;
        pkv_replay_step *r = realloc(t->rows, c * sizeof *r);
        if (!r) return; // out of memory: the timeline thins, the run goes on
        t->rows = r;
        t->cap = c;
    }
    t->rows[t->n++] = *s;
}

void rt_timeline_free(rt_timeline *t) {
    free(t->rows);
    memset(t, 0, sizeof *t);
}

void rt_timeline_header(FILE *f, const pkv_replay_report *groups) {
    // The capacity breakdown of every step in bytes, the same five parts as the
    // report's memory.breakdown.* (token_states + reserved + internal_frag +
    // external_frag + free = capacity on every row; reserved is what is held for
    // tokens to come, free excludes external fragmentation); point, block_size and
    // load_scale tell the runs of a sweep apart.
    fputs("policy,step,time_s,running,waiting,token_states_bytes,reserved_bytes,"
          "internal_frag_bytes,external_frag_bytes,free_bytes,capacity_bytes,step_ms,alloc_ms,"
          "point,block_size,load_scale",
          f);
    // A model with groups: group g's needed and held bytes, named by index and kind
    // (g0_sliding_needed_bytes, ...).
    const uint32_t ng = groups ? groups->memory.num_groups : 0;
    for (uint32_t g = 0; g < ng; g++)
        fprintf(f, ",g%u_%s_needed_bytes,g%u_%s_held_bytes", g, groups->memory.groups[g].kind, g,
                groups->memory.groups[g].kind);
    fputc('\n', f);
}

void rt_timeline_write(FILE *f, const rt_result *r) {
    // block_size: the report's (1, a token, for policies without blocks), as in
    // the table, --json and --csv.
    const rt_timeline *t = &r->timeline;
    const rt_point *p = &r->point;
    for (size_t i = 0; i < t->n; i++) {
        const pkv_replay_step *s = &t->rows[i];
        fprintf(f, "%s,%llu,%.6f,%u,%u,%llu,%llu,%llu,%llu,%llu,%llu,%.6f,%.6f,%u,%u,%.9g",
                rt_point_policy(p), (unsigned long long)s->index, s->time_s, s->running,
                s->waiting, (unsigned long long)s->used_bytes,
                (unsigned long long)s->reservation_bytes,
                (unsigned long long)s->internal_frag_bytes, (unsigned long long)s->ext_frag_bytes,
                (unsigned long long)s->idle_free_bytes, (unsigned long long)s->capacity_bytes,
                s->step_s * 1e3, s->alloc_s * 1e3, p->index, r->report.block_size, p->load_scale);
        for (uint32_t g = 0; g < s->num_groups; g++)
            fprintf(f, ",%llu,%llu", (unsigned long long)s->groups[g].needed_bytes,
                    (unsigned long long)s->groups[g].held_bytes);
        fputc('\n', f);
    }
}

void rt_requests_header(FILE *f) {
    fputs("point,policy,block_size,load_scale,request,arrival_s,first_token_s,finish_s,ttft_ms,"
          "tpot_ms,e2e_ms,norm_ms_per_token,prompt_tokens,output_tokens,n\n",
          f);
}

void rt_requests_write(FILE *f, const rt_result *r) {
    const rt_point *p = &r->point;
    for (size_t i = 0; i < r->num_requests; i++) {
        const pkv_replay_request_done *d = &r->requests[i];
        const double e2e = (d->finish_s - d->arrival_s) * 1e3;
        fprintf(f, "%u,%s,%u,%.9g,%llu,%.6f,%.6f,%.6f,%.6f,", p->index, rt_point_policy(p),
                r->report.block_size, p->load_scale, (unsigned long long)d->index, d->arrival_s,
                d->first_token_s, d->finish_s, (d->first_token_s - d->arrival_s) * 1e3);
        if (d->output_tokens > 1)
            fprintf(f, "%.6f", (d->finish_s - d->first_token_s) * 1e3 / (d->output_tokens - 1));
        fprintf(f, ",%.6f,%.6f,%u,%u,%u\n", e2e, e2e / d->output_tokens, d->prompt_tokens,
                d->output_tokens, d->n);
    }
}

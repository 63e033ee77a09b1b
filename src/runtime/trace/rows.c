// SPDX-License-Identifier: MIT
// The pieces every trace reader builds with: error reporting, the growable
// request vector, the per-request validation that defines a valid trace, and
// the hand-over of a finished vector to a pkv_trace. The readers (csv.c,
// jsonl.c), the generator and trace.c's pkv_trace_create depend on this file;
// it depends on none of them, so dependencies point one way:
// trace.c -> {csv.c, jsonl.c} -> rows.c.
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "trace_internal.h"

void pkvi_trace_set_error(pkv_trace_error *err, const char *file, uint64_t line,
                          const char *field, const char *fmt, ...) {
    if (!err) return;
    snprintf(err->file, sizeof err->file, "%s", file ? file : "");
    err->line = line;
    snprintf(err->field, sizeof err->field, "%s", field ? field : "");
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(err->message, sizeof err->message, fmt, ap);
    va_end(ap);
}

// ---- request vector ----

pkv_status pkvi_reqvec_push(pkvi_reqvec *v, const pkv_trace_request *r) {
    if (v->count == v->cap) {
        size_t ncap = v->cap ? v->cap * 2 : 256;
        pkv_trace_request *n = realloc(v->reqs, ncap * sizeof *n);
        if (!n) return PKV_ERR_OUT_OF_MEMORY;
        v->reqs = n;
        v->cap = ncap;
    }
    v->reqs[v->count++] = *r;
    return PKV_OK;
}

// Validate one request against the previous arrival. On failure names the field.
pkv_status pkvi_trace_check_request(const pkv_trace_request *r, double prev_arrival,
                                    const char **field, char *msg, size_t msg_len) {
    if (!isfinite(r->arrival_s) || r->arrival_s < 0) {
        *field = "arrival_s";
        snprintf(msg, msg_len, "arrival must be a finite number >= 0");
        return PKV_ERR_FORMAT;
    }
    if (r->arrival_s < prev_arrival) {
        *field = "arrival_s";
        snprintf(msg, msg_len, "arrivals are not sorted: %.9g after %.9g", r->arrival_s,
                 prev_arrival);
        return PKV_ERR_FORMAT;
    }
    if (r->prompt_tokens == 0) {
        *field = "prompt_tokens";
        snprintf(msg, msg_len, "length must be >= 1");
        return PKV_ERR_FORMAT;
    }
    if (r->output_tokens == 0) {
        *field = "output_tokens";
        snprintf(msg, msg_len, "length must be >= 1");
        return PKV_ERR_FORMAT;
    }
    if (r->n == 0) {
        *field = "n";
        snprintf(msg, msg_len, "n must be >= 1");
        return PKV_ERR_FORMAT;
    }
    if (r->prefix_group < -1) {
        *field = "prefix_group";
        snprintf(msg, msg_len, "group id must be >= -1 (-1 = none), got %lld",
                 (long long)r->prefix_group);
        return PKV_ERR_FORMAT;
    }
    if (r->prefix_tokens > r->prompt_tokens) {
        *field = "prefix_tokens";
        snprintf(msg, msg_len, "prefix (%u) longer than the prompt (%u)", r->prefix_tokens,
                 r->prompt_tokens);
        return PKV_ERR_FORMAT;
    }
    return PKV_OK;
}

pkv_status pkvi_trace_finish(pkvi_reqvec *v, pkv_trace_format format, uint64_t skipped,
                             pkv_trace **out) {
    pkv_trace *t = calloc(1, sizeof *t);
    if (!t) return PKV_ERR_OUT_OF_MEMORY;
    t->reqs = v->reqs; // ownership moves to the trace
    t->count = v->count;
    t->format = format;
    t->skipped = skipped;
    v->reqs = NULL;
    v->count = v->cap = 0;
    *out = t;
    return PKV_OK;
}

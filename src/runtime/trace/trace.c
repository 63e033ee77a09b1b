// SPDX-License-Identifier: MIT
// The public trace object: format detection and dispatch to the readers
// (csv.c, jsonl.c), loading from a file, pkv_trace_create, the accessors,
// synthetic token ids and saving in the native format. A pkv_trace, once built, is
// validated and immutable: every request has lengths >= 1, n >= 1, a prefix no
// longer than its prompt, and arrivals are finite and non-decreasing.
#include <ctype.h>
#include <errno.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "pkv/trace.h"
#include "trace_internal.h"

const char *pkv_trace_format_name(pkv_trace_format format) {
    switch (format) {
    case PKV_TRACE_AUTO: return "auto";
    case PKV_TRACE_NATIVE: return "native";
    case PKV_TRACE_AZURE: return "azure";
    case PKV_TRACE_BURSTGPT: return "burstgpt";
    case PKV_TRACE_MOONCAKE: return "mooncake";
    }
    return "unknown";
}

pkv_trace_load_options pkv_trace_load_options_default(void) {
    pkv_trace_load_options o = {PKV_TRACE_AUTO, 0};
    return o;
}

pkv_status pkv_trace_create(const pkv_trace_request *requests, size_t count, pkv_trace **out,
                            pkv_trace_error *err) {
    if (!out || (!requests && count > 0)) return PKV_ERR_INVALID_ARG;
    if (count == 0) {
        pkvi_trace_set_error(err, "(memory)", 0, "", "empty trace: no requests");
        return PKV_ERR_FORMAT;
    }
    double prev = 0;
    for (size_t i = 0; i < count; i++) {
        const char *field = "";
        char msg[128];
        if (pkvi_trace_check_request(&requests[i], prev, &field, msg, sizeof msg) != PKV_OK) {
            pkvi_trace_set_error(err, "(memory)", i, field, "request %zu: %s", i, msg);
            return PKV_ERR_FORMAT;
        }
        prev = requests[i].arrival_s;
    }
    pkvi_reqvec v = {0};
    v.reqs = malloc(count * sizeof *v.reqs);
    if (!v.reqs) return PKV_ERR_OUT_OF_MEMORY;
    memcpy(v.reqs, requests, count * sizeof *v.reqs);
    v.count = v.cap = count;
    for (size_t i = 0; i < count; i++)
        if (v.reqs[i].prefix_group < 0) v.reqs[i].prefix_tokens = 0;
    pkv_status st = pkvi_trace_finish(&v, PKV_TRACE_NATIVE, 0, out);
    free(v.reqs);
    return st;
}

void pkv_trace_destroy(pkv_trace *trace) {
    if (!trace) return;
    free(trace->reqs);
    free(trace->block_ids);
    free(trace->block_first);
    free(trace->block_count);
    free(trace);
}

PKVI_WRAPS static uint32_t token_hash(uint64_t a, uint64_t b) {
    uint64_t h = a * 0x9e3779b97f4a7c15ull ^ (b + 0x632be59bd9b4e019ull);
    h ^= h >> 32;
    h *= 0xd6e8feb86659fd93ull;
    h ^= h >> 32;
    return (uint32_t)(h & 0x7fffffff);
}

PKVI_WRAPS void pkvi_trace_tokens(const pkv_trace *t, size_t i, uint32_t n, int32_t *out) {
    const pkv_trace_request *r = &t->reqs[i];
    // Three disjoint salts: Mooncake blocks, native groups, the request itself.
    const uint64_t own = ((uint64_t)i << 2) | 1;
    uint32_t p = 0;
    if (t->block_ids) {
        const uint64_t *ids = t->block_ids + t->block_first[i];
        for (; p < n && p / PKVI_MOONCAKE_BLOCK_TOKENS < t->block_count[i]; p++)
            out[p] = (int32_t)token_hash((ids[p / PKVI_MOONCAKE_BLOCK_TOKENS] << 2) | 2,
                                         p % PKVI_MOONCAKE_BLOCK_TOKENS);
    } else if (r->prefix_group >= 0) {
        for (; p < n && p < r->prefix_tokens; p++)
            out[p] = (int32_t)token_hash(((uint64_t)r->prefix_group << 2) | 3, p);
    }
    for (; p < n; p++) out[p] = (int32_t)token_hash(own, p);
}

int32_t *pkvi_trace_tokens_into(const pkv_trace *t, size_t i, uint32_t n, int32_t **buf,
                                uint32_t *cap) {
    if (n > *cap) {
        uint64_t c = *cap ? *cap : 1024;
        while (c < n) c *= 2;
        int32_t *grown = realloc(*buf, (size_t)c * sizeof *grown);
        if (!grown) return NULL;
        *buf = grown;
        *cap = (uint32_t)(c < UINT32_MAX ? c : UINT32_MAX);
    }
    pkvi_trace_tokens(t, i, n, *buf);
    return *buf;
}

size_t pkv_trace_count(const pkv_trace *t) { return t ? t->count : 0; }
const pkv_trace_request *pkv_trace_requests(const pkv_trace *t) { return t ? t->reqs : NULL; }
pkv_trace_format pkv_trace_get_format(const pkv_trace *t) { return t ? t->format : PKV_TRACE_AUTO; }
uint64_t pkv_trace_skipped(const pkv_trace *t) { return t ? t->skipped : 0; }

// ---- format detection and loading ----

static int has_suffix(const char *s, const char *suffix) {
    size_t a = strlen(s), b = strlen(suffix);
    return a >= b && strcmp(s + a - b, suffix) == 0;
}

pkv_status pkv_trace_parse(const char *text, size_t len, const char *name,
                           const pkv_trace_load_options *opts, pkv_trace **out,
                           pkv_trace_error *err) {
    if ((!text && len > 0) || !out) return PKV_ERR_INVALID_ARG;
    pkv_trace_load_options o = opts ? *opts : pkv_trace_load_options_default();
    if (!name) name = "(memory)";
    // A UTF-8 byte order mark (spreadsheet exports write one) is not part of
    // the header; line numbers do not change.
    if (len >= 3 && memcmp(text, "\xEF\xBB\xBF", 3) == 0) {
        text += 3;
        len -= 3;
    }
    size_t first = 0;
    while (first < len && isspace((unsigned char)text[first])) first++;
    if (first == len) {
        pkvi_trace_set_error(err, name, 0, "", "empty file: no header and no requests");
        return PKV_ERR_FORMAT;
    }
    pkv_trace_format fmt = o.format;
    if (fmt == PKV_TRACE_AUTO) {
        if (has_suffix(name, ".jsonl") || text[first] == '{') {
            fmt = PKV_TRACE_MOONCAKE;
        } else {
            size_t eol = first;
            while (eol < len && text[eol] != '\n') eol++;
            fmt = pkvi_csv_detect(text + first, eol - first);
            if (fmt == PKV_TRACE_AUTO) {
                pkvi_trace_set_error(err, name, 1, "",
                                     "unknown header: expected a native, Azure or BurstGPT "
                                     "CSV header, or Mooncake JSON lines");
                return PKV_ERR_FORMAT;
            }
        }
    }
    switch (fmt) {
    case PKV_TRACE_NATIVE:
    case PKV_TRACE_AZURE:
    case PKV_TRACE_BURSTGPT: return pkvi_csv_parse(text, len, name, fmt, o.skip_bad, out, err);
    case PKV_TRACE_MOONCAKE: return pkvi_jsonl_parse(text, len, name, o.skip_bad, out, err);
    default: return PKV_ERR_INVALID_ARG;
    }
}

pkv_status pkv_trace_load(const char *path, const pkv_trace_load_options *opts,
                          pkv_trace **out, pkv_trace_error *err) {
    if (!path || !out) return PKV_ERR_INVALID_ARG;
    FILE *f = fopen(path, "rb");
    if (!f) {
        pkvi_trace_set_error(err, path, 0, "", "cannot open: %s", strerror(errno));
        return PKV_ERR_IO;
    }
    size_t cap = 1 << 16, len = 0;
    char *buf = malloc(cap);
    if (!buf) {
        fclose(f);
        return PKV_ERR_OUT_OF_MEMORY;
    }
    for (;;) {
        if (len == cap) {
            char *n = realloc(buf, cap * 2);
            if (!n) {
                free(buf);
                fclose(f);
                return PKV_ERR_OUT_OF_MEMORY;
            }
            buf = n;
            cap *= 2;
        }
        size_t got = fread(buf + len, 1, cap - len, f);
        len += got;
        if (got == 0) break;
    }
    int bad = ferror(f);
    fclose(f);
    if (bad) {
        free(buf);
        pkvi_trace_set_error(err, path, 0, "", "read error");
        return PKV_ERR_IO;
    }
    pkv_status st = pkv_trace_parse(buf, len, path, opts, out, err);
    free(buf);
    return st;
}

pkv_status pkv_trace_save(const pkv_trace *t, const char *path) {
    if (!t || !path) return PKV_ERR_INVALID_ARG;
    FILE *f = fopen(path, "w");
    if (!f) return PKV_ERR_IO;
    pkv_status st = pkv_trace_write_csv(t, f);
    if (fclose(f) != 0) return PKV_ERR_IO;
    return st;
}

pkv_status pkv_trace_write_csv(const pkv_trace *t, FILE *f) {
    if (!t || !f) return PKV_ERR_INVALID_ARG;
    fprintf(f, "arrival_s,prompt_tokens,output_tokens,n,prefix_group,prefix_tokens,request_id\n");
    for (size_t i = 0; i < t->count; i++) {
        const pkv_trace_request *r = &t->reqs[i];
        // Microseconds in fixed point, as traces/README.md shows; from 1e15 s on
        // (where %.6f grows past the reader's 64-character field, up to ~300
        // characters at 1e300) %.17g, which reads back exactly.
        fprintf(f, r->arrival_s < 1e15 ? "%.6f,%u,%u,%u,%lld,%u,%llu\n" : "%.17g,%u,%u,%u,%lld,%u,%llu\n",
                r->arrival_s, r->prompt_tokens,
                r->output_tokens, r->n, (long long)r->prefix_group, r->prefix_tokens,
                (unsigned long long)r->request_id);
    }
    return ferror(f) ? PKV_ERR_IO : PKV_OK;
}

// SPDX-License-Identifier: MIT
// Mooncake JSON Lines traces: one flat object per line with `timestamp` (ms),
// `input_length`, `output_length` and `hash_ids` (one id per 512-token block;
// requests whose leading ids agree share those blocks). A small strict scanner
// reads exactly that shape; other keys are skipped.
//
// Prefix groups: each request joins the group of the longest chain of leading
// hash ids that at least one other request of the trace also starts with, and
// shares 512 x (that many blocks) tokens, capped at its prompt. The hash ids are
// kept with the trace too: pkvi_trace_tokens turns them into token ids, so the
// replay's prefix cache sees exactly which blocks requests share.
#include <ctype.h>
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "trace_internal.h"


typedef struct u64vec {
    uint64_t *v;
    size_t n, cap;
} u64vec;

static int u64_push(u64vec *a, uint64_t x) {
    if (a->n == a->cap) {
        size_t nc = a->cap ? a->cap * 2 : 1024;
        uint64_t *p = realloc(a->v, nc * sizeof *p);
        if (!p) return -1;
        a->v = p;
        a->cap = nc;
    }
    a->v[a->n++] = x;
    return 0;
}

typedef struct cursor {
    const char *p, *end;
} cursor;

static void skip_ws(cursor *c) {
    while (c->p < c->end && isspace((unsigned char)*c->p)) c->p++;
}

// Skip a JSON string starting at '"'. 0 on success; s/n receive its raw body.
static int scan_string(cursor *c, const char **s, size_t *n) {
    if (c->p >= c->end || *c->p != '"') return -1;
    const char *start = ++c->p;
    while (c->p < c->end && *c->p != '"') {
        if (*c->p == '\\') c->p++;
        c->p++;
    }
    if (c->p >= c->end) return -1;
    *s = start;
    *n = (size_t)(c->p - start);
    c->p++;
    return 0;
}

static int scan_number(cursor *c, double *v) {
    char buf[64];
    size_t n = 0;
    while (c->p + n < c->end && n < sizeof buf - 1 &&
           (isdigit((unsigned char)c->p[n]) || strchr("+-.eE", c->p[n])))
        n++;
    if (n == 0 || n == sizeof buf - 1) return -1;
    memcpy(buf, c->p, n);
    buf[n] = '\0';
    char *end;
    errno = 0;
    *v = strtod(buf, &end);
    if (errno || *end || !isfinite(*v)) return -1;
    c->p += n;
    return 0;
}

typedef enum { KEY_TS, KEY_IN, KEY_OUT, KEY_HASH, NUM_KEYS } key_id;
static const char *const key_names[NUM_KEYS] = {"timestamp", "input_length", "output_length",
                                                "hash_ids"};

// Parse one object line. On failure: *field and msg. hash ids appended to ids.
static int parse_line(const char *p, size_t n, double *vals, int *seen, u64vec *ids,
                      size_t *nids, const char **field, char *msg, size_t msg_len) {
    cursor c = {p, p + n};
    *field = "";
    *nids = 0;
    skip_ws(&c);
    if (c.p >= c.end || *c.p != '{') {
        snprintf(msg, msg_len, "expected a JSON object '{'");
        return -1;
    }
    c.p++;
    for (;;) {
        skip_ws(&c);
        if (c.p >= c.end) goto truncated;
        if (*c.p == '}') {
            c.p++;
            break;
        }
        const char *k;
        size_t kn;
        if (scan_string(&c, &k, &kn) != 0) {
            if (c.p >= c.end) goto truncated;
            snprintf(msg, msg_len, "expected a quoted key");
            return -1;
        }
        int key = -1;
        for (int i = 0; i < NUM_KEYS; i++)
            if (strlen(key_names[i]) == kn && memcmp(key_names[i], k, kn) == 0) key = i;
        skip_ws(&c);
        if (c.p >= c.end) goto truncated;
        if (*c.p != ':') {
            snprintf(msg, msg_len, "expected ':' after a key");
            return -1;
        }
        c.p++;
        skip_ws(&c);
        if (c.p >= c.end) goto truncated;
        if (key >= 0) *field = key_names[key];
        if (key == KEY_HASH) {
            if (*c.p != '[') {
                snprintf(msg, msg_len, "expected an array of block ids");
                return -1;
            }
            c.p++;
            for (;;) {
                skip_ws(&c);
                if (c.p >= c.end) goto truncated;
                if (*c.p == ']') {
                    c.p++;
                    break;
                }
                double d;
                if (scan_number(&c, &d) != 0 || d < 0 || d != floor(d)) {
                    snprintf(msg, msg_len, "block id is not an integer >= 0");
                    return -1;
                }
                if (u64_push(ids, (uint64_t)d) != 0) {
                    snprintf(msg, msg_len, "out of memory");
                    return -1;
                }
                (*nids)++;
                skip_ws(&c);
                if (c.p >= c.end) goto truncated;
                if (*c.p == ',') c.p++;
                else if (*c.p != ']') {
                    snprintf(msg, msg_len, "expected ',' or ']' in hash_ids");
                    return -1;
                }
            }
            seen[key] = 1;
        } else if (*c.p == '"') {
            const char *s;
            size_t sn;
            if (scan_string(&c, &s, &sn) != 0) goto truncated;
            if (key >= 0) {
                char q[48];
                snprintf(q, sizeof q, "%.*s", (int)(sn < 40 ? sn : 40), s);
                snprintf(msg, msg_len, "not a number: \"%s\"", q);
                return -1;
            }
        } else if (key >= 0 || isdigit((unsigned char)*c.p) || *c.p == '-') {
            double d;
            if (scan_number(&c, &d) != 0) {
                char q[24];
                snprintf(q, sizeof q, "%.*s", (int)((size_t)(c.end - c.p) < 16 ? (size_t)(c.end - c.p) : 16), c.p);
                snprintf(msg, msg_len, "not a number: '%s'", q);
                return -1;
            }
            if (key >= 0) {
                vals[key] = d;
                seen[key] = 1;
            }
        } else {
            // true / false / null of an unknown key.
            while (c.p < c.end && isalpha((unsigned char)*c.p)) c.p++;
        }
        *field = "";
        skip_ws(&c);
        if (c.p >= c.end) goto truncated;
        if (*c.p == ',') c.p++;
        else if (*c.p != '}') {
            snprintf(msg, msg_len, "expected ',' or '}'");
            return -1;
        }
    }
    skip_ws(&c);
    if (c.p != c.end) {
        snprintf(msg, msg_len, "text after the closing '}'");
        return -1;
    }
    for (int i = 0; i < NUM_KEYS - 1; i++) { // hash_ids is optional
        if (!seen[i]) {
            *field = key_names[i];
            snprintf(msg, msg_len, "missing key \"%s\"", key_names[i]);
            return -1;
        }
    }
    return 0;
truncated:
    snprintf(msg, msg_len, "truncated line: unterminated JSON object");
    return -1;
}

// ---- prefix groups from hash-id chains ----

static uint64_t mix(uint64_t h, uint64_t x) {
    h ^= x + 0x9e3779b97f4a7c15ull + (h << 6) + (h >> 2);
    h ^= h >> 31;
    h *= 0xbf58476d1ce4e5b9ull;
    h ^= h >> 29;
    return h;
}

typedef struct counter {
    uint64_t *keys; // 0 = empty (keys are forced non-zero)
    uint32_t *counts;
    size_t mask;
} counter;

static uint32_t *counter_slot(counter *t, uint64_t key) {
    size_t i = (size_t)(key * 0x9e3779b97f4a7c15ull) & t->mask;
    while (t->keys[i] != 0 && t->keys[i] != key) i = (i + 1) & t->mask;
    t->keys[i] = key;
    return &t->counts[i];
}

static pkv_status assign_groups(pkvi_reqvec *v, const u64vec *ids, const size_t *first,
                                const size_t *count) {
    size_t total = ids->n, cap = 16;
    while (cap < 2 * total + 16) cap *= 2;
    counter t = {calloc(cap, sizeof(uint64_t)), calloc(cap, sizeof(uint32_t)), cap - 1};
    if (!t.keys || !t.counts) {
        free(t.keys);
        free(t.counts);
        return PKV_ERR_OUT_OF_MEMORY;
    }
    for (size_t r = 0; r < v->count; r++) {
        uint64_t h = 1469598103934665603ull;
        for (size_t k = 0; k < count[r]; k++) {
            h = mix(h, ids->v[first[r] + k]) | 1; // non-zero: 0 marks an empty slot
            (*counter_slot(&t, h))++;
        }
    }
    for (size_t r = 0; r < v->count; r++) {
        uint64_t h = 1469598103934665603ull, group = 0;
        size_t depth = 0;
        for (size_t k = 0; k < count[r]; k++) {
            h = mix(h, ids->v[first[r] + k]) | 1;
            if (*counter_slot(&t, h) < 2) break;
            group = h;
            depth = k + 1;
        }
        pkv_trace_request *q = &v->reqs[r];
        if (depth > 0) {
            uint64_t tokens = (uint64_t)depth * PKVI_MOONCAKE_BLOCK_TOKENS;
            q->prefix_group = (int64_t)(group >> 1);
            q->prefix_tokens = tokens < q->prompt_tokens ? (uint32_t)tokens : q->prompt_tokens;
        }
    }
    free(t.keys);
    free(t.counts);
    return PKV_OK;
}

pkv_status pkvi_jsonl_parse(const char *text, size_t len, const char *name, int skip_bad,
                            pkv_trace **out, pkv_trace_error *err) {
    pkvi_reqvec v = {0};
    u64vec ids = {0};
    size_t *first = NULL, *count = NULL, rows_cap = 0;
    uint64_t skipped = 0, line_no = 0;
    double prev = 0, t0 = 0;
    pkv_status st = PKV_OK;
    size_t pos = 0;
    while (pos < len) {
        size_t eol = pos;
        while (eol < len && text[eol] != '\n') eol++;
        line_no++;
        const char *l = text + pos;
        size_t ln = eol - pos;
        pos = eol < len ? eol + 1 : len;
        size_t k = 0;
        while (k < ln && isspace((unsigned char)l[k])) k++;
        if (k == ln) continue;
        double vals[NUM_KEYS] = {0};
        int seen[NUM_KEYS] = {0};
        const char *field = "";
        char msg[128];
        size_t ids_before = ids.n, nids = 0;
        int bad = parse_line(l, ln, vals, seen, &ids, &nids, &field, msg, sizeof msg) != 0;
        pkv_trace_request r = {0};
        if (!bad) {
            r.n = 1;
            r.prefix_group = -1;
            r.request_id = v.count;
            if (vals[KEY_TS] < 0) {
                field = "timestamp";
                snprintf(msg, sizeof msg, "timestamp must be >= 0, got %.9g", vals[KEY_TS]);
                bad = 1;
            }
            for (int key = KEY_IN; key <= KEY_OUT && !bad; key++) {
                if (vals[key] < 1 || vals[key] != floor(vals[key]) || vals[key] > UINT32_MAX) {
                    field = key_names[key];
                    snprintf(msg, sizeof msg, "length must be an integer >= 1, got %.9g",
                             vals[key]);
                    bad = 1;
                }
            }
        }
        if (!bad) {
            if (v.count == 0) t0 = vals[KEY_TS] / 1000.0;
            r.arrival_s = vals[KEY_TS] / 1000.0 - t0;
            r.prompt_tokens = (uint32_t)vals[KEY_IN];
            r.output_tokens = (uint32_t)vals[KEY_OUT];
            if (v.count > 0 && r.arrival_s < prev) {
                field = "timestamp";
                snprintf(msg, sizeof msg, "arrivals are not sorted: %.9g s after %.9g s",
                         r.arrival_s, prev);
                bad = 1;
            }
        }
        if (bad) {
            ids.n = ids_before;
            if (skip_bad) {
                skipped++;
                continue;
            }
            pkvi_trace_set_error(err, name, line_no, field, "%s", msg);
            st = PKV_ERR_FORMAT;
            goto done;
        }
        if (v.count == rows_cap) {
            size_t nc = rows_cap ? rows_cap * 2 : 1024;
            size_t *a = realloc(first, nc * sizeof *a);
            if (!a) {
                st = PKV_ERR_OUT_OF_MEMORY;
                goto done;
            }
            first = a;
            size_t *b = realloc(count, nc * sizeof *b);
            if (!b) {
                st = PKV_ERR_OUT_OF_MEMORY;
                goto done;
            }
            count = b;
            rows_cap = nc;
        }
        first[v.count] = ids_before;
        count[v.count] = nids;
        if ((st = pkvi_reqvec_push(&v, &r)) != PKV_OK) goto done;
        prev = r.arrival_s;
    }
    if (v.count == 0) {
        pkvi_trace_set_error(err, name, 0, "", "no requests (%llu bad lines skipped)",
                             (unsigned long long)skipped);
        st = PKV_ERR_FORMAT;
        goto done;
    }
    if ((st = assign_groups(&v, &ids, first, count)) != PKV_OK) goto done;
    {
        // Keep the hash ids: the replay's prefix cache sees the exact sharing.
        const size_t rows = v.count;
        uint64_t *bf = malloc(rows * sizeof *bf);
        uint32_t *bc = malloc(rows * sizeof *bc);
        if (!bf || !bc) {
            free(bf);
            free(bc);
            st = PKV_ERR_OUT_OF_MEMORY;
            goto done;
        }
        for (size_t r = 0; r < rows; r++) {
            bf[r] = first[r];
            bc[r] = (uint32_t)count[r];
        }
        st = pkvi_trace_finish(&v, PKV_TRACE_MOONCAKE, skipped, out);
        if (st != PKV_OK) {
            free(bf);
            free(bc);
            goto done;
        }
        (*out)->block_ids = ids.v;
        (*out)->block_first = bf;
        (*out)->block_count = bc;
        ids.v = NULL;
    }
done:
    free(v.reqs);
    free(ids.v);
    free(first);
    free(count);
    return st;
}

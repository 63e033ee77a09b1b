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
    char *msg; // where a failing scan explains itself
    size_t msg_len;
} cursor;

// JSON whitespace only: isspace() would also take \v and \f.
static void skip_ws(cursor *c) {
    while (c->p < c->end && (*c->p == ' ' || *c->p == '\t' || *c->p == '\r' || *c->p == '\n'))
        c->p++;
}

// Fail with a message; at the end of the line the real problem is truncation.
static int fail(cursor *c, const char *what) {
    if (c->p >= c->end) snprintf(c->msg, c->msg_len, "truncated line: unterminated JSON object");
    else if (*c->p == '\0') snprintf(c->msg, c->msg_len, "NUL byte in the line");
    else snprintf(c->msg, c->msg_len, "%s", what);
    return -1;
}

// Expect byte ch (after whitespace) and step over it.
static int expect(cursor *c, char ch, const char *what) {
    skip_ws(c);
    if (c->p >= c->end || *c->p != ch) return fail(c, what);
    c->p++;
    return 0;
}

static int is_digit(cursor *c) { return c->p < c->end && *c->p >= '0' && *c->p <= '9'; }

// A JSON string at '"'; s/n receive its raw (still escaped) body. Control
// characters (NUL included) must be escaped in JSON, so they are refused.
static int scan_string(cursor *c, const char **s, size_t *n) {
    if (c->p >= c->end || *c->p != '"') return fail(c, "expected a string");
    const char *start = ++c->p;
    for (;;) {
        if (c->p >= c->end) return fail(c, "");
        const unsigned char ch = (unsigned char)*c->p;
        if (ch == '"') break;
        if (ch < 0x20) return fail(c, "control character (or NUL byte) in a string");
        if (ch == '\\') {
            c->p++;
            if (c->p >= c->end) return fail(c, "");
            if (*c->p == 'u') {
                for (int k = 0; k < 4; k++) {
                    c->p++;
                    if (c->p >= c->end) return fail(c, "");
                    if (!isxdigit((unsigned char)*c->p)) return fail(c, "bad \\u escape in a string");
                }
            } else if (!strchr("\"\\/bfnrt", *c->p) || *c->p == '\0') {
                return fail(c, "bad escape in a string");
            }
        }
        c->p++;
    }
    *s = start;
    *n = (size_t)(c->p - start);
    c->p++;
    return 0;
}

// A JSON number (RFC 8259 grammar, nothing more) into *v, finite.
static int scan_number(cursor *c, double *v) {
    const char *start = c->p;
    if (c->p < c->end && *c->p == '-') c->p++;
    if (!is_digit(c)) return fail(c, "not a number");
    if (*c->p == '0') c->p++;
    else
        while (is_digit(c)) c->p++;
    if (c->p < c->end && *c->p == '.') {
        c->p++;
        if (!is_digit(c)) return fail(c, "not a number: no digit after '.'");
        while (is_digit(c)) c->p++;
    }
    if (c->p < c->end && (*c->p == 'e' || *c->p == 'E')) {
        c->p++;
        if (c->p < c->end && (*c->p == '+' || *c->p == '-')) c->p++;
        if (!is_digit(c)) return fail(c, "not a number: no digit in the exponent");
        while (is_digit(c)) c->p++;
    }
    char buf[64];
    const size_t n = (size_t)(c->p - start);
    if (n >= sizeof buf) return fail(c, "number longer than 63 characters");
    memcpy(buf, start, n);
    buf[n] = '\0';
    errno = 0;
    *v = strtod(buf, NULL);
    if (errno == ERANGE && isinf(*v)) return fail(c, "number out of range");
    return 0;
}

// A hash id: a plain decimal integer, parsed exactly (a double would merge
// 2^53 and 2^53 + 1, and 1e20 does not fit a uint64).
static int scan_block_id(cursor *c, uint64_t *v) {
    const char *start = c->p;
    uint64_t x = 0;
    int overflow = 0;
    while (is_digit(c)) {
        const unsigned d = (unsigned)(*c->p - '0');
        if (x > (UINT64_MAX - d) / 10) overflow = 1;
        else x = x * 10 + d;
        c->p++;
    }
    const size_t n = (size_t)(c->p - start);
    if (n == 0 || (n > 1 && *start == '0') ||
        (c->p < c->end && (*c->p == '.' || *c->p == 'e' || *c->p == 'E'))) {
        c->p = start;
        return fail(c, "block id is not an integer in 0 .. 2^64-1");
    }
    if (overflow) {
        c->p = start;
        return fail(c, "block id out of range (0 .. 2^64-1)");
    }
    *v = x;
    return 0;
}

// true / false / null, spelled exactly.
static int scan_literal(cursor *c) {
    static const char *const words[] = {"true", "false", "null"};
    for (int i = 0; i < 3; i++) {
        const size_t n = strlen(words[i]);
        if ((size_t)(c->end - c->p) >= n && memcmp(c->p, words[i], n) == 0) {
            c->p += n;
            return 0;
        }
    }
    return fail(c, "not a JSON value");
}

// Any JSON value of a key we do not use; nesting is bounded.
static int skip_value(cursor *c, int depth) {
    skip_ws(c);
    if (c->p >= c->end) return fail(c, "");
    if (depth > 32) return fail(c, "JSON nested deeper than 32 levels");
    const char open = *c->p;
    if (open == '"') {
        const char *s;
        size_t n;
        return scan_string(c, &s, &n);
    }
    if (open == '-' || (open >= '0' && open <= '9')) {
        double d;
        return scan_number(c, &d);
    }
    if (open != '[' && open != '{') return scan_literal(c);
    const char close = open == '[' ? ']' : '}';
    c->p++;
    skip_ws(c);
    if (c->p < c->end && *c->p == close) {
        c->p++;
        return 0;
    }
    for (;;) {
        if (open == '{') {
            const char *s;
            size_t n;
            skip_ws(c);
            if (scan_string(c, &s, &n) != 0 || expect(c, ':', "expected ':' after a key") != 0)
                return -1;
        }
        if (skip_value(c, depth + 1) != 0) return -1;
        skip_ws(c);
        if (c->p < c->end && *c->p == close) {
            c->p++;
            return 0;
        }
        if (expect(c, ',', open == '[' ? "expected ',' or ']'" : "expected ',' or '}'") != 0)
            return -1;
    }
}

typedef enum { KEY_TS, KEY_IN, KEY_OUT, KEY_HASH, NUM_KEYS } key_id;
static const char *const key_names[NUM_KEYS] = {"timestamp", "input_length", "output_length",
                                                "hash_ids"};

// "hash_ids": [id, id, ...] with no trailing comma; ids appended to ids.
static int scan_hash_ids(cursor *c, u64vec *ids, size_t *nids) {
    if (expect(c, '[', "expected an array of block ids") != 0) return -1;
    skip_ws(c);
    if (c->p < c->end && *c->p == ']') {
        c->p++;
        return 0;
    }
    for (;;) {
        uint64_t id = 0;
        skip_ws(c);
        if (scan_block_id(c, &id) != 0) return -1;
        if (u64_push(ids, id) != 0) {
            snprintf(c->msg, c->msg_len, "out of memory");
            return -1;
        }
        (*nids)++;
        skip_ws(c);
        if (c->p < c->end && *c->p == ']') {
            c->p++;
            return 0;
        }
        if (expect(c, ',', "expected ',' or ']' in hash_ids") != 0) return -1;
    }
}

// Parse one object line. On failure: *field and msg. hash ids appended to ids.
static int parse_line(const char *p, size_t n, double *vals, int *seen, u64vec *ids,
                      size_t *nids, const char **field, char *msg, size_t msg_len) {
    cursor c = {p, p + n, msg, msg_len};
    *field = "";
    *nids = 0;
    if (expect(&c, '{', "expected a JSON object '{'") != 0) return -1;
    skip_ws(&c);
    if (c.p < c.end && *c.p == '}') {
        c.p++;
    } else {
        for (;;) {
            const char *k;
            size_t kn;
            skip_ws(&c);
            // After a ',' a key must follow: a trailing comma fails here.
            if (c.p >= c.end || *c.p != '"') return fail(&c, "expected a quoted key");
            if (scan_string(&c, &k, &kn) != 0) return -1;
            int key = -1;
            for (int i = 0; i < NUM_KEYS; i++)
                if (strlen(key_names[i]) == kn && memcmp(key_names[i], k, kn) == 0) key = i;
            if (expect(&c, ':', "expected ':' after a key") != 0) return -1;
            skip_ws(&c);
            if (key >= 0) {
                *field = key_names[key];
                if (seen[key]) {
                    snprintf(msg, msg_len, "duplicate key \"%s\"", key_names[key]);
                    return -1;
                }
                seen[key] = 1;
            }
            if (key == KEY_HASH) {
                if (scan_hash_ids(&c, ids, nids) != 0) return -1;
            } else if (key >= 0) {
                if (c.p < c.end && *c.p == '"') {
                    const char *s;
                    size_t sn;
                    if (scan_string(&c, &s, &sn) != 0) return -1;
                    snprintf(msg, msg_len, "not a number: \"%.*s\"", (int)(sn < 40 ? sn : 40), s);
                    return -1;
                }
                if (scan_number(&c, &vals[key]) != 0) {
                    char q[24];
                    const size_t left = (size_t)(c.end - c.p);
                    size_t qn = left < 16 ? left : 16;
                    if (memchr(c.p, '\0', qn)) qn = (size_t)((const char *)memchr(c.p, '\0', qn) - c.p);
                    if (c.p < c.end && strncmp(msg, "truncated", 9) != 0) {
                        snprintf(q, sizeof q, "%.*s", (int)qn, c.p);
                        snprintf(msg, msg_len, "not a number: '%s'", q);
                    }
                    return -1;
                }
            } else if (skip_value(&c, 0) != 0) {
                return -1;
            }
            // The key is named until its value ends: a NUL or stray byte right
            // after a number is that field's error (issue 20, defect 10).
            skip_ws(&c);
            if (c.p < c.end && *c.p == '}') {
                c.p++;
                *field = "";
                break;
            }
            if (expect(&c, ',', "expected ',' or '}'") != 0) {
                if (c.p >= c.end) *field = ""; // the line is cut short, not the value
                return -1;
            }
            *field = "";
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
}

// ---- prefix groups from hash-id chains ----

PKVI_WRAPS static uint64_t mix(uint64_t h, uint64_t x) {
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

PKVI_WRAPS static uint32_t *counter_slot(counter *t, uint64_t key) {
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

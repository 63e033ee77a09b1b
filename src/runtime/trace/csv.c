// SPDX-License-Identifier: MIT
// The CSV trace dialects: native (traces/README.md), Azure LLM inference 2023
// and BurstGPT. Columns are found by header name, so column order and extra
// columns do not matter. Every rejected row is reported with the file's own
// column name. Azure and BurstGPT arrivals are rebased so the first row is at 0 s.
#include <ctype.h>
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "trace_internal.h"

#define MAX_COLS 32

enum col_role { COL_ARRIVAL, COL_PROMPT, COL_OUTPUT, COL_N, COL_GROUP, COL_PREFIX, COL_ID, NUM_ROLES };

typedef struct dialect {
    pkv_trace_format format;
    const char *names[NUM_ROLES]; // the header name of each role, NULL if absent
    int required[NUM_ROLES];
} dialect;

static const dialect dialects[] = {
    {PKV_TRACE_NATIVE,
     {"arrival_s", "prompt_tokens", "output_tokens", "n", "prefix_group", "prefix_tokens",
      "request_id"},
     {1, 1, 1, 0, 0, 0, 0}},
    {PKV_TRACE_AZURE,
     {"TIMESTAMP", "ContextTokens", "GeneratedTokens", NULL, NULL, NULL, NULL},
     {1, 1, 1, 0, 0, 0, 0}},
    {PKV_TRACE_BURSTGPT,
     {"Timestamp", "Request tokens", "Response tokens", NULL, NULL, NULL, NULL},
     {1, 1, 1, 0, 0, 0, 0}},
};

static const dialect *dialect_for(pkv_trace_format f) {
    for (size_t i = 0; i < sizeof dialects / sizeof dialects[0]; i++)
        if (dialects[i].format == f) return &dialects[i];
    return NULL;
}

typedef struct span {
    const char *p;
    size_t n;
} span;

static span trim(span s) {
    while (s.n && isspace((unsigned char)s.p[0])) s.p++, s.n--;
    while (s.n && isspace((unsigned char)s.p[s.n - 1])) s.n--;
    return s;
}

static int span_eq(span s, const char *str) { return strlen(str) == s.n && memcmp(s.p, str, s.n) == 0; }

// Split a line on commas into at most MAX_COLS trimmed fields; returns the count.
static int split(const char *line, size_t len, span *out) {
    int n = 0;
    size_t start = 0;
    for (size_t i = 0; i <= len; i++) {
        if (i == len || line[i] == ',') {
            if (n == MAX_COLS) return MAX_COLS + 1;
            out[n++] = trim((span){line + start, i - start});
            start = i + 1;
        }
    }
    return n;
}

pkv_trace_format pkvi_csv_detect(const char *line, size_t len) {
    span cols[MAX_COLS + 1];
    int n = split(line, len, cols);
    if (n > MAX_COLS) n = MAX_COLS;
    for (int i = 0; i < n; i++) {
        if (span_eq(cols[i], "arrival_s") || span_eq(cols[i], "prompt_tokens") ||
            span_eq(cols[i], "output_tokens"))
            return PKV_TRACE_NATIVE;
        if (span_eq(cols[i], "TIMESTAMP") || span_eq(cols[i], "ContextTokens") ||
            span_eq(cols[i], "GeneratedTokens"))
            return PKV_TRACE_AZURE;
        if (span_eq(cols[i], "Request tokens") || span_eq(cols[i], "Response tokens") ||
            span_eq(cols[i], "Log Type"))
            return PKV_TRACE_BURSTGPT;
    }
    return PKV_TRACE_AUTO;
}

static void quote(span s, char *buf, size_t cap) {
    size_t n = s.n < cap - 1 ? s.n : cap - 1;
    memcpy(buf, s.p, n);
    buf[n] = '\0';
}

// A signed integer that fills the field. 0 on success.
static int parse_int(span s, long long *v) {
    char buf[64];
    if (s.n == 0 || s.n >= sizeof buf) return -1;
    quote(s, buf, sizeof buf);
    char *end;
    errno = 0;
    *v = strtoll(buf, &end, 10);
    return (errno || *end) ? -1 : 0;
}

// An unsigned integer of decimal digits only (no sign) that fills the field:
// request ids use the whole uint64 range the writer can print. 0 on success.
static int parse_u64(span s, uint64_t *v) {
    if (s.n == 0 || s.n > 20) return -1;
    uint64_t x = 0;
    for (size_t i = 0; i < s.n; i++) {
        if (s.p[i] < '0' || s.p[i] > '9') return -1;
        const unsigned d = (unsigned)(s.p[i] - '0');
        if (x > (UINT64_MAX - d) / 10) return -1;
        x = x * 10 + d;
    }
    *v = x;
    return 0;
}

// A finite decimal number that fills the field. strtod alone would also take
// hex floats ("0x1p3"), "inf" and "nan".
static int parse_double(span s, double *v) {
    char buf[64];
    if (s.n == 0 || s.n >= sizeof buf) return -1;
    for (size_t i = 0; i < s.n; i++)
        if (!isdigit((unsigned char)s.p[i]) && (s.p[i] == '\0' || !strchr("+-.eE", s.p[i])))
            return -1; // (strchr finds '\0' too: the terminator)
    quote(s, buf, sizeof buf);
    char *end;
    errno = 0;
    *v = strtod(buf, &end);
    return (errno || *end || !isfinite(*v)) ? -1 : 0;
}

// Days since 1970-01-01 of a proleptic Gregorian date.
// (H. Hinnant's algorithm, in signed arithmetic so nothing wraps.)
static long long days_from_civil(long long y, int m, int d) {
    y -= m <= 2;
    const long long era = (y >= 0 ? y : y - 399) / 400;
    const long long yoe = y - era * 400;                               // [0, 399]
    const long long doy = (153 * (m > 2 ? m - 3 : m + 9) + 2) / 5 + d - 1; // [0, 365]
    const long long doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;       // [0, 146096]
    return era * 146097 + doe - 719468;
}

// "YYYY-MM-DD HH:MM:SS[.fraction]" to seconds since the epoch. 0 on success.
static int parse_timestamp(span s, double *v) {
    char buf[64];
    if (s.n < 19 || s.n >= sizeof buf) return -1;
    quote(s, buf, sizeof buf);
    // sscanf's %d skips blanks and takes signs: the fixed layout is checked
    // character by character instead, so " 1-0"-style fields do not pass.
    for (int i = 0; i < 19; i++) {
        const int sep = i == 4 || i == 7 ? '-' : i == 10 ? ' ' : i == 13 || i == 16 ? ':' : 0;
        if (sep ? buf[i] != sep : !isdigit((unsigned char)buf[i])) return -1;
    }
    int y, mo, d, h, mi, sec, used = 0;
    if (sscanf(buf, "%4d-%2d-%2d %2d:%2d:%2d%n", &y, &mo, &d, &h, &mi, &sec, &used) != 6 ||
        used != 19)
        return -1;
    static const int mdays[12] = {31, 28, 31, 30, 31, 30, 31, 31, 30, 31, 30, 31};
    const int leap = (y % 4 == 0 && y % 100 != 0) || y % 400 == 0;
    if (mo < 1 || mo > 12 || d < 1 || d > mdays[mo - 1] + (mo == 2 && leap) || h > 23 ||
        mi > 59 || sec > 60)
        return -1;
    // The fraction: '.' and one or more digits, nothing else (no exponent).
    double frac = 0;
    if (buf[19] != '\0') {
        if (buf[19] != '.' || buf[20] == '\0') return -1;
        for (const char *c = buf + 20; *c; c++)
            if (!isdigit((unsigned char)*c)) return -1;
        frac = strtod(buf + 19, NULL);
        if (!(frac >= 0 && frac < 1)) return -1;
    }
    *v = (double)days_from_civil(y, mo, d) * 86400.0 + h * 3600.0 +
         mi * 60.0 + sec + frac;
    return 0;
}

// Parse a token count into *out (1 .. UINT32_MAX); on failure writes msg.
static int parse_length(span s, uint32_t *out, char *msg, size_t msg_len) {
    long long v;
    char q[48];
    quote(s, q, sizeof q);
    if (parse_int(s, &v) != 0) {
        snprintf(msg, msg_len, "not an integer: '%s'", q);
        return -1;
    }
    if (v <= 0) {
        snprintf(msg, msg_len, "length must be >= 1, got %lld", v);
        return -1;
    }
    if (v > (long long)UINT32_MAX) {
        snprintf(msg, msg_len, "length too large: %lld", v);
        return -1;
    }
    *out = (uint32_t)v;
    return 0;
}

// Parse one data row into *r. On failure sets *field (a header name) and msg.
static int parse_row(const dialect *dl, const int *col_of, const span *cols, int ncols,
                     const span *f, int nf, int64_t row_index, pkv_trace_request *r,
                     double *raw_time, const char **field, char *msg, size_t msg_len) {
    // The caller has checked that every present column exists in this row.
    (void)cols;
    (void)ncols;
    (void)nf;
    memset(r, 0, sizeof *r);
    r->n = 1;
    r->prefix_group = -1;
    r->request_id = (uint64_t)row_index;
    // Arrival.
    span a = f[col_of[COL_ARRIVAL]];
    char q[48];
    quote(a, q, sizeof q);
    *field = dl->names[COL_ARRIVAL];
    if (dl->format == PKV_TRACE_AZURE) {
        if (parse_timestamp(a, raw_time) != 0) {
            snprintf(msg, msg_len, "not a timestamp (YYYY-MM-DD HH:MM:SS.f): '%s'", q);
            return -1;
        }
    } else if (parse_double(a, raw_time) != 0) {
        snprintf(msg, msg_len, "not a number: '%s'", q);
        return -1;
    } else if (*raw_time < 0) {
        snprintf(msg, msg_len, "arrival must be >= 0, got %s", q);
        return -1;
    }
    *field = dl->names[COL_PROMPT];
    if (parse_length(f[col_of[COL_PROMPT]], &r->prompt_tokens, msg, msg_len) != 0) return -1;
    *field = dl->names[COL_OUTPUT];
    if (parse_length(f[col_of[COL_OUTPUT]], &r->output_tokens, msg, msg_len) != 0) return -1;
    // Optional native columns: an empty field takes the default.
    long long v;
    if (col_of[COL_N] != NUM_ROLES * MAX_COLS && f[col_of[COL_N]].n) {
        *field = dl->names[COL_N];
        if (parse_length(f[col_of[COL_N]], &r->n, msg, msg_len) != 0) return -1;
    }
    if (col_of[COL_GROUP] != NUM_ROLES * MAX_COLS && f[col_of[COL_GROUP]].n) {
        *field = dl->names[COL_GROUP];
        quote(f[col_of[COL_GROUP]], q, sizeof q);
        if (parse_int(f[col_of[COL_GROUP]], &v) != 0 || v < -1) {
            snprintf(msg, msg_len, "not a group id (integer >= -1): '%s'", q);
            return -1;
        }
        r->prefix_group = v;
    }
    if (col_of[COL_PREFIX] != NUM_ROLES * MAX_COLS && f[col_of[COL_PREFIX]].n) {
        *field = dl->names[COL_PREFIX];
        quote(f[col_of[COL_PREFIX]], q, sizeof q);
        if (parse_int(f[col_of[COL_PREFIX]], &v) != 0 || v < 0 || v > (long long)UINT32_MAX) {
            snprintf(msg, msg_len, "not a token count (integer >= 0): '%s'", q);
            return -1;
        }
        r->prefix_tokens = (uint32_t)v;
    }
    if (col_of[COL_ID] != NUM_ROLES * MAX_COLS && f[col_of[COL_ID]].n) {
        *field = dl->names[COL_ID];
        quote(f[col_of[COL_ID]], q, sizeof q);
        if (parse_u64(f[col_of[COL_ID]], &r->request_id) != 0) {
            snprintf(msg, msg_len, "not a request id (integer 0 .. 2^64-1): '%s'", q);
            return -1;
        }
    }
    if (r->prefix_group < 0) r->prefix_tokens = 0;
    return 0;
}

pkv_status pkvi_csv_parse(const char *text, size_t len, const char *name, pkv_trace_format fmt,
                          int skip_bad, pkv_trace **out, pkv_trace_error *err) {
    const dialect *dl = dialect_for(fmt);
    if (!dl) return PKV_ERR_INVALID_ARG;
    size_t pos = 0;
    uint64_t line_no = 0;
    // Header: the first non-blank line.
    span cols[MAX_COLS + 1];
    int ncols = 0;
    while (pos < len && ncols == 0) {
        size_t eol = pos;
        while (eol < len && text[eol] != '\n') eol++;
        line_no++;
        span l = trim((span){text + pos, eol - pos});
        pos = eol < len ? eol + 1 : len;
        if (l.n) ncols = split(l.p, l.n, cols);
    }
    if (ncols > MAX_COLS) {
        pkvi_trace_set_error(err, name, line_no, "", "header has more than %d columns", MAX_COLS);
        return PKV_ERR_FORMAT;
    }
    for (int c = 0; c < ncols; c++) {
        if (memchr(cols[c].p, '\0', cols[c].n)) {
            pkvi_trace_set_error(err, name, line_no, "", "NUL byte in the header");
            return PKV_ERR_FORMAT;
        }
    }
    // Map roles to columns; an absent optional column maps to an impossible index.
    const int absent = NUM_ROLES * MAX_COLS;
    int col_of[NUM_ROLES];
    for (int role = 0; role < NUM_ROLES; role++) {
        col_of[role] = absent;
        if (!dl->names[role]) continue;
        for (int c = 0; c < ncols; c++)
            if (span_eq(cols[c], dl->names[role])) col_of[role] = c;
        if (col_of[role] == absent && dl->required[role]) {
            pkvi_trace_set_error(err, name, line_no, dl->names[role],
                                 "missing column '%s' in the %s header", dl->names[role],
                                 pkv_trace_format_name(fmt));
            return PKV_ERR_FORMAT;
        }
    }

    pkvi_reqvec v = {0};
    uint64_t skipped = 0;
    double t0 = 0, prev = 0;
    int have_t0 = 0;
    const int rebase = fmt != PKV_TRACE_NATIVE;
    while (pos < len) {
        size_t eol = pos;
        while (eol < len && text[eol] != '\n') eol++;
        line_no++;
        span l = trim((span){text + pos, eol - pos});
        pos = eol < len ? eol + 1 : len;
        if (l.n == 0) continue;
        span f[MAX_COLS + 1];
        int nf = split(l.p, l.n, f);
        pkv_trace_request r;
        double raw = 0;
        const char *field = "";
        char msg[128];
        int bad = 0;
        char nul_field[64];
        if (nf > ncols) {
            // A longer row is as wrong as a shorter one: a stray comma shifts
            // nothing here (columns are found by name), but the row does not
            // say what the header says.
            snprintf(msg, sizeof msg, "%s%d fields, the header has %d", nf > MAX_COLS ? "more than " : "",
                     nf > MAX_COLS ? MAX_COLS : nf, ncols);
            bad = 1;
        }
        for (int c = 0; c < nf && !bad; c++) {
            if (memchr(f[c].p, '\0', f[c].n)) {
                // strtod and friends would stop at the NUL and read "12\0junk" as 12.
                quote(cols[c], nul_field, sizeof nul_field);
                field = nul_field;
                snprintf(msg, sizeof msg, "NUL byte in the field");
                bad = 1;
            }
        }
        // A short row is a truncated line: name the first present column it lacks.
        for (int role = 0; role < NUM_ROLES && !bad; role++) {
            if (col_of[role] != absent && col_of[role] >= nf) {
                field = dl->names[role];
                snprintf(msg, sizeof msg, "truncated line: %d of %d fields", nf, ncols);
                bad = 1;
            }
        }
        if (!bad)
            bad = parse_row(dl, col_of, cols, ncols, f, nf, (int64_t)v.count, &r, &raw, &field,
                            msg, sizeof msg) != 0;
        if (!bad) {
            if (rebase && !have_t0) {
                t0 = raw;
                have_t0 = 1;
            }
            r.arrival_s = rebase ? raw - t0 : raw;
            if (v.count > 0 && r.arrival_s < prev) {
                field = dl->names[COL_ARRIVAL];
                snprintf(msg, sizeof msg, "arrivals are not sorted: %.9g s after %.9g s",
                         r.arrival_s, prev);
                bad = 1;
            } else {
                const char *f2;
                if (pkvi_trace_check_request(&r, v.count ? prev : 0, &f2, msg, sizeof msg) != PKV_OK) {
                    field = f2;
                    bad = 1;
                }
            }
        }
        if (bad) {
            if (skip_bad) {
                skipped++;
                continue;
            }
            pkvi_trace_set_error(err, name, line_no, field, "%s", msg);
            free(v.reqs);
            return PKV_ERR_FORMAT;
        }
        pkv_status st = pkvi_reqvec_push(&v, &r);
        if (st != PKV_OK) {
            free(v.reqs);
            return st;
        }
        prev = r.arrival_s;
    }
    if (v.count == 0) {
        pkvi_trace_set_error(err, name, 0, "", "no requests after the header (%llu bad rows skipped)",
                             (unsigned long long)skipped);
        free(v.reqs);
        return PKV_ERR_FORMAT;
    }
    pkv_status st = pkvi_trace_finish(&v, fmt, skipped, out);
    free(v.reqs);
    return st;
}

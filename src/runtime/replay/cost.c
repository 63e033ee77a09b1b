// SPDX-License-Identifier: MIT
// Allocation cost models: what one backend alloc or free call of a given size
// costs in sim mode, t(bytes) = base + per_byte x bytes, with a flag saying
// whether the call synchronizes the device. Built-in models, and the JSON file
// that `bench_alloc --calibrate` writes:
//   {"name": "...", "alloc": {"base_us": X, "per_mib_us": Y, "sync": true},
//    "free": {...}, ...any other keys, ignored}
// The reader is a small strict JSON parser that skips what it does not need.
#include <ctype.h>
#include <errno.h>
#include <math.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>

#include "replay_internal.h"

pkv_alloc_model pkv_alloc_model_none(void) {
    pkv_alloc_model m;
    memset(&m, 0, sizeof m);
    snprintf(m.name, sizeof m.name, "none");
    return m;
}

pkv_alloc_model pkv_alloc_model_constant(double seconds) {
    pkv_alloc_model m = pkv_alloc_model_none();
    snprintf(m.name, sizeof m.name, "constant %g us/call", seconds * 1e6);
    m.alloc.base_s = m.free.base_s = seconds;
    m.alloc.sync = m.free.sync = 1;
    return m;
}

pkv_status pkv_alloc_model_builtin(const char *name, pkv_alloc_model *m) {
    if (!name || !m) return PKV_ERR_INVALID_ARG;
    if (strcmp(name, "none") == 0) {
        *m = pkv_alloc_model_none();
        return PKV_OK;
    }
    if (strcmp(name, "cuda-boyer") == 0) {
        // cudaMalloc/cudaFree by size (docs/POLICIES.md, "Allocation cost").
        // M. Boyer, "Memory Allocation Overhead" (U. of Virginia CUDA support
        // pages), measured cudaMalloc at a roughly constant ~50 us per call from
        // 4 KiB to 512 KiB and "increasing significantly" above (the figure's
        // larger values are not given in its text). Points:
        //   4 KiB   -> 50 us   measured (Boyer)
        //   512 KiB -> 50 us   measured (Boyer)
        //   2 MiB   -> 50 us   extrapolated: one 2 MiB physical page backs any
        //                      allocation up to 2 MiB, as it backs 512 KiB
        //   4 GiB   -> 102400 us extrapolated: 50 us per further 2 MiB page, the
        //                      price this testbed gives one page map (vmm), since
        //                      cudaMalloc maps 2 MiB pages as cuMemMap does
        //                      (device memory model "cuda"); a lower bound on
        //                      "increasing significantly", never below a flat 50.
        // Above 4 GiB the last segment continues (50 us per 2 MiB). cudaFree is
        // taken to cost the same (not measured by Boyer); both synchronize the
        // device (CUDA Runtime API: cudaFree "performs an implicit device
        // synchronization").
        static const uint64_t b[] = {4ull << 10, 512ull << 10, 2ull << 20, 4ull << 30};
        static const double us[] = {50, 50, 50, 102400};
        *m = pkv_alloc_model_none();
        snprintf(m->name, sizeof m->name,
                 "cuda-boyer (cudaMalloc/cudaFree 50 us to 2 MiB, +50 us per 2 MiB, sync)");
        for (uint32_t i = 0; i < 4; i++) {
            m->alloc.point_bytes[i] = m->free.point_bytes[i] = b[i];
            m->alloc.point_s[i] = m->free.point_s[i] = us[i] * 1e-6;
        }
        m->alloc.num_points = m->free.num_points = 4;
        m->alloc.sync = m->free.sync = 1;
        return PKV_OK;
    }
    if (strcmp(name, "cuda-boyer-flat") == 0) {
        // Boyer's 4 KiB-512 KiB figure at every size (the model before the
        // size-dependent one): a lower bound for calls above 512 KiB.
        *m = pkv_alloc_model_constant(50e-6);
        snprintf(m->name, sizeof m->name, "cuda-boyer-flat (cudaMalloc/cudaFree 50 us/call, sync)");
        return PKV_OK;
    }
    return PKV_ERR_NOT_FOUND;
}

pkv_status pkv_alloc_call_cost_check(const pkv_alloc_call_cost *c) {
    if (!c || !(c->base_s >= 0) || !isfinite(c->base_s) || !(c->per_byte_s >= 0) ||
        !isfinite(c->per_byte_s) || c->num_points > PKV_ALLOC_COST_MAX_POINTS)
        return PKV_ERR_INVALID_ARG;
    for (uint32_t i = 0; i < c->num_points; i++) {
        if (!(c->point_s[i] >= 0) || !isfinite(c->point_s[i])) return PKV_ERR_INVALID_ARG;
        if (i > 0 && (c->point_bytes[i] <= c->point_bytes[i - 1] ||
                      c->point_s[i] < c->point_s[i - 1]))
            return PKV_ERR_INVALID_ARG;
    }
    return PKV_OK;
}

double pkv_alloc_call_seconds(const pkv_alloc_call_cost *c, uint64_t bytes) {
    if (!c) return 0;
    const uint32_t n = c->num_points;
    if (n == 0) return c->base_s + c->per_byte_s * (double)bytes;
    if (bytes <= c->point_bytes[0]) return c->point_s[0];
    if (n == 1) return c->point_s[0]; // one point: flat
    uint32_t i = 1; // the segment [i - 1, i] holding bytes, or the last one past the end
    while (i + 1 < n && bytes > c->point_bytes[i]) i++;
    const double x0 = (double)c->point_bytes[i - 1], x1 = (double)c->point_bytes[i];
    const double y0 = c->point_s[i - 1], y1 = c->point_s[i];
    return y0 + (y1 - y0) * ((double)bytes - x0) / (x1 - x0);
}

static void write_call(FILE *f, const pkv_alloc_call_cost *c) {
    if (c->num_points == 0) {
        fprintf(f, "{\"base_us\": %.9g, \"per_mib_us\": %.9g, \"sync\": %s}", c->base_s * 1e6,
                c->per_byte_s * 1e6 * 1048576.0, c->sync ? "true" : "false");
        return;
    }
    fputs("{\"points\": [", f);
    for (uint32_t i = 0; i < c->num_points; i++)
        fprintf(f, "%s[%llu, %.9g]", i ? ", " : "", (unsigned long long)c->point_bytes[i],
                c->point_s[i] * 1e6);
    fprintf(f, "], \"sync\": %s}", c->sync ? "true" : "false");
}

pkv_status pkv_alloc_model_write_json(FILE *f, const pkv_alloc_model *m) {
    if (!f || !m) return PKV_ERR_INVALID_ARG;
    fputs("{\"name\": \"", f);
    for (const char *s = m->name; *s; s++) {
        if (*s == '"' || *s == '\\') fputc('\\', f);
        if ((unsigned char)*s >= 0x20) fputc(*s, f);
    }
    fputs("\", \"alloc\": ", f);
    write_call(f, &m->alloc);
    fputs(", \"free\": ", f);
    write_call(f, &m->free);
    fputc('}', f);
    return ferror(f) ? PKV_ERR_IO : PKV_OK;
}

// ---- reading ----

typedef struct jp {
    const char *s, *end, *path;
    unsigned line;
    char *err;
    size_t err_len;
    int failed;
} jp;

#if defined(__GNUC__)
__attribute__((format(printf, 3, 4)))
#endif
static void fail(jp *p, const char *field, const char *fmt, ...) {
    if (p->failed) return;
    p->failed = 1;
    if (!p->err || !p->err_len) return;
    char msg[160];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    snprintf(p->err, p->err_len, "%s:%u: %s%s%s", p->path, p->line, field, *field ? ": " : "",
             msg);
}

static void ws(jp *p) {
    while (p->s < p->end && isspace((unsigned char)*p->s)) {
        if (*p->s == '\n') p->line++;
        p->s++;
    }
}

static int expect(jp *p, char c, const char *field) {
    ws(p);
    if (p->s < p->end && *p->s == c) {
        p->s++;
        return 0;
    }
    fail(p, field, "expected '%c'", c);
    return -1;
}

// A string (no escapes other than \" and \\ kept) into buf.
static int string(jp *p, char *buf, size_t cap, const char *field) {
    if (expect(p, '"', field)) return -1;
    size_t n = 0;
    while (p->s < p->end && *p->s != '"') {
        char c = *p->s++;
        if (c == '\\' && p->s < p->end) c = *p->s++;
        if (c == '\n') {
            fail(p, field, "newline in a string");
            return -1;
        }
        if (n + 1 < cap) buf[n++] = c;
    }
    if (p->s >= p->end) {
        fail(p, field, "unterminated string");
        return -1;
    }
    p->s++;
    if (cap) buf[n] = '\0';
    return 0;
}

static int skip_value(jp *p, const char *field);

static int skip_container(jp *p, char open, char close, const char *field) {
    p->s++; // open
    ws(p);
    if (p->s < p->end && *p->s == close) {
        p->s++;
        return 0;
    }
    for (;;) {
        if (open == '{') {
            char k[64];
            if (string(p, k, sizeof k, field) || expect(p, ':', field)) return -1;
        }
        if (skip_value(p, field)) return -1;
        ws(p);
        if (p->s < p->end && *p->s == ',') {
            p->s++;
            continue;
        }
        return expect(p, close, field);
    }
}

static int skip_value(jp *p, const char *field) {
    ws(p);
    if (p->s >= p->end) {
        fail(p, field, "missing value");
        return -1;
    }
    const char c = *p->s;
    if (c == '{') return skip_container(p, '{', '}', field);
    if (c == '[') return skip_container(p, '[', ']', field);
    if (c == '"') {
        char tmp[8];
        return string(p, tmp, sizeof tmp, field);
    }
    const char *st = p->s;
    while (p->s < p->end && (isalnum((unsigned char)*p->s) || strchr("+-.", *p->s))) p->s++;
    if (p->s == st) {
        fail(p, field, "unexpected '%c'", c);
        return -1;
    }
    return 0;
}

static int number(jp *p, double *v, const char *field) {
    ws(p);
    char *e;
    errno = 0;
    *v = strtod(p->s, &e);
    if (e == p->s || e > p->end || errno || !isfinite(*v) || *v < 0) {
        fail(p, field, "expected a finite number >= 0");
        return -1;
    }
    p->s = e;
    return 0;
}

static int boolean(jp *p, int *v, const char *field) {
    ws(p);
    if ((size_t)(p->end - p->s) >= 4 && !strncmp(p->s, "true", 4)) {
        *v = 1;
        p->s += 4;
        return 0;
    }
    if ((size_t)(p->end - p->s) >= 5 && !strncmp(p->s, "false", 5)) {
        *v = 0;
        p->s += 5;
        return 0;
    }
    fail(p, field, "expected true or false");
    return -1;
}

// [[bytes, us], ...]: 1 to PKV_ALLOC_COST_MAX_POINTS points, bytes increasing,
// cost non-decreasing.
static int points(jp *p, pkv_alloc_call_cost *c, const char *field) {
    c->num_points = 0;
    if (expect(p, '[', field)) return -1;
    for (;;) {
        double b, us;
        if (c->num_points == PKV_ALLOC_COST_MAX_POINTS) {
            fail(p, field, "more than %d points", PKV_ALLOC_COST_MAX_POINTS);
            return -1;
        }
        if (expect(p, '[', field) || number(p, &b, field) || expect(p, ',', field) ||
            number(p, &us, field) || expect(p, ']', field))
            return -1;
        if (b != floor(b) || b > 1e18) {
            fail(p, field, "bytes must be a whole number of bytes");
            return -1;
        }
        const uint32_t i = c->num_points++;
        c->point_bytes[i] = (uint64_t)b;
        c->point_s[i] = us * 1e-6;
        if (i > 0 && (c->point_bytes[i] <= c->point_bytes[i - 1] ||
                      c->point_s[i] < c->point_s[i - 1])) {
            fail(p, field, "point %u: bytes must increase and the cost must not decrease", i + 1);
            return -1;
        }
        ws(p);
        if (p->s < p->end && *p->s == ',') {
            p->s++;
            continue;
        }
        return expect(p, ']', field);
    }
}

// {"base_us": X, "per_mib_us": Y, "sync": B} or {"points": [[bytes, us], ...],
// "sync": B}: sync and one of the two shapes required.
static int call_cost(jp *p, pkv_alloc_call_cost *c, const char *which) {
    char field[48];
    int have = 0;
    ws(p);
    if (expect(p, '{', which)) return -1;
    ws(p);
    if (p->s < p->end && *p->s == '}') {
        p->s++;
    } else {
        for (;;) {
            char k[32];
            if (string(p, k, sizeof k, which) || expect(p, ':', which)) return -1;
            snprintf(field, sizeof field, "%s.%s", which, k);
            double v;
            if (!strcmp(k, "base_us")) {
                if (number(p, &v, field)) return -1;
                c->base_s = v * 1e-6;
                have |= 1;
            } else if (!strcmp(k, "per_mib_us")) {
                if (number(p, &v, field)) return -1;
                c->per_byte_s = v * 1e-6 / 1048576.0;
                have |= 2;
            } else if (!strcmp(k, "sync")) {
                if (boolean(p, &c->sync, field)) return -1;
                have |= 4;
            } else if (!strcmp(k, "points")) {
                if (points(p, c, field)) return -1;
                have |= 8;
            } else if (skip_value(p, field)) {
                return -1;
            }
            ws(p);
            if (p->s < p->end && *p->s == ',') {
                p->s++;
                continue;
            }
            if (expect(p, '}', which)) return -1;
            break;
        }
    }
    if (have != 7 && have != 12) {
        fail(p, which, "needs sync and either base_us and per_mib_us, or points");
        return -1;
    }
    return 0;
}

static pkv_status parse_model(jp *p, pkv_alloc_model *m) {
    int have = 0;
    if (expect(p, '{', "")) return PKV_ERR_FORMAT;
    for (;;) {
        char k[32];
        if (string(p, k, sizeof k, "") || expect(p, ':', k)) return PKV_ERR_FORMAT;
        if (!strcmp(k, "name")) {
            if (string(p, m->name, sizeof m->name, "name")) return PKV_ERR_FORMAT;
        } else if (!strcmp(k, "alloc")) {
            if (call_cost(p, &m->alloc, "alloc")) return PKV_ERR_FORMAT;
            have |= 1;
        } else if (!strcmp(k, "free")) {
            if (call_cost(p, &m->free, "free")) return PKV_ERR_FORMAT;
            have |= 2;
        } else if (skip_value(p, k)) {
            return PKV_ERR_FORMAT;
        }
        ws(p);
        if (p->s < p->end && *p->s == ',') {
            p->s++;
            continue;
        }
        if (expect(p, '}', "")) return PKV_ERR_FORMAT;
        break;
    }
    ws(p);
    if (p->s != p->end) {
        fail(p, "", "trailing text after the object");
        return PKV_ERR_FORMAT;
    }
    if (!(have & 1)) fail(p, "alloc", "missing");
    else if (!(have & 2)) fail(p, "free", "missing");
    return have == 3 ? PKV_OK : PKV_ERR_FORMAT;
}

pkv_status pkv_alloc_model_load(const char *path, pkv_alloc_model *m, char *err, size_t err_len) {
    if (!path || !m) return PKV_ERR_INVALID_ARG;
    if (err && err_len) err[0] = '\0';
    FILE *f = fopen(path, "rb");
    if (!f) {
        if (err && err_len) snprintf(err, err_len, "%s: cannot open: %s", path, strerror(errno));
        return PKV_ERR_IO;
    }
    char *buf = malloc(1 << 20);
    if (!buf) {
        fclose(f);
        return PKV_ERR_OUT_OF_MEMORY;
    }
    size_t n = fread(buf, 1, (1 << 20) - 1, f);
    const int bad = ferror(f) || !feof(f);
    fclose(f);
    if (bad) {
        free(buf);
        if (err && err_len) snprintf(err, err_len, "%s: unreadable, or larger than 1 MiB", path);
        return PKV_ERR_IO;
    }
    buf[n] = '\0';
    pkv_alloc_model out = pkv_alloc_model_none();
    snprintf(out.name, sizeof out.name, "%.80s", path);
    jp p = {buf, buf + n, path, 1, err, err_len, 0};
    pkv_status st = parse_model(&p, &out);
    free(buf);
    if (st == PKV_OK) *m = out;
    return st;
}

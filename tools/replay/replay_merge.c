// SPDX-License-Identifier: MIT
// `pkv-replay merge`: join the JSON documents (or the CSV files) that the shards
// of one sweep wrote (--point K/N) into the document one process running the
// whole sweep would have written: same trace, config and sweep lines, the runs
// of every shard in point order, partial if a shard was or a point is missing.
// Only the stamp differs: it lists the shards' stamps.
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "out_file.h"
#include "replay_tools.h"

typedef struct text {
    char *buf;
    size_t len; // bytes in buf
    int binary; // a NUL among them: not text
    char **lines;
    size_t n;
} text;

static int load(const char *path, text *t) {
    memset(t, 0, sizeof *t);
    FILE *f = fopen(path, "rb");
    if (!f) return -1;
    size_t cap = 1 << 16, len = 0;
    t->buf = malloc(cap + 1);
    size_t got;
    while (t->buf && (got = fread(t->buf + len, 1, cap - len, f)) > 0) {
        len += got;
        if (len == cap) {
            char *b = realloc(t->buf, 2 * cap + 1);
            if (!b) {
                free(t->buf);
                t->buf = NULL;
                break;
            }
            t->buf = b;
            cap *= 2;
        }
    }
    const int bad = ferror(f) || !t->buf;
    fclose(f);
    if (bad) return -1;
    t->buf[len] = '\0';
    t->len = len;
    t->binary = memchr(t->buf, '\0', len) != NULL;
    size_t nl = 1;
    for (size_t i = 0; i < len; i++) nl += t->buf[i] == '\n';
    t->lines = malloc(nl * sizeof *t->lines);
    if (!t->lines) return -1;
    char *p = t->buf;
    while (*p) {
        t->lines[t->n++] = p;
        char *e = strchr(p, '\n');
        if (!e) break;
        *e = '\0';
        p = e + 1;
    }
    return 0;
}

static void unload(text *t) {
    free(t->buf);
    free(t->lines);
}

static int starts(const char *s, const char *prefix) { return !strncmp(s, prefix, strlen(prefix)); }

typedef struct row {
    unsigned long index;
    const char *line; // without the separating comma
    size_t len;
    const char *file;
} row;

static int cmp_row(const void *a, const void *b) {
    const row *x = a, *y = b;
    return (x->index > y->index) - (x->index < y->index);
}

#define FAIL(...)                                                                                  \
    do {                                                                                           \
        fprintf(stderr, "pkv-replay merge: " __VA_ARGS__);                                         \
        fputc('\n', stderr);                                                                       \
        rc = 2;                                                                                    \
        goto done;                                                                                 \
    } while (0)

static void usage(FILE *f) {
    fputs("usage: pkv-replay merge [-o OUT] SHARD...\n"
          "Join the JSON documents (or the CSV files) written by the shards of one sweep\n"
          "(pkv-replay --point K/N ...) into the report one process would have written.\n"
          "Runs come out in point order; the result is partial if a shard was partial or\n"
          "a point is missing. -o OUT: write there instead of stdout.\n",
          f);
}

int rt_merge_main(int argc, char **argv) {
    const char *out_path = NULL;
    // As many shards as arguments: a sweep has one per point when every point is
    // its own job (a Slurm array, pagedkv.sweep), thousands of them.
    const char **files = calloc((size_t)argc, sizeof *files);
    size_t nf = 0;
    if (!files) {
        fprintf(stderr, "pkv-replay merge: out of memory\n");
        return 1;
    }
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--help") || !strcmp(argv[i], "-h")) {
            usage(stdout);
            free(files);
            return 0;
        } else if (!strcmp(argv[i], "-o") || !strcmp(argv[i], "--output")) {
            if (i + 1 >= argc) {
                fprintf(stderr, "pkv-replay merge: %s needs a file\n", argv[i]);
                free(files);
                return 2;
            }
            out_path = argv[++i];
        } else if (argv[i][0] == '-' && argv[i][1]) {
            fprintf(stderr, "pkv-replay merge: unknown option '%s' (see --help)\n", argv[i]);
            free(files);
            return 2;
        } else {
            files[nf++] = argv[i];
        }
    }
    if (nf == 0) {
        usage(stderr);
        free(files);
        return 2;
    }
    text *t = calloc(nf, sizeof *t);
    row *rows = NULL;
    size_t nrows = 0, cap = 0;
    int rc = 0, json = -1, partial = 0;
    unsigned long points = 0;
    out_file o;
    FILE *out;
    if (!t) {
        fprintf(stderr, "pkv-replay merge: out of memory\n");
        free(files);
        return 1;
    }
    for (size_t k = 0; k < nf; k++) {
        errno = 0;
        if (load(files[k], &t[k]) != 0)
            FAIL("cannot read %s: %s", files[k], errno ? strerror(errno) : "read error");
        if (t[k].len == 0) FAIL("%s is empty", files[k]);
        // Binary bytes are no report, whatever the first line looks like.
        if (t[k].binary)
            FAIL("%s is not a pkv-replay report: it holds binary data (expected the JSON document "
                 "of --json or the CSV of --csv)", files[k]);
        const int is_json = starts(t[k].lines[0], "{\"stamp\": ");
        if (json == -1) json = is_json;
        if (json != is_json) FAIL("%s: cannot merge JSON with CSV", files[k]);
        size_t first, end; // run lines [first, end)
        if (json) {
            if (t[k].n < 7 || !starts(t[k].lines[1], " \"trace\": ") ||
                !starts(t[k].lines[2], " \"config\": ") || !starts(t[k].lines[3], " \"sweep\": ") ||
                strcmp(t[k].lines[4], " \"runs\": [") != 0 ||
                strcmp(t[k].lines[t[k].n - 2], " ],") != 0 ||
                !starts(t[k].lines[t[k].n - 1], " \"partial\": "))
                FAIL("%s is not a pkv-replay JSON report (or was edited)", files[k]);
            for (int l = 1; l <= 3; l++)
                if (strcmp(t[k].lines[l], t[0].lines[l]) != 0)
                    FAIL("%s and %s come from different sweeps (their %s lines differ)", files[0],
                         files[k], l == 1 ? "trace" : l == 2 ? "config" : "sweep");
            if (strstr(t[k].lines[t[k].n - 1], "true")) partial = 1;
            const char *pp = strstr(t[k].lines[3], "\"points\": ");
            if (!pp) FAIL("%s: the sweep line has no point count", files[k]);
            points = strtoul(pp + 10, NULL, 10);
            first = 5;
            end = t[k].n - 2;
        } else {
            if (!starts(t[k].lines[0], "point.index,"))
                FAIL("%s is neither a pkv-replay JSON report nor its CSV", files[k]);
            if (strcmp(t[k].lines[0], t[0].lines[0]) != 0)
                FAIL("%s and %s have different CSV columns", files[0], files[k]);
            first = 1;
            end = t[k].n;
        }
        for (size_t l = first; l < end; l++) {
            const char *s = t[k].lines[l];
            if (!*s) continue;
            char *e;
            unsigned long idx;
            if (json) {
                if (!starts(s, "  {\"point\": {\"index\": "))
                    FAIL("%s:%zu: not a run line", files[k], l + 1);
                idx = strtoul(s + strlen("  {\"point\": {\"index\": "), &e, 10);
            } else {
                idx = strtoul(s, &e, 10);
                if (e == s || *e != ',') FAIL("%s:%zu: no point index", files[k], l + 1);
            }
            if (nrows == cap) {
                cap = cap ? 2 * cap : 256;
                row *r = realloc(rows, cap * sizeof *r);
                if (!r) {
                    fprintf(stderr, "pkv-replay merge: out of memory\n");
                    rc = 1;
                    goto done;
                }
                rows = r;
            }
            size_t len = strlen(s);
            if (json && len && s[len - 1] == ',') len--;
            rows[nrows++] = (row){idx, s, len, files[k]};
        }
    }
    if (nrows) qsort(rows, nrows, sizeof *rows, cmp_row);
    for (size_t i = 1; i < nrows; i++)
        if (rows[i].index == rows[i - 1].index)
            FAIL("point %lu is in both %s and %s", rows[i].index, rows[i - 1].file, rows[i].file);
    if (json && nrows != points) {
        fprintf(stderr, "pkv-replay merge: %zu of %lu points present; the report is partial\n",
                nrows, points);
        partial = 1;
    }
    // Whole or not at all, a failed write named (out_file.h).
    if (out_open(&o, "pkv-replay merge", out_path ? out_path : "-") != 0) {
        rc = 1;
        goto done;
    }
    out = o.f;
    if (json) {
        fputs("{\"stamp\": {\"merged_from\": [", out);
        for (size_t k = 0; k < nf; k++) {
            const char *s = t[k].lines[0] + strlen("{\"stamp\": ");
            size_t len = strlen(s);
            if (len && s[len - 1] == ',') len--;
            fprintf(out, "%s%.*s", k ? ", " : "", (int)len, s);
        }
        fputs("]},\n", out);
        for (int l = 1; l <= 4; l++) fprintf(out, "%s\n", t[0].lines[l]);
        for (size_t i = 0; i < nrows; i++)
            fprintf(out, "%.*s%s\n", (int)rows[i].len, rows[i].line, i + 1 < nrows ? "," : "");
        fprintf(out, " ],\n \"partial\": %s}\n", partial ? "true" : "false");
    } else {
        fprintf(out, "%s\n", t[0].lines[0]);
        for (size_t i = 0; i < nrows; i++) fprintf(out, "%.*s\n", (int)rows[i].len, rows[i].line);
    }
    if (out_close(&o) != 0) rc = 1;
done:
    for (size_t k = 0; k < nf; k++) unload(&t[k]);
    free(t);
    free(rows);
    free(files);
    return rc;
}

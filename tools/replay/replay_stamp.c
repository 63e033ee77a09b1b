// SPDX-License-Identifier: MIT
// Provenance of a pkv-replay report: library version, the commit the tool was
// built from, the command line, the date, the host, and a hash of the trace's
// bytes, so that a figure can be traced to exactly what produced it.
#include <ctype.h>
#include <glob.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "pkv/version.h"
#include "replay_build.h"
#include "replay_tools.h"

void rt_json_str(FILE *f, const char *s) {
    fputc('"', f);
    for (; *s; s++) {
        unsigned char c = (unsigned char)*s;
        if (c == '"' || c == '\\')
            fprintf(f, "\\%c", c);
        else if (c < 0x20)
            fprintf(f, "\\u%04x", c);
        else
            fputc(c, f);
    }
    fputc('"', f);
}

void rt_json_num(FILE *f, double v) {
    if (isfinite(v))
        fprintf(f, "%.9g", v);
    else
        fputs("null", f);
}

int rt_fnv1a64_file(const char *path, uint64_t *hash) {
    FILE *f = fopen(path, "rb");
    if (!f) return -1;
    uint64_t h = 0xcbf29ce484222325ull;
    unsigned char buf[1 << 16];
    size_t n;
    while ((n = fread(buf, 1, sizeof buf, f)) > 0)
        for (size_t i = 0; i < n; i++) {
            h ^= buf[i];
            h *= 0x100000001b3ull;
        }
    const int bad = ferror(f);
    fclose(f);
    if (bad) return -1;
    *hash = h;
    return 0;
}

// The value after "key" and ':' on the first line of `path` that starts with
// `key`, trimmed; 0 if found.
static int read_key(const char *path, const char *key, char *out, size_t cap) {
    FILE *f = fopen(path, "r");
    if (!f) return -1;
    char line[512];
    int rc = -1;
    const size_t kl = strlen(key);
    while (fgets(line, sizeof line, f)) {
        if (strncmp(line, key, kl) != 0) continue;
        char *v = strchr(line, ':');
        if (!v) continue;
        for (v++; *v == ' ' || *v == '\t'; v++) {}
        size_t n = strcspn(v, "\n");
        while (n && isspace((unsigned char)v[n - 1])) n--;
        snprintf(out, cap, "%.*s", (int)n, v);
        rc = 0;
        break;
    }
    fclose(f);
    return rc;
}

static int shell_safe(const char *s) {
    if (!*s) return 0;
    for (; *s; s++)
        if (!isalnum((unsigned char)*s) && !strchr("_./:=,+-@%", *s)) return 0;
    return 1;
}

static char *quote_command(int argc, char **argv) {
    size_t cap = 1;
    for (int i = 0; i < argc; i++) cap += 4 * strlen(argv[i]) + 3;
    char *s = malloc(cap), *p = s;
    if (!s) return NULL;
    for (int i = 0; i < argc; i++) {
        if (i) *p++ = ' ';
        if (shell_safe(argv[i])) {
            p += sprintf(p, "%s", argv[i]);
            continue;
        }
        *p++ = '\'';
        for (const char *c = argv[i]; *c; c++) {
            if (*c == '\'') {
                memcpy(p, "'\\''", 4);
                p += 4;
            } else {
                *p++ = *c;
            }
        }
        *p++ = '\'';
    }
    *p = '\0';
    return s;
}

int rt_stamp_init(rt_stamp *s, int argc, char **argv) {
    memset(s, 0, sizeof *s);
    const int v = pkv_version();
    snprintf(s->version, sizeof s->version, "%d.%d.%d", v / 10000, v / 100 % 100, v % 100);
    snprintf(s->commit, sizeof s->commit, "%s", PKV_BUILD_COMMIT[0] ? PKV_BUILD_COMMIT : "unknown");
    time_t now = time(NULL);
    struct tm tm;
    gmtime_r(&now, &tm);
    strftime(s->date, sizeof s->date, "%Y-%m-%dT%H:%M:%SZ", &tm);
    if (read_key("/proc/cpuinfo", "model name", s->cpu, sizeof s->cpu) != 0)
        snprintf(s->cpu, sizeof s->cpu, "unknown");
    s->cores = sysconf(_SC_NPROCESSORS_ONLN);
    glob_t g;
    if (glob("/proc/driver/nvidia/gpus/*/information", 0, NULL, &g) == 0) {
        if (g.gl_pathc > 0) read_key(g.gl_pathv[0], "Model", s->gpu, sizeof s->gpu);
        globfree(&g);
    }
    s->command = quote_command(argc, argv);
    return s->command ? 0 : -1;
}

void rt_stamp_free(rt_stamp *s) {
    free(s->command);
    s->command = NULL;
}

void rt_stamp_write(FILE *f, const rt_stamp *s, double wall_s, const rt_result *results,
                    size_t num_results) {
    fputs("{\"version\": ", f);
    rt_json_str(f, s->version);
    fputs(", \"commit\": ", f);
    rt_json_str(f, s->commit);
    fputs(", \"command\": ", f);
    rt_json_str(f, s->command ? s->command : "");
    fputs(", \"date\": ", f);
    rt_json_str(f, s->date);
    fputs(", \"host\": {\"cpu\": ", f);
    rt_json_str(f, s->cpu);
    fprintf(f, ", \"cores\": %ld, \"gpu\": ", s->cores);
    if (s->gpu[0])
        rt_json_str(f, s->gpu);
    else
        fputs("null", f);
    fputs("}, \"shard\": ", f);
    if (s->shard[0])
        rt_json_str(f, s->shard);
    else
        fputs("null", f);
    fputs(", \"wall_seconds\": ", f);
    rt_json_num(f, wall_s);
    fputs(", \"run_seconds\": {", f);
    int first = 1;
    for (size_t i = 0; i < num_results; i++) {
        if (!results[i].ran) continue;
        fprintf(f, "%s\"%u\": ", first ? "" : ", ", results[i].point.index);
        rt_json_num(f, results[i].seconds);
        first = 0;
    }
    fputs("}}", f);
}

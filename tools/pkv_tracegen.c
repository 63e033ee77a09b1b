// SPDX-License-Identifier: MIT
// pkv-tracegen: write a synthetic request trace in the native CSV format from
// documented distributions (traces/README.md). Exit codes: 0 ok, 1 I/O failure,
// 2 bad usage.
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "out_file.h"
#include "pkv/trace.h"
#include "cli.h"

static void usage(FILE *f) {
    fputs("usage: pkv-tracegen [options]\n"
          "Write a synthetic trace (native CSV) to --out (default stdout).\n"
          "  --out FILE            output file ('-' = stdout)\n"
          "  --requests N          number of requests (default 1000)\n"
          "  --seed N              random seed (default 1)\n"
          "  --arrival A           poisson (default) or bursty (gamma gaps)\n"
          "  --rate R              mean requests per second (default 2)\n"
          "  --burst-cv C          bursty: coefficient of variation of the gaps, > 1 (default 3)\n"
          "  --profile P           conversation (default) or code: length distributions\n"
          "                        from the Azure LLM inference trace 2023 (Splitwise)\n"
          "  --prompt-median X, --prompt-sigma S, --prompt-max N\n"
          "  --output-median X, --output-sigma S, --output-max N\n"
          "                        log-normal lengths: median, sigma of ln, clamp\n"
          "  --parallel-frac F     fraction of requests with n > 1 (default 0)\n"
          "  --n-min N, --n-max N  n is uniform in [n-min, n-max] for those (default 2..8)\n"
          "  --prefix-frac F       fraction of requests in a prefix group (default 0)\n"
          "  --prefix-groups N     number of groups (default 4)\n"
          "  --prefix-tokens N     shared prefix length, added to the prompt (default 512)\n"
          "  --help                this text\n",
          f);
}

#define BAD(...)                                                                                   \
    do {                                                                                           \
        fprintf(stderr, "pkv-tracegen: " __VA_ARGS__);                                             \
        fputc('\n', stderr);                                                                       \
        return 2;                                                                                  \
    } while (0)

// A finite decimal number filling the whole argument.
static int num(const char *s, double *v) {
    char *end;
    *v = strtod(s, &end);
    return (!*s || *end || !isfinite(*v)) ? -1 : 0;
}

int main(int argc, char **argv) {
    pkv_tracegen_params p = pkv_tracegen_params_default();
    p.n_min = 2;
    p.n_max = 8;
    p.prefix_groups = 4;
    p.prefix_tokens = 512;
    const char *out = "-";
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        double x = 0;
        if (!strcmp(a, "--help") || !strcmp(a, "-h")) {
            usage(stdout);
            return 0;
        }
        if (!v) BAD("unknown option or missing value: '%s' (see --help)", a);
        i++;
        if (!strcmp(a, "--out")) {
            out = v;
            continue;
        }
        if (!strcmp(a, "--arrival")) {
            if (!strcmp(v, "poisson")) p.arrival = PKV_ARRIVAL_POISSON;
            else if (!strcmp(v, "bursty")) p.arrival = PKV_ARRIVAL_BURSTY;
            else BAD("--arrival must be poisson or bursty, got '%s'", v);
            continue;
        }
        if (!strcmp(a, "--profile")) {
            // Medians from Splitwise (Patel et al., ISCA 2024) for the Azure 2023
            // traces; sigmas and caps measured on the public trace files.
            if (!strcmp(v, "conversation")) {
                p.prompt_median = 1020, p.prompt_sigma = 0.99, p.prompt_max = 16384;
                p.output_median = 129, p.output_sigma = 0.86, p.output_max = 1000;
            } else if (!strcmp(v, "code")) {
                p.prompt_median = 1500, p.prompt_sigma = 1.36, p.prompt_max = 8192;
                p.output_median = 13, p.output_sigma = 0.85, p.output_max = 2048;
            } else {
                BAD("--profile must be conversation or code, got '%s'", v);
            }
            continue;
        }
        // Integer options: whole unsigned numbers in range (a cast of 1e30 to an
        // integer type is undefined behaviour, not a clamp).
        static const struct {
            const char *name;
            uint64_t min, max;
        } ints[] = {
            {"--requests", 1, (uint64_t)1 << 32}, {"--seed", 0, UINT64_MAX},
            {"--prompt-max", 1, UINT32_MAX},      {"--output-max", 1, UINT32_MAX},
            {"--n-min", 1, UINT32_MAX},           {"--n-max", 1, UINT32_MAX},
            {"--prefix-groups", 1, UINT32_MAX},   {"--prefix-tokens", 0, UINT32_MAX},
        };
        int is_int = 0;
        uint64_t u = 0;
        for (size_t k = 0; k < sizeof ints / sizeof ints[0]; k++) {
            if (strcmp(a, ints[k].name)) continue;
            is_int = 1;
            if (!cli_parse_u64(v, &u) || u < ints[k].min || u > ints[k].max)
                BAD("%s needs an integer in %llu .. %llu, got '%s'", a,
                    (unsigned long long)ints[k].min, (unsigned long long)ints[k].max, v);
        }
        if (is_int) {
            if (!strcmp(a, "--requests")) p.num_requests = u;
            else if (!strcmp(a, "--seed")) p.seed = u;
            else if (!strcmp(a, "--prompt-max")) p.prompt_max = (uint32_t)u;
            else if (!strcmp(a, "--output-max")) p.output_max = (uint32_t)u;
            else if (!strcmp(a, "--n-min")) p.n_min = (uint32_t)u;
            else if (!strcmp(a, "--n-max")) p.n_max = (uint32_t)u;
            else if (!strcmp(a, "--prefix-groups")) p.prefix_groups = (uint32_t)u;
            else p.prefix_tokens = (uint32_t)u;
            continue;
        }
        if (num(v, &x) != 0) {
            if (!strcmp(a, "--rate") || !strcmp(a, "--burst-cv") || !strcmp(a, "--prompt-median") ||
                !strcmp(a, "--prompt-sigma") || !strcmp(a, "--output-median") ||
                !strcmp(a, "--output-sigma") || !strcmp(a, "--parallel-frac") ||
                !strcmp(a, "--prefix-frac"))
                BAD("%s needs a finite number, got '%s'", a, v);
            BAD("unknown option '%s' (see --help)", a);
        }
        if (!strcmp(a, "--rate")) p.rate_rps = x;
        else if (!strcmp(a, "--burst-cv")) p.burst_cv = x;
        else if (!strcmp(a, "--prompt-median")) p.prompt_median = x;
        else if (!strcmp(a, "--prompt-sigma")) p.prompt_sigma = x;
        else if (!strcmp(a, "--output-median")) p.output_median = x;
        else if (!strcmp(a, "--output-sigma")) p.output_sigma = x;
        else if (!strcmp(a, "--parallel-frac")) p.parallel_frac = x;
        else if (!strcmp(a, "--prefix-frac")) p.prefix_frac = x;
        else BAD("unknown option '%s' (see --help)", a);
    }
    if (p.parallel_frac == 0) p.n_min = p.n_max = 1;
    // The trace is built in memory before it is written: refuse one that cannot
    // fit rather than let the system swap or kill the process (2^32 requests
    // need ~160 GiB).
    const long pages = sysconf(_SC_PHYS_PAGES), page = sysconf(_SC_PAGESIZE);
    const double need = (double)p.num_requests * sizeof(pkv_trace_request);
    if (pages > 0 && page > 0 && need > 0.5 * (double)pages * (double)page)
        BAD("--requests %llu needs %.1f GiB of memory, more than half of this machine's %.1f GiB",
            (unsigned long long)p.num_requests, need / (1u << 30),
            (double)pages * (double)page / (1u << 30));
    pkv_trace *t = NULL;
    pkv_status st = pkv_trace_generate(&p, &t);
    if (st == PKV_ERR_INVALID_ARG)
        BAD("invalid parameters: need requests >= 1, rate > 0, medians >= 1, sigmas >= 0, "
            "fractions in [0, 1], 1 <= n-min <= n-max, burst-cv > 1 for bursty, and finite "
            "arrivals (a rate or burst-cv this extreme overflows them)");
    if (st != PKV_OK) {
        fprintf(stderr, "pkv-tracegen: %s\n", pkv_status_str(st));
        return 1;
    }
    // Whole or not at all, a failure named with its reason (out_file.h).
    out_file o;
    if (out_open(&o, "pkv-tracegen", out) != 0) {
        pkv_trace_destroy(t);
        return 1;
    }
    (void)pkv_trace_write_csv(t, o.f); // a write error shows at the close
    pkv_trace_destroy(t);
    return out_close(&o) != 0 ? 1 : 0;
}

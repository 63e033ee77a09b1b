// SPDX-License-Identifier: MIT
// Synthetic trace generation from documented distributions (traces/README.md):
// Poisson or bursty (gamma) arrivals, log-normal prompt and output lengths,
// optional parallel sampling and shared-prefix groups. Deterministic: the same
// params (seed included) give the same trace on every platform with IEEE doubles.
#include <math.h>
#include <stdlib.h>

#include "trace_internal.h"

#ifndef M_PI
#define M_PI 3.14159265358979323846
#endif

pkv_tracegen_params pkv_tracegen_params_default(void) {
    // Lengths: the conversation profile. Medians are the ones Splitwise (Patel et
    // al., ISCA 2024) reports for its Azure conversation trace; sigmas are the
    // standard deviation of ln(length) measured on that public trace file.
    pkv_tracegen_params p = {
        .seed = 1,
        .num_requests = 1000,
        .arrival = PKV_ARRIVAL_POISSON,
        .rate_rps = 2.0,
        .burst_cv = 3.0,
        .prompt_median = 1020,
        .prompt_sigma = 0.99,
        .prompt_max = 16384,
        .output_median = 129,
        .output_sigma = 0.86,
        .output_max = 1000,
        .parallel_frac = 0,
        .n_min = 1,
        .n_max = 1,
        .prefix_frac = 0,
        .prefix_groups = 1,
        .prefix_tokens = 0,
    };
    return p;
}

// splitmix64: small, fast, and good enough for workload sampling.
PKVI_WRAPS static uint64_t next_u64(uint64_t *s) {
    uint64_t z = (*s += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

// Uniform in (0, 1): never 0, so logs are finite.
static double uniform(uint64_t *s) { return ((double)(next_u64(s) >> 11) + 0.5) * 0x1.0p-53; }

static double normal(uint64_t *s) {
    double u1 = uniform(s), u2 = uniform(s);
    return sqrt(-2.0 * log(u1)) * cos(2.0 * M_PI * u2);
}

// Gamma(shape k, scale 1) by Marsaglia and Tsang; k < 1 through the k + 1 boost.
static double gamma_unit(uint64_t *s, double k) {
    if (k < 1.0) return gamma_unit(s, k + 1.0) * pow(uniform(s), 1.0 / k);
    const double d = k - 1.0 / 3.0, c = 1.0 / sqrt(9.0 * d);
    for (;;) {
        double x = normal(s), v = 1.0 + c * x;
        if (v <= 0) continue;
        v = v * v * v;
        double u = uniform(s);
        if (log(u) < 0.5 * x * x + d - d * v + d * log(v)) return d * v;
    }
}

static uint32_t lognormal_len(uint64_t *s, double median, double sigma, uint32_t max) {
    double x = median * exp(sigma * normal(s));
    if (!(x >= 1.0)) return 1;
    if (x >= (double)max) return max;
    return (uint32_t)llround(x) < 1 ? 1 : (uint32_t)llround(x);
}

pkv_status pkv_trace_generate(const pkv_tracegen_params *p, pkv_trace **out) {
    // Every double must be finite (inf and NaN pass comparisons like "> 0" or
    // fail them silently), and the mean gap 1 / rate too: rate_rps 1e-320 is > 0.
    if (!p || !isfinite(p->rate_rps) || !isfinite(1.0 / p->rate_rps) || !isfinite(p->burst_cv) ||
        !isfinite(p->prompt_median) || !isfinite(p->prompt_sigma) ||
        !isfinite(p->output_median) || !isfinite(p->output_sigma))
        return PKV_ERR_INVALID_ARG;
    if (!out || p->num_requests == 0 || !(p->rate_rps > 0) || !(p->prompt_median >= 1) ||
        !(p->output_median >= 1) || !(p->prompt_sigma >= 0) || !(p->output_sigma >= 0) ||
        p->prompt_max == 0 || p->output_max == 0 || !(p->parallel_frac >= 0 && p->parallel_frac <= 1) ||
        p->n_min == 0 || p->n_min > p->n_max || !(p->prefix_frac >= 0 && p->prefix_frac <= 1) ||
        (p->prefix_frac > 0 && p->prefix_groups == 0) ||
        (p->arrival == PKV_ARRIVAL_BURSTY && !(p->burst_cv > 1)) ||
        (p->arrival != PKV_ARRIVAL_POISSON && p->arrival != PKV_ARRIVAL_BURSTY) ||
        p->num_requests > ((uint64_t)1 << 32))
        return PKV_ERR_INVALID_ARG;
    pkvi_reqvec v = {0};
    v.reqs = malloc((size_t)p->num_requests * sizeof *v.reqs);
    if (!v.reqs) return PKV_ERR_OUT_OF_MEMORY;
    v.cap = (size_t)p->num_requests;
    uint64_t s = p->seed;
    // Gamma gaps with shape 1/cv^2 and mean 1/rate have the requested CV; the
    // Poisson case is shape 1 (exponential gaps).
    const double shape = p->arrival == PKV_ARRIVAL_BURSTY ? 1.0 / (p->burst_cv * p->burst_cv) : 1.0;
    const double scale = 1.0 / (p->rate_rps * shape);
    double t = 0;
    for (uint64_t i = 0; i < p->num_requests; i++) {
        pkv_trace_request r = {0};
        if (i > 0) t += p->arrival == PKV_ARRIVAL_POISSON ? -log(uniform(&s)) / p->rate_rps
                                                           : gamma_unit(&s, shape) * scale;
        r.arrival_s = t;
        r.prompt_tokens = lognormal_len(&s, p->prompt_median, p->prompt_sigma, p->prompt_max);
        r.output_tokens = lognormal_len(&s, p->output_median, p->output_sigma, p->output_max);
        r.n = 1;
        if (p->parallel_frac > 0 && uniform(&s) < p->parallel_frac)
            r.n = p->n_min + (uint32_t)(next_u64(&s) % (p->n_max - p->n_min + 1));
        r.prefix_group = -1;
        if (p->prefix_frac > 0 && p->prefix_tokens > 0 && uniform(&s) < p->prefix_frac) {
            r.prefix_group = (int64_t)(next_u64(&s) % p->prefix_groups);
            r.prefix_tokens = p->prefix_tokens;
            // The shared prefix is part of the prompt: keep the sampled length as the
            // request's own part after it.
            uint64_t total = (uint64_t)r.prompt_tokens + p->prefix_tokens;
            r.prompt_tokens = total > UINT32_MAX ? UINT32_MAX : (uint32_t)total;
        }
        r.request_id = i;
        // The generator must not hand out what the loader would refuse: a huge
        // burst_cv (gamma shape 1/cv^2 underflows) or a tiny rate can still
        // sum gaps to inf or NaN, and a replay of such a trace never ends.
        const char *field;
        char msg[128];
        if (pkvi_trace_check_request(&r, i ? v.reqs[v.count - 1].arrival_s : 0, &field, msg,
                                     sizeof msg) != PKV_OK) {
            free(v.reqs);
            return PKV_ERR_INVALID_ARG;
        }
        v.reqs[v.count++] = r;
    }
    pkv_status st = pkvi_trace_finish(&v, PKV_TRACE_NATIVE, 0, out);
    free(v.reqs);
    return st;
}

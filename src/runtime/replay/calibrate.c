// SPDX-License-Identifier: MIT
// Sim mode calibrated by run mode: fit the roofline's achieved bandwidth,
// achieved compute and a per-step overhead to the steps a run-mode replay
// measured on this machine (each step's modelled work comes with it), and the
// per-call cost of backend allocations from the run's measured calls; write
// and read the result as a flat JSON object; apply it to replay params.
//
// The fit minimizes the duration-weighted relative error of
//   t(step) = max(flops / C, bytes / B) + overhead
// over the steps (at most 4096 of them, evenly spaced): a log-spaced grid over
// (B, C), refined five times around the best point; for each (B, C) the overhead is the median of the residuals (clamped
// at 0), which is the value that minimizes the median absolute residual.
#include <ctype.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "replay_internal.h"

// The k-th smallest of v[0..n-1] (v is reordered): quickselect, O(n).
static double select_kth(double *v, size_t n, size_t k) {
    size_t lo = 0, hi = n - 1;
    while (lo < hi) {
        const double pivot = v[lo + (hi - lo) / 2];
        size_t i = lo, j = hi;
        while (i <= j) {
            while (v[i] < pivot) i++;
            while (v[j] > pivot) j--;
            if (i <= j) {
                const double t = v[i];
                v[i] = v[j];
                v[j] = t;
                i++;
                if (j == 0) break;
                j--;
            }
        }
        if (k <= j) hi = j;
        else if (k >= i) lo = i;
        else return v[k];
    }
    return v[k];
}

// The lower median (n >= 1).
static double median(double *v, size_t n) { return select_kth(v, n, (n - 1) / 2); }

typedef struct sample {
    double t, flops, bytes;
} sample;

// Duration-weighted relative error of (B, C): sum |pred - t| / sum t, i.e. the
// error of the total time, which decides makespan and throughput (a plain mean
// over steps would let thousands of short decode steps outvote the few long
// prefills). The overhead is the median residual (at least 0), the value that
// minimizes sum |residual - overhead|. *ovh: the overhead; *med: the median
// relative error per step.
static double score(const sample *s, size_t n, double B, double C, double *tmp, double *ovh,
                    double *med) {
    for (size_t i = 0; i < n; i++) tmp[i] = s[i].t - fmax(s[i].flops / C, s[i].bytes / B);
    double o = median(tmp, n);
    if (o < 0) o = 0;
    double err = 0, tot = 0;
    for (size_t i = 0; i < n; i++) {
        const double d = fabs(fmax(s[i].flops / C, s[i].bytes / B) + o - s[i].t);
        err += d;
        tot += s[i].t;
        tmp[i] = d / s[i].t;
    }
    *ovh = o;
    if (med) *med = median(tmp, n);
    return err / tot;
}

pkv_status pkv_replay_calibrate(const pkv_replay_step *steps, size_t n, double alloc_s,
                                uint64_t alloc_calls, double free_s, uint64_t free_calls,
                                pkv_replay_calibration *out) {
    if (!steps || !out || !(alloc_s >= 0) || !(free_s >= 0)) return PKV_ERR_INVALID_ARG;
    sample *s = malloc((n ? n : 1) * sizeof *s);
    double *tmp = malloc((n ? n : 1) * sizeof *tmp);
    if (!s || !tmp) {
        free(s);
        free(tmp);
        return PKV_ERR_OUT_OF_MEMORY;
    }
    size_t k = 0;
    double tmax = 0, fmax_ = 0, bmax = 0;
    // At most 4096 steps, evenly spaced: the fit's cost stays bounded.
    const size_t stride = n > 4096 ? (n + 4095) / 4096 : 1;
    for (size_t i = 0; i < n; i += stride) {
        const double t = steps[i].step_s - steps[i].alloc_s; // the executor's part
        if (!(t > 0) || !(steps[i].work_bytes > 0) || !isfinite(t)) continue;
        s[k++] = (sample){t, steps[i].work_flops, steps[i].work_bytes};
        tmax = fmax(tmax, t);
        fmax_ = fmax(fmax_, steps[i].work_flops);
        bmax = fmax(bmax, steps[i].work_bytes);
    }
    if (k < 8) {
        free(s);
        free(tmp);
        return PKV_ERR_INVALID_ARG;
    }
    // Rates from "the largest step's work in 1 us" down to "in 1000 x the
    // longest step": a range no plausible machine leaves.
    double lb_lo = log(bmax / (1000 * tmax)), lb_hi = log(bmax / 1e-6);
    double lc_lo = log(fmax(fmax_, 1) / (1000 * tmax)), lc_hi = log(fmax(fmax_, 1) / 1e-6);
    double best = INFINITY, bB = 0, bC = 0, bO = 0;
    enum { G = 32 };
    for (int round = 0; round < 6; round++) {
        double nb = bB, nc = bC;
        for (int i = 0; i < G; i++)
            for (int j = 0; j < G; j++) {
                const double B = exp(lb_lo + (lb_hi - lb_lo) * i / (G - 1));
                const double C = exp(lc_lo + (lc_hi - lc_lo) * j / (G - 1));
                double o;
                const double e = score(s, k, B, C, tmp, &o, NULL);
                if (e < best) {
                    best = e;
                    nb = B;
                    nc = C;
                    bO = o;
                }
            }
        bB = nb;
        bC = nc;
        // Zoom in: +-2 grid cells around the best point.
        const double wb = 2 * (lb_hi - lb_lo) / (G - 1), wc = 2 * (lc_hi - lc_lo) / (G - 1);
        lb_lo = log(bB) - wb;
        lb_hi = log(bB) + wb;
        lc_lo = log(bC) - wc;
        lc_hi = log(bC) + wc;
    }
    double med = 0;
    (void)score(s, k, bB, bC, tmp, &bO, &med);
    free(s);
    free(tmp);
    memset(out, 0, sizeof *out);
    out->achieved_bw = bB;
    out->achieved_flops = bC;
    out->step_overhead_s = bO;
    out->steps = k;
    out->median_rel_err = med;
    const double a = alloc_calls ? alloc_s / (double)alloc_calls : 0;
    const double f = free_calls ? free_s / (double)free_calls : (free_s > 0 ? 0 : a);
    snprintf(out->alloc.name, sizeof out->alloc.name, "calibrated: %.3g us/alloc, %.3g us/free",
             a * 1e6, f * 1e6);
    out->alloc.alloc = (pkv_alloc_call_cost){.base_s = a, .per_byte_s = 0, .sync = 1};
    out->alloc.free = (pkv_alloc_call_cost){.base_s = f, .per_byte_s = 0, .sync = 1};
    return PKV_OK;
}

pkv_status pkv_replay_calibration_write(FILE *f, const pkv_replay_calibration *c) {
    if (!f || !c) return PKV_ERR_INVALID_ARG;
    fprintf(f,
            "{\"model\": \"%s\", \"device\": \"%s\", \"dtype_bytes\": %u,\n"
            " \"achieved_bw_bytes_per_s\": %.9g, \"achieved_flops_per_s\": %.9g, "
            "\"step_overhead_us\": %.9g,\n"
            " \"alloc_call_us\": %.9g, \"free_call_us\": %.9g, \"steps\": %llu, "
            "\"median_rel_err\": %.9g}\n",
            c->model, c->device, c->dtype_bytes, c->achieved_bw, c->achieved_flops,
            c->step_overhead_s * 1e6, c->alloc.alloc.base_s * 1e6, c->alloc.free.base_s * 1e6,
            (unsigned long long)c->steps, c->median_rel_err);
    return ferror(f) ? PKV_ERR_IO : PKV_OK;
}

// ---- reading: a flat object of string and number values ----

static const char *field_names[] = {"model", "device", "dtype_bytes", "achieved_bw_bytes_per_s",
                                    "achieved_flops_per_s", "step_overhead_us", "alloc_call_us",
                                    "free_call_us", "steps", "median_rel_err"};
enum { NFIELDS = sizeof field_names / sizeof field_names[0] };

static pkv_status bad(char *err, size_t len, const char *path, const char *text, const char *at,
                      const char *field, const char *problem) {
    int line = 1;
    for (const char *c = text; c < at; c++) line += *c == '\n';
    if (err && len) snprintf(err, len, "%s:%d: %s: %s", path, line, field, problem);
    return PKV_ERR_FORMAT;
}

pkv_status pkv_replay_calibration_load(const char *path, pkv_replay_calibration *c, char *err,
                                       size_t err_len) {
    if (!path || !c) return PKV_ERR_INVALID_ARG;
    if (err && err_len) err[0] = '\0';
    FILE *f = fopen(path, "r");
    if (!f) {
        if (err && err_len) snprintf(err, err_len, "%s: cannot open", path);
        return PKV_ERR_IO;
    }
    char text[8192];
    const size_t len = fread(text, 1, sizeof text - 1, f);
    const int too_long = !feof(f);
    fclose(f);
    text[len] = '\0';
    if (too_long) return bad(err, err_len, path, text, text + len, "(file)", "longer than 8 KiB");
    double num[NFIELDS] = {0};
    char str[NFIELDS][32] = {{0}};
    int seen[NFIELDS] = {0};
    const char *p = text;
    while (isspace((unsigned char)*p)) p++;
    if (*p++ != '{') return bad(err, err_len, path, text, p, "(file)", "not a JSON object");
    for (;;) {
        while (isspace((unsigned char)*p) || *p == ',') p++;
        if (*p == '}') break;
        if (*p != '"') return bad(err, err_len, path, text, p, "(file)", "expected a key");
        const char *k = ++p;
        while (*p && *p != '"') p++;
        if (!*p) return bad(err, err_len, path, text, p, "(file)", "unterminated key");
        const size_t kl = (size_t)(p - k);
        p++;
        while (isspace((unsigned char)*p)) p++;
        if (*p++ != ':') return bad(err, err_len, path, text, p, "(file)", "expected ':'");
        while (isspace((unsigned char)*p)) p++;
        int idx = -1;
        for (int i = 0; i < NFIELDS; i++)
            if (strlen(field_names[i]) == kl && !strncmp(field_names[i], k, kl)) idx = i;
        char name[48];
        snprintf(name, sizeof name, "%.*s", (int)(kl < 40 ? kl : 40), k);
        if (idx < 0) return bad(err, err_len, path, text, k, name, "unknown key");
        if (*p == '"') {
            const char *v = ++p;
            while (*p && *p != '"') p++;
            if (!*p || (size_t)(p - v) >= sizeof str[0] || idx > 1)
                return bad(err, err_len, path, text, v, name, "bad string");
            memcpy(str[idx], v, (size_t)(p - v));
            p++;
        } else {
            char *end;
            num[idx] = strtod(p, &end);
            if (end == p || idx <= 1 || !isfinite(num[idx]) || num[idx] < 0)
                return bad(err, err_len, path, text, p, name, "expected a non-negative number");
            p = end;
        }
        seen[idx] = 1;
    }
    for (int i = 0; i < NFIELDS; i++)
        if (!seen[i]) return bad(err, err_len, path, text, p, field_names[i], "missing");
    if (!(num[3] > 0) || !(num[4] > 0))
        return bad(err, err_len, path, text, p, "achieved_*", "rates must be > 0");
    if (num[2] != 1 && num[2] != 2 && num[2] != 4)
        return bad(err, err_len, path, text, p, "dtype_bytes", "must be 1, 2 or 4");
    memset(c, 0, sizeof *c);
    memcpy(c->model, str[0], sizeof c->model);
    memcpy(c->device, str[1], sizeof c->device - 1);
    c->dtype_bytes = (uint32_t)num[2];
    c->achieved_bw = num[3];
    c->achieved_flops = num[4];
    c->step_overhead_s = num[5] * 1e-6;
    c->alloc.alloc = (pkv_alloc_call_cost){.base_s = num[6] * 1e-6, .per_byte_s = 0, .sync = 1};
    c->alloc.free = (pkv_alloc_call_cost){.base_s = num[7] * 1e-6, .per_byte_s = 0, .sync = 1};
    snprintf(c->alloc.name, sizeof c->alloc.name, "calibrated: %.3g us/alloc, %.3g us/free", num[6],
             num[7]);
    c->steps = (uint64_t)num[8];
    c->median_rel_err = num[9];
    return PKV_OK;
}

pkv_status pkv_replay_params_apply_calibration(pkv_replay_params *p, const pkv_replay_calibration *c,
                                               const char *source) {
    if (!p || !c || !(c->achieved_bw > 0) || !(c->achieved_flops > 0)) return PKV_ERR_INVALID_ARG;
    pkv_model_config m;
    if (pkv_model_preset(c->model, &m) != PKV_OK) return PKV_ERR_NOT_FOUND;
    p->model = m;
    p->dtype_bytes = c->dtype_bytes;
    snprintf(p->gpu.name, sizeof p->gpu.name, "calibrated-%s", c->device);
    p->gpu.mem_bw = c->achieved_bw;
    p->gpu.peak_flops = c->achieved_flops;
    if (!(p->gpu.host_link_bw > 0)) p->gpu.host_link_bw = c->achieved_bw;
    p->sim_eff.bw_frac = 1;
    p->sim_eff.compute_frac = 1;
    p->sim_eff.step_overhead_s = c->step_overhead_s;
    snprintf(p->sim_eff.source, sizeof p->sim_eff.source, "%s", source ? source : "calibration");
    p->alloc_model = c->alloc;
    return PKV_OK;
}

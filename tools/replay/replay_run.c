// SPDX-License-Identifier: MIT
// Runs the points of a sweep (or the SLO searches, one per point without its
// load scale) on worker threads. pkv_replay_run is reentrant and the trace is
// read-only, so workers share nothing but a counter of the next point to take;
// each result lands in its own slot, so the output order is the point order
// whatever the number of threads. The main thread draws the progress line.
#include <errno.h>
#include <math.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "pkv/model.h"
#include "replay_tools.h"

typedef struct shared {
    const rt_job *job;
    rt_progress *prog;
    _Atomic size_t next;     // next result to take
    _Atomic unsigned active; // workers still running
    pthread_mutex_t lock;    // guards status
    pkv_status status;       // first failure (the other points still run)
} shared;

typedef struct worker {
    shared *sh;
    unsigned id;
    rt_timeline *timeline;   // of the run in progress, NULL if none is kept
    rt_result *requests;     // where completed requests go, NULL if not kept
    pkv_model *model;        // run mode: this worker's decoder, built once for its points
} worker;

static int on_progress(void *user, const pkv_replay_progress *pg) {
    worker *w = user;
    rt_progress_update(w->sh->prog, w->id, pg->requests_done, pg->time_s);
    return rt_stop_requested;
}

static void on_step(void *user, const pkv_replay_step *s) {
    worker *w = user;
    if (w->timeline) rt_timeline_add(w->timeline, s);
}

static void on_request(void *user, const pkv_replay_request_done *d) {
    rt_result *r = ((worker *)user)->requests;
    if (r->num_requests == r->cap_requests) {
        size_t c = r->cap_requests ? 2 * r->cap_requests : 1024;
        pkv_replay_request_done *v = realloc(r->requests, c * sizeof *v);
        if (!v) return; // out of memory: the CDF loses rows, the run goes on
        r->requests = v;
        r->cap_requests = c;
    }
    r->requests[r->num_requests++] = *d;
}

// One replay of `pt` at load scale `scale` into *rep.
static pkv_status run_one(worker *w, const rt_point *pt, double scale, rt_timeline *tl,
                          rt_result *keep, pkv_replay_report *rep) {
    const rt_job *job = w->sh->job;
    pkv_replay_params prm = *job->base;
    prm.policy = pt->policy;
    prm.custom_policy = pt->custom;
    if (pt->policy == PKV_POLICY_PAGED) prm.block_size = pt->block_size;
    if (pt->kv_mem_bytes) prm.kv_mem_bytes = pt->kv_mem_bytes;
    prm.on_progress = on_progress;
    prm.on_step = tl ? on_step : NULL;
    prm.on_request = keep ? on_request : NULL;
    prm.user = w;
    // The replay divides arrival times itself, so the shared trace keeps all it
    // was loaded with (Mooncake hash ids included) and is never copied.
    prm.load_scale = scale;
    // Run mode: every point runs the same model; build its weights once per
    // worker (a model is used by one thread at a time).
    if (prm.mode == PKV_REPLAY_RUN && !w->model) {
        pkv_model_params mp = pkv_model_params_default();
        mp.device = prm.run_cuda ? PKV_DEVICE_CUDA : PKV_DEVICE_CPU;
        mp.seed = prm.seed;
        mp.num_threads = prm.run_threads;
        pkv_status st = pkv_model_create(&prm.model, &mp, &w->model);
        if (st != PKV_OK) return st;
    }
    if (prm.mode == PKV_REPLAY_RUN) prm.run_model = w->model;
    w->timeline = tl;
    w->requests = keep;
    pkv_status st = pkv_replay_run(job->trace, &prm, rep);
    w->timeline = NULL;
    w->requests = NULL;
    rt_progress_finish_run(w->sh->prog, w->id,
                           st == PKV_OK ? rep->requests.completed + rep->requests.rejected : 0);
    return st;
}

// A probe failed: keep its report for the message (report.failure names a
// policy that broke its contract).
static pkv_status failed(rt_result *r, const pkv_replay_report *rep, pkv_status st) {
    r->report = *rep;
    return st;
}

// Throughput at the SLO for r->point's (policy, block size, budget): geometric
// bisection of the load scale in [lo, hi] (latency grows with load), keeping
// the highest scale that met the SLO.
static pkv_status search(worker *w, rt_result *r) {
    const rt_job *job = w->sh->job;
    double lo = job->slo_lo, hi = job->slo_hi;
    pkv_replay_report rep;
    pkv_status st = run_one(w, &r->point, hi, NULL, NULL, &rep);
    r->slo_probes = 1;
    if (st != PKV_OK) return failed(r, &rep, st);
    if (rep.partial || rt_slo_met(job->slo, &rep)) {
        r->report = rep;
        r->point.load_scale = hi;
        r->slo_met = !rep.partial;
        r->slo_bounded = 0; // the SLO holds at the top of the range
        return PKV_OK;
    }
    st = run_one(w, &r->point, lo, NULL, NULL, &rep);
    r->slo_probes++;
    if (st != PKV_OK) return failed(r, &rep, st);
    r->report = rep;
    r->point.load_scale = lo;
    r->slo_bounded = 1;
    if (rep.partial || !rt_slo_met(job->slo, &rep)) {
        r->slo_met = 0; // not even the bottom of the range meets it
        return PKV_OK;
    }
    r->slo_met = 1;
    while (hi / lo > 1 + job->slo_tol) {
        const double mid = sqrt(lo * hi);
        st = run_one(w, &r->point, mid, NULL, NULL, &rep);
        r->slo_probes++;
        if (st != PKV_OK) return failed(r, &rep, st);
        if (rep.partial) { // stopped: report the best so far, marked partial
            r->report.partial = 1;
            break;
        }
        if (rt_slo_met(job->slo, &rep)) {
            lo = mid;
            r->report = rep;
            r->point.load_scale = mid;
        } else {
            hi = mid;
        }
    }
    return PKV_OK;
}

static void *work(void *arg) {
    worker *w = arg;
    shared *sh = w->sh;
    const rt_job *job = sh->job;
    for (;;) {
        if (rt_stop_requested) break;
        const size_t i = atomic_fetch_add(&sh->next, 1);
        if (i >= job->num) break;
        rt_result *r = &job->results[i];
        struct timespec t0, t1;
        clock_gettime(CLOCK_MONOTONIC, &t0);
        pkv_status st;
        if (job->slo) {
            st = search(w, r);
        } else {
            r->timeline.limit = job->timeline_limit;
            st = run_one(w, &r->point, r->point.load_scale,
                         job->timeline_limit != SIZE_MAX ? &r->timeline : NULL,
                         job->keep_requests ? r : NULL, &r->report);
        }
        if (st != PKV_OK) {
            // A point that fails (e.g. a policy that rejects the parameters) is
            // named and left out; the sweep goes on, as --policy all always has.
            r->status = st;
            pthread_mutex_lock(&sh->lock);
            if (sh->status == PKV_OK) sh->status = st;
            pthread_mutex_unlock(&sh->lock);
            continue;
        }
        clock_gettime(CLOCK_MONOTONIC, &t1);
        r->seconds = (double)(t1.tv_sec - t0.tv_sec) + 1e-9 * (double)(t1.tv_nsec - t0.tv_nsec);
        r->request_rate = rt_request_rate(job->trace, r->point.load_scale);
        r->ran = 1;
    }
    pkv_model_destroy(w->model);
    w->model = NULL;
    atomic_fetch_sub(&sh->active, 1);
    return NULL;
}

pkv_status rt_run(const rt_job *job) {
    unsigned nw = job->jobs ? job->jobs : 1;
    if (nw > job->num) nw = job->num ? (unsigned)job->num : 1;
    uint64_t per = pkv_trace_count(job->trace);
    if (job->slo) // probes per search, roughly: both ends, then the bisection
        per *= 2 + (uint64_t)ceil(log2(log(job->slo_hi / job->slo_lo) / log1p(job->slo_tol) + 1));
    shared sh;
    memset(&sh, 0, sizeof sh);
    sh.job = job;
    sh.status = PKV_OK;
    pthread_mutex_init(&sh.lock, NULL);
    sh.prog = rt_progress_create(nw, per * job->num, job->progress);
    worker *ws = calloc(nw, sizeof *ws);
    pthread_t *th = calloc(nw, sizeof *th);
    if (!sh.prog || !ws || !th) {
        rt_progress_destroy(sh.prog);
        free(ws);
        free(th);
        pthread_mutex_destroy(&sh.lock);
        return PKV_ERR_OUT_OF_MEMORY;
    }
    unsigned started = 0;
    atomic_store(&sh.active, nw);
    for (unsigned i = 0; i < nw; i++) {
        ws[i] = (worker){&sh, i, NULL, NULL, NULL};
        if (pthread_create(&th[i], NULL, work, &ws[i]) != 0) break;
        started++;
    }
    atomic_fetch_sub(&sh.active, nw - started);
    if (started == 0) { // no threads at all: work here
        atomic_store(&sh.active, 1);
        ws[0] = (worker){&sh, 0, NULL, NULL, NULL};
        work(&ws[0]);
    }
    // Redraw four times a second until every worker is done.
    while (atomic_load(&sh.active) > 0) {
        rt_progress_draw(sh.prog, 0);
        struct timespec ts = {0, 250 * 1000 * 1000};
        for (int k = 0; k < 10 && atomic_load(&sh.active) > 0; k++) {
            ts.tv_nsec = 25 * 1000 * 1000;
            while (nanosleep(&ts, &ts) != 0 && errno == EINTR) {}
        }
    }
    for (unsigned i = 0; i < started; i++) pthread_join(th[i], NULL);
    rt_progress_draw(sh.prog, 1);
    rt_progress_destroy(sh.prog);
    free(ws);
    free(th);
    pthread_mutex_destroy(&sh.lock);
    return sh.status;
}

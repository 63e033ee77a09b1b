// SPDX-License-Identifier: MIT
// The progress line of pkv-replay and its SIGINT/SIGTERM handling. Workers publish their
// counters after every replay step (relaxed atomics, one slot per worker); the
// main thread redraws the line every 250 ms from those counters, so the line
// moves in any mode, and a slow step cannot hold it back. A stop signal sets a
// flag that the workers' progress callbacks return to the replay, which then
// stops and reports what it replayed (marked partial).
#include <signal.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "replay_tools.h"

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

atomic_int rt_stop_requested = 0;

static void on_stop(int sig) {
    atomic_store(&rt_stop_requested, sig); // the exit status is 128 + sig
    signal(sig, SIG_DFL); // a second ^C (or TERM) ends the process at once
}

// SIGTERM is what Slurm (at a job's time limit, before SIGKILL), systemd and
// `kill` send: it stops the replay the way ^C does, so a job array cut short
// still leaves its partial reports.
void rt_install_stop_signals(void) {
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_stop;
    sigemptyset(&sa.sa_mask);
    sigaction(SIGINT, &sa, NULL);
    sigaction(SIGTERM, &sa, NULL);
}

typedef struct slot {
    _Atomic uint64_t done;   // requests done in the run in progress
    _Atomic uint64_t sim_us; // its simulated clock, microseconds
    char pad[48];            // one cache line per worker
} slot;

struct rt_progress {
    slot *slots;
    unsigned workers;
    _Atomic uint64_t folded; // requests of finished runs
    uint64_t total;
    int enabled, drawn;
    double t0;
};

rt_progress *rt_progress_create(unsigned workers, uint64_t total, int enabled) {
    rt_progress *p = calloc(1, sizeof *p);
    if (!p) return NULL;
    p->slots = calloc(workers ? workers : 1, sizeof *p->slots);
    if (!p->slots) {
        free(p);
        return NULL;
    }
    p->workers = workers;
    p->total = total;
    p->enabled = enabled;
    p->t0 = now_s();
    return p;
}

void rt_progress_destroy(rt_progress *p) {
    if (!p) return;
    free(p->slots);
    free(p);
}

void rt_progress_update(rt_progress *p, unsigned w, uint64_t done, double sim_s) {
    atomic_store_explicit(&p->slots[w].done, done, memory_order_relaxed);
    // Simulated time can reach 1e300 s on a legal trace: clamp before converting
    // (a double beyond uint64 range is undefined behaviour to convert).
    const double us = sim_s * 1e6;
    const uint64_t sim_us = us >= 0 && us < 1.8e19 ? (uint64_t)us : (us >= 0 ? UINT64_MAX : 0);
    atomic_store_explicit(&p->slots[w].sim_us, sim_us, memory_order_relaxed);
}

void rt_progress_finish_run(rt_progress *p, unsigned w, uint64_t requests) {
    atomic_fetch_add_explicit(&p->folded, requests, memory_order_relaxed);
    atomic_store_explicit(&p->slots[w].done, 0, memory_order_relaxed);
}

static void hms(char *buf, size_t cap, double s) {
    if (!(s >= 0) || s > 360000) {
        snprintf(buf, cap, "--:--");
        return;
    }
    const unsigned long x = (unsigned long)(s + 0.5);
    if (x >= 3600)
        snprintf(buf, cap, "%lu:%02lu:%02lu", x / 3600, x / 60 % 60, x % 60);
    else
        snprintf(buf, cap, "%lu:%02lu", x / 60, x % 60);
}

void rt_progress_draw(rt_progress *p, int last) {
    if (!p || !p->enabled) return;
    if (last) {
        if (p->drawn) fputs("\r\033[K", stderr);
        fflush(stderr);
        return;
    }
    uint64_t done = atomic_load_explicit(&p->folded, memory_order_relaxed);
    double sim = 0;
    for (unsigned w = 0; w < p->workers; w++) {
        done += atomic_load_explicit(&p->slots[w].done, memory_order_relaxed);
        const double s = (double)atomic_load_explicit(&p->slots[w].sim_us, memory_order_relaxed) / 1e6;
        if (s > sim) sim = s;
    }
    const double wall = now_s() - p->t0;
    const double rate = wall > 0 ? (double)done / wall : 0;
    const double eta = rate > 0 && p->total >= done ? (double)(p->total - done) / rate : -1;
    char e[48], w[48];
    hms(e, sizeof e, eta);
    hms(w, sizeof w, wall);
    fprintf(stderr,
            "\r\033[K%llu/%llu requests (%.1f%%)  sim %.1f s  %.0f req/s  elapsed %s  ETA %s%s",
            (unsigned long long)done, (unsigned long long)p->total,
            p->total ? 100.0 * (double)done / (double)p->total : 0.0, sim, rate, w, e,
            rt_stop_requested ? "  (stopping)" : "");
    fflush(stderr);
    p->drawn = 1;
}

// SPDX-License-Identifier: MIT
// The benchmarks' wall clock: seconds on CLOCK_MONOTONIC (only differences mean
// anything). The library's own clock (pkvi_now_seconds) is not exported.
// cpu_now: seconds of CPU time used by all of the process's threads, which on a
// shared machine counts the cycles a call ran, not the time it waited to run.
#ifndef PKV_BENCH_CLOCK_H
#define PKV_BENCH_CLOCK_H

#include <time.h>

static inline double now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static inline double cpu_now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

#endif // PKV_BENCH_CLOCK_H

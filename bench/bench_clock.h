// SPDX-License-Identifier: MIT
// The benchmarks' wall clock: seconds on CLOCK_MONOTONIC (only differences mean
// anything). The library's own clock (pkvi_now_seconds) is not exported.
#ifndef PKV_BENCH_CLOCK_H
#define PKV_BENCH_CLOCK_H

#include <time.h>

static inline double now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

#endif // PKV_BENCH_CLOCK_H

// SPDX-License-Identifier: MIT
// Internal: the one monotonic wall clock the library times things with (backend
// calls, model ops, replay steps). Defined in backend.c.
#ifndef PKV_CLOCK_H
#define PKV_CLOCK_H

// Seconds on CLOCK_MONOTONIC; only differences are meaningful.
double pkvi_now_seconds(void);

#endif // PKV_CLOCK_H

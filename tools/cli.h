// SPDX-License-Identifier: MIT
// Argument parsing shared by the command-line tools (header-only: each tool is one
// program, and these few lines are not library API).
#ifndef PKV_TOOLS_CLI_H
#define PKV_TOOLS_CLI_H

#include <errno.h>
#include <stdint.h>
#include <stdlib.h>

// A whole decimal unsigned number: no sign, no trailing text, no overflow.
// Returns 1 and sets *v, or 0 (and leaves *v alone).
static inline int cli_parse_u64(const char *s, uint64_t *v) {
    if (!s || !*s || *s == '-') return 0;
    char *end = NULL;
    errno = 0;
    unsigned long long x = strtoull(s, &end, 10);
    if (errno || *end) return 0;
    *v = x;
    return 1;
}

#endif // PKV_TOOLS_CLI_H

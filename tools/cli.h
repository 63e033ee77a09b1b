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

// How every tool's --help states the size grammar (pkv_size_parse in
// pkv/replay.h is the one parser; DESIGN.md "Sizes" documents it).
#define CLI_SIZE_UNITS                                                                   \
    "SIZE: bytes, or a number and a unit: GB, MB, KB, TB = powers of 1000 (80GB =\n"     \
    "80e9); GiB or G, MiB or M, KiB or K, TiB or T = powers of 1024 (40G = 40GiB)\n"

#endif // PKV_TOOLS_CLI_H

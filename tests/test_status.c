// SPDX-License-Identifier: MIT
// Status names and the version check.
#include <criterion/criterion.h>
#include <string.h>

#include "pkv/pkv.h"

Test(status, every_code_has_a_distinct_name) {
    const pkv_status codes[] = {
        PKV_OK, PKV_ERR_INVALID_ARG, PKV_ERR_OUT_OF_BLOCKS, PKV_ERR_OUT_OF_MEMORY,
        PKV_ERR_NOT_FOUND, PKV_ERR_UNSUPPORTED, PKV_ERR_NO_DEVICE, PKV_ERR_BACKEND,
        PKV_ERR_CORRUPT, PKV_ERR_BUFFER_TOO_SMALL, PKV_ERR_IO, PKV_ERR_FORMAT, PKV_ERR_BUSY,
        PKV_ERR_LIMIT, PKV_ERR_RELEASED,
    };
    const size_t n = sizeof codes / sizeof codes[0];
    for (size_t i = 0; i < n; i++) {
        const char *name = pkv_status_str(codes[i]);
        cr_assert_not_null(name);
        cr_assert_str_neq(name, "unknown status", "code %d has no name", codes[i]);
        for (size_t j = 0; j < i; j++)
            cr_assert_str_neq(name, pkv_status_str(codes[j]), "codes %d and %d share a name",
                              codes[i], codes[j]);
    }
    cr_assert_str_eq(pkv_status_str((pkv_status)-999), "unknown status");
    cr_assert_str_eq(pkv_status_str(PKV_ERR_OUT_OF_BLOCKS), "out of blocks");
}

Test(status, linked_library_matches_headers) {
    cr_assert_eq(pkv_version(), PKV_VERSION);
    cr_assert_eq(PKV_VERSION, PKV_VERSION_MAJOR * 10000 + PKV_VERSION_MINOR * 100 + PKV_VERSION_PATCH);
}

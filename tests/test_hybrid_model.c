// SPDX-License-Identifier: MIT
// Randomized model-based test of the hybrid KV manager: 60 seeded worlds (random
// groups, layout and sizes) of 600 random operations each, every one checked
// against the reference model of tests/hybrid_world.h.
#include <criterion/criterion.h>

// The condition goes in as an argument, never into the format (it may hold a %).
#define HW_CHECK(cond, ...)                                                                        \
    do {                                                                                           \
        if (!(cond)) {                                                                             \
            cr_log_error("check failed: %s", #cond);                                               \
            cr_assert_fail(__VA_ARGS__);                                                           \
        }                                                                                          \
    } while (0)
#include "hybrid_world.h"

Test(hybrid_model, random_groups_layouts_and_operations, .timeout = 300) {
    for (uint64_t seed = 1; seed <= 60; seed++) run_world(NULL, 0, seed, 600);
}

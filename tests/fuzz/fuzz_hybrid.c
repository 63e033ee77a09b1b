// SPDX-License-Identifier: MIT
// libFuzzer harness for the hybrid KV manager (hybrid.h): the input's bytes are
// the choices of the randomized model test (tests/hybrid_world.h): groups, layout,
// block sizes and budget first, then the operations (create, append, batch
// append, fork, truncate, free), each checked against the reference model of
// tokens, window holes and states, with pkv_hybrid_validate after every one and
// every block back in its pool at the end.
#include <stdint.h>

#include "fuzz_common.h"

#define HW_CHECK CHECK
#include "tests/hybrid_world.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (size == 0) return 0;
    run_world(data, size, 0, UINT32_MAX);
    return 0;
}

// SPDX-License-Identifier: MIT
// Tests for the device memory models of the cudaMalloc-style replay policies
// (src/runtime/replay/device_mem.c), each sequence of calls hand-computed from
// the rules in docs/POLICIES.md, "Device memory models": cuda's 2 MiB granule,
// and PyTorch's caching allocator (512-byte rounding, small and large pools,
// segment sizes, best fit, splitting, merging, release of whole free segments
// when cudaMalloc fails). Then the replay: malloc-per-request on the cuda model
// has no external fragmentation where the first-fit arena has some.
#include <criterion/criterion.h>
#include <string.h>

#include "../src/runtime/replay/replay_internal.h"
#include "pkv/trace.h"
#include "replay_helpers.h"

#define MiB (1ull << 20)

typedef struct log {
    int n;
    int kind[16];
    uint64_t bytes[16];
} calllog;

static void log_call(void *ctx, pkv_backend_call kind, uint64_t bytes) {
    calllog *l = ctx;
    cr_assert_lt(l->n, 16);
    l->kind[l->n] = (int)kind;
    l->bytes[l->n++] = bytes;
}

Test(device_mem, cuda_rounds_to_2_mib_and_never_fragments) {
    calllog l = {0};
    pkvi_devmem *m = NULL;
    cr_assert_eq(pkvi_devmem_create(PKV_DEVICE_MEM_CUDA, 10 * MiB, log_call, &l, &m), PKV_OK);
    uint64_t a, b, c, held;
    cr_assert_eq(pkvi_devmem_alloc(m, 3 * MiB, &a, &held), PKV_OK);
    cr_expect_eq(held, 4 * MiB);
    cr_assert_eq(pkvi_devmem_alloc(m, 5 * MiB + 1, &b, &held), PKV_OK);
    cr_expect_eq(held, 6 * MiB);
    cr_expect_eq(pkvi_devmem_alloc(m, 1, &c, &held), PKV_ERR_OUT_OF_BLOCKS, "10 MiB all held");
    pkvi_devmem_free(m, a);
    // 4 MiB free, not next to anything in particular: a 4 MiB allocation fits.
    cr_assert_eq(pkvi_devmem_alloc(m, 4 * MiB, &c, &held), PKV_OK);
    cr_expect_eq(pkvi_devmem_segments(m), 10 * MiB);
    cr_expect_eq(pkvi_devmem_validate(m), PKV_OK);
    cr_assert_eq(l.n, 4); // cudaMalloc x3, cudaFree x1, of the mapped sizes
    const int kinds[4] = {PKV_BACKEND_CALL_ALLOC, PKV_BACKEND_CALL_ALLOC, PKV_BACKEND_CALL_FREE,
                          PKV_BACKEND_CALL_ALLOC};
    const uint64_t sizes[4] = {4 * MiB, 6 * MiB, 4 * MiB, 4 * MiB};
    for (int i = 0; i < 4; i++) {
        cr_expect_eq(l.kind[i], kinds[i], "call %d", i);
        cr_expect_eq(l.bytes[i], sizes[i], "call %d", i);
    }
    pkvi_devmem_destroy(m);
}

Test(device_mem, torch_caching_follows_the_caching_allocator) {
    calllog l = {0};
    pkvi_devmem *m = NULL;
    cr_assert_eq(pkvi_devmem_create(PKV_DEVICE_MEM_TORCH_CACHING, 40 * MiB, log_call, &l, &m), PKV_OK);
    uint64_t h[8], held;
    // 1. 12 MiB + 100 B -> 12 MiB + 512; large, >= 10 MiB: a segment of the size
    //    rounded to 2 MiB (14 MiB); the 2 MiB - 512 left is > 1 MiB: split off.
    cr_assert_eq(pkvi_devmem_alloc(m, 12 * MiB + 100, &h[1], &held), PKV_OK);
    cr_expect_eq(held, 12 * MiB + 512);
    // 2. 1.5 MiB: the cached 2 MiB - 512 fits; 0.5 MiB - 512 left is <= 1 MiB: kept whole.
    cr_assert_eq(pkvi_devmem_alloc(m, 3 * MiB / 2, &h[2], &held), PKV_OK);
    cr_expect_eq(held, 2 * MiB - 512);
    // 3. 3 MiB: nothing cached; under 10 MiB: a 20 MiB segment, split (17 MiB left).
    cr_assert_eq(pkvi_devmem_alloc(m, 3 * MiB, &h[3], &held), PKV_OK);
    cr_expect_eq(held, 3 * MiB);
    // 4. free #1: its neighbour #2 is in use, no merge; cached.
    pkvi_devmem_free(m, h[1]);
    // 5. 11 MiB: best fit among cached 12 MiB + 512 and 17 MiB is the first; the
    //    1 MiB + 512 left is > 1 MiB: split. No cudaMalloc.
    cr_assert_eq(pkvi_devmem_alloc(m, 11 * MiB, &h[5], &held), PKV_OK);
    cr_expect_eq(held, 11 * MiB);
    // 6. 0.5 MiB: small pool, empty: a 2 MiB segment.
    cr_assert_eq(pkvi_devmem_alloc(m, MiB / 2, &h[6], &held), PKV_OK);
    cr_expect_eq(pkvi_devmem_segments(m), 36 * MiB);
    cr_expect_eq(pkvi_devmem_held(m), 11 * MiB + 2 * MiB - 512 + 3 * MiB + MiB / 2);
    // 7. 22 MiB: no cached block fits, 36 + 22 > 40 and no segment is wholly free.
    cr_expect_eq(pkvi_devmem_alloc(m, 22 * MiB, &h[7], &held), PKV_ERR_OUT_OF_BLOCKS);
    // 8. free #3: it merges with the 17 MiB after it, the 20 MiB segment is free;
    //    22 MiB now releases it (cudaFree 20 MiB) and fits: 16 + 22 <= 40.
    pkvi_devmem_free(m, h[3]);
    cr_expect_eq(pkvi_devmem_validate(m), PKV_OK);
    cr_assert_eq(pkvi_devmem_alloc(m, 22 * MiB, &h[7], &held), PKV_OK);
    cr_expect_eq(pkvi_devmem_segments(m), 38 * MiB);
    cr_expect_eq(pkvi_devmem_validate(m), PKV_OK);
    const int kinds[5] = {PKV_BACKEND_CALL_ALLOC, PKV_BACKEND_CALL_ALLOC, PKV_BACKEND_CALL_ALLOC,
                          PKV_BACKEND_CALL_FREE, PKV_BACKEND_CALL_ALLOC};
    const uint64_t sizes[5] = {14 * MiB, 20 * MiB, 2 * MiB, 20 * MiB, 22 * MiB};
    cr_assert_eq(l.n, 5);
    for (int i = 0; i < 5; i++) {
        cr_expect_eq(l.kind[i], kinds[i], "call %d", i);
        cr_expect_eq(l.bytes[i], sizes[i], "call %d: %llu", i, (unsigned long long)l.bytes[i]);
    }
    pkvi_devmem_destroy(m);
}

// Llama-2-7B (512 KiB per token: 4 tokens per 2 MiB) in a 16-token budget
// (8 MiB). A (P3 O2, 4 tokens) and B (P5 O4, 8 tokens) arrive at 0, C (P5 O2,
// 6 tokens) just after. Arena: A [0, 4) and B [4, 12) are placed in step 1; A
// finishes after step 2, leaving 4 + 4 free slots in two holes, so C (6) waits
// for B: external fragmentation. cuda: C needs 6 tokens = 3 MiB -> 4 MiB, and
// 8 MiB - 4 (B) = 4 MiB are free once A is gone: admitted, no fragmentation.
Test(device_mem, malloc_per_request_fragments_only_in_an_arena) {
    const pkv_trace_request q[3] = {{0, 3, 2, 1, -1, 0, 0}, {0, 5, 4, 1, -1, 0, 1}, {1e-9, 5, 2, 1, -1, 0, 2}};
    pkv_trace *t = make_trace(q, 3);
    pkv_replay_params p = pkv_replay_params_default();
    p.policy = PKV_POLICY_MALLOC_PER_REQUEST;
    p.kv_mem_bytes = 8 * MiB;
    p.watermark = 0;
    p.validate = 1;
    p.alloc_model = pkv_alloc_model_none();
    pkv_replay_report arena, cuda;
    p.device_mem = PKV_DEVICE_MEM_ARENA;
    cr_assert_eq(pkv_replay_run(t, &p, &arena), PKV_OK);
    p.device_mem = PKV_DEVICE_MEM_DEFAULT;
    cr_assert_eq(pkv_replay_run(t, &p, &cuda), PKV_OK);
    cr_expect_str_eq(cuda.memory.device_mem, "cuda");
    cr_expect_str_eq(arena.memory.device_mem, "arena");
    cr_expect_eq(arena.requests.completed, 3);
    cr_expect_eq(cuda.requests.completed, 3);
    cr_expect_gt(arena.memory.external_frag_frac, 0, "C waited behind a hole");
    cr_expect_eq(cuda.memory.external_frag_frac, 0);
    cr_expect_lt(cuda.steps, arena.steps, "C runs beside B under cuda");
    // cuda reserves whole 2 MiB granules: A 4 -> 4 tokens, B 8 -> 8, C 6 -> 8.
    cr_expect_eq(cuda.memory.peak_reserved_bytes, 16 * 512 * 1024);
    cr_expect_eq(cuda.alloc.backend_alloc_calls, 3);
    cr_expect_eq(cuda.alloc.backend_free_calls, 3);
    pkv_trace_destroy(t);
}

// A refused admission never reaches the device model (an engine checks before it
// calls), also when only the granule rounding makes it not fit. 16-token budget,
// watermark 5 slots (ceil(0.3125 * 16)). A (P4 O2: 5 tokens -> 8 held) leaves 8
// free. B (P2 O2: 3 tokens -> 4 held) passes 3 + 5 <= 8 but would leave 4 < 5: it
// must wait for A without a call; before, each step's try was a charged cudaMalloc
// and cudaFree (its rollback).
Test(device_mem, refused_admission_makes_no_call) {
    const pkv_trace_request q[2] = {{0, 4, 2, 1, -1, 0, 0}, {1e-9, 2, 2, 1, -1, 0, 1}};
    pkv_trace *t = make_trace(q, 2);
    pkv_replay_params p = pkv_replay_params_default();
    p.policy = PKV_POLICY_MALLOC_PER_REQUEST;
    p.kv_mem_bytes = 8 * MiB;
    p.watermark = 0.3125;
    p.validate = 1;
    p.alloc_model = pkv_alloc_model_none();
    pkv_replay_report r;
    cr_assert_eq(pkv_replay_run(t, &p, &r), PKV_OK);
    cr_expect_str_eq(r.memory.device_mem, "cuda");
    cr_expect_eq(r.requests.completed, 2);
    cr_expect_eq(r.alloc.backend_alloc_calls, 2, "%llu", (unsigned long long)r.alloc.backend_alloc_calls);
    cr_expect_eq(r.alloc.backend_free_calls, 2, "%llu", (unsigned long long)r.alloc.backend_free_calls);
    pkv_trace_destroy(t);
}

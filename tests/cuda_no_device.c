// SPDX-License-Identifier: MIT
// The CUDA entry points on a machine with the CUDA runtime and no GPU (CI):
// each must say PKV_ERR_NO_DEVICE, never PKV_OK for work that did not run
// (issue 20, defect 9: the launch helper took the runtime's "no device" for a
// caller's pending error and returned OK). Built only with CUDA; exit 77
// (skipped) where a device exists, since then the calls do run.
// Exit: 0 pass, 1 a call said something else, 77 skipped.
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

#include "pkv/attention.h"
#include "pkv/backend.h"

static int failures;

static void expect(const char *what, pkv_status st) {
    const int ok = st == PKV_ERR_NO_DEVICE;
    printf("%s %s: %s\n", ok ? "ok  " : "FAIL", what, pkv_status_str(st));
    failures += !ok;
}

int main(void) {
    pkv_backend *b = NULL;
    const pkv_status probe = pkv_backend_create_cuda(0, &b);
    if (probe == PKV_OK) {
        pkv_backend_destroy(b);
        printf("cuda_no_device: a CUDA device is present: skipped\n");
        return 77;
    }
    expect("pkv_backend_create_cuda", probe);
    // Host buffers stand in for device ones: the argument checks pass, and
    // without a device nothing may run on them.
    enum { HD = 64, BS = 16, NB = 2 };
    const pkv_attn_shape sh = {2, 1, HD, PKV_DTYPE_F16, 0.125f, 0};
    uint16_t *cache = calloc((size_t)NB * BS * HD, sizeof *cache);
    uint16_t *q = calloc(2 * HD, sizeof *q), *out = calloc(2 * HD, sizeof *out);
    const int32_t table[2] = {0, 1}, lens[1] = {17};
    if (!cache || !q || !out) return 1;
    const pkv_attn_paged_kv kv = {cache, cache, (uint64_t)BS * HD, (uint64_t)BS * HD, HD, BS, NB,
                                  table, 2, lens};
    expect("pkv_attn_decode_paged_cuda", pkv_attn_decode_paged_cuda(&sh, 1, q, &kv, out, NULL));
    const int64_t slots[1] = {3};
    expect("pkv_attn_cache_write_cuda",
           pkv_attn_cache_write_cuda(&sh, 1, q, q, slots, cache, cache, (uint64_t)BS * HD,
                                     (uint64_t)BS * HD, HD, BS, NB, NULL));
    const pkv_block_copy cp[1] = {{0, 1}};
    expect("pkv_attn_copy_blocks_cuda",
           pkv_attn_copy_blocks_cuda(PKV_DTYPE_INT8, cache, 1, (uint64_t)NB * 206, 206, 198, NB, cp,
                                     1, NULL));
    free(cache), free(q), free(out);
    printf("cuda_no_device: %d failure(s)\n", failures);
    return failures ? 1 : 0;
}

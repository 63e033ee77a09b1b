// SPDX-License-Identifier: MIT
// Memory backends: the host backend's calls and counters, and the CUDA backend's
// clean refusal when there is no device (or no CUDA in this build).
#include <criterion/criterion.h>
#include <stdint.h>
#include <string.h>

#include "pkv/backend.h"

Test(backend, host_alloc_free_are_counted_and_timed) {
    pkv_backend *b = NULL;
    cr_assert_eq(pkv_backend_create_host(&b), PKV_OK);
    cr_assert_eq(pkv_backend_get_kind(b), PKV_BACKEND_HOST);
    cr_assert_str_eq(pkv_backend_name(b), "host");
    void *small = NULL, *big = NULL;
    cr_assert_eq(pkv_backend_alloc(b, 100, &small), PKV_OK);
    cr_assert_eq(pkv_backend_alloc(b, 1 << 20, &big), PKV_OK);
    cr_assert_eq((uintptr_t)small % 64, 0, "cache-line aligned");
    cr_assert_eq((uintptr_t)big % 4096, 0, "page aligned for large arenas");
    memset(big, 0xab, 1 << 20); // the memory is really there (ASan would object)
    pkv_backend_stats st;
    cr_assert_eq(pkv_backend_get_stats(b, &st), PKV_OK);
    cr_assert_eq(st.alloc_calls, 2);
    cr_assert_eq(st.free_calls, 0);
    cr_assert_eq(st.bytes_live, 100 + (1 << 20));
    cr_assert_eq(st.bytes_peak, 100 + (1 << 20));
    cr_assert(st.alloc_seconds >= 0.0);
    cr_assert_eq(pkv_backend_free(b, small, 100), PKV_OK);
    cr_assert_eq(pkv_backend_free(b, NULL, 0), PKV_OK, "free(NULL) is accepted, not counted");
    cr_assert_eq(pkv_backend_get_stats(b, &st), PKV_OK);
    cr_assert_eq(st.free_calls, 1);
    cr_assert_eq(st.bytes_live, 1 << 20);
    pkv_backend_reset_stats(b);
    cr_assert_eq(pkv_backend_get_stats(b, &st), PKV_OK);
    cr_assert_eq(st.alloc_calls, 0);
    cr_assert_eq(st.bytes_live, 1 << 20, "reset keeps what is still allocated");
    cr_assert_eq(pkv_backend_free(b, big, 1 << 20), PKV_OK);
    pkv_backend_destroy(b);
    pkv_backend_destroy(NULL);
}

Test(backend, host_bad_args) {
    pkv_backend *b = NULL;
    cr_assert_eq(pkv_backend_create_host(NULL), PKV_ERR_INVALID_ARG);
    cr_assert_eq(pkv_backend_create_host(&b), PKV_OK);
    void *p = (void *)1;
    cr_assert_eq(pkv_backend_alloc(b, 0, &p), PKV_ERR_INVALID_ARG);
    cr_assert_null(p);
    cr_assert_eq(pkv_backend_alloc(NULL, 8, &p), PKV_ERR_INVALID_ARG);
    cr_assert_eq(pkv_backend_alloc(b, 8, NULL), PKV_ERR_INVALID_ARG);
    cr_assert_eq(pkv_backend_alloc(b, SIZE_MAX, &p), PKV_ERR_OUT_OF_MEMORY);
    cr_assert_eq(pkv_backend_free(b, (void *)8, 16), PKV_ERR_INVALID_ARG,
                 "more bytes than were ever allocated here");
    cr_assert_eq(pkv_backend_copy(b, NULL, NULL, 1, NULL), PKV_ERR_INVALID_ARG);
    cr_assert_eq(pkv_backend_memset(b, NULL, 0, 4), PKV_ERR_INVALID_ARG);
    cr_assert_eq(pkv_backend_upload(b, NULL, "x", 1), PKV_ERR_INVALID_ARG);
    cr_assert_eq(pkv_backend_download(b, NULL, "x", 1), PKV_ERR_INVALID_ARG);
    cr_assert_eq(pkv_backend_get_stats(b, NULL), PKV_ERR_INVALID_ARG);
    pkv_backend_stats st;
    cr_assert_eq(pkv_backend_get_stats(b, &st), PKV_OK);
    cr_assert_eq(st.alloc_calls, 1, "the failed SIZE_MAX call counts as a call");
    cr_assert_eq(st.bytes_live, 0);
    pkv_backend_destroy(b);
}

Test(backend, host_copy_memset_upload_download) {
    pkv_backend *b = NULL;
    cr_assert_eq(pkv_backend_create_host(&b), PKV_OK);
    unsigned char *arena = NULL;
    cr_assert_eq(pkv_backend_alloc(b, 256, (void **)&arena), PKV_OK);
    cr_assert_eq(pkv_backend_memset(b, arena, 0, 256), PKV_OK);
    unsigned char src[64];
    for (int i = 0; i < 64; i++) src[i] = (unsigned char)(i + 1);
    cr_assert_eq(pkv_backend_upload(b, arena, src, 64), PKV_OK);
    pkv_copy_region regions[2] = {{0, 128, 32}, {32, 192, 32}};
    cr_assert_eq(pkv_backend_copy(b, arena, regions, 2, NULL), PKV_OK);
    unsigned char out[256];
    cr_assert_eq(pkv_backend_download(b, out, arena, 256), PKV_OK);
    cr_assert_eq(memcmp(out + 128, src, 32), 0);
    cr_assert_eq(memcmp(out + 192, src + 32, 32), 0);
    cr_assert_eq(out[64], 0);
    pkv_backend_stats st;
    cr_assert_eq(pkv_backend_get_stats(b, &st), PKV_OK);
    cr_assert_eq(st.copy_calls, 1, "one batch, one call");
    cr_assert_eq(st.bytes_copied, 64);
    cr_assert_eq(pkv_backend_free(b, arena, 256), PKV_OK);
    pkv_backend_destroy(b);
}

Test(backend, cuda_without_device_fails_cleanly) {
    pkv_backend *b = (pkv_backend *)1;
    pkv_status st = pkv_backend_create_cuda(0, &b);
    if (st == PKV_OK) {
        // A GPU is present: the backend must work like the host one.
        void *p = NULL;
        cr_assert_eq(pkv_backend_alloc(b, 1 << 20, &p), PKV_OK);
        cr_assert_eq(pkv_backend_free(b, p, 1 << 20), PKV_OK);
        pkv_backend_stats s;
        cr_assert_eq(pkv_backend_get_stats(b, &s), PKV_OK);
        cr_assert_eq(s.alloc_calls, 1);
        pkv_backend_destroy(b);
        return;
    }
    cr_assert(st == PKV_ERR_NO_DEVICE || st == PKV_ERR_UNSUPPORTED, "got %s", pkv_status_str(st));
    cr_assert_null(b);
    cr_log_info("no CUDA backend here (%s): checked the clean refusal only", pkv_status_str(st));
    cr_assert_eq(pkv_backend_create_cuda(-1, &b), st == PKV_ERR_UNSUPPORTED ? PKV_ERR_UNSUPPORTED
                                                                            : PKV_ERR_NO_DEVICE);
    cr_assert_eq(pkv_backend_create_cuda(0, NULL), PKV_ERR_INVALID_ARG);
}

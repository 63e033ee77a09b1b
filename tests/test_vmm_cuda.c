// SPDX-License-Identifier: MIT
// The CUDA VMM space (driver VMM API) (suite cuda). Without a CUDA build the entry
// point must say PKV_ERR_UNSUPPORTED; with one but without a device (or driver) it
// must say PKV_ERR_NO_DEVICE and the tests skip, saying so. With a device: the
// same accounting and content checks as on the host, and the contiguous CUDA decode
// kernel over the space against the CPU kernel over the same data.
#include <criterion/criterion.h>
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "pkv/attention.h"
#include "pkv/backend.h"
#include "pkv/vmm.h"
#include "pkv_config.h"

static pkv_vmm_space *make_or_skip(pkv_vmm_params *p) {
    pkv_vmm_space *s = NULL;
    pkv_status st = pkv_vmm_space_create_cuda(0, p, &s);
#if PKV_HAVE_CUDA
    if (st == PKV_ERR_NO_DEVICE || st == PKV_ERR_UNSUPPORTED)
        cr_skip_test("no usable CUDA device with VMM: %s", pkv_status_str(st));
    cr_assert_eq(st, PKV_OK, "create: %s", pkv_status_str(st));
#else
    cr_assert_eq(st, PKV_ERR_UNSUPPORTED, "a build without CUDA must say so: %s",
                 pkv_status_str(st));
    cr_assert_null(s);
    cr_skip_test("built without CUDA");
#endif
    return s;
}

Test(vmm_cuda, device_less_run_reports_a_status) {
    pkv_vmm_params p = pkv_vmm_params_default();
    pkv_vmm_space *s = NULL;
    pkv_status st = pkv_vmm_space_create_cuda(0, &p, &s);
    cr_assert(st == PKV_OK || st == PKV_ERR_NO_DEVICE || st == PKV_ERR_UNSUPPORTED,
              "only OK / no device / unsupported: %s", pkv_status_str(st));
    cr_assert_eq(st == PKV_OK, s != NULL);
    cr_assert_eq(pkv_vmm_space_create_cuda(0, NULL, &s), PKV_ERR_INVALID_ARG);
    cr_assert_eq(pkv_vmm_space_create_cuda(-1, &p, &s) == PKV_OK, 0);
    pkv_vmm_space_destroy(s);
}

Test(vmm_cuda, map_unmap_accounting_and_content) {
    pkv_vmm_params p = pkv_vmm_params_default();
    p.num_slots = 3;
    p.num_buffers = 2;
    p.buffer_bytes = (uint64_t)8 << 20;
    p.max_pages = 10;
    pkv_vmm_space *s = make_or_skip(&p);
    pkv_vmm_info info;
    pkv_vmm_get_info(s, &info);
    cr_assert_geq(info.granularity, 4096);
    cr_assert_eq(info.page_bytes % info.granularity, 0);
    pkv_backend *dev = NULL;
    cr_assert_eq(pkv_backend_create_cuda(0, &dev), PKV_OK);
    uint32_t a, b;
    cr_assert_eq(pkv_vmm_slot_acquire(s, &a), PKV_OK);
    cr_assert_eq(pkv_vmm_slot_acquire(s, &b), PKV_OK);
    size_t n = (size_t)info.page_bytes + 4096; // crosses a page boundary
    unsigned char *host = malloc(n), *back = malloc(n);
    for (size_t i = 0; i < n; i++) host[i] = (unsigned char)(i * 13 + 5);
    cr_assert_eq(pkv_vmm_slot_resize(s, a, 4096), PKV_OK);
    char *buf0;
    pkv_vmm_buffer_ptr(s, 0, (void **)&buf0);
    char *row_a = buf0 + (uint64_t)a * info.buffer_bytes;
    cr_assert_eq(pkv_backend_upload(dev, row_a, host, 4096), PKV_OK);
    cr_assert_eq(pkv_vmm_slot_resize(s, a, n), PKV_OK); // grow: first page keeps content
    cr_assert_eq(pkv_backend_upload(dev, row_a + 4096, host + 4096, n - 4096), PKV_OK);
    cr_assert_eq(pkv_backend_download(dev, back, row_a, n), PKV_OK);
    cr_assert_eq(memcmp(host, back, n), 0, "content across the page boundary");
    pkv_vmm_stats st;
    pkv_vmm_get_stats(s, &st);
    cr_assert_eq(st.map_calls, 4, "2 pages x 2 buffers");
    cr_assert_eq(st.create_calls, 4);
    // Budget 10: b may take 3 pages per buffer (6) but not 4 (8 > 6 left).
    cr_assert_eq(pkv_vmm_slot_resize(s, b, 4 * info.page_bytes), PKV_ERR_OUT_OF_BLOCKS);
    cr_assert_eq(pkv_vmm_slot_resize(s, b, 3 * info.page_bytes), PKV_OK);
    cr_assert_eq(pkv_vmm_slot_release(s, a), PKV_OK);
    pkv_vmm_get_stats(s, &st);
    cr_assert_eq(st.unmap_calls, 4);
    cr_assert_eq(st.pages_mapped, 6);
    cr_assert_eq(pkv_vmm_validate(s), PKV_OK);
    free(host);
    free(back);
    pkv_vmm_space_destroy(s);
    pkv_backend_destroy(dev);
}

Test(vmm_cuda, contiguous_decode_kernel_on_a_vmm_cache) {
    const uint32_t seqs = 2, kvh = 2, heads = 4, dim = 128, max_len = 9000;
    const int32_t lens[2] = {37, 8500};
    const uint64_t row_elems = (uint64_t)max_len * kvh * dim;
    pkv_vmm_params p = pkv_vmm_params_default();
    p.num_slots = seqs;
    p.num_buffers = 2;
    p.buffer_bytes = row_elems * sizeof(float);
    pkv_vmm_space *s = make_or_skip(&p);
    pkv_vmm_info info;
    pkv_vmm_get_info(s, &info);
    pkv_backend *dev = NULL;
    cr_assert_eq(pkv_backend_create_cuda(0, &dev), PKV_OK);
    uint64_t row = info.buffer_bytes / sizeof(float);
    float *k = calloc((size_t)seqs * row, sizeof(float)), *v = calloc((size_t)seqs * row, 4);
    float *q = malloc((size_t)seqs * heads * dim * 4), *ref = malloc((size_t)seqs * heads * dim * 4);
    float *got = malloc((size_t)seqs * heads * dim * 4);
    uint64_t rng = 3;
    for (size_t i = 0; i < (size_t)seqs * row; i++) {
        rng = rng * 6364136223846793005ull + 1442695040888963407ull;
        k[i] = (float)((rng >> 40) & 0xffff) / 65536.0f - 0.5f;
        v[i] = (float)((rng >> 20) & 0xffff) / 65536.0f - 0.5f;
    }
    for (size_t i = 0; i < (size_t)seqs * heads * dim; i++) q[i] = k[i * 7 % (seqs * row)];
    void *dk, *dv, *dq, *dout, *dlens;
    pkv_vmm_buffer_ptr(s, 0, &dk);
    pkv_vmm_buffer_ptr(s, 1, &dv);
    for (uint32_t i = 0; i < seqs; i++) {
        uint32_t slot;
        pkv_vmm_slot_acquire(s, &slot);
        size_t bytes = (size_t)lens[i] * kvh * dim * sizeof(float);
        cr_assert_eq(pkv_vmm_slot_resize(s, slot, bytes), PKV_OK);
        pkv_backend_upload(dev, (float *)dk + slot * row, k + slot * row, bytes);
        pkv_backend_upload(dev, (float *)dv + slot * row, v + slot * row, bytes);
    }
    size_t qb = (size_t)seqs * heads * dim * 4;
    cr_assert_eq(pkv_backend_alloc(dev, qb, &dq), PKV_OK);
    cr_assert_eq(pkv_backend_alloc(dev, qb, &dout), PKV_OK);
    cr_assert_eq(pkv_backend_alloc(dev, sizeof lens, &dlens), PKV_OK);
    pkv_backend_upload(dev, dq, q, qb);
    pkv_backend_upload(dev, dlens, lens, sizeof lens);
    pkv_attn_shape sh = {heads, kvh, dim, PKV_DTYPE_F32, 0.088f, 0};
    pkv_attn_contig_kv hk = {k, v, row, dim, (uint64_t)kvh * dim, max_len, lens, NULL};
    pkv_attn_contig_kv dkv = {dk, dv, row, dim, (uint64_t)kvh * dim, max_len, dlens, NULL};
    cr_assert_eq(pkv_attn_decode_contig_cpu(&sh, seqs, q, &hk, ref), PKV_OK);
    cr_assert_eq(pkv_attn_decode_contig_cuda(&sh, seqs, dq, &dkv, dout, NULL), PKV_OK);
    pkv_backend_download(dev, got, dout, qb);
    double worst = 0;
    for (size_t i = 0; i < (size_t)seqs * heads * dim; i++) {
        double d = fabs((double)got[i] - ref[i]);
        if (!(d <= worst)) worst = d;
    }
    cr_assert_leq(worst, 6e-5, "largest |CUDA on VMM - CPU| = %g", worst);
    pkv_backend_free(dev, dq, qb);
    pkv_backend_free(dev, dout, qb);
    pkv_backend_free(dev, dlens, sizeof lens);
    free(k);
    free(v);
    free(q);
    free(ref);
    free(got);
    pkv_vmm_space_destroy(s);
    pkv_backend_destroy(dev);
}

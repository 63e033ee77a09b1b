// SPDX-License-Identifier: MIT
// CPU attention for the layer kinds of heterogeneous models (issue 23): decode and
// prefill under a sliding or chunked-local window, with gpt-oss attention sinks,
// and MLA decode over a paged latent cache. The math is attn_cpu.c's (one online-
// softmax routine for every call); this file only checks arguments and says which
// span of the context each query reads. Invariant: a window call reads no block
// before the window's first one, so released blocks may be gone from the table.
#include "attn_internal.h"

// The driver's options for a window description (already checked).
static pkvi_attn_cpu_opts window_opts(const pkv_attn_window *window) {
    pkvi_attn_cpu_opts o = {window->kind, window->window, window->sinks, 0};
    return o;
}

// The checks of pkvi_attn_check_cpu_paged, with the window's table rule in place
// of "every block from 0".
static pkv_status check_paged_window(const pkv_attn_shape *shape, const pkv_attn_window *window,
                                     const pkv_attn_paged_kv *kv, uint32_t num_seqs,
                                     const void *q, const void *out, const int32_t *q_indptr,
                                     int prefill) {
    pkv_status st = pkvi_attn_check_shape(shape, 0);
    if (st == PKV_OK) st = pkvi_attn_check_window(window, shape->num_heads);
    if (st == PKV_OK) st = pkvi_attn_check_paged_desc(kv);
    if (st == PKV_OK && (q == NULL || out == NULL || (prefill && q_indptr == NULL))) {
        st = PKV_ERR_INVALID_ARG;
    }
    // Lengths come before the prompt rows (which are checked against them).
    for (uint32_t s = 0; st == PKV_OK && s < num_seqs; s++) {
        if (kv->seq_lens[s] < 1) st = PKV_ERR_INVALID_ARG;
    }
    if (st == PKV_OK && prefill) st = pkvi_attn_check_prefill(kv->seq_lens, num_seqs, q_indptr);
    if (st == PKV_OK) st = pkvi_attn_check_window_tables(kv, num_seqs, window, q_indptr);
    return st;
}

// Decode (q_indptr NULL) or prefill under a window, paged.
static pkv_status run_paged_window(const pkv_attn_shape *shape, const pkv_attn_window *window,
                                   uint32_t num_seqs, const int32_t *q_indptr, const void *q,
                                   const pkv_attn_paged_kv *kv, void *out, int prefill) {
    pkv_status st = check_paged_window(shape, window, kv, num_seqs, q, out, q_indptr, prefill);
    if (st != PKV_OK) return st;
    const pkvi_attn_cpu_opts o = window_opts(window);
    pkvi_attn_cpu_run_paged(shape, &o, num_seqs, q_indptr, q, kv, out);
    return PKV_OK;
}

pkv_status pkv_attn_decode_paged_window_cpu(const pkv_attn_shape *shape,
                                            const pkv_attn_window *window, uint32_t num_seqs,
                                            const void *q, const pkv_attn_paged_kv *kv,
                                            void *out) {
    return run_paged_window(shape, window, num_seqs, NULL, q, kv, out, 0);
}

pkv_status pkv_attn_prefill_paged_window_cpu(const pkv_attn_shape *shape,
                                             const pkv_attn_window *window, uint32_t num_seqs,
                                             const int32_t *q_indptr, const void *q,
                                             const pkv_attn_paged_kv *kv, void *out) {
    return run_paged_window(shape, window, num_seqs, q_indptr, q, kv, out, 1);
}

pkv_status pkv_attn_decode_contig_window_cpu(const pkv_attn_shape *shape,
                                             const pkv_attn_window *window, uint32_t num_seqs,
                                             const void *q, const pkv_attn_contig_kv *kv,
                                             void *out) {
    pkv_status st = pkvi_attn_check_cpu_contig(shape, NULL, 0, kv, num_seqs, q, out, 0, NULL);
    if (st == PKV_OK) st = pkvi_attn_check_window(window, shape->num_heads);
    if (st != PKV_OK) return st;
    const pkvi_attn_cpu_opts o = window_opts(window);
    pkvi_attn_cpu_run_contig(shape, &o, num_seqs, NULL, q, kv, out);
    return PKV_OK;
}

pkv_status pkvi_attn_mla_as_mqa(const pkv_attn_mla_shape *mla, const pkv_attn_paged_kv *kv,
                                pkv_attn_shape *shape, pkv_attn_paged_kv *latent) {
    if (mla == NULL || kv == NULL || mla->latent_dim == 0 ||
        (uint64_t)mla->latent_dim + mla->rope_dim > UINT32_MAX) {
        return PKV_ERR_INVALID_ARG;
    }
    // One kv head that every query head reads, head_dim = the whole vector; V is
    // the same row, read latent_dim wide.
    pkv_attn_shape sh = {mla->num_heads, 1, mla->latent_dim + mla->rope_dim, mla->dtype,
                         mla->scale, mla->num_threads};
    *shape = sh;
    *latent = *kv;
    latent->v_cache = kv->k_cache;
    latent->head_stride = 0;
    return PKV_OK;
}

pkv_status pkv_attn_decode_mla_paged_cpu(const pkv_attn_mla_shape *shape, uint32_t num_seqs,
                                         const void *q, const pkv_attn_paged_kv *kv, void *out) {
    pkv_attn_shape sh;
    pkv_attn_paged_kv latent;
    pkv_status st = pkvi_attn_mla_as_mqa(shape, kv, &sh, &latent);
    if (st != PKV_OK) return st;
    st = pkvi_attn_check_cpu_paged(&sh, NULL, 0, &latent, num_seqs, q, out, 0, NULL);
    if (st != PKV_OK) return st;
    const pkvi_attn_cpu_opts o = {PKV_ATTN_WINDOW_FULL, 0, NULL, shape->latent_dim};
    pkvi_attn_cpu_run_paged(&sh, &o, num_seqs, NULL, q, &latent, out);
    return PKV_OK;
}

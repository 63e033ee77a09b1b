// SPDX-License-Identifier: MIT
// Argument checks of the window / sink and MLA calls, CPU and CUDA (host side).
// Invariant: a call that passes them reads only the blocks of each query's
// window, and the table entries before the window (blocks the allocator released,
// PKV_BLOCK_NONE) are neither read as ids nor followed.
#include <math.h>

#include "attn_internal.h"
#include "pkv/model_config.h"

// The window kinds are the layer kinds of the same name, so a runtime can pass a
// group's kind through.
_Static_assert(PKV_ATTN_WINDOW_FULL == (int)PKV_LAYER_FULL &&
                   PKV_ATTN_WINDOW_SLIDING == (int)PKV_LAYER_SLIDING &&
                   PKV_ATTN_WINDOW_CHUNKED == (int)PKV_LAYER_CHUNKED,
               "pkv_attn_window_kind mirrors pkv_layer_kind");

pkv_status pkvi_attn_check_window_desc(const pkv_attn_window *window) {
    if (window == NULL) {
        return PKV_ERR_INVALID_ARG;
    }
    switch (window->kind) {
    case PKV_ATTN_WINDOW_FULL:
        return PKV_OK;
    case PKV_ATTN_WINDOW_SLIDING:
    case PKV_ATTN_WINDOW_CHUNKED:
        return window->window == 0 ? PKV_ERR_INVALID_ARG : PKV_OK;
    default:
        return PKV_ERR_INVALID_ARG;
    }
}

pkv_status pkvi_attn_check_window(const pkv_attn_window *window, uint32_t num_heads) {
    pkv_status st = pkvi_attn_check_window_desc(window);
    if (st != PKV_OK || window->sinks == NULL) {
        return st;
    }
    for (uint32_t h = 0; h < num_heads; h++) {
        // A sink of +inf would zero every output, NaN poison it: neither is a
        // learned logit.
        if (!isfinite(window->sinks[h])) {
            return PKV_ERR_INVALID_ARG;
        }
    }
    return PKV_OK;
}

pkv_status pkvi_attn_check_window_tables(const pkv_attn_paged_kv *kv, uint32_t num_seqs,
                                         const pkv_attn_window *window,
                                         const int32_t *q_indptr) {
    const uint64_t cap = (uint64_t)kv->max_blocks_per_seq * kv->block_size;
    for (uint32_t s = 0; s < num_seqs; s++) {
        const int32_t len = kv->seq_lens[s];
        if (len < 1 || (uint64_t)len > cap) {
            return PKV_ERR_INVALID_ARG;
        }
        // The earliest query of this sequence: its last token, or the prompt's
        // first row (prompt rows are the last n tokens).
        uint32_t first_q = (uint32_t)len - 1u;
        if (q_indptr != NULL) {
            const int32_t n = q_indptr[s + 1] - q_indptr[s];
            if (n == 0) {
                continue; // an empty prompt reads nothing
            }
            first_q = (uint32_t)(len - n);
        }
        const uint32_t begin = pkvi_attn_window_begin(window->kind, window->window, first_q);
        const uint32_t b0 = begin / kv->block_size;
        const uint32_t nb = (uint32_t)(((uint64_t)len + kv->block_size - 1) / kv->block_size);
        const int32_t *row = kv->block_tables + (size_t)s * kv->max_blocks_per_seq;
        for (uint32_t b = b0; b < nb; b++) {
            if (row[b] < 0 || (uint32_t)row[b] >= kv->num_blocks) {
                return PKV_ERR_INVALID_ARG;
            }
        }
    }
    return PKV_OK;
}

pkv_status pkvi_attn_check_window_cuda(const pkv_attn_shape *shape, const pkv_attn_window *window,
                                       const pkv_attn_paged_kv *kv, const void *q,
                                       const void *out) {
    pkv_status st = pkvi_attn_check_shape(shape, 1);
    if (st == PKV_OK) st = pkvi_attn_check_window_desc(window);
    if (st == PKV_OK) st = pkvi_attn_check_paged_desc(kv);
    if (st == PKV_OK && (q == NULL || out == NULL)) st = PKV_ERR_INVALID_ARG;
    return st;
}

pkv_status pkvi_attn_check_mla_cuda(const pkv_attn_mla_shape *mla, const pkv_attn_paged_kv *kv,
                                    const void *q, const void *out, pkv_attn_shape *shape,
                                    pkv_attn_paged_kv *latent) {
    pkv_status st = pkvi_attn_mla_as_mqa(mla, kv, shape, latent);
    if (st == PKV_OK) st = pkvi_attn_check_shape(shape, 0); // any dims; the kernel's below
    if (st == PKV_OK) st = pkvi_attn_check_paged_desc(latent);
    if (st == PKV_OK && (q == NULL || out == NULL)) st = PKV_ERR_INVALID_ARG;
    if (st == PKV_OK && (shape->head_dim > PKVI_ATTN_CUDA_MLA_MAX_ROW ||
                         mla->latent_dim > PKVI_ATTN_CUDA_MLA_MAX_LATENT)) {
        st = PKV_ERR_UNSUPPORTED;
    }
    return st;
}

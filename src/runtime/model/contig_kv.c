// SPDX-License-Identifier: MIT
// The contiguous KV store: one fixed row of max_len slots per sequence in the
// model's device memory, the layout that paging replaces. It exists so that the
// same model code can be measured on both layouts. Invariant: len[r] <= max_len
// for every row, and slots below len[r] hold K/V written by a forward pass (or a
// row copy).
#include <stdlib.h>
#include <string.h>

#include "model_internal.h"

// Write zeros over `bytes` of model memory (host or device) through the op table's
// upload, one 1 MiB chunk at a time. This defines every slot and, on the host,
// backs every page now: an untouched page would read as the kernel's shared zero
// page, which stays in cache and would make the contiguous layout look faster
// than memory allows.
static pkv_status zero_fill(pkv_model *m, void *dst, size_t bytes) {
    const size_t chunk = (size_t)1 << 20;
    void *zeros = calloc(1, chunk);
    if (!zeros) return PKV_ERR_OUT_OF_MEMORY;
    pkv_status st = PKV_OK;
    for (size_t off = 0; off < bytes && st == PKV_OK; off += chunk) {
        size_t n = bytes - off < chunk ? bytes - off : chunk;
        st = m->ops->upload(m, (char *)dst + off, zeros, n);
    }
    free(zeros);
    return st;
}

pkv_status pkv_contig_kv_create(const pkv_model *model, uint32_t max_rows, uint32_t max_len,
                                pkv_dtype dtype, pkv_contig_kv **out) {
    if (!model || !out || max_rows == 0 || max_len == 0 || pkv_dtype_size(dtype) == 0)
        return PKV_ERR_INVALID_ARG;
    if (pkv_dtype_is_quantized(dtype)) return PKV_ERR_UNSUPPORTED; // 8-bit: paged caches only
    *out = NULL;
    const pkv_model_config *c = &model->cfg;
    uint64_t each = (uint64_t)c->num_layers * max_rows * c->num_kv_heads * max_len *
                    c->head_dim * pkv_dtype_size(dtype);
    if (each > (uint64_t)SIZE_MAX) return PKV_ERR_OUT_OF_MEMORY;
    pkv_contig_kv *kv = calloc(1, sizeof *kv);
    if (!kv) return PKV_ERR_OUT_OF_MEMORY;
    kv->model = model;
    kv->max_rows = max_rows;
    kv->max_len = max_len;
    kv->dtype = dtype;
    kv->esize = pkv_dtype_size(dtype);
    kv->bytes_each = each;
    kv->len = calloc(max_rows, sizeof *kv->len);
    pkv_model *m = (pkv_model *)model; // ops take a mutable model; alloc changes no model state
    void *k = NULL, *v = NULL;
    pkv_status st = kv->len ? m->ops->alloc(m, (size_t)each, &k) : PKV_ERR_OUT_OF_MEMORY;
    if (st == PKV_OK) st = m->ops->alloc(m, (size_t)each, &v);
    kv->k = k;
    kv->v = v;
    if (st == PKV_OK) st = zero_fill(m, k, (size_t)each);
    if (st == PKV_OK) st = zero_fill(m, v, (size_t)each);
    if (st != PKV_OK) {
        pkv_contig_kv_destroy(kv);
        return st;
    }
    *out = kv;
    return PKV_OK;
}

void pkv_contig_kv_destroy(pkv_contig_kv *kv) {
    if (!kv) return;
    pkv_model *m = (pkv_model *)kv->model;
    if (kv->k) m->ops->release(m, kv->k);
    if (kv->v) m->ops->release(m, kv->v);
    free(kv->len);
    free(kv);
}

pkv_status pkv_contig_kv_append(pkv_contig_kv *kv, uint32_t row, uint32_t n) {
    if (!kv || row >= kv->max_rows) return PKV_ERR_INVALID_ARG;
    if (n > kv->max_len - kv->len[row]) return PKV_ERR_BUFFER_TOO_SMALL;
    kv->len[row] += n;
    return PKV_OK;
}

pkv_status pkv_contig_kv_reset(pkv_contig_kv *kv, uint32_t row) {
    if (!kv || row >= kv->max_rows) return PKV_ERR_INVALID_ARG;
    kv->len[row] = 0;
    return PKV_OK;
}

pkv_status pkv_contig_kv_length(const pkv_contig_kv *kv, uint32_t row, uint32_t *len) {
    if (!kv || !len || row >= kv->max_rows) return PKV_ERR_INVALID_ARG;
    *len = kv->len[row];
    return PKV_OK;
}

pkv_status pkv_contig_kv_copy_row(pkv_contig_kv *kv, uint32_t src, uint32_t dst) {
    if (!kv || src >= kv->max_rows || dst >= kv->max_rows) return PKV_ERR_INVALID_ARG;
    if (src == dst) return PKV_OK;
    pkv_model *m = (pkv_model *)kv->model;
    const pkv_model_config *c = &m->cfg;
    const uint64_t hd = c->head_dim, head = (uint64_t)kv->max_len * hd,
                   seq = head * c->num_kv_heads, layer = seq * kv->max_rows;
    const size_t bytes = (size_t)kv->len[src] * hd * kv->esize;
    for (uint32_t l = 0; l < c->num_layers && bytes > 0; l++)
        for (uint32_t h = 0; h < c->num_kv_heads; h++) {
            uint64_t s = (l * layer + src * seq + h * head) * kv->esize,
                     d = (l * layer + dst * seq + h * head) * kv->esize;
            char *k = kv->k, *v = kv->v;
            pkv_status st = m->ops->copy(m, k + d, k + s, bytes);
            if (st == PKV_OK) st = m->ops->copy(m, v + d, v + s, bytes);
            if (st != PKV_OK) return st;
        }
    kv->len[dst] = kv->len[src];
    return PKV_OK;
}

uint64_t pkv_contig_kv_bytes(const pkv_contig_kv *kv) { return kv ? 2 * kv->bytes_each : 0; }

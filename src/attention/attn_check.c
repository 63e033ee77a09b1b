// SPDX-License-Identifier: MIT
// Argument checks shared by every attention entry point, CPU and CUDA. Invariant:
// a call that passes these checks reads and writes only inside the arrays its
// descriptors describe.
#include <math.h>

#include "attn_internal.h"

pkv_status pkvi_attn_check_shape(const pkv_attn_shape *shape, int cuda) {
    if (shape == NULL || shape->num_heads == 0 || shape->num_kv_heads == 0 ||
        shape->num_heads % shape->num_kv_heads != 0 || shape->head_dim == 0) {
        return PKV_ERR_INVALID_ARG;
    }
    if (shape->dtype != PKV_DTYPE_F32 && shape->dtype != PKV_DTYPE_F16 &&
        shape->dtype != PKV_DTYPE_BF16) {
        return PKV_ERR_INVALID_ARG;
    }
    if (!isfinite(shape->scale)) {
        return PKV_ERR_INVALID_ARG;
    }
    if (cuda) {
        uint32_t d = shape->head_dim;
        return (d == 64 || d == 128 || d == 256) ? PKV_OK : PKV_ERR_UNSUPPORTED;
    }
    return shape->head_dim <= PKV_ATTN_CPU_MAX_HEAD_DIM ? PKV_OK : PKV_ERR_UNSUPPORTED;
}

pkv_status pkvi_attn_check_paged_desc(const pkv_attn_paged_kv *kv) {
    if (kv == NULL || kv->k_cache == NULL || kv->v_cache == NULL || kv->block_tables == NULL ||
        kv->seq_lens == NULL || kv->block_size == 0 || kv->num_blocks == 0 ||
        kv->max_blocks_per_seq == 0 || kv->num_blocks > (uint32_t)INT32_MAX) {
        return PKV_ERR_INVALID_ARG;
    }
    return PKV_OK;
}

pkv_status pkvi_attn_check_paged_tables(const pkv_attn_paged_kv *kv, uint32_t num_seqs) {
    uint64_t cap = (uint64_t)kv->max_blocks_per_seq * kv->block_size;
    for (uint32_t s = 0; s < num_seqs; s++) {
        int32_t len = kv->seq_lens[s];
        if (len < 1 || (uint64_t)len > cap) {
            return PKV_ERR_INVALID_ARG;
        }
        uint32_t nb = (uint32_t)(((uint64_t)len + kv->block_size - 1) / kv->block_size);
        const int32_t *row = kv->block_tables + (size_t)s * kv->max_blocks_per_seq;
        for (uint32_t b = 0; b < nb; b++) {
            if (row[b] < 0 || (uint32_t)row[b] >= kv->num_blocks) {
                return PKV_ERR_INVALID_ARG;
            }
        }
    }
    return PKV_OK;
}

pkv_status pkvi_attn_check_contig_desc(const pkv_attn_contig_kv *kv) {
    if (kv == NULL || kv->k_cache == NULL || kv->v_cache == NULL || kv->seq_lens == NULL ||
        kv->max_seq_len == 0) {
        return PKV_ERR_INVALID_ARG;
    }
    return PKV_OK;
}

pkv_status pkvi_attn_check_contig_lens(const pkv_attn_contig_kv *kv, uint32_t num_seqs) {
    for (uint32_t s = 0; s < num_seqs; s++) {
        int32_t len = kv->seq_lens[s];
        if (len < 1 || (uint32_t)len > kv->max_seq_len) {
            return PKV_ERR_INVALID_ARG;
        }
        if (kv->seq_offsets != NULL && kv->seq_offsets[s] < 0) {
            return PKV_ERR_INVALID_ARG;
        }
    }
    return PKV_OK;
}

pkv_status pkvi_attn_check_prefill(const int32_t *seq_lens, uint32_t num_seqs,
                                   const int32_t *q_indptr) {
    if (q_indptr == NULL || q_indptr[0] != 0) {
        return PKV_ERR_INVALID_ARG;
    }
    for (uint32_t s = 0; s < num_seqs; s++) {
        int64_t n = (int64_t)q_indptr[s + 1] - q_indptr[s];
        if (n < 0 || n > seq_lens[s]) {
            return PKV_ERR_INVALID_ARG;
        }
    }
    return PKV_OK;
}

pkv_status pkvi_attn_check_write_args(const pkv_attn_shape *shape, const void *k,
                                      const void *v, const int64_t *slots, const void *k_cache,
                                      const void *v_cache, uint32_t block_size,
                                      uint32_t num_blocks) {
    if (shape == NULL || k == NULL || v == NULL || slots == NULL || k_cache == NULL ||
        v_cache == NULL || block_size == 0 || num_blocks == 0) {
        return PKV_ERR_INVALID_ARG;
    }
    if (shape->num_kv_heads == 0 || shape->head_dim == 0 ||
        pkv_dtype_size(shape->dtype) == 0 || pkv_dtype_is_quantized(shape->dtype)) {
        return PKV_ERR_INVALID_ARG;
    }
    return PKV_OK;
}

pkv_status pkvi_attn_check_copy_args(pkv_dtype dtype, const void *base, uint32_t num_layers,
                                     uint64_t block_stride, uint64_t block_elems,
                                     uint32_t num_blocks, const pkv_block_copy *copies) {
    if (pkv_dtype_size(dtype) == 0 || base == NULL || copies == NULL || num_layers == 0 ||
        block_elems == 0 || block_elems > block_stride || num_blocks == 0) {
        return PKV_ERR_INVALID_ARG;
    }
    return PKV_OK;
}

pkv_status pkvi_attn_check_quant(const pkv_attn_kv_quant *qz) {
    if (qz == NULL) {
        return PKV_ERR_INVALID_ARG;
    }
    if (qz->kv_dtype == PKV_DTYPE_INT8) {
        return PKV_OK;
    }
    if (qz->kv_dtype != PKV_DTYPE_FP8_E4M3 && qz->kv_dtype != PKV_DTYPE_FP8_E5M2) {
        return PKV_ERR_INVALID_ARG;
    }
    // fp8 scales divide on the way in and multiply on the way out: finite, > 0.
    if (!(qz->k_scale > 0.0f) || !isfinite(qz->k_scale) || !(qz->v_scale > 0.0f) ||
        !isfinite(qz->v_scale)) {
        return PKV_ERR_INVALID_ARG;
    }
    return PKV_OK;
}

pkv_status pkvi_attn_check_cpu_paged(const pkv_attn_shape *shape, const pkv_attn_kv_quant *quant,
                                     int quantized, const pkv_attn_paged_kv *kv, uint32_t num_seqs,
                                     const void *q, const void *out, int prefill,
                                     const int32_t *q_indptr) {
    pkv_status st = pkvi_attn_check_shape(shape, 0);
    if (st == PKV_OK && quantized) st = pkvi_attn_check_quant(quant);
    if (st == PKV_OK) st = pkvi_attn_check_paged_desc(kv);
    if (st == PKV_OK && (q == NULL || out == NULL || (prefill && q_indptr == NULL))) {
        st = PKV_ERR_INVALID_ARG;
    }
    if (st == PKV_OK) st = pkvi_attn_check_paged_tables(kv, num_seqs);
    if (st == PKV_OK && prefill) st = pkvi_attn_check_prefill(kv->seq_lens, num_seqs, q_indptr);
    return st;
}

pkv_status pkvi_attn_check_cpu_contig(const pkv_attn_shape *shape, const pkv_attn_kv_quant *quant,
                                      int quantized, const pkv_attn_contig_kv *kv, uint32_t num_seqs,
                                      const void *q, const void *out, int prefill,
                                      const int32_t *q_indptr) {
    pkv_status st = pkvi_attn_check_shape(shape, 0);
    if (st == PKV_OK && quantized) st = pkvi_attn_check_quant(quant);
    if (st == PKV_OK) st = pkvi_attn_check_contig_desc(kv);
    if (st == PKV_OK && (q == NULL || out == NULL || (prefill && q_indptr == NULL))) {
        st = PKV_ERR_INVALID_ARG;
    }
    if (st == PKV_OK) st = pkvi_attn_check_contig_lens(kv, num_seqs);
    if (st == PKV_OK && prefill) st = pkvi_attn_check_prefill(kv->seq_lens, num_seqs, q_indptr);
    return st;
}

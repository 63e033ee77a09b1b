// SPDX-License-Identifier: MIT
// The CUDA attention entry points of a build without CUDA: same symbols, every
// call returns PKV_ERR_UNSUPPORTED, so engines link the same API everywhere.
#include "attn_internal.h"

pkv_status pkv_attn_decode_paged_cuda(const pkv_attn_shape *shape, uint32_t num_seqs,
                                      const void *q, const pkv_attn_paged_kv *kv, void *out,
                                      void *stream) {
    (void)shape, (void)num_seqs, (void)q, (void)kv, (void)out, (void)stream;
    return PKV_ERR_UNSUPPORTED;
}

pkv_status pkv_attn_decode_contig_cuda(const pkv_attn_shape *shape, uint32_t num_seqs,
                                       const void *q, const pkv_attn_contig_kv *kv, void *out,
                                       void *stream) {
    (void)shape, (void)num_seqs, (void)q, (void)kv, (void)out, (void)stream;
    return PKV_ERR_UNSUPPORTED;
}

pkv_status pkv_attn_decode_paged_cuda_ex(const pkv_attn_shape *shape, uint32_t num_seqs,
                                         const void *q, const pkv_attn_paged_kv *kv,
                                         void *out, const pkv_attn_cuda_opts *opts,
                                         void *stream) {
    (void)shape, (void)num_seqs, (void)q, (void)kv, (void)out, (void)opts, (void)stream;
    return PKV_ERR_UNSUPPORTED;
}

pkv_status pkv_attn_decode_contig_cuda_ex(const pkv_attn_shape *shape, uint32_t num_seqs,
                                          const void *q, const pkv_attn_contig_kv *kv,
                                          void *out, const pkv_attn_cuda_opts *opts,
                                          void *stream) {
    (void)shape, (void)num_seqs, (void)q, (void)kv, (void)out, (void)opts, (void)stream;
    return PKV_ERR_UNSUPPORTED;
}

pkv_status pkv_attn_cache_write_cuda(const pkv_attn_shape *shape, uint32_t num_tokens,
                                     const void *k, const void *v, const int64_t *slots,
                                     void *k_cache, void *v_cache, uint64_t block_stride,
                                     uint64_t head_stride, uint64_t token_stride,
                                     uint32_t block_size, uint32_t num_blocks, void *stream) {
    (void)shape, (void)num_tokens, (void)k, (void)v, (void)slots, (void)k_cache;
    (void)v_cache, (void)block_stride, (void)head_stride, (void)token_stride;
    (void)block_size, (void)num_blocks, (void)stream;
    return PKV_ERR_UNSUPPORTED;
}

pkv_status pkv_attn_prefill_paged_cuda(const pkv_attn_shape *shape, uint32_t num_seqs,
                                       const int32_t *q_indptr, const void *q,
                                       const pkv_attn_paged_kv *kv, void *out, void *stream) {
    (void)shape, (void)num_seqs, (void)q_indptr, (void)q, (void)kv, (void)out, (void)stream;
    return PKV_ERR_UNSUPPORTED;
}

pkv_status pkv_attn_prefill_paged_cuda_ex(const pkv_attn_shape *shape, uint32_t num_seqs,
                                          const int32_t *q_indptr, uint32_t num_rows,
                                          const void *q, const pkv_attn_paged_kv *kv, void *out,
                                          void *stream) {
    (void)shape, (void)num_seqs, (void)q_indptr, (void)num_rows, (void)q, (void)kv, (void)out;
    (void)stream;
    return PKV_ERR_UNSUPPORTED;
}

pkv_status pkv_attn_prefill_contig_cuda_ex(const pkv_attn_shape *shape, uint32_t num_seqs,
                                           const int32_t *q_indptr, uint32_t num_rows,
                                           const void *q, const pkv_attn_contig_kv *kv,
                                           void *out, void *stream) {
    (void)shape, (void)num_seqs, (void)q_indptr, (void)num_rows, (void)q, (void)kv, (void)out;
    (void)stream;
    return PKV_ERR_UNSUPPORTED;
}

pkv_status pkv_attn_copy_blocks_cuda(pkv_dtype dtype, void *base, uint32_t num_layers,
                                     uint64_t layer_stride, uint64_t block_stride,
                                     uint64_t block_elems, uint32_t num_blocks,
                                     const pkv_block_copy *copies, uint32_t num_copies,
                                     void *stream) {
    (void)dtype, (void)base, (void)num_layers, (void)layer_stride, (void)block_stride;
    (void)block_elems, (void)num_blocks, (void)copies, (void)num_copies, (void)stream;
    return PKV_ERR_UNSUPPORTED;
}

// 8-bit KV (attn_quant.cu in a CUDA build): the same argument checks as there,
// then PKV_ERR_UNSUPPORTED.
pkv_status pkv_attn_decode_paged_quant_cuda(const pkv_attn_shape *shape,
                                            const pkv_attn_kv_quant *quant, uint32_t num_seqs,
                                            const void *q, const pkv_attn_paged_kv *kv,
                                            void *out, void *stream) {
    (void)num_seqs, (void)stream;
    pkv_status st = pkvi_attn_check_shape(shape, 1);
    if (st == PKV_OK) st = pkvi_attn_check_quant(quant);
    if (st == PKV_OK) st = pkvi_attn_check_paged_desc(kv);
    if (st == PKV_OK && (q == NULL || out == NULL)) st = PKV_ERR_INVALID_ARG;
    return st != PKV_OK ? st : PKV_ERR_UNSUPPORTED;
}

pkv_status pkv_attn_prefill_paged_quant_cuda(const pkv_attn_shape *shape,
                                             const pkv_attn_kv_quant *quant, uint32_t num_seqs,
                                             const int32_t *q_indptr, const void *q,
                                             const pkv_attn_paged_kv *kv, void *out,
                                             void *stream) {
    (void)num_seqs, (void)stream;
    pkv_status st = pkvi_attn_check_shape(shape, 1);
    if (st == PKV_OK) st = pkvi_attn_check_quant(quant);
    if (st == PKV_OK) st = pkvi_attn_check_paged_desc(kv);
    if (st == PKV_OK && (q == NULL || out == NULL || q_indptr == NULL)) st = PKV_ERR_INVALID_ARG;
    return st != PKV_OK ? st : PKV_ERR_UNSUPPORTED;
}

pkv_status pkv_attn_decode_contig_quant_cuda(const pkv_attn_shape *shape,
                                             const pkv_attn_kv_quant *quant, uint32_t num_seqs,
                                             const void *q, const pkv_attn_contig_kv *kv,
                                             void *out, void *stream) {
    (void)num_seqs, (void)stream;
    pkv_status st = pkvi_attn_check_shape(shape, 1);
    if (st == PKV_OK) st = pkvi_attn_check_quant(quant);
    if (st == PKV_OK) st = pkvi_attn_check_contig_desc(kv);
    if (st == PKV_OK && (q == NULL || out == NULL)) st = PKV_ERR_INVALID_ARG;
    return st != PKV_OK ? st : PKV_ERR_UNSUPPORTED;
}

pkv_status pkv_attn_decode_paged_quant_cuda_ex(const pkv_attn_shape *shape,
                                               const pkv_attn_kv_quant *quant,
                                               uint32_t num_seqs, const void *q,
                                               const pkv_attn_paged_kv *kv, void *out,
                                               const pkv_attn_cuda_opts *opts, void *stream) {
    (void)opts;
    return pkv_attn_decode_paged_quant_cuda(shape, quant, num_seqs, q, kv, out, stream);
}

pkv_status pkv_attn_decode_contig_quant_cuda_ex(const pkv_attn_shape *shape,
                                                const pkv_attn_kv_quant *quant,
                                                uint32_t num_seqs, const void *q,
                                                const pkv_attn_contig_kv *kv, void *out,
                                                const pkv_attn_cuda_opts *opts, void *stream) {
    (void)opts;
    return pkv_attn_decode_contig_quant_cuda(shape, quant, num_seqs, q, kv, out, stream);
}

pkv_status pkv_attn_prefill_paged_quant_cuda_ex(const pkv_attn_shape *shape,
                                                const pkv_attn_kv_quant *quant,
                                                uint32_t num_seqs, const int32_t *q_indptr,
                                                uint32_t num_rows, const void *q,
                                                const pkv_attn_paged_kv *kv, void *out,
                                                void *stream) {
    (void)num_rows;
    return pkv_attn_prefill_paged_quant_cuda(shape, quant, num_seqs, q_indptr, q, kv, out,
                                             stream);
}

pkv_status pkv_attn_prefill_contig_quant_cuda_ex(const pkv_attn_shape *shape,
                                                 const pkv_attn_kv_quant *quant,
                                                 uint32_t num_seqs, const int32_t *q_indptr,
                                                 uint32_t num_rows, const void *q,
                                                 const pkv_attn_contig_kv *kv, void *out,
                                                 void *stream) {
    (void)num_rows;
    pkv_status st = pkv_attn_decode_contig_quant_cuda(shape, quant, num_seqs, q, kv, out, stream);
    if (st == PKV_ERR_UNSUPPORTED && q_indptr == NULL) st = PKV_ERR_INVALID_ARG;
    return st;
}

pkv_status pkv_attn_cache_write_quant_cuda(const pkv_attn_shape *shape,
                                           const pkv_attn_kv_quant *quant, uint32_t num_tokens,
                                           const void *k, const void *v, const int64_t *slots,
                                           void *k_cache, void *v_cache, uint64_t block_stride,
                                           uint64_t head_stride, uint64_t token_stride,
                                           uint32_t block_size, uint32_t num_blocks,
                                           void *stream) {
    (void)num_tokens, (void)block_stride, (void)head_stride, (void)token_stride, (void)stream;
    pkv_status st = pkvi_attn_check_write_args(shape, k, v, slots, k_cache, v_cache, block_size,
                                               num_blocks);
    if (st == PKV_OK) st = pkvi_attn_check_quant(quant);
    return st != PKV_OK ? st : PKV_ERR_UNSUPPORTED;
}

// Window / sink and MLA decode (attn_window.cu in a CUDA build): the host-side
// argument checks of the CUDA calls, then PKV_ERR_UNSUPPORTED.
pkv_status pkv_attn_decode_paged_window_cuda(const pkv_attn_shape *shape,
                                             const pkv_attn_window *window, uint32_t num_seqs,
                                             const void *q, const pkv_attn_paged_kv *kv,
                                             void *out, void *stream) {
    (void)num_seqs, (void)stream;
    pkv_status st = pkvi_attn_check_window_cuda(shape, window, kv, q, out);
    return st != PKV_OK ? st : PKV_ERR_UNSUPPORTED;
}

pkv_status pkv_attn_decode_mla_paged_cuda(const pkv_attn_mla_shape *shape, uint32_t num_seqs,
                                          const void *q, const pkv_attn_paged_kv *kv, void *out,
                                          void *stream) {
    (void)num_seqs, (void)stream;
    pkv_attn_shape sh;
    pkv_attn_paged_kv latent;
    pkv_status st = pkvi_attn_check_mla_cuda(shape, kv, q, out, &sh, &latent);
    return st != PKV_OK ? st : PKV_ERR_UNSUPPORTED;
}

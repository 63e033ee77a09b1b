// SPDX-License-Identifier: MIT
// Private prototypes of src/attention, grouped by the file that defines them.
// Argument checks live in one place so that the CPU functions and the CUDA
// launchers refuse exactly the same inputs.
#ifndef PKV_ATTN_INTERNAL_H
#define PKV_ATTN_INTERNAL_H

#include <stddef.h>
#include <stdint.h>

#include "pkv/attention.h"

#ifdef __cplusplus
extern "C" {
#endif

// CUDA decode: query heads handled by one thread block (a GQA group larger than
// this is cut into several head groups, each reading the K/V blocks once).
#define PKVI_ATTN_CUDA_MAX_GROUP 8u
// CUDA split-K: smallest partition, largest number of partitions.
#define PKVI_ATTN_MIN_PARTITION 512u
#define PKVI_ATTN_MAX_SPLITS 64u
// The split plan's fixed cost of one thread block, in token rows (one kernel tile):
// a modelled figure (docs/KERNELS.md), not a measured one.
#define PKVI_ATTN_BLOCK_COST 128u

// The prompt whose packed rows contain row r of a prefill (q_indptr is
// non-decreasing): the CPU drivers' map from a query row to its sequence.
static inline uint32_t pkvi_attn_find_seq(const int32_t *q_indptr, uint32_t num_seqs, int64_t r) {
    uint32_t lo = 0;
    uint32_t hi = num_seqs; // invariant: q_indptr[lo] <= r < q_indptr[hi]
    while (hi - lo > 1) {
        uint32_t mid = lo + (hi - lo) / 2;
        if (q_indptr[mid] <= r) {
            lo = mid;
        } else {
            hi = mid;
        }
    }
    return lo;
}

// ---- attn_check.c ----
// Shape: non-NULL, heads >= 1 and kv heads divide them, a known dtype, a finite
// scale, head_dim in 1..PKV_ATTN_CPU_MAX_HEAD_DIM (cuda = 0) or one of 64/128/256
// (cuda = 1, else PKV_ERR_UNSUPPORTED).
pkv_status pkvi_attn_check_shape(const pkv_attn_shape *shape, int cuda);
// Paged descriptor without its host-side tables (pointers non-NULL, sizes >= 1).
pkv_status pkvi_attn_check_paged_desc(const pkv_attn_paged_kv *kv);
// Every sequence's length (1..max_blocks_per_seq * block_size) and every block id
// it uses (0..num_blocks-1); tables in host memory.
pkv_status pkvi_attn_check_paged_tables(const pkv_attn_paged_kv *kv, uint32_t num_seqs);
pkv_status pkvi_attn_check_contig_desc(const pkv_attn_contig_kv *kv);
pkv_status pkvi_attn_check_contig_lens(const pkv_attn_contig_kv *kv, uint32_t num_seqs);
// Prefill: q_indptr[0] == 0, non-decreasing, prompt i no longer than seq_lens[i].
pkv_status pkvi_attn_check_prefill(const int32_t *seq_lens, uint32_t num_seqs,
                                   const int32_t *q_indptr);
// Every check of a CPU decode (q_indptr NULL) or prefill call, in the order the
// calls document: shape, the 8-bit description (quantized: quant must be valid), the cache
// descriptor, q / out / q_indptr, lengths and block ids, the prompt rows.
pkv_status pkvi_attn_check_cpu_paged(const pkv_attn_shape *shape, const pkv_attn_kv_quant *quant,
                                     int quantized, const pkv_attn_paged_kv *kv, uint32_t num_seqs,
                                     const void *q, const void *out, int prefill,
                                     const int32_t *q_indptr);
pkv_status pkvi_attn_check_cpu_contig(const pkv_attn_shape *shape, const pkv_attn_kv_quant *quant,
                                      int quantized, const pkv_attn_contig_kv *kv, uint32_t num_seqs,
                                      const void *q, const void *out, int prefill,
                                      const int32_t *q_indptr);
// Cache write scalars (pointers, sizes); slots are checked by the caller.
pkv_status pkvi_attn_check_write_args(const pkv_attn_shape *shape, const void *k,
                                      const void *v, const int64_t *slots, const void *k_cache,
                                      const void *v_cache, uint32_t block_size,
                                      uint32_t num_blocks);
pkv_status pkvi_attn_check_copy_args(pkv_dtype dtype, const void *base, uint32_t num_layers,
                                     uint64_t block_stride, uint64_t block_elems,
                                     uint32_t num_blocks, const pkv_block_copy *copies);

// 8-bit cache descriptor: a known 8-bit dtype, fp8 scales finite and > 0.
pkv_status pkvi_attn_check_quant(const pkv_attn_kv_quant *quant);

// ---- defined in attn_cpu.c, shared with attn_cpu_quant.c ----
// Query heads per CPU work item (a larger GQA group is cut to a divisor that fits).
#define PKVI_ATTN_CPU_MAX_GROUP 32u
// Query heads one work item computes: the whole GQA group when its scratch fits
// (PKV_ATTN_CPU_MAX_HEAD_DIM floats per head), else the largest divisor that does.
uint32_t pkvi_attn_cpu_item_group(const pkv_attn_shape *shape);
// Bytes one kv head of a paged cache reads in place before jumping to another
// block (es: bytes per element), or 0 when adjacent heads' runs are not back to back.
size_t pkvi_attn_cpu_head_run(const pkv_attn_paged_kv *kv, size_t es, uint32_t head_dim);
// Adjacent kv heads per work item, so that short per-head runs become one long run
// (1 when run_bytes is 0, the group is cut into sub-groups, or threads need items).
#define PKVI_ATTN_CPU_RUN_BYTES 65536u
uint32_t pkvi_attn_cpu_item_heads(const pkv_attn_shape *shape, uint32_t group, uint64_t rows,
                                  size_t run_bytes);
// OpenMP threads for `items` work items: shape->num_threads (0 = all), at most items.
int pkvi_attn_cpu_thread_count(const pkv_attn_shape *shape, uint64_t items);

// What the window, sink and MLA calls (attn_cpu_window.c, attn_cpu_mla.c) change in
// the CPU driver: each query's span of the context and the V width.
typedef struct pkvi_attn_cpu_opts {
    pkv_attn_window_kind kind; // which tokens a query sees (pkvi_attn_window_begin)
    uint32_t window;
    const float *sinks;        // [num_heads] sink logits, or NULL
    uint32_t v_dim;            // 0: head_dim; MLA: latent_dim (V = the K row's first v_dim)
} pkvi_attn_cpu_opts;
// Decode (q_indptr NULL) or prefill with opts, after the caller's checks.
void pkvi_attn_cpu_run_paged(const pkv_attn_shape *shape, const pkvi_attn_cpu_opts *opts,
                             uint32_t num_seqs, const int32_t *q_indptr, const void *q,
                             const pkv_attn_paged_kv *kv, void *out);
void pkvi_attn_cpu_run_contig(const pkv_attn_shape *shape, const pkvi_attn_cpu_opts *opts,
                              uint32_t num_seqs, const int32_t *q_indptr, const void *q,
                              const pkv_attn_contig_kv *kv, void *out);

// The first token a query at position p sees (pkv_attn_window_kind's rule); the
// window must be >= 1 for SLIDING and CHUNKED. Shared by the CPU driver, the
// checks and the CUDA kernel (attn_window.cu) so that they agree on every boundary.
#ifdef __CUDACC__
#define PKVI_HOST_DEVICE __host__ __device__
#else
#define PKVI_HOST_DEVICE
#endif
PKVI_HOST_DEVICE static inline uint32_t pkvi_attn_window_begin(pkv_attn_window_kind kind,
                                                               uint32_t window, uint32_t p) {
    if (kind == PKV_ATTN_WINDOW_SLIDING) {
        return p >= window ? p - window + 1u : 0u;
    }
    if (kind == PKV_ATTN_WINDOW_CHUNKED) {
        return p / window * window;
    }
    return 0u;
}

// ---- attn_cpu_window.c ----
// An MLA call as the multi-query attention it is: one kv head of head_dim =
// latent_dim + rope_dim, v_cache = k_cache. Checks only what the conversion needs
// (non-NULL, latent_dim >= 1, the sum fits); the shape and cache checks follow.
pkv_status pkvi_attn_mla_as_mqa(const pkv_attn_mla_shape *mla, const pkv_attn_paged_kv *kv,
                                pkv_attn_shape *shape, pkv_attn_paged_kv *latent);

// ---- attn_check_window.c ----
// A window description: known kind, window >= 1 where used (the CUDA calls: the
// sinks are in device memory and not read on the host).
pkv_status pkvi_attn_check_window_desc(const pkv_attn_window *window);
// The same and finite sinks (num_heads of them, host memory).
pkv_status pkvi_attn_check_window(const pkv_attn_window *window, uint32_t num_heads);
// Host-side checks of the CUDA window and MLA calls (the stubs of a build without
// CUDA run them too): shape (cuda head dims), window kind, descriptor, q / out.
// MLA: also its conversion (as pkvi_attn_mla_as_mqa, into *shape / *latent) and
// the kernel's largest rows, else PKV_ERR_UNSUPPORTED.
#define PKVI_ATTN_CUDA_MLA_MAX_ROW 576u    // latent_dim + rope_dim
#define PKVI_ATTN_CUDA_MLA_MAX_LATENT 512u
pkv_status pkvi_attn_check_window_cuda(const pkv_attn_shape *shape, const pkv_attn_window *window,
                                       const pkv_attn_paged_kv *kv, const void *q,
                                       const void *out);
pkv_status pkvi_attn_check_mla_cuda(const pkv_attn_mla_shape *mla, const pkv_attn_paged_kv *kv,
                                    const void *q, const void *out, pkv_attn_shape *shape,
                                    pkv_attn_paged_kv *latent);
// Paged tables under a window: every length in 1..max_blocks_per_seq * block_size
// and every block id from the first block that the earliest query's window
// touches (decode, q_indptr NULL: the last token's; prefill: the prompt's first
// row's) through the last token's block in 0..num_blocks-1. Entries before that
// block are not read. Prefill: q_indptr must have passed pkvi_attn_check_prefill.
pkv_status pkvi_attn_check_window_tables(const pkv_attn_paged_kv *kv, uint32_t num_seqs,
                                         const pkv_attn_window *window,
                                         const int32_t *q_indptr);

// ---- attn_plan.c ----
// Query heads per thread block and head groups per kv head on CUDA.
void pkvi_attn_cuda_groups(const pkv_attn_shape *shape, uint32_t *heads_per_cta,
                           uint32_t *groups_per_kv_head);
// Tokens per split-K partition for a context bound and a number of splits (a
// multiple of 256), and the number of partitions that it actually gives.
void pkvi_attn_partition(uint32_t max_context, uint32_t num_splits, uint32_t *part_len,
                         uint32_t *parts);
// Context partitions (1..min(max_context / 512, 64, max_splits)) for which num_seqs x kv heads x
// head groups x partitions thread blocks fill whole waves of blocks_per_sm x num_sms
// resident blocks best: the least modelled time (waves x (partition + block cost)),
// the fewest partitions on a tie. max_splits: the most the caller's workspace holds.
// pkv_attn_cuda_num_splits is this with blocks_per_sm = 2 and no workspace limit; the
// launchers pass the launched kernel's real occupancy and their workspace's limit.
pkv_status pkvi_attn_num_splits(const pkv_attn_shape *shape, uint32_t num_seqs,
                                uint32_t max_context, uint32_t num_sms, uint32_t blocks_per_sm,
                                uint32_t max_splits, uint32_t *num_splits);

#ifdef __cplusplus
}
#endif

#endif // PKV_ATTN_INTERNAL_H

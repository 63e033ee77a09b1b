// SPDX-License-Identifier: MIT
// Attention over the KV cache, one layer per call: decode (one query token per
// sequence) over a paged cache and over a contiguous cache with the same math,
// causal prefill through the paged cache, writing new tokens' K/V into their
// slots, and the CPU and CUDA implementations of each.
//
// Conventions for every function here:
// - q, out and the cache share one dtype (fp32, fp16 or bf16); softmax and
//   accumulation are fp32 with an online (running-max) softmax. The *_quant calls
//   (end of this file) take an 8-bit cache (int8, fp8_e4m3, fp8_e5m2) instead.
// - Heads: num_heads query heads, num_kv_heads K/V heads, num_kv_heads divides
//   num_heads (MHA, GQA, MQA). Query head h reads kv head h / (num_heads / num_kv_heads).
// - Strides are in elements. For a pkv_cache, pass for layer l
//     k_cache = data + layer_stride * l,  v_cache = k_cache + kv_stride,
//   and block_stride / head_stride / token_stride from pkv_cache_get_geometry.
// - CPU functions take host pointers; *_cuda functions take device pointers and a
//   cudaStream_t passed as void* (NULL = default stream) and return
//   PKV_ERR_UNSUPPORTED in a build without CUDA. No function allocates on its hot path.
// - Bad arguments (NULL pointers, heads that do not divide, a length that needs more
//   blocks than max_blocks_per_seq, a block id outside 0..num_blocks-1) return
//   PKV_ERR_INVALID_ARG and read nothing out of bounds.
// - A head_dim or block size that this implementation does not support (see the
//   fields below) returns PKV_ERR_UNSUPPORTED. *_cuda launch failures return
//   PKV_ERR_BACKEND. Device-side tables (block_tables, seq_lens, slots, copies of
//   the *_cuda calls) cannot be checked before launch: the kernels bound-check every
//   id they read, skip what is out of range and write NaN into the output rows of a
//   sequence whose length or block ids are invalid, so nothing outside the arrays
//   is touched.
//
// Thread-safety: the functions are reentrant; the CPU ones use up to `num_threads`
// threads (0 = all cores) for (sequence, head) pairs.
#ifndef PKV_ATTENTION_H
#define PKV_ATTENTION_H

#include <stddef.h>
#include <stdint.h>

#include "pkv/cache.h"
#include "pkv/status.h"

#ifdef __cplusplus
extern "C" {
#endif

// Largest head_dim of the CPU functions (their fp32 scratch lives on the stack).
#define PKV_ATTN_CPU_MAX_HEAD_DIM 4096u

// An 8-bit KV cache, as the attention calls read and write it (one layer). Scales
// dequantize: x ~ stored value x scale. The int8 scales sit beside the data they
// scale, at the same base address as the rows (no separate array): for K, the
// fp32 scale of (block b, kv head h, token t) is at byte
//   k_cache + block_stride * b + scale_offset + 4 * (scale_head_stride * h
//   + scale_token_stride * t)
// (V likewise from v_cache; contiguous caches: seq_stride * s, or seq_offsets[s],
// for block_stride * b).
// For a pkv_cache take scale_offset and the scale strides from its geometry.
typedef struct pkv_attn_kv_quant {
    pkv_dtype kv_dtype;          // PKV_DTYPE_INT8, PKV_DTYPE_FP8_E4M3 or PKV_DTYPE_FP8_E5M2
    float k_scale;               // fp8: per-tensor K scale (> 0, finite); int8: unused
    float v_scale;               // fp8: per-tensor V scale
    uint64_t scale_offset;       // int8: bytes from a block's (sequence's) K/V base to
                                 // its scales; must keep them 4-byte aligned
    uint64_t scale_head_stride;  // int8: floats between kv heads' scales
    uint64_t scale_token_stride; // int8: floats between tokens' scales
} pkv_attn_kv_quant;

// The shape of one attention call. Plain data, filled by the caller.
typedef struct pkv_attn_shape {
    uint32_t num_heads;    // query heads
    uint32_t num_kv_heads; // K/V heads; divides num_heads
    uint32_t head_dim;     // 64, 128 or 256 on CUDA; 1..PKV_ATTN_CPU_MAX_HEAD_DIM on the CPU
    pkv_dtype dtype;       // of q, out and the cache
    float scale;           // softmax scale, usually 1 / sqrt(head_dim)
    uint32_t num_threads;  // CPU only: 0 = all cores
} pkv_attn_shape;

// A paged cache of one layer, as attention reads it.
typedef struct pkv_attn_paged_kv {
    const void *k_cache;          // block b's K at k_cache + block_stride * b
    const void *v_cache;          // block b's V at v_cache + block_stride * b
    uint64_t block_stride;        // elements between consecutive blocks
    uint64_t head_stride;         // elements between kv heads inside a block
    uint64_t token_stride;        // elements between tokens inside a block
    uint32_t block_size;          // tokens per block (any >= 1 on the CPU; power of two
                                  // up to 256 on CUDA)
    uint32_t num_blocks;          // blocks in the cache (ids must be below it)
    const int32_t *block_tables;  // [num_seqs][max_blocks_per_seq]
    uint32_t max_blocks_per_seq;  // row width of block_tables
    const int32_t *seq_lens;      // [num_seqs], tokens of context per sequence (>= 1)
} pkv_attn_paged_kv;

// A contiguous cache of one layer: sequence s, kv head h, token t, dim d at
// base + row(s) + head_stride * h + token_stride * t + d, where row(s) is
// seq_stride * s (default layout [seq][kv_head][max_seq_len][head_dim]) or, when
// seq_offsets is set, seq_offsets[s]: rows of different capacities carved from
// one arena (e.g. [kv_head][arena_tokens][head_dim], a sequence's row starting at
// its first token slot), in any order, as an engine's contiguous allocator
// places them. Zero-initialize the struct ({0}) so that new fields stay unset.
typedef struct pkv_attn_contig_kv {
    const void *k_cache;
    const void *v_cache;
    uint64_t seq_stride;          // unused when seq_offsets is set
    uint64_t head_stride;
    uint64_t token_stride;
    uint32_t max_seq_len;         // capacity per sequence; seq_lens must not exceed it
    const int32_t *seq_lens;      // [num_seqs]
    const int64_t *seq_offsets;   // [num_seqs] elements from k_cache (and v_cache) to
                                  // sequence s's row, >= 0; NULL = seq_stride * s.
                                  // Device memory for the *_cuda calls; the caller
                                  // guarantees that each row lies in the cache (the
                                  // CPU calls refuse a negative offset; the CUDA ones
                                  // write NaN rows for a negative or, for 16-byte
                                  // loads, misaligned one)
} pkv_attn_contig_kv;

// Decode: out[s][h][:] = softmax(scale * q[s][h] . K[s][kvh][0..len-1]) V[s][kvh].
// q, out: [num_seqs][num_heads][head_dim] (borrowed; out is written). num_seqs 0
// does nothing and returns PKV_OK.
pkv_status pkv_attn_decode_paged_cpu(const pkv_attn_shape *shape, uint32_t num_seqs,
                                     const void *q, const pkv_attn_paged_kv *kv, void *out);
pkv_status pkv_attn_decode_contig_cpu(const pkv_attn_shape *shape, uint32_t num_seqs,
                                      const void *q, const pkv_attn_contig_kv *kv, void *out);

// Cache write: token i's K/V (k, v: [num_tokens][num_kv_heads][head_dim]) goes to
// slot slots[i] = block * block_size + offset of the paged cache. A negative slot
// means "skip" (padding). k_cache / v_cache are written, so non-const here.
pkv_status pkv_attn_cache_write_cpu(const pkv_attn_shape *shape, uint32_t num_tokens,
                                    const void *k, const void *v, const int64_t *slots,
                                    void *k_cache, void *v_cache, uint64_t block_stride,
                                    uint64_t head_stride, uint64_t token_stride,
                                    uint32_t block_size, uint32_t num_blocks);

// Causal prefill for a batch of prompts of different lengths, through the paged
// cache. The prompts' tokens are packed: q, out [total_tokens][num_heads][head_dim],
// with prompt i at rows q_indptr[i]..q_indptr[i+1]-1 (q_indptr: [num_seqs + 1]).
// Prompt i's tokens are the LAST (q_indptr[i+1]-q_indptr[i]) tokens of its
// sequence of kv->seq_lens[i] tokens, whose K/V must already be in the cache
// (pkv_attn_cache_write_cpu first); token j of the prompt attends to every
// cached token up to and including itself.
pkv_status pkv_attn_prefill_paged_cpu(const pkv_attn_shape *shape, uint32_t num_seqs,
                                      const int32_t *q_indptr, const void *q,
                                      const pkv_attn_paged_kv *kv, void *out);
// The same causal prefill through a contiguous cache (rows at a fixed stride or at
// seq_offsets): the layout comparison's prefill twin, bit-identical to the paged
// call on the same data.
pkv_status pkv_attn_prefill_contig_cpu(const pkv_attn_shape *shape, uint32_t num_seqs,
                                       const int32_t *q_indptr, const void *q,
                                       const pkv_attn_contig_kv *kv, void *out);

// CUDA twins: same arguments and semantics, device pointers (q, out, caches, every
// table), `stream` is a cudaStream_t (NULL = default). They launch asynchronously
// on `stream`, except pkv_attn_prefill_paged_cuda, which reads the packed row count
// q_indptr[num_seqs] back from the device and so synchronizes `stream` once
// (pkv_attn_prefill_paged_cuda_ex takes it from the caller instead). A launch
// error is reported as PKV_ERR_BACKEND and cleared; an error that was already
// pending before the call (someone else's) is left pending, untouched.
// q, out, the caches and every stride must allow 16-byte vector access (16-byte
// aligned rows), else PKV_ERR_UNSUPPORTED. Out-of-range slots in
// pkv_attn_cache_write_cuda are skipped (the CPU call refuses them).
pkv_status pkv_attn_decode_paged_cuda(const pkv_attn_shape *shape, uint32_t num_seqs,
                                      const void *q, const pkv_attn_paged_kv *kv, void *out,
                                      void *stream);
pkv_status pkv_attn_decode_contig_cuda(const pkv_attn_shape *shape, uint32_t num_seqs,
                                       const void *q, const pkv_attn_contig_kv *kv, void *out,
                                       void *stream);
pkv_status pkv_attn_cache_write_cuda(const pkv_attn_shape *shape, uint32_t num_tokens,
                                     const void *k, const void *v, const int64_t *slots,
                                     void *k_cache, void *v_cache, uint64_t block_stride,
                                     uint64_t head_stride, uint64_t token_stride,
                                     uint32_t block_size, uint32_t num_blocks, void *stream);
pkv_status pkv_attn_prefill_paged_cuda(const pkv_attn_shape *shape, uint32_t num_seqs,
                                       const int32_t *q_indptr, const void *q,
                                       const pkv_attn_paged_kv *kv, void *out, void *stream);
// Prefill without the read-back: num_rows is the packed row count q_indptr[num_seqs]
// (the caller knows it: the tokens it packed), so the call only enqueues work on
// `stream` and never synchronizes. Rows of a prompt whose device-side q_indptr
// disagrees with num_rows come back NaN (or are not written, past num_rows).
pkv_status pkv_attn_prefill_paged_cuda_ex(const pkv_attn_shape *shape, uint32_t num_seqs,
                                          const int32_t *q_indptr, uint32_t num_rows,
                                          const void *q, const pkv_attn_paged_kv *kv, void *out,
                                          void *stream);
// Contiguous prefill, as pkv_attn_prefill_paged_cuda_ex (num_rows from the caller,
// no synchronization).
pkv_status pkv_attn_prefill_contig_cuda_ex(const pkv_attn_shape *shape, uint32_t num_seqs,
                                           const int32_t *q_indptr, uint32_t num_rows,
                                           const void *q, const pkv_attn_contig_kv *kv,
                                           void *out, void *stream);

// Batched block copy (copy-on-write, swap inside one arena) for caches laid out as
// blocks at a fixed stride: for every layer l < num_layers and every pair i, the
// block_elems elements at base + layer_stride * l + block_stride * copies[i].src go
// to the same place for copies[i].dst. For a pkv_cache pass base = data,
// layer_stride and block_stride from the geometry and block_elems = 2 * kv_stride
// (K and V halves are adjacent). copies: [num_copies], host memory for the CPU
// call, device memory for the CUDA call (borrowed). src and dst must be below
// num_blocks and differ; no dst may appear twice or be another pair's src
// (pkv_seqset_take_copies never produces such lists). block_elems <= block_stride.
pkv_status pkv_attn_copy_blocks_cpu(pkv_dtype dtype, void *base, uint32_t num_layers,
                                    uint64_t layer_stride, uint64_t block_stride,
                                    uint64_t block_elems, uint32_t num_blocks,
                                    const pkv_block_copy *copies, uint32_t num_copies);
pkv_status pkv_attn_copy_blocks_cuda(pkv_dtype dtype, void *base, uint32_t num_layers,
                                     uint64_t layer_stride, uint64_t block_stride,
                                     uint64_t block_elems, uint32_t num_blocks,
                                     const pkv_block_copy *copies, uint32_t num_copies,
                                     void *stream);

// Split-K (flash-decoding) for the CUDA decode kernels. Without a workspace the
// plain *_cuda decode calls run one partition per (sequence, kv-head group); with
// one, the context is cut into num_splits partitions, each reduced to a partial
// (max, sum, output) in the workspace, and a second kernel merges them.
typedef struct pkv_attn_cuda_opts {
    void *workspace;        // device memory for split-K partials (borrowed); NULL = no split
    size_t workspace_bytes; // its size; see pkv_attn_cuda_workspace_bytes
    uint32_t num_splits;    // 0 = heuristic (pkv_attn_cuda_num_splits), 1 = never split,
                            // n = n partitions (reduced if the workspace is too small)
    uint32_t num_sms;       // 0 = ask the current device; else the SM count to plan for
    uint32_t max_context;   // 0 = the descriptor's bound (below); else the longest context
                            // of the call (<= that bound, else PKV_ERR_INVALID_ARG): the
                            // split plan uses it, so layouts or table widths that differ
                            // plan alike; a longer sequence's rows come back NaN
} pkv_attn_cuda_opts;

// The split-K heuristic (docs/KERNELS.md): the number of context partitions for a
// decode call of num_seqs sequences whose contexts are at most max_context tokens
// on a GPU with num_sms SMs, wave-aware: of 1..min(max_context / 512, 64)
// partitions (each a multiple of 256 tokens), the count whose grid fills whole
// waves of num_sms x 2 resident thread blocks best, by a modelled time of
// waves x (partition length + 128 tokens of fixed cost per block); the fewest
// partitions on a tie. So a batch that is 1.2 waves unsplit may be split too, and
// contexts under 1024 tokens never are. Pure host arithmetic, available in every
// build. (The *_cuda_ex calls with num_splits 0 use the same rule with the launched
// decode kernel's real occupancy, from cudaOccupancyMaxActiveBlocksPerMultiprocessor,
// in place of 2.)
pkv_status pkv_attn_cuda_num_splits(const pkv_attn_shape *shape, uint32_t num_seqs,
                                    uint32_t max_context, uint32_t num_sms,
                                    uint32_t *num_splits);

// Device bytes of workspace that a split-K decode with num_splits partitions needs
// (fp32 partial outputs plus running max and sum per partition and head).
// PKV_ERR_INVALID_ARG when that size does not fit in a size_t (never wraps).
pkv_status pkv_attn_cuda_workspace_bytes(const pkv_attn_shape *shape, uint32_t num_seqs,
                                         uint32_t num_splits, size_t *bytes);

// Decode with split-K options. opts may be NULL (= the plain call). The plain calls
// above are these with opts NULL. The contexts are bounded on the host by
// max_blocks_per_seq * block_size (paged) or max_seq_len (contiguous): pass tight
// bounds, the split plan uses them.
// CUDA graphs: the decode calls (plain and _ex, paged and contiguous) and
// pkv_attn_prefill_paged_cuda_ex / pkv_attn_prefill_contig_cuda_ex may be captured
// in a CUDA graph: they allocate nothing, copy nothing to or from the host and never
// synchronize (the host reads only device attributes and the kernel's occupancy,
// and opts->num_sms != 0 skips even the SM count); the decode kernel and, with more
// than one partition, the merge kernel are the only work on `stream`. The split plan
// and workspace are fixed at capture: size the workspace up front
// (pkv_attn_cuda_workspace_bytes with 64 splits covers every plan) and pass
// opts->max_context as the longest context any replay will see; a replay may change
// the lengths, tables and cache contents in device memory, and a sequence longer
// than the captured bound gets NaN rows. pkv_attn_prefill_paged_cuda synchronizes
// (it reads the row count back) and must not be captured.
pkv_status pkv_attn_decode_paged_cuda_ex(const pkv_attn_shape *shape, uint32_t num_seqs,
                                         const void *q, const pkv_attn_paged_kv *kv,
                                         void *out, const pkv_attn_cuda_opts *opts,
                                         void *stream);
pkv_status pkv_attn_decode_contig_cuda_ex(const pkv_attn_shape *shape, uint32_t num_seqs,
                                          const void *q, const pkv_attn_contig_kv *kv,
                                          void *out, const pkv_attn_cuda_opts *opts,
                                          void *stream);

// ---- 8-bit KV caches -------------------------------------------------------------
// The same calls over a cache of quant->kv_dtype (int8, fp8_e4m3, fp8_e5m2): q, k, v
// and out stay in shape->dtype (fp32, fp16 or bf16), every cache stride is in bytes
// (= elements), the rows are dequantized on the fly and everything accumulates in
// fp32. quant is borrowed; PKV_ERR_INVALID_ARG for another dtype or an fp8 scale
// that is not finite and > 0. The cache write quantizes:
// - int8 rounds x / s to nearest even, s = max|x| / 127 over the token's head row,
//   stored beside the block (pkv_attn_kv_quant); a zero row stores s = 0; a row
//   holding NaN or inf stores s = NaN, so it reads back as NaN, never as a
//   plausible finite value;
// - fp8 rounds x / k_scale (v_scale) to nearest even, saturating finite overflow
//   and inf to +-max (448 e4m3, 57344 e5m2; CUDA's __NV_SATFINITE, as vLLM);
//   NaN stays NaN.
// The *_quant_cuda twins take device pointers and write the same cache bytes as the
// CPU write; decode / prefill run the 16-bit calls' decode kernel (16-byte loads of
// 8-bit rows, int8 scales read per tile, one pass over K/V per GQA group, split-K
// with the _ex calls' pkv_attn_cuda_opts, same workspace size) and agree with the
// CPU to fp32 rounding (checked on the CPU emulator, suite emu). They need head_dim
// 64, 128 or 256, 16-byte aligned rows and strides (as the 16-bit calls, in bytes)
// and 4-byte aligned int8 scales (else PKV_ERR_UNSUPPORTED), and return
// PKV_ERR_UNSUPPORTED in a build without CUDA. pkv_attn_prefill_paged_quant_cuda
// synchronizes `stream` once (it reads q_indptr[num_seqs] back), as
// pkv_attn_prefill_paged_cuda; its _ex twin takes num_rows from the caller. The
// decode calls and the prefill _ex may be captured in a CUDA graph under the same
// terms as pkv_attn_decode_paged_cuda_ex.
pkv_status pkv_attn_decode_paged_quant_cpu(const pkv_attn_shape *shape,
                                           const pkv_attn_kv_quant *quant, uint32_t num_seqs,
                                           const void *q, const pkv_attn_paged_kv *kv,
                                           void *out);
pkv_status pkv_attn_decode_contig_quant_cpu(const pkv_attn_shape *shape,
                                            const pkv_attn_kv_quant *quant, uint32_t num_seqs,
                                            const void *q, const pkv_attn_contig_kv *kv,
                                            void *out);
pkv_status pkv_attn_prefill_paged_quant_cpu(const pkv_attn_shape *shape,
                                            const pkv_attn_kv_quant *quant, uint32_t num_seqs,
                                            const int32_t *q_indptr, const void *q,
                                            const pkv_attn_paged_kv *kv, void *out);
// Causal prefill through a contiguous 8-bit cache (rows at seq_stride or at
// seq_offsets, int8 scales at each row's base + quant->scale_offset): the
// runtime's 8-bit contiguous store; bit-identical to the paged prefill on the
// same bytes.
pkv_status pkv_attn_prefill_contig_quant_cpu(const pkv_attn_shape *shape,
                                             const pkv_attn_kv_quant *quant, uint32_t num_seqs,
                                             const int32_t *q_indptr, const void *q,
                                             const pkv_attn_contig_kv *kv, void *out);
pkv_status pkv_attn_cache_write_quant_cpu(const pkv_attn_shape *shape,
                                          const pkv_attn_kv_quant *quant, uint32_t num_tokens,
                                          const void *k, const void *v, const int64_t *slots,
                                          void *k_cache, void *v_cache, uint64_t block_stride,
                                          uint64_t head_stride, uint64_t token_stride,
                                          uint32_t block_size, uint32_t num_blocks);
pkv_status pkv_attn_decode_paged_quant_cuda(const pkv_attn_shape *shape,
                                            const pkv_attn_kv_quant *quant, uint32_t num_seqs,
                                            const void *q, const pkv_attn_paged_kv *kv,
                                            void *out, void *stream);
pkv_status pkv_attn_prefill_paged_quant_cuda(const pkv_attn_shape *shape,
                                             const pkv_attn_kv_quant *quant, uint32_t num_seqs,
                                             const int32_t *q_indptr, const void *q,
                                             const pkv_attn_paged_kv *kv, void *out,
                                             void *stream);
pkv_status pkv_attn_decode_contig_quant_cuda(const pkv_attn_shape *shape,
                                             const pkv_attn_kv_quant *quant, uint32_t num_seqs,
                                             const void *q, const pkv_attn_contig_kv *kv,
                                             void *out, void *stream);
pkv_status pkv_attn_decode_paged_quant_cuda_ex(const pkv_attn_shape *shape,
                                               const pkv_attn_kv_quant *quant,
                                               uint32_t num_seqs, const void *q,
                                               const pkv_attn_paged_kv *kv, void *out,
                                               const pkv_attn_cuda_opts *opts, void *stream);
pkv_status pkv_attn_decode_contig_quant_cuda_ex(const pkv_attn_shape *shape,
                                                const pkv_attn_kv_quant *quant,
                                                uint32_t num_seqs, const void *q,
                                                const pkv_attn_contig_kv *kv, void *out,
                                                const pkv_attn_cuda_opts *opts, void *stream);
pkv_status pkv_attn_prefill_paged_quant_cuda_ex(const pkv_attn_shape *shape,
                                                const pkv_attn_kv_quant *quant,
                                                uint32_t num_seqs, const int32_t *q_indptr,
                                                uint32_t num_rows, const void *q,
                                                const pkv_attn_paged_kv *kv, void *out,
                                                void *stream);
// The contiguous prefill's CUDA twin, num_rows = q_indptr[num_seqs] from the
// caller (no read-back, no synchronization), as pkv_attn_prefill_contig_cuda_ex.
pkv_status pkv_attn_prefill_contig_quant_cuda_ex(const pkv_attn_shape *shape,
                                                 const pkv_attn_kv_quant *quant,
                                                 uint32_t num_seqs, const int32_t *q_indptr,
                                                 uint32_t num_rows, const void *q,
                                                 const pkv_attn_contig_kv *kv, void *out,
                                                 void *stream);
pkv_status pkv_attn_cache_write_quant_cuda(const pkv_attn_shape *shape,
                                           const pkv_attn_kv_quant *quant, uint32_t num_tokens,
                                           const void *k, const void *v, const int64_t *slots,
                                           void *k_cache, void *v_cache, uint64_t block_stride,
                                           uint64_t head_stride, uint64_t token_stride,
                                           uint32_t block_size, uint32_t num_blocks,
                                           void *stream);

// ---- Sliding-window, chunked-local and sink attention (0.3.0, issue 23) ----------
// Which past tokens a query sees. The kinds have the values of pkv_layer_kind
// (pkv/model_config.h) for the same layer types. A query at position p (0-based;
// a decode query is the last token of its context, p = seq_lens[s] - 1) sees
//   FULL:    0 .. p
//   SLIDING: max(0, p - window + 1) .. p   (window tokens, itself included)
//   CHUNKED: floor(p / window) * window .. p   (its own chunk of `window` tokens)
typedef enum pkv_attn_window_kind {
    PKV_ATTN_WINDOW_FULL = 0,
    PKV_ATTN_WINDOW_SLIDING = 1,
    PKV_ATTN_WINDOW_CHUNKED = 2,
} pkv_attn_window_kind;

// The window of one layer, and its attention sinks. Plain data; zero-initialize
// ({0}: full attention, no sinks) so that new fields stay unset.
// Sinks as gpt-oss uses them: a learned logit per query head that joins the
// softmax's denominator and contributes no value,
//   out[h] = sum_j e^{s_j} v_j / (e^{sinks[h]} + sum_j e^{s_j}),  s_j = scale q.k_j,
// i.e. sinks[h] is compared with the scaled scores. Computed with the running max
// started at the sink, so large logits of either sign neither overflow nor vanish.
typedef struct pkv_attn_window {
    pkv_attn_window_kind kind;
    uint32_t window;     // SLIDING: window in tokens; CHUNKED: chunk in tokens (>= 1);
                         // FULL: unused
    const float *sinks;  // [num_heads] finite fp32 logits (borrowed, host memory for
                         // the CPU calls, device memory for the CUDA ones); NULL = none
} pkv_attn_window;

// Decode under a window: pkv_attn_decode_paged_cpu's arguments and results, but
// sequence s's query sees only its window (above) and sinks join its softmax. Only
// the blocks that hold a token of the window are read or checked: the table entries
// before the window's first block (tokens that left the window, whose blocks the
// allocator released) may hold anything, PKV_BLOCK_NONE (-1) included, and the
// blocks they name are never touched. Entries from the window's first block
// through the last token's block must be valid ids. window NULL, an unknown kind,
// a SLIDING / CHUNKED window of 0 or a sink that is not finite: PKV_ERR_INVALID_ARG.
// Threading and reentrancy as the calls above; window is borrowed for the call.
pkv_status pkv_attn_decode_paged_window_cpu(const pkv_attn_shape *shape,
                                            const pkv_attn_window *window, uint32_t num_seqs,
                                            const void *q, const pkv_attn_paged_kv *kv,
                                            void *out);
// The same over a contiguous cache (tokens before the window are not read).
pkv_status pkv_attn_decode_contig_window_cpu(const pkv_attn_shape *shape,
                                             const pkv_attn_window *window, uint32_t num_seqs,
                                             const void *q, const pkv_attn_contig_kv *kv,
                                             void *out);
// Causal prefill under a window: pkv_attn_prefill_paged_cpu's arguments, each
// prompt row at position p seeing its window. The blocks read (and checked) start
// at the window of the prompt's FIRST row; entries before it may be PKV_BLOCK_NONE.
pkv_status pkv_attn_prefill_paged_window_cpu(const pkv_attn_shape *shape,
                                             const pkv_attn_window *window, uint32_t num_seqs,
                                             const int32_t *q_indptr, const void *q,
                                             const pkv_attn_paged_kv *kv, void *out);

// ---- Multi-head latent attention (MLA, DeepSeek-V2/V3; 0.3.0, issue 23) ----------
// The cache holds, per token and layer, one vector c of latent_dim + rope_dim
// elements (the compressed KV, then the decoupled RoPE key): FlashInfer's and
// vLLM's MLA cache. Queries come already absorbed (q_nope multiplied by the key
// up-projection W_UK of their head), concatenated with the rotated rope part, so
// that attention runs on the latent directly:
//   score_j = scale * q[h] . c_j  (all latent_dim + rope_dim elements),
//   out[h]  = sum_j softmax(score)_j c_j[0 .. latent_dim - 1],
// which equals attention with K and V expanded by the up-projections, once out is
// multiplied by W_UV (the caller's job). Every query head reads the same vectors
// (one "kv head").
typedef struct pkv_attn_mla_shape {
    uint32_t num_heads;   // query heads (>= 1)
    uint32_t latent_dim;  // kv_lora_rank (512 for DeepSeek-V3), >= 1
    uint32_t rope_dim;    // qk_rope_head_dim (64 for DeepSeek-V3), may be 0; the CPU
                          // needs latent_dim + rope_dim <= PKV_ATTN_CPU_MAX_HEAD_DIM
    pkv_dtype dtype;      // of q, out and the cache: fp32, fp16 or bf16
    float scale;          // softmax scale (DeepSeek: 1 / sqrt(qk_nope + qk_rope head
                          // dims), times its YaRN factor where the config has one)
    uint32_t num_threads; // CPU only: 0 = all cores
} pkv_attn_mla_shape;

// MLA decode over a paged latent cache. kv describes it as for the other paged
// calls, with one vector per token: token t of block b at
// k_cache + block_stride * b + token_stride * t (elements); v_cache and
// head_stride are unused (v_cache may be NULL: V is the latent part of the same
// vector). q: [num_seqs][num_heads][latent_dim + rope_dim] (absorbed nope part
// first, then rope), out: [num_seqs][num_heads][latent_dim] (written). Argument
// checks, threading and reentrancy as pkv_attn_decode_paged_cpu.
pkv_status pkv_attn_decode_mla_paged_cpu(const pkv_attn_mla_shape *shape, uint32_t num_seqs,
                                         const void *q, const pkv_attn_paged_kv *kv, void *out);

// CUDA twins of the window and MLA decode (src/attention/attn_window.cu): the same
// arguments and results with device pointers (q, out, the cache, tables, lengths
// and window->sinks; the pkv_attn_window and shape structs stay on the host),
// launched asynchronously on `stream` (a cudaStream_t, NULL = default); no
// allocation, no synchronization, so they may be captured in a CUDA graph. The
// window call needs head_dim 64, 128 or 256, the MLA call latent_dim <= 512 and
// latent_dim + rope_dim <= 576 (else PKV_ERR_UNSUPPORTED); rows need no alignment.
// Device-side lengths, block ids and sinks cannot be checked before launch: a
// sequence whose length or a block id of its window is out of range gets NaN rows
// (ids before the window are never read), a non-finite sink non-finite rows.
// Launch errors: PKV_ERR_BACKEND, as the calls above; PKV_ERR_UNSUPPORTED in a
// build without CUDA (after the host-side argument checks).
pkv_status pkv_attn_decode_paged_window_cuda(const pkv_attn_shape *shape,
                                             const pkv_attn_window *window, uint32_t num_seqs,
                                             const void *q, const pkv_attn_paged_kv *kv,
                                             void *out, void *stream);
pkv_status pkv_attn_decode_mla_paged_cuda(const pkv_attn_mla_shape *shape, uint32_t num_seqs,
                                          const void *q, const pkv_attn_paged_kv *kv, void *out,
                                          void *stream);

#ifdef __cplusplus
}
#endif

#endif // PKV_ATTENTION_H

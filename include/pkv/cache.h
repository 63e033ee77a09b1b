// SPDX-License-Identifier: MIT
// KV-cache storage: binds a block pool to memory with a layout. The cache makes
// exactly one backend allocation, for every layer and block, at creation.
//
// Memory layout (one arena): for each layer l, a tensor
//   [num_blocks][2 (K, V)][block_size x kv_heads x head_dim in `layout` order]
// so block b of layer l starts at ((l * num_blocks + b) * 2) * half_block_bytes and
// its V half follows its K half. The same block id is used in every layer. Inside a
// half block the default layout HND is [kv_heads][block_size][head_dim]; NHD is
// [block_size][kv_heads][head_dim]. pkv_cache_get_geometry gives the strides so that
// kernels never hard-code either.
//
// As a tensor: the HND arena is exactly a C-contiguous array
//   [num_layers][num_blocks][2][kv_heads][block_size][head_dim]
// and NHD is [num_layers][num_blocks][2][block_size][kv_heads][head_dim], so an
// engine's own torch tensor of that shape and dtype (num_blocks = the pool's
// capacity) can be wrapped with pkv_cache_create_external (tensor.data_ptr(),
// tensor.numel() * tensor.element_size(), a backend of the tensor's device).
//
// 8-bit caches (docs/DESIGN.md, "Quantized KV"): int8, fp8_e4m3 and fp8_e5m2 store
// one byte per element, so every stride of the geometry is then in bytes.
// - int8 is symmetric with one fp32 scale per (token, kv head): x ~ q x scale,
//   scale = max|x| / 127 over the token's head_dim values. The scales live INSIDE
//   the block, after the data of each half: a K (or V) half block is
//     [data: kv_heads x block_size x head_dim bytes in `layout` order, padded to 16]
//     [scales: fp32 [kv_heads][block_size], padded to 16]
//   at byte offset geometry.scale_offset from the half's start. A block is thus
//   self-contained: copy-on-write, swap and transfers move the scales with the data.
// - fp8 (OCP e4m3 "fn": max 448, no inf; e5m2: max 57344) has no per-token scale in
//   the cache: the caller keeps one fp32 scale per tensor (per layer, K and V), as
//   vLLM's k_scale / v_scale (calculate_kv_scales: max|x| / fp8 max on the first
//   forward pass), and passes it to the attention calls (pkv_attn_kv_quant).
// As a tensor, an 8-bit HND arena is uint8 [num_layers][num_blocks][2][half_block_bytes].
//
// Thread-safety: as for the pool; one thread at a time per cache.
#ifndef PKV_CACHE_H
#define PKV_CACHE_H

#include <stddef.h>
#include <stdint.h>

#include "pkv/backend.h"
#include "pkv/pool.h"
#include "pkv/seq.h"
#include "pkv/status.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef enum pkv_dtype {
    PKV_DTYPE_F32 = 0,
    PKV_DTYPE_F16 = 1,
    PKV_DTYPE_BF16 = 2,
    PKV_DTYPE_INT8 = 3,     // KV storage only: symmetric int8, per-token-per-head scales
    PKV_DTYPE_FP8_E4M3 = 4, // KV storage only: OCP fp8 e4m3fn, per-tensor scale
    PKV_DTYPE_FP8_E5M2 = 5, // KV storage only: OCP fp8 e5m2, per-tensor scale
} pkv_dtype;

typedef enum pkv_layout {
    PKV_LAYOUT_HND = 0, // [kv_heads][block_size][head_dim] per block half (default)
    PKV_LAYOUT_NHD = 1, // [block_size][kv_heads][head_dim]
    // vLLM's FlashAttention cache: NHD halves, and each layer holds every block's K
    // half, then every block's V half: per layer [2][num_blocks][block_size][kv_heads]
    // [head_dim], so the arena is [num_layers][2][num_blocks][block_size][kv_heads]
    // [head_dim] (kv_stride = num_blocks half blocks, block_stride = one half block).
    PKV_LAYOUT_KV_NHD = 2,
} pkv_layout;

typedef enum pkv_kv {
    PKV_K = 0,
    PKV_V = 1,
} pkv_kv;

// Size in bytes of one element of `dtype` (4, 2 or 1); 0 for an unknown dtype.
size_t pkv_dtype_size(pkv_dtype dtype);
// "fp32", "fp16", "bf16", "int8", "fp8_e4m3", "fp8_e5m2" or "unknown".
const char *pkv_dtype_name(pkv_dtype dtype);
// The dtype named `name` (the names above; "fp8" is fp8_e4m3, as vLLM's "fp8").
// PKV_ERR_INVALID_ARG for any other name.
pkv_status pkv_dtype_from_name(const char *name, pkv_dtype *dtype);
// 1 for the 8-bit storage dtypes (int8, fp8_e4m3, fp8_e5m2), else 0.
int pkv_dtype_is_quantized(pkv_dtype dtype);

typedef struct pkv_cache_params {
    uint32_t num_layers; // >= 1
    uint32_t kv_heads;   // >= 1
    uint32_t head_dim;   // >= 1
    uint32_t block_size; // tokens per block, >= 1; must equal the seqsets' block size
    pkv_dtype dtype;
    pkv_layout layout;
} pkv_cache_params;

// Defaults: 1 layer, 1 kv head, head_dim 128, block_size 16, fp16, HND.
pkv_cache_params pkv_cache_params_default(void);

// Bytes of one token's K and V over all layers:
// 2 x num_layers x kv_heads x (head_dim x dtype size + 4 for int8's scale), without
// the block's alignment padding. 0 for invalid params.
uint64_t pkv_cache_bytes_per_token(const pkv_cache_params *params);
// Bytes of one block over all layers, scales and padding included: the arena holds
// capacity x this. For fp32/fp16/bf16 and fp8, bytes_per_token x block_size; for
// int8 2 x num_layers x half_block_bytes (see the layout above).
uint64_t pkv_cache_bytes_per_block(const pkv_cache_params *params);

// Strides, in elements, for kernels. Everything a paged kernel needs to find
// element (layer l, block b, K/V kv, head h, token t, dim d):
//   layer_stride * l + block_stride * b + kv_stride * kv + head_stride * h
//   + token_stride * t + d
typedef struct pkv_cache_geometry {
    uint64_t layer_stride;
    uint64_t block_stride;
    uint64_t kv_stride;
    uint64_t head_stride;
    uint64_t token_stride;
    uint64_t half_block_bytes; // bytes of a K (or V) half block, int8 scales included
    // int8 only (all 0 otherwise): the scales of a half block start scale_offset
    // bytes after the half's start; (head h, token t) is fp32 number
    // scale_head_stride * h + scale_token_stride * t there ([kv_heads][block_size]).
    uint64_t scale_offset;
    uint64_t scale_head_stride;  // in floats (= block_size)
    uint64_t scale_token_stride; // in floats (= 1)
} pkv_cache_geometry;

typedef struct pkv_cache pkv_cache;

// Create a cache for every block of `pool` (borrowed; must outlive the cache) in
// memory from `backend` (borrowed; must outlive the cache). One backend allocation
// of capacity x bytes_per_block, zeroed. PKV_ERR_OUT_OF_MEMORY if the backend cannot
// provide it. *out is owned by the caller.
pkv_status pkv_cache_create(const pkv_cache_params *params, pkv_pool *pool,
                            pkv_backend *backend, pkv_cache **out);

// Create a cache over memory the caller owns: `data` (borrowed; a device address
// for a CUDA backend, host memory for a host backend), `bytes` long, laid out as
// above with the strides pkv_cache_get_geometry reports. The cache allocates,
// zeroes and frees nothing of it; `backend` (borrowed) says where it lives and
// runs the copies. data must be aligned to the dtype size, 16 bytes for int8
// (PKV_ERR_INVALID_ARG);
// PKV_ERR_BUFFER_TOO_SMALL if bytes < capacity x bytes_per_block
// (pkv_cache_bytes_per_block gives the size needed).
pkv_status pkv_cache_create_external(const pkv_cache_params *params, pkv_pool *pool,
                                     pkv_backend *backend, void *data, uint64_t bytes,
                                     pkv_cache **out);

// Free the arena (one backend free call; none for an external arena). NULL does
// nothing.
void pkv_cache_destroy(pkv_cache *cache);

pkv_status pkv_cache_get_params(const pkv_cache *cache, pkv_cache_params *params);
pkv_status pkv_cache_get_geometry(const pkv_cache *cache, pkv_cache_geometry *geometry);
pkv_pool *pkv_cache_pool(const pkv_cache *cache);       // borrowed
pkv_backend *pkv_cache_backend(const pkv_cache *cache); // borrowed
uint64_t pkv_cache_arena_bytes(const pkv_cache *cache);

// Base address of the arena (a device address for a CUDA backend). Borrowed.
void *pkv_cache_data(const pkv_cache *cache);

// Address of the K or V half of block `block` in layer `layer` (borrowed; a device
// address for a CUDA backend). PKV_ERR_INVALID_ARG / PKV_ERR_NOT_FOUND for a layer
// or block out of range.
pkv_status pkv_cache_block_ptr(const pkv_cache *cache, uint32_t layer, pkv_block_id block,
                               pkv_kv kv, void **ptr);

// Execute block copies (every layer, K and V) in one batched backend call.
// copies: borrowed, n entries, as taken from pkv_seqset_take_copies. CUDA: one
// kernel launch for all copies and layers (one per 448 copies beyond that) on
// `stream` (a cudaStream_t; NULL = legacy default stream), no synchronization
// (see backend.h); host: done on return. The copy list is passed by value: it may
// be reused as soon as this returns. The copies may run in parallel, so no dst may
// appear twice or be another copy's src (a copy-on-write queue never does; see
// pkv_seqset_copies).
pkv_status pkv_cache_copy_blocks(pkv_cache *cache, const pkv_block_copy *copies, uint32_t n,
                                 void *stream);

// Take every queued copy of `set` and execute it in one batch on `stream`. The set
// must use this cache's pool and block size. The queue is emptied once the copies
// are enqueued: K/V writes for the new tokens must go on the same stream (or wait
// for it).
pkv_status pkv_cache_apply_copies(pkv_cache *cache, pkv_seqset *set, void *stream);

// Move whole blocks (every layer, K and V) between two caches of the same shape,
// e.g. a CUDA cache and its host swap space: pairs[i].src is a block of `src`,
// pairs[i].dst a block of `dst` (pairs borrowed, n entries, as pkv_seq_move wrote
// them). Host<->host, host<->CUDA and CUDA<->host are supported; two different
// CUDA caches give PKV_ERR_UNSUPPORTED. PKV_ERR_INVALID_ARG if the shapes differ.
// CUDA: one cudaMemcpy2DAsync per pair (its layers are the rows) on `stream`, no
// synchronization (one cudaMemcpyAsync per layer when a layer is wider than the
// device's pitch limit);
// with a pinned host cache (an external cache over cudaHostAlloc memory) the
// copy is fully asynchronous, so synchronize before reading or reusing the host
// blocks.
pkv_status pkv_cache_transfer(pkv_cache *dst, const pkv_cache *src, const pkv_block_copy *pairs,
                              uint32_t n, void *stream);

#ifdef __cplusplus
}
#endif

#endif // PKV_CACHE_H

// SPDX-License-Identifier: MIT
// CUDA cache write (new tokens' K/V into their slots) and batched block copy.
// Both move bytes only, in 16-byte units when every address and stride allows it
// and in element units otherwise. Invariant: slots and block ids come from device
// memory and are bound-checked in the kernel; out-of-range ones are skipped.
#include <stdint.h>

#include "attn_cuda.cuh"

#define THREADS 256

// Kernels and launch helpers have internal linkage: no generic symbol leaves the
// library (only the extern "C" pkv_* entry points below).
namespace {

// Unit = the copy granule (uint4, uint32_t or uint16_t); sizes below are in units.
template <typename Unit>
__global__ void __launch_bounds__(THREADS)
    cache_write_kernel(const Unit *k, const Unit *v, const int64_t *slots, Unit *kc, Unit *vc,
                       uint64_t block_stride, uint64_t head_stride, uint64_t token_stride,
                       uint32_t block_size, uint64_t num_slots, uint32_t kv_heads,
                       uint32_t row_units) {
    const uint32_t i = blockIdx.x;
    const int64_t slot = slots[i];
    if (slot < 0 || (uint64_t)slot >= num_slots) {
        return; // padding, or a slot outside the cache
    }
    const uint64_t blk = (uint64_t)slot / block_size;
    const uint64_t off = (uint64_t)slot % block_size;
    const uint64_t base = blk * block_stride + off * token_stride;
    for (uint32_t x = threadIdx.x; x < kv_heads * row_units; x += THREADS) {
        const uint32_t h = x / row_units;
        const uint32_t u = x % row_units;
        const uint64_t src = ((uint64_t)i * kv_heads + h) * row_units + u;
        const uint64_t dst = base + h * head_stride + u;
        kc[dst] = k[src];
        vc[dst] = v[src];
    }
}

template <typename Unit>
void launch_write(uint32_t n, const void *k, const void *v, const int64_t *slots,
                         void *kc, void *vc, uint64_t bs_u, uint64_t hs_u, uint64_t ts_u,
                         uint32_t block_size, uint64_t num_slots, uint32_t kvh,
                         uint32_t row_units, cudaStream_t st) {
    // Grid: one block per token; threads over (kv head, row unit).
    cache_write_kernel<Unit><<<n, THREADS, 0, st>>>(
        static_cast<const Unit *>(k), static_cast<const Unit *>(v), slots,
        static_cast<Unit *>(kc), static_cast<Unit *>(vc), bs_u, hs_u, ts_u, block_size,
        num_slots, kvh, row_units);
}

} // namespace

extern "C" pkv_status pkv_attn_cache_write_cuda(const pkv_attn_shape *shape, uint32_t num_tokens,
                                                const void *k, const void *v,
                                                const int64_t *slots, void *k_cache,
                                                void *v_cache, uint64_t block_stride,
                                                uint64_t head_stride, uint64_t token_stride,
                                                uint32_t block_size, uint32_t num_blocks,
                                                void *stream) {
    pkv_status st = pkvi_attn_check_write_args(shape, k, v, slots, k_cache, v_cache, block_size,
                                               num_blocks);
    if (st != PKV_OK) {
        return st;
    }
    if (num_tokens == 0) {
        return PKV_OK;
    }
    if (num_tokens > (uint32_t)INT32_MAX) {
        return PKV_ERR_UNSUPPORTED;
    }
    const size_t es = pkv_dtype_size(shape->dtype);
    const uint64_t row_bytes = (uint64_t)shape->head_dim * es;
    const bool vec = pkvi_aligned16(k) && pkvi_aligned16(v) && pkvi_aligned16(k_cache) &&
                     pkvi_aligned16(v_cache) && row_bytes % 16 == 0 &&
                     pkvi_stride16(block_stride, es) && pkvi_stride16(head_stride, es) &&
                     pkvi_stride16(token_stride, es);
    const size_t unit = vec ? 16 : es;
    const uint64_t per = unit / es; // elements per unit
    if (row_bytes / unit > UINT32_MAX / shape->num_kv_heads) {
        return PKV_ERR_UNSUPPORTED;
    }
    const uint32_t row_units = (uint32_t)(row_bytes / unit);
    const uint64_t num_slots = (uint64_t)num_blocks * block_size;
    cudaStream_t cs = static_cast<cudaStream_t>(stream);
    const cudaError_t before = pkvi_launch_begin();
    if (vec) {
        launch_write<uint4>(num_tokens, k, v, slots, k_cache, v_cache, block_stride / per,
                            head_stride / per, token_stride / per, block_size, num_slots,
                            shape->num_kv_heads, row_units, cs);
    } else if (es == 4) {
        launch_write<uint32_t>(num_tokens, k, v, slots, k_cache, v_cache, block_stride,
                               head_stride, token_stride, block_size, num_slots,
                               shape->num_kv_heads, row_units, cs);
    } else {
        launch_write<uint16_t>(num_tokens, k, v, slots, k_cache, v_cache, block_stride,
                               head_stride, token_stride, block_size, num_slots,
                               shape->num_kv_heads, row_units, cs);
    }
    return pkvi_launch_status(before);
}

namespace {

template <typename Unit>
__global__ void __launch_bounds__(THREADS)
    copy_blocks_kernel(Unit *base, uint64_t layer_stride, uint64_t block_stride,
                       uint64_t block_units, uint32_t num_blocks, const pkv_block_copy *copies) {
    const pkv_block_copy c = copies[blockIdx.x];
    if (c.src < 0 || c.dst < 0 || (uint32_t)c.src >= num_blocks ||
        (uint32_t)c.dst >= num_blocks || c.src == c.dst) {
        return;
    }
    Unit *layer = base + (uint64_t)blockIdx.y * layer_stride;
    const Unit *src = layer + (uint64_t)c.src * block_stride;
    Unit *dst = layer + (uint64_t)c.dst * block_stride;
    for (uint64_t x = threadIdx.x; x < block_units; x += THREADS) {
        dst[x] = src[x];
    }
}

template <typename Unit>
void launch_copy(void *base, uint32_t layers, uint64_t ls, uint64_t bs, uint64_t units,
                        uint32_t num_blocks, const pkv_block_copy *copies, uint32_t n,
                        cudaStream_t st) {
    // Grid: x = copy pairs, y = layers; threads stride over the block's units.
    dim3 grid(n, layers);
    copy_blocks_kernel<Unit><<<grid, THREADS, 0, st>>>(static_cast<Unit *>(base), ls, bs, units,
                                                       num_blocks, copies);
}

} // namespace

extern "C" pkv_status pkv_attn_copy_blocks_cuda(pkv_dtype dtype, void *base, uint32_t num_layers,
                                                uint64_t layer_stride, uint64_t block_stride,
                                                uint64_t block_elems, uint32_t num_blocks,
                                                const pkv_block_copy *copies,
                                                uint32_t num_copies, void *stream) {
    pkv_status st = pkvi_attn_check_copy_args(dtype, base, num_layers, block_stride, block_elems,
                                              num_blocks, copies);
    if (st != PKV_OK) {
        return st;
    }
    if (num_copies == 0) {
        return PKV_OK;
    }
    if (num_copies > (uint32_t)INT32_MAX || num_layers > 65535u) {
        return PKV_ERR_UNSUPPORTED;
    }
    const size_t es = pkv_dtype_size(dtype);
    const bool vec = pkvi_aligned16(base) && pkvi_stride16(layer_stride, es) &&
                     pkvi_stride16(block_stride, es) && pkvi_stride16(block_elems, es);
    cudaStream_t cs = static_cast<cudaStream_t>(stream);
    const cudaError_t before = pkvi_launch_begin();
    if (vec) {
        const uint64_t per = 16 / es;
        launch_copy<uint4>(base, num_layers, layer_stride / per, block_stride / per,
                           block_elems / per, num_blocks, copies, num_copies, cs);
    } else if (es == 4) {
        launch_copy<uint32_t>(base, num_layers, layer_stride, block_stride, block_elems,
                              num_blocks, copies, num_copies, cs);
    } else if (es == 2) {
        launch_copy<uint16_t>(base, num_layers, layer_stride, block_stride, block_elems,
                              num_blocks, copies, num_copies, cs);
    } else { // 8-bit caches: strides and sizes count bytes (issue 20, defect 11)
        launch_copy<uint8_t>(base, num_layers, layer_stride, block_stride, block_elems,
                             num_blocks, copies, num_copies, cs);
    }
    return pkvi_launch_status(before);
}

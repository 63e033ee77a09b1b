// SPDX-License-Identifier: MIT
// CPU cache write (new tokens' K/V into their slots) and batched block copy.
// Invariant: every slot and block id is checked before the first byte is written,
// so a refused call leaves the cache unchanged.
#include <string.h>

#include "attn_internal.h"

pkv_status pkv_attn_cache_write_cpu(const pkv_attn_shape *shape, uint32_t num_tokens,
                                    const void *k, const void *v, const int64_t *slots,
                                    void *k_cache, void *v_cache, uint64_t block_stride,
                                    uint64_t head_stride, uint64_t token_stride,
                                    uint32_t block_size, uint32_t num_blocks) {
    pkv_status st = pkvi_attn_check_write_args(shape, k, v, slots, k_cache, v_cache, block_size,
                                               num_blocks);
    if (st != PKV_OK) {
        return st;
    }
    const uint64_t num_slots = (uint64_t)num_blocks * block_size;
    for (uint32_t i = 0; i < num_tokens; i++) {
        if (slots[i] >= 0 && (uint64_t)slots[i] >= num_slots) {
            return PKV_ERR_INVALID_ARG;
        }
    }
    const size_t es = pkv_dtype_size(shape->dtype);
    const size_t row = (size_t)shape->head_dim * es;
    const uint32_t kvh = shape->num_kv_heads;
    for (uint32_t i = 0; i < num_tokens; i++) {
        if (slots[i] < 0) {
            continue; // padding
        }
        uint64_t blk = (uint64_t)slots[i] / block_size;
        uint64_t off = (uint64_t)slots[i] % block_size;
        for (uint32_t h = 0; h < kvh; h++) {
            size_t dst = (size_t)(blk * block_stride + h * head_stride + off * token_stride) * es;
            size_t src = ((size_t)i * kvh + h) * row;
            memcpy((char *)k_cache + dst, (const char *)k + src, row);
            memcpy((char *)v_cache + dst, (const char *)v + src, row);
        }
    }
    return PKV_OK;
}

pkv_status pkv_attn_copy_blocks_cpu(pkv_dtype dtype, void *base, uint32_t num_layers,
                                    uint64_t layer_stride, uint64_t block_stride,
                                    uint64_t block_elems, uint32_t num_blocks,
                                    const pkv_block_copy *copies, uint32_t num_copies) {
    pkv_status st = pkvi_attn_check_copy_args(dtype, base, num_layers, block_stride,
                                              block_elems, num_blocks, copies);
    if (st != PKV_OK) {
        return st;
    }
    for (uint32_t i = 0; i < num_copies; i++) {
        pkv_block_id s = copies[i].src;
        pkv_block_id d = copies[i].dst;
        if (s < 0 || d < 0 || (uint32_t)s >= num_blocks || (uint32_t)d >= num_blocks || s == d) {
            return PKV_ERR_INVALID_ARG;
        }
    }
    const size_t es = pkv_dtype_size(dtype);
    for (uint32_t l = 0; l < num_layers; l++) {
        char *layer = (char *)base + (size_t)(layer_stride * l) * es;
        for (uint32_t i = 0; i < num_copies; i++) {
            memcpy(layer + (size_t)copies[i].dst * block_stride * es,
                   layer + (size_t)copies[i].src * block_stride * es, (size_t)block_elems * es);
        }
    }
    return PKV_OK;
}

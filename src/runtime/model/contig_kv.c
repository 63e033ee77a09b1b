// SPDX-License-Identifier: MIT
// The contiguous KV store, the layout that paging replaces: every sequence's
// K/V is one extent of consecutive token slots in an arena of the model's device
// memory, laid out per layer [kv_head][arena][head_dim], so a (sequence, head)
// row is one contiguous run. Either fixed rows of max_len slots (row r at r x
// max_len) or extents the caller places and moves, as an engine's contiguous
// allocator would (pkv_contig_kv_create_arena). It exists so that the same model
// code can be measured on both layouts. Invariants: len[r] <= cap[r]; the
// extents of rows with cap > 0 lie in the arena and do not overlap; slots below
// len[r] hold K/V written by a forward pass (or a row copy or move).
// 8-bit stores quantize as the paged 8-bit cache does (pkv/cache.h): fp8 keeps the
// layout above with 1-byte elements (its scales are the model's, per tensor);
// int8 needs one fp32 scale per (token, kv head) that moves with its row, so its
// arena is token-major slots, each [kv_heads][head_dim] bytes then the kv heads'
// fp32 scales, padded to 16 bytes (16-byte rows for the CUDA kernel): the slot is
// self-contained, as an int8 paged block is, and a row copy moves the scales.
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

// Bytes of one token slot of one layer's K (or V): an int8 slot holds its kv
// heads' rows and their scales, padded to 16 bytes.
static uint64_t slot_bytes(const pkv_model_config *c, pkv_dtype dtype) {
    const uint64_t row = (uint64_t)c->num_kv_heads * c->head_dim;
    if (dtype == PKV_DTYPE_INT8) return (row + 4u * c->num_kv_heads + 15u) & ~(uint64_t)15u;
    return row * pkv_dtype_size(dtype);
}

uint64_t pkvi_contig_kv_arena_bytes(const pkv_model *model, uint64_t arena_tokens, pkv_dtype dtype) {
    if (!model || pkv_dtype_size(dtype) == 0) return 0;
    const pkv_model_config *c = &model->cfg;
    const uint64_t plane = (uint64_t)c->num_layers * slot_bytes(c, dtype);
    return arena_tokens > (uint64_t)SIZE_MAX / plane ? 0 : plane * arena_tokens;
}

// The bookkeeping of a store: an arena of `arena` token slots per head plane,
// rows without extents, no buffers yet.
static pkv_status store_new(const pkv_model *model, uint32_t max_rows, uint64_t arena,
                            pkv_dtype dtype, pkv_contig_kv **out) {
    if (!model || !out || max_rows == 0 || arena == 0 || pkv_dtype_size(dtype) == 0)
        return PKV_ERR_INVALID_ARG;
    // The 8-bit writes address token slots with the paged writer's 32-bit block count.
    if (pkv_dtype_is_quantized(dtype) && arena > UINT32_MAX) return PKV_ERR_UNSUPPORTED;
    *out = NULL;
    const uint64_t each = pkvi_contig_kv_arena_bytes(model, arena, dtype);
    if (each == 0) return PKV_ERR_OUT_OF_MEMORY;
    pkv_contig_kv *kv = calloc(1, sizeof *kv);
    if (!kv) return PKV_ERR_OUT_OF_MEMORY;
    kv->model = model;
    kv->max_rows = max_rows;
    kv->arena = arena;
    kv->dtype = dtype;
    kv->esize = pkv_dtype_size(dtype);
    kv->bytes_each = each;
    const pkv_model_config *c = &model->cfg;
    kv->head_stride = arena * c->head_dim;
    kv->token_stride = c->head_dim;
    kv->layer_stride = kv->head_stride * c->num_kv_heads;
    kv->row_unit = c->head_dim;
    kv->quant.kv_dtype = dtype;
    if (dtype == PKV_DTYPE_INT8) {
        const uint64_t slot = slot_bytes(c, dtype);
        kv->head_stride = c->head_dim;
        kv->token_stride = slot;
        kv->layer_stride = arena * slot;
        kv->row_unit = slot;
        kv->quant.scale_offset = (uint64_t)c->num_kv_heads * c->head_dim;
        kv->quant.scale_head_stride = 1;
        kv->quant.scale_token_stride = slot / sizeof(float);
    }
    kv->len = calloc(max_rows, sizeof *kv->len);
    kv->off = calloc(max_rows, sizeof *kv->off);
    kv->cap = calloc(max_rows, sizeof *kv->cap);
    if (!kv->len || !kv->off || !kv->cap) {
        pkv_contig_kv_destroy(kv);
        return PKV_ERR_OUT_OF_MEMORY;
    }
    *out = kv;
    return PKV_OK;
}

// A store with buffers of its own, zeroed.
static pkv_status store_create(const pkv_model *model, uint32_t max_rows, uint64_t arena,
                               pkv_dtype dtype, pkv_contig_kv **out) {
    pkv_contig_kv *kv = NULL;
    pkv_status st = store_new(model, max_rows, arena, dtype, &kv);
    if (st != PKV_OK) return st;
    pkv_model *m = (pkv_model *)model; // ops take a mutable model; alloc changes no model state
    const size_t each = (size_t)kv->bytes_each;
    st = m->ops->alloc(m, each, &kv->k);
    if (st == PKV_OK) st = m->ops->alloc(m, each, &kv->v);
    if (st == PKV_OK) st = zero_fill(m, kv->k, each);
    if (st == PKV_OK) st = zero_fill(m, kv->v, each);
    if (st != PKV_OK) {
        pkv_contig_kv_destroy(kv);
        return st;
    }
    *out = kv;
    return PKV_OK;
}

pkv_status pkvi_contig_kv_wrap(const pkv_model *model, uint32_t max_rows, uint64_t arena_tokens,
                               pkv_dtype dtype, void *k, void *v, pkv_contig_kv **out) {
    if (!k || !v) return PKV_ERR_INVALID_ARG;
    pkv_status st = store_new(model, max_rows, arena_tokens, dtype, out);
    if (st != PKV_OK) return st;
    (*out)->k = k;
    (*out)->v = v;
    (*out)->borrowed = 1;
    return PKV_OK;
}

pkv_status pkvi_contig_kv_wrap_slots(const pkv_model *model, uint32_t num_slots, uint32_t max_len,
                                     pkv_dtype dtype, void *k, void *v, uint64_t layer_stride,
                                     uint64_t row_unit, pkv_contig_kv **out) {
    if (!k || !v || max_len == 0) return PKV_ERR_INVALID_ARG;
    if (dtype == PKV_DTYPE_INT8) return PKV_ERR_UNSUPPORTED; // its slots hold no scales
    pkv_status st = store_new(model, num_slots, (uint64_t)num_slots * max_len, dtype, out);
    if (st != PKV_OK) return st;
    pkv_contig_kv *kv = *out;
    const pkv_model_config *c = &model->cfg;
    kv->k = k;
    kv->v = v;
    kv->borrowed = 1;
    kv->max_len = max_len;
    kv->hiwater = num_slots;
    kv->head_stride = c->head_dim;
    kv->token_stride = (uint64_t)c->num_kv_heads * c->head_dim;
    kv->layer_stride = layer_stride;
    kv->row_unit = row_unit;
    for (uint32_t r = 0; r < num_slots; r++) {
        kv->off[r] = r;
        kv->cap[r] = max_len;
    }
    return PKV_OK;
}

pkv_status pkv_contig_kv_create(const pkv_model *model, uint32_t max_rows, uint32_t max_len,
                                pkv_dtype dtype, pkv_contig_kv **out) {
    if (max_len == 0) return PKV_ERR_INVALID_ARG;
    pkv_status st = store_create(model, max_rows, (uint64_t)max_rows * max_len, dtype, out);
    if (st != PKV_OK) return st;
    pkv_contig_kv *kv = *out;
    kv->max_len = max_len;
    kv->hiwater = max_rows;
    for (uint32_t r = 0; r < max_rows; r++) {
        kv->off[r] = (uint64_t)r * max_len;
        kv->cap[r] = max_len;
    }
    return PKV_OK;
}

pkv_status pkv_contig_kv_create_arena(const pkv_model *model, uint32_t max_rows,
                                      uint64_t arena_tokens, pkv_dtype dtype,
                                      pkv_contig_kv **out) {
    return store_create(model, max_rows, arena_tokens, dtype, out);
}

void pkv_contig_kv_destroy(pkv_contig_kv *kv) {
    if (!kv) return;
    pkv_model *m = (pkv_model *)kv->model;
    if (kv->k && !kv->borrowed) m->ops->release(m, kv->k);
    if (kv->v && !kv->borrowed) m->ops->release(m, kv->v);
    free(kv->len);
    free(kv->off);
    free(kv->cap);
    free(kv);
}

pkv_status pkv_contig_kv_append(pkv_contig_kv *kv, uint32_t row, uint32_t n) {
    if (!kv || row >= kv->max_rows) return PKV_ERR_INVALID_ARG;
    if (n > kv->cap[row] - kv->len[row]) return PKV_ERR_BUFFER_TOO_SMALL;
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

// Whether [off, off + cap) meets the extent of a row other than `self`. A linear
// scan: placements happen once per request (per token for realloc-copy), beside a
// forward pass over the whole batch.
static int overlaps(const pkv_contig_kv *kv, uint32_t self, uint64_t off, uint64_t cap) {
    for (uint32_t r = 0; r < kv->hiwater; r++)
        if (r != self && kv->cap[r] > 0 && off < kv->off[r] + kv->cap[r] && kv->off[r] < off + cap)
            return 1;
    return 0;
}

// The extent [off, off + cap) of an arena store, checked.
static pkv_status check_extent(const pkv_contig_kv *kv, uint32_t row, uint64_t off, uint32_t cap) {
    if (cap == 0 || off > kv->arena || cap > kv->arena - off) return PKV_ERR_INVALID_ARG;
    if (overlaps(kv, row, off, cap)) return PKV_ERR_BUSY;
    return PKV_OK;
}

pkv_status pkv_contig_kv_place(pkv_contig_kv *kv, uint32_t row, uint64_t offset,
                               uint32_t capacity) {
    if (!kv || row >= kv->max_rows) return PKV_ERR_INVALID_ARG;
    if (kv->max_len != 0) return PKV_ERR_UNSUPPORTED; // fixed rows do not move
    if (kv->len[row] != 0) return PKV_ERR_BUSY;       // its tokens would be lost: move it
    if (capacity == 0) {
        kv->cap[row] = 0;
        kv->off[row] = 0;
        return PKV_OK;
    }
    pkv_status st = check_extent(kv, row, offset, capacity);
    if (st != PKV_OK) return st;
    kv->off[row] = offset;
    kv->cap[row] = capacity;
    if (row >= kv->hiwater) kv->hiwater = row + 1;
    return PKV_OK;
}

// Copy the first n tokens of the row at offset `src` (in row units) to the one at
// `dst`, every layer and kv head: one run per head when a head's tokens are
// adjacent (head-major), one per layer when a token's heads are (token-major).
static pkv_status copy_tokens(pkv_contig_kv *kv, uint64_t src, uint64_t dst, uint32_t n) {
    pkv_model *m = (pkv_model *)kv->model;
    const pkv_model_config *c = &m->cfg;
    const uint64_t hd = c->head_dim, es = kv->esize;
    const int head_major = kv->token_stride == hd;
    const uint32_t runs = head_major ? c->num_kv_heads : 1;
    const size_t bytes = (size_t)n * (head_major ? hd : kv->token_stride) * es;
    for (uint32_t l = 0; l < c->num_layers && bytes > 0; l++)
        for (uint32_t h = 0; h < runs; h++) {
            const uint64_t base = l * kv->layer_stride + h * kv->head_stride;
            const uint64_t s = (base + src * kv->row_unit) * es, d = (base + dst * kv->row_unit) * es;
            char *k = kv->k, *v = kv->v;
            pkv_status st = m->ops->copy(m, k + d, k + s, bytes);
            if (st == PKV_OK) st = m->ops->copy(m, v + d, v + s, bytes);
            if (st != PKV_OK) return st;
        }
    return PKV_OK;
}

pkv_status pkv_contig_kv_move_row(pkv_contig_kv *kv, uint32_t row, uint64_t offset,
                                  uint32_t capacity) {
    if (!kv || row >= kv->max_rows) return PKV_ERR_INVALID_ARG;
    if (kv->max_len != 0) return PKV_ERR_UNSUPPORTED; // fixed rows do not move
    if (kv->cap[row] == 0) return PKV_ERR_INVALID_ARG;
    if (capacity < kv->len[row]) return PKV_ERR_BUFFER_TOO_SMALL;
    pkv_status st = check_extent(kv, row, offset, capacity);
    if (st != PKV_OK) return st;
    const uint64_t old = kv->off[row];
    if (offset != old) {
        // Allocate, copy, free: the new extent may not overlap the old one.
        if (offset < old + kv->cap[row] && old < offset + capacity) return PKV_ERR_BUSY;
        if ((st = copy_tokens(kv, old, offset, kv->len[row])) != PKV_OK) return st;
    }
    kv->off[row] = offset;
    kv->cap[row] = capacity;
    return PKV_OK;
}

pkv_status pkv_contig_kv_copy_row(pkv_contig_kv *kv, uint32_t src, uint32_t dst) {
    if (!kv || src >= kv->max_rows || dst >= kv->max_rows) return PKV_ERR_INVALID_ARG;
    if (src == dst) return PKV_OK;
    if (kv->len[src] > kv->cap[dst]) return PKV_ERR_BUFFER_TOO_SMALL;
    pkv_status st = copy_tokens(kv, kv->off[src], kv->off[dst], kv->len[src]);
    if (st != PKV_OK) return st;
    kv->len[dst] = kv->len[src];
    return PKV_OK;
}

uint64_t pkv_contig_kv_bytes(const pkv_contig_kv *kv) { return kv ? 2 * kv->bytes_each : 0; }

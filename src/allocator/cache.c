// SPDX-License-Identifier: MIT
// KV-cache storage: one backend arena for every layer and block of a pool (or
// memory the caller owns), the address arithmetic of the layout (see cache.h),
// and batched block copies and transfers on the caller's stream.
// Invariant: the arena holds at least capacity x bytes_per_block bytes; an owned
// arena is allocated exactly once, at creation; an external one is never freed.
#include <stdlib.h>
#include <string.h>

#include "backend_impl.h"
#include "pkv/cache.h"

struct pkv_cache {
    pkv_cache_params params;
    pkv_cache_geometry geom;
    pkv_pool *pool;        // borrowed
    pkv_backend *backend;  // borrowed
    uint32_t num_blocks;
    uint64_t arena_bytes;
    void *arena;           // owned, from backend; borrowed when external
    int external;          // 1: the caller owns the arena
};

size_t pkv_dtype_size(pkv_dtype dtype) {
    switch (dtype) {
    case PKV_DTYPE_F32: return 4;
    case PKV_DTYPE_F16:
    case PKV_DTYPE_BF16: return 2;
    case PKV_DTYPE_INT8:
    case PKV_DTYPE_FP8_E4M3:
    case PKV_DTYPE_FP8_E5M2: return 1;
    }
    return 0;
}

int pkv_dtype_is_quantized(pkv_dtype dtype) {
    return dtype == PKV_DTYPE_INT8 || dtype == PKV_DTYPE_FP8_E4M3 || dtype == PKV_DTYPE_FP8_E5M2;
}

pkv_status pkv_dtype_from_name(const char *name, pkv_dtype *dtype) {
    static const struct { const char *name; pkv_dtype dt; } names[] = {
        {"fp32", PKV_DTYPE_F32}, {"fp16", PKV_DTYPE_F16}, {"bf16", PKV_DTYPE_BF16},
        {"int8", PKV_DTYPE_INT8}, {"fp8_e4m3", PKV_DTYPE_FP8_E4M3},
        {"fp8_e5m2", PKV_DTYPE_FP8_E5M2}, {"fp8", PKV_DTYPE_FP8_E4M3},
    };
    if (!name || !dtype) return PKV_ERR_INVALID_ARG;
    for (size_t i = 0; i < sizeof names / sizeof names[0]; i++) {
        if (strcmp(name, names[i].name) == 0) {
            *dtype = names[i].dt;
            return PKV_OK;
        }
    }
    return PKV_ERR_INVALID_ARG;
}

const char *pkv_dtype_name(pkv_dtype dtype) {
    switch (dtype) {
    case PKV_DTYPE_F32: return "fp32";
    case PKV_DTYPE_F16: return "fp16";
    case PKV_DTYPE_BF16: return "bf16";
    case PKV_DTYPE_INT8: return "int8";
    case PKV_DTYPE_FP8_E4M3: return "fp8_e4m3";
    case PKV_DTYPE_FP8_E5M2: return "fp8_e5m2";
    }
    return "unknown";
}

pkv_cache_params pkv_cache_params_default(void) {
    pkv_cache_params p = {
        .num_layers = 1, .kv_heads = 1, .head_dim = 128, .block_size = 16,
        .dtype = PKV_DTYPE_F16, .layout = PKV_LAYOUT_HND,
    };
    return p;
}

static int params_valid(const pkv_cache_params *p) {
    return p && p->num_layers && p->kv_heads && p->head_dim && p->block_size &&
           p->block_size <= 65536 && pkv_dtype_size(p->dtype) &&
           (p->layout == PKV_LAYOUT_HND || p->layout == PKV_LAYOUT_NHD ||
            p->layout == PKV_LAYOUT_KV_NHD);
}

// a * b, or 0 when the product does not fit in 64 bits (0 is never a valid size).
static uint64_t mul_or_zero(uint64_t a, uint64_t b) {
    uint64_t r;
    return __builtin_mul_overflow(a, b, &r) ? 0 : r;
}

// n rounded up to a multiple of 16 (n < 2^63).
static uint64_t round16(uint64_t n) { return (n + 15) & ~(uint64_t)15; }

uint64_t pkv_cache_bytes_per_token(const pkv_cache_params *p) {
    if (!params_valid(p)) return 0;
    // 2 x layers x kv_heads x (head_dim x dtype size + int8 scale); 0 if it
    // overflows. Every other size and stride of the cache is a factor of
    // bytes_per_block, so this check and the one in pkv_cache_create keep all of
    // them in range.
    uint64_t row = mul_or_zero(p->head_dim, pkv_dtype_size(p->dtype));
    if (row == 0) return 0;
    if (p->dtype == PKV_DTYPE_INT8) row += sizeof(float);
    uint64_t b = mul_or_zero(2ull * p->num_layers, p->kv_heads);
    return mul_or_zero(b, row);
}

// Bytes of one K (or V) half block, int8's padded data and scales included; 0 if
// it does not fit in 62 bits.
static uint64_t half_bytes(const pkv_cache_params *p) {
    uint64_t elems = mul_or_zero((uint64_t)p->kv_heads * p->block_size, p->head_dim);
    uint64_t data = mul_or_zero(elems, pkv_dtype_size(p->dtype));
    if (data == 0 || data > (UINT64_MAX >> 2)) return 0;
    if (p->dtype != PKV_DTYPE_INT8) return data;
    // kv_heads * block_size * 4 < 2^32 * 2^16 * 4: no overflow.
    return round16(data) + round16((uint64_t)p->kv_heads * p->block_size * sizeof(float));
}

uint64_t pkv_cache_bytes_per_block(const pkv_cache_params *p) {
    if (pkv_cache_bytes_per_token(p) == 0) return 0;
    return mul_or_zero(half_bytes(p), 2ull * p->num_layers);
}

static pkv_cache_geometry geometry_of(const pkv_cache_params *p, uint32_t num_blocks) {
    pkv_cache_geometry g;
    memset(&g, 0, sizeof g);
    // Elements; for the 8-bit dtypes an element is a byte, so int8's scales are
    // simply more "elements" at the end of each half.
    uint64_t half = half_bytes(p) / pkv_dtype_size(p->dtype);
    if (p->layout == PKV_LAYOUT_KV_NHD) { // all K halves of a layer, then all V halves
        g.block_stride = half;
        g.kv_stride = half * num_blocks;
    } else { // a block's V half follows its K half
        g.kv_stride = half;
        g.block_stride = 2 * half;
    }
    g.layer_stride = 2 * half * num_blocks;
    if (p->layout == PKV_LAYOUT_HND) {
        g.head_stride = (uint64_t)p->block_size * p->head_dim;
        g.token_stride = p->head_dim;
    } else {
        g.head_stride = p->head_dim;
        g.token_stride = (uint64_t)p->kv_heads * p->head_dim;
    }
    g.half_block_bytes = half * pkv_dtype_size(p->dtype);
    if (p->dtype == PKV_DTYPE_INT8) {
        g.scale_offset = round16((uint64_t)p->kv_heads * p->block_size * p->head_dim);
        g.scale_head_stride = p->block_size;
        g.scale_token_stride = 1;
    }
    return g;
}

pkv_status pkv_cache_create(const pkv_cache_params *params, pkv_pool *pool,
                            pkv_backend *backend, pkv_cache **out) {
    if (!out) return PKV_ERR_INVALID_ARG;
    *out = NULL;
    if (!params_valid(params) || !pool || !backend) return PKV_ERR_INVALID_ARG;
    uint32_t num_blocks = pkv_pool_capacity(pool);
    uint64_t per_block = pkv_cache_bytes_per_block(params);
    if (per_block == 0 || num_blocks > UINT64_MAX / per_block || num_blocks * per_block > SIZE_MAX)
        return PKV_ERR_INVALID_ARG;
    pkv_cache *c = calloc(1, sizeof *c);
    if (!c) return PKV_ERR_OUT_OF_MEMORY;
    c->params = *params;
    c->geom = geometry_of(params, num_blocks);
    c->pool = pool;
    c->backend = backend;
    c->num_blocks = num_blocks;
    c->arena_bytes = num_blocks * per_block;
    pkv_status st = pkv_backend_alloc(backend, (size_t)c->arena_bytes, &c->arena);
    // Zero the arena now: the contents are defined, and on the host every page is
    // backed here rather than faulted in (and cleared) inside a later decode step.
    if (st == PKV_OK) st = pkv_backend_memset(backend, c->arena, 0, (size_t)c->arena_bytes);
    if (st != PKV_OK) {
        if (c->arena) pkv_backend_free(backend, c->arena, (size_t)c->arena_bytes);
        free(c);
        return st;
    }
    *out = c;
    return PKV_OK;
}

pkv_status pkv_cache_create_external(const pkv_cache_params *params, pkv_pool *pool,
                                     pkv_backend *backend, void *data, uint64_t bytes,
                                     pkv_cache **out) {
    if (!out) return PKV_ERR_INVALID_ARG;
    *out = NULL;
    if (!params_valid(params) || !pool || !backend || !data) return PKV_ERR_INVALID_ARG;
    uint32_t num_blocks = pkv_pool_capacity(pool);
    uint64_t per_block = pkv_cache_bytes_per_block(params);
    if (per_block == 0 || num_blocks > UINT64_MAX / per_block || num_blocks * per_block > SIZE_MAX)
        return PKV_ERR_INVALID_ARG;
    if (bytes < num_blocks * per_block) return PKV_ERR_BUFFER_TOO_SMALL;
    // Elements (and int8's fp32 scales, at 16-byte offsets) must be aligned for the
    // kernels that read them.
    const size_t align = params->dtype == PKV_DTYPE_INT8 ? 16 : pkv_dtype_size(params->dtype);
    if ((uintptr_t)data % align != 0) return PKV_ERR_INVALID_ARG;
    pkv_cache *c = calloc(1, sizeof *c);
    if (!c) return PKV_ERR_OUT_OF_MEMORY;
    c->params = *params;
    c->geom = geometry_of(params, num_blocks);
    c->pool = pool;
    c->backend = backend;
    c->num_blocks = num_blocks;
    c->arena_bytes = num_blocks * per_block;
    c->arena = data;
    c->external = 1;
    *out = c;
    return PKV_OK;
}

void pkv_cache_destroy(pkv_cache *cache) {
    if (!cache) return;
    if (!cache->external)
        pkv_backend_free(cache->backend, cache->arena, (size_t)cache->arena_bytes);
    free(cache);
}

pkv_status pkv_cache_get_params(const pkv_cache *cache, pkv_cache_params *params) {
    if (!cache || !params) return PKV_ERR_INVALID_ARG;
    *params = cache->params;
    return PKV_OK;
}

pkv_status pkv_cache_get_geometry(const pkv_cache *cache, pkv_cache_geometry *geometry) {
    if (!cache || !geometry) return PKV_ERR_INVALID_ARG;
    *geometry = cache->geom;
    return PKV_OK;
}

pkv_pool *pkv_cache_pool(const pkv_cache *cache) { return cache ? cache->pool : NULL; }
pkv_backend *pkv_cache_backend(const pkv_cache *cache) { return cache ? cache->backend : NULL; }
uint64_t pkv_cache_arena_bytes(const pkv_cache *cache) { return cache ? cache->arena_bytes : 0; }
void *pkv_cache_data(const pkv_cache *cache) { return cache ? cache->arena : NULL; }

// Byte offset of (layer, block, kv) in the arena.
static uint64_t block_offset(const pkv_cache *c, uint32_t layer, pkv_block_id block, int kv) {
    uint64_t elems = c->geom.layer_stride * layer + c->geom.block_stride * (uint64_t)block +
                     c->geom.kv_stride * (uint64_t)kv;
    return elems * pkv_dtype_size(c->params.dtype);
}

pkv_status pkv_cache_block_ptr(const pkv_cache *cache, uint32_t layer, pkv_block_id block,
                               pkv_kv kv, void **ptr) {
    if (!ptr) return PKV_ERR_INVALID_ARG;
    *ptr = NULL;
    if (!cache || layer >= cache->params.num_layers || (kv != PKV_K && kv != PKV_V))
        return PKV_ERR_INVALID_ARG;
    if ((uint32_t)block >= cache->num_blocks) return PKV_ERR_NOT_FOUND;
    *ptr = (char *)cache->arena + block_offset(cache, layer, block, kv);
    return PKV_OK;
}

// The copy grid of this cache (block_copy.h): K and V of a block are adjacent
// within a layer, so one (pair, layer) moves one contiguous 2 x half block. In
// PKV_LAYOUT_KV_NHD they are not, but each (layer, K or V) is an array of half blocks,
// so the grid's "layers" are the 2 x num_layers halves, one half block each.
static pkvi_copy_geom copy_geom(const pkv_cache *c) {
    const uint64_t es = pkv_dtype_size(c->params.dtype);
    const int split = c->params.layout == PKV_LAYOUT_KV_NHD;
    pkvi_copy_geom g = {
        .layer_stride = (split ? c->geom.kv_stride : c->geom.layer_stride) * es,
        .block_stride = c->geom.block_stride * es,
        .block_bytes = (split ? 1 : 2) * c->geom.half_block_bytes,
        .num_layers = (split ? 2 : 1) * c->params.num_layers,
    };
    return g;
}

pkv_status pkv_cache_copy_blocks(pkv_cache *cache, const pkv_block_copy *copies, uint32_t n,
                                 void *stream) {
    if (!cache || (n && !copies)) return PKV_ERR_INVALID_ARG;
    for (uint32_t i = 0; i < n; i++)
        if ((uint32_t)copies[i].src >= cache->num_blocks ||
            (uint32_t)copies[i].dst >= cache->num_blocks || copies[i].src == copies[i].dst)
            return PKV_ERR_INVALID_ARG;
    pkvi_copy_geom g = copy_geom(cache);
    if (g.num_layers > 65535) return PKV_ERR_UNSUPPORTED; // the grid's y
    return pkvi_backend_copy_blocks(cache->backend, cache->arena, copies, n, &g, stream);
}

pkv_status pkv_cache_apply_copies(pkv_cache *cache, pkv_seqset *set, void *stream) {
    if (!cache || !set || pkv_seqset_pool(set) != cache->pool ||
        pkv_seqset_block_size(set) != cache->params.block_size)
        return PKV_ERR_INVALID_ARG;
    const pkv_block_copy *copies;
    uint32_t n;
    pkv_status st = pkv_seqset_copies(set, &copies, &n);
    if (st != PKV_OK || n == 0) return st;
    // The queue is emptied only once the copies are enqueued, so a failure here (a
    // CUDA error) leaves them queued and pinned for a retry.
    st = pkv_cache_copy_blocks(cache, copies, n, stream);
    return st == PKV_OK ? pkv_seqset_copies_done(set) : st;
}

static int same_shape(const pkv_cache_params *a, const pkv_cache_params *b) {
    return a->num_layers == b->num_layers && a->kv_heads == b->kv_heads &&
           a->head_dim == b->head_dim && a->block_size == b->block_size &&
           a->dtype == b->dtype && a->layout == b->layout;
}

pkv_status pkv_cache_transfer(pkv_cache *dst, const pkv_cache *src, const pkv_block_copy *pairs,
                              uint32_t n, void *stream) {
    if (!dst || !src || dst == src || (n && !pairs) || !same_shape(&dst->params, &src->params))
        return PKV_ERR_INVALID_ARG;
    for (uint32_t i = 0; i < n; i++)
        if ((uint32_t)pairs[i].src >= src->num_blocks || (uint32_t)pairs[i].dst >= dst->num_blocks)
            return PKV_ERR_INVALID_ARG;
    const int src_dev = pkv_backend_get_kind(src->backend) == PKV_BACKEND_CUDA;
    const int dst_dev = pkv_backend_get_kind(dst->backend) == PKV_BACKEND_CUDA;
    if (src_dev && dst_dev) return PKV_ERR_UNSUPPORTED;
    // The copy grid's runs (copy_geom): one per (pair, layer), or per (pair, layer
    // half) in PKV_LAYOUT_KV_NHD; both caches have the same layout.
    const pkvi_copy_geom sg = copy_geom(src), dg = copy_geom(dst);
    const pkvi_xfer_geom g = {
        .src_layer_stride = sg.layer_stride,
        .src_block_stride = sg.block_stride,
        .dst_layer_stride = dg.layer_stride,
        .dst_block_stride = dg.block_stride,
        .block_bytes = sg.block_bytes,
        .num_layers = sg.num_layers,
    };
    // The device side's backend moves the bytes; host to host goes through the
    // destination's host backend.
    pkv_backend *mover = src_dev ? src->backend : dst->backend;
    pkvi_dir dir = src_dev   ? PKVI_DEVICE_TO_HOST
                   : dst_dev ? PKVI_HOST_TO_DEVICE
                             : PKVI_HOST_TO_HOST;
    return pkvi_backend_transfer(mover, dst->arena, src->arena, pairs, n, &g, dir, stream);
}

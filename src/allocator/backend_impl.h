// SPDX-License-Identifier: MIT
// Internal: the function table behind pkv_backend. backend.c checks arguments and
// counts and times every call; an implementation only does the raw work.
#ifndef PKV_BACKEND_IMPL_H
#define PKV_BACKEND_IMPL_H

#include "block_copy.h"
#include "clock.h"
#include "pkv/backend.h"

// Direction of a transfer between a backend's memory and host memory.
typedef enum pkvi_dir {
    PKVI_HOST_TO_HOST = 0,
    PKVI_HOST_TO_DEVICE = 1,
    PKVI_DEVICE_TO_HOST = 2,
} pkvi_dir;

// Two arenas' geometry for a transfer of whole blocks (bytes): block b of layer l
// sits at l * layer_stride + b * block_stride of its arena; block_bytes of it move.
typedef struct pkvi_xfer_geom {
    uint64_t src_layer_stride, src_block_stride;
    uint64_t dst_layer_stride, dst_block_stride;
    uint64_t block_bytes;
    uint32_t num_layers;
} pkvi_xfer_geom;

// Every `stream` is a cudaStream_t for the CUDA backend (NULL: the legacy default
// stream) and ignored by the host backend; the stream calls never synchronize.
typedef struct pkvi_backend_ops {
    const char *name;
    pkv_status (*alloc)(pkv_backend *b, size_t bytes, void **ptr);
    void (*free)(pkv_backend *b, void *ptr);
    pkv_status (*copy)(pkv_backend *b, void *arena, const pkv_copy_region *regions, uint32_t n,
                       void *stream);
    // Whole-block copies (every layer) with one kernel launch per chunk of pairs.
    pkv_status (*copy_blocks)(pkv_backend *b, void *arena, const pkv_block_copy *pairs,
                              uint32_t n, const pkvi_copy_geom *geom, void *stream);
    // Whole blocks between two arenas of the same block shape (pkvi_xfer_geom).
    pkv_status (*transfer)(pkv_backend *b, void *dst_base, const void *src_base,
                           const pkv_block_copy *pairs, uint32_t n, const struct pkvi_xfer_geom *g,
                           pkvi_dir dir, void *stream);
    pkv_status (*sync)(pkv_backend *b, void *stream);
    pkv_status (*memset)(pkv_backend *b, void *ptr, int value, size_t bytes);
    pkv_status (*upload)(pkv_backend *b, void *dst, const void *src, size_t bytes);
    pkv_status (*download)(pkv_backend *b, void *dst, const void *src, size_t bytes);
    void (*destroy)(pkv_backend *b); // optional: releases impl state
} pkvi_backend_ops;

struct pkv_backend {
    const pkvi_backend_ops *ops;
    pkv_backend_kind kind;
    int device;               // CUDA device ordinal; 0 for host
    pkv_backend_stats stats;
};

// Allocate a backend object with zeroed counters (NULL on failure).
pkv_backend *pkvi_backend_new(const pkvi_backend_ops *ops, pkv_backend_kind kind, int device);

// The counted entry points behind pkv_cache (backend.c): one copy call each.
pkv_status pkvi_backend_copy_blocks(pkv_backend *b, void *arena, const pkv_block_copy *pairs,
                                    uint32_t n, const pkvi_copy_geom *geom, void *stream);
pkv_status pkvi_backend_transfer(pkv_backend *b, void *dst_base, const void *src_base,
                                 const pkv_block_copy *pairs, uint32_t n,
                                 const pkvi_xfer_geom *g, pkvi_dir dir, void *stream);

#endif // PKV_BACKEND_IMPL_H

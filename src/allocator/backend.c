// SPDX-License-Identifier: MIT
// The backend interface: argument checks, and the counters and timers that every
// allocation and free passes through, whichever memory is behind them.
#include <stdlib.h>
#include <time.h>

#include "backend_impl.h"

double pkvi_now_seconds(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

pkv_backend *pkvi_backend_new(const pkvi_backend_ops *ops, pkv_backend_kind kind, int device) {
    pkv_backend *b = calloc(1, sizeof *b);
    if (!b) return NULL;
    b->ops = ops;
    b->kind = kind;
    b->device = device;
    return b;
}

void pkv_backend_destroy(pkv_backend *backend) {
    if (!backend) return;
    if (backend->ops->destroy) backend->ops->destroy(backend);
    free(backend);
}

pkv_backend_kind pkv_backend_get_kind(const pkv_backend *backend) {
    return backend ? backend->kind : PKV_BACKEND_HOST;
}

const char *pkv_backend_name(const pkv_backend *backend) {
    return backend ? backend->ops->name : "none";
}

pkv_status pkv_backend_alloc(pkv_backend *backend, size_t bytes, void **ptr) {
    if (!ptr) return PKV_ERR_INVALID_ARG;
    *ptr = NULL;
    if (!backend || bytes == 0) return PKV_ERR_INVALID_ARG;
    double t0 = pkvi_now_seconds();
    pkv_status st = backend->ops->alloc(backend, bytes, ptr);
    backend->stats.alloc_seconds += pkvi_now_seconds() - t0;
    backend->stats.alloc_calls++; // a failed call still cost a call
    if (st == PKV_OK) {
        backend->stats.bytes_live += bytes;
        if (backend->stats.bytes_live > backend->stats.bytes_peak)
            backend->stats.bytes_peak = backend->stats.bytes_live;
    }
    return st;
}

pkv_status pkv_backend_free(pkv_backend *backend, void *ptr, size_t bytes) {
    if (!backend) return PKV_ERR_INVALID_ARG;
    if (!ptr) return PKV_OK;
    if (bytes > backend->stats.bytes_live) return PKV_ERR_INVALID_ARG; // never allocated here
    double t0 = pkvi_now_seconds();
    backend->ops->free(backend, ptr);
    backend->stats.free_seconds += pkvi_now_seconds() - t0;
    backend->stats.free_calls++;
    backend->stats.bytes_live -= bytes;
    return PKV_OK;
}

static void count_copy(pkv_backend *backend, uint64_t bytes) {
    backend->stats.copy_calls++;
    backend->stats.bytes_copied += bytes;
}

pkv_status pkv_backend_copy(pkv_backend *backend, void *arena, const pkv_copy_region *regions,
                            uint32_t n, void *stream) {
    if (!backend || (n && (!arena || !regions))) return PKV_ERR_INVALID_ARG;
    if (n == 0) return PKV_OK;
    uint64_t bytes = 0;
    for (uint32_t i = 0; i < n; i++) bytes += regions[i].bytes;
    pkv_status st = backend->ops->copy(backend, arena, regions, n, stream);
    if (st == PKV_OK) count_copy(backend, bytes);
    return st;
}

pkv_status pkvi_backend_copy_blocks(pkv_backend *b, void *arena, const pkv_block_copy *pairs,
                                    uint32_t n, const pkvi_copy_geom *geom, void *stream) {
    if (n == 0) return PKV_OK;
    pkv_status st = b->ops->copy_blocks(b, arena, pairs, n, geom, stream);
    if (st == PKV_OK) count_copy(b, (uint64_t)n * geom->num_layers * geom->block_bytes);
    return st;
}

pkv_status pkvi_backend_transfer(pkv_backend *b, void *dst_base, const void *src_base,
                                 const pkv_block_copy *pairs, uint32_t n,
                                 const pkvi_xfer_geom *g, pkvi_dir dir, void *stream) {
    if (n == 0) return PKV_OK;
    pkv_status st = b->ops->transfer(b, dst_base, src_base, pairs, n, g, dir, stream);
    if (st == PKV_OK) count_copy(b, (uint64_t)n * g->num_layers * g->block_bytes);
    return st;
}

pkv_status pkv_backend_sync(pkv_backend *backend, void *stream) {
    if (!backend) return PKV_ERR_INVALID_ARG;
    return backend->ops->sync(backend, stream);
}

pkv_status pkv_backend_memset(pkv_backend *backend, void *ptr, int value, size_t bytes) {
    if (!backend || (!ptr && bytes)) return PKV_ERR_INVALID_ARG;
    if (bytes == 0) return PKV_OK;
    return backend->ops->memset(backend, ptr, value, bytes);
}

pkv_status pkv_backend_upload(pkv_backend *backend, void *dst, const void *host_src,
                              size_t bytes) {
    if (!backend || (bytes && (!dst || !host_src))) return PKV_ERR_INVALID_ARG;
    if (bytes == 0) return PKV_OK;
    return backend->ops->upload(backend, dst, host_src, bytes);
}

pkv_status pkv_backend_download(pkv_backend *backend, void *host_dst, const void *src,
                                size_t bytes) {
    if (!backend || (bytes && (!host_dst || !src))) return PKV_ERR_INVALID_ARG;
    if (bytes == 0) return PKV_OK;
    return backend->ops->download(backend, host_dst, src, bytes);
}

pkv_status pkv_backend_get_stats(const pkv_backend *backend, pkv_backend_stats *stats) {
    if (!backend || !stats) return PKV_ERR_INVALID_ARG;
    *stats = backend->stats;
    return PKV_OK;
}

void pkv_backend_reset_stats(pkv_backend *backend) {
    if (!backend) return;
    uint64_t live = backend->stats.bytes_live;
    pkv_backend_stats zero = {0};
    backend->stats = zero;
    backend->stats.bytes_live = live;
    backend->stats.bytes_peak = live;
}

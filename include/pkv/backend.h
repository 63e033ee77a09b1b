// SPDX-License-Identifier: MIT
// Memory backends: where KV bytes live. One small interface with two
// implementations, host memory (always present) and CUDA device memory (present
// when the library was built with CUDA). Every allocation and free call a backend
// makes is counted and timed: those counters are the evidence for "device
// allocation calls avoided" (the pool-backed cache makes one call; a per-request
// policy makes one per request).
//
// Thread-safety: a backend may be shared by several caches but is used by one
// thread at a time (its counters are not atomic).
#ifndef PKV_BACKEND_H
#define PKV_BACKEND_H

#include <stddef.h>
#include <stdint.h>

#include "pkv/status.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct pkv_backend pkv_backend;

typedef enum pkv_backend_kind {
    PKV_BACKEND_HOST = 0,
    PKV_BACKEND_CUDA = 1,
} pkv_backend_kind;

// Counters of backend calls since creation (or the last pkv_backend_reset_stats).
typedef struct pkv_backend_stats {
    uint64_t alloc_calls;      // calls to the underlying allocator (malloc/cudaMalloc)
    uint64_t free_calls;       // calls to the underlying free (free/cudaFree)
    double alloc_seconds;      // wall time spent inside those allocation calls
    double free_seconds;       // wall time spent inside those free calls
    uint64_t copy_calls;       // batched copy and transfer calls (one per library call)
    uint64_t bytes_copied;     // bytes moved by those calls
    uint64_t bytes_live;       // bytes currently allocated through this backend
    uint64_t bytes_peak;       // largest bytes_live seen
} pkv_backend_stats;

// One region copy: `bytes` from src_offset to dst_offset inside the same arena.
typedef struct pkv_copy_region {
    uint64_t src_offset;
    uint64_t dst_offset;
    uint64_t bytes;
} pkv_copy_region;

// A host backend: posix_memalign, 64-byte aligned (page aligned from 64 KiB up).
// The library never links a malloc replacement such as jemalloc: an embeddable
// library must not change the host process's malloc.
pkv_status pkv_backend_create_host(pkv_backend **out);

// A CUDA backend on device `device`. PKV_ERR_UNSUPPORTED when the library was built
// without CUDA; PKV_ERR_NO_DEVICE when no such device is usable (no driver, no GPU).
// Defined in libpagedkv only: libpagedkv-core has no CUDA code at all (an engine
// that runs its own kernels uses the core's pool, sets and prefix cache, and an
// external cache over its own tensor only for the address arithmetic).
pkv_status pkv_backend_create_cuda(int device, pkv_backend **out);

// Destroy a backend. NULL does nothing. Memory still allocated through it is not
// freed here; free it first (bytes_live says how much is left).
void pkv_backend_destroy(pkv_backend *backend);

pkv_backend_kind pkv_backend_get_kind(const pkv_backend *backend);
const char *pkv_backend_name(const pkv_backend *backend); // "host" or "cuda"

// Allocate `bytes` (> 0) of backend memory: one counted, timed call. *ptr is owned
// by the caller and must go back through pkv_backend_free of the same backend.
// A CUDA pointer is a device address and must not be dereferenced on the host.
pkv_status pkv_backend_alloc(pkv_backend *backend, size_t bytes, void **ptr);

// Free memory from pkv_backend_alloc (counted, timed). NULL is accepted and not counted.
pkv_status pkv_backend_free(pkv_backend *backend, void *ptr, size_t bytes);

// Streams: every copy and transfer entry point of the library (this one,
// pkv_cache_copy_blocks, pkv_cache_apply_copies, pkv_cache_transfer) takes a
// `void *stream`: a cudaStream_t for a CUDA backend (NULL = the legacy default
// stream), ignored by the host backend. They enqueue the work and return without
// synchronizing; work enqueued later on the same stream sees it done. Use
// pkv_backend_sync, or your own events, before the host reads the result.

// Copy regions inside one arena in one batch (CUDA: one cudaMemcpyAsync per region
// on `stream`). regions: borrowed, n entries; regions must not overlap.
pkv_status pkv_backend_copy(pkv_backend *backend, void *arena,
                            const pkv_copy_region *regions, uint32_t n, void *stream);

// Wait until the work enqueued on `stream` is done (CUDA: cudaStreamSynchronize;
// host: returns at once).
pkv_status pkv_backend_sync(pkv_backend *backend, void *stream);

// Fill `bytes` at ptr with the byte value `value`.
pkv_status pkv_backend_memset(pkv_backend *backend, void *ptr, int value, size_t bytes);

// Copy between this backend's memory and host memory (dst/src host side borrowed).
pkv_status pkv_backend_upload(pkv_backend *backend, void *dst, const void *host_src,
                              size_t bytes);
pkv_status pkv_backend_download(pkv_backend *backend, void *host_dst, const void *src,
                                size_t bytes);

pkv_status pkv_backend_get_stats(const pkv_backend *backend, pkv_backend_stats *stats);
void pkv_backend_reset_stats(pkv_backend *backend); // keeps bytes_live, resets the rest

#ifdef __cplusplus
}
#endif

#endif // PKV_BACKEND_H

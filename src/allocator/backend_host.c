// SPDX-License-Identifier: MIT
// Host memory backend: the one that always exists. posix_memalign so that K/V
// rows start on cache lines; arenas of 2 MiB and more are 2 MiB aligned and asked
// for transparent huge pages, because paged attention visits blocks scattered
// over the whole arena and 4 KiB pages would cost a TLB miss per block.
#define _DEFAULT_SOURCE // madvise and MADV_HUGEPAGE (Linux); the build is POSIX otherwise
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

#include "backend_impl.h"

#define HUGE_PAGE ((size_t)2 << 20)

static pkv_status host_alloc(pkv_backend *b, size_t bytes, void **ptr) {
    (void)b;
    size_t align = bytes >= HUGE_PAGE ? HUGE_PAGE : bytes >= 65536 ? 4096 : 64;
    void *p = NULL;
    if (posix_memalign(&p, align, bytes) != 0) return PKV_ERR_OUT_OF_MEMORY;
#ifdef MADV_HUGEPAGE
    // Advice only: where THP is off or unavailable this fails and changes nothing.
    if (bytes >= HUGE_PAGE) (void)madvise(p, bytes & ~(HUGE_PAGE - 1), MADV_HUGEPAGE);
#endif
    *ptr = p;
    return PKV_OK;
}

static void host_free(pkv_backend *b, void *ptr) {
    (void)b;
    free(ptr);
}

static pkv_status host_copy(pkv_backend *b, void *arena, const pkv_copy_region *regions,
                            uint32_t n, void *stream) {
    (void)b, (void)stream;
    unsigned char *base = arena;
    for (uint32_t i = 0; i < n; i++)
        memcpy(base + regions[i].dst_offset, base + regions[i].src_offset, regions[i].bytes);
    return PKV_OK;
}

// The CUDA kernel's grid run on the host (block_copy.h): launches of up to
// PKVI_COPY_CHUNK pairs, one "thread block" per (pair, layer), same offsets.
static pkv_status host_copy_blocks(pkv_backend *b, void *arena, const pkv_block_copy *pairs,
                                   uint32_t n, const pkvi_copy_geom *g, void *stream) {
    (void)b, (void)stream;
    char *base = arena;
    for (uint32_t launch = 0; launch < pkvi_copy_launches(n); launch++) {
        const pkv_block_copy *chunk = pairs + (size_t)launch * PKVI_COPY_CHUNK;
        uint32_t m = n - launch * PKVI_COPY_CHUNK;
        if (m > PKVI_COPY_CHUNK) m = PKVI_COPY_CHUNK;
        for (uint32_t y = 0; y < g->num_layers; y++)
            for (uint32_t x = 0; x < m; x++)
                memcpy(base + pkvi_copy_offset(g, y, chunk[x].dst),
                       base + pkvi_copy_offset(g, y, chunk[x].src), (size_t)g->block_bytes);
    }
    return PKV_OK;
}

static pkv_status host_transfer(pkv_backend *b, void *dst_base, const void *src_base,
                                const pkv_block_copy *pairs, uint32_t n, const pkvi_xfer_geom *g,
                                pkvi_dir dir, void *stream) {
    (void)b, (void)dir, (void)stream;
    for (uint32_t i = 0; i < n; i++)
        for (uint32_t l = 0; l < g->num_layers; l++)
            memcpy((char *)dst_base + l * g->dst_layer_stride +
                       (uint64_t)(uint32_t)pairs[i].dst * g->dst_block_stride,
                   (const char *)src_base + l * g->src_layer_stride +
                       (uint64_t)(uint32_t)pairs[i].src * g->src_block_stride,
                   (size_t)g->block_bytes);
    return PKV_OK;
}

static pkv_status host_sync(pkv_backend *b, void *stream) {
    (void)b, (void)stream;
    return PKV_OK; // host copies are done when they return
}

static pkv_status host_memset(pkv_backend *b, void *ptr, int value, size_t bytes) {
    (void)b;
    memset(ptr, value, bytes);
    return PKV_OK;
}

static pkv_status host_memcpy(pkv_backend *b, void *dst, const void *src, size_t bytes) {
    (void)b;
    memcpy(dst, src, bytes);
    return PKV_OK;
}

static const pkvi_backend_ops host_ops = {
    .name = "host",
    .alloc = host_alloc,
    .free = host_free,
    .copy = host_copy,
    .copy_blocks = host_copy_blocks,
    .transfer = host_transfer,
    .sync = host_sync,
    .memset = host_memset,
    .upload = host_memcpy,
    .download = host_memcpy,
    .destroy = NULL,
};

pkv_status pkv_backend_create_host(pkv_backend **out) {
    if (!out) return PKV_ERR_INVALID_ARG;
    *out = pkvi_backend_new(&host_ops, PKV_BACKEND_HOST, 0);
    return *out ? PKV_OK : PKV_ERR_OUT_OF_MEMORY;
}

// SPDX-License-Identifier: MIT
// CUDA device-memory backend: cudaMalloc / cudaFree (the calls the pool exists to
// avoid); copies and transfers enqueued on the caller's stream without any
// synchronization; whole-block copies as one kernel launch (block_copy.cu). Plain
// C against the CUDA runtime API. Built into libpagedkv only, never into the core.
#include <cuda_runtime_api.h>

#include "backend_impl.h"

static pkv_status cuda_status(cudaError_t err) {
    if (err == cudaSuccess) return PKV_OK;
    if (err == cudaErrorMemoryAllocation) return PKV_ERR_OUT_OF_MEMORY;
    if (err == cudaErrorNoDevice || err == cudaErrorInsufficientDriver ||
        err == cudaErrorInvalidDevice)
        return PKV_ERR_NO_DEVICE;
    return PKV_ERR_BACKEND;
}

static pkv_status set_device(pkv_backend *b) { return cuda_status(cudaSetDevice(b->device)); }

static pkv_status cuda_alloc(pkv_backend *b, size_t bytes, void **ptr) {
    pkv_status st = set_device(b);
    if (st != PKV_OK) return st;
    return cuda_status(cudaMalloc(ptr, bytes));
}

static void cuda_free(pkv_backend *b, void *ptr) {
    if (set_device(b) == PKV_OK) cudaFree(ptr);
}

static pkv_status cuda_copy(pkv_backend *b, void *arena, const pkv_copy_region *regions,
                            uint32_t n, void *stream) {
    pkv_status st = set_device(b);
    if (st != PKV_OK) return st;
    char *base = arena;
    for (uint32_t i = 0; i < n; i++) {
        cudaError_t err =
            cudaMemcpyAsync(base + regions[i].dst_offset, base + regions[i].src_offset,
                            regions[i].bytes, cudaMemcpyDeviceToDevice, (cudaStream_t)stream);
        if (err != cudaSuccess) return cuda_status(err);
    }
    return PKV_OK;
}

static pkv_status cuda_copy_blocks(pkv_backend *b, void *arena, const pkv_block_copy *pairs,
                                   uint32_t n, const pkvi_copy_geom *geom, void *stream) {
    pkv_status st = set_device(b);
    if (st != PKV_OK) return st;
    return cuda_status((cudaError_t)pkvi_cuda_copy_blocks(arena, pairs, n, geom, stream));
}

static pkv_status cuda_transfer(pkv_backend *b, void *dst_base, const void *src_base,
                                const pkv_block_copy *pairs, uint32_t n, const pkvi_xfer_geom *g,
                                pkvi_dir dir, void *stream) {
    pkv_status st = set_device(b);
    if (st != PKV_OK) return st;
    enum cudaMemcpyKind kind = dir == PKVI_HOST_TO_DEVICE   ? cudaMemcpyHostToDevice
                               : dir == PKVI_DEVICE_TO_HOST ? cudaMemcpyDeviceToHost
                                                            : cudaMemcpyHostToHost;
    // One 2D copy per pair: its num_layers rows of block_bytes, rows a layer stride
    // apart on each side. Pitches past the device's limit (a layer over ~2 GiB)
    // fall back to one copy per (pair, layer). With a pageable host side CUDA may
    // finish the copy before returning; with pinned memory it is truly asynchronous
    // and the caller synchronizes the stream before reading it.
    int max_pitch = 0;
    if (cudaDeviceGetAttribute(&max_pitch, cudaDevAttrMaxPitch, b->device) != cudaSuccess)
        max_pitch = 0;
    const int two_d = g->num_layers > 1 && g->src_layer_stride <= (uint64_t)max_pitch &&
                      g->dst_layer_stride <= (uint64_t)max_pitch;
    cudaStream_t cs = (cudaStream_t)stream;
    for (uint32_t i = 0; i < n; i++) {
        char *dst = (char *)dst_base + (uint64_t)(uint32_t)pairs[i].dst * g->dst_block_stride;
        const char *src =
            (const char *)src_base + (uint64_t)(uint32_t)pairs[i].src * g->src_block_stride;
        cudaError_t err = cudaSuccess;
        if (two_d) {
            err = cudaMemcpy2DAsync(dst, (size_t)g->dst_layer_stride, src,
                                    (size_t)g->src_layer_stride, (size_t)g->block_bytes,
                                    g->num_layers, kind, cs);
        } else {
            for (uint32_t l = 0; l < g->num_layers && err == cudaSuccess; l++)
                err = cudaMemcpyAsync(dst + l * g->dst_layer_stride, src + l * g->src_layer_stride,
                                      (size_t)g->block_bytes, kind, cs);
        }
        if (err != cudaSuccess) return cuda_status(err);
    }
    return PKV_OK;
}

static pkv_status cuda_sync(pkv_backend *b, void *stream) {
    pkv_status st = set_device(b);
    if (st != PKV_OK) return st;
    return cuda_status(cudaStreamSynchronize((cudaStream_t)stream));
}

static pkv_status cuda_memset_impl(pkv_backend *b, void *ptr, int value, size_t bytes) {
    pkv_status st = set_device(b);
    if (st != PKV_OK) return st;
    return cuda_status(cudaMemset(ptr, value, bytes));
}

static pkv_status cuda_upload(pkv_backend *b, void *dst, const void *src, size_t bytes) {
    pkv_status st = set_device(b);
    if (st != PKV_OK) return st;
    return cuda_status(cudaMemcpy(dst, src, bytes, cudaMemcpyHostToDevice));
}

static pkv_status cuda_download(pkv_backend *b, void *dst, const void *src, size_t bytes) {
    pkv_status st = set_device(b);
    if (st != PKV_OK) return st;
    return cuda_status(cudaMemcpy(dst, src, bytes, cudaMemcpyDeviceToHost));
}

static const pkvi_backend_ops cuda_ops = {
    .name = "cuda",
    .alloc = cuda_alloc,
    .free = cuda_free,
    .copy = cuda_copy,
    .copy_blocks = cuda_copy_blocks,
    .transfer = cuda_transfer,
    .sync = cuda_sync,
    .memset = cuda_memset_impl,
    .upload = cuda_upload,
    .download = cuda_download,
    .destroy = NULL,
};

pkv_status pkv_backend_create_cuda(int device, pkv_backend **out) {
    if (!out) return PKV_ERR_INVALID_ARG;
    *out = NULL;
    int count = 0;
    cudaError_t err = cudaGetDeviceCount(&count);
    if (err != cudaSuccess || count == 0) {
        cudaGetLastError(); // clear the sticky "no device" error for later callers
        return PKV_ERR_NO_DEVICE;
    }
    if (device < 0 || device >= count) return PKV_ERR_NO_DEVICE;
    *out = pkvi_backend_new(&cuda_ops, PKV_BACKEND_CUDA, device);
    return *out ? PKV_OK : PKV_ERR_OUT_OF_MEMORY;
}

// SPDX-License-Identifier: MIT
// Internal: the block-copy "grid" shared by the CUDA kernel (block_copy.cu) and
// its host emulation (backend_host.c), so that the host tests exercise the same
// chunking and offset arithmetic the kernel uses. A copy of block src to dst
// moves block_bytes (K and V of one layer, adjacent) in every layer:
//   byte offset of (layer l, block b) = l * layer_stride + b * block_stride.
// One launch covers up to PKVI_COPY_CHUNK pairs and every layer: grid
// (pairs in the chunk, layers), one thread block per (pair, layer). The pairs
// travel as a kernel parameter (PKVI_COPY_CHUNK * 8 bytes + the geometry stays
// under the classic 4 KiB parameter limit), so no device buffer, no host-to-device
// copy and nothing to keep alive after the launch.
#ifndef PKV_BLOCK_COPY_H
#define PKV_BLOCK_COPY_H

#include <stdint.h>

#include "pkv/seq.h"

#define PKVI_COPY_CHUNK 448u

// Host and device: the same arithmetic on both sides.
#ifdef __CUDACC__
#define PKVI_HD __host__ __device__
#else
#define PKVI_HD
#endif

typedef struct pkvi_copy_geom {
    uint64_t layer_stride; // bytes between layer l and l + 1 of one block
    uint64_t block_stride; // bytes between block b and b + 1 of one layer
    uint64_t block_bytes;  // bytes copied per (pair, layer): K and V halves
    uint32_t num_layers;   // grid y (<= 65535)
} pkvi_copy_geom;

// Byte offset of block b in layer l. The int32 id is widened before multiplying.
PKVI_HD static inline uint64_t pkvi_copy_offset(const pkvi_copy_geom *g, uint32_t l,
                                                pkv_block_id b) {
    return (uint64_t)l * g->layer_stride + (uint64_t)(uint32_t)b * g->block_stride;
}

// Launches needed for n pairs.
static inline uint32_t pkvi_copy_launches(uint32_t n) {
    return (n + PKVI_COPY_CHUNK - 1) / PKVI_COPY_CHUNK;
}

#ifdef __cplusplus
extern "C" {
#endif
// CUDA: copy pairs[0..n-1] in arena (device memory) on `stream` (a cudaStream_t,
// NULL = legacy default stream) with pkvi_copy_launches(n) kernel launches and no
// synchronization. Returns a cudaError_t value (0 = success). Defined in
// block_copy.cu, built only with CUDA.
int pkvi_cuda_copy_blocks(void *arena, const pkv_block_copy *pairs, uint32_t n,
                          const pkvi_copy_geom *geom, void *stream);
#ifdef __cplusplus
}
#endif

#endif // PKV_BLOCK_COPY_H

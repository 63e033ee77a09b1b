// SPDX-License-Identifier: MIT
// The CUDA block copy of copy-on-write: every (pair, layer) of up to
// PKVI_COPY_CHUNK pairs in one kernel launch on the caller's stream. See
// block_copy.h for the grid and the offsets; backend_host.c runs the same grid on
// the host, which is what the CPU-only tests check.
#include <cuda_runtime.h>

#include "block_copy.h"

namespace {
constexpr unsigned kThreads = 256;

struct CopyArgs {
    char *arena;                          // device base of the arena
    pkvi_copy_geom g;                     // bytes
    uint32_t n;                           // pairs in this launch (<= PKVI_COPY_CHUNK)
    pkv_block_copy pairs[PKVI_COPY_CHUNK]; // [n] {src, dst}
};
static_assert(sizeof(CopyArgs) <= 4096, "kernel parameters must fit the 4 KiB limit");
} // namespace

// Grid: x = pair in the chunk, y = layer; kThreads threads stride over block_bytes,
// 16 bytes at a time when src, dst and the size allow it (a cudaMalloc arena with
// a 16-byte multiple block does), else byte by byte (an odd external pointer).
// __grid_constant__ keeps the pair array in parameter space, indexed by blockIdx.
// static: neither the kernel nor its host stub is a symbol of the library.
static __global__ void __launch_bounds__(kThreads)
    copy_blocks_kernel(const __grid_constant__ CopyArgs a) {
    const pkv_block_copy c = a.pairs[blockIdx.x];
    const char *src = a.arena + pkvi_copy_offset(&a.g, blockIdx.y, c.src);
    char *dst = a.arena + pkvi_copy_offset(&a.g, blockIdx.y, c.dst);
    const uint64_t bytes = a.g.block_bytes;
    if ((((uintptr_t)src | (uintptr_t)dst | bytes) & 15u) == 0) {
        const uint4 *s = reinterpret_cast<const uint4 *>(src);
        uint4 *d = reinterpret_cast<uint4 *>(dst);
        for (uint64_t i = threadIdx.x; i < bytes / 16; i += kThreads) d[i] = s[i];
    } else {
        for (uint64_t i = threadIdx.x; i < bytes; i += kThreads) dst[i] = src[i];
    }
}

extern "C" __attribute__((visibility("hidden"))) int
pkvi_cuda_copy_blocks(void *arena, const pkv_block_copy *pairs, uint32_t n,
                      const pkvi_copy_geom *geom, void *stream) {
    if (n == 0) return (int)cudaSuccess;
    if (geom->num_layers == 0 || geom->num_layers > 65535u) return (int)cudaErrorInvalidValue;
    cudaStream_t st = static_cast<cudaStream_t>(stream);
    // CopyArgs is ~3.6 KiB: static storage is not an option (re-entrancy), and the
    // stack of the calling host thread holds it comfortably.
    CopyArgs a;
    a.arena = static_cast<char *>(arena);
    a.g = *geom;
    // Launch errors are read without clearing a caller's pending error (issue
    // 20, defect 9: cudaGetLastError cleared it), as attn_cuda.cuh's launchers
    // do: with one pending before, ours shows at the next synchronizing call.
    const cudaError_t before = cudaPeekAtLastError();
    for (uint32_t done = 0; done < n; done += PKVI_COPY_CHUNK) {
        a.n = n - done < PKVI_COPY_CHUNK ? n - done : PKVI_COPY_CHUNK;
        for (uint32_t i = 0; i < a.n; i++) a.pairs[i] = pairs[done + i];
        dim3 grid(a.n, geom->num_layers);
        copy_blocks_kernel<<<grid, kThreads, 0, st>>>(a);
        if (before == cudaSuccess) {
            const cudaError_t err = cudaPeekAtLastError();
            if (err != cudaSuccess) {
                (void)cudaGetLastError(); // ours: reported, not left behind
                return (int)err;
            }
        }
    }
    return (int)cudaSuccess;
}

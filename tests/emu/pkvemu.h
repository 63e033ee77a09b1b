// SPDX-License-Identifier: MIT
// pkvemu: a CPU emulator for the project's CUDA kernels, so that the unmodified
// .cu sources are tested in CI on machines without a GPU (tests/emu, suite emu).
// This header stands in for cuda_runtime.h, cuda_fp16.h and cuda_bf16.h (the
// files in tests/emu/include include it). Its C part is the runtime API subset the
// project uses, renamed to pkvemu_* by macros so that it never clashes with a
// real libcudart linked in the same program; its C++ part is the device side:
// built-in variables, __shared__, barriers, warp shuffles and votes, __ldg and
// the fp16/bf16 types. tests/emu/translate.py turns `k<<<grid, block, smem,
// stream>>>(args)` into pkvemu::launch(...).run(k, args): the only change made
// to the .cu text.
// Semantics (docs/KERNELS.md, "CPU emulation"): every CUDA thread is a fiber;
// a launch runs its blocks one after the other, in an order that changes from
// launch to launch (forward, reverse, shuffled), and the threads of a block in
// forward or reverse order, each until it blocks (barrier, warp collective) or,
// in the preempting modes, at random __ldg calls. Every __shared__ byte is NaN
// (0xff) at block start. A divergent barrier, a warp collective whose mask is not
// the set of lanes that reach it, an exited thread that others wait for, a
// misaligned or out-of-bounds __ldg, a launch the hardware would refuse (block >
// 1024 threads, grid y/z > 65535, dynamic shared memory > 48 KiB without the
// attribute) and a deadlock are reported with file:line and the process exits 1.
// Plain loads and stores are not instrumented: device buffers are placed against
// a PROT_NONE guard page, so an overrun past the end faults and is reported.
#ifndef PKVEMU_H
#define PKVEMU_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef enum cudaError {
    cudaSuccess = 0,
    cudaErrorInvalidValue = 1,
    cudaErrorMemoryAllocation = 2,
    cudaErrorInvalidConfiguration = 9,
    cudaErrorInvalidDevicePointer = 17,
    cudaErrorNoDevice = 100,
    // The runtime's "cannot start" codes (attn_cuda.cuh's pkvi_cuda_unavailable).
    cudaErrorInitializationError = 3,
    cudaErrorStubLibrary = 34,
    cudaErrorInsufficientDriver = 35,
    cudaErrorDevicesUnavailable = 46,
    cudaErrorSystemDriverMismatch = 803,
    cudaErrorCompatNotSupportedOnDevice = 804,
} cudaError_t;

typedef struct CUstream_st *cudaStream_t;

enum cudaMemcpyKind {
    cudaMemcpyHostToHost = 0,
    cudaMemcpyHostToDevice = 1,
    cudaMemcpyDeviceToHost = 2,
    cudaMemcpyDeviceToDevice = 3,
    cudaMemcpyDefault = 4,
};

enum cudaDeviceAttr {
    cudaDevAttrMaxThreadsPerBlock = 1,
    cudaDevAttrMaxSharedMemoryPerBlock = 8,
    cudaDevAttrMultiProcessorCount = 16,
    cudaDevAttrMaxSharedMemoryPerBlockOptin = 97,
};

enum cudaFuncAttribute {
    cudaFuncAttributeMaxDynamicSharedMemorySize = 8,
};

struct cudaDeviceProp {
    char name[256];
    size_t totalGlobalMem;
    size_t sharedMemPerBlock;
    size_t sharedMemPerBlockOptin;
    int major;
    int minor;
    int multiProcessorCount;
    int maxThreadsPerMultiProcessor;
    int l2CacheSize;
};

#define cudaMalloc pkvemu_cudaMalloc
#define cudaFree pkvemu_cudaFree
#define cudaMemcpy pkvemu_cudaMemcpy
#define cudaMemcpyAsync pkvemu_cudaMemcpyAsync
#define cudaMemset pkvemu_cudaMemset
#define cudaMemsetAsync pkvemu_cudaMemsetAsync
#define cudaDeviceSynchronize pkvemu_cudaDeviceSynchronize
#define cudaStreamSynchronize pkvemu_cudaStreamSynchronize
#define cudaGetDeviceCount pkvemu_cudaGetDeviceCount
#define cudaGetDevice pkvemu_cudaGetDevice
#define cudaSetDevice pkvemu_cudaSetDevice
#define cudaDeviceGetAttribute pkvemu_cudaDeviceGetAttribute
#define cudaGetDeviceProperties pkvemu_cudaGetDeviceProperties
#define cudaGetLastError pkvemu_cudaGetLastError
#define cudaPeekAtLastError pkvemu_cudaPeekAtLastError
#define cudaGetErrorString pkvemu_cudaGetErrorString

cudaError_t cudaMalloc(void **ptr, size_t bytes);
cudaError_t cudaFree(void *ptr);
cudaError_t cudaMemcpy(void *dst, const void *src, size_t bytes, enum cudaMemcpyKind kind);
cudaError_t cudaMemcpyAsync(void *dst, const void *src, size_t bytes, enum cudaMemcpyKind kind,
                            cudaStream_t stream);
cudaError_t cudaMemset(void *dst, int value, size_t bytes);
cudaError_t cudaMemsetAsync(void *dst, int value, size_t bytes, cudaStream_t stream);
cudaError_t cudaDeviceSynchronize(void);
cudaError_t cudaStreamSynchronize(cudaStream_t stream);
cudaError_t cudaGetDeviceCount(int *count);
cudaError_t cudaGetDevice(int *dev);
cudaError_t cudaSetDevice(int dev);
cudaError_t cudaDeviceGetAttribute(int *value, enum cudaDeviceAttr attr, int dev);
cudaError_t cudaGetDeviceProperties(struct cudaDeviceProp *prop, int dev);
cudaError_t cudaGetLastError(void);
cudaError_t cudaPeekAtLastError(void);
const char *cudaGetErrorString(cudaError_t e);

// Emulator controls (tests): launches so far, and the scheduling mode of the next
// launches (-1 = rotate through all modes, the default; env PKVEMU_MODE sets it).
uint64_t pkvemu_launch_count(void);
void pkvemu_set_mode(int mode);
// The grid of the last launch (back = 0) or of the one before it (back = 1):
// the tests read the split plan a call chose from the decode kernel's grid.
void pkvemu_launch_grid(int back, unsigned grid[3]);
// Between these, a call that a CUDA graph capture cannot hold (cudaMalloc,
// cudaFree, cudaMemcpy[Async], cudaMemset[Async], a device or stream
// synchronization) is reported with `what` and the process exits 1: the tests
// check that the calls documented as capture-safe are.
void pkvemu_capture_begin(const char *what);
void pkvemu_capture_end(void);
// SM count that cudaDeviceGetAttribute reports (env PKVEMU_SMS, default 132: an H200).
int pkvemu_num_sms(void);

#ifdef __cplusplus
} // extern "C"

#include <math.h>
#include <string.h>

#include <functional>
#include <tuple>
#include <type_traits>
#include <utility>

#include "src/attention/half.h"

#define __global__
#define __device__
#define __host__
#define __forceinline__ inline
#define __noinline__ __attribute__((noinline))
#define __launch_bounds__(...)
#define __grid_constant__
#define __align__(n) __attribute__((aligned(n)))
// Every __shared__ variable lands in one linker section that the emulator fills
// with NaN before each block (blocks run one at a time, so one copy suffices).
#define __shared__ static __attribute__((section("pkvemu_shared"), aligned(16)))

struct uint3 {
    unsigned x, y, z;
};
struct dim3 {
    unsigned x, y, z;
    dim3(unsigned a = 1, unsigned b = 1, unsigned c = 1) : x(a), y(b), z(c) {}
};
struct __align__(16) uint4 {
    unsigned x, y, z, w;
};
struct __align__(8) uint2 {
    unsigned x, y;
};
struct __align__(8) float2 {
    float x, y;
};
struct __align__(16) float4 {
    float x, y, z, w;
};
struct __align__(16) int4 {
    int x, y, z, w;
};

struct __half {
    uint16_t bits;
};
struct __align__(4) __half2 {
    __half x, y;
};
struct __nv_bfloat16 {
    uint16_t bits;
};
struct __align__(4) __nv_bfloat162 {
    __nv_bfloat16 x, y;
};

inline float __half2float(__half h) { return pkvi_f16_to_f32(h.bits); }
inline __half __float2half_rn(float f) { return __half{pkvi_f32_to_f16(f)}; }
inline __half __float2half(float f) { return __float2half_rn(f); }
inline float2 __half22float2(__half2 h) { return float2{__half2float(h.x), __half2float(h.y)}; }
inline float __bfloat162float(__nv_bfloat16 h) { return pkvi_bf16_to_f32(h.bits); }
inline __nv_bfloat16 __float2bfloat16_rn(float f) { return __nv_bfloat16{pkvi_f32_to_bf16(f)}; }
inline __nv_bfloat16 __float2bfloat16(float f) { return __float2bfloat16_rn(f); }
inline float2 __bfloat1622float2(__nv_bfloat162 h) {
    return float2{__bfloat162float(h.x), __bfloat162float(h.y)};
}

inline float __int_as_float(int i) {
    float f;
    memcpy(&f, &i, 4);
    return f;
}
inline float __uint_as_float(unsigned u) {
    float f;
    memcpy(&f, &u, 4);
    return f;
}
inline int __float_as_int(float f) {
    int i;
    memcpy(&i, &f, 4);
    return i;
}
inline unsigned __float_as_uint(float f) {
    unsigned u;
    memcpy(&u, &f, 4);
    return u;
}
inline float __expf(float x) { return expf(x); }
inline float __fdividef(float a, float b) { return a / b; }
inline float rsqrtf(float x) { return 1.0f / sqrtf(x); }
inline int __popc(unsigned x) { return __builtin_popcount(x); }
inline int __ffs(int x) { return __builtin_ffs(x); }
template <typename A, typename B> inline typename std::common_type<A, B>::type min(A a, B b) {
    return b < a ? b : a;
}
template <typename A, typename B> inline typename std::common_type<A, B>::type max(A a, B b) {
    return a < b ? b : a;
}

namespace pkvemu {

struct thread_ctx {
    uint3 tid;
    uint3 bid;
    dim3 bdim;
    dim3 gdim;
};
extern thread_ctx *g_cur;

[[noreturn]] void fail(const char *file, int line, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
void syncthreads(const char *file, int line);
int syncthreads_reduce(int pred, int op, const char *file, int line); // op 0 or, 1 and, 2 count
// Every lane of `mask` posts `v`; returns the 32 posted values of this collective.
const uint64_t *warp_collect(unsigned mask, uint64_t v, const char *file, int line);
int lane_id();
void check_load(const void *p, size_t bytes, size_t align, const char *file, int line);
void launch_impl(dim3 grid, dim3 block, size_t smem, const void *kernel,
                 const std::function<void()> &body);
void func_set_attr(const void *kernel, int attr, int value);
// Resident blocks per SM of `kernel` on an H200, from its ptxas figures
// (pkvemu_occupancy.cc); occupancy_of is the arithmetic on given figures.
int occupancy(const void *kernel, int block, size_t smem);
int occupancy_of(int regs, size_t static_smem, int block, size_t dyn_smem);

template <typename T> inline uint64_t bits_of(T v) {
    static_assert(sizeof(T) <= 8, "shuffle of more than 8 bytes");
    uint64_t u = 0;
    memcpy(&u, &v, sizeof v);
    return u;
}
template <typename T> inline T of_bits(uint64_t u) {
    T v;
    memcpy(&v, &u, sizeof v);
    return v;
}

// The call site of a device intrinsic (macros below pass __FILE__/__LINE__).
struct at {
    const char *file;
    int line;
    void syncwarp(unsigned mask = 0xffffffffu) const { (void)warp_collect(mask, 0, file, line); }
    template <typename T> T shfl(unsigned mask, T v, int src, int width = 32) const {
        const uint64_t *s = warp_collect(mask, bits_of(v), file, line);
        int l = lane_id();
        int seg = l & ~(width - 1);
        return of_bits<T>(s[seg + (src & (width - 1))]);
    }
    template <typename T> T shfl_xor(unsigned mask, T v, int m, int width = 32) const {
        const uint64_t *s = warp_collect(mask, bits_of(v), file, line);
        int l = lane_id();
        int src = l ^ m;
        if ((src & ~(width - 1)) != (l & ~(width - 1))) {
            src = l;
        }
        return of_bits<T>(s[src]);
    }
    template <typename T> T shfl_down(unsigned mask, T v, unsigned d, int width = 32) const {
        const uint64_t *s = warp_collect(mask, bits_of(v), file, line);
        int l = lane_id();
        int src = (l & (width - 1)) + (int)d < width ? l + (int)d : l;
        return of_bits<T>(s[src]);
    }
    template <typename T> T shfl_up(unsigned mask, T v, unsigned d, int width = 32) const {
        const uint64_t *s = warp_collect(mask, bits_of(v), file, line);
        int l = lane_id();
        int src = (l & (width - 1)) >= (int)d ? l - (int)d : l;
        return of_bits<T>(s[src]);
    }
    unsigned ballot(unsigned mask, int pred) const {
        const uint64_t *s = warp_collect(mask, pred != 0, file, line);
        unsigned r = 0;
        for (int i = 0; i < 32; i++) {
            r |= (mask >> i & 1u) && s[i] ? 1u << i : 0u;
        }
        return r;
    }
    int any(unsigned mask, int pred) const { return ballot(mask, pred) != 0; }
    int all(unsigned mask, int pred) const { return ballot(mask, pred) == mask; }
    template <typename T> T ldg(const T *p) const {
        check_load(p, sizeof(T), alignof(T), file, line);
        return *p;
    }
};

// k<<<grid, block, smem, stream>>>(args) becomes launch(grid, block, smem, stream).run(k, args).
struct launch {
    dim3 grid, block;
    size_t smem;
    launch(dim3 g, dim3 b, size_t s = 0, cudaStream_t st = nullptr) : grid(g), block(b), smem(s) {
        (void)st;
    }
    template <typename... P, typename... A> void run(void (*k)(P...), A &&...a) {
        std::tuple<typename std::decay<P>::type...> args(std::forward<A>(a)...);
        launch_impl(grid, block, smem, reinterpret_cast<const void *>(k),
                    [&]() { std::apply(k, args); });
    }
};

} // namespace pkvemu

#define threadIdx (pkvemu::g_cur->tid)
#define blockIdx (pkvemu::g_cur->bid)
#define blockDim (pkvemu::g_cur->bdim)
#define gridDim (pkvemu::g_cur->gdim)
#define warpSize 32
#define __syncthreads() pkvemu::syncthreads(__FILE__, __LINE__)
#define __syncthreads_or(p) pkvemu::syncthreads_reduce((p), 0, __FILE__, __LINE__)
#define __syncthreads_and(p) pkvemu::syncthreads_reduce((p), 1, __FILE__, __LINE__)
#define __syncthreads_count(p) pkvemu::syncthreads_reduce((p), 2, __FILE__, __LINE__)
#define __syncwarp(...) pkvemu::at{__FILE__, __LINE__}.syncwarp(__VA_ARGS__)
#define __shfl_sync(...) pkvemu::at{__FILE__, __LINE__}.shfl(__VA_ARGS__)
#define __shfl_xor_sync(...) pkvemu::at{__FILE__, __LINE__}.shfl_xor(__VA_ARGS__)
#define __shfl_down_sync(...) pkvemu::at{__FILE__, __LINE__}.shfl_down(__VA_ARGS__)
#define __shfl_up_sync(...) pkvemu::at{__FILE__, __LINE__}.shfl_up(__VA_ARGS__)
#define __ballot_sync(...) pkvemu::at{__FILE__, __LINE__}.ballot(__VA_ARGS__)
#define __any_sync(...) pkvemu::at{__FILE__, __LINE__}.any(__VA_ARGS__)
#define __all_sync(...) pkvemu::at{__FILE__, __LINE__}.all(__VA_ARGS__)
#define __ldg(...) pkvemu::at{__FILE__, __LINE__}.ldg(__VA_ARGS__)

template <typename T> inline cudaError_t cudaFuncSetAttribute(T *kernel, cudaFuncAttribute attr,
                                                              int value) {
    pkvemu::func_set_attr(reinterpret_cast<const void *>(kernel), (int)attr, value);
    return cudaSuccess;
}
template <typename T>
inline cudaError_t cudaOccupancyMaxActiveBlocksPerMultiprocessor(int *n, T *kernel, int block,
                                                                 size_t smem) {
    *n = pkvemu::occupancy(reinterpret_cast<const void *>(kernel), block, smem);
    return cudaSuccess;
}

#endif // __cplusplus
#endif // PKVEMU_H

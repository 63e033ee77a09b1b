// SPDX-License-Identifier: MIT
// CUDA VMM space: the driver's virtual memory management API as vAttention uses it.
// One cuMemAddressReserve for the whole space; a physical page is one cuMemCreate
// handle of page_bytes (a multiple of the granularity cuMemGetAllocationGranularity
// reports, 2 MiB on current GPUs); mapping is cuMemMap + cuMemSetAccess, unmapping
// cuMemUnmap; handles stay cached on the free stack and are cuMemRelease'd at
// destroy. Plain C.
//
// The driver functions are fetched through the CUDA runtime's
// cudaGetDriverEntryPointByVersion rather than by linking libcuda: the library
// already links cudart, which finds the driver at run time, so a machine without a
// driver (CI, this repository's build hosts) still loads libpagedkv and gets
// PKV_ERR_NO_DEVICE here instead of a loader error.
#include <cuda.h>
#include <cuda_runtime_api.h>
#include <cudaTypedefs.h>
#include <stdlib.h>

#include "vmm_impl.h"

// The ABI version we ask the driver for: the VMM calls have not changed since 10.2.
#define DRIVER_ABI 12000

typedef struct driver_fns {
    PFN_cuMemGetAllocationGranularity_v10020 granularity;
    PFN_cuMemAddressReserve_v10020 reserve;
    PFN_cuMemAddressFree_v10020 address_free;
    PFN_cuMemCreate_v10020 create;
    PFN_cuMemRelease_v10020 release;
    PFN_cuMemMap_v10020 map;
    PFN_cuMemSetAccess_v10020 set_access;
    PFN_cuMemUnmap_v10020 unmap;
    PFN_cuDeviceGet_v2000 device_get;
    PFN_cuDeviceGetAttribute_v2000 attribute;
} driver_fns;

typedef struct cuda_impl {
    int device;
    driver_fns fn;
    CUmemAllocationProp prop;          // pinned device memory on `device`
    CUmemAccessDesc access;            // read/write from `device`
    CUmemGenericAllocationHandle *handles; // [max_pages]
} cuda_impl;

static pkv_status cu_status(CUresult r) {
    if (r == CUDA_SUCCESS) return PKV_OK;
    if (r == CUDA_ERROR_OUT_OF_MEMORY) return PKV_ERR_OUT_OF_MEMORY;
    if (r == CUDA_ERROR_NOT_SUPPORTED) return PKV_ERR_UNSUPPORTED;
    if (r == CUDA_ERROR_NO_DEVICE || r == CUDA_ERROR_INVALID_DEVICE ||
        r == CUDA_ERROR_NOT_INITIALIZED || r == CUDA_ERROR_STUB_LIBRARY)
        return PKV_ERR_NO_DEVICE;
    return PKV_ERR_BACKEND;
}

// The calls run on whatever thread uses the space: make the device's primary
// context current first (cheap when it already is), as the CUDA backend does.
static pkv_status use_device(const cuda_impl *c) {
    if (cudaSetDevice(c->device) == cudaSuccess) return PKV_OK;
    cudaGetLastError();
    return PKV_ERR_NO_DEVICE;
}

static int get_fn(const char *name, void **fn) {
    enum cudaDriverEntryPointQueryResult q = cudaDriverEntryPointSymbolNotFound;
    *fn = NULL;
    cudaError_t err = cudaGetDriverEntryPointByVersion(name, fn, DRIVER_ABI, cudaEnableDefault, &q);
    if (err != cudaSuccess) cudaGetLastError(); // not sticky for later callers
    return err == cudaSuccess && q == cudaDriverEntryPointSuccess && *fn != NULL;
}

static int load_driver(driver_fns *f) {
    return get_fn("cuMemGetAllocationGranularity", (void **)&f->granularity) &&
           get_fn("cuMemAddressReserve", (void **)&f->reserve) &&
           get_fn("cuMemAddressFree", (void **)&f->address_free) &&
           get_fn("cuMemCreate", (void **)&f->create) &&
           get_fn("cuMemRelease", (void **)&f->release) &&
           get_fn("cuMemMap", (void **)&f->map) &&
           get_fn("cuMemSetAccess", (void **)&f->set_access) &&
           get_fn("cuMemUnmap", (void **)&f->unmap) &&
           get_fn("cuDeviceGet", (void **)&f->device_get) &&
           get_fn("cuDeviceGetAttribute", (void **)&f->attribute);
}

static pkv_status cuda_prepare(pkv_vmm_space *s) {
    cuda_impl *c = s->impl;
    c->handles = calloc((size_t)s->info.max_pages, sizeof *c->handles);
    return c->handles ? PKV_OK : PKV_ERR_OUT_OF_MEMORY;
}

static pkv_status cuda_reserve(pkv_vmm_space *s, uint64_t bytes, uint64_t align, void **base) {
    cuda_impl *c = s->impl;
    CUdeviceptr p = 0;
    pkv_status st = use_device(c);
    if (st != PKV_OK) return st;
    st = cu_status(c->fn.reserve(&p, (size_t)bytes, (size_t)align, 0, 0));
    *base = (void *)(uintptr_t)p;
    return st;
}

static void cuda_unreserve(pkv_vmm_space *s, void *base, uint64_t bytes) {
    cuda_impl *c = s->impl;
    (void)c->fn.address_free((CUdeviceptr)(uintptr_t)base, (size_t)bytes);
}

static pkv_status cuda_create_page(pkv_vmm_space *s, uint32_t id) {
    cuda_impl *c = s->impl;
    pkv_status st = use_device(c);
    if (st != PKV_OK) return st;
    return cu_status(c->fn.create(&c->handles[id], (size_t)s->info.page_bytes, &c->prop, 0));
}

static void cuda_destroy_page(pkv_vmm_space *s, uint32_t id) {
    cuda_impl *c = s->impl;
    (void)c->fn.release(c->handles[id]);
}

static pkv_status cuda_release_page(pkv_vmm_space *s, uint32_t id) {
    cuda_impl *c = s->impl;
    return cu_status(c->fn.release(c->handles[id]));
}

static pkv_status cuda_map(pkv_vmm_space *s, void *addr, uint32_t id) {
    cuda_impl *c = s->impl;
    CUdeviceptr p = (CUdeviceptr)(uintptr_t)addr;
    size_t n = (size_t)s->info.page_bytes;
    pkv_status st = use_device(c);
    if (st != PKV_OK) return st;
    st = cu_status(c->fn.map(p, n, 0, c->handles[id], 0));
    if (st != PKV_OK) return st;
    st = cu_status(c->fn.set_access(p, n, &c->access, 1));
    if (st != PKV_OK) (void)c->fn.unmap(p, n);
    return st;
}

static pkv_status cuda_unmap(pkv_vmm_space *s, void *addr, uint32_t id) {
    cuda_impl *c = s->impl;
    (void)id;
    pkv_status st = use_device(c);
    if (st != PKV_OK) return st;
    return cu_status(c->fn.unmap((CUdeviceptr)(uintptr_t)addr, (size_t)s->info.page_bytes));
}

static void cuda_destroy(pkv_vmm_space *s) {
    cuda_impl *c = s->impl;
    if (!c) return;
    free(c->handles);
    free(c);
    s->impl = NULL;
}

static const pkvi_vmm_ops cuda_ops = {
    .name = "cuda",
    .prepare = cuda_prepare,
    .reserve = cuda_reserve,
    .unreserve = cuda_unreserve,
    .create = cuda_create_page,
    .destroy_page = cuda_destroy_page,
    .release_page = cuda_release_page,
    .map = cuda_map,
    .unmap = cuda_unmap,
    .destroy = cuda_destroy,
};

pkv_status pkv_vmm_space_create_cuda(int device, const pkv_vmm_params *params,
                                     pkv_vmm_space **out) {
    if (!out) return PKV_ERR_INVALID_ARG;
    *out = NULL;
    if (!params) return PKV_ERR_INVALID_ARG;
    int count = 0;
    if (cudaGetDeviceCount(&count) != cudaSuccess || count == 0) {
        cudaGetLastError();
        return PKV_ERR_NO_DEVICE;
    }
    if (device < 0 || device >= count) return PKV_ERR_NO_DEVICE;
    // Initializes the driver and the device's primary context for this thread.
    if (cudaSetDevice(device) != cudaSuccess || cudaFree(NULL) != cudaSuccess) {
        cudaGetLastError();
        return PKV_ERR_NO_DEVICE;
    }
    cuda_impl *c = calloc(1, sizeof *c);
    if (!c) return PKV_ERR_OUT_OF_MEMORY;
    c->device = device;
    CUdevice dev = 0;
    int vmm = 0;
    if (!load_driver(&c->fn) || c->fn.device_get(&dev, device) != CUDA_SUCCESS) {
        free(c);
        return PKV_ERR_NO_DEVICE;
    }
    if (c->fn.attribute(&vmm, CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED, dev) !=
            CUDA_SUCCESS ||
        !vmm) {
        free(c);
        return PKV_ERR_UNSUPPORTED;
    }
    c->prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
    c->prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    c->prop.location.id = (int)dev;
    c->access.location = c->prop.location;
    c->access.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
    size_t gran = 0;
    pkv_status st = cu_status(
        c->fn.granularity(&gran, &c->prop, CU_MEM_ALLOC_GRANULARITY_MINIMUM));
    if (st != PKV_OK || gran == 0) {
        free(c);
        return st != PKV_OK ? st : PKV_ERR_BACKEND;
    }
    return pkvi_vmm_space_new(&cuda_ops, c, (uint64_t)gran, params, out);
}

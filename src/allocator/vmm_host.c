// SPDX-License-Identifier: MIT
// Host VMM space: the reservation is mmap(PROT_NONE, MAP_NORESERVE), which costs no
// memory; physical pages come either from a memfd mapped in place (MEMFD: the
// closest host analogue of cuMemCreate + cuMemMap, a page keeps its identity) or
// are committed in place with mprotect + madvise (MPROTECT: the kernel picks the
// frames). Linux; other systems get PKV_ERR_UNSUPPORTED for MEMFD.
#define _GNU_SOURCE // memfd_create, MADV_POPULATE_WRITE, MAP_NORESERVE
#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "vmm_impl.h"

typedef struct host_impl {
    pkv_vmm_host_mode mode;
    int fd;               // MEMFD: the physical memory, max_pages pages long
    uint64_t page;        // cached info.page_bytes
    uint64_t sys_page;    // sysconf(_SC_PAGESIZE)
} host_impl;

static pkv_status host_prepare(pkv_vmm_space *s) {
    host_impl *h = s->impl;
    h->page = s->info.page_bytes;
    if (h->mode != PKV_VMM_HOST_MEMFD) return PKV_OK;
#if defined(__linux__) && defined(MFD_CLOEXEC)
    h->fd = memfd_create("pkv-vmm", MFD_CLOEXEC);
    if (h->fd < 0) return errno == ENOSYS ? PKV_ERR_UNSUPPORTED : PKV_ERR_OUT_OF_MEMORY;
    if (s->info.max_pages > (uint64_t)INT64_MAX / h->page) return PKV_ERR_INVALID_ARG;
    // The size only: tmpfs allocates a page on first touch or fallocate (create).
    if (ftruncate(h->fd, (off_t)(s->info.max_pages * h->page)) != 0)
        return PKV_ERR_OUT_OF_MEMORY;
    return PKV_OK;
#else
    return PKV_ERR_UNSUPPORTED;
#endif
}

static pkv_status host_reserve(pkv_vmm_space *s, uint64_t bytes, uint64_t align, void **base) {
    (void)s;
    // Over-reserve by `align` and trim, so that 2 MiB pages start on 2 MiB (huge pages
    // possible in MPROTECT mode).
    if (bytes > SIZE_MAX - align) return PKV_ERR_INVALID_ARG;
    size_t len = (size_t)(bytes + align);
    char *p = mmap(NULL, len, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (p == MAP_FAILED) return PKV_ERR_OUT_OF_MEMORY;
    uintptr_t a = ((uintptr_t)p + align - 1) / align * align;
    size_t head = (size_t)(a - (uintptr_t)p), tail = len - head - (size_t)bytes;
    if (head) munmap(p, head);
    if (tail) munmap((char *)a + bytes, tail);
    *base = (void *)a;
    return PKV_OK;
}

static void host_unreserve(pkv_vmm_space *s, void *base, uint64_t bytes) {
    (void)s;
    munmap(base, (size_t)bytes);
}

// MEMFD: give page `id` its memory now, so that map is only a mapping (as
// cuMemCreate allocates and cuMemMap only maps).
static pkv_status memfd_create_page(pkv_vmm_space *s, uint32_t id) {
    host_impl *h = s->impl;
    int err = posix_fallocate(h->fd, (off_t)((uint64_t)id * h->page), (off_t)h->page);
    return err == 0 ? PKV_OK : PKV_ERR_OUT_OF_MEMORY;
}

// MEMFD, for a shared budget's reclaim: the page's memory goes back to the system
// (a later create fallocates it again).
static pkv_status memfd_release_page(pkv_vmm_space *s, uint32_t id) {
    host_impl *h = s->impl;
#if defined(FALLOC_FL_PUNCH_HOLE) && defined(FALLOC_FL_KEEP_SIZE)
    if (fallocate(h->fd, FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE,
                  (off_t)((uint64_t)id * h->page), (off_t)h->page) != 0)
        return PKV_ERR_BACKEND;
    return PKV_OK;
#else
    (void)h;
    (void)id;
    return PKV_ERR_UNSUPPORTED; // the page stays cached: no reclaim from this space
#endif
}

static pkv_status memfd_map(pkv_vmm_space *s, void *addr, uint32_t id) {
    host_impl *h = s->impl;
    // MAP_POPULATE: build the page-table entries now, so the cost is in this call
    // (as cuMemMap + cuMemSetAccess build the GPU's) and not in the first access.
    void *p = mmap(addr, (size_t)h->page, PROT_READ | PROT_WRITE,
                   MAP_SHARED | MAP_FIXED | MAP_POPULATE, h->fd,
                   (off_t)((uint64_t)id * h->page));
    return p == addr ? PKV_OK : PKV_ERR_BACKEND;
}

static pkv_status memfd_unmap(pkv_vmm_space *s, void *addr, uint32_t id) {
    host_impl *h = s->impl;
    (void)id;
    // Map an inaccessible hole back over the page: the range stays reserved.
    void *p = mmap(addr, (size_t)h->page, PROT_NONE,
                   MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED | MAP_NORESERVE, -1, 0);
    return p == addr ? PKV_OK : PKV_ERR_BACKEND;
}

static pkv_status mprotect_map(pkv_vmm_space *s, void *addr, uint32_t id) {
    host_impl *h = s->impl;
    (void)id;
    if (mprotect(addr, (size_t)h->page, PROT_READ | PROT_WRITE) != 0) return PKV_ERR_BACKEND;
#ifdef MADV_HUGEPAGE
    if (h->page >= ((uint64_t)2 << 20)) (void)madvise(addr, (size_t)h->page, MADV_HUGEPAGE);
#endif
    // Commit now rather than at first touch, so the cost lands in this call. Only a
    // kernel without MADV_POPULATE_WRITE (EINVAL, before 5.14) falls back to touching:
    // any other failure (ENOMEM) is reported, not turned into a fault later.
#ifdef MADV_POPULATE_WRITE
    if (madvise(addr, (size_t)h->page, MADV_POPULATE_WRITE) == 0) return PKV_OK;
    if (errno != EINVAL) {
        (void)mprotect(addr, (size_t)h->page, PROT_NONE);
        return PKV_ERR_OUT_OF_MEMORY;
    }
#endif
    volatile char *c = addr; // older kernels: touch every system page
    for (uint64_t off = 0; off < h->page; off += h->sys_page) c[off] = 0;
    return PKV_OK;
}

static pkv_status mprotect_unmap(pkv_vmm_space *s, void *addr, uint32_t id) {
    host_impl *h = s->impl;
    (void)id;
    if (madvise(addr, (size_t)h->page, MADV_DONTNEED) != 0) return PKV_ERR_BACKEND;
    return mprotect(addr, (size_t)h->page, PROT_NONE) == 0 ? PKV_OK : PKV_ERR_BACKEND;
}

static void host_destroy(pkv_vmm_space *s) {
    host_impl *h = s->impl;
    if (!h) return;
    if (h->fd >= 0) close(h->fd);
    free(h);
    s->impl = NULL;
}

static const pkvi_vmm_ops memfd_ops = {
    .name = "host-memfd",
    .prepare = host_prepare,
    .reserve = host_reserve,
    .unreserve = host_unreserve,
    .create = memfd_create_page,
    .destroy_page = NULL, // the memfd goes with close()
    .release_page = memfd_release_page,
    .map = memfd_map,
    .unmap = memfd_unmap,
    .destroy = host_destroy,
};

static const pkvi_vmm_ops mprotect_ops = {
    .name = "host-mprotect",
    .prepare = host_prepare,
    .reserve = host_reserve,
    .unreserve = host_unreserve,
    .create = NULL,
    .destroy_page = NULL,
    .release_page = NULL, // an unmapped page's memory went back at unmap
    .map = mprotect_map,
    .unmap = mprotect_unmap,
    .destroy = host_destroy,
};

pkv_status pkv_vmm_space_create_host(const pkv_vmm_params *params, pkv_vmm_space **out) {
    if (!out) return PKV_ERR_INVALID_ARG;
    *out = NULL;
    if (!params) return PKV_ERR_INVALID_ARG;
    if (params->host_mode != PKV_VMM_HOST_MEMFD && params->host_mode != PKV_VMM_HOST_MPROTECT)
        return PKV_ERR_INVALID_ARG;
    long sys = sysconf(_SC_PAGESIZE);
    if (sys <= 0) return PKV_ERR_UNSUPPORTED;
    host_impl *h = calloc(1, sizeof *h);
    if (!h) return PKV_ERR_OUT_OF_MEMORY;
    h->mode = params->host_mode;
    h->fd = -1;
    h->sys_page = (uint64_t)sys;
    const pkvi_vmm_ops *ops = h->mode == PKV_VMM_HOST_MEMFD ? &memfd_ops : &mprotect_ops;
    return pkvi_vmm_space_new(ops, h, (uint64_t)sys, params, out);
}

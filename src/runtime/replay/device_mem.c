// SPDX-License-Identifier: MIT
// Device memory models for the cudaMalloc-style policies (malloc-per-request,
// realloc-copy) in sim mode. Sources and rationale: docs/POLICIES.md, "Device
// memory models". Bytes throughout; the policy turns them into token slots.
//
// cuda: cudaMalloc backs an allocation with 2 MiB physical pages mapped into a
//   fresh virtual range (CUDA's VMM granularity on current GPUs; the driver needs
//   no physically contiguous range), so an allocation occupies its size rounded
//   up to 2 MiB and succeeds while that many bytes of the device are free: no
//   first-fit placement, no external fragmentation beyond the granule. One
//   cudaMalloc per allocation, one cudaFree per free, each of the requested size.
//
// torch-caching: PyTorch's CUDA caching allocator (c10/cuda/CUDACachingAllocator.cpp,
//   default configuration: no max_split_size, no garbage collection threshold,
//   no expandable segments, one stream, empty_cache never called):
//   - a request is rounded up to a multiple of 512 bytes (kMinBlockSize);
//   - requests of at most 1 MiB (kSmallSize) use the small pool, others the large;
//   - the smallest cached free block of the pool that fits is taken (best fit,
//     lowest address on a tie); if it is larger, it is split when the remainder
//     is >= 512 bytes (small pool) or > 1 MiB (large pool);
//   - if none fits, cudaMalloc a new segment: 2 MiB (kSmallBuffer) for a small
//     request, 20 MiB (kLargeBuffer) for one under 10 MiB (kMinLargeAlloc), else
//     the request rounded up to 2 MiB (kRoundLarge); if the device has no room,
//     every cached segment that is wholly free is cudaFree'd and it retries once
//     (the allocator's own release_cached_blocks on a failed cudaMalloc);
//   - a freed block returns to its pool's cache, merged with free neighbours of
//     its segment; no cudaFree.
//   So only segment cudaMallocs (and the frees of the OOM retry) are device calls.
#include <stdlib.h>
#include <string.h>

#include "replay_internal.h"

#define GRANULE (2ull << 20)       // cuda: physical page; torch: kRoundLarge
#define MIN_BLOCK 512ull           // kMinBlockSize
#define SMALL_SIZE (1ull << 20)    // kSmallSize
#define SMALL_BUFFER (2ull << 20)  // kSmallBuffer
#define LARGE_BUFFER (20ull << 20) // kLargeBuffer
#define MIN_LARGE (10ull << 20)    // kMinLargeAlloc

typedef struct tblock {
    uint64_t addr, size;
    int64_t prev, next; // neighbours within the segment, -1 at its ends
    uint8_t in_use;     // the slot holds a block (else it is on the spare list)
    uint8_t allocated;
    uint8_t small;      // pool
} tblock;

struct pkvi_devmem {
    pkv_device_mem kind;
    uint64_t capacity;       // device bytes
    uint64_t segments;       // bytes obtained from the device (cuda: held)
    uint64_t held;           // bytes held by live allocations
    pkvi_devmem_calls calls;
    void *ctx;
    tblock *b;               // [nb]: cuda uses size only
    uint64_t nb, cap;
    uint64_t *spare;         // free slots of b, [nspare]
    uint64_t nspare, spare_cap;
    uint64_t *cached;        // torch: free blocks (both pools), [ncached]
    uint64_t ncached, cached_cap;
    uint64_t next_addr;      // torch: virtual addresses of new segments
};

static int push(uint64_t **v, uint64_t *n, uint64_t *cap, uint64_t x) {
    if (*n == *cap) {
        const uint64_t c = *cap ? *cap * 2 : 64;
        uint64_t *p = realloc(*v, c * sizeof *p);
        if (!p) return -1;
        *v = p;
        *cap = c;
    }
    (*v)[(*n)++] = x;
    return 0;
}

static int64_t new_block(pkvi_devmem *m) {
    if (m->nspare) return (int64_t)m->spare[--m->nspare];
    if (m->nb == m->cap) {
        const uint64_t c = m->cap ? m->cap * 2 : 64;
        tblock *p = realloc(m->b, c * sizeof *p);
        if (!p) return -1;
        m->b = p;
        m->cap = c;
    }
    return (int64_t)m->nb++;
}

static void drop_block(pkvi_devmem *m, uint64_t i) {
    m->b[i].in_use = 0;
    (void)push(&m->spare, &m->nspare, &m->spare_cap, i); // on failure the slot is just lost
}

static void uncache(pkvi_devmem *m, uint64_t i) {
    for (uint64_t k = 0; k < m->ncached; k++)
        if (m->cached[k] == i) {
            m->cached[k] = m->cached[--m->ncached];
            return;
        }
}

// torch: a request rounded to the 512-byte block unit.
static uint64_t block_size(uint64_t bytes) {
    return bytes < MIN_BLOCK ? MIN_BLOCK : (bytes + MIN_BLOCK - 1) / MIN_BLOCK * MIN_BLOCK;
}

// torch: bytes of the segment cudaMalloc'd for a request of `size` (rounded).
static uint64_t segment_size(uint64_t size) {
    if (size <= SMALL_SIZE) return SMALL_BUFFER;
    if (size < MIN_LARGE) return LARGE_BUFFER;
    return (size + GRANULE - 1) / GRANULE * GRANULE;
}

uint64_t pkvi_devmem_rounded(pkv_device_mem kind, uint64_t bytes) {
    if (kind == PKV_DEVICE_MEM_TORCH_CACHING) return segment_size(block_size(bytes));
    return (bytes + GRANULE - 1) / GRANULE * GRANULE;
}

// torch: the best-fitting cached block of the pool, or -1.
static int64_t best_fit(const pkvi_devmem *m, uint64_t size, int small) {
    int64_t best = -1;
    for (uint64_t k = 0; k < m->ncached; k++) {
        const tblock *x = &m->b[m->cached[k]];
        if (x->small != small || x->size < size) continue;
        if (best < 0 || x->size < m->b[best].size ||
            (x->size == m->b[best].size && x->addr < m->b[best].addr))
            best = (int64_t)m->cached[k];
    }
    return best;
}

// torch: cudaFree every cached block that is a whole segment.
static void release_cached(pkvi_devmem *m) {
    for (uint64_t k = 0; k < m->ncached;) {
        const uint64_t i = m->cached[k];
        tblock *x = &m->b[i];
        if (x->prev < 0 && x->next < 0) {
            m->cached[k] = m->cached[--m->ncached];
            m->segments -= x->size;
            m->calls(m->ctx, PKV_BACKEND_CALL_FREE, x->size);
            drop_block(m, i);
        } else {
            k++;
        }
    }
}

static pkv_status torch_alloc(pkvi_devmem *m, uint64_t bytes, uint64_t *handle, uint64_t *held) {
    const uint64_t size = block_size(bytes);
    const int small = size <= SMALL_SIZE;
    int64_t i = best_fit(m, size, small);
    if (i < 0) {
        const uint64_t seg = segment_size(size);
        if (m->segments + seg > m->capacity) release_cached(m);
        if (m->segments + seg > m->capacity) return PKV_ERR_OUT_OF_BLOCKS;
        if ((i = new_block(m)) < 0) return PKV_ERR_OUT_OF_MEMORY;
        m->b[i] = (tblock){m->next_addr, seg, -1, -1, 1, 0, (uint8_t)small};
        m->next_addr += seg;
        m->segments += seg;
        m->calls(m->ctx, PKV_BACKEND_CALL_ALLOC, seg);
    } else {
        uncache(m, (uint64_t)i);
    }
    const uint64_t rest = m->b[i].size - size;
    if (small ? rest >= MIN_BLOCK : rest > SMALL_SIZE) {
        const int64_t j = new_block(m);
        if (j < 0) return PKV_ERR_OUT_OF_MEMORY;
        tblock *x = &m->b[i]; // new_block may move the array
        m->b[j] = (tblock){x->addr + size, rest, i, x->next, 1, 0, x->small};
        if (x->next >= 0) m->b[x->next].prev = j;
        x->next = j;
        x->size = size;
        if (push(&m->cached, &m->ncached, &m->cached_cap, (uint64_t)j) != 0) return PKV_ERR_OUT_OF_MEMORY;
    }
    m->b[i].allocated = 1;
    m->held += m->b[i].size;
    *handle = (uint64_t)i;
    *held = m->b[i].size;
    return PKV_OK;
}

static void torch_free(pkvi_devmem *m, uint64_t i) {
    tblock *x = &m->b[i];
    x->allocated = 0;
    m->held -= x->size;
    // Merge with free neighbours of the segment.
    const int64_t p = x->prev, n = x->next;
    if (n >= 0 && !m->b[n].allocated) {
        uncache(m, (uint64_t)n);
        x->size += m->b[n].size;
        x->next = m->b[n].next;
        if (x->next >= 0) m->b[x->next].prev = (int64_t)i;
        drop_block(m, (uint64_t)n);
    }
    if (p >= 0 && !m->b[p].allocated) {
        tblock *y = &m->b[p];
        y->size += x->size;
        y->next = x->next;
        if (y->next >= 0) m->b[y->next].prev = p;
        drop_block(m, i);
        return; // p is cached already
    }
    (void)push(&m->cached, &m->ncached, &m->cached_cap, i);
}

pkv_status pkvi_devmem_create(pkv_device_mem kind, uint64_t capacity_bytes, pkvi_devmem_calls calls,
                              void *ctx, pkvi_devmem **out) {
    if (!out || !calls || (kind != PKV_DEVICE_MEM_CUDA && kind != PKV_DEVICE_MEM_TORCH_CACHING))
        return PKV_ERR_INVALID_ARG;
    pkvi_devmem *m = calloc(1, sizeof *m);
    if (!m) return PKV_ERR_OUT_OF_MEMORY;
    m->kind = kind;
    m->capacity = capacity_bytes;
    m->calls = calls;
    m->ctx = ctx;
    *out = m;
    return PKV_OK;
}

void pkvi_devmem_destroy(pkvi_devmem *m) {
    if (!m) return;
    free(m->b);
    free(m->spare);
    free(m->cached);
    free(m);
}

pkv_status pkvi_devmem_alloc(pkvi_devmem *m, uint64_t bytes, uint64_t *handle, uint64_t *held) {
    if (!m || !handle || !held || bytes == 0) return PKV_ERR_INVALID_ARG;
    if (m->kind == PKV_DEVICE_MEM_TORCH_CACHING) return torch_alloc(m, bytes, handle, held);
    const uint64_t r = pkvi_devmem_rounded(m->kind, bytes);
    if (m->segments + r > m->capacity) return PKV_ERR_OUT_OF_BLOCKS;
    const int64_t i = new_block(m);
    if (i < 0) return PKV_ERR_OUT_OF_MEMORY;
    m->b[i] = (tblock){0, r, -1, -1, 1, 1, 0};
    m->segments += r;
    m->held += r;
    m->calls(m->ctx, PKV_BACKEND_CALL_ALLOC, r);
    *handle = (uint64_t)i;
    *held = r;
    return PKV_OK;
}

void pkvi_devmem_free(pkvi_devmem *m, uint64_t handle) {
    if (!m || handle >= m->nb || !m->b[handle].in_use || !m->b[handle].allocated) return;
    if (m->kind == PKV_DEVICE_MEM_TORCH_CACHING) {
        torch_free(m, handle);
        return;
    }
    const uint64_t r = m->b[handle].size;
    m->segments -= r;
    m->held -= r;
    m->calls(m->ctx, PKV_BACKEND_CALL_FREE, r);
    drop_block(m, handle);
}

uint64_t pkvi_devmem_held(const pkvi_devmem *m) { return m ? m->held : 0; }
uint64_t pkvi_devmem_segments(const pkvi_devmem *m) { return m ? m->segments : 0; }

pkv_status pkvi_devmem_validate(const pkvi_devmem *m) {
    uint64_t held = 0, total = 0;
    for (uint64_t i = 0; i < m->nb; i++) {
        const tblock *x = &m->b[i];
        if (!x->in_use) continue;
        total += x->size;
        if (x->allocated) held += x->size;
        if (m->kind == PKV_DEVICE_MEM_TORCH_CACHING && x->next >= 0 &&
            (m->b[x->next].addr != x->addr + x->size || m->b[x->next].prev != (int64_t)i))
            return PKV_ERR_CORRUPT;
        if (x->next >= 0 && !x->allocated && !m->b[x->next].allocated) return PKV_ERR_CORRUPT; // unmerged
    }
    return held == m->held && total == m->segments && m->segments <= m->capacity ? PKV_OK : PKV_ERR_CORRUPT;
}

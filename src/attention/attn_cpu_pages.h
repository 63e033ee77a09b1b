// SPDX-License-Identifier: MIT
// Far-ahead page touches for the CPU attention row walks (attn_cpu.c,
// attn_cpu_quant.c). A paged context is a chain of small runs (a 16-token block of
// one fp16 head is one 4 KiB page, of an 8-bit head 2 KiB) scattered over the pool,
// and each run's first load needs an address translation that no earlier access
// warmed. Under a hypervisor that backs guest memory with 4 KiB pages, the guest's
// 2 MiB pages are split in the TLB and every run is a two-level walk whose
// last-level entries, scattered like the blocks, come from DRAM. The contiguous
// layout walks page-table entries in order (eight per cache line). The row
// prefetches two tiles ahead are too close to hide such a walk, so the first line
// of every page of the rows PKVI_PAGE_TILES tiles ahead is prefetched: the walk and
// the entry's line are then done early, and the near prefetches find the
// translation. Portable: a plain prefetch, which performs the walk on x86 (Intel
// and AMD) and AArch64 alike; no effect on results.
#ifndef PKV_ATTN_CPU_PAGES_H
#define PKV_ATTN_CPU_PAGES_H

#include <stdint.h>

#define PKVI_PAGE_TILES 8u  // page-touch distance, in tiles of the row walk
#define PKVI_PAGE_BYTES 4096u // the smallest page of the supported hosts

// Called with the start addresses of consecutive tokens' rows, in order:
// prefetches (into L2, not L1) the first line of `row` when it starts another
// 4 KiB page than the previous row (*last_page, UINTPTR_MAX before the first).
// A run of rows in one page costs one prefetch; the paged layout's block
// boundaries and a contiguous row crossing a page alike start a new one.
static inline void pkvi_touch_page(const void *row, uintptr_t *last_page) {
    const uintptr_t page = (uintptr_t)row / PKVI_PAGE_BYTES;
    if (page != *last_page) {
#if defined(__GNUC__)
        __builtin_prefetch(row, 0, 1);
#endif
        *last_page = page;
    }
}

#endif // PKV_ATTN_CPU_PAGES_H

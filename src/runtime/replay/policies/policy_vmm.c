// SPDX-License-Identifier: MIT
// The `vmm` KV policy: vAttention's design (ASPLOS 2025) in the replay. Every
// sequence owns a virtual reservation of max_seq_len tokens (virtual memory is
// free: it is not counted against the budget); physical memory is mapped behind it
// in pages of page_bytes as the sequence grows, and unmapped when the request ends.
//
// Buffers: as in vAttention, K and V of every layer are separate virtually
// contiguous buffers, so a model of L layers has 2L buffers and one token takes
// tb = kv_heads x head_dim x dtype bytes in each. A sequence of len tokens maps
// ceil(len x tb / page_bytes) pages in every one of its 2L buffers: memory moves in
// "page groups" of 2L pages, each holding page_bytes / tb tokens (1024 tokens for a
// 2 MiB page of Llama-3-8B's 2 KiB per token and buffer; 256 for Llama-2-7B's 8 KiB).
// The budget is floor(budget / (2L x page_bytes)) groups of interchangeable
// physical pages, so there is no external fragmentation; internal fragmentation
// is the unfilled tail of each sequence's last group (and what map-ahead adds).
//
// Calls: one map call per page and buffer (cuMemMap + cuMemSetAccess), priced by
// the replay's allocation cost model as an alloc call of page_bytes; one unmap
// call per page and buffer at release, priced as a free.
//
// Two policies: `vmm` is vAttention's published design (map-ahead, eager
// allocation and deferred reclamation on, params.vmm_map_ahead and
// vmm_defer_reclaim, both 1 by default); `vmm-sync` is the ablation with all
// three off, every call in the step that needs it. With map-ahead (vAttention's
// overlap of allocation with compute): when a decode fills a sequence's last
// mapped group, the next group is mapped right away by a background thread,
// overlapping the next step (charged as overlapping calls), so the decode that
// needs it finds it mapped; release's unmaps overlap likewise. Eager allocation
// (with map-ahead): a new request's prompt pages are mapped by the same thread
// while it waits to be scheduled, so admission maps are overlapping calls too
// (only the part longer than the prefill step shows).
//
// Deferred reclamation (vAttention's other latency-hiding step, its "deferred
// reclamation + eager allocation"): a finished request's rows are not unmapped;
// they wait, still mapped, for a later request, which takes the idle row whose
// mapped groups fit it best (the smallest that covers its prompt, else the
// largest) and maps only what is missing. A reused row may have more groups
// mapped than its sequence needs: that surplus ("spare") stays mapped at the
// row's tail, and the row's growth takes it without a call. Idle rows and spare
// groups count as free memory (reclaimable, like the paged policy's evictable
// prefix-cache blocks): when a map finds no unmapped group, idle rows and then
// spare groups are unmapped first (those unmap calls in line).
//
// Forks: no sharing between rows. A request's n rows are mapped at admission for
// the prompt (the samples' rows empty until the fork), and the fork copies the
// prompt into each sample's row (counted as device copies), so a fork never
// needs memory. A restored request with several sequences copies the prompt the
// same way.
//
// Slots: reserved slots of a row are floor(groups x page_bytes / tb), which is
// never below its length, so used <= reserved row by row.
#include <stdlib.h>

#include "src/runtime/replay/policies/vmm_common.h"
#include "src/runtime/replay/replay_internal.h"

typedef struct vmm {
    uint64_t capacity_slots;
    pkv_policy_host host;   // the engine's: calls are counted and priced there
    uint64_t page;          // page_bytes
    uint64_t tb;            // bytes per token per buffer
    uint32_t buffers;       // 2 x num_layers
    uint32_t max_seq_len;   // the virtual reservation per row, in tokens
    int map_ahead;
    int defer;              // deferred reclamation
    uint64_t groups_cap;    // physical page groups in the budget
    uint64_t groups_used;   // mapped groups over every row
    uint32_t *idle;         // [idle_cap] groups still mapped behind each idle row
    uint32_t num_idle, idle_cap;
    uint64_t groups_idle;   // sum of idle and spare
    uint64_t *seq_base;     // [num_requests]: first row of the request
    uint32_t *nrows;        // [num_requests]: rows mapped (0: not admitted)
    uint32_t *len;          // [sum of n]: tokens stored in the row
    uint32_t *groups;       // [sum of n]: page groups the row uses (mapped, reserved)
    uint32_t *spare;        // [sum of n]: more groups mapped at its tail, unused (idle)
    uint64_t *spare_rows;   // stack of rows that may have spare groups, [num_spare]
    uint8_t *in_spare;      // [sum of n]: the row is on that stack
    uint64_t num_spare;
    uint64_t used;          // sum of len
    uint32_t num_requests;
    uint64_t map_calls, unmap_calls, copy_slots;
} vmm;

static uint64_t groups_for(const vmm *v, uint64_t tokens) {
    return (tokens * v->tb + v->page - 1) / v->page;
}

static uint64_t slots_of(const vmm *v, uint64_t groups) { return groups * v->page / v->tb; }

static uint64_t unmapped(const vmm *v) { return v->groups_cap - v->groups_used - v->groups_idle; }
// Groups a map may use: unmapped ones and idle ones it may reclaim.
static uint64_t available(const vmm *v) { return v->groups_cap - v->groups_used; }

void pkvi_vmm_charge(const pkv_policy_host *host, int is_unmap, uint64_t page, uint64_t calls,
                     int overlap) {
    if (calls == 0) return;
    const unsigned kind = (is_unmap ? PKV_BACKEND_CALL_FREE : PKV_BACKEND_CALL_ALLOC) |
                          (overlap ? PKV_BACKEND_CALL_OVERLAPPED : 0);
    host->backend_calls(host->ctx, (pkv_backend_call)kind, page, calls);
}

// Charge `groups` page groups of map (is_unmap 0) or unmap calls: one call per page
// and buffer, each of page_bytes. `overlap`: issued by map-ahead's background thread.
static void charge(vmm *v, int is_unmap, uint64_t groups, int overlap) {
    const uint64_t calls = groups * v->buffers;
    if (is_unmap)
        v->unmap_calls += calls;
    else
        v->map_calls += calls;
    pkvi_vmm_charge(&v->host, is_unmap, v->page, calls, overlap);
}

// Make k groups unmapped: unmap idle rows' groups (the most recent idle row
// first) for what the unmapped ones lack. The caller checked available() >= k.
static void reclaim(vmm *v, uint64_t k, int overlap) {
    uint64_t lack = k > unmapped(v) ? k - unmapped(v) : 0;
    while (lack > 0 && v->num_idle > 0) {
        uint32_t *g = &v->idle[v->num_idle - 1];
        const uint64_t take = *g < lack ? *g : lack;
        *g -= (uint32_t)take;
        v->groups_idle -= take;
        lack -= take;
        charge(v, 1, take, overlap);
        if (*g == 0) v->num_idle--;
    }
    while (lack > 0 && v->num_spare > 0) {
        const uint64_t i = v->spare_rows[--v->num_spare];
        v->in_spare[i] = 0;
        const uint64_t take = v->spare[i] < lack ? v->spare[i] : lack;
        v->spare[i] -= (uint32_t)take;
        v->groups_idle -= take;
        lack -= take;
        charge(v, 1, take, overlap);
        if (v->spare[i] > 0) { // still some left: back on the stack
            v->spare_rows[v->num_spare++] = i;
            v->in_spare[i] = 1;
        }
    }
}

// Map k more groups behind rows (from unmapped memory, reclaiming idle rows first
// if needed).
static void map_groups(vmm *v, uint64_t k, int overlap) {
    reclaim(v, k, overlap);
    v->groups_used += k;
    charge(v, 0, k, overlap);
}

// Groups every row needs at admission: the sequences' tokens, the samples' rows
// sized for the prompt they will receive at the fork.
static uint64_t admit_groups(const vmm *v, const pkv_policy_admit *a) {
    const uint32_t rows = a->n > a->nseq ? a->n : a->nseq;
    return (uint64_t)rows * groups_for(v, a->len);
}

// Groups a row holds at its end: final_len tokens, plus one mapped ahead when the
// last one fills its group exactly (only within the virtual reservation).
static uint64_t final_groups(const vmm *v, uint32_t final_len) {
    uint64_t g = groups_for(v, final_len);
    if (v->map_ahead && final_len < v->max_seq_len && groups_for(v, (uint64_t)final_len + 1) > g)
        g++;
    return g;
}

int pkvi_vmm_params(const pkv_policy_config *cfg, int sync, uint64_t *page, int *map_ahead,
                    int *defer) {
    const pkv_replay_params *p = cfg->params;
    if (!p || p->vmm_page_bytes == 0) return -1;
    *page = p->vmm_page_bytes;
    *map_ahead = sync ? 0 : p->vmm_map_ahead;
    *defer = sync ? 0 : p->vmm_defer_reclaim;
    return 0;
}

// The replay's vmm parameters (the page, the 2 x layers buffers, map-ahead);
// `sync`: the vmm-sync ablation, overlap and reuse off whatever params say.
static int vmm_params(const pkv_policy_config *cfg, int sync, uint64_t *page, uint32_t *buffers,
                      int *map_ahead, int *defer) {
    const pkv_replay_params *p = cfg->params;
    if (!p || p->model.num_layers == 0 || pkvi_vmm_params(cfg, sync, page, map_ahead, defer) != 0)
        return -1;
    *buffers = 2 * p->model.num_layers;
    return cfg->bytes_per_token % *buffers == 0 ? 0 : -1;
}

static uint64_t need_of(const pkv_policy_config *cfg, int sync, const pkv_policy_admit *a) {
    uint64_t page;
    uint32_t buffers;
    int ahead, defer;
    if (vmm_params(cfg, sync, &page, &buffers, &ahead, &defer) != 0) return UINT64_MAX;
    vmm v = {.page = page, .tb = cfg->bytes_per_token / buffers, .map_ahead = ahead,
             .max_seq_len = cfg->max_seq_len};
    if (v.tb == 0) return UINT64_MAX;
    const uint64_t fin = (uint64_t)a->n * final_groups(&v, a->final_len);
    const uint64_t adm = admit_groups(&v, a);
    return slots_of(&v, fin > adm ? fin : adm);
}

static uint64_t wm_groups(const vmm *v, uint64_t wm_slots) { return groups_for(v, wm_slots); }

// Deferred reclamation: the idle row for a sequence needing g groups, among those
// not yet taken (taken: [ntaken] indices): the smallest covering g, else the
// largest; -1 when there is none.
static int64_t pick_idle(const vmm *v, uint64_t g, const uint32_t *taken, uint32_t ntaken) {
    int64_t fit = -1, big = -1;
    for (uint32_t i = 0; i < v->num_idle; i++) {
        int skip = 0;
        for (uint32_t j = 0; j < ntaken && !skip; j++) skip = taken[j] == i;
        if (skip) continue;
        if (v->idle[i] >= g && (fit < 0 || v->idle[i] < v->idle[fit])) fit = i;
        if (big < 0 || v->idle[i] > v->idle[big]) big = i;
    }
    return fit >= 0 ? fit : big;
}

static int cmp_desc(const void *a, const void *b) {
    const uint32_t x = *(const uint32_t *)a, y = *(const uint32_t *)b;
    return (x < y) - (x > y);
}

static pkv_status vmm_admit(void *pp, uint32_t r, const pkv_policy_admit *a, uint64_t wm,
                            uint64_t *ext_frag, uint32_t *cached) {
    vmm *v = pp;
    *cached = 0;
    *ext_frag = 0; // physical pages are interchangeable: no external fragmentation
    const uint32_t rows = a->n > a->nseq ? a->n : a->nseq;
    const uint64_t g = groups_for(v, a->len);
    const uint64_t b = v->seq_base[r];
    if ((uint64_t)rows * g + wm_groups(v, wm) > available(v)) return PKV_ERR_OUT_OF_BLOCKS;
    // Deferred reclamation: each row reuses an idle row where one is left.
    uint32_t taken[64];
    uint32_t ntaken = 0;
    uint64_t fresh = 0;
    for (uint32_t i = 0; i < rows; i++) {
        const int64_t k = v->defer && ntaken < 64 ? pick_idle(v, g, taken, ntaken) : -1;
        uint64_t have = 0;
        if (k >= 0) {
            taken[ntaken++] = (uint32_t)k;
            have = v->idle[k];
        }
        v->groups[b + i] = (uint32_t)g;
        v->spare[b + i] = (uint32_t)(have > g ? have - g : 0);
        if (v->spare[b + i] > 0 && !v->in_spare[b + i]) {
            v->spare_rows[v->num_spare++] = b + i;
            v->in_spare[b + i] = 1;
        }
        v->groups_idle -= have - v->spare[b + i]; // reused groups leave the idle pool
        v->groups_used += have - v->spare[b + i];
        fresh += have < g ? g - have : 0;
    }
    // Take the reused rows out of the idle list (highest index first).
    qsort(taken, ntaken, sizeof *taken, cmp_desc);
    for (uint32_t j = 0; j < ntaken; j++) v->idle[taken[j]] = v->idle[--v->num_idle];
    for (uint32_t i = 0; i < rows; i++) {
        v->len[b + i] = i < a->nseq ? a->len : 0;
        v->used += v->len[b + i];
    }
    // A restored request's samples share the prompt: one row computes it, the
    // others receive a copy (no sharing across rows).
    if (a->nseq > 1 && !a->independent) v->copy_slots += (uint64_t)(a->nseq - 1) * a->prompt;
    v->nrows[r] = rows;
    map_groups(v, fresh, v->map_ahead); // eager allocation: by the background thread
    return PKV_OK;
}

static pkv_status vmm_fork(void *pp, uint32_t r, uint32_t n) {
    vmm *v = pp;
    const uint64_t b = v->seq_base[r];
    if (n > v->nrows[r]) return PKV_ERR_INVALID_ARG;
    for (uint32_t i = 1; i < n; i++) { // the rows were mapped at admission
        v->len[b + i] = v->len[b];
        v->used += v->len[b];
        v->copy_slots += v->len[b];
    }
    return PKV_OK;
}

// One more group for row i: its spare one (no call), else a new map.
static void take_group(vmm *v, uint64_t i, int overlap) {
    v->groups[i]++;
    if (v->spare[i] > 0) {
        v->spare[i]--;
        v->groups_idle--;
        v->groups_used++;
        return;
    }
    map_groups(v, 1, overlap);
}

static pkv_status vmm_grow(void *pp, uint32_t r, uint32_t child) {
    vmm *v = pp;
    if (child >= v->nrows[r]) return PKV_ERR_INVALID_ARG;
    const uint64_t i = v->seq_base[r] + child;
    const uint64_t len = (uint64_t)v->len[i] + 1;
    if (len > v->max_seq_len) return PKV_ERR_INVALID_ARG; // outgrew the reservation
    if (groups_for(v, len) > v->groups[i]) {
        // Not mapped ahead (map-ahead off, or memory was short then): map now,
        // unless a spare group is already mapped there.
        if (available(v) == 0) return PKV_ERR_OUT_OF_BLOCKS;
        take_group(v, i, 0);
    }
    v->len[i] = (uint32_t)len;
    v->used++;
    // Map-ahead: the row is full, the next token needs a new group; map it during
    // the next step, if memory allows (else the next grow maps it in line).
    if (v->map_ahead && len < v->max_seq_len && groups_for(v, len + 1) > v->groups[i] &&
        available(v) > 0)
        take_group(v, i, 1);
    return PKV_OK;
}

static void vmm_release(void *pp, uint32_t r) {
    vmm *v = pp;
    const uint64_t b = v->seq_base[r];
    uint64_t g = 0;
    for (uint32_t i = 0; i < v->nrows[r]; i++) {
        g += v->groups[b + i];
        if (v->defer && v->groups[b + i] + v->spare[b + i] > 0) {
            // Stays mapped, idle (idle_cap >= rows); its spare already counts idle.
            v->idle[v->num_idle++] = v->groups[b + i] + v->spare[b + i];
            v->groups_idle += v->groups[b + i];
        }
        v->spare[b + i] = 0; // a stale stack entry is skipped (spare 0)
        v->used -= v->len[b + i];
        v->groups[b + i] = 0;
        v->len[b + i] = 0;
    }
    v->groups_used -= g;
    if (!v->defer) charge(v, 1, g, v->map_ahead);
    v->nrows[r] = 0;
}

static int vmm_fits_alone(const void *pp, const pkv_policy_admit *a, uint64_t wm) {
    const vmm *v = pp;
    if (admit_groups(v, a) + wm_groups(v, wm) > v->groups_cap) return 0;
    return (uint64_t)a->n * final_groups(v, a->final_len) <= v->groups_cap;
}

static uint64_t vmm_reservation(const void *pp, uint32_t r, uint32_t nseq, uint32_t len,
                                uint32_t final_len) {
    const vmm *v = pp;
    (void)nseq;
    (void)len;
    const uint64_t b = v->seq_base[r];
    uint64_t later = 0;
    for (uint32_t i = 0; i < v->nrows[r]; i++) {
        const uint64_t res = slots_of(v, v->groups[b + i]);
        const uint64_t fillable = res < final_len ? res : final_len;
        later += fillable > v->len[b + i] ? fillable - v->len[b + i] : 0;
    }
    return later;
}

// Idle mapped groups count as free: they are reclaimable.
static void vmm_stats(const void *pp, pkv_policy_stats *s) {
    const vmm *v = pp;
    s->used = v->used;
    s->reserved = slots_of(v, v->groups_used);
    s->free = v->capacity_slots - slots_of(v, v->groups_used);
    s->copy_slots = v->copy_slots;
    s->cow_copies = 0;
    s->cached_tokens = 0;
}

// Every mapped page is unmapped once (no leak, no double map): mapped - unmapped
// calls equal the groups held x buffers; each row's groups cover its tokens and
// stay within its reservation; the sums agree with the rows.
static pkv_status vmm_validate(const void *pp) {
    const vmm *v = pp;
    if (v->groups_used + v->groups_idle > v->groups_cap) return PKV_ERR_CORRUPT;
    if (v->map_calls - v->unmap_calls != (v->groups_used + v->groups_idle) * v->buffers)
        return PKV_ERR_CORRUPT;
    uint64_t idle = 0;
    for (uint32_t i = 0; i < v->num_idle; i++) {
        if (v->idle[i] == 0) return PKV_ERR_CORRUPT;
        idle += v->idle[i];
    }
    const uint64_t max_groups = groups_for(v, v->max_seq_len);
    uint64_t g = 0, used = 0;
    for (uint32_t r = 0; r < v->num_requests; r++) {
        const uint64_t b = v->seq_base[r];
        for (uint32_t i = 0; i < v->nrows[r]; i++) {
            if (groups_for(v, v->len[b + i]) > v->groups[b + i] ||
                (uint64_t)v->groups[b + i] + v->spare[b + i] > max_groups ||
                v->len[b + i] > v->max_seq_len || (v->spare[b + i] && !v->in_spare[b + i]))
                return PKV_ERR_CORRUPT;
            g += v->groups[b + i];
            idle += v->spare[b + i];
            used += v->len[b + i];
        }
    }
    return g == v->groups_used && used == v->used && idle == v->groups_idle ? PKV_OK
                                                                            : PKV_ERR_CORRUPT;
}

static void vmm_destroy(void *pp) {
    vmm *v = pp;
    if (!v) return;
    free(v->seq_base);
    free(v->nrows);
    free(v->len);
    free(v->groups);
    free(v->idle);
    free(v->spare);
    free(v->spare_rows);
    free(v->in_spare);
    free(v);
}

static pkv_status create_of(const pkv_policy_config *cfg, int sync, pkv_policy_info *info, void **out) {
    uint64_t page;
    uint32_t buffers;
    int ahead, defer;
    if (!cfg || !info || !out || cfg->bytes_per_token == 0 || cfg->max_seq_len == 0 ||
        vmm_params(cfg, sync, &page, &buffers, &ahead, &defer) != 0)
        return PKV_ERR_INVALID_ARG;
    vmm *v = calloc(1, sizeof *v);
    if (!v) return PKV_ERR_OUT_OF_MEMORY;
    v->page = page;
    v->buffers = buffers;
    v->tb = cfg->bytes_per_token / buffers;
    v->max_seq_len = cfg->max_seq_len;
    v->map_ahead = ahead;
    v->defer = defer;
    v->groups_cap = cfg->capacity_bytes / (v->page * v->buffers);
    if (v->groups_cap == 0 || slots_of(v, v->groups_cap) == 0) {
        free(v);
        return PKV_ERR_OUT_OF_BLOCKS; // the budget holds not one page group
    }
    v->host = cfg->host;
    // Usable capacity: whole page groups of the budget.
    v->capacity_slots = slots_of(v, v->groups_cap);
    v->num_requests = cfg->num_requests;
    const size_t nr = cfg->num_requests ? cfg->num_requests : 1;
    v->seq_base = malloc(nr * sizeof *v->seq_base);
    v->nrows = calloc(nr, sizeof *v->nrows);
    uint64_t total = 0;
    for (uint32_t r = 0; r < cfg->num_requests; r++) total += cfg->max_seqs[r];
    v->len = calloc(total ? total : 1, sizeof *v->len);
    v->groups = calloc(total ? total : 1, sizeof *v->groups);
    // Every row of every request could be idle at once.
    v->idle_cap = (uint32_t)(total < UINT32_MAX ? (total ? total : 1) : UINT32_MAX);
    v->idle = v->defer ? malloc((size_t)v->idle_cap * sizeof *v->idle) : NULL;
    v->spare = calloc(total ? total : 1, sizeof *v->spare);
    v->spare_rows = malloc((total ? total : 1) * sizeof *v->spare_rows);
    v->in_spare = calloc(total ? total : 1, 1);
    if (!v->seq_base || !v->nrows || !v->len || !v->groups || (v->defer && !v->idle) ||
        !v->spare || !v->spare_rows || !v->in_spare) {
        vmm_destroy(v);
        return PKV_ERR_OUT_OF_MEMORY;
    }
    total = 0;
    for (uint32_t r = 0; r < cfg->num_requests; r++) {
        v->seq_base[r] = total;
        total += cfg->max_seqs[r];
    }
    info->capacity_slots = v->capacity_slots;
    // The allocation unit: tokens per page of one buffer (rows share nothing).
    info->granularity = v->page / v->tb <= UINT32_MAX ? (uint32_t)(v->page / v->tb) : UINT32_MAX;
    // Every page it holds is mapped by a call of its own (counted and priced);
    // no arena call besides.
    info->uses_arena = 0;
    *out = v;
    return PKV_OK;
}

static pkv_status vmm_create(const pkv_policy_config *cfg, pkv_policy_info *info, void **out) {
    return create_of(cfg, 0, info, out);
}
static uint64_t vmm_need(const pkv_policy_config *cfg, const pkv_policy_admit *a) {
    return need_of(cfg, 0, a);
}
static pkv_status vmm_sync_create(const pkv_policy_config *cfg, pkv_policy_info *info, void **out) {
    return create_of(cfg, 1, info, out);
}
static uint64_t vmm_sync_need(const pkv_policy_config *cfg, const pkv_policy_admit *a) {
    return need_of(cfg, 1, a);
}

#define VMM_VTABLE(ident, NAME)                                                                    \
    const pkv_policy_vtable pkvi_policy_##ident##_vtable = {                                       \
        .abi_version = PKV_POLICY_ABI_VERSION,                                                     \
        .name = NAME,                                                                              \
        .create = ident##_create,                                                                  \
        .destroy = vmm_destroy,                                                                    \
        .need = ident##_need,                                                                      \
        .fits_alone = vmm_fits_alone,                                                              \
        .admit = vmm_admit,                                                                        \
        .fork = vmm_fork,                                                                          \
        .grow = vmm_grow,                                                                          \
        .release = vmm_release,                                                                    \
        .stats = vmm_stats,                                                                        \
        .reservation = vmm_reservation,                                                            \
        .validate = vmm_validate,                                                                  \
    };

VMM_VTABLE(vmm, "vmm")
VMM_VTABLE(vmm_sync, "vmm-sync")

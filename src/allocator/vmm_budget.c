// SPDX-License-Identifier: MIT
// A physical budget shared by several VMM spaces (pkv/vmm.h): the hybrid-vmm layout
// gives each KV cache group its own space (rows of its own bytes per token) and
// needs them to draw on one GPU's memory. The budget counts the bytes of the pages
// that exist in its members; when a member needs a page beyond it, the others'
// cached free pages are released (vmm.c: pkvi_vmm_release_one), largest page first
// so that the fewest calls free the bytes.
#include <stdlib.h>

#include "vmm_impl.h"

struct pkv_vmm_budget {
    uint64_t bytes, used, peak, reclaimed;
    pkv_vmm_space **spaces;
    uint32_t num_spaces, cap;
};

pkv_status pkv_vmm_budget_create(uint64_t bytes, pkv_vmm_budget **out) {
    if (!out) return PKV_ERR_INVALID_ARG;
    *out = NULL;
    if (bytes == 0) return PKV_ERR_INVALID_ARG;
    pkv_vmm_budget *b = calloc(1, sizeof *b);
    if (!b) return PKV_ERR_OUT_OF_MEMORY;
    b->bytes = bytes;
    *out = b;
    return PKV_OK;
}

void pkv_vmm_budget_destroy(pkv_vmm_budget *b) {
    if (!b) return;
    for (uint32_t i = 0; i < b->num_spaces; i++) b->spaces[i]->budget = NULL;
    free(b->spaces);
    free(b);
}

pkv_status pkv_vmm_budget_attach(pkv_vmm_budget *b, pkv_vmm_space *s) {
    if (!b || !s || s->budget || pkvi_vmm_live_pages(s) != 0) return PKV_ERR_INVALID_ARG;
    if (b->num_spaces == b->cap) {
        uint32_t cap = b->cap ? 2 * b->cap : 4;
        pkv_vmm_space **grown = realloc(b->spaces, cap * sizeof *grown);
        if (!grown) return PKV_ERR_OUT_OF_MEMORY;
        b->spaces = grown;
        b->cap = cap;
    }
    b->spaces[b->num_spaces++] = s;
    s->budget = b;
    return PKV_OK;
}

void pkvi_vmm_budget_leave(pkv_vmm_budget *b, pkv_vmm_space *s) {
    for (uint32_t i = 0; i < b->num_spaces; i++) {
        if (b->spaces[i] != s) continue;
        b->used -= pkvi_vmm_live_pages(s) * s->info.page_bytes;
        b->spaces[i] = b->spaces[--b->num_spaces];
        break;
    }
    s->budget = NULL;
}

pkv_status pkv_vmm_budget_get_stats(const pkv_vmm_budget *b, pkv_vmm_budget_stats *st) {
    if (!b || !st) return PKV_ERR_INVALID_ARG;
    st->bytes = b->bytes;
    st->bytes_used = b->used;
    st->bytes_used_peak = b->peak;
    st->pages_reclaimed = b->reclaimed;
    st->num_spaces = b->num_spaces;
    return PKV_OK;
}

uint64_t pkvi_vmm_budget_room(const pkv_vmm_budget *b, const pkv_vmm_space *self) {
    uint64_t room = b->used < b->bytes ? b->bytes - b->used : 0;
    for (uint32_t i = 0; i < b->num_spaces; i++) {
        const pkv_vmm_space *o = b->spaces[i];
        if (o != self) room += (uint64_t)o->num_free * o->info.page_bytes;
    }
    return room;
}

// The member (not `self`) whose cached free page is the largest, or NULL.
static pkv_vmm_space *largest_cached(const pkv_vmm_budget *b, const pkv_vmm_space *self) {
    pkv_vmm_space *best = NULL;
    for (uint32_t i = 0; i < b->num_spaces; i++) {
        pkv_vmm_space *o = b->spaces[i];
        if (o == self || o->num_free == 0) continue;
        if (!best || o->info.page_bytes > best->info.page_bytes) best = o;
    }
    return best;
}

int pkvi_vmm_budget_make_room(pkv_vmm_budget *b, const pkv_vmm_space *self, uint64_t bytes) {
    if (bytes > b->bytes) return 0;
    while (b->used + bytes > b->bytes) {
        pkv_vmm_space *o = largest_cached(b, self);
        if (!o || !pkvi_vmm_release_one(o)) return 0;
        b->reclaimed++;
    }
    return 1;
}

void pkvi_vmm_budget_charge(pkv_vmm_budget *b, int64_t bytes) {
    if (bytes < 0)
        b->used -= (uint64_t)-bytes;
    else
        b->used += (uint64_t)bytes;
    if (b->used > b->peak) b->peak = b->used;
}

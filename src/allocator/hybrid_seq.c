// SPDX-License-Identifier: MIT
// Sequences of the hybrid KV manager: one id over every group. Create, free, fork
// and truncate do the same thing in every set a token group owns (groups that
// alias a set, PAGED's, follow it) and keep one state slot per state group. Each
// call checks what can fail before it changes a group, or undoes the groups it
// already changed, so a failed call leaves every group as it was.
#include <stdlib.h>
#include <string.h>

#include "hybrid_internal.h"

// Grow recs to hold slot index idx.
static pkv_status reserve_rec(pkv_hybrid *h, uint32_t idx) {
    if (idx < h->cap_recs) return PKV_OK;
    uint32_t cap = h->cap_recs ? h->cap_recs : 16;
    while (cap <= idx) cap *= 2;
    pkvi_hrecord *r = realloc(h->recs, (size_t)cap * sizeof *r);
    if (!r) return PKV_ERR_OUT_OF_MEMORY;
    memset(r + h->cap_recs, 0, (size_t)(cap - h->cap_recs) * sizeof *r);
    h->recs = r;
    h->cap_recs = cap;
    return PKV_OK;
}

static int is_state(const pkv_hybrid *h, uint32_t g) {
    return h->groups[g].desc.kind == PKV_LAYER_STATE;
}

// Undo the per-group part of a record for groups 0..upto-1 (sets owned, slots).
static void drop_groups(pkv_hybrid *h, pkvi_hrecord *r, uint32_t upto) {
    for (uint32_t g = 0; g < upto; g++) {
        pkvi_hgroup *hg = &h->groups[g];
        if (is_state(h, g)) pkv_pool_release(hg->pool, r->gid[g]);
        else if (hg->owns_set) pkv_seq_free(hg->set, r->gid[g]);
    }
}

// Give the group ids of a PAGED alias the id of the set it names.
static void alias_ids(const pkv_hybrid *h, pkvi_hrecord *r) {
    for (uint32_t g = 0; g < h->num_groups; g++) {
        const pkvi_hgroup *hg = &h->groups[g];
        if (!is_state(h, g) && !hg->owns_set) r->gid[g] = r->gid[pkvi_hybrid_owner(h, g)];
    }
}

// A new manager id and its cleared record; *r points to it.
static pkv_status new_record(pkv_hybrid *h, pkv_seq_id *id, pkvi_hrecord **r) {
    pkv_status st = pkv_seq_create(h->ids, id);
    if (st != PKV_OK) return st;
    if ((st = reserve_rec(h, (uint32_t)*id & 0xFFFFFu)) != PKV_OK) {
        pkv_seq_free(h->ids, *id);
        return st;
    }
    *r = &h->recs[(uint32_t)*id & 0xFFFFFu];
    memset(*r, 0, sizeof **r);
    (*r)->id = *id;
    return PKV_OK;
}

// Fill r's groups: a fresh sequence (parent NULL) or a fork of parent. A state
// group whose given[g] (NULL: none) is a slot takes a reference on that slot
// instead of a new one. Undoes itself on failure.
static pkv_status fill_groups(pkv_hybrid *h, pkvi_hrecord *r, const pkvi_hrecord *parent,
                              const pkv_block_id *given) {
    pkv_status st = PKV_OK;
    uint32_t g = 0;
    for (; g < h->num_groups && st == PKV_OK; g++) {
        pkvi_hgroup *hg = &h->groups[g];
        if (is_state(h, g)) {
            pkv_block_id slot = given ? given[g] : -1;
            st = slot >= 0 ? pkv_pool_retain(hg->pool, slot)
                           : pkvi_hybrid_take_slot(h, g, &slot); // may evict a cached state
            r->gid[g] = slot;
        } else if (hg->owns_set) {
            st = parent ? pkv_seq_fork(hg->set, parent->gid[g], &r->gid[g])
                        : pkv_seq_create(hg->set, &r->gid[g]);
        }
    }
    if (st != PKV_OK) drop_groups(h, r, g - 1);
    else alias_ids(h, r);
    return st;
}

pkv_status pkvi_hybrid_seq_create_given(pkv_hybrid *h, const pkv_block_id *given,
                                         pkv_seq_id *id) {
    pkvi_hrecord *r;
    pkv_status st = new_record(h, id, &r);
    if (st != PKV_OK) return st;
    if ((st = fill_groups(h, r, NULL, given)) != PKV_OK) {
        pkv_seq_free(h->ids, *id);
        return st;
    }
    r->live = 1;
    return PKV_OK;
}

pkv_status pkv_hybrid_seq_create(pkv_hybrid *h, pkv_seq_id *id) {
    if (!h || !id) return PKV_ERR_INVALID_ARG;
    return pkvi_hybrid_seq_create_given(h, NULL, id);
}

pkv_status pkv_hybrid_seq_free(pkv_hybrid *h, pkv_seq_id id) {
    pkvi_hrecord *r = pkvi_hybrid_rec(h, id);
    if (!r) return h ? PKV_ERR_NOT_FOUND : PKV_ERR_INVALID_ARG;
    drop_groups(h, r, h->num_groups);
    r->live = 0;
    pkv_seq_free(h->ids, id);
    pkvi_hybrid_released(h);
    return PKV_OK;
}

pkv_status pkvi_hybrid_reserve_state_copies(pkv_hybrid *h) {
    for (uint32_t g = 0; g < h->num_groups; g++) {
        pkvi_hgroup *hg = &h->groups[g];
        if (!is_state(h, g) || hg->num_copies < hg->cap_copies) continue;
        uint32_t cap = hg->cap_copies ? hg->cap_copies * 2 : 8;
        pkv_block_copy *c = realloc(hg->copies, (size_t)cap * sizeof *c);
        if (!c) return PKV_ERR_OUT_OF_MEMORY;
        hg->copies = c;
        hg->cap_copies = cap;
    }
    return PKV_OK;
}

void pkvi_hybrid_queue_state_copy(pkv_hybrid *h, uint32_t g, pkv_block_id src, pkv_block_id dst) {
    pkvi_hgroup *hg = &h->groups[g];
    pkv_pool_retain(hg->pool, src); // live: held by a sequence or the prefix cache
    pkv_pool_retain(hg->pool, dst);
    hg->copies[hg->num_copies++] = (pkv_block_copy){.src = src, .dst = dst};
}

pkv_status pkv_hybrid_seq_fork(pkv_hybrid *h, pkv_seq_id parent, pkv_seq_id *child) {
    if (!h || !child) return PKV_ERR_INVALID_ARG;
    if (!pkvi_hybrid_rec(h, parent)) return PKV_ERR_NOT_FOUND;
    pkv_status st = pkvi_hybrid_reserve_state_copies(h);
    if (st != PKV_OK) return st;
    pkvi_hrecord *r;
    if ((st = new_record(h, child, &r)) != PKV_OK) return st;
    const pkvi_hrecord *p = pkvi_hybrid_rec(h, parent); // recs may have moved
    if ((st = fill_groups(h, r, p, NULL)) != PKV_OK) {
        pkv_seq_free(h->ids, *child);
        return st;
    }
    // The child's state starts as a copy of the parent's: queue it, pinning both
    // slots (one reference each) until the caller has run it.
    for (uint32_t g = 0; g < h->num_groups; g++)
        if (is_state(h, g)) pkvi_hybrid_queue_state_copy(h, g, p->gid[g], r->gid[g]);
    r->len = p->len;
    r->live = 1;
    return PKV_OK;
}

pkv_status pkv_hybrid_seq_length(const pkv_hybrid *h, pkv_seq_id id, uint32_t *len) {
    if (!h || !len) return PKV_ERR_INVALID_ARG;
    const pkvi_hrecord *r = pkvi_hybrid_rec(h, id);
    if (!r) return PKV_ERR_NOT_FOUND;
    *len = r->len;
    return PKV_OK;
}

pkv_status pkv_hybrid_seq_truncate(pkv_hybrid *h, pkv_seq_id id, uint32_t len) {
    if (!h) return PKV_ERR_INVALID_ARG;
    pkvi_hrecord *r = pkvi_hybrid_rec(h, id);
    if (!r) return PKV_ERR_NOT_FOUND;
    if (len > r->len) return PKV_ERR_INVALID_ARG;
    if (len == r->len) return PKV_OK;
    for (uint32_t g = 0; g < h->num_groups; g++)
        if (is_state(h, g)) return PKV_ERR_UNSUPPORTED; // a state cannot go back
    for (uint32_t g = 0; g < h->num_groups; g++) {
        const pkvi_hgroup *hg = &h->groups[g];
        uint32_t holes;
        if (!hg->owns_set || pkv_seq_released_blocks(hg->set, r->gid[g], &holes) != PKV_OK)
            continue;
        // The next query (at len) must still see everything it needs.
        if ((uint64_t)holes * hg->block_size > pkvi_hybrid_first_live(hg, len))
            return PKV_ERR_RELEASED;
    }
    for (uint32_t g = 0; g < h->num_groups; g++) {
        const pkvi_hgroup *hg = &h->groups[g];
        // Cannot fail: the id is live and no kept block is a hole (checked above).
        if (hg->owns_set && pkv_seq_truncate(hg->set, r->gid[g], len) != PKV_OK)
            return PKV_ERR_CORRUPT;
    }
    r->len = len;
    pkvi_hybrid_released(h);
    return PKV_OK;
}

pkv_status pkv_hybrid_state_slot(const pkv_hybrid *h, pkv_seq_id id, uint32_t g,
                                 int32_t *slot) {
    if (!h || !slot || g >= h->num_groups || !is_state(h, g)) return PKV_ERR_INVALID_ARG;
    const pkvi_hrecord *r = pkvi_hybrid_rec(h, id);
    if (!r) return PKV_ERR_NOT_FOUND;
    *slot = r->gid[g];
    return PKV_OK;
}

pkv_status pkvi_hybrid_record_new(pkv_hybrid *h, pkv_seq_id *id, pkvi_hrecord **r) {
    return new_record(h, id, r);
}

void pkvi_hybrid_record_live(pkv_hybrid *h, pkvi_hrecord *r) {
    alias_ids(h, r);
    r->live = 1;
}

void pkvi_hybrid_record_drop(pkv_hybrid *h, pkv_seq_id id) {
    h->recs[(uint32_t)id & 0xFFFFFu].live = 0;
    pkv_seq_free(h->ids, id);
}

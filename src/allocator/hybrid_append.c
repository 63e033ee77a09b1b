// SPDX-License-Identifier: MIT
// Appending to the hybrid KV manager: the window rule, then one plan over every
// group before any group changes. Plan: per set the blocks its batch append takes
// (pkv_seqset_blocks_needed_batch) less the dead blocks the window release hands
// back to the pool (those the batch's sequences hold alone), summed per pool and
// checked against the pool (the layout may make room: LCM). Apply: release the
// dead blocks, then append in every set. The check makes every set's append fit,
// so only a host allocation can fail after it; the appends are then undone. LCM
// releases first when only the large pages the release empties make it fit.
#include <stdlib.h>

#include "hybrid_internal.h"

uint32_t pkvi_hybrid_first_live(const pkvi_hgroup *g, uint32_t p) {
    if (!g->windowed) return 0;
    const uint32_t w = g->desc.window;
    if (g->desc.kind == PKV_LAYER_SLIDING) return p >= w ? p - w + 1 : 0;
    return p / w * w; // CHUNKED: the query's own chunk
}

// h->gids[0..k-1] = group g's ids of seqs (live: checked by the caller).
static void group_ids(pkv_hybrid *h, uint32_t g, const pkv_seq_id *seqs, uint32_t k) {
    for (uint32_t i = 0; i < k; i++) h->gids[i] = pkvi_hybrid_rec(h, seqs[i])->gid[g];
}

// Dead blocks of group g that the batch's sequences hold alone: they return to the
// pool when released; their ids go to ids[] when ids is not NULL. Reads h->gids
// and h->old_len.
static uint32_t release_credit(const pkv_hybrid *h, uint32_t g, const uint32_t *counts,
                               uint32_t k, pkv_block_id *ids) {
    const pkvi_hgroup *hg = &h->groups[g];
    if (!hg->windowed) return 0;
    uint32_t credit = 0;
    for (uint32_t i = 0; i < k; i++) {
        if (counts[i] == 0) continue; // no query, no release
        const pkv_block_id *t;
        uint32_t n, holes;
        pkv_seq_block_table(hg->set, h->gids[i], &t, &n);
        pkv_seq_released_blocks(hg->set, h->gids[i], &holes);
        const uint32_t dead = pkvi_hybrid_first_live(hg, h->old_len[i]) / hg->block_size;
        for (uint32_t j = holes; j < dead; j++) {
            if (pkv_pool_refcount(hg->pool, t[j]) != 1) continue;
            if (ids) ids[credit] = t[j];
            credit++;
        }
    }
    return credit;
}

// Plan the batch: ids live (NOT_FOUND) and distinct (INVALID_ARG), h->old_len
// filled, need[g] = net blocks group g's pool loses (may be negative), 0 for
// state groups and aliases. Changes nothing visible.
static pkv_status plan(pkv_hybrid *h, const pkv_seq_id *seqs, const uint32_t *counts,
                       uint32_t k, int64_t *need) {
    if (k && (!seqs || !counts)) return PKV_ERR_INVALID_ARG;
    pkv_status st = pkvi_hybrid_reserve_scratch(h, k);
    if (st != PKV_OK) return st;
    for (uint32_t i = 0; i < k; i++) {
        const pkvi_hrecord *r = pkvi_hybrid_rec(h, seqs[i]);
        if (!r) return PKV_ERR_NOT_FOUND;
        h->old_len[i] = r->len;
    }
    for (uint32_t g = 0; g < h->num_groups; g++) {
        need[g] = 0;
        const pkvi_hgroup *hg = &h->groups[g];
        if (!hg->owns_set) continue;
        group_ids(h, g, seqs, k);
        uint32_t gross;
        // Also refuses duplicates (one manager id is one id in every set).
        if ((st = pkv_seqset_blocks_needed_batch(hg->set, h->gids, counts, k, &gross)) != PKV_OK)
            return st;
        need[g] = (int64_t)gross - release_credit(h, g, counts, k, NULL);
    }
    return PKV_OK;
}

// 1 if every pool has the net blocks its groups need.
static int pools_fit(const pkv_hybrid *h, const int64_t *need) {
    for (uint32_t p = 0; p < h->num_pools; p++) {
        int64_t sum = 0;
        for (uint32_t g = 0; g < h->num_groups; g++)
            if (h->groups[g].owns_set && h->groups[g].pool == h->pools[p]) sum += need[g];
        if (sum > (int64_t)pkv_pool_free_count(h->pools[p])) return 0;
    }
    return 1;
}

// Some pool is short of need: let the layout make room (LCM: large pages), and
// evict cache-only prefix blocks one at a time while that is not enough. 1 when
// every pool fits. Without a short pool's blocks anywhere in its caches
// (pkv/hybrid.h: free + evictable < need) nothing is evicted in vain.
static int make_room(pkv_hybrid *h, const int64_t *need) {
    uint32_t want[PKV_MAX_KV_GROUPS];
    for (uint32_t g = 0; g < h->num_groups; g++) want[g] = need[g] > 0 ? (uint32_t)need[g] : 0;
    if (h->layout != PKV_HYBRID_LCM)
        for (uint32_t p = 0; p < h->num_pools; p++) {
            int64_t sum = 0;
            for (uint32_t g = 0; g < h->num_groups; g++)
                if (h->groups[g].owns_set && h->groups[g].pool == h->pools[p]) sum += need[g];
            if (sum > (int64_t)(pkv_pool_free_count(h->pools[p]) +
                                pkvi_hybrid_prefix_evictable(h, h->pools[p])))
                return 0;
        }
    for (;;) {
        if (h->ops->make_room ? h->ops->make_room(h, want) == PKV_OK && pools_fit(h, need)
                              : pools_fit(h, need))
            return 1;
        if (!pkvi_hybrid_prefix_evict_for(h, need)) return 0;
    }
}

// LCM: *fits = 1 when the plan `need` fits once the window release is done. The
// plan credits a released block to its own group only, but a large page the
// release empties can serve any group, and only after the release.
static pkv_status fits_after_release(pkv_hybrid *h, const pkv_seq_id *seqs,
                                     const uint32_t *counts, uint32_t k, const int64_t *need,
                                     int *fits) {
    *fits = 0;
    if (h->layout != PKV_HYBRID_LCM) return PKV_OK;
    uint32_t freed[PKV_MAX_KV_GROUPS] = {0};
    uint64_t total = 0;
    for (uint32_t g = 0; g < h->num_groups; g++) {
        if (!h->groups[g].windowed) continue;
        group_ids(h, g, seqs, k);
        total += freed[g] = release_credit(h, g, counts, k, NULL);
    }
    if (total == 0) return PKV_OK; // nothing released: nothing changes
    pkv_block_id *ids = malloc(total * sizeof *ids);
    if (!ids) return PKV_ERR_OUT_OF_MEMORY;
    pkv_block_id *dead[PKV_MAX_KV_GROUPS] = {0};
    uint64_t at = 0;
    for (uint32_t g = 0; g < h->num_groups; g++) {
        if (!freed[g]) continue;
        group_ids(h, g, seqs, k);
        dead[g] = ids + at;
        at += release_credit(h, g, counts, k, dead[g]);
    }
    *fits = pkvi_hybrid_lcm_fits_after_release(h, need, freed, dead);
    free(ids);
    return PKV_OK;
}

// Release the blocks that the window rule kills for the batch's first queries (a
// sequence appended 0 tokens has no query: it keeps its blocks).
static void release_dead(pkv_hybrid *h, const pkv_seq_id *seqs, const uint32_t *counts,
                         uint32_t k) {
    for (uint32_t g = 0; g < h->num_groups; g++) {
        pkvi_hgroup *hg = &h->groups[g];
        if (!hg->windowed) continue;
        for (uint32_t i = 0; i < k; i++) {
            if (counts[i] == 0) continue;
            uint32_t released = 0;
            pkv_seq_release_before(hg->set, pkvi_hybrid_rec(h, seqs[i])->gid[g],
                                   pkvi_hybrid_first_live(hg, h->old_len[i]), &released);
            hg->released += released;
        }
    }
}

// Room for the batch (plan: need): the pools fit, or the layout makes room,
// evicting cache-only prefix blocks as needed. Under LCM, when the plan fits only
// once the window release is done, the release goes first (*released = 1); it is
// done only then, so a refusal still changes no group (pkv/hybrid.h).
static pkv_status find_room(pkv_hybrid *h, const pkv_seq_id *seqs, const uint32_t *counts,
                            uint32_t k, int64_t *need, int *released) {
    *released = 0;
    if (pools_fit(h, need)) return PKV_OK;
    int after;
    pkv_status st = fits_after_release(h, seqs, counts, k, need, &after);
    if (st != PKV_OK) return st;
    if (!after) {
        if (make_room(h, need)) return PKV_OK;
        // The evictions make_room did may be what the release still lacked.
        if ((st = fits_after_release(h, seqs, counts, k, need, &after)) != PKV_OK) return st;
        if (!after) return PKV_ERR_OUT_OF_BLOCKS;
    }
    release_dead(h, seqs, counts, k);
    *released = 1;
    if ((st = plan(h, seqs, counts, k, need)) != PKV_OK) return st; // ids checked: cannot fail
    return make_room(h, need) ? PKV_OK : PKV_ERR_OUT_OF_BLOCKS;
}

// Write the slot rows that no set wrote: aliases copy their set's row, state
// groups -1.
static void fill_other_rows(const pkv_hybrid *h, int64_t *slots, uint64_t total) {
    for (uint32_t g = 0; g < h->num_groups; g++) {
        const pkvi_hgroup *hg = &h->groups[g];
        if (hg->owns_set) continue;
        int64_t *row = slots + g * total;
        if (hg->desc.kind == PKV_LAYER_STATE) {
            for (uint64_t t = 0; t < total; t++) row[t] = -1;
            continue;
        }
        const int64_t *from = slots + pkvi_hybrid_owner(h, g) * total;
        for (uint64_t t = 0; t < total; t++) row[t] = from[t];
    }
}

pkv_status pkv_hybrid_append_batch(pkv_hybrid *h, const pkv_seq_id *seqs,
                                   const uint32_t *counts, uint32_t num_seqs, int64_t *slots) {
    if (!h) return PKV_ERR_INVALID_ARG;
    int64_t need[PKV_MAX_KV_GROUPS];
    pkv_status st = plan(h, seqs, counts, num_seqs, need);
    if (st != PKV_OK) return st;
    int released;
    if ((st = find_room(h, seqs, counts, num_seqs, need, &released)) != PKV_OK) {
        if (released) pkvi_hybrid_released(h);
        return st;
    }
    uint64_t total = 0;
    for (uint32_t i = 0; i < num_seqs; i++) total += counts[i];
    if (!released) release_dead(h, seqs, counts, num_seqs);
    uint32_t g = 0;
    for (; g < h->num_groups && st == PKV_OK; g++) {
        const pkvi_hgroup *hg = &h->groups[g];
        if (!hg->owns_set) continue;
        group_ids(h, g, seqs, num_seqs);
        st = pkv_seqset_append_batch(hg->set, h->gids, counts, num_seqs,
                                     slots ? slots + g * total : NULL);
    }
    if (st != PKV_OK) { // a host allocation failed: undo the sets appended so far
        for (uint32_t u = 0; u + 1 < g; u++) {
            if (!h->groups[u].owns_set) continue;
            for (uint32_t i = 0; i < num_seqs; i++)
                pkv_seq_truncate(h->groups[u].set, pkvi_hybrid_rec(h, seqs[i])->gid[u],
                                 h->old_len[i]);
        }
        pkvi_hybrid_released(h);
        return st;
    }
    for (uint32_t i = 0; i < num_seqs; i++) pkvi_hybrid_rec(h, seqs[i])->len += counts[i];
    if (slots) fill_other_rows(h, slots, total);
    pkvi_hybrid_released(h);
    return PKV_OK;
}

pkv_status pkv_hybrid_append(pkv_hybrid *h, pkv_seq_id id, uint32_t n, int64_t *slots) {
    return pkv_hybrid_append_batch(h, &id, &n, 1, slots);
}

pkv_status pkv_hybrid_blocks_needed_batch(const pkv_hybrid *h, const pkv_seq_id *seqs,
                                          const uint32_t *counts, uint32_t num_seqs,
                                          uint32_t *blocks) {
    if (!h || !blocks) return PKV_ERR_INVALID_ARG;
    int64_t need[PKV_MAX_KV_GROUPS];
    // Only the batch scratch is written (h came from calloc: not const-defined).
    pkv_status st = plan((pkv_hybrid *)h, seqs, counts, num_seqs, need);
    if (st != PKV_OK) return st;
    for (uint32_t g = 0; g < h->num_groups; g++) {
        const pkvi_hgroup *hg = &h->groups[g];
        // A PAGED alias reports its set's figure; state groups 0.
        const int64_t n = hg->desc.kind == PKV_LAYER_STATE ? 0 : need[pkvi_hybrid_owner(h, g)];
        blocks[g] = n > 0 ? (uint32_t)n : 0;
    }
    return PKV_OK;
}

pkv_status pkv_hybrid_blocks_needed(const pkv_hybrid *h, pkv_seq_id id, uint32_t n,
                                    uint32_t *blocks) {
    return pkv_hybrid_blocks_needed_batch(h, &id, &n, 1, blocks);
}

int pkvi_hybrid_fit(pkv_hybrid *h, const int64_t *need) {
    return pools_fit(h, need) || make_room(h, need);
}

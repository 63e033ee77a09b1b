// SPDX-License-Identifier: MIT
// What the hybrid KV manager holds, counted from its tables (stats per group) and
// checked against its pools (validate): every pool reference is a live table
// entry, a queued copy's pin, a prefix cache's entry or a sequence's state slot,
// and nothing else. Stats walk every live sequence: O(live sequences + blocks
// held); validate also every pool id: O(capacity), not for a hot path.
#include <stdlib.h>
#include <string.h>

#include "hybrid_internal.h"

// Add one reference per live table entry and queued-copy pin of the set that
// token group g owns, and per live sequence's slot and queued pin of state group
// g, to refs[] (the group's pool's capacity).
static void count_refs(const pkv_hybrid *h, uint32_t g, uint32_t *refs) {
    const pkvi_hgroup *hg = &h->groups[g];
    for (uint32_t i = 0; i < h->cap_recs; i++) {
        const pkvi_hrecord *r = &h->recs[i];
        if (!r->live) continue;
        if (!hg->set) {
            refs[r->gid[g]]++;
            continue;
        }
        const pkv_block_id *t;
        uint32_t n, holes;
        if (pkv_seq_block_table(hg->set, r->gid[g], &t, &n) != PKV_OK ||
            pkv_seq_released_blocks(hg->set, r->gid[g], &holes) != PKV_OK)
            continue; // validate reports the record
        for (uint32_t j = holes; j < n; j++) refs[t[j]]++;
    }
    const pkv_block_copy *c = hg->copies;
    uint32_t nc = hg->num_copies;
    if (hg->set) pkv_seqset_copies(hg->set, &c, &nc);
    for (uint32_t i = 0; i < nc; i++) refs[c[i].src]++, refs[c[i].dst]++;
}

// Per-block scratch for `capacity` blocks with a fresh epoch: every block unmarked.
// The manager is one thread at a time (pkv/hybrid.h), so statistics may use it.
static pkv_status begin_marks(pkv_hybrid *h, uint32_t capacity) {
    if (capacity > h->cap_marks) {
        free(h->mark);
        free(h->fill);
        h->mark = calloc(capacity, sizeof *h->mark);
        h->fill = malloc((size_t)capacity * sizeof *h->fill);
        h->cap_marks = h->mark && h->fill ? capacity : 0;
        h->epoch = 0;
        if (!h->cap_marks) return PKV_ERR_OUT_OF_MEMORY;
    }
    if (++h->epoch == 0) { // wrapped: clear once every 2^32 calls
        memset(h->mark, 0, (size_t)h->cap_marks * sizeof *h->mark);
        h->epoch = 1;
    }
    return PKV_OK;
}

// Block b counted once per epoch: 1 the first time.
static int first_mark(pkv_hybrid *h, pkv_block_id b) {
    if (h->mark[b] == h->epoch) return 0;
    h->mark[b] = h->epoch;
    h->fill[b] = 0;
    return 1;
}

// Distinct blocks (state group: slots) held by live sequences and queued copies of
// group g, and the tokens in live blocks (sum over sequences).
static void held_blocks(pkv_hybrid *h, uint32_t g, pkv_hybrid_group_stats *stats) {
    const pkvi_hgroup *hg = &h->groups[g];
    for (uint32_t i = 0; i < h->cap_recs; i++) {
        const pkvi_hrecord *r = &h->recs[i];
        if (!r->live) continue;
        if (!hg->set) {
            stats->blocks_held += first_mark(h, r->gid[g]);
            continue;
        }
        const pkv_block_id *t;
        uint32_t n, holes;
        if (pkv_seq_block_table(hg->set, r->gid[g], &t, &n) != PKV_OK ||
            pkv_seq_released_blocks(hg->set, r->gid[g], &holes) != PKV_OK)
            continue; // validate reports the record; stats count what is there
        for (uint32_t j = holes; j < n; j++) stats->blocks_held += first_mark(h, t[j]);
        stats->tokens_held += r->len - (uint64_t)holes * hg->block_size;
    }
    const pkv_block_copy *c = hg->copies;
    uint32_t nc = hg->num_copies;
    if (hg->set) pkv_seqset_copies(hg->set, &c, &nc);
    for (uint32_t i = 0; i < nc; i++)
        stats->blocks_held += first_mark(h, c[i].src) + first_mark(h, c[i].dst);
}

// Token group g, after held_blocks (every live block marked, fill 0): per distinct
// live block, the most tokens a holder's last token sees in it, summed.
static uint64_t visible_tokens(pkv_hybrid *h, uint32_t g) {
    const pkvi_hgroup *hg = &h->groups[g];
    const uint32_t B = hg->block_size;
    uint32_t *fill = h->fill;
    uint64_t sum = 0;
    for (uint32_t i = 0; i < h->cap_recs; i++) {
        const pkvi_hrecord *r = &h->recs[i];
        const pkv_block_id *t;
        uint32_t n, holes;
        if (!r->live || r->len == 0 || pkv_seq_block_table(hg->set, r->gid[g], &t, &n) != PKV_OK ||
            pkv_seq_released_blocks(hg->set, r->gid[g], &holes) != PKV_OK)
            continue;
        const uint32_t first = pkvi_hybrid_first_live(hg, r->len - 1);
        for (uint32_t j = holes > first / B ? holes : first / B; j < n; j++) {
            const uint32_t lo = j * B > first ? j * B : first;
            const uint32_t hi = (j + 1) * B < r->len ? (j + 1) * B : r->len;
            if (hi - lo > fill[t[j]]) {
                sum += hi - lo - fill[t[j]];
                fill[t[j]] = hi - lo;
            }
        }
    }
    return sum;
}

// O(live sequences + blocks held): the scratch is the manager's (h is one thread
// at a time and came from calloc, so not const-defined).
pkv_status pkv_hybrid_group_stats_get(const pkv_hybrid *h, uint32_t g,
                                      pkv_hybrid_group_stats *stats) {
    if (!h || !stats || g >= h->num_groups) return PKV_ERR_INVALID_ARG;
    pkv_hybrid *w = (pkv_hybrid *)h;
    const pkvi_hgroup *hg = &h->groups[g];
    const uint32_t capacity = pkv_pool_capacity(hg->pool);
    pkv_status st = begin_marks(w, capacity);
    if (st != PKV_OK) return st;
    memset(stats, 0, sizeof *stats);
    held_blocks(w, g, stats);
    if (hg->set) stats->tokens_visible = visible_tokens(w, g);
    stats->kind = hg->desc.kind;
    stats->block_size = hg->block_size;
    stats->page_bytes = hg->page_bytes;
    stats->capacity_bytes = (uint64_t)capacity * hg->page_bytes;
    stats->used_bytes = stats->blocks_held * hg->page_bytes;
    stats->free_bytes = (uint64_t)pkv_pool_free_count(hg->pool) * hg->page_bytes;
    if (hg->set)
        stats->padding_bytes =
            stats->blocks_held * (hg->page_bytes - hg->block_size * hg->bytes_per_token);
    stats->blocks_released = hg->released;
    const pkvi_hgroup *owner = &h->groups[pkvi_hybrid_owner(h, g)];
    if (owner->cache) { // a PAGED alias shows the one table's cache
        pkvi_hcache_stats cs;
        pkvi_hcache_get_stats(owner->cache, &cs);
        stats->cached_blocks = cs.entries;
        stats->cached_evictable = cs.evictable;
        stats->prefix_hit_blocks = cs.hit_blocks;
        stats->prefix_hit_tokens = cs.hit_tokens;
        stats->prefix_inserts = cs.inserts;
        stats->prefix_evictions = cs.evictions;
    }
    pkvi_hybrid_lcm_group_stats(h, g, stats);
    return PKV_OK;
}

// The record's lengths and holes agree with the group rules.
static int record_ok(const pkv_hybrid *h, const pkvi_hrecord *r) {
    for (uint32_t g = 0; g < h->num_groups; g++) {
        const pkvi_hgroup *hg = &h->groups[g];
        if (!hg->set) {
            if ((uint32_t)r->gid[g] >= pkv_pool_capacity(hg->pool)) return 0;
            continue;
        }
        uint32_t len, holes;
        if (r->gid[g] != r->gid[pkvi_hybrid_owner(h, g)] ||
            pkv_seq_length(hg->set, r->gid[g], &len) != PKV_OK || len != r->len ||
            pkv_seq_released_blocks(hg->set, r->gid[g], &holes) != PKV_OK)
            return 0;
        // Holes only where the rule allows: nothing the next query sees is gone.
        if ((uint64_t)holes * hg->block_size > pkvi_hybrid_first_live(hg, r->len)) return 0;
    }
    return 1;
}

// Every pool's refcounts equal the references of the groups that draw from it.
static pkv_status check_pool(const pkv_hybrid *h, const pkv_pool *pool) {
    const uint32_t capacity = pkv_pool_capacity(pool);
    uint32_t *refs = calloc(capacity, sizeof *refs);
    if (!refs) return PKV_ERR_OUT_OF_MEMORY;
    for (uint32_t g = 0; g < h->num_groups; g++) {
        const pkvi_hgroup *hg = &h->groups[g];
        if (hg->pool == pool && (hg->owns_set || !hg->set)) count_refs(h, g, refs);
        if (hg->pool == pool && hg->cache) pkvi_hcache_count_refs(hg->cache, refs);
    }
    pkv_status st = PKV_OK;
    for (uint32_t b = 0; b < capacity && st == PKV_OK; b++)
        if ((uint32_t)pkv_pool_refcount(pool, (pkv_block_id)b) != refs[b]) st = PKV_ERR_CORRUPT;
    free(refs);
    return st;
}

pkv_status pkv_hybrid_validate(const pkv_hybrid *h) {
    if (!h) return PKV_ERR_INVALID_ARG;
    pkv_status st = pkv_seqset_validate(h->ids, 1);
    uint32_t live = 0;
    for (uint32_t i = 0; i < h->cap_recs && st == PKV_OK; i++) {
        const pkvi_hrecord *r = &h->recs[i];
        if (!r->live) continue;
        live++;
        uint32_t len;
        if ((r->id & 0xFFFFF) != (pkv_seq_id)i || pkv_seq_length(h->ids, r->id, &len) != PKV_OK ||
            !record_ok(h, r))
            st = PKV_ERR_CORRUPT;
    }
    if (st == PKV_OK && live != pkv_seqset_live_count(h->ids)) st = PKV_ERR_CORRUPT;
    for (uint32_t g = 0; g < h->num_groups && st == PKV_OK; g++) {
        const pkvi_hgroup *hg = &h->groups[g];
        if (hg->owns_set && (pkv_seqset_validate(hg->set, 0) != PKV_OK ||
                             pkv_seqset_live_count(hg->set) != live))
            st = PKV_ERR_CORRUPT;
    }
    for (uint32_t g = 0; g < h->num_groups && st == PKV_OK; g++)
        if (h->groups[g].cache) st = pkvi_hcache_validate(h->groups[g].cache);
    for (uint32_t p = 0; p < h->num_pools && st == PKV_OK; p++) st = check_pool(h, h->pools[p]);
    if (st == PKV_OK) st = pkvi_hybrid_lcm_validate(h);
    return st;
}

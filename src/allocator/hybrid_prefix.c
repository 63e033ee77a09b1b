// SPDX-License-Identifier: MIT
// The hybrid KV manager's prefix cache (pkv/hybrid.h, "Prefix cache"): what every
// token group caches and finds, and the eviction an append asks for. Each group
// that owns a set has a cache of its full blocks (hybrid_prefix_cache.c) keyed by
// the block hash chained at its own block size; a hit is the longest length that
// every group's rule accepts (pkv_hybrid_longest_hit over one lookup per hash),
// and a new sequence's tables are built from it: holes before a windowed group's
// window, the cached blocks after.
#include <stdlib.h>

#include "hybrid_internal.h"
#include "pkv/hybrid_hit.h"
#include "seqset_internal.h"

pkv_status pkvi_hybrid_prefix_init(pkv_hybrid *h, const pkv_hybrid_params *params) {
    if (params->prefix_cache_blocks == 0) return PKV_OK;
    if ((unsigned)params->prefix_hash > PKV_HASH_FNV1A_64) return PKV_ERR_INVALID_ARG;
    pkv_status st = pkv_hasher_create(params->prefix_hash, NULL, 0, &h->hasher);
    for (uint32_t g = 0; g < h->num_groups && st == PKV_OK; g++) {
        pkvi_hgroup *hg = &h->groups[g];
        if (hg->desc.kind == PKV_LAYER_STATE) h->has_state = 1;
        if (!hg->owns_set) continue;
        st = pkvi_hcache_create(hg->pool, params->prefix_cache_blocks, !hg->windowed, &h->clock,
                                &hg->cache);
        if (st == PKV_OK) pkvi_seqset_set_hook(hg->set, pkvi_hcache_block_unused, hg->cache);
    }
    return st;
}

void pkvi_hybrid_prefix_teardown(pkv_hybrid *h) {
    for (uint32_t g = 0; g < h->num_groups; g++) {
        pkvi_hgroup *hg = &h->groups[g];
        if (!hg->cache) continue;
        // The set must not tell a freed cache about the blocks it releases later.
        if (hg->set) pkvi_seqset_set_hook(hg->set, NULL, NULL);
        pkvi_hcache_destroy(hg->cache);
        hg->cache = NULL;
    }
    pkv_hasher_destroy(h->hasher);
    h->hasher = NULL;
}

// The hit rule of group g: its kind, or FULL where the window rule is off (PAGED).
static pkv_hit_group rule_of(const pkvi_hgroup *hg) {
    pkv_hit_group r = {.kind = hg->windowed ? hg->desc.kind : PKV_LAYER_FULL,
                       .window = hg->desc.window,
                       .block_size = hg->block_size};
    return r;
}

// One lookup over every cache: found[g] (num_blocks of the group's rule entries)
// the entry of each of the request's full blocks, -1 if not cached.
typedef struct lookup {
    uint32_t hit;                            // the common hit L
    uint32_t first[PKV_MAX_KV_GROUPS];       // per caching group: blocks reused are
    uint32_t count[PKV_MAX_KV_GROUPS];       // first .. first + count - 1
    int32_t *found[PKV_MAX_KV_GROUPS];       // into `entries`
    int32_t *entries;                        // owned
} lookup;

// Entries of group g's cache for the request's first nb full blocks.
static pkv_status find_blocks(const pkv_hybrid *h, const pkvi_hgroup *hg, const int32_t *tokens,
                              uint32_t nb, int32_t *found, uint8_t *cached) {
    pkv_hash_chain chain;
    pkv_hash_chain_init(&chain);
    for (uint32_t i = 0; i < nb; i++) {
        pkv_block_hash key;
        pkv_status st = pkv_hash_chain_next(h->hasher, &chain, tokens + (size_t)i * hg->block_size,
                                            hg->block_size, NULL, &key);
        if (st != PKV_OK) return st;
        found[i] = pkvi_hcache_find(hg->cache, &key);
        cached[i] = found[i] >= 0;
    }
    return PKV_OK;
}

// Fill *lk for tokens[0..n-1]: L <= n - 1; 0 without a cache or with a state group.
static pkv_status find_hit(const pkv_hybrid *h, const int32_t *tokens, uint32_t n, lookup *lk) {
    *lk = (lookup){0};
    if (!h->hasher || h->has_state || n < 2) return PKV_OK;
    uint64_t total = 0;
    for (uint32_t g = 0; g < h->num_groups; g++)
        if (h->groups[g].cache) total += (n - 1) / h->groups[g].block_size;
    lk->entries = malloc((size_t)(total ? total : 1) * sizeof *lk->entries);
    uint8_t *cached = malloc(total ? total : 1);
    pkv_hit_group rules[PKV_MAX_KV_GROUPS] = {{0}};
    uint32_t which[PKV_MAX_KV_GROUPS] = {0}, k = 0;
    pkv_status st = lk->entries && cached ? PKV_OK : PKV_ERR_OUT_OF_MEMORY;
    uint64_t at = 0;
    for (uint32_t g = 0; g < h->num_groups && st == PKV_OK; g++) {
        const pkvi_hgroup *hg = &h->groups[g];
        if (!hg->cache) continue;
        rules[k] = rule_of(hg);
        rules[k].num_blocks = (n - 1) / hg->block_size; // a hit ends at n - 1 at most
        rules[k].cached = cached + at;
        lk->found[g] = lk->entries + at;
        st = find_blocks(h, hg, tokens, rules[k].num_blocks, lk->found[g], cached + at);
        at += rules[k].num_blocks;
        which[k++] = g;
    }
    if (st == PKV_OK) st = pkv_hybrid_longest_hit(rules, k, n - 1, &lk->hit);
    for (uint32_t i = 0; i < k && st == PKV_OK; i++)
        st = pkv_hybrid_hit_blocks(&rules[i], lk->hit, &lk->first[which[i]], &lk->count[which[i]]);
    free(cached);
    return st;
}

pkv_status pkv_hybrid_prefix_match_get(const pkv_hybrid *h, const int32_t *tokens, uint32_t n,
                                       pkv_hybrid_prefix_match *match) {
    if (!h || !match || (n && !tokens)) return PKV_ERR_INVALID_ARG;
    lookup lk;
    pkv_status st = find_hit(h, tokens, n, &lk);
    *match = (pkv_hybrid_prefix_match){.cached_tokens = lk.hit};
    for (uint32_t g = 0; g < h->num_groups && st == PKV_OK; g++) {
        const pkvi_hgroup *hg = &h->groups[g];
        if (!hg->cache) continue;
        match->hit_blocks[g] = lk.count[g];
        for (uint32_t i = lk.first[g]; i < lk.first[g] + lk.count[g]; i++)
            match->evictable_hit[g] += (uint32_t)pkvi_hcache_is_evictable(hg->cache, lk.found[g][i]);
    }
    // A PAGED alias repeats the one table's figures.
    for (uint32_t g = 0; g < h->num_groups; g++) {
        const uint32_t o = pkvi_hybrid_owner(h, g);
        if (o != g && pkvi_hybrid_is_token_group(h, g)) {
            match->hit_blocks[g] = match->hit_blocks[o];
            match->evictable_hit[g] = match->evictable_hit[o];
        }
    }
    free(lk.entries);
    return st;
}

// Give the new sequence r group g's part of the hit: holes, then the cached blocks.
static pkv_status adopt_hit(pkvi_hgroup *hg, const lookup *lk, uint32_t g, pkv_seq_id gid) {
    pkv_status st = PKV_OK;
    for (uint32_t i = 0; i < lk->first[g] && st == PKV_OK; i++) st = pkvi_seq_adopt_hole(hg->set, gid);
    for (uint32_t i = lk->first[g]; i < lk->first[g] + lk->count[g] && st == PKV_OK; i++)
        st = pkvi_hcache_adopt(hg->cache, lk->found[g][i], hg->set, gid);
    return st;
}

pkv_status pkv_hybrid_seq_create_cached(pkv_hybrid *h, const int32_t *tokens, uint32_t n,
                                        pkv_seq_id *id, uint32_t *cached_tokens) {
    if (!h || !id || !cached_tokens || (n && !tokens)) return PKV_ERR_INVALID_ARG;
    lookup lk;
    pkv_status st = find_hit(h, tokens, n, &lk);
    if (st == PKV_OK) st = pkv_hybrid_seq_create(h, id);
    if (st != PKV_OK || lk.hit == 0) {
        free(lk.entries);
        if (st == PKV_OK) *cached_tokens = 0;
        return st;
    }
    pkvi_hrecord *r = pkvi_hybrid_rec(h, *id);
    for (uint32_t g = 0; g < h->num_groups && st == PKV_OK; g++)
        if (h->groups[g].cache) st = adopt_hit(&h->groups[g], &lk, g, r->gid[g]);
    free(lk.entries);
    if (st != PKV_OK) { // the adopted blocks go back to their caches' eviction order
        pkv_hybrid_seq_free(h, *id);
        return st;
    }
    r->len = lk.hit;
    *cached_tokens = lk.hit;
    return PKV_OK;
}

// Offer group g's full blocks of tokens[0..n-1] of the sequence with set id gid.
static pkv_status insert_group(pkv_hybrid *h, pkvi_hgroup *hg, pkv_seq_id gid,
                               const int32_t *tokens, uint32_t n) {
    const pkv_block_id *table;
    uint32_t nb;
    pkv_status st = pkv_seq_block_table(hg->set, gid, &table, &nb);
    pkv_hash_chain chain;
    pkv_hash_chain_init(&chain);
    int32_t parent = -1;
    const uint32_t full = n / hg->block_size;
    for (uint32_t i = 0; i < full && st == PKV_OK; i++) {
        pkv_block_hash key;
        st = pkv_hash_chain_next(h->hasher, &chain, tokens + (size_t)i * hg->block_size,
                                 hg->block_size, NULL, &key);
        int32_t e = -1;
        if (st == PKV_OK) st = pkvi_hcache_insert(hg->cache, &key, table[i], parent, &e);
        if (e < 0 && !hg->windowed) break; // a chain ends at its first gap
        parent = e;
    }
    return st;
}

pkv_status pkv_hybrid_cache_prefix(pkv_hybrid *h, pkv_seq_id id, const int32_t *tokens,
                                   uint32_t n, uint32_t *inserted) {
    if (!h || (n && !tokens)) return PKV_ERR_INVALID_ARG;
    if (!h->hasher) return PKV_ERR_UNSUPPORTED;
    const pkvi_hrecord *r = pkvi_hybrid_rec(h, id);
    if (!r) return PKV_ERR_NOT_FOUND;
    if (n > r->len) return PKV_ERR_INVALID_ARG;
    uint64_t before = 0, after = 0;
    pkvi_hcache_stats cs;
    pkv_status st = PKV_OK;
    for (uint32_t g = 0; g < h->num_groups; g++) {
        pkvi_hgroup *hg = &h->groups[g];
        if (!hg->cache) continue;
        pkvi_hcache_get_stats(hg->cache, &cs);
        before += cs.inserts;
        if (st == PKV_OK && !h->has_state) st = insert_group(h, hg, r->gid[g], tokens, n);
        pkvi_hcache_get_stats(hg->cache, &cs);
        after += cs.inserts;
    }
    pkvi_hybrid_released(h); // a full cache may have evicted
    if (inserted) *inserted = (uint32_t)(after - before);
    return st;
}

uint64_t pkvi_hybrid_prefix_evictable(const pkv_hybrid *h, const pkv_pool *pool) {
    uint64_t n = 0;
    for (uint32_t g = 0; g < h->num_groups; g++) {
        const pkvi_hgroup *hg = &h->groups[g];
        if (!hg->cache || hg->pool != pool) continue;
        pkvi_hcache_stats cs;
        pkvi_hcache_get_stats(hg->cache, &cs);
        n += cs.evictable;
    }
    return n;
}

// Evict the oldest evictable block of the caches on `pool` (NULL: of every cache).
static int evict_oldest_on(pkv_hybrid *h, const pkv_pool *pool) {
    pkvi_hcache *best = NULL;
    uint64_t oldest = UINT64_MAX;
    for (uint32_t g = 0; g < h->num_groups; g++) {
        const pkvi_hgroup *hg = &h->groups[g];
        if (!hg->cache || (pool && hg->pool != pool)) continue;
        const uint64_t t = pkvi_hcache_oldest(hg->cache);
        if (t < oldest) oldest = t, best = hg->cache;
    }
    return best && pkvi_hcache_evict_oldest(best, -1);
}

int pkvi_hybrid_prefix_evict_for(pkv_hybrid *h, const int64_t *need) {
    for (uint32_t p = 0; p < h->num_pools; p++) {
        int64_t sum = 0;
        for (uint32_t g = 0; g < h->num_groups; g++)
            if (h->groups[g].owns_set && h->groups[g].pool == h->pools[p]) sum += need[g];
        if (sum > (int64_t)pkv_pool_free_count(h->pools[p]) && evict_oldest_on(h, h->pools[p]))
            return 1;
    }
    // Every short pool's own caches are empty: the LCM layout may still find a
    // large page that the evictions of other groups empty.
    return h->layout == PKV_HYBRID_LCM && evict_oldest_on(h, NULL);
}

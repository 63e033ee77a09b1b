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

// States are cached at multiples of the LCM of the token groups' block sizes (a
// hit ends on a block boundary in every group anyway); beyond this no state is.
#define MAX_STATE_INTERVAL (1u << 20)

static uint64_t gcd64(uint64_t a, uint64_t b) {
    while (b) {
        const uint64_t t = a % b;
        a = b;
        b = t;
    }
    return a;
}

pkv_status pkvi_hybrid_prefix_init(pkv_hybrid *h, const pkv_hybrid_params *params) {
    // Events report the cache's contents: asked for without a cache, refuse.
    if (params->prefix_cache_blocks == 0) return params->event_capacity ? PKV_ERR_INVALID_ARG : PKV_OK;
    if ((unsigned)params->prefix_hash > PKV_HASH_FNV1A_64) return PKV_ERR_INVALID_ARG;
    pkv_status st = pkv_hasher_create(params->prefix_hash, NULL, 0, &h->hasher);
    uint64_t S = 1;
    for (uint32_t g = 0; g < h->num_groups && S <= MAX_STATE_INTERVAL; g++)
        if (pkvi_hybrid_is_token_group(h, g)) S = S / gcd64(S, h->groups[g].block_size) * h->groups[g].block_size;
    h->state_interval = S <= MAX_STATE_INTERVAL ? (uint32_t)S : 0;
    for (uint32_t g = 0; g < h->num_groups && st == PKV_OK; g++) {
        pkvi_hgroup *hg = &h->groups[g];
        if (hg->desc.kind == PKV_LAYER_STATE) {
            h->has_state = 1; // a cache of state snapshots, in the group's own slots
            if (h->state_interval)
                st = pkvi_hcache_create(hg->pool, params->prefix_cache_blocks, 0, &h->clock,
                                        &hg->cache);
            continue;
        }
        if (!hg->owns_set) continue;
        st = pkvi_hcache_create(hg->pool, params->prefix_cache_blocks, !hg->windowed, &h->clock,
                                &hg->cache);
        if (st == PKV_OK) pkvi_seqset_set_hook(hg->set, pkvi_hcache_block_unused, hg->cache);
    }
    if (st == PKV_OK) st = pkvi_hybrid_events_init(h, params);
    return st;
}

uint32_t pkv_hybrid_state_interval(const pkv_hybrid *h) {
    return h && h->hasher && h->has_state ? h->state_interval : 0;
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
    pkvi_events_free(&h->events);
}

// The hit rule of group g: its kind, or FULL where the window rule is off (PAGED);
// a state group's "blocks" are the state interval's.
static pkv_hit_group rule_of(const pkv_hybrid *h, const pkvi_hgroup *hg) {
    const int state = hg->desc.kind == PKV_LAYER_STATE;
    pkv_hit_group r = {.kind = hg->windowed || state ? hg->desc.kind : PKV_LAYER_FULL,
                       .window = hg->desc.window,
                       .block_size = state ? h->state_interval : hg->block_size};
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

// Entries of group g's cache for the request's first nb blocks of bs tokens.
// stop_at_miss: the blocks after the first miss are not looked up (marked
// missing): a chained group's cache holds none of them.
static pkv_status find_blocks(const pkv_hybrid *h, const pkvi_hgroup *hg, const int32_t *tokens,
                              uint32_t bs, uint32_t nb, int stop_at_miss, int32_t *found,
                              uint8_t *cached) {
    pkv_hash_chain chain;
    pkv_hash_chain_init(&chain);
    uint32_t i = 0;
    for (; i < nb; i++) {
        pkv_block_hash key;
        pkv_status st =
            pkv_hash_chain_next(h->hasher, &chain, tokens + (size_t)i * bs, bs, NULL, &key);
        if (st != PKV_OK) return st;
        found[i] = pkvi_hcache_find(hg->cache, &key);
        cached[i] = found[i] >= 0;
        if (stop_at_miss && !cached[i]) break;
    }
    for (i = i < nb ? i + 1 : nb; i < nb; i++) found[i] = -1, cached[i] = 0;
    return PKV_OK;
}

static int chained_rule(const pkv_hit_group *r) {
    return r->kind == PKV_LAYER_FULL || r->kind == PKV_LAYER_MLA;
}

// Fill *lk for tokens[0..n-1]: L <= n - 1; 0 without a cache, or with a state
// group whose states are not cached (state_interval 0). The chained (FULL, MLA)
// groups go first and stop at their first miss; no hit reaches past it, so the
// other groups hash and look up only the blocks before it (a prompt that shares
// little costs little, however long).
static pkv_status find_hit(const pkv_hybrid *h, const int32_t *tokens, uint32_t n, lookup *lk) {
    *lk = (lookup){0};
    if (!h->hasher || (h->has_state && !h->state_interval) || n < 2) return PKV_OK;
    uint64_t total = 0;
    for (uint32_t g = 0; g < h->num_groups; g++)
        if (h->groups[g].cache) total += (n - 1) / rule_of(h, &h->groups[g]).block_size;
    lk->entries = malloc((size_t)(total ? total : 1) * sizeof *lk->entries);
    uint8_t *cached = malloc(total ? total : 1);
    pkv_hit_group rules[PKV_MAX_KV_GROUPS] = {{0}};
    uint32_t which[PKV_MAX_KV_GROUPS] = {0}, k = 0;
    pkv_status st = lk->entries && cached ? PKV_OK : PKV_ERR_OUT_OF_MEMORY;
    uint64_t at = 0;
    uint32_t reach = n - 1; // tokens a hit may reach: n - 1, then the chained groups' lead
    for (int pass = 0; pass < 2; pass++)
        for (uint32_t g = 0; g < h->num_groups && st == PKV_OK; g++) {
            const pkvi_hgroup *hg = &h->groups[g];
            if (!hg->cache) continue;
            pkv_hit_group r = rule_of(h, hg);
            if (chained_rule(&r) != (pass == 0)) continue;
            // Blocks past `reach` are left out: the hit rules treat them as unknown.
            r.num_blocks = reach / r.block_size;
            r.cached = cached + at;
            lk->found[g] = lk->entries + at;
            st = find_blocks(h, hg, tokens, r.block_size, r.num_blocks, pass == 0,
                             lk->found[g], cached + at);
            if (st == PKV_OK && pass == 0) { // no hit passes this group's first miss
                uint32_t lead = 0;
                while (lead < r.num_blocks && r.cached[lead]) lead++;
                if ((uint64_t)lead * r.block_size < reach) reach = lead * r.block_size;
            }
            at += r.num_blocks;
            rules[k] = r;
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

static int is_state_cache(const pkv_hybrid *h, uint32_t g) {
    return !h->groups[g].set && h->groups[g].cache;
}

// The cached state a hit uses in state group g.
static int32_t state_entry(const lookup *lk, uint32_t g) { return lk->found[g][lk->first[g]]; }

// Release the holds create_cached took on the hit's states of groups 0..upto-1.
static void drop_held(pkv_hybrid *h, const lookup *lk, uint32_t upto) {
    for (uint32_t g = 0; g < upto; g++) {
        if (!is_state_cache(h, g)) continue;
        pkvi_hgroup *hg = &h->groups[g];
        const pkv_block_id snap = pkvi_hcache_block(hg->cache, state_entry(lk, g));
        pkv_pool_release(hg->pool, snap);
        if (pkv_pool_refcount(hg->pool, snap) == 1) pkvi_hcache_block_unused(hg->cache, snap);
    }
}

// When the only slot a state group could give a new sequence is the cached state
// its hit starts from (the pool full, nothing else evictable, the state held by the
// cache and the hit alone), that state becomes the sequence's slot: given[g] = its
// slot (else -1). 1 if any group hands one over.
static int plan_hand_over(const pkv_hybrid *h, const lookup *lk, pkv_block_id *given) {
    int any = 0;
    for (uint32_t g = 0; g < h->num_groups; g++) {
        given[g] = -1;
        if (!is_state_cache(h, g)) continue;
        const pkvi_hgroup *hg = &h->groups[g];
        const pkv_block_id snap = pkvi_hcache_block(hg->cache, state_entry(lk, g));
        if (pkv_pool_free_count(hg->pool) == 0 && pkvi_hcache_oldest(hg->cache) == UINT64_MAX &&
            pkv_pool_refcount(hg->pool, snap) == 2)
            given[g] = snap, any = 1;
    }
    return any;
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
    if (st == PKV_OK && lk.hit) st = pkvi_hybrid_reserve_state_copies(h); // the hit's copies
    // Hold the hit's cached states first: the new sequence's own slot may otherwise
    // evict the very state it is about to start from.
    uint32_t held = 0; // groups 0..held-1 hold theirs
    while (st == PKV_OK && lk.hit && held < h->num_groups) {
        if (is_state_cache(h, held)) st = pkvi_hcache_hold(h->groups[held].cache, state_entry(&lk, held));
        if (st == PKV_OK) held++;
    }
    if (st == PKV_OK) st = pkv_hybrid_seq_create(h, id);
    // Short of a state slot only because the hit holds the last cached state: the
    // sequence takes that state itself rather than fail where a miss would succeed.
    pkv_block_id given[PKV_MAX_KV_GROUPS];
    const int handed = st == PKV_ERR_OUT_OF_BLOCKS && lk.hit && held == h->num_groups &&
                       plan_hand_over(h, &lk, given);
    if (handed) st = pkvi_hybrid_seq_create_given(h, given, id);
    if (st != PKV_OK || lk.hit == 0) {
        drop_held(h, &lk, lk.hit ? held : 0);
        free(lk.entries);
        if (st == PKV_OK) *cached_tokens = 0;
        return st;
    }
    pkvi_hrecord *r = pkvi_hybrid_rec(h, *id);
    for (uint32_t g = 0; g < h->num_groups && st == PKV_OK; g++)
        if (h->groups[g].set && h->groups[g].cache) st = adopt_hit(&h->groups[g], &lk, g, r->gid[g]);
    if (st != PKV_OK) { // the adopted blocks go back to their caches' eviction order
        pkv_hybrid_seq_free(h, *id); // first: a handed-over state is unused after the hold
        drop_held(h, &lk, held);
        free(lk.entries);
        return st;
    }
    // A state group starts from the state cached at the hit: a queued copy from the
    // snapshot's slot into the sequence's (as fork's), pinning both; the copy's pin
    // replaces the hold.
    for (uint32_t g = 0; g < h->num_groups; g++) {
        if (!is_state_cache(h, g)) continue;
        pkvi_hgroup *hg = &h->groups[g];
        const pkv_block_id snap = pkvi_hcache_block(hg->cache, state_entry(&lk, g));
        if (handed && given[g] >= 0) pkvi_hcache_give_up(hg->cache, state_entry(&lk, g)); // no copy
        else pkvi_hybrid_queue_state_copy(h, g, snap, r->gid[g]);
        pkv_pool_release(hg->pool, snap);
        pkvi_hcache_count_hit(hg->cache, lk.hit);
    }
    free(lk.entries);
    r->len = lk.hit;
    *cached_tokens = lk.hit;
    return PKV_OK;
}

static uint64_t inserts_of(const pkvi_hcache *c) {
    pkvi_hcache_stats cs;
    pkvi_hcache_get_stats(c, &cs);
    return cs.inserts;
}

// BlockStored of group g's new blocks from .. to - 1 (nothing when from >= to):
// keys holds every block's hash so far, the parent is the one before `from`.
static void emit_run(pkv_hybrid *h, uint32_t g, const pkv_block_hash *keys, uint32_t from,
                     uint32_t to, const int32_t *tokens, uint32_t bs) {
    if (from < to)
        pkvi_hybrid_emit_stored(h, g, from ? &keys[from - 1] : NULL, keys + from, to - from,
                                tokens + (size_t)from * bs, bs);
}

// Offer group g's full blocks of tokens[0..n-1] of the sequence with set id gid.
// With events on, each run of consecutive new entries becomes one BlockStored.
static pkv_status insert_group(pkv_hybrid *h, uint32_t g, pkv_seq_id gid, const int32_t *tokens,
                               uint32_t n) {
    pkvi_hgroup *hg = &h->groups[g];
    const uint32_t bs = hg->block_size, full = n / bs;
    const int events = pkvi_events_on(&h->events);
    pkv_block_hash keys_small[64];
    pkv_block_hash *keys = keys_small; // events: every block's hash, for the runs' parents
    if (events && full > 64 && !(keys = malloc((size_t)full * sizeof *keys)))
        return PKV_ERR_OUT_OF_MEMORY;
    const pkv_block_id *table;
    uint32_t nb;
    pkv_status st = pkv_seq_block_table(hg->set, gid, &table, &nb);
    pkv_hash_chain chain;
    pkv_hash_chain_init(&chain);
    int32_t parent = -1;
    uint32_t run = 0, i = 0; // the current run of new entries: blocks run .. i - 1
    for (; i < full && st == PKV_OK; i++) {
        pkv_block_hash key;
        st = pkv_hash_chain_next(h->hasher, &chain, tokens + (size_t)i * bs, bs, NULL, &key);
        int32_t e = -1;
        const uint64_t before = inserts_of(hg->cache);
        if (st == PKV_OK) st = pkvi_hcache_insert(hg->cache, &key, table[i], parent, &e);
        if (events) keys[i] = key;
        if (st != PKV_OK || inserts_of(hg->cache) == before) { // not new: the run ends here
            if (events) emit_run(h, g, keys, run, i, tokens, bs);
            run = i + 1;
        }
        if (e < 0 && !hg->windowed) break; // a chain ends at its first gap
        parent = e;
    }
    if (events) emit_run(h, g, keys, run, i, tokens, bs);
    if (keys != keys_small) free(keys);
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
        if (st == PKV_OK && hg->set) st = insert_group(h, g, r->gid[g], tokens, n);
        pkvi_hcache_get_stats(hg->cache, &cs);
        after += cs.inserts;
    }
    pkvi_hybrid_released(h); // a full cache may have evicted
    if (inserted) *inserted = (uint32_t)(after - before);
    return st;
}

pkv_status pkvi_hybrid_take_slot(pkv_hybrid *h, uint32_t g, pkv_block_id *slot) {
    pkvi_hgroup *hg = &h->groups[g];
    // Evict before asking: a refused alloc counts as a pool failure.
    if (pkv_pool_free_count(hg->pool) == 0 && hg->cache) pkvi_hcache_evict_oldest(hg->cache, -1, NULL);
    return pkv_pool_alloc(hg->pool, 1, slot);
}

void pkvi_hybrid_prefix_unpinned(pkv_hybrid *h, uint32_t g, pkv_block_id src, pkv_block_id dst) {
    pkvi_hcache *c = h->groups[g].cache;
    if (!c) return;
    if (pkv_pool_refcount(h->groups[g].pool, src) == 1) pkvi_hcache_block_unused(c, src);
    if (pkv_pool_refcount(h->groups[g].pool, dst) == 1) pkvi_hcache_block_unused(c, dst);
}

// Snapshot state group g's state of sequence r (length n) under `key`: a slot of
// the cache's own (an old snapshot may make room), filled by a queued copy from
// the sequence's slot. Nothing when the prefix is cached already (refreshed) or
// no slot can be had. A new snapshot is a BlockStored of the last S tokens
// (last: tokens[n-S..n-1]), parent the hash at n - S (NULL at n = S).
static pkv_status snapshot_state(pkv_hybrid *h, uint32_t g, const pkvi_hrecord *r,
                                 const pkv_block_hash *key, const pkv_block_hash *parent,
                                 const int32_t *last, uint32_t *added) {
    pkvi_hgroup *hg = &h->groups[g];
    int32_t e = -1;
    if (pkvi_hcache_find(hg->cache, key) >= 0) return pkvi_hcache_insert(hg->cache, key, -1, -1, &e);
    pkv_block_id slot;
    if (pkvi_hybrid_take_slot(h, g, &slot) != PKV_OK) return PKV_OK; // every slot in use
    pkv_status st = pkvi_hcache_insert(hg->cache, key, slot, -1, &e);
    if (st == PKV_OK && e >= 0) {
        pkvi_hybrid_queue_state_copy(h, g, r->gid[g], slot);
        pkvi_hybrid_emit_stored(h, g, parent, key, 1, last, h->state_interval);
        (*added)++;
    }
    pkv_pool_release(hg->pool, slot); // the cache and the copy's pin hold it now
    return st;
}

pkv_status pkv_hybrid_cache_state(pkv_hybrid *h, pkv_seq_id id, const int32_t *tokens, uint32_t n,
                                  uint32_t *cached) {
    if (!h || (n && !tokens)) return PKV_ERR_INVALID_ARG;
    if (!h->hasher) return PKV_ERR_UNSUPPORTED;
    const pkvi_hrecord *r = pkvi_hybrid_rec(h, id);
    if (!r) return PKV_ERR_NOT_FOUND;
    const uint32_t S = h->state_interval;
    uint32_t added = 0;
    pkv_status st = PKV_OK;
    if (n != r->len || (h->has_state && (!S || n == 0 || n % S))) return PKV_ERR_INVALID_ARG;
    if (h->has_state) st = pkvi_hybrid_reserve_state_copies(h);
    for (uint32_t g = 0; g < h->num_groups && st == PKV_OK; g++) {
        if (h->groups[g].set || !h->groups[g].cache) continue;
        pkv_hash_chain chain;
        pkv_hash_chain_init(&chain);
        pkv_block_hash key = {0}, prev = {0};
        for (uint32_t i = 0; i < n / S && st == PKV_OK; i++) {
            prev = key;
            st = pkv_hash_chain_next(h->hasher, &chain, tokens + (size_t)i * S, S, NULL, &key);
        }
        if (st == PKV_OK)
            st = snapshot_state(h, g, r, &key, n > S ? &prev : NULL, tokens + (n - S), &added);
        r = pkvi_hybrid_rec(h, id);
    }
    if (cached) *cached = added;
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

// A FULL/MLA group lost block i of a prefix (key): no hit of that prefix can
// reach past it, so a windowed group's block i of the same prefix (the same key
// when the block sizes are equal) is of no use any more and goes first.
static void demote_useless(pkv_hybrid *h, uint32_t lost_in, const pkv_block_hash *key) {
    const pkvi_hgroup *lost = &h->groups[lost_in];
    if (lost->windowed) return; // a windowed group's loss leaves shorter hits possible
    for (uint32_t g = 0; g < h->num_groups; g++) {
        const pkvi_hgroup *hg = &h->groups[g];
        if (hg->cache && hg->set && hg->windowed && hg->block_size == lost->block_size)
            pkvi_hcache_demote(hg->cache, key);
    }
}

// Evict the oldest evictable block of the token caches on `pool` (NULL: of every
// token cache; cached states live in slots no append takes).
static int evict_oldest_on(pkv_hybrid *h, const pkv_pool *pool) {
    uint32_t best = UINT32_MAX;
    uint64_t oldest = UINT64_MAX;
    for (uint32_t g = 0; g < h->num_groups; g++) {
        const pkvi_hgroup *hg = &h->groups[g];
        if (!hg->cache || !hg->set || (pool && hg->pool != pool)) continue;
        const uint64_t t = pkvi_hcache_oldest(hg->cache);
        if (t < oldest) oldest = t, best = g;
    }
    pkv_block_hash key;
    if (best == UINT32_MAX || !pkvi_hcache_evict_oldest(h->groups[best].cache, -1, &key)) return 0;
    demote_useless(h, best, &key);
    return 1;
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

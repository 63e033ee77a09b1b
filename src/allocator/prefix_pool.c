// SPDX-License-Identifier: MIT
// The prefix pool (prefix_pool.h): refcounts, the free queue, and the cache table.
//
// Free queue: an intrusive circular doubly linked list through blk[].prev/next,
// with a sentinel node at index num_blocks (its next is the head, its prev the
// tail). A block is in it exactly when its refcount is 0 (the null block never is).
//
// Cache table: open addressing (linear probing, backward-shift deletion) from
// (hash, group) to the earliest cached block under that key; the other blocks under
// the key follow it on a circular list through blk[].dup_prev/dup_next, in caching
// order. A block is on a key's list exactly when blk[].cached.
#include <stdlib.h>
#include <string.h>

#include "kv_events.h"
#include "pkv/prefix_pool.h"

typedef struct pblock {
    int32_t ref;
    int32_t prev, next;         // free queue links; prev = -1 when not queued
    int32_t dup_prev, dup_next; // blocks under the same key (circular), when cached
    int32_t mark;               // free_blocks scratch: where the block is queued, -1
    uint32_t group;
    uint32_t cached;
    uint64_t key64;             // the hash's first 8 bytes: probes compare this first
} pblock;

struct pkv_prefix_pool {
    uint32_t capacity;          // num_blocks
    uint32_t num_groups;
    int caching;
    pkv_medium medium;
    uint32_t num_free;          // queue length
    uint32_t num_cached;
    pblock *blk;                // [capacity + 1]; the last is the queue's sentinel
    pkv_block_hash *hash;       // [capacity]; valid while cached
    pkv_block_hash *parent;     // [capacity]; len 0 for a chain's first block
    int32_t *table;             // [table_mask + 1]; head block of a key, or -1
    uint32_t table_mask;
    uint32_t table_shift;       // 64 - log2(table size)
    pkvi_event_buf events;
    pkv_prefix_pool_stats stats;
};

pkv_prefix_pool_params pkv_prefix_pool_params_default(uint32_t num_blocks) {
    pkv_prefix_pool_params p;
    memset(&p, 0, sizeof p);
    p.num_blocks = num_blocks;
    p.num_groups = 1;
    p.enable_caching = 1;
    p.medium = PKV_MEDIUM_GPU;
    return p;
}

// --- free queue ---

static int32_t sentinel(const pkv_prefix_pool *p) { return (int32_t)p->capacity; }

static void link_after(pkv_prefix_pool *p, int32_t at, int32_t b) {
    pblock *blk = p->blk;
    int32_t nx = blk[at].next;
    blk[b].prev = at;
    blk[b].next = nx;
    blk[nx].prev = b;
    blk[at].next = b;
    p->num_free++;
}

static void unlink_block(pkv_prefix_pool *p, int32_t b) {
    pblock *blk = p->blk;
    blk[blk[b].prev].next = blk[b].next;
    blk[blk[b].next].prev = blk[b].prev;
    blk[b].prev = blk[b].next = -1;
    p->num_free--;
}

// --- cache table ---

static uint64_t first8(const pkv_block_hash *h) {
    uint64_t k = 0;
    memcpy(&k, h->bytes, sizeof k); // bytes past len are zero
    return k;
}

static uint32_t home(const pkv_prefix_pool *p, uint64_t key64, uint32_t group) {
    // Fibonacci hashing: the top bits of a multiply spread FNV's weak low bits too.
    return (uint32_t)(((key64 ^ group) * 0x9e3779b97f4a7c15ull) >> p->table_shift);
}

static int same_hash(const pkv_block_hash *a, const pkv_block_hash *b) {
    return a->len == b->len && memcmp(a->bytes, b->bytes, a->len) == 0;
}

// Table slot of (hash, group), or -1.
static int64_t table_find(const pkv_prefix_pool *p, uint32_t group, const pkv_block_hash *h,
                          uint64_t key64) {
    for (uint32_t i = home(p, key64, group);; i = (i + 1) & p->table_mask) {
        int32_t b = p->table[i];
        if (b < 0) return -1;
        const pblock *x = &p->blk[b];
        if (x->key64 == key64 && x->group == group && same_hash(&p->hash[b], h)) return i;
    }
}

static void table_put(pkv_prefix_pool *p, int32_t b) {
    uint32_t i = home(p, p->blk[b].key64, p->blk[b].group);
    while (p->table[i] >= 0) i = (i + 1) & p->table_mask;
    p->table[i] = b;
}

// Empty slot i, moving later entries back so each stays reachable from its home.
static void table_clear(pkv_prefix_pool *p, uint32_t i) {
    for (uint32_t j = i;;) {
        j = (j + 1) & p->table_mask;
        int32_t b = p->table[j];
        if (b < 0) break;
        uint32_t k = home(p, p->blk[b].key64, p->blk[b].group);
        int stays = i <= j ? (i < k && k <= j) : (i < k || k <= j);
        if (stays) continue;
        p->table[i] = b;
        i = j;
    }
    p->table[i] = -1;
}

// Put block b (hash, group and key64 set) under its key, after the blocks there.
static void cache_insert(pkv_prefix_pool *p, int32_t b) {
    pblock *blk = p->blk;
    int64_t slot = table_find(p, blk[b].group, &p->hash[b], blk[b].key64);
    if (slot < 0) {
        blk[b].dup_prev = blk[b].dup_next = b;
        table_put(p, b);
    } else {
        int32_t head = p->table[slot], tail = blk[head].dup_prev;
        blk[b].dup_prev = tail;
        blk[b].dup_next = head;
        blk[tail].dup_next = b;
        blk[head].dup_prev = b;
    }
    blk[b].cached = 1;
    p->num_cached++;
}

static void emit_removed(pkv_prefix_pool *p, int32_t b) {
    pkvi_events_removed(&p->events, p->blk[b].group, p->medium, &p->hash[b]);
}

// Drop block b's hash (it must be cached): it is found no more.
static void uncache(pkv_prefix_pool *p, int32_t b) {
    pblock *blk = p->blk;
    emit_removed(p, b);
    if (blk[b].dup_next == b) {
        table_clear(p, (uint32_t)table_find(p, blk[b].group, &p->hash[b], blk[b].key64));
    } else {
        int64_t slot = table_find(p, blk[b].group, &p->hash[b], blk[b].key64);
        if (p->table[slot] == b) p->table[slot] = blk[b].dup_next; // the next earliest leads
        blk[blk[b].dup_prev].dup_next = blk[b].dup_next;
        blk[blk[b].dup_next].dup_prev = blk[b].dup_prev;
    }
    blk[b].dup_prev = blk[b].dup_next = -1;
    blk[b].cached = 0;
    p->hash[b].len = 0;
    p->parent[b].len = 0;
    p->num_cached--;
    p->stats.evictions++;
}

// --- lifetime ---

pkv_status pkv_prefix_pool_create(const pkv_prefix_pool_params *prm, pkv_prefix_pool **out) {
    if (!out) return PKV_ERR_INVALID_ARG;
    *out = NULL;
    if (!prm || prm->num_blocks < 2 || prm->num_blocks > PKV_POOL_MAX_BLOCKS ||
        prm->num_groups == 0 || (unsigned)prm->medium > PKV_MEDIUM_DISK)
        return PKV_ERR_INVALID_ARG;
    pkv_prefix_pool *p = calloc(1, sizeof *p);
    if (!p) return PKV_ERR_OUT_OF_MEMORY;
    const uint32_t n = prm->num_blocks;
    uint32_t bits = 4;
    while ((1u << bits) < 2 * n) bits++; // load factor <= 1/2
    p->capacity = n;
    p->num_groups = prm->num_groups;
    p->caching = prm->enable_caching != 0;
    p->medium = prm->medium;
    p->table_mask = (1u << bits) - 1;
    p->table_shift = 64 - bits;
    p->blk = malloc(((size_t)n + 1) * sizeof *p->blk);
    p->hash = calloc(n, sizeof *p->hash);
    p->parent = calloc(n, sizeof *p->parent);
    p->table = malloc(((size_t)p->table_mask + 1) * sizeof *p->table);
    pkv_status st = PKV_ERR_OUT_OF_MEMORY;
    if (!p->blk || !p->hash || !p->parent || !p->table ||
        (st = pkvi_events_init(&p->events, prm->event_capacity, prm->event_payload)) != PKV_OK) {
        pkv_prefix_pool_destroy(p);
        return st;
    }
    memset(p->table, 0xff, ((size_t)p->table_mask + 1) * sizeof *p->table);
    const int32_t s = sentinel(p);
    for (int32_t b = 0; b <= s; b++)
        p->blk[b] = (pblock){.prev = -1, .next = -1, .dup_prev = -1, .dup_next = -1, .mark = -1};
    p->blk[s].prev = p->blk[s].next = s;
    // The null block stays out of the queue with a permanent reference.
    p->blk[PKV_NULL_BLOCK].ref = 1;
    for (int32_t b = 1; b < s; b++) link_after(p, p->blk[s].prev, b); // fresh pool: 1, 2, 3, ...
    *out = p;
    return PKV_OK;
}

void pkv_prefix_pool_destroy(pkv_prefix_pool *p) {
    if (!p) return;
    pkvi_events_free(&p->events);
    free(p->blk);
    free(p->hash);
    free(p->parent);
    free(p->table);
    free(p);
}

// --- allocation ---

pkv_status pkv_prefix_pool_get_new_blocks(pkv_prefix_pool *p, uint32_t n, pkv_block_id *ids) {
    if (!p || (n && !ids)) return PKV_ERR_INVALID_ARG;
    if (n > p->num_free) return PKV_ERR_OUT_OF_BLOCKS;
    const int32_t s = sentinel(p);
    for (uint32_t i = 0; i < n; i++) {
        int32_t b = p->blk[s].next;
        unlink_block(p, b);
        if (p->blk[b].cached) uncache(p, b); // lazy eviction: the queue handed it out
        p->blk[b].ref = 1;
        ids[i] = b;
    }
    return PKV_OK;
}

pkv_status pkv_prefix_pool_free_blocks(pkv_prefix_pool *p, const pkv_block_id *ids, uint32_t n) {
    if (!p || (n && !ids)) return PKV_ERR_INVALID_ARG;
    pblock *blk = p->blk;
    // Pass 1: drop every reference, undone if an id is bad, so a bad list changes nothing.
    for (uint32_t i = 0; i < n; i++) {
        int32_t b = ids[i];
        if ((uint32_t)b >= p->capacity || (b != PKV_NULL_BLOCK && blk[b].ref <= 0)) {
            for (uint32_t j = 0; j < i; j++)
                if (ids[j] != PKV_NULL_BLOCK) blk[ids[j]].ref++;
            return PKV_ERR_NOT_FOUND;
        }
        if (b != PKV_NULL_BLOCK) blk[b].ref--;
    }
    // Pass 2: a block listed k times reaches 0 at its last listing (as one-by-one
    // decrements would); mark that position, then queue in list order.
    for (uint32_t k = n; k > 0; k--) { // last listing first (no unsigned wrap)
        const uint32_t i = k - 1;
        int32_t b = ids[i];
        if (b != PKV_NULL_BLOCK && blk[b].ref == 0 && blk[b].mark < 0) blk[b].mark = (int32_t)i;
    }
    const int32_t s = sentinel(p);
    int32_t front = s; // uncached blocks go to the front, in list order
    for (uint32_t i = 0; i < n; i++) {
        int32_t b = ids[i];
        if (b == PKV_NULL_BLOCK || blk[b].mark != (int32_t)i) continue;
        blk[b].mark = -1;
        if (p->caching && !blk[b].cached) {
            link_after(p, front, b);
            front = b;
        } else {
            link_after(p, blk[s].prev, b); // tail: evicted last, in list order
        }
    }
    return PKV_OK;
}

pkv_status pkv_prefix_pool_touch(pkv_prefix_pool *p, const pkv_block_id *ids, uint32_t n) {
    if (!p || (n && !ids)) return PKV_ERR_INVALID_ARG;
    for (uint32_t i = 0; i < n; i++) {
        if ((uint32_t)ids[i] >= p->capacity) return PKV_ERR_NOT_FOUND;
        if (p->blk[ids[i]].ref > INT32_MAX - (int32_t)(n > INT32_MAX ? INT32_MAX : n))
            return PKV_ERR_LIMIT; // could wrap if listed n times
    }
    for (uint32_t i = 0; i < n; i++) {
        int32_t b = ids[i];
        if (b == PKV_NULL_BLOCK) continue;
        if (p->blk[b].ref == 0) unlink_block(p, b); // a hit on a queued block
        p->blk[b].ref++;
    }
    return PKV_OK;
}

// --- caching and lookup ---

static int valid_hash(const pkv_block_hash *h) { return h->len >= 1 && h->len <= PKV_BLOCK_HASH_MAX; }

pkv_status pkv_prefix_pool_cache_blocks(pkv_prefix_pool *p, const pkv_block_store *st) {
    if (!p || !st) return PKV_ERR_INVALID_ARG;
    if (!p->caching) return PKV_ERR_UNSUPPORTED;
    if (st->group >= p->num_groups || (st->n && (!st->blocks || !st->hashes)) ||
        (st->parent && !valid_hash(st->parent)) || st->lora_id < PKV_NO_LORA)
        return PKV_ERR_INVALID_ARG;
    const int events = pkvi_events_on(&p->events);
    if (events && st->n && st->tokens &&
        (st->block_size == 0 || (uint64_t)st->n * st->block_size > UINT32_MAX))
        return PKV_ERR_INVALID_ARG;
    pblock *blk = p->blk;
    // Check everything first: live, uncached, listed once, hash well formed.
    pkv_status bad = PKV_OK;
    uint32_t i = 0;
    for (; i < st->n; i++) {
        int32_t b = st->blocks[i];
        if ((uint32_t)b >= p->capacity || !valid_hash(&st->hashes[i])) { bad = PKV_ERR_INVALID_ARG; break; }
        if (b == PKV_NULL_BLOCK) continue;
        if (blk[b].ref <= 0 || blk[b].cached || blk[b].mark >= 0) { bad = PKV_ERR_INVALID_ARG; break; }
        blk[b].mark = 0;
    }
    for (uint32_t j = 0; j < i; j++)
        if (st->blocks[j] != PKV_NULL_BLOCK) blk[st->blocks[j]].mark = -1;
    if (bad != PKV_OK) return bad;

    const pkv_block_hash *prev = st->parent;
    pkv_block_hash stored_small[64];
    pkv_block_hash *stored = stored_small; // the event's hashes: the non-null blocks'
    if (events && st->n > 64 && !(stored = malloc((size_t)st->n * sizeof *stored)))
        return PKV_ERR_OUT_OF_MEMORY;
    uint32_t nstored = 0;
    for (i = 0; i < st->n; i++) {
        int32_t b = st->blocks[i];
        const pkv_block_hash *h = &st->hashes[i];
        if (b != PKV_NULL_BLOCK) {
            p->hash[b] = *h;
            if (prev) p->parent[b] = *prev;
            else memset(&p->parent[b], 0, sizeof p->parent[b]);
            blk[b].group = st->group;
            blk[b].key64 = first8(h);
            cache_insert(p, b);
            if (events) stored[nstored++] = *h;
        }
        prev = h;
    }
    if (events && st->n) {
        pkv_kv_event e;
        memset(&e, 0, sizeof e);
        e.kind = PKV_EVENT_BLOCK_STORED;
        e.group = st->group;
        e.medium = p->medium;
        e.has_parent = st->parent != NULL;
        if (st->parent) e.parent = *st->parent;
        e.block_size = st->block_size;
        e.lora_id = st->lora_id;
        // No tokens: the event goes without its token ids (the cheaper mode).
        pkvi_events_emit(&p->events, &e, stored, nstored, st->tokens,
                         st->tokens ? st->n * st->block_size : 0);
    }
    if (stored != stored_small) free(stored);
    return PKV_OK;
}

pkv_status pkv_prefix_pool_get_cached_block(const pkv_prefix_pool *p, uint32_t group,
                                            const pkv_block_hash *h, pkv_block_id *id) {
    if (!p || !h || !id || group >= p->num_groups || !valid_hash(h)) return PKV_ERR_INVALID_ARG;
    int64_t slot = table_find(p, group, h, first8(h));
    if (slot < 0) return PKV_ERR_NOT_FOUND;
    *id = p->table[slot];
    return PKV_OK;
}

pkv_status pkv_prefix_pool_find_prefix(const pkv_prefix_pool *p, uint32_t group,
                                       const pkv_block_hash *hashes, uint32_t n, pkv_block_id *ids,
                                       uint32_t *hits) {
    if (!p || !hits || (n && (!hashes || !ids)) || group >= p->num_groups)
        return PKV_ERR_INVALID_ARG;
    uint32_t k = 0;
    for (; k < n; k++) {
        if (!valid_hash(&hashes[k])) return PKV_ERR_INVALID_ARG;
        int64_t slot = table_find(p, group, &hashes[k], first8(&hashes[k]));
        if (slot < 0) break;
        ids[k] = p->table[slot];
    }
    *hits = k;
    return PKV_OK;
}

pkv_status pkv_prefix_pool_evict_block(pkv_prefix_pool *p, pkv_block_id id) {
    if (!p) return PKV_ERR_INVALID_ARG;
    if ((uint32_t)id >= p->capacity) return PKV_ERR_NOT_FOUND;
    if (p->blk[id].cached) uncache(p, id);
    return PKV_OK;
}

pkv_status pkv_prefix_pool_reset(pkv_prefix_pool *p) {
    if (!p) return PKV_ERR_INVALID_ARG;
    if (p->num_free != p->capacity - 1) return PKV_ERR_BUSY; // only the null block is in use
    for (uint32_t b = 0; b < p->capacity; b++) {
        if (!p->blk[b].cached) continue;
        p->blk[b].cached = 0;
        p->blk[b].dup_prev = p->blk[b].dup_next = -1;
        p->hash[b].len = p->parent[b].len = 0;
        p->stats.evictions++;
    }
    p->num_cached = 0;
    memset(p->table, 0xff, ((size_t)p->table_mask + 1) * sizeof *p->table);
    pkvi_events_cleared(&p->events, p->medium);
    return PKV_OK;
}

// --- reading ---

pkv_status pkv_prefix_pool_block_info(const pkv_prefix_pool *p, pkv_block_id id,
                                      pkv_block_info *info) {
    if (!p || !info) return PKV_ERR_INVALID_ARG;
    if ((uint32_t)id >= p->capacity) return PKV_ERR_NOT_FOUND;
    memset(info, 0, sizeof *info);
    info->refcount = id == PKV_NULL_BLOCK ? 0 : p->blk[id].ref;
    info->cached = (int)p->blk[id].cached;
    if (info->cached) {
        info->group = p->blk[id].group;
        info->hash = p->hash[id];
        info->parent = p->parent[id];
    }
    return PKV_OK;
}

uint32_t pkv_prefix_pool_num_free(const pkv_prefix_pool *p) { return p ? p->num_free : 0; }
uint32_t pkv_prefix_pool_capacity(const pkv_prefix_pool *p) { return p ? p->capacity : 0; }

int32_t pkv_prefix_pool_refcount(const pkv_prefix_pool *p, pkv_block_id id) {
    if (!p || (uint32_t)id >= p->capacity) return -1;
    return id == PKV_NULL_BLOCK ? 0 : p->blk[id].ref;
}

pkv_status pkv_prefix_pool_free_queue(const pkv_prefix_pool *p, pkv_block_id *ids, uint32_t cap,
                                      uint32_t *n) {
    if (!p || !n || (cap && !ids)) return PKV_ERR_INVALID_ARG;
    *n = p->num_free;
    uint32_t i = 0;
    for (int32_t b = p->blk[sentinel(p)].next; b != sentinel(p) && i < cap; b = p->blk[b].next)
        ids[i++] = b;
    return cap < p->num_free ? PKV_ERR_BUFFER_TOO_SMALL : PKV_OK;
}

pkv_status pkv_prefix_pool_record(pkv_prefix_pool *p, uint64_t query_tokens, uint64_t hit_tokens,
                                  int preempted) {
    if (!p || hit_tokens > query_tokens) return PKV_ERR_INVALID_ARG;
    pkv_prefix_pool_stats *s = &p->stats;
    if (preempted) {
        s->preempted_requests++;
        s->preempted_queries += query_tokens;
        s->preempted_hits += hit_tokens;
    } else {
        s->requests++;
        s->queries += query_tokens;
        s->hits += hit_tokens;
    }
    return PKV_OK;
}

pkv_status pkv_prefix_pool_get_stats(pkv_prefix_pool *p, pkv_prefix_pool_stats *out, int reset) {
    if (!p || !out) return PKV_ERR_INVALID_ARG;
    *out = p->stats;
    out->capacity = p->capacity;
    out->free_blocks = p->num_free;
    out->cached_blocks = p->num_cached;
    out->events_dropped = p->events.dropped_total;
    if (reset) {
        p->stats.requests = p->stats.queries = p->stats.hits = 0;
        p->stats.preempted_requests = p->stats.preempted_queries = p->stats.preempted_hits = 0;
    }
    return PKV_OK;
}

pkv_status pkv_prefix_pool_take_events(pkv_prefix_pool *p, const pkv_kv_event **events, uint32_t *n) {
    if (!p || !events || !n) return PKV_ERR_INVALID_ARG;
    pkvi_events_take(&p->events, events, n);
    return PKV_OK;
}

pkv_status pkv_prefix_pool_validate(const pkv_prefix_pool *p) {
    if (!p) return PKV_ERR_INVALID_ARG;
    const pblock *blk = p->blk;
    const int32_t s = sentinel(p);
    // The queue: linked both ways, each member free and listed once.
    uint32_t len = 0;
    for (int32_t b = blk[s].next, prev = s; b != s; prev = b, b = blk[b].next) {
        if (b < 1 || b >= s || blk[b].prev != prev || blk[b].ref != 0 || ++len > p->capacity)
            return PKV_ERR_CORRUPT;
    }
    if (len != p->num_free || blk[PKV_NULL_BLOCK].prev != -1) return PKV_ERR_CORRUPT;
    uint32_t cached = 0, heads = 0;
    for (int32_t b = 1; b < s; b++) {
        if (blk[b].ref < 0 || (blk[b].ref == 0) != (blk[b].prev >= 0) || blk[b].mark != -1)
            return PKV_ERR_CORRUPT;
        if (!blk[b].cached) continue;
        cached++;
        int64_t slot = table_find(p, blk[b].group, &p->hash[b], blk[b].key64);
        if (slot < 0 || blk[b].key64 != first8(&p->hash[b])) return PKV_ERR_CORRUPT;
        // b must be on its key's list, which starts at the table's head.
        int32_t h = p->table[slot], x = h;
        int found = 0;
        do {
            found |= x == b;
            if (!blk[x].cached || blk[blk[x].dup_next].dup_prev != x) return PKV_ERR_CORRUPT;
            x = blk[x].dup_next;
        } while (x != h && x >= 0);
        if (!found || x != h) return PKV_ERR_CORRUPT;
    }
    for (uint32_t i = 0; i <= p->table_mask; i++) heads += p->table[i] >= 0;
    if (cached != p->num_cached || heads > cached) return PKV_ERR_CORRUPT;
    return PKV_OK;
}

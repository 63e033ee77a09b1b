// SPDX-License-Identifier: MIT
// One token group's prefix cache inside the hybrid KV manager (pkv/hybrid.h, "Prefix
// cache"): full blocks keyed by their chained block hash, each holding one pool
// reference, in an open-addressing table (linear probing, backward-shift deletion).
// The manager's files decide what to insert and what a hit is (hybrid_prefix.c);
// this file keeps the entries, their eviction order and their references.
//
// Eviction order: an entry whose block only the cache holds (refcount 1: "unused")
// and that no cached successor depends on is in a min-heap keyed by its last use,
// a tick of the manager's one clock taken when it was inserted, refreshed, or left
// unused by its last sequence (the set's unused hook, seqset_internal.h). In a
// chained cache (FULL, MLA, PAGED) block i is cached only after block i-1, and an
// entry with cached successors waits outside the heap until its last one goes,
// then enters under its own last use (leaf first: nothing cached is unreachable,
// and a hot shared prefix keeps its place). A windowed group's cache is unchained:
// every unused entry is in the heap, its old blocks (released first by the window
// rule) ahead of its recent ones.
//
// Invariants: every live entry is in the table once and holds one reference on its
// block; entry_of[block] names it; it is in the heap exactly when its block's
// refcount is 1 and it has no children; `unused` counts live entries at refcount 1.
#include <stdlib.h>
#include <string.h>

#include "hybrid_internal.h"
#include "seqset_internal.h"

typedef struct hentry {
    pkv_block_hash key;
    pkv_block_id block;    // -1 while the entry is free
    int32_t parent;        // chained caches: the entry of the previous block, or -1
    uint32_t children;     // entries whose parent is this one
    uint64_t last_use;     // heap key
    int32_t heap_pos;      // -1 when not in the heap
} hentry;

struct pkvi_hcache {
    pkv_pool *pool;        // borrowed: the group's pool
    uint64_t *clock;       // borrowed: the manager's tick, shared by its caches
    int chained;
    uint32_t max_entries, count, unused;
    hentry *e;             // [max_entries]
    int32_t *free_list;    // [max_entries]: stack of free entry indices
    uint32_t num_free;
    int32_t *table;        // [mask + 1]: entry index or -1
    uint32_t mask;
    int32_t *entry_of;     // [pool capacity]: entry caching that block, or -1
    int32_t *heap;         // [max_entries]: evictable entries, min last_use on top
    uint32_t heap_n;
    pkvi_hcache_stats stats;
    pkvi_event_buf *events; // borrowed: where evictions are reported (NULL: nowhere)
    uint32_t group;         // the group index events name
    pkv_medium medium;
};

pkv_status pkvi_hcache_create(pkv_pool *pool, uint32_t max_entries, int chained,
                              uint64_t *clock, pkvi_hcache **out) {
    const uint32_t capacity = pkv_pool_capacity(pool);
    if (max_entries > capacity) max_entries = capacity; // never more than the blocks
    if (max_entries == 0) return PKV_ERR_INVALID_ARG;
    pkvi_hcache *c = calloc(1, sizeof *c);
    if (!c) return PKV_ERR_OUT_OF_MEMORY;
    uint32_t size = 16;
    while (size < 2 * (uint64_t)max_entries) size *= 2; // load factor <= 1/2
    c->pool = pool;
    c->clock = clock;
    c->chained = chained;
    c->max_entries = max_entries;
    c->e = calloc(max_entries, sizeof *c->e);
    c->free_list = malloc((size_t)max_entries * sizeof *c->free_list);
    c->table = malloc((size_t)size * sizeof *c->table);
    c->entry_of = malloc((size_t)capacity * sizeof *c->entry_of);
    c->heap = malloc((size_t)max_entries * sizeof *c->heap);
    if (!c->e || !c->free_list || !c->table || !c->entry_of || !c->heap) {
        pkvi_hcache_destroy(c);
        return PKV_ERR_OUT_OF_MEMORY;
    }
    for (uint32_t i = 0; i < max_entries; i++) {
        c->e[i].block = -1;
        c->e[i].heap_pos = -1;
        c->free_list[i] = (int32_t)(max_entries - 1 - i);
    }
    c->num_free = max_entries;
    memset(c->table, 0xff, (size_t)size * sizeof *c->table);
    memset(c->entry_of, 0xff, (size_t)capacity * sizeof *c->entry_of);
    c->mask = size - 1;
    *out = c;
    return PKV_OK;
}

void pkvi_hcache_destroy(pkvi_hcache *c) {
    if (!c) return;
    for (uint32_t i = 0; c->e && i < c->max_entries; i++)
        if (c->e[i].block >= 0) pkv_pool_release(c->pool, c->e[i].block);
    free(c->e);
    free(c->free_list);
    free(c->table);
    free(c->entry_of);
    free(c->heap);
    free(c);
}

void pkvi_hcache_set_events(pkvi_hcache *c, pkvi_event_buf *events, uint32_t group,
                            pkv_medium medium) {
    c->events = events;
    c->group = group;
    c->medium = medium;
}

// ---- eviction heap ----

static uint64_t key_at(const pkvi_hcache *c, uint32_t i) { return c->e[c->heap[i]].last_use; }

static void put(pkvi_hcache *c, uint32_t i, int32_t x) {
    c->heap[i] = x;
    c->e[x].heap_pos = (int32_t)i;
}

// Move the entry at heap position i up or down to where its key belongs.
static void sift(pkvi_hcache *c, uint32_t i) {
    const int32_t x = c->heap[i];
    const uint64_t k = c->e[x].last_use;
    while (i > 0 && k < key_at(c, (i - 1) / 2)) {
        put(c, i, c->heap[(i - 1) / 2]);
        i = (i - 1) / 2;
    }
    for (;;) {
        const uint32_t l = 2 * i + 1;
        if (l >= c->heap_n) break;
        const uint32_t m = l + 1 < c->heap_n && key_at(c, l + 1) < key_at(c, l) ? l + 1 : l;
        if (key_at(c, m) >= k) break;
        put(c, i, c->heap[m]);
        i = m;
    }
    put(c, i, x);
}

static void heap_add(pkvi_hcache *c, int32_t x) {
    if (c->e[x].heap_pos >= 0) return;
    put(c, c->heap_n++, x);
    sift(c, c->heap_n - 1);
}

static void heap_del(pkvi_hcache *c, int32_t x) {
    const int32_t pos = c->e[x].heap_pos;
    if (pos < 0) return;
    c->e[x].heap_pos = -1;
    const int32_t last = c->heap[--c->heap_n];
    if (last == x) return;
    put(c, (uint32_t)pos, last);
    sift(c, (uint32_t)pos);
}

static int is_unused(const pkvi_hcache *c, int32_t x) {
    return pkv_pool_refcount(c->pool, c->e[x].block) == 1;
}

// A use of entry x now (insert, refresh, left unused): its key becomes the newest.
static void touch(pkvi_hcache *c, int32_t x) {
    c->e[x].last_use = ++*c->clock;
    if (c->e[x].heap_pos >= 0) sift(c, (uint32_t)c->e[x].heap_pos);
}

void pkvi_hcache_block_unused(void *ctx, pkv_block_id block) {
    pkvi_hcache *c = ctx;
    if ((uint32_t)block >= pkv_pool_capacity(c->pool) || c->entry_of[block] < 0) return;
    const int32_t x = c->entry_of[block];
    c->unused++;
    touch(c, x);
    if (c->e[x].children == 0) heap_add(c, x);
}

// ---- table ----

static uint32_t home(const pkvi_hcache *c, const pkv_block_hash *k) {
    uint64_t v = 0;
    memcpy(&v, k->bytes, sizeof v); // a hash's bytes are uniform already
    return (uint32_t)(v ^ (v >> 32)) & c->mask;
}

static int same_key(const pkv_block_hash *a, const pkv_block_hash *b) {
    return a->len == b->len && memcmp(a->bytes, b->bytes, a->len) == 0;
}

int32_t pkvi_hcache_find(const pkvi_hcache *c, const pkv_block_hash *key) {
    for (uint32_t i = home(c, key);; i = (i + 1) & c->mask) {
        const int32_t x = c->table[i];
        if (x < 0 || same_key(&c->e[x].key, key)) return x;
    }
}

static void table_del(pkvi_hcache *c, int32_t x) {
    uint32_t i = home(c, &c->e[x].key);
    while (c->table[i] != x) i = (i + 1) & c->mask;
    for (uint32_t j = (i + 1) & c->mask; c->table[j] >= 0; j = (j + 1) & c->mask) {
        const uint32_t k = home(c, &c->e[c->table[j]].key);
        // The entry at j may fill the hole at i unless its home is cyclically in (i, j].
        if (i <= j ? (i < k && k <= j) : (i < k || k <= j)) continue;
        c->table[i] = c->table[j];
        i = j;
    }
    c->table[i] = -1;
}

// ---- entries ----

// Drop entry x and the cache's reference on its block (a BlockRemoved): the block
// is free again when the cache alone held it, else its other holders keep it.
static void remove_entry(pkvi_hcache *c, int32_t x) {
    hentry *en = &c->e[x];
    if (c->events) pkvi_events_removed(c->events, c->group, c->medium, &en->key);
    heap_del(c, x);
    table_del(c, x);
    c->entry_of[en->block] = -1;
    pkv_pool_release(c->pool, en->block);
    en->block = -1;
    c->free_list[c->num_free++] = x;
    c->count--;
    c->stats.evictions++;
    const int32_t p = en->parent;
    if (p >= 0 && --c->e[p].children == 0 && is_unused(c, p)) heap_add(c, p); // a leaf now
}

static void evict(pkvi_hcache *c, int32_t x) {
    c->unused--; // refcount 1: counted unused until now
    remove_entry(c, x);
}

void pkvi_hcache_give_up(pkvi_hcache *c, int32_t entry) {
    remove_entry(c, entry); // held: not counted unused; the holder's reference stays
}

int pkvi_hcache_evict_oldest(pkvi_hcache *c, int32_t keep, pkv_block_hash *evicted) {
    if (c->heap_n == 0) return 0;
    int32_t x = c->heap[0];
    if (x == keep) { // the next oldest is one of the top's children
        if (c->heap_n == 1) return 0;
        x = c->heap_n > 2 && key_at(c, 2) < key_at(c, 1) ? c->heap[2] : c->heap[1];
    }
    if (evicted) *evicted = c->e[x].key;
    evict(c, x);
    return 1;
}

void pkvi_hcache_demote(pkvi_hcache *c, const pkv_block_hash *key) {
    const int32_t x = pkvi_hcache_find(c, key);
    if (x < 0 || c->e[x].heap_pos < 0) return; // not cached, or in use: nothing to do
    c->e[x].last_use = 0;
    sift(c, (uint32_t)c->e[x].heap_pos);
}

uint64_t pkvi_hcache_oldest(const pkvi_hcache *c) {
    return c->heap_n ? key_at(c, 0) : UINT64_MAX;
}

pkv_status pkvi_hcache_insert(pkvi_hcache *c, const pkv_block_hash *key, pkv_block_id block,
                              int32_t parent, int32_t *entry) {
    *entry = pkvi_hcache_find(c, key);
    if (*entry >= 0) { // cached already (maybe another block of the same prefix)
        touch(c, *entry);
        return PKV_OK;
    }
    if (block < 0 || c->entry_of[block] >= 0) return PKV_OK; // released, or caches another key
    if (pkv_pool_refcount(c->pool, block) == INT32_MAX) return PKV_ERR_LIMIT;
    if (c->num_free == 0 && !pkvi_hcache_evict_oldest(c, parent, NULL)) return PKV_OK; // full
    const int32_t x = c->free_list[--c->num_free];
    hentry *en = &c->e[x];
    en->key = *key;
    en->block = block;
    en->parent = c->chained ? parent : -1;
    en->children = 0;
    en->heap_pos = -1;
    en->last_use = ++*c->clock;
    if (en->parent >= 0 && c->e[en->parent].children++ == 0) heap_del(c, en->parent);
    pkv_pool_retain(c->pool, block); // live: the sequence holds it
    c->entry_of[block] = x;
    uint32_t i = home(c, key);
    while (c->table[i] >= 0) i = (i + 1) & c->mask;
    c->table[i] = x;
    c->count++;
    c->stats.inserts++;
    *entry = x;
    return PKV_OK;
}

pkv_block_id pkvi_hcache_block(const pkvi_hcache *c, int32_t entry) { return c->e[entry].block; }

int pkvi_hcache_is_evictable(const pkvi_hcache *c, int32_t entry) { return is_unused(c, entry); }

pkv_status pkvi_hcache_hold(pkvi_hcache *c, int32_t entry) {
    const pkv_block_id b = c->e[entry].block;
    const int was_unused = is_unused(c, entry);
    pkv_status st = pkv_pool_retain(c->pool, b);
    if (st == PKV_OK && was_unused) { // not evictable while held
        c->unused--;
        heap_del(c, entry);
    }
    return st;
}

void pkvi_hcache_count_hit(pkvi_hcache *c, uint32_t tokens) {
    c->stats.hit_blocks++;
    c->stats.hit_tokens += tokens;
}

pkv_status pkvi_hcache_adopt(pkvi_hcache *c, int32_t entry, pkv_seqset *set, pkv_seq_id id) {
    const pkv_block_id b = c->e[entry].block;
    pkv_status st = pkvi_hcache_hold(c, entry); // the hold becomes the table's reference
    if (st != PKV_OK) return st;
    pkv_pool_release(c->pool, b);
    st = pkvi_seq_adopt_block(set, id, b);
    if (st != PKV_OK && is_unused(c, entry)) pkvi_hcache_block_unused(c, b); // undone
    if (st == PKV_OK) pkvi_hcache_count_hit(c, pkv_seqset_block_size(set));
    return st;
}

void pkvi_hcache_get_stats(const pkvi_hcache *c, pkvi_hcache_stats *s) {
    *s = c->stats;
    s->entries = c->count;
    s->evictable = c->unused;
}

void pkvi_hcache_count_refs(const pkvi_hcache *c, uint32_t *refs) {
    for (uint32_t i = 0; i < c->max_entries; i++)
        if (c->e[i].block >= 0) refs[c->e[i].block]++;
}

pkv_status pkvi_hcache_validate(const pkvi_hcache *c) {
    if (c->count + c->num_free != c->max_entries || c->heap_n > c->count) return PKV_ERR_CORRUPT;
    uint32_t *kids = calloc(c->max_entries, sizeof *kids);
    if (!kids) return PKV_ERR_OUT_OF_MEMORY;
    uint32_t live = 0, unused = 0, in_heap = 0, in_table = 0;
    pkv_status st = PKV_OK;
    for (uint32_t i = 0; i <= c->mask; i++) in_table += c->table[i] >= 0;
    for (uint32_t i = 0; i < c->max_entries && st == PKV_OK; i++) {
        const hentry *en = &c->e[i];
        in_heap += en->heap_pos >= 0;
        if (en->block < 0) {
            if (en->heap_pos >= 0) st = PKV_ERR_CORRUPT;
            continue;
        }
        live++;
        const int32_t rc = pkv_pool_refcount(c->pool, en->block);
        unused += rc == 1;
        if (rc < 1 || c->entry_of[en->block] != (int32_t)i ||
            pkvi_hcache_find(c, &en->key) != (int32_t)i)
            st = PKV_ERR_CORRUPT;
        if (en->parent >= 0) {
            if (!c->chained || (uint32_t)en->parent >= c->max_entries ||
                c->e[en->parent].block < 0)
                st = PKV_ERR_CORRUPT;
            else kids[en->parent]++;
        }
    }
    for (uint32_t i = 0; i < c->max_entries && st == PKV_OK; i++) {
        const hentry *en = &c->e[i];
        if (en->block < 0) continue;
        const int leaf_unused = kids[i] == 0 && is_unused(c, (int32_t)i);
        if (kids[i] != en->children || (en->heap_pos >= 0) != leaf_unused) st = PKV_ERR_CORRUPT;
    }
    for (uint32_t i = 0; i < c->heap_n && st == PKV_OK; i++) {
        const int32_t x = c->heap[i];
        if (x < 0 || (uint32_t)x >= c->max_entries || c->e[x].heap_pos != (int32_t)i ||
            (i > 0 && key_at(c, i) < key_at(c, (i - 1) / 2)))
            st = PKV_ERR_CORRUPT;
    }
    if (st == PKV_OK && (live != c->count || in_table != c->count || unused != c->unused ||
                         in_heap != c->heap_n))
        st = PKV_ERR_CORRUPT;
    free(kids);
    return st;
}

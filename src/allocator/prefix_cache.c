// SPDX-License-Identifier: MIT
// Prefix cache: full KV blocks keyed by a hash chained over the prefix, kept in an
// open-addressing table (linear probing, backward-shift deletion).
//
// Eviction is O(log n): an entry whose block only the cache holds ("unused": pool
// refcount 1) and that has no cached children sits in the eviction heap, keyed by
// its last use (a tick taken when it was inserted, refreshed, or left unused by
// its last sequence). The sequence sets attached to the cache report the moment
// a cached block's refcount drops to 1, through a hook the cache registers on
// each set (the set knows no cache); a hit takes the entry out of the heap again.
// Entries with cached children wait outside the heap until their last child is
// evicted, then go in under their own last use, so chains go leaf first, a
// cached block is always reachable from its root, and a hot parent is not
// evicted ahead of colder leaves (it keeps its place in the LRU order).
//
// Invariants: every live entry is in the table once and holds one pool reference
// on its block; entry_of[block] names it; it is in the heap exactly when its
// block's refcount is 1 and it has no children, and the heap is ordered by
// last_use; `unused` counts the live entries whose refcount is 1.
#include <stdlib.h>
#include <string.h>

#include "pkv/prefix.h"
#include "seqset_internal.h"

typedef struct entry {
    uint64_t key;            // chain hash of the prefix up to and including this block
    pkv_block_id block;      // -1 while the entry is not in use
    pkv_block_id parent;     // block of the previous entry in the chain, -1 for the first
    int32_t parent_entry;    // that entry's index, -1 for the first
    uint32_t children;       // entries whose parent_entry is this one
    uint64_t last_use;       // LRU key: tick of the last insert, refresh or release
    int32_t heap_pos;        // index in the eviction heap, -1 when not in it
} entry;

struct pkv_prefix_cache {
    pkv_pool *pool;          // borrowed
    uint32_t block_size;
    uint32_t max_entries;
    uint32_t count;          // live entries
    uint32_t unused;         // live entries whose block only the cache holds
    entry *entries;          // [max_entries]
    int32_t *tokens;         // [max_entries][block_size]: each entry's token ids
    int32_t *free_entries;   // [max_entries]; stack of unused entry indices
    uint32_t num_free;
    int32_t *table;          // [table_mask + 1]; entry index or -1
    uint32_t table_mask;
    int32_t *entry_of;       // [pool capacity]; entry caching that block, or -1
    int32_t *heap;           // [max_entries]; eviction min-heap of entry indices by last_use
    uint32_t heap_n;
    uint64_t tick;           // LRU clock
    pkv_prefix_stats stats;
};

// splitmix64's finalizer: spreads every input bit over the output.
static uint64_t mix64(uint64_t x) {
    x ^= x >> 30;
    x *= 0xbf58476d1ce4e5b9ull;
    x ^= x >> 27;
    x *= 0x94d049bb133111ebull;
    return x ^ (x >> 31);
}

static uint64_t block_key(uint64_t parent_key, const int32_t *tokens, uint32_t bs) {
    uint64_t h = mix64(parent_key + 0x9e3779b97f4a7c15ull);
    for (uint32_t i = 0; i < bs; i++) h = (h ^ (uint32_t)tokens[i]) * 0x100000001b3ull;
    return mix64(h);
}

#define ROOT_KEY 0x70726566697863ull // any fixed value: the key "before" block 0

pkv_status pkv_prefix_cache_create(pkv_pool *pool, uint32_t block_size, uint32_t max_entries,
                                   pkv_prefix_cache **out) {
    if (!out) return PKV_ERR_INVALID_ARG;
    *out = NULL;
    if (!pool || block_size == 0 || block_size > 65536 || max_entries == 0 ||
        max_entries > (1u << 28))
        return PKV_ERR_INVALID_ARG;
    pkv_prefix_cache *c = calloc(1, sizeof *c);
    if (!c) return PKV_ERR_OUT_OF_MEMORY;
    uint32_t table_size = 16;
    while (table_size < 2 * max_entries) table_size *= 2; // load factor <= 1/2
    const uint32_t capacity = pkv_pool_capacity(pool);
    c->pool = pool;
    c->block_size = block_size;
    c->max_entries = max_entries;
    c->entries = calloc(max_entries, sizeof *c->entries);
    c->tokens = malloc((size_t)max_entries * block_size * sizeof *c->tokens);
    c->free_entries = malloc(max_entries * sizeof *c->free_entries);
    c->table = malloc(table_size * sizeof *c->table);
    c->entry_of = malloc((size_t)capacity * sizeof *c->entry_of);
    c->heap = malloc(max_entries * sizeof *c->heap);
    if (!c->entries || !c->tokens || !c->free_entries || !c->table || !c->entry_of || !c->heap) {
        pkv_prefix_cache_destroy(c);
        return PKV_ERR_OUT_OF_MEMORY;
    }
    for (uint32_t i = 0; i < max_entries; i++) {
        c->free_entries[i] = (int32_t)(max_entries - 1 - i);
        c->entries[i].block = -1;
        c->entries[i].heap_pos = -1;
    }
    c->num_free = max_entries;
    memset(c->table, 0xff, table_size * sizeof *c->table); // all -1
    memset(c->entry_of, 0xff, (size_t)capacity * sizeof *c->entry_of);
    c->table_mask = table_size - 1;
    *out = c;
    return PKV_OK;
}

void pkv_prefix_cache_destroy(pkv_prefix_cache *c) {
    if (!c) return;
    if (c->entries)
        for (uint32_t e = 0; e < c->max_entries; e++)
            if (c->entries[e].block >= 0) pkv_pool_release(c->pool, c->entries[e].block);
    free(c->entries);
    free(c->tokens);
    free(c->free_entries);
    free(c->table);
    free(c->entry_of);
    free(c->heap);
    free(c);
}

static const int32_t *entry_tokens(const pkv_prefix_cache *c, int32_t e) {
    return c->tokens + (size_t)e * c->block_size;
}

// --- eviction heap (min-heap on last_use) ---

static int heap_less(const pkv_prefix_cache *c, uint32_t i, uint32_t j) {
    return c->entries[c->heap[i]].last_use < c->entries[c->heap[j]].last_use;
}

static void heap_swap(pkv_prefix_cache *c, uint32_t i, uint32_t j) {
    int32_t t = c->heap[i];
    c->heap[i] = c->heap[j];
    c->heap[j] = t;
    c->entries[c->heap[i]].heap_pos = (int32_t)i;
    c->entries[c->heap[j]].heap_pos = (int32_t)j;
}

// Restore the heap order around position i (its key moved either way).
static void heap_fix(pkv_prefix_cache *c, uint32_t i) {
    while (i > 0 && heap_less(c, i, (i - 1) / 2)) {
        heap_swap(c, i, (i - 1) / 2);
        i = (i - 1) / 2;
    }
    for (;;) {
        uint32_t l = 2 * i + 1, r = l + 1, m = i;
        if (l < c->heap_n && heap_less(c, l, m)) m = l;
        if (r < c->heap_n && heap_less(c, r, m)) m = r;
        if (m == i) return;
        heap_swap(c, i, m);
        i = m;
    }
}

static void heap_push(pkv_prefix_cache *c, int32_t e) {
    if (c->entries[e].heap_pos >= 0) return;
    c->heap[c->heap_n] = e;
    c->entries[e].heap_pos = (int32_t)c->heap_n++;
    heap_fix(c, c->heap_n - 1);
}

static void heap_remove(pkv_prefix_cache *c, int32_t e) {
    int32_t pos = c->entries[e].heap_pos;
    if (pos < 0) return;
    c->heap_n--;
    if ((uint32_t)pos != c->heap_n) {
        heap_swap(c, (uint32_t)pos, c->heap_n);
        c->entries[e].heap_pos = -1;
        heap_fix(c, (uint32_t)pos);
    }
    c->entries[e].heap_pos = -1;
}

// A use of entry e now: its LRU key moves to the newest.
static void touch(pkv_prefix_cache *c, int32_t e) {
    c->entries[e].last_use = ++c->tick;
    if (c->entries[e].heap_pos >= 0) heap_fix(c, (uint32_t)c->entries[e].heap_pos);
}

static int is_unused(const pkv_prefix_cache *c, int32_t e) {
    return pkv_pool_refcount(c->pool, c->entries[e].block) == 1;
}

// The hook registered on attached sets: `block`'s refcount just dropped to 1. If
// the cache holds it, only the cache does now: the entry becomes evictable (once a
// leaf). Blocks the cache does not hold are ignored.
static void block_unused(void *ctx, pkv_block_id block) {
    pkv_prefix_cache *c = ctx;
    if ((uint32_t)block >= pkv_pool_capacity(c->pool)) return;
    int32_t e = c->entry_of[block];
    if (e < 0) return;
    c->unused++;
    touch(c, e); // released now: its last use
    if (c->entries[e].children == 0) heap_push(c, e);
}

// --- hash table ---

static uint32_t home_slot(const pkv_prefix_cache *c, uint64_t key) {
    return (uint32_t)key & c->table_mask;
}

static int32_t table_find(const pkv_prefix_cache *c, uint64_t key, pkv_block_id parent,
                          const int32_t *tokens) {
    for (uint32_t i = home_slot(c, key);; i = (i + 1) & c->table_mask) {
        int32_t e = c->table[i];
        if (e < 0) return -1;
        const entry *x = &c->entries[e];
        // Key, parent and the tokens themselves: a hash collision can never match.
        if (x->key == key && x->parent == parent &&
            memcmp(entry_tokens(c, e), tokens, c->block_size * sizeof *tokens) == 0)
            return e;
    }
}

static void table_insert(pkv_prefix_cache *c, int32_t e) {
    uint32_t i = home_slot(c, c->entries[e].key);
    while (c->table[i] >= 0) i = (i + 1) & c->table_mask;
    c->table[i] = e;
}

// Backward-shift deletion keeps every remaining entry reachable from its home slot.
static void table_remove(pkv_prefix_cache *c, int32_t e) {
    uint32_t i = home_slot(c, c->entries[e].key);
    while (c->table[i] != e) i = (i + 1) & c->table_mask;
    for (uint32_t j = i;;) {
        j = (j + 1) & c->table_mask;
        if (c->table[j] < 0) break;
        uint32_t k = home_slot(c, c->entries[c->table[j]].key);
        // Entry at j may move to the hole at i unless its home lies cyclically in (i, j].
        int stays = i <= j ? (i < k && k <= j) : (i < k || k <= j);
        if (stays) continue;
        c->table[i] = c->table[j];
        i = j;
    }
    c->table[i] = -1;
}

// Evict the least recently used evictable entry, other than `keep` (the parent an
// insert is about to chain to). 0 if there is none.
static int evict_one(pkv_prefix_cache *c, int32_t keep) {
    if (c->heap_n == 0) return 0;
    int32_t e = c->heap[0];
    if (e == keep) {
        // The next oldest is one of the root's children.
        if (c->heap_n == 1) return 0;
        e = c->heap[1];
        if (c->heap_n > 2 && heap_less(c, 2, 1)) e = c->heap[2];
    }
    entry *x = &c->entries[e];
    heap_remove(c, e);
    table_remove(c, e);
    c->entry_of[x->block] = -1;
    pkv_pool_release(c->pool, x->block);
    x->block = -1;
    c->free_entries[c->num_free++] = e;
    c->count--;
    c->unused--;
    c->stats.evictions++;
    // The parent may now be an evictable leaf: it joins the heap under its own
    // last use, which may be much newer than this block's (a shared system prompt).
    int32_t pe = x->parent_entry;
    if (pe >= 0 && --c->entries[pe].children == 0 && is_unused(c, pe)) heap_push(c, pe);
    return 1;
}

static pkv_status check_set(const pkv_prefix_cache *c, const pkv_seqset *set) {
    if (!c || !set || pkv_seqset_pool(set) != c->pool ||
        pkv_seqset_block_size(set) != c->block_size || pkvi_seqset_hook_ctx(set) != c)
        return PKV_ERR_INVALID_ARG;
    return PKV_OK;
}

pkv_status pkv_prefix_cache_attach(pkv_prefix_cache *c, pkv_seqset *set) {
    if (!c || !set || pkv_seqset_pool(set) != c->pool ||
        pkv_seqset_block_size(set) != c->block_size)
        return PKV_ERR_INVALID_ARG;
    void *owner = pkvi_seqset_hook_ctx(set);
    if (owner == c) return PKV_OK;
    // Re-pointing the set would leave the first cache blind to blocks the set
    // releases later (they would never become evictable there).
    if (owner) return PKV_ERR_BUSY;
    pkvi_seqset_set_hook(set, block_unused, c);
    return PKV_OK;
}

static int cached_here(const void *ctx, pkv_block_id b) {
    const pkv_prefix_cache *c = ctx;
    return (uint32_t)b < pkv_pool_capacity(c->pool) && c->entry_of[b] >= 0;
}

pkv_status pkv_prefix_cache_detach(pkv_prefix_cache *c, pkv_seqset *set) {
    if (!c || !set) return PKV_ERR_INVALID_ARG;
    if (pkvi_seqset_hook_ctx(set) != c) return PKV_ERR_NOT_FOUND;
    // A cached block still held by the set would go unused unseen after detaching.
    if (pkvi_seqset_holds_any(set, cached_here, c)) return PKV_ERR_BUSY;
    pkvi_seqset_set_hook(set, NULL, NULL);
    return PKV_OK;
}

pkv_status pkv_prefix_cache_match(const pkv_prefix_cache *c, const int32_t *tokens, uint32_t n,
                                  pkv_prefix_match *match) {
    if (!c || !match || (n && !tokens)) return PKV_ERR_INVALID_ARG;
    const uint32_t bs = c->block_size;
    // The same walk as pkv_seq_create_cached, reading only.
    const uint32_t max_blocks = n ? (n - 1) / bs : 0;
    uint64_t key = ROOT_KEY;
    pkv_block_id parent = -1;
    uint32_t hits = 0, evictable = 0;
    for (uint32_t i = 0; i < max_blocks; i++) {
        const int32_t *t = tokens + (size_t)i * bs;
        key = block_key(key, t, bs);
        int32_t e = table_find(c, key, parent, t);
        if (e < 0) break;
        evictable += is_unused(c, e);
        parent = c->entries[e].block;
        hits++;
    }
    match->cached_tokens = hits * bs;
    match->cached_blocks = hits;
    match->new_blocks = (uint32_t)(((uint64_t)n + bs - 1) / bs) - hits;
    match->evictable_hit = evictable;
    return PKV_OK;
}

pkv_status pkv_seq_create_cached(pkv_seqset *set, pkv_prefix_cache *c, const int32_t *tokens,
                                 uint32_t n, pkv_seq_id *id, uint32_t *cached_tokens) {
    pkv_status st = check_set(c, set);
    if (st != PKV_OK) return st;
    if (!id || !cached_tokens || (n && !tokens)) return PKV_ERR_INVALID_ARG;
    st = pkv_seq_create(set, id);
    if (st != PKV_OK) return st;
    const uint32_t bs = c->block_size;
    // Whole blocks only, and never the last prompt token: its logits are needed.
    const uint32_t max_blocks = n ? (n - 1) / bs : 0;
    uint64_t key = ROOT_KEY;
    pkv_block_id parent = -1;
    uint32_t hits = 0;
    for (uint32_t i = 0; i < max_blocks; i++) {
        const int32_t *t = tokens + (size_t)i * bs;
        key = block_key(key, t, bs);
        c->stats.lookups++;
        int32_t e = table_find(c, key, parent, t);
        if (e < 0) break;
        const int was_unused = is_unused(c, e);
        st = pkvi_seq_adopt_block(set, *id, c->entries[e].block);
        if (st != PKV_OK) {
            pkv_seq_free(set, *id); // reports the adopted blocks unused again
            return st;
        }
        if (was_unused) {
            c->unused--;
            heap_remove(c, e);
        }
        c->stats.hits++;
        parent = c->entries[e].block;
        hits++;
    }
    *cached_tokens = hits * bs;
    return PKV_OK;
}

pkv_status pkv_prefix_cache_insert(pkv_prefix_cache *c, const pkv_seqset *set, pkv_seq_id id,
                                   const int32_t *tokens, uint32_t n, uint32_t *inserted) {
    pkv_status st = check_set(c, set);
    if (st != PKV_OK) return st;
    if (n && !tokens) return PKV_ERR_INVALID_ARG;
    uint32_t len, nb;
    const pkv_block_id *table;
    if ((st = pkv_seq_length(set, id, &len)) != PKV_OK) return st;
    if (n > len) return PKV_ERR_INVALID_ARG;
    pkv_seq_block_table(set, id, &table, &nb);
    const uint32_t bs = c->block_size, full = n / bs;
    uint64_t key = ROOT_KEY;
    pkv_block_id parent = -1;
    int32_t parent_entry = -1;
    uint32_t added = 0;
    for (uint32_t i = 0; i < full; i++) {
        const int32_t *t = tokens + (size_t)i * bs;
        key = block_key(key, t, bs);
        int32_t e = table_find(c, key, parent, t);
        if (e >= 0) {
            // Cached already (maybe in another block with the same content): later
            // blocks chain to the cached one, which is what lookups will find.
            touch(c, e); // recently used again
            parent = c->entries[e].block;
            parent_entry = e;
            continue;
        }
        if (table[i] == PKV_BLOCK_NONE) break; // released by a window rule, not cached
        if (c->entry_of[table[i]] >= 0) break; // this block caches another prefix
        if (pkv_pool_refcount(c->pool, table[i]) == INT32_MAX) {
            st = PKV_ERR_LIMIT; // its refcount cannot take the cache's reference
            break;
        }
        if (c->num_free == 0 && !evict_one(c, parent_entry)) break;
        e = c->free_entries[--c->num_free];
        entry *x = &c->entries[e];
        x->key = key;
        x->block = table[i];
        x->parent = parent;
        x->parent_entry = parent_entry;
        x->children = 0;
        x->heap_pos = -1;
        x->last_use = ++c->tick;
        if (parent_entry >= 0 && c->entries[parent_entry].children++ == 0)
            heap_remove(c, parent_entry); // no longer a leaf
        memcpy(c->tokens + (size_t)e * bs, t, bs * sizeof *t);
        pkv_pool_retain(c->pool, table[i]); // live: the sequence holds it
        c->entry_of[table[i]] = e;
        table_insert(c, e);
        c->count++;
        c->stats.inserts++;
        added++;
        parent = table[i];
        parent_entry = e;
    }
    if (inserted) *inserted = added;
    return st;
}

pkv_status pkv_prefix_cache_reclaim(pkv_prefix_cache *c, uint32_t need) {
    if (!c) return PKV_ERR_INVALID_ARG;
    while (pkv_pool_free_count(c->pool) < need)
        if (!evict_one(c, -1)) return PKV_ERR_OUT_OF_BLOCKS;
    return PKV_OK;
}

pkv_status pkv_prefix_cache_get_stats(const pkv_prefix_cache *c, pkv_prefix_stats *stats) {
    if (!c || !stats) return PKV_ERR_INVALID_ARG;
    *stats = c->stats;
    stats->entries = c->count;
    stats->evictable = c->unused;
    return PKV_OK;
}

pkv_status pkv_prefix_cache_validate(const pkv_prefix_cache *c) {
    if (!c) return PKV_ERR_INVALID_ARG;
    if (c->count + c->num_free != c->max_entries || c->heap_n > c->count) return PKV_ERR_CORRUPT;
    uint32_t *kids = calloc(c->max_entries, sizeof *kids);
    if (!kids) return PKV_ERR_OUT_OF_MEMORY;
    pkv_status st = PKV_OK;
    uint32_t live = 0, unused = 0, in_heap = 0, in_table = 0;
    for (uint32_t i = 0; i <= c->table_mask; i++) in_table += c->table[i] >= 0;
    for (int32_t e = 0; e < (int32_t)c->max_entries && st == PKV_OK; e++) {
        const entry *x = &c->entries[e];
        in_heap += x->heap_pos >= 0;
        if (x->block < 0) {
            if (x->heap_pos >= 0) st = PKV_ERR_CORRUPT;
            continue;
        }
        live++;
        int32_t rc = pkv_pool_refcount(c->pool, x->block);
        unused += rc == 1;
        if (rc < 1 || c->entry_of[x->block] != e ||
            table_find(c, x->key, x->parent, entry_tokens(c, e)) != e)
            st = PKV_ERR_CORRUPT;
        if (x->parent_entry >= 0) {
            const entry *p = &c->entries[x->parent_entry];
            if (p->block < 0 || p->block != x->parent) st = PKV_ERR_CORRUPT;
            kids[x->parent_entry]++;
        }
    }
    // The heap holds exactly the unused leaves, each once, in LRU order.
    for (uint32_t e = 0; e < c->max_entries && st == PKV_OK; e++) {
        const entry *x = &c->entries[e];
        if (x->block < 0) continue;
        int is_leaf_unused = kids[e] == 0 && pkv_pool_refcount(c->pool, x->block) == 1;
        if (kids[e] != x->children || (x->heap_pos >= 0) != is_leaf_unused) st = PKV_ERR_CORRUPT;
    }
    for (uint32_t i = 0; i < c->heap_n && st == PKV_OK; i++) {
        int32_t e = c->heap[i];
        if (e < 0 || (uint32_t)e >= c->max_entries || c->entries[e].heap_pos != (int32_t)i ||
            (i > 0 && heap_less(c, i, (i - 1) / 2)))
            st = PKV_ERR_CORRUPT;
    }
    if (st == PKV_OK && (live != c->count || in_table != c->count || unused != c->unused ||
                         in_heap != c->heap_n))
        st = PKV_ERR_CORRUPT;
    free(kids);
    return st;
}

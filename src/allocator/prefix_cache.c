// SPDX-License-Identifier: MIT
// Prefix cache: full KV blocks keyed by a hash chained over the prefix, kept in an
// open-addressing table (linear probing, backward-shift deletion) and an LRU list.
// Invariant: every entry is in the table once and in the LRU list once, and holds
// one pool reference on its block; unused entries sit on a free stack. An entry
// with cached children is never evicted, so chains are evicted leaf first and a
// cached block is always reachable from the root (no stranded tails, and a parent
// block id can never be reused while a child names it).
#include <stdlib.h>
#include <string.h>

#include "pkv/prefix.h"
#include "seqset_internal.h"

typedef struct entry {
    uint64_t key;            // chain hash of the prefix up to and including this block
    pkv_block_id block;
    pkv_block_id parent;     // block of the previous entry in the chain, -1 for the first
    int32_t parent_entry;    // that entry's index, -1 for the first
    uint32_t children;       // entries whose parent_entry is this one
    int32_t prev, next;      // LRU neighbours (entry indices, -1 = none); head = oldest
} entry;

struct pkv_prefix_cache {
    pkv_pool *pool;          // borrowed
    uint32_t block_size;
    uint32_t max_entries;
    uint32_t count;
    entry *entries;          // [max_entries]
    int32_t *tokens;         // [max_entries][block_size]: each entry's token ids
    int32_t *free_entries;   // [max_entries]; stack of unused entry indices
    uint32_t num_free;
    int32_t *table;          // [table_mask + 1]; entry index or -1
    uint32_t table_mask;
    int32_t lru_head, lru_tail;
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
    c->pool = pool;
    c->block_size = block_size;
    c->max_entries = max_entries;
    c->entries = calloc(max_entries, sizeof *c->entries);
    c->tokens = malloc((size_t)max_entries * block_size * sizeof *c->tokens);
    c->free_entries = malloc(max_entries * sizeof *c->free_entries);
    c->table = malloc(table_size * sizeof *c->table);
    if (!c->entries || !c->tokens || !c->free_entries || !c->table) {
        pkv_prefix_cache_destroy(c);
        return PKV_ERR_OUT_OF_MEMORY;
    }
    for (uint32_t i = 0; i < max_entries; i++) c->free_entries[i] = (int32_t)(max_entries - 1 - i);
    c->num_free = max_entries;
    memset(c->table, 0xff, table_size * sizeof *c->table); // all -1
    c->table_mask = table_size - 1;
    c->lru_head = c->lru_tail = -1;
    *out = c;
    return PKV_OK;
}

void pkv_prefix_cache_destroy(pkv_prefix_cache *c) {
    if (!c) return;
    if (c->entries)
        for (int32_t e = c->lru_head; e >= 0; e = c->entries[e].next)
            pkv_pool_release(c->pool, c->entries[e].block);
    free(c->entries);
    free(c->tokens);
    free(c->free_entries);
    free(c->table);
    free(c);
}

static const int32_t *entry_tokens(const pkv_prefix_cache *c, int32_t e) {
    return c->tokens + (size_t)e * c->block_size;
}

// --- LRU list ---

static void lru_unlink(pkv_prefix_cache *c, int32_t e) {
    entry *x = &c->entries[e];
    if (x->prev >= 0) c->entries[x->prev].next = x->next; else c->lru_head = x->next;
    if (x->next >= 0) c->entries[x->next].prev = x->prev; else c->lru_tail = x->prev;
    x->prev = x->next = -1;
}

static void lru_push_tail(pkv_prefix_cache *c, int32_t e) {
    entry *x = &c->entries[e];
    x->prev = c->lru_tail;
    x->next = -1;
    if (c->lru_tail >= 0) c->entries[c->lru_tail].next = e; else c->lru_head = e;
    c->lru_tail = e;
}

static void lru_touch(pkv_prefix_cache *c, int32_t e) {
    lru_unlink(c, e);
    lru_push_tail(c, e);
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

// Evict the least recently used leaf entry that only the cache holds, other than
// `keep` (the parent an insert is about to chain to). 0 if none.
static int evict_one(pkv_prefix_cache *c, int32_t keep) {
    for (int32_t e = c->lru_head; e >= 0; e = c->entries[e].next) {
        const entry *x = &c->entries[e];
        if (e == keep || x->children > 0 || pkv_pool_refcount(c->pool, x->block) != 1) continue;
        if (x->parent_entry >= 0) c->entries[x->parent_entry].children--;
        table_remove(c, e);
        lru_unlink(c, e);
        pkv_pool_release(c->pool, c->entries[e].block);
        c->free_entries[c->num_free++] = e;
        c->count--;
        c->stats.evictions++;
        return 1;
    }
    return 0;
}

static pkv_status check_set(const pkv_prefix_cache *c, const pkv_seqset *set) {
    if (!c || !set || pkv_seqset_pool(set) != c->pool || pkv_seqset_block_size(set) != c->block_size)
        return PKV_ERR_INVALID_ARG;
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
        st = pkvi_seq_adopt_block(set, *id, c->entries[e].block);
        if (st != PKV_OK) {
            pkv_seq_free(set, *id);
            return st;
        }
        c->stats.hits++;
        lru_touch(c, e);
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
            lru_touch(c, e);
            parent = c->entries[e].block;
            parent_entry = e;
            continue;
        }
        if (c->num_free == 0 && !evict_one(c, parent_entry)) break;
        e = c->free_entries[--c->num_free];
        entry *x = &c->entries[e];
        x->key = key;
        x->block = table[i];
        x->parent = parent;
        x->parent_entry = parent_entry;
        x->children = 0;
        if (parent_entry >= 0) c->entries[parent_entry].children++;
        memcpy(c->tokens + (size_t)e * bs, t, bs * sizeof *t);
        pkv_pool_retain(c->pool, table[i]); // live: the sequence holds it
        table_insert(c, e);
        lru_push_tail(c, e);
        c->count++;
        c->stats.inserts++;
        added++;
        parent = table[i];
        parent_entry = e;
    }
    if (inserted) *inserted = added;
    return PKV_OK;
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
    stats->evictable = 0;
    for (int32_t e = c->lru_head; e >= 0; e = c->entries[e].next)
        if (pkv_pool_refcount(c->pool, c->entries[e].block) == 1) stats->evictable++;
    return PKV_OK;
}

pkv_status pkv_prefix_cache_validate(const pkv_prefix_cache *c) {
    if (!c) return PKV_ERR_INVALID_ARG;
    if (c->count + c->num_free != c->max_entries) return PKV_ERR_CORRUPT;
    uint32_t in_list = 0;
    for (int32_t e = c->lru_head, prev = -1; e >= 0; prev = e, e = c->entries[e].next) {
        const entry *x = &c->entries[e];
        if (++in_list > c->count || x->prev != prev) return PKV_ERR_CORRUPT;
        if (pkv_pool_refcount(c->pool, x->block) < 1) return PKV_ERR_CORRUPT;
        if (table_find(c, x->key, x->parent, entry_tokens(c, e)) != e) return PKV_ERR_CORRUPT;
    }
    uint32_t in_table = 0;
    for (uint32_t i = 0; i <= c->table_mask; i++) in_table += c->table[i] >= 0;
    if (in_list != c->count || in_table != c->count) return PKV_ERR_CORRUPT;
    // Child counts: each entry's count equals the entries that name it as parent,
    // and a parent's block is the block its children chain to.
    for (int32_t e = c->lru_head; e >= 0; e = c->entries[e].next) {
        uint32_t kids = 0;
        for (int32_t k = c->lru_head; k >= 0; k = c->entries[k].next) {
            const entry *child = &c->entries[k];
            if (child->parent_entry != e) continue;
            if (child->parent != c->entries[e].block) return PKV_ERR_CORRUPT;
            kids++;
        }
        if (kids != c->entries[e].children) return PKV_ERR_CORRUPT;
    }
    return PKV_OK;
}

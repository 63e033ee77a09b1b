// SPDX-License-Identifier: MIT
// Prefix cache: full KV blocks keyed by a hash chained over the prefix, kept in an
// open-addressing table (linear probing, backward-shift deletion).
//
// Eviction is O(1): an entry whose block only the cache holds ("unused": pool
// refcount 1) and that has no cached children sits on the eviction list, oldest
// first. The sequence sets attached to the cache report the moment a cached
// block's refcount drops to 1 (pkvi_prefix_block_unused); a hit takes the entry
// off the list again. Entries with cached children wait off the list until their
// last child is evicted, so chains go leaf first and a cached block is always
// reachable from its root (no stranded tails, and a parent block id can never be
// reused while a child names it).
//
// Invariants: every live entry is in the table once and holds one pool reference
// on its block; entry_of[block] names it; it is on the eviction list exactly when
// its block's refcount is 1 and it has no children; `unused` counts the live
// entries whose refcount is 1.
#include <stdlib.h>
#include <string.h>

#include "pkv/prefix.h"
#include "prefix_internal.h"
#include "seqset_internal.h"

typedef struct entry {
    uint64_t key;            // chain hash of the prefix up to and including this block
    pkv_block_id block;      // -1 while the entry is not in use
    pkv_block_id parent;     // block of the previous entry in the chain, -1 for the first
    int32_t parent_entry;    // that entry's index, -1 for the first
    uint32_t children;       // entries whose parent_entry is this one
    int32_t prev, next;      // eviction-list neighbours (-1 = none)
    int on_list;
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
    int32_t ev_head, ev_tail; // eviction list, head = evicted first
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
    if (!c->entries || !c->tokens || !c->free_entries || !c->table || !c->entry_of) {
        pkv_prefix_cache_destroy(c);
        return PKV_ERR_OUT_OF_MEMORY;
    }
    for (uint32_t i = 0; i < max_entries; i++) {
        c->free_entries[i] = (int32_t)(max_entries - 1 - i);
        c->entries[i].block = -1;
    }
    c->num_free = max_entries;
    memset(c->table, 0xff, table_size * sizeof *c->table); // all -1
    memset(c->entry_of, 0xff, (size_t)capacity * sizeof *c->entry_of);
    c->table_mask = table_size - 1;
    c->ev_head = c->ev_tail = -1;
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
    free(c);
}

static const int32_t *entry_tokens(const pkv_prefix_cache *c, int32_t e) {
    return c->tokens + (size_t)e * c->block_size;
}

// --- eviction list ---

static void ev_unlink(pkv_prefix_cache *c, int32_t e) {
    entry *x = &c->entries[e];
    if (!x->on_list) return;
    if (x->prev >= 0) c->entries[x->prev].next = x->next; else c->ev_head = x->next;
    if (x->next >= 0) c->entries[x->next].prev = x->prev; else c->ev_tail = x->prev;
    x->prev = x->next = -1;
    x->on_list = 0;
}

static void ev_push(pkv_prefix_cache *c, int32_t e, int at_head) {
    entry *x = &c->entries[e];
    if (x->on_list) ev_unlink(c, e);
    x->on_list = 1;
    if (at_head) {
        x->prev = -1;
        x->next = c->ev_head;
        if (c->ev_head >= 0) c->entries[c->ev_head].prev = e; else c->ev_tail = e;
        c->ev_head = e;
    } else {
        x->next = -1;
        x->prev = c->ev_tail;
        if (c->ev_tail >= 0) c->entries[c->ev_tail].next = e; else c->ev_head = e;
        c->ev_tail = e;
    }
}

static int is_unused(const pkv_prefix_cache *c, int32_t e) {
    return pkv_pool_refcount(c->pool, c->entries[e].block) == 1;
}

void pkvi_prefix_block_unused(pkv_prefix_cache *c, pkv_block_id block) {
    if (!c || (uint32_t)block >= pkv_pool_capacity(c->pool)) return;
    int32_t e = c->entry_of[block];
    if (e < 0 || c->entries[e].on_list) return;
    c->unused++;
    if (c->entries[e].children == 0) ev_push(c, e, 0); // the most recently used end
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

// Evict the oldest entry on the eviction list, other than `keep` (the parent an
// insert is about to chain to). 0 if there is none.
static int evict_one(pkv_prefix_cache *c, int32_t keep) {
    int32_t e = c->ev_head;
    if (e >= 0 && e == keep) e = c->entries[e].next;
    if (e < 0) return 0;
    entry *x = &c->entries[e];
    ev_unlink(c, e);
    table_remove(c, e);
    c->entry_of[x->block] = -1;
    pkv_pool_release(c->pool, x->block);
    x->block = -1;
    c->free_entries[c->num_free++] = e;
    c->count--;
    c->unused--;
    c->stats.evictions++;
    // The parent may now be a leaf: it was used together with this block, so it
    // goes next (the head), and the chain is evicted from its tail towards its root.
    int32_t pe = x->parent_entry;
    if (pe >= 0 && --c->entries[pe].children == 0 && is_unused(c, pe)) ev_push(c, pe, 1);
    return 1;
}

static pkv_status check_set(const pkv_prefix_cache *c, const pkv_seqset *set) {
    if (!c || !set || pkv_seqset_pool(set) != c->pool ||
        pkv_seqset_block_size(set) != c->block_size || pkvi_seqset_prefix(set) != c)
        return PKV_ERR_INVALID_ARG;
    return PKV_OK;
}

pkv_status pkv_prefix_cache_attach(pkv_prefix_cache *c, pkv_seqset *set) {
    if (!c || !set || pkv_seqset_pool(set) != c->pool ||
        pkv_seqset_block_size(set) != c->block_size)
        return PKV_ERR_INVALID_ARG;
    pkvi_seqset_set_prefix(set, c);
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
            ev_unlink(c, e);
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
            if (c->entries[e].on_list) ev_push(c, e, 0); // recently used again
            parent = c->entries[e].block;
            parent_entry = e;
            continue;
        }
        if (c->entry_of[table[i]] >= 0) break; // this block caches another prefix
        if (c->num_free == 0 && !evict_one(c, parent_entry)) break;
        e = c->free_entries[--c->num_free];
        entry *x = &c->entries[e];
        x->key = key;
        x->block = table[i];
        x->parent = parent;
        x->parent_entry = parent_entry;
        x->children = 0;
        x->prev = x->next = -1;
        x->on_list = 0;
        if (parent_entry >= 0 && c->entries[parent_entry].children++ == 0)
            ev_unlink(c, parent_entry); // no longer a leaf
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
    stats->evictable = c->unused;
    return PKV_OK;
}

pkv_status pkv_prefix_cache_validate(const pkv_prefix_cache *c) {
    if (!c) return PKV_ERR_INVALID_ARG;
    if (c->count + c->num_free != c->max_entries) return PKV_ERR_CORRUPT;
    uint32_t *kids = calloc(c->max_entries, sizeof *kids);
    if (!kids) return PKV_ERR_OUT_OF_MEMORY;
    pkv_status st = PKV_OK;
    uint32_t live = 0, unused = 0, flagged = 0, on_list = 0, in_table = 0;
    for (uint32_t i = 0; i <= c->table_mask; i++) in_table += c->table[i] >= 0;
    for (int32_t e = 0; e < (int32_t)c->max_entries && st == PKV_OK; e++) {
        const entry *x = &c->entries[e];
        flagged += x->on_list != 0;
        if (x->block < 0) {
            if (x->on_list) st = PKV_ERR_CORRUPT;
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
    // The eviction list holds exactly the unused leaves, each once.
    for (uint32_t e = 0; e < c->max_entries && st == PKV_OK; e++) {
        const entry *x = &c->entries[e];
        if (x->block < 0) continue;
        int is_leaf_unused = kids[e] == 0 && pkv_pool_refcount(c->pool, x->block) == 1;
        if (kids[e] != x->children || (x->on_list != 0) != is_leaf_unused) st = PKV_ERR_CORRUPT;
    }
    for (int32_t e = c->ev_head, prev = -1; e >= 0 && st == PKV_OK; prev = e, e = c->entries[e].next)
        if (++on_list > live || c->entries[e].prev != prev || !c->entries[e].on_list)
            st = PKV_ERR_CORRUPT;
    if (st == PKV_OK && (live != c->count || in_table != c->count || unused != c->unused ||
                         on_list != flagged))
        st = PKV_ERR_CORRUPT;
    free(kids);
    return st;
}

// SPDX-License-Identifier: MIT
// Sequences and block tables over one pool, with fork and copy-on-write.
// Invariant: a live sequence of len tokens has exactly ceil(len / block_size)
// blocks in its table, and holds one pool reference on each table entry.
// Every mutating call checks everything that can fail (table growth, pool space)
// before it changes anything, so a failed call leaves the set and pool as they were.
// A queued copy-on-write copy pins its src and dst (one reference each) until the
// caller says the copies ran; pins are not sharers when deciding copy-on-write.
#include <stdlib.h>
#include <string.h>

#include "pkv/seq.h"
#include "prefix_internal.h"
#include "seqset_internal.h"

typedef struct seq {
    uint32_t len;          // tokens
    uint32_t num_blocks;   // == ceil(len / block_size)
    uint32_t cap;          // entries allocated in blocks
    int live;
    pkv_block_id *blocks;  // [cap]; the block table, entries 0..num_blocks-1 valid
} seq;

struct pkv_seqset {
    pkv_pool *pool;        // borrowed
    uint32_t block_size;
    uint32_t live;         // live sequences
    seq *seqs;             // [num_slots]; index = sequence id
    uint32_t num_slots, cap_slots;
    pkv_seq_id *free_ids;  // [cap_ids >= num_slots]; retired ids, reused LIFO
    uint32_t num_free_ids, cap_ids;
    pkv_block_copy *copies; // [cap_copies]; queued copy-on-write copies
    uint32_t num_copies, cap_copies;
    pkv_prefix_cache *prefix; // borrowed, optional: told when cached blocks go unused
};

static uint32_t blocks_for(uint32_t len, uint32_t block_size) {
    return (uint32_t)(((uint64_t)len + block_size - 1) / block_size);
}

// Grow an array to hold at least `need` elements (doubling); the old contents
// stay valid on failure.
static int grow(void **array, uint32_t *cap, uint32_t need, size_t elem) {
    if (need <= *cap) return 1;
    uint64_t new_cap = *cap ? (uint64_t)*cap * 2 : 4;
    while (new_cap < need) new_cap *= 2;
    if (new_cap > UINT32_MAX) new_cap = UINT32_MAX;
    void *p = realloc(*array, (size_t)new_cap * elem);
    if (!p) return 0;
    *array = p;
    *cap = (uint32_t)new_cap;
    return 1;
}

// Release blocks[0..n-1] (all or nothing, as pkv_pool_release_n) and tell the
// prefix cache about every block that only it may hold now.
static pkv_status release_blocks(pkv_seqset *set, const pkv_block_id *blocks, uint32_t n) {
    pkv_status st = pkv_pool_release_n(set->pool, blocks, n);
    if (st == PKV_OK && set->prefix)
        for (uint32_t i = 0; i < n; i++)
            if (pkv_pool_refcount(set->pool, blocks[i]) == 1)
                pkvi_prefix_block_unused(set->prefix, blocks[i]);
    return st;
}

static seq *get_seq(const pkv_seqset *set, pkv_seq_id id) {
    if (!set || id < 0 || (uint32_t)id >= set->num_slots || !set->seqs[id].live) return NULL;
    return &set->seqs[id];
}

pkv_status pkv_seqset_create(pkv_pool *pool, uint32_t block_size, pkv_seqset **out) {
    if (!out) return PKV_ERR_INVALID_ARG;
    *out = NULL;
    if (!pool || block_size == 0 || block_size > 65536) return PKV_ERR_INVALID_ARG;
    pkv_seqset *set = calloc(1, sizeof *set);
    if (!set) return PKV_ERR_OUT_OF_MEMORY;
    set->pool = pool;
    set->block_size = block_size;
    *out = set;
    return PKV_OK;
}

void pkv_seqset_destroy(pkv_seqset *set) {
    if (!set) return;
    for (uint32_t i = 0; i < set->num_slots; i++) {
        seq *s = &set->seqs[i];
        if (s->live) release_blocks(set, s->blocks, s->num_blocks);
        free(s->blocks);
    }
    pkv_seqset_copies_done(set); // drop the pins of copies nobody ran
    free(set->seqs);
    free(set->free_ids);
    free(set->copies);
    free(set);
}

uint32_t pkv_seqset_block_size(const pkv_seqset *set) { return set ? set->block_size : 0; }
pkv_pool *pkv_seqset_pool(const pkv_seqset *set) { return set ? set->pool : NULL; }
uint32_t pkv_seqset_live_count(const pkv_seqset *set) { return set ? set->live : 0; }

// Take a sequence slot: a retired id if any, else a new one. The slot comes back
// zeroed except for a block table buffer it may keep from its previous life.
static pkv_status take_slot(pkv_seqset *set, pkv_seq_id *id) {
    if (set->num_free_ids > 0) {
        *id = set->free_ids[--set->num_free_ids];
    } else {
        if (set->num_slots >= (uint32_t)INT32_MAX) return PKV_ERR_OUT_OF_MEMORY;
        // free_ids can hold every id, so pkv_seq_free never has to allocate.
        // A failure here leaves only spare capacity behind.
        if (!grow((void **)&set->seqs, &set->cap_slots, set->num_slots + 1, sizeof(seq)) ||
            !grow((void **)&set->free_ids, &set->cap_ids, set->num_slots + 1, sizeof(pkv_seq_id)))
            return PKV_ERR_OUT_OF_MEMORY;
        memset(&set->seqs[set->num_slots], 0, sizeof(seq));
        *id = (pkv_seq_id)set->num_slots++;
    }
    seq *s = &set->seqs[*id];
    s->len = 0;
    s->num_blocks = 0;
    s->live = 1;
    set->live++;
    return PKV_OK;
}

static void return_slot(pkv_seqset *set, pkv_seq_id id) {
    set->seqs[id].live = 0;
    set->free_ids[set->num_free_ids++] = id;
    set->live--;
}

pkv_status pkv_seq_create(pkv_seqset *set, pkv_seq_id *id) {
    if (!set || !id) return PKV_ERR_INVALID_ARG;
    return take_slot(set, id);
}

pkv_status pkv_seq_free(pkv_seqset *set, pkv_seq_id id) {
    seq *s = get_seq(set, id);
    if (!set) return PKV_ERR_INVALID_ARG;
    if (!s) return PKV_ERR_NOT_FOUND;
    pkv_status st = release_blocks(set, s->blocks, s->num_blocks);
    if (st != PKV_OK) return PKV_ERR_CORRUPT; // the set's references were not in the pool
    s->num_blocks = 0;
    s->len = 0;
    return_slot(set, id);
    return PKV_OK;
}

// References on block b held by queued copies (pins), not by sequences. The queue
// holds one step's copies, so the scan is short.
static int32_t pins_on(const pkv_seqset *set, pkv_block_id b) {
    int32_t pins = 0;
    for (uint32_t i = 0; i < set->num_copies; i++)
        pins += (set->copies[i].src == b) + (set->copies[i].dst == b);
    return pins;
}

// Would appending to s write into a partly filled last block that another
// sequence also holds?
static int needs_cow(const pkv_seqset *set, const seq *s) {
    if (s->len % set->block_size == 0) return 0;
    pkv_block_id last = s->blocks[s->num_blocks - 1];
    int32_t rc = pkv_pool_refcount(set->pool, last);
    return rc > 1 && rc - pins_on(set, last) > 1;
}

static pkv_status check_append(const pkv_seqset *set, const seq *s, uint32_t n,
                               uint32_t *new_blocks, uint32_t *cow) {
    uint64_t new_len = (uint64_t)s->len + n;
    // Slots are int64 block * block_size + offset; lengths stay in uint32 with room.
    if (new_len > (uint64_t)INT32_MAX) return PKV_ERR_INVALID_ARG;
    *new_blocks = blocks_for((uint32_t)new_len, set->block_size) - s->num_blocks;
    *cow = n > 0 && needs_cow(set, s);
    return PKV_OK;
}

pkv_status pkv_seq_blocks_needed(const pkv_seqset *set, pkv_seq_id id, uint32_t n,
                                 uint32_t *blocks) {
    if (!set || !blocks) return PKV_ERR_INVALID_ARG;
    const seq *s = get_seq(set, id);
    if (!s) return PKV_ERR_NOT_FOUND;
    uint32_t new_blocks, cow;
    pkv_status st = check_append(set, s, n, &new_blocks, &cow);
    if (st == PKV_OK) *blocks = new_blocks + cow;
    return st;
}

pkv_status pkv_seq_append(pkv_seqset *set, pkv_seq_id id, uint32_t n, int64_t *slots) {
    if (!set) return PKV_ERR_INVALID_ARG;
    seq *s = get_seq(set, id);
    if (!s) return PKV_ERR_NOT_FOUND;
    uint32_t new_blocks, cow;
    pkv_status st = check_append(set, s, n, &new_blocks, &cow);
    if (st != PKV_OK || n == 0) return st;

    // Grow the table and the copy queue first: they are the only things that
    // can fail with nothing changed besides spare capacity.
    uint32_t total = s->num_blocks + new_blocks;
    if (!grow((void **)&s->blocks, &s->cap, total, sizeof(pkv_block_id)))
        return PKV_ERR_OUT_OF_MEMORY;
    if (cow && !grow((void **)&set->copies, &set->cap_copies, set->num_copies + 1,
                     sizeof(pkv_block_copy)))
        return PKV_ERR_OUT_OF_MEMORY;

    // One all-or-nothing pool call. With copy-on-write the first new block lands
    // on the last table entry, replacing the shared block (saved in src first).
    pkv_block_id src = cow ? s->blocks[s->num_blocks - 1] : -1;
    st = pkv_pool_alloc(set->pool, new_blocks + cow, &s->blocks[s->num_blocks - cow]);
    if (st != PKV_OK) {
        if (cow) s->blocks[s->num_blocks - 1] = src; // pool_alloc wrote nothing, but be explicit
        return st;
    }
    if (cow) {
        // The sequence's reference to src becomes the copy's pin on src; dst gets a
        // pin of its own. Both go when the caller says the copies ran.
        pkv_block_id dst = s->blocks[s->num_blocks - 1];
        pkv_pool_retain(set->pool, dst);
        set->copies[set->num_copies].src = src;
        set->copies[set->num_copies].dst = dst;
        set->num_copies++;
    }
    if (slots) {
        const uint32_t bs = set->block_size;
        for (uint32_t i = 0; i < n; i++) {
            uint32_t pos = s->len + i;
            slots[i] = (int64_t)s->blocks[pos / bs] * bs + pos % bs;
        }
    }
    s->len += n;
    s->num_blocks = total;
    return PKV_OK;
}

pkv_status pkv_seq_fork(pkv_seqset *set, pkv_seq_id parent, pkv_seq_id *child) {
    if (!set || !child) return PKV_ERR_INVALID_ARG;
    if (!get_seq(set, parent)) return PKV_ERR_NOT_FOUND;
    pkv_seq_id id;
    pkv_status st = take_slot(set, &id);
    if (st != PKV_OK) return st;
    // take_slot may have moved set->seqs: look the parent up again.
    seq *p = &set->seqs[parent], *c = &set->seqs[id];
    if (!grow((void **)&c->blocks, &c->cap, p->num_blocks, sizeof(pkv_block_id))) {
        return_slot(set, id);
        return PKV_ERR_OUT_OF_MEMORY;
    }
    for (uint32_t i = 0; i < p->num_blocks; i++) {
        c->blocks[i] = p->blocks[i];
        pkv_pool_retain(set->pool, p->blocks[i]); // live: the parent holds it
    }
    c->len = p->len;
    c->num_blocks = p->num_blocks;
    *child = id;
    return PKV_OK;
}

pkv_status pkvi_seq_adopt_block(pkv_seqset *set, pkv_seq_id id, pkv_block_id block) {
    seq *s = get_seq(set, id);
    if (!s) return PKV_ERR_NOT_FOUND;
    if (s->len % set->block_size != 0 || s->len > (uint32_t)INT32_MAX - set->block_size)
        return PKV_ERR_INVALID_ARG;
    if (!grow((void **)&s->blocks, &s->cap, s->num_blocks + 1, sizeof(pkv_block_id)))
        return PKV_ERR_OUT_OF_MEMORY;
    pkv_status st = pkv_pool_retain(set->pool, block);
    if (st != PKV_OK) return st;
    s->blocks[s->num_blocks++] = block;
    s->len += set->block_size;
    return PKV_OK;
}

void pkvi_seqset_set_prefix(pkv_seqset *set, pkv_prefix_cache *cache) { set->prefix = cache; }

pkv_prefix_cache *pkvi_seqset_prefix(const pkv_seqset *set) { return set->prefix; }

pkv_status pkv_seq_length(const pkv_seqset *set, pkv_seq_id id, uint32_t *len) {
    if (!set || !len) return PKV_ERR_INVALID_ARG;
    const seq *s = get_seq(set, id);
    if (!s) return PKV_ERR_NOT_FOUND;
    *len = s->len;
    return PKV_OK;
}

pkv_status pkv_seq_block_table(const pkv_seqset *set, pkv_seq_id id,
                               const pkv_block_id **table, uint32_t *num_blocks) {
    if (!set || !table || !num_blocks) return PKV_ERR_INVALID_ARG;
    const seq *s = get_seq(set, id);
    if (!s) return PKV_ERR_NOT_FOUND;
    *table = s->blocks;
    *num_blocks = s->num_blocks;
    return PKV_OK;
}

pkv_status pkv_seq_move(pkv_seqset *from, pkv_seq_id id, pkv_seqset *to, pkv_seq_id *new_id,
                        pkv_block_copy *pairs, uint32_t cap, uint32_t *n) {
    if (!from || !to || !new_id || !n || (!pairs && cap) || from->pool == to->pool ||
        from->block_size != to->block_size)
        return PKV_ERR_INVALID_ARG;
    seq *s = get_seq(from, id);
    if (!s) return PKV_ERR_NOT_FOUND;
    const uint32_t nb = s->num_blocks, len = s->len;
    if (cap < nb) return PKV_ERR_BUFFER_TOO_SMALL;
    if (pkv_pool_free_count(to->pool) < nb) return PKV_ERR_OUT_OF_BLOCKS;
    pkv_seq_id dst_id;
    pkv_status st = pkv_seq_create(to, &dst_id);
    if (st != PKV_OK) return st;
    // The destination has the pool space (checked above), so only the table can fail.
    st = pkv_seq_append(to, dst_id, len, NULL);
    if (st != PKV_OK) {
        pkv_seq_free(to, dst_id);
        return st;
    }
    const seq *d = &to->seqs[dst_id];
    for (uint32_t i = 0; i < nb; i++) {
        pairs[i].src = s->blocks[i];
        pairs[i].dst = d->blocks[i];
    }
    pkv_seq_free(from, id);
    *new_id = dst_id;
    *n = nb;
    return PKV_OK;
}

uint32_t pkv_seqset_pending_copies(const pkv_seqset *set) { return set ? set->num_copies : 0; }

pkv_status pkv_seqset_copies(const pkv_seqset *set, const pkv_block_copy **copies, uint32_t *n) {
    if (!set || !copies || !n) return PKV_ERR_INVALID_ARG;
    *copies = set->copies;
    *n = set->num_copies;
    return PKV_OK;
}

pkv_status pkv_seqset_copies_done(pkv_seqset *set) {
    if (!set) return PKV_ERR_INVALID_ARG;
    pkv_status st = PKV_OK;
    for (uint32_t i = 0; i < set->num_copies; i++) {
        pkv_block_id pins[2] = {set->copies[i].src, set->copies[i].dst};
        if (release_blocks(set, pins, 2) != PKV_OK) st = PKV_ERR_CORRUPT;
    }
    set->num_copies = 0;
    return st;
}

pkv_status pkv_seqset_take_copies(pkv_seqset *set, pkv_block_copy *copies, uint32_t cap,
                                  uint32_t *n) {
    if (!set || !n || (!copies && cap)) return PKV_ERR_INVALID_ARG;
    if (cap < set->num_copies) return PKV_ERR_BUFFER_TOO_SMALL;
    if (set->num_copies) memcpy(copies, set->copies, set->num_copies * sizeof *copies);
    *n = set->num_copies;
    return pkv_seqset_copies_done(set);
}

// Check the ids and gather the sequences of an export; NULL entries are never
// returned (an unknown id makes the whole export fail before anything is written).
static pkv_status check_ids(const pkv_seqset *set, const pkv_seq_id *seqs, uint32_t num_seqs) {
    if (!set || (!seqs && num_seqs)) return PKV_ERR_INVALID_ARG;
    for (uint32_t i = 0; i < num_seqs; i++)
        if (!get_seq(set, seqs[i])) return PKV_ERR_NOT_FOUND;
    return PKV_OK;
}

pkv_status pkv_seqset_export_padded(const pkv_seqset *set, const pkv_seq_id *seqs,
                                    uint32_t num_seqs, uint32_t max_blocks,
                                    int32_t pad_value, int32_t *table, int32_t *lens) {
    pkv_status st = check_ids(set, seqs, num_seqs);
    if (st != PKV_OK) return st;
    if (!table && num_seqs && max_blocks) return PKV_ERR_INVALID_ARG;
    for (uint32_t i = 0; i < num_seqs; i++)
        if (set->seqs[seqs[i]].num_blocks > max_blocks) return PKV_ERR_BUFFER_TOO_SMALL;
    for (uint32_t i = 0; i < num_seqs; i++) {
        const seq *s = &set->seqs[seqs[i]];
        int32_t *row = table + (size_t)i * max_blocks;
        if (s->num_blocks) memcpy(row, s->blocks, s->num_blocks * sizeof *row);
        for (uint32_t j = s->num_blocks; j < max_blocks; j++) row[j] = pad_value;
        if (lens) lens[i] = (int32_t)s->len;
    }
    return PKV_OK;
}

pkv_status pkv_seqset_export_csr(const pkv_seqset *set, const pkv_seq_id *seqs,
                                 uint32_t num_seqs, int32_t *indptr, int32_t *indices,
                                 uint32_t indices_cap, int32_t *last_page_len) {
    pkv_status st = check_ids(set, seqs, num_seqs);
    if (st != PKV_OK) return st;
    if (!indptr || (num_seqs && !last_page_len)) return PKV_ERR_INVALID_ARG;
    uint64_t total = 0;
    for (uint32_t i = 0; i < num_seqs; i++) total += set->seqs[seqs[i]].num_blocks;
    if (total > indices_cap || total > (uint64_t)INT32_MAX) return PKV_ERR_BUFFER_TOO_SMALL;
    if (total && !indices) return PKV_ERR_INVALID_ARG;
    int32_t at = 0;
    indptr[0] = 0;
    for (uint32_t i = 0; i < num_seqs; i++) {
        const seq *s = &set->seqs[seqs[i]];
        if (s->num_blocks) memcpy(indices + at, s->blocks, s->num_blocks * sizeof *indices);
        at += (int32_t)s->num_blocks;
        indptr[i + 1] = at;
        last_page_len[i] = s->len == 0 ? 0 : (int32_t)((s->len - 1) % set->block_size + 1);
    }
    return PKV_OK;
}

pkv_status pkv_seqset_validate(const pkv_seqset *set, int exclusive) {
    if (!set) return PKV_ERR_INVALID_ARG;
    pkv_status st = pkv_pool_validate(set->pool);
    if (st != PKV_OK) return st;
    const uint32_t capacity = pkv_pool_capacity(set->pool);
    uint32_t *refs = calloc(capacity, sizeof *refs);
    if (!refs) return PKV_ERR_OUT_OF_MEMORY;
    uint32_t live = 0;
    for (uint32_t i = 0; i < set->num_slots && st == PKV_OK; i++) {
        const seq *s = &set->seqs[i];
        if (!s->live) continue;
        live++;
        if (s->num_blocks != blocks_for(s->len, set->block_size) || s->num_blocks > s->cap) {
            st = PKV_ERR_CORRUPT;
            break;
        }
        for (uint32_t j = 0; j < s->num_blocks; j++) {
            pkv_block_id b = s->blocks[j];
            if ((uint32_t)b >= capacity) {
                st = PKV_ERR_CORRUPT;
                break;
            }
            refs[b]++;
        }
    }
    if (st == PKV_OK && (live != set->live || set->live + set->num_free_ids != set->num_slots))
        st = PKV_ERR_CORRUPT;
    for (uint32_t i = 0; i < set->num_copies && st == PKV_OK; i++) {
        pkv_block_id src = set->copies[i].src, dst = set->copies[i].dst;
        if ((uint32_t)src >= capacity || (uint32_t)dst >= capacity || src == dst)
            st = PKV_ERR_CORRUPT;
        else
            refs[src]++, refs[dst]++; // the pins
    }
    for (uint32_t b = 0; b < capacity && st == PKV_OK; b++) {
        int32_t rc = pkv_pool_refcount(set->pool, b);
        if ((uint32_t)rc < refs[b] || (exclusive && (uint32_t)rc != refs[b])) st = PKV_ERR_CORRUPT;
    }
    free(refs);
    return st;
}

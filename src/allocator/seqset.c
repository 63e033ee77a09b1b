// SPDX-License-Identifier: MIT
// Sequences and block tables over one pool, with fork and copy-on-write, batch
// calls for one engine step, truncate, fork at a position and group moves.
// Invariant: a live sequence of len tokens has exactly ceil(len / block_size)
// entries in its table; the first `holes` of them are PKV_BLOCK_NONE (blocks
// released by a window rule, always full ones), and it holds one pool reference
// on each of the others.
// Every mutating call checks everything that can fail (ids, table growth, pool
// space) before it changes anything, so a failed call leaves the set and pool as
// they were (spare capacity of internal arrays aside).
// A queued copy-on-write copy pins its src and dst (one reference each) until the
// caller says the copies ran; pins are not sharers when deciding copy-on-write.
// Ids: slot index in the low ID_INDEX_BITS, the slot's generation above, so an id
// kept after its sequence was freed names nothing even once the slot is reused.
#include <stdlib.h>
#include <string.h>

#include "pkv/seq.h"
#include "pool_internal.h"
#include "seqset_internal.h"

#define ID_INDEX_BITS 20
#define ID_INDEX_MASK ((1u << ID_INDEX_BITS) - 1)
#define ID_GEN_MASK ((1u << (31 - ID_INDEX_BITS)) - 1) // 11 bits: ids stay int32 >= 0

typedef struct seq {
    uint32_t len;          // tokens
    uint32_t num_blocks;   // == ceil(len / block_size)
    uint32_t holes;        // leading entries released (PKV_BLOCK_NONE); <= len / block_size
    uint32_t cap;          // entries allocated in blocks
    uint32_t gen;          // generation of this slot (bumped when freed)
    uint32_t mark;         // == set->epoch while a batch call has seen this sequence
    uint32_t batch_new;    // batch scratch: blocks appended to the table
    uint32_t batch_cow;    // batch scratch: 1 if the last block is copied first
    pkv_seq_id live_id;    // the id naming this slot's current life; negative when free
    int live;
    pkv_block_id *blocks;  // [cap]; the block table, entries 0..num_blocks-1 valid
} seq;

struct pkv_seqset {
    pkv_pool *pool;        // borrowed
    uint32_t block_size;
    uint32_t live;         // live sequences
    uint32_t watermark;    // growth must leave this many free blocks (0: off)
    seq *seqs;             // [num_slots]; index = low bits of the sequence id
    uint32_t num_slots, cap_slots;
    uint32_t *free_ids;    // [cap_ids >= num_slots]; ring of retired slots, reused FIFO
    uint32_t free_head, num_free_ids, cap_ids;
    pkv_block_copy *copies; // [cap_copies]; queued copy-on-write copies
    uint32_t num_copies, cap_copies;
    uint32_t epoch;        // batch calls stamp seq.mark with it (duplicate ids)
    // Batch scratch: blocks some earlier sequence of the batch copies away from,
    // and how many did ([cap_cowed]). Only sequences with a shared partial last
    // block land here, so a linear scan is short.
    pkv_block_id *cowed_block;
    uint32_t *cowed_count;
    uint32_t num_cowed, cap_cowed;
    seq **batch;           // [cap_batch]; the sequences of the batch being applied
    uint32_t cap_batch;
    pkvi_unused_hook hook; // optional: told when a release leaves a block at refcount 1
    void *hook_ctx;
};

static uint32_t blocks_for(uint32_t len, uint32_t block_size) {
    return (uint32_t)(((uint64_t)len + block_size - 1) / block_size);
}

// Grow an array to hold at least `need` elements (doubling); the old contents
// stay valid on failure.
static int grow(void **array, uint32_t *cap, uint64_t need, size_t elem) {
    if (need <= *cap) return 1;
    if (need > UINT32_MAX) return 0;
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
// hook about every block left at refcount 1.
static pkv_status release_blocks(pkv_seqset *set, const pkv_block_id *blocks, uint32_t n) {
    pkv_status st = pkv_pool_release_n(set->pool, blocks, n);
    if (st == PKV_OK && set->hook)
        for (uint32_t i = 0; i < n; i++)
            if (pkv_pool_refcount(set->pool, blocks[i]) == 1) set->hook(set->hook_ctx, blocks[i]);
    return st;
}

// Release the live (non-hole) entries of s's table. An empty sequence has no
// table (blocks NULL), and NULL + 0 is undefined: nothing to do then.
static pkv_status release_live(pkv_seqset *set, const seq *s) {
    if (s->num_blocks == s->holes) return PKV_OK;
    return release_blocks(set, s->blocks + s->holes, s->num_blocks - s->holes);
}

static seq *get_seq(const pkv_seqset *set, pkv_seq_id id) {
    if (!set) return NULL;
    uint32_t idx = (uint32_t)id & ID_INDEX_MASK;
    if (idx >= set->num_slots) return NULL;
    seq *s = &set->seqs[idx];
    return s->live_id == id ? s : NULL; // live, and this generation
}

static pkv_seq_id id_of(const pkv_seqset *set, const seq *s) {
    uint32_t idx = (uint32_t)(s - set->seqs);
    return (pkv_seq_id)((s->gen << ID_INDEX_BITS) | idx);
}

// Growth of `need` blocks is allowed: the pool has them and keeps the watermark.
static int can_take(const pkv_seqset *set, uint64_t need) {
    return need == 0 || (uint64_t)pkv_pool_free_count(set->pool) >= need + set->watermark;
}

// Refuse growth of `need` blocks. When the pool itself is short (not just the
// watermark), let the pool count the refusal in its alloc_failures statistic: an
// alloc of more than it has fails before writing anything.
static pkv_status refuse(pkv_seqset *set, uint64_t need) {
    pkv_block_id unused;
    if (need > pkv_pool_free_count(set->pool))
        pkv_pool_alloc(set->pool, need > UINT32_MAX ? UINT32_MAX : (uint32_t)need, &unused);
    return PKV_ERR_OUT_OF_BLOCKS;
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
        if (s->live) release_live(set, s);
        free(s->blocks);
    }
    pkv_seqset_copies_done(set); // drop the pins of copies nobody ran
    free(set->seqs);
    free(set->free_ids);
    free(set->copies);
    free(set->cowed_block);
    free(set->cowed_count);
    free(set->batch);
    free(set);
}

uint32_t pkv_seqset_block_size(const pkv_seqset *set) { return set ? set->block_size : 0; }
pkv_pool *pkv_seqset_pool(const pkv_seqset *set) { return set ? set->pool : NULL; }
uint32_t pkv_seqset_live_count(const pkv_seqset *set) { return set ? set->live : 0; }

pkv_status pkv_seqset_set_watermark(pkv_seqset *set, uint32_t blocks) {
    if (!set) return PKV_ERR_INVALID_ARG;
    set->watermark = blocks;
    return PKV_OK;
}

uint32_t pkv_seqset_watermark(const pkv_seqset *set) { return set ? set->watermark : 0; }

// Make sure `n` take_slot calls cannot fail. PKV_ERR_LIMIT past 2^20 slots.
static pkv_status reserve_slots(pkv_seqset *set, uint32_t n) {
    if (n <= set->num_free_ids) return PKV_OK;
    uint64_t slots = (uint64_t)set->num_slots + (n - set->num_free_ids);
    if (slots > (uint64_t)ID_INDEX_MASK + 1) return PKV_ERR_LIMIT;
    // free_ids can hold every id, so pkv_seq_free never has to allocate. The ring
    // is only grown here, where it may be non-empty: unwrap it into the new array.
    if (slots > set->cap_ids) {
        uint32_t cap = set->cap_ids;
        uint32_t *ring = NULL;
        if (!grow((void **)&ring, &cap, slots, sizeof *ring)) return PKV_ERR_OUT_OF_MEMORY;
        for (uint32_t i = 0; i < set->num_free_ids; i++)
            ring[i] = set->free_ids[(set->free_head + i) % set->cap_ids];
        free(set->free_ids);
        set->free_ids = ring;
        set->cap_ids = cap;
        set->free_head = 0;
    }
    if (!grow((void **)&set->seqs, &set->cap_slots, slots, sizeof(seq)))
        return PKV_ERR_OUT_OF_MEMORY;
    return PKV_OK;
}

// Take a sequence slot: the oldest retired one if any (FIFO spreads generations
// over slots), else a new one. Call reserve_slots first; this cannot fail then.
static seq *take_slot(pkv_seqset *set) {
    uint32_t idx;
    if (set->num_free_ids > 0) {
        idx = set->free_ids[set->free_head];
        set->free_head = (set->free_head + 1) % set->cap_ids;
        set->num_free_ids--;
    } else {
        idx = set->num_slots++;
        memset(&set->seqs[idx], 0, sizeof(seq));
    }
    seq *s = &set->seqs[idx];
    s->len = 0;
    s->num_blocks = 0;
    s->holes = 0;
    s->live = 1;
    s->live_id = (pkv_seq_id)((s->gen << ID_INDEX_BITS) | idx);
    set->live++;
    return s;
}

// Retire a slot (its blocks already released): the generation moves on, so every
// id naming this life of the slot is stale from now on.
static void return_slot(pkv_seqset *set, seq *s) {
    uint32_t idx = (uint32_t)(s - set->seqs);
    s->live = 0;
    // A negative value whose low bits never name this slot, so no id (a negative
    // one included) matches a free slot.
    s->live_id = -1 - (int32_t)idx;
    s->len = 0;
    s->num_blocks = 0;
    s->holes = 0;
    s->gen = (s->gen + 1) & ID_GEN_MASK;
    set->free_ids[(set->free_head + set->num_free_ids) % set->cap_ids] = idx;
    set->num_free_ids++;
    set->live--;
}

pkv_status pkv_seq_create(pkv_seqset *set, pkv_seq_id *id) {
    if (!set || !id) return PKV_ERR_INVALID_ARG;
    pkv_status st = reserve_slots(set, 1);
    if (st != PKV_OK) return st;
    *id = id_of(set, take_slot(set));
    return PKV_OK;
}

static pkv_status free_seq(pkv_seqset *set, seq *s) {
    pkv_status st = release_live(set, s);
    if (st != PKV_OK) return PKV_ERR_CORRUPT; // the set's references were not in the pool
    return_slot(set, s);
    return PKV_OK;
}

pkv_status pkv_seq_free(pkv_seqset *set, pkv_seq_id id) {
    if (!set) return PKV_ERR_INVALID_ARG;
    seq *s = get_seq(set, id);
    if (!s) return PKV_ERR_NOT_FOUND;
    return free_seq(set, s);
}

// Start a batch call: a fresh epoch, so that seq.mark == epoch means "seen in
// this batch". On wrap-around every stale mark is cleared first.
static void new_epoch(pkv_seqset *set) {
    if (++set->epoch == 0) {
        for (uint32_t i = 0; i < set->num_slots; i++) set->seqs[i].mark = 0;
        set->epoch = 1;
    }
}

// Check seqs[0..n-1]: every id live (else NOT_FOUND), none twice (INVALID_ARG).
// Marks them with the current epoch. Nothing else changes.
static pkv_status check_batch_ids(pkv_seqset *set, const pkv_seq_id *seqs, uint32_t n) {
    new_epoch(set);
    for (uint32_t i = 0; i < n; i++) {
        seq *s = get_seq(set, seqs[i]);
        if (!s) return PKV_ERR_NOT_FOUND;
        if (s->mark == set->epoch) return PKV_ERR_INVALID_ARG;
        s->mark = set->epoch;
    }
    return PKV_OK;
}

pkv_status pkv_seqset_free_batch(pkv_seqset *set, const pkv_seq_id *seqs, uint32_t num_seqs) {
    if (!set || (!seqs && num_seqs)) return PKV_ERR_INVALID_ARG;
    pkv_status st = check_batch_ids(set, seqs, num_seqs);
    if (st != PKV_OK) return st;
    for (uint32_t i = 0; i < num_seqs; i++) {
        st = free_seq(set, get_seq(set, seqs[i]));
        if (st != PKV_OK) return st;
    }
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

// Free token positions in the last block (0: full, or no block).
static uint32_t room_of(const pkv_seqset *set, const seq *s) {
    return s->num_blocks * set->block_size - s->len;
}

// Blocks appended to the table when n tokens are appended (no division unless a
// block boundary is crossed: this is the per-sequence cost of an engine step).
static pkv_status new_blocks_for(const pkv_seqset *set, const seq *s, uint32_t n,
                                 uint32_t *new_blocks) {
    // Slots are int64 block * block_size + offset; lengths stay in uint32 with room.
    if ((uint64_t)s->len + n > (uint64_t)INT32_MAX) return PKV_ERR_INVALID_ARG;
    uint32_t room = room_of(set, s);
    if (n <= room) *new_blocks = 0;
    else if (n - room <= set->block_size) *new_blocks = 1;
    else *new_blocks = blocks_for(n - room, set->block_size);
    return PKV_OK;
}

// Sharers of the partly filled last block other than pins and other than
// `already` sequences that copy away from it earlier in the same batch; > 1 means
// appending must copy it first.
static int needs_cow(const pkv_seqset *set, const seq *s, int32_t already) {
    if (room_of(set, s) == 0) return 0;
    pkv_block_id last = s->blocks[s->num_blocks - 1];
    int32_t rc = pkv_pool_refcount(set->pool, last);
    return rc > 1 && rc - pins_on(set, last) - already > 1;
}

// How many sequences seen so far in this batch copy away from block b; with
// `add`, count one more. 0 if b is not listed. The list is sized by plan_batch.
static uint32_t cowed(pkv_seqset *set, pkv_block_id b, int add) {
    for (uint32_t i = 0; i < set->num_cowed; i++)
        if (set->cowed_block[i] == b) return add ? set->cowed_count[i]++ : set->cowed_count[i];
    if (add) {
        set->cowed_block[set->num_cowed] = b;
        set->cowed_count[set->num_cowed++] = 1;
    }
    return 0;
}

// Work out a batch append without changing anything visible: per sequence the new
// table entries and whether it copies its last block (in batch order, as the
// appends will run: n sharers of one block in the batch make n - 1 copies when
// nobody else holds it), and the totals. Fills set->batch[0..k-1]. This loop is
// the per-sequence cost of an engine step, so it reads the seq and the refcount
// array directly and divides only when an append crosses more than one block.
static pkv_status plan_batch(pkv_seqset *set, const pkv_seq_id *seqs, const uint32_t *counts,
                             uint32_t k, uint64_t *blocks, uint32_t *cows) {
    if (!set || (k && (!seqs || !counts))) return PKV_ERR_INVALID_ARG;
    if (k > set->cap_batch) {
        if (!grow((void **)&set->batch, &set->cap_batch, k, sizeof *set->batch))
            return PKV_ERR_OUT_OF_MEMORY;
    }
    new_epoch(set);
    set->num_cowed = 0;
    const uint32_t bs = set->block_size, epoch = set->epoch;
    const int32_t *rc = set->pool->refcount;
    uint64_t total = 0;
    uint32_t ncow = 0;
    for (uint32_t i = 0; i < k; i++) {
        const pkv_seq_id id = seqs[i];
        const uint32_t idx = (uint32_t)id & ID_INDEX_MASK;
        if (idx >= set->num_slots) return PKV_ERR_NOT_FOUND;
        seq *s = &set->seqs[idx];
        if (s->live_id != id) return PKV_ERR_NOT_FOUND; // freed, or an older generation
        if (s->mark == epoch) return PKV_ERR_INVALID_ARG; // listed twice
        s->mark = epoch;
        set->batch[i] = s;
        const uint32_t n = counts[i], room = s->num_blocks * bs - s->len;
        if ((uint64_t)s->len + n > (uint64_t)INT32_MAX) return PKV_ERR_INVALID_ARG;
        if (n <= room) { // the common decode step: no new block
            s->batch_new = 0;
            s->batch_cow = 0;
            if (n == 0 || rc[s->blocks[s->num_blocks - 1]] == 1) continue;
        } else {
            s->batch_new = n - room <= bs ? 1 : blocks_for(n - room, bs);
            s->batch_cow = 0;
            total += s->batch_new;
            if (n == 0 || room == 0 || rc[s->blocks[s->num_blocks - 1]] == 1) continue;
        }
        // A shared, partly filled last block: the slow path.
        if (set->cap_cowed < k) {
            uint32_t cap_b = set->cap_cowed;
            if (!grow((void **)&set->cowed_block, &cap_b, k, sizeof *set->cowed_block) ||
                !grow((void **)&set->cowed_count, &set->cap_cowed, k, sizeof *set->cowed_count))
                return PKV_ERR_OUT_OF_MEMORY;
        }
        pkv_block_id last = s->blocks[s->num_blocks - 1];
        if (needs_cow(set, s, (int32_t)cowed(set, last, 0))) {
            s->batch_cow = 1;
            cowed(set, last, 1);
            total++;
            ncow++;
        }
    }
    *blocks = total;
    *cows = ncow;
    return PKV_OK;
}

// Append n tokens to s as planned (s->batch_new, s->batch_cow). Cannot fail: the
// table and copy queue were grown and the pool space checked by the caller.
static void apply_append(pkv_seqset *set, seq *s, uint32_t n, int64_t *slots) {
    const uint32_t nb = s->batch_new, cow = s->batch_cow, bs = set->block_size;
    if (nb + cow == 0) { // the common decode step: room in an unshared last block
        if (slots && n) {
            const int64_t first = (int64_t)s->blocks[s->num_blocks - 1] * bs +
                                  (bs - (s->num_blocks * bs - s->len));
            for (uint32_t i = 0; i < n; i++) slots[i] = first + i;
        }
        s->len += n;
        return;
    }
    // With copy-on-write the first new block lands on the last table entry,
    // replacing the shared block (saved in src first).
    pkv_block_id src = cow ? s->blocks[s->num_blocks - 1] : -1;
    if (nb + cow) pkv_pool_alloc(set->pool, nb + cow, &s->blocks[s->num_blocks - cow]);
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
        // Walk (block index, offset) instead of dividing per token.
        uint32_t room = room_of(set, s);
        uint32_t bi = room ? s->num_blocks - 1 : s->num_blocks, off = room ? bs - room : 0;
        for (uint32_t i = 0; i < n; i++) {
            slots[i] = (int64_t)s->blocks[bi] * bs + off;
            if (++off == bs) off = 0, bi++;
        }
    }
    s->len += n;
    s->num_blocks += nb;
}

// Grow every table of the batch (seqs[0..k-1]) and the copy queue (only spare
// capacity changes on failure).
static pkv_status reserve_batch(pkv_seqset *set, seq *const *seqs, uint32_t k, uint32_t cows) {
    for (uint32_t i = 0; i < k; i++) {
        seq *s = seqs[i];
        if (s->batch_new &&
            !grow((void **)&s->blocks, &s->cap, (uint64_t)s->num_blocks + s->batch_new,
                  sizeof(pkv_block_id)))
            return PKV_ERR_OUT_OF_MEMORY;
    }
    if (cows && !grow((void **)&set->copies, &set->cap_copies, (uint64_t)set->num_copies + cows,
                      sizeof(pkv_block_copy)))
        return PKV_ERR_OUT_OF_MEMORY;
    return PKV_OK;
}

pkv_status pkv_seqset_blocks_needed_batch(const pkv_seqset *set, const pkv_seq_id *seqs,
                                          const uint32_t *counts, uint32_t num_seqs,
                                          uint32_t *blocks) {
    if (!set || !blocks) return PKV_ERR_INVALID_ARG;
    // Only the batch scratch (marks, planned counts) is written: no state a caller
    // can observe. The set is not const-defined (it came from calloc).
    uint64_t total;
    uint32_t cows;
    pkv_status st = plan_batch((pkv_seqset *)set, seqs, counts, num_seqs, &total, &cows);
    if (st != PKV_OK) return st;
    if (total > UINT32_MAX) return PKV_ERR_INVALID_ARG;
    *blocks = (uint32_t)total;
    return PKV_OK;
}

pkv_status pkv_seqset_append_batch(pkv_seqset *set, const pkv_seq_id *seqs,
                                   const uint32_t *counts, uint32_t num_seqs, int64_t *slots) {
    uint64_t total;
    uint32_t cows;
    pkv_status st = plan_batch(set, seqs, counts, num_seqs, &total, &cows);
    if (st != PKV_OK) return st;
    if (!can_take(set, total)) return refuse(set, total);
    if (total && (st = reserve_batch(set, set->batch, num_seqs, cows)) != PKV_OK) return st;
    const uint32_t bs = set->block_size;
    for (uint32_t i = 0; i < num_seqs; i++) {
        seq *s = set->batch[i];
        const uint32_t n = counts[i];
        if (s->batch_new + s->batch_cow == 0) {
            // Inline fast path (apply_append's first case): room in the last block.
            if (slots && n) {
                const int64_t first = (int64_t)s->blocks[s->num_blocks - 1] * bs +
                                      (bs - (s->num_blocks * bs - s->len));
                slots[0] = first; // n == 1 (decode) without a vectorized loop's prologue
                for (uint32_t j = 1; j < n; j++) slots[j] = first + j;
            }
            s->len += n;
        } else {
            apply_append(set, s, n, slots);
        }
        if (slots) slots += n;
    }
    return PKV_OK;
}

pkv_status pkv_seq_blocks_needed(const pkv_seqset *set, pkv_seq_id id, uint32_t n,
                                 uint32_t *blocks) {
    if (!set || !blocks) return PKV_ERR_INVALID_ARG;
    const seq *s = get_seq(set, id);
    if (!s) return PKV_ERR_NOT_FOUND;
    uint32_t nb;
    pkv_status st = new_blocks_for(set, s, n, &nb);
    if (st == PKV_OK) *blocks = nb + (n > 0 && needs_cow(set, s, 0));
    return st;
}

pkv_status pkv_seq_append(pkv_seqset *set, pkv_seq_id id, uint32_t n, int64_t *slots) {
    if (!set) return PKV_ERR_INVALID_ARG;
    seq *s = get_seq(set, id);
    if (!s) return PKV_ERR_NOT_FOUND;
    pkv_status st = new_blocks_for(set, s, n, &s->batch_new);
    if (st != PKV_OK || n == 0) return st;
    s->batch_cow = (uint32_t)needs_cow(set, s, 0);
    if (!can_take(set, (uint64_t)s->batch_new + s->batch_cow))
        return refuse(set, (uint64_t)s->batch_new + s->batch_cow);
    if ((st = reserve_batch(set, &s, 1, s->batch_cow)) != PKV_OK) return st;
    apply_append(set, s, n, slots);
    return PKV_OK;
}

// 1 if keeping the first len tokens of s would end in a released block that is not
// full: its tokens past the cut are gone, so nothing could append into it.
static int cuts_into_hole(const pkv_seqset *set, const seq *s, uint32_t len) {
    return len % set->block_size != 0 && blocks_for(len, set->block_size) <= s->holes;
}

pkv_status pkv_seq_release_before(pkv_seqset *set, pkv_seq_id id, uint32_t first_live_token,
                                  uint32_t *released) {
    if (!set) return PKV_ERR_INVALID_ARG;
    seq *s = get_seq(set, id);
    if (!s) return PKV_ERR_NOT_FOUND;
    if (first_live_token > s->len) return PKV_ERR_INVALID_ARG;
    // Only whole blocks before the first live token; since first_live_token <= len
    // they are full, so the partly filled last block never becomes a hole.
    const uint32_t dead = first_live_token / set->block_size;
    const uint32_t n = dead > s->holes ? dead - s->holes : 0;
    if (n && release_blocks(set, s->blocks + s->holes, n) != PKV_OK) return PKV_ERR_CORRUPT;
    for (uint32_t j = s->holes; j < s->holes + n; j++) s->blocks[j] = PKV_BLOCK_NONE;
    s->holes += n;
    if (released) *released = n;
    return PKV_OK;
}

pkv_status pkv_seq_released_blocks(const pkv_seqset *set, pkv_seq_id id, uint32_t *holes) {
    if (!set || !holes) return PKV_ERR_INVALID_ARG;
    const seq *s = get_seq(set, id);
    if (!s) return PKV_ERR_NOT_FOUND;
    *holes = s->holes;
    return PKV_OK;
}

pkv_status pkv_seq_fork_at(pkv_seqset *set, pkv_seq_id parent, uint32_t len, pkv_seq_id *child) {
    if (!set || !child) return PKV_ERR_INVALID_ARG;
    const seq *p = get_seq(set, parent);
    if (!p) return PKV_ERR_NOT_FOUND;
    if (len > p->len) return PKV_ERR_INVALID_ARG;
    const uint32_t nb = blocks_for(len, set->block_size);
    if (cuts_into_hole(set, p, len)) return PKV_ERR_RELEASED;
    const uint32_t holes = p->holes < nb ? p->holes : nb;
    for (uint32_t i = holes; i < nb; i++)
        if (pkv_pool_refcount(set->pool, p->blocks[i]) == INT32_MAX) return PKV_ERR_LIMIT;
    pkv_status st = reserve_slots(set, 1);
    if (st != PKV_OK) return st;
    seq *c = take_slot(set);
    p = get_seq(set, parent); // take_slot may have moved set->seqs
    if (!grow((void **)&c->blocks, &c->cap, nb, sizeof(pkv_block_id))) {
        return_slot(set, c);
        return PKV_ERR_OUT_OF_MEMORY;
    }
    for (uint32_t i = 0; i < holes; i++) c->blocks[i] = PKV_BLOCK_NONE;
    for (uint32_t i = holes; i < nb; i++) {
        c->blocks[i] = p->blocks[i];
        pkv_pool_retain(set->pool, p->blocks[i]); // live: the parent holds it; checked above
    }
    c->len = len;
    c->num_blocks = nb;
    c->holes = holes;
    *child = id_of(set, c);
    return PKV_OK;
}

pkv_status pkv_seq_fork(pkv_seqset *set, pkv_seq_id parent, pkv_seq_id *child) {
    const seq *p = get_seq(set, parent);
    if (set && child && !p) return PKV_ERR_NOT_FOUND;
    return pkv_seq_fork_at(set, parent, p ? p->len : 0, child);
}

pkv_status pkv_seq_truncate(pkv_seqset *set, pkv_seq_id id, uint32_t len) {
    if (!set) return PKV_ERR_INVALID_ARG;
    seq *s = get_seq(set, id);
    if (!s) return PKV_ERR_NOT_FOUND;
    if (len > s->len) return PKV_ERR_INVALID_ARG;
    if (cuts_into_hole(set, s, len)) return PKV_ERR_RELEASED;
    const uint32_t keep = blocks_for(len, set->block_size);
    const uint32_t from = keep > s->holes ? keep : s->holes; // entries past it are live
    // A kept, partly filled last block that is shared stays shared: the next append
    // into it copies it first (its refcount says so), as after a fork.
    // (An empty sequence has no table: NULL + 0 is undefined, so skip the call.)
    if (s->num_blocks > from &&
        release_blocks(set, s->blocks + from, s->num_blocks - from) != PKV_OK)
        return PKV_ERR_CORRUPT;
    s->num_blocks = keep;
    if (s->holes > keep) s->holes = keep;
    s->len = len;
    return PKV_OK;
}

pkv_status pkvi_seq_adopt_block(pkv_seqset *set, pkv_seq_id id, pkv_block_id block) {
    seq *s = get_seq(set, id);
    if (!s) return PKV_ERR_NOT_FOUND;
    if (room_of(set, s) != 0 || s->len > (uint32_t)INT32_MAX - set->block_size)
        return PKV_ERR_INVALID_ARG;
    if (!grow((void **)&s->blocks, &s->cap, (uint64_t)s->num_blocks + 1, sizeof(pkv_block_id)))
        return PKV_ERR_OUT_OF_MEMORY;
    pkv_status st = pkv_pool_retain(set->pool, block);
    if (st != PKV_OK) return st;
    s->blocks[s->num_blocks++] = block;
    s->len += set->block_size;
    return PKV_OK;
}

pkv_status pkvi_seq_adopt_hole(pkv_seqset *set, pkv_seq_id id) {
    seq *s = get_seq(set, id);
    if (!s) return PKV_ERR_NOT_FOUND;
    // Holes stay a prefix of full blocks: only a table of holes may take another.
    if (s->holes != s->num_blocks || room_of(set, s) != 0 ||
        s->len > (uint32_t)INT32_MAX - set->block_size)
        return PKV_ERR_INVALID_ARG;
    if (!grow((void **)&s->blocks, &s->cap, (uint64_t)s->num_blocks + 1, sizeof(pkv_block_id)))
        return PKV_ERR_OUT_OF_MEMORY;
    s->blocks[s->num_blocks++] = PKV_BLOCK_NONE;
    s->holes++;
    s->len += set->block_size;
    return PKV_OK;
}

void pkvi_seqset_set_hook(pkv_seqset *set, pkvi_unused_hook fn, void *ctx) {
    set->hook = fn;
    set->hook_ctx = fn ? ctx : NULL;
}

void *pkvi_seqset_hook_ctx(const pkv_seqset *set) { return set->hook_ctx; }

int pkvi_seqset_holds_any(const pkv_seqset *set, int (*held)(const void *ctx, pkv_block_id b),
                          const void *ctx) {
    for (uint32_t i = 0; i < set->num_slots; i++) {
        const seq *s = &set->seqs[i];
        if (!s->live) continue;
        for (uint32_t j = s->holes; j < s->num_blocks; j++)
            if (held(ctx, s->blocks[j])) return 1;
    }
    for (uint32_t i = 0; i < set->num_copies; i++)
        if (held(ctx, set->copies[i].src) || held(ctx, set->copies[i].dst)) return 1;
    return 0;
}

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

static int cmp_block(const void *a, const void *b) {
    pkv_block_id x = *(const pkv_block_id *)a, y = *(const pkv_block_id *)b;
    return (x > y) - (x < y);
}

// Index of b in the sorted, distinct uniq[0..n-1] (present by construction).
static uint32_t find_block(const pkv_block_id *uniq, uint32_t n, pkv_block_id b) {
    uint32_t lo = 0, hi = n;
    while (hi - lo > 1) {
        uint32_t mid = lo + (hi - lo) / 2;
        if (uniq[mid] <= b) lo = mid; else hi = mid;
    }
    return lo;
}

// A group move in steps (seqset_internal.h): plan counts the distinct live blocks
// of the moved sequences (uniq: every table entry, then sorted and deduplicated;
// dst: its new block; used: whether that new block has its first reference yet),
// reserve takes the slots in `to` and sizes their tables, commit does what cannot
// fail. Only plan and reserve can fail, and neither changes what a caller sees.
pkv_status pkvi_seq_move_plan(pkv_seqset *from, const pkv_seq_id *ids, uint32_t n,
                              pkvi_seq_move *mv) {
    memset(mv, 0, sizeof *mv);
    if (!from || (n && !ids)) return PKV_ERR_INVALID_ARG;
    pkv_status st = check_batch_ids(from, ids, n);
    if (st != PKV_OK) return st;
    uint64_t total = 0;
    for (uint32_t i = 0; i < n; i++) {
        const seq *s = get_seq(from, ids[i]);
        total += s->num_blocks - s->holes; // holes move as holes
    }
    if (total > UINT32_MAX / 2) return PKV_ERR_OUT_OF_MEMORY;
    pkv_block_id *uniq = malloc(((size_t)total * 2 + 1) * sizeof *uniq);
    unsigned char *used = calloc((size_t)total + 1, 1);
    if (!uniq || !used) {
        free(uniq);
        free(used);
        return PKV_ERR_OUT_OF_MEMORY;
    }
    uint32_t t = 0, d = 0;
    for (uint32_t i = 0; i < n; i++) {
        const seq *s = get_seq(from, ids[i]);
        const uint32_t live = s->num_blocks - s->holes;
        // An empty sequence has no table (blocks NULL): memcpy(_, NULL, 0) is UB.
        if (live) memcpy(uniq + t, s->blocks + s->holes, live * sizeof *uniq);
        t += live;
    }
    qsort(uniq, t, sizeof *uniq, cmp_block);
    for (uint32_t i = 0; i < t; i++)
        if (d == 0 || uniq[i] != uniq[d - 1]) uniq[d++] = uniq[i];
    *mv = (pkvi_seq_move){.from = from, .ids = ids, .n = n, .uniq = uniq,
                          .dst = uniq + total, .used = used, .blocks = d};
    return PKV_OK;
}

int pkvi_seq_move_has_block(const pkvi_seq_move *mv, pkv_block_id b) {
    return mv->blocks && mv->uniq[find_block(mv->uniq, mv->blocks, b)] == b;
}

pkv_status pkvi_seq_move_reserve(pkvi_seq_move *mv, pkv_seqset *to, pkv_seq_id *new_ids) {
    if (!to || (mv->n && !new_ids) || to->pool == mv->from->pool ||
        to->block_size != mv->from->block_size)
        return PKV_ERR_INVALID_ARG;
    pkv_status st = reserve_slots(to, mv->n);
    uint32_t taken = 0;
    for (; st == PKV_OK && taken < mv->n; taken++) {
        seq *c = take_slot(to);
        const seq *s = get_seq(mv->from, mv->ids[taken]);
        new_ids[taken] = id_of(to, c);
        if (!grow((void **)&c->blocks, &c->cap, s->num_blocks, sizeof(pkv_block_id))) {
            return_slot(to, c);
            st = PKV_ERR_OUT_OF_MEMORY;
            break;
        }
    }
    if (st != PKV_OK) {
        while (taken > 0) {
            taken--;
            return_slot(to, get_seq(to, new_ids[taken]));
        }
        return st;
    }
    mv->to = to;
    mv->new_ids = new_ids;
    return PKV_OK;
}

pkv_status pkvi_seq_move_commit(pkvi_seq_move *mv, pkv_block_copy *pairs) {
    pkv_seqset *from = mv->from, *to = mv->to;
    const uint32_t d = mv->blocks;
    if (d) pkv_pool_alloc(to->pool, d, mv->dst);
    for (uint32_t i = 0; i < mv->n; i++) {
        seq *s = get_seq(from, mv->ids[i]), *c = get_seq(to, mv->new_ids[i]);
        for (uint32_t j = 0; j < s->holes; j++) c->blocks[j] = PKV_BLOCK_NONE;
        for (uint32_t j = s->holes; j < s->num_blocks; j++) {
            uint32_t k = find_block(mv->uniq, d, s->blocks[j]);
            c->blocks[j] = mv->dst[k];
            if (mv->used[k]) pkv_pool_retain(to->pool, mv->dst[k]); // one more sharer
            mv->used[k] = 1;
        }
        c->len = s->len;
        c->num_blocks = s->num_blocks;
        c->holes = s->holes;
    }
    for (uint32_t k = 0; k < d; k++) {
        pairs[k].src = mv->uniq[k];
        pairs[k].dst = mv->dst[k];
    }
    pkv_status st = PKV_OK;
    for (uint32_t i = 0; i < mv->n && st == PKV_OK; i++)
        st = free_seq(from, get_seq(from, mv->ids[i]));
    mv->to = NULL; // the slots in `to` are the moved sequences now
    pkvi_seq_move_abort(mv);
    return st;
}

void pkvi_seq_move_abort(pkvi_seq_move *mv) {
    if (mv->to)
        for (uint32_t i = mv->n; i > 0; i--) return_slot(mv->to, get_seq(mv->to, mv->new_ids[i - 1]));
    free(mv->uniq);
    free(mv->used);
    memset(mv, 0, sizeof *mv);
}

pkv_status pkv_seq_move_group(pkv_seqset *from, const pkv_seq_id *ids, uint32_t n,
                              pkv_seqset *to, pkv_seq_id *new_ids,
                              pkv_block_copy *pairs, uint32_t cap, uint32_t *npairs) {
    if (!from || !to || !npairs || (n && (!ids || !new_ids)) || (!pairs && cap) ||
        from->pool == to->pool || from->block_size != to->block_size)
        return PKV_ERR_INVALID_ARG;
    pkvi_seq_move mv;
    pkv_status st = pkvi_seq_move_plan(from, ids, n, &mv);
    if (st != PKV_OK) return st;
    *npairs = mv.blocks;
    if (cap < mv.blocks) st = PKV_ERR_BUFFER_TOO_SMALL;
    else if (!can_take(to, mv.blocks)) st = PKV_ERR_OUT_OF_BLOCKS;
    else st = pkvi_seq_move_reserve(&mv, to, new_ids);
    if (st != PKV_OK) {
        pkvi_seq_move_abort(&mv);
        return st;
    }
    return pkvi_seq_move_commit(&mv, pairs);
}

pkv_status pkv_seq_move(pkv_seqset *from, pkv_seq_id id, pkv_seqset *to, pkv_seq_id *new_id,
                        pkv_block_copy *pairs, uint32_t cap, uint32_t *n) {
    if (!new_id) return PKV_ERR_INVALID_ARG;
    return pkv_seq_move_group(from, &id, 1, to, new_id, pairs, cap, n);
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
    *n = set->num_copies;
    if (cap < set->num_copies) return PKV_ERR_BUFFER_TOO_SMALL;
    if (set->num_copies) memcpy(copies, set->copies, set->num_copies * sizeof *copies);
    return pkv_seqset_copies_done(set);
}

// Check the ids of an export (an unknown id makes the whole export fail before
// anything is written).
static pkv_status check_ids(const pkv_seqset *set, const pkv_seq_id *seqs, uint32_t num_seqs) {
    if (!set || (!seqs && num_seqs)) return PKV_ERR_INVALID_ARG;
    for (uint32_t i = 0; i < num_seqs; i++)
        if (!get_seq(set, seqs[i])) return PKV_ERR_NOT_FOUND;
    return PKV_OK;
}

pkv_status pkv_seqset_export_size(const pkv_seqset *set, const pkv_seq_id *seqs,
                                  uint32_t num_seqs, uint32_t *max_blocks,
                                  uint64_t *total_blocks) {
    pkv_status st = check_ids(set, seqs, num_seqs);
    if (st != PKV_OK) return st;
    uint32_t mx = 0;
    uint64_t total = 0;
    for (uint32_t i = 0; i < num_seqs; i++) {
        uint32_t nb = get_seq(set, seqs[i])->num_blocks;
        if (nb > mx) mx = nb;
        total += nb;
    }
    if (max_blocks) *max_blocks = mx;
    if (total_blocks) *total_blocks = total;
    return PKV_OK;
}

pkv_status pkv_seqset_export_padded(const pkv_seqset *set, const pkv_seq_id *seqs,
                                    uint32_t num_seqs, uint32_t max_blocks,
                                    int32_t pad_value, int32_t *table, int32_t *lens) {
    pkv_status st = check_ids(set, seqs, num_seqs);
    if (st != PKV_OK) return st;
    if (!table && num_seqs && max_blocks) return PKV_ERR_INVALID_ARG;
    for (uint32_t i = 0; i < num_seqs; i++)
        if (get_seq(set, seqs[i])->num_blocks > max_blocks) return PKV_ERR_BUFFER_TOO_SMALL;
    for (uint32_t i = 0; i < num_seqs; i++) {
        const seq *s = get_seq(set, seqs[i]);
        int32_t *row = table + (size_t)i * max_blocks;
        if (s->num_blocks) memcpy(row, s->blocks, s->num_blocks * sizeof *row);
        for (uint32_t j = s->num_blocks; j < max_blocks; j++) row[j] = pad_value;
        if (lens) lens[i] = (int32_t)s->len;
    }
    return PKV_OK;
}

// The CSR export of seqs[0..num_seqs-1]; live blocks only. first_block NULL:
// the plain form, refused for a sequence with holes (its positions would shift).
static pkv_status export_csr(const pkv_seqset *set, const pkv_seq_id *seqs, uint32_t num_seqs,
                             int32_t *indptr, int32_t *indices, uint32_t indices_cap,
                             int32_t *last_page_len, int32_t *first_block) {
    pkv_status st = check_ids(set, seqs, num_seqs);
    if (st != PKV_OK) return st;
    if (!indptr || (num_seqs && !last_page_len)) return PKV_ERR_INVALID_ARG;
    uint64_t total = 0;
    for (uint32_t i = 0; i < num_seqs; i++) {
        const seq *s = get_seq(set, seqs[i]);
        if (s->holes && !first_block) return PKV_ERR_UNSUPPORTED;
        total += s->num_blocks - s->holes;
    }
    if (total > indices_cap || total > (uint64_t)INT32_MAX) return PKV_ERR_BUFFER_TOO_SMALL;
    if (total && !indices) return PKV_ERR_INVALID_ARG;
    int32_t at = 0;
    indptr[0] = 0;
    for (uint32_t i = 0; i < num_seqs; i++) {
        const seq *s = get_seq(set, seqs[i]);
        const uint32_t live = s->num_blocks - s->holes;
        if (live) memcpy(indices + at, s->blocks + s->holes, live * sizeof *indices);
        at += (int32_t)live;
        indptr[i + 1] = at;
        last_page_len[i] = s->len == 0 ? 0 : (int32_t)((s->len - 1) % set->block_size + 1);
        if (first_block) first_block[i] = (int32_t)s->holes;
    }
    return PKV_OK;
}

pkv_status pkv_seqset_export_csr(const pkv_seqset *set, const pkv_seq_id *seqs,
                                 uint32_t num_seqs, int32_t *indptr, int32_t *indices,
                                 uint32_t indices_cap, int32_t *last_page_len) {
    return export_csr(set, seqs, num_seqs, indptr, indices, indices_cap, last_page_len, NULL);
}

pkv_status pkv_seqset_export_csr_live(const pkv_seqset *set, const pkv_seq_id *seqs,
                                      uint32_t num_seqs, int32_t *indptr, int32_t *indices,
                                      uint32_t indices_cap, int32_t *last_page_len,
                                      int32_t *first_block) {
    if (num_seqs && !first_block) return PKV_ERR_INVALID_ARG;
    int32_t none = 0; // a non-NULL first_block for an empty batch
    return export_csr(set, seqs, num_seqs, indptr, indices, indices_cap, last_page_len,
                      first_block ? first_block : &none);
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
        if (s->num_blocks != blocks_for(s->len, set->block_size) || s->num_blocks > s->cap ||
            s->holes > s->len / set->block_size || s->gen > ID_GEN_MASK ||
            s->live_id != (pkv_seq_id)((s->gen << ID_INDEX_BITS) | i)) {
            st = PKV_ERR_CORRUPT;
            break;
        }
        for (uint32_t j = 0; j < s->holes; j++)
            if (s->blocks[j] != PKV_BLOCK_NONE) st = PKV_ERR_CORRUPT;
        for (uint32_t j = s->holes; j < s->num_blocks && st == PKV_OK; j++) {
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
    for (uint32_t i = 0; i < set->num_free_ids && st == PKV_OK; i++) {
        uint32_t idx = set->free_ids[(set->free_head + i) % set->cap_ids];
        if (idx >= set->num_slots || set->seqs[idx].live) st = PKV_ERR_CORRUPT;
    }
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

// SPDX-License-Identifier: MIT
// Randomized model-based test of the allocator: long random sequences of create,
// append, batch append, fork, fork at a position, truncate, free, batch free and
// take-copies, checked after every operation against a reference model written
// here (each sequence is just an array of token values) and against the pool
// invariants (pkv_seqset_validate, exclusive mode: every refcount equals the
// references the sequences hold, so a lost or leaked block fails at once).
//
// A twin set on its own pool replays every operation with single-sequence calls
// only (a batch append becomes one pkv_seq_append per sequence, a batch free one
// pkv_seq_free each): both must give the same ids, block tables, slots and
// copies, and a batch the twin could not complete must be refused whole.
//
// Token data lives in a simulated cache `mem` ([capacity][block_size] ints). Like
// an engine's step, writes of appended tokens are queued and executed after the
// queued copy-on-write copies ("flush"), and a sequence freed before the flush
// writes nothing; reading every sequence back through its block table must give
// the model's tokens. This is what proves copy-on-write right, not just the
// counters. (Block size 1 never copies: no block is ever partly filled.)
#include <criterion/criterion.h>
#include <stdlib.h>
#include <string.h>

#include "pkv/seq.h"

#define MAX_SEQS 24
#define MAX_LEN 400

typedef struct model_seq {
    int live;
    pkv_seq_id id;
    uint32_t len;
    int32_t tokens[MAX_LEN];
} model_seq;

typedef struct pending_write {
    int64_t slot;
    int32_t value;
    pkv_seq_id owner;
    uint32_t pos;
} pending_write;

typedef struct world {
    uint64_t rng;
    uint32_t bs, capacity;
    pkv_pool *pool, *pool2;
    pkv_seqset *set, *set2;  // set2: the twin, single-sequence calls only
    int32_t *mem;            // [capacity * bs]
    model_seq seqs[MAX_SEQS];
    pending_write *writes;   // [cap_writes]
    uint32_t num_writes, cap_writes;
    int32_t next_value;
    uint64_t ops, appends_failed, copies_done, forks, batches, batches_failed, truncates;
} world;

static uint32_t rnd(world *w, uint32_t n) {
    // xorshift64*: deterministic per seed, good enough for choosing operations.
    w->rng ^= w->rng >> 12;
    w->rng ^= w->rng << 25;
    w->rng ^= w->rng >> 27;
    return (uint32_t)((w->rng * 2685821657736338717ull) >> 33) % n;
}

static model_seq *pick_live(world *w) {
    uint32_t start = rnd(w, MAX_SEQS);
    for (uint32_t k = 0; k < MAX_SEQS; k++) {
        model_seq *m = &w->seqs[(start + k) % MAX_SEQS];
        if (m->live) return m;
    }
    return NULL;
}

static model_seq *pick_empty(world *w) {
    for (uint32_t k = 0; k < MAX_SEQS; k++)
        if (!w->seqs[k].live) return &w->seqs[k];
    return NULL;
}

// Execute queued copies, then queued writes, as an engine step would. Half the
// time through take_copies, half through the borrowed view + copies_done.
static void flush(world *w, int small_buffer) {
    pkv_block_copy copies[64];
    uint32_t n = 0, pending = pkv_seqset_pending_copies(w->set);
    if (small_buffer && pending > 0) {
        cr_assert_eq(pkv_seqset_take_copies(w->set, copies, pending - 1, &n),
                     PKV_ERR_BUFFER_TOO_SMALL);
        cr_assert_eq(pkv_seqset_pending_copies(w->set), pending, "refused take keeps queue");
    }
    cr_assert_leq(pending, 64u);
    const pkv_block_copy *view;
    cr_assert_eq(pkv_seqset_copies(w->set, &view, &n), PKV_OK);
    cr_assert_eq(n, pending);
    // The queue must be safe to run in parallel (one CUDA thread block per copy):
    // no dst twice, no dst that another copy reads.
    for (uint32_t i = 0; i < n; i++)
        for (uint32_t j = 0; j < n; j++) {
            if (i != j) cr_assert_neq(view[i].dst, view[j].dst, "dst twice (op %lu)", (unsigned long)w->ops);
            cr_assert_neq(view[i].dst, view[j].src, "dst is a src (op %lu)", (unsigned long)w->ops);
        }
    if (rnd(w, 2)) {
        if (n) memcpy(copies, view, n * sizeof *copies);
        cr_assert_eq(pkv_seqset_copies_done(w->set), PKV_OK);
    } else {
        cr_assert_eq(pkv_seqset_take_copies(w->set, copies, 64, &n), PKV_OK);
    }
    pkv_block_copy twin[64];
    uint32_t n2;
    cr_assert_eq(pkv_seqset_take_copies(w->set2, twin, 64, &n2), PKV_OK);
    cr_assert_eq(n2, n, "twin queued %u copies, batch set %u (op %lu)", n2, n, (unsigned long)w->ops);
    for (uint32_t i = 0; i < n; i++)
        cr_assert(twin[i].src == copies[i].src && twin[i].dst == copies[i].dst, "copy %u differs", i);
    cr_assert_eq(pkv_seqset_pending_copies(w->set), 0);
    for (uint32_t i = 0; i < n; i++) {
        cr_assert_neq(copies[i].src, copies[i].dst);
        memcpy(w->mem + (size_t)copies[i].dst * w->bs, w->mem + (size_t)copies[i].src * w->bs,
               w->bs * sizeof(int32_t));
    }
    w->copies_done += n;
    for (uint32_t i = 0; i < w->num_writes; i++) {
        cr_assert(w->writes[i].slot >= 0 && w->writes[i].slot < (int64_t)w->capacity * w->bs);
        w->mem[w->writes[i].slot] = w->writes[i].value;
    }
    w->num_writes = 0;
}

// Every live sequence reads back exactly its model tokens through its table.
static void check_data(world *w) {
    for (uint32_t k = 0; k < MAX_SEQS; k++) {
        model_seq *m = &w->seqs[k];
        if (!m->live) continue;
        const pkv_block_id *t;
        uint32_t nb;
        cr_assert_eq(pkv_seq_block_table(w->set, m->id, &t, &nb), PKV_OK);
        for (uint32_t p = 0; p < m->len; p++) {
            int32_t got = w->mem[(size_t)t[p / w->bs] * w->bs + p % w->bs];
            cr_assert_eq(got, m->tokens[p], "seq %d token %u: got %d want %d (op %lu)", m->id, p,
                         got, m->tokens[p], (unsigned long)w->ops);
        }
    }
}

// Lengths and block counts against the model, then the pool invariants.
static void check_state(world *w) {
    uint32_t live = 0;
    for (uint32_t k = 0; k < MAX_SEQS; k++) {
        model_seq *m = &w->seqs[k];
        if (!m->live) continue;
        live++;
        uint32_t len, nb;
        const pkv_block_id *t;
        cr_assert_eq(pkv_seq_length(w->set, m->id, &len), PKV_OK, "slot %u id %d len %u op %lu", k, m->id, m->len, (unsigned long)w->ops);
        cr_assert_eq(len, m->len);
        cr_assert_eq(pkv_seq_block_table(w->set, m->id, &t, &nb), PKV_OK);
        cr_assert_eq(nb, (m->len + w->bs - 1) / w->bs);
        const pkv_block_id *t2;
        uint32_t nb2;
        cr_assert_eq(pkv_seq_block_table(w->set2, m->id, &t2, &nb2), PKV_OK, "twin id differs");
        cr_assert_eq(nb2, nb);
        if (nb) cr_assert_arr_eq(t2, t, nb * sizeof *t, "tables differ (op %lu)", (unsigned long)w->ops);
    }
    cr_assert_eq(pkv_seqset_live_count(w->set), live);
    cr_assert_eq(pkv_seqset_live_count(w->set2), live);
    cr_assert_eq(pkv_pool_free_count(w->pool2), pkv_pool_free_count(w->pool));
    cr_assert_eq(pkv_seqset_validate(w->set, 1), PKV_OK, "invariants broken at op %lu",
                 (unsigned long)w->ops);
}

// A sequence freed before its step ran (finished or preempted) writes nothing:
// its blocks may already belong to someone else.
static void drop_writes(world *w, pkv_seq_id id) {
    uint32_t kept = 0;
    for (uint32_t i = 0; i < w->num_writes; i++)
        if (w->writes[i].owner != id) w->writes[kept++] = w->writes[i];
    w->num_writes = kept;
}

// Queue the writes of n tokens appended to m at the given slots.
static void queue_writes(world *w, model_seq *m, uint32_t n, const int64_t *slots) {
    if (w->num_writes + n > w->cap_writes) {
        w->cap_writes = 2 * (w->num_writes + n);
        w->writes = realloc(w->writes, w->cap_writes * sizeof *w->writes);
        cr_assert_not_null(w->writes);
    }
    for (uint32_t i = 0; i < n; i++) {
        m->tokens[m->len + i] = w->next_value;
        w->writes[w->num_writes].slot = slots[i];
        w->writes[w->num_writes].value = w->next_value++;
        w->writes[w->num_writes].owner = m->id;
        w->writes[w->num_writes].pos = m->len + i;
        w->num_writes++;
    }
    m->len += n;
}

static uint32_t append_size(world *w, const model_seq *m) {
    uint32_t n = 1 + rnd(w, rnd(w, 4) == 0 ? 3 * w->bs : 2);
    return m->len + n > MAX_LEN ? MAX_LEN - m->len : n;
}

static void op_append(world *w, model_seq *m) {
    uint32_t n = append_size(w, m);
    if (n == 0) return;
    uint32_t need, free_before = pkv_pool_free_count(w->pool);
    cr_assert_eq(pkv_seq_blocks_needed(w->set, m->id, n, &need), PKV_OK);
    int64_t slots[MAX_LEN], slots2[MAX_LEN];
    pkv_status st = pkv_seq_append(w->set, m->id, n, slots);
    cr_assert_eq(pkv_seq_append(w->set2, m->id, n, slots2), st);
    if (need > free_before) {
        cr_assert_eq(st, PKV_ERR_OUT_OF_BLOCKS);
        cr_assert_eq(pkv_pool_free_count(w->pool), free_before, "failed append took blocks");
        w->appends_failed++;
        return;
    }
    cr_assert_eq(st, PKV_OK);
    cr_assert_eq(free_before - pkv_pool_free_count(w->pool), need);
    cr_assert_arr_eq(slots, slots2, n * sizeof *slots);
    queue_writes(w, m, n, slots);
}

// One engine step over a random subset of the live sequences, as one batch call;
// the twin runs it as single appends. Refused exactly when the twin would run dry.
static void op_append_batch(world *w) {
    pkv_seq_id ids[MAX_SEQS];
    uint32_t counts[MAX_SEQS], k = 0, total = 0;
    model_seq *ms[MAX_SEQS];
    uint32_t start = rnd(w, MAX_SEQS);
    for (uint32_t j = 0; j < MAX_SEQS; j++) {
        model_seq *m = &w->seqs[(start + j) % MAX_SEQS];
        if (!m->live || rnd(w, 3) == 0) continue;
        ms[k] = m;
        ids[k] = m->id;
        counts[k] = rnd(w, 5) == 0 ? 0 : append_size(w, m); // a zero count is legal
        total += counts[k++];
    }
    uint32_t need, free_before = pkv_pool_free_count(w->pool);
    cr_assert_eq(pkv_seqset_blocks_needed_batch(w->set, ids, counts, k, &need), PKV_OK);
    int64_t *slots = malloc((total + 1) * sizeof *slots), *slots2 = malloc((total + 1) * sizeof *slots);
    cr_assert(slots && slots2);
    pkv_status st = pkv_seqset_append_batch(w->set, ids, counts, k, slots);
    w->batches++;
    if (need > free_before) {
        cr_assert_eq(st, PKV_ERR_OUT_OF_BLOCKS);
        cr_assert_eq(pkv_pool_free_count(w->pool), free_before, "refused batch took blocks");
        w->batches_failed++;
    } else {
        cr_assert_eq(st, PKV_OK);
        cr_assert_eq(free_before - pkv_pool_free_count(w->pool), need, "batch prediction (op %lu)",
                     (unsigned long)w->ops);
        uint32_t at = 0;
        for (uint32_t i = 0; i < k; i++) {
            cr_assert_eq(pkv_seq_append(w->set2, ids[i], counts[i], slots2 + at), PKV_OK);
            at += counts[i];
        }
        if (total) cr_assert_arr_eq(slots, slots2, total * sizeof *slots, "batch slots differ");
        at = 0;
        for (uint32_t i = 0; i < k; i++) {
            queue_writes(w, ms[i], counts[i], slots + at);
            at += counts[i];
        }
    }
    free(slots);
    free(slots2);
}

// Drop the queued writes of `id` at positions >= len: after a truncate those
// blocks may already hold someone else's tokens.
static void drop_writes_from(world *w, pkv_seq_id id, uint32_t len) {
    uint32_t kept = 0;
    for (uint32_t i = 0; i < w->num_writes; i++)
        if (w->writes[i].owner != id || w->writes[i].pos < len) w->writes[kept++] = w->writes[i];
    w->num_writes = kept;
}

static void op_truncate(world *w, model_seq *m) {
    uint32_t len = m->len ? rnd(w, m->len + 1) : 0;
    cr_assert_eq(pkv_seq_truncate(w->set, m->id, m->len + 1), PKV_ERR_INVALID_ARG);
    cr_assert_eq(pkv_seq_truncate(w->set, m->id, len), PKV_OK);
    cr_assert_eq(pkv_seq_truncate(w->set2, m->id, len), PKV_OK);
    drop_writes_from(w, m->id, len);
    m->len = len;
    w->truncates++;
}

// Fork the whole parent, or (at_pos) its first random number of tokens.
static void op_fork(world *w, model_seq *parent, int at_pos) {
    model_seq *child = pick_empty(w);
    if (!child) return;
    // Forks see written tokens only (the engine forks after the step that wrote them).
    flush(w, 0);
    uint32_t free_before = pkv_pool_free_count(w->pool);
    uint32_t len = at_pos ? rnd(w, parent->len + 1) : parent->len;
    pkv_seq_id twin;
    if (at_pos) {
        cr_assert_eq(pkv_seq_fork_at(w->set, parent->id, len, &child->id), PKV_OK);
        cr_assert_eq(pkv_seq_fork_at(w->set2, parent->id, len, &twin), PKV_OK);
    } else {
        cr_assert_eq(pkv_seq_fork(w->set, parent->id, &child->id), PKV_OK);
        cr_assert_eq(pkv_seq_fork(w->set2, parent->id, &twin), PKV_OK);
    }
    cr_assert_eq(twin, child->id);
    cr_assert_eq(pkv_pool_free_count(w->pool), free_before, "fork took blocks");
    child->live = 1;
    child->len = len;
    memcpy(child->tokens, parent->tokens, len * sizeof(int32_t));
    w->forks++;
}

static void free_one(world *w, model_seq *m) {
    m->live = 0;
    drop_writes(w, m->id);
}

// Free a random group with one batch call (the twin frees one by one).
static void op_free_batch(world *w) {
    pkv_seq_id ids[MAX_SEQS];
    model_seq *ms[MAX_SEQS];
    uint32_t k = 0;
    for (uint32_t j = 0; j < MAX_SEQS; j++)
        if (w->seqs[j].live && rnd(w, 3) == 0) ms[k] = &w->seqs[j], ids[k++] = w->seqs[j].id;
    if (k >= 2) {
        pkv_seq_id keep = ids[1];
        ids[1] = ids[0]; // a duplicate: refused, nothing freed
        cr_assert_eq(pkv_seqset_free_batch(w->set, ids, k), PKV_ERR_INVALID_ARG);
        ids[1] = keep;
    }
    cr_assert_eq(pkv_seqset_free_batch(w->set, ids, k), PKV_OK);
    for (uint32_t i = 0; i < k; i++) {
        cr_assert_eq(pkv_seq_free(w->set2, ids[i]), PKV_OK);
        free_one(w, ms[i]);
    }
    if (k) cr_assert_eq(pkv_seqset_free_batch(w->set, ids, k), PKV_ERR_NOT_FOUND, "stale ids");
}

static void run_world(uint64_t seed, uint32_t bs, uint32_t capacity, uint32_t num_ops) {
    world *w = calloc(1, sizeof *w);
    cr_assert_not_null(w);
    w->rng = seed * 0x9E3779B97F4A7C15ull + 1;
    w->bs = bs;
    w->capacity = capacity;
    cr_assert_eq(pkv_pool_create(capacity, &w->pool), PKV_OK);
    cr_assert_eq(pkv_seqset_create(w->pool, bs, &w->set), PKV_OK);
    cr_assert_eq(pkv_pool_create(capacity, &w->pool2), PKV_OK);
    cr_assert_eq(pkv_seqset_create(w->pool2, bs, &w->set2), PKV_OK);
    w->mem = calloc((size_t)capacity * bs, sizeof(int32_t));
    cr_assert_not_null(w->mem);

    for (w->ops = 0; w->ops < num_ops; w->ops++) {
        uint32_t r = rnd(w, 100);
        model_seq *m = pick_live(w);
        if (r < 12 || !m) { // create
            model_seq *e = pick_empty(w);
            if (e) {
                pkv_seq_id twin;
                cr_assert_eq(pkv_seq_create(w->set, &e->id), PKV_OK);
                cr_assert_eq(pkv_seq_create(w->set2, &twin), PKV_OK);
                cr_assert_eq(twin, e->id);
                e->live = 1;
                e->len = 0;
            }
        } else if (r < 40) {
            op_append(w, m);
        } else if (r < 58) {
            op_append_batch(w);
        } else if (r < 66) {
            op_fork(w, m, 0);
        } else if (r < 70) {
            op_fork(w, m, 1);
        } else if (r < 74) {
            op_truncate(w, m);
        } else if (r < 84) { // free
            uint32_t free_before = pkv_pool_free_count(w->pool);
            cr_assert_eq(pkv_seq_free(w->set, m->id), PKV_OK);
            cr_assert_eq(pkv_seq_free(w->set2, m->id), PKV_OK);
            cr_assert_geq(pkv_pool_free_count(w->pool), free_before);
            cr_assert_eq(pkv_seq_free(w->set, m->id), PKV_ERR_NOT_FOUND, "double free");
            free_one(w, m);
        } else if (r < 86) {
            op_free_batch(w);
        } else { // take copies and run the step's writes
            flush(w, r >= 96);
            check_data(w);
        }
        check_state(w);
    }
    flush(w, 0);
    check_data(w);
    for (uint32_t k = 0; k < MAX_SEQS; k++) {
        if (!w->seqs[k].live) continue;
        cr_assert_eq(pkv_seq_free(w->set, w->seqs[k].id), PKV_OK);
        cr_assert_eq(pkv_seq_free(w->set2, w->seqs[k].id), PKV_OK);
        w->seqs[k].live = 0;
    }
    check_state(w);
    cr_assert_eq(pkv_pool_free_count(w->pool), capacity, "blocks lost after %u ops", num_ops);
    // The run must have exercised the interesting paths, or it proves little.
    if (bs > 1) cr_assert_gt(w->copies_done, 0, "no copy-on-write happened");
    cr_assert_gt(w->appends_failed, 0, "the pool never ran dry");
    cr_assert_gt(w->forks, 0);
    cr_assert_gt(w->batches_failed, 0, "no batch was refused");
    cr_assert_gt(w->batches - w->batches_failed, 0);
    cr_assert_gt(w->truncates, 0);
    cr_log_info("seed %lu bs %u: %u ops, %lu forks, %lu copies, %lu refused appends, "
                "%lu batches (%lu refused), %lu truncates",
                (unsigned long)seed, bs, num_ops, (unsigned long)w->forks,
                (unsigned long)w->copies_done, (unsigned long)w->appends_failed,
                (unsigned long)w->batches, (unsigned long)w->batches_failed,
                (unsigned long)w->truncates);
    pkv_seqset_destroy(w->set);
    pkv_pool_destroy(w->pool);
    pkv_seqset_destroy(w->set2);
    pkv_pool_destroy(w->pool2);
    free(w->mem);
    free(w->writes);
    free(w);
}

// 5 worlds x 40,000 operations = 200,000 random operations, over block sizes
// 1 (every token a block), small and realistic, and pools small enough to run dry.
Test(allocator_model, seed1_block16, .timeout = 300) { run_world(1, 16, 96, 40000); }
Test(allocator_model, seed2_block4, .timeout = 300) { run_world(2, 4, 64, 40000); }
Test(allocator_model, seed3_block1, .timeout = 300) { run_world(3, 1, 200, 40000); }
Test(allocator_model, seed4_block8, .timeout = 300) { run_world(4, 8, 64, 40000); }
Test(allocator_model, seed5_block32, .timeout = 300) { run_world(5, 32, 48, 40000); }

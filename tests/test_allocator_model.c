// SPDX-License-Identifier: MIT
// Randomized model-based test of the allocator: long random sequences of create,
// append, fork, free and take-copies, checked after every operation against a
// reference model written here (each sequence is just an array of token values)
// and against the pool invariants (pkv_seqset_validate, exclusive mode: every
// refcount equals the references the sequences hold, so a lost or leaked block
// fails at once).
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
} pending_write;

typedef struct world {
    uint64_t rng;
    uint32_t bs, capacity;
    pkv_pool *pool;
    pkv_seqset *set;
    int32_t *mem;            // [capacity * bs]
    model_seq seqs[MAX_SEQS];
    pending_write *writes;   // [cap_writes]
    uint32_t num_writes, cap_writes;
    int32_t next_value;
    uint64_t ops, appends_failed, copies_done, forks;
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
    }
    cr_assert_eq(pkv_seqset_live_count(w->set), live);
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

static void op_append(world *w, model_seq *m) {
    uint32_t n = 1 + rnd(w, rnd(w, 4) == 0 ? 3 * w->bs : 2);
    if (m->len + n > MAX_LEN) n = MAX_LEN - m->len;
    if (n == 0) return;
    uint32_t need, free_before = pkv_pool_free_count(w->pool);
    cr_assert_eq(pkv_seq_blocks_needed(w->set, m->id, n, &need), PKV_OK);
    int64_t slots[MAX_LEN];
    pkv_status st = pkv_seq_append(w->set, m->id, n, slots);
    if (need > free_before) {
        cr_assert_eq(st, PKV_ERR_OUT_OF_BLOCKS);
        cr_assert_eq(pkv_pool_free_count(w->pool), free_before, "failed append took blocks");
        w->appends_failed++;
        return;
    }
    cr_assert_eq(st, PKV_OK);
    cr_assert_eq(free_before - pkv_pool_free_count(w->pool), need);
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
        w->num_writes++;
    }
    m->len += n;
}

static void op_fork(world *w, model_seq *parent) {
    model_seq *child = pick_empty(w);
    if (!child) return;
    // Forks see written tokens only (the engine forks after the step that wrote them).
    flush(w, 0);
    uint32_t free_before = pkv_pool_free_count(w->pool);
    cr_assert_eq(pkv_seq_fork(w->set, parent->id, &child->id), PKV_OK);
    cr_assert_eq(pkv_pool_free_count(w->pool), free_before, "fork took blocks");
    child->live = 1;
    child->len = parent->len;
    memcpy(child->tokens, parent->tokens, parent->len * sizeof(int32_t));
    w->forks++;
}

static void run_world(uint64_t seed, uint32_t bs, uint32_t capacity, uint32_t num_ops) {
    world *w = calloc(1, sizeof *w);
    cr_assert_not_null(w);
    w->rng = seed * 0x9E3779B97F4A7C15ull + 1;
    w->bs = bs;
    w->capacity = capacity;
    cr_assert_eq(pkv_pool_create(capacity, &w->pool), PKV_OK);
    cr_assert_eq(pkv_seqset_create(w->pool, bs, &w->set), PKV_OK);
    w->mem = calloc((size_t)capacity * bs, sizeof(int32_t));
    cr_assert_not_null(w->mem);

    for (w->ops = 0; w->ops < num_ops; w->ops++) {
        uint32_t r = rnd(w, 100);
        model_seq *m = pick_live(w);
        if (r < 12 || !m) { // create
            model_seq *e = pick_empty(w);
            if (e) {
                cr_assert_eq(pkv_seq_create(w->set, &e->id), PKV_OK);
                e->live = 1;
                e->len = 0;
            }
        } else if (r < 60) {
            op_append(w, m);
        } else if (r < 72) {
            op_fork(w, m);
        } else if (r < 86) { // free
            uint32_t free_before = pkv_pool_free_count(w->pool);
            cr_assert_eq(pkv_seq_free(w->set, m->id), PKV_OK);
            cr_assert_geq(pkv_pool_free_count(w->pool), free_before);
            cr_assert_eq(pkv_seq_free(w->set, m->id), PKV_ERR_NOT_FOUND, "double free");
            m->live = 0;
            drop_writes(w, m->id);
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
        w->seqs[k].live = 0;
    }
    check_state(w);
    cr_assert_eq(pkv_pool_free_count(w->pool), capacity, "blocks lost after %u ops", num_ops);
    // The run must have exercised the interesting paths, or it proves little.
    if (bs > 1) cr_assert_gt(w->copies_done, 0, "no copy-on-write happened");
    cr_assert_gt(w->appends_failed, 0, "the pool never ran dry");
    cr_assert_gt(w->forks, 0);
    cr_log_info("seed %lu bs %u: %u ops, %lu forks, %lu copies, %lu refused appends",
                (unsigned long)seed, bs, num_ops, (unsigned long)w->forks,
                (unsigned long)w->copies_done, (unsigned long)w->appends_failed);
    pkv_seqset_destroy(w->set);
    pkv_pool_destroy(w->pool);
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

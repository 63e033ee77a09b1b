// SPDX-License-Identifier: MIT
// libFuzzer harness for the allocator's public API (pool, sequences, prefix
// cache), checked against a reference model after every operation.
//
// The input's first bytes choose the pool size, block size and whether a
// prefix cache is attached; every following pair of bytes is one operation
// (create, create_cached, append, fork, free, flush copies, insert into the
// cache, reclaim; codes from 0xC0 on: alloc / retain / release / release_n on a
// second, bare pool, checked against a model of its refcounts). The model holds each sequence's token ids; the "K/V" of
// position p is a hash chained over tokens 0..p (as real K/V depends on the
// whole prefix), written into a simulated cache memory after the queued
// copy-on-write copies have run, as an engine step does. Oracles, after every
// operation: lengths and block counts equal the model's, pool / set / cache
// validate, a failed append takes no block, and after each flush every live
// sequence reads back exactly its model values through its block table (so a
// wrong CoW, a bad prefix hit or a block handed out twice shows), and the CSR
// export agrees with the block tables. At the end
// every sequence is freed and the cache reclaimed: all blocks must be free.
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "pkv/pool.h"
#include "pkv/prefix.h"
#include "pkv/seq.h"

#define CHECK(cond, ...)                                                                           \
    do {                                                                                           \
        if (!(cond)) {                                                                             \
            fprintf(stderr, "%s:%d: check failed: %s: ", __FILE__, __LINE__, #cond);               \
            fprintf(stderr, __VA_ARGS__);                                                          \
            fputc('\n', stderr);                                                                   \
            abort();                                                                               \
        }                                                                                          \
    } while (0)

#define MAX_SEQS 16
#define MAX_LEN 256

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

typedef struct mseq {
    int live;
    pkv_seq_id id;
    uint32_t len;
    int32_t tok[MAX_LEN];  // token ids
    uint32_t val[MAX_LEN]; // the K/V value of each position (hash of the prefix)
} mseq;

typedef struct write {
    int64_t slot;
    uint32_t value;
    pkv_seq_id owner;
} write;

typedef struct world {
    uint32_t bs, capacity;
    pkv_pool *pool;
    pkv_seqset *set;
    pkv_prefix_cache *cache; // NULL when the input runs without one
    uint32_t *mem;           // [capacity * bs]
    mseq seqs[MAX_SEQS];
    write writes[MAX_SEQS * MAX_LEN];
    uint32_t num_writes;
    // The bare pool and its model: refcount of every block (0 = free).
    pkv_pool *bare;
    uint32_t bare_cap;
    int32_t bare_ref[64];
} world;

// Chained value of position p: depends on every token before it. The wrap of
// the unsigned multiply is the point of a hash.
#if defined(__clang__)
__attribute__((no_sanitize("unsigned-integer-overflow")))
#endif
static uint32_t chain(uint32_t prev, int32_t tok) {
    uint32_t h = (prev ^ (uint32_t)tok) * 0x9e3779b1u;
    return h ^ (h >> 15);
}

static uint32_t value_at(const mseq *m, uint32_t p) { return p ? m->val[p - 1] : 0x51ed27u; }

static void check_state(world *w) {
    uint32_t live = 0;
    for (int k = 0; k < MAX_SEQS; k++) {
        const mseq *m = &w->seqs[k];
        if (!m->live) continue;
        live++;
        uint32_t len = 0, nb = 0;
        const pkv_block_id *t;
        const pkv_status st = pkv_seq_length(w->set, m->id, &len);
        CHECK(st == PKV_OK && len == m->len, "seq %d (status %d) len %u want %u", m->id, (int)st, len,
              m->len);
        CHECK(pkv_seq_block_table(w->set, m->id, &t, &nb) == PKV_OK &&
                  nb == (m->len + w->bs - 1) / w->bs,
              "seq %d blocks %u", m->id, nb);
    }
    CHECK(pkv_seqset_live_count(w->set) == live, "live %u want %u", pkv_seqset_live_count(w->set),
          live);
    // Exclusive (refcounts equal the set's references) only without a cache.
    CHECK(pkv_seqset_validate(w->set, w->cache == NULL) == PKV_OK, "seqset invalid");
    if (w->cache) CHECK(pkv_prefix_cache_validate(w->cache) == PKV_OK, "prefix cache invalid");
}

// Run the queued copies, then the queued writes; then every live sequence must
// read back its model values.
static void flush(world *w) {
    pkv_block_copy copies[MAX_SEQS * MAX_LEN];
    uint32_t n = 0;
    CHECK(pkv_seqset_take_copies(w->set, copies, MAX_SEQS * MAX_LEN, &n) == PKV_OK, "take_copies");
    for (uint32_t i = 0; i < n; i++) {
        CHECK(copies[i].src >= 0 && (uint32_t)copies[i].src < w->capacity && copies[i].dst >= 0 &&
                  (uint32_t)copies[i].dst < w->capacity && copies[i].src != copies[i].dst,
              "bad copy %d -> %d", copies[i].src, copies[i].dst);
        for (uint32_t j = 0; j < i; j++) CHECK(copies[j].dst != copies[i].dst, "dst twice");
        memcpy(w->mem + (size_t)copies[i].dst * w->bs, w->mem + (size_t)copies[i].src * w->bs,
               w->bs * sizeof *w->mem);
    }
    for (uint32_t i = 0; i < w->num_writes; i++) {
        CHECK(w->writes[i].slot >= 0 && w->writes[i].slot < (int64_t)w->capacity * w->bs,
              "slot %lld", (long long)w->writes[i].slot);
        w->mem[w->writes[i].slot] = w->writes[i].value;
    }
    w->num_writes = 0;
    pkv_seq_id ids[MAX_SEQS];
    uint32_t nids = 0, total = 0;
    for (int k = 0; k < MAX_SEQS; k++) {
        const mseq *m = &w->seqs[k];
        if (!m->live) continue;
        const pkv_block_id *t;
        uint32_t nb;
        CHECK(pkv_seq_block_table(w->set, m->id, &t, &nb) == PKV_OK, "table");
        for (uint32_t p = 0; p < m->len; p++)
            CHECK(w->mem[(size_t)t[p / w->bs] * w->bs + p % w->bs] == m->val[p],
                  "seq %d position %u holds the wrong value", m->id, p);
        ids[nids++] = m->id;
        total += nb;
    }
    // The CSR export (FlashInfer layout) says the same as the block tables.
    static int32_t indices[MAX_SEQS * MAX_LEN];
    int32_t indptr[MAX_SEQS + 1], last[MAX_SEQS];
    if (nids == 0) return;
    if (total > 0)
        CHECK(pkv_seqset_export_csr(w->set, ids, nids, indptr, indices, total - 1, last) ==
                  PKV_ERR_BUFFER_TOO_SMALL,
              "short CSR buffer accepted");
    CHECK(pkv_seqset_export_csr(w->set, ids, nids, indptr, indices, total, last) == PKV_OK, "csr");
    CHECK(indptr[0] == 0 && (uint32_t)indptr[nids] == total, "indptr ends");
    for (uint32_t i = 0; i < nids; i++) {
        const pkv_block_id *t;
        uint32_t nb, len;
        CHECK(pkv_seq_block_table(w->set, ids[i], &t, &nb) == PKV_OK &&
                  pkv_seq_length(w->set, ids[i], &len) == PKV_OK, "table");
        CHECK((uint32_t)(indptr[i + 1] - indptr[i]) == nb, "csr row %u length", i);
        for (uint32_t j = 0; j < nb; j++) CHECK(indices[indptr[i] + (int32_t)j] == t[j], "csr entry");
        CHECK((uint32_t)last[i] == (len == 0 ? 0 : len - (nb - 1) * w->bs), "last_page_len %d", last[i]);
    }
}

// One operation on the bare pool, checked against its refcount model.
static void bare_op(world *w, uint8_t code, uint8_t arg) {
    const uint32_t free_before = pkv_pool_free_count(w->bare);
    // An id in -1 .. cap: out-of-range ids must be refused too.
    const pkv_block_id id = (pkv_block_id)(arg % (w->bare_cap + 2)) - 1;
    const int in_range = id >= 0 && (uint32_t)id < w->bare_cap;
    switch (code % 4) {
    case 0: { // alloc n, all or nothing
        const uint32_t n = arg % 8;
        pkv_block_id got[8];
        pkv_status st = pkv_pool_alloc(w->bare, n, got);
        if (n > free_before) {
            CHECK(st == PKV_ERR_OUT_OF_BLOCKS && pkv_pool_free_count(w->bare) == free_before,
                  "over-alloc");
            return;
        }
        CHECK(st == PKV_OK, "alloc %u of %u free: %d", n, free_before, (int)st);
        for (uint32_t i = 0; i < n; i++) {
            CHECK(got[i] >= 0 && (uint32_t)got[i] < w->bare_cap && w->bare_ref[got[i]] == 0,
                  "alloc gave block %d, not a free one", got[i]);
            w->bare_ref[got[i]] = 1;
        }
        return;
    }
    case 1: { // retain
        pkv_status st = pkv_pool_retain(w->bare, id);
        if (!in_range || w->bare_ref[id] == 0) {
            CHECK(st == PKV_ERR_NOT_FOUND, "retain of free/out-of-range %d: %d", id, (int)st);
            return;
        }
        CHECK(st == PKV_OK, "retain %d", id);
        w->bare_ref[id]++;
        return;
    }
    case 2: { // release
        pkv_status st = pkv_pool_release(w->bare, id);
        if (!in_range || w->bare_ref[id] == 0) {
            CHECK(st == PKV_ERR_NOT_FOUND, "release of free/out-of-range %d: %d", id, (int)st);
            return;
        }
        CHECK(st == PKV_OK, "release %d", id);
        w->bare_ref[id]--;
        return;
    }
    case 3: { // release_n of up to 3 ids (repeats allowed): all checked first
        pkv_block_id ids[3];
        const uint32_t n = 1 + arg % 3;
        int32_t need[64] = {0};
        int ok = 1;
        for (uint32_t i = 0; i < n; i++) {
            ids[i] = (pkv_block_id)(((uint32_t)arg * (i + 3u) + code) % (w->bare_cap + 2)) - 1;
            if (ids[i] < 0 || (uint32_t)ids[i] >= w->bare_cap) ok = 0;
            else need[ids[i]]++;
        }
        for (uint32_t b = 0; b < w->bare_cap && ok; b++)
            if (need[b] > w->bare_ref[b]) ok = 0;
        pkv_status st = pkv_pool_release_n(w->bare, ids, n);
        CHECK((st == PKV_OK) == ok, "release_n: status %d, model says %s", (int)st,
              ok ? "ok" : "refuse");
        if (!ok) {
            CHECK(pkv_pool_free_count(w->bare) == free_before, "refused release_n changed the pool");
            return;
        }
        for (uint32_t b = 0; b < w->bare_cap; b++) w->bare_ref[b] -= need[b];
        return;
    }
    }
}

static void bare_check(const world *w) {
    uint32_t nfree = 0;
    for (uint32_t b = 0; b < w->bare_cap; b++) {
        const int32_t rc = pkv_pool_refcount(w->bare, (pkv_block_id)b);
        CHECK(rc == w->bare_ref[b], "block %u refcount %d want %d", b, rc, w->bare_ref[b]);
        nfree += w->bare_ref[b] == 0;
    }
    CHECK(pkv_pool_free_count(w->bare) == nfree, "free count %u want %u",
          pkv_pool_free_count(w->bare), nfree);
    CHECK(pkv_pool_validate(w->bare) == PKV_OK, "bare pool invalid");
}

static void drop_writes(world *w, pkv_seq_id id) {
    uint32_t kept = 0;
    for (uint32_t i = 0; i < w->num_writes; i++)
        if (w->writes[i].owner != id) w->writes[kept++] = w->writes[i];
    w->num_writes = kept;
}

static mseq *slot_live(world *w, uint8_t b) {
    for (int k = 0; k < MAX_SEQS; k++) {
        mseq *m = &w->seqs[(b + k) % MAX_SEQS];
        if (m->live) return m;
    }
    return NULL;
}

static mseq *slot_empty(world *w) {
    for (int k = 0; k < MAX_SEQS; k++)
        if (!w->seqs[k].live) return &w->seqs[k];
    return NULL;
}

// Append n tokens (ids from a small alphabet so prefixes repeat).
static void append(world *w, mseq *m, uint32_t n, uint8_t salt) {
    if (m->len + n > MAX_LEN) n = MAX_LEN - m->len;
    if (n == 0) return;
    uint32_t need = 0, free_before = pkv_pool_free_count(w->pool);
    CHECK(pkv_seq_blocks_needed(w->set, m->id, n, &need) == PKV_OK, "blocks_needed");
    int64_t slots[MAX_LEN];
    pkv_status st = pkv_seq_append(w->set, m->id, n, slots);
    if (need > free_before) {
        CHECK(st == PKV_ERR_OUT_OF_BLOCKS, "append needing %u of %u free: status %d", need,
              free_before, (int)st);
        CHECK(pkv_pool_free_count(w->pool) == free_before, "failed append took blocks");
        return;
    }
    CHECK(st == PKV_OK, "append status %d", (int)st);
    CHECK(free_before - pkv_pool_free_count(w->pool) == need, "append took %u blocks, said %u",
          free_before - pkv_pool_free_count(w->pool), need);
    for (uint32_t i = 0; i < n; i++) {
        const uint32_t p = m->len + i;
        m->tok[p] = (int32_t)((salt + p * 7u) % 5u);
        m->val[p] = chain(value_at(m, p), m->tok[p]);
        w->writes[w->num_writes++] = (write){slots[i], m->val[p], m->id};
    }
    m->len += n;
}

static void op(world *w, uint8_t code, uint8_t arg) {
    mseq *m = slot_live(w, arg);
    switch (code % 8) {
    case 0: { // create (cached when a cache is attached and arg is odd)
        mseq *e = slot_empty(w);
        if (!e) return;
        memset(e, 0, sizeof *e);
        if (w->cache && (arg & 1)) {
            // The prompt: tokens the same rule as append gives, so prompts repeat.
            int32_t toks[MAX_LEN];
            const uint32_t n = 1 + arg % 64u;
            for (uint32_t p = 0; p < n; p++) toks[p] = (int32_t)(((arg >> 1) % 3u + p * 7u) % 5u);
            uint32_t cached = 0;
            pkv_status st = pkv_seq_create_cached(w->set, w->cache, toks, n, &e->id, &cached);
            CHECK(st == PKV_OK, "create_cached status %d", (int)st);
            CHECK(cached % w->bs == 0 && cached < n, "cached %u of %u", cached, n);
            e->live = 1;
            for (uint32_t p = 0; p < cached; p++) {
                e->tok[p] = toks[p];
                e->val[p] = chain(value_at(e, p), toks[p]);
            }
            e->len = cached;
            // Hit blocks must already hold exactly this prefix's values.
            flush(w);
            return;
        }
        CHECK(pkv_seq_create(w->set, &e->id) == PKV_OK, "create");
        e->live = 1;
        return;
    }
    case 1:
    case 2: // append
        if (m) append(w, m, 1 + arg % (code & 8 ? 3 * w->bs : 3), (uint8_t)(arg >> 2));
        return;
    case 3: { // fork: only written K/V is forked (an engine forks after the step)
        mseq *e = slot_empty(w);
        if (!m || !e) return;
        flush(w);
        const uint32_t free_before = pkv_pool_free_count(w->pool);
        pkv_seq_id id;
        CHECK(pkv_seq_fork(w->set, m->id, &id) == PKV_OK, "fork");
        CHECK(pkv_pool_free_count(w->pool) == free_before, "fork took blocks");
        *e = *m;
        e->id = id;
        return;
    }
    case 4: // free
        if (!m) return;
        drop_writes(w, m->id);
        CHECK(pkv_seq_free(w->set, m->id) == PKV_OK, "free");
        m->live = 0;
        return;
    case 5:
        flush(w);
        return;
    case 6: { // offer a sequence's full blocks to the cache (K/V written first)
        if (!w->cache || !m) return;
        flush(w);
        const uint32_t n = m->len - (arg % 4 == 0 ? m->len % (w->bs + 1) : 0);
        CHECK(pkv_prefix_cache_insert(w->cache, w->set, m->id, m->tok, n, NULL) == PKV_OK, "insert");
        return;
    }
    case 7: { // reclaim
        if (!w->cache) return;
        const uint32_t need = arg % (w->capacity + 2);
        pkv_status st = pkv_prefix_cache_reclaim(w->cache, need);
        CHECK(st == PKV_OK || st == PKV_ERR_OUT_OF_BLOCKS, "reclaim status %d", (int)st);
        CHECK((st == PKV_OK) == (pkv_pool_free_count(w->pool) >= need), "reclaim %u: status %d, %u free",
              need, (int)st, pkv_pool_free_count(w->pool));
        return;
    }
    }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (size < 3) return 0;
    static world w; // large: not on the stack
    memset(&w, 0, sizeof w);
    static const uint32_t sizes[] = {1, 2, 4, 16};
    w.bs = sizes[data[0] % 4];
    w.capacity = 1 + data[1] % 64;
    const int with_cache = data[2] & 1;
    CHECK(pkv_pool_create(w.capacity, &w.pool) == PKV_OK, "pool");
    CHECK(pkv_seqset_create(w.pool, w.bs, &w.set) == PKV_OK, "set");
    if (with_cache) {
        CHECK(pkv_prefix_cache_create(w.pool, w.bs, 1 + (data[2] >> 1) % 64, &w.cache) == PKV_OK,
              "cache");
        CHECK(pkv_prefix_cache_attach(w.cache, w.set) == PKV_OK, "attach");
    }
    w.mem = calloc((size_t)w.capacity * w.bs, sizeof *w.mem);
    CHECK(w.mem != NULL, "mem");
    w.bare_cap = 1 + data[0] / 4 % 64;
    CHECK(pkv_pool_create(w.bare_cap, &w.bare) == PKV_OK, "bare pool");
    for (size_t i = 3; i + 1 < size; i += 2) {
        // Codes 0xC0 and up drive the bare pool; the rest the sequences.
        if (data[i] >= 0xC0) {
            bare_op(&w, data[i], data[i + 1]);
            bare_check(&w);
        } else {
            op(&w, data[i], data[i + 1]);
            check_state(&w);
        }
    }
    pkv_pool_destroy(w.bare);
    flush(&w);
    // Nothing lost: free everything, reclaim the cache, every block is free.
    for (int k = 0; k < MAX_SEQS; k++) {
        if (!w.seqs[k].live) continue;
        CHECK(pkv_seq_free(w.set, w.seqs[k].id) == PKV_OK, "final free");
        w.seqs[k].live = 0;
    }
    check_state(&w);
    if (w.cache) {
        CHECK(pkv_prefix_cache_reclaim(w.cache, w.capacity) == PKV_OK,
              "cache alone cannot give back every block (%u of %u free)",
              pkv_pool_free_count(w.pool), w.capacity);
        pkv_prefix_stats s;
        CHECK(pkv_prefix_cache_get_stats(w.cache, &s) == PKV_OK && s.entries == 0, "entries left");
    }
    CHECK(pkv_pool_free_count(w.pool) == w.capacity, "blocks lost: %u of %u free",
          pkv_pool_free_count(w.pool), w.capacity);
    pkv_seqset_destroy(w.set);
    pkv_prefix_cache_destroy(w.cache);
    pkv_pool_destroy(w.pool);
    free(w.mem);
    return 0;
}

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
//
// Codes 0x80..0xBF (issue 20) reach the rest of the API, each against the same
// model: fork_at and truncate; pkv_seq_move and pkv_seq_move_group (with empty
// sequences in the group) to a second ("host") set on its own pool and back,
// the data carried by the returned pairs and read back on both sides, sharing
// kept (one pair per distinct block); the refcount limit (a block's refcount
// set to INT32_MAX through the pool's internal layout: retain and fork refuse
// with PKV_ERR_LIMIT and change nothing); a second attach (again: no-op; to a
// second cache: PKV_ERR_BUSY); eviction order (two prompts cached one after
// the other, then one block reclaimed: the older one loses its last block);
// and the padded export beside the CSR one after every flush.
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "pkv/pool.h"
#include "pkv/prefix.h"
#include "pkv/seq.h"
#include "pool_internal.h" // the refcount limit: a refcount set near INT32_MAX

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
    uint32_t cache_cap;      // its max_entries
    uint32_t *mem;           // [capacity * bs]
    // The host side of moves: its own pool, set and memory ([capacity * bs]).
    pkv_pool *hpool;
    pkv_seqset *hset;
    uint32_t *hmem;
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
    // The padded export (vLLM layout): the same tables, padded, widest first.
    uint32_t mx = 0;
    uint64_t tot = 0;
    CHECK(pkv_seqset_export_size(w->set, ids, nids, &mx, &tot) == PKV_OK && tot == total, "size");
    static int32_t table[MAX_SEQS * MAX_LEN];
    int32_t lens[MAX_SEQS];
    if (mx > 0)
        CHECK(pkv_seqset_export_padded(w->set, ids, nids, mx - 1, -7, table, lens) ==
                  PKV_ERR_BUFFER_TOO_SMALL, "narrow padded table accepted");
    const uint32_t width = mx ? mx : 1;
    CHECK(pkv_seqset_export_padded(w->set, ids, nids, width, -7, table, lens) == PKV_OK, "padded");
    for (uint32_t i = 0; i < nids; i++) {
        const pkv_block_id *t;
        uint32_t nb, len;
        CHECK(pkv_seq_block_table(w->set, ids[i], &t, &nb) == PKV_OK &&
                  pkv_seq_length(w->set, ids[i], &len) == PKV_OK, "table");
        CHECK((uint32_t)lens[i] == len, "padded lens %d", lens[i]);
        for (uint32_t j = 0; j < width; j++)
            CHECK(table[i * width + j] == (j < nb ? t[j] : -7), "padded entry %u,%u", i, j);
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

// ---- issue 20: the rest of the API ----

// Every live sequence's values, read through `set`'s tables from `mem`.
static void check_values(const world *w, const pkv_seqset *set, const uint32_t *mem,
                         const mseq *m, pkv_seq_id id) {
    const pkv_block_id *t;
    uint32_t nb, len;
    CHECK(pkv_seq_block_table(set, id, &t, &nb) == PKV_OK && pkv_seq_length(set, id, &len) == PKV_OK &&
              len == m->len, "moved seq %d: len %u want %u", id, len, m->len);
    for (uint32_t p = 0; p < m->len; p++)
        CHECK(mem[(size_t)t[p / w->bs] * w->bs + p % w->bs] == m->val[p],
              "moved seq %d position %u holds the wrong value", id, p);
}

// Carry the data of `pairs` (src in `from`, dst in `to`), as pkv_cache_transfer.
static void carry(const world *w, const pkv_block_copy *pairs, uint32_t n, const uint32_t *from,
                  uint32_t *to, uint32_t to_cap) {
    for (uint32_t i = 0; i < n; i++) {
        CHECK(pairs[i].src >= 0 && (uint32_t)pairs[i].src < w->capacity && pairs[i].dst >= 0 &&
                  (uint32_t)pairs[i].dst < to_cap, "bad pair %d -> %d", pairs[i].src, pairs[i].dst);
        CHECK(i == 0 || pairs[i].src > pairs[i - 1].src, "pairs not in increasing src order");
        memcpy(to + (size_t)pairs[i].dst * w->bs, from + (size_t)pairs[i].src * w->bs,
               w->bs * sizeof *to);
    }
}

// Distinct blocks in the tables of ids[0..n-1].
static uint32_t distinct_blocks(const pkv_seqset *set, const pkv_seq_id *ids, uint32_t n) {
    pkv_block_id seen[MAX_SEQS * MAX_LEN];
    uint32_t d = 0;
    for (uint32_t i = 0; i < n; i++) {
        const pkv_block_id *t;
        uint32_t nb;
        CHECK(pkv_seq_block_table(set, ids[i], &t, &nb) == PKV_OK, "table");
        for (uint32_t j = 0; j < nb; j++) {
            uint32_t k = 0;
            while (k < d && seen[k] != t[j]) k++;
            if (k == d) seen[d++] = t[j];
        }
    }
    return d;
}

// Move up to four live sequences (and, on odd arg, a fresh empty one) to the
// host set as a group, check them there, and move them back.
static void move_round_trip(world *w, uint8_t arg) {
    flush(w); // the queued copies run before a move
    mseq *g[MAX_SEQS];
    pkv_seq_id ids[MAX_SEQS], hids[MAX_SEQS], back[MAX_SEQS];
    uint32_t n = 0;
    for (int k = 0; k < MAX_SEQS && n < 1u + arg % 4; k++) {
        mseq *m = &w->seqs[(arg + k) % MAX_SEQS];
        if (m->live) g[n++] = m;
    }
    mseq *e = (arg & 1) ? slot_empty(w) : NULL;
    if (e) { // an empty sequence in the group (defect 8)
        memset(e, 0, sizeof *e);
        CHECK(pkv_seq_create(w->set, &e->id) == PKV_OK, "create");
        e->live = 1;
        g[n++] = e;
    }
    if (n == 0) return;
    for (uint32_t i = 0; i < n; i++) ids[i] = g[i]->id;
    const uint32_t d = distinct_blocks(w->set, ids, n);
    const uint32_t live = pkv_seqset_live_count(w->set), hfree = pkv_pool_free_count(w->hpool);
    pkv_block_copy pairs[MAX_SEQS * MAX_LEN];
    uint32_t np = 0;
    pkv_status st;
    if (n == 1 && (arg & 2)) // one sequence: pkv_seq_move
        st = pkv_seq_move(w->set, ids[0], w->hset, &hids[0], pairs, MAX_SEQS * MAX_LEN, &np);
    else
        st = pkv_seq_move_group(w->set, ids, n, w->hset, hids, pairs, MAX_SEQS * MAX_LEN, &np);
    if (st == PKV_ERR_OUT_OF_BLOCKS) {
        CHECK(d > hfree, "move of %u blocks refused with %u free", d, hfree);
        CHECK(pkv_seqset_live_count(w->set) == live && pkv_pool_free_count(w->hpool) == hfree,
              "a refused move changed something");
        return;
    }
    CHECK(st == PKV_OK, "move status %d", (int)st);
    CHECK(np == d, "%u pairs for %u distinct blocks", np, d);
    CHECK(hfree - pkv_pool_free_count(w->hpool) == d, "host took %u blocks for %u",
          hfree - pkv_pool_free_count(w->hpool), d);
    carry(w, pairs, np, w->mem, w->hmem, w->capacity);
    for (uint32_t i = 0; i < n; i++) check_values(w, w->hset, w->hmem, g[i], hids[i]);
    CHECK(distinct_blocks(w->hset, hids, n) == d, "sharing lost on the host");
    CHECK(pkv_seqset_validate(w->hset, 1) == PKV_OK, "host set invalid");
    // And back (into the device set's pool, which has at least d blocks now
    // unless a cache or another sequence still holds the moved ones).
    const uint32_t free_dev = pkv_pool_free_count(w->pool);
    for (uint32_t i = 0; i < n; i++) ids[i] = hids[i];
    // The host set has no other reference: swap its pairs' direction is enough.
    pkv_block_copy bp[MAX_SEQS * MAX_LEN];
    st = pkv_seq_move_group(w->hset, ids, n, w->set, back, bp, MAX_SEQS * MAX_LEN, &np);
    if (st == PKV_ERR_OUT_OF_BLOCKS) {
        CHECK(d > free_dev, "move back of %u blocks refused with %u free", d, free_dev);
        // Stranded on the host: free them there (the model forgets them).
        CHECK(pkv_seqset_free_batch(w->hset, ids, n) == PKV_OK, "free on host");
        for (uint32_t i = 0; i < n; i++) {
            drop_writes(w, g[i]->id);
            g[i]->live = 0;
        }
        return;
    }
    CHECK(st == PKV_OK && np == d, "move back: status %d, %u pairs for %u", (int)st, np, d);
    // Pairs index the host pool as src: carry from host memory.
    for (uint32_t i = 0; i < np; i++) {
        CHECK(bp[i].dst >= 0 && (uint32_t)bp[i].dst < w->capacity, "bad pair back");
        memcpy(w->mem + (size_t)bp[i].dst * w->bs, w->hmem + (size_t)bp[i].src * w->bs,
               w->bs * sizeof *w->mem);
    }
    for (uint32_t i = 0; i < n; i++) {
        g[i]->id = back[i];
        check_values(w, w->set, w->mem, g[i], back[i]);
    }
    CHECK(pkv_pool_free_count(w->hpool) == w->capacity, "host blocks lost");
}

// A block's refcount at INT32_MAX: retain and fork refuse, nothing changes.
static void refcount_limit(world *w, mseq *m) {
    if (!m || m->len == 0) return;
    flush(w);
    const pkv_block_id *t;
    uint32_t nb;
    CHECK(pkv_seq_block_table(w->set, m->id, &t, &nb) == PKV_OK && nb > 0, "table");
    const pkv_block_id b = t[nb - 1];
    const int32_t was = w->pool->refcount[b];
    w->pool->refcount[b] = INT32_MAX - 1;
    CHECK(pkv_pool_retain(w->pool, b) == PKV_OK, "retain to INT32_MAX");
    CHECK(pkv_pool_retain(w->pool, b) == PKV_ERR_LIMIT, "retain past INT32_MAX");
    CHECK(pkv_pool_refcount(w->pool, b) == INT32_MAX, "refused retain changed the refcount");
    const uint32_t live = pkv_seqset_live_count(w->set), free_before = pkv_pool_free_count(w->pool);
    pkv_seq_id child;
    CHECK(pkv_seq_fork(w->set, m->id, &child) == PKV_ERR_LIMIT, "fork past the refcount limit");
    CHECK(pkv_seqset_live_count(w->set) == live && pkv_pool_free_count(w->pool) == free_before &&
              pkv_pool_refcount(w->pool, b) == INT32_MAX, "a refused fork changed something");
    w->pool->refcount[b] = was;
}

// Attaching again is a no-op; a second cache finds the set busy.
static void second_attach(world *w) {
    if (!w->cache) return;
    CHECK(pkv_prefix_cache_attach(w->cache, w->set) == PKV_OK, "attach again");
    pkv_prefix_cache *other;
    CHECK(pkv_prefix_cache_create(w->pool, w->bs, 4, &other) == PKV_OK, "second cache");
    CHECK(pkv_prefix_cache_attach(other, w->set) == PKV_ERR_BUSY, "set attached to two caches");
    CHECK(pkv_prefix_cache_detach(other, w->set) == PKV_ERR_NOT_FOUND, "detach from the wrong cache");
    const pkv_status st = pkv_prefix_cache_attach(other, w->hset);
    CHECK(st == PKV_ERR_INVALID_ARG, "a set of another pool attached: status %d", (int)st);
    pkv_prefix_cache_destroy(other);
    CHECK(pkv_prefix_cache_validate(w->cache) == PKV_OK, "cache invalid after a second attach");
}

// Cache one prompt of `blocks` full blocks starting with token `first`, then
// free its sequence (its blocks are left to the cache alone).
static int cache_prompt(world *w, int32_t first, uint32_t blocks) {
    int32_t toks[MAX_LEN];
    const uint32_t n = blocks * w->bs;
    for (uint32_t p = 0; p < n; p++) toks[p] = first + (int32_t)p;
    pkv_seq_id id;
    CHECK(pkv_seq_create(w->set, &id) == PKV_OK, "create");
    if (pkv_seq_append(w->set, id, n, NULL) != PKV_OK) {
        CHECK(pkv_seq_free(w->set, id) == PKV_OK, "free");
        return -1;
    }
    CHECK(pkv_prefix_cache_insert(w->cache, w->set, id, toks, n, NULL) == PKV_OK, "insert");
    CHECK(pkv_seq_free(w->set, id) == PKV_OK, "free");
    return 0;
}

static uint32_t cached_blocks(const world *w, int32_t first, uint32_t blocks) {
    int32_t toks[MAX_LEN];
    const uint32_t n = blocks * w->bs + 1; // one more token: the whole prompt can hit
    for (uint32_t p = 0; p < n; p++) toks[p] = first + (int32_t)p;
    pkv_prefix_match mt;
    CHECK(pkv_prefix_cache_match(w->cache, toks, n, &mt) == PKV_OK, "match");
    return mt.cached_blocks;
}

// LRU: of two prompts left to the cache, the older loses its last block first.
static void eviction_order(world *w, uint8_t arg) {
    if (!w->cache) return;
    flush(w);
    (void)pkv_prefix_cache_reclaim(w->cache, w->capacity); // evict all that can go
    const uint32_t blocks = 1 + arg % 2;
    // Tokens outside the model's alphabet (0..4): no hit on older entries.
    const int32_t a = 1000 + 10 * (arg >> 2), b = a + 500;
    pkv_prefix_stats st;
    CHECK(pkv_prefix_cache_get_stats(w->cache, &st) == PKV_OK, "stats");
    if (pkv_pool_free_count(w->pool) < 2 * blocks + 1 || st.entries + 2 * blocks > w->cache_cap) return;
    if (cache_prompt(w, a, blocks) != 0 || cache_prompt(w, b, blocks) != 0) return;
    CHECK(cached_blocks(w, a, blocks) == blocks && cached_blocks(w, b, blocks) == blocks,
          "both prompts cached");
    const uint64_t ev = (pkv_prefix_cache_get_stats(w->cache, &st), st.evictions);
    const uint32_t need = pkv_pool_free_count(w->pool) + 1;
    CHECK(pkv_prefix_cache_reclaim(w->cache, need) == PKV_OK, "reclaim one block");
    CHECK(pkv_pool_free_count(w->pool) == need, "reclaim went past its need");
    CHECK(pkv_prefix_cache_get_stats(w->cache, &st) == PKV_OK && st.evictions == ev + 1, "one eviction");
    CHECK(cached_blocks(w, a, blocks) == blocks - 1 && cached_blocks(w, b, blocks) == blocks,
          "eviction order: the newer prompt lost a block before the older (%u, %u of %u)",
          cached_blocks(w, a, blocks), cached_blocks(w, b, blocks), blocks);
}

// Codes 0x80..0xBF: the operations of issue 20.
static void op2(world *w, uint8_t code, uint8_t arg) {
    mseq *m = slot_live(w, arg);
    switch (code % 8) {
    case 0: { // fork_at: the child shares the first len tokens
        mseq *e = slot_empty(w);
        if (!m || !e) return;
        flush(w);
        const uint32_t len = arg % (m->len + 1), free_before = pkv_pool_free_count(w->pool);
        pkv_seq_id id;
        CHECK(pkv_seq_fork_at(w->set, m->id, m->len + 1, &id) == PKV_ERR_INVALID_ARG,
              "fork_at past the end");
        CHECK(pkv_seq_fork_at(w->set, m->id, len, &id) == PKV_OK, "fork_at");
        CHECK(pkv_pool_free_count(w->pool) == free_before, "fork_at took blocks");
        *e = *m;
        e->id = id;
        e->len = len;
        return;
    }
    case 1: { // truncate
        if (!m) return;
        flush(w);
        const uint32_t len = arg % (m->len + 1);
        CHECK(pkv_seq_truncate(w->set, m->id, m->len + 1) == PKV_ERR_INVALID_ARG,
              "truncate past the end");
        CHECK(pkv_seq_truncate(w->set, m->id, len) == PKV_OK, "truncate");
        m->len = len;
        return;
    }
    case 2:
    case 3: move_round_trip(w, arg); return;
    case 4: refcount_limit(w, m); return;
    case 5: second_attach(w); return;
    case 6: eviction_order(w, arg); return;
    case 7: { // bare pool: a block at the refcount limit
        const pkv_block_id b = (pkv_block_id)(arg % w->bare_cap);
        if (w->bare_ref[b] == 0) return;
        const int32_t was = w->bare->refcount[b];
        w->bare->refcount[b] = INT32_MAX;
        CHECK(pkv_pool_retain(w->bare, b) == PKV_ERR_LIMIT, "retain past INT32_MAX");
        CHECK(pkv_pool_release(w->bare, b) == PKV_OK && pkv_pool_refcount(w->bare, b) == INT32_MAX - 1,
              "release from the limit");
        w->bare->refcount[b] = was;
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
        w.cache_cap = 1 + (data[2] >> 1) % 64;
        CHECK(pkv_prefix_cache_create(w.pool, w.bs, w.cache_cap, &w.cache) == PKV_OK, "cache");
        CHECK(pkv_prefix_cache_attach(w.cache, w.set) == PKV_OK, "attach");
    }
    w.mem = calloc((size_t)w.capacity * w.bs, sizeof *w.mem);
    CHECK(w.mem != NULL, "mem");
    CHECK(pkv_pool_create(w.capacity, &w.hpool) == PKV_OK, "host pool");
    CHECK(pkv_seqset_create(w.hpool, w.bs, &w.hset) == PKV_OK, "host set");
    w.hmem = calloc((size_t)w.capacity * w.bs, sizeof *w.hmem);
    CHECK(w.hmem != NULL, "host mem");
    w.bare_cap = 1 + data[0] / 4 % 64;
    CHECK(pkv_pool_create(w.bare_cap, &w.bare) == PKV_OK, "bare pool");
    for (size_t i = 3; i + 1 < size; i += 2) {
        // Codes 0xC0 and up drive the bare pool; the rest the sequences.
        if (data[i] >= 0xC0) {
            bare_op(&w, data[i], data[i + 1]);
            bare_check(&w);
        } else if (data[i] >= 0x80) {
            op2(&w, data[i], data[i + 1]);
            check_state(&w);
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
    CHECK(pkv_seqset_live_count(w.hset) == 0 && pkv_pool_free_count(w.hpool) == w.capacity,
          "host blocks lost");
    pkv_seqset_destroy(w.hset);
    pkv_pool_destroy(w.hpool);
    free(w.hmem);
    pkv_seqset_destroy(w.set);
    pkv_prefix_cache_destroy(w.cache);
    pkv_pool_destroy(w.pool);
    free(w.mem);
    return 0;
}

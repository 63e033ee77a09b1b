// SPDX-License-Identifier: MIT
// The prefix pool (include/pkv/prefix_pool.h) against the older prefix cache
// (include/pkv/prefix.h), side by side in one run:
//   hit:  a 2048-token prompt (block 16: 128 blocks) found again and shared: lookup of
//         the request's carried block hashes + touch (pool) / pkv_seq_create_cached
//         (cache, which hashes the tokens itself); release timed separately;
//   miss: a new 2048-token prompt: hash its blocks (xxh3-128 or FNV-1a, SHA-256 off;
//         SHA-256 shown too), lookup, allocate, insert;
//   incremental insert: one newly filled block at prefix length L: its hash from the
//         carried chain + allocate + insert (pool) / pkv_prefix_cache_insert with the
//         whole prefix (cache), for L = 1k..32k tokens.
// Usage: bench_prefix_pool [rounds]   (default 2000 prompts per figure)
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bench_clock.h"
#include "pkv/block_hash.h"
#include "pkv/prefix.h"
#include "pkv/prefix_pool.h"

#define BS 16u
#define PROMPT 2048u
#define NB (PROMPT / BS)

static void die(const char *what, pkv_status st) {
    fprintf(stderr, "bench_prefix_pool: %s: %s\n", what, pkv_status_str(st));
    exit(1);
}
#define CHECK(call) do { pkv_status s_ = (call); if (s_ != PKV_OK) die(#call, s_); } while (0)

// Per-prompt samples: the median per block is the figure (the machine is shared and
// loaded; a mean would measure the other tenants).
static int cmp_d(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}
static double median_ns_per_block(double *v, uint32_t n, uint32_t blocks) {
    qsort(v, n, sizeof *v, cmp_d);
    return v[n / 2] * 1e9 / blocks;
}

static void fill(int32_t *t, uint32_t n, uint32_t seed) {
    for (uint32_t i = 0; i < n; i++) t[i] = (int32_t)((seed * 2654435761u + i * 40503u) % 50000u);
}

static void hash_prompt(const pkv_hasher *h, const int32_t *t, pkv_block_hash *out) {
    pkv_hash_chain c;
    pkv_hash_chain_init(&c);
    for (uint32_t b = 0; b < NB; b++) CHECK(pkv_hash_chain_next(h, &c, t + b * BS, BS, NULL, &out[b]));
}

// ns per block of: hit (find + touch), its release, and a miss (hash + find + allocate +
// insert) through the prefix pool with hasher h.
static void pool_figures(pkv_hash_algo algo, uint32_t rounds, double *hit, double *rel, double *miss) {
    pkv_hasher *h;
    CHECK(pkv_hasher_create(algo, "bench", 5, &h));
    pkv_prefix_pool_params prm = pkv_prefix_pool_params_default(NB * 64 + 1);
    pkv_prefix_pool *p;
    CHECK(pkv_prefix_pool_create(&prm, &p));
    int32_t *tok = malloc(PROMPT * sizeof *tok);
    pkv_block_hash *hs = malloc(NB * sizeof *hs);
    pkv_block_id ids[NB], got[NB], rev[NB];
    double *t_hit = malloc(rounds * sizeof *t_hit), *t_rel = malloc(rounds * sizeof *t_rel),
           *t_miss = malloc(rounds * sizeof *t_miss);
    uint32_t hits;
    // Hits: one prompt cached, found again and again (the queue keeps it: refcount 0).
    fill(tok, PROMPT, 1);
    hash_prompt(h, tok, hs);
    CHECK(pkv_prefix_pool_get_new_blocks(p, NB, ids));
    pkv_block_store st = {.n = NB, .blocks = ids, .hashes = hs, .tokens = tok, .block_size = BS,
                          .lora_id = PKV_NO_LORA};
    CHECK(pkv_prefix_pool_cache_blocks(p, &st));
    for (uint32_t i = 0; i < NB; i++) rev[i] = ids[NB - 1 - i];
    CHECK(pkv_prefix_pool_free_blocks(p, rev, NB));
    for (uint32_t r = 0; r < rounds; r++) {
        double t0 = now();
        CHECK(pkv_prefix_pool_find_prefix(p, 0, hs, NB, got, &hits));
        CHECK(pkv_prefix_pool_touch(p, got, hits));
        double t1 = now();
        if (hits != NB) die("hit run found a miss", PKV_ERR_CORRUPT);
        for (uint32_t i = 0; i < NB; i++) rev[i] = got[NB - 1 - i];
        CHECK(pkv_prefix_pool_free_blocks(p, rev, NB));
        double t2 = now();
        t_hit[r] = t1 - t0;
        t_rel[r] = t2 - t1;
    }
    // Misses: new prompts; the queue evicts older cached blocks lazily as it goes.
    for (uint32_t r = 0; r < rounds; r++) {
        fill(tok, PROMPT, 1000 + r);
        double t0 = now();
        hash_prompt(h, tok, hs);
        CHECK(pkv_prefix_pool_find_prefix(p, 0, hs, NB, got, &hits));
        CHECK(pkv_prefix_pool_get_new_blocks(p, NB - hits, ids));
        st.n = NB - hits;
        st.hashes = hs + hits;
        st.blocks = ids;
        CHECK(pkv_prefix_pool_cache_blocks(p, &st));
        t_miss[r] = now() - t0;
        for (uint32_t i = 0; i < st.n; i++) rev[i] = ids[st.n - 1 - i];
        CHECK(pkv_prefix_pool_free_blocks(p, rev, st.n));
    }
    CHECK(pkv_prefix_pool_validate(p));
    *hit = median_ns_per_block(t_hit, rounds, NB);
    *rel = median_ns_per_block(t_rel, rounds, NB);
    *miss = median_ns_per_block(t_miss, rounds, NB);
    free(t_hit);
    free(t_rel);
    free(t_miss);
    free(tok);
    free(hs);
    pkv_prefix_pool_destroy(p);
    pkv_hasher_destroy(h);
}

// The older cache: create_cached (hash + lookup + share) and the release, per block.
static void cache_figures(uint32_t rounds, double *hit, double *rel, double *miss) {
    pkv_pool *pool;
    pkv_seqset *set;
    pkv_prefix_cache *c;
    CHECK(pkv_pool_create(NB * 64, &pool));
    CHECK(pkv_seqset_create(pool, BS, &set));
    CHECK(pkv_prefix_cache_create(pool, BS, NB * 32, &c));
    CHECK(pkv_prefix_cache_attach(c, set));
    int32_t *tok = malloc((PROMPT + 1) * sizeof *tok);
    fill(tok, PROMPT + 1, 1);
    pkv_seq_id id;
    uint32_t cached;
    CHECK(pkv_seq_create_cached(set, c, tok, PROMPT + 1, &id, &cached));
    CHECK(pkv_seq_append(set, id, PROMPT + 1 - cached, NULL));
    CHECK(pkv_prefix_cache_insert(c, set, id, tok, PROMPT, NULL));
    CHECK(pkv_seq_free(set, id));
    double *t_hit = malloc(rounds * sizeof *t_hit), *t_rel = malloc(rounds * sizeof *t_rel),
           *t_miss = malloc(rounds * sizeof *t_miss);
    for (uint32_t r = 0; r < rounds; r++) {
        double t0 = now();
        CHECK(pkv_seq_create_cached(set, c, tok, PROMPT + 1, &id, &cached));
        double t1 = now();
        CHECK(pkv_seq_free(set, id));
        double t2 = now();
        if (cached != PROMPT) die("old cache missed", PKV_ERR_CORRUPT);
        t_hit[r] = t1 - t0;
        t_rel[r] = t2 - t1;
    }
    for (uint32_t r = 0; r < rounds; r++) {
        fill(tok, PROMPT + 1, 1000 + r);
        double t0 = now();
        CHECK(pkv_prefix_cache_reclaim(c, NB + 1));
        CHECK(pkv_seq_create_cached(set, c, tok, PROMPT + 1, &id, &cached));
        CHECK(pkv_seq_append(set, id, PROMPT + 1 - cached, NULL));
        CHECK(pkv_prefix_cache_insert(c, set, id, tok, PROMPT, NULL));
        t_miss[r] = now() - t0;
        CHECK(pkv_seq_free(set, id));
    }
    *hit = median_ns_per_block(t_hit, rounds, NB);
    *rel = median_ns_per_block(t_rel, rounds, NB);
    *miss = median_ns_per_block(t_miss, rounds, NB);
    free(t_hit);
    free(t_rel);
    free(t_miss);
    free(tok);
    pkv_seqset_destroy(set);
    pkv_prefix_cache_destroy(c);
    pkv_pool_destroy(pool);
}

// One newly filled block at prefix length len tokens: ns per insert, pool vs cache.
static void incremental(uint32_t len, uint32_t reps, double *pool_ns, double *cache_ns) {
    const uint32_t nb = len / BS + 1;
    int32_t *tok = malloc((size_t)(len + BS) * sizeof *tok);
    fill(tok, len + BS, 7);
    pkv_hasher *h;
    CHECK(pkv_hasher_create(PKV_HASH_XXH3_128, NULL, 0, &h));
    pkv_prefix_pool_params prm = pkv_prefix_pool_params_default(nb + 2);
    pkv_prefix_pool *p;
    CHECK(pkv_prefix_pool_create(&prm, &p));
    pkv_hash_chain chain, saved;
    pkv_hash_chain_init(&chain);
    pkv_block_hash hb;
    for (uint32_t b = 0; b < len / BS; b++) CHECK(pkv_hash_chain_next(h, &chain, tok + b * BS, BS, NULL, &hb));
    saved = chain;
    double *ts = malloc(reps * sizeof *ts);
    pkv_block_id id;
    for (uint32_t r = 0; r < reps; r++) {
        chain = saved;
        double t0 = now();
        CHECK(pkv_hash_chain_next(h, &chain, tok + len, BS, NULL, &hb));
        CHECK(pkv_prefix_pool_get_new_blocks(p, 1, &id));
        pkv_block_store st = {.n = 1, .blocks = &id, .hashes = &hb, .parent = &saved.last,
                              .tokens = tok + len, .block_size = BS, .lora_id = PKV_NO_LORA};
        CHECK(pkv_prefix_pool_cache_blocks(p, &st));
        ts[r] = now() - t0;
        CHECK(pkv_prefix_pool_evict_block(p, id));
        CHECK(pkv_prefix_pool_free_blocks(p, &id, 1));
    }
    *pool_ns = median_ns_per_block(ts, reps, 1);
    pkv_prefix_pool_destroy(p);
    pkv_hasher_destroy(h);

    // The older cache: the prefix's blocks are cached; insert the sequence one block
    // longer (it re-hashes the whole prefix to chain to the new block).
    pkv_pool *pool;
    pkv_seqset *set;
    pkv_prefix_cache *c;
    CHECK(pkv_pool_create(nb + 2, &pool));
    CHECK(pkv_seqset_create(pool, BS, &set));
    CHECK(pkv_prefix_cache_create(pool, BS, nb + 2, &c));
    CHECK(pkv_prefix_cache_attach(c, set));
    pkv_seq_id sid;
    CHECK(pkv_seq_create(set, &sid));
    CHECK(pkv_seq_append(set, sid, len + BS, NULL));
    CHECK(pkv_prefix_cache_insert(c, set, sid, tok, len, NULL));
    reps = reps / 20 + 1; // each call is O(len)
    for (uint32_t r = 0; r < reps; r++) {
        // Hash order matters, not which block: re-insert the prefix + the new block,
        // then take the new block out again by tokens the cache has never seen.
        tok[len] ^= (int32_t)(r + 1);
        uint32_t added;
        double t0 = now();
        CHECK(pkv_prefix_cache_insert(c, set, sid, tok, len + BS, &added));
        ts[r] = now() - t0;
        if (added != 1) die("old cache did not add the block", PKV_ERR_CORRUPT);
        // Make room again: the new entry's block is the sequence's last one, still held,
        // so free the sequence and rebuild it (untimed).
        CHECK(pkv_seq_free(set, sid));
        CHECK(pkv_prefix_cache_reclaim(c, nb + 2));
        CHECK(pkv_seq_create(set, &sid));
        CHECK(pkv_seq_append(set, sid, len + BS, NULL));
        CHECK(pkv_prefix_cache_insert(c, set, sid, tok, len, NULL));
    }
    *cache_ns = median_ns_per_block(ts, reps, 1);
    free(ts);
    pkv_seqset_destroy(set);
    pkv_prefix_cache_destroy(c);
    pkv_pool_destroy(pool);
    free(tok);
}

int main(int argc, char **argv) {
    uint32_t rounds = argc > 1 ? (uint32_t)strtoul(argv[1], NULL, 10) : 2000;
    if (rounds == 0) {
        fprintf(stderr, "bench_prefix_pool: rounds must be >= 1\n");
        return 2;
    }
    double ph, pr, pm, xh, xr, xm, sh, sr, sm, ch, cr, cm;
    cache_figures(rounds, &ch, &cr, &cm);
    pool_figures(PKV_HASH_XXH3_128, rounds, &xh, &xr, &xm);
    pool_figures(PKV_HASH_FNV1A_64, rounds, &ph, &pr, &pm);
    pool_figures(PKV_HASH_SHA256, rounds / 4 + 1, &sh, &sr, &sm);
    printf("2048-token prompts, block 16, %u prompts per figure; median ns per block\n", rounds);
    printf("%-38s %8s %8s %8s\n", "", "hit", "release", "miss");
    printf("%-38s %8.1f %8.1f %8.1f\n", "prefix cache (prefix.h, internal hash)", ch, cr, cm);
    printf("%-38s %8.1f %8.1f %8.1f\n", "prefix pool, xxh3-128", xh, xr, xm);
    printf("%-38s %8.1f %8.1f %8.1f\n", "prefix pool, fnv1a-64", ph, pr, pm);
    printf("%-38s %8.1f %8.1f %8.1f\n", "prefix pool, sha256", sh, sr, sm);
    printf("hit ratio cache/pool(xxh3) %.2fx, miss ratio %.2fx\n", ch / xh, cm / xm);
    printf("\nincremental insert of one block at prefix length L (median ns per block)\n");
    printf("%8s %12s %12s %8s\n", "L", "pool", "cache", "ratio");
    const uint32_t lens[] = {1024, 4096, 16384, 32768};
    for (int i = 0; i < 4; i++) {
        double a, b;
        incremental(lens[i], rounds * 4, &a, &b);
        printf("%8u %12.1f %12.1f %7.0fx\n", lens[i], a, b, b / a);
    }
    return 0;
}

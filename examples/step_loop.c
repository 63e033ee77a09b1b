// SPDX-License-Identifier: MIT
// The README's engine step loop ("In an engine's step loop"), as a complete
// program: admission through the prefix cache, a batched decode step with its
// copy-on-write copies, a speculative rollback, a positional fork, a swap-out of
// two siblings that keeps their sharing, and the batch free of finished requests.
// Built and run by the test suite; tests/readme_snippets.py checks that every
// statement of the README's excerpt is one of this file's.
#include <stdio.h>

#include <pkv/pkv.h>

#define CHECK(call)                                                                \
    do {                                                                           \
        pkv_status st_ = (call);                                                   \
        if (st_ != PKV_OK) {                                                       \
            fprintf(stderr, "%s:%d: %s: %s\n", __FILE__, __LINE__, #call,          \
                    pkv_status_str(st_));                                          \
            return 1;                                                              \
        }                                                                          \
    } while (0)

// Admit one prompt of n tokens if the pool can take it (the README's admission
// lines), then prefill it and offer its full blocks to the cache; *admitted = 0
// when it does not fit. Returns 1 on an error.
static int admit(pkv_seqset *seqs, pkv_prefix_cache *pc, pkv_pool *pool, const int32_t *prompt,
                 uint32_t n, pkv_seq_id *id_out, uint32_t *cached_out, int *admitted) {
    pkv_prefix_match m;
    pkv_seq_id id = 0;
    uint32_t c = 0;
    *admitted = 0;
    CHECK(pkv_prefix_cache_match(pc, prompt, n, &m));                  // admission probe: no side effects
    if (m.new_blocks <= pkv_pool_free_count(pool)) CHECK(pkv_seq_create_cached(seqs, pc, prompt, n, &id, &c));
    else return 0; // it waits: not admitted
    *admitted = 1;
    CHECK(pkv_seq_append(seqs, id, n - c, NULL)); // the prompt tokens not cached
    // ... prefill them (pkv_attn_prefill_* writes their K/V), then:
    CHECK(pkv_prefix_cache_insert(pc, seqs, id, prompt, n, NULL));
    *id_out = id;
    *cached_out = c;
    return 0;
}

int main(void) {
    // Two pools: the device's blocks and the host swap space's. A 2-layer model,
    // 2 KV heads x 64 dims, fp16, 16-token blocks: 16 KiB a block.
    pkv_pool *pool, *host_pool;
    pkv_backend *host;
    pkv_cache *cache;
    pkv_seqset *seqs, *host_seqs;
    pkv_prefix_cache *pc;
    CHECK(pkv_pool_create(256, &pool));
    CHECK(pkv_pool_create(256, &host_pool));
    CHECK(pkv_backend_create_host(&host));
    pkv_cache_params p = pkv_cache_params_default();
    p.num_layers = 2;
    p.kv_heads = 2;
    p.head_dim = 64;
    p.block_size = 16;
    CHECK(pkv_cache_create(&p, pool, host, &cache));
    CHECK(pkv_seqset_create(pool, p.block_size, &seqs));
    CHECK(pkv_seqset_create(host_pool, p.block_size, &host_seqs));
    CHECK(pkv_prefix_cache_create(pool, p.block_size, 1024, &pc));
    CHECK(pkv_prefix_cache_attach(pc, seqs));
    void *stream = NULL; // a cudaStream_t with a CUDA backend; the host copies at once

    CHECK(pkv_seqset_set_watermark(seqs, 64));                         // keep 64 blocks for growth

    // Two requests with the same 40-token prompt: the second reuses two blocks.
    int32_t prompt[40];
    const uint32_t n = 40;
    for (uint32_t i = 0; i < n; i++) prompt[i] = 1000 + (int32_t)i;
    pkv_seq_id a, b;
    uint32_t cached_a, cached_b;
    int ok_a, ok_b;
    if (admit(seqs, pc, pool, prompt, n, &a, &cached_a, &ok_a) ||
        admit(seqs, pc, pool, prompt, n, &b, &cached_b, &ok_b))
        return 1;
    if (!ok_a || !ok_b) {
        fprintf(stderr, "step_loop: a prompt was not admitted\n");
        return 1;
    }
    printf("admitted: first prompt %u cached tokens, second %u\n", cached_a, cached_b);

    // Parallel sampling of the first request: a sibling sharing every block.
    pkv_seq_id sib;
    CHECK(pkv_seq_fork(seqs, a, &sib));

    // One decode step for the three running sequences, all or nothing.
    pkv_seq_id ids[3] = {a, sib, b};
    const uint32_t counts[3] = {1, 1, 1};
    uint32_t k = 3;
    uint32_t need;
    int64_t slots[3];
    CHECK(pkv_seqset_blocks_needed_batch(seqs, ids, counts, k, &need)); // forked siblings counted once
    CHECK(pkv_seqset_append_batch(seqs, ids, counts, k, slots));       // slots: sum(counts) entries
    CHECK(pkv_cache_apply_copies(cache, seqs, stream));                // one kernel launch, no sync
    printf("step: %u new blocks, slots %lld %lld %lld\n", need, (long long)slots[0],
           (long long)slots[1], (long long)slots[2]);

    // Speculative decoding on b: 4 draft tokens, 1 accepted.
    pkv_seq_id id = b;
    uint32_t len;
    CHECK(pkv_seq_length(seqs, id, &len));
    CHECK(pkv_seq_append(seqs, id, 4, NULL));
    len += 1;
    CHECK(pkv_seq_truncate(seqs, id, len));                            // speculative decoding rollback

    // A new request continuing the first 20 tokens of b.
    pkv_seq_id parent = b, child;
    len = 20;
    CHECK(pkv_seq_fork_at(seqs, parent, len, &child));                 // share a prefix of a sequence

    // Preemption by swap: a and its sibling go to the host, their shared blocks once.
    pkv_seq_id new_ids[2];
    pkv_block_copy pairs[16];
    const uint32_t cap = 16;
    uint32_t np;
    k = 2; // ids[0] and ids[1]: a and its sibling
    CHECK(pkv_seq_move_group(seqs, ids, k, host_seqs, new_ids, pairs, cap, &np)); // swap, sharing kept
    printf("swapped out 2 siblings: %u block copies\n", np);
    // ... copy the K/V of pairs[i].src (device) to pairs[i].dst (host) ...

    // b and the forked request finish.
    pkv_seq_id done[2] = {b, child};
    const uint32_t nd = 2;
    CHECK(pkv_seqset_free_batch(seqs, done, nd));

    CHECK(pkv_seqset_validate(seqs, 0));
    CHECK(pkv_seqset_validate(host_seqs, 1));
    printf("free blocks: device %u of 256 (the prefix cache keeps the prompt's), host %u\n",
           pkv_pool_free_count(pool), pkv_pool_free_count(host_pool));
    pkv_seqset_destroy(host_seqs);
    pkv_seqset_destroy(seqs); // before the cache it is attached to
    pkv_prefix_cache_destroy(pc);
    pkv_cache_destroy(cache);
    pkv_backend_destroy(host);
    pkv_pool_destroy(host_pool);
    pkv_pool_destroy(pool);
    return 0;
}

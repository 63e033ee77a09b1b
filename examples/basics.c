// SPDX-License-Identifier: MIT
// The README's example: a pool-backed KV cache, two sequences sharing a prompt
// by fork, copy-on-write, and the block tables an attention kernel reads.
// Built and run by the test suite, and tests/readme_snippets.py checks that every
// statement of the README's excerpt is one of this file's: the README cannot drift
// from the API.
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

int main(void) {
    // Llama-2-7B's cache shape: 32 layers x 32 kv heads x 128 dims, fp16, 16-token
    // blocks: 8 MiB a block. 8 blocks here; a server would size the pool to its GPU.
    pkv_pool *pool;
    pkv_backend *host;
    pkv_cache *cache;
    pkv_seqset *seqs;
    const uint32_t num_blocks = 8;
    CHECK(pkv_pool_create(num_blocks, &pool));
    CHECK(pkv_backend_create_host(&host)); // or pkv_backend_create_cuda(0, &dev)
    pkv_cache_params p = pkv_cache_params_default();
    p.num_layers = 32;
    p.kv_heads = 32;
    p.head_dim = 128;
    p.block_size = 16;
    p.dtype = PKV_DTYPE_F16;
    CHECK(pkv_cache_create(&p, pool, host, &cache)); // the one backend allocation
    CHECK(pkv_seqset_create(pool, p.block_size, &seqs));

    // A 20-token prompt: two blocks, the second one partly filled.
    pkv_seq_id prompt, sample;
    int64_t slots[20];
    CHECK(pkv_seq_create(seqs, &prompt));
    CHECK(pkv_seq_append(seqs, prompt, 20, slots)); // slots[i]: where token i's K/V go
    // ... write K/V of the 20 tokens (pkv_attn_cache_write_cpu) ...

    // Parallel sampling: the second sample shares both blocks.
    CHECK(pkv_seq_fork(seqs, prompt, &sample));
    // Its first new token lands in the shared, partly filled block: copy-on-write.
    CHECK(pkv_seq_append(seqs, sample, 1, slots));
    CHECK(pkv_cache_apply_copies(cache, seqs, NULL)); // one batched backend copy

    // Block tables for the attention kernel, vLLM style (padded) ...
    pkv_seq_id ids[2] = {prompt, sample};
    const uint32_t n = 2, max_blocks = 4;
    int32_t table[2 * 4], lens[2];
    CHECK(pkv_seqset_export_padded(seqs, ids, n, max_blocks, -1, table, lens));
    printf("prompt: %d tokens, blocks %d %d\n", lens[0], table[0], table[1]);
    printf("sample: %d tokens, blocks %d %d (block 0 shared, block 1 copied)\n", lens[1],
           table[4], table[5]);
    // ... or FlashInfer style (CSR: indptr, indices, last page length).
    int32_t indptr[3], indices[8], last_len[2];
    const uint32_t cap = 8;
    CHECK(pkv_seqset_export_csr(seqs, ids, n, indptr, indices, cap, last_len));
    printf("csr: indptr %d %d %d, last pages %d %d tokens\n", indptr[0], indptr[1], indptr[2],
           last_len[0], last_len[1]);

    // An engine step: both sequences decode one token in one call (all or nothing),
    // with the slot mapping of the whole batch; then speculative tokens rolled back.
    const uint32_t counts[2] = {1, 1};
    uint32_t need;
    CHECK(pkv_seqset_blocks_needed_batch(seqs, ids, counts, 2, &need));
    CHECK(pkv_seqset_append_batch(seqs, ids, counts, 2, slots));
    CHECK(pkv_cache_apply_copies(cache, seqs, NULL));
    printf("step: %u new blocks, slots %lld %lld\n", need, (long long)slots[0], (long long)slots[1]);
    CHECK(pkv_seq_append(seqs, sample, 4, NULL)); // 4 draft tokens ...
    CHECK(pkv_seq_truncate(seqs, sample, 23));    // ... of which 1 accepted

    pkv_backend_stats st;
    CHECK(pkv_backend_get_stats(host, &st));
    printf("backend allocation calls: %llu\n", (unsigned long long)st.alloc_calls);

    CHECK(pkv_seqset_validate(seqs, 1)); // every block accounted for
    pkv_seqset_destroy(seqs);            // releases both sequences' blocks
    pkv_cache_destroy(cache);
    pkv_backend_destroy(host);
    pkv_pool_destroy(pool);
    return 0;
}

// SPDX-License-Identifier: MIT
// An out-of-tree C program built against the installed package (tests/install/
// run.sh): one engine step through the batch API, an admission probe and a host
// cache over the program's own memory. Links libpagedkv-core or libpagedkv.
#include <stdio.h>
#include <stdlib.h>

#include <pkv/cache.h>
#include <pkv/prefix.h>
#include <pkv/seq.h>
#include <pkv/version.h>

#define CHECK(call)                                                                        \
    do {                                                                                   \
        pkv_status st_ = (call);                                                           \
        if (st_ != PKV_OK) {                                                               \
            fprintf(stderr, "%s:%d: %s: %s\n", __FILE__, __LINE__, #call, pkv_status_str(st_)); \
            return 1;                                                                      \
        }                                                                                  \
    } while (0)

int main(void) {
    if (pkv_version() != PKV_VERSION) {
        fprintf(stderr, "header version %d, library %d\n", PKV_VERSION, pkv_version());
        return 1;
    }
    pkv_pool *pool;
    pkv_seqset *set;
    pkv_prefix_cache *pc;
    CHECK(pkv_pool_create(64, &pool));
    CHECK(pkv_seqset_create(pool, 16, &set));
    CHECK(pkv_prefix_cache_create(pool, 16, 32, &pc));
    CHECK(pkv_prefix_cache_attach(pc, set));
    pkv_seq_id ids[8];
    uint32_t counts[8];
    for (int i = 0; i < 8; i++) {
        CHECK(pkv_seq_create(set, &ids[i]));
        counts[i] = 1;
    }
    uint32_t need;
    int64_t slots[8];
    CHECK(pkv_seqset_blocks_needed_batch(set, ids, counts, 8, &need));
    CHECK(pkv_seqset_append_batch(set, ids, counts, 8, slots));
    int32_t tokens[40] = {0};
    pkv_prefix_match m;
    CHECK(pkv_prefix_cache_match(pc, tokens, 40, &m));
    // A cache over memory this program owns.
    pkv_backend *host;
    pkv_cache *cache;
    CHECK(pkv_backend_create_host(&host));
    pkv_cache_params p = pkv_cache_params_default();
    p.head_dim = 8;
    uint64_t bytes = pkv_cache_bytes_per_block(&p) * pkv_pool_capacity(pool);
    void *mem = calloc(1, bytes);
    CHECK(pkv_cache_create_external(&p, pool, host, mem, bytes, &cache));
    CHECK(pkv_cache_apply_copies(cache, set, NULL));
    CHECK(pkv_seqset_free_batch(set, ids, 8));
    printf("consumer (C): %u blocks for the step, %u new for the prompt, version %s\n", need,
           m.new_blocks, PKV_VERSION_STRING);
    pkv_cache_destroy(cache);
    free(mem);
    pkv_backend_destroy(host);
    pkv_seqset_destroy(set);
    pkv_prefix_cache_destroy(pc);
    pkv_pool_destroy(pool);
    return need == 8 && m.new_blocks == 3 ? 0 : 1;
}

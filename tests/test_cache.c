// SPDX-License-Identifier: MIT
// KV-cache storage on the host backend: sizes, addresses of every block, one
// backend allocation, and data surviving copy-on-write.
#include <criterion/criterion.h>
#include <string.h>

#include "pkv/cache.h"

static pkv_cache_params params(uint32_t layers, uint32_t heads, uint32_t dim, uint32_t bs,
                               pkv_dtype dtype, pkv_layout layout) {
    pkv_cache_params p = pkv_cache_params_default();
    p.num_layers = layers;
    p.kv_heads = heads;
    p.head_dim = dim;
    p.block_size = bs;
    p.dtype = dtype;
    p.layout = layout;
    return p;
}

Test(cache, bytes_per_token_follows_the_formula) {
    // DESIGN.md: GPT-3 175B, 96 layers, 96 heads x 128, fp16, 2048 tokens = 9,663,676,416 bytes.
    pkv_cache_params p = params(96, 96, 128, 16, PKV_DTYPE_F16, PKV_LAYOUT_HND);
    cr_assert_eq(pkv_cache_bytes_per_token(&p) * 2048, 9663676416ull);
    cr_assert_eq(pkv_cache_bytes_per_block(&p), pkv_cache_bytes_per_token(&p) * 16);
    p.dtype = PKV_DTYPE_F32;
    cr_assert_eq(pkv_cache_bytes_per_token(&p), 2ull * 96 * 96 * 128 * 4);
    p.head_dim = 0;
    cr_assert_eq(pkv_cache_bytes_per_token(&p), 0);
    cr_assert_eq(pkv_cache_bytes_per_token(NULL), 0);
    cr_assert_eq(pkv_dtype_size(PKV_DTYPE_BF16), 2);
    cr_assert_eq(pkv_dtype_size((pkv_dtype)9), 0);
    cr_assert_str_eq(pkv_dtype_name(PKV_DTYPE_BF16), "bf16");
    cr_assert_str_eq(pkv_dtype_name((pkv_dtype)9), "unknown");
}

Test(cache, one_backend_allocation_and_exact_addresses) {
    pkv_pool *pool;
    pkv_backend *be;
    pkv_cache *cache;
    cr_assert_eq(pkv_pool_create(10, &pool), PKV_OK);
    cr_assert_eq(pkv_backend_create_host(&be), PKV_OK);
    const pkv_layout layouts[2] = {PKV_LAYOUT_HND, PKV_LAYOUT_NHD};
    for (int li = 0; li < 2; li++) {
        pkv_cache_params p = params(3, 2, 8, 4, PKV_DTYPE_F32, layouts[li]);
        cr_assert_eq(pkv_cache_create(&p, pool, be, &cache), PKV_OK);
        cr_assert_eq(pkv_cache_arena_bytes(cache), 10 * pkv_cache_bytes_per_block(&p));
        pkv_cache_geometry g;
        cr_assert_eq(pkv_cache_get_geometry(cache, &g), PKV_OK);
        cr_assert_eq(g.half_block_bytes, 2 * 4 * 8 * 4);
        // Write a distinct value at every (layer, block, kv, head, token, dim) via
        // the strides and read it back via pkv_cache_block_ptr: both views agree and
        // no two elements share an address.
        float *base = pkv_cache_data(cache);
        size_t total = pkv_cache_arena_bytes(cache) / sizeof(float);
        memset(base, 0, total * sizeof(float));
        float v = 1.0f;
        for (uint32_t l = 0; l < 3; l++)
            for (int32_t b = 0; b < 10; b++)
                for (int kv = 0; kv < 2; kv++)
                    for (uint32_t h = 0; h < 2; h++)
                        for (uint32_t t = 0; t < 4; t++)
                            for (uint32_t d = 0; d < 8; d++) {
                                uint64_t e = g.layer_stride * l + g.block_stride * b +
                                             g.kv_stride * kv + g.head_stride * h +
                                             g.token_stride * t + d;
                                cr_assert_lt(e, total);
                                cr_assert_eq(base[e], 0.0f, "two elements share an address");
                                base[e] = v++;
                            }
        cr_assert_eq((size_t)(v - 1.0f), total, "every element is addressed once");
        void *ptr;
        cr_assert_eq(pkv_cache_block_ptr(cache, 2, 7, PKV_V, &ptr), PKV_OK);
        uint64_t e = g.layer_stride * 2 + g.block_stride * 7 + g.kv_stride;
        cr_assert_eq(ptr, (void *)(base + e));
        cr_assert_eq(pkv_cache_block_ptr(cache, 3, 0, PKV_K, &ptr), PKV_ERR_INVALID_ARG);
        cr_assert_null(ptr);
        cr_assert_eq(pkv_cache_block_ptr(cache, 0, 10, PKV_K, &ptr), PKV_ERR_NOT_FOUND);
        cr_assert_eq(pkv_cache_block_ptr(cache, 0, -1, PKV_K, &ptr), PKV_ERR_NOT_FOUND);
        cr_assert_eq(pkv_cache_block_ptr(cache, 0, 0, (pkv_kv)5, &ptr), PKV_ERR_INVALID_ARG);
        pkv_cache_destroy(cache);
    }
    pkv_backend_stats st;
    cr_assert_eq(pkv_backend_get_stats(be, &st), PKV_OK);
    cr_assert_eq(st.alloc_calls, 2, "one backend allocation per cache");
    cr_assert_eq(st.free_calls, 2);
    cr_assert_eq(st.bytes_live, 0);
    pkv_cache_destroy(NULL);
    pkv_backend_destroy(be);
    pkv_pool_destroy(pool);
}

Test(cache, create_rejects_bad_params) {
    pkv_pool *pool;
    pkv_backend *be;
    pkv_cache *cache = (pkv_cache *)1;
    cr_assert_eq(pkv_pool_create(4, &pool), PKV_OK);
    cr_assert_eq(pkv_backend_create_host(&be), PKV_OK);
    pkv_cache_params p = pkv_cache_params_default();
    p.num_layers = 0;
    cr_assert_eq(pkv_cache_create(&p, pool, be, &cache), PKV_ERR_INVALID_ARG);
    cr_assert_null(cache);
    p = pkv_cache_params_default();
    p.dtype = (pkv_dtype)7;
    cr_assert_eq(pkv_cache_create(&p, pool, be, &cache), PKV_ERR_INVALID_ARG);
    p = pkv_cache_params_default();
    p.layout = (pkv_layout)3;
    cr_assert_eq(pkv_cache_create(&p, pool, be, &cache), PKV_ERR_INVALID_ARG);
    p = pkv_cache_params_default();
    cr_assert_eq(pkv_cache_create(&p, NULL, be, &cache), PKV_ERR_INVALID_ARG);
    cr_assert_eq(pkv_cache_create(&p, pool, NULL, &cache), PKV_ERR_INVALID_ARG);
    cr_assert_eq(pkv_cache_create(NULL, pool, be, &cache), PKV_ERR_INVALID_ARG);
    cr_assert_eq(pkv_cache_create(&p, pool, be, NULL), PKV_ERR_INVALID_ARG);
    // An arena the backend cannot provide: a clear status, no crash.
    p.num_layers = 1u << 20;
    p.kv_heads = 1u << 10;
    p.head_dim = 1u << 10;
    cr_assert_eq(pkv_cache_create(&p, pool, be, &cache), PKV_ERR_OUT_OF_MEMORY);
    pkv_backend_stats st;
    cr_assert_eq(pkv_backend_get_stats(be, &st), PKV_OK);
    cr_assert_eq(st.bytes_live, 0);
    pkv_backend_destroy(be);
    pkv_pool_destroy(pool);
}

// Fill block `b` (all layers, K and V) with a pattern derived from `seed`.
static void fill_block(pkv_cache *cache, uint32_t layers, pkv_block_id b, unsigned seed) {
    for (uint32_t l = 0; l < layers; l++)
        for (int kv = 0; kv < 2; kv++) {
            unsigned char *p;
            cr_assert_eq(pkv_cache_block_ptr(cache, l, b, (pkv_kv)kv, (void **)&p), PKV_OK);
            pkv_cache_geometry g;
            pkv_cache_get_geometry(cache, &g);
            for (uint64_t i = 0; i < g.half_block_bytes; i++)
                p[i] = (unsigned char)(seed * 31 + l * 7 + kv * 3 + i);
        }
}

static int block_equals(pkv_cache *cache, uint32_t layers, pkv_block_id a, pkv_block_id b) {
    pkv_cache_geometry g;
    pkv_cache_get_geometry(cache, &g);
    for (uint32_t l = 0; l < layers; l++)
        for (int kv = 0; kv < 2; kv++) {
            void *pa, *pb;
            pkv_cache_block_ptr(cache, l, a, (pkv_kv)kv, &pa);
            pkv_cache_block_ptr(cache, l, b, (pkv_kv)kv, &pb);
            if (memcmp(pa, pb, g.half_block_bytes) != 0) return 0;
        }
    return 1;
}

Test(cache, data_survives_copy_on_write) {
    const uint32_t layers = 2, bs = 4;
    pkv_pool *pool;
    pkv_backend *be;
    pkv_cache *cache;
    pkv_seqset *set;
    cr_assert_eq(pkv_pool_create(8, &pool), PKV_OK);
    cr_assert_eq(pkv_backend_create_host(&be), PKV_OK);
    pkv_cache_params p = params(layers, 2, 16, bs, PKV_DTYPE_F16, PKV_LAYOUT_HND);
    cr_assert_eq(pkv_cache_create(&p, pool, be, &cache), PKV_OK);
    cr_assert_eq(pkv_seqset_create(pool, bs, &set), PKV_OK);

    pkv_seq_id parent, child;
    cr_assert_eq(pkv_seq_create(set, &parent), PKV_OK);
    cr_assert_eq(pkv_seq_append(set, parent, bs + 2, NULL), PKV_OK);
    const pkv_block_id *t;
    uint32_t n;
    cr_assert_eq(pkv_seq_block_table(set, parent, &t, &n), PKV_OK);
    pkv_block_id shared_full = t[0], shared_partial = t[1];
    fill_block(cache, layers, shared_full, 1);
    fill_block(cache, layers, shared_partial, 2);
    // A reference copy of the partial block's bytes, to check it stays untouched.
    pkv_block_id ref_copy;
    cr_assert_eq(pkv_pool_alloc(pool, 1, &ref_copy), PKV_OK);
    fill_block(cache, layers, ref_copy, 2);

    cr_assert_eq(pkv_seq_fork(set, parent, &child), PKV_OK);
    cr_assert_eq(pkv_seq_append(set, child, 1, NULL), PKV_OK);
    cr_assert_eq(pkv_cache_apply_copies(cache, set, NULL), PKV_OK);
    cr_assert_eq(pkv_seqset_pending_copies(set), 0);
    cr_assert_eq(pkv_seq_block_table(set, child, &t, &n), PKV_OK);
    cr_assert_eq(t[0], shared_full);
    cr_assert_neq(t[1], shared_partial);
    cr_assert(block_equals(cache, layers, t[1], shared_partial), "the copy holds the same bytes");
    // Now the child writes its new token: the parent's block must not change.
    fill_block(cache, layers, t[1], 9);
    cr_assert(block_equals(cache, layers, ref_copy, shared_partial), "the original is untouched");
    cr_assert_not(block_equals(cache, layers, t[1], shared_partial));

    pkv_backend_stats st;
    cr_assert_eq(pkv_backend_get_stats(be, &st), PKV_OK);
    cr_assert_eq(st.alloc_calls, 1, "copy-on-write never calls the backend allocator");
    cr_assert_eq(st.copy_calls, 1);
    cr_assert_eq(st.bytes_copied, layers * 2 * 2 * bs * 16 * 2);
    cr_assert_eq(pkv_pool_release(pool, ref_copy), PKV_OK);
    cr_assert_eq(pkv_cache_apply_copies(cache, set, NULL), PKV_OK, "nothing pending is fine");
    cr_assert_eq(pkv_cache_get_params(cache, &p), PKV_OK);
    cr_assert_eq(p.block_size, bs);

    // A set of another block size does not fit this cache.
    pkv_seqset *other;
    cr_assert_eq(pkv_seqset_create(pool, bs * 2, &other), PKV_OK);
    cr_assert_eq(pkv_cache_apply_copies(cache, other, NULL), PKV_ERR_INVALID_ARG);
    pkv_seqset_destroy(other);
    pkv_block_copy bad = {0, 99};
    cr_assert_eq(pkv_cache_copy_blocks(cache, &bad, 1, NULL), PKV_ERR_INVALID_ARG);

    pkv_seqset_destroy(set);
    cr_assert_eq(pkv_pool_free_count(pool), 8);
    pkv_cache_destroy(cache);
    pkv_backend_destroy(be);
    pkv_pool_destroy(pool);
}

// Swap a forked sequence out to a host pool and back: the data comes back
// intact, the sharer keeps its blocks, and no block is lost on either side.
Test(cache, swap_out_and_in_keeps_data) {
    const uint32_t layers = 2, bs = 4;
    pkv_pool *dev_pool, *host_pool;
    pkv_backend *be;
    pkv_cache *dev, *host;
    pkv_seqset *dev_set, *host_set;
    cr_assert_eq(pkv_pool_create(6, &dev_pool), PKV_OK);
    cr_assert_eq(pkv_pool_create(4, &host_pool), PKV_OK);
    cr_assert_eq(pkv_backend_create_host(&be), PKV_OK);
    pkv_cache_params p = params(layers, 2, 8, bs, PKV_DTYPE_BF16, PKV_LAYOUT_NHD);
    cr_assert_eq(pkv_cache_create(&p, dev_pool, be, &dev), PKV_OK);
    cr_assert_eq(pkv_cache_create(&p, host_pool, be, &host), PKV_OK);
    cr_assert_eq(pkv_seqset_create(dev_pool, bs, &dev_set), PKV_OK);
    cr_assert_eq(pkv_seqset_create(host_pool, bs, &host_set), PKV_OK);

    pkv_seq_id a, b;
    cr_assert_eq(pkv_seq_create(dev_set, &a), PKV_OK);
    cr_assert_eq(pkv_seq_append(dev_set, a, 2 * bs + 1, NULL), PKV_OK); // 3 blocks
    const pkv_block_id *t;
    uint32_t n;
    cr_assert_eq(pkv_seq_block_table(dev_set, a, &t, &n), PKV_OK);
    pkv_block_id orig[3] = {t[0], t[1], t[2]};
    for (int i = 0; i < 3; i++) fill_block(dev, layers, orig[i], 10 + i);
    cr_assert_eq(pkv_seq_fork(dev_set, a, &b), PKV_OK); // b shares all three

    pkv_block_copy pairs[4];
    pkv_seq_id h, back;
    cr_assert_eq(pkv_seq_move(dev_set, a, host_set, &h, pairs, 2, &n), PKV_ERR_BUFFER_TOO_SMALL);
    cr_assert_eq(pkv_seq_move(dev_set, a, dev_set, &h, pairs, 4, &n), PKV_ERR_INVALID_ARG,
                 "same pool");
    cr_assert_eq(pkv_seq_move(dev_set, a, host_set, &h, pairs, 4, &n), PKV_OK);
    cr_assert_eq(n, 3);
    cr_assert_eq(pkv_cache_transfer(host, dev, pairs, n, NULL), PKV_OK);
    uint32_t len;
    cr_assert_eq(pkv_seq_length(dev_set, a, &len), PKV_ERR_NOT_FOUND, "moved away");
    cr_assert_eq(pkv_seq_length(host_set, h, &len), PKV_OK);
    cr_assert_eq(len, 2 * bs + 1);
    cr_assert_eq(pkv_pool_free_count(dev_pool), 3, "b still holds the shared blocks");
    for (int i = 0; i < 3; i++) cr_assert_eq(pkv_pool_refcount(dev_pool, orig[i]), 1);

    // Overwrite the device blocks (as reuse would), then swap back in.
    cr_assert_eq(pkv_seq_free(dev_set, b), PKV_OK);
    for (int i = 0; i < 3; i++) fill_block(dev, layers, orig[i], 99);
    pkv_seq_id big;
    cr_assert_eq(pkv_seq_create(dev_set, &big), PKV_OK);
    cr_assert_eq(pkv_seq_append(dev_set, big, 4 * bs, NULL), PKV_OK); // 2 left, 3 needed
    cr_assert_eq(pkv_seq_move(host_set, h, dev_set, &back, pairs, 4, &n), PKV_ERR_OUT_OF_BLOCKS);
    cr_assert_eq(pkv_pool_free_count(dev_pool), 2, "a refused move takes nothing");
    cr_assert_eq(pkv_seq_length(host_set, h, &len), PKV_OK, "and keeps the sequence");
    cr_assert_eq(pkv_seq_free(dev_set, big), PKV_OK);
    cr_assert_eq(pkv_seq_move(host_set, h, dev_set, &back, pairs, 4, &n), PKV_OK);
    cr_assert_eq(pkv_cache_transfer(dev, host, pairs, n, NULL), PKV_OK);
    cr_assert_eq(pkv_seq_block_table(dev_set, back, &t, &n), PKV_OK);
    cr_assert_eq(n, 3);
    // Compare against freshly filled reference blocks in the host cache.
    pkv_block_id ref[3];
    cr_assert_eq(pkv_pool_alloc(host_pool, 3, ref), PKV_OK);
    for (int i = 0; i < 3; i++) {
        fill_block(host, layers, ref[i], 10 + i);
        void *pd, *ph;
        pkv_cache_geometry g;
        pkv_cache_get_geometry(dev, &g);
        for (uint32_t l = 0; l < layers; l++)
            for (int kv = 0; kv < 2; kv++) {
                pkv_cache_block_ptr(dev, l, t[i], (pkv_kv)kv, &pd);
                pkv_cache_block_ptr(host, l, ref[i], (pkv_kv)kv, &ph);
                cr_assert_eq(memcmp(pd, ph, g.half_block_bytes), 0, "block %d layer %u", i, l);
            }
    }
    cr_assert_eq(pkv_pool_release_n(host_pool, ref, 3), PKV_OK);
    cr_assert_eq(pkv_seqset_validate(dev_set, 1), PKV_OK);
    cr_assert_eq(pkv_seqset_validate(host_set, 1), PKV_OK);
    cr_assert_eq(pkv_pool_free_count(host_pool), 4);

    pkv_cache_params other = p;
    other.head_dim = 16;
    pkv_cache *odd;
    cr_assert_eq(pkv_cache_create(&other, host_pool, be, &odd), PKV_OK);
    cr_assert_eq(pkv_cache_transfer(odd, dev, pairs, 1, NULL), PKV_ERR_INVALID_ARG, "shapes differ");
    cr_assert_eq(pkv_cache_transfer(dev, dev, pairs, 1, NULL), PKV_ERR_INVALID_ARG);
    pkv_cache_destroy(odd);

    pkv_seqset_destroy(dev_set);
    pkv_seqset_destroy(host_set);
    cr_assert_eq(pkv_pool_free_count(dev_pool), 6);
    pkv_cache_destroy(dev);
    pkv_cache_destroy(host);
    pkv_backend_destroy(be);
    pkv_pool_destroy(dev_pool);
    pkv_pool_destroy(host_pool);
}

// ---- issue 10: group swap with content, external memory, the one-launch copy ----

// Four forked samples (6 distinct blocks) swapped out to a host cache and back as
// a group: 6 host blocks, and every sample reads its own bytes back.
Test(cache, group_swap_keeps_sharing_and_content) {
    const uint32_t layers = 3, bs = 4;
    pkv_pool *dev_pool, *host_pool;
    pkv_backend *be;
    pkv_cache *dev, *host;
    pkv_seqset *dev_set, *host_set;
    cr_assert_eq(pkv_pool_create(16, &dev_pool), PKV_OK);
    cr_assert_eq(pkv_pool_create(8, &host_pool), PKV_OK);
    cr_assert_eq(pkv_backend_create_host(&be), PKV_OK);
    pkv_cache_params p = params(layers, 2, 4, bs, PKV_DTYPE_F16, PKV_LAYOUT_HND);
    cr_assert_eq(pkv_cache_create(&p, dev_pool, be, &dev), PKV_OK);
    cr_assert_eq(pkv_cache_create(&p, host_pool, be, &host), PKV_OK);
    cr_assert_eq(pkv_seqset_create(dev_pool, bs, &dev_set), PKV_OK);
    cr_assert_eq(pkv_seqset_create(host_pool, bs, &host_set), PKV_OK);
    pkv_seq_id s[4];
    cr_assert_eq(pkv_seq_create(dev_set, &s[0]), PKV_OK);
    cr_assert_eq(pkv_seq_append(dev_set, s[0], 2 * bs + 1, NULL), PKV_OK);
    for (int i = 1; i < 4; i++) cr_assert_eq(pkv_seq_fork(dev_set, s[0], &s[i]), PKV_OK);
    const uint32_t ones[4] = {1, 1, 1, 1};
    cr_assert_eq(pkv_seqset_append_batch(dev_set, s, ones, 4, NULL), PKV_OK);
    cr_assert_eq(pkv_cache_apply_copies(dev, dev_set, NULL), PKV_OK);
    // Give every distinct block its own bytes; remember them per (sample, block).
    pkv_block_id tables[4][3];
    for (int i = 0; i < 4; i++) {
        const pkv_block_id *t;
        uint32_t n;
        cr_assert_eq(pkv_seq_block_table(dev_set, s[i], &t, &n), PKV_OK);
        cr_assert_eq(n, 3);
        memcpy(tables[i], t, sizeof tables[i]);
        for (uint32_t j = 0; j < 3; j++) fill_block(dev, layers, t[j], 100 + (unsigned)t[j]);
    }
    pkv_block_copy pairs[8];
    pkv_seq_id h[4], back[4];
    uint32_t np;
    cr_assert_eq(pkv_seq_move_group(dev_set, s, 4, host_set, h, pairs, 8, &np), PKV_OK);
    cr_assert_eq(np, 6, "6 device blocks -> 6 host blocks");
    cr_assert_eq(pkv_pool_free_count(host_pool), 2);
    cr_assert_eq(pkv_cache_transfer(host, dev, pairs, np, NULL), PKV_OK);
    for (int32_t b = 0; b < 16; b++) fill_block(dev, layers, b, 7); // reuse overwrites
    cr_assert_eq(pkv_seq_move_group(host_set, h, 4, dev_set, back, pairs, 8, &np), PKV_OK);
    cr_assert_eq(np, 6);
    cr_assert_eq(pkv_cache_transfer(dev, host, pairs, np, NULL), PKV_OK);
    pkv_block_id ref;
    cr_assert_eq(pkv_pool_alloc(host_pool, 1, &ref), PKV_OK);
    pkv_cache_geometry g;
    pkv_cache_get_geometry(dev, &g);
    for (int i = 0; i < 4; i++) {
        const pkv_block_id *t;
        uint32_t n;
        cr_assert_eq(pkv_seq_block_table(dev_set, back[i], &t, &n), PKV_OK);
        for (uint32_t j = 0; j < 3; j++) {
            fill_block(host, layers, ref, 100 + (unsigned)tables[i][j]);
            for (uint32_t l = 0; l < layers; l++)
                for (int kv = 0; kv < 2; kv++) {
                    void *pd, *ph;
                    pkv_cache_block_ptr(dev, l, t[j], (pkv_kv)kv, &pd);
                    pkv_cache_block_ptr(host, l, ref, (pkv_kv)kv, &ph);
                    cr_assert_eq(memcmp(pd, ph, g.half_block_bytes), 0,
                                 "sample %d block %u layer %u", i, j, l);
                }
        }
        cr_assert_eq(pkv_pool_refcount(dev_pool, t[0]), 4, "full blocks shared by all four again");
        cr_assert_eq(pkv_pool_refcount(dev_pool, t[1]), 4);
    }
    cr_assert_eq(pkv_pool_release(host_pool, ref), PKV_OK);
    cr_assert_eq(pkv_seqset_validate(dev_set, 1), PKV_OK);
    cr_assert_eq(pkv_seqset_free_batch(dev_set, back, 4), PKV_OK);
    cr_assert_eq(pkv_pool_free_count(dev_pool), 16);
    pkv_seqset_destroy(dev_set);
    pkv_seqset_destroy(host_set);
    pkv_cache_destroy(dev);
    pkv_cache_destroy(host);
    pkv_backend_destroy(be);
    pkv_pool_destroy(dev_pool);
    pkv_pool_destroy(host_pool);
}

// A caller-owned tensor of shape [layers][blocks][2][heads][block][dim] (what
// torch.empty would give) wrapped as an HND cache: every address agrees.
Test(cache, external_memory_is_a_tensor) {
    enum { L = 2, N = 5, H = 3, BS = 4, D = 8 };
    static float tensor[L][N][2][H][BS][D];
    pkv_pool *pool;
    pkv_backend *be;
    pkv_cache *c;
    cr_assert_eq(pkv_pool_create(N, &pool), PKV_OK);
    cr_assert_eq(pkv_backend_create_host(&be), PKV_OK);
    pkv_cache_params p = params(L, H, D, BS, PKV_DTYPE_F32, PKV_LAYOUT_HND);
    cr_assert_eq(pkv_cache_create_external(&p, pool, be, tensor, sizeof tensor - 1, &c),
                 PKV_ERR_BUFFER_TOO_SMALL);
    cr_assert_null(c);
    cr_assert_eq(pkv_cache_bytes_per_block(&p) * N, sizeof tensor, "the size needed");
    cr_assert_eq(pkv_cache_create_external(&p, pool, be, (char *)tensor + 1, sizeof tensor, &c),
                 PKV_ERR_INVALID_ARG, "misaligned for fp32");
    cr_assert_eq(pkv_cache_create_external(&p, pool, be, NULL, sizeof tensor, &c),
                 PKV_ERR_INVALID_ARG);
    cr_assert_eq(pkv_cache_create_external(&p, pool, be, tensor, sizeof tensor, &c), PKV_OK);
    pkv_backend_stats bs0;
    pkv_backend_get_stats(be, &bs0);
    cr_assert_eq(bs0.alloc_calls, 0, "external memory: no backend allocation");
    cr_assert_eq(pkv_cache_data(c), (void *)tensor);
    pkv_cache_geometry g;
    cr_assert_eq(pkv_cache_get_geometry(c, &g), PKV_OK);
    for (uint32_t l = 0; l < L; l++)
        for (int32_t b = 0; b < N; b++)
            for (int kv = 0; kv < 2; kv++) {
                void *ptr;
                cr_assert_eq(pkv_cache_block_ptr(c, l, b, (pkv_kv)kv, &ptr), PKV_OK);
                cr_assert_eq(ptr, (void *)&tensor[l][b][kv][0][0][0]);
                for (uint32_t h = 0; h < H; h++)
                    for (uint32_t t = 0; t < BS; t++) {
                        uint64_t e = g.layer_stride * l + g.block_stride * (uint64_t)b +
                                     g.kv_stride * (uint64_t)kv + g.head_stride * h +
                                     g.token_stride * t;
                        cr_assert_eq((float *)tensor + e, &tensor[l][b][kv][h][t][0]);
                    }
            }
    // Copies run on the caller's memory.
    for (int i = 0; i < L * N * 2 * H * BS * D; i++) ((float *)tensor)[i] = (float)i;
    const pkv_block_copy cp = {.src = 1, .dst = 3};
    cr_assert_eq(pkv_cache_copy_blocks(c, &cp, 1, NULL), PKV_OK);
    for (uint32_t l = 0; l < L; l++)
        cr_assert_eq(memcmp(tensor[l][3], tensor[l][1], sizeof tensor[l][1]), 0);
    pkv_cache_destroy(c); // must not free the tensor (ASan would see a bad free)
    pkv_backend_get_stats(be, &bs0);
    cr_assert_eq(bs0.free_calls, 0);
    pkv_backend_destroy(be);
    pkv_pool_destroy(pool);
}

// vLLM's FlashAttention layout: per layer all K halves, then all V halves. Pointers,
// copies and transfers must touch exactly the halves of [L][2][N][BS][H][D].
Test(cache, kv_nhd_layout_is_vllm_flash_attention_tensor) {
    enum { L = 2, N = 5, H = 3, BS = 4, D = 8 };
    static float tensor[L][2][N][BS][H][D], want[L][2][N][BS][H][D], host[L][2][N][BS][H][D];
    pkv_pool *pool;
    pkv_backend *be;
    pkv_cache *c, *swap;
    cr_assert_eq(pkv_pool_create(N, &pool), PKV_OK);
    cr_assert_eq(pkv_backend_create_host(&be), PKV_OK);
    pkv_cache_params p = params(L, H, D, BS, PKV_DTYPE_F32, PKV_LAYOUT_KV_NHD);
    cr_assert_eq(pkv_cache_bytes_per_block(&p) * N, sizeof tensor);
    cr_assert_eq(pkv_cache_create_external(&p, pool, be, tensor, sizeof tensor, &c), PKV_OK);
    pkv_cache_geometry g;
    cr_assert_eq(pkv_cache_get_geometry(c, &g), PKV_OK);
    for (uint32_t l = 0; l < L; l++)
        for (int32_t b = 0; b < N; b++)
            for (int kv = 0; kv < 2; kv++) {
                void *ptr;
                cr_assert_eq(pkv_cache_block_ptr(c, l, b, (pkv_kv)kv, &ptr), PKV_OK);
                cr_assert_eq(ptr, (void *)&tensor[l][kv][b][0][0][0]);
                for (uint32_t h = 0; h < H; h++)
                    for (uint32_t t = 0; t < BS; t++)
                        cr_assert_eq((float *)tensor + g.layer_stride * l + g.block_stride * b +
                                         g.kv_stride * kv + g.head_stride * h + g.token_stride * t,
                                     &tensor[l][kv][b][t][h][0]);
            }
    for (int i = 0; i < L * 2 * N * BS * H * D; i++) ((float *)tensor)[i] = (float)i;
    memcpy(want, tensor, sizeof want);
    const pkv_block_copy cp[2] = {{.src = 1, .dst = 3}, {.src = 4, .dst = 0}};
    for (int i = 0; i < 2; i++)
        for (int l = 0; l < L; l++)
            for (int kv = 0; kv < 2; kv++)
                memcpy(want[l][kv][cp[i].dst], want[l][kv][cp[i].src], sizeof want[l][kv][0]);
    cr_assert_eq(pkv_cache_copy_blocks(c, cp, 2, NULL), PKV_OK);
    cr_assert_eq(memcmp(tensor, want, sizeof want), 0, "copies touched other bytes");
    // A transfer into a second cache of the layout moves the same halves.
    memset(host, 0, sizeof host);
    cr_assert_eq(pkv_cache_create_external(&p, pool, be, host, sizeof host, &swap), PKV_OK);
    const pkv_block_copy out = {.src = 3, .dst = 2};
    cr_assert_eq(pkv_cache_transfer(swap, c, &out, 1, NULL), PKV_OK);
    for (int l = 0; l < L; l++)
        for (int kv = 0; kv < 2; kv++) {
            cr_assert_eq(memcmp(host[l][kv][2], tensor[l][kv][3], sizeof host[l][kv][2]), 0);
            for (int b = 0; b < N; b++)
                if (b != 2) cr_assert_eq(host[l][kv][b][0][0][0], 0.0f);
        }
    pkv_cache_destroy(swap);
    pkv_cache_destroy(c);
    pkv_backend_destroy(be);
    pkv_pool_destroy(pool);
}

// Copy n pairs through `cache` and check every (pair, layer) against a plain
// memcpy reference of the arena taken before. More than PKVI_COPY_CHUNK (448)
// pairs so that the chunking runs (on the host the emulated grid; on CUDA the
// launches).
static void check_many_copies(pkv_cache *cache, pkv_backend *be, void *host_view,
                              uint64_t arena_bytes, uint32_t layers, uint32_t n) {
    pkv_block_copy *pairs = malloc(n * sizeof *pairs);
    unsigned char *want = malloc(arena_bytes);
    cr_assert(pairs && want);
    pkv_cache_geometry g;
    pkv_cache_get_geometry(cache, &g);
    pkv_cache_params p;
    pkv_cache_get_params(cache, &p);
    const uint64_t es = pkv_dtype_size(p.dtype);
    memcpy(want, host_view, arena_bytes);
    for (uint32_t i = 0; i < n; i++) {
        pairs[i].src = (pkv_block_id)(n - 1 - i) * 2 % n;     // any source
        pairs[i].dst = (pkv_block_id)(n + i);                 // distinct, never a source
        for (uint32_t l = 0; l < layers; l++)
            memcpy(want + (l * g.layer_stride + (uint64_t)pairs[i].dst * g.block_stride) * es,
                   want + (l * g.layer_stride + (uint64_t)pairs[i].src * g.block_stride) * es,
                   2 * g.half_block_bytes);
    }
    pkv_backend_stats before, after;
    pkv_backend_get_stats(be, &before);
    cr_assert_eq(pkv_cache_copy_blocks(cache, pairs, n, NULL), PKV_OK);
    cr_assert_eq(pkv_backend_sync(be, NULL), PKV_OK);
    pkv_backend_get_stats(be, &after);
    cr_assert_eq(after.copy_calls - before.copy_calls, 1, "one batched call");
    cr_assert_eq(after.bytes_copied - before.bytes_copied, (uint64_t)n * layers * 2 * g.half_block_bytes);
    if (host_view == pkv_cache_data(cache)) {
        cr_assert_eq(memcmp(host_view, want, arena_bytes), 0);
    } else {
        unsigned char *got = malloc(arena_bytes);
        cr_assert_not_null(got);
        cr_assert_eq(pkv_backend_download(be, got, pkv_cache_data(cache), arena_bytes), PKV_OK);
        cr_assert_eq(memcmp(got, want, arena_bytes), 0, "device copy differs from the reference");
        free(got);
    }
    free(pairs);
    free(want);
}

Test(cache, many_copies_in_one_call_host) {
    const uint32_t n = 1000, layers = 3;
    pkv_pool *pool;
    pkv_backend *be;
    pkv_cache *c;
    cr_assert_eq(pkv_pool_create(2 * n, &pool), PKV_OK);
    cr_assert_eq(pkv_backend_create_host(&be), PKV_OK);
    pkv_cache_params p = params(layers, 1, 4, 2, PKV_DTYPE_F16, PKV_LAYOUT_NHD);
    cr_assert_eq(pkv_cache_create(&p, pool, be, &c), PKV_OK);
    unsigned char *a = pkv_cache_data(c);
    for (uint64_t i = 0; i < pkv_cache_arena_bytes(c); i++) a[i] = (unsigned char)(i * 2654435761u >> 24);
    check_many_copies(c, be, a, pkv_cache_arena_bytes(c), layers, n);
    pkv_cache_destroy(c);
    pkv_backend_destroy(be);
    pkv_pool_destroy(pool);
}

// The CUDA block copy: 500 pairs x 32 layers in two kernel launches on the
// default stream, checked byte for byte against the host reference. Skips
// without a CUDA build or device.
Test(cache, many_copies_in_one_call_cuda) {
    pkv_backend *dev;
    pkv_status st = pkv_backend_create_cuda(0, &dev);
    if (st == PKV_ERR_UNSUPPORTED || st == PKV_ERR_NO_DEVICE)
        cr_skip_test("no CUDA device (%s): the CUDA block copy is not run here",
                     pkv_status_str(st));
    cr_assert_eq(st, PKV_OK);
    const uint32_t n = 500, layers = 32;
    pkv_pool *pool;
    pkv_cache *c;
    cr_assert_eq(pkv_pool_create(2 * n, &pool), PKV_OK);
    pkv_cache_params p = params(layers, 2, 8, 4, PKV_DTYPE_BF16, PKV_LAYOUT_HND);
    cr_assert_eq(pkv_cache_create(&p, pool, dev, &c), PKV_OK);
    const uint64_t bytes = pkv_cache_arena_bytes(c);
    unsigned char *h = malloc(bytes);
    cr_assert_not_null(h);
    for (uint64_t i = 0; i < bytes; i++) h[i] = (unsigned char)(i * 2654435761u >> 24);
    cr_assert_eq(pkv_backend_upload(dev, pkv_cache_data(c), h, bytes), PKV_OK);
    check_many_copies(c, dev, h, bytes, layers, n);
    // Transfers with 2D copies: device -> a host cache of another capacity (other
    // layer stride) and back, checked against the device's own bytes.
    pkv_pool *hpool;
    pkv_backend *hb;
    pkv_cache *hc;
    cr_assert_eq(pkv_pool_create(7, &hpool), PKV_OK);
    cr_assert_eq(pkv_backend_create_host(&hb), PKV_OK);
    cr_assert_eq(pkv_cache_create(&p, hpool, hb, &hc), PKV_OK);
    const pkv_block_copy out[3] = {{.src = 5, .dst = 6}, {.src = 900, .dst = 0}, {.src = 17, .dst = 3}};
    cr_assert_eq(pkv_cache_transfer(hc, c, out, 3, NULL), PKV_OK);
    cr_assert_eq(pkv_backend_sync(dev, NULL), PKV_OK);
    pkv_cache_geometry g;
    pkv_cache_get_geometry(c, &g);
    unsigned char *got = malloc(2 * g.half_block_bytes);
    cr_assert_not_null(got);
    for (int i = 0; i < 3; i++)
        for (uint32_t l = 0; l < layers; l++) {
            void *pd, *ph;
            pkv_cache_block_ptr(c, l, out[i].src, PKV_K, &pd);
            pkv_cache_block_ptr(hc, l, out[i].dst, PKV_K, &ph);
            cr_assert_eq(pkv_backend_download(dev, got, pd, 2 * g.half_block_bytes), PKV_OK);
            cr_assert_eq(memcmp(got, ph, 2 * g.half_block_bytes), 0, "pair %d layer %u", i, l);
        }
    const pkv_block_copy in[1] = {{.src = 6, .dst = 999}};
    cr_assert_eq(pkv_cache_transfer(c, hc, in, 1, NULL), PKV_OK);
    cr_assert_eq(pkv_backend_sync(dev, NULL), PKV_OK);
    for (uint32_t l = 0; l < layers; l++) {
        void *pd, *ph;
        pkv_cache_block_ptr(c, l, 999, PKV_K, &pd);
        pkv_cache_block_ptr(hc, l, 6, PKV_K, &ph);
        cr_assert_eq(pkv_backend_download(dev, got, pd, 2 * g.half_block_bytes), PKV_OK);
        cr_assert_eq(memcmp(got, ph, 2 * g.half_block_bytes), 0, "back in, layer %u", l);
    }
    free(got);
    pkv_cache_destroy(hc);
    pkv_backend_destroy(hb);
    pkv_pool_destroy(hpool);
    free(h);
    pkv_cache_destroy(c);
    pkv_backend_destroy(dev);
    pkv_pool_destroy(pool);
}

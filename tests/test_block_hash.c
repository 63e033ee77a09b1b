// SPDX-License-Identifier: MIT
// Block hashes: SHA-256 against FIPS 180-4's vectors, the chain hashes one block at
// a time and agrees with hashing each block from its parent, seeds and extra keys
// (LoRA, cache salt on block 0 only, multimodal features by token overlap) change
// exactly the hashes they should.
#include <criterion/criterion.h>
#include <stdio.h>
#include <string.h>

#include "../src/allocator/sha256.h"
#include "pkv/block_hash.h"

static void hex(const uint8_t *b, int n, char *out) {
    for (int i = 0; i < n; i++) sprintf(out + 2 * i, "%02x", b[i]);
}

static void sha_check(const void *msg, size_t len, size_t repeat, const char *want) {
    pkvi_sha256 s;
    uint8_t d[32];
    char got[65];
    pkvi_sha256_init(&s);
    for (size_t i = 0; i < repeat; i++) pkvi_sha256_update(&s, msg, len);
    pkvi_sha256_final(&s, d);
    hex(d, 32, got);
    cr_assert_str_eq(got, want);
}

Test(block_hash, sha256_vectors) {
    sha_check("", 0, 1, "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855");
    sha_check("abc", 3, 1, "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
    sha_check("abcdbcdecdefdefgefghfghighijhijkijkljklmklmnlmnomnopnopq", 56, 1,
              "248d6a61d20638b8e5c026930c3e6039a33ce45964ff2167f6ecedd419db06c1");
    // A million 'a' in odd-sized pieces crosses the 64-byte buffer at every offset.
    sha_check("aaaaaaaaaaaaaaaaaaaaaaaaa", 25, 40000,
              "cdc76e5c9914fb9281a1c7e284d73e67f1809a48a497200e046d39ccc7112cd0");
}

static pkv_hasher *make(pkv_hash_algo a, const char *seed) {
    pkv_hasher *h;
    cr_assert_eq(pkv_hasher_create(a, seed, seed ? strlen(seed) : 0, &h), PKV_OK);
    return h;
}

Test(block_hash, lengths_and_availability) {
    const int32_t t[4] = {1, 2, 3, 4};
    pkv_block_hash out;
    pkv_hasher *h = make(PKV_HASH_SHA256, NULL);
    cr_assert_eq(pkv_hash_block(h, NULL, t, 4, NULL, 0, &out), PKV_OK);
    cr_assert_eq(out.len, 32);
    pkv_hasher_destroy(h);
    h = make(PKV_HASH_FNV1A_64, NULL);
    cr_assert_eq(pkv_hash_block(h, NULL, t, 4, NULL, 0, &out), PKV_OK);
    cr_assert_eq(out.len, 8);
    pkv_hasher_destroy(h);
    if (pkv_hash_algo_available(PKV_HASH_XXH3_128)) {
        h = make(PKV_HASH_XXH3_128, NULL);
        cr_assert_eq(pkv_hash_block(h, NULL, t, 4, NULL, 0, &out), PKV_OK);
        cr_assert_eq(out.len, 16);
        pkv_hasher_destroy(h);
    } else {
        cr_assert_eq(pkv_hasher_create(PKV_HASH_XXH3_128, NULL, 0, &h), PKV_ERR_UNSUPPORTED);
    }
    cr_assert_eq(pkv_hasher_create((pkv_hash_algo)7, NULL, 0, &h), PKV_ERR_INVALID_ARG);
    cr_assert_null(h);
}

static int same(const pkv_block_hash *a, const pkv_block_hash *b) {
    return a->len == b->len && memcmp(a->bytes, b->bytes, a->len) == 0;
}

Test(block_hash, chain_is_incremental_and_matches_blockwise) {
    pkv_hasher *h = make(PKV_HASH_SHA256, "seed");
    int32_t tokens[64];
    for (int i = 0; i < 64; i++) tokens[i] = i * 7 - 3;
    pkv_hash_chain c;
    pkv_hash_chain_init(&c);
    pkv_block_hash prev, want, got;
    for (uint32_t b = 0; b < 4; b++) {
        cr_assert_eq(pkv_hash_chain_next(h, &c, tokens + 16 * b, 16, NULL, &got), PKV_OK);
        cr_assert_eq(pkv_hash_block(h, b ? &prev : NULL, tokens + 16 * b, 16, NULL, 0, &want), PKV_OK);
        cr_assert(same(&got, &want), "block %u", b);
        cr_assert_eq(c.blocks, b + 1);
        prev = want;
    }
    // The root is H(seed): a NULL parent and the root as parent agree.
    pkv_block_hash root, a, b;
    pkv_hasher_root(h, &root);
    pkv_hash_block(h, NULL, tokens, 16, NULL, 0, &a);
    pkv_hash_block(h, &root, tokens, 16, NULL, 0, &b);
    cr_assert(same(&a, &b));
    // Another seed, another hash; another token, another hash.
    pkv_hasher *h2 = make(PKV_HASH_SHA256, "other");
    pkv_hash_block(h2, NULL, tokens, 16, NULL, 0, &b);
    cr_assert(!same(&a, &b));
    tokens[15]++;
    pkv_hash_block(h, NULL, tokens, 16, NULL, 0, &b);
    cr_assert(!same(&a, &b));
    pkv_hasher_destroy(h);
    pkv_hasher_destroy(h2);
}

// Hash blocks 0..2 (block size 4) of one prompt under `x`.
static void three(pkv_hasher *h, const pkv_hash_extra *x, pkv_block_hash out[3]) {
    const int32_t t[12] = {1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12};
    pkv_hash_chain c;
    pkv_hash_chain_init(&c);
    for (int b = 0; b < 3; b++) cr_assert_eq(pkv_hash_chain_next(h, &c, t + 4 * b, 4, x, &out[b]), PKV_OK);
}

Test(block_hash, extra_keys_pick_their_blocks) {
    pkv_hasher *h = make(PKV_HASH_FNV1A_64, NULL);
    pkv_block_hash plain[3], salted[3], lora[3], mm[3], mm2[3];
    pkv_hash_extra x = {.lora_id = PKV_NO_LORA};
    three(h, &x, plain);
    three(h, NULL, salted); // NULL extras are no extras
    for (int b = 0; b < 3; b++) cr_assert(same(&plain[b], &salted[b]));

    // The salt enters block 0 only, but every later hash chains through it.
    x.cache_salt = "tenant-a";
    x.salt_len = 8;
    three(h, &x, salted);
    for (int b = 0; b < 3; b++) cr_assert(!same(&plain[b], &salted[b]));
    size_t len;
    cr_assert_eq(pkv_hash_extra_encode(&x, 4, 8, NULL, 0, &len), PKV_OK);
    cr_assert_eq(len, 0, "no salt past block 0");
    cr_assert_eq(pkv_hash_extra_encode(&x, 0, 4, NULL, 0, &len), PKV_ERR_BUFFER_TOO_SMALL);
    cr_assert_eq(len, 5 + 8);

    x = (pkv_hash_extra){.lora_id = 3};
    three(h, &x, lora);
    cr_assert(!same(&plain[0], &lora[0]));
    cr_assert_eq(pkv_hash_extra_encode(&x, 8, 12, NULL, 0, &len), PKV_ERR_BUFFER_TOO_SMALL);
    cr_assert_eq(len, 13, "the LoRA id is on every block");

    // An image over tokens [5, 7): only block 1 carries its hash; blocks 0 agree.
    pkv_mm_feature f = {.offset = 5, .length = 2, .id = "img0", .id_len = 4};
    x = (pkv_hash_extra){.lora_id = PKV_NO_LORA, .mm = &f, .num_mm = 1};
    three(h, &x, mm);
    cr_assert(same(&plain[0], &mm[0]));
    cr_assert(!same(&plain[1], &mm[1]));
    cr_assert_eq(pkv_hash_extra_encode(&x, 8, 12, NULL, 0, &len), PKV_OK);
    cr_assert_eq(len, 0);
    // Another image in the same place: another hash from block 1 on.
    pkv_mm_feature g = {.offset = 5, .length = 2, .id = "img1", .id_len = 4};
    x.mm = &g;
    three(h, &x, mm2);
    cr_assert(same(&mm[0], &mm2[0]));
    cr_assert(!same(&mm[1], &mm2[1]));
    // A feature spanning blocks 0..2 enters all three.
    pkv_mm_feature wide = {.offset = 3, .length = 6, .id = "w", .id_len = 1};
    x.mm = &wide;
    for (uint32_t s = 0; s < 12; s += 4) {
        cr_assert_eq(pkv_hash_extra_encode(&x, s, s + 4, NULL, 0, &len),
                     s <= 8 ? PKV_ERR_BUFFER_TOO_SMALL : PKV_OK);
        cr_assert_eq(len, s < 12 - 3 ? 6u : 0u, "block at %u", s);
    }
    // Out of order or overlapping features are refused by name of the argument.
    pkv_mm_feature bad[2] = {{.offset = 4, .length = 4, .id = "a", .id_len = 1},
                             {.offset = 6, .length = 1, .id = "b", .id_len = 1}};
    x.mm = bad;
    x.num_mm = 2;
    cr_assert_eq(pkv_hash_extra_encode(&x, 0, 4, NULL, 0, &len), PKV_ERR_INVALID_ARG);
    pkv_hasher_destroy(h);
}

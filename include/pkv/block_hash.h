// SPDX-License-Identifier: MIT
// Block hashes for the prefix pool (prefix_pool.h): the key under which a full KV
// block is cached. A block's hash covers its parent's hash, its token ids and its
// extra keys, so equal hashes mean equal prefixes (up to the hash's collision rate:
// the prefix pool trusts the hash, as vLLM does; pick SHA-256 where an adversary
// may choose prompts).
//
//   hash(block i) = H(parent || u32 n || tokens[0..n-1] as int32 LE || extra keys)
//   parent        = hash(block i-1), or for block 0 the hasher's root hash H(seed)
//
// Extra keys per block, in this order: the LoRA id (every block, when set), the
// multimodal features whose token range overlaps the block (their hash), and the
// cache salt (block 0 only). vLLM derives its keys the same way; the byte layout is
// ours, so hashes are not interchangeable with vLLM's (events carry ours).
//
// Hashing is incremental: a pkv_hash_chain (plain data) carries a sequence's chain
// state, and filling a block hashes that block only.
//
// Thread-safety: a hasher is immutable after creation and may be shared by threads;
// a chain belongs to one thread at a time.
#ifndef PKV_BLOCK_HASH_H
#define PKV_BLOCK_HASH_H

#include <stddef.h>
#include <stdint.h>

#include "pkv/status.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef enum pkv_hash_algo {
    PKV_HASH_SHA256 = 0,    // 32 bytes; built in (our own, libc only)
    PKV_HASH_XXH3_128 = 1,  // 16 bytes; needs libxxhash at build time, else PKV_ERR_UNSUPPORTED
    PKV_HASH_FNV1A_64 = 2,  // 8 bytes; fast, for tests only (not collision resistant)
} pkv_hash_algo;

#define PKV_BLOCK_HASH_MAX 32

// A block hash: len significant bytes (32, 16 or 8 by algorithm), the rest zero.
typedef struct pkv_block_hash {
    uint8_t len;
    uint8_t bytes[PKV_BLOCK_HASH_MAX];
} pkv_block_hash;

// A multimodal input's place in the prompt and its content hash (borrowed bytes).
typedef struct pkv_mm_feature {
    uint32_t offset;        // first token of the input's placeholder range
    uint32_t length;        // tokens it covers (>= 1)
    const void *id;         // its content hash or identifier: id_len bytes
    uint32_t id_len;
} pkv_mm_feature;

#define PKV_NO_LORA ((int64_t)-1)

// A request's extra keys (plain data; pointers borrowed). pkv_hash_chain_next picks
// each block's share: lora_id on every block, features that overlap the block, the
// salt on block 0.
typedef struct pkv_hash_extra {
    int64_t lora_id;              // PKV_NO_LORA, or the adapter id (>= 0)
    const void *cache_salt;       // NULL or salt_len bytes
    uint32_t salt_len;
    const pkv_mm_feature *mm;     // [num_mm], sorted by offset, ranges disjoint
    uint32_t num_mm;
} pkv_hash_extra;

typedef struct pkv_hasher pkv_hasher;

// 1 if this build can hash with `algo`, else 0.
int pkv_hash_algo_available(pkv_hash_algo algo);

// Create a hasher for `algo` whose root hash is H(seed[0..seed_len-1]) (seed may be
// NULL with seed_len 0). Hashes from hashers with different seeds never match, so
// a seed isolates tenants or model versions. PKV_ERR_UNSUPPORTED for an algorithm
// this build lacks. *out is owned by the caller.
pkv_status pkv_hasher_create(pkv_hash_algo algo, const void *seed, size_t seed_len,
                             pkv_hasher **out);
void pkv_hasher_destroy(pkv_hasher *hasher);       // NULL does nothing
pkv_hash_algo pkv_hasher_algo(const pkv_hasher *hasher);
// The parent of every first block: H(seed).
pkv_status pkv_hasher_root(const pkv_hasher *hasher, pkv_block_hash *out);

// Hash one block: parent (NULL = the root), tokens[0..n-1] (borrowed), and extra
// key bytes extra[0..extra_len-1] as pkv_hash_extra_encode wrote them (NULL, 0: none).
pkv_status pkv_hash_block(const pkv_hasher *hasher, const pkv_block_hash *parent,
                          const int32_t *tokens, uint32_t n, const void *extra, size_t extra_len,
                          pkv_block_hash *out);

// Encode the extra keys of the block covering tokens [start, end) into buf
// (capacity cap bytes); *len receives the size (0: the block has no extra keys).
// PKV_ERR_BUFFER_TOO_SMALL (with *len the size needed) if cap is short.
// PKV_ERR_INVALID_ARG for features out of order or overlapping, or length 0.
pkv_status pkv_hash_extra_encode(const pkv_hash_extra *extra, uint32_t start, uint32_t end,
                                 void *buf, size_t cap, size_t *len);

// A sequence's hash chain: how many blocks are hashed and the last one's hash.
// Zero-initialize it (or pkv_hash_chain_init) for a new sequence.
typedef struct pkv_hash_chain {
    uint32_t blocks;        // full blocks hashed so far
    pkv_block_hash last;    // hash of block blocks-1 (len 0 while blocks == 0)
} pkv_hash_chain;

void pkv_hash_chain_init(pkv_hash_chain *chain);

// Hash the sequence's next full block: tokens[0..block_size-1] are its tokens
// (positions chain->blocks * block_size onwards), extra the request's extra keys
// (NULL: none). Writes the hash to *out (optional) and advances the chain. Costs
// one block's hash, whatever the prefix length.
pkv_status pkv_hash_chain_next(const pkv_hasher *hasher, pkv_hash_chain *chain,
                               const int32_t *tokens, uint32_t block_size,
                               const pkv_hash_extra *extra, pkv_block_hash *out);

#ifdef __cplusplus
}
#endif

#endif // PKV_BLOCK_HASH_H

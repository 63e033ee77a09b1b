// SPDX-License-Identifier: MIT
// Block hashes: one streaming interface over SHA-256 (ours), xxh3-128 (libxxhash,
// when the build found it) and FNV-1a 64 (tests), the extra-key encoding, and
// the per-sequence chain that hashes one newly filled block at a time.
#include <stdlib.h>
#include <string.h>

#include "pkv/block_hash.h"
#include "pkv_config.h"
#include "sha256.h"

#if PKV_HAVE_XXHASH
#define XXH_INLINE_ALL // header only: static functions, no link to libxxhash
#include <xxhash.h>
#endif

struct pkv_hasher {
    pkv_hash_algo algo;
    pkv_block_hash root;    // H(seed): the parent of every first block
};

// One hash computation in progress, whatever the algorithm.
typedef struct sink {
    pkv_hash_algo algo;
    union {
        pkvi_sha256 sha;
        uint64_t fnv;
#if PKV_HAVE_XXHASH
        XXH3_state_t xxh;
#endif
    } u;
} sink;

static void sink_init(sink *s, pkv_hash_algo algo) {
    s->algo = algo;
    switch (algo) {
    case PKV_HASH_SHA256: pkvi_sha256_init(&s->u.sha); break;
#if PKV_HAVE_XXHASH
    case PKV_HASH_XXH3_128: XXH3_128bits_reset(&s->u.xxh); break;
#endif
    default: s->u.fnv = 0xcbf29ce484222325ull; break;
    }
}

static void sink_add(sink *s, const void *data, size_t len) {
    switch (s->algo) {
    case PKV_HASH_SHA256: pkvi_sha256_update(&s->u.sha, data, len); break;
#if PKV_HAVE_XXHASH
    case PKV_HASH_XXH3_128: XXH3_128bits_update(&s->u.xxh, data, len); break;
#endif
    default: {
        const uint8_t *p = data;
        uint64_t h = s->u.fnv;
        for (size_t i = 0; i < len; i++) h = (h ^ p[i]) * 0x100000001b3ull;
        s->u.fnv = h;
    }
    }
}

static void sink_end(sink *s, pkv_block_hash *out) {
    memset(out, 0, sizeof *out);
    switch (s->algo) {
    case PKV_HASH_SHA256:
        pkvi_sha256_final(&s->u.sha, out->bytes);
        out->len = 32;
        break;
#if PKV_HAVE_XXHASH
    case PKV_HASH_XXH3_128: {
        XXH128_canonical_t c;
        XXH128_canonicalFromHash(&c, XXH3_128bits_digest(&s->u.xxh));
        memcpy(out->bytes, c.digest, 16);
        out->len = 16;
        break;
    }
#endif
    default:
        for (int i = 0; i < 8; i++) out->bytes[i] = (uint8_t)(s->u.fnv >> (56 - 8 * i));
        out->len = 8;
    }
}

static void put_u32le(uint8_t *p, uint32_t v) {
    for (int i = 0; i < 4; i++) p[i] = (uint8_t)(v >> (8 * i));
}

static int little_endian(void) {
    const uint16_t one = 1;
    uint8_t b;
    memcpy(&b, &one, 1);
    return b == 1;
}

// Token ids as int32 little endian, so that hashes agree across hosts.
static void sink_add_tokens(sink *s, const int32_t *tokens, uint32_t n) {
    if (little_endian()) {
        sink_add(s, tokens, (size_t)n * sizeof *tokens);
        return;
    }
    for (uint32_t i = 0; i < n; i++) {
        uint8_t b[4];
        put_u32le(b, (uint32_t)tokens[i]);
        sink_add(s, b, 4);
    }
}

int pkv_hash_algo_available(pkv_hash_algo algo) {
    switch (algo) {
    case PKV_HASH_SHA256:
    case PKV_HASH_FNV1A_64: return 1;
    case PKV_HASH_XXH3_128: return PKV_HAVE_XXHASH;
    }
    return 0;
}

pkv_status pkv_hasher_create(pkv_hash_algo algo, const void *seed, size_t seed_len,
                             pkv_hasher **out) {
    if (!out) return PKV_ERR_INVALID_ARG;
    *out = NULL;
    if (algo != PKV_HASH_SHA256 && algo != PKV_HASH_XXH3_128 && algo != PKV_HASH_FNV1A_64)
        return PKV_ERR_INVALID_ARG;
    if (seed_len && !seed) return PKV_ERR_INVALID_ARG;
    if (!pkv_hash_algo_available(algo)) return PKV_ERR_UNSUPPORTED;
    pkv_hasher *h = calloc(1, sizeof *h);
    if (!h) return PKV_ERR_OUT_OF_MEMORY;
    h->algo = algo;
    sink s;
    sink_init(&s, algo);
    static const char domain[] = "pagedkv.root";
    sink_add(&s, domain, sizeof domain - 1); // a seed never hashes like a block
    if (seed_len) sink_add(&s, seed, seed_len);
    sink_end(&s, &h->root);
    *out = h;
    return PKV_OK;
}

void pkv_hasher_destroy(pkv_hasher *h) { free(h); }

pkv_hash_algo pkv_hasher_algo(const pkv_hasher *h) { return h ? h->algo : PKV_HASH_SHA256; }

pkv_status pkv_hasher_root(const pkv_hasher *h, pkv_block_hash *out) {
    if (!h || !out) return PKV_ERR_INVALID_ARG;
    *out = h->root;
    return PKV_OK;
}

// The same bytes as the streaming path, hashed in one call: xxh3's streaming state
// costs more to set up than a 16-token block costs to hash.
static int hash_one_shot(const pkv_hasher *h, const pkv_block_hash *parent, const int32_t *tokens,
                         uint32_t n, const void *extra, size_t extra_len, pkv_block_hash *out) {
    uint8_t buf[1024];
    const size_t len = parent->len + 4 + (size_t)n * 4 + extra_len;
    if (len > sizeof buf || !little_endian()) return 0;
    uint8_t *p = buf;
    memcpy(p, parent->bytes, parent->len);
    p += parent->len;
    put_u32le(p, n);
    p += 4;
    if (n) memcpy(p, tokens, (size_t)n * 4);
    p += (size_t)n * 4;
    if (extra_len) memcpy(p, extra, extra_len);
    memset(out, 0, sizeof *out);
#if PKV_HAVE_XXHASH
    if (h->algo == PKV_HASH_XXH3_128) {
        XXH128_canonical_t c;
        XXH128_canonicalFromHash(&c, XXH3_128bits(buf, len));
        memcpy(out->bytes, c.digest, 16);
        out->len = 16;
        return 1;
    }
#endif
    sink s;
    sink_init(&s, h->algo);
    sink_add(&s, buf, len);
    sink_end(&s, out);
    return 1;
}

pkv_status pkv_hash_block(const pkv_hasher *h, const pkv_block_hash *parent, const int32_t *tokens,
                          uint32_t n, const void *extra, size_t extra_len, pkv_block_hash *out) {
    if (!h || !out || (n && !tokens) || (extra_len && !extra)) return PKV_ERR_INVALID_ARG;
    if (!parent) parent = &h->root;
    if (parent->len == 0 || parent->len > PKV_BLOCK_HASH_MAX) return PKV_ERR_INVALID_ARG;
    if (hash_one_shot(h, parent, tokens, n, extra, extra_len, out)) return PKV_OK;
    sink s;
    sink_init(&s, h->algo);
    sink_add(&s, parent->bytes, parent->len);
    uint8_t count[4];
    put_u32le(count, n);
    sink_add(&s, count, 4);
    sink_add_tokens(&s, tokens, n);
    if (extra_len) sink_add(&s, extra, extra_len);
    sink_end(&s, out);
    return PKV_OK;
}

// Append a tagged field (tag, u32 length, bytes) if it fits; count its size anyway.
static void put_field(uint8_t *buf, size_t cap, size_t *at, uint8_t tag, const void *p,
                      uint32_t len) {
    if (*at + 5 + len <= cap) {
        buf[*at] = tag;
        put_u32le(buf + *at + 1, len);
        if (len) memcpy(buf + *at + 5, p, len);
    }
    *at += 5 + (size_t)len;
}

pkv_status pkv_hash_extra_encode(const pkv_hash_extra *x, uint32_t start, uint32_t end, void *buf,
                                 size_t cap, size_t *len) {
    if (!len || (cap && !buf) || end < start) return PKV_ERR_INVALID_ARG;
    *len = 0;
    if (!x) return PKV_OK;
    if ((x->salt_len && !x->cache_salt) || (x->num_mm && !x->mm) || x->lora_id < PKV_NO_LORA)
        return PKV_ERR_INVALID_ARG;
    for (uint32_t i = 0; i < x->num_mm; i++) {
        const pkv_mm_feature *f = &x->mm[i];
        if (f->length == 0 || (f->id_len && !f->id) || f->offset > UINT32_MAX - f->length ||
            (i && f->offset < x->mm[i - 1].offset + x->mm[i - 1].length))
            return PKV_ERR_INVALID_ARG; // sorted and disjoint, as a prompt's placeholders are
    }
    size_t at = 0;
    if (x->lora_id != PKV_NO_LORA) {
        uint8_t v[8];
        for (int i = 0; i < 8; i++) v[i] = (uint8_t)((uint64_t)x->lora_id >> (8 * i));
        put_field(buf, cap, &at, 'L', v, 8);
    }
    for (uint32_t i = 0; i < x->num_mm; i++) {
        const pkv_mm_feature *f = &x->mm[i];
        if (f->offset >= end) break;
        if (f->offset + f->length > start) put_field(buf, cap, &at, 'M', f->id, f->id_len);
    }
    if (start == 0 && x->cache_salt) put_field(buf, cap, &at, 'S', x->cache_salt, x->salt_len);
    *len = at;
    return at <= cap ? PKV_OK : PKV_ERR_BUFFER_TOO_SMALL;
}

void pkv_hash_chain_init(pkv_hash_chain *chain) {
    if (chain) memset(chain, 0, sizeof *chain);
}

pkv_status pkv_hash_chain_next(const pkv_hasher *h, pkv_hash_chain *chain, const int32_t *tokens,
                               uint32_t block_size, const pkv_hash_extra *extra,
                               pkv_block_hash *out) {
    if (!h || !chain || !tokens || block_size == 0) return PKV_ERR_INVALID_ARG;
    if (chain->blocks == UINT32_MAX || (uint64_t)(chain->blocks + 1) * block_size > UINT32_MAX)
        return PKV_ERR_LIMIT;
    const uint32_t start = chain->blocks * block_size;
    uint8_t small[256];
    uint8_t *buf = small;
    size_t len = 0;
    pkv_status st = pkv_hash_extra_encode(extra, start, start + block_size, small, sizeof small, &len);
    if (st == PKV_ERR_BUFFER_TOO_SMALL) {
        // Long salts or many features: the rare case pays for an allocation.
        if (!(buf = malloc(len))) return PKV_ERR_OUT_OF_MEMORY;
        st = pkv_hash_extra_encode(extra, start, start + block_size, buf, len, &len);
    }
    pkv_block_hash hash;
    if (st == PKV_OK)
        st = pkv_hash_block(h, chain->blocks ? &chain->last : NULL, tokens, block_size, buf, len,
                            &hash);
    if (buf != small) free(buf);
    if (st != PKV_OK) return st;
    chain->last = hash;
    chain->blocks++;
    if (out) *out = hash;
    return PKV_OK;
}

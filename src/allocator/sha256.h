// SPDX-License-Identifier: MIT
// Internal: SHA-256 (FIPS 180-4), streaming, for block hashes. Our own compact
// version so that libpagedkv-core stays libc only.
#ifndef PKV_SHA256_H
#define PKV_SHA256_H

#include <stddef.h>
#include <stdint.h>

typedef struct pkvi_sha256 {
    uint32_t state[8];
    uint64_t bytes;         // message length so far
    uint8_t buf[64];        // pending partial block
    uint32_t fill;          // bytes in buf
} pkvi_sha256;

void pkvi_sha256_init(pkvi_sha256 *s);
void pkvi_sha256_update(pkvi_sha256 *s, const void *data, size_t len);
void pkvi_sha256_final(pkvi_sha256 *s, uint8_t out[32]);

#endif // PKV_SHA256_H

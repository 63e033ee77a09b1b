// SPDX-License-Identifier: MIT
// Internal: the bounded event buffer of the prefix pool and the hybrid KV manager. Events and their payload
// (hashes, token ids) sit in fixed arrays filled between two drains; a drain lends
// them out and the next emission starts the arrays over. An event that does not
// fit is dropped and counted; the drain then ends with one OVERFLOW record (its
// slot is reserved), so a consumer always learns that it missed something.
#ifndef PKV_KV_EVENTS_H
#define PKV_KV_EVENTS_H

#include "pkv/prefix_pool.h"

typedef struct pkvi_event_buf {
    pkv_kv_event *ev;          // [cap + 1]: the last slot is the overflow marker's
    uint32_t cap, n;
    pkv_block_hash *hashes;    // [payload]
    int32_t *tokens;           // [payload]
    uint32_t payload, nh, nt;
    uint64_t dropped;          // since the last drain
    uint64_t dropped_total;
    int lent;                  // the last drain's records are still the caller's
} pkvi_event_buf;

// cap == 0: events off (every emit is a no-op that drops nothing).
pkv_status pkvi_events_init(pkvi_event_buf *b, uint32_t cap, uint32_t payload);
void pkvi_events_free(pkvi_event_buf *b);
static inline int pkvi_events_on(const pkvi_event_buf *b) { return b->cap != 0; }

// Append an event: its hashes (nh) and tokens (nt) are copied into the payload.
// Drops (and counts) it when the buffer is full.
void pkvi_events_emit(pkvi_event_buf *b, const pkv_kv_event *e, const pkv_block_hash *hashes,
                      uint32_t nh, const int32_t *tokens, uint32_t nt);

// BlockRemoved of one hash (vLLM sends one per evicted block).
void pkvi_events_removed(pkvi_event_buf *b, uint32_t group, pkv_medium medium,
                         const pkv_block_hash *hash);

// AllBlocksCleared (every group).
void pkvi_events_cleared(pkvi_event_buf *b, pkv_medium medium);

// Lend out everything emitted since the last drain (plus the overflow marker).
void pkvi_events_take(pkvi_event_buf *b, const pkv_kv_event **events, uint32_t *n);

#endif // PKV_KV_EVENTS_H

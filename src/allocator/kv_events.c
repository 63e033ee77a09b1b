// SPDX-License-Identifier: MIT
// The bounded event buffer of the prefix pool and the hybrid manager (kv_events.h).
#include <stdlib.h>
#include <string.h>

#include "kv_events.h"

pkv_status pkvi_events_init(pkvi_event_buf *b, uint32_t cap, uint32_t payload) {
    memset(b, 0, sizeof *b);
    if (cap == 0) return PKV_OK;
    if (payload == 0) payload = cap > UINT32_MAX / 64 ? UINT32_MAX : cap * 64;
    b->ev = calloc((size_t)cap + 1, sizeof *b->ev);
    b->hashes = malloc((size_t)payload * sizeof *b->hashes);
    b->tokens = malloc((size_t)payload * sizeof *b->tokens);
    if (!b->ev || !b->hashes || !b->tokens) {
        pkvi_events_free(b);
        return PKV_ERR_OUT_OF_MEMORY;
    }
    b->cap = cap;
    b->payload = payload;
    return PKV_OK;
}

void pkvi_events_free(pkvi_event_buf *b) {
    free(b->ev);
    free(b->hashes);
    free(b->tokens);
    memset(b, 0, sizeof *b);
}

void pkvi_events_emit(pkvi_event_buf *b, const pkv_kv_event *e, const pkv_block_hash *hashes,
                      uint32_t nh, const int32_t *tokens, uint32_t nt) {
    if (!b->cap) return;
    if (b->lent) { // the caller had its drain; start the arrays over
        b->n = b->nh = b->nt = 0;
        b->dropped = 0;
        b->lent = 0;
    }
    if (b->n == b->cap || nh > b->payload - b->nh || nt > b->payload - b->nt) {
        b->dropped++;
        b->dropped_total++;
        return;
    }
    pkv_kv_event *x = &b->ev[b->n++];
    *x = *e;
    x->num_hashes = nh;
    x->hashes = nh ? b->hashes + b->nh : NULL;
    if (nh) memcpy(b->hashes + b->nh, hashes, (size_t)nh * sizeof *hashes);
    b->nh += nh;
    x->num_tokens = nt;
    x->tokens = nt ? b->tokens + b->nt : NULL;
    if (nt) memcpy(b->tokens + b->nt, tokens, (size_t)nt * sizeof *tokens);
    b->nt += nt;
}

// An event that carries at most one hash and no token ids.
static void emit_bare(pkvi_event_buf *b, pkv_kv_event_kind kind, uint32_t group, pkv_medium medium,
                      const pkv_block_hash *hash) {
    if (!b->cap) return;
    pkv_kv_event e;
    memset(&e, 0, sizeof e);
    e.kind = kind;
    e.group = group;
    e.medium = medium;
    e.lora_id = PKV_NO_LORA;
    pkvi_events_emit(b, &e, hash, hash ? 1 : 0, NULL, 0);
}

void pkvi_events_removed(pkvi_event_buf *b, uint32_t group, pkv_medium medium,
                         const pkv_block_hash *hash) {
    emit_bare(b, PKV_EVENT_BLOCK_REMOVED, group, medium, hash);
}

void pkvi_events_cleared(pkvi_event_buf *b, pkv_medium medium) {
    emit_bare(b, PKV_EVENT_ALL_BLOCKS_CLEARED, 0, medium, NULL);
}

void pkvi_events_take(pkvi_event_buf *b, const pkv_kv_event **events, uint32_t *n) {
    if (!b->cap || b->lent) { // nothing since the last drain
        *events = NULL;
        *n = 0;
        return;
    }
    uint32_t count = b->n;
    if (b->dropped) {
        pkv_kv_event *m = &b->ev[count++]; // the reserved slot
        memset(m, 0, sizeof *m);
        m->kind = PKV_EVENT_OVERFLOW;
        m->lora_id = PKV_NO_LORA;
        m->dropped = b->dropped;
    }
    *events = count ? b->ev : NULL;
    *n = count;
    b->lent = 1;
}

// SPDX-License-Identifier: MIT
// The hybrid KV manager's KV events (pkv/hybrid.h, "Prefix cache", Events): one
// bounded buffer (kv_events.h, the prefix pool's) for every group of the manager,
// the drain, and the reset that clears every cache at once. What is stored is
// decided where it is inserted (hybrid_prefix.c); what is removed is reported by
// each group's cache as it evicts (hybrid_prefix_cache.c), so no eviction path can
// forget its event.
#include <string.h>

#include "hybrid_internal.h"

pkv_status pkvi_hybrid_events_init(pkv_hybrid *h, const pkv_hybrid_params *params) {
    if ((unsigned)params->medium > PKV_MEDIUM_DISK) return PKV_ERR_INVALID_ARG;
    h->medium = params->medium;
    pkv_status st = pkvi_events_init(&h->events, params->event_capacity, params->event_payload);
    if (st != PKV_OK || !pkvi_events_on(&h->events)) return st;
    for (uint32_t g = 0; g < h->num_groups; g++)
        if (h->groups[g].cache) pkvi_hcache_set_events(h->groups[g].cache, &h->events, g, h->medium);
    return PKV_OK;
}

void pkvi_hybrid_emit_stored(pkv_hybrid *h, uint32_t g, const pkv_block_hash *parent,
                             const pkv_block_hash *hashes, uint32_t nh, const int32_t *tokens,
                             uint32_t block_size) {
    if (!pkvi_events_on(&h->events) || nh == 0) return;
    pkv_kv_event e;
    memset(&e, 0, sizeof e);
    e.kind = PKV_EVENT_BLOCK_STORED;
    e.group = g;
    e.medium = h->medium;
    e.has_parent = parent != NULL;
    if (parent) e.parent = *parent;
    e.block_size = block_size;
    e.lora_id = PKV_NO_LORA;
    pkvi_events_emit(&h->events, &e, hashes, nh, tokens, nh * block_size);
}

pkv_status pkv_hybrid_take_events(pkv_hybrid *h, const pkv_kv_event **events, uint32_t *n) {
    if (!h || !events || !n) return PKV_ERR_INVALID_ARG;
    pkvi_events_take(&h->events, events, n);
    return PKV_OK;
}

pkv_status pkv_hybrid_cached_block(const pkv_hybrid *h, uint32_t g, const pkv_block_hash *hash,
                                   pkv_block_id *block) {
    if (!h || !hash || g >= h->num_groups || hash->len > PKV_BLOCK_HASH_MAX) return PKV_ERR_INVALID_ARG;
    if (!h->hasher) return PKV_ERR_UNSUPPORTED;
    const pkvi_hcache *c = h->groups[pkvi_hybrid_owner(h, g)].cache;
    const int32_t e = c ? pkvi_hcache_find(c, hash) : -1;
    if (e < 0) return PKV_ERR_NOT_FOUND;
    if (block) *block = pkvi_hcache_block(c, e);
    return PKV_OK;
}

uint64_t pkv_hybrid_events_dropped(const pkv_hybrid *h) { return h ? h->events.dropped_total : 0; }

pkv_status pkv_hybrid_reset_prefix_cache(pkv_hybrid *h) {
    if (!h) return PKV_ERR_INVALID_ARG;
    if (!h->hasher) return PKV_ERR_UNSUPPORTED;
    pkvi_hcache_stats cs;
    for (uint32_t g = 0; g < h->num_groups; g++) {
        if (!h->groups[g].cache) continue;
        pkvi_hcache_get_stats(h->groups[g].cache, &cs);
        if (cs.evictable != cs.entries) return PKV_ERR_BUSY; // a sequence or copy holds one
    }
    for (uint32_t g = 0; g < h->num_groups; g++) {
        pkvi_hcache *c = h->groups[g].cache;
        if (!c) continue;
        // One AllBlocksCleared stands for these: no BlockRemoved each.
        pkvi_hcache_set_events(c, NULL, g, h->medium);
        while (pkvi_hcache_evict_oldest(c, -1, NULL)) {} // leaf first: a chain empties
        if (pkvi_events_on(&h->events)) pkvi_hcache_set_events(c, &h->events, g, h->medium);
    }
    pkvi_hybrid_released(h); // LCM: large pages may be empty now
    pkvi_events_cleared(&h->events, h->medium);
    return PKV_OK;
}

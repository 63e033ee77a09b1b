// SPDX-License-Identifier: MIT
// Prefix pool: vLLM v1 BlockPool's free-queue order (uncached blocks to the front,
// cached ones to the back, lazy eviction when the queue hands them out, a hit takes
// a block back out), several blocks under one hash, groups, lookups without side
// effects, reset, statistics, events with a never-silent overflow, and a randomized
// run against a reference model of the queue and the cache.
#include <criterion/criterion.h>
#include <stdlib.h>
#include <string.h>

#include "pkv/prefix_pool.h"

static pkv_block_hash H(uint64_t v) {
    pkv_block_hash h;
    memset(&h, 0, sizeof h);
    h.len = 8;
    for (int i = 0; i < 8; i++) h.bytes[i] = (uint8_t)(v >> (8 * i));
    return h;
}

static pkv_prefix_pool *make(uint32_t n, uint32_t events) {
    pkv_prefix_pool_params prm = pkv_prefix_pool_params_default(n);
    prm.event_capacity = events;
    prm.num_groups = 2;
    pkv_prefix_pool *p;
    cr_assert_eq(pkv_prefix_pool_create(&prm, &p), PKV_OK);
    return p;
}

static void queue_is(const pkv_prefix_pool *p, const pkv_block_id *want, uint32_t n) {
    pkv_block_id got[64];
    uint32_t len;
    cr_assert_eq(pkv_prefix_pool_free_queue(p, got, 64, &len), PKV_OK);
    cr_assert_eq(len, n, "queue length %u, want %u", len, n);
    for (uint32_t i = 0; i < n; i++) cr_assert_eq(got[i], want[i], "queue[%u] = %d, want %d", i, got[i], want[i]);
    cr_assert_eq(pkv_prefix_pool_validate(p), PKV_OK);
}

// Cache blocks[0..n-1] under hashes base+0.. in group 0, chained after `parent` (0: none).
static void cache(pkv_prefix_pool *p, const pkv_block_id *blocks, uint32_t n, uint64_t base,
                  uint64_t parent) {
    pkv_block_hash hs[16], par = H(parent);
    int32_t tokens[16 * 4] = {0};
    for (uint32_t i = 0; i < n; i++) hs[i] = H(base + i);
    pkv_block_store st = {.group = 0, .n = n, .blocks = blocks, .hashes = hs,
                          .parent = parent ? &par : NULL, .tokens = tokens, .block_size = 4,
                          .lora_id = PKV_NO_LORA};
    cr_assert_eq(pkv_prefix_pool_cache_blocks(p, &st), PKV_OK);
}

Test(prefix_pool, fresh_pool_and_null_block) {
    pkv_prefix_pool *p = make(6, 0);
    const pkv_block_id q[] = {1, 2, 3, 4, 5};
    queue_is(p, q, 5);
    pkv_block_id ids[6];
    cr_assert_eq(pkv_prefix_pool_get_new_blocks(p, 6, ids), PKV_ERR_OUT_OF_BLOCKS);
    cr_assert_eq(pkv_prefix_pool_get_new_blocks(p, 5, ids), PKV_OK);
    for (int i = 0; i < 5; i++) cr_assert_eq(ids[i], i + 1, "block 0 is never handed out");
    // Freeing or touching the null block does nothing.
    const pkv_block_id null = PKV_NULL_BLOCK;
    cr_assert_eq(pkv_prefix_pool_free_blocks(p, &null, 1), PKV_OK);
    cr_assert_eq(pkv_prefix_pool_touch(p, &null, 1), PKV_OK);
    cr_assert_eq(pkv_prefix_pool_num_free(p), 0);
    cr_assert_eq(pkv_prefix_pool_validate(p), PKV_OK);
    pkv_prefix_pool_destroy(p);
}

// vLLM's test_prefill: 11 blocks, a 3-block prefix shared by two requests; the
// final 10-block miss evicts in vLLM's order.
Test(prefix_pool, vllm_prefill_order) {
    pkv_prefix_pool *p = make(11, 0);
    pkv_block_id r0[4], r1[4], hit[3];
    cr_assert_eq(pkv_prefix_pool_get_new_blocks(p, 4, r0), PKV_OK); // 1 2 3 4
    cache(p, r0, 3, 100, 0);
    pkv_block_hash hs[3] = {H(100), H(101), H(102)};
    uint32_t hits;
    cr_assert_eq(pkv_prefix_pool_find_prefix(p, 0, hs, 3, hit, &hits), PKV_OK);
    cr_assert_eq(hits, 3);
    cr_assert_eq(pkv_prefix_pool_touch(p, hit, 3), PKV_OK);
    memcpy(r1, hit, sizeof hit);
    cr_assert_eq(pkv_prefix_pool_get_new_blocks(p, 1, r1 + 3), PKV_OK);
    cr_assert_eq(r1[3], 5);
    const pkv_block_id f0[] = {4, 3, 2, 1}, f1[] = {5, 3, 2, 1}; // tail first
    cr_assert_eq(pkv_prefix_pool_free_blocks(p, f0, 4), PKV_OK);
    const pkv_block_id q0[] = {4, 6, 7, 8, 9, 10};
    queue_is(p, q0, 6);
    cr_assert_eq(pkv_prefix_pool_free_blocks(p, f1, 4), PKV_OK);
    const pkv_block_id q1[] = {5, 4, 6, 7, 8, 9, 10, 3, 2, 1};
    queue_is(p, q1, 10);
    pkv_block_id all[10];
    cr_assert_eq(pkv_prefix_pool_get_new_blocks(p, 10, all), PKV_OK);
    for (int i = 0; i < 10; i++) cr_assert_eq(all[i], q1[i]);
    pkv_block_id id;
    cr_assert_eq(pkv_prefix_pool_get_cached_block(p, 0, &hs[0], &id), PKV_ERR_NOT_FOUND,
                 "lazily evicted when handed out");
    cr_assert_eq(pkv_prefix_pool_validate(p), PKV_OK);
    pkv_prefix_pool_destroy(p);
}

Test(prefix_pool, hit_takes_a_queued_block_back) {
    pkv_prefix_pool *p = make(6, 0);
    pkv_block_id r[2];
    pkv_prefix_pool_get_new_blocks(p, 2, r); // 1 2
    cache(p, r, 2, 10, 0);
    const pkv_block_id rev[] = {2, 1};
    pkv_prefix_pool_free_blocks(p, rev, 2);
    const pkv_block_id q[] = {3, 4, 5, 2, 1};
    queue_is(p, q, 5);
    pkv_block_info info;
    cr_assert_eq(pkv_prefix_pool_block_info(p, 2, &info), PKV_OK);
    cr_assert(info.cached);
    cr_assert_eq(info.refcount, 0);
    cr_assert_eq(info.parent.len, 8, "block 2's parent is block 1's hash");
    cr_assert_eq(memcmp(info.parent.bytes, H(10).bytes, 8), 0);
    const pkv_block_id one = 1;
    cr_assert_eq(pkv_prefix_pool_touch(p, &one, 1), PKV_OK);
    const pkv_block_id q2[] = {3, 4, 5, 2};
    queue_is(p, q2, 4);
    cr_assert_eq(pkv_prefix_pool_refcount(p, 1), 1);
    pkv_prefix_pool_destroy(p);
}

Test(prefix_pool, several_blocks_under_one_hash) {
    pkv_prefix_pool *p = make(8, 0);
    pkv_block_id a, b, c, id;
    pkv_prefix_pool_get_new_blocks(p, 1, &a);
    pkv_prefix_pool_get_new_blocks(p, 1, &b);
    pkv_prefix_pool_get_new_blocks(p, 1, &c);
    cache(p, &a, 1, 7, 0);
    cache(p, &b, 1, 7, 0); // a recomputed copy: allowed, the first stays the answer
    pkv_block_hash h = H(7);
    cr_assert_eq(pkv_prefix_pool_get_cached_block(p, 0, &h, &id), PKV_OK);
    cr_assert_eq(id, a);
    cr_assert_eq(pkv_prefix_pool_get_cached_block(p, 1, &h, &id), PKV_ERR_NOT_FOUND,
                 "another group, another entry");
    cr_assert_eq(pkv_prefix_pool_cache_blocks(p, &(pkv_block_store){.n = 1, .blocks = &a,
                 .hashes = &h, .lora_id = PKV_NO_LORA}), PKV_ERR_INVALID_ARG, "already cached");
    cr_assert_eq(pkv_prefix_pool_evict_block(p, a), PKV_OK);
    cr_assert_eq(pkv_prefix_pool_get_cached_block(p, 0, &h, &id), PKV_OK);
    cr_assert_eq(id, b);
    cr_assert_eq(pkv_prefix_pool_refcount(p, a), 1, "evicting a block in use keeps it in use");
    cr_assert_eq(pkv_prefix_pool_validate(p), PKV_OK);
    (void)c;
    pkv_prefix_pool_destroy(p);
}

Test(prefix_pool, bad_input_changes_nothing) {
    pkv_prefix_pool *p = make(6, 0);
    pkv_block_id r[2];
    pkv_prefix_pool_get_new_blocks(p, 2, r);
    const pkv_block_id twice[] = {1, 1}, bad[] = {2, 9};
    cr_assert_eq(pkv_prefix_pool_free_blocks(p, twice, 2), PKV_ERR_NOT_FOUND, "double free");
    cr_assert_eq(pkv_prefix_pool_free_blocks(p, bad, 2), PKV_ERR_NOT_FOUND);
    cr_assert_eq(pkv_prefix_pool_refcount(p, 1), 1);
    cr_assert_eq(pkv_prefix_pool_refcount(p, 2), 1);
    cr_assert_eq(pkv_prefix_pool_touch(p, bad, 2), PKV_ERR_NOT_FOUND);
    cr_assert_eq(pkv_prefix_pool_refcount(p, 2), 1);
    pkv_block_hash hs[2] = {H(1), H(2)};
    const pkv_block_id mixed[] = {1, 3}; // 3 is free
    cr_assert_eq(pkv_prefix_pool_cache_blocks(p, &(pkv_block_store){.n = 2, .blocks = mixed,
                 .hashes = hs, .lora_id = PKV_NO_LORA}), PKV_ERR_INVALID_ARG);
    pkv_block_info info;
    pkv_prefix_pool_block_info(p, 1, &info);
    cr_assert(!info.cached, "all or nothing");
    cr_assert_eq(pkv_prefix_pool_validate(p), PKV_OK);
    pkv_prefix_pool_destroy(p);
}

Test(prefix_pool, caching_off_appends_everything) {
    pkv_prefix_pool_params prm = pkv_prefix_pool_params_default(5);
    prm.enable_caching = 0;
    pkv_prefix_pool *p;
    cr_assert_eq(pkv_prefix_pool_create(&prm, &p), PKV_OK);
    pkv_block_id r[2];
    pkv_prefix_pool_get_new_blocks(p, 2, r);
    const pkv_block_id rev[] = {2, 1};
    pkv_prefix_pool_free_blocks(p, rev, 2);
    const pkv_block_id q[] = {3, 4, 2, 1};
    queue_is(p, q, 4);
    pkv_block_hash h = H(1);
    cr_assert_eq(pkv_prefix_pool_cache_blocks(p, &(pkv_block_store){.n = 1, .blocks = r,
                 .hashes = &h, .lora_id = PKV_NO_LORA}), PKV_ERR_UNSUPPORTED);
    pkv_prefix_pool_destroy(p);
}

Test(prefix_pool, reset_refused_while_in_use) {
    pkv_prefix_pool *p = make(6, 8);
    pkv_block_id r[2];
    pkv_prefix_pool_get_new_blocks(p, 2, r);
    cache(p, r, 2, 50, 0);
    cr_assert_eq(pkv_prefix_pool_reset(p), PKV_ERR_BUSY);
    pkv_block_id id;
    pkv_block_hash h = H(50);
    cr_assert_eq(pkv_prefix_pool_get_cached_block(p, 0, &h, &id), PKV_OK, "nothing changed");
    pkv_prefix_pool_free_blocks(p, r, 2);
    cr_assert_eq(pkv_prefix_pool_reset(p), PKV_OK);
    cr_assert_eq(pkv_prefix_pool_get_cached_block(p, 0, &h, &id), PKV_ERR_NOT_FOUND);
    const pkv_kv_event *ev;
    uint32_t n;
    cr_assert_eq(pkv_prefix_pool_take_events(p, &ev, &n), PKV_OK);
    cr_assert_eq(n, 2);
    cr_assert_eq(ev[0].kind, PKV_EVENT_BLOCK_STORED);
    cr_assert_eq(ev[1].kind, PKV_EVENT_ALL_BLOCKS_CLEARED);
    cr_assert_eq(pkv_prefix_pool_validate(p), PKV_OK);
    pkv_prefix_pool_destroy(p);
}

// The cheaper mode: tokens NULL with events on stores the blocks and emits a
// BlockStored without token ids (it used to be refused).
Test(prefix_pool, stored_event_without_token_ids) {
    pkv_prefix_pool *p = make(6, 8);
    pkv_block_id r[2];
    pkv_prefix_pool_get_new_blocks(p, 2, r);
    pkv_block_hash hs[2] = {H(31), H(32)};
    pkv_block_store st = {.n = 2, .blocks = r, .hashes = hs, .block_size = 4, .lora_id = PKV_NO_LORA};
    cr_assert_eq(pkv_prefix_pool_cache_blocks(p, &st), PKV_OK);
    const pkv_kv_event *ev;
    uint32_t n;
    pkv_prefix_pool_take_events(p, &ev, &n);
    cr_assert_eq(n, 1);
    cr_assert_eq(ev[0].kind, PKV_EVENT_BLOCK_STORED);
    cr_assert_eq(ev[0].num_hashes, 2);
    cr_assert_eq(ev[0].num_tokens, 0);
    cr_assert_null(ev[0].tokens);
    cr_assert_eq(ev[0].block_size, 4);
    pkv_block_id id;
    cr_assert_eq(pkv_prefix_pool_get_cached_block(p, 0, &hs[1], &id), PKV_OK);
    cr_assert_eq(id, r[1]);
    cr_assert_eq(pkv_prefix_pool_validate(p), PKV_OK);
    pkv_prefix_pool_destroy(p);
}

Test(prefix_pool, events_carry_vllms_fields) {
    pkv_prefix_pool *p = make(6, 8);
    pkv_block_id r[2];
    pkv_prefix_pool_get_new_blocks(p, 2, r);
    pkv_block_hash hs[2] = {H(21), H(22)}, par = H(20);
    int32_t tokens[8] = {1, 2, 3, 4, 5, 6, 7, 8};
    pkv_block_store st = {.group = 1, .n = 2, .blocks = r, .hashes = hs, .parent = &par,
                          .tokens = tokens, .block_size = 4, .lora_id = 5};
    cr_assert_eq(pkv_prefix_pool_cache_blocks(p, &st), PKV_OK);
    const pkv_kv_event *ev;
    uint32_t n;
    pkv_prefix_pool_take_events(p, &ev, &n);
    cr_assert_eq(n, 1);
    cr_assert_eq(ev[0].kind, PKV_EVENT_BLOCK_STORED);
    cr_assert_eq(ev[0].group, 1);
    cr_assert_eq(ev[0].medium, PKV_MEDIUM_GPU);
    cr_assert_eq(ev[0].num_hashes, 2);
    cr_assert_eq(memcmp(ev[0].hashes[1].bytes, hs[1].bytes, 8), 0);
    cr_assert(ev[0].has_parent);
    cr_assert_eq(memcmp(ev[0].parent.bytes, par.bytes, 8), 0);
    cr_assert_eq(ev[0].num_tokens, 8);
    cr_assert_eq(ev[0].tokens[7], 8);
    cr_assert_eq(ev[0].block_size, 4);
    cr_assert_eq(ev[0].lora_id, 5);
    pkv_prefix_pool_take_events(p, &ev, &n);
    cr_assert_eq(n, 0, "a drain empties the buffer");
    // Lazy eviction removes each hash with its group.
    pkv_prefix_pool_free_blocks(p, r, 2);
    pkv_block_id all[5];
    pkv_prefix_pool_get_new_blocks(p, 5, all);
    pkv_prefix_pool_take_events(p, &ev, &n);
    cr_assert_eq(n, 2);
    for (uint32_t i = 0; i < 2; i++) {
        cr_assert_eq(ev[i].kind, PKV_EVENT_BLOCK_REMOVED);
        cr_assert_eq(ev[i].group, 1);
        cr_assert_eq(ev[i].num_hashes, 1);
        cr_assert_eq(memcmp(ev[i].hashes[0].bytes, hs[i].bytes, 8), 0, "tail freed last, head first out");
    }
    pkv_prefix_pool_destroy(p);
}

Test(prefix_pool, event_overflow_is_never_silent) {
    pkv_prefix_pool *p = make(10, 2);
    pkv_block_id r[5];
    pkv_prefix_pool_get_new_blocks(p, 5, r);
    for (uint32_t i = 0; i < 5; i++) cache(p, &r[i], 1, 100 + i, 0);
    const pkv_kv_event *ev;
    uint32_t n;
    pkv_prefix_pool_take_events(p, &ev, &n);
    cr_assert_eq(n, 3, "two events, then the marker");
    cr_assert_eq(ev[0].kind, PKV_EVENT_BLOCK_STORED);
    cr_assert_eq(ev[2].kind, PKV_EVENT_OVERFLOW);
    cr_assert_eq(ev[2].dropped, 3);
    pkv_prefix_pool_stats s;
    pkv_prefix_pool_get_stats(p, &s, 0);
    cr_assert_eq(s.events_dropped, 3);
    cache(p, r, 0, 0, 0); // n = 0: no event
    pkv_prefix_pool_evict_block(p, r[0]);
    pkv_prefix_pool_take_events(p, &ev, &n);
    cr_assert_eq(n, 1, "after a drain the buffer starts over");
    cr_assert_eq(ev[0].kind, PKV_EVENT_BLOCK_REMOVED);
    pkv_prefix_pool_destroy(p);
}

Test(prefix_pool, find_prefix_has_no_side_effects_and_stats_count_tokens) {
    pkv_prefix_pool *p = make(8, 0);
    pkv_block_id r[3], got[4];
    pkv_prefix_pool_get_new_blocks(p, 3, r);
    cache(p, r, 3, 30, 0);
    pkv_prefix_pool_free_blocks(p, r, 3);
    pkv_block_hash hs[4] = {H(30), H(31), H(99), H(32)};
    uint32_t hits;
    cr_assert_eq(pkv_prefix_pool_find_prefix(p, 0, hs, 4, got, &hits), PKV_OK);
    cr_assert_eq(hits, 2, "stops at the first miss");
    cr_assert_eq(got[0], r[0]);
    cr_assert_eq(got[1], r[1]);
    cr_assert_eq(pkv_prefix_pool_num_free(p), 7, "nothing taken");
    cr_assert_eq(pkv_prefix_pool_refcount(p, r[0]), 0);
    pkv_prefix_pool_stats s;
    pkv_prefix_pool_get_stats(p, &s, 0);
    cr_assert_eq(s.requests + s.queries + s.hits, 0);
    cr_assert_eq(s.cached_blocks, 3);
    cr_assert_eq(pkv_prefix_pool_record(p, 100, 32, 0), PKV_OK);
    cr_assert_eq(pkv_prefix_pool_record(p, 50, 16, 1), PKV_OK);
    cr_assert_eq(pkv_prefix_pool_record(p, 5, 6, 0), PKV_ERR_INVALID_ARG);
    pkv_prefix_pool_get_stats(p, &s, 1);
    cr_assert_eq(s.requests, 1);
    cr_assert_eq(s.queries, 100);
    cr_assert_eq(s.hits, 32);
    cr_assert_eq(s.preempted_requests, 1);
    cr_assert_eq(s.preempted_hits, 16);
    pkv_prefix_pool_get_stats(p, &s, 0);
    cr_assert_eq(s.queries, 0, "reset after reading");
    pkv_prefix_pool_destroy(p);
}

// --- randomized run against a reference model ---

#define N 24
typedef struct model {
    int32_t ref[N];
    int32_t queue[N];
    uint32_t qn;
    uint64_t hash[N]; // 0: not cached
} model;

static uint64_t rng_state = 12345;
static uint32_t rnd(uint32_t n) {
    rng_state = rng_state * 6364136223846793005ull + 1442695040888963407ull;
    return (uint32_t)(rng_state >> 33) % n;
}

static void m_remove(model *m, int32_t b) {
    for (uint32_t i = 0; i < m->qn; i++)
        if (m->queue[i] == b) {
            memmove(m->queue + i, m->queue + i + 1, (m->qn - i - 1) * sizeof *m->queue);
            m->qn--;
            return;
        }
}

Test(prefix_pool, randomized_against_model) {
    pkv_prefix_pool *p = make(N, 0);
    model m = {.qn = 0};
    for (int32_t b = 1; b < N; b++) m.queue[m.qn++] = b;
    int32_t held[256];
    uint32_t nheld = 0;
    for (int step = 0; step < 20000; step++) {
        uint32_t op = rnd(5);
        if (op == 0 && m.qn) { // allocate a few
            uint32_t k = 1 + rnd(m.qn < 4 ? m.qn : 4);
            pkv_block_id ids[4];
            cr_assert_eq(pkv_prefix_pool_get_new_blocks(p, k, ids), PKV_OK);
            for (uint32_t i = 0; i < k; i++) {
                cr_assert_eq(ids[i], m.queue[i], "step %d", step);
                m.hash[ids[i]] = 0;
                m.ref[ids[i]] = 1;
                if (nheld < 256) held[nheld++] = ids[i];
            }
            memmove(m.queue, m.queue + k, (m.qn - k) * sizeof *m.queue);
            m.qn -= k;
        } else if (op == 1 && nheld) { // free a run of held references, in list order
            uint32_t k = 1 + rnd(nheld < 3 ? nheld : 3);
            pkv_block_id ids[3];
            for (uint32_t i = 0; i < k; i++) ids[i] = held[nheld - k + i];
            cr_assert_eq(pkv_prefix_pool_free_blocks(p, ids, k), PKV_OK);
            int32_t front[3];
            uint32_t nf = 0;
            for (uint32_t i = 0; i < k; i++)
                if (--m.ref[ids[i]] == 0) {
                    if (m.hash[ids[i]]) m.queue[m.qn++] = ids[i];
                    else front[nf++] = ids[i];
                }
            memmove(m.queue + nf, m.queue, m.qn * sizeof *m.queue);
            memcpy(m.queue, front, nf * sizeof *front);
            m.qn += nf;
            nheld -= k;
        } else if (op == 2 && nheld) { // cache a held uncached block under a small hash space
            int32_t b = held[rnd(nheld)];
            if (!m.hash[b]) {
                uint64_t h = 1 + rnd(6);
                cache(p, &b, 1, h, 0);
                m.hash[b] = h;
            }
        } else if (op == 3) { // a hit on a random hash: the earliest block cached under it
            pkv_block_hash h = H(1 + rnd(6));
            pkv_block_id id;
            pkv_status st = pkv_prefix_pool_get_cached_block(p, 0, &h, &id);
            int any = 0;
            for (int b = 1; b < N; b++) any |= m.hash[b] == (uint64_t)(h.bytes[0]);
            cr_assert_eq(st == PKV_OK, any, "step %d", step);
            if (st == PKV_OK && nheld < 256) {
                cr_assert_eq(m.hash[id], h.bytes[0]);
                cr_assert_eq(pkv_prefix_pool_touch(p, &id, 1), PKV_OK);
                if (m.ref[id]++ == 0) m_remove(&m, id);
                held[nheld++] = id;
            }
        } else if (op == 4) { // drop one block's hash
            int32_t b = 1 + (int32_t)rnd(N - 1);
            cr_assert_eq(pkv_prefix_pool_evict_block(p, b), PKV_OK);
            m.hash[b] = 0;
        }
        cr_assert_eq(pkv_prefix_pool_validate(p), PKV_OK, "step %d", step);
        cr_assert_eq(pkv_prefix_pool_num_free(p), m.qn);
        if (step % 64 == 0) queue_is(p, m.queue, m.qn);
    }
    pkv_prefix_pool_destroy(p);
}

Test(prefix_pool, event_payload_overflow_drops_the_event_not_the_caching) {
    pkv_prefix_pool_params prm = pkv_prefix_pool_params_default(8);
    prm.event_capacity = 8;
    prm.event_payload = 6; // token ids (and hashes) between drains
    pkv_prefix_pool *p;
    cr_assert_eq(pkv_prefix_pool_create(&prm, &p), PKV_OK);
    pkv_block_id r[2];
    pkv_prefix_pool_get_new_blocks(p, 2, r);
    cache(p, r, 2, 40, 0); // 2 blocks x 4 tokens = 8 ids > 6: the event cannot fit
    pkv_block_id id;
    pkv_block_hash h = H(41);
    cr_assert_eq(pkv_prefix_pool_get_cached_block(p, 0, &h, &id), PKV_OK, "cached all the same");
    cr_assert_eq(pkv_prefix_pool_evict_block(p, r[0]), PKV_OK); // 1 hash: fits
    const pkv_kv_event *ev;
    uint32_t n;
    pkv_prefix_pool_take_events(p, &ev, &n);
    cr_assert_eq(n, 2);
    cr_assert_eq(ev[0].kind, PKV_EVENT_BLOCK_REMOVED);
    cr_assert_eq(ev[1].kind, PKV_EVENT_OVERFLOW);
    cr_assert_eq(ev[1].dropped, 1);
    pkv_prefix_pool_destroy(p);
}

Test(prefix_pool, bad_params_are_refused) {
    pkv_prefix_pool *p = (pkv_prefix_pool *)1;
    pkv_prefix_pool_params prm = pkv_prefix_pool_params_default(1);
    cr_assert_eq(pkv_prefix_pool_create(&prm, &p), PKV_ERR_INVALID_ARG, "the null block needs a partner");
    cr_assert_null(p);
    prm = pkv_prefix_pool_params_default(4);
    prm.num_groups = 0;
    cr_assert_eq(pkv_prefix_pool_create(&prm, &p), PKV_ERR_INVALID_ARG);
    prm = pkv_prefix_pool_params_default(4);
    prm.medium = (pkv_medium)9;
    cr_assert_eq(pkv_prefix_pool_create(&prm, &p), PKV_ERR_INVALID_ARG);
    cr_assert_eq(pkv_prefix_pool_create(NULL, &p), PKV_ERR_INVALID_ARG);
    pkv_prefix_pool_destroy(NULL);
}

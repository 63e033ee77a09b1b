// SPDX-License-Identifier: MIT
// The `paged` KV policy: the library's own pkv_pool + pkv_seqset. Requests take
// blocks on demand, n > 1 forks share every block (copy-on-write on the shared
// partial block), and with prefix sharing the library's prefix cache
// (pkv_prefix_cache) hands a new request the full blocks of the longest prompt
// prefix an earlier request computed. Token ids are synthesized from the trace
// (pkvi_trace_tokens) so that the cache sees exactly the trace's shared prefixes.
// A request's blocks enter the cache when its prefill step ends; blocks that only
// the cache holds stay reusable until memory runs short, then the least recently
// used are evicted (pkv_prefix_cache_reclaim).
//
// Accounting: fill[b] is the number of token states stored in physical block b,
// and used = sum(fill) over blocks that live sequences reference, so shared
// blocks count once and CoW duplicates twice (they are two physical copies).
// reserved = blocks in use x block_size. Blocks held by the cache alone are
// reclaimable: they count as free, in neither used nor reserved.
// In sim mode the pool stands for one backend allocation of the whole budget
// (one alloc call, one free call at the end).
#include <stdlib.h>
#include <string.h>

#include "pkv/pool.h"
#include "pkv/prefix.h"
#include "pkv/seq.h"
#include "src/runtime/replay/replay_internal.h"
#include "src/runtime/trace/trace_internal.h"

typedef struct paged {
    uint64_t capacity_slots;
    pkv_pool *pool;
    pkv_seqset *set;
    uint32_t B;
    uint32_t capacity; // blocks
    uint32_t *fill;    // [capacity]
    uint64_t used;     // sum of fill
    const uint32_t *max_seqs;
    uint64_t *seq_base;   // [num_requests]: first entry of the request in seqs
    pkv_seq_id *seqs;     // [sum of n]
    uint32_t *nseq;       // [num_requests]: live sequences
    uint8_t *tail_shared; // [num_requests]: children share their partial last block
    const pkv_trace *trace; // borrowed: token ids for the prefix cache
    pkv_prefix_cache *cache; // NULL without prefix sharing
    int32_t *tokens;      // [tokens_cap] scratch for a prompt's token ids
    uint32_t tokens_cap;
    uint32_t blocked_r;   // the last request refused admission, and the
    uint64_t blocked_avail; // free + evictable blocks then (skip identical retries)
    uint64_t cached_tokens; // prompt tokens served from the cache
    pkv_block_id *cached_list; // blocks ever inserted into the cache, [cached_len]
    uint32_t cached_len;
    uint8_t *in_list;     // [capacity]: the cache holds a reference on this block
    uint64_t evictable;   // blocks only the cache holds (tracked: the cache's own
                          // count is a scan; validate compares the two)

    pkv_block_copy *copies; // CoWs since the last take, [copies_cap]
    uint32_t num_copies, copies_cap;
    uint64_t cow_copies, copy_slots;
} paged;

static uint32_t ceil_div(uint64_t a, uint32_t b) { return (uint32_t)((a + b - 1) / b); }

static void set_fill(paged *p, pkv_block_id b, uint32_t f) {
    p->used += f;
    p->used -= p->fill[b];
    p->fill[b] = f;
}

// Set fill for every block of a sequence of len tokens (all full but the last).
static void fill_seq(paged *p, pkv_seq_id id, uint32_t len) {
    const pkv_block_id *t;
    uint32_t nb;
    if (pkv_seq_block_table(p->set, id, &t, &nb) != PKV_OK || nb == 0) return;
    for (uint32_t i = 0; i + 1 < nb; i++) set_fill(p, t[i], p->B);
    set_fill(p, t[nb - 1], len - (nb - 1) * p->B);
}

// Free a sequence; blocks it alone holds lose their token states, and cached
// blocks that it was the last sequence to use become evictable.
static void free_seq(paged *p, pkv_seq_id id) {
    const pkv_block_id *t;
    uint32_t nb;
    if (pkv_seq_block_table(p->set, id, &t, &nb) == PKV_OK)
        for (uint32_t i = 0; i < nb; i++) {
            const int32_t rc = pkv_pool_refcount(p->pool, t[i]);
            if (rc == 1) set_fill(p, t[i], 0);
            else if (rc == 2 && p->in_list && p->in_list[t[i]]) p->evictable++;
        }
    pkv_seq_free(p->set, id);
}

// Move queued CoW copies into p->copies (count them when `count` is set) and
// give each copy's destination its source's fill.
static pkv_status drain_copies(paged *p, int count) {
    uint32_t n = pkv_seqset_pending_copies(p->set);
    if (n == 0) return PKV_OK;
    if (p->num_copies + n > p->copies_cap) {
        uint32_t cap = p->copies_cap ? p->copies_cap : 64;
        while (cap < p->num_copies + n) cap *= 2;
        pkv_block_copy *c = realloc(p->copies, cap * sizeof *c);
        if (!c) return PKV_ERR_OUT_OF_MEMORY;
        p->copies = c;
        p->copies_cap = cap;
    }
    uint32_t got = 0;
    pkv_status st = pkv_seqset_take_copies(p->set, p->copies + p->num_copies, n, &got);
    if (st != PKV_OK) return st;
    for (uint32_t i = 0; i < got; i++) {
        const pkv_block_copy *c = &p->copies[p->num_copies + i];
        set_fill(p, c->dst, p->fill[c->src]);
        if (count) {
            p->cow_copies++;
            p->copy_slots += p->fill[c->src];
        }
    }
    if (count) p->num_copies += got; // restore-time copies are dropped (data is rebuilt)
    return PKV_OK;
}

static uint64_t evictable(const paged *p) { return p->evictable; }

// After an eviction, blocks the cache released hold no token states any more.
// Only blocks that were ever inserted can have been evicted: visit those.
static void sweep_evicted(paged *p) {
    uint32_t keep = 0;
    for (uint32_t i = 0; i < p->cached_len; i++) {
        const pkv_block_id b = p->cached_list[i];
        if (pkv_pool_refcount(p->pool, b) == 0) { // evicted: it was cache-only
            set_fill(p, b, 0);
            p->in_list[b] = 0;
            p->evictable--;
        } else {
            p->cached_list[keep++] = b;
        }
    }
    p->cached_len = keep;
}

// Make `need` blocks free, evicting cache-only blocks if that is what it takes.
static int make_free(paged *p, uint64_t need) {
    if (pkv_pool_free_count(p->pool) >= need) return 1;
    if (!p->cache || need > UINT32_MAX || evictable(p) == 0) return 0;
    pkv_status st = pkv_prefix_cache_reclaim(p->cache, (uint32_t)need);
    sweep_evicted(p);
    return st == PKV_OK;
}

static int32_t *prompt_tokens(paged *p, uint32_t r, uint32_t n) {
    return pkvi_trace_tokens_into(p->trace, r, n, &p->tokens, &p->tokens_cap);
}

// Blocks the request's sequences hold once admitted, counting `skip` shared
// prefix blocks that already exist as free of charge.
static uint64_t blocks_for_admit(const paged *p, const pkv_policy_admit *a, uint32_t skip) {
    uint64_t need;
    if (a->independent && a->nseq > 1) {
        need = (uint64_t)a->nseq * ceil_div(a->len, p->B);
    } else if (a->nseq <= 1 || a->len == a->prompt) {
        need = ceil_div(a->len, p->B);
    } else {
        uint32_t shared = a->prompt / p->B;
        need = shared + (uint64_t)a->nseq * (ceil_div(a->len, p->B) - shared);
    }
    return need - skip;
}

static void paged_release(void *pp, uint32_t r) {
    paged *p = pp;
    pkv_seq_id *s = &p->seqs[p->seq_base[r]];
    for (uint32_t i = 0; i < p->nseq[r]; i++) free_seq(p, s[i]);
    p->nseq[r] = 0;
    p->tail_shared[r] = 0;
}

static pkv_status paged_admit(void *pp, uint32_t r, const pkv_policy_admit *a, uint64_t wm,
                              uint64_t *ext_frag, uint32_t *cached_out) {
    paged *p = pp;
    *ext_frag = 0;
    *cached_out = 0;
    const uint64_t wm_blocks = (wm + p->B - 1) / p->B;
    const uint64_t avail = (uint64_t)pkv_pool_free_count(p->pool) + evictable(p);
    // The head of the queue retries every step: skip the prompt hashing while
    // nothing was freed since its last refusal.
    if (p->blocked_r == r && p->blocked_avail == avail) return PKV_ERR_OUT_OF_BLOCKS;
    pkv_seq_id *s = &p->seqs[p->seq_base[r]];
    pkv_status st;
    uint32_t cached = 0;
    if (a->independent && a->nseq > 1) {
        // Run-mode restore: every sequence rebuilt alone and recomputed in full.
        const uint64_t need = blocks_for_admit(p, a, 0);
        if (need + wm_blocks > avail || !make_free(p, need + wm_blocks)) goto refuse;
        for (uint32_t i = 0; i < a->nseq; i++) {
            if ((st = pkv_seq_create(p->set, &s[i])) != PKV_OK) goto fail;
            p->nseq[r]++;
            if ((st = pkv_seq_append(p->set, s[i], a->len, NULL)) != PKV_OK) goto fail;
            fill_seq(p, s[i], a->len);
        }
        p->tail_shared[r] = 0;
        p->blocked_r = UINT32_MAX;
        return PKV_OK;
    }
    // The first sequence: the cached prefix of the prompt (or nothing), grown to
    // the prompt; then the other sequences of a restored request fork from it and
    // every sequence grows to len.
    // Even if all of its declared shared prefix were cached, would it fit? If
    // not, refuse before hashing the prompt (the queue head retries every step).
    const pkv_trace_request *q = &p->trace->reqs[r];
    const int may_hit = p->cache && q->prefix_group >= 0;
    {
        const uint32_t best = may_hit ? (q->prefix_tokens < a->prompt ? q->prefix_tokens
                                                                      : a->prompt - 1) / p->B
                                      : 0;
        if (blocks_for_admit(p, a, best) + wm_blocks > avail) goto refuse;
    }
    // A request outside every prefix group shares nothing with anyone: skip the
    // lookup (it hashes the whole prompt).
    if (may_hit) {
        const int32_t *tok = prompt_tokens(p, r, a->prompt);
        if (!tok) return PKV_ERR_OUT_OF_MEMORY;
        if ((st = pkv_seq_create_cached(p->set, p->cache, tok, a->prompt, &s[0], &cached)) != PKV_OK)
            return st;
        // Adopted blocks that only the cache held are in use again.
        const pkv_block_id *t;
        uint32_t nb;
        if (cached && pkv_seq_block_table(p->set, s[0], &t, &nb) == PKV_OK)
            for (uint32_t i = 0; i < cached / p->B && i < nb; i++)
                if (pkv_pool_refcount(p->pool, t[i]) == 2) p->evictable--;
    } else if ((st = pkv_seq_create(p->set, &s[0])) != PKV_OK) {
        return st;
    }
    p->nseq[r] = 1;
    {
        const uint64_t need = blocks_for_admit(p, a, cached / p->B);
        // Blocks this request now shares with the cache are no longer evictable.
        const uint64_t avail_now = (uint64_t)pkv_pool_free_count(p->pool) + evictable(p);
        if (need + wm_blocks > avail_now || !make_free(p, need + wm_blocks)) {
            free_seq(p, s[0]);
            p->nseq[r] = 0;
            goto refuse;
        }
    }
    if ((st = pkv_seq_append(p->set, s[0], a->prompt - cached, NULL)) != PKV_OK) goto fail;
    for (uint32_t i = 1; i < a->nseq; i++) {
        if ((st = pkv_seq_fork(p->set, s[0], &s[i])) != PKV_OK) goto fail;
        p->nseq[r]++;
    }
    if (a->len > a->prompt)
        for (uint32_t i = 0; i < a->nseq; i++)
            if ((st = pkv_seq_append(p->set, s[i], a->len - a->prompt, NULL)) != PKV_OK) goto fail;
    if ((st = drain_copies(p, 0)) != PKV_OK) goto fail;
    for (uint32_t i = 0; i < a->nseq; i++) fill_seq(p, s[i], a->len);
    p->tail_shared[r] = a->nseq > 1 && a->len == a->prompt && a->len % p->B != 0;
    *cached_out = cached;
    p->cached_tokens += cached;
    p->blocked_r = UINT32_MAX;
    return PKV_OK;
refuse:
    p->blocked_r = r;
    p->blocked_avail = (uint64_t)pkv_pool_free_count(p->pool) + evictable(p);
    return PKV_ERR_OUT_OF_BLOCKS;
fail:
    // Only reachable if the block count above was wrong or metadata ran out.
    drain_copies(p, 0);
    for (uint32_t i = 0; i < p->nseq[r]; i++) free_seq(p, s[i]);
    p->nseq[r] = 0;
    return st == PKV_ERR_OUT_OF_BLOCKS || st == PKV_OK ? PKV_ERR_OUT_OF_BLOCKS : st;
}

// The request's prefill step has ended: its full prompt blocks hold K/V now and
// may serve later requests. Only the prefix the trace marks as shared with some
// other request (prefix_tokens) is offered: a real server caches every full
// block, but blocks no later request matches would only be evicted again, and
// keeping them out keeps the simulation fast (hits are the same).
static void paged_commit(void *pp, uint32_t r, uint32_t prompt) {
    paged *p = pp;
    const pkv_trace_request *q = &p->trace->reqs[r];
    (void)prompt;
    if (!p->cache || p->nseq[r] == 0 || q->prefix_group < 0) return;
    const uint32_t n = q->prefix_tokens / p->B * p->B;
    if (n == 0) return;
    const int32_t *tok = prompt_tokens(p, r, n);
    const pkv_seq_id id = p->seqs[p->seq_base[r]];
    const pkv_block_id *t;
    uint32_t nb;
    if (!tok || pkv_seq_block_table(p->set, id, &t, &nb) != PKV_OK) return;
    const uint32_t k = n / p->B < nb ? n / p->B : nb;
    int32_t *before = malloc((size_t)(k ? k : 1) * sizeof *before);
    if (!before) return;
    for (uint32_t i = 0; i < k; i++) before[i] = pkv_pool_refcount(p->pool, t[i]);
    if (pkv_prefix_cache_insert(p->cache, p->set, id, tok, n, NULL) == PKV_OK) {
        // A block whose refcount rose is now held by the cache (a block with the
        // same prefix cached earlier is refreshed instead, and its copy here is not).
        pkv_seq_block_table(p->set, id, &t, &nb);
        for (uint32_t i = 0; i < k; i++) {
            if (pkv_pool_refcount(p->pool, t[i]) <= before[i] || p->in_list[t[i]]) continue;
            p->in_list[t[i]] = 1;
            p->cached_list[p->cached_len++] = t[i]; // at most one entry per block
        }
    }
    free(before);
}

static pkv_status paged_fork(void *pp, uint32_t r, uint32_t n) {
    paged *p = pp;
    pkv_seq_id *s = &p->seqs[p->seq_base[r]];
    if (p->nseq[r] != 1 || n > p->max_seqs[r]) return PKV_ERR_INVALID_ARG;
    for (uint32_t i = 1; i < n; i++) {
        pkv_status st = pkv_seq_fork(p->set, s[0], &s[i]);
        if (st != PKV_OK) return st;
        p->nseq[r]++;
    }
    uint32_t len = 0;
    pkv_seq_length(p->set, s[0], &len);
    p->tail_shared[r] = n > 1 && len % p->B != 0;
    return PKV_OK;
}

static pkv_status paged_grow(void *pp, uint32_t r, uint32_t child) {
    paged *p = pp;
    int64_t slot;
    const pkv_seq_id id = p->seqs[p->seq_base[r] + child];
    pkv_status st = pkv_seq_append(p->set, id, 1, &slot);
    if (st == PKV_ERR_OUT_OF_BLOCKS && p->cache) {
        // Evict cached prefixes before the scheduler preempts anyone.
        uint32_t need = 0;
        if (pkv_seq_blocks_needed(p->set, id, 1, &need) == PKV_OK && make_free(p, need))
            st = pkv_seq_append(p->set, id, 1, &slot);
    }
    if (st != PKV_OK) return st;
    if ((st = drain_copies(p, 1)) != PKV_OK) return st;
    const pkv_block_id b = (pkv_block_id)(slot / p->B);
    const uint32_t off = (uint32_t)(slot % p->B);
    if (p->fill[b] < off + 1) set_fill(p, b, off + 1);
    p->tail_shared[r] = 0; // the engine grows every child before it samples
    return PKV_OK;
}

static uint64_t paged_need(const pkv_policy_config *cfg, const pkv_policy_admit *a) {
    const uint32_t block_size = cfg->block_size;
    const uint32_t shared = a->prompt / block_size;
    const uint64_t blocks = shared + (uint64_t)a->n * (ceil_div(a->final_len, block_size) - shared);
    return blocks * block_size;
}

static int paged_fits_alone(const void *pp, const pkv_policy_admit *a, uint64_t wm) {
    const paged *p = pp;
    const uint64_t wm_blocks = (wm + p->B - 1) / p->B;
    if ((uint64_t)ceil_div(a->len, p->B) + wm_blocks > p->capacity) return 0;
    const uint32_t shared = a->prompt / p->B;
    const uint64_t peak = shared + (uint64_t)a->n * (ceil_div(a->final_len, p->B) - shared);
    return peak <= p->capacity;
}

static uint64_t paged_reservation(const void *pp, uint32_t r, uint32_t nseq, uint32_t len,
                                  uint32_t final_len) {
    const paged *p = pp;
    uint64_t held = (uint64_t)ceil_div(len, p->B) * p->B;
    uint64_t later = (held < final_len ? held : final_len) - len;
    uint32_t tails = p->tail_shared[r] ? 1 : nseq;
    return later * tails;
}

// A swap moves the prompt's full blocks once (the forks share them).
static uint64_t paged_request_slots(const void *pp, uint32_t r, uint32_t nseq, uint32_t len,
                                    uint32_t prompt) {
    const paged *p = pp;
    (void)r;
    const uint64_t shared = (uint64_t)prompt / p->B * p->B;
    if (nseq <= 1) return len;
    return shared + (uint64_t)nseq * (len - shared);
}

static void paged_stats(const void *pp, pkv_policy_stats *s) {
    const paged *p = pp;
    // Cache-only blocks are full (only full blocks are cached) and reclaimable.
    const uint64_t ev = evictable(p);
    s->used = p->used - ev * p->B;
    s->reserved = ((uint64_t)(p->capacity - pkv_pool_free_count(p->pool)) - ev) * p->B;
    s->free = ((uint64_t)pkv_pool_free_count(p->pool) + ev) * p->B;
    s->copy_slots = p->copy_slots;
    s->cow_copies = p->cow_copies;
    s->cached_tokens = p->cached_tokens;
}

static pkv_seq_id paged_seq_of(const void *pp, uint32_t r, uint32_t child) {
    const paged *p = pp;
    return child < p->nseq[r] ? p->seqs[p->seq_base[r] + child] : -1;
}

static pkv_status paged_validate(const void *pp) {
    const paged *p = pp;
    // The cache holds references too, so refcounts are exact only without it.
    pkv_status st = pkv_seqset_validate(p->set, p->cache == NULL);
    if (st == PKV_OK && p->cache) st = pkv_prefix_cache_validate(p->cache);
    if (st == PKV_OK && p->cache) {
        pkv_prefix_stats ps;
        st = pkv_prefix_cache_get_stats(p->cache, &ps);
        if (st == PKV_OK && ps.evictable != p->evictable) st = PKV_ERR_CORRUPT;
    }
    if (st != PKV_OK) return st;
    uint64_t sum = 0;
    for (uint32_t b = 0; b < p->capacity; b++) {
        if (p->fill[b] > p->B) return PKV_ERR_CORRUPT;
        if (p->fill[b] && pkv_pool_refcount(p->pool, b) == 0) return PKV_ERR_CORRUPT;
        sum += p->fill[b];
    }
    return sum == p->used ? PKV_OK : PKV_ERR_CORRUPT;
}

static void paged_destroy(void *pp) {
    paged *p = pp;
    if (!p) return;
    // The set before its cache (pkv/prefix.h): a run stopped mid-way still has
    // live sequences, whose release calls the cache's hook.
    pkv_seqset_destroy(p->set);
    pkv_prefix_cache_destroy(p->cache);
    pkv_pool_destroy(p->pool);
    free(p->fill);
    free(p->seq_base);
    free(p->seqs);
    free(p->nseq);
    free(p->tail_shared);
    free(p->tokens);
    free(p->cached_list);
    free(p->in_list);
    free(p->copies);
    free(p);
}

static pkv_seqset *paged_seqset(void *pp) { return ((paged *)pp)->set; }

static uint32_t paged_take_copies(void *pp, const pkv_block_copy **copies) {
    paged *p = pp;
    uint32_t n = p->num_copies;
    *copies = p->copies;
    p->num_copies = 0; // the buffer stays valid until the next grow
    return n;
}

static pkv_status paged_create(const pkv_policy_config *c, pkv_policy_info *info, void **out) {
    if (!c || !info || !out || c->block_size == 0 || c->block_size > 65536 || c->bytes_per_token == 0)
        return PKV_ERR_INVALID_ARG;
    const uint64_t blocks = c->capacity_bytes / (c->bytes_per_token * c->block_size);
    if (blocks == 0) return PKV_ERR_OUT_OF_BLOCKS;
    if (blocks > PKV_POOL_MAX_BLOCKS) return PKV_ERR_INVALID_ARG;
    paged *p = calloc(1, sizeof *p);
    if (!p) return PKV_ERR_OUT_OF_MEMORY;
    p->capacity_slots = blocks * c->block_size;
    p->B = c->block_size;
    p->capacity = (uint32_t)blocks;
    p->max_seqs = c->max_seqs;
    pkv_status st = pkv_pool_create(p->capacity, &p->pool);
    if (st == PKV_OK) st = pkv_seqset_create(p->pool, p->B, &p->set);
    if (st != PKV_OK) {
        paged_destroy(p);
        return st;
    }
    const size_t nr = c->num_requests ? c->num_requests : 1;
    p->fill = calloc(p->capacity, sizeof *p->fill);
    p->seq_base = malloc(nr * sizeof *p->seq_base);
    p->nseq = calloc(nr, sizeof *p->nseq);
    p->tail_shared = calloc(nr, 1);
    uint64_t total = 0;
    if (p->seq_base)
        for (size_t i = 0; i < c->num_requests; i++) {
            p->seq_base[i] = total;
            total += c->max_seqs[i];
        }
    p->seqs = malloc((size_t)(total ? total : 1) * sizeof *p->seqs);
    if (!p->fill || !p->seq_base || !p->nseq || !p->tail_shared || !p->seqs) {
        paged_destroy(p);
        return PKV_ERR_OUT_OF_MEMORY;
    }
    p->trace = c->trace;
    p->blocked_r = UINT32_MAX;
    // A recurrent state cannot be rebuilt from cached blocks, and this layout keeps
    // no state snapshots (vLLM without its hybrid manager does not prefix-cache such
    // models either): a model with a state group shares no prefix here.
    int has_state = 0;
    for (uint32_t g = 0; g < c->num_groups; g++) has_state |= c->groups[g].kind == PKV_LAYER_STATE;
    if (c->prefix_sharing && c->trace && !has_state) {
        st = pkv_prefix_cache_create(p->pool, p->B, p->capacity, &p->cache);
        if (st == PKV_OK) st = pkv_prefix_cache_attach(p->cache, p->set);
        if (st == PKV_OK) {
            p->cached_list = malloc((size_t)p->capacity * sizeof *p->cached_list);
            p->in_list = calloc(p->capacity, 1);
            if (!p->cached_list || !p->in_list) st = PKV_ERR_OUT_OF_MEMORY;
        }
        if (st != PKV_OK) {
            paged_destroy(p);
            return st;
        }
    }
    info->capacity_slots = p->capacity_slots;
    info->granularity = p->B;
    info->uses_arena = 1; // the pool stands for one allocation of the whole budget
    *out = p;
    return PKV_OK;
}

const pkv_policy_vtable pkvi_policy_paged_vtable = {
    .abi_version = PKV_POLICY_ABI_VERSION,
    .name = "paged",
    .create = paged_create,
    .destroy = paged_destroy,
    .need = paged_need,
    .fits_alone = paged_fits_alone,
    .admit = paged_admit,
    .commit = paged_commit,
    .fork = paged_fork,
    .grow = paged_grow,
    .release = paged_release,
    .stats = paged_stats,
    .reservation = paged_reservation,
    .request_slots = paged_request_slots,
    .validate = paged_validate,
    .seqset = paged_seqset,
    .seq_of = paged_seq_of,
    .take_copies = paged_take_copies,
};

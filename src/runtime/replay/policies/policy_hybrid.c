// SPDX-License-Identifier: MIT
// The hybrid-* KV policies (issue 23): the library's KV cache groups manager
// (pkv_hybrid, pkv/hybrid.h) under one of its layouts, each group's window rule
// applied (blocks that leave a sliding window or a local chunk go back to the
// pool):
//   hybrid-partition    one static pool per group, sized by its share of bytes
//                       per token;
//   hybrid-shared-page  one pool of equal pages, a block size per group (vLLM's
//                       hybrid KV cache manager);
//   hybrid-lcm          Jenga's two-level allocator (pages of the LCM of the
//                       groups' page sizes, carved per group).
// For a uniform model (one full group) every layout is one pool of blocks of B
// tokens, as `paged`: the same admissions, forks sharing every block,
// copy-on-write of a shared partial block, and (prefix sharing) the same hits.
//
// Accounting in token slots of cfg->bytes_per_token bytes (one token of every
// group): reserved = the bytes of the blocks (state slots) the groups hold,
// rounded up to slots; used = the bytes of the tokens the groups keep under their
// rule (groups.c: the window's tokens; a forked request's prompt once), rounded
// down, so that used <= reserved and the partly filled tails fit reserved - used.
// Per-group figures (stats.groups) come from pkv_hybrid_group_stats_get.
//
// Prefix sharing (cfg->prefix_sharing with a trace, sim mode): the manager's
// prefix cache (pkv/hybrid.h, "Prefix cache") with the per-kind hit rules, fed as
// `paged` feeds its cache: the same synthesized token ids (pkvi_trace_tokens), a
// request of a prefix group looks its prompt up at admission and offers the
// trace's declared shared prefix (prefix_tokens) when its prefill ends. The hit
// is the common one (a multiple of every group's block size); a group's
// cached_tokens counts the tokens of the blocks it shared (a sliding group only
// its window's; a state group the hit, whose state it copied). A model with a
// state group caches its state where the declared shared prefix ends
// (append_prompt), so that later requests of the group can hit there. Cache-only blocks count as free, in neither used nor reserved;
// used is then the manager's tokens_visible per group (a block shared across
// requests counted once, as paged's fill does), which without a cache equals
// the per-request count above. Run mode keeps the K/V in the model's hybrid store
// over this manager's pools (pkvi_policy_hybrid_run; run.c), the copies the
// policy takes handed to it.
//
// Swap (--preempt swap): swap_out moves the request's sequences to a host-side
// manager of the same groups and block sizes (pkv_hybrid_move: live blocks only,
// holes and sharing kept, a state slot per sequence), swap_in moves them back, so
// a swapped-in request holds what request_slots charged, a sliding group its
// window; an admission at the whole length would hold the context for a step.
#include <stdlib.h>
#include <string.h>

#include "pkv/hybrid.h"
#include "src/runtime/replay/replay_internal.h"
#include "src/runtime/trace/trace_internal.h"

typedef struct hybrid_policy {
    pkv_hybrid *h;
    pkv_hybrid_layout layout;
    pkvi_groups groups;           // the config's groups (cfg->group_bytes_per_token)
    uint32_t B[PKV_MAX_KV_GROUPS]; // block size per group (0: state group)
    uint64_t page[PKV_MAX_KV_GROUPS]; // bytes per block (state: per slot)
    uint64_t bpt, capacity_slots;
    const uint32_t *max_seqs;
    uint64_t *seq_base;  // [num_requests]: first entry of the request in seqs
    pkv_seq_id *seqs;    // [sum of n]
    uint32_t *nseq;      // [num_requests]
    uint32_t *prompt;    // [num_requests]: the prompt its samples share
    uint8_t *shared;     // [num_requests]: its samples share the prompt
    uint8_t *tail_shared; // [num_requests]: its samples share their partial last block
    uint64_t *kept;      // [num_requests]: bytes its kept tokens take (groups.c)
    uint64_t kept_total; // sum of kept
    pkv_block_copy *copies; // scratch for pkv_hybrid_take_copies
    uint32_t copies_cap;
    uint64_t cow_copies, copy_slots;
    double copy_bytes;   // exact, copy_slots is its floor in slots
    const pkv_trace *trace; // borrowed: token ids for the prefix cache
    int cache;           // 1: the manager's prefix cache is on
    int32_t *tokens;     // [tokens_cap] scratch for a prompt's token ids
    uint32_t tokens_cap;
    uint32_t tokens_of, tokens_n; // whose first tokens_n ids it holds (UINT32_MAX: none)
    uint64_t cached_tokens; // prompt tokens served from the cache (sum of hits)
    uint64_t group_cached[PKV_MAX_KV_GROUPS]; // per group: tokens of the blocks shared
    uint32_t blocked_r;      // with a cache: the last request refused admission, and
    uint64_t blocked_avail;  // free + evictable bytes then (skip identical retries)
    // Run mode (pkvi_policy_hybrid_run): the copies taken since the executor's last
    // look, in order, with their group; the executor runs them on its store.
    int keep_copies;
    pkv_block_copy *run_copies;
    uint8_t *run_group;
    uint32_t nrun, run_cap;
    // Swap (swap_out / swap_in): a swapped-out request's sequences live in a host
    // manager of the same groups and block sizes (created at the first swap, on
    // the host pool's budget), moved there and back by pkv_hybrid_move, so that a
    // swap-in restores exactly what the swap-out moved: a sliding group its window.
    pkv_hybrid_params host_params; // the device's, but the budget and no cache
    pkv_kv_group host_groups[PKV_MAX_KV_GROUPS];
    pkv_hybrid *host;
    uint8_t *out;          // [num_requests]: its sequences are in host
    pkv_block_copy *pairs; // scratch for the moves' pairs
    uint32_t pairs_cap;
} hybrid_policy;

static uint64_t ceil_div64(uint64_t a, uint64_t b) { return (a + b - 1) / b; }

static int is_shared_pool(pkv_hybrid_layout l) { return l != PKV_HYBRID_PARTITION; }

// ---- what a request keeps ----

// Bytes request r keeps under the groups' rules, as stored (its samples may differ
// by one token within a step: each sample's own length counts). Samples share the
// prompt's full blocks; its partial last block is shared only until they append
// (copy-on-write then gives each its own copy, as paged counts it).
static uint64_t kept_bytes(const hybrid_policy *p, uint32_t r) {
    const pkv_seq_id *s = &p->seqs[p->seq_base[r]];
    uint64_t total = 0;
    for (uint32_t g = 0; g < p->groups.n; g++) {
        if (p->groups.g[g].kind == PKV_LAYER_STATE) {
            total += (uint64_t)p->nseq[r] * p->groups.state_bytes[g];
            continue;
        }
        const uint64_t B = p->B[g];
        const uint64_t limit = p->tail_shared[r] ? p->prompt[r] : p->prompt[r] / B * B;
        uint64_t shared_part = 0, own = 0;
        for (uint32_t c = 0; c < p->nseq[r]; c++) {
            uint32_t len = 0;
            (void)pkv_hybrid_seq_length(p->h, s[c], &len);
            const uint64_t k = pkvi_groups_kept(&p->groups, g, 1, len, 0, 0);
            const uint64_t first = len - k;
            const uint64_t in_prompt = p->shared[r] && limit > first ? limit - first : 0;
            if (in_prompt > shared_part) shared_part = in_prompt;
            own += k - in_prompt;
        }
        total += (shared_part + own) * p->groups.bpt[g];
    }
    return total;
}

static void recount(hybrid_policy *p, uint32_t r) {
    p->kept_total -= p->kept[r];
    p->kept[r] = p->nseq[r] ? kept_bytes(p, r) : 0;
    p->kept_total += p->kept[r];
}

// Run mode: keep group g's n copies just taken for the executor.
static pkv_status keep(hybrid_policy *p, uint32_t g, uint32_t n) {
    if (n == 0) return PKV_OK; // (the buffers may still be NULL)
    if (p->nrun + n > p->run_cap) {
        uint32_t c = p->run_cap ? p->run_cap : 64;
        while (c < p->nrun + n) c *= 2;
        pkv_block_copy *k = realloc(p->run_copies, (size_t)c * sizeof *k);
        if (!k) return PKV_ERR_OUT_OF_MEMORY;
        p->run_copies = k;
        uint8_t *kg = realloc(p->run_group, c);
        if (!kg) return PKV_ERR_OUT_OF_MEMORY;
        p->run_group = kg;
        p->run_cap = c;
    }
    memcpy(p->run_copies + p->nrun, p->copies, (size_t)n * sizeof *p->run_copies);
    memset(p->run_group + p->nrun, (int)g, n);
    p->nrun += n;
    return PKV_OK;
}

// Take every group's queued copies (sim mode moves nothing; run mode keeps them
// for the executor) and count them.
static pkv_status drain_copies(hybrid_policy *p) {
    for (uint32_t g = 0; g < p->groups.n; g++) {
        uint32_t n = 0;
        pkv_status st = pkv_hybrid_take_copies(p->h, g, p->copies, p->copies_cap, &n);
        if (st == PKV_ERR_BUFFER_TOO_SMALL) {
            pkv_block_copy *c = realloc(p->copies, (size_t)n * sizeof *c);
            if (!c) return PKV_ERR_OUT_OF_MEMORY;
            p->copies = c;
            p->copies_cap = n;
            st = pkv_hybrid_take_copies(p->h, g, p->copies, p->copies_cap, &n);
        }
        if (st != PKV_OK) return st;
        if (p->keep_copies && (st = keep(p, g, n)) != PKV_OK) return st;
        if (p->groups.g[g].kind != PKV_LAYER_STATE) p->cow_copies += n;
        p->copy_bytes += (double)n * (double)p->page[g];
    }
    p->copy_slots = (uint64_t)(p->copy_bytes / (double)p->bpt);
    return PKV_OK;
}

// ---- life cycle ----

static void hybrid_destroy(void *pp) {
    hybrid_policy *p = pp;
    if (!p) return;
    pkv_hybrid_destroy(p->h);
    free(p->seq_base);
    free(p->seqs);
    free(p->nseq);
    free(p->prompt);
    free(p->shared);
    free(p->tail_shared);
    free(p->kept);
    free(p->copies);
    free(p->tokens);
    free(p->run_copies);
    free(p->run_group);
    pkv_hybrid_destroy(p->host);
    free(p->out);
    free(p->pairs);
    free(p);
}

static pkv_status hybrid_create(const pkv_policy_config *cfg, pkv_hybrid_layout layout,
                                pkv_policy_info *info, void **out) {
    hybrid_policy *p = calloc(1, sizeof *p);
    if (!p) return PKV_ERR_OUT_OF_MEMORY;
    p->layout = layout;
    p->tokens_of = UINT32_MAX;
    p->bpt = cfg->bytes_per_token;
    p->max_seqs = cfg->max_seqs;
    p->groups.n = cfg->num_groups;
    p->groups.elem_bytes = cfg->elem_bytes;
    memcpy(p->groups.g, cfg->groups, sizeof p->groups.g);
    memcpy(p->groups.bpt, cfg->group_bytes_per_token, sizeof p->groups.bpt);
    for (uint32_t g = 0; g < cfg->num_groups; g++)
        p->groups.state_bytes[g] = pkv_kv_group_state_bytes(&cfg->groups[g]);
    pkv_hybrid_params hp;
    pkv_hybrid_params_default(&hp);
    hp.groups = cfg->groups;
    hp.num_groups = cfg->num_groups;
    hp.elem_bytes = cfg->elem_bytes;
    hp.layout = layout;
    hp.budget_bytes = cfg->capacity_bytes;
    hp.block_size = cfg->block_size;
    if (cfg->params && cfg->params->max_batch) hp.max_seqs = cfg->params->max_batch;
    p->trace = cfg->trace;
    p->cache = cfg->prefix_sharing && cfg->trace;
    p->blocked_r = UINT32_MAX;
    if (p->cache) {
        hp.prefix_cache_blocks = UINT32_MAX; // as many as the pools hold
        // A fast hash when this build has it: replays hash every prompt of a prefix
        // group (a simulation, no adversary choosing prompts).
        hp.prefix_hash = pkv_hash_algo_available(PKV_HASH_XXH3_128) ? PKV_HASH_XXH3_128
                                                                    : PKV_HASH_SHA256;
    }
    p->host_params = hp;
    memcpy(p->host_groups, cfg->groups, sizeof p->host_groups);
    p->host_params.groups = p->host_groups;
    // The host pool's budget, capped at 16 budgets: what is swapped out was in the
    // budget, and a pool for an unbounded --swap-space would cost its metadata for
    // nothing (past the cap a swap-out is refused: the engine recomputes instead).
    const uint64_t swap = cfg->params ? cfg->params->swap_space_bytes : 0;
    const uint64_t cap = cfg->capacity_bytes > UINT64_MAX / 16 ? UINT64_MAX : 16 * cfg->capacity_bytes;
    p->host_params.budget_bytes = swap < cap ? swap : cap;
    p->host_params.prefix_cache_blocks = 0; // swapped sequences are looked up nowhere
    p->host_params.event_capacity = 0;
    pkv_status st = pkv_hybrid_create(&hp, &p->h);
    if (st != PKV_OK) {
        hybrid_destroy(p);
        // A budget that holds not one page of every pool (and the state slots) reads
        // as "no capacity", as for the other policies: create refuses both that and a
        // bad configuration with INVALID_ARG, so a larger budget tells them apart.
        if (st == PKV_ERR_INVALID_ARG) {
            for (uint64_t b = hp.budget_bytes ? hp.budget_bytes : 1; b < (1ull << 46); b *= 2) {
                pkv_hybrid *probe = NULL;
                hp.budget_bytes = b * 2;
                if (pkv_hybrid_create(&hp, &probe) == PKV_OK) {
                    pkv_hybrid_destroy(probe);
                    return PKV_ERR_OUT_OF_BLOCKS;
                }
            }
        }
        return st == PKV_ERR_OUT_OF_BLOCKS ? st : PKV_ERR_INVALID_ARG;
    }
    for (uint32_t g = 0; g < cfg->num_groups; g++) {
        pkv_hybrid_group_stats gs;
        pkv_hybrid_group_info(p->h, g, NULL, &p->B[g]);
        pkv_hybrid_group_stats_get(p->h, g, &gs);
        p->page[g] = gs.page_bytes;
    }
    uint64_t seqs = 0;
    for (uint32_t r = 0; r < cfg->num_requests; r++) seqs += cfg->max_seqs[r] ? cfg->max_seqs[r] : 1;
    const size_t n = cfg->num_requests ? cfg->num_requests : 1;
    p->seq_base = malloc(n * sizeof *p->seq_base);
    p->seqs = malloc((size_t)(seqs ? seqs : 1) * sizeof *p->seqs);
    p->nseq = calloc(n, sizeof *p->nseq);
    p->prompt = calloc(n, sizeof *p->prompt);
    p->shared = calloc(n, 1);
    p->tail_shared = calloc(n, 1);
    p->kept = calloc(n, sizeof *p->kept);
    p->out = calloc(n, 1);
    if (!p->seq_base || !p->seqs || !p->nseq || !p->prompt || !p->shared || !p->tail_shared || !p->kept ||
        !p->out) {
        hybrid_destroy(p);
        return PKV_ERR_OUT_OF_MEMORY;
    }
    uint64_t base = 0;
    for (uint32_t r = 0; r < cfg->num_requests; r++) {
        p->seq_base[r] = base;
        base += cfg->max_seqs[r] ? cfg->max_seqs[r] : 1;
    }
    p->capacity_slots = cfg->capacity_bytes / cfg->bytes_per_token;
    info->capacity_slots = p->capacity_slots;
    info->granularity = cfg->block_size <= p->capacity_slots ? cfg->block_size : 1;
    info->uses_arena = 1; // the pools are carved from one allocation of the budget
    *out = p;
    return PKV_OK;
}

// ---- sizes ----

// Blocks group g holds at most for `a` alone: a full (MLA) group every token (the
// prompt's full blocks shared by the samples); a windowed group the prompt's blocks
// at its prefill, then per sample at most ceil(W / B) + 1 blocks (pkv/hybrid.h).
static uint64_t peak_blocks(const pkv_kv_group *k, uint32_t B, const pkv_policy_admit *a) {
    const uint64_t shared = a->prompt / B;
    const uint64_t full = shared + (uint64_t)a->n * (ceil_div64(a->final_len, B) - shared);
    if (k->kind != PKV_LAYER_SLIDING && k->kind != PKV_LAYER_CHUNKED) return full;
    const uint64_t windowed = ceil_div64(a->prompt, B) + (uint64_t)a->n * (ceil_div64(k->window, B) + 1);
    return windowed < full ? windowed : full;
}

static uint64_t peak_bytes(const hybrid_policy *p, const pkv_policy_admit *a, uint32_t g) {
    const pkv_kv_group *k = &p->groups.g[g];
    if (k->kind == PKV_LAYER_STATE) return 0; // the state slots are set aside at create
    return peak_blocks(k, p->B[g], a) * p->page[g];
}

// Stateless: the config's block size for every group (shared-page's larger
// blocks of the thinner groups hold the same bytes, so the bound stays close).
static uint64_t hybrid_need(const pkv_policy_config *cfg, const pkv_policy_admit *a) {
    uint64_t bytes = 0;
    for (uint32_t g = 0; g < cfg->num_groups; g++)
        if (cfg->groups[g].kind != PKV_LAYER_STATE)
            bytes += peak_blocks(&cfg->groups[g], cfg->block_size, a) * cfg->block_size *
                     cfg->group_bytes_per_token[g];
    return ceil_div64(bytes, cfg->bytes_per_token);
}

// Bytes of free pages the watermark asks group g's pool to keep.
static uint64_t wm_bytes(const hybrid_policy *p, uint32_t g, uint64_t wm) {
    if (p->groups.g[g].kind == PKV_LAYER_STATE) return 0;
    return ceil_div64(wm, p->B[g]) * p->page[g];
}

// 1 if every pool has `extra(g)` bytes beyond what it holds now, with the
// watermark kept free. extra: peak bytes (fits_alone, from empty) or 0 (admit).
static int pools_fit(const hybrid_policy *p, const pkv_policy_admit *a, uint64_t wm, int from_empty) {
    uint64_t shared_need = 0, shared_free = 0, shared_evictable = 0;
    for (uint32_t g = 0; g < p->groups.n; g++) {
        if (p->groups.g[g].kind == PKV_LAYER_STATE) continue;
        pkv_hybrid_group_stats gs;
        pkv_hybrid_group_stats_get(p->h, g, &gs);
        // Blocks only the prefix cache holds are reclaimable: free for admission.
        const uint64_t evictable = from_empty ? 0 : gs.cached_evictable * gs.page_bytes;
        const uint64_t free_b = from_empty ? gs.capacity_bytes : gs.free_bytes;
        const uint64_t need = (a ? peak_bytes(p, a, g) : 0) + wm_bytes(p, g, wm);
        if (is_shared_pool(p->layout)) {
            shared_need += need;
            shared_free = free_b; // the whole pool's, under every group
            shared_evictable += evictable; // each group's cache, on the one pool
        } else if (need > free_b + evictable) {
            return 0;
        }
    }
    return shared_need <= shared_free + shared_evictable;
}

static int hybrid_fits_alone(const void *pp, const pkv_policy_admit *a, uint64_t wm) {
    const hybrid_policy *p = pp;
    // Admitted with the watermark free (its prompt), then grown to its peak.
    pkv_policy_admit at_admit = *a;
    at_admit.final_len = a->len;
    at_admit.n = a->nseq;
    return pools_fit(p, &at_admit, wm, 1) && pools_fit(p, a, 0, 1);
}

// ---- the engine's calls ----

static void free_request(hybrid_policy *p, uint32_t r) {
    pkv_seq_id *s = &p->seqs[p->seq_base[r]];
    for (uint32_t i = 0; i < p->nseq[r]; i++) (void)pkv_hybrid_seq_free(p->h, s[i]);
    p->nseq[r] = 0;
    recount(p, r);
}

// The first n token ids of request r. The last request's are kept: the head of
// the queue asks again every step it waits.
static int32_t *prompt_tokens(hybrid_policy *p, uint32_t r, uint32_t n) {
    if (p->tokens_of == r && p->tokens_n >= n) return p->tokens;
    int32_t *t = pkvi_trace_tokens_into(p->trace, r, n, &p->tokens, &p->tokens_cap);
    p->tokens_of = t ? r : UINT32_MAX;
    p->tokens_n = n;
    return t;
}

// 1 if request r may find (and offer) a cached prefix: a request outside every
// prefix group shares nothing with anyone (its lookup would only hash).
static int may_share(const hybrid_policy *p, uint32_t r) {
    return p->cache && p->trace->reqs[r].prefix_group >= 0;
}

// The request's first sequence: its prompt's longest cached prefix (*cached
// tokens of it, 0 without one) or an empty sequence.
static pkv_status create_first(hybrid_policy *p, uint32_t r, const pkv_policy_admit *a,
                               pkv_seq_id *id, uint32_t *cached) {
    *cached = 0;
    if (a->independent || a->len < a->prompt || !may_share(p, r))
        return pkv_hybrid_seq_create(p->h, id);
    const int32_t *tok = prompt_tokens(p, r, a->prompt);
    if (!tok) return PKV_ERR_OUT_OF_MEMORY;
    return pkv_hybrid_seq_create_cached(p->h, tok, a->prompt, id, cached);
}

// Append the prompt's tokens from `cached` on to the request's first sequence. A
// model with a state group caches its state where the trace's shared prefix ends
// (rounded down to the state interval): the prompt is appended up to there, the
// state snapshot queued (pkv_hybrid_cache_state), then the rest, as an engine
// that chunks its prefill at that boundary would (the step's cost is not split).
static pkv_status append_prompt(hybrid_policy *p, uint32_t r, pkv_seq_id id, uint32_t cached,
                                uint32_t prompt) {
    const uint32_t S = p->cache ? pkv_hybrid_state_interval(p->h) : 0;
    uint32_t at = cached;
    if (S && may_share(p, r)) {
        const uint32_t shared = p->trace->reqs[r].prefix_tokens;
        const uint32_t b = (shared < prompt ? shared : prompt) / S * S;
        const int32_t *tok = b > cached ? prompt_tokens(p, r, b) : NULL;
        if (tok) {
            pkv_status st = pkv_hybrid_append(p->h, id, b - cached, NULL);
            if (st != PKV_OK) return st;
            at = b;
            (void)pkv_hybrid_cache_state(p->h, id, tok, b, NULL); // no spare slot: no cache
        }
    }
    return pkv_hybrid_append(p->h, id, prompt - at, NULL);
}

// Count a successful admission's hit per group: right after create_cached a
// group's table is its hit, holes (before a window) and the blocks it shares.
// (The manager's own counters also count lookups of admissions refused later.)
static void count_hit(hybrid_policy *p, pkv_seq_id id, uint32_t hit) {
    for (uint32_t g = 0; g < p->groups.n; g++) {
        const pkv_block_id *t;
        uint32_t nb = 0, holes = 0;
        if (!p->B[g]) p->group_cached[g] += hit; // a state group: the cached state's
        else if (pkv_hybrid_block_table(p->h, id, g, &t, &nb, &holes) == PKV_OK)
            p->group_cached[g] += (uint64_t)(nb - holes) * p->B[g];
    }
}

// Free and cache-only bytes of every pool (a shared pool's free bytes once): what
// an admission may use.
static uint64_t avail_bytes(const hybrid_policy *p) {
    uint64_t sum = 0;
    int token_seen = 0;
    for (uint32_t g = 0; g < p->groups.n; g++) {
        pkv_hybrid_group_stats gs;
        pkv_hybrid_group_stats_get(p->h, g, &gs);
        const int state = p->groups.g[g].kind == PKV_LAYER_STATE;
        if (state || !is_shared_pool(p->layout) || !token_seen) sum += gs.free_bytes;
        token_seen |= !state;
        sum += gs.cached_evictable * gs.page_bytes;
    }
    return sum;
}

static pkv_status hybrid_admit(void *pp, uint32_t r, const pkv_policy_admit *a, uint64_t wm,
                               uint64_t *ext_frag, uint32_t *cached_out) {
    hybrid_policy *p = pp;
    *ext_frag = 0;   // fixed-size pages: any free page serves
    *cached_out = 0;
    // As paged: the head of the queue retries every step; with a cache, skip the
    // prompt's hashing while nothing was freed since its last refusal.
    if (p->cache && p->blocked_r == r && p->blocked_avail == avail_bytes(p))
        return PKV_ERR_OUT_OF_BLOCKS;
    pkv_seq_id *s = &p->seqs[p->seq_base[r]];
    pkv_status st = PKV_OK;
    uint32_t cached = 0;
    uint64_t counted[PKV_MAX_KV_GROUPS]; // a refused admission's hit does not count
    memcpy(counted, p->group_cached, sizeof counted);
    p->nseq[r] = 0;
    p->prompt[r] = a->prompt;
    p->shared[r] = !a->independent && a->nseq > 1 && a->len >= a->prompt;
    if (!p->shared[r]) {
        for (uint32_t i = 0; i < a->nseq && st == PKV_OK; i++) {
            uint32_t hit = 0;
            if ((st = i ? pkv_hybrid_seq_create(p->h, &s[i]) : create_first(p, r, a, &s[i], &hit)) != PKV_OK)
                break;
            p->nseq[r]++;
            if (i == 0 && hit) cached = hit, count_hit(p, s[0], hit);
            st = i == 0 && a->len == a->prompt ? append_prompt(p, r, s[0], hit, a->prompt)
                                               : pkv_hybrid_append(p->h, s[i], a->len - hit, NULL);
        }
    } else {
        // The prompt once, the samples forked from it, then each sample's own tokens.
        if ((st = create_first(p, r, a, &s[0], &cached)) == PKV_OK) {
            if (cached) count_hit(p, s[0], cached);
            p->nseq[r] = 1;
            st = append_prompt(p, r, s[0], cached, a->prompt);
        }
        for (uint32_t i = 1; i < a->nseq && st == PKV_OK; i++)
            if ((st = pkv_hybrid_seq_fork(p->h, s[0], &s[i])) == PKV_OK) p->nseq[r]++;
        for (uint32_t i = 0; i < a->nseq && st == PKV_OK && a->len > a->prompt; i++)
            st = pkv_hybrid_append(p->h, s[i], a->len - a->prompt, NULL);
    }
    if (st == PKV_OK) st = drain_copies(p);
    // All or nothing, the watermark kept free in every pool.
    if (st == PKV_OK && !pools_fit(p, NULL, wm, 0)) st = PKV_ERR_OUT_OF_BLOCKS;
    if (st != PKV_OK) {
        free_request(p, r);
        memcpy(p->group_cached, counted, sizeof counted);
        pkv_status d = drain_copies(p);
        if (p->cache && st == PKV_ERR_OUT_OF_BLOCKS) p->blocked_r = r, p->blocked_avail = avail_bytes(p);
        return st == PKV_ERR_OUT_OF_BLOCKS && d == PKV_OK ? PKV_ERR_OUT_OF_BLOCKS
               : st == PKV_ERR_OUT_OF_BLOCKS ? d : st;
    }
    p->tail_shared[r] = p->shared[r] && a->len == a->prompt;
    recount(p, r);
    *cached_out = cached;
    p->cached_tokens += cached;
    p->blocked_r = UINT32_MAX;
    return PKV_OK;
}

// The request's prefill step has ended: its prompt's full blocks hold K/V now.
// As paged, only the prefix the trace declares shared is offered (a real server
// caches every full block; the hits are the same and the simulation faster).
// Called before the request's next append, so windowed groups still hold the
// prompt's blocks.
static void hybrid_commit(void *pp, uint32_t r, uint32_t prompt) {
    hybrid_policy *p = pp;
    if (!may_share(p, r) || p->nseq[r] == 0) return;
    const uint32_t want = p->trace->reqs[r].prefix_tokens;
    const uint32_t n = want < prompt ? want : prompt;
    const int32_t *tok = n ? prompt_tokens(p, r, n) : NULL;
    if (tok) (void)pkv_hybrid_cache_prefix(p->h, p->seqs[p->seq_base[r]], tok, n, NULL);
}

static pkv_status hybrid_fork(void *pp, uint32_t r, uint32_t n) {
    hybrid_policy *p = pp;
    if (p->nseq[r] != 1 || n > p->max_seqs[r]) return PKV_ERR_INVALID_ARG;
    pkv_seq_id *s = &p->seqs[p->seq_base[r]];
    for (uint32_t i = 1; i < n; i++) {
        pkv_status st = pkv_hybrid_seq_fork(p->h, s[0], &s[i]);
        if (st != PKV_OK) return st;
        p->nseq[r]++;
    }
    uint32_t len = 0;
    (void)pkv_hybrid_seq_length(p->h, s[0], &len);
    p->shared[r] = n > 1;
    p->prompt[r] = len; // the samples share everything so far
    p->tail_shared[r] = n > 1;
    pkv_status st = drain_copies(p);
    recount(p, r);
    return st;
}

static pkv_status hybrid_grow(void *pp, uint32_t r, uint32_t child) {
    hybrid_policy *p = pp;
    if (child >= p->nseq[r]) return PKV_ERR_INVALID_ARG;
    pkv_status st = pkv_hybrid_append(p->h, p->seqs[p->seq_base[r] + child], 1, NULL);
    if (st != PKV_OK) return st;
    st = drain_copies(p);
    p->tail_shared[r] = 0; // the engine grows every sample before it samples
    recount(p, r);
    return st;
}

static void hybrid_release(void *pp, uint32_t r) {
    hybrid_policy *p = pp;
    if (p->out[r]) { // dropped while swapped out: its host copy goes
        pkv_seq_id *s = &p->seqs[p->seq_base[r]];
        for (uint32_t i = 0; i < p->nseq[r]; i++) (void)pkv_hybrid_seq_free(p->host, s[i]);
        p->nseq[r] = 0;
        p->out[r] = 0;
        return;
    }
    free_request(p, r);
    (void)drain_copies(p);
}

// ---- swap ----

// Move request r's sequences from `from` to `to` (pkv_hybrid_move: each token
// group's live blocks, shared ones once, holes kept; a state slot per sequence);
// p->seqs then names them in `to`. All or nothing.
static pkv_status move_request(hybrid_policy *p, uint32_t r, pkv_hybrid *from, pkv_hybrid *to) {
    pkv_seq_id *s = &p->seqs[p->seq_base[r]];
    pkv_hybrid_move_size sz;
    pkv_status st = pkv_hybrid_move_size_get(from, s, p->nseq[r], to, &sz);
    if (st != PKV_OK) return st;
    if (sz.num_pairs > p->pairs_cap) {
        pkv_block_copy *c = realloc(p->pairs, (size_t)sz.num_pairs * sizeof *c);
        if (!c) return PKV_ERR_OUT_OF_MEMORY;
        p->pairs = c;
        p->pairs_cap = sz.num_pairs;
    }
    pkv_seq_id *ids = malloc((size_t)(p->nseq[r] ? p->nseq[r] : 1) * sizeof *ids);
    if (!ids) return PKV_ERR_OUT_OF_MEMORY;
    uint32_t offsets[PKV_MAX_KV_GROUPS + 1], npairs = 0;
    st = pkv_hybrid_move(from, s, p->nseq[r], to, ids, p->pairs, p->pairs_cap, offsets, &npairs);
    if (st == PKV_OK) memcpy(s, ids, (size_t)p->nseq[r] * sizeof *s);
    free(ids);
    return st;
}

// Samples of r that grew in the step that preempted r hold one token more than
// the others: the engine restores every sample at the shorter length (that token
// was never computed), so they drop it. Samples forked at the end of the last
// step (r's first decode) shared the partial last block that the grow copied:
// they are forked again from an ungrown one, so that they share it as before.
// Later samples own their last blocks: they are truncated. A state cannot be
// rolled back (pkv_hybrid_seq_truncate): such a request is refused before
// anything changes.
static pkv_status drop_ungrown(hybrid_policy *p, uint32_t r) {
    pkv_seq_id *s = &p->seqs[p->seq_base[r]];
    uint32_t lo = UINT32_MAX, hi = 0, at = 0;
    for (uint32_t i = 0; i < p->nseq[r]; i++) {
        uint32_t l = 0;
        (void)pkv_hybrid_seq_length(p->h, s[i], &l);
        if (l < lo) lo = l, at = i;
        if (l > hi) hi = l;
    }
    if (lo == hi) return PKV_OK;
    const int refork = p->shared[r] && lo == p->prompt[r];
    for (uint32_t g = 0; g < p->groups.n && !refork; g++)
        if (p->groups.g[g].kind == PKV_LAYER_STATE) return PKV_ERR_UNSUPPORTED;
    for (uint32_t i = 0; i < p->nseq[r]; i++) {
        uint32_t l = 0;
        (void)pkv_hybrid_seq_length(p->h, s[i], &l);
        if (l == lo) continue;
        pkv_status st = refork ? pkv_hybrid_seq_free(p->h, s[i]) : pkv_hybrid_seq_truncate(p->h, s[i], lo);
        if (st == PKV_OK && refork) st = pkv_hybrid_seq_fork(p->h, s[at], &s[i]);
        if (st != PKV_OK) return st;
    }
    if (refork) p->tail_shared[r] = 1;
    return PKV_OK;
}

// Preempted by swap: the request's live blocks and states go to the host manager
// (created on the first swap with the host pool's budget; a budget it cannot be
// created on, or a host pool too full for the request, refuses: the engine then
// releases the request and recomputes it).
static pkv_status hybrid_swap_out(void *pp, uint32_t r) {
    hybrid_policy *p = pp;
    if (p->nseq[r] == 0 || p->out[r]) return PKV_ERR_INVALID_ARG;
    if (!p->host) {
        pkv_status st = pkv_hybrid_create(&p->host_params, &p->host);
        if (st != PKV_OK) return st;
    }
    pkv_status st = drop_ungrown(p, r);
    if (st != PKV_OK) return st;
    // A queued copy that writes a moved block has no data yet: take them first.
    st = drain_copies(p);
    if (st == PKV_OK) st = move_request(p, r, p->h, p->host);
    if (st != PKV_OK) return st;
    p->out[r] = 1;
    p->kept_total -= p->kept[r];
    p->kept[r] = 0;
    return PKV_OK;
}

// Back from the host manager: the sequences hold what the swap-out moved (a
// sliding group its window, not its context), all or nothing, the watermark kept
// free in every pool as admit keeps it.
static pkv_status hybrid_swap_in(void *pp, uint32_t r, const pkv_policy_admit *a, uint64_t wm,
                                 uint64_t *ext_frag) {
    hybrid_policy *p = pp;
    (void)a;
    *ext_frag = 0;
    if (!p->out[r]) return PKV_ERR_INVALID_ARG;
    pkv_status st = move_request(p, r, p->host, p->h); // OUT_OF_BLOCKS: stays out
    if (st != PKV_OK) return st;
    if (!pools_fit(p, NULL, wm, 0)) {
        // Back out again: the host pool just freed exactly these blocks and slots.
        st = move_request(p, r, p->h, p->host);
        return st == PKV_OK ? PKV_ERR_OUT_OF_BLOCKS : st;
    }
    p->out[r] = 0;
    recount(p, r);
    return PKV_OK;
}

static void hybrid_stats(const void *pp, pkv_policy_stats *s) {
    const hybrid_policy *p = pp;
    uint64_t held = 0, free_b = 0, visible = 0;
    s->num_groups = p->groups.n;
    for (uint32_t g = 0; g < p->groups.n; g++) {
        pkv_hybrid_group_stats gs;
        pkv_hybrid_group_stats_get(p->h, g, &gs);
        held += gs.used_bytes;
        if (!is_shared_pool(p->layout) || g == 0 || p->groups.g[g].kind == PKV_LAYER_STATE)
            free_b += gs.free_bytes; // a shared pool's free bytes once
        s->groups[g].bytes_held = gs.used_bytes;
        s->groups[g].tokens_held = gs.blocks_held * gs.block_size;
        s->groups[g].blocks_held = gs.blocks_held;
        s->groups[g].blocks_released = gs.blocks_released;
        s->groups[g].cached_tokens = p->group_cached[g];
        free_b += gs.cached_evictable * gs.page_bytes; // each group's cache: reclaimable
        visible += p->groups.g[g].kind == PKV_LAYER_STATE
                       ? (uint64_t)pkv_hybrid_live_count(p->h) * p->groups.state_bytes[g]
                       : gs.tokens_visible * p->groups.bpt[g];
    }
    const uint64_t reserved = ceil_div64(held, p->bpt);
    s->reserved = reserved < p->capacity_slots ? reserved : p->capacity_slots;
    // With a cache, requests share blocks: the manager counts each block once.
    const uint64_t used = (p->cache ? visible : p->kept_total) / p->bpt;
    s->used = used < s->reserved ? used : s->reserved;
    const uint64_t fs = free_b / p->bpt;
    s->free = fs < p->capacity_slots - s->reserved ? fs : p->capacity_slots - s->reserved;
    s->copy_slots = p->copy_slots;
    s->cow_copies = p->cow_copies;
    s->cached_tokens = p->cached_tokens;
}

// The partly filled last block of every sample in every token group, as far as
// the request will fill it, in whole slots (rounded down: stats' used is too).
static uint64_t hybrid_reservation(const void *pp, uint32_t r, uint32_t nseq, uint32_t len,
                                   uint32_t final_len) {
    const hybrid_policy *p = pp;
    uint64_t bytes = 0;
    for (uint32_t g = 0; g < p->groups.n; g++) {
        if (!p->B[g]) continue;
        const uint64_t end = ceil_div64(len, p->B[g]) * p->B[g];
        const uint64_t later = (end < final_len ? end : final_len) - len;
        bytes += later * p->groups.bpt[g];
    }
    // Samples that still share their partial last block (just forked) hold it once.
    return bytes * (p->tail_shared[r] ? 1 : nseq) / p->bpt;
}

// What a swap of request r moves, as pkv_hybrid_move would move it: each token
// group's live blocks (a sliding group its window's, the samples' shared blocks
// once) and a state slot per sample, in slots of bpt bytes rounded up. The engine
// asks before it releases the request; a request that holds nothing here gets the
// engine's default (nseq x len).
static uint64_t hybrid_request_slots(const void *pp, uint32_t r, uint32_t nseq, uint32_t len,
                                     uint32_t prompt) {
    const hybrid_policy *p = pp;
    (void)prompt;
    pkv_hybrid_move_size sz;
    if (!p->nseq[r] || pkv_hybrid_move_size_get(p->h, &p->seqs[p->seq_base[r]], p->nseq[r],
                                                NULL, &sz) != PKV_OK)
        return (uint64_t)(nseq ? nseq : 1) * len;
    return ceil_div64(sz.total_bytes, p->bpt);
}

static pkv_status hybrid_validate(const void *pp) {
    const hybrid_policy *p = pp;
    return pkv_hybrid_validate(p->h);
}

#define HYBRID_TABLE(ident, label, layout_value)                                              \
    static pkv_status ident##_create(const pkv_policy_config *cfg, pkv_policy_info *info,     \
                                     void **out) {                                            \
        return hybrid_create(cfg, layout_value, info, out);                                   \
    }                                                                                         \
    const pkv_policy_vtable pkvi_policy_##ident##_vtable = {                                  \
        .abi_version = PKV_POLICY_ABI_VERSION,                                                \
        .name = label,                                                                        \
        .create = ident##_create,                                                             \
        .destroy = hybrid_destroy,                                                            \
        .need = hybrid_need,                                                                  \
        .fits_alone = hybrid_fits_alone,                                                      \
        .admit = hybrid_admit,                                                                \
        .commit = hybrid_commit,                                                              \
        .fork = hybrid_fork,                                                                  \
        .grow = hybrid_grow,                                                                  \
        .release = hybrid_release,                                                            \
        .stats = hybrid_stats,                                                                \
        .reservation = hybrid_reservation,                                                    \
        .request_slots = hybrid_request_slots,                                                \
        .validate = hybrid_validate,                                                          \
        .swap_out = hybrid_swap_out,                                                          \
        .swap_in = hybrid_swap_in,                                                            \
    };

HYBRID_TABLE(hybrid_partition, "hybrid-partition", PKV_HYBRID_PARTITION)
HYBRID_TABLE(hybrid_shared_page, "hybrid-shared-page", PKV_HYBRID_SHARED_PAGE)
HYBRID_TABLE(hybrid_lcm, "hybrid-lcm", PKV_HYBRID_LCM)

// ---- run mode (run.c) ----

static int is_hybrid(const pkvi_policy *pol) {
    return pol->vt == &pkvi_policy_hybrid_partition_vtable ||
           pol->vt == &pkvi_policy_hybrid_shared_page_vtable ||
           pol->vt == &pkvi_policy_hybrid_lcm_vtable;
}

pkv_hybrid *pkvi_policy_hybrid_run(pkvi_policy *pol) {
    if (!pol || !is_hybrid(pol)) return NULL;
    hybrid_policy *p = pol->state;
    p->keep_copies = 1;
    return p->h;
}

pkv_seq_id pkvi_policy_hybrid_seq(const pkvi_policy *pol, uint32_t r, uint32_t child) {
    const hybrid_policy *p = pol->state;
    return child < p->nseq[r] ? p->seqs[p->seq_base[r] + child] : -1;
}

uint32_t pkvi_policy_hybrid_take_kept(pkvi_policy *pol, const pkv_block_copy **copies,
                                      const uint8_t **groups) {
    hybrid_policy *p = pol->state;
    const uint32_t n = p->nrun;
    *copies = p->run_copies;
    *groups = p->run_group;
    p->nrun = 0;
    return n;
}

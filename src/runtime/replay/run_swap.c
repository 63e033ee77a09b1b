// SPDX-License-Identifier: MIT
// Run mode's swap (--preempt swap) moves the K/V for real. When the engine
// preempts a request by swap (and the host pool has room), on_swap_out copies
// what the request computed -- every layer of every live sequence, forked samples
// included, len = prompt + emitted - 1 tokens each -- from the layout into host
// memory the executor owns, before the policy releases or swaps it out (its
// memory still holds it; the copies the policy took and not yet ran are run
// first, so the tables and the memory agree). After the swap-in, each sequence's
// copy is written back into the place the layout gives it, at the start of the
// first step that runs it, before its new tokens: it continues from exactly what
// it computed, as a recompute would, and the same greedy tokens follow. Both
// copies are timed in the step in which they happen (the swap-out's in the step
// whose decode preempted the request). A swap the engine falls back to recompute
// (on_swap_drop) keeps nothing.
// What moves, per layout (the same walk copies out and back in):
// - a block table over the pkv_cache (paged: the policy's; the per-token table:
//   the executor's): the K and V half of every block that holds a token, per
//   layer (whole blocks: a partial last block's spare slots are written before
//   they are read);
// - a store row (contiguous store, VMM slots): the row's tokens, per layer and
//   K/V (per kv head where the store is head-major);
// - hybrid-vmm's real spaces (CPU): per group and buffer the mapped bytes of the
//   slot's row that hold its tokens (a sliding group its window's pages; a state
//   group its state), written back into the slot the sync maps for its step;
// - the hybrid store: per token group the live blocks (a sliding group its
//   window), as the manager's table lists them; a model with state layers also
//   moves each sequence's state entry (every state layer's, and the tokens it
//   absorbed) into the entry of its slot after the swap-in.
// Host side: one malloc per swapped-out request; the device side goes through the
// executor's backend (memcpy on the host, cudaMemcpy on CUDA).
#include <stdlib.h>
#include <string.h>

#include "run_exec.h"
#include "src/allocator/clock.h"
#include "src/runtime/model/hybrid_store.h"
#include "src/runtime/model/model_internal.h"

// A swapped-out request's copy: [nseq + 1] offsets, [nseq] restore flags, then
// each sequence's bytes.
typedef struct run_saved {
    uint8_t *data; // NULL: nothing kept
    uint32_t nseq, len;
    int in; // swapped in: its sequences' flags say which still wait for their copy
} run_saved;

enum { WALK_OUT, WALK_IN, WALK_MEASURE };

typedef struct walk {
    run_exec *x;
    uint8_t *cur; // host side
    uint64_t bytes;
    int dir;
} walk;

static pkv_status move(walk *w, void *dev, uint64_t n) {
    pkv_status st = PKV_OK;
    if (w->dir == WALK_OUT) st = pkv_backend_download(w->x->backend, w->cur, dev, (size_t)n);
    else if (w->dir == WALK_IN) st = pkv_backend_upload(w->x->backend, dev, w->cur, (size_t)n);
    if (w->dir != WALK_MEASURE) w->cur += n;
    w->bytes += n;
    return st;
}

// A block table over the cache: the blocks of the first len tokens.
static pkv_status walk_table(walk *w, pkv_seq_id id, uint32_t len) {
    run_exec *x = w->x;
    const pkv_block_id *t;
    uint32_t nb;
    pkv_status st = pkv_seq_block_table(x->set, id, &t, &nb);
    const uint32_t bs = pkv_seqset_block_size(x->set);
    const uint32_t need = (uint32_t)(((uint64_t)len + bs - 1) / bs);
    if (st == PKV_OK && nb < need) st = PKV_ERR_CORRUPT;
    for (uint32_t l = 0; l < x->layers && st == PKV_OK; l++)
        for (uint32_t b = 0; b < need && st == PKV_OK; b++)
            for (int kv = PKV_K; kv <= PKV_V && st == PKV_OK; kv++) {
                void *p;
                st = pkv_cache_block_ptr(x->cache, l, t[b], (pkv_kv)kv, &p);
                if (st == PKV_OK) st = move(w, p, x->half_block);
            }
    return st;
}

// A store row: its first len tokens, in the runs the store's own row moves copy.
static pkv_status walk_row(walk *w, uint32_t row, uint32_t len) {
    const pkv_contig_kv *kv = w->x->store;
    pkv_model_config c;
    pkv_status st = pkv_model_get_config(w->x->model, &c);
    const uint64_t room = kv->max_len ? kv->max_len : kv->cap[row];
    if (st == PKV_OK && (w->dir == WALK_OUT ? kv->len[row] < len : room < len)) st = PKV_ERR_CORRUPT;
    const uint64_t hd = c.head_dim, es = kv->esize;
    const int head_major = kv->token_stride == hd;
    const uint32_t runs = head_major ? c.num_kv_heads : 1;
    const uint64_t n = (uint64_t)len * (head_major ? hd : kv->token_stride) * es;
    for (uint32_t l = 0; l < c.num_layers && st == PKV_OK && n > 0; l++)
        for (uint32_t h = 0; h < runs && st == PKV_OK; h++) {
            const uint64_t at = (l * kv->layer_stride + h * kv->head_stride + kv->off[row] * kv->row_unit) * es;
            st = move(w, (char *)kv->k + at, n);
            if (st == PKV_OK) st = move(w, (char *)kv->v + at, n);
        }
    return st;
}

// Host-side bytes that travel with the data (the hybrid tables' shapes).
static void meta(walk *w, uint32_t *v, uint32_t n) {
    const size_t b = n * sizeof *v;
    if (w->dir == WALK_OUT) memcpy(w->cur, v, b);
    else if (w->dir == WALK_IN) memcpy(v, w->cur, b);
    if (w->dir != WALK_MEASURE) w->cur += b;
    w->bytes += b;
}

// The hybrid store's states of sequence id (every state layer's, one entry keyed by
// its slot in the first state group g; nothing for the other state groups): the
// tokens they absorbed, then the floats. Back in, the entry of its new slot.
static pkv_status walk_states(walk *w, pkv_seq_id id, uint32_t g) {
    run_exec *x = w->x;
    int32_t first_group, slot;
    pkv_model_state_store *states;
    pkv_status st = pkvi_hybrid_store_states(x->hstore, &first_group, &states);
    if (st != PKV_OK || (int32_t)g != first_group) return st;
    if ((st = pkv_hybrid_state_slot(x->hyb, id, g, &slot)) != PKV_OK) return st;
    float *state = NULL;
    uint32_t *tokens = NULL, absorbed = 0;
    const uint64_t bytes = pkvi_state_store_entry_bytes(states);
    if (w->dir == WALK_OUT || w->dir == WALK_MEASURE) {
        st = pkvi_state_store_entry(states, slot, 0, &state, &tokens);
        if (st == PKV_ERR_NOT_FOUND) return PKV_ERR_CORRUPT; // a live sequence has one
        if (st != PKV_OK) return st;
        absorbed = *tokens;
        meta(w, &absorbed, 1);
        return move(w, state, bytes);
    }
    st = pkvi_state_store_entry(states, slot, 1, &state, &tokens); // a stale entry is overwritten
    if (st != PKV_OK) return st;
    meta(w, &absorbed, 1);
    *tokens = absorbed;
    return move(w, state, bytes);
}

// The hybrid store: per token group, the live blocks of the first len tokens.
// Swapped in, the window may start later than it did (a sample that grew in the
// preempting step released one more block): the blocks before it stay unwritten.
static pkv_status walk_hybrid(walk *w, pkv_seq_id id, uint32_t len) {
    run_exec *x = w->x;
    const uint32_t ng = pkv_hybrid_num_groups(x->hyb);
    pkv_status st = PKV_OK;
    for (uint32_t g = 0; g < ng && st == PKV_OK; g++) {
        pkv_kv_group grp;
        uint32_t bs = 0, nb = 0, first = 0;
        const pkv_block_id *t = NULL;
        st = pkv_hybrid_group_info(x->hyb, g, &grp, &bs);
        if (st == PKV_OK && grp.kind == PKV_LAYER_STATE) {
            st = walk_states(w, id, g);
            continue;
        }
        if (st == PKV_OK) st = pkv_hybrid_block_table(x->hyb, id, g, &t, &nb, &first);
        const uint32_t need = bs ? (uint32_t)(((uint64_t)len + bs - 1) / bs) : 0;
        if (st == PKV_OK && (nb < need || first > need)) st = PKV_ERR_CORRUPT;
        if (st != PKV_OK) break;
        uint32_t saved_first = first; // in: read back from the copy
        meta(w, &saved_first, 1);
        uint64_t page = 0; // bytes of one block of the group
        for (uint32_t b = saved_first; b < need && st == PKV_OK; b++) {
            if (b < first) { // released since (in only): skip its saved bytes
                uint32_t region;
                uint64_t off;
                if (page == 0) // every block of the group has the size of its block 0
                    st = pkvi_hybrid_store_block(x->hstore, g, 0, &region, &off, &page);
                w->cur += page;
                continue;
            }
            uint32_t region;
            uint64_t off, bytes, rb;
            float *data;
            st = pkvi_hybrid_store_block(x->hstore, g, (uint32_t)t[b], &region, &off, &bytes);
            if (st == PKV_OK) st = pkvi_hybrid_store_region(x->hstore, region, &data, &rb);
            if (st == PKV_OK) st = move(w, (char *)data + off, bytes);
            page = bytes;
        }
    }
    return st;
}

// hybrid-vmm (CPU): per group and buffer, the bytes of the slot's row that are
// mapped and hold one of the first len tokens (a state group: its state). Back in,
// only what the step's mapping covers is written (the decoder reads nothing else;
// the rest of the copy is skipped).
static pkv_status walk_hvmm(walk *w, pkv_seq_id slot, uint32_t len) {
    pkv_hybrid_vmm *h = pkvi_run_hvmm_manager(w->x->hvmm);
    pkv_model_config c;
    pkv_status st = slot >= 0 ? pkv_model_get_config(w->x->model, &c) : PKV_ERR_CORRUPT;
    for (uint32_t g = 0; st == PKV_OK && g < PKV_MAX_KV_GROUPS; g++) {
        const pkv_vmm_space *sp = pkv_hybrid_vmm_space(h, g);
        if (!sp) break; // past the last group
        const uint64_t tb = pkv_hybrid_vmm_buffer_token_bytes(h, g);
        const int state = g < c.num_kv_groups && c.kv_groups[g].kind == PKV_LAYER_STATE;
        pkv_vmm_info info;
        if ((st = pkv_vmm_get_info(sp, &info)) != PKV_OK) break;
        const uint64_t limit = state ? tb : (uint64_t)len * tb;
        const uint64_t first = pkv_vmm_slot_first_page(sp, (uint32_t)slot) * info.page_bytes;
        const uint64_t end = first + pkv_vmm_slot_pages(sp, (uint32_t)slot) * info.page_bytes;
        uint32_t range[4] = {0}; // [from, to) of the copy, as two 32-bit halves each
        if (w->dir != WALK_IN) {
            const uint64_t from = first, to = end < limit ? end : limit;
            const uint64_t span[2] = {from, to > from ? to : from};
            memcpy(range, span, sizeof span);
        }
        meta(w, range, 4);
        uint64_t span[2];
        memcpy(span, range, sizeof span);
        for (uint32_t b = 0; b < info.num_buffers && st == PKV_OK; b++) {
            void *base;
            if ((st = pkv_vmm_buffer_ptr(sp, b, &base)) != PKV_OK) break;
            char *row = (char *)base + (uint64_t)slot * info.buffer_bytes;
            const uint64_t n = span[1] - span[0];
            if (w->dir != WALK_IN) {
                st = move(w, row + span[0], n);
                continue;
            }
            const uint64_t lo = span[0] > first ? span[0] : first, hi = span[1] < end ? span[1] : end;
            if (lo < hi)
                st = pkv_backend_upload(w->x->backend, row + lo, w->cur + (lo - span[0]), (size_t)(hi - lo));
            w->cur += n;
            w->bytes += n;
        }
    }
    return st;
}

// Walk (r, child)'s K/V in `where` (WALK_IN) or in its current place.
static pkv_status walk_seq(walk *w, uint32_t r, uint32_t child, pkv_seq_id where, uint32_t len) {
    run_exec *x = w->x;
    const int in = w->dir == WALK_IN;
    if (x->hvmm) { // a sample forked since the last step: its parent's rows
        pkv_seq_id slot = in ? where : pkvi_run_hvmm_slot(x->hvmm, r, child);
        if (!in && slot < 0 && child) slot = pkvi_run_hvmm_slot(x->hvmm, r, 0);
        return walk_hvmm(w, slot, len);
    }
    if (x->hstore)
        return walk_hybrid(w, in ? where : pkvi_policy_hybrid_seq(x->pol, r, child), len);
    if (x->store) {
        pkv_seq_id row = in ? where : *pkvi_run_mirror(x, r, child);
        // A sample forked since the last step holds its parent's K/V, not yet copied.
        if (!in && x->fork_pending[x->mbase[r] + child]) row = *pkvi_run_mirror(x, r, 0);
        return row >= 0 ? walk_row(w, (uint32_t)row, len) : PKV_ERR_CORRUPT;
    }
    pkv_seq_id id = where;
    if (!in) id = x->own ? *pkvi_run_mirror(x, r, child) : x->pol->vt->seq_of(x->pol->state, r, child);
    return id >= 0 ? walk_table(w, id, len) : PKV_ERR_CORRUPT;
}

static uint64_t *offsets(const run_saved *s) { return (uint64_t *)(void *)s->data; }
static uint8_t *flags(const run_saved *s) { return s->data + (s->nseq + 1) * sizeof(uint64_t); }

static void drop(run_saved *s) {
    free(s->data);
    memset(s, 0, sizeof *s);
}

static pkv_status save(run_exec *x, uint32_t r, uint32_t nseq, uint32_t len) {
    run_saved *s = &x->saved[r];
    pkv_status st = pkvi_run_flush_copies(x);
    const uint64_t head = (nseq + 1) * sizeof(uint64_t) + nseq;
    uint64_t total = head;
    for (uint32_t c = 0; c < nseq && st == PKV_OK; c++) {
        walk m = {x, NULL, 0, WALK_MEASURE};
        st = walk_seq(&m, r, c, -1, len);
        total += m.bytes;
    }
    if (st != PKV_OK) return st;
    s->data = total <= SIZE_MAX ? malloc((size_t)total) : NULL;
    if (!s->data) return PKV_ERR_OUT_OF_MEMORY;
    s->nseq = nseq;
    s->len = len;
    walk w = {x, s->data + head, 0, WALK_OUT};
    for (uint32_t c = 0; c < nseq && st == PKV_OK; c++) {
        offsets(s)[c] = (uint64_t)(w.cur - s->data);
        st = walk_seq(&w, r, c, -1, len);
    }
    offsets(s)[nseq] = (uint64_t)(w.cur - s->data);
    x->swapped += w.bytes;
    return st;
}

void pkvi_run_on_swap_out(pkvi_executor *e, uint32_t r, uint32_t nseq, uint32_t len) {
    run_exec *x = (run_exec *)e;
    if (x->err != PKV_OK) return;
    if (!x->saved) {
        const uint32_t nr = x->pol->cfg.num_requests;
        x->saved = calloc(nr ? nr : 1, sizeof *x->saved);
        if (!x->saved) {
            x->err = PKV_ERR_OUT_OF_MEMORY;
            return;
        }
    }
    run_saved *s = &x->saved[r];
    if (s->data && s->in && s->nseq == nseq && s->len == len) {
        // Swapped in and out again before it ran: the copy still holds what it computed.
        s->in = 0;
        return;
    }
    drop(s);
    const double t0 = pkvi_now_seconds();
    pkv_status st = save(x, r, nseq, len);
    x->swap_s += pkvi_now_seconds() - t0;
    if (st != PKV_OK) {
        drop(s);
        x->err = st;
    }
}

void pkvi_run_on_swap_drop(pkvi_executor *e, uint32_t r) {
    run_exec *x = (run_exec *)e;
    if (x->saved) drop(&x->saved[r]);
}

void pkvi_run_on_swap_in(pkvi_executor *e, uint32_t r) {
    run_exec *x = (run_exec *)e;
    run_saved *s = x->saved ? &x->saved[r] : NULL;
    if (!s || !s->data) {
        if (x->err == PKV_OK) x->err = PKV_ERR_CORRUPT; // swapped in, never out
        return;
    }
    s->in = 1;
    memset(flags(s), 1, s->nseq);
    if (x->hvmm) pkvi_run_hvmm_resume(x->hvmm, r, s->nseq); // slots at the next sync
}

uint32_t pkvi_run_swap_pending(const run_exec *x, uint32_t r, uint32_t child) {
    const run_saved *s = x->saved ? &x->saved[r] : NULL;
    return s && s->data && s->in && child < s->nseq && flags(s)[child] ? s->len : 0;
}

pkv_status pkvi_run_swap_restore(run_exec *x, uint32_t r, uint32_t child, pkv_seq_id where) {
    run_saved *s = &x->saved[r];
    if (!pkvi_run_swap_pending(x, r, child)) return PKV_ERR_CORRUPT;
    walk w = {x, s->data + offsets(s)[child], 0, WALK_IN};
    pkv_status st = walk_seq(&w, r, child, where, s->len);
    if (st == PKV_OK && w.cur != s->data + offsets(s)[child + 1]) st = PKV_ERR_CORRUPT;
    if (st != PKV_OK) return st;
    x->swapped += w.bytes;
    flags(s)[child] = 0;
    if (!memchr(flags(s), 1, s->nseq)) drop(s); // every sequence back
    return PKV_OK;
}

void pkvi_run_swap_release(run_exec *x, uint32_t r) {
    // Preempted by swap the hook kept the copy first (not `in`): it stays.
    if (x->saved && x->saved[r].in) drop(&x->saved[r]);
}

void pkvi_run_swap_free(run_exec *x) {
    if (!x->saved) return;
    for (uint32_t r = 0; r < x->pol->cfg.num_requests; r++) free(x->saved[r].data);
    free(x->saved);
    x->saved = NULL;
}

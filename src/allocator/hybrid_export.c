// SPDX-License-Identifier: MIT
// Per-group views of the hybrid KV manager: block tables, the padded and CSR
// exports (manager ids translated to the group's set ids, then seq.h's exports),
// and the per-group copy queues (a token group's copy-on-write queue is its set's;
// a state group's fork copies live in the group and pin their slots).
#include <string.h>

#include "hybrid_internal.h"

pkv_status pkv_hybrid_block_table(const pkv_hybrid *h, pkv_seq_id id, uint32_t g,
                                  const pkv_block_id **table, uint32_t *num_blocks,
                                  uint32_t *first_live) {
    if (!h || !table || !num_blocks || !pkvi_hybrid_is_token_group(h, g))
        return PKV_ERR_INVALID_ARG;
    const pkvi_hrecord *r = pkvi_hybrid_rec(h, id);
    if (!r) return PKV_ERR_NOT_FOUND;
    const pkvi_hgroup *hg = &h->groups[g];
    pkv_status st = pkv_seq_block_table(hg->set, r->gid[g], table, num_blocks);
    uint32_t holes = 0;
    if (st == PKV_OK) st = pkv_seq_released_blocks(hg->set, r->gid[g], &holes);
    if (first_live) *first_live = holes;
    return st;
}

// Translate seqs into group g's ids in h->gids (every id checked first: an export
// with an unknown id writes nothing).
static pkv_status to_group_ids(const pkv_hybrid *h, uint32_t g, const pkv_seq_id *seqs,
                               uint32_t n) {
    if (!h || !pkvi_hybrid_is_token_group(h, g) || (n && !seqs)) return PKV_ERR_INVALID_ARG;
    for (uint32_t i = 0; i < n; i++)
        if (!pkvi_hybrid_rec(h, seqs[i])) return PKV_ERR_NOT_FOUND;
    pkv_hybrid *w = (pkv_hybrid *)h; // scratch only (h came from calloc)
    pkv_status st = pkvi_hybrid_reserve_scratch(w, n);
    if (st != PKV_OK) return st;
    for (uint32_t i = 0; i < n; i++) w->gids[i] = pkvi_hybrid_rec(h, seqs[i])->gid[g];
    return PKV_OK;
}

pkv_status pkv_hybrid_export_size(const pkv_hybrid *h, uint32_t g, const pkv_seq_id *seqs,
                                  uint32_t num_seqs, uint32_t *max_blocks,
                                  uint64_t *total_blocks) {
    pkv_status st = to_group_ids(h, g, seqs, num_seqs);
    if (st != PKV_OK) return st;
    return pkv_seqset_export_size(h->groups[g].set, h->gids, num_seqs, max_blocks, total_blocks);
}

pkv_status pkv_hybrid_export_padded(const pkv_hybrid *h, uint32_t g, const pkv_seq_id *seqs,
                                    uint32_t num_seqs, uint32_t max_blocks, int32_t pad_value,
                                    int32_t *table, int32_t *lens) {
    pkv_status st = to_group_ids(h, g, seqs, num_seqs);
    if (st != PKV_OK) return st;
    return pkv_seqset_export_padded(h->groups[g].set, h->gids, num_seqs, max_blocks, pad_value,
                                    table, lens);
}

pkv_status pkv_hybrid_export_csr(const pkv_hybrid *h, uint32_t g, const pkv_seq_id *seqs,
                                 uint32_t num_seqs, int32_t *indptr, int32_t *indices,
                                 uint32_t indices_cap, int32_t *last_page_len,
                                 int32_t *first_block) {
    pkv_status st = to_group_ids(h, g, seqs, num_seqs);
    if (st != PKV_OK) return st;
    return pkv_seqset_export_csr_live(h->groups[g].set, h->gids, num_seqs, indptr, indices,
                                      indices_cap, last_page_len, first_block);
}

uint32_t pkv_hybrid_pending_copies(const pkv_hybrid *h, uint32_t g) {
    if (!h || g >= h->num_groups) return 0;
    const pkvi_hgroup *hg = &h->groups[g];
    return hg->set ? pkv_seqset_pending_copies(hg->set) : hg->num_copies;
}

pkv_status pkv_hybrid_take_copies(pkv_hybrid *h, uint32_t g, pkv_block_copy *copies,
                                  uint32_t cap, uint32_t *n) {
    if (!h || !n || (!copies && cap) || g >= h->num_groups) return PKV_ERR_INVALID_ARG;
    pkvi_hgroup *hg = &h->groups[g];
    pkv_status st;
    if (hg->set) {
        st = pkv_seqset_take_copies(hg->set, copies, cap, n);
    } else {
        *n = hg->num_copies;
        if (cap < hg->num_copies) return PKV_ERR_BUFFER_TOO_SMALL;
        if (hg->num_copies) memcpy(copies, hg->copies, hg->num_copies * sizeof *copies);
        st = PKV_OK;
        for (uint32_t i = 0; i < hg->num_copies; i++) { // drop the pins
            pkv_block_id pins[2] = {hg->copies[i].src, hg->copies[i].dst};
            if (pkv_pool_release_n(hg->pool, pins, 2) != PKV_OK) st = PKV_ERR_CORRUPT;
            else pkvi_hybrid_prefix_unpinned(h, g, pins[0], pins[1]);
        }
        hg->num_copies = 0;
    }
    pkvi_hybrid_released(h);
    return st;
}

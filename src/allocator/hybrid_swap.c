// SPDX-License-Identifier: MIT
// Swap for the hybrid KV manager: moving sequences to another manager of the same
// groups (a device manager and a host one), per group as pkv_seq_move_group does
// for one set. Each token group that owns a set moves only its live blocks (holes
// stay holes: a sliding group moves its window, not its context), keeping the
// sharing among the moved sequences; each state group moves one slot per
// sequence. All or nothing over every group and both managers: every step that
// can fail (ids, queued copies, the caller's buffer, state slots, the pools of
// `to`, host memory) runs before the first group changes, then the commit cannot
// fail.
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "hybrid_internal.h"
#include "seqset_internal.h"

static int is_state(const pkv_hybrid *h, uint32_t g) {
    return h->groups[g].desc.kind == PKV_LAYER_STATE;
}

// The first field in which two groups differ, NULL if none. (The allocator core
// does not link model_config.c, so kinds are named by number.)
static const char *desc_diff(const pkv_kv_group *a, const pkv_kv_group *b, uint64_t *va,
                             uint64_t *vb) {
#define PKVI_FIELD(f)                                                                    \
    if (a->f != b->f) {                                                                  \
        *va = a->f;                                                                      \
        *vb = b->f;                                                                      \
        return #f;                                                                       \
    }
    PKVI_FIELD(kind)
    PKVI_FIELD(num_layers)
    PKVI_FIELD(num_kv_heads)
    PKVI_FIELD(head_dim)
    PKVI_FIELD(window)
    PKVI_FIELD(latent_dim)
    PKVI_FIELD(rope_dim)
    PKVI_FIELD(sinks)
    PKVI_FIELD(state_bytes)
#undef PKVI_FIELD
    return NULL;
}

// PKV_OK when sequences of `from` fit `to`'s groups, else PKV_ERR_INVALID_ARG and
// the first mismatch in reason (optional).
static pkv_status check_pair(const pkv_hybrid *from, const pkv_hybrid *to, char *reason,
                             size_t cap) {
    char why[160] = "";
    if (!from || !to) snprintf(why, sizeof why, "a manager is NULL");
    else if (from == to) snprintf(why, sizeof why, "from and to are the same manager");
    else if (from->num_groups != to->num_groups)
        snprintf(why, sizeof why, "from has %u groups, to has %u", from->num_groups,
                 to->num_groups);
    else if (from->elem_bytes != to->elem_bytes)
        snprintf(why, sizeof why, "elem_bytes %zu in from, %zu in to", from->elem_bytes,
                 to->elem_bytes);
    else if ((from->layout == PKV_HYBRID_PAGED) != (to->layout == PKV_HYBRID_PAGED))
        snprintf(why, sizeof why,
                 "layout %s to %s: the paged layout keeps one table for every token group",
                 pkv_hybrid_layout_name(from->layout), pkv_hybrid_layout_name(to->layout));
    for (uint32_t g = 0; !why[0] && g < from->num_groups; g++) {
        const pkvi_hgroup *a = &from->groups[g], *b = &to->groups[g];
        uint64_t va = 0, vb = 0;
        const char *field = desc_diff(&a->desc, &b->desc, &va, &vb);
        if (field)
            snprintf(why, sizeof why, "group %u: %s %llu in from, %llu in to", g, field,
                     (unsigned long long)va, (unsigned long long)vb);
        else if (a->block_size != b->block_size)
            snprintf(why, sizeof why, "group %u: block size %u in from, %u in to", g,
                     a->block_size, b->block_size);
    }
    if (reason && cap) snprintf(reason, cap, "%s", why);
    return why[0] ? PKV_ERR_INVALID_ARG : PKV_OK;
}

pkv_status pkv_hybrid_move_check(const pkv_hybrid *from, const pkv_hybrid *to, char *reason,
                                 size_t cap) {
    return check_pair(from, to, reason, cap);
}

// One move in the making: a seqset move per owned set and the group ids.
typedef struct move {
    pkv_hybrid *from, *to;
    uint32_t n;
    pkv_seq_id *gids;                   // [num_groups * n]: group g's ids of ids in from
    pkv_seq_id *new_gids;               // [num_groups * n]: ... and in to
    pkvi_seq_move sets[PKV_MAX_KV_GROUPS];
    uint32_t pairs[PKV_MAX_KV_GROUPS];  // pairs of group g (aliases 0)
} move;

static void move_free(move *m) {
    for (uint32_t g = 0; g < PKV_MAX_KV_GROUPS; g++) pkvi_seq_move_abort(&m->sets[g]);
    free(m->gids);
    free(m->new_gids);
}

// Check the ids and plan every owned set's move. Changes nothing visible. A
// duplicate id is a duplicate in the first owned set (one manager id is one id in
// every set): its plan refuses it.
static pkv_status move_plan(pkv_hybrid *from, const pkv_seq_id *ids, uint32_t n,
                            pkv_hybrid *to, move *m) {
    memset(m, 0, sizeof *m);
    m->from = from;
    m->to = to;
    m->n = n;
    const size_t k = (size_t)from->num_groups * n;
    m->gids = malloc(k * sizeof *m->gids + 1);
    m->new_gids = malloc(k * sizeof *m->new_gids + 1);
    if (!m->gids || !m->new_gids) return PKV_ERR_OUT_OF_MEMORY;
    for (uint32_t i = 0; i < n; i++) {
        const pkvi_hrecord *r = pkvi_hybrid_rec(from, ids[i]);
        if (!r) return PKV_ERR_NOT_FOUND;
        for (uint32_t g = 0; g < from->num_groups; g++) m->gids[(size_t)g * n + i] = r->gid[g];
    }
    for (uint32_t g = 0; g < from->num_groups; g++) {
        const pkvi_hgroup *hg = &from->groups[g];
        if (is_state(from, g)) m->pairs[g] = n;
        if (!hg->owns_set) continue;
        pkv_status st = pkvi_seq_move_plan(hg->set, m->gids + (size_t)g * n, n, &m->sets[g]);
        if (st != PKV_OK) return st;
        m->pairs[g] = m->sets[g].blocks;
    }
    return PKV_OK;
}

// 1 if a queued copy of `from` writes a block or a state slot a moved sequence
// holds: its data is not there yet, so the move would carry garbage.
static int copies_pending(const move *m) {
    const pkv_hybrid *h = m->from;
    for (uint32_t g = 0; g < h->num_groups; g++) {
        const pkvi_hgroup *hg = &h->groups[g];
        if (is_state(h, g)) {
            for (uint32_t c = 0; c < hg->num_copies; c++)
                for (uint32_t i = 0; i < m->n; i++)
                    if (hg->copies[c].dst == m->gids[(size_t)g * m->n + i]) return 1;
            continue;
        }
        if (!hg->owns_set) continue;
        const pkv_block_copy *copies;
        uint32_t num;
        pkv_seqset_copies(hg->set, &copies, &num);
        for (uint32_t c = 0; c < num; c++)
            if (pkvi_seq_move_has_block(&m->sets[g], copies[c].dst)) return 1;
    }
    return 0;
}

pkv_status pkv_hybrid_move_size_get(const pkv_hybrid *from, const pkv_seq_id *ids, uint32_t n,
                                    const pkv_hybrid *to, pkv_hybrid_move_size *size) {
    if (!from || !size || (n && !ids)) return PKV_ERR_INVALID_ARG;
    pkv_status st = to ? check_pair(from, to, NULL, 0) : PKV_OK; // NULL: any match
    if (st != PKV_OK) return st;
    move m;
    // Planning writes only the sets' batch marks (from came from calloc: not
    // const-defined), as pkv_hybrid_blocks_needed_batch does.
    st = move_plan((pkv_hybrid *)from, ids, n, (pkv_hybrid *)to, &m);
    if (st == PKV_OK) {
        memset(size, 0, sizeof *size);
        for (uint32_t g = 0; g < from->num_groups; g++) {
            const pkvi_hgroup *hg = &from->groups[g];
            size->num_pairs += m.pairs[g];
            // A PAGED alias repeats its set's blocks and counts its own part of them.
            size->blocks[g] = m.pairs[pkvi_hybrid_owner(from, g)];
            size->bytes[g] = is_state(from, g) ? (uint64_t)n * hg->page_bytes
                                               : (uint64_t)size->blocks[g] * hg->block_size *
                                                     hg->bytes_per_token;
            size->total_bytes += size->bytes[g];
        }
    }
    move_free(&m);
    return st;
}

// Take n state slots in every state group of `to` into new_gids; undo on failure.
static pkv_status take_slots(move *m) {
    pkv_hybrid *to = m->to;
    for (uint32_t g = 0; g < to->num_groups; g++) {
        if (!is_state(to, g)) continue;
        pkv_seq_id *slots = m->new_gids + (size_t)g * m->n;
        for (uint32_t i = 0; i < m->n; i++) {
            if (pkvi_hybrid_take_slot(to, g, &slots[i]) == PKV_OK) continue;
            for (uint32_t u = 0; u <= g; u++) { // give back what this move took
                if (!is_state(to, u)) continue;
                const uint32_t got = u == g ? i : m->n;
                for (uint32_t j = 0; j < got; j++)
                    pkv_pool_release(to->groups[u].pool, m->new_gids[(size_t)u * m->n + j]);
            }
            return PKV_ERR_OUT_OF_BLOCKS;
        }
    }
    return PKV_OK;
}

static void release_slots(move *m) {
    for (uint32_t g = 0; g < m->to->num_groups; g++)
        if (is_state(m->to, g))
            for (uint32_t i = 0; i < m->n; i++)
                pkv_pool_release(m->to->groups[g].pool, m->new_gids[(size_t)g * m->n + i]);
}

// Everything that can fail, in `to`: slots, blocks, records, set slots. On
// success the records new_ids are taken (not live) and every set reserved.
static pkv_status move_reserve(move *m, pkv_seq_id *new_ids) {
    pkv_hybrid *to = m->to;
    int64_t need[PKV_MAX_KV_GROUPS] = {0};
    for (uint32_t g = 0; g < to->num_groups; g++)
        if (to->groups[g].owns_set) need[g] = m->pairs[g];
    pkv_status st = take_slots(m);
    if (st != PKV_OK) return st;
    if (!pkvi_hybrid_fit(to, need)) st = PKV_ERR_OUT_OF_BLOCKS;
    uint32_t made = 0;
    for (; st == PKV_OK && made < m->n; made++) {
        pkvi_hrecord *r;
        st = pkvi_hybrid_record_new(to, &new_ids[made], &r);
        if (st != PKV_OK) break;
    }
    uint32_t g = 0;
    for (; st == PKV_OK && g < to->num_groups; g++)
        if (to->groups[g].owns_set)
            st = pkvi_seq_move_reserve(&m->sets[g], to->groups[g].set,
                                       m->new_gids + (size_t)g * m->n);
    if (st == PKV_OK) return PKV_OK;
    for (uint32_t u = 0; u < g; u++) pkvi_seq_move_abort(&m->sets[u]);
    while (made > 0) pkvi_hybrid_record_drop(to, new_ids[--made]);
    release_slots(m);
    return st;
}

// Nothing can fail from here on (but a corrupt set): move every group, give the
// new records their group ids and retire the old ones.
static pkv_status move_commit(move *m, const pkv_seq_id *ids, const pkv_seq_id *new_ids,
                              pkv_block_copy *pairs, const uint32_t *offsets) {
    pkv_hybrid *from = m->from, *to = m->to;
    const uint32_t n = m->n;
    pkv_status st = PKV_OK;
    for (uint32_t g = 0; g < from->num_groups; g++) {
        const pkv_seq_id *src = m->gids + (size_t)g * n, *dst = m->new_gids + (size_t)g * n;
        if (from->groups[g].owns_set) {
            pkv_status s = pkvi_seq_move_commit(&m->sets[g], pairs + offsets[g]);
            if (s != PKV_OK) st = s;
        } else if (is_state(from, g)) {
            for (uint32_t i = 0; i < n; i++) {
                pairs[offsets[g] + i] = (pkv_block_copy){.src = src[i], .dst = dst[i]};
                pkv_pool_release(from->groups[g].pool, src[i]);
            }
        }
    }
    for (uint32_t i = 0; i < n; i++) {
        const pkvi_hrecord *old = pkvi_hybrid_rec(from, ids[i]);
        pkvi_hrecord *r = &to->recs[(uint32_t)new_ids[i] & 0xFFFFFu]; // taken, not live
        r->len = old->len;
        for (uint32_t g = 0; g < to->num_groups; g++)
            r->gid[g] = m->new_gids[(size_t)g * n + i];
        pkvi_hybrid_record_live(to, r);
        pkvi_hybrid_record_drop(from, ids[i]);
    }
    pkvi_hybrid_released(from);
    return st;
}

pkv_status pkv_hybrid_move(pkv_hybrid *from, const pkv_seq_id *ids, uint32_t n, pkv_hybrid *to,
                           pkv_seq_id *new_ids, pkv_block_copy *pairs, uint32_t cap,
                           uint32_t *offsets, uint32_t *npairs) {
    if (!npairs || !offsets || (n && (!ids || !new_ids)) || (!pairs && cap))
        return PKV_ERR_INVALID_ARG;
    pkv_status st = check_pair(from, to, NULL, 0);
    if (st != PKV_OK) return st;
    move m;
    if ((st = move_plan(from, ids, n, to, &m)) != PKV_OK) {
        move_free(&m);
        return st;
    }
    uint32_t total = 0;
    for (uint32_t g = 0; g < from->num_groups; g++) {
        offsets[g] = total;
        total += m.pairs[g];
    }
    offsets[from->num_groups] = total;
    *npairs = total;
    if (copies_pending(&m)) st = PKV_ERR_BUSY;
    else if (cap < total) st = PKV_ERR_BUFFER_TOO_SMALL;
    else st = move_reserve(&m, new_ids);
    if (st == PKV_OK) st = move_commit(&m, ids, new_ids, pairs, offsets);
    move_free(&m);
    return st;
}

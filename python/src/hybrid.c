// SPDX-License-Identifier: MIT
// pagedkv.HybridKV: the hybrid KV manager (include/pkv/hybrid.h) for heterogeneous
// models, one block table per KV cache group. step() is SeqSet.step with a group
// axis: one slot mapping row, one block table and one copy list per group.
#include "pkvpy.h"

#include <string.h>

typedef struct {
    PyObject_HEAD
    pkv_hybrid *h;
    uint32_t num_groups;
    pkv_kv_group groups[PKV_MAX_KV_GROUPS];
    uint32_t block_size[PKV_MAX_KV_GROUPS]; // 0 for a state group
} HybridObject;

// ---- construction (a group's dict: groups.c) ----

static int Hybrid_init(HybridObject *self, PyObject *args, PyObject *kw) {
    static char *kwlist[] = {"groups", "budget_bytes", "layout", "block_size", "block_sizes",
                             "elem_bytes", "max_seqs", "prefix_cache_blocks", "event_capacity",
                             "event_payload", "medium", NULL};
    PyObject *gobj, *sizes = Py_None;
    unsigned long long budget = 0;
    const char *layout = "shared-page", *medium = "GPU";
    unsigned int block_size = 16, elem_bytes = 2, max_seqs = 256, cache_blocks = 0, event_cap = 0,
                 event_payload = 0;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "O|$KsIOIIIIIs:HybridKV", kwlist, &gobj, &budget, &layout,
                                     &block_size, &sizes, &elem_bytes, &max_seqs, &cache_blocks,
                                     &event_cap, &event_payload, &medium))
        return -1;
    if (event_cap && !cache_blocks) {
        pkvpy_raise(PKV_ERR_INVALID_ARG, "HybridKV",
                    "event_capacity %u needs prefix_cache_blocks > 0: events report the prefix "
                    "cache's contents", event_cap);
        return -1;
    }
    if (budget == 0) {
        pkvpy_raise(PKV_ERR_INVALID_ARG, "HybridKV", "budget_bytes (keyword, > 0) is required");
        return -1;
    }
    if (self->h) {
        pkvpy_raise(PKV_ERR_BUSY, "HybridKV", "already initialized");
        return -1;
    }
    pkv_hybrid_params prm;
    pkv_hybrid_params_default(&prm);
    if (pkvpy_medium(medium, "HybridKV", &prm.medium) < 0) return -1;
    prm.event_capacity = event_cap;
    prm.event_payload = event_payload;
    if (pkv_hybrid_layout_parse(layout, &prm.layout) != PKV_OK) {
        pkvpy_raise(PKV_ERR_INVALID_ARG, "HybridKV",
                    "layout '%s' is none of 'paged', 'partition', 'shared-page', 'lcm'", layout);
        return -1;
    }
    PyObject *seq = PySequence_Fast(gobj, "HybridKV: groups must be a list of dicts");
    if (!seq) return -1;
    Py_ssize_t ng = PySequence_Fast_GET_SIZE(seq);
    int rc = -1;
    if (ng < 1 || ng > PKV_MAX_KV_GROUPS) {
        pkvpy_raise(PKV_ERR_INVALID_ARG, "HybridKV", "%zd groups (1..%d)", ng, PKV_MAX_KV_GROUPS);
        goto done;
    }
    for (Py_ssize_t g = 0; g < ng; g++)
        if (pkvpy_group_from(PySequence_Fast_GET_ITEM(seq, g), g, &self->groups[g], "HybridKV") < 0)
            goto done;
    if (sizes != Py_None) {
        PyArrayObject *a = pkvpy_int_vector(sizes, NPY_UINT32, "HybridKV block_sizes");
        if (!a) goto done;
        if (PyArray_DIM(a, 0) != ng) {
            Py_DECREF(a);
            pkvpy_raise(PKV_ERR_INVALID_ARG, "HybridKV", "block_sizes has %zd entries for %zd groups",
                        (Py_ssize_t)PyArray_DIM(a, 0), ng);
            goto done;
        }
        memcpy(prm.block_sizes, PyArray_DATA(a), (size_t)ng * sizeof(uint32_t));
        Py_DECREF(a);
    }
    prm.groups = self->groups;
    prm.num_groups = (uint32_t)ng;
    prm.elem_bytes = elem_bytes;
    prm.budget_bytes = budget;
    prm.block_size = block_size;
    prm.max_seqs = max_seqs;
    prm.prefix_cache_blocks = cache_blocks;
    pkv_status st = pkv_hybrid_create(&prm, &self->h);
    if (st != PKV_OK) {
        pkvpy_raise(st, "HybridKV", "layout %s, %zd groups, budget %llu bytes, block_size %u, elem_bytes "
                    "%u, max_seqs %u (hybrid.h lists what create checks)", layout, ng, budget, block_size,
                    elem_bytes, max_seqs);
        goto done;
    }
    self->num_groups = (uint32_t)ng;
    for (uint32_t g = 0; g < self->num_groups; g++)
        pkv_hybrid_group_info(self->h, g, NULL, &self->block_size[g]);
    rc = 0;
done:
    Py_DECREF(seq);
    return rc;
}

static void Hybrid_dealloc(HybridObject *self) {
    pkv_hybrid_destroy(self->h);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

// ---- arguments ----

static int ready(HybridObject *self, const char *what) {
    if (self->h) return 0;
    pkvpy_raise(PKV_ERR_INVALID_ARG, what, "HybridKV was not initialized");
    return -1;
}

static int seq_from(PyObject *arg, pkv_seq_id *id, const char *what) {
    long long v;
    int overflow = 0;
    if (pkvpy_index(arg, what, "a sequence id must be an integer", &v, &overflow) < 0) return -1;
    if (overflow || v < 0 || v > INT32_MAX) {
        pkvpy_raise(PKV_ERR_NOT_FOUND, what, "sequence %lld is not live", v);
        return -1;
    }
    *id = (pkv_seq_id)v;
    return 0;
}

static int group_arg(HybridObject *self, unsigned int g, int tokens_only, const char *what) {
    if (g >= self->num_groups) {
        pkvpy_raise(PKV_ERR_INVALID_ARG, what, "group %u of %u", g, self->num_groups);
        return -1;
    }
    if (tokens_only && self->groups[g].kind == PKV_LAYER_STATE) {
        pkvpy_raise(PKV_ERR_INVALID_ARG, what, "group %u is a state group: it has no block table", g);
        return -1;
    }
    return 0;
}

// ---- sequences ----

static PyObject *Hybrid_create(HybridObject *self, PyObject *unused) {
    if (ready(self, "HybridKV.create") < 0) return NULL;
    pkv_seq_id id;
    pkv_status st = pkv_hybrid_seq_create(self->h, &id);
    if (st != PKV_OK) return pkvpy_raise(st, "HybridKV.create", "no free state slot or sequence id");
    return PyLong_FromLong(id);
}

static PyObject *Hybrid_free(HybridObject *self, PyObject *arg) {
    pkv_seq_id id;
    if (ready(self, "HybridKV.free") < 0 || seq_from(arg, &id, "HybridKV.free") < 0) return NULL;
    pkv_status st = pkv_hybrid_seq_free(self->h, id);
    if (st != PKV_OK) return pkvpy_raise(st, "HybridKV.free", "sequence %d is not live", id);
    Py_RETURN_NONE;
}

static PyObject *Hybrid_fork(HybridObject *self, PyObject *arg) {
    pkv_seq_id id, child;
    if (ready(self, "HybridKV.fork") < 0 || seq_from(arg, &id, "HybridKV.fork") < 0) return NULL;
    pkv_status st = pkv_hybrid_seq_fork(self->h, id, &child);
    if (st != PKV_OK) return pkvpy_raise(st, "HybridKV.fork", "parent %d", id);
    return PyLong_FromLong(child);
}

static PyObject *Hybrid_length(HybridObject *self, PyObject *arg) {
    pkv_seq_id id;
    uint32_t len;
    if (ready(self, "HybridKV.length") < 0 || seq_from(arg, &id, "HybridKV.length") < 0) return NULL;
    pkv_status st = pkv_hybrid_seq_length(self->h, id, &len);
    if (st != PKV_OK) return pkvpy_raise(st, "HybridKV.length", "sequence %d is not live", id);
    return PyLong_FromUnsignedLong(len);
}

static PyObject *Hybrid_truncate(HybridObject *self, PyObject *args) {
    PyObject *ido;
    unsigned int len;
    pkv_seq_id id;
    if (ready(self, "HybridKV.truncate") < 0 || !PyArg_ParseTuple(args, "OI:truncate", &ido, &len) ||
        seq_from(ido, &id, "HybridKV.truncate") < 0)
        return NULL;
    pkv_status st = pkv_hybrid_seq_truncate(self->h, id, len);
    if (st != PKV_OK)
        return pkvpy_raise(st, "HybridKV.truncate", "sequence %d to %u tokens (a window group may have "
                           "released what the next query sees; a state cannot be rolled back)", id, len);
    Py_RETURN_NONE;
}

// ---- prefix cache ----

static PyObject *Hybrid_create_cached(HybridObject *self, PyObject *arg) {
    if (ready(self, "HybridKV.create_cached") < 0) return NULL;
    PyArrayObject *t = pkvpy_tokens(arg, "HybridKV.create_cached(tokens)");
    if (!t) return NULL;
    pkv_seq_id id;
    uint32_t cached = 0;
    pkv_status st = pkv_hybrid_seq_create_cached(self->h, PyArray_DATA(t), (uint32_t)PyArray_DIM(t, 0),
                                                 &id, &cached);
    Py_DECREF(t);
    if (st != PKV_OK) return pkvpy_raise(st, "HybridKV.create_cached", "no free state slot or sequence id");
    return Py_BuildValue("(iI)", id, cached);
}

// cache_prefix / cache_state: (id, tokens) -> count.
static PyObject *offer(HybridObject *self, PyObject *args, int state, const char *what) {
    PyObject *ido, *tok;
    pkv_seq_id id;
    if (ready(self, what) < 0 || !PyArg_ParseTuple(args, "OO", &ido, &tok) || seq_from(ido, &id, what) < 0)
        return NULL;
    PyArrayObject *t = pkvpy_tokens(tok, what);
    if (!t) return NULL;
    uint32_t n = 0;
    const uint32_t len = (uint32_t)PyArray_DIM(t, 0);
    pkv_status st = state ? pkv_hybrid_cache_state(self->h, id, PyArray_DATA(t), len, &n)
                          : pkv_hybrid_cache_prefix(self->h, id, PyArray_DATA(t), len, &n);
    Py_DECREF(t);
    if (st != PKV_OK)
        return pkvpy_raise(st, what, "sequence %d, %u tokens (no prefix cache: prefix_cache_blocks=0; "
                           "more tokens than the sequence holds; cache_state: not its length or not a "
                           "multiple of state_interval)", id, len);
    return PyLong_FromUnsignedLong(n);
}

static PyObject *Hybrid_cache_prefix(HybridObject *self, PyObject *args) {
    return offer(self, args, 0, "HybridKV.cache_prefix");
}

static PyObject *Hybrid_cache_state(HybridObject *self, PyObject *args) {
    return offer(self, args, 1, "HybridKV.cache_state");
}

static PyObject *u32_list(const uint32_t *v, uint32_t n) {
    PyObject *l = PyList_New(n);
    for (uint32_t i = 0; l && i < n; i++) PyList_SET_ITEM(l, i, PyLong_FromUnsignedLong(v[i]));
    return l;
}

static PyObject *Hybrid_prefix_match(HybridObject *self, PyObject *arg) {
    if (ready(self, "HybridKV.prefix_match") < 0) return NULL;
    PyArrayObject *t = pkvpy_tokens(arg, "HybridKV.prefix_match(tokens)");
    if (!t) return NULL;
    pkv_hybrid_prefix_match m;
    pkv_status st = pkv_hybrid_prefix_match_get(self->h, PyArray_DATA(t), (uint32_t)PyArray_DIM(t, 0), &m);
    Py_DECREF(t);
    if (st != PKV_OK) return pkvpy_raise(st, "HybridKV.prefix_match", "lookup failed");
    return Py_BuildValue("{s:I,s:N,s:N}", "cached_tokens", m.cached_tokens, "hit_blocks",
                         u32_list(m.hit_blocks, self->num_groups), "evictable_hit",
                         u32_list(m.evictable_hit, self->num_groups));
}

static PyObject *Hybrid_block_table(HybridObject *self, PyObject *args) {
    PyObject *ido;
    unsigned int g;
    pkv_seq_id id;
    if (ready(self, "HybridKV.block_table") < 0 || !PyArg_ParseTuple(args, "OI:block_table", &ido, &g) ||
        seq_from(ido, &id, "HybridKV.block_table") < 0 || group_arg(self, g, 1, "HybridKV.block_table") < 0)
        return NULL;
    const pkv_block_id *t;
    uint32_t n;
    pkv_status st = pkv_hybrid_block_table(self->h, id, g, &t, &n, NULL);
    if (st != PKV_OK) return pkvpy_raise(st, "HybridKV.block_table", "sequence %d is not live", id);
    PyArrayObject *a = pkvpy_new_vector(n, NPY_INT32);
    if (a && n) memcpy(PyArray_DATA(a), t, n * sizeof *t);
    return (PyObject *)a;
}

static PyObject *Hybrid_state_slot(HybridObject *self, PyObject *args) {
    PyObject *ido;
    unsigned int g;
    pkv_seq_id id;
    if (ready(self, "HybridKV.state_slot") < 0 || !PyArg_ParseTuple(args, "OI:state_slot", &ido, &g) ||
        seq_from(ido, &id, "HybridKV.state_slot") < 0 || group_arg(self, g, 0, "HybridKV.state_slot") < 0)
        return NULL;
    int32_t slot;
    pkv_status st = pkv_hybrid_state_slot(self->h, id, g, &slot);
    if (st != PKV_OK)
        return pkvpy_raise(st, "HybridKV.state_slot", "sequence %d, group %u (a state group?)", id, g);
    return PyLong_FromLong(slot);
}

// ---- step ----

static PyTypeObject HybridStep_Type;
static PyStructSequence_Field hstep_fields[] = {
    {"slot_mapping", "int64 [num_groups, sum(counts)]: each group's slot of every new token "
                     "(seqs[0]'s first), -1 in a state group's row"},
    {"block_tables", "per group: int32 [num_seqs, max_blocks] with -1 for blocks released by the "
                     "window and past the end, or None for a state group"},
    {"context_lens", "int32 [num_seqs]: lengths after the append"},
    {"state_slots", "per group: int32 [num_seqs] state slots (state group), else None"},
    {"copies", "per group: int32 [n, 2] (src, dst) copies to run first: blocks (copy-on-write) "
               "or state slots (fork)"},
    {NULL, NULL},
};
static PyStructSequence_Desc hstep_desc = {
    "pagedkv.HybridStep", "One engine step of a hybrid model: per-group slots, tables, copies.",
    hstep_fields, 5};

static PyObject *take_group_copies(HybridObject *self, uint32_t g) {
    uint32_t n = pkv_hybrid_pending_copies(self->h, g), got = 0;
    pkv_block_copy *buf = PyMem_Malloc((size_t)(n ? n : 1) * sizeof *buf);
    if (!buf) return PyErr_NoMemory();
    pkv_status st = pkv_hybrid_take_copies(self->h, g, buf, n, &got);
    PyObject *r = st == PKV_OK ? pkvpy_copies_array(buf, got)
                               : pkvpy_raise(st, "HybridKV.step", "taking group %u's copies", g);
    PyMem_Free(buf);
    return r;
}

static PyObject *group_table(HybridObject *self, uint32_t g, const pkv_seq_id *seqs, uint32_t n) {
    uint32_t max_blocks = 0;
    uint64_t total = 0;
    pkv_status st = pkv_hybrid_export_size(self->h, g, seqs, n, &max_blocks, &total);
    if (st != PKV_OK) return pkvpy_raise(st, "HybridKV.step", "export size of group %u", g);
    PyArrayObject *t = pkvpy_new_matrix(n, max_blocks, NPY_INT32);
    if (!t) return NULL;
    st = pkv_hybrid_export_padded(self->h, g, seqs, n, max_blocks, -1, PyArray_DATA(t), NULL);
    if (st != PKV_OK) {
        Py_DECREF(t);
        return pkvpy_raise(st, "HybridKV.step", "export of group %u", g);
    }
    return (PyObject *)t;
}

static PyObject *Hybrid_step(HybridObject *self, PyObject *args) {
    PyObject *so, *co;
    if (ready(self, "HybridKV.step") < 0 || !PyArg_ParseTuple(args, "OO:step", &so, &co)) return NULL;
    PyArrayObject *seqs = pkvpy_int_vector(so, NPY_INT32, "HybridKV.step seqs");
    PyArrayObject *counts = seqs ? pkvpy_int_vector(co, NPY_UINT32, "HybridKV.step counts") : NULL;
    PyObject *res = NULL, *tables = NULL, *states = NULL, *copies = NULL;
    PyArrayObject *slots = NULL, *lens = NULL;
    if (!counts) goto done;
    const npy_intp ns = PyArray_DIM(seqs, 0);
    if (PyArray_DIM(counts, 0) != ns) {
        pkvpy_raise(PKV_ERR_INVALID_ARG, "HybridKV.step", "%zd seqs but %zd counts", (Py_ssize_t)ns,
                    (Py_ssize_t)PyArray_DIM(counts, 0));
        goto done;
    }
    const pkv_seq_id *ids = PyArray_DATA(seqs);
    const uint32_t *cnt = PyArray_DATA(counts);
    uint64_t total = 0;
    for (npy_intp i = 0; i < ns; i++) total += cnt[i];
    // Refuse before sizing the output: the library checks ids and space first.
    uint32_t need[PKV_MAX_KV_GROUPS];
    pkv_status st = pkv_hybrid_blocks_needed_batch(self->h, ids, cnt, (uint32_t)ns, need);
    if (st != PKV_OK) {
        pkvpy_raise(st, "HybridKV.step", "%zd sequences (an id not live, or listed twice)", (Py_ssize_t)ns);
        goto done;
    }
    slots = pkvpy_new_matrix(self->num_groups, (npy_intp)total, NPY_INT64);
    if (!slots) goto done;
    st = pkv_hybrid_append_batch(self->h, ids, cnt, (uint32_t)ns, PyArray_DATA(slots));
    if (st != PKV_OK) {
        pkvpy_raise(st, "HybridKV.step", "%llu tokens for %zd sequences; nothing appended",
                    (unsigned long long)total, (Py_ssize_t)ns);
        goto done;
    }
    lens = pkvpy_new_vector(ns, NPY_INT32);
    tables = PyList_New(self->num_groups);
    states = PyList_New(self->num_groups);
    copies = PyList_New(self->num_groups);
    if (!lens || !tables || !states || !copies) goto done;
    for (npy_intp i = 0; i < ns; i++) {
        uint32_t len = 0;
        pkv_hybrid_seq_length(self->h, ids[i], &len);
        ((int32_t *)PyArray_DATA(lens))[i] = (int32_t)len;
    }
    for (uint32_t g = 0; g < self->num_groups; g++) {
        PyObject *t = Py_None, *s = Py_None;
        if (self->groups[g].kind == PKV_LAYER_STATE) {
            PyArrayObject *a = pkvpy_new_vector(ns, NPY_INT32);
            if (!a) goto done;
            for (npy_intp i = 0; i < ns; i++)
                pkv_hybrid_state_slot(self->h, ids[i], g, &((int32_t *)PyArray_DATA(a))[i]);
            s = (PyObject *)a;
            Py_INCREF(t);
        } else {
            t = group_table(self, g, ids, (uint32_t)ns);
            if (!t) goto done;
            Py_INCREF(s);
        }
        PyList_SET_ITEM(tables, g, t);
        PyList_SET_ITEM(states, g, s);
        PyObject *c = take_group_copies(self, g);
        if (!c) goto done;
        PyList_SET_ITEM(copies, g, c);
    }
    res = PyStructSequence_New(&HybridStep_Type);
    if (!res) goto done;
    PyStructSequence_SET_ITEM(res, 0, (PyObject *)slots);
    PyStructSequence_SET_ITEM(res, 1, tables);
    PyStructSequence_SET_ITEM(res, 2, (PyObject *)lens);
    PyStructSequence_SET_ITEM(res, 3, states);
    PyStructSequence_SET_ITEM(res, 4, copies);
    slots = lens = NULL;
    tables = states = copies = NULL;
done:
    Py_XDECREF(slots);
    Py_XDECREF(lens);
    Py_XDECREF(tables);
    Py_XDECREF(states);
    Py_XDECREF(copies);
    Py_XDECREF(seqs);
    Py_XDECREF(counts);
    return res;
}

// ---- inspection ----

static PyObject *Hybrid_group_stats(HybridObject *self, PyObject *arg) {
    uint32_t g;
    if (ready(self, "HybridKV.group_stats") < 0 || pkvpy_u32(arg, &g, "HybridKV.group_stats group") < 0 ||
        group_arg(self, g, 0, "HybridKV.group_stats") < 0)
        return NULL;
    pkv_hybrid_group_stats s;
    pkv_status st = pkv_hybrid_group_stats_get(self->h, g, &s);
    if (st != PKV_OK) return pkvpy_raise(st, "HybridKV.group_stats", "group %u", g);
    PyObject *d = Py_BuildValue("{s:s,s:I,s:K,s:K,s:K,s:K,s:K,s:K,s:K,s:K}", "kind", pkvpy_kind_names[s.kind],
                                "block_size", s.block_size, "page_bytes", (unsigned long long)s.page_bytes,
                                "capacity_bytes", (unsigned long long)s.capacity_bytes, "used_bytes",
                                (unsigned long long)s.used_bytes, "free_bytes", (unsigned long long)s.free_bytes,
                                "padding_bytes", (unsigned long long)s.padding_bytes, "blocks_held",
                                (unsigned long long)s.blocks_held, "blocks_released",
                                (unsigned long long)s.blocks_released, "tokens_held",
                                (unsigned long long)s.tokens_held);
    // The prefix cache's figures (0 without one).
    const struct {
        const char *key;
        uint64_t v;
    } more[] = {{"tokens_visible", s.tokens_visible},       {"cached_blocks", s.cached_blocks},
                {"cached_evictable", s.cached_evictable},   {"prefix_hit_blocks", s.prefix_hit_blocks},
                {"prefix_hit_tokens", s.prefix_hit_tokens}, {"prefix_inserts", s.prefix_inserts},
                {"prefix_evictions", s.prefix_evictions}};
    for (size_t i = 0; d && i < sizeof more / sizeof more[0]; i++) {
        PyObject *v = PyLong_FromUnsignedLongLong(more[i].v);
        if (!v || PyDict_SetItemString(d, more[i].key, v) < 0) Py_CLEAR(d);
        Py_XDECREF(v);
    }
    return d;
}

extern PyTypeObject pkvpy_Hybrid_Type; // below

// move_to(other, ids) -> (new_ids, pairs): pkv_hybrid_move sized by its probe.
static PyObject *Hybrid_move_to(HybridObject *self, PyObject *args) {
    PyObject *other_obj, *ids_obj;
    if (!PyArg_ParseTuple(args, "O!O:move_to", &pkvpy_Hybrid_Type, &other_obj, &ids_obj)) return NULL;
    HybridObject *other = (HybridObject *)other_obj;
    if (ready(self, "HybridKV.move_to") < 0 || ready(other, "HybridKV.move_to") < 0) return NULL;
    char why[160];
    pkv_status st = pkv_hybrid_move_check(self->h, other->h, why, sizeof why);
    if (st != PKV_OK) return pkvpy_raise(st, "HybridKV.move_to", "%s", why);
    PyArrayObject *ids = pkvpy_int_vector(ids_obj, NPY_INT32, "HybridKV.move_to(ids)");
    if (!ids) return NULL;
    const uint32_t n = (uint32_t)PyArray_DIM(ids, 0);
    pkv_hybrid_move_size sz;
    st = pkv_hybrid_move_size_get(self->h, PyArray_DATA(ids), n, other->h, &sz);
    if (st != PKV_OK) {
        Py_DECREF(ids);
        return pkvpy_raise(st, "HybridKV.move_to", "%u sequences: an id not live, or twice", n);
    }
    PyArrayObject *new_ids = pkvpy_new_vector(n, NPY_INT32);
    pkv_block_copy *buf = PyMem_Malloc((size_t)(sz.num_pairs ? sz.num_pairs : 1) * sizeof *buf);
    uint32_t off[PKV_MAX_KV_GROUPS + 1], np = 0;
    if (!new_ids || !buf) {
        Py_DECREF(ids);
        Py_XDECREF(new_ids);
        PyMem_Free(buf);
        return PyErr_NoMemory();
    }
    st = pkv_hybrid_move(self->h, PyArray_DATA(ids), n, other->h, PyArray_DATA(new_ids), buf,
                         sz.num_pairs, off, &np);
    Py_DECREF(ids);
    PyObject *pairs = st == PKV_OK ? PyList_New(self->num_groups) : NULL;
    for (uint32_t g = 0; pairs && g < self->num_groups; g++) {
        PyObject *a = pkvpy_copies_array(buf + off[g], off[g + 1] - off[g]);
        if (!a) Py_CLEAR(pairs);
        else PyList_SET_ITEM(pairs, g, a);
    }
    PyMem_Free(buf);
    if (st != PKV_OK) {
        Py_DECREF(new_ids);
        return pkvpy_raise(st, "HybridKV.move_to", "%u sequences (%llu bytes; out of blocks: the "
                           "target's pools or state slots are short; busy: a fork's or "
                           "copy-on-write copy not taken by step() yet); nothing moved",
                           n, (unsigned long long)sz.total_bytes);
    }
    if (!pairs) {
        Py_DECREF(new_ids);
        return NULL;
    }
    return Py_BuildValue("(NN)", new_ids, pairs);
}

static PyObject *Hybrid_validate(HybridObject *self, PyObject *unused) {
    if (ready(self, "HybridKV.validate") < 0) return NULL;
    pkv_status st = pkv_hybrid_validate(self->h);
    if (st != PKV_OK) return pkvpy_raise(st, "HybridKV.validate", "the manager's structure is inconsistent");
    Py_RETURN_NONE;
}

static PyObject *Hybrid_take_events(HybridObject *self, PyObject *unused) {
    if (ready(self, "HybridKV.take_events") < 0) return NULL;
    const pkv_kv_event *ev;
    uint32_t n;
    pkv_hybrid_take_events(self->h, &ev, &n);
    return pkvpy_events_list(ev, n);
}

static PyObject *Hybrid_reset_prefix_cache(HybridObject *self, PyObject *unused) {
    if (ready(self, "HybridKV.reset_prefix_cache") < 0) return NULL;
    pkv_status st = pkv_hybrid_reset_prefix_cache(self->h);
    if (st == PKV_ERR_BUSY) Py_RETURN_FALSE; // vLLM's reset_prefix_cache answers False
    if (st != PKV_OK) return pkvpy_raise(st, "HybridKV.reset_prefix_cache", "no prefix cache");
    Py_RETURN_TRUE;
}

static PyObject *Hybrid_get_events_dropped(HybridObject *self, void *c) {
    return PyLong_FromUnsignedLongLong(pkv_hybrid_events_dropped(self->h));
}

static PyObject *Hybrid_get_num_groups(HybridObject *self, void *c) {
    return PyLong_FromUnsignedLong(self->num_groups);
}
static PyObject *Hybrid_get_layout(HybridObject *self, void *c) {
    return PyUnicode_FromString(pkv_hybrid_layout_name(pkv_hybrid_get_layout(self->h)));
}
static PyObject *Hybrid_get_block_sizes(HybridObject *self, void *c) {
    PyObject *l = PyList_New(self->num_groups);
    for (uint32_t g = 0; l && g < self->num_groups; g++)
        PyList_SET_ITEM(l, g, PyLong_FromUnsignedLong(self->block_size[g]));
    return l;
}
static PyObject *Hybrid_get_kinds(HybridObject *self, void *c) {
    PyObject *l = PyList_New(self->num_groups);
    for (uint32_t g = 0; l && g < self->num_groups; g++)
        PyList_SET_ITEM(l, g, PyUnicode_FromString(pkvpy_kind_names[self->groups[g].kind]));
    return l;
}
static PyObject *Hybrid_get_live(HybridObject *self, void *c) {
    return PyLong_FromUnsignedLong(pkv_hybrid_live_count(self->h));
}
static PyObject *Hybrid_get_state_interval(HybridObject *self, void *c) {
    return PyLong_FromUnsignedLong(pkv_hybrid_state_interval(self->h));
}

static PyMethodDef hybrid_methods[] = {
    {"create", (PyCFunction)Hybrid_create, METH_NOARGS, "create() -> id of a new empty sequence."},
    {"free", (PyCFunction)Hybrid_free, METH_O, "free(id): release its blocks and state slots."},
    {"fork", (PyCFunction)Hybrid_fork, METH_O,
     "fork(parent) -> child sharing every live block; its states are copied (see step().copies)."},
    {"length", (PyCFunction)Hybrid_length, METH_O, "length(id) -> tokens."},
    {"truncate", (PyCFunction)Hybrid_truncate, METH_VARARGS, "truncate(id, length): drop later tokens."},
    {"block_table", (PyCFunction)Hybrid_block_table, METH_VARARGS,
     "block_table(id, group) -> int32 array, -1 for blocks the window released."},
    {"state_slot", (PyCFunction)Hybrid_state_slot, METH_VARARGS, "state_slot(id, group) -> slot."},
    {"step", (PyCFunction)Hybrid_step, METH_VARARGS,
     "step(seqs, counts) -> HybridStep. One engine step: append counts[i] tokens to seqs[i]\n"
     "in every group (all or nothing; windows release what no future query sees), then\n"
     "each group's slot mapping, padded block table (or state slots) and copies."},
    {"group_stats", (PyCFunction)Hybrid_group_stats, METH_O,
     "group_stats(group) -> dict: kind, block_size, page/capacity/used/free/padding bytes,\n"
     "blocks held and released, tokens held."},
    {"validate", (PyCFunction)Hybrid_validate, METH_NOARGS, "validate(): raise CorruptError if inconsistent."},
    {"move_to", (PyCFunction)Hybrid_move_to, METH_VARARGS,
     "move_to(other, ids) -> (new_ids, pairs): swap sequences to another HybridKV of the same\n"
     "groups and block sizes (pkv_hybrid_move): new_ids int32 [n] in other; pairs per group,\n"
     "int32 [k, 2] (src, dst) blocks (state group: slots) to copy; only live blocks move, a\n"
     "block shared by the moved sequences once. All or nothing."},
    {"create_cached", (PyCFunction)Hybrid_create_cached, METH_O,
     "create_cached(tokens) -> (id, cached_tokens). A new sequence starting with the longest\n"
     "prefix of tokens every group has cached (<= len - 1; per-group rules, pkv/hybrid.h):\n"
     "holes before a window, shared blocks, a state copy (see step().copies)."},
    {"cache_prefix", (PyCFunction)Hybrid_cache_prefix, METH_VARARGS,
     "cache_prefix(id, tokens) -> blocks added: offer the full blocks of the sequence's first\n"
     "len(tokens) tokens (call it right after the prompt's step)."},
    {"cache_state", (PyCFunction)Hybrid_cache_state, METH_VARARGS,
     "cache_state(id, tokens) -> states cached: the sequence's length is len(tokens), a multiple\n"
     "of state_interval; snapshot its state groups' states (a copy, see step().copies)."},
    {"prefix_match", (PyCFunction)Hybrid_prefix_match, METH_O,
     "prefix_match(tokens) -> dict: cached_tokens, hit_blocks and evictable_hit per group;\n"
     "changes nothing."},
    {"take_events", (PyCFunction)Hybrid_take_events, METH_NOARGS,
     "take_events() -> [event tuples], oldest first, every group's in emission order, as\n"
     "PrefixPool.take_events: ('BlockStored', hashes, parent|None, token_ids, block_size,\n"
     "None, medium, group) per run of new blocks cache_prefix (or a state cache_state) added;\n"
     "('BlockRemoved', [hash], medium, group) per evicted entry; ('AllBlocksCleared', medium)\n"
     "after reset_prefix_cache; ('Overflow', n) last if n were dropped (resynchronise).\n"
     "Empty with events off (event_capacity=0)."},
    {"reset_prefix_cache", (PyCFunction)Hybrid_reset_prefix_cache, METH_NOARGS,
     "reset_prefix_cache() -> bool: drop every cached block and state (one AllBlocksCleared\n"
     "event); False, nothing changed, while a sequence or queued copy holds a cached block."},
    {NULL, NULL, 0, NULL},
};

static PyGetSetDef hybrid_getset[] = {
    {"events_dropped", (getter)Hybrid_get_events_dropped, NULL, "events lost to a full buffer since "
     "creation", NULL},
    {"num_groups", (getter)Hybrid_get_num_groups, NULL, "KV cache groups", NULL},
    {"layout", (getter)Hybrid_get_layout, NULL, "'paged', 'partition', 'shared-page' or 'lcm'", NULL},
    {"block_sizes", (getter)Hybrid_get_block_sizes, NULL, "tokens per block of each group (0: state)", NULL},
    {"kinds", (getter)Hybrid_get_kinds, NULL, "each group's layer kind", NULL},
    {"live", (getter)Hybrid_get_live, NULL, "live sequences", NULL},
    {"state_interval", (getter)Hybrid_get_state_interval, NULL,
     "tokens between cached states (0: no prefix cache or no state group)", NULL},
    {NULL, NULL, NULL, NULL, NULL},
};

PyTypeObject pkvpy_Hybrid_Type = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "pagedkv.HybridKV",
    .tp_basicsize = sizeof(HybridObject),
    .tp_dealloc = (destructor)Hybrid_dealloc,
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "HybridKV(groups, *, budget_bytes, layout='shared-page', block_size=16,\n"
              "block_sizes=None, elem_bytes=2, max_seqs=256, prefix_cache_blocks=0,\n"
              "event_capacity=0, event_payload=0, medium='GPU')\n"
              "KV cache groups of a heterogeneous model (include/pkv/hybrid.h). groups: a dict per\n"
              "group: kind ('full', 'sliding', 'chunked', 'mla', 'state'), layers, kv_heads,\n"
              "head_dim, window, latent_dim, rope_dim, sinks, state_bytes. layout: 'paged' (every\n"
              "layer as full attention), 'partition', 'shared-page' (vLLM) or 'lcm' (Jenga).\n"
              "event_capacity > 0 (needs prefix_cache_blocks > 0): vLLM-style KV events per group,\n"
              "drained with take_events(); event_payload bounds their hashes + token ids (0: 64\n"
              "per event); medium ('GPU', 'CPU', 'DISK') is what they report.",
    .tp_methods = hybrid_methods,
    .tp_getset = hybrid_getset,
    .tp_init = (initproc)Hybrid_init,
    .tp_new = PyType_GenericNew,
};

int pkvpy_hybrid_init(PyObject *module) {
    if (PyStructSequence_InitType2(&HybridStep_Type, &hstep_desc) < 0) return -1;
    Py_INCREF(&HybridStep_Type);
    if (PyModule_AddObject(module, "HybridStep", (PyObject *)&HybridStep_Type) < 0) {
        Py_DECREF(&HybridStep_Type);
        return -1;
    }
    return pkvpy_add_type(module, "HybridKV", &pkvpy_Hybrid_Type);
}

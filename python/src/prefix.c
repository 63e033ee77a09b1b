// SPDX-License-Identifier: MIT
// pagedkv.PrefixCache: owns a pkv_prefix_cache. Attaching a SeqSet makes the set hold
// a reference to the cache, so the cache outlives every attached set (the C contract).
#include "pkvpy.h"

static PyObject *Prefix_new(PyTypeObject *type, PyObject *args, PyObject *kw) {
    static char *kwlist[] = {"pool", "block_size", "max_entries", NULL};
    PyObject *pool, *bo, *mo = NULL;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "O!O|O:PrefixCache", kwlist, &pkvpy_Pool_Type,
                                     &pool, &bo, &mo))
        return NULL;
    uint32_t bs, max_entries;
    if (pkvpy_u32(bo, &bs, "PrefixCache(block_size)") < 0)
        return NULL;
    if (mo) {
        if (pkvpy_u32(mo, &max_entries, "PrefixCache(max_entries)") < 0)
            return NULL;
    } else {
        max_entries = pkv_pool_capacity(((PoolObject *)pool)->pool);
    }
    PrefixObject *self = (PrefixObject *)type->tp_alloc(type, 0);
    if (!self)
        return NULL;
    pkv_status st = pkv_prefix_cache_create(((PoolObject *)pool)->pool, bs, max_entries,
                                            &self->cache);
    if (st != PKV_OK) {
        Py_DECREF(self);
        return pkvpy_raise(st, "PrefixCache", "block_size %u, max_entries %u (>= 1)", bs,
                           max_entries);
    }
    Py_INCREF(pool);
    self->pool = pool;
    self->block_size = bs;
    return (PyObject *)self;
}

static void Prefix_dealloc(PrefixObject *self) {
    pkv_prefix_cache_destroy(self->cache);
    Py_XDECREF(self->pool);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

PyArrayObject *pkvpy_tokens(PyObject *obj, const char *what) {
    PyArrayObject *t = pkvpy_int_vector(obj, NPY_INT32, what);
    if (t && PyArray_DIM(t, 0) > (npy_intp)UINT32_MAX) {
        Py_DECREF(t);
        pkvpy_raise(PKV_ERR_INVALID_ARG, what, "more than 2**32 - 1 tokens");
        return NULL;
    }
    return t;
}

static int check_set(PrefixObject *self, PyObject *set, const char *what) {
    SeqSetObject *s = (SeqSetObject *)set;
    if (s->prefix != (PyObject *)self) {
        pkvpy_raise(PKV_ERR_INVALID_ARG, what, "the SeqSet is not attached to this cache "
                    "(PrefixCache.attach)");
        return -1;
    }
    return 0;
}

static PyObject *Prefix_attach(PrefixObject *self, PyObject *set) {
    if (!PyObject_TypeCheck(set, &pkvpy_SeqSet_Type))
        return pkvpy_raise(PKV_ERR_INVALID_ARG, "PrefixCache.attach", "expected a SeqSet");
    SeqSetObject *s = (SeqSetObject *)set;
    if (s->prefix == (PyObject *)self)
        Py_RETURN_NONE;
    if (s->prefix)
        return pkvpy_raise(PKV_ERR_BUSY, "PrefixCache.attach",
                           "the SeqSet is already attached to another cache (detach it first)");
    pkv_status st = pkv_prefix_cache_attach(self->cache, s->set);
    if (st != PKV_OK)
        return pkvpy_raise(st, "PrefixCache.attach", "the set must use this cache's pool and "
                           "block size %u", self->block_size);
    Py_INCREF(self);
    s->prefix = (PyObject *)self;
    Py_RETURN_NONE;
}

static PyObject *Prefix_detach(PrefixObject *self, PyObject *set) {
    if (!PyObject_TypeCheck(set, &pkvpy_SeqSet_Type))
        return pkvpy_raise(PKV_ERR_INVALID_ARG, "PrefixCache.detach", "expected a SeqSet");
    SeqSetObject *s = (SeqSetObject *)set;
    if (s->prefix != (PyObject *)self)
        return pkvpy_raise(PKV_ERR_NOT_FOUND, "PrefixCache.detach",
                           "the SeqSet is not attached to this cache");
#ifdef PKVPY_HAVE_PKV_PREFIX_CACHE_DETACH
    pkv_status st = pkv_prefix_cache_detach(self->cache, s->set);
    if (st != PKV_OK)
        return pkvpy_raise(st, "PrefixCache.detach", "a sequence or queued copy of the set "
                           "still holds a block the cache holds");
    s->prefix = NULL;
    Py_DECREF(self);
    Py_RETURN_NONE;
#else
    return pkvpy_raise(PKV_ERR_UNSUPPORTED, "PrefixCache.detach",
                       "this build of libpagedkv does not declare pkv_prefix_cache_detach");
#endif
}

static PyObject *Prefix_create_seq(PrefixObject *self, PyObject *args) {
    PyObject *set, *to;
    if (!PyArg_ParseTuple(args, "O!O:create_seq", &pkvpy_SeqSet_Type, &set, &to))
        return NULL;
    if (check_set(self, set, "PrefixCache.create_seq") < 0)
        return NULL;
    PyArrayObject *tokens = pkvpy_tokens(to, "PrefixCache.create_seq(tokens)");
    if (!tokens)
        return NULL;
    pkv_seq_id id;
    uint32_t cached = 0, n = (uint32_t)PyArray_DIM(tokens, 0);
    pkv_status st = pkv_seq_create_cached(((SeqSetObject *)set)->set, self->cache,
                                          PyArray_DATA(tokens), n, &id, &cached);
    Py_DECREF(tokens);
    if (st != PKV_OK)
        return pkvpy_raise(st, "PrefixCache.create_seq", "%u tokens (at least 1)", n);
    return Py_BuildValue("(iI)", id, cached);
}

static PyObject *Prefix_insert(PrefixObject *self, PyObject *args) {
    PyObject *set, *io, *to;
    if (!PyArg_ParseTuple(args, "O!OO:insert", &pkvpy_SeqSet_Type, &set, &io, &to))
        return NULL;
    if (check_set(self, set, "PrefixCache.insert") < 0)
        return NULL;
    long long id = PyLong_AsLongLong(io);
    if (id == -1 && PyErr_Occurred())
        return NULL;
    if (id < INT32_MIN || id > INT32_MAX)
        return pkvpy_raise(PKV_ERR_NOT_FOUND, "PrefixCache.insert", "sequence id out of range");
    PyArrayObject *tokens = pkvpy_tokens(to, "PrefixCache.insert(tokens)");
    if (!tokens)
        return NULL;
    uint32_t inserted = 0, n = (uint32_t)PyArray_DIM(tokens, 0);
    pkv_status st = pkv_prefix_cache_insert(self->cache, ((SeqSetObject *)set)->set,
                                            (pkv_seq_id)id, PyArray_DATA(tokens), n, &inserted);
    Py_DECREF(tokens);
    if (st != PKV_OK)
        return pkvpy_raise(st, "PrefixCache.insert", "sequence %lld, %u tokens (at most its "
                           "length)", id, n);
    return PyLong_FromUnsignedLong(inserted);
}

static PyObject *Prefix_match(PrefixObject *self, PyObject *to) {
#ifdef PKVPY_HAVE_PKV_PREFIX_CACHE_MATCH
    PyArrayObject *tokens = pkvpy_tokens(to, "PrefixCache.match(tokens)");
    if (!tokens)
        return NULL;
    pkv_prefix_match m;
    uint32_t n = (uint32_t)PyArray_DIM(tokens, 0);
    pkv_status st = pkv_prefix_cache_match(self->cache, PyArray_DATA(tokens), n, &m);
    Py_DECREF(tokens);
    if (st != PKV_OK)
        return pkvpy_raise(st, "PrefixCache.match", "%u tokens", n);
    return Py_BuildValue("{s:I,s:I,s:I,s:I}", "cached_tokens", m.cached_tokens, "cached_blocks",
                         m.cached_blocks, "new_blocks", m.new_blocks, "evictable_hit",
                         m.evictable_hit);
#else
    return pkvpy_raise(PKV_ERR_UNSUPPORTED, "PrefixCache.match",
                       "this build of libpagedkv does not declare pkv_prefix_cache_match "
                       "(include/pkv/prefix.h)");
#endif
}

static PyObject *Prefix_reclaim(PrefixObject *self, PyObject *arg) {
    uint32_t need;
    if (pkvpy_u32(arg, &need, "PrefixCache.reclaim(need)") < 0)
        return NULL;
    pkv_status st = pkv_prefix_cache_reclaim(self->cache, need);
    if (st != PKV_OK)
        return pkvpy_raise(st, "PrefixCache.reclaim", "wanted %u free blocks, pool has %u after "
                           "evicting every evictable entry", need,
                           pkv_pool_free_count(((PoolObject *)self->pool)->pool));
    Py_RETURN_NONE;
}

static PyObject *Prefix_stats(PrefixObject *self, PyObject *unused) {
    pkv_prefix_stats s;
    pkv_status st = pkv_prefix_cache_get_stats(self->cache, &s);
    if (st != PKV_OK)
        return pkvpy_raise(st, "PrefixCache.stats", NULL);
    return Py_BuildValue("{s:I,s:I,s:K,s:K,s:K,s:K}", "entries", s.entries, "evictable",
                         s.evictable, "lookups", (unsigned long long)s.lookups, "hits",
                         (unsigned long long)s.hits, "inserts", (unsigned long long)s.inserts,
                         "evictions", (unsigned long long)s.evictions);
}

static PyObject *Prefix_validate(PrefixObject *self, PyObject *unused) {
    pkv_status st = pkv_prefix_cache_validate(self->cache);
    if (st != PKV_OK)
        return pkvpy_raise(st, "PrefixCache.validate", NULL);
    Py_RETURN_NONE;
}

static PyObject *Prefix_get_pool(PrefixObject *self, void *c) {
    Py_INCREF(self->pool);
    return self->pool;
}
static PyObject *Prefix_get_block_size(PrefixObject *self, void *c) {
    return PyLong_FromUnsignedLong(self->block_size);
}

static PyMethodDef Prefix_methods[] = {
    {"attach", (PyCFunction)Prefix_attach, METH_O,
     "attach(seqset): the set (same pool, block size) now uses this cache."},
    {"detach", (PyCFunction)Prefix_detach, METH_O,
     "detach(seqset): the set no longer uses this cache (Busy while it shares cached blocks)."},
    {"create_seq", (PyCFunction)Prefix_create_seq, METH_VARARGS,
     "create_seq(seqset, tokens) -> (id, cached_tokens): a sequence starting with the longest\n"
     "cached prefix of tokens; append and prefill the remaining len(tokens) - cached_tokens."},
    {"insert", (PyCFunction)Prefix_insert, METH_VARARGS,
     "insert(seqset, id, tokens) -> new entries: offer the full blocks of a written sequence."},
    {"match", (PyCFunction)Prefix_match, METH_O,
     "match(tokens) -> dict(cached_tokens, cached_blocks, new_blocks, evictable_hit): a\n"
     "side-effect-free admission probe."},
    {"reclaim", (PyCFunction)Prefix_reclaim, METH_O,
     "reclaim(need): evict LRU unused entries until the pool has `need` free blocks."},
    {"stats", (PyCFunction)Prefix_stats, METH_NOARGS, "stats() -> dict of counters."},
    {"validate", (PyCFunction)Prefix_validate, METH_NOARGS, "validate(): raises Corrupt."},
    {NULL, NULL, 0, NULL},
};

static PyGetSetDef Prefix_getset[] = {
    {"pool", (getter)Prefix_get_pool, NULL, "the BlockPool", NULL},
    {"block_size", (getter)Prefix_get_block_size, NULL, "tokens per block", NULL},
    {NULL, NULL, NULL, NULL, NULL},
};

PyTypeObject pkvpy_Prefix_Type = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "pagedkv.PrefixCache",
    .tp_basicsize = sizeof(PrefixObject),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "PrefixCache(pool, block_size, max_entries=pool.capacity): full blocks of\n"
              "prompt prefixes, keyed by a chained hash and verified by their tokens.",
    .tp_new = Prefix_new,
    .tp_dealloc = (destructor)Prefix_dealloc,
    .tp_methods = Prefix_methods,
    .tp_getset = Prefix_getset,
};

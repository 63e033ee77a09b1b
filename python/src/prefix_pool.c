// SPDX-License-Identifier: MIT
// pagedkv.PrefixPool (a pkv_prefix_pool: vLLM v1 BlockPool's semantics) and
// pagedkv.BlockHasher (a pkv_hasher). Block ids cross as Python lists of ints and
// hashes as bytes: the compat layer (pagedkv.compat.vllm) works per block, where
// lists beat numpy arrays.
#include "pkvpy.h"

typedef struct {
    PyObject_HEAD
    pkv_prefix_pool *pool;
    uint32_t capacity;
    uint32_t num_groups;
} PrefixPoolObject;

typedef struct {
    PyObject_HEAD
    pkv_hasher *hasher;
} HasherObject;

// Py_NewRef is Python 3.10+; the package supports 3.9.
static PyObject *newref(PyObject *o) {
    Py_INCREF(o);
    return o;
}

static PyTypeObject Hasher_Type;

static const char *const medium_names[] = {"GPU", "CPU", "DISK"};

// ---- conversions ----

// ids (a sequence of ints) into a C array: small ones on the stack (buf, 64 entries),
// larger ones in *heap (free it). NULL with an exception on error.
static pkv_block_id *ids_from(PyObject *obj, pkv_block_id *buf, pkv_block_id **heap, uint32_t *n,
                              const char *what) {
    *heap = NULL;
    PyObject *seq = PySequence_Fast(obj, what);
    if (!seq) return NULL;
    Py_ssize_t len = PySequence_Fast_GET_SIZE(seq);
    if (len > (Py_ssize_t)PKV_POOL_MAX_BLOCKS) {
        Py_DECREF(seq);
        pkvpy_raise(PKV_ERR_INVALID_ARG, what, "%zd ids is more than a pool holds", len);
        return NULL;
    }
    pkv_block_id *ids = buf;
    if (len > 64 && !(ids = *heap = PyMem_Malloc((size_t)len * sizeof *ids))) {
        Py_DECREF(seq);
        return (pkv_block_id *)PyErr_NoMemory();
    }
    PyObject **items = PySequence_Fast_ITEMS(seq);
    for (Py_ssize_t i = 0; i < len; i++) {
        long v = PyLong_AsLong(items[i]);
        if ((v == -1 && PyErr_Occurred()) || v < INT32_MIN || v > INT32_MAX) {
            if (!PyErr_Occurred() || PyErr_ExceptionMatches(PyExc_OverflowError)) {
                PyErr_Clear();
                pkvpy_raise(PKV_ERR_NOT_FOUND, what, "block id %zd out of range", i);
            }
            Py_DECREF(seq);
            PyMem_Free(*heap);
            *heap = NULL;
            return NULL;
        }
        ids[i] = (pkv_block_id)v;
    }
    Py_DECREF(seq);
    *n = (uint32_t)len;
    return ids;
}

static PyObject *ids_to_list(const pkv_block_id *ids, uint32_t n) {
    PyObject *l = PyList_New(n);
    if (!l) return NULL;
    for (uint32_t i = 0; i < n; i++) {
        PyObject *v = PyLong_FromLong(ids[i]);
        if (!v) {
            Py_DECREF(l);
            return NULL;
        }
        PyList_SET_ITEM(l, i, v);
    }
    return l;
}

static int hash_from(PyObject *obj, pkv_block_hash *h, const char *what) {
    char *p;
    Py_ssize_t len;
    if (!PyBytes_Check(obj)) {
        pkvpy_raise(PKV_ERR_INVALID_ARG, what, "a block hash is bytes, got %s", Py_TYPE(obj)->tp_name);
        return -1;
    }
    PyBytes_AsStringAndSize(obj, &p, &len);
    if (len < 1 || len > PKV_BLOCK_HASH_MAX) {
        pkvpy_raise(PKV_ERR_INVALID_ARG, what, "a block hash has 1..%d bytes, got %zd",
                    PKV_BLOCK_HASH_MAX, len);
        return -1;
    }
    memset(h, 0, sizeof *h);
    h->len = (uint8_t)len;
    memcpy(h->bytes, p, (size_t)len);
    return 0;
}

static PyObject *hash_to_bytes(const pkv_block_hash *h) {
    return PyBytes_FromStringAndSize((const char *)h->bytes, h->len);
}

// A sequence of bytes hashes into a PyMem array. NULL with an exception on error.
static pkv_block_hash *hashes_from(PyObject *obj, uint32_t *n, const char *what) {
    PyObject *seq = PySequence_Fast(obj, what);
    if (!seq) return NULL;
    Py_ssize_t len = PySequence_Fast_GET_SIZE(seq);
    pkv_block_hash *hs = PyMem_Malloc((size_t)(len ? len : 1) * sizeof *hs);
    if (!hs) {
        Py_DECREF(seq);
        return (pkv_block_hash *)PyErr_NoMemory();
    }
    for (Py_ssize_t i = 0; i < len; i++)
        if (hash_from(PySequence_Fast_GET_ITEM(seq, i), &hs[i], what) < 0) {
            Py_DECREF(seq);
            PyMem_Free(hs);
            return NULL;
        }
    Py_DECREF(seq);
    *n = (uint32_t)len;
    return hs;
}

static int lora_from(PyObject *obj, int64_t *lora, const char *what) {
    if (!obj || obj == Py_None) {
        *lora = PKV_NO_LORA;
        return 0;
    }
    long long v = PyLong_AsLongLong(obj);
    if (v == -1 && PyErr_Occurred()) return -1;
    if (v < 0) {
        pkvpy_raise(PKV_ERR_INVALID_ARG, what, "lora_id %lld is negative", v);
        return -1;
    }
    *lora = v;
    return 0;
}

// Token ids into int32s for an event: a list or tuple of ints is read directly (the
// compat layer passes vLLM's token lists; numpy's list conversion cost more than the
// pool's work), anything else through numpy. *keep holds the array, *heap the list's
// copy (free both). NULL with an exception on error.
static const int32_t *tokens_from(PyObject *obj, PyArrayObject **keep, int32_t **heap, npy_intp *n,
                                  const char *what) {
    *keep = NULL;
    *heap = NULL;
    if (PyList_CheckExact(obj) || PyTuple_CheckExact(obj)) {
        PyObject *seq = PySequence_Fast(obj, what);
        if (!seq) return NULL;
        Py_ssize_t len = PySequence_Fast_GET_SIZE(seq);
        PyObject **items = PySequence_Fast_ITEMS(seq);
        int32_t *t = *heap = PyMem_Malloc((size_t)(len ? len : 1) * sizeof *t);
        if (!t) {
            Py_DECREF(seq);
            return (const int32_t *)PyErr_NoMemory();
        }
        for (Py_ssize_t i = 0; i < len; i++) {
            long v = PyLong_AsLong(items[i]);
            if ((v == -1 && PyErr_Occurred()) || v < INT32_MIN || v > INT32_MAX) {
                if (!PyErr_Occurred() || PyErr_ExceptionMatches(PyExc_OverflowError)) {
                    PyErr_Clear();
                    pkvpy_raise(PKV_ERR_INVALID_ARG, what, "token %zd is not an int32", i);
                }
                Py_DECREF(seq);
                PyMem_Free(t);
                *heap = NULL;
                return NULL;
            }
            t[i] = (int32_t)v;
        }
        Py_DECREF(seq);
        *n = len;
        return t;
    }
    if (!(*keep = pkvpy_int_vector(obj, NPY_INT32, what))) return NULL;
    *n = PyArray_SIZE(*keep);
    return PyArray_DATA(*keep);
}

// ---- PrefixPool ----

int pkvpy_medium(const char *name, const char *what, pkv_medium *medium) {
    for (int i = 0; i < 3; i++)
        if (strcmp(name, medium_names[i]) == 0) {
            *medium = (pkv_medium)i;
            return 0;
        }
    pkvpy_raise(PKV_ERR_INVALID_ARG, what, "medium %s is not GPU, CPU or DISK", name);
    return -1;
}

static PyObject *PP_new(PyTypeObject *type, PyObject *args, PyObject *kw) {
    static char *kwlist[] = {"num_blocks", "enable_caching", "num_groups", "medium",
                             "event_capacity", "event_payload", NULL};
    unsigned int n, groups = 1, cap = 0, payload = 0;
    int caching = 1;
    const char *medium = "GPU";
    if (!PyArg_ParseTupleAndKeywords(args, kw, "I|$pIsII:PrefixPool", kwlist, &n, &caching, &groups,
                                     &medium, &cap, &payload))
        return NULL;
    pkv_prefix_pool_params prm = pkv_prefix_pool_params_default(n);
    prm.enable_caching = caching;
    prm.num_groups = groups;
    prm.event_capacity = cap;
    prm.event_payload = payload;
    if (pkvpy_medium(medium, "PrefixPool", &prm.medium) < 0) return NULL;
    PrefixPoolObject *self = (PrefixPoolObject *)type->tp_alloc(type, 0);
    if (!self) return NULL;
    pkv_status st = pkv_prefix_pool_create(&prm, &self->pool);
    if (st != PKV_OK) {
        Py_DECREF(self);
        return pkvpy_raise(st, "PrefixPool", "num_blocks %u (2..%u), num_groups %u (>= 1)", n,
                           PKV_POOL_MAX_BLOCKS, groups);
    }
    self->capacity = n;
    self->num_groups = groups;
    return (PyObject *)self;
}

static void PP_dealloc(PrefixPoolObject *self) {
    pkv_prefix_pool_destroy(self->pool);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static PyObject *PP_get_new_blocks(PrefixPoolObject *self, PyObject *arg) {
    uint32_t n;
    if (pkvpy_u32(arg, &n, "PrefixPool.get_new_blocks(n)") < 0) return NULL;
    pkv_block_id small[64], *ids = small;
    if (n > 64 && !(ids = PyMem_Malloc((size_t)n * sizeof *ids))) return PyErr_NoMemory();
    pkv_status st = pkv_prefix_pool_get_new_blocks(self->pool, n, ids);
    PyObject *r = st == PKV_OK ? ids_to_list(ids, n)
                               : pkvpy_raise(st, "PrefixPool.get_new_blocks", "asked for %u blocks, %u free",
                                             n, pkv_prefix_pool_num_free(self->pool));
    if (ids != small) PyMem_Free(ids);
    return r;
}

// free_blocks(ids) and touch(ids) share their shape.
static PyObject *ids_call(PrefixPoolObject *self, PyObject *arg, const char *what,
                          pkv_status (*fn)(pkv_prefix_pool *, const pkv_block_id *, uint32_t)) {
    pkv_block_id buf[64], *heap;
    uint32_t n = 0;
    pkv_block_id *ids = ids_from(arg, buf, &heap, &n, what);
    if (!ids) return NULL;
    pkv_status st = fn(self->pool, ids, n);
    PyMem_Free(heap);
    if (st != PKV_OK)
        return pkvpy_raise(st, what, "an id out of 0..%u or listed more often than it is held "
                           "(nothing changed)", self->capacity - 1);
    Py_RETURN_NONE;
}

static PyObject *PP_free_blocks(PrefixPoolObject *self, PyObject *arg) {
    return ids_call(self, arg, "PrefixPool.free_blocks", pkv_prefix_pool_free_blocks);
}

static PyObject *PP_touch(PrefixPoolObject *self, PyObject *arg) {
    return ids_call(self, arg, "PrefixPool.touch", pkv_prefix_pool_touch);
}

static PyObject *PP_cache_blocks(PrefixPoolObject *self, PyObject *args, PyObject *kw) {
    static char *kwlist[] = {"blocks", "hashes", "parent", "tokens", "block_size", "lora_id",
                             "group", NULL};
    PyObject *blocks, *hashes, *parent = Py_None, *tokens = Py_None, *lora = Py_None;
    unsigned int bs = 0, group = 0;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "OO|$OOIOI:cache_blocks", kwlist, &blocks, &hashes,
                                     &parent, &tokens, &bs, &lora, &group))
        return NULL;
    const char *what = "PrefixPool.cache_blocks";
    pkv_block_store st = {.group = group, .block_size = bs};
    pkv_block_hash par;
    if (parent != Py_None) {
        if (hash_from(parent, &par, what) < 0) return NULL;
        st.parent = &par;
    }
    if (lora_from(lora, &st.lora_id, what) < 0) return NULL;
    pkv_block_id buf[64], *heap;
    uint32_t n = 0, nh = 0;
    pkv_block_id *ids = ids_from(blocks, buf, &heap, &n, what);
    if (!ids) return NULL;
    pkv_block_hash *hs = hashes_from(hashes, &nh, what);
    PyArrayObject *tok = NULL;
    int32_t *tok_heap = NULL;
    PyObject *r = NULL;
    if (!hs) goto done;
    if (nh != n) {
        pkvpy_raise(PKV_ERR_INVALID_ARG, what, "%u blocks but %u hashes", n, nh);
        goto done;
    }
    if (tokens != Py_None) {
        npy_intp nt = 0;
        if (!(st.tokens = tokens_from(tokens, &tok, &tok_heap, &nt, "PrefixPool.cache_blocks(tokens)")))
            goto done;
        if ((uint64_t)nt != (uint64_t)n * bs) {
            pkvpy_raise(PKV_ERR_INVALID_ARG, what, "%zd tokens for %u blocks of %u", (Py_ssize_t)nt, n, bs);
            goto done;
        }
    }
    st.n = n;
    st.blocks = ids;
    st.hashes = hs;
    pkv_status s = pkv_prefix_pool_cache_blocks(self->pool, &st);
    if (s != PKV_OK)
        pkvpy_raise(s, what, "every block must be in use and uncached, group < %u, and "
                    "block_size >= 1 with tokens (nothing changed)", self->num_groups);
    else
        r = newref(Py_None);
done:
    Py_XDECREF(tok);
    PyMem_Free(tok_heap);
    PyMem_Free(hs);
    PyMem_Free(heap);
    return r;
}

// hash_and_cache(hasher, blocks, tokens, parents, block_size, *, lora_id=None, group=0)
// -> [hashes]: the engine step's filled blocks in one call. blocks[i] (in use, uncached)
// holds tokens[i*block_size:(i+1)*block_size] (a flat int32 array) and follows a block
// hashed parents[i] (None: a sequence's first block); each is hashed (LoRA id as its
// extra key) and cached, one BlockStored event each (without token ids when
// event_tokens is false). All checked before any is cached.
static PyObject *PP_hash_and_cache(PrefixPoolObject *self, PyObject *args, PyObject *kw) {
    static char *kwlist[] = {"hasher", "blocks", "tokens", "parents", "block_size", "lora_id",
                             "group", "event_tokens", NULL};
    PyObject *hobj, *blocks, *tokens, *parents, *lora = Py_None;
    unsigned int bs, group = 0;
    int event_tokens = 1;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "OOOOI|$OIp:hash_and_cache", kwlist, &hobj, &blocks,
                                     &tokens, &parents, &bs, &lora, &group, &event_tokens))
        return NULL;
    const char *what = "PrefixPool.hash_and_cache";
    if (!PyObject_TypeCheck(hobj, &Hasher_Type))
        return pkvpy_raise(PKV_ERR_INVALID_ARG, what, "hasher must be a pagedkv.BlockHasher");
    const pkv_hasher *hasher = ((HasherObject *)hobj)->hasher;
    pkv_hash_extra x = {.lora_id = PKV_NO_LORA};
    if (bs == 0) return pkvpy_raise(PKV_ERR_INVALID_ARG, what, "block_size 0");
    if (lora_from(lora, &x.lora_id, what) < 0) return NULL;
    pkv_block_id buf[64], *heap;
    uint32_t n = 0;
    pkv_block_id *ids = ids_from(blocks, buf, &heap, &n, what);
    if (!ids) return NULL;
    PyArrayObject *tok = NULL;
    PyObject *pseq = NULL, *out = NULL;
    // A step fills a few dozen blocks at most: stack arrays, no allocation.
    pkv_block_hash hs_small[64], par_small[64];
    pkv_block_hash *hs = n <= 64 ? hs_small : PyMem_Malloc((size_t)n * sizeof *hs);
    pkv_block_hash *par = n <= 64 ? par_small : PyMem_Malloc((size_t)n * sizeof *par);
    if (!hs || !par) {
        PyErr_NoMemory();
        goto done;
    }
    if (!(tok = pkvpy_int_vector(tokens, NPY_INT32, "PrefixPool.hash_and_cache(tokens)"))) goto done;
    if ((uint64_t)PyArray_SIZE(tok) != (uint64_t)n * bs) {
        pkvpy_raise(PKV_ERR_INVALID_ARG, what, "%zd tokens for %u blocks of %u",
                    (Py_ssize_t)PyArray_SIZE(tok), n, bs);
        goto done;
    }
    if (!(pseq = PySequence_Fast(parents, what))) goto done;
    if ((uint32_t)PySequence_Fast_GET_SIZE(pseq) != n) {
        pkvpy_raise(PKV_ERR_INVALID_ARG, what, "%zd parents for %u blocks", PySequence_Fast_GET_SIZE(pseq), n);
        goto done;
    }
    const int32_t *t = PyArray_DATA(tok);
    uint8_t extra[16];
    size_t elen = 0;
    pkv_hash_extra_encode(&x, 1, 1 + bs, extra, sizeof extra, &elen); // LoRA only: no salt, no mm
    for (uint32_t i = 0; i < n; i++) {
        PyObject *p = PySequence_Fast_GET_ITEM(pseq, i);
        par[i].len = 0;
        if (p != Py_None && hash_from(p, &par[i], what) < 0) goto done;
        pkv_status st = pkv_hash_block(hasher, par[i].len ? &par[i] : NULL, t + (size_t)i * bs, bs,
                                       extra, elen, &hs[i]);
        if (st != PKV_OK) {
            pkvpy_raise(st, what, "block %u", i);
            goto done;
        }
    }
    // Check every block before caching any (cache_blocks checks one call at a time).
    for (uint32_t i = 0; i < n; i++) {
        int32_t rc = pkv_prefix_pool_refcount(self->pool, ids[i]);
        pkv_block_info info;
        if (ids[i] == PKV_NULL_BLOCK || rc < 1 ||
            pkv_prefix_pool_block_info(self->pool, ids[i], &info) != PKV_OK || info.cached) {
            pkvpy_raise(PKV_ERR_INVALID_ARG, what, "block %d is not in use or already cached "
                        "(nothing cached)", ids[i]);
            goto done;
        }
        for (uint32_t j = 0; j < i; j++)
            if (ids[j] == ids[i]) {
                pkvpy_raise(PKV_ERR_INVALID_ARG, what, "block %d listed twice", ids[i]);
                goto done;
            }
    }
    if (!(out = PyList_New(n))) goto done;
    for (uint32_t i = 0; i < n; i++) {
        pkv_block_store st = {.group = group, .n = 1, .blocks = &ids[i], .hashes = &hs[i],
                              .parent = par[i].len ? &par[i] : NULL,
                              .tokens = event_tokens ? t + (size_t)i * bs : NULL,
                              .block_size = bs, .lora_id = x.lora_id};
        pkv_status s = pkv_prefix_pool_cache_blocks(self->pool, &st);
        PyObject *b = s == PKV_OK ? hash_to_bytes(&hs[i])
                                  : pkvpy_raise(s, what, "group %u of %u", group, self->num_groups);
        if (!b) {
            Py_CLEAR(out);
            break;
        }
        PyList_SET_ITEM(out, i, b);
    }
done:
    Py_XDECREF(pseq);
    Py_XDECREF(tok);
    if (hs != hs_small) PyMem_Free(hs);
    if (par != par_small) PyMem_Free(par);
    PyMem_Free(heap);
    return out;
}

static PyObject *PP_get_cached_block(PrefixPoolObject *self, PyObject *args, PyObject *kw) {
    static char *kwlist[] = {"hash", "group", NULL};
    PyObject *h;
    unsigned int group = 0;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "O|I:get_cached_block", kwlist, &h, &group)) return NULL;
    pkv_block_hash hash;
    if (hash_from(h, &hash, "PrefixPool.get_cached_block") < 0) return NULL;
    pkv_block_id id;
    pkv_status st = pkv_prefix_pool_get_cached_block(self->pool, group, &hash, &id);
    if (st == PKV_ERR_NOT_FOUND) Py_RETURN_NONE;
    if (st != PKV_OK) return pkvpy_raise(st, "PrefixPool.get_cached_block", "group %u of %u", group, self->num_groups);
    return PyLong_FromLong(id);
}

static PyObject *PP_find_prefix(PrefixPoolObject *self, PyObject *args, PyObject *kw) {
    static char *kwlist[] = {"hashes", "group", NULL};
    PyObject *hobj;
    unsigned int group = 0;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "O|I:find_prefix", kwlist, &hobj, &group)) return NULL;
    uint32_t n = 0, hits = 0;
    pkv_block_hash *hs = hashes_from(hobj, &n, "PrefixPool.find_prefix");
    if (!hs) return NULL;
    pkv_block_id *ids = PyMem_Malloc((size_t)(n ? n : 1) * sizeof *ids);
    PyObject *r = NULL;
    if (!ids) {
        PyErr_NoMemory();
    } else {
        pkv_status st = pkv_prefix_pool_find_prefix(self->pool, group, hs, n, ids, &hits);
        r = st == PKV_OK ? ids_to_list(ids, hits)
                         : pkvpy_raise(st, "PrefixPool.find_prefix", "group %u of %u", group, self->num_groups);
    }
    PyMem_Free(ids);
    PyMem_Free(hs);
    return r;
}

// find_hybrid_prefix(groups, max_tokens) -> (hit_tokens, [[ids] per group]); each group
// a tuple (kind, window, block_size, hashes), kind one of "full", "sliding", "chunked",
// "mla", "state"; group i of the list is the pool's group i.
static int kind_from(const char *name, pkv_layer_kind *kind) {
    static const char *const names[] = {"full", "sliding", "chunked", "mla", "state"};
    for (int k = 0; k < 5; k++)
        if (strcmp(name, names[k]) == 0) {
            *kind = (pkv_layer_kind)k;
            return 0;
        }
    return -1;
}

static PyObject *PP_find_hybrid_prefix(PrefixPoolObject *self, PyObject *args, PyObject *kw) {
    static char *kwlist[] = {"groups", "max_tokens", NULL};
    static const char what[] = "PrefixPool.find_hybrid_prefix";
    PyObject *gobj;
    unsigned int max_tokens;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "OI:find_hybrid_prefix", kwlist, &gobj, &max_tokens))
        return NULL;
    PyObject *seq = PySequence_Fast(gobj, what);
    if (!seq) return NULL;
    Py_ssize_t ng = PySequence_Fast_GET_SIZE(seq);
    if (ng < 1 || ng > PKV_MAX_KV_GROUPS || (uint32_t)ng > self->num_groups) {
        Py_DECREF(seq);
        return pkvpy_raise(PKV_ERR_INVALID_ARG, what, "%zd groups: the pool has %u (at most %d)", ng,
                           self->num_groups, PKV_MAX_KV_GROUPS);
    }
    pkv_hybrid_lookup q[PKV_MAX_KV_GROUPS];
    memset(q, 0, sizeof q);
    PyObject *r = NULL;
    Py_ssize_t g = 0;
    for (; g < ng; g++) {
        const char *kind;
        unsigned int window, block_size;
        PyObject *hashes;
        if (!PyArg_ParseTuple(PySequence_Fast_GET_ITEM(seq, g), "sIIO;group: (kind, window, block_size, hashes)",
                              &kind, &window, &block_size, &hashes))
            goto done;
        if (kind_from(kind, &q[g].rule.kind) < 0) {
            pkvpy_raise(PKV_ERR_INVALID_ARG, what, "group %zd: kind '%s' is none of full, sliding, chunked, mla, state",
                        g, kind);
            goto done;
        }
        q[g].rule.window = window;
        q[g].rule.block_size = block_size;
        pkv_block_hash *hs = hashes_from(hashes, &q[g].num_hashes, what);
        if (!hs) goto done;
        q[g].hashes = hs;
        q[g].ids = PyMem_Malloc((size_t)(q[g].num_hashes ? q[g].num_hashes : 1) * sizeof *q[g].ids);
        if (!q[g].ids) {
            PyErr_NoMemory();
            g++;
            goto done;
        }
    }
    uint32_t hit = 0;
    pkv_status st = pkv_prefix_pool_find_hybrid_prefix(self->pool, q, (uint32_t)ng, max_tokens, &hit);
    if (st != PKV_OK) {
        pkvpy_raise(st, what, "a rule has a block size or window of 0, or block sizes without a usable LCM");
        goto done;
    }
    PyObject *lists = PyList_New(ng);
    for (Py_ssize_t i = 0; lists && i < ng; i++) {
        PyObject *ids = ids_to_list(q[i].ids, q[i].num_ids);
        if (!ids) Py_CLEAR(lists);
        else PyList_SET_ITEM(lists, i, ids);
    }
    if (lists) r = Py_BuildValue("(IN)", hit, lists);
done:
    for (Py_ssize_t i = 0; i < ng; i++) {
        PyMem_Free((void *)q[i].hashes);
        PyMem_Free(q[i].ids);
    }
    Py_DECREF(seq);
    return r;
}

static int block_id_arg(PrefixPoolObject *self, PyObject *arg, pkv_block_id *id, const char *what) {
    long v = PyLong_AsLong(arg);
    if (v == -1 && PyErr_Occurred()) return -1;
    if (v < 0 || (unsigned long)v >= self->capacity) {
        pkvpy_raise(PKV_ERR_NOT_FOUND, what, "block %ld not in 0..%u", v, self->capacity - 1);
        return -1;
    }
    *id = (pkv_block_id)v;
    return 0;
}

static PyObject *PP_evict_block(PrefixPoolObject *self, PyObject *arg) {
    pkv_block_id id;
    if (block_id_arg(self, arg, &id, "PrefixPool.evict_block") < 0) return NULL;
    pkv_block_info info;
    pkv_prefix_pool_block_info(self->pool, id, &info);
    pkv_prefix_pool_evict_block(self->pool, id);
    return PyBool_FromLong(info.cached);
}

static PyObject *PP_reset(PrefixPoolObject *self, PyObject *unused) {
    return PyBool_FromLong(pkv_prefix_pool_reset(self->pool) == PKV_OK);
}

// block_info(id) -> (refcount, hash or None, parent hash or None, group)
static PyObject *PP_block_info(PrefixPoolObject *self, PyObject *arg) {
    pkv_block_id id;
    if (block_id_arg(self, arg, &id, "PrefixPool.block_info") < 0) return NULL;
    pkv_block_info info;
    pkv_prefix_pool_block_info(self->pool, id, &info);
    if (!info.cached) return Py_BuildValue("(iOOO)", info.refcount, Py_None, Py_None, Py_None);
    PyObject *h = hash_to_bytes(&info.hash);
    PyObject *p = info.parent.len ? hash_to_bytes(&info.parent) : newref(Py_None);
    return Py_BuildValue("(iNNI)", info.refcount, h, p, info.group);
}

static PyObject *PP_block_hash(PrefixPoolObject *self, PyObject *arg) {
    pkv_block_id id;
    if (block_id_arg(self, arg, &id, "PrefixPool.block_hash") < 0) return NULL;
    pkv_block_info info;
    pkv_prefix_pool_block_info(self->pool, id, &info);
    if (!info.cached) Py_RETURN_NONE;
    return hash_to_bytes(&info.hash);
}

static PyObject *PP_refcount(PrefixPoolObject *self, PyObject *arg) {
    pkv_block_id id;
    if (block_id_arg(self, arg, &id, "PrefixPool.refcount") < 0) return NULL;
    return PyLong_FromLong(pkv_prefix_pool_refcount(self->pool, id));
}

static PyObject *PP_free_queue(PrefixPoolObject *self, PyObject *unused) {
    uint32_t n = pkv_prefix_pool_num_free(self->pool);
    pkv_block_id *ids = PyMem_Malloc((size_t)(n ? n : 1) * sizeof *ids);
    if (!ids) return PyErr_NoMemory();
    pkv_prefix_pool_free_queue(self->pool, ids, n, &n);
    PyObject *r = ids_to_list(ids, n);
    PyMem_Free(ids);
    return r;
}

static PyObject *PP_record(PrefixPoolObject *self, PyObject *args, PyObject *kw) {
    static char *kwlist[] = {"num_tokens", "num_hits", "preempted", NULL};
    unsigned long long q, h;
    int pre = 0;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "KK|p:record", kwlist, &q, &h, &pre)) return NULL;
    pkv_status st = pkv_prefix_pool_record(self->pool, q, h, pre);
    if (st != PKV_OK) return pkvpy_raise(st, "PrefixPool.record", "num_hits %llu > num_tokens %llu", h, q);
    Py_RETURN_NONE;
}

static PyObject *PP_stats(PrefixPoolObject *self, PyObject *args, PyObject *kw) {
    static char *kwlist[] = {"reset", NULL};
    int reset = 0;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "|p:stats", kwlist, &reset)) return NULL;
    pkv_prefix_pool_stats s;
    pkv_prefix_pool_get_stats(self->pool, &s, reset);
    return Py_BuildValue("{sIsIsIsKsKsKsKsKsKsKsK}", "capacity", s.capacity, "free_blocks",
                         s.free_blocks, "cached_blocks", s.cached_blocks, "requests", s.requests,
                         "queries", s.queries, "hits", s.hits, "preempted_requests",
                         s.preempted_requests, "preempted_queries", s.preempted_queries,
                         "preempted_hits", s.preempted_hits, "evictions", s.evictions,
                         "events_dropped", s.events_dropped);
}

static PyObject *hash_list(const pkv_block_hash *hs, uint32_t n) {
    PyObject *l = PyList_New(n);
    for (uint32_t i = 0; l && i < n; i++) {
        PyObject *b = hash_to_bytes(&hs[i]);
        if (!b) {
            Py_CLEAR(l);
            break;
        }
        PyList_SET_ITEM(l, i, b);
    }
    return l;
}

static PyObject *token_list(const int32_t *t, uint32_t n) {
    PyObject *l = PyList_New(n);
    for (uint32_t i = 0; l && i < n; i++) {
        PyObject *v = PyLong_FromLong(t[i]);
        if (!v) {
            Py_CLEAR(l);
            break;
        }
        PyList_SET_ITEM(l, i, v);
    }
    return l;
}

// Event names and media as interned strings, made once: a drain of a hundred events
// otherwise builds two hundred identical strings.
static PyObject *kind_str[5], *medium_str[3];

static int intern_event_strings(void) {
    static const char *const kinds[5] = {NULL, "BlockStored", "BlockRemoved", "AllBlocksCleared", "Overflow"};
    for (int i = 1; i < 5; i++)
        if (!kind_str[i] && !(kind_str[i] = PyUnicode_InternFromString(kinds[i]))) return -1;
    for (int i = 0; i < 3; i++)
        if (!medium_str[i] && !(medium_str[i] = PyUnicode_InternFromString(medium_names[i]))) return -1;
    return 0;
}

// A new tuple of n items, each reference stolen; NULL (every item released) if one is NULL.
static PyObject *tuple_of(Py_ssize_t n, PyObject **items) {
    PyObject *t = NULL;
    for (Py_ssize_t i = 0; i < n; i++)
        if (!items[i]) goto fail;
    if (!(t = PyTuple_New(n))) goto fail;
    for (Py_ssize_t i = 0; i < n; i++) PyTuple_SET_ITEM(t, i, items[i]);
    return t;
fail:
    for (Py_ssize_t i = 0; i < n; i++) Py_XDECREF(items[i]);
    return NULL;
}

// take_events() -> list of tuples, oldest first:
//   ("BlockStored", hashes, parent|None, token_ids, block_size, lora_id|None, medium, group)
//   ("BlockRemoved", hashes, medium, group)
//   ("AllBlocksCleared", medium)
//   ("Overflow", dropped)
// (the tuples of pkvpy_events_list, shared with HybridKV.take_events).
PyObject *pkvpy_events_list(const pkv_kv_event *ev, uint32_t n) {
    PyObject *l = PyList_New(n);
    for (uint32_t i = 0; l && i < n; i++) {
        const pkv_kv_event *e = &ev[i];
        PyObject *kind = newref(kind_str[e->kind]), *medium = newref(medium_str[e->medium]);
        PyObject *t = NULL;
        switch (e->kind) {
        case PKV_EVENT_BLOCK_STORED: {
            PyObject *it[8] = {kind, hash_list(e->hashes, e->num_hashes),
                               e->has_parent ? hash_to_bytes(&e->parent) : newref(Py_None),
                               token_list(e->tokens, e->num_tokens), PyLong_FromUnsignedLong(e->block_size),
                               e->lora_id == PKV_NO_LORA ? newref(Py_None) : PyLong_FromLongLong(e->lora_id),
                               medium, PyLong_FromUnsignedLong(e->group)};
            t = tuple_of(8, it);
            break;
        }
        case PKV_EVENT_BLOCK_REMOVED: {
            PyObject *it[4] = {kind, hash_list(e->hashes, e->num_hashes), medium,
                               PyLong_FromUnsignedLong(e->group)};
            t = tuple_of(4, it);
            break;
        }
        case PKV_EVENT_ALL_BLOCKS_CLEARED: {
            PyObject *it[2] = {kind, medium};
            t = tuple_of(2, it);
            break;
        }
        case PKV_EVENT_OVERFLOW: {
            Py_DECREF(medium);
            PyObject *it[2] = {kind, PyLong_FromUnsignedLongLong(e->dropped)};
            t = tuple_of(2, it);
            break;
        }
        }
        if (!t) {
            Py_CLEAR(l);
            break;
        }
        PyList_SET_ITEM(l, i, t);
    }
    return l;
}

static PyObject *PP_take_events(PrefixPoolObject *self, PyObject *unused) {
    const pkv_kv_event *ev;
    uint32_t n;
    pkv_prefix_pool_take_events(self->pool, &ev, &n);
    return pkvpy_events_list(ev, n);
}

// The packed drain's records: one int64 row per event, these columns (KV_EVENT_FIELDS).
// A plain int64 array: numpy makes it in a fraction of a structured array's time.
enum {
    EV_KIND,        // 1 BlockStored, 2 BlockRemoved, 3 AllBlocksCleared, 4 Overflow
    EV_MEDIUM,      // 0 GPU, 1 CPU, 2 DISK
    EV_GROUP,
    EV_BLOCK_SIZE,
    EV_PARENT,      // index in the drain's hashes; -1: none
    EV_FIRST_HASH,  // the event's hashes: [first_hash, first_hash + num_hashes)
    EV_NUM_HASHES,
    EV_FIRST_TOKEN, // its token ids: [first_token, first_token + num_tokens)
    EV_NUM_TOKENS,
    EV_LORA_ID,     // -1: none
    EV_DROPPED,     // Overflow: events lost since the previous drain
    EV_COLUMNS
};
static const char *const event_fields[EV_COLUMNS] = {
    "kind", "medium", "group", "block_size", "parent", "first_hash", "num_hashes",
    "first_token", "num_tokens", "lora_id", "dropped"};

// take_events_packed(*, tokens=True) -> (records, hashes, hash_offsets, token_ids): the
// drain take_events makes, in four objects instead of a tuple (and lists) per event.
// records: an int64 array [events, KV_EVENT_FIELDS], a row per event; hashes: every hash of the drain in
// one bytes, hash j at hashes[hash_offsets[j]:hash_offsets[j+1]] (records index it:
// first_hash, num_hashes, parent); token_ids: int32, event e's at
// [first_token, first_token + num_tokens). tokens=False leaves token ids out.
static PyObject *PP_take_events_packed(PrefixPoolObject *self, PyObject *args, PyObject *kw) {
    static char *kwlist[] = {"tokens", NULL};
    int want_tokens = 1;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "|$p:take_events_packed", kwlist, &want_tokens)) return NULL;
    const pkv_kv_event *ev;
    uint32_t n;
    pkv_prefix_pool_take_events(self->pool, &ev, &n);
    npy_intp nh = 0, nt = 0, nbytes = 0;
    for (uint32_t i = 0; i < n; i++) {
        nh += ev[i].num_hashes + (ev[i].has_parent != 0);
        for (uint32_t j = 0; j < ev[i].num_hashes; j++) nbytes += ev[i].hashes[j].len;
        if (ev[i].has_parent) nbytes += ev[i].parent.len;
        if (want_tokens) nt += ev[i].num_tokens;
    }
    npy_intp dims[2] = {n, EV_COLUMNS}, offs_n = nh + 1;
    PyObject *rec = PyArray_SimpleNew(2, dims, NPY_INT64);
    PyObject *hb = PyBytes_FromStringAndSize(NULL, nbytes);
    PyObject *off = PyArray_SimpleNew(1, &offs_n, NPY_UINT32);
    PyObject *tok = PyArray_SimpleNew(1, &nt, NPY_INT32);
    if (!rec || !hb || !off || !tok) {
        Py_XDECREF(rec);
        Py_XDECREF(hb);
        Py_XDECREF(off);
        Py_XDECREF(tok);
        return NULL;
    }
    int64_t *r = PyArray_DATA((PyArrayObject *)rec);
    char *bytes = PyBytes_AS_STRING(hb);
    uint32_t *o = PyArray_DATA((PyArrayObject *)off);
    int32_t *t = PyArray_DATA((PyArrayObject *)tok);
    uint32_t h = 0, at = 0, ta = 0;
    o[0] = 0;
    for (uint32_t i = 0; i < n; i++) {
        const pkv_kv_event *e = &ev[i];
        int64_t *x = r + (size_t)i * EV_COLUMNS;
        x[EV_KIND] = e->kind;
        x[EV_MEDIUM] = e->medium;
        x[EV_GROUP] = e->group;
        x[EV_BLOCK_SIZE] = e->block_size;
        x[EV_LORA_ID] = e->lora_id == PKV_NO_LORA ? -1 : e->lora_id;
        x[EV_DROPPED] = (int64_t)e->dropped;
        x[EV_PARENT] = -1;
        if (e->has_parent) {
            memcpy(bytes + at, e->parent.bytes, e->parent.len);
            at += e->parent.len;
            x[EV_PARENT] = h;
            o[++h] = at;
        }
        x[EV_FIRST_HASH] = h;
        x[EV_NUM_HASHES] = e->num_hashes;
        for (uint32_t j = 0; j < e->num_hashes; j++) {
            memcpy(bytes + at, e->hashes[j].bytes, e->hashes[j].len);
            at += e->hashes[j].len;
            o[++h] = at;
        }
        x[EV_FIRST_TOKEN] = ta;
        x[EV_NUM_TOKENS] = 0;
        if (want_tokens && e->num_tokens) {
            memcpy(t + ta, e->tokens, (size_t)e->num_tokens * sizeof *t);
            x[EV_NUM_TOKENS] = e->num_tokens;
            ta += e->num_tokens;
        }
    }
    return Py_BuildValue("(NNNN)", rec, hb, off, tok);
}

static PyObject *PP_validate(PrefixPoolObject *self, PyObject *unused) {
    pkv_status st = pkv_prefix_pool_validate(self->pool);
    if (st != PKV_OK) return pkvpy_raise(st, "PrefixPool.validate", NULL);
    Py_RETURN_NONE;
}

static PyObject *PP_num_free(PrefixPoolObject *self, void *c) {
    return PyLong_FromUnsignedLong(pkv_prefix_pool_num_free(self->pool));
}
static PyObject *PP_capacity(PrefixPoolObject *self, void *c) {
    return PyLong_FromUnsignedLong(self->capacity);
}

static PyMethodDef PP_methods[] = {
    {"get_new_blocks", (PyCFunction)PP_get_new_blocks, METH_O,
     "get_new_blocks(n) -> [ids]: from the head of the free queue, evicting cached ones lazily."},
    {"free_blocks", (PyCFunction)PP_free_blocks, METH_O,
     "free_blocks(ids): drop a reference each, ids in eviction order (first evicted first)."},
    {"touch", (PyCFunction)PP_touch, METH_O,
     "touch(ids): a hit; one more reference each, out of the free queue."},
    {"cache_blocks", (PyCFunction)(void (*)(void))PP_cache_blocks, METH_VARARGS | METH_KEYWORDS,
     "cache_blocks(blocks, hashes, *, parent=None, tokens=None, block_size=0, lora_id=None,\n"
     "group=0): cache full blocks under their hashes (one BlockStored event; without tokens\n"
     "it carries no token ids)."},
    {"hash_and_cache", (PyCFunction)(void (*)(void))PP_hash_and_cache, METH_VARARGS | METH_KEYWORDS,
     "hash_and_cache(hasher, blocks, tokens, parents, block_size, *, lora_id=None, group=0,\n"
     "event_tokens=True) -> [hashes]: hash and cache a step's filled blocks in one call (one\n"
     "event each); event_tokens=False: the BlockStored events carry no token ids (cheaper)."},
    {"get_cached_block", (PyCFunction)(void (*)(void))PP_get_cached_block, METH_VARARGS | METH_KEYWORDS,
     "get_cached_block(hash, group=0) -> id or None (the earliest cached under it)."},
    {"find_prefix", (PyCFunction)(void (*)(void))PP_find_prefix, METH_VARARGS | METH_KEYWORDS,
     "find_prefix(hashes, group=0) -> [ids] of the longest cached run; no side effect."},
    {"find_hybrid_prefix", (PyCFunction)(void (*)(void))PP_find_hybrid_prefix, METH_VARARGS | METH_KEYWORDS,
     "find_hybrid_prefix(groups, max_tokens) -> (hit_tokens, [[ids] per group]): the longest\n"
     "prefix hit common to KV cache groups (hybrid models). groups: a (kind, window,\n"
     "block_size, hashes) per pool group, kind 'full', 'sliding', 'chunked', 'mla' or\n"
     "'state'; ids are the blocks to reuse, 0 (the null block) where a group needs none.\n"
     "No side effect."},
    {"evict_block", (PyCFunction)PP_evict_block, METH_O,
     "evict_block(id) -> bool: drop the block's hash (True if it had one)."},
    {"reset", (PyCFunction)PP_reset, METH_NOARGS,
     "reset() -> bool: forget every hash; False (nothing changed) while blocks are in use."},
    {"block_info", (PyCFunction)PP_block_info, METH_O,
     "block_info(id) -> (refcount, hash, parent_hash, group); hashes None when uncached."},
    {"block_hash", (PyCFunction)PP_block_hash, METH_O, "block_hash(id) -> bytes or None."},
    {"refcount", (PyCFunction)PP_refcount, METH_O, "refcount(id) -> int (0: queued)."},
    {"free_queue", (PyCFunction)PP_free_queue, METH_NOARGS, "free_queue() -> [ids], head first."},
    {"record", (PyCFunction)(void (*)(void))PP_record, METH_VARARGS | METH_KEYWORDS,
     "record(num_tokens, num_hits, preempted=False): count one lookup (PrefixCacheStats)."},
    {"stats", (PyCFunction)(void (*)(void))PP_stats, METH_VARARGS | METH_KEYWORDS,
     "stats(reset=False) -> dict; reset zeroes requests/queries/hits after reading."},
    {"take_events", (PyCFunction)PP_take_events, METH_NOARGS,
     "take_events() -> [event tuples], oldest first; ends with ('Overflow', n) if n were dropped."},
    {"take_events_packed", (PyCFunction)(void (*)(void))PP_take_events_packed, METH_VARARGS | METH_KEYWORDS,
     "take_events_packed(*, tokens=True) -> (records, hashes, hash_offsets, token_ids): the\n"
     "same drain as take_events without a Python object per event. records: int64\n"
     "[events, len(KV_EVENT_FIELDS)], a row per event (kind 1 BlockStored, 2 BlockRemoved,\n"
     "3 AllBlocksCleared, 4 Overflow; medium 0 GPU, 1 CPU, 2 DISK; lora_id -1 for none; parent -1 for none, else a hash index); hash j is\n"
     "hashes[hash_offsets[j]:hash_offsets[j + 1]]; an event's token ids are\n"
     "token_ids[first_token:first_token + num_tokens]. tokens=False: none copied."},
    {"validate", (PyCFunction)PP_validate, METH_NOARGS, "validate(): raise Corrupt on a broken invariant."},
    {NULL, NULL, 0, NULL},
};

static PyGetSetDef PP_getset[] = {
    {"num_free", (getter)PP_num_free, NULL, "blocks in the free queue (cached ones included)", NULL},
    {"capacity", (getter)PP_capacity, NULL, "blocks, the null block included", NULL},
    {NULL, NULL, NULL, NULL, NULL},
};

static PyTypeObject PrefixPool_Type = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "pagedkv.PrefixPool",
    .tp_basicsize = sizeof(PrefixPoolObject),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "PrefixPool(num_blocks, *, enable_caching=True, num_groups=1, medium='GPU',\n"
              "event_capacity=0, event_payload=0): a block pool with vLLM v1's prefix caching\n"
              "(block 0 is the null block). See include/pkv/prefix_pool.h.",
    .tp_new = PP_new,
    .tp_dealloc = (destructor)PP_dealloc,
    .tp_methods = PP_methods,
    .tp_getset = PP_getset,
};

// ---- BlockHasher ----

static const char *const algo_names[] = {"sha256", "xxh3_128", "fnv1a_64"};

static PyObject *BH_new(PyTypeObject *type, PyObject *args, PyObject *kw) {
    static char *kwlist[] = {"algo", "seed", NULL};
    const char *algo = "sha256";
    Py_buffer seed = {0};
    if (!PyArg_ParseTupleAndKeywords(args, kw, "|sy*:BlockHasher", kwlist, &algo, &seed)) return NULL;
    int a = -1;
    for (int i = 0; i < 3; i++)
        if (strcmp(algo, algo_names[i]) == 0) a = i;
    HasherObject *self = NULL;
    if (a < 0) {
        pkvpy_raise(PKV_ERR_INVALID_ARG, "BlockHasher", "algo %s is not sha256, xxh3_128 or fnv1a_64", algo);
    } else if ((self = (HasherObject *)type->tp_alloc(type, 0))) {
        pkv_status st = pkv_hasher_create((pkv_hash_algo)a, seed.buf, seed.buf ? (size_t)seed.len : 0,
                                          &self->hasher);
        if (st != PKV_OK) {
            Py_CLEAR(self);
            pkvpy_raise(st, "BlockHasher", "algo %s (xxh3_128 needs xxHash at build time)", algo);
        }
    }
    if (seed.obj) PyBuffer_Release(&seed);
    return (PyObject *)self;
}

static void BH_dealloc(HasherObject *self) {
    pkv_hasher_destroy(self->hasher);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

// Request-level extra keys from Python values: lora_id (int|None), cache_salt
// (bytes|str|None), mm: sequence of (offset, length, identifier bytes|str).
typedef struct extra_args {
    pkv_hash_extra x;
    pkv_mm_feature *mm;
    PyObject *keep;  // a list holding the bytes the pointers borrow
} extra_args;

static const char *bytes_of(PyObject *o, uint32_t *len, PyObject *keep, const char *what) {
    PyObject *b = PyUnicode_Check(o) ? PyUnicode_AsUTF8String(o) : newref(o);
    if (!b) return NULL;
    if (!PyBytes_Check(b)) {
        Py_DECREF(b);
        pkvpy_raise(PKV_ERR_INVALID_ARG, what, "expected bytes or str, got %s", Py_TYPE(o)->tp_name);
        return NULL;
    }
    PyList_Append(keep, b);
    Py_DECREF(b);
    *len = (uint32_t)PyBytes_GET_SIZE(b);
    return PyBytes_AS_STRING(b);
}

static int extra_from(extra_args *e, PyObject *lora, PyObject *salt, PyObject *mm, const char *what) {
    memset(e, 0, sizeof *e);
    if (!(e->keep = PyList_New(0))) return -1;
    if (lora_from(lora, &e->x.lora_id, what) < 0) return -1;
    if (salt && salt != Py_None && !(e->x.cache_salt = bytes_of(salt, &e->x.salt_len, e->keep, what)))
        return -1;
    if (mm && mm != Py_None) {
        PyObject *seq = PySequence_Fast(mm, what);
        if (!seq) return -1;
        Py_ssize_t n = PySequence_Fast_GET_SIZE(seq);
        e->mm = PyMem_Calloc((size_t)(n ? n : 1), sizeof *e->mm);
        for (Py_ssize_t i = 0; e->mm && i < n; i++) {
            unsigned int off, len;
            PyObject *id;
            if (!PyArg_ParseTuple(PySequence_Fast_GET_ITEM(seq, i), "IIO;mm features are (offset, length, id)",
                                  &off, &len, &id) ||
                !(e->mm[i].id = bytes_of(id, &e->mm[i].id_len, e->keep, what))) {
                Py_DECREF(seq);
                return -1;
            }
            e->mm[i].offset = off;
            e->mm[i].length = len;
        }
        Py_DECREF(seq);
        if (!e->mm) return PyErr_NoMemory(), -1;
        e->x.mm = e->mm;
        e->x.num_mm = (uint32_t)n;
    }
    return 0;
}

static void extra_free(extra_args *e) {
    PyMem_Free(e->mm);
    Py_XDECREF(e->keep);
}

static PyObject *BH_root(HasherObject *self, void *c) {
    pkv_block_hash h;
    pkv_hasher_root(self->hasher, &h);
    return hash_to_bytes(&h);
}

// hash_blocks(tokens, block_size, *, parent=None, start=0, lora_id=None, cache_salt=None,
// mm=None) -> [hashes]: the full blocks of tokens, which sit at positions start.. of the
// sequence (start a multiple of block_size), chained after parent (the hash of the
// block before `start`): incremental hashing, the new tokens only.
static PyObject *BH_hash_blocks(HasherObject *self, PyObject *args, PyObject *kw) {
    static char *kwlist[] = {"tokens", "block_size", "parent", "start", "lora_id", "cache_salt",
                             "mm", NULL};
    PyObject *tokens, *parent = Py_None, *lora = Py_None, *salt = Py_None, *mm = Py_None;
    unsigned int bs, start = 0;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "OI|$OIOOO:hash_blocks", kwlist, &tokens, &bs, &parent,
                                     &start, &lora, &salt, &mm))
        return NULL;
    const char *what = "BlockHasher.hash_blocks";
    if (bs == 0 || start % bs) return pkvpy_raise(PKV_ERR_INVALID_ARG, what, "block_size %u, start %u", bs, start);
    pkv_hash_chain chain;
    pkv_hash_chain_init(&chain);
    chain.blocks = start / bs;
    if (parent != Py_None) {
        if (hash_from(parent, &chain.last, what) < 0) return NULL;
    } else if (start) {
        return pkvpy_raise(PKV_ERR_INVALID_ARG, what, "start %u needs the parent hash", start);
    }
    PyArrayObject *tok = pkvpy_int_vector(tokens, NPY_INT32, "BlockHasher.hash_blocks(tokens)");
    if (!tok) return NULL;
    extra_args e;
    PyObject *out = NULL;
    if (extra_from(&e, lora, salt, mm, what) == 0 && (out = PyList_New(0))) {
        const int32_t *t = PyArray_DATA(tok);
        npy_intp n = PyArray_SIZE(tok);
        for (npy_intp at = 0; at + bs <= n; at += bs) {
            pkv_block_hash h;
            pkv_status st = pkv_hash_chain_next(self->hasher, &chain, t + at, bs, &e.x, &h);
            PyObject *b = st == PKV_OK ? hash_to_bytes(&h)
                                       : pkvpy_raise(st, what, "extra keys: mm features sorted, disjoint, length >= 1");
            if (!b || PyList_Append(out, b) < 0) {
                Py_XDECREF(b);
                Py_CLEAR(out);
                break;
            }
            Py_DECREF(b);
        }
    }
    extra_free(&e);
    Py_DECREF(tok);
    return out;
}

static PyGetSetDef BH_getset[] = {
    {"root", (getter)BH_root, NULL, "H(seed): the parent of every first block", NULL},
    {NULL, NULL, NULL, NULL, NULL},
};

static PyMethodDef BH_methods[] = {
    {"hash_blocks", (PyCFunction)(void (*)(void))BH_hash_blocks, METH_VARARGS | METH_KEYWORDS,
     "hash_blocks(tokens, block_size, *, parent=None, start=0, lora_id=None, cache_salt=None,\n"
     "mm=None) -> [bytes]: hashes of the full blocks of tokens (at sequence position start),\n"
     "chained after parent; "
     "mm is a list of (offset, length, identifier). Costs one hash per new block."},
    {NULL, NULL, 0, NULL},
};

static PyTypeObject Hasher_Type = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "pagedkv.BlockHasher",
    .tp_basicsize = sizeof(HasherObject),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "BlockHasher(algo='sha256', seed=b''): block hashes for PrefixPool "
              "(sha256, xxh3_128 when built with xxHash, fnv1a_64 for tests).",
    .tp_new = BH_new,
    .tp_dealloc = (destructor)BH_dealloc,
    .tp_methods = BH_methods,
    .tp_getset = BH_getset,
};

int pkvpy_prefix_pool_init(PyObject *m) {
    if (PyType_Ready(&PrefixPool_Type) < 0 || PyType_Ready(&Hasher_Type) < 0 ||
        intern_event_strings() < 0)
        return -1;
    PyObject *fields = PyTuple_New(EV_COLUMNS);
    for (int i = 0; fields && i < EV_COLUMNS; i++) {
        PyObject *f = PyUnicode_FromString(event_fields[i]);
        if (!f) Py_CLEAR(fields);
        else PyTuple_SET_ITEM(fields, i, f);
    }
    if (!fields || PyModule_AddObject(m, "KV_EVENT_FIELDS", fields) < 0) {
        Py_XDECREF(fields);
        return -1;
    }
    PyObject *algos = PyList_New(0);
    for (int i = 0; algos && i < 3; i++)
        if (pkv_hash_algo_available((pkv_hash_algo)i)) {
            PyObject *s = PyUnicode_FromString(algo_names[i]);
            if (!s || PyList_Append(algos, s) < 0) Py_CLEAR(algos);
            Py_XDECREF(s);
        }
    if (!algos) return -1;
    Py_INCREF(&PrefixPool_Type);
    Py_INCREF(&Hasher_Type);
    if (PyModule_AddObject(m, "PrefixPool", (PyObject *)&PrefixPool_Type) < 0 ||
        PyModule_AddObject(m, "BlockHasher", (PyObject *)&Hasher_Type) < 0 ||
        PyModule_AddObject(m, "HASH_ALGOS", PyList_AsTuple(algos)) < 0) {
        Py_DECREF(algos);
        return -1;
    }
    Py_DECREF(algos);
    return 0;
}

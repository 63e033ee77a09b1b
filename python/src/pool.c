// SPDX-License-Identifier: MIT
// pagedkv.BlockPool: owns a pkv_pool (ids and refcounts only, no memory).
#include "pkvpy.h"

static PyObject *Pool_new(PyTypeObject *type, PyObject *args, PyObject *kw) {
    static char *kwlist[] = {"num_blocks", NULL};
    PyObject *nobj;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "O:BlockPool", kwlist, &nobj))
        return NULL;
    uint32_t n;
    if (pkvpy_u32(nobj, &n, "BlockPool(num_blocks)") < 0)
        return NULL;
    PoolObject *self = (PoolObject *)type->tp_alloc(type, 0);
    if (!self)
        return NULL;
    pkv_status st = pkv_pool_create(n, &self->pool);
    if (st != PKV_OK) {
        Py_DECREF(self);
        return pkvpy_raise(st, "BlockPool", "num_blocks %u not in 1..%u", n, PKV_POOL_MAX_BLOCKS);
    }
    return (PyObject *)self;
}

static void Pool_dealloc(PoolObject *self) {
    pkv_pool_destroy(self->pool);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static PyObject *Pool_alloc(PoolObject *self, PyObject *arg) {
    uint32_t n;
    if (pkvpy_u32(arg, &n, "BlockPool.alloc(n)") < 0)
        return NULL;
    // More than the pool has: the library refuses before writing a single id
    // (pool.h: all or nothing), so it counts the failure without the n-entry
    // output the wrapper would otherwise size from n first (issue 20).
    if (n > pkv_pool_free_count(self->pool)) {
        pkv_block_id none[1];
        pkv_status st = pkv_pool_alloc(self->pool, n, none);
        return pkvpy_raise(st, "BlockPool.alloc", "asked for %u blocks, %u free", n,
                           pkv_pool_free_count(self->pool));
    }
    PyArrayObject *ids = pkvpy_new_vector(n, NPY_INT32);
    if (!ids)
        return NULL;
    pkv_status st = pkv_pool_alloc(self->pool, n, (pkv_block_id *)PyArray_DATA(ids));
    if (st != PKV_OK) {
        Py_DECREF(ids);
        return pkvpy_raise(st, "BlockPool.alloc", "asked for %u blocks, %u free", n,
                           pkv_pool_free_count(self->pool));
    }
    return (PyObject *)ids;
}

static int block_arg(PyObject *arg, pkv_block_id *id, const char *what) {
    long long v = PyLong_AsLongLong(arg);
    if (v == -1 && PyErr_Occurred())
        return -1;
    if (v < INT32_MIN || v > INT32_MAX) {
        pkvpy_raise(PKV_ERR_NOT_FOUND, what, "block %lld out of range", v);
        return -1;
    }
    *id = (pkv_block_id)v;
    return 0;
}

static PyObject *Pool_retain(PoolObject *self, PyObject *arg) {
    pkv_block_id id;
    if (block_arg(arg, &id, "BlockPool.retain") < 0)
        return NULL;
    pkv_status st = pkv_pool_retain(self->pool, id);
    if (st != PKV_OK)
        return pkvpy_raise(st, "BlockPool.retain", "block %d is free or out of range", id);
    Py_RETURN_NONE;
}

// release(id) or release(ids): the array form is pkv_pool_release_n (all checked first).
static PyObject *Pool_release(PoolObject *self, PyObject *arg) {
    pkv_status st;
    if (PyLong_Check(arg) || PyArray_IsScalar(arg, Integer)) {
        pkv_block_id id;
        if (block_arg(arg, &id, "BlockPool.release") < 0)
            return NULL;
        st = pkv_pool_release(self->pool, id);
        if (st != PKV_OK)
            return pkvpy_raise(st, "BlockPool.release", "block %d is free or out of range", id);
        Py_RETURN_NONE;
    }
    PyArrayObject *ids = pkvpy_int_vector(arg, NPY_INT32, "BlockPool.release(ids)");
    if (!ids)
        return NULL;
    npy_intp n = PyArray_DIM(ids, 0);
    st = n > (npy_intp)UINT32_MAX ? PKV_ERR_INVALID_ARG
                                  : pkv_pool_release_n(self->pool, PyArray_DATA(ids), (uint32_t)n);
    Py_DECREF(ids);
    if (st != PKV_OK)
        return pkvpy_raise(st, "BlockPool.release", "%lld ids, one is free, out of range or "
                           "listed more often than it is referenced; nothing released",
                           (long long)n);
    Py_RETURN_NONE;
}

static PyObject *Pool_refcount(PoolObject *self, PyObject *arg) {
    pkv_block_id id;
    if (block_arg(arg, &id, "BlockPool.refcount") < 0)
        return NULL;
    int32_t rc = pkv_pool_refcount(self->pool, id);
    if (rc < 0)
        return pkvpy_raise(PKV_ERR_NOT_FOUND, "BlockPool.refcount", "block %d out of range", id);
    return PyLong_FromLong(rc);
}

static PyObject *Pool_stats(PoolObject *self, PyObject *unused) {
    pkv_pool_stats s;
    pkv_status st = pkv_pool_get_stats(self->pool, &s);
    if (st != PKV_OK)
        return pkvpy_raise(st, "BlockPool.stats", NULL);
    return Py_BuildValue("{s:I,s:I,s:I,s:I,s:K}", "capacity", s.capacity, "free_blocks",
                         s.free_blocks, "used_blocks", s.used_blocks, "peak_used", s.peak_used,
                         "alloc_failures", (unsigned long long)s.alloc_failures);
}

static PyObject *Pool_validate(PoolObject *self, PyObject *unused) {
    pkv_status st = pkv_pool_validate(self->pool);
    if (st != PKV_OK)
        return pkvpy_raise(st, "BlockPool.validate", "free list and refcounts disagree");
    Py_RETURN_NONE;
}

static PyObject *Pool_capacity(PoolObject *self, void *c) {
    return PyLong_FromUnsignedLong(pkv_pool_capacity(self->pool));
}
static PyObject *Pool_free_count(PoolObject *self, void *c) {
    return PyLong_FromUnsignedLong(pkv_pool_free_count(self->pool));
}

static Py_ssize_t Pool_len(PoolObject *self) { return (Py_ssize_t)pkv_pool_capacity(self->pool); }

static PyObject *Pool_repr(PoolObject *self) {
    return PyUnicode_FromFormat("BlockPool(capacity=%u, free=%u)", pkv_pool_capacity(self->pool),
                                pkv_pool_free_count(self->pool));
}

static PyMethodDef Pool_methods[] = {
    {"alloc", (PyCFunction)Pool_alloc, METH_O,
     "alloc(n) -> int32 array of n block ids, each with refcount 1 (all or nothing)."},
    {"retain", (PyCFunction)Pool_retain, METH_O, "retain(block): one more reference."},
    {"release", (PyCFunction)Pool_release, METH_O,
     "release(block or ids): drop one reference each; ids are all checked first."},
    {"refcount", (PyCFunction)Pool_refcount, METH_O, "refcount(block) -> int (0 = free)."},
    {"stats", (PyCFunction)Pool_stats, METH_NOARGS, "stats() -> dict of the pool counters."},
    {"validate", (PyCFunction)Pool_validate, METH_NOARGS,
     "validate(): full invariant check; raises Corrupt."},
    {NULL, NULL, 0, NULL},
};

static PyGetSetDef Pool_getset[] = {
    {"capacity", (getter)Pool_capacity, NULL, "blocks in the pool", NULL},
    {"free_count", (getter)Pool_free_count, NULL, "blocks with refcount 0", NULL},
    {NULL, NULL, NULL, NULL, NULL},
};

static PySequenceMethods Pool_as_sequence = {.sq_length = (lenfunc)Pool_len};

PyTypeObject pkvpy_Pool_Type = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "pagedkv.BlockPool",
    .tp_basicsize = sizeof(PoolObject),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "BlockPool(num_blocks): fixed-size KV blocks named by ids 0..num_blocks-1, "
              "with reference counts. Pure metadata: pair it with KVCache for memory, or "
              "use the ids to index your own tensor.",
    .tp_new = Pool_new,
    .tp_dealloc = (destructor)Pool_dealloc,
    .tp_methods = Pool_methods,
    .tp_getset = Pool_getset,
    .tp_repr = (reprfunc)Pool_repr,
    .tp_as_sequence = &Pool_as_sequence,
};

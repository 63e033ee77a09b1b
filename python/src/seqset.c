// SPDX-License-Identifier: MIT
// pagedkv.SeqSet: owns a pkv_seqset, keeps its BlockPool (and, once attached, its
// PrefixCache) alive. The per-sequence calls mirror include/pkv/seq.h one to one; the
// batch calls take numpy arrays of ids and counts, and step() is one engine step in
// one call: append_batch + block tables (padded or CSR) + the queued copy pairs.
#include "pkvpy.h"

#include <string.h>

// Batch calls from the engine-integration work: bound when the headers declare them.
#define MISSING(method, sym)                                                              \
    return pkvpy_raise(PKV_ERR_UNSUPPORTED, method,                                      \
                       "this build of libpagedkv does not declare " sym                  \
                       " (include/pkv/seq.h); rebuild against a newer core")

static int seq_arg(PyObject *arg, pkv_seq_id *id, const char *what) {
    long long v;
    int overflow;
    if (pkvpy_index(arg, what, "a sequence id is an int", &v, &overflow) < 0)
        return -1;
    if (overflow || v < INT32_MIN || v > INT32_MAX) {
        pkvpy_raise(PKV_ERR_NOT_FOUND, what, "sequence id out of the int32 range");
        return -1;
    }
    *id = (pkv_seq_id)v;
    return 0;
}

static PyObject *SeqSet_new(PyTypeObject *type, PyObject *args, PyObject *kw) {
    static char *kwlist[] = {"pool", "block_size", NULL};
    PyObject *pool, *bs_obj;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "O!O:SeqSet", kwlist, &pkvpy_Pool_Type, &pool,
                                     &bs_obj))
        return NULL;
    uint32_t bs;
    if (pkvpy_u32(bs_obj, &bs, "SeqSet(block_size)") < 0)
        return NULL;
    SeqSetObject *self = (SeqSetObject *)type->tp_alloc(type, 0);
    if (!self)
        return NULL;
    pkv_status st = pkv_seqset_create(((PoolObject *)pool)->pool, bs, &self->set);
    if (st != PKV_OK) {
        Py_DECREF(self);
        return pkvpy_raise(st, "SeqSet", "block_size %u not in 1..65536", bs);
    }
    Py_INCREF(pool);
    self->pool = pool;
    return (PyObject *)self;
}

static void SeqSet_dealloc(SeqSetObject *self) {
    pkv_seqset_destroy(self->set); // before the cache and pool it borrows
    Py_XDECREF(self->prefix);
    Py_XDECREF(self->pool);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static pkv_pool *pool_of(SeqSetObject *self) { return ((PoolObject *)self->pool)->pool; }

static PyObject *SeqSet_create(SeqSetObject *self, PyObject *unused) {
    pkv_seq_id id;
    pkv_status st = pkv_seq_create(self->set, &id);
    if (st != PKV_OK)
        return pkvpy_raise(st, "SeqSet.create", NULL);
    return PyLong_FromLong(id);
}

static PyObject *SeqSet_free(SeqSetObject *self, PyObject *arg) {
    pkv_seq_id id;
    if (seq_arg(arg, &id, "SeqSet.free") < 0)
        return NULL;
    pkv_status st = pkv_seq_free(self->set, id);
    if (st != PKV_OK)
        return pkvpy_raise(st, "SeqSet.free", "sequence %d is not live", id);
    Py_RETURN_NONE;
}

// Detail for a failed growth: how many blocks it needed against how many are free.
static PyObject *raise_growth(pkv_status st, const char *what, SeqSetObject *self,
                              pkv_seq_id id, uint32_t n) {
    if (st == PKV_ERR_OUT_OF_BLOCKS) {
        uint32_t need = 0;
        pkv_seq_blocks_needed(self->set, id, n, &need);
        return pkvpy_raise(st, what, "sequence %d + %u tokens needs %u blocks, pool has %u free",
                           id, n, need, pkv_pool_free_count(pool_of(self)));
    }
    return pkvpy_raise(st, what, "sequence %d, %u tokens", id, n);
}

static PyObject *SeqSet_append(SeqSetObject *self, PyObject *args) {
    PyObject *ido, *no;
    if (!PyArg_ParseTuple(args, "OO:append", &ido, &no))
        return NULL;
    pkv_seq_id id;
    uint32_t n;
    if (seq_arg(ido, &id, "SeqSet.append") < 0 || pkvpy_u32(no, &n, "SeqSet.append(n)") < 0)
        return NULL;
    // The library refuses before the output is sized from n (issue 20): a
    // stale id or a growth the pool cannot hold raises, not a 32 GiB numpy
    // allocation. Growth that fits is bounded by the pool's slots.
    uint32_t need = 0;
    pkv_status ck = pkv_seq_blocks_needed(self->set, id, n, &need);
    const uint32_t avail = pkv_pool_free_count(pool_of(self));
    if (ck == PKV_OK && need > avail) // (the watermark is the library's to check)
        ck = PKV_ERR_OUT_OF_BLOCKS;
    if (ck != PKV_OK)
        return raise_growth(ck, "SeqSet.append", self, id, n);
    PyArrayObject *slots = pkvpy_new_vector(n, NPY_INT64);
    if (!slots)
        return NULL;
    pkv_status st = pkv_seq_append(self->set, id, n, (int64_t *)PyArray_DATA(slots));
    if (st != PKV_OK) {
        Py_DECREF(slots);
        return raise_growth(st, "SeqSet.append", self, id, n);
    }
    return (PyObject *)slots;
}

static PyObject *SeqSet_blocks_needed(SeqSetObject *self, PyObject *args) {
    PyObject *ido, *no;
    if (!PyArg_ParseTuple(args, "OO:blocks_needed", &ido, &no))
        return NULL;
    pkv_seq_id id;
    uint32_t n, blocks;
    if (seq_arg(ido, &id, "SeqSet.blocks_needed") < 0 ||
        pkvpy_u32(no, &n, "SeqSet.blocks_needed(n)") < 0)
        return NULL;
    pkv_status st = pkv_seq_blocks_needed(self->set, id, n, &blocks);
    if (st != PKV_OK)
        return pkvpy_raise(st, "SeqSet.blocks_needed", "sequence %d", id);
    return PyLong_FromUnsignedLong(blocks);
}

static PyObject *SeqSet_fork(SeqSetObject *self, PyObject *arg) {
    pkv_seq_id parent, child;
    if (seq_arg(arg, &parent, "SeqSet.fork") < 0)
        return NULL;
    pkv_status st = pkv_seq_fork(self->set, parent, &child);
    if (st != PKV_OK)
        return pkvpy_raise(st, "SeqSet.fork", "parent %d", parent);
    return PyLong_FromLong(child);
}

static PyObject *SeqSet_length(SeqSetObject *self, PyObject *arg) {
    pkv_seq_id id;
    uint32_t len;
    if (seq_arg(arg, &id, "SeqSet.length") < 0)
        return NULL;
    pkv_status st = pkv_seq_length(self->set, id, &len);
    if (st != PKV_OK)
        return pkvpy_raise(st, "SeqSet.length", "sequence %d is not live", id);
    return PyLong_FromUnsignedLong(len);
}

static PyObject *SeqSet_block_table(SeqSetObject *self, PyObject *arg) {
    pkv_seq_id id;
    const pkv_block_id *table;
    uint32_t n;
    if (seq_arg(arg, &id, "SeqSet.block_table") < 0)
        return NULL;
    pkv_status st = pkv_seq_block_table(self->set, id, &table, &n);
    if (st != PKV_OK)
        return pkvpy_raise(st, "SeqSet.block_table", "sequence %d is not live", id);
    PyArrayObject *a = pkvpy_new_vector(n, NPY_INT32);
    if (a && n)
        memcpy(PyArray_DATA(a), table, n * sizeof *table);
    return (PyObject *)a;
}

static PyObject *SeqSet_copies(SeqSetObject *self, PyObject *unused) {
    const pkv_block_copy *c;
    uint32_t n;
    pkv_status st = pkv_seqset_copies(self->set, &c, &n);
    if (st != PKV_OK)
        return pkvpy_raise(st, "SeqSet.copies", NULL);
    return pkvpy_copies_array(c, n);
}

static PyObject *SeqSet_copies_done(SeqSetObject *self, PyObject *unused) {
    pkv_status st = pkv_seqset_copies_done(self->set);
    if (st != PKV_OK)
        return pkvpy_raise(st, "SeqSet.copies_done", NULL);
    Py_RETURN_NONE;
}

// The queue into a new (n, 2) int32 array, emptied (pins dropped).
static PyObject *take_copies(SeqSetObject *self) {
    uint32_t n = pkv_seqset_pending_copies(self->set), got = 0;
    PyArrayObject *a = pkvpy_new_matrix(n, 2, NPY_INT32);
    if (!a)
        return NULL;
    pkv_status st = pkv_seqset_take_copies(self->set, (pkv_block_copy *)PyArray_DATA(a), n, &got);
    if (st != PKV_OK) {
        Py_DECREF(a);
        return pkvpy_raise(st, "SeqSet.take_copies", NULL);
    }
    return (PyObject *)a;
}

static PyObject *SeqSet_take_copies(SeqSetObject *self, PyObject *unused) {
    return take_copies(self);
}

static PyObject *SeqSet_move(SeqSetObject *self, PyObject *args) {
    PyObject *ido, *to;
    if (!PyArg_ParseTuple(args, "OO!:move", &ido, &pkvpy_SeqSet_Type, &to))
        return NULL;
    pkv_seq_id id, new_id;
    uint32_t len, n = 0;
    if (seq_arg(ido, &id, "SeqSet.move") < 0)
        return NULL;
    pkv_status st = pkv_seq_length(self->set, id, &len);
    if (st != PKV_OK)
        return pkvpy_raise(st, "SeqSet.move", "sequence %d is not live", id);
    uint32_t bs = pkv_seqset_block_size(self->set);
    uint32_t cap = len / bs + (len % bs != 0);
    pkv_block_copy *pairs = PyMem_Malloc((cap ? cap : 1) * sizeof *pairs);
    if (!pairs)
        return PyErr_NoMemory();
    st = pkv_seq_move(self->set, id, ((SeqSetObject *)to)->set, &new_id, pairs, cap, &n);
    if (st != PKV_OK) {
        PyMem_Free(pairs);
        return pkvpy_raise(st, "SeqSet.move", "sequence %d (%u blocks) into a set whose pool "
                           "has %u free; same block size, different pools required", id, cap,
                           pkv_pool_free_count(pool_of((SeqSetObject *)to)));
    }
    PyObject *arr = pkvpy_copies_array(pairs, n);
    PyMem_Free(pairs);
    if (!arr)
        return NULL;
    return Py_BuildValue("(iN)", new_id, arr);
}

// Lengths of ids[0..n-1] into lens (int32) and the total / largest block count.
static int lengths(SeqSetObject *self, const pkv_seq_id *ids, npy_intp n, int32_t *lens,
                   uint64_t *total_blocks, uint32_t *max_blocks, const char *what) {
    uint32_t bs = pkv_seqset_block_size(self->set), mx = 0;
    uint64_t total = 0;
    for (npy_intp i = 0; i < n; i++) {
        uint32_t len;
        pkv_status st = pkv_seq_length(self->set, ids[i], &len);
        if (st != PKV_OK) {
            pkvpy_raise(st, what, "seqs[%lld] = %d is not live", (long long)i, ids[i]);
            return -1;
        }
        uint32_t b = len / bs + (len % bs != 0);
        if (lens)
            lens[i] = (int32_t)len;
        total += b;
        if (b > mx)
            mx = b;
    }
    *total_blocks = total;
    *max_blocks = mx;
    return 0;
}

static PyObject *export_padded(SeqSetObject *self, PyArrayObject *ids, PyObject *max_obj,
                               int32_t pad, PyObject **lens_out, const char *what) {
    npy_intp n = PyArray_DIM(ids, 0);
    const pkv_seq_id *seqs = PyArray_DATA(ids);
    uint32_t max_blocks;
    uint64_t total;
    PyArrayObject *lens = pkvpy_new_vector(n, NPY_INT32);
    if (!lens)
        return NULL;
    if (max_obj && max_obj != Py_None) {
        if (pkvpy_u32(max_obj, &max_blocks, "max_blocks") < 0) {
            Py_DECREF(lens);
            return NULL;
        }
        // The table is sized from it: no sequence holds more blocks than the
        // pool has, so wider is a caller's mistake, not a 16 GiB array.
        const uint32_t cap = pkv_pool_capacity(pool_of(self));
        if (max_blocks > cap) {
            Py_DECREF(lens);
            return pkvpy_raise(PKV_ERR_INVALID_ARG, what,
                               "max_blocks %u is wider than the pool (%u blocks)", max_blocks, cap);
        }
    } else if (lengths(self, seqs, n, NULL, &total, &max_blocks, what) < 0) {
        Py_DECREF(lens);
        return NULL;
    }
    if (max_blocks == 0)
        max_blocks = 1; // a (n, 0) table is legal numpy but not a legal C call
    PyArrayObject *table = pkvpy_new_matrix(n, max_blocks, NPY_INT32);
    if (!table) {
        Py_DECREF(lens);
        return NULL;
    }
    pkv_status st = pkv_seqset_export_padded(self->set, seqs, (uint32_t)n, max_blocks, pad,
                                             PyArray_DATA(table), PyArray_DATA(lens));
    if (st != PKV_OK) {
        Py_DECREF(lens);
        Py_DECREF(table);
        return pkvpy_raise(st, what, "%lld sequences, max_blocks %u (a stale id, or a table "
                           "wider than max_blocks)", (long long)n, max_blocks);
    }
    *lens_out = (PyObject *)lens;
    return (PyObject *)table;
}

// (indptr, indices, last_page_len); lens_out gets the int32 lengths.
static PyObject *export_csr(SeqSetObject *self, PyArrayObject *ids, PyObject **lens_out,
                            const char *what) {
    npy_intp n = PyArray_DIM(ids, 0);
    const pkv_seq_id *seqs = PyArray_DATA(ids);
    uint64_t total;
    uint32_t mx;
    PyArrayObject *lens = pkvpy_new_vector(n, NPY_INT32);
    if (!lens)
        return NULL;
    if (lengths(self, seqs, n, PyArray_DATA(lens), &total, &mx, what) < 0) {
        Py_DECREF(lens);
        return NULL;
    }
    if (total > INT32_MAX) {
        Py_DECREF(lens);
        return pkvpy_raise(PKV_ERR_INVALID_ARG, what, "%llu blocks overflow an int32 indptr",
                           (unsigned long long)total);
    }
    PyArrayObject *indptr = pkvpy_new_vector(n + 1, NPY_INT32);
    PyArrayObject *indices = pkvpy_new_vector((npy_intp)total, NPY_INT32);
    PyArrayObject *last = pkvpy_new_vector(n, NPY_INT32);
    if (!indptr || !indices || !last) {
        Py_XDECREF(indptr);
        Py_XDECREF(indices);
        Py_XDECREF(last);
        Py_DECREF(lens);
        return NULL;
    }
    pkv_status st = pkv_seqset_export_csr(self->set, seqs, (uint32_t)n, PyArray_DATA(indptr),
                                          PyArray_DATA(indices), (uint32_t)total,
                                          PyArray_DATA(last));
    if (st != PKV_OK) {
        Py_DECREF(indptr);
        Py_DECREF(indices);
        Py_DECREF(last);
        Py_DECREF(lens);
        return pkvpy_raise(st, what, "%lld sequences", (long long)n);
    }
    *lens_out = (PyObject *)lens;
    return Py_BuildValue("(NNN)", indptr, indices, last);
}

static PyArrayObject *seq_ids(PyObject *obj, const char *what) {
    PyArrayObject *a = pkvpy_int_vector(obj, NPY_INT32, what);
    if (a && PyArray_DIM(a, 0) > (npy_intp)UINT32_MAX) {
        Py_DECREF(a);
        pkvpy_raise(PKV_ERR_INVALID_ARG, what, "more than 2**32 - 1 sequences");
        return NULL;
    }
    return a;
}

static PyObject *SeqSet_export_padded(SeqSetObject *self, PyObject *args, PyObject *kw) {
    static char *kwlist[] = {"seqs", "max_blocks", "pad", NULL};
    PyObject *seqs_obj, *max_obj = Py_None;
    int pad = -1;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "O|Oi:export_padded", kwlist, &seqs_obj, &max_obj,
                                     &pad))
        return NULL;
    PyArrayObject *ids = seq_ids(seqs_obj, "SeqSet.export_padded(seqs)");
    if (!ids)
        return NULL;
    PyObject *lens = NULL;
    PyObject *table = export_padded(self, ids, max_obj, pad, &lens, "SeqSet.export_padded");
    Py_DECREF(ids);
    if (!table)
        return NULL;
    return Py_BuildValue("(NN)", table, lens);
}

static PyObject *SeqSet_export_csr(SeqSetObject *self, PyObject *arg) {
    PyArrayObject *ids = seq_ids(arg, "SeqSet.export_csr(seqs)");
    if (!ids)
        return NULL;
    PyObject *lens = NULL;
    PyObject *csr = export_csr(self, ids, &lens, "SeqSet.export_csr");
    Py_DECREF(ids);
    Py_XDECREF(lens);
    return csr;
}

static PyObject *SeqSet_validate(SeqSetObject *self, PyObject *args, PyObject *kw) {
    static char *kwlist[] = {"exclusive", NULL};
    int exclusive = 0;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "|p:validate", kwlist, &exclusive))
        return NULL;
    pkv_status st = pkv_seqset_validate(self->set, exclusive);
    if (st != PKV_OK)
        return pkvpy_raise(st, "SeqSet.validate", exclusive ? "exclusive check" : NULL);
    Py_RETURN_NONE;
}

// ---- batch calls (engine integration) ----

// seqs and counts as int32 / uint32 vectors of one length.
static inline int batch_args(PyObject *so, PyObject *co, PyArrayObject **seqs, PyArrayObject **counts,
                      const char *what) {
    *seqs = seq_ids(so, what);
    if (!*seqs)
        return -1;
    *counts = pkvpy_int_vector(co, NPY_UINT32, what);
    if (!*counts) {
        Py_CLEAR(*seqs);
        return -1;
    }
    if (PyArray_DIM(*seqs, 0) != PyArray_DIM(*counts, 0)) {
        pkvpy_raise(PKV_ERR_INVALID_ARG, what, "%lld seqs but %lld counts",
                    (long long)PyArray_DIM(*seqs, 0), (long long)PyArray_DIM(*counts, 0));
        Py_CLEAR(*seqs);
        Py_CLEAR(*counts);
        return -1;
    }
    return 0;
}

#if defined(PKVPY_HAVE_PKV_SEQSET_APPEND_BATCH) && defined(PKVPY_HAVE_PKV_SEQSET_BLOCKS_NEEDED_BATCH)
// Out of blocks: say how many the batch needed; other errors name the batch.
static PyObject *raise_batch(pkv_status st, const char *what, SeqSetObject *self,
                             PyArrayObject *seqs, PyArrayObject *counts) {
    uint32_t n = (uint32_t)PyArray_DIM(seqs, 0), need = 0;
    if (st == PKV_ERR_OUT_OF_BLOCKS &&
        pkv_seqset_blocks_needed_batch(self->set, PyArray_DATA(seqs), PyArray_DATA(counts), n,
                                       &need) == PKV_OK)
        return pkvpy_raise(st, what, "%u sequences need %u blocks, pool has %u free (watermark "
                           "included); nothing changed", n, need,
                           pkv_pool_free_count(pool_of(self)));
    return pkvpy_raise(st, what, "%u sequences (a stale id, a duplicate id, or a count too "
                       "large); nothing changed", n);
}

// The slots a batch appends, after the library said it can take them (issue
// 20: the output is sized from the counts, so a count of 2**32 - 1 must raise
// OutOfBlocks / InvalidArgument, not allocate 32 GiB first). -1 after raising.
static npy_intp count_sum(SeqSetObject *self, PyArrayObject *seqs, PyArrayObject *counts,
                          const char *what) {
    uint32_t need = 0;
    pkv_status st = pkv_seqset_blocks_needed_batch(self->set, PyArray_DATA(seqs),
                                                   PyArray_DATA(counts),
                                                   (uint32_t)PyArray_DIM(seqs, 0), &need);
    const uint32_t avail = pkv_pool_free_count(pool_of(self));
    if (st == PKV_OK && need > avail) // (the watermark is the library's to check)
        st = PKV_ERR_OUT_OF_BLOCKS;
    if (st != PKV_OK) {
        raise_batch(st, what, self, seqs, counts);
        return -1;
    }
    const uint32_t *c = PyArray_DATA(counts);
    uint64_t total = 0;
    for (npy_intp i = 0; i < PyArray_DIM(counts, 0); i++)
        total += c[i];
    return (npy_intp)total;
}
#endif

static PyObject *SeqSet_blocks_needed_batch(SeqSetObject *self, PyObject *args) {
    PyObject *so, *co;
    if (!PyArg_ParseTuple(args, "OO:blocks_needed_batch", &so, &co))
        return NULL;
#ifdef PKVPY_HAVE_PKV_SEQSET_BLOCKS_NEEDED_BATCH
    PyArrayObject *seqs, *counts;
    if (batch_args(so, co, &seqs, &counts, "SeqSet.blocks_needed_batch") < 0)
        return NULL;
    uint32_t blocks = 0;
    pkv_status st = pkv_seqset_blocks_needed_batch(self->set, PyArray_DATA(seqs),
                                                   PyArray_DATA(counts),
                                                   (uint32_t)PyArray_DIM(seqs, 0), &blocks);
    Py_DECREF(seqs);
    Py_DECREF(counts);
    if (st != PKV_OK)
        return pkvpy_raise(st, "SeqSet.blocks_needed_batch", "a stale or duplicate id");
    return PyLong_FromUnsignedLong(blocks);
#else
    MISSING("SeqSet.blocks_needed_batch", "pkv_seqset_blocks_needed_batch");
#endif
}

static PyObject *SeqSet_append_batch(SeqSetObject *self, PyObject *args) {
    PyObject *so, *co;
    if (!PyArg_ParseTuple(args, "OO:append_batch", &so, &co))
        return NULL;
#if defined(PKVPY_HAVE_PKV_SEQSET_APPEND_BATCH) && defined(PKVPY_HAVE_PKV_SEQSET_BLOCKS_NEEDED_BATCH)
    PyArrayObject *seqs, *counts;
    if (batch_args(so, co, &seqs, &counts, "SeqSet.append_batch") < 0)
        return NULL;
    const npy_intp total = count_sum(self, seqs, counts, "SeqSet.append_batch");
    PyArrayObject *slots = total < 0 ? NULL : pkvpy_new_vector(total, NPY_INT64);
    PyObject *result = (PyObject *)slots;
    if (slots) {
        pkv_status st = pkv_seqset_append_batch(self->set, PyArray_DATA(seqs),
                                                PyArray_DATA(counts),
                                                (uint32_t)PyArray_DIM(seqs, 0),
                                                PyArray_DATA(slots));
        if (st != PKV_OK) {
            Py_CLEAR(result);
            raise_batch(st, "SeqSet.append_batch", self, seqs, counts);
        }
    }
    Py_DECREF(seqs);
    Py_DECREF(counts);
    return result;
#else
    MISSING("SeqSet.append_batch", "pkv_seqset_append_batch");
#endif
}

static PyObject *SeqSet_free_batch(SeqSetObject *self, PyObject *arg) {
#ifdef PKVPY_HAVE_PKV_SEQSET_FREE_BATCH
    PyArrayObject *seqs = seq_ids(arg, "SeqSet.free_batch(seqs)");
    if (!seqs)
        return NULL;
    pkv_status st = pkv_seqset_free_batch(self->set, PyArray_DATA(seqs),
                                          (uint32_t)PyArray_DIM(seqs, 0));
    npy_intp n = PyArray_DIM(seqs, 0);
    Py_DECREF(seqs);
    if (st != PKV_OK)
        return pkvpy_raise(st, "SeqSet.free_batch", "%lld ids: a stale, unknown or duplicate id; "
                           "nothing freed", (long long)n);
    Py_RETURN_NONE;
#else
    MISSING("SeqSet.free_batch", "pkv_seqset_free_batch");
#endif
}

static PyObject *SeqSet_set_watermark(SeqSetObject *self, PyObject *arg) {
#ifdef PKVPY_HAVE_PKV_SEQSET_SET_WATERMARK
    uint32_t blocks;
    if (pkvpy_u32(arg, &blocks, "SeqSet.set_watermark(blocks)") < 0)
        return NULL;
    pkv_status st = pkv_seqset_set_watermark(self->set, blocks);
    if (st != PKV_OK)
        return pkvpy_raise(st, "SeqSet.set_watermark", "%u blocks", blocks);
    Py_RETURN_NONE;
#else
    MISSING("SeqSet.set_watermark", "pkv_seqset_set_watermark");
#endif
}

static PyObject *SeqSet_fork_at(SeqSetObject *self, PyObject *args) {
    PyObject *po, *lo;
    if (!PyArg_ParseTuple(args, "OO:fork_at", &po, &lo))
        return NULL;
#ifdef PKVPY_HAVE_PKV_SEQ_FORK_AT
    pkv_seq_id parent, child;
    uint32_t len;
    if (seq_arg(po, &parent, "SeqSet.fork_at") < 0 || pkvpy_u32(lo, &len, "SeqSet.fork_at(len)") < 0)
        return NULL;
    pkv_status st = pkv_seq_fork_at(self->set, parent, len, &child);
    if (st != PKV_OK)
        return pkvpy_raise(st, "SeqSet.fork_at", "parent %d, len %u", parent, len);
    return PyLong_FromLong(child);
#else
    MISSING("SeqSet.fork_at", "pkv_seq_fork_at");
#endif
}

static PyObject *SeqSet_truncate(SeqSetObject *self, PyObject *args) {
    PyObject *io, *lo;
    if (!PyArg_ParseTuple(args, "OO:truncate", &io, &lo))
        return NULL;
#ifdef PKVPY_HAVE_PKV_SEQ_TRUNCATE
    pkv_seq_id id;
    uint32_t len;
    if (seq_arg(io, &id, "SeqSet.truncate") < 0 || pkvpy_u32(lo, &len, "SeqSet.truncate(len)") < 0)
        return NULL;
    pkv_status st = pkv_seq_truncate(self->set, id, len);
    if (st != PKV_OK)
        return pkvpy_raise(st, "SeqSet.truncate", "sequence %d to %u tokens", id, len);
    Py_RETURN_NONE;
#else
    MISSING("SeqSet.truncate", "pkv_seq_truncate");
#endif
}

static PyObject *SeqSet_move_group(SeqSetObject *self, PyObject *args) {
    PyObject *io, *to;
    if (!PyArg_ParseTuple(args, "OO!:move_group", &io, &pkvpy_SeqSet_Type, &to))
        return NULL;
#ifdef PKVPY_HAVE_PKV_SEQ_MOVE_GROUP
    PyArrayObject *ids = seq_ids(io, "SeqSet.move_group(ids)");
    if (!ids)
        return NULL;
    uint32_t n = (uint32_t)PyArray_DIM(ids, 0), cap = 0, npairs = 0;
    PyArrayObject *new_ids = pkvpy_new_vector(n, NPY_INT32);
    if (!new_ids) {
        Py_DECREF(ids);
        return NULL;
    }
    pkv_seqset *dst = ((SeqSetObject *)to)->set;
    // First call with no room asks for the number of pairs; then the real move.
    pkv_status st = pkv_seq_move_group(self->set, PyArray_DATA(ids), n, dst,
                                       PyArray_DATA(new_ids), NULL, 0, &npairs);
    PyObject *pairs = NULL;
    if (st == PKV_ERR_BUFFER_TOO_SMALL || st == PKV_OK) {
        cap = npairs;
        pkv_block_copy *buf = PyMem_Malloc((cap ? cap : 1) * sizeof *buf);
        if (!buf) {
            Py_DECREF(ids);
            Py_DECREF(new_ids);
            return PyErr_NoMemory();
        }
        if (st == PKV_ERR_BUFFER_TOO_SMALL)
            st = pkv_seq_move_group(self->set, PyArray_DATA(ids), n, dst, PyArray_DATA(new_ids),
                                    buf, cap, &npairs);
        if (st == PKV_OK)
            pairs = pkvpy_copies_array(buf, npairs);
        PyMem_Free(buf);
    }
    Py_DECREF(ids);
    if (st != PKV_OK) {
        Py_DECREF(new_ids);
        return pkvpy_raise(st, "SeqSet.move_group", "%u sequences into a set whose pool has %u "
                           "free; nothing moved", n, pkv_pool_free_count(pool_of((SeqSetObject *)to)));
    }
    if (!pairs) {
        Py_DECREF(new_ids);
        return NULL;
    }
    return Py_BuildValue("(NN)", new_ids, pairs);
#else
    MISSING("SeqSet.move_group", "pkv_seq_move_group");
#endif
}

// ---- step ----

static PyTypeObject StepResult_Type;
static PyStructSequence_Field step_fields[] = {
    {"slot_mapping", "int64 [sum(counts)]: the slot of every new token, seqs[0]'s first"},
    {"block_tables", "int32 [num_seqs, max_blocks] padded with `pad` (tables='padded'), else None"},
    {"context_lens", "int32 [num_seqs]: lengths after the append"},
    {"indptr", "int32 [num_seqs + 1] (tables='csr'), else None"},
    {"indices", "int32 [indptr[-1]] block ids (tables='csr'), else None"},
    {"last_page_len", "int32 [num_seqs] tokens in each last block (tables='csr'), else None"},
    {"copies", "int32 [n, 2] copy-on-write (src, dst) pairs to run before writing K/V"},
    {NULL, NULL},
};
static PyStructSequence_Desc step_desc = {
    "pagedkv.StepResult", "What one engine step needs: slot mapping, block tables, copies.",
    step_fields, 7};

int pkvpy_seqset_init_types(PyObject *module) {
    if (PyStructSequence_InitType2(&StepResult_Type, &step_desc) < 0)
        return -1;
    Py_INCREF(&StepResult_Type);
    if (PyModule_AddObject(module, "StepResult", (PyObject *)&StepResult_Type) < 0) {
        Py_DECREF(&StepResult_Type);
        return -1;
    }
    return 0;
}

static PyObject *SeqSet_step(SeqSetObject *self, PyObject *args, PyObject *kw) {
    static char *kwlist[] = {"seqs", "counts", "tables", "max_blocks", "pad", NULL};
    PyObject *so, *co, *max_obj = Py_None;
    const char *tables = "padded";
    int pad = -1;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "OO|$sOi:step", kwlist, &so, &co, &tables, &max_obj,
                                     &pad))
        return NULL;
    int csr = strcmp(tables, "csr") == 0;
    if (!csr && strcmp(tables, "padded") != 0)
        return pkvpy_raise(PKV_ERR_INVALID_ARG, "SeqSet.step",
                           "tables must be 'padded' or 'csr', not '%s'", tables);
#if defined(PKVPY_HAVE_PKV_SEQSET_APPEND_BATCH) && defined(PKVPY_HAVE_PKV_SEQSET_BLOCKS_NEEDED_BATCH)
    PyArrayObject *seqs, *counts;
    if (batch_args(so, co, &seqs, &counts, "SeqSet.step") < 0)
        return NULL;
    PyObject *res = NULL, *lens = NULL, *table = NULL, *copies = NULL;
    const npy_intp total = count_sum(self, seqs, counts, "SeqSet.step");
    PyArrayObject *slots = total < 0 ? NULL : pkvpy_new_vector(total, NPY_INT64);
    if (!slots)
        goto done;
    // 1. Grow every sequence (all or nothing).
    pkv_status st = pkv_seqset_append_batch(self->set, PyArray_DATA(seqs), PyArray_DATA(counts),
                                            (uint32_t)PyArray_DIM(seqs, 0), PyArray_DATA(slots));
    if (st != PKV_OK) {
        raise_batch(st, "SeqSet.step", self, seqs, counts);
        goto done;
    }
    // 2. Block tables for the attention kernel. 3. The copies to run before it.
    table = csr ? export_csr(self, seqs, &lens, "SeqSet.step")
                : export_padded(self, seqs, max_obj, pad, &lens, "SeqSet.step");
    if (!table)
        goto done;
    copies = take_copies(self);
    if (!copies)
        goto done;
    res = PyStructSequence_New(&StepResult_Type);
    if (!res)
        goto done;
    PyStructSequence_SET_ITEM(res, 0, (PyObject *)slots);
    slots = NULL;
    PyStructSequence_SET_ITEM(res, 2, lens);
    lens = NULL;
    if (csr) {
        for (int i = 0; i < 3; i++) {
            PyObject *item = PyTuple_GET_ITEM(table, i);
            Py_INCREF(item);
            PyStructSequence_SET_ITEM(res, 3 + i, item);
        }
        Py_INCREF(Py_None);
        PyStructSequence_SET_ITEM(res, 1, Py_None);
        Py_CLEAR(table);
    } else {
        PyStructSequence_SET_ITEM(res, 1, table);
        table = NULL;
        for (int i = 3; i < 6; i++) {
            Py_INCREF(Py_None);
            PyStructSequence_SET_ITEM(res, i, Py_None);
        }
    }
    PyStructSequence_SET_ITEM(res, 6, copies);
    copies = NULL;
done:
    Py_XDECREF(slots);
    Py_XDECREF(lens);
    Py_XDECREF(table);
    Py_XDECREF(copies);
    Py_DECREF(seqs);
    Py_DECREF(counts);
    return res;
#else
    (void)max_obj;
    (void)pad;
    (void)so;
    (void)co;
    MISSING("SeqSet.step", "pkv_seqset_append_batch");
#endif
}

// ---- properties ----

static PyObject *SeqSet_get_block_size(SeqSetObject *self, void *c) {
    return PyLong_FromUnsignedLong(pkv_seqset_block_size(self->set));
}
static PyObject *SeqSet_get_pool(SeqSetObject *self, void *c) {
    Py_INCREF(self->pool);
    return self->pool;
}
static PyObject *SeqSet_get_prefix(SeqSetObject *self, void *c) {
    PyObject *p = self->prefix ? self->prefix : Py_None;
    Py_INCREF(p);
    return p;
}
static PyObject *SeqSet_get_watermark(SeqSetObject *self, void *c) {
#ifdef PKVPY_HAVE_PKV_SEQSET_WATERMARK
    return PyLong_FromUnsignedLong(pkv_seqset_watermark(self->set));
#else
    MISSING("SeqSet.watermark", "pkv_seqset_watermark");
#endif
}
static PyObject *SeqSet_get_live(SeqSetObject *self, void *c) {
    return PyLong_FromUnsignedLong(pkv_seqset_live_count(self->set));
}
static PyObject *SeqSet_get_pending(SeqSetObject *self, void *c) {
    return PyLong_FromUnsignedLong(pkv_seqset_pending_copies(self->set));
}

static PyMethodDef SeqSet_methods[] = {
    {"create", (PyCFunction)SeqSet_create, METH_NOARGS, "create() -> id of a new empty sequence."},
    {"free", (PyCFunction)SeqSet_free, METH_O, "free(id): release its blocks, retire the id."},
    {"append", (PyCFunction)SeqSet_append, METH_VARARGS,
     "append(id, n) -> int64 [n] slot mapping of the new tokens (all or nothing)."},
    {"blocks_needed", (PyCFunction)SeqSet_blocks_needed, METH_VARARGS,
     "blocks_needed(id, n) -> blocks append(id, n) would take, copy-on-write included."},
    {"fork", (PyCFunction)SeqSet_fork, METH_O, "fork(parent) -> child sharing every block."},
    {"length", (PyCFunction)SeqSet_length, METH_O, "length(id) -> tokens."},
    {"block_table", (PyCFunction)SeqSet_block_table, METH_O,
     "block_table(id) -> int32 [ceil(len / block_size)] (a copy)."},
    {"copies", (PyCFunction)SeqSet_copies, METH_NOARGS,
     "copies() -> int32 [n, 2] queued (src, dst) pairs, left queued (see copies_done)."},
    {"copies_done", (PyCFunction)SeqSet_copies_done, METH_NOARGS,
     "copies_done(): the queued copies ran; drop the queue and its pins."},
    {"take_copies", (PyCFunction)SeqSet_take_copies, METH_NOARGS,
     "take_copies() -> int32 [n, 2], emptying the queue: run them before the next allocation."},
    {"move", (PyCFunction)SeqSet_move, METH_VARARGS,
     "move(id, to) -> (new_id, int32 [n, 2] (src, dst) pairs): swap to another pool's set."},
    {"export_padded", (PyCFunction)(void (*)(void))SeqSet_export_padded,
     METH_VARARGS | METH_KEYWORDS,
     "export_padded(seqs, max_blocks=None, pad=-1) -> (int32 [n, max_blocks], int32 [n] lens)."},
    {"export_csr", (PyCFunction)SeqSet_export_csr, METH_O,
     "export_csr(seqs) -> (indptr int32 [n+1], indices int32 [nnz], last_page_len int32 [n])."},
    {"validate", (PyCFunction)(void (*)(void))SeqSet_validate, METH_VARARGS | METH_KEYWORDS,
     "validate(exclusive=False): full check against the pool; raises Corrupt."},
    {"blocks_needed_batch", (PyCFunction)SeqSet_blocks_needed_batch, METH_VARARGS,
     "blocks_needed_batch(seqs, counts) -> blocks append_batch would take from the pool."},
    {"append_batch", (PyCFunction)SeqSet_append_batch, METH_VARARGS,
     "append_batch(seqs, counts) -> int64 [sum(counts)] slots; all or nothing."},
    {"free_batch", (PyCFunction)SeqSet_free_batch, METH_O,
     "free_batch(seqs): free them all, or none if one id is stale/unknown/duplicated."},
    {"set_watermark", (PyCFunction)SeqSet_set_watermark, METH_O,
     "set_watermark(blocks): refuse growth that leaves fewer free blocks (0: off)."},
    {"fork_at", (PyCFunction)SeqSet_fork_at, METH_VARARGS,
     "fork_at(parent, len) -> child sharing the first len tokens."},
    {"truncate", (PyCFunction)SeqSet_truncate, METH_VARARGS,
     "truncate(id, len): drop tokens at positions >= len (speculative rollback)."},
    {"move_group", (PyCFunction)SeqSet_move_group, METH_VARARGS,
     "move_group(ids, to) -> (new_ids int32 [n], pairs int32 [m, 2]), sharing kept."},
    {"step", (PyCFunction)(void (*)(void))SeqSet_step, METH_VARARGS | METH_KEYWORDS,
     "step(seqs, counts, *, tables='padded'|'csr', max_blocks=None, pad=-1) -> StepResult.\n"
     "One engine step: append counts[i] tokens to seqs[i] (all or nothing), export the\n"
     "block tables of seqs, and take the copy-on-write pairs (run them before the next\n"
     "call that allocates, and before writing K/V)."},
    {NULL, NULL, 0, NULL},
};

static PyGetSetDef SeqSet_getset[] = {
    {"block_size", (getter)SeqSet_get_block_size, NULL, "tokens per block", NULL},
    {"pool", (getter)SeqSet_get_pool, NULL, "the BlockPool", NULL},
    {"prefix_cache", (getter)SeqSet_get_prefix, NULL, "the attached PrefixCache or None", NULL},
    {"watermark", (getter)SeqSet_get_watermark, NULL, "blocks growth must leave free (0: off)",
     NULL},
    {"live_count", (getter)SeqSet_get_live, NULL, "live sequences", NULL},
    {"pending_copies", (getter)SeqSet_get_pending, NULL, "queued copy-on-write copies", NULL},
    {NULL, NULL, NULL, NULL, NULL},
};


PyTypeObject pkvpy_SeqSet_Type = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "pagedkv.SeqSet",
    .tp_basicsize = sizeof(SeqSetObject),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "SeqSet(pool, block_size): sequences and their block tables over a BlockPool.",
    .tp_new = SeqSet_new,
    .tp_dealloc = (destructor)SeqSet_dealloc,
    .tp_methods = SeqSet_methods,
    .tp_getset = SeqSet_getset,
};

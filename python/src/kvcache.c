// SPDX-License-Identifier: MIT
// pagedkv.KVCache: a pkv_cache and the backend it owns. A host cache exports its arena
// through the buffer protocol (and numpy()) as one array of shape
//   HND: [num_layers, num_blocks, 2, kv_heads, block_size, head_dim]
//   NHD: [num_layers, num_blocks, 2, block_size, kv_heads, head_dim]
//   KV_NHD: [num_layers, 2, num_blocks, block_size, kv_heads, head_dim] (vLLM FlashAttention)
// (the axis of 2: 0 = K, 1 = V), without a copy: the strides are pkv_cache_get_geometry's.
// An external cache (buffer=) is checked against that shape, dtype and device; a list
// of per-layer tensors becomes one single-layer pkv_cache per layer, sharing the pool
// and the backend, and every copy runs on each.
// fp16 is numpy float16; bf16 has no numpy type and is exported as its raw uint16 bits.
// A CUDA cache exports no buffer (its arena is device memory); data_ptr, shape and
// strides let a framework wrap it.
#include "pkvpy.h"

#include <string.h>

static int dtype_num(pkv_dtype d) {
    return d == PKV_DTYPE_F32 ? NPY_FLOAT32 : d == PKV_DTYPE_F16 ? NPY_FLOAT16 : NPY_UINT16;
}
static const char *dtype_format(pkv_dtype d) {
    return d == PKV_DTYPE_F32 ? "f" : d == PKV_DTYPE_F16 ? "e" : "H";
}

static int parse_dtype(const char *s, pkv_dtype *d) {
    if (!strcmp(s, "fp32") || !strcmp(s, "float32")) *d = PKV_DTYPE_F32;
    else if (!strcmp(s, "fp16") || !strcmp(s, "float16")) *d = PKV_DTYPE_F16;
    else if (!strcmp(s, "bf16") || !strcmp(s, "bfloat16")) *d = PKV_DTYPE_BF16;
    else return -1;
    return 0;
}

static int parse_device(const char *s, int *cuda, int *index) {
    *cuda = 0;
    *index = 0;
    if (!strcmp(s, "cpu") || !strcmp(s, "host"))
        return 0;
    if (!strncmp(s, "cuda", 4)) {
        *cuda = 1;
        if (s[4] == 0)
            return 0;
        if (s[4] != ':' || !s[5])
            return -1;
        char *end;
        long v = strtol(s + 5, &end, 10);
        if (*end || v < 0 || v > 1024)
            return -1;
        *index = (int)v;
        return 0;
    }
    return -1;
}

static const char *layout_name(pkv_layout l) {
    return l == PKV_LAYOUT_HND ? "HND" : l == PKV_LAYOUT_NHD ? "NHD" : "KV_NHD";
}

// The shape of the caller's tensor in `p`'s layout, elements; per_layer drops the
// leading [layers]. Returns ndim.
static int layout_shape(const pkv_cache_params *p, uint32_t blocks, int per_layer,
                        int64_t out[6]) {
    int64_t L = p->num_layers, B = blocks, H = p->kv_heads, T = p->block_size, D = p->head_dim;
    int64_t hnd[6] = {L, B, 2, H, T, D}, nhd[6] = {L, B, 2, T, H, D}, kvnhd[6] = {L, 2, B, T, H, D};
    const int64_t *s = p->layout == PKV_LAYOUT_HND ? hnd : p->layout == PKV_LAYOUT_NHD ? nhd : kvnhd;
    int n = per_layer ? 5 : 6;
    memcpy(out, s + (6 - n), (size_t)n * sizeof *out);
    return n;
}

// The tensor's element type is the cache dtype (bf16 may come as its uint16 bits).
static int dtype_matches(const pkvpy_tensor *t, pkv_dtype d) {
    if (d == PKV_DTYPE_F32) return t->kind == 'f' && t->bits == 32;
    if (d == PKV_DTYPE_F16) return t->kind == 'f' && t->bits == 16;
    return (t->kind == 'b' || t->kind == 'u') && t->bits == 16;
}

// The cache's backend (host, or CUDA device `index`). 0, or -1 with an exception set.
static int make_backend(KVCacheObject *self, int cuda, int index, const char *device) {
    pkv_status st = cuda ? pkv_backend_create_cuda(index, &self->backend)
                         : pkv_backend_create_host(&self->backend);
    if (st == PKV_OK)
        return 0;
    pkvpy_raise(st, "KVCache", "device '%s'%s", device,
                st == PKV_ERR_UNSUPPORTED ? ": this build has no CUDA (pip install . "
                "-Csetup-args=-Dcuda=enabled)" : "");
    return -1;
}

// Import and check the caller's tensor(s), then make the backend and one external
// cache over each tensor (a list: one single-layer cache per layer). 0, or -1 with an
// exception set.
static int create_external(KVCacheObject *self, const pkv_cache_params *p, PyObject *pool,
                           PyObject *buffer, PyObject *stream, int cuda, int index,
                           const char *device) {
    int per_layer = PyList_Check(buffer) || PyTuple_Check(buffer);
    uint32_t n = per_layer ? (uint32_t)PySequence_Fast_GET_SIZE(buffer) : 1;
    if (per_layer && n != p->num_layers) {
        pkvpy_raise(PKV_ERR_INVALID_ARG, "KVCache", "buffer is a list of %u tensors; one per "
                    "layer is %u", n, p->num_layers);
        return -1;
    }
    self->tensors = PyMem_Calloc(n, sizeof *self->tensors);
    self->caches = per_layer ? PyMem_Calloc(n, sizeof *self->caches) : &self->cache;
    if (!self->tensors || !self->caches) {
        PyErr_NoMemory();
        return -1;
    }
    self->num_caches = n;
    pkv_cache_params lp = *p;
    if (per_layer)
        lp.num_layers = 1;
    uint32_t blocks = pkv_pool_capacity(((PoolObject *)pool)->pool);
    int64_t shape[6];
    int ndim = layout_shape(p, blocks, per_layer, shape);
    char what[48];
    for (uint32_t i = 0; i < n; i++) {
        PyObject *obj = per_layer ? PySequence_Fast_GET_ITEM(buffer, i) : buffer;
        pkvpy_tensor *t = &self->tensors[i];
        if (per_layer)
            snprintf(what, sizeof what, "KVCache: buffer[%u]", i);
        else
            snprintf(what, sizeof what, "KVCache: buffer");
        if (pkvpy_tensor_import(obj, stream, t, what) < 0)
            return -1;
        self->num_tensors = i + 1;
        if (t->cuda != cuda || (cuda && t->device_id >= 0 && t->device_id != index)) {
            char where[32] = "host";
            if (t->cuda)
                snprintf(where, sizeof where, t->device_id >= 0 ? "cuda:%d" : "CUDA",
                         t->device_id);
            pkvpy_raise(PKV_ERR_INVALID_ARG, what, "the tensor is in %s memory, the cache's "
                        "device is '%s'", where, device);
            return -1;
        }
        if (!dtype_matches(t, p->dtype)) {
            pkvpy_raise(PKV_ERR_INVALID_ARG, what, "element type %c%d does not hold dtype %s",
                        t->kind, t->bits, pkv_dtype_name(p->dtype));
            return -1;
        }
        // Too few elements stays BufferTooSmall, as the size check always said.
        int64_t have = 1, need = 1;
        for (int d = 0; d < t->ndim; d++)
            have *= t->shape[d];
        for (int d = 0; d < ndim; d++)
            need *= shape[d];
        if (have < need) {
            pkvpy_raise(PKV_ERR_BUFFER_TOO_SMALL, what, "%lld elements; layout %s needs %lld",
                        (long long)have, layout_name(p->layout), (long long)need);
            return -1;
        }
        if (pkvpy_tensor_check(t, shape, ndim, layout_name(p->layout), what) < 0)
            return -1;
    }
    if (make_backend(self, cuda, index, device) < 0)
        return -1;
    for (uint32_t i = 0; i < n; i++) {
        pkvpy_tensor *t = &self->tensors[i];
        uint64_t bytes = pkv_cache_bytes_per_block(&lp) * blocks;
        pkv_status st = pkv_cache_create_external(&lp, ((PoolObject *)pool)->pool, self->backend,
                                                  t->data, bytes, &self->caches[i]);
        if (st != PKV_OK) {
            pkvpy_raise(st, "KVCache: buffer", "%llu bytes at %p (aligned to the dtype)",
                        (unsigned long long)bytes, t->data);
            return -1;
        }
        // The producer's pending writes (its stream, CUDA array interface v3) finish
        // before any copy of ours touches the memory.
        if (t->cai_stream) {
            void *ps = PyLong_AsVoidPtr(t->cai_stream);
            if (PyErr_Occurred())
                return -1;
            st = pkv_backend_sync(self->backend, ps);
            if (st != PKV_OK) {
                pkvpy_raise(st, "KVCache: buffer", "waiting for the producer's stream");
                return -1;
            }
        }
    }
    return 0;
}

static int stream_arg(PyObject *obj, void **stream);

static PyObject *KVCache_new(PyTypeObject *type, PyObject *args, PyObject *kw) {
    static char *kwlist[] = {"pool", "num_layers", "kv_heads", "head_dim", "block_size",
                             "dtype", "layout", "device", "buffer", "stream", NULL};
    PyObject *buffer = NULL, *stream = NULL;
    pkv_cache_params p = pkv_cache_params_default();
    PyObject *pool;
    const char *dtype = "fp16", *layout = "HND", *device = NULL;
    int dims[4] = {(int)p.num_layers, (int)p.kv_heads, (int)p.head_dim, (int)p.block_size};
    static const char *dim_names[4] = {"num_layers", "kv_heads", "head_dim", "block_size"};
    if (!PyArg_ParseTupleAndKeywords(args, kw, "O!|$iiiisszOO:KVCache", kwlist,
                                     &pkvpy_Pool_Type, &pool, &dims[0], &dims[1], &dims[2],
                                     &dims[3], &dtype, &layout, &device, &buffer, &stream))
        return NULL;
    for (int i = 0; i < 4; i++)
        if (dims[i] < 1)
            return pkvpy_raise(PKV_ERR_INVALID_ARG, "KVCache", "%s must be >= 1, not %d",
                               dim_names[i], dims[i]);
    p.num_layers = (uint32_t)dims[0];
    p.kv_heads = (uint32_t)dims[1];
    p.head_dim = (uint32_t)dims[2];
    p.block_size = (uint32_t)dims[3];
    if (parse_dtype(dtype, &p.dtype) < 0)
        return pkvpy_raise(PKV_ERR_INVALID_ARG, "KVCache", "dtype '%s' is not fp32, fp16 or bf16",
                           dtype);
    if (!strcmp(layout, "HND")) p.layout = PKV_LAYOUT_HND;
    else if (!strcmp(layout, "NHD")) p.layout = PKV_LAYOUT_NHD;
    else if (!strcmp(layout, "KV_NHD")) p.layout = PKV_LAYOUT_KV_NHD;
    else return pkvpy_raise(PKV_ERR_INVALID_ARG, "KVCache", "layout '%s' is not HND, NHD or "
                            "KV_NHD", layout);
    if (buffer == Py_None)
        buffer = NULL;
    void *unused_stream;
    if (stream_arg(stream, &unused_stream) < 0)
        return NULL;
    if (buffer && (PyList_Check(buffer) || PyTuple_Check(buffer)) &&
        PySequence_Fast_GET_SIZE(buffer) == 0)
        return pkvpy_raise(PKV_ERR_INVALID_ARG, "KVCache", "buffer is an empty list");
    // No device=: the buffer's (the first tensor's) if it is CUDA memory, else cpu.
    char guessed[32] = "cpu";
    if (!device && buffer) {
        PyObject *first = PyList_Check(buffer) || PyTuple_Check(buffer)
                              ? PySequence_Fast_GET_ITEM(buffer, 0) : buffer;
        PyObject *dev = PyObject_HasAttrString(first, "__dlpack_device__")
                            ? PyObject_CallMethod(first, "__dlpack_device__", NULL) : NULL;
        int dt, id;
        if (dev && PyArg_ParseTuple(dev, "ii", &dt, &id) && (dt == 2 || dt == 13))
            snprintf(guessed, sizeof guessed, "cuda:%d", id);
        else if (!dev && PyObject_HasAttrString(first, "__cuda_array_interface__"))
            snprintf(guessed, sizeof guessed, "cuda");
        Py_XDECREF(dev);
        PyErr_Clear(); // a failing producer is reported by the import below
    }
    if (!device)
        device = guessed;
    int cuda, index;
    if (parse_device(device, &cuda, &index) < 0)
        return pkvpy_raise(PKV_ERR_INVALID_ARG, "KVCache", "device '%s' is not cpu, cuda or "
                           "cuda:N", device);

    KVCacheObject *self = (KVCacheObject *)type->tp_alloc(type, 0);
    if (!self)
        return NULL;
    self->caches = &self->cache;
    self->num_caches = 1;
    if (buffer) {
        // An external cache over the caller's memory (a numpy array or a torch tensor,
        // say), kept alive by the imported tensors until this object is destroyed.
        if (create_external(self, &p, pool, buffer, stream, cuda, index, device) < 0) {
            Py_DECREF(self);
            return NULL;
        }
        self->cache = self->caches[0];
    } else {
        if (make_backend(self, cuda, index, device) < 0) {
            Py_DECREF(self);
            return NULL;
        }
        pkv_status st = pkv_cache_create(&p, ((PoolObject *)pool)->pool, self->backend, &self->cache);
        if (st != PKV_OK) {
            Py_DECREF(self);
            return pkvpy_raise(st, "KVCache", "%u layers x %u kv heads x %u dims x %u tokens a "
                               "block, %u blocks", p.num_layers, p.kv_heads, p.head_dim,
                               p.block_size, pkv_pool_capacity(((PoolObject *)pool)->pool));
        }
    }
    Py_INCREF(pool);
    self->pool = pool;
    self->params = p;
    pkv_cache_geometry g;
    pkv_cache_get_geometry(self->cache, &g);
    Py_ssize_t item = (Py_ssize_t)pkv_dtype_size(p.dtype);
    int per_layer = self->caches != &self->cache;
    int64_t shape[6];
    self->ndim = layout_shape(&p, pkv_pool_capacity(((PoolObject *)pool)->pool), per_layer, shape);
    // Element strides of the full arena's axes, in the order of layout_shape's.
    uint64_t hn = p.layout == PKV_LAYOUT_HND;
    uint64_t head = g.head_stride, tok = g.token_stride;
    uint64_t strides[6] = {g.layer_stride, g.block_stride, g.kv_stride, hn ? head : tok,
                           hn ? tok : head, 1};
    if (p.layout == PKV_LAYOUT_KV_NHD) {
        strides[1] = g.kv_stride;
        strides[2] = g.block_stride;
    }
    int skip = 6 - self->ndim;
    for (int i = 0; i < self->ndim; i++) {
        self->shape[i] = (Py_ssize_t)shape[i];
        self->strides[i] = (Py_ssize_t)strides[i + skip] * item;
    }
    return (PyObject *)self;
}

static void KVCache_dealloc(KVCacheObject *self) {
    for (uint32_t i = 0; self->caches && i < self->num_caches; i++)
        pkv_cache_destroy(self->caches[i]);
    if (self->caches != &self->cache)
        PyMem_Free(self->caches);
    for (uint32_t i = 0; i < self->num_tensors; i++)
        pkvpy_tensor_release(&self->tensors[i]);
    PyMem_Free(self->tensors);
    pkv_backend_destroy(self->backend);
    Py_XDECREF(self->pool);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static int is_host(KVCacheObject *self) {
    return pkv_backend_get_kind(self->backend) == PKV_BACKEND_HOST;
}

static int per_layer(KVCacheObject *self) { return self->caches != &self->cache; }

static int KVCache_getbuffer(KVCacheObject *self, Py_buffer *view, int flags) {
    if (!is_host(self) || per_layer(self)) {
        PyErr_SetString(PyExc_BufferError, per_layer(self)
                        ? "a KVCache over per-layer tensors has no single buffer; use them"
                        : "a CUDA KVCache has no host buffer; use data_ptr");
        view->obj = NULL;
        return -1;
    }
    view->buf = pkv_cache_data(self->cache);
    view->obj = (PyObject *)self;
    Py_INCREF(self);
    view->len = (Py_ssize_t)pkv_cache_arena_bytes(self->cache);
    view->readonly = 0;
    view->itemsize = (Py_ssize_t)pkv_dtype_size(self->params.dtype);
    view->format = (flags & PyBUF_FORMAT) ? (char *)dtype_format(self->params.dtype) : NULL;
    view->ndim = self->ndim;
    view->shape = (flags & PyBUF_ND) == PyBUF_ND ? self->shape : NULL;
    view->strides = (flags & PyBUF_STRIDES) == PyBUF_STRIDES ? self->strides : NULL;
    view->suboffsets = NULL;
    view->internal = NULL;
    return 0; // the arena is C-contiguous, so every request can be served
}

static PyBufferProcs KVCache_as_buffer = {(getbufferproc)KVCache_getbuffer, NULL};

static PyObject *KVCache_numpy(KVCacheObject *self, PyObject *unused) {
    if (!is_host(self))
        return pkvpy_raise(PKV_ERR_UNSUPPORTED, "KVCache.numpy", "a CUDA cache's arena is device "
                           "memory; use data_ptr, shape and strides");
    if (per_layer(self))
        return pkvpy_raise(PKV_ERR_UNSUPPORTED, "KVCache.numpy", "the cache is the per-layer "
                           "tensors it was given (buffer=[...]); use them");
    npy_intp dims[6], strides[6];
    for (int i = 0; i < 6; i++) {
        dims[i] = self->shape[i];
        strides[i] = self->strides[i];
    }
    PyArray_Descr *descr = PyArray_DescrFromType(dtype_num(self->params.dtype));
    PyObject *arr = PyArray_NewFromDescr(&PyArray_Type, descr, 6, dims, strides,
                                         pkv_cache_data(self->cache), NPY_ARRAY_CARRAY, NULL);
    if (!arr)
        return NULL;
    Py_INCREF(self); // the array keeps the cache (and its arena) alive
    if (PyArray_SetBaseObject((PyArrayObject *)arr, (PyObject *)self) < 0) {
        Py_DECREF(arr);
        return NULL;
    }
    return arr;
}

// The (layer, block, kv[, extra]) arguments of the block methods, checked, and the
// address of that half block (*ptr); a failure is raised as `method`'s.
static int block_at(KVCacheObject *self, PyObject *args, const char *fmt, const char *method,
                    uint32_t *layer, int *block, PyObject **extra, void **ptr) {
    int l, kv;
    if (extra ? !PyArg_ParseTuple(args, fmt, &l, block, &kv, extra)
              : !PyArg_ParseTuple(args, fmt, &l, block, &kv))
        return -1;
    if (l < 0) {
        pkvpy_raise(PKV_ERR_INVALID_ARG, "KVCache", "layer %d out of range", l);
        return -1;
    }
    *layer = (uint32_t)l;
    if (kv != 0 && kv != 1) {
        pkvpy_raise(PKV_ERR_INVALID_ARG, "KVCache", "kv must be 0 (K) or 1 (V), not %d", kv);
        return -1;
    }
    // A per-layer cache is one single-layer cache per tensor.
    pkv_status st = per_layer(self)
        ? (*layer < self->num_caches ? pkv_cache_block_ptr(self->caches[*layer], 0, *block,
                                                           (pkv_kv)kv, ptr)
                                     : PKV_ERR_INVALID_ARG)
        : pkv_cache_block_ptr(self->cache, *layer, *block, (pkv_kv)kv, ptr);
    if (st != PKV_OK) {
        pkvpy_raise(st, method, "layer %u, block %d", *layer, *block);
        return -1;
    }
    return 0;
}

// Shape of one half block (K or V of one block in one layer), in the cache's layout.
static void half_shape(KVCacheObject *self, npy_intp dims[3]) {
    for (int i = 0; i < 3; i++)
        dims[i] = self->shape[self->ndim - 3 + i];
}

static PyObject *KVCache_block_ptr(KVCacheObject *self, PyObject *args) {
    uint32_t layer;
    int block;
    void *ptr;
    if (block_at(self, args, "iii:block_ptr", "KVCache.block_ptr", &layer, &block, NULL, &ptr) < 0)
        return NULL;
    return PyLong_FromVoidPtr(ptr);
}

static PyObject *KVCache_read_block(KVCacheObject *self, PyObject *args) {
    uint32_t layer;
    int block;
    void *ptr;
    if (block_at(self, args, "iii:read_block", "KVCache.read_block", &layer, &block, NULL, &ptr) < 0)
        return NULL;
    npy_intp dims[3];
    half_shape(self, dims);
    PyArrayObject *out = (PyArrayObject *)PyArray_SimpleNew(3, dims, dtype_num(self->params.dtype));
    if (!out)
        return NULL;
    pkv_status st =
        pkv_backend_download(self->backend, PyArray_DATA(out), ptr, (size_t)PyArray_NBYTES(out));
    if (st != PKV_OK) {
        Py_DECREF(out);
        return pkvpy_raise(st, "KVCache.read_block", "layer %u, block %d", layer, block);
    }
    return (PyObject *)out;
}

static PyObject *KVCache_write_block(KVCacheObject *self, PyObject *args) {
    uint32_t layer;
    int block;
    PyObject *values;
    void *ptr;
    if (block_at(self, args, "iiiO:write_block", "KVCache.write_block", &layer, &block, &values,
                 &ptr) < 0)
        return NULL;
    npy_intp dims[3];
    half_shape(self, dims);
    PyArray_Descr *descr = PyArray_DescrFromType(dtype_num(self->params.dtype));
    PyArrayObject *a = (PyArrayObject *)PyArray_FromAny(values, descr, 0, 3,
                                                        NPY_ARRAY_IN_ARRAY | NPY_ARRAY_FORCECAST,
                                                        NULL);
    if (!a)
        return NULL;
    int ok = PyArray_NDIM(a) == 3;
    for (int i = 0; ok && i < 3; i++)
        ok = PyArray_DIM(a, i) == dims[i];
    if (!ok) {
        Py_DECREF(a);
        return pkvpy_raise(PKV_ERR_INVALID_ARG, "KVCache.write_block",
                           "values must have shape (%lld, %lld, %lld)", (long long)dims[0],
                           (long long)dims[1], (long long)dims[2]);
    }
    pkv_status st = pkv_backend_upload(self->backend, ptr, PyArray_DATA(a), (size_t)PyArray_NBYTES(a));
    Py_DECREF(a);
    if (st != PKV_OK)
        return pkvpy_raise(st, "KVCache.write_block", "layer %u, block %d", layer, block);
    Py_RETURN_NONE;
}

// A stream argument: None/0 (the legacy default stream) or a cudaStream_t as an int
// (torch.cuda.current_stream().cuda_stream). Ignored by the host backend.
static int stream_arg(PyObject *obj, void **stream) {
    *stream = NULL;
    if (!obj || obj == Py_None)
        return 0;
    if (!PyLong_Check(obj)) {
        pkvpy_raise(PKV_ERR_INVALID_ARG, "stream", "a cudaStream_t as an int, or None");
        return -1;
    }
    *stream = PyLong_AsVoidPtr(obj);
    return *stream == NULL && PyErr_Occurred() ? -1 : 0;
}

static PyObject *KVCache_copy_blocks(KVCacheObject *self, PyObject *args, PyObject *kw) {
    static char *kwlist[] = {"pairs", "stream", NULL};
    PyObject *po, *so = NULL;
    void *stream;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "O|O:copy_blocks", kwlist, &po, &so) ||
        stream_arg(so, &stream) < 0)
        return NULL;
    uint32_t n;
    PyArrayObject *pairs = pkvpy_pairs_array(po, &n);
    if (!pairs)
        return NULL;
    pkv_status st = PKV_OK;
    for (uint32_t i = 0; n && st == PKV_OK && i < self->num_caches; i++)
        st = pkv_cache_copy_blocks(self->caches[i], PyArray_DATA(pairs), n, stream);
    Py_DECREF(pairs);
    if (st != PKV_OK)
        return pkvpy_raise(st, "KVCache.copy_blocks", "%u pairs (a block out of range, or "
                           "overlapping pairs)", n);
    Py_RETURN_NONE;
}

static PyObject *KVCache_apply_copies(KVCacheObject *self, PyObject *args, PyObject *kw) {
    static char *kwlist[] = {"seqset", "stream", NULL};
    PyObject *set, *so = NULL;
    void *stream;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "O|O:apply_copies", kwlist, &set, &so) ||
        stream_arg(so, &stream) < 0)
        return NULL;
    if (!PyObject_TypeCheck(set, &pkvpy_SeqSet_Type))
        return pkvpy_raise(PKV_ERR_INVALID_ARG, "KVCache.apply_copies", "expected a SeqSet");
    pkv_status st;
    if (per_layer(self)) { // every layer's cache runs the queue, then it is emptied
        pkv_seqset *ss = ((SeqSetObject *)set)->set;
        const pkv_block_copy *copies;
        uint32_t n = 0;
        st = pkv_seqset_pool(ss) == pkv_cache_pool(self->cache) &&
                     pkv_seqset_block_size(ss) == self->params.block_size
                 ? pkv_seqset_copies(ss, &copies, &n)
                 : PKV_ERR_INVALID_ARG;
        for (uint32_t i = 0; n && st == PKV_OK && i < self->num_caches; i++)
            st = pkv_cache_copy_blocks(self->caches[i], copies, n, stream);
        if (n && st == PKV_OK)
            st = pkv_seqset_copies_done(ss);
    } else {
        st = pkv_cache_apply_copies(self->cache, ((SeqSetObject *)set)->set, stream);
    }
    if (st != PKV_OK)
        return pkvpy_raise(st, "KVCache.apply_copies", "the set must use this cache's pool "
                           "and block size");
    Py_RETURN_NONE;
}

static PyObject *KVCache_transfer(KVCacheObject *self, PyObject *args, PyObject *kw) {
    static char *kwlist[] = {"src", "pairs", "stream", NULL};
    PyObject *src, *po, *so = NULL;
    void *stream;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "O!O|O:transfer", kwlist, &pkvpy_KVCache_Type,
                                     &src, &po, &so) ||
        stream_arg(so, &stream) < 0)
        return NULL;
    uint32_t n;
    PyArrayObject *pairs = pkvpy_pairs_array(po, &n);
    if (!pairs)
        return NULL;
    KVCacheObject *from = (KVCacheObject *)src;
    pkv_status st = per_layer(self) == per_layer(from) && self->num_caches == from->num_caches
                        ? PKV_OK : PKV_ERR_INVALID_ARG;
    for (uint32_t i = 0; st == PKV_OK && i < self->num_caches; i++)
        st = pkv_cache_transfer(self->caches[i], from->caches[i], PyArray_DATA(pairs), n, stream);
    Py_DECREF(pairs);
    if (st != PKV_OK)
        return pkvpy_raise(st, "KVCache.transfer", "%u pairs from a cache of the same shape", n);
    Py_RETURN_NONE;
}

static PyObject *KVCache_sync(KVCacheObject *self, PyObject *args, PyObject *kw) {
    static char *kwlist[] = {"stream", NULL};
    PyObject *so = NULL;
    void *stream;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "|O:sync", kwlist, &so) ||
        stream_arg(so, &stream) < 0)
        return NULL;
    pkv_status st = pkv_backend_sync(self->backend, stream);
    if (st != PKV_OK)
        return pkvpy_raise(st, "KVCache.sync", NULL);
    Py_RETURN_NONE;
}

static PyObject *KVCache_backend_stats(KVCacheObject *self, PyObject *unused) {
    pkv_backend_stats s;
    pkv_status st = pkv_backend_get_stats(self->backend, &s);
    if (st != PKV_OK)
        return pkvpy_raise(st, "KVCache.backend_stats", NULL);
    return Py_BuildValue("{s:K,s:K,s:d,s:d,s:K,s:K,s:K,s:K}", "alloc_calls",
                         (unsigned long long)s.alloc_calls, "free_calls",
                         (unsigned long long)s.free_calls, "alloc_seconds", s.alloc_seconds,
                         "free_seconds", s.free_seconds, "copy_calls",
                         (unsigned long long)s.copy_calls, "bytes_copied",
                         (unsigned long long)s.bytes_copied, "bytes_live",
                         (unsigned long long)s.bytes_live, "bytes_peak",
                         (unsigned long long)s.bytes_peak);
}

static PyObject *ssize_tuple(const Py_ssize_t *v, int n) {
    PyObject *t = PyTuple_New(n);
    for (int i = 0; t && i < n; i++) {
        PyObject *x = PyLong_FromSsize_t(v[i]);
        if (!x) {
            Py_CLEAR(t);
            break;
        }
        PyTuple_SET_ITEM(t, i, x);
    }
    return t;
}
static PyObject *KVCache_get_shape(KVCacheObject *self, void *c) {
    return ssize_tuple(self->shape, self->ndim);
}
static PyObject *KVCache_get_strides(KVCacheObject *self, void *c) {
    return ssize_tuple(self->strides, self->ndim);
}
static PyObject *KVCache_get_dtype(KVCacheObject *self, void *c) {
    return (PyObject *)PyArray_DescrFromType(dtype_num(self->params.dtype));
}
static PyObject *KVCache_get_params(KVCacheObject *self, void *c) {
    const pkv_cache_params *p = &self->params;
    return Py_BuildValue("{s:I,s:I,s:I,s:I,s:s,s:s}", "num_layers", p->num_layers, "kv_heads",
                         p->kv_heads, "head_dim", p->head_dim, "block_size", p->block_size,
                         "dtype", pkv_dtype_name(p->dtype), "layout",
                         layout_name(p->layout));
}
static PyObject *KVCache_get_data_ptr(KVCacheObject *self, void *c) {
    if (!per_layer(self))
        return PyLong_FromVoidPtr(pkv_cache_data(self->cache));
    PyObject *t = PyTuple_New(self->num_caches);
    for (uint32_t i = 0; t && i < self->num_caches; i++) {
        PyObject *x = PyLong_FromVoidPtr(pkv_cache_data(self->caches[i]));
        if (!x) {
            Py_CLEAR(t);
            break;
        }
        PyTuple_SET_ITEM(t, i, x);
    }
    return t;
}
static PyObject *KVCache_get_arena_bytes(KVCacheObject *self, void *c) {
    unsigned long long sum = 0;
    for (uint32_t i = 0; i < self->num_caches; i++)
        sum += pkv_cache_arena_bytes(self->caches[i]);
    return PyLong_FromUnsignedLongLong(sum);
}
static PyObject *KVCache_get_device(KVCacheObject *self, void *c) {
    return PyUnicode_FromString(is_host(self) ? "cpu" : "cuda");
}
static PyObject *KVCache_get_pool(KVCacheObject *self, void *c) {
    Py_INCREF(self->pool);
    return self->pool;
}

static PyMethodDef KVCache_methods[] = {
    {"numpy", (PyCFunction)KVCache_numpy, METH_NOARGS,
     "numpy() -> the arena as a writable ndarray of `shape` (no copy; host caches only)."},
    {"block_ptr", (PyCFunction)KVCache_block_ptr, METH_VARARGS,
     "block_ptr(layer, block, kv) -> address of that K (kv=0) or V (kv=1) half block."},
    {"read_block", (PyCFunction)KVCache_read_block, METH_VARARGS,
     "read_block(layer, block, kv) -> a copy of one half block, through the backend."},
    {"write_block", (PyCFunction)KVCache_write_block, METH_VARARGS,
     "write_block(layer, block, kv, values): upload one half block through the backend."},
    {"copy_blocks", (PyCFunction)(void (*)(void))KVCache_copy_blocks,
     METH_VARARGS | METH_KEYWORDS,
     "copy_blocks(pairs int32 [n, 2], stream=None): copy src -> dst, every layer, K and V,\n"
     "one batch (CUDA: enqueued on `stream`, not synchronized; see sync)."},
    {"apply_copies", (PyCFunction)(void (*)(void))KVCache_apply_copies,
     METH_VARARGS | METH_KEYWORDS,
     "apply_copies(seqset, stream=None): take the set's queued copies and run them."},
    {"transfer", (PyCFunction)(void (*)(void))KVCache_transfer, METH_VARARGS | METH_KEYWORDS,
     "transfer(src_cache, pairs, stream=None): move blocks between two caches of one shape."},
    {"sync", (PyCFunction)(void (*)(void))KVCache_sync, METH_VARARGS | METH_KEYWORDS,
     "sync(stream=None): wait for the copies enqueued on `stream` (host: returns at once)."},
    {"backend_stats", (PyCFunction)KVCache_backend_stats, METH_NOARGS,
     "backend_stats() -> dict of backend allocation/copy counters."},
    {NULL, NULL, 0, NULL},
};

static PyGetSetDef KVCache_getset[] = {
    {"shape", (getter)KVCache_get_shape, NULL, "the arena's shape (see the class doc; "
     "per-layer tensors: one layer's)", NULL},
    {"strides", (getter)KVCache_get_strides, NULL, "the arena's strides in bytes", NULL},
    {"dtype", (getter)KVCache_get_dtype, NULL, "numpy dtype (bf16: uint16 bits)", NULL},
    {"params", (getter)KVCache_get_params, NULL, "the creation parameters", NULL},
    {"data_ptr", (getter)KVCache_get_data_ptr, NULL, "arena base address (device for CUDA); "
     "per-layer tensors: a tuple, one per layer", NULL},
    {"arena_bytes", (getter)KVCache_get_arena_bytes, NULL, "bytes of the one allocation", NULL},
    {"device", (getter)KVCache_get_device, NULL, "'cpu' or 'cuda'", NULL},
    {"pool", (getter)KVCache_get_pool, NULL, "the BlockPool", NULL},
    {NULL, NULL, NULL, NULL, NULL},
};

PyTypeObject pkvpy_KVCache_Type = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "pagedkv.KVCache",
    .tp_basicsize = sizeof(KVCacheObject),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "KVCache(pool, *, num_layers=1, kv_heads=1, head_dim=128, block_size=16,\n"
              "        dtype='fp16', layout='HND', device=None, buffer=None, stream=None):\n"
              "K/V memory for every block of `pool`, one backend allocation, or the caller's\n"
              "memory (an external cache: nothing allocated). layout is the tensor's shape:\n"
              "  HND    [layers, blocks, 2, kv_heads, block_size, head_dim]\n"
              "  NHD    [layers, blocks, 2, block_size, kv_heads, head_dim]\n"
              "  KV_NHD [layers, 2, blocks, block_size, kv_heads, head_dim] (vLLM FlashAttention)\n"
              "buffer: a writable C-contiguous tensor of that shape and dtype (a DLPack\n"
              "producer: torch, CuPy, JAX, numpy; a __cuda_array_interface__; a buffer), or\n"
              "a list of one tensor per layer without the leading [layers]. Shape, strides,\n"
              "dtype (bf16: bfloat16 or its uint16 bits) and device are checked. device:\n"
              "cpu, cuda or cuda:N (default: the buffer's, else cpu). stream: a cudaStream_t\n"
              "int (torch.cuda.current_stream().cuda_stream) handed to a CUDA producer.\n"
              "A host cache over one arena is a buffer (np.asarray(cache), cache.numpy()).",
    .tp_new = KVCache_new,
    .tp_dealloc = (destructor)KVCache_dealloc,
    .tp_methods = KVCache_methods,
    .tp_getset = KVCache_getset,
    .tp_as_buffer = &KVCache_as_buffer,
};

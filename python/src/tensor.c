// SPDX-License-Identifier: MIT
// The consumer side of the tensor-exchange protocols, for KVCache(buffer=...): DLPack
// (__dlpack__ / __dlpack_device__: torch tensors on CPU and CUDA, CuPy, JAX, numpy >=
// 1.22), __cuda_array_interface__ (CuPy, Numba, torch CUDA) and, for objects with
// neither, the buffer protocol. Each gives a pkvpy_tensor: where the data is, its
// shape, strides in elements and dtype, and what keeps it alive until
// pkvpy_tensor_release. The DLPack structs below follow the public dlpack.h ABI
// (v0.x "dltensor" capsules, which every producer still emits when the consumer asks
// without max_version).
#include "pkvpy.h"

#include <string.h>

// ---- DLPack ABI (dlpack.h): field order and types are the contract ----
typedef struct {
    int32_t device_type; // DLDeviceType: 1 CPU, 2 CUDA, 3 CUDA pinned host, 13 CUDA managed
    int32_t device_id;
} DLDevice;
typedef struct {
    uint8_t code; // DLDataTypeCode: 0 int, 1 uint, 2 float, 4 bfloat
    uint8_t bits;
    uint16_t lanes;
} DLDataType;
typedef struct {
    void *data;
    DLDevice device;
    int32_t ndim;
    DLDataType dtype;
    int64_t *shape;   // [ndim]
    int64_t *strides; // [ndim] in elements, or NULL: C-contiguous
    uint64_t byte_offset;
} DLTensor;
typedef struct DLManagedTensor {
    DLTensor dl_tensor;
    void *manager_ctx;
    void (*deleter)(struct DLManagedTensor *self);
} DLManagedTensor;

enum { DL_CPU = 1, DL_CUDA = 2, DL_CUDA_HOST = 3, DL_CUDA_MANAGED = 13 };
enum { DL_INT = 0, DL_UINT = 1, DL_FLOAT = 2, DL_BFLOAT = 4 };

static int too_many_dims(int ndim, const char *what) {
    if (ndim >= 0 && ndim <= PKVPY_TENSOR_MAX_DIMS)
        return 0;
    pkvpy_raise(PKV_ERR_INVALID_ARG, what, "%d dimensions (at most %d)", ndim,
                PKVPY_TENSOR_MAX_DIMS);
    return 1;
}

// C-contiguous strides (elements) for t->shape.
static void contiguous_strides(pkvpy_tensor *t) {
    int64_t s = 1;
    for (int i = t->ndim - 1; i >= 0; i--) {
        t->strides[i] = s;
        s *= t->shape[i];
    }
}

// Call obj.<name>(**kw) (kw may be NULL). New reference or NULL.
static PyObject *call_method_kw(PyObject *obj, const char *name, PyObject *kw) {
    PyObject *fn = PyObject_GetAttrString(obj, name);
    if (!fn)
        return NULL;
    PyObject *args = PyTuple_New(0);
    PyObject *r = args ? PyObject_Call(fn, args, kw) : NULL;
    Py_XDECREF(args);
    Py_DECREF(fn);
    return r;
}

static int from_dlpack(PyObject *obj, PyObject *stream, pkvpy_tensor *t, const char *what) {
    // __dlpack_device__ first: a CUDA producer is told the consumer's stream, so that
    // it orders its pending work before ours (the protocol's synchronization).
    int32_t dev_type = DL_CPU;
    PyObject *dev = call_method_kw(obj, "__dlpack_device__", NULL);
    if (dev) {
        int type_code, id;
        if (!PyArg_ParseTuple(dev, "ii", &type_code, &id)) {
            Py_DECREF(dev);
            return -1;
        }
        dev_type = type_code;
        Py_DECREF(dev);
    } else if (PyErr_ExceptionMatches(PyExc_AttributeError)) {
        PyErr_Clear();
    } else {
        return -1;
    }
    PyObject *kw = NULL;
    if (dev_type == DL_CUDA || dev_type == DL_CUDA_MANAGED) {
        // None tells the producer nothing; the caller's stream orders its work first.
        // The DLPack protocol forbids 0: the legacy default stream is 1 there.
        PyObject *one = NULL;
        if (stream && PyLong_Check(stream) && PyLong_AsLongLong(stream) == 0) {
            if (!(one = PyLong_FromLong(1)))
                return -1;
            stream = one;
        }
        kw = Py_BuildValue("{s:O}", "stream", stream ? stream : Py_None);
        Py_XDECREF(one);
        if (!kw)
            return -1;
    }
    PyObject *capsule = call_method_kw(obj, "__dlpack__", kw);
    Py_XDECREF(kw);
    if (!capsule)
        return -1;
    DLManagedTensor *m = PyCapsule_GetPointer(capsule, "dltensor");
    if (!m) {
        Py_DECREF(capsule);
        PyErr_Clear();
        return pkvpy_raise(PKV_ERR_INVALID_ARG, what, "__dlpack__ did not return an unused "
                           "'dltensor' capsule"), -1;
    }
    // Consumed: the producer's capsule destructor leaves a renamed capsule alone, and
    // the deleter runs in pkvpy_tensor_release.
    if (PyCapsule_SetName(capsule, "used_dltensor") < 0) {
        Py_DECREF(capsule);
        return -1;
    }
    Py_DECREF(capsule);
    t->managed = m;
    const DLTensor *d = &m->dl_tensor;
    if (too_many_dims(d->ndim, what))
        return -1;
    t->ndim = d->ndim;
    for (int i = 0; i < t->ndim; i++)
        t->shape[i] = d->shape[i];
    if (d->strides) {
        for (int i = 0; i < t->ndim; i++)
            t->strides[i] = d->strides[i];
    } else {
        contiguous_strides(t);
    }
    t->data = (char *)d->data + d->byte_offset;
    t->cuda = d->device.device_type == DL_CUDA || d->device.device_type == DL_CUDA_MANAGED;
    if (!t->cuda && d->device.device_type != DL_CPU && d->device.device_type != DL_CUDA_HOST)
        return pkvpy_raise(PKV_ERR_INVALID_ARG, what, "DLPack device type %d is neither CPU "
                           "nor CUDA", (int)d->device.device_type), -1;
    t->device_id = d->device.device_id;
    if (d->dtype.lanes != 1)
        return pkvpy_raise(PKV_ERR_INVALID_ARG, what, "vector dtypes (%u lanes) are not "
                           "supported", (unsigned)d->dtype.lanes), -1;
    t->kind = d->dtype.code == DL_FLOAT ? 'f' : d->dtype.code == DL_BFLOAT ? 'b'
            : d->dtype.code == DL_UINT ? 'u' : d->dtype.code == DL_INT ? 'i' : '?';
    t->bits = d->dtype.bits;
    return 0;
}

// typestr "<f2", "|u1", ...: kind and bits; bf16 has no typestr ("<V2" is opaque).
static int parse_typestr(const char *s, pkvpy_tensor *t, const char *what) {
    if (strlen(s) < 3 || (s[0] != '<' && s[0] != '|' && s[0] != '='))
        return pkvpy_raise(PKV_ERR_INVALID_ARG, what, "typestr '%s' is not little-endian "
                           "<kind><bytes>", s), -1;
    t->kind = s[1] == 'f' || s[1] == 'u' || s[1] == 'i' ? s[1] : '?';
    t->bits = 8 * atoi(s + 2);
    return 0;
}

static int int64_tuple(PyObject *tuple, int64_t *out, int n, const char *what, const char *key) {
    for (int i = 0; i < n; i++) {
        long long v = PyLong_AsLongLong(PyTuple_GET_ITEM(tuple, i));
        if (v == -1 && PyErr_Occurred()) {
            PyErr_Clear();
            return pkvpy_raise(PKV_ERR_INVALID_ARG, what, "__cuda_array_interface__['%s'] "
                               "must hold integers", key), -1;
        }
        out[i] = v;
    }
    return 0;
}

static int from_cuda_array_interface(PyObject *obj, PyObject *cai, pkvpy_tensor *t,
                                     const char *what) {
    if (!PyDict_Check(cai))
        return pkvpy_raise(PKV_ERR_INVALID_ARG, what, "__cuda_array_interface__ is not a "
                           "dict"), -1;
    PyObject *shape = PyDict_GetItemString(cai, "shape");     // borrowed
    PyObject *typestr = PyDict_GetItemString(cai, "typestr"); // borrowed
    PyObject *data = PyDict_GetItemString(cai, "data");       // borrowed
    PyObject *strides = PyDict_GetItemString(cai, "strides"); // borrowed, may be None
    if (!shape || !PyTuple_Check(shape) || !typestr || !PyUnicode_Check(typestr) || !data ||
        !PyTuple_Check(data) || PyTuple_GET_SIZE(data) != 2)
        return pkvpy_raise(PKV_ERR_INVALID_ARG, what, "__cuda_array_interface__ needs shape "
                           "(tuple), typestr (str) and data ((ptr, readonly))"), -1;
    if (PyObject_IsTrue(PyTuple_GET_ITEM(data, 1)))
        return pkvpy_raise(PKV_ERR_INVALID_ARG, what, "the CUDA array is read-only"), -1;
    int n = (int)PyTuple_GET_SIZE(shape);
    if (too_many_dims(n, what))
        return -1;
    t->ndim = n;
    if (int64_tuple(shape, t->shape, n, what, "shape") < 0 ||
        parse_typestr(PyUnicode_AsUTF8(typestr), t, what) < 0)
        return -1;
    if (strides && strides != Py_None) {
        if (!PyTuple_Check(strides) || PyTuple_GET_SIZE(strides) != n)
            return pkvpy_raise(PKV_ERR_INVALID_ARG, what, "__cuda_array_interface__['strides']"
                               " must be None or one int per dimension"), -1;
        if (int64_tuple(strides, t->strides, n, what, "strides") < 0)
            return -1;
        int64_t item = t->bits / 8;
        for (int i = 0; i < n; i++) {
            if (item == 0 || t->strides[i] % item)
                return pkvpy_raise(PKV_ERR_INVALID_ARG, what, "stride %lld bytes of axis %d "
                                   "is not a whole number of items",
                                   (long long)t->strides[i], i), -1;
            t->strides[i] /= item;
        }
    } else {
        contiguous_strides(t);
    }
    t->data = PyLong_AsVoidPtr(PyTuple_GET_ITEM(data, 0));
    if (!t->data && PyErr_Occurred())
        return -1;
    t->cuda = 1;
    t->device_id = -1; // the interface does not say; the caller's device= does
    // "stream": the producer's stream that pending work is on (v3). Host code cannot
    // wait on it without CUDA; the caller passes it to KVCache as stream= instead.
    t->cai_stream = PyDict_GetItemString(cai, "stream");
    if (t->cai_stream == Py_None)
        t->cai_stream = NULL;
    Py_XINCREF(t->cai_stream);
    return 0;
}

static int from_buffer(PyObject *obj, pkvpy_tensor *t, const char *what) {
    if (PyObject_GetBuffer(obj, &t->view, PyBUF_WRITABLE | PyBUF_STRIDES | PyBUF_FORMAT) < 0)
        return -1;
    t->has_view = 1;
    if (too_many_dims(t->view.ndim, what))
        return -1;
    const char *f = t->view.format ? t->view.format : "B";
    if (*f == '<' || *f == '=' || *f == '@')
        f++;
    t->kind = *f == 'e' || *f == 'f' || *f == 'd' ? 'f' : strchr("BHILQ", *f) ? 'u'
            : strchr("bhilq", *f) ? 'i' : '?';
    t->bits = (int)(8 * t->view.itemsize);
    t->ndim = t->view.ndim;
    for (int i = 0; i < t->ndim; i++) {
        t->shape[i] = t->view.shape[i];
        if (t->view.strides[i] % t->view.itemsize)
            return pkvpy_raise(PKV_ERR_INVALID_ARG, what, "stride %zd bytes of axis %d is not "
                               "a whole number of items", t->view.strides[i], i), -1;
        t->strides[i] = t->view.strides[i] / t->view.itemsize;
    }
    if (t->ndim == 0) { // a scalar-shaped buffer: treat its bytes as one axis
        t->ndim = 1;
        t->shape[0] = t->view.len / t->view.itemsize;
        t->strides[0] = 1;
    }
    t->data = t->view.buf;
    return 0;
}

int pkvpy_tensor_import(PyObject *obj, PyObject *stream, pkvpy_tensor *t, const char *what) {
    memset(t, 0, sizeof *t);
    int r;
    if (PyObject_HasAttrString(obj, "__dlpack__")) {
        r = from_dlpack(obj, stream, t, what);
    } else if (PyObject_HasAttrString(obj, "__cuda_array_interface__")) {
        PyObject *cai = PyObject_GetAttrString(obj, "__cuda_array_interface__");
        r = cai ? from_cuda_array_interface(obj, cai, t, what) : -1;
        Py_XDECREF(cai);
    } else if (PyObject_CheckBuffer(obj)) {
        r = from_buffer(obj, t, what);
    } else {
        pkvpy_raise(PKV_ERR_INVALID_ARG, what, "a %s is neither a DLPack producer "
                    "(__dlpack__), a __cuda_array_interface__ nor a buffer",
                    Py_TYPE(obj)->tp_name);
        r = -1;
    }
    if (r < 0) {
        pkvpy_tensor_release(t);
        return -1;
    }
    Py_INCREF(obj);
    t->owner = obj;
    return 0;
}

void pkvpy_tensor_release(pkvpy_tensor *t) {
    DLManagedTensor *m = t->managed;
    if (m && m->deleter)
        m->deleter(m);
    t->managed = NULL;
    if (t->has_view)
        PyBuffer_Release(&t->view);
    t->has_view = 0;
    Py_CLEAR(t->cai_stream);
    Py_CLEAR(t->owner);
}

// Contiguous strides of `shape` may differ on axes of extent 1 (any stride is valid
// there), and nothing else may.
int pkvpy_tensor_check(const pkvpy_tensor *t, const int64_t *shape, int ndim,
                       const char *layout, const char *what) {
    char want[160] = "", got[160] = "";
    for (int i = 0, n1 = 0, n2 = 0; i < ndim || i < t->ndim; i++) {
        if (i < ndim)
            n1 += snprintf(want + n1, sizeof want - (size_t)n1, "%s%lld", i ? ", " : "",
                           (long long)shape[i]);
        if (i < t->ndim)
            n2 += snprintf(got + n2, sizeof got - (size_t)n2, "%s%lld", i ? ", " : "",
                           (long long)t->shape[i]);
        if (n1 >= (int)sizeof want || n2 >= (int)sizeof got)
            break;
    }
    int same = t->ndim == ndim;
    for (int i = 0; same && i < ndim; i++)
        same = t->shape[i] == shape[i];
    if (!same)
        return pkvpy_raise(PKV_ERR_INVALID_ARG, what, "buffer has shape (%s); layout %s "
                           "needs (%s)", got, layout, want), -1;
    int64_t s = 1;
    for (int i = ndim - 1; i >= 0; i--) {
        if (shape[i] != 1 && t->strides[i] != s)
            return pkvpy_raise(PKV_ERR_INVALID_ARG, what, "buffer of shape (%s) is not "
                               "C-contiguous: axis %d has stride %lld elements, layout %s "
                               "needs %lld", got, i, (long long)t->strides[i], layout,
                               (long long)s), -1;
        s *= shape[i];
    }
    return 0;
}

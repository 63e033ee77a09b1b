// SPDX-License-Identifier: MIT
// numpy <-> C arrays. Inputs that already have the C element type and layout are
// used in place (the engine-step path allocates nothing for them); anything else is
// converted once, with every value checked to fit, so an int64 id of 2**40 or a
// negative count is an InvalidArgument, never a silently wrapped number.
#include "pkvpy.h"

static int fits(int64_t v, int typenum) {
    switch (typenum) {
    case NPY_INT32: return v >= INT32_MIN && v <= INT32_MAX;
    case NPY_UINT32: return v >= 0 && v <= (int64_t)UINT32_MAX;
    default: return 1;
    }
}

static const char *type_name(int typenum) {
    return typenum == NPY_INT32 ? "int32" : typenum == NPY_UINT32 ? "uint32" : "int64";
}

PyArrayObject *pkvpy_int_vector(PyObject *obj, int typenum, const char *what) {
    if (PyArray_Check(obj)) {
        PyArrayObject *a = (PyArrayObject *)obj;
        if (PyArray_NDIM(a) != 1) {
            pkvpy_raise(PKV_ERR_INVALID_ARG, what, "expected a 1-D array, got %d dimensions",
                        PyArray_NDIM(a));
            return NULL;
        }
        if (PyArray_TYPE(a) == typenum && PyArray_ISCARRAY_RO(a) && PyArray_ISNOTSWAPPED(a)) {
            Py_INCREF(a);
            return a;
        }
        // int32 data for a uint32 parameter (counts usually arrive as int32): same bits
        // once checked non-negative, so view it instead of copying.
        if (typenum == NPY_UINT32 && PyArray_TYPE(a) == NPY_INT32 && PyArray_ISCARRAY_RO(a) &&
            PyArray_ISNOTSWAPPED(a)) {
            const int32_t *v = (const int32_t *)PyArray_DATA(a);
            npy_intp n = PyArray_DIM(a, 0);
            for (npy_intp i = 0; i < n; i++)
                if (v[i] < 0) {
                    pkvpy_raise(PKV_ERR_INVALID_ARG, what,
                                "entry %lld is %d, not a uint32", (long long)i, (int)v[i]);
                    return NULL;
                }
            PyArray_Descr *d = PyArray_DescrFromType(NPY_UINT32);
            return (PyArrayObject *)PyArray_View(a, d, NULL);
        }
        if (!PyArray_ISINTEGER(a) && !PyArray_ISBOOL(a) && PyArray_SIZE(a) > 0) {
            pkvpy_raise(PKV_ERR_INVALID_ARG, what, "expected integers, got dtype %c",
                        PyArray_DESCR(a)->type);
            return NULL;
        }
    }
    // General path: discover the type first (a list of floats must not be truncated
    // into ids), then widen to int64 (uint64 above 2**63 fails the cast, reported).
    PyArrayObject *wide = NULL;
    PyArrayObject *any = (PyArrayObject *)PyArray_FromAny(obj, NULL, 0, 1, 0, NULL);
    if (any) {
        if (PyArray_SIZE(any) > 0 && !PyArray_ISINTEGER(any) && !PyArray_ISBOOL(any)) {
            pkvpy_raise(PKV_ERR_INVALID_ARG, what, "expected integers, got dtype %c",
                        PyArray_DESCR(any)->type);
            Py_DECREF(any);
            return NULL;
        }
        if (PyArray_SIZE(any) == 0 && PyArray_NDIM(any) == 1)
            wide = pkvpy_new_vector(0, NPY_INT64); // [] is float64 to numpy
        else
            wide = (PyArrayObject *)PyArray_FROMANY((PyObject *)any, NPY_INT64, 0, 1,
                                                    NPY_ARRAY_IN_ARRAY);
        Py_DECREF(any);
    }
    if (!wide) {
        PyObject *type, *value, *tb;
        PyErr_Fetch(&type, &value, &tb);
        PyObject *s = value ? PyObject_Str(value) : NULL;
        pkvpy_raise(PKV_ERR_INVALID_ARG, what, "not a sequence of integers (%s)",
                    s ? PyUnicode_AsUTF8(s) : "?");
        Py_XDECREF(s);
        Py_XDECREF(type);
        Py_XDECREF(value);
        Py_XDECREF(tb);
        return NULL;
    }
    if (PyArray_NDIM(wide) != 1) {
        Py_DECREF(wide);
        pkvpy_raise(PKV_ERR_INVALID_ARG, what, "expected a 1-D sequence of integers");
        return NULL;
    }
    npy_intp n = PyArray_DIM(wide, 0);
    if (typenum == NPY_INT64)
        return wide;
    PyArrayObject *out = pkvpy_new_vector(n, typenum);
    if (!out) {
        Py_DECREF(wide);
        return NULL;
    }
    const int64_t *src = (const int64_t *)PyArray_DATA(wide);
    for (npy_intp i = 0; i < n; i++) {
        if (!fits(src[i], typenum)) {
            pkvpy_raise(PKV_ERR_INVALID_ARG, what, "entry %lld is %lld, not a %s",
                        (long long)i, (long long)src[i], type_name(typenum));
            Py_DECREF(wide);
            Py_DECREF(out);
            return NULL;
        }
        if (typenum == NPY_INT32)
            ((int32_t *)PyArray_DATA(out))[i] = (int32_t)src[i];
        else
            ((uint32_t *)PyArray_DATA(out))[i] = (uint32_t)src[i];
    }
    Py_DECREF(wide);
    return out;
}

int pkvpy_u32(PyObject *obj, uint32_t *out, const char *what) {
    long long v;
    int overflow;
    if (pkvpy_index(obj, what, "expected an integer", &v, &overflow) < 0)
        return -1;
    if (overflow || v < 0 || v > (long long)UINT32_MAX) {
        pkvpy_raise(PKV_ERR_INVALID_ARG, what, "value out of range 0..4294967295");
        return -1;
    }
    *out = (uint32_t)v;
    return 0;
}

PyArrayObject *pkvpy_new_vector(npy_intp n, int typenum) {
    npy_intp dims[1] = {n};
    return (PyArrayObject *)PyArray_SimpleNew(1, dims, typenum);
}

PyArrayObject *pkvpy_new_matrix(npy_intp rows, npy_intp cols, int typenum) {
    npy_intp dims[2] = {rows, cols};
    return (PyArrayObject *)PyArray_SimpleNew(2, dims, typenum);
}

PyObject *pkvpy_copies_array(const pkv_block_copy *pairs, uint32_t n) {
    PyArrayObject *a = pkvpy_new_matrix(n, 2, NPY_INT32);
    if (!a)
        return NULL;
    int32_t *d = (int32_t *)PyArray_DATA(a);
    for (uint32_t i = 0; i < n; i++) {
        d[2 * i] = pairs[i].src;
        d[2 * i + 1] = pairs[i].dst;
    }
    return (PyObject *)a;
}

PyArrayObject *pkvpy_pairs_array(PyObject *obj, uint32_t *n) {
    // pkv_block_copy is {int32 src, int32 dst}: an (n, 2) C-contiguous int32 array has
    // exactly its layout.
    PyArrayObject *a = (PyArrayObject *)PyArray_FROMANY(obj, NPY_INT32, 0, 2,
                                                        NPY_ARRAY_IN_ARRAY);
    if (!a) {
        PyErr_Clear();
        pkvpy_raise(PKV_ERR_INVALID_ARG, "block pairs",
                    "expected an (n, 2) array of int32 block ids");
        return NULL;
    }
    if (PyArray_SIZE(a) == 0) {
        *n = 0;
        return a;
    }
    if (PyArray_NDIM(a) != 2 || PyArray_DIM(a, 1) != 2 || PyArray_DIM(a, 0) > (npy_intp)UINT32_MAX) {
        Py_DECREF(a);
        pkvpy_raise(PKV_ERR_INVALID_ARG, "block pairs",
                    "expected an (n, 2) array of int32 block ids");
        return NULL;
    }
    *n = (uint32_t)PyArray_DIM(a, 0);
    return a;
}

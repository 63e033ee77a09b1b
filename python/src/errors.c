// SPDX-License-Identifier: MIT
// pkv_status -> typed Python exceptions. Every class derives from pagedkv.PagedKVError
// and, where one fits, from the builtin a Python caller would catch (InvalidArgument is
// a ValueError, NotFound a LookupError, OutOfMemory a MemoryError, FileError an OSError).
// Each instance carries .status (the pkv_status code), .status_name and .detail.
#include "pkvpy.h"

#include <stdarg.h>
#include <stdio.h>

// One row per status code; `cls` is filled at module init (module-lifetime reference).
static struct {
    pkv_status status;
    const char *name;
    const char *builtin; // extra base, or NULL
    const char *doc;
    PyObject *cls;
} classes[] = {
    {PKV_ERR_INVALID_ARG, "InvalidArgument", "ValueError", "A bad argument: range, shape, id."},
    {PKV_ERR_OUT_OF_BLOCKS, "OutOfBlocks", NULL, "The pool has too few free blocks; nothing changed."},
    {PKV_ERR_OUT_OF_MEMORY, "OutOfMemory", "MemoryError", "A host or backend allocation failed."},
    {PKV_ERR_NOT_FOUND, "NotFound", "LookupError", "A sequence or block id that is not live."},
    {PKV_ERR_UNSUPPORTED, "Unsupported", "NotImplementedError", "Not available in this build."},
    {PKV_ERR_NO_DEVICE, "NoDevice", NULL, "No usable CUDA device."},
    {PKV_ERR_BACKEND, "BackendError", NULL, "The memory backend failed."},
    {PKV_ERR_CORRUPT, "Corrupt", NULL, "An invariant check found inconsistent state."},
    {PKV_ERR_BUFFER_TOO_SMALL, "BufferTooSmall", NULL, "An output would not fit its bound."},
    {PKV_ERR_IO, "FileError", "OSError", "A file could not be opened, read or written."},
    {PKV_ERR_FORMAT, "FormatError", "ValueError", "A file did not follow its format."},
    {PKV_ERR_BUSY, "Busy", NULL, "The object is bound elsewhere or in use."},
    {PKV_ERR_LIMIT, "LimitExceeded", NULL, "A count would pass its limit (refcount, live "
                                             "sequences)."},
    {PKV_ERR_RELEASED, "Released", NULL, "The tokens asked for were released by a sliding "
                                         "window or chunk (hybrid models); nothing changed."},
};
static PyObject *base_error; // pagedkv.PagedKVError

// PyModule_AddObjectRef is 3.10+; this keeps 3.9.
static int add_ref(PyObject *module, const char *name, PyObject *obj) {
    Py_INCREF(obj);
    if (PyModule_AddObject(module, name, obj) < 0) {
        Py_DECREF(obj);
        return -1;
    }
    return 0;
}

int pkvpy_errors_init(PyObject *module) {
    base_error = PyErr_NewExceptionWithDoc("pagedkv.PagedKVError",
                                           "Base class of every pagedkv error.", NULL, NULL);
    if (!base_error || add_ref(module, "PagedKVError", base_error) < 0)
        return -1;
    PyObject *builtins = PyEval_GetBuiltins(); // borrowed
    for (size_t i = 0; i < sizeof classes / sizeof classes[0]; i++) {
        PyObject *bases;
        if (classes[i].builtin) {
            PyObject *b = PyDict_GetItemString(builtins, classes[i].builtin); // borrowed
            if (!b)
                return -1;
            bases = PyTuple_Pack(2, base_error, b);
        } else {
            bases = PyTuple_Pack(1, base_error);
        }
        if (!bases)
            return -1;
        char qual[64];
        snprintf(qual, sizeof qual, "pagedkv.%s", classes[i].name);
        classes[i].cls = PyErr_NewExceptionWithDoc(qual, classes[i].doc, bases, NULL);
        Py_DECREF(bases);
        if (!classes[i].cls || add_ref(module, classes[i].name, classes[i].cls) < 0)
            return -1;
    }
    return 0;
}

int pkvpy_errors_import(const char *module_name) {
    PyObject *m = PyImport_ImportModule(module_name);
    if (!m)
        return -1;
    base_error = PyObject_GetAttrString(m, "PagedKVError"); // module-lifetime reference
    for (size_t i = 0; base_error && i < sizeof classes / sizeof classes[0]; i++) {
        classes[i].cls = PyObject_GetAttrString(m, classes[i].name);
        if (!classes[i].cls)
            break;
    }
    Py_DECREF(m);
    return PyErr_Occurred() ? -1 : 0;
}

static PyObject *class_of(pkv_status status) {
    for (size_t i = 0; i < sizeof classes / sizeof classes[0]; i++)
        if (classes[i].status == status)
            return classes[i].cls;
    return base_error;
}

// Build the instance, set its attributes, raise it. `extra` (may be NULL) adds attributes.
static PyObject *raise_with(pkv_status status, const char *message, const char *detail,
                            PyObject *extra) {
    PyObject *cls = class_of(status);
    PyObject *exc = PyObject_CallFunction(cls, "s", message);
    if (!exc)
        return NULL;
    PyObject *code = PyLong_FromLong((long)status);
    PyObject *name = PyUnicode_FromString(pkv_status_str(status));
    int bad = !code || !name || PyObject_SetAttrString(exc, "status", code) < 0 ||
              PyObject_SetAttrString(exc, "status_name", name) < 0;
    Py_XDECREF(code);
    Py_XDECREF(name);
    if (!bad) {
        PyObject *d = PyUnicode_FromString(detail ? detail : "");
        bad = !d || PyObject_SetAttrString(exc, "detail", d) < 0;
        Py_XDECREF(d);
    }
    if (!bad && extra) {
        PyObject *key, *value;
        Py_ssize_t pos = 0;
        while (!bad && PyDict_Next(extra, &pos, &key, &value))
            bad = PyObject_SetAttr(exc, key, value) < 0;
    }
    if (bad) {
        Py_DECREF(exc);
        return NULL;
    }
    PyErr_SetObject(cls, exc);
    Py_DECREF(exc);
    return NULL;
}

PyObject *pkvpy_raise(pkv_status status, const char *what, const char *detail_fmt, ...) {
    char detail[384] = "";
    if (detail_fmt) {
        va_list ap;
        va_start(ap, detail_fmt);
        vsnprintf(detail, sizeof detail, detail_fmt, ap);
        va_end(ap);
    }
    char message[640];
    if (detail[0])
        snprintf(message, sizeof message, "%s: %s: %s", what, pkv_status_str(status), detail);
    else
        snprintf(message, sizeof message, "%s: %s", what, pkv_status_str(status));
    return raise_with(status, message, detail, NULL);
}

PyObject *pkvpy_raise_trace(pkv_status status, const char *what, const pkv_trace_error *err) {
    char message[768];
    if (err->line)
        snprintf(message, sizeof message, "%s: %s:%llu:%s: %s", what, err->file,
                 (unsigned long long)err->line, err->field, err->message);
    else
        snprintf(message, sizeof message, "%s: %s: %s%s%s", what, err->file, err->field,
                 err->field[0] ? ": " : "", err->message);
    PyObject *extra = Py_BuildValue("{s:s,s:K,s:s}", "file", err->file, "line",
                                    (unsigned long long)err->line, "field", err->field);
    if (!extra)
        return NULL;
    raise_with(status, message, err->message, extra);
    Py_DECREF(extra);
    return NULL;
}

// An integer argument (anything with __index__), shared by both modules: a
// non-integer raises InvalidArgument naming `what`.
int pkvpy_index(PyObject *obj, const char *what, const char *not_int, long long *v,
                int *overflow) {
    if (!PyIndex_Check(obj)) {
        pkvpy_raise(PKV_ERR_INVALID_ARG, what, "%s, got %s", not_int, Py_TYPE(obj)->tp_name);
        return -1;
    }
    PyObject *idx = PyNumber_Index(obj);
    if (!idx)
        return -1;
    *overflow = 0;
    *v = PyLong_AsLongLongAndOverflow(idx, overflow);
    Py_DECREF(idx);
    return *v == -1 && PyErr_Occurred() ? -1 : 0;
}

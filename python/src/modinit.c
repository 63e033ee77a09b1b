// SPDX-License-Identifier: MIT
// Helpers of the two modules' init functions (module.c, testbed.c): add a type, and a
// tuple of names.
#include "pkvpy.h"

int pkvpy_add_type(PyObject *m, const char *name, PyTypeObject *type) {
    if (PyType_Ready(type) < 0)
        return -1;
    Py_INCREF(type);
    if (PyModule_AddObject(m, name, (PyObject *)type) < 0) {
        Py_DECREF(type);
        return -1;
    }
    return 0;
}

// A tuple of the strings of a NULL-terminated array (pagedkv.POLICIES and the presets).
PyObject *pkvpy_names(const char *const *list) {
    PyObject *t = PyList_New(0);
    for (; t && *list; list++) {
        PyObject *s = PyUnicode_FromString(*list);
        if (!s || PyList_Append(t, s) < 0) {
            Py_XDECREF(s);
            Py_CLEAR(t);
            break;
        }
        Py_DECREF(s);
    }
    if (!t)
        return NULL;
    PyObject *tuple = PyList_AsTuple(t);
    Py_DECREF(t);
    return tuple;
}


// SPDX-License-Identifier: MIT
// Module pagedkv._core: registers the types, the exceptions and the module functions.
// The public surface is re-exported, with the pure-Python helpers, by pagedkv/__init__.py.
#define PKVPY_MAIN
#include "pkvpy.h"

#include "pkv_config.h"
#include "pkv/version.h"

static PyObject *status_str(PyObject *m, PyObject *arg) {
    long code = PyLong_AsLong(arg);
    if (code == -1 && PyErr_Occurred())
        return NULL;
    return PyUnicode_FromString(pkv_status_str((pkv_status)code));
}

static PyMethodDef module_functions[] = {
    {"status_str", (PyCFunction)status_str, METH_O, "status_str(code) -> the status's name."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module_def = {
    PyModuleDef_HEAD_INIT, "pagedkv._core",
    "C extension of pagedkv: the allocator (BlockPool, SeqSet, PrefixCache, KVCache) and the "
    "replay testbed. Import pagedkv, not this module.",
    -1, module_functions, NULL, NULL, NULL, NULL,
};

// A tuple of the strings of a NULL-terminated array.
static PyObject *names(const char *const *list) {
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

static int add_type(PyObject *m, const char *name, PyTypeObject *type) {
    if (PyType_Ready(type) < 0)
        return -1;
    Py_INCREF(type);
    if (PyModule_AddObject(m, name, (PyObject *)type) < 0) {
        Py_DECREF(type);
        return -1;
    }
    return 0;
}

static int add_flag(PyObject *m, const char *name, int value) {
    return PyModule_AddObject(m, name, PyBool_FromLong(value));
}

PyMODINIT_FUNC PyInit__core(void) {
    import_array();
    PyObject *m = PyModule_Create(&module_def);
    if (!m)
        return NULL;
    const char *policies[PKV_POLICY_COUNT + 1];
    for (int i = 0; i < PKV_POLICY_COUNT; i++)
        policies[i] = pkv_policy_name((pkv_policy)i);
    policies[PKV_POLICY_COUNT] = NULL;
    int have_batch = 0;
#if defined(PKVPY_HAVE_PKV_SEQSET_APPEND_BATCH) && defined(PKVPY_HAVE_PKV_SEQSET_BLOCKS_NEEDED_BATCH)
    have_batch = 1;
#endif
    if (pkvpy_errors_init(m) < 0 || add_type(m, "BlockPool", &pkvpy_Pool_Type) < 0 ||
        add_type(m, "SeqSet", &pkvpy_SeqSet_Type) < 0 ||
        add_type(m, "PrefixCache", &pkvpy_Prefix_Type) < 0 ||
        add_type(m, "KVCache", &pkvpy_KVCache_Type) < 0 ||
        add_type(m, "Trace", &pkvpy_Trace_Type) < 0 || pkvpy_seqset_init_types(m) < 0 ||
        pkvpy_trace_init(m) < 0 || pkvpy_prefix_pool_init(m) < 0 ||
        PyModule_AddFunctions(m, pkvpy_trace_functions) < 0 ||
        PyModule_AddFunctions(m, pkvpy_sweep_functions) < 0 ||
        PyModule_AddStringConstant(m, "__version__", PKV_VERSION_STRING) < 0 ||
        PyModule_AddObject(m, "POLICIES", names(policies)) < 0 ||
        PyModule_AddObject(m, "MODEL_PRESETS", names(pkv_model_preset_names())) < 0 ||
        PyModule_AddObject(m, "GPU_PRESETS", names(pkv_gpu_preset_names())) < 0 ||
        add_flag(m, "HAVE_CUDA", PKV_HAVE_CUDA) < 0 || add_flag(m, "HAVE_BATCH", have_batch) < 0 ||
        PyModule_AddIntConstant(m, "POOL_MAX_BLOCKS", PKV_POOL_MAX_BLOCKS) < 0) {
        Py_DECREF(m);
        return NULL;
    }
    return m;
}

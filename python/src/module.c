// SPDX-License-Identifier: MIT
// Module pagedkv._core: the allocator's types (BlockPool, SeqSet, PrefixCache, KVCache),
// the exceptions and status_str. It links libpagedkv-core only, so importing pagedkv
// needs libc and numpy; the testbed is pagedkv._testbed (testbed.c), loaded on first use.
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
    "C extension of pagedkv: the allocator (BlockPool, SeqSet, PrefixCache, KVCache). "
    "Import pagedkv, not this module.",
    -1, module_functions, NULL, NULL, NULL, NULL,
};

static int add_flag(PyObject *m, const char *name, int value) {
    return PyModule_AddObject(m, name, PyBool_FromLong(value));
}

PyMODINIT_FUNC PyInit__core(void) {
    import_array();
    PyObject *m = PyModule_Create(&module_def);
    if (!m)
        return NULL;
    int have_batch = 0;
#if defined(PKVPY_HAVE_PKV_SEQSET_APPEND_BATCH) && defined(PKVPY_HAVE_PKV_SEQSET_BLOCKS_NEEDED_BATCH)
    have_batch = 1;
#endif
    if (pkvpy_errors_init(m) < 0 || pkvpy_add_type(m, "BlockPool", &pkvpy_Pool_Type) < 0 ||
        pkvpy_add_type(m, "SeqSet", &pkvpy_SeqSet_Type) < 0 ||
        pkvpy_add_type(m, "PrefixCache", &pkvpy_Prefix_Type) < 0 ||
        pkvpy_add_type(m, "KVCache", &pkvpy_KVCache_Type) < 0 || pkvpy_seqset_init_types(m) < 0 ||
        pkvpy_prefix_pool_init(m) < 0 || pkvpy_hybrid_init(m) < 0 ||
        PyModule_AddStringConstant(m, "__version__", PKV_VERSION_STRING) < 0 ||
        add_flag(m, "HAVE_CUDA", PKV_HAVE_CUDA) < 0 || add_flag(m, "HAVE_BATCH", have_batch) < 0 ||
        PyModule_AddIntConstant(m, "POOL_MAX_BLOCKS", PKV_POOL_MAX_BLOCKS) < 0) {
        Py_DECREF(m);
        return NULL;
    }
    return m;
}

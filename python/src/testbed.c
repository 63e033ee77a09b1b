// SPDX-License-Identifier: MIT
// Module pagedkv._testbed: traces and the replay (Trace, load_trace, parse_trace,
// generate_trace, replay, HybridVMM, and _replay_cli: pkv-replay's own code for pagedkv.sweep),
// against the full libpagedkv, whose CPU decoder needs BLAS and
// OpenMP. pagedkv/__init__.py imports it on the first use of one of its names, so an
// engine that only uses the allocator (pagedkv._core) never loads those libraries.
// Errors are raised as pagedkv._core's exception classes.
#define PKVPY_MAIN
#include "pkvpy.h"

static struct PyModuleDef module_def = {
    PyModuleDef_HEAD_INIT, "pagedkv._testbed",
    "C extension of pagedkv: traces and the replay testbed. Import pagedkv, not this module.",
    -1, NULL, NULL, NULL, NULL, NULL,
};

PyMODINIT_FUNC PyInit__testbed(void) {
    import_array();
    if (pkvpy_errors_import("pagedkv._core") < 0)
        return NULL;
    PyObject *m = PyModule_Create(&module_def);
    if (!m)
        return NULL;
    const char *policies[PKV_POLICY_COUNT + 1];
    for (int i = 0; i < PKV_POLICY_COUNT; i++)
        policies[i] = pkv_policy_name((pkv_policy)i);
    policies[PKV_POLICY_COUNT] = NULL;
    if (pkvpy_add_type(m, "Trace", &pkvpy_Trace_Type) < 0 || pkvpy_trace_init(m) < 0 ||
        pkvpy_hybrid_vmm_init(m) < 0 ||
        PyModule_AddFunctions(m, pkvpy_trace_functions) < 0 ||
        PyModule_AddFunctions(m, pkvpy_sweep_functions) < 0 ||
        PyModule_AddObject(m, "POLICIES", pkvpy_names(policies)) < 0 ||
        PyModule_AddObject(m, "MODEL_PRESETS", pkvpy_names(pkv_model_preset_names())) < 0 ||
        PyModule_AddObject(m, "GPU_PRESETS", pkvpy_names(pkv_gpu_preset_names())) < 0) {
        Py_DECREF(m);
        return NULL;
    }
    return m;
}

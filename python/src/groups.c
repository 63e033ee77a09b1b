// SPDX-License-Identifier: MIT
// A KV cache group from its Python dict, shared by HybridKV (_core) and HybridVMM
// (_testbed): both modules compile this file.
#include "pkvpy.h"

#include <string.h>

const char *const pkvpy_kind_names[5] = {"full", "sliding", "chunked", "mla", "state"};

// An unsigned field of a group dict; absent: *out keeps its default. -1 on error.
static int dict_u64(PyObject *d, const char *key, uint64_t *out, uint64_t max, Py_ssize_t g,
                    const char *what) {
    PyObject *v = PyDict_GetItemString(d, key); // borrowed
    if (!v) return 0;
    long long x;
    int overflow = 0;
    if (pkvpy_index(v, what, "a group field must be an integer", &x, &overflow) < 0) return -1;
    if (overflow || x < 0 || (unsigned long long)x > max) {
        pkvpy_raise(PKV_ERR_INVALID_ARG, what, "group %zd: %s must be in 0..%llu", g, key,
                    (unsigned long long)max);
        return -1;
    }
    *out = (uint64_t)x;
    return 0;
}

int pkvpy_group_from(PyObject *d, Py_ssize_t g, pkv_kv_group *out, const char *what) {
    if (!PyDict_Check(d)) {
        pkvpy_raise(PKV_ERR_INVALID_ARG, what, "group %zd must be a dict (kind, layers, ...)", g);
        return -1;
    }
    static const char *const known[] = {"kind", "layers", "kv_heads", "head_dim", "window",
                                        "latent_dim", "rope_dim", "sinks", "state_bytes", NULL};
    PyObject *key, *val;
    Py_ssize_t pos = 0;
    while (PyDict_Next(d, &pos, &key, &val)) {
        const char *k = PyUnicode_Check(key) ? PyUnicode_AsUTF8(key) : NULL;
        int ok = 0;
        for (int i = 0; k && known[i]; i++) ok |= strcmp(k, known[i]) == 0;
        if (!ok) {
            pkvpy_raise(PKV_ERR_INVALID_ARG, what, "group %zd: unknown field '%s' (fields: kind, "
                        "layers, kv_heads, head_dim, window, latent_dim, rope_dim, sinks, state_bytes)",
                        g, k ? k : "(not a string)");
            return -1;
        }
    }
    memset(out, 0, sizeof *out);
    PyObject *kind = PyDict_GetItemString(d, "kind");
    const char *kname = kind && PyUnicode_Check(kind) ? PyUnicode_AsUTF8(kind) : NULL;
    int k = 0;
    while (kname && k < 5 && strcmp(kname, pkvpy_kind_names[k]) != 0) k++;
    if (!kname || k == 5) {
        pkvpy_raise(PKV_ERR_INVALID_ARG, what,
                    "group %zd: kind must be 'full', 'sliding', 'chunked', 'mla' or 'state'", g);
        return -1;
    }
    out->kind = (pkv_layer_kind)k;
    uint64_t layers = 0, heads = 0, dim = 0, window = 0, latent = 0, rope = 0, sinks = 0;
    if (dict_u64(d, "layers", &layers, UINT32_MAX, g, what) < 0 || dict_u64(d, "kv_heads", &heads, UINT32_MAX, g, what) < 0 ||
        dict_u64(d, "head_dim", &dim, UINT32_MAX, g, what) < 0 || dict_u64(d, "window", &window, UINT32_MAX, g, what) < 0 ||
        dict_u64(d, "latent_dim", &latent, UINT32_MAX, g, what) < 0 || dict_u64(d, "rope_dim", &rope, UINT32_MAX, g, what) < 0 ||
        dict_u64(d, "sinks", &sinks, 1, g, what) < 0 || dict_u64(d, "state_bytes", &out->state_bytes, UINT64_MAX, g, what) < 0)
        return -1;
    out->num_layers = (uint32_t)layers;
    out->num_kv_heads = (uint32_t)heads;
    out->head_dim = (uint32_t)dim;
    out->window = (uint32_t)window;
    out->latent_dim = (uint32_t)latent;
    out->rope_dim = (uint32_t)rope;
    out->sinks = (uint32_t)sinks;
    return 0;
}

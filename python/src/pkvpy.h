// SPDX-License-Identifier: MIT
// The Python extensions: pagedkv._core (the allocator, against libpagedkv-core: libc and
// numpy only) and pagedkv._testbed (traces and replay, against the full libpagedkv).
// One object type per pagedkv handle, each owning
// its handle and holding a reference to every object its handle borrows (a SeqSet
// keeps its BlockPool alive, an attached SeqSet keeps its PrefixCache alive), so that
// Python's reference counting destroys handles in the order the C API requires.
// Errors become the typed exceptions of errors.c. Arrays cross as numpy arrays:
// inputs are borrowed when they already have the C type and are C-contiguous,
// outputs are new arrays the C calls write into.
#ifndef PKVPY_H
#define PKVPY_H

#define PY_SSIZE_T_CLEAN
#include <Python.h>
#define NPY_NO_DEPRECATED_API NPY_1_7_API_VERSION
#define PY_ARRAY_UNIQUE_SYMBOL pkvpy_ARRAY_API
#ifndef PKVPY_MAIN
#define NO_IMPORT_ARRAY
#endif
#include <numpy/arrayobject.h>

#include <stdint.h>

#include "pkv/pkv.h"

// ---- object layouts ----

typedef struct {
    PyObject_HEAD
    pkv_pool *pool;
} PoolObject;

typedef struct {
    PyObject_HEAD
    pkv_seqset *set;
    PyObject *pool;   // the BlockPool (strong reference: the set borrows its pool)
    PyObject *prefix; // the PrefixCache it is attached to, or NULL (strong)
} SeqSetObject;

typedef struct {
    PyObject_HEAD
    pkv_prefix_cache *cache;
    PyObject *pool; // strong
    uint32_t block_size;
} PrefixObject;

// A tensor of the caller's (KVCache(buffer=...)), imported by tensor.c: its memory,
// shape, strides and dtype, and the references that keep it alive.
#define PKVPY_TENSOR_MAX_DIMS 8
typedef struct {
    void *data;                            // first element (byte_offset applied)
    int cuda;                              // device memory (CUDA or CUDA managed)
    int device_id;                         // CUDA ordinal; -1: not said (CUDA array interface)
    int ndim;
    int64_t shape[PKVPY_TENSOR_MAX_DIMS];
    int64_t strides[PKVPY_TENSOR_MAX_DIMS]; // in elements
    char kind;                             // 'f' float, 'b' bfloat, 'u' uint, 'i' int, '?'
    int bits;
    void *managed;       // the consumed DLManagedTensor (its deleter runs on release)
    Py_buffer view;      // buffer-protocol import
    int has_view;
    PyObject *cai_stream; // __cuda_array_interface__'s producer stream, or NULL (strong)
    PyObject *owner;      // the object itself (strong)
} pkvpy_tensor;

typedef struct {
    PyObject_HEAD
    pkv_cache *cache;     // caches[0]
    pkv_cache **caches;   // one per layer for a list of per-layer tensors, else &cache
    uint32_t num_caches;
    pkv_backend *backend; // owned: one backend per cache
    PyObject *pool;       // strong
    pkvpy_tensor *tensors; // the caller's memory of an external cache (buffer=...)
    uint32_t num_tensors;
    pkv_cache_params params;
    int ndim;
    // [layers][blocks][2][heads][block][dim] (HND), NHD or KV_NHD order; a per-layer
    // cache drops the leading [layers].
    Py_ssize_t shape[6];
    Py_ssize_t strides[6]; // bytes
} KVCacheObject;

typedef struct {
    PyObject_HEAD
    pkv_trace *trace;
} TraceObject;

extern PyTypeObject pkvpy_Pool_Type;
extern PyTypeObject pkvpy_SeqSet_Type;
extern PyTypeObject pkvpy_Prefix_Type;
extern PyTypeObject pkvpy_KVCache_Type;
extern PyTypeObject pkvpy_Trace_Type;

// ---- modinit.c ----

// PyType_Ready and add `type` to module `m` as `name`. 0 on success.
int pkvpy_add_type(PyObject *m, const char *name, PyTypeObject *type);
// A new tuple of the strings of a NULL-terminated array, or NULL with an exception set.
PyObject *pkvpy_names(const char *const *list);

// ---- errors.c ----

// Create the exception classes and add them to the module. 0 on success.
int pkvpy_errors_init(PyObject *module);
// Use the classes that pkvpy_errors_init made in module `module_name` (pagedkv._core),
// so that a second extension module raises the same classes. 0 on success.
int pkvpy_errors_import(const char *module_name);
// Raise the exception class of `status` with message "<what>: <status name>[: detail]",
// and attributes status (int), status_name, detail. Returns NULL.
PyObject *pkvpy_raise(pkv_status status, const char *what, const char *detail_fmt, ...);
// Raise FormatError / FileError from a trace loader error (file, line, field, message).
PyObject *pkvpy_raise_trace(pkv_status status, const char *what, const pkv_trace_error *err);

// ---- convert.c ----

// A 1-D C-contiguous array of `typenum` (NPY_INT32, NPY_UINT32, NPY_INT64) holding the
// integers of `obj`: `obj` itself when it already is one (no copy), else a checked
// conversion (every value must fit the type, else pagedkv.InvalidArgument naming
// `what`). New reference, or NULL with an exception set.
PyArrayObject *pkvpy_int_vector(PyObject *obj, int typenum, const char *what);
// A Python int that fits uint32 (`what` names it in the error). 0 ok, -1 error.
// A Python integer (anything with __index__) as a long long; *overflow set when it
// does not fit. Not an integer: `what` raises "<not_int>, got <type>". -1 on error.
int pkvpy_index(PyObject *obj, const char *what, const char *not_int, long long *v,
                int *overflow);
int pkvpy_u32(PyObject *obj, uint32_t *out, const char *what);
// New 1-D / 2-D arrays (uninitialized). NULL with MemoryError set.
PyArrayObject *pkvpy_new_vector(npy_intp n, int typenum);
PyArrayObject *pkvpy_new_matrix(npy_intp rows, npy_intp cols, int typenum);
// An (n, 2) int32 array of block copies, copied from pairs[0..n-1].
PyObject *pkvpy_copies_array(const pkv_block_copy *pairs, uint32_t n);
// Borrow an (n, 2) int32 array of block pairs from `obj` (new reference; *n set).
PyArrayObject *pkvpy_pairs_array(PyObject *obj, uint32_t *n);

// ---- tensor.c ----

// Import `obj` (DLPack producer, __cuda_array_interface__, or buffer): fills *t, which
// pkvpy_tensor_release frees. `stream` (may be NULL) is handed to a CUDA DLPack
// producer. 0, or -1 with an exception set (`what` names the caller).
int pkvpy_tensor_import(PyObject *obj, PyObject *stream, pkvpy_tensor *t, const char *what);
void pkvpy_tensor_release(pkvpy_tensor *t);
// 0 if *t has exactly `shape` and is C-contiguous, else InvalidArgument naming the
// difference and `layout`; -1.
int pkvpy_tensor_check(const pkvpy_tensor *t, const int64_t *shape, int ndim,
                       const char *layout, const char *what);

// ---- seqset.c ----

// The StepResult type, added to the module. 0 on success.
int pkvpy_seqset_init_types(PyObject *module);

// ---- trace.c ----

// Module-level functions: load_trace, parse_trace, make_trace, generate_trace, replay_json.
extern PyMethodDef pkvpy_trace_functions[];
// _replay_cli: the pkv-replay tool in a child process (sweep.c, for pagedkv.sweep).
extern PyMethodDef pkvpy_sweep_functions[];
// TRACE_DTYPE (the structured dtype of pkv_trace_request), added to the module.
int pkvpy_trace_init(PyObject *module);

// ---- prefix.c ----
// Token ids as a 1-D int32 array (pkvpy_int_vector) of at most 2**32 - 1 entries.
// New reference, or NULL with an exception set.
PyArrayObject *pkvpy_tokens(PyObject *obj, const char *what);

// ---- prefix_pool.c ----

// PrefixPool, BlockHasher and HASH_ALGOS, added to the module. 0 on success.
int pkvpy_prefix_pool_init(PyObject *module);
// KV events (prefix_pool.h's pkv_kv_event, borrowed) as a new list of tuples:
//   ("BlockStored", hashes, parent|None, token_ids, block_size, lora_id|None, medium, group)
//   ("BlockRemoved", hashes, medium, group), ("AllBlocksCleared", medium), ("Overflow", n).
// NULL with an exception set on failure. Needs pkvpy_prefix_pool_init to have run.
PyObject *pkvpy_events_list(const pkv_kv_event *events, uint32_t n);
// pkv_medium from "GPU", "CPU" or "DISK"; -1 with InvalidArgument naming `what` else.
int pkvpy_medium(const char *name, const char *what, pkv_medium *medium);

// ---- hybrid.c ----

// HybridKV and HybridStep (the hybrid KV manager), added to the module. 0 on success.
int pkvpy_hybrid_init(PyObject *module);

// ---- groups.c (compiled into both modules) ----

// One KV cache group from its dict (kind, layers, kv_heads, head_dim, window,
// latent_dim, rope_dim, sinks, state_bytes); -1 with an exception naming group g.
int pkvpy_group_from(PyObject *d, Py_ssize_t g, pkv_kv_group *out, const char *what);
extern const char *const pkvpy_kind_names[5]; // by pkv_layer_kind

// ---- hybrid_vmm.c ----

// HybridVMM (include/pkv/hybrid_vmm.h), added to _testbed (the VMM spaces live in
// the full library, not the allocator core). 0 on success.
int pkvpy_hybrid_vmm_init(PyObject *module);

#endif // PKVPY_H

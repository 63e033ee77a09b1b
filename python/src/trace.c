// SPDX-License-Identifier: MIT
// The testbed from Python: pagedkv.Trace (owns a pkv_trace; its requests are a
// read-only structured numpy view), the trace loaders and generator, and the replay
// entry point, which runs each policy with the GIL released and returns the report in
// the library's own JSON (pkv_replay_write_json), so Python sees exactly the keys the
// pkv-replay tool writes.
#include "pkvpy.h"

#include <math.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static PyArray_Descr *request_descr; // the structured dtype of pkv_trace_request

static PyObject *trace_wrap(pkv_trace *t) {
    TraceObject *self = PyObject_New(TraceObject, &pkvpy_Trace_Type);
    if (!self) {
        pkv_trace_destroy(t);
        return NULL;
    }
    self->trace = t;
    return (PyObject *)self;
}

static void Trace_dealloc(TraceObject *self) {
    pkv_trace_destroy(self->trace);
    PyObject_Free(self);
}

static Py_ssize_t Trace_len(TraceObject *self) { return (Py_ssize_t)pkv_trace_count(self->trace); }

static PyObject *Trace_get_requests(TraceObject *self, void *c) {
    npy_intp dims[1] = {(npy_intp)pkv_trace_count(self->trace)};
    Py_INCREF(request_descr);
    PyObject *a = PyArray_NewFromDescr(&PyArray_Type, request_descr, 1, dims, NULL,
                                       (void *)pkv_trace_requests(self->trace), 0, NULL);
    if (!a)
        return NULL;
    Py_INCREF(self); // read-only view of the trace's own array
    if (PyArray_SetBaseObject((PyArrayObject *)a, (PyObject *)self) < 0) {
        Py_DECREF(a);
        return NULL;
    }
    return a;
}

static PyObject *Trace_get_format(TraceObject *self, void *c) {
    return PyUnicode_FromString(pkv_trace_format_name(pkv_trace_get_format(self->trace)));
}
static PyObject *Trace_get_skipped(TraceObject *self, void *c) {
    return PyLong_FromUnsignedLongLong(pkv_trace_skipped(self->trace));
}

static PyObject *Trace_save(TraceObject *self, PyObject *arg) {
    PyObject *bytes;
    if (!PyUnicode_FSConverter(arg, &bytes))
        return NULL;
    pkv_status st = pkv_trace_save(self->trace, PyBytes_AS_STRING(bytes));
    PyObject *r = st == PKV_OK ? Py_None : pkvpy_raise(st, "Trace.save", "'%s'",
                                                       PyBytes_AS_STRING(bytes));
    Py_DECREF(bytes);
    Py_XINCREF(r);
    return r;
}

static PyObject *Trace_repr(TraceObject *self) {
    return PyUnicode_FromFormat("Trace(%zu requests, format=%s)", pkv_trace_count(self->trace),
                                pkv_trace_format_name(pkv_trace_get_format(self->trace)));
}

static PyMethodDef Trace_methods[] = {
    {"save", (PyCFunction)Trace_save, METH_O, "save(path): write the native CSV format."},
    {NULL, NULL, 0, NULL},
};

static PyGetSetDef Trace_getset[] = {
    {"requests", (getter)Trace_get_requests, NULL,
     "read-only structured array (arrival_s, prompt_tokens, output_tokens, n, prefix_group,\n"
     "prefix_tokens, request_id), sorted by arrival; a view of the trace, no copy", NULL},
    {"format", (getter)Trace_get_format, NULL, "the file format it was read from", NULL},
    {"skipped", (getter)Trace_get_skipped, NULL, "rows skipped with skip_bad=True", NULL},
    {NULL, NULL, NULL, NULL, NULL},
};

static PySequenceMethods Trace_as_sequence = {.sq_length = (lenfunc)Trace_len};

PyTypeObject pkvpy_Trace_Type = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "pagedkv.Trace",
    .tp_basicsize = sizeof(TraceObject),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "A validated request trace (load_trace, parse_trace, make_trace, generate_trace).",
    .tp_dealloc = (destructor)Trace_dealloc,
    .tp_methods = Trace_methods,
    .tp_getset = Trace_getset,
    .tp_repr = (reprfunc)Trace_repr,
    .tp_as_sequence = &Trace_as_sequence,
};

// ---- module functions ----

static int parse_format(const char *s, pkv_trace_format *f) {
    for (int i = PKV_TRACE_AUTO; i <= PKV_TRACE_MOONCAKE; i++)
        if (!strcmp(s, pkv_trace_format_name((pkv_trace_format)i))) {
            *f = (pkv_trace_format)i;
            return 0;
        }
    pkvpy_raise(PKV_ERR_INVALID_ARG, "trace format", "'%s' is not auto, native, azure, "
                "burstgpt or mooncake", s);
    return -1;
}

static PyObject *load_trace(PyObject *m, PyObject *args, PyObject *kw) {
    static char *kwlist[] = {"path", "format", "skip_bad", NULL};
    PyObject *path;
    const char *format = "auto";
    int skip_bad = 0;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "O&|$sp:load_trace", kwlist, PyUnicode_FSConverter,
                                     &path, &format, &skip_bad))
        return NULL;
    pkv_trace_load_options o = pkv_trace_load_options_default();
    o.skip_bad = skip_bad;
    if (parse_format(format, &o.format) < 0) {
        Py_DECREF(path);
        return NULL;
    }
    pkv_trace *t = NULL;
    pkv_trace_error err;
    memset(&err, 0, sizeof err);
    pkv_status st;
    Py_BEGIN_ALLOW_THREADS
    st = pkv_trace_load(PyBytes_AS_STRING(path), &o, &t, &err);
    Py_END_ALLOW_THREADS
    Py_DECREF(path);
    if (st != PKV_OK)
        return pkvpy_raise_trace(st, "load_trace", &err);
    return trace_wrap(t);
}

static PyObject *parse_trace(PyObject *m, PyObject *args, PyObject *kw) {
    static char *kwlist[] = {"text", "name", "format", "skip_bad", NULL};
    const char *text, *name = "<string>", *format = "auto";
    Py_ssize_t len;
    int skip_bad = 0;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "s#|s$sp:parse_trace", kwlist, &text, &len, &name,
                                     &format, &skip_bad))
        return NULL;
    pkv_trace_load_options o = pkv_trace_load_options_default();
    o.skip_bad = skip_bad;
    if (parse_format(format, &o.format) < 0)
        return NULL;
    pkv_trace *t = NULL;
    pkv_trace_error err;
    memset(&err, 0, sizeof err);
    pkv_status st = pkv_trace_parse(text, (size_t)len, name, &o, &t, &err);
    if (st != PKV_OK)
        return pkvpy_raise_trace(st, "parse_trace", &err);
    return trace_wrap(t);
}

static PyObject *make_trace(PyObject *m, PyObject *arg) {
    if (!PyArray_Check(arg) || !PyArray_EquivTypes(PyArray_DESCR((PyArrayObject *)arg),
                                                   request_descr) ||
        PyArray_NDIM((PyArrayObject *)arg) != 1)
        return pkvpy_raise(PKV_ERR_INVALID_ARG, "make_trace", "expected a 1-D array of "
                           "pagedkv.TRACE_DTYPE (use pagedkv.make_trace(arrival_s=..., ...))");
    PyArrayObject *a = (PyArrayObject *)PyArray_FromAny(arg, NULL, 1, 1, NPY_ARRAY_CARRAY_RO, NULL);
    if (!a)
        return NULL;
    pkv_trace *t = NULL;
    pkv_trace_error err;
    memset(&err, 0, sizeof err);
    pkv_status st = pkv_trace_create(PyArray_DATA(a), (size_t)PyArray_DIM(a, 0), &t, &err);
    Py_DECREF(a);
    if (st != PKV_OK)
        return pkvpy_raise_trace(st, "make_trace", &err);
    return trace_wrap(t);
}

// ---- keyword parameters into C structs, one table per struct ----

enum kind { K_U32, K_U64, K_F64, K_BOOL };
struct field {
    const char *name;
    enum kind kind;
    size_t offset;
};

static int set_field(void *base, const struct field *f, PyObject *v, const char *what) {
    char *p = (char *)base + f->offset;
    if (f->kind == K_F64) {
        double d = PyFloat_AsDouble(v);
        if (d == -1.0 && PyErr_Occurred()) {
            PyErr_Clear();
            pkvpy_raise(PKV_ERR_INVALID_ARG, what, "%s must be a number", f->name);
            return -1;
        }
        memcpy(p, &d, sizeof d);
        return 0;
    }
    if (f->kind == K_BOOL) {
        int b = PyObject_IsTrue(v);
        if (b < 0)
            return -1;
        memcpy(p, &b, sizeof b);
        return 0;
    }
    if (!PyIndex_Check(v)) {
        pkvpy_raise(PKV_ERR_INVALID_ARG, what, "%s must be an integer", f->name);
        return -1;
    }
    PyObject *idx = PyNumber_Index(v);
    if (!idx)
        return -1;
    unsigned long long u = PyLong_AsUnsignedLongLong(idx);
    Py_DECREF(idx);
    if (PyErr_Occurred() || (f->kind == K_U32 && u > UINT32_MAX)) {
        PyErr_Clear();
        pkvpy_raise(PKV_ERR_INVALID_ARG, what, "%s out of range for a %s", f->name,
                    f->kind == K_U32 ? "uint32" : "uint64");
        return -1;
    }
    if (f->kind == K_U32) {
        uint32_t x = (uint32_t)u;
        memcpy(p, &x, sizeof x);
    } else {
        uint64_t x = (uint64_t)u;
        memcpy(p, &x, sizeof x);
    }
    return 0;
}

static const struct field *find_field(const struct field *table, const char *name) {
    for (; table->name; table++)
        if (!strcmp(table->name, name))
            return table;
    return NULL;
}

#define TG(name, kind) {#name, kind, offsetof(pkv_tracegen_params, name)}
static const struct field tracegen_fields[] = {
    TG(seed, K_U64), TG(num_requests, K_U64), TG(rate_rps, K_F64), TG(burst_cv, K_F64),
    TG(prompt_median, K_F64), TG(prompt_sigma, K_F64), TG(prompt_max, K_U32),
    TG(output_median, K_F64), TG(output_sigma, K_F64), TG(output_max, K_U32),
    TG(parallel_frac, K_F64), TG(n_min, K_U32), TG(n_max, K_U32), TG(prefix_frac, K_F64),
    TG(prefix_groups, K_U32), TG(prefix_tokens, K_U32), {NULL, K_U32, 0},
};

static PyObject *generate_trace(PyObject *m, PyObject *args, PyObject *kw) {
    if (PyTuple_GET_SIZE(args))
        return pkvpy_raise(PKV_ERR_INVALID_ARG, "generate_trace", "keyword arguments only");
    pkv_tracegen_params p = pkv_tracegen_params_default();
    PyObject *key, *value;
    Py_ssize_t pos = 0;
    while (kw && PyDict_Next(kw, &pos, &key, &value)) {
        const char *k = PyUnicode_AsUTF8(key);
        if (!k)
            return NULL;
        if (!strcmp(k, "arrival")) {
            const char *s = PyUnicode_Check(value) ? PyUnicode_AsUTF8(value) : NULL;
            if (s && !strcmp(s, "poisson")) p.arrival = PKV_ARRIVAL_POISSON;
            else if (s && !strcmp(s, "bursty")) p.arrival = PKV_ARRIVAL_BURSTY;
            else return pkvpy_raise(PKV_ERR_INVALID_ARG, "generate_trace",
                                    "arrival must be 'poisson' or 'bursty'");
            continue;
        }
        const struct field *f = find_field(tracegen_fields, k);
        if (!f)
            return pkvpy_raise(PKV_ERR_INVALID_ARG, "generate_trace", "unknown parameter '%s'", k);
        if (set_field(&p, f, value, "generate_trace") < 0)
            return NULL;
    }
    pkv_trace *t = NULL;
    pkv_status st;
    Py_BEGIN_ALLOW_THREADS
    st = pkv_trace_generate(&p, &t);
    Py_END_ALLOW_THREADS
    if (st != PKV_OK)
        return pkvpy_raise(st, "generate_trace", "a parameter is out of its documented range "
                           "(include/pkv/trace.h)");
    return trace_wrap(t);
}

#define RP(name, kind) {#name, kind, offsetof(pkv_replay_params, name)}
static const struct field replay_fields[] = {
    RP(block_size, K_U32), RP(max_seq_len, K_U32), RP(max_batch, K_U32),
    RP(max_tokens_per_step, K_U32), RP(watermark, K_F64), RP(gpu_util, K_F64),
    RP(dtype_bytes, K_U32), RP(swap_space_bytes, K_U64), RP(chunked_prefill, K_U32),
    RP(load_scale, K_F64), RP(prefix_sharing, K_BOOL),
    RP(run_cuda, K_BOOL), RP(run_threads, K_U32), RP(seed, K_U64), RP(validate, K_BOOL),
    {NULL, K_U32, 0},
};

static const char *str_value(PyObject *v) {
    return PyUnicode_Check(v) ? PyUnicode_AsUTF8(v) : NULL;
}

static int replay_params(PyObject *kw, pkv_replay_params *p) {
    *p = pkv_replay_params_default();
    PyObject *key, *value;
    Py_ssize_t pos = 0;
    const char *what = "replay";
    while (kw && PyDict_Next(kw, &pos, &key, &value)) {
        const char *k = PyUnicode_AsUTF8(key), *s;
        if (!k)
            return -1;
        pkv_status st;
        if (!strcmp(k, "mode")) {
            s = str_value(value);
            if (s && !strcmp(s, "sim")) p->mode = PKV_REPLAY_SIM;
            else if (s && !strcmp(s, "run")) p->mode = PKV_REPLAY_RUN;
            else goto bad_choice;
        } else if (!strcmp(k, "preempt")) {
            s = str_value(value);
            if (s && !strcmp(s, "recompute")) p->preempt = PKV_PREEMPT_RECOMPUTE;
            else if (s && !strcmp(s, "swap")) p->preempt = PKV_PREEMPT_SWAP;
            else goto bad_choice;
        } else if (!strcmp(k, "batching")) {
            s = str_value(value);
            if (s && !strcmp(s, "continuous")) p->batching = PKV_BATCHING_CONTINUOUS;
            else if (s && !strcmp(s, "static")) p->batching = PKV_BATCHING_STATIC;
            else goto bad_choice;
        } else if (!strcmp(k, "alloc_call_us")) {
            // The simplest cost model, as pkv-replay --alloc-call-us: N us per call.
            const double us = PyFloat_AsDouble(value);
            if (us == -1.0 && PyErr_Occurred())
                return -1;
            if (!(us >= 0) || !isfinite(us)) {
                pkvpy_raise(PKV_ERR_INVALID_ARG, what, "alloc_call_us must be a finite "
                            "number >= 0");
                return -1;
            }
            p->alloc_model = pkv_alloc_model_constant(us * 1e-6);
        } else if (!strcmp(k, "alloc_model")) {
            // A built-in model name ("none", "cuda-boyer") or a calibration file
            // written by bench_alloc --calibrate, as pkv-replay --alloc-model.
            s = str_value(value);
            if (!s) {
                pkvpy_raise(PKV_ERR_INVALID_ARG, what, "alloc_model must be a built-in name "
                            "or a path");
                return -1;
            }
            if (pkv_alloc_model_builtin(s, &p->alloc_model) != PKV_OK) {
                char err[256] = "";
                st = pkv_alloc_model_load(s, &p->alloc_model, err, sizeof err);
                if (st != PKV_OK) {
                    pkvpy_raise(st, what, "alloc_model '%s': %s", s,
                                err[0] ? err : "not a built-in model and not readable");
                    return -1;
                }
            }
        } else if (!strcmp(k, "model")) {
            s = str_value(value);
            if (!s || (st = pkv_model_preset(s, &p->model)) != PKV_OK) {
                pkvpy_raise(PKV_ERR_NOT_FOUND, what, "model must be a preset name "
                            "(pagedkv.MODEL_PRESETS)");
                return -1;
            }
        } else if (!strcmp(k, "gpu")) {
            s = str_value(value);
            if (!s || (st = pkv_gpu_preset(s, &p->gpu)) != PKV_OK) {
                pkvpy_raise(PKV_ERR_NOT_FOUND, what, "gpu must be a preset name "
                            "(pagedkv.GPU_PRESETS)");
                return -1;
            }
        } else if (!strcmp(k, "kv_mem_bytes")) {
            if ((s = str_value(value)) != NULL) {
                if (pkv_size_parse(s, &p->kv_mem_bytes) != PKV_OK) {
                    pkvpy_raise(PKV_ERR_INVALID_ARG, what, "kv_mem_bytes '%s' is not a size like "
                                "16G", s);
                    return -1;
                }
            } else {
                static const struct field f = {"kv_mem_bytes", K_U64,
                                               offsetof(pkv_replay_params, kv_mem_bytes)};
                if (set_field(p, &f, value, what) < 0)
                    return -1;
            }
        } else {
            const struct field *f = find_field(replay_fields, k);
            if (!f) {
                pkvpy_raise(PKV_ERR_INVALID_ARG, what, "unknown parameter '%s'", k);
                return -1;
            }
            if (set_field(p, f, value, what) < 0)
                return -1;
        }
        continue;
    bad_choice:
        pkvpy_raise(PKV_ERR_INVALID_ARG, what, "%s: %s", k,
                    !strcmp(k, "mode")       ? "'sim' or 'run'"
                    : !strcmp(k, "batching") ? "'continuous' or 'static'"
                                             : "'recompute' or 'swap'");
        return -1;
    }
    return 0;
}

// replay_json(trace, policies, params, trace_name) -> str
static PyObject *replay_json(PyObject *m, PyObject *args) {
    PyObject *trace, *policies, *params;
    const char *name;
    if (!PyArg_ParseTuple(args, "O!OO!s:replay_json", &pkvpy_Trace_Type, &trace, &policies,
                          &PyDict_Type, &params, &name))
        return NULL;
    pkv_replay_params p;
    if (replay_params(params, &p) < 0)
        return NULL;
    PyObject *seq = PySequence_Fast(policies, "policies must be a sequence of names");
    if (!seq)
        return NULL;
    Py_ssize_t n = PySequence_Fast_GET_SIZE(seq);
    if (n < 1) {
        Py_DECREF(seq);
        return pkvpy_raise(PKV_ERR_INVALID_ARG, "replay", "no policy given");
    }
    pkv_policy *pol = PyMem_Calloc((size_t)n, sizeof *pol);
    pkv_replay_report *reports = PyMem_Calloc((size_t)n, sizeof *reports);
    PyObject *result = NULL;
    if (!pol || !reports) {
        PyErr_NoMemory();
        goto done;
    }
    for (Py_ssize_t i = 0; i < n; i++) {
        const char *s = str_value(PySequence_Fast_GET_ITEM(seq, i));
        if (!s || pkv_policy_from_name(s, &pol[i]) != PKV_OK) {
            pkvpy_raise(PKV_ERR_NOT_FOUND, "replay", "unknown policy '%s' (pagedkv.POLICIES)",
                        s ? s : "?");
            goto done;
        }
    }
    const pkv_trace *t = ((TraceObject *)trace)->trace;
    for (Py_ssize_t i = 0; i < n; i++) {
        pkv_status st;
        p.policy = pol[i];
        Py_BEGIN_ALLOW_THREADS
        st = pkv_replay_run(t, &p, &reports[i]);
        Py_END_ALLOW_THREADS
        if (st != PKV_OK) {
            pkvpy_raise(st, "replay", "policy %s, mode %s%s", pkv_policy_name(pol[i]),
                        p.mode == PKV_REPLAY_SIM ? "sim" : "run",
                        st == PKV_ERR_INVALID_ARG ? ": a parameter is out of its documented "
                        "range (include/pkv/replay.h), or the model does not fit the GPU" : "");
            goto done;
        }
    }
    char *buf = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&buf, &len);
    if (!f) {
        PyErr_NoMemory();
        goto done;
    }
    p.policy = pol[0];
    pkv_status st = pkv_replay_write_json(f, name, t, &p, reports, (size_t)n);
    fclose(f);
    if (st != PKV_OK)
        pkvpy_raise(st, "replay", "writing the report");
    else
        result = PyUnicode_FromStringAndSize(buf, (Py_ssize_t)len);
    free(buf);
done:
    PyMem_Free(pol);
    PyMem_Free(reports);
    Py_DECREF(seq);
    return result;
}

PyMethodDef pkvpy_trace_functions[] = {
    {"load_trace", (PyCFunction)(void (*)(void))load_trace, METH_VARARGS | METH_KEYWORDS,
     "load_trace(path, *, format='auto', skip_bad=False) -> Trace.\nFormats: native CSV, "
     "azure, burstgpt, mooncake (JSONL). Errors name file:line:field."},
    {"parse_trace", (PyCFunction)(void (*)(void))parse_trace, METH_VARARGS | METH_KEYWORDS,
     "parse_trace(text, name='<string>', *, format='auto', skip_bad=False) -> Trace."},
    {"_make_trace", (PyCFunction)make_trace, METH_O,
     "_make_trace(array of TRACE_DTYPE) -> Trace (validated as the loader does)."},
    {"generate_trace", (PyCFunction)(void (*)(void))generate_trace, METH_VARARGS | METH_KEYWORDS,
     "generate_trace(**params) -> Trace: synthetic trace, pkv_tracegen_params by name\n"
     "(seed, num_requests, arrival='poisson'|'bursty', rate_rps, ...)."},
    {"_replay_json", (PyCFunction)replay_json, METH_VARARGS,
     "_replay_json(trace, policies, params, name) -> the JSON report text."},
    {NULL, NULL, 0, NULL},
};

// The structured dtype matching pkv_trace_request, with its real offsets.
int pkvpy_trace_init(PyObject *module) {
    PyObject *spec = Py_BuildValue(
        "{s:[sssssss],s:[sssssss],s:[nnnnnnn],s:n}", "names", "arrival_s", "prompt_tokens",
        "output_tokens", "n", "prefix_group", "prefix_tokens", "request_id", "formats", "<f8",
        "<u4", "<u4", "<u4", "<i8", "<u4", "<u8", "offsets",
        (Py_ssize_t)offsetof(pkv_trace_request, arrival_s),
        (Py_ssize_t)offsetof(pkv_trace_request, prompt_tokens),
        (Py_ssize_t)offsetof(pkv_trace_request, output_tokens),
        (Py_ssize_t)offsetof(pkv_trace_request, n),
        (Py_ssize_t)offsetof(pkv_trace_request, prefix_group),
        (Py_ssize_t)offsetof(pkv_trace_request, prefix_tokens),
        (Py_ssize_t)offsetof(pkv_trace_request, request_id), "itemsize",
        (Py_ssize_t)sizeof(pkv_trace_request));
    if (!spec)
        return -1;
    int ok = PyArray_DescrConverter(spec, &request_descr);
    Py_DECREF(spec);
    if (!ok)
        return -1;
    Py_INCREF(request_descr);
    if (PyModule_AddObject(module, "TRACE_DTYPE", (PyObject *)request_descr) < 0) {
        Py_DECREF(request_descr);
        return -1;
    }
    return 0;
}

// SPDX-License-Identifier: MIT
// pagedkv.HybridVMM: the hybrid-vmm layout (include/pkv/hybrid_vmm.h) in host
// memory: one VMM space per KV cache group under one physical budget, a sequence a
// slot, set_length() mapping what every group keeps at a length.
#include "pkvpy.h"

#include "pkv/hybrid_vmm.h"

typedef struct {
    PyObject_HEAD
    pkv_hybrid_vmm *h;
    uint32_t num_groups;
} HybridVMMObject;

static int HybridVMM_init(HybridVMMObject *self, PyObject *args, PyObject *kw) {
    static char *kwlist[] = {"groups", "budget_bytes", "max_seqs", "max_seq_len", "elem_bytes",
                             "page_bytes", NULL};
    PyObject *gobj;
    unsigned long long budget = 0, page = 0;
    unsigned int max_seqs = 1, max_len = 4096, elem = 2;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "O|$KIIIK:HybridVMM", kwlist, &gobj, &budget,
                                     &max_seqs, &max_len, &elem, &page))
        return -1;
    if (self->h) {
        pkvpy_raise(PKV_ERR_BUSY, "HybridVMM", "already initialized");
        return -1;
    }
    if (budget == 0) {
        pkvpy_raise(PKV_ERR_INVALID_ARG, "HybridVMM", "budget_bytes (keyword, > 0) is required");
        return -1;
    }
    PyObject *seq = PySequence_Fast(gobj, "HybridVMM: groups must be a list of dicts");
    if (!seq) return -1;
    pkv_kv_group groups[PKV_MAX_KV_GROUPS];
    Py_ssize_t ng = PySequence_Fast_GET_SIZE(seq);
    int rc = -1;
    if (ng < 1 || ng > PKV_MAX_KV_GROUPS) {
        pkvpy_raise(PKV_ERR_INVALID_ARG, "HybridVMM", "%zd groups (1..%d)", ng, PKV_MAX_KV_GROUPS);
        goto done;
    }
    for (Py_ssize_t g = 0; g < ng; g++)
        if (pkvpy_group_from(PySequence_Fast_GET_ITEM(seq, g), g, &groups[g], "HybridVMM") < 0)
            goto done;
    pkv_hybrid_vmm_params p;
    pkv_hybrid_vmm_params_default(&p);
    p.groups = groups;
    p.num_groups = (uint32_t)ng;
    p.budget_bytes = budget;
    p.max_seqs = max_seqs;
    p.max_seq_len = max_len;
    p.elem_bytes = elem;
    p.page_bytes = page;
    pkv_status st = pkv_hybrid_vmm_create(&p, &self->h);
    if (st != PKV_OK) {
        pkvpy_raise(st, "HybridVMM", "%zd groups, budget %llu bytes, max_seqs %u, max_seq_len %u, "
                    "elem_bytes %u, page_bytes %llu (hybrid_vmm.h lists what create checks)",
                    ng, budget, max_seqs, max_len, elem, page);
        goto done;
    }
    self->num_groups = (uint32_t)ng;
    rc = 0;
done:
    Py_DECREF(seq);
    return rc;
}

static void HybridVMM_dealloc(HybridVMMObject *self) {
    pkv_hybrid_vmm_destroy(self->h);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static int ready(HybridVMMObject *self, const char *what) {
    if (self->h) return 0;
    pkvpy_raise(PKV_ERR_INVALID_ARG, what, "HybridVMM was not initialized");
    return -1;
}

static PyObject *HybridVMM_acquire(HybridVMMObject *self, PyObject *unused) {
    (void)unused;
    if (ready(self, "HybridVMM.acquire") < 0) return NULL;
    uint32_t slot;
    pkv_status st = pkv_hybrid_vmm_acquire(self->h, &slot);
    if (st != PKV_OK)
        return pkvpy_raise(st, "HybridVMM.acquire", "no free slot, or the budget cannot hold "
                           "the states of a new sequence");
    return PyLong_FromUnsignedLong(slot);
}

static PyObject *HybridVMM_set_length(HybridVMMObject *self, PyObject *args) {
    unsigned int slot, n;
    if (!PyArg_ParseTuple(args, "II:set_length", &slot, &n)) return NULL;
    if (ready(self, "HybridVMM.set_length") < 0) return NULL;
    pkv_status st = pkv_hybrid_vmm_set_length(self->h, slot, n);
    if (st != PKV_OK)
        return pkvpy_raise(st, "HybridVMM.set_length", "slot %u, %u tokens", slot, n);
    Py_RETURN_NONE;
}

static PyObject *HybridVMM_release(HybridVMMObject *self, PyObject *args) {
    unsigned int slot;
    if (!PyArg_ParseTuple(args, "I:release", &slot)) return NULL;
    if (ready(self, "HybridVMM.release") < 0) return NULL;
    pkv_status st = pkv_hybrid_vmm_release(self->h, slot);
    if (st != PKV_OK) return pkvpy_raise(st, "HybridVMM.release", "slot %u", slot);
    Py_RETURN_NONE;
}

static PyObject *HybridVMM_pages(HybridVMMObject *self, PyObject *args) {
    unsigned int slot;
    if (!PyArg_ParseTuple(args, "I:pages", &slot)) return NULL;
    if (ready(self, "HybridVMM.pages") < 0) return NULL;
    PyObject *l = PyList_New(self->num_groups);
    for (uint32_t g = 0; l && g < self->num_groups; g++) {
        pkv_vmm_space *s = pkv_hybrid_vmm_space(self->h, g);
        PyObject *t = Py_BuildValue("(KK)", (unsigned long long)pkv_vmm_slot_first_page(s, slot),
                                    (unsigned long long)pkv_vmm_slot_pages(s, slot));
        if (!t) Py_CLEAR(l);
        else PyList_SET_ITEM(l, g, t);
    }
    return l;
}

static PyObject *HybridVMM_validate(HybridVMMObject *self, PyObject *unused) {
    (void)unused;
    if (ready(self, "HybridVMM.validate") < 0) return NULL;
    pkv_status st = pkv_hybrid_vmm_validate(self->h);
    if (st != PKV_OK) return pkvpy_raise(st, "HybridVMM.validate", "invariant broken");
    Py_RETURN_NONE;
}

static PyObject *HybridVMM_get_budget(HybridVMMObject *self, void *c) {
    (void)c;
    if (ready(self, "HybridVMM.budget") < 0) return NULL;
    pkv_vmm_budget_stats b;
    pkv_status st = pkv_hybrid_vmm_budget_stats(self->h, &b);
    if (st != PKV_OK) return pkvpy_raise(st, "HybridVMM.budget", "stats");
    return Py_BuildValue("{sKsKsKsK}", "bytes", (unsigned long long)b.bytes, "bytes_used",
                         (unsigned long long)b.bytes_used, "bytes_used_peak",
                         (unsigned long long)b.bytes_used_peak, "pages_reclaimed",
                         (unsigned long long)b.pages_reclaimed);
}

static PyObject *HybridVMM_get_page_bytes(HybridVMMObject *self, void *c) {
    (void)c;
    if (ready(self, "HybridVMM.page_bytes") < 0) return NULL;
    PyObject *l = PyList_New(self->num_groups);
    for (uint32_t g = 0; l && g < self->num_groups; g++) {
        pkv_vmm_info info;
        pkv_vmm_get_info(pkv_hybrid_vmm_space(self->h, g), &info);
        PyList_SET_ITEM(l, g, PyLong_FromUnsignedLongLong(info.page_bytes));
    }
    return l;
}

static PyObject *HybridVMM_get_token_bytes(HybridVMMObject *self, void *c) {
    (void)c;
    if (ready(self, "HybridVMM.buffer_token_bytes") < 0) return NULL;
    PyObject *l = PyList_New(self->num_groups);
    for (uint32_t g = 0; l && g < self->num_groups; g++)
        PyList_SET_ITEM(l, g, PyLong_FromUnsignedLongLong(pkv_hybrid_vmm_buffer_token_bytes(self->h, g)));
    return l;
}

static PyMethodDef hybrid_vmm_methods[] = {
    {"acquire", (PyCFunction)HybridVMM_acquire, METH_NOARGS,
     "acquire() -> slot: a new sequence of length 0 (its states mapped)"},
    {"set_length", (PyCFunction)HybridVMM_set_length, METH_VARARGS,
     "set_length(slot, n): map what every group keeps for n tokens, all or nothing\n"
     "(OutOfBlocks when the budget cannot cover it: nothing changes)"},
    {"release", (PyCFunction)HybridVMM_release, METH_VARARGS, "release(slot): unmap and free"},
    {"pages", (PyCFunction)HybridVMM_pages, METH_VARARGS,
     "pages(slot) -> [(first_page, pages)] per group: the mapped run of its rows"},
    {"validate", (PyCFunction)HybridVMM_validate, METH_NOARGS,
     "validate(): every space's invariant and each group's run matching its length"},
    {NULL, NULL, 0, NULL},
};

static PyGetSetDef hybrid_vmm_getset[] = {
    {"budget", (getter)HybridVMM_get_budget, NULL,
     "dict: bytes, bytes_used, bytes_used_peak, pages_reclaimed", NULL},
    {"page_bytes", (getter)HybridVMM_get_page_bytes, NULL, "each group's physical page", NULL},
    {"buffer_token_bytes", (getter)HybridVMM_get_token_bytes, NULL,
     "bytes of one token in one buffer of each group (a state group: its state per layer)", NULL},
    {NULL, NULL, NULL, NULL, NULL},
};

static PyTypeObject HybridVMM_Type = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "pagedkv.HybridVMM",
    .tp_basicsize = sizeof(HybridVMMObject),
    .tp_dealloc = (destructor)HybridVMM_dealloc,
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "HybridVMM(groups, *, budget_bytes, max_seqs=1, max_seq_len=4096, elem_bytes=2,\n"
              "page_bytes=0)\n"
              "The hybrid-vmm layout in host memory (include/pkv/hybrid_vmm.h): one virtual\n"
              "buffer space per KV cache group (groups: dicts as HybridKV's), pages mapped as a\n"
              "group's kept tokens need them and unmapped from the front of a window, every group\n"
              "under one physical budget. page_bytes 0: the system page.",
    .tp_methods = hybrid_vmm_methods,
    .tp_getset = hybrid_vmm_getset,
    .tp_init = (initproc)HybridVMM_init,
    .tp_new = PyType_GenericNew,
};

int pkvpy_hybrid_vmm_init(PyObject *module) {
    return pkvpy_add_type(module, "HybridVMM", &HybridVMM_Type);
}

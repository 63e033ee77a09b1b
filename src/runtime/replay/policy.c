// SPDX-License-Identifier: MIT
// The policy registry and the engine's side of pkv/policy.h: the built-in
// tables by pkv_policy value, the check a table must pass before the engine
// drives it (ABI version, mandatory slots), and the host service that counts a
// policy's backend calls and prices them with the replay's cost model.
#include <stdio.h>
#include <string.h>

#include "replay_internal.h"

const pkv_policy_vtable *pkv_policy_builtin(int policy) {
    switch (policy) {
    case PKV_POLICY_PAGED: return &pkvi_policy_paged_vtable;
    case PKV_POLICY_CONTIG_MAX: return &pkvi_policy_contig_max_vtable;
    case PKV_POLICY_CONTIG_POW2: return &pkvi_policy_contig_pow2_vtable;
    case PKV_POLICY_CONTIG_ORACLE: return &pkvi_policy_contig_oracle_vtable;
    case PKV_POLICY_MALLOC_PER_REQUEST: return &pkvi_policy_malloc_per_request_vtable;
    case PKV_POLICY_MALLOC_PER_TOKEN: return &pkvi_policy_token_vtable;
    case PKV_POLICY_REALLOC_COPY: return &pkvi_policy_realloc_copy_vtable;
    case PKV_POLICY_CONTIG_POW2_GROW: return &pkvi_policy_contig_pow2_grow_vtable;
    case PKV_POLICY_VMM: return &pkvi_policy_vmm_vtable;
    case PKV_POLICY_VMM_SYNC: return &pkvi_policy_vmm_sync_vtable;
    case PKV_POLICY_HYBRID_PARTITION: return &pkvi_policy_hybrid_partition_vtable;
    case PKV_POLICY_HYBRID_SHARED_PAGE: return &pkvi_policy_hybrid_shared_page_vtable;
    case PKV_POLICY_HYBRID_LCM: return &pkvi_policy_hybrid_lcm_vtable;
    case PKV_POLICY_HYBRID_VMM: return &pkvi_policy_hybrid_vmm_vtable;
    default: return NULL;
    }
}

pkv_status pkv_policy_vtable_check(const pkv_policy_vtable *vt, char *why, size_t why_len) {
    const char *missing = NULL;
    char buf[128];
    if (!vt) {
        missing = "no table (NULL)";
    } else if (vt->abi_version != PKV_POLICY_ABI_VERSION) {
        snprintf(buf, sizeof buf, "policy ABI version %u, this engine speaks %u", vt->abi_version,
                 PKV_POLICY_ABI_VERSION);
        missing = buf;
    } else if (!vt->name || !vt->name[0] || strlen(vt->name) > 31) {
        missing = "name missing or longer than 31 bytes";
    } else {
        static const char *const slot_names[] = {"create", "destroy", "need", "fits_alone", "admit",
                                                 "fork", "grow", "release", "stats", "reservation"};
        const int set[] = {vt->create != NULL, vt->destroy != NULL, vt->need != NULL,
                           vt->fits_alone != NULL, vt->admit != NULL, vt->fork != NULL,
                           vt->grow != NULL, vt->release != NULL, vt->stats != NULL,
                           vt->reservation != NULL};
        for (size_t i = 0; i < sizeof set / sizeof set[0] && !missing; i++)
            if (!set[i]) {
                snprintf(buf, sizeof buf, "policy '%s': mandatory slot '%s' is NULL", vt->name,
                         slot_names[i]);
                missing = buf;
            }
        if (!missing && (vt->swap_out == NULL) != (vt->swap_in == NULL)) {
            snprintf(buf, sizeof buf, "policy '%s': slot '%s' is set without '%s'", vt->name,
                     vt->swap_out ? "swap_out" : "swap_in", vt->swap_out ? "swap_in" : "swap_out");
            missing = buf;
        }
    }
    if (why && why_len) snprintf(why, why_len, "%s", missing ? missing : "");
    return missing ? PKV_ERR_INVALID_ARG : PKV_OK;
}

// pkv_policy_host.backend_calls: count, price, and leave pending for the step.
static void host_backend_calls(void *ctx, pkv_backend_call kind, uint64_t bytes, uint64_t count) {
    pkvi_policy *p = ctx;
    const int is_free = (kind & PKV_BACKEND_CALL_FREE) != 0;
    const int overlapped = (kind & PKV_BACKEND_CALL_OVERLAPPED) != 0;
    kind = is_free ? PKV_BACKEND_CALL_FREE : PKV_BACKEND_CALL_ALLOC;
    if (is_free)
        p->free_calls += count;
    else
        p->alloc_calls += count;
    if (p->real_calls && count) { // run mode: measured, and the step waits for it
        const double s = p->real_calls(p->real_ctx, kind, bytes, count);
        p->charges.sync_s += s;
        if (is_free)
            p->charges.free_total_s += s;
        else
            p->charges.alloc_total_s += s;
        return;
    }
    if (!p->cost || count == 0) return;
    const pkv_alloc_call_cost *c = is_free ? &p->cost->free : &p->cost->alloc;
    const double s = (double)count * pkv_alloc_call_seconds(c, bytes);
    if (c->sync && !overlapped)
        p->charges.sync_s += s;
    else
        p->charges.async_s += s;
    if (is_free)
        p->charges.free_total_s += s;
    else
        p->charges.alloc_total_s += s;
}

pkv_status pkvi_policy_open(pkvi_policy *p, const pkv_policy_vtable *vt, const pkv_policy_config *cfg,
                            const pkv_alloc_model *cost) {
    memset(p, 0, sizeof *p);
    pkv_status st = pkv_policy_vtable_check(vt, NULL, 0);
    if (st != PKV_OK) return st;
    p->vt = vt;
    p->cfg = *cfg;
    p->cfg.abi_version = PKV_POLICY_ABI_VERSION;
    p->cfg.host.ctx = p;
    p->cfg.host.backend_calls = host_backend_calls;
    p->cost = cost;
    st = vt->create(&p->cfg, &p->info, &p->state);
    if (st != PKV_OK) p->state = NULL;
    // A policy may not claim more than the budget, nor a unit larger than itself.
    st = pkvi_policy_check_create(p, st, cfg->capacity_bytes / cfg->bytes_per_token);
    if (st != PKV_OK) {
        if (p->state) vt->destroy(p->state);
        p->state = NULL;
        return st;
    }
    // Calls made while it set itself up are outside every step (totals only).
    p->charges.sync_s = p->charges.async_s = 0;
    return PKV_OK;
}

void pkvi_policy_close(pkvi_policy *p) {
    if (p && p->vt && p->state) p->vt->destroy(p->state);
    if (p) p->state = NULL;
}

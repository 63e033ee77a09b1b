// SPDX-License-Identifier: MIT
// Replay parameters: defaults, policy and mode names, sizes (the tools' one
// grammar), and the KV budget of a (model, GPU) pair.
#include <ctype.h>
#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <stdio.h>
#include <string.h>

#include "replay_internal.h"

static const char *const policy_names[PKV_POLICY_COUNT] = {
    "paged", "contiguous-max", "contiguous-pow2", "contiguous-oracle",
    "malloc-per-request", "malloc-per-token", "realloc-copy", "contiguous-pow2-grow",
    "vmm",
    "vmm-sync",
    "hybrid-partition",
    "hybrid-shared-page",
    "hybrid-lcm",
    "hybrid-vmm",
};

const char *pkv_policy_name(pkv_policy policy) {
    return (unsigned)policy < PKV_POLICY_COUNT ? policy_names[policy] : "unknown";
}

pkv_status pkv_policy_from_name(const char *name, pkv_policy *policy) {
    if (!name || !policy) return PKV_ERR_INVALID_ARG;
    for (int i = 0; i < PKV_POLICY_COUNT; i++) {
        if (strcmp(name, policy_names[i]) == 0) {
            *policy = (pkv_policy)i;
            return PKV_OK;
        }
    }
    return PKV_ERR_NOT_FOUND;
}

const char *pkv_preempt_mode_name(pkv_preempt_mode mode) {
    switch (mode) {
    case PKV_PREEMPT_RECOMPUTE: return "recompute";
    case PKV_PREEMPT_SWAP: return "swap";
    }
    return "unknown";
}

const char *pkv_batching_name(pkv_batching b) {
    switch (b) {
    case PKV_BATCHING_CONTINUOUS: return "continuous";
    case PKV_BATCHING_STATIC: return "static";
    }
    return "unknown";
}

// The one size grammar of every tool (and of the Python package): a decimal
// number, a fraction allowed before a unit, then a unit, letters in any case:
// none or B (bytes); K, M, G, T and KiB, MiB, GiB, TiB (powers of 1024: "40G" was
// the only form before, and stays binary); KB, MB, GB, TB (powers of 1000, as
// GPU datasheets and disk vendors write them). A fraction rounds to the nearest
// byte.
static int unit_of(const char *u, uint64_t *mul) {
    static const char letters[] = "KMGT";
    if (*u == '\0' || ((*u == 'B' || *u == 'b') && u[1] == '\0')) {
        *mul = 1;
        return 1;
    }
    const char *l = strchr(letters, toupper((unsigned char)*u));
    if (!l) return 0;
    const int k = (int)(l - letters) + 1;
    const char *rest = u + 1;
    uint64_t base = 1024;
    if ((rest[0] == 'i' || rest[0] == 'I') && (rest[1] == 'B' || rest[1] == 'b') && !rest[2])
        base = 1024;
    else if ((rest[0] == 'B' || rest[0] == 'b') && !rest[1])
        base = 1000;
    else if (rest[0] != '\0')
        return 0;
    *mul = 1;
    for (int i = 0; i < k; i++) *mul *= base;
    return 1;
}

static const char *const device_mem_names[] = {"cuda", "cuda", "arena", "torch-caching"};

const char *pkv_device_mem_name(pkv_device_mem mem) {
    return (unsigned)mem < sizeof device_mem_names / sizeof device_mem_names[0] ? device_mem_names[mem]
                                                                                  : "unknown";
}

pkv_status pkv_device_mem_from_name(const char *name, pkv_device_mem *mem) {
    if (!name || !mem) return PKV_ERR_INVALID_ARG;
    for (unsigned i = PKV_DEVICE_MEM_CUDA; i < sizeof device_mem_names / sizeof device_mem_names[0]; i++)
        if (strcmp(name, device_mem_names[i]) == 0) {
            *mem = (pkv_device_mem)i;
            return PKV_OK;
        }
    return PKV_ERR_NOT_FOUND;
}

pkv_device_mem pkvi_device_mem_of(const pkv_replay_params *p) {
    if (p->mode == PKV_REPLAY_RUN) return PKV_DEVICE_MEM_ARENA; // its layout is a real arena
    return p->device_mem == PKV_DEVICE_MEM_DEFAULT ? PKV_DEVICE_MEM_CUDA : p->device_mem;
}

const char *pkvi_device_mem_label(const pkv_replay_params *p) {
    if (p->custom_policy) return "custom";
    switch (p->policy) {
    case PKV_POLICY_PAGED:
    case PKV_POLICY_HYBRID_PARTITION:
    case PKV_POLICY_HYBRID_SHARED_PAGE:
    case PKV_POLICY_HYBRID_LCM: return "pool";
    case PKV_POLICY_MALLOC_PER_REQUEST:
    case PKV_POLICY_REALLOC_COPY: return pkv_device_mem_name(pkvi_device_mem_of(p));
    case PKV_POLICY_MALLOC_PER_TOKEN: return "token";
    case PKV_POLICY_VMM:
    case PKV_POLICY_VMM_SYNC:
    case PKV_POLICY_HYBRID_VMM: return "vmm";
    default: return "arena";
    }
}

pkv_status pkv_size_parse(const char *text, uint64_t *bytes) {
    if (!text || !bytes) return PKV_ERR_INVALID_ARG;
    const char *p = text;
    if (!isdigit((unsigned char)*p)) return PKV_ERR_INVALID_ARG;
    char *end;
    errno = 0;
    unsigned long long v = strtoull(p, &end, 10);
    if (errno) return PKV_ERR_INVALID_ARG;
    uint64_t frac = 0, frac_den = 1; // the digits after a '.', as frac / frac_den
    if (*end == '.') {
        end++;
        if (!isdigit((unsigned char)*end)) return PKV_ERR_INVALID_ARG;
        for (; isdigit((unsigned char)*end); end++)
            if (frac_den < 1000000000000ull) { // 12 digits: finer than any byte we can reach
                frac = frac * 10 + (uint64_t)(*end - '0');
                frac_den *= 10;
            }
    }
    uint64_t mul;
    if (!unit_of(end, &mul)) return PKV_ERR_INVALID_ARG;
    if (frac_den > 1 && mul == 1) return PKV_ERR_INVALID_ARG; // no fractions of a byte
    if (v > UINT64_MAX / mul) return PKV_ERR_INVALID_ARG;
    uint64_t b = (uint64_t)v * mul;
    if (frac) {
        // frac / frac_den is under one unit (at most 10^12 bytes): the product's
        // rounding error in long double (or double) is far below half a byte.
        const uint64_t part = (uint64_t)llroundl((long double)frac * (long double)mul /
                                                  (long double)frac_den);
        if (b > UINT64_MAX - part) return PKV_ERR_INVALID_ARG;
        b += part;
    }
    *bytes = b;
    return PKV_OK;
}

pkv_replay_params pkv_replay_params_default(void) {
    pkv_replay_params p;
    memset(&p, 0, sizeof p);
    p.mode = PKV_REPLAY_SIM;
    p.policy = PKV_POLICY_PAGED;
    p.block_size = 16;
    p.max_seq_len = 0;
    p.preempt = PKV_PREEMPT_RECOMPUTE;
    p.max_batch = 256;
    p.max_tokens_per_step = 8192;
    p.watermark = 0.01;
    pkv_model_preset("llama2-7b", &p.model);
    pkv_gpu_preset("a100-80g", &p.gpu);
    // All 0: the published figures of whichever GPU the replay gets (pkv_replay_sim_efficiency).
    p.sim_eff.bw_frac = 0;
    p.sim_eff.compute_frac = 0;
    p.sim_eff.step_overhead_s = 0;
    snprintf(p.sim_eff.source, sizeof p.sim_eff.source, "default: the GPU preset's published figures");
    p.kv_mem_bytes = 0;
    p.gpu_util = 0.9;
    p.dtype_bytes = 2;
    pkv_alloc_model_builtin("cuda-boyer", &p.alloc_model);
    p.swap_space_bytes = 4ull << 30; // vLLM's default swap_space: 4 GiB
    p.batching = PKV_BATCHING_CONTINUOUS;
    p.chunked_prefill = 0;
    p.load_scale = 1;
    p.prefix_sharing = 1;
    p.vmm_page_bytes = (uint64_t)2 << 20;
    p.vmm_map_ahead = 1;     // vAttention's published design (docs/POLICIES.md)
    p.vmm_defer_reclaim = 1;
    p.seed = 1;
    return p;
}

pkv_status pkv_replay_sim_efficiency(const pkv_replay_params *p, pkv_sim_efficiency *eff) {
    if (!p || !eff) return PKV_ERR_INVALID_ARG;
    const pkv_sim_efficiency *s = &p->sim_eff;
    if (s->bw_frac == 0 && s->compute_frac == 0 && s->step_overhead_s == 0) {
        // A GPU of one's own has no published figures: the plain roofline, which
        // pkv_sim_efficiency_for_gpu leaves in *eff with a source saying so.
        pkv_sim_efficiency_for_gpu(&p->gpu, eff);
        return PKV_OK;
    }
    if (!(s->bw_frac > 0 && s->bw_frac <= 1 && s->compute_frac > 0 && s->compute_frac <= 1 &&
          s->step_overhead_s >= 0 && isfinite(s->step_overhead_s)))
        return PKV_ERR_INVALID_ARG;
    *eff = *s;
    return PKV_OK;
}

uint64_t pkv_replay_kv_bytes_per_token(const pkv_replay_params *p) {
    if (!p) return 0;
    if (!pkv_dtype_is_quantized(p->kv_dtype))
        return p->kv_dtype == PKV_DTYPE_F32 ? pkv_model_kv_bytes_per_token(&p->model, p->dtype_bytes)
                                            : 0;
    // The cache's own count: int8 adds one fp32 scale per token, layer, K/V and head.
    pkv_cache_params cp = pkv_cache_params_default();
    cp.num_layers = p->model.num_layers;
    cp.kv_heads = p->model.num_kv_heads;
    cp.head_dim = p->model.head_dim;
    cp.dtype = p->kv_dtype;
    return pkv_cache_bytes_per_token(&cp);
}

pkv_status pkv_replay_kv_budget(const pkv_replay_params *p, uint64_t *bytes) {
    if (!p || !bytes) return PKV_ERR_INVALID_ARG;
    if (p->kv_mem_bytes) {
        *bytes = p->kv_mem_bytes;
        return PKV_OK;
    }
    const uint64_t weights = pkv_model_param_count(&p->model) * p->dtype_bytes;
    if (weights == 0 || !(p->gpu_util > 0 && p->gpu_util <= 1) || weights >= p->gpu.mem_bytes)
        return PKV_ERR_INVALID_ARG;
    // "GPU memory minus weights, times a utilization factor" (issue 5).
    *bytes = (uint64_t)((double)(p->gpu.mem_bytes - weights) * p->gpu_util);
    return *bytes ? PKV_OK : PKV_ERR_INVALID_ARG;
}

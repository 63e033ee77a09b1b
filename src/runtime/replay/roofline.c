// SPDX-License-Identifier: MIT
// GPU presets and the roofline step-time model used by sim mode.
//
// A step's time is max(flops / peak_flops, bytes / mem_bw) + swap / host_link_bw:
// - flops = 2 x params x tokens (every weight is one multiply-add per token)
//         + 4 x layers x heads x head_dim x (query, key) pairs (QK^T and PV);
// - bytes = the weights once per step (params x dtype_bytes)
//         + KV read (every context token of every sequence) and written (the new
//           tokens), at kv_bytes_per_token each, + device copies read and written.
// With pkv_sim_efficiency at 1, 1, 0 (the default) it is a lower bound: no
// kernel-efficiency factor, no launch overheads, no activations traffic; a
// calibration (pkv_replay_calibrate) scales the rates and adds the overhead. Its purpose is to rank policies on the same trace
// (larger batches amortize the weight reads), not to predict a server.
//
// GPU figures are nominal datasheet numbers (dense fp16/bf16 tensor throughput,
// no sparsity); memory is the total nvidia-smi reports for the card.
#include <stdlib.h>
#include <string.h>

#include "replay_internal.h"

static const pkv_gpu_spec gpus[] = {
    // A100 SXM4 80GB: 2039 GB/s HBM2e, 312 TFLOPS fp16, PCIe 4.0 x16 (32 GB/s).
    {"a100-80g", 81920ull << 20, 2039e9, 312e12, 32e9},
    // H100 SXM5 80GB: 3.35 TB/s HBM3, 989 TFLOPS fp16 dense, PCIe 5.0 x16 (64 GB/s).
    {"h100-80g", 81559ull << 20, 3.35e12, 989e12, 64e9},
    // H200 SXM 141GB: 4.8 TB/s HBM3e, 989 TFLOPS fp16 dense, PCIe 5.0 x16 (64 GB/s).
    {"h200-141g", 143771ull << 20, 4.8e12, 989e12, 64e9},
};

static const char *const gpu_names[] = {"a100-80g", "h100-80g", "h200-141g", NULL};

pkv_status pkv_gpu_preset(const char *name, pkv_gpu_spec *spec) {
    if (!name || !spec) return PKV_ERR_INVALID_ARG;
    for (size_t i = 0; i < sizeof gpus / sizeof gpus[0]; i++) {
        if (strcmp(gpus[i].name, name) == 0) {
            *spec = gpus[i];
            return PKV_OK;
        }
    }
    return PKV_ERR_NOT_FOUND;
}

const char *const *pkv_gpu_preset_names(void) { return gpu_names; }

typedef struct roofline {
    pkvi_executor base;
    double weight_bytes;
    double flops_per_token;     // 2 x params
    double attn_flops_per_pair; // 4 x layers x heads x head_dim
    double kv_bytes_per_token;
    double peak_flops, mem_bw, host_bw; // achieved: peak x the efficiency fraction
    double overhead_s;                   // per step with work
} roofline;

// Roofline time of `tokens` new tokens reading `kv_tokens` of KV with `pairs`
// attention pairs and `copy` device bytes; the work into *flops, *bytes.
static double roof(const roofline *m, double tokens, double pairs, double kv_tokens, double copy,
                   double *flops, double *bytes) {
    *flops = m->flops_per_token * tokens + m->attn_flops_per_pair * pairs;
    *bytes = m->weight_bytes + m->kv_bytes_per_token * kv_tokens + 2.0 * copy;
    const double tc = *flops / m->peak_flops, tm = *bytes / m->mem_bw;
    return tc > tm ? tc : tm;
}

static pkv_status roofline_step(pkvi_executor *e, const pkvi_step_batch *b, double *seconds,
                                pkvi_step_time *parts) {
    const roofline *m = (const roofline *)e;
    const double tokens = (double)b->prefill_tokens + (double)b->num_decode_seqs;
    double t = 0, f = 0, by = 0;
    memset(parts, 0, sizeof *parts);
    if (tokens > 0) {
        const double pairs = b->prefill_attn_pairs + (double)b->decode_ctx_tokens;
        const double kv_tokens = (double)b->decode_ctx_tokens + (double)b->prefill_ctx_tokens + tokens;
        t = roof(m, tokens, pairs, kv_tokens, (double)b->copy_bytes, &f, &by) + m->overhead_s;
        // The split: each part's time had it run alone, scaled to the step.
        double fp, bp, fd, bd, tp = 0, td = 0;
        if (b->prefill_tokens)
            tp = roof(m, (double)b->prefill_tokens, b->prefill_attn_pairs,
                      (double)b->prefill_ctx_tokens + (double)b->prefill_tokens, 0, &fp, &bp);
        if (b->num_decode_seqs)
            td = roof(m, (double)b->num_decode_seqs, (double)b->decode_ctx_tokens,
                      (double)b->decode_ctx_tokens + (double)b->num_decode_seqs, 0, &fd, &bd);
        parts->prefill_s = tp;
        parts->decode_s = td;
    } else if (b->copy_bytes) {
        by = 2.0 * (double)b->copy_bytes;
        t = by / m->mem_bw;
    }
    parts->flops = f;
    parts->bytes = by;
    t += (double)b->swap_bytes / m->host_bw;
    *seconds = t;
    return PKV_OK;
}

static void roofline_destroy(pkvi_executor *e) { free(e); }

pkv_status pkvi_executor_roofline_create(const pkv_replay_params *p, pkvi_executor **out) {
    if (!p || !out) return PKV_ERR_INVALID_ARG;
    const uint64_t params = pkv_model_param_count(&p->model);
    const uint64_t kvb = pkv_replay_kv_bytes_per_token(p); // 8-bit KV halves the KV reads
    if (params == 0 || kvb == 0 || !(p->gpu.peak_flops > 0) || !(p->gpu.mem_bw > 0) ||
        !(p->gpu.host_link_bw > 0))
        return PKV_ERR_INVALID_ARG;
    roofline *m = calloc(1, sizeof *m);
    if (!m) return PKV_ERR_OUT_OF_MEMORY;
    m->base.needs_seqs = 0;
    m->base.step = roofline_step;
    m->base.peak_flops = p->gpu.peak_flops;
    m->base.mem_bw = p->gpu.mem_bw;
    m->base.destroy = roofline_destroy;
    m->weight_bytes = (double)params * p->dtype_bytes;
    m->flops_per_token = 2.0 * (double)params;
    m->attn_flops_per_pair = 4.0 * p->model.num_layers * (double)p->model.num_heads * p->model.head_dim;
    m->kv_bytes_per_token = (double)kvb;
    m->peak_flops = p->gpu.peak_flops * p->sim_eff.compute_frac;
    m->mem_bw = p->gpu.mem_bw * p->sim_eff.bw_frac;
    m->host_bw = p->gpu.host_link_bw;
    m->overhead_s = p->sim_eff.step_overhead_s;
    *out = &m->base;
    return PKV_OK;
}

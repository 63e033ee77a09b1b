// SPDX-License-Identifier: MIT
// GPU presets, their default sim efficiency, and the roofline step-time model
// used by sim mode.
//
// A step's time is the sum of its kernels' rooflines (step_kernels below: the
// linear layers, prefill attention, decode attention, device copies, each
// max(flops / peak_flops, bytes / mem_bw)) + swap / (host_link_bw x the link's
// achieved fraction, pkv_replay_host_link_frac), where
// - flops = 2 x params x tokens (every weight is one multiply-add per token)
//         + 4 x layers x heads x head_dim x (query, key) pairs (QK^T and PV);
// - bytes = the weights once per step (weights_read below: every weight but the
//           rows of the token embedding the batch does not use; the LM head reads
//           all of its own) + KV read (every context token of every sequence) and written (the new
//           tokens), at kv_bytes_per_token each, + device copies read and written.
// peak_flops and mem_bw are the datasheet's times pkv_sim_efficiency's fractions,
// plus its per-step overhead. By default (sim_eff all 0) the fractions are the
// GPU preset's published ones below: what real engines reached on whole steps,
// so a step takes about what it took there. With pkv_sim_efficiency_peak()
// (1, 1, 0; `pkv-replay --sim-efficiency peak`) the model is a lower bound on
// step time: no kernel-efficiency factor, no launch overheads, no activations
// traffic. A calibration (pkv_replay_calibrate) replaces the rates by measured
// ones and adds the overhead. Its purpose is to rank policies on the same trace
// (larger batches amortize the weight reads), not to predict a server.
//
// GPU figures are nominal datasheet numbers (dense fp16/bf16 tensor throughput,
// no sparsity); memory is the total nvidia-smi reports for the card.
#include <stdio.h>
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

// Published whole-step measurements behind a preset's default efficiency
// (docs/POLICIES.md, "Sim efficiency"). Each fraction is derived with this
// file's own work count, so that sim mode reproduces the measured step:
//   bw_frac      = bytes of one batch-1 decode step of decode_model / (1 / tok_s)
//                  / mem_bw (the weights; the few hundred context tokens of the
//                  measurement add < 1 % and are left out);
//   compute_frac = flops of one prefill of prefill_tokens / prefill_s / peak_flops.
// A GPU with no figure of a kind keeps 1 for it; `like` borrows another preset's
// fractions (same SM generation, no figure of its own).
typedef struct published {
    const char *gpu;
    const char *decode_model;  // model preset measured; NULL: no decode figure
    double decode_tok_s;       // tokens/s, batch 1, bf16/fp16 weights
    const char *prefill_model; // NULL: no prefill figure
    double prefill_tokens;     // prompt length
    double prefill_s;          // first-token latency, batch 1
    double prefill_peak;       // flop/s the prefill figure is a fraction of; 0: the
                               // preset's fp16/bf16 peak (an FP8 figure: the FP8 peak)
    const char *like;          // NULL, or the preset whose fractions apply
    const char *source;        // shown in reports (fits pkv_sim_efficiency.source)
} published;

static const published published_figures[] = {
    // Decode: pytorch/ao torchao/quantization/README.md (2024-25), "CUDA backend |
    // NVIDIA-A100-80GB GPU", Llama-2-7B "Base (bfloat16)": 107.38 tokens/s, batch 1
    // (1418.93 GB/s as that table counts the bytes, 69.6 % of 2039 GB/s).
    // Prefill: NVIDIA/TensorRT-LLM docs/source/performance.md (release 0.5.0, 2023),
    // "Low Latency", "A100 GPUs (FP16)": LLaMA 7B, batch 1, TP 1, input 2048,
    // 1st token latency 133 ms.
    {"a100-80g", "llama2-7b", 107.38, "llama2-7b", 2048, 0.133, 0, NULL,
     "torchao A100 bf16 decode; TensorRT-LLM 0.5 fp16 TTFT"},
    // Decode: the same torchao table, "CUDA backend | NVIDIA-H100 GPU",
    // Llama-3.1-8B "Base (bfloat16)": 126.90 tokens/s, batch 1 (1904.75 GB/s as
    // that table counts). Prefill: no fp16/bf16 whole-step figure for Hopper was
    // found; derived from the same TensorRT-LLM 0.5 table's H100 FP8 row (LLaMA 7B,
    // batch 1, input 2048, 1st token latency 36 ms) as a fraction of the FP8 dense
    // peak (1979 TFLOPS): the share of its tensor peak that engine reached on
    // Hopper, applied to the bf16 peak. Conservative: an fp16 prefill spends
    // relatively less time outside the GEMMs than an FP8 one (2048 tokens: 72 ms
    // here against the FP8 36 ms).
    {"h100-80g", "llama3-8b", 126.90, "llama2-7b", 2048, 0.036, 1979e12, NULL,
     "torchao H100 bf16 decode; TRT-LLM 0.5 H100 FP8 TTFT share"},
    // No H200 figure found: the H100's fractions (same Hopper SM, HBM3e).
    {"h200-141g", NULL, 0, NULL, 0, 0, 0, "h100-80g",
     "H100's fractions: no H200 figure"},
};

pkv_sim_efficiency pkv_sim_efficiency_peak(void) {
    pkv_sim_efficiency e;
    memset(&e, 0, sizeof e);
    e.bw_frac = 1;
    e.compute_frac = 1;
    e.step_overhead_s = 0;
    snprintf(e.source, sizeof e.source, "peak: the plain roofline");
    return e;
}

// Weight bytes one step of `tokens` tokens reads: every weight once, except the
// token embedding (and a learned position table), of which only the batch's rows
// are read; the LM head reads all of its own (a tied one is the embedding).
static double weights_read(const pkv_model_config *m, double dtype_bytes, double tokens) {
    const double d = m->d_model;
    double skipped = 0, rows = tokens * d;
    if (!m->tied_embeddings) skipped += (double)m->vocab_size * d;
    if (m->pos == PKV_POS_LEARNED) {
        skipped += (double)m->max_seq_len * d;
        rows += tokens * d;
    }
    return ((double)pkv_model_param_count(m) - skipped + rows) * dtype_bytes;
}

// The fractions of `f` on `gpu` (its datasheet rates); 1 where f has no figure.
static pkv_status published_fractions(const published *f, const pkv_gpu_spec *gpu, double *bw,
                                      double *compute) {
    *bw = *compute = 1;
    pkv_model_config m;
    if (f->decode_model) {
        if (pkv_model_preset(f->decode_model, &m) != PKV_OK) return PKV_ERR_NOT_FOUND;
        const double bytes = weights_read(&m, 2.0, 1); // fp16/bf16 weights, one token
        *bw = bytes * f->decode_tok_s / gpu->mem_bw;
    }
    if (f->prefill_model) {
        if (pkv_model_preset(f->prefill_model, &m) != PKV_OK) return PKV_ERR_NOT_FOUND;
        const double t = f->prefill_tokens;
        const double flops = 2.0 * (double)pkv_model_param_count(&m) * t +
                             4.0 * m.num_layers * (double)m.num_heads * m.head_dim * (t * (t + 1) / 2);
        *compute = flops / f->prefill_s / (f->prefill_peak > 0 ? f->prefill_peak : gpu->peak_flops);
    }
    // A measurement faster than the datasheet would be a wrong figure, not a fraction.
    return *bw > 0 && *bw <= 1 && *compute > 0 && *compute <= 1 ? PKV_OK : PKV_ERR_INVALID_ARG;
}

static const published *published_for(const char *gpu) {
    for (size_t i = 0; i < sizeof published_figures / sizeof published_figures[0]; i++)
        if (strcmp(published_figures[i].gpu, gpu) == 0) return &published_figures[i];
    return NULL;
}

// Achieved share of the host link's datasheet rate (PCIe x16: 32 GB/s Gen4,
// 64 GB/s Gen5) for the large pinned copies a swap makes, from NVIDIA's
// nvbandwidth tool as users published it (docs/POLICIES.md, "Host link"):
// - A100 (PCIe 4.0): NVIDIA/nvbandwidth issue 42, A100-SXM4-40GB,
//   host_to_device_memcpy_sm 25.13 GB/s at 512 MiB and 1 GiB buffers; issue 53,
//   A100-SXM4-80GB, device to host ~25 GB/s one way: 25.13 / 32 = 0.785 both ways.
// - H100 (PCIe 5.0): NVIDIA/nvbandwidth issue 24, H100 cluster, host to device
//   35.2 GB/s, device to host 52.77 GB/s (memcpy_sm). A swap moves the same bytes
//   out and back in, so the rate for both is their harmonic mean, 42.2 GB/s:
//   0.660 of 64.
// - H200: no figure found; the H100's (the same PCIe 5.0 x16 host interface).
static const struct {
    const char *gpu;
    double frac;
} host_link_published[] = {
    {"a100-80g", 25.13 / 32},
    {"h100-80g", 2 / (1 / 35.2 + 1 / 52.77) / 64},
    {"h200-141g", 2 / (1 / 35.2 + 1 / 52.77) / 64},
};

double pkv_replay_host_link_frac(const pkv_replay_params *p) {
    if (!p) return 1;
    const pkv_sim_efficiency *s = &p->sim_eff;
    // An explicit efficiency (peak, a calibration, the user's) keeps the link's
    // datasheet rate: its own figures say nothing about PCIe.
    if (s->bw_frac != 0 || s->compute_frac != 0 || s->step_overhead_s != 0) return 1;
    pkv_gpu_spec preset;
    if (pkv_gpu_preset(p->gpu.name, &preset) != PKV_OK ||
        preset.host_link_bw != p->gpu.host_link_bw)
        return 1; // a GPU of one's own: its link as given
    for (size_t i = 0; i < sizeof host_link_published / sizeof host_link_published[0]; i++)
        if (strcmp(host_link_published[i].gpu, p->gpu.name) == 0)
            return host_link_published[i].frac;
    return 1;
}

pkv_status pkv_sim_efficiency_for_gpu(const pkv_gpu_spec *gpu, pkv_sim_efficiency *eff) {
    if (!gpu || !eff) return PKV_ERR_INVALID_ARG;
    *eff = pkv_sim_efficiency_peak();
    pkv_gpu_spec preset;
    // The fractions are of the preset's datasheet rates: a spec with other rates
    // under a preset's name is a GPU of one's own.
    if (pkv_gpu_preset(gpu->name, &preset) != PKV_OK || preset.mem_bw != gpu->mem_bw ||
        preset.peak_flops != gpu->peak_flops) {
        snprintf(eff->source, sizeof eff->source, "peak: no published figures for this GPU");
        return PKV_ERR_NOT_FOUND;
    }
    const published *f = published_for(gpu->name);
    if (!f) return PKV_ERR_NOT_FOUND; // every preset has an entry (tested)
    const published *from = f->like ? published_for(f->like) : f;
    pkv_gpu_spec measured = preset;
    if (!from || (f->like && pkv_gpu_preset(f->like, &measured) != PKV_OK)) return PKV_ERR_NOT_FOUND;
    double bw, compute;
    pkv_status st = published_fractions(from, &measured, &bw, &compute);
    if (st != PKV_OK) return st;
    eff->bw_frac = bw;
    eff->compute_frac = compute;
    eff->step_overhead_s = 0;
    snprintf(eff->source, sizeof eff->source, "%s", f->source);
    return PKV_OK;
}

typedef struct roofline {
    pkvi_executor base;
    double weight_bytes;        // weights_read of zero tokens
    double row_bytes;           // embedding rows read per token
    double flops_per_token;     // 2 x params
    double attn_flops_per_pair; // 4 x layers x heads x head_dim
    double kv_bytes_per_token;
    int hetero;                      // the model has KV cache groups
    double attn_flops_per_layer_key; // 4 x heads x head_dim (groups: per layer and key)
    double active_frac;              // MoE: active / total parameters (1: dense)
    double peak_flops, mem_bw, host_bw; // achieved: peak x the efficiency fraction
    double overhead_s;                   // per step with work
    int copy_overlap;                    // device copies on a second stream
} roofline;

// One kernel's roofline time: max(flops / peak, bytes / bandwidth), both achieved.
static double kernel(const roofline *m, double flops, double bytes) {
    const double tc = flops / m->peak_flops, tm = bytes / m->mem_bw;
    return tc > tm ? tc : tm;
}

// A step is a sequence of kernels on one stream, each waiting for the one before
// (the attention reads the cache a copy wrote; the next layer's GEMM reads the
// attention's output), so its time is the sum of their rooflines, not one
// max() over the summed work, which would let a kernel's memory traffic hide
// under another's flops:
//   linear layers: one GEMM pass over every token of the step, prefill and decode
//     together (engines batch them: vLLM's mixed steps), reading the weights once;
//   prefill attention: its (query, key) pairs, reading the prefills' context and
//     writing their new K/V;
//   decode attention: a separate kernel (paged decode), reading every decoding
//     sequence's context and writing one token each;
//   device copies (realloc's move, regrowth, copy-on-write, fork copies, swap-in
//     landing): read and written, a kernel of their own before the attention that
//     reads them. With copy_overlap they run on a second stream during the linear
//     layers instead: their bytes join the GEMM's roofline (the two share HBM
//     bandwidth, so a copy hides only in a compute-bound GEMM's slack), and the
//     attention still waits for them.
// *flops and *bytes get the step's totals (for utilizations and calibration).
static double step_kernels(const roofline *m, const pkvi_step_batch *b, double *flops,
                           double *bytes, double *prefill_s, double *decode_s) {
    const double pt = (double)b->prefill_tokens, dt = (double)b->num_decode_seqs;
    const double tokens = pt + dt;
    const double copy = 2.0 * (double)b->copy_bytes;
    double f = 0, by = copy, t_gemm = 0, t_pa = 0, t_da = 0;
    double t_copy = copy / m->mem_bw;
    if (tokens > 0) {
        const double gf = m->flops_per_token * tokens;
        // MoE: a step reads the experts its tokens route to, at most every weight
        // (each token its active share; a bound, routing overlap not modelled).
        const double wb = m->active_frac < 1 && m->active_frac * tokens < 1
                              ? m->weight_bytes * m->active_frac * tokens
                              : m->weight_bytes;
        const double gb = wb + m->row_bytes * tokens;
        if (m->copy_overlap) {
            t_gemm = kernel(m, gf, gb + copy);
            t_copy = 0;
        } else {
            t_gemm = kernel(m, gf, gb);
        }
        f += gf;
        by += gb;
    }
    if (pt > 0) {
        // A model with groups: each group over the keys its queries see (groups.c).
        const double af = m->hetero ? m->attn_flops_per_layer_key * b->prefill_layer_keys
                                    : m->attn_flops_per_pair * b->prefill_attn_pairs;
        const double ab = m->hetero ? b->prefill_kv_bytes
                                    : m->kv_bytes_per_token * ((double)b->prefill_ctx_tokens + pt);
        t_pa = kernel(m, af, ab);
        f += af;
        by += ab;
    }
    if (dt > 0) {
        // A model with groups: each group over the keys it sees (groups.c).
        const double af = m->hetero ? m->attn_flops_per_layer_key * b->decode_layer_keys
                                    : m->attn_flops_per_pair * (double)b->decode_ctx_tokens;
        const double ab = m->hetero ? b->decode_kv_bytes
                                    : m->kv_bytes_per_token * ((double)b->decode_ctx_tokens + dt);
        t_da = kernel(m, af, ab);
        f += af;
        by += ab;
    }
    // The GEMM time split between prefill and decode by their tokens.
    *prefill_s = tokens > 0 ? t_gemm * pt / tokens + t_pa : 0;
    *decode_s = tokens > 0 ? t_gemm * dt / tokens + t_da : 0;
    *flops = f;
    *bytes = by;
    return t_gemm + t_pa + t_da + t_copy;
}

static pkv_status roofline_step(pkvi_executor *e, const pkvi_step_batch *b, double *seconds,
                                pkvi_step_time *parts) {
    const roofline *m = (const roofline *)e;
    memset(parts, 0, sizeof *parts);
    double f, by;
    double t = step_kernels(m, b, &f, &by, &parts->prefill_s, &parts->decode_s);
    if (b->prefill_tokens || b->num_decode_seqs) t += m->overhead_s;
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
    m->weight_bytes = weights_read(&p->model, p->dtype_bytes, 0);
    m->row_bytes = weights_read(&p->model, p->dtype_bytes, 1) - m->weight_bytes;
    m->flops_per_token = 2.0 * (double)params;
    m->attn_flops_per_pair = 4.0 * p->model.num_layers * (double)p->model.num_heads * p->model.head_dim;
    m->kv_bytes_per_token = (double)kvb;
    m->hetero = p->model.num_kv_groups > 0;
    m->attn_flops_per_layer_key = 4.0 * (double)p->model.num_heads * p->model.head_dim;
    // Mixture of experts: a token multiplies by its active parameters only
    // (pkv_model_active_param_count); dense models keep 2 x params as before.
    const uint64_t active = pkv_model_active_param_count(&p->model);
    if (active > 0 && active < params) {
        m->active_frac = (double)active / (double)params;
        m->flops_per_token = 2.0 * (double)active;
    } else {
        m->active_frac = 1;
    }
    pkv_sim_efficiency eff;
    pkv_status st = pkv_replay_sim_efficiency(p, &eff);
    if (st != PKV_OK) {
        free(m);
        return st;
    }
    m->peak_flops = p->gpu.peak_flops * eff.compute_frac;
    m->mem_bw = p->gpu.mem_bw * eff.bw_frac;
    m->host_bw = p->gpu.host_link_bw * pkv_replay_host_link_frac(p);
    m->overhead_s = eff.step_overhead_s;
    m->copy_overlap = p->copy_overlap;
    *out = &m->base;
    return PKV_OK;
}

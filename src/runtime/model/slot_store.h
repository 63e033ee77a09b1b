// SPDX-License-Identifier: MIT
// Internal: the CPU decoder's KV store over per-layer slot rows (slot_store.c),
// the layout of a pkv_hybrid_vmm (pkv/hybrid_vmm.h: one VMM space per KV cache
// group, a sequence one slot in each). Replay run mode's hybrid-vmm executor
// (src/runtime/replay/run_hybrid_vmm.c) builds it over the spaces' buffers, so
// the decoder reads K/V, latents and states in place, and a read of a page the
// window rule unmapped faults.
#ifndef PKV_MODEL_SLOT_STORE_H
#define PKV_MODEL_SLOT_STORE_H

#include <stdint.h>

#include "pkv/model.h"

typedef struct pkvi_slot_kv pkvi_slot_kv;

// Where layer l's rows lie: slot s's row of its K at k + s x slot_floats floats
// (token-major, [token][kv_head][head_dim]; MLA: [token][latent + rope]; a state
// layer: the state, kv_heads x head_dim^2 fp32); V likewise from v (NULL for
// MLA and state layers).
typedef struct pkvi_slot_layer {
    float *k, *v;
    uint64_t slot_floats;
} pkvi_slot_layer;

// A store of num_slots slots for `model` (a CPU model with fp32 KV) over the
// caller's rows (borrowed: the caller maps memory behind what each step reads).
// layers[model's num_layers] is copied. PKV_ERR_INVALID_ARG for a missing row, a
// slot stride too small for the model's tokens of max_len (or its state), or a
// model the CPU decoder's group loop cannot run; PKV_ERR_UNSUPPORTED on CUDA.
pkv_status pkvi_slot_kv_create(pkv_model *model, uint32_t num_slots, uint32_t max_len,
                               const pkvi_slot_layer *layers, pkvi_slot_kv **out);
void pkvi_slot_kv_destroy(pkvi_slot_kv *kv); // NULL does nothing

// One step over S sequences: sequence i is slot slots[i] of length lens[i] after
// the step, its last counts[i] tokens (tokens, packed) computed now. A sequence
// starting at position 0 starts from a zero state. next_tokens[S] (greedy) as
// pkv_model_prefill_paged.
pkv_status pkvi_model_forward_slots(pkv_model *m, pkvi_slot_kv *kv, uint32_t S,
                                    const uint32_t *slots, const uint32_t *lens,
                                    const uint32_t *counts, const int32_t *tokens,
                                    int32_t *next_tokens);

#endif // PKV_MODEL_SLOT_STORE_H

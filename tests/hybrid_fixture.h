// SPDX-License-Identifier: MIT
// What the hybrid KV manager's hand-computed tests (test_hybrid*.c) build their
// managers from, in one place: small groups whose bytes are easy to count, and the
// parameters at element size 1. Header-only (static inline): each test includes it.
#ifndef PKV_TEST_HYBRID_FIXTURE_H
#define PKV_TEST_HYBRID_FIXTURE_H

#include "pkv/hybrid.h"

// A group of `layers` layers: 1 KV head x head_dim 1 (2 x layers bytes per token
// at element size 1), an MLA group a latent of `latent` + 1 rope values per layer,
// a state group `state_bytes` per sequence; `window` for SLIDING / CHUNKED.
static inline pkv_kv_group hybrid_test_group_sized(pkv_layer_kind kind, uint32_t layers,
                                                   uint32_t window, uint32_t latent,
                                                   uint64_t state_bytes) {
    pkv_kv_group g = {.kind = kind, .num_layers = layers, .window = window};
    if (kind == PKV_LAYER_MLA) g.latent_dim = latent, g.rope_dim = 1;
    else if (kind == PKV_LAYER_STATE) g.state_bytes = state_bytes;
    else g.num_kv_heads = 1, g.head_dim = 1;
    return g;
}

// The usual one: an MLA latent of 1 (2 x layers bytes per token), states of 100 bytes.
static inline pkv_kv_group hybrid_test_group(pkv_layer_kind kind, uint32_t layers,
                                             uint32_t window) {
    return hybrid_test_group_sized(kind, layers, window, 1, 100);
}

// pkv_hybrid_params_default with `groups` (borrowed), element size 1, the layout,
// the budget and the block size; the test sets the rest (max_seqs, block_sizes,
// the prefix cache, events) before pkv_hybrid_create.
static inline pkv_hybrid_params hybrid_test_params(const pkv_kv_group *groups, uint32_t n,
                                                   pkv_hybrid_layout layout, uint64_t budget,
                                                   uint32_t block_size) {
    pkv_hybrid_params p;
    pkv_hybrid_params_default(&p);
    p.groups = groups;
    p.num_groups = n;
    p.elem_bytes = 1;
    p.layout = layout;
    p.budget_bytes = budget;
    p.block_size = block_size;
    return p;
}

#endif // PKV_TEST_HYBRID_FIXTURE_H

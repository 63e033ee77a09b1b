// SPDX-License-Identifier: MIT
// Internal: what the model's hybrid store (pkv/model.h, hybrid_store.c) shows of
// its memory, for tests that poison the memory no live block uses and check that
// no step reads it.
#ifndef PKV_MODEL_HYBRID_STORE_H
#define PKV_MODEL_HYBRID_STORE_H

#include "pkv/backend.h"
#include "pkv/model.h"

// Region r of the store: *data (borrowed), *bytes. PKV_ERR_INVALID_ARG past the last.
pkv_status pkvi_hybrid_store_region(pkv_model_hybrid_store *store, uint32_t r, float **data,
                                    uint64_t *bytes);

// The store's states (borrowed; NULL without a state group), keyed by a sequence's
// slot in state group *group (-1 without): one entry holds every state layer's.
pkv_status pkvi_hybrid_store_states(pkv_model_hybrid_store *store, int32_t *group,
                                    pkv_model_state_store **states);

// Where block b of token group g lies: region *r, bytes *offset .. + *bytes.
// PKV_ERR_INVALID_ARG for a state group or b past the group's blocks.
pkv_status pkvi_hybrid_store_block(const pkv_model_hybrid_store *store, uint32_t g, uint32_t b,
                                   uint32_t *r, uint64_t *offset, uint64_t *bytes);

// pkv_model_hybrid_store_create; widen 1 also takes a manager whose elem_bytes
// divides dtype's size, every byte of its map scaled to dtype (the same blocks in
// wider elements: replay run mode, whose policies size their managers in the
// trace's KV dtype while the CPU decoder stores fp32, as its paged cache does).
// backend (borrowed, a host backend that outlives the store): the memory is one
// allocation of it (NULL: malloc).
pkv_status pkvi_hybrid_store_create(pkv_model *model, pkv_hybrid *kv, pkv_dtype dtype, int widen,
                                    pkv_backend *backend, pkv_model_hybrid_store **out);

// Run copies that someone else took from the manager (pkv_hybrid_take_copies of
// group g, in queue order): block copies within the memory of every group on g's
// table, state copies on the store's states. PKV_ERR_INVALID_ARG for a block
// outside the group. *copied (optional) grows by the bytes copied: a whole page
// of the store (its element size) per block copy and group on the table, a whole
// per-sequence state (every state layer) per state copy whose source holds one.
pkv_status pkvi_hybrid_store_apply_copies(pkv_model_hybrid_store *store, uint32_t g,
                                          const pkv_block_copy *copies, uint32_t n,
                                          uint64_t *copied);

#endif // PKV_MODEL_HYBRID_STORE_H

// SPDX-License-Identifier: MIT
// Internal: what the model's hybrid store (pkv/model.h, hybrid_store.c) shows of
// its memory, for tests that poison the memory no live block uses and check that
// no step reads it.
#ifndef PKV_MODEL_HYBRID_STORE_H
#define PKV_MODEL_HYBRID_STORE_H

#include "pkv/model.h"

// Region r of the store: *data (borrowed), *bytes. PKV_ERR_INVALID_ARG past the last.
pkv_status pkvi_hybrid_store_region(pkv_model_hybrid_store *store, uint32_t r, float **data,
                                    uint64_t *bytes);

// Where block b of token group g lies: region *r, bytes *offset .. + *bytes.
// PKV_ERR_INVALID_ARG for a state group or b past the group's blocks.
pkv_status pkvi_hybrid_store_block(const pkv_model_hybrid_store *store, uint32_t g, uint32_t b,
                                   uint32_t *r, uint64_t *offset, uint64_t *bytes);

#endif // PKV_MODEL_HYBRID_STORE_H

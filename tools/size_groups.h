// SPDX-License-Identifier: MIT
// pkv-size's report for a model with KV cache groups (issue 23): one row per group and
// what each context length costs with window-aware allocation and without it.
#ifndef PKV_TOOLS_SIZE_GROUPS_H
#define PKV_TOOLS_SIZE_GROUPS_H

#include <stdint.h>

#include "pkv/model_config.h"

typedef struct size_groups_opts {
    const char *dtype;      // KV dtype name
    uint64_t elem_bytes;    // its bytes per value
    const uint64_t *seqs;   // [num_seqs] context lengths to cost
    uint32_t num_seqs;
    uint64_t batch;         // requests
    uint64_t params;        // weights' parameters (total)
    uint64_t weights_bytes; // params x weight element bytes
    int have_memory;        // 1: memory_bytes / gpu_util give a KV budget
    uint64_t memory_bytes;
    double gpu_util;
    int json;
} size_groups_opts;

// Print the report on stdout; 0, or 2 (message on stderr) when a size does not fit in
// 64 bits.
int size_groups_report(const pkv_model_config *c, const size_groups_opts *o);

#endif

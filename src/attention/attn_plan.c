// SPDX-License-Identifier: MIT
// The split-K (flash-decoding) plan of the CUDA decode kernels, as plain host
// arithmetic so that every build has it and the unit tests can check it.
// Invariant: the plan depends only on its arguments (no device query here).
#include "attn_internal.h"

void pkvi_attn_cuda_groups(const pkv_attn_shape *shape, uint32_t *heads_per_cta,
                           uint32_t *groups_per_kv_head) {
    uint32_t g = shape->num_heads / shape->num_kv_heads;
    uint32_t h = g;
    while (h > PKVI_ATTN_CUDA_MAX_GROUP) { // largest divisor of the group that fits
        uint32_t x = PKVI_ATTN_CUDA_MAX_GROUP;
        while (g % x != 0) {
            x--;
        }
        h = x;
    }
    *heads_per_cta = h;
    *groups_per_kv_head = g / h;
}

void pkvi_attn_partition(uint32_t max_context, uint32_t num_splits, uint32_t *part_len,
                         uint32_t *parts) {
    if (num_splits <= 1) {
        *part_len = max_context;
        *parts = 1;
        return;
    }
    uint32_t len = (max_context + num_splits - 1) / num_splits;
    len = (len + 255u) / 256u * 256u; // whole kernel tiles
    *part_len = len;
    *parts = (max_context + len - 1) / len;
}

// Modelled time of a plan, in token rows per thread block: every wave of
// blocks_per_sm x num_sms resident blocks takes as long as one block's partition
// (all sequences assumed max_context long, the worst case the plan must serve)
// plus a fixed cost per block (q load, the final reduction, its share of the merge)
// of PKVI_ATTN_BLOCK_COST token rows. A partial last wave costs a whole wave.
static uint64_t plan_cost(uint64_t ctas, uint64_t wave, uint32_t part_len, uint32_t parts) {
    uint64_t blocks = ctas * parts;
    uint64_t waves = (blocks + wave - 1) / wave;
    return waves * ((uint64_t)part_len + PKVI_ATTN_BLOCK_COST);
}

pkv_status pkvi_attn_num_splits(const pkv_attn_shape *shape, uint32_t num_seqs,
                                uint32_t max_context, uint32_t num_sms, uint32_t blocks_per_sm,
                                uint32_t max_splits, uint32_t *num_splits) {
    if (shape == NULL || num_splits == NULL || shape->num_kv_heads == 0 ||
        shape->num_heads == 0 || shape->num_heads % shape->num_kv_heads != 0 ||
        num_sms == 0 || blocks_per_sm == 0 || max_context == 0) {
        return PKV_ERR_INVALID_ARG;
    }
    uint32_t hpc;
    uint32_t gpk;
    pkvi_attn_cuda_groups(shape, &hpc, &gpk);
    // Thread blocks without splitting: one per (sequence, kv head, head group).
    uint64_t ctas = (uint64_t)num_seqs * shape->num_kv_heads * gpk;
    uint64_t wave = (uint64_t)blocks_per_sm * num_sms; // resident blocks of one wave
    uint32_t max_by_len = max_context / PKVI_ATTN_MIN_PARTITION;
    if (max_by_len > PKVI_ATTN_MAX_SPLITS) {
        max_by_len = PKVI_ATTN_MAX_SPLITS;
    }
    if (max_by_len > max_splits) {
        max_by_len = max_splits; // what the caller's workspace holds
    }
    *num_splits = 1;
    // Past 2^24 blocks (thousands of waves) a split gains nothing, and the cost
    // products below stay under 2^63 (2^24 x 64 blocks x 2^32 rows).
    if (ctas == 0 || ctas > (1u << 24) || max_by_len < 2) {
        return PKV_OK;
    }
    // Wave-aware: the split count whose grid fills whole waves best, by the cost
    // model above (a batch that is 1.2 waves unsplit can gain from splitting too).
    // Ties keep the fewer partitions: less workspace, a smaller merge.
    uint64_t best = plan_cost(ctas, wave, max_context, 1);
    for (uint32_t want = 2; want <= max_by_len; want++) {
        uint32_t part_len;
        uint32_t parts;
        pkvi_attn_partition(max_context, want, &part_len, &parts);
        uint64_t cost = plan_cost(ctas, wave, part_len, parts);
        if (cost < best) {
            best = cost;
            *num_splits = parts;
        }
    }
    return PKV_OK;
}

pkv_status pkv_attn_cuda_num_splits(const pkv_attn_shape *shape, uint32_t num_seqs,
                                    uint32_t max_context, uint32_t num_sms,
                                    uint32_t *num_splits) {
    return pkvi_attn_num_splits(shape, num_seqs, max_context, num_sms, 2, PKVI_ATTN_MAX_SPLITS,
                                num_splits);
}

pkv_status pkv_attn_cuda_workspace_bytes(const pkv_attn_shape *shape, uint32_t num_seqs,
                                         uint32_t num_splits, size_t *bytes) {
    if (shape == NULL || bytes == NULL || shape->head_dim == 0 || shape->num_heads == 0 ||
        num_splits == 0) {
        return PKV_ERR_INVALID_ARG;
    }
    if (num_splits == 1) {
        *bytes = 0;
        return PKV_OK;
    }
    // Per (sequence, head, partition): head_dim fp32 outputs, a max and a sum.
    // Each product is checked: 2^16 sequences x 2^16 heads x 2^16 splits x a
    // large head_dim wraps 64 bits (and a 32-bit size_t much sooner).
    uint64_t per = ((uint64_t)shape->head_dim + 2u) * sizeof(float);
    uint64_t n = (uint64_t)num_seqs * shape->num_heads; // < 2^64: two 32-bit factors
    if (n != 0 && (num_splits > UINT64_MAX / n || per > UINT64_MAX / (n * num_splits))) {
        return PKV_ERR_INVALID_ARG;
    }
    uint64_t total = n * num_splits * per;
    if (total > (uint64_t)SIZE_MAX) {
        return PKV_ERR_INVALID_ARG;
    }
    *bytes = (size_t)total;
    return PKV_OK;
}

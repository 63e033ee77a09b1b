// SPDX-License-Identifier: MIT
// Prefix-cache hits across KV cache groups (hybrid models, issue 23 item 4).
//
// A model with several KV cache groups (full attention, sliding window, chunked
// local, MLA, linear-attention state; model_config.h) can reuse a cached prefix of
// L tokens only if EVERY group has what the next query at position L needs:
//   - FULL, MLA: every block of tokens 0..L-1;
//   - SLIDING (window W): the blocks of tokens max(0, L-W+1)..L-1 (the next query
//     sees W tokens, itself included); earlier blocks may be gone;
//   - CHUNKED (chunk C): the blocks of tokens floor(L/C)*C..L-1 (the next query's
//     chunk up to it); earlier chunks may be gone;
//   - STATE: the state after token L-1 (states are cached at block boundaries).
// L is a multiple of every group's block size (a hit ends on a block boundary in
// every group) and at most max_tokens (an engine passes prompt length - 1, so the
// last prompt token is computed and gives the first logits). The hit is the largest
// such L; the shortest group's hit bounds it (the Jenga paper's observation that
// only the common hit length is worth anything, and vLLM's hybrid coordinator's rule).
//
// The functions here are pure: the caller says which of a request's blocks each
// group has cached (e.g. from pkv_prefix_pool_find_prefix or its own table) and
// gets the hit and, per group, the blocks to reuse. pkv_prefix_pool_find_hybrid_prefix
// (prefix_pool.h) does the lookups too.
//
// Thread-safety: no state; reentrant.
#ifndef PKV_HYBRID_HIT_H
#define PKV_HYBRID_HIT_H

#include <stdint.h>

#include "pkv/model_config.h"
#include "pkv/status.h"

#ifdef __cplusplus
extern "C" {
#endif

// One group's view of a request. Plain data; `cached` is borrowed.
typedef struct pkv_hit_group {
    pkv_layer_kind kind;  // the group's layer kind
    uint32_t window;      // SLIDING: window in tokens; CHUNKED: chunk in tokens; else ignored
    uint32_t block_size;  // tokens per block of this group (STATE: the interval at which
                          // states are cached); >= 1
    uint32_t num_blocks;  // entries in `cached`: the request's full blocks in this group
    const uint8_t *cached; // cached[i] != 0: block i (tokens i*B..i*B+B-1) is cached in
                           // this group; STATE: a state after token (i+1)*B-1 is cached
} pkv_hit_group;

// The longest common hit L (tokens) of `num_groups` groups (1..PKV_MAX_KV_GROUPS),
// L <= max_tokens. PKV_ERR_INVALID_ARG for a NULL pointer, a block size or a window
// of 0, an unknown kind, or block sizes whose least common multiple exceeds 2^31
// (then no hit could be aligned). O(sum of num_blocks).
pkv_status pkv_hybrid_longest_hit(const pkv_hit_group *groups, uint32_t num_groups,
                                  uint32_t max_tokens, uint32_t *hit_tokens);

// The blocks group g reuses for a hit of hit_tokens (a multiple of its block size):
// indices first .. hit_tokens / block_size - 1 (*first = 0 for FULL and MLA; for
// SLIDING and CHUNKED the first block the next query can see; STATE: the one block
// hit_tokens / block_size - 1 whose state is reused, or none for a hit of 0).
// Blocks before *first are not needed: an engine pads them with a null block.
// *count = the number of blocks reused. PKV_ERR_INVALID_ARG as above or for a
// hit_tokens that is not a multiple of block_size.
pkv_status pkv_hybrid_hit_blocks(const pkv_hit_group *group, uint32_t hit_tokens, uint32_t *first,
                                 uint32_t *count);

#ifdef __cplusplus
}
#endif

#endif // PKV_HYBRID_HIT_H

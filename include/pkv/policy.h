// SPDX-License-Identifier: MIT
// The KV policy interface of the trace replay: one table of functions (a
// pkv_policy_vtable) per policy. The replay engine (pkv_replay_run) drives every
// policy through this table only, the built-in ones included (pkv_policy_builtin
// returns theirs), so a policy written in one external C file against the
// installed headers runs exactly as a built-in one does. docs/POLICIES.md,
// "Writing a policy", walks through an example.
//
// Units: memory is counted in token slots (one token's K/V of every layer,
// cfg->bytes_per_token bytes). Requests are named by their index in the trace
// (0 .. num_requests - 1); a request has up to max_seqs[r] sequences ("children",
// 0 .. nseq - 1) that share its prompt.
//
// The engine's calls, in the order a request sees them:
//   admit (all or nothing; retried every step while refused)
//   -> commit (its prefill step ended: the prompt's K/V exist)
//   -> fork (n > 1: one sequence becomes n; never needs memory the admission did
//      not account for, or returns PKV_ERR_OUT_OF_BLOCKS)
//   -> grow, once per sequence per decode step (PKV_ERR_OUT_OF_BLOCKS: the engine
//      preempts the newest request and retries)
//   -> release (finished or preempted; a preempted request is admitted again
//      later with nseq sequences of len tokens), or swap_out when a preemption by
//      swap moves it to the host pool and the policy has that slot (then swap_in,
//      not admit, brings it back; release frees it if it is dropped while out).
// After every step the engine reads stats() and reservation() for the reports.
// The engine believes no answer it builds on: a status a slot may not return,
// stats with used > reserved or reserved > capacity, a cached count above the
// prompt or a granularity outside 1..capacity_slots stop the run with
// PKV_ERR_CORRUPT and a message naming the policy, the slot and the value
// (pkv_replay_run, report->failure), in every mode.
//
// Backend calls: a policy that models device allocation calls (cudaMalloc per
// request, per token, ...) reports each through cfg->host.backend_calls; the
// engine counts them, prices them with the replay's cost model and charges them
// to the step in which they happen. A policy that carves one arena out of the
// budget sets info->uses_arena and makes no call: the engine counts one arena
// allocation before the first step and one free after the last.
//
// Plugins (pkv-replay --policy-plugin FILE.so): a shared object that exports
//   const pkv_policy_vtable *pkv_policy_plugin_entry(uint32_t host_abi);
// (symbol name PKV_POLICY_PLUGIN_ENTRY). pkv-replay calls it with
// PKV_POLICY_ABI_VERSION; the plugin returns its table (static storage, or NULL
// if it cannot serve that ABI), whose abi_version must equal the host's, else
// pkv-replay refuses it (exit 2). The table and everything it points to must
// stay valid until the process exits. A plugin needs no symbol of libpagedkv:
// what the engine offers reaches it through cfg->host (it may still link the
// library to use pkv_pool / pkv_seqset).
//
// Thread-safety: one policy state is used by one replay at a time; create must
// not use global state, so that concurrent replays stay independent.
#ifndef PKV_POLICY_H
#define PKV_POLICY_H

#include <stddef.h>
#include <stdint.h>

#include "pkv/model_config.h"
#include "pkv/seq.h"
#include "pkv/status.h"
#include "pkv/trace.h"

#ifdef __cplusplus
extern "C" {
#endif

// Bumped whenever a struct below changes layout or a slot changes meaning.
// 2: pkv_policy_vtable.extent_of (run mode on a contiguous layout).
// 3: KV cache groups (issue 23): pkv_policy_config.{num_groups, groups,
//    group_bytes_per_token, elem_bytes} and pkv_policy_stats.{num_groups, groups};
//    pkv_policy_vtable.{swap_out, swap_in} (0.3.0 is unreleased: still ABI 3).
#define PKV_POLICY_ABI_VERSION 3u
#define PKV_POLICY_PLUGIN_ENTRY "pkv_policy_plugin_entry"

// What a request needs when it is (re)admitted. A new request has one sequence
// of len = prompt tokens; a preempted one comes back with nseq sequences that
// share the prompt and each hold len tokens. Plain data.
typedef struct pkv_policy_admit {
    uint32_t prompt;    // prompt tokens (shared by the request's sequences)
    uint32_t len;       // tokens each sequence holds after admission
    uint32_t final_len; // tokens each sequence will hold at the end (prompt + output - 1)
    uint32_t nseq;      // sequences now (1 for a new request)
    uint32_t n;         // sequences after the fork (the trace's n; 1 for one-token outputs)
    int independent;    // run-mode restore: each sequence rebuilt alone, no sharing
} pkv_policy_admit;

typedef enum pkv_backend_call {
    PKV_BACKEND_CALL_ALLOC = 0, // cudaMalloc, malloc, cuMemMap, ...
    PKV_BACKEND_CALL_FREE = 1,  // cudaFree, free, cuMemUnmap, ...
    // Flag, OR-ed with one of the above: issued off the critical path (a
    // background thread), so it overlaps the step even if the call synchronizes.
    PKV_BACKEND_CALL_OVERLAPPED = 0x10,
} pkv_backend_call;

struct pkv_replay_params; // pkv/replay.h

// Services the engine gives a policy. Plain data; ctx is the engine's.
typedef struct pkv_policy_host {
    void *ctx;
    // `count` backend calls of `kind`, each of `bytes` bytes, made now: counted,
    // priced by the replay's cost model and charged to the current step.
    void (*backend_calls)(void *ctx, pkv_backend_call kind, uint64_t bytes, uint64_t count);
} pkv_policy_host;

// What a policy is created for. Plain data; every pointer is borrowed and
// outlives the policy.
typedef struct pkv_policy_config {
    uint32_t abi_version;     // PKV_POLICY_ABI_VERSION of the engine
    uint64_t capacity_bytes;  // the KV budget
    uint64_t bytes_per_token; // one token slot
    uint32_t block_size;      // --block-size (paged-like policies; others may ignore it)
    uint32_t max_seq_len;     // longest sequence the engine admits
    uint32_t num_requests;    // requests in the trace
    const uint32_t *max_seqs; // [num_requests]: the n of each request
    const pkv_trace *trace;   // token ids / prefix groups, for prefix sharing
    int prefix_sharing;       // 1: the policy may share prompt prefixes across requests
    int run_mode;             // 1: the decoder executes the steps (layout must be real)
    // Every parameter of the replay (options of a policy's own, e.g. the vmm
    // page size, live there); read-only.
    const struct pkv_replay_params *params;
    pkv_policy_host host;
    // ABI 3: the model's KV cache groups (pkv_model_kv_groups: one FULL group of
    // every layer for a uniform model). A token slot (bytes_per_token) is one
    // token of every group: sum of group_bytes_per_token. A policy may treat
    // every layer as full attention (one slot per token, as before) or apply the
    // groups' rules (pkv/hybrid.h) and report what each group holds in its stats.
    uint32_t num_groups;                               // 1..PKV_MAX_KV_GROUPS
    pkv_kv_group groups[PKV_MAX_KV_GROUPS];            // [num_groups]
    uint64_t group_bytes_per_token[PKV_MAX_KV_GROUPS]; // [num_groups]; 0 for a state group
    uint32_t elem_bytes;                               // stored bytes per KV element
} pkv_policy_config;

// What a policy says about itself at creation. Plain data.
typedef struct pkv_policy_info {
    uint64_t capacity_slots; // slots it can hold (<= capacity_bytes / bytes_per_token)
    uint32_t granularity;    // slots per allocation unit (block size; 1 if token-granular)
    int uses_arena;          // 1: one allocation of the whole budget, made outside the steps
} pkv_policy_info;

// Totals over the whole policy, in slots and calls. Plain data.
typedef struct pkv_policy_stats {
    uint64_t used;          // distinct physical slots holding a token state
    uint64_t reserved;      // slots held for live sequences (used <= reserved <= capacity)
    uint64_t free;          // slots a new allocation could still take (capacity - reserved,
                            // plus reclaimable ones such as cache-only prefix blocks)
    uint64_t copy_slots;    // token slots copied on device so far (CoW, fork copies, moves)
    uint64_t cow_copies;    // copy-on-write block copies so far
    uint64_t cached_tokens; // prompt tokens served by a prefix cache so far
    // ABI 3, per KV cache group (cfg->groups order). num_groups 0: the policy keeps
    // every layer's K/V for every reserved slot (group-unaware; the engine then
    // counts reserved slots under every group); else num_groups == cfg->num_groups.
    uint32_t num_groups;
    struct pkv_policy_group_stats {
        uint64_t bytes_held;      // bytes of the blocks (state slots) the group holds
        uint64_t tokens_held;     // token slots in those blocks (0 for a state group)
        uint64_t blocks_held;     // distinct blocks (state slots) held
        uint64_t blocks_released; // so far: blocks freed by the window rule
        uint64_t cached_tokens;   // so far: prompt tokens the group served from a
                                  // prefix cache (0 without one)
    } groups[PKV_MAX_KV_GROUPS];
} pkv_policy_stats;

typedef struct pkv_policy_vtable {
    uint32_t abi_version; // PKV_POLICY_ABI_VERSION the policy was compiled against
    const char *name;     // shown in reports (at most 31 bytes)

    // Build a policy for cfg; *info says its capacity. PKV_ERR_OUT_OF_BLOCKS if the
    // budget holds not one allocation unit (the engine then rejects every request
    // for memory); PKV_ERR_INVALID_ARG for a config it cannot serve. *state is
    // owned by the engine and released with destroy.
    pkv_status (*create)(const pkv_policy_config *cfg, pkv_policy_info *info, void **state);
    void (*destroy)(void *state); // NULL does nothing

    // Slots request `a` needs at its peak when it runs alone in an empty budget
    // (watermark excluded). Stateless: used before a policy exists.
    uint64_t (*need)(const pkv_policy_config *cfg, const pkv_policy_admit *a);
    // 1 if `a` could run alone in the empty budget: admitted with `watermark`
    // slots left free, then grown to final_len.
    int (*fits_alone)(const void *state, const pkv_policy_admit *a, uint64_t watermark);

    // Admit request r; all or nothing. PKV_ERR_OUT_OF_BLOCKS if it does not fit
    // with `watermark` slots left free; *ext_frag (slots) is then the free space
    // it could not use because no extent was large enough (0 if none). On
    // success *cached is the number of prompt tokens it found already computed
    // (prefix cache; 0 without one).
    pkv_status (*admit)(void *state, uint32_t r, const pkv_policy_admit *a, uint64_t watermark,
                        uint64_t *ext_frag, uint32_t *cached);
    // Request r's prefill step ended: its prompt's K/V exist. Optional (NULL).
    void (*commit)(void *state, uint32_t r, uint32_t prompt);
    // Fork request r's single sequence into n.
    pkv_status (*fork)(void *state, uint32_t r, uint32_t n);
    // Append one token slot to sequence `child` of request r. PKV_ERR_OUT_OF_BLOCKS
    // if memory is short (nothing changed).
    pkv_status (*grow)(void *state, uint32_t r, uint32_t child);
    // Free every sequence of request r.
    void (*release)(void *state, uint32_t r);

    // Totals now.
    void (*stats)(const void *state, pkv_policy_stats *stats);
    // Slots request r holds that its live sequences will fill later (its nseq
    // sequences hold len tokens each and will reach final_len).
    uint64_t (*reservation)(const void *state, uint32_t r, uint32_t nseq, uint32_t len,
                            uint32_t final_len);
    // Slots request r's KV occupies, counting shared slots once (what a swap
    // moves). Asked at a swap-out, before release. Optional: NULL means nseq x len.
    uint64_t (*request_slots)(const void *state, uint32_t r, uint32_t nseq, uint32_t len,
                              uint32_t prompt);
    // Check every internal invariant (pkv-replay --validate). Optional.
    pkv_status (*validate)(const void *state);

    // Run mode (optional: NULL and pkv_replay_run returns PKV_ERR_UNSUPPORTED in
    // run mode). The decoder reads and writes the policy's sequences through a
    // pkv_seqset (block tables over a pkv_pool) that the policy owns.
    pkv_seqset *(*seqset)(void *state);
    pkv_seq_id (*seq_of)(const void *state, uint32_t r, uint32_t child); // -1 if none
    // Block copies (copy-on-write) queued since the last call, to execute before
    // the step; the array stays valid until the next grow. Optional.
    uint32_t (*take_copies)(void *state, const pkv_block_copy **copies);
    // Run mode on a contiguous layout (optional; used when seqset is NULL): the
    // extent of token slots [*offset, *offset + *slots) of the budget that
    // sequence `child` of request r holds now (*slots 0: none). The decoder then
    // keeps each sequence's K/V in exactly that extent of one arena of the
    // budget's size and reads it with the contiguous kernel; when an extent moves
    // (regrowth, realloc-and-copy) the executor copies the sequence's K/V to the
    // new one, and a fork copies the parent's into each sample's extent. Extents of
    // live sequences must not overlap. Without it (and without seqset) run mode
    // stores the K/V in a per-token table (block size 1) over one arena.
    void (*extent_of)(const void *state, uint32_t r, uint32_t child, uint64_t *offset,
                      uint64_t *slots);

    // Swap (optional; both or neither, ABI 3). Without them a swapped request is
    // released and later admitted again with its whole length (a policy whose
    // groups keep only a window would then hold the whole context at swap-in).
    // swap_out: request r is preempted by swap and the host pool takes the bytes
    // request_slots said (asked just before): called instead of release. The policy
    // keeps exactly what the swap moves off the budget (the hybrid policies: their
    // sequences moved to a host-side manager by pkv_hybrid_move, a sliding group
    // only its window's blocks) and frees r's memory in the budget. PKV_OK, or any
    // other status: the engine then releases r (whatever swap_out did to it) and
    // recomputes it later (a swap fallback).
    pkv_status (*swap_out)(void *state, uint32_t r);
    // Bring swapped-out request r back (`a` as admit's: nseq sequences of len
    // tokens): all or nothing, with `watermark` slots left free, holding exactly
    // what swap_out kept (no prefix lookup: nothing is computed). PKV_OK;
    // PKV_ERR_OUT_OF_BLOCKS (r stays out, *ext_frag as admit's). release(r) while
    // r is out frees what swap_out kept.
    pkv_status (*swap_in)(void *state, uint32_t r, const pkv_policy_admit *a, uint64_t watermark,
                          uint64_t *ext_frag);
} pkv_policy_vtable;

// The type of the plugin entry point.
typedef const pkv_policy_vtable *(*pkv_policy_plugin_entry_fn)(uint32_t host_abi);

// A built-in policy's table (the replay's own policies use nothing else).
// NULL for a value outside pkv_policy (declared in pkv/replay.h).
const pkv_policy_vtable *pkv_policy_builtin(int policy);

// PKV_OK if `vt` can be driven by this engine: the ABI matches and every
// mandatory slot is set. PKV_ERR_INVALID_ARG otherwise; `why` (optional, why_len
// bytes) names the problem.
pkv_status pkv_policy_vtable_check(const pkv_policy_vtable *vt, char *why, size_t why_len);

#ifdef __cplusplus
}
#endif

#endif // PKV_POLICY_H

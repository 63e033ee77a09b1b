// SPDX-License-Identifier: MIT
// The decoder model and its step-level API. A pkv_model holds the weights of one
// decoder (pkv_model_config: GPT-2 style, or Llama style with RMSNorm, RoPE,
// SwiGLU, GQA) on one device (CPU or CUDA) and runs forward passes whose keys and
// values go to a KV store that the CALLER owns:
//   - a paged store: a pkv_cache (memory) + a pkv_seqset (block tables), or
//   - a contiguous store: a pkv_contig_kv (one row of consecutive slots per
//     sequence, at a fixed stride or where the caller places it),
// or to no store at all (pkv_model_forward_nocache recomputes whole sequences).
// The same forward code runs every store and both devices; on CUDA every store
// (and the no-cache path, which prefills through a contiguous one) needs a
// head_dim the CUDA attention kernels take: 64, 128 or 256 (else
// PKV_ERR_UNSUPPORTED).
//
// Step protocol (paged), for an external scheduler:
//   1. pkv_seq_append(set, id, n, NULL) for every sequence that gets n new tokens
//      (the scheduler owns block allocation, forks and preemption);
//   2. pkv_model_prefill_paged (n >= 1 tokens per sequence, e.g. a prompt) or
//      pkv_model_decode_paged (exactly 1 token per sequence). The new tokens are
//      the LAST n positions of each sequence: their K/V are computed and written
//      into the slots the append took; earlier positions must already hold K/V.
//      Queued copy-on-write copies of `set` are executed first
//      (pkv_cache_apply_copies), so a forked sequence may append right away.
//   3. read logits [num_seqs][vocab] of each sequence's last new token and/or the
//      greedy next token; sample (generate.h) and go to 1.
// The contiguous store follows the same protocol with pkv_contig_kv_append.
//
// Numerics: weights and activations are fp32; the KV store is fp32 by default,
// or fp16 / bf16 (q, k, v are rounded to the store's dtype before attention,
// attention accumulates in fp32, its output is widened back to fp32).
// Thread-safety: a model is used by one thread at a time (it owns scratch
// buffers); different models are independent. CPU GEMMs use OpenBLAS, whose
// thread count follows OPENBLAS_NUM_THREADS; attention uses params.num_threads.
#ifndef PKV_MODEL_H
#define PKV_MODEL_H

#include <stddef.h>
#include <stdint.h>

#include "pkv/cache.h"
#include "pkv/hybrid.h"
#include "pkv/model_config.h"
#include "pkv/seq.h"
#include "pkv/status.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef enum pkv_device {
    PKV_DEVICE_CPU = 0,  // host memory, OpenBLAS GEMMs, CPU attention
    PKV_DEVICE_CUDA = 1, // device memory, cuBLAS GEMMs, CUDA attention kernels
} pkv_device;

const char *pkv_device_name(pkv_device device); // "cpu", "cuda" or "unknown"

typedef struct pkv_model pkv_model;

// How to build a model. Plain data; start from pkv_model_params_default().
typedef struct pkv_model_params {
    pkv_device device;    // default PKV_DEVICE_CPU
    int cuda_device;      // CUDA device ordinal (default 0)
    uint64_t seed;        // random weights: same seed, same config -> same weights
    uint32_t num_threads; // CPU attention threads, 0 = all cores (default 0). For
                          // small models 1 is faster: decode is memory-bound and
                          // an OpenMP team spin-waiting beside BLAS threads on a
                          // busy machine stalls (docs/bench_runtime.md)
    int profile;          // 1: time every op class (on CUDA this synchronizes per op)
} pkv_model_params;

pkv_model_params pkv_model_params_default(void);

// Bytes of the model's fp32 weights (param count x 4). 0 for an invalid config.
uint64_t pkv_model_weight_bytes(const pkv_model_config *config);

// Build a model with deterministic random weights (uniform, std 0.02; norm scales
// 1, norm shifts 0) from params->seed. config, params: borrowed. *out is owned by
// the caller. PKV_ERR_INVALID_ARG for an invalid config, PKV_ERR_OUT_OF_MEMORY if
// the weights cannot be allocated, PKV_ERR_UNSUPPORTED / PKV_ERR_NO_DEVICE for
// CUDA in a build without it / on a machine without a device. A config with KV cache
// groups (0.3.0) runs on the CPU with fp32 K/V stores only: sliding-window, chunked
// and full layers (with or without attention sinks) and MLA layers (one MLA shape;
// latent + rope_dim <= kv_heads x head_dim and heads x rope_dim <= kv_heads x
// head_dim) and state layers (a decayed linear-attention state per sequence, kept in a
// pkv_model_state_store: see "state layers" below; state_bytes must be kv_heads x
// head_dim x head_dim x 4); PKV_ERR_UNSUPPORTED for CUDA and for other MLA or state
// shapes; the steps return PKV_ERR_UNSUPPORTED for other store dtypes.
pkv_status pkv_model_create(const pkv_model_config *config, const pkv_model_params *params,
                            pkv_model **out);

// Load a llama2.c checkpoint (karpathy/llama2.c "run.c" format, version 0):
//   header: 7 little-endian int32: dim, hidden_dim, n_layers, n_heads, n_kv_heads,
//           vocab_size (negative: the LM head is stored, not tied), seq_len;
//   then fp32 tensors in this order: token_embedding [vocab][dim],
//   rms_att [L][dim], wq [L][dim][dim], wk [L][kv_dim][dim], wv [L][kv_dim][dim],
//   wo [L][dim][dim], rms_ffn [L][dim], w1 [L][hidden][dim], w2 [L][dim][hidden],
//   w3 [L][hidden][dim], rms_final [dim], two unused RoPE tables
//   [seq_len][head_dim / 2] each, and wcls [vocab][dim] when vocab_size < 0.
// The model is Llama style (RMSNorm eps 1e-5, RoPE theta 10000 on interleaved
// pairs, SwiGLU w2(silu(w1 x) * w3 x), no biases), name "llama2c".
// Errors: PKV_ERR_IO (cannot open or read), PKV_ERR_FORMAT (bad header, file
// shorter or longer than the header implies). err: optional caller-owned buffer
// of err_cap bytes that receives a one-line message naming the file and problem.
pkv_status pkv_model_load_llama2c(const char *path, const pkv_model_params *params,
                                  pkv_model **out, char *err, size_t err_cap);

// Write the model's weights as a llama2.c checkpoint (the inverse of the loader).
// Only Llama-style models without biases (RMSNorm, RoPE, SwiGLU) can be written:
// PKV_ERR_UNSUPPORTED otherwise; PKV_ERR_IO if the file cannot be written.
pkv_status pkv_model_save_llama2c(const pkv_model *model, const char *path);

// Free the weights and scratch buffers. NULL does nothing.
void pkv_model_destroy(pkv_model *model);

// The model's config and device (copied out).
pkv_status pkv_model_get_config(const pkv_model *model, pkv_model_config *config);
pkv_device pkv_model_device(const pkv_model *model);

// Params of a pkv_cache this model can use: its layers, kv heads and head dim,
// fp32, HND, with the given block size. The caller may change dtype to
// PKV_DTYPE_F16 or PKV_DTYPE_BF16 and layout to NHD, or to the 8-bit
// PKV_DTYPE_INT8, PKV_DTYPE_FP8_E4M3 or PKV_DTYPE_FP8_E5M2 (CPU and CUDA models
// alike: the CUDA model runs the 8-bit caches through the same decode kernel as
// the 16-bit ones). Create the cache on a host backend for a CPU model and on a
// CUDA backend for a CUDA model.
pkv_status pkv_model_cache_params(const pkv_model *model, uint32_t block_size,
                                  pkv_cache_params *params);

// fp8 KV caches keep one K and one V scale per layer in the model (scales:
// [num_layers][2], K then V; x ~ fp8 value x scale), as vLLM's k_scale / v_scale.
// A layer whose scale is 0 (the default) gets it from the first forward pass that
// writes an fp8 cache: max|x| of that pass's K (V) / the fp8 max (vLLM's
// calculate_kv_scales), kept from then on (later values beyond it saturate).
// int8 caches need none (their scales are per token, in the cache).
pkv_status pkv_model_set_kv_scales(pkv_model *model, const float *scales);
pkv_status pkv_model_get_kv_scales(const pkv_model *model, float *scales);

// ---- step API: paged store -------------------------------------------------

// Prefill: for each i < num_seqs, sequence seqs[i] of `set` gets counts[i] >= 1
// new tokens, tokens[sum(counts[0..i-1]) .. + counts[i] - 1] (packed, borrowed),
// at its last counts[i] positions (the caller appended them already). Their K/V
// are written into `cache`; attention sees every earlier position of the sequence.
// seqs: borrowed [num_seqs], distinct; counts: borrowed [num_seqs].
// logits: optional caller-owned host buffer [num_seqs][vocab_size] that receives
// the logits after each sequence's last new token. next_tokens: optional
// caller-owned [num_seqs] that receives the greedy (argmax) next token.
// cache and set: borrowed; cache must come from pkv_model_cache_params (same
// layers, kv heads, head dim, block size) on this model's device, and set
// must use cache's pool. Errors: PKV_ERR_INVALID_ARG (shapes, a position past
// max_seq_len for learned positions, a count larger than the sequence),
// PKV_ERR_NOT_FOUND (a sequence id that is not live), PKV_ERR_BACKEND (a CUDA
// failure); on error the cache contents of the new slots are unspecified.
pkv_status pkv_model_prefill_paged(pkv_model *model, pkv_cache *cache, pkv_seqset *set,
                                   uint32_t num_seqs, const pkv_seq_id *seqs,
                                   const uint32_t *counts, const int32_t *tokens,
                                   float *logits, int32_t *next_tokens);

// Decode one step: exactly one new token per sequence (tokens: [num_seqs], the
// token each sequence produced last; the caller appended one slot for it).
// Same arguments and errors as pkv_model_prefill_paged with counts all 1.
pkv_status pkv_model_decode_paged(pkv_model *model, pkv_cache *cache, pkv_seqset *set,
                                  uint32_t num_seqs, const pkv_seq_id *seqs,
                                  const int32_t *tokens, float *logits,
                                  int32_t *next_tokens);

// ---- contiguous store ------------------------------------------------------

// Each sequence's K/V is one extent (row) of consecutive token slots in one
// arena of this model's device memory: per layer, K and V each
// [kv_heads][arena_tokens][head_dim] of the store's dtype (fp32, fp16, bf16,
// fp8_e4m3 or fp8_e5m2), so every (row, kv head) is one contiguous run that the
// contiguous decode kernel reads (pkv_attn_contig_kv.seq_offsets). int8 keeps one
// fp32 scale per (token, kv head) beside its data, as the paged int8 cache does, so
// that a moved or copied row carries its scales: its K and V are each
// [arena_tokens][slot] bytes, a slot being [kv_heads][head_dim] int8 values then
// [kv_heads] fp32 scales, padded to a multiple of 16 bytes. The 8-bit stores
// quantize as the paged 8-bit caches (pkv/cache.h; fp8 tensor scales from
// pkv_model_set_kv_scales), on the CPU and CUDA models alike; an 8-bit arena of
// more than 2^32 - 1 token slots gives PKV_ERR_UNSUPPORTED. Two kinds of store:
// - fixed rows (pkv_contig_kv_create): row r is slots r x max_len .. + max_len;
// - an arena whose extents the caller places, moves and frees
//   (pkv_contig_kv_create_arena): the layout of contiguous allocators that carve
//   variable-length rows from one buffer (Orca, FasterTransformer-style max-length
//   or power-of-two reservations, realloc-and-copy growth).
// Rows are named 0..max_rows-1; each has a length in tokens (0 after create) and
// a capacity (its extent's length; 0 = no extent).
// Thread-safety: a store is used by one thread at a time (with its model).
typedef struct pkv_contig_kv pkv_contig_kv;

// Create a store of max_rows rows of max_len slots each, for `model` (borrowed;
// must outlive the store), zeroed. *out is owned by the caller.
// PKV_ERR_OUT_OF_MEMORY if the buffers cannot be allocated.
pkv_status pkv_contig_kv_create(const pkv_model *model, uint32_t max_rows, uint32_t max_len,
                                pkv_dtype dtype, pkv_contig_kv **out);
// Create an arena store of arena_tokens slots (per layer and kv head) and max_rows
// rows, none placed yet (pkv_contig_kv_place), zeroed. Errors as above.
pkv_status pkv_contig_kv_create_arena(const pkv_model *model, uint32_t max_rows,
                                      uint64_t arena_tokens, pkv_dtype dtype,
                                      pkv_contig_kv **out);
void pkv_contig_kv_destroy(pkv_contig_kv *kv); // NULL does nothing

// Arena stores: give row (length 0) the extent [offset, offset + capacity) of
// token slots; capacity 0 takes its extent away (the slots are free for other
// rows). PKV_ERR_INVALID_ARG: bad row or an extent past the arena; PKV_ERR_BUSY:
// the row holds tokens (move it instead) or the extent overlaps another row's;
// PKV_ERR_UNSUPPORTED on a fixed-row store. Nothing changes on error.
pkv_status pkv_contig_kv_place(pkv_contig_kv *kv, uint32_t row, uint64_t offset,
                               uint32_t capacity);
// Arena stores: give a placed row a new extent, keeping its tokens. The same
// offset resizes in place (no copy: growing into free slots after it, or
// shrinking); another offset is realloc's allocate-copy-free: the new extent may
// overlap no row's, not even this row's old one (PKV_ERR_BUSY), and the row's
// tokens are copied there, every layer. PKV_ERR_BUFFER_TOO_SMALL if capacity is
// below the row's length. Errors otherwise as pkv_contig_kv_place.
pkv_status pkv_contig_kv_move_row(pkv_contig_kv *kv, uint32_t row, uint64_t offset,
                                  uint32_t capacity);

// Grow row's length by n tokens (the slots the next forward pass fills).
// PKV_ERR_BUFFER_TOO_SMALL (nothing changed) if it would exceed its capacity.
pkv_status pkv_contig_kv_append(pkv_contig_kv *kv, uint32_t row, uint32_t n);
// Set a row's length to 0 (the row is free for a new sequence; an arena row
// keeps its extent until placed again with capacity 0).
pkv_status pkv_contig_kv_reset(pkv_contig_kv *kv, uint32_t row);
pkv_status pkv_contig_kv_length(const pkv_contig_kv *kv, uint32_t row, uint32_t *len);
// Copy row src's K/V (every layer) and length into row dst: the contiguous layout's
// fork, which must copy what the paged layout shares. PKV_ERR_BUFFER_TOO_SMALL if
// src's length exceeds dst's capacity.
pkv_status pkv_contig_kv_copy_row(pkv_contig_kv *kv, uint32_t src, uint32_t dst);
uint64_t pkv_contig_kv_bytes(const pkv_contig_kv *kv); // bytes of K/V memory held

// Same as the paged calls, with rows of `kv` (distinct, borrowed [num_seqs]) in
// place of sequence ids.
pkv_status pkv_model_prefill_contig(pkv_model *model, pkv_contig_kv *kv, uint32_t num_seqs,
                                    const uint32_t *rows, const uint32_t *counts,
                                    const int32_t *tokens, float *logits,
                                    int32_t *next_tokens);
pkv_status pkv_model_decode_contig(pkv_model *model, pkv_contig_kv *kv, uint32_t num_seqs,
                                   const uint32_t *rows, const int32_t *tokens, float *logits,
                                   int32_t *next_tokens);

// ---- no cache --------------------------------------------------------------

// Full recompute: sequence i is tokens[sum(lens[0..i-1]) .. + lens[i] - 1]
// (all its tokens, packed); it runs the whole causal forward pass over it and
// returns the logits after its last token. Nothing is kept between calls: the
// K/V live in model scratch for the call only. Arguments as for prefill.
pkv_status pkv_model_forward_nocache(pkv_model *model, uint32_t num_seqs, const uint32_t *lens,
                                     const int32_t *tokens, float *logits,
                                     int32_t *next_tokens);

// ---- state layers (PKV_LAYER_STATE) -----------------------------------------

// A state layer is linear attention with a decayed outer-product state, one per KV
// head (RetNet's recurrent form, Sun et al. 2023, without its group norm): with the
// layer's q, k, v projections (no rotation) and decay a_h = 1 - 2^-(2 + h) for KV
// head h (0.75, 0.875, ...: a fixed multi-scale decay, not a weight),
//   S_t = a_h S_{t-1} + k_t v_t^T   (head_dim x head_dim, fp32, S_{-1} = 0)
//   o_t = q_t^T S_t / sqrt(head_dim) (query heads share their KV head's state),
// run token by token, prefill included. Nothing per token goes to the KV store: the
// state of each sequence lives in a state store the CALLER owns, keyed by the caller's
// sequence id (the pkv_seq_id of the paged calls or the row of the contiguous ones),
// which must follow the caller's sequences: fork it when the sequence forks, release
// it when the sequence ends. pkv_model_forward_nocache needs none (it recomputes every
// state from zero in a store of its own).
typedef struct pkv_model_state_store pkv_model_state_store;

// Create a store for up to max_seqs sequences of `model` (borrowed: it must outlive the
// store): max_seqs x (state layers x kv_heads x head_dim^2 x 4) bytes, host memory.
// *out is owned by the caller. PKV_ERR_INVALID_ARG for max_seqs 0, PKV_ERR_OUT_OF_MEMORY.
pkv_status pkv_model_state_store_create(const pkv_model *model, uint32_t max_seqs,
                                        pkv_model_state_store **out);
void pkv_model_state_store_destroy(pkv_model_state_store *store); // NULL does nothing

// Give the sequence `child` a copy of `parent`'s states (every state layer) and token
// count, as the paged fork shares the parent's blocks. PKV_ERR_NOT_FOUND: parent holds
// no state; PKV_ERR_BUSY: child holds one (release it first); PKV_ERR_LIMIT: the store
// is full; PKV_ERR_INVALID_ARG: a negative id or parent == child. Nothing changes on
// error.
pkv_status pkv_model_state_store_fork(pkv_model_state_store *store, int64_t parent,
                                      int64_t child);
// Forget sequence id's state (its entry is free again). PKV_ERR_NOT_FOUND if it holds
// none.
pkv_status pkv_model_state_store_release(pkv_model_state_store *store, int64_t id);
// Tokens the state of `id` has absorbed (0 when it holds none).
uint32_t pkv_model_state_store_tokens(const pkv_model_state_store *store, int64_t id);

// Hand the model the store its cached steps (paged and contiguous) read and update;
// store: borrowed until replaced (NULL detaches), created for this model
// (PKV_ERR_INVALID_ARG otherwise). A step on a model with a state layer and no store
// gives PKV_ERR_INVALID_ARG. A step whose new tokens start at position 0 takes a free
// entry for a sequence without one (PKV_ERR_LIMIT when none is free, or for more
// sequences than the store's max_seqs); one that starts
// at position p needs the sequence's state to hold exactly p tokens
// (PKV_ERR_INVALID_ARG otherwise: a stale id not released, or a step replayed), and
// after the step it holds the sequence's new length. A state cannot rewind: after
// pkv_seq_truncate or pkv_seq_fork_at to a shorter length, release the id and prefill
// the sequence again. These checks run before any layer (a refused step changes no
// entry); after a later failure (memory) the step's states are unspecified. Thread-safety: a store is used by one
// thread at a time, with its model.
// pkv_model_last_error names the problem.
pkv_status pkv_model_set_state_store(pkv_model *model, pkv_model_state_store *store);

// A one-line description of the model's last state-store error ("" if none); owned by
// the model, valid until its next call.
const char *pkv_model_last_error(const pkv_model *model);

// ---- hybrid store: the per-group pools of a pkv_hybrid ----------------------

// A KV store laid out as a hybrid KV manager (pkv/hybrid.h) addresses its pools:
// host memory for each of the manager's pools (PAGED, SHARED_PAGE, LCM: one
// region; PARTITION: one per token group), block b of group g at the bytes the
// layout gives it (LCM: small page b inside large page b / k_g), so that a block
// the window rule released and another sequence took is the same memory for
// both. A page of group g holds B_g tokens of each of the group's layers, layer
// by layer in model order: [kv_heads][B_g][head_dim] K then V (FULL, SLIDING,
// CHUNKED), [B_g][latent_dim + rope_dim] (MLA). State groups keep no pages: the
// store keeps each sequence's states in a pkv_model_state_store of its own, keyed
// by the sequence's slot in the first state group (one entry holds every state
// layer; the queued state copies of that group are applied to it, those of the
// other state groups are taken and dropped). Every layer, full ones included,
// runs through the CPU decoder's heterogeneous loop, which reads each layer's
// keys through its own group's table and refuses (PKV_ERR_CORRUPT, naming the
// layer in pkv_model_last_error) a read of a released block.
// CPU fp32 only: the loop is the CPU decoder's and the pools are host memory, so
// a CUDA model gets PKV_ERR_UNSUPPORTED.
// Ownership: model and kv are borrowed and must outlive the store; the store owns
// its memory. Thread-safety: one thread at a time, with its model and manager.
typedef struct pkv_model_hybrid_store pkv_model_hybrid_store;

// Create a store for `model` over `kv`, whose groups must be the model's
// (pkv_model_kv_groups: same kind, layers, heads, head_dim, window, latent and
// rope dims, sinks, state bytes, in order) with elem_bytes the size of dtype.
// dtype: PKV_DTYPE_F32 (else PKV_ERR_UNSUPPORTED). PKV_ERR_INVALID_ARG for NULL
// or a mismatch, PKV_ERR_UNSUPPORTED on a CUDA model, PKV_ERR_OUT_OF_MEMORY.
pkv_status pkv_model_hybrid_store_create(pkv_model *model, pkv_hybrid *kv, pkv_dtype dtype,
                                         pkv_model_hybrid_store **out);
void pkv_model_hybrid_store_destroy(pkv_model_hybrid_store *store); // NULL does nothing

// Bytes of K/V memory the store holds: the sum of the manager's pools (PAGED:
// blocks x every token group's part; LCM: large pages x large page bytes).
uint64_t pkv_model_hybrid_store_bytes(const pkv_model_hybrid_store *store);

// The paged step protocol over the manager: the caller appended the new tokens with
// pkv_hybrid_append (or _batch) first; the step takes and runs every queued copy
// (pkv_hybrid_take_copies: block copies of each token group within the group's
// memory, the state copies on the store's states) and then computes the new
// tokens' K/V into their blocks. Arguments, outputs and errors as
// pkv_model_prefill_paged / pkv_model_decode_paged, seqs being the manager's ids;
// also PKV_ERR_CORRUPT (above). A sequence whose new tokens start at position 0
// starts from a zero state.
pkv_status pkv_model_prefill_hybrid(pkv_model *model, pkv_model_hybrid_store *store,
                                    uint32_t num_seqs, const pkv_seq_id *seqs,
                                    const uint32_t *counts, const int32_t *tokens,
                                    float *logits, int32_t *next_tokens);
pkv_status pkv_model_decode_hybrid(pkv_model *model, pkv_model_hybrid_store *store,
                                   uint32_t num_seqs, const pkv_seq_id *seqs,
                                   const int32_t *tokens, float *logits, int32_t *next_tokens);

// ---- profile ---------------------------------------------------------------

// Seconds spent per op class since creation or the last reset. The GEMM classes
// and attention are timed only with params.profile (on CUDA that synchronizes);
// total and bookkeeping are always timed.
typedef struct pkv_model_profile {
    double total;       // wall time inside forward calls
    double bookkeeping; // block tables, slots, lengths, metadata upload, CoW copies
    double attention;   // cache write + attention
    double gemm_qkv;    // Q, K, V projections
    double gemm_out;    // attention output projection
    double gemm_ffn;    // FFN up/gate/down
    double lm_head;     // final norm + LM head
    double other;       // embeddings, norms, RoPE, activations (profile only)
    uint64_t forward_calls;
    uint64_t tokens;    // tokens processed (new tokens, or whole sequences without cache)
} pkv_model_profile;

pkv_status pkv_model_get_profile(const pkv_model *model, pkv_model_profile *profile);
void pkv_model_reset_profile(pkv_model *model);

// Index of the largest of logits[0..n-1] (the first on ties); -1 for n == 0.
int32_t pkv_argmax(const float *logits, uint32_t n);

#ifdef __cplusplus
}
#endif

#endif // PKV_MODEL_H

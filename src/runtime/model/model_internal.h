// SPDX-License-Identifier: MIT
// Internals of the decoder model shared by the engine (model.c), the weight
// layout (weights.c), the loader, the contiguous store and the two device
// op tables (ops_cpu.c, ops_cuda.cu). Invariant: every float pointer in
// pkvi_weights and pkvi_scratch lives in the model's device memory (host memory
// for the CPU ops), and the forward pass touches memory only through `ops`.
#ifndef PKV_MODEL_INTERNAL_H
#define PKV_MODEL_INTERNAL_H

#include <stddef.h>
#include <stdint.h>

#include "pkv/attention.h"
#include "pkv/model.h"
#include "pkv_config.h"

#ifdef __cplusplus
extern "C" {
#endif

// All weights in one allocation, carved into named tensors (fp32, row-major,
// linear weights stored [out][in] so that y = x W^T).
typedef struct pkvi_weights {
    float *wte;    // [vocab][d]
    float *wpe;    // [max_seq_len][d]  learned positions only, else NULL
    float *ln1_w;  // [L][d]
    float *ln1_b;  // [L][d]            LayerNorm only, else NULL
    float *wqkv;   // [L][q_dim + 2 kv_dim][d]  rows: Q heads, then K heads, then V heads
    float *bqkv;   // [L][q_dim + 2 kv_dim]     use_bias only, else NULL
    float *wo;     // [L][d][q_dim]
    float *bo;     // [L][d]            use_bias only
    float *ln2_w;  // [L][d]
    float *ln2_b;  // [L][d]            LayerNorm only
    float *w_up;   // [L][d_ff][d]      GELU: the FFN input layer; SwiGLU: w3
    float *b_up;   // [L][d_ff]         GELU with use_bias only
    float *w_gate; // [L][d_ff][d]      SwiGLU only (w1, through SiLU)
    float *w_down; // [L][d][d_ff]
    float *b_down; // [L][d]            GELU with use_bias only
    float *lnf_w;  // [d]
    float *lnf_b;  // [d]               LayerNorm only
    float *lm_head; // [vocab][d]       == wte when tied
    float *sinks;  // [L][heads]        attention-sink logits: models whose groups have
                   //                   sinks (gpt-oss style) only, else NULL
    // MLA (models with an MLA group; one latent shape r + dr per model), per layer
    // [heads dr][d] W_qr, [r + dr][d] W_dkv, [heads hd][r] W_uk, [heads hd][r] W_uv;
    // an MLA layer's query is wqkv's Q rows (heads x hd, no rotation) plus W_qr h
    // (rotated), and its K/V rows of wqkv go unread (one layout for every layer).
    float *w_mla;  // [L][pkvi_mla_layer_floats]  else NULL
} pkvi_weights;

// Floats of one layer's MLA weights (0 without an MLA group); *latent / *rope: the
// model's MLA shape (the first MLA group's).
uint64_t pkvi_mla_layer_floats(const pkv_model_config *c, uint32_t *latent, uint32_t *rope);

// Number of floats of the whole weight block (== pkv_model_param_count).
uint64_t pkvi_weights_count(const pkv_model_config *c);
// Point w's tensors into base (which holds pkvi_weights_count floats).
void pkvi_weights_carve(const pkv_model_config *c, float *base, pkvi_weights *w);
// Fill a host weight block with the deterministic random init for `seed`.
void pkvi_weights_init_random(const pkv_model_config *c, uint64_t seed, float *base);

// Activations for up to cap_tokens tokens and cap_seqs sequences of one call.
typedef struct pkvi_scratch {
    uint32_t cap_tokens, cap_seqs, cap_table; // capacities (table: int32 entries)
    float *x;      // [T][d]       residual stream
    float *h;      // [T][d]       normed input of a sub-block
    float *q;      // [T][q_dim]
    float *k;      // [T][kv_dim]
    float *v;      // [T][kv_dim]
    float *att;    // [T][q_dim]   attention output
    float *ff;     // [T][d_ff]
    float *ff2;    // [T][d_ff]    SwiGLU up branch
    float *xl;     // [S][d]       last token of each sequence
    float *logits; // [S][vocab]
    // 16-bit copies for an fp16 / bf16 KV store (attention takes q, out and the
    // cache in one dtype):
    uint16_t *q16;   // [T][q_dim]
    uint16_t *k16;   // [T][kv_dim]
    uint16_t *v16;   // [T][kv_dim]
    uint16_t *att16; // [T][q_dim]
    // Metadata, device side (== host side arrays for the CPU ops):
    int32_t *tok;    // [T]
    int32_t *pos;    // [T]
    int32_t *tseq;   // [T] batch index of each token
    int32_t *lens;   // [S] context length after this call
    int32_t *indptr; // [S + 1] packed token offsets
    int32_t *last;   // [S] row of each sequence's last token in x
    int64_t *row_off; // [S] contiguous store: element offset of each sequence's row
                      // from a layer's K (V) base (the store's off x row_unit)
    int32_t *table;  // [S][max_blocks] block tables (paged)
    int64_t *slots;  // [T] cache slot of each new token (paged)
} pkvi_scratch;

// Host mirror of the metadata (what the engine fills before the upload).
typedef struct pkvi_meta {
    uint32_t cap_tokens, cap_seqs, cap_table;
    int32_t *tok, *pos, *tseq, *lens, *indptr, *last, *table;
    int64_t *slots, *row_off;
    float *logits; // [S][vocab] host logits when the caller passes none
} pkvi_meta;

// The KV target of one forward pass, as the ops see it.
// HYBRID: the per-group pools of a pkv_hybrid (hybrid_store.c), CPU fp32 only;
// every layer goes through hetero_cpu.c, which resolves the layer's group first.
typedef enum pkvi_kv_kind {
    PKVI_KV_PAGED = 0,
    PKVI_KV_CONTIG = 1,
    PKVI_KV_HYBRID = 2,
    PKVI_KV_SLOTS = 3, // per-layer slot rows (slot_store.c: VMM spaces per group), CPU fp32
} pkvi_kv_kind;

struct pkv_model_hybrid_store;
struct pkvi_slot_kv;

typedef struct pkvi_kv_target {
    pkvi_kv_kind kind;
    pkv_dtype dtype; // of the store's elements (strides below count elements)
    // paged: per-layer K base of layer 0; V = K + kv_stride; layer l adds layer_stride
    void *base;
    uint64_t layer_stride, kv_stride, block_stride, head_stride, token_stride;
    uint32_t block_size, num_blocks, max_blocks;
    // 8-bit stores (int8, fp8): the scale geometry; the fp8 tensor scales of
    // each layer come from the model (kv_scales), so k_scale / v_scale are unused.
    // Contiguous 8-bit stores are written as a paged cache of one-token blocks:
    // slots[t] is the token's slot, block_stride its bytes (c_token_stride) and
    // num_blocks the arena's slots
    pkv_attn_kv_quant quant;
    // contiguous: K and V bases of layer 0; element (layer l, row at row_off,
    // kv head h, token t, dim d) at base + layer_stride l + row_off + head_stride h
    // + token_stride t + d (pkv_contig_kv's layout)
    void *ck, *cv;
    uint64_t c_layer_stride, c_head_stride, c_token_stride;
    // both kinds: the longest context of this call, which plans CUDA split-K (so
    // that layouts split alike, whatever their table width)
    uint32_t max_len;
    // hybrid: the store (pkvi_hybrid_layer_target resolves a layer from it into
    // the fields below, and block_size, max_blocks, head_stride, token_stride):
    // block b of the layer's group at (b / h_per_chunk) h_chunk + (b % h_per_chunk)
    // h_page elements from the layer's K; h_table [S][max_blocks] the group's
    // tables, negative for a released block (reading one sets *h_fault)
    struct pkv_model_hybrid_store *hybrid;
    const int32_t *h_table;
    uint64_t h_page, h_chunk;
    uint32_t h_per_chunk;
    int *h_fault;
    // slots: the store (pkvi_slot_layer_target resolves a layer into a contiguous
    // target of that layer's rows)
    const struct pkvi_slot_kv *slots;
} pkvi_kv_target;

typedef struct pkvi_call {
    uint32_t num_seqs, num_tokens;
    int all_single;   // every sequence has exactly one new token (decode path)
    // models with a state layer: the store and each sequence's entry in it ([S])
    struct pkv_model_state_store *states;
    const uint32_t *state_entry;
    // or (a slot store) the state of (state layer, sequence) in place, instead
    float *(*state_at)(const void *ctx, uint32_t layer, uint32_t seq);
    const void *state_ctx;
} pkvi_call;

struct pkv_model;

// Device operations. Pointers are device pointers; metadata arrays are the
// scratch's device copies. Each returns PKV_OK or an error status.
typedef struct pkvi_ops {
    const char *name;
    pkv_status (*init)(struct pkv_model *m);    // create handles, streams
    void (*fini)(struct pkv_model *m);
    pkv_status (*alloc)(struct pkv_model *m, size_t bytes, void **ptr);
    void (*release)(struct pkv_model *m, void *ptr);
    pkv_status (*upload)(struct pkv_model *m, void *dst, const void *src, size_t bytes);
    pkv_status (*download)(struct pkv_model *m, void *dst, const void *src, size_t bytes);
    pkv_status (*copy)(struct pkv_model *m, void *dst, const void *src, size_t bytes);
    pkv_status (*sync)(struct pkv_model *m);
    // x[t] = wte[tok[t]] (+ wpe[pos[t]])
    pkv_status (*embed)(struct pkv_model *m, uint32_t T, float *x);
    // y[n_rows][d] = norm(x) * w (+ b): LayerNorm or RMSNorm per config
    pkv_status (*norm)(struct pkv_model *m, uint32_t rows, const float *x, const float *w,
                       const float *b, float *y);
    // y[T][n] (+)= x[T][k] W[n][k]^T (+ b[n]); accumulate: add into y
    pkv_status (*linear)(struct pkv_model *m, uint32_t T, uint32_t k, uint32_t n,
                         const float *x, const float *w, const float *b, float *y,
                         int accumulate);
    // Rotate q [T][heads][hd] and k [T][kv_heads][hd] by position pos[t].
    pkv_status (*rope)(struct pkv_model *m, uint32_t T, float *q, float *k);
    // GELU: a = gelu(a); SwiGLU: a = silu(a) * b. a, b: [T][d_ff]
    pkv_status (*act)(struct pkv_model *m, uint32_t T, float *a, const float *b);
    // xl[s] = x[last[s]]
    pkv_status (*gather_last)(struct pkv_model *m, uint32_t S, const float *x, float *xl);
    // Write this layer's new K/V and compute attention into att.
    pkv_status (*attention)(struct pkv_model *m, uint32_t layer, const pkvi_call *call,
                            const pkvi_kv_target *kv);
} pkvi_ops;

extern const pkvi_ops pkvi_model_cpu_ops;

// ---- hetero_cpu.c: layers other than plain full attention (issue 23) ----
// 1 when layer l is full attention without sinks (the attention library's kernels).
int pkvi_layer_is_plain(const pkv_model_config *c, uint32_t layer);
// 1 when layer l is an MLA layer (no K/V projections, no rotation of q by the engine).
int pkvi_layer_is_mla(const pkv_model_config *c, uint32_t layer);
// 1 when the CPU decoder can run c's groups: state groups of kv_heads x head_dim^2
// fp32 (state_bytes); MLA groups all of one
// shape whose latent + rope fits one token's K row (kv_heads x head_dim) and whose
// per-layer scratch fits the K/V scratch (heads x rope_dim <= kv_heads x head_dim).
int pkvi_hetero_supported(const pkv_model_config *c);
// Rotate v [hd] by position pos (pairs 2i, 2i+1; theta^(-2i / hd)).
void pkvi_rope_head(float *v, uint32_t hd, int32_t pos, double theta);
// Write the layer's new K/V and attend within its window, sinks included (fp32
// stores, paged or contiguous; PKV_ERR_UNSUPPORTED for other dtypes).
pkv_status pkvi_hetero_attention_cpu(struct pkv_model *m, uint32_t layer, const pkvi_call *call,
                                     const pkvi_kv_target *kv);

// ---- state_store.c: state layers (PKV_LAYER_STATE) and their per-sequence store ----
// 1 when layer l is a state layer.
int pkvi_layer_is_state(const pkv_model_config *c, uint32_t layer);
// Number of state layers of c.
uint32_t pkvi_state_layers(const pkv_model_config *c);
// Bytes of one sequence's entry (every state layer's states): what a fork copies.
uint64_t pkvi_state_store_entry_bytes(const pkv_model_state_store *s);
// The entry of id (create: claimed with a zero state when absent): its states
// (entry_bytes of floats) and the tokens they absorbed, both writable, for a
// caller that moves a sequence's state out and back (run mode's swap).
// PKV_ERR_NOT_FOUND (absent), PKV_ERR_LIMIT (full), PKV_ERR_INVALID_ARG.
pkv_status pkvi_state_store_entry(pkv_model_state_store *s, int64_t id, int create, float **state,
                                  uint32_t **tokens);
// Bind the call's sequences to entries of the model's store (keys: seqs, else rows;
// new tokens start at lens - counts): every check of pkv_model_set_state_store's
// contract, before any layer runs. A model without state layers: PKV_OK, nothing bound.
pkv_status pkvi_states_bind(pkv_model *m, uint32_t S, const pkv_seq_id *seqs,
                            const uint32_t *rows, const uint32_t *counts, pkvi_call *call);
// After a successful pass: each bound entry holds its sequence's new length.
void pkvi_states_commit(pkv_model *m, const pkvi_call *call);
// The state layer's recurrence over the call's tokens (q, k, v in scratch -> att).
pkv_status pkvi_state_layer_cpu(pkv_model *m, uint32_t layer, const pkvi_call *call);
// Swap in the model's own zeroed store for pkv_model_forward_nocache (rows 0..S-1);
// *saved receives the caller's store, which pkvi_states_nocache_end puts back.
pkv_status pkvi_states_nocache_begin(pkv_model *m, uint32_t S, pkv_model_state_store **saved);
void pkvi_states_nocache_end(pkv_model *m, uint32_t S, pkv_model_state_store *saved);
void pkvi_set_error(pkv_model *m, const char *fmt, ...);

// ---- hybrid_store.c: the model's store over a pkv_hybrid's pools ----
// Resolve `layer` of a PKVI_KV_HYBRID target: *out gets kv with the layer's group
// table, block size and strides; *kc / *vc the layer's K / V in block 0 of its
// group (MLA: *vc is NULL, the latent row lives at K).
void pkvi_hybrid_layer_target(const pkvi_kv_target *kv, uint32_t layer, pkvi_kv_target *out,
                              float **kc, float **vc);

// ---- slot_store.c: the model's store over per-layer slot rows ----
// Resolve `layer` of a PKVI_KV_SLOTS target into *out, a PKVI_KV_CONTIG target
// whose rows are the layer's (the scratch's row_off set for the call's slots);
// *kc / *vc the layer's K / V (MLA: *vc NULL).
void pkvi_slot_layer_target(pkv_model *m, const pkvi_kv_target *kv, uint32_t layer,
                            pkvi_kv_target *out, float **kc, float **vc);

// ---- model.c: the engine step, shared with the stores of other files ----
// Grow scratch for T tokens, S sequences, `table` block-table entries.
pkv_status pkvi_scratch_reserve(pkv_model *m, uint32_t T, uint32_t S, uint32_t table);
// Fill tok/tseq/indptr/last/pos of the packed tokens from meta.lens (set first);
// checks every token id.
pkv_status pkvi_fill_tokens(pkv_model *m, uint32_t S, const uint32_t *counts,
                            const int32_t *tokens, uint32_t *T_out);
// counts of 1 for a decode step of S sequences (a buffer of the model's).
pkv_status pkvi_ones_for(pkv_model *m, uint32_t S, uint32_t **out);
// Run the layers of a prepared step (metadata filled, states bound), commit the
// states, count the profile from t0 and fill the outputs.
pkv_status pkvi_run_step(pkv_model *m, const pkvi_call *call, const pkvi_kv_target *kv,
                         double t0, float *logits, int32_t *next_tokens);
#if PKV_HAVE_CUDA
extern const pkvi_ops pkvi_model_cuda_ops;
#endif

struct pkv_model {
    pkv_model_config cfg;
    pkv_model_params params;
    const pkvi_ops *ops;
    void *dev;            // per-device state (CUDA: handle + stream), owned by ops
    float *weights_mem;   // device block of pkvi_weights_count floats
    pkvi_weights w;
    pkvi_scratch s;       // device scratch
    pkvi_meta meta;       // host metadata
    pkv_contig_kv *nocache_kv; // scratch store of the no-cache path
    pkv_model_profile prof;
    uint32_t *ones;       // [ones_cap] all 1: the counts of a decode step
    uint32_t ones_cap;
    uint32_t q_dim, kv_dim;
    // fp8 KV caches: per-layer K and V scales [L][2] (0 = not set yet: the first
    // forward pass into an fp8 cache sets them, as vLLM's calculate_kv_scales)
    float *kv_scales;
    // state layers: the caller's store (borrowed) and the no-cache path's own
    pkv_model_state_store *states;
    pkv_model_state_store *nocache_states;
    char last_error[256]; // pkv_model_last_error
};

struct pkv_contig_kv {
    const pkv_model *model;
    uint32_t max_rows;
    uint32_t max_len; // fixed-row store: every row's capacity; arena store: 0
    uint64_t arena;   // token slots of the arena (per head plane, per layer)
    pkv_dtype dtype;
    size_t esize;     // bytes per element
    uint32_t *len;    // [max_rows] host: tokens held
    uint64_t *off;    // [max_rows] host: first token slot of the row's extent
    uint32_t *cap;    // [max_rows] host: extent length in slots (0 = no extent)
    uint32_t hiwater; // rows at or above it have no extent (bounds the overlap scan)
    void *k, *v;      // device K and V of layer 0, of dtype
    // Layout, in elements: (layer l, row r, kv head h, token t) at
    // layer_stride l + off[r] x row_unit + head_stride h + token_stride t.
    // Own buffers: [L][kv_heads][arena][hd] (row_unit hd, off in token slots);
    // a VMM space's: per layer and K/V one buffer of [slot][token][kv_head][hd]
    // (row_unit = a slot's elements, off = the slot).
    // int8 (contig_kv.c): token-major slots of row_unit bytes, a slot's kv heads
    // (head_stride hd) then their fp32 scales; off[r] x row_unit / token_stride is
    // the first token slot of row r in every 8-bit store (the writes' slot index).
    uint64_t layer_stride, head_stride, token_stride, row_unit;
    // 8-bit stores: the dtype and the int8 scale geometry from a token slot's base,
    // as pkv_attn_kv_quant takes it (fp8 tensor scales are the model's kv_scales)
    pkv_attn_kv_quant quant;
    uint64_t bytes_each;
    int borrowed;     // k and v belong to the caller (pkvi_contig_kv_wrap*)
};

// An arena store over caller memory (k and v: device buffers of
// pkvi_contig_kv_arena_bytes each, borrowed, not cleared): run mode charges the
// arena to its backend as one allocation, as the policies' sim mode counts it.
uint64_t pkvi_contig_kv_arena_bytes(const pkv_model *model, uint64_t arena_tokens, pkv_dtype dtype);
pkv_status pkvi_contig_kv_wrap(const pkv_model *model, uint32_t max_rows, uint64_t arena_tokens,
                               pkv_dtype dtype, void *k, void *v, pkv_contig_kv **out);
// A fixed-row store over the buffers of a VMM space (pkv/vmm.h, vAttention's
// layout): row r is slot r of max_len tokens, token-major [token][kv_head][hd];
// layer l's K is k + layer_stride x l (elements), V likewise from v; a slot is
// row_unit elements. The caller maps memory behind the prefix each row uses.
pkv_status pkvi_contig_kv_wrap_slots(const pkv_model *model, uint32_t num_slots, uint32_t max_len,
                                     pkv_dtype dtype, void *k, void *v, uint64_t layer_stride,
                                     uint64_t row_unit, pkv_contig_kv **out);

// Engine helpers shared by the loader and the contiguous store.
pkv_status pkvi_model_alloc(const pkv_model_config *c, const pkv_model_params *p,
                            pkv_model **out);
pkv_status pkvi_model_set_weights(pkv_model *m, const float *host_block);
pkv_status pkvi_model_get_weights(const pkv_model *m, float *host_block);

#ifdef __cplusplus
}
#endif

#endif // PKV_MODEL_INTERNAL_H

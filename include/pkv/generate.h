// SPDX-License-Identifier: MIT
// Token sampling and a complete generation loop over a pkv_model: prefill a
// batch of prompts of different lengths, then decode one token per live
// sequence per step until EOS or a token limit, on a paged cache, a contiguous
// cache, or no cache at all (full recompute every step). Parallel sampling
// (n > 1) forks each prompt's sequence after its single prefill: the paged
// cache shares the prompt's blocks and copies only a partly filled last block
// (copy-on-write); the contiguous cache copies the prompt's row.
//
// Determinism: output o (= request * n + sample) draws from its own random
// stream pkv_rng_init(seed, o), so n forked samples of one request produce
// the same tokens as n single-sample requests of the same prompt.
//
// Thread-safety: a sampler and a generation call use one thread at a time;
// pkv_generate uses the model exclusively while it runs.
#ifndef PKV_GENERATE_H
#define PKV_GENERATE_H

#include <stddef.h>
#include <stdint.h>

#include "pkv/model.h"
#include "pkv/status.h"

#ifdef __cplusplus
extern "C" {
#endif

// ---- sampling ---------------------------------------------------------------

typedef struct pkv_sampler pkv_sampler;

// A sampler for logits of vocab_size entries. temperature 0 = greedy (argmax);
// otherwise softmax(logits / temperature) restricted to the top_k largest
// logits (0 = all; ties at the k-th value are all kept). *out is owned by the
// caller. PKV_ERR_INVALID_ARG for vocab_size 0 or a negative/NaN temperature.
pkv_status pkv_sampler_create(uint32_t vocab_size, float temperature, uint32_t top_k,
                              pkv_sampler **out);
void pkv_sampler_destroy(pkv_sampler *sampler); // NULL does nothing

// The initial state of random stream `stream` under `seed` (a splitmix64 state).
uint64_t pkv_rng_init(uint64_t seed, uint64_t stream);

// Draw one token from logits[0..vocab_size-1] (borrowed), advancing *rng
// (caller-owned state) by exactly one draw unless the sampler is greedy.
pkv_status pkv_sampler_sample(pkv_sampler *sampler, const float *logits, uint64_t *rng,
                              int32_t *token);

// ---- generation -------------------------------------------------------------

typedef enum pkv_kv_mode {
    PKV_KV_PAGED = 0,      // pkv_pool + pkv_seqset + pkv_cache, blocks on demand
    PKV_KV_CONTIGUOUS = 1, // pkv_contig_kv, one max-length row per output
    PKV_KV_NONE = 2,       // no cache: recompute every sequence in full each step
} pkv_kv_mode;

const char *pkv_kv_mode_name(pkv_kv_mode mode); // "paged", "contiguous", "none"

typedef struct pkv_gen_params {
    pkv_kv_mode kv_mode;     // default PKV_KV_PAGED
    uint32_t block_size;     // paged: tokens per block (default 16)
    uint32_t num_blocks;     // paged: pool size; 0 = enough for every output at full
                             // length without any sharing (default 0)
    uint32_t max_new_tokens; // tokens generated per output, >= 1 (default 16)
    int32_t eos_token;       // stop an output after it samples this; -1 = none (default)
    uint32_t n;              // samples per request, >= 1 (default 1)
    float temperature;       // 0 = greedy (default)
    uint32_t top_k;          // 0 = all (default)
    uint64_t seed;           // sampling seed (default 1)
    pkv_dtype kv_dtype;      // paged / contiguous store dtype (default PKV_DTYPE_F32)
} pkv_gen_params;

pkv_gen_params pkv_gen_params_default(void);

typedef struct pkv_gen_request {
    const int32_t *prompt; // borrowed [prompt_len] token ids
    uint32_t prompt_len;   // >= 1
} pkv_gen_request;

// One output sequence. The caller provides the buffers; pkv_generate fills them.
typedef struct pkv_gen_output {
    int32_t *tokens;     // caller-owned [max_new_tokens]: generated ids
    float *logits;       // optional caller-owned [max_new_tokens][vocab]: the logits
                         // each token was sampled from; NULL if not wanted
    uint32_t num_tokens; // out: tokens written (stops early at EOS)
    int hit_eos;         // out: 1 if the last token is eos_token
} pkv_gen_output;

typedef struct pkv_gen_stats {
    double prefill_seconds;   // prompt forward pass, forks and first samples
    double decode_seconds;    // every later step (with PKV_KV_NONE: the recomputes)
    uint32_t decode_steps;    // forward calls after the prefill
    uint64_t prompt_tokens;   // tokens prefilled (each prompt once, whatever n is)
    uint64_t generated_tokens;
    uint32_t peak_blocks;     // paged: most blocks in use at once; else 0
    uint64_t kv_bytes_peak;   // paged: peak_blocks x block bytes; contiguous: the
                              // store's bytes; none: 0
    uint64_t cow_copies;      // paged: copy-on-write block copies executed
} pkv_gen_stats;

// Generate for requests[0..num_requests-1] (borrowed). outputs: caller-owned
// [num_requests * n]; output request * n + s is sample s of that request.
// stats: optional. Errors: PKV_ERR_INVALID_ARG (bad params, empty prompt, a
// token id out of range, prompt + max_new_tokens beyond max_seq_len of a model
// with learned positions), PKV_ERR_OUT_OF_BLOCKS (num_blocks too small: this
// loop does not preempt), PKV_ERR_OUT_OF_MEMORY, device errors.
pkv_status pkv_generate(pkv_model *model, const pkv_gen_params *params, uint32_t num_requests,
                        const pkv_gen_request *requests, pkv_gen_output *outputs,
                        pkv_gen_stats *stats);

#ifdef __cplusplus
}
#endif

#endif // PKV_GENERATE_H

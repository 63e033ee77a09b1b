// SPDX-License-Identifier: MIT
// Request traces for replay: loading (the native CSV format of traces/README.md
// and three public formats), validation with errors that name file, line and
// field, synthetic generation from documented distributions, and saving.
//
// A trace is an immutable, validated array of requests sorted by arrival time.
// Formats (detected from the header line, or the .jsonl extension):
// - native CSV: header with arrival_s,prompt_tokens,output_tokens and optional
//   n, prefix_group, prefix_tokens, request_id (any column order);
// - Azure LLM inference trace 2023: TIMESTAMP,ContextTokens,GeneratedTokens,
//   wall-clock "YYYY-MM-DD HH:MM:SS.fffffff"; arrivals become seconds after the first;
// - BurstGPT: Timestamp,Model,Request tokens,Response tokens,Total tokens,Log Type
//   (Timestamp in seconds);
// - Mooncake JSON Lines: {"timestamp": ms, "input_length", "output_length",
//   "hash_ids": [...]}, one id per 512-token block; leading ids that several
//   requests share become a prefix group (see pkv_trace_request).
//
// Thread-safety: a loaded trace is read-only and may be shared between threads.
#ifndef PKV_TRACE_H
#define PKV_TRACE_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "pkv/status.h"

#ifdef __cplusplus
extern "C" {
#endif

// One request. Plain data.
typedef struct pkv_trace_request {
    double arrival_s;       // seconds since the trace start; non-decreasing in a trace
    uint32_t prompt_tokens; // >= 1
    uint32_t output_tokens; // >= 1 (tokens generated per sample)
    uint32_t n;             // parallel samples, >= 1; forked after prefill
    int64_t prefix_group;   // -1: none; requests of one group share a prefix
    uint32_t prefix_tokens; // leading prompt tokens shared in the group (<= prompt_tokens)
    uint64_t request_id;    // from the file, else the 0-based row index
} pkv_trace_request;

typedef enum pkv_trace_format {
    PKV_TRACE_AUTO = 0, // detect from the header / extension
    PKV_TRACE_NATIVE = 1,
    PKV_TRACE_AZURE = 2,
    PKV_TRACE_BURSTGPT = 3,
    PKV_TRACE_MOONCAKE = 4,
} pkv_trace_format;

// "auto", "native", "azure", "burstgpt", "mooncake" (or "unknown").
const char *pkv_trace_format_name(pkv_trace_format format);

// Where a load failed. Plain data filled by the loader; strings are NUL-terminated.
typedef struct pkv_trace_error {
    char file[256];   // the path (or the name given to pkv_trace_parse)
    uint64_t line;    // 1-based line number; 0 when the error is about the whole file
    char field[64];   // column / key name, or "" when not about one field
    char message[160]; // what is wrong, e.g. "not a number: 'abc'"
} pkv_trace_error;

typedef struct pkv_trace_load_options {
    pkv_trace_format format; // PKV_TRACE_AUTO by default
    int skip_bad;            // 1: skip (and count) bad rows instead of failing
} pkv_trace_load_options;

pkv_trace_load_options pkv_trace_load_options_default(void);

typedef struct pkv_trace pkv_trace;

// Load a trace file. On PKV_ERR_FORMAT / PKV_ERR_IO, *err (optional, caller-owned)
// says where and why, and *out is untouched. *out is owned by the caller.
// opts may be NULL (defaults). Errors: empty file, unknown header, missing
// column, non-number, zero or negative length, unsorted arrivals, truncated line
// (a row with too few fields, or unterminated JSON), a row with more fields than
// the header, a NUL byte in a field, invalid JSON, a Mooncake hash id that is not
// an integer in 0 .. 2^64-1, an Azure date that does not exist (traces/README.md
// lists them all). A leading UTF-8 byte order mark is skipped. With skip_bad, bad rows are
// skipped (pkv_trace_skipped counts them); a file without any good row still fails.
pkv_status pkv_trace_load(const char *path, const pkv_trace_load_options *opts,
                          pkv_trace **out, pkv_trace_error *err);

// Parse a trace held in memory (text: borrowed, len bytes, need not be
// NUL-terminated). `name` is used in errors and for extension detection.
pkv_status pkv_trace_parse(const char *text, size_t len, const char *name,
                           const pkv_trace_load_options *opts, pkv_trace **out,
                           pkv_trace_error *err);

// Build a trace from requests[0..count-1] (borrowed; copied). Validates as the
// loader does; *err (optional) names the bad request's index as its line.
pkv_status pkv_trace_create(const pkv_trace_request *requests, size_t count,
                            pkv_trace **out, pkv_trace_error *err);

void pkv_trace_destroy(pkv_trace *trace); // NULL does nothing

size_t pkv_trace_count(const pkv_trace *trace);
// The requests, sorted by arrival (borrowed, pkv_trace_count entries).
const pkv_trace_request *pkv_trace_requests(const pkv_trace *trace);
pkv_trace_format pkv_trace_get_format(const pkv_trace *trace);
uint64_t pkv_trace_skipped(const pkv_trace *trace); // rows skipped with skip_bad

// Write the trace in the native CSV format (all columns) to a new file at `path`,
// or to `out` (borrowed, left open). PKV_ERR_IO on failure. Arrivals are written
// with %.6f below 1e15 s and %.17g above; what is written loads back.
pkv_status pkv_trace_save(const pkv_trace *trace, const char *path);
pkv_status pkv_trace_write_csv(const pkv_trace *trace, FILE *out);

// Synthetic traces. Arrivals: Poisson (exponential gaps) at `rate_rps`, or bursty
// (gamma gaps with coefficient of variation `burst_cv` > 1, same mean rate).
// Lengths: log-normal with the given median and sigma (of the natural log),
// clamped to [1, max]. n: 1, or uniform in [n_min, n_max] for a `parallel_frac`
// fraction of requests. Prefix groups: `prefix_frac` of requests join one of
// `prefix_groups` groups, sharing `prefix_tokens` leading tokens.
typedef enum pkv_arrival_kind {
    PKV_ARRIVAL_POISSON = 0,
    PKV_ARRIVAL_BURSTY = 1,
} pkv_arrival_kind;

typedef struct pkv_tracegen_params {
    uint64_t seed;
    uint64_t num_requests;   // >= 1
    pkv_arrival_kind arrival;
    double rate_rps;         // mean requests per second, > 0
    double burst_cv;         // bursty only: > 1
    double prompt_median;    // tokens, >= 1
    double prompt_sigma;     // >= 0
    uint32_t prompt_max;
    double output_median;
    double output_sigma;
    uint32_t output_max;
    double parallel_frac;    // in [0, 1]
    uint32_t n_min, n_max;   // 1 <= n_min <= n_max
    double prefix_frac;      // in [0, 1]
    uint32_t prefix_groups;  // >= 1 when prefix_frac > 0
    uint32_t prefix_tokens;  // shared prefix length (prompts are made at least this long)
} pkv_tracegen_params;

// Defaults: seed 1, 1000 requests, Poisson at 2 rps, the "conversation" length
// profile (see traces/README.md), no parallel sampling, no prefixes.
pkv_tracegen_params pkv_tracegen_params_default(void);

// Generate a trace (deterministic for a given params, seed included).
// PKV_ERR_INVALID_ARG names nothing: check the ranges documented above. Every
// double parameter must be finite; parameters whose arrivals overflow to inf
// (a rate near 0, a burst_cv so large that the gaps are not finite) are
// refused too, so a generated trace always passes the loader's checks.
pkv_status pkv_trace_generate(const pkv_tracegen_params *params, pkv_trace **out);

#ifdef __cplusplus
}
#endif

#endif // PKV_TRACE_H

// SPDX-License-Identifier: MIT
// Internal pieces shared by the trace files. Dependencies point one way:
// trace.c (public API, format dispatch) -> csv.c, jsonl.c (readers) -> rows.c
// (errors, request vector, validation); generator.c -> rows.c. Not installed.
#ifndef PKV_RUNTIME_TRACE_INTERNAL_H
#define PKV_RUNTIME_TRACE_INTERNAL_H

#include <stddef.h>
#include <stdint.h>

#include "pkv/trace.h"

struct pkv_trace {
    pkv_trace_request *reqs; // [count], owned
    size_t count;
    pkv_trace_format format;
    uint64_t skipped;
    // Mooncake only (else NULL): request i's prefix-block hash ids are
    // block_ids[block_first[i] .. block_first[i] + block_count[i] - 1].
    uint64_t *block_ids;    // owned
    uint64_t *block_first;  // [count], owned
    uint32_t *block_count;  // [count], owned
};

// Marks a hash or random-number function whose unsigned arithmetic wraps modulo
// 2^n by design, so clang's -fsanitize=integer (the CI sanitizer build) does
// not report it; every other unsigned wrap in these files stays an error.
#if defined(__clang__)
#define PKVI_WRAPS __attribute__((no_sanitize("unsigned-integer-overflow", "unsigned-shift-base")))
#else
#define PKVI_WRAPS
#endif

// Tokens per Mooncake hash block.
#define PKVI_MOONCAKE_BLOCK_TOKENS 512

// Synthetic token ids of request i's first n prompt tokens (out: n entries).
// Equal prefixes get equal ids and different ones differ (up to hash
// collisions), so a token-level prefix cache sees exactly the trace's sharing:
// Mooncake hash ids (one per 512 tokens), or a native prefix_group's first
// prefix_tokens tokens; every other token is unique to its request.
void pkvi_trace_tokens(const pkv_trace *t, size_t i, uint32_t n, int32_t *out);
// pkvi_trace_tokens into *buf, a caller-owned scratch of *cap entries grown (by
// doubling, from 1024) to hold n: the replay policies' prompt ids for their prefix
// caches. Returns *buf, or NULL when it cannot grow (the old buffer stays).
int32_t *pkvi_trace_tokens_into(const pkv_trace *t, size_t i, uint32_t n, int32_t **buf,
                                uint32_t *cap);

// A growable array of requests while a file is read.
typedef struct pkvi_reqvec {
    pkv_trace_request *reqs;
    size_t count, cap;
} pkvi_reqvec;

// ---- defined in rows.c ----
#if defined(__GNUC__)
__attribute__((format(printf, 5, 6)))
#endif
void pkvi_trace_set_error(pkv_trace_error *err, const char *file, uint64_t line,
                          const char *field, const char *fmt, ...);
pkv_status pkvi_reqvec_push(pkvi_reqvec *v, const pkv_trace_request *r);
pkv_status pkvi_trace_check_request(const pkv_trace_request *r, double prev_arrival,
                                    const char **field, char *msg, size_t msg_len);
// Move v's requests into a new trace (v is left empty).
pkv_status pkvi_trace_finish(pkvi_reqvec *v, pkv_trace_format format, uint64_t skipped,
                             pkv_trace **out);

// ---- defined in trace.c ----
// (pkvi_trace_tokens, above)

// ---- defined in csv.c ----
// Format named by a CSV header line (not NUL-terminated), or PKV_TRACE_AUTO if none.
pkv_trace_format pkvi_csv_detect(const char *line, size_t len);
pkv_status pkvi_csv_parse(const char *text, size_t len, const char *name,
                          pkv_trace_format fmt, int skip_bad, pkv_trace **out,
                          pkv_trace_error *err);

// ---- defined in jsonl.c ----
pkv_status pkvi_jsonl_parse(const char *text, size_t len, const char *name, int skip_bad,
                            pkv_trace **out, pkv_trace_error *err);

#endif // PKV_RUNTIME_TRACE_INTERNAL_H

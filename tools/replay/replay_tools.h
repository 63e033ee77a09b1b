// SPDX-License-Identifier: MIT
// The research side of pkv-replay, shared by its source files (not library API):
// the provenance stamp, the report records (JSON line and CSV row from one field
// table), the sweep over parameter points with its thread pool, the SLO search,
// the progress line with SIGINT, and the merge of shards. Names are rt_ (replay
// tools); everything here lives in the pkv-replay program.
//
// Output contract (docs/RESEARCH.md): the JSON document is line-oriented so that
// shards merge without a JSON parser: line 1 the stamp, then trace, config and
// sweep lines, then one line per run ordered by point index, then the closing
// line. Everything but the stamp line is a function of the trace, the options
// and the library, so two runs of the same sweep differ only there.
#ifndef PKV_TOOLS_REPLAY_TOOLS_H
#define PKV_TOOLS_REPLAY_TOOLS_H

#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "pkv/replay.h"
#include "pkv/trace.h"

// ---- replay_stamp.c: provenance ----

typedef struct rt_stamp {
    char version[32];   // library version (pkv_version of the linked library)
    char commit[64];    // git describe at build time, "unknown" from a tarball
    char date[32];      // UTC, ISO 8601
    char cpu[128];      // CPU model name
    long cores;         // online CPUs
    char gpu[128];      // NVIDIA GPU model from the driver, "" if none
    char *command;      // the command line, shell-quoted (owned)
    char shard[32];     // "K/N" or "" when the whole sweep ran
} rt_stamp;

int rt_stamp_init(rt_stamp *s, int argc, char **argv);
void rt_stamp_free(rt_stamp *s);
// One JSON object, no newline; wall_s: seconds this process replayed. Holds the
// wall seconds of each run too (run_seconds, keyed by point index): they differ
// from run to run, so they live here and not in the runs.
typedef struct rt_result rt_result;
void rt_stamp_write(FILE *f, const rt_stamp *s, double wall_s, const rt_result *results,
                    size_t num_results);
// FNV-1a 64 of a file's bytes. 0 on success, -1 if unreadable.
int rt_fnv1a64_file(const char *path, uint64_t *hash);
// A JSON string literal.
void rt_json_str(FILE *f, const char *s);
// A JSON number (null for NaN or infinity), "%.9g".
void rt_json_num(FILE *f, double v);

// ---- replay_sweep.c: points, shards and the thread pool ----

// One parameter point. Non-paged policies ignore the block size, so the sweep
// runs them once per (kv_mem, load_scale) with block_size 0.
typedef struct rt_point {
    uint32_t index;        // position in the whole sweep (output order)
    pkv_policy policy;     // (ignored when custom is set)
    uint32_t block_size;   // paged: tokens per block; others: 0
    double load_scale;
    uint64_t kv_mem_bytes; // 0: the default budget formula
    const pkv_policy_vtable *custom; // a plugin's table (--policy-plugin), else NULL
} rt_point;

// A point's policy name.
static inline const char *rt_point_policy(const rt_point *p) {
    return p->custom ? p->custom->name : pkv_policy_name(p->policy);
}

typedef struct rt_axes {
    int policies[PKV_POLICY_COUNT]; // 1: in the sweep
    uint32_t block_sizes[64];
    size_t num_block_sizes;
    double load_scales[64];
    size_t num_load_scales;
    uint64_t kv_mems[64]; // 0 = default
    size_t num_kv_mems;
    const pkv_policy_vtable *plugins[8]; // --policy-plugin tables, after the built-in ones
    size_t num_plugins;
} rt_axes;

// Comma-separated lists. 0 ok, -1 bad (message in err).
int rt_parse_policies(const char *text, rt_axes *a, char *err, size_t cap);
int rt_parse_block_sizes(const char *text, rt_axes *a, char *err, size_t cap);
int rt_parse_load_scales(const char *text, rt_axes *a, char *err, size_t cap);
int rt_parse_kv_mems(const char *text, rt_axes *a, char *err, size_t cap);
// "K/N", 1 <= K <= N. 0 ok, -1 bad.
int rt_parse_shard(const char *text, uint32_t *k, uint32_t *n);

// Every point of the cross product, in output order: kv_mem, then load scale,
// then policy, then block size. *out is malloc'ed. Returns the count.
size_t rt_points(const rt_axes *a, rt_point **out);

// Requests per second of a trace replayed at `scale` (0 if it has no duration).
double rt_request_rate(const pkv_trace *trace, double scale);

// A bounded timeline: at most 2 x limit rows per run (limit 0: every step),
// by keeping every stride-th step and doubling the stride when full.
typedef struct rt_timeline {
    pkv_replay_step *rows;
    size_t n, cap, limit;
    uint64_t stride;
} rt_timeline;
void rt_timeline_add(rt_timeline *t, const pkv_replay_step *s);
void rt_timeline_free(rt_timeline *t);
// groups: a report of the runs (their model's KV cache groups add a needed and a
// held column per group), or NULL.
void rt_timeline_header(FILE *f, const pkv_replay_report *groups);
void rt_timeline_write(FILE *f, const rt_result *r); // its timeline's rows

// ---- replay_progress.c: the progress line and SIGINT/SIGTERM ----

// Set to the signal number by SIGINT or SIGTERM (the first one; a second one kills as usual). An atomic, not a
// volatile sig_atomic_t, because worker threads read it while the handler runs
// on whichever thread the signal hit (lock-free, so safe in a handler).
extern atomic_int rt_stop_requested;
void rt_install_stop_signals(void); // SIGINT and SIGTERM set rt_stop_requested

// Counters the workers update and the main thread reads (one slot per worker).
typedef struct rt_progress rt_progress;
rt_progress *rt_progress_create(unsigned workers, uint64_t total_requests, int enabled);
void rt_progress_destroy(rt_progress *p);
// Worker side: requests done and simulated clock of the run in progress.
void rt_progress_update(rt_progress *p, unsigned worker, uint64_t done, double sim_s);
// Worker side: a run ended after `requests` requests; its counts fold in.
void rt_progress_finish_run(rt_progress *p, unsigned worker, uint64_t requests);
// Main side: redraw the line (if enabled); `last` clears it for good.
void rt_progress_draw(rt_progress *p, int last);

// ---- replay_record.c: a run as JSON line and CSV row ----

struct rt_result {
    rt_point point;
    double request_rate;       // requests/s at point.load_scale
    int ran;                   // 0: not reached (SIGINT before it started) or failed
    pkv_status status;         // PKV_OK, or why pkv_replay_run failed (ran = 0)
    pkv_replay_report report;
    // SLO search only.
    int slo_met, slo_bounded;  // met at point.load_scale; bounded: the top of the range failed
    uint32_t slo_probes;
    rt_timeline timeline;
    // Completed requests in completion order (--requests), malloc'ed.
    pkv_replay_request_done *requests;
    size_t num_requests, cap_requests;
    double seconds;            // wall time of the run (or of the whole search)
};

// --requests: one CSV row per completed request of every run, for latency CDFs.
void rt_requests_header(FILE *f);
void rt_requests_write(FILE *f, const rt_result *r);

// `{"point": {...}, <report fields>}` (no newline); slo: include the slo object.
void rt_record_json(FILE *f, const rt_result *r, int slo);
void rt_record_csv_header(FILE *f, int slo);
// One row; commit and trace hash repeat the stamp for provenance.
void rt_record_csv_row(FILE *f, const rt_result *r, int slo, const char *commit,
                       uint64_t trace_hash);

// ---- replay_slo.c: throughput at a latency SLO ----

enum { RT_SLO_MAX = 8 };
typedef struct rt_slo {
    struct {
        char metric[24]; // ttft_p50, ..., norm_ms_per_token
        size_t offset;   // of the double in pkv_replay_report
        double limit_ms;
    } terms[RT_SLO_MAX];
    size_t num_terms;
    char text[256];      // as given
} rt_slo;

// "ttft_p99<=2s,tpot_p50<=100ms". 0 ok, -1 bad (message in err).
int rt_slo_parse(const char *text, rt_slo *slo, char *err, size_t cap);
// 1 if the report meets every term (a partial report never does).
int rt_slo_met(const rt_slo *slo, const pkv_replay_report *r);

// ---- replay_run.c: run points (sweep) or searches (SLO) over worker threads ----

typedef struct rt_job {
    const pkv_trace *trace;          // borrowed, read-only (scaled per point)
    const pkv_replay_params *base;   // borrowed: everything but the point's fields
    rt_result *results;              // [num], results[i].point filled by the caller
    size_t num;
    unsigned jobs;                   // worker threads
    size_t timeline_limit;           // rows per run; SIZE_MAX: no timeline
    int keep_requests;               // fill results[i].requests
    const rt_slo *slo;               // NULL: plain sweep
    double slo_lo, slo_hi, slo_tol;  // search bracket and relative tolerance
    int progress;                    // draw the progress line
} rt_job;

// Runs every result's point; on SIGINT the run in progress stops (partial) and
// the rest are left with ran = 0. A failed point gets its status and ran = 0;
// the others still run. PKV_OK, or the first failure.
pkv_status rt_run(const rt_job *job);

// ---- replay_merge.c: `pkv-replay merge` ----

int rt_merge_main(int argc, char **argv);

// ---- pkv_replay.c: the whole command line (replay_main.c's main calls it) ----

// What `pkv-replay ARGS` does, exit code included. A function so that the Python
// extension runs the same code (python/src/sweep.c, in a child process: it installs
// a SIGINT handler and writes to stdout and stderr).
int rt_replay_main(int argc, char **argv);

#endif // PKV_TOOLS_REPLAY_TOOLS_H

// ---- replay_doc.c: the whole JSON document and the CSV file ----

typedef struct rt_doc {
    const rt_stamp *stamp;
    double wall_s;
    const char *trace_path;
    const pkv_trace *trace;          // as loaded (load scale 1)
    uint64_t trace_hash;             // FNV-1a 64 of the file's bytes
    const char *format_option;       // --format as given
    int skip_bad;
    const pkv_replay_params *base;   // effective parameters
    const rt_axes *axes;
    size_t num_points;               // in the whole sweep
    const rt_slo *slo;               // NULL: plain sweep
    double slo_lo, slo_hi, slo_tol;
    const rt_result *results;        // the ones this process ran (ran = 1 are written)
    size_t num_results;
} rt_doc;

// Writes the line-oriented JSON document (see the top of this file).
void rt_doc_write_json(FILE *f, const rt_doc *d);
void rt_doc_write_csv(FILE *f, const rt_doc *d);
// 1 if a result was cut short (SIGINT) or never ran.
int rt_doc_partial(const rt_doc *d);
// The human table: the library's table for a plain run, one row per point with
// its parameters for a sweep, one row per search for an SLO.
void rt_print_table(FILE *f, const rt_doc *d);

// SPDX-License-Identifier: MIT
// Tests for trace loading (native, Azure, BurstGPT, Mooncake), every kind of bad
// input (each error names file, line and field), --skip-bad counting, saving,
// and the synthetic generator's determinism and distributions. The "issue15"
// suites are one regression test per reliability defect (issue 15).
#include <criterion/criterion.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "pkv/replay.h"
#include "pkv/trace.h"

static pkv_trace *parse_ok(const char *text, const char *name) {
    pkv_trace *t = NULL;
    pkv_trace_error err;
    memset(&err, 0, sizeof err);
    pkv_status st = pkv_trace_parse(text, strlen(text), name, NULL, &t, &err);
    cr_assert_eq(st, PKV_OK, "parse failed: %s:%llu field '%s': %s", err.file,
                 (unsigned long long)err.line, err.field, err.message);
    return t;
}

// Parse text that must fail with PKV_ERR_FORMAT at (line, field).
static void parse_bad(const char *text, const char *name, uint64_t line, const char *field,
                      const char *msg_part) {
    pkv_trace *t = NULL;
    pkv_trace_error err;
    memset(&err, 0, sizeof err);
    pkv_status st = pkv_trace_parse(text, strlen(text), name, NULL, &t, &err);
    cr_assert_eq(st, PKV_ERR_FORMAT, "expected a format error for %s", name);
    cr_expect_null(t);
    cr_expect_str_eq(err.file, name);
    cr_expect_eq(err.line, line, "line: got %llu want %llu (%s)", (unsigned long long)err.line,
                 (unsigned long long)line, err.message);
    cr_expect_str_eq(err.field, field, "field: got '%s' (%s)", err.field, err.message);
    if (msg_part) cr_expect(strstr(err.message, msg_part) != NULL, "message '%s' lacks '%s'", err.message, msg_part);
}

// ---- native ----

Test(trace_native, required_columns_and_defaults) {
    pkv_trace *t = parse_ok("arrival_s,prompt_tokens,output_tokens\n0,10,5\n0.5,20,1\n", "a.csv");
    cr_assert_eq(pkv_trace_count(t), 2);
    const pkv_trace_request *r = pkv_trace_requests(t);
    cr_expect_eq(r[1].arrival_s, 0.5);
    cr_expect_eq(r[1].prompt_tokens, 20);
    cr_expect_eq(r[1].output_tokens, 1);
    cr_expect_eq(r[0].n, 1);
    cr_expect_eq(r[0].prefix_group, -1);
    cr_expect_eq(r[0].prefix_tokens, 0);
    cr_expect_eq(r[1].request_id, 1, "ids default to the row index");
    cr_expect_eq(pkv_trace_get_format(t), PKV_TRACE_NATIVE);
    pkv_trace_destroy(t);
}

Test(trace_native, all_columns_any_order_crlf_and_blank_lines) {
    pkv_trace *t = parse_ok("request_id,n,output_tokens,prefix_tokens,prompt_tokens,prefix_group,arrival_s\r\n"
                            "\r\n"
                            "7,4,3,16,32,2,1.25\r\n"
                            "9,,3,,8,,2\r\n",
                            "b.csv");
    cr_assert_eq(pkv_trace_count(t), 2);
    const pkv_trace_request *r = pkv_trace_requests(t);
    cr_expect_eq(r[0].request_id, 7);
    cr_expect_eq(r[0].n, 4);
    cr_expect_eq(r[0].prefix_group, 2);
    cr_expect_eq(r[0].prefix_tokens, 16);
    cr_expect_eq(r[0].prompt_tokens, 32);
    cr_expect_eq(r[0].arrival_s, 1.25);
    cr_expect_eq(r[1].n, 1, "an empty optional field takes the default");
    cr_expect_eq(r[1].prefix_group, -1);
    pkv_trace_destroy(t);
}

Test(trace_native, missing_column) {
    parse_bad("arrival_s,prompt_tokens\n0,10\n", "m.csv", 1, "output_tokens", "missing column");
}

Test(trace_native, non_number) {
    parse_bad("arrival_s,prompt_tokens,output_tokens\n0,10,5\n1,abc,5\n", "nn.csv", 3,
              "prompt_tokens", "not an integer");
    parse_bad("arrival_s,prompt_tokens,output_tokens\nsoon,10,5\n", "nn2.csv", 2, "arrival_s",
              "not a number");
    parse_bad("arrival_s,prompt_tokens,output_tokens\n0,10,5.5\n", "nn3.csv", 2, "output_tokens",
              "not an integer");
}

Test(trace_native, negative_length) {
    parse_bad("arrival_s,prompt_tokens,output_tokens\n0,-3,5\n", "neg.csv", 2, "prompt_tokens",
              ">= 1");
}

Test(trace_native, zero_length) {
    parse_bad("arrival_s,prompt_tokens,output_tokens\n0,3,0\n", "zero.csv", 2, "output_tokens",
              ">= 1");
    parse_bad("arrival_s,prompt_tokens,output_tokens,n\n0,3,2,0\n", "zeron.csv", 2, "n", ">= 1");
}

Test(trace_native, negative_arrival) {
    parse_bad("arrival_s,prompt_tokens,output_tokens\n-1,3,2\n", "na.csv", 2, "arrival_s", ">= 0");
}

Test(trace_native, unsorted_arrivals) {
    parse_bad("arrival_s,prompt_tokens,output_tokens\n0,1,1\n2,1,1\n1,1,1\n", "u.csv", 4,
              "arrival_s", "not sorted");
}

Test(trace_native, truncated_line) {
    parse_bad("arrival_s,prompt_tokens,output_tokens\n0,1,1\n1,2", "tr.csv", 3, "output_tokens",
              "truncated");
}

Test(trace_native, prefix_longer_than_prompt) {
    parse_bad("arrival_s,prompt_tokens,output_tokens,prefix_group,prefix_tokens\n0,8,1,1,9\n",
              "pl.csv", 2, "prefix_tokens", "longer than the prompt");
}

Test(trace_native, bad_prefix_group) {
    parse_bad("arrival_s,prompt_tokens,output_tokens,prefix_group\n0,8,1,x\n", "pg.csv", 2,
              "prefix_group", "group id");
}

Test(trace_any, empty_file) {
    parse_bad("", "empty.csv", 0, "", "empty file");
    parse_bad("  \n\n", "blank.csv", 0, "", "empty file");
}

Test(trace_any, header_only) {
    parse_bad("arrival_s,prompt_tokens,output_tokens\n", "h.csv", 0, "", "no requests");
}

Test(trace_any, unknown_header) {
    parse_bad("time,in,out\n0,1,1\n", "x.csv", 1, "", "unknown header");
}

Test(trace_any, missing_file_is_io_error) {
    pkv_trace *t = NULL;
    pkv_trace_error err;
    cr_expect_eq(pkv_trace_load("/nonexistent/dir/trace.csv", NULL, &t, &err), PKV_ERR_IO);
    cr_expect_str_eq(err.file, "/nonexistent/dir/trace.csv");
    cr_expect(strstr(err.message, "cannot open") != NULL);
}

Test(trace_any, skip_bad_counts_rows) {
    const char *text = "arrival_s,prompt_tokens,output_tokens\n0,1,1\n1,x,1\n2,0,1\n1.5,4,4\n"
                       "3,2\n4,5,6\n";
    pkv_trace_load_options o = pkv_trace_load_options_default();
    o.skip_bad = 1;
    pkv_trace *t = NULL;
    pkv_trace_error err;
    cr_assert_eq(pkv_trace_parse(text, strlen(text), "s.csv", &o, &t, &err), PKV_OK);
    // Good: rows at 0, 1.5 and 4; bad: non-number, zero, truncated.
    cr_expect_eq(pkv_trace_count(t), 3);
    cr_expect_eq(pkv_trace_skipped(t), 3);
    cr_expect_eq(pkv_trace_requests(t)[1].arrival_s, 1.5);
    pkv_trace_destroy(t);
    // Nothing good at all is still an error.
    const char *all_bad = "arrival_s,prompt_tokens,output_tokens\n0,0,1\n";
    cr_expect_eq(pkv_trace_parse(all_bad, strlen(all_bad), "s2.csv", &o, &t, &err), PKV_ERR_FORMAT);
}

// ---- Azure ----

Test(trace_azure, wall_clock_rebased_no_trailing_newline) {
    pkv_trace *t = parse_ok("TIMESTAMP,ContextTokens,GeneratedTokens\n"
                            "2023-11-16 18:17:03.9799600,4808,10\n"
                            "2023-11-16 18:17:05.4799600,3180,8\n"
                            "2023-11-17 00:00:00,1,1",
                            "AzureLLMInferenceTrace_code.csv");
    cr_assert_eq(pkv_trace_count(t), 3);
    const pkv_trace_request *r = pkv_trace_requests(t);
    cr_expect_eq(pkv_trace_get_format(t), PKV_TRACE_AZURE);
    cr_expect_eq(r[0].arrival_s, 0);
    cr_expect_float_eq(r[1].arrival_s, 1.5, 1e-6);
    // 18:17:03.97996 -> midnight of the next day (crosses a date).
    cr_expect_float_eq(r[2].arrival_s, 5 * 3600 + 42 * 60 + 56.02004, 1e-5);
    cr_expect_eq(r[0].prompt_tokens, 4808);
    cr_expect_eq(r[0].output_tokens, 10);
    pkv_trace_destroy(t);
}

Test(trace_azure, bad_timestamp) {
    parse_bad("TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16T18:17:03,1,1\n", "az.csv", 2,
              "TIMESTAMP", "not a timestamp");
    parse_bad("TIMESTAMP,ContextTokens,GeneratedTokens\n2023-13-16 18:17:03,1,1\n", "az2.csv", 2,
              "TIMESTAMP", "not a timestamp");
}

Test(trace_azure, errors_use_the_file_column_names) {
    parse_bad("TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:17:03,0,1\n", "az3.csv", 2,
              "ContextTokens", ">= 1");
    parse_bad("TIMESTAMP,ContextTokens\n2023-11-16 18:17:03,1\n", "az4.csv", 1, "GeneratedTokens",
              "missing column");
    parse_bad("TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:17:03,1,1\n"
              "2023-11-16 18:17:02,1,1\n",
              "az5.csv", 3, "TIMESTAMP", "not sorted");
}

// ---- BurstGPT ----

Test(trace_burstgpt, columns_and_zero_response) {
    const char *hdr = "Timestamp,Model,Request tokens,Response tokens,Total tokens,Log Type\n";
    char text[512];
    snprintf(text, sizeof text, "%s5,ChatGPT,472,18,490,Conversation log\n"
                                "45,GPT-4,1087,230,1317,Conversation log\n", hdr);
    pkv_trace *t = parse_ok(text, "BurstGPT_1.csv");
    cr_assert_eq(pkv_trace_count(t), 2);
    cr_expect_eq(pkv_trace_get_format(t), PKV_TRACE_BURSTGPT);
    const pkv_trace_request *r = pkv_trace_requests(t);
    cr_expect_eq(r[0].arrival_s, 0, "rebased to the first row");
    cr_expect_eq(r[1].arrival_s, 40);
    cr_expect_eq(r[1].prompt_tokens, 1087);
    cr_expect_eq(r[1].output_tokens, 230);
    pkv_trace_destroy(t);
    // BurstGPT logs failed requests with 0 response tokens: an error unless skipped.
    snprintf(text, sizeof text, "%s5,ChatGPT,472,0,472,Conversation log\n", hdr);
    parse_bad(text, "BurstGPT_2.csv", 2, "Response tokens", ">= 1");
}

// ---- Mooncake ----

Test(trace_mooncake, fields_and_prefix_groups) {
    pkv_trace *t = parse_ok(
        "{\"timestamp\": 0, \"input_length\": 1500, \"output_length\": 10, \"hash_ids\": [0, 1, 2]}\n"
        "{\"timestamp\": 0, \"input_length\": 1200, \"output_length\": 20, \"hash_ids\": [0, 1, 3]}\n"
        "{\"timestamp\": 2500, \"input_length\": 700, \"output_length\": 30, \"hash_ids\": [7, 8]}\n"
        "{\"timestamp\": 3000, \"input_length\": 600, \"output_length\": 5, \"hash_ids\": [0, 1]}\n",
        "conversation_trace.jsonl");
    cr_assert_eq(pkv_trace_count(t), 4);
    cr_expect_eq(pkv_trace_get_format(t), PKV_TRACE_MOONCAKE);
    const pkv_trace_request *r = pkv_trace_requests(t);
    cr_expect_float_eq(r[2].arrival_s, 2.5, 1e-12);
    cr_expect_eq(r[0].prompt_tokens, 1500);
    cr_expect_eq(r[2].output_tokens, 30);
    // Rows 0, 1 and 3 share the chain [0, 1] (two 512-token blocks).
    cr_expect_geq(r[0].prefix_group, 0);
    cr_expect_eq(r[0].prefix_group, r[1].prefix_group);
    cr_expect_eq(r[0].prefix_group, r[3].prefix_group);
    cr_expect_eq(r[0].prefix_tokens, 1024);
    cr_expect_eq(r[3].prefix_tokens, 600, "capped at the prompt");
    cr_expect_eq(r[2].prefix_group, -1, "no other request starts with block 7");
    pkv_trace_destroy(t);
}

Test(trace_mooncake, detected_by_content_without_extension) {
    pkv_trace *t = parse_ok("{\"timestamp\": 5, \"input_length\": 3, \"output_length\": 4}\n", "trace.txt");
    cr_expect_eq(pkv_trace_get_format(t), PKV_TRACE_MOONCAKE);
    cr_expect_eq(pkv_trace_requests(t)[0].prefix_group, -1);
    pkv_trace_destroy(t);
}

Test(trace_mooncake, missing_key) {
    parse_bad("{\"timestamp\": 0, \"output_length\": 4}\n", "mk.jsonl", 1, "input_length",
              "missing key");
}

Test(trace_mooncake, non_number) {
    parse_bad("{\"timestamp\": 0, \"input_length\": \"ten\", \"output_length\": 4}\n", "nn.jsonl",
              1, "input_length", "not a number");
    parse_bad("{\"timestamp\": 0, \"input_length\": 3, \"output_length\": 4, \"hash_ids\": [1, x]}\n",
              "nn2.jsonl", 1, "hash_ids", "block id");
}

Test(trace_mooncake, zero_and_negative_lengths) {
    parse_bad("{\"timestamp\": 0, \"input_length\": 3, \"output_length\": 0}\n", "z.jsonl", 1,
              "output_length", ">= 1");
    parse_bad("{\"timestamp\": 0, \"input_length\": -3, \"output_length\": 2}\n", "n.jsonl", 1,
              "input_length", ">= 1");
}

Test(trace_mooncake, truncated_line) {
    parse_bad("{\"timestamp\": 0, \"input_length\": 3, \"output_length\": 4}\n"
              "{\"timestamp\": 1, \"input_length\": 3, \"hash_ids\": [1, 2\n",
              "t.jsonl", 2, "hash_ids", "truncated");
}

Test(trace_mooncake, unsorted) {
    parse_bad("{\"timestamp\": 9, \"input_length\": 3, \"output_length\": 4}\n"
              "{\"timestamp\": 1, \"input_length\": 3, \"output_length\": 4}\n",
              "u.jsonl", 2, "timestamp", "not sorted");
}

Test(trace_mooncake, not_an_object) {
    parse_bad("{\"timestamp\": 0, \"input_length\": 3, \"output_length\": 4}\n[1, 2]\n", "o.jsonl",
              2, "", "JSON object");
}

// ---- building, saving, generating ----

Test(trace_create, validates_requests) {
    pkv_trace_request r[2] = {{0, 10, 5, 1, -1, 0, 0}, {1, 10, 5, 1, -1, 0, 1}};
    pkv_trace *t = NULL;
    pkv_trace_error err;
    cr_assert_eq(pkv_trace_create(r, 2, &t, &err), PKV_OK);
    pkv_trace_destroy(t);
    r[1].arrival_s = -0.5;
    cr_expect_eq(pkv_trace_create(r, 2, &t, &err), PKV_ERR_FORMAT);
    cr_expect_str_eq(err.field, "arrival_s");
    r[1].arrival_s = 1;
    r[1].output_tokens = 0;
    cr_expect_eq(pkv_trace_create(r, 2, &t, &err), PKV_ERR_FORMAT);
    cr_expect_str_eq(err.field, "output_tokens");
    cr_expect_eq(err.line, 1);
    cr_expect_eq(pkv_trace_create(r, 0, &t, &err), PKV_ERR_FORMAT);
    cr_expect_eq(pkv_trace_create(NULL, 1, &t, &err), PKV_ERR_INVALID_ARG);
}

Test(trace_save, round_trip) {
    pkv_tracegen_params p = pkv_tracegen_params_default();
    p.num_requests = 300;
    p.parallel_frac = 0.5;
    p.n_min = 2;
    p.n_max = 8;
    p.prefix_frac = 0.5;
    p.prefix_groups = 3;
    p.prefix_tokens = 100;
    pkv_trace *a = NULL, *b = NULL;
    cr_assert_eq(pkv_trace_generate(&p, &a), PKV_OK);
    char path[] = "/tmp/pkv_trace_rt_XXXXXX";
    int fd = mkstemp(path);
    cr_assert_geq(fd, 0);
    fclose(fdopen(fd, "w"));
    cr_assert_eq(pkv_trace_save(a, path), PKV_OK);
    pkv_trace_error err;
    cr_assert_eq(pkv_trace_load(path, NULL, &b, &err), PKV_OK, "%s", err.message);
    remove(path);
    cr_assert_eq(pkv_trace_count(b), 300);
    const pkv_trace_request *x = pkv_trace_requests(a), *y = pkv_trace_requests(b);
    for (size_t i = 0; i < 300; i++) {
        cr_expect_float_eq(x[i].arrival_s, y[i].arrival_s, 1e-6);
        cr_expect_eq(x[i].prompt_tokens, y[i].prompt_tokens);
        cr_expect_eq(x[i].output_tokens, y[i].output_tokens);
        cr_expect_eq(x[i].n, y[i].n);
        cr_expect_eq(x[i].prefix_group, y[i].prefix_group);
        cr_expect_eq(x[i].prefix_tokens, y[i].prefix_tokens);
        cr_expect_eq(x[i].request_id, y[i].request_id);
    }
    pkv_trace_destroy(a);
    pkv_trace_destroy(b);
}

Test(tracegen, same_seed_same_trace_other_seed_differs) {
    pkv_tracegen_params p = pkv_tracegen_params_default();
    p.num_requests = 500;
    pkv_trace *a, *b, *c;
    cr_assert_eq(pkv_trace_generate(&p, &a), PKV_OK);
    cr_assert_eq(pkv_trace_generate(&p, &b), PKV_OK);
    p.seed = 2;
    cr_assert_eq(pkv_trace_generate(&p, &c), PKV_OK);
    cr_expect_eq(memcmp(pkv_trace_requests(a), pkv_trace_requests(b), 500 * sizeof(pkv_trace_request)), 0);
    cr_expect_neq(memcmp(pkv_trace_requests(a), pkv_trace_requests(c), 500 * sizeof(pkv_trace_request)), 0);
    pkv_trace_destroy(a);
    pkv_trace_destroy(b);
    pkv_trace_destroy(c);
}

static double median_of(uint32_t *v, size_t n) {
    uint32_t *c = malloc(n * sizeof *c);
    memcpy(c, v, n * sizeof *c);
    for (size_t i = 1; i < n; i++) { // small n: insertion sort is fine
        uint32_t x = c[i];
        size_t j = i;
        while (j > 0 && c[j - 1] > x) c[j] = c[j - 1], j--;
        c[j] = x;
    }
    double m = c[n / 2];
    free(c);
    return m;
}

Test(tracegen, distributions_match_parameters) {
    pkv_tracegen_params p = pkv_tracegen_params_default();
    p.num_requests = 8000;
    p.rate_rps = 4;
    p.parallel_frac = 0.25;
    p.n_min = 2;
    p.n_max = 8;
    pkv_trace *t;
    cr_assert_eq(pkv_trace_generate(&p, &t), PKV_OK);
    const pkv_trace_request *r = pkv_trace_requests(t);
    uint32_t *in = malloc(8000 * sizeof *in), *out = malloc(8000 * sizeof *out);
    size_t parallel = 0;
    for (size_t i = 0; i < 8000; i++) {
        in[i] = r[i].prompt_tokens;
        out[i] = r[i].output_tokens;
        cr_assert(r[i].n == 1 || (r[i].n >= 2 && r[i].n <= 8));
        parallel += r[i].n > 1;
        cr_assert_leq(r[i].prompt_tokens, p.prompt_max);
        cr_assert_leq(r[i].output_tokens, p.output_max);
    }
    // Log-normal medians within 5%; Poisson rate within 5%; n > 1 fraction ~25%.
    cr_expect_float_eq(median_of(in, 8000), 1020, 51);
    cr_expect_float_eq(median_of(out, 8000), 129, 6.5);
    cr_expect_float_eq(8000 / r[7999].arrival_s, 4.0, 0.2);
    cr_expect_float_eq(parallel / 8000.0, 0.25, 0.02);
    free(in);
    free(out);
    pkv_trace_destroy(t);
}

Test(tracegen, bursty_gaps_have_requested_cv) {
    pkv_tracegen_params p = pkv_tracegen_params_default();
    p.num_requests = 20001;
    p.arrival = PKV_ARRIVAL_BURSTY;
    p.burst_cv = 3;
    p.rate_rps = 10;
    pkv_trace *t;
    cr_assert_eq(pkv_trace_generate(&p, &t), PKV_OK);
    const pkv_trace_request *r = pkv_trace_requests(t);
    double s = 0, s2 = 0;
    for (size_t i = 1; i < 20001; i++) {
        double g = r[i].arrival_s - r[i - 1].arrival_s;
        s += g;
        s2 += g * g;
    }
    double mean = s / 20000, cv = sqrt(s2 / 20000 - mean * mean) / mean;
    cr_expect_float_eq(mean, 0.1, 0.01);
    cr_expect_float_eq(cv, 3.0, 0.3);
    pkv_trace_destroy(t);
}

Test(tracegen, prefix_groups_extend_prompts) {
    pkv_tracegen_params p = pkv_tracegen_params_default();
    p.num_requests = 1000;
    p.prefix_frac = 1;
    p.prefix_groups = 3;
    p.prefix_tokens = 256;
    pkv_trace *t;
    cr_assert_eq(pkv_trace_generate(&p, &t), PKV_OK);
    const pkv_trace_request *r = pkv_trace_requests(t);
    for (size_t i = 0; i < 1000; i++) {
        cr_assert(r[i].prefix_group >= 0 && r[i].prefix_group < 3);
        cr_assert_eq(r[i].prefix_tokens, 256);
        cr_assert_gt(r[i].prompt_tokens, 256);
    }
    pkv_trace_destroy(t);
}

Test(tracegen, rejects_bad_params) {
    pkv_tracegen_params p = pkv_tracegen_params_default();
    pkv_trace *t = NULL;
    p.num_requests = 0;
    cr_expect_eq(pkv_trace_generate(&p, &t), PKV_ERR_INVALID_ARG);
    p = pkv_tracegen_params_default();
    p.rate_rps = 0;
    cr_expect_eq(pkv_trace_generate(&p, &t), PKV_ERR_INVALID_ARG);
    p = pkv_tracegen_params_default();
    p.arrival = PKV_ARRIVAL_BURSTY;
    p.burst_cv = 0.5;
    cr_expect_eq(pkv_trace_generate(&p, &t), PKV_ERR_INVALID_ARG);
    p = pkv_tracegen_params_default();
    p.n_min = 3;
    p.n_max = 2;
    cr_expect_eq(pkv_trace_generate(&p, &t), PKV_ERR_INVALID_ARG);
    cr_expect_null(t);
}

// ---- issue 15: one regression test per defect ----

// parse_bad for text with embedded NUL bytes (len given).
static void parse_bad_n(const char *text, size_t len, const char *name, uint64_t line,
                        const char *field, const char *msg_part) {
    pkv_trace *t = NULL;
    pkv_trace_error err;
    memset(&err, 0, sizeof err);
    cr_assert_eq(pkv_trace_parse(text, len, name, NULL, &t, &err), PKV_ERR_FORMAT,
                 "expected a format error for %s", name);
    cr_expect_null(t);
    cr_expect_eq(err.line, line, "line: got %llu want %llu (%s)", (unsigned long long)err.line,
                 (unsigned long long)line, err.message);
    cr_expect_str_eq(err.field, field, "field: got '%s' (%s)", err.field, err.message);
    if (msg_part)
        cr_expect(strstr(err.message, msg_part) != NULL, "message '%s' lacks '%s'", err.message,
                  msg_part);
}

// Defect 1: prompt + output - 1 overflowed 32 bits in the replay; such requests
// were served (4294967295-token prompt "done" in a 60 GiB budget) or failed
// the run. They must be rejected and counted, fractions in [0, 1].
Test(issue15, d1_overflowing_lengths_are_rejected_by_every_policy) {
    pkv_trace *t = parse_ok("arrival_s,prompt_tokens,output_tokens\n"
                            "0,4294967295,2\n0,3072,4294967295\n0,100,10\n",
                            "d1.csv");
    for (int p = 0; p < PKV_POLICY_COUNT; p++) {
        pkv_replay_params prm = pkv_replay_params_default();
        prm.policy = (pkv_policy)p;
        pkv_replay_report rep;
        cr_assert_eq(pkv_replay_run(t, &prm, &rep), PKV_OK, "policy %s", pkv_policy_name(prm.policy));
        cr_expect_eq(rep.requests.completed, 1, "%s", rep.policy);
        cr_expect_eq(rep.requests.rejected, 2, "%s", rep.policy);
        cr_expect_leq(rep.memory.peak_used_bytes, rep.memory.capacity_bytes, "%s", rep.policy);
        const double f[4] = {rep.memory.waste_frac, rep.memory.internal_frag_frac,
                             rep.memory.reservation_frac, rep.memory.external_frag_frac};
        for (int k = 0; k < 4; k++)
            cr_expect(f[k] >= 0 && f[k] <= 1, "%s fraction %d = %g", rep.policy, k, f[k]);
    }
    pkv_trace_destroy(t);
}

// Defect 1, the edge: with --max-seq-len 2^32 - 1 a final length of exactly
// 2^32 - 1 is allowed and one of 2^32 (the old wrap to 0) is not.
Test(issue15, d1_final_length_compared_in_64_bits) {
    pkv_trace *t = parse_ok("arrival_s,prompt_tokens,output_tokens\n"
                            "0,4294967295,2\n0,2000,50\n", "d1b.csv");
    pkv_replay_params prm = pkv_replay_params_default();
    prm.max_seq_len = UINT32_MAX;
    pkv_replay_report rep;
    cr_assert_eq(pkv_replay_run(t, &prm, &rep), PKV_OK);
    cr_expect_eq(rep.requests.completed, 1);
    cr_expect_eq(rep.requests.rejected, 1);
    pkv_trace_destroy(t);
}

// Defect 2: the generator returned OK with NaN / inf arrivals.
Test(issue15, d2_generator_never_returns_non_finite_arrivals) {
    pkv_tracegen_params p = pkv_tracegen_params_default();
    p.num_requests = 50;
    pkv_trace *t = NULL;
    p.arrival = PKV_ARRIVAL_BURSTY;
    const double bad_cv[] = {1e200, INFINITY, NAN};
    for (int k = 0; k < 3; k++) {
        p.burst_cv = bad_cv[k];
        cr_expect_eq(pkv_trace_generate(&p, &t), PKV_ERR_INVALID_ARG, "burst_cv %g", bad_cv[k]);
    }
    p = pkv_tracegen_params_default();
    p.num_requests = 50;
    const double bad_rate[] = {1e-320, INFINITY, NAN, 0};
    for (int k = 0; k < 4; k++) {
        p.rate_rps = bad_rate[k];
        cr_expect_eq(pkv_trace_generate(&p, &t), PKV_ERR_INVALID_ARG, "rate %g", bad_rate[k]);
    }
    p.rate_rps = 2;
    p.prompt_median = INFINITY;
    cr_expect_eq(pkv_trace_generate(&p, &t), PKV_ERR_INVALID_ARG);
    // Extreme but representable: OK, and every arrival finite.
    p = pkv_tracegen_params_default();
    p.num_requests = 50;
    p.rate_rps = 1e-300;
    cr_assert_eq(pkv_trace_generate(&p, &t), PKV_OK);
    for (size_t i = 0; i < pkv_trace_count(t); i++)
        cr_expect(isfinite(pkv_trace_requests(t)[i].arrival_s));
    pkv_trace_destroy(t);
}

// Defect 3: Mooncake hash ids went through a double: 2^53 and 2^53 + 1 became
// one shared prefix, and 1e20 was an out-of-range float-to-integer cast.
Test(issue15, d3_hash_ids_are_exact_integers) {
    pkv_trace *t = parse_ok("{\"timestamp\": 0, \"input_length\": 600, \"output_length\": 4, "
                            "\"hash_ids\": [9007199254740992]}\n"
                            "{\"timestamp\": 1, \"input_length\": 600, \"output_length\": 4, "
                            "\"hash_ids\": [9007199254740993]}\n"
                            "{\"timestamp\": 2, \"input_length\": 600, \"output_length\": 4, "
                            "\"hash_ids\": [18446744073709551615]}\n"
                            "{\"timestamp\": 3, \"input_length\": 600, \"output_length\": 4, "
                            "\"hash_ids\": [18446744073709551615]}\n",
                            "d3.jsonl");
    const pkv_trace_request *r = pkv_trace_requests(t);
    cr_expect_eq(r[0].prefix_group, -1, "2^53 and 2^53 + 1 are different blocks");
    cr_expect_eq(r[1].prefix_group, -1);
    cr_expect_geq(r[2].prefix_group, 0, "UINT64_MAX twice is shared");
    cr_expect_eq(r[2].prefix_group, r[3].prefix_group);
    pkv_trace_destroy(t);
    const char *bad[] = {"1e20", "18446744073709551616", "100000000000000000000", "1.0", "-1", "01"};
    for (int k = 0; k < 6; k++) {
        char text[256];
        snprintf(text, sizeof text,
                 "{\"timestamp\": 0, \"input_length\": 600, \"output_length\": 4, \"hash_ids\": [%s]}\n",
                 bad[k]);
        parse_bad(text, "d3.jsonl", 1, "hash_ids", "block id");
    }
}

// Defect 4: NUL bytes were read as the end of a field (12\0garbage -> 12, a lone NUL -> 0).
Test(issue15, d4_nul_bytes_are_errors_in_every_reader) {
    static const char csv1[] = "arrival_s,prompt_tokens,output_tokens\n0,12\0garbage,5\n";
    parse_bad_n(csv1, sizeof csv1 - 1, "n.csv", 2, "prompt_tokens", "NUL");
    static const char csv2[] = "arrival_s,prompt_tokens,output_tokens\n\0,12,5\n";
    parse_bad_n(csv2, sizeof csv2 - 1, "n.csv", 2, "arrival_s", "NUL");
    static const char csv3[] = "arrival_s,prompt_tokens,output_tokens,note\n0,12,5,a\0b\n";
    parse_bad_n(csv3, sizeof csv3 - 1, "n.csv", 2, "note", "NUL");
    static const char az[] = "TIMESTAMP,ContextTokens,GeneratedTokens\n"
                             "2023-11-16 18:15:46.6805900\0,10,5\n";
    parse_bad_n(az, sizeof az - 1, "az.csv", 2, "TIMESTAMP", "NUL");
    static const char bg[] = "Timestamp,Model,Request tokens,Response tokens,Total tokens,Log Type\n"
                             "0\0,ChatGPT,10,5,15,Conversation log\n";
    parse_bad_n(bg, sizeof bg - 1, "bg.csv", 2, "Timestamp", "NUL");
    static const char mc1[] = "{\"timestamp\": 1\0, \"input_length\": 3, \"output_length\": 4}\n";
    parse_bad_n(mc1, sizeof mc1 - 1, "m.jsonl", 1, "timestamp", "NUL"); // issue 20, defect 10
    static const char mc2[] = "{\"timestamp\": 0, \"input_length\": 3, \"output_length\": 4, \"x\": \"a\0\"}\n";
    parse_bad_n(mc2, sizeof mc2 - 1, "m.jsonl", 1, "", "NUL");
    static const char mc3[] = "{\"timestamp\": 0, \"input_length\": 3, \"output_length\": 4, "
                              "\"hash_ids\": [1\0]}\n";
    parse_bad_n(mc3, sizeof mc3 - 1, "m.jsonl", 1, "hash_ids", "NUL");
    static const char mc4[] = "{\"time\0stamp\": 0, \"input_length\": 3, \"output_length\": 4}\n";
    parse_bad_n(mc4, sizeof mc4 - 1, "m.jsonl", 1, "", "NUL");
}

// Defect 6: saved traces did not load back (1e300 arrivals written as 300
// characters, request ids above INT64_MAX refused).
Test(issue15, d6_extreme_values_save_and_load_back) {
    pkv_trace_request r[3] = {{0, 10, 5, 1, -1, 0, UINT64_MAX},
                              {1e300, 10, 5, 2, 3, 4, (uint64_t)INT64_MAX + 1},
                              {1.7976931348623157e308, 4294967295u, 4294967295u, 4294967295u,
                               INT64_MAX, 4294967295u, 0}};
    pkv_trace *a = NULL, *b = NULL;
    pkv_trace_error err;
    cr_assert_eq(pkv_trace_create(r, 3, &a, &err), PKV_OK, "%s", err.message);
    char *buf = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&buf, &len);
    cr_assert_eq(pkv_trace_write_csv(a, f), PKV_OK);
    fclose(f);
    cr_assert_eq(pkv_trace_parse(buf, len, "rt.csv", NULL, &b, &err), PKV_OK,
                 "%s:%llu %s: %s", err.file, (unsigned long long)err.line, err.field, err.message);
    cr_assert_eq(pkv_trace_count(b), 3);
    const pkv_trace_request *y = pkv_trace_requests(b);
    for (int i = 0; i < 3; i++) {
        cr_expect_eq(y[i].arrival_s, r[i].arrival_s, "arrival %d: %.17g", i, y[i].arrival_s);
        cr_expect_eq(y[i].request_id, r[i].request_id);
        cr_expect_eq(y[i].prompt_tokens, r[i].prompt_tokens);
        cr_expect_eq(y[i].output_tokens, r[i].output_tokens);
        cr_expect_eq(y[i].n, r[i].n);
        cr_expect_eq(y[i].prefix_group, r[i].prefix_group);
        cr_expect_eq(y[i].prefix_tokens, r[i].prefix_tokens);
    }
    free(buf);
    pkv_trace_destroy(a);
    pkv_trace_destroy(b);
}

#if defined(__clang__)
__attribute__((no_sanitize("unsigned-integer-overflow"))) // splitmix64 wraps by design
#endif
static uint64_t rt_next(uint64_t *s) {
    uint64_t z = (*s += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

// Defect 6 as a property: any valid trace, written and read back, gives the
// same requests (arrivals to the writer's microsecond resolution below 1e15 s,
// exactly above) and writing it again gives the same bytes.
Test(issue15, d6_round_trip_property) {
    uint64_t s = 15;
    for (int iter = 0; iter < 200; iter++) {
        const size_t n = 1 + rt_next(&s) % 40;
        pkv_trace_request *r = calloc(n, sizeof *r);
        double t = 0;
        for (size_t i = 0; i < n; i++) {
            // Gaps spread over 10^-300 .. 10^300 seconds.
            const int e = (int)(rt_next(&s) % 601) - 300;
            if (rt_next(&s) % 4) t += pow(10.0, e) * (double)(rt_next(&s) % 1000) / 100.0;
            if (!isfinite(t)) t = 1e308;
            r[i].arrival_s = t;
            r[i].prompt_tokens = 1 + (uint32_t)(rt_next(&s) % UINT32_MAX);
            r[i].output_tokens = 1 + (uint32_t)(rt_next(&s) % UINT32_MAX);
            r[i].n = 1 + (uint32_t)(rt_next(&s) % 8);
            r[i].prefix_group = (int64_t)(rt_next(&s) % 5) - 1;
            r[i].prefix_tokens = r[i].prefix_group >= 0 ? (uint32_t)(rt_next(&s) % r[i].prompt_tokens) : 0;
            r[i].request_id = rt_next(&s);
        }
        pkv_trace *a = NULL, *b = NULL;
        pkv_trace_error err;
        cr_assert_eq(pkv_trace_create(r, n, &a, &err), PKV_OK, "%s", err.message);
        char *b1 = NULL, *b2 = NULL;
        size_t l1 = 0, l2 = 0;
        FILE *f = open_memstream(&b1, &l1);
        cr_assert_eq(pkv_trace_write_csv(a, f), PKV_OK);
        fclose(f);
        cr_assert_eq(pkv_trace_parse(b1, l1, "rt.csv", NULL, &b, &err), PKV_OK,
                     "iter %d: %llu %s: %s", iter, (unsigned long long)err.line, err.field, err.message);
        cr_assert_eq(pkv_trace_count(b), n);
        const pkv_trace_request *y = pkv_trace_requests(b);
        for (size_t i = 0; i < n; i++) {
            const double x = r[i].arrival_s;
            if (x < 1e15) cr_expect_leq(fabs(y[i].arrival_s - x), 0.5e-6 * (1 + 1e-9), "iter %d", iter);
            else cr_expect_eq(y[i].arrival_s, x, "iter %d", iter);
            cr_expect_eq(y[i].prompt_tokens, r[i].prompt_tokens);
            cr_expect_eq(y[i].output_tokens, r[i].output_tokens);
            cr_expect_eq(y[i].n, r[i].n);
            cr_expect_eq(y[i].prefix_group, r[i].prefix_group);
            cr_expect_eq(y[i].prefix_tokens, r[i].prefix_tokens);
            cr_expect_eq(y[i].request_id, r[i].request_id);
        }
        f = open_memstream(&b2, &l2);
        cr_assert_eq(pkv_trace_write_csv(b, f), PKV_OK);
        fclose(f);
        cr_expect(l1 == l2 && memcmp(b1, b2, l1) == 0, "iter %d: second save differs", iter);
        free(b1);
        free(b2);
        free(r);
        pkv_trace_destroy(a);
        pkv_trace_destroy(b);
    }
}

// Defect 7: Feb 30 / Feb 31 were accepted (silently March), and fractions with an exponent.
Test(issue15, d7_azure_dates_are_checked) {
    const char *bad[] = {"2023-02-30 00:00:00", "2023-02-31 00:00:00", "2023-02-29 00:00:00",
                         "2023-04-31 00:00:00", "2023-11-16 18:15:46.5e-1",
                         "2023-11-16 18:15:46.",  "2023-11-16 18:15:46.-5",
                         "2023-11-16 18:15:46. 5", "2023-1-16 18:15:46.5",
                         "2023-11-16 18:15:+6.5"};
    for (size_t k = 0; k < sizeof bad / sizeof bad[0]; k++) {
        char text[160];
        snprintf(text, sizeof text, "TIMESTAMP,ContextTokens,GeneratedTokens\n%s,10,5\n", bad[k]);
        parse_bad(text, "az.csv", 2, "TIMESTAMP", "timestamp");
    }
    pkv_trace *t = parse_ok("TIMESTAMP,ContextTokens,GeneratedTokens\n"
                            "2024-02-28 23:59:59.5,10,5\n2024-02-29 00:00:00.25,10,5\n"
                            "2024-03-01 00:00:00,10,5\n",
                            "leap.csv");
    cr_expect_float_eq(pkv_trace_requests(t)[1].arrival_s, 0.75, 1e-9);
    cr_expect_float_eq(pkv_trace_requests(t)[2].arrival_s, 86400.5, 1e-6);
    pkv_trace_destroy(t);
}

// Defect 8: trailing commas and misspelled literals were accepted as JSON.
Test(issue15, d8_mooncake_lines_are_strict_json) {
    const char *bad[] = {
        "{\"timestamp\": 0, \"input_length\": 3, \"output_length\": 4,}",
        "{\"timestamp\": 0, \"input_length\": 3, \"output_length\": 4, \"hash_ids\": [1, 2,]}",
        "{\"timestamp\": 0, \"input_length\": 3, \"output_length\": 4, \"x\": nulljunk}",
        "{\"timestamp\": 0, \"input_length\": 3, \"output_length\": 4, \"x\": tru}",
        "{\"timestamp\": 0, \"input_length\": 3, \"output_length\": 4, \"x\": [1,]}",
        "{\"timestamp\": 0, \"input_length\": 3, \"output_length\": 4, \"x\": 01}",
        "{\"timestamp\": 0, \"input_length\": 3, \"output_length\": 4, \"x\": .5}",
        "{\"timestamp\": 0, \"input_length\": 3, \"output_length\": 4, \"x\": \"\\q\"}",
        "{\"timestamp\": 0, \"input_length\": 3, \"output_length\": 4, \"timestamp\": 1}",
        "{\"timestamp\": 0, \"input_length\": 3, \"output_length\": 4 \"x\": 1}",
        "{\"timestamp\": +1, \"input_length\": 3, \"output_length\": 4}",
        "{,\"timestamp\": 0, \"input_length\": 3, \"output_length\": 4}",
    };
    for (size_t k = 0; k < sizeof bad / sizeof bad[0]; k++) {
        pkv_trace *t = NULL;
        pkv_trace_error err;
        cr_expect_eq(pkv_trace_parse(bad[k], strlen(bad[k]), "j.jsonl", NULL, &t, &err),
                     PKV_ERR_FORMAT, "accepted: %s", bad[k]);
        cr_expect_eq(err.line, 1);
    }
    // Valid JSON the reader does not use is skipped, nested values included.
    pkv_trace *t = parse_ok("{\"session\": {\"a\": [1, -2.5e3, true, false, null, \"\\u00e9\\n\"]}, "
                            "\"timestamp\": 1.5e3, \"input_length\": 3, \"output_length\": 4, "
                            "\"hash_ids\": [], \"tags\": []}\n",
                            "ok.jsonl");
    cr_expect_eq(pkv_trace_requests(t)[0].prompt_tokens, 3);
    pkv_trace_destroy(t);
}

// Defect 9: pkv_trace_create accepted prefix_group -5, which the loader refuses.
Test(issue15, d9_create_validates_prefix_group_as_the_loader) {
    pkv_trace_request r = {0, 10, 5, 1, -5, 0, 0};
    pkv_trace *t = NULL;
    pkv_trace_error err;
    cr_expect_eq(pkv_trace_create(&r, 1, &t, &err), PKV_ERR_FORMAT);
    cr_expect_str_eq(err.field, "prefix_group");
    cr_expect_null(t);
    r.prefix_group = INT64_MIN;
    cr_expect_eq(pkv_trace_create(&r, 1, &t, &err), PKV_ERR_FORMAT);
    parse_bad("arrival_s,prompt_tokens,output_tokens,prefix_group\n0,10,5,-5\n", "g.csv", 2,
              "prefix_group", NULL);
}

// Defect 13: a UTF-8 BOM was an unknown header; longer rows were accepted.
Test(issue15, d13_bom_accepted_and_long_rows_refused) {
    pkv_trace *t = parse_ok("\xEF\xBB\xBF" "arrival_s,prompt_tokens,output_tokens\n0,10,5\n", "bom.csv");
    cr_expect_eq(pkv_trace_count(t), 1);
    pkv_trace_destroy(t);
    t = parse_ok("\xEF\xBB\xBF{\"timestamp\": 0, \"input_length\": 3, \"output_length\": 4}\n", "bom");
    cr_expect_eq(pkv_trace_get_format(t), PKV_TRACE_MOONCAKE);
    pkv_trace_destroy(t);
    parse_bad("arrival_s,prompt_tokens,output_tokens\n0,10,5,7\n", "long.csv", 2, "",
              "4 fields, the header has 3");
    parse_bad("arrival_s,prompt_tokens,output_tokens\n0,10,5\n1,10,5,\n", "long.csv", 3, "",
              "the header has 3");
    // Found while fixing 4: strtod took hex floats and words for arrivals.
    const char *words[] = {"0x1p3", "inf", "nan", "infinity", "1e400"};
    for (int k = 0; k < 5; k++) {
        char text[96];
        snprintf(text, sizeof text, "arrival_s,prompt_tokens,output_tokens\n%s,10,5\n", words[k]);
        parse_bad(text, "w.csv", 2, "arrival_s", "not a number");
    }
}

// ---- issue 20 ----

// Defect 10: a NUL inside a Mooncake number (after its digits, or in place of
// the next one) names the key whose value it is, as the CSV readers do.
Test(issue20, d10_nul_in_a_mooncake_number_names_the_field) {
    static const char in_len[] = "{\"timestamp\": 0, \"input_length\": 12\0003, \"output_length\": 4}\n";
    parse_bad_n(in_len, sizeof in_len - 1, "nul.jsonl", 1, "input_length", "NUL");
    static const char out_len[] = "{\"timestamp\": 0, \"input_length\": 12, \"output_length\": 4\0}\n";
    parse_bad_n(out_len, sizeof out_len - 1, "nul.jsonl", 1, "output_length", "NUL");
    static const char ts[] = "{\"timestamp\": 1\000, \"input_length\": 12, \"output_length\": 4}\n";
    parse_bad_n(ts, sizeof ts - 1, "nul.jsonl", 1, "timestamp", "NUL");
}

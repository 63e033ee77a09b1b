// SPDX-License-Identifier: MIT
// Run mode's hybrid-vmm layout (issue 23 item 6) over a real pkv_hybrid_vmm: the
// executor's layout driven step by step on tiny-swa and tiny-hybrid, every greedy
// token against a full recompute (pkv_model_forward_nocache), with the bytes of a
// window's pages that no query may read any more poisoned (NaN) after every step
// and the pages before the window really unmapped (a read of one faults); and
// pkv-replay's run mode on tiny-swa, tiny-mla and tiny-hybrid computing the same
// tokens as a layout already proven equal to recompute, on the VMM layout.
#include <criterion/criterion.h>
#include <math.h>
#include <string.h>

#include "pkv/hybrid_vmm.h"
#include "pkv/model.h"
#include "pkv/replay.h"
#include "replay_helpers.h"
#include "src/runtime/replay/run_hybrid_vmm.h"

enum { MAXLEN = 72, PROMPT = 40, PAGE = 8192 };

// Sample c's token at position p: the prompt is shared, the rest differ.
static int32_t tok(uint32_t c, uint32_t p) {
    const uint32_t k = p < PROMPT ? 0 : c + 1;
    return (int32_t)((p * 131u + k * 977u + 7u) % 512u);
}

// The greedy next token of sample c's first len tokens, recomputed.
static int32_t recompute(pkv_model *m, uint32_t c, uint32_t len) {
    int32_t t[MAXLEN], next = -1;
    for (uint32_t p = 0; p < len; p++) t[p] = tok(c, p);
    cr_assert_eq(pkv_model_forward_nocache(m, 1, &len, t, NULL, &next), PKV_OK);
    return next;
}

// Fill with NaN the bytes of every windowed group's mapped pages of `slot` before
// the first token the query at position len reads: a read of one would make the
// step's logits NaN and its token differ from the recompute.
static void poison_dead(pkv_hybrid_vmm *kv, const pkv_kv_group *g, uint32_t ng, uint32_t slot,
                        uint32_t len) {
    for (uint32_t i = 0; i < ng; i++) {
        if (g[i].kind != PKV_LAYER_SLIDING && g[i].kind != PKV_LAYER_CHUNKED) continue;
        const pkv_vmm_space *sp = pkv_hybrid_vmm_space(kv, i);
        pkv_vmm_info info;
        cr_assert_eq(pkv_vmm_get_info(sp, &info), PKV_OK);
        const uint64_t tb = pkv_hybrid_vmm_buffer_token_bytes(kv, i);
        const uint64_t lo = (len + 1 - pkv_kv_group_tokens_kept(&g[i], len + 1)) * tb;
        const uint64_t from = pkv_vmm_slot_first_page(sp, slot) * info.page_bytes;
        for (uint32_t b = 0; b < info.num_buffers && lo > from; b++) {
            void *base;
            cr_assert_eq(pkv_vmm_buffer_ptr(sp, b, &base), PKV_OK);
            memset((char *)base + (uint64_t)slot * info.buffer_bytes + from, 0xff, lo - from);
        }
    }
}

// One request: a PROMPT-token prefill, a fork into two samples, then both decode
// to MAXLEN tokens. Every step's tokens equal the recompute; after it the windowed
// groups hold no page wholly before their window.
static void drive(const char *preset) {
    pkv_model_config c;
    cr_assert_eq(pkv_model_preset(preset, &c), PKV_OK);
    pkv_model_params mp = pkv_model_params_default();
    mp.seed = 5;
    pkv_model *m = NULL;
    cr_assert_eq(pkv_model_create(&c, &mp, &m), PKV_OK);
    pkv_kv_group g[PKV_MAX_KV_GROUPS];
    uint32_t ng = 0;
    cr_assert_eq(pkv_model_kv_groups(&c, g, &ng), PKV_OK);
    const uint32_t two = 2;
    const pkvi_run_hvmm_params p = {m, 64u << 20, PAGE, 256, 1, &two};
    pkvi_run_hvmm *h = NULL;
    cr_assert_eq(pkvi_run_hvmm_create(&p, &h), PKV_OK);
    pkv_hybrid_vmm *kv = pkvi_run_hvmm_manager(h);
    char why[160] = "";
    uint64_t copied = 0;
    // The prefill of sample 0.
    pkvi_step_seq s[2] = {{-1, 0, 0, PROMPT, PROMPT}, {-1, 0, 1, 1, PROMPT + 1}};
    cr_assert_eq(pkvi_run_hvmm_sync(h, s, 1, &copied, why, sizeof why), PKV_OK, "%s", why);
    int32_t in[PROMPT], next[2];
    for (uint32_t i = 0; i < PROMPT; i++) in[i] = tok(0, i);
    pkv_seq_id slot[2] = {pkvi_run_hvmm_slot(h, 0, 0), -1};
    const uint32_t count = PROMPT;
    cr_assert_eq(pkvi_run_hvmm_forward(h, 1, slot, &count, in, next), PKV_OK);
    cr_assert_eq(next[0], recompute(m, 0, PROMPT));
    cr_assert_eq(pkvi_run_hvmm_fork(h, 0, 2), PKV_OK);
    for (uint32_t len = PROMPT + 1; len <= MAXLEN; len++) {
        for (uint32_t k = 0; k < 2; k++) s[k] = (pkvi_step_seq){-1, 0, k, 1, len};
        cr_assert_eq(pkvi_run_hvmm_sync(h, s, 2, &copied, why, sizeof why), PKV_OK, "%s", why);
        cr_assert_eq(pkv_hybrid_vmm_validate(kv), PKV_OK);
        for (uint32_t k = 0; k < 2; k++) {
            slot[k] = pkvi_run_hvmm_slot(h, 0, k);
            in[k] = tok(k, len - 1);
        }
        cr_assert_eq(pkvi_run_hvmm_forward(h, 2, slot, NULL, in, next), PKV_OK);
        for (uint32_t k = 0; k < 2; k++) {
            cr_assert_eq(next[k], recompute(m, k, len), "%s sample %u at %u tokens", preset, k, len);
            poison_dead(kv, g, ng, (uint32_t)slot[k], len);
        }
    }
    // The fork copied the prompt's kept tokens of every group, once.
    cr_assert_gt(copied, 0);
    // The pages of a windowed group's row are those of its window only: the front
    // of the row is unmapped (one page of 16 (tiny-swa) or 4 (tiny-hybrid) tokens
    // and buffer before MAXLEN - window).
    int windowed = 0;
    for (uint32_t i = 0; i < ng; i++) {
        const pkv_vmm_space *sp = pkv_hybrid_vmm_space(kv, i);
        pkv_vmm_info info;
        cr_assert_eq(pkv_vmm_get_info(sp, &info), PKV_OK);
        const uint64_t tb = pkv_hybrid_vmm_buffer_token_bytes(kv, i);
        for (uint32_t k = 0; k < 2; k++) {
            const uint64_t first = pkv_vmm_slot_first_page(sp, (uint32_t)slot[k]);
            const uint64_t pages = pkv_vmm_slot_pages(sp, (uint32_t)slot[k]);
            if (g[i].kind == PKV_LAYER_SLIDING || g[i].kind == PKV_LAYER_CHUNKED) {
                windowed = 1;
                const uint64_t lo = (MAXLEN - pkv_kv_group_tokens_kept(&g[i], MAXLEN)) * tb;
                cr_assert_eq(first, lo / info.page_bytes, "%s group %u", preset, i);
                cr_assert_gt(first, 0, "%s group %u kept its row's front", preset, i);
                cr_assert_leq(pages * info.page_bytes, g[i].window * tb + 2 * info.page_bytes);
            } else if (g[i].kind != PKV_LAYER_STATE) {
                cr_assert_eq(first, 0);
                cr_assert_eq(pages, (MAXLEN * tb + info.page_bytes - 1) / info.page_bytes);
            }
        }
        pkv_vmm_stats st;
        cr_assert_eq(pkv_vmm_get_stats(sp, &st), PKV_OK);
        if (g[i].kind == PKV_LAYER_SLIDING) cr_assert_gt(st.unmap_calls, 0);
    }
    cr_assert(windowed);
    pkvi_run_hvmm_release(h, 0);
    pkv_vmm_stats calls;
    double secs = 0;
    pkvi_run_hvmm_finish(h, &calls, &secs);
    cr_assert_eq(pkv_hybrid_vmm_validate(kv), PKV_OK);
    cr_assert_eq(calls.map_calls, calls.unmap_calls); // every page mapped went back
    cr_assert_gt(secs, 0);
    pkvi_run_hvmm_destroy(h);
    pkv_model_destroy(m);
}

Test(replay_run_hvmm, layout_tiny_swa_equals_recompute_and_unmaps_the_window, .timeout = 300) {
    drive("tiny-swa");
}
Test(replay_run_hvmm, layout_tiny_hybrid_equals_recompute_and_unmaps_the_window, .timeout = 300) {
    drive("tiny-hybrid");
}

// pkv-replay run mode: hybrid-vmm computes the tokens of `ref_policy` (paged, or
// for a model with a state layer, which paged's executor cannot run,
// hybrid-partition, tested against paged and recompute elsewhere) on a trace that
// decodes past the window and the chunk and forks samples, on the VMM layout,
// pages unmapped as they leave the windows.
static void replay_equals(const char *preset, pkv_policy ref_policy) {
    pkv_trace_request rq[6];
    for (uint32_t i = 0; i < 6; i++)
        rq[i] = (pkv_trace_request){0.001 * i, 3 + (i * 7) % 19, 30 + (i * 5) % 17, 1 + i % 2, -1, 0, 0};
    pkv_trace *t = make_trace(rq, 6);
    pkv_replay_params p = pkv_replay_params_default();
    cr_assert_eq(pkv_model_preset(preset, &p.model), PKV_OK);
    p.mode = PKV_REPLAY_RUN;
    p.kv_mem_bytes = 32u << 20;
    p.block_size = 4;
    p.vmm_page_bytes = 4096;
    p.watermark = 0;
    p.validate = 1;
    p.run_threads = 1;
    p.alloc_model = pkv_alloc_model_none();
    pkv_replay_report ref, r;
    p.policy = ref_policy;
    cr_assert_eq(pkv_replay_run(t, &p, &ref), PKV_OK, "%s", ref.failure);
    cr_assert_eq(ref.requests.completed, 6);
    p.policy = PKV_POLICY_HYBRID_VMM;
    cr_assert_eq(pkv_replay_run(t, &p, &r), PKV_OK, "%s: %s", preset, r.failure);
    cr_assert_str_eq(r.run.layout, "hybrid-vmm", "%s ran on %s", preset, r.run.layout);
    cr_assert_eq(r.requests.completed, 6);
    cr_assert_eq(r.run.tokens, ref.run.tokens, "%s", preset);
    cr_assert_eq(r.run.token_hash, ref.run.token_hash, "%s: hybrid-vmm computed other tokens than %s",
                 preset, ref.policy);
    // Three requests forked: their samples' rows are real copies.
    cr_assert_gt(r.run.copied_bytes, 0, "%s", preset);
    // The real spaces' page maps and unmaps are the run's allocation calls.
    cr_assert_gt(r.alloc.backend_alloc_calls, 0);
    cr_assert_eq(r.alloc.backend_alloc_calls, r.alloc.backend_free_calls);
    pkv_trace_destroy(t);
}

Test(replay_run_hvmm, replay_tiny_swa_equals_paged, .timeout = 300) {
    replay_equals("tiny-swa", PKV_POLICY_PAGED);
}
Test(replay_run_hvmm, replay_tiny_mla_equals_paged, .timeout = 300) {
    replay_equals("tiny-mla", PKV_POLICY_PAGED);
}
Test(replay_run_hvmm, replay_tiny_hybrid_equals_hybrid_partition, .timeout = 300) {
    replay_equals("tiny-hybrid", PKV_POLICY_HYBRID_PARTITION);
}

// A state group of several layers takes whole pages per layer in the policy as in
// the library (it once packed the layers' states into shared pages, so the policy
// admitted what pkv_hybrid_vmm could not hold). tiny-swa with its full group made
// a state group of 2 layers (2 x 64 x 64 fp32 = 32 KiB each), pages of 64 KiB:
// a sequence takes 4 pages of its full group and 2 of states (1 when packed), so a
// budget of 10 pages runs the two requests one at a time (two at once when packed,
// which the library refused: "policy and library disagree").
Test(replay_run_hvmm, a_state_group_takes_a_page_per_layer_in_policy_and_library, .timeout = 120) {
    pkv_replay_params p = pkv_replay_params_default();
    cr_assert_eq(pkv_model_preset("tiny-swa", &p.model), PKV_OK);
    pkv_kv_group *st = &p.model.kv_groups[1];
    memset(st, 0, sizeof *st);
    st->kind = PKV_LAYER_STATE;
    st->num_layers = 2;
    st->state_bytes = 2ull * 64 * 64 * sizeof(float);
    p.mode = PKV_REPLAY_RUN;
    p.policy = PKV_POLICY_HYBRID_VMM;
    p.vmm_page_bytes = 65536;
    p.kv_mem_bytes = 10 * 65536;
    p.watermark = 0;
    p.validate = 1;
    p.run_threads = 1;
    p.alloc_model = pkv_alloc_model_none();
    const pkv_trace_request rq[2] = {{0, 8, 4, 1, -1, 0, 0}, {0, 8, 4, 1, -1, 0, 1}};
    pkv_trace *t = make_trace(rq, 2);
    pkv_replay_report r;
    cr_assert_eq(pkv_replay_run(t, &p, &r), PKV_OK, "%s", r.failure);
    cr_assert_eq(r.requests.completed, 2, "%s", r.failure);
    cr_assert_eq(r.batch.max, 1, "6 pages each: one at a time in 10");
    cr_assert_str_eq(r.run.layout, "hybrid-vmm");
    pkv_trace_destroy(t);
}

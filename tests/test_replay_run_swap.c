// SPDX-License-Identifier: MIT
// Run mode's swap moves the K/V for real: for every policy run mode executes
// (each on its own layout: paged tables, the per-token table, the contiguous
// store, the VMM space, the hybrid store) and the tiny presets with window and
// MLA layers, a budget that forces swaps (preemptions and swapped bytes checked,
// so the test cannot pass without one) gives the same greedy tokens (run.token_hash)
// as --preempt recompute: a swapped-in request continues from exactly what it
// computed. Some requests fork (n = 2, 3), so samples are swapped too.
#include <criterion/criterion.h>
#include <stdio.h>
#include <string.h>

#include "pkv/model.h"
#include "pkv/replay.h"
#include "pkv/trace.h"
#include "replay_helpers.h"

enum { N = 8 };

// Every request arrives at 0 (no dependence on measured step times).
static pkv_trace *trace(void) {
    pkv_trace_request rq[N];
    uint64_t x = 7;
    for (int i = 0; i < N; i++) {
        x = x * 6364136223846793005ull + 1442695040888963407ull;
        const uint32_t n = i % 4 == 1 ? 2 : i % 7 == 3 ? 3 : 1;
        rq[i] = (pkv_trace_request){0, 12 + (uint32_t)(x >> 35) % 28, 10 + (uint32_t)(x >> 50) % 20, n, -1, 0,
                                    (uint64_t)i};
    }
    return make_trace(rq, N);
}

static pkv_replay_params params(pkv_policy policy, const char *model, uint64_t kv,
                                pkv_preempt_mode preempt) {
    pkv_replay_params p = pkv_replay_params_default();
    cr_assert_eq(pkv_model_preset(model, &p.model), PKV_OK, "%s", model);
    p.mode = PKV_REPLAY_RUN;
    p.policy = policy;
    p.preempt = preempt;
    p.dtype_bytes = 4; // the decoder keeps fp32 K/V
    p.kv_mem_bytes = kv;
    p.max_seq_len = 96;
    p.prefix_sharing = 0;
    p.run_threads = 1;
    p.validate = 1;
    p.watermark = 0;
    p.vmm_page_bytes = 4096;
    p.device_mem = PKV_DEVICE_MEM_ARENA;
    // A state group reserves a state per batch slot (64 KiB each in tiny-hybrid):
    // 8 slots leave the budget to the tokens, so that swaps happen.
    if (strcmp(model, "tiny-hybrid") == 0) p.max_batch = 8;
    return p;
}

static pkv_status replay(const pkv_trace *t, const pkv_replay_params *p, pkv_replay_report *rep) {
    memset(rep, 0, sizeof *rep);
    return pkv_replay_run(t, p, rep);
}

// The first budget (in tokens of the plain tiny model) under which swap preempts
// and moves bytes, and both swap and recompute complete every request: the
// token hashes must be equal.
static void same_tokens(pkv_policy policy, const char *model) {
    pkv_trace *t = trace();
    pkv_model_config c;
    cr_assert_eq(pkv_model_preset("tiny", &c), PKV_OK);
    const uint64_t bpt = 2ull * c.num_layers * c.num_kv_heads * c.head_dim * 4;
    static const uint32_t tokens[] = {24, 32, 48, 64, 96, 128, 160, 192, 256, 384, 512, 768, 1024};
    int found = 0;
    for (size_t i = 0; i < sizeof tokens / sizeof *tokens && !found; i++) {
        const uint64_t kv = tokens[i] * bpt;
        pkv_replay_params p = params(policy, model, kv, PKV_PREEMPT_SWAP);
        pkv_replay_report sw;
        pkv_status st = replay(t, &p, &sw);
        if (st == PKV_ERR_OUT_OF_BLOCKS) continue; // the layout needs more (hybrid-vmm's pages)
        cr_assert_eq(st, PKV_OK, "%s on %s, %llu B, swap: %s (%s)", pkv_policy_name(policy), model,
                     (unsigned long long)kv, pkv_status_str(st), sw.failure);
        if (sw.requests.completed != N || sw.preemptions == 0 || sw.swap_out_bytes == 0 ||
            sw.swap_in_bytes == 0)
            continue;
        pkv_replay_report rc;
        p.preempt = PKV_PREEMPT_RECOMPUTE;
        st = replay(t, &p, &rc);
        cr_assert_eq(st, PKV_OK, "%s on %s, recompute: %s", pkv_policy_name(policy), model,
                     pkv_status_str(st));
        if (rc.requests.completed != N) continue; // recompute rejected one: other positions
        found = 1;
        if (policy == PKV_POLICY_HYBRID_VMM) // the real spaces, not a per-token table
            cr_assert_str_eq(sw.run.layout, "hybrid-vmm");
        cr_assert_eq(sw.run.tokens, rc.run.tokens, "%s on %s: positions computed", pkv_policy_name(policy),
                     model);
        cr_assert_eq(sw.run.token_hash, rc.run.token_hash,
                     "%s on %s (%s layout), %llu B: swap hash %016llx != recompute %016llx "
                     "(%llu preemptions, %llu B swapped out)",
                     pkv_policy_name(policy), model, sw.run.layout, (unsigned long long)kv,
                     (unsigned long long)sw.run.token_hash, (unsigned long long)rc.run.token_hash,
                     (unsigned long long)sw.preemptions, (unsigned long long)sw.swap_out_bytes);
    }
    cr_assert(found, "%s on %s: no budget forced a swap with every request done", pkv_policy_name(policy),
              model);
    pkv_trace_destroy(t);
}

// Plain model: every policy that can be preempted but the hybrid ones (tested
// below on hybrid presets). contiguous-max, -pow2, -oracle and malloc-per-request
// reserve a request's whole extent at admission: they never grow short, so they
// are never preempted (nothing to swap).
Test(replay_run_swap, paged) { same_tokens(PKV_POLICY_PAGED, "tiny"); }
Test(replay_run_swap, malloc_per_token) { same_tokens(PKV_POLICY_MALLOC_PER_TOKEN, "tiny"); }
Test(replay_run_swap, realloc_copy) { same_tokens(PKV_POLICY_REALLOC_COPY, "tiny"); }
Test(replay_run_swap, contiguous_pow2_grow) { same_tokens(PKV_POLICY_CONTIG_POW2_GROW, "tiny"); }
Test(replay_run_swap, vmm) { same_tokens(PKV_POLICY_VMM, "tiny"); }
Test(replay_run_swap, vmm_sync) { same_tokens(PKV_POLICY_VMM_SYNC, "tiny"); }

// Window and MLA layers: the hybrid store (and hybrid-vmm's real spaces),
// and the paged and per-token layouts over the same models.
static const char *const HYBRID_MODELS[] = {"tiny-swa", "tiny-mla"};
static void on_hybrid_models(pkv_policy policy) {
    for (size_t i = 0; i < sizeof HYBRID_MODELS / sizeof *HYBRID_MODELS; i++)
        same_tokens(policy, HYBRID_MODELS[i]);
}
Test(replay_run_swap, hybrid_partition, .timeout = 300) { on_hybrid_models(PKV_POLICY_HYBRID_PARTITION); }
Test(replay_run_swap, hybrid_shared_page, .timeout = 300) { on_hybrid_models(PKV_POLICY_HYBRID_SHARED_PAGE); }
Test(replay_run_swap, hybrid_lcm, .timeout = 300) { on_hybrid_models(PKV_POLICY_HYBRID_LCM); }
Test(replay_run_swap, hybrid_vmm, .timeout = 300) { on_hybrid_models(PKV_POLICY_HYBRID_VMM); }

// State layers (tiny-hybrid): the hybrid store's states move out and back in with
// the blocks, and hybrid-vmm's state rows with its pages.
Test(replay_run_swap, state_layers, .timeout = 300) {
    static const pkv_policy with_states[] = {PKV_POLICY_HYBRID_PARTITION, PKV_POLICY_HYBRID_SHARED_PAGE,
                                             PKV_POLICY_HYBRID_LCM, PKV_POLICY_HYBRID_VMM};
    for (size_t i = 0; i < sizeof with_states / sizeof *with_states; i++)
        same_tokens(with_states[i], "tiny-hybrid");
}
Test(replay_run_swap, paged_hybrid_models, .timeout = 300) { on_hybrid_models(PKV_POLICY_PAGED); }
Test(replay_run_swap, malloc_per_token_hybrid_models, .timeout = 300) {
    on_hybrid_models(PKV_POLICY_MALLOC_PER_TOKEN);
}

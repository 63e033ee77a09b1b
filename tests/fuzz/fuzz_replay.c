// SPDX-License-Identifier: MIT
// libFuzzer harness for pkv_replay_run in sim mode: the first 12 bytes choose
// the policy and every scheduler option (fuzz_replay.h), the rest a trace of up
// to 12 requests. Every run has validate on (the engine checks every policy
// invariant after every step). Oracles: the call returns PKV_OK (the options
// are valid by construction; memory pressure never fails a run), the report's
// invariants hold (fuzz_check_report), and a second run gives the same report
// byte for byte (the replay is deterministic; host wall time excepted).
#include "fuzz_replay.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (size < FUZZ_REPLAY_OPTION_BYTES) return 0;
    const pkv_replay_params p = fuzz_replay_params(data);
    pkv_trace *t = fuzz_replay_trace(data + FUZZ_REPLAY_OPTION_BYTES, size - FUZZ_REPLAY_OPTION_BYTES);
    if (!t) return 0;
    static pkv_replay_report a, b;
    pkv_status st = pkv_replay_run(t, &p, &a);
    CHECK(st == PKV_OK, "policy %s: status %d (%s), failure '%s'", pkv_policy_name(p.policy), (int)st,
          pkv_status_str(st), a.failure);
    fuzz_check_report(&a, t);
    CHECK(pkv_replay_run(t, &p, &b) == PKV_OK, "second run");
    a.replay_seconds = b.replay_seconds = 0;
    CHECK(memcmp(&a, &b, sizeof a) == 0, "policy %s: two runs differ", pkv_policy_name(p.policy));
    pkv_trace_destroy(t);
    return 0;
}

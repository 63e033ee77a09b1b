// SPDX-License-Identifier: MIT
// The engine checks a policy's answers every step, in every mode (issue 20,
// defects 1 and 2): tests/plugins/liar.so, the paged policy with one answer
// falsified (PKV_LIAR picks which), must stop pkv_replay_run with
// PKV_ERR_CORRUPT and a report->failure that names the plugin, the slot and the
// value, with and without validate. PKV_LIAR_SO is the module's path.
#include <criterion/criterion.h>
#include <dlfcn.h>
#include <stdlib.h>
#include <string.h>

#include "pkv/policy.h"
#include "pkv/replay.h"
#include "replay_helpers.h"

static const pkv_policy_vtable *liar(void) {
    const char *path = getenv("PKV_LIAR_SO");
    cr_assert(path, "PKV_LIAR_SO is not set");
    void *h = dlopen(path, RTLD_NOW | RTLD_LOCAL);
    cr_assert(h, "dlopen %s: %s", path, dlerror());
    void *sym = dlsym(h, PKV_POLICY_PLUGIN_ENTRY);
    cr_assert(sym);
    pkv_policy_plugin_entry_fn entry;
    memcpy(&entry, &sym, sizeof entry);
    return entry(PKV_POLICY_ABI_VERSION);
}

// Run the liar telling `lie` (NULL: none) on a small trace with forks, in
// sim mode, `validate` on or off; the status, and the failure in *rep.
static pkv_status run_liar(const char *lie, int validate, pkv_replay_report *rep) {
    if (lie)
        setenv("PKV_LIAR", lie, 1);
    else
        unsetenv("PKV_LIAR");
    const pkv_trace_request rq[] = {{0, 12, 5, 2, -1, 0, 0}, {0.01, 7, 3, 1, -1, 0, 1},
                                    {0.02, 20, 4, 3, -1, 0, 2}};
    pkv_trace *t = make_trace(rq, 3);
    pkv_replay_params p = pkv_replay_params_default();
    p.kv_mem_bytes = 64ull << 20;
    p.validate = validate;
    p.custom_policy = liar();
    pkv_status st = pkv_replay_run(t, &p, rep);
    pkv_trace_destroy(t);
    return st;
}

static void expect_caught(const char *lie, const char *slot, const char *value) {
    for (int validate = 0; validate <= 1; validate++) {
        pkv_replay_report rep;
        pkv_status st = run_liar(lie, validate, &rep);
        cr_assert_eq(st, PKV_ERR_CORRUPT, "lie %s (validate %d): %s, failure '%s'", lie, validate,
                     pkv_status_str(st), rep.failure);
        cr_assert(strstr(rep.failure, "policy 'liar'"), "lie %s: '%s'", lie, rep.failure);
        cr_assert(strstr(rep.failure, slot), "lie %s: no %s in '%s'", lie, slot, rep.failure);
        cr_assert(strstr(rep.failure, value), "lie %s: no %s in '%s'", lie, value, rep.failure);
    }
}

Test(policy_contract, an_honest_plugin_runs_to_the_end) {
    for (int validate = 0; validate <= 1; validate++) {
        pkv_replay_report rep;
        cr_assert_eq(run_liar(NULL, validate, &rep), PKV_OK, "%s", rep.failure);
        cr_assert_eq(rep.requests.completed, 3);
        cr_assert_str_eq(rep.failure, "");
    }
}

Test(policy_contract, cached_beyond_the_prompt_is_caught) {
    expect_caught("cached", "slot 'admit'", "cached 4294967295 > prompt");
}

Test(policy_contract, granularity_beyond_the_capacity_is_caught) {
    expect_caught("granularity", "slot 'create'", "granularity 4294967295");
}

Test(policy_contract, capacity_beyond_the_budget_is_caught) {
    expect_caught("capacity", "slot 'create'", "capacity_slots");
}

Test(policy_contract, used_beyond_reserved_is_caught) {
    expect_caught("used", "slot 'stats'", "used");
}

Test(policy_contract, reserved_beyond_the_capacity_is_caught) {
    expect_caught("reserved", "slot 'stats'", "> capacity");
}

Test(policy_contract, a_status_the_abi_does_not_define_is_named) {
    expect_caught("status", "slot 'grow'", "12345");
}

Test(policy_contract, a_status_the_slot_may_not_return_is_named) {
    expect_caught("invalid", "slot 'fork'", "invalid argument");
}

// An error of the call itself (bad params) leaves no stale failure behind.
Test(policy_contract, other_errors_leave_the_failure_empty) {
    pkv_replay_report rep;
    memset(&rep, 'x', sizeof rep);
    pkv_replay_params p = pkv_replay_params_default();
    p.max_batch = 0;
    const pkv_trace_request rq[] = {{0, 12, 5, 1, -1, 0, 0}};
    pkv_trace *t = make_trace(rq, 1);
    cr_assert_eq(pkv_replay_run(t, &p, &rep), PKV_ERR_INVALID_ARG);
    cr_assert_str_eq(rep.failure, "");
    pkv_trace_destroy(t);
}

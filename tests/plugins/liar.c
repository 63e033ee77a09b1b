// SPDX-License-Identifier: MIT
// A policy plugin that breaks the contract of pkv/policy.h on purpose (issue
// 20): the built-in paged policy, with one answer falsified as PKV_LIAR says:
//   cached       admit reports 0xffffffff prompt tokens cached
//   granularity  create reports granularity UINT32_MAX
//   capacity     create reports twice the budget's slots
//   used         stats: used = reserved + 1
//   reserved     stats: reserved (and used) 5x the capacity (306 GiB of 60 GiB)
//   status       grow returns 12345, a status the ABI does not define
//   invalid      fork returns PKV_ERR_INVALID_ARG
//   (unset)      nothing: it behaves as paged
// The engine must stop the run, naming "liar", the slot and the value.
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "pkv/policy.h"
#include "pkv/replay.h"

static const pkv_policy_vtable *paged;
static pkv_policy_vtable table;

static int lie(const char *what) {
    const char *v = getenv("PKV_LIAR");
    return v && !strcmp(v, what);
}

static pkv_status liar_create(const pkv_policy_config *cfg, pkv_policy_info *info, void **state) {
    pkv_status st = paged->create(cfg, info, state);
    if (st == PKV_OK && lie("granularity")) info->granularity = UINT32_MAX;
    if (st == PKV_OK && lie("capacity")) info->capacity_slots *= 2;
    return st;
}

static pkv_status liar_admit(void *state, uint32_t r, const pkv_policy_admit *a, uint64_t wm,
                             uint64_t *ext_frag, uint32_t *cached) {
    pkv_status st = paged->admit(state, r, a, wm, ext_frag, cached);
    if (st == PKV_OK && lie("cached")) *cached = 0xffffffffu;
    return st;
}

static pkv_status liar_grow(void *state, uint32_t r, uint32_t child) {
    pkv_status st = paged->grow(state, r, child);
    return st == PKV_OK && lie("status") ? (pkv_status)12345 : st;
}

static pkv_status liar_fork(void *state, uint32_t r, uint32_t n) {
    pkv_status st = paged->fork(state, r, n);
    return st == PKV_OK && lie("invalid") ? PKV_ERR_INVALID_ARG : st;
}

static void liar_stats(const void *state, pkv_policy_stats *s) {
    paged->stats(state, s);
    if (lie("used")) s->used = s->reserved + 1;
    if (lie("reserved")) {
        s->reserved = (s->reserved + 1) * 100000;
        s->used = s->reserved;
    }
}

const pkv_policy_vtable *pkv_policy_plugin_entry(uint32_t host_abi) {
    if (host_abi != PKV_POLICY_ABI_VERSION) return NULL;
    paged = pkv_policy_builtin(PKV_POLICY_PAGED);
    table = *paged;
    table.name = "liar";
    table.create = liar_create;
    table.admit = liar_admit;
    table.grow = liar_grow;
    table.fork = liar_fork;
    table.stats = liar_stats;
    return &table;
}

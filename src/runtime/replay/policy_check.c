// SPDX-License-Identifier: MIT
// The engine's checks of a policy's answers (issue 20, defects 1 and 2). A
// plugin is code the engine did not write: every slot that returns a status or
// a number the engine builds on goes through here, every step, in every mode.
// What pkv/policy.h promises is checked where it is cheap (O(1) per call):
//   create   status OK, OUT_OF_BLOCKS or INVALID_ARG; 1 <= capacity_slots <= the
//            budget's slots; 1 <= granularity <= capacity_slots
//   admit    status OK or OUT_OF_BLOCKS; cached <= prompt
//   swap_in  status OK or OUT_OF_BLOCKS
//   grow     status OK or OUT_OF_BLOCKS
//   fork     status OK (the admission accounted for the fork: OUT_OF_BLOCKS here
//            is the policy's broken promise, the engine cannot preempt mid-fork)
//   stats    used <= reserved <= capacity; free <= capacity; the "so far" counters
//            (copy_slots, cow_copies, cached_tokens) never go down; the running
//            requests' reservation()s sum to at most reserved - used
//   validate (--validate only) OK
// A broken rule stops the run: PKV_ERR_CORRUPT (a status the ABI defines but
// the slot may not return keeps its own code only for OUT_OF_MEMORY, a host
// failure), with p->why naming the policy (its table's name), the slot and the
// value, e.g. "policy 'liar': slot 'admit': cached 4294967295 > prompt 12
// (request 3)". pkv_replay_run copies it into report->failure.
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>

#include "replay_internal.h"

static pkv_status broken(pkvi_policy *p, const char *slot, const char *fmt, ...) {
    int n = snprintf(p->why, sizeof p->why, "policy '%s': slot '%s': ", p->vt->name, slot);
    if (n < 0 || (size_t)n >= sizeof p->why) return PKV_ERR_CORRUPT;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(p->why + n, sizeof p->why - (size_t)n, fmt, ap);
    va_end(ap);
    return PKV_ERR_CORRUPT;
}

// A status `slot` may return: OK, OUT_OF_BLOCKS when `may_refuse`, and
// INVALID_ARG when `may_reject`. Anything else is the policy's failure
// (r: the request it was called for, -1 for none).
static pkv_status status_ok(pkvi_policy *p, const char *slot, pkv_status st, int may_refuse,
                            int may_reject, int64_t r) {
    if (st == PKV_OK || (may_refuse && st == PKV_ERR_OUT_OF_BLOCKS) ||
        (may_reject && st == PKV_ERR_INVALID_ARG))
        return st;
    const char *name = pkv_status_str(st);
    const int defined = st >= PKV_ERR_LIMIT && st < PKV_OK;
    char req[32] = "";
    if (r >= 0) snprintf(req, sizeof req, " (request %lld)", (long long)r);
    (void)broken(p, slot, "returned status %d (%s)%s%s", (int)st, name,
                 defined ? ", which this slot may not return" : ", which the ABI does not define", req);
    return st == PKV_ERR_OUT_OF_MEMORY ? st : PKV_ERR_CORRUPT;
}

pkv_status pkvi_policy_check_create(pkvi_policy *p, pkv_status st, uint64_t budget_slots) {
    st = status_ok(p, "create", st, 1, 1, -1);
    if (st != PKV_OK) {
        // A refusal of the config is not a broken contract, but still named.
        if (st == PKV_ERR_INVALID_ARG)
            (void)broken(p, "create", "refused the configuration (invalid argument)");
        return st;
    }
    const pkv_policy_info *in = &p->info;
    if (in->capacity_slots == 0 || in->capacity_slots > budget_slots)
        return broken(p, "create", "capacity_slots %llu outside 1..%llu (the budget's slots)",
                      (unsigned long long)in->capacity_slots, (unsigned long long)budget_slots);
    if (in->granularity == 0 || in->granularity > in->capacity_slots)
        return broken(p, "create", "granularity %u outside 1..%llu (its capacity_slots)",
                      in->granularity, (unsigned long long)in->capacity_slots);
    return PKV_OK;
}

pkv_status pkvi_policy_admit(pkvi_policy *p, uint32_t r, const pkv_policy_admit *a,
                             uint64_t watermark, uint64_t *ext_frag, uint32_t *cached) {
    *ext_frag = 0;
    *cached = 0;
    pkv_status st = p->vt->admit(p->state, r, a, watermark, ext_frag, cached);
    if ((st = status_ok(p, "admit", st, 1, 0, r)) != PKV_OK) return st;
    if (*cached > a->prompt)
        return broken(p, "admit", "cached %u > prompt %u (request %u)", *cached, a->prompt, r);
    return PKV_OK;
}

pkv_status pkvi_policy_swap_in(pkvi_policy *p, uint32_t r, const pkv_policy_admit *a,
                               uint64_t watermark, uint64_t *ext_frag) {
    *ext_frag = 0;
    return status_ok(p, "swap_in", p->vt->swap_in(p->state, r, a, watermark, ext_frag), 1, 0, r);
}

pkv_status pkvi_policy_fork(pkvi_policy *p, uint32_t r, uint32_t n) {
    return status_ok(p, "fork", p->vt->fork(p->state, r, n), 0, 0, r);
}

pkv_status pkvi_policy_grow(pkvi_policy *p, uint32_t r, uint32_t child) {
    return status_ok(p, "grow", p->vt->grow(p->state, r, child), 1, 0, r);
}

pkv_status pkvi_policy_stats(pkvi_policy *p, pkv_policy_stats *s) {
    *s = (pkv_policy_stats){0};
    p->vt->stats(p->state, s);
    const unsigned long long cap = p->info.capacity_slots;
    if (s->used > s->reserved)
        return broken(p, "stats", "used %llu > reserved %llu", (unsigned long long)s->used,
                      (unsigned long long)s->reserved);
    if (s->reserved > cap)
        return broken(p, "stats", "reserved %llu > capacity %llu", (unsigned long long)s->reserved, cap);
    if (s->free > cap)
        return broken(p, "stats", "free %llu > capacity %llu", (unsigned long long)s->free, cap);
    const pkv_policy_stats *o = &p->last;
    const char *down = s->copy_slots < o->copy_slots   ? "copy_slots"
                       : s->cow_copies < o->cow_copies ? "cow_copies"
                       : s->cached_tokens < o->cached_tokens ? "cached_tokens"
                                                             : NULL;
    if (down) return broken(p, "stats", "%s went down (a count so far)", down);
    // ABI 3 groups: none (group-unaware) or exactly the config's, counts that only grow.
    if (s->num_groups != 0 && s->num_groups != p->cfg.num_groups)
        return broken(p, "stats", "num_groups %u, the model has %u", s->num_groups, p->cfg.num_groups);
    for (uint32_t g = 0; g < s->num_groups; g++) {
        const struct pkv_policy_group_stats *a = &s->groups[g], *b = &o->groups[g];
        if (a->bytes_held > p->cfg.capacity_bytes)
            return broken(p, "stats", "group %u holds %llu bytes > capacity %llu", g,
                          (unsigned long long)a->bytes_held,
                          (unsigned long long)p->cfg.capacity_bytes);
        if (o->num_groups && (a->blocks_released < b->blocks_released ||
                              a->cached_tokens < b->cached_tokens))
            return broken(p, "stats", "group %u: %s went down (a count so far)", g,
                          a->blocks_released < b->blocks_released ? "blocks_released"
                                                                  : "cached_tokens");
    }
    p->last = *s;
    return PKV_OK;
}

// Every step: reservation() feeds the internal-fragmentation figure
// (reserved - used - reservation), which a lie would wrap.
pkv_status pkvi_policy_check_reservation(pkvi_policy *p, const pkv_policy_stats *s,
                                        uint64_t reservation) {
    if (reservation > s->reserved - s->used) // (stats checked used <= reserved)
        return broken(p, "reservation", "running requests' reservations sum to %llu > reserved %llu - used %llu",
                      (unsigned long long)reservation, (unsigned long long)s->reserved,
                      (unsigned long long)s->used);
    return PKV_OK;
}

pkv_status pkvi_policy_validate(pkvi_policy *p) {
    if (!p->vt->validate) return PKV_OK;
    const pkv_status st = p->vt->validate(p->state);
    if (st == PKV_OK) return st;
    (void)broken(p, "validate", "returned status %d (%s)", (int)st, pkv_status_str(st));
    return PKV_ERR_CORRUPT;
}

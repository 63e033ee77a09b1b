// SPDX-License-Identifier: MIT
// libFuzzer harness for the engine's side of the policy interface (issue 20):
// a plugin table around the built-in paged policy whose slots, as the input
// says, return random statuses (defined or not), random stats, a random cached
// count, granularity, capacity, need or reservation. The first 12 bytes choose
// the options and the next 16 a trace (fuzz_replay.h); every later byte is
// drawn by a slot call: below 192 the slot answers honestly, else it lies (the
// next bytes say how). Lies never desynchronise the wrapped policy: a slot
// either calls it and then falsifies the answer, or refuses without calling it.
// Oracles: no crash, leak or hang; a run that returns PKV_OK has a sane report
// (fuzz_check_report: the checked invariants keep the figures in range); a run
// that fails names the plugin and the slot ("policy 'fuzz-liar': slot '...'").
#include "fuzz_replay.h"
#include "pkv/policy.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static const uint8_t *script;
static size_t script_left;
static const pkv_policy_vtable *inner;

static uint8_t draw(void) {
    if (!script_left) return 0;
    script_left--;
    return *script++;
}

static uint64_t draw64(void) {
    uint64_t x = 0;
    for (int i = 0; i < 8; i++) x = x << 8 | draw();
    return x;
}

// 1 when this call lies.
static int lies(void) { return draw() >= 192; }

// A status: mostly the defined ones, sometimes any int.
static pkv_status any_status(void) {
    const uint8_t b = draw();
    return b < 200 ? (pkv_status)(-(int)(b % 15)) : (pkv_status)(int32_t)draw64();
}

static pkv_status l_create(const pkv_policy_config *cfg, pkv_policy_info *info, void **state) {
    if (lies() && draw() & 1) return any_status();
    pkv_status st = inner->create(cfg, info, state);
    if (st == PKV_OK && lies()) {
        const uint8_t how = draw();
        if (how & 1) info->granularity = (uint32_t)draw64();
        if (how & 2) info->capacity_slots = draw64();
        if (how & 4) info->uses_arena = (int)draw();
    }
    return st;
}

static uint64_t l_need(const pkv_policy_config *cfg, const pkv_policy_admit *a) {
    const uint64_t v = inner->need(cfg, a);
    return lies() ? draw64() >> (draw() % 64) : v;
}

static int l_fits_alone(const void *state, const pkv_policy_admit *a, uint64_t wm) {
    const int v = inner->fits_alone(state, a, wm);
    return lies() ? (int)draw() - 128 : v;
}

static pkv_status l_admit(void *state, uint32_t r, const pkv_policy_admit *a, uint64_t wm,
                          uint64_t *ext_frag, uint32_t *cached) {
    if (lies()) {
        const uint8_t how = draw();
        if (how % 3 == 0) return any_status(); // refused without admitting
        if (how % 3 == 1) {
            *ext_frag = draw64();
            return PKV_ERR_OUT_OF_BLOCKS;
        }
        pkv_status st = inner->admit(state, r, a, wm, ext_frag, cached);
        if (st == PKV_OK) *cached = (uint32_t)draw64() >> (draw() % 32);
        return st;
    }
    return inner->admit(state, r, a, wm, ext_frag, cached);
}

static pkv_status l_fork(void *state, uint32_t r, uint32_t n) {
    pkv_status st = inner->fork(state, r, n);
    return lies() ? any_status() : st;
}

static pkv_status l_grow(void *state, uint32_t r, uint32_t child) {
    if (lies()) return (draw() & 1) ? PKV_ERR_OUT_OF_BLOCKS : any_status();
    return inner->grow(state, r, child);
}

static void l_stats(const void *state, pkv_policy_stats *s) {
    inner->stats(state, s);
    if (!lies()) return;
    const uint8_t how = draw();
    uint64_t *f[] = {&s->used, &s->reserved, &s->free, &s->copy_slots, &s->cow_copies,
                     &s->cached_tokens};
    for (int i = 0; i < 6; i++)
        if (how >> i & 1) *f[i] = draw64() >> (draw() % 64);
}

static uint64_t l_reservation(const void *state, uint32_t r, uint32_t nseq, uint32_t len,
                              uint32_t final_len) {
    const uint64_t v = inner->reservation(state, r, nseq, len, final_len);
    return lies() ? draw64() >> (draw() % 64) : v;
}

static uint64_t l_request_slots(const void *state, uint32_t r, uint32_t nseq, uint32_t len,
                                uint32_t prompt) {
    const uint64_t v = inner->request_slots ? inner->request_slots(state, r, nseq, len, prompt)
                                            : (uint64_t)nseq * len;
    return lies() ? draw64() >> (draw() % 64) : v;
}

static pkv_status l_validate(const void *state) {
    const pkv_status st = inner->validate ? inner->validate(state) : PKV_OK;
    return lies() ? any_status() : st;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    enum { TRACE_BYTES = 16 };
    if (size < FUZZ_REPLAY_OPTION_BYTES + TRACE_BYTES) return 0;
    pkv_replay_params p = fuzz_replay_params(data);
    p.validate = data[0] >> 7; // the checks hold in both modes
    pkv_trace *t = fuzz_replay_trace(data + FUZZ_REPLAY_OPTION_BYTES, TRACE_BYTES);
    if (!t) return 0;
    inner = pkv_policy_builtin(PKV_POLICY_PAGED);
    pkv_policy_vtable vt = *inner;
    vt.name = "fuzz-liar";
    vt.create = l_create;
    vt.need = l_need;
    vt.fits_alone = l_fits_alone;
    vt.admit = l_admit;
    vt.fork = l_fork;
    vt.grow = l_grow;
    vt.stats = l_stats;
    vt.reservation = l_reservation;
    vt.request_slots = l_request_slots;
    vt.validate = l_validate;
    p.custom_policy = &vt;
    script = data + FUZZ_REPLAY_OPTION_BYTES + TRACE_BYTES;
    script_left = size - FUZZ_REPLAY_OPTION_BYTES - TRACE_BYTES;
    static pkv_replay_report r;
    const pkv_status st = pkv_replay_run(t, &p, &r);
    if (st == PKV_OK) {
        fuzz_check_report(&r, t);
    } else {
        CHECK(!strncmp(r.failure, "policy 'fuzz-liar': slot '", 26),
              "status %d (%s) without the plugin named: failure '%s'", (int)st, pkv_status_str(st),
              r.failure);
    }
    pkv_trace_destroy(t);
    return 0;
}

// SPDX-License-Identifier: MIT
// A policy plugin as one built against policy ABI 2 (before KV cache groups):
// its entry point serves only host ABI 2 and its table says 2. pkv-replay must
// refuse it with a reason naming both versions (tests/policy_abi_cli.py). The
// table is never driven: only its version and name are read.
#include "pkv/policy.h"

static const pkv_policy_vtable old_vtable = {
    .abi_version = 2,
    .name = "abi2",
};

const pkv_policy_vtable *pkv_policy_plugin_entry(uint32_t host_abi);
const pkv_policy_vtable *pkv_policy_plugin_entry(uint32_t host_abi) {
    return host_abi == 2 ? &old_vtable : NULL;
}

// SPDX-License-Identifier: MIT
// What the vmm policies share (policy_vmm.c, policy_hybrid_vmm.c): the replay's
// VMM parameters and the pricing of page map / unmap calls through the host.
#ifndef PKV_POLICIES_VMM_COMMON_H
#define PKV_POLICIES_VMM_COMMON_H

#include <stdint.h>

#include "pkv/policy.h"

// The page (params.vmm_page_bytes) and vAttention's latency hiding (map-ahead,
// deferred reclamation); `sync`: the ablation, both off whatever params say.
// -1 without params or a page.
int pkvi_vmm_params(const pkv_policy_config *cfg, int sync, uint64_t *page, int *map_ahead,
                    int *defer);

// Price `calls` map (is_unmap 0) or unmap calls of one page each (cuMemMap +
// cuMemSetAccess, resp. cuMemUnmap) as backend alloc / free calls of page bytes;
// `overlap`: issued by map-ahead's background thread.
void pkvi_vmm_charge(const pkv_policy_host *host, int is_unmap, uint64_t page, uint64_t calls,
                     int overlap);

#endif

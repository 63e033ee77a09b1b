// SPDX-License-Identifier: MIT
// Build without CUDA: the CUDA VMM space is not available; the API stays the same.
#include "vmm_impl.h"

pkv_status pkv_vmm_space_create_cuda(int device, const pkv_vmm_params *params,
                                     pkv_vmm_space **out) {
    (void)device;
    if (out) *out = NULL;
    return out && params ? PKV_ERR_UNSUPPORTED : PKV_ERR_INVALID_ARG;
}

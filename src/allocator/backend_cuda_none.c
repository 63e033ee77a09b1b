// SPDX-License-Identifier: MIT
// Built without CUDA: the CUDA backend exists in the API but cannot be created.
#include "pkv/backend.h"

pkv_status pkv_backend_create_cuda(int device, pkv_backend **out) {
    (void)device;
    if (!out) return PKV_ERR_INVALID_ARG;
    *out = NULL;
    return PKV_ERR_UNSUPPORTED;
}

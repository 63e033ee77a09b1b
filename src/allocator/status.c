// SPDX-License-Identifier: MIT
// Names of status codes, and the linked library's version.
#include "pkv/status.h"
#include "pkv/version.h"

const char *pkv_status_str(pkv_status status) {
    switch (status) {
    case PKV_OK: return "ok";
    case PKV_ERR_INVALID_ARG: return "invalid argument";
    case PKV_ERR_OUT_OF_BLOCKS: return "out of blocks";
    case PKV_ERR_OUT_OF_MEMORY: return "out of memory";
    case PKV_ERR_NOT_FOUND: return "not found (id not live or out of range)";
    case PKV_ERR_UNSUPPORTED: return "not supported by this build or object";
    case PKV_ERR_NO_DEVICE: return "no usable CUDA device";
    case PKV_ERR_BACKEND: return "memory backend failed";
    case PKV_ERR_CORRUPT: return "invariant violated (corrupt state)";
    case PKV_ERR_BUFFER_TOO_SMALL: return "output buffer too small";
    case PKV_ERR_IO: return "I/O error";
    case PKV_ERR_FORMAT: return "bad format";
    case PKV_ERR_BUSY: return "object in use (bound to another object)";
    case PKV_ERR_LIMIT: return "limit reached (refcount or id space)";
    case PKV_ERR_RELEASED: return "tokens already released by the window rule";
    }
    return "unknown status";
}

int pkv_version(void) { return PKV_VERSION; }

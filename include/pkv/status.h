// SPDX-License-Identifier: MIT
// Status codes shared by every pagedkv call. Every fallible function returns a
// pkv_status: 0 means success, a negative value names what went wrong. The
// library never prints and never exits; callers turn codes into text with
// pkv_status_str().
#ifndef PKV_STATUS_H
#define PKV_STATUS_H

#ifdef __cplusplus
extern "C" {
#endif

typedef enum pkv_status {
    PKV_OK = 0,
    PKV_ERR_INVALID_ARG = -1,      // a NULL pointer, a zero or out-of-range size, a bad enum
    PKV_ERR_OUT_OF_BLOCKS = -2,    // the pool has too few free blocks; nothing was changed
    PKV_ERR_OUT_OF_MEMORY = -3,    // a host allocation for metadata failed; nothing was changed
    PKV_ERR_NOT_FOUND = -4,        // a block or sequence id that is not live
    PKV_ERR_UNSUPPORTED = -5,      // a feature this build or this object does not have
    PKV_ERR_NO_DEVICE = -6,        // a CUDA backend was asked for but no device is usable
    PKV_ERR_BACKEND = -7,          // the memory backend (e.g. the CUDA runtime) failed
    PKV_ERR_CORRUPT = -8,          // an invariant check found inconsistent state
    PKV_ERR_BUFFER_TOO_SMALL = -9, // a caller-owned output buffer cannot hold the result;
                                   // the call reports the size needed (see each function)
    PKV_ERR_IO = -10,              // a file could not be opened, read or written
    PKV_ERR_FORMAT = -11,          // a file or text did not follow its documented format
    PKV_ERR_BUSY = -12,            // the object is bound elsewhere: a set attached to another
                                   // prefix cache, or detached while it holds cached blocks;
                                   // a hybrid move while a queued copy writes a moved block
    PKV_ERR_LIMIT = -13,           // a count would pass its limit: a block refcount at
                                   // INT32_MAX, more than 2^20 live sequences in one set
    PKV_ERR_RELEASED = -14,        // the tokens asked for were released by a window rule
                                   // (sliding / chunked layers): truncate or fork into them
} pkv_status;

// A static, human-readable name for a status, e.g. "out of blocks".
// Never returns NULL; unknown codes give "unknown status".
const char *pkv_status_str(pkv_status status);

#ifdef __cplusplus
}
#endif

#endif // PKV_STATUS_H

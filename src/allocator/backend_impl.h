// SPDX-License-Identifier: MIT
// Internal: the function table behind pkv_backend. backend.c checks arguments and
// counts and times every call; an implementation only does the raw work.
#ifndef PKV_BACKEND_IMPL_H
#define PKV_BACKEND_IMPL_H

#include "clock.h"
#include "pkv/backend.h"

typedef struct pkvi_backend_ops {
    const char *name;
    pkv_status (*alloc)(pkv_backend *b, size_t bytes, void **ptr);
    void (*free)(pkv_backend *b, void *ptr);
    pkv_status (*copy)(pkv_backend *b, void *arena, const pkv_copy_region *regions, uint32_t n);
    pkv_status (*memset)(pkv_backend *b, void *ptr, int value, size_t bytes);
    pkv_status (*upload)(pkv_backend *b, void *dst, const void *src, size_t bytes);
    pkv_status (*download)(pkv_backend *b, void *dst, const void *src, size_t bytes);
    void (*destroy)(pkv_backend *b); // optional: releases impl state
} pkvi_backend_ops;

struct pkv_backend {
    const pkvi_backend_ops *ops;
    pkv_backend_kind kind;
    int device;               // CUDA device ordinal; 0 for host
    pkv_backend_stats stats;
};

// Allocate a backend object with zeroed counters (NULL on failure).
pkv_backend *pkvi_backend_new(const pkvi_backend_ops *ops, pkv_backend_kind kind, int device);

#endif // PKV_BACKEND_IMPL_H

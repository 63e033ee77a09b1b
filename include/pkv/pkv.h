// SPDX-License-Identifier: MIT
// pagedkv: a paged KV-cache manager for LLM inference. Include this header for
// the whole public API, or the individual headers for one part.
#ifndef PKV_PKV_H
#define PKV_PKV_H

#include "pkv/version.h"
#include "pkv/status.h"
#include "pkv/pool.h"
#include "pkv/seq.h"
#include "pkv/backend.h"
#include "pkv/cache.h"
#include "pkv/prefix.h"
#include "pkv/block_hash.h"
#include "pkv/prefix_pool.h"
#include "pkv/hybrid_hit.h"
#include "pkv/hybrid.h"
#include "pkv/hybrid_vmm.h"
#include "pkv/attention.h"
#include "pkv/model_config.h"
#include "pkv/model.h"
#include "pkv/generate.h"
#include "pkv/trace.h"
#include "pkv/replay.h"
#include "pkv/vmm.h"

#endif // PKV_PKV_H

# SPDX-License-Identifier: MIT
"""Adapters that give pagedkv the shape of an engine's own KV-cache classes.

``pagedkv.compat.vllm``: vLLM v1's BlockPool (and a thin KVCacheManager for one
full-attention group) over pagedkv's C prefix pool.
"""

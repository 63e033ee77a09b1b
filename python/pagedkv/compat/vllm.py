# SPDX-License-Identifier: MIT
"""vLLM v1's block pool over pagedkv's C prefix pool (``pagedkv.PrefixPool``).

``BlockPool`` keeps vLLM v1 BlockPool's method names and semantics: free-queue order
(uncached blocks freed to the front, cached ones to the back, tail of a request
first), lazy eviction when the queue hands a cached block out, a hit taking a block
back out of the queue, the null block 0, several blocks under one hash, KV events.
``KVCacheManager`` is a thin manager for one full-attention group, enough to run
vLLM's prefix-caching scenarios. Hashing follows vLLM's rules (a chain over parent
hash, block tokens and extra keys); ``get_request_block_hasher`` accepts vLLM-style
Python hash functions or a ``pagedkv.BlockHasher`` (hashing in C, one block at a time).

Differences from vLLM, by design: the pool state lives in C, so ``KVCacheBlock``
objects are views (``ref_cnt`` and ``block_hash`` are read from the pool and cannot
be assigned), the free queue's internal links (``prev_free_block``) are not exposed,
and block hashes must be bytes of 1..32 bytes. ``BlockPool(...,
event_token_ids=False)`` is a cheaper event mode vLLM lacks: BlockStored events then
carry ``token_ids=[]`` (the hashes, parent, block size and LoRA id as usual), for
consumers that route by hash alone; the default keeps vLLM's events.
"""
from __future__ import annotations

import hashlib
import os
import pickle
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable, Optional, Sequence

from .. import BlockHasher, PrefixPool

# --------------------------------------------------------------------------- hashes

BlockHash = bytes
BlockHashWithGroupId = bytes


def make_block_hash_with_group_id(block_hash: BlockHash, group_id: int) -> BlockHashWithGroupId:
    """vLLM's key: the hash followed by the group id as 4 big-endian bytes."""
    return bytes(block_hash) + int(group_id).to_bytes(4, "big", signed=False)


def get_block_hash(key: BlockHashWithGroupId) -> BlockHash:
    return key[:-4]


def get_group_id(key: BlockHashWithGroupId) -> int:
    return int.from_bytes(key[-4:], "big", signed=False)


def sha256(obj: Any) -> bytes:
    """vLLM's default hash function family: SHA-256 of the pickled object."""
    return hashlib.sha256(pickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL)).digest()


NONE_HASH: BlockHash = b""


def init_none_hash(hash_fn: Callable[[Any], bytes]) -> None:
    """The parent of every first block: hash_fn(PYTHONHASHSEED), or 32 random bytes."""
    global NONE_HASH
    seed = os.getenv("PYTHONHASHSEED")
    NONE_HASH = os.urandom(32) if seed is None else hash_fn(seed)


init_none_hash(sha256)


def hash_block_tokens(hash_function: Callable[[Any], bytes], parent_block_hash: Optional[BlockHash],
                      curr_block_token_ids: Sequence[int],
                      extra_keys: Optional[tuple] = None) -> BlockHash:
    """One block's hash: hash_function((parent or NONE_HASH, tokens, extra_keys))."""
    if not parent_block_hash:
        parent_block_hash = NONE_HASH
    return BlockHash(hash_function((parent_block_hash, tuple(curr_block_token_ids), extra_keys)))


@dataclass
class PlaceholderRange:
    offset: int
    length: int


@dataclass
class MultiModalFeatureSpec:
    identifier: str
    mm_position: PlaceholderRange
    modality: str = "image"


def _lora_name(request) -> Optional[str]:
    lora = getattr(request, "lora_request", None)
    return None if lora is None else getattr(lora, "lora_name", getattr(lora, "name", None))


def _lora_id(request) -> Optional[int]:
    lora = getattr(request, "lora_request", None)
    if lora is None:
        return None
    for attr in ("adapter_id", "lora_int_id", "id"):
        if getattr(lora, attr, None) is not None:
            return int(getattr(lora, attr))
    return None


def _gen_mm_extra_hash_keys(request, start_token_idx: int, end_token_idx: int,
                            start_mm_idx: int) -> tuple[list, int]:
    feats = getattr(request, "mm_features", None) or []
    keys: list = []
    if not feats:
        return keys, start_mm_idx
    last = feats[-1].mm_position
    if last.offset + last.length < start_token_idx:
        return keys, start_mm_idx  # the block is past every input
    if start_mm_idx < 0:  # only the last input can reach a block filled by decoding
        start_mm_idx = len(feats) + start_mm_idx
    idx = start_mm_idx
    while idx < len(feats):
        pos = feats[idx].mm_position
        if end_token_idx <= pos.offset:
            break  # the block ends before this input
        if start_token_idx > pos.offset + pos.length:
            idx += 1  # the block starts after this input
            continue
        keys.append(feats[idx].identifier)
        if end_token_idx >= pos.offset + pos.length:
            idx += 1  # the input ends here; the block may hold the next one too
        else:
            break
    return keys, idx


def generate_block_hash_extra_keys(request, start_token_idx: int, end_token_idx: int,
                                   start_mm_idx: int) -> tuple[Optional[tuple], int]:
    """vLLM's extra keys of a block: LoRA name, multimodal identifiers, cache salt
    (first block only); None when there are none. Returns (keys, next mm index)."""
    mm_keys, next_mm_idx = _gen_mm_extra_hash_keys(request, start_token_idx, end_token_idx,
                                                   start_mm_idx)
    lora = _lora_name(request)
    salt = getattr(request, "cache_salt", None)
    keys = ([lora] if lora else []) + mm_keys + ([salt] if start_token_idx == 0 and salt else [])
    return (tuple(keys) if keys else None), next_mm_idx


def get_request_block_hasher(block_size: int, caching_hash_fn):
    """A function request -> the hashes of its newly full blocks (vLLM's request block
    hasher). caching_hash_fn is a vLLM-style callable, or a pagedkv.BlockHasher: then
    each block is hashed in C with LoRA id, salt and multimodal features as extra keys."""
    if isinstance(caching_hash_fn, BlockHasher):
        hasher = caching_hash_fn

        def request_block_hasher_c(request) -> list[BlockHash]:
            start = len(request.block_hashes) * block_size
            tokens = request.all_token_ids
            if len(tokens) < start + block_size:
                return []
            feats = getattr(request, "mm_features", None)
            mm = ([(f.mm_position.offset, f.mm_position.length, f.identifier) for f in feats]
                  if feats else None)
            return hasher.hash_blocks(tokens[start:], block_size, start=start,
                                      parent=request.block_hashes[-1] if start else None,
                                      lora_id=_lora_id(request),
                                      cache_salt=getattr(request, "cache_salt", None), mm=mm)
        return request_block_hasher_c

    def request_block_hasher(request) -> list[BlockHash]:
        start = len(request.block_hashes) * block_size
        tokens = request.all_token_ids
        if len(tokens) < start + block_size:
            return []
        # A later call hashes blocks filled by decoding: only the last input can reach
        # them (vLLM starts from it; an input ending exactly at the block's start
        # then counts, as in vLLM; the C hasher counts true overlap only).
        mm_idx = -1 if start else 0
        parent = request.block_hashes[-1] if request.block_hashes else None
        out = []
        while start + block_size <= len(tokens):
            end = start + block_size
            extra, mm_idx = generate_block_hash_extra_keys(request, start, end, mm_idx)
            parent = hash_block_tokens(caching_hash_fn, parent, tokens[start:end], extra)
            out.append(parent)
            start = end
        return out
    return request_block_hasher


# --------------------------------------------------------------------------- requests


@dataclass
class LoRARequest:
    lora_name: str
    lora_int_id: int
    lora_path: str = ""

    @property
    def adapter_id(self) -> int:
        return self.lora_int_id


@dataclass
class SamplingParams:
    prompt_logprobs: Optional[int] = None
    max_tokens: int = 16


class Request:
    """The parts of vLLM's Request a KV cache manager reads."""

    def __init__(self, request_id: str, prompt_token_ids: Sequence[int], block_hasher=None, *,
                 mm_features: Optional[list] = None, lora_request=None,
                 cache_salt: Optional[str] = None, sampling_params: Optional[SamplingParams] = None,
                 prompt_logprobs: Optional[int] = None):
        self.request_id = request_id
        self.prompt_token_ids = list(prompt_token_ids)
        self._all_token_ids = list(prompt_token_ids)
        self.output_token_ids: list[int] = []
        self.mm_features = mm_features or []
        self.lora_request = lora_request
        self.cache_salt = cache_salt
        self.sampling_params = sampling_params or SamplingParams(prompt_logprobs=prompt_logprobs)
        self.num_computed_tokens = 0
        self.num_preemptions = 0
        self.block_hashes: list[BlockHash] = []
        self._block_hasher = block_hasher
        self.update_block_hashes()

    @property
    def skip_reading_prefix_cache(self) -> bool:
        # Prompt logprobs need every prompt token computed: no prefix-cache read.
        return self.sampling_params.prompt_logprobs is not None

    @property
    def all_token_ids(self) -> list[int]:
        return self._all_token_ids

    @property
    def num_tokens(self) -> int:
        return len(self._all_token_ids)

    def update_block_hashes(self) -> None:
        if self._block_hasher is not None:
            self.block_hashes.extend(self._block_hasher(self))

    def append_output_token_ids(self, token_ids) -> None:
        if isinstance(token_ids, int):
            token_ids = [token_ids]
        self.output_token_ids.extend(token_ids)
        self._all_token_ids.extend(token_ids)
        self.update_block_hashes()


# --------------------------------------------------------------------------- events


@dataclass
class BlockStored:
    block_hashes: list
    parent_block_hash: Optional[bytes]
    token_ids: list
    block_size: int
    lora_id: Optional[int]
    medium: Optional[str] = "GPU"
    group_idx: int = 0


@dataclass
class BlockRemoved:
    block_hashes: list
    medium: Optional[str] = "GPU"
    group_idx: int = 0


@dataclass
class AllBlocksCleared:
    medium: Optional[str] = "GPU"


@dataclass
class EventsDropped:
    """Not in vLLM: events were lost to a full buffer here; resynchronise."""
    dropped: int


def _event(t: tuple):
    kind = t[0]
    if kind == "BlockStored":
        return BlockStored(t[1], t[2], t[3], t[4], t[5], t[6], t[7])
    if kind == "BlockRemoved":
        return BlockRemoved(t[1], t[2], t[3])
    if kind == "AllBlocksCleared":
        return AllBlocksCleared(t[1])
    return EventsDropped(t[1])


# --------------------------------------------------------------------------- blocks


class KVCacheBlock:
    """A view of one block of a BlockPool: its state lives in the C pool."""

    __slots__ = ("block_id", "_pool")

    def __init__(self, block_id: int, pool: PrefixPool):
        self.block_id = block_id
        self._pool = pool

    @property
    def ref_cnt(self) -> int:
        return self._pool.refcount(self.block_id)

    @property
    def is_null(self) -> bool:
        return self.block_id == 0

    @property
    def block_hash(self) -> Optional[BlockHashWithGroupId]:
        ref, h, _parent, group = self._pool.block_info(self.block_id)
        return None if h is None else make_block_hash_with_group_id(h, group)

    @property
    def parent_block_hash(self) -> Optional[BlockHash]:
        return self._pool.block_info(self.block_id)[2]

    def __repr__(self) -> str:
        return f"KVCacheBlock(block_id={self.block_id}, ref_cnt={self.ref_cnt})"


class FreeKVCacheBlockQueue:
    """Read-only view of the pool's free queue (head first)."""

    def __init__(self, pool: "BlockPool"):
        self._owner = pool

    @property
    def num_free_blocks(self) -> int:
        return self._owner._pool.num_free

    def get_all_free_blocks(self) -> list[KVCacheBlock]:
        blocks = self._owner.blocks
        return [blocks[i] for i in self._owner._pool.free_queue()]


class BlockHashToBlockMap:
    """Read-only view of the cache table: key (hash + group id) -> earliest block."""

    def __init__(self, pool: "BlockPool"):
        self._owner = pool

    def get_one_block(self, key: BlockHashWithGroupId) -> Optional[KVCacheBlock]:
        i = self._owner._pool.get_cached_block(get_block_hash(key), get_group_id(key))
        return None if i is None else self._owner.blocks[i]

    def __contains__(self, key) -> bool:
        return self.get_one_block(key) is not None

    def __len__(self) -> int:  # cached blocks (vLLM counts keys; equal without duplicates)
        return self._owner._pool.stats()["cached_blocks"]


def _flatten(blocks) -> list[KVCacheBlock]:
    if isinstance(blocks, KVCacheBlocks):
        return [b for group in blocks.blocks for b in group]
    blocks = list(blocks)
    if blocks and not isinstance(blocks[0], KVCacheBlock):
        return [b for group in blocks for b in group]  # one list per KV cache group
    return blocks


class BlockPool:
    """vLLM v1's BlockPool over pagedkv.PrefixPool (see the module docstring)."""

    def __init__(self, num_gpu_blocks: int, enable_caching: bool = True,
                 hash_block_size: Optional[int] = None, enable_kv_cache_events: bool = False,
                 metrics_collector=None, *, num_kv_cache_groups: int = 1,
                 event_capacity: int = 65536, event_token_ids: bool = True):
        if not isinstance(num_gpu_blocks, int) or num_gpu_blocks <= 0:
            raise ValueError(f"num_gpu_blocks must be a positive int, got {num_gpu_blocks!r}")
        self.num_gpu_blocks = num_gpu_blocks
        self.enable_caching = enable_caching
        self.hash_block_size = hash_block_size
        self.enable_kv_cache_events = enable_kv_cache_events
        # vLLM's BlockStored carries the blocks' token ids; a consumer that routes by hash
        # alone can turn them off: BlockStored.token_ids is then [] (no copy either way).
        self.event_token_ids = event_token_ids
        # vLLM's pool of 1 block is only its null block; ours needs 2 ids.
        self._pool = PrefixPool(max(num_gpu_blocks, 2), enable_caching=enable_caching,
                                num_groups=num_kv_cache_groups,
                                event_capacity=event_capacity if enable_kv_cache_events else 0)
        if num_gpu_blocks == 1:
            self._pool.get_new_blocks(1)  # keep the extra id out of reach
        self.blocks = [KVCacheBlock(i, self._pool) for i in range(num_gpu_blocks)]
        self.null_block = self.blocks[0]
        self.free_block_queue = FreeKVCacheBlockQueue(self)
        self.cached_block_hash_to_block = BlockHashToBlockMap(self)

    # -- lookups
    def get_cached_block(self, block_hash: BlockHash,
                         kv_cache_group_ids: Sequence[int]) -> Optional[list[KVCacheBlock]]:
        out = []
        for g in kv_cache_group_ids:
            i = self._pool.get_cached_block(block_hash, g)
            if i is None:
                return None
            out.append(self.blocks[i])
        return out

    # -- caching
    def cache_full_blocks(self, request, blocks: Sequence[KVCacheBlock], num_cached_blocks: int,
                          num_full_blocks: int, block_size: int, kv_cache_group_id: int = 0) -> None:
        if num_cached_blocks >= num_full_blocks:
            return
        new = blocks[num_cached_blocks:num_full_blocks]
        hashes = request.block_hashes[num_cached_blocks:num_full_blocks]
        if len(hashes) < len(new):
            raise ValueError(f"request {request.request_id} has {len(request.block_hashes)} block "
                             f"hashes, {num_full_blocks} needed")
        parent = request.block_hashes[num_cached_blocks - 1] if num_cached_blocks else None
        tokens = (request.all_token_ids[num_cached_blocks * block_size:num_full_blocks * block_size]
                  if self.enable_kv_cache_events and self.event_token_ids else None)
        self._pool.cache_blocks([b.block_id for b in new], hashes, parent=parent, tokens=tokens,
                                block_size=block_size, lora_id=_lora_id(request),
                                group=kv_cache_group_id)

    # -- allocation
    def get_new_blocks(self, num_blocks: int) -> list[KVCacheBlock]:
        if num_blocks > self._pool.num_free:
            raise ValueError(f"Cannot get {num_blocks} free blocks from the pool")
        blocks = self.blocks
        return [blocks[i] for i in self._pool.get_new_blocks(num_blocks)]

    def touch(self, blocks) -> None:
        self._pool.touch([b.block_id for b in _flatten(blocks)])

    def free_blocks(self, ordered_blocks: Iterable[KVCacheBlock]) -> None:
        self._pool.free_blocks([b.block_id for b in ordered_blocks])

    def evict_blocks(self, block_ids: Iterable[int]) -> None:
        for i in block_ids:
            if not 0 <= i < self.num_gpu_blocks:
                raise ValueError(f"Invalid block_id {i} >= {self.num_gpu_blocks}")
            self._pool.evict_block(i)

    def reset_prefix_cache(self) -> bool:
        return self._pool.reset()

    # -- accounting
    def get_num_free_blocks(self) -> int:
        return self._pool.num_free

    def get_usage(self) -> float:
        total = self.num_gpu_blocks - 1  # the null block is never usable
        return 0.0 if not total else 1.0 - self._pool.num_free / total

    def take_events(self) -> list:
        if not self.enable_kv_cache_events:
            return []
        return [_event(t) for t in self._pool.take_events()]


# --------------------------------------------------------------------------- manager


class KVCacheBlocks:
    """A request's blocks, one list per KV cache group (here one)."""

    def __init__(self, blocks: tuple):
        self.blocks = blocks

    def __add__(self, other: "KVCacheBlocks") -> "KVCacheBlocks":
        return KVCacheBlocks(tuple(a + b for a, b in zip(self.blocks, other.blocks)))

    def get_block_ids(self) -> tuple[list[int], ...]:
        return tuple([b.block_id for b in group] for group in self.blocks)

    def get_unhashed_block_ids(self) -> list[int]:
        return [b.block_id for b in self.blocks[0] if b.block_hash is None]


@dataclass
class PrefixCacheStats:
    reset: bool = False
    requests: int = 0
    queries: int = 0
    hits: int = 0
    preempted_requests: int = 0
    preempted_queries: int = 0
    preempted_hits: int = 0


class _Coordinator:
    def __init__(self, manager: "KVCacheManager"):
        self.single_type_managers = (manager,)
        self.block_pool = manager.block_pool


class KVCacheManager:
    """A thin vLLM v1 KVCacheManager for one full-attention group of block_size."""

    def __init__(self, kv_cache_config=None, max_model_len: int = 1 << 30, enable_caching: bool = True,
                 *, num_blocks: Optional[int] = None, block_size: Optional[int] = None,
                 enable_kv_cache_events: bool = False, log_stats: bool = False,
                 hash_block_size: Optional[int] = None, **_ignored):
        # vLLM passes a KVCacheConfig (num_blocks, one full-attention group's block_size);
        # num_blocks= and block_size= say the same without one.
        if kv_cache_config is not None:
            num_blocks = kv_cache_config.num_blocks
            groups = kv_cache_config.kv_cache_groups
            if len(groups) != 1:
                raise NotImplementedError("pagedkv.compat.vllm.KVCacheManager: one KV cache group")
            block_size = groups[0].kv_cache_spec.block_size
        if num_blocks is None or block_size is None:
            raise ValueError("KVCacheManager needs kv_cache_config or num_blocks and block_size")
        self.block_size = block_size
        self.enable_caching = enable_caching
        self.max_model_len = max_model_len
        self.block_pool = BlockPool(num_blocks, enable_caching,
                                    enable_kv_cache_events=enable_kv_cache_events)
        self.req_to_blocks: dict[str, list[KVCacheBlock]] = {}
        self.num_cached_block: dict[str, int] = {}
        self.log_stats = log_stats
        self._reset_requested = False

    @property
    def usage(self) -> float:
        return self.block_pool.get_usage()

    @property
    def coordinator(self):
        """vLLM reaches a group's manager as coordinator.single_type_managers[i]; with
        one group that manager is this object (req_to_blocks, num_cached_block)."""
        return _Coordinator(self)

    def empty_kv_cache_blocks(self) -> KVCacheBlocks:
        return KVCacheBlocks(([],))

    def get_computed_blocks(self, request) -> tuple[KVCacheBlocks, int, int]:
        """(hit blocks, hit tokens, shared_prefix_boundary: always 0 for full attention)."""
        if not self.enable_caching or request.skip_reading_prefix_cache:
            return self.empty_kv_cache_blocks(), 0, 0
        # The last token is always recomputed: its logits start generation.
        max_blocks = (request.num_tokens - 1) // self.block_size
        ids = self.block_pool._pool.find_prefix(request.block_hashes[:max_blocks])
        hit = [self.block_pool.blocks[i] for i in ids]
        num_hit_tokens = len(hit) * self.block_size
        if self.log_stats:
            self.block_pool._pool.record(request.num_tokens, num_hit_tokens,
                                         preempted=request.num_preemptions > 0)
        return KVCacheBlocks((hit,)), num_hit_tokens, 0

    def allocate_slots(self, request, num_new_tokens: int, num_new_computed_tokens: int = 0,
                       new_computed_blocks: Optional[KVCacheBlocks] = None,
                       num_lookahead_tokens: int = 0, num_external_computed_tokens: int = 0,
                       delay_cache_blocks: bool = False,
                       num_encoder_tokens: int = 0) -> Optional[KVCacheBlocks]:
        if num_new_tokens == 0:
            raise ValueError("num_new_tokens must be greater than 0")
        computed = new_computed_blocks.blocks[0] if new_computed_blocks else []
        req_blocks = self.req_to_blocks.setdefault(request.request_id, [])
        num_computed_tokens = (request.num_computed_tokens + num_new_computed_tokens
                               + num_external_computed_tokens)
        need = min(num_computed_tokens + num_new_tokens + num_lookahead_tokens, self.max_model_len)
        num_new = max(0, -(-need // self.block_size) - len(req_blocks) - len(computed))
        # A hit on a queued block takes it out of the free queue too.
        evictable = sum(1 for b in computed if b.ref_cnt == 0 and not b.is_null)
        if num_new + evictable > self.block_pool.get_num_free_blocks():
            return None
        if self.enable_caching:
            self.block_pool.touch(computed)
        req_blocks.extend(computed)
        if computed:
            self.num_cached_block[request.request_id] = len(req_blocks)
        new_blocks = self.block_pool.get_new_blocks(num_new) if num_new else []
        req_blocks.extend(new_blocks)
        if self.enable_caching and not delay_cache_blocks:
            self.cache_blocks(request, min(num_computed_tokens + num_new_tokens, request.num_tokens))
        return KVCacheBlocks((new_blocks,))

    def cache_blocks(self, request, num_computed_tokens: int) -> None:
        num_full = num_computed_tokens // self.block_size
        num_cached = self.num_cached_block.get(request.request_id, 0)
        if num_cached >= num_full:
            return
        self.block_pool.cache_full_blocks(request, self.req_to_blocks[request.request_id],
                                          num_cached, num_full, self.block_size, 0)
        self.num_cached_block[request.request_id] = num_full

    def free(self, request) -> None:
        blocks = self.req_to_blocks.pop(request.request_id, [])
        self.block_pool.free_blocks(reversed(blocks))  # tail first: evicted first
        self.num_cached_block.pop(request.request_id, None)

    def get_blocks(self, request_id: str) -> KVCacheBlocks:
        return KVCacheBlocks((list(self.req_to_blocks.get(request_id, [])),))

    def get_block_ids(self, request_id: str) -> tuple[list[int], ...]:
        return self.get_blocks(request_id).get_block_ids()

    def reset_prefix_cache(self) -> bool:
        if not self.block_pool.reset_prefix_cache():
            return False
        self._reset_requested = True
        return True

    def make_prefix_cache_stats(self) -> Optional[PrefixCacheStats]:
        if not self.log_stats:
            return None
        s = self.block_pool._pool.stats(reset=True)
        stats = PrefixCacheStats(self._reset_requested, s["requests"], s["queries"], s["hits"],
                                 s["preempted_requests"], s["preempted_queries"],
                                 s["preempted_hits"])
        self._reset_requested = False
        return stats

    def take_events(self) -> list:
        return self.block_pool.take_events()

"""blockviz's block events, emitted as vLLM's own KVCacheManager and BlockPool do each operation.

The tap wraps methods of one vLLM instance (never the classes), each calling vLLM's own code and
emitting what our v1 (engine/v1/) emits for the same operation, in the same order:

- `KVCacheManager.allocate_slots`: notes the request and where its new tokens start;
- `BlockPool.touch` (a waiting request's prefix-cache hits): PrefixCacheHit per block;
- `BlockPool._maybe_evict_cached_block` (inside `get_new_blocks`): BlockEvicted;
- `KVCacheCoordinator.allocate_new_blocks`: SlotAppended for tokens landing in blocks the request
  held, BlockAllocated for each new block with the tokens it holds;
- `BlockPool.cache_full_blocks`: BlockHashed per block given its hash (`registered`: no other block
  held the hash);
- `BlockPool.free_blocks`: BlockFreed per block, held ones first, then those going to the free
  queue's head in reverse, then those going to its tail, as engine/v1/block_pool.py documents, so
  the reducer rebuilds vLLM's `FreeKVCacheBlockQueue`;
- `KVCacheManager.free`: SequenceFreed after the request's blocks.
- `KVCacheCoordinator.allocate_new_computed_blocks`: notes how many blocks the request holds once
  its hits join, so the fresh blocks vLLM's CPU tier loads into are announced as new (offload.py).

With several KV-cache groups (a hybrid model: full-attention and sliding-window layers) each
operation emits every group's events, group after group, each naming its `group` (the group id
vLLM passes, keys with, or whose manager is at work), as engine/v1's KVCacheManager does; a
sliding-window group's `remove_skipped_blocks` (`_remove_blocks_in_range`) announces the slots it
nulls (BlocksSkipped) and frees through `BlockPool.free_blocks` inside `allocate_slots`, so those
BlockFreed carry the request's seq id.

Hashes are vLLM's `BlockHash` bytes as our events carry them (`external_block_hash`: the low 64
bits, which is vLLM's `maybe_convert_block_hash` with VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES).

Features of vLLM 0.33's manager that ours lacks, and why none reaches an event here:
- partial-block prefix entries (`cache_partial_block`, `_cache_partial_tail_block`, fine-grained hits
  and their copy-on-write `_apply_cow` with its retained blocks): only when the hash unit is smaller
  than the block; the scheduler is built with `hash_block_size == block_size`;
- `move_block_hashes`, `unpin_blocks`, `evict_blocks`, deferred frees, `_free_cow_retained_blocks`:
  KV connectors, HiSparse and copy-on-write only; no connector is configured;
- Mamba groups and their null-padded tables: the models here have attention layers only;
- block zeroing (`new_block_ids_to_zero`): only a worker that needs it asks; the ids are drained
  and unused here;
- `reset_prefix_cache`: never called by the adapter.
If any of these ran anyway, the reducer check in tests/test_vllm_core.py would see the difference.
"""

from __future__ import annotations

from typing import Any

from engine.events import (
    BlockAllocated,
    BlockEvicted,
    BlockFreed,
    BlockHashed,
    BlocksSkipped,
    EventBus,
    PrefixCacheHit,
    SequenceFreed,
    SlotAppended,
)
from engine.v1.block_pool import GPU
from engine.v1.kv_cache_utils import external_block_hash


class VllmEventTap:
    """Wraps one vLLM scheduler's KVCacheManager, coordinator and BlockPool so that each block
    operation emits its blockviz events on `events`. Request ids are our seq ids as strings."""

    def __init__(self, scheduler: Any, events: EventBus) -> None:
        from vllm.v1.core.kv_cache_utils import get_block_hash, get_group_id, make_block_hash_with_group_id

        self.events = events
        self.manager = scheduler.kv_cache_manager
        self.coordinator = self.manager.coordinator
        self.pool = self.manager.block_pool
        self.managers = self.coordinator.single_type_managers  # one per KV-cache group
        self.block_size = self.managers[0].block_size
        self._get_block_hash = get_block_hash
        self._get_group_id = get_group_id
        self._group = 0  # the group whose manager is freeing (free, _remove_blocks_in_range)
        self._key = make_block_hash_with_group_id
        self._request: Any = None  # the Request allocate_slots is working for
        self._start = 0  # where its new slots start (computed tokens plus new hits)
        # the seq id whose blocks are being freed (KVCacheManager.free, or a window's in allocate_slots;
        # -1: vLLM's CPU tier releasing a pin)
        self._freeing = -1
        self.hashed: dict[int, tuple[int | None, tuple[int, ...]]] = {}  # block id -> (parent hash, tokens)
        self._num_old_blocks: list[int] | None = None  # per group, the request's blocks before allocate_slots' new ones
        for obj, name in ((self.manager, "allocate_slots"), (self.manager, "free"),
                          (self.coordinator, "allocate_new_computed_blocks"),
                          (self.coordinator, "allocate_new_blocks"), (self.pool, "touch"),
                          (self.pool, "_maybe_evict_cached_block"), (self.pool, "cache_full_blocks"),
                          (self.pool, "free_blocks")):
            setattr(obj, name, getattr(self, "_" + name.lstrip("_"))(getattr(obj, name)))
        for manager in self.managers:
            manager.free = self._group_free(manager, manager.free)
            manager._remove_blocks_in_range = self._remove_blocks_in_range(manager, manager._remove_blocks_in_range)

    def external(self, key: bytes) -> int:
        """A pool key (hash and group id) as events carry the hash."""
        return external_block_hash(self._get_block_hash(key))

    # ------------------------------------------------------------------ wrappers (each returns the wrapped method)

    def _allocate_slots(self, original):
        def allocate_slots(request, num_new_tokens, num_new_computed_tokens=0, new_computed_blocks=None, **kwargs):
            self._request = request
            self._start = request.num_computed_tokens + num_new_computed_tokens
            self._num_old_blocks = None
            freeing, self._freeing = self._freeing, int(request.request_id)  # a window's blocks let go
            try:
                return original(request, num_new_tokens, num_new_computed_tokens=num_new_computed_tokens,
                                new_computed_blocks=new_computed_blocks, **kwargs)
            finally:
                self._request = None
                self._freeing = freeing
        return allocate_slots

    def _touch(self, original):
        def touch(blocks):
            original(blocks)
            request = self._request
            if not self.events.active or request is None:
                return
            bs, token_ids, seq_id = self.block_size, request.all_token_ids, int(request.request_id)
            for block in blocks:  # a waiting request's hits (a window's: after its skipped head)
                if block.is_null:
                    continue
                index = block.block_hash_num_tokens // bs - 1  # its place: the tokens its hash covers
                self.events.emit(PrefixCacheHit, device=GPU, block=block.block_id, seq_ids=(seq_id,),
                                 logical_index=index, ref_count=block.ref_cnt,
                                 block_hash=self.external(block.block_hash),
                                 token_ids=tuple(token_ids[index * bs : (index + 1) * bs]),
                                 group=self._get_group_id(block.block_hash))
        return touch

    def _maybe_evict_cached_block(self, original, device: str = GPU):
        """BlockEvicted on `device` for each block the pool evicts (the GPU pool's, or vLLM's CPU tier's)."""
        def maybe_evict_cached_block(block):
            key = block.block_hash
            evicted = original(block)
            if evicted and self.events.active:
                self.events.emit(BlockEvicted, device=device, block=block.block_id, block_hash=self.external(key),
                                 group=self._get_group_id(key) if device == GPU else 0)
            return evicted
        return maybe_evict_cached_block

    def _allocate_new_computed_blocks(self, original):
        def allocate_new_computed_blocks(request_id, new_computed_blocks, *args, **kwargs):
            # the hits join the table here, then (vLLM's CPU tier) fresh blocks for the tokens a
            # load brings back: those are new blocks, announced with allocate_new_blocks' own
            self._num_old_blocks = [len(manager.req_to_blocks.get(request_id, ())) + sum(1 for _ in hits)
                                    for manager, hits in zip(self.managers, new_computed_blocks)]
            return original(request_id, new_computed_blocks, *args, **kwargs)
        return allocate_new_computed_blocks

    def _allocate_new_blocks(self, original):
        def allocate_new_blocks(request_id, num_tokens, *args, **kwargs):
            num_old_blocks = self._num_old_blocks
            if num_old_blocks is None:
                num_old_blocks = [len(manager.req_to_blocks.get(request_id, ())) for manager in self.managers]
            self._num_old_blocks = None
            new_blocks = original(request_id, num_tokens, *args, **kwargs)
            if self.events.active and self._request is not None:
                for manager, num_old in zip(self.managers, num_old_blocks):
                    self._emit_slots(self._request, manager.req_to_blocks[request_id], num_old, self._start,
                                     num_tokens, manager.kv_cache_group_id)
            return new_blocks
        return allocate_new_blocks

    def _cache_full_blocks(self, original):
        def cache_full_blocks(request, blocks, num_cached_blocks, num_full_blocks, block_size, kv_cache_group_id,
                              block_mask=None):
            hashes = request.block_hashes
            fresh = [(i, self.pool.cached_block_hash_to_block.get_one_block(self._key(hashes[i], kv_cache_group_id))
                      is None) for i in range(num_cached_blocks, num_full_blocks)
                     if not blocks[i].is_null and blocks[i].block_hash is None
                     and (block_mask is None or block_mask[i - num_cached_blocks])]
            original(request, blocks, num_cached_blocks, num_full_blocks, block_size, kv_cache_group_id,
                     block_mask=block_mask)
            if not self.events.active:
                return
            token_ids = request.all_token_ids
            for index, registered in fresh:
                block = blocks[index]
                if block.block_hash is None:
                    continue
                parent = external_block_hash(hashes[index - 1]) if index else None
                held = tuple(token_ids[index * block_size : (index + 1) * block_size])
                self.hashed[block.block_id] = (parent, held)
                self.events.emit(BlockHashed, device=GPU, block=block.block_id,
                                 block_hash=external_block_hash(hashes[index]), parent_hash=parent,
                                 token_ids=held, num_hashed_tokens=(index + 1) * block_size, registered=registered,
                                 group=kv_cache_group_id)
        return cache_full_blocks

    def _free_blocks(self, original):
        def free_blocks(ordered_blocks):
            blocks = [block for block in ordered_blocks]
            original(blocks)
            if not self.events.active:
                return
            blocks = [block for block in blocks if not block.is_null]
            caching = self.pool.enable_caching
            held = [b for b in blocks if b.ref_cnt > 0]
            fresh = [b for b in blocks if b.ref_cnt == 0 and (b.block_hash is None or not caching)]
            cached = [b for b in blocks if b.ref_cnt == 0 and b.block_hash is not None and caching]
            for block in (*held, *reversed(fresh), *cached):
                self.events.emit(BlockFreed, device=GPU, block=block.block_id, seq_id=self._freeing,
                                 ref_count=block.ref_cnt, cached=block.block_hash is not None and caching,
                                 group=self._group)
        return free_blocks

    def _group_free(self, manager, original):
        """One group's manager freeing a request's table: its frees name that group."""
        def free(request_id):
            self._group = manager.kv_cache_group_id
            try:
                return original(request_id)
            finally:
                self._group = 0
        return free

    def _remove_blocks_in_range(self, manager, original):
        """A sliding window letting blocks go: BlocksSkipped for the slots it nulls (walking back
        from the range's end to a null one, as vLLM does), then its frees, in that group."""
        def remove_blocks_in_range(request_id, first_block, last_block):
            blocks = manager.req_to_blocks.get(request_id) or []
            indices = []
            for index in range(min(last_block, len(blocks)) - 1, first_block - 1, -1):
                if blocks[index].is_null:
                    break
                indices.append(index)
            if indices and self.events.active:
                indices.reverse()
                self.events.emit(BlocksSkipped, seq_id=int(request_id), logical_indices=tuple(indices),
                                 blocks=tuple(blocks[i].block_id for i in indices), group=manager.kv_cache_group_id)
            self._group = manager.kv_cache_group_id
            try:
                return original(request_id, first_block, last_block)
            finally:
                self._group = 0
        return remove_blocks_in_range

    def _free(self, original):
        def free(request):
            had_blocks = any(request.request_id in manager.req_to_blocks for manager in self.managers)
            self._freeing = int(request.request_id)
            try:
                original(request)
            finally:
                self._freeing = -1
            if had_blocks and self.events.active:
                self.events.emit(SequenceFreed, seq_id=int(request.request_id))
        return free

    # ------------------------------------------------------------------ events

    def _emit_slots(self, request: Any, blocks: list, num_old_blocks: int, start: int, end: int, group: int = 0) -> None:
        """Tokens start..end-1 got slots in one group's table `blocks` (engine/v1's
        KVCacheManager._emit_slots, over vLLM's own block table and the request's own tokens)."""
        bs = self.block_size
        seq_id = int(request.request_id)
        token_ids = request.all_token_ids
        for pos in range(start, min(end, num_old_blocks * bs)):
            self.events.emit(SlotAppended, seq_id=seq_id, device=GPU, logical_index=pos // bs,
                             block=blocks[pos // bs].block_id, offset=pos % bs, token_id=token_ids[pos])
        for index in range(num_old_blocks, len(blocks)):
            block = blocks[index]
            held = tuple(token_ids[max(start, index * bs) : min(end, (index + 1) * bs)])
            self.events.emit(BlockAllocated, device=GPU, block=block.block_id, seq_ids=(seq_id,),
                             logical_index=index, ref_count=block.ref_cnt, block_hash=None, token_ids=held,
                             group=group)

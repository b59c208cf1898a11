"""blockviz's block events, emitted as vLLM's own KVCacheManager and BlockPool do each operation.

The tap wraps methods of one vLLM instance (never the classes), each calling vLLM's own code and
emitting what our v1 (engine/v1/) emits for the same operation, in the same order:

- `KVCacheManager.allocate_slots`: opens the call whose request and first new slot the calls
  inside it read;
- `BlockPool.touch` inside it (a waiting request's prefix-cache hits): PrefixCacheHit per block;
- `KVCacheCoordinator.allocate_new_computed_blocks` inside it: how many blocks the request holds
  once its hits join, so the fresh blocks vLLM's CPU tier loads into are announced as new
  (offload.py);
- `KVCacheCoordinator.allocate_new_blocks` inside it: SlotAppended for tokens landing in blocks the
  request held, BlockAllocated for each new block with the tokens it holds;
- `BlockPool.cache_full_blocks`: BlockHashed per block given its hash (`registered`: no other block
  held the hash);
- `BlockPool.free_blocks`: BlockFreed per block, held ones first, then those vLLM put at the free
  queue's head in reverse, then those it put at its tail, each read from vLLM's own
  `FreeKVCacheBlockQueue` after the call, as engine/v1/block_pool.py documents, so the reducer
  rebuilds that queue;
- `KVCacheManager.free`: SequenceFreed after the request's blocks; each group's
  `SingleTypeKVCacheManager.free` names the group its frees belong to.
- evictions come from vLLM's own metrics hook (`BlockPool.metrics_collector`, the
  `KVCacheMetricsCollector` interface): `on_block_evicted` is called for each block `get_new_blocks`
  takes before its hash is dropped: BlockEvicted when it held one. The same hook on vLLM's CPU
  tier's pool draws that tier's evictions (offload.py).

Each wrapped call carries its own context: a wrapper opens a `TapCall` for the time vLLM's method
runs (`VllmEventTap.calling`) and the wrapped calls made inside it read the innermost open call
that says what they need (which request allocates, whose blocks a free lets go, which group frees).
No wrapper leaves anything behind for another: a call's context ends with it.

A call the tap cannot draw raises instead of drawing something wrong: a block freed, touched or
allocated outside every call that says whose it is (a path that bypasses the wrapped methods), a
request's frees deferred (`KVCacheManager.pop_blocks_for_free`, vLLM's `defer_block_free` under
overlapping batches), or the prefix cache reset (the metrics hook's `reset`). The events themselves
are cross-checked after every step, in tests/test_vllm_tap.py, against vLLM's own KV events
(`BlockPool.take_events()`) and its state.

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
- `move_block_hashes`, `unpin_blocks`, `evict_blocks`, `_free_cow_retained_blocks`: KV connectors,
  HiSparse and copy-on-write only; no such connector is configured;
- Mamba groups and their null-padded tables: the models here have attention layers only;
- block zeroing (`new_block_ids_to_zero`): only a worker that needs it asks; the ids are drained
  and unused here.
"""

from __future__ import annotations

from dataclasses import dataclass, field
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

PIN_RELEASE = -1  # the seq id of a BlockFreed that releases a pin vLLM's CPU tier held (offload.py)


@dataclass(slots=True)
class TapCall:
    """One wrapped vLLM call in progress, and what the wrapped calls made inside it need to know;
    as a context manager it is on `calls` (the tap's calls in progress) for the time it runs."""

    calls: list[TapCall] = field(repr=False)
    method: str
    request: Any = None  # allocate_slots: the vLLM Request it allocates for
    start: int = 0  # allocate_slots: its first new slot (computed tokens plus new hits)
    num_old_blocks: list[int] | None = None  # allocate_slots: per group, the table's blocks once the hits joined
    seq_id: int | None = None  # whose blocks a free inside this call lets go (PIN_RELEASE: the CPU tier's pins)
    group: int | None = None  # the KV-cache group whose manager frees inside this call
    pins: bool = False  # vLLM's CPU tier pinning GPU blocks for a copy (touch outside an allocation)

    def __enter__(self) -> TapCall:
        self.calls.append(self)
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.calls.pop()


class TapError(RuntimeError):
    """vLLM did something the tap cannot draw: its events would be wrong, so the step stops."""


class VllmEventTap:
    """Wraps one vLLM scheduler's KVCacheManager, coordinator and BlockPool so that each block
    operation emits its blockviz events on `events`. Request ids are our seq ids as strings."""

    # (the tap's attribute holding vLLM's object, the method wrapped); the wrapper is the tap's
    # method named after it ("_" + the name without its leading underscore)
    WRAPPED = (("manager", "allocate_slots"), ("manager", "free"), ("manager", "pop_blocks_for_free"),
               ("coordinator", "allocate_new_computed_blocks"), ("coordinator", "allocate_new_blocks"),
               ("pool", "touch"), ("pool", "cache_full_blocks"), ("pool", "free_blocks"))
    WRAPPED_PER_GROUP = ("free", "_remove_blocks_in_range")  # each SingleTypeKVCacheManager's

    def __init__(self, scheduler: Any, events: EventBus) -> None:
        from vllm.v1.core.kv_cache_utils import get_block_hash, get_group_id, make_block_hash_with_group_id

        from engine.v1.kv_cache_utils import external_block_hash

        self.events = events
        self.manager = scheduler.kv_cache_manager
        self.coordinator = self.manager.coordinator
        self.pool = self.manager.block_pool
        self.managers = self.coordinator.single_type_managers  # one per KV-cache group
        self.block_size = self.managers[0].block_size
        self._get_block_hash = get_block_hash
        self._get_group_id = get_group_id
        self._key = make_block_hash_with_group_id
        self._external_block_hash = external_block_hash
        self._calls: list[TapCall] = []  # the wrapped calls in progress, outermost first
        self.hashed: dict[int, tuple[int | None, tuple[int, ...]]] = {}  # block id -> (parent hash, tokens)
        # under async scheduling, slots allocated for a token still in flight (vLLM's output
        # placeholder): (seq id, position) -> [(group, block id)], filled when the token is sampled
        self.pending_slots: dict[tuple[int, int], list[tuple[int, int]]] = {}
        for owner, name in self.WRAPPED:
            obj = getattr(self, owner)
            setattr(obj, name, getattr(self, "_" + name.lstrip("_"))(getattr(obj, name)))
        for manager in self.managers:
            for name in self.WRAPPED_PER_GROUP:
                setattr(manager, name, getattr(self, "_group_" + name.lstrip("_"))(manager, getattr(manager, name)))
        self.hook_pool(self.pool, GPU)

    def external(self, key: bytes) -> int:
        """A pool key (hash and group id) as events carry the hash."""
        return self._external_block_hash(self._get_block_hash(key))

    # ------------------------------------------------------------------ the calls in progress

    def calling(self, method: str, **context: Any) -> TapCall:
        """A wrapped call of `method` in progress, with its context, for the calls made inside it
        (`with tap.calling(...)`: open while vLLM's method runs)."""
        return TapCall(self._calls, method, **context)

    def _innermost(self, name: str) -> Any:
        """The innermost call in progress that sets `name` (its value), or None."""
        for call in reversed(self._calls):
            value = getattr(call, name)
            if value is not None and value is not False:
                return value
        return None

    def _allocation(self) -> TapCall | None:
        """The allocate_slots call in progress, if any."""
        for call in reversed(self._calls):
            if call.method == "allocate_slots":
                return call
        return None

    def _refuse(self, what: str) -> TapError:
        inside = " > ".join(c.method for c in self._calls) or "no wrapped call"
        return TapError(f"vLLM {what} inside {inside}: the tap cannot say which request it belongs to "
                        f"(a call order or path engine/vllm_core/event_tap.py does not know)")

    # ------------------------------------------------------------------ vLLM's metrics hook

    def hook_pool(self, pool: Any, device: str) -> None:
        """Make this tap `pool`'s metrics hook (BlockPool.metrics_collector), keeping the
        collector it had, if any, behind it."""
        pool.metrics_collector = PoolHook(self, pool, device, pool.metrics_collector)

    def evicted(self, device: str, pool: Any, block: Any) -> None:
        """`pool` is about to drop `block`'s hash (BlockPool._maybe_evict_cached_block): BlockEvicted."""
        key = block.block_hash
        if key is None or not self.events.active:
            return
        if pool.cached_block_hashes_by_block.get(block.block_id):
            raise self._refuse(f"evicted block {block.block_id}, which holds partial-block prefix entries,")
        self.events.emit(BlockEvicted, device=device, block=block.block_id, block_hash=self.external(key),
                         group=self._get_group_id(key) if device == GPU else 0)

    def allocated(self, device: str, block: Any) -> None:
        """`get_new_blocks` handed out `block`: on the GPU only inside allocate_slots, whose
        allocate_new_blocks (or the CPU tier's loads, allocate_new_computed_blocks) draws it."""
        if device == GPU and self._allocation() is None:
            raise self._refuse(f"allocated block {block.block_id}")

    # ------------------------------------------------------------------ wrappers (each returns the wrapped method)

    def _allocate_slots(self, original):
        def allocate_slots(request, num_new_tokens, num_new_computed_tokens=0, new_computed_blocks=None, **kwargs):
            with self.calling("allocate_slots", request=request,
                              start=request.num_computed_tokens + num_new_computed_tokens):
                return original(request, num_new_tokens, num_new_computed_tokens=num_new_computed_tokens,
                                new_computed_blocks=new_computed_blocks, **kwargs)
        return allocate_slots

    def _touch(self, original):
        def touch(blocks):
            allocation = self._allocation()
            if allocation is None and not self._innermost("pins"):
                raise self._refuse("touched blocks " + ", ".join(str(b.block_id) for b in blocks))
            original(blocks)
            if allocation is None or not self.events.active:  # the CPU tier's pins: no event
                return
            request = allocation.request
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

    def _allocate_new_computed_blocks(self, original):
        def allocate_new_computed_blocks(request_id, new_computed_blocks, *args, **kwargs):
            # the hits join the table here, then (vLLM's CPU tier) fresh blocks for the tokens a
            # load brings back: those are new blocks, announced with allocate_new_blocks' own
            allocation = self._allocation()
            if allocation is None:
                raise self._refuse(f"added computed blocks to request {request_id}'s table")
            allocation.num_old_blocks = [len(manager.req_to_blocks.get(request_id, ())) + sum(1 for _ in hits)
                                         for manager, hits in zip(self.managers, new_computed_blocks)]
            return original(request_id, new_computed_blocks, *args, **kwargs)
        return allocate_new_computed_blocks

    def _allocate_new_blocks(self, original):
        def allocate_new_blocks(request_id, num_tokens, *args, **kwargs):
            allocation = self._allocation()
            if allocation is None:
                raise self._refuse(f"allocated blocks for request {request_id}")
            num_old_blocks = allocation.num_old_blocks
            if num_old_blocks is None:
                num_old_blocks = [len(manager.req_to_blocks.get(request_id, ())) for manager in self.managers]
            new_blocks = original(request_id, num_tokens, *args, **kwargs)
            if self.events.active:
                for manager, num_old in zip(self.managers, num_old_blocks):
                    self._emit_slots(allocation.request, manager.req_to_blocks[request_id], num_old,
                                     allocation.start, num_tokens, manager.kv_cache_group_id)
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
            external = self._external_block_hash
            for index, registered in fresh:
                block = blocks[index]
                if block.block_hash is None:
                    continue
                parent = external(hashes[index - 1]) if index else None
                held = tuple(token_ids[index * block_size : (index + 1) * block_size])
                self.hashed[block.block_id] = (parent, held)
                self.events.emit(BlockHashed, device=GPU, block=block.block_id,
                                 block_hash=external(hashes[index]), parent_hash=parent,
                                 token_ids=held, num_hashed_tokens=(index + 1) * block_size, registered=registered,
                                 group=kv_cache_group_id)
        return cache_full_blocks

    def _free_blocks(self, original):
        def free_blocks(ordered_blocks):
            blocks = list(ordered_blocks)
            seq_id = self._innermost("seq_id")
            if seq_id is None:
                raise self._refuse("freed blocks " + ", ".join(str(b.block_id) for b in blocks))
            if any(b.pool is not None and b.pool is not self.pool for b in blocks):
                raise self._refuse("freed another pool's blocks through the GPU pool")
            original(blocks)
            if not self.events.active:
                return
            group = self._innermost("group")
            blocks = [block for block in blocks if not block.is_null]
            caching = self.pool.enable_caching
            held = [b for b in blocks if b.ref_cnt > 0]
            queued = [b for b in blocks if b.ref_cnt == 0]
            num_cached = sum(1 for b in queued if b.block_hash is not None and caching)
            head, tail = self._free_queue_ends(len(queued) - num_cached, num_cached)
            if {id(b) for b in (*head, *tail)} != {id(b) for b in queued}:
                raise TapError(f"vLLM's free queue does not hold blocks {[b.block_id for b in queued]} where the "
                               "tap reads them (the head: blocks without a hash, the tail: cached ones)")
            for block in (*held, *reversed(head), *tail):
                self.events.emit(BlockFreed, device=GPU, block=block.block_id, seq_id=seq_id,
                                 ref_count=block.ref_cnt, cached=block.block_hash is not None and caching,
                                 group=self._group_of(block) if group is None else group)
        return free_blocks

    def _free_queue_ends(self, num_head: int, num_tail: int) -> tuple[list, list]:
        """The first `num_head` and the last `num_tail` blocks of vLLM's FreeKVCacheBlockQueue, each
        in queue order: where vLLM's `free_blocks` just put the blocks it freed (prepend_n to the
        head, append_n to the tail)."""
        queue = self.pool.free_block_queue
        head, node = [], queue.fake_free_list_head.next_free_block
        while len(head) < num_head and node is not queue.fake_free_list_tail:
            head.append(node)
            node = node.next_free_block
        tail, node = [], queue.fake_free_list_tail.prev_free_block
        while len(tail) < num_tail and node is not queue.fake_free_list_head:
            tail.append(node)
            node = node.prev_free_block
        return head, tail[::-1]

    def _group_of(self, block: Any) -> int:
        """The KV-cache group of a block freed by no group's manager (a pin vLLM's CPU tier
        releases): the group its hash is keyed by, else the group whose table holds it."""
        if block.block_hash is not None:
            return self._get_group_id(block.block_hash)
        for manager in self.managers:
            if any(b is block for blocks in manager.req_to_blocks.values() for b in blocks):
                return manager.kv_cache_group_id
        return 0

    def _free(self, original):
        def free(request):
            # a table with a block in it: vLLM's req_to_blocks is a defaultdict, and a lookup that
            # allocates nothing (a preempted request tried again at the head of waiting) leaves an
            # empty entry behind, which holds no table that SequenceFreed could end
            had_blocks = any(manager.req_to_blocks.get(request.request_id) for manager in self.managers)
            with self.calling("free", seq_id=int(request.request_id)):
                original(request)
            if had_blocks and self.events.active:
                self.events.emit(SequenceFreed, seq_id=int(request.request_id))
        return free

    def _pop_blocks_for_free(self, original):
        def pop_blocks_for_free(request):
            raise self._refuse(f"deferred freeing request {request.request_id}'s blocks "
                               f"(Scheduler.defer_block_free: overlapping batches with a KV connector)")
        return pop_blocks_for_free

    def _group_free(self, manager, original):
        """One group's manager freeing a request's table: its frees name that group."""
        def free(request_id):
            with self.calling("free", group=manager.kv_cache_group_id):
                return original(request_id)
        return free

    def _group_remove_blocks_in_range(self, manager, original):
        """A sliding window letting blocks go: BlocksSkipped for the slots it nulls (walking back
        from the range's end to a null one, as vLLM does), then its frees, the request's in that group."""
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
            with self.calling("_remove_blocks_in_range", seq_id=int(request_id), group=manager.kv_cache_group_id):
                return original(request_id, first_block, last_block)
        return remove_blocks_in_range

    # ------------------------------------------------------------------ events

    def _emit_slots(self, request: Any, blocks: list, num_old_blocks: int, start: int, end: int, group: int = 0) -> None:
        """Tokens start..end-1 got slots in one group's table `blocks` (engine/v1's
        KVCacheManager._emit_slots, over vLLM's own block table and the request's own tokens)."""
        bs = self.block_size
        seq_id = int(request.request_id)
        token_ids = request.all_token_ids
        known = len(token_ids)  # past it, slots for tokens in flight (async scheduling's placeholders)
        for pos in range(start, min(end, num_old_blocks * bs)):
            if pos >= known:
                self.pending_slots.setdefault((seq_id, pos), []).append((group, blocks[pos // bs].block_id))
                continue
            self.events.emit(SlotAppended, seq_id=seq_id, device=GPU, logical_index=pos // bs,
                             block=blocks[pos // bs].block_id, offset=pos % bs, token_id=token_ids[pos])
        for index in range(num_old_blocks, len(blocks)):
            block = blocks[index]
            held = tuple(token_ids[max(start, index * bs) : min(end, (index + 1) * bs)])
            self.events.emit(BlockAllocated, device=GPU, block=block.block_id, seq_ids=(seq_id,),
                             logical_index=index, ref_count=block.ref_cnt, block_hash=None, token_ids=held,
                             group=group)
            for pos in range(max(start, index * bs, known), min(end, (index + 1) * bs)):
                self.pending_slots.setdefault((seq_id, pos), []).append((group, block.block_id))

    def fill_slots(self, seq_id: int, pos: int, token_id: int) -> None:
        """The token at `pos` of sequence `seq_id` was sampled: SlotAppended for each slot
        allocate_slots gave it while it was in flight (vLLM's AsyncScheduler allocates for its
        output placeholders), in every group whose table still holds that block there (a slot a
        preemption, an abort or a window let go since is dropped)."""
        slots = self.pending_slots.pop((seq_id, pos), ())
        if not slots or not self.events.active:
            return
        bs = self.block_size
        for group, block_id in slots:
            table = self.managers[group].req_to_blocks.get(str(seq_id)) or ()
            index = pos // bs
            if index < len(table) and table[index].block_id == block_id:
                self.events.emit(SlotAppended, seq_id=seq_id, device=GPU, logical_index=index, block=block_id,
                                 offset=pos % bs, token_id=token_id)

    def forget_slots(self, seq_id: int) -> None:
        """Drop a finished sequence's slots for tokens it will never take."""
        for key in [key for key in self.pending_slots if key[0] == seq_id]:
            del self.pending_slots[key]


class PoolHook:
    """vLLM's metrics hook on one BlockPool (`BlockPool.metrics_collector`, the interface of vLLM's
    `KVCacheMetricsCollector`: on_block_allocated / on_block_accessed / on_block_evicted / reset /
    drain_events), reporting to the tap; a collector the pool had keeps getting every call."""

    def __init__(self, tap: VllmEventTap, pool: Any, device: str, inner: Any = None) -> None:
        self.tap = tap
        self.pool = pool
        self.device = device
        self.inner = inner

    def on_block_allocated(self, block: Any) -> None:
        if self.inner:
            self.inner.on_block_allocated(block)
        self.tap.allocated(self.device, block)

    def on_block_accessed(self, block: Any) -> None:
        if self.inner:
            self.inner.on_block_accessed(block)

    def on_block_evicted(self, block: Any) -> None:
        if self.inner:
            self.inner.on_block_evicted(block)
        self.tap.evicted(self.device, self.pool, block)

    def reset(self) -> None:
        raise self.tap._refuse(f"reset the {self.device} prefix cache (BlockPool.reset_prefix_cache)")

    def drain_events(self) -> list:
        return self.inner.drain_events() if self.inner else []

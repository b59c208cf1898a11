"""The contract between the engine and every view: frozen event records and the EventBus.

Each mutation of the block manager, and each engine step, emits one event synchronously. Events carry
plain values only (ints, strs, bools, tuples), copied at emit time, so a subscriber can keep them, a
trace file can store them, and a reducer above the engine can rebuild the whole picture from them.

An event is a frozen `msgspec.Struct` (as vLLM's own KV-cache events are,
vllm/distributed/kv_events.py): declared like a dataclass, built in C, immutable, without a
`__dict__`, and untracked by the garbage collector (its fields never hold a reference cycle).
Its `type` names it in a trace; on disk an event is one JSON object, `{"type": ..., "seq_no": ...,
<fields in declaration order>}`.

KV-cache groups (vLLM's kv_cache_group_id, engine/v1/kv_cache_interface.py): a block belongs to one
group, and a request has one table per group. The events that place a block in a table, cache it,
evict it or free it carry its `group` (0 in a run with one group, and then left out on disk), and
BlocksSkipped says where a sliding-window group put the null block in place of blocks that left
its window.

Call sites guard emits with `if bus.active:` so that an engine with no subscriber pays one attribute
check per mutation and builds no event at all.
"""

from __future__ import annotations

import itertools
import json
import logging
from typing import Any, Callable, ClassVar, Iterable

import msgspec

logger = logging.getLogger("engine")


class Event(msgspec.Struct, frozen=True, gc=False):
    """Base of every event: `seq_no` increases by one per emitted event on a bus."""

    type: ClassVar[str] = "event"

    seq_no: int

    def to_dict(self) -> dict[str, Any]:
        """The event as plain values; a `group` of 0 and an empty `revived` are left out, so a run
        with one KV-cache group, or a swap that found no block by hash, writes no field for them."""
        data = {"type": self.type, **msgspec.structs.asdict(self)}
        if data.get("group") == 0:
            del data["group"]
        if data.get("revived") == ():
            del data["revived"]
        return data

    def to_json(self) -> str:
        """One line of a trace file (tuples become JSON lists)."""
        return json.dumps(self.to_dict(), separators=(",", ":"))


# ---------------------------------------------------------------- block events (block manager)


class BlockAllocated(Event):
    """A fresh physical block enters the tables of `seq_ids` at `logical_index`
    (vLLM v0 allocate / append_slots allocating a new block). `token_ids` are the tokens it holds."""

    type: ClassVar[str] = "block_allocated"

    device: str
    block: int
    seq_ids: tuple[int, ...]
    logical_index: int
    ref_count: int
    block_hash: int | None
    token_ids: tuple[int, ...]
    group: int = 0  # its KV-cache group (vLLM kv_cache_group_id); 0 in a run with one group


class PrefixCacheHit(Event):
    """A registered, hashed block is reused for `seq_ids` at `logical_index` instead of recomputing
    (nano-vllm's hash_to_block_id hit; a cached-free block is revived). The block may have been
    allocated earlier in the same prefill step: that step's forward writes it once for both."""

    type: ClassVar[str] = "prefix_cache_hit"

    device: str
    block: int
    seq_ids: tuple[int, ...]
    logical_index: int
    ref_count: int
    block_hash: int
    token_ids: tuple[int, ...]
    group: int = 0  # its KV-cache group (vLLM kv_cache_group_id); 0 in a run with one group


class BlockHashed(Event):
    """A full block got its chained hash (nano-vllm BlockManager.compute_hash). `registered` is False when an
    identical block already sits in the hash map (the map is never overwritten)."""

    type: ClassVar[str] = "block_hashed"

    device: str
    block: int
    block_hash: int
    parent_hash: int | None
    token_ids: tuple[int, ...]
    num_hashed_tokens: int
    registered: bool
    group: int = 0  # its KV-cache group (vLLM kv_cache_group_id); 0 in a run with one group


class SlotAppended(Event):
    """Sequence `seq_id` claimed slot `offset` of `block` for `token_id` (vLLM v0 append_slot)."""

    type: ClassVar[str] = "slot_appended"

    seq_id: int
    device: str
    logical_index: int
    block: int
    offset: int
    token_id: int


class CopyOnWrite(Event):
    """The last block of `seq_id` was shared, so it moves to a fresh `dst_block` holding a copy of
    `token_ids`; `src_block` keeps `src_ref_count` references (vLLM v0 append_slot's CoW pair)."""

    type: ClassVar[str] = "copy_on_write"

    seq_id: int
    device: str
    logical_index: int
    src_block: int
    dst_block: int
    src_ref_count: int
    token_ids: tuple[int, ...]


class Forked(Event):
    """`child_seq_id` shares every block of `parent_seq_id`'s table (vLLM v0 fork): each ref +1."""

    type: ClassVar[str] = "fork"

    parent_seq_id: int
    child_seq_id: int
    device: str
    blocks: tuple[int, ...]


class SwappedOut(Event):
    """Request `request_id`'s sequences moved GPU -> CPU; `mapping` holds (gpu_block, cpu_block)
    pairs, a shared block copied once (vLLM v0 swap_out). `revived` lists the CPU blocks found by
    the GPU block's hash (vLLM v0 _swap_block_table with prefix caching): each already held that
    K/V, free but cached (revived) or in use (shared), so nothing was copied into it."""

    type: ClassVar[str] = "swap_out"

    request_id: str
    seq_ids: tuple[int, ...]
    mapping: tuple[tuple[int, int], ...]
    revived: tuple[int, ...] = ()


class SwappedIn(Event):
    """Request `request_id`'s sequences moved CPU -> GPU; `mapping` holds (cpu_block, gpu_block).
    `revived` lists the GPU blocks found by the CPU block's hash, as in SwappedOut: free but cached
    ones revived, or ones in use shared; nothing was copied into them."""

    type: ClassVar[str] = "swap_in"

    request_id: str
    seq_ids: tuple[int, ...]
    mapping: tuple[tuple[int, int], ...]
    revived: tuple[int, ...] = ()


class BlockFreed(Event):
    """`seq_id` dropped its reference to `block`. At ref count 0 the block is either back on the
    free list (`cached` False) or free-but-cached, still a prefix-cache hit until evicted."""

    type: ClassVar[str] = "block_freed"

    device: str
    block: int
    seq_id: int
    ref_count: int
    cached: bool
    group: int = 0  # its KV-cache group (vLLM kv_cache_group_id); 0 in a run with one group


class BlocksSkipped(Event):
    """A sliding-window group of `seq_id` let go of the blocks no later token reads: `blocks`, at
    `logical_indices` of its table in `group`, now hold the null block (block 0) there (vLLM
    SingleTypeKVCacheManager.remove_skipped_blocks, at the start of allocate_slots). The BlockFreed
    events for those blocks follow (the cause before its effects)."""

    type: ClassVar[str] = "blocks_skipped"

    seq_id: int
    logical_indices: tuple[int, ...]
    blocks: tuple[int, ...]
    group: int = 0  # its KV-cache group (vLLM kv_cache_group_id); 0 in a run with one group


class SequenceFreed(Event):
    """`seq_id`'s block table is gone (after its BlockFreed events)."""

    type: ClassVar[str] = "sequence_freed"

    seq_id: int


class BlockEvicted(Event):
    """A free-but-cached block lost its hash so it can be reused (LRU, vLLM v0's LRUEvictor)."""

    type: ClassVar[str] = "block_evicted"

    device: str
    block: int
    block_hash: int
    group: int = 0  # its KV-cache group (vLLM kv_cache_group_id); 0 in a run with one group


class OffloadStored(Event):
    """vLLM v1's CPU tier takes copies of full, hashed GPU blocks (vLLM 0.33
    `SimpleCPUOffloadScheduler._prepare_eager_store_specs` and `_queue_finished_eager_store`, eager
    mode): `mapping` holds (gpu_block, cpu_block) pairs; each GPU block is pinned (ref count + 1) until
    the copy completes and vLLM releases it (a BlockFreed with seq_id -1); each CPU block is then a
    free-but-cached block of the CPU pool holding `block_hashes[i]` (its parent `parent_hashes[i]`,
    its tokens `token_ids[i]`). `medium` is the tier as vLLM's KV events name it ("CPU")."""

    type: ClassVar[str] = "offload_store"

    medium: str
    mapping: tuple[tuple[int, int], ...]
    block_hashes: tuple[int, ...]
    parent_hashes: tuple[int | None, ...]
    token_ids: tuple[tuple[int, ...], ...]


class OffloadLoaded(Event):
    """A request missed these blocks on the GPU and vLLM's CPU tier holds them: their K/V is copied
    back instead of recomputed (vLLM 0.33 `SimpleCPUOffloadScheduler.get_num_new_matched_tokens` and
    `update_state_after_alloc`). `mapping` holds (cpu_block, gpu_block) pairs, the GPU blocks just
    allocated to `seq_id` and pinned until the load completes (a BlockFreed with seq_id -1);
    `num_tokens` tokens come back, counted as prefix-cache hits."""

    type: ClassVar[str] = "offload_load"

    medium: str
    request_id: str
    seq_id: int
    mapping: tuple[tuple[int, int], ...]
    num_tokens: int


# ---------------------------------------------------------------- engine events (scheduler, engine)


class RequestAdded(Event):
    """A request joined the waiting queue."""

    type: ClassVar[str] = "request_added"

    request_id: str
    seq_ids: tuple[int, ...]
    prompt: str
    prompt_token_ids: tuple[int, ...]
    prompt_tokens_text: tuple[str, ...]
    n: int
    max_tokens: int


class StepStarted(Event):
    """One engine step begins: a prefill or a decode over `seq_ids`, `num_tokens` tokens in all."""

    type: ClassVar[str] = "step_started"

    step: int
    kind: str
    seq_ids: tuple[int, ...]
    num_tokens: int


class TokensScheduled(Event):
    """vLLM v1 only: the tokens each sequence computes this step, after StepStarted (vLLM v1
    SchedulerOutput.num_scheduled_tokens). Sequence `seq_ids[i]` had `num_computed_tokens[i]` of its
    `num_tokens[i]` tokens computed and computes `num_new_tokens[i]` more: fewer than the rest is a
    prefill chunk; one, the last token, a decode."""

    type: ClassVar[str] = "tokens_scheduled"

    step: int
    seq_ids: tuple[int, ...]
    num_computed_tokens: tuple[int, ...]
    num_new_tokens: tuple[int, ...]
    num_tokens: tuple[int, ...]


class TokenGenerated(Event):
    """`seq_id` sampled `token_id` (its text piece `text`) at position `position`."""

    type: ClassVar[str] = "token_generated"

    seq_id: int
    token_id: int
    text: str
    position: int


class Preempted(Event):
    """The scheduler preempted a request to make room: mode "swap" or "recompute"; with recompute
    `num_tokens_lost` tokens' K/V must be computed again."""

    type: ClassVar[str] = "preempted"

    request_id: str
    seq_ids: tuple[int, ...]
    mode: str
    reason: str
    num_tokens_lost: int


class SequenceFinished(Event):
    """`seq_id` stopped: reason "stop", "length", "abort" or "ignored" (with `detail`)."""

    type: ClassVar[str] = "sequence_finished"

    seq_id: int
    request_id: str
    reason: str
    detail: str


# ---------------------------------------------------------------- radix tree events (kv_manager "sglang")
#
# SGLang's RadixCache (sglang/srt/mem_cache/radix_cache.py) keeps cached prefixes as a tree of
# TreeNodes: each holds a run of tokens (its `key`) and their KV slots (its `value`), children keyed
# by their first page. These events rebuild that tree exactly (node ids are SGLang's TreeNode.id counted from its cache's root; a
# parent_id of None is the root, which holds no tokens): a view draws the tree from them alone.


class RadixNodeInserted(Event):
    """A node joined the tree under `parent_id` (RadixCache._insert_helper adding a leaf): its token
    run, the KV slot of each token, and its lock_ref (requests holding its path)."""

    type: ClassVar[str] = "radix_node_inserted"

    node_id: int
    parent_id: int | None
    token_ids: tuple[int, ...]
    slots: tuple[int, ...]
    lock_ref: int


class RadixNodeSplit(Event):
    """A node split where a new key diverged from it (RadixCache._split_node): a new node
    `new_node_id` takes the first `num_tokens` tokens and slots and the node's place under its
    parent, with the node's lock_ref; the node keeps its id and the rest, as the new node's child."""

    type: ClassVar[str] = "radix_node_split"

    node_id: int
    new_node_id: int
    num_tokens: int


class RadixLockRef(Event):
    """A node's lock_ref changed (RadixCache.inc_lock_ref / dec_lock_ref walk from a request's last
    node to the root): a node with lock_ref > 0 is protected, one with 0 evictable."""

    type: ClassVar[str] = "radix_lock_ref"

    node_id: int
    lock_ref: int


class RadixEvict(Event):
    """RadixCache.evict was asked to free `num_tokens` KV slots (EvictParams.num_tokens: the
    allocator's shortfall, BaseTokenToKVPoolAllocator.evict_to_free_tokens) and freed
    `num_tokens_evicted` (EvictResult): whole unlocked leaves in the eviction policy's order, so
    often more than asked. The RadixNodeEvicted events after it are the leaves it took."""

    type: ClassVar[str] = "radix_evict"

    num_tokens: int
    num_tokens_evicted: int


class RadixNodeEvicted(Event):
    """A leaf left the tree and its slots went back to the allocator (RadixCache.evict, leaves
    with lock_ref 0 in the eviction policy's order, _delete_leaf)."""

    type: ClassVar[str] = "radix_node_evicted"

    node_id: int
    token_ids: tuple[int, ...]
    slots: tuple[int, ...]


class KVDigest(Event):
    """A short digest of a block's real K/V contents (its first page's first head, K then V: the
    first layer's, or the first layer of the KV-cache group holding the block) after
    the engine wrote or moved it: CacheEngine.kv_digests. Written blocks are hashed at the end of
    each step, or, when the engine holds digests back (LLMEngine.kv_digests_per_step False, as a
    live UI's free run at full speed does), once when emit_kv_digests() is called."""

    type: ClassVar[str] = "kv_digest"

    device: str
    block: int
    digest: str


class StepFinished(Event):
    """One engine step ended; `duration_s` is wall time (never shown in deterministic snapshots)."""

    type: ClassVar[str] = "step_finished"

    step: int
    kind: str
    num_tokens: int
    duration_s: float


EVENT_TYPES: dict[str, type[Event]] = {cls.type: cls for cls in Event.__subclasses__()}


def event_classes(names: str | Iterable[str]) -> frozenset[type[Event]]:
    """The event records named by `names`: one type name ("copy_on_write"), a comma-separated list
    ("swap_out,block_evicted") or an iterable of names. A ValueError names an unknown one (or none
    given) and lists every name."""
    parts = names.split(",") if isinstance(names, str) else list(names)
    found = {name.strip() for name in parts if name.strip()}
    unknown = sorted(found - set(EVENT_TYPES))
    if unknown or not found:
        raise ValueError(f"unknown event kind {', '.join(map(repr, unknown)) or '(none given)'}: the kinds are "
                         f"{', '.join(sorted(EVENT_TYPES))}")
    return frozenset(EVENT_TYPES[name] for name in found)


def kind_names(classes: Iterable[type[Event]]) -> list[str]:
    """The type names of event records, sorted (for a line that lists breakpoints)."""
    return sorted(cls.type for cls in classes)


def event_from_dict(data: dict[str, Any]) -> Event:
    """Rebuild an event from `to_dict()` output, checking every field's type (JSON lists become
    tuples again); a ValueError says what is wrong."""
    kind = data.get("type")
    cls = EVENT_TYPES.get(kind)  # type: ignore[arg-type]
    if cls is None:
        raise ValueError(f"unknown event type {kind!r}")
    return msgspec.convert(data, cls)


def event_from_json(line: str) -> Event:
    return event_from_dict(json.loads(line))


# ---------------------------------------------------------------- the bus

Subscriber = Callable[[Event], None]


class EventBus:
    """Synchronous fan-out of events to subscribers.

    `active` is True while at least one subscriber is attached; emit sites check it before building
    an event. A subscriber that raises is detached and its error recorded in `errors` (and logged);
    the engine goes on.

    `deliver` hands an already-built event to the subscribers: it is the sole subscriber itself
    when there is one (the common case: a view or a trace writer), else a fan-out that isolates
    each subscriber's errors.
    """

    __slots__ = ("_subscribers", "seq_nos", "deliver", "active", "errors")

    def __init__(self) -> None:
        self._subscribers: list[Subscriber] = []
        self.seq_nos = itertools.count()  # next(seq_nos) is the next event's seq_no
        self.deliver: Subscriber = _nobody
        self.active = False
        self.errors: list[tuple[Subscriber, BaseException]] = []

    def subscribe(self, subscriber: Subscriber) -> Callable[[], None]:
        """Attach `subscriber`; returns a function that detaches it."""
        if not callable(subscriber):
            raise TypeError(f"subscriber must be callable, got {subscriber!r}")
        self._subscribers.append(subscriber)
        self._rewire()
        return lambda: self.unsubscribe(subscriber)

    def unsubscribe(self, subscriber: Subscriber) -> None:
        if subscriber in self._subscribers:
            self._subscribers.remove(subscriber)
        self._rewire()

    def _rewire(self) -> None:
        subscribers = self._subscribers
        self.active = bool(subscribers)
        self.deliver = subscribers[0] if len(subscribers) == 1 else self._fan_out if subscribers else _nobody

    @property
    def num_subscribers(self) -> int:
        return len(self._subscribers)

    def emit(self, cls: type[Event], /, **fields: Any) -> Event:
        """Build a `cls` event numbered with the next seq_no from its other fields, by name, and
        deliver it to every subscriber."""
        return self.publish(cls(next(self.seq_nos), **fields))

    def publish(self, event: Event) -> Event:
        """Deliver an event the caller built, numbered `next(bus.seq_nos)` (the per-token paths
        build theirs: `bus.publish(SlotAppended(next(bus.seq_nos), seq_id=..., ...))` costs less
        than packing the fields through emit)."""
        try:
            self.deliver(event)
        except Exception as exc:  # a broken view must never break the engine
            self._detach(self.deliver, exc)
        return event

    def _fan_out(self, event: Event) -> None:
        """Deliver to several subscribers; one that raises is detached, the others still get it."""
        for subscriber in tuple(self._subscribers):
            try:
                subscriber(event)
            except Exception as exc:
                self._detach(subscriber, exc)

    def _detach(self, subscriber: Subscriber, exc: Exception) -> None:
        if subscriber not in self._subscribers:
            return
        self.unsubscribe(subscriber)
        self.errors.append((subscriber, exc))
        logger.warning("event subscriber %r raised %r and was detached", subscriber, exc)


def _nobody(event: Event) -> None:
    """What `deliver` is with no subscriber (emit sites check `active` first)."""

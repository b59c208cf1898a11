"""The contract between the engine and every view: frozen event records and the EventBus.

Each mutation of the block manager, and each engine step, emits one event synchronously. Events carry
plain values only (ints, strs, bools, tuples), copied at emit time, so a subscriber can keep them, a
trace file can store them, and a reducer (engine/reducer.py) can rebuild the whole picture from them.

Call sites guard emits with `if bus.active:` so that an engine with no subscriber pays one attribute
check per mutation and builds no event at all.
"""

from __future__ import annotations

import json
import logging
from dataclasses import asdict, dataclass, fields
from typing import Any, Callable, ClassVar

logger = logging.getLogger("engine")

EVENT_TYPES: dict[str, type["Event"]] = {}


@dataclass(frozen=True, slots=True)
class Event:
    """Base of every event: `seq_no` increases by one per emitted event on a bus."""

    seq_no: int
    type: ClassVar[str] = "event"

    def to_dict(self) -> dict[str, Any]:
        return {"type": self.type, **asdict(self)}

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), separators=(",", ":"))


def _register(cls: type[Event]) -> type[Event]:
    """Record the event type by name and give it a fast __init__.

    A frozen dataclass's generated __init__ calls object.__setattr__ once per field, which made an
    emit cost several times an append_slots; setting the slots through their descriptors keeps the
    instance just as frozen (assignment still raises FrozenInstanceError) at a fraction of the cost.
    """
    names = [f.name for f in fields(cls)]
    namespace = {f"_set_{name}": getattr(cls, name).__set__ for name in names}
    body = "".join(f"    _set_{name}(self, {name})\n" for name in names)
    exec(f"def __init__(self, {', '.join(names)}):\n{body}", namespace)
    cls.__init__ = namespace["__init__"]
    EVENT_TYPES[cls.type] = cls
    return cls


def _tuplify(value: Any) -> Any:
    if isinstance(value, list):
        return tuple(_tuplify(v) for v in value)
    return value


def event_from_dict(data: dict[str, Any]) -> Event:
    """Rebuild an event from `to_dict()` output (JSON lists become tuples again)."""
    kind = data.get("type")
    cls = EVENT_TYPES.get(kind)  # type: ignore[arg-type]
    if cls is None:
        raise ValueError(f"unknown event type {kind!r}")
    names = {f.name for f in fields(cls)}
    missing = names - data.keys()
    if missing:
        raise ValueError(f"event {kind!r} lacks field(s) {', '.join(sorted(missing))}")
    return cls(**{name: _tuplify(data[name]) for name in names})


def event_from_json(line: str) -> Event:
    return event_from_dict(json.loads(line))


# ---------------------------------------------------------------- block events (block manager)


@_register
@dataclass(frozen=True, slots=True)
class BlockAllocated(Event):
    """A fresh physical block enters the tables of `seq_ids` at `logical_index`
    (vLLM v0 allocate / append_slots allocating a new block). `token_ids` are the tokens it holds."""

    device: str
    block: int
    seq_ids: tuple[int, ...]
    logical_index: int
    ref_count: int
    block_hash: int | None
    token_ids: tuple[int, ...]
    type: ClassVar[str] = "block_allocated"


@_register
@dataclass(frozen=True, slots=True)
class PrefixCacheHit(Event):
    """A computed, hashed block is reused for `seq_ids` at `logical_index` instead of recomputing
    (seed 002: hash_to_block_id hit; a cached-free block is revived)."""

    device: str
    block: int
    seq_ids: tuple[int, ...]
    logical_index: int
    ref_count: int
    block_hash: int
    token_ids: tuple[int, ...]
    type: ClassVar[str] = "prefix_cache_hit"


@_register
@dataclass(frozen=True, slots=True)
class BlockHashed(Event):
    """A full block got its chained hash (seed 002 compute_hash). `registered` is False when an
    identical block already sits in the hash map (the map is never overwritten)."""

    device: str
    block: int
    block_hash: int
    parent_hash: int | None
    token_ids: tuple[int, ...]
    num_hashed_tokens: int
    registered: bool
    type: ClassVar[str] = "block_hashed"


@_register
@dataclass(frozen=True, slots=True)
class SlotAppended(Event):
    """Sequence `seq_id` claimed slot `offset` of `block` for `token_id` (vLLM v0 append_slot)."""

    seq_id: int
    device: str
    logical_index: int
    block: int
    offset: int
    token_id: int
    type: ClassVar[str] = "slot_appended"


@_register
@dataclass(frozen=True, slots=True)
class CopyOnWrite(Event):
    """The last block of `seq_id` was shared, so it moves to a fresh `dst_block` holding a copy of
    `token_ids`; `src_block` keeps `src_ref_count` references (vLLM v0 append_slot's CoW pair)."""

    seq_id: int
    device: str
    logical_index: int
    src_block: int
    dst_block: int
    src_ref_count: int
    token_ids: tuple[int, ...]
    type: ClassVar[str] = "copy_on_write"


@_register
@dataclass(frozen=True, slots=True)
class Forked(Event):
    """`child_seq_id` shares every block of `parent_seq_id`'s table (vLLM v0 fork): each ref +1."""

    parent_seq_id: int
    child_seq_id: int
    device: str
    blocks: tuple[int, ...]
    type: ClassVar[str] = "fork"


@_register
@dataclass(frozen=True, slots=True)
class SwappedOut(Event):
    """Request `request_id`'s sequences moved GPU -> CPU; `mapping` holds (gpu_block, cpu_block)
    pairs, a shared block copied once (vLLM v0 swap_out)."""

    request_id: str
    seq_ids: tuple[int, ...]
    mapping: tuple[tuple[int, int], ...]
    type: ClassVar[str] = "swap_out"


@_register
@dataclass(frozen=True, slots=True)
class SwappedIn(Event):
    """Request `request_id`'s sequences moved CPU -> GPU; `mapping` holds (cpu_block, gpu_block)."""

    request_id: str
    seq_ids: tuple[int, ...]
    mapping: tuple[tuple[int, int], ...]
    type: ClassVar[str] = "swap_in"


@_register
@dataclass(frozen=True, slots=True)
class BlockFreed(Event):
    """`seq_id` dropped its reference to `block`. At ref count 0 the block is either back on the
    free list (`cached` False) or free-but-cached, still a prefix-cache hit until evicted."""

    device: str
    block: int
    seq_id: int
    ref_count: int
    cached: bool
    type: ClassVar[str] = "block_freed"


@_register
@dataclass(frozen=True, slots=True)
class SequenceFreed(Event):
    """`seq_id`'s block table is gone (after its BlockFreed events)."""

    seq_id: int
    type: ClassVar[str] = "sequence_freed"


@_register
@dataclass(frozen=True, slots=True)
class BlockEvicted(Event):
    """A free-but-cached block lost its hash so it can be reused (LRU, seed 002 / vLLM LRUEvictor)."""

    device: str
    block: int
    block_hash: int
    type: ClassVar[str] = "block_evicted"


# ---------------------------------------------------------------- engine events (scheduler, engine)


@_register
@dataclass(frozen=True, slots=True)
class RequestAdded(Event):
    """A request joined the waiting queue."""

    request_id: str
    seq_ids: tuple[int, ...]
    prompt: str
    prompt_token_ids: tuple[int, ...]
    prompt_tokens_text: tuple[str, ...]
    n: int
    max_tokens: int
    type: ClassVar[str] = "request_added"


@_register
@dataclass(frozen=True, slots=True)
class StepStarted(Event):
    """One engine step begins: a prefill or a decode over `seq_ids`, `num_tokens` tokens in all."""

    step: int
    kind: str
    seq_ids: tuple[int, ...]
    num_tokens: int
    type: ClassVar[str] = "step_started"


@_register
@dataclass(frozen=True, slots=True)
class TokenGenerated(Event):
    """`seq_id` sampled `token_id` (its text piece `text`) at position `position`."""

    seq_id: int
    token_id: int
    text: str
    position: int
    type: ClassVar[str] = "token_generated"


@_register
@dataclass(frozen=True, slots=True)
class Preempted(Event):
    """The scheduler preempted a request to make room: mode "swap" or "recompute"; with recompute
    `num_tokens_lost` tokens' K/V must be computed again."""

    request_id: str
    seq_ids: tuple[int, ...]
    mode: str
    reason: str
    num_tokens_lost: int
    type: ClassVar[str] = "preempted"


@_register
@dataclass(frozen=True, slots=True)
class SequenceFinished(Event):
    """`seq_id` stopped: reason "stop", "length", "abort" or "ignored" (with `detail`)."""

    seq_id: int
    request_id: str
    reason: str
    detail: str
    type: ClassVar[str] = "sequence_finished"


@_register
@dataclass(frozen=True, slots=True)
class KVDigest(Event):
    """A short digest of a block's real K/V contents after the engine wrote or moved it."""

    device: str
    block: int
    digest: str
    type: ClassVar[str] = "kv_digest"


@_register
@dataclass(frozen=True, slots=True)
class StepFinished(Event):
    """One engine step ended; `duration_s` is wall time (never shown in deterministic snapshots)."""

    step: int
    kind: str
    num_tokens: int
    duration_s: float
    type: ClassVar[str] = "step_finished"


# ---------------------------------------------------------------- the bus

Subscriber = Callable[[Event], None]


class EventBus:
    """Synchronous fan-out of events to subscribers.

    `active` is True while at least one subscriber is attached; emit sites check it before building
    an event. A subscriber that raises is detached and its error recorded in `errors` (and logged);
    the engine goes on.
    """

    __slots__ = ("_subscribers", "_next_seq_no", "active", "errors")

    def __init__(self) -> None:
        self._subscribers: list[Subscriber] = []
        self._next_seq_no = 0
        self.active = False
        self.errors: list[tuple[Subscriber, BaseException]] = []

    def subscribe(self, subscriber: Subscriber) -> Callable[[], None]:
        """Attach `subscriber`; returns a function that detaches it."""
        if not callable(subscriber):
            raise TypeError(f"subscriber must be callable, got {subscriber!r}")
        self._subscribers.append(subscriber)
        self.active = True
        return lambda: self.unsubscribe(subscriber)

    def unsubscribe(self, subscriber: Subscriber) -> None:
        if subscriber in self._subscribers:
            self._subscribers.remove(subscriber)
        self.active = bool(self._subscribers)

    @property
    def num_subscribers(self) -> int:
        return len(self._subscribers)

    @property
    def next_seq_no(self) -> int:
        return self._next_seq_no

    def emit(self, cls: type[Event], *args: Any, **values: Any) -> Event:
        """Build a `cls` event with the next sequence number and deliver it to every subscriber.

        Field values follow `seq_no` in declaration order, positionally or by name."""
        seq_no = self._next_seq_no
        self._next_seq_no = seq_no + 1
        event = cls(seq_no, *args, **values) if values else cls(seq_no, *args)
        subscriber = None
        try:
            for subscriber in self._subscribers:
                subscriber(event)
        except Exception as exc:  # a broken view must never break the engine
            self._recover(event, subscriber, exc)
        return event

    def _recover(self, event: Event, failed: Subscriber, exc: Exception) -> None:
        """Detach the subscriber that raised, then deliver `event` to the ones after it."""
        index = self._subscribers.index(failed)
        rest = self._subscribers[index + 1 :]
        self.unsubscribe(failed)
        self.errors.append((failed, exc))
        logger.warning("event subscriber %r raised %r and was detached", failed, exc)
        for subscriber in rest:
            try:
                subscriber(event)
            except Exception as later_exc:
                self.unsubscribe(subscriber)
                self.errors.append((subscriber, later_exc))
                logger.warning("event subscriber %r raised %r and was detached", subscriber, later_exc)

"""The contract between the engine and every view: frozen event records and the EventBus.

Each mutation of the block manager, and each engine step, emits one event synchronously. Events carry
plain values only (ints, strs, bools, tuples), copied at emit time, so a subscriber can keep them, a
trace file can store them, and a reducer (engine/reducer.py) can rebuild the whole picture from them.

Call sites guard emits with `if bus.active:` so that an engine with no subscriber pays one attribute
check per mutation and builds no event at all.
"""

from __future__ import annotations

import itertools
import json
import logging
from dataclasses import asdict, dataclass, fields
from operator import itemgetter
from typing import Any, Callable, ClassVar

logger = logging.getLogger("engine")

EVENT_TYPES: dict[str, type["Event"]] = {}


_type_call = type.__call__  # type_call itself, whatever a metaclass's __call__ says


class _EventType(type):
    """Every event class stores its fields in the tuple it is: no per-instance __dict__.

    Calling an event class with its fields, positionally or by name, is a dataclass's
    constructor (written in Python per class: `_from_fields`). The classes themselves keep
    tuple's C `__new__`, so `cls.from_values(values)` builds an event from its field values in
    one C call: the engine's hot paths and the pipe of the live TUI use that."""

    def __new__(mcls, name: str, bases: tuple[type, ...], namespace: dict[str, Any], **kwargs: Any):
        namespace.setdefault("__slots__", ())
        return super().__new__(mcls, name, bases, namespace, **kwargs)

    def __call__(cls, *args: Any, **kwargs: Any) -> Any:
        return cls._from_fields(*args, **kwargs)


@dataclass(frozen=True, init=False)
class Event(tuple, metaclass=_EventType):
    """Base of every event: `seq_no` increases by one per emitted event on a bus.

    An event is a frozen dataclass whose fields live in a tuple (as a namedtuple's do): assigning a
    field raises FrozenInstanceError, equality, hash and repr are the dataclass's, and the bus builds
    one with a single C call (`from_values`) instead of a Python __init__ setting each field —
    several times cheaper: an engine with a subscriber appends a slot at ~1.4x the bare cost, down
    from 2.4x (benchmarks/block_manager.py).
    """

    seq_no: int
    type: ClassVar[str] = "event"
    num_fields: ClassVar[int] = 1
    from_values: ClassVar[Callable[[tuple[Any, ...]], "Event"]]  # set per class by _fields_as_properties

    def __getnewargs__(self) -> tuple[Any, ...]:  # pickle and copy rebuild through tuple.__new__
        return (tuple(self),)

    def to_dict(self) -> dict[str, Any]:
        return {"type": self.type, **asdict(self)}

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), separators=(",", ":"))


def _fields_as_properties(cls: type[Event]) -> None:
    """Give `cls` a read-only property per field (reading its tuple slot), the constructor by
    field (`_from_fields`, what calling the class does) and `from_values`, its C constructor
    from a tuple of every field value in order (not checked: the caller counts)."""
    names = [f.name for f in fields(cls)]
    for index, name in enumerate(names):
        setattr(cls, name, property(itemgetter(index), doc=f"field {index} of the event tuple"))
    cls.from_values = _type_call.__get__(cls)  # a bound method-wrapper: C all the way to tuple's __new__
    namespace = {"from_values": cls.from_values}
    params = ", ".join(names)
    exec(f"def _from_fields({params}):\n    return from_values(({params},))\n", namespace)
    build = namespace["_from_fields"]
    build.__qualname__ = build.__name__ = cls.__name__  # errors read "SlotAppended() missing ..."
    cls._from_fields = staticmethod(build)
    cls.num_fields = len(names)


def _register(cls: type[Event]) -> type[Event]:
    """Record the event type by name and lay its fields over its tuple."""
    _fields_as_properties(cls)
    EVENT_TYPES[cls.type] = cls
    return cls


_fields_as_properties(Event)


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
@dataclass(frozen=True, init=False)
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
@dataclass(frozen=True, init=False)
class PrefixCacheHit(Event):
    """A registered, hashed block is reused for `seq_ids` at `logical_index` instead of recomputing
    (nano-vllm's hash_to_block_id hit; a cached-free block is revived). The block may have been
    allocated earlier in the same prefill step: that step's forward writes it once for both."""

    device: str
    block: int
    seq_ids: tuple[int, ...]
    logical_index: int
    ref_count: int
    block_hash: int
    token_ids: tuple[int, ...]
    type: ClassVar[str] = "prefix_cache_hit"


@_register
@dataclass(frozen=True, init=False)
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
@dataclass(frozen=True, init=False)
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
@dataclass(frozen=True, init=False)
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
@dataclass(frozen=True, init=False)
class Forked(Event):
    """`child_seq_id` shares every block of `parent_seq_id`'s table (vLLM v0 fork): each ref +1."""

    parent_seq_id: int
    child_seq_id: int
    device: str
    blocks: tuple[int, ...]
    type: ClassVar[str] = "fork"


@_register
@dataclass(frozen=True, init=False)
class SwappedOut(Event):
    """Request `request_id`'s sequences moved GPU -> CPU; `mapping` holds (gpu_block, cpu_block)
    pairs, a shared block copied once (vLLM v0 swap_out)."""

    request_id: str
    seq_ids: tuple[int, ...]
    mapping: tuple[tuple[int, int], ...]
    type: ClassVar[str] = "swap_out"


@_register
@dataclass(frozen=True, init=False)
class SwappedIn(Event):
    """Request `request_id`'s sequences moved CPU -> GPU; `mapping` holds (cpu_block, gpu_block)."""

    request_id: str
    seq_ids: tuple[int, ...]
    mapping: tuple[tuple[int, int], ...]
    type: ClassVar[str] = "swap_in"


@_register
@dataclass(frozen=True, init=False)
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
@dataclass(frozen=True, init=False)
class SequenceFreed(Event):
    """`seq_id`'s block table is gone (after its BlockFreed events)."""

    seq_id: int
    type: ClassVar[str] = "sequence_freed"


@_register
@dataclass(frozen=True, init=False)
class BlockEvicted(Event):
    """A free-but-cached block lost its hash so it can be reused (LRU, seed 002 / vLLM LRUEvictor)."""

    device: str
    block: int
    block_hash: int
    type: ClassVar[str] = "block_evicted"


# ---------------------------------------------------------------- engine events (scheduler, engine)


@_register
@dataclass(frozen=True, init=False)
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
@dataclass(frozen=True, init=False)
class StepStarted(Event):
    """One engine step begins: a prefill or a decode over `seq_ids`, `num_tokens` tokens in all."""

    step: int
    kind: str
    seq_ids: tuple[int, ...]
    num_tokens: int
    type: ClassVar[str] = "step_started"


@_register
@dataclass(frozen=True, init=False)
class TokenGenerated(Event):
    """`seq_id` sampled `token_id` (its text piece `text`) at position `position`."""

    seq_id: int
    token_id: int
    text: str
    position: int
    type: ClassVar[str] = "token_generated"


@_register
@dataclass(frozen=True, init=False)
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
@dataclass(frozen=True, init=False)
class SequenceFinished(Event):
    """`seq_id` stopped: reason "stop", "length", "abort" or "ignored" (with `detail`)."""

    seq_id: int
    request_id: str
    reason: str
    detail: str
    type: ClassVar[str] = "sequence_finished"


@_register
@dataclass(frozen=True, init=False)
class KVDigest(Event):
    """A short digest of a block's real K/V contents (its first layer's first head, K then V) after
    the engine wrote or moved it: CacheEngine.kv_digests. Written blocks are hashed at the end of
    each step, or, when the engine holds digests back (LLMEngine.kv_digests_per_step False, as a
    live UI's free run at full speed does), once when emit_kv_digests() is called."""

    device: str
    block: int
    digest: str
    type: ClassVar[str] = "kv_digest"


@_register
@dataclass(frozen=True, init=False)
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

    `emit(cls, *values)` is the way to send an event (values by name work too, at the cost of a
    Python call). BlockSpaceManager.append_slots, the block manager's per-token path, uses the same
    steps written out, each a C call, since a Python call per token is most of what a subscriber
    costs there:

        event = SlotAppended.from_values((next(bus.seq_nos), seq_id, ...))
        try:
            bus.deliver(event)
        except Exception as exc:
            bus.recover(event, exc)

    `deliver` is the sole subscriber itself when there is one (the common case: a view or a trace
    writer), else a fan-out that isolates each subscriber's errors.
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

    def emit(self, cls: type[Event], *args: Any, **values: Any) -> Event:
        """Build a `cls` event with the next sequence number and deliver it to every subscriber.

        Field values follow `seq_no` in declaration order, positionally or by name."""
        seq_no = next(self.seq_nos)
        if values:
            event = cls(seq_no, *args, **values)
        elif len(args) + 1 == cls.num_fields:
            event = cls.from_values((seq_no, *args))  # one C call
        else:
            raise TypeError(f"{cls.__name__} takes {cls.num_fields - 1} field values after seq_no, "
                            f"got {len(args)}")
        try:
            self.deliver(event)
        except Exception as exc:  # a broken view must never break the engine
            self.recover(event, exc)
        return event

    def recover(self, event: Event, exc: Exception) -> None:
        """The sole subscriber raised while taking `event`: detach it and record why."""
        failed = self.deliver
        if failed in self._subscribers:
            self._detach(failed, exc)

    def _fan_out(self, event: Event) -> None:
        """Deliver to several subscribers; one that raises is detached, the others still get it."""
        for subscriber in tuple(self._subscribers):
            try:
                subscriber(event)
            except Exception as exc:
                self._detach(subscriber, exc)

    def _detach(self, subscriber: Subscriber, exc: Exception) -> None:
        self.unsubscribe(subscriber)
        self.errors.append((subscriber, exc))
        logger.warning("event subscriber %r raised %r and was detached", subscriber, exc)


def _nobody(event: Event) -> None:
    """What `deliver` is with no subscriber (emit sites check `active` first)."""


"""vLLM v1's KV-cache event protocol: the records, the wire formats by vLLM release, a bounded
decoder that reads all of them, and an encoder that writes the one asked for.

References: vllm/distributed/kv_events.py (EventBatch, KVEventBatch, BlockStored, BlockRemoved,
AllBlocksCleared, ZmqEventPublisher) of the releases named below, and
examples/online_serving/kv_events_subscriber.py.

On the wire (msgspec msgpack), by vLLM release:

| releases    | EventBatch               | each event                        | replay answer, then its end marker    |
|-------------|--------------------------|-----------------------------------|---------------------------------------|
| 0.9 - 0.23  | array [ts, events, rank] | tagged array ["BlockStored", ...] | [seq, payload], [-1, b""]             |
| 0.24 - 0.25 | array                    | map {"type": "BlockStored", ...}  | [seq, payload], [-1, b""]             |
| 0.26 - 0.33 | array                    | map                               | [topic, seq, payload], [b"", -1, b""] |

A PUB frame is `[topic, seq as 8 bytes big-endian, payload]` in every release. Records are
`omit_defaults`: in a map, the fields declared without a default (BlockStored's first seven,
BlockRemoved's `block_hashes` and `medium`) are always written and the later ones only when not
None; a tagged array keeps every field. Fields grew over the releases (0.9 had BlockStored up to
`lora_id`; `medium`, the batch's rank, `lora_name`, `extra_keys`, `group_idx` and the cache-spec
kind came by 0.23; `locality` in 0.26, `ownership` in 0.29, `session_id` in 0.30,
`lookahead_token_ids` in 0.33). A decoder of any release ignores the fields it does not know, so
what the newest writes, older decoders of the same shape read. blockviz's `publish`, before it
wrote vLLM's format, sent the batch as a map, which no vLLM release does: `decode_batch` still
reads it.

Block hashes are ints (vLLM's `VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES`: the low 64 bits of the hash)
or bytes (the whole hash); both are kept as they came. Decoding is bounded: the payload's size,
its nesting (msgspec's recursion guard, and `extra_keys` at most MAX_EXTRA_KEYS_DEPTH deep) and
the block hashes in one batch are capped, and any excess is a ProtocolError, never a crash.

No torch, no textual, no zmq import here.
"""

from __future__ import annotations

import re
import time
from dataclasses import dataclass
from typing import Any, Union

import msgspec

from blockviz.model.safe_text import safe_line, safe_struct

BlockHash = Union[int, bytes]
"""vLLM's ExternalBlockHash: an int (low 64 bits) or the hash's bytes."""

MEDIUM_GPU = "GPU"  # vLLM's name for the device pool (offloading tiers add "CPU", "STORAGE")
KIND_FULL_ATTENTION = "full_attention"  # vLLM KVCacheSpecKind.FULL_ATTENTION: a FullAttentionSpec group
END_SEQ = -1  # the replay stream's last sequence number

MAX_PAYLOAD_BYTES = 8 << 20  # a batch bigger than this is refused before it is decoded
MAX_HASHES_PER_BATCH = 1 << 18  # block hashes in one batch, summed over its events
MAX_EXTRA_KEYS_DEPTH = 8  # nesting inside a BlockStored's extra_keys (vLLM's are 3 deep)


class ProtocolError(ValueError):
    """A payload that is not a vLLM KV event batch; str() says why in one line."""


# --------------------------------------------------------------------------- the records


class KVCacheEvent(msgspec.Struct, frozen=True, tag=True, tag_field="type", gc=False):
    """Base of the three events; `type` on the wire is the class name (msgspec `tag=True`)."""


class BlockStored(KVCacheEvent, frozen=True):
    """Full blocks entered the prefix cache (vLLM BlockPool.cache_full_blocks; since 0.33 also a
    hit reported again for a request whose kv_cache_report_mode is "full"). `block_hashes[i]`'s
    parent is `block_hashes[i-1]`, the first one's is `parent_block_hash` (None: a prompt's first
    block); `token_ids` are all their tokens, `block_size` per block, in order. `medium` is the
    tier ("GPU", "CPU", ...), `locality` "LOCAL" or "REMOTE" relative to the publisher (None:
    unspecified), `ownership` the offloading tier that generated it, `session_id` the session whose
    request stored it; `group_idx` the KV-cache group and `kv_cache_spec_kind` its kind."""

    block_hashes: tuple[BlockHash, ...]
    parent_block_hash: BlockHash | None
    token_ids: tuple[int, ...]
    block_size: int
    lora_id: int | None = None
    medium: str | None = None
    lora_name: str | None = None
    extra_keys: tuple[Any, ...] | None = None
    group_idx: int | None = None
    kv_cache_spec_kind: str | None = None
    kv_cache_spec_sliding_window: int | None = None
    locality: str | None = None
    ownership: str | None = None
    session_id: str | None = None
    lookahead_token_ids: tuple[tuple[int, ...], ...] | None = None

    def blocks(self, max_tokens: int | None = None) -> list[tuple[BlockHash, BlockHash | None, tuple[int, ...]]]:
        """One (hash, parent hash, token ids) per stored block, the chain unrolled; with
        `max_tokens`, at most that many of each block's first token ids."""
        out, parent, size = [], self.parent_block_hash, max(self.block_size, 1)
        keep = size if max_tokens is None else min(size, max_tokens)
        for index, block_hash in enumerate(self.block_hashes):
            out.append((block_hash, parent, tuple(self.token_ids[index * size:index * size + keep])))
            parent = block_hash
        return out


class BlockRemoved(KVCacheEvent, frozen=True):
    """Blocks left the prefix cache (vLLM BlockPool._maybe_evict_cached_block), from `medium`'s
    tier, `locality` and `ownership` as on BlockStored."""

    block_hashes: tuple[BlockHash, ...]
    medium: str | None = None
    group_idx: int | None = None
    locality: str | None = None
    ownership: str | None = None


class AllBlocksCleared(KVCacheEvent, frozen=True):
    """The whole prefix cache was dropped (vLLM BlockPool.reset_prefix_cache)."""


class UnknownEvent(msgspec.Struct, frozen=True, gc=False):
    """An event of a type this blockviz does not know (a newer vLLM): counted, otherwise ignored."""

    type: str


KNOWN_EVENTS: dict[str, type[KVCacheEvent]] = {
    cls.__name__: cls for cls in (BlockStored, BlockRemoved, AllBlocksCleared)
}
AnyEvent = Union[BlockStored, BlockRemoved, AllBlocksCleared, UnknownEvent]

# Fields vLLM declares without a default: always written; the later ones only when not None.
_REQUIRED_FIELDS = {"BlockStored": 7, "BlockRemoved": 2, "AllBlocksCleared": 0}


class EventBatch(msgspec.Struct, frozen=True, gc=False):
    """One publish: the events a vLLM engine step produced (vLLM KVEventBatch)."""

    ts: float
    events: tuple[Any, ...]
    data_parallel_rank: int | None = None


# --------------------------------------------------------------------------- wire formats


@dataclass(frozen=True, slots=True)
class WireFormat:
    """What one range of vLLM releases puts on the wire (the table in the module docstring)."""

    first: tuple[int, int]  # the first release that sends it
    last: tuple[int, int]  # the last one blockviz knows to send it
    event_arrays: bool  # events as tagged arrays (else maps with a "type" key)
    replay_topic: bool  # replay answers carry the topic frame

    @property
    def releases(self) -> str:
        return f"vLLM {release_text(self.first)} - {release_text(self.last)}"


NEWEST_RELEASE = (0, 33)
WIRE_FORMATS = (
    WireFormat((0, 9), (0, 23), event_arrays=True, replay_topic=False),
    WireFormat((0, 24), (0, 25), event_arrays=False, replay_topic=False),
    WireFormat((0, 26), NEWEST_RELEASE, event_arrays=False, replay_topic=True),
)
NEWEST_FORMAT = WIRE_FORMATS[-1]
# SGLang's publisher (sglang/srt/disaggregation/kv_events.py ZmqEventPublisher, KVEventBatch) sends
# the newest shape: an array batch, map events, the topic in replay answers
SGLANG_TOO = " (SGLang's shape too)"


def release_text(version: tuple[int, int]) -> str:
    """(0, 33) as "0.33"."""
    return f"{version[0]}.{version[1]}"


def wire_format_for(version: str) -> WireFormat:
    """The wire format vLLM `version` ("0.33", "0.23.1") sends; a ValueError (one line) for a
    version that is not a release blockviz knows."""
    match = re.fullmatch(r"(\d+)\.(\d+)(\.\d+)*(\.post\d+)?", version.strip())
    known = f"{release_text(WIRE_FORMATS[0].first)} to {release_text(NEWEST_RELEASE)}"
    if match is None:
        raise ValueError(f"--vllm-version must look like 0.33, got {version!r}")
    key = (int(match[1]), int(match[2]))
    for wire in WIRE_FORMATS:
        if wire.first <= key <= wire.last:
            return wire
    raise ValueError(f"--vllm-version {version}: blockviz knows the KV events of vLLM {known}")


@dataclass(frozen=True, slots=True)
class WireShape:
    """The shape one payload came in: what `attach` reports having seen."""

    batch_array: bool
    event_arrays: bool | None  # None: a batch with no events does not say

    def describe(self) -> str:
        """Which releases send this shape, and the shape, in one phrase."""
        if not self.batch_array:
            return "a map batch: blockviz publish before it wrote vLLM 0.33's format (no vLLM release)"
        if self.event_arrays is None:
            return "an array batch, no events yet"
        if self.event_arrays:
            return f"{WIRE_FORMATS[0].releases}: array batch, tagged-array events"
        return f"vLLM {release_text(WIRE_FORMATS[1].first)} or later: array batch, map events{SGLANG_TOO}"


# --------------------------------------------------------------------------- decoding

_FIELD_NAMES = {name: cls.__struct_fields__ for name, cls in KNOWN_EVENTS.items()}
_BATCH_FIELDS = EventBatch.__struct_fields__


def _as_fields(value: Any, names: tuple[str, ...], what: str) -> dict[str, Any]:
    """A record in either shape as a dict of its fields: a map as it is, an array zipped with the
    declared field names (extra trailing values from a newer sender are dropped)."""
    if isinstance(value, dict):
        return value
    if isinstance(value, (list, tuple)):
        return dict(zip(names, value))
    raise ProtocolError(f"{what} is a {type(value).__name__}, not an array or a map")


def _depth(value: Any, limit: int) -> int:
    """How deep lists and maps nest in `value`, counting no further than `limit` + 1."""
    deepest, stack = 0, [(value, 1)]
    while stack:
        item, depth = stack.pop()
        if isinstance(item, (list, tuple, dict)):
            deepest = max(deepest, depth)
            if depth > limit:
                break
            stack.extend((child, depth + 1) for child in (item.values() if isinstance(item, dict) else item))
    return deepest


def decode_event(raw: Any) -> AnyEvent:
    """One event from its generic msgpack value: `["BlockStored", ...]` or `{"type": "BlockStored",
    ...}`. Field types are checked (msgspec.convert); an unknown type gives an UnknownEvent."""
    if isinstance(raw, (list, tuple)) and raw and isinstance(raw[0], str):
        tag, fields = raw[0], list(raw[1:])
    elif isinstance(raw, dict) and isinstance(raw.get("type"), str):
        tag, fields = raw["type"], {k: v for k, v in raw.items() if k != "type"}
    else:
        raise ProtocolError(f"an event must be a tagged array or a map with a 'type', got {raw!r:.60}")
    tag = safe_line(tag[:64])  # quoted in errors and counted by name: written visibly (safe_text.py)
    cls = KNOWN_EVENTS.get(tag)
    if cls is None:
        return UnknownEvent(tag)
    values = _as_fields(fields, _FIELD_NAMES[tag], tag)
    if _depth(values.get("extra_keys"), MAX_EXTRA_KEYS_DEPTH) > MAX_EXTRA_KEYS_DEPTH:
        raise ProtocolError(f"bad {tag}: extra_keys nested deeper than {MAX_EXTRA_KEYS_DEPTH}")
    try:
        event = msgspec.convert(values, cls, strict=True)
    except msgspec.ValidationError as exc:
        raise ProtocolError(f"bad {tag}: {exc}") from None
    return safe_struct(event)  # every string a publisher sent (medium, session_id, ...) made safe to draw


def decode_batch(payload: bytes) -> EventBatch:
    """A payload's EventBatch, in any release's shape (decode_batch_shape)."""
    return decode_batch_shape(payload)[0]


def decode_batch_shape(payload: bytes) -> tuple[EventBatch, WireShape]:
    """A payload's EventBatch and the shape it came in: an array or (blockviz's earlier publish) a
    map batch, events as tagged arrays or maps. Bounded: a ProtocolError for a payload over
    MAX_PAYLOAD_BYTES, nested past msgspec's recursion guard, or over MAX_HASHES_PER_BATCH."""
    if len(payload) > MAX_PAYLOAD_BYTES:
        raise ProtocolError(f"a payload of {len(payload)} bytes (at most {MAX_PAYLOAD_BYTES} are read)")
    try:
        raw = msgspec.msgpack.decode(payload)
    except msgspec.DecodeError as exc:
        raise ProtocolError(f"not msgpack: {exc}") from None
    except RecursionError:
        raise ProtocolError("nested too deep to be an event batch") from None
    fields = _as_fields(raw, _BATCH_FIELDS, "an event batch")
    ts, events, rank = fields.get("ts"), fields.get("events"), fields.get("data_parallel_rank")
    if not isinstance(ts, (int, float)) or isinstance(ts, bool):
        raise ProtocolError(f"an event batch's ts must be a number, got {ts!r:.40}")
    if not isinstance(events, (list, tuple)):
        raise ProtocolError("an event batch's events must be an array")
    if rank is not None and (not isinstance(rank, int) or isinstance(rank, bool)):
        raise ProtocolError(f"an event batch's data_parallel_rank must be an int, got {rank!r:.40}")
    decoded, num_hashes = [], 0
    for raw_event in events:
        event = decode_event(raw_event)
        num_hashes += len(getattr(event, "block_hashes", ()))
        if num_hashes > MAX_HASHES_PER_BATCH:
            raise ProtocolError(f"more than {MAX_HASHES_PER_BATCH} block hashes in one batch")
        decoded.append(event)
    shape = WireShape(isinstance(raw, (list, tuple)), isinstance(events[0], (list, tuple)) if events else None)
    return EventBatch(float(ts), tuple(decoded), rank), shape


# --------------------------------------------------------------------------- encoding

_encoder = msgspec.msgpack.Encoder()


# The fields of vLLM 0.23, the last release of tagged arrays (the later ones came with maps).
_FIELDS_IN_0_23 = {"BlockStored": 11, "BlockRemoved": 3, "AllBlocksCleared": 0}


def _wire_record(cls: type[KVCacheEvent], arrays: bool) -> type[msgspec.Struct]:
    """`cls` declared as vLLM declares it (msgspec.defstruct): the fields vLLM requires without a
    default, `omit_defaults`, tagged with the class name; as tagged arrays (`array_like`) with
    0.23's fields. msgspec then writes the bytes vLLM's encoder writes (array_like records keep
    their trailing None fields: msgspec omits defaults from maps only)."""
    name = cls.__name__
    fields = msgspec.structs.fields(cls)[:_FIELDS_IN_0_23[name] if arrays else None]
    declared = [(f.name, f.type) if index < _REQUIRED_FIELDS[name] else (f.name, f.type, None)
                for index, f in enumerate(fields)]
    return msgspec.defstruct(name, declared, tag=name, tag_field="type", omit_defaults=True, array_like=arrays,
                             gc=False)


_WIRE_RECORDS = {(cls, arrays): _wire_record(cls, arrays) for cls in KNOWN_EVENTS.values() for arrays in (False, True)}


def encode_batch(events: list[KVCacheEvent] | tuple[KVCacheEvent, ...], *, ts: float | None = None,
                 data_parallel_rank: int = 0, wire: WireFormat = NEWEST_FORMAT) -> bytes:
    """The payload of one publish as vLLM's releases of `wire` write it (vLLM ZmqEventPublisher:
    `msgspec.msgpack.Encoder().encode(KVEventBatch)`): `[ts, events, rank]`, each event a map
    `{"type": "BlockStored", ...}` or, up to 0.23, a tagged array `["BlockStored", ...]`."""
    records = []
    for event in events:
        record = _WIRE_RECORDS[type(event), wire.event_arrays]
        records.append(record(*msgspec.structs.astuple(event)[:len(record.__struct_fields__)]))
    return _encoder.encode((time.time() if ts is None else ts, records, data_parallel_rank))


def seq_bytes(seq: int) -> bytes:
    """A sequence number as sent: 8 bytes, big-endian, signed (so the end marker -1 fits)."""
    return seq.to_bytes(8, "big", signed=True)


def seq_from_bytes(data: bytes) -> int:
    """The inverse of seq_bytes; a frame of the wrong size is a ProtocolError."""
    if len(data) != 8:
        raise ProtocolError(f"a sequence number is 8 bytes, got {len(data)}")
    return int.from_bytes(data, "big", signed=True)

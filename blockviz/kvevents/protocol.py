"""vLLM v1's KV-cache event protocol: the records, the decoder for both wire shapes, the encoder.

References: vllm/distributed/kv_events.py (EventBatch, BlockStored, BlockRemoved, AllBlocksCleared,
ZmqEventPublisher) and examples/online_serving/kv_events_subscriber.py.

On the wire (msgspec msgpack):
- A PUB frame is `[topic, seq as 8-byte big-endian, payload]`; a replay answer is `[seq, payload]`,
  the last one `[-1 as 8 signed bytes, b""]`.
- The payload is an EventBatch: `ts` (seconds since the epoch), `events`, `data_parallel_rank`.
  Up to vLLM 0.23 every record was `array_like`: the batch an array `[ts, events, rank]` and each
  event a tagged array `["BlockStored", <fields in declaration order>]`. Newer vLLM drops
  `array_like`: the batch is a map and each event a map with a `"type"` key naming its class.
  `decode_batch` reads either shape at either level; `encode_batch` writes maps (the newer shape),
  every field present, so both vLLM's map decoder and this one read it.
- Block hashes are ints (vLLM's `VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES`: the low 64 bits of the
  hash) or bytes (the whole hash); both are kept as they came.

No torch, no textual, no zmq import here.
"""

from __future__ import annotations

import time
from typing import Any, Union

import msgspec

BlockHash = Union[int, bytes]
"""vLLM's ExternalBlockHash: an int (low 64 bits) or the hash's bytes."""

MEDIUM_GPU = "GPU"  # vLLM's name for the device pool (offloading connectors add others, e.g. "CPU")
END_SEQ = -1  # the replay stream's last sequence number


class ProtocolError(ValueError):
    """A payload that is not a vLLM KV event batch; str() says why in one line."""


class KVCacheEvent(msgspec.Struct, frozen=True, tag=True, tag_field="type", gc=False):
    """Base of the three events; `type` on the wire is the class name (msgspec `tag=True`)."""


class BlockStored(KVCacheEvent, frozen=True):
    """Full blocks entered the prefix cache (vLLM BlockPool.cache_full_blocks). `block_hashes[i]`'s
    parent is `block_hashes[i-1]`, the first one's is `parent_block_hash` (None: a prompt's first
    block); `token_ids` are all their tokens, `block_size` per block, in order."""

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

    def blocks(self) -> list[tuple[BlockHash, BlockHash | None, tuple[int, ...]]]:
        """One (hash, parent hash, token ids) per stored block, the chain unrolled."""
        out, parent, size = [], self.parent_block_hash, max(self.block_size, 1)
        for index, block_hash in enumerate(self.block_hashes):
            out.append((block_hash, parent, tuple(self.token_ids[index * size:(index + 1) * size])))
            parent = block_hash
        return out


class BlockRemoved(KVCacheEvent, frozen=True):
    """Blocks left the prefix cache: evicted to make room (vLLM BlockPool._maybe_evict_cached_block)."""

    block_hashes: tuple[BlockHash, ...]
    medium: str | None = None
    group_idx: int | None = None


class AllBlocksCleared(KVCacheEvent, frozen=True):
    """The whole prefix cache was dropped (vLLM BlockPool.reset_prefix_cache)."""


class UnknownEvent(msgspec.Struct, frozen=True, gc=False):
    """An event of a type this blockviz does not know (a newer vLLM): counted, otherwise ignored."""

    type: str


KNOWN_EVENTS: dict[str, type[KVCacheEvent]] = {
    cls.__name__: cls for cls in (BlockStored, BlockRemoved, AllBlocksCleared)
}
AnyEvent = Union[BlockStored, BlockRemoved, AllBlocksCleared, UnknownEvent]


class EventBatch(msgspec.Struct, frozen=True, gc=False):
    """One publish: the events a vLLM engine step produced (vLLM KVEventBatch)."""

    ts: float
    events: tuple[Any, ...]
    data_parallel_rank: int | None = None


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


def decode_event(raw: Any) -> AnyEvent:
    """One event from its generic msgpack value: `["BlockStored", ...]` or `{"type": "BlockStored",
    ...}`. Field types are checked (msgspec.convert); an unknown type gives an UnknownEvent."""
    if isinstance(raw, (list, tuple)) and raw and isinstance(raw[0], str):
        tag, fields = raw[0], list(raw[1:])
    elif isinstance(raw, dict) and isinstance(raw.get("type"), str):
        tag, fields = raw["type"], {k: v for k, v in raw.items() if k != "type"}
    else:
        raise ProtocolError(f"an event must be a tagged array or a map with a 'type', got {raw!r:.60}")
    cls = KNOWN_EVENTS.get(tag)
    if cls is None:
        return UnknownEvent(tag)
    values = _as_fields(fields, _FIELD_NAMES[tag], tag)
    try:
        return msgspec.convert(values, cls, strict=True)
    except msgspec.ValidationError as exc:
        raise ProtocolError(f"bad {tag}: {exc}") from None


def decode_batch(payload: bytes) -> EventBatch:
    """A payload's EventBatch, in the array or the map shape, with events in either shape."""
    try:
        raw = msgspec.msgpack.decode(payload)
    except msgspec.DecodeError as exc:
        raise ProtocolError(f"not msgpack: {exc}") from None
    fields = _as_fields(raw, _BATCH_FIELDS, "an event batch")
    ts, events, rank = fields.get("ts"), fields.get("events"), fields.get("data_parallel_rank")
    if not isinstance(ts, (int, float)) or isinstance(ts, bool):
        raise ProtocolError(f"an event batch's ts must be a number, got {ts!r:.40}")
    if not isinstance(events, (list, tuple)):
        raise ProtocolError("an event batch's events must be an array")
    if rank is not None and (not isinstance(rank, int) or isinstance(rank, bool)):
        raise ProtocolError(f"an event batch's data_parallel_rank must be an int, got {rank!r:.40}")
    return EventBatch(float(ts), tuple(decode_event(e) for e in events), rank)


# --------------------------------------------------------------------------- encoding

_encoder = msgspec.msgpack.Encoder()


def encode_batch(events: list[KVCacheEvent] | tuple[KVCacheEvent, ...], *, ts: float | None = None,
                 data_parallel_rank: int = 0, array_shape: bool = False) -> bytes:
    """The payload of one publish, in the map shape: `{"ts", "events": [{"type": ...}, ...],
    "data_parallel_rank"}` (vLLM's ZmqEventPublisher fills the rank in the same way); with
    `array_shape`, as vLLM <= 0.23 wrote it: `[ts, [["BlockStored", ...fields], ...], rank]`."""
    batch = EventBatch(time.time() if ts is None else ts, tuple(events), data_parallel_rank)
    if array_shape:
        return _encoder.encode([batch.ts, [_tagged_array(e) for e in batch.events], batch.data_parallel_rank])
    return _encoder.encode(batch)


# Fields vLLM declares without a default (always written); later ones it omits while they are None.
_REQUIRED_FIELDS = {"BlockStored": 7, "BlockRemoved": 2, "AllBlocksCleared": 0}


def _tagged_array(event: KVCacheEvent) -> list[Any]:
    """`["BlockStored", fields...]` as vLLM's array_like, omit_defaults records were written."""
    name = type(event).__name__
    values = list(msgspec.structs.astuple(event))
    while len(values) > _REQUIRED_FIELDS[name] and values[-1] is None:
        values.pop()
    return [name, *values]


def seq_bytes(seq: int) -> bytes:
    """A sequence number as sent: 8 bytes, big-endian, signed (so the end marker -1 fits)."""
    return seq.to_bytes(8, "big", signed=True)


def seq_from_bytes(data: bytes) -> int:
    """The inverse of seq_bytes; a frame of the wrong size is a ProtocolError."""
    if len(data) != 8:
        raise ProtocolError(f"a sequence number is 8 bytes, got {len(data)}")
    return int.from_bytes(data, "big", signed=True)

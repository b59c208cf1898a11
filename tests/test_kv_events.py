"""vLLM's KV-cache event protocol (blockviz/kvevents/): decoding pinned on msgspec bytes of every
release's wire shape, the encoder, bounded decoding, blockviz events mapped to vLLM's, the model
layer, and the subscriber's sequence following. Round trips over ZMQ are in
test_kv_round_trip.py; vLLM's own code against blockviz in test_kv_vllm.py (which also checks that
vLLM 0.33's encoder writes exactly the VLLM_0_33_* bytes below).
"""

from __future__ import annotations

import msgspec
import pytest

from blockviz.kvevents.endpoints import check_endpoint, offset_port
from blockviz.kvevents.mapping import KVEventMapper, step_batches
from blockviz.kvevents.protocol import (
    MAX_EXTRA_KEYS_DEPTH,
    MAX_HASHES_PER_BATCH,
    MAX_PAYLOAD_BYTES,
    NEWEST_FORMAT,
    AllBlocksCleared,
    BlockRemoved,
    BlockStored,
    EventBatch,
    ProtocolError,
    UnknownEvent,
    WireShape,
    decode_batch,
    decode_batch_shape,
    encode_batch,
    wire_format_for,
)
from blockviz.kvevents.state import NOT_SENT_BY_VLLM, KVEventState, NotSent
from blockviz.kvevents.subscriber import Received
from engine import events as ev

H1, H2, H3 = 0xF0E1D2C3B4A59687, 0x0123456789ABCDEF, 42
B1, B2 = bytes(range(32)), bytes(range(32, 64))

# vLLM 0.33 (array batch, map events, omit_defaults), written by its own classes:
# KVEventBatch(ts=1750000000.5, data_parallel_rank=1, events=[
#   BlockStored([H1, H2], None, [10..17], 4, None, "GPU", None, group_idx=0,
#               kv_cache_spec_kind="full_attention", session_id="chat-7"),
#   BlockStored([H3], H2, [18..21], 4, None, "CPU", None, locality="REMOTE", ownership="kvcr"),
#   BlockRemoved([H1], "GPU", group_idx=0), BlockRemoved([H3], "CPU", locality="REMOTE", ownership="kvcr"),
#   AllBlocksCleared()]); H1 needs all 64 bits (uint64).
VLLM_0_33_INT_HASHES = bytes.fromhex(
    "93cb41da13b86020000095de000ba474797065ab426c6f636b53746f726564ac626c6f636b5f68617368657392cff0e1"
    "d2c3b4a59687cf0123456789abcdefb1706172656e745f626c6f636b5f68617368c0a9746f6b656e5f696473980a0b0c"
    "0d0e0f1011aa626c6f636b5f73697a6504a76c6f72615f6964c0a66d656469756da3475055a96c6f72615f6e616d65c0"
    "a967726f75705f69647800b26b765f63616368655f737065635f6b696e64ae66756c6c5f617474656e74696f6eaa7365"
    "7373696f6e5f6964a6636861742d37de000aa474797065ab426c6f636b53746f726564ac626c6f636b5f686173686573"
    "912ab1706172656e745f626c6f636b5f68617368cf0123456789abcdefa9746f6b656e5f6964739412131415aa626c6f"
    "636b5f73697a6504a76c6f72615f6964c0a66d656469756da3435055a96c6f72615f6e616d65c0a86c6f63616c697479"
    "a652454d4f5445a96f776e657273686970a46b76637284a474797065ac426c6f636b52656d6f766564ac626c6f636b5f"
    "68617368657391cff0e1d2c3b4a59687a66d656469756da3475055a967726f75705f6964780085a474797065ac426c6f"
    "636b52656d6f766564ac626c6f636b5f686173686573912aa66d656469756da3435055a86c6f63616c697479a652454d"
    "4f5445a96f776e657273686970a46b76637281a474797065b0416c6c426c6f636b73436c656172656401")
VLLM_0_33_INT_HASHES_EVENTS = (
    BlockStored((H1, H2), None, (10, 11, 12, 13, 14, 15, 16, 17), 4, medium="GPU", group_idx=0,
                kv_cache_spec_kind="full_attention", session_id="chat-7"),
    BlockStored((H3,), H2, (18, 19, 20, 21), 4, medium="CPU", locality="REMOTE", ownership="kvcr"),
    BlockRemoved((H1,), "GPU", group_idx=0),
    BlockRemoved((H3,), "CPU", locality="REMOTE", ownership="kvcr"),
    AllBlocksCleared(),
)
# vLLM 0.33, bytes hashes and the rarer fields: KVEventBatch(ts=1750000001.25, data_parallel_rank=2,
# events=[BlockStored([B2], B1, [7, 8], 2, 3, "GPU", "adapter", extra_keys=[("adapter",)], group_idx=1,
# kv_cache_spec_kind="sliding_window", kv_cache_spec_sliding_window=128, lookahead_token_ids=[[9]]),
# BlockRemoved([B1], "GPU", group_idx=1)]); B1 = bytes 0..31, B2 = 32..63.
VLLM_0_33_BYTES_HASHES = bytes.fromhex(
    "93cb41da13b86050000092de000da474797065ab426c6f636b53746f726564ac626c6f636b5f68617368657391c42020"
    "2122232425262728292a2b2c2d2e2f303132333435363738393a3b3c3d3e3fb1706172656e745f626c6f636b5f686173"
    "68c420000102030405060708090a0b0c0d0e0f101112131415161718191a1b1c1d1e1fa9746f6b656e5f696473920708"
    "aa626c6f636b5f73697a6502a76c6f72615f696403a66d656469756da3475055a96c6f72615f6e616d65a76164617074"
    "6572aa65787472615f6b6579739191a761646170746572a967726f75705f69647801b26b765f63616368655f73706563"
    "5f6b696e64ae736c6964696e675f77696e646f77bc6b765f63616368655f737065635f736c6964696e675f77696e646f"
    "77cc80b36c6f6f6b61686561645f746f6b656e5f69647391910984a474797065ac426c6f636b52656d6f766564ac626c"
    "6f636b5f68617368657391c420000102030405060708090a0b0c0d0e0f101112131415161718191a1b1c1d1e1fa66d65"
    "6469756da3475055a967726f75705f6964780102")
# vLLM 0.23 (every record array_like), written by 0.23's own classes (vllm/distributed/kv_events.py of
# the 0.23.0 wheel): KVEventBatch(ts=1750000000.5, data_parallel_rank=1, events=[BlockStored([H1, H2],
# None, [10..17], 4, None, "GPU", None, group_idx=0, kv_cache_spec_kind="full_attention"),
# BlockRemoved([H3], "GPU", group_idx=0), AllBlocksCleared()]). array_like records keep their
# trailing None fields.
VLLM_0_23_ARRAY_SHAPE = bytes.fromhex(
    "93cb41da13b860200000939cab426c6f636b53746f72656492cff0e1d2c3b4a59687cf0123456789abcdefc0980a0b0c"
    "0d0e0f101104c0a3475055c0c000ae66756c6c5f617474656e74696f6ec094ac426c6f636b52656d6f766564912aa347"
    "50550091b0416c6c426c6f636b73436c656172656401")
VLLM_0_23_EVENTS = (
    BlockStored((H1, H2), None, (10, 11, 12, 13, 14, 15, 16, 17), 4, medium="GPU", group_idx=0,
                kv_cache_spec_kind="full_attention"),
    BlockRemoved((H3,), "GPU", group_idx=0),
    AllBlocksCleared(),
)
# The oldest array shape, vLLM 0.9: [3.0, [["BlockStored", [b"\xaa\xbb"], None, [1, 2], 2, None]]] (no
# rank, no medium): a bytes hash in an array.
OLDEST_ARRAY_SHAPE_BYTES_HASH = bytes.fromhex("92cb40080000000000009196ab426c6f636b53746f72656491c402aabbc092010202c0")
# blockviz's `publish` before the vLLM 0.33 format wrote the batch as a map (no vLLM release does):
# {"ts", "events": [{BlockStored [B2] parent B1, tokens [7, 8], size 2, group_idx 0,
# kv_cache_spec_kind "full_attention"}, {BlockRemoved [B1]}, {AllBlocksCleared}], "data_parallel_rank": 2}
MAP_SHAPE_BYTES_HASHES = bytes.fromhex(
    "83a27473cb41da13b860500000a66576656e7473938aa474797065ab426c6f636b53746f726564ac626c6f636b5f68"
    "617368657391c420202122232425262728292a2b2c2d2e2f303132333435363738393a3b3c3d3e3fb1706172656e74"
    "5f626c6f636b5f68617368c420000102030405060708090a0b0c0d0e0f101112131415161718191a1b1c1d1e1fa974"
    "6f6b656e5f696473920708aa626c6f636b5f73697a6502a76c6f72615f6964c0a66d656469756da3475055a96c6f72"
    "615f6e616d65c0a967726f75705f69647800b26b765f63616368655f737065635f6b696e64ae66756c6c5f61747465"
    "6e74696f6e83a474797065ac426c6f636b52656d6f766564ac626c6f636b5f68617368657391c42000010203040506"
    "0708090a0b0c0d0e0f101112131415161718191a1b1c1d1e1fa66d656469756da347505581a474797065b0416c6c42"
    "6c6f636b73436c6561726564b2646174615f706172616c6c656c5f72616e6b02")
# The same map batch with int hashes and an event type this blockviz does not know:
# {"ts": 4.0, "events": [{BlockRemoved [7, 8] "GPU" group_idx None}, {"type": "BlockOffloaded", ...}], rank 0}
MAP_SHAPE_INT_HASHES_UNKNOWN_TYPE = bytes.fromhex(
    "83a27473cb4010000000000000a66576656e74739284a474797065ac426c6f636b52656d6f766564ac626c6f636b5f"
    "686173686573920708a66d656469756da3475055a967726f75705f696478c082a474797065ae426c6f636b4f66666c"
    "6f61646564ac626c6f636b5f6861736865739107b2646174615f706172616c6c656c5f72616e6b00")


def test_vllm_0_33s_batch_with_the_newest_fields_decodes():
    batch, shape = decode_batch_shape(VLLM_0_33_INT_HASHES)
    assert batch == EventBatch(1750000000.5, VLLM_0_33_INT_HASHES_EVENTS, 1)
    assert batch.events[0].blocks() == [(H1, None, (10, 11, 12, 13)), (H2, H1, (14, 15, 16, 17))]
    assert shape == WireShape(batch_array=True, event_arrays=False)
    assert "vLLM 0.24 or later" in shape.describe()


def test_vllm_0_33s_bytes_hashes_and_rarer_fields_decode():
    batch = decode_batch(VLLM_0_33_BYTES_HASHES)
    assert batch == EventBatch(1750000001.25, (
        BlockStored((B2,), B1, (7, 8), 2, 3, "GPU", "adapter", extra_keys=(["adapter"],), group_idx=1,
                    kv_cache_spec_kind="sliding_window", kv_cache_spec_sliding_window=128,
                    lookahead_token_ids=((9,),)),
        BlockRemoved((B1,), "GPU", group_idx=1),
    ), 2)


def test_vllm_0_23s_tagged_arrays_decode():
    batch, shape = decode_batch_shape(VLLM_0_23_ARRAY_SHAPE)
    assert batch == EventBatch(1750000000.5, VLLM_0_23_EVENTS, 1)
    assert shape == WireShape(batch_array=True, event_arrays=True) and "vLLM 0.9 - 0.23" in shape.describe()


def test_older_variants_and_blockvizs_earlier_map_batch_decode():
    assert decode_batch(OLDEST_ARRAY_SHAPE_BYTES_HASH) == EventBatch(3.0, (BlockStored((b"\xaa\xbb",), None, (1, 2), 2),), None)
    batch, shape = decode_batch_shape(MAP_SHAPE_BYTES_HASHES)
    assert batch == EventBatch(1750000001.25, (
        BlockStored((B2,), B1, (7, 8), 2, medium="GPU", group_idx=0, kv_cache_spec_kind="full_attention"),
        BlockRemoved((B1,), "GPU"),
        AllBlocksCleared(),
    ), 2)
    assert not shape.batch_array and "no vLLM release" in shape.describe()
    assert decode_batch(MAP_SHAPE_INT_HASHES_UNKNOWN_TYPE) == EventBatch(
        4.0, (BlockRemoved((7, 8), "GPU"), UnknownEvent("BlockOffloaded")), 0)


def test_the_encoder_writes_the_bytes_vllm_0_33_writes():
    assert encode_batch(VLLM_0_33_INT_HASHES_EVENTS, ts=1750000000.5, data_parallel_rank=1) == VLLM_0_33_INT_HASHES
    assert encode_batch(decode_batch(VLLM_0_33_BYTES_HASHES).events, ts=1750000001.25,
                        data_parallel_rank=2) == VLLM_0_33_BYTES_HASHES


def test_the_encoder_writes_the_bytes_vllm_0_23_wrote():
    payload = encode_batch(VLLM_0_23_EVENTS, ts=1750000000.5, data_parallel_rank=1, wire=wire_format_for("0.23"))
    assert payload == VLLM_0_23_ARRAY_SHAPE


@pytest.mark.parametrize(("version", "arrays", "topic"), [
    ("0.33", False, True), ("0.33.0", False, True), ("0.26", False, True), ("0.25.1", False, False),
    ("0.24", False, False), ("0.23", True, False), ("0.9", True, False), ("0.9.0.1", True, False),
])
def test_wire_formats_by_release(version, arrays, topic):
    wire = wire_format_for(version)
    assert (wire.event_arrays, wire.replay_topic) == (arrays, topic)
    assert wire_format_for("0.33") is NEWEST_FORMAT


@pytest.mark.parametrize(("version", "message"), [
    ("0.8", "blockviz knows the KV events of vLLM 0.9 to 0.33"), ("1.0", "0.9 to 0.33"), ("latest", "must look like"),
])
def test_unknown_releases_are_refused_in_one_line(version, message):
    with pytest.raises(ValueError, match=message):
        wire_format_for(version)


def test_the_engine_never_imports_zmq():
    from pathlib import Path

    engine_dir = Path(ev.__file__).resolve().parent
    importing = [p.name for p in engine_dir.rglob("*.py") if "import zmq" in p.read_text() or "from zmq" in p.read_text()]
    assert importing == []


class OldBatch(msgspec.Struct, array_like=True, omit_defaults=True):
    ts: float
    events: list


class OldEvent(msgspec.Struct, array_like=True, omit_defaults=True, tag=True):
    """Records declared as vLLM's examples/online_serving/kv_events_subscriber.py declares them:
    array_like, BlockStored with six fields (no lora_name and after), the batch without a rank."""


class OldStored(OldEvent, tag="BlockStored"):
    block_hashes: list[int]
    parent_block_hash: int | None
    token_ids: list[int]
    block_size: int
    lora_id: int | None
    medium: str | None


class OldRemoved(OldEvent, tag="BlockRemoved"):
    block_hashes: list[int]
    medium: str | None


class OldTypedBatch(OldBatch):
    events: list[OldStored | OldRemoved]


def test_vllms_example_subscriber_declarations_read_publish_for_vllm_0_23():
    """`blockviz publish --vllm-version 0.23` is for consumers written against vLLM <= 0.23, such as
    its example subscriber: every batch of the shipped eviction trace decodes with those records."""
    from blockviz.kvevents.mapping import step_batches
    from blockviz.model.trace import load_trace

    trace = load_trace("eviction")
    decoded = []
    for events in step_batches(trace.events, trace.block_size):
        batch = msgspec.msgpack.decode(encode_batch(events, wire=wire_format_for("0.23")), type=OldTypedBatch)
        decoded += batch.events
    stored = [h for e in decoded if isinstance(e, OldStored) for h in e.block_hashes]
    removed = [h for e in decoded if isinstance(e, OldRemoved) for h in e.block_hashes]
    assert stored and removed  # the trace stores and evicts
    assert removed == [e.block_hash & (2**64 - 1) for e in trace.events if e.type == "block_evicted"]


@pytest.mark.parametrize(("payload", "message"), [
    (b"\xc1", "not msgpack"),
    (msgspec.msgpack.encode("hello"), "not an array or a map"),
    (msgspec.msgpack.encode([1.0, 5]), "events must be an array"),
    (msgspec.msgpack.encode(["x", []]), "ts must be a number"),
    (msgspec.msgpack.encode([1.0, [[3, 4]]]), "tagged array or a map"),
    (msgspec.msgpack.encode([1.0, [["BlockStored", ["x"], None, [], 4]]]), "bad BlockStored"),
    (msgspec.msgpack.encode([1.0, [["BlockRemoved"]]]), "bad BlockRemoved"),
])
def test_malformed_payloads_are_protocol_errors(payload, message):
    with pytest.raises(ProtocolError, match=message):
        decode_batch(payload)


def nested(depth: int) -> bytes:
    """`depth` arrays of one element each, around a 1."""
    return b"\x91" * depth + b"\x01"


@pytest.mark.parametrize(("payload", "message"), [
    (nested(100_000), "nested too deep"),  # one 100 KB message
    (b"\x93\xcb" + bytes(8) + b"\x91" + nested(100_000) + b"\x00", "nested too deep"),  # inside the events
    (msgspec.msgpack.encode([1.0, [{"type": "BlockStored", "block_hashes": [1], "parent_block_hash": None,
                                     "token_ids": [1], "block_size": 1, "lora_id": None, "medium": None,
                                     "lora_name": None, "extra_keys": msgspec.msgpack.decode(
                                         nested(MAX_EXTRA_KEYS_DEPTH + 1))}], 0]), "extra_keys nested deeper"),
    (b"\x00" * (MAX_PAYLOAD_BYTES + 1), "at most"),
    (msgspec.msgpack.encode([1.0, [["BlockRemoved", list(range(MAX_HASHES_PER_BATCH // 2 + 1)), None]] * 2, 0]),
     "more than 262144 block hashes"),
])
def test_decoding_is_bounded(payload, message):
    """Depth, size and hashes per batch: each over its bound is one ProtocolError, never a crash."""
    with pytest.raises(ProtocolError, match=message):
        decode_batch(payload)


# ------------------------------------------------------------------------- blockviz -> vLLM mapping


def gpu_stored(hashes, parent, tokens, block_size):
    """What blockviz's mapper sends for blocks entering its GPU hash map (group 0, full attention)."""
    return BlockStored(hashes, parent, tokens, block_size, medium="GPU", group_idx=0, kv_cache_spec_kind="full_attention")


def gpu_removed(block_hash):
    return BlockRemoved((block_hash,), "GPU", group_idx=0)


def hashed(seq_no, block, block_hash, parent, registered=True, tokens=(1, 2)):
    return ev.BlockHashed(seq_no, "gpu", block, block_hash, parent, tokens, len(tokens), registered)


def test_the_mapper_publishes_the_caches_life_and_nothing_else():
    mapper = KVEventMapper(block_size=2)
    for event in (
        ev.BlockAllocated(0, "gpu", 0, (0,), 0, 1, None, (1, 2)),
        hashed(1, 0, 10, None),
        hashed(2, 1, 11, 10, tokens=(3, 4)),         # continues the chain: merged into one event
        hashed(3, 2, 10, None, registered=False),     # an equal block already stored: nothing
        ev.PrefixCacheHit(4, "gpu", 0, (1,), 0, 2, 10, (1, 2)),  # hits are not published
        ev.BlockFreed(5, "gpu", 1, 0, 0, True),       # free but cached: still stored
        ev.BlockEvicted(6, "gpu", 1, 11),             # evicted: removed
        hashed(7, 3, 12, 10, tokens=(5, 6)),
        ev.BlockFreed(8, "gpu", 3, 0, 0, False),      # left the map unevicted (never computed): removed
        ev.BlockFreed(9, "cpu", 3, 0, 0, False),      # the CPU pool is not a prefix cache
    ):
        mapper.feed(event)
    assert mapper.take_events() == [
        gpu_stored((10, 11), None, (1, 2, 3, 4), 2),
        gpu_removed(11),
        gpu_stored((12,), 10, (5, 6), 2),
        gpu_removed(12),
    ]
    assert mapper.take_events() == []


def test_a_block_stored_again_after_swap_in_keeps_its_parent():
    """Swap-in re-registers a block with parent_hash None: the parent seen at its first store is used."""
    mapper = KVEventMapper(block_size=2)
    mapper.feed(hashed(0, 0, 10, None))
    mapper.feed(hashed(1, 1, 11, 10))
    mapper.feed(ev.BlockEvicted(2, "gpu", 1, 11))
    mapper.feed(hashed(3, 5, 11, None))
    assert mapper.take_events()[-1] == gpu_stored((11,), 10, (1, 2), 2)


def test_hashes_are_sent_as_their_low_64_bits():
    mapper = KVEventMapper(block_size=2)
    mapper.feed(hashed(0, 0, (1 << 64) + 5, None))
    assert mapper.take_events()[0].block_hashes == (5,)


def test_step_batches_are_one_per_step_that_stored_or_removed():
    events = [ev.StepStarted(0, 0, "prefill", (0,), 2), hashed(1, 0, 10, None), ev.StepFinished(2, 0, "prefill", 2, 0.0),
              ev.StepStarted(3, 1, "decode", (0,), 1), ev.StepFinished(4, 1, "decode", 1, 0.0),
              ev.BlockEvicted(5, "gpu", 0, 10)]
    assert list(step_batches(events, 2)) == [[gpu_stored((10,), None, (1, 2), 2)],
                                             [gpu_removed(10)]]


# ------------------------------------------------------------------------- the model layer


def received(events, seq=0, rank=0, stream=0):
    return Received(stream, seq, EventBatch(float(seq), tuple(events), rank))


def test_the_state_builds_the_forest_and_counts_per_rank():
    state = KVEventState()
    state.apply(received([BlockStored((1, 2), None, (10, 11, 12, 13), 2), BlockStored((3,), 1, (14, 15), 2)]))
    state.apply(received([BlockStored((1,), None, (10, 11), 2)], seq=0, rank=1, stream=1))
    state.apply(received([BlockRemoved((2,))], seq=1))
    assert state.roots() == [1]
    assert state.children_of(1) == [2, 3]
    assert state.chain_tokens(3) == (10, 11, 14, 15)
    assert state.nodes[1].ranks == {0, 1} and not state.nodes[2].cached
    assert (state.ranks[0].num_cached, state.ranks[0].num_stored, state.ranks[0].num_removed) == (2, 3, 1)
    assert state.ranks[0].churn == pytest.approx(1 / 3)
    assert [(p.num_stored, p.num_removed, p.num_cached) for p in state.timeline] == [(3, 0, 3), (1, 0, 1), (0, 1, 2)]
    state.apply(received([AllBlocksCleared(), UnknownEvent("Later")], seq=2))
    assert state.ranks[0].num_cached == 0 and state.ranks[0].num_cleared == 1 and state.num_unknown_events == 1
    assert state.stored_hashes() == {1, 2, 3} and state.removed_hashes() == {1, 2, 3}


def test_the_state_says_what_vllm_does_not_send():
    state = KVEventState()
    for value in (state.block_ids, state.block_tables, state.ref_counts, state.hits, state.preemptions):
        assert isinstance(value, NotSent) and not value and NOT_SENT_BY_VLLM in repr(value)
    assert not hasattr(state.nodes.get(1, object()), "block_number")


def test_a_removal_of_a_block_never_seen_stored_is_counted_not_invented():
    state = KVEventState()
    state.apply(received([BlockRemoved((99,))]))
    assert state.nodes == {} and state.num_removed_unseen == 1 and state.removed_hashes() == {99}


def test_numbers_not_followed_do_not_move_the_ranks_last_number():
    state = KVEventState()
    state.apply(received([BlockStored((1,), None, (1,), 1)], seq=3))
    state.apply(Received(0, 2**62, EventBatch(0.0, (BlockStored((2,), 1, (2,), 1),), 0), followed=False))
    assert state.ranks[0].last_seq == 3 and state.num_batches == 2 and state.ranks[0].num_cached == 2


def test_tiers_and_groups_are_kept_apart_and_a_restart_resets_only_its_rank():
    """A hash stored on the GPU and offloaded to a remote CPU tier is cached in both; a GPU removal
    leaves the CPU copy; AllBlocksCleared clears every tier of its rank; a restart of rank 0 leaves
    rank 1 as it was."""
    state = KVEventState()
    state.apply(received([BlockStored((1,), None, (1,), 1, medium="GPU", group_idx=0, kv_cache_spec_kind="full_attention"),
                          BlockStored((1,), None, (1,), 1, medium="CPU", locality="REMOTE")]))
    state.apply(received([BlockStored((1,), None, (1,), 1, medium="GPU")], rank=1, stream=1))
    assert state.nodes[1].tiers == {("GPU", None), ("CPU", "REMOTE")} and state.nodes[1].ranks == {0, 1}
    assert state.ranks[0].cached_by_tier == {("GPU", None): 1, ("CPU", "REMOTE"): 1}
    assert state.ranks[0].group_kinds == {0: "full_attention"}
    state.apply(received([BlockRemoved((1,), "GPU", group_idx=0)], seq=1))
    assert state.ranks[0].cached_by_tier == {("CPU", "REMOTE"): 1} and state.nodes[1].cached
    state.apply(received([AllBlocksCleared()], seq=2))
    assert state.ranks[0].num_cached == 0 and state.nodes[1].ranks == {1}
    state.apply(received([BlockStored((2,), None, (2,), 1)], seq=3))
    state.apply(Received(0, 0, EventBatch(4.0, (BlockStored((3,), None, (3,), 1),), 0), restarted=True))
    assert state.ranks[0].num_restarts == 1 and state.ranks[0].num_cached == 1 and not state.nodes[2].cached
    assert state.ranks[1].num_cached == 1 and state.ranks[0].last_seq == 0


def test_the_forest_keeps_what_is_cached_and_a_bounded_history():
    state = KVEventState(max_removed_kept=2)
    state.apply(received([BlockStored((1, 2, 3, 4), None, (1, 2, 3, 4), 1)]))
    state.apply(received([BlockRemoved((1, 2, 3))], seq=1))
    assert sorted(state.nodes) == [2, 3, 4] and state.num_forgotten == 1  # 1 was removed first: forgotten
    assert state.roots() == [2] and state.children_of(2) == [3] and None not in state.children
    state.apply(received([BlockStored((1,), None, (1,), 1)], seq=2))  # stored again: a node again
    assert state.nodes[1].times_stored == 1 and state.nodes[1].cached


# ------------------------------------------------------------------------- endpoints


def test_endpoints_are_checked_and_offset_per_rank():
    assert check_endpoint("tcp://127.0.0.1:5557", "E") == "tcp://127.0.0.1:5557"
    assert check_endpoint("tcp://*:5557", "E") and check_endpoint("tcp://[::1]:5557", "E")
    assert offset_port("tcp://10.0.0.1:5557", 2) == "tcp://10.0.0.1:5559"
    assert offset_port("inproc://cache", 1) == "inproc://cache_dp1"
    for bad in ("localhost:5557", "tcp://host", "tcp://host:99999", "http://host:80", "tcp://:5557"):
        with pytest.raises(ValueError, match="E"):
            check_endpoint(bad, "E")
    with pytest.raises(ValueError, match="between 1 and 65534"):
        check_endpoint("tcp://h:65535", "E", ranks=2)

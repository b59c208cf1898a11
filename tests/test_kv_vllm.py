"""blockviz's KV-event interop against vLLM's own code (vllm/distributed/kv_events.py of the
installed release, 0.33 when this was written): vLLM's encoder writes the bytes pinned in
test_kv_events.py; vLLM's `Decoder(type=KVEventBatch)` reads every batch `blockviz publish` sends
(every shipped trace, an evicting recording, and a live run), in process and through a SUB written
as vLLM's examples/online_serving/kv_events_subscriber.py; vLLM's ZmqEventPublisher feeds
blockviz's client live and, for a subscriber that joins late, through its replay; blockviz's
publisher answers replay with the frames vLLM's answers with.

vLLM installs without its dependencies (.ci/run does it); without it these tests skip.
Every wait has a timeout; no assertion is about time.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import msgspec
import pytest
import zmq

kv_events = pytest.importorskip(
    "vllm.distributed.kv_events",
    reason="vLLM is not installed (.ci/run installs it: pip install --no-deps vllm==0.33.0 and its pure-Python deps)")

from blockviz.kvevents.mapping import step_batches  # noqa: E402
from blockviz.kvevents.protocol import BlockRemoved, BlockStored, encode_batch, seq_from_bytes  # noqa: E402
from blockviz.kvevents.publisher import KVEventPublisher  # noqa: E402
from blockviz.kvevents.state import KVEventState  # noqa: E402
from blockviz.kvevents.subscriber import Gap, KVEventClient  # noqa: E402
from blockviz.model.design import has_cpu_tier  # noqa: E402
from blockviz.model.trace import TRACES_DIR, read_trace, shipped_traces  # noqa: E402
from test_kv_events import (  # noqa: E402
    B1,
    B2,
    H1,
    H2,
    H3,
    VLLM_0_33_BYTES_HASHES,
    VLLM_0_33_INT_HASHES,
    VLLM_0_33_INT_HASHES_EVENTS,
)
from test_kv_round_trip import WAIT_S, collect, evicting_trace, free_ports, logged, trace_hashes  # noqa: E402,F401

ROOT = Path(__file__).resolve().parent.parent
TOPIC = "kv-events"
decoder = msgspec.msgpack.Decoder(type=kv_events.KVEventBatch)


def vllm_hashes(batches, kind) -> list:
    return [h for batch in batches for e in batch.events if isinstance(e, kind) for h in e.block_hashes]


# ------------------------------------------------------------------------- the bytes


def test_vllms_encoder_writes_the_pinned_bytes():
    """The payloads test_kv_events.py decodes are vLLM's own, not written by hand."""
    v = kv_events
    first = v.KVEventBatch(ts=1750000000.5, data_parallel_rank=1, events=[
        v.BlockStored(block_hashes=[H1, H2], parent_block_hash=None, token_ids=list(range(10, 18)), block_size=4,
                      lora_id=None, medium="GPU", lora_name=None, group_idx=0, kv_cache_spec_kind="full_attention",
                      session_id="chat-7"),
        v.BlockStored(block_hashes=[H3], parent_block_hash=H2, token_ids=[18, 19, 20, 21], block_size=4,
                      lora_id=None, medium="CPU", lora_name=None, locality="REMOTE", ownership="kvcr"),
        v.BlockRemoved(block_hashes=[H1], medium="GPU", group_idx=0),
        v.BlockRemoved(block_hashes=[H3], medium="CPU", locality="REMOTE", ownership="kvcr"),
        v.AllBlocksCleared()])
    second = v.KVEventBatch(ts=1750000001.25, data_parallel_rank=2, events=[
        v.BlockStored(block_hashes=[B2], parent_block_hash=B1, token_ids=[7, 8], block_size=2, lora_id=3,
                      medium="GPU", lora_name="adapter", extra_keys=[("adapter",)], group_idx=1,
                      kv_cache_spec_kind="sliding_window", kv_cache_spec_sliding_window=128,
                      lookahead_token_ids=[[9]]),
        v.BlockRemoved(block_hashes=[B1], medium="GPU", group_idx=1)])
    encoder = msgspec.msgpack.Encoder()
    assert encoder.encode(first) == VLLM_0_33_INT_HASHES
    assert encoder.encode(second) == VLLM_0_33_BYTES_HASHES
    assert decoder.decode(encode_batch(VLLM_0_33_INT_HASHES_EVENTS, ts=1750000000.5, data_parallel_rank=1)) == first


# ------------------------------------------------------------------------- blockviz publish -> vLLM's decoder


def publish_sources(evicting_trace):
    return {**{name: TRACES_DIR / f"{name}.jsonl" for name in shipped_traces()}, "evicting": evicting_trace}


@pytest.mark.parametrize("name", [*shipped_traces(), "evicting"])
def test_vllms_decoder_reads_every_batch_of_every_trace(name, evicting_trace):
    trace = read_trace(publish_sources(evicting_trace)[name])
    kv_manager = trace.header.get("kv_manager")
    stored, removed = trace_hashes(trace.events, kv_manager)
    decoded = [decoder.decode(encode_batch(events))
               for events in step_batches(trace.events, trace.block_size, kv_manager)]
    assert vllm_hashes(decoded, kv_events.BlockStored) == [h & (2**64 - 1) for h in stored]
    assert vllm_hashes(decoded, kv_events.BlockRemoved) == [h & (2**64 - 1) for h in removed]
    tiers = {"GPU", "CPU"} if has_cpu_tier(trace.header) else {"GPU"}  # vLLM's CPU tier publishes as "CPU"
    assert {e.medium for batch in decoded for e in batch.events} <= tiers
    num_groups = len(trace.header.get("kv_cache_groups") or [None])  # a hybrid trace publishes every group's
    group_ids = {e.group_idx for batch in decoded for e in batch.events}
    assert group_ids <= set(range(num_groups)) and (num_groups == 1 or group_ids == set(range(num_groups)))


class ExampleSubscriber:
    """A subscriber written as vLLM's examples/online_serving/kv_events_subscriber.py is: a SUB on
    the topic, `_, seq_bytes, payload = sub.recv_multipart()`, `Decoder(type=KVEventBatch)`, and
    on a gap a replay request of the first missing number. Its replay socket is a DEALER: the
    example's REQ takes only the first of the ROUTER's answers."""

    def __init__(self, endpoint: str, replay: str) -> None:
        self.context = zmq.Context.instance()
        self.sub = self.context.socket(zmq.SUB)
        self.sub.connect(endpoint)
        self.sub.setsockopt_string(zmq.SUBSCRIBE, TOPIC)
        self.replay = self.context.socket(zmq.DEALER)
        self.replay.connect(replay)
        self.batches: dict[int, object] = {}
        self.last_seq = -1

    def poll(self, timeout_ms: int) -> None:
        if not self.sub.poll(timeout_ms):
            return
        _, seq_bytes, payload = self.sub.recv_multipart()
        seq = int.from_bytes(seq_bytes, "big")
        if seq > self.last_seq + 1:
            self.replay.send_multipart((b"", (self.last_seq + 1).to_bytes(8, "big")))
            while self.replay.poll(WAIT_S * 1000):
                _, _topic, replay_seq, replay_payload = self.replay.recv_multipart()
                if not replay_payload:
                    break  # the end marker: an empty payload (its number is -1)
                self.batches[int.from_bytes(replay_seq, "big")] = decoder.decode(replay_payload)
        self.batches[seq] = decoder.decode(payload)
        self.last_seq = seq

    def close(self) -> None:
        self.sub.close(linger=0)
        self.replay.close(linger=0)


def publish_command(source: str, endpoint: str, replay: str, *args: str) -> list[str]:
    return [sys.executable, "-m", "blockviz", "publish", source, "--rate", "0", "--endpoint", endpoint,
            "--replay", replay, "--exit-when-done", *args]


def run_publish_for(subscriber_of, command: list[str], expected_batches: int, log_path: Path):
    """Start `blockviz publish`, read with a subscriber until every batch arrived or the wait ran out."""
    with open(log_path, "w") as log:
        process = subprocess.Popen(command, cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)},
                                   stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
        try:
            deadline = time.monotonic() + WAIT_S
            while len(subscriber_of.batches) < expected_batches and time.monotonic() < deadline:
                subscriber_of.poll(100)
            assert process.wait(WAIT_S) == 0, log_path.read_text()
        finally:
            if process.poll() is None:
                process.kill()
                process.wait()
    return log_path.read_text()


def publishes_something(name: str) -> bool:
    """Whether a shipped trace stores a block (those run without a prefix cache publish nothing,
    as vLLM publishes nothing without one: test_kv_round_trip.py covers them)."""
    trace = read_trace(TRACES_DIR / f"{name}.jsonl")
    return next(step_batches(trace.events, trace.block_size, trace.header.get("kv_manager")), None) is not None


@pytest.mark.parametrize("name", [*filter(publishes_something, shipped_traces()), "evicting", "--live"])
def test_vllms_example_subscriber_reads_blockviz_publish(name, evicting_trace, tmp_path):
    """`blockviz publish` (each shipped trace, an evicting recording, a live run) read over ZMQ by a
    subscriber built on vLLM's own records: every batch decodes, the hashes are the trace's."""
    if name == "--live":
        from blockviz.kvevents.publishing import live_batches
        from blockviz.session.spec import EngineSpec
        from blockviz.session.scenario import DEFAULT_SCENARIO, DEFAULT_SCENARIO_OPTIONS

        engine_events: list = []
        batches = list(live_batches(EngineSpec.of(**DEFAULT_SCENARIO_OPTIONS, prompts=(), arrivals=DEFAULT_SCENARIO),
                                    on_event=engine_events.append))
        stored, removed = trace_hashes(engine_events)
        source = "--live"
    else:
        path = publish_sources(evicting_trace)[name]
        trace = read_trace(path)
        stored, removed = trace_hashes(trace.events, trace.header.get("kv_manager"))
        batches = list(step_batches(trace.events, trace.block_size, trace.header.get("kv_manager")))
        source = str(path)
    assert batches
    port, replay_port = free_ports(2)
    endpoint, replay = f"tcp://127.0.0.1:{port}", f"tcp://127.0.0.1:{replay_port}"
    subscriber = ExampleSubscriber(endpoint, replay)
    try:
        log = run_publish_for(subscriber, publish_command(source, endpoint, replay), len(batches),
                              tmp_path / "publish.log")
    finally:
        subscriber.close()
    received = [subscriber.batches[seq] for seq in sorted(subscriber.batches)]
    assert sorted(subscriber.batches) == list(range(len(batches))), log
    assert vllm_hashes(received, kv_events.BlockStored) == [h & (2**64 - 1) for h in stored]
    assert vllm_hashes(received, kv_events.BlockRemoved) == [h & (2**64 - 1) for h in removed]


# ------------------------------------------------------------------------- vLLM's publisher -> blockviz


def vllm_batch(index: int):
    """A batch vLLM's BlockPool could send: block `index` stored under block `index - 1`, and the
    block before that removed."""
    events = [kv_events.BlockStored(block_hashes=[1000 + index], parent_block_hash=1000 + index - 1 if index else None,
                                    token_ids=[index, index + 1], block_size=2, lora_id=None, medium="GPU",
                                    lora_name=None, group_idx=0, kv_cache_spec_kind="full_attention")]
    if index >= 2:
        events.append(kv_events.BlockRemoved(block_hashes=[1000 + index - 2], medium="GPU", group_idx=0))
    return kv_events.KVEventBatch(ts=float(index), events=events)


@pytest.fixture
def vllm_publisher():
    port, replay_port = free_ports(2)
    # vLLM binds a wildcard endpoint and connects to any other (ZmqEventPublisher._is_bind_endpoint)
    publisher = kv_events.ZmqEventPublisher(data_parallel_rank=0, endpoint=f"tcp://*:{port}",
                                            replay_endpoint=f"tcp://127.0.0.1:{replay_port}", topic=TOPIC)
    try:
        yield publisher, f"tcp://127.0.0.1:{port}", f"tcp://127.0.0.1:{replay_port}"
    finally:
        publisher.shutdown()


def wait_until_buffered(publisher, count: int) -> None:
    """vLLM's publisher thread sends from a queue: wait until `count` batches are in its replay buffer."""
    deadline = time.monotonic() + WAIT_S
    while len(publisher._buffer) < count and time.monotonic() < deadline:
        time.sleep(0.02)
    assert len(publisher._buffer) == count


def test_vllms_publisher_feeds_blockvizs_client_live(vllm_publisher):
    publisher, endpoint, _ = vllm_publisher
    with KVEventClient(endpoint) as client:
        state = KVEventState()
        sent = 0
        deadline = time.monotonic() + WAIT_S
        while state.num_batches == 0 and time.monotonic() < deadline:  # until the subscription is through
            publisher.publish(vllm_batch(sent))
            sent += 1
            state.apply_update(client.poll(50))
        first = state.num_batches and state.timeline[0].seq
        for index in range(sent, sent + 20):
            publisher.publish(vllm_batch(index))
        collect(client, state, sent + 20 - first)
    assert [p.seq for p in state.timeline] == list(range(first, sent + 20))
    assert logged(state, "stored") == [1000 + i for i in range(first, sent + 20)]
    assert state.ranks[0].num_cached == 2 and state.ranks[0].group_kinds == {0: "full_attention"}
    assert "vLLM 0.24 or later" in state.wire_summary()


def test_a_late_subscriber_gets_every_earlier_batch_through_vllms_replay(vllm_publisher):
    publisher, endpoint, replay = vllm_publisher
    for index in range(30):
        publisher.publish(vllm_batch(index))
    wait_until_buffered(publisher, 30)
    with KVEventClient(endpoint, replay) as client:
        state = KVEventState()
        state.apply_update(client.catch_up())
        assert [p.seq for p in state.timeline] == list(range(30))  # every earlier batch, in order
        assert all(p.replayed for p in state.timeline)
        assert list(state.gaps) == [Gap(0, 0, 29, 30, True, True)] and state.num_lost_batches == 0
        assert state.replay_topic is True and "vLLM 0.26 or later" in state.wire_summary()
        for index in range(30, 40):  # and then live: the numbering continues, nothing missed
            publisher.publish(vllm_batch(index))
        collect(client, state, 40)
    assert [p.seq for p in state.timeline] == list(range(40)) and state.num_lost_batches == 0
    assert logged(state, "stored") == [1000 + i for i in range(40)]
    assert logged(state, "removed") == [1000 + i for i in range(38)]


def test_a_gap_is_filled_through_vllms_replay(vllm_publisher):
    publisher, endpoint, replay = vllm_publisher
    with KVEventClient(endpoint, replay) as client:
        state = KVEventState()
        sent = 0
        deadline = time.monotonic() + WAIT_S
        while state.num_batches == 0 and time.monotonic() < deadline:
            publisher.publish(vllm_batch(sent))
            sent += 1
            state.apply_update(client.poll(50))
        for index in range(sent, sent + 10):
            publisher.publish(vllm_batch(index))
        wait_until_buffered(publisher, sent + 10)
        sub = client.followers[0].sub
        for _ in range(3):  # the next frames are lost to this subscriber
            assert sub.poll(WAIT_S * 1000)
            sub.recv_multipart()
        collect(client, state, sent + 10)
    assert [p.seq for p in state.timeline] == list(range(sent + 10))
    assert state.num_lost_batches == 0 and [p.replayed for p in state.timeline].count(True) >= 3


def test_blockvizs_publisher_answers_replay_with_vllms_frames(vllm_publisher):
    """The same batches, published by vLLM's publisher and by blockviz's: the replay answers (and
    the end marker) are the same frames, byte for byte."""
    publisher, _, vllm_replay = vllm_publisher
    port, replay_port = free_ports(2)
    ours = KVEventPublisher(f"tcp://127.0.0.1:{port}", f"tcp://127.0.0.1:{replay_port}", topic=TOPIC)
    try:
        for index in range(3):
            publisher.publish(vllm_batch(index))
            ours.publish([BlockStored(tuple(e.block_hashes), e.parent_block_hash, tuple(e.token_ids), e.block_size,
                                      medium=e.medium, group_idx=e.group_idx, kv_cache_spec_kind=e.kv_cache_spec_kind)
                          if isinstance(e, kv_events.BlockStored) else
                          BlockRemoved(tuple(e.block_hashes), e.medium, e.group_idx) for e in vllm_batch(index).events],
                         ts=float(index))
        wait_until_buffered(publisher, 3)
        answers = []
        for replay_endpoint, serve in ((vllm_replay, lambda: None), (f"tcp://127.0.0.1:{replay_port}", ours.serve_replay)):
            dealer = zmq.Context.instance().socket(zmq.DEALER)
            dealer.connect(replay_endpoint)
            dealer.send_multipart((b"", (1).to_bytes(8, "big")))
            frames = []
            deadline = time.monotonic() + WAIT_S
            while (not frames or seq_from_bytes(frames[-1][2]) != -1) and time.monotonic() < deadline:
                serve()
                if dealer.poll(50):
                    frames.append(dealer.recv_multipart())
            dealer.close(linger=0)
            answers.append(frames)
    finally:
        ours.close(linger=0)
    assert answers[0] == answers[1]
    assert [len(f) for f in answers[0]] == [4, 4, 4] and answers[0][-1] == [b"", b"", (-1).to_bytes(8, "big", signed=True), b""]
    assert [seq_from_bytes(f[2]) for f in answers[0][:-1]] == [1, 2]

"""Round trips on 127.0.0.1: `blockviz publish` (a subprocess) and the attach client
(KVEventClient + KVEventState, no TUI) yield the stored and removed hashes of the trace's own
events, in order: read directly, after a forced gap filled through the replay socket, and by a
subscriber that connects once everything was published and catches up through replay.

Every wait has a timeout (a publisher that never answers fails the test, never hangs it); no
assertion is about time.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import threading
import time
from contextlib import contextmanager
from pathlib import Path

import pytest

from blockviz.kvevents.mapping import step_batches
from blockviz.kvevents.protocol import BlockRemoved, BlockStored, encode_batch, wire_format_for
from blockviz.kvevents.publisher import KVEventPublisher
from blockviz.kvevents.state import KVEventState
from blockviz.kvevents.subscriber import Gap, KVEventClient
from blockviz.model.design import KV_DESIGNS
from blockviz.model.trace import TRACES_DIR, read_trace, shipped_traces
from engine import events as ev
from jupyter_fixtures import stop_process

ROOT = Path(__file__).resolve().parent.parent
WAIT_S = 60  # the most any wait below lasts before the test fails


def free_ports(count: int) -> list[int]:
    sockets = [socket.socket() for _ in range(count)]
    try:
        for s in sockets:
            s.bind(("127.0.0.1", 0))
        return [s.getsockname()[1] for s in sockets]
    finally:
        for s in sockets:
            s.close()


def trace_hashes(events, kv_manager: str | None = "v0") -> tuple[list[int], list[int]]:
    """Read from the trace's own events: the hashes registered in the GPU hash map, in order (vLLM
    v1's designs: every block cached, a duplicate of a hash too), with those vLLM's CPU tier stored
    (offload_store, medium CPU) where they happen; and the hashes evicted from either."""
    every = KV_DESIGNS[kv_manager or "v0"].shared_hashes
    stored = []
    for e in events:
        if isinstance(e, ev.BlockHashed) and e.device == "gpu" and (e.registered or every):
            stored.append(e.block_hash)
        elif isinstance(e, ev.OffloadStored):
            stored.extend(e.block_hashes)
    removed = [e.block_hash for e in events if isinstance(e, ev.BlockEvicted)]
    return stored, removed


def logged(state: KVEventState, kind: str) -> list:
    return [h for k, _, h in state.log if k == kind]


def collect(client: KVEventClient, state: KVEventState, count: int, max_frames: int = 1_000) -> None:
    """Poll until `state` holds `count` batches (or the wait runs out: the assertions then say what is missing)."""
    deadline = time.monotonic() + WAIT_S
    while state.num_batches < count and time.monotonic() < deadline:
        state.apply_update(client.poll(100, max_frames=max_frames))


@contextmanager
def publishing(trace: Path | str, log_path: Path, *args: str):
    """`blockviz publish TRACE --rate 0 --replay ...` in a subprocess; yields (endpoint, replay, log)."""
    port, replay_port = free_ports(2)
    endpoint, replay = f"tcp://127.0.0.1:{port}", f"tcp://127.0.0.1:{replay_port}"
    command = [sys.executable, "-m", "blockviz", "publish", str(trace), "--rate", "0",
               "--endpoint", endpoint, "--replay", replay, *args]
    with open(log_path, "w") as log:
        process = subprocess.Popen(command, cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)},
                                   stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
        try:
            yield endpoint, replay, log_path
        finally:
            stop_process(process, 10)


def wait_for_line(log_path: Path, text: str) -> str:
    deadline = time.monotonic() + WAIT_S
    while time.monotonic() < deadline:
        content = log_path.read_text()
        if text in content:
            return content
        time.sleep(0.05)
    raise AssertionError(f"the publisher never said {text!r}: {log_path.read_text()!r}")


@pytest.fixture(scope="module")
def evicting_trace(tmp_path_factory) -> Path:
    """`blockviz run`'s scenario recorded: its prefix cache stores, reuses and evicts (the shipped
    traces either run without a prefix cache or never fill it)."""
    from blockviz.commands.record import record_trace
    from blockviz.session.spec import EngineSpec
    from blockviz.session.scenario import DEFAULT_SCENARIO, DEFAULT_SCENARIO_OPTIONS

    spec = EngineSpec.of(**DEFAULT_SCENARIO_OPTIONS, prompts=(), arrivals=DEFAULT_SCENARIO)
    path = tmp_path_factory.mktemp("kv") / "evicting.jsonl"
    record_trace(spec, path)
    return path


TRACES = [*shipped_traces(), "evicting"]


@pytest.mark.parametrize("name", TRACES)
def test_publish_then_attach_directly_after_a_gap_and_late(name, evicting_trace, tmp_path):
    path = evicting_trace if name == "evicting" else TRACES_DIR / f"{name}.jsonl"
    trace = read_trace(path)
    kv_manager = trace.header.get("kv_manager")
    stored, removed = trace_hashes(trace.events, kv_manager)
    if name in ("prefix-hit", "evicting"):
        assert stored and (removed or name == "prefix-hit")  # the traces that have something to send
    num_batches = len(list(step_batches(trace.events, trace.block_size, kv_manager)))
    with publishing(path, tmp_path / "publish.log", "--wait-for-subscribers", "2") as (endpoint, replay, log):
        with KVEventClient(endpoint, replay) as direct, KVEventClient(endpoint, replay) as gapped:
            clean, with_gap = KVEventState(), KVEventState()
            wait_for_line(log, "publishing on")  # both subscriptions reached the publisher
            collect(gapped, with_gap, min(1, num_batches), max_frames=1)  # the first batch arrives as it should
            dropped = min(2, num_batches - 2) if num_batches >= 3 else 0
            for _ in range(dropped):  # the forced gap: the next frames are lost to this subscriber
                assert gapped.followers[0].sub.poll(WAIT_S * 1000)
                gapped.followers[0].sub.recv_multipart()
            collect(direct, clean, num_batches)
            collect(gapped, with_gap, num_batches)
        wait_for_line(log, "answering replay requests")
        with KVEventClient(endpoint, replay) as late:
            caught_up = KVEventState()
            caught_up.apply_update(late.catch_up())
    for state in (clean, with_gap, caught_up):
        assert (logged(state, "stored"), logged(state, "removed")) == (stored, removed)
        assert state.stored_hashes() == set(stored) and state.removed_hashes() == set(removed)
        assert state.num_batches == num_batches and state.num_lost_batches == 0
    assert list(clean.gaps) == []
    assert list(with_gap.gaps) == ([Gap(0, 1, dropped, dropped, True, False)] if dropped else [])
    assert list(caught_up.gaps) == ([Gap(0, 0, num_batches - 1, num_batches, True, True)] if num_batches else [])
    assert [p.replayed for p in with_gap.timeline].count(True) == dropped


def test_a_gap_without_a_replay_endpoint_is_recorded_not_filled():
    endpoint = f"tcp://127.0.0.1:{free_ports(1)[0]}"
    with KVEventPublisher(endpoint) as publisher, KVEventClient(endpoint) as client:
        assert publisher.wait_for_subscribers(1, WAIT_S)
        state = KVEventState()
        for hash_ in (1, 2, 3, 4):
            publisher.publish([BlockStored((hash_,), None, (hash_,), 1)])
        collect(client, state, 1, max_frames=1)
        for _ in range(2):
            assert client.followers[0].sub.poll(WAIT_S * 1000)
            client.followers[0].sub.recv_multipart()
        collect(client, state, 2)
    assert list(state.gaps) == [Gap(0, 1, 2, 0, False, False)]
    assert state.num_lost_batches == 2 and logged(state, "stored") == [1, 4]
    assert "no replay endpoint" in state.gaps[0].describe()


def test_bad_frames_and_a_restarted_publisher_become_notices():
    endpoint = f"tcp://127.0.0.1:{free_ports(1)[0]}"
    with KVEventPublisher(endpoint) as publisher, KVEventClient(endpoint) as client:
        assert publisher.wait_for_subscribers(1, WAIT_S)
        publisher.publish([BlockStored((1,), None, (1,), 1)])
        publisher.publish([BlockRemoved((1,))])
        publisher.pub.send_multipart((b"kv-events", (2).to_bytes(8, "big"), b"\xc1"))
        publisher.pub.send_multipart((b"kv-events", (0).to_bytes(8, "big"), encode_batch([], ts=0.0)))
        state = KVEventState()
        deadline = time.monotonic() + WAIT_S
        while len(state.notices) < 2 and time.monotonic() < deadline:
            state.apply_update(client.poll(100))
    assert state.num_batches == 3 and list(state.gaps) == []
    assert "#2: not msgpack" in state.notices[0] and "restarted" in state.notices[1]


def test_two_data_parallel_ranks_are_followed_on_consecutive_ports():
    port = free_ports(1)[0]
    base = f"tcp://127.0.0.1:{port}"
    with KVEventPublisher(base, data_parallel_rank=0) as rank0, \
            KVEventPublisher(f"tcp://127.0.0.1:{port + 1}", data_parallel_rank=1) as rank1, \
            KVEventClient(base, data_parallel_size=2) as client:
        assert rank0.wait_for_subscribers(1, WAIT_S) and rank1.wait_for_subscribers(1, WAIT_S)
        rank0.publish([BlockStored((1, 2), None, (1, 2), 1)])
        rank1.publish([BlockStored((1,), None, (1,), 1)])
        rank1.publish([BlockRemoved((1,))])
        state = KVEventState()
        collect(client, state, 3)
    assert (state.ranks[0].num_cached, state.ranks[1].num_cached) == (2, 0)
    assert state.ranks[1].churn == 1.0 and state.nodes[1].ranks == {0}


def test_publish_live_serves_the_engines_own_cache_life(tmp_path):
    """`blockviz publish --live` (`blockviz run`'s scenario) against the same run in this process."""
    from blockviz.kvevents.publishing import live_batches
    from blockviz.session.spec import EngineSpec
    from blockviz.session.scenario import DEFAULT_SCENARIO, DEFAULT_SCENARIO_OPTIONS

    engine_events: list = []
    batches = list(live_batches(EngineSpec.of(**DEFAULT_SCENARIO_OPTIONS, prompts=(), arrivals=DEFAULT_SCENARIO),
                                on_event=engine_events.append))
    stored, removed = trace_hashes(engine_events)
    sent = [e for batch in batches for e in batch]
    assert [h for e in sent if isinstance(e, BlockStored) for h in e.block_hashes] == stored
    assert [h for e in sent if isinstance(e, BlockRemoved) for h in e.block_hashes] == removed
    assert stored and removed  # this scenario evicts
    with publishing("--live", tmp_path / "publish.log", "--exit-when-done") as (endpoint, replay, log):
        with KVEventClient(endpoint, replay) as client:
            state = KVEventState()
            collect(client, state, len(batches))
        assert "published" in wait_for_line(log, "published")
    assert (logged(state, "stored"), logged(state, "removed")) == (stored, removed)


@pytest.mark.parametrize(("version", "summary"), [
    ("0.33", "vLLM 0.26 or later: array batch, map events, topic in replay (SGLang's shape too)"),
    ("0.25", "vLLM 0.24 - 0.25: array batch, map events, no topic in replay"),
    ("0.23", "vLLM 0.9 - 0.23: array batch, tagged-array events"),
])
def test_attach_reads_each_releases_format_live_and_through_replay_and_says_which(version, summary):
    """blockviz's publisher in the format of `version` (`publish --vllm-version`): a late client
    catches up through its replay, then follows it live, and names the releases that send it."""
    port, replay_port = free_ports(2)
    endpoint, replay = f"tcp://127.0.0.1:{port}", f"tcp://127.0.0.1:{replay_port}"
    with KVEventPublisher(endpoint, replay, wire=wire_format_for(version)) as publisher:
        for hash_ in (1, 2, 3):
            publisher.publish([BlockStored((hash_,), hash_ - 1 or None, (hash_,), 1)])
        with KVEventClient(endpoint, replay) as client:
            state = KVEventState()
            caught_up = threading.Thread(target=lambda: state.apply_update(client.catch_up()))
            caught_up.start()
            deadline = time.monotonic() + WAIT_S
            while caught_up.is_alive() and time.monotonic() < deadline:
                publisher.serve_replay(50)
            caught_up.join(WAIT_S)
            assert publisher.wait_for_subscribers(1, WAIT_S)
            publisher.publish([BlockRemoved((1,))])
            collect(client, state, 4)
    assert [p.seq for p in state.timeline] == [0, 1, 2, 3] and [p.replayed for p in state.timeline] == [True] * 3 + [False]
    assert logged(state, "stored") == [1, 2, 3] and logged(state, "removed") == [1]
    assert state.wire_summary() == summary and state.num_lost_batches == 0

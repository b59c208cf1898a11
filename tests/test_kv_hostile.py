"""`blockviz attach`'s client against publishers the test controls (a pyzmq XPUB and ROUTER that
send what vLLM never would): deeply nested payloads, sequence numbers that go back, -1, or jump
by 2**62, replay servers that never end or never answer, 100,000 batches in bounded memory, a
KV-cache group per batch and blocks stored and never removed (the state's caps), and an IPv6
endpoint. Each case is shown as what it is and never hides the batches after it; the
attach app stays responsive and q quits while a replay never ends.

Every wait has a timeout (a client that hangs fails the test, never hangs it); no assertion is
about time.
"""

from __future__ import annotations

import threading
import time
import tracemalloc

import pytest
import zmq

from blockviz.kvevents.protocol import MAX_PAYLOAD_BYTES, BlockRemoved, BlockStored, encode_batch, seq_bytes
from blockviz.kvevents.publisher import KVEventPublisher
from blockviz.kvevents.state import MAX_CACHED_BLOCKS, MAX_PLACES_PER_RANK, MAX_REMOVED_KEPT, KVEventState
from blockviz.kvevents.subscriber import KVEventClient
from blockviz.tui.attach_app import AttachApp
from test_kv_attach import batch, wait_until
from test_kv_round_trip import WAIT_S, collect, free_ports, logged
from test_tui_app import anyio_backend, screen_text  # noqa: F401  (the anyio backend and screen text of the TUI tests)

TOPIC = b"kv-events"


def stored(block_hash: int, parent: int | None = None) -> bytes:
    return encode_batch([BlockStored((block_hash,), parent, (block_hash,), 1, medium="GPU")], ts=float(block_hash))


def send(publisher: KVEventPublisher, seq: int, payload: bytes) -> None:
    """One frame with whatever number the test chooses."""
    publisher.pub.send_multipart((TOPIC, seq_bytes(seq), payload))


def follow(frames: list[tuple[int, bytes]], until, replay: str | None = None, **client_options) -> KVEventState:
    """Send `frames` from a publisher the test controls to a KVEventClient; apply what arrives
    until `until(state)` holds or the wait runs out."""
    endpoint = f"tcp://127.0.0.1:{free_ports(1)[0]}"
    state = KVEventState()
    with KVEventPublisher(endpoint) as publisher, KVEventClient(endpoint, replay, **client_options) as client:
        assert publisher.wait_for_subscribers(1, WAIT_S)
        for seq, payload in frames:
            send(publisher, seq, payload)
        deadline = time.monotonic() + WAIT_S
        while not until(state) and time.monotonic() < deadline:
            state.apply_update(client.poll(100))
    return state


def test_deeply_nested_and_oversized_payloads_are_notices_and_the_next_batches_arrive():
    nested = b"\x91" * 100_000 + b"\x01"  # one 100 KB message
    oversized = b"\x00" * (MAX_PAYLOAD_BYTES + 1)
    state = follow([(0, stored(1)), (1, nested), (2, oversized), (3, stored(2, 1))], lambda s: s.num_batches == 2)
    assert logged(state, "stored") == [1, 2] and state.num_lost_batches == 0 and list(state.gaps) == []
    assert any("#1: nested too deep" in notice for notice in state.notices)
    assert any(f"#2: a payload of {MAX_PAYLOAD_BYTES + 1} bytes" in notice for notice in state.notices)


def test_sequence_numbers_going_back_minus_one_and_jumping_are_shown_and_never_hide_later_batches():
    frames = [(0, stored(1)), (1, stored(2, 1)), (-1, stored(3)), (2, stored(4)), (2**62, stored(5)), (3, stored(6)),
              (4, stored(7)), (0, stored(8)), (1, stored(9, 8))]
    state = follow(frames, lambda s: s.num_batches == 9)
    assert logged(state, "stored") == [1, 2, 3, 4, 5, 6, 7, 8, 9]  # every batch shown, in the order sent
    notices = "\n".join(state.notices)
    assert "sequence number -1 (the replay end marker's number) on the live stream" in notices
    assert "jumped from #2 to #4611686018427387904" in notices
    assert "went back from #4 to #0: the publisher restarted" in notices
    assert state.num_lost_batches == 0 and list(state.gaps) == []
    assert state.ranks[0].num_restarts == 1 and state.cached[0, ("GPU", None), None] == {8, 9}  # reset at the restart
    assert state.ranks[0].last_seq == 1
    assert [p.seq for p in state.timeline] == [0, 1, -1, 2, 2**62, 3, 4, 0, 1]


def test_a_jump_that_the_numbers_continue_from_is_followed():
    frames = [(0, stored(1)), (2**40, stored(2)), (2**40 + 1, stored(3)), (2**40 + 2, stored(4))]
    state = follow(frames, lambda s: s.num_batches == 4)
    assert logged(state, "stored") == [1, 2, 3, 4] and state.ranks[0].last_seq == 2**40 + 2
    assert [g.plausible for g in state.gaps] == [False] and state.num_lost_batches == 0
    assert "numbers jumped over #1-#1099511627776" in state.gaps[0].describe()
    assert any("numbering continues from #1099511627776" in notice for notice in state.notices)


class ReplayServer:
    """A ROUTER the test controls: to each request it sends `answers` replies with the topic frame,
    one every `interval_s`, forever when `answers` is None, and never an end marker."""

    def __init__(self, answers: int | None, interval_s: float = 0.01) -> None:
        self.endpoint = f"tcp://127.0.0.1:{free_ports(1)[0]}"
        self.answers, self.interval_s = answers, interval_s
        self.requests = 0
        self._stop = threading.Event()
        self._bound = threading.Event()
        self._thread = threading.Thread(target=self._serve, daemon=True)
        self._thread.start()
        assert self._bound.wait(WAIT_S)

    def _serve(self) -> None:
        router = zmq.Context.instance().socket(zmq.ROUTER)
        router.bind(self.endpoint)
        self._bound.set()
        clients, seq = [], 0
        try:
            while not self._stop.is_set():
                if router.poll(self.interval_s * 1000):
                    clients.append(router.recv_multipart()[0])
                    self.requests += 1
                for client in clients:
                    if self.answers is None or seq < self.answers:
                        router.send_multipart((client, b"", TOPIC, seq_bytes(seq), stored(100 + seq)))
                seq += 1
        finally:
            router.close(linger=0)

    def close(self) -> None:
        self._stop.set()
        self._thread.join(WAIT_S)


@pytest.mark.parametrize(("answers", "said"), [(None, "no end marker within 1 s"), (0, "no answer for 0.5 s")])
def test_a_replay_that_never_ends_is_reported_within_its_deadline(answers, said):
    server = ReplayServer(answers)
    done: list = []
    try:
        with KVEventClient(f"tcp://127.0.0.1:{free_ports(1)[0]}", server.endpoint, replay_deadline_s=1.0,
                           replay_timeout_s=0.5) as client:
            worker = threading.Thread(target=lambda: done.append(client.catch_up()), daemon=True)
            worker.start()
            worker.join(WAIT_S)
    finally:
        server.close()
    assert done, "catch_up never returned"
    update = done[0]
    assert any(f"replay from #0: {said}" in notice for notice in update.notices), update.notices
    if answers == 0:  # nobody answered and nothing is followed yet: said as the usual cause, not as a loss
        assert any("no publisher there yet?: following the live stream" in n for n in update.notices)
    if answers is None:  # what came before the deadline is shown, and not taken for every batch
        assert update.received and [r.seq for r in update.received] == list(range(len(update.received)))
        assert not update.gaps[0].replay_ended and "the replay did not end" in update.gaps[0].describe()


class ClosingClient(KVEventClient):
    """A KVEventClient that says when the attach app's worker closed it (its last act)."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.closed = threading.Event()

    def close(self) -> None:
        super().close()
        self.closed.set()


@pytest.mark.anyio
async def test_the_attach_app_stays_responsive_and_q_quits_while_a_replay_never_ends():
    server = ReplayServer(None)
    endpoint = f"tcp://127.0.0.1:{free_ports(1)[0]}"
    clients: list[ClosingClient] = []

    def client_factory(*args, **kwargs):  # a deadline no test waits for: only the app quitting ends this replay
        clients.append(ClosingClient(*args, replay_deadline_s=3600, **kwargs))
        return clients[-1]

    app = AttachApp(endpoint, server.endpoint, client_factory=client_factory)
    try:
        async with app.run_test(size=(120, 36)) as pilot:
            await wait_until(pilot, lambda: server.requests >= 1)  # the worker is inside the endless replay
            assert server.requests == 1 and app.state.num_batches == 0
            before = app.focused
            await pilot.press("tab")
            await pilot.pause()
            assert app.focused is not before  # keys are handled meanwhile
            assert "waiting for events on" in screen_text(app)
            await pilot.press("q")
        assert clients[0].closed.wait(WAIT_S)  # the replay saw the app quit: the worker left it and closed
    finally:
        server.close()


def test_memory_stays_bounded_under_100k_batches():
    """Each batch stores a new block and removes the one before: after the forest, the log and the
    timeline are full, 50,000 more batches add nothing that stays (the forest keeps what is cached
    plus MAX_REMOVED_KEPT removed blocks)."""
    endpoint = f"tcp://127.0.0.1:{free_ports(1)[0]}"
    state = KVEventState()
    tracemalloc.start()
    try:
        with KVEventPublisher(endpoint) as publisher, KVEventClient(endpoint) as client:
            assert publisher.wait_for_subscribers(1, WAIT_S)
            sizes = {}
            for chunk in range(100):
                for index in range(chunk * 1000, (chunk + 1) * 1000):
                    publisher.publish([BlockStored((index + 1,), index or None, (index,), 1),
                                       *([BlockRemoved((index,))] if index else [])])
                collect(client, state, (chunk + 1) * 1000)
                if chunk + 1 in (50, 100):
                    sizes[chunk + 1] = tracemalloc.get_traced_memory()[0]
    finally:
        tracemalloc.stop()
    assert state.num_batches == 100_000 and state.num_lost_batches == 0
    assert len(state.nodes) <= 1 + MAX_REMOVED_KEPT and state.num_cached == 1
    assert sizes[100] - sizes[50] < 2 * 2**20, sizes


def test_an_ipv6_loopback_endpoint_works():
    port = free_ports(1)[0]
    endpoint = f"tcp://[::1]:{port}"
    try:
        publisher = KVEventPublisher(endpoint)
    except zmq.ZMQError as exc:
        pytest.skip(f"no IPv6 loopback here: {exc}")
    state = KVEventState()
    with publisher, KVEventClient(endpoint) as client:
        assert publisher.wait_for_subscribers(1, WAIT_S)
        publisher.publish([BlockStored((7,), None, (7,), 1)])
        collect(client, state, 1)
    assert logged(state, "stored") == [7]


class _CountingDict(dict):
    """A dict that counts the walks over all its entries (a state that rescans every place)."""

    walks = 0


def _counted(method):
    def walk(self):
        _CountingDict.walks += 1
        return method(self)
    return walk


for _name in ("__iter__", "items", "values", "keys"):
    setattr(_CountingDict, _name, _counted(getattr(dict, _name)))


def test_a_group_per_batch_is_not_rescanned_and_the_places_are_capped():
    state = KVEventState()
    state.cached = _CountingDict()
    num_groups = MAX_PLACES_PER_RANK + 44
    for group in range(num_groups):
        state.apply(batch(group, BlockStored((group + 1,), None, (group,), 1, medium="GPU", group_idx=group)))
    assert _CountingDict.walks == 0  # no batch walked the places: each did the work of its own events
    assert len(state.cached) == len(state.places_of_rank[0]) == MAX_PLACES_PER_RANK
    assert state.num_cached == state.ranks[0].num_cached == state.ranks[0].cached_by_tier[("GPU", None)] == MAX_PLACES_PER_RANK
    assert state.num_dropped_blocks == 44 and len(state.nodes) == MAX_PLACES_PER_RANK
    assert any("places, the most attach keeps" in notice for notice in state.notices)
    assert "44 stored blocks dropped" in state.limits_summary()
    # a place emptied by its removals no longer counts: a new group is kept again
    state.apply(batch(num_groups, BlockRemoved((1,), medium="GPU", group_idx=0)))
    state.apply(batch(num_groups + 1, BlockStored((10**6,), None, (1,), 1, medium="GPU", group_idx=10**6)))
    assert state.num_dropped_blocks == 44 and 10**6 in state.nodes and state.num_cached == MAX_PLACES_PER_RANK


def test_blocks_never_removed_stay_at_the_cap_and_the_dropped_are_counted():
    cap = 1_000
    state = KVEventState(max_cached=cap)
    for seq in range(15):
        hashes = tuple(range(seq * 100 + 1, seq * 100 + 101))
        state.apply(batch(seq, BlockStored(hashes, None, tuple(range(100)), 1, medium="GPU")))
    assert state.num_cached == state.ranks[0].num_cached == cap and len(state.nodes) == cap
    assert state.num_dropped_blocks == 500 and state.ranks[0].num_stored == 1_500
    assert "500 stored blocks dropped (caps: 1,000 cached blocks" in state.limits_summary()
    assert sum(1 for notice in state.notices if "stores dropped" in notice) == 1  # said once, counted always
    state.apply(batch(15, BlockRemoved(tuple(range(1, 101)), medium="GPU")))  # room again: new stores are kept
    state.apply(batch(16, BlockStored((5_000,), None, (1,), 1, medium="GPU")))
    assert state.num_cached == cap - 99 and 5_000 in state.nodes and state.num_dropped_blocks == 500
    assert KVEventState().max_cached == MAX_CACHED_BLOCKS


def test_a_block_of_a_million_token_ids_per_frame_keeps_its_first_ones_and_counts_the_rest():
    """The probe's case: 300 frames each storing one block of 1,000,000 token ids. Each node keeps
    MAX_TOKENS_PER_BLOCK of them; the rest are counted in limits_summary; what stays is small."""
    from blockviz.kvevents.protocol import decode_batch
    from blockviz.kvevents.state import MAX_TOKENS_PER_BLOCK

    token_ids = tuple(range(1_000_000))
    payload = encode_batch([BlockStored((1,), None, token_ids, len(token_ids), medium="GPU")], ts=0.0)
    assert len(payload) <= MAX_PAYLOAD_BYTES  # a publisher can send it
    state = KVEventState()
    state.apply(batch(0, *decode_batch(payload).events))
    tracemalloc.start()
    try:
        for seq in range(1, 300):
            state.apply(batch(seq, BlockStored((seq + 1,), seq, token_ids, len(token_ids), medium="GPU")))
        grown = tracemalloc.get_traced_memory()[0]
    finally:
        tracemalloc.stop()
    assert len(state.nodes) == 300 and state.num_cached == 300
    assert all(node.token_ids == token_ids[:MAX_TOKENS_PER_BLOCK] for node in state.nodes.values())
    assert state.num_tokens_kept == 300 * MAX_TOKENS_PER_BLOCK
    assert state.num_dropped_tokens == 300 * (len(token_ids) - MAX_TOKENS_PER_BLOCK)
    assert f"{300 * (len(token_ids) - MAX_TOKENS_PER_BLOCK):,} token ids not kept" in state.limits_summary()
    assert grown < 16 << 20, grown  # what 299 blocks of 1,000,000 ids would keep is 2.4 GB


def test_token_ids_over_the_forest_are_capped_and_forgetting_a_block_makes_room():
    state = KVEventState(max_tokens_kept=10, max_removed_kept=0)
    state.apply(batch(0, BlockStored((1, 2, 3), None, tuple(range(12)), 4, medium="GPU")))
    assert [len(state.nodes[h].token_ids) for h in (1, 2, 3)] == [4, 4, 2]
    assert state.num_tokens_kept == 10 and state.num_dropped_tokens == 2
    state.apply(batch(1, BlockRemoved((1,), medium="GPU")))  # forgotten at once (max_removed_kept=0)
    assert 1 not in state.nodes and state.num_tokens_kept == 6
    state.apply(batch(2, BlockStored((4,), 3, (7, 7, 7, 7), 4, medium="GPU")))
    assert state.nodes[4].token_ids == (7, 7, 7, 7) and state.num_dropped_tokens == 2


def test_a_4mb_medium_per_frame_is_kept_cut_and_counted():
    """The probe's case: a 4 MB `medium` in each of 300 frames (each a new string, as decoding
    makes). Every string field attach keeps (medium, locality, session id, kind) is cut to
    MAX_FIELD_CHARS, counted in limits_summary; one such frame decodes with its controls escaped."""
    from blockviz.kvevents.protocol import decode_batch
    from blockviz.kvevents.state import MAX_FIELD_CHARS

    hostile = "\x1b[2J" * 1_000
    payload = encode_batch([BlockStored((1,), None, (1,), 1, medium="\x1b[2J" * 1_000_000, session_id=hostile,
                                        kv_cache_spec_kind=hostile, locality=hostile, group_idx=0)], ts=0.0)
    assert len(payload) <= MAX_PAYLOAD_BYTES
    state = KVEventState()
    state.apply(batch(0, *decode_batch(payload).events))
    node = state.nodes[1]
    assert len(node.medium) == len(node.session_id) == MAX_FIELD_CHARS and node.medium.startswith("\\x1b[2J")
    assert [len(text) for text in (*next(iter(state.cached))[1], state.ranks[0].group_kinds[0])] == [MAX_FIELD_CHARS] * 3
    assert state.num_cut_fields == 4
    tracemalloc.start()
    try:
        for seq in range(1, 300):
            medium = f"{seq:04d}" + "x" * (4 << 20)
            state.apply(batch(seq, BlockStored((seq + 1,), seq, (seq,), 1, medium=medium)))
            del medium
        grown = tracemalloc.get_traced_memory()[0]
    finally:
        tracemalloc.stop()
    assert state.num_cut_fields == 4 + 299  # each cut medium a tier of its own: past the places cap, dropped
    assert len(state.nodes) == MAX_PLACES_PER_RANK and state.num_dropped_blocks == 300 - MAX_PLACES_PER_RANK
    assert max(len(node.medium) for node in state.nodes.values()) == MAX_FIELD_CHARS
    assert "303 string fields cut to 64 characters" in state.limits_summary()
    assert grown < 8 << 20, grown  # 299 kept mediums of 4 MB would be 1.2 GB
    state.apply(batch(300, BlockRemoved((2,), medium="0001" + "x" * (4 << 20))))  # removal finds the cut tier
    assert not state.nodes[2].places and state.num_removed_unseen == 0


def test_a_long_bytes_hash_is_kept_as_its_digest_and_its_removal_finds_it():
    from blockviz.kvevents.state import MAX_HASH_BYTES

    long_hash, parent = b"\x01" * (1 << 20), b"\x02" * (1 << 20)
    state = KVEventState()
    state.apply(batch(0, BlockStored((parent,), None, (1,), 1, medium="GPU")))
    state.apply(batch(1, BlockStored((long_hash,), parent, (2,), 1, medium="GPU")))
    assert all(len(block_hash) <= MAX_HASH_BYTES for block_hash in state.nodes)
    (child,) = [node for node in state.nodes.values() if node.token_ids == (2,)]
    assert child.parent_hash in state.nodes and state.chain_tokens(child.block_hash) == (1, 2)
    state.apply(batch(2, BlockRemoved((long_hash,), medium="GPU")))
    assert state.num_cached == 1 and state.num_removed_unseen == 0
    assert "block hashes over 64 bytes kept as their digest" in state.limits_summary()
    short = bytes(32)
    state.apply(batch(3, BlockStored((short,), None, (3,), 1, medium="GPU")))
    assert short in state.nodes  # vLLM's own (a 32-byte hash) is kept as it came

"""The subscriber side: follow one or more vLLM KV-event publishers' sequence numbers, and fill
gaps through the replay socket (vLLM examples/online_serving/kv_events_subscriber.py does the same
for one publisher).

Each publisher numbers its batches 0, 1, 2, ... A frame whose number skips ahead reveals a gap:
frames the SUB socket never got (it joined late, or it fell behind its high-water mark and frames
were dropped). With a replay endpoint the missing batches are asked for (a DEALER sends the first
missing number; the ROUTER answers `[seq, payload]` pairs, then seq -1) and delivered in order,
marked `replayed`; what does not come back within the timeout stays a gap. Without one the gap is
only recorded. Either way a `Gap` says what was missed, so a view can show it.

A data-parallel vLLM publishes rank r on the base port + r; `KVEventClient` follows each rank's
publisher on its own SUB socket (their numbers are independent). No torch, no textual here.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import zmq

from blockviz.kvevents.endpoints import offset_port
from blockviz.kvevents.protocol import END_SEQ, EventBatch, ProtocolError, decode_batch, seq_bytes, seq_from_bytes

DEFAULT_REPLAY_TIMEOUT_S = 2.0


@dataclass(frozen=True, slots=True)
class Received:
    """One batch as it arrived: from publisher `stream` (0 .. data-parallel size - 1), number `seq`."""

    stream: int
    seq: int
    batch: EventBatch
    replayed: bool = False

    @property
    def rank(self) -> int:
        """The batch's data_parallel_rank, else the publisher it came from."""
        rank = self.batch.data_parallel_rank
        return self.stream if rank is None else rank


@dataclass(frozen=True, slots=True)
class Gap:
    """Publisher `stream`'s batches `first_seq` .. `last_seq` were missed on the SUB socket;
    `num_recovered` of them came back through replay (`replay_asked` says whether it was asked)."""

    stream: int
    first_seq: int
    last_seq: int
    num_recovered: int
    replay_asked: bool
    joined_late: bool

    @property
    def num_missing(self) -> int:
        return self.last_seq - self.first_seq + 1

    @property
    def num_lost(self) -> int:
        return self.num_missing - self.num_recovered

    def describe(self) -> str:
        """One line for a view."""
        what = "joined late: missed" if self.joined_late else "missed"
        span = f"#{self.first_seq}" if self.first_seq == self.last_seq else f"#{self.first_seq}-#{self.last_seq}"
        if not self.replay_asked:
            after = "no replay endpoint"
        elif self.num_lost == 0:
            after = "all replayed"
        else:
            after = f"{self.num_recovered} replayed, {self.num_lost} lost"
        return f"rank {self.stream}: {what} {span} ({after})"


@dataclass(slots=True)
class ClientUpdate:
    """What one poll brought: batches in order, gaps, and one-line notices (bad payloads, restarts)."""

    received: list[Received] = field(default_factory=list)
    gaps: list[Gap] = field(default_factory=list)
    notices: list[str] = field(default_factory=list)

    def extend(self, other: "ClientUpdate") -> None:
        self.received += other.received
        self.gaps += other.gaps
        self.notices += other.notices


class StreamFollower:
    """One publisher: a SUB socket, its last sequence number, and a replay DEALER when configured."""

    def __init__(self, context: zmq.Context, stream: int, endpoint: str, replay_endpoint: str | None,
                 topic: str, replay_timeout_s: float) -> None:
        self.context, self.stream = context, stream
        self.endpoint, self.replay_endpoint = endpoint, replay_endpoint
        self.replay_timeout_ms = int(replay_timeout_s * 1000)
        self.last_seq: int | None = None
        self.sub = context.socket(zmq.SUB)
        self.sub.setsockopt(zmq.SUBSCRIBE, topic.encode("utf-8"))
        self.sub.connect(endpoint)
        self._dealer: zmq.Socket | None = None

    def on_frames(self, frames: list[bytes]) -> ClientUpdate:
        """Handle one PUB frame: replay what it shows was missed, then deliver it."""
        update = ClientUpdate()
        if len(frames) != 3:
            update.notices.append(f"rank {self.stream}: a frame of {len(frames)} parts, not 3: skipped")
            return update
        try:
            seq = seq_from_bytes(frames[1])
        except ProtocolError as exc:
            update.notices.append(f"rank {self.stream}: {exc}: skipped")
            return update
        if self.last_seq is not None and seq == 0 and self.last_seq > 0:
            update.notices.append(f"rank {self.stream}: the publisher restarted (its numbers began again at 0)")
            self.last_seq = None
        if self.last_seq is not None and seq <= self.last_seq:
            return update  # already delivered (through replay)
        expected = 0 if self.last_seq is None else self.last_seq + 1
        if seq > expected:
            update.extend(self._fill_gap(expected, seq - 1, joined_late=self.last_seq is None))
        self._deliver(update, seq, frames[2], replayed=False)
        return update

    def catch_up(self) -> ClientUpdate:
        """Ask the replay socket for every batch after the last one delivered (all of them before
        the first): a subscriber that connects to a running publisher sees its past too."""
        update = ClientUpdate()
        if self.replay_endpoint is None:
            return update
        first, joined_late = (0, True) if self.last_seq is None else (self.last_seq + 1, False)
        replayed = self._replay(first, None)
        for seq, payload in replayed:
            self._deliver(update, seq, payload, replayed=True)
        if replayed:
            update.gaps.append(Gap(self.stream, first, replayed[-1][0], len(replayed), True, joined_late))
        return update

    def _deliver(self, update: ClientUpdate, seq: int, payload: bytes, replayed: bool) -> None:
        self.last_seq = seq
        try:
            update.received.append(Received(self.stream, seq, decode_batch(payload), replayed))
        except ProtocolError as exc:
            update.notices.append(f"rank {self.stream} #{seq}: {exc}: skipped")

    def _fill_gap(self, first: int, last: int, joined_late: bool) -> ClientUpdate:
        update = ClientUpdate()
        recovered = 0
        if self.replay_endpoint is not None:
            for seq, payload in self._replay(first, last):
                self._deliver(update, seq, payload, replayed=True)
                recovered += 1
        update.gaps.append(Gap(self.stream, first, last, recovered, self.replay_endpoint is not None, joined_late))
        return update

    def _replay(self, first: int, last: int | None) -> list[tuple[int, bytes]]:
        """Ask the ROUTER for batches from `first` on; keep those up to `last` (None: all), in order. A reply
        that does not come within the timeout ends the request (the socket is then replaced, so a
        late answer cannot be taken for the next one)."""
        if self._dealer is None:
            self._dealer = self.context.socket(zmq.DEALER)
            self._dealer.connect(self.replay_endpoint)
        self._dealer.send_multipart((b"", seq_bytes(first)))
        got: dict[int, bytes] = {}
        while True:
            if not self._dealer.poll(self.replay_timeout_ms):
                self._dealer.close(linger=0)
                self._dealer = None
                break
            frames = self._dealer.recv_multipart()
            if len(frames) != 3:
                continue
            seq = seq_from_bytes(frames[1])
            if seq == END_SEQ:
                break
            if seq >= first and (last is None or seq <= last):
                got[seq] = frames[2]
        return sorted(got.items())

    def close(self) -> None:
        self.sub.close(linger=0)
        if self._dealer is not None:
            self._dealer.close(linger=0)


class KVEventClient:
    """Follows `data_parallel_size` publishers: rank r on `endpoint`'s port + r (and its replay on
    `replay_endpoint`'s port + r). `poll` returns what arrived, in order per publisher."""

    def __init__(self, endpoint: str, replay_endpoint: str | None = None, *, topic: str = "kv-events",
                 data_parallel_size: int = 1, replay_timeout_s: float = DEFAULT_REPLAY_TIMEOUT_S,
                 context: zmq.Context | None = None) -> None:
        self.context = context or zmq.Context.instance()
        self.topic = topic
        self.followers = [
            StreamFollower(self.context, rank, offset_port(endpoint, rank),
                           None if replay_endpoint is None else offset_port(replay_endpoint, rank),
                           topic, replay_timeout_s)
            for rank in range(data_parallel_size)
        ]
        self.poller = zmq.Poller()
        for follower in self.followers:
            self.poller.register(follower.sub, zmq.POLLIN)

    @property
    def endpoints(self) -> list[str]:
        return [f.endpoint for f in self.followers]

    def poll(self, timeout_ms: int = 0, max_frames: int = 1_000) -> ClientUpdate:
        """Wait up to `timeout_ms` for frames, then take every frame ready (at most `max_frames`)."""
        update = ClientUpdate()
        ready = dict(self.poller.poll(timeout_ms))
        taken = 0
        while ready and taken < max_frames:
            for follower in self.followers:
                if follower.sub in ready:
                    update.extend(follower.on_frames(follower.sub.recv_multipart()))
                    taken += 1
            ready = dict(self.poller.poll(0))
        return update

    def catch_up(self) -> ClientUpdate:
        """Every rank's past batches through replay (StreamFollower.catch_up); nothing without a
        replay endpoint, or when no publisher answers within the timeout."""
        update = ClientUpdate()
        for follower in self.followers:
            update.extend(follower.catch_up())
        return update

    def close(self) -> None:
        for follower in self.followers:
            follower.close()

    def __enter__(self) -> "KVEventClient":
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

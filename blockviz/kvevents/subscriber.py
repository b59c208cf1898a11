"""The subscriber side: follow one or more vLLM KV-event publishers' sequence numbers, and fill
gaps through the replay socket (vLLM examples/online_serving/kv_events_subscriber.py does the same
for one publisher).

Each publisher numbers its batches 0, 1, 2, ... A frame whose number skips ahead reveals a gap:
frames the SUB socket never got (it joined late, or it fell behind its high-water mark and frames
were dropped). With a replay endpoint the missing batches are asked for (a DEALER sends the first
missing number; vLLM's ROUTER answers `[topic, seq, payload]` per batch and ends with
`[b"", -1, b""]`, or before vLLM 0.26 `[seq, payload]` and `[-1, b""]`) and delivered in order,
marked `replayed`. A replay that does not end (no end marker within its deadline) is reported as
such; what did not come back stays a gap. Without a replay endpoint the gap is only recorded.
Numbers that go back (a publisher restart), negative ones and implausible jumps are shown as what
they are (StreamFollower), never allowed to hide later batches.

A data-parallel vLLM publishes rank r on the base port + r; `KVEventClient` follows each rank's
publisher on its own SUB socket (their numbers are independent). No torch, no textual here.
"""

from __future__ import annotations

import time
from collections import deque
from dataclasses import dataclass, field
from typing import Callable

import zmq

from blockviz.kvevents.endpoints import offset_port, open_socket
from blockviz.kvevents.protocol import (
    END_SEQ,
    MAX_PAYLOAD_BYTES,
    EventBatch,
    ProtocolError,
    WireShape,
    decode_batch_shape,
    seq_bytes,
    seq_from_bytes,
)

DEFAULT_REPLAY_TIMEOUT_S = 2.0  # no answer for this long: the replay socket is not answering
DEFAULT_REPLAY_DEADLINE_S = 10.0  # a replay not ended by then is cut off and reported
MAX_REPLAY_BATCHES = 100_000  # batches kept from one replay (vLLM buffers 10,000 by default)
MAX_PLAUSIBLE_JUMP = 1_000_000  # a number further ahead than this is not taken for a gap
REPLAY_POLL_MS = 50  # how often a replay in progress checks its deadline and should_stop
# A frame bigger than this is not even received (ZMQ drops the connection, which then reconnects):
# one from MAX_PAYLOAD_BYTES up to it arrives and is refused by the decoder, with a notice.
MAX_FRAME_BYTES = 4 * MAX_PAYLOAD_BYTES


@dataclass(frozen=True, slots=True)
class Received:
    """One batch as it arrived: from publisher `stream` (0 .. data-parallel size - 1), number `seq`,
    in wire `shape`; `restarted`: the publisher restarted just before it (the rank starts again);
    `followed` False: its number was not taken as the stream's (-1, an implausible jump)."""

    stream: int
    seq: int
    batch: EventBatch
    replayed: bool = False
    shape: WireShape | None = None
    restarted: bool = False
    followed: bool = True

    @property
    def rank(self) -> int:
        """The batch's data_parallel_rank, else the publisher it came from."""
        rank = self.batch.data_parallel_rank
        return self.stream if rank is None else rank


@dataclass(frozen=True, slots=True)
class Gap:
    """Publisher `stream`'s batches `first_seq` .. `last_seq` were missed on the SUB socket;
    `num_recovered` of them came back through replay (`replay_asked` says whether it was asked,
    `replay_ended` whether its end marker came). `plausible` False: the numbers jumped further
    than any real gap (not counted as lost)."""

    stream: int
    first_seq: int
    last_seq: int
    num_recovered: int
    replay_asked: bool
    joined_late: bool
    replay_ended: bool = True
    plausible: bool = True

    @property
    def num_missing(self) -> int:
        return self.last_seq - self.first_seq + 1

    @property
    def num_lost(self) -> int:
        return self.num_missing - self.num_recovered if self.plausible else 0

    def describe(self) -> str:
        """One line for a view."""
        span = f"#{self.first_seq}" if self.first_seq == self.last_seq else f"#{self.first_seq}-#{self.last_seq}"
        if not self.plausible:
            return f"rank {self.stream}: numbers jumped over {span} (not a gap replay could fill; not counted)"
        what = "joined late: missed" if self.joined_late else "missed"
        if not self.replay_asked:
            after = "no replay endpoint"
        elif self.num_lost == 0:
            after = "all replayed"
        else:
            after = f"{self.num_recovered} replayed, {self.num_lost} lost"
        if self.replay_asked and not self.replay_ended:
            after += "; the replay did not end"
        return f"rank {self.stream}: {what} {span} ({after})"


@dataclass(slots=True)
class ClientUpdate:
    """What one poll brought: batches in order, gaps, and one-line notices (bad payloads, restarts)."""

    received: list[Received] = field(default_factory=list)
    gaps: list[Gap] = field(default_factory=list)
    notices: list[str] = field(default_factory=list)
    replay_topic: bool | None = None  # whether replay answers carried a topic frame (None: no answer)

    def extend(self, other: "ClientUpdate") -> None:
        self.received += other.received
        self.gaps += other.gaps
        self.notices += other.notices
        if other.replay_topic is not None:
            self.replay_topic = other.replay_topic


class StreamFollower:
    """One publisher: a SUB socket, its sequence numbers, and a replay DEALER when configured.

    Live frames of one publisher arrive in order, so a number at or below the last live one means
    the publisher restarted (vLLM numbers from 0 per process): the rank's picture is reset and
    said so. Numbers already delivered through replay (ahead of the live stream) are skipped when
    the payload is the one replayed. A number more than MAX_PLAUSIBLE_JUMP ahead, or a negative
    one, is shown with its batch, not followed (later batches keep their numbering) unless the
    next number continues from it. Every replay request has an overall deadline.
    """

    def __init__(self, context: zmq.Context, stream: int, endpoint: str, replay_endpoint: str | None,
                 topic: str, replay_timeout_s: float, replay_deadline_s: float,
                 should_stop: Callable[[], bool]) -> None:
        self.context, self.stream = context, stream
        self.endpoint, self.replay_endpoint = endpoint, replay_endpoint
        self.replay_timeout_s, self.replay_deadline_s = replay_timeout_s, replay_deadline_s
        self.should_stop = should_stop
        self.last_seq: int | None = None  # the last number followed (live or replayed)
        self.last_live_seq: int | None = None  # the last number followed on the SUB socket
        self._replayed_ahead: deque[tuple[int, int]] = deque(maxlen=MAX_REPLAY_BATCHES)  # (seq, payload hash)
        self._jump_to: int | None = None  # an implausible number shown, followed if the next continues it
        self._restart_pending = False
        self.sub = open_socket(context, zmq.SUB, endpoint, bind=False)
        self.sub.setsockopt(zmq.MAXMSGSIZE, MAX_FRAME_BYTES)
        self.sub.setsockopt(zmq.SUBSCRIBE, topic.encode("utf-8"))
        self._dealer: zmq.Socket | None = None

    # ------------------------------------------------------------------ live frames

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
        if self._is_replayed_copy(seq, frames[2]):
            return update
        if self.last_seq is not None and 0 <= seq <= self.last_seq:  # not a replayed copy: a new stream
            update.notices.append(f"rank {self.stream}: sequence numbers went back from #{self.last_seq} to "
                                  f"#{seq}: the publisher restarted; the picture of this rank starts again")
            self.last_seq = self.last_live_seq = None
            self._replayed_ahead.clear()
            self._restart_pending = True
        expected = 0 if self.last_seq is None else self.last_seq + 1
        if seq < 0 or (self.last_seq is not None and seq - expected > MAX_PLAUSIBLE_JUMP):
            if self._jump_to is None or seq != self._jump_to + 1:
                return self._unfollowed(update, seq, expected, frames[2])
            update.notices.append(f"rank {self.stream}: numbering continues from #{self._jump_to}: followed from there")
            update.gaps.append(Gap(self.stream, expected, self._jump_to, 0, False, False, plausible=False))
            expected = seq
        self._jump_to = None
        if seq > expected:
            update.extend(self._fill_gap(expected, seq - 1, joined_late=self.last_seq is None and not self._restart_pending))
        self._deliver(update, seq, frames[2], replayed=False)
        self.last_live_seq = seq
        while self._replayed_ahead and self._replayed_ahead[0][0] <= seq:
            self._replayed_ahead.popleft()
        return update

    def _is_replayed_copy(self, seq: int, payload: bytes) -> bool:
        """Whether this live frame is a batch that replay delivered already (same number, same bytes)."""
        if self.last_seq is None or seq > self.last_seq or not self._replayed_ahead:
            return False
        if self.last_live_seq is not None and seq <= self.last_live_seq:
            return False
        for replayed_seq, digest in self._replayed_ahead:
            if replayed_seq == seq:
                if digest != hash(payload):
                    return False  # another batch under a number replayed: a restart, handled by the caller
                self.last_live_seq = seq
                return True
        return True  # older than what is remembered: taken as delivered

    def _unfollowed(self, update: ClientUpdate, seq: int, expected: int, payload: bytes) -> ClientUpdate:
        """A number that cannot be followed: shown with its batch, numbering kept (a bounded replay
        is asked for what may truly be missing before it)."""
        if seq < 0:
            what = "the replay end marker's number" if seq == END_SEQ else "a number past 2**63"
            kept = "none followed yet" if self.last_seq is None else f"numbering kept at #{self.last_seq}"
            update.notices.append(f"rank {self.stream}: sequence number {seq} ({what}) on the live stream: "
                                  f"batch shown, {kept}")
        else:
            update.notices.append(f"rank {self.stream}: sequence number jumped from #{expected - 1} to #{seq} "
                                  f"(more than {MAX_PLAUSIBLE_JUMP:,} ahead): batch shown, numbering kept "
                                  f"unless #{seq + 1} follows")
            self._jump_to = seq
            if self.replay_endpoint is not None:
                update.extend(self.catch_up())
        self._deliver(update, seq, payload, replayed=False, follow=False)
        return update

    def _deliver(self, update: ClientUpdate, seq: int, payload: bytes, replayed: bool, follow: bool = True) -> None:
        if follow:
            self.last_seq = seq
        try:
            batch, shape = decode_batch_shape(payload)
        except ProtocolError as exc:
            update.notices.append(f"rank {self.stream} #{seq}: {exc}: skipped")
            return
        update.received.append(Received(self.stream, seq, batch, replayed, shape, self._restart_pending, follow))
        self._restart_pending = False

    # ------------------------------------------------------------------ replay

    def catch_up(self) -> ClientUpdate:
        """Ask the replay socket for every batch after the last one followed (all of them before
        the first): a subscriber that connects to a running publisher sees its past too."""
        update = ClientUpdate()
        if self.replay_endpoint is None:
            return update
        first, joined_late = (0, True) if self.last_seq is None else (self.last_seq + 1, False)
        result = self._replay(first, None)
        self._deliver_replayed(update, result)
        if result.batches:
            update.gaps.append(Gap(self.stream, first, result.batches[-1][0], len(result.batches), True, joined_late,
                                   result.ended))
        if not result.ended:
            update.notices.append(self._unended(first, result))
        return update

    def _fill_gap(self, first: int, last: int, joined_late: bool) -> ClientUpdate:
        update = ClientUpdate()
        if self.replay_endpoint is None:
            update.gaps.append(Gap(self.stream, first, last, 0, False, joined_late))
            return update
        result = self._replay(first, last)
        self._deliver_replayed(update, result)
        update.gaps.append(Gap(self.stream, first, last, len(result.batches), True, joined_late, result.ended))
        if not result.ended:
            update.notices.append(self._unended(first, result))
        return update

    def _deliver_replayed(self, update: ClientUpdate, result: "ReplayResult") -> None:
        for seq, payload in result.batches:
            self._deliver(update, seq, payload, replayed=True)
            self._replayed_ahead.append((seq, hash(payload)))
        if result.topic_frames is not None:
            update.replay_topic = result.topic_frames

    def _unended(self, first: int, result: "ReplayResult") -> str:
        why = {"stopped": "stopped", "silent": f"no answer for {self.replay_timeout_s:g} s",
               "deadline": f"no end marker within {self.replay_deadline_s:g} s"}[result.why]
        if result.why == "silent" and not result.batches and self.last_seq is None:
            # nothing followed yet and nobody answers: most often the publisher is not up yet (attach
            # started first); its batches will come live, and the first one asks replay for any before it
            return (f"rank {self.stream}: replay from #{first}: {why}, no publisher there yet?: following the "
                    "live stream (its first batch asks replay for any missed; r asks again)")
        return (f"rank {self.stream}: replay from #{first}: {why} "
                f"({len(result.batches)} batch{'es' if len(result.batches) != 1 else ''} came)")

    def _replay(self, first: int, last: int | None) -> "ReplayResult":
        """Ask the ROUTER for batches from `first` on; keep those up to `last` (None: all), in
        order, at most MAX_REPLAY_BATCHES. vLLM answers `[topic, seq, payload]` per batch and ends
        with `[b"", -1, b""]` (before 0.26 without the topic frame: both are read). It ends at the
        end marker, after `replay_timeout_s` without an answer, at `replay_deadline_s` overall, or
        when `should_stop()`; the socket is then replaced, so a late answer cannot be taken for
        the next request."""
        if self._dealer is None:
            self._dealer = open_socket(self.context, zmq.DEALER, self.replay_endpoint, bind=False)
            self._dealer.setsockopt(zmq.MAXMSGSIZE, MAX_FRAME_BYTES)
        self._dealer.send_multipart((b"", seq_bytes(first)))
        start = last_answer = time.monotonic()
        got: dict[int, bytes] = {}
        result = ReplayResult([], ended=False, why="deadline", topic_frames=None)
        while True:
            now = time.monotonic()
            if self.should_stop():
                result.why = "stopped"
                break
            if now - start >= self.replay_deadline_s:
                break
            if now - last_answer >= self.replay_timeout_s:
                result.why = "silent"
                break
            if not self._dealer.poll(REPLAY_POLL_MS):
                continue
            last_answer = time.monotonic()
            frames = self._dealer.recv_multipart()
            if frames and frames[0] == b"":
                frames = frames[1:]  # the DEALER's empty delimiter
            if len(frames) not in (2, 3):
                continue
            try:
                seq = seq_from_bytes(frames[-2])
            except ProtocolError:
                continue
            if seq == END_SEQ:
                result.ended = True
                break
            result.topic_frames = len(frames) == 3
            if seq >= first and (last is None or seq <= last) and len(got) < MAX_REPLAY_BATCHES:
                got[seq] = frames[-1]
        if not result.ended:
            self._dealer.close(linger=0)
            self._dealer = None
        result.batches = sorted(got.items())
        return result

    def close(self) -> None:
        self.sub.close(linger=0)
        if self._dealer is not None:
            self._dealer.close(linger=0)


@dataclass(slots=True)
class ReplayResult:
    """One replay request's answer: the batches kept, in order; whether the end marker came (else
    `why` not: "deadline", "silent" or "stopped"); whether answers carried a topic frame."""

    batches: list[tuple[int, bytes]]
    ended: bool
    why: str
    topic_frames: bool | None


class KVEventClient:
    """Follows `data_parallel_size` publishers: rank r on `endpoint`'s port + r (and its replay on
    `replay_endpoint`'s port + r). `poll` returns what arrived, in order per publisher;
    `should_stop` (checked while a replay is awaited) lets a UI end a long replay at once."""

    def __init__(self, endpoint: str, replay_endpoint: str | None = None, *, topic: str = "kv-events",
                 data_parallel_size: int = 1, replay_timeout_s: float = DEFAULT_REPLAY_TIMEOUT_S,
                 replay_deadline_s: float = DEFAULT_REPLAY_DEADLINE_S,
                 should_stop: Callable[[], bool] = lambda: False, context: zmq.Context | None = None) -> None:
        self.context = context or zmq.Context.instance()
        self.topic = topic
        self.followers: list[StreamFollower] = []
        try:
            for rank in range(data_parallel_size):
                self.followers.append(StreamFollower(
                    self.context, rank, offset_port(endpoint, rank),
                    None if replay_endpoint is None else offset_port(replay_endpoint, rank),
                    topic, replay_timeout_s, replay_deadline_s, should_stop))
        except zmq.ZMQError:
            self.close()
            raise
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

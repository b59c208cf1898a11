"""A vLLM-compatible KV-event publisher: a PUB socket, a replay buffer and a ROUTER that replays it.

It speaks what vLLM's ZmqEventPublisher speaks (vllm/distributed/kv_events.py), in the wire
format of the release asked for (protocol.py, default the newest): frames `[topic, seq as 8 bytes
big-endian, payload]`, sequence numbers from 0 per publisher, and on the replay ROUTER a request
`[start seq as 8 bytes]` (behind a REQ or DEALER envelope) answered with one
`[topic, seq, payload]` per buffered batch from `start` on, then `[b"", -1, b""]` (vLLM >= 0.26;
older releases answer `[seq, payload]` and end with `[-1, b""]`).

Unlike vLLM's it runs in the caller's thread (no queue, no publisher thread): the caller publishes
and calls `serve_replay` between publishes, so one thread owns both sockets. The PUB socket is an
XPUB, which is a PUB to every subscriber and also tells this side when one subscribes
(`wait_for_subscribers`), so a trace is not published into the void before anyone listens.
"""

from __future__ import annotations

import time
from collections import deque
from typing import Sequence

import zmq

from blockviz.kvevents.endpoints import open_socket
from blockviz.kvevents.protocol import (
    END_SEQ,
    NEWEST_FORMAT,
    KVCacheEvent,
    WireFormat,
    encode_batch,
    seq_bytes,
)

DEFAULT_BUFFER_STEPS = 10_000  # vLLM's default replay buffer length (KVEventsConfig.buffer_steps)
LINGER_MS = 1_000  # on close, how long queued frames may still go out


class KVEventPublisher:
    """Publishes EventBatches on `endpoint` (bound) and replays them on `replay_endpoint` (bound).

    `data_parallel_rank` is written in every batch; a data-parallel vLLM runs one publisher per
    rank on the base port + rank (vLLM ZmqEventPublisher.offset_endpoint_port). Payloads are in
    the `wire` format (protocol.WIRE_FORMATS; default the newest release's).
    """

    def __init__(self, endpoint: str, replay_endpoint: str | None = None, *, topic: str = "kv-events",
                 data_parallel_rank: int = 0, buffer_steps: int = DEFAULT_BUFFER_STEPS,
                 wire: WireFormat = NEWEST_FORMAT, context: zmq.Context | None = None) -> None:
        self.context = context or zmq.Context.instance()
        self.topic = topic.encode("utf-8")
        self.data_parallel_rank = data_parallel_rank
        self.wire = wire
        self.buffer: deque[tuple[int, bytes]] = deque(maxlen=buffer_steps)
        self.next_seq = 0
        self.num_replay_requests = 0
        self.num_subscriptions = 0
        self.pub = open_socket(self.context, zmq.XPUB, endpoint, bind=True)
        self.pub.setsockopt(zmq.XPUB_VERBOSE, 1)  # every subscriber's subscription, not just the first
        self.replay: zmq.Socket | None = None
        if replay_endpoint is not None:
            try:
                self.replay = open_socket(self.context, zmq.ROUTER, replay_endpoint, bind=True)
            except zmq.ZMQError:
                self.close(linger=0)
                raise
            # vLLM's replay high-water mark: a whole buffer and its end marker always fit
            self.replay.setsockopt(zmq.SNDHWM, 2 * (buffer_steps + 1))

    def publish(self, events: Sequence[KVCacheEvent], *, ts: float | None = None) -> int:
        """Send one batch; returns its sequence number. It is kept for replay."""
        seq = self.next_seq
        payload = encode_batch(events, ts=ts, data_parallel_rank=self.data_parallel_rank, wire=self.wire)
        self.pub.send_multipart((self.topic, seq_bytes(seq), payload), copy=False)
        self.buffer.append((seq, payload))
        self.next_seq += 1
        self._drain_subscriptions()
        return seq

    def _drain_subscriptions(self) -> None:
        """Read XPUB's (un)subscription messages: b"\\x01topic" subscribes, b"\\x00topic" leaves."""
        while self.pub.poll(0):
            message = self.pub.recv()
            if not self.topic.startswith(message[1:]):
                continue  # a subscription to other topics receives nothing from here
            if message[:1] == b"\x01":
                self.num_subscriptions += 1
            elif message[:1] == b"\x00":
                self.num_subscriptions = max(0, self.num_subscriptions - 1)

    def wait_for_subscribers(self, count: int = 1, timeout_s: float | None = None) -> bool:
        """Block until `count` subscriptions arrived (serving replay meanwhile); False on timeout."""
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        while self.num_subscriptions < count:
            if deadline is not None and time.monotonic() >= deadline:
                return False
            if self.pub.poll(50):
                self._drain_subscriptions()
            self.serve_replay(0)
        return True

    def serve_replay(self, timeout_ms: int = 0) -> int:
        """Answer the replay requests that arrive within `timeout_ms`; returns how many."""
        if self.replay is None:
            if timeout_ms:
                time.sleep(timeout_ms / 1000)
            return 0
        answered = 0
        while self.replay.poll(timeout_ms if answered == 0 else 0):
            frames = self.replay.recv_multipart()
            if len(frames) == 3 and len(frames[2]) == 8:
                self._replay_from(frames[0], int.from_bytes(frames[2], "big"))  # unsigned, as vLLM reads it
                answered += 1
            # anything else is not a replay request: ignored, as vLLM does
        self.num_replay_requests += answered
        return answered

    def _replay_from(self, client: bytes, start_seq: int) -> None:
        """Every buffered batch from `start_seq` on, then the end marker (vLLM
        ZmqEventPublisher._service_replay), with the topic frame when the format has one."""
        assert self.replay is not None
        topic = (self.topic,) if self.wire.replay_topic else ()
        for seq, payload in self.buffer:
            if seq >= start_seq:
                self.replay.send_multipart((client, b"", *topic, seq_bytes(seq), payload))
        self.replay.send_multipart((client, b"", *(b"" for _ in topic), seq_bytes(END_SEQ), b""))

    def close(self, linger: int = LINGER_MS) -> None:
        """Close both sockets, letting queued frames go out for up to `linger` ms."""
        self.pub.close(linger=linger)
        if self.replay is not None:
            self.replay.close(linger=linger)

    def __enter__(self) -> "KVEventPublisher":
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

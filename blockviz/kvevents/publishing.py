"""What `blockviz publish` runs: a trace's batches or a live engine's, paced, on a KVEventPublisher.

A batch is what one engine step stored and removed (mapping.py). Pacing sends at most `rate`
batches a second (0: as fast as the socket takes them) and answers replay requests while it
waits; once everything is sent, `serve_forever` keeps answering them until Ctrl-C. No textual;
torch only for a live engine (EngineSpec.make_engine).
"""

from __future__ import annotations

import sys
import time
from typing import IO, Callable, Iterable, Iterator

from blockviz.kvevents.mapping import mapper_for
from blockviz.kvevents.protocol import BlockRemoved, BlockStored, KVCacheEvent
from blockviz.kvevents.publisher import KVEventPublisher


class Progress:
    """One status line on stderr: rewritten in place on a terminal, printed at the end otherwise."""

    def __init__(self, stream: IO[str] | None = None) -> None:
        self.stream = stream or sys.stderr
        self.live = self.stream.isatty()
        self.num_batches = self.num_stored = self.num_removed = 0
        self._width = 0

    def count(self, events: Iterable[KVCacheEvent]) -> None:
        self.num_batches += 1
        for event in events:
            if isinstance(event, BlockStored):
                self.num_stored += len(event.block_hashes)
            elif isinstance(event, BlockRemoved):
                self.num_removed += len(event.block_hashes)

    def line(self, publisher: KVEventPublisher) -> str:
        return (f"published {self.num_batches} batches ({self.num_stored} blocks stored, "
                f"{self.num_removed} removed) · {publisher.num_replay_requests} replay requests")

    def show(self, publisher: KVEventPublisher, final: bool = False) -> None:
        text = self.line(publisher)
        if self.live:
            self.stream.write("\r" + text.ljust(self._width) + ("\n" if final else ""))
            self._width = len(text)
        elif final:
            self.stream.write(text + "\n")
        self.stream.flush()

    def say(self, text: str) -> None:
        """A line of its own (a terminal's status line is ended first)."""
        if self.live and self._width:
            self.stream.write("\n")
            self._width = 0
        self.stream.write(text + "\n")
        self.stream.flush()


class Pacer:
    """At most `rate` sends a second (0: no limit), serving replay requests while it waits."""

    def __init__(self, publisher: KVEventPublisher, rate: float) -> None:
        self.publisher = publisher
        self.interval = 1.0 / rate if rate > 0 else 0.0
        self._next = time.monotonic()

    def wait(self) -> None:
        while True:
            left = self._next - time.monotonic()
            if left <= 0:
                break
            self.publisher.serve_replay(max(1, int(left * 1000)))
        self.publisher.serve_replay(0)
        self._next = max(self._next, time.monotonic() - self.interval) + self.interval


def publish_batches(publisher: KVEventPublisher, batches: Iterable[list[KVCacheEvent]], *, rate: float,
                    progress: Progress) -> int:
    """Publish each batch, paced; returns how many were sent."""
    pacer = Pacer(publisher, rate)
    for events in batches:
        pacer.wait()
        publisher.publish(events)
        progress.count(events)
        progress.show(publisher)
    progress.show(publisher, final=True)
    return progress.num_batches


def live_batches(spec, *, on_event: Callable | None = None, max_steps: int = 100_000) -> Iterator[list[KVCacheEvent]]:
    """Run `spec`'s requests (prompts at once, arrivals as the engine steps) in an engine session
    on a fresh engine and yield each step's vLLM events (steps that stored or removed nothing
    yield nothing). `on_event` also receives every engine event (tests compare with the engine's
    own stream)."""
    from blockviz.model.design import kv_cache_groups_of
    from blockviz.session.engine_session import EngineSession

    session = EngineSession(spec)
    mapper = mapper_for(session.header.get("kv_manager"), session.header["block_size"],
                        kv_cache_groups_of(session.header))

    def feed() -> None:
        for event in session.take_events():
            mapper.feed(event)
            if on_event is not None:
                on_event(event)

    try:
        session.start()
        feed()
        for _ in range(max_steps):
            if not session.has_unfinished_requests():
                break
            session.step()
            feed()
            events = mapper.take_events()
            if events:
                yield events
    finally:
        session.close()


def serve_forever(publisher: KVEventPublisher, progress: Progress) -> None:
    """Answer replay requests until interrupted (Ctrl-C ends the command)."""
    while True:
        if publisher.serve_replay(500):
            progress.show(publisher)

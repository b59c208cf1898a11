"""How the Visualizer plays: frames sent at most MAX_FPS times a second (`FrameThrottle`), and a
live engine stepped into the timeline (`EngineDriver`), free-running at "max" with its K/V digests
held back until the end of each tick, as the TUI's bridge does."""

from __future__ import annotations

import threading
import time
from typing import Any, Callable

from blockviz.model.player import Player
from blockviz.session.spec import one_line
from engine import events as ev

MAX_FPS = 20
PLAY_TICK_S = 1 / MAX_FPS
# Live at "max" the engine free-runs this long between frames: every frame (the reducer catching
# up, a snapshot, the views' sync) takes the GIL from the engine's thread.
THROUGHPUT_TICK_S = 0.25


class FrameThrottle:
    """Calls `send()` at most once per `min_interval` seconds: `request()` sends now if the last
    send is old enough, else makes sure one send happens when the interval is up (coalescing every
    request in between). `clock` and `schedule(delay, fn)` are injectable for tests."""

    def __init__(self, send: Callable[[], None], min_interval: float = 1 / MAX_FPS,
                 clock: Callable[[], float] = time.monotonic,
                 schedule: Callable[[float, Callable[[], None]], Any] | None = None) -> None:
        self._send = send
        self.min_interval = min_interval
        self._clock = clock
        self._schedule = schedule or _start_timer
        self._lock = threading.Lock()
        self._last = -float("inf")
        self._pending = False
        self._closed = False
        self.num_sent = 0

    def close(self) -> None:
        """No more frames: a timer still pending sends nothing (the views may be gone)."""
        with self._lock:
            self._closed = True

    def request(self) -> None:
        with self._lock:
            if self._pending or self._closed:
                return
            wait = self._last + self.min_interval - self._clock()
            if wait > 0:
                self._pending = True
                self._schedule(wait, self._fire)
                return
            self._last = self._clock()
        self._do_send()

    def flush(self) -> None:
        """Send now (a pending timer still fires, sending the then-current frame)."""
        with self._lock:
            self._last = self._clock()
        self._do_send()

    def _fire(self) -> None:
        with self._lock:
            self._pending = False
            if self._closed:
                return
            self._last = self._clock()
        self._do_send()

    def _do_send(self) -> None:
        self.num_sent += 1
        self._send()


def _start_timer(delay: float, fn: Callable[[], None]) -> None:
    timer = threading.Timer(delay, fn)
    timer.daemon = True
    timer.start()


class EngineDriver:
    """A live LLMEngine feeding a Timeline (every method with the Visualizer's lock held): its
    events gathered from the event bus, one LLMEngine.step at a time."""

    def __init__(self, engine: Any, player: Player, on_error: Callable[[str], None]) -> None:
        self.engine = engine
        self.player = player
        self.timeline = player.timeline
        self.finished: dict[str, Any] = {}  # request id -> its final RequestOutput
        self._on_error = on_error
        self._buffer: list[ev.Event] = []
        self._unsubscribe = engine.events.subscribe(self._buffer.append)

    def close(self) -> None:
        """Stop listening to the engine's events."""
        self._unsubscribe()

    def take_events(self) -> None:
        """Move what the engine emitted into the timeline."""
        if self._buffer:
            batch, self._buffer[:] = self._buffer[:], []
            self.timeline.extend(batch)

    def step(self) -> bool:
        """One LLMEngine.step() if any request is unfinished; its events join the timeline.
        Returns whether a step ran. An engine error goes to `on_error` as one line and is raised."""
        engine = self.engine
        if not engine.has_unfinished_requests():
            self.player.finished = True
            return False
        try:
            for output in engine.step():
                if output.finished:
                    self.finished[output.request_id] = output
        except Exception as exc:
            self._on_error(f"engine stopped: {one_line(exc)}")
            self.player.finished = True
            self.take_events()
            raise
        self.take_events()
        if not engine.has_unfinished_requests():
            self.player.finished = True
        return True

    def run_until(self, deadline: float, free_run: bool) -> None:
        """Step until `deadline` (time.monotonic): free-running, digesting the blocks written once
        at the end, or only as far as playback needs (the Player's lookahead)."""
        try:
            self.digest_per_step(not free_run)
            while (free_run or self.player.engine_steps_wanted() > 0) and time.monotonic() < deadline:
                if not self.step():
                    break
        finally:
            self.digest_per_step(True)

    def digest_per_step(self, per_step: bool) -> None:
        """LLMEngine.kv_digests_per_step: when turned back on, digest what was held back."""
        engine = self.engine
        if not hasattr(engine, "kv_digests_per_step"):
            return
        if per_step and not engine.kv_digests_per_step:
            engine.emit_kv_digests()
            self.take_events()
        engine.kv_digests_per_step = per_step


def play_loop(player: Player, lock: Any, driver: EngineDriver | None, stop: threading.Event,
              changed: Callable[[], None]) -> None:
    """The play thread's body: each tick (with `lock` held) steps a live engine as far as playback
    needs, or free-runs it for THROUGHPUT_TICK_S at "max"; advances the Player by the time passed;
    then asks for a frame (`changed`). Ends when playback stops or `stop` is set."""
    last = time.monotonic()
    while not stop.is_set():
        started = time.monotonic()
        with lock:
            if stop.is_set():
                break
            # Live at "max" the engine free-runs for the whole tick (digesting the blocks it
            # wrote once per tick, as the TUI's bridge does); otherwise it steps only as far
            # as playback needs (the Player's lookahead).
            free_run = player.throughput_mode
            try:
                if driver is not None:
                    driver.run_until(started + (THROUGHPUT_TICK_S if free_run else PLAY_TICK_S), free_run)
            except Exception:  # noqa: BLE001 - the driver has reported the one line
                player.playing = False
            now = time.monotonic()
            player.tick(now - last)
            last = now
            playing = player.playing
        changed()
        if not playing:
            break
        if not free_run:
            stop.wait(max(0.0, PLAY_TICK_S - (time.monotonic() - started)))

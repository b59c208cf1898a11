"""How the Visualizer plays: frames sent at most MAX_FPS times a second (`FrameThrottle`), and a
live engine session stepped into the Player's timeline by the session's EngineDriver
(`PlayerDriver`), free-running at "max" with its K/V digests taken once per tick, as the TUI's
bridge does."""

from __future__ import annotations

import threading
import time
from typing import Any, Callable

from blockviz.model.player import Player
from blockviz.session.engine_driver import EngineDriver, Listener
from blockviz.session.engine_session import EngineSession

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


def _ignore(_: Any) -> None:
    """A Listener callback the notebook has no use for (its session is built before the driver)."""


def _start_timer(delay: float, fn: Callable[[], None]) -> None:
    timer = threading.Timer(delay, fn)
    timer.daemon = True
    timer.start()


class PlayerDriver(EngineDriver):
    """The session's EngineDriver (blockviz/session/engine_driver.py) feeding the Player's timeline,
    every method called with the Visualizer's lock held. What the notebook adds is when to step:
    as far as playback needs (a pending single step, the Player's lookahead), or free-running for
    a tick at "max"; and the Player told when the run is finished."""

    def __init__(self, session: EngineSession, player: Player, on_error: Callable[[str], None]) -> None:
        super().__init__(session, Listener(loading=_ignore, ready=_ignore, failed=on_error,
                                           events=player.on_events, died=on_error))
        self.player = player

    def step(self, take: bool = True) -> bool:
        """One engine step if any request is unfinished; its events join the timeline (with
        `take` False they wait in the session: a free run takes them, digests and all, once per
        tick). Returns whether a step ran. An engine error goes to `on_error` as one line
        (EngineDriver.stopped) and is raised."""
        try:
            ran = super().step()
        except Exception as exc:
            self.player.finished = True
            self.stopped(exc)
            raise
        if ran and take:
            self.flush()
        if not self.session.has_unfinished_requests():
            self.player.finished = True
        return ran

    def serve_pending(self) -> bool:
        """Step until the Player's pending single step (Player.step_event / step_engine at the
        newest event) is served, or the engine has nothing left to run; returns whether the cursor
        moved."""
        moved = False
        while self.player.pending is not None:
            before = self.player.timeline.position
            if not self.step():
                self.player.pending = None
                break
            moved = moved or self.player.timeline.position != before
        return moved

    def run_until(self, deadline: float, free_run: bool) -> None:
        """Step until `deadline` (time.monotonic): free-running, the blocks written digested once
        at the end, or only as far as playback needs (the Player's lookahead)."""
        try:
            self.session.digest_per_step(not free_run)
            while (free_run or self.player.engine_steps_wanted() > 0) and time.monotonic() < deadline:
                if not self.step(take=not free_run):
                    break
        finally:
            self.session.digest_per_step(True)
            self.flush()


def play_loop(player: Player, lock: Any, driver: PlayerDriver | None, stop: threading.Event,
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

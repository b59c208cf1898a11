"""Playback policy for the TUI, with no textual import: which frame timer runs, when a frame is
drawn and how much of it, what a live engine is asked for, and the garbage collector while the app
runs.

The App makes a `PlaybackController` once the timeline exists (a replay at once, a live run when
the engine is ready) and hands it its `set_interval` and a `draw(full)` callback; the controller
owns the timers and calls `draw` when a frame is due. Tests drive it with fake timers and a fake
clock, no terminal.
"""

from __future__ import annotations

import gc
import math
import time
from typing import Any, Callable, Protocol

from blockviz.model.player import Player
from blockviz.tui.bridge import Bridge

FRAME_S = 1 / 30
PANEL_HZ = 5  # text panels' redraw rate during playback (the pools follow every frame)
THROUGHPUT_FPS = 1  # frames/s while a live engine free-runs at max speed (GIL and cores to the engine)
YOUNG_GC_OBJECTS = 20_000  # the youngest generation's collection threshold while the app runs
MAX_TICK_S = 0.25  # a late frame advances playback by at most this much
# Playing, waiting on a live engine that has sent nothing for this long: say it is not responding
NOT_RESPONDING_S = 5.0


class Timer(Protocol):
    """What `set_interval` returns (a Textual Timer)."""

    def pause(self) -> None: ...
    def resume(self) -> None: ...
    def reset(self) -> None: ...


class PlaybackController:
    """Plays a Player's timeline at frame rate and keeps a live engine (`bridge`) fed.

    Two timers: one at FRAME_S while playing, and, while a live engine free-runs at max speed
    (`Player.throughput_mode`), a slow one at THROUGHPUT_FPS instead: every wake-up of the UI
    takes CPU from the engine, so the views follow once a second, drawn when a batch arrives and a
    frame is due, else by the slow timer.
    """

    def __init__(self, player: Player, bridge: Bridge | None, *,
                 set_interval: Callable[..., Timer], draw: Callable[[bool], None],
                 clock: Callable[[], float] = time.monotonic,
                 not_responding: Callable[[bool], None] = lambda stalled: None) -> None:
        self.player = player
        self.bridge = bridge
        self._draw = draw
        self._clock = clock
        self._not_responding = not_responding  # called with True once the engine stalls, False once it answers
        self.stalled = False
        self.last_heard = clock()  # the last batch from the engine, or the last moment nothing was awaited
        self.last_tick = 0.0
        self.panels_drawn = 0.0
        self.dirty = False  # the cursor moved since the last frame
        self._frame_timer = set_interval(FRAME_S, self.tick, pause=True)
        self._slow_timer = set_interval(1 / THROUGHPUT_FPS, self.tick, pause=True)

    # ------------------------------------------------------------------ playing

    def set_playing(self, playing: bool) -> None:
        if playing and not self.player.playing:
            self.last_tick = self._clock()
        self.player.playing = playing
        self.feed_engine()

    def toggle_play(self) -> None:
        self.set_playing(self.player.toggle_play())

    def engine_idle(self) -> None:
        """The engine has nothing left to run: play on to the timeline's end, no further."""
        self.player.finished = True
        self.player.pending = None
        self.set_playing(self.player.playing and not self.player.timeline.at_end)

    def engine_died(self) -> None:
        """The engine stopped mid-run: pause on what it sent."""
        self.player.finished = True
        self.set_playing(False)

    def tick(self) -> None:
        """A frame timer fired: advance playback by the time since the last frame, and draw."""
        now = self._clock()
        dt, self.last_tick = min(now - self.last_tick, MAX_TICK_S), now
        moved = self.player.tick(dt)
        self.feed_engine()
        self._check_engine(now)
        if moved or self.dirty:
            self._draw(not self.player.playing)

    def frame_drawn(self, full: bool) -> bool:
        """A frame is being drawn (the pools and the status bar); returns whether the text panels
        are drawn too: always when `full`, else at PANEL_HZ, and not at all in throughput mode
        (a redraw of text panels relayouts the screen)."""
        self.dirty = False
        now = self._clock()
        if full or (not self.player.throughput_mode and now - self.panels_drawn >= 1 / PANEL_HZ):
            self.panels_drawn = now
            return True
        return False

    # ------------------------------------------------------------------ the live engine

    def on_events(self, events: list[Any]) -> None:
        """A batch arrived from the engine: into the timeline, acknowledged, drawn when due."""
        moved = self.player.on_events(events)
        self.bridge.acknowledge(len(events))
        self.last_heard = self._clock()
        self._check_engine(self.last_heard)
        self.dirty = self.dirty or moved
        if self.player.throughput_mode and self._clock() - self.last_tick >= 1 / THROUGHPUT_FPS:
            # A frame is due: draw it now, while this process is awake anyway (and feed the
            # engine); the slow timer starts over, to draw only if no batch comes for a frame.
            self._slow_timer.reset()
            self.tick()
            return
        self.feed_engine()
        if not self.player.playing:
            self._draw(True)  # else the next frame draws it

    def feed_engine(self) -> None:
        """Set the frame timers for playback, and ask a live engine for what playback needs now
        (the backpressure lives in the bridge)."""
        player = self.player
        slow = player.throughput_mode
        (self._frame_timer.resume if player.playing and not slow else self._frame_timer.pause)()
        (self._slow_timer.resume if slow else self._slow_timer.pause)()
        if self.bridge is None:
            return
        self.bridge.set_free_run(player.playing and math.isinf(player.speed) and not player.finished)
        if player.engine_steps_wanted() and self.bridge.outstanding == 0:
            self.bridge.request_steps(1)


    def _check_engine(self, now: float) -> None:
        """Tell `not_responding` when playback has waited NOT_RESPONDING_S on a live engine that
        sends nothing (steps asked for, or a free run), and when it answers again."""
        player, bridge = self.player, self.bridge
        waiting = (bridge is not None and player.playing and not player.finished
                   and (bridge.outstanding > 0 or player.throughput_mode))
        if not waiting:
            self.last_heard = now
        stalled = waiting and now - self.last_heard >= NOT_RESPONDING_S
        if stalled != self.stalled:
            self.stalled = stalled
            self._not_responding(stalled)


class GcPolicy:
    """The garbage collector while an app runs: what exists once the app has started (the app,
    Textual, Rich, a trace's events) is frozen out of collections, and the youngest generation is
    collected every YOUNG_GC_OBJECTS new objects instead of 700, since a live run hands the app
    events that are kept for time travel and would survive collections anyway. `restore` undoes
    both (a process that runs apps in turn). Why, measured: benchmarks/README.md (the TUI's CPU).

    Before freezing, the young generations are collected, so their garbage is not frozen; the oldest
    is not walked: a full collection visits every object the process holds (in a process that ran
    an app before, all that its `restore` unfroze), and what garbage the oldest generation holds is
    unfrozen by `restore` and freed by the next full collection (CPython's gc.freeze)."""

    def __init__(self) -> None:
        self._saved: tuple[int, ...] | None = None

    def apply(self) -> None:
        gc.collect(1)
        gc.freeze()
        if self._saved is None:
            self._saved = gc.get_threshold()
            gc.set_threshold(YOUNG_GC_OBJECTS, *self._saved[1:])

    def restore(self) -> None:
        gc.unfreeze()
        if self._saved is not None:
            gc.set_threshold(*self._saved)
            self._saved = None

"""The TUI's playback policy (blockviz/tui/controller.py) without a terminal: fake timers, a fake
clock, a fake bridge, a real Player over a shipped trace."""

from __future__ import annotations

import gc
import math

from blockviz.model.timeline import Timeline
from blockviz.model.player import SPEEDS, Player
from blockviz.model.trace import load_trace
from blockviz.tui.controller import (FRAME_S, MAX_TICK_S, NOT_RESPONDING_S, THROUGHPUT_FPS, YOUNG_GC_OBJECTS, GcPolicy,
                                     PlaybackController)


class FakeTimer:
    def __init__(self, interval: float) -> None:
        self.interval, self.running, self.resets = interval, False, 0

    def pause(self) -> None:
        self.running = False

    def resume(self) -> None:
        self.running = True

    def reset(self) -> None:
        self.resets += 1


class FakeBridge:
    def __init__(self) -> None:
        self.free_run, self.requested, self.acknowledged, self.outstanding = None, 0, 0, 0

    def set_free_run(self, free_run: bool) -> None:
        self.free_run = free_run

    def request_steps(self, count: int = 1) -> None:
        self.requested += count
        self.outstanding += count

    def acknowledge(self, count: int) -> None:
        self.acknowledged += count


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def make(live: bool = False, bridge=None, not_responding=lambda stalled: None):
    timers: list[FakeTimer] = []
    draws: list[bool] = []
    clock = Clock()
    timeline = Timeline.for_trace(load_trace("fork-cow")) if not live else Timeline(4, 24, 8)
    controller = PlaybackController(
        Player(timeline, live=live), bridge,
        set_interval=lambda interval, callback, pause: timers.append(FakeTimer(interval)) or timers[-1],
        draw=draws.append, clock=clock, not_responding=not_responding)
    return controller, timers, draws, clock


def test_playing_runs_the_frame_timer_and_each_tick_advances_by_the_time_passed():
    controller, (frame, slow), draws, clock = make()
    assert frame.interval == FRAME_S and slow.interval == 1 / THROUGHPUT_FPS
    assert not frame.running and not slow.running
    controller.set_playing(True)
    assert frame.running and not slow.running
    speed = controller.player.speed
    clock.now += 0.2
    controller.tick()
    assert controller.player.timeline.position == int(0.2 * speed)
    assert draws == [False]  # playing: the text panels wait for their own rate
    clock.now += 10  # a late frame advances by MAX_TICK_S at most
    before = controller.player.timeline.position
    controller.tick()
    assert controller.player.timeline.position - before <= math.ceil(MAX_TICK_S * speed)
    controller.set_playing(False)
    assert not frame.running


def test_text_panels_redraw_at_their_own_rate_and_always_on_a_full_frame():
    controller, _, _, clock = make()
    assert controller.frame_drawn(full=True)
    assert not controller.frame_drawn(full=False)  # too soon
    clock.now += 1.0
    assert controller.frame_drawn(full=False)


def test_a_live_run_at_max_speed_free_runs_the_engine_on_the_slow_timer():
    bridge = FakeBridge()
    controller, (frame, slow), draws, clock = make(live=True, bridge=bridge)
    controller.player.speed_index = len(SPEEDS) - 1
    controller.set_playing(True)
    assert bridge.free_run is True and slow.running and not frame.running
    controller.set_playing(False)
    assert bridge.free_run is False and not slow.running


def test_a_batch_is_acknowledged_and_drawn_at_once_when_paused():
    bridge = FakeBridge()
    controller, _, draws, clock = make(live=True, bridge=bridge)
    events = load_trace("fork-cow").events[:10]
    controller.on_events(list(events))
    assert bridge.acknowledged == 10 and draws == [True]


def test_stepping_at_the_live_edge_asks_the_engine_for_one_step():
    bridge = FakeBridge()
    controller, _, _, _ = make(live=True, bridge=bridge)
    controller.player.step_engine()  # nothing known yet: the player wants a step
    controller.feed_engine()
    assert bridge.requested == 1
    controller.feed_engine()  # one outstanding: not asked twice
    assert bridge.requested == 1


def test_an_engine_that_sends_nothing_while_playback_waits_is_said_not_responding_until_it_answers():
    bridge = FakeBridge()
    said: list[bool] = []
    controller, _, _, clock = make(live=True, bridge=bridge, not_responding=said.append)
    controller.set_playing(True)  # nothing known yet: a step is asked for
    assert bridge.outstanding == 1
    clock.now += NOT_RESPONDING_S / 2
    controller.tick()
    assert said == []  # not yet
    clock.now += NOT_RESPONDING_S / 2
    controller.tick()
    controller.tick()
    assert said == [True]  # said once
    bridge.outstanding = 0
    controller.on_events(list(load_trace("fork-cow").events[:10]))
    assert said == [True, False]  # it answered
    controller.set_playing(False)
    bridge.outstanding = 1
    clock.now += 10 * NOT_RESPONDING_S
    controller.tick()
    assert said == [True, False]  # paused: nothing is awaited, nothing to say


def test_an_idle_or_dead_engine_stops_playback_at_the_end():
    controller, (frame, _), _, _ = make(live=True, bridge=FakeBridge())
    controller.set_playing(True)
    controller.engine_idle()
    assert controller.player.finished and not controller.player.playing and not frame.running
    controller.set_playing(True)
    controller.engine_died()
    assert not controller.player.playing


def test_the_gc_policy_freezes_and_raises_the_young_threshold_then_restores_both():
    before = gc.get_threshold()
    policy = GcPolicy()
    policy.apply()
    try:
        assert gc.get_threshold()[0] == YOUNG_GC_OBJECTS and gc.get_freeze_count() > 0
    finally:
        policy.restore()
    assert gc.get_threshold() == before and gc.get_freeze_count() == 0

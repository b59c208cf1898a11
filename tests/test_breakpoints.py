"""Breakpoints: playback stops at the next event of a chosen kind, in a replay and live, and goes
back to the previous one (issue 19 item 1; Visualizer.run_until is the notebook's)."""

from __future__ import annotations

import pytest

from blockviz.model.timeline import Timeline
from engine import events as ev
from engine.events import event_classes
from blockviz.model.player import Player
from blockviz.session.spec import EngineSpec
from blockviz.model.trace import load_trace
from blockviz.tui.app import BlockvizApp
from blockviz.session.engine_thread import EngineBridge
from test_tui_app import _until, anyio_backend, screen_text  # noqa: F401  (anyio_backend: the fixture)
from test_tui_fake_engine import FakeEngine


def positions_of(trace, kind: str) -> list[int]:
    """Where a stop at each event of `kind` lands: the end of the engine operation it is in."""
    timeline = Timeline.for_trace(trace)
    return [timeline.operation_end(i + 1) for i, e in enumerate(trace.events) if e.type == kind]


def test_playback_stops_just_after_each_breakpoint_event_and_goes_back_to_the_previous():
    trace = load_trace("swap")
    wanted = positions_of(trace, "swap_out") + positions_of(trace, "swap_in")
    player = Player(Timeline.for_trace(trace))
    player.break_on = event_classes("swap_out,swap_in")
    stops = []
    player.toggle_play()
    player.speed_index = len(__import__("blockviz.model.player").model.player.SPEEDS) - 1  # max: one tick to the end
    while True:
        player.tick(1.0)
        if player.stopped_at is None:
            break
        stops.append(player.timeline.position)
        assert player.at_break and not player.playing and player.timeline.operation_at() is None
        assert isinstance(player.stopped_at, (ev.SwappedOut, ev.SwappedIn))
        player.stopped_at = None
        player.playing = True
    assert stops == sorted(wanted) and len(stops) >= 2
    player.timeline.seek(stops[-1])
    assert player.back_to_break() and player.timeline.position == stops[-2]


def test_unknown_kinds_are_named():
    with pytest.raises(ValueError, match="unknown event kind 'teleport'"):
        event_classes("copy_on_write, teleport")
    assert event_classes(" fork ,copy_on_write") == {ev.Forked, ev.CopyOnWrite}


@pytest.mark.anyio
async def test_in_a_replay_the_key_plays_to_the_breakpoint_and_back():
    trace = load_trace("fork-cow")
    app = BlockvizApp(trace=trace, deterministic=True, play=False, break_on=frozenset({ev.CopyOnWrite}))
    async with app.run_test(size=(100, 30)) as pilot:
        await pilot.press("right_square_bracket")
        await _until(pilot, lambda: app.player.stopped_at is not None)
        assert app.player.timeline.position == positions_of(trace, "copy_on_write")[0]
        await pilot.pause()
        position = app.player.timeline.position
        assert f"breakpoint: event {position} copy_on_write" in " ".join(screen_text(app).split())
        await pilot.press("G", "left_square_bracket")  # from the end, back to the last one
        assert app.player.timeline.position == positions_of(trace, "copy_on_write")[-1]
        assert app.player.timeline.current_event.type == "copy_on_write"


@pytest.mark.anyio
async def test_the_breakpoint_line_names_the_event_the_cursor_is_on():
    """A swap-out is drawn whole: the cursor stops after the frees that follow it, and the status
    line names that event (its number and kind) as well as the swap-out the breakpoint was for."""
    trace = load_trace("swap")
    app = BlockvizApp(trace=trace, deterministic=True, play=False, break_on=frozenset({ev.SwappedOut}))
    swap_out = next(i for i, e in enumerate(trace.events) if isinstance(e, ev.SwappedOut)) + 1
    # the end of the last engine step before the swap-out: `]` plays (at the default pace) from there
    step_end = max(i for i, e in enumerate(trace.events[:swap_out]) if isinstance(e, ev.StepFinished)) + 1
    async with app.run_test(size=(160, 40)) as pilot:
        app.player.timeline.seek(step_end)
        app.render_views()
        await pilot.pause()
        await pilot.press("right_square_bracket")
        await _until(pilot, lambda: app.player.stopped_at is not None, timeout=60)
        await pilot.pause()
        timeline = app.player.timeline
        position = timeline.position
        assert step_end < swap_out
        assert position > swap_out  # the operation runs past the breakpoint's event
        text = " ".join(screen_text(app).split())
        assert f"breakpoint: event {position} {timeline.current_event.type}" in text
        assert f"event {swap_out} swap_out" in text


@pytest.mark.anyio
async def test_live_the_engine_steps_until_the_breakpoint():
    spec = EngineSpec.of(model="fake", prompts=("ROMEO: hi",), n=2, max_tokens=12)
    bridge = EngineBridge(spec, make_engine=lambda: FakeEngine(block_size=4, num_gpu_blocks=24, num_cpu_blocks=8))
    app = BlockvizApp(bridge=bridge, deterministic=True, source_name="fake", play=False,
                      break_on=frozenset({ev.CopyOnWrite}))
    async with app.run_test(size=(100, 30)) as pilot:
        await _until(pilot, lambda: app.player is not None, timeout=30)
        assert len(app.player.timeline) < 5  # nothing stepped yet
        await pilot.press("right_square_bracket")
        await _until(pilot, lambda: app.player.stopped_at is not None, timeout=30)
        assert app.player.timeline.current_event.type == "copy_on_write"
        assert not app.player.playing

"""Operations drawn whole (issue 39 item 1): the model layer knows which events make one engine
operation (blockviz/model/operation.py), and every cursor a user is taken to (cards, breakpoints,
run_until, the slider, moments, exports, playback) lands on an operation boundary, where the drawn
state is one the engine can be in; single-event stepping still shows the inside and says so."""

from __future__ import annotations

import pytest

from blockviz.model.operation import drawn_state_problems
from blockviz.model.reducer import ReducerState
from blockviz.model.timeline import Timeline
from blockviz.model.trace import load_trace, shipped_traces
from engine import events as ev
from story_fixtures import story_trace_path  # noqa: F401 (fixture)
from test_tui_app import _until, anyio_backend, screen_text  # noqa: F401 (anyio_backend: the fixture)


def walk(events, header, timeline: Timeline) -> tuple[int, int]:
    """Fold `events` one at a time; at each boundary of `timeline`'s operations the state has no
    problem. Returns (boundaries, positions inside an operation whose state has one)."""
    state = ReducerState.from_header(header)
    boundaries = inside_wrong = 0
    for index, event in enumerate(events):
        state.apply(event)
        if timeline.operation_at(index + 1) is None:
            boundaries += 1
            assert drawn_state_problems(state) == [], (index + 1, type(event).__name__)
        elif drawn_state_problems(state):
            inside_wrong += 1
    return boundaries, inside_wrong


@pytest.mark.parametrize("name", sorted(shipped_traces()))
def test_at_every_boundary_of_a_shipped_trace_each_block_is_in_one_pool_and_ref_counts_equal_the_tables(name):
    trace = load_trace(name)
    boundaries, inside_wrong = walk(trace.events, trace.header, Timeline.for_trace(trace))
    assert boundaries > len(trace.events) // 2
    if any(isinstance(e, (ev.SwappedOut, ev.BlockFreed)) for e in trace.events):
        assert inside_wrong > 0  # the checker sees the states between an operation's events


def test_a_live_story_read_as_it_arrives_has_the_same_boundaries_and_every_one_is_a_state_the_engine_has(story_trace_path):
    trace = load_trace(story_trace_path)
    whole = Timeline.for_trace(trace)
    walk(trace.events, trace.header, whole)
    live = Timeline.for_header(trace.header)
    for start in range(0, len(trace.events), 37):  # batches cut anywhere, as a live engine's arrive
        live.extend(trace.events[start:start + 37])
        for position in range(start + 1, len(live) + 1):
            op = live.operation_at(position)
            if op is None or op.end is not None:  # what it knows is what the whole trace says
                assert live.operation_end(position) == whole.operation_end(position), position
    live.settle()
    assert all(live.operation_end(p) == whole.operation_end(p) for p in range(len(trace.events) + 1))


def test_the_swap_out_is_drawn_with_its_frees_and_the_eviction_with_the_allocation_it_made_room_for(story_trace_path):
    trace = load_trace(story_trace_path)
    timeline = Timeline.for_trace(trace)
    swap_out = next(i for i, e in enumerate(trace.events) if isinstance(e, ev.SwappedOut))
    op = timeline.operation_at(swap_out + 1)
    assert op.kind == "preemption" and isinstance(trace.events[op.start], ev.Preempted)
    freed = [e for e in trace.events[op.start:op.end] if isinstance(e, ev.BlockFreed)]
    assert len(freed) == len(trace.events[swap_out].mapping)
    swap_in = next(i for i, e in enumerate(trace.events) if isinstance(e, ev.SwappedIn))
    op = timeline.operation_at(swap_in + 1)  # it revives its cached blocks by hash: no eviction in it
    assert op.kind == "swap-in" and trace.events[swap_in].revived
    assert not any(isinstance(e, ev.BlockEvicted) for e in trace.events[op.start:op.end])
    evicted = next(i for i, e in enumerate(trace.events) if isinstance(e, ev.BlockEvicted))
    op = timeline.operation_at(evicted + 1)
    assert op.kind == "eviction" and any(isinstance(e, ev.BlockAllocated) for e in trace.events[op.start:op.end])
    timeline.seek(op.end)  # the evicted blocks are drawn taken, never empty
    taken = {e.block for e in trace.events[op.start:op.end] if isinstance(e, ev.BlockEvicted)}
    assert all(timeline.state.pools["gpu"][b].state == "used" for b in taken)


def test_run_until_moments_the_slider_and_exports_land_where_the_card_is(story_trace_path, tmp_path):
    from blockviz.cli import main
    from blockviz.jupyter import Visualizer
    from blockviz.model.guide import Guide

    trace = load_trace(story_trace_path)
    guide = Guide()
    guide.scan(trace.events)
    guide.settle()
    viz = Visualizer.from_trace(trace)
    for kind, idea in (("fork", "forking"), ("copy_on_write", "copy-on-write"), ("prefix_cache_hit", "prefix-hit"),
                       ("swap_out", "swap-out"), ("block_evicted", "eviction"), ("swap_in", "swap-in")):
        card = next(c for c in guide.cards if idea in c.ideas)
        viz.seek(0)
        event = viz.run_until(kind)
        assert event.type == kind and viz.position == card.position, (kind, viz.position, card.position)
        assert viz.frame()["card"]["title"] == card.title
    inside = next(i for i in range(len(trace.events)) if viz.timeline.operation_at(i) is not None)
    end = viz.timeline.operation_at(inside).end
    assert viz.snapshot(at=inside).position == end
    viz.seek(inside)  # the slider
    assert viz.position == end
    viz.back()  # one event back still shows the inside, and the cursor line says so
    assert viz.position == end - 1 and "inside" in viz.frame()["cursor"]["inside"]
    out = tmp_path / "at.svg"
    assert main(["export", str(story_trace_path), "--at", str(inside), "--out", str(out)]) == 0
    assert f"event {end}/{len(trace.events)}" in out.read_text()
    viz.close()


@pytest.mark.anyio
async def test_a_single_event_step_shows_the_inside_of_an_operation_and_says_so():
    from blockviz.tui.app import BlockvizApp

    trace = load_trace("swap")
    swap_out = next(i for i, e in enumerate(trace.events) if isinstance(e, ev.SwappedOut))
    app = BlockvizApp(trace=trace, deterministic=True, play=False)
    async with app.run_test(size=(200, 60)) as pilot:
        app.player.timeline.seek(swap_out)
        await pilot.press("full_stop")  # the swap-out itself: its frees are still to come
        await pilot.pause()
        assert app.player.inside is not None and app.player.inside.kind == "preemption"
        assert "inside a preemption and its moves" in " ".join(screen_text(app).split())
        await pilot.press("s")  # a step lands past it: nothing inside any more
        await pilot.pause()
        assert app.player.inside is None and "inside a" not in screen_text(app)

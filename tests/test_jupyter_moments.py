"""Moments without a browser: `viz.snapshot()` / `viz.show(at=N)` freeze the picture at a cursor.
The frozen frame and the views drawing it equal the view model of the reducer state at that
cursor, and stay so while the Visualizer steps on, seeks, or a live engine generates."""

from __future__ import annotations

import copy

import pytest

from blockviz.jupyter import Visualizer, snapshot
from blockviz.model.timeline import Timeline, state_equal
from blockviz.model.trace import load_trace
from test_jupyter import check_snapshot


def drawn_frames(moment) -> list[dict]:
    """What each of the moment's views holds (their synced frames)."""
    return [copy.deepcopy(view.frame) for view in moment.views]


def test_a_moment_is_the_picture_at_its_cursor_and_later_steps_leave_it():
    trace = load_trace("fork-cow")
    viz = Visualizer.from_trace(trace)
    viz.run_until("copy_on_write")
    position = viz.position
    moment = viz.snapshot()
    widget = moment.widget  # the views exist and hold the frame
    assert "blockviz-moment" in widget._dom_classes
    frame, drawn = copy.deepcopy(moment.frame), drawn_frames(moment)

    reference = Timeline.for_trace(trace)
    reference.seek(position)
    assert moment.position == position and state_equal(moment.state, reference.state)
    check_snapshot(moment.frame, reference.state)
    picture = snapshot(reference.state, current=reference.current_event)
    for key in ("pools", "tables", "hashes", "touched"):
        assert moment.frame[key] == picture[key]
    assert moment.frame["cursor"]["position"] == position
    pools = next(view for view in moment.views if view._kind == "pool")
    assert pools.frame["pools"] == picture["pools"]

    viz.step()
    viz.step()
    viz.run_to_completion()
    assert viz.position > position and viz.state.num_used("gpu") != moment.state.num_used("gpu")
    assert moment.frame == frame and drawn_frames(moment) == drawn
    check_snapshot(moment.frame, moment.state)
    assert state_equal(moment.state, reference.state)
    assert f"moment at event {position}/{len(viz)}" in repr(moment)
    bundle = moment._repr_mimebundle_()
    assert "application/vnd.jupyter.widget-view+json" in bundle and bundle["text/plain"] == repr(moment)
    viz.close()
    assert moment.frame == frame and drawn_frames(moment) == drawn  # the Visualizer closed, the moment stays
    moment.close()


def test_show_at_a_position_leaves_the_cursor_where_it_is():
    trace = load_trace("swap")
    viz = Visualizer.from_trace(trace)
    viz.seek(len(viz) // 2)
    here = viz.position
    for at in (0, 5, len(viz)):
        moment = viz.show(at=at)
        assert viz.position == here
        reference = Timeline.for_trace(trace)
        reference.seek(at)
        assert moment.position == at and state_equal(moment.state, reference.state)
        check_snapshot(moment.frame, reference.state)
    with pytest.raises(ValueError, match="outside the events known"):
        viz.show(at=len(viz) + 1)
    viz.close()


def test_a_live_moment_stays_while_the_engine_generates(tiny_gpt2_dir):
    from engine.llm import LLM
    from engine.sequence import SamplingParams

    llm = LLM(str(tiny_gpt2_dir), block_size=4, num_gpu_blocks=16, num_cpu_blocks=4)
    viz = Visualizer.live(llm, prompts=["ROMEO: I will", "JULIET: and"], sampling_params=SamplingParams(max_tokens=6))
    viz.step()
    moment = viz.snapshot()
    frame, drawn = copy.deepcopy(moment.frame), drawn_frames(moment)
    used = moment.state.num_used("gpu")
    assert used > 0
    viz.run_to_completion()
    assert viz.state.num_used("gpu") == 0  # every request finished and freed its blocks
    assert moment.frame == frame and drawn_frames(moment) == drawn
    assert moment.state.num_used("gpu") == used
    check_snapshot(moment.frame, moment.state)
    viz.close()


def test_projector_and_size_reach_every_view_and_a_moment():
    from blockviz.jupyter.widgets import PALETTE, PROJECTOR_PALETTE, PROJECTOR_ZOOM
    from blockviz.model.palette import SEQ_COLOURS_BOLD

    viz = Visualizer.from_trace("fork-cow", projector=True)
    assert viz.projector and viz.zoom == PROJECTOR_ZOOM
    assert all(view.zoom == PROJECTOR_ZOOM and view.projector for view in viz.views)
    assert viz.pools.palette["seq"] == list(SEQ_COLOURS_BOLD) == PROJECTOR_PALETTE["seq"]
    moment = viz.snapshot()
    assert all(view.zoom == PROJECTOR_ZOOM and view.projector for view in moment.views)
    viz.set_projector(False)
    viz.set_zoom(1.5)
    assert all(view.zoom == 1.5 and not view.projector for view in viz.views)
    assert viz.pools.palette == PALETTE
    assert moment.views[1].palette["seq"] == list(SEQ_COLOURS_BOLD)  # the moment keeps its look
    with pytest.raises(ValueError, match="outside"):
        viz.set_zoom(40)
    viz._buttons.on_controls({"event": "zoom", "zoom": 3})
    viz._buttons.on_controls({"event": "projector", "on": True})
    viz._buttons.wait(timeout=30)
    assert viz.zoom == 3.0 and viz.projector and viz.controls.zoom == 3.0 and viz.controls.projector
    viz.close()


def test_an_empty_cpu_pool_collapses_to_one_line_until_something_is_swapped():
    from blockviz.model.view import empty_pool_line

    trace = load_trace("swap")
    timeline = Timeline.for_trace(trace)
    n = trace.num_cpu_blocks
    lines = []
    for position in range(len(trace.events) + 1):
        timeline.seek(position)
        frame = snapshot(timeline.state)
        assert frame["pools"]["gpu"]["empty_line"] == ""
        cpu = frame["pools"]["cpu"]
        lines.append(cpu["empty_line"])
        assert bool(cpu["empty_line"]) == (cpu["used"] == 0 and cpu["cached"] == 0)
    assert lines[0] == f"CPU pool: {n} blocks, never used"
    swapped = [line for line in lines if line.startswith(f"CPU pool: {n} blocks, empty (")]
    assert "" in lines and swapped  # swapped out (drawn), then back in (collapsed: it was used)
    assert lines[-1] == swapped[-1] and "all swapped back in" in lines[-1]
    assert empty_pool_line(timeline.state, "gpu", (0, 0, 1)) == ""

"""A long live session keeps a bounded window (issue: hostile input and long sessions, item 1): the
TUI and the live Visualizer cap their timelines (`run --keep-events`, `Visualizer.live(keep_events=)`),
drop the oldest steps with a notice, and travel in time over what they kept."""

from __future__ import annotations

import time

import pytest

from blockviz.model.timeline import state_equal
from blockviz.session.spec import EngineSpec
from blockviz.tui.app import BlockvizApp
from blockviz.session.engine_thread import EngineBridge
from test_tui_app import screen_text
from test_tui_fake_engine import FakeEngine

CAP = 1000


@pytest.fixture
def anyio_backend():
    return "asyncio"


async def _until(pilot, predicate, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError("timed out waiting for the engine")
        await pilot.pause(0.02)


@pytest.mark.anyio
async def test_a_live_tui_past_its_cap_says_what_it_dropped_and_travels_over_what_it_kept():
    prompts = tuple(f"ROMEO {i}: speak, speak again" for i in range(40))  # far more events than the cap
    spec = EngineSpec.of(model="fake", prompts=prompts, max_tokens=40)
    bridge = EngineBridge(spec, make_engine=lambda: FakeEngine(block_size=4, num_gpu_blocks=1024, num_cpu_blocks=16))
    app = BlockvizApp(bridge=bridge, deterministic=True, source_name="fake", play=False, keep_events=CAP)
    async with app.run_test(size=(160, 40)) as pilot:
        await _until(pilot, lambda: app.player is not None, timeout=30)
        app.player.speed_index = len(__import__("blockviz.model.player").model.player.SPEEDS) - 1
        await pilot.press("space")
        await _until(pilot, lambda: app.player.finished and app.player.timeline.at_end, timeout=60)
        timeline = app.player.timeline
        assert timeline.dropped_events > 0 and len(timeline) <= CAP, (len(timeline), timeline.max_events, timeline.state.seqs.keys())
        await pilot.pause()
        assert "dropped" in screen_text(app) and f"steps 1-{timeline.dropped_steps}" in screen_text(app), screen_text(app)[-1500:]
        assert all(seq.status == "finished" for seq in timeline.state.seqs.values())
        await pilot.press("g")  # back to the first kept event
        await _until(pilot, lambda: timeline.position == 0, timeout=5)
        assert state_equal(timeline.state, timeline.base_state())
        await pilot.press("G")
        await _until(pilot, lambda: timeline.at_end, timeout=5)
        assert timeline.state.num_used("gpu") == 0


def test_a_live_visualizer_past_its_cap_says_so_under_its_controls(tiny_gpt2_dir):
    from blockviz.jupyter.visualizer import Visualizer

    viz = Visualizer.live({"model": str(tiny_gpt2_dir), "block_size": 4, "num_gpu_blocks": 64,
                           "num_cpu_blocks": 0}, keep_events=CAP)
    try:
        for round_ in range(40):
            viz.add_request(f"ROMEO {round_}:")
            viz.run_to_completion()
            if viz.timeline.dropped_events:
                break
        cursor = viz.frame()["cursor"]
        assert viz.timeline.dropped_events > 0 and cursor["length"] <= CAP
        assert cursor["dropped"].startswith("steps 1-") and "keeps its last 1,000 events" in cursor["dropped"]
        assert cursor["num_steps"] == viz.timeline.dropped_steps + len(viz.timeline.step_ends)
        viz.seek(0)
        assert state_equal(viz.timeline.state, viz.timeline.base_state())
    finally:
        viz.close()


@pytest.mark.parametrize("value, message", [("5", "at least 1000"), ("lots", "whole number")])
def test_run_keep_events_refuses_a_bad_cap_in_one_line(value, message):
    import subprocess
    import sys

    done = subprocess.run([sys.executable, "-m", "blockviz", "run", "--keep-events", value],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 2 and message in done.stderr and "Traceback" not in done.stderr
    assert len(done.stderr.strip().splitlines()) == 1, done.stderr

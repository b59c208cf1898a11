"""Pilot tests of the TUI: press the keys, then read what the views show.

Traces come from the FakeEngine (the real BlockSpaceManager with a fake model), so these run in
well under a second each and never import torch.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from blockviz.tui.app import BlockvizApp
from blockviz.model.timeline import Timeline
from blockviz.tui.messages import BlockSelected
from blockviz.session.spec import EngineSpec
from blockviz.session.engine_thread import EngineBridge
from blockviz.model.trace import Trace, write_trace
from blockviz.tui.widgets.event_log import EventLog
from blockviz.model.palette import show_token
from blockviz.tui.widgets.pool_grid import PoolGrid
from engine.sequence import SamplingParams
from blockviz.session.engine_session import trace_header
from test_tui_fake_engine import FakeEngine, run_scenario

pytestmark = pytest.mark.anyio


@pytest.fixture
def anyio_backend():
    return "asyncio"


def screen_text(app) -> str:
    """The whole screen as plain text, one line per terminal row."""
    return "\n".join("".join(seg.text for seg in strip) for strip in app.screen._compositor.render_strips())


def fork_trace() -> Trace:
    """One request; after its prefill the user forks seq 0 (vLLM v0 fork), then decoding copies the
    shared last block on write."""
    engine = FakeEngine(block_size=4, num_gpu_blocks=24, num_cpu_blocks=8)
    events: list = []
    engine.events.subscribe(events.append)
    engine.add_request("ROMEO: hi", SamplingParams(max_tokens=4))
    engine.step()
    engine.fork(0)
    while engine.has_unfinished_requests():
        engine.step()
    return Trace(trace_header(engine), events)


def n2_trace() -> Trace:
    engine = FakeEngine(block_size=4, num_gpu_blocks=24, num_cpu_blocks=8)
    events = run_scenario(engine, ["ROMEO: hi", "JULIET:"], n=2, max_tokens=5)
    return Trace(trace_header(engine), events)


def run_pool_trace() -> Trace:
    """`blockviz run`'s pool (64 GPU / 32 CPU blocks of 16 tokens): two requests, n=2."""
    engine = FakeEngine(block_size=16, num_gpu_blocks=64, num_cpu_blocks=32)
    events = run_scenario(engine, ["ROMEO: hi there, how are you this fine day", "JULIET:"], n=2, max_tokens=20)
    return Trace(trace_header(engine), events)


def replay_app(trace: Trace | None = None, **kwargs) -> BlockvizApp:
    return BlockvizApp(trace=trace or n2_trace(), deterministic=True, source_name="test", **kwargs)


def grid(app, device: str = "gpu") -> PoolGrid:
    return app.query_one(f"#{device}", PoolGrid)


def first_index(trace: Trace, kind: str) -> int:
    return next(i for i, e in enumerate(trace.events) if e.type == kind)


async def test_a_prefill_step_fills_the_pool_with_shared_prompt_blocks():
    app = replay_app()
    async with app.run_test(size=(80, 24)) as pilot:
        assert grid(app).cell_text(0).strip() == "0"  # free before anything ran
        await pilot.press("s")
        state = app.player.timeline.state
        assert state.step == 1 and state.step_kind == "prefill"
        assert grid(app).cell_text(0) == " 0²█"  # n=2: both sequences share the prompt's blocks
        assert "GPU pool · 5/24 used" in screen_text(app)  # 3 blocks for "ROMEO: hi", 2 for "JULIET:"
        await pilot.press("right")  # the GPU pool has focus: select block 0
        text = screen_text(app)
        assert "Block inspector · gpu 0" in text
        assert "ref count  2" in text and "seq 0" in text and "seq 1" in text


async def test_fork_then_copy_on_write_shows_ref_counts_and_the_copied_kv_digest():
    trace = fork_trace()
    app = replay_app(trace)
    async with app.run_test(size=(80, 24)) as pilot:
        fork_at = first_index(trace, "fork")
        app.player.timeline.seek(fork_at + 1)
        app.render_views()
        await pilot.pause()
        forked = trace.events[fork_at]
        for block in forked.blocks:
            assert grid(app).cell_text(block)[2] == "²", block  # used, ref 2 after the fork
        cow_at = first_index(trace, "copy_on_write")
        while app.player.timeline.position <= cow_at:
            await pilot.press("full_stop")
        cow = trace.events[cow_at]
        assert grid(app).cell_text(cow.src_block)[2] == " "  # back to one owner
        assert grid(app).cell_text(cow.dst_block)[1].strip() == str(cow.dst_block)[-1]
        await pilot.press("right")
        for _ in range(cow.dst_block):
            await pilot.press("right")
        text = screen_text(app)
        assert f"Block inspector · gpu {cow.dst_block}" in text
        assert f"same K/V in gpu {cow.src_block}" in text.replace("\n", " ").replace("│", "").replace("  ", " ")


async def test_the_inspector_says_when_a_blocks_kv_digest_predates_its_newest_slots():
    trace = fork_trace()
    cow_at = first_index(trace, "copy_on_write")
    dst = trace.events[cow_at].dst_block
    # as a free run at full speed sends it: the digest taken right after the copy, none after
    first_after = next(i for i, e in enumerate(trace.events) if i > cow_at and e.type == "kv_digest" and e.block == dst)
    thinned = Trace(trace.header, [e for i, e in enumerate(trace.events) if e.type != "kv_digest" or i <= first_after])
    timeline = Timeline.for_trace(thinned)
    position = None
    for position in range(first_after + 1, len(thinned.events) + 1):
        timeline.seek(position)
        block = timeline.state.pools["gpu"][dst]
        if block.state == "used" and len(block.token_ids) > block.digest_slots:
            break
    else:
        pytest.fail("the copied block never grew after its digest")
    taken, filled = block.digest_slots, len(block.token_ids)

    async def inspector_text(trace_shown: Trace) -> str:
        app = replay_app(trace_shown)
        async with app.run_test(size=(100, 30)) as pilot:
            app.player.timeline.seek(position)
            app.on_block_selected(BlockSelected("gpu", dst))
            await pilot.pause()
            return screen_text(app).replace("│", "")

    text = await inspector_text(thinned)
    assert f"Block inspector · gpu {dst}" in text and re.search(rf"fill\s+{filled}/4 slots", text)
    assert f"(at {taken}/4 slots)" in " ".join(text.split())
    assert "same digest gpu" in " ".join(text.split())  # not "same K/V": both blocks grew since
    hashed_every_step = " ".join((await inspector_text(trace)).split())
    assert "slots)" not in hashed_every_step and "same digest" not in hashed_every_step


async def test_the_app_collects_young_garbage_less_often_while_it_runs_and_restores_the_threshold():
    import gc

    from blockviz.tui.controller import YOUNG_GC_OBJECTS

    before = gc.get_threshold()
    assert before[0] != YOUNG_GC_OBJECTS
    app = replay_app()
    async with app.run_test(size=(80, 24)) as pilot:
        await pilot.press("s")
        assert gc.get_threshold() == (YOUNG_GC_OBJECTS, *before[1:])
    assert gc.get_threshold() == before


def test_the_app_frees_young_garbage_before_freezing_and_never_walks_the_oldest_generation():
    """GcPolicy.apply collects generations 0 and 1 only (an app started in a process that ran
    apps before does not walk every object the process holds) and frees a young cycle before the
    freeze would keep it."""
    import gc
    import weakref

    from blockviz.tui.controller import GcPolicy

    class Node:
        pass

    generations: list[int] = []

    def seen(phase: str, info: dict) -> None:
        if phase == "start":
            generations.append(info["generation"])

    node = Node()
    node.self = node  # a cycle: only a collection frees it
    gone = weakref.ref(node)
    del node
    policy = GcPolicy()
    gc.disable()  # no automatic collection between: only the policy's
    gc.callbacks.append(seen)
    try:
        policy.apply()
        assert gone() is None and generations and max(generations) < 2, generations
    finally:
        gc.callbacks.remove(seen)
        policy.restore()
        gc.enable()
    assert gc.get_freeze_count() == 0


async def test_time_travel_back_restores_the_earlier_screen():
    app = replay_app()
    async with app.run_test(size=(100, 30)) as pilot:
        await pilot.press("s")
        before = screen_text(app)
        position = app.player.timeline.position
        await pilot.press("s", "s", "full_stop", "full_stop")
        assert screen_text(app) != before
        await pilot.press("comma", "comma", "b", "b")
        assert app.player.timeline.position == position
        assert screen_text(app) == before


async def test_play_pause_and_speed():
    app = replay_app()
    async with app.run_test(size=(80, 24)) as pilot:
        await pilot.press("plus", "plus", "plus", "plus", "plus")
        assert app.player.speed_label == "max"
        await pilot.press("space")
        for _ in range(50):
            if not app.player.playing:
                break
            await pilot.pause(0.02)
        assert app.player.timeline.at_end and not app.player.playing
        assert "end of trace" in screen_text(app)
        await pilot.press("minus")
        assert app.player.speed_label == "1000 ev/s"


async def test_projector_mode_has_big_cells_and_fewer_panels():
    app = replay_app()
    async with app.run_test(size=(100, 30)) as pilot:
        await pilot.press("s", "P")
        assert app.screen.has_class("-projector")
        assert grid(app).cell_height == 2 and "×2" in grid(app).cell_text(0)
        assert not app.query_one("#inspector").display and not app.query_one("#log").display
        assert app.query_one("#text").display
        await pilot.press("P")
        assert grid(app).cell_height == 1 and app.query_one("#inspector").display


async def test_a_small_terminal_shows_a_message_and_resizing_reflows():
    app = replay_app()
    async with app.run_test(size=(60, 20)) as pilot:
        await pilot.pause()
        assert "Enlarge the terminal to at least 80x24" in screen_text(app)
        assert not app.query_one("#main").display
        await pilot.resize_terminal(80, 24)
        await pilot.pause()
        assert "Enlarge" not in screen_text(app) and "GPU pool" in screen_text(app)
        narrow = grid(app).columns
        await pilot.resize_terminal(200, 60)
        await pilot.pause()
        assert grid(app).columns > narrow
        assert all(app.query_one(f"#{name}").display for name in ("tables", "text", "hashes", "log"))


async def test_a_replay_offers_no_engine_keys():
    """A replay has no engine to fork, swap out or add to: its footer offers only keys that work,
    and a, f, p do nothing there (issue 28's traps)."""
    app = replay_app()
    async with app.run_test(size=(80, 24)) as pilot:
        notes: list[str] = []
        app.notify = lambda message, **kwargs: notes.append(message)
        await pilot.press("s", "f", "p", "a")
        await pilot.pause()
        assert notes == [] and len(app.screen_stack) == 1  # no toast, no prompt dialog
        footer = screen_text(app).splitlines()[-1]
        assert "Step" in footer and not {"Add", "Fork", "Swap"} & set(footer.split())


async def test_event_log_filters_by_kind():
    app = replay_app()
    async with app.run_test(size=(120, 40)) as pilot:
        await pilot.press("v", "v", "v")  # tables -> text -> hashes -> log
        assert app.right_view == "log"
        await pilot.press("s", "s", "s")
        log = app.query_one(EventLog)
        assert len(log.lines()) == app.player.timeline.position
        app.query_one("#log-filter").value = "copy_on_write"
        await pilot.pause()
        lines = log.lines()
        assert lines and all("copy-on-write" in line for line in lines)
        assert "copy-on-write" in screen_text(app)


async def test_clicking_a_cell_selects_that_block():
    app = replay_app()
    async with app.run_test(size=(80, 24)) as pilot:
        await pilot.press("s")
        cell = grid(app).cell_width + 1
        await pilot.click("#gpu", offset=(1 + 2 * cell, 1))  # border, then the third cell
        assert app.selection == ("gpu", 2)
        assert "Block inspector · gpu 2" in screen_text(app)
        assert app.selected_seq == 0  # the block's first owner
        y, line = next((y, line) for y, line in enumerate(screen_text(app).splitlines()) if "(seq 1) " in line)
        await pilot.click(offset=(line.index("(seq 1) ") + 2, y))  # a sequence label is a link
        assert app.selected_seq == 1


async def test_the_status_bar_says_what_just_happened_on_its_third_line():
    """Stepped event by event to the fork of the shipped fork-cow trace, the status area's third
    line is blockviz.model.narration's sentence for it: whole at 200 columns, wrapped at 80."""
    from blockviz.model.narration import narrate
    from blockviz.model.trace import load_trace, resolve_trace_path
    from blockviz.tui.widgets.panels import StatusBar

    trace = load_trace(resolve_trace_path("fork-cow"))
    fork = first_index(trace, "fork")
    app = replay_app(trace)
    async with app.run_test(size=(200, 60)) as pilot:
        await pilot.press(*["full_stop"] * (fork + 1))  # "." passes one event
        timeline = app.player.timeline
        assert timeline.current_event.type == "fork"
        sentence = narrate(timeline.current_event, timeline.state)
        event = timeline.current_event
        request = timeline.state.seqs[event.parent_seq_id].request_id  # named as the tables name it (n is 2)
        assert sentence.startswith(f"fork request {request} (seq {event.parent_seq_id}) → request {request} "
                                   f"(seq {event.child_seq_id}) shares ")
        status = app.query_one(StatusBar)
        assert status.size.height == 3
        assert f"▸ {sentence}" in screen_text(app).splitlines()[status.region.y + 2]
        await pilot.resize_terminal(80, 24)
        await pilot.pause()
        lines = screen_text(app).splitlines()[status.region.y + 2:status.region.y + status.size.height]
        assert status.size.height == 2 + len(lines) and len(lines) >= 1  # wrapped, never cut
        assert " ".join(line.strip() for line in lines) == f"▸ {sentence}"
        cow = first_index(trace, "copy_on_write")
        await pilot.press(*["full_stop"] * (cow - fork))
        assert timeline.current_event.type == "copy_on_write"
        await pilot.pause()
        sentence = narrate(timeline.current_event, timeline.state)
        lines = screen_text(app).splitlines()[status.region.y + 2:status.region.y + status.size.height]
        assert len(sentence) > 78 and len(lines) >= 2  # too long for one line: wrapped to the next
        assert " ".join(line.strip() for line in lines) == f"▸ {sentence}"


async def test_at_80x24_the_default_pool_fits_and_the_inspector_shows_the_selected_block():
    app = replay_app(run_pool_trace())
    async with app.run_test(size=(80, 24)) as pilot:
        await pilot.press("s", "s", "s", "right")
        gpu, cpu = grid(app, "gpu"), grid(app, "cpu")
        for pool in (gpu, cpu):  # every block in view, no scrolling
            assert pool.virtual_size.height <= pool.scrollable_content_region.height
        assert gpu.columns == cpu.columns == 8
        inspector = app.query_one("#inspector")
        assert inspector.region.height >= 8 and inspector.region.bottom <= app.query_one("#main").region.bottom
        assert "Block inspector · gpu 0" in screen_text(app) and "ref count" in screen_text(app)
        footer = screen_text(app).splitlines()[-1]
        assert footer.rstrip().endswith("^p palette") and "q Quit" in footer


async def test_a_pool_that_does_not_fit_says_which_blocks_are_in_view():
    engine = FakeEngine(block_size=4, num_gpu_blocks=200, num_cpu_blocks=8)
    app = replay_app(Trace(trace_header(engine), run_scenario(engine, ["ROMEO: hi"], max_tokens=2)))
    async with app.run_test(size=(80, 24)) as pilot:
        await pilot.pause()
        assert grid(app).border_subtitle.startswith("blocks 0-") and "of 200" in grid(app).border_subtitle
        await pilot.press("end")  # the last block: the grid scrolls to it
        await pilot.pause()
        assert grid(app).border_subtitle.endswith("-199 of 200 · ↑↓ scrolls")


@pytest.mark.parametrize("projector", [False, True], ids=["narrow", "wide"])
async def test_the_help_legend_is_in_the_marks_the_pool_draws(projector):
    """The help's pool-grid legend and the pool's subtitle show a shared block's ref count and the
    fill as the pool's own cells at that width draw them ("²" and "▁…█" narrow, "×2" and a bar wide)."""
    import io

    from rich.console import Console
    from textual.widgets import Static

    from blockviz.model.palette import FILL_GLYPHS, ref_mark
    from blockviz.model.trace import load_trace
    from blockviz.tui.widgets.screens import HelpScreen

    trace = load_trace("fork-cow")
    app = replay_app(trace, play=False, projector=projector)
    async with app.run_test(size=(120, 40)) as pilot:
        app.player.timeline.seek(first_index(trace, "fork") + 1)
        app.render_views()
        await pilot.pause()
        pool = grid(app)
        shared = next(b.number for b in app.player.timeline.state.pools["gpu"] if b.ref_count == 2)
        cell = pool.cell_text(shared)
        assert pool.big_cells == projector
        drawn = "×2" if projector else "²"
        other = "²" if projector else "×2"
        assert drawn in cell and ref_mark(2, projector) == drawn
        if projector:
            assert "█" in cell or "░" in cell  # the wide cell's fill bar
        else:
            assert any(glyph in cell for glyph in FILL_GLYPHS[1:])
        await pilot.press("question_mark")
        await pilot.pause()
        assert isinstance(app.screen, HelpScreen)
        console = Console(width=200, record=True, file=io.StringIO())
        console.print(app.screen.query_one("#legend", Static).content)
        legend = console.export_text()
        assert drawn in legend and other not in legend
        assert ("██░░" if projector else "▁…█") in legend
        assert drawn in pool.border_subtitle and other not in pool.border_subtitle


async def test_help_screen_lists_the_keys():
    app = replay_app()
    async with app.run_test(size=(100, 40)) as pilot:
        await pilot.press("question_mark")
        text = screen_text(app)
        assert "The words, first" in text and "block table" in text  # the words come first (issue 39 item 5)
        for _ in range(6):  # the rest below them, a page at a time
            await pilot.press("pagedown")
            await pilot.pause()
            text += screen_text(app)
        for words in ("Play/Pause", "Step back", "Fork", "Swap out", "Projector", "Pool grid legend"):
            assert words in text
        await pilot.press("escape")
        assert len(app.screen_stack) == 1
        commands = {command.title for command in app.get_system_commands(app.screen)}
        assert {"Play/Pause", "Step back (to the previous engine step)", "Fork the selected sequence (live)",
                "Projector mode", "Help (keys, legend, glossary)"} <= commands


def test_tokens_show_visible_whitespace_and_no_bpe_markers():
    assert show_token(" the") == "·the"
    assert show_token("\n") == "⏎"
    assert show_token("Ġking") == "·king" and show_token("Ċ") == "⏎"
    assert show_token("\x00") == "\\x00"


# ---------------------------------------------------------------------------- live (FakeEngine)


async def _until(pilot, predicate, timeout: float = 5.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError("timed out waiting for the engine")
        await pilot.pause(0.01)


def live_app(play: bool = False, **engine_kwargs) -> BlockvizApp:
    """A live app on a FakeEngine; paused once ready unless `play` (as `blockviz run` plays)."""
    spec = EngineSpec.of(model="fake", prompts=("ROMEO: hi", "JULIET:"), max_tokens=12)
    bridge = EngineBridge(spec, make_engine=lambda: FakeEngine(block_size=4, num_gpu_blocks=24,
                                                                num_cpu_blocks=16, **engine_kwargs))
    return BlockvizApp(bridge=bridge, deterministic=True, source_name="fake", play=play)


async def test_a_live_app_plays_once_the_engine_is_ready_without_a_key_press():
    app = BlockvizApp(bridge=live_app().bridge, deterministic=True, source_name="fake")  # play by default
    async with app.run_test(size=(80, 24)) as pilot:
        await _until(pilot, lambda: app.player is not None, timeout=30)
        assert app.player.playing
        await pilot.pause()
        assert "▶ playing" in screen_text(app)
        await _until(pilot, lambda: app.player.timeline.num_steps_done() >= 2, timeout=10)  # no key pressed
    assert not replay_app().autoplay  # a replay opens paused


async def test_live_step_fork_swap_out_and_add_a_request():
    app = live_app()
    async with app.run_test(size=(120, 40)) as pilot:
        # the engine's start imports torch and transformers first (seconds on a cold machine)
        await _until(pilot, lambda: app.player is not None and len(app.player.timeline) >= 2, timeout=30)
        await pilot.press("s")
        await _until(pilot, lambda: app.player.timeline.num_steps_done() == 1)
        assert app.player.timeline.state.step_kind == "prefill"
        assert "GPU pool · 5/24 used" in screen_text(app)
        await pilot.press("n")  # select seq 0
        assert app.selected_seq == 0
        await pilot.press("f")
        await _until(pilot, lambda: 2 in app.player.timeline.state.seqs)
        assert app.player.timeline.current_event.type == "fork"
        assert grid(app).cell_text(0)[2] == "²"
        assert "seq 2" in screen_text(app)
        await pilot.press("p")  # swap out request 0 (seqs 0 and 2)
        await _until(pilot, lambda: app.player.timeline.state.num_used("cpu") > 0)
        assert "CPU pool · 3/16 used" in screen_text(app)  # seq 0 and its fork share 3 blocks
        await pilot.press("a")
        await pilot.press(*"more")
        await pilot.press("enter")
        await _until(pilot, lambda: app.player.timeline.current_event.type == "request_added")
        assert app.player.timeline.current_event.prompt == "more"


async def test_live_play_at_max_speed_runs_to_completion():
    app = live_app()
    async with app.run_test(size=(80, 24)) as pilot:
        await _until(pilot, lambda: app.player is not None, timeout=30)
        app.player.speed_index = len(__import__("blockviz.model.player").model.player.SPEEDS) - 1
        await pilot.press("space")
        await _until(pilot, lambda: app.player.finished and app.player.timeline.at_end, timeout=10)
        state = app.player.timeline.state
        assert all(seq.status == "finished" for seq in state.seqs.values())
        assert state.num_used("gpu") == 0
        await _until(pilot, lambda: "all requests finished" in " ".join(screen_text(app).split()))


class QuietBridge:
    """A live engine that is ready and sends only what the test hands the app itself."""

    header = {"format_version": 1, "model": "fake", "block_size": 4, "num_gpu_blocks": 24,
              "num_cpu_blocks": 8}
    outstanding = in_flight = 0

    def run(self, listener) -> None:
        listener.ready(self.header)

    def stop(self) -> None: ...
    def acknowledge(self, count: int) -> None: ...
    def set_free_run(self, free_run: bool) -> None: ...
    def request_steps(self, count: int = 1) -> None: ...


async def test_at_max_speed_a_batch_arriving_when_a_frame_is_due_is_drawn_at_once(monkeypatch):
    import blockviz.tui.controller as controller_module
    from blockviz.model.player import SPEEDS
    from blockviz.tui.messages import EngineEvents

    monkeypatch.setattr(controller_module, "THROUGHPUT_FPS", 0.01)  # the slow timer never fires in this test
    events = n2_trace().events
    first_step = next(i for i, e in enumerate(events) if e.type == "step_finished") + 1
    app = BlockvizApp(bridge=QuietBridge(), deterministic=True, play=False)
    async with app.run_test(size=(80, 24)) as pilot:
        while app.player is None:
            await pilot.pause(0.01)
        app.player.speed_index = len(SPEEDS) - 1
        app.action_toggle_play()
        assert app.player.throughput_mode
        app.controller.last_tick = time.monotonic()  # a frame was just drawn: the next is not due
        app.post_message(EngineEvents(list(events[:first_step])))
        await pilot.pause()
        timeline = app.player.timeline
        assert len(timeline) == first_step and timeline.position == 0
        assert "GPU pool · 0/24 used" in screen_text(app)
        app.controller.last_tick -= 1 / controller_module.THROUGHPUT_FPS  # now it is
        app.post_message(EngineEvents(list(events[first_step:first_step + 1])))
        await pilot.pause()
        assert timeline.position == len(timeline) == first_step + 1
        used = timeline.state.num_used("gpu")
        assert used > 0 and f"GPU pool · {used}/24 used" in screen_text(app)


async def test_a_failed_model_load_ends_the_app_with_the_error():
    def broken():
        raise ValueError("model 'nope' could not be loaded")

    app = BlockvizApp(bridge=EngineBridge(EngineSpec(), make_engine=broken), deterministic=True)
    async with app.run_test(size=(80, 24)) as pilot:
        await _until(pilot, lambda: app.error is not None)
    assert app.error == "model 'nope' could not be loaded" and app.return_code == 2


def test_run_fails_before_opening_the_app_when_the_model_is_missing(tmp_path, capsys, monkeypatch):
    from blockviz.cli import main

    monkeypatch.setattr(BlockvizApp, "run", lambda self, **kw: pytest.fail("the app opened"))
    assert main(["run", "--model", str(tmp_path / "no-such-model")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "no-such-model" in err and "Traceback" not in err


# ---------------------------------------------------------------------------- replay without torch


def test_replay_reaches_its_first_frame_without_importing_torch(tmp_path):
    trace = n2_trace()
    path = tmp_path / "t.jsonl"
    write_trace(path, {"format": "blockviz-trace", "version": 1, **trace.header}, trace.events)
    script = textwrap.dedent(f"""
        import asyncio, json, sys
        from blockviz.tui.app import BlockvizApp
        from blockviz.cli import main
        seen = {{}}
        def headless_run(self, **kwargs):
            async def go():
                async with self.run_test(size=(80, 24)) as pilot:
                    await pilot.press("s")
                    text = "\\n".join("".join(s.text for s in strip)
                                     for strip in self.screen._compositor.render_strips())
                    seen["frame"] = "GPU pool" in text and "used" in text
                    seen["torch"] = "torch" in sys.modules
            asyncio.run(go())
        BlockvizApp.run = headless_run
        seen["rc"] = main(["replay", {str(path)!r}])
        print(json.dumps(seen))
    """)
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parent.parent)}
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60, env=env)
    assert result.returncode == 0, result.stderr
    seen = json.loads(result.stdout.strip().splitlines()[-1])
    assert seen == {"frame": True, "torch": False, "rc": 0}


def test_blockviz_run_opens_its_app_without_importing_torch(tiny_gpt2_dir):
    """The UI process of `blockviz run` never imports torch (the engine process does): not to
    check the model (engine.model_source), nor on the way to its first frame."""
    script = textwrap.dedent(f"""
        import json, sys
        from blockviz.session.spec import check_model
        check_model({str(tiny_gpt2_dir)!r})
        check_model("tiny-shakespeare")
        seen = {{"checked": "torch" in sys.modules}}
        from blockviz.tui.app import BlockvizApp
        from blockviz.cli import main
        from blockviz.session.engine_process import ProcessBridge
        ProcessBridge.start = lambda self: None  # no engine process: this one is under test
        def opened(self, **kwargs):
            seen["app"] = "torch" in sys.modules or "transformers" in sys.modules
        BlockvizApp.run = opened
        seen["rc"] = main(["run", "--model", {str(tiny_gpt2_dir)!r}])
        print(json.dumps(seen))
    """)
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parent.parent)}
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60, env=env)
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout.strip().splitlines()[-1]) == {"checked": False, "app": False, "rc": 0}


async def test_an_engine_that_dies_mid_run_leaves_an_error_panel_and_exits_1():
    class DyingEngine(FakeEngine):
        def step(self) -> None:
            if self._step >= 2:
                raise RuntimeError("CUDA error: an illegal memory access")
            super().step()

    spec = EngineSpec.of(model="fake", prompts=("ROMEO: hi",), max_tokens=12)
    bridge = EngineBridge(spec, make_engine=lambda: DyingEngine(block_size=4, num_gpu_blocks=24, num_cpu_blocks=8))
    app = BlockvizApp(bridge=bridge, deterministic=True, source_name="fake", play=True)
    async with app.run_test(size=(80, 24)) as pilot:
        await _until(pilot, lambda: app.engine_died, timeout=30)
        await pilot.pause()
        text = " ".join(screen_text(app).split())
        assert "engine stopped: CUDA error: an illegal memory access" in text
        assert not app.player.playing
        assert len(app.player.timeline.step_ends) == 2  # what the engine sent before it died
        await pilot.press("G")
        await pilot.press("b")  # time travel still works on it
        await pilot.pause()
        assert app.player.timeline.num_steps_done() == 1
        assert "engine stopped" in " ".join(screen_text(app).split())  # still said
        await pilot.press("q")
    assert app.return_code == 1 and app.error.startswith("engine stopped: CUDA error")


async def test_a_frame_timer_firing_while_the_app_shuts_down_draws_nothing():
    """Textual removes the widgets on shutdown while a frame timer may still fire: the frame it asks
    for draws nothing instead of failing to find its panels."""
    app = replay_app()
    async with app.run_test(size=(80, 24)) as pilot:
        await pilot.press("space")  # playing: the frame timer runs
    assert not app.is_running
    app.render_views()  # what a late tick calls
    app.render_views(full=False)

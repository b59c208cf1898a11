"""The Jupyter side without a browser: the snapshot function against the reducer, the Visualizer's
cursor against the TUI's Timeline, a live Visualizer on a tiny GPT-2 against an in-process run,
the buttons' messages, frame coalescing, and the text repr."""

from __future__ import annotations

import subprocess
import sys
import threading

import pytest

from blockviz.model.timeline import Timeline, state_equal
from blockviz.jupyter import Visualizer, snapshot
from blockviz.model.view import STATE_CODES, block_state, event_log
from blockviz.jupyter.visualizer import FrameThrottle
from blockviz.model.trace import load_trace, shipped_traces
from blockviz.model.reducer import USED, ReducerState
from story_fixtures import story_trace_path  # noqa: F401 (fixture)

TRACES = shipped_traces()
CODE_NAMES = {code: name for name, code in STATE_CODES.items()}


def check_snapshot(snap: dict, state: ReducerState) -> None:
    """Every number the widgets draw equals the reducer's."""
    for device, pool in state.pools.items():
        part = snap["pools"][device]
        used = sum(1 for b in pool if b.state == USED)
        cached = sum(1 for b in pool if b.state != USED and b.block_hash is not None)
        assert (part["used"], part["cached"], part["free"]) == (used, cached, len(pool) - used - cached)
        assert part["n"] == len(pool) == len(part["state"]) == len(part["ref"])
        for block in pool:
            i = block.number
            assert CODE_NAMES[part["state"][i]] == block_state(block)
            assert part["ref"][i] == block.ref_count
            owners = sorted(block.owners)
            assert part["owner"][i] == (owners[0] if owners else -1)
            assert part["owner2"][i] == (owners[1] if len(owners) > 1 else -1)
            if block_state(block) != "free":
                assert part["fill"][i] == len(block.token_ids)
    shown = {row["seq"]: [(d, n) for d, n, _, _ in row["blocks"]] for row in snap["tables"]}
    for seq_id, table in state.tables.items():
        assert shown[seq_id] == list(table)
    for row in snap["tables"]:
        for (device, number, ref, texts) in row["blocks"]:
            assert ref == state.pools[device][number].ref_count
            assert len(texts) == len(state.pools[device][number].token_ids)
    hashed = {b.number for b in state.pools["gpu"] if b.block_hash is not None}
    assert {row["block"] for row in snap["hashes"]} == hashed
    assert snap["step"] == state.step


@pytest.mark.parametrize("name", TRACES)
def test_snapshot_equals_reducer_after_every_event(name):
    trace = load_trace(name)
    state = ReducerState(trace.block_size, trace.num_gpu_blocks, trace.num_cpu_blocks)
    for event in trace.events:
        state.apply(event)
        snap = snapshot(state, current=event, selected=("gpu", 0))
        check_snapshot(snap, state)
        assert snap["inspector"]["ref"] == state.pools["gpu"][0].ref_count


def test_snapshot_is_json_and_pure():
    import json

    trace = load_trace("fork-cow")
    state = Timeline.for_trace(trace).state
    before = state.freeze()
    snap = snapshot(state, selected=("cpu", 1))
    assert json.loads(json.dumps(snap)) == snap
    assert state.freeze() == before
    assert snapshot(state, selected=("cpu", 1)) == snap
    assert snapshot(state, selected=("gpu", 10_000))["selected"] is None


@pytest.mark.parametrize("name", TRACES)
def test_visualizer_cursor_matches_timeline(name):
    trace = load_trace(name)
    viz = Visualizer.from_trace(name)
    reference = Timeline.for_trace(trace)

    def same() -> None:
        reference.seek(viz.position)
        assert state_equal(viz.state, reference.state)

    assert len(viz) == len(trace.events) and viz.position == 0
    for _ in range(5):
        event = viz.step_event()
        assert event is viz.events[viz.position - 1]
        same()
    event = viz.step()
    assert event.type == "step_finished" and viz.position in reference.step_ends
    same()
    viz.back(3)
    same()
    viz.seek(len(viz) // 2)
    same()
    viz.seek(len(viz) + 100)
    assert viz.position == len(viz)
    same()
    viz.back(len(viz))
    assert viz.position == 0
    for kind in ("copy_on_write", "prefix_cache_hit", "swap_out", "block_evicted", "preempted"):
        viz.seek(0)
        event = viz.run_until(kind)
        expected = next((i for i, e in enumerate(trace.events) if e.type == kind), None)
        if expected is None:
            assert event is None and viz.position == len(viz)
        else:
            assert event.type == kind and viz.position == reference.operation_end(expected + 1) >= expected + 1
            assert event == trace.events[expected] and viz.timeline.operation_at() is None  # the operation drawn whole
        same()
    assert viz.step_event() is None or viz.position <= len(viz)
    viz.run_to_completion()
    assert viz.position == len(viz) and viz.finished
    assert viz.step_event() is None and viz.step() is None
    viz.close()


def test_run_until_rejects_unknown_kind_and_trace_commands():
    viz = Visualizer.from_trace("fork-cow")
    with pytest.raises(ValueError, match="unknown event kind"):
        viz.run_until("copy-on-write")
    with pytest.raises(RuntimeError, match="Visualizer.live"):
        viz.add_request("hello")
    assert viz.llm is None and viz.outputs == []
    viz.close()


def test_text_repr_without_frontend():
    viz = Visualizer.from_trace("fork-cow")
    viz.run_until("copy_on_write")
    text = repr(viz)
    assert "VBox" not in text
    assert "GPU pool: 32 blocks" in text and "CPU pool: 16 blocks" in text
    assert f"event {viz.position}/{len(viz)}" in text
    assert "seq 0" in text and "copy-on-write" in text
    bundle = viz._repr_mimebundle_()
    assert bundle["text/plain"] == text
    assert "application/vnd.jupyter.widget-view+json" in bundle
    from IPython.lib.pretty import pretty

    assert pretty(viz) == text
    viz.close()


def test_select_and_inspector():
    viz = Visualizer.from_trace("fork-cow")
    cow = viz.run_until("copy_on_write")
    viz.select("gpu", cow.src_block)
    frame = viz.frame()
    assert frame["selected"] == ["gpu", cow.src_block]
    inspector = frame["inspector"]
    block = viz.state.pools["gpu"][cow.src_block]
    assert (inspector["number"], inspector["ref"], inspector["owners"]) == (cow.src_block, block.ref_count,
                                                                             sorted(block.owners))
    assert set(frame["touched"]["gpu"]) == {cow.src_block, cow.dst_block}
    with pytest.raises(ValueError):
        viz.select("gpu", 999)
    viz.close()


def test_event_log_filters():
    trace = load_trace("swap")
    rows = event_log(trace.events, len(trace.events), "swap & preemption")
    assert rows and {kind for _, kind, _ in rows} <= {"swap_out", "swap_in", "preempted", "kv_digest"}
    rows = event_log(trace.events, 10, "all events")
    assert [number for number, _, _ in rows] == list(range(1, 11))


def wait_for_worker(viz: Visualizer) -> None:
    viz._buttons.wait(timeout=60)


def test_buttons_step_back_seek_select_in_background():
    viz = Visualizer.from_trace("fork-cow")
    controls = viz.controls
    controls._on_frontend_msg(controls, {"event": "action", "action": "step"}, [])
    wait_for_worker(viz)
    first_step = viz.position
    assert viz.events[first_step - 1].type == "step_finished"
    controls._on_frontend_msg(controls, {"event": "action", "action": "step_event"}, [])
    wait_for_worker(viz)
    assert viz.position == first_step + 1
    controls._on_frontend_msg(controls, {"event": "action", "action": "back"}, [])
    controls._on_frontend_msg(controls, {"event": "seek", "position": 40}, [])
    wait_for_worker(viz)
    assert viz.position == 40
    viz.pools._on_frontend_msg(viz.pools, {"event": "select", "device": "gpu", "number": 3}, [])
    wait_for_worker(viz)
    assert viz.selected == ("gpu", 3)
    viz.frames.flush()
    assert viz.controls.frame["cursor"]["position"] == 40
    assert viz.inspector.frame["inspector"]["number"] == 3
    assert viz.pools.frame["pools"]["gpu"]["n"] == 32
    controls._on_frontend_msg(controls, {"event": "speed", "index": 9}, [])
    controls._on_frontend_msg(controls, {"event": "action", "action": "play"}, [])
    wait_for_worker(viz)
    viz._play_thread and viz._play_thread.join(timeout=60)
    assert viz.position == len(viz) and not viz.playing
    viz.close()


def test_play_and_pause_from_python():
    viz = Visualizer.from_trace("prefill")
    viz.play(speed="max")
    viz._play_thread.join(timeout=60)
    assert viz.position == len(viz) and not viz.playing
    viz.play(speed=1)  # a trace at its end plays again from the start
    viz.pause()
    assert not viz.playing and viz.position < len(viz)
    with pytest.raises(ValueError):
        viz.set_speed(3)
    viz.close()


def test_frames_are_coalesced():
    now = [0.0]
    scheduled = []
    sent = []
    throttle = FrameThrottle(lambda: sent.append(now[0]), min_interval=0.05, clock=lambda: now[0],
                             schedule=lambda delay, fn: scheduled.append((delay, fn)))
    for _ in range(100):
        throttle.request()
    assert len(sent) == 1 and len(scheduled) == 1
    now[0] = 0.05
    scheduled.pop()[1]()
    assert len(sent) == 2
    throttle.request()
    assert len(sent) == 2 and len(scheduled) == 1  # still inside the interval of the timer's send
    now[0] = 1.0
    scheduled.pop()[1]()
    assert len(sent) == 3
    now[0] = 2.0
    throttle.request()
    assert len(sent) == 4 and not scheduled


def test_package_never_imports_textual():
    code = ("import sys, blockviz.jupyter; v = blockviz.jupyter.Visualizer.from_trace('swap'); "
            "v.run_to_completion(); assert 'textual' not in sys.modules, 'textual imported'")
    subprocess.run([sys.executable, "-c", code], check=True)


# ---------------------------------------------------------------------------- a live engine


def reference_state(model_dir, options, prompts, params):
    """An in-process run's reducer state and outputs (an engine session run to completion, a
    reducer fed its events)."""
    from blockviz.session.engine_session import EngineSession
    from blockviz.session.spec import EngineSpec
    from engine.llm import LLM

    llm = LLM(str(model_dir), **options)
    session = EngineSession(EngineSpec(llm.engine.config, prompts=()), engine=llm.engine)
    header = session.header
    state = ReducerState(header["block_size"], header["num_gpu_blocks"], header["num_cpu_blocks"])
    request_ids = [session.add_request(prompt, sampling_params=params) for prompt in prompts]
    session.run_to_completion(on_events=state.apply_all)
    return state, [session.finished[request_id] for request_id in request_ids]


def without_timing(state: ReducerState) -> dict:
    values = dict(vars(state))
    values.pop("step_time_s")
    return values


LIVE_OPTIONS = {"block_size": 4, "num_gpu_blocks": 24, "num_cpu_blocks": 8, "enable_prefix_caching": True}
LIVE_PROMPTS = ["To be, or not to be, that is", "To be, or not to be, that is the question"]


def test_live_visualizer_steps_the_engine_like_an_in_process_run(tiny_gpt2_dir):
    from engine.llm import LLM
    from engine.sequence import SamplingParams

    params = SamplingParams(max_tokens=6)
    llm = LLM(str(tiny_gpt2_dir), **LIVE_OPTIONS)
    viz = Visualizer.live(llm, prompts=LIVE_PROMPTS, sampling_params=params)
    assert viz.llm is llm and set(viz.state.requests) == {"0", "1"}
    assert llm.engine.num_steps == 0
    known = len(viz)
    first = viz.step_event()  # at the end of what is known: the engine steps once
    assert llm.engine.num_steps == 1 and first is viz.events[known] and len(viz) > known + 1
    step = viz.step()
    assert step.type == "step_finished" and step.step == viz.state.step
    viz.back(len(viz))
    assert viz.position == 0 and llm.engine.num_steps == 1  # time travel leaves the engine alone
    hit = viz.run_until("prefix_cache_hit")
    assert hit is not None and viz.state.pools["gpu"][hit.block].num_hits >= 1
    assert viz.run_until("swap_in") is None and viz.position == len(viz)
    outputs = viz.run_to_completion()
    assert not llm.engine.has_unfinished_requests() and viz.finished
    state, expected = reference_state(tiny_gpt2_dir, LIVE_OPTIONS, LIVE_PROMPTS, params)
    assert without_timing(viz.state) == without_timing(state)
    assert [o.outputs[0].token_ids for o in outputs] == [o.outputs[0].token_ids for o in expected]
    check_snapshot(snapshot(viz.state), viz.state)
    viz.close()


def test_live_commands_fork_swap_out_and_errors(tiny_gpt2_dir):
    from engine.sequence import SamplingParams

    viz = Visualizer.live({"model": str(tiny_gpt2_dir), "block_size": 4, "num_gpu_blocks": 32,
                           "num_cpu_blocks": 16})
    request_id = viz.add_request("The quick brown fox", SamplingParams(max_tokens=12), n=1)
    assert viz.position == len(viz) and viz.current_event.type == "request_added"
    viz.step()
    seq_id = viz.state.requests[request_id][0]
    child = viz.fork(seq_id)
    assert viz.current_event.type == "fork" and viz.state.tables[child] == viz.state.tables[seq_id]
    cow = viz.run_until("copy_on_write")
    assert cow is not None
    pairs = viz.preempt(request_id)
    assert pairs and viz.current_event.type in ("swap_out", "kv_digest")
    assert viz.state.num_used("cpu") == len(pairs)
    with pytest.raises(ValueError, match="not running"):
        viz.fork(12345)
    assert viz.error.startswith("fork sequence 12345:") and "\n" not in viz.error
    assert viz.frame()["cursor"]["error"] == viz.error
    viz.run_to_completion()
    assert [o.request_id for o in viz.outputs] == [request_id] and len(viz.outputs[0].outputs) == 2
    viz.close()


def test_live_engine_error_is_one_line(tiny_gpt2_dir, monkeypatch):
    viz = Visualizer.live({"model": str(tiny_gpt2_dir), "block_size": 4, "num_gpu_blocks": 16},
                          prompts="The quick brown fox")

    def broken():
        raise RuntimeError("the model fell over\nTraceback (most recent call last): ...")

    monkeypatch.setattr(viz.engine, "step", broken)
    viz.controls._on_frontend_msg(viz.controls, {"event": "action", "action": "step"}, [])
    wait_for_worker(viz)
    assert viz.error == "engine stopped: the model fell over"
    viz.frames.flush()
    assert viz.controls.frame["cursor"]["error"] == viz.error
    with pytest.raises(RuntimeError):
        viz.step()
    viz.close()


def test_live_play_free_runs_to_the_end(tiny_gpt2_dir):
    from engine.sequence import SamplingParams

    viz = Visualizer.live({"model": str(tiny_gpt2_dir), "block_size": 4, "num_gpu_blocks": 32},
                          prompts=LIVE_PROMPTS, sampling_params=SamplingParams(max_tokens=5))
    viz.play("max")
    viz._play_thread.join(timeout=120)
    assert not viz.playing and viz.finished and len(viz.outputs) == 2
    viz.close()


def test_the_controls_say_what_the_last_event_did_as_the_tui_does():
    from blockviz.model.narration import narrate

    viz = Visualizer.from_trace("fork-cow")
    event = viz.run_until("fork")
    frame = viz.frame()
    assert frame["cursor"]["current"] == narrate(event, viz.state)
    request = viz.state.seqs[event.parent_seq_id].request_id
    assert frame["cursor"]["current"].startswith(f"fork request {request} (seq {event.parent_seq_id}) → "
                                                 f"request {request} (seq {event.child_seq_id})")


def test_a_frame_timer_that_fires_after_close_sends_nothing():
    from blockviz.jupyter.playback import FrameThrottle

    now = [0.0]
    timers = []
    sent = []
    throttle = FrameThrottle(lambda: sent.append(now[0]), min_interval=0.05, clock=lambda: now[0],
                             schedule=lambda delay, fn: timers.append(fn))
    throttle.request()  # sent at once
    throttle.request()  # too soon: a timer will send it
    assert sent == [0.0] and len(timers) == 1
    throttle.close()
    now[0] = 1.0
    timers[0]()  # the timer fires after the views were closed
    throttle.request()
    assert sent == [0.0]


def test_a_visualizer_left_playing_is_stopped_at_interpreter_exit():
    """A kernel that shuts down without viz.close(): the atexit hook stops the play thread and
    closes the frame throttle first, so nothing is sent to comms being torn down."""
    import time

    from blockviz.jupyter import visualizer

    viz = Visualizer.from_trace("swap")
    viz.play(100)
    deadline = time.monotonic() + 10
    while viz.position < 5 and time.monotonic() < deadline:
        time.sleep(0.01)
    assert viz.playing and viz.position >= 5
    visualizer._stop_all_at_exit()
    assert not viz.playing and viz._play_thread is None
    sent, position = viz.frames.num_sent, viz.position
    viz.frames.request()
    time.sleep(0.2)
    assert viz.frames.num_sent == sent and viz.position == position  # stopped, and no frame goes out
    viz.close()


def test_the_pool_view_draws_on_a_canvas_unless_told_cells():
    import traitlets

    from blockviz.jupyter.widgets import ESM, PoolView

    view = PoolView()
    assert view.renderer == "canvas"
    view.renderer = "cells"
    with pytest.raises(traitlets.TraitError):
        view.renderer = "svg"
    assert "function canvasGrid(" in ESM and "function cellGrid(" in ESM  # pool_canvas.js is in the module
    view.close()


def test_play_and_pause_hammered_from_two_threads_never_fail_and_end_paused(monkeypatch):
    """The Pause button racing Play (issue 30): play() and pause() called over and over from two
    threads at once never raise (a pause used to join a play thread not started yet: here every
    thread takes a moment to start, so a pause lands in that moment often), and a last pause
    leaves no play thread behind."""
    import time

    viz = Visualizer.from_trace("swap")
    errors: list[BaseException] = []
    start = threading.Barrier(2)

    class SlowToStart(threading.Thread):
        def start(self) -> None:
            time.sleep(0.001)
            super().start()

    def hammer(call) -> None:
        start.wait()
        for _ in range(200):
            try:
                call()
            except BaseException as exc:  # noqa: BLE001 - collected, asserted below
                errors.append(exc)

    threads = [threading.Thread(target=hammer, args=(lambda: viz.play(speed=1000),)),
               threading.Thread(target=hammer, args=(viz.pause,))]
    monkeypatch.setattr(threading, "Thread", SlowToStart)
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=120)
    monkeypatch.undo()
    assert not any(thread.is_alive() for thread in threads) and errors == []
    viz.pause()
    assert not viz.playing and viz._play_thread is None
    assert not [t for t in threading.enumerate() if t.name == "blockviz-play"]
    viz.close()


def test_the_notebook_shows_the_guides_card_at_each_stop_and_nowhere_else():
    """The cards the TUI's guided playback stops on (blockviz/model/guide.py) are drawn under the
    notebook's controls at the same cursors: one per idea, naming its blocks and vLLM function."""
    from blockviz.model.guide import Guide

    trace = load_trace("swap")
    guide = Guide(trace.header.get("kv_manager") or "v0")
    guide.scan(trace.events)
    guide.settle()
    stops = {card.position: card for card in guide.cards}
    assert {card.idea for card in guide.cards} >= {"swap-out", "swap-in"}
    viz = Visualizer.from_trace(trace)
    for position in range(len(trace.events) + 1):
        viz.seek(position)
        position = viz.position  # inside an operation, the slider lands at its end
        card = viz.frame()["card"]
        if position in stops:
            expected = stops[position]
            assert card["idea"] == expected.idea and card["function"] == expected.function
            assert card["blocks"] == [list(b) for b in expected.blocks] and card["what"]
        else:
            assert card is None, position


# ---------------------------------------------------------------------------- guided (issue 39 item 3)


def test_a_guided_notebook_stops_on_each_card_while_playing_and_sends_it_with_its_blocks_highlighted(story_trace_path):
    from blockviz.model.guide import Guide

    trace = load_trace(story_trace_path)
    guide = Guide(opening=True)  # a guided story opens on what a KV cache is
    guide.scan(trace.events)
    guide.settle()
    viz = Visualizer.from_trace(trace)  # a recorded story: guided by default
    assert viz.frame()["card"]["idea"] == "kv-cache" and viz.frame()["card"]["counter"].startswith("card 1 of")
    stops = [0]
    assert viz.player.guided and not Visualizer.from_trace("swap").player.guided
    assert Visualizer.from_trace("swap", guided=True).player.guided
    viz.play("max")
    while True:
        viz._play_thread.join(timeout=60)
        viz.frames.flush()
        sent = viz.controls.frame
        if viz.position == len(viz):
            break
        card = guide.card_at(viz.position)
        assert card is not None and not viz.playing, viz.position
        assert sent["card"]["title"] == card.title and sent["card"]["counter"] == f"card {len(stops) + 1} of {len(guide.cards)}"
        assert sent["cursor"]["position"] == card.position and sent["cursor"]["guided"]
        touched = {(device, number) for device, numbers in viz.pools.frame["touched"].items() for number in numbers}
        assert touched == set(card.blocks)  # the pools highlight the card's blocks
        stops.append(card.position)
        viz.play("max")
    assert stops == [card.position for card in guide.cards]
    viz.seek(0)
    assert [viz.next_card().position for _ in guide.cards[1:]] == stops[1:]  # the "next idea ▸" button's
    assert viz.next_card() is None and viz.position == len(viz)
    viz.close()


def test_the_breakpoints_bar_with_nothing_ticked_goes_to_the_next_card_when_guided(story_trace_path):
    viz = Visualizer.from_trace(load_trace(story_trace_path))
    bar = viz.breakpoints_view
    bar._on_frontend_msg(bar, {"event": "break", "direction": "next"}, [])
    viz._buttons.wait(timeout=60)
    first = viz.player.guide.cards[1]  # the first after the opening card
    assert viz.position == first.position and first.title in viz.insight.break_message
    viz.controls._on_frontend_msg(viz.controls, {"event": "action", "action": "next_card"}, [])
    viz._buttons.wait(timeout=60)
    assert viz.position == viz.player.guide.cards[2].position
    viz.close()


def test_a_live_story_is_guided_by_default_and_stops_on_its_first_card():
    """A live story opens on card 1 and counts its cards as its replay does ("card 2 of 7": the
    story's known count, scenario.STORY_CARDS, before the run has ended)."""
    from blockviz.session.scenario import STORY_CARDS

    viz = Visualizer.live({"device": "cpu"}, scenario="story")
    try:
        assert viz.player.guided and viz.frame()["cursor"]["guided"]
        assert viz.frame()["card"]["counter"] == f"card 1 of {STORY_CARDS['story']}"
        card = viz.next_card()  # steps the engine until the first idea's operation has ended
        assert card is not None and card.idea == "forking" and viz.position == card.position
        assert not viz.player.guide.settled  # the run goes on: the count is the story's
        assert viz.frame()["card"]["counter"] == f"card 2 of {STORY_CARDS['story']}"
    finally:
        viz.close()

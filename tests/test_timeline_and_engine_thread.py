"""Time travel and playback (blockviz/model/timeline.py, player.py) and the thread driver
(blockviz/session/engine_thread.py's EngineBridge): the model and session layers, tested without a
terminal."""

from __future__ import annotations

import copy
import math
import threading
import time

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from blockviz.model.timeline import Timeline, state_equal
from blockviz.model.player import Player
from blockviz.session.spec import EngineSpec
from blockviz.session.engine_driver import Listener
from blockviz.session.engine_thread import EngineBridge
from blockviz.tui.messages import EngineEvents
from blockviz.model.reducer import ReducerState
from blockviz.session.engine_session import trace_header
from test_tui_fake_engine import FakeEngine, run_scenario


def _events(**engine_kwargs):
    engine = FakeEngine(**engine_kwargs)
    events = run_scenario(engine, ["ROMEO: hi", "JULIET:"], n=2, max_tokens=6)
    return trace_header(engine), events


HEADER, EVENTS = _events(block_size=2, num_gpu_blocks=12, num_cpu_blocks=12)


def _timeline(snapshot_every: int = 16) -> Timeline:
    timeline = Timeline(HEADER["block_size"], HEADER["num_gpu_blocks"], HEADER["num_cpu_blocks"], snapshot_every)
    timeline.extend(EVENTS)
    return timeline


def _fresh(position: int) -> ReducerState:
    """The reducer over the first `position` events, applied one at a time."""
    state = ReducerState(HEADER["block_size"], HEADER["num_gpu_blocks"], HEADER["num_cpu_blocks"])
    for event in EVENTS[:position]:
        state.apply(event)
    return state


def test_apply_all_in_batches_equals_applying_one_event_at_a_time():
    one_by_one = _fresh(len(EVENTS))
    for cut in (0, 1, len(EVENTS) // 3, len(EVENTS) - 1, len(EVENTS)):
        state = ReducerState(HEADER["block_size"], HEADER["num_gpu_blocks"], HEADER["num_cpu_blocks"])
        state.apply_all(EVENTS[:cut]).apply_all(iter(EVENTS[cut:]))  # a list, then any iterable
        assert state_equal(state, one_by_one), cut  # pools, tables, counts, num_events, last_seq_no


def test_the_state_at_every_position_is_the_reducer_over_the_prefix():
    timeline = _timeline(snapshot_every=5)
    for position in list(range(len(EVENTS) + 1)) + list(range(len(EVENTS), -1, -7)):
        timeline.seek(position)
        assert state_equal(timeline.state, _fresh(position)), position


@settings(max_examples=40, deadline=None)
@given(start=st.integers(0, len(EVENTS)), n=st.integers(0, len(EVENTS)), every=st.integers(1, 40))
def test_back_n_then_forward_n_returns_the_same_state(start, n, every):
    timeline = _timeline(every)
    timeline.seek(start)
    before = timeline.state.copy()
    n = min(n, start)
    timeline.back(n)
    assert timeline.position == start - n
    timeline.forward(n)
    assert timeline.position == start
    assert state_equal(timeline.state, before)


def test_clone_is_deep():
    timeline = _timeline()
    timeline.seek(len(EVENTS) // 2)
    before = copy.deepcopy(timeline.state)
    clone = timeline.state.copy()
    assert state_equal(clone, before)
    used = next(b for b in clone.pools["gpu"] if b.owners)
    used.owners.add(999)
    seq_id, table = next(iter(clone.tables.items()))
    table.append(("gpu", 999))
    seq = clone.seqs[seq_id]
    seq.token_ids.append(999)
    seq.token_texts.append("x")
    seq.status = "changed"
    for name in ("hash_map", "requests", "counts"):
        getattr(clone, name)[999] = 999
    clone.tables.clear()
    assert state_equal(timeline.state, before)


def test_a_frozen_state_thaws_to_an_equal_independent_state_and_holds_no_tracked_objects():
    import dataclasses
    import gc

    from blockviz.model.reducer import BlockState, SeqState

    timeline = _timeline()
    timeline.seek(len(EVENTS) // 2)
    state = timeline.state
    # every field of a block and a sequence away from its default, so none can be left out
    block = state.pools["cpu"][0]
    for number, f in enumerate(dataclasses.fields(BlockState)):
        default = f.default_factory() if f.default is dataclasses.MISSING and f.default_factory is not dataclasses.MISSING else f.default
        if getattr(block, f.name) == default:
            setattr(block, f.name, {"owners": {7, 8}, "token_ids": (1, 2), "state": "used", "registered": True,
                                    "digest": "abcd0123"}.get(f.name, 1000 + number))
    seq = next(iter(state.seqs.values()))
    seq.finish_reason, seq.parent_seq_id, seq.num_cached_tokens = "stop", 3, 2
    before = copy.deepcopy(state)
    frozen = state.freeze()
    thawed = ReducerState.thaw(frozen)
    assert state_equal(thawed, before)
    thawed.pools["cpu"][0].owners.add(999)
    thawed.seqs[seq.seq_id].token_ids.append(999)
    next(iter(thawed.tables.values())).append(("gpu", 999))
    thawed.counts["x"] = 1
    assert state_equal(ReducerState.thaw(frozen), before) and state_equal(state, before)
    for _ in range(6):  # each collection untracks the tuples whose items all are: one level of nesting
        gc.collect()

    def tracked(value) -> int:
        return gc.is_tracked(value) + (sum(map(tracked, value)) if isinstance(value, tuple) else 0)

    assert tracked(frozen) < 10  # the outer tuples at most: blocks and sequences are plain tuples


def test_step_boundaries_follow_step_finished():
    timeline = _timeline()
    ends = [i + 1 for i, e in enumerate(EVENTS) if e.type == "step_finished"]
    assert timeline.step_ends == ends
    player = Player(timeline)
    player.step_engine()
    assert timeline.position == ends[0] and timeline.current_event.type == "step_finished"
    player.step_engine()
    assert timeline.position == ends[1]
    player.back_step()
    assert timeline.position == ends[0]
    player.back_step()
    assert timeline.position == 0


def test_play_advances_by_speed_and_stops_at_the_end_of_a_replay():
    timeline = _timeline()
    player = Player(timeline, speed_index=3)  # 10 events/s
    assert player.speed == 10
    player.toggle_play()
    player.tick(0.5)
    first = timeline.position
    assert first == timeline.landing(5) > 5  # an engine operation is drawn whole ...
    assert timeline.operation_at() is None and timeline.operation_at(5) is not None
    player.faster()
    player.tick((first - 5) / 25)  # ... and the events it played ahead of time are paid back
    assert timeline.position == first
    player.tick(0.1)  # 25/s * 0.1 = 2.5 events
    assert timeline.position == timeline.landing(first + 2)
    while player.playing:
        player.tick(1.0)
    assert timeline.at_end
    player.speed_index = len(__import__("blockviz.model.player").model.player.SPEEDS) - 1
    assert math.isinf(player.speed) and player.speed_label == "max"
    player.toggle_play()  # at the end of a replay, play starts over
    assert timeline.position == 0
    player.tick(0.01)
    assert timeline.at_end


def test_live_player_asks_for_engine_steps_and_resolves_what_it_waited_for():
    timeline = Timeline(HEADER["block_size"], HEADER["num_gpu_blocks"], HEADER["num_cpu_blocks"])
    player = Player(timeline, live=True)
    assert player.engine_steps_wanted() == 0
    player.step_engine()  # nothing buffered: wait for the engine
    assert player.pending is not None and player.engine_steps_wanted() == 1
    first_step = EVENTS[:timeline_step_end(EVENTS, 1)]
    player.on_events(first_step)
    assert timeline.at_end and timeline.current_event.type == "step_finished"
    assert player.engine_steps_wanted() == 0
    player.step_event()
    assert player.pending.kind == "event"
    player.on_events(EVENTS[len(first_step):])
    assert timeline.position == len(first_step) + 1


def timeline_step_end(events, count: int) -> int:
    seen = 0
    for index, event in enumerate(events):
        if event.type == "step_finished":
            seen += 1
            if seen == count:
                return index + 1
    raise AssertionError("not enough steps")


def test_engine_event_batches_coalesce_in_order():
    older, newer = EngineEvents(list(EVENTS[:3])), EngineEvents(list(EVENTS[3:5]))
    assert older.can_replace(newer)
    assert newer.events == list(EVENTS[:5])


# ---------------------------------------------------------------------------- the bridge


class Collector:
    def __init__(self):
        self.events: list = []
        self.header = None
        self.notices: list[str] = []
        self.idle = threading.Event()
        self.ready = threading.Event()

    def listener(self) -> Listener:
        def on_ready(header):
            self.header = header
            self.ready.set()

        return Listener(loading=lambda text: None, ready=on_ready, failed=self.notices.append,
                        events=self.events.extend, notice=self.notices.append, idle=self.idle.set)


def _wait(predicate, timeout: float = 5.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError("timed out")
        time.sleep(0.005)


@pytest.fixture
def bridge_run():
    started = []

    def start(bridge: EngineBridge) -> Collector:
        collector = Collector()
        thread = threading.Thread(target=bridge.run, args=(collector.listener(),), daemon=True)
        thread.start()
        started.append((bridge, thread))
        collector.ready.wait(5)
        return collector

    yield start
    for bridge, thread in started:
        bridge.stop()
        thread.join(5)
        assert not thread.is_alive()


def _spec(**kwargs) -> EngineSpec:
    return EngineSpec.of(model="fake", prompts=("ROMEO: hi", "JULIET:"), **kwargs)


def test_bridge_steps_only_on_demand(bridge_run):
    bridge = EngineBridge(_spec(max_tokens=3), make_engine=FakeEngine)
    got = bridge_run(bridge)
    _wait(lambda: len(got.events) == 2)  # the two request_added events, no step yet
    time.sleep(0.05)
    assert bridge.num_steps == 0
    bridge.request_steps(1)
    _wait(lambda: got.events[-1].type == "step_finished")
    assert bridge.num_steps == 1 and bridge.outstanding == 0


def test_bridge_backpressure_waits_for_the_ui(bridge_run):
    bridge = EngineBridge(_spec(max_tokens=50), make_engine=FakeEngine, max_in_flight=10, flush_interval=0.0)
    got = bridge_run(bridge)
    bridge.set_free_run(True)
    _wait(lambda: bridge.in_flight >= 10)
    time.sleep(0.05)
    steps = bridge.num_steps
    time.sleep(0.1)
    assert bridge.num_steps == steps  # waiting for the UI
    bridge.acknowledge(len(got.events))
    _wait(lambda: bridge.num_steps > steps)


def test_bridge_runs_commands_between_steps_and_reports_refusals(bridge_run):
    bridge = EngineBridge(_spec(max_tokens=20, n=1), make_engine=FakeEngine)
    got = bridge_run(bridge)
    bridge.request_steps(2)
    _wait(lambda: bridge.num_steps == 2)
    bridge.fork(0)
    bridge.preempt("1")
    bridge.fork(42)
    _wait(lambda: len(got.notices) == 1)
    kinds = [e.type for e in got.events]
    assert "fork" in kinds and "swap_out" in kinds
    assert "fork sequence 42" in got.notices[0]
    bridge.add_request("more")
    _wait(lambda: got.events[-1].type == "request_added")


def test_bridge_reports_idle_when_everything_finished(bridge_run):
    bridge = EngineBridge(_spec(max_tokens=2), make_engine=FakeEngine)
    got = bridge_run(bridge)
    bridge.set_free_run(True)
    assert got.idle.wait(5)
    assert not any(e.type == "request_added" for e in got.events[2:])


def test_bridge_reports_a_failed_load_in_one_line():
    def broken():
        raise ValueError("model 'nope' is not a checkpoint directory\nmore detail")

    failures = []
    EngineBridge(_spec(), make_engine=broken).run(
        Listener(loading=lambda t: None, ready=lambda h: None, failed=failures.append, events=lambda e: None))
    assert failures == ["model 'nope' is not a checkpoint directory"]


def test_a_driver_sends_what_the_engine_emitted_before_saying_it_stopped():
    """EngineDriver (blockviz/session/engine_driver.py), the loop both live views run: a step only
    while a request is unfinished, one batch per flush, and an engine error reported after the
    events it emitted, as one line."""
    from blockviz.session.engine_driver import EngineDriver
    from blockviz.session.engine_session import EngineSession

    heard: list = []
    listener = Listener(loading=lambda t: None, ready=lambda h: None, failed=lambda e: None,
                        events=lambda batch: heard.append(("events", [e.type for e in batch])),
                        died=lambda line: heard.append(("died", line)))
    engine = FakeEngine()
    driver = EngineDriver(EngineSession(_spec(max_tokens=2, n=1), engine=engine), listener)
    driver.session.start()
    assert driver.flush() == 2 and heard == [("events", ["request_added", "request_added"])]
    assert driver.flush() == 0 and len(heard) == 1  # nothing new: no empty batch

    emitted_then_broke = engine.step

    def step():
        emitted_then_broke()
        raise RuntimeError("the model fell over\nTraceback ...")

    engine.step = step
    with pytest.raises(RuntimeError):
        driver.step()
    assert driver.stopped(RuntimeError("the model fell over\nTraceback ...")) == "engine stopped: the model fell over"
    assert heard[-2][0] == "events" and "step_finished" in heard[-2][1]
    assert heard[-1] == ("died", "engine stopped: the model fell over")

    engine.step = emitted_then_broke
    while driver.step():
        driver.flush()
    assert not driver.session.has_unfinished_requests() and not driver.step()


def test_the_ready_header_holds_the_runs_arrivals_so_a_live_story_counts_its_cards(bridge_run):
    """The header a live view gets holds the spec's run settings (its arrivals): scenario.story_cards
    reads them to say "card 2 of 7" before the run ends."""
    from blockviz.session.scenario import Arrival

    spec = EngineSpec.of(model="fake", prompts=("ROMEO: hi",), arrivals=(Arrival(1, "JULIET:"),), max_tokens=3)
    got = bridge_run(EngineBridge(spec, make_engine=FakeEngine))
    assert got.header["arrivals"] == [{"step": 1, "prompt": "JULIET:", "n": 1}]
    assert "block_size" in got.header and "num_gpu_blocks" in got.header  # the engine's settings too

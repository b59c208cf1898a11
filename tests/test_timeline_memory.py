"""A long live session in bounded memory: a Timeline followed to its newest event (as the TUI and
the live Visualizer do) keeps snapshots whose memory grows linearly with its events, not with their
square, and still travels back exactly."""

from __future__ import annotations

import functools
import gc
import tracemalloc

import msgspec

from blockviz.model.reducer import ReducerState
from blockviz.model.timeline import Timeline, state_equal
from blockviz.model.trace import load_trace
from engine import events as ev

# The bound this test holds the Timeline to: what it keeps besides the events themselves, per event.
BYTES_PER_EVENT = 400


def renumbered(trace, k: int) -> list[ev.Event]:
    """The trace's events as the k-th repetition of its requests: new request and sequence ids,
    steps and event numbers after those of the repetitions before."""
    num_events, seqs_per_run, steps_per_run = _run_sizes(trace)
    shift = {"seq_no": k * num_events, "seq_id": k * seqs_per_run, "step": k * steps_per_run}
    out = []
    for e in trace.events:
        changes = {name: getattr(e, name) + shift[name] for name in _shifted(type(e))}
        if "seq_ids" in e.__struct_fields__:
            changes["seq_ids"] = tuple(s + shift["seq_id"] for s in e.seq_ids)
        if "request_id" in e.__struct_fields__:
            changes["request_id"] = f"{k}-{e.request_id}"
        out.append(msgspec.structs.replace(e, **changes))
    return out


_SIZES: dict[int, tuple[int, int, int]] = {}


def _run_sizes(trace) -> tuple[int, int, int]:
    """(events, sequences, steps) of one repetition of the trace's run, worked out once per trace."""
    if id(trace) not in _SIZES:
        _SIZES[id(trace)] = (len(trace.events),
                             1 + max(s for e in trace.events if isinstance(e, ev.RequestAdded) for s in e.seq_ids),
                             max(e.step for e in trace.events if isinstance(e, ev.StepFinished)))
    return _SIZES[id(trace)]


@functools.cache
def _shifted(cls) -> tuple[str, ...]:
    """The fields of an event class that a repetition shifts by a number: its event number, its
    sequence id, and the step of a step's start or end."""
    steps = ("step",) if issubclass(cls, (ev.StepStarted, ev.StepFinished)) else ()
    return ("seq_no", *(name for name in ("seq_id",) if name in cls.__struct_fields__), *steps)


def test_a_live_timeline_of_6000_requests_keeps_memory_linear_in_its_events():
    trace = load_trace("prefill")  # the bundled model: four requests, from arrival to their last free
    runs = [renumbered(trace, k) for k in range(1500)]  # 6,000 requests
    timeline = Timeline(trace.block_size, trace.num_gpu_blocks, trace.num_cpu_blocks)
    gc.collect()
    tracemalloc.start()
    try:
        base = tracemalloc.get_traced_memory()[0]
        per_event = {}
        for k, run in enumerate(runs, 1):
            timeline.extend(run)
            timeline.seek(len(timeline))  # following the engine, as a live view does
            if k in (375, 1500):
                gc.collect()
                per_event[k] = (tracemalloc.get_traced_memory()[0] - base) / len(timeline)
    finally:
        tracemalloc.stop()
    assert len(timeline) == 1500 * len(trace.events)
    assert per_event[1500] < BYTES_PER_EVENT and per_event[375] < BYTES_PER_EVENT, per_event
    assert per_event[1500] < 1.5 * per_event[375], per_event  # flat per event: linear, not quadratic
    # time travel over all of it is still exact
    for position in (len(timeline) - 1, len(timeline) // 2, 7):
        timeline.seek(position)
        fresh = ReducerState(trace.block_size, trace.num_gpu_blocks, trace.num_cpu_blocks)
        assert state_equal(timeline.state, fresh.apply_all(timeline.events[:position])), position


# A capped live timeline: what it keeps, besides nothing else, per event it keeps (the events themselves
# included, as a live run makes them: they are freed once dropped).
CAP = 20_000
BYTES_PER_KEPT_EVENT = 400


def test_a_capped_live_timeline_of_6000_requests_stays_within_its_cap():
    trace = load_trace("prefill")
    timeline = Timeline(trace.block_size, trace.num_gpu_blocks, trace.num_cpu_blocks, max_events=CAP)
    gc.collect()
    tracemalloc.start()
    try:
        base = tracemalloc.get_traced_memory()[0]
        used = {}
        for k in range(1500):  # 6,000 requests, made as the engine makes them
            timeline.extend(renumbered(trace, k))
            timeline.seek(len(timeline))
            if k + 1 in (300, 1500):
                gc.collect()
                used[k + 1] = tracemalloc.get_traced_memory()[0] - base
    finally:
        tracemalloc.stop()
    total = 1500 * len(trace.events)
    assert len(timeline) <= CAP and timeline.dropped_events + len(timeline) == total
    assert used[1500] < CAP * BYTES_PER_KEPT_EVENT, used
    assert used[1500] < 1.2 * used[300], used  # flat: bounded by the cap, not by the session
    # the dropped steps and requests are counted and said; the picture holds only the kept requests
    finished_steps = sum(isinstance(e, ev.StepFinished) for e in trace.events)
    assert timeline.dropped_steps + len(timeline.step_ends) == 1500 * finished_steps
    assert timeline.dropped_requests > 5000 and len(timeline.state.requests) <= 4 * (CAP // len(trace.events) + 1)
    assert f"steps 1-{timeline.dropped_steps} dropped" in timeline.dropped_note()
    # time travel over what is kept is exact
    for position in (len(timeline), len(timeline) // 2, 1, 0):
        timeline.seek(position)
        assert state_equal(timeline.state, timeline.base_state().apply_all(timeline.events[:position])), position


def test_a_drop_keeps_the_cursors_event_or_moves_a_cursor_left_behind_to_the_first_kept_one():
    trace = load_trace("prefill")
    timeline = Timeline(trace.block_size, trace.num_gpu_blocks, trace.num_cpu_blocks, max_events=1000)
    made: list[ev.Event] = []
    k = 0
    while not timeline.dropped_events:  # at the newest event, as a live view follows it
        made += renumbered(trace, k)
        timeline.extend(made[-len(trace.events):])
        k += 1
        timeline.seek(len(timeline))
    assert timeline.current_event is made[-1]
    assert isinstance(made[timeline.dropped_events - 1], ev.StepFinished)  # whole steps dropped
    assert timeline.events[0] is made[timeline.dropped_events]
    timeline.seek(5)  # a learner travelled back ...
    parked = timeline.events[4]
    while any(e is parked for e in timeline.events):
        timeline.extend(renumbered(trace, k))  # ... and the engine ran on past the cap
        k += 1
    assert timeline.position == 0 and timeline.current_event is None
    assert state_equal(timeline.state, timeline.base_state())
    timeline.seek(len(timeline))
    assert state_equal(timeline.state, timeline.base_state().apply_all(timeline.events))


def test_insights_follow_a_capped_timeline_even_when_they_fell_behind():
    from blockviz.model.insights import Insights

    trace = load_trace("swap")  # preemptions for the ledger
    header = dict(trace.header)
    timeline = Timeline.for_header(header, max_events=1000)
    eager, lazy = Insights.for_header(header), Insights.for_header(header)
    for k in range(40):
        timeline.extend(renumbered(trace, k))
        timeline.seek(len(timeline))
        eager.sync(timeline)  # every batch, as the TUI does
    lazy.sync(timeline)  # once, after many drops: it starts again from the first kept state
    assert timeline.dropped_events > 0
    for insights in (eager, lazy):
        assert insights.fed == len(timeline)
        assert insights.state.pools == timeline.state.pools
        ledger = insights.ledger(len(timeline))
        assert ledger and all(0 <= entry.position <= len(timeline) for entry in ledger)
        assert all(0 < p.position <= len(timeline) for p in insights.memory_series(len(timeline)))
        assert all(0 < e.position <= len(timeline) for e in insights.explanations(len(timeline)))
    preempted = sum(isinstance(e, ev.Preempted) for e in timeline.events)
    assert len(eager.ledger(len(timeline))) >= preempted


def test_a_cap_below_the_least_is_refused():
    import pytest

    with pytest.raises(ValueError, match="max_events must be at least"):
        Timeline(4, 8, 8, max_events=10)


def test_operations_read_alike_when_the_classes_that_open_none_are_passed_by_a_set_lookup(monkeypatch):
    """Operations.add skips _begin for an event class _begin opened nothing for before: every
    shipped trace reads to the same boundaries and operations as with _begin asked every time."""
    from blockviz.model import operation
    from blockviz.model.trace import shipped_traces

    class Forgetful(set):
        def add(self, item) -> None:
            pass

    def read(trace) -> tuple:
        operations = operation.Operations()
        begins = [operations.add(e) for e in trace.events]
        operations.close()
        return begins, list(operations._spans), list(operations._starts)

    traces = [load_trace(name) for name in shipped_traces()]
    monkeypatch.setattr(operation, "_OPENS_NOTHING", set())
    skipping = [read(trace) for trace in traces]
    assert {ev.TokenGenerated, ev.StepFinished} <= operation._OPENS_NOTHING
    monkeypatch.setattr(operation, "_OPENS_NOTHING", Forgetful())
    assert [read(trace) for trace in traces] == skipping
    assert any(spans for _, spans, _ in skipping)

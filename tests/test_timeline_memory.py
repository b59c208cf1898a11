"""A long live session in bounded memory: a Timeline followed to its newest event (as the TUI and
the live Visualizer do) keeps snapshots whose memory grows linearly with its events, not with their
square, and still travels back exactly."""

from __future__ import annotations

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
    seqs_per_run = 1 + max(s for e in trace.events if isinstance(e, ev.RequestAdded) for s in e.seq_ids)
    steps_per_run = max(e.step for e in trace.events if isinstance(e, ev.StepFinished))
    out = []
    for e in trace.events:
        changes = {"seq_no": e.seq_no + k * len(trace.events)}
        if hasattr(e, "seq_id"):
            changes["seq_id"] = e.seq_id + k * seqs_per_run
        if hasattr(e, "seq_ids"):
            changes["seq_ids"] = tuple(s + k * seqs_per_run for s in e.seq_ids)
        if hasattr(e, "request_id"):
            changes["request_id"] = f"{k}-{e.request_id}"
        if isinstance(e, (ev.StepStarted, ev.StepFinished)):
            changes["step"] = e.step + k * steps_per_run
        out.append(msgspec.structs.replace(e, **changes))
    return out


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

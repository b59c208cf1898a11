"""Cause before effect (issue 28 item 3): the engine announces a preemption (`preempted`, with its
mode and victim) before the swap-out or the frees it causes; at every cursor of every shipped trace
and of a live story run the ledger's preemption count, the pools' used counts and the memory
figures are the ones the reducer state there gives; traces recorded in the old order still load."""

from __future__ import annotations

import json

import pytest

from blockviz.commands.replay import resolve_trace_path, shipped_traces
from blockviz.model.insights import Insights, memory_truth
from blockviz.model.timeline import Timeline
from blockviz.model.trace import load_trace, read_trace
from blockviz.model.view import pool_counts
from blockviz.tui.widgets.insight_panels import memory_fields
from engine import events as ev
from story_fixtures import story_trace_path  # noqa: F401 (fixture)


def _caused_moves(preempted: ev.Preempted, event) -> bool:
    """A swap-out or a GPU free that this preemption causes."""
    if isinstance(event, ev.SwappedOut):
        return event.request_id == preempted.request_id
    return isinstance(event, ev.BlockFreed) and event.device == "gpu" and event.seq_id in preempted.seq_ids


def assert_cause_before_effect(events) -> int:
    """No swap-out or free of a preemption comes in its step before its `preempted` event; returns
    how many preemptions there were. A sliding window's free, announced by its `blocks_skipped`
    (allocate_slots lets the window's blocks go before it finds the pool short, as vLLM's does), is
    not the preemption's."""
    count, step_start = 0, 0
    skipped: set[tuple[int, int]] = set()  # (seq id, block) a window let go in this step
    for index, event in enumerate(events):
        if isinstance(event, ev.StepFinished):
            step_start, skipped = index + 1, set()
        if isinstance(event, ev.BlocksSkipped):
            skipped.update((event.seq_id, block) for block in event.blocks)
        if isinstance(event, ev.Preempted):
            count += 1
            early = [e for e in events[step_start:index] if _caused_moves(event, e)
                     and not (isinstance(e, ev.BlockFreed) and (e.seq_id, e.block) in skipped)]
            assert not early, f"{early[0].type} (event {early[0].seq_no}) before its preempted event {event.seq_no}"
    return count


def assert_figures_agree(trace) -> None:
    """At every cursor: the ledger counts the reducer's preemptions, the pool counts and the memory
    figures are the reducer's, and the memory line labels its figure as the sparkline does."""
    timeline, insights = Timeline.for_trace(trace), Insights.for_header(trace.header)
    insights.sync(timeline.events)
    for position in range(len(timeline) + 1):
        timeline.seek(position)
        state = timeline.state
        ledger = insights.ledger(position)
        assert len(ledger) == state.num_preemptions, position
        used = {device: sum(b.state == "used" for b in pool) for device, pool in state.pools.items()}
        assert {d: c[0] for d, c in pool_counts(state).items()} == used == {d: state.num_used(d) for d in used}
        truth = memory_truth(state, insights.max_tokens)
        assert {d: p.used_blocks for d, p in truth.pools.items()} == used
        gpu = truth.pools["gpu"]
        line = memory_fields(truth)[0][1]
        assert line == f"GPU blocks in use {used['gpu'] / gpu.num_blocks:.0%}"
        for entry in ledger:  # what a swap moved or a recompute freed by now, never more
            assert entry.blocks_swapped <= len(state.pools["cpu"]) and entry.position <= position


@pytest.mark.parametrize("name", sorted(shipped_traces()))
def test_every_shipped_trace_announces_preemptions_first_and_its_figures_agree(name):
    trace = read_trace(resolve_trace_path(name))
    count = assert_cause_before_effect(trace.events)
    assert count == sum(isinstance(e, ev.Preempted) for e in trace.events)
    assert_figures_agree(trace)


def test_a_live_story_run_announces_preemptions_first_and_its_figures_agree(story_trace_path):
    trace = read_trace(story_trace_path)
    assert assert_cause_before_effect(trace.events) >= 1  # the story's pool runs out once at least
    assert_figures_agree(trace)


def test_the_ledger_counts_a_swap_only_once_it_has_happened():
    trace = read_trace(resolve_trace_path("swap"))
    timeline, insights = Timeline.for_trace(trace), Insights.for_header(trace.header)
    insights.sync(timeline.events)
    index = next(i for i, e in enumerate(trace.events) if isinstance(e, ev.Preempted))
    assert isinstance(trace.events[index + 1], ev.SwappedOut)
    (at_preempted,) = insights.ledger(index + 1)
    assert at_preempted.blocks_swapped == 0  # announced, nothing moved yet
    (after,) = insights.ledger(index + 2)[:1]
    assert after.blocks_swapped == len(trace.events[index + 1].mapping) > 0


def _old_order(path, out) -> None:
    """The trace as the engine recorded it before: each `preempted` line after the moves it caused."""
    lines = path.read_text(encoding="utf-8").splitlines()
    header, records = lines[0], [json.loads(line) for line in lines[1:]]
    index = 0
    while index < len(records):
        record = records[index]
        if record["type"] == "preempted":
            end = index + 1
            while end < len(records) and records[end]["type"] in ("swap_out", "block_freed") \
                    and (records[end].get("request_id") == record["request_id"]
                         or records[end].get("seq_id") in record["seq_ids"]):
                end += 1
            records[index:end] = records[index + 1:end] + [record]
            index = end
        index += 1
    for seq_no, record in enumerate(records):
        record["seq_no"] = seq_no
    out.write_text("\n".join([header] + [json.dumps(r) for r in records]) + "\n", encoding="utf-8")


@pytest.mark.parametrize("name", ["swap", "recompute"])
def test_a_trace_recorded_before_preemptions_came_first_still_loads(name, tmp_path):
    path = resolve_trace_path(name)
    _old_order(path, tmp_path / "old.jsonl")
    old, new = load_trace(tmp_path / "old.jsonl"), load_trace(path)
    moved = next(i for i, e in enumerate(old.events) if isinstance(e, ev.Preempted))
    assert not isinstance(old.events[moved - 1], (ev.Preempted, ev.StepStarted))  # its moves came first
    old_ledger = Insights.for_header(old.header)
    old_ledger.sync(old.events)
    new_ledger = Insights.for_header(new.header)
    new_ledger.sync(new.events)
    costs = lambda insights: [(e.mode, e.blocks_swapped, e.blocks_freed, e.tokens_lost, e.resumed_step)  # noqa: E731
                              for e in insights.ledger(len(old.events))]
    assert costs(old_ledger) == costs(new_ledger) and costs(new_ledger)
    assert_figures_agree(old)

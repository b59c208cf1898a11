"""One record per insight panel: the TUI and the notebook draw the explainer, the preemption ledger
and memory truth from the same records (blockviz/model/insight_view.py), as test_view_model checks
for the core panels. At several cursors of every shipped trace the notebook's frame parts are the
records serialised and the TUI's panels show each record's fields; with a sequence selected, both
show the lookup the record chose: a request preempted by recompute shows the lookup it made last by
the cursor (it looks up again each time it is admitted), and a vLLM v1 n > 1 child its own."""

from __future__ import annotations

import io

import pytest
from rich.console import Console

from blockviz.jupyter import Visualizer
from blockviz.model.insight_view import (explain_record, ledger_record, memory_line, memory_record,
                                         sparkline_points)
from blockviz.model.insights import Insights
from blockviz.model.trace import load_trace, shipped_traces
from blockviz.tui.app import BlockvizApp
from blockviz.tui.widgets.insight_panels import render_explain, render_ledger, render_memory


@pytest.fixture
def anyio_backend():
    return "asyncio"


def text_of(renderable) -> list[str]:
    console = Console(width=400, record=True, file=io.StringIO())
    console.print(renderable)
    return [line.rstrip() for line in console.export_text().splitlines()]


def panel_lines(app, panel_id: str) -> list[str]:
    return text_of(app.query_one(f"#{panel_id}").body.content)


def check_drawn(explain, ledger, memory, position: int) -> None:
    """The TUI's drawing of each record shows the record's fields."""
    lines = text_of(render_explain(explain))
    if explain.request is None:
        assert lines[0].startswith("no request allocated yet")
    else:
        assert explain.name.startswith(f"request {explain.request}")  # the tables' name (its seq where n > 1)
        assert lines[0].startswith(f" {explain.name}   ")
        assert f"{explain.num_prompt_tokens} " in lines[0] and f"of {explain.block_size}" in lines[0]
        for row in explain.blocks:
            line = next(line for line in lines if line.startswith(f"L{row.index} "))
            assert (row.hash or "—") in line and "".join(row.tokens) in line
            assert (f"hit → gpu {row.block}" if row.verdict == "hit" else row.verdict) in line
            if row.freed_by is not None:  # a window tail: the slide, and the eviction named apart
                assert f"(window slide: event {row.freed_by.number})" in line
            if row.evicted_by is not None:
                evicted = f"event {row.evicted_by.number}"
                assert (f"(evicted: {evicted})" if row.freed_by is not None else f"({evicted})") in line
        assert lines[-1].startswith(f"hit {explain.hit_blocks} block")
        if explain.first_miss is not None and explain.caching:
            assert f"first miss L{explain.first_miss.index}: {explain.first_miss.verdict}" in lines[-1]
    lines = text_of(render_ledger(ledger))
    if not ledger.count:
        assert lines[0].startswith("no preemptions yet")
    else:
        assert lines[0] == ledger.totals and len(lines) == 2 + len(ledger.rows)
        for line, row in zip(lines[2:], ledger.rows):
            assert row.name.startswith(f"request {row.request}")  # the tables' name (its seqs where n > 1)
            assert line.split()[0] == str(row.step) and f" {row.name} " in line
            assert line[line.index(row.name) + len(row.name):].split()[0] == row.mode
    lines = text_of(render_memory(memory, position))
    assert lines[0] == memory_line(memory)
    table = lines[3:]
    for device, pool in memory.pools.items():
        assert any(line.split()[:2] == [device.upper(), f"{pool.used_blocks}/{pool.num_blocks}"] for line in table)
    for seq in memory.seqs:
        assert seq.name.startswith("request ")  # the tables' name (its seq where n > 1)
        assert any(line.strip().startswith(f"{seq.name} ") and line[len(seq.name) + 1:].split()[0] == str(seq.num_blocks)
                   and line.split()[-1] == str(seq.empty_in_last_block) for line in table)


@pytest.mark.parametrize("name", shipped_traces())
def test_the_notebook_sends_the_records_the_tui_draws(name):
    trace = load_trace(name)
    viz = Visualizer.from_trace(trace)
    insights = Insights.for_header(trace.header)  # the TUI's: fed apart from the notebook's
    try:
        length = len(trace.events)
        for position in sorted({0, 1, length // 3, 2 * length // 3, length}):
            viz.seek(position)
            position = viz.position  # the slider lands at an operation's end
            timeline = viz.timeline
            insights.sync(timeline)
            explain = explain_record(insights, position, state=timeline.state, events=timeline.events,
                                     vocab=timeline.token_texts)
            ledger, memory = ledger_record(insights, position), memory_record(insights, timeline.state, position)
            parts = viz.insight.parts()
            assert parts["explain"] == explain.to_json()
            assert parts["ledger"] == ledger.to_json()
            assert parts["memory"] == memory.to_json()
            assert memory.series == sparkline_points(insights, position)
            check_drawn(explain, ledger, memory, position)
    finally:
        viz.close()


def test_a_record_serialises_to_the_json_the_page_draws():
    trace = load_trace("recompute")
    insights = Insights.for_header(trace.header)
    insights.sync(trace.events)
    end = len(trace.events)
    explain = explain_record(insights, end, request_id="1", events=trace.events).to_json()
    assert set(explain) >= {"requests", "request", "seq", "num_prompt_tokens", "recomputed", "block_size", "blocks",
                            "hit_blocks", "hit_tokens", "first_miss", "caching"}
    assert set(explain["blocks"][0]) == {"index", "hash", "tokens", "verdict", "block", "evicted_by", "detail",
                                         "freed_by"}
    assert explain_record(insights, 0).to_json() == {"requests": [], "request": None}
    ledger = ledger_record(insights, end).to_json()
    assert ledger["count"] == len(ledger["rows"]) == 5 and isinstance(ledger["rows"][0]["seqs"], list)
    memory = memory_record(insights, Insights.for_header(trace.header).state, end).to_json()
    assert set(memory["pools"]["gpu"]) == {"num_blocks", "used_blocks", "slots_used", "slots_allocated",
                                           "block_utilization", "token_utilization"}


async def _both_at(app, pilot, viz, position: int, seq_id: int):
    """The explainer at `position` with sequence `seq_id` selected, as the TUI draws it (its panel's
    lines) and as the notebook sends it (a block whose first owner is the sequence, selected)."""
    app.player.timeline.seek(position)
    app.action_select_sequence(seq_id)
    await pilot.pause()
    viz.seek(position)
    state = viz.state
    block = next(number for _, number in state.tables[seq_id] if min(state.pools["gpu"][number].owners) == seq_id)
    viz.select("gpu", block)
    return panel_lines(app, "explain"), viz.insight.parts(("explain",))["explain"]


@pytest.mark.anyio
@pytest.mark.parametrize("name, seq_id", [("recompute", 1), ("v1-story", 1)])
async def test_a_selected_sequence_shows_the_same_lookup_in_both(name, seq_id):
    """recompute: request 1 is preempted by recompute and admitted again three times (four lookups);
    v1-story: request 1 has n = 2, and its second child's lookup (four hits) comes after the first's."""
    trace = load_trace(name)
    app = BlockvizApp(trace=trace, deterministic=True, play=False)
    viz = Visualizer.from_trace(trace)
    reference = Insights.for_header(trace.header)
    reference.sync(trace.events)
    request_id = reference.state.seqs[seq_id].request_id
    lookups = [x for x in reference.explanations(len(trace.events)) if x.request_id == request_id]
    assert len(lookups) >= 2 and lookups[-1].position > lookups[0].position
    try:
        async with app.run_test(size=(200, 60)) as pilot:
            app.right_view = "explain"
            for position in sorted({x.position for x in lookups}):
                lines, part = await _both_at(app, pilot, viz, position, seq_id)
                expected = [x for x in lookups if x.position <= position and x.seq_id == seq_id][-1]
                timeline = app.player.timeline
                record = explain_record(app.insights, position, state=timeline.state, seq_id=seq_id,
                                        events=timeline.events, vocab=timeline.token_texts)
                assert part == record.to_json()  # the notebook's part: the record serialised
                assert lines == text_of(render_explain(record))  # the TUI's panel: the record drawn
                assert (record.seq, record.num_prompt_tokens, record.recomputed, record.hit_blocks) == (
                    expected.seq_id, expected.num_prompt_tokens, expected.recomputed, expected.num_hit_blocks)
    finally:
        viz.close()

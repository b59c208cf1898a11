"""The TUI's answers: the explainer panel for the selected request, the preemption ledger panel and
its totals in the status bar, the memory line and its sparklines, each checked against the same
figures derived from the raw events up to the cursor."""

from __future__ import annotations

import re

import pytest

from blockviz.model.explain import explain_requests
from blockviz.model.insights import ledger_totals, max_tokens_of, memory_truth, preemption_ledger
from blockviz.model.names import RequestNames
from blockviz.model.trace import load_trace
from blockviz.tui.app import BlockvizApp
from blockviz.tui.widgets.insight_panels import memory_line
from blockviz.tui.widgets.panels import StatusBar
from tests.test_tui_app import anyio_backend, screen_text  # noqa: F401

pytestmark = pytest.mark.anyio


def panel_text(app, panel_id: str) -> str:
    """The panel's body as plain text (its Static's renderable, rendered at the panel's width)."""
    from rich.console import Console

    panel = app.query_one(f"#{panel_id}")
    console = Console(width=panel.content_size.width, record=True, file=open("/dev/null", "w"))
    console.print(panel.body.content)
    return console.export_text()


def status_lines(app) -> list[str]:
    status = app.query_one(StatusBar)
    return [line.strip() for line in screen_text(app).splitlines()[status.region.y:status.region.y + 3]]


async def test_the_explainer_panel_shows_the_selected_requests_lookup():
    trace = load_trace("prefix-hit")
    app = BlockvizApp(trace=trace, deterministic=True, play=False)
    async with app.run_test(size=(200, 60)) as pilot:
        await pilot.press("G")
        h = trace.header
        expected = explain_requests(trace.events, h["block_size"], h["num_gpu_blocks"], h["num_cpu_blocks"],
                                    h["enable_prefix_caching"])
        assert len(expected) == 2
        for explanation in expected:
            app.action_select_sequence(explanation.seq_id)
            await pilot.pause()
            text = panel_text(app, "explain")
            assert f"request {explanation.request_id}" in text
            assert f"hit {explanation.num_hit_blocks} blocks = {explanation.num_hit_tokens} tokens" in text
            for block in explanation.blocks:
                row = next(line for line in text.splitlines() if line.startswith(f"L{block.index} "))
                assert (f"hit → gpu {block.block}" if block.verdict == "hit" else block.verdict) in row
        assert expected[1].num_hit_blocks == 4  # the second request shares four blocks with the first
        await pilot.press("g")  # before any allocation: nothing to explain yet
        assert "no request allocated yet" in panel_text(app, "explain")


async def test_the_ledger_panel_and_status_totals_follow_the_cursor():
    trace = load_trace("swap")
    events = trace.events
    preempted = [i for i, e in enumerate(events) if e.type == "preempted"]
    app = BlockvizApp(trace=trace, deterministic=True, play=False)
    async with app.run_test(size=(200, 60)) as pilot:
        for index in (preempted[0] - 1, preempted[1] + 1, len(events)):
            app.player.timeline.seek(index)
            app.render_views()
            await pilot.pause()
            entries = preemption_ledger(events[:index])
            assert status_lines(app)[1].endswith(ledger_totals(entries))
            text = panel_text(app, "ledger")
            if not entries:
                assert "no preemptions yet" in text
                continue
            row = re.compile(r"^\s*(\d+)\s+(request \S+(?: \(seqs? [\d, ]+\))?)\s+(\w+)\s+(\d+) (to CPU|freed)\s+(\d+)"
                             r"\s+(waiting|\+\d+ steps)$")
            lines = [line.rstrip() for line in text.splitlines()[2:] if line.strip()]
            assert all(row.match(line) for line in lines), text
            rows = [row.match(line).groups() for line in lines]
            names = RequestNames(app.player.timeline.state)  # each request as the tables name it
            assert rows == [(str(e.step), names.request(e.request_id, e.seq_ids), e.mode,
                             str(e.blocks_swapped if e.mode == "swap" else e.blocks_freed),
                             "to CPU" if e.mode == "swap" else "freed", str(e.tokens_lost),
                             "waiting" if e.steps_until_resumed is None else f"+{e.steps_until_resumed} steps")
                            for e in entries]
            assert all(e.blocks_swapped == e.blocks_freed for e in entries if e.mode == "swap")


async def test_the_memory_line_and_sparklines_are_the_figures_at_the_cursor():
    trace = load_trace("recompute")
    events = trace.events
    app = BlockvizApp(trace=trace, deterministic=True, play=False)
    async with app.run_test(size=(200, 60)) as pilot:
        for steps in (3, 20):
            for _ in range(steps - app.player.timeline.num_steps_done()):
                await pilot.press("s")
            timeline = app.player.timeline
            truth = memory_truth(timeline.state, max_tokens_of(events[:timeline.position]))
            assert status_lines(app)[1].startswith(memory_line(truth))
            text = panel_text(app, "memory")
            assert memory_line(truth) in " ".join(text.split())
            spark = [line for line in text.splitlines() if line.startswith("GPU blocks in use")][-1]  # after the memory line
            bars = spark.split()[-2]  # one glyph per step so far (the panel is wide enough)
            assert len(bars) == steps
            assert spark.split()[-1] == f"{truth.pools['gpu'].block_utilization:.0%}"

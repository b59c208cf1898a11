"""A hybrid run's KV-cache groups in the views (issue 41, item 4), from a real run: a tiny Llama
whose layers are [sliding window 4, full attention] under engine/v1 (tests/hybrid_fixtures.py).
At a cursor where a window group's table holds the null block while its request runs, the view
model, the TUI (Pilot) and the SVG export each draw one table per group per request, labelled
with the group's kind and window, the freed window slots as the null block, the pool's blocks
marked with their group and the inspector naming a block's group, each compared with the reducer
at that cursor. A one-group run's records carry none of it.
"""

from __future__ import annotations

import xml.etree.ElementTree as ET

import pytest

from blockviz.jupyter import Visualizer
from blockviz.model import view
from blockviz.model.names import RequestNames
from blockviz.model.insight_view import explain_record, memory_record
from blockviz.model.insights import Insights
from blockviz.model.palette import group_mark, ref_mark
from blockviz.model.timeline import Timeline
from blockviz.model.trace import load_trace, read_trace
from blockviz.model.reducer import NULL
from blockviz.tui.app import BlockvizApp
from blockviz.tui.widgets.insight_panels import render_memory
from blockviz.tui.widgets.panels import BlockInspector, BlockTables
from blockviz.tui.widgets.pool_grid import GROUP_LEGEND, PoolGrid
from hybrid_fixtures import WINDOW, make_hybrid_llama, record_hybrid_trace, window_cursors
from test_view_model import drawn

SVG = "{http://www.w3.org/2000/svg}"


@pytest.fixture
def anyio_backend():
    return "asyncio"


@pytest.fixture(scope="module")
def hybrid(tmp_path_factory):
    """The hybrid run's trace, and the cursors where a window slot holds the null block."""
    root = tmp_path_factory.mktemp("hybrid")
    trace = read_trace(record_hybrid_trace(root / "hybrid.jsonl", make_hybrid_llama(root / "ckpt")))
    timeline = Timeline.for_trace(trace)
    cursors = window_cursors(timeline)
    assert cursors, "the run never freed a window block mid-request"
    return trace, cursors


def state_at(trace, position: int):
    timeline = Timeline.for_trace(trace)
    timeline.seek(position)
    return timeline


def expected_tables(state) -> dict[int, list[tuple[str, list]]]:
    """seq -> per group (its label, its slots: "null" or (device, number)), from the reducer."""
    out = {}
    for seq_id in sorted(set(state.seqs) | set(state.tables)):
        out[seq_id] = [(view.group_label(state, g), ["null" if state.pools[d][n].state == NULL else (d, n)
                                                     for d, n in state.tables_of(g).get(seq_id, [])])
                       for g in range(state.num_kv_cache_groups)]
    return out


def test_the_view_model_has_a_table_per_group_and_the_null_block_in_freed_window_slots(hybrid):
    trace, cursors = hybrid
    assert len(trace.header["kv_cache_groups"]) == 2
    state = state_at(trace, cursors[0]).state
    labels = [view.group_label(state, g) for g in range(2)]
    assert sorted(labels) == sorted([f"group {g} · sliding window {WINDOW}" if k["kind"] == "sliding_window"
                                     else f"group {g} · full attention" for g, k in enumerate(trace.header["kv_cache_groups"])])
    expected = expected_tables(state)
    nulls = 0
    for row in view.tables(state, limit=None):
        got = [(row.label, row.blocks, row.skipped)] + [(g.label, g.blocks, g.skipped) for g in row.groups]
        for (label, blocks, skipped), (want_label, slots) in zip(got, expected[row.seq], strict=True):
            assert label == want_label
            assert [i for i, slot in enumerate(slots) if slot == "null"] == skipped
            assert [(d, n) for d, n, _, _ in blocks] == [("gpu", 0) if s == "null" else s for s in slots]
            nulls += len(skipped)
    assert nulls  # the cursor shows a freed window slot
    frame = view.snapshot(state)
    assert [g["label"] for g in frame["kv_cache_groups"]] == labels
    gpu = frame["pools"]["gpu"]
    assert gpu["group"] == [b.group if b.state != NULL and (b.ref_count or b.block_hash is not None) else -1
                            for b in state.pools["gpu"]]
    one = Timeline.for_trace(load_trace("v1-story"))
    one.seek(len(one))
    plain = view.snapshot(one.state)
    assert "kv_cache_groups" not in plain and "group" not in plain["pools"]["gpu"]
    assert all(not row["label"] and not row["groups"] for row in plain["tables"])


def test_memory_and_explain_records_carry_the_groups(hybrid):
    trace, cursors = hybrid
    timeline = state_at(trace, cursors[-1])
    state = timeline.state
    insights = Insights.for_header(trace.header)
    insights.sync(timeline)
    record = memory_record(insights, state, timeline.position)
    used = [sum(1 for b in state.pools["gpu"] if b.state == "used" and b.group == g) for g in range(2)]
    assert [(g.label, g.used_blocks) for g in record.groups] == [(view.group_label(state, g), used[g]) for g in range(2)]
    assert [g.null_slots for g in record.groups] == [sum(t.count(("gpu", 0)) for t in state.tables_of(g).values())
                                                     for g in range(2)]
    text = drawn_text(render_memory(record, timeline.position))
    for g in record.groups:
        assert g.label in text
    explained = explain_record(insights, timeline.position, events=timeline.events)
    lookup = insights.explanations(timeline.position)[-1]
    assert [row.detail for row in explained.blocks] == [b.detail for b in lookup.blocks]


def drawn_text(renderable) -> str:
    import io

    from rich.console import Console

    console = Console(width=400, record=True, file=io.StringIO())
    console.print(renderable)
    return console.export_text()


@pytest.mark.anyio
async def test_the_tui_draws_each_group_the_freed_window_slot_and_the_group_marks(hybrid):
    trace, cursors = hybrid
    app = BlockvizApp(trace=trace, deterministic=True, play=False, source_name="hybrid")
    async with app.run_test(size=(120, 40)) as pilot:
        position = cursors[len(cursors) // 2]
        app.player.timeline.seek(position)
        app.render_views()
        await pilot.pause()
        state = app.player.timeline.state
        lines = drawn(app.query_one(BlockTables))
        width = len(str(len(state.pools["gpu"]) - 1))
        nulls = 0
        for seq_id, groups in expected_tables(state).items():
            start = next(i for i, line in enumerate(lines) if f" {RequestNames(state)((seq_id,))} · " in line)
            for g, (label, slots) in enumerate(groups):
                at = next(i for i in range(start, len(lines)) if lines[i].strip() == f"{group_mark(g)} {label}")
                block_lines = [line.strip() for line in lines[at + 1:] if line.strip().startswith("L")][:len(slots)]
                for index, (slot, line) in enumerate(zip(slots, block_lines, strict=True)):
                    if slot == "null":
                        assert line == f"L{index:<2} → {view.WINDOW_SLOT_NOTE}"
                        nulls += 1
                    else:
                        assert line.startswith(f"L{index:<2} → {slot[0]} {slot[1]:<{width}}")
                start = at + 1
        assert nulls
        gpu = app.query_one("#gpu", PoolGrid)
        assert gpu.border_subtitle.endswith(GROUP_LEGEND)
        digits = gpu.digits
        used = [b for b in state.pools["gpu"] if b.state == "used"]
        assert {b.group for b in used} == {0, 1}
        for block in state.pools["gpu"]:
            mark = gpu.cell_text(block.number)[digits]
            if block.state == "used":
                assert mark == (group_mark(block.group) if block.ref_count < 2 else ref_mark(block.ref_count))
            elif view.block_state(block) == "cached":  # still its group's in the prefix cache
                assert mark == group_mark(block.group)
            else:
                assert mark not in "₀₁"
        for block in used[:2] + used[-1:]:
            app.selection = ("gpu", block.number)
            app.render_views()
            await pilot.pause()
            inspector = drawn(app.query_one(BlockInspector))
            assert any("KV group" in line and view.group_label(state, block.group) in line for line in inspector)


def test_the_svg_draws_each_group_the_freed_window_slot_and_the_group_badges(hybrid, tmp_path):
    trace, cursors = hybrid
    viz = Visualizer.from_trace(trace)
    landed = [p for p in cursors if Timeline.for_trace(trace).landing(p) == p]  # cursors a picture lands on
    assert landed
    for position in (landed[0], landed[-1]):
        path = viz.save(tmp_path / f"{position}.svg", at=position)
        reference = Timeline.for_trace(trace)
        reference.seek(reference.landing(position))
        state = reference.state
        root = ET.parse(path).getroot()
        for g in root.iter(f"{SVG}g"):
            if g.get("class") == "block" and g.get("data-device") == "gpu":
                block = state.pools["gpu"][int(g.get("data-block"))]
                shown = block.group if block.state != NULL and (block.ref_count or block.block_hash is not None) else -1
                assert int(g.get("data-group")) == shown
        tables = {int(g.get("data-seq")): g for g in root.iter(f"{SVG}g") if g.get("class") == "table"}
        nulls = 0
        for seq_id, groups in expected_tables(state).items():
            if seq_id not in tables:
                continue
            sections = [g for g in tables[seq_id] if g.get("class") == "group-table"]
            assert [int(s.get("data-group")) for s in sections] == list(range(len(groups)))
            for section, (label, slots) in zip(sections, groups):
                assert any(t.text == label for t in section.iter(f"{SVG}text"))
                boxes = [g for g in section if g.get("class") == "lblock"]
                assert ["null" if b.get("data-null") else ("gpu", int(b.get("data-block"))) for b in boxes] == slots
                nulls += slots.count("null")
        assert nulls
        legend = [t.text for g in root.iter(f"{SVG}g") if g.get("class") == "legend groups" for t in g.iter(f"{SVG}text")]
        assert legend == [view.group_label(state, g) for g in range(2)]
    viz.close()

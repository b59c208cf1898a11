"""One view model: the TUI and the notebook draw the same records (blockviz/model/view.py), computed
once from the reducer state at a cursor. At several cursors of every shipped trace, the notebook's
frame holds exactly the records, and the TUI's panels show each of them: every block table row,
every hash-chain row, the inspector's fields, every pool cell and every log line."""

from __future__ import annotations

import io

import pytest
from rich.console import Console

from blockviz.jupyter import Visualizer
from blockviz.model import view
from blockviz.model.names import RequestNames
from blockviz.model.palette import fill_glyph, group_mark, ref_mark
from blockviz.model.trace import kv_geometry, load_trace, shipped_traces
from blockviz.tui.app import BlockvizApp
from blockviz.tui.widgets.event_log import EventLog
from blockviz.tui.widgets.panels import BlockInspector, BlockTables, HashChains
from blockviz.tui.widgets.pool_grid import NULL_MARK, PoolGrid


@pytest.fixture
def anyio_backend():
    return "asyncio"


def cursors(length: int) -> list[int]:
    return sorted({0, 1, length // 4, length // 2, 3 * length // 4, length})


def drawn(panel) -> list[str]:
    """A panel's body as plain lines, drawn wide enough that nothing wraps."""
    console = Console(width=400, record=True, file=io.StringIO())
    console.print(panel.body.content)
    return [line.rstrip() for line in console.export_text().splitlines()]


def has_line(lines: list[str], *parts: str) -> bool:
    return any(all(part in line for part in parts) for line in lines)


def check_tui(app, state, vocab, current) -> None:
    width = len(str(len(state.pools["gpu"]) - 1))
    tables = drawn(app.query_one(BlockTables))
    for row in view.tables(state, limit=None, vocab=vocab):
        assert row.name.startswith(f"request {row.request}")
        assert has_line(tables, f" {row.name} · {row.status}")
        for group in [(row.blocks, row.skipped)] + [(g.blocks, g.skipped) for g in row.groups]:
            blocks, skipped = group
            for index, (device, number, ref, texts) in enumerate(blocks):
                if index in skipped:  # a slot a window let go: the null block, drawn as such
                    assert has_line(tables, f"L{index:<2} → ∅ null block"), (row.seq, index)
                    continue
                cell = f"L{index:<2} → {device} {number:<{width}}" + (f" ×{ref}" if ref > 1 else "   ")
                assert has_line(tables, cell + " " + "".join(texts)), (row.seq, index)
    chains = drawn(app.query_one(HashChains))
    rows = view.hash_chains(state, limit=None, current=current, vocab=vocab)
    if rows:
        lines = chains[1:]  # after the summary line, one line per row, in order
        assert len(lines) == len(rows)
        for line, row in zip(lines, rows):
            assert f"#{row.hash}" in line and f"gpu {row.block}" in line and "".join(row.tokens) in line
            assert (f"HIT×{row.hits}" in line) == bool(row.hits)
    else:
        assert chains[0].startswith("no hashed blocks")
    for device in state.pools:
        grid = app.query_one(f"#{device}", PoolGrid)
        for number, block in enumerate(state.pools[device]):
            cell = view.block_cell(block)
            text = grid.cell_text(number)
            if grid.big_cells:  # two lines: number and refs, then a fill bar
                top, bar = text.split("\n")
                ref = f"×{cell.ref}" if cell.ref > 1 else {"cached": " c", "null": f" {NULL_MARK}"}.get(cell.state, "  ")
                group = view.block_group(block) if view.has_groups(state) else -1
                notch = group_mark(group) if group >= 0 else ""  # a run with groups: the group's mark, at the right
                assert top.rstrip().removesuffix(notch).rstrip() == f" {number:>{grid.digits}}{ref}".rstrip(), (
                    device, number, cell)
                assert top.endswith(notch), (device, number, cell)
                if cell.state == "null":  # vLLM v1's block 0 says what it is
                    assert bar.rstrip() == "null", (device, number, cell)
                    continue
                filled = max(1, round(len(bar) * cell.fill / state.block_size)) if cell.fill else 0
                assert bar == "█" * filled + "░" * (len(bar) - filled), (device, number, cell)
                continue
            mark = {"used": ref_mark(cell.ref) or " ", "cached": "c", "free": " ",
                    "null": NULL_MARK}
            group = view.block_group(block) if view.has_groups(state) else -1
            if group >= 0:  # a run with groups: a used or cached block's mark is its group's (its refs where shared)
                mark = {**mark, cell.state: group_mark(group) if cell.ref < 2 else ref_mark(cell.ref)}
            glyph = fill_glyph(cell.fill, state.block_size) if cell.state in ("used", "cached") else " "
            assert text == f"{number:>{grid.digits}}{mark[cell.state]}{glyph}", (device, number, cell)


def check_inspector(app, state, vocab, geometry: str) -> None:
    used = [b for b in state.pools["gpu"] if view.block_state(b) not in ("free", "null")]
    if not used:
        return
    block = used[len(used) // 2]
    app.selection = ("gpu", block.number)
    app.render_views()
    info = view.inspect_block(state, "gpu", block.number, vocab, geometry)
    lines = drawn(app.query_one(BlockInspector))
    title = str(app.query_one("#title").content)
    assert geometry and title.endswith(f"a block: {geometry}")  # the TUI's header line, from the run's header
    assert has_line(lines, "state", view.STATE_LABELS[info.state])
    assert has_line(lines, "ref count", str(info.ref))
    assert has_line(lines, "fill", f"{info.fill}/{info.block_size} slots")
    assert has_line(lines, "tokens", "".join(info.tokens))
    if info.hash:
        assert has_line(lines, "hash", f"#{info.hash}")
    if info.same_kv:
        assert has_line(lines, ", ".join(info.same_kv))
    if info.queue is not None:  # vLLM v1: a free block's place in the free queue
        assert has_line(lines, "free queue", info.queue)


def check_notebook(viz, state, vocab, current, position) -> None:
    frame = viz.frame()
    assert frame["tables"] == [row.to_json() for row in view.tables(state, vocab=vocab)]
    assert frame["hashes"] == [row.to_json() for row in view.hash_chains(state, current=current, vocab=vocab)]
    assert frame["hash_summary"] == view.hash_summary(state).to_json()
    for device, pool in state.pools.items():
        columns = view.pool_columns(pool)
        assert {key: frame["pools"][device][key] for key in columns} == columns
        assert (frame["pools"][device]["used"], frame["pools"][device]["cached"],
                frame["pools"][device]["free"]) == view.pool_counts(state)[device]
    assert frame["log"]["rows"] == view.event_log(viz.events, position, vocab=vocab, names=RequestNames(state))


@pytest.mark.anyio
@pytest.mark.parametrize("name", shipped_traces())
async def test_the_tui_and_the_notebook_draw_the_same_records(name):
    trace = load_trace(name)
    app = BlockvizApp(trace=trace, deterministic=True, play=False, source_name=name)
    viz = Visualizer.from_trace(trace)
    try:
        async with app.run_test(size=(400, 120)) as pilot:
            timeline = app.player.timeline
            for position in cursors(len(trace.events)):
                position = timeline.landing(position)  # the slider's landing (operations drawn whole)
                timeline.seek(position)
                app.selection = None
                app.render_views()
                await pilot.pause()
                viz.seek(position)
                state, vocab, current = timeline.state, timeline.token_texts, timeline.current_event
                check_tui(app, state, vocab, current)
                log = app.query_one(EventLog).lines()
                rows = view.event_log(timeline.events, position, vocab=vocab, limit=len(trace.events) + 1,
                                      names=RequestNames(state))
                assert log == [f"{number:>6} {words}" for number, _, words in rows]
                check_notebook(viz, state, vocab, current, position)
                check_inspector(app, state, vocab, kv_geometry(trace.header))
    finally:
        viz.close()


def test_a_long_hash_chain_runs_straight_down_and_a_branch_indents():
    trace = load_trace("prefix-hit")
    from blockviz.model.timeline import Timeline

    timeline = Timeline.for_trace(trace)
    timeline.seek(len(timeline))
    rows = view.hash_chains(timeline.state, limit=None)
    by_block = {row.block: row for row in rows}
    for row in rows:
        parent = next((r for r in rows if r.hash == row.parent), None)
        if parent is None:
            continue
        siblings = [r for r in rows if r.parent == row.parent]
        # a branch's children are marked ├ / └ at their parent's indent and what follows them goes
        # one deeper; a lone child stays at its parent's indent
        assert bool(row.branch) == (len(siblings) > 1)
        assert row.depth == parent.depth + (1 if parent.branch else 0)
    assert any(row.branch for row in rows) and max(row.depth for row in rows) == 1  # prefix-hit branches once
    assert by_block

"""Pools of any size (issue 37 item 5): a 200,000-block pool drawn zoomed out in the model's
records, the SVG export and the TUI, each checked against the reducer at a few cells and blocks;
zoomed into a range, the exact blocks. The notebook's page: test_big_pool_browser.py."""

from __future__ import annotations

import re

import pytest

from big_pool_fixtures import (CACHED_BLOCKS, NUM_GPU_BLOCKS, SEQ_BLOCKS, TRACE_GPU_BLOCKS, big_pool_trace, reducer_counts,
                               used_share_eighths, write_big_pool_trace)
from blockviz.cli import main
from blockviz.model.palette import FILL_GLYPHS
from blockviz.model.pool_zoom import (MAX_BLOCK_CELLS, MAX_ZOOM_CELLS, ZoomCells, cell_counts, parse_block_range,
                                      zoom_cells, zoom_level)
from blockviz.model.svg import MAX_POOL_CELLS, frame_svg
from blockviz.model.timeline import Timeline
from blockviz.model.view import STATE_CODES, block_state, snapshot


@pytest.fixture(scope="module")
def timeline() -> Timeline:
    timeline = Timeline.for_trace(big_pool_trace())
    timeline.seek(len(timeline))
    return timeline


def interesting_cells(cells: ZoomCells) -> list[int]:
    """The cells of the fixture's blocks: all used, part used, mixed with cached, the last (partial) one."""
    return sorted({cells.cell_of(n) for n in (0, 299, 100_000, 100_015, NUM_GPU_BLOCKS - 1)} | {5})


# ---------------------------------------------------------------------------------------- the model


def test_zoom_level_keeps_small_pools_one_cell_a_block_and_draws_big_ones_in_at_most_max_cells():
    assert zoom_level(64) == zoom_level(MAX_BLOCK_CELLS) == 1
    for n in (MAX_BLOCK_CELLS + 1, 200_000, 10**7):
        per_cell = zoom_level(n)
        assert per_cell & (per_cell - 1) == 0 and per_cell > 1  # a power of two
        assert -(-n // per_cell) <= MAX_ZOOM_CELLS < -(-n // (per_cell // 2))  # the smallest that fits


def test_each_cells_counts_are_the_reducers_states_of_the_blocks_it_covers(timeline):
    pool = timeline.state.pools["gpu"]
    cells = zoom_cells(timeline.state, "gpu")
    assert cells.per_cell == 256 and cells.num_cells == -(-NUM_GPU_BLOCKS // 256)
    assert timeline.state.block_codes("gpu") == "".join(STATE_CODES[block_state(b)] for b in pool)
    for cell in interesting_cells(cells):
        blocks = cells.blocks_of(cell)
        assert (cells.used[cell], cells.cached[cell], cells.free[cell], cells.null[cell]) == reducer_counts(pool, blocks)
        assert cells.look(cell)[0] == used_share_eighths(pool, blocks)
    assert cells.look(0) == (8, "free") and cells.used[0] == 256  # all used
    assert cells.look(cells.cell_of(299)) == (1, "free")  # 44 of 256 used: one eighth
    mixed = cells.cell_of(100_000)
    assert (cells.used[mixed], cells.cached[mixed]) == (8, 8) and cells.look(mixed)[1] == "free"
    assert len(cells.blocks_of(cells.num_cells - 1)) == NUM_GPU_BLOCKS - 781 * 256  # the last cell is partial
    assert sum(cells.used) == sum(len(b) for b in SEQ_BLOCKS.values()) - len(CACHED_BLOCKS)
    assert sum(cells.cached) == len(CACHED_BLOCKS)


def test_a_cell_is_on_cached_ground_when_more_of_the_rest_are_cached_than_free():
    cells = cell_counts("uccf" + "ffff", 10, 4)
    assert cells.look(0) == (2, "cached") and cells.look(1) == (0, "free")
    assert cells.codes() == "cf" and list(cells.blocks_of(1)) == [14, 15, 16, 17]
    assert cells.cell_of(13) == 0 and cells.cell_of(18) is None and cells.cell_of(9) is None


def test_block_ranges_parse_one_line_errors():
    assert parse_block_range("100-199", 1000) == (100, 200)
    assert parse_block_range("900-5000", 1000) == (900, 1000)  # clipped to the pool
    for text, words in (("12", "START-END"), ("a-b", "START-END"), ("9-3", "before the start"),
                        ("1000-1200", "not in a pool of 1,000 blocks")):
        with pytest.raises(ValueError, match=words):
            parse_block_range(text, 1000)


def test_the_snapshot_sends_a_big_pool_as_cell_counts_and_a_range_as_exact_blocks(timeline):
    state = timeline.state
    frame = snapshot(state)
    gpu = frame["pools"]["gpu"]
    assert gpu["n"] == NUM_GPU_BLOCKS and gpu["per_cell"] == 256 and "ref" not in gpu
    assert len(gpu["state"]) == len(gpu["cells"]["used"]) <= MAX_ZOOM_CELLS
    assert (gpu["used"], gpu["cached"]) == (sum(gpu["cells"]["used"]), len(CACHED_BLOCKS))
    assert "start" not in frame["pools"]["cpu"]  # a small pool: one column entry a block
    ranged = snapshot(state, ranges={"gpu": (99_990, 100_020)})["pools"]["gpu"]
    assert (ranged["start"], ranged["stop"], ranged["per_cell"]) == (99_990, 100_020, 1)
    pool = state.pools["gpu"]
    assert ranged["state"] == "".join(STATE_CODES[block_state(pool[n])] for n in range(99_990, 100_020))
    assert ranged["ref"] == [pool[n].ref_count for n in range(99_990, 100_020)]


# ---------------------------------------------------------------------------------------- SVG


def _svg_cells(svg: str) -> dict[int, dict[str, int]]:
    return {int(m["first"]): {k: int(m[k]) for k in ("last", "used", "cached", "free", "null")} for m in re.finditer(
        r'<g class="cell" data-device="gpu" data-first="(?P<first>\d+)" data-last="(?P<last>\d+)" '
        r'data-used="(?P<used>\d+)" data-cached="(?P<cached>\d+)" data-free="(?P<free>\d+)" data-null="(?P<null>\d+)"', svg)}


def test_an_svg_draws_the_whole_200000_block_pool_zoomed_out_as_the_reducer_has_it(timeline):
    svg = frame_svg(snapshot(timeline.state, selected=("gpu", 100_003)))
    pool = timeline.state.pools["gpu"]
    cells = _svg_cells(svg)
    assert 'data-per-cell="256"' in svg and "1 cell = 256 blocks" in svg and len(cells) == 782 <= MAX_POOL_CELLS
    assert min(cells) == 0 and cells[max(cells)]["last"] == NUM_GPU_BLOCKS - 1
    for first in (0, 256, 99_840, 199_936):
        cell = cells[first]
        assert (cell["used"], cell["cached"], cell["free"], cell["null"]) == reducer_counts(pool, range(first, cell["last"] + 1))
    marked = re.findall(r'data-first="(\d+)"(?:(?!</g>).)*<rect class="mark"[^>]*stroke="([^"]+)"', svg)
    assert marked == [("99840", "#ff3b3b")]  # only the selected block's cell is outlined, in the selected colour
    assert svg.count('class="block"') == 0  # no block drawn one by one: the pool is the cells


def test_export_blocks_draws_a_range_of_exact_blocks_equal_to_the_reducer(tmp_path, timeline):
    trace = write_big_pool_trace(tmp_path / "big.jsonl", TRACE_GPU_BLOCKS)
    out = tmp_path / "range.svg"
    assert main(["export", str(trace), "--blocks", "99990-100020", "--out", str(out)]) == 0
    svg = out.read_text()
    pool = timeline.state.pools["gpu"]
    blocks = dict(re.findall(r'<g class="block" data-device="gpu" data-block="(\d+)" data-state="(\w+)"', svg))
    assert sorted(map(int, blocks)) == list(range(99_990, 100_021))
    assert all(blocks[str(n)] == block_state(pool[n]) for n in range(99_990, 100_021))
    assert blocks["100000"] == "cached" and blocks["100010"] == "used" and blocks["99990"] == "free"
    assert "blocks 99990-100020" in svg and ">100003<" in svg  # numbered as in the pool


def test_export_blocks_refuses_a_range_outside_the_pool_in_one_line(tmp_path, capsys):
    trace = write_big_pool_trace(tmp_path / "big.jsonl", TRACE_GPU_BLOCKS)
    code = main(["export", str(trace), "--blocks", "140000-150000", "--out", str(tmp_path / "x.svg")])
    err = capsys.readouterr().err
    assert code == 2 and len(err.strip().splitlines()) == 1 and "--blocks: " in err and "not in a pool of 131,000 blocks" in err
    assert not (tmp_path / "x.svg").exists()


# ---------------------------------------------------------------------------------------- TUI (Pilot)

@pytest.fixture
def anyio_backend():
    return "asyncio"


def _row_text(grid, row: int) -> str:
    return "".join(segment.text for segment in grid._build_row(row)[0])


@pytest.mark.anyio
async def test_the_tui_draws_a_200000_block_pool_zoomed_out_and_zooms_into_exact_blocks():
    from blockviz.tui.app import BlockvizApp
    from blockviz.tui.widgets.pool_grid import PoolGrid

    app = BlockvizApp(trace=big_pool_trace(), deterministic=True, source_name="test")
    async with app.run_test(size=(100, 40)) as pilot:
        await pilot.press("G")  # to the end: every block placed
        await pilot.pause()
        grid = app.query_one("#gpu", PoolGrid)
        state = app.player.timeline.state
        pool = state.pools["gpu"]
        cells = grid.cells
        assert grid.per_cell == 256 and cells.num_cells == 782
        assert "1 cell = 256 blocks" in grid.border_subtitle
        for cell in interesting_cells(cells):  # the counts, and the glyph drawn, are the reducer's
            blocks = cells.blocks_of(cell)
            assert (cells.used[cell], cells.cached[cell], cells.free[cell], cells.null[cell]) == reducer_counts(pool, blocks)
            row, column = divmod(cell, grid.columns)
            assert _row_text(grid, row)[column] == FILL_GLYPHS[used_share_eighths(pool, blocks)]
        grid.focus()
        await pilot.click("#gpu", offset=(1 + cells.cell_of(100_000) % grid.columns, 1 + cells.cell_of(100_000) // grid.columns))
        await pilot.pause()
        assert app.selection == ("gpu", 99_840)  # a cell selects its first block: the inspector names it
        await pilot.press("z")
        await pilot.pause()
        assert grid.per_cell == 1 and grid.block_range == (99_840, 100_096)
        assert "of 99840-100095 · Z whole pool" in grid.border_subtitle
        for number in (99_840, 100_000, 100_010, 100_095):  # exact blocks, as the reducer has them
            text = grid.cell_text(number)
            assert text[:6] == f"{number:>6}"  # the block's own number
            mark = {"cached": "c", "used": " ", "free": " "}[block_state(pool[number])]
            assert text[6] == mark and (text[7] == " ") == (block_state(pool[number]) == "free")
        await pilot.press("end")
        assert app.selection == ("gpu", 100_095)  # the range's last block
        grid.select(100_000)
        await pilot.pause()
        assert app.selection == ("gpu", 100_000)
        assert "Block inspector · gpu 100000" in "\n".join(
            "".join(s.text for s in strip) for strip in app.screen._compositor.render_strips())
        await pilot.press("Z")
        await pilot.pause()
        assert grid.per_cell == 256 and grid.block_range == (0, NUM_GPU_BLOCKS)

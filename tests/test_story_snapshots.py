"""The story's key moments at 80x24 and 200x60 (issue 28 item 4, issue 39): guided replays of the shipped
traces stopped on each card of both stories (v0: the fork, the copy-on-write, the prefix hit, the swap
out and in, the eviction; v1: the chunked prefill, n=2 through the cache, recompute, eviction);
SVG snapshots (pytest-textual-snapshot), and a scan of the screen text: no block-table row is split
across lines, the header fits, the narration is whole.

Deterministic: shipped traces, `deterministic=True` (no tokens/s), no clock. Update with
`pytest --snapshot-update` after a deliberate change to the look, and review the SVGs.
"""

from __future__ import annotations

import re

import pytest

from blockviz.model.player import SPEEDS
from blockviz.model.trace import load_trace
from blockviz.tui.app import CARD_FOCUS_ROWS, BlockvizApp
from blockviz.tui.widgets.panels import BlockTables, StatusBar, TitleBar
from blockviz.tui.widgets.pool_grid import PoolGrid
from test_tui_app import _until, anyio_backend, screen_text  # noqa: F401 (anyio_backend: the fixture)

# (trace, presses of ] from the start at least, the idea whose card it stops on)
MOMENTS = {"fork": ("fork-cow", 1, "forking"), "copy-on-write": ("fork-cow", 2, "copy-on-write"),
           "hit": ("prefix-hit", 1, "prefix-hit"), "swap": ("swap", 1, "swap-out"), "swap-in": ("swap", 2, "swap-in"),
           "eviction": ("eviction", 1, "eviction"),
           # vLLM v1's story, card by card (issue 39 item 6)
           "v1-chunk": ("v1-story", 1, "chunked-prefill"), "v1-n2": ("v1-story", 2, "prefix-hit"),
           "v1-recompute": ("v1-story", 3, "recompute"), "v1-eviction": ("v1-story", 4, "eviction")}
SIZES = [(80, 24), (200, 60)]
# What a block-table line starts with: a sequence's head, its placement, a logical block, or none
TABLE_ROW = re.compile(r"^(\s*$|[ ▶] (request \S+|seq \d+) |    blocks |    no blocks|    prefill \d|    \d+/\d+ computed|[ ◀] L\d)")


def moment_app(name: str) -> BlockvizApp:
    trace, _, _ = MOMENTS[name]
    return BlockvizApp(trace=load_trace(trace), deterministic=True, play=False, guided=True,
                       source_name=f"{trace}.jsonl")


def _to_moment(name: str):
    async def run_before(pilot) -> None:
        app = pilot.app
        speed, app.player.speed_index = app.player.speed_index, len(SPEEDS) - 1  # the stops, not the pace
        for _ in range(MOMENTS[name][1] + 8):  # guided, ] plays to the next card: on to the idea's card
            await pilot.press("right_square_bracket")
            await _until(pilot, lambda: not app.player.playing, timeout=30)
            if app.player.card is not None and MOMENTS[name][2] in app.player.card.ideas:
                break
        app.player.speed_index = speed
        app.render_views()
        card = app.player.card
        assert card is not None and MOMENTS[name][2] in card.ideas
        # the views have drawn the card and asked the pools to scroll to its blocks; the scroll runs
        # after the next refresh (a slow machine must not photograph the screen before it)
        grids = app.query(PoolGrid)
        await _until(pilot, lambda: all(g.brought_into_view == card.blocks_on(g.device) for g in grids), timeout=30)
        await pilot.pause()
        await pilot.pause()

    return run_before


@pytest.mark.parametrize("size", SIZES, ids=lambda size: f"{size[0]}x{size[1]}")
@pytest.mark.parametrize("name", sorted(MOMENTS))
def test_the_story_moment_snapshot(snap_compare, name, size):
    assert snap_compare(moment_app(name), run_before=_to_moment(name), terminal_size=size)


def panel_lines(app, widget) -> list[str]:
    """The lines a bordered panel shows inside its border."""
    region = widget.region
    lines = screen_text(app).splitlines()[region.y + 1:region.y + region.height - 1]
    return [line[region.x + 1:region.x + region.width - 1] for line in lines]


@pytest.mark.anyio
@pytest.mark.parametrize("size", SIZES, ids=lambda size: f"{size[0]}x{size[1]}")
@pytest.mark.parametrize("name", sorted(MOMENTS))
async def test_no_line_wraps_into_another_row_at_the_story_moments(name, size):
    app = moment_app(name)
    async with app.run_test(size=size) as pilot:
        await _to_moment(name)(pilot)
        for step in range(6):  # the moment, then on through finished rows
            tables = app.query_one(BlockTables)
            rows = panel_lines(app, tables)
            assert rows and all(TABLE_ROW.match(row) for row in rows), rows
            title = screen_text(app).splitlines()[0].strip()
            full = str(app.query_one(TitleBar).content)
            assert full.startswith(title) and (title == full or full[len(title):].startswith(" · "))
            status = app.query_one(StatusBar)
            if app.player.card is not None and size[1] < CARD_FOCUS_ROWS:  # the card says what happened
                assert status.region.height == 1
            else:
                said = " ".join(line.strip() for line in screen_text(app).splitlines()[
                    status.region.y + 2:status.region.y + status.region.height])
                assert said == f"▸ {status.narration}" or len(said) > 3 * (size[0] - 2) - 5
            # ten engine steps on: nine straight on the player (no screen between them is checked),
            # the tenth by its key, so the key's path and the redraw it makes are what is checked next
            for _ in range(9):
                app.player.step_engine()
            await pilot.press("s")
            await pilot.pause()

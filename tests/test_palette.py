"""Block-state colours come from one table (palette.BLOCK_COLOURS): the TUI's styles, the notebook's
palette (which its canvas and CSS read on the page) and the SVG export use it, and the page's static
files write none of its colours themselves."""

from __future__ import annotations

import re

from rich.color import Color

from blockviz.jupyter.widgets import CSS, PALETTE, PROJECTOR_PALETTE, STATIC
from blockviz.model import svg, view
from blockviz.model.timeline import Timeline
from blockviz.model.trace import load_trace
from blockviz.model.palette import BLOCK_COLOURS
from blockviz.tui import styles
from blockviz.tui.widgets import pool_grid


def colours(table) -> set[str]:
    return {c for value in table.values() for c in ([value] if isinstance(value, str) else value.values())}


def test_the_page_reads_the_block_colours_from_the_palette_it_is_sent():
    assert PALETTE["blocks"] is BLOCK_COLOURS and PROJECTOR_PALETTE["blocks"] is BLOCK_COLOURS
    written = {re.sub(r"^#(.)(.)(.)$", r"#\1\1\2\2\3\3", c.lower()) for path in (*STATIC.glob("*.js"), CSS)
               for c in re.findall(r"#[0-9a-fA-F]{6}\b|#[0-9a-fA-F]{3}\b", path.read_text(encoding="utf-8"))}
    state_only = colours(BLOCK_COLOURS) - {BLOCK_COLOURS["touched"], BLOCK_COLOURS["selected"], "#000000"}
    assert not written & state_only, written & state_only  # yellow / red / black also mean other things there
    css = CSS.read_text(encoding="utf-8")
    for variable in ("--bv-border", "--bv-cached", "--bv-null", "--bv-text-free", "--bv-bar-cached", "--bv-head"):
        assert f"var({variable})" in css


def test_the_tui_and_the_svg_draw_the_tables_colours():
    assert styles.CACHED_STYLE.bgcolor == Color.parse(BLOCK_COLOURS["cached"])
    assert styles.CACHED_STYLE.color == Color.parse(BLOCK_COLOURS["text"]["cached"])
    assert styles.NULL_STYLE.bgcolor == Color.parse(BLOCK_COLOURS["null"])
    assert styles.FREE_STYLE.color == Color.parse(BLOCK_COLOURS["text"]["free"])
    assert styles.QUEUE_HEAD_STYLE.color == Color.parse(BLOCK_COLOURS["head"])
    assert pool_grid.FILL_GROUND == BLOCK_COLOURS["bar"]["used"]
    timeline = Timeline.for_trace(load_trace("v1-story"))
    timeline.seek(len(timeline))
    frame = view.snapshot(timeline.state, selected=("gpu", 0))
    assert frame["pools"]["gpu"]["state"].startswith("n") and "c" in frame["pools"]["gpu"]["state"]
    picture = svg.frame_svg(frame)
    for colour in (BLOCK_COLOURS["null"], BLOCK_COLOURS["cached"], BLOCK_COLOURS["border"], BLOCK_COLOURS["selected"],
                   BLOCK_COLOURS["text"]["null"], BLOCK_COLOURS["bar"]["cached"]):
        assert colour in picture, colour

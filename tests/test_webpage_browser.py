"""An exported page (`blockviz export TRACE --html`) in chromium, opened from a file URL with every
other request refused: for every shipped trace, at every card stop and at 20 seeded random landings
of the slider it draws what the notebook's Visualizer draws there (the pools' cells against the
reducer state, the block tables, the card and the log against Visualizer.frame()), and its controls
move the cursor where the Visualizer's do (one engine step, one event, guided play stopping at the
next card). The pages are the site's (tests/site_fixtures.py: built once, shared with
tests/test_site_browser.py)."""

from __future__ import annotations

import random

import pytest

from blockviz.cli import main
from blockviz.jupyter.visualizer import Visualizer
from blockviz.model.trace import load_trace, shipped_traces
from blockviz.model.view import block_state
from blockviz.session.scenario import is_story
from jupyter_fixtures import page_cells
from site_fixtures import SITE_GROUP, offline_page, site  # noqa: F401 (fixtures)

TRACES = shipped_traces()
NUM_RANDOM = 20

DRAWN_TABLES_JS = """() => [...document.querySelectorAll('.bv-view-tables .bv-table-row')].map((row) => [
    Number(row.dataset.seq),
    [...row.querySelectorAll('.bv-lblock')].map((b) => [b.dataset.device, Number(b.dataset.block), Number(b.dataset.ref)])])"""
DRAWN_LOG_JS = """() => [...document.querySelectorAll('.bv-view-log .bv-event')].map((e) => [e.dataset.number, e.dataset.type])"""
DRAWN_CARD_JS = """() => { const c = document.querySelector('.bv-view-controls .bv-card');
    return c.hidden ? null : [c.dataset.idea, Number(c.dataset.position), c.dataset.blocks, c.textContent]; }"""


@pytest.fixture(scope="module")
def pages(site):
    """Each shipped trace's page, as the site holds it."""
    return {name: site / f"{name}.html" for name in TRACES}


@SITE_GROUP
def test_the_sites_page_is_what_export_html_writes(pages, tmp_path):
    assert main(["export", "fork-cow", "--html", str(tmp_path / "fork-cow.html")]) == 0
    assert (tmp_path / "fork-cow.html").read_bytes() == pages["fork-cow"].read_bytes()


def open_page(page, path) -> None:
    page.goto(path.as_uri())
    page.wait_for_function("() => { const r = document.getElementById('bv-page');"
                           " return r.dataset.values === 'true' || r.dataset.error; }")
    assert page.get_attribute("#bv-page", "data-error") is None


def position(page) -> int:
    return int(page.get_attribute(".bv-view-controls", "data-position"))


def slide_to(page, target: int) -> None:
    """Drop the slider at `target`, as a person lets go of it (its change event)."""
    page.evaluate("""(p) => { const s = document.querySelector('.bv-view-controls .bv-slider');
        s.value = String(p); s.dispatchEvent(new Event('input')); s.dispatchEvent(new Event('change')); }""", target)


def expected(viz: Visualizer, at: int) -> dict:
    viz.timeline.seek(at)
    frame = viz.frame()
    cells = sorted([b.device, b.number, block_state(b), b.ref_count] for p in viz.state.pools.values() for b in p)
    tables = [[row["seq"], [[d, n, ref] for d, n, ref, _ in row["blocks"]]
               + [[d, n, ref] for g in row.get("groups", []) for d, n, ref, _ in g["blocks"]]] for row in frame["tables"]]
    card = frame["card"]
    return {"cells": cells, "tables": tables, "log": [[str(n), kind] for n, kind, _ in frame["log"]["rows"]],
            "card": None if card is None else [card["idea"], card["position"],
                                               ",".join(f"{d}:{n}" for d, n in card["blocks"])],
            "card_title": None if card is None else card["title"], "card_why": None if card is None else card["why"]}


def drawn(page) -> dict:
    card = page.evaluate(DRAWN_CARD_JS)
    return {"cells": sorted(page_cells(page)), "tables": page.evaluate(DRAWN_TABLES_JS),
            "log": page.evaluate(DRAWN_LOG_JS), "card": None if card is None else card[:3],
            "card_text": None if card is None else card[3]}


def check_at(page, viz: Visualizer, at: int) -> None:
    want, got = expected(viz, at), drawn(page)
    assert position(page) == at
    for key in ("cells", "tables", "log", "card"):
        assert got[key] == want[key], f"{key} at {at}"
    if want["card"] is not None:
        assert want["card_title"] in got["card_text"] and want["card_why"] in got["card_text"]


@SITE_GROUP
@pytest.mark.parametrize("name", TRACES)
def test_the_page_draws_what_the_notebook_draws_offline(pages, offline_page, name):
    page = offline_page
    open_page(page, pages[name])
    viz = Visualizer.from_trace(name)
    try:
        guide = viz.player.scan_guide()
        stops = [guide.stop_of(card) for card in guide.cards]
        assert stops or not is_story(load_trace(name).header), "a story has cards"
        if viz.player.guided:  # the "next idea ▸" button, card after card
            for stop in stops:
                if stop == position(page):  # the opening card, at 0: there before any click
                    check_at(page, viz, stop)
                    continue
                page.click(".bv-view-controls button[data-action='next_card']")
                page.wait_for_function("(p) => Number(document.querySelector('.bv-view-controls').dataset.position) === p",
                                       arg=stop)
                check_at(page, viz, stop)
        else:
            for stop in stops:
                slide_to(page, stop)
                check_at(page, viz, stop)
        rng = random.Random(47)
        for asked in rng.sample(range(len(viz.timeline) + 1), NUM_RANDOM):
            slide_to(page, asked)
            check_at(page, viz, viz.timeline.landing(asked))
    finally:
        viz.close()
    assert page.refused == [] and page.errors == []


@SITE_GROUP
def test_the_controls_move_as_the_visualizers_do(pages, offline_page):
    """One engine step, one event, back, and guided play at the fastest speed (it stops at the first card)."""
    page = offline_page
    open_page(page, pages["v1-story"])
    viz = Visualizer.from_trace("v1-story")
    try:
        for action, call in (("step", viz.step), ("step", viz.step), ("step_event", viz.step_event),
                             ("back", viz.back), ("back_step", lambda: viz.seek(viz.timeline.previous_step_end()))):
            page.click(f".bv-view-controls button[data-action='{action}']")
            call()
            assert position(page) == viz.position, action
            check_at(page, viz, viz.position)
        slide_to(page, 0)
        page.select_option(".bv-view-controls .bv-speed", index=len(viz.controls.speeds) - 1)
        page.click(".bv-view-controls button[data-action='play']")
        guide = viz.player.scan_guide()
        first = guide.next_stop(0, len(viz.timeline))  # the first card after the start
        page.wait_for_function("(p) => document.getElementById('bv-page').dataset.playing === 'false'"
                               " && Number(document.querySelector('.bv-view-controls').dataset.position) === p", arg=first)
        check_at(page, viz, first)
    finally:
        viz.close()
    assert page.refused == [] and page.errors == []


@SITE_GROUP
def test_a_picked_block_is_inspected_and_the_log_filters(pages, offline_page):
    page = offline_page
    open_page(page, pages["swap"])
    viz = Visualizer.from_trace("swap")
    try:
        at = viz.timeline.landing(300)
        slide_to(page, at)
        from jupyter_fixtures import click_block
        click_block(page, "gpu", 3)
        page.wait_for_function("() => document.querySelector('.bv-inspector').dataset.block === '3'")
        viz.seek(at)
        viz.select("gpu", 3)
        info = viz.frame()["inspector"]
        assert page.get_attribute(".bv-inspector", "data-state") == info["state"]
        assert page.get_attribute(".bv-inspector", "data-ref") == str(info["ref"])
        page.select_option(".bv-view-log .bv-filter", "swap & preemption")
        viz.log.filter = "swap & preemption"
        rows = [[str(n), kind] for n, kind, _ in viz.frame()["log"]["rows"]]
        assert rows and page.evaluate(DRAWN_LOG_JS) == rows
        page.click("details[data-section='ledger'] > summary")
        viz.insight.accordion.selected_index = 1
        count = viz.frame()["ledger"]["count"]
        assert page.get_attribute(".bv-ledger-totals", "data-count") == str(count)
        page.check(".bv-view-controls .bv-projector-box")
        assert page.get_attribute(".bv-view-pool", "data-projector") == "true"
    finally:
        viz.close()
    assert page.refused == [] and page.errors == []


def reducer_blocks(viz: Visualizer, at: int, device: str, start: int, stop: int) -> list[list]:
    viz.timeline.seek(at)
    return [[device, b.number, block_state(b), b.ref_count] for b in viz.timeline.state.pools[device][start:stop]]


def test_a_200000_block_pool_plays_zoomed_out_and_zooms_into_a_cell(tmp_path, offline_page):
    """The big-pool trace (tests/big_pool_fixtures.py) exports, and its page draws the GPU pool
    zoomed out: the cells' states and used counts are the frame's; a click on a cell draws its
    blocks one by one as the reducer holds them, at that position and wherever the slider goes
    next; "whole pool" zooms back out."""
    from big_pool_fixtures import CACHED_BLOCKS, big_pool_trace
    from blockviz.webpage.page import visualizer_page, write_atomic

    viz = Visualizer.from_trace(big_pool_trace())
    try:
        path = write_atomic(tmp_path / "big.html", visualizer_page(viz))
        length = len(viz.timeline)
        viz.timeline.seek(length)
        gpu = viz.frame()["pools"]["gpu"]
        page = offline_page
        open_page(page, path)
        slide_to(page, length)
        canvas = page.locator(".bv-view-pool canvas.bv-zoom-canvas[data-device='gpu']")
        assert int(canvas.get_attribute("data-per-cell")) == gpu["per_cell"] == 256
        assert canvas.get_attribute("data-states") == gpu["state"]
        assert canvas.get_attribute("data-used") == ",".join(map(str, gpu["cells"]["used"]))
        cell = CACHED_BLOCKS.start // 256  # blocks 99,840-100,095: used, cached and free ones
        centre = page.evaluate(CELL_CENTRE_JS, ["canvas.bv-zoom-canvas[data-device='gpu']", cell])
        canvas.click(position=centre)
        ranged = ".bv-view-pool canvas.bv-pool-canvas[data-device='gpu'][data-start='99840'][data-states]"
        page.wait_for_selector(ranged)
        drawn = [c for c in page_cells(page) if c[0] == "gpu"]
        assert drawn == reducer_blocks(viz, length, "gpu", 99_840, 100_096)
        assert {state for _, _, state, _ in drawn} == {"used", "cached", "free"}
        for at in (viz.timeline.landing(length // 2), 0, length):  # the zoomed range follows the cursor
            slide_to(page, at)
            page.wait_for_function("(p) => document.querySelector('.bv-view-controls').dataset.position === String(p)", arg=at)
            page.wait_for_selector(ranged)
            assert [c for c in page_cells(page) if c[0] == "gpu"] == reducer_blocks(viz, at, "gpu", 99_840, 100_096), at
        page.click(".bv-view-pool .bv-zoom-bar button.bv-zoom-out")
        page.wait_for_selector(".bv-view-pool canvas.bv-zoom-canvas[data-device='gpu'][data-cells='782']")
    finally:
        viz.close()
    assert page.refused == [] and page.errors == []


CELL_CENTRE_JS = """([sel, cell]) => {
    const canvas = document.querySelector(sel), d = canvas.dataset;
    const side = Number(d.cellWidth), pitch = side + Number(d.gap), cols = Number(d.cols), pad = Number(d.pad);
    canvas.scrollIntoView();
    return { x: pad + (cell % cols) * pitch + side / 2, y: pad + Math.floor(cell / cols) * pitch + side / 2 };
}"""


@SITE_GROUP
def test_breakpoints_by_kind_land_where_run_until_and_back_to_land(pages, offline_page):
    page = offline_page
    open_page(page, pages["swap"])
    viz = Visualizer.from_trace("swap")
    try:
        page.check(".bv-view-breaks input[data-kind='swap_out']")
        page.check(".bv-view-breaks input[data-kind='swap_in']")
        for direction, call in (("next", lambda: viz.run_until("swap_out,swap_in")),
                                ("next", lambda: viz.run_until("swap_out,swap_in")),
                                ("previous", lambda: viz.back_to("swap_out,swap_in"))):
            page.click(f".bv-view-breaks button >> text={'next ▸' if direction == 'next' else '◂ previous'}")
            event = call()
            assert event is not None and position(page) == viz.position, direction
            assert f"stopped at event {viz.position}: {event.type}" in page.inner_text(".bv-view-breaks")
            check_at(page, viz, viz.position)
    finally:
        viz.close()
    assert page.refused == [] and page.errors == []

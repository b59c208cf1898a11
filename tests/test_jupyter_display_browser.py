"""Moments, projector mode and collapsed pools in a real browser (JupyterLab + chromium).

A moment (viz.snapshot()) drawn on the page keeps the blocks of the state it froze while the live
widget above it steps on; projector mode draws bigger cells in the projector palette; a CPU pool
that was never used is one line until clicked open.

Fixtures and helpers: tests/jupyter_fixtures.py (one server per session, a fresh page per test)."""

from __future__ import annotations

from jupyter_fixtures import (
    block_pixel,
    click_and_wait,
    drawn_blocks_in,
    kernel_cells,
    kernel_json,
    open_notebook,
    pool_canvas,
    run_all_cells,
    wait_for_position,
)
from test_jupyter_browser import rgb

LIVE = ".blockviz:not(.blockviz-moment)"
MOMENT = ".blockviz-moment"


def test_a_moment_keeps_its_picture_while_the_visualizer_steps_on(jupyter_server, lab_page):
    page = lab_page
    path = jupyter_server.add_notebook("moment.ipynb", [
        "from blockviz.jupyter import Visualizer\nviz = Visualizer.from_trace('fork-cow')",
        "viz",
        "viz.run_until('copy_on_write')\nmoment = viz.snapshot()\nmoment",
        "viz.run_to_completion()\nviz.position",
    ])
    open_notebook(page, jupyter_server, path)
    run_all_cells(page)
    page.wait_for_selector(f"{MOMENT} .bv-view-moment[data-position]")
    end = kernel_json(page, "len(viz)")
    wait_for_position(page, end)
    at = kernel_json(page, "moment.position")
    assert 0 < at < end
    assert page.get_attribute(f"{MOMENT} .bv-view-moment", "data-position") == str(at)
    page.wait_for_function(f"() => document.querySelector(\"{MOMENT} canvas.bv-pool-canvas[data-device='gpu']\")"
                           ".dataset.states !== undefined")
    frozen = kernel_cells(page, "moment")
    assert drawn_blocks_in(page, MOMENT) == frozen
    assert drawn_blocks_in(page, LIVE) == kernel_cells(page)
    assert frozen != kernel_cells(page)  # the live widget moved on; the moment did not
    assert any(ref > 1 for _, _, _, ref in frozen)  # shared blocks at the copy-on-write

    for action in ("start", "step", "step"):  # the live widget's buttons leave the moment alone
        wait_for_position(page, click_and_wait(page, action))
        assert drawn_blocks_in(page, LIVE) == kernel_cells(page)
        assert drawn_blocks_in(page, MOMENT) == frozen
    assert page.locator(f"{MOMENT} .bv-view-controls").count() == 0  # no controls in a moment


def test_projector_mode_draws_big_bold_cells_and_the_unused_cpu_pool_is_one_line(jupyter_server, lab_page):
    page = lab_page
    path = jupyter_server.add_notebook("projector.ipynb", [
        "from blockviz.jupyter import Visualizer\nviz = Visualizer.from_trace('fork-cow', projector=True)\n"
        "viz.run_until('copy_on_write')",
        "viz",
    ])
    open_notebook(page, jupyter_server, path)
    run_all_cells(page)
    page.wait_for_selector(".bv-view-pool[data-projector='true'][data-zoom='2']")
    page.wait_for_selector(f"{pool_canvas('gpu')}[data-states]")
    cell_height = float(page.get_attribute(pool_canvas("gpu"), "data-cell-height"))
    assert cell_height == round(2.2 * 24)  # 2.2 em at twice the 12 px font
    colours = kernel_json(page, "viz.pools.palette['seq']")
    assert colours == kernel_json(page, "list(__import__('blockviz.model.palette', fromlist=['x']).SEQ_COLOURS_BOLD)")
    owners = kernel_json(page, "{b.number: min(b.owners) for b in viz.state.pools['gpu'] if b.owners}")
    assert owners
    for block, owner in owners.items():
        assert block_pixel(page, "gpu", int(block), 8, cell_height - 12) == [*rgb(colours[owner % len(colours)]), 255]

    cpu = ".bv-view-pool .bv-pool[data-device='cpu']"
    assert page.get_attribute(cpu, "data-collapsed") == "true"
    assert page.inner_text(f"{cpu} .bv-pool-title").startswith("CPU pool: 16 blocks, never used")
    assert page.locator(f"{cpu} .bv-grid").is_hidden()
    assert drawn_blocks_in(page, LIVE) == kernel_cells(page)  # the line stands for 16 free blocks
    page.click(f"{cpu} .bv-pool-title")  # opens it
    page.wait_for_selector(f"{cpu}[data-collapsed='false']")
    assert page.locator(f"{cpu} .bv-grid").is_visible()
    page.click(f"{cpu} .bv-pool-title")  # and closes it again
    page.wait_for_selector(f"{cpu}[data-collapsed='true']")

    page.select_option(".bv-view-controls select.bv-zoom", "1")  # the size menu: back to 100%
    page.wait_for_selector(".bv-view-pool[data-zoom='1']")
    assert kernel_json(page, "viz.zoom") == 1.0
    page.wait_for_function(f"() => document.querySelector(\"{pool_canvas('gpu')}\").dataset.cellHeight === '26'")
    page.click(".bv-view-controls input.bv-projector-box")  # projector off
    page.wait_for_selector(".bv-view-pool[data-projector='false']")
    assert kernel_json(page, "viz.projector") is False
    assert drawn_blocks_in(page, LIVE) == kernel_cells(page)


def test_the_cpu_pool_opens_while_it_holds_swapped_blocks_and_closes_after(jupyter_server, lab_page):
    page = lab_page
    path = jupyter_server.add_notebook("swap-pool.ipynb", [
        "from blockviz.jupyter import Visualizer\nviz = Visualizer.from_trace('swap')\nviz.pools.renderer = 'cells'",
        "viz",
    ])
    open_notebook(page, jupyter_server, path)
    run_all_cells(page)
    cpu = ".bv-view-pool .bv-pool[data-device='cpu']"
    page.wait_for_selector(f"{cpu}[data-collapsed='true']")
    assert page.inner_text(f"{cpu} .bv-pool-title").startswith("CPU pool: 32 blocks, never used")
    wait_for_position(page, kernel_json(page, "[viz.run_until('swap_out'), viz.position][-1]"))
    page.wait_for_selector(f"{cpu}[data-collapsed='false']")
    assert page.locator(f"{cpu} .bv-grid").is_visible()
    assert drawn_blocks_in(page, LIVE) == kernel_cells(page)
    assert any(d == "cpu" and state == "used" for d, _, state, _ in drawn_blocks_in(page, LIVE))
    wait_for_position(page, kernel_json(page, "[viz.seek(len(viz)), viz.position][-1]"))
    page.wait_for_selector(f"{cpu}[data-collapsed='true']")
    assert "all swapped back in" in page.inner_text(f"{cpu} .bv-pool-title")
    assert drawn_blocks_in(page, LIVE) == kernel_cells(page)  # the hidden cells were redrawn free

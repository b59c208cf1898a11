"""A 200,000-block pool in a real browser (issue 37 item 5): JupyterLab runs a notebook, chromium
draws the pool zoomed out (pool_canvas.js zoomGrid), and the counts it painted per cell must be
the kernel's reducer states of the blocks each cell covers; a click on a cell zooms into its
blocks, drawn one by one and equal to the reducer, where a click inspects the exact block; "whole
pool" zooms back out.

Fixtures and helpers: tests/jupyter_fixtures.py (one server per session, a fresh page per test)."""

from __future__ import annotations

from pathlib import Path

from jupyter_fixtures import click_block, kernel_json, open_notebook, page_cells, run_all_cells, wait_for_visualizer

TESTS = Path(__file__).resolve().parent
CELLS = [
    f"import sys\nsys.path.insert(0, {str(TESTS)!r})\nfrom big_pool_fixtures import big_pool_trace, reducer_counts\n"
    "from blockviz.jupyter import Visualizer\nviz = Visualizer.from_trace(big_pool_trace())\nviz.seek(len(viz))",
    "viz",
]
ZOOM_CANVAS = ".bv-view-pool canvas.bv-zoom-canvas[data-device='gpu']"
CELL_PIXEL_JS = """([sel, cell, dx, dy]) => {
    const canvas = document.querySelector(sel), d = canvas.dataset;
    const pitch = Number(d.cellWidth) + Number(d.gap), cols = Number(d.cols), pad = Number(d.pad);
    const x = pad + (cell % cols) * pitch + dx, y = pad + Math.floor(cell / cols) * pitch + dy;
    const ratio = canvas.width / canvas.clientWidth;
    return Array.from(canvas.getContext('2d').getImageData(Math.round(x * ratio), Math.round(y * ratio), 1, 1).data);
}"""
CELL_CENTRE_JS = """([sel, cell]) => {
    const canvas = document.querySelector(sel), d = canvas.dataset;
    const side = Number(d.cellWidth), pitch = side + Number(d.gap), cols = Number(d.cols), pad = Number(d.pad);
    canvas.scrollIntoView();
    return { x: pad + (cell % cols) * pitch + side / 2, y: pad + Math.floor(cell / cols) * pitch + side / 2 };
}"""


def rgb(colour: str) -> list[int]:
    return [int(colour[i:i + 2], 16) for i in (1, 3, 5)]


def test_a_200000_block_pool_is_drawn_zoomed_out_as_the_kernel_has_it_and_zooms_in(jupyter_server, lab_page):
    page = lab_page
    path = jupyter_server.add_notebook("big-pool.ipynb", CELLS)
    open_notebook(page, jupyter_server, path)
    run_all_cells(page)
    wait_for_visualizer(page)
    page.wait_for_selector(f"{ZOOM_CANVAS}[data-states][data-cells='782']")
    drawn = page.evaluate("""(sel) => { const d = document.querySelector(sel).dataset;
        return { perCell: Number(d.perCell), n: Number(d.n), states: d.states,
                 counts: ['used', 'cached', 'free', 'null'].map((k) => d[k].split(',').map(Number)) }; }""", ZOOM_CANVAS)
    assert drawn["perCell"] == 256 and drawn["n"] == 200_000 and len(drawn["states"]) == 782
    cells = [0, 1, 390, 500, 781]  # all used, part used, used + cached + free, all free, the partial last one
    kernel = kernel_json(page, f"[reducer_counts(viz.state.pools['gpu'], range(c * 256, min(c * 256 + 256, 200_000))) "
                               f"for c in {cells}]")
    assert [[drawn["counts"][k][c] for k in range(4)] for c in cells] == kernel
    assert kernel[2][:2] == [8, 8] and kernel[0][0] == 256  # the fixture's mix is what was compared
    palette = kernel_json(page, "viz.pools.palette['blocks']")
    assert page.evaluate(CELL_PIXEL_JS, [ZOOM_CANVAS, 0, 7, 7]) == [*rgb(palette["used"]), 255]  # all in use: the bar fills it
    assert page.evaluate(CELL_PIXEL_JS, [ZOOM_CANVAS, 500, 7, 7])[3] == 0  # all free: nothing painted inside

    centre = page.evaluate(CELL_CENTRE_JS, [ZOOM_CANVAS, 390])
    page.click(ZOOM_CANVAS, position=centre)  # zoom into blocks 99,840-100,095
    ranged = ".bv-view-pool canvas.bv-pool-canvas[data-device='gpu'][data-start='99840'][data-states]"
    page.wait_for_selector(ranged)
    assert kernel_json(page, "viz.pool_ranges['gpu']") == [99_840, 100_096]
    gpu = [cell for cell in page_cells(page) if cell[0] == "gpu"]
    expected = kernel_json(page, "[['gpu', b.number, __import__('blockviz.model.view', fromlist=['x']).block_state(b), "
                                 "b.ref_count] for b in viz.state.pools['gpu'][99840:100096]]")
    assert gpu == expected and {state for _, _, state, _ in gpu} == {"used", "cached", "free"}
    click_block(page, "gpu", 100_003)  # the inspector names the exact block clicked
    page.wait_for_selector(".bv-inspector[data-device='gpu'][data-block='100003'][data-state='cached']")
    assert kernel_json(page, "list(viz.selected)") == ["gpu", 100_003]

    page.click(".bv-view-pool .bv-zoom-bar button.bv-zoom-out")
    page.wait_for_selector(f"{ZOOM_CANVAS}[data-states][data-cells='782']")
    assert kernel_json(page, "viz.pool_ranges") == {}

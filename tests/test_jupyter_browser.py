"""The widgets in a real browser: JupyterLab runs a notebook, chromium clicks the controls, and the
blocks the page drew (each pool canvas's data-states / data-refs, or the cells' data-block /
data-state / data-ref) must equal the reducer state in the kernel; pixels of the canvas show the
owner's colour, the outlines, and nothing on a free block.

Fixtures and helpers: tests/jupyter_fixtures.py (one server per session, a fresh page per test)."""

from __future__ import annotations

from jupyter_fixtures import (
    block_pixel,
    click_and_wait,
    click_block,
    hover_block,
    kernel_cells,
    kernel_json,
    open_notebook,
    page_cells,
    pool_canvas,
    run_all_cells,
    wait_for_position,
    wait_for_visualizer,
)

KERNEL_STATE = "__import__('blockviz.model.view', fromlist=['x']).block_state(b)"
TRACE_CELLS = [
    "from blockviz.jupyter import Visualizer\nviz = Visualizer.from_trace('fork-cow')",
    "viz",
]


def test_step_buttons_draw_the_kernels_state_and_a_click_inspects(jupyter_server, lab_page):
    page = lab_page
    path = jupyter_server.add_notebook("widget-steps.ipynb", TRACE_CELLS)
    open_notebook(page, jupyter_server, path)
    run_all_cells(page)
    wait_for_visualizer(page, num_cells=32 + 16)
    assert page_cells(page) == kernel_cells(page)

    for action in ("step", "step", "step_event", "step", "back", "step"):
        position = click_and_wait(page, action)
        assert kernel_json(page, "viz.position") == position
        wait_for_position(page, position)
        assert page_cells(page) == kernel_cells(page)
    assert any(state == "used" for _, _, state, _ in page_cells(page))
    assert any(ref > 1 for _, _, _, ref in page_cells(page))  # fork-cow shares blocks by now

    used = [(device, number, ref) for device, number, state, ref in page_cells(page) if state == "used"]
    device, number, ref = used[-1]
    hover_block(page, device, number)
    page.wait_for_function("([sel, text]) => document.querySelector(sel).title.startsWith(text)",
                           arg=[pool_canvas(device), f"{device} block {number} · used · ref {ref} · "])
    click_block(page, device, number)
    inspector = f".bv-inspector[data-device='{device}'][data-block='{number}']"
    page.wait_for_selector(inspector)
    assert page.get_attribute(inspector, "data-ref") == str(ref)
    assert page.get_attribute(inspector, "data-state") == "used"
    assert kernel_json(page, "list(viz.selected)") == [device, number]
    page.wait_for_function("([sel, n]) => document.querySelector(sel).dataset.selected === n",
                           arg=[pool_canvas(device), str(number)])

    # what was painted: the first owner's colour inside a used cell, nothing inside a free one,
    # the selected outline on the selected cell and the touched one on the last event's cells
    colours = kernel_json(page, "viz.pools.palette['seq']")
    owners = kernel_json(page, f"{{b.number: min(b.owners) for b in viz.state.pools['gpu'] "
                               f"if {KERNEL_STATE} == 'used' and b.owners}}")
    height = float(page.get_attribute(pool_canvas("gpu"), "data-cell-height"))
    assert owners
    for block, owner in owners.items():
        assert block_pixel(page, "gpu", int(block), 6, height - 8) == [*rgb(colours[owner % len(colours)]), 255]
    free = [n for d, n, state, _ in page_cells(page) if d == "gpu" and state == "free"]
    assert free and block_pixel(page, "gpu", free[0], 6, height - 8)[3] == 0
    assert block_pixel(page, device, number, 0.5, height / 2) == [*rgb("#ff3b3b"), 255]
    touched = []
    while not touched:  # on to an event that touches a GPU block other than the selected one
        wait_for_position(page, click_and_wait(page, "step_event"))
        touched = [n for n in kernel_json(page, "viz.frame()['touched'].get('gpu', [])")
                   if (device, n) != ("gpu", number)]
    page.wait_for_function("([sel, n]) => document.querySelector(sel).dataset.touched.split(',').includes(n)",
                           arg=[pool_canvas("gpu"), str(touched[0])])
    assert block_pixel(page, "gpu", touched[0], 0.5, height / 2) == [*rgb("#ffd400"), 255]

    # the slider seeks, and the table view shows the kernel's block tables
    tables = kernel_json(page, "{str(k): [n for _, n in v] for k, v in viz.state.tables.items()}")
    for seq_id, blocks in tables.items():
        shown = page.eval_on_selector_all(f".bv-table-row[data-seq='{seq_id}'] .bv-lblock",
                                          "(nodes) => nodes.map((n) => Number(n.dataset.block))")
        assert shown == blocks
    # each table's head names its request as every panel does (blockviz.model.names)
    names = kernel_json(page, "{str(r['seq']): r['name'] for r in viz.frame()['tables']}")
    for seq_id, name in names.items():
        label = page.locator(f".bv-table-row[data-seq='{seq_id}'] .bv-table-label").first.text_content()
        assert name.startswith("request ") and label.startswith(f"{name} · ")
    assert page.locator(".bv-error").is_hidden()


def test_the_cells_renderer_draws_the_same_blocks(jupyter_server, lab_page):
    page = lab_page
    path = jupyter_server.add_notebook("widget-cells.ipynb", [TRACE_CELLS[0] + "\nviz.pools.renderer = 'cells'",
                                                              TRACE_CELLS[1]])
    open_notebook(page, jupyter_server, path)
    run_all_cells(page)
    wait_for_visualizer(page, num_cells=32 + 16)
    assert page.locator(".bv-view-pool .bv-cell").count() == 32 + 16
    for action in ("step", "step"):
        wait_for_position(page, click_and_wait(page, "step"))
        assert page_cells(page) == kernel_cells(page)
    kernel_json(page, "[setattr(viz.pools, 'renderer', 'canvas'), 0][-1]")  # switched while shown
    page.wait_for_selector(f"{pool_canvas('gpu')}[data-states]")
    assert page.locator(".bv-view-pool .bv-cell").count() == 0
    assert page_cells(page) == kernel_cells(page)


BIG_POOL_CELLS = [
    "from blockviz.jupyter.widgets import PoolView\n"
    "n = 1024\n"
    "codes = ''.join('ucf'[i % 3] for i in range(n))\n"
    "ref = [(2 if i % 6 == 0 else 1) if c == 'u' else 0 for i, c in enumerate(codes)]\n"
    "gpu = {'n': n, 'state': codes, 'ref': ref, 'fill': [0 if c == 'f' else 16 for c in codes],\n"
    "       'owner': [i % 5 if c == 'u' else -1 for i, c in enumerate(codes)],\n"
    "       'owner2': [(i + 1) % 5 if r == 2 else -1 for i, r in enumerate(ref)],\n"
    "       'used': codes.count('u'), 'cached': codes.count('c'), 'free': codes.count('f')}\n"
    "empty = {'n': 0, 'state': '', 'ref': [], 'fill': [], 'owner': [], 'owner2': [], 'used': 0, 'cached': 0,\n"
    "         'free': 0}\n"
    "got = []\n"
    "view = PoolView()\n"
    "view.on_action(got.append)\n"
    "view.show({'block_size': 16, 'pools': {'gpu': gpu, 'cpu': empty}, 'touched': {'gpu': [1000]}, 'selected': None})",
    "view",
]


def test_a_big_pool_paints_the_rows_in_view_at_two_device_pixels_a_pixel(jupyter_server, chromium_browser):
    context = chromium_browser.new_context(viewport={"width": 1400, "height": 1000}, device_scale_factor=2)
    page = context.new_page()
    try:
        path = jupyter_server.add_notebook("big-pool.ipynb", BIG_POOL_CELLS)
        open_notebook(page, jupyter_server, path)
        run_all_cells(page)
        page.wait_for_selector(f"{pool_canvas('gpu')}[data-states]")
        codes = kernel_json(page, "codes")
        assert page.get_attribute(pool_canvas("gpu"), "data-states") == codes
        assert page.get_attribute(pool_canvas("gpu"), "data-refs") == ",".join(map(str, kernel_json(page, "ref")))
        size = page.evaluate("""(sel) => { const c = document.querySelector(sel), g = c.closest('.bv-grid');
            return [c.width, c.height, c.clientWidth, c.clientHeight, g.clientHeight, g.scrollHeight]; }""",
                             pool_canvas("gpu"))
        width, height, css_width, css_height, view_height, content_height = size
        assert (width, height) == (2 * css_width, 2 * css_height)  # device pixels
        assert css_height == view_height < content_height  # the canvas covers the view; the grid scrolls

        click_block(page, "gpu", 1000)  # scrolls its row into view, then clicks it
        assert page.evaluate("(sel) => document.querySelector(sel).closest('.bv-grid').scrollTop",
                             pool_canvas("gpu")) > 0
        for _ in range(100):  # the click's message reaches the kernel
            if kernel_json(page, "got"):
                break
            page.wait_for_timeout(100)
        assert kernel_json(page, "got") == [{"event": "select", "device": "gpu", "number": 1000}]
        cell_height = float(page.get_attribute(pool_canvas("gpu"), "data-cell-height"))
        colours = kernel_json(page, "view.palette['seq']")
        assert block_pixel(page, "gpu", 999, 6, cell_height - 8) == [*rgb(colours[999 % 5]), 255]  # used
        assert block_pixel(page, "gpu", 1000, 6, cell_height - 8) == [*rgb("#3c4a5a"), 255]  # cached
        assert block_pixel(page, "gpu", 1000, 0.5, cell_height / 2) == [*rgb("#ffd400"), 255]  # touched
        assert block_pixel(page, "gpu", 1001, 6, cell_height - 8)[3] == 0  # free
        hover_block(page, "gpu", 996)
        page.wait_for_function("([sel, text]) => document.querySelector(sel).title === text",
                               arg=[pool_canvas("gpu"), "gpu block 996 · used · ref 2 · 16/16 slots · seq 1,2"])
        assert page.locator(".bv-pool[data-device='cpu']").is_hidden()  # an empty pool
    finally:
        context.close()


def rgb(colour: str) -> list[int]:
    return [int(colour[i:i + 2], 16) for i in (1, 3, 5)]

"""The widgets in a real browser: JupyterLab runs a notebook, chromium clicks the controls, and the
page's cells (data-block / data-state / data-ref) must equal the reducer state in the kernel.

Fixtures and helpers: tests/jupyter_fixtures.py (one server per session, a fresh page per test)."""

from __future__ import annotations

from jupyter_fixtures import (
    click_and_wait,
    kernel_cells,
    kernel_json,
    open_notebook,
    page_cells,
    run_all_cells,
    wait_for_position,
    wait_for_visualizer,
)

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
    page.click(f".bv-view-pool .bv-cell[data-device='{device}'][data-block='{number}']")
    inspector = f".bv-inspector[data-device='{device}'][data-block='{number}']"
    page.wait_for_selector(inspector)
    assert page.get_attribute(inspector, "data-ref") == str(ref)
    assert page.get_attribute(inspector, "data-state") == "used"
    assert kernel_json(page, "list(viz.selected)") == [device, number]
    assert page.locator(f".bv-view-pool .bv-cell.bv-selected[data-block='{number}']").count() == 1

    # the slider seeks, and the table view shows the kernel's block tables
    tables = kernel_json(page, "{str(k): [n for _, n in v] for k, v in viz.state.tables.items()}")
    for seq_id, blocks in tables.items():
        shown = page.eval_on_selector_all(f".bv-table-row[data-seq='{seq_id}'] .bv-lblock",
                                          "(nodes) => nodes.map((n) => Number(n.dataset.block))")
        assert shown == blocks
    assert page.locator(".bv-error").is_hidden()

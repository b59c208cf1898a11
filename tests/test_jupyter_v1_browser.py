"""vLLM v1 in a real browser: JupyterLab runs a Visualizer over the shipped v1 trace; the pools the
page drew (the canvas's data-states / data-refs, the null block included), the free queue's row
and head, the CPU pool's notes and the chunked-prefill progress must equal the kernel's reducer
state and view model at the cursor, before and after stepping.

Fixtures and helpers: tests/jupyter_fixtures.py (one server per session, a fresh page per test)."""

from __future__ import annotations

from jupyter_fixtures import (block_pixel, click_and_wait, kernel_cells, kernel_json, open_notebook, page_cells,
                               pool_canvas, run_all_cells, wait_for_position, wait_for_visualizer)
from test_jupyter_browser import rgb
from test_v1_views import V1_CURSOR

V1_CELLS = [
    f"from blockviz.jupyter import Visualizer\nviz = Visualizer.from_trace('v1-story')\nviz.seek({V1_CURSOR})",
    "viz",
]
KERNEL_QUEUE = "viz.frame()['free_queue']"


def check_v1_page(page) -> None:
    """The page's pools, free queue and head equal the kernel's at its cursor."""
    assert page_cells(page) == kernel_cells(page)
    queue = kernel_json(page, KERNEL_QUEUE)
    row = ".bv-view-pool .bv-pool[data-device='gpu'] .bv-free-queue"
    blocks = ",".join(str(number) for number, _ in queue["blocks"])
    page.wait_for_function("([sel, blocks]) => document.querySelector(sel).dataset.blocks === blocks",
                           arg=[row, blocks])
    assert page.get_attribute(row, "data-cached") == ",".join("1" if cached else "0" for _, cached in queue["blocks"])
    assert page.get_attribute(row, "data-num-free") == str(queue["num_free"])
    head = str(queue["blocks"][0][0]) if queue["blocks"] else ""
    assert page.get_attribute(pool_canvas("gpu"), "data-head") == head


def test_the_page_draws_a_v1_run_as_the_kernel_has_it(jupyter_server, lab_page):
    page = lab_page
    path = jupyter_server.add_notebook("widget-v1.ipynb", V1_CELLS)
    open_notebook(page, jupyter_server, path)
    run_all_cells(page)
    wait_for_visualizer(page, num_cells=48)
    wait_for_position(page, V1_CURSOR)
    check_v1_page(page)
    cells = page_cells(page)
    assert cells[0] == ["gpu", 0, "null", 0]  # the null block, as the kernel's block_state says
    assert any(state == "cached" for _, _, state, _ in cells)

    height = float(page.get_attribute(pool_canvas("gpu"), "data-cell-height"))
    assert block_pixel(page, "gpu", 0, 6, height - 8) == [*rgb("#1e1a12"), 255]  # the null block's colour

    # no CPU pool in v1: its place says why, one line per note
    notes = kernel_json(page, "list(viz.frame()['notes'].values())")
    assert len(notes) == 2
    shown = page.eval_on_selector_all(".bv-view-pool .bv-pool[data-device='cpu'] .bv-note",
                                      "(nodes) => nodes.map((n) => n.textContent)")
    assert shown == notes and page.locator(".bv-view-pool .bv-pool[data-device='cpu']").is_visible()

    # chunked prefill: seq 4 prefills 9 of its 42 tokens this step
    progress = kernel_json(page, "[r['progress'] for r in viz.frame()['tables'] if r['seq'] == 4][0]")
    line = ".bv-table-row[data-seq='4'] .bv-progress"
    assert page.get_attribute(line, "data-computed") == str(progress["computed"]) == "9"
    assert page.text_content(line) == progress["text"]

    for action in ("step", "step", "step_event", "step"):
        position = click_and_wait(page, action)
        wait_for_position(page, position)
        check_v1_page(page)

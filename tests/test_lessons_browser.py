"""Lesson 02 in a real browser: JupyterLab runs a temporary copy of lessons/02 top to bottom, chromium
clicks the widget's step button, and the page's pool cells equal the reducer state in the kernel.

Fixtures and helpers: tests/jupyter_fixtures.py (one server per session, a fresh page per test)."""

from __future__ import annotations

from pathlib import Path

from jupyter_fixtures import (
    UI_LIMIT_MS,
    click_and_wait,
    kernel_cells,
    kernel_json,
    open_notebook,
    page_cells,
    run_all_cells,
    wait_for_position,
    wait_for_visualizer,
)

LESSON = Path(__file__).resolve().parent.parent / "lessons" / "02_logical_vs_physical.ipynb"

ALL_CELLS_RAN = """() => {
    const cells = window.jupyterapp.shell.currentWidget.content.widgets;
    return cells.every((c) => c.model.type !== 'code' || c.model.executionCount !== null);
}"""
ERRORS = """() => window.jupyterapp.shell.currentWidget.content.widgets
    .filter((c) => c.model.type === 'code')
    .flatMap((c) => c.model.outputs.toJSON())
    .filter((o) => o.output_type === 'error')
    .map((o) => o.ename + ': ' + o.evalue)"""


def same_as_kernel(page) -> None:
    """Every view of the Visualizer on the page (the lesson displays it more than once) draws the
    kernel's pools."""
    kernel = kernel_cells(page)
    shown = page_cells(page)
    assert shown and len(shown) % len(kernel) == 0
    assert shown == kernel * (len(shown) // len(kernel))


def test_lesson_02_runs_in_jupyterlab_and_its_step_button_steps_the_engine(jupyter_server, lab_page):
    page = lab_page
    path = jupyter_server.copy_notebook(LESSON)
    open_notebook(page, jupyter_server, path)
    run_all_cells(page)
    wait_for_visualizer(page)
    page.wait_for_function(ALL_CELLS_RAN, timeout=UI_LIMIT_MS)
    position = kernel_json(page, "viz.position")  # queued behind the lesson's cells: they are done
    assert page.evaluate(ERRORS) == []
    wait_for_position(page, position)
    same_as_kernel(page)

    steps_before = kernel_json(page, "viz.state.step")
    for _ in range(2):
        position = click_and_wait(page, "step")
        assert kernel_json(page, "viz.position") == position
        wait_for_position(page, position)
        same_as_kernel(page)
    assert kernel_json(page, "viz.state.step") == steps_before + 2
    assert any(state == "used" for _, _, state, _ in page_cells(page))

"""Lessons 02 and 04 in a real browser: JupyterLab runs a temporary copy of each top to bottom; every
moment on the page (viz.snapshot(), viz.show(at=N)) draws the reducer state at its own cursor, the
live widget draws the kernel's state now, and in lesson 02 chromium clicks the live widget's step
button, which steps the engine and leaves the moments as they were.

Fixtures and helpers: tests/jupyter_fixtures.py (one server per session, a fresh page per test)."""

from __future__ import annotations

from pathlib import Path

import pytest
from jupyter_fixtures import (
    DRAWN_BLOCKS_JS,
    UI_LIMIT_MS,
    click_and_wait,
    drawn_blocks_in,
    kernel_cells,
    kernel_json,
    open_notebook,
    run_all_cells,
    wait_for_position,
    wait_for_visualizer,
)

LESSONS = Path(__file__).resolve().parent.parent / "lessons"
LIVE = ".blockviz:not(.blockviz-moment)"

ALL_CELLS_RAN = """() => {
    const cells = window.jupyterapp.shell.currentWidget.content.widgets;
    return cells.every((c) => c.model.type !== 'code' || c.model.executionCount !== null);
}"""
ERRORS = """() => window.jupyterapp.shell.currentWidget.content.widgets
    .filter((c) => c.model.type === 'code')
    .flatMap((c) => c.model.outputs.toJSON())
    .filter((o) => o.output_type === 'error')
    .map((o) => o.ename + ': ' + o.evalue)"""
# Each moment on the page, in page order: its cursor and the blocks its pools drew.
MOMENTS_JS = ("() => Array.from(document.querySelectorAll('.blockviz-moment')).map((m) => ({"
              "position: Number(m.querySelector('.bv-view-moment').dataset.position), blocks: ("
              + DRAWN_BLOCKS_JS.replace("() => {", "(root) => {", 1).replace(
                  "document.querySelectorAll('.bv-view-pool .bv-pool')", "root.querySelectorAll('.bv-view-pool .bv-pool')", 1)
              + ")(m) }))")
MOMENTS_DRAWN = """(n) => {
    const moments = document.querySelectorAll('.blockviz-moment');
    return moments.length === n && Array.from(moments).every((m) =>
        m.querySelector('.bv-view-moment[data-position]') && m.querySelector("canvas.bv-pool-canvas[data-states]"));
}"""


def num_moments(path: Path) -> int:
    """Code cells of the lesson whose last line shows a moment of `viz`."""
    import nbformat

    cells = nbformat.read(path, as_version=4).cells
    return sum(1 for c in cells if c.cell_type == "code" and c.source.strip()
               and c.source.strip().splitlines()[-1].startswith(("viz.snapshot()", "viz.show(")))


def run_lesson(page, server, name: str) -> int:
    """Open a copy of the lesson, run all its cells, wait for every moment; returns how many."""
    path = server.copy_notebook(LESSONS / name)
    open_notebook(page, server, path)
    run_all_cells(page)
    wait_for_visualizer(page)
    page.wait_for_function(ALL_CELLS_RAN, timeout=UI_LIMIT_MS)
    position = kernel_json(page, "viz.position")  # queued behind the lesson's cells: they are done
    assert page.evaluate(ERRORS) == []
    wait_for_position(page, position)
    expected = num_moments(LESSONS / name)
    page.wait_for_function(MOMENTS_DRAWN, arg=expected, timeout=UI_LIMIT_MS)
    return expected


# How many blocks moment `index` has drawn so far, over all its pools (each pool's canvas is drawn in its
# own frame, so one may be on the page before another).
MOMENT_BLOCKS_DRAWN = "([index, n]) => (" + MOMENTS_JS + ")()[index].blocks.length === n"


def moments_equal_the_kernel(page) -> list[dict]:
    """Every moment draws the reducer state at its cursor (asked of the kernel afresh), once all its
    pools are on the page."""
    for index, moment in enumerate(page.evaluate(MOMENTS_JS)):
        expected = kernel_cells(page, f"viz.snapshot(at={moment['position']})")
        # a pool canvas paints when it is on screen with a width: look at the moment, as a reader does
        page.evaluate("(i) => document.querySelectorAll('.blockviz-moment')[i].scrollIntoView()", index)
        page.wait_for_function(MOMENT_BLOCKS_DRAWN, arg=[index, len(expected)], timeout=UI_LIMIT_MS)
    moments = page.evaluate(MOMENTS_JS)
    for moment in moments:
        assert moment["blocks"] == kernel_cells(page, f"viz.snapshot(at={moment['position']})"), moment["position"]
    return moments


@pytest.mark.parametrize("name", ["02_logical_vs_physical.ipynb", "04_fork_copy_on_write.ipynb"])
def test_the_moments_of_a_lesson_show_the_states_their_cells_captured(jupyter_server, lab_page, name):
    page = lab_page
    expected = run_lesson(page, jupyter_server, name)
    moments = moments_equal_the_kernel(page)
    assert len(moments) == expected >= 2
    positions = [m["position"] for m in moments]
    assert positions == sorted(positions) and len(set(positions)) == len(positions), positions
    assert drawn_blocks_in(page, LIVE) == kernel_cells(page)
    assert any(m["blocks"] != kernel_cells(page) for m in moments), "every moment equals the end: nothing frozen"


def test_lesson_02_step_button_steps_the_engine_and_leaves_the_moments(jupyter_server, lab_page):
    page = lab_page
    run_lesson(page, jupyter_server, "02_logical_vs_physical.ipynb")
    moments = moments_equal_the_kernel(page)
    kernel_json(page, "viz.add_request('JULIET: and', SamplingParams(max_tokens=4, ignore_eos=True))")
    wait_for_position(page, kernel_json(page, "viz.position"))  # the request's frame has arrived
    steps_before = kernel_json(page, "viz.state.step")
    for _ in range(2):
        position = click_and_wait(page, "step")
        assert kernel_json(page, "viz.position") == position
        wait_for_position(page, position)
        assert drawn_blocks_in(page, LIVE) == kernel_cells(page)
    assert kernel_json(page, "viz.state.step") == steps_before + 2
    assert any(state == "used" for _, _, state, _ in drawn_blocks_in(page, LIVE))
    assert page.evaluate(MOMENTS_JS) == moments


def test_the_readme_notebook_block_pasted_as_one_cell_renders_the_widget(jupyter_server, lab_page, tmp_path):
    """The README's "In Jupyter" block, pasted as one cell in JupyterLab and run: no error, and the
    cell shows the live Visualizer (its last expression) drawing the kernel's state."""
    import nbformat
    from test_lessons import readme_notebook_block

    page = lab_page
    notebook = nbformat.v4.new_notebook(metadata={"kernelspec": {"name": "python3", "display_name": "Python 3",
                                                                 "language": "python"}})
    notebook.cells = [nbformat.v4.new_code_cell(readme_notebook_block())]
    source = tmp_path / "readme_block.ipynb"
    nbformat.write(notebook, source)
    path = jupyter_server.copy_notebook(source)
    open_notebook(page, jupyter_server, path)
    run_all_cells(page)
    wait_for_visualizer(page)
    page.wait_for_function(ALL_CELLS_RAN, timeout=UI_LIMIT_MS)
    position = kernel_json(page, "viz.position")
    assert page.evaluate(ERRORS) == []
    wait_for_position(page, position)
    assert position > 0 and drawn_blocks_in(page, LIVE) == kernel_cells(page)

"""A hybrid run's KV-cache groups in a real browser (issue 41, item 4): JupyterLab runs a notebook
that records a tiny hybrid Llama's run under engine/v1 (tests/hybrid_fixtures.py) and opens it in
a Visualizer at a cursor where a window group's table holds the null block; chromium draws the
pool (each block's group badge: the canvas's data-groups), one block table per group per request
(labelled, the freed window slots as the null block), the groups' legend and the inspector's
group, each compared with the kernel's reducer state at that cursor.

Fixtures and helpers: tests/jupyter_fixtures.py (one server per session, a fresh page per test)."""

from __future__ import annotations

from pathlib import Path

from jupyter_fixtures import click_block, kernel_json, open_notebook, run_all_cells, wait_for_position, wait_for_visualizer

TESTS = Path(__file__).resolve().parent
CELLS = [
    f"import sys, tempfile, pathlib\nsys.path.insert(0, {str(TESTS)!r})\n"
    "from hybrid_fixtures import make_hybrid_llama, record_hybrid_trace, window_cursors\n"
    "from blockviz.jupyter import Visualizer\nfrom blockviz.model.timeline import Timeline\n"
    "from blockviz.model.trace import read_trace\n"
    "root = pathlib.Path(tempfile.mkdtemp())\n"
    "trace = read_trace(record_hybrid_trace(root / 'hybrid.jsonl', make_hybrid_llama(root / 'ckpt')))\n"
    "cursors = window_cursors(Timeline.for_trace(trace))\n"
    "viz = Visualizer.from_trace(trace)\nviz.seek(cursors[len(cursors) // 2])",
    "viz",
]
GPU_CANVAS = ".bv-view-pool canvas.bv-pool-canvas[data-device='gpu']"
# The reducer's fields, not a view function: a used or cached block's group, -1 for the rest.
KERNEL_GROUPS = ("[b.group if b.state == 'used' or (b.state != 'null' and b.block_hash is not None) else -1 "
                 "for b in viz.state.pools['gpu']]")
KERNEL_TABLES = ("{str(s): [['null' if viz.state.pools[d][n].state == 'null' else n for d, n in viz.state.tables_of(g).get(s, [])] "
                 "for g in range(viz.state.num_kv_cache_groups)] for s in sorted(set(viz.state.seqs) | set(viz.state.tables))}")
PAGE_TABLES = """() => Object.fromEntries([...document.querySelectorAll('.bv-view-tables .bv-table-row')].map((row) =>
    [row.dataset.seq, [...row.querySelectorAll('.bv-group-table')].map((g) =>
        [...g.querySelectorAll('.bv-lblock')].map((b) => b.dataset.null ? 'null' : Number(b.dataset.block)))]))"""


def test_the_notebook_draws_a_hybrid_runs_groups_and_a_freed_window_slot(jupyter_server, lab_page):
    page = lab_page
    path = jupyter_server.add_notebook("hybrid.ipynb", CELLS)
    open_notebook(page, jupyter_server, path)
    run_all_cells(page)
    wait_for_visualizer(page)
    position = kernel_json(page, "viz.position")
    wait_for_position(page, position)
    page.wait_for_selector(f"{GPU_CANVAS}[data-groups]")
    drawn = [int(g) for g in page.get_attribute(GPU_CANVAS, "data-groups").split(",")]
    kernel = kernel_json(page, KERNEL_GROUPS)
    assert drawn == kernel and {0, 1} <= set(kernel)  # both groups hold blocks at the cursor
    tables = page.evaluate(PAGE_TABLES)
    expected = kernel_json(page, KERNEL_TABLES)
    assert tables == expected
    assert any("null" in table for groups in expected.values() for table in groups)  # a freed window slot
    labels = kernel_json(page, "[__import__('blockviz.model.view', fromlist=['x']).group_label(viz.state, g) "
                               "for g in range(viz.state.num_kv_cache_groups)]")
    assert any("sliding window" in label for label in labels) and any("full attention" in label for label in labels)
    legend = page.evaluate("() => [...document.querySelectorAll('.bv-view-pool .bv-group-key')].map((k) => k.textContent.trim())")
    assert legend == [f"{g} {label}" for g, label in enumerate(labels)]
    shown = page.evaluate("() => [...document.querySelectorAll('.bv-view-tables .bv-group-label')].map((k) => k.textContent.trim())")
    assert set(shown) == {f"{g} {label}" for g, label in enumerate(labels)}
    for group in (0, 1):
        number = kernel.index(group)
        click_block(page, "gpu", number)
        page.wait_for_selector(f".bv-inspector[data-block='{number}'][data-group='{group}']")
        assert labels[group] in page.text_content(".bv-inspector")

"""The insight views in a real browser: JupyterLab runs a notebook, chromium draws the preemption
ledger, the memory view's SVG sparkline and the prefix-lookup explainer, and their data attributes
must equal the kernel's frame parts; the breakpoints bar's "◂ previous" travels back and the ledger
follows. Fixtures: tests/jupyter_fixtures.py (one server per session, a fresh page per test)."""

from __future__ import annotations


import pytest
from optional_parts import needs_sglang, needs_vllm
from jupyter_fixtures import kernel_json, open_notebook, run_all_cells, wait_for_position, wait_for_visualizer

CELLS = [
    "from blockviz.jupyter import Visualizer\nviz = Visualizer.from_trace('swap')\nviz.seek(len(viz));",
    "viz",
    "viz.ledger_view",
    "viz.memory_view",
    "hit = Visualizer.from_trace('prefix-hit')\nhit.run_to_completion()\nhit.explain_view",
]

KERNEL_LEDGER = ("[[r['seq_no'], r['mode'], r['blocks_swapped'], r['blocks_freed'], r['tokens_lost'], "
                 "r['steps_until_resumed']] for r in viz.insight.parts(('ledger',))['ledger']['rows']]")
PAGE_LEDGERS = """() => Array.from(document.querySelectorAll('.bv-view-ledger')).map((view) =>
    Array.from(view.querySelectorAll('.bv-ledger-row')).map((r) => [Number(r.dataset.seqNo), r.dataset.mode,
        Number(r.dataset.swapped), Number(r.dataset.freed), Number(r.dataset.lost),
        r.dataset.resumed === '' ? null : Number(r.dataset.resumed)]))"""
PAGE_SPARKS = """() => Array.from(document.querySelectorAll('.bv-view-memory svg.bv-spark')).map((chart) =>
    ['block', 'token'].map((name) => Array.from(chart.querySelectorAll(`circle[data-series='${name}']`)).map(
        (c) => [Number(c.dataset.step), Number(c.dataset.value)])))"""
PAGE_EXPLAINS = """() => Array.from(document.querySelectorAll('.bv-view-explain .bv-explain[data-request]')).map((body) =>
    [body.dataset.request, Number(body.dataset.hitBlocks), Array.from(body.querySelectorAll('.bv-verdict')).map(
        (r) => [Number(r.dataset.index), r.dataset.hash, r.dataset.verdict, r.dataset.block === '' ? null
                : Number(r.dataset.block)])])"""
KERNEL_EXPLAIN = ("(lambda x: [x['request'], x['hit_blocks'], [[b['index'], b['hash'], b['verdict'], b['block']] "
                  "for b in x['blocks']]])(hit.insight.parts(('explain',))['explain'])")


def wait_until_equal(page, script: str, expected) -> None:
    """Wait until every copy of a view on the page (one in the accordion, one on its own) draws
    `expected`, and there is at least one."""
    page.wait_for_function(f"(want) => {{ const got = ({script})(); return got.length > 0 && "
                           "got.every((g) => JSON.stringify(g) === JSON.stringify(want)); }", arg=expected)


def test_ledger_sparkline_and_explainer_draw_the_kernels_parts(jupyter_server, lab_page):
    page = lab_page
    path = jupyter_server.add_notebook("insights.ipynb", CELLS)
    open_notebook(page, jupyter_server, path)
    run_all_cells(page)
    wait_for_visualizer(page, num_cells=32 + 16)
    page.wait_for_selector(".bv-view-explain .bv-explain[data-request]")

    ledger = kernel_json(page, KERNEL_LEDGER)
    assert len(ledger) == 4 and all(row[5] is not None for row in ledger)  # at the end every victim resumed
    wait_until_equal(page, PAGE_LEDGERS, ledger)
    assert page.locator(".bv-view-ledger .bv-ledger-totals").first.text_content() == kernel_json(
        page, "viz.insight.parts(('ledger',))['ledger']['totals']")
    names = kernel_json(page, "[r['name'] for r in viz.insight.parts(('ledger',))['ledger']['rows']]")
    drawn = page.eval_on_selector_all(".bv-view-ledger .bv-ledger-row", "(rows) => rows.map((r) => r.cells[2].textContent)")
    assert names and all(name.startswith("request ") for name in names) and drawn[:len(names)] == names

    series = kernel_json(page, "viz.insight.parts(('memory',))['memory']['series']")
    assert len(series) > 10
    wait_until_equal(page, PAGE_SPARKS, [[[p[0], p[2]] for p in series], [[p[0], p[3]] for p in series]])

    explain = kernel_json(page, KERNEL_EXPLAIN)
    assert explain[1] == 4 and [row[2] for row in explain[2]][:5] == ["hit"] * 4 + ["different tokens"]
    wait_until_equal(page, PAGE_EXPLAINS, explain)

    # the breakpoints bar: tick "preempted", go back twice; the ledger shows the past each time
    page.click(".bv-view-breaks input[data-kind='preempted']")
    page.wait_for_function("() => document.querySelector('.bv-view-breaks').dataset.breakOn === 'preempted'")
    # each stop is the end of the preemption's operation (its swap-out drawn whole)
    preempted = kernel_json(page, "[viz.viewer.timeline.landing(i + 1) for i, e in enumerate(viz.events) "
                                  "if e.type == 'preempted']")
    for target in (preempted[-1], preempted[-2]):
        page.click(".bv-view-breaks button[data-direction='previous']")
        wait_for_position(page, target)
        assert kernel_json(page, "viz.position") == target
        ledger = kernel_json(page, KERNEL_LEDGER)
        assert ledger[-1][5] is None  # the victim just preempted has not resumed yet
        wait_until_equal(page, PAGE_LEDGERS, ledger)
    assert "stopped at event" in page.locator(".bv-view-breaks .bv-break-message").text_content()


COMPARE_CELLS = [
    "from blockviz.jupyter import compare\n"
    "grid = compare(['ROMEO: But soft, what light'], block_size=[4, 16], num_gpu_blocks=32, prefix_caching=False,"
    " max_tokens=8)",
    "grid",
]
# vLLM's blocks of 4 beside SGLang's tree at page_size 1 (needs SGLang and vLLM installed)
SGLANG_COMPARE_CELLS = [
    "from blockviz.jupyter import compare\n"
    "grid = compare(['ROMEO: But soft, what light', 'ROMEO: But soft, what light through'],"
    " kv_manager=['vllm', 'sglang'], block_size=4, num_gpu_blocks=64, max_tokens=6, sglang_options={'page_size': 1})",
    "grid",
]
# each cell's free space as its design counts it (blockviz/model/free_space.py), in the kernel and on the page
KERNEL_FREE = ("[__import__('blockviz.model.free_space', fromlist=['x']).free_space(t.state).line() "
               "for t in grid.timelines]")
PAGE_FREE = "() => Array.from(document.querySelectorAll('.bv-compare-free')).map((e) => e.textContent)"
# Per pool view on the page: its GPU canvas's drawn states, and the step its figures say.
PAGE_COMPARE = """() => Array.from(document.querySelectorAll('.bv-view-pool')).map((view) => {
    const canvas = view.querySelector("canvas.bv-pool-canvas[data-device='gpu'][data-states]");
    return canvas ? canvas.dataset.states : null; })"""
# each run's pool as far as the grid draws it (the blocks the run ever holds: grid.extents)
KERNEL_COMPARE = ("[''.join(__import__('blockviz.model.view', fromlist=['x']).block_state(b)[0] "
                  "for b in t.state.pools['gpu'][:extent]) for t, extent in zip(grid.timelines, grid.extents)]")


@pytest.mark.parametrize("cells", [pytest.param(COMPARE_CELLS, id="block-sizes"),
                                   pytest.param(SGLANG_COMPARE_CELLS, id="vllm-sglang", marks=[needs_sglang, needs_vllm])])
def test_the_compare_grid_draws_each_runs_pool_at_the_step_and_moves_them_together(jupyter_server, lab_page, cells):
    page = lab_page
    path = jupyter_server.add_notebook("compare.ipynb", cells)
    open_notebook(page, jupyter_server, path)
    run_all_cells(page)
    page.wait_for_selector(".bv-compare-cell[data-step]")
    for _ in range(2):
        step = kernel_json(page, "grid.step")
        expected = kernel_json(page, KERNEL_COMPARE)
        assert len(expected) == 2 and expected[0] != expected[1]  # block size 4 holds the tokens in more blocks
        wait_until_equal(page, f"() => [({PAGE_COMPARE})()]", expected)
        wait_until_equal(page, f"() => [({PAGE_FREE})()]", kernel_json(page, KERNEL_FREE))
        assert page.locator(f".bv-compare-cell[data-step='{step}']").count() == 2
        page.get_by_role("button", name="▸").click()
        page.wait_for_function("(s) => document.querySelectorAll(`.bv-compare-cell[data-step='${s}']`).length === 2",
                               arg=step + 1)
        assert kernel_json(page, "grid.step") == step + 1

"""SGLang's radix tree drawn in chromium from a recorded `kv_manager="sglang"` trace: in a notebook
(JupyterLab, a Visualizer over the trace, its radix section open at first) and on the exported page
(`blockviz export TRACE --html`, opened offline), at cursors where the tree changes, each node drawn
(id, parent, tokens, lock_ref, slots, evictable) and the sizes are the reducer's there."""

from __future__ import annotations

from blockviz.cli import main
from blockviz.model.reducer import ReducerState
from engine import events as ev
from jupyter_fixtures import open_notebook, run_all_cells, wait_for_position, wait_for_visualizer
from site_fixtures import offline_page  # noqa: F401 (fixture)
from tests.radix_fixtures import sglang_trace  # noqa: F401 (the recorded sglang trace, a module fixture)

DRAWN_TREE_JS = """() => { const body = document.querySelector('.bv-view-radix .bv-radix[data-nodes]');
    if (!body) return null;
    return { sizes: [Number(body.dataset.nodes), Number(body.dataset.evictable), Number(body.dataset.protected)],
             nodes: [...body.querySelectorAll('.bv-radix-node')].map((n) => [Number(n.dataset.node),
                 n.dataset.parent === '' ? null : Number(n.dataset.parent), Number(n.dataset.tokens),
                 Number(n.dataset.lock), n.dataset.slots, n.dataset.evictable === 'true']) }; }"""


def expected_tree(trace, position: int) -> dict:
    nodes = ReducerState.from_header(trace.header).apply_all(trace.events[:position]).radix_nodes
    parents = {node.parent_id for node in nodes.values()}
    locked = sum(len(n.token_ids) for n in nodes.values() if n.lock_ref)
    unlocked = sum(len(n.token_ids) for n in nodes.values() if not n.lock_ref)
    return {"sizes": [len(nodes), unlocked, locked],
            "nodes": sorted([node_id, node.parent_id, len(node.token_ids), node.lock_ref,
                             ",".join(map(str, node.slots)), node_id not in parents and node.lock_ref == 0]
                            for node_id, node in nodes.items())}


def sorted_drawn(drawn: dict | None) -> dict | None:
    return None if drawn is None else {"sizes": drawn["sizes"], "nodes": sorted(drawn["nodes"])}


def tree_positions(trace) -> list[int]:
    """A few cursors: just after the first insert, split, lock change and eviction, and the end."""
    firsts = {}
    for position, event in enumerate(trace.events, start=1):
        firsts.setdefault(type(event), position)
    kinds = (ev.RadixNodeInserted, ev.RadixNodeSplit, ev.RadixLockRef, ev.RadixNodeEvicted)
    return sorted({firsts[kind] for kind in kinds} | {len(trace.events)})


def wait_for_tree(page, want: dict) -> None:
    page.wait_for_function(f"(want) => {{ const got = ({DRAWN_TREE_JS})(); if (!got) return false;"
                           " got.nodes.sort((a, b) => a[0] - b[0]);"
                           " return JSON.stringify(got) === JSON.stringify(want); }", arg=want)


def test_the_exported_page_draws_the_reducers_tree(sglang_trace, offline_page, tmp_path):
    page = offline_page
    html = tmp_path / "radix.html"
    assert main(["export", str(sglang_trace.path), "--html", str(html)]) == 0
    page.goto(html.as_uri())
    page.wait_for_function("() => { const r = document.getElementById('bv-page');"
                           " return r.dataset.values === 'true' || r.dataset.error; }")
    assert page.get_attribute("#bv-page", "data-error") is None
    assert page.get_attribute("details[data-section='radix']", "open") is not None
    for position in tree_positions(sglang_trace):
        page.evaluate("""(p) => { const s = document.querySelector('.bv-view-controls .bv-slider');
            s.value = String(p); s.dispatchEvent(new Event('input')); s.dispatchEvent(new Event('change')); }""", position)
        at = int(page.get_attribute(".bv-view-controls", "data-position"))
        wait_for_tree(page, expected_tree(sglang_trace, at))
    assert not page.errors and not page.refused


def test_the_notebook_draws_the_reducers_tree(sglang_trace, jupyter_server, lab_page):
    page = lab_page
    cells = ["from blockviz.jupyter import Visualizer\n"
             f"viz = Visualizer.from_trace({str(sglang_trace.path)!r})", "viz"]
    path = jupyter_server.add_notebook("radix.ipynb", cells)
    open_notebook(page, jupyter_server, path)
    run_all_cells(page)
    wait_for_visualizer(page)
    page.wait_for_selector(".bv-view-radix .bv-radix[data-nodes]")
    for position in tree_positions(sglang_trace):
        page.evaluate("""(p) => { const s = document.querySelector('.bv-view-controls .bv-slider');
            s.value = String(p); s.dispatchEvent(new Event('input')); s.dispatchEvent(new Event('change')); }""", position)
        wait_for_position(page, position)
        wait_for_tree(page, expected_tree(sglang_trace, position))

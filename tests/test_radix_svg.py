"""The SVG export of a `kv_manager="sglang"` trace draws SGLang's radix tree beside the pool: at each
picture's cursor its nodes (id, parent, tokens, lock_ref, slots, evictable) and sizes are the
reducer's; a trace of another design draws no tree."""

from __future__ import annotations

import re

from blockviz.cli import main
from blockviz.model.reducer import ReducerState
from tests.radix_fixtures import sglang_trace  # noqa: F401 (the recorded sglang trace, a module fixture)

NODE = re.compile(r'<g class="radix-node" data-node="(\d+)" data-parent="(\d*)" data-tokens="(\d+)" '
                  r'data-lock="(\d+)" data-slots="([\d,]*)" data-evictable="(true|false)">')
TREE = re.compile(r'<g class="radix" data-nodes="(\d+)" data-more="(\d+)" data-evictable="(\d+)" data-protected="(\d+)">')


def test_exported_pictures_draw_the_reducers_tree(sglang_trace, tmp_path):
    trace = sglang_trace
    out = tmp_path / "tree.svg"
    assert main(["export", str(trace.path), "--frames", "10:110", "--out", str(out)]) == 0
    pictures = sorted(tmp_path.glob("tree-*.svg"))
    assert len(pictures) > 20
    drew_nodes = 0
    for picture in pictures:
        svg = picture.read_text()
        position = int(re.search(r'data-position="(\d+)"', svg)[1])
        state = ReducerState.from_header(trace.header).apply_all(trace.events[:position])
        children = {node.parent_id for node in state.radix_nodes.values()}
        drawn = {int(m[1]): (int(m[2]) if m[2] else None, int(m[3]), int(m[4]), [int(s) for s in m[5].split(",") if s],
                             m[6] == "true") for m in NODE.finditer(svg)}
        assert drawn == {node_id: (node.parent_id, len(node.token_ids), node.lock_ref, list(node.slots),
                                   node_id not in children and node.lock_ref == 0)
                         for node_id, node in state.radix_nodes.items()}, picture.name
        nodes, more, evictable, protected = map(int, TREE.search(svg).groups())
        locked = sum(len(n.token_ids) for n in state.radix_nodes.values() if n.lock_ref)
        unlocked = sum(len(n.token_ids) for n in state.radix_nodes.values() if not n.lock_ref)
        assert (nodes, more, evictable, protected) == (len(state.radix_nodes), 0, unlocked, locked)
        drew_nodes += len(drawn)
    assert drew_nodes


def test_a_trace_without_a_tree_draws_none(tmp_path):
    out = tmp_path / "v1.svg"
    assert main(["export", "blockviz/traces/prefix-hit.jsonl", "--out", str(out)]) == 0
    assert 'class="radix' not in out.read_text()

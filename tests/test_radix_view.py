"""The radix tree's record (blockviz.model.radix_view) on real `kv_manager="sglang"` runs at page_size
1 and 4: after every step its nodes are SGLang's root_node (ids, parents, token runs, slots, lock_ref),
each node's lock_ref is the number of requests it names as holding it, its evictable and protected
sizes are RadixCache.evictable_size() / protected_size(), each running request's match lies in its
own table and in the nodes named; every eviction names a leaf that was unlocked, and under lru
the leaf with the oldest last access the events show. On a recorded trace, at every cursor, the record
is the reducer's tree there, the nodes the cursor's event is about are marked, and a cap on the nodes
drawn keeps those and counts the rest."""

from __future__ import annotations

import importlib.util

import pytest

from blockviz.model.insights import Insights
from blockviz.model.palette import show_tokens
from blockviz.model.radix_view import MAX_NODE_TOKENS, radix_record
from blockviz.model.timeline import Timeline
from engine import events as ev
from tests.radix_fixtures import sglang_trace  # noqa: F401 (the recorded sglang trace, a module fixture)
from tests.test_engine_v1 import loaded  # noqa: F401 (the tiny GPT-2, a module fixture)


@pytest.fixture(autouse=True)
def _needs_sglang():
    if importlib.util.find_spec("sglang") is None:
        pytest.skip("SGLang is not installed")


@pytest.mark.parametrize("page_size, num_gpu_blocks", [(1, 49), (4, 13)])
def test_record_is_sglangs_tree_after_every_step(loaded, tiny_gpt2_dir, page_size, num_gpu_blocks):
    from engine.sglang_core.event_tap import tree_nodes
    from tests.test_sglang_core import GREEDY, make_engine, workload

    engine = make_engine(loaded, tiny_gpt2_dir, num_gpu_blocks=num_gpu_blocks,
                         sglang_options={"page_size": page_size, "chunked_prefill_size": 8})
    events: list[ev.Event] = []
    engine.events.subscribe(events.append)
    insights = Insights(page_size, engine.budget.num_gpu_blocks, 0, kv_manager="sglang")
    for index, prompt in enumerate(workload(7)):
        engine.add_request(prompt, GREEDY, request_id=f"r{index}")
    seen_matches = 0
    while engine.has_unfinished_requests():
        engine.step()
        insights.sync(events)
        record = radix_record(insights.state, insights.radix, len(events), limit=10 ** 6)
        cache = engine.scheduler.tree_cache
        sglang = tree_nodes(cache)
        assert {row.id: (row.parent, row.num_tokens, tuple(row.slots), row.lock_ref) for row in record.nodes} == {
            node_id: (node.parent_id, len(node.token_ids), node.slots[:MAX_NODE_TOKENS], node.lock_ref)
            for node_id, node in sglang.items()}
        assert (record.evictable_size, record.protected_size) == (cache.evictable_size(), cache.protected_size())
        assert record.num_more == 0 and record.num_nodes == len(sglang)
        for row in record.nodes:  # a running request holds its path locked: one lock per request holding it
            assert len(row.holders) == row.lock_ref, (row.id, row.holders, row.lock_ref)
        for match in record.matches:
            table = engine.scheduler.tables[match.seq]
            assert {slot // page_size for slot in match.slots} <= set(table)
            assert all(any(slot in sglang[n].slots for n in match.nodes) for slot in match.slots)
            seen_matches += match.num_tokens
    assert seen_matches, "some request was served from the tree"
    evictions = [e for e in events if isinstance(e, ev.RadixNodeEvicted)]
    assert evictions, "the pool is small enough to evict"
    for entry in insights.radix.evictions:
        assert all(other != entry.node_id for other, _ in entry.others)
        oldest_other = min((a for _, a in entry.others if a is not None), default=None)
        assert oldest_other is None or entry.last_access <= oldest_other, entry


def test_record_at_each_cursor_is_the_reducers_tree(sglang_trace):
    trace = sglang_trace
    timeline = Timeline.for_trace(trace)
    insights = Insights.for_header(trace.header)
    insights.sync(timeline)
    kinds_marked = set()
    for position in range(len(timeline) + 1):
        timeline.seek(position)
        state, event = timeline.state, timeline.current_event
        record = radix_record(state, insights.radix, position, event=event, vocab=timeline.token_texts)
        assert {row.id: (row.parent, row.lock_ref, row.num_tokens) for row in record.nodes} == {
            node_id: (node.parent_id, node.lock_ref, len(node.token_ids)) for node_id, node in state.radix_nodes.items()}
        for row in record.nodes:
            node = state.radix_nodes[row.id]
            assert row.blocks == list(dict.fromkeys(s // state.block_size for s in node.slots))
            assert row.tokens == show_tokens([timeline.token_texts.get(t, f"<{t}>")
                                              for t in node.token_ids[:MAX_NODE_TOKENS]])
            assert row.evictable == (row.leaf and node.lock_ref == 0)
            assert row.holders == [f"request {state.seqs[s].request_id}" for s in sorted(state.tables)
                                   if state.tables[s] and ("gpu", node.slots[0] // state.block_size) in state.tables[s]]
        if isinstance(event, (ev.RadixNodeInserted, ev.RadixLockRef, ev.RadixNodeSplit)):
            assert event.node_id in record.about and any(row.about for row in record.nodes)
            kinds_marked.add(type(event))
        split = record.last_split
        if isinstance(event, ev.RadixNodeSplit):
            assert (split.node, split.new_node, split.at) == (event.node_id, event.new_node_id, event.num_tokens)
        if isinstance(event, ev.RadixNodeEvicted):
            assert record.last_evicted.node == event.node_id and record.last_evicted.slots == list(event.slots)
            assert "unlocked leaf" in record.last_evicted.why
    assert kinds_marked == {ev.RadixNodeInserted, ev.RadixLockRef, ev.RadixNodeSplit}


def test_a_capped_record_keeps_the_nodes_the_card_is_about(sglang_trace):
    trace = sglang_trace
    timeline = Timeline.for_trace(trace)
    insights = Insights.for_header(trace.header)
    insights.sync(timeline)
    position = max(range(len(timeline) + 1), key=lambda at: (timeline.seek(at), len(timeline.state.radix_nodes))[1])
    timeline.seek(position)
    nodes = timeline.state.radix_nodes
    assert len(nodes) >= 3
    last = max(nodes)
    path = [last]
    while nodes[path[-1]].parent_id is not None:
        path.append(nodes[path[-1]].parent_id)
    assert len(path) < len(nodes)
    record = radix_record(timeline.state, insights.radix, position, limit=len(path),
                          event=ev.RadixLockRef(seq_no=0, node_id=last, lock_ref=nodes[last].lock_ref))
    shown = [row.id for row in record.nodes]
    assert sorted(shown) == sorted(path) and record.num_more == len(nodes) - len(path)
    assert [row.about for row in record.nodes] == [row.id == last for row in record.nodes]


def test_the_notebook_frame_holds_the_record_only_in_a_radix_tree_run(sglang_trace):
    from blockviz.jupyter.visualizer import Visualizer

    viz = Visualizer.from_trace(sglang_trace)
    viz.timeline.seek(len(viz.timeline) // 3)
    frame = viz.frame()
    record = radix_record(viz.timeline.state, viz.insight.insights.radix, viz.timeline.position,
                          event=viz.timeline.current_event, vocab=viz.timeline.token_texts)
    assert viz.insight.accordion.selected_index == 3 and frame["radix"] == record.to_json()
    other = Visualizer.from_trace("prefix-hit")
    assert len(other.insight.accordion.children) == 3 and "radix" not in other.frame()


def test_a_dropped_front_keeps_the_history_at_the_positions_kept(sglang_trace):
    events = sglang_trace.events
    insights = Insights.for_header(sglang_trace.header)
    insights.sync(events)
    split = insights.radix.last_split(len(events))
    evicted = insights.radix.last_eviction(len(events))
    shift = 20
    insights.radix.rebase(shift, insights.state)
    assert insights.radix.last_split(len(events) - shift).node_id == split.node_id
    assert insights.radix.last_eviction(len(events) - shift).node_id == evicted.node_id
    for node_id in insights.state.radix_nodes:
        assert insights.radix.last_access(node_id, len(events) - shift) is not None


def test_the_eviction_reason_compares_the_leaf_with_the_next():
    from blockviz.model.radix_view import EvictionEntry, eviction_reason

    def entry(last_access, others):
        return EvictionEntry(9, 4, 7, (1, 2), (3, 4), last_access, others)

    assert eviction_reason(entry(2, []), "lru") == "the only unlocked leaf (last accessed at step 2)"
    assert "the next, #5, at step 3" in eviction_reason(entry(2, [(5, 3), (6, 4)]), "lru")
    assert "as was #5" in eviction_reason(entry(3, [(5, 3)]), "lru")
    assert "by SGLang's clock" in eviction_reason(entry(4, [(5, 3)]), "lru")
    assert eviction_reason(entry(4, [(5, 3)]), "lfu").startswith("an unlocked leaf first in lfu order")


def test_the_last_eviction_says_what_its_evict_call_was_asked_and_freed():
    """Issue 49: each RadixCache.evict call of the shipped story (a RadixEvict, then the leaves it
    took): the record's last eviction, just after the call's last leaf, names the call's leaves,
    the tokens asked and freed, and is this step's; the panel's line, the SVG's and the log's say
    the same."""
    from blockviz.model.export import trace_frame
    from blockviz.model.narration import describe
    from blockviz.model.radix_view import radix_history
    from blockviz.model.svg import frame_svg
    from blockviz.model.reducer import ReducerState
    from blockviz.model.trace import load_trace
    from blockviz.tui.widgets.radix_panel import eviction_line

    trace = load_trace("sglang-story")
    history, state = radix_history(trace.header, trace.events), ReducerState.from_header(trace.header)
    calls = []  # (the RadixEvict, its leaves, the position after its last leaf, the step then)
    for position, event in enumerate(trace.events, start=1):
        state.apply(event)
        if isinstance(event, ev.RadixEvict):
            calls.append([event, [], position, state.step])
        elif isinstance(event, ev.RadixNodeEvicted) and calls and calls[-1][2] >= position - 1:
            calls[-1][1].append(event.node_id)
            calls[-1][2] = position
    assert len(calls) >= 2 and any(call.num_tokens_evicted > call.num_tokens for call, *_ in calls)
    for call, leaves, position, step in calls:
        state = ReducerState.from_header(trace.header)
        for event in trace.events[:position]:
            state.apply(event)
        evicted = radix_record(state, history, position).last_evicted
        assert (evicted.asked, evicted.freed) == (call.num_tokens, call.num_tokens_evicted)
        assert evicted.taken == leaves and evicted.node == leaves[-1] and evicted.recent == (state.step == step)
        line = eviction_line(evicted).plain
        assert f"asked {call.num_tokens}, freed {call.num_tokens_evicted}" in line
        assert all(f"#{leaf}" in line for leaf in leaves)
        timeline = Timeline.for_trace(trace)
        timeline.seek(position)
        svg = frame_svg(trace_frame(timeline, trace.header, "sglang-story", radix=history))
        assert f"#{leaves[-1]} (evict asked {call.num_tokens}, freed {call.num_tokens_evicted})" in svg
        words = describe(call)
        assert f"asked for {call.num_tokens} token" in words and f"freed {call.num_tokens_evicted}" in words
        assert ("more than asked" in words) == (call.num_tokens_evicted > call.num_tokens)

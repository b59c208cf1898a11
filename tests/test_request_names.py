"""Issue 45 item 2: one name for a request. At each card of the v0 story (n > 1 by forks, a swap),
v1's story (n = 2) and the CPU tier's, the card's request is named the same way by the card, its
block table row, the inspector, the why panel, the preemption ledger and the event log, in the view
model, the notebook's frame and the TUI's panels: "request 3", with its sequence where the request
has several ("request 1 (seq 2)")."""

from __future__ import annotations

import pytest

from blockviz.jupyter.visualizer import Visualizer
from blockviz.model.insight_view import explain_record, ledger_record, memory_record
from blockviz.model.names import RequestNames, request_name
from blockviz.model.trace import load_trace
from blockviz.model.view import event_log, inspect_block, tables
from blockviz.tui.app import BlockvizApp
from blockviz.tui.widgets.panels import BlockTables
from story_fixtures import story_trace_path  # noqa: F401 (fixture)
from test_tui_app import anyio_backend, screen_text  # noqa: F401 (anyio_backend: the fixture)
from test_view_model import drawn


def test_a_request_is_named_by_its_id_and_its_sequence_only_where_it_has_several():
    assert request_name("3") == request_name("3", (4,)) == "request 3"
    assert request_name("3", (4,), num_seqs=2) == "request 3 (seq 4)"
    assert request_name("3", (4, 5), num_seqs=2) == "request 3 (seqs 4, 5)"
    assert RequestNames()((7,)) == "seq 7"  # no state: its request is not known


def _stories(story_trace_path) -> dict:
    return {"story": load_trace(story_trace_path), "v1-story": load_trace("v1-story"),
            "cpu-tier": load_trace("cpu-tier")}


def test_every_surface_names_a_cards_request_as_the_card_does(story_trace_path):
    several = ledgered = 0
    for story, trace in _stories(story_trace_path).items():
        viz = Visualizer.from_trace(trace, guided=True)
        try:
            for card in viz.player.scan_guide().cards:
                if not card.seqs:
                    continue
                viz.seek(card.position)
                state, position, seq_id = viz.state, viz.position, card.seqs[0]
                names = RequestNames(state)
                name = names((seq_id,))
                request = state.seqs[seq_id].request_id
                assert name.startswith(f"request {request}") and name in card.what, (story, card.idea, name)
                several += name != f"request {request}"
                row = next(r for r in tables(state, limit=None) if r.seq == seq_id)
                assert row.name == name
                frame = viz.frame()
                assert next(r for r in frame["tables"] if r["seq"] == seq_id)["name"] == name
                holder = next((d, n) for d, n in state.tables[seq_id]) if state.tables.get(seq_id) else None
                if holder is not None and len(state.pools[holder[0]][holder[1]].owners) == 1:
                    assert inspect_block(state, *holder).owner_names == [name]
                log = event_log(viz.events, position, vocab=viz.timeline.token_texts, names=names, limit=10**6)
                lines = [words for _, _, words in log]
                assert any(name in words for words in lines), (story, card.idea)
                assert [words for _, _, words in frame["log"]["rows"]] == lines[-len(frame["log"]["rows"]):]
                assert not any(f"req {request} " in words for words in lines)
                viz.viewer.insights.sync(viz.timeline)
                why = explain_record(viz.viewer.insights, position, state=state, seq_id=seq_id)
                if why.seq == seq_id:
                    assert why.name == name
                memory = memory_record(viz.viewer.insights, state, position)
                assert all(seq.name == names((seq.seq,)) for seq in memory.seqs)
                assert any(seq.name == name for seq in memory.seqs) or seq_id not in state.tables
                for entry in ledger_record(viz.viewer.insights, position, state).rows:
                    if entry.request == request:
                        assert entry.name.startswith(f"request {request}")
                        assert entry.name == names.request(request, entry.seqs)
                        ledgered += name in entry.name
        finally:
            viz.close()
    assert several >= 2  # the v0 story's forks and the n = 2 samples name their sequence
    assert ledgered >= 2  # the swapped and the recomputed requests, in the ledger


@pytest.mark.anyio
async def test_the_tui_names_the_cards_request_in_its_table_as_the_card_does(story_trace_path):
    for story, trace in _stories(story_trace_path).items():
        app = BlockvizApp(trace=trace, deterministic=True, play=False, guided=True)
        async with app.run_test(size=(200, 60)) as pilot:
            timeline = app.player.timeline
            for card in app.player.scan_guide().cards:
                if not card.seqs:
                    continue
                timeline.seek(card.position)
                app.render_views()
                await pilot.pause()
                name = RequestNames(timeline.state)(card.seqs[:1])
                assert name in " ".join(screen_text(app).split())  # the card's words
                assert any(line.lstrip("▶ ").startswith(f"{name} · ") for line in drawn(app.query_one(BlockTables))), \
                    (story, card.idea, name)

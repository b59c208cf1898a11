"""The Viewer (blockviz/model/viewer.py): one place assembles the timeline, player, guide and insights
for the TUI and the notebook. With cards (the notebook) the guide's card shows at each stop while
playback passes them; guided (the TUI's --guided) playback stops on each."""

from __future__ import annotations

import pytest

from blockviz.jupyter import Visualizer
from blockviz.model.design import KV_DESIGNS
from blockviz.model.guide import GUIDE_KINDS
from blockviz.model.player import SPEEDS
from blockviz.model.trace import load_trace
from blockviz.model.viewer import Viewer
from blockviz.model.view import card_record
from blockviz.tui.app import BlockvizApp


def test_cards_show_at_each_stop_and_playback_passes_them_unless_guided():
    trace = load_trace("fork-cow")
    shown = Viewer.from_trace(trace, cards=True)
    guided = Viewer.from_trace(trace, guided=True)
    # the opening card is where playback starts; guided play stops at the first card after it
    opening, first = guided.player.scan_guide().cards[:2]
    assert opening.position == guided.timeline.position < first.position
    for viewer in (shown, guided):
        viewer.player.speed_index = SPEEDS.index(1000.0)
        viewer.player.toggle_play()
        while viewer.player.playing:
            viewer.player.tick(10.0)
    assert guided.timeline.position == first.position and guided.card == first
    assert shown.timeline.at_end  # played past every card
    shown.timeline.seek(first.position)
    assert shown.card == first and Viewer.from_trace(trace).card is None  # no guide: no card


def test_breakpoints_chosen_or_the_guides_kinds_or_none():
    trace = load_trace("swap")
    assert Viewer.from_trace(trace).player.break_on == frozenset()
    defaults = Viewer.from_trace(trace, default_breaks=True).player
    assert defaults.break_on == GUIDE_KINDS and not defaults.play_stops_at_breaks
    chosen = Viewer.from_trace(trace, break_on=frozenset(GUIDE_KINDS) - {next(iter(GUIDE_KINDS))},
                               default_breaks=True).player
    assert chosen.play_stops_at_breaks and chosen.break_on < GUIDE_KINDS
    assert Viewer.from_trace(load_trace("v1-story")).design is KV_DESIGNS["v1"]


def test_the_notebook_draws_its_viewers_card():
    viz = Visualizer.from_trace("swap")
    try:
        assert viz.insight.insights is viz.viewer.insights and viz.player is viz.viewer.player
        stop = viz.player.scan_guide().cards[0].position
        viz.seek(stop)
        card = viz.player.card
        assert viz.frame()["card"] == card_record(card, viz.player.guide.counter(card)) is not None
        assert viz.frame()["card"]["counter"] == "card 1 of 2"  # a replay knows how many cards it has
    finally:
        viz.close()


@pytest.fixture
def anyio_backend():
    return "asyncio"


@pytest.mark.anyio
async def test_the_tui_holds_a_viewer():
    app = BlockvizApp(trace=load_trace("swap"), deterministic=True, play=False)
    async with app.run_test(size=(120, 40)):
        assert isinstance(app.viewer, Viewer)
        assert app.player is app.viewer.player and app.insights is app.viewer.insights
        assert app.player.guide is None and app.player.break_on == GUIDE_KINDS  # not guided: no card

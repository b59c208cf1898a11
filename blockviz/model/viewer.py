"""`Viewer`: what every front end watches a run through, assembled in one place: the Timeline (events,
the reducer state at a cursor, time travel), the Player over it (playback, breakpoints, the guide and
its cards), and the Insights following it (explainer, ledger, memory series), all for one run's
header. The TUI (blockviz/tui/app.py) and the notebook (blockviz/jupyter/visualizer.py) each build one
and draw what it holds; neither assembles these itself.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from blockviz.model.design import KVDesign, design_of, kv_manager_of
from blockviz.model.guide import Card, Guide
from blockviz.model.insights import Insights
from blockviz.model.player import Player
from blockviz.model.timeline import LIVE_MAX_EVENTS, Timeline
from engine import events as ev


@dataclass(slots=True)
class Viewer:
    """One run's timeline, its player and its insights (see the module docstring)."""

    header: dict[str, Any]
    timeline: Timeline
    player: Player
    insights: Insights

    @classmethod
    def for_timeline(cls, header: dict[str, Any], timeline: Timeline, *, live: bool = False, cards: bool = False,
                     guided: bool = False, break_on: frozenset[type[ev.Event]] = frozenset(),
                     default_breaks: bool = False) -> "Viewer":
        """A viewer over `timeline` (a run with this `header`). `live`: the timeline grows as an
        engine steps. `cards`: the player keeps the guide (blockviz/model/guide.py), so `card` is the
        guide's card at the cursor; `guided`: playback also stops at each card. `break_on`: the
        chosen breakpoints; without them, `default_breaks` has `]` play to the guide's kinds (a fork,
        copy-on-write, hit, swap, eviction) without stopping playback there."""
        player = Player(timeline, live=live)
        if break_on:
            player.break_on = break_on
        elif default_breaks:
            player.default_breaks()
        if cards or guided:
            player.guide = Guide(kv_manager_of(header), opening=guided, header=header)
            player.guided = guided
        return cls(header, timeline, player, Insights.for_header(header))

    @classmethod
    def from_trace(cls, trace, **options: Any) -> "Viewer":
        """A viewer replaying a Trace (blockviz.model.trace); `options` as for_timeline's."""
        return cls.for_timeline(trace.header, Timeline.for_trace(trace), live=False, **options)

    @classmethod
    def live(cls, header: dict[str, Any], max_events: int | None = LIVE_MAX_EVENTS, **options: Any) -> "Viewer":
        """A viewer of a live engine's run (its session's `header`), keeping its last `max_events`
        events (None: all); `options` as for_timeline's."""
        return cls.for_timeline(header, Timeline.for_header(header, max_events=max_events), live=True, **options)

    @property
    def design(self) -> KVDesign:
        """What the run's KV-cache design does (blockviz.model.design)."""
        return design_of(self.header)

    @property
    def card(self) -> Card | None:
        """The guide's card at the cursor while playback rests (Player.card)."""
        return self.player.card

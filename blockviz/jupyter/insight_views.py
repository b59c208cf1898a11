"""The Visualizer's insight views and breakpoints: what a picture of the pools does not say.

`InsightPanel` keeps a blockviz.model.insights.Insights fed from the Visualizer's timeline (lazily: only
the events it has not seen) and adds to each frame the parts of the views being looked at: the
prefix-lookup explainer, the preemption ledger and memory truth sit in an accordion, collapsed at
first, and a part is computed only for the open section or a view displayed on its own
(`viz.ledger_view` as a cell's last expression). The breakpoints bar (tick kinds, "◂ previous",
"next ▸") is always there: it sets the Player's break_on, so playback stops at those kinds as the
TUI's does, and its buttons call `Visualizer.back_to` / `Visualizer.run_until`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Iterable

import ipywidgets

from blockviz.model.insight_view import chosen_lookup, explain_record, ledger_record, memory_record
from blockviz.jupyter.widgets import BreakpointsView, ExplainView, LedgerView, MemoryView
from engine import events as ev

if TYPE_CHECKING:
    from blockviz.jupyter.visualizer import Visualizer

TITLES = ("Prefix lookup (why it hit or missed)", "Preemption ledger", "Memory: blocks vs tokens")
INSIGHT_PARTS = ("explain", "ledger", "memory")


def event_kinds(kinds: str | Iterable[str] | Iterable[type[ev.Event]]) -> frozenset[type[ev.Event]]:
    """The event records named by `kinds` (engine.events.event_classes: one kind, a comma-separated
    list or an iterable of kinds), or `kinds` itself when it already holds records."""
    if not isinstance(kinds, str):
        kinds = list(kinds)
        if kinds and all(isinstance(kind, type) for kind in kinds):
            return frozenset(kinds)
    return ev.event_classes(kinds)


class InsightPanel:
    """The explainer, ledger and memory views in an accordion, and the breakpoints bar, over one
    Visualizer; `parts(names)` computes their frame parts at the cursor (the Visualizer's lock held)."""

    def __init__(self, viz: Visualizer) -> None:
        self.viz = viz
        self.insights = viz.viewer.insights
        self.explain_view, self.ledger_view, self.memory_view = ExplainView(), LedgerView(), MemoryView()
        self.breakpoints_view = BreakpointsView()
        self.picked: str | None = None  # the request the explainer shows, when picked (not a block's)
        self.break_message = ""
        self.accordion = ipywidgets.Accordion(children=[self.explain_view, self.ledger_view, self.memory_view],
                                              titles=TITLES, selected_index=None,
                                              layout=ipywidgets.Layout(width="100%"))
        self.accordion.observe(lambda change: viz._changed(), names="selected_index")
        self.breakpoints_view.observe(self._on_break_on, names="break_on")
        for view in self.sections:
            view.on_display = lambda: viz.frames.flush()

    @property
    def sections(self) -> tuple:
        return (self.explain_view, self.ledger_view, self.memory_view)

    @property
    def views(self) -> tuple:
        return (*self.sections, self.breakpoints_view)

    def shown(self) -> tuple[str, ...]:
        """The insight parts someone can see: the open section's, and those of views displayed alone."""
        open_index = self.accordion.selected_index
        return tuple(name for index, (name, view) in enumerate(zip(INSIGHT_PARTS, self.sections))
                     if index == open_index or view.displayed_alone)

    def parts(self, names: tuple[str, ...] = INSIGHT_PARTS) -> dict[str, Any]:
        """The frame parts `names` (of INSIGHT_PARTS) at the cursor, and the breakpoints bar's."""
        viz = self.viz
        timeline = viz.timeline
        position = timeline.position
        if names:
            self.insights.sync(timeline)  # only the events it has not seen
        out: dict[str, Any] = {"breaks": {"on": ev.kind_names(viz.player.break_on), "message": self.break_message}}
        if "explain" in names:
            out["explain"] = explain_record(self.insights, position, state=timeline.state, **self.asked(),
                                            events=timeline.events, vocab=timeline.token_texts).to_json()
        if "ledger" in names:
            out["ledger"] = ledger_record(self.insights, position, timeline.state).to_json()
        if "memory" in names:
            out["memory"] = memory_record(self.insights, timeline.state, position).to_json()
        return out

    def asked(self) -> dict[str, Any]:
        """What the explainer is asked to show (explain_record's `request_id` / `seq_id`): the picked
        request, else the selected block's first owner, else nothing (the newest lookup)."""
        if self.picked is not None:
            return {"request_id": self.picked}
        state, selected = self.viz.timeline.state, self.viz.selected
        if selected is None:
            return {}
        owners = state.pools[selected[0]][selected[1]].owners
        return {"seq_id": min(owners)} if owners else {}

    def explain(self, request_id: str | None) -> Any:
        """Show `request_id`'s prefix lookup (None: follow the selected block again); returns its
        blockviz.model.explain.Explanation as of the cursor, or None if it was not allocated by then."""
        viz = self.viz
        with viz._lock:
            self.picked = None if request_id is None else str(request_id)
            self.insights.sync(viz.timeline)
            found = chosen_lookup(self.insights, viz.position, state=viz.timeline.state, **self.asked())
        viz._changed()
        return found

    def ledger(self) -> list:
        """The preemptions by the cursor (blockviz.model.insights.Preemption: victim, mode, blocks,
        tokens lost, steps until resumed), what the ledger view draws."""
        with self.viz._lock:
            self.insights.sync(self.viz.timeline)
            return self.insights.ledger(self.viz.position)

    def go_to_break(self, direction: str) -> ev.Event | None:
        """The breakpoints bar's buttons: back to the previous, or on to the next, event of a ticked
        kind; says where it stopped (or that there is none) in the bar."""
        viz = self.viz
        kinds = viz.player.break_on
        if not kinds and viz.player.guided and direction == "next":  # guided, nothing ticked: the next card
            card = viz.next_card()
            self.break_message = f"{card.title} (event {viz.position})" if card is not None else "no further card: at the end"
            viz._changed()
            return None
        if not kinds:
            self.break_message = "tick an event kind first"
            viz._changed()
            return None
        event = viz.back_to(kinds) if direction == "previous" else viz.run_until(kinds)
        names = ", ".join(ev.kind_names(kinds))
        if event is None:
            self.break_message = f"no earlier {names}" if direction == "previous" else f"no later {names}: at the end"
        else:
            self.break_message = f"stopped at event {viz.position}: {event.type}"
        viz._changed()
        return event

    def _on_break_on(self, change: dict) -> None:
        self.viz.player.break_on = event_kinds(change["new"]) if change["new"] else frozenset()
        self.viz._changed()

"""The Visualizer's insight views and breakpoints: what a picture of the pools does not say.

`InsightPanel` keeps a blockviz.model.insights.Insights fed from the Visualizer's timeline (lazily: only
the events it has not seen) and adds to each frame the parts of the views being looked at: the
prefix-lookup explainer, the preemption ledger and memory truth sit in an accordion, collapsed at
first (a radix-tree run adds SGLang's tree, blockviz.model.radix_view, open at first), and a part is computed only for the open section or a view displayed on its own
(`viz.ledger_view` as a cell's last expression). The breakpoints bar (tick kinds, "◂ previous",
"next ▸") is always there: it sets the Player's break_on, so playback stops at those kinds as the
TUI's does, and its buttons call `Visualizer.back_to` / `Visualizer.run_until`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Iterable

import ipywidgets

from blockviz.model.insight_view import chosen_lookup, explain_record, ledger_record, memory_record
from blockviz.jupyter.widgets import BreakpointsView, ExplainView, LedgerView, MemoryView, RadixView
from blockviz.model.radix_view import eviction_policy, radix_record
from engine import events as ev

if TYPE_CHECKING:
    from blockviz.jupyter.visualizer import Visualizer

TITLES = ("Prefix lookup (why it hit or missed)", "Preemption ledger", "Memory: blocks vs tokens")
INSIGHT_PARTS = ("explain", "ledger", "memory")
RADIX_TITLE = "Radix tree (SGLang RadixCache)"  # a fourth section in a radix-tree run, open at first


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
        self.radix_view = RadixView()
        self.has_tree = viz.timeline.state.design.radix_tree  # SGLang's radix tree to draw
        self.picked: str | None = None  # the request the explainer shows, when picked (not a block's)
        self.break_message = ""
        tree = [self.radix_view] if self.has_tree else []
        self.accordion = ipywidgets.Accordion(children=[self.explain_view, self.ledger_view, self.memory_view, *tree],
                                              titles=TITLES + ((RADIX_TITLE,) if tree else ()),
                                              selected_index=len(TITLES) if tree else None,
                                              layout=ipywidgets.Layout(width="100%"))
        self.accordion.observe(lambda change: viz._changed(), names="selected_index")
        self.breakpoints_view.observe(self._on_break_on, names="break_on")
        for view in (*self.sections, self.radix_view):
            view.on_display = lambda: viz.frames.flush()

    @property
    def sections(self) -> tuple:
        return (self.explain_view, self.ledger_view, self.memory_view)

    @property
    def views(self) -> tuple:
        return (*self.sections, self.radix_view, self.breakpoints_view)

    def shown(self) -> tuple[str, ...]:
        """The insight parts someone can see: the open section's, and those of views displayed alone
        ("radix" too in a radix-tree run)."""
        open_index = self.accordion.selected_index
        names, views = INSIGHT_PARTS + ("radix",), (*self.sections, self.radix_view)
        return tuple(name for index, (name, view) in enumerate(zip(names, views))
                     if index == open_index or view.displayed_alone)

    def parts(self, names: tuple[str, ...] = INSIGHT_PARTS) -> dict[str, Any]:
        """The frame parts `names` (of INSIGHT_PARTS, and "radix" in a radix-tree run) at the cursor,
        and the breakpoints bar's."""
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
        if "radix" in names and self.has_tree:
            card = viz.viewer.card
            out["radix"] = radix_record(timeline.state, self.insights.radix, position, event=timeline.current_event,
                                        about_seqs=card.seqs if card is not None else (), vocab=timeline.token_texts,
                                        policy=eviction_policy(viz.header)).to_json()
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

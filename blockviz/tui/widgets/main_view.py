"""The main view: the pools on the left; on the right the selected block's inspector over one of
seven views, eight in a radix-tree run (the app's `right_view`, v cycles). Draws the reducer state at a
timeline's cursor."""

from __future__ import annotations

from functools import cached_property

from textual.app import ComposeResult
from textual.containers import Horizontal, Vertical

from blockviz.model.names import RequestNames
from blockviz.model.timeline import Timeline
from blockviz.model.view import pool_counts, touched_blocks, v1_notes
from blockviz.model.insights import Insights, MemoryTruth
from blockviz.tui.widgets.event_log import EventLogPanel
from blockviz.tui.widgets.insight_panels import ExplainPanel, LedgerPanel, MemoryPanel
from blockviz.tui.widgets.panels import BlockInspector, BlockTables, GeneratedText, HashChains
from blockviz.tui.widgets.pool_grid import FreeQueueRow, PoolGrid
from blockviz.tui.widgets.radix_panel import RadixPanel

RIGHT_VIEWS = ("tables", "text", "hashes", "log", "explain", "ledger", "memory", "radix")  # radix: a radix-tree run's only


class MainView(Horizontal):
    """The pool grids and the panels beside them ("attributes down": the app calls `show_*`)."""

    def compose(self) -> ComposeResult:
        with Vertical(id="left"):
            yield PoolGrid("gpu", id="gpu")
            yield FreeQueueRow(id="free-queue")  # vLLM v1 only
            yield PoolGrid("cpu", id="cpu")
        with Vertical(id="right"):
            yield BlockInspector(id="inspector")
            yield BlockTables(id="tables", classes="view")
            yield GeneratedText(id="text", classes="view")
            yield HashChains(id="hashes", classes="view")
            yield EventLogPanel(id="log", classes="view")
            yield ExplainPanel(id="explain", classes="view")
            yield LedgerPanel(id="ledger", classes="view")
            yield MemoryPanel(id="memory", classes="view")
            yield RadixPanel(id="radix", classes="view")

    @property
    def grids(self) -> list[PoolGrid]:
        return list(self.query(PoolGrid))

    @cached_property
    def _panels(self) -> tuple[BlockTables, GeneratedText, HashChains, BlockInspector, EventLogPanel]:
        return (self.query_one(BlockTables), self.query_one(GeneratedText), self.query_one(HashChains),
                self.query_one(BlockInspector), self.query_one(EventLogPanel))

    def show_view(self, view: str) -> None:
        """Show `view` (one of RIGHT_VIEWS) under the inspector; a wide terminal shows them all."""
        for name in RIGHT_VIEWS:
            self.query_one(f"#{name}").set_class(name == view, "-shown")

    def show_pools(self, timeline: Timeline, marked: dict[str, frozenset[int]] | None = None,
                   ideas: tuple[str, ...] = (), focus: bool = False, compact: bool = False) -> dict[str, tuple[int, int, int]]:
        """Both pools at the cursor, the blocks the last event touched marked (or `marked`: a guide
        card's blocks, `ideas` its ideas: the note they are about first); returns pool_counts.
        `focus`: each pool draws only the rows holding the `marked` blocks (PoolGrid.focus_on), a
        pool holding none is hidden; `compact`: in one-line cells."""
        state = timeline.state
        touched = marked if marked is not None else touched_blocks(timeline.current_event)
        counts = pool_counts(state)
        notes = v1_notes(state, ideas)
        for grid in self.grids:
            named = (marked or {}).get(grid.device, frozenset())
            grid.compact = compact
            grid.focus_on(named if focus and named else None)
            grid.set_class(focus and not named, "-unnamed")
            used, cached, free = counts[grid.device]
            grid.show(state, touched.get(grid.device, frozenset()),
                      title=f"{grid.device.upper()} pool · {used}/{used + cached + free} used",
                      note="\n".join(notes.values()) if grid.device == "cpu" else "")
            if marked is not None:  # a card: the blocks it names scrolled into view (once per card)
                grid.bring_into_view(marked.get(grid.device, frozenset()))
        for row in self.query(FreeQueueRow):
            row.show(state)
        return counts

    def show_panels(self, timeline: Timeline, selection: tuple[str, int] | None, seq_id: int | None,
                    insights: Insights, truth: MemoryTruth, marked: frozenset[tuple[str, int]] = frozenset(),
                    about: tuple[int, ...] = ()) -> None:
        """The inspector of `selection`, and the views (`seq_id` highlighted) at the cursor;
        `insights` synced with the timeline, `truth` the memory figures at the cursor; `marked`
        (device, number) blocks are pointed at in the block tables (a guide card's), the table of
        the first sequence in `about` (the card's) scrolled into view."""
        state, vocab, position = timeline.state, timeline.token_texts, timeline.position
        tables, text, hashes, inspector, log = self._panels
        tables.show(state, seq_id, vocab, marked, about)
        text.show(state, seq_id)
        hashes.show(state, timeline.current_event, vocab)
        inspector.show(state, selection, vocab)
        log.show(timeline.events, position, vocab, RequestNames(state))
        self.query_one(ExplainPanel).show(insights, state, position, seq_id, timeline.events, vocab)
        self.query_one(LedgerPanel).show(insights, position, state)
        self.query_one(MemoryPanel).show(insights, state, truth, position)
        if state.design.radix_tree:
            self.query_one(RadixPanel).show(insights, state, position, timeline.current_event, about, vocab)

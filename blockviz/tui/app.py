"""The blockviz TUI: a thin App over a Timeline (blockviz/model/timeline.py) and the views (widgets/).

A live run (`blockviz run`) drives a Bridge (blockviz/tui/bridge.py) in a Textual thread worker; a
replay (`blockviz replay`) reads a Trace (blockviz/model/trace.py) and never imports torch. Either way the
views draw only the reducer's state at the timeline's cursor, so stepping, playing and time travel
are the same code for both. Playback policy (frame timers, throughput mode, the garbage collector)
lives in the PlaybackController (controller.py), which the App gets once the timeline exists.
"""

from __future__ import annotations

from functools import partial
from pathlib import Path
from typing import Any, Iterable

from textual import events
from textual.app import App, ComposeResult, SystemCommand
from textual.containers import Vertical
from textual.reactive import reactive
from textual.screen import Screen
from textual.widgets import Footer, Label, LoadingIndicator, Static

from blockviz.model.timeline import LIVE_MAX_EVENTS, Timeline
from blockviz.model.player import Player
from blockviz.model.insights import Insights, ledger_totals, memory_truth
from blockviz.model.design import design_of
from blockviz.model.narration import end_of_trace_note, narrate, narrate_step, step_label
from blockviz.model.viewer import Viewer
from blockviz.model.safe_text import safe_line, safe_text
from blockviz.model.trace import Trace, engine_title
from blockviz.session.scenario import story_cards
from blockviz.tui.bridge import Bridge
from blockviz.tui.controller import GcPolicy, PlaybackController
from blockviz.tui.messages import (BlockSelected, EngineDied, EngineEvents, EngineFailed, EngineIdle,
                                   EngineLoading, EngineNotice, EngineReady, posting_listener)
from blockviz.tui.widgets.guide_card import GuideCard
from blockviz.model.insight_view import memory_fields
from blockviz.model.radix_view import eviction_policy
from blockviz.tui.widgets.main_view import RIGHT_VIEWS, MainView
from blockviz.tui.widgets.panels import StatusBar, TitleBar
from blockviz.tui.widgets.pool_grid import PoolGrid
from blockviz.tui.widgets.radix_panel import RadixPanel
from blockviz.tui.keys import KEYS, LIVE_ACTIONS, PAUSING_MOVES, PLAYBACK_ACTIONS, V0_ONLY_ACTIONS, key_rows
from blockviz.tui.live_actions import BreakpointActions, LiveActions
from blockviz.tui.widgets.screens import HelpScreen
from engine.events import StepFinished

MIN_SIZE = (80, 24)
WIDE = 160  # columns from which every panel is shown at once, and pool cells are big
# Below this many rows a guide card is drawn whole and the pools only their rows holding the card's
# blocks (a pool naming none is hidden), with the status bar down to its first line; below
# COMPACT_ROWS those rows are one-line cells even in projector mode: the card and all its blocks
# on one screen at 80x24.
CARD_FOCUS_ROWS = 40
COMPACT_ROWS = 30
LOADING_FIRST = "starting the engine process…"  # until the engine says what it loads


class BlockvizApp(LiveActions, BreakpointActions, App[None]):
    """Watch a paged-KV engine's blocks: live (`bridge`) or from a trace (`trace`)."""

    CSS_PATH = Path(__file__).with_name("app.tcss")  # absolute, so subclasses elsewhere find it
    TITLE = "blockviz"
    AUTO_FOCUS = "#gpu"
    HORIZONTAL_BREAKPOINTS = [(0, "-too-narrow"), (MIN_SIZE[0], "-normal"), (WIDE, "-wide")]
    VERTICAL_BREAKPOINTS = [(0, "-too-short"), (MIN_SIZE[1], "-tall")]

    BINDINGS = KEYS

    projector: reactive[bool] = reactive(False)
    right_view: reactive[str] = reactive("tables")

    def __init__(self, *, trace: Trace | None = None, bridge: Bridge | None = None, projector: bool = False,
                 deterministic: bool = False, source_name: str = "", play: bool | None = None,
                 break_on: frozenset[str] = frozenset(), guided: bool = False,
                 keep_events: int | None = LIVE_MAX_EVENTS) -> None:
        if (trace is None) == (bridge is None):
            raise ValueError("BlockvizApp needs exactly one of trace= (replay) or bridge= (live)")
        super().__init__()
        self.trace = trace
        self.bridge = bridge
        self.deterministic = deterministic
        self.source_name = source_name
        self.autoplay = bridge is not None if play is None else play  # live runs play once ready
        self.break_on = break_on  # event kinds playback stops at (chosen); else ] plays to the guide's kinds
        self.guided = guided  # playback stops at each idea's first occurrence with a card (blockviz/model/guide.py)
        self.keep_events = keep_events  # a live timeline's cap (None: keep every event)
        self.controller: PlaybackController | None = None  # once the timeline exists
        self.viewer: Viewer | None = None  # the timeline, its player and insights (blockviz/model/viewer.py)
        self.header: dict[str, Any] = dict(trace.header) if trace is not None else {}
        self.selection: tuple[str, int] | None = None
        self.selected_seq: int | None = None
        self.error: str | None = None
        self.engine_died = False  # the engine stopped mid-run: the app exits 1 with self.error
        self.note = ""
        self._said_dropped = False
        self._gc = GcPolicy()
        self._rows: int | None = None  # the terminal's height, from the last resize
        self.set_reactive(BlockvizApp.projector, projector)

    @property
    def player(self) -> Player | None:
        """Playback over the timeline (None while a live engine loads)."""
        return self.viewer.player if self.viewer is not None else None

    @property
    def insights(self) -> Insights | None:
        """The explainer, ledger and memory series over the timeline (None while a live engine loads)."""
        return self.viewer.insights if self.viewer is not None else None

    def compose(self) -> ComposeResult:
        yield TitleBar("blockviz", id="title")
        yield MainView(id="main")
        yield GuideCard(id="card")
        yield Static("", id="engine-error")
        yield StatusBar(id="status")
        yield Footer(compact=True)
        yield Static(f"Enlarge the terminal to at least {MIN_SIZE[0]}x{MIN_SIZE[1]} "
                     f"(projector mode reads best at 100x30 or more).", id="too-small")
        with Vertical(id="loading"):
            yield LoadingIndicator()
            yield Label(LOADING_FIRST, id="loading-text")
            yield Label("the pools appear once the model is loaded · q quits", id="loading-hint")

    def on_mount(self) -> None:
        self._main, self._status, self._card = self.query_one(MainView), self.query_one(StatusBar), self.query_one(GuideCard)
        self.watch_projector(self.projector)
        self.watch_right_view(self.right_view)
        if self.trace is not None:
            self._start(Viewer.from_trace(self.trace, **self._viewer_options()))
        else:
            self.screen.add_class("-loading")
            self.query_one("#title", TitleBar).update(f"blockviz · live · {self.source_name or 'engine'} · loading")
            self.run_worker(self._run_engine, thread=True, name="engine", exit_on_error=False)

    def _viewer_options(self) -> dict[str, Any]:
        """The Viewer's playback options: the chosen breakpoints, else `]` plays to the guide's kinds
        or, guided, to the next card; guided, playback stops at each card (and only then is a card shown)."""
        return {"break_on": self.break_on, "default_breaks": not self.guided, "guided": self.guided}

    def _start(self, viewer: Viewer) -> None:
        self.viewer = viewer
        live = viewer.player.live
        self.controller = PlaybackController(viewer.player, self.bridge,
                                             set_interval=self.set_interval,
                                             draw=lambda full: self.render_views(full),
                                             not_responding=self._engine_not_responding)
        self.screen.remove_class("-loading")
        for loading in self.query("#loading"):  # its spinner would redraw 16 times a second, unseen
            loading.remove()
        self._gc.apply()
        model = self.header.get("model", "?")
        named = self.source_name and self.source_name != model  # a trace file; live runs name the model
        source = f"{'live' if live else 'replay'}{': ' + self.source_name if named else ''}"
        self.query_one("#title", TitleBar).update(f"blockviz · {source} · {engine_title(self.header)}")
        if design_of(self.header).radix_tree:  # SGLang's tree: its panel shown first (v cycles on)
            self.screen.add_class("-radix")
            self.query_one(RadixPanel).policy = eviction_policy(self.header)
            self.right_view = "radix"
        if live and viewer.player.guide is not None:  # a live story counts its cards as a replay does
            viewer.player.guide.expected = story_cards(self.header)
        if self.autoplay and not (live and self.guided):  # guided, a live run opens on card 1: space plays on
            self.controller.set_playing(True)
        self.render_views()

    # ------------------------------------------------------------------ the engine worker (live)

    def _run_engine(self) -> None:
        self.bridge.run(posting_listener(self.post_message))

    def exit(self, result: Any = None, return_code: int = 0, message: Any = None) -> None:
        """Stop the engine worker first: the app's shutdown waits for its thread. After the engine
        died mid-run the app ends with return code 1."""
        if self.bridge is not None:
            self.bridge.stop()
        super().exit(result, 1 if self.engine_died and return_code == 0 else return_code, message)

    def on_unmount(self) -> None:
        if self.bridge is not None:
            self.bridge.stop()
        self._gc.restore()

    def on_engine_loading(self, message: EngineLoading) -> None:
        for label in self.query("#loading-text").results(Label):
            label.update(message.text)

    def on_engine_ready(self, message: EngineReady) -> None:
        self.header = dict(message.header)
        self._start(Viewer.live(self.header, self.keep_events, **self._viewer_options()))
        self.refresh_bindings()  # the footer offers what this run's KV manager can do

    def on_engine_failed(self, message: EngineFailed) -> None:
        self.error = message.error
        self.exit(return_code=2)

    def on_engine_died(self, message: EngineDied) -> None:
        """Keep the picture (time travel still works), say why until the app quits, then exit 1."""
        self.error = message.error
        self.engine_died = True
        self.controller.engine_died()
        self.query_one("#engine-error", Static).update(
            f"{message.error} · the pools show the last events it sent · q quits")
        self.screen.add_class("-engine-died")
        self.render_views()

    def _engine_not_responding(self, stalled: bool) -> None:
        """Playback waits on a live engine that has sent nothing for a while (a stopped or hung
        engine process): say so until it answers; q still quits (the bridge ends the process)."""
        from blockviz.tui.controller import NOT_RESPONDING_S

        if self.engine_died:
            return
        self.query_one("#engine-error", Static).update(
            f"engine not responding: nothing from it for {NOT_RESPONDING_S:g} s · q quits")
        self.screen.set_class(stalled, "-engine-stalled")

    def on_engine_events(self, message: EngineEvents) -> None:
        self.controller.on_events(message.events)

    def on_engine_notice(self, message: EngineNotice) -> None:
        self.notify(message.text, severity="warning")

    def on_engine_idle(self, message: EngineIdle) -> None:
        self.note = "all requests finished: a adds one"
        self.controller.engine_idle()
        self.render_views()

    # ------------------------------------------------------------------ drawing

    def render_views(self, full: bool = True) -> None:
        """Push the state at the cursor down into the views: the pools and the status bar every
        frame; the text panels too unless `full` is False and the controller says they wait. Nothing
        once the app is shutting down (a frame timer may still fire while its widgets are removed)."""
        if self.controller is None or not self.is_running:
            return
        player, insights = self.viewer.player, self.viewer.insights
        timeline = player.timeline
        card = player.card
        marked = {device: card.blocks_on(device) for device in ("gpu", "cpu")} if card is not None else None
        rows = self._rows if self._rows is not None else self.size.height
        focus = card is not None and rows < CARD_FOCUS_ROWS
        self.screen.set_class(focus, "-card-focus")
        counts = self._main.show_pools(timeline, marked, card.ideas if card is not None else (),
                                       focus=focus and bool(card.blocks), compact=focus and rows < COMPACT_ROWS)
        insights.sync(timeline)
        truth = memory_truth(timeline.state, insights.max_tokens)
        if self.controller.frame_drawn(full):
            self._main.show_panels(timeline, self.selection, self.selected_seq, insights, truth,
                                   marked=frozenset(card.blocks) if card is not None else frozenset(),
                                   about=card.seqs if card is not None else ())
        self._card.show(card, player.guide.counter(card) if card is not None else "")
        self.screen.set_class(card is not None and bool(card.seqs), "-card-tables")  # projector: its tables
        note = end_of_trace_note(timeline.state) if not player.live and timeline.at_end and len(timeline) else self.note
        if timeline.dropped_events:  # a long live session's cap: said on the status line, and once in full
            note = " · ".join(filter(None, (timeline.dropped_note(brief=True), note)))
            if not self._said_dropped:
                self._said_dropped = True
                self.notify(timeline.dropped_note() + " (run --keep-events N keeps more)", timeout=8)
        if card is not None:
            note = ""  # the card says it
        elif player.at_break:
            note = player.break_note()
        elif (inside := timeline.operation_at()) is not None:  # `.` stepped into an engine operation
            note = inside.label(timeline.position)
        self._status.show(
            timeline.state, position=timeline.position, total=len(timeline), playing=player.playing,
            speed=player.speed_label, tokens_per_s=timeline.tokens_per_second(),
            deterministic=self.deterministic, live=player.live, note=note, counts=counts,
            narration=self._narration(timeline, player, card is not None), memory=memory_fields(truth),
            ledger=ledger_totals(insights.ledger(timeline.position)), step=step_label(timeline))

    @staticmethod
    def _narration(timeline: Timeline, player: Player, at_card: bool = False) -> str:
        """Playing, at a step's end (`s`) or at a card (which tells the event): what the step did
        so far; one event at a time: that event."""
        event = timeline.current_event
        if player.playing or at_card or isinstance(event, StepFinished):
            return narrate_step(timeline)
        return narrate(event, timeline.state, timeline.token_texts)

    def notify(self, message: str, *, title: str = "", severity: str = "information",
               timeout: float | None = None, markup: bool = True) -> None:
        """One toast at a time: a new one replaces the one shown. A toast may quote data (an
        engine's refusal of a prompt): its control characters are written visibly (safe_text.py)."""
        self.clear_notifications()
        super().notify(safe_text(message), title=safe_line(title), severity=severity, timeout=timeout, markup=markup)

    def _moved(self) -> None:
        self.note = ""
        self.controller.feed_engine()
        self.render_views()

    # ------------------------------------------------------------------ messages from the views

    def on_block_selected(self, message: BlockSelected) -> None:
        self.selection = (message.device, message.number)
        for grid in self._main.grids:
            if grid.device != message.device:
                grid.selected = None
        owners = sorted(self.player.timeline.state.pools[message.device][message.number].owners)
        if owners:
            self.selected_seq = owners[0]
        self.render_views()

    # ------------------------------------------------------------------ actions (bindings)

    def check_action(self, action: str, parameters: tuple[object, ...]) -> bool | None:
        """Moving through the timeline waits for it (None: shown, disabled); a replay has no engine
        to act on, so the live keys are not offered (False: hidden), nor v0's fork and swap in a v1 run."""
        if action in LIVE_ACTIONS and self.bridge is None:
            return False
        if action in V0_ONLY_ACTIONS and not design_of(self.header).fork_and_preempt_commands:
            return False
        return None if action in PLAYBACK_ACTIONS and self.controller is None else True

    def action_toggle_play(self) -> None:
        self.controller.toggle_play()
        self.render_views(full=not self.player.playing)  # playing: the next frames draw the rest

    def action_travel(self, move: str) -> None:
        """Move the cursor with the Player's `move` (step_engine, step_event, back_step, back_event,
        to_start, to_end, faster, slower; going back pauses playback first), and redraw."""
        if move in PAUSING_MOVES:
            self.controller.set_playing(False)
        getattr(self.player, move)()
        self._moved()

    def action_next_view(self) -> None:
        views = RIGHT_VIEWS if self.screen.has_class("-radix") else tuple(v for v in RIGHT_VIEWS if v != "radix")
        self.right_view = views[(views.index(self.right_view) + 1) % len(views)]

    def watch_right_view(self, view: str) -> None:
        self.query_one(MainView).show_view(view)
        self.render_views()

    def action_toggle_projector(self) -> None:
        self.projector = not self.projector

    def watch_projector(self, projector: bool) -> None:
        self.screen.set_class(projector, "-projector")
        for grid in self.query(PoolGrid):
            grid.projector = projector
        self.render_views()

    def on_resize(self, event: events.Resize) -> None:
        """Big cells from WIDE columns. The event's size, not self.size: App's own resize handler,
        which records the new size, runs after this one."""
        for grid in self.query(PoolGrid):
            grid.big = event.size.width >= WIDE
        if self._rows != event.size.height:
            self._rows = event.size.height
            self.render_views()  # a card's focus depends on the height

    def get_system_commands(self, screen: Screen) -> Iterable[SystemCommand]:
        """The command palette offers every binding too, by its description."""
        yield from super().get_system_commands(screen)
        for binding, (keys, description) in zip(self.BINDINGS, key_rows(self.BINDINGS)):
            yield SystemCommand(description, f"key {keys}", partial(self.run_action, binding.action))

    def action_help(self) -> None:
        wide = any(grid.big_cells for grid in self.query(PoolGrid))  # the legend in the marks the pool draws
        self.push_screen(HelpScreen(key_rows(self.BINDINGS) + [
            ("arrows / click", "select a block in the focused pool"), ("tab", "next panel"),
            ("z / Z", "a big pool (a cell per N blocks): zoom into the selected block's cell / out to the whole pool"),
            ("ctrl+p", "command palette")], wide=wide))

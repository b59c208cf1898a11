"""The blockviz TUI: a thin App over a Timeline (blockviz/history.py) and the views (blockviz/widgets).

A live run (`blockviz run`) drives an EngineBridge (blockviz/live.py) in a Textual thread worker; a
replay (`blockviz replay`) reads a Trace (blockviz/trace.py) and never imports torch. Either way the
views draw only the reducer's state at the timeline's cursor, so stepping, playing and time travel
are the same code for both.
"""

from __future__ import annotations

import gc
import math
import time
from functools import partial
from pathlib import Path
from typing import Any, Iterable

from textual import events
from textual.app import App, ComposeResult, SystemCommand
from textual.binding import Binding
from textual.containers import Horizontal, Vertical
from textual.reactive import reactive
from textual.screen import Screen
from textual.widgets import Footer, Label, LoadingIndicator, Static

from blockviz.history import Player, Timeline
from blockviz.narration import narrate
from blockviz.messages import (
    BlockSelected,
    EngineEvents,
    EngineDied,
    EngineFailed,
    EngineIdle,
    EngineLoading,
    EngineNotice,
    EngineReady,
)
from blockviz.widgets.event_log import EventLogPanel
from blockviz.widgets.palette import pool_counts, touched_blocks
from blockviz.widgets.panels import BlockInspector, BlockTables, GeneratedText, HashChains, StatusBar
from blockviz.widgets.pool_grid import PoolGrid
from blockviz.widgets.screens import AddRequestScreen, HelpScreen

RIGHT_VIEWS = ("tables", "text", "hashes", "log")
FRAME_S = 1 / 30
PANEL_HZ = 5  # text panels' redraw rate during playback (the pools follow every frame)
THROUGHPUT_FPS = 1  # frames/s while a live engine free-runs at max speed (GIL and cores to the engine)
MIN_SIZE = (80, 24)
YOUNG_GC_OBJECTS = 20_000  # the youngest generation's collection threshold while the app runs
WIDE = 160  # columns from which every panel is shown at once, and pool cells are big
LOADING_FIRST = "starting the engine process…"  # until the engine says what it loads


class BlockvizApp(App[None]):
    """Watch a paged-KV engine's blocks: live (`bridge`) or from a trace (`trace`)."""

    CSS_PATH = Path(__file__).with_name("app.tcss")  # absolute, so subclasses elsewhere find it
    TITLE = "blockviz"
    AUTO_FOCUS = "#gpu"
    HORIZONTAL_BREAKPOINTS = [(0, "-too-narrow"), (MIN_SIZE[0], "-normal"), (WIDE, "-wide")]
    VERTICAL_BREAKPOINTS = [(0, "-too-short"), (MIN_SIZE[1], "-tall")]

    # The footer shows the short descriptions, fitting 80 columns; the help screen and the command
    # palette show the tooltips.
    BINDINGS = [
        Binding("space", "toggle_play", "Play", tooltip="Play/Pause"),
        Binding("s", "step", "Step", tooltip="Step the engine (schedule → run → postprocess)"),
        Binding("b", "back_step", "Back", tooltip="Step back (to the previous engine step)"),
        Binding("full_stop", "step_event", "Event", key_display=".", tooltip="One event forward"),
        Binding("comma", "back_event", "◂ Event", key_display=",", show=False, tooltip="One event back"),
        Binding("question_mark,f1", "help", "Help", key_display="?", tooltip="Help (keys, legend, glossary)"),
        Binding("a", "add_request", "Add", tooltip="Add a request (live)"),
        Binding("f", "fork", "Fork", tooltip="Fork the selected sequence (live)"),
        Binding("p", "preempt", "Swap", tooltip="Swap out the selected sequence's request (live)"),
        Binding("P", "toggle_projector", "Projector", show=False, tooltip="Projector mode"),
        Binding("plus,equals_sign", "faster", "Faster", key_display="+", show=False, tooltip="Play faster"),
        Binding("minus", "slower", "Slower", key_display="-", show=False, tooltip="Play slower"),
        Binding("g", "to_start", "Go to start", show=False, tooltip="Go to the first event"),
        Binding("G", "to_end", "Go to end", show=False, tooltip="Go to the last event"),
        Binding("n", "next_sequence", "Next sequence", show=False, tooltip="Select the next sequence"),
        Binding("v", "next_view", "Next view", show=False, tooltip="Next view on the right"),
        Binding("q", "quit", "Quit", tooltip="Quit (also while the engine loads)"),
        Binding("ctrl+c", "quit", "Quit", show=False, tooltip="Quit"),
    ]

    projector: reactive[bool] = reactive(False)
    right_view: reactive[str] = reactive("tables")

    def __init__(self, *, trace: Any = None, bridge: Any = None, projector: bool = False,
                 deterministic: bool = False, source_name: str = "", play: bool | None = None) -> None:
        if (trace is None) == (bridge is None):
            raise ValueError("BlockvizApp needs exactly one of trace= (replay) or bridge= (live)")
        super().__init__()
        self.trace = trace
        self.bridge = bridge
        self.deterministic = deterministic
        self.source_name = source_name
        self.autoplay = bridge is not None if play is None else play  # live runs play once ready
        self.player: Player | None = None
        self.header: dict[str, Any] = dict(trace.header) if trace is not None else {}
        self.selection: tuple[str, int] | None = None
        self.selected_seq: int | None = None
        self.error: str | None = None
        self.engine_died = False  # the engine stopped mid-run: the app exits 1 with self.error
        self.note = ""
        self._last_tick = 0.0
        self._panels_drawn = 0.0
        self._dirty = False
        self._gc_threshold: tuple[int, ...] | None = None  # the process's, while this app runs
        self.set_reactive(BlockvizApp.projector, projector)

    # ------------------------------------------------------------------ layout

    def compose(self) -> ComposeResult:
        yield Static("blockviz", id="title")
        with Horizontal(id="main"):
            with Vertical(id="left"):
                yield PoolGrid("gpu", id="gpu")
                yield PoolGrid("cpu", id="cpu")
            with Vertical(id="right"):
                yield BlockInspector(id="inspector")
                yield BlockTables(id="tables", classes="view")
                yield GeneratedText(id="text", classes="view")
                yield HashChains(id="hashes", classes="view")
                yield EventLogPanel(id="log", classes="view")
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
        self._grids = list(self.query(PoolGrid))
        self._tables = self.query_one(BlockTables)
        self._text = self.query_one(GeneratedText)
        self._hashes = self.query_one(HashChains)
        self._inspector = self.query_one(BlockInspector)
        self._log = self.query_one(EventLogPanel)
        self._status = self.query_one(StatusBar)
        self.screen.set_class(self.projector, "-projector")
        for grid in self.query(PoolGrid):
            grid.projector = self.projector
        self.watch_right_view(self.right_view)
        self._ticker = self.set_interval(FRAME_S, self._tick, pause=True)
        # While a live engine free-runs at max speed the views follow once a second: drawn when a
        # batch arrives and a frame is due, else woken by a timer of their own. Every wake-up of
        # this process takes CPU from the engine's.
        self._slow_ticker = self.set_interval(1 / THROUGHPUT_FPS, self._tick, pause=True)
        if self.trace is not None:
            self._start(Timeline.for_trace(self.trace), live=False)
        else:
            self.screen.add_class("-loading")
            self.query_one("#title", Static).update(f"blockviz · live · {self.source_name or 'engine'} · loading")
            self.run_worker(self._run_engine, thread=True, name="engine", exit_on_error=False)

    def _start(self, timeline: Timeline, live: bool) -> None:
        self.player = Player(timeline, live=live)
        self.screen.remove_class("-loading")
        for loading in self.query("#loading"):  # its spinner would redraw 16 times a second, unseen
            loading.remove()
        # What exists now (the app, Textual, Rich, the trace's events: ~60,000 objects) lives as
        # long as the app: leave it out of garbage collections, each of which took ~70 ms of CPU
        # in the middle of live runs (benchmarks/tui.py), time the engine's threads wanted.
        gc.collect()
        gc.freeze()
        # A live run at full speed hands the app ~3,000 events a second, each kept for time
        # travel, so a young collection every 700 new objects mostly scans events that survive it
        # anyway: collecting once every YOUNG_GC_OBJECTS took 10-20% less of the app's CPU in a
        # replay of a live run (benchmarks/app_cpu.py), a pause of a few ms when it comes.
        if self._gc_threshold is None:
            self._gc_threshold = gc.get_threshold()
            gc.set_threshold(YOUNG_GC_OBJECTS, *self._gc_threshold[1:])
        h = self.header
        caching = " · prefix caching" if h.get("enable_prefix_caching") else ""
        model = h.get("model", "?")
        named = self.source_name and self.source_name != model  # a trace file; live runs name the model
        source = f"{'live' if live else 'replay'}{': ' + self.source_name if named else ''}"
        self.query_one("#title", Static).update(
            f"blockviz · {source} · {model} · block size {timeline.block_size} · "
            f"{timeline.num_gpu_blocks} GPU / {timeline.num_cpu_blocks} CPU blocks{caching}")
        if self.autoplay:
            self._set_playing(True)
        self.render_views()

    # ------------------------------------------------------------------ the engine worker (live)

    def _run_engine(self) -> None:
        from blockviz.live import Listener

        post = self.post_message
        self.bridge.run(Listener(
            loading=lambda text: post(EngineLoading(text)),
            ready=lambda header: post(EngineReady(header)),
            failed=lambda error: post(EngineFailed(error)),
            died=lambda error: post(EngineDied(error)),
            events=lambda events: post(EngineEvents(events)),
            notice=lambda text: post(EngineNotice(text)),
            idle=lambda: post(EngineIdle()),
        ))

    def exit(self, result: Any = None, return_code: int = 0, message: Any = None) -> None:
        """Stop the engine worker first: the app's shutdown waits for its thread. After the engine
        died mid-run the app ends with return code 1."""
        if self.bridge is not None:
            self.bridge.stop()
        if self.engine_died and return_code == 0:
            return_code = 1
        super().exit(result, return_code, message)

    def on_unmount(self) -> None:
        if self.bridge is not None:
            self.bridge.stop()
        gc.unfreeze()  # what _start froze may be collected again (a process that runs apps in turn)
        if self._gc_threshold is not None:
            gc.set_threshold(*self._gc_threshold)
            self._gc_threshold = None

    def on_engine_loading(self, message: EngineLoading) -> None:
        for label in self.query("#loading-text").results(Label):
            label.update(message.text)

    def on_engine_ready(self, message: EngineReady) -> None:
        h = self.header = dict(message.header)
        self._start(Timeline(h["block_size"], h["num_gpu_blocks"], h["num_cpu_blocks"]), live=True)

    def on_engine_failed(self, message: EngineFailed) -> None:
        self.error = message.error
        self.exit(return_code=2)

    def on_engine_died(self, message: EngineDied) -> None:
        """Keep the picture (time travel still works), say why until the app quits, then exit 1."""
        self.error = message.error
        self.engine_died = True
        if self.player is not None:
            self.player.finished = True
            self._set_playing(False)
        self.query_one("#engine-error", Static).update(
            f"{message.error} · the pools show the last events it sent · q quits")
        self.screen.add_class("-engine-died")
        self.render_views()

    def on_engine_events(self, message: EngineEvents) -> None:
        if self.player is None:
            return
        moved = self.player.on_events(message.events)
        self.bridge.acknowledge(len(message.events))
        if self.player.throughput_mode and time.monotonic() - self._last_tick >= 1 / THROUGHPUT_FPS:
            # A frame is due: the tick draws it now, while this process is awake anyway (and feeds
            # the engine); the slow timer starts over, to draw only if no batch comes for a frame.
            self._dirty = self._dirty or moved
            self._slow_ticker.reset()
            self._tick()
            return
        self._feed_engine()
        if not self.player.playing:
            self.render_views()
        elif moved:
            self._dirty = True  # the next frame draws it

    def on_engine_notice(self, message: EngineNotice) -> None:
        self.notify(message.text, severity="warning")

    def on_engine_idle(self, message: EngineIdle) -> None:
        if self.player is None:
            return
        self.player.finished = True
        self.player.pending = None
        self.note = "all requests finished: a adds one"
        self._set_playing(self.player.playing and not self.player.timeline.at_end)
        self.render_views()

    def _feed_engine(self) -> None:
        """Set the frame timers for playback, and ask a live engine for what playback needs now
        (the backpressure lives in the bridge)."""
        if self.player is None:
            return
        self._sync_tickers()
        if self.bridge is None:
            return
        player = self.player
        self.bridge.set_free_run(player.playing and math.isinf(player.speed) and not player.finished)
        if player.engine_steps_wanted() and self.bridge.outstanding == 0:
            self.bridge.request_steps(1)

    # ------------------------------------------------------------------ drawing

    def render_views(self, full: bool = True) -> None:
        """Push the state at the cursor down into the views: the pools and the status bar every
        frame; the text panels too unless `full` is False (fast playback redraws them at
        PANEL_HZ, so a big run keeps the pool grid at frame rate)."""
        self._dirty = False
        if self.player is None:
            return
        timeline = self.player.timeline
        state = timeline.state
        touched = touched_blocks(timeline.current_event)
        counts = pool_counts(state)
        for grid in self._grids:
            used, cached, free = counts[grid.device]
            grid.show(state, touched.get(grid.device, frozenset()),
                      title=f"{grid.device.upper()} pool · {used}/{used + cached + free} used")
        now = time.monotonic()
        # While a live engine free-runs, the panels wait (a redraw of text panels relayouts the
        # screen); the pools and the status bar keep following. Pausing redraws everything.
        if full or (not self.player.throughput_mode and now - self._panels_drawn >= 1 / PANEL_HZ):
            self._panels_drawn = now
            vocab = timeline.token_texts
            self._tables.show(state, self.selected_seq)
            self._text.show(state, self.selected_seq)
            self._hashes.show(state, timeline.current_event, vocab)
            self._inspector.show(state, self.selection, vocab)
            self._log.show(timeline.events, timeline.position, vocab)
        player = self.player
        note = self.note
        if not player.live and timeline.at_end and len(timeline):
            note = "end of trace"
        self._status.show(
            state, position=timeline.position, total=len(timeline), playing=player.playing,
            speed=player.speed_label, tokens_per_s=timeline.tokens_per_second(),
            deterministic=self.deterministic, live=player.live, note=note, counts=counts,
            narration=narrate(timeline.current_event, state))

    def _tick(self) -> None:
        now = time.monotonic()
        if self.player is None:
            return
        dt, self._last_tick = min(now - self._last_tick, 0.25), now
        moved = self.player.tick(dt)
        if not self.player.playing:
            self._set_playing(False)
        self._feed_engine()
        if moved or self._dirty:
            self.render_views(full=not self.player.playing)

    def _set_playing(self, playing: bool) -> None:
        if self.player is None:
            return
        if playing and not self.player.playing:
            self._last_tick = time.monotonic()
        self.player.playing = playing
        self._feed_engine()

    def _sync_tickers(self) -> None:
        """The frame timer while playing; the slow one instead in throughput mode."""
        player = self.player
        slow = player is not None and player.throughput_mode
        fast = player is not None and player.playing and not slow
        (self._ticker.resume if fast else self._ticker.pause)()
        (self._slow_ticker.resume if slow else self._slow_ticker.pause)()

    def _moved(self, moved: bool = True) -> None:
        self.note = ""
        self._feed_engine()
        self.render_views()

    # ------------------------------------------------------------------ messages from the views

    def on_block_selected(self, message: BlockSelected) -> None:
        self.selection = (message.device, message.number)
        for grid in self.query(PoolGrid):
            if grid.device != message.device:
                grid.selected = None
        if self.player is not None:
            owners = sorted(self.player.timeline.state.pools[message.device][message.number].owners)
            if owners:
                self.selected_seq = owners[0]
        self.render_views()

    # ------------------------------------------------------------------ actions (bindings)

    def action_toggle_play(self) -> None:
        if self.player is not None:
            self._set_playing(self.player.toggle_play())
            self.render_views(full=not self.player.playing)  # playing: the next frames draw the rest

    def action_step(self) -> None:
        if self.player is not None:
            self._moved(self.player.step_engine())

    def action_step_event(self) -> None:
        if self.player is not None:
            self._moved(self.player.step_event())

    def action_back_event(self) -> None:
        if self.player is not None:
            self._set_playing(False)
            self._moved(self.player.back_event())

    def action_back_step(self) -> None:
        if self.player is not None:
            self._set_playing(False)
            self._moved(self.player.back_step())

    def action_to_start(self) -> None:
        if self.player is not None:
            self._set_playing(False)
            self._moved(self.player.to_start())

    def action_to_end(self) -> None:
        if self.player is not None:
            self._moved(self.player.to_end())

    def action_faster(self) -> None:
        if self.player is not None:
            self.player.faster()
            self._moved()

    def action_slower(self) -> None:
        if self.player is not None:
            self.player.slower()
            self._moved()

    def _live_engine(self, what: str) -> bool:
        """True when an engine is attached (and the cursor is brought to the live edge)."""
        if self.bridge is None:
            self.notify(f"Replay: no engine here to {what}. Run `blockviz run` to {what}.",
                        title="Replay", severity="warning")
            return False
        if self.player is None:
            self.notify("The engine is still loading.", severity="warning")
            return False
        if not self.player.timeline.at_end:
            self.player.to_end()
            self.notify("Jumped to the live edge: the engine acts on its present.")
        self.player.follow()
        return True

    def action_add_request(self) -> None:
        if not self._live_engine("add a request"):
            return

        def added(prompt: str | None) -> None:
            if prompt:
                self.player.finished = False
                self.player.follow()
                self.bridge.add_request(prompt)

        self.push_screen(AddRequestScreen(), added)

    def action_fork(self) -> None:
        seq_id = self._selected_sequence()
        if seq_id is None or not self._live_engine("fork a sequence"):
            return
        self.bridge.fork(seq_id)

    def action_preempt(self) -> None:
        seq_id = self._selected_sequence()
        if seq_id is None or not self._live_engine("swap out a request"):
            return
        self.bridge.preempt(self.player.timeline.state.seqs[seq_id].request_id)

    def _selected_sequence(self) -> int | None:
        if self.player is None:
            return None
        seqs = self.player.timeline.state.seqs
        if self.selected_seq in seqs:
            return self.selected_seq
        running = [s for s, seq in sorted(seqs.items()) if seq.status == "running"]
        if running:
            self.selected_seq = running[0]
            return running[0]
        self.notify("No sequence selected: n picks one, or select a block it owns.", severity="warning")
        return None

    def action_next_sequence(self) -> None:
        if self.player is None or not self.player.timeline.state.seqs:
            return
        ids = sorted(self.player.timeline.state.seqs)
        later = [s for s in ids if self.selected_seq is None or s > self.selected_seq]
        self.selected_seq = later[0] if later else ids[0]
        self.render_views()

    def action_select_sequence(self, seq_id: int) -> None:
        self.selected_seq = seq_id
        self.render_views()

    def action_next_view(self) -> None:
        self.right_view = RIGHT_VIEWS[(RIGHT_VIEWS.index(self.right_view) + 1) % len(RIGHT_VIEWS)]

    def watch_right_view(self, view: str) -> None:
        for name in RIGHT_VIEWS:
            self.query_one(f"#{name}").set_class(name == view, "-shown")
        self.render_views()

    def action_toggle_projector(self) -> None:
        self.projector = not self.projector

    def on_resize(self, event: events.Resize) -> None:
        """Big cells from WIDE columns. The event's size, not self.size: App's own resize handler,
        which records the new size, runs after this one."""
        wide = event.size.width >= WIDE
        for grid in self.query(PoolGrid):
            grid.big = wide

    def watch_projector(self, projector: bool) -> None:
        self.screen.set_class(projector, "-projector")
        for grid in self.query(PoolGrid):
            grid.projector = projector
        self.render_views()

    def get_system_commands(self, screen: Screen) -> Iterable[SystemCommand]:
        """The command palette offers every binding too, by its description."""
        yield from super().get_system_commands(screen)
        for binding in self.BINDINGS:
            keys = (binding.key_display or binding.key).replace("question_mark", "?")
            yield SystemCommand(binding.tooltip or binding.description, f"key {keys}",
                                partial(self.run_action, binding.action))

    def action_help(self) -> None:
        rows = []
        for binding in self.BINDINGS:
            keys = binding.key_display or binding.key
            rows.append((keys.replace("question_mark", "?"), binding.tooltip or binding.description))
        rows += [("arrows / click", "select a block in the focused pool"), ("tab", "next panel"),
                 ("ctrl+p", "command palette")]
        self.push_screen(HelpScreen(rows))

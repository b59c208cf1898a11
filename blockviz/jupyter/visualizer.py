"""`Visualizer`: the widgets composed over a timeline of events, from a trace or a live engine.

The model layer is the TUI's: a `Viewer` (blockviz/model/viewer.py) assembles the `Timeline` (events,
the reducer state at a cursor, time travel), the `Player` (play/pause at a speed, the guide's card at
the cursor) and the `Insights`, as the TUI's does. A live run drives a real `LLM`'s engine through an engine session
(blockviz/session/engine_session.py), stepping it when the cursor reaches the end of what is
known, the way `blockviz run` does; it can play a scenario's arrivals (`scenario="story"`).

Threads. Every method called from Python is synchronous: it returns once the engine work is done
and `state` is the state at the new cursor, so a lesson can `viz.step(); assert viz.state...`.
Buttons in the browser are not: their messages arrive on the kernel's main thread and are handed
to one worker thread (play to a thread of its own), so the kernel keeps answering clicks while the
engine generates. One lock guards the engine and the timeline, so a Python call and button-driven
playback never step the engine at the same time. Frames go out at most `MAX_FPS` times a second:
a change inside that window is sent by a timer at its end, with the state as it is then.
"""

from __future__ import annotations

import atexit
import threading
import time
import weakref
from pathlib import Path
from typing import Any, Iterable

import ipywidgets

from blockviz.model.timeline import LIVE_MAX_EVENTS, Timeline
from blockviz.model.viewer import Viewer
from blockviz.model.names import RequestNames
from blockviz.jupyter.buttons import Buttons
from blockviz.jupyter.insight_views import InsightPanel, event_kinds
from blockviz.jupyter.live_commands import LiveCommands
from blockviz.jupyter.moment import Moment
from blockviz.model.pool_zoom import check_range
from blockviz.model.view import card_record, cursor_line, event_log, snapshot, summary_text
from blockviz.model.narration import step_label
from blockviz.session.scenario import is_story, story_cards
from blockviz.jupyter.playback import FrameThrottle, PlayerDriver, play_loop
from blockviz.session.engine_session import EngineSession
from blockviz.session.spec import EngineSpec
from blockviz.jupyter.widgets import (PROJECTOR_ZOOM, BlockTableView, Controls, EventLogView, HashChainView, Inspector,
                                     PoolView)
from blockviz.model.trace import Trace, engine_title, kv_geometry, load_trace
from engine import events as ev
from blockviz.model.reducer import ReducerState

MIN_ZOOM, MAX_ZOOM = 0.5, 4.0  # set_zoom's range


class Visualizer(LiveCommands):
    """Pools, block tables, hash chains, event log, inspector, controls and breakpoints over one
    timeline, and under them the explainer, the preemption ledger and memory truth (insight_views).

    Build one with `Visualizer.from_trace(name_or_path)` (no model needed) or
    `Visualizer.live(llm_or_options, prompts=..., sampling_params=...)` (a real engine). Display it
    as the last expression of a cell; without a widget frontend its repr is a text summary.
    """

    def __init__(self, timeline: Timeline | Viewer, *, llm: Any = None, session: EngineSession | None = None,
                 title: str = "", header: dict[str, Any] | None = None, projector: bool = False,
                 zoom: float | None = None) -> None:
        self.llm = llm
        _OPEN.add(self)
        self.engine = llm.engine if llm is not None else None
        if self.engine is not None and session is None:
            session = EngineSession(_spec_of(self.engine), engine=self.engine)
        if not isinstance(timeline, Viewer):  # the cards at the cursor too (guide.py); playback stops at none
            header = header or {"block_size": timeline.block_size, "num_gpu_blocks": timeline.num_gpu_blocks,
                                "num_cpu_blocks": timeline.num_cpu_blocks}
            timeline = Viewer.for_timeline(header, timeline, live=self.engine is not None, cards=True)
        self.viewer = timeline
        self.timeline, self.player, self.header = self.viewer.timeline, self.viewer.player, self.viewer.header
        self.title = title
        self.error = ""
        self.projector = bool(projector)
        self.zoom = float(zoom) if zoom is not None else (PROJECTOR_ZOOM if projector else 1.0)
        self.selected: tuple[str, int] | None = None
        self.pool_ranges: dict[str, tuple[int, int]] = {}  # device -> the blocks its pool is zoomed into (zoom_pool)
        self._lock = threading.RLock()  # the engine and the timeline
        self._send_lock = threading.Lock()  # frames leave in order
        self._driver = PlayerDriver(session, self.player, self._set_error) if session is not None else None
        self._default_params = _sampling_defaults() if self.engine is not None else None
        self._request_ids: list[str] = []
        self._play_thread: threading.Thread | None = None
        self._stop_play = threading.Event()
        self._play_lock = threading.Lock()  # play and pause, one at a time (the play thread never takes it)

        self.controls = Controls()
        self.pools = PoolView()
        self.inspector = Inspector()
        self.tables = BlockTableView()
        self.hashes = HashChainView()
        self.log = EventLogView()
        self.insight = InsightPanel(self)
        self.explain_view, self.ledger_view, self.memory_view = self.insight.sections
        self.radix_view = self.insight.radix_view  # a radix-tree run's tree (kv_manager "sglang")
        self.breakpoints_view = self.insight.breakpoints_view
        # The controls go last in each frame: once they show a position, every view has its frame.
        self.views = (self.pools, self.inspector, self.tables, self.hashes, self.log, *self.insight.views,
                      self.controls)
        self._buttons = Buttons(self)
        self.controls.on_action(self._buttons.on_controls)
        self.pools.on_action(self._buttons.on_pools)
        self.explain_view.on_action(self._buttons.on_explain)
        self.breakpoints_view.on_action(self._buttons.on_breaks)
        self.log.observe(lambda change: self._changed(), names="filter")
        self.widget = ipywidgets.VBox([
            self.controls,
            self.breakpoints_view,
            ipywidgets.HBox([self.pools, self.inspector], layout=ipywidgets.Layout(width="100%")),
            ipywidgets.HBox([self.tables, self.hashes], layout=ipywidgets.Layout(width="100%")),
            self.log,
            self.insight.accordion,
        ], layout=ipywidgets.Layout(width="100%"))
        self.widget.add_class("blockviz")
        self.frames = FrameThrottle(self._send_frame)
        self._set_look()
        self._send_frame()

    # ------------------------------------------------------------------ construction

    @classmethod
    def from_trace(cls, name_or_path: str | Path | Trace, *, projector: bool = False,
                   guided: bool | None = None) -> "Visualizer":
        """Replay a trace file, or a shipped trace by name ("fork-cow", "prefix-hit", ...).
        `projector=True`: big cells and the projector palette (set_projector). `guided`: playing
        stops on each card of the guide (blockviz/model/guide.py), as `blockviz replay` does; by
        default for a recorded story, off for other traces."""
        trace = name_or_path if isinstance(name_or_path, Trace) else load_trace(name_or_path)
        name = Path(trace.path).stem if trace.path else "trace"
        guided = is_story(trace.header) if guided is None else bool(guided)
        return cls(Viewer.from_trace(trace, cards=True, guided=guided),
                   title=f"trace {name} · {engine_title(trace.header)}", projector=projector)

    @classmethod
    def live(cls, llm_or_options: Any = None, prompts: str | list | None = None,
             sampling_params: Any = None, scenario: str | None = None,
             keep_events: int | None = LIVE_MAX_EVENTS, *, projector: bool = False,
             kv_manager: str | None = None, guided: bool | None = None) -> "Visualizer":
        """Attach to a real engine: an `engine.llm.LLM`, or a dict of `LLM(...)` keyword arguments.

        `prompts` are queued as requests (nothing is stepped yet); `sampling_params` is one
        SamplingParams for all, or a list with one per prompt. `scenario="story"` plays the story
        `blockviz run` tells (blockviz/session/scenario.py): its requests arrive as the engine
        steps, on its engine settings unless the options say otherwise (an LLM given keeps its own),
        sampled as it samples. A long session keeps its last `keep_events` events (None: all),
        dropping its oldest steps with a notice under the controls. `projector=True`: big cells and
        the projector palette. `kv_manager="v1"` runs vLLM v1's KV cache manager and scheduler
        (`LLM(kv_manager=...)`; with `scenario="story"`, v1's own story). `guided`: playing stops
        on each card of the guide, with a "next idea ▸" button (next_card); by default for a
        scenario (the story), off otherwise."""
        from engine.llm import LLM

        if kv_manager is not None:
            if isinstance(llm_or_options, LLM):
                raise ValueError("kv_manager= goes with LLM options, not a built LLM (build it with kv_manager=...)")
            llm_or_options = {**(llm_or_options or {}), "kv_manager": kv_manager}

        spec = None
        if scenario is not None:
            options = {} if isinstance(llm_or_options, LLM) else (llm_or_options or {})
            spec = EngineSpec.for_scenario(scenario, **options)
        if isinstance(llm_or_options, LLM):
            llm = llm_or_options
        elif spec is not None:
            llm = LLM.from_engine(spec.make_engine())
        else:
            llm = LLM(**(llm_or_options or {}))
        engine = llm.engine
        if engine.has_unfinished_requests() or getattr(engine, "num_steps", 0):
            raise ValueError("attach the Visualizer to a fresh LLM: this one has already run, and its blocks "
                             "would be missing from the picture")
        if spec is not None:
            spec.config = engine.config
        session = EngineSession(spec if spec is not None else _spec_of(engine), engine=engine)
        header = session.header
        guided = scenario is not None if guided is None else bool(guided)
        viz = cls(Viewer.live(header, keep_events, cards=True, guided=guided), llm=llm, session=session,
                  title=f"live {engine_title(header)}", projector=projector)
        if viz.player.guide is not None and spec is not None:  # a live story counts its cards as its replay does
            viz.player.guide.expected = story_cards({**header, **spec.run_header()})
        if spec is not None:
            viz._default_params = None  # the scenario's sampling
            viz._request_ids += session.start()  # and the arrivals due before the first step
            viz._driver.flush()
        if prompts is not None:
            prompts = [prompts] if isinstance(prompts, (str, dict)) else list(prompts)
            if isinstance(sampling_params, (list, tuple)):
                if len(sampling_params) != len(prompts):
                    raise ValueError(f"{len(sampling_params)} sampling params for {len(prompts)} prompts")
                params = list(sampling_params)
            else:
                params = [sampling_params] * len(prompts)
            for prompt, sp in zip(prompts, params):
                viz.add_request(prompt, sp)
        return viz

    def close(self) -> None:
        """Stop playback, detach from the engine and close the widgets."""
        self.frames.close()
        self.pause()
        if self._driver is not None:
            self._driver.session.close()
            self._driver = None
        self._buttons.close()
        for view in self.views:
            view.close()
        self.widget.close()

    # ------------------------------------------------------------------ what lessons read

    @property
    def state(self) -> ReducerState:
        """The reducer state at the cursor (the object itself: `.copy()` it to keep it)."""
        return self.timeline.state

    @property
    def position(self) -> int:
        """Events applied: the cursor."""
        return self.timeline.position

    def __len__(self) -> int:
        return len(self.timeline)

    @property
    def events(self) -> list[ev.Event]:
        """Every event known so far (a live run grows it)."""
        return self.timeline.events

    @property
    def current_event(self) -> ev.Event | None:
        """The event the cursor just passed."""
        return self.timeline.current_event

    @property
    def outputs(self) -> list[Any]:
        """Finished requests' RequestOutputs (live runs), in the order the requests were added."""
        finished = self._driver.session.finished if self._driver is not None else {}
        order = self._request_ids + sorted(set(finished) - set(self._request_ids), key=_request_order)
        return [finished[r] for r in order if r in finished]

    @property
    def finished(self) -> bool:
        """A trace at its end, or a live engine with nothing left to run and the cursor at the end."""
        if not self.timeline.at_end:
            return False
        return self._driver is None or not self._driver.session.has_unfinished_requests()

    # ------------------------------------------------------------------ moving the cursor

    def step_event(self) -> ev.Event | None:
        """Apply one more event (a live run at the end of what is known steps the engine once);
        returns it, or None at the end of a finished run."""
        self.pause()
        with self._lock:
            moved = self.player.step_event() or self._serve_pending()
            event = self.timeline.current_event if moved else None
        self._changed()
        return event

    def step(self) -> ev.Event | None:
        """One engine step (LLMEngine.step, vLLM's step): the cursor moves just after the next
        step_finished, stepping a live engine if that step has not run yet. Returns that event, or
        None when there is no further step."""
        self.pause()
        with self._lock:
            moved = self.player.step_engine() or self._serve_pending()
            if not moved and self.timeline.next_step_end() is None:
                moved = self.player.to_end()  # no further step: the events after the last one
            event = self.timeline.current_event
            event = event if moved and isinstance(event, ev.StepFinished) else None
        self._changed()
        return event

    def back(self, n: int = 1) -> ev.Event | None:
        """Go back `n` events (time travel: nothing in the engine changes), into an engine
        operation if that is where it lands (as step_event goes forward); returns the event now
        at the cursor."""
        return self._seek(self.position - n, land=False)

    def seek(self, position: int) -> ev.Event | None:
        """Put the cursor at `position` (clamped to the events known), or at the end of the engine
        operation `position` falls inside (blockviz/model/operation.py: the slider draws only
        states the engine can be in); returns the event just passed."""
        return self._seek(position, land=True)

    def _seek(self, position: int, *, land: bool) -> ev.Event | None:
        self.pause()
        with self._lock:
            position = max(0, min(int(position), len(self.timeline)))
            self.timeline.seek(self._landing(position) if land else position)
            event = self.timeline.current_event
        self._changed()
        return event

    def _landing(self, position: int) -> int:
        """Where a cursor asked for at `position` lands (Timeline.landing), stepping a live engine
        until the operation there has ended (lock held)."""
        while self.timeline.operation_end(position) is None and self._driver is not None and self._driver.step():
            pass
        return self.timeline.landing(position)

    def run_until(self, kinds: str | Iterable[str] | None = None) -> ev.Event | None:
        """Move to the next event of `kinds` (one kind, "copy_on_write", or several:
        "swap_out,block_evicted" or a list; None: the kinds ticked in the breakpoints bar), stepping a
        live engine as needed: the cursor lands at the end of the engine operation that event is in
        (a swap-out with its frees), where a guided card stops too. Returns that event, or None
        (cursor at the end) when the run finishes without one."""
        kinds = event_kinds(self.player.break_on if kinds is None else kinds)
        self.pause()
        with self._lock:
            start = self.position
            found = self.timeline.next_of(kinds, start, len(self.timeline))
            while found is None and self._driver is not None:
                start = len(self.timeline)
                if not self._driver.step():
                    break
                found = self.timeline.next_of(kinds, start, len(self.timeline))
            self.timeline.seek(self._landing(found) if found is not None else len(self.timeline))
            event = self.timeline.events[found - 1] if found is not None else None
        self._changed()
        return event

    def back_to(self, kinds: str | Iterable[str] | None = None) -> ev.Event | None:
        """Back to the previous event of `kinds` (as run_until takes them) before the operation the
        cursor ends (Timeline.previous_of: time travel, the engine is left alone), landing where
        run_until would. Returns that event, or None (the cursor stays) when there is none."""
        kinds = event_kinds(self.player.break_on if kinds is None else kinds)
        self.pause()
        with self._lock:
            timeline = self.timeline
            target = timeline.previous_of(kinds)
            while target is not None and timeline.landing(target) >= timeline.position:  # the operation the cursor ends
                op = timeline.operation_at(target)
                target = timeline.previous_of(kinds, before=op.start) if op is not None else None
            if target is not None:
                timeline.seek(timeline.landing(target))
            event = timeline.events[target - 1] if target is not None else None
        self._changed()
        return event

    def next_card(self):
        """Go to the guide's next card (blockviz/model/guide.py: the next idea met for the first
        time), stepping a live engine until it comes; the "next idea ▸" button. Returns the
        Card, or None (the cursor at the end) when the run has no further one."""
        self.pause()
        with self._lock:
            player, timeline = self.player, self.timeline
            guide = player.scan_guide()
            stop = guide.next_stop(timeline.position, len(timeline))
            while stop is None and self._driver is not None and self._driver.step():
                stop = player.scan_guide().next_stop(timeline.position, len(timeline))
            if stop is None:
                guide.settle()  # nothing more comes: the last operation is whole
                stop = guide.next_stop(timeline.position, len(timeline))
            timeline.seek(stop if stop is not None else len(timeline))
            card = guide.card_at(timeline.position) if stop is not None else None
        self._changed()
        return card

    def run_to_completion(self) -> list[Any]:
        """Live: step the engine until no request is unfinished; then (trace or live) go to the
        end. Returns the finished RequestOutputs (empty for a trace)."""
        self.pause()
        with self._lock:
            while self._driver is not None and self._driver.step():
                pass
            self.player.to_end()
        self._changed()
        return self.outputs

    def select(self, device: str, number: int) -> None:
        """Show block `number` of `device` ("gpu" or "cpu") in the inspector (a click on a cell)."""
        pool = self.timeline.state.pools.get(device)
        if pool is None or not 0 <= int(number) < len(pool):
            raise ValueError(f"no block {number!r} in a {device!r} pool")
        self.selected = (device, int(number))
        self.insight.picked = None  # the explainer follows the selected block's request again
        self._changed()

    def zoom_pool(self, device: str = "gpu", start: int | None = None, stop: int | None = None) -> None:
        """Draw blocks `start` to `stop` of `device`'s pool (a click on a zoomed-out cell): one cell
        per block when they are at most pool_zoom.MAX_BLOCK_CELLS, else a cell per N blocks; no
        `start`: the whole pool again (zoomed out when it is big: blockviz.model.pool_zoom)."""
        pool = self.timeline.state.pools.get(device)
        if pool is None:
            raise ValueError(f"no {device!r} pool")
        if start is None:
            self.pool_ranges.pop(device, None)
        else:
            self.pool_ranges[device] = check_range(int(start), len(pool) if stop is None else int(stop), len(pool))
        self._changed()

    # ------------------------------------------------------------------ playback

    @property
    def playing(self) -> bool:
        return self.player.playing

    def play(self, speed: float | str | None = None) -> None:
        """Start playback on a background thread (returns at once): events at the Player's speed,
        or, live at "max", the engine free-running. `speed` is one of player.SPEEDS or "max".
        Safe against a concurrent pause() (the Pause button racing Play): they take turns."""
        if speed is not None:
            self.set_speed(speed)
        with self._play_lock:
            if self._play_thread is not None and self._play_thread.is_alive():
                return
            with self._lock:
                self.player.playing = False
                self.player.toggle_play()
            self._stop_play.clear()
            thread = threading.Thread(target=play_loop, name="blockviz-play", daemon=True,
                                      args=(self.player, self._lock, self._driver, self._stop_play, self._changed))
            self._play_thread = thread
            thread.start()  # under the lock: a pause() never sees a thread it cannot join
        self._changed()

    def pause(self) -> None:
        """Stop playback; returns once the engine step under way (if any) is done."""
        if threading.current_thread() is self._play_thread:  # the play thread stopping itself
            self._stop_play.set()
            self.player.playing = False
            return
        with self._play_lock:
            thread = self._play_thread
            self._stop_play.set()
            self.player.playing = False
            if thread is not None:
                thread.join()
            self._play_thread = None
        self._changed()

    def set_speed(self, speed: float | str | int) -> None:
        """Playback speed: events per second (one of player.SPEEDS) or "max"."""
        from blockviz.model.player import SPEEDS

        value = float("inf") if speed == "max" else float(speed)
        if value not in SPEEDS:
            raise ValueError(f"speed {speed!r} is not one of {', '.join('max' if s == float('inf') else f'{s:g}' for s in SPEEDS)}")
        self.player.speed_index = SPEEDS.index(value)
        self._changed()

    def _serve_pending(self) -> bool:
        """Step a live engine until the Player's pending single step is served (lock held);
        returns whether the cursor moved."""
        return self._driver is not None and self._driver.serve_pending()

    def _set_error(self, error: str) -> None:
        self.error = error

    # ------------------------------------------------------------------ frames

    def _changed(self) -> None:
        self.frames.request()

    def frame(self, *, log: bool = True) -> dict[str, Any]:
        """The whole frame at the cursor: snapshot() plus the event log (left out with log=False:
        an exported page builds its log from its own table of rows) and the cursor line."""
        with self._lock:
            timeline = self.timeline
            snap = snapshot(timeline.state, current=timeline.current_event, selected=self.selected,
                            vocab=timeline.token_texts, geometry=kv_geometry(self.header), ranges=self.pool_ranges)
            if log:
                snap["log"] = {"filter": self.log.filter,
                               "rows": event_log(timeline.events, timeline.position, self.log.filter,
                                                 timeline.token_texts, names=RequestNames(timeline.state))}
            snap.update(self.insight.parts(self.insight.shown()))
            snap["cursor"] = cursor_line(timeline, self.player, title=self.title, error=self.error,
                                         finished=self.finished)
            card = self.viewer.card
            snap["card"] = card_record(card, self.player.guide.counter(card) if card is not None else "")
            if card is not None:  # the pools highlight the blocks the card names, as the TUI's do
                snap["touched"] = {device: sorted(card.blocks_on(device)) for device in snap["pools"]
                                   if card.blocks_on(device)}
        return snap

    def _send_frame(self) -> None:
        with self._send_lock:
            snap = self.frame()
            for view in self.views:
                view.show(snap)

    # ------------------------------------------------------------------ size and projector

    def set_zoom(self, zoom: float) -> None:
        """Draw every view `zoom` times its normal size (the size menu: widgets.ZOOMS)."""
        zoom = float(zoom)
        if not MIN_ZOOM <= zoom <= MAX_ZOOM:
            raise ValueError(f"zoom {zoom:g} is outside {MIN_ZOOM:g} to {MAX_ZOOM:g}")
        self.zoom = zoom
        self._set_look()

    def set_projector(self, on: bool = True) -> None:
        """Projector mode (the TUI's `P` / `--projector`): the projector palette (palette.SEQ_COLOURS_BOLD),
        high contrast, and cells at least PROJECTOR_ZOOM times their size, read from the back of a room."""
        self.projector = bool(on)
        if on:
            self.zoom = max(self.zoom, PROJECTOR_ZOOM)
        self._set_look()

    def _set_look(self) -> None:
        for view in self.views:
            view.set_look(self.zoom, self.projector)

    # ------------------------------------------------------------------ moments

    def snapshot(self, at: int | None = None) -> Moment:
        """A moment: the picture at the cursor (or at event position `at`, or the end of the engine
        operation `at` falls inside; the cursor left where it is), frozen. It draws the frame the widget draws there, with no link to the engine or the
        timeline, so later steps leave it as it was (blockviz.jupyter.moment)."""
        with self._lock:
            timeline = self.timeline
            back = timeline.position
            if at is not None:
                if not 0 <= int(at) <= len(timeline):
                    raise ValueError(f"at={at!r} is outside the events known (0 to {len(timeline)})")
                timeline.seek(self._landing(int(at)))  # a moment is a state the engine can be in
            try:
                frame = self.frame()
                state = timeline.state.copy()
            finally:
                timeline.seek(back)
        return Moment(frame, state, title=self.title, header=self.header, zoom=self.zoom, projector=self.projector)

    def show(self, at: int | None = None) -> Moment:
        """The same as snapshot(at): a cell ending in `viz.show(at=12)` shows event 12's picture."""
        return self.snapshot(at)

    def save(self, path: str | Path, at: int | None = None, *, overwrite: bool = True) -> Path:
        """Write the picture at the cursor (or at `at`) to `path` for a slide: "step.svg", or
        "step.png" with the [export] extra; the pools, tables and hash chains the widget draws
        (snapshot(at).save). "lesson.html": one page that plays every event known so far with these
        views, offline (blockviz.webpage.page, as `blockviz export --html`). Returns the path."""
        if Path(path).suffix.lower() in (".html", ".htm"):
            from blockviz.webpage.page import save_page

            if at is not None:
                raise ValueError("a page plays every event: leave out at=")
            self.pause()
            with self._lock:
                return save_page(self, path, overwrite=overwrite)
        return self.snapshot(at).save(path, overwrite=overwrite)

    # ------------------------------------------------------------------ display

    def summary(self) -> str:
        """The state at the cursor as plain text."""
        with self._lock:
            return summary_text(self.timeline.state, title=self.title, position=self.position,
                                length=len(self.timeline), current=self.timeline.current_event,
                                step=step_label(self.timeline))

    def __repr__(self) -> str:
        return self.summary()

    def _repr_pretty_(self, printer: Any, cycle: bool) -> None:
        printer.text(self.summary())

    def _repr_mimebundle_(self, **kwargs: Any) -> dict[str, Any]:
        self.frames.flush()
        bundle = self.widget._repr_mimebundle_(**kwargs) or {}
        bundle = dict(bundle)
        bundle["text/plain"] = self.summary()
        return bundle


def _spec_of(engine: Any) -> EngineSpec:
    """A live Visualizer's session spec: the engine's settings, no requests of its own."""
    return EngineSpec(engine.config, prompts=())


def _sampling_defaults() -> Any:
    """vLLM's SamplingParams() defaults, for a request added without sampling params."""
    from engine.sequence import SamplingParams

    return SamplingParams()


def _request_order(request_id: str) -> tuple[int, str]:
    """The engine numbers requests 0, 1, 2...: that order."""
    return len(request_id), request_id


_OPEN: "weakref.WeakSet[Visualizer]" = weakref.WeakSet()


@atexit.register
def _stop_all_at_exit() -> None:
    """A kernel shutting down with a Visualizer still playing (never closed): stop its frames and
    its play thread before the interpreter tears the widgets' comms down under them."""
    for viz in list(_OPEN):
        try:
            viz.frames.close()
            viz.pause()
        except Exception:  # noqa: BLE001 - leaving anyway; nothing left to tell
            pass

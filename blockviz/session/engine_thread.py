"""EngineBridge: an engine session on a worker thread, the UI fed batches of its events with
backpressure.

`EngineBridge.run()` is the worker thread's body: build an EngineSession (engine_session.py: it
loads the model, adds the requests, plays the arrivals), then step it through an EngineDriver
(engine_driver.py, the driver the notebook runs too) only when the UI asks for steps (or free-run
at "max" speed) and only while fewer than `max_in_flight` events wait unacknowledged in the UI:
that is the backpressure. Between steps it runs the user's commands (add a request, fork a
sequence, preempt a request), since the engine is not thread-safe and only this thread touches it.
`blockviz run` runs one inside a child process (engine_process.py); the tests run it on a thread.
No textual import: the app hands in a Listener whose callbacks post messages.
"""

from __future__ import annotations

import threading
import time
from dataclasses import replace
from typing import Any, Callable

from blockviz.session.engine_driver import EngineDriver, Listener
from blockviz.session.engine_session import EngineSession
from blockviz.session.spec import EngineSpec, one_line, quiet_model_loading
from engine.events import Event

KEEP_FINISHED = 1000  # finished outputs the live engine keeps (the TUI shows their text from the events)


def leave_a_core_for_the_ui(device: str | None) -> None:
    """On the CPU, give torch one intra-op thread fewer than cores, so the UI thread keeps a core.

    For an engine sharing the UI's process (EngineBridge(share_cores=True), as the tests run it): the
    UI thread and torch's spinning OpenMP workers otherwise pre-empt each other (the figures are in
    benchmarks/README.md). `blockviz run`'s engine process keeps every torch thread."""
    if device not in (None, "cpu"):
        return
    import torch

    if device is None and torch.cuda.is_available():
        return
    threads = torch.get_num_threads()
    if threads > 1:
        torch.set_num_threads(threads - 1)


class EngineBridge:
    """Runs an engine on a worker thread, posting batches of events with backpressure.

    UI-thread methods: request_steps, set_free_run, acknowledge, add_request, fork, preempt, stop.
    Worker-thread method: run.
    """

    def __init__(self, spec: EngineSpec | None = None, *, make_engine: Callable[[], Any] | None = None,
                 max_in_flight: int = 4096, flush_interval: float = 0.1, share_cores: bool = True) -> None:
        self.spec = spec or EngineSpec()
        self._make_engine = make_engine or self.spec.make_engine
        self.max_in_flight = max_in_flight
        self.flush_interval = flush_interval  # free-running: at most one batch per interval
        self.share_cores = share_cores  # the UI runs in this process: leave it a core
        self._cond = threading.Condition()
        self._steps_wanted = 0
        self._stepping = False
        self._free_run = False
        self._in_flight = 0
        self._idle = False
        self._stopped = False
        self._commands: list[Callable[[EngineSession], Any]] = []
        self._last_flush = 0.0  # when the last batch went to the UI
        self.steps_served = 0  # steps asked for by request_steps that finished or were dropped
        self.session: EngineSession | None = None  # built by run(), on the worker thread

    @property
    def header(self) -> dict[str, Any] | None:
        """The run's trace header, once the engine is built."""
        return self.session.header if self.session is not None else None

    @property
    def engine(self) -> Any:
        """The engine, once built (for tests and benchmarks; only the worker thread calls into it)."""
        return self.session.engine if self.session is not None else None

    @property
    def num_steps(self) -> int:
        """Engine steps taken."""
        return self.session.num_steps if self.session is not None else 0

    # ------------------------------------------------------------------ UI side

    def request_steps(self, count: int = 1) -> None:
        with self._cond:
            self._steps_wanted += count
            self._cond.notify_all()

    @property
    def outstanding(self) -> int:
        """Steps asked for and not finished yet."""
        with self._cond:
            return self._steps_wanted + (1 if self._stepping else 0)

    @property
    def in_flight(self) -> int:
        with self._cond:
            return self._in_flight

    def set_free_run(self, free_run: bool) -> None:
        """Step as fast as the backpressure allows ("max" playback speed)."""
        with self._cond:
            self._free_run = free_run
            self._cond.notify_all()

    def acknowledge(self, count: int) -> None:
        """The UI took `count` events into its timeline."""
        with self._cond:
            self._in_flight = max(0, self._in_flight - count)
            self._cond.notify_all()

    def add_request(self, prompt: str, n: int | None = None) -> None:
        self._submit(lambda session: session.add_request(prompt, n))

    def fork(self, seq_id: int) -> None:
        self._submit(lambda session: session.fork(seq_id))

    def preempt(self, request_id: str) -> None:
        self._submit(lambda session: session.preempt(request_id))

    def stop(self) -> None:
        with self._cond:
            self._stopped = True
            self._cond.notify_all()

    def _submit(self, command: Callable[[EngineSession], Any]) -> None:
        with self._cond:
            self._commands.append(command)
            self._cond.notify_all()

    # ------------------------------------------------------------------ worker side

    def _may_step(self) -> bool:
        return ((self._steps_wanted > 0 or self._free_run) and not self._idle
                and self._in_flight < self.max_in_flight)

    def run(self, listener: Listener) -> None:
        """The worker's body: load, add the initial requests, then serve steps and commands."""
        session = self._load(listener)
        if session is None:
            return
        try:
            session.start()
        except ValueError as exc:  # a prompt the engine refuses: the run cannot be what was asked
            session.close()
            listener.failed(one_line(exc))
            return
        driver = EngineDriver(session, replace(listener, events=self._counted(listener.events)))
        self._last_flush = time.monotonic()
        try:
            self._flush(driver)
            self._serve(driver)
        except Exception as exc:  # noqa: BLE001 - the engine broke: report, keep the UI alive
            driver.stopped(exc)
        finally:
            session.close()

    def _counted(self, events: Callable[[list[Event]], None]) -> Callable[[list[Event]], None]:
        """`events`, counting each batch in flight before the UI can acknowledge it."""
        def send(batch: list[Event]) -> None:
            with self._cond:
                self._in_flight += len(batch)
            events(batch)
        return send

    def _load(self, listener: Listener) -> EngineSession | None:
        spec = self.spec
        profiling = ", then profiling its memory to size the KV cache" if spec.config.num_gpu_blocks is None else ""
        listener.loading(f"loading the model {spec.model!r}{profiling}…")
        try:
            quiet_model_loading()
            if self.share_cores:
                leave_a_core_for_the_ui(spec.config.device)
            session = EngineSession(spec, make_engine=self._make_engine, keep_finished=KEEP_FINISHED)
        except Exception as exc:  # noqa: BLE001 - a load failure ends the app with one line
            listener.failed(one_line(exc))
            return None
        self.session = session
        listener.ready({**session.header, **spec.run_header()})  # the run's arrivals too: a live story counts its cards
        return session

    def _serve(self, driver: EngineDriver) -> None:
        """Until stopped: wait for something to do, run the user's commands, take a step."""
        session, listener = driver.session, driver.listener
        served = 0
        while True:
            with self._cond:
                while not (self._stopped or self._commands or self._may_step() or session.num_buffered):
                    self._cond.wait(0.5)
                if self._stopped:
                    return
                commands, self._commands = self._commands, []
                step = self._may_step()
                wanted = step and self._steps_wanted > 0
                session.digest_per_step(wanted or not self._free_run)
                if step:
                    self._stepping = True
                    self._steps_wanted -= wanted
            self._run_commands(session, commands, listener)
            free_running = step and self._step(driver, wanted)
            unfinished = session.has_unfinished_requests()
            self._flush(driver, force=not (free_running and unfinished))
            if (step or commands) and not unfinished:
                with self._cond:
                    self._idle = True
                    self.steps_served += self._steps_wanted
                    self._steps_wanted = 0
                listener.idle()
            if self.steps_served != served:
                served = self.steps_served
                listener.served(served)

    def _run_commands(self, session: EngineSession, commands: list, listener: Listener) -> None:
        for command in commands:
            try:
                command(session)
            except ValueError as exc:  # a refused command is a notice, not a crash
                listener.notice(one_line(exc))
            else:
                with self._cond:
                    self._idle = False

    def _step(self, driver: EngineDriver, wanted: bool) -> bool:
        """One engine step (and the arrivals it makes due); whether the engine is free-running."""
        try:
            driver.step()
        finally:
            with self._cond:
                self._stepping = False
                self.steps_served += wanted
                free_running = self._free_run and not self._steps_wanted and not self._commands
        return free_running

    def _flush(self, driver: EngineDriver, force: bool = True) -> None:
        """Send the events buffered since the last batch as one batch: at once for single steps,
        at most one per `flush_interval` while free-running (the session then digests the blocks
        a free run wrote once per batch, not once a step)."""
        now = time.monotonic()
        if not force and now - self._last_flush < self.flush_interval:
            return  # free-running: gather more steps into one message
        if driver.flush():
            self._last_flush = now

"""EngineDriver: an engine session stepped for a live view, which hears of it through a Listener.

The loop every live front end runs around an EngineSession (engine_session.py), one call at a
time, as vLLM's `LLM._run_engine` and nano-vllm's `LLM.generate` run theirs: take a step if a
request is unfinished (`step`), hand what the engine emitted to the view as one batch (`flush`),
and, when the engine raises, send what it emitted before saying it stopped, in one line
(`stopped`). The driver holds no thread and no lock: the TUI's EngineBridge calls it on its worker
thread (engine_thread.py, and in a child process engine_process.py), the notebook with the
Visualizer's lock held (jupyter/playback.py). No textual, no ipywidgets.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

from blockviz.session.engine_session import EngineSession
from blockviz.session.spec import one_line
from engine.events import Event


@dataclass(slots=True)
class Listener:
    """What a live view hears from its engine; a driver on a worker thread calls it from there."""

    loading: Callable[[str], None]
    ready: Callable[[dict], None]
    failed: Callable[[str], None]
    events: Callable[[list[Event]], None]
    notice: Callable[[str], None] = lambda text: None
    died: Callable[[str], None] = lambda error: None  # the engine stopped after it was ready
    idle: Callable[[], None] = lambda: None
    served: Callable[[int], None] = lambda steps_served: None  # after steps asked for finish or drop


class EngineDriver:
    """Steps `session` and reports to `listener`. Not thread-safe: one thread at a time calls it."""

    def __init__(self, session: EngineSession, listener: Listener) -> None:
        self.session = session
        self.listener = listener

    def step(self) -> bool:
        """One engine step (EngineSession.step: LLMEngine.step, then the arrivals it makes due)
        if a request is unfinished; returns whether one ran. Its events wait in the session for
        `flush`."""
        if not self.session.has_unfinished_requests():
            return False
        self.session.step()
        return True

    def flush(self) -> int:
        """Send the events emitted since the last flush to `listener.events` as one batch (the
        session's take_events: with digests held back, the batch ends with the K/V digests of the
        blocks written meanwhile); returns how many were sent."""
        batch = self.session.take_events()
        if batch:
            self.listener.events(batch)
        return len(batch)

    def stopped(self, error: Exception) -> str:
        """The engine raised `error`: send what it emitted first, then `listener.died` with
        "engine stopped: " and the error's first line. Returns that line."""
        self.flush()
        line = f"engine stopped: {one_line(error)}"
        self.listener.died(line)
        return line

"""The one interface a live view drives an engine through (the UI side of an engine session).

Two implementations, in the session layer: `blockviz.session.engine_thread.EngineBridge` (the
engine on a thread of this process, as the tests run it) and
`blockviz.session.engine_process.ProcessBridge` (the engine in a child process, as `blockviz run`
runs it). The App is typed against `Bridge`, never a concrete class.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    from blockviz.session.engine_driver import Listener


class Bridge(Protocol):
    """A live engine as the UI sees it. `run` is the body of the UI's worker thread; every other
    method is called from the UI thread."""

    @property
    def outstanding(self) -> int:
        """Steps asked for and not finished yet."""

    def run(self, listener: Listener) -> None:
        """Load the engine, then report to `listener` until stopped."""

    def request_steps(self, count: int = 1) -> None:
        """Run `count` more engine steps (LLMEngine.step)."""

    def set_free_run(self, free_run: bool) -> None:
        """Step as fast as the backpressure allows ("max" playback speed)."""

    def acknowledge(self, count: int) -> None:
        """The UI took `count` events into its timeline (the backpressure)."""

    def add_request(self, prompt: str, n: int | None = None) -> None:
        """Queue a request (EngineSession.add_request, vLLM's add_request)."""

    def fork(self, seq_id: int) -> None:
        """Fork a running sequence (EngineSession.fork, vLLM v0 BlockSpaceManager.fork)."""

    def preempt(self, request_id: str) -> None:
        """Preempt a running request by swapping it out to the CPU pool (EngineSession.preempt,
        vLLM v0 Scheduler._preempt by swap)."""

    def stop(self) -> None:
        """End the run; `run` returns soon after."""

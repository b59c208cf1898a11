"""The live engine's commands on a Visualizer: add a request, fork a sequence, preempt a request.

A command acts on the engine as it is now, the end of the timeline: the cursor moves there, past
the command's events, so `state` shows what it did. The commands are the engine session's
(blockviz/session/engine_session.py), under vLLM's names. A mixin of the Visualizer (its session
driver, lock, player and timeline), kept apart so that the Visualizer's module stays about the
cursor.
"""

from __future__ import annotations

from typing import Any, Callable

from blockviz.session.engine_session import EngineSession


class LiveCommands:
    """EngineSession.add_request, fork and preempt from a notebook."""

    def add_request(self, prompt: Any, sampling_params: Any = None, n: int | None = None) -> str:
        """Queue a request on the live engine (LLMEngine.add_request, vLLM's add_request); returns
        its request id. `n` overrides the sampling params' n. Without sampling params: vLLM's
        SamplingParams() defaults, or the scenario's sampling in `Visualizer.live(scenario=...)`."""
        if sampling_params is None:
            sampling_params = self._default_params
        request_id = self._command(lambda session: session.add_request(prompt, n, sampling_params))
        self._request_ids.append(request_id)
        return request_id

    def fork(self, seq_id: int) -> int:
        """Fork a running sequence now (vLLM v0 BlockSpaceManager.fork): the child shares every
        block; returns the child's seq id."""
        return self._command(lambda session: session.fork(seq_id))

    def preempt(self, request_id: str) -> list[tuple[int, int]]:
        """Preempt a running request now by swapping it out to the CPU pool (vLLM v0
        Scheduler._preempt by swap); returns the (gpu block, cpu block) pairs moved. The next
        step swaps it back in if there is room."""
        return self._command(lambda session: session.preempt(str(request_id)))

    def _command(self, run: Callable[[EngineSession], Any]) -> Any:
        if self._driver is None:
            raise RuntimeError("this Visualizer replays a trace: live commands need Visualizer.live")
        self.pause()
        with self._lock:
            try:
                result = run(self._driver.session)
            except ValueError as exc:  # EngineSession.CommandRefused: one line, what then why
                self.error = str(exc)
                raise
            finally:
                self._driver.flush()
            self.error = ""
            self.player.finished = False
            self.timeline.seek(len(self.timeline))  # the command acted on the engine's present
        self._changed()
        return result

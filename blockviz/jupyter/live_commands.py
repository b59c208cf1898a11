"""The live engine's commands on a Visualizer: add a request, fork a sequence, swap a request out.

A command acts on the engine as it is now, the end of the timeline: the cursor moves there, past
the command's events, so `state` shows what it did. A mixin of the Visualizer (its engine, lock,
driver, player and timeline), kept apart so that the Visualizer's module stays about the cursor.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable

from blockviz.session.spec import one_line


class LiveCommands:
    """LLMEngine.add_request, fork_sequence and preempt_request (swap out) from a notebook."""

    def add_request(self, prompt: Any, sampling_params: Any = None, n: int | None = None) -> str:
        """Queue a request on the live engine (LLMEngine.add_request, vLLM's add_request); returns
        its request id. `n` overrides the sampling params' n."""
        if n is not None:
            from engine.sequence import SamplingParams

            sampling_params = dataclasses.replace(sampling_params or SamplingParams(), n=n)
        request_id = self._command("add a request", lambda engine: engine.add_request(prompt, sampling_params))
        self._request_ids.append(request_id)
        return request_id

    def fork(self, seq_id: int) -> int:
        """Fork a running sequence now (vLLM v0 BlockSpaceManager.fork): the child shares every
        block; returns the child's seq id."""
        return self._command(f"fork sequence {seq_id}", lambda engine: engine.fork_sequence(seq_id))

    def swap_out(self, request_id: str) -> list[tuple[int, int]]:
        """Swap a running request out to the CPU pool now (vLLM v0 swap_out); returns the
        (gpu block, cpu block) pairs moved."""
        return self._command(f"swap out request {request_id}",
                             lambda engine: engine.preempt_request(str(request_id)))

    def _command(self, name: str, run: Callable[[Any], Any]) -> Any:
        if self.engine is None:
            raise RuntimeError(f"cannot {name}: this Visualizer replays a trace (use Visualizer.live)")
        self.pause()
        with self._lock:
            try:
                result = run(self.engine)
            except Exception as exc:
                self.error = f"{name}: {one_line(exc)}"
                raise
            finally:
                self._driver.take_events()
            self.error = ""
            self.player.finished = False
            self.timeline.seek(len(self.timeline))  # the command acted on the engine's present
        self._changed()
        return result

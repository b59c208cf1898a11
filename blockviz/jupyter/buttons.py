"""What the Visualizer's buttons and clicks do. Their messages arrive on the kernel's main thread
and are handed to one worker thread, so the kernel keeps answering clicks while the engine
generates (play runs on a thread of its own)."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from typing import TYPE_CHECKING, Any, Callable

from blockviz.model.player import SPEEDS
from blockviz.session.spec import one_line

if TYPE_CHECKING:
    from blockviz.jupyter.visualizer import Visualizer


class Buttons:
    """The Controls', the PoolView's, the explainer's and the breakpoints bar's messages, run as the
    Visualizer's own methods."""

    def __init__(self, viz: Visualizer) -> None:
        self.viz = viz
        self._worker = ThreadPoolExecutor(max_workers=1, thread_name_prefix="blockviz-widget")

    def close(self) -> None:
        self._worker.shutdown(wait=False)

    def wait(self, timeout: float | None = None) -> None:
        """Return once every message handed to the worker so far has run."""
        self._worker.submit(lambda: None).result(timeout=timeout)

    def on_controls(self, message: dict[str, Any]) -> None:
        viz = self.viz
        kind = message.get("event")
        if kind == "action":
            action = message.get("action")
            if action == "pause" or (action == "play" and viz.playing):
                viz.pause()
            elif action == "play":
                self._in_background(viz.play)
            else:
                run = {"step_event": viz.step_event, "step": viz.step, "back": viz.back, "next_card": viz.next_card,
                       "back_step": lambda: viz.seek(viz.timeline.previous_step_end()),
                       "start": lambda: viz.seek(0), "end": lambda: viz.seek(len(viz))}.get(action)
                if run is not None:
                    self._in_background(run)
        elif kind == "seek":
            self._in_background(lambda: viz.seek(int(message.get("position", 0))))
        elif kind == "speed":
            index = max(0, min(int(message.get("index", 0)), len(SPEEDS) - 1))
            self._in_background(lambda: viz.set_speed(SPEEDS[index]))
        elif kind == "zoom":
            self._in_background(lambda: viz.set_zoom(float(message.get("zoom", 1.0))))
        elif kind == "projector":
            self._in_background(lambda: viz.set_projector(bool(message.get("on"))))

    def on_pools(self, message: dict[str, Any]) -> None:
        kind, device = message.get("event"), str(message.get("device"))
        if kind == "select":
            self._in_background(lambda: self.viz.select(device, int(message.get("number", 0))))
        elif kind == "zoom_pool":  # a zoomed-out cell's blocks, or (no start) the whole pool
            start, stop = message.get("start"), message.get("stop")
            self._in_background(lambda: self.viz.zoom_pool(device, None if start is None else int(start),
                                                           None if stop is None else int(stop)))

    def on_explain(self, message: dict[str, Any]) -> None:
        if message.get("event") == "pick":
            self._in_background(lambda: self.viz.insight.explain(str(message.get("request"))))

    def on_breaks(self, message: dict[str, Any]) -> None:
        direction = message.get("direction")
        if message.get("event") == "break" and direction in ("previous", "next"):
            self._in_background(lambda: self.viz.insight.go_to_break(direction))

    def _in_background(self, run: Callable[[], Any]) -> None:
        def guarded() -> None:
            try:
                run()
            except Exception as exc:  # noqa: BLE001 - shown in the widget as one line
                if not self.viz.error:
                    self.viz.error = one_line(exc)
                self.viz._changed()

        self._worker.submit(guarded)

"""Fresh engines for the checks: each check that needs an engine builds its own, never steps the
lesson's (the model itself is loaded once per process by the engine's loader)."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any


@contextmanager
def fresh(options: dict[str, Any], prompts: Any = None, sampling_params: Any = None) -> Iterator[Any]:
    """A live Visualizer on a new engine (`Visualizer.live`), closed when the block ends."""
    from blockviz.jupyter import Visualizer

    viz = Visualizer.live(options, prompts=prompts, sampling_params=sampling_params)
    try:
        yield viz
    finally:
        viz.close()


def events_of(viz: Any, kind: type) -> list[Any]:
    """The run's events of one record class, in order."""
    return [e for e in viz.events if isinstance(e, kind)]

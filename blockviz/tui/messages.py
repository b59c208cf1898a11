"""Every message of the TUI, as dataclasses ("attributes down, messages up").

The engine worker reaches the UI only through the Engine* messages. `EngineEvents` carries a batch
of events; when several batches wait in the app's queue, `can_replace` folds the older batch into
the newer one, so a burst costs one handler call and one frame instead of one per step.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable

from textual.message import Message

from engine.events import Event


@dataclass
class EngineLoading(Message):
    """The worker is loading the model."""

    text: str


@dataclass
class EngineReady(Message):
    """The engine is built; `header` is its session's trace header (block size, pool sizes, model...)."""

    header: dict[str, Any]


@dataclass
class EngineFailed(Message):
    """The engine could not be built (e.g. the model cannot be loaded): one line."""

    error: str


@dataclass
class EngineDied(Message):
    """The engine stopped mid-run (an exception in a step, its process gone): one line. The app
    keeps what it has, says so until it quits, and then exits non-zero with this line."""

    error: str


@dataclass
class EngineEvents(Message):
    """A batch of events from the engine, in emit order."""

    events: list[Event] = field(default_factory=list)

    def can_replace(self, message: Message) -> bool:
        """Coalesce: when the next queued message is also a batch, hand ours to it (in front)."""
        if isinstance(message, EngineEvents):
            message.events[:0] = self.events
            return True
        return False


@dataclass
class EngineNotice(Message):
    """Something the user should know (a refused fork, a preempt that could not run)."""

    text: str


@dataclass
class EngineIdle(Message):
    """The engine has no unfinished request left."""


@dataclass
class BlockSelected(Message):
    """The user selected a block in a pool grid (keyboard or mouse)."""

    device: str
    number: int


def posting_listener(post: Callable[[Message], Any]):
    """The engine worker's Listener (blockviz.session.engine_driver) whose every callback posts one
    of these messages with `post` (App.post_message, safe from the worker thread)."""
    from blockviz.session.engine_driver import Listener

    return Listener(
        loading=lambda text: post(EngineLoading(text)),
        ready=lambda header: post(EngineReady(header)),
        failed=lambda error: post(EngineFailed(error)),
        died=lambda error: post(EngineDied(error)),
        events=lambda events: post(EngineEvents(events)),
        notice=lambda text: post(EngineNotice(text)),
        idle=lambda: post(EngineIdle()),
    )


@dataclass
class KVEventsArrived(Message):
    """`blockviz attach`: what one poll of the KV-event subscriber brought (a
    blockviz.kvevents.subscriber.ClientUpdate: batches in order, gaps, notices)."""

    update: Any

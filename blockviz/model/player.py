"""Playback over a Timeline: play/pause at a speed (events per second), step one event or one engine
step (up to the next step_finished), back the same ways, breakpoints, and — in a live run — how
many engine steps the UI still needs, which is how the engine session gets its backpressure.

No textual import here: this is the model layer, tested without a terminal.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from blockviz.model.guide import GUIDE_KINDS, Guide
from blockviz.model.timeline import Timeline
from engine import events as ev

SPEEDS = (1.0, 2.0, 5.0, 10.0, 25.0, 50.0, 100.0, 250.0, 1000.0, math.inf)  # events per second
DEFAULT_SPEED_INDEX = 4  # 25 events/s
# Guided playback slows to a stop: within GUIDE_SLOW_EVENTS of a card it plays at most GUIDE_SLOW_SPEED.
GUIDE_SLOW_EVENTS = 6
GUIDE_SLOW_SPEED = 4.0


@dataclass(slots=True)
class Pending:
    """What the UI is waiting for from a live engine: `kind` "event" (advance one event), "step"
    (advance to the next step end) or "end" (follow to the newest event)."""

    kind: str


class Player:
    """Playback over a Timeline: play/pause, speed, single steps, time travel.

    In a live run `live` is True and the timeline grows; `engine_steps_wanted()` says how many engine
    steps the worker should run now (0 means wait): that is the backpressure.
    """

    def __init__(self, timeline: Timeline, *, live: bool = False, speed_index: int = DEFAULT_SPEED_INDEX,
                 lookahead: int = 64) -> None:
        self.timeline = timeline
        self.live = live
        self.playing = False
        self.speed_index = max(0, min(speed_index, len(SPEEDS) - 1))
        self.lookahead = lookahead
        self.pending: Pending | None = None
        self.finished = False  # a live engine said it has nothing left to run
        # Breakpoints: the event records `]` plays to (`default_breaks`: the TUI's are the guide's);
        # once chosen (`break_on = ...`: --break-on, B) playing stops at them too
        self._break_on: frozenset[type[ev.Event]] = frozenset()
        self.play_stops_at_breaks = False
        self.to_break = False  # `]` is playing to the next breakpoint
        self.stopped_at: ev.Event | None = None  # the breakpoint event playback last stopped at
        self.stopped_at_number = 0  # its number (1-based, as the status bar counts events)
        self.stop_position = -1  # where it stopped: the end of that event's operation
        self.guide: Guide | None = None  # the cards at the cursor (blockviz/model/guide.py)
        self.guided = False  # guided playback: it also stops at each card
        self._budget = 0.0

    @property
    def break_on(self) -> frozenset[type[ev.Event]]:
        return self._break_on

    @break_on.setter
    def break_on(self, kinds: frozenset[type[ev.Event]]) -> None:
        """Chosen breakpoints: `]` plays to them, and playing stops at them."""
        self._break_on = frozenset(kinds)
        self.play_stops_at_breaks = True

    def default_breaks(self, kinds: frozenset[type[ev.Event]] = GUIDE_KINDS) -> None:
        """Breakpoints nobody chose: `]` plays to them, playing does not stop at them."""
        self._break_on = frozenset(kinds)
        self.play_stops_at_breaks = False

    # ------------------------------------------------------------------ speed and play

    @property
    def speed(self) -> float:
        return SPEEDS[self.speed_index]

    @property
    def speed_label(self) -> str:
        return "max" if math.isinf(self.speed) else f"{self.speed:g} ev/s"

    @property
    def throughput_mode(self) -> bool:
        """Live, playing at max: the engine free-runs and the views follow at a low frame rate."""
        return self.live and self.playing and math.isinf(self.speed) and not self.finished

    def faster(self) -> None:
        self.speed_index = min(self.speed_index + 1, len(SPEEDS) - 1)

    def slower(self) -> None:
        self.speed_index = max(self.speed_index - 1, 0)

    def toggle_play(self) -> bool:
        self.playing = not self.playing
        self.to_break = False
        self._budget = 0.0
        if self.playing and not self.live and self.timeline.at_end:
            self.timeline.seek(0)  # replay again from the start
        return self.playing

    def tick(self, dt: float) -> bool:
        """Advance playback by `dt` seconds of wall time; returns whether the cursor moved. Guided,
        it slows near a card and stops on it; it stops at breakpoints when `]` asked or when they
        were chosen."""
        if not self.playing:
            return False
        timeline = self.timeline
        guide = self.scan_guide() if self.guided else None
        if math.isinf(self.speed):
            target = len(timeline)
        else:
            self._budget += self._speed_near_card(guide) * dt
            count = int(self._budget)
            self._budget -= count
            target = min(timeline.position + count, len(timeline))
        if guide is not None and guide.open_start is not None:
            target = min(target, guide.open_start)  # an idea still arriving: wait for its last event
        if target > timeline.position:  # an operation is drawn whole (blockviz/model/operation.py) ...
            landed = timeline.landing(target)
            self._budget -= landed - target  # ... and its extra events are paid for by the next frames
            target = landed
        stops = []
        break_event, break_number = None, 0
        if self.break_on and (self.to_break or self.play_stops_at_breaks):
            stop = timeline.next_of(self.break_on, timeline.position, target)
            if stop is not None:
                break_event, break_number = timeline.events[stop - 1], stop
                stop = timeline.operation_end(stop)  # the operation it is in, drawn whole
            spanning = guide.spanning(stop) if guide is not None and stop is not None else None
            # a breakpoint inside a card's idea (its second hit, a preemption's swap-out): its card
            card_stop = guide.stop_of(spanning) if spanning is not None else None
            stops.append(stop if card_stop is None else card_stop if card_stop <= target else None)
        if guide is not None:
            stops.append(guide.next_stop(timeline.position, target))
        stop = min((s for s in stops if s is not None), default=None)
        moved = timeline.seek(stop if stop is not None else target) if target != timeline.position else False
        if stop is not None:
            self.playing = self.to_break = False
            self.stopped_at = break_event if break_event is not None and stop == timeline.position else None
            self.stopped_at_number = break_number if self.stopped_at is not None else 0
            self.stop_position = timeline.position
            return moved
        if timeline.at_end and not self.live:
            self.playing = False
        if timeline.at_end and self.live and self.finished:
            self.playing = False
        return moved

    def scan_guide(self) -> Guide | None:
        """The guide, up to date with the timeline (its last idea closed once no more events come)."""
        guide = self.guide
        if self.live and self.finished and not self.timeline.settled:
            self.timeline.settle()
        if guide is not None:
            guide.scan(self.timeline.events, self.timeline.dropped_events)
            if not self.live or self.finished:
                guide.settle()
        return guide

    def _speed_near_card(self, guide: Guide | None) -> float:
        position = self.timeline.position
        if guide is None or guide.next_stop(position, position + GUIDE_SLOW_EVENTS) is None:
            return self.speed
        return min(self.speed, GUIDE_SLOW_SPEED)

    @property
    def card(self):
        """The guide's card at the cursor, while playback is not moving (None otherwise)."""
        guide = self.scan_guide()
        if guide is None or self.playing:
            return None
        return guide.card_at(self.timeline.position)

    # ------------------------------------------------------------------ stepping and time travel

    @property
    def inside(self):
        """The engine operation the cursor is inside (single-event stepping shows it), or None at a
        boundary (blockviz.model.operation.Operation)."""
        return self.timeline.operation_at()

    def step_event(self) -> bool:
        """One event on, even into an operation (`inside` says so)."""
        if self.timeline.forward(1):
            return True
        if self.live:
            self.pending = Pending("event")
        return False

    def step_engine(self) -> bool:
        target = self.timeline.next_step_end()
        if target is not None:
            return self.timeline.seek(target)
        if self.live:
            self.pending = Pending("step")
        return False

    def back_event(self) -> bool:
        self.playing = False
        return self.timeline.back(1)

    def back_step(self) -> bool:
        self.playing = False
        return self.timeline.seek(self.timeline.previous_step_end())

    def to_start(self) -> bool:
        self.playing = False
        return self.timeline.seek(0)

    def to_end(self) -> bool:
        return self.timeline.seek(len(self.timeline))

    @property
    def at_break(self) -> bool:
        """Whether the cursor rests where playback stopped for a breakpoint (`stopped_at`)."""
        return self.stopped_at is not None and self.stop_position == self.timeline.position

    def break_note(self) -> str:
        """The status line at a breakpoint: the event the cursor is on, by its number and kind, and,
        when the operation drawn whole runs past the breakpoint's event, that event too (a swap-out
        whose frees follow it); "" when the cursor is not at a breakpoint."""
        if not self.at_break:
            return ""
        position = self.timeline.position
        on = f"event {position} {self.timeline.current_event.type}"
        if self.stopped_at_number != position:
            on += f" (ends event {self.stopped_at_number} {self.stopped_at.type}'s operation)"
        return f"breakpoint: {on} · ] next, [ back"

    def run_to_break(self) -> None:
        """The next play (playing = True) runs to the next breakpoint event or, guided, the next card."""
        self.stopped_at = None
        self.to_break = True
        self._budget = 0.0

    def back_to_break(self) -> bool:
        """Back to just after the previous event of a `break_on` kind, or the previous card."""
        self.playing = False
        timeline = self.timeline
        previous = timeline.previous_of(self.break_on) if self.break_on else None
        while previous is not None and timeline.landing(previous) >= timeline.position:  # the operation the cursor ends
            op = timeline.operation_at(previous)
            previous = timeline.previous_of(self.break_on, before=op.start) if op is not None else None
        candidates = [timeline.landing(previous) if previous is not None else None]
        guide = self.scan_guide() if self.guided else None
        if guide is not None:
            earlier = [stop for card in guide.cards if 0 < (stop := guide.stop_of(card)) < self.timeline.position]
            candidates.append(earlier[-1] if earlier else None)
        target = max((c for c in candidates if c is not None), default=None)
        return self.timeline.seek(target) if target is not None else False

    def follow(self) -> None:
        """Move to the newest event once the next batch arrives (after a user command)."""
        if self.timeline.at_end:
            self.pending = Pending("end")

    # ------------------------------------------------------------------ live engine

    def on_events(self, events) -> bool:
        """A batch arrived from the engine: append it and satisfy what was pending."""
        timeline = self.timeline
        timeline.extend(events)
        pending, self.pending = self.pending, None
        if pending is None:
            return False  # playback moves the cursor, frame by frame (see tick)
        if pending.kind == "event":
            return timeline.forward(1)
        if pending.kind == "step":
            target = timeline.next_step_end()
            if target is None:
                self.pending = pending  # still waiting (the batch was a command's events)
                return timeline.seek(len(timeline))
            return timeline.seek(target)
        return timeline.seek(len(timeline))

    def engine_steps_wanted(self) -> int:
        """How many engine steps the worker should run now (live runs only)."""
        if not self.live or self.finished:
            return 0
        pending = self.pending
        if pending is not None and pending.kind == "event" and self.timeline.at_end:
            return 1
        if pending is not None and pending.kind == "step" and self.timeline.next_step_end() is None:
            return 1
        if self.playing and len(self.timeline) - self.timeline.position < self.lookahead:
            return 1
        return 0

"""Time travel over an event stream: a cursor into the events, and the reducer state at the cursor.

`Timeline` keeps every event it was given, a reducer snapshot every `snapshot_every` events, and the
state at `position` (the number of events applied). Seeking forward applies events; seeking back
restores the nearest snapshot at or before the target and replays from there, so stepping back N
events and forward N again lands on exactly the same state.

`Player` puts playback on top: play/pause at a speed (events per second), step one event or one
engine step (up to the next step_finished), back the same ways, and — in a live run — how many
engine steps the UI still needs, which is how the engine worker gets its backpressure.

No textual import here: this is the model layer, tested without a terminal.
"""

from __future__ import annotations

import bisect
import math
from dataclasses import dataclass

from engine import events as ev
from engine.reducer import ReducerState

SNAPSHOT_EVERY = 256
SPEEDS = (1.0, 2.0, 5.0, 10.0, 25.0, 50.0, 100.0, 250.0, 1000.0, math.inf)  # events per second
DEFAULT_SPEED_INDEX = 4  # 25 events/s


def parse_break_on(text: str) -> frozenset[str]:
    """Event kinds from a comma-separated list ("copy_on_write,swap_out"); a ValueError names an
    unknown one and lists the kinds."""
    kinds = frozenset(part.strip() for part in text.split(",") if part.strip())
    unknown = sorted(kinds - set(ev.EVENT_TYPES))
    if unknown:
        raise ValueError(f"unknown event kind {', '.join(unknown)}: the kinds are {', '.join(sorted(ev.EVENT_TYPES))}")
    return kinds


def state_equal(a: ReducerState, b: ReducerState) -> bool:
    """Two reducer states hold the same picture (every attribute equal)."""
    return vars(a) == vars(b)


class Timeline:
    """Events, reducer snapshots, and the state at a cursor."""

    def __init__(self, block_size: int, num_gpu_blocks: int, num_cpu_blocks: int,
                 snapshot_every: int | None = None) -> None:
        if snapshot_every is None:
            # A snapshot costs about a pool's worth of work and replaying an event far less: one
            # snapshot per four pools' worth of events keeps snapshots cheap per event while a seek
            # replays only a few thousand events (benchmarks/README.md has the figures).
            snapshot_every = max(SNAPSHOT_EVERY, 4 * (num_gpu_blocks + num_cpu_blocks))
        if snapshot_every < 1:
            raise ValueError(f"snapshot_every must be >= 1, got {snapshot_every}")
        self.block_size = block_size
        self.num_gpu_blocks = num_gpu_blocks
        self.num_cpu_blocks = num_cpu_blocks
        self.snapshot_every = snapshot_every
        self.events: list[ev.Event] = []
        self.state = ReducerState(block_size, num_gpu_blocks, num_cpu_blocks)
        self.position = 0
        self._snapshots: dict[int, tuple] = {0: self.state.freeze()}  # position -> ReducerState.freeze()
        self.step_ends: list[int] = []  # positions just after each step_finished
        self._step_stats: list[tuple[int, float]] = []  # (tokens generated, duration_s) per step
        self._tokens_since_step = 0
        self.token_texts: dict[int, str] = {}  # token id -> its text piece, from every event seen

    @classmethod
    def for_trace(cls, trace, snapshot_every: int | None = None) -> "Timeline":
        timeline = cls(trace.block_size, trace.num_gpu_blocks, trace.num_cpu_blocks, snapshot_every)
        timeline.extend(trace.events)
        return timeline

    def __len__(self) -> int:
        return len(self.events)

    @property
    def at_end(self) -> bool:
        return self.position == len(self.events)

    @property
    def current_event(self) -> ev.Event | None:
        """The event applied last (the one the cursor just passed), if any."""
        return self.events[self.position - 1] if self.position else None

    def extend(self, events) -> None:
        """Add events at the end (the cursor does not move)."""
        for event in events:
            self.events.append(event)
            kind = event.type
            if kind == "step_finished":
                self.step_ends.append(len(self.events))
                self._step_stats.append((self._tokens_since_step, event.duration_s))
                self._tokens_since_step = 0
            elif kind == "token_generated":
                self._tokens_since_step += 1
                self.token_texts.setdefault(event.token_id, event.text)
            elif kind == "request_added":
                for token_id, text in zip(event.prompt_token_ids, event.prompt_tokens_text):
                    self.token_texts.setdefault(token_id, text)

    def seek(self, position: int) -> bool:
        """Move the cursor to `position` (clamped to [0, len]); returns whether it moved."""
        position = max(0, min(position, len(self.events)))
        if position == self.position:
            return False
        if position < self.position:
            base = position - position % self.snapshot_every
            while base not in self._snapshots:  # only possible for positions never reached
                base -= self.snapshot_every
            self.state = ReducerState.thaw(self._snapshots[base])
            self.position = base
        state, every = self.state, self.snapshot_every
        start = self.position
        while start < position:  # fold up to each snapshot boundary in one batch
            stop = min(position, (start // every + 1) * every)
            state.apply_all(self.events[start:stop])
            if stop % every == 0 and stop not in self._snapshots:
                self._snapshots[stop] = state.freeze()
            start = stop
        self.position = position
        return True

    def forward(self, count: int = 1) -> bool:
        return self.seek(self.position + count)

    def back(self, count: int = 1) -> bool:
        return self.seek(self.position - count)

    def next_step_end(self) -> int | None:
        """Position just after the next step_finished beyond the cursor, if it has arrived."""
        index = bisect.bisect_right(self.step_ends, self.position)
        return self.step_ends[index] if index < len(self.step_ends) else None

    def step_end(self, step: int) -> int:
        """Position just after engine step `step` finished (1-based); all events past the last step."""
        return self.step_ends[step - 1] if 1 <= step <= len(self.step_ends) else len(self.events)

    def previous_step_end(self) -> int:
        """Position just after the last step_finished before the cursor (0 if none)."""
        index = bisect.bisect_left(self.step_ends, self.position) - 1
        return self.step_ends[index] if index >= 0 else 0

    def num_steps_done(self) -> int:
        """Engine steps finished at the cursor."""
        return bisect.bisect_right(self.step_ends, self.position)

    def next_of(self, kinds: frozenset[str], start: int, stop: int) -> int | None:
        """The position just after the first event of one of `kinds` among events[start:stop]."""
        for index in range(start, min(stop, len(self.events))):
            if self.events[index].type in kinds:
                return index + 1
        return None

    def previous_of(self, kinds: frozenset[str]) -> int | None:
        """The position just after the last event of one of `kinds` before the cursor's event."""
        for index in range(self.position - 2, -1, -1):
            if self.events[index].type in kinds:
                return index + 1
        return None

    def tokens_per_second(self, window: int = 8) -> float | None:
        """Generated tokens per second of engine time over the last `window` steps at the cursor."""
        done = self.num_steps_done()
        stats = self._step_stats[max(0, done - window):done]
        duration = sum(d for _, d in stats)
        if not stats or duration <= 0:
            return None
        return sum(n for n, _ in stats) / duration


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
        self.break_on: frozenset[str] = frozenset()  # event kinds playback stops at (breakpoints)
        self.stopped_at: ev.Event | None = None  # the breakpoint event playback last stopped at
        self._budget = 0.0

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
        self._budget = 0.0
        if self.playing and not self.live and self.timeline.at_end:
            self.timeline.seek(0)  # replay again from the start
        return self.playing

    def tick(self, dt: float) -> bool:
        """Advance playback by `dt` seconds of wall time; returns whether the cursor moved."""
        if not self.playing:
            return False
        timeline = self.timeline
        if math.isinf(self.speed):
            target = len(timeline)
        else:
            self._budget += self.speed * dt
            count = int(self._budget)
            self._budget -= count
            target = min(timeline.position + count, len(timeline))
        stop = timeline.next_of(self.break_on, timeline.position, target) if self.break_on else None
        moved = timeline.seek(stop if stop is not None else target) if target != timeline.position else False
        if stop is not None:
            self.playing = False
            self.stopped_at = timeline.current_event
            return moved
        if timeline.at_end and not self.live:
            self.playing = False
        if timeline.at_end and self.live and self.finished:
            self.playing = False
        return moved

    # ------------------------------------------------------------------ stepping and time travel

    def step_event(self) -> bool:
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

    def back_to_break(self) -> bool:
        """Back to just after the previous event of a `break_on` kind."""
        self.playing = False
        target = self.timeline.previous_of(self.break_on) if self.break_on else None
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

"""Time travel over an event stream: a cursor into the events, and the reducer state at the cursor.

`Timeline` keeps every event it was given, reducer snapshots spaced by at least `snapshot_every`
events (and by the state's size: see `_take_snapshot`), and the state at `position` (the number of
events applied). Seeking forward applies events; seeking back
restores the nearest snapshot at or before the target and replays from there, so stepping back N
events and forward N again lands on exactly the same state.

A live timeline may cap what it keeps (`max_events`): once it holds more, it drops its oldest
whole steps, keeping the state where the kept events begin as its first snapshot, so time travel
covers what is kept and memory stays bounded however long a session runs. Requests that had
finished by then are dropped from the picture with their events; `dropped_events`,
`dropped_steps` and `dropped_requests` count what went, for the views to say so.

Playback on top of it (play, pause, speed, stepping) is blockviz/model/player.py.

No textual import here: this is the model layer, tested without a terminal.
"""

from __future__ import annotations

import bisect

from engine import events as ev
from blockviz.model.design import kv_cache_groups_of, kv_manager_of
from blockviz.model.operation import Operation, Operations
from blockviz.model.reducer import ReducerState

SNAPSHOT_EVERY = 256
MIN_KEPT_EVENTS = 1000  # the smallest cap: a few steps of a busy engine
LIVE_MAX_EVENTS = 200_000  # what a live session keeps by default (`run --keep-events`, Visualizer.live)
KEEP_AFTER_DROP = 0.75  # a capped timeline drops down to this share of its cap (steps at a time)


def state_equal(a: ReducerState, b: ReducerState) -> bool:
    """Two reducer states hold the same picture (every attribute equal)."""
    return vars(a) == vars(b)


class Timeline:
    """Events, reducer snapshots, and the state at a cursor."""

    def __init__(self, block_size: int, num_gpu_blocks: int, num_cpu_blocks: int,
                 snapshot_every: int | None = None, kv_manager: str = "v0",
                 max_events: int | None = None, kv_cache_groups: tuple = ()) -> None:
        self._spaced_by_size = snapshot_every is None  # a given spacing is kept exactly (tests)
        if snapshot_every is None:
            # A snapshot costs about a pool's worth of work and replaying an event far less: one
            # snapshot per four pools' worth of events keeps snapshots cheap per event while a seek
            # replays only a few thousand events (benchmarks/README.md has the figures).
            snapshot_every = max(SNAPSHOT_EVERY, 4 * (num_gpu_blocks + num_cpu_blocks))
        if snapshot_every < 1:
            raise ValueError(f"snapshot_every must be >= 1, got {snapshot_every}")
        if max_events is not None and max_events < MIN_KEPT_EVENTS:
            raise ValueError(f"max_events must be at least {MIN_KEPT_EVENTS}, got {max_events}")
        self.max_events = max_events
        self.dropped_events = 0  # events dropped from the front (a capped live timeline)
        self.dropped_steps = 0
        self.dropped_requests = 0
        self.block_size = block_size
        self.num_gpu_blocks = num_gpu_blocks
        self.num_cpu_blocks = num_cpu_blocks
        self.snapshot_every = snapshot_every
        self.events: list[ev.Event] = []
        self.state = ReducerState.from_header({"block_size": block_size, "num_gpu_blocks": num_gpu_blocks,
                                                "num_cpu_blocks": num_cpu_blocks, "kv_manager": kv_manager,
                                                "kv_cache_groups": kv_cache_groups})
        self.position = 0
        self._snapshots: dict[int, tuple] = {}  # position -> ReducerState.freeze()
        self._snapshot_at: list[int] = []  # the positions of the snapshots, in order
        self._next_snapshot = 0
        self._take_snapshot(0)
        self.step_ends: list[int] = []  # positions just after each step_finished
        self._step_stats: list[tuple[int, float]] = []  # (tokens generated, duration_s) per step
        self._tokens_since_step = 0
        self.token_texts: dict[int, str] = {}  # token id -> its text piece, from every event seen
        self.operations = Operations()  # where each engine operation ends (blockviz/model/operation.py)
        self.settled = False  # no more events will come (a trace, or a live engine that finished)

    @classmethod
    def for_header(cls, header: dict, snapshot_every: int | None = None,
                   max_events: int | None = None) -> "Timeline":
        """An empty timeline for a run with this trace header (a live engine's, or a trace's)."""
        return cls(header["block_size"], header["num_gpu_blocks"], header["num_cpu_blocks"], snapshot_every,
                   kv_manager_of(header), max_events, kv_cache_groups_of(header))

    @classmethod
    def for_trace(cls, trace, snapshot_every: int | None = None) -> "Timeline":
        timeline = cls.for_header(trace.header, snapshot_every)
        timeline.extend(trace.events)
        timeline.settle()
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
        operations = self.operations
        for event in events:
            self.events.append(event)
            operations.add(event)
            note = _NOTES.get(type(event))
            if note is not None:
                note(self, event)
        if self.max_events is not None and len(self.events) > self.max_events:
            self._drop_oldest()

    def settle(self) -> None:
        """No more events will come: the operation still open is whole."""
        self.settled = True
        self.operations.close()

    def operation_at(self, position: int | None = None) -> Operation | None:
        """The engine operation a cursor at `position` (the cursor's by default) is inside, if any
        (its start and end counted from the kept front; end None while it may still grow)."""
        position = self.position if position is None else position
        offset = self.dropped_events
        op = self.operations.at(position + offset, self.settled)
        if op is None:
            return None
        return Operation(op.kind, op.start - offset, None if op.end is None else op.end - offset)

    def operation_end(self, position: int) -> int | None:
        """The first operation boundary at or after `position`, where the drawn state is one the
        engine can be in; None while the operation there may still grow (a live run)."""
        op = self.operation_at(position)
        return position if op is None else op.end

    def landing(self, position: int) -> int:
        """Where a cursor asked for at `position` lands: the end of the operation there, or its
        start while that operation is still arriving."""
        op = self.operation_at(position)
        if op is None:
            return position
        return op.end if op.end is not None else max(op.start, 0)

    def _drop_oldest(self) -> None:
        """Drop the oldest steps until at most KEEP_AFTER_DROP of the cap is kept (at a step's end
        where one falls in range). The state where the kept events begin, less the requests that
        had finished by then, becomes snapshot 0; later snapshots forget the same requests; the
        cursor keeps its event, or goes to the first kept one if its event was dropped."""
        total = len(self.events)
        least, most = total - self.max_events, total - int(self.max_events * KEEP_AFTER_DROP)
        index = bisect.bisect_right(self.step_ends, most) - 1
        cut = self.step_ends[index] if index >= 0 and self.step_ends[index] >= least else most
        base = self._state_at(cut)
        gone = base.forget_finished()
        snapshots = {0: base.freeze()}
        for at in self._snapshot_at:
            if at > cut:
                later = ReducerState.thaw(self._snapshots[at])
                for request_id in gone:
                    later.forget(request_id)
                snapshots[at - cut] = later.freeze()
        self._snapshots, self._snapshot_at = snapshots, sorted(snapshots)
        self._next_snapshot = max(self._next_snapshot - cut, 1)
        if self.position >= cut:
            for request_id in gone:
                self.state.forget(request_id)
            self.position -= cut
        else:
            self.state, self.position = ReducerState.thaw(snapshots[0]), 0
        steps = bisect.bisect_right(self.step_ends, cut)
        self.step_ends = [end - cut for end in self.step_ends[steps:]]
        self._step_stats = self._step_stats[steps:]
        self.events = self.events[cut:]  # a new list: views keyed on the old one start over
        self.dropped_events += cut
        self.operations.forget_before(self.dropped_events)
        self.dropped_steps += steps
        self.dropped_requests += len(gone)

    def _state_at(self, position: int) -> ReducerState:
        """A fresh copy of the state after `position` events (the cursor does not move)."""
        index = bisect.bisect_right(self._snapshot_at, position) - 1
        base = self._snapshot_at[index]
        return ReducerState.thaw(self._snapshots[base]).apply_all(self.events[base:position])

    def base_state(self) -> ReducerState:
        """A fresh copy of the state where the kept events begin (the empty pools, uncapped)."""
        return ReducerState.thaw(self._snapshots[0])

    def dropped_note(self, brief: bool = False) -> str:
        """What a capped timeline dropped, in words ("" when nothing); `brief`: only the steps."""
        if not self.dropped_events:
            return ""
        steps = "step 1" if self.dropped_steps == 1 else f"steps 1-{self.dropped_steps}"
        if brief:
            return f"{steps} dropped"
        return (f"{steps} dropped ({self.dropped_requests} finished request{'' if self.dropped_requests == 1 else 's'}): "
                f"a live session keeps its last {self.max_events:,} events")

    def _step_finished(self, event: ev.StepFinished) -> None:
        self.step_ends.append(len(self.events))
        self._step_stats.append((self._tokens_since_step, event.duration_s))
        self._tokens_since_step = 0

    def _token_generated(self, event: ev.TokenGenerated) -> None:
        self._tokens_since_step += 1
        self.token_texts.setdefault(event.token_id, event.text)

    def _request_added(self, event: ev.RequestAdded) -> None:
        for token_id, text in zip(event.prompt_token_ids, event.prompt_tokens_text):
            self.token_texts.setdefault(token_id, text)

    def seek(self, position: int) -> bool:
        """Move the cursor to `position` (clamped to [0, len]); returns whether it moved."""
        position = max(0, min(position, len(self.events)))
        if position == self.position:
            return False
        if position < self.position:
            index = bisect.bisect_right(self._snapshot_at, position) - 1
            base = self._snapshot_at[index]
            self.state = ReducerState.thaw(self._snapshots[base])
            self.position = base
        state = self.state
        start = self.position
        while start < position:  # fold up to the next snapshot point in one batch
            stop = min(position, self._next_snapshot) if start < self._next_snapshot else position
            state.apply_all(self.events[start:stop])
            if stop == self._next_snapshot:
                self._take_snapshot(stop)
            start = stop
        self.position = position
        return True

    def _take_snapshot(self, position: int) -> None:
        """Keep the state at `position` (the cursor's, just folded) and say where the next one goes:
        `snapshot_every` events on, or as many events as the snapshot holds items, whichever is
        more. A snapshot copies the whole state (every block, sequence and request), so spacing
        them by its size keeps their memory linear in the events of a long live run, where a fixed
        spacing would grow with the square of it; a seek back replays at most that many events,
        about what thawing the snapshot costs anyway."""
        frozen = self.state.freeze()
        self._snapshots[position] = frozen
        self._snapshot_at.append(position)
        size = self.state.size() if self._spaced_by_size else 0
        self._next_snapshot = position + max(self.snapshot_every, size)

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

    def next_of(self, kinds: frozenset[type[ev.Event]], start: int, stop: int) -> int | None:
        """The position just after the first event of one of the records `kinds` among events[start:stop]."""
        for index in range(start, min(stop, len(self.events))):
            if type(self.events[index]) in kinds:
                return index + 1
        return None

    def previous_of(self, kinds: frozenset[type[ev.Event]], before: int | None = None) -> int | None:
        """The position just after the last event of one of the records `kinds` before the cursor's
        event (or before position `before`)."""
        start = self.position - 2 if before is None else before - 1
        for index in range(start, -1, -1):
            if type(self.events[index]) in kinds:
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


# What Timeline.extend notes of an event, by its record.
_NOTES = {
    ev.StepFinished: Timeline._step_finished,
    ev.TokenGenerated: Timeline._token_generated,
    ev.RequestAdded: Timeline._request_added,
}

"""Recorder: the figures of a finished run, gathered from its events as they come (a reducer over
them, each sequence's last block table, the peak of device blocks in use with the token
utilization then, the blocks in use after each step). `blockviz generate` prints them as its
summary; compare.py makes its columns of them. No torch, no textual.
"""

from __future__ import annotations

from blockviz.model.reducer import ReducerState
from engine import events as ev

# the events after which more device blocks may be in use than before
_TAKES_A_BLOCK = (ev.BlockAllocated, ev.PrefixCacheHit, ev.CopyOnWrite, ev.SwappedIn)


class Recorder:
    """Called with each batch of a run's events (EngineSession.run_to_completion's on_events)."""

    def __init__(self, header: dict) -> None:
        self.state = ReducerState.from_header(header)
        self.final_tables: dict[int, list[tuple[str, int]]] = {}
        self.peak_used = 0
        self.token_utilization_at_peak = 0.0
        self.used_by_step: dict[int, int] = {}

    def __call__(self, events) -> None:
        for event in events:
            self.apply(event)

    def apply(self, event: ev.Event) -> None:
        state = self.state
        if isinstance(event, ev.SequenceFreed):
            self.final_tables[event.seq_id] = list(state.tables.get(event.seq_id, []))
        state.apply(event)
        if isinstance(event, _TAKES_A_BLOCK):
            used = state.num_used("gpu")
            if used > self.peak_used:
                self.peak_used, self.token_utilization_at_peak = used, state.kv_utilization()
        elif isinstance(event, ev.StepFinished):
            self.used_by_step[event.step] = state.num_used("gpu")

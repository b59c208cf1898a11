"""Numbers a student will catch, agreeing: the memory panel's "empty slots in last blocks" counts a
block two sequences share once (a fork's shared last block is one block, its empty slots one set)."""

from __future__ import annotations

from blockviz.model.insights import max_tokens_of, memory_truth
from blockviz.model.reducer import ReducerState
from blockviz.model.trace import load_trace
from engine import events as ev


def test_a_shared_last_block_is_counted_once():
    trace = load_trace("fork-cow")
    state = ReducerState.from_header(trace.header)
    events = list(trace.events)
    fork = next(i for i, e in enumerate(events) if isinstance(e, ev.Forked))
    for e in events[:fork + 1]:
        state.apply(e)
    truth = memory_truth(state, max_tokens_of(events[:fork + 1]))
    parent, child = events[fork].parent_seq_id, events[fork].child_seq_id
    assert state.tables[parent][-1] == state.tables[child][-1]  # one last block, two tables
    last = state.pools["gpu"][state.tables[parent][-1][1]]
    empty = trace.header["block_size"] - len(last.token_ids)
    assert empty > 0
    assert truth.seqs[parent].empty_in_last_block == truth.seqs[child].empty_in_last_block == empty
    assert truth.internal_fragmentation == sum(
        s.empty_in_last_block for seq_id, s in truth.seqs.items() if seq_id != child)

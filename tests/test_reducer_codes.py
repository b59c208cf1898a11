"""The reducer's state codes (a character per block, kept as events change blocks: what a pool of
any size is drawn and counted from) equal the codes recomputed from its blocks after every event of
every shipped trace and of a 200,000-block trace, and after seeks back through time travel's
snapshots; the counts and v1's free-queue figures read from them equal the ones counted block by block."""

from __future__ import annotations

import pytest

from big_pool_fixtures import NUM_GPU_BLOCKS, big_pool_trace
from blockviz.model.reducer import ReducerState
from reducer_checks import check_state_codes
from blockviz.model.timeline import Timeline, state_equal
from blockviz.model.trace import load_trace, shipped_traces
from blockviz.model.view import block_state, free_queue, pool_counts


def check_counts(state: ReducerState) -> None:
    """pool_counts and the free queue's cached blocks, against a count block by block."""
    for device, pool in state.pools.items():
        states = [block_state(block) for block in pool]
        assert pool_counts(state)[device] == (states.count("used"), states.count("cached"), states.count("free"))
    queue = free_queue(state, limit=None)
    if queue is not None:
        assert queue.num_cached == sum(state.pools["gpu"][n].block_hash is not None for n in state.free_queue)
        assert queue.blocks == [[n, state.pools["gpu"][n].block_hash is not None] for n in state.free_queue]


@pytest.mark.parametrize("name", shipped_traces())
def test_the_codes_equal_the_blocks_after_every_event_and_every_seek_back_of_a_shipped_trace(name):
    trace = load_trace(name)
    timeline = Timeline.for_trace(trace, snapshot_every=7)  # seeks back thaw snapshots and replay from them
    hashed_ever = False
    for position in range(1, len(timeline) + 1):
        timeline.seek(position)
        check_state_codes(timeline.state)
        check_counts(timeline.state)
        hashed_ever |= bool(timeline.state.hashed_gpu_blocks)
    ends = timeline.state.copy()
    for position in range(len(timeline) - 1, -1, -3):  # backwards, through the snapshots
        timeline.seek(position)
        check_state_codes(timeline.state)
    timeline.seek(len(timeline))
    assert state_equal(timeline.state, ends)  # the codes too: state_equal compares every attribute
    assert hashed_ever == any(type(e).__name__ == "BlockHashed" for e in trace.events)


def test_the_codes_equal_the_blocks_after_every_event_of_a_200000_block_pool_and_after_seeks_back():
    trace = big_pool_trace()
    timeline = Timeline.for_trace(trace, snapshot_every=128)
    for position in range(1, len(timeline) + 1):
        timeline.seek(position)
        check_state_codes(timeline.state)
    state = timeline.state
    assert len(state.codes["gpu"]) == NUM_GPU_BLOCKS and state.block_codes("gpu", 99_998, 100_018) == "ff" + "c" * 8 + "u" * 8 + "ff"
    assert state.hashed_gpu_blocks == set(range(100_000, 100_016))
    ends = state.copy()
    for position in (len(timeline) - 5, 200, 129, 3, 0):  # inside the frees, between snapshots, the empty pool
        timeline.seek(position)
        check_state_codes(timeline.state)
    assert timeline.state.block_codes("gpu") == "f" * NUM_GPU_BLOCKS and not timeline.state.hashed_gpu_blocks
    timeline.seek(len(timeline))
    assert state_equal(timeline.state, ends)


def test_a_copy_keeps_its_own_codes():
    timeline = Timeline.for_trace(load_trace("prefix-hit"))
    timeline.seek(len(timeline))
    state = timeline.state
    copy = state.copy()
    assert copy.codes == state.codes and copy.hashed_gpu_blocks == state.hashed_gpu_blocks
    copy.codes["gpu"][1] = ord("u")
    copy.hashed_gpu_blocks.add(10**6)
    assert not state_equal(copy, state)
    check_state_codes(state)

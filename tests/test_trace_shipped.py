"""The traces shipped in blockviz/traces/ (made by scripts/make_traces.py from the real engine and
the bundled model) read cleanly, show what they are named for, and replay to an empty pool."""

from __future__ import annotations

import pytest

from blockviz.commands.replay import resolve_trace_path, shipped_traces
from blockviz.history import Timeline
from blockviz.trace import read_trace

EXPECTED = {
    "prefill": {"block_allocated", "slot_appended", "block_freed"},
    "fork-cow": {"fork", "copy_on_write", "kv_digest"},
    "prefix-hit": {"prefix_cache_hit", "block_hashed"},
    "swap": {"swap_out", "swap_in", "preempted"},
    "recompute": {"preempted"},
}


def test_every_scenario_is_shipped():
    assert set(shipped_traces()) == set(EXPECTED)


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_shipped_trace_replays_to_the_end(name):
    trace = read_trace(resolve_trace_path(name))
    header = trace.header
    assert header["format"] == "blockviz-trace" and header["model"] == "tiny-shakespeare"
    assert header["scenario"] == name and header["prompts"]
    assert EXPECTED[name] <= {e.type for e in trace.events}
    if name == "recompute":
        assert any(e.type == "preempted" and e.mode == "recompute" for e in trace.events)
    timeline = Timeline.for_trace(trace)
    timeline.seek(len(timeline))
    state = timeline.state
    assert state.num_used("gpu") == 0 and state.num_used("cpu") == 0
    assert all(seq.status == "finished" for seq in state.seqs.values())

"""The traces shipped in blockviz/traces/ (made by scripts/make_traces.py from the real engine and
the bundled model) read cleanly, show what they are named for, and replay to an empty pool."""

from __future__ import annotations

import pytest

from blockviz.commands.replay import resolve_trace_path, shipped_traces
from blockviz.model.timeline import Timeline
from blockviz.model.trace import read_trace

EXPECTED = {
    "prefill": {"block_allocated", "slot_appended", "block_freed"},
    "fork-cow": {"fork", "copy_on_write", "kv_digest"},
    "prefix-hit": {"prefix_cache_hit", "block_hashed"},
    "swap": {"swap_out", "swap_in", "preempted"},
    "recompute": {"preempted"},
    "eviction": {"block_evicted", "prefix_cache_hit", "block_hashed"},
    "v1-story": {"tokens_scheduled", "prefix_cache_hit", "preempted", "block_evicted"},  # tests/test_v1_story.py
    "hybrid": {"blocks_skipped", "block_freed", "prefix_cache_hit", "block_evicted"},  # tests/test_hybrid_story.py
    "cpu-tier": {"offload_store", "preempted", "block_evicted", "offload_load"},  # tests/test_cpu_tier_story.py
    "sglang-story": {"radix_node_split", "radix_lock_ref", "radix_evict", "radix_node_evicted",
                     "tokens_scheduled"},  # tests/test_sglang_story.py
}
MODELS = {"hybrid": "tiny-hybrid"}  # the story's own model (blockviz/session/tiny_hybrid.py); else the bundled one


def test_every_scenario_is_shipped():
    assert set(shipped_traces()) == set(EXPECTED)


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_shipped_trace_replays_to_the_end(name):
    trace = read_trace(resolve_trace_path(name))
    header = trace.header
    assert header["format"] == "blockviz-trace" and header["model"] == MODELS.get(name, "tiny-shakespeare")
    assert header["scenario"] == name and (header["prompts"] or header.get("arrivals"))
    assert EXPECTED[name] <= {e.type for e in trace.events}
    if name == "recompute":
        assert any(e.type == "preempted" and e.mode == "recompute" for e in trace.events)
    if name == "eviction":  # ROMEO's line again: hits on what is still cached, then an evicted block
        from blockviz.model.explain import EVICTED, explain_requests

        last = explain_requests(trace.events, header["block_size"], header["num_gpu_blocks"],
                                header["num_cpu_blocks"], header["enable_prefix_caching"])[-1]
        assert last.num_hit_blocks > 0 and last.first_miss.verdict == EVICTED
        evicted = next(e for e in trace.events if e.seq_no == last.first_miss.evicted_by)
        assert evicted.type == "block_evicted" and evicted.block_hash == last.first_miss.block_hash
    timeline = Timeline.for_trace(trace)
    timeline.seek(len(timeline))
    state = timeline.state
    assert state.num_used("gpu") == 0 and state.num_used("cpu") == 0
    assert all(seq.status == "finished" for seq in state.seqs.values())

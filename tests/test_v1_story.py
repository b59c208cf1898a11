"""vLLM v1's story (`blockviz run --kv-manager v1`, scenario.DEFAULT_V1_SCENARIO) and the trace shipped
from it (blockviz/traces/v1-story.jsonl) show each moment they are told for, found by event records
and fields: n=2 as two requests, the second hitting the first's prompt blocks; a recompute
preemption, then hits for the same sequence; a chunked prefill; an eviction of the free queue's head."""

from __future__ import annotations

from blockviz.cli import build_parser
from blockviz.commands.run import check
from blockviz.model.reducer import ReducerState
from blockviz.model.trace import load_trace
from blockviz.session.scenario import DEFAULT_V1_SCENARIO, DEFAULT_V1_SCENARIO_OPTIONS, V1_TOKEN_BUDGET
from engine import events as ev


def moments(header: dict, events: list[ev.Event]) -> dict[str, int | None]:
    """The index of the first event showing each moment of the v1 story (None when it never happens)."""
    found: dict[str, int | None] = dict.fromkeys(("second_child_hit", "chunked_prefill", "revived", "head_evicted"))
    state = ReducerState.from_header(header)
    children: tuple[int, ...] = ()
    preempted: set[int] = set()
    for index, e in enumerate(events):
        if isinstance(e, ev.RequestAdded) and e.n == 2:
            assert len(e.seq_ids) == 2  # v1: n=2 is two sequences queued together, no fork
            children = e.seq_ids
        elif isinstance(e, ev.PrefixCacheHit) and children and children[1] in e.seq_ids and e.logical_index == 0:
            found["second_child_hit"] = found["second_child_hit"] or index
        if isinstance(e, ev.TokensScheduled) and any(
                done + new < total for done, new, total in zip(e.num_computed_tokens, e.num_new_tokens, e.num_tokens)):
            found["chunked_prefill"] = found["chunked_prefill"] or index
        if isinstance(e, ev.Preempted):
            assert e.mode == "recompute"
            preempted.update(e.seq_ids)
        elif isinstance(e, ev.PrefixCacheHit) and preempted & set(e.seq_ids):
            found["revived"] = found["revived"] or index
        if isinstance(e, ev.BlockEvicted) and state.free_queue and state.free_queue[0] == e.block:
            found["head_evicted"] = found["head_evicted"] or index
        state.apply(e)
    return found


def test_the_shipped_v1_trace_shows_every_moment_of_the_story():
    trace = load_trace("v1-story")
    header = trace.header
    assert header["kv_manager"] == "v1" and header["num_cpu_blocks"] == 0
    assert [(a["step"], a["prompt"], a["n"]) for a in header["arrivals"]] == [
        (a.step, a.prompt, a.n) for a in DEFAULT_V1_SCENARIO]
    assert (header["block_size"], header["num_gpu_blocks"]) == (
        DEFAULT_V1_SCENARIO_OPTIONS["block_size"], DEFAULT_V1_SCENARIO_OPTIONS["num_gpu_blocks"])
    found = moments(header, trace.events)
    assert all(index is not None for index in found.values()), found
    assert not any(isinstance(e, (ev.Forked, ev.CopyOnWrite, ev.SwappedOut, ev.SwappedIn)) for e in trace.events)


def test_run_with_kv_manager_v1_plays_the_v1_story():
    args = build_parser().parse_args(["run", "--kv-manager", "v1"])
    spec = check(args, device=False)
    assert spec.arrivals == DEFAULT_V1_SCENARIO
    assert spec.config.kv_manager == "v1" and spec.config.max_num_batched_tokens == V1_TOKEN_BUDGET
    assert spec.config.enable_prefix_caching and spec.config.preemption_mode is None
    v0 = check(build_parser().parse_args(["run"]), device=False)
    assert v0.arrivals != DEFAULT_V1_SCENARIO and v0.config.max_num_batched_tokens is None
    mine = check(build_parser().parse_args(["run", "--kv-manager", "v1", "--prompt", "ROMEO:"]), device=False)
    assert not mine.arrivals and mine.config.max_num_batched_tokens is None  # your prompts: no story


def test_the_v1_story_run_live_shows_every_moment():
    """The story as `blockviz run --kv-manager v1` plays it, on the bundled model."""
    from story_fixtures import run_live

    header, events = run_live(["--kv-manager", "v1", "--device", "cpu"])
    found = moments(header, events)
    assert all(index is not None for index in found.values()), found


def test_the_v1_story_has_v1s_own_cards_at_its_moments():
    """Issue 39 item 6: the guide tells v1 as v1 does it: a chunked prefill, n=2 as requests sharing
    the prompt through the cache, recompute with v1's reason, eviction from the free queue's head."""
    from blockviz.model.guide import Guide

    trace = load_trace("v1-story")
    found = moments(trace.header, trace.events)
    guide = Guide("v1", opening=True)
    guide.scan(trace.events)
    guide.settle()
    cards = {card.idea: card for card in guide.cards}
    assert list(cards) == ["kv-cache", "chunked-prefill", "prefix-hit", "recompute", "eviction"]
    chunk = cards["chunked-prefill"]
    assert chunk.start == found["chunked_prefill"] and "16 tokens now (16 of 31 done)" in chunk.what
    share = cards["prefix-hit"]
    assert share.start == found["second_child_hit"] and "without a fork" in share.title
    assert "another sample of the same request" in share.what and "its own request" in share.what
    recompute = cards["recompute"]
    assert "never swaps" in recompute.why and "copy out and back" not in recompute.why
    assert "11 GPU blocks (" in recompute.what  # the plural where it belongs
    evicted = cards["eviction"]
    assert evicted.start == found["head_evicted"] and "head of the free queue" in evicted.what
    v0 = Guide("v0")
    v0.scan(load_trace("eviction").events)
    v0.settle()
    assert all("free queue" not in card.what and "never swaps" not in card.why for card in v0.cards)

"""The prefix-hit explainer, each reason reproduced on the real engine (a tiny GPT-2) and read back
from the explainer's output; its hits must be the engine's own prefix_cache_hit events."""

from __future__ import annotations

import pytest

from blockviz.cli import main
from blockviz.model.explain import (DIFFERENT_PARENT, DIFFERENT_TOKENS, EVICTED, HIT, LAST_BLOCK, NOT_CACHED,
                                   PARTIAL, explain_requests)
from engine import LLM, SamplingParams
from engine.designs import V1

P = [11, 12, 13, 14, 21, 22, 23, 24]  # two full blocks of 4 in common
PARAMS = SamplingParams(max_tokens=2, ignore_eos=True)


def _run(llm: LLM, *prompts: list[int]):
    """Each prompt to completion in turn; the explanations of their requests."""
    events = []
    llm.events.subscribe(events.append)
    for prompt in prompts:
        llm.generate([{"prompt_token_ids": prompt}], PARAMS)
    engine = llm.engine
    explanations = explain_requests(events, engine.config.block_size, engine.budget.num_gpu_blocks,
                                    engine.budget.num_cpu_blocks, engine.config.enable_prefix_caching,
                                    engine.config.kv_manager, engine.config.prefix_caching_hash_algo)
    hits = {}
    for e in events:
        if e.type == "prefix_cache_hit":
            hits.setdefault(e.seq_ids[0], []).append(e.logical_index)
    for x in explanations:  # the explainer's hits are exactly the engine's
        assert [b.index for b in x.blocks if b.verdict == HIT] == hits.get(x.seq_id, [])
    return explanations, events


@pytest.fixture(params=[("v0", "sha256"), ("v1", "sha256"), ("v1", "xxhash")], ids=["v0", "v1", "v1-xxhash"])
def llm(request, tiny_gpt2_dir):
    """Both managers: v1 hashes as vLLM v1 does (either algorithm) and caps a hit at num_tokens - 1."""
    kv_manager, algo = request.param
    return LLM(str(tiny_gpt2_dir), block_size=4, num_gpu_blocks=64, enable_prefix_caching=True,
               kv_manager=kv_manager, prefix_caching_hash_algo=algo)


def test_a_shared_opening_hits_exactly_the_shared_blocks_then_misses_on_different_tokens(llm):
    (first, second), _ = _run(llm, P + [31, 32, 33, 34, 5], P + [41, 42, 43, 44, 6])
    assert first.num_hit_blocks == 0 and first.first_miss.verdict == NOT_CACHED  # nothing to differ from
    assert [b.verdict for b in second.blocks] == [HIT, HIT, DIFFERENT_TOKENS, "not looked up: after the first miss"]
    assert second.num_hit_tokens == 8
    assert "prefix hit: 2 blocks, 8 tokens; first miss at L2: different tokens" in second.lines()[-1]


def test_an_empty_cache_says_not_cached_not_different_tokens(llm):
    (alone,), _ = _run(llm, P + [5])
    assert [b.verdict for b in alone.blocks][:1] == [NOT_CACHED]
    assert "first miss at L0: not cached: the cache is empty" in alone.lines()[-1]
    assert all(DIFFERENT_TOKENS not in line for line in alone.lines())


def test_a_cache_emptied_by_uncached_frees_is_empty_again(tiny_gpt2_dir):
    llm = LLM(str(tiny_gpt2_dir), block_size=4, num_gpu_blocks=64, enable_prefix_caching=False)
    events = []
    llm.events.subscribe(events.append)
    llm.generate([{"prompt_token_ids": P + [5]}], PARAMS)
    llm.generate([{"prompt_token_ids": [7, 8, 9, 10, 11]}], PARAMS)
    engine = llm.engine  # the same events explained as if caching were on: nothing was ever hashed
    explained = explain_requests(events, 4, engine.budget.num_gpu_blocks, engine.budget.num_cpu_blocks, True)
    assert [x.first_miss.verdict for x in explained] == [NOT_CACHED, NOT_CACHED]


def test_the_prompts_last_block_is_never_a_hit(llm):
    (_, exact), _ = _run(llm, P + [31, 32, 33, 34, 5], P)
    assert [b.verdict for b in exact.blocks] == [HIT, LAST_BLOCK]


def test_a_partial_block_has_no_hash_to_look_up(llm):
    (_, partial), _ = _run(llm, P + [31, 32, 33, 34, 5], P + [9])
    assert [b.verdict for b in partial.blocks] == [HIT, HIT, PARTIAL]
    assert partial.blocks[2].block_hash is None


def test_the_same_tokens_after_a_different_opening_miss_on_the_parent(llm):
    (_, moved), _ = _run(llm, P + [31, 32, 33, 34, 5], P[4:] + [51, 52])  # A's second block, first here
    assert moved.blocks[0].verdict == DIFFERENT_PARENT


def test_a_block_evicted_since_misses_and_names_the_eviction(tiny_gpt2_dir):
    llm = LLM(str(tiny_gpt2_dir), block_size=4, num_gpu_blocks=8, enable_prefix_caching=True, watermark=0.0)
    filler = list(range(100, 128))  # 7 blocks: the cached ones are evicted to make room
    (_, _, again), events = _run(llm, P + [5], filler, P + [6])
    miss = again.blocks[0]
    assert miss.verdict == EVICTED
    evicted = next(e for e in events if e.seq_no == miss.evicted_by)
    assert evicted.type == "block_evicted" and evicted.block_hash == miss.block_hash


def test_v1_a_block_evicted_from_the_free_queue_misses_and_names_the_eviction(tiny_gpt2_dir):
    llm = LLM(str(tiny_gpt2_dir), block_size=4, num_gpu_blocks=8, enable_prefix_caching=True, kv_manager=V1.name)
    filler = list(range(100, 124))  # 6 blocks and its decode: every free block, the cached ones too
    (_, _, again), events = _run(llm, P + [5], filler, P + [6])
    miss = again.blocks[0]
    assert miss.verdict == EVICTED
    evicted = next(e for e in events if e.seq_no == miss.evicted_by)
    assert evicted.type == "block_evicted" and evicted.block_hash == miss.block_hash


def test_blockviz_explain_prints_each_request(tiny_gpt2_dir, capsys):
    opening = "To be, or not to be, that is the question:"
    assert main(["explain", "--model", str(tiny_gpt2_dir), "--block-size", "4", "--num-gpu-blocks", "64",
                 "--prompt", opening + " whether tis nobler", "--prompt", opening + " a quick fox"]) == 0
    out = capsys.readouterr().out
    assert out.count("request ") == 2 and "hit: gpu block" in out
    assert "first miss at" in out and "different tokens" in out
    assert "L0" in out and "not cached: the cache is empty" in out  # the first request found nothing cached



@pytest.mark.parametrize("name", ["v1-story", "recompute"])
def test_each_lookup_is_explained_n_gt_1_children_and_recomputed_requests_too(name):
    """Every lookup the engine made: vLLM v1's n > 1 children each look up (the second hits the
    first's blocks), and a request preempted by recompute looks up all its tokens again when it is
    admitted; each explanation's hits are exactly the prefix_cache_hit events of that lookup."""
    from blockviz.model.trace import load_trace
    from engine import events as ev

    trace = load_trace(name)
    h, events = trace.header, trace.events
    explained = explain_requests(events, h["block_size"], h["num_gpu_blocks"], h["num_cpu_blocks"],
                                 h["enable_prefix_caching"], h.get("kv_manager") or "v0",
                                 h.get("prefix_caching_hash_algo") or "sha256")
    lookups = [i for i, e in enumerate(events) if isinstance(e, (ev.BlockAllocated, ev.PrefixCacheHit))
               and e.logical_index == 0]
    assert [x.position - 1 for x in explained] == [i for i in lookups
                                                   if any(x.position - 1 == i for x in explained)]
    recomputed = [x for x in explained if x.recomputed]
    preempted = {s for e in events if isinstance(e, ev.Preempted) and e.mode != "swap" for s in e.seq_ids}
    assert recomputed and {x.seq_id for x in recomputed} <= preempted
    for x in explained:
        hits, i = [], x.position - 1
        while i < len(events) and isinstance(events[i], ev.PrefixCacheHit) and x.seq_id in events[i].seq_ids:
            hits.append(events[i].logical_index)
            i += 1
        assert [b.index for b in x.blocks if b.verdict == HIT] == hits, x.lines()
        assert x.recomputed or x.num_prompt_tokens == next(
            len(e.prompt_token_ids) for e in events if isinstance(e, ev.RequestAdded) and x.seq_id in e.seq_ids)
    if name == "v1-story":
        children = [x for x in explained if x.request_id == "1"]
        assert [x.seq_id for x in children] == [1, 2] and children[1].num_hit_blocks == 4
        assert "again after a recompute preemption" in recomputed[0].lines()[0]


def test_the_why_panel_names_the_window_slide_that_freed_a_window_tail_and_its_eviction_apart():
    """The hybrid story's window-tail miss: the why panel names the window slide (the blocks_skipped
    event whose blocks held the lost block's tokens, in its window group) and, separately, the
    eviction that took the block afterwards."""
    import io
    import re

    from rich.console import Console

    from blockviz.model.explain import WINDOW_TAIL
    from blockviz.model.insight_view import explain_record
    from blockviz.model.insights import Insights
    from blockviz.model.palette import event_number
    from blockviz.model.reducer import ReducerState
    from blockviz.model.timeline import Timeline
    from blockviz.model.trace import load_trace
    from blockviz.tui.widgets.insight_panels import render_explain
    from engine import events as ev

    trace = load_trace("hybrid")
    timeline = Timeline.for_trace(trace)
    timeline.seek(len(timeline))
    insights = Insights.for_header(trace.header)
    insights.sync(timeline)
    lookup = next(x for x in insights.explanations(len(timeline))
                  if x.first_miss is not None and x.first_miss.verdict == WINDOW_TAIL)
    miss = lookup.first_miss
    group, lost = map(int, re.match(r"group (\d+) \(window \d+\) no longer caches L(\d+)", miss.detail).groups())
    lost_hash = lookup.blocks[lost].block_hash
    assert miss.freed_by is not None and miss.evicted_by is not None and miss.freed_by < miss.evicted_by
    state = ReducerState.from_header(trace.header)
    for event in trace.events[:[e.seq_no for e in trace.events].index(miss.freed_by)]:
        state.apply(event)
    slide = next(e for e in trace.events if e.seq_no == miss.freed_by)
    assert isinstance(slide, ev.BlocksSkipped) and slide.group == group
    assert lost_hash in {state.pools["gpu"][number].block_hash for number in slide.blocks}
    evicted = next(e for e in trace.events if e.seq_no == miss.evicted_by)
    assert isinstance(evicted, ev.BlockEvicted) and evicted.block_hash == lost_hash

    console = Console(width=400, record=True, file=io.StringIO())
    console.print(render_explain(explain_record(insights, lookup.position, request_id=lookup.request_id,
                                                events=timeline.events)))
    row = next(line for line in console.export_text().splitlines() if WINDOW_TAIL in line)
    assert f"window slide: event {event_number(slide.seq_no)}" in row
    assert f"evicted: event {event_number(evicted.seq_no)}" in row


@pytest.mark.parametrize("name", ["hybrid", "cpu-tier"])
def test_the_hash_summary_counts_a_prompt_block_hit_once_as_the_explainer_does(name):
    """A hybrid run's groups each hit their own block at the same index of a request's table; the
    hash chains' summary and the moment's text count that prompt block once, as the explainer's
    "prefix hit: N blocks" does, so the run's hits are the sum of its lookups' hit blocks."""
    from blockviz.model import view
    from blockviz.model.insights import Insights
    from blockviz.model.timeline import Timeline
    from blockviz.model.trace import load_trace

    trace = load_trace(name)
    timeline = Timeline.for_trace(trace)
    timeline.seek(len(timeline))
    insights = Insights.for_header(trace.header)
    insights.sync(timeline)
    hits = sum(lookup.num_hit_blocks for lookup in insights.explanations(len(timeline)))
    assert hits > 0
    if name == "hybrid":  # hits in both groups: more prefix_cache_hit events than hit blocks
        assert len(trace.header["kv_cache_groups"]) > 1
        assert sum(e.type == "prefix_cache_hit" for e in trace.events) > hits
    summary = view.hash_summary(timeline.state)
    assert summary.hits == hits
    assert f"hits {hits}/{summary.looked_up} prompt blocks" in view.summary_text(timeline.state)

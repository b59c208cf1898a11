"""vLLM's hashed blocks beside SGLang's radix tree on one workload (issue 49 item 4): free space as
each design counts it (blockviz/model/free_space.py) equals the design's own counters after every
step, the compare table and JSON name per request the hit, the free space at admission and the
evictions, and the split view (`blockviz compare --tui`) draws both runs at the same step."""

from __future__ import annotations

import importlib.util

import pytest

from blockviz.model.free_space import free_space
from blockviz.model.reducer import ReducerState
from engine.designs import SGLANG, VLLM
from tests.test_sglang_core import GREEDY, make_engine, workload
from tests.test_engine_v1 import loaded  # noqa: F401 (the tiny GPT-2, a module fixture)
from tests.test_tui_app import anyio_backend  # noqa: F401  (the anyio backend for these tests)


@pytest.fixture(autouse=True)
def _needs_sglang_and_vllm():
    for package in ("sglang", "vllm"):
        if importlib.util.find_spec(package) is None:
            pytest.skip(f"{package} is not installed")


def _stepped(engine, prompts, check) -> list:
    """Every prompt at once, `check(reducer)` after every step; returns the events."""
    reducer = ReducerState(engine.config.block_size, engine.budget.num_gpu_blocks, 0, kv_manager=engine.config.kv_manager)
    events: list = []
    for subscriber in (reducer.apply, events.append):
        engine.events.subscribe(subscriber)
    for index, prompt in enumerate(prompts):
        engine.add_request(prompt, GREEDY, request_id=f"r{index}")
    while engine.has_unfinished_requests():
        engine.step()
        check(reducer)
    return events


@pytest.mark.parametrize("page_size, num_gpu_blocks", [(1, 49), (4, 13)])
def test_sglangs_free_space_is_its_allocators_and_its_evictable_size_the_trees(loaded, tiny_gpt2_dir, page_size,
                                                                               num_gpu_blocks):
    engine = make_engine(loaded, tiny_gpt2_dir, num_gpu_blocks=num_gpu_blocks,
                         sglang_options={"page_size": page_size, "schedule_policy": "lpm", "chunked_prefill_size": 8})
    scheduler = engine.scheduler
    seen = []

    def check(reducer):
        space = free_space(reducer)
        assert not space.cached_is_free and space.unit == "page"
        assert space.counted_free * page_size == scheduler.allocator.available_size()
        assert space.evictable_tokens == scheduler.tree_cache.evictable_size() == space.cached * page_size
        seen.append(space)

    events = _stepped(engine, workload(page_size * 100 + num_gpu_blocks), check)
    assert any(e.type == "radix_node_evicted" for e in events), "the small pool evicts leaves"
    assert any(space.cached and space.free < space.budget for space in seen), "cached pages, not counted free"
    assert "SGLang counts cached pages not free" in seen[-1].line()


def test_vllms_free_space_counts_its_cached_blocks_free(loaded, tiny_gpt2_dir):
    engine = make_engine(loaded, tiny_gpt2_dir, kv_manager=VLLM.name, block_size=4, num_gpu_blocks=13)
    pool = engine.scheduler.vllm.kv_cache_manager.block_pool
    seen = []

    def check(reducer):
        space = free_space(reducer)
        assert space.cached_is_free and space.counted_free == pool.get_num_free_blocks() == space.budget
        seen.append(space)

    _stepped(engine, workload(7), check)
    last = seen[-1]
    assert last.cached and f"{last.cached} of them cached: vLLM counts cached blocks free" in last.line()

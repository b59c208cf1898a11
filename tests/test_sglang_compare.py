"""vLLM's hashed blocks beside SGLang's radix tree on one workload (issue 49 item 4): free space as
each design counts it (blockviz/model/free_space.py) equals the design's own counters after every
step, the compare table and JSON name per request the hit, the free space at admission and the
evictions, and the split view (`blockviz compare --tui`) draws both runs at the same step."""

from __future__ import annotations

import importlib.util

import pytest

from blockviz.model.free_space import free_space
from blockviz.model.reducer import ReducerState
from engine.designs import VLLM
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
    reducer = ReducerState(engine.config.block_size, engine.budget.num_gpu_blocks, 0,
                           kv_manager=engine.config.kv_manager)
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


CHAT = ("System: you are a helpful bard. User A: tell me of Verona",
        "System: you are a helpful bard. User A: tell me of Verona. Bard: fair city. User A: and its people",
        "System: you are a helpful bard. User B: speak of Denmark",
        "System: you are a helpful bard. User B: speak of Denmark. Bard: rotten state. User B: and the prince")


def chat_args(model) -> list[str]:
    """A multi-turn chat (a system prompt, two users, a follow-up each) through vLLM's blocks of 4
    and SGLang's tree at page_size 1, a pool small enough for SGLang to evict."""
    return ["compare", "--model", str(model), "--kv-manager", "vllm,sglang", "--block-size", "4",
            "--sglang-option", "page_size=1", "--num-gpu-blocks", "100", "--max-tokens", "4", "--temperature", "0",
            *(part for prompt in CHAT for part in ("--prompt", prompt))]


@pytest.fixture(scope="module")
def chat_runs(tiny_gpt2_factory):
    """`blockviz compare` of the chat's runs, made as the command makes them."""
    from blockviz.cli import build_parser
    from blockviz.commands.compare import compare_runs

    return compare_runs(build_parser().parse_args(chat_args(tiny_gpt2_factory())))


def _admission_steps(run) -> dict[str, int]:
    """Each request's first step holding a block, read from the run's events step by step."""
    request_of, steps, step = {}, {}, 1
    for event in run.events:
        if event.type == "request_added":
            request_of.update(dict.fromkeys(event.seq_ids, event.request_id))
        elif event.type in ("block_allocated", "prefix_cache_hit") and event.device == "gpu":
            steps.setdefault(request_of[event.seq_ids[0]], step)
        elif event.type == "step_finished":
            step += 1
    return steps


def test_the_table_names_each_requests_hit_free_space_and_evictions(chat_runs, tiny_gpt2_factory, capsys,
                                                                       monkeypatch):
    import json

    from blockviz.cli import main
    from blockviz.model.free_space import FreeSpace
    from blockviz.model.timeline import Timeline

    monkeypatch.setattr("blockviz.commands.compare.compare_runs", lambda args: chat_runs)
    assert main(chat_args(tiny_gpt2_factory()) + ["--json"]) == 0
    rows = json.loads(capsys.readouterr().out)["runs"]
    assert [row["kv_manager"] for row in rows] == ["vllm", "sglang"]
    lines = {}
    for row, run in zip(rows, chat_runs):
        timeline = Timeline.for_header(run.header)
        timeline.extend(run.events)
        for index, step in enumerate(_admission_steps(run)[str(index)] for index in range(len(CHAT))):
            timeline.seek(timeline.step_end(step - 1) if step > 1 else 0)
            assert row["free_at_admission"][index] == free_space(timeline.state).to_json()
        evicted = [e for e in run.events if e.type == "block_evicted" and e.device == "gpu"]
        assert sum(blocks for per_request in row["evicted"] for _, blocks, _ in per_request) <= len(evicted)
        lines[row["kv_manager"]] = row
    sglang = lines["sglang"]
    assert any(sglang["evicted"]), "SGLang's tree of 100 one-token pages evicts leaves for later requests"
    assert sglang["evicted_leaves"] == sum(e.type == "radix_node_evicted" for e in chat_runs[1].events)
    hits = [(v, s) for v, s in zip(lines["vllm"]["hit_tokens"], sglang["hit_tokens"])]
    partial = [index for index, (v, s) in enumerate(hits) if s > v]
    assert partial and all(hits[i][0] % 4 == 0 for i in partial), hits

    assert main(chat_args(tiny_gpt2_factory())) == 0
    out = capsys.readouterr().out.splitlines()
    for index in partial:
        at = next(i for i, line in enumerate(out) if line.strip().startswith(f"r{index} "))
        vllm_hit, sglang_hit = hits[index]
        assert f"sglang/1 hits {sglang_hit - vllm_hit} more: tokens of a partial block vllm/4 cannot share" in out[at]
        vllm_line, sglang_line = out[at + 1].strip(), out[at + 2].strip()
        shown = [FreeSpace.from_json(row["free_at_admission"][index], row["block_size"]).line()
                 for row in (lines["vllm"], sglang)]
        assert vllm_line.startswith(f"vllm/4: at its admission step {shown[0]}")
        assert "vLLM counts cached blocks free" in shown[0]
        assert sglang_line.startswith(f"sglang/1: at its admission step {shown[1]}")
        assert "SGLang counts cached pages not free" in shown[1]
    step, blocks, tokens = next(e for per_request in sglang["evicted"] for e in per_request)
    assert f"evicted {blocks} page{'s' if blocks != 1 else ''} ({tokens} tokens) at step {step}" in "\n".join(out)


@pytest.mark.anyio
async def test_the_split_view_draws_vllm_and_sglang_at_the_same_step(chat_runs):
    from blockviz.model.reducer import NULL
    from blockviz.model.timeline import Timeline
    from blockviz.session.compare import hits_at
    from blockviz.tui.compare_app import CompareApp
    from blockviz.tui.widgets.pool_grid import PoolGrid

    references = []
    for run in chat_runs:
        timeline = Timeline.for_header(run.header)
        timeline.extend(run.events)
        references.append(timeline)
    app = CompareApp(chat_runs)
    async with app.run_test(size=(180, 50)) as pilot:
        notes = str(app.query_one("#hit-notes").render())
        assert "tokens of a partial block vllm/4 cannot share" in notes
        await pilot.press("g")
        saw_cached_not_free = False
        for step in range(app.last_step + 1):
            assert app.step == step
            for index, (run, reference) in enumerate(zip(chat_runs, references)):
                reference.seek(reference.step_end(step) if step else 0)
                grid = app.query_one(f"#gpu-{index}", PoolGrid)
                assert grid.state.num_used("gpu") == (run.used_by_step.get(step, 0) if step else 0)
                assert grid.state.pools["gpu"][0].state == NULL  # vLLM's null block, SGLang's padding page
                figures = str(app.query_one(f"#figures-{index}").render())
                space = free_space(reference.state)
                assert space.line() in figures and f"hit tokens: {hits_at(reference.state)}" in figures
                saw_cached_not_free |= not space.cached_is_free and space.cached > 0
            await pilot.press("s")
        assert saw_cached_not_free, "SGLang's side showed cached pages counted not free"
        titles = [str(app.query_one(f"#gpu-{i}", PoolGrid).border_title) for i in range(2)]
        assert "block 0: the null block" in titles[0] and "page 0: SGLang's padding page" in titles[1]


def test_the_notebook_compare_grid_runs_vllm_beside_sglang(tiny_gpt2_factory):
    from blockviz.jupyter import compare
    from blockviz.model.reducer import NULL
    from blockviz.session.compare import hits_at
    from tests.test_compare_views import grid_cells

    with pytest.raises(ValueError, match="sglang_options apply to kv_manager 'sglang' only"):
        compare(CHAT[:1], kv_manager=["v1", "vllm"], sglang_options={"page_size": 1})
    grid = compare(CHAT[:2], kv_manager=["vllm", "sglang"], block_size=4, num_gpu_blocks=100, max_tokens=3,
                   sglang_options={"page_size": 1}, model=str(tiny_gpt2_factory()))
    vllm, sglang = grid.runs
    assert (vllm.header["block_size"], sglang.header["block_size"]) == (4, 1)
    assert sglang.header["sglang_options"]["page_size"] == 1 and vllm.texts == sglang.texts
    assert "tokens of a partial block vllm/4 cannot share" in grid.differences.value
    for reference, _, cell in grid_cells(grid):
        assert reference.state.pools["gpu"][0].state == NULL
        space = free_space(reference.state)
        assert f"data-free='{space.counted_free}' data-budget='{space.budget}'" in cell.value
        assert f"hit tokens: {hits_at(reference.state)}" in cell.value
    assert "SGLang counts cached pages not free" in grid.cell_figures[1].value
    assert "vLLM counts cached blocks free" in grid.cell_figures[0].value
    grid.close()


@pytest.mark.anyio
async def test_an_sglang_replay_says_it_has_no_cpu_tier_in_its_own_words(chat_runs):
    """The CPU pool's place in an sglang replay at 80x24 speaks of SGLang (no CPU tier, retraction,
    pages shared whole), not of vLLM v1's swap or copy-on-write."""
    from blockviz.model import view
    from blockviz.model.trace import Trace
    from blockviz.tui.app import BlockvizApp
    from tests.test_tui_app import screen_text

    run = chat_runs[1]
    trace = Trace(run.header, run.events)
    app = BlockvizApp(trace=trace, deterministic=True, play=False, source_name="sglang")
    async with app.run_test(size=(80, 24)) as pilot:
        app.player.timeline.seek(len(trace.events) // 2)
        app.render_views()
        await pilot.pause()
        state, text = app.player.timeline.state, screen_text(app)
    assert view.v1_notes(state) == view.RADIX_NOTES
    assert " ".join(view.RADIX_NOTES["swap"].split()[:4]) in text
    assert "vLLM v1" not in text and "swap" not in text.lower()

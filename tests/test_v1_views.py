"""vLLM v1 in the view model (blockviz/model/view.py), the TUI and the notebook's frame: the free queue
in eviction order equals the engine's FreeKVCacheBlockQueue at every step of a live v1 run, block 0
is drawn as the null block, chunked-prefill progress equals the reducer's and the engine's sequences,
and the one-line notes for what v1 has not (a CPU pool and swap, copy-on-write) appear in v1 runs only."""

from __future__ import annotations

import pytest

from blockviz.jupyter import Visualizer
from blockviz.model import view
from blockviz.model.design import design_of, has_cpu_tier, kv_manager_of
from blockviz.model.reducer import ReducerState
from blockviz.model.trace import load_trace, shipped_traces
from blockviz.tui.app import BlockvizApp
from blockviz.tui.widgets.panels import BlockInspector, BlockTables
from blockviz.tui.widgets.pool_grid import NULL_MARK, FreeQueueRow, PoolGrid
from test_view_model import drawn
from engine import LLM, EngineConfig, LLMEngine, SamplingParams
from engine.designs import V1

V1_CURSOR = 734  # v1-story.jsonl just after step 35's TokensScheduled: seq 4 prefills 9 of 42 tokens


@pytest.fixture
def anyio_backend():
    return "asyncio"


@pytest.fixture(scope="module")
def loaded(tiny_gpt2_dir):
    from engine.model_loader import load_model

    return load_model(str(tiny_gpt2_dir), "cpu", None)


def test_the_views_follow_a_live_v1_run_step_by_step(loaded, tiny_gpt2_dir):
    """A pool small enough to preempt, a token budget that chunks prefills, n=2 sharing by hits: after
    every step the free queue (head first, cached or not), the null block, the counts and each
    sequence's progress are the engine's."""
    engine = LLMEngine(EngineConfig(model=str(tiny_gpt2_dir), device="cpu", kv_manager=V1.name, block_size=4,
                                    num_gpu_blocks=14, max_num_batched_tokens=8), loaded=loaded)
    state = ReducerState(4, engine.budget.num_gpu_blocks, 0, "v1")
    engine.events.subscribe(state.apply)
    manager, scheduler = engine.kv_manager, engine.scheduler
    seen = {"chunk": 0, "cached_in_queue": 0, "steps": 0}

    def on_step(_):
        seen["steps"] += 1
        queue = view.free_queue(state, limit=None)
        engine_queue = list(manager.block_pool.free_block_queue)
        assert [number for number, _ in queue.blocks] == [b.block_id for b in engine_queue]
        assert [cached for _, cached in queue.blocks] == [b.block_hash is not None for b in engine_queue]
        assert queue.num_free == manager.get_num_free_gpu_blocks() and queue.num_cached == sum(
            cached for _, cached in queue.blocks)
        assert view.free_queue(state).blocks == queue.blocks[:view.FREE_QUEUE_SHOWN]
        seen["cached_in_queue"] += queue.num_cached > 0
        null = state.pools["gpu"][0]
        assert view.block_state(null) == "null" and view.block_cell(null).state == "null"
        assert view.pool_columns(state.pools["gpu"])["state"][0] == view.STATE_CODES["null"] == "n"
        used, cached, free = view.pool_counts(state)["gpu"]
        assert cached + free == manager.get_num_free_gpu_blocks() and used + cached + free == 13
        rows = {row.seq: row for row in view.tables(state, limit=None)}
        for seq in scheduler.running:
            info, mine = rows[seq.seq_id].progress, state.seqs[seq.seq_id]
            assert (info.computed, info.num_tokens, info.prompt) == (
                mine.num_computed_tokens, len(mine.token_ids), mine.num_prompt_tokens)
            assert info.computed == seq.num_computed_tokens and info.num_tokens == seq.get_len()
            assert info.scheduled == state.num_scheduled_tokens.get(seq.seq_id, 0)
            seen["chunk"] += info.prefilling and info.scheduled > 0
        for seq_id, row in rows.items():
            if state.seqs[seq_id].status == "finished":
                assert row.progress is None

    prompts = ["ROMEO: But soft, what light through yonder window breaks", "JULIET: O Romeo, Romeo"]
    LLM.from_engine(engine).generate(prompts, [SamplingParams(max_tokens=12), SamplingParams(n=2, max_tokens=12)],
                                     on_step=on_step)
    assert seen["steps"] > 5 and seen["chunk"] and seen["cached_in_queue"], seen
    assert state.num_preemptions  # the small pool preempted by recompute


def test_the_null_block_inspector_and_the_progress_words():
    trace = load_trace("v1-story")
    from blockviz.model.timeline import Timeline

    timeline = Timeline.for_trace(trace)
    timeline.seek(V1_CURSOR)
    state = timeline.state
    info = view.inspect_block(state, "gpu", 0)
    assert info.state == "null" and info.note == view.NULL_BLOCK_NOTE and info.fill == 0
    head = state.free_queue[0]
    assert view.inspect_block(state, "gpu", head).queue == "next to go in the free queue"
    second = state.free_queue[1]
    assert view.inspect_block(state, "gpu", second).queue == f"2 of {len(state.free_queue)} in the free queue"
    progress = view.progress(state, 4)
    assert progress.text == "prefill 9/42 · chunk +9" and progress.prefilling
    v0 = Timeline.for_trace(load_trace("fork-cow"))
    v0.seek(len(v0) // 2)
    info = view.inspect_block(v0.state, "gpu", 0)
    assert info.note is None and info.queue is None
    assert all(row.progress is None for row in view.tables(v0.state))


@pytest.mark.parametrize("name", shipped_traces())
def test_the_notes_for_what_v1_has_not_appear_in_v1_only(name):
    trace = load_trace(name)
    viz = Visualizer.from_trace(trace)
    try:
        viz.seek(len(trace.events) // 2)
        viz.frames.flush()
        frame = viz.frame()
        v1 = design_of(trace.header).free_queue  # v1's designs (vLLM's own too)
        tier = has_cpu_tier(trace.header)  # vLLM's CPU tier is a CPU pool: no "no swap" note then
        design = design_of(trace.header)
        expected = view.RADIX_NOTES if design.radix_tree else view.V1_NOTES  # SGLang's words in its runs
        lacks = not design.swap and not design.copy_on_write  # v1's designs and SGLang's; v0 has both
        notes = {k: text for k, text in expected.items() if k != "swap" or not tier} if lacks else {}
        assert lacks == (v1 or design.radix_tree)
        assert frame["notes"] == notes
        assert (frame["free_queue"] is not None) == v1 and frame["kv_manager"] == kv_manager_of(trace.header)
        assert viz.pools.frame["notes"] == frame["notes"] and viz.pools.frame["free_queue"] == frame["free_queue"]
        summary = viz.summary()  # the plain-text picture too
        assert ("free queue (next to go first): " in summary) == v1
        assert (view.V1_NOTES["swap"] in summary) == (v1 and not tier)
    finally:
        viz.close()


def screen_text(app) -> str:
    return "\n".join("".join(seg.text for seg in strip) for strip in app.screen._compositor.render_strips())


@pytest.mark.anyio
@pytest.mark.parametrize("name", ["v1-story", "fork-cow", "swap"])
async def test_the_tui_draws_the_null_block_the_free_queue_and_the_notes_in_v1_only(name):
    trace = load_trace(name)
    app = BlockvizApp(trace=trace, deterministic=True, play=False, source_name=name)
    v1 = name == "v1-story"
    async with app.run_test(size=(80, 24)) as pilot:
        app.player.timeline.seek(V1_CURSOR if v1 else len(trace.events) // 2)
        app.render_views()
        await pilot.pause()
        state, text = app.player.timeline.state, screen_text(app)
        row = app.query_one(FreeQueueRow)
        for note in view.V1_NOTES.values():  # each note whole in the CPU pool's place (wrapped to its width)
            assert (" ".join(note.split()[:4]) in text) == v1
        assert ("vLLM v1" in text) == v1
        gpu = app.query_one("#gpu", PoolGrid)
        if not v1:
            assert not row.display and gpu.head is None and NULL_MARK not in gpu.cell_text(0)
            return
        assert gpu.cell_text(0) == f"{0:>{gpu.digits}}{NULL_MARK} "  # the null block
        assert row.display and gpu.head == state.free_queue[0]
        queue = view.free_queue(state)
        shown = " ".join(f"{n}{'c' if cached else ''}" for n, cached in queue.blocks)
        more = queue.num_free - len(queue.blocks)
        assert row.content.plain == f"free queue ▸ {shown} " + (f"… +{more}" if more > 0 else "")
        tables = drawn(app.query_one(BlockTables))
        for seq_id in state.tables:
            progress = view.progress(state, seq_id)
            assert progress is None or any(line.strip() == progress.text for line in tables)
        assert any(line.strip() == "prefill 9/42 · chunk +9" for line in tables)
        app.selection = ("gpu", 0)  # the null block in the inspector
        app.render_views()
        await pilot.pause()
        lines = drawn(app.query_one(BlockInspector))
        assert any("state" in line and "null block" in line for line in lines)
        assert any("what" in line and "placeholder" in line for line in lines)


def test_v1_snapshot_80x24_chunked_prefill_and_free_queue(snap_compare):
    """The v1 story at step 35: a recomputed request (seq 4, its first block selected, its table
    scrolled into view) prefilling in a chunk, a free queue headed by cached blocks (slate 'c', the
    head's number orange), the null block, the CPU pool's notes."""
    app = BlockvizApp(trace=load_trace("v1-story"), deterministic=True, play=False, source_name="v1-story")

    async def run_before(pilot) -> None:
        app.player.timeline.seek(V1_CURSOR)
        app.render_views()
        app.query_one("#gpu", PoolGrid).select(45)  # seq 4's first block
        await pilot.pause()
        app.query_one(BlockTables).scroll_end(animate=False, immediate=True)
        await pilot.pause()

    assert snap_compare(app, run_before=run_before, terminal_size=(80, 24))


@pytest.mark.anyio
async def test_the_live_app_plays_the_v1_story_with_its_views():
    """`blockviz run --kv-manager v1`'s spec, live in the app (the engine in a thread, the bundled
    model): after the first step ROMEO's prefill is a chunk, the null block and the free queue are
    drawn; played to the end, every block is back in the queue."""
    from blockviz.cli import build_parser
    from blockviz.commands.run import check
    from blockviz.model.player import SPEEDS
    from blockviz.session.engine_thread import EngineBridge
    from test_tui_app import _until, screen_text

    spec = check(build_parser().parse_args(["run", "--kv-manager", "v1", "--device", "cpu"]), device=False)
    app = BlockvizApp(bridge=EngineBridge(spec), deterministic=True, play=False)
    async with app.run_test(size=(120, 40)) as pilot:
        await _until(pilot, lambda: app.player is not None, timeout=60)
        await pilot.press("s")
        await _until(pilot, lambda: app.player.timeline.num_steps_done() == 1, timeout=30)
        app.render_views()
        await pilot.pause()
        state = app.player.timeline.state
        assert view.progress(state, 0).text == "prefill 16/31 · chunk +16"
        assert any(line.strip() == "prefill 16/31 · chunk +16" for line in drawn(app.query_one(BlockTables)))
        gpu = app.query_one("#gpu", PoolGrid)
        assert NULL_MARK in gpu.cell_text(0) and gpu.head == state.free_queue[0]
        footer = screen_text(app).splitlines()[-1]  # v0's fork and swap are not offered in v1
        assert "a Add" in footer and "f Fork" not in footer and "p Swap" not in footer
        assert app.query_one(FreeQueueRow).content.plain.startswith(f"free queue ▸ {state.free_queue[0]} ")
        app.player.speed_index = len(SPEEDS) - 1
        await pilot.press("space")
        await _until(pilot, lambda: app.player.finished and app.player.timeline.at_end, timeout=120)
        state = app.player.timeline.state
        assert state.num_preemptions and len(state.free_queue) == 47 and state.num_used("gpu") == 0

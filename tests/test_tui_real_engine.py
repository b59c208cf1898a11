"""The TUI and traces on the REAL engine (a tiny GPT-2 checkpoint, CPU): a recorded trace replays
to exactly the state the engine's own subscriber saw, and the live app's picture matches the block
manager. One model load for the module (LLMEngine accepts a loaded model)."""

from __future__ import annotations

import pytest

from blockviz.app import BlockvizApp
from blockviz.commands.record import record_trace
from blockviz.history import SPEEDS, Timeline, state_equal
from blockviz.live import EngineBridge, EngineSpec
from blockviz.trace import read_trace
from engine.reducer import ReducerState
from test_tui_app import _until, screen_text

engine_module = pytest.importorskip("engine")
if not hasattr(engine_module, "LLMEngine"):
    pytest.skip("engine.LLMEngine has not landed yet", allow_module_level=True)

pytestmark = pytest.mark.anyio


@pytest.fixture
def anyio_backend():
    return "asyncio"


@pytest.fixture(scope="module")
def loaded(tiny_gpt2_dir):
    from engine.model_loader import load_model

    return load_model(str(tiny_gpt2_dir), "cpu")


def _spec(model, **kwargs) -> EngineSpec:
    settings = dict(prompts=("To be, or not to be", "The quick brown fox"), n=2, max_tokens=6, block_size=4,
                    num_gpu_blocks=32, num_cpu_blocks=16, device="cpu")
    settings.update(kwargs)
    return EngineSpec(model=str(model), **settings)


def _engine(spec: EngineSpec, loaded):
    return engine_module.LLMEngine(spec.engine_config(), loaded=loaded)


def test_a_recorded_trace_replays_to_the_engines_own_final_state(tmp_path, tiny_gpt2_dir, loaded):
    spec = _spec(tiny_gpt2_dir, num_gpu_blocks=12, preemption_mode="swap", max_tokens=10)
    out = tmp_path / "real.jsonl"
    recording = record_trace(spec, out, engine=_engine(spec, loaded))
    trace = read_trace(out)
    kinds = {e.type for e in trace.events}
    assert {"fork", "copy_on_write", "kv_digest", "step_finished"} <= kinds
    timeline = Timeline.for_trace(trace)
    timeline.seek(len(timeline))
    assert state_equal(timeline.state, recording.state)
    fresh = ReducerState(trace.block_size, trace.num_gpu_blocks, trace.num_cpu_blocks).apply_all(trace.events)
    assert state_equal(fresh, recording.state)
    timeline.back(50)
    timeline.forward(50)
    assert state_equal(timeline.state, recording.state)


async def test_the_live_app_matches_the_block_manager(tiny_gpt2_dir, loaded):
    spec = _spec(tiny_gpt2_dir)
    bridge = EngineBridge(spec, make_engine=lambda: _engine(spec, loaded))
    app = BlockvizApp(bridge=bridge, deterministic=True)
    async with app.run_test(size=(120, 40)) as pilot:
        await _until(pilot, lambda: app.player is not None, timeout=30)
        await pilot.press("s")
        await _until(pilot, lambda: app.player.timeline.num_steps_done() == 1, timeout=30)
        state = app.player.timeline.state
        assert state.step_kind == "prefill" and len(state.seqs) == 4  # n=2 forked after the prefill
        tables = {s: [b.block_number for b in t] for s, t in bridge.engine.block_manager.block_tables.items()}
        assert {s: state.table_blocks(s) for s in state.tables} == tables
        assert f"GPU pool · {state.num_used('gpu')}/32 used" in screen_text(app)
        await pilot.press("n")  # seq 0
        await pilot.press("p")  # swap request 0 out, between steps
        await _until(pilot, lambda: app.player.timeline.state.num_used("cpu") > 0, timeout=30)
        assert app.player.timeline.state.seqs[0].status == "swapped"
        app.player.speed_index = len(SPEEDS) - 1
        await pilot.press("space")
        await _until(pilot, lambda: app.player.finished and app.player.timeline.at_end, timeout=60)
        state = app.player.timeline.state
        assert all(seq.status == "finished" for seq in state.seqs.values())
        assert state.num_used("gpu") == 0 and state.num_used("cpu") == 0

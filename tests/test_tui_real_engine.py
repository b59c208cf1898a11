"""The TUI and traces on the REAL engine (a tiny GPT-2 checkpoint, CPU): a recorded trace replays
to exactly the state the engine's own subscriber saw, and the live app's picture matches the block
manager. One model load for the module (LLMEngine accepts a loaded model)."""

from __future__ import annotations

import pytest

from blockviz.tui.app import BlockvizApp
from blockviz.commands.record import record_trace
from blockviz.model.timeline import Timeline, state_equal
from blockviz.model.player import SPEEDS
from blockviz.session.spec import EngineSpec
from blockviz.session.engine_thread import EngineBridge
from blockviz.model.trace import read_trace
from blockviz.model.reducer import ReducerState
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
    return EngineSpec.of(model=str(model), **settings)


def _engine(spec: EngineSpec, loaded):
    return engine_module.LLMEngine(spec.config, loaded=loaded)


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
    app = BlockvizApp(bridge=bridge, deterministic=True, play=False)
    async with app.run_test(size=(120, 40)) as pilot:
        await _until(pilot, lambda: app.player is not None, timeout=30)
        await pilot.press("s")
        await _until(pilot, lambda: app.player.timeline.num_steps_done() == 1, timeout=30)
        state = app.player.timeline.state
        assert state.step_kind == "prefill" and len(state.seqs) == 4  # n=2 forked after the prefill
        tables = {s: [b.block_number for b in t] for s, t in bridge.engine.kv_manager.block_tables.items()}
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


def _digest_events(events) -> list:
    return [e for e in events if e.type == "kv_digest"]


def test_held_back_kv_digests_go_out_once_per_block_and_equal_the_per_step_ones(tiny_gpt2_dir, loaded):
    spec = _spec(tiny_gpt2_dir, n=1, max_tokens=10)
    per_step, held = _engine(spec, loaded), _engine(spec, loaded)
    held.set_kv_digests_per_step(False)
    streams = {per_step: [], held: []}
    for engine, events in streams.items():
        engine.events.subscribe(events.append)
        for prompt in spec.prompts:
            engine.add_request(prompt, spec.sampling_params())
        for _ in range(5):
            engine.step()
    assert _digest_events(streams[held]) == []  # held back: nothing hashed yet
    before = len(streams[held])
    held.emit_kv_digests()
    sent = _digest_events(streams[held][before:])
    assert len(streams[held]) == before + len(sent)
    blocks = [e.block for e in sent]
    assert len(blocks) == len(set(blocks)) and len(blocks) < len(_digest_events(streams[per_step]))
    latest = {e.block: e.digest for e in _digest_events(streams[per_step])}  # the last one per block
    assert set(blocks) == set(latest)  # every block written, once
    assert {e.block: e.digest for e in sent} == latest  # each hashed as it is now, as per-step left it
    assert [e.digest for e in sent] == held.cache_engine.kv_digests("gpu", blocks)
    states = {engine: ReducerState(spec.config.block_size, 32, 16).apply_all(events) for engine, events in streams.items()}
    for state in states.values():
        for block in state.pools["gpu"]:
            assert block.digest is None or block.digest_slots == len(block.token_ids)
    assert [b.digest for b in states[held].pools["gpu"]] == [b.digest for b in states[per_step].pools["gpu"]]
    held.emit_kv_digests()  # nothing written since: nothing sent
    assert len(streams[held]) == before + len(sent)
    held.step()  # one more token in each sequence's last block, not hashed yet
    state = states[held].apply_all(streams[held][before + len(sent):])
    grown = [b for b in state.pools["gpu"] if b.state == "used" and b.digest and b.digest_slots < len(b.token_ids)]
    assert grown  # the reducer knows the digest predates the newest slot


def test_a_free_running_bridge_digests_once_per_batch_and_ends_with_every_blocks_current_digest(
        tiny_gpt2_dir, loaded):
    import threading

    from blockviz.session.engine_driver import Listener

    spec = _spec(tiny_gpt2_dir, n=1, max_tokens=24)
    bridge = EngineBridge(spec, make_engine=lambda: _engine(spec, loaded), flush_interval=10.0,
                          share_cores=False)
    received: list = []
    idle = threading.Event()
    listener = Listener(loading=lambda text: None, ready=lambda header: None, failed=lambda error: None,
                        events=received.extend, idle=idle.set)
    worker = threading.Thread(target=bridge.run, args=(listener,), daemon=True)
    worker.start()
    bridge.set_free_run(True)
    assert idle.wait(60)
    bridge.stop()
    worker.join(10)
    steps = sum(e.type == "step_finished" for e in received)
    digests = _digest_events(received)
    # a batch every 10 s: the whole run is one batch, so each block written is hashed once
    assert steps > 10 and 0 < len(digests) == len({e.block for e in digests})
    last_step = max(i for i, e in enumerate(received) if e.type == "step_finished")
    assert all(i > last_step for i, e in enumerate(received) if e.type == "kv_digest")
    state = ReducerState(spec.config.block_size, 32, 16).apply_all(received)
    engine = bridge.engine
    hashed = [b.number for b in state.pools["gpu"] if b.digest is not None]
    assert [state.pools["gpu"][n].digest for n in hashed] == engine.cache_engine.kv_digests("gpu", hashed)
    assert engine.kv_digests_per_step is False and engine._written == {}

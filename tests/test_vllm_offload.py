"""vLLM v1's CPU tier under `kv_manager="vllm"` (engine/vllm_core/offload.py): with the
`kv_offloading_size` option vLLM 0.33's own SimpleCPUOffloadScheduler decides which blocks go to the
CPU and which come back; our engine copies them. After every step of each workload the reducer fed
only the events equals vLLM's state, the GPU pool's (tests/test_vllm_core.py) and the CPU tier's: each
CPU block's ref count, hash and state, and the CPU hash map. A preempted request's prefix, evicted from
the GPU, comes back from the CPU tier (an offload_load, then its blocks counted as hits, not
recomputed), and greedy tokens equal `kv_manager="v1"` and transformers. Both front ends draw the run:
the TUI (Pilot) and the notebook's Visualizer frame. Bad sizes are one line, exit 2."""

from __future__ import annotations

import importlib.util

import pytest

from blockviz.model.reducer import CACHED, FREE, NULL, ReducerState
from blockviz.model.trace_check import TraceChecker
from engine import LLM, SamplingParams
from tests.test_engine_parity import PROMPTS
from tests.test_engine_v1 import hf, loaded  # noqa: F401 (module fixtures)
from tests.test_tui_app import anyio_backend  # noqa: F401 (the Pilot test's event loop)
from tests.test_vllm_core import Checked, assert_parity, check_reducer_matches_vllm, make_engine, tokens, v1_tokens
from engine.designs import V1, VLLM


@pytest.fixture(autouse=True)
def _needs_vllm():
    if importlib.util.find_spec("vllm") is None:
        pytest.skip("vLLM is not installed")


GiB = 1 << 30
PARAMS = SamplingParams(max_tokens=24, ignore_eos=True)
TINY = dict(block_size=2, num_gpu_blocks=40)  # a pool PROMPTS outgrow: preemptions, evictions
NUM_CPU_BLOCKS = 64


def offloading_size(engine_or_bytes, num_blocks: int = NUM_CPU_BLOCKS) -> float:
    """The kv_offloading_size (GiB) that holds `num_blocks` blocks of `block_bytes` bytes."""
    return num_blocks * engine_or_bytes / GiB


def tiny_block_bytes(block_size: int) -> int:
    """The tiny GPT-2's block: K and V x 2 layers x 4 heads x head_dim 16 x block_size x float32."""
    return 2 * 2 * 4 * 16 * block_size * 4


def offload_engine(loaded, path, num_cpu_blocks: int = NUM_CPU_BLOCKS, **options):
    options = {**TINY, **options}
    size = offloading_size(tiny_block_bytes(options["block_size"]), num_cpu_blocks)
    return make_engine(loaded, path, vllm_options={"kv_offloading_size": size}, **options)


def check_cpu_tier_matches_vllm(reducer: ReducerState, scheduler) -> None:
    """The reducer's CPU pool is vLLM's CPU tier: block 0 null, each block's ref count, state and
    hash, the hash map. A store vLLM has decided and not yet seen copied (a finished request's,
    issued by the next schedule()) is drawn done: its CPU block cached under its GPU block's hash."""
    from vllm.v1.core.kv_cache_utils import KVCacheBlock, get_block_hash

    from engine.v1.kv_cache_utils import external_block_hash

    def external(key):
        return external_block_hash(get_block_hash(key))

    manager = scheduler.cpu_tier.manager
    pool, gpu_pool = manager.cpu_block_pool, manager._gpu_block_pool
    in_flight = {cpu: external(gpu_pool.blocks[gpu].block_hash)
                 for transfer in (*manager._pending_finished_stores, *manager._store_event_to_blocks.values())
                 for gpu, cpu in zip(transfer.gpu_block_ids, transfer.cpu_block_ids)}
    pinned: dict[int, int] = {}  # a lookup's pins for a request not admitted yet (_pending_cpu_hits)
    for hit_blocks, _, _ in manager._pending_cpu_hits.values():
        for block in (b for group in hit_blocks for b in group if not b.is_null):
            pinned[block.block_id] = pinned.get(block.block_id, 0) + 1
    view = reducer.pools["cpu"]
    assert len(view) == pool.num_gpu_blocks and view[0].state == NULL
    for block in pool.blocks[1:]:
        shown = view[block.block_id]
        if block.block_id in in_flight:
            assert shown.state == CACHED and shown.block_hash == in_flight[block.block_id] and shown.ref_count == 0
            continue
        assert shown.ref_count == 0 and block.ref_cnt == pinned.get(block.block_id, 0), (
            f"cpu block {block.block_id}: ref count {block.ref_cnt}, {pinned.get(block.block_id, 0)} lookup pins")
        expected = external(block.block_hash) if block.block_hash is not None else None
        assert shown.block_hash == expected, f"cpu block {block.block_id}: hash differs"
        assert shown.state == (CACHED if expected is not None else FREE), f"cpu block {block.block_id}: state"
    first = {external(key): (held if isinstance(held, KVCacheBlock) else next(iter(held.values()))).block_id
             for key, held in pool.cached_block_hash_to_block._cache.items()}
    for cpu, block_hash in in_flight.items():
        first.setdefault(block_hash, cpu)
    assert reducer.cpu_hash_map == first, "CPU hash map differs"


class CheckedTier(Checked):
    """Checked (tests/test_vllm_core.py) over a pool with vLLM's CPU tier: the reducer and the
    trace checker get the CPU pool, and check() compares the tier too."""

    def __init__(self, engine) -> None:
        super().__init__(engine)
        num_gpu, num_cpu = engine.budget.num_gpu_blocks, engine.budget.num_cpu_blocks
        self.reducer.__init__(engine.config.block_size, num_gpu, num_cpu, "vllm")
        self.checker = TraceChecker(engine.config.block_size, num_gpu, num_cpu, kv_manager=VLLM.name)

    def check(self, _engine=None) -> None:
        super().check()
        check_cpu_tier_matches_vllm(self.reducer, self.engine.scheduler)


def run_tier(engine, prompts, params):
    checked = CheckedTier(engine)
    outputs = LLM.from_engine(engine).generate(prompts, params, on_step=checked.check)
    checked.done()
    assert checked.num_checks > 0
    return outputs, checked


def trace_with_the_cpu_tier(tiny_gpt2_dir, out, num_cpu_blocks: int = NUM_CPU_BLOCKS):
    """`blockviz record` of PROMPTS on TINY with a CPU tier of `num_cpu_blocks` (the CLI flag)."""
    from blockviz.cli import main
    from blockviz.model.trace import read_trace

    size = offloading_size(tiny_block_bytes(TINY["block_size"]), num_cpu_blocks)
    args = ["record", "--out", str(out), "--model", str(tiny_gpt2_dir), "--block-size", str(TINY["block_size"]),
            "--num-gpu-blocks", str(TINY["num_gpu_blocks"]), "--max-tokens", "24", "--temperature", "0",
            "--kv-manager", "vllm", "--kv-offloading-size", repr(size)]
    for prompt in PROMPTS:
        args += ["--prompt", prompt]
    assert main(args) == 0
    return read_trace(out)  # the trace checker replays every event under the header


def returning_load(events):
    """The first offload_load of a sequence preempted before it: (its index, the load)."""
    preempted: set[int] = set()
    for index, event in enumerate(events):
        if event.type == "preempted":
            preempted.update(event.seq_ids)
        elif event.type == "offload_load" and event.seq_id in preempted:
            return index, event
    raise AssertionError("no preempted request came back from the CPU tier")


# ---------------------------------------------------------------- the engine: vLLM decides, we copy


def test_a_preempted_requests_prefix_comes_back_from_the_cpu_tier(hf, loaded, tiny_gpt2_dir):
    engine = offload_engine(loaded, tiny_gpt2_dir)
    assert engine.budget.num_cpu_blocks == engine.scheduler.cpu_tier.num_cpu_blocks == NUM_CPU_BLOCKS
    outputs, checked = run_tier(engine, PROMPTS, PARAMS)  # reducer == vLLM (GPU and CPU) after every step
    assert_parity(hf, engine, outputs, PROMPTS, 24)
    assert tokens(outputs) == v1_tokens(loaded, tiny_gpt2_dir, PROMPTS, PARAMS, **TINY)
    events = checked.events
    at, load = returning_load(events)
    bs = TINY["block_size"]
    gpu_blocks = [gpu for _, gpu in load.mapping]
    assert load.num_tokens == len(gpu_blocks) * bs
    later = events[at + 1:]
    hashed = {e.block for e in later if e.type == "block_hashed"}
    assert set(gpu_blocks) <= hashed, "the loaded blocks were not cached on the GPU again"
    resumed = next(e for e in later if e.type == "tokens_scheduled" and load.seq_id in e.seq_ids)
    done = resumed.num_computed_tokens[resumed.seq_ids.index(load.seq_id)]
    allocated = next(e for e in reversed(events[:at]) if e.type == "block_allocated" and e.block == gpu_blocks[0])
    assert done >= (allocated.logical_index + len(gpu_blocks)) * bs - 1, "the loaded tokens were recomputed"
    num_loaded = sum(len(e.mapping) for e in checked.of("offload_load"))
    assert checked.reducer.num_prefix_hits == len(checked.of("prefix_cache_hit")) + num_loaded  # loads are hits


def test_the_copies_carry_the_real_kv_both_ways(loaded, tiny_gpt2_dir):
    """Each stored CPU block's K/V digest is its GPU block's; each loaded GPU block's, its CPU block's."""
    engine = offload_engine(loaded, tiny_gpt2_dir)
    checked = CheckedTier(engine)
    moved: dict[tuple[str, int], tuple[str, int]] = {}  # destination -> source, for the moves in flight
    seen: list[tuple[str, int]] = []

    def follow(event):
        if event.type == "offload_store":
            moved.update({("cpu", c): ("gpu", g) for g, c in event.mapping})
        elif event.type == "offload_load":
            moved.update({("gpu", g): ("cpu", c) for c, g in event.mapping})
        elif event.type == "kv_digest" and (event.device, event.block) in moved:
            device, number = moved.pop((event.device, event.block))
            assert event.digest == checked.reducer.pools[device][number].digest, f"{event.device} {event.block}"
            seen.append((event.device, event.block))

    engine.events.subscribe(follow)
    LLM.from_engine(engine).generate(PROMPTS, PARAMS, on_step=checked.check)
    checked.done()
    assert {device for device, _ in seen} == {"cpu", "gpu"} and not moved


def test_the_cpu_pool_fills_then_evicts_its_least_recently_used(loaded, tiny_gpt2_dir):
    engine = offload_engine(loaded, tiny_gpt2_dir, num_cpu_blocks=12)
    _, checked = run_tier(engine, PROMPTS, PARAMS)
    evicted = [e for e in checked.of("block_evicted") if e.device == "cpu"]
    assert evicted, "a CPU tier of 11 usable blocks never evicted"
    stored = {h for e in checked.of("offload_store") for h in e.block_hashes}
    assert {e.block_hash for e in evicted} <= stored


# ---------------------------------------------------------------- bad input


@pytest.mark.parametrize(("size", "match"), [
    (-1, "kv_offloading_size must be a positive number of GiB, got -1"),
    ("abc", "kv_offloading_size must be a positive number of GiB, got 'abc'"),
    (0, "kv_offloading_size must be a positive number of GiB, got 0"),
])
def test_a_bad_offloading_size_is_one_line(loaded, tiny_gpt2_dir, size, match):
    from engine.vllm_core.config import check_options

    for build in (lambda: make_engine(loaded, tiny_gpt2_dir, vllm_options={"kv_offloading_size": size}, **TINY),
                  lambda: check_options({"kv_offloading_size": size})):
        with pytest.raises(ValueError, match=match) as raised:
            build()
        assert "\n" not in str(raised.value)


def test_the_tier_needs_prefix_caching_and_vllms_scheduler(loaded, tiny_gpt2_dir):
    from engine import EngineConfig

    with pytest.raises(ValueError, match="kv_offloading_size needs prefix caching"):
        offload_engine(loaded, tiny_gpt2_dir, enable_prefix_caching=False)
    with pytest.raises(ValueError, match="kv_manager 'vllm' only"):
        EngineConfig(kv_manager=V1.name, vllm_options={"kv_offloading_size": 1})


@pytest.mark.parametrize(("args", "expected"), [
    (["--kv-manager", "vllm", "--kv-offloading-size", "-1"], "--kv-offloading-size takes a positive number of GiB"),
    (["--kv-manager", "vllm", "--kv-offloading-size", "lots"], "--kv-offloading-size takes a positive number of GiB"),
    (["--kv-manager", "vllm", "--vllm-option", "kv_offloading_size=-2"], "must be a positive number of GiB, got -2"),
    (["--kv-offloading-size", "1"], "--kv-manager vllm only"),
], ids=["negative", "not-a-number", "option-negative", "without-vllm"])
def test_a_bad_offloading_size_on_the_command_line_is_one_line_exit_2(tmp_path, args, expected):
    from tests.test_vllm_core import _blockviz

    result = _blockviz("record", "--out", str(tmp_path / "t.jsonl"), *args)
    lines = result.stderr.strip().splitlines()
    assert result.returncode == 2 and len(lines) == 1 and expected in lines[0], result.stderr
    assert not (tmp_path / "t.jsonl").exists()


# ---------------------------------------------------------------- traces and both front ends


def test_a_recorded_trace_holds_the_cpu_tier(tiny_gpt2_dir, tmp_path):
    trace = trace_with_the_cpu_tier(tiny_gpt2_dir, tmp_path / "tier.jsonl")
    header = trace.header
    assert header["num_cpu_blocks"] == NUM_CPU_BLOCKS and "kv_offloading_size" in header["vllm_options"]
    state = ReducerState.from_header(header).apply_all(trace.events)
    assert state.pools["cpu"][0].state == NULL
    cached = [b for b in state.pools["cpu"] if b.state == CACHED]
    assert cached and len(state.cpu_hash_map) == len({b.block_hash for b in cached})
    returning_load(trace.events)


@pytest.mark.anyio
async def test_the_tui_draws_the_cpu_tier_and_the_load(tiny_gpt2_dir, tmp_path):
    from blockviz.tui.app import BlockvizApp
    from blockviz.tui.widgets.pool_grid import PoolGrid
    from tests.test_tui_app import screen_text

    trace = trace_with_the_cpu_tier(tiny_gpt2_dir, tmp_path / "tier.jsonl")
    at, load = returning_load(trace.events)
    app = BlockvizApp(trace=trace, deterministic=True, source_name="tier")
    async with app.run_test(size=(160, 50)) as pilot:
        app.player.timeline.seek(at + 1)
        app.render_views()
        await pilot.pause()
        state = app.player.timeline.state
        cpu_grid = app.query_one("#cpu", PoolGrid)
        cpu_block, gpu_block = load.mapping[0]
        assert state.pools["cpu"][cpu_block].state == CACHED and state.pools["cpu"][cpu_block].num_hits >= 1
        assert cpu_grid.cell_text(cpu_block).strip(), "the CPU pool does not draw the loaded block"
        text = screen_text(app)
        assert "CPU pool" in text and "never used" not in text
        await pilot.press("v", "v", "v")  # to the event log
        await pilot.pause()
        assert f"offload LOAD request {load.request_id}:" in screen_text(app)  # as the tables name it
        hits_then = state.num_prefix_hits
        app.player.timeline.seek(len(trace.events))
        app.render_views()
        await pilot.pause()
        assert app.player.timeline.state.num_prefix_hits >= hits_then > 0


def test_the_notebook_draws_the_cpu_tier_and_the_load(tiny_gpt2_dir):
    from blockviz.jupyter import Visualizer

    options = {"model": str(tiny_gpt2_dir), "device": "cpu", **TINY,
               "vllm_options": {"kv_offloading_size": offloading_size(tiny_block_bytes(TINY["block_size"]))}}
    viz = Visualizer.live(options, prompts=PROMPTS, sampling_params=PARAMS, kv_manager=VLLM.name)
    try:
        assert viz.header["num_cpu_blocks"] == NUM_CPU_BLOCKS
        viz.run_to_completion()
        events = viz.timeline.events
        at, load = returning_load(events)
        viz.seek(at + 1)
        frame = viz.frame()
        assert "cpu" in frame["pools"], "the notebook frame draws no CPU pool"
        cpu_block, gpu_block = load.mapping[0]
        assert frame["touched"]["cpu"] and cpu_block in frame["touched"]["cpu"]
        if frame.get("card"):  # the load's card: the tier's blocks lit, its GPU blocks named in its words
            assert frame["card"]["idea"] == "offload-load" and str(gpu_block) in frame["card"]["what"]
        else:
            assert gpu_block in frame["touched"]["gpu"]
        assert any("offload LOAD" in str(row) for row in frame["log"]["rows"])
        assert viz.state.pools["cpu"][cpu_block].state == CACHED
    finally:
        viz.close()


def test_a_run_with_the_tier_is_not_told_v1_has_no_cpu_pool():
    from blockviz.model.view import v1_notes

    assert "swap" in v1_notes(ReducerState(4, 8, 0, "vllm"))
    assert "swap" not in v1_notes(ReducerState(4, 8, 8, "vllm")) and "cow" in v1_notes(ReducerState(4, 8, 8, "vllm"))


def test_the_story_on_vllm_with_the_tier_answers_v0s_swap():
    """`blockviz run --kv-manager vllm --kv-offloading-size 0.01`: the story's preempted request is
    recomputed, its prefix loaded back from the CPU tier rather than computed again (docs/vllm-core.md)."""
    from blockviz.model.trace import make_header
    from blockviz.session.engine_session import EngineSession
    from blockviz.session.spec import EngineSpec

    spec = EngineSpec.for_scenario("story", kv_manager=VLLM.name, device="cpu", vllm_options={"kv_offloading_size": 0.01})
    session = EngineSession(spec)
    events: list = []
    session.run_to_completion(on_events=events.extend)
    header = make_header(session.header)
    checker = TraceChecker(header["block_size"], header["num_gpu_blocks"], header["num_cpu_blocks"], kv_manager=VLLM.name)
    for event in events:
        checker.check(event)
    at, load = returning_load(events)
    assert [e.mode for e in events[:at] if e.type == "preempted"] and load.num_tokens > 0
    state = checker.state
    assert sorted(state.free_queue) == list(range(1, header["num_gpu_blocks"]))  # every GPU block back
    assert state.pools["cpu"][load.mapping[0][0]].num_hits >= 1


def test_the_tier_publishes_vllms_kv_events_with_medium_cpu(tiny_gpt2_dir, tmp_path):
    """Through vLLM's own decoder: one BlockStored per stored block and one BlockRemoved per CPU
    eviction, medium "CPU" and locality "LOCAL", as SimpleCPUOffloadScheduler queues them."""
    import msgspec
    from vllm.distributed import kv_events

    from blockviz.kvevents.mapping import external_hash, step_batches
    from blockviz.kvevents.protocol import encode_batch

    trace = trace_with_the_cpu_tier(tiny_gpt2_dir, tmp_path / "tier.jsonl", num_cpu_blocks=12)  # it evicts
    decoder = msgspec.msgpack.Decoder(type=kv_events.KVEventBatch)
    sent = [e for batch in step_batches(trace.events, trace.header["block_size"], "vllm")
            for e in decoder.decode(encode_batch(batch)).events]
    cpu_stored = [e for e in sent if isinstance(e, kv_events.BlockStored) and e.medium == "CPU"]
    stores = [e for e in trace.events if e.type == "offload_store"]
    assert [h for e in cpu_stored for h in e.block_hashes] == [external_hash(h) for e in stores for h in e.block_hashes]
    assert all(e.locality == "LOCAL" and len(e.token_ids) == e.block_size for e in cpu_stored)
    cpu_removed = [h for e in sent if isinstance(e, kv_events.BlockRemoved) and e.medium == "CPU" for h in e.block_hashes]
    evicted = [external_hash(e.block_hash) for e in trace.events if e.type == "block_evicted" and e.device == "cpu"]
    assert cpu_removed == evicted and evicted
    assert any(isinstance(e, kv_events.BlockStored) and e.medium == "GPU" for e in sent)

"""`kv_manager="vllm"`: vLLM 0.33's own Scheduler and KVCacheManager drive the engine
(engine/vllm_core/). After every step of each workload (shared openings, n > 1, a tiny pool that
preempts, chunked prefill under a small budget, stops, an abort) the reducer fed only the events
equals vLLM's own state: each request's block ids, each block's ref_cnt and hash, the hash map and
the free queue's order; the adapter's block tables (kept from vLLM's SchedulerOutput as vLLM's GPU
model runner keeps them) equal `KVCacheManager.get_block_ids`. Greedy tokens equal `kv_manager="v1"`
and transformers on a tiny GPT-2, a tiny Llama GQA and the bundled model. The options pass through
to vLLM's configs, and a bad one, or no vLLM at all, is one ValueError line."""

from __future__ import annotations

import importlib.util

import msgspec
import pytest

from blockviz.model.reducer import CACHED, NULL, USED, ReducerState
from blockviz.model.trace_check import TraceChecker
from engine import LLM, EngineConfig, LLMEngine, SamplingParams
from engine.events import BlockHashed, RequestAdded
from engine.v1.kv_cache_utils import external_block_hash
from tests.test_engine_parity import PROMPTS, hf_greedy
from tests.test_engine_v1 import hf, loaded  # noqa: F401 (the tiny GPT-2 and transformers' model, module fixtures)
from engine.designs import V1, VLLM



@pytest.fixture(autouse=True)
def _needs_vllm(request):
    if "without_vllm" not in request.node.name and importlib.util.find_spec("vllm") is None:
        pytest.skip("vLLM is not installed")

GREEDY = SamplingParams(max_tokens=16, ignore_eos=True)
SHARED = "All the world's a stage, and all the men and women merely players."


def make_engine(loaded, path, kv_manager=VLLM.name, **options) -> LLMEngine:
    options.setdefault("max_num_seqs", 8)
    return LLMEngine(EngineConfig(model=str(path), device="cpu", kv_manager=kv_manager, **options), loaded=loaded)


def check_reducer_matches_vllm(reducer: ReducerState, scheduler) -> None:
    """The reducer's picture is vLLM's: tables (vLLM's req_to_blocks), ref counts, owners, states,
    each block's hash, the hash map (each hash's first block) and the free queue's order; and the
    adapter's block tables are KVCacheManager.get_block_ids."""
    from vllm.v1.core.kv_cache_utils import KVCacheBlock, get_block_hash

    manager = scheduler.kv_cache_manager
    pool = manager.block_pool
    (single,) = manager.coordinator.single_type_managers
    tables = {int(r): [("gpu", b.block_id) for b in blocks] for r, blocks in single.req_to_blocks.items()}
    assert reducer.tables == tables, "reducer's block tables differ from vLLM's req_to_blocks"
    view = reducer.pools["gpu"]
    assert view[0].state == NULL
    assert [b.ref_count for b in view[1:]] == [b.ref_cnt for b in pool.blocks[1:]], "ref counts differ"
    assert reducer.free_queue == [b.block_id for b in pool.free_block_queue.get_all_free_blocks()], "free queue differs"
    for block in pool.blocks[1:]:
        shown = view[block.block_id]
        expected_hash = external_block_hash(get_block_hash(block.block_hash)) if block.block_hash else None
        assert shown.block_hash == expected_hash, f"block {block.block_id}: hash differs"
        if block.ref_cnt:
            owners = {s for s, t in tables.items() if ("gpu", block.block_id) in t}
            assert shown.state == USED and shown.owners == owners, f"block {block.block_id} differs"
        else:
            assert shown.state == (CACHED if block.block_hash is not None else "free"), f"free block {block.block_id}"
    first = {external_block_hash(get_block_hash(key)): (held if isinstance(held, KVCacheBlock)
                                                        else next(iter(held.values()))).block_id
             for key, held in pool.cached_block_hash_to_block._cache.items()}
    assert reducer.hash_map == first, "hash map differs"
    for request_id, block_ids in scheduler.block_ids.items():
        assert [list(ids) for ids in block_ids] == [list(ids) for ids in manager.get_block_ids(request_id)]


class Checked:
    """Subscribes a reducer, the trace checker and an event list to an engine; `check()` compares
    the reducer with vLLM's state."""

    def __init__(self, engine: LLMEngine) -> None:
        self.engine = engine
        self.reducer = ReducerState(engine.config.block_size, engine.budget.num_gpu_blocks, 0, "v1")
        self.checker = TraceChecker(engine.config.block_size, engine.budget.num_gpu_blocks, 0, kv_manager=V1.name)
        self.events: list = []
        for subscriber in (self.reducer.apply, self._check_event, self.events.append):
            engine.events.subscribe(subscriber)
        self.num_checks = 0

    def _check_event(self, event) -> None:
        if isinstance(event, RequestAdded):  # a trace reader sees token texts, which the session fills in
            event = msgspec.structs.replace(event, prompt_tokens_text=("·",) * len(event.prompt_token_ids))
        self.checker.check(event)

    def check(self, _engine=None) -> None:
        check_reducer_matches_vllm(self.reducer, self.engine.scheduler)
        self.num_checks += 1

    def of(self, kind: str) -> list:
        return [e for e in self.events if e.type == kind]

    def done(self) -> None:
        assert not self.engine.events.errors, self.engine.events.errors
        pool = self.engine.scheduler.block_pool
        assert pool.get_num_free_blocks() == pool.num_gpu_blocks - 1
        assert self.reducer.num_free("gpu") == pool.num_gpu_blocks - 1
        assert not self.engine.scheduler.vllm.requests


def run_checked(engine: LLMEngine, prompts, params):
    checked = Checked(engine)
    outputs = LLM.from_engine(engine).generate(prompts, params, on_step=checked.check)
    checked.done()
    assert checked.num_checks > 0
    return outputs, checked


def tokens(outputs) -> list[list[list[int]]]:
    return [[c.token_ids for c in o.outputs] for o in outputs]


def v1_tokens(loaded, path, prompts, params, **options):
    return tokens(LLM.from_engine(make_engine(loaded, path, V1.name, **options)).generate(prompts, params))


def assert_parity(hf, engine, outputs, prompts, max_tokens):
    for prompt, output in zip(prompts, outputs):
        expected = hf_greedy(hf, engine.encode(prompt), max_tokens)
        for completion in output.outputs:
            assert completion.token_ids == expected, f"prompt {prompt!r}"


# ---------------------------------------------------------------- workloads, reducer == vLLM after every step


def test_shared_openings_hit_vllms_cache_and_match_v1_and_transformers(hf, loaded, tiny_gpt2_dir):
    prompts = [SHARED + " One", SHARED + " Two", SHARED + " Three", "KV"]
    options = dict(block_size=4, num_gpu_blocks=96)
    engine = make_engine(loaded, tiny_gpt2_dir, **options)
    outputs, checked = run_checked(engine, prompts, GREEDY)
    assert_parity(hf, engine, outputs, prompts, 16)
    assert tokens(outputs) == v1_tokens(loaded, tiny_gpt2_dir, prompts, GREEDY, **options)
    hits = checked.of("prefix_cache_hit")
    assert {s for e in hits for s in e.seq_ids} == set(range(1, 3))  # the second and third hit the first's blocks
    assert outputs[1].num_cached_tokens == len(engine.encode(SHARED)) // 4 * 4
    assert checked.of("block_hashed") and checked.of("block_freed") and checked.of("tokens_scheduled")


@pytest.mark.parametrize("block_size", [1, 3, 16])
def test_greedy_equals_v1_and_transformers_across_block_sizes(hf, loaded, tiny_gpt2_dir, block_size):
    options = dict(block_size=block_size, num_gpu_blocks=512 // block_size + 64)
    engine = make_engine(loaded, tiny_gpt2_dir, **options)
    outputs, _ = run_checked(engine, PROMPTS, GREEDY)
    assert_parity(hf, engine, outputs, PROMPTS, 16)
    assert tokens(outputs) == v1_tokens(loaded, tiny_gpt2_dir, PROMPTS, GREEDY, **options)


def test_n_gt_1_runs_as_requests_sharing_the_prompt(hf, loaded, tiny_gpt2_dir):
    engine = make_engine(loaded, tiny_gpt2_dir, block_size=4, num_gpu_blocks=96)
    prompt = PROMPTS[2]
    outputs, checked = run_checked(engine, [prompt], SamplingParams(n=3, max_tokens=12, ignore_eos=True))
    assert_parity(hf, engine, outputs, [prompt], 12)
    (added,) = checked.of("request_added")
    assert len(added.seq_ids) == 3
    assert {s for e in checked.of("prefix_cache_hit") for s in e.seq_ids} == set(added.seq_ids[1:])
    with pytest.raises(ValueError, match="no fork"):
        engine.fork(0)


@pytest.mark.parametrize("caching", [True, False])
def test_a_tiny_pool_preempts_by_recompute_inside_vllm(hf, loaded, tiny_gpt2_dir, caching):
    options = dict(block_size=2, num_gpu_blocks=40, enable_prefix_caching=caching)
    params = SamplingParams(max_tokens=24, ignore_eos=True)
    engine = make_engine(loaded, tiny_gpt2_dir, **options)
    outputs, checked = run_checked(engine, PROMPTS, params)
    assert_parity(hf, engine, outputs, PROMPTS, 24)
    assert tokens(outputs) == v1_tokens(loaded, tiny_gpt2_dir, PROMPTS, params, **options)
    preempted = checked.of("preempted")
    assert preempted and all(e.mode == "recompute" for e in preempted)
    first = checked.events.index(preempted[0])  # the cause before its frees
    assert checked.events[first + 1].type == "block_freed"
    hits = checked.of("prefix_cache_hit")
    assert bool(hits) is caching, "a recomputed request was not served from its cached blocks"


@pytest.mark.parametrize("budget", [8, 11])
def test_chunked_prefill_under_a_small_budget(hf, loaded, tiny_gpt2_dir, budget):
    engine = make_engine(loaded, tiny_gpt2_dir, block_size=4, num_gpu_blocks=96, max_num_batched_tokens=budget,
                         max_num_seqs=4)
    outputs, checked = run_checked(engine, PROMPTS, GREEDY)
    assert_parity(hf, engine, outputs, PROMPTS, 16)
    steps = checked.of("tokens_scheduled")
    assert all(sum(e.num_new_tokens) <= budget for e in steps)
    assert any(d + n < t for e in steps for d, n, t in zip(e.num_computed_tokens, e.num_new_tokens, e.num_tokens))


def test_stops_free_vllms_requests_where_they_stop(loaded, tiny_gpt2_dir):
    engine = make_engine(loaded, tiny_gpt2_dir, block_size=4, num_gpu_blocks=64)
    free_run = LLM.from_engine(make_engine(loaded, tiny_gpt2_dir, V1.name, block_size=4, num_gpu_blocks=64))
    stop_at = free_run.generate(PROMPTS[0], GREEDY)[0].outputs[0].token_ids[3]
    params = [SamplingParams(max_tokens=m, ignore_eos=True) for m in (2, 9, 5)]
    params.append(SamplingParams(max_tokens=16, ignore_eos=True, stop_token_ids=(stop_at,)))
    outputs, checked = run_checked(engine, PROMPTS[1:] + PROMPTS[:1], params)
    assert [len(o.outputs[0].token_ids) for o in outputs[:3]] == [2, 9, 5]
    assert outputs[3].outputs[0].token_ids[-1] == stop_at and len(outputs[3].outputs[0].token_ids) <= 4
    assert len(checked.of("sequence_freed")) == 4


def test_an_abort_mid_run_frees_in_vllm(loaded, tiny_gpt2_dir):
    engine = make_engine(loaded, tiny_gpt2_dir, block_size=4, num_gpu_blocks=64, max_num_batched_tokens=8)
    checked = Checked(engine)
    ids = [engine.add_request(p, GREEDY) for p in PROMPTS]
    for _ in range(3):
        engine.step()
        checked.check()
    engine.abort_request(ids[2])
    checked.check()
    assert not engine.scheduler.vllm.has_request(str(2))
    while engine.has_unfinished_requests():
        engine.step()
        checked.check()
    checked.done()
    assert [e.detail for e in checked.of("sequence_finished") if e.request_id == ids[2]] == ["aborted by the caller"]


def test_a_request_too_big_for_the_pool_is_ignored_not_looped(loaded, tiny_gpt2_dir):
    engine = make_engine(loaded, tiny_gpt2_dir, block_size=2, num_gpu_blocks=6)
    outputs, _ = run_checked(engine, [PROMPTS[2], "KV"], SamplingParams(max_tokens=4, ignore_eos=True))
    assert outputs[0].outputs[0].finish_reason == "ignored" and "blocks" in outputs[0].outputs[0].finish_detail
    assert outputs[1].outputs[0].finish_reason == "length"


@pytest.mark.parametrize("kv_manager", [V1.name, VLLM.name])
def test_an_ignored_n_gt_1_request_is_one_output(loaded, tiny_gpt2_dir, kv_manager):
    engine = make_engine(loaded, tiny_gpt2_dir, kv_manager, block_size=2, num_gpu_blocks=4)
    engine.add_request(SHARED, SamplingParams(n=3, max_tokens=3))
    outputs = engine.step()
    assert [o.request_id for o in outputs] == ["0"] and outputs[0].finished
    assert [c.finish_reason for c in outputs[0].outputs] == ["ignored"] * 3


def test_a_preempted_request_grown_past_the_pool_ends_ignored(loaded, tiny_gpt2_dir):
    """Two requests share a 9-block pool (8 usable: 16 tokens); each in turn preempts the other,
    then outgrows the pool alone and ends ignored with its reason, as in v1 (vLLM itself refuses
    such a pool at start-up: check_enough_kv_cache_memory)."""
    options = dict(block_size=2, num_gpu_blocks=9)
    params = SamplingParams(max_tokens=40, ignore_eos=True)
    engine = make_engine(loaded, tiny_gpt2_dir, **options)
    outputs, checked = run_checked(engine, ["KV", "KV cache"], params)
    assert checked.of("preempted")
    assert [o.outputs[0].finish_reason for o in outputs] == ["ignored", "ignored"]
    assert all("needs 9 blocks" in o.outputs[0].finish_detail for o in outputs)
    assert tokens(outputs) == v1_tokens(loaded, tiny_gpt2_dir, ["KV", "KV cache"], params, **options)


# ---------------------------------------------------------------- hashes, models, options


def test_event_hashes_are_what_vllms_own_kv_events_carry(loaded, tiny_gpt2_dir):
    engine = make_engine(loaded, tiny_gpt2_dir, block_size=4, num_gpu_blocks=64)
    manager = engine.scheduler.kv_cache_manager
    manager.block_pool.enable_kv_cache_events = True  # vLLM's own BlockStored events, beside ours
    taken, take_events = [], manager.take_events  # update_from_output takes them to publish
    manager.take_events = lambda: taken.extend(take_events()) or taken[len(taken):]
    checked = Checked(engine)
    LLM.from_engine(engine).generate([SHARED, SHARED + " again"], GREEDY)
    stored = [h for e in taken if type(e).__name__ == "BlockStored" for h in e.block_hashes]
    ours = [e.block_hash for e in checked.events if isinstance(e, BlockHashed)]
    assert stored and stored == ours


def test_hashes_equal_engine_v1s_for_the_same_prefix(loaded, tiny_gpt2_dir):
    hashes = {}
    for kv_manager in ("v1", "vllm"):
        engine = make_engine(loaded, tiny_gpt2_dir, kv_manager, block_size=4, num_gpu_blocks=64)
        events = []
        engine.events.subscribe(events.append)
        LLM.from_engine(engine).generate(SHARED, SamplingParams(max_tokens=2, ignore_eos=True))
        hashes[kv_manager] = [e.block_hash for e in events if isinstance(e, BlockHashed)]
    assert hashes["v1"] and hashes["v1"] == hashes["vllm"]


def test_tiny_llama_gqa_matches_v1_and_transformers(tmp_path):
    from transformers import AutoModelForCausalLM

    from tests.test_llama_parity import make_tiny_llama

    path = make_tiny_llama(tmp_path / "llama", "llama-gqa")
    model = AutoModelForCausalLM.from_pretrained(path).eval()
    model.generation_config.eos_token_id = None
    llm = LLM(str(path), device="cpu", kv_manager=VLLM.name, block_size=4, num_gpu_blocks=40, max_num_seqs=4)
    assert llm.engine.loaded.config.num_kv_heads < llm.engine.loaded.config.num_heads
    outputs = llm.generate(PROMPTS, GREEDY)
    assert_parity((model, None), llm.engine, outputs, PROMPTS, 16)
    v1 = LLM(str(path), device="cpu", kv_manager=V1.name, block_size=4, num_gpu_blocks=40, max_num_seqs=4)
    assert tokens(outputs) == tokens(v1.generate(PROMPTS, GREEDY))


def test_the_bundled_model_generates_as_v1_does():
    options = dict(device="cpu", block_size=8, num_gpu_blocks=64, max_num_seqs=4)
    prompts = ["To be, or not to be", "To be, or not to be, that is"]
    params = SamplingParams(max_tokens=12, ignore_eos=True)
    ours = LLM("tiny-shakespeare", kv_manager=VLLM.name, **options).generate(prompts, params)
    assert tokens(ours) == tokens(LLM("tiny-shakespeare", kv_manager=V1.name, **options).generate(prompts, params))


def test_vllm_options_reach_vllms_configs(loaded, tiny_gpt2_dir):
    engine = make_engine(loaded, tiny_gpt2_dir, block_size=4, num_gpu_blocks=64, vllm_options={
        "scheduler_reserve_full_isl": False, "watermark": 0.1, "policy": "priority",
        "long_prefill_token_threshold": 8, "prefix_caching_hash_algo": "sha256_cbor"})
    vllm = engine.scheduler.vllm
    assert vllm.scheduler_reserve_full_isl is False and vllm.policy.value == "priority"
    assert vllm.kv_cache_manager.watermark_blocks == int(0.1 * 64)
    assert vllm.scheduler_config.long_prefill_token_threshold == 8
    assert vllm.cache_config.prefix_caching_hash_algo == "sha256_cbor"
    outputs, checked = run_checked(engine, PROMPTS, GREEDY)
    assert all(o.finished for o in outputs)
    assert all(n <= 8 for e in checked.of("tokens_scheduled") for n in e.num_new_tokens if len(e.seq_ids) > 1)
    off = make_engine(loaded, tiny_gpt2_dir, block_size=4, num_gpu_blocks=64,
                      vllm_options={"enable_prefix_caching": False})
    assert off.scheduler.kv_cache_manager.enable_caching is False


@pytest.mark.parametrize("options, match", [
    ({"no_such_option": 1}, "unknown vllm option 'no_such_option'"),
    ({"policy": "lifo"}, "vllm option policy: vLLM refused it"),
    ({"watermark": -1}, "vllm option watermark: vLLM refused it"),
    ({"block_size": 8}, "set by the engine: use the engine option block_size"),
])
def test_a_bad_vllm_option_is_one_line(loaded, tiny_gpt2_dir, options, match):
    with pytest.raises(ValueError, match=match) as raised:
        make_engine(loaded, tiny_gpt2_dir, block_size=4, num_gpu_blocks=64, vllm_options=options)
    assert "\n" not in str(raised.value)
    with pytest.raises(ValueError, match="kv_manager 'vllm' only"):
        EngineConfig(kv_manager=V1.name, vllm_options=options)


def test_async_scheduling_is_vllms_default_order_and_the_option_or_the_cpu_tier_makes_it_sync(loaded, tiny_gpt2_dir,
                                                                                                caplog):
    """vLLM 0.33's default order (VllmConfig resolves async_scheduling to True: its AsyncScheduler)
    unless async_scheduling=false; the CPU tier runs synchronously, saying so in one warning line
    when the option asked for async; the trace header records the order that ran."""
    import logging

    from vllm.v1.core.sched.async_scheduler import AsyncScheduler

    from blockviz.session.engine_session import trace_header
    from engine.vllm_core.config import CPU_TIER_SYNC

    tier = {"kv_offloading_size": 16 * 2 * 2 * 4 * 16 * 4 * 4 / (1 << 30)}  # 16 blocks of 4 of the tiny GPT-2
    cases = [({}, True, 0), ({"async_scheduling": False}, False, 0), (tier, False, 0),
             ({**tier, "async_scheduling": True}, False, 1), ({**tier, "async_scheduling": False}, False, 0)]
    for options, expected, warnings in cases:
        caplog.clear()
        with caplog.at_level(logging.WARNING, logger="engine"):
            engine = make_engine(loaded, tiny_gpt2_dir, block_size=4, num_gpu_blocks=64, vllm_options=options)
        said = [r.getMessage() for r in caplog.records if r.name == "engine"]
        assert said == [CPU_TIER_SYNC] * warnings and all("\n" not in line for line in said), (options, said)
        assert engine.async_scheduling is expected and isinstance(engine.scheduler.vllm, AsyncScheduler) is expected
        assert trace_header(engine)["async_scheduling"] is expected
    assert trace_header(make_engine(loaded, tiny_gpt2_dir, V1.name, block_size=4,
                                    num_gpu_blocks=64))["async_scheduling"] is True  # engine/v1: vLLM 0.33's default too


def test_v1_traits_apply_to_vllm():
    assert EngineConfig(kv_manager=VLLM.name).enable_prefix_caching is True
    with pytest.raises(ValueError, match="recompute only"):
        EngineConfig(kv_manager=VLLM.name, preemption_mode="swap")


def test_without_vllm_the_option_names_the_install_command(monkeypatch):
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == VLLM.requires else real(name, *a))
    with pytest.raises(ValueError, match=r"pip install -e '\.\[vllm\]'.*--no-deps vllm==0\.33\.0") as raised:
        EngineConfig(kv_manager=VLLM.name)
    assert "\n" not in str(raised.value)


# ---------------------------------------------------------------- the v1 story on vLLM's scheduler, as a trace


def test_the_v1_story_on_vllm_records_loads_replays_and_explains(tmp_path):
    import vllm

    from blockviz.model.explain import HIT, explain_requests
    from blockviz.model.timeline import Timeline
    from blockviz.model.trace import make_header, read_trace, write_trace
    from blockviz.model.view import snapshot
    from blockviz.session.engine_session import EngineSession
    from blockviz.session.spec import EngineSpec

    spec = EngineSpec.for_scenario("story", kv_manager=VLLM.name, device="cpu",
                                   vllm_options={"scheduler_reserve_full_isl": True})
    assert spec.arrivals and spec.config.max_num_batched_tokens  # vLLM v1's story, its token budget
    session = EngineSession(spec)
    events: list = []
    session.run_to_completion(on_events=events.extend)
    header = make_header(session.header)
    assert header["kv_manager"] == "vllm" and header["vllm_version"] == vllm.__version__
    assert header["vllm_options"] == {"scheduler_reserve_full_isl": True}
    write_trace(tmp_path / "vllm.jsonl", header, events)
    trace = read_trace(tmp_path / "vllm.jsonl")  # the checker replays every event under the header
    assert len(trace.events) == len(events)
    timeline = Timeline.for_trace(trace)
    assert len(timeline) == len(events) and timeline.seek(len(events))  # time travel to the end
    state = ReducerState.from_header(header).apply_all(trace.events)
    assert snapshot(state)["kv_manager"] == "vllm" and state.design.null_block and state.design.free_queue  # v1's traits
    assert state.pools["gpu"][0].state == NULL
    assert sorted(state.free_queue) == list(range(1, header["num_gpu_blocks"]))  # every block back, block 0 null
    hits = [e for e in events if e.type == "prefix_cache_hit"]
    explained = explain_requests(trace.events, header["block_size"], header["num_gpu_blocks"], 0, True, "vllm",
                                 header["prefix_caching_hash_algo"])
    assert hits and sum(b.verdict == HIT for x in explained for b in x.blocks) == len(hits)


# ---------------------------------------------------------------- the command line


def _blockviz(*args: str, hide_vllm: bool = False):
    import subprocess
    import sys

    hide = "import sys; sys.modules['vllm'] = None; " if hide_vllm else "import sys; "
    code = hide + "from blockviz.cli import main; sys.exit(main(sys.argv[1:]))"
    return subprocess.run([sys.executable, "-c", code, *args], capture_output=True, text=True, timeout=120,
                          stdin=subprocess.DEVNULL)


@pytest.mark.parametrize(("args", "expected"), [
    (["--vllm-option", "no_such_option=1"], "unknown vllm option 'no_such_option'"),
    (["--vllm-option", "policy=lifo"], "vllm option policy: vLLM refused it"),
    (["--vllm-option", "watermark"], "--vllm-option takes KEY=VALUE"),
], ids=["unknown", "refused", "no-value"])
def test_a_bad_vllm_option_on_the_command_line_is_one_line_exit_2(tmp_path, args, expected):
    result = _blockviz("record", "--out", str(tmp_path / "t.jsonl"), "--kv-manager", "vllm", *args)
    lines = result.stderr.strip().splitlines()
    assert result.returncode == 2 and len(lines) == 1 and expected in lines[0], result.stderr
    assert not (tmp_path / "t.jsonl").exists()


def test_vllms_config_fields_read_from_its_source_are_its_classes_fields():
    from vllm.config import CacheConfig, SchedulerConfig

    from engine.vllm_core.config import _fields, source_fields

    assert source_fields() == (_fields(SchedulerConfig), _fields(CacheConfig))


@pytest.mark.parametrize(("args", "expected"), [
    (["--vllm-option", "no_such_option=1"], "unknown vllm option 'no_such_option'"),
    (["--vllm-option", "kv_offloading_size=-2"], "must be a positive number of GiB, got -2"),
    (["--vllm-option", "block_size=8"], "is set by the engine"),
], ids=["unknown", "option-negative", "owned"])
def test_a_bad_vllm_option_name_or_size_is_refused_without_importing_vllm_or_torch(tmp_path, args, expected):
    import subprocess
    import sys

    code = ("import sys; from blockviz.cli import main; code = main(sys.argv[1:]); "
            "print(sorted(m for m in ('torch', 'transformers', 'vllm') if m in sys.modules)); sys.exit(code)")
    result = subprocess.run([sys.executable, "-c", code, "record", "--out", str(tmp_path / "t.jsonl"),
                             "--kv-manager", "vllm", *args], capture_output=True, text=True, timeout=120,
                            stdin=subprocess.DEVNULL)
    lines = result.stderr.strip().splitlines()
    assert result.returncode == 2 and len(lines) == 1 and expected in lines[0], result.stderr
    assert result.stdout.strip() == "[]"  # none of them imported


def test_without_vllm_the_command_line_names_the_install_command(tmp_path):
    result = _blockviz("generate", "--kv-manager", "vllm", "--prompt", "A", hide_vllm=True)
    lines = result.stderr.strip().splitlines()
    assert result.returncode == 2 and len(lines) == 1 and "pip install -e '.[vllm]'" in lines[0], result.stderr


def test_generate_and_record_with_kv_manager_vllm(tiny_gpt2_dir, tmp_path, capsys):
    import json

    from blockviz.cli import main
    from blockviz.model.trace import read_trace

    options = ["--model", str(tiny_gpt2_dir), "--prompt", "To be, or not", "--prompt", "To be, or not to",
               "--n", "2", "--max-tokens", "6", "--block-size", "4", "--num-gpu-blocks", "32", "--temperature", "0"]
    docs = {}
    for manager in ("v1", "vllm"):
        assert main(["generate", *options, "--json", "--kv-manager", manager]) == 0
        docs[manager] = json.loads(capsys.readouterr().out)
    texts = {m: [[c["token_ids"] for c in r["completions"]] for r in doc["requests"]] for m, doc in docs.items()}
    assert texts["v1"] == texts["vllm"]
    out = tmp_path / "vllm.jsonl"
    assert main(["record", "--out", str(out), *options, "--kv-manager", "vllm",
                 "--vllm-option", "scheduler_reserve_full_isl=false", "--vllm-option", "policy=priority"]) == 0
    header = read_trace(out).header
    assert header["kv_manager"] == "vllm" and header["vllm_options"] == {"scheduler_reserve_full_isl": False,
                                                                        "policy": "priority"}
    assert main(["export", str(out), "--out", str(tmp_path / "vllm.svg")]) == 0
    assert "<svg" in (tmp_path / "vllm.svg").read_text(encoding="utf-8")


def test_a_notebook_visualizer_draws_vllms_state_live(tiny_gpt2_dir):
    from blockviz.jupyter import Visualizer

    viz = Visualizer.live({"model": str(tiny_gpt2_dir), "device": "cpu", "block_size": 4, "num_gpu_blocks": 32},
                          prompts=[SHARED + " One", SHARED + " Two"], sampling_params=GREEDY, kv_manager=VLLM.name)
    assert viz.header["kv_manager"] == "vllm"
    scheduler = viz.llm.engine.scheduler
    viz.step()
    check_reducer_matches_vllm(viz.state, scheduler)
    viz.run_to_completion()
    check_reducer_matches_vllm(viz.state, scheduler)
    assert viz.state.num_prefix_hits > 0 and viz.frame()["cursor"] is not None
    with pytest.raises(ValueError, match="recompute only"):
        viz.preempt("0")
    viz.close()

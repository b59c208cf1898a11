"""The engine in vLLM v1 mode (EngineConfig.kv_manager="v1"): greedy text equals v0 mode and
transformers token for token across block sizes, tiny pools that force preemption, chunked-prefill
budgets, prefix caching and n > 1; the invariants hold and the reducer equals the manager after
every step, and every event passes the trace checker; random configurations all terminate with
every block free."""

from __future__ import annotations

import msgspec
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from blockviz.model.reducer import ReducerState
from reducer_checks import check_reducer_matches_v1
from blockviz.model.trace_check import TraceChecker
from engine import LLM, EngineConfig, LLMEngine, SamplingParams
from engine.events import RequestAdded
from engine.v1.invariants import check_kv_cache_invariants
from tests.test_engine_parity import PROMPTS, hf_greedy
from engine.designs import V1


@pytest.fixture(scope="module")
def hf(tiny_gpt2_dir):
    from transformers import AutoTokenizer, GPT2LMHeadModel

    return GPT2LMHeadModel.from_pretrained(tiny_gpt2_dir).eval(), AutoTokenizer.from_pretrained(tiny_gpt2_dir)


@pytest.fixture(scope="module")
def loaded(tiny_gpt2_dir):
    from engine.model_loader import load_model

    return load_model(str(tiny_gpt2_dir), "cpu", None)


def v1_engine(loaded, tiny_gpt2_dir, **options) -> LLMEngine:
    return LLMEngine(EngineConfig(model=str(tiny_gpt2_dir), device="cpu", kv_manager=V1.name, **options), loaded=loaded)


def run_checked(engine: LLMEngine, prompts, params):
    """generate() with the v1 invariants and reducer == manager after every step, and the trace
    checker on every event; ends with every block free."""
    manager = engine.kv_manager
    reducer = ReducerState(engine.config.block_size, engine.budget.num_gpu_blocks, 0, "v1")
    checker = TraceChecker(engine.config.block_size, engine.budget.num_gpu_blocks, 0, kv_manager=V1.name)
    events: list = []

    def check(event):  # a trace reader sees the prompt's token texts, which the engine session fills in
        if isinstance(event, RequestAdded):
            event = msgspec.structs.replace(event, prompt_tokens_text=("·",) * len(event.prompt_token_ids))
        checker.check(event)

    for subscriber in (reducer.apply, check, events.append):
        engine.events.subscribe(subscriber)

    def on_step(_):
        check_kv_cache_invariants(manager)
        check_reducer_matches_v1(reducer, manager)

    outputs = LLM.from_engine(engine).generate(prompts, params, on_step=on_step)
    assert not engine.events.errors, engine.events.errors  # the checker raised on no event
    assert manager.req_to_blocks == {}
    assert manager.get_num_free_gpu_blocks() == manager.num_usable_blocks
    assert reducer.num_free("gpu") == manager.num_usable_blocks
    return outputs, events


def v0_tokens(loaded, tiny_gpt2_dir, prompts, params, **options):
    llm = LLM.from_engine(LLMEngine(EngineConfig(model=str(tiny_gpt2_dir), device="cpu", **options), loaded=loaded))
    return [[c.token_ids for c in o.outputs] for o in llm.generate(prompts, params)]


def assert_parity(hf, engine, outputs, prompts, max_tokens):
    for prompt, output in zip(prompts, outputs):
        expected = hf_greedy(hf, engine.encode(prompt), max_tokens)
        for completion in output.outputs:
            assert completion.token_ids == expected, f"prompt {prompt!r}"


GREEDY = SamplingParams(max_tokens=16, ignore_eos=True)


@pytest.mark.parametrize("block_size", [1, 3, 16])
def test_v1_greedy_matches_v0_and_transformers(hf, loaded, tiny_gpt2_dir, block_size):
    engine = v1_engine(loaded, tiny_gpt2_dir, block_size=block_size, num_gpu_blocks=512 // block_size + 64)
    outputs, events = run_checked(engine, PROMPTS, GREEDY)
    assert_parity(hf, engine, outputs, PROMPTS, 16)
    assert [[c.token_ids for c in o.outputs] for o in outputs] == v0_tokens(
        loaded, tiny_gpt2_dir, PROMPTS, GREEDY, block_size=block_size, num_gpu_blocks=512 // block_size + 64)
    first = next(e for e in events if e.type == "tokens_scheduled")
    assert first.num_new_tokens == tuple(len(engine.encode(p)) for p in PROMPTS)  # all four prefilled at once


@pytest.mark.parametrize("budget", [3, 7, 16])
def test_chunked_prefill_matches_transformers(hf, loaded, tiny_gpt2_dir, budget):
    engine = v1_engine(loaded, tiny_gpt2_dir, block_size=4, num_gpu_blocks=96, max_num_batched_tokens=budget)
    outputs, events = run_checked(engine, PROMPTS, GREEDY)
    assert_parity(hf, engine, outputs, PROMPTS, 16)
    steps = [e for e in events if e.type == "tokens_scheduled"]
    assert all(sum(e.num_new_tokens) <= budget for e in steps)
    chunks = [(d, n, t) for e in steps for d, n, t in zip(e.num_computed_tokens, e.num_new_tokens, e.num_tokens)
              if d + n < t]
    assert chunks, "no prompt was prefilled in chunks"


def test_tiny_pool_preempts_by_recompute_and_still_matches(hf, loaded, tiny_gpt2_dir):
    engine = v1_engine(loaded, tiny_gpt2_dir, block_size=2, num_gpu_blocks=40)
    outputs, events = run_checked(engine, PROMPTS, SamplingParams(max_tokens=24, ignore_eos=True))
    assert_parity(hf, engine, outputs, PROMPTS, 24)
    preempted = [e for e in events if e.type == "preempted"]
    assert preempted and all(e.mode == "recompute" for e in preempted)
    hits = [e for e in events if e.type == "prefix_cache_hit"]
    assert hits, "a recomputed request was not served from its cached blocks"
    assert not any(e.type in ("swap_out", "copy_on_write", "fork") for e in events)


def test_prefix_caching_shares_a_prompt_and_no_caching_does_not(hf, loaded, tiny_gpt2_dir):
    shared = "All the world's a stage, and all the men and women merely players."
    prompts = [shared + " One", shared + " Two"]
    counts = {}
    for caching in (True, False):
        engine = v1_engine(loaded, tiny_gpt2_dir, block_size=4, num_gpu_blocks=96, max_num_seqs=1,
                           enable_prefix_caching=caching)
        assert engine.config.enable_prefix_caching is caching
        outputs, events = run_checked(engine, prompts, GREEDY)
        assert_parity(hf, engine, outputs, prompts, 16)
        counts[caching] = sum(e.type == "prefix_cache_hit" for e in events)
    assert counts[True] >= len(LLMEngine.encode(engine, shared)) // 4 - 1 and counts[False] == 0


def test_prefix_caching_is_on_by_default_in_v1_only():
    assert EngineConfig(kv_manager=V1.name).enable_prefix_caching is True
    assert EngineConfig().enable_prefix_caching is False
    with pytest.raises(ValueError, match="recompute only"):
        EngineConfig(kv_manager=V1.name, preemption_mode="swap")
    with pytest.raises(ValueError, match="kv_manager"):
        EngineConfig(kv_manager="v2")


def test_n_children_share_the_prompt_through_the_cache(hf, loaded, tiny_gpt2_dir):
    engine = v1_engine(loaded, tiny_gpt2_dir, block_size=4, num_gpu_blocks=96)
    prompt = PROMPTS[2]
    outputs, events = run_checked(engine, [prompt], SamplingParams(n=3, max_tokens=12, ignore_eos=True))
    assert_parity(hf, engine, outputs, [prompt], 12)
    (added,) = [e for e in events if e.type == "request_added"]
    assert len(added.seq_ids) == 3 and added.n == 3  # three requests, no fork
    hit_seqs = {s for e in events if e.type == "prefix_cache_hit" for s in e.seq_ids}
    assert hit_seqs == set(added.seq_ids[1:])  # the children hit the first one's blocks
    assert [c.index for c in outputs[0].outputs] == [0, 1, 2]
    with pytest.raises(ValueError, match="no fork"):
        engine.fork(0)


def test_sampled_children_differ_and_repeat_with_the_seed(loaded, tiny_gpt2_dir):
    params = SamplingParams(n=3, temperature=1.0, max_tokens=10, ignore_eos=True, seed=7)
    runs = [[c.token_ids for c in LLM.from_engine(v1_engine(loaded, tiny_gpt2_dir, block_size=4, num_gpu_blocks=64))
             .generate(PROMPTS[0], params)[0].outputs] for _ in range(2)]
    assert runs[0] == runs[1] and len({tuple(t) for t in runs[0]}) > 1


def test_a_request_too_big_for_the_pool_is_ignored_not_looped(loaded, tiny_gpt2_dir):
    engine = v1_engine(loaded, tiny_gpt2_dir, block_size=2, num_gpu_blocks=6)
    outputs, _ = run_checked(engine, [PROMPTS[2], "KV"], SamplingParams(max_tokens=4, ignore_eos=True))
    assert outputs[0].outputs[0].finish_reason == "ignored" and outputs[1].outputs[0].finish_reason == "length"


@settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(block_size=st.integers(1, 6), num_blocks=st.integers(2, 40), budget=st.integers(1, 40),
       max_num_seqs=st.integers(1, 4), n=st.integers(1, 3), caching=st.booleans(),
       prompts=st.lists(st.sampled_from(PROMPTS), min_size=1, max_size=3), max_tokens=st.integers(1, 12))
def test_random_v1_configurations_terminate_with_every_block_free(loaded, tiny_gpt2_dir, block_size, num_blocks,
                                                                 budget, max_num_seqs, n, caching, prompts, max_tokens):
    engine = v1_engine(loaded, tiny_gpt2_dir, block_size=block_size, num_gpu_blocks=num_blocks,
                       max_num_batched_tokens=budget, max_num_seqs=max(max_num_seqs, n),
                       enable_prefix_caching=caching)
    params = SamplingParams(n=n, max_tokens=max_tokens, ignore_eos=True)
    num_steps = 0

    def bounded(_):
        nonlocal num_steps
        num_steps += 1
        assert num_steps < 2000, "the engine did not finish"

    engine.events.subscribe(lambda e: None)
    outputs = LLM.from_engine(engine).generate(prompts, params, on_step=bounded)
    assert all(o.finished for o in outputs)
    assert engine.kv_manager.get_num_free_gpu_blocks() == num_blocks - 1
    check_kv_cache_invariants(engine.kv_manager)

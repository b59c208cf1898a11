"""`kv_manager="sglang"`: SGLang 0.5.23's own RadixCache, allocator, ReqToTokenPool, SchedulePolicy
and PrefillAdder drive the engine (engine/sglang_core/). After every step of seeded workloads with
shared openings, at page_size 1 and 4, in pools small enough to evict (and to retract), the reducer
fed only the events holds SGLang's tree (each node's tokens, slots and lock_ref, by TreeNode.id),
each request's pages (its ReqToTokenPool row) and each page's state. Greedy tokens equal
transformers and `kv_manager="v1"`. Bad options are one ValueError line."""

from __future__ import annotations

import importlib.util
import random

import pytest

from blockviz.model.reducer import CACHED, FREE, NULL, USED, ReducerState
from blockviz.model.trace_check import TraceChecker
from engine import EngineConfig, LLMEngine, SamplingParams
from engine.designs import SGLANG, V1
from engine.events import Preempted, RadixNodeEvicted, RadixNodeInserted, RadixNodeSplit
from tests.test_engine_parity import hf_greedy
from tests.test_engine_v1 import hf, loaded  # noqa: F401 (the tiny GPT-2 and transformers' model, module fixtures)


@pytest.fixture(autouse=True)
def _needs_sglang():
    if importlib.util.find_spec("sglang") is None:
        pytest.skip("SGLang is not installed")


GREEDY = SamplingParams(max_tokens=6, ignore_eos=True)


def make_engine(loaded, path, kv_manager=SGLANG.name, **options) -> LLMEngine:
    options.setdefault("max_num_seqs", 8)
    return LLMEngine(EngineConfig(model=str(path), device="cpu", dtype="float32", kv_manager=kv_manager, **options),
                     loaded=loaded)


def workload(seed: int, num_requests: int = 6) -> list[list[int]]:
    """Prompts sharing openings: a system prompt, two users' turns, a follow-up repeating a turn."""
    rng = random.Random(seed)
    system = [rng.randrange(5, 300) for _ in range(9)]
    prompts = []
    for _ in range(num_requests):
        base = list(rng.choice(prompts)) if prompts and rng.random() < 0.4 else list(system)
        prompts.append(base + [rng.randrange(5, 300) for _ in range(rng.randrange(4, 9))])
    return prompts


def check_reducer_matches_sglang(reducer: ReducerState, scheduler) -> None:
    """The reducer's tree is SGLang's root_node (ids, parents, token runs, slots, lock_ref); its
    tables are the requests' pages; a page a request holds is in use with that many holders, a
    page only the tree holds is cached, every other page (but SGLang's padding page 0) is free."""
    from engine.sglang_core.event_tap import tree_nodes

    assert reducer.radix_nodes == tree_nodes(scheduler.tree_cache), "the reducer's tree differs from SGLang's"
    tables = {seq_id: [("gpu", page) for page in pages] for seq_id, pages in scheduler.tables.items()}
    assert {s: t for s, t in reducer.tables.items() if t} == tables, "the reducer's tables differ"
    for seq_id, req in ((seq_id, scheduler.reqs[seq_id]) for seq_id in scheduler.tables):
        n = len(scheduler.tables[seq_id]) * scheduler.page_size
        row = scheduler.req_to_token_pool.req_to_token[req.kv.req_pool_idx, :n:scheduler.page_size].tolist()
        assert [slot // scheduler.page_size for slot in row] == list(scheduler.tables[seq_id])
    holders: dict[int, int] = {}
    for pages in scheduler.tables.values():
        for page in pages:
            holders[page] = holders.get(page, 0) + 1
    in_tree = {slot // scheduler.page_size for node in tree_nodes(scheduler.tree_cache).values() for slot in node.slots}
    pool = reducer.pools["gpu"]
    assert pool[0].state == NULL
    for block in pool[1:]:
        expected = USED if block.number in holders else CACHED if block.number in in_tree else FREE
        assert block.state == expected, f"page {block.number}: {block.state}, SGLang: {expected}"
        assert block.ref_count == holders.get(block.number, 0)
    free_pages = scheduler.allocator.available_size() // scheduler.page_size
    assert free_pages == sum(1 for block in pool[1:] if block.state == FREE)


def run_checked(engine: LLMEngine, prompts, params=GREEDY):
    """Every prompt at once, stepped to the end with the reducer checked after every step; returns
    each request's tokens and the events."""
    reducer = ReducerState(engine.config.block_size, engine.budget.num_gpu_blocks, 0, kv_manager=SGLANG.name)
    checker = TraceChecker(engine.config.block_size, engine.budget.num_gpu_blocks, 0, kv_manager=SGLANG.name)
    events = []
    for subscriber in (reducer.apply, checker.check, events.append):
        engine.events.subscribe(subscriber)
    for index, prompt in enumerate(prompts):
        engine.add_request(prompt, params, request_id=f"r{index}")
    tokens = {}
    while engine.has_unfinished_requests():
        for output in engine.step():
            if output.finished:
                tokens[output.request_id] = output.outputs[0].token_ids
        check_reducer_matches_sglang(reducer, engine.scheduler)
    assert engine.scheduler.tables == {} and not engine.events.errors, engine.events.errors
    return [tokens[f"r{i}"] for i in range(len(prompts))], events


@pytest.mark.parametrize("page_size, num_gpu_blocks, chunk", [(1, 49, 8), (4, 13, 8), (4, 40, -1)])
def test_tree_and_pages_match_sglang_and_greedy_matches_transformers(hf, loaded, tiny_gpt2_dir, page_size,
                                                                     num_gpu_blocks, chunk):
    prompts = workload(page_size * 100 + num_gpu_blocks)
    engine = make_engine(loaded, tiny_gpt2_dir, num_gpu_blocks=num_gpu_blocks,
                         sglang_options={"page_size": page_size, "schedule_policy": "lpm", "chunked_prefill_size": chunk})
    assert engine.config.block_size == page_size
    tokens, events = run_checked(engine, prompts)
    assert tokens == [hf_greedy(hf, prompt, GREEDY.max_tokens) for prompt in prompts]
    kinds = {type(e) for e in events}
    if page_size == 1 or chunk == -1:  # (chunks of whole pages publish the opening as a node of its own)
        assert RadixNodeSplit in kinds, "the shared openings split a node"
    if num_gpu_blocks < 40:
        assert RadixNodeEvicted in kinds, "the small pool evicts leaves"
    v1 = make_engine(loaded, tiny_gpt2_dir, kv_manager=V1.name, block_size=4, num_gpu_blocks=64)
    assert run_v1(v1, prompts) == tokens


def run_v1(engine: LLMEngine, prompts, params=GREEDY) -> list[list[int]]:
    outputs = {}
    for index, prompt in enumerate(prompts):
        engine.add_request(prompt, params, request_id=f"r{index}")
    while engine.has_unfinished_requests():
        for output in engine.step():
            if output.finished:
                outputs[output.request_id] = output.outputs[0].token_ids
    return [outputs[f"r{i}"] for i in range(len(prompts))]


def test_retraction_is_announced_and_keeps_parity(hf, loaded, tiny_gpt2_dir):
    """Requests that may stop at EOS are admitted on SGLang's estimate of their output
    (new_token_ratio); when decoding outgrows the pool, SGLang's retract_decode takes requests back
    to the waiting queue (each a Preempted event first), and they finish with the tokens they
    would have had."""
    prompts = [[7 + i] * 3 + list(range(40 + 9 * i, 48 + 9 * i)) for i in range(4)]
    params = SamplingParams(max_tokens=40)
    engine = make_engine(loaded, tiny_gpt2_dir, num_gpu_blocks=26, sglang_options={"page_size": 4})
    tokens, events = run_checked(engine, prompts, params)
    assert any(isinstance(e, Preempted) for e in events), "the small pool retracts a request"
    v1 = make_engine(loaded, tiny_gpt2_dir, kv_manager=V1.name, block_size=4, num_gpu_blocks=64)
    assert run_v1(v1, prompts, params) == tokens
    for prompt, completion in zip(prompts, tokens):
        assert completion == hf_greedy(hf, prompt, params.max_tokens)[:len(completion)]


@pytest.mark.parametrize("options, message", [
    ({"page_sise": 4}, "unknown sglang option 'page_sise'"),
    ({"page_size": 0}, "sglang option page_size must be a positive integer"),
    ({"schedule_policy": "fastest"}, "sglang option schedule_policy must be one of"),
    ({"chunked_prefill_size": 0}, "sglang option chunked_prefill_size must be positive or -1"),
])
def test_bad_options_are_one_line(options, message):
    with pytest.raises(ValueError) as error:
        EngineConfig(kv_manager=SGLANG.name, sglang_options=options)
    assert str(error.value).startswith(message) and "\n" not in str(error.value)


def test_sglang_options_belong_to_sglang():
    with pytest.raises(ValueError, match="sglang_options apply to kv_manager 'sglang' only"):
        EngineConfig(kv_manager=V1.name, sglang_options={"page_size": 4})


def test_another_sglang_release_is_refused_in_one_line(monkeypatch):
    from importlib import metadata

    import engine.sglang_core as core

    real = metadata.version  # every other package keeps its version: a library caching one read here stays right
    monkeypatch.setattr(metadata, "version", lambda name: "0.5.9" if name == SGLANG.requires else real(name))
    with pytest.raises(ValueError, match=r"^kv_manager 'sglang' supports SGLang 0\.5\.23, found SGLang 0\.5\.9"):
        core.check_sglang_version()


def test_a_prompt_bigger_than_the_pool_is_ignored_with_its_reason(loaded, tiny_gpt2_dir):
    engine = make_engine(loaded, tiny_gpt2_dir, num_gpu_blocks=4, sglang_options={"page_size": 4})
    engine.add_request(list(range(5, 30)), GREEDY, request_id="big")
    (output,) = engine.step()
    assert output.finished and output.outputs[0].finish_reason == "ignored"
    assert "needs 7 blocks for 25 tokens but the pool has 3" in output.outputs[0].finish_detail


def test_n2_greedy_equals_vllms_own_scheduler(loaded, tiny_gpt2_dir):
    """n = 2 runs as two SGLang requests sharing the prompt through the tree; every completion's
    greedy tokens equal vLLM's own scheduler's on the same requests (the checks after every step
    hold)."""
    if importlib.util.find_spec("vllm") is None:
        pytest.skip("vLLM is not installed")
    from engine.designs import VLLM

    prompts = workload(11, num_requests=4)
    params = SamplingParams(n=2, max_tokens=5, ignore_eos=True)
    engine = make_engine(loaded, tiny_gpt2_dir, num_gpu_blocks=30, sglang_options={"page_size": 4})
    reducer = ReducerState(4, engine.budget.num_gpu_blocks, 0, kv_manager=SGLANG.name)
    engine.events.subscribe(reducer.apply)
    runs = {}
    for name, run_engine in ((SGLANG.name, engine),
                             (VLLM.name, make_engine(loaded, tiny_gpt2_dir, kv_manager=VLLM.name, block_size=4,
                                                     num_gpu_blocks=64))):
        for index, prompt in enumerate(prompts):
            run_engine.add_request(prompt, params, request_id=f"r{index}")
        outputs = {}
        while run_engine.has_unfinished_requests():
            for output in run_engine.step():
                if output.finished:
                    outputs[output.request_id] = [c.token_ids for c in output.outputs]
            if run_engine is engine:
                check_reducer_matches_sglang(reducer, engine.scheduler)
        runs[name] = [outputs[f"r{i}"] for i in range(len(prompts))]
    assert runs[SGLANG.name] == runs[VLLM.name]
    assert all(len(completions) == 2 and completions[0] == completions[1] for completions in runs[SGLANG.name])


@pytest.mark.parametrize("event, message", [
    (RadixNodeSplit(0, node_id=5, new_node_id=6, num_tokens=1), "radix node 5 is not in the tree"),
    (RadixNodeInserted(0, node_id=5, parent_id=9, token_ids=(1,), slots=(4,), lock_ref=0), "parent 9 is not in the tree"),
    (RadixNodeInserted(0, node_id=5, parent_id=None, token_ids=(1, 2), slots=(4,), lock_ref=0), "not one each"),
    (RadixNodeInserted(0, node_id=5, parent_id=None, token_ids=(1,), slots=(2,), lock_ref=0), "slots outside 4..31"),
])
def test_the_trace_checker_refuses_a_radix_event_that_cannot_be(event, message):
    checker = TraceChecker(4, 8, 0, kv_manager=SGLANG.name)
    with pytest.raises(ValueError, match=message):
        checker.check(event)
    v1 = TraceChecker(4, 8, 0, kv_manager=V1.name)
    with pytest.raises(ValueError, match="has no radix tree"):
        v1.check(event)


@pytest.mark.parametrize("eviction, policy", [("lfu", "dfs-weight"), ("slru", "lof")])
def test_other_policies_keep_the_reducer_equal_to_sglang(loaded, tiny_gpt2_dir, eviction, policy):
    engine = make_engine(loaded, tiny_gpt2_dir, num_gpu_blocks=13,
                         sglang_options={"page_size": 4, "radix_eviction_policy": eviction, "schedule_policy": policy})
    tokens, events = run_checked(engine, workload(3))
    assert any(isinstance(e, RadixNodeEvicted) for e in events) and all(len(t) == GREEDY.max_tokens for t in tokens)


def test_a_retraction_card_speaks_of_sglangs_retract_decode(loaded, tiny_gpt2_dir):
    """Issue 49: the preemption card of an sglang run that retracts names SGLang's retract_decode,
    is labelled SGLang's, and says SGLang retracts (never vLLM's words about its v1 design)."""
    from blockviz.model.guide import Guide
    from blockviz.model.view import card_record
    from blockviz.session.engine_session import trace_header

    prompts = [[7 + i] * 3 + list(range(40 + 9 * i, 48 + 9 * i)) for i in range(4)]
    engine = make_engine(loaded, tiny_gpt2_dir, num_gpu_blocks=26, sglang_options={"page_size": 4})
    _, events = run_checked(engine, prompts, SamplingParams(max_tokens=40))
    guide = Guide(SGLANG.name, header=trace_header(engine))
    guide.scan(events)
    guide.settle()
    card = next(c for c in guide.cards if c.idea == "recompute")
    preempted = next(e for e in events if isinstance(e, Preempted))
    assert card.title == "Retraction (preemption)" and f"request {preempted.request_id} was retracted" in card.what
    assert "SGLang retracts" in card.why and "vLLM" not in card.why
    assert card.upstream == "SGLang" and "retract_decode" in card.function
    assert card_record(card)["upstream"] == "SGLang"
    assert {c.upstream for c in guide.cards if c.idea in ("prefix-hit", "eviction", "chunked-prefill")} <= {"SGLang"}

"""The step plan from scheduler to runner (engine/scheduler_output.py): both schedulers hand the
model runner one SchedulerOutput, whose tables are the managers' own, and the runner computes from
the plan alone (no block manager), as vLLM's SchedulerOutput and nano-vllm's scheduler do."""

from __future__ import annotations

import inspect

import pytest

from engine.designs import V0, V1, get_design
import torch

from engine import LLM, SamplingParams
from engine.cache_engine import CacheEngine
from engine.model_runner import ModelRunner
from engine.scheduler_output import SchedulerOutput, plan_entry
from engine.sequence import Sequence, SequenceGroup

PROMPTS = ["To be, or not to be, that is the question:", "To be, or not to be, that is", "KV"]


def manager_table(engine, seq) -> tuple[int, ...]:
    manager = engine.kv_manager
    if engine.design is V1:
        return tuple(manager.get_block_ids(seq))
    return tuple(manager.get_block_table(seq))


def record_plans(engine) -> list[tuple[SchedulerOutput, list[tuple]]]:
    """Wrap the scheduler: each plan, with what the manager held for each scheduled sequence just
    then (its table, its length, and the tokens sampled but not yet appended: under async
    scheduling, vLLM's num_output_placeholders; v0 has none)."""
    plans = []
    schedule = engine.scheduler.schedule

    def recording():
        plan = schedule()
        plans.append((plan, [(manager_table(engine, s.seq), s.seq.get_len(),
                              getattr(s.seq, "num_output_placeholders", 0)) for s in plan.scheduled]))
        return plan

    engine.scheduler.schedule = recording
    return plans


@pytest.mark.parametrize("kv_manager", [V0.name, V1.name])
def test_each_plan_carries_the_managers_tables_and_the_tokens_to_compute(tiny_gpt2_dir, kv_manager):
    design = get_design(kv_manager)
    # few blocks and a small token budget: prefix hits, preemption, and (v1) prefill chunks
    llm = LLM(str(tiny_gpt2_dir), block_size=4, num_gpu_blocks=14, kv_manager=kv_manager,
              enable_prefix_caching=True, max_num_batched_tokens=16 if design.chunked_prefill else None)
    engine = llm.engine
    plans = record_plans(engine)
    steps = []
    engine.events.subscribe(lambda e: steps.append(e) if e.type == "step_started" else None)
    llm.generate(PROMPTS, SamplingParams(max_tokens=12, n=2 if design.fork else 1))
    scheduled = [(plan, held) for plan, held in plans if plan.scheduled]
    assert len(scheduled) == len(steps) > 5
    kinds = set()
    for (plan, held), step in zip(scheduled, steps):
        kinds.add(plan.kind)
        assert step.kind == plan.kind and step.num_tokens == plan.num_batched_tokens
        assert step.seq_ids == tuple(s.seq.seq_id for s in plan.scheduled)
        for s, (table, length, in_flight) in zip(plan.scheduled, held):
            assert len(s.block_ids) == 1 and s.block_ids[0] == table  # one KV-cache group: the manager's table
            assert s.num_new_tokens >= 1 and s.num_tokens <= length + in_flight
            assert len(table) * 4 >= s.num_tokens  # the table covers every token the step attends over
            if plan.kind == "decode":
                assert s.num_new_tokens == 1 and length <= s.num_tokens <= length + in_flight
                if not in_flight:
                    assert s.num_tokens == length
    assert {"prefill", "decode"} <= kinds
    if not design.chunked_prefill:  # whole prompts: what the prefix cache did not serve, at least one token
        prefills = [s for plan, _ in scheduled if plan.kind == "prefill" for s in plan.scheduled]
        assert all(s.num_tokens == s.seq.get_len() or s.seq.get_output_len() for s in prefills)
        assert any(s.num_computed_tokens > 0 for s in prefills)  # a prefix-cache hit skipped its blocks
    else:  # the budget of 16 cut a prompt into chunks that sample nothing
        assert any(not s.samples for plan, _ in scheduled for s in plan.scheduled)


def test_the_model_runner_takes_only_the_plan():
    params = inspect.signature(ModelRunner.__init__).parameters
    assert "block_manager" not in params and "kv_cache_manager" not in params
    assert list(inspect.signature(ModelRunner.execute_model).parameters) == ["self", "plan"]


def test_a_hand_made_plan_over_scattered_blocks_gives_transformers_logits(tiny_gpt2_dir):
    """No scheduler, no block manager: a plan naming blocks out of order is all the runner needs,
    and its logits are transformers' at every step (prefill, then decodes)."""
    from transformers import GPT2LMHeadModel

    llm = LLM(str(tiny_gpt2_dir), block_size=4, num_gpu_blocks=8, dtype="float32")
    loaded = llm.engine.loaded
    config = loaded.config
    cache = CacheEngine(config.num_layers, config.num_kv_heads, config.head_dim, 4, 8, 0, loaded.device,
                        loaded.dtype)
    runner = ModelRunner(loaded.model, cache, 4, loaded.device, "torch")
    hf = GPT2LMHeadModel.from_pretrained(tiny_gpt2_dir).to(loaded.device).eval()  # one device, float32
    tokens = [5, 17, 3, 99, 42, 7, 11]
    seq = Sequence(0, tokens, 4)
    group = SequenceGroup("r", [seq], SamplingParams())
    table = [6, 1, 4]  # scattered, not ascending
    with torch.no_grad():
        logits = runner.execute_model(SchedulerOutput([plan_entry(group, seq, 0, len(tokens), table[:2])], "prefill"))
        expected = hf(torch.tensor([tokens], device=loaded.device)).logits[0, -1]
        torch.testing.assert_close(logits[0], expected, rtol=1e-4, atol=1e-4)
        for token in (8, 250):
            seq.append_token_id(token)
            n = seq.get_len()
            blocks = table[: (n + 3) // 4]
            logits = runner.execute_model(SchedulerOutput([plan_entry(group, seq, n - 1, 1, blocks)], "decode"))
            expected = hf(torch.tensor([seq.get_token_ids()], device=loaded.device)).logits[0, -1]
            torch.testing.assert_close(logits[0], expected, rtol=1e-4, atol=1e-4)

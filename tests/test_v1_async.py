"""engine/v1 in vLLM 0.33's default order, async scheduling (engine/v1/scheduler.py; vLLM's
AsyncScheduler and EngineCore.step_with_batch_queue): on by default for kv_manager "v1", off with
`async_scheduling=False` (`--no-async-scheduling`, as vLLM's flag); v0 has no such order and
refuses it in one line. Both orders give transformers' greedy tokens; under async each running
request has its sampled token in flight between steps (an output placeholder), in the synchronous
order none. (Step-by-step parity with vLLM's own AsyncScheduler: tests/test_v1_vs_vllm_core.py.)"""

from __future__ import annotations

import pytest

from blockviz.cli import build_parser, main
from blockviz.commands.run import check
from engine import LLMEngine, EngineConfig, SamplingParams
from engine.designs import V0, V1
from tests.test_engine_parity import PROMPTS
from tests.test_engine_v1 import assert_parity, run_checked, v1_engine
from tests.test_engine_v1 import hf, loaded  # noqa: F401 (fixtures)


def test_v1_schedules_asynchronously_by_default_and_v0_cannot():
    assert EngineConfig(kv_manager=V1.name).async_scheduling is True
    assert EngineConfig(kv_manager=V1.name, async_scheduling=False).async_scheduling is False
    assert EngineConfig(kv_manager=V0.name).async_scheduling is False
    with pytest.raises(ValueError, match="schedules synchronously"):
        EngineConfig(kv_manager=V0.name, async_scheduling=True)
    with pytest.raises(ValueError, match="True, False or None"):
        EngineConfig(kv_manager=V1.name, async_scheduling="no")


def test_the_command_line_turns_the_order_off_as_vllms_flag_does(capsys):
    for argv, expected in ((["run", "--kv-manager", "v1"], True),
                           (["run", "--kv-manager", "v1", "--no-async-scheduling"], False),
                           (["run"], False)):
        assert check(build_parser().parse_args(argv), device=False).config.async_scheduling is expected, argv
    assert main(["run", "--kv-manager", "v0", "--async-scheduling"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "--async-scheduling is for v1" in err and "Traceback" not in err


@pytest.mark.parametrize("asynchronous", [True, False])
def test_both_orders_give_transformers_tokens_and_only_async_keeps_a_token_in_flight(hf, loaded, tiny_gpt2_dir,
                                                                                     asynchronous):
    """A pool small enough to preempt by recompute (a preempted request's token in flight comes back
    stale under async); after each step, under async, every running request whose last step sampled
    holds one output placeholder and that step's token in flight."""
    engine = v1_engine(loaded, tiny_gpt2_dir, block_size=2, num_gpu_blocks=40, async_scheduling=asynchronous)
    assert engine.async_scheduling is asynchronous and engine.scheduler.async_scheduling is asynchronous
    placeholders: list[int] = []
    original = engine.step

    def step():
        outputs = original()
        placeholders.extend(seq.num_output_placeholders for seq in engine.scheduler.running)
        return outputs

    engine.step = step
    outputs, events = run_checked(engine, PROMPTS, SamplingParams(max_tokens=24, ignore_eos=True))
    assert_parity(hf, engine, outputs, PROMPTS, 24)
    assert any(e.type == "preempted" for e in events)
    assert placeholders and set(placeholders) == ({1} if asynchronous else {0})


def test_a_stopped_request_frees_its_blocks_a_step_later_under_async(loaded, tiny_gpt2_dir):
    """vLLM's order: the step after a request's last token is scheduled before that token is
    processed, so the request is scheduled once more (a slot for the token it will never take) and
    its blocks go back in that step, not in the step that sampled it."""
    freed_at = {}
    for asynchronous in (True, False):
        engine = v1_engine(loaded, tiny_gpt2_dir, block_size=4, num_gpu_blocks=64, async_scheduling=asynchronous)
        finished_steps = []
        engine.events.subscribe(lambda e: finished_steps.append(e.step) if e.type == "step_finished" else None)
        engine.events.subscribe(lambda e: freed_at.setdefault(asynchronous, len(finished_steps))
                                if e.type == "sequence_freed" else None)
        engine.add_request(PROMPTS[0], SamplingParams(max_tokens=3, ignore_eos=True))
        engine.add_request(PROMPTS[1], SamplingParams(max_tokens=8, ignore_eos=True))
        while engine.has_unfinished_requests():
            engine.step()
    assert freed_at[False] == 2 and freed_at[True] == 3, freed_at  # during the third step, or after it


@pytest.mark.parametrize(("args", "order", "vllm_options"), [
    ([], True, None),
    (["--no-async-scheduling"], False, None),
    (["--kv-manager", "vllm"], None, None),  # vLLM resolves it (on, unless a CPU tier rules it out)
    (["--kv-manager", "vllm", "--no-async-scheduling"], False, {"async_scheduling": False}),
    (["--kv-manager", "vllm", "--vllm-option", "async_scheduling=false"], False, {"async_scheduling": False}),
])
def test_under_vllm_the_flag_and_vllms_option_are_one_setting(args, order, vllm_options):
    import importlib.util

    from blockviz.session.spec import EngineSpec

    if "vllm" in args and importlib.util.find_spec("vllm") is None:
        pytest.skip("vLLM is not installed")
    spec = EngineSpec.from_args(build_parser().parse_args(["generate", "--kv-manager", "v1", *args]))
    assert spec.config.async_scheduling is order and spec.config.vllm_options == vllm_options

"""Engine correctness: prefix sharing within one step (as vLLM v0 and nano-vllm), no request can hang
the engine, a failed generate() leaves nothing behind, SamplingParams refuse bad values, and a
sequence finishes once. Parity with transformers is checked token for token."""

from __future__ import annotations

import math
import subprocess
import sys
import textwrap

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from blockviz.model.trace_check import TraceChecker
from engine import LLM, SamplingParams, check_invariants
from reducer_checks import check_reducer_matches
from blockviz.model.reducer import ReducerState
from test_engine_parity import assert_parity, hf, make_llm, run_checked  # noqa: F401  (hf is a fixture)

SHARED = [(7 * i + 11) % 300 + 1 for i in range(40)]  # a 40-token opening in common


def shared_prompts(count: int) -> list[dict]:
    return [{"prompt_token_ids": SHARED + [(31 * r + j) % 300 + 1 for j in range(3 + r % 4)]}
            for r in range(count)]


def seqs_of_requests(events) -> list[int]:
    return [e.seq_ids[0] for e in events if e.type == "request_added"]


@pytest.mark.parametrize("num_prompts", [2, 3, 8])
@pytest.mark.parametrize("block_size", [1, 4, 16])
def test_prompts_sharing_an_opening_in_one_call_share_blocks_and_keep_parity(hf, tiny_gpt2_dir, num_prompts,
                                                                             block_size):
    prompts = shared_prompts(num_prompts)
    llm = make_llm(str(tiny_gpt2_dir), block_size=block_size, num_gpu_blocks=512, enable_prefix_caching=True)
    outputs, events = run_checked(llm, prompts, SamplingParams(max_tokens=8, ignore_eos=True))
    num_shared = len(SHARED) // block_size  # full blocks inside the common opening
    hits = {(e.seq_ids[0], e.logical_index) for e in events if e.type == "prefix_cache_hit"}
    first, *others = seqs_of_requests(events)
    assert not {index for seq, index in hits if seq == first}
    for seq in others:
        assert {index for s, index in hits if s == seq} == set(range(num_shared)), f"seq {seq}"
    # all in the first prefill step: the shared blocks had no K/V yet when the others hit them
    first_step = next(i for i, e in enumerate(events) if e.type == "step_started")
    assert all(e.seq_no < events[first_step].seq_no for e in events if e.type == "prefix_cache_hit")
    assert events[first_step].seq_ids == tuple(seqs_of_requests(events))
    # computation actually skipped: each later request computed only its tokens past the hits
    prompt_lens = [len(p["prompt_token_ids"]) for p in prompts]
    assert events[first_step].num_tokens == prompt_lens[0] + sum(n - num_shared * block_size for n in prompt_lens[1:])
    for output in outputs[1:]:
        assert output.num_cached_tokens == num_shared * block_size
    assert_parity(hf, llm, outputs, prompts, 8)


@pytest.mark.parametrize(("block_size", "num_gpu_blocks", "mode"), [
    (4, 40, "swap"), (4, 40, "recompute"), (1, 130, "swap"), (16, 9, "recompute"),
])
def test_shared_opening_keeps_parity_under_preemption_on_a_tiny_pool(hf, tiny_gpt2_dir, block_size,
                                                                     num_gpu_blocks, mode):
    prompts = shared_prompts(8)
    llm = make_llm(str(tiny_gpt2_dir), block_size=block_size, num_gpu_blocks=num_gpu_blocks, num_cpu_blocks=256,
                   enable_prefix_caching=True, preemption_mode=mode, watermark=0.0)
    outputs, events = run_checked(llm, prompts, SamplingParams(max_tokens=20, ignore_eos=True))
    assert any(e.type == "preempted" and e.mode == mode for e in events)
    assert any(e.type == "prefix_cache_hit" for e in events)
    assert all(len(c.token_ids) == 20 for o in outputs for c in o.outputs)
    assert_parity(hf, llm, outputs, prompts, 20)


# ---------------------------------------------------------------- no hang, ever

def _run_python(code: str, timeout: float = 90) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True,
                          timeout=timeout)


def test_a_request_that_can_never_swap_back_in_ends_with_its_reason():
    # 20 prompt tokens + 30 to generate need 4 blocks of 16; the device pool has 2.
    result = _run_python("""
        from engine import LLM, SamplingParams
        llm = LLM("tiny-shakespeare", block_size=16, num_gpu_blocks=2, num_cpu_blocks=4, preemption_mode="swap")
        (out,) = llm.generate([{"prompt_token_ids": list(range(1, 21))}], SamplingParams(max_tokens=30, ignore_eos=True))
        c = out.outputs[0]
        m = llm.engine.kv_manager
        print(c.finish_reason, "|", c.finish_detail, "|", len(c.token_ids), m.get_num_free_gpu_blocks(), m.get_num_free_cpu_blocks())
    """)
    assert result.returncode == 0, result.stderr
    reason, detail, rest = result.stdout.strip().split(" | ")
    assert reason == "ignored" and "swap back in" in detail
    num_tokens, free_gpu, free_cpu = map(int, rest.split())
    assert 0 < num_tokens < 30 and (free_gpu, free_cpu) == (2, 4)


HANG_OPTIONS = ["--prompt", "ROMEO:", "--prompt", "JULIET: O Romeo", "--prompt", "ROMEO: hi", "--n", "2",
                "--block-size", "4", "--num-gpu-blocks", "16", "--num-cpu-blocks", "32", "--max-tokens", "30"]


def _blockviz(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "blockviz", *args], capture_output=True, text=True, timeout=120)


def test_generate_that_used_to_hang_ends_and_says_why():
    result = _blockviz("generate", *HANG_OPTIONS, "--json")
    assert result.returncode == 0, result.stderr
    import json

    doc = json.loads(result.stdout)
    completions = [c for r in doc["requests"] for c in r["completions"]]
    assert len(completions) == 6
    ignored = [c for c in completions if c["finish_reason"] == "ignored"]
    assert ignored and all("swap back in" in c["finish_detail"] for c in ignored)
    assert doc["summary"]["gpu_blocks"]["used"] == 0 and doc["summary"]["cpu_blocks"]["used"] == 0


def test_record_that_used_to_stop_at_its_step_cap_writes_a_finished_trace(tmp_path):
    from blockviz.model.trace import read_trace

    out = tmp_path / "run.jsonl"
    result = _blockviz("record", "--out", str(out), *HANG_OPTIONS)
    assert result.returncode == 0, result.stderr
    trace = read_trace(out)
    state = ReducerState(trace.block_size, trace.num_gpu_blocks, trace.num_cpu_blocks).apply_all(trace.events)
    finished = {e.seq_id for e in trace.events if e.type == "sequence_finished"}
    assert finished == set(state.seqs) and len(finished) == 6
    assert state.num_used("gpu") == 0 and state.num_used("cpu") == 0


def test_n_above_max_num_seqs_is_refused_in_one_line():
    result = _blockviz("generate", "--prompt", "ROMEO:", "--n", "65", "--max-tokens", "2")
    assert result.returncode == 2
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and "--max-num-seqs" in lines[0] and "Traceback" not in result.stderr


@pytest.mark.parametrize("command", ["generate", "record"])
def test_n_above_max_num_seqs_is_refused_before_torch_is_imported(tmp_path, command):
    extra = ["--out", str(tmp_path / "t.jsonl")] if command == "record" else []
    code = ("import sys; from blockviz.cli import main; code = main(sys.argv[1:]); "
            "print(sorted(m for m in ('torch', 'transformers') if m in sys.modules)); sys.exit(code)")
    result = subprocess.run([sys.executable, "-c", code, command, *extra, "--prompt", "ROMEO:", "--n", "65",
                             "--max-tokens", "2"], capture_output=True, text=True, timeout=120,
                            stdin=subprocess.DEVNULL)
    lines = result.stderr.strip().splitlines()
    assert result.returncode == 2 and len(lines) == 1 and "n=65" in lines[0] and "--max-num-seqs is 64" in lines[0], \
        result.stderr
    assert result.stdout.strip() == "[]"  # the model never started loading
    assert not (tmp_path / "t.jsonl").exists()


def test_record_refuses_an_unfinished_run_and_leaves_no_file(tiny_gpt2_dir, tmp_path):
    from blockviz.commands.record import record_trace
    from blockviz.session.spec import EngineSpec

    spec = EngineSpec.of(model=str(tiny_gpt2_dir), prompts=("To be",), max_tokens=20, block_size=4, num_gpu_blocks=16)
    out = tmp_path / "cut.jsonl"
    with pytest.raises(RuntimeError, match="not finished after 3 steps"):
        record_trace(spec, out, max_steps=3)
    assert list(tmp_path.iterdir()) == []


def test_nothing_can_run_with_an_empty_pool_is_reported_not_looped_on(tiny_gpt2_dir):
    """A 1-token and a 14-token prompt fill a 10-block pool (block size 2); the second is swapped
    out holding 8 blocks. Once the first finishes every block is free, but swapping back in needs
    8 + 1 blocks and the watermark keeps 2 of 10: it could wait forever, so it ends with the reason."""
    llm = LLM(str(tiny_gpt2_dir), block_size=2, num_gpu_blocks=10, num_cpu_blocks=32, watermark=0.2,
              preemption_mode="swap")
    outputs, events = run_checked(llm, [{"prompt_token_ids": [5]}, {"prompt_token_ids": list(range(50, 64))}],
                                  SamplingParams(max_tokens=6, ignore_eos=True))
    first, second = (o.outputs[0] for o in outputs)
    assert first.finish_reason == "length" and len(first.token_ids) == 6
    assert second.finish_reason == "ignored"
    assert second.finish_detail == ("cannot swap back in: needs 9 free blocks with the watermark of 2 kept, "
                                    "and the pool has 10")
    assert any(e.type == "swap_out" for e in events)


# ---------------------------------------------------------------- atomic generate()

def test_generate_checks_every_prompt_before_queueing_any(tiny_gpt2_dir):
    llm = LLM(str(tiny_gpt2_dir), block_size=4, num_gpu_blocks=32)
    events = []
    llm.events.subscribe(events.append)
    with pytest.raises(ValueError, match="empty"):
        llm.generate(["To be", "The quick", ""], SamplingParams(max_tokens=2))
    assert events == [] and not llm.engine.has_unfinished_requests()
    (output,) = llm.generate(["KV"], SamplingParams(max_tokens=2))
    assert {e.request_id for e in events if e.type == "request_added"} == {output.request_id}


def test_a_failing_step_aborts_the_requests_and_frees_their_blocks(tiny_gpt2_dir):
    llm = LLM(str(tiny_gpt2_dir), block_size=4, num_gpu_blocks=32)
    engine = llm.engine
    reducer = ReducerState(4, 32, engine.budget.num_cpu_blocks)
    events = []
    engine.events.subscribe(reducer.apply)
    engine.events.subscribe(events.append)
    real_run_model = engine.model_runner.execute_model
    calls = []

    def failing(plan):
        calls.append(plan.kind)
        if len(calls) == 3:
            raise RuntimeError("boom in the forward")
        return real_run_model(plan)

    engine.model_runner.execute_model = failing
    with pytest.raises(RuntimeError, match="boom"):
        llm.generate(["To be, or not", "The quick"], SamplingParams(max_tokens=8, n=2))
    manager = engine.kv_manager
    assert manager.block_tables == {} and manager.get_num_free_gpu_blocks() == 32
    assert not engine.has_unfinished_requests()
    check_invariants(manager)
    check_reducer_matches(reducer, manager)
    aborted = [e for e in events if e.type == "sequence_finished"]
    assert len(aborted) == 4 and {e.reason for e in aborted} == {"abort"}
    # the engine works again, with nothing left over from the failed call
    engine.model_runner.execute_model = real_run_model
    events.clear()
    (output,) = llm.generate(["KV"], SamplingParams(max_tokens=3))
    assert len(output.outputs[0].token_ids) == 3
    assert len([e for e in events if e.type == "request_added"]) == 1


# ---------------------------------------------------------------- SamplingParams

@pytest.mark.parametrize(("field", "value"), [
    ("temperature", math.nan), ("temperature", math.inf), ("temperature", -1.0), ("temperature", "0.5"),
    ("top_k", 2.5), ("top_k", True), ("max_tokens", True), ("max_tokens", 3.0), ("n", 2.0), ("n", "2"),
    ("seed", 1.5), ("top_p", math.nan), ("top_p", 0.0), ("stop_token_ids", (1.5,)),
])
def test_sampling_params_reject_bad_values_naming_the_field(field, value):
    with pytest.raises(ValueError, match=field):
        SamplingParams(**{field: value})


def test_tiny_temperature_is_greedy_and_samples_without_crashing(tiny_gpt2_dir):
    params = SamplingParams(temperature=1e-40, max_tokens=5, ignore_eos=True)
    assert params.greedy and params.temperature == 0.0
    llm = LLM(str(tiny_gpt2_dir), block_size=4, num_gpu_blocks=32)
    greedy = llm.generate(["To be"], SamplingParams(max_tokens=5, ignore_eos=True))
    tiny = llm.generate(["To be"], params)
    assert tiny[0].outputs[0].token_ids == greedy[0].outputs[0].token_ids


# ---------------------------------------------------------------- a sequence finishes once

def test_a_finished_branch_keeps_its_reason_when_its_request_is_later_ignored(tiny_gpt2_dir):
    """n=2, recompute on a tiny pool: one branch stops on its stop token, the other is preempted and
    can never be readmitted; the stopped one keeps "stop" and is reported finished once."""
    llm = LLM(str(tiny_gpt2_dir), block_size=2, num_gpu_blocks=6, num_cpu_blocks=0, watermark=0.0,
              preemption_mode="recompute")
    events = []
    llm.events.subscribe(events.append)
    probe = llm.generate(["To be"], SamplingParams(n=2, temperature=1.0, seed=3, max_tokens=12, ignore_eos=True))
    tokens = [c.token_ids for c in probe[0].outputs]
    # stop the branch whose first token differs from the other's
    stop = next(a[0] for a, b in zip(tokens, tokens[1:]) if a[0] != b[0])
    events.clear()
    (output,) = llm.generate(["To be"], SamplingParams(n=2, temperature=1.0, seed=3, max_tokens=12,
                                                       ignore_eos=True, stop_token_ids=(stop,)))
    reasons = sorted(c.finish_reason for c in output.outputs)
    finished = [e.seq_id for e in events if e.type == "sequence_finished"]
    assert len(finished) == len(set(finished)) == 2
    assert "stop" in reasons and reasons != ["stop", "stop"]


# ---------------------------------------------------------------- random configurations

@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture,
                                                                 HealthCheck.too_slow])
@given(
    block_size=st.sampled_from([1, 2, 4, 8]),
    num_gpu_blocks=st.integers(1, 40),
    num_cpu_blocks=st.integers(0, 24),
    n=st.integers(1, 3),
    max_num_seqs=st.integers(1, 6),
    mode=st.sampled_from([None, "swap", "recompute"]),
    prefix_caching=st.booleans(),
    watermark=st.sampled_from([0.0, 0.01, 0.2]),
    prompt_lens=st.lists(st.integers(1, 24), min_size=1, max_size=4),
    shared=st.integers(0, 12),
    max_tokens=st.integers(1, 12),
)
def test_every_generate_terminates_and_frees_everything(tiny_llm_cache, block_size, num_gpu_blocks,
                                                        num_cpu_blocks, n, max_num_seqs, mode, prefix_caching,
                                                        watermark, prompt_lens, shared, max_tokens):
    llm = tiny_llm_cache(block_size=block_size, num_gpu_blocks=num_gpu_blocks, num_cpu_blocks=num_cpu_blocks,
                         max_num_seqs=max_num_seqs, preemption_mode=mode, enable_prefix_caching=prefix_caching,
                         watermark=watermark)
    prompts = [{"prompt_token_ids": SHARED[:shared] + [(13 * i + 5 * j) % 300 + 1 for j in range(length)]}
               for i, length in enumerate(prompt_lens)]
    params = SamplingParams(n=n, max_tokens=max_tokens, ignore_eos=True)
    if n > max_num_seqs:
        with pytest.raises(ValueError, match="max_num_seqs"):
            llm.generate(prompts, params)
        return
    engine = llm.engine
    steps = 0

    def on_step(engine):
        nonlocal steps
        steps += 1
        assert steps < 2_000, "generate() does not terminate"
        check_invariants(engine.kv_manager)

    events = []
    unsubscribe = engine.events.subscribe(events.append)
    try:
        outputs = llm.generate(prompts, params, on_step=on_step)
    finally:
        unsubscribe()
    manager = engine.kv_manager
    assert manager.block_tables == {}
    assert manager.get_num_free_gpu_blocks() == manager.num_total_gpu_blocks
    assert manager.get_num_free_cpu_blocks() == manager.num_total_cpu_blocks
    finished = [e.seq_id for e in events if e.type == "sequence_finished"]
    assert len(finished) == len(set(finished))
    checker = TraceChecker(block_size, num_gpu_blocks, num_cpu_blocks)  # what a trace reader checks
    for event in events:
        checker.check(event)
    for output in outputs:
        assert output.finished
        for c in output.outputs:
            assert c.finish_reason in ("length", "ignored") and c.finish_detail
            if c.finish_reason == "length":
                assert len(c.token_ids) == max_tokens


@pytest.fixture(scope="module")
def tiny_llm_cache(tiny_gpt2_dir):
    """LLMs over the tiny checkpoint, the model loaded once and shared by every configuration."""
    from engine.llm_engine import EngineConfig, LLMEngine
    from engine.model_loader import load_model

    loaded = load_model(str(tiny_gpt2_dir), "cpu", None)

    def make(**options) -> LLM:
        return LLM.from_engine(LLMEngine(EngineConfig(model=str(tiny_gpt2_dir), **options), loaded=loaded))

    return make


def test_user_driven_fork_swap_out_and_abort_make_a_trace_that_passes_the_checks(tiny_llm_cache):
    """What the TUI's keys do (fork, swap out, abort) between steps, checked as a trace reader would."""
    llm = tiny_llm_cache(block_size=2, num_gpu_blocks=40, num_cpu_blocks=40, enable_prefix_caching=True)
    engine = llm.engine
    events = []
    engine.events.subscribe(events.append)
    params = SamplingParams(max_tokens=12, ignore_eos=True)
    first = engine.add_request({"prompt_token_ids": SHARED[:9]}, params)
    second = engine.add_request({"prompt_token_ids": SHARED[:7]}, params)
    second_seq = [e.seq_ids[0] for e in events if e.type == "request_added"][1]
    engine.step()  # prefill: the last of its 4 blocks holds one token
    engine.fork(second_seq)
    engine.step()  # both branches write into the shared last block: copy-on-write
    engine.preempt(second)
    engine.step()
    engine.abort_request(first)
    while engine.has_unfinished_requests():
        engine.step()
    kinds = {e.type for e in events}
    assert {"fork", "swap_out", "swap_in", "copy_on_write", "prefix_cache_hit"} <= kinds
    checker = TraceChecker(2, 40, 40)
    for event in events:
        checker.check(event)
    assert checker.state.num_used("gpu") == 0

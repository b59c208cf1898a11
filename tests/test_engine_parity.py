"""The paged engine against Hugging Face transformers, token for token, on tiny GPT-2 checkpoints the
tests build themselves; plus preemption, forks, prefix caching and real data movement.

Engine and reference run on one device, CUDA when there is one (the tests are then marked `cuda`:
swap goes through the pinned CPU pool there), in float32: CUDA's default float16 rounds apart
from the float32 reference."""

from __future__ import annotations

import pytest
import torch

from engine import LLM, SamplingParams, check_invariants
from blockviz.model.reducer import ReducerState

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
pytestmark = [pytest.mark.cuda] if DEVICE == "cuda" else []
PROMPTS = [
    "To be, or not to be, that is the question:",
    "The quick brown fox",
    "All the world's a stage, and all the men and women merely players. Paged attention",
    "KV",
]


@pytest.fixture(scope="module")
def hf(tiny_gpt2_dir):
    from transformers import AutoTokenizer, GPT2LMHeadModel

    return GPT2LMHeadModel.from_pretrained(tiny_gpt2_dir).to(DEVICE).eval(), AutoTokenizer.from_pretrained(tiny_gpt2_dir)


def make_llm(model: str, **options) -> LLM:
    """An LLM on DEVICE in float32, the reference's device and dtype."""
    return LLM(model, device=DEVICE, dtype="float32", **options)


def hf_greedy(hf, prompt_ids: list[int], max_tokens: int) -> list[int]:
    model, _ = hf
    ids = torch.tensor([prompt_ids], device=model.device)
    with torch.no_grad():
        out = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=max_tokens,
                             min_new_tokens=max_tokens, do_sample=False, pad_token_id=0)
    return out[0, len(prompt_ids):].tolist()


def run_checked(llm: LLM, prompts, params):
    """generate() with check_invariants after every step and a reducer fed from the events."""
    engine = llm.engine
    reducer = ReducerState(engine.config.block_size, engine.budget.num_gpu_blocks, engine.budget.num_cpu_blocks)
    events = []
    engine.events.subscribe(reducer.apply)
    engine.events.subscribe(events.append)
    outputs = llm.generate(prompts, params, on_step=lambda e: check_invariants(e.kv_manager))
    manager = engine.kv_manager
    assert manager.block_tables == {}
    assert manager.get_num_free_gpu_blocks() == manager.num_total_gpu_blocks
    assert manager.get_num_free_cpu_blocks() == manager.num_total_cpu_blocks
    assert reducer.num_free("gpu") == manager.num_total_gpu_blocks
    return outputs, events


def assert_parity(hf, llm: LLM, outputs, prompts, max_tokens: int) -> None:
    for prompt, output in zip(prompts, outputs):
        ids = llm.engine.encode(prompt) if isinstance(prompt, str) else prompt["prompt_token_ids"]
        expected = hf_greedy(hf, ids, max_tokens)
        for completion in output.outputs:
            assert completion.token_ids == expected, f"prompt {prompt!r}"


def test_tiny_model_output_depends_on_context(hf, tiny_gpt2_dir):
    llm = make_llm(str(tiny_gpt2_dir), block_size=4, num_gpu_blocks=64)
    outputs = llm.generate(PROMPTS[:2], SamplingParams(max_tokens=12, ignore_eos=True))
    first, second = (o.outputs[0].token_ids for o in outputs)
    assert first != second and len(set(first)) > 2  # a broken cache could not hide behind one repeated token


@pytest.mark.parametrize("block_size", [1, 3, 16])
def test_greedy_batch_matches_transformers(hf, tiny_gpt2_dir, block_size):
    llm = make_llm(str(tiny_gpt2_dir), block_size=block_size, num_gpu_blocks=512 // block_size + 64)
    outputs, events = run_checked(llm, PROMPTS, SamplingParams(max_tokens=16, ignore_eos=True))
    assert_parity(hf, llm, outputs, PROMPTS, 16)
    assert [o.request_id for o in outputs] == ["0", "1", "2", "3"]
    assert all(o.finished and o.outputs[0].finish_reason == "length" for o in outputs)
    assert any(e.type == "step_started" and e.kind == "prefill" and len(e.seq_ids) == 4 for e in events)


def test_token_id_prompts_and_text(hf, tiny_gpt2_dir):
    llm = make_llm(str(tiny_gpt2_dir), block_size=4, num_gpu_blocks=64)
    ids = llm.engine.encode(PROMPTS[1])
    (output,) = llm.generate({"prompt_token_ids": ids}, SamplingParams(max_tokens=8, ignore_eos=True))
    assert output.outputs[0].token_ids == hf_greedy(hf, ids, 8)
    assert output.outputs[0].text == hf[1].decode(output.outputs[0].token_ids)


def test_prefix_caching_hits_and_keeps_parity(hf, tiny_gpt2_dir):
    block_size = 4
    shared = "To be, or not to be, that is the question: whether"
    prompts = [shared + " tis nobler", shared + " the quick"]
    llm = make_llm(str(tiny_gpt2_dir), block_size=block_size, num_gpu_blocks=64, enable_prefix_caching=True)
    first, _ = run_checked(llm, prompts[:1], SamplingParams(max_tokens=10, ignore_eos=True))
    second, events = run_checked(llm, prompts[1:], SamplingParams(max_tokens=10, ignore_eos=True))
    hits = [e for e in events if e.type == "prefix_cache_hit"]
    assert len(hits) >= 2
    assert second[0].num_cached_tokens == len(hits) * block_size
    step = next(e for e in events if e.type == "step_started")
    assert step.num_tokens == len(llm.engine.encode(prompts[1])) - len(hits) * block_size
    assert_parity(hf, llm, first + second, prompts, 10)


@pytest.mark.parametrize("mode", ["swap", "recompute"])
def test_preemption_keeps_parity(hf, tiny_gpt2_dir, mode):
    block_size = 4
    llm = make_llm(str(tiny_gpt2_dir), block_size=block_size, num_gpu_blocks=24, num_cpu_blocks=32,
                   preemption_mode=mode, watermark=0.0)
    outputs, events = run_checked(llm, PROMPTS, SamplingParams(max_tokens=24, ignore_eos=True))
    preempted = [e for e in events if e.type == "preempted"]
    assert preempted and all(e.mode == mode for e in preempted)
    if mode == "swap":
        assert any(e.type == "swap_out" for e in events) and any(e.type == "swap_in" for e in events)
    else:
        assert sum(e.num_tokens_lost for e in preempted) > 0
    assert_parity(hf, llm, outputs, PROMPTS, 24)


def test_default_preemption_recomputes_a_lone_sequence(hf, tiny_gpt2_dir):
    llm = make_llm(str(tiny_gpt2_dir), block_size=4, num_gpu_blocks=20, num_cpu_blocks=32, watermark=0.0)
    outputs, events = run_checked(llm, PROMPTS[:3], SamplingParams(max_tokens=24, ignore_eos=True))
    preempted = [e for e in events if e.type == "preempted"]
    assert preempted and {e.mode for e in preempted} == {"recompute"}
    assert_parity(hf, llm, outputs, PROMPTS[:3], 24)


def test_lone_sequence_that_cannot_grow_preempts_itself_without_crashing(tiny_gpt2_dir):
    llm = make_llm(str(tiny_gpt2_dir), block_size=2, num_gpu_blocks=4, num_cpu_blocks=0, watermark=0.0)
    (output,) = llm.generate(["To be"], SamplingParams(max_tokens=30, ignore_eos=True))
    # 4 blocks x 2 slots: the request is preempted, readmitted, and can never fit; it ends with a reason.
    assert output.finished and output.outputs[0].finish_reason in ("ignored", "length")
    assert llm.engine.kv_manager.get_num_free_gpu_blocks() == 4


def test_n2_branches_each_equal_a_single_sequence_run(hf, tiny_gpt2_dir):
    model, tokenizer = hf
    llm = make_llm(str(tiny_gpt2_dir), block_size=4, num_gpu_blocks=64)
    engine = llm.engine
    logits_by_seq: dict[int, list[torch.Tensor]] = {}
    step_seqs: list[tuple[int, ...]] = []
    engine.events.subscribe(lambda e: step_seqs.append(e.seq_ids) if e.type == "step_started" else None)
    original = engine.model.compute_logits

    def recording(hidden):
        logits = original(hidden)
        for seq_id, row in zip(step_seqs[-1], logits):
            logits_by_seq.setdefault(seq_id, []).append(row.clone())
        return logits

    engine.model.compute_logits = recording
    prompt = PROMPTS[0]
    params = SamplingParams(n=2, temperature=1.5, max_tokens=12, ignore_eos=True, seed=7)
    (output,) = run_checked(llm, [prompt], params)[0]
    branches = [c.token_ids for c in output.outputs]
    assert len(branches) == 2 and branches[0] != branches[1]
    prompt_ids = engine.encode(prompt)
    parent_id = min(logits_by_seq)
    for seq_id, tokens in zip(sorted(logits_by_seq), branches):
        ids = torch.tensor([prompt_ids + tokens], device=DEVICE)
        with torch.no_grad():
            expected = model(ids).logits[0, len(prompt_ids) - 1 : -1]  # (num_tokens, vocab)
        rows = logits_by_seq[seq_id]
        if seq_id != parent_id:
            rows = logits_by_seq[parent_id][:1] + rows  # the child was forked from the prefill's logits
        got = torch.stack(rows)
        assert torch.allclose(got, expected, atol=1e-4), f"branch {seq_id}"


def test_n2_greedy_branches_match_transformers_and_copy_on_write_happens(hf, tiny_gpt2_dir):
    llm = make_llm(str(tiny_gpt2_dir), block_size=4, num_gpu_blocks=64)
    prompt = "To be, or not"  # 5 tokens or so: the last prompt block is partial and shared
    outputs, events = run_checked(llm, [prompt], SamplingParams(n=2, max_tokens=10, ignore_eos=True))
    assert any(e.type == "fork" for e in events) and any(e.type == "copy_on_write" for e in events)
    assert_parity(hf, llm, outputs, [prompt], 10)


def test_copy_on_write_and_swap_move_real_data(tiny_gpt2_dir):
    llm = make_llm(str(tiny_gpt2_dir), block_size=4, num_gpu_blocks=40, num_cpu_blocks=40,
                   preemption_mode="swap", watermark=0.0)
    cache = llm.engine.cache_engine
    checked = {"copy": 0, "swap_out": 0, "swap_in": 0}

    def wrap(name, src_pool, dst_pool):
        original = getattr(cache, name)

        def moved(pairs):
            original(pairs)
            for src, dst in pairs:
                for (sk, sv), (dk, dv) in zip(src_pool(), dst_pool()):
                    assert torch.equal(sk[src].cpu(), dk[dst].cpu()) and torch.equal(sv[src].cpu(), dv[dst].cpu())
                    assert sk[src].abs().sum() > 0  # real K/V, not an empty block
                checked[name] += 1

        setattr(cache, name, moved)

    wrap("copy", lambda: cache.gpu_cache, lambda: cache.gpu_cache)
    wrap("swap_out", lambda: cache.gpu_cache, lambda: cache.cpu_cache)
    wrap("swap_in", lambda: cache.cpu_cache, lambda: cache.gpu_cache)
    params = SamplingParams(n=2, temperature=1.0, max_tokens=30, ignore_eos=True, seed=1)
    run_checked(llm, PROMPTS, params)
    assert checked["copy"] > 0 and checked["swap_out"] > 0 and checked["swap_in"] > 0


# ---------------------------------------------------------------- bad input


def test_bad_requests_are_clear_errors(tiny_gpt2_dir):
    llm = make_llm(str(tiny_gpt2_dir), block_size=4, num_gpu_blocks=64)
    with pytest.raises(ValueError, match="empty"):
        llm.generate([""], SamplingParams())
    with pytest.raises(ValueError, match="context"):
        llm.generate([{"prompt_token_ids": [5] * 200}], SamplingParams())
    with pytest.raises(ValueError, match="max_tokens"):
        SamplingParams(max_tokens=0)
    with pytest.raises(ValueError, match="n must"):
        SamplingParams(n=0)
    with pytest.raises(ValueError, match="temperature"):
        SamplingParams(temperature=-0.5)
    assert not llm.engine.has_unfinished_requests()


def test_prompt_bigger_than_the_pool_finishes_with_a_reason_and_others_complete(hf, tiny_gpt2_dir):
    llm = make_llm(str(tiny_gpt2_dir), block_size=4, num_gpu_blocks=8, watermark=0.0)
    big = {"prompt_token_ids": list(range(1, 60))}  # 15 blocks > 8
    outputs, events = run_checked(llm, [PROMPTS[1], big, PROMPTS[3]], SamplingParams(max_tokens=6, ignore_eos=True))
    assert outputs[1].outputs[0].finish_reason == "ignored"
    assert "blocks" in outputs[1].outputs[0].finish_detail
    assert outputs[1].outputs[0].token_ids == []
    assert_parity(hf, llm, [outputs[0], outputs[2]], [PROMPTS[1], PROMPTS[3]], 6)


def test_shipped_model_matches_transformers_and_decodes_token_text():
    """Issue 5: the bundled tiny-shakespeare checkpoint through the same parity check, and its token
    pieces (BPE space markers decoded) joining up to the completion text (the prompt's pieces, which
    the engine session decodes: tests/test_engine_session.py)."""
    from transformers import AutoTokenizer, GPT2LMHeadModel

    from engine.model_loader import resolve_model

    path = resolve_model("tiny-shakespeare")
    hf = GPT2LMHeadModel.from_pretrained(path).to(DEVICE).eval(), AutoTokenizer.from_pretrained(path)
    llm = make_llm("tiny-shakespeare", block_size=16, num_gpu_blocks=64)
    prompts = ["ROMEO:", "JULIET:\nO Romeo, Romeo, wherefore art thou", "First Citizen:\nBefore we proceed"]
    outputs, events = run_checked(llm, prompts, SamplingParams(max_tokens=24, ignore_eos=True))
    assert_parity(hf, llm, outputs, prompts, 24)
    pieces: dict[int, list[str]] = {}
    for event in events:
        if event.type == "token_generated":
            pieces.setdefault(event.seq_id, []).append(event.text)
    for seq_id, output in zip(sorted(pieces), outputs):
        assert "".join(pieces[seq_id]) == output.outputs[0].text
        assert output.outputs[0].text == hf[1].decode(output.outputs[0].token_ids, skip_special_tokens=True)
        assert "Ġ" not in output.outputs[0].text and "\ufffd" not in output.outputs[0].text

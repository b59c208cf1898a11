"""Llama, Qwen2 and Qwen3 through the paged engine against Hugging Face transformers, token for
token, on tiny random checkpoints the tests build themselves: grouped-query attention (K/V heads
fewer than query heads, and a single K/V head), block sizes, prefix caching, swap and recompute
preemption, n > 1; and the K/V geometry the engine reports against the tensors it allocates.
Engine and reference run on one device in float32 (test_engine_parity.DEVICE, make_llm)."""

from __future__ import annotations

import dataclasses
import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from conftest import build_tokenizer
from test_engine_parity import DEVICE, PROMPTS, hf_greedy, make_llm, run_checked

from blockviz.jupyter import Visualizer
from blockviz.model.timeline import Timeline
from blockviz.model.trace import kv_geometry
from blockviz.session.engine_session import trace_header
from engine import LLM, SamplingParams
from engine import events as ev
from engine.designs import V1

pytestmark = [pytest.mark.cuda] if DEVICE == "cuda" else []
# name -> (transformers config class, overrides): each a different GQA shape and variant
ARCHS = {
    "llama-gqa": ("LlamaConfig", dict(num_attention_heads=4, num_key_value_heads=2, tie_word_embeddings=False)),
    "llama-mqa": ("LlamaConfig", dict(num_attention_heads=4, num_key_value_heads=1, tie_word_embeddings=True)),
    "qwen2": ("Qwen2Config", dict(num_attention_heads=4, num_key_value_heads=2, tie_word_embeddings=True)),
    "qwen3": ("Qwen3Config", dict(num_attention_heads=4, num_key_value_heads=1, head_dim=32,
                                  tie_word_embeddings=False)),
}
TINY = dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, max_position_embeddings=256,
            initializer_range=0.3, rms_norm_eps=1e-6)


def make_tiny_llama(path: Path, arch: str, seed: int = 0) -> Path:
    """A tiny random checkpoint of `arch` (ARCHS) + tokenizer, save_pretrained into `path`."""
    import transformers

    config_name, overrides = ARCHS[arch]
    tokenizer = build_tokenizer()
    eos = tokenizer.eos_token_id
    config = getattr(transformers, config_name)(**TINY, **overrides, vocab_size=len(tokenizer), bos_token_id=eos,
                                                eos_token_id=eos, rope_theta=10000.0)
    torch.manual_seed(seed)
    model = transformers.AutoModelForCausalLM.from_config(config).eval()
    if "qwen2" in arch:  # HF initialises biases to zero: give them values so a dropped bias shows
        for layer in model.model.layers:
            for proj in (layer.self_attn.q_proj, layer.self_attn.k_proj, layer.self_attn.v_proj):
                torch.nn.init.normal_(proj.bias, std=0.5)
    model.save_pretrained(path)
    tokenizer.save_pretrained(path)
    return path


@pytest.fixture(scope="module", params=list(ARCHS))
def tiny(request, tmp_path_factory):
    """(checkpoint dir, (HF model, tokenizer), arch) for each architecture."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    path = make_tiny_llama(tmp_path_factory.mktemp(request.param), request.param)
    model = AutoModelForCausalLM.from_pretrained(path).to(DEVICE).eval()
    # the engine runs with ignore_eos: generate must not hold the end-of-text token back either
    # (min_new_tokens suppresses it), so it gets no eos id
    model.generation_config.eos_token_id = None
    return path, (model, AutoTokenizer.from_pretrained(path)), request.param


_expected: dict[tuple, list[int]] = {}


def assert_parity(hf, llm: LLM, outputs, prompts, max_tokens: int) -> None:
    """Every completion equals transformers' greedy `generate` (each reference computed once per
    checkpoint, prompt and length: the tests ask for the same ones again)."""
    for prompt, output in zip(prompts, outputs):
        ids = llm.engine.encode(prompt)
        key = (id(hf[0]), tuple(ids), max_tokens)
        if key not in _expected:
            _expected[key] = hf_greedy(hf, ids, max_tokens)
        for completion in output.outputs:
            assert completion.token_ids == _expected[key], f"prompt {prompt!r}"


def test_the_checkpoint_is_the_variant_asked_for(tiny):
    path, (model, _), arch = tiny
    config = make_llm(str(path), block_size=4, num_gpu_blocks=8).engine.loaded.config
    hf = model.config
    assert config.model_type == hf.model_type == arch.split("-")[0]
    assert config.num_kv_heads == hf.num_key_value_heads < config.num_heads == hf.num_attention_heads
    assert config.head_dim == (32 if arch == "qwen3" else 16)


@pytest.mark.parametrize("block_size", [1, 3, 16])
def test_greedy_batch_matches_transformers(tiny, block_size):
    path, hf, _ = tiny
    llm = make_llm(str(path), block_size=block_size, num_gpu_blocks=512 // block_size + 64)
    outputs, _ = run_checked(llm, PROMPTS, SamplingParams(max_tokens=24, ignore_eos=True))
    first, second = (o.outputs[0].token_ids for o in outputs[:2])
    assert first != second and len(set(first)) > 2  # a broken cache cannot hide behind one repeated token
    assert_parity(hf, llm, outputs, PROMPTS, 24)


def test_prefix_caching_hits_and_keeps_parity(tiny):
    path, hf, _ = tiny
    shared = "To be, or not to be, that is the question: whether"
    prompts = [shared + " tis nobler", shared + " the quick"]
    llm = make_llm(str(path), block_size=4, num_gpu_blocks=64, enable_prefix_caching=True)
    first, _ = run_checked(llm, prompts[:1], SamplingParams(max_tokens=8, ignore_eos=True))
    second, events = run_checked(llm, prompts[1:], SamplingParams(max_tokens=8, ignore_eos=True))
    hits = [e for e in events if e.type == "prefix_cache_hit"]
    assert len(hits) >= 2 and second[0].num_cached_tokens == 4 * len(hits)
    assert_parity(hf, llm, first + second, prompts, 8)


@pytest.mark.parametrize("mode", ["swap", "recompute"])
def test_preemption_keeps_parity(tiny, mode):
    path, hf, _ = tiny
    llm = make_llm(str(path), block_size=4, num_gpu_blocks=24, num_cpu_blocks=32, preemption_mode=mode, watermark=0.0)
    outputs, events = run_checked(llm, PROMPTS, SamplingParams(max_tokens=24, ignore_eos=True))
    preempted = [e for e in events if e.type == "preempted"]
    assert preempted and all(e.mode == mode for e in preempted)
    if mode == "swap":
        assert any(e.type == "swap_in" for e in events)
    assert_parity(hf, llm, outputs, PROMPTS, 24)


def test_n2_greedy_branches_match_transformers_after_copy_on_write(tiny):
    path, hf, _ = tiny
    llm = make_llm(str(path), block_size=4, num_gpu_blocks=64)
    prompt = "To be, or not"
    outputs, events = run_checked(llm, [prompt], SamplingParams(n=2, max_tokens=10, ignore_eos=True))
    assert any(e.type == "fork" for e in events) and any(e.type == "copy_on_write" for e in events)
    assert len(outputs[0].outputs) == 2
    assert_parity(hf, llm, outputs, [prompt], 10)


def test_kv_bytes_reported_equal_the_tensors_allocated(tiny):
    """2 x layers x K/V heads x head_dim x block_size x dtype bytes, in the trace header and the
    cache engine, equal what the pools hold; counting query heads instead would be larger."""
    path, (model, _), _ = tiny
    llm = make_llm(str(path), block_size=8, num_gpu_blocks=10, num_cpu_blocks=3)
    engine, hf = llm.engine, model.config
    header, cache = trace_header(engine), engine.cache_engine
    head_dim = getattr(hf, "head_dim", None) or hf.hidden_size // hf.num_attention_heads
    expected = 2 * hf.num_hidden_layers * hf.num_key_value_heads * head_dim * 8 * 4  # float32
    assert header["block_bytes"] == cache.block_bytes == engine.budget.block_bytes == expected
    assert (header["num_layers"], header["num_heads"], header["num_kv_heads"], header["head_dim"]) == (
        hf.num_hidden_layers, hf.num_attention_heads, hf.num_key_value_heads, head_dim)
    assert cache.pool_bytes("gpu") == 10 * expected and cache.pool_bytes("cpu") == 3 * expected
    k_cache, v_cache = cache.gpu_cache[0]
    assert k_cache.shape == v_cache.shape == (10, 8, hf.num_key_value_heads, head_dim)
    assert expected < 2 * hf.num_hidden_layers * hf.num_attention_heads * head_dim * 8 * 4
    # what the views show (the block inspector's "bytes" row in the TUI and the notebook): the same
    # bytes per block, as the sum of what the pools allocate, and the query heads the K/V heads serve
    allocated = sum(k.numel() + v.numel() for k, v in cache.gpu_cache) * k_cache.element_size() // 10
    shown = kv_geometry(header)
    assert shown.endswith(f"= {allocated:,} B") and f"{hf.num_key_value_heads} K/V heads" in shown
    assert (f"shared by {hf.num_attention_heads} query heads" in shown) == (
        hf.num_attention_heads != hf.num_key_value_heads)
    frame = Visualizer(Timeline.for_header(header), header=header)
    try:
        frame.select("gpu", 1)
        assert frame.frame()["inspector"]["bytes"] == shown
    finally:
        frame.close()


# ---------------------------------------------------------------- bad input


def _unsupported_checkpoint(tmp_path: Path) -> Path:
    path = make_tiny_llama(tmp_path / "ckpt", "llama-gqa")
    config = json.loads((path / "config.json").read_text())
    (path / "config.json").write_text(json.dumps({**config, "model_type": "mamba"}))
    return path


def test_unsupported_model_type_is_one_line_naming_the_supported_ones(tmp_path):
    path = _unsupported_checkpoint(tmp_path)
    with pytest.raises(ValueError, match="model_type 'mamba' is not supported: blockviz runs gpt2, llama, mistral, ministral, qwen2, qwen3"):
        LLM(str(path))
    result = subprocess.run([sys.executable, "-m", "blockviz", "generate", "--model", str(path)],
                            capture_output=True, text=True, timeout=120)
    assert result.returncode == 2
    assert result.stderr.strip().count("\n") == 0 and "is not supported: blockviz runs gpt2" in result.stderr


def test_registry_and_torch_free_list_agree():
    from engine.model_source import SUPPORTED_MODEL_TYPES
    from engine.models import MODEL_REGISTRY

    assert tuple(MODEL_REGISTRY) == SUPPORTED_MODEL_TYPES


def test_llama3_rope_scaling_matches_transformers():
    """Llama 3's long-context RoPE frequencies (rope_type 'llama3'): our forward's logits equal
    transformers' on a tiny model whose frequencies the scaling changes."""
    from transformers import LlamaConfig, LlamaForCausalLM

    from engine.attention import AttentionMetadata
    from engine.models.llama import Llama, rope_inv_freq

    rope = {"rope_type": "llama3", "rope_theta": 500000.0, "factor": 8.0, "low_freq_factor": 1.0,
            "high_freq_factor": 4.0, "original_max_position_embeddings": 16}
    config = LlamaConfig(**TINY, vocab_size=128, num_attention_heads=4, num_key_value_heads=2, rope_parameters=rope)
    torch.manual_seed(0)
    hf = LlamaForCausalLM(config).eval()
    model = Llama.from_hf(hf)
    assert model.config.rope_scaling["rope_type"] == "llama3"
    default = rope_inv_freq(dataclasses.replace(model.config, rope_scaling=None))
    assert not torch.allclose(model.inv_freq, default)  # the scaling really changes the frequencies
    ids = torch.randint(0, 128, (40,))
    meta = AttentionMetadata.build([[0]], [40], [40], block_size=64)
    logits = model.compute_logits(model(ids, meta.positions, None, meta))
    with torch.no_grad():
        expected = hf(ids[None]).logits[0]
    assert torch.allclose(logits, expected, atol=1e-4)


@pytest.mark.parametrize("options", [
    dict(block_size=4, num_gpu_blocks=16),  # a pool that forces recompute preemption
    dict(block_size=3, num_gpu_blocks=200, max_num_batched_tokens=8),  # chunked prefills
], ids=["preempting", "chunked"])
def test_v1_mode_matches_transformers(tiny, options):
    """vLLM v1's manager and scheduler (kv_manager="v1") on the same checkpoint: greedy text equal
    to transformers' token for token, with prefix caching (on in v1), n=2 as two requests sharing
    the prompt through the cache, a tiny pool that preempts by recompute, and chunked prefills."""
    path, hf, _ = tiny
    llm = make_llm(str(path), kv_manager=V1.name, **options)
    events: list = []
    llm.events.subscribe(events.append)
    outputs = llm.generate(PROMPTS + [PROMPTS[0]], SamplingParams(n=2, max_tokens=12, ignore_eos=True))
    assert_parity(hf, llm, outputs, PROMPTS + [PROMPTS[0]], 12)
    assert any(isinstance(e, ev.PrefixCacheHit) for e in events)  # the second sample and the repeat hit the cache
    if options["num_gpu_blocks"] == 16:
        assert any(isinstance(e, ev.Preempted) and e.mode == "recompute" for e in events)
    manager = llm.engine.kv_manager
    assert manager.get_num_free_gpu_blocks() == manager.num_usable_blocks  # every block but the null one free

"""Sliding-window attention (Mistral, Qwen2/3 and Llama `layer_types`) against transformers.

Tiny random checkpoints the tests build (save_pretrained into a temp dir), each with full and
sliding layers mixed as its family mixes them: Llama with explicit `layer_types`, Qwen2 with
`use_sliding_window` + `max_window_layers`, Qwen3 with `layer_types`, and Mistral's window on
every layer. The paged engine (vLLM v1's manager, one block table per KV-cache group:
tests/test_hybrid_engine.py checks the groups themselves) must generate what transformers' greedy
`generate` does, token for token in float32, for windows smaller and
larger than a block, block sizes 1, 4 and 16, prompts longer than the window, on the torch and the
triton backend (Triton's interpreter on the CPU, as tests/test_kernels.py runs it).

transformers' LlamaForCausalLM ignores `layer_types` (vLLM's honours them, as ours does), so a
Llama checkpoint's reference is transformers' MinistralForCausalLM on the same weights: Llama's
layers with `layer_types`.

At the attention level the window is checked against transformers' own mask function, and blocks
wholly before a window are filled with NaN: any path that read them would return NaN.

Bad layouts (v0 under sliding layers, an unknown layer type, a window longer than the context on
layers that slide) are one line: exit 2 from `blockviz generate` and `blockviz run`, a ValueError
from the Python API.
"""

from __future__ import annotations

import json
import os
import random
import re
from functools import cache
from pathlib import Path

import pytest

from blockviz.errors import in_flags
import torch

CUDA = torch.cuda.is_available()
if not CUDA:
    os.environ["TRITON_INTERPRET"] = "1"  # before the kernel modules are imported (tests/test_kernels.py)

from conftest import build_tokenizer  # noqa: E402

from engine import LLM, SamplingParams  # noqa: E402
from engine.attention import AttentionMetadata, causal_mask, paged_attention, reference_paged_attention  # noqa: E402
from engine.cache_engine import CacheEngine  # noqa: E402
from engine.config import EngineConfig  # noqa: E402
from engine.kernels import triton_available  # noqa: E402
from engine.v1.kv_cache_interface import FullAttentionSpec, SlidingWindowSpec, kv_cache_specs  # noqa: E402
from engine.llm_engine import LLMEngine  # noqa: E402
from engine.model_loader import load_model  # noqa: E402
from engine.model_source import attention_layer_types  # noqa: E402
from engine.designs import V0, V1

DEVICE = "cuda" if CUDA else "cpu"
needs_triton = pytest.mark.skipif(not triton_available(), reason="triton is not installed (pip install triton)")

FULL, SLIDING = "full_attention", "sliding_attention"
TINY = dict(hidden_size=64, intermediate_size=128, num_hidden_layers=3, max_position_embeddings=256,
            initializer_range=0.3, rms_norm_eps=1e-6, num_attention_heads=4, num_key_value_heads=2)
# arch -> (transformers config class, fields that make some layers slide, the layers that slide)
ARCHS = {
    "llama": ("LlamaConfig", dict(layer_types=[SLIDING, FULL, SLIDING]), (0, 2)),
    "qwen2": ("Qwen2Config", dict(use_sliding_window=True, max_window_layers=1), (1, 2)),
    "qwen3": ("Qwen3Config", dict(use_sliding_window=True, head_dim=32, layer_types=[SLIDING, SLIDING, FULL]), (0, 1)),
    "mistral": ("MistralConfig", dict(num_key_value_heads=1), (0, 1, 2)),
}
PROMPTS = ["To be, or not to be, that is the question: whether tis nobler in the mind", "The quick brown fox"]
MAX_TOKENS = 10
_root: list[Path] = []


@pytest.fixture(scope="module", autouse=True)
def checkpoint_root(tmp_path_factory):
    """Where this module's checkpoints go (one directory per arch and window, built once)."""
    _root.append(tmp_path_factory.mktemp("sliding"))
    yield
    _root.pop()
    checkpoint.cache_clear()
    reference.cache_clear()
    loaded_model.cache_clear()


@cache
def checkpoint(arch: str, window: int) -> Path:
    """A tiny random checkpoint of `arch` whose sliding layers have `window`, + tokenizer. The
    seed is the same for every window: the windows of one arch share their weights."""
    import transformers

    config_name, overrides, _ = ARCHS[arch]
    tokenizer = build_tokenizer()
    eos = tokenizer.eos_token_id
    config = getattr(transformers, config_name)(**{**TINY, **overrides}, sliding_window=window, vocab_size=len(tokenizer),
                                                bos_token_id=eos, eos_token_id=eos)
    torch.manual_seed(0)
    model = transformers.AutoModelForCausalLM.from_config(config).eval()
    if arch == "qwen2":  # HF initialises biases to zero: give them values so a dropped bias shows
        for layer in model.model.layers:
            for proj in (layer.self_attn.q_proj, layer.self_attn.k_proj, layer.self_attn.v_proj):
                torch.nn.init.normal_(proj.bias, std=0.5)
    path = _root[-1] / f"{arch}-w{window}"
    model.save_pretrained(path)
    tokenizer.save_pretrained(path)
    return path


@cache
def hf_model(arch: str, window: int):
    """transformers' model of the checkpoint; for Llama, MinistralForCausalLM (Llama's layers with
    `layer_types`) on the same weights."""
    import transformers

    path = checkpoint(arch, window)
    if arch == "llama":
        fields = json.loads((path / "config.json").read_text())
        fields = {k: v for k, v in fields.items() if k not in ("model_type", "architectures", "transformers_version")}
        config = transformers.MinistralConfig(**fields)
        model = transformers.MinistralForCausalLM.from_pretrained(path, config=config)
    else:
        model = transformers.AutoModelForCausalLM.from_pretrained(path)
    model.generation_config.eos_token_id = None  # the engine runs with ignore_eos
    return model.eval()


@cache
def reference(arch: str, window: int, prompt_ids: tuple[int, ...], max_tokens: int = MAX_TOKENS) -> list[int]:
    """transformers' greedy tokens for the prompt."""
    ids = torch.tensor([prompt_ids])
    with torch.no_grad():
        out = hf_model(arch, window).generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=max_tokens,
                                              min_new_tokens=max_tokens, do_sample=False, pad_token_id=0)
    return out[0, len(prompt_ids):].tolist()


@cache
def loaded_model(arch: str, window: int):
    return load_model(checkpoint(arch, window), "cpu", torch.float32)


def engine_llm(arch: str, window: int, **options) -> LLM:
    """An LLM under vLLM v1's manager over the (shared) loaded checkpoint."""
    options = {"block_size": 4, "num_gpu_blocks": 256, "kv_manager": V1.name, "device": "cpu", **options}
    config = EngineConfig(model=str(checkpoint(arch, window)), **options)
    return LLM.from_engine(LLMEngine(config, loaded=loaded_model(arch, window)))


def assert_parity(arch: str, window: int, llm: LLM, prompts=PROMPTS, max_tokens: int = MAX_TOKENS) -> list[list[int]]:
    outputs = llm.generate(prompts, SamplingParams(max_tokens=max_tokens, ignore_eos=True))
    tokens = [o.outputs[0].token_ids for o in outputs]
    for prompt, got in zip(prompts, tokens):
        ids = tuple(llm.engine.encode(prompt))
        assert got == reference(arch, window, ids, max_tokens), f"{arch} window {window}: {prompt!r}"
    return tokens


# ---------------------------------------------------------------- which layers slide


@pytest.mark.parametrize("arch", list(ARCHS))
def test_each_layer_slides_as_transformers_says(arch):
    """The engine's per-layer windows equal transformers' layer_types, and the specs the block
    manager reads say the same (vLLM's FullAttentionSpec / SlidingWindowSpec)."""
    sliding = ARCHS[arch][2]
    hf_types = getattr(hf_model(arch, 3).config, "layer_types", None) or [SLIDING] * 3  # Mistral: every layer
    config = loaded_model(arch, 3).config
    assert config.model_type == arch
    assert config.layer_types == tuple(hf_types) == tuple(SLIDING if i in sliding else FULL for i in range(3))
    assert config.sliding_windows == tuple(3 if i in sliding else None for i in range(3))
    specs = engine_llm(arch, 3, block_size=4).engine.kv_cache_specs
    assert [type(s) for s in specs] == [SlidingWindowSpec if i in sliding else FullAttentionSpec for i in range(3)]
    assert {s.sliding_window for s in specs if isinstance(s, SlidingWindowSpec)} == {3}
    assert specs[0].page_size_bytes == 2 * 4 * config.num_kv_heads * config.head_dim * 4  # float32


def test_specs_of_a_full_attention_model_are_all_full(tiny_gpt2_dir):
    config = load_model(tiny_gpt2_dir, "cpu").config
    specs = kv_cache_specs(config, 16, torch.float32)
    assert len(specs) == config.num_layers and all(type(s) is FullAttentionSpec for s in specs)


# ---------------------------------------------------------------- greedy parity with transformers


@pytest.mark.parametrize("block_size", [1, 4, 16])
@pytest.mark.parametrize("window", [3, 7])
@pytest.mark.parametrize("arch", list(ARCHS))
def test_greedy_parity_torch(arch, window, block_size):
    """Windows 3 and 7 against blocks of 1, 4 and 16 (a window smaller than a block, larger, and
    spanning several), a 20-odd-token prompt and a short one batched together."""
    llm = engine_llm(arch, window, block_size=block_size, num_gpu_blocks=1024 // block_size)
    tokens = assert_parity(arch, window, llm)
    assert tokens[0] != tokens[1] and len(set(tokens[0])) > 2


@pytest.mark.parametrize("arch", list(ARCHS))
def test_the_window_changes_the_tokens_and_a_window_as_long_as_the_context_is_full_attention(arch):
    """A window of 3 and one of 256 (max_position_embeddings: valid; every key is in it) give
    different tokens on the same weights, each equal to transformers'."""
    long = assert_parity(arch, 256, engine_llm(arch, 256))
    short = assert_parity(arch, 3, engine_llm(arch, 3))
    assert long[0] != short[0]


@pytest.mark.parametrize("arch", ["llama", "qwen2"])
def test_prefix_hits_and_chunked_prefill_keep_parity(arch):
    """A prompt prefilled in chunks of 8 tokens, then a second one hitting its cached prefix: each
    attends over cached blocks through its window."""
    shared = PROMPTS[0]
    llm = engine_llm(arch, 3, block_size=4, max_num_batched_tokens=8, enable_prefix_caching=True)
    assert_parity(arch, 3, llm, [shared])
    engine = llm.engine
    hits = []
    engine.events.subscribe(lambda e: hits.append(e) if e.type == "prefix_cache_hit" else None)
    assert_parity(arch, 3, llm, [shared + " than"])
    assert hits


@needs_triton
@pytest.mark.parametrize("arch", list(ARCHS))
def test_greedy_parity_triton(arch):
    llm = engine_llm(arch, 3, block_size=4, device=DEVICE, attention_backend="triton")
    assert llm.engine.model_runner.attention_backend == "triton"
    assert_parity(arch, 3, llm, max_tokens=6)


@needs_triton
@pytest.mark.parametrize("block_size", [1, 16])
def test_greedy_parity_triton_block_sizes(block_size):
    llm = engine_llm("qwen2", 7, block_size=block_size, num_gpu_blocks=1024 // block_size, device=DEVICE,
                     attention_backend="triton")
    assert_parity("qwen2", 7, llm, max_tokens=6)


# ---------------------------------------------------------------- the attention itself


@pytest.mark.parametrize("window", [1, 2, 5, 40])
def test_the_mask_is_transformers_sliding_window_mask(window):
    """causal_mask with a window equals transformers' `sliding_window_causal_mask_function` (the
    query's own position and the window - 1 before it), for a prefill from scratch and a suffix."""
    from transformers.masking_utils import sliding_window_causal_mask_function

    allowed = sliding_window_causal_mask_function(window)
    for q_len, ctx in ((9, 9), (4, 13), (1, 6)):
        q_idx, kv_idx = torch.arange(ctx - q_len, ctx)[:, None], torch.arange(ctx)[None, :]  # absolute positions
        expected = allowed(torch.tensor(0), torch.tensor(0), q_idx, kv_idx).expand(q_len, ctx)
        assert torch.equal(causal_mask(q_len, ctx, torch.device("cpu"), window), expected)


def _poisoned_step(block_size: int, window: int, query_lens, context_lens, seed: int):
    """A random cache layer and block tables, and a copy of the cache whose blocks wholly before
    each sequence's window hold NaN (keys a window never reads)."""
    num_blocks, num_kv_heads, head_dim = 160, 2, 16
    cache = CacheEngine(1, num_kv_heads, head_dim, block_size, num_blocks, 0, DEVICE, torch.float32)
    generator = torch.Generator().manual_seed(seed)
    cache._gpu_kv.copy_(torch.randn(cache._gpu_kv.shape, generator=generator))
    free = list(range(1, num_blocks))
    random.Random(seed).shuffle(free)
    tables = [[free.pop() for _ in range(-(-ctx // block_size))] for ctx in context_lens]
    clean = [t.clone() for t in cache.gpu_cache[0]]
    for table, q, ctx in zip(tables, query_lens, context_lens):
        first_key = max(0, ctx - q - window + 1)  # the first query's first key
        for block in table[: first_key // block_size]:
            for t in cache.gpu_cache[0]:
                t[block] = float("nan")
    return cache.gpu_cache[0], clean, tables


@pytest.mark.parametrize("backend", ["torch", pytest.param("triton", marks=needs_triton)])
@pytest.mark.parametrize("block_size", [1, 4, 16])
@pytest.mark.parametrize("window", [1, 3, 6, 40])
def test_paged_attention_reads_only_the_window(backend, block_size, window):
    """A step with fresh prefills, suffixes after cached blocks and decodes of several lengths
    (decode groups of different widths): equal to the reference on a clean cache, although the
    blocks before each window hold NaN."""
    query_lens, context_lens = [5, 9, 1, 1, 3, 1], [13, 9, 30, 4, 3, 57]
    if block_size == 1:
        context_lens = [13, 9, 30, 4, 3, 40]
    (k_cache, v_cache), (clean_k, clean_v), tables = _poisoned_step(block_size, window, query_lens, context_lens,
                                                                    seed=block_size + window)
    torch.manual_seed(window)
    num_tokens = sum(query_lens)
    query = torch.randn(num_tokens, 4, 16, device=DEVICE)
    key, value = torch.randn(num_tokens, 2, 16, device=DEVICE), torch.randn(num_tokens, 2, 16, device=DEVICE)
    args = (tables, query_lens, context_lens, block_size)
    ref = reference_paged_attention(query, key.repeat_interleave(2, 1), value.repeat_interleave(2, 1),
                                    clean_k.repeat_interleave(2, 2), clean_v.repeat_interleave(2, 2),
                                    AttentionMetadata.build(*args, device=DEVICE), 0.25, window)
    meta = AttentionMetadata.build(*args, device=DEVICE, attention_backend=backend)
    out = paged_attention(query, key, value, k_cache, v_cache, meta, 0.25, window)
    torch.testing.assert_close(out, ref, atol=1e-5, rtol=1e-5)
    full = reference_paged_attention(query, key.repeat_interleave(2, 1), value.repeat_interleave(2, 1),
                                     clean_k.repeat_interleave(2, 2), clean_v.repeat_interleave(2, 2),
                                     AttentionMetadata.build(*args, device=DEVICE), 0.25)
    assert (window >= max(context_lens)) == torch.allclose(ref, full, atol=1e-5)  # the window did cut keys


# ---------------------------------------------------------------- bad input


@pytest.mark.parametrize("fields, message", [
    (dict(layer_types=[FULL, "chunked_attention"], sliding_window=4), "layer type 'chunked_attention' (layer 1)"),
    (dict(layer_types=[FULL], sliding_window=4), "layer_types has 1 entries but the model has num_hidden_layers=2"),
    (dict(layer_types=[FULL, SLIDING], sliding_window=0), "sliding_window must be a whole number >= 1"),
    (dict(layer_types=[FULL, SLIDING], sliding_window=-2), "sliding_window must be a whole number >= 1"),
    (dict(layer_types=[FULL, SLIDING], sliding_window=None), "sliding_window must be a whole number >= 1"),
    (dict(model_type="qwen2", layer_types=[SLIDING, SLIDING], sliding_window=4), "got None"),  # no use_sliding_window
])
def test_a_layout_no_model_can_run_is_one_line(fields, message):
    config = {"model_type": "llama", "num_hidden_layers": 2, **fields}
    with pytest.raises(ValueError, match=re.escape(message)) as info:
        attention_layer_types(config.get)
    assert "\n" not in str(info.value)


@pytest.mark.parametrize("config, expected", [
    (dict(model_type="qwen2", use_sliding_window=False, sliding_window=131072, max_window_layers=1), ((FULL,) * 3, None)),
    (dict(model_type="qwen2", use_sliding_window=True, sliding_window=8, max_window_layers=2), ((FULL, FULL, SLIDING), 8)),
    (dict(model_type="mistral", sliding_window=None), ((FULL,) * 3, None)),
    (dict(model_type="mistral"), ((SLIDING,) * 3, 4096)),  # MistralConfig's default window
    (dict(model_type="llama", sliding_window=8), ((FULL,) * 3, None)),
    (dict(model_type="llama", sliding_window=10**6, layer_types=[SLIDING, FULL, FULL]), ((SLIDING, FULL, FULL), 10**6)),
])
def test_layouts_read_from_config_json(config, expected):
    assert attention_layer_types({"num_hidden_layers": 3, **config}.get) == expected


def _edited_checkpoint(tmp_path: Path, **fields) -> Path:
    """The Llama checkpoint copied with config.json fields replaced."""
    import shutil

    path = tmp_path / "edited"
    shutil.copytree(checkpoint("llama", 3), path)
    config = json.loads((path / "config.json").read_text())
    (path / "config.json").write_text(json.dumps({**config, **fields}))
    return path


BAD_LAYOUTS = [  # (config.json fields, engine options, the one line)
    ({}, dict(kv_manager=V0.name), "kv_manager 'v0' cannot run this model: 2 of its 3 layers use sliding-window"),
    (dict(layer_types=[SLIDING] * 3), dict(kv_manager=V0.name), "kv_manager 'v0' cannot run this model: 3 of its 3"),
    (dict(layer_types=[FULL, FULL, "chunked_attention"]), {}, "layer type 'chunked_attention' (layer 2)"),
    (dict(layer_types=[FULL, SLIDING]), {}, "layer_types has 2 entries"),
    (dict(sliding_window=0), {}, "sliding_window must be a whole number >= 1"),
    (dict(sliding_window=257), {}, "sliding_window 257 is longer than the model's context (max_position_embeddings=256)"),
]


def _cli_options(options: dict) -> list[str]:
    return [arg for name, value in options.items() for arg in (f"--{name.replace('_', '-')}", value)]


@pytest.mark.parametrize("fields, options, message", BAD_LAYOUTS)
def test_cli_refuses_in_one_line_exit_2(tmp_path, capsys, fields, options, message):
    from blockviz import cli

    path = _edited_checkpoint(tmp_path, **fields)
    capsys.readouterr()  # building a checkpoint prints progress bars
    argv = ["generate", "--model", str(path), "--device", "cpu", "--max-tokens", "2", "--num-gpu-blocks", "32",
            *_cli_options(options)]
    assert cli.main(argv) == 2
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1 and in_flags(message) in lines[0], lines


@pytest.mark.parametrize("fields, options, message", BAD_LAYOUTS)
def test_run_refuses_in_one_line_exit_2_before_its_app_opens(tmp_path, capsys, monkeypatch, fields, options, message):
    """`blockviz run` reads the checkpoint's layers in the UI process, torch-free, before the
    engine process starts."""
    from blockviz import cli
    from blockviz.session.engine_process import ProcessBridge

    monkeypatch.setattr(ProcessBridge, "start", lambda self: pytest.fail("the engine process started"))
    path = _edited_checkpoint(tmp_path, **fields)
    capsys.readouterr()
    assert cli.main(["run", "--model", str(path), *_cli_options(options)]) == 2
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1 and in_flags(message) in lines[0], lines


@pytest.mark.parametrize("fields, options, message", BAD_LAYOUTS)
def test_the_python_api_refuses_with_one_line(tmp_path, fields, options, message):
    path = _edited_checkpoint(tmp_path, **fields)
    with pytest.raises(ValueError) as info:
        LLM(str(path), device="cpu", num_gpu_blocks=32, **options)
    assert message in str(info.value) and "\n" not in str(info.value)


def test_a_window_as_long_as_the_context_and_an_unread_long_window_load(tmp_path):
    """What must still load: a window equal to the context on sliding layers, and Qwen2.5's
    sliding_window 131072 over 32768 positions with use_sliding_window false (no layer slides)."""
    assert LLM(str(_edited_checkpoint(tmp_path, sliding_window=256)), device="cpu", num_gpu_blocks=32, kv_manager=V1.name)
    qwen = {"model_type": "qwen2", "num_hidden_layers": 28, "max_position_embeddings": 32768,
            "sliding_window": 131072, "use_sliding_window": False, "max_window_layers": 21}
    assert attention_layer_types(qwen.get) == ((FULL,) * 28, None)
    with pytest.raises(ValueError, match="sliding_window 131072 is longer"):  # the same window, sliding
        attention_layer_types({**qwen, "use_sliding_window": True}.get)


def test_the_engine_under_v0_refuses_a_sliding_model_and_v1_runs_it():
    with pytest.raises(ValueError, match="use --kv-manager v1"):
        engine_llm("mistral", 3, kv_manager=V0.name)
    assert engine_llm("mistral", 3).generate(["KV"], SamplingParams(max_tokens=2, ignore_eos=True))[0].outputs[0].token_ids


def test_run_refuses_v0_before_its_app_opens(capsys, monkeypatch):
    """`blockviz run` checks the checkpoint's layers against --kv-manager in the UI process, torch-free,
    before the engine process starts."""
    from blockviz import cli
    from blockviz.session.engine_process import ProcessBridge

    monkeypatch.setattr(ProcessBridge, "start", lambda self: pytest.fail("the engine process started"))
    path = checkpoint("qwen2", 3)
    capsys.readouterr()  # building a checkpoint prints progress bars
    assert cli.main(["run", "--model", str(path), "--kv-manager", "v0"]) == 2
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1 and "2 of its 3 layers use sliding-window attention" in lines[0], lines


def test_decode_graphs_are_skipped_for_a_window_on_the_torch_backend():
    """The torch decode path narrows each sequence's blocks to its window from the step's context
    lengths on the host: a CUDA graph would replay the lengths it was captured with, so such a model
    decodes eagerly (and says why); the triton kernel reads the lengths on the device and keeps them."""
    from engine.cuda_graphs import EagerCapture
    from engine.model_runner import ModelRunner

    llm = engine_llm("mistral", 3)
    engine = llm.engine
    torch_runner = ModelRunner(engine.model, engine.cache_engine, 4, engine.device, "torch", capture=EagerCapture())
    assert torch_runner.graph_runner is None and "sliding-window" in torch_runner.graphs_skipped

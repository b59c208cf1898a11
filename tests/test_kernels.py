"""engine/kernels: the Triton kernels against the torch reference, and the triton backend end to end.

Without a GPU the kernels run on CPU tensors through Triton's interpreter: this module sets
TRITON_INTERPRET=1 before anything imports the kernel modules (Triton reads it when a kernel is
defined). On a CUDA machine it leaves the variable alone, the kernels compile for the GPU and the
`cuda` cases run them; the `cpu` cases skip there. Shapes are small: the interpreter runs each
program in numpy.

The reference is `reference_paged_attention` (gather through the block table, then SDPA). For
grouped-query attention it runs on caches whose K/V heads are repeated to one per query head
(HF `repeat_kv`), which is what a group sharing one K/V head means.
"""

from __future__ import annotations

import os
import random
import subprocess
import sys

import pytest
import torch

CUDA = torch.cuda.is_available()
if not CUDA:
    os.environ["TRITON_INTERPRET"] = "1"

from engine.attention import AttentionMetadata, paged_attention, reference_paged_attention  # noqa: E402
from engine.cache_engine import CacheEngine  # noqa: E402
from engine.kernels import resolve_attention_backend, triton_available  # noqa: E402

needs_triton = pytest.mark.skipif(not triton_available(), reason="triton is not installed (pip install triton)")
DEVICES = [
    pytest.param("cpu", marks=pytest.mark.skipif(CUDA, reason="with CUDA the kernels compile for the GPU: "
                                                               "the cuda cases run them")),
    pytest.param("cuda", marks=[pytest.mark.cuda, pytest.mark.skipif(not CUDA, reason="no CUDA device")]),
]
NUM_BLOCKS = 64
NUM_KV_HEADS = 2
ATOL = 1e-5


def cache_layer(block_size: int, head_dim: int, device: str, num_kv_heads: int = NUM_KV_HEADS, seed: int = 0):
    """Layer 0 of a CacheEngine (head-major storage, K and V views of one tensor), random values."""
    cache = CacheEngine(1, num_kv_heads, head_dim, block_size, NUM_BLOCKS, 0, device, torch.float32)
    generator = torch.Generator().manual_seed(seed)
    cache._gpu_kv.copy_(torch.randn(cache._gpu_kv.shape, generator=generator))
    return cache.gpu_cache[0]


def random_tables(context_lens: list[int], block_size: int, seed: int) -> list[list[int]]:
    """Distinct random physical blocks covering each context."""
    free = list(range(NUM_BLOCKS))
    random.Random(seed).shuffle(free)
    return [[free.pop() for _ in range(-(-ctx // block_size))] for ctx in context_lens]


def repeat_kv(tensor: torch.Tensor, group_size: int, dim: int) -> torch.Tensor:
    """Each K/V head repeated for the group of query heads it serves (HF `repeat_kv`)."""
    return tensor.repeat_interleave(group_size, dim=dim)


def run_both(meta_args: tuple, query, key, value, k_cache, v_cache, scale: float):
    """The triton backend's paged_attention on the caches, and the reference on copies with each
    K/V head repeated per query head. Returns (out, ref_out, ref_k_cache, ref_v_cache)."""
    group_size = query.shape[1] // key.shape[1]
    ref_k, ref_v = repeat_kv(k_cache, group_size, 2).clone(), repeat_kv(v_cache, group_size, 2).clone()
    ref_meta = AttentionMetadata.build(*meta_args, device=query.device)
    ref = reference_paged_attention(query, repeat_kv(key, group_size, 1), repeat_kv(value, group_size, 1),
                                    ref_k, ref_v, ref_meta, scale)
    meta = AttentionMetadata.build(*meta_args, device=query.device, attention_backend="triton")
    out = paged_attention(query, key, value, k_cache, v_cache, meta, scale)
    return out, ref, ref_k, ref_v


def assert_caches_equal(k_cache, v_cache, ref_k, ref_v, group_size: int) -> None:
    """The kernel's writes equal the reference's: every K/V head equals the first query head of its group."""
    torch.testing.assert_close(k_cache, ref_k[:, :, ::group_size], atol=0, rtol=0)
    torch.testing.assert_close(v_cache, ref_v[:, :, ::group_size], atol=0, rtol=0)


# ---------------------------------------------------------------- store_kvcache


@needs_triton
@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("block_size", [1, 4, 16])
@pytest.mark.parametrize("layout", ["cache-engine", "block-major"])
def test_store_kvcache_writes_what_write_to_cache_writes(device, block_size, layout):
    from engine.attention import write_to_cache
    from engine.kernels.store_kvcache import store_kvcache

    head_dim, num_tokens = 12, 9  # a head_dim that is no power of two: masked lanes
    if layout == "cache-engine":
        k_cache, v_cache = cache_layer(block_size, head_dim, device)
    else:
        shape = (NUM_BLOCKS, block_size, NUM_KV_HEADS, head_dim)
        k_cache, v_cache = torch.randn(shape, device=device), torch.randn(shape, device=device)
    slots = random.Random(block_size).sample(range(NUM_BLOCKS * block_size), num_tokens)
    slot_mapping = torch.tensor(slots, device=device)
    # key and value as the model hands them: views into one fused projection, strided
    qkv = torch.randn(num_tokens, 3, NUM_KV_HEADS, head_dim, device=device)
    key, value = qkv[:, 1], qkv[:, 2]
    expected_k, expected_v = k_cache.clone(), v_cache.clone()
    write_to_cache(key, value, expected_k, expected_v, slot_mapping)
    store_kvcache(key, value, k_cache, v_cache, slot_mapping)
    torch.testing.assert_close(k_cache, expected_k, atol=0, rtol=0)
    torch.testing.assert_close(v_cache, expected_v, atol=0, rtol=0)


@needs_triton
@pytest.mark.parametrize("device", DEVICES)
def test_store_kvcache_skips_padding_slots(device):
    from engine.kernels.store_kvcache import store_kvcache

    k_cache, v_cache = cache_layer(4, 16, device)
    before_k, before_v = k_cache.clone(), v_cache.clone()
    key, value = torch.randn(3, NUM_KV_HEADS, 16, device=device), torch.randn(3, NUM_KV_HEADS, 16, device=device)
    store_kvcache(key, value, k_cache, v_cache, torch.tensor([5, -1, 9], device=device))
    changed = (k_cache != before_k).any(dim=-1).any(dim=-1).flatten().nonzero().flatten().tolist()
    assert changed == [5, 9]  # slots (block * block_size + offset) written: the -1 token nowhere
    assert torch.equal(k_cache.flatten(0, 1)[9], key[2]) and torch.equal(v_cache.flatten(0, 1)[5], value[0])
    assert torch.equal(v_cache.flatten(0, 1)[[5, 9]] != before_v.flatten(0, 1)[[5, 9]],
                       torch.ones(2, NUM_KV_HEADS, 16, dtype=torch.bool, device=device))


# ---------------------------------------------------------------- paged decode


@needs_triton
@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("group_size", [1, 3, 8])
@pytest.mark.parametrize("block_size", [1, 4, 16])
def test_paged_decode_matches_reference(device, block_size, group_size):
    head_dim = 16
    context_lens = [1, 5, 17, 33, 2]  # ragged: a tile over several blocks, part of one, a single key
    if block_size == 1:
        context_lens = [1, 5, 9, 3, 2]  # one block per token: stay inside the pool
    num_heads = NUM_KV_HEADS * group_size
    k_cache, v_cache = cache_layer(block_size, head_dim, device, seed=block_size + group_size)
    tables = random_tables(context_lens, block_size, seed=group_size)
    torch.manual_seed(group_size)
    n = len(context_lens)
    query = torch.randn(n, num_heads, head_dim, device=device)
    key, value = torch.randn(n, NUM_KV_HEADS, head_dim, device=device), torch.randn(n, NUM_KV_HEADS, head_dim, device=device)
    meta_args = (tables, [1] * n, context_lens, block_size)
    out, ref, ref_k, ref_v = run_both(meta_args, query, key, value, k_cache, v_cache, head_dim**-0.5)
    torch.testing.assert_close(out, ref, atol=ATOL, rtol=1e-5)
    assert_caches_equal(k_cache, v_cache, ref_k, ref_v, group_size)


@needs_triton
@pytest.mark.parametrize("device", DEVICES)
def test_paged_decode_odd_head_dim_and_block_size(device):
    """head_dim 24 and block size 3 (neither a power of two): masked lanes, tiles across blocks."""
    block_size, head_dim, context_lens = 3, 24, [7, 1, 20]
    k_cache, v_cache = cache_layer(block_size, head_dim, device, seed=5)
    tables = random_tables(context_lens, block_size, seed=5)
    query = torch.randn(3, NUM_KV_HEADS * 2, head_dim, device=device)
    key, value = torch.randn(3, NUM_KV_HEADS, head_dim, device=device), torch.randn(3, NUM_KV_HEADS, head_dim, device=device)
    out, ref, ref_k, ref_v = run_both((tables, [1] * 3, context_lens, block_size), query, key, value, k_cache,
                                      v_cache, 0.3)
    torch.testing.assert_close(out, ref, atol=ATOL, rtol=1e-5)
    assert_caches_equal(k_cache, v_cache, ref_k, ref_v, 2)


@needs_triton
@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("block_size", [1, 4, 16])
def test_paged_decode_over_blocks_shared_after_a_fork(device, block_size):
    """Two samples of one prompt share its full blocks (ref count 2) and differ in their last
    block, as after `fork` and a copy-on-write: each reads the shared blocks and its own."""
    head_dim, prompt_len = 16, 2 * block_size + 1
    k_cache, v_cache = cache_layer(block_size, head_dim, device, seed=7)
    full = prompt_len // block_size  # the prompt's full blocks, shared
    blocks = random.Random(7).sample(range(NUM_BLOCKS), full + 2)
    tables = [blocks[:full] + [blocks[full]], blocks[:full] + [blocks[full + 1]]]
    context_lens = [prompt_len + 1] * 2
    query = torch.randn(2, NUM_KV_HEADS * 3, head_dim, device=device)
    key, value = torch.randn(2, NUM_KV_HEADS, head_dim, device=device), torch.randn(2, NUM_KV_HEADS, head_dim, device=device)
    out, ref, ref_k, ref_v = run_both((tables, [1, 1], context_lens, block_size), query, key, value, k_cache,
                                      v_cache, head_dim**-0.5)
    torch.testing.assert_close(out, ref, atol=ATOL, rtol=1e-5)
    assert not torch.allclose(out[0], out[1])  # different last tokens, different outputs
    assert_caches_equal(k_cache, v_cache, ref_k, ref_v, 3)


@needs_triton
@pytest.mark.parametrize("device", DEVICES)
def test_mixed_step_prefills_on_torch_decodes_on_the_kernel(device):
    """Fresh prefills, a suffix after cached blocks and decodes in one step (MHA: the torch
    prefill path attends over one K/V head per query head)."""
    block_size, head_dim = 4, 16
    query_lens, context_lens = [5, 9, 1, 1, 3], [13, 9, 30, 4, 3]
    k_cache, v_cache = cache_layer(block_size, head_dim, device, num_kv_heads=4, seed=11)
    tables = random_tables(context_lens, block_size, seed=11)
    num_tokens = sum(query_lens)
    query, key, value = (torch.randn(num_tokens, 4, head_dim, device=device) for _ in range(3))
    out, ref, ref_k, ref_v = run_both((tables, query_lens, context_lens, block_size), query, key, value,
                                      k_cache, v_cache, head_dim**-0.5)
    torch.testing.assert_close(out, ref, atol=ATOL, rtol=1e-5)
    assert_caches_equal(k_cache, v_cache, ref_k, ref_v, 1)


# ---------------------------------------------------------------- the engine end to end


@needs_triton
@pytest.mark.parametrize("device", DEVICES)
def test_greedy_text_equals_the_torch_backend(tiny_gpt2_dir, device):
    """A tiny GPT-2, greedy, two samples of one prompt (a fork, then copy-on-write) and ragged
    prompts: the triton backend's tokens and text equal the torch backend's. Float32 on every device:
    in CUDA's default float16 the two backends round differently and random weights part them
    after a few tokens."""
    from engine import LLM, SamplingParams

    prompts = ["To be, or not to be, that is the question:", "The quick brown fox", "KV"]
    results = {}
    for backend in ("torch", "triton"):
        llm = LLM(str(tiny_gpt2_dir), block_size=4, num_gpu_blocks=96, device=device, dtype="float32",
                  attention_backend=backend)
        assert llm.engine.model_runner.attention_backend == backend
        outputs = llm.generate(prompts, SamplingParams(n=2, max_tokens=10, ignore_eos=True))
        results[backend] = [[(c.token_ids, c.text) for c in o.outputs] for o in outputs]
    assert results["triton"] == results["torch"]
    assert len({tuple(ids) for request in results["torch"] for ids, _ in request}) == 3  # prompts differ


@needs_triton
@pytest.mark.parametrize("device", DEVICES)
def test_greedy_text_equals_the_torch_backend_gqa_llama(tmp_path, device):
    """Once the engine loads Llama-family checkpoints: a tiny Llama with grouped-query attention
    (4 query heads per K/V head), triton against torch, in float32 on every device."""
    pytest.importorskip("engine.models.llama", reason="the engine has no Llama model yet")
    from transformers import LlamaConfig, LlamaForCausalLM

    from conftest import build_tokenizer
    from engine import LLM, SamplingParams

    tokenizer = build_tokenizer()
    config = LlamaConfig(vocab_size=len(tokenizer), hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                         num_attention_heads=8, num_key_value_heads=2, max_position_embeddings=128,
                         initializer_range=0.3, bos_token_id=tokenizer.eos_token_id,
                         eos_token_id=tokenizer.eos_token_id)
    torch.manual_seed(0)
    LlamaForCausalLM(config).eval().save_pretrained(tmp_path)
    tokenizer.save_pretrained(tmp_path)
    results = {}
    for backend in ("torch", "triton"):
        llm = LLM(str(tmp_path), block_size=4, num_gpu_blocks=96, device=device, dtype="float32",
                  attention_backend=backend)
        outputs = llm.generate(["To be, or not to be", "KV"], SamplingParams(max_tokens=10, ignore_eos=True))
        results[backend] = [o.outputs[0].token_ids for o in outputs]
    assert results["triton"] == results["torch"]


# ---------------------------------------------------------------- choosing the backend


def test_backend_defaults_and_refusals(monkeypatch):
    from engine.config import EngineConfig

    assert resolve_attention_backend(None, "cpu") == "torch"
    assert resolve_attention_backend("torch", "cpu") == "torch"
    with pytest.raises(ValueError, match="attention_backend must be one of torch, triton"):
        EngineConfig(attention_backend="flash")
    monkeypatch.setattr("engine.kernels.triton_available", lambda: False)
    assert resolve_attention_backend(None, "cuda") == "torch"  # no triton: torch even on CUDA
    with pytest.raises(ValueError, match="triton package is not installed"):
        resolve_attention_backend("triton", "cuda")
    monkeypatch.setattr("engine.kernels.triton_available", lambda: True)
    assert resolve_attention_backend(None, "cuda") == "triton"
    monkeypatch.setenv("TRITON_INTERPRET", "0")
    with pytest.raises(ValueError, match="set TRITON_INTERPRET=1"):
        resolve_attention_backend("triton", "cpu")


@pytest.mark.parametrize("command", ["generate", "run", "record", "compare", "explain"])
@pytest.mark.parametrize("installed", [False, True])
def test_cli_triton_it_cannot_run_is_one_line_exit_2(monkeypatch, capsys, tmp_path, command, installed):
    """Triton missing, or on the CPU without the interpreter: one line, exit 2, before any model loads."""
    from blockviz import cli

    monkeypatch.setattr("engine.kernels.triton_available", lambda: installed)
    monkeypatch.setenv("TRITON_INTERPRET", "0")
    extra = ["--out", str(tmp_path / "t.jsonl")] if command == "record" else []
    monkeypatch.setattr("blockviz.commands.dispatch", lambda args: pytest.fail("the command ran"))
    assert cli.main([command, *extra, "--device", "cpu", "--attention-backend", "triton"]) == 2
    lines = capsys.readouterr().err.strip().splitlines()
    expected = "set TRITON_INTERPRET=1" if installed else "triton package is not installed"
    assert len(lines) == 1 and expected in lines[0], lines


@needs_triton
def test_cli_triton_on_the_cpu_without_the_interpreter_in_a_real_process(tmp_path):
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    result = subprocess.run([sys.executable, "-m", "blockviz", "run", "--device", "cpu", "--attention-backend",
                             "triton"], capture_output=True, text=True, timeout=60, stdin=subprocess.DEVNULL, env=env)
    assert result.returncode == 2, result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and "TRITON_INTERPRET=1" in lines[0]


# ---------------------------------------------------------------- the CPU fast path of the LM head


@pytest.mark.parametrize("num_rows", [1, 5, 48])
@pytest.mark.parametrize("chunk", [7, 2048])
def test_chunked_lm_head_equals_f_linear(num_rows, chunk):
    from engine.kernels.lm_head import chunked_lm_head, lm_head_logits

    weight = torch.randn(2 * 2048 + 77, 40)  # whole chunks and a ragged last one
    hidden = torch.randn(num_rows, 40)
    expected = torch.nn.functional.linear(hidden, weight)
    logits = chunked_lm_head(hidden, weight, chunk=chunk)
    assert logits.shape == expected.shape and logits.is_contiguous()
    torch.testing.assert_close(logits, expected, atol=1e-5, rtol=1e-6)
    assert torch.equal(logits.argmax(-1), expected.argmax(-1))
    torch.testing.assert_close(lm_head_logits(hidden, weight), expected, atol=1e-5, rtol=1e-6)

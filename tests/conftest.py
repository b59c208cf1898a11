"""Shared fixtures: tiny GPT-2 checkpoints built locally, loadable exactly like "gpt2".

`make_tiny_gpt2(path, **config_overrides)` writes a GPT2LMHeadModel (save_pretrained) and a
byte-level BPE tokenizer trained on a few sentences into `path`; no network is involved. The
weights use a large initializer_range so greedy decoding depends on the context instead of
collapsing to one repeated token. Everything is deterministic (fixed torch seed).
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch

if not torch.cuda.is_available():
    # Triton reads TRITON_INTERPRET when it is first imported (its own jit helpers, tl.zeros, are
    # defined then): set before any test module imports it, directly or through vLLM, so every
    # kernel test runs the kernels on CPU tensors whatever order the modules are collected in
    os.environ.setdefault("TRITON_INTERPRET", "1")
from jupyter_fixtures import chromium_browser, jupyter_server, lab_page  # noqa: F401 (browser tests' fixtures)

TINY_GPT2_CONFIG = dict(
    n_layer=2,
    n_embd=64,
    n_head=4,
    n_positions=128,
    initializer_range=0.3,
)
TOKENIZER_TEXT = [
    "To be, or not to be, that is the question:",
    "Whether 'tis nobler in the mind to suffer the slings and arrows of outrageous fortune,",
    "The quick brown fox jumps over the lazy dog.",
    "All the world's a stage, and all the men and women merely players.",
    "Paged attention keeps the KV cache in fixed-size blocks.",
]
EOS_TOKEN = "<|endoftext|>"


def build_tokenizer(vocab_size: int = 320):
    """A GPT-2-style byte-level BPE tokenizer trained locally, wrapped for AutoTokenizer."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=[EOS_TOKEN],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(TOKENIZER_TEXT * 4, trainer)
    return PreTrainedTokenizerFast(tokenizer_object=tok, eos_token=EOS_TOKEN, bos_token=EOS_TOKEN, unk_token=EOS_TOKEN)


def make_tiny_gpt2(path: Path, seed: int = 0, **config_overrides) -> Path:
    """Write a tiny random GPT-2 checkpoint + tokenizer into `path` and return it."""
    import torch
    from transformers import GPT2Config, GPT2LMHeadModel

    path = Path(path)
    tokenizer = build_tokenizer()
    eos_id = tokenizer.eos_token_id
    config = GPT2Config(
        **{**TINY_GPT2_CONFIG, "vocab_size": len(tokenizer), "bos_token_id": eos_id, "eos_token_id": eos_id,
           **config_overrides}
    )
    torch.manual_seed(seed)
    model = GPT2LMHeadModel(config).eval()
    model.save_pretrained(path)
    tokenizer.save_pretrained(path)
    return path


@pytest.fixture(scope="session")
def tiny_gpt2_factory(tmp_path_factory):
    """Build (and cache per session) tiny checkpoints: `tiny_gpt2_factory(**overrides) -> Path`."""
    built: dict[tuple, Path] = {}

    def factory(**config_overrides) -> Path:
        key = tuple(sorted(config_overrides.items()))
        if key not in built:
            built[key] = make_tiny_gpt2(tmp_path_factory.mktemp("tiny-gpt2"), **config_overrides)
        return built[key]

    return factory


@pytest.fixture(scope="session")
def tiny_gpt2_dir(tiny_gpt2_factory) -> Path:
    """The default tiny GPT-2 checkpoint directory (2 layers, 64 wide, 4 heads, 128 positions)."""
    return tiny_gpt2_factory()

"""Find a checkpoint by name and load it into the paged-KV model its `model_type` names.

References: vLLM v0 `vllm/model_executor/model_loader/loader.py` (`get_model`: resolve, build
the architecture the config's model_type names, load weights) and nano-vllm
`nanovllm/utils/loader.py`.

A name resolves (engine/model_source.py, torch-free, re-exported here: resolve_model,
check_model, ModelNotFoundError) to the bundled "tiny-shakespeare", a local save_pretrained
directory, a Hugging Face hub name (cached, else downloaded), or a GGUF file ("smollm2", a
`.gguf` path). A checkpoint's config.json `model_type` picks the model (engine.models.MODEL_REGISTRY:
gpt2, and llama, mistral, ministral, qwen2, qwen3 on the Llama path); our model reads a local
checkpoint's one model.safetensors itself when its weights are the model's, else transformers loads
the weights and we copy them. A GGUF file is read
with the `gguf` package (engine/models/gguf_checkpoint.py), its tokenizer and chat template by
transformers from the same file; what that produces is kept in the GGUF cache
(engine/models/gguf_cache.py, docs/model-cache.md) for the next load of the unchanged file.
"""

from __future__ import annotations

import contextlib
import logging
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from engine.model_source import (  # noqa: F401 - re-exported: the torch-free half of loading
    BUNDLED_MODELS_DIR,
    DEFAULT_MODEL,
    HUB_PROBE_TIMEOUT_S,
    ModelNotFoundError,
    _hub_kwargs,
    _is_gguf,
    _read_config,
    check_model,
    check_model_config,
    check_weights_hold_the_layers,
    check_model_type,
    checkpoint_file,
    resolve_model,
)
from engine.models import GPT2, MODEL_REGISTRY, GPT2Config, Llama, LlamaConfig

logger = logging.getLogger(__name__)


@dataclass(slots=True)
class LoadedModel:
    """A ready-to-run model and what the engine needs beside it."""

    model: GPT2 | Llama
    tokenizer: Any  # a transformers tokenizer (AutoTokenizer)
    config: GPT2Config | LlamaConfig  # num_layers, num_heads, num_kv_heads, head_dim: the K/V geometry
    device: torch.device
    dtype: torch.dtype
    name: str  # the name or path the caller asked for
    path: str | Path  # what it resolved to: a directory or a hub name
    hf_config: Any = field(default=None, repr=False)  # the transformers config (eos ids etc.)


def default_device() -> torch.device:
    return torch.device("cuda" if torch.cuda.is_available() else "cpu")


def default_dtype(device: torch.device | str) -> torch.dtype:
    """float16 on CUDA, float32 elsewhere."""
    return torch.float16 if torch.device(device).type == "cuda" else torch.float32


def load_model(
    name_or_path: str | os.PathLike | None = None,
    device: torch.device | str | None = None,
    dtype: torch.dtype | None = None,
) -> LoadedModel:
    """Load a checkpoint (bundled name, local directory, hub name or GGUF file) onto `device`.

    device defaults to CUDA when available, else CPU; dtype to float16 on CUDA, float32 on CPU.
    A model_type no model here runs raises ValueError naming the supported ones.
    """
    name = str(name_or_path) if name_or_path is not None else DEFAULT_MODEL
    device = torch.device(device) if device is not None else default_device()
    dtype = dtype if dtype is not None else default_dtype(device)
    source = resolve_model(name)
    if _is_gguf(source):
        loaded = _load_gguf(name, source, device, dtype)
    else:
        loaded = _load_pretrained(name, source, device, dtype)
    config = loaded.config
    logger.info(
        "loaded %s (%s) from %s: %d layers, %d query heads, %d K/V heads, head_dim %d, vocab %d on %s/%s",
        name, config.model_type, source, config.num_layers, config.num_heads, config.num_kv_heads,
        config.head_dim, config.vocab_size, device, dtype,
    )
    return loaded


def _load_pretrained(name: str, source: str | Path, device: torch.device, dtype: torch.dtype) -> LoadedModel:
    """A save_pretrained directory or hub name: transformers reads its config and tokenizer; our model
    reads a local directory's model.safetensors itself, else copies the weights of transformers' model."""
    kwargs = _hub_kwargs(name) if isinstance(source, str) else {}
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer  # slow import: after the checks

    config_path = checkpoint_file(source, "config.json")
    if config_path is not None:  # before transformers sees a type or layer layout it may refuse in many lines
        settings = _read_config(config_path)
        check_model_config(settings)
        check_weights_hold_the_layers(source, settings)
    hf_config = _from_pretrained(AutoConfig, source, kwargs)
    check_model_type(hf_config.model_type)
    model_cls, config_cls = MODEL_REGISTRY[hf_config.model_type]
    config = config_cls.from_hf(hf_config)  # ValueError for a variant we do not run
    tokenizer = _from_pretrained(AutoTokenizer, source, kwargs)
    model = _from_own_safetensors(model_cls, config, source, device, dtype) if isinstance(source, Path) else None
    if model is None:
        with _no_progress_bars():  # transformers' weight-loading bar: not for a library to print
            hf_model = _from_pretrained(AutoModelForCausalLM, source, {**kwargs, "dtype": dtype})
        model = model_cls.from_hf(hf_model, device=device)
        del hf_model
    return LoadedModel(model, tokenizer, config, device, dtype, name, source, hf_config)


def _from_own_safetensors(model_cls, config, source: Path, device: torch.device, dtype: torch.dtype):
    """Our model read straight from a local checkpoint's one `model.safetensors` (as save_pretrained
    writes it), without building transformers' model first, when its weights are exactly the ones the
    model copies (names, shapes; copy_hf_weights); None for any other checkpoint (shards, .bin, other
    names or shapes), which transformers loads as `_load_pretrained` does for a hub name."""
    path = source / "model.safetensors"
    if not path.is_file():
        return None
    from safetensors import SafetensorError
    from safetensors.torch import load_file

    try:
        state_dict = load_file(str(path))
        return model_cls.from_config(config, state_dict, device, dtype)
    except (ValueError, SafetensorError, OSError):
        return None  # transformers reads it, or says in its words why it cannot


def _load_gguf(name: str, path: Path, device: torch.device, dtype: torch.dtype) -> LoadedModel:
    """A GGUF file: weights and config read with `gguf` (dequantized to `dtype`), the tokenizer and
    chat template by transformers from the same file; what those produce is kept in the GGUF cache
    (engine/models/gguf_cache.py) and read back from it while the file is unchanged."""
    from types import SimpleNamespace

    from engine.models.gguf_cache import CachedGGUF, read_entry, write_entry
    from engine.models.gguf_checkpoint import load_gguf

    cached = read_entry(path, dtype, _saved_tokenizer)
    if cached is None:
        config, state_dict, facts = load_gguf(path, dtype)
        model = Llama.from_config(config, state_dict, device, dtype)  # a file lacking weights stops here, uncached
        tokenizer = _gguf_tokenizer(path)
        write_entry(path, dtype, CachedGGUF(config, state_dict, facts, tokenizer))
        del state_dict
    else:
        config, facts, tokenizer = cached.config, cached.facts, cached.tokenizer
        model = Llama.from_config(config, cached.state_dict, device, dtype)
        del cached
    if facts["chat_template"] and not getattr(tokenizer, "chat_template", None):
        tokenizer.chat_template = facts["chat_template"]
    hf_config = SimpleNamespace(model_type=config.model_type, eos_token_id=facts["eos_token_id"],
                                bos_token_id=facts["bos_token_id"])
    return LoadedModel(model, tokenizer, config, device, dtype, name, path, hf_config)


def _gguf_tokenizer(path: Path):
    """transformers' tokenizer of a GGUF file (it parses the file's vocabulary and merges)."""
    from transformers import AutoTokenizer

    with _no_progress_bars():
        return AutoTokenizer.from_pretrained(str(path.parent), gguf_file=path.name)


def _saved_tokenizer(directory: str):
    """A tokenizer saved with save_pretrained (the GGUF cache's copy)."""
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(directory)


@contextlib.contextmanager
def _no_progress_bars():
    """transformers' progress bars off for the block, as they were after it."""
    from transformers.utils import logging as hf_logging

    enabled = hf_logging.is_progress_bar_enabled()
    hf_logging.disable_progress_bar()
    try:
        yield
    finally:
        if enabled:
            hf_logging.enable_progress_bar()


def _from_pretrained(cls, source: str | Path, kwargs: dict):
    """cls.from_pretrained; for a hub name, a failed lookup becomes a one-line ModelNotFoundError."""
    if isinstance(source, Path):
        return cls.from_pretrained(str(source), **kwargs)
    try:
        return cls.from_pretrained(source, **kwargs)
    except OSError as exc:  # transformers' "not found / couldn't connect" errors, HF hub HTTP errors
        reason = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
        raise ModelNotFoundError(f"model {source!r} could not be loaded from the Hugging Face hub: {reason}") from exc

"""Find a GPT-2 checkpoint by name and load it into the paged-KV model.

References: vLLM v0 `vllm/model_executor/model_loader/loader.py` (`get_model`: resolve, build
the architecture, load weights) and nano-vllm `nanovllm/utils/loader.py`.

A name resolves (engine/model_source.py, torch-free, re-exported here: resolve_model,
check_model, ModelNotFoundError) to the bundled "tiny-shakespeare", a local save_pretrained
directory, or a Hugging Face hub name (cached, else downloaded). Every route goes through the
same `GPT2LMHeadModel.from_pretrained` + `GPT2.from_hf` path.
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
    check_model,
    resolve_model,
)
from engine.models.gpt2 import GPT2, GPT2Config

logger = logging.getLogger(__name__)


@dataclass(slots=True)
class LoadedModel:
    """A ready-to-run model and what the engine needs beside it."""

    model: GPT2
    tokenizer: Any  # a transformers tokenizer (AutoTokenizer)
    config: GPT2Config
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
    """Load a GPT-2 checkpoint (bundled name, local directory or hub name) onto `device`.

    device defaults to CUDA when available, else CPU; dtype to float16 on CUDA, float32 on CPU.
    Non-GPT-2 checkpoints raise ValueError naming their model_type.
    """
    name = str(name_or_path) if name_or_path is not None else DEFAULT_MODEL
    device = torch.device(device) if device is not None else default_device()
    dtype = dtype if dtype is not None else default_dtype(device)
    source = resolve_model(name)
    kwargs = _hub_kwargs(name) if isinstance(source, str) else {}
    from transformers import AutoConfig, AutoTokenizer, GPT2LMHeadModel  # slow import: after the checks

    hf_config = _from_pretrained(AutoConfig, source, kwargs)
    config = GPT2Config.from_hf(hf_config)  # ValueError for any other model_type
    tokenizer = _from_pretrained(AutoTokenizer, source, kwargs)
    with _no_progress_bars():  # transformers' weight-loading bar: not for a library to print
        hf_model = _from_pretrained(GPT2LMHeadModel, source, {**kwargs, "dtype": dtype})
    model = GPT2.from_hf(hf_model, device=device)
    del hf_model
    logger.info(
        "loaded %s from %s: %d layers, %d heads, n_embd %d, vocab %d on %s/%s",
        name, source, config.n_layer, config.n_head, config.n_embd, config.vocab_size, device, dtype,
    )
    return LoadedModel(model, tokenizer, config, device, dtype, name, source, hf_config)


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

"""Attention backends: which code computes paged attention, and Triton kernels for CUDA.

Two backends compute the same thing (engine/attention.py defines it):
- "torch": engine/attention.py's paths in plain torch, gathering each sequence's blocks through
  its block table and attending with SDPA. The one to read first, and the default off CUDA.
- "triton": the kernels in this package. `store_kvcache.py` writes each new token's K/V straight
  into its slot (vLLM `reshape_and_cache`, nano-vllm `store_kvcache`); `paged_decode.py` walks the
  block table inside the kernel, one program per sequence and K/V head (vLLM's
  `paged_attention_v1`, FlashAttention's `flash_attn_with_kvcache`). Prefills go through the torch
  path. The default on CUDA when Triton imports.

Triton is optional: nothing here imports it until a triton backend is resolved, and kernels on
CPU tensors run only under Triton's interpreter (TRITON_INTERPRET=1, read when the kernel modules
are first imported), which is how the tests run them without a GPU.
"""

from __future__ import annotations

import importlib.util
import os

import torch

from engine.config import ATTENTION_BACKENDS


def triton_available() -> bool:
    """True when the triton package is installed (checked without importing it)."""
    return importlib.util.find_spec("triton") is not None


def triton_interpreting() -> bool:
    """True when Triton kernels run through its interpreter (TRITON_INTERPRET=1): on CPU tensors."""
    return os.environ.get("TRITON_INTERPRET", "0").lower() in ("1", "true", "on", "yes")


def default_attention_backend(device: torch.device | str) -> str:
    """triton on CUDA when Triton is installed, torch elsewhere."""
    return "triton" if torch.device(device).type == "cuda" and triton_available() else "torch"


def resolve_attention_backend(name: str | None, device: torch.device | str) -> str:
    """The backend to run on `device`: `name`, or the default when None.

    Raises ValueError (one line) when it cannot run there: an unknown name, triton without the
    triton package, or triton on a CPU without TRITON_INTERPRET=1.
    """
    device = torch.device(device)
    if name is None:
        return default_attention_backend(device)
    if name not in ATTENTION_BACKENDS:
        raise ValueError(f"attention backend must be one of {', '.join(ATTENTION_BACKENDS)}, got {name!r}")
    if name == "triton":
        if not triton_available():
            raise ValueError("attention backend triton: the triton package is not installed "
                             "(pip install triton), or use --attention-backend torch")
        if device.type == "cpu" and not triton_interpreting():
            raise ValueError("attention backend triton on the CPU runs only under Triton's interpreter: "
                             "set TRITON_INTERPRET=1, or use --attention-backend torch")
        if device.type not in ("cpu", "cuda"):
            raise ValueError(f"attention backend triton cannot run on device {device.type}")
    return name

"""What each attention layer keeps in the KV cache: a full history or a sliding window.

Reference: vLLM v1 `vllm/v1/kv_cache_interface.py` (`AttentionSpec`, `FullAttentionSpec`,
`SlidingWindowSpec`, `page_size_bytes`) and `GPUModelRunner.get_kv_cache_spec`, which asks every
attention layer for its spec; vLLM's KV-cache manager then groups layers with equal specs into
KV-cache groups (`vllm/v1/core/kv_cache_utils.py`). Here `kv_cache_specs` reads the specs off a
model config, one per layer in layer order (the cache engine's layer index), so a block manager
can group them without importing torch or touching the model.

Until the block manager keeps one block table per group, every layer keeps all its blocks; a
sliding layer's attention reads only its window (engine/attention.py `sliding_window`), so the
output is right and the out-of-window blocks are simply not freed yet.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True, slots=True)
class AttentionSpec:
    """One attention layer's KV-cache page: `block_size` tokens of K and V for `num_kv_heads`
    heads of `head_size` in `dtype` (a torch.dtype; vLLM `AttentionSpec`)."""

    block_size: int
    num_kv_heads: int
    head_size: int
    dtype: Any

    @property
    def page_size_bytes(self) -> int:
        """Bytes of one block of this layer, K and V (vLLM `AttentionSpec.page_size_bytes`)."""
        return 2 * self.block_size * self.num_kv_heads * self.head_size * self.dtype.itemsize


@dataclass(frozen=True, slots=True)
class FullAttentionSpec(AttentionSpec):
    """A layer that attends to the whole context: it needs every block of a request (vLLM
    `FullAttentionSpec`)."""


@dataclass(frozen=True, slots=True)
class SlidingWindowSpec(AttentionSpec):
    """A layer whose token at position p attends to positions p - sliding_window + 1 ... p (vLLM
    `SlidingWindowSpec`): blocks wholly before a request's window are never read again."""

    sliding_window: int = field(kw_only=True)

    def __post_init__(self) -> None:
        if self.sliding_window < 1:
            raise ValueError(f"sliding_window must be >= 1, got {self.sliding_window}")


def kv_cache_specs(model_config, block_size: int, dtype) -> tuple[AttentionSpec, ...]:
    """One spec per layer of a model config (engine.models: GPT2Config, LlamaConfig), in layer
    order (vLLM `GPUModelRunner.get_kv_cache_spec`). A config without `sliding_windows` (GPT-2) is
    full attention throughout."""
    windows = getattr(model_config, "sliding_windows", None) or (None,) * model_config.num_layers
    shape = dict(block_size=block_size, num_kv_heads=model_config.num_kv_heads, head_size=model_config.head_dim,
                 dtype=dtype)
    return tuple(FullAttentionSpec(**shape) if window is None else SlidingWindowSpec(**shape, sliding_window=window)
                 for window in windows)


def check_kv_manager(kv_manager: str, layer_types) -> None:
    """ValueError (one line) when block manager `kv_manager` cannot serve a model whose layers are
    `layer_types` (transformers' "full_attention" / "sliding_attention" per layer): v0 runs full
    attention only, as vLLM v0's BlockSpaceManager (one block table per sequence, no per-layer
    windows). The engine calls it, and engine.model_source.check_model before anything loads."""
    num_sliding = sum(kind == "sliding_attention" for kind in layer_types)
    if kv_manager == "v0" and num_sliding:
        raise ValueError(f"kv_manager 'v0' cannot run this model: {num_sliding} of its {len(layer_types)} layers use "
                         f"sliding-window attention, which vLLM v0 never served per layer; use --kv-manager v1")

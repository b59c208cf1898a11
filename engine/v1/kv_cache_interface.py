"""What the block manager needs to know of a layer's KV cache, and the KV-cache groups the layers
fall into (vLLM v1 `vllm/v1/kv_cache_interface.py`: KVCacheSpec, FullAttentionSpec,
SlidingWindowSpec, KVCacheGroupSpec; `vllm/v1/core/kv_cache_planning.py`: get_kv_cache_groups and
_get_kv_cache_groups_uniform_page_size).

A full-attention layer reads every earlier token's K/V; a sliding-window layer only the last
`sliding_window` tokens, so blocks that fall out of its window can go back to the pool. Layers
with the same spec share one block table per request: a KV-cache group. A model with one kind of
layer has one group (every model before hybrid ones); a hybrid model (say 2 full and 4
sliding-window layers) has several groups of as many layers each, over one pool, each with its
own table per request. The block manager reads only `block_size` and `sliding_window` of a spec,
so any spec objects with those attributes (the model's, with their page sizes) group the same.
vLLM's page-size unification, padding layers and its Mamba, MLA and chunked-local specs are left
out: the layers of one model here all have one page size.

`kv_cache_specs` reads a model config's specs, one per layer in layer order (vLLM
`GPUModelRunner.get_kv_cache_spec`, which asks each attention layer), with the page shape (KV heads,
head size, dtype) the cache engine allocates; the engine groups them with `get_kv_cache_groups`, and
kv_manager="vllm" hands the same specs to vLLM's own grouping (engine/vllm_core/config.py).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any


def cdiv(a: int, b: int) -> int:
    return -(-a // b)


@dataclass(frozen=True, slots=True)
class KVCacheSpec:
    """A layer's KV cache as the block manager sees it: tokens per block (vLLM KVCacheSpec)."""

    block_size: int

    def __post_init__(self) -> None:
        if not isinstance(self.block_size, int) or self.block_size < 1:
            raise ValueError(f"block_size must be a positive integer, got {self.block_size!r}")


@dataclass(frozen=True, slots=True)
class AttentionSpec(KVCacheSpec):
    """An attention layer's page: `block_size` tokens of K and V for `num_kv_heads` heads of
    `head_size` in `dtype`, a torch.dtype (vLLM AttentionSpec). The block manager reads only
    block_size; a spec made for it alone (KVCacheManager's default group, the block-manager
    tests) leaves the shape out, and has no page size."""

    num_kv_heads: int = field(default=1, kw_only=True)
    head_size: int = field(default=1, kw_only=True)
    dtype: Any = field(default=None, kw_only=True)

    @property
    def page_size_bytes(self) -> int:
        """Bytes of one block of this layer, K and V (vLLM AttentionSpec.page_size_bytes)."""
        if self.dtype is None:
            raise ValueError("a spec without a dtype has no page size")
        return 2 * self.block_size * self.num_kv_heads * self.head_size * self.dtype.itemsize


@dataclass(frozen=True, slots=True)
class FullAttentionSpec(AttentionSpec):
    """A layer that attends over every earlier token (vLLM FullAttentionSpec)."""


@dataclass(frozen=True, slots=True)
class SlidingWindowSpec(AttentionSpec):
    """A layer whose token at position p attends over positions p - sliding_window + 1 .. p
    (vLLM SlidingWindowSpec): blocks wholly before a request's window are never read again."""

    sliding_window: int = field(kw_only=True)

    def __post_init__(self) -> None:
        KVCacheSpec.__post_init__(self)
        if not isinstance(self.sliding_window, int) or self.sliding_window < 1:
            raise ValueError(f"sliding_window must be a positive integer, got {self.sliding_window!r}")


def sliding_window_of(spec) -> int | None:
    """The spec's window, or None for full attention."""
    return getattr(spec, "sliding_window", None)


def max_admission_blocks_per_request(spec, max_in_flight_tokens: int, max_model_len: int) -> int | None:
    """The most blocks one request holds at once in a sliding-window group: the window's last
    sliding_window - 1 tokens plus those scheduled, and one more since the window need not start
    on a block boundary (vLLM SlidingWindowSpec.max_admission_blocks_per_request); None (no cap)
    for full attention."""
    window = sliding_window_of(spec)
    if window is None:
        return None
    return cdiv(min(window - 1 + max_in_flight_tokens, max_model_len), spec.block_size) + 1


@dataclass(frozen=True)
class KVCacheGroupSpec:
    """Layers that share one block table per request (vLLM KVCacheGroupSpec)."""

    layer_names: list[str]
    kv_cache_spec: KVCacheSpec


def get_kv_cache_groups(layer_specs: Sequence) -> list[KVCacheGroupSpec]:
    """Split the layers, given one spec each in layer order (a layer's name is its index), into
    KV-cache groups (vLLM get_kv_cache_groups, for specs of one page size).

    All full attention, or all sliding windows of one width: one group of every layer. Otherwise
    (vLLM _get_kv_cache_groups_uniform_page_size): layers of equal spec are bucketed in the order
    first seen; the group size is the smallest bucket's layer count (the largest, if no bucket has
    1.5 times the smallest's); a bucket splits into cdiv(len, group size) groups, group i taking
    its layers[i::num_groups]. Gemma-3-like 5 windows : 1 full gives (full), (w0, w5, ...),
    (w1, w6, ...), ... and 2 full : 4 windows gives (f0, f1), (w0, w2), (w1, w3)."""
    if not layer_specs:
        raise ValueError("a model needs at least one attention layer")
    names = [str(index) for index in range(len(layer_specs))]
    windows = {sliding_window_of(spec) for spec in layer_specs}
    if len(windows) == 1:
        return [KVCacheGroupSpec(names, layer_specs[0])]
    buckets: dict[object, list[str]] = {}
    for name, spec in zip(names, layer_specs):
        buckets.setdefault(spec, []).append(name)
    sizes = [len(layers) for layers in buckets.values()]
    group_size = max(sizes) if max(sizes) < min(sizes) * 1.5 else min(sizes)
    groups = []
    for spec, layers in buckets.items():
        num_groups = cdiv(len(layers), group_size)
        groups.extend(KVCacheGroupSpec(layers[i::num_groups], spec) for i in range(num_groups))
    return groups


def kv_cache_specs(model_config, block_size: int, dtype=None) -> tuple[AttentionSpec, ...]:
    """One spec per layer of a model config (engine.models: GPT2Config, LlamaConfig), in layer
    order (vLLM GPUModelRunner.get_kv_cache_spec): SlidingWindowSpec for a layer with a window in
    its `sliding_windows` (None for a full-attention layer), FullAttentionSpec otherwise; a config
    without `sliding_windows` (GPT-2) is full attention throughout."""
    windows = getattr(model_config, "sliding_windows", None) or (None,) * model_config.num_layers
    shape = dict(num_kv_heads=model_config.num_kv_heads, head_size=model_config.head_dim, dtype=dtype)
    return tuple(FullAttentionSpec(block_size, **shape) if window is None
                 else SlidingWindowSpec(block_size, **shape, sliding_window=window) for window in windows)

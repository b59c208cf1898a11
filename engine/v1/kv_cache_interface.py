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
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field


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
class FullAttentionSpec(KVCacheSpec):
    """A layer that attends over every earlier token (vLLM FullAttentionSpec)."""


@dataclass(frozen=True, slots=True)
class SlidingWindowSpec(KVCacheSpec):
    """A layer whose token at position p attends over positions p - sliding_window + 1 .. p
    (vLLM SlidingWindowSpec)."""

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


def get_kv_cache_groups_for_model(model_config, block_size: int) -> list[KVCacheGroupSpec]:
    """The KV-cache groups of a model config: its `sliding_windows` (one per layer, None for a
    full-attention layer) where it has them, one full-attention group otherwise (GPT-2)."""
    windows = getattr(model_config, "sliding_windows", None) or (None,) * model_config.num_layers
    return get_kv_cache_groups([FullAttentionSpec(block_size) if window is None
                                else SlidingWindowSpec(block_size, sliding_window=window) for window in windows])

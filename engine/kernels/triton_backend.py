"""The triton attention backend's two operations, with the signatures engine/attention.py's
`paged_attention` calls (the torch backend's are `write_to_cache` and `decode_attention_by_length`).

Importing this module imports Triton and compiles nothing yet; under TRITON_INTERPRET=1 (read at
that import) the kernels run on CPU tensors through Triton's interpreter.
"""

from __future__ import annotations

import torch

from engine.kernels.paged_decode import paged_decode_attention
from engine.kernels.store_kvcache import store_kvcache

__all__ = ["store_kvcache", "decode_attention"]


def decode_attention(query: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, meta, scale: float,
                     sliding_window: int | None = None) -> torch.Tensor:
    """The step's single-token queries, (num_decodes, num_heads, head_dim), attended by the paged
    decode kernel over the block tables of `meta` (an engine.attention.AttentionMetadata), within
    the layer's `sliding_window` when it has one."""
    if meta.decode_only:
        return paged_decode_attention(query, k_cache, v_cache, meta.block_tables, meta.context_lens_tensor, scale,
                                      sliding_window)
    rows = torch.tensor([i for i, q in enumerate(meta.query_lens) if q == 1], device=query.device)
    return paged_decode_attention(query, k_cache, v_cache, meta.block_tables.index_select(0, rows),
                                  meta.context_lens_tensor.index_select(0, rows), scale, sliding_window)

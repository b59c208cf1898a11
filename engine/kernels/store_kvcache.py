"""Triton kernel: write a step's new K/V into their cache slots through the slot mapping.

References: vLLM `csrc/cache_kernels.cu` `reshape_and_cache_kernel` (one program per token, slot
-1 means padding: nothing is written) and nano-vllm `nanovllm/layers/attention.py`
`store_kvcache_kernel`. The torch equivalent is engine/attention.py `write_to_cache`.

The cache is addressed through its strides, so the kernel serves CacheEngine's head-major storage
(`head_major`) and a plain block-major tensor alike: the slot of token t is
`slot_mapping[t] = block * block_size + offset`, and head h of it lives at
`block * stride_block + offset * stride_slot + h * stride_head`.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl


@triton.jit
def _store_kvcache_kernel(
    key_ptr, value_ptr,  # (num_tokens, num_kv_heads, head_dim), last dim contiguous
    k_cache_ptr, v_cache_ptr,  # (num_blocks, block_size, num_kv_heads, head_dim), any strides
    slot_mapping_ptr,  # (num_tokens,) int64
    key_stride_token, key_stride_head, value_stride_token, value_stride_head,
    cache_stride_block, cache_stride_slot, cache_stride_head,
    block_size, num_kv_heads, head_dim,
    HEADS: tl.constexpr, HEAD_DIM: tl.constexpr,  # powers of two >= num_kv_heads, head_dim
):
    token = tl.program_id(0).to(tl.int64)
    slot = tl.load(slot_mapping_ptr + token)  # int64
    block = slot // block_size
    offset = slot % block_size
    heads = tl.arange(0, HEADS)
    dims = tl.arange(0, HEAD_DIM)
    # slot broadcast to the tile before comparing: Triton's interpreter mistypes `tile & scalar`
    padding = tl.zeros((HEADS, HEAD_DIM), tl.int64) + slot < 0
    mask = (heads[:, None] < num_kv_heads) & (dims[None, :] < head_dim) & ~padding  # (HEADS, HEAD_DIM)
    key = tl.load(key_ptr + token * key_stride_token + heads[:, None] * key_stride_head + dims[None, :], mask=mask)
    value = tl.load(value_ptr + token * value_stride_token + heads[:, None] * value_stride_head + dims[None, :],
                    mask=mask)
    dst = block * cache_stride_block + offset * cache_stride_slot + heads[:, None] * cache_stride_head + dims[None, :]
    tl.store(k_cache_ptr + dst, key, mask=mask)
    tl.store(v_cache_ptr + dst, value, mask=mask)


def store_kvcache(
    key: torch.Tensor, value: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, slot_mapping: torch.Tensor
) -> None:
    """Write key[t] and value[t] into slot slot_mapping[t] of k_cache and v_cache (a negative slot
    is skipped), in place (vLLM `reshape_and_cache`).

    key, value: (num_tokens, num_kv_heads, head_dim); caches (num_blocks, block_size, num_kv_heads,
    head_dim) with equal strides and a contiguous last dimension.
    """
    num_tokens, num_kv_heads, head_dim = key.shape
    if k_cache.stride() != v_cache.stride() or k_cache.stride(-1) != 1:
        raise ValueError("store_kvcache needs K and V caches with equal strides and a contiguous head_dim")
    if num_tokens == 0:
        return
    key = key if key.stride(-1) == 1 else key.contiguous()
    value = value if value.stride(-1) == 1 else value.contiguous()
    block_size = k_cache.shape[1]
    stride_block, stride_slot, stride_head, _ = k_cache.stride()
    _store_kvcache_kernel[(num_tokens,)](
        key, value, k_cache, v_cache, slot_mapping,
        key.stride(0), key.stride(1), value.stride(0), value.stride(1),
        stride_block, stride_slot, stride_head,
        block_size, num_kv_heads, head_dim,
        HEADS=triton.next_power_of_2(num_kv_heads), HEAD_DIM=triton.next_power_of_2(head_dim),
    )

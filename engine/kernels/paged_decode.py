"""Triton kernel: paged decode attention that walks each sequence's block table inside the kernel.

References: vLLM `csrc/attention/attention_kernels.cuh` (`paged_attention_v1`: one program per
sequence and head, keys read block by block through the block table), FlashAttention-2's online
softmax, and vLLM's `triton_decode_attention.py` / `triton_unified_attention.py` (grouped-query
programs: one K/V head's keys are loaded once for every query head it serves). The torch
equivalent is engine/attention.py `decode_attention_by_length` (gather, then SDPA); the reference
is `reference_paged_attention`.

One program per (sequence, K/V head). Its query is the (group_size, head_dim) tile of the query
heads that share this K/V head (HF `repeat_kv`: K/V head j serves query heads
j * group_size ... (j + 1) * group_size - 1). It walks the context TILE keys at a time: key at
position p lives in block `block_table[p // block_size]`, slot `p % block_size`, so any block size
works (a tile spans several small blocks or part of a large one). A running max, a running sum and
an output accumulator in float32 (online softmax) make one pass over the keys.

A sliding-window layer (vLLM `SlidingWindowSpec`) starts the walk at position
max(0, context_len - sliding_window): the query sees its last sliding_window keys, its own included,
and blocks before the window are never read (vLLM `triton_unified_attention.py` takes the window as
its constexpr SLIDING_WINDOW, a key at distance < SLIDING_WINDOW from the query being seen).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl


@triton.jit
def _paged_decode_kernel(
    out_ptr, query_ptr,  # (num_seqs, num_heads, head_dim), last dim contiguous
    k_cache_ptr, v_cache_ptr,  # (num_blocks, block_size, num_kv_heads, head_dim), any strides
    block_tables_ptr,  # (num_seqs, max_num_blocks) int64
    context_lens_ptr,  # (num_seqs,) int64
    scale,
    sliding_window,  # read only when SLIDING
    query_stride_seq, query_stride_head, out_stride_seq, out_stride_head, block_tables_stride,
    cache_stride_block, cache_stride_slot, cache_stride_head,
    block_size, head_dim, group_size,
    GROUP: tl.constexpr, HEAD_DIM: tl.constexpr, TILE: tl.constexpr,  # powers of two
    SLIDING: tl.constexpr,  # a sliding-window layer: keys before context_len - sliding_window are skipped
):
    seq = tl.program_id(0).to(tl.int64)
    kv_head = tl.program_id(1).to(tl.int64)
    context_len = tl.load(context_lens_ptr + seq)
    first_key = 0
    if SLIDING:
        first_key = tl.maximum(context_len - sliding_window, 0)

    groups = tl.arange(0, GROUP)
    dims = tl.arange(0, HEAD_DIM)
    heads = kv_head * group_size + groups  # (GROUP,) the query heads this K/V head serves
    q_mask = (groups[:, None] < group_size) & (dims[None, :] < head_dim)  # (GROUP, HEAD_DIM)
    q = tl.load(query_ptr + seq * query_stride_seq + heads[:, None] * query_stride_head + dims[None, :],
                mask=q_mask, other=0.0).to(tl.float32)  # (GROUP, HEAD_DIM)

    running_max = tl.full((GROUP,), float("-inf"), tl.float32)
    running_sum = tl.zeros((GROUP,), tl.float32)
    acc = tl.zeros((GROUP, HEAD_DIM), tl.float32)
    for start in range(first_key, context_len, TILE):
        positions = start + tl.arange(0, TILE)  # (TILE,)
        in_context = positions < context_len
        blocks = tl.load(block_tables_ptr + seq * block_tables_stride + positions // block_size,
                         mask=in_context, other=0)  # (TILE,) physical block of each key
        rows = blocks * cache_stride_block + (positions % block_size) * cache_stride_slot + kv_head * cache_stride_head
        kv_mask = in_context[:, None] & (dims[None, :] < head_dim)  # (TILE, HEAD_DIM)
        k = tl.load(k_cache_ptr + rows[:, None] + dims[None, :], mask=kv_mask, other=0.0).to(tl.float32)
        v = tl.load(v_cache_ptr + rows[:, None] + dims[None, :], mask=kv_mask, other=0.0).to(tl.float32)

        scores = tl.sum(q[:, None, :] * k[None, :, :], axis=2) * scale  # (GROUP, TILE)
        scores = tl.where(in_context[None, :], scores, float("-inf"))
        new_max = tl.maximum(running_max, tl.max(scores, axis=1))  # (GROUP,)
        correction = tl.exp(running_max - new_max)  # rescales what was summed under the old max
        p = tl.exp(scores - new_max[:, None])  # (GROUP, TILE)
        running_sum = running_sum * correction + tl.sum(p, axis=1)
        acc = acc * correction[:, None] + tl.sum(p[:, :, None] * v[None, :, :], axis=1)  # (GROUP, HEAD_DIM)
        running_max = new_max

    # a padding row (context_len 0, a CUDA graph's unused rows) saw no key: 0, not 0 / 0
    out = acc / tl.where(running_sum > 0, running_sum, 1.0)[:, None]
    tl.store(out_ptr + seq * out_stride_seq + heads[:, None] * out_stride_head + dims[None, :],
             out.to(out_ptr.dtype.element_ty), mask=q_mask)


def paged_decode_attention(
    query: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    block_tables: torch.Tensor,
    context_lens: torch.Tensor,
    scale: float,
    sliding_window: int | None = None,
) -> torch.Tensor:
    """Single-token queries attended over their sequences' cached keys and values, read through
    the block tables (vLLM `paged_attention_v1`, nano-vllm's `flash_attn_with_kvcache` call); with
    a `sliding_window`, over each sequence's last sliding_window keys only.

    query: (num_seqs, num_heads, head_dim); caches (num_blocks, block_size, num_kv_heads,
    head_dim) with equal strides, num_heads a multiple of num_kv_heads; block_tables (num_seqs,
    max_num_blocks) int64 covering each context; context_lens (num_seqs,) int64, each >= 0 (a
    row of context 0 is padding: it reads nothing and its output is 0).
    Returns (num_seqs, num_heads, head_dim) in the query's dtype.
    """
    num_seqs, num_heads, head_dim = query.shape
    block_size, num_kv_heads = k_cache.shape[1], k_cache.shape[2]
    if num_heads % num_kv_heads:
        raise ValueError(f"{num_heads} query heads cannot share {num_kv_heads} K/V heads evenly")
    if k_cache.stride() != v_cache.stride() or k_cache.stride(-1) != 1:
        raise ValueError("paged_decode_attention needs K and V caches with equal strides and a contiguous head_dim")
    query = query if query.stride(-1) == 1 else query.contiguous()
    out = torch.empty(num_seqs, num_heads, head_dim, dtype=query.dtype, device=query.device)
    if num_seqs == 0:
        return out
    group_size = num_heads // num_kv_heads
    stride_block, stride_slot, stride_head, _ = k_cache.stride()
    _paged_decode_kernel[(num_seqs, num_kv_heads)](
        out, query, k_cache, v_cache, block_tables, context_lens, scale, sliding_window or 0,
        query.stride(0), query.stride(1), out.stride(0), out.stride(1), block_tables.stride(0),
        stride_block, stride_slot, stride_head,
        block_size, head_dim, group_size,
        GROUP=triton.next_power_of_2(group_size), HEAD_DIM=triton.next_power_of_2(head_dim),
        TILE=max(16, min(64, triton.next_power_of_2(block_size))), SLIDING=sliding_window is not None,
    )
    return out

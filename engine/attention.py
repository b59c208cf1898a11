"""Paged attention in plain torch, and the per-step metadata that drives it.

References: vLLM v0 `vllm/attention/backends/torch_sdpa.py` (TorchSDPAMetadata, the
`slot_mapping` / `block_tables` / `seq_lens` fields) and `vllm/_custom_ops.reshape_and_cache`;
nano-vllm `nanovllm/layers/attention.py` (store_kvcache + flash_attn_with_kvcache). Unlike
nano-vllm there is no module-global context: every forward receives an `AttentionMetadata`.

The KV cache of one layer is a pair of tensors shaped (num_blocks, block_size, num_kv_heads,
head_dim). A token at position `pos` of a sequence lives in physical slot
`block_table[pos // block_size] * block_size + pos % block_size`. The code reads the caches
through a (num_kv_heads, num_blocks, block_size, head_dim) permuted view; CacheEngine stores
them in that order (fastest), plain contiguous caches work too.

A sequence in a step contributes `query_len` new tokens whose positions are the LAST `query_len`
positions of a context of `context_len` tokens. That one rule covers
- prefill from scratch (query_len == context_len),
- prefill of an uncached suffix after prefix-cache hits (query_len < context_len, the first
  context_len - query_len tokens are already in the cache),
- decode (query_len == 1).
Sequences with query_len == 1 are batched: sorted by length and cut into a few groups of similar
length (`DecodeGroup`), each one gather + one SDPA call, so short sequences are not padded to the
longest one's blocks. The others loop.
"""

from __future__ import annotations

import bisect
from collections.abc import Sequence
from dataclasses import dataclass

import torch
import torch.nn.functional as F


# Decode batching: at most this many length groups, and a further cut is made only if it saves at
# least this many padded blocks to gather (a group costs a few extra small ops per layer).
MAX_DECODE_GROUPS = 4
MIN_BLOCKS_SAVED_PER_GROUP = 8


@dataclass(slots=True)
class DecodeGroup:
    """Decode sequences of similar length, attended with one gather + one SDPA call."""

    rows: torch.Tensor | None  # (n,) int64, the group's rows in the decode batch; None: all rows, in order
    block_tables: torch.Tensor  # (n, num_blocks) int64, padded with block 0
    key_mask: torch.Tensor  # (n, 1, 1, num_blocks * block_size) bool, True where key position < context_len


def length_groups(num_blocks: Sequence[int], max_groups: int, min_saved: int) -> list[list[int]]:
    """Indices of `num_blocks` sorted by value and cut into at most `max_groups` runs (a single
    group keeps the original order).

    Greedy: repeatedly make the cut that saves the most padding (blocks gathered beyond each
    sequence's own), as long as it saves at least `min_saved` blocks. Plain Python, O(n * groups).
    """
    order = sorted(range(len(num_blocks)), key=num_blocks.__getitem__)
    counts = [num_blocks[i] for i in order]  # ascending
    cuts = [0, len(order)]  # group g is order[cuts[g] : cuts[g + 1]]
    while len(cuts) <= max_groups:
        best_saved, best_cut = min_saved - 1, None
        for start, end in zip(cuts, cuts[1:]):
            width = counts[end - 1]  # the group's padded block count
            for j in range(start + 1, end):
                # cutting before j pads order[start:j] to counts[j - 1] instead of width
                saved = (j - start) * (width - counts[j - 1])
                if saved > best_saved:
                    best_saved, best_cut = saved, j
        if best_cut is None:
            break
        bisect.insort(cuts, best_cut)
    if len(cuts) == 2:
        return [list(range(len(order)))]  # no cut: one group, in the original order
    return [order[start:end] for start, end in zip(cuts, cuts[1:])]


@dataclass(slots=True)
class AttentionMetadata:
    """Everything attention needs for one engine step (vLLM v0 `AttentionMetadata`).

    Tokens of all sequences are flattened into one batch, sequence after sequence, each
    sequence's new tokens contiguous and in position order. Build it with `AttentionMetadata.build`.
    """

    slot_mapping: torch.Tensor  # (num_tokens,) int64, where each new token's K/V is written
    positions: torch.Tensor  # (num_tokens,) int64, absolute position of each new token
    block_tables: torch.Tensor  # (num_seqs, max_num_blocks) int64, padded with block 0
    context_lens_tensor: torch.Tensor  # (num_seqs,) int64
    query_start_loc: torch.Tensor  # (num_seqs + 1,) int64, cumulative query_lens from 0
    query_starts: tuple[int, ...]  # query_start_loc as Python ints (no device sync to slice)
    last_token_indices: torch.Tensor  # (num_seqs,) int64, index of each seq's last new token
    query_lens: tuple[int, ...]  # new tokens per sequence
    context_lens: tuple[int, ...]  # total tokens per sequence, including the new ones
    block_size: int
    # The split between the per-sequence path (query_len > 1) and the batched path (== 1).
    prefill_seq_ids: tuple[int, ...]
    decode_token_ids: torch.Tensor  # (num_decodes,) int64, token index of each decode query
    decode_groups: tuple[DecodeGroup, ...]  # the decodes cut into groups of similar length
    decode_only: bool  # every sequence has query_len == 1 (token i belongs to sequence i)

    @classmethod
    def build(
        cls,
        block_tables: Sequence[Sequence[int]],
        query_lens: Sequence[int],
        context_lens: Sequence[int],
        block_size: int,
        device: torch.device | str = "cpu",
    ) -> AttentionMetadata:
        """Build the metadata of one step from plain Python lists.

        Signature: `build(block_tables, query_lens, context_lens, block_size, device="cpu")`
        - block_tables: per sequence, its physical block numbers in logical order (list of
          ints); it must cover `context_len` tokens. Blocks may be shared between sequences
          (prefix caching, forks) and need not be contiguous or ordered.
        - query_lens: per sequence, the number of tokens fed this step (>= 1).
        - context_lens: per sequence, its total length after this step's tokens are written
          (>= query_len). The new tokens sit at positions context_len - query_len ... context_len - 1.
        - block_size: tokens per block, the same as the cache's.
        - device: where the tensors go (the model's device).

        The caller passes the model `input_ids` in the same order (sequence after sequence)
        and may use `meta.positions` as the positions argument, and
        `hidden[meta.last_token_indices]` to pick each sequence's last token for sampling.
        """
        num_seqs = len(block_tables)
        if not (num_seqs == len(query_lens) == len(context_lens)):
            raise ValueError(
                f"block_tables, query_lens and context_lens differ in length: "
                f"{num_seqs}, {len(query_lens)}, {len(context_lens)}"
            )
        if num_seqs == 0:
            raise ValueError("AttentionMetadata needs at least one sequence")
        if block_size < 1:
            raise ValueError(f"block_size must be >= 1, got {block_size}")

        slot_mapping: list[int] = []
        positions: list[int] = []
        for i, (table, q, ctx) in enumerate(zip(block_tables, query_lens, context_lens)):
            if not 1 <= q <= ctx:
                raise ValueError(f"sequence {i}: need 1 <= query_len <= context_len, got {q}, {ctx}")
            if len(table) * block_size < ctx:
                raise ValueError(
                    f"sequence {i}: block table of {len(table)} blocks x {block_size} "
                    f"cannot hold {ctx} tokens"
                )
            start = ctx - q
            positions.extend(range(start, ctx))
            slot_mapping.extend(table[p // block_size] * block_size + p % block_size for p in range(start, ctx))

        def as_tensor(values) -> torch.Tensor:
            return torch.tensor(values, dtype=torch.int64, device=device)

        def padded(tables: list[Sequence[int]], lens: list[int]) -> list[list[int]]:
            width = max(-(-n // block_size) for n in lens)
            return [list(t[:width]) + [0] * (width - min(len(t), width)) for t in tables]

        query_start_loc = [0]
        for q in query_lens:
            query_start_loc.append(query_start_loc[-1] + q)

        decode_seq_ids = [i for i, q in enumerate(query_lens) if q == 1]
        prefill_seq_ids = tuple(i for i, q in enumerate(query_lens) if q > 1)
        decode_groups = []
        if decode_seq_ids:
            decode_lens = [context_lens[i] for i in decode_seq_ids]
            groups = length_groups(
                [-(-n // block_size) for n in decode_lens], MAX_DECODE_GROUPS, MIN_BLOCKS_SAVED_PER_GROUP
            )
            for rows in groups:
                lens = [decode_lens[r] for r in rows]
                tables = as_tensor(padded([block_tables[decode_seq_ids[r]] for r in rows], lens))
                num_keys = tables.shape[1] * block_size
                # (n, 1, 1, num_keys): True where key position < context_len
                key_mask = (torch.arange(num_keys, device=device)[None, :] < as_tensor(lens)[:, None])[:, None, None, :]
                decode_groups.append(DecodeGroup(None if len(groups) == 1 else as_tensor(rows), tables, key_mask))

        return cls(
            slot_mapping=as_tensor(slot_mapping),
            positions=as_tensor(positions),
            block_tables=as_tensor(padded(list(block_tables), list(context_lens))),
            context_lens_tensor=as_tensor(list(context_lens)),
            query_start_loc=as_tensor(query_start_loc),
            query_starts=tuple(query_start_loc),
            last_token_indices=as_tensor([s - 1 for s in query_start_loc[1:]]),
            query_lens=tuple(int(q) for q in query_lens),
            context_lens=tuple(int(c) for c in context_lens),
            block_size=block_size,
            prefill_seq_ids=prefill_seq_ids,
            decode_token_ids=as_tensor([query_start_loc[i] for i in decode_seq_ids]),
            decode_groups=tuple(decode_groups),
            decode_only=not prefill_seq_ids,
        )

    @property
    def num_seqs(self) -> int:
        return len(self.query_lens)

    @property
    def num_tokens(self) -> int:
        return int(self.slot_mapping.shape[0])

    @property
    def num_prefills(self) -> int:
        return len(self.prefill_seq_ids)

    @property
    def num_decodes(self) -> int:
        return int(self.decode_token_ids.shape[0])

    @property
    def is_prefill(self) -> bool:
        """True when some sequence feeds more than one token this step."""
        return bool(self.prefill_seq_ids)


def write_to_cache(
    key: torch.Tensor, value: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, slot_mapping: torch.Tensor
) -> None:
    """Scatter new K/V into their slots (vLLM `reshape_and_cache`, nano-vllm `store_kvcache`)."""
    num_heads, head_dim = k_cache.shape[2:]
    # (num_kv_heads, num_blocks * block_size, head_dim) views share storage with the caches
    # (view, never reshape: a silent copy would drop the writes)
    head_major(k_cache).view(num_heads, -1, head_dim).index_copy_(1, slot_mapping, key.transpose(0, 1))
    head_major(v_cache).view(num_heads, -1, head_dim).index_copy_(1, slot_mapping, value.transpose(0, 1))


def head_major(cache: torch.Tensor) -> torch.Tensor:
    """(num_blocks, block_size, num_kv_heads, head_dim) -> a (num_kv_heads, num_blocks,
    block_size, head_dim) view. CacheEngine stores its pools in this order, so gathering blocks
    from it yields per-head contiguous (keys, head_dim) rows, which SDPA reads faster on CPU."""
    return cache.permute(2, 0, 1, 3)


def paged_attention(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    k_cache: torch.Tensor | None,
    v_cache: torch.Tensor | None,
    meta: AttentionMetadata,
    scale: float,
) -> torch.Tensor:
    """Reference paged attention: write new K/V to the cache, attend over each sequence's blocks.

    query, key, value: (num_tokens, num_heads, head_dim). Caches: (num_blocks, block_size,
    num_kv_heads, head_dim), or None for a cache-less profiling run (then every sequence must be
    a prefill from scratch). Returns (num_tokens, num_heads, head_dim).
    Mirrors vLLM v0 `TorchSDPABackendImpl.forward` (prefill) + `PagedAttention.forward_decode`.
    """
    has_cache = k_cache is not None and v_cache is not None and k_cache.numel() > 0
    if has_cache:
        write_to_cache(key, value, k_cache, v_cache, meta.slot_mapping)

    if meta.decode_only and has_cache:
        return _decode_attention(query, k_cache, v_cache, meta, scale)

    output = torch.empty_like(query)  # (num_tokens, num_heads, head_dim)
    for i in meta.prefill_seq_ids:
        start, end = meta.query_starts[i], meta.query_starts[i + 1]
        q_len, ctx = meta.query_lens[i], meta.context_lens[i]
        # 4-D (1, num_heads, len, head_dim): SDPA's fused CPU kernel skips 3-D inputs
        q = query[start:end].transpose(0, 1).unsqueeze(0)  # (1, num_heads, q_len, head_dim)
        if q_len == ctx:  # nothing cached before: attend over the fresh K/V
            k = key[start:end].transpose(0, 1).unsqueeze(0)  # (1, num_heads, ctx, head_dim)
            v = value[start:end].transpose(0, 1).unsqueeze(0)
            out = F.scaled_dot_product_attention(q, k, v, is_causal=True, scale=scale)
        else:
            if not has_cache:
                raise ValueError("a prefill over cached blocks needs a KV cache")
            k, v = _gather_sequence(k_cache, v_cache, meta.block_tables[i], ctx)
            # (q_len, ctx): query j sits at position ctx - q_len + j and sees keys <= it
            # (bottom-right causal; SDPA's is_causal is top-left aligned when q_len != ctx)
            mask = torch.ones(q_len, ctx, dtype=torch.bool, device=q.device).tril(ctx - q_len)
            out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=scale)
        output[start:end] = out[0].transpose(0, 1)
    if meta.num_decodes:
        if not has_cache:
            raise ValueError("decode steps need a KV cache")
        output[meta.decode_token_ids] = _decode_attention(
            query[meta.decode_token_ids], k_cache, v_cache, meta, scale
        )
    return output


def _gather_sequence(
    k_cache: torch.Tensor, v_cache: torch.Tensor, block_table: torch.Tensor, ctx: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """One sequence's first `ctx` keys and values, each (1, num_heads, ctx, head_dim)."""
    block_size, num_heads, head_dim = k_cache.shape[1:]
    blocks = block_table[: -(-ctx // block_size)]
    k = head_major(k_cache).index_select(1, blocks).view(num_heads, -1, head_dim)[:, :ctx]  # (num_heads, ctx, head_dim)
    v = head_major(v_cache).index_select(1, blocks).view(num_heads, -1, head_dim)[:, :ctx]
    return k.unsqueeze(0), v.unsqueeze(0)


def _decode_attention(
    query: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, meta: AttentionMetadata, scale: float
) -> torch.Tensor:
    """All single-token queries: per length group, one gather by block table, one masked SDPA call.

    query: (num_decodes, num_heads, head_dim) -> (num_decodes, num_heads, head_dim).
    """
    if len(meta.decode_groups) == 1:
        return _decode_group(query, k_cache, v_cache, meta.decode_groups[0], scale)
    output = torch.empty_like(query)  # (num_decodes, num_heads, head_dim)
    for group in meta.decode_groups:
        out = _decode_group(query.index_select(0, group.rows), k_cache, v_cache, group, scale)
        output.index_copy_(0, group.rows, out)
    return output


def _decode_group(
    query: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, group: DecodeGroup, scale: float
) -> torch.Tensor:
    """One group's single-token queries, (n, num_heads, head_dim) -> (n, num_heads, head_dim)."""
    n, num_heads, head_dim = query.shape
    blocks = group.block_tables.flatten()  # (n * num_blocks,)
    # index_select, not k_cache[tables]: a row gather, several times faster on CPU
    kv = _kv_pair(k_cache, v_cache)
    if kv is not None:  # one gather for K and V, ~1.7x faster than two on CPU
        # (2, num_heads, n * num_blocks, block_size, head_dim) -> 2 x (n, num_heads, num_keys, head_dim)
        k, v = kv.index_select(2, blocks).view(2, num_heads, n, -1, head_dim).transpose(1, 2)
    else:
        # (num_heads, n * num_blocks, block_size, head_dim) -> (n, num_heads, num_keys, head_dim)
        k = head_major(k_cache).index_select(1, blocks).view(num_heads, n, -1, head_dim).transpose(0, 1)
        v = head_major(v_cache).index_select(1, blocks).view(num_heads, n, -1, head_dim).transpose(0, 1)
    q = query.unsqueeze(2)  # (n, num_heads, 1, head_dim)
    out = F.scaled_dot_product_attention(q, k, v, attn_mask=group.key_mask, scale=scale)
    return out.squeeze(2)


def _kv_pair(k_cache: torch.Tensor, v_cache: torch.Tensor) -> torch.Tensor | None:
    """Both caches as one (2, num_kv_heads, num_blocks, block_size, head_dim) view, when V sits at
    a fixed offset after K in the same storage with the same strides (CacheEngine's layer slices of
    `_gpu_kv`); None otherwise (e.g. two separately allocated tensors)."""
    k, v = head_major(k_cache), head_major(v_cache)
    offset = v.storage_offset() - k.storage_offset()
    if offset <= 0 or k.stride() != v.stride() or k.untyped_storage().data_ptr() != v.untyped_storage().data_ptr():
        return None
    return k.as_strided((2, *k.shape), (offset, *k.stride()), k.storage_offset())

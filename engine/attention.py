"""Paged attention in plain torch, and the per-step metadata that drives it.

References: vLLM v0 `vllm/attention/backends/torch_sdpa.py` (TorchSDPAMetadata, the
`slot_mapping` / `block_tables` / `seq_lens` fields) and `vllm/_custom_ops.reshape_and_cache`;
nano-vllm `nanovllm/layers/attention.py` (store_kvcache + flash_attn_with_kvcache). Unlike
nano-vllm there is no module-global context: every forward receives an `AttentionMetadata`.

The KV cache of one layer is a pair of tensors shaped (num_blocks, block_size, num_kv_heads,
head_dim). A token at position `pos` of a sequence lives in physical slot
`block_table[pos // block_size] * block_size + pos % block_size`.

A sequence in a step contributes `query_len` new tokens whose positions are the LAST `query_len`
positions of a context of `context_len` tokens. That one rule covers
- prefill from scratch (query_len == context_len),
- prefill of an uncached suffix after prefix-cache hits (query_len < context_len, the first
  context_len - query_len tokens are already in the cache),
- decode (query_len == 1).

`reference_paged_attention` is the definition: write the new K/V into their slots, then for each
sequence gather its keys and values through its block table and attend with SDPA. The model
calls `paged_attention`, which computes the same thing with CPU fast paths, each named below and
tested against the reference (tests/test_attention.py): a prefill from scratch attends over its
fresh K/V without a gather, and decodes are batched in groups of similar length, each group one
gather and one SDPA call (`decode_attention_by_length`), K and V gathered together when the cache
engine stores them in one tensor (`stacked_kv`).

Sliding-window layers (Mistral, Qwen2/3 and Llama `layer_types`; vLLM `SlidingWindowSpec`) pass a
`sliding_window`: the token at position p attends to positions p - sliding_window + 1 ... p, its
own included (transformers `sliding_window_overlay`; FlashAttention's window (sliding_window - 1,
0) in vLLM). Every path reads only the blocks that hold the window: a prefill over cached blocks
gathers from the block of its first query's first key, a decode from the block holding position
context_len - sliding_window (`sliding_window_group`; the triton kernel starts its walk there).
"""

from __future__ import annotations

import bisect
from collections.abc import Sequence
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

# The SDPA kernels the engine lets torch pick from on CUDA, best first: FlashAttention, memory-efficient,
# math. Not cuDNN's: its attention graph raised `mha_graph.execute(...).is_good()` on the first prefill
# of a freshly sized pool on an H200 (torch 2.11, cu130), as PyTorch issues report for other shapes.
SDPA_BACKENDS_CUDA = [SDPBackend.FLASH_ATTENTION, SDPBackend.EFFICIENT_ATTENTION, SDPBackend.MATH]


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
    attention_backend: str = "torch"  # which code computes it: "torch" (this module) or "triton" (engine/kernels)
    # rows at the back may be a CUDA graph's padding (engine/cuda_graphs.py): slot -1, context 0
    padded: bool = False
    # decode_groups narrowed to each sliding window the step's layers use, made on first use
    # (`sliding_window_groups`): every layer of one window shares them
    window_decode_groups: dict[int, tuple[DecodeGroup, ...]] = field(default_factory=dict)

    @classmethod
    def build(
        cls,
        block_tables: Sequence[Sequence[int]],
        query_lens: Sequence[int],
        context_lens: Sequence[int],
        block_size: int,
        device: torch.device | str = "cpu",
        attention_backend: str = "torch",
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
        - attention_backend: "torch" or "triton" (engine/kernels), resolved by the caller.

        The caller passes the model `input_ids` in the same order (sequence after sequence)
        and may use `meta.positions` as the positions argument, and
        `hidden[meta.last_token_indices]` to pick each sequence's last token for sampling.
        """
        _check_step(block_tables, query_lens, context_lens, block_size)
        slot_mapping: list[int] = []
        positions: list[int] = []
        for table, q, ctx in zip(block_tables, query_lens, context_lens):
            positions.extend(range(ctx - q, ctx))
            slot_mapping.extend(table[p // block_size] * block_size + p % block_size for p in range(ctx - q, ctx))
        query_start_loc = [0]
        for q in query_lens:
            query_start_loc.append(query_start_loc[-1] + q)
        decode_seq_ids = [i for i, q in enumerate(query_lens) if q == 1]
        prefill_seq_ids = tuple(i for i, q in enumerate(query_lens) if q > 1)
        decode_tables = [block_tables[i] for i in decode_seq_ids]
        decode_lens = [context_lens[i] for i in decode_seq_ids]
        # every integer tensor of the step in one host-to-device copy
        (slots, positions_tensor, tables, lens, starts, last, decode_tokens) = to_device(
            [slot_mapping, positions, _padded(block_tables, context_lens, block_size), list(context_lens),
             query_start_loc, [s - 1 for s in query_start_loc[1:]], [query_start_loc[i] for i in decode_seq_ids]],
            device)
        return cls(
            slot_mapping=slots,
            positions=positions_tensor,
            block_tables=tables,
            context_lens_tensor=lens,
            query_start_loc=starts,
            query_starts=tuple(query_start_loc),
            last_token_indices=last,
            query_lens=tuple(int(q) for q in query_lens),
            context_lens=tuple(int(c) for c in context_lens),
            block_size=block_size,
            prefill_seq_ids=prefill_seq_ids,
            decode_token_ids=decode_tokens,
            decode_groups=_decode_groups(decode_tables, decode_lens, block_size, device),
            decode_only=not prefill_seq_ids,
            attention_backend=attention_backend,
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


def _check_step(
    block_tables: Sequence[Sequence[int]], query_lens: Sequence[int], context_lens: Sequence[int], block_size: int
) -> None:
    """ValueError unless the lists agree in length and every block table can hold its context."""
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
    for i, (table, q, ctx) in enumerate(zip(block_tables, query_lens, context_lens)):
        if not 1 <= q <= ctx:
            raise ValueError(f"sequence {i}: need 1 <= query_len <= context_len, got {q}, {ctx}")
        if len(table) * block_size < ctx:
            raise ValueError(
                f"sequence {i}: block table of {len(table)} blocks x {block_size} cannot hold {ctx} tokens"
            )


def _padded(tables: Sequence[Sequence[int]], lens: Sequence[int], block_size: int) -> list[list[int]]:
    """The tables cut or padded with block 0 to the blocks the longest of `lens` needs."""
    width = max(-(-n // block_size) for n in lens)
    return [list(t[:width]) + [0] * (width - min(len(t), width)) for t in tables]


def _decode_groups(
    tables: list[Sequence[int]], lens: list[int], block_size: int, device: torch.device | str
) -> tuple[DecodeGroup, ...]:
    """The decodes (their block tables and context lengths) cut into groups of similar length."""
    if not tables:
        return ()
    groups = length_groups([-(-n // block_size) for n in lens], MAX_DECODE_GROUPS, MIN_BLOCKS_SAVED_PER_GROUP)
    arrays = []  # per group: its lengths, its padded tables, its rows; all sent in one copy
    for rows in groups:
        arrays += [[lens[r] for r in rows], _padded([tables[r] for r in rows], [lens[r] for r in rows], block_size),
                   rows]
    sent = to_device(arrays, device)
    decode_groups = []
    for group_lens, block_tables, rows_tensor in zip(sent[0::3], sent[1::3], sent[2::3]):
        key_mask = decode_key_mask(group_lens, block_tables.shape[1] * block_size)
        decode_groups.append(DecodeGroup(None if len(groups) == 1 else rows_tensor, block_tables, key_mask))
    return tuple(decode_groups)


def decode_key_mask(context_lens: torch.Tensor, num_keys: int) -> torch.Tensor:
    """(n, 1, 1, num_keys) bool: True where key position < the row's context length (a row of
    context 0, a CUDA graph's padding, sees no key: SDPA gives it 0)."""
    return (torch.arange(num_keys, device=context_lens.device)[None, :] < context_lens[:, None])[:, None, None, :]


def to_device(arrays: Sequence[Sequence[int] | Sequence[Sequence[int]]], device: torch.device | str) -> list[torch.Tensor]:
    """Lists of ints (flat, or rows of equal length) as int64 tensors on `device`, in one copy:
    packed into one host tensor (pinned when the device is CUDA), sent with one non_blocking copy
    and split there into views (vLLM v1 `GPUModelRunner` keeps pinned host twins of its input
    buffers for the same reason: a copy from pageable memory waits for the stream to drain)."""
    flat: list[int] = []
    shapes: list[tuple[int, ...]] = []
    for values in arrays:
        if values and isinstance(values[0], Sequence):  # rows of one length
            shapes.append((len(values), len(values[0])))
            for row in values:
                flat.extend(row)
        else:
            shapes.append((len(values),))
            flat.extend(values)
    device = torch.device(device)
    packed = torch.tensor(flat, dtype=torch.int64, pin_memory=device.type == "cuda").to(device, non_blocking=True)
    views, offset = [], 0
    for shape in shapes:
        size = shape[0] * (shape[1] if len(shape) == 2 else 1)
        views.append(packed[offset:offset + size].view(shape))
        offset += size
    return views


def write_to_cache(
    key: torch.Tensor, value: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, slot_mapping: torch.Tensor
) -> None:
    """Scatter new K/V into their slots (vLLM `reshape_and_cache`, nano-vllm `store_kvcache`)."""
    num_heads, head_dim = k_cache.shape[2:]
    # (num_kv_heads, num_blocks * block_size, head_dim) views share storage with the caches
    # (view, never reshape: a silent copy would drop the writes)
    head_major(k_cache).view(num_heads, -1, head_dim).index_copy_(1, slot_mapping, key.transpose(0, 1))
    head_major(v_cache).view(num_heads, -1, head_dim).index_copy_(1, slot_mapping, value.transpose(0, 1))


def write_to_cache_skipping_padding(
    key: torch.Tensor, value: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, slot_mapping: torch.Tensor
) -> None:
    """`write_to_cache` where a negative slot marks a padding row that writes nothing (vLLM's
    PAD_SLOT_ID, which `reshape_and_cache` skips), without a host sync, so a CUDA graph can hold it.

    Padding sits at the back, so row 0 is real unless every row is padding. Each padding row repeats
    row 0's write (its slot, its values); when every row is padding they all write slot 0's own
    contents back. Writers of one slot then write the same bits: the cache ends as if the padding
    rows were skipped.
    """
    padding = slot_mapping < 0  # (num_tokens,)
    first_slot = slot_mapping[:1].clamp(min=0)  # (1,)
    slots = torch.where(padding, first_slot, slot_mapping)
    for new, cache in ((key, k_cache), (value, v_cache)):
        num_heads, head_dim = cache.shape[2:]
        rows = head_major(cache).view(num_heads, -1, head_dim)  # (num_kv_heads, num_slots, head_dim)
        first = torch.where(padding[0], rows.index_select(1, first_slot)[:, 0], new[0])  # (num_kv_heads, head_dim)
        rows.index_copy_(1, slots, torch.where(padding[:, None, None], first, new).transpose(0, 1))


def head_major(cache: torch.Tensor) -> torch.Tensor:
    """(num_blocks, block_size, num_kv_heads, head_dim) -> a (num_kv_heads, num_blocks,
    block_size, head_dim) view. CacheEngine stores its pools in this order, so gathering blocks
    from it yields per-head contiguous (keys, head_dim) rows, which SDPA reads faster on CPU;
    plain block-major caches work too."""
    return cache.permute(2, 0, 1, 3)


# ---------------------------------------------------------------- the reference


def reference_paged_attention(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    meta: AttentionMetadata,
    scale: float,
    sliding_window: int | None = None,
) -> torch.Tensor:
    """Paged attention as defined: write the new K/V to the cache, then attend each sequence's new
    tokens over its keys and values gathered through its block table (with a `sliding_window`,
    over the last sliding_window positions up to each query's own).

    query, key, value: (num_tokens, num_heads, head_dim); caches (num_blocks, block_size,
    num_kv_heads, head_dim). Returns (num_tokens, num_heads, head_dim).
    """
    write_to_cache(key, value, k_cache, v_cache, meta.slot_mapping)
    output = torch.empty_like(query)  # (num_tokens, num_heads, head_dim)
    for i in range(meta.num_seqs):
        start, end = meta.query_starts[i], meta.query_starts[i + 1]
        q = query[start:end].transpose(0, 1).unsqueeze(0)  # (1, num_heads, q_len, head_dim)
        k, v = gather_sequence(k_cache, v_cache, meta.block_tables[i], meta.context_lens[i])
        mask = causal_mask(meta.query_lens[i], meta.context_lens[i], query.device, sliding_window)
        out = sdpa_gqa(q, k, v, attn_mask=mask, scale=scale)
        output[start:end] = out[0].transpose(0, 1)
    return output


def sdpa_gqa(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, **kwargs) -> torch.Tensor:
    """SDPA where K/V may have fewer heads than the query (grouped-query attention): K/V head g
    serves query heads g * group ... (g + 1) * group - 1, as HF `repeat_kv` repeats them.
    q (1, num_heads, q_len, head_dim); k, v (1, num_kv_heads, ctx, head_dim)."""
    group = q.shape[1] // k.shape[1]
    if group > 1:
        k, v = k.repeat_interleave(group, dim=1), v.repeat_interleave(group, dim=1)
    if q.device.type == "cuda":  # never cuDNN's SDPA (its graph failed on an H200 where the others run)
        with sdpa_kernel(SDPA_BACKENDS_CUDA):
            return F.scaled_dot_product_attention(q, k, v, **kwargs)
    return F.scaled_dot_product_attention(q, k, v, **kwargs)


def gather_sequence(
    k_cache: torch.Tensor, v_cache: torch.Tensor, block_table: torch.Tensor, ctx: int, start: int = 0
) -> tuple[torch.Tensor, torch.Tensor]:
    """One sequence's keys and values at positions start ... ctx - 1, each (1, num_kv_heads,
    ctx - start, head_dim), read from the blocks that hold them only."""
    block_size, num_heads, head_dim = k_cache.shape[1:]
    first = start // block_size
    blocks = block_table[first : -(-ctx // block_size)]
    keys = slice(start - first * block_size, ctx - first * block_size)
    k = head_major(k_cache).index_select(1, blocks).view(num_heads, -1, head_dim)[:, keys]  # (num_heads, keys, head_dim)
    v = head_major(v_cache).index_select(1, blocks).view(num_heads, -1, head_dim)[:, keys]
    return k.unsqueeze(0), v.unsqueeze(0)


def causal_mask(q_len: int, ctx: int, device: torch.device, sliding_window: int | None = None) -> torch.Tensor:
    """(q_len, ctx) bool: query j sits at position ctx - q_len + j and sees the keys up to it
    (bottom-right causal; SDPA's is_causal is top-left aligned when q_len != ctx), and with a
    `sliding_window` only the last sliding_window of them, its own included."""
    mask = torch.ones(q_len, ctx, dtype=torch.bool, device=device).tril(ctx - q_len)
    if sliding_window is not None:
        mask = mask.triu(ctx - q_len - sliding_window + 1)
    return mask


def window_start(q_len: int, ctx: int, sliding_window: int | None) -> int:
    """The first position any of a sequence's q_len new tokens attends to: 0, or with a window
    the first query's first key (position ctx - q_len - sliding_window + 1)."""
    return 0 if sliding_window is None else max(0, ctx - q_len - sliding_window + 1)


# ---------------------------------------------------------------- the engine's path (CPU fast paths)


def paged_attention(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    k_cache: torch.Tensor | None,
    v_cache: torch.Tensor | None,
    meta: AttentionMetadata,
    scale: float,
    sliding_window: int | None = None,
) -> torch.Tensor:
    """What the model calls: the reference's result, by faster routes (vLLM v0
    `TorchSDPABackendImpl.forward` for prefills + `PagedAttention.forward_decode`).

    Prefills go one sequence at a time; one from scratch attends over its fresh K/V, skipping the
    gather. Decodes go through `decode_attention_by_length`. A layer with a `sliding_window`
    (None: full attention) reads only the blocks its window covers. With `meta.attention_backend ==
    "triton"` the cache writes and the decodes are engine/kernels' Triton kernels instead
    (`backend_ops`). Caches may be None for a cache-less profiling run (then every sequence must be
    a prefill from scratch).
    """
    store, decode = backend_ops(meta.attention_backend, meta.padded)
    has_cache = k_cache is not None and v_cache is not None and k_cache.numel() > 0
    if has_cache:
        store(key, value, k_cache, v_cache, meta.slot_mapping)
    if meta.decode_only and has_cache:
        return decode(query, k_cache, v_cache, meta, scale, sliding_window)

    output = torch.empty_like(query)  # (num_tokens, num_heads, head_dim)
    for i in meta.prefill_seq_ids:
        start, end = meta.query_starts[i], meta.query_starts[i + 1]
        q_len, ctx = meta.query_lens[i], meta.context_lens[i]
        # 4-D (1, num_heads, len, head_dim): SDPA's fused CPU kernel skips 3-D inputs
        q = query[start:end].transpose(0, 1).unsqueeze(0)  # (1, num_heads, q_len, head_dim)
        if q_len == ctx:  # fast path: nothing cached before, attend over the fresh K/V
            k = key[start:end].transpose(0, 1).unsqueeze(0)  # (1, num_heads, ctx, head_dim)
            v = value[start:end].transpose(0, 1).unsqueeze(0)
            if sliding_window is None or sliding_window >= ctx:
                out = sdpa_gqa(q, k, v, is_causal=True, scale=scale)
            else:
                out = sdpa_gqa(q, k, v, attn_mask=causal_mask(q_len, ctx, q.device, sliding_window), scale=scale)
        else:
            if not has_cache:
                raise ValueError("a prefill over cached blocks needs a KV cache")
            first = window_start(q_len, ctx, sliding_window)
            k, v = gather_sequence(k_cache, v_cache, meta.block_tables[i], ctx, first)
            mask = causal_mask(q_len, ctx, q.device, sliding_window)[:, first:]
            out = sdpa_gqa(q, k, v, attn_mask=mask, scale=scale)
        output[start:end] = out[0].transpose(0, 1)
    if meta.num_decodes:
        if not has_cache:
            raise ValueError("decode steps need a KV cache")
        output[meta.decode_token_ids] = decode(query[meta.decode_token_ids], k_cache, v_cache, meta, scale,
                                               sliding_window)
    return output


def backend_ops(name: str, padded: bool = False):
    """(store, decode) of an attention backend: the torch backend's `write_to_cache` and
    `decode_attention_by_length`, or the triton backend's kernels (engine/kernels; prefills stay
    on the torch path either way). `padded`: slots may be -1 (padding rows), which the triton
    store skips and the torch backend's `write_to_cache_skipping_padding` too."""
    if name == "triton":
        from engine.kernels import triton_backend  # imports triton: only when asked for

        return triton_backend.store_kvcache, triton_backend.decode_attention
    return (write_to_cache_skipping_padding if padded else write_to_cache), decode_attention_by_length


def decode_attention_by_length(
    query: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, meta: AttentionMetadata, scale: float,
    sliding_window: int | None = None,
) -> torch.Tensor:
    """Fast path for single-token queries: per length group (`meta.decode_groups`), one gather by
    block table and one masked SDPA call, so short sequences are not padded to the longest. With
    a `sliding_window`, each group gathers only the blocks of its sequences' windows
    (`sliding_window_groups`).

    query: (num_decodes, num_heads, head_dim) -> (num_decodes, num_heads, head_dim).
    """
    groups = meta.decode_groups if sliding_window is None else sliding_window_groups(meta, sliding_window)
    if len(groups) == 1:
        return _decode_group(query, k_cache, v_cache, groups[0], scale)
    output = torch.empty_like(query)  # (num_decodes, num_heads, head_dim)
    for group in groups:
        out = _decode_group(query.index_select(0, group.rows), k_cache, v_cache, group, scale)
        output.index_copy_(0, group.rows, out)
    return output


def sliding_window_groups(meta: AttentionMetadata, sliding_window: int) -> tuple[DecodeGroup, ...]:
    """`meta.decode_groups` narrowed to a window, made once per step and window (every sliding
    layer of the step reuses them): per sequence, the blocks from the one holding position
    context_len - sliding_window to its last, and a mask admitting positions
    context_len - sliding_window ... context_len - 1."""
    groups = meta.window_decode_groups.get(sliding_window)
    if groups is None:
        groups = tuple(sliding_window_group(g, sliding_window, meta.block_size) for g in meta.decode_groups)
        meta.window_decode_groups[sliding_window] = groups
    return groups


def sliding_window_group(group: DecodeGroup, sliding_window: int, block_size: int) -> DecodeGroup:
    """One decode group restricted to each sequence's last `sliding_window` keys (see
    `sliding_window_groups`). A window spans at most cdiv(sliding_window - 1, block_size) + 1 blocks."""
    n, num_blocks = group.block_tables.shape
    device = group.block_tables.device
    context_lens = group.key_mask.view(n, -1).sum(-1)  # (n,)
    width = min(num_blocks, -(-(sliding_window - 1) // block_size) + 1)
    first = (context_lens - sliding_window).clamp(min=0) // block_size  # (n,) first block of each window
    columns = (first[:, None] + torch.arange(width, device=device)).clamp(max=num_blocks - 1)  # (n, width)
    positions = first[:, None] * block_size + torch.arange(width * block_size, device=device)  # (n, keys)
    # a column clamped to the last block sits past the context: the mask drops it
    key_mask = (positions >= context_lens[:, None] - sliding_window) & (positions < context_lens[:, None])
    return DecodeGroup(group.rows, group.block_tables.gather(1, columns), key_mask[:, None, None, :])


def _decode_group(
    query: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, group: DecodeGroup, scale: float
) -> torch.Tensor:
    """One group's single-token queries, (n, num_heads, head_dim) -> (n, num_heads, head_dim).

    Grouped-query attention without copying K/V: the `group` query heads that share a K/V head
    become that head's `group` query rows, (n, num_kv_heads, group, head_dim)."""
    n, num_q_heads, head_dim = query.shape
    num_heads = k_cache.shape[2]  # K/V heads
    blocks = group.block_tables.flatten()  # (n * num_blocks,)
    kv = stacked_kv(k_cache, v_cache)
    if kv is not None:  # one gather for K and V together
        # (2, num_heads, n * num_blocks, block_size, head_dim) -> 2 x (n, num_heads, num_keys, head_dim)
        k, v = gather_blocks(kv, blocks).view(2, num_heads, n, -1, head_dim).transpose(1, 2)
    else:
        # (num_heads, n * num_blocks, block_size, head_dim) -> (n, num_heads, num_keys, head_dim)
        k = gather_blocks(head_major(k_cache), blocks).view(num_heads, n, -1, head_dim).transpose(0, 1)
        v = gather_blocks(head_major(v_cache), blocks).view(num_heads, n, -1, head_dim).transpose(0, 1)
    q = query.view(n, num_heads, num_q_heads // num_heads, head_dim)  # (n, num_kv_heads, group, head_dim)
    out = F.scaled_dot_product_attention(q, k, v, attn_mask=group.key_mask, scale=scale)
    return out.reshape(n, num_q_heads, head_dim)


def gather_blocks(cache: torch.Tensor, blocks: torch.Tensor) -> torch.Tensor:
    """(..., num_blocks, block_size, head_dim) -> (..., len(blocks), block_size, head_dim): the
    given blocks, in order (what `cache.index_select(-3, blocks)` returns).

    Fast path: index_select along the block dimension, not cache[..., tables, :, :], and on a 3-D
    view whose rows are whole blocks when the strides allow it (CacheEngine's pools): index_select
    then copies each block as one contiguous row, faster on CPU than selecting along a middle
    dimension of a 5-D tensor.
    """
    num_blocks, block_size, head_dim = cache.shape[-3:]
    try:
        rows = cache.view(-1, num_blocks, block_size * head_dim)  # (rows, num_blocks, block_size * head_dim)
    except RuntimeError:  # strides that no view can merge: select along the block dimension
        return cache.index_select(cache.dim() - 3, blocks)
    return rows.index_select(1, blocks).view(*cache.shape[:-3], len(blocks), block_size, head_dim)


def stacked_kv(k_cache: torch.Tensor, v_cache: torch.Tensor) -> torch.Tensor | None:
    """Fast path for the gather: both caches as one (2, num_kv_heads, num_blocks, block_size,
    head_dim) view, made with `as_strided`, when V sits at a fixed offset after K in the same
    storage with the same strides (CacheEngine's per-layer slices of one `_gpu_kv` tensor). None
    for any other layout (two separately allocated tensors, say): the caller gathers each."""
    k, v = head_major(k_cache), head_major(v_cache)
    offset = v.storage_offset() - k.storage_offset()
    if offset <= 0 or k.stride() != v.stride() or k.untyped_storage().data_ptr() != v.untyped_storage().data_ptr():
        return None
    return k.as_strided((2, *k.shape), (offset, *k.stride()), k.storage_offset())

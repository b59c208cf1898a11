"""The physical KV cache: a device pool and a CPU swap pool of fixed-size blocks.

References: vLLM v0 `vllm/worker/cache_engine.py` (CacheEngine: allocate per-layer caches,
swap_in / swap_out / copy, get_cache_block_size) and vLLM v1's pool sizing
(`vllm/v1/worker/gpu_worker.py` determine_available_memory, `vllm/v1/worker/utils.py`
request_memory, `vllm/utils/mem_utils.py` memory_profiling, `vllm/v1/core/kv_cache_planning.py`
_check_enough_kv_cache_memory): check that the memory the utilization asks for is free, profile
the largest step, then (total * utilization - peak - non_torch) // block_bytes.

Layout: one tensor per pool shaped (num_pages, 2, num_kv_heads, num_blocks, block_size,
head_dim); `gpu_cache[layer]` is the (K, V) pair of views the model writes into, each shaped
(num_blocks, block_size, num_kv_heads, head_dim) like vLLM's and nano-vllm's caches. Storing heads
outermost makes a block-table gather yield contiguous (keys, head_dim) rows per head, which SDPA
reads faster on CPU than the block-major order (see engine/attention.py `head_major`). Moving a
block moves every page, K and V, in one indexing operation.

A page is one layer's K and V of a block (vLLM's page_size_bytes). With one KV-cache group (every
full-attention model) every layer has its own page, num_pages = num_layers. With several groups
(a hybrid model) a block id belongs to one group at a time, so a block holds only its group's
layers: the i-th layer of every group shares page i, num_pages = the largest group's size, and a
block costs that many pages, not num_layers (vLLM v1
`kv_cache_planning.get_kv_cache_config_from_groups`: bytes per block = the largest group's pages,
each group's layer-outer KVCacheTensor aliasing the same allocation from byte 0; the GPU model
runner's views, `kv_cache_interface.create_kv_cache_views`).
"""

from __future__ import annotations

import itertools
import logging
import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

import torch
import xxhash

from engine import mem_utils
from engine.attention import AttentionMetadata
from engine.config import DEFAULT_SWAP_SPACE_BYTES, MiB
from engine.kernels import resolve_attention_backend

logger = logging.getLogger(__name__)

DEFAULT_CPU_KV_CACHE_BYTES = 256 * MiB  # device pool size on CPU when nothing else is given

KVCache = tuple[torch.Tensor, torch.Tensor]
BlockPairs = Sequence[tuple[int, int]]


class CacheEngine:
    """Owns the KV blocks and moves their contents (vLLM v0 `CacheEngine`).

    `gpu_cache` is the "device" pool even when the device is the CPU; `cpu_cache` is the swap
    pool (pinned when the device is CUDA). Block numbers are the block manager's physical
    block numbers in each pool.
    """

    def __init__(
        self,
        num_layers: int,
        num_kv_heads: int,
        head_dim: int,
        block_size: int,
        num_gpu_blocks: int,
        num_cpu_blocks: int,
        device: torch.device | str,
        dtype: torch.dtype,
        kv_cache_groups: Sequence | None = None,
    ):
        """kv_cache_groups: the block manager's KVCacheGroupSpecs (layer names are layer indices);
        None or one group gives every layer its own page (`kv_cache_layer_pages`)."""
        for name, value in dict(num_layers=num_layers, num_kv_heads=num_kv_heads, head_dim=head_dim,
                                block_size=block_size, num_gpu_blocks=num_gpu_blocks).items():
            if value < 1:
                raise ValueError(f"{name} must be >= 1, got {value}")
        if num_cpu_blocks < 0:
            raise ValueError(f"num_cpu_blocks must be >= 0, got {num_cpu_blocks}")
        self.num_layers = num_layers
        self.num_kv_heads = num_kv_heads
        self.head_dim = head_dim
        self.block_size = block_size
        self.num_gpu_blocks = num_gpu_blocks
        self.num_cpu_blocks = num_cpu_blocks
        self.device = torch.device(device)
        self.dtype = dtype
        self.layer_pages = kv_cache_layer_pages(num_layers, kv_cache_groups)  # layer -> its page in a block
        self.num_pages = max(self.layer_pages) + 1
        pin = self.device.type == "cuda"
        block_bytes = math.prod(self._shape(1)) * torch.empty((), dtype=dtype).element_size()
        mem_utils.check_pool_fits("device pool", num_gpu_blocks, block_bytes, self.device, "--num-gpu-blocks")
        mem_utils.check_pool_fits("CPU pool", num_cpu_blocks, block_bytes, torch.device("cpu"),
                                  "--num-cpu-blocks or --kv-offloading-size")
        # (num_pages, 2, num_kv_heads, num_blocks, block_size, head_dim): head-major storage
        self._gpu_kv = torch.zeros(self._shape(num_gpu_blocks), dtype=dtype, device=self.device)
        self._cpu_kv = torch.zeros(self._shape(num_cpu_blocks), dtype=dtype, device="cpu", pin_memory=pin)
        self._head_views: dict[str, tuple] = {}  # kv_digests' numpy views of a CPU pool, made once
        # per layer (K, V), each a (num_blocks, block_size, num_kv_heads, head_dim) view of its page
        self.gpu_cache: list[KVCache] = self._layer_views(self._gpu_kv)
        self.cpu_cache: list[KVCache] = self._layer_views(self._cpu_kv)

    def _shape(self, num_blocks: int) -> tuple[int, ...]:
        return (self.num_pages, 2, self.num_kv_heads, num_blocks, self.block_size, self.head_dim)

    def _layer_views(self, pool: torch.Tensor) -> list[KVCache]:
        return [(pool[page, 0].permute(1, 2, 0, 3), pool[page, 1].permute(1, 2, 0, 3)) for page in self.layer_pages]

    @torch.inference_mode()
    def swap_in(self, pairs: BlockPairs) -> None:
        """Copy CPU blocks into device blocks: pairs of (cpu_block, gpu_block) (vLLM `swap_in`)."""
        self._move(self._cpu_kv, self._gpu_kv, pairs)

    @torch.inference_mode()
    def swap_out(self, pairs: BlockPairs) -> None:
        """Copy device blocks into CPU blocks: pairs of (gpu_block, cpu_block) (vLLM `swap_out`)."""
        self._move(self._gpu_kv, self._cpu_kv, pairs)

    @torch.inference_mode()
    def copy(self, pairs: BlockPairs) -> None:
        """Copy device blocks within the device pool: pairs of (src, dst) (vLLM `copy_blocks`,
        used for copy-on-write). Sources are read before any destination is written."""
        self._move(self._gpu_kv, self._gpu_kv, pairs)

    def _move(self, src_pool: torch.Tensor, dst_pool: torch.Tensor, pairs: BlockPairs) -> None:
        if not pairs:
            return
        src_blocks, dst_blocks = zip(*pairs)
        self._check(src_pool, src_blocks)
        self._check(dst_pool, dst_blocks)
        src = torch.tensor(src_blocks, dtype=torch.int64, device=src_pool.device)
        dst = torch.tensor(dst_blocks, dtype=torch.int64, device=dst_pool.device)
        # (num_pages, 2, num_kv_heads, num_pairs, block_size, head_dim)
        blocks = src_pool.index_select(3, src).to(dst_pool.device)
        dst_pool.index_copy_(3, dst, blocks)

    @staticmethod
    def _check(pool: torch.Tensor, blocks: Sequence[int]) -> None:
        num_blocks = pool.shape[3]
        bad = [b for b in blocks if not 0 <= b < num_blocks]
        if bad:
            raise IndexError(f"block numbers {bad} out of range for a pool of {num_blocks} blocks")

    @torch.inference_mode()
    def block_fingerprint(self, device: Literal["gpu", "cpu"], block: int) -> str:
        """8 hex chars digesting a block's K and V over all its pages (xxh32 of its bytes).

        Equal fingerprints after copy-on-write or a swap show the destination got the source's data.
        """
        pool = self._pool(device)
        self._check(pool, [block])
        data = pool[:, :, :, block].contiguous().cpu()  # (num_pages, 2, num_kv_heads, block_size, head_dim)
        return xxhash.xxh32_hexdigest(data.view(torch.uint8).numpy().tobytes())

    @torch.inference_mode()
    def kv_digests(self, device: Literal["gpu", "cpu"], blocks: Sequence[int]) -> list[str]:
        """8 hex chars per block digesting the K and V of its first page's first head (low 32 bits
        of xxh3_64 over K's bytes then V's): the first layer's, or with several KV-cache groups the
        first layer of the group that holds the block.

        What the engine emits for the blocks it wrote (every step, or once per batch a live UI's
        free run sends), copied or swapped: one head of one layer is real K/V data that changes
        with every token written, enough to show a learner that the destination holds the
        source's data, and cheap enough to run every step. In the pool's
        layout a block's K for one head is one contiguous run (block_size x head_dim), so on the CPU
        each block is hashed where it lies, with no copy and no torch op (gathering the layer's
        heads first would copy every head of every block).
        """
        pool = self._pool(device)
        if not blocks:
            return []
        self._check(pool, blocks)
        views = self._head_views.get(device)
        if views is None and pool.device.type == "cpu" and pool.dtype in (torch.float32, torch.float16):
            layer = pool[0].numpy()  # (2, num_kv_heads, num_blocks, block_size, head_dim), shares memory
            views = self._head_views[device] = (layer[0, 0], layer[1, 0])
        if views is not None:
            keys, values = views
            digests = []
            for block in blocks:
                hasher = xxhash.xxh3_64(keys[block])
                hasher.update(values[block])
                digests.append(f"{hasher.intdigest() & 0xFFFFFFFF:08x}")
            return digests
        index = torch.tensor(blocks, dtype=torch.int64, device=pool.device)
        head = pool[0, :, 0].index_select(1, index)  # (2, len(blocks), block_size, head_dim)
        rows = head.transpose(0, 1).contiguous().cpu().view(torch.uint8).numpy().reshape(len(blocks), -1)
        return [f"{xxhash.xxh3_64_intdigest(row) & 0xFFFFFFFF:08x}" for row in rows]

    def _pool(self, device: str) -> torch.Tensor:
        pool = {"gpu": self._gpu_kv, "cpu": self._cpu_kv}.get(device)
        if pool is None:
            raise ValueError(f"device must be 'gpu' or 'cpu', got {device!r}")
        return pool

    @staticmethod
    def get_cache_block_size(
        block_size: int, num_layers: int, num_kv_heads: int, head_dim: int, dtype: torch.dtype
    ) -> int:
        """Bytes one block takes across all layers, K and V (seed 001; vLLM `get_cache_block_size`)."""
        element_size = torch.empty((), dtype=dtype).element_size()
        return block_size * num_layers * 2 * num_kv_heads * head_dim * element_size

    @property
    def block_bytes(self) -> int:
        """2 x pages x K/V heads x head_dim x block_size x dtype bytes: the K/V heads, not the
        query heads (grouped-query attention caches fewer); the pages are every layer's, or with
        several KV-cache groups the largest group's layers (vLLM `_get_kv_cache_bytes_per_block`)."""
        return self.get_cache_block_size(self.block_size, self.num_pages, self.num_kv_heads, self.head_dim, self.dtype)

    def pool_bytes(self, device: Literal["gpu", "cpu"]) -> int:
        """Bytes of the K/V tensors this pool allocated (num_blocks x block_bytes)."""
        pool = self._pool(device)
        return pool.numel() * pool.element_size()


def kv_cache_layer_pages(num_layers: int, kv_cache_groups: Sequence | None = None) -> list[int]:
    """Each layer's page in a block: its position in its KV-cache group's layer names (vLLM
    `get_kv_cache_config_from_groups`: every group's KVCacheTensor starts at byte 0 and puts its
    layer l at l x layer_stride, so the l-th layers of all groups share one region). None or one
    group: layer i in page i. The groups' layer names are layer indices."""
    if not kv_cache_groups or len(kv_cache_groups) == 1:
        return list(range(num_layers))
    pages: dict[int, int] = {}
    for group in kv_cache_groups:
        for position, name in enumerate(group.layer_names):
            pages[int(name)] = position
    if sorted(pages) != list(range(num_layers)):
        raise ValueError(f"the KV-cache groups name layers {sorted(pages)}, the model has {num_layers}")
    return [pages[layer] for layer in range(num_layers)]


def blocks_per_request(kv_cache_groups: Sequence | None, block_size: int, max_model_len: int,
                       max_num_batched_tokens: int) -> int:
    """The blocks one request of max_model_len tokens takes from the pool, over every KV-cache
    group: a full-attention group's cdiv(max_model_len, block_size), a sliding-window group's
    admission cap (vLLM `_max_memory_usage_bytes_from_groups`, each spec's max_memory_usage_bytes)."""
    from engine.v1.kv_cache_interface import cdiv, max_admission_blocks_per_request

    if not kv_cache_groups:
        return cdiv(max_model_len, block_size)
    total = 0
    for group in kv_cache_groups:
        spec = group.kv_cache_spec
        # vLLM's FullAttentionSpec may record the window of sliding layers it runs as full attention
        cap = (None if type(spec).__name__ == "FullAttentionSpec"
               else max_admission_blocks_per_request(spec, max_num_batched_tokens, max_model_len))
        total += cdiv(max_model_len, block_size) if cap is None else cap
    return total



@dataclass(slots=True)
class BlockBudget:
    """How many blocks each pool gets, and the figures the decision came from.

    source: 'explicit' (num_gpu_blocks given), 'budget' (kv_cache_memory_bytes given),
    'profiled' (CUDA: (total * utilization - peak - non_torch) // block_bytes, `determine_num_blocks`)
    or 'default-cpu' (DEFAULT_CPU_KV_CACHE_BYTES // block_bytes).
    """

    num_gpu_blocks: int
    num_cpu_blocks: int
    block_bytes: int
    source: Literal["explicit", "budget", "profiled", "default-cpu"]
    total_bytes: int | None = None  # device memory (profiled) or the KV budget
    peak_bytes: int | None = None  # profiled: the most torch held, weights + the profile run's tensors
    utilization: float | None = None
    free_bytes: int | None = None  # profiled: free on the device before this engine's weights
    non_torch_bytes: int | None = None  # profiled: memory the profile run took outside torch

    def __post_init__(self) -> None:
        if self.num_gpu_blocks < 1:
            raise ValueError(
                f"no room for KV blocks ({self.source}): {self.num_gpu_blocks} blocks of {self.block_bytes} bytes; "
                "raise gpu_memory_utilization or the KV memory budget, or pass num_gpu_blocks"
            )
        if self.num_cpu_blocks < 0:
            raise ValueError(f"num_cpu_blocks must be >= 0, got {self.num_cpu_blocks}")


def determine_num_blocks(
    model: torch.nn.Module,
    config,
    block_size: int,
    device: torch.device | str,
    dtype: torch.dtype,
    max_num_batched_tokens: int,
    gpu_memory_utilization: float = 0.92,
    kv_cache_memory_bytes: int | None = None,
    num_gpu_blocks: int | None = None,
    swap_space_bytes: int = DEFAULT_SWAP_SPACE_BYTES,
    num_cpu_blocks: int | None = None,
    max_num_seqs: int = 1,
    attention_backend: str | None = None,
    kv_cache_groups: Sequence | None = None,
) -> BlockBudget:
    """Size the device and swap pools (vLLM v1 `Worker.determine_available_memory`, v0's
    `determine_num_available_blocks`).

    Precedence for the device pool: an explicit num_gpu_blocks, then a KV memory budget
    (kv_cache_memory_bytes // block_bytes), then, on a device with a memory query
    (mem_utils.device_memory: CUDA), the memory left under the utilization after a profile run
    (`profile_device`); on the CPU with neither, DEFAULT_CPU_KV_CACHE_BYTES (256 MiB) of KV.
    The swap pool: num_cpu_blocks if given, else swap_space_bytes // block_bytes.
    `config` needs num_layers, num_kv_heads, head_dim and max_model_len (any engine model config);
    max_num_seqs and attention_backend (None: the device's default) shape the profile run as they
    shape the steps served. kv_cache_groups (the block manager's; None: one group) decide what a
    block holds: every layer's page, or with several groups the largest group's pages
    (CacheEngine.block_bytes; vLLM `get_kv_cache_config_from_groups`: available // bytes per block).
    """
    if not 0 < gpu_memory_utilization <= 1:
        raise ValueError(f"gpu_memory_utilization must be in (0, 1], got {gpu_memory_utilization}")
    device = torch.device(device)
    num_pages = max(kv_cache_layer_pages(config.num_layers, kv_cache_groups)) + 1
    block_bytes = CacheEngine.get_cache_block_size(block_size, num_pages, config.num_kv_heads, config.head_dim, dtype)
    cpu_blocks = num_cpu_blocks if num_cpu_blocks is not None else swap_space_bytes // block_bytes
    if num_gpu_blocks is not None:
        budget = BlockBudget(num_gpu_blocks, cpu_blocks, block_bytes, "explicit")
    elif kv_cache_memory_bytes is not None:
        budget = BlockBudget(kv_cache_memory_bytes // block_bytes, cpu_blocks, block_bytes, "budget",
                             total_bytes=kv_cache_memory_bytes)
    elif (memory := mem_utils.device_memory(device)) is not None:
        budget = profile_device(memory, model, config, block_size, block_bytes, device, dtype, gpu_memory_utilization,
                                max_num_batched_tokens, max_num_seqs, attention_backend, cpu_blocks, kv_cache_groups)
    else:
        budget = BlockBudget(DEFAULT_CPU_KV_CACHE_BYTES // block_bytes, cpu_blocks, block_bytes, "default-cpu",
                             total_bytes=DEFAULT_CPU_KV_CACHE_BYTES)
    logger.info(
        "KV cache (%s): %d device blocks + %d swap blocks of %d tokens, %d bytes each "
        "(total=%s free=%s peak=%s non_torch=%s utilization=%s)",
        budget.source, budget.num_gpu_blocks, budget.num_cpu_blocks, block_size, block_bytes,
        budget.total_bytes, budget.free_bytes, budget.peak_bytes, budget.non_torch_bytes, budget.utilization,
    )
    return budget


def profile_device(memory: mem_utils.MemoryQuery, model, config, block_size: int, block_bytes: int,
                   device: torch.device, dtype: torch.dtype, utilization: float, max_num_batched_tokens: int,
                   max_num_seqs: int, attention_backend: str | None, num_cpu_blocks: int,
                   kv_cache_groups: Sequence | None = None) -> BlockBudget:
    """The device pool from the memory the utilization asks for, less what the engine needs
    besides its KV cache (vLLM v1 `determine_available_memory` over `memory_profiling`).

    Reads the device (`memory`) before and after `profile_run`. Free at startup is the reading's
    free bytes plus this engine's weights (vLLM reads it before loading them); the utilization
    asks for ceil(total * utilization) of it (`request_memory`). The engine's torch peak is its
    weights plus the most the profile run's tensors added; memory outside torch is the drop in
    free bytes that torch's own allocations do not explain (cuBLAS / cuDNN handles and
    workspaces, Triton's modules). What is left, requested - peak - non_torch, holds the blocks,
    if it holds one request of max_model_len in every KV-cache group (`check_enough_kv_cache_memory`)."""
    before = memory(device)
    weights = weights_bytes(model)
    free = before.free_bytes + weights
    requested = request_memory(free, before.total_bytes, utilization, device)
    try:
        profile_run(model, config, block_size, device, dtype, max_num_batched_tokens, max_num_seqs,
                    attention_backend, kv_cache_groups)
    except torch.cuda.OutOfMemoryError:
        raise ValueError(
            f"the profile run ({max_num_batched_tokens} tokens, {max_num_seqs} sequences in a step) ran out of "
            f"memory on {device}: lower max_num_batched_tokens or max_num_seqs, or free memory on the device"
        ) from None
    after = memory(device)
    peak = weights + max(0, after.torch_peak_bytes - before.torch_allocated_bytes)
    torch_growth = after.torch_allocated_bytes - before.torch_allocated_bytes
    non_torch = max(0, before.free_bytes - after.free_bytes - torch_growth)
    available = requested - peak - non_torch
    check_enough_kv_cache_memory(
        available, config.max_model_len, block_size, block_bytes,
        blocks_per_request(kv_cache_groups, block_size, config.max_model_len, max_num_batched_tokens),
        f"{mem_utils.format_gib(requested)} ({utilization:g} × {mem_utils.format_gib(before.total_bytes)}) − "
        f"{mem_utils.format_gib(peak)} torch peak − {mem_utils.format_gib(non_torch)} outside torch",
    )
    return BlockBudget(available // block_bytes, num_cpu_blocks, block_bytes, "profiled",
                       total_bytes=before.total_bytes, peak_bytes=peak, utilization=utilization,
                       free_bytes=free, non_torch_bytes=non_torch)


def request_memory(free_bytes: int, total_bytes: int, utilization: float, device: torch.device) -> int:
    """The bytes the utilization asks for, ceil(total * utilization); a ValueError (one line
    naming free, requested and the ways out) when that much is not free (vLLM v1 `request_memory`)."""
    requested = math.ceil(total_bytes * utilization)
    if free_bytes < requested:
        fits = math.floor(free_bytes / total_bytes * 100) / 100
        lower = f"lower gpu_memory_utilization to {fits:g} or less" if fits > 0 else "lower gpu_memory_utilization"
        raise ValueError(
            f"{device} has {mem_utils.format_gib(free_bytes)} free of {mem_utils.format_gib(total_bytes)}, less than "
            f"gpu_memory_utilization {utilization:g} asks for ({mem_utils.format_gib(requested)}): {lower}, "
            "or free memory on the device (other processes hold the rest) or give the pool's size "
            "(num_gpu_blocks, --num-gpu-blocks)"
        )
    return requested


def check_enough_kv_cache_memory(available_bytes: int, max_model_len: int, block_size: int, block_bytes: int,
                                 needed_blocks: int, budget: str) -> None:
    """ValueError (one line) unless `available_bytes` hold the `needed_blocks` of one request of
    max_model_len tokens (`blocks_per_request`; vLLM v1 `_check_enough_kv_cache_memory`); `budget`
    says how the available bytes were reached."""
    needed = needed_blocks * block_bytes
    if available_bytes >= needed:
        return
    fits = max(0, available_bytes // block_bytes) * block_size
    raise ValueError(
        f"one request of max_model_len {max_model_len} tokens needs {mem_utils.format_gib(needed)} of KV cache "
        f"({needed_blocks} blocks of {block_bytes:,} bytes), the budget gives {mem_utils.format_gib(available_bytes)} "
        f"({budget}; a context of {fits} tokens fits): raise gpu_memory_utilization, free memory on the device, "
        "or give the pool's size (num_gpu_blocks, --num-gpu-blocks)"
    )


def weights_bytes(model: torch.nn.Module) -> int:
    """Bytes of the model's parameters and buffers (vLLM's `model_memory_usage`)."""
    tensors = itertools.chain(model.parameters(), model.buffers())
    return sum(t.numel() * t.element_size() for t in tensors)


@torch.inference_mode()
def profile_run(model, config, block_size: int, device: torch.device, dtype: torch.dtype,
                max_num_batched_tokens: int, max_num_seqs: int, attention_backend: str | None,
                kv_cache_groups: Sequence | None = None) -> None:
    """The largest steps the scheduler can form, through the attention path serving takes
    (vLLM v1 `GPUModelRunner.profile_run`: a dummy run of max_num_tokens, then the sampler's rows).

    A K/V cache of one max_model_len sequence's blocks (laid out as the served cache: one page per
    layer of the largest KV-cache group), which every profiled sequence and layer shares, and
    three steps on it with the serving backend: prefills from scratch of max_num_batched_tokens
    tokens in sequences of max_model_len (at most max_num_seqs of them: SDPA's fused kernels and
    their workspace at the longest attention); one prefill over cached blocks (a prefix hit or a
    later chunk: the gather and the masked SDPA); a decode of max_num_seqs sequences at max_model_len
    (the backend's decode, the K/V writes, the logits of every row). Unlike vLLM's profile, which
    skips the attention kernels, the workspaces and modules they load are in the measurement.
    """
    backend = resolve_attention_backend(attention_backend, device)
    max_len = config.max_model_len
    num_blocks = -(-max_len // block_size)
    cache = CacheEngine(config.num_layers, config.num_kv_heads, config.head_dim, block_size, num_blocks, 0,
                        device, dtype, kv_cache_groups)
    num_tokens = min(max_num_batched_tokens, max_num_seqs * max_len)
    prefill_lens = [max_len] * (num_tokens // max_len) + ([num_tokens % max_len] if num_tokens % max_len else [])
    steps = [(prefill_lens, prefill_lens), ([1] * max_num_seqs, [max_len] * max_num_seqs)]
    if min(num_tokens, max_len - 1) >= 2:
        steps.insert(1, ([min(num_tokens, max_len - 1)], [max_len]))
    table = list(range(num_blocks))
    for query_lens, context_lens in steps:  # (new tokens, context) per sequence
        meta = AttentionMetadata.build([table] * len(query_lens), query_lens, context_lens, block_size, device,
                                       backend)
        input_ids = torch.zeros(meta.num_tokens, dtype=torch.int64, device=device)
        hidden = model(input_ids, meta.positions, cache.gpu_cache, meta)  # (num_tokens, hidden)
        model.compute_logits(hidden[meta.last_token_indices])  # (num_seqs, vocab)

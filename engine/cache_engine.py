"""The physical KV cache: a device pool and a CPU swap pool of fixed-size blocks.

References: vLLM v0 `vllm/worker/cache_engine.py` (CacheEngine: allocate per-layer caches,
swap_in / swap_out / copy, get_cache_block_size) and `vllm/worker/worker.py`
(`determine_num_available_blocks`: profile a forward, then (total * utilization - peak) //
block_bytes). Seed 001 gives the block-size formula, seed 003 the CacheEngine.

Layout: all layers share one tensor per pool shaped (num_layers, 2, num_kv_heads, num_blocks,
block_size, head_dim); `gpu_cache[layer]` is the (K, V) pair of views the model writes into,
each shaped (num_blocks, block_size, num_kv_heads, head_dim) like vLLM's and nano-vllm's caches.
Storing heads outermost makes a block-table gather yield contiguous (keys, head_dim) rows per
head, which SDPA reads faster on CPU than the block-major order (see engine/attention.py
`head_major`). Moving a block moves it for every layer, K and V, in one
indexing operation.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

import torch
import xxhash

from engine.config import DEFAULT_SWAP_SPACE_BYTES, MiB

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
    ):
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
        pin = self.device.type == "cuda"
        # (num_layers, 2, num_kv_heads, num_blocks, block_size, head_dim): head-major storage
        self._gpu_kv = torch.zeros(self._shape(num_gpu_blocks), dtype=dtype, device=self.device)
        self._cpu_kv = torch.zeros(self._shape(num_cpu_blocks), dtype=dtype, device="cpu", pin_memory=pin)
        self._head_views: dict[str, tuple] = {}  # kv_digests' numpy views of a CPU pool, made once
        # per layer (K, V), each a (num_blocks, block_size, num_kv_heads, head_dim) view
        self.gpu_cache: list[KVCache] = [(kv[0].permute(1, 2, 0, 3), kv[1].permute(1, 2, 0, 3)) for kv in self._gpu_kv]
        self.cpu_cache: list[KVCache] = [(kv[0].permute(1, 2, 0, 3), kv[1].permute(1, 2, 0, 3)) for kv in self._cpu_kv]

    def _shape(self, num_blocks: int) -> tuple[int, ...]:
        return (self.num_layers, 2, self.num_kv_heads, num_blocks, self.block_size, self.head_dim)

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
        # (num_layers, 2, num_kv_heads, num_pairs, block_size, head_dim)
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
        """8 hex chars digesting a block's K and V over all layers (xxh32 of its bytes).

        Equal fingerprints after copy-on-write or a swap show the destination got the source's data.
        """
        pool = self._pool(device)
        self._check(pool, [block])
        data = pool[:, :, :, block].contiguous().cpu()  # (num_layers, 2, num_kv_heads, block_size, head_dim)
        return xxhash.xxh32_hexdigest(data.view(torch.uint8).numpy().tobytes())

    @torch.inference_mode()
    def kv_digests(self, device: Literal["gpu", "cpu"], blocks: Sequence[int]) -> list[str]:
        """8 hex chars per block digesting the K and V of its first layer's first head (low 32 bits
        of xxh3_64 over K's bytes then V's).

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
        """2 x layers x K/V heads x head_dim x block_size x dtype bytes: the K/V heads, not the
        query heads (grouped-query attention caches fewer)."""
        return self.get_cache_block_size(self.block_size, self.num_layers, self.num_kv_heads, self.head_dim, self.dtype)

    def pool_bytes(self, device: Literal["gpu", "cpu"]) -> int:
        """Bytes of the K/V tensors this pool allocated (num_blocks x block_bytes)."""
        pool = self._pool(device)
        return pool.numel() * pool.element_size()


@dataclass(slots=True)
class BlockBudget:
    """How many blocks each pool gets, and the figures the decision came from.

    source: 'explicit' (num_gpu_blocks given), 'budget' (kv_cache_memory_bytes given),
    'profiled' (CUDA: (total * utilization - peak) // block_bytes) or 'default-cpu'
    (DEFAULT_CPU_KV_CACHE_BYTES // block_bytes).
    """

    num_gpu_blocks: int
    num_cpu_blocks: int
    block_bytes: int
    source: Literal["explicit", "budget", "profiled", "default-cpu"]
    total_bytes: int | None = None  # device memory (profiled) or the KV budget
    peak_bytes: int | None = None  # peak memory of the profiling forward
    utilization: float | None = None

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
    gpu_memory_utilization: float = 0.9,
    kv_cache_memory_bytes: int | None = None,
    num_gpu_blocks: int | None = None,
    swap_space_bytes: int = DEFAULT_SWAP_SPACE_BYTES,
    num_cpu_blocks: int | None = None,
) -> BlockBudget:
    """Size the device and swap pools (vLLM v0 `Worker.determine_num_available_blocks`).

    Precedence for the device pool: an explicit num_gpu_blocks, then a KV memory budget
    (kv_cache_memory_bytes // block_bytes), then on CUDA a profiled forward of
    max_num_batched_tokens tokens: (total_memory * gpu_memory_utilization - peak) // block_bytes;
    on CPU with neither, DEFAULT_CPU_KV_CACHE_BYTES (256 MiB) of KV.
    The swap pool: num_cpu_blocks if given, else swap_space_bytes // block_bytes.
    `config` needs num_layers, num_kv_heads, head_dim and max_model_len (any engine model config).
    """
    if not 0 < gpu_memory_utilization <= 1:
        raise ValueError(f"gpu_memory_utilization must be in (0, 1], got {gpu_memory_utilization}")
    device = torch.device(device)
    block_bytes = CacheEngine.get_cache_block_size(
        block_size, config.num_layers, config.num_kv_heads, config.head_dim, dtype
    )
    cpu_blocks = num_cpu_blocks if num_cpu_blocks is not None else swap_space_bytes // block_bytes
    if num_gpu_blocks is not None:
        budget = BlockBudget(num_gpu_blocks, cpu_blocks, block_bytes, "explicit")
    elif kv_cache_memory_bytes is not None:
        budget = BlockBudget(kv_cache_memory_bytes // block_bytes, cpu_blocks, block_bytes, "budget",
                             total_bytes=kv_cache_memory_bytes)
    elif device.type == "cuda":
        peak = _profile_peak_memory(model, config, device, max_num_batched_tokens)
        total = torch.cuda.mem_get_info(device)[1]
        blocks = int((total * gpu_memory_utilization - peak) // block_bytes)
        budget = BlockBudget(blocks, cpu_blocks, block_bytes, "profiled",
                             total_bytes=total, peak_bytes=peak, utilization=gpu_memory_utilization)
    else:
        budget = BlockBudget(DEFAULT_CPU_KV_CACHE_BYTES // block_bytes, cpu_blocks, block_bytes, "default-cpu",
                             total_bytes=DEFAULT_CPU_KV_CACHE_BYTES)
    logger.info(
        "KV cache (%s): %d device blocks + %d swap blocks of %d tokens, %d bytes each "
        "(total=%s peak=%s utilization=%s)",
        budget.source, budget.num_gpu_blocks, budget.num_cpu_blocks, block_size, block_bytes,
        budget.total_bytes, budget.peak_bytes, budget.utilization,
    )
    return budget


def _profile_peak_memory(model, config, device: torch.device, max_num_batched_tokens: int) -> int:
    """Peak CUDA memory of one cache-less prefill of max_num_batched_tokens tokens (vLLM `profile_run`)."""
    from engine.attention import AttentionMetadata

    max_len = config.max_model_len
    lens = [max_len] * (max_num_batched_tokens // max_len)
    if max_num_batched_tokens % max_len:
        lens.append(max_num_batched_tokens % max_len)
    meta = AttentionMetadata.build(
        block_tables=[[0] * -(-n // max_len) for n in lens], query_lens=lens, context_lens=lens,
        block_size=max_len, device=device,
    )
    input_ids = torch.zeros(sum(lens), dtype=torch.int64, device=device)
    torch.cuda.empty_cache()
    torch.cuda.reset_peak_memory_stats(device)
    hidden = model(input_ids, meta.positions, None, meta)
    model.compute_logits(hidden[meta.last_token_indices])
    torch.cuda.synchronize(device)
    peak = torch.cuda.max_memory_allocated(device)
    del hidden
    torch.cuda.empty_cache()
    return peak

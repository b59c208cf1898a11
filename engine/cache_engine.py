"""The physical KV cache: a device pool and a CPU swap pool of fixed-size blocks.

References: vLLM v0 `vllm/worker/cache_engine.py` (CacheEngine: allocate per-layer caches,
swap_in / swap_out / copy, get_cache_block_size). How many blocks each pool gets is decided in
engine/kv_sizing.py.

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

import math
from collections.abc import Sequence
from typing import Literal

import torch
import xxhash

from engine import mem_utils

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
        """Bytes one block takes across all layers, K and V (vLLM v0 `CacheEngine.get_cache_block_size`)."""
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

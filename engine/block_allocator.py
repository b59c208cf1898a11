"""Physical block allocators: the free lists behind the block manager.

`UncachedBlockAllocator` is vLLM v0's allocator of the same name (vllm/core/block_manager_v1.py): a free list and ref
counts, "Double free" on a block already free. `CachedBlockAllocator` adds nano-vllm's prefix cache
(nanovllm/engine/block_manager.py): full blocks get a chained xxh64 hash, a hash map finds them again, and a freed hashed
block stays reusable ("free but cached") until the least recently used one is evicted, ties broken
towards the block with more hashed tokens, as vLLM's LRUEvictor.
"""

from __future__ import annotations

import heapq
from array import array
from collections import deque

import xxhash

from engine.block import Device, PhysicalTokenBlock
from engine.events import BlockEvicted, EventBus


def compute_block_hash(token_ids: tuple[int, ...] | list[int], parent_hash: int | None) -> int:
    """nano-vllm's chained hash (BlockManager.compute_hash): xxh64 over the parent block's hash (8 little-endian bytes, when there
    is a parent) then the block's token ids as int64 bytes, so equal hashes mean equal prefixes."""
    h = xxhash.xxh64()
    if parent_hash is not None:
        h.update(parent_hash.to_bytes(8, "little"))
    h.update(array("q", token_ids).tobytes())
    return h.intdigest()


class UncachedBlockAllocator:
    """Free list and ref counts for one device's pool (vLLM v0 UncachedBlockAllocator)."""

    def __init__(self, device: Device, block_size: int, num_blocks: int, events: EventBus) -> None:
        if block_size <= 0:
            raise ValueError(f"block_size must be positive, got {block_size}")
        if num_blocks < 0:
            raise ValueError(f"number of {device.value} blocks must be >= 0, got {num_blocks}")
        self.device = device
        self.block_size = block_size
        self.num_blocks = num_blocks
        self.events = events
        self.blocks = [PhysicalTokenBlock(device, i, block_size) for i in range(num_blocks)]
        self.free_block_numbers: deque[int] = deque(range(num_blocks))

    def get_num_free_blocks(self) -> int:
        return len(self.free_block_numbers)

    def allocate(self) -> PhysicalTokenBlock:
        """Take the oldest free block, ref count 1."""
        if not self.free_block_numbers:
            raise ValueError(f"out of memory: no free {self.device.value} blocks left")
        block = self.blocks[self.free_block_numbers.popleft()]
        block.ref_count = 1
        return block

    def free(self, block: PhysicalTokenBlock, now: int) -> bool:
        """Drop one reference; returns True when the block stays cached (never, here)."""
        self._check_owned(block)
        if block.ref_count == 0:
            raise ValueError(f"Double free! {block} is already freed.")
        block.ref_count -= 1
        if block.ref_count == 0:
            block.block_hash = None
            block.num_hashed_tokens = 0
            block.computed = False
            block.token_ids = ()
            block.last_accessed = now
            self.free_block_numbers.append(block.block_number)
        return False

    def _check_owned(self, block: PhysicalTokenBlock) -> None:
        if block.device is not self.device or not (
            0 <= block.block_number < self.num_blocks and self.blocks[block.block_number] is block
        ):
            raise ValueError(f"{block} does not belong to the {self.device.value} pool")

    # Uncached pools never hit and never register.
    def lookup(self, block_hash: int, token_ids: tuple[int, ...]) -> PhysicalTokenBlock | None:
        return None

    def register(self, block: PhysicalTokenBlock) -> bool:
        return False

    def is_registered(self, block: PhysicalTokenBlock) -> bool:
        return False


class CachedBlockAllocator(UncachedBlockAllocator):
    """The prefix-caching pool: hash map, free-but-cached blocks and LRU eviction."""

    def __init__(self, device: Device, block_size: int, num_blocks: int, events: EventBus) -> None:
        super().__init__(device, block_size, num_blocks, events)
        self.cached_blocks: dict[int, PhysicalTokenBlock] = {}  # block_hash -> block (the hash map)
        self.evictable: dict[int, PhysicalTokenBlock] = {}  # block_number -> free-but-cached block
        self._evict_heap: list[tuple[int, int, int]] = []  # (last_accessed, -num_hashed, number)

    def get_num_free_blocks(self) -> int:
        return len(self.free_block_numbers) + len(self.evictable)

    def allocate(self) -> PhysicalTokenBlock:
        """A fresh block: an unused one if any, else evict the least recently used cached block."""
        if self.free_block_numbers:
            return super().allocate()
        if not self.evictable:
            raise ValueError(f"out of memory: no free {self.device.value} blocks left")
        block = self._evict()
        block.ref_count = 1
        return block

    def _evict(self) -> PhysicalTokenBlock:
        while True:
            last_accessed, neg_hashed, number = heapq.heappop(self._evict_heap)
            block = self.evictable.get(number)
            if block is not None and block.last_accessed == last_accessed and (
                -neg_hashed == block.num_hashed_tokens
            ):
                break
        del self.evictable[number]
        old_hash = block.block_hash
        del self.cached_blocks[old_hash]
        block.block_hash = None
        block.num_hashed_tokens = 0
        block.computed = False
        block.token_ids = ()
        if self.events.active:
            self.events.emit(BlockEvicted, device=self.device.value, block=number, block_hash=old_hash)
        return block

    def lookup(self, block_hash: int, token_ids: tuple[int, ...]) -> PhysicalTokenBlock | None:
        """The registered block with this hash and these very tokens (a hash collision is a miss).

        As vLLM v0's BlockSpaceManagerV1.allocate and nano-vllm's allocate, a block hits as soon as
        it is registered, before its K/V is written: a request scheduled in the same prefill step
        as the one that computes it shares it (the forward writes every new K/V of a layer before
        any sequence attends, so the sharer skips those tokens and reads them)."""
        block = self.cached_blocks.get(block_hash)
        if block is None or block.token_ids != token_ids:
            return None
        return block

    def take(self, block: PhysicalTokenBlock) -> None:
        """Add a reference to a cache hit, reviving it if it was free-but-cached."""
        if block.ref_count == 0:
            del self.evictable[block.block_number]
            # the block's heap entry is stale now: drop stale entries once they outnumber live ones
            if len(self._evict_heap) > 2 * len(self.evictable) + 16:
                self._compact_heap()
        block.ref_count += 1

    def _compact_heap(self) -> None:
        """Rebuild the eviction heap from the free-but-cached blocks alone (one entry each)."""
        self._evict_heap = [(b.last_accessed, -b.num_hashed_tokens, n) for n, b in self.evictable.items()]
        heapq.heapify(self._evict_heap)

    def register(self, block: PhysicalTokenBlock) -> bool:
        """Put a hashed block in the hash map unless an equal block is already there."""
        if block.block_hash in self.cached_blocks:
            return False
        self.cached_blocks[block.block_hash] = block
        return True

    def is_registered(self, block: PhysicalTokenBlock) -> bool:
        return block.block_hash is not None and self.cached_blocks.get(block.block_hash) is block

    def free(self, block: PhysicalTokenBlock, now: int) -> bool:
        """Drop one reference; at zero a registered, computed block stays cached (returns True)."""
        self._check_owned(block)
        if block.ref_count == 0:
            raise ValueError(f"Double free! {block} is already freed.")
        if block.ref_count > 1:
            block.ref_count -= 1
            return False
        if self.is_registered(block):
            if block.computed:
                block.ref_count = 0
                block.last_accessed = now
                self.evictable[block.block_number] = block
                heapq.heappush(self._evict_heap, (now, -block.num_hashed_tokens, block.block_number))
                return True
            del self.cached_blocks[block.block_hash]  # never computed: its slots hold nothing
        return super().free(block, now)

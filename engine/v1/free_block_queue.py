"""FreeKVCacheBlockQueue: the free blocks in eviction order (vLLM v1 kv_cache_utils.py).

A doubly linked list through the blocks themselves (prev_free_block / next_free_block) between two
sentinels, so taking a cached block out of the middle when a request hits it is O(1), which a
deque cannot do. The head is evicted first: `get_new_blocks` pops from the head, freed blocks
with a hash go to the tail (kept longest for prefix hits), freed blocks without one to the head.
"""

from __future__ import annotations

from collections.abc import Iterator

from engine.v1.kv_cache_utils import KVCacheBlock


class FreeKVCacheBlockQueue:
    """The free list of vLLM v1: popleft / popleft_n, remove, append / append_n, prepend_n."""

    def __init__(self, blocks: list[KVCacheBlock]) -> None:
        self.num_free_blocks = len(blocks)
        self.fake_free_list_head = KVCacheBlock(-1)
        self.fake_free_list_tail = KVCacheBlock(-1)
        previous = self.fake_free_list_head
        for block in blocks:
            previous.next_free_block, block.prev_free_block = block, previous
            previous = block
        previous.next_free_block, self.fake_free_list_tail.prev_free_block = self.fake_free_list_tail, previous

    def popleft(self) -> KVCacheBlock:
        """Take the first free block (the next one evicted)."""
        block = self.fake_free_list_head.next_free_block
        if block is self.fake_free_list_tail or block is None:
            raise ValueError("no free block left")
        self.remove(block)
        return block

    def popleft_n(self, num_blocks: int) -> list[KVCacheBlock]:
        """Take the first `num_blocks` free blocks, head first."""
        if num_blocks > self.num_free_blocks:
            raise ValueError(f"cannot pop {num_blocks} blocks: {self.num_free_blocks} are free")
        return [self.popleft() for _ in range(num_blocks)]

    def remove(self, block: KVCacheBlock) -> None:
        """Unlink a block from wherever it sits (a prefix hit on a free cached block)."""
        if block.prev_free_block is None or block.next_free_block is None:
            raise ValueError(f"block {block.block_id} is not in the free queue")
        block.prev_free_block.next_free_block = block.next_free_block
        block.next_free_block.prev_free_block = block.prev_free_block
        block.prev_free_block = block.next_free_block = None
        self.num_free_blocks -= 1

    def append(self, block: KVCacheBlock) -> None:
        """Put a block at the tail (evicted last)."""
        last = self.fake_free_list_tail.prev_free_block
        assert last is not None
        last.next_free_block, block.prev_free_block = block, last
        block.next_free_block, self.fake_free_list_tail.prev_free_block = self.fake_free_list_tail, block
        self.num_free_blocks += 1

    def append_n(self, blocks: list[KVCacheBlock]) -> None:
        """Put blocks at the tail, in the order given."""
        for block in blocks:
            self.append(block)

    def prepend_n(self, blocks: list[KVCacheBlock]) -> None:
        """Put blocks at the head, in the order given: blocks[0] becomes the head."""
        for block in reversed(blocks):
            first = self.fake_free_list_head.next_free_block
            assert first is not None
            self.fake_free_list_head.next_free_block, block.prev_free_block = block, self.fake_free_list_head
            block.next_free_block, first.prev_free_block = first, block
            self.num_free_blocks += 1

    def __iter__(self) -> Iterator[KVCacheBlock]:
        block = self.fake_free_list_head.next_free_block
        while block is not None and block is not self.fake_free_list_tail:
            yield block
            block = block.next_free_block

    def get_all_free_blocks(self) -> list[KVCacheBlock]:
        """The free blocks from head (evicted first) to tail."""
        return list(self)

"""BlockPool: every KV cache block, the free queue and the prefix-cache map (vLLM v1
`vllm/v1/core/block_pool.py`).

Block 0 is the null block: taken out of the free queue at start, never allocated, freed,
touched or counted; a sliding-window table holds it in the slots of blocks that left the window.
One pool serves every KV-cache group: vLLM keys its prefix cache by (hash, group id)
(BlockHashWithGroupId); here the key is the hash and `cached_block_group_ids` says which group
each cached block was cached for, so a lookup in one group never returns another group's block,
and a one-group run's map is keyed by the hash alone. Blocks are not de-duplicated: a block that fills up is cached under its hash even when
another block already holds that hash (block tables stay append-only); a lookup returns the
block cached first. Eviction is lazy: a freed cached block keeps its hash, and loses it only when
`get_new_blocks` pops it from the head of the free queue.

Events: BlockHashed when cache_full_blocks hashes a block (`registered` True when it is the block
a lookup of that hash now returns), BlockEvicted when get_new_blocks pops a cached block,
BlockFreed for each reference dropped, each naming the block's KV-cache group. The manager emits
BlockAllocated / PrefixCacheHit, since it knows the request and the block's place in its table.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from engine.events import BlockEvicted, BlockFreed, BlockHashed, EventBus
from engine.v1.free_block_queue import FreeKVCacheBlockQueue
from engine.v1.kv_cache_utils import BlockHash, KVCacheBlock, external_block_hash

GPU = "gpu"


class BlockPool:
    """Allocate, cache, touch and free blocks (vLLM v1 BlockPool)."""

    def __init__(self, num_gpu_blocks: int, enable_caching: bool, events: EventBus | None = None) -> None:
        if not isinstance(num_gpu_blocks, int) or num_gpu_blocks < 2:
            raise ValueError(f"a v1 pool needs at least 2 blocks (block 0 is the null block), got {num_gpu_blocks!r}")
        self.num_gpu_blocks = num_gpu_blocks
        self.enable_caching = enable_caching
        self.events = events if events is not None else EventBus()
        self.blocks = [KVCacheBlock(i) for i in range(num_gpu_blocks)]
        self.free_block_queue = FreeKVCacheBlockQueue(self.blocks)
        # hash -> the blocks cached under it, in the order they were cached (a dict keeps it)
        self.cached_block_hash_to_block: dict[BlockHash, dict[int, KVCacheBlock]] = {}
        self.cached_block_group_ids: dict[int, int] = {}  # cached block id -> its KV-cache group
        self.null_block = self.free_block_queue.popleft()
        self.null_block.is_null = True

    def get_cached_block(self, block_hash: BlockHash, kv_cache_group_id: int = 0) -> KVCacheBlock | None:
        """The block cached first under `block_hash` in group `kv_cache_group_id`, or None (vLLM
        get_cached_block, which answers for a list of groups at once)."""
        blocks = self.cached_block_hash_to_block.get(block_hash)
        if not blocks:
            return None
        group_ids = self.cached_block_group_ids
        return next((block for block in blocks.values() if group_ids[block.block_id] == kv_cache_group_id), None)

    def get_cached_blocks(self, block_hash: BlockHash, kv_cache_group_ids: Sequence[int]) -> list[KVCacheBlock] | None:
        """The block cached first under `block_hash` in each of the groups, or None if one has
        none (vLLM get_cached_block)."""
        blocks = [self.get_cached_block(block_hash, group_id) for group_id in kv_cache_group_ids]
        return None if None in blocks else blocks

    def cache_full_blocks(self, blocks: list[KVCacheBlock], block_hashes: list[BlockHash],
                          num_cached_blocks: int, num_full_blocks: int, token_ids: Sequence[int],
                          block_size: int, kv_cache_group_id: int = 0) -> None:
        """Give blocks[num_cached_blocks:num_full_blocks] their hashes and cache them in group
        `kv_cache_group_id` (vLLM cache_full_blocks). A block that already has one (a prefix hit)
        and a null block (out of a sliding window) are left as they are."""
        for index in range(num_cached_blocks, num_full_blocks):
            block = blocks[index]
            if block.block_hash is not None or block.is_null:
                continue
            block_hash = block_hashes[index]
            same = self.cached_block_hash_to_block.setdefault(block_hash, {})
            first = all(self.cached_block_group_ids[b] != kv_cache_group_id for b in same)
            same[block.block_id] = block
            self.cached_block_group_ids[block.block_id] = kv_cache_group_id
            block.block_hash = block_hash
            if self.events.active:
                parent = external_block_hash(block_hashes[index - 1]) if index else None
                self.events.emit(BlockHashed, device=GPU, block=block.block_id,
                                 block_hash=external_block_hash(block_hash), parent_hash=parent,
                                 token_ids=tuple(token_ids[index * block_size : (index + 1) * block_size]),
                                 num_hashed_tokens=(index + 1) * block_size, registered=first,
                                 group=kv_cache_group_id)

    def get_new_blocks(self, num_blocks: int) -> list[KVCacheBlock]:
        """Pop `num_blocks` blocks from the head of the free queue, evicting any that is still
        cached, each with ref_cnt 1 (vLLM get_new_blocks). A ValueError if too few are free."""
        if num_blocks > self.get_num_free_blocks():
            raise ValueError(f"cannot get {num_blocks} free blocks from the pool")
        blocks = self.free_block_queue.popleft_n(num_blocks)
        for block in blocks:
            if self.enable_caching:
                self._maybe_evict_cached_block(block)
            assert block.ref_cnt == 0, f"block {block.block_id} was free with ref_cnt {block.ref_cnt}"
            block.ref_cnt = 1
        return blocks

    def _maybe_evict_cached_block(self, block: KVCacheBlock) -> bool:
        """Drop a popped block's hash from the prefix cache (vLLM _maybe_evict_cached_block)."""
        block_hash = block.block_hash
        if block_hash is None:
            return False
        same = self.cached_block_hash_to_block.get(block_hash)
        if not same or same.pop(block.block_id, None) is None:
            return False
        group = self.cached_block_group_ids.pop(block.block_id)
        if not same:
            del self.cached_block_hash_to_block[block_hash]
        block.reset_hash()
        if self.events.active:
            self.events.emit(BlockEvicted, device=GPU, block=block.block_id,
                             block_hash=external_block_hash(block_hash), group=group)
        return True

    def touch(self, blocks: Iterable[KVCacheBlock]) -> None:
        """One more reference to each block; a free one leaves the free queue; the null block is
        skipped (vLLM touch)."""
        for block in blocks:
            if block.is_null:
                continue
            if block.ref_cnt == 0:
                self.free_block_queue.remove(block)
            block.ref_cnt += 1

    def free_blocks(self, ordered_blocks: Iterable[KVCacheBlock], seq_id: int = -1, kv_cache_group_id: int = 0
                    ) -> None:
        """Drop one reference to each block of group `kv_cache_group_id`, given in eviction order
        (vLLM free_blocks). Blocks
        reaching 0 go back to the free queue: those without a hash to its head, in the order given,
        those with one to its tail, in the order given.

        Events, one BlockFreed per block (for `seq_id`): blocks still held first, then the blocks
        going to the head in reverse order, then those going to the tail in order, so a view that
        puts each freed block at the head (no hash) or tail (hash) rebuilds the queue."""
        blocks = [block for block in ordered_blocks if not block.is_null]
        for block in blocks:
            block.ref_cnt -= 1
            assert block.ref_cnt >= 0, f"block {block.block_id} freed more often than taken"
        fresh = [b for b in blocks if b.ref_cnt == 0 and b.block_hash is None]
        cached = [b for b in blocks if b.ref_cnt == 0 and b.block_hash is not None]
        self.free_block_queue.prepend_n(fresh)
        self.free_block_queue.append_n(cached)
        if self.events.active:
            held = [b for b in blocks if b.ref_cnt > 0]
            for block in (*held, *reversed(fresh), *cached):
                self.events.emit(BlockFreed, device=GPU, block=block.block_id, seq_id=seq_id,
                                 ref_count=block.ref_cnt, cached=block.block_hash is not None,
                                 group=kv_cache_group_id)

    def get_num_free_blocks(self) -> int:
        """Free blocks, cached ones included, the null block not (vLLM get_num_free_blocks)."""
        return self.free_block_queue.num_free_blocks

    def get_usage(self) -> float:
        """The fraction of blocks in use, the null block left out (vLLM get_usage)."""
        total = self.num_gpu_blocks - 1
        return 1.0 - self.get_num_free_blocks() / total

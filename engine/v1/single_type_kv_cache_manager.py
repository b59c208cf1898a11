"""One KV-cache group's block tables (vLLM v1 `vllm/v1/core/single_type_kv_cache_manager.py`:
SingleTypeKVCacheManager, FullAttentionManager, SlidingWindowManager).

Each manager keeps, per request, the table of its group over the shared BlockPool, and knows
what its kind of attention needs: a full-attention table keeps every block until the request
ends; a sliding-window table gives back the blocks wholly before the window at the start of each
allocate_slots (`remove_skipped_blocks`) and holds the null block (block 0) in their slots, so
the table's indices stay token positions // block_size. A prefix hit is found per kind
(`find_longest_cache_hit`): full attention needs every block of the prefix cached, a sliding
window only the last cdiv(sliding_window - 1, block_size) blocks before the hit's end.

Left out of vLLM's managers: EAGLE's dropped block, KV-connector (external) tokens, partial-block
hits and their copy-on-write, sparse retention (`reachable_block_mask` reduced to its one effect
here: a window of 1 token never reads a cached block, so caches none), DCP / PCP.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable, Sequence

from engine.events import BlocksSkipped
from engine.sequence import Sequence as Request
from engine.v1.block_pool import BlockPool
from engine.v1.kv_cache_interface import KVCacheSpec, cdiv, sliding_window_of
from engine.v1.kv_cache_utils import BlockHash, KVCacheBlock


class SingleTypeKVCacheManager(ABC):
    """The tables of one KV-cache group, keyed by seq_id (vLLM SingleTypeKVCacheManager)."""

    def __init__(self, kv_cache_spec: KVCacheSpec, block_pool: BlockPool, kv_cache_group_id: int,
                 enable_caching: bool, max_admission_blocks_per_request: int | None = None) -> None:
        self.kv_cache_spec = kv_cache_spec
        self.block_size = kv_cache_spec.block_size
        self.block_pool = block_pool
        self.kv_cache_group_id = kv_cache_group_id
        self.enable_caching = enable_caching
        self.max_admission_blocks_per_request = max_admission_blocks_per_request  # None: no cap
        self.req_to_blocks: dict[int, list[KVCacheBlock]] = {}
        self.num_cached_block: dict[int, int] = {}  # seq_id -> its leading blocks already cached
        self._null_block = block_pool.null_block

    def get_num_blocks_to_allocate(self, seq_id: int, num_tokens: int, new_computed_blocks: Sequence[KVCacheBlock],
                                   total_computed_tokens: int, apply_admission_cap: bool = False) -> int:
        """Blocks the pool must give for `num_tokens` slots, prefix hits that are free (they
        leave the free queue) included (vLLM get_num_blocks_to_allocate). With
        `apply_admission_cap` (the whole-sequence admission gate) a sliding window counts at most
        the blocks it ever holds at once."""
        num_required_blocks = cdiv(num_tokens, self.block_size)
        if apply_admission_cap and self.max_admission_blocks_per_request is not None:
            num_required_blocks = min(num_required_blocks, self.max_admission_blocks_per_request)
        num_req_blocks = len(self.req_to_blocks.get(seq_id, ()))
        if seq_id in self.num_cached_block:  # a running request: no new hits
            return max(num_required_blocks - num_req_blocks, 0)
        num_skipped_blocks = self.get_num_skipped_tokens(total_computed_tokens) // self.block_size
        num_local_computed_blocks = len(new_computed_blocks) + num_req_blocks
        num_new_blocks = max(num_required_blocks - max(num_skipped_blocks, num_local_computed_blocks), 0)
        # hits before the window are not taken, so they need no room either
        num_skipped_new_computed_blocks = max(0, num_skipped_blocks - num_req_blocks)
        num_evictable_blocks = sum(1 for block in new_computed_blocks[num_skipped_new_computed_blocks:]
                                   if block.ref_cnt == 0 and not block.is_null)
        return num_new_blocks + num_evictable_blocks

    def add_local_computed_blocks(self, seq_id: int, new_computed_blocks: Sequence[KVCacheBlock],
                                  num_local_computed_tokens: int) -> None:
        """Put a new request's prefix hits in its table: the null block for the hits already out
        of the window, one more reference to the others (vLLM add_local_computed_blocks)."""
        req_blocks = self.req_to_blocks.setdefault(seq_id, [])
        assert not req_blocks, f"sequence {seq_id} already holds blocks"
        num_skipped_blocks = self.get_num_skipped_tokens(num_local_computed_tokens) // self.block_size
        new_computed_blocks = new_computed_blocks[num_skipped_blocks:]
        if self.enable_caching:
            self.block_pool.touch(new_computed_blocks)
        req_blocks.extend([self._null_block] * num_skipped_blocks)
        req_blocks.extend(new_computed_blocks)
        self.num_cached_block[seq_id] = len(req_blocks)

    def allocate_new_blocks(self, seq_id: int, num_tokens: int) -> list[KVCacheBlock]:
        """New blocks until the table holds `num_tokens` slots (vLLM allocate_new_blocks)."""
        req_blocks = self.req_to_blocks.setdefault(seq_id, [])
        num_new_blocks = cdiv(num_tokens, self.block_size) - len(req_blocks)
        if num_new_blocks <= 0:
            return []
        new_blocks = self.block_pool.get_new_blocks(num_new_blocks)
        req_blocks.extend(new_blocks)
        return new_blocks

    def cache_blocks(self, request: Request, num_tokens: int, block_hashes: Callable[[Request], list[BlockHash]]
                     ) -> None:
        """Hash and cache the blocks that `num_tokens` tokens fill (vLLM cache_blocks); the hashes
        come from `block_hashes(request)`."""
        num_cached_blocks = self.num_cached_block.get(request.seq_id, 0)
        num_full_blocks = num_tokens // self.block_size
        if num_cached_blocks >= num_full_blocks:
            return
        if self.caches_blocks:
            self.block_pool.cache_full_blocks(self.req_to_blocks[request.seq_id], block_hashes(request), num_cached_blocks,
                                              num_full_blocks, request.get_token_ids(), self.block_size,
                                              self.kv_cache_group_id)
        self.num_cached_block[request.seq_id] = num_full_blocks

    @property
    def caches_blocks(self) -> bool:
        """Whether a full block may ever serve a hit, so is worth caching."""
        return True

    def free(self, seq_id: int) -> None:
        """Give the request's blocks back, last first, so a chain's tail is evicted before its
        head; the null blocks at the head of a window's table are skipped (vLLM free,
        pop_blocks_for_free)."""
        blocks = self.req_to_blocks.pop(seq_id, [])
        self.num_cached_block.pop(seq_id, None)
        self.block_pool.free_blocks(reversed(blocks), seq_id, self.kv_cache_group_id)

    def remove_skipped_blocks(self, seq_id: int, num_computed_tokens: int) -> None:
        """Free the blocks no token from `num_computed_tokens` on will read, putting the null
        block in their slots; walks back from the last such block and stops at a null one (vLLM
        remove_skipped_blocks, _remove_blocks_in_range). Events: BlocksSkipped (the slots now
        null), then a BlockFreed per block."""
        num_skipped_tokens = self.get_num_skipped_tokens(num_computed_tokens)
        blocks = self.req_to_blocks.get(seq_id)
        if num_skipped_tokens <= 0 or not blocks:
            return
        freed, indices = [], []
        for index in range(min(num_skipped_tokens // self.block_size, len(blocks)) - 1, -1, -1):
            if blocks[index].is_null:
                break
            freed.append(blocks[index])
            indices.append(index)
            blocks[index] = self._null_block
        if freed:
            events = self.block_pool.events
            if events.active:
                events.emit(BlocksSkipped, seq_id=seq_id, group=self.kv_cache_group_id,
                            logical_indices=tuple(reversed(indices)), blocks=tuple(b.block_id for b in reversed(freed)))
            self.block_pool.free_blocks(freed, seq_id, self.kv_cache_group_id)

    def get_num_skipped_tokens(self, num_computed_tokens: int) -> int:
        """Leading tokens the next token does not attend to (vLLM get_num_skipped_tokens)."""
        return 0

    @classmethod
    @abstractmethod
    def find_longest_cache_hit(cls, block_hashes: list[BlockHash], max_length: int, kv_cache_group_ids: list[int],
                               block_pool: BlockPool, kv_cache_spec: KVCacheSpec
                               ) -> tuple[tuple[list[KVCacheBlock], ...], int]:
        """The longest prefix of at most `max_length` tokens cached in every group of
        `kv_cache_group_ids`: a block list per group (the null block where the prefix's blocks
        are not needed) and its length in tokens (vLLM find_longest_cache_hit)."""


class FullAttentionManager(SingleTypeKVCacheManager):
    """Full-attention tables: every block until the request ends (vLLM FullAttentionManager)."""

    @classmethod
    def find_longest_cache_hit(cls, block_hashes, max_length, kv_cache_group_ids, block_pool, kv_cache_spec):
        """Cached blocks from the first on, up to the first miss: a chained hash that misses
        means every later one misses too."""
        computed_blocks: tuple[list[KVCacheBlock], ...] = tuple([] for _ in kv_cache_group_ids)
        for block_hash in block_hashes[: max_length // kv_cache_spec.block_size]:
            cached_blocks = block_pool.get_cached_blocks(block_hash, kv_cache_group_ids)
            if cached_blocks is None:
                break
            for computed, cached in zip(computed_blocks, cached_blocks):
                computed.append(cached)
        return computed_blocks, len(computed_blocks[0]) * kv_cache_spec.block_size


class SlidingWindowManager(SingleTypeKVCacheManager):
    """Sliding-window tables: blocks before the window go back to the pool as the request grows
    (vLLM SlidingWindowManager)."""

    def __init__(self, kv_cache_spec: KVCacheSpec, **kwargs) -> None:
        super().__init__(kv_cache_spec, **kwargs)
        self.sliding_window = sliding_window_of(kv_cache_spec)

    @staticmethod
    def contiguous_blocks_for_hit(sliding_window: int, block_size: int) -> int:
        """Blocks a hit needs cached just before its end: those the window of the first token
        after the hit reads (vLLM _contiguous_blocks_for_hit)."""
        return cdiv(sliding_window - 1, block_size)

    @property
    def caches_blocks(self) -> bool:
        """A window of one token reads no earlier block, so no cached block could serve a hit
        (vLLM SlidingWindowManager.reachable_block_mask masks them all)."""
        return self.contiguous_blocks_for_hit(self.sliding_window, self.block_size) > 0

    @classmethod
    def find_longest_cache_hit(cls, block_hashes, max_length, kv_cache_group_ids, block_pool, kv_cache_spec):
        """From the right: the first run of contiguous_blocks_for_hit cached blocks ends the hit,
        the blocks before it are the null block. No such run: the cached blocks at the very start,
        if any, are the hit."""
        block_size = kv_cache_spec.block_size
        needed = cls.contiguous_blocks_for_hit(sliding_window_of(kv_cache_spec), block_size)
        max_num_blocks = max_length // block_size
        computed_blocks = tuple([block_pool.null_block] * max_num_blocks for _ in kv_cache_group_ids)
        num_contiguous_blocks = 0
        match_found = False
        for index in range(max_num_blocks - 1, -1, -1):
            cached_blocks = block_pool.get_cached_blocks(block_hashes[index], kv_cache_group_ids)
            if cached_blocks is None:
                num_contiguous_blocks = 0
                continue
            for computed, cached in zip(computed_blocks, cached_blocks):
                computed[index] = cached
            num_contiguous_blocks += 1
            if num_contiguous_blocks >= needed:
                for computed in computed_blocks:
                    del computed[index + num_contiguous_blocks :]
                match_found = True
                break
        if not match_found:
            for computed in computed_blocks:
                del computed[num_contiguous_blocks:]
        return computed_blocks, len(computed_blocks[0]) * block_size

    def get_num_skipped_tokens(self, num_computed_tokens: int) -> int:
        """Tokens before the window of the next token: with a window of 4 and 7 tokens computed,
        token 7 reads tokens 4..7, so 4 are skipped."""
        return max(0, num_computed_tokens - self.sliding_window + 1)


def get_manager_for_kv_cache_spec(kv_cache_spec: KVCacheSpec, block_pool: BlockPool, kv_cache_group_id: int,
                                  enable_caching: bool, max_admission_blocks_per_request: int | None = None
                                  ) -> SingleTypeKVCacheManager:
    """The manager for a group's spec (vLLM get_manager_for_kv_cache_spec)."""
    manager_class = FullAttentionManager if sliding_window_of(kv_cache_spec) is None else SlidingWindowManager
    return manager_class(kv_cache_spec, block_pool=block_pool, kv_cache_group_id=kv_cache_group_id,
                         enable_caching=enable_caching, max_admission_blocks_per_request=max_admission_blocks_per_request)

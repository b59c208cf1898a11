"""KVCacheCoordinator: the KV-cache groups of one model over one BlockPool (vLLM v1
`vllm/v1/core/kv_cache_coordinator.py`: KVCacheCoordinator, UnitaryKVCacheCoordinator,
HybridKVCacheCoordinator, get_kv_cache_coordinator).

It owns the pool and one SingleTypeKVCacheManager per group, and does each of KVCacheManager's
steps in every group: count the blocks to allocate, take the prefix hits, allocate, cache, free,
drop the blocks out of a window. The unitary coordinator (one group: every full-attention model)
looks a prefix hit up in its one group; the hybrid one finds the longest prefix that hits in
every group at once. With prefix caching off, KVCacheManager.get_computed_blocks answers "no
hit" itself (vLLM's KVCacheCoordinatorNoPrefixCache).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable, Sequence
from typing import NamedTuple

from engine.events import EventBus
from engine.sequence import Sequence as Request
from engine.v1.block_pool import BlockPool
from engine.v1.kv_cache_interface import KVCacheGroupSpec, KVCacheSpec, cdiv, max_admission_blocks_per_request
from engine.v1.kv_cache_utils import BlockHash, KVCacheBlock
from engine.v1.single_type_kv_cache_manager import (
    FullAttentionManager,
    SingleTypeKVCacheManager,
    get_manager_for_kv_cache_spec,
)

BlocksPerGroup = tuple[list[KVCacheBlock], ...]


class KVCacheCoordinator(ABC):
    """Every group's manager over one pool (vLLM KVCacheCoordinator)."""

    def __init__(self, kv_cache_groups: Sequence[KVCacheGroupSpec], num_gpu_blocks: int, enable_caching: bool,
                 events: EventBus, max_model_len: int | None = None, max_in_flight_tokens: int | None = None) -> None:
        self.kv_cache_groups = list(kv_cache_groups)
        self.block_pool = BlockPool(num_gpu_blocks, enable_caching, events)
        in_flight = max_in_flight_tokens if max_in_flight_tokens is not None else max_model_len
        self.single_type_managers: tuple[SingleTypeKVCacheManager, ...] = tuple(
            get_manager_for_kv_cache_spec(
                group.kv_cache_spec, self.block_pool, group_id, enable_caching,
                max_admission_blocks_per_request(group.kv_cache_spec, in_flight, max_model_len)
                if max_model_len is not None else None)
            for group_id, group in enumerate(self.kv_cache_groups))

    def get_num_blocks_to_allocate(self, seq_id: int, num_tokens: int, new_computed_blocks: BlocksPerGroup,
                                   total_computed_tokens: int, apply_admission_cap: bool = False) -> int:
        """Blocks to allocate over every group (vLLM get_num_blocks_to_allocate)."""
        num_blocks = 0
        for manager, blocks in zip(self.single_type_managers, new_computed_blocks):
            num_blocks += manager.get_num_blocks_to_allocate(seq_id, num_tokens, blocks, total_computed_tokens,
                                                             apply_admission_cap)
        return num_blocks

    def allocate_new_computed_blocks(self, seq_id: int, new_computed_blocks: BlocksPerGroup,
                                     num_local_computed_tokens: int) -> None:
        """Put a new request's prefix hits in each group's table; a running request has none
        (vLLM allocate_new_computed_blocks)."""
        if any(seq_id in manager.num_cached_block for manager in self.single_type_managers):
            assert not any(new_computed_blocks), f"running sequence {seq_id} cannot take new hits"
            return
        for manager, blocks in zip(self.single_type_managers, new_computed_blocks):
            manager.add_local_computed_blocks(seq_id, blocks, num_local_computed_tokens)

    def allocate_new_blocks(self, seq_id: int, num_tokens: int) -> BlocksPerGroup:
        """New blocks in each group until its table holds `num_tokens` slots (vLLM
        allocate_new_blocks)."""
        return tuple([manager.allocate_new_blocks(seq_id, num_tokens) for manager in self.single_type_managers])

    def cache_blocks(self, request: Request, num_computed_tokens: int,
                     block_hashes: Callable[[Request], list[BlockHash]]) -> None:
        """Cache the full blocks of every group (vLLM cache_blocks); `block_hashes(request)` gives
        the request's block hashes (vLLM's request.block_hashes), asked only when a block fills."""
        for manager in self.single_type_managers:
            manager.cache_blocks(request, num_computed_tokens, block_hashes)

    def free(self, seq_id: int) -> None:
        """Free the request's blocks, group after group (vLLM free)."""
        for manager in self.single_type_managers:
            manager.free(seq_id)

    def remove_skipped_blocks(self, seq_id: int, num_computed_tokens: int) -> None:
        """Free what each group no longer reads (vLLM remove_skipped_blocks)."""
        for manager in self.single_type_managers:
            manager.remove_skipped_blocks(seq_id, num_computed_tokens)

    def get_blocks(self, seq_id: int) -> BlocksPerGroup:
        """The request's table in each group (vLLM get_blocks)."""
        return tuple(manager.req_to_blocks.get(seq_id) or [] for manager in self.single_type_managers)

    @abstractmethod
    def find_longest_cache_hit(self, block_hashes: list[BlockHash], max_cache_hit_length: int
                               ) -> tuple[BlocksPerGroup, int]:
        """The hit blocks of each group and the hit's length in tokens."""


class UnitaryKVCacheCoordinator(KVCacheCoordinator):
    """One KV-cache group: all layers full attention, or all one sliding window (vLLM
    UnitaryKVCacheCoordinator)."""

    def find_longest_cache_hit(self, block_hashes, max_cache_hit_length):
        manager = self.single_type_managers[0]
        return manager.find_longest_cache_hit(block_hashes, max_cache_hit_length, [0], self.block_pool,
                                              manager.kv_cache_spec)


class SpecGroup(NamedTuple):
    """Groups of one spec, looked up together (vLLM SpecGroup)."""

    spec: KVCacheSpec
    group_ids: list[int]
    manager_cls: type[SingleTypeKVCacheManager]


class HybridKVCacheCoordinator(KVCacheCoordinator):
    """Several KV-cache groups: a prefix hit counts only as far as it holds in all of them
    (vLLM HybridKVCacheCoordinator)."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.verify_and_split_kv_cache_groups()

    def verify_and_split_kv_cache_groups(self) -> None:
        """Gather the groups of equal spec into SpecGroups, full attention first: its scan from
        the left bounds the hit before the window groups scan from the right (vLLM
        verify_and_split_kv_cache_groups)."""
        if len({group.kv_cache_spec.block_size for group in self.kv_cache_groups}) != 1:
            raise ValueError("every KV-cache group must have the same block size")
        self.attention_groups: list[SpecGroup] = []
        for group_id, group in enumerate(self.kv_cache_groups):
            for spec_group in self.attention_groups:
                if spec_group.spec == group.kv_cache_spec:
                    spec_group.group_ids.append(group_id)
                    break
            else:
                manager_cls = type(self.single_type_managers[group_id])
                self.attention_groups.append(SpecGroup(group.kv_cache_spec, [group_id], manager_cls))
        self.attention_groups.sort(key=lambda g: g.manager_cls is not FullAttentionManager)

    def find_longest_cache_hit(self, block_hashes, max_cache_hit_length):
        """Each spec group in turn accepts the candidate length or shortens it; after a
        shortening every group is asked again, until none shortens it (full attention is looked
        up once, then cut). One full and one other spec group settle in one round (vLLM
        find_longest_cache_hit)."""
        num_groups = len(self.kv_cache_groups)
        hit_length = max_cache_hit_length
        hit_blocks_by_group: list[list[KVCacheBlock] | None] = [None] * num_groups
        hit_length_by_group = [0] * num_groups
        is_simple_hybrid = (len(self.attention_groups) == 2
                            and self.attention_groups[0].manager_cls is FullAttentionManager)
        while True:
            curr_hit_length = hit_length
            for spec, group_ids, manager_cls in self.attention_groups:
                first = group_ids[0]
                if manager_cls is FullAttentionManager and hit_blocks_by_group[first] is not None:
                    curr_hit_length = min(curr_hit_length, hit_length_by_group[first])
                    continue
                hit_blocks, curr_hit_length = manager_cls.find_longest_cache_hit(
                    block_hashes, curr_hit_length, group_ids, self.block_pool, spec)
                for group_id, blocks in zip(group_ids, hit_blocks):
                    hit_blocks_by_group[group_id] = blocks
                    hit_length_by_group[group_id] = curr_hit_length
            if curr_hit_length >= hit_length:
                break
            hit_length = curr_hit_length
            if is_simple_hybrid:
                break
        for spec, group_ids, manager_cls in self.attention_groups:
            if manager_cls is FullAttentionManager:
                for group_id in group_ids:
                    del hit_blocks_by_group[group_id][cdiv(hit_length, spec.block_size):]
        return tuple(blocks if blocks is not None else [] for blocks in hit_blocks_by_group), hit_length


def get_kv_cache_coordinator(kv_cache_groups: Sequence[KVCacheGroupSpec], num_gpu_blocks: int, enable_caching: bool,
                             events: EventBus, max_model_len: int | None = None,
                             max_in_flight_tokens: int | None = None) -> KVCacheCoordinator:
    """The unitary coordinator for one group, the hybrid one for more (vLLM get_kv_cache_coordinator)."""
    if not kv_cache_groups:
        raise ValueError("a KV cache needs at least one KV-cache group")
    cls = UnitaryKVCacheCoordinator if len(kv_cache_groups) == 1 else HybridKVCacheCoordinator
    return cls(kv_cache_groups, num_gpu_blocks, enable_caching, events, max_model_len, max_in_flight_tokens)

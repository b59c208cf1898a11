"""vLLM v1's KV cache manager and scheduler, beside v0's (engine/block_manager.py, engine/scheduler.py).

`EngineConfig(kv_manager="v1")` picks them. Each file mirrors one of vLLM's, under the same names:

- kv_cache_utils.py: `KVCacheBlock` and the chained block hash (vllm/v1/core/kv_cache_utils.py)
- free_block_queue.py: `FreeKVCacheBlockQueue`, the doubly linked free list in eviction order
- block_pool.py: `BlockPool` (vllm/v1/core/block_pool.py): allocate, cache, touch, free, evict lazily
- kv_cache_interface.py: `FullAttentionSpec`, `SlidingWindowSpec`, `KVCacheGroupSpec` and
  get_kv_cache_groups (vllm/v1/kv_cache_interface.py, vllm/v1/core/kv_cache_planning.py)
- single_type_kv_cache_manager.py: one KV-cache group's tables, `FullAttentionManager` and
  `SlidingWindowManager` (vllm/v1/core/single_type_kv_cache_manager.py)
- kv_cache_coordinator.py: the groups over one pool, `UnitaryKVCacheCoordinator` and
  `HybridKVCacheCoordinator` (vllm/v1/core/kv_cache_coordinator.py)
- kv_cache_manager.py: `KVCacheManager` (vllm/v1/core/kv_cache_manager.py): get_computed_blocks,
  allocate_slots, free, get_num_common_prefix_blocks
- scheduler.py: `Scheduler` (vllm/v1/core/sched/scheduler.py): one token budget, chunked prefill,
  recompute-only preemption
"""

from engine.v1.block_pool import BlockPool
from engine.v1.free_block_queue import FreeKVCacheBlockQueue
from engine.v1.kv_cache_manager import KVCacheManager
from engine.v1.kv_cache_utils import KVCacheBlock, hash_block_tokens

__all__ = ["BlockPool", "FreeKVCacheBlockQueue", "KVCacheBlock", "KVCacheManager", "hash_block_tokens"]

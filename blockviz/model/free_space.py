"""Free space as each design of prefix caching counts it, from the reducer's state alone.

vLLM counts a cached block with no holder as free: it waits in the free queue and is evicted lazily,
one block at a time, when an allocation pops it (vllm/v1/core/block_pool.py
`BlockPool.get_num_free_blocks`; v0's `CachingBlockAllocator.get_num_free_blocks` adds its
evictor's blocks). SGLang counts it as not free: its slots stay in the radix tree until
`RadixCache.evict` deletes whole leaves, so the allocator's `available_size()` leaves them out and
a scheduler's budget is `available_size() + evictable_size()` (sglang/srt/managers/schedule_policy.py
`PrefillAdder.rem_total_tokens`; sglang/srt/mem_cache/radix_cache.py `RadixCache.evictable_size`,
the tokens of nodes whose lock_ref is 0). Neither counts the null block (vLLM v1's
`BlockPool.null_block`, SGLang's padding page 0).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from blockviz.model.design import get_design
from blockviz.model.reducer import CACHED_CODE, FREE_CODE, ReducerState

_FREE, _CACHED = FREE_CODE.encode("ascii"), CACHED_CODE.encode("ascii")


@dataclass(slots=True, frozen=True)
class FreeSpace:
    """One pool's free space at a moment, in blocks (pages) and in token slots.

    `free` blocks hold nothing; `cached` blocks hold a cached prefix and no request (vLLM: free
    but hashed; SGLang: pages of unlocked tree nodes, what `evict` may take). `cached_is_free`
    says how the design counts the cached ones."""

    design: str  # the kv_manager: "v0", "v1", "vllm", "sglang"
    cached_is_free: bool
    free: int
    cached: int
    block_size: int
    evictable_tokens: int  # SGLang's evictable_size(): tokens of the nodes with lock_ref 0 (vLLM: cached * block_size)

    @property
    def counted_free(self) -> int:
        """The blocks the design itself calls free (vLLM's get_num_free_blocks, SGLang's
        available_size() // page_size)."""
        return self.free + self.cached if self.cached_is_free else self.free

    @property
    def budget(self) -> int:
        """The blocks a new request may take, evicting what it must: free plus cached in both designs."""
        return self.free + self.cached

    @property
    def unit(self) -> str:
        """What the design calls a block: SGLang (the design that counts cached ones not free) a page."""
        return "page" if not self.cached_is_free else "block"

    def line(self) -> str:
        """The count in the design's own words: 'free 7 blocks (28 tokens), 3 of them cached: vLLM
        counts cached blocks free' or 'free 2 pages (8 tokens) · evictable 5 (20 tokens) · budget 7:
        SGLang counts cached pages not free'."""
        unit, size = self.unit, self.block_size
        if self.cached_is_free:
            return (f"free {_count(self.counted_free, unit)} ({self.counted_free * size} tokens), {self.cached} of "
                    f"them cached: {_who(self.design)} counts cached blocks free")
        return (f"free {_count(self.free, unit)} ({self.free * size} tokens) · evictable {self.cached} "
                f"({self.evictable_tokens} tokens) · budget {self.budget}: SGLang counts cached pages not free")

    @classmethod
    def from_json(cls, data: dict[str, Any], block_size: int) -> "FreeSpace":
        """The inverse of to_json (which leaves the block size to the run's header)."""
        return cls(data["design"], data["cached_is_free"], data["free"], data["cached"], block_size,
                   data["evictable_tokens"])

    def to_json(self) -> dict[str, Any]:
        return {"design": self.design, "cached_is_free": self.cached_is_free, "free": self.free,
                "cached": self.cached, "counted_free": self.counted_free, "budget": self.budget,
                "evictable_tokens": self.evictable_tokens, "unit": self.unit}


def free_space(state: ReducerState, device: str = "gpu") -> FreeSpace:
    """`device`'s free space at `state`, counted as its design counts it (the module docstring)."""
    codes = state.codes[device]
    free, cached = codes.count(_FREE), codes.count(_CACHED)
    radix = state.design.radix_tree
    evictable = (sum(len(node.slots) for node in state.radix_nodes.values() if node.lock_ref == 0) if radix
                 else cached * state.block_size)
    return FreeSpace(state.kv_manager, not radix, free, cached, state.block_size, evictable)


def _count(n: int, unit: str) -> str:
    return f"{n} {unit}" + ("" if n == 1 else "s")


def _who(design: str) -> str:
    return "vLLM" if get_design(design).free_queue else "vLLM v0"  # v1's free queue, v0's evictor

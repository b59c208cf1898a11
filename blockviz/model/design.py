"""The KV-cache designs a run may have used, as the traits the views depend on.

A trace header (or a live engine's) names its design in "kv_manager": "v0" (vLLM v0's
BlockSpaceManager and Scheduler), "v1" (vLLM v1's KVCacheManager over a BlockPool) or "vllm"
(vLLM's own v1 Scheduler and KVCacheManager, engine/vllm_core/: v1's traits, its events are v1's);
older traces name none and are v0. The model layer and the front ends ask `design_of(header)` (or
`KV_DESIGNS[name]`) what the design does (`if design.null_block:`) instead of comparing names, so
each difference is written once, here, beside the vLLM code it mirrors.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any


@dataclass(frozen=True, slots=True)
class KVDesign:
    """What a KV-cache design does, as far as the pictures of its blocks can tell."""

    name: str  # "v0", "v1" or "vllm": the header's kv_manager
    null_block: bool  # block 0 is a placeholder never allocated or counted (v1 BlockPool.null_block)
    free_queue: bool  # free blocks wait in eviction order, a cached one at the tail (v1 FreeKVCacheBlockQueue)
    shared_hashes: bool  # one hash may sit on several blocks (v1 BlockPool.cached_block_hash_to_block)
    swaps: bool  # preemption may swap a sequence's blocks to a CPU pool (v0 Scheduler._preempt_by_swap)
    copy_on_write: bool  # n > 1 forks a sequence and copies a shared last block on write (v0 BlockSpaceManager.fork)
    chunked_prefill: bool  # a prompt's K/V may be computed over several steps (v1 Request.num_computed_tokens)
    hash_collision_guard: bool  # a hit also compares the block's tokens (v0); v1 trusts the hash
    run_hash_algo: bool  # blocks hash with the run's algorithm, as events carry it (v1 hash_block_tokens)
    fork_and_preempt_commands: bool  # a live run forks or preempts a sequence on command (v0's engine)


KV_DESIGNS: dict[str, KVDesign] = {
    "v0": KVDesign("v0", null_block=False, free_queue=False, shared_hashes=False, swaps=True,
                   copy_on_write=True, chunked_prefill=False, hash_collision_guard=True, run_hash_algo=False,
                   fork_and_preempt_commands=True),
    "v1": KVDesign("v1", null_block=True, free_queue=True, shared_hashes=True, swaps=False,
                   copy_on_write=False, chunked_prefill=True, hash_collision_guard=False, run_hash_algo=True,
                   fork_and_preempt_commands=False),
}
KV_DESIGNS["vllm"] = replace(KV_DESIGNS["v1"], name="vllm")


def kv_manager_of(header: dict[str, Any]) -> str:
    """The design a run's header names ("v0" when it names none: traces from before v1)."""
    return header.get("kv_manager") or "v0"


def design_of(header: dict[str, Any]) -> KVDesign:
    """The traits of the design a run's header names (kv_manager_of)."""
    return KV_DESIGNS[kv_manager_of(header)]

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
from typing import Any, NamedTuple


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


# The model blockviz/session/tiny_hybrid.py builds: random weights, so its text is noise and its memory real.
TINY_HYBRID = "tiny-hybrid"


def model_name(header: dict[str, Any]) -> str:
    """A run's model as a title names it: the name it was asked by ("tiny-shakespeare", "gpt2"), or
    a checkpoint directory's own name, never the directory it sits in (a cache or a temporary
    directory, which changes from machine to machine and run to run); "tiny-hybrid" for its builds."""
    model = str(header.get("model") or "?")
    if has_random_weights(header):
        return TINY_HYBRID
    path = model.replace("\\", "/").rstrip("/")
    if not (path.startswith(("/", ".", "~")) or path.count("/") > 1):  # a name: "gpt2", "org/model"
        return model
    return path.rsplit("/", 1)[-1] or model


def has_random_weights(header: dict[str, Any]) -> bool:
    """Whether a run's model is tiny-hybrid: by name (a shipped trace's header) or as the directory it
    was built in (`tiny-hybrid-vN`, a live run's)."""
    name = str(header.get("model") or "").rstrip("/").rsplit("/", 1)[-1]
    return name == TINY_HYBRID or name.startswith(f"{TINY_HYBRID}-v")


def kv_manager_of(header: dict[str, Any]) -> str:
    """The design a run's header names ("v0" when it names none: traces from before v1)."""
    return header.get("kv_manager") or "v0"


def design_of(header: dict[str, Any]) -> KVDesign:
    """The traits of the design a run's header names (kv_manager_of)."""
    return KV_DESIGNS[kv_manager_of(header)]


FULL_ATTENTION, SLIDING_WINDOW = "full_attention", "sliding_window"  # vLLM's KVCacheSpecKind values


class KVCacheGroup(NamedTuple):
    """One KV-cache group of a run, as its header names it (vLLM KVCacheGroupSpec: its layers
    share one block table per request): its kind, its window (sliding_window only) and its layers."""

    kind: str  # FULL_ATTENTION or SLIDING_WINDOW (vLLM get_kv_cache_spec_kind)
    sliding_window: int | None
    layer_names: tuple[str, ...]


def kv_cache_groups_of(header: dict[str, Any]) -> tuple[KVCacheGroup, ...]:
    """The KV-cache groups a run's header names ("kv_cache_groups", as dicts or KVCacheGroups); ()
    when it names none: one group of full attention, as every run before hybrid models."""
    return tuple(group if isinstance(group, KVCacheGroup)
                 else KVCacheGroup(group["kind"], group.get("sliding_window"), tuple(group.get("layer_names", ())))
                 for group in header.get("kv_cache_groups") or ())


def kv_cache_groups_header(groups) -> list[dict[str, Any]]:
    """A run's KV-cache groups, each (kind, window or None, layer names), as its header's
    "kv_cache_groups": per group its kind (FULL_ATTENTION or SLIDING_WINDOW), its window
    (sliding_window only) and its layers, as vLLM's KVCacheManager.kv_cache_event_metadata names
    them; [] for one group of full attention, whose header is as it was before groups (it has no
    such field). A model whose every layer has one window has one group, named: its windows let
    blocks go (BlocksSkipped)."""
    groups = list(groups)
    if len(groups) == 1 and groups[0][0] == FULL_ATTENTION:
        return []
    return [{"kind": kind, **({"sliding_window": window} if kind == SLIDING_WINDOW else {}),
             "layer_names": [str(name) for name in layer_names]} for kind, window, layer_names in groups]

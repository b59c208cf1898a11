"""The KV-cache designs a run may have used, as the traits the views depend on.

A trace header (or a live engine's) names its design in "kv_manager": "v0" (vLLM v0's
BlockSpaceManager and Scheduler), "v1" (vLLM v1's KVCacheManager over a BlockPool) or "vllm"
(vLLM's own v1 Scheduler and KVCacheManager, engine/vllm_core/: v1's traits, its events are v1's);
older traces name none and are v0. The model layer and the front ends ask `design_of(header)` (or
`KV_DESIGNS[name]`) what the design does (`if design.null_block:`) instead of comparing names; the
traits are the engine's registry's entries (engine/designs.py), each difference written once there.
"""

from __future__ import annotations

from typing import Any, NamedTuple

from engine.designs import DEFAULT, DESIGNS, Design, get_design  # noqa: F401 (DEFAULT re-exported)


# The engine's registry (engine/designs.py) is the one table: a design's entry is its traits here too
KVDesign = Design
KV_DESIGNS: dict[str, Design] = DESIGNS


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
    return header.get("kv_manager") or DEFAULT.name


def design_of(header: dict[str, Any]) -> KVDesign:
    """The traits of the design a run's header names (kv_manager_of)."""
    return get_design(kv_manager_of(header))


def has_cpu_tier(header: dict[str, Any]) -> bool:
    """Whether a run's CPU pool is a CPU tier of block copies (vLLM's, kv_offloading_size): a design
    that may have one, with a CPU pool."""
    return design_of(header).cpu_tier and bool(header.get("num_cpu_blocks"))


def async_scheduling_of(header: dict[str, Any]) -> bool:
    """Whether a run scheduled in vLLM's asynchronous order (the header's "async_scheduling", a
    design that has the order; False for a header without it: every other design, and runs
    recorded before the field)."""
    return design_of(header).async_scheduling and header.get("async_scheduling") is True


def upstream_of(header: dict[str, Any]) -> str:
    """The project and release whose own scheduler and KV-cache manager drove a run ("vLLM 0.33.0":
    the design's `upstream` and the header's "<design>_version"), "" for blockviz's own designs."""
    design = design_of(header)
    if not design.upstream:
        return ""
    version = header.get(f"{design.name}_version")
    return f"{design.upstream} {version}" if version else design.upstream


def attribution(header: dict[str, Any]) -> str:
    """Whose code drives a run, in one sentence, when it is not all blockviz's (`--kv-manager
    vllm`), else "": the views say it, so a run on vLLM's own scheduler never looks like one on
    blockviz's v1."""
    who = upstream_of(header)
    if not who:
        return ""
    if design_of(header).radix_tree:  # SGLang's objects: no Scheduler, KVCacheManager or BlockPool of vLLM's
        return f"{who}'s RadixCache, KV allocator and scheduling policy drive this run; the model runner and the K/V tensors are blockviz's"
    tier = " (and its SimpleCPUOffloadScheduler the CPU tier)" if has_cpu_tier(header) else ""
    ours = "the model runner, the K/V tensors and their copies" if tier else "the model runner and the K/V tensors"
    return (f"{who}'s Scheduler, KVCacheManager and BlockPool drive this run{tier}; {ours} are blockviz's. "
            + scheduling_order(header))


def scheduling_order(header: dict[str, Any]) -> str:
    """Which order a vLLM-driven run scheduled in, in one sentence ("" for a design with one
    order): vLLM 0.33's default asynchronous one (EngineCore.step_with_batch_queue: the next step
    scheduled before the last one's output is processed) or the synchronous one."""
    if not design_of(header).async_scheduling:
        return ""
    if async_scheduling_of(header):
        return "It schedules in vLLM's default asynchronous order (blocks a step frees go back a step later)"
    return ("It schedules in vLLM's synchronous order (async_scheduling=false"
            + (", as the CPU tier needs" if has_cpu_tier(header) else "") + ")")


def attribution_title(header: dict[str, Any]) -> str:
    """`attribution` in a few words for a title line ("on vLLM 0.33.0's own Scheduler and
    KVCacheManager; model runner: blockviz"), "" for blockviz's own designs."""
    who = upstream_of(header)
    parts = "RadixCache and scheduling policy" if design_of(header).radix_tree else "Scheduler and KVCacheManager"
    return f"on {who}'s own {parts}; model runner: blockviz" if who else ""


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
    them; [] for one group of full attention, whose header has no such field. A model whose every layer has one window has one group, named: its windows let
    blocks go (BlocksSkipped)."""
    groups = list(groups)
    if len(groups) == 1 and groups[0][0] == FULL_ATTENTION:
        return []
    return [{"kind": kind, **({"sliding_window": window} if kind == SLIDING_WINDOW else {}),
             "layer_names": [str(name) for name in layer_names]} for kind, window, layer_names in groups]

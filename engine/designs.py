"""The KV-cache designs an engine can run, one entry each: what the design can do, and how it builds
its KV-cache groups, block manager and scheduler from the engine's config.

- `V0`: vLLM v0's BlockSpaceManager and Scheduler (engine/block_manager.py, engine/scheduler.py):
  forks with copy-on-write, swaps to a CPU pool, one block table per sequence.
- `V1`: vLLM v1's KVCacheManager and Scheduler, ours and readable (engine/v1/): a BlockPool with a
  null block and a free queue, one token budget with chunked prefill, recompute-only preemption,
  KV-cache groups for hybrid models, n > 1 as n requests, vLLM 0.33's async scheduling.
- `VLLM`: vLLM 0.33's own Scheduler and KVCacheManager behind the same seam (engine/vllm_core/):
  v1's traits, plus vLLM's CPU tier (kv_offloading_size).
- `SGLANG`: SGLang 0.5.23's own RadixCache, KV allocator, SchedulePolicy and PrefillAdder behind the
  same seam (engine/sglang_core/): a radix tree of token runs instead of hashed blocks, SGLang's
  retraction for preemption.

Everything that differs between designs is a field here: the engine and every view ask the entry
(`if design.swap:`), never its name. `EngineConfig.kv_manager` names an entry (`get_design`); a
trace header's "kv_manager" does too (no name: V0, the traces made before v1). Plain Python: the
builders import their modules (torch, vLLM) when they run.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

VLLM_INSTALL = ("kv_manager 'vllm' runs vLLM's own scheduler and needs vLLM: pip install -e '.[vllm]' && "
                "pip install --no-deps vllm==0.33.0")
SGLANG_INSTALL = ("kv_manager 'sglang' runs SGLang's own radix cache and needs SGLang: pip install -e '.[vllm,sglang]' && "
                  "pip install --no-deps sglang==0.5.23")


@dataclass(slots=True)
class DesignBuild:
    """What a design is built from, for one engine (nano-vllm's `Config` as the scheduler sees it):
    the engine's config, its scheduler limits, the model's per-layer KV-cache specs, where the model
    lives, whether it reads an attention metadata per layer, the event bus, and the output processor
    every design's update_from_output hands the sampled tokens to. `vllm_config` is filled by
    VLLM's groups step (vLLM's VllmConfig, built before the pool is sized)."""

    config: Any  # EngineConfig
    scheduler_config: Any  # SchedulerConfig
    kv_cache_specs: list
    model_path: str
    takes_layer_metadata: bool
    events: Any  # EventBus
    output_processor: Any  # OutputProcessor
    vllm_config: Any = None


@dataclass(frozen=True, slots=True)
class Design:
    """One KV-cache design: its name (EngineConfig.kv_manager, a trace header's "kv_manager"), what it
    can do, and its builders. Capabilities carry vLLM's names where vLLM has them."""

    name: str
    description: str
    fork: bool  # a sequence forks, its child sharing every block (v0 BlockSpaceManager.fork); `LLMEngine.fork`
    copy_on_write: bool  # a shared last block is copied before a write (v0 append_slots)
    swap: bool  # preemption may swap a request's blocks to a CPU pool (v0 Scheduler._preempt_by_swap); `LLMEngine.preempt`
    cpu_tier: bool  # vLLM's CPU offloading tier (kv_offloading_size): a second BlockPool on the CPU
    fans_out_n: bool  # n > 1 runs as n requests sharing the prompt through the cache (v1 ParentRequest)
    null_block: bool  # block 0 is a placeholder never allocated or counted (v1 BlockPool.null_block)
    free_queue: bool  # free blocks wait in eviction order, a cached one at the tail (v1 FreeKVCacheBlockQueue)
    shared_hashes: bool  # one hash may sit on several blocks (v1 BlockPool.cached_block_hash_to_block)
    chunked_prefill: bool  # a prompt's K/V may be computed over several steps (v1 Request.num_computed_tokens)
    groups: bool  # KV-cache groups: a table per group for hybrid models (v1 KVCacheGroupSpec)
    hash_collision_guard: bool  # a hit also compares the block's tokens (v0); v1 trusts the hash
    run_hash_algo: bool  # blocks hash with the run's algorithm, as events carry it (v1 hash_block_tokens)
    enable_prefix_caching: bool  # the default of EngineConfig.enable_prefix_caching (off in v0, on in v1)
    vllm_options: bool  # takes vLLM SchedulerConfig / CacheConfig fields (EngineConfig.vllm_options)
    requires: str | None  # the package it needs installed (None: nothing beyond the engine's)
    # may schedule in vLLM's asynchronous order (AsyncScheduler, two batches in flight); whether a
    # run does is its scheduler's `async_scheduling` (LLMEngine.async_scheduling)
    async_scheduling: bool
    # prefix-cache hits counted in tokens, queried once per new request (v1 PrefixCacheStats); v0
    # counts its allocator's full-block lookups
    prefix_stats_in_tokens: bool
    vllm_api: str  # whose vLLM function names its operations carry, "v0" or "v1" (the guide's cards name them)
    build_kv_cache_groups: Callable[[DesignBuild, int], list | None]
    build_scheduler: Callable[[DesignBuild, Any, list | None], tuple[Any, Any, list | None]]
    upstream: str = ""  # the project whose own scheduler and KV-cache manager run ("vLLM"), "" for blockviz's
    install: str = ""  # the line naming how to install `requires`
    # the one-line check of the installed upstream release (a ValueError naming it and the supported one)
    check_version: Callable[[], str] | None = None
    radix_tree: bool = False  # prefixes live in a radix tree of token runs, shared per token (SGLang RadixCache)

    @property
    def fork_and_preempt_commands(self) -> bool:
        """A live run forks or preempts a sequence on command (v0's engine)."""
        return self.fork and self.swap

    def refusal(self, what: str) -> str:
        """The one-line reason this design refuses `what` ("fork", "swap")."""
        return REFUSALS[what].format(name=self.name)


REFUSALS = {
    "fork": "kv_manager {name!r} has no fork: n > 1 runs as requests sharing the prompt's cached blocks",
    "swap": "kv_manager {name!r} preempts by recompute only, when a step runs out of blocks; there is no swap to ask for",
}


# ------------------------------------------------------------------ builders (imports on first use)

def _no_groups(build: DesignBuild, max_num_batched_tokens: int) -> None:
    """One block table per sequence (vLLM v0)."""
    return None


def _v1_groups(build: DesignBuild, max_num_batched_tokens: int) -> list | None:
    """engine/v1's `get_kv_cache_groups` for a model that reads a metadata per layer; None (one group
    of every layer) otherwise."""
    if not build.takes_layer_metadata:
        return None
    from engine.v1.kv_cache_interface import get_kv_cache_groups

    return get_kv_cache_groups(build.kv_cache_specs)


def _vllm_groups(build: DesignBuild, max_num_batched_tokens: int) -> list:
    """vLLM's own grouping over its VllmConfig, built here (`build.vllm_config`; its num_gpu_blocks is
    set once the pool is sized, as vLLM's EngineCore sets it)."""
    from engine.vllm_core import build_vllm_kv_cache_groups

    build.vllm_config, groups = build_vllm_kv_cache_groups(
        build.config, build.model_path, build.scheduler_config.max_model_len, build.kv_cache_specs,
        max_num_batched_tokens)
    return groups


def _v0_scheduler(build: DesignBuild, budget: Any, groups: list | None) -> tuple[Any, Any, None]:
    """vLLM v0's BlockSpaceManager over both pools, and its Scheduler."""
    from engine.block_manager import BlockSpaceManager
    from engine.scheduler import Scheduler

    config = build.config
    manager = BlockSpaceManager(config.block_size, budget.num_gpu_blocks, budget.num_cpu_blocks,
                                watermark=config.watermark, enable_caching=config.enable_prefix_caching,
                                events=build.events)
    return manager, Scheduler(build.scheduler_config, manager, build.output_processor), None


def _v1_scheduler(build: DesignBuild, budget: Any, groups: list | None) -> tuple[Any, Any, list]:
    """engine/v1's KVCacheManager over the GPU pool, and its Scheduler."""
    from engine.v1.kv_cache_manager import KVCacheManager
    from engine.v1.scheduler import Scheduler

    config, scheduler_config = build.config, build.scheduler_config
    # a full token budget per batch in flight, two under async scheduling (vLLM VllmConfig.max_in_flight_tokens,
    # max_concurrent_batches)
    max_in_flight_tokens = (2 if config.async_scheduling else 1) * scheduler_config.max_num_batched_tokens
    manager = KVCacheManager(config.block_size, budget.num_gpu_blocks, scheduler_config.max_model_len,
                             enable_caching=bool(config.enable_prefix_caching),
                             hash_algo=config.prefix_caching_hash_algo, events=build.events,
                             kv_cache_groups=groups, max_in_flight_tokens=max_in_flight_tokens)
    scheduler = Scheduler(scheduler_config, manager, config.scheduler_reserve_full_isl,
                          output_processor=build.output_processor, async_scheduling=bool(config.async_scheduling))
    return manager, scheduler, manager.kv_cache_groups


def _vllm_scheduler(build: DesignBuild, budget: Any, groups: list) -> tuple[Any, Any, list]:
    """vLLM's own Scheduler over the sized pool, behind our scheduler interface."""
    from engine.vllm_core import make_vllm_scheduler

    scheduler = make_vllm_scheduler(
        build.vllm_config, groups, build.kv_cache_specs, budget.num_gpu_blocks, budget.block_bytes,
        build.config.block_size, build.events, build.scheduler_config.max_model_len, build.output_processor)
    return scheduler.kv_cache_manager, scheduler, scheduler.vllm.kv_cache_config.kv_cache_groups


def _sglang_scheduler(build: DesignBuild, budget: Any, groups: None) -> tuple[Any, Any, None]:
    """SGLang's RadixCache and scheduling policy over the sized pool, behind our scheduler interface."""
    from engine.sglang_core import make_sglang_scheduler

    scheduler_config = build.scheduler_config
    scheduler = make_sglang_scheduler(build.config, budget.num_gpu_blocks, scheduler_config.max_num_seqs,
                                      scheduler_config.max_model_len, scheduler_config.max_num_batched_tokens,
                                      build.events, build.output_processor)
    return scheduler, scheduler, None


def _check_vllm() -> str:
    from engine.vllm_core import check_vllm_version

    return check_vllm_version()


def _check_sglang() -> str:
    from engine.sglang_core import check_sglang_version

    return check_sglang_version()


# ------------------------------------------------------------------ the registry

V0 = Design("v0", "vLLM v0's BlockSpaceManager and Scheduler", fork=True, copy_on_write=True, swap=True,
            cpu_tier=False, fans_out_n=False, null_block=False, free_queue=False, shared_hashes=False,
            chunked_prefill=False, groups=False, hash_collision_guard=True, run_hash_algo=False,
            enable_prefix_caching=False, vllm_options=False, requires=None, async_scheduling=False,
            prefix_stats_in_tokens=False, vllm_api="v0",
            build_kv_cache_groups=_no_groups, build_scheduler=_v0_scheduler)
V1 = Design("v1", "vLLM v1's KVCacheManager and Scheduler (engine/v1/)", fork=False, copy_on_write=False,
            swap=False, cpu_tier=False, fans_out_n=True, null_block=True, free_queue=True, shared_hashes=True,
            chunked_prefill=True, groups=True, hash_collision_guard=False, run_hash_algo=True,
            enable_prefix_caching=True, vllm_options=False, requires=None, async_scheduling=True,
            prefix_stats_in_tokens=True, vllm_api="v1",
            build_kv_cache_groups=_v1_groups, build_scheduler=_v1_scheduler)
VLLM = Design("vllm", "vLLM 0.33's own Scheduler and KVCacheManager (engine/vllm_core/)", fork=False,
              copy_on_write=False, swap=False, cpu_tier=True, fans_out_n=True, null_block=True, free_queue=True,
              shared_hashes=True, chunked_prefill=True, groups=True, hash_collision_guard=False, run_hash_algo=True,
              enable_prefix_caching=True, vllm_options=True, requires="vllm", async_scheduling=True,
              prefix_stats_in_tokens=True, vllm_api="v1",
              build_kv_cache_groups=_vllm_groups, build_scheduler=_vllm_scheduler, upstream="vLLM",
              install=VLLM_INSTALL, check_version=_check_vllm)
SGLANG = Design("sglang", "SGLang 0.5.23's own RadixCache and scheduling policy (engine/sglang_core/)", fork=False,
                copy_on_write=False, swap=False, cpu_tier=False, fans_out_n=True, null_block=True, free_queue=False,
                shared_hashes=False, chunked_prefill=True, groups=False, hash_collision_guard=True,
                run_hash_algo=False, enable_prefix_caching=True, vllm_options=False, requires="sglang",
                async_scheduling=False, prefix_stats_in_tokens=True, vllm_api="v1",
                build_kv_cache_groups=_no_groups, build_scheduler=_sglang_scheduler, upstream="SGLang",
                install=SGLANG_INSTALL, check_version=_check_sglang, radix_tree=True)

DESIGNS: dict[str, Design] = {design.name: design for design in (V0, V1, VLLM, SGLANG)}
DEFAULT = V0  # what a config or a trace header that names no design ran


def get_design(name: str | Design | None) -> Design:
    """The entry `name` names (an entry is its own; None: DEFAULT); a ValueError listing the names
    otherwise."""
    if isinstance(name, Design):
        return name
    if name is None:
        return DEFAULT
    design = DESIGNS.get(name) if isinstance(name, str) else None
    if design is None:
        raise ValueError(f"kv_manager must be one of {', '.join(DESIGNS)}, got {name!r}")
    return design

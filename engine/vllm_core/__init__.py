"""`kv_manager="vllm"`: vLLM 0.33's own v1 Scheduler and KVCacheManager drive our engine (docs/vllm-core.md).

Not `engine/vllm`: a package of that name would shadow the vllm package itself. config.py builds
vLLM's objects for one engine, scheduler.py presents our scheduler interface over them,
event_tap.py emits blockviz's block events as vLLM's objects do each operation, and offload.py plays
the worker side of vLLM's CPU tier (`kv_offloading_size`).
"""

from __future__ import annotations

from typing import Any

from engine.designs import VLLM_INSTALL


def vllm_version() -> str:
    """The installed vLLM's version (a trace header records it)."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("vllm")
    except PackageNotFoundError:
        raise ValueError(VLLM_INSTALL) from None


def build_vllm_kv_cache_groups(config: Any, model_path: str, max_model_len: int, kv_cache_specs: list,
                               max_num_batched_tokens: int):
    """vLLM's VllmConfig for an engine of `config` (EngineConfig) over the checkpoint at `model_path`,
    and the KV-cache groups vLLM makes of its layers (`kv_cache_specs`), before the pool is sized
    (vLLM EngineCore._initialize_kv_caches: the specs and groups first, then the blocks; the config's
    num_gpu_blocks is set by make_vllm_scheduler). max_num_seqs is capped at the token budget, as
    vLLM requires (SchedulerConfig.verify_max_model_len): a step gives each running request a token."""
    try:
        import vllm  # noqa: F401
    except ImportError as error:
        raise ValueError(f"{VLLM_INSTALL} ({error})") from None
    from engine.vllm_core.config import build_vllm_config, vllm_kv_cache_groups

    vllm_config = build_vllm_config(
        model_path, block_size=config.block_size, num_gpu_blocks=None,
        max_model_len=max_model_len, max_num_seqs=min(config.max_num_seqs, max_num_batched_tokens),
        max_num_batched_tokens=max_num_batched_tokens, enable_prefix_caching=bool(config.enable_prefix_caching),
        prefix_caching_hash_algo=config.prefix_caching_hash_algo, options=config.vllm_options)
    return vllm_config, vllm_kv_cache_groups(vllm_config, kv_cache_specs)


def make_vllm_scheduler(vllm_config: Any, kv_cache_groups: list, kv_cache_specs: list, num_gpu_blocks: int,
                        block_bytes: int, block_size: int, events: Any, max_model_len: int,
                        output_processor: Any = None):
    """vLLM's Scheduler over a pool of `num_gpu_blocks` blocks of `block_bytes`, wrapped in our
    scheduler interface: the KVCacheConfig vLLM's planner makes of the groups and the pool's bytes."""
    from engine.vllm_core.config import build_kv_cache_config, build_scheduler
    from engine.vllm_core.scheduler import VllmScheduler, make_block_hasher

    vllm_config.cache_config.num_gpu_blocks = num_gpu_blocks
    kv_cache_config = build_kv_cache_config(vllm_config, kv_cache_specs, num_gpu_blocks, block_bytes,
                                            kv_cache_groups)
    scheduler = build_scheduler(vllm_config, kv_cache_config, block_size)
    hasher = make_block_hasher(vllm_config.cache_config.prefix_caching_hash_algo, block_size)
    return VllmScheduler(scheduler, events, hasher, max_model_len, output_processor)

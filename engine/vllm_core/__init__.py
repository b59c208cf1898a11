"""`kv_manager="vllm"`: vLLM 0.33's own v1 Scheduler and KVCacheManager drive our engine (docs/vllm-core.md).

Not `engine/vllm`: a package of that name would shadow the vllm package itself. config.py builds
vLLM's objects for one engine, scheduler.py presents our scheduler interface over them,
event_tap.py emits blockviz's block events as vLLM's objects do each operation, and offload.py plays
the worker side of vLLM's CPU tier (`kv_offloading_size`).
"""

from __future__ import annotations

from typing import Any

from engine.config import VLLM_INSTALL


def vllm_version() -> str:
    """The installed vLLM's version (a trace header records it)."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("vllm")
    except PackageNotFoundError:
        raise ValueError(VLLM_INSTALL) from None


def make_vllm_scheduler(engine: Any, max_num_batched_tokens: int):
    """vLLM's Scheduler for `engine` (an LLMEngine being built: its config, budget, loaded model
    and event bus), wrapped in our scheduler interface. max_num_seqs is capped at the token budget,
    as vLLM requires (SchedulerConfig.verify_max_model_len): a step gives each running request a token."""
    try:
        import vllm  # noqa: F401
    except ImportError as error:
        raise ValueError(f"{VLLM_INSTALL} ({error})") from None
    from engine.vllm_core.config import build_kv_cache_config, build_scheduler, build_vllm_config
    from engine.vllm_core.scheduler import VllmScheduler, make_block_hasher

    config = engine.config
    num_gpu_blocks = engine.budget.num_gpu_blocks
    vllm_config = build_vllm_config(
        engine.loaded.path, block_size=config.block_size, num_gpu_blocks=num_gpu_blocks,
        max_model_len=engine.max_model_len, max_num_seqs=min(config.max_num_seqs, max_num_batched_tokens),
        max_num_batched_tokens=max_num_batched_tokens, enable_prefix_caching=bool(config.enable_prefix_caching),
        prefix_caching_hash_algo=config.prefix_caching_hash_algo, options=config.vllm_options)
    kv_cache_config = build_kv_cache_config(vllm_config, engine.kv_cache_specs, num_gpu_blocks,
                                            engine.budget.block_bytes)
    scheduler = build_scheduler(vllm_config, kv_cache_config, config.block_size)
    hasher = make_block_hasher(vllm_config.cache_config.prefix_caching_hash_algo, config.block_size)
    return VllmScheduler(scheduler, engine.events, hasher, engine.max_model_len)

"""`kv_manager="vllm"`: vLLM 0.33's own v1 Scheduler and KVCacheManager drive our engine (docs/vllm-core.md).

Not `engine/vllm`: a package of that name would shadow the vllm package itself. config.py builds
vLLM's objects for one engine, scheduler.py presents our scheduler interface over them,
event_tap.py emits blockviz's block events as vLLM's objects do each operation, and offload.py plays
the worker side of vLLM's CPU tier (`kv_offloading_size`).
"""

from __future__ import annotations

import logging
import threading
from contextlib import contextmanager
from typing import Any, Iterator

from engine.designs import VLLM_INSTALL

VLLM_LOGGER = "vllm"  # the logger every vLLM module's init_logger(__name__) logs under


_QUIET_LOCK = threading.Lock()  # guards the "vllm" logger's level while engines build on several threads
_quiet = {"depth": 0, "saved": logging.NOTSET}  # the blocks inside quiet_vllm_logs now, the level before the first


@contextmanager
def quiet_vllm_logs(level: int = logging.ERROR) -> Iterator[None]:
    """vLLM's own loggers below `level` say nothing while the block runs (its import's "Failed to
    import from vllm._C", the CPU tier's "Initializing KVConnectorBase_V1": warnings about a worker
    that does not run here), then the "vllm" logger's level is what it was. Only vLLM's logger is
    touched: no handler, no other logger (vLLM 0.33 configures no handler until its own entry points
    call configure_logging, so its records reach Python's last-resort handler on stderr, over a TUI
    or a command's output). The level is one process-wide value, so it is changed under one lock:
    the first block to enter saves it, the last to leave restores it, whatever order threads
    building engines at once enter and leave in."""
    logger = logging.getLogger(VLLM_LOGGER)
    with _QUIET_LOCK:
        if not _quiet["depth"]:
            _quiet["saved"] = logger.level
        _quiet["depth"] += 1
        logger.setLevel(max(level, logger.getEffectiveLevel()))
    try:
        yield
    finally:
        with _QUIET_LOCK:
            _quiet["depth"] -= 1
            if not _quiet["depth"]:
                logger.setLevel(_quiet["saved"])


SUPPORTED_VLLM = "0.33"  # the release whose classes the adapter and its tests are proven against


def vllm_version() -> str:
    """The installed vLLM's version, as its distribution names it (a trace header records it)."""
    from importlib import metadata

    try:
        return metadata.version("vllm")
    except metadata.PackageNotFoundError:
        raise ValueError(VLLM_INSTALL) from None


def check_vllm_version() -> str:
    """The installed vLLM's version; a ValueError line naming it and the supported one when it is
    not SUPPORTED_VLLM.x: the adapter wraps private methods and reads private state of that
    release's scheduler (event_tap.py), which another release may have renamed or reordered."""
    found = vllm_version()
    if found.split("+")[0].split(".")[:2] != SUPPORTED_VLLM.split("."):
        raise ValueError(f"kv_manager 'vllm' supports vLLM {SUPPORTED_VLLM}.x, found vLLM {found}: "
                         f"pip install --no-deps vllm=={SUPPORTED_VLLM}.0")
    return found


def build_vllm_kv_cache_groups(config: Any, model_path: str, max_model_len: int, kv_cache_specs: list,
                               max_num_batched_tokens: int):
    """vLLM's VllmConfig for an engine of `config` (EngineConfig) over the checkpoint at `model_path`,
    and the KV-cache groups vLLM makes of its layers (`kv_cache_specs`), before the pool is sized
    (vLLM EngineCore._initialize_kv_caches: the specs and groups first, then the blocks; the config's
    num_gpu_blocks is set by make_vllm_scheduler). max_num_seqs is capped at the token budget, as
    vLLM requires (SchedulerConfig.verify_max_model_len): a step gives each running request a token."""
    with quiet_vllm_logs():
        try:
            import vllm  # noqa: F401
        except ImportError as error:
            raise ValueError(f"{VLLM_INSTALL} ({error})") from None
        check_vllm_version()
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
    from engine.vllm_core.config import build_kv_cache_config, build_scheduler, make_block_hasher
    from engine.vllm_core.scheduler import VllmScheduler

    vllm_config.cache_config.num_gpu_blocks = num_gpu_blocks
    with quiet_vllm_logs():
        kv_cache_config = build_kv_cache_config(vllm_config, kv_cache_specs, num_gpu_blocks, block_bytes,
                                                kv_cache_groups)
        scheduler = build_scheduler(vllm_config, kv_cache_config, block_size)
        hasher = make_block_hasher(vllm_config.cache_config.prefix_caching_hash_algo, block_size)
        return VllmScheduler(scheduler, events, hasher, max_model_len, output_processor)

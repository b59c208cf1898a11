"""vLLM's own v1 Scheduler and KVCacheManager, built for one engine (vLLM 0.33
`vllm/v1/engine/core.py` `EngineCore.__init__` building its `Scheduler` from a `VllmConfig` and the
`KVCacheConfig` its workers reported).

No worker runs: the `KVCacheConfig` is made as `get_kv_cache_configs` would make it from our cache
engine (`engine/cache_engine.py`): each layer's `FullAttentionSpec` or `SlidingWindowSpec` (our block
size, KV heads, head size and dtype; the window of a sliding layer) grouped by vLLM's own
`get_kv_cache_groups`, over exactly our pool's blocks. A hybrid model thus runs on vLLM's
HybridKVCacheCoordinator (vLLM switches its hybrid manager off on the CPU; `build_vllm_config` says
why it stays on here). The `ModelConfig` reads the engine's local checkpoint directory (its
config.json; no weights, no tokenizer).

`vllm_options` set vLLM's `SchedulerConfig` / `CacheConfig` fields by name on top of what the engine
config says (`max_num_seqs`, `max_num_batched_tokens`, `enable_prefix_caching`,
`prefix_caching_hash_algo`), so a run reproduces a server's settings: `scheduler_reserve_full_isl`,
`watermark`, `policy`, `long_prefill_token_threshold`, ... An unknown name, a field the adapter owns
(`OWNED`) or a value vLLM's validation refuses is one ValueError line.

`kv_offloading_size` (GiB, as vLLM's `--kv-offloading-size`) turns on vLLM's CPU tier: the
`KVTransferConfig` vLLM's `VllmConfig._post_init_kv_transfer_config` makes under
`VLLM_USE_SIMPLE_KV_OFFLOAD=1` is made here and given to the `VllmConfig` (no environment variable
is set), so the scheduler gets a `SimpleCPUOffloadConnector` whose `SimpleCPUOffloadScheduler` keeps a second caching BlockPool of
`kv_offloading_size` GiB // block bytes blocks (`_derive_cpu_config`); the `KVCacheConfig` then names one
backing allocation of our pool's bytes (`gpu_total_bytes` reads it: blocks x the largest group's pages),
and our cache engine's CPU pool has the same number of blocks (engine/vllm_core/offload.py moves the data).

Nothing process-wide is changed to build or run these objects: no environment variable, no vLLM
module global (`make_block_hasher` chains from its own NONE_HASH), so engines of any design run on
threads side by side.
"""

from __future__ import annotations

import ast
import dataclasses
import functools
import importlib.util
import logging
import os
from pathlib import Path
from typing import Any

# Fields the engine sets itself (its pool, its block size, its model), or that need what no CPU
# run here has (a worker, an offloading backend other than vLLM's native CPU tier, a hash unit finer
# than a block).
OWNED = {
    "block_size": "the engine option block_size", "num_gpu_blocks_override": "the engine option num_gpu_blocks",
    "max_model_len": "the model's context", "runner_type": None, "is_multimodal_model": None,
    "is_encoder_decoder": None, "scheduler_cls": None, "prefix_match_unit": None,
    "kv_offloading_backend": None, "cache_dtype": None, "sliding_window": None,
    "gpu_memory_utilization": "the engine option gpu_memory_utilization",
}


GiB = 1 << 30
CACHE_ENGINE_LAYOUT = "LHBNC"  # vLLM's KVCacheLayout of engine/cache_engine.py's pool: layer, head, block, token, channel
OFFLOAD_CONNECTOR = "SimpleCPUOffloadConnector"  # what VLLM_USE_SIMPLE_KV_OFFLOAD=1 picks over OffloadingConnector


def offloading_bytes(options: dict[str, Any] | None) -> int | None:
    """The CPU tier's bytes from the `kv_offloading_size` option (GiB, vLLM's CacheConfig field), or
    None when it is not set; a ValueError line for a size that is not a positive number."""
    size = (options or {}).get("kv_offloading_size")
    if size is None:
        return None
    if isinstance(size, bool) or not isinstance(size, (int, float)) or not 0 < size < float("inf"):
        raise ValueError(f"vllm option kv_offloading_size must be a positive number of GiB, got {size!r}")
    return int(size * GiB)


def _fields(cls) -> set[str]:
    """A vLLM config class's init fields: less those its source declares `Field(init=False)`, which
    pydantic before 2.14 still lists as init fields of the dataclass (vLLM sets them itself)."""
    return {f.name for f in dataclasses.fields(cls) if f.init and getattr(f.default, "init", None) is not False}


def split_options(options: dict[str, Any] | None) -> tuple[dict[str, Any], dict[str, Any]]:
    """`vllm_options` as (SchedulerConfig fields, CacheConfig fields); a ValueError names the first
    option that is neither, or one the adapter owns."""
    from vllm.config import CacheConfig, SchedulerConfig

    return _split(options, _fields(SchedulerConfig), _fields(CacheConfig))


def _split(options: dict[str, Any] | None, scheduler_fields: set[str],
           cache_fields: set[str]) -> tuple[dict[str, Any], dict[str, Any]]:
    """split_options over the given field names."""
    sched: dict[str, Any] = {}
    cache: dict[str, Any] = {}
    for name, value in (options or {}).items():
        if name in OWNED:
            instead = OWNED[name]
            raise ValueError(f"vllm option {name!r} is set by the engine" + (f": use {instead}" if instead else
                                                                              " and cannot be changed here"))
        if name in scheduler_fields:
            sched[name] = value
        elif name in cache_fields:
            cache[name] = value
        else:
            raise ValueError(f"unknown vllm option {_cut(name)!r}: not a field of vLLM's SchedulerConfig or CacheConfig")
    return sched, cache


# Where the installed vLLM defines the two configs whose fields the options set.
CONFIG_SOURCES = (("config/scheduler.py", "SchedulerConfig"), ("config/cache.py", "CacheConfig"))


@functools.cache
def source_fields() -> tuple[set[str], set[str]] | None:
    """The init fields of vLLM's SchedulerConfig and CacheConfig (what `_fields` reads from the
    classes) read from the installed vLLM's source with `ast`, without importing vLLM (whose
    `vllm.config` imports torch and transformers): each annotated name of the class body, less
    ClassVar and InitVar annotations, dataclasses' `field(init=False)` and pydantic's
    `Field(init=False)`. None when
    vLLM is not installed, is not the supported release, or its source has another shape (a base
    class, another decorator than vLLM's `config`): then the names are checked on the classes."""
    from engine.vllm_core import check_vllm_version

    try:
        check_vllm_version()
        spec = importlib.util.find_spec("vllm")
    except (ValueError, ImportError):
        return None
    if spec is None or not spec.submodule_search_locations:
        return None
    root = Path(list(spec.submodule_search_locations)[0])
    found = []
    for path, name in CONFIG_SOURCES:
        try:
            tree = ast.parse((root / path).read_text(encoding="utf-8"))
        except (OSError, SyntaxError, ValueError):
            return None
        classes = [node for node in tree.body if isinstance(node, ast.ClassDef) and node.name == name]
        if len(classes) != 1 or classes[0].bases or [ast.unparse(d) for d in classes[0].decorator_list] != ["config"]:
            return None
        found.append({statement.target.id for statement in classes[0].body
                      if isinstance(statement, ast.AnnAssign) and isinstance(statement.target, ast.Name)
                      and not _not_init(statement)})
    return found[0], found[1]


def _not_init(statement: ast.AnnAssign) -> bool:
    """A class-body annotation that is no init field of a dataclass: ClassVar, InitVar, field(init=False)
    or pydantic's Field(init=False)."""
    annotation = ast.unparse(statement.annotation)
    if annotation.split("[")[0].split(".")[-1] in ("ClassVar", "InitVar"):
        return True
    value = statement.value
    return (isinstance(value, ast.Call) and ast.unparse(value.func).split(".")[-1] in ("field", "Field")
            and any(k.arg == "init" and isinstance(k.value, ast.Constant) and k.value.value is False
                    for k in value.keywords))


def _cut(text: str, limit: int = 60) -> str:
    """A name as an error line quotes it: at most `limit` characters."""
    return text if len(text) <= limit else text[:limit] + "…"


def _refused(error: Exception, in_force: dict[str, Any] | None = None) -> ValueError:
    """vLLM's validation error as one line: pydantic's first error, its field and message; an error
    across fields (no field of its own) names `in_force`, the values vLLM checked together (the
    engine's and the options')."""
    errors = getattr(error, "errors", None)
    if callable(errors):
        first = errors()[0]
        where = ".".join(str(part) for part in first.get("loc", ()))
        message = str(first.get("msg", error)).removeprefix("Value error, ")
        if where:
            return ValueError(f"vllm option {_cut(where)}: vLLM refused it: {message}")
    else:
        text = str(error).strip().splitlines()
        message = text[0] if text else type(error).__name__
    values = ", ".join(f"{_cut(name)}={_cut(repr(value))}" for name, value in (in_force or {}).items())
    return ValueError(f"vLLM refused the options together ({values}): {message}" if values
                      else f"vLLM refused the options: {message}")


def _is_cross_field(error: Exception) -> bool:
    """A pydantic error of a check across fields (a model validator: no field of its own)."""
    errors = getattr(error, "errors", None)
    return callable(errors) and not errors()[0].get("loc")


def check_options(options: dict[str, Any] | None) -> None:
    """What can be checked without a model: each name (split_options) and each value vLLM's
    configs refuse field by field (pydantic); checks across fields wait for build_vllm_config,
    which knows the values in force (the engine's max_num_seqs, the model's context). The names
    and the CPU tier's size are checked first on vLLM's source (source_fields), so those
    mistakes are answered without importing vLLM."""
    names = source_fields()
    if names is not None:  # a name or size vLLM would refuse, said before vLLM (and torch) is imported
        _split(options, *names)
        offloading_bytes(options)
    from vllm.config import CacheConfig, SchedulerConfig

    sched_options, cache_options = split_options(options)
    offloading_bytes(options)
    for make in (lambda: SchedulerConfig(**{"max_model_len": 1 << 20, "is_encoder_decoder": False, **sched_options}),
                 lambda: CacheConfig(**cache_options)):
        try:
            make()
        except (ValueError, TypeError) as error:
            if callable(getattr(error, "errors", None)) and not _is_cross_field(error):  # a field's own validation
                raise _refused(error) from None


def build_vllm_config(model_dir: str | Path, *, block_size: int, num_gpu_blocks: int | None, max_model_len: int,
                      max_num_seqs: int, max_num_batched_tokens: int, enable_prefix_caching: bool,
                      prefix_caching_hash_algo: str, options: dict[str, Any] | None = None):
    """A VllmConfig over the checkpoint directory with our pool (vLLM's EngineArgs.create_engine_config,
    cut to what the scheduler reads), the options applied on top.

    vLLM's hybrid KV-cache manager stays on, as on a GPU: VllmConfig.__post_init__ turns it off where
    the platform's `support_hybrid_kv_cache()` is False (vLLM's UnspecifiedPlatform, a CUDA wheel with
    no GPU; CpuPlatform says True), a worker's capability, and there is no vLLM worker
    here: our cache engine and runner serve one table per group; an explicit
    disable_hybrid_kv_cache_manager=False would be refused there. The option is applied after that
    check: True runs a hybrid model as vLLM does without the manager (every window as full attention,
    one group); with the CPU tier, vLLM's connector decides, as vLLM does."""
    from vllm.config import CacheConfig, DeviceConfig, ModelConfig, SchedulerConfig, VllmConfig

    sched_options, cache_options = split_options(options)
    disable_hybrid = sched_options.pop("disable_hybrid_kv_cache_manager", None)
    budget = sched_options.get("max_num_batched_tokens")
    if "max_num_seqs" not in sched_options and isinstance(budget, int) and not isinstance(budget, bool) and budget > 0:
        max_num_seqs = min(max_num_seqs, budget)  # the engine's cap on its own max_num_seqs, under the option's budget
    model_dir = str(model_dir)
    if not os.path.isfile(os.path.join(model_dir, "config.json")):
        raise ValueError(f"kv_manager 'vllm' needs a local checkpoint directory with a config.json, got {model_dir!r}")
    try:
        model = ModelConfig(model=model_dir, tokenizer=model_dir, skip_tokenizer_init=True, dtype="float32",
                            seed=0, max_model_len=max_model_len)
        offloading = offloading_bytes(options) is not None
        if offloading:
            sched_options["async_scheduling"] = cpu_tier_scheduling(sched_options.get("async_scheduling"))
        scheduler = SchedulerConfig(**{
            "max_num_seqs": max_num_seqs, "max_num_batched_tokens": max_num_batched_tokens,
            "max_model_len": max_model_len, "enable_chunked_prefill": True, "is_encoder_decoder": False,
            **sched_options})
        offloading_size = cache_options.pop("kv_offloading_size", None)
        cache = CacheConfig(**{"block_size": block_size, "cache_dtype": "auto",
                               "enable_prefix_caching": enable_prefix_caching,
                               "prefix_caching_hash_algo": prefix_caching_hash_algo, **cache_options})
        cache.num_gpu_blocks = num_gpu_blocks
        if offloading and not enable_prefix_caching:  # vLLM's connector would switch itself off
            raise ValueError("vllm option kv_offloading_size needs prefix caching: the CPU tier is keyed by "
                             "the blocks' hashes")
        vllm_config = VllmConfig(scheduler_config=scheduler, model_config=model, cache_config=cache,
                                 device_config=DeviceConfig("cpu"),
                                 kv_transfer_config=offload_transfer_config(offloading_size) if offloading else None)
        cache.kv_offloading_size = offloading_size  # as given; vLLM's post-init has nothing left to make of it
    except (ValueError, TypeError, AssertionError) as error:
        in_force = {"max_num_seqs": max_num_seqs, "max_num_batched_tokens": max_num_batched_tokens,
                    "max_model_len": max_model_len, **sched_options, **cache_options}
        raise _refused(error, in_force) from None
    if disable_hybrid is None and vllm_config.kv_transfer_config is not None:
        from vllm.distributed.kv_transfer.kv_connector.factory import KVConnectorFactory

        disable_hybrid = not KVConnectorFactory.supports_hma_config(vllm_config.kv_transfer_config)
    vllm_config.scheduler_config.disable_hybrid_kv_cache_manager = bool(disable_hybrid)
    return vllm_config


CPU_TIER_SYNC = ("kv_offloading_size runs vLLM's synchronous order (async_scheduling=false): the CPU tier's "
                 "copies are reported done in the step that issued them, one batch in flight")


def cpu_tier_scheduling(asked: Any) -> bool:
    """The CPU tier's scheduling order: synchronous, whatever `asked` (the async_scheduling option).
    vLLM with two batches in flight defers every free a step behind a KV consumer
    (Scheduler.defer_block_free) for a second batch our worker side never overlaps; an explicit
    async_scheduling=true is overridden with one warning line (CPU_TIER_SYNC), the default
    (None: vLLM's async) quietly, as the run's header records."""
    if asked is True:
        logging.getLogger("engine").warning(CPU_TIER_SYNC)
    return False


def uses_async_scheduling(vllm_config) -> bool:
    """Whether vLLM's order for this config is the asynchronous one (VllmConfig resolves
    SchedulerConfig.async_scheduling None to True wherever nothing rules it out; its
    get_scheduler_cls then names AsyncScheduler)."""
    return bool(vllm_config.scheduler_config.async_scheduling)


def offload_transfer_config(kv_offloading_size: float):
    """The KVTransferConfig of vLLM's native CPU tier of `kv_offloading_size` GiB, as vLLM's
    VllmConfig._post_init_kv_transfer_config makes it with VLLM_USE_SIMPLE_KV_OFFLOAD=1: the
    SimpleCPUOffloadConnector, its bytes, both roles."""
    from vllm.config import KVTransferConfig

    return KVTransferConfig(kv_connector=OFFLOAD_CONNECTOR, kv_role="kv_both",
                            kv_connector_extra_config={"cpu_bytes_to_use": kv_offloading_size * GiB})


def make_block_hasher(hash_algo: str, block_size: int):
    """vLLM's request block hasher (kv_cache_utils.get_request_block_hasher, for requests with no
    multimodal input and no lookahead) over `hash_algo`, its chains starting from this engine's
    own NONE_HASH: hash_fn of vLLM 0.33's seed (engine/v1/kv_cache_utils.none_hash, resolve_none_hash_seed:
    PYTHONHASHSEED when set, else vLLM's "vllm-none-hash"), what vLLM's init_none_hash makes and what
    engine/v1 chains from, so a prefix hashes alike under kv_manager "v1" and "vllm". vLLM keeps its NONE_HASH in a module global
    that init_none_hash sets from the environment; this hasher reads neither: each block goes
    through vLLM's own hash_block_tokens with its parent given (the first block's: this NONE_HASH),
    with the extra keys of vLLM's generate_block_hash_extra_keys."""
    from vllm.utils.hashing import get_hash_fn_by_name
    from vllm.v1.core.kv_cache_utils import BlockHash, generate_block_hash_extra_keys, hash_block_tokens

    from engine.v1.kv_cache_utils import none_hash as none_hash_of

    hash_fn = get_hash_fn_by_name(hash_algo)
    none_hash = BlockHash(none_hash_of(hash_fn))

    def block_hasher(request) -> list:
        start = len(request.block_hashes) * block_size
        parent = request.block_hashes[-1] if request.block_hashes else none_hash
        token_ids = request.all_token_ids
        hashes = []
        for end in range(start + block_size, request.num_tokens + 1, block_size):
            extra_keys, _ = generate_block_hash_extra_keys(request, end - block_size, end, 0)
            parent = hash_block_tokens(hash_fn, parent, token_ids[end - block_size : end], extra_keys)
            hashes.append(parent)
        return hashes

    return block_hasher


def vllm_layer_specs(vllm_config, layer_specs) -> dict:
    """Each layer's spec (engine.v1.kv_cache_interface.kv_cache_specs) as vLLM's FullAttentionSpec
    or SlidingWindowSpec, named by its layer index (vLLM GPUModelRunner.get_kv_cache_spec). The
    layout is resolved first, as EngineCore does from what its workers support: our cache engine's
    one, per slot K/V heads outermost (CacheEngine._shape: vLLM's LHBNC)."""
    from vllm.v1.attention.backends.utils import resolve_kv_cache_layout
    from vllm.v1.kv_cache_interface import FullAttentionSpec, SlidingWindowSpec

    specs = {}
    for index, spec in enumerate(layer_specs):
        shape = dict(block_size=spec.block_size, num_kv_heads=spec.num_kv_heads, head_size=spec.head_size,
                     dtype=spec.dtype)
        window = getattr(spec, "sliding_window", None)
        specs[str(index)] = FullAttentionSpec(**shape) if window is None else SlidingWindowSpec(**shape,
                                                                                                sliding_window=window)
    resolve_kv_cache_layout(vllm_config, [[CACHE_ENGINE_LAYOUT]], specs.values())
    return specs


def vllm_kv_cache_groups(vllm_config, layer_specs) -> list:
    """Our layers' KV-cache groups as vLLM makes them: its own `kv_cache_planning.get_kv_cache_groups`
    over `vllm_layer_specs` (one group when the layers are alike; a hybrid model's full and
    sliding-window groups otherwise, unless disable_hybrid_kv_cache_manager turns its windows into
    full attention)."""
    from vllm.v1.core.kv_cache_planning import get_kv_cache_groups

    return get_kv_cache_groups(vllm_config, vllm_layer_specs(vllm_config, layer_specs))


def build_kv_cache_config(vllm_config, layer_specs, num_gpu_blocks: int, block_bytes: int | None = None,
                          kv_cache_groups: list | None = None):
    """The KVCacheConfig of our pool as vLLM's planner makes it (vLLM get_kv_cache_configs, cut to
    one worker whose memory is already sized): `kv_cache_planning.get_kv_cache_config_from_groups`
    over the groups (vllm_kv_cache_groups unless given) and num_gpu_blocks x block_bytes of memory.
    Its KVCacheTensors describe our cache engine's pool, one backing allocation in which the l-th
    layer of every group shares a region (CacheEngine's slots); the CPU tier sizes itself from it.
    Without block_bytes, vLLM's bytes per block. A ValueError if vLLM's planner gets another
    number of blocks from those bytes (our block_bytes is not vLLM's).

    Its prefix_cache_retention_interval stays None, as in a KVCacheConfig built without the
    planner (a sliding-window group keeps every full block it computed cached, as engine/v1's
    SlidingWindowManager does), where the planner would copy CacheConfig's (0: only vLLM's
    semantic checkpoints)."""
    from vllm.v1.core.kv_cache_planning import get_kv_cache_config_from_groups

    groups = kv_cache_groups if kv_cache_groups is not None else vllm_kv_cache_groups(vllm_config, layer_specs)
    if block_bytes is None:  # one page per layer of the largest group
        block_bytes = max(len(group.layer_names) * group.kv_cache_spec.page_size_bytes for group in groups)
    config = get_kv_cache_config_from_groups(vllm_config, groups, num_gpu_blocks * block_bytes)
    if config.num_blocks != num_gpu_blocks:
        raise ValueError(f"vLLM's planner makes {config.num_blocks} blocks of {num_gpu_blocks * block_bytes} bytes, "
                         f"the cache engine {num_gpu_blocks} of {block_bytes}")
    return dataclasses.replace(config, prefix_cache_retention_interval=None)


def build_scheduler(vllm_config, kv_cache_config, block_size: int):
    """vLLM's v1 Scheduler (which builds its KVCacheManager, coordinator and BlockPool), hashing at
    the block size so every hash covers one whole block (no partial-block prefix entries): the
    AsyncScheduler under async scheduling, as vLLM's SchedulerConfig.get_scheduler_cls picks it."""
    from vllm.v1.core.sched.async_scheduler import AsyncScheduler
    from vllm.v1.core.sched.scheduler import Scheduler
    from vllm.v1.structured_output import StructuredOutputManager

    cls = AsyncScheduler if uses_async_scheduling(vllm_config) else Scheduler
    try:
        return cls(vllm_config=vllm_config, kv_cache_config=kv_cache_config,
                         structured_output_manager=StructuredOutputManager(vllm_config), block_size=block_size,
                         hash_block_size=block_size, log_stats=False)
    except (ValueError, TypeError, AssertionError) as error:
        raise _refused(error) from None

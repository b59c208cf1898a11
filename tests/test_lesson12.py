"""Lesson 12 (lessons/12_questions_vllm_users_ask.ipynb): every vLLM fact it states, held against vLLM
0.33's own functions and classes (skipped with the install line where vLLM is absent), and its runs
replayed on vLLM's own core (`kv_manager="vllm"`). Running the notebook itself (blank, key, slips) is
tests/test_lessons.py's."""

from __future__ import annotations

import importlib
import inspect
import json
import re
from pathlib import Path
from types import SimpleNamespace

import pytest

from blockviz.lessons import lesson12 as lesson
from blockviz.lessons.engines import fresh
from blockviz.lessons.key import KEY
from engine.designs import VLLM_INSTALL

ROOT = Path(__file__).resolve().parent.parent
NOTEBOOK = ROOT / "lessons" / "12_questions_vllm_users_ask.ipynb"
NUM_LAYERS, NUM_KV_HEADS, HEAD_SIZE = 4, 4, 64  # the bundled tiny-shakespeare model


def need_vllm():
    return pytest.importorskip("vllm", reason=VLLM_INSTALL)


def sections() -> dict[str, str]:
    """The notebook's numbered sections: "1" -> its text (markdown and code), up to the next one."""
    text = "\n".join("".join(cell["source"]) for cell in json.loads(NOTEBOOK.read_text())["cells"])
    parts = re.split(r"^## (\d+)\. ", text, flags=re.M)
    return dict(zip(parts[1::2], parts[2::2]))


def key_value(exercise: str):
    """The value an answer-key entry gives (`my_x = 2  # why`)."""
    return eval(re.match(r"\w+ = ([^#]+)", KEY[exercise]).group(1))  # the key's own literal


def vllm_config(max_model_len: int):
    """The parts of a VllmConfig that vLLM's sizing functions read, for one GPU."""
    return SimpleNamespace(model_config=SimpleNamespace(max_model_len=max_model_len),
                           parallel_config=SimpleNamespace(decode_context_parallel_size=1),
                           cache_config=SimpleNamespace(), device_config=SimpleNamespace(device_type="cuda"),
                           attention_config=SimpleNamespace(hisparse_config=None))


def vllm_layer_specs(block_size: int = lesson.BLOCK_SIZE) -> dict:
    """vLLM's FullAttentionSpec for each layer of the bundled model (float32)."""
    import torch
    from vllm.v1.kv_cache_interface import FullAttentionSpec

    return {f"layer.{i}": FullAttentionSpec(block_size=block_size, num_kv_heads=NUM_KV_HEADS, head_size=HEAD_SIZE,
                                            dtype=torch.float32) for i in range(NUM_LAYERS)}


# ---------------------------------------------------------------- the notebook's text


def test_each_section_names_its_vllm_issues_and_a_vllm_source_file():
    """Questions 2-11 of issue 48, one section each, with the issue numbers the issue lists and the
    vLLM file(s) the section describes."""
    issues = {"1": ("#8031", "#8185", "#14412"), "2": ("#235", "#7155", "#20256"), "3": ("#2418", "PR #2163"),
              "4": ("#6102", "#16832", "#18115"), "5": ("#1206", "#1607", "#23444"), "6": ("#46502", "#9660"),
              "7": ("#31920", "#11072"), "8": ("#40896", "#54490", "#7845"), "9": ("#51198", "#42317"),
              "10": ("#23087",)}
    found = sections()
    assert sorted(found, key=int) == sorted(issues, key=int)
    for number, numbers in issues.items():
        heading = found[number].splitlines()[0]
        assert all(n in heading for n in numbers), (number, heading)
        assert re.search(r"`vllm/[\w/]+\.py`", found[number]), number
        assert re.search(r"lesson\.run_|lesson\.full_pool_requests|sizing\.|full\.", found[number]), number


def test_the_key_is_each_runs_figure():
    """The key's answers are the figures the runs give on engine/v1 (what the checks compare with)."""
    from blockviz.lessons import load_all

    exercises = {i: ex for i, ex in load_all().items() if i.startswith("12.")}
    assert len(exercises) == 10
    for exercise_id, ex in exercises.items():
        assert ex.verdict(key_value(exercise_id)).correct, exercise_id
        assert all(not ex.verdict(slip.resolve()).correct for slip in ex.slips), exercise_id
    sizing = lesson.run_sizing()
    assert sizing.num_gpu_blocks == lesson.SIZING_BUDGET // sizing.block_bytes
    assert sizing.pool_bytes == sizing.num_gpu_blocks * sizing.block_bytes
    assert sizing.most_running < lesson.check_concurrency.truth()


# ---------------------------------------------------------------- vLLM's own functions


@pytest.mark.parametrize("num_blocks,max_model_len", [(40, 256), (26, 128), (7, 100), (1000, 8192)])
def test_the_concurrency_line_is_vllms(num_blocks, max_model_len, monkeypatch):
    """`max_concurrency` is vLLM's `get_max_concurrency_for_kv_cache_config`, and `concurrency_line`
    the line `update_kv_cache_capacity` logs, for one full-attention group of the bundled model."""
    need_vllm()
    from vllm.v1.core import kv_cache_utils
    from vllm.v1.kv_cache_interface import KVCacheConfig, KVCacheGroupSpec, UniformTypeKVCacheSpecs

    specs = vllm_layer_specs()
    group = KVCacheGroupSpec(list(specs), UniformTypeKVCacheSpecs(block_size=lesson.BLOCK_SIZE, kv_cache_specs=specs))
    config = KVCacheConfig(num_blocks=num_blocks, kv_cache_tensors=[], kv_cache_groups=[group])
    theirs = kv_cache_utils.get_max_concurrency_for_kv_cache_config(vllm_config(max_model_len), config)
    assert theirs == lesson.max_concurrency(num_blocks, lesson.BLOCK_SIZE, max_model_len)
    logged = []
    monkeypatch.setattr(kv_cache_utils, "logger", SimpleNamespace(info_once=lambda fmt, *args: logged.append(fmt % args)))
    kv_cache_utils.update_kv_cache_capacity(vllm_config(max_model_len), config)
    assert logged == [lesson.concurrency_line(num_blocks, lesson.BLOCK_SIZE, max_model_len)]


@pytest.mark.parametrize("budget", [lesson.SMALL_BUDGET, 2 * 2**20 - 1, 2**17 - 1, 2**20 // 3])
def test_the_refusal_is_vllms_words(budget):
    """`vllm_refusal` is the ValueError of vLLM's `_check_enough_kv_cache_memory`, with the length
    `estimate_max_model_len` finds, for the bundled model's layers and these budgets."""
    need_vllm()
    from vllm.v1.core.kv_cache_planning import (_check_enough_kv_cache_memory, estimate_max_model_len,
                                                max_memory_usage_bytes)

    specs = vllm_layer_specs()
    config = vllm_config(256)
    block_bytes = sum(spec.page_size_bytes for spec in specs.values())
    assert block_bytes == lesson.run_refusal().block_bytes
    with pytest.raises(ValueError) as refused:
        _check_enough_kv_cache_memory(budget, lambda: max_memory_usage_bytes(config, specs.values()), 256,
                                      lambda available: estimate_max_model_len(config, specs, available))
    assert str(refused.value) == lesson.vllm_refusal(budget, block_bytes, lesson.BLOCK_SIZE, 256)
    assert estimate_max_model_len(config, specs, budget) == lesson.estimated_max_model_len(
        budget, block_bytes, lesson.BLOCK_SIZE, 256)
    if budget == lesson.SMALL_BUDGET:
        assert lesson.check_estimated_len.truth() == estimate_max_model_len(config, specs, budget) == \
            key_value("12.estimated_len")


def test_the_runs_are_vllms_own():
    """The preemption victim, the chat's and the hybrid's hits: vLLM's Scheduler, KVCacheManager and
    BlockPool (`kv_manager="vllm"`) give what engine/v1 gives and the key says."""
    need_vllm()
    assert lesson.run_pressure("vllm") == lesson.run_pressure() and lesson.run_pressure().preemptions[0][0] == \
        key_value("12.victim")
    assert lesson.run_chat("vllm") == lesson.run_chat() and lesson.run_chat().hits == key_value("12.turn2_hits")
    assert lesson.run_hybrid("vllm") == lesson.run_hybrid() and lesson.run_hybrid()[1] == key_value("12.hybrid_hits")


def test_usage_is_vllms_get_usage_on_its_own_block_pool():
    """The full pool's usage after every step, D's first step and the usage after the last request,
    on vLLM's own BlockPool: as engine/v1 on vLLM's default (async scheduling on); with async
    scheduling off D starts one step earlier under both, and the usage still falls to 0 with the same
    blocks cached."""
    need_vllm()
    from vllm.v1.core.block_pool import BlockPool
    from vllm.v1.core.kv_cache_manager import KVCacheManager

    ours = lesson.run_full_pool()
    assert ours.usage_after == key_value("12.usage_after") and ours.cached_after > 0
    options = lesson.options(num_gpu_blocks=lesson.FULL_POOL_BLOCKS, kv_manager="vllm")
    with fresh(options) as viz:
        assert type(viz.llm.engine.scheduler.kv_cache_manager.block_pool) is BlockPool
        assert lesson.full_pool_figures(viz) == ours
    with fresh({**options, "vllm_options": {"async_scheduling": False}}) as viz:
        sync = lesson.full_pool_figures(viz)
    with fresh(lesson.options(num_gpu_blocks=lesson.FULL_POOL_BLOCKS, async_scheduling=False)) as viz:
        assert lesson.full_pool_figures(viz) == sync
    assert sync.d_admitted_step == ours.d_admitted_step - 1
    assert (sync.usage_after, sync.cached_after) == (ours.usage_after, ours.cached_after)
    assert "self.block_pool.get_usage()" in inspect.getsource(KVCacheManager.usage.fget)


def test_the_settings_and_names_the_lesson_states_are_vllms():
    """Defaults, option names, what each offload option moves, the preemption rule and the metric
    names, as vLLM 0.33's own classes and sources have them."""
    need_vllm()
    from vllm import envs
    from vllm.config import CacheConfig
    from vllm.config.offload import UVAOffloadConfig
    from vllm.v1.core.sched.scheduler import Scheduler
    from vllm.v1.metrics import loggers

    cache = CacheConfig()
    assert cache.gpu_memory_utilization == 0.92 and cache.kv_cache_memory_bytes is None
    assert cache.kv_offloading_size is None and cache.mamba_cache_mode == "none"
    assert UVAOffloadConfig().cpu_offload_gb == 0
    uva = " ".join(inspect.getsource(UVAOffloadConfig).split())
    kv = " ".join(inspect.getsource(CacheConfig).split("kv_offloading_size: float | None = None")[1].split())
    assert "part of the model is loaded from CPU memory" in uva
    assert kv.startswith('"""Size of the KV cache offloading buffer in GiB.') and "KV cache offloading to CPU" in kv
    assert lesson.OFFLOAD_OPTIONS["cpu_offload_gb"] == "model weights"
    assert lesson.check_kv_option.truth() == key_value("12.kv_option") == "kv_offloading_size"
    offloading = inspect.getsource(importlib.import_module("vllm.config.vllm"))
    assert 'config_connector = "OffloadingConnector"' in offloading and '"cpu_bytes_to_use": kv_offloading_size' in offloading
    assert "VLLM_BATCH_INVARIANT" in envs.environment_variables
    schedule = inspect.getsource(Scheduler.schedule)
    assert "preempted_req = self.running[-1]" in schedule
    assert "request.num_computed_tokens = 0" in inspect.getsource(Scheduler._preempt_request)
    assert "is preempted by" not in inspect.getsource(importlib.import_module("vllm.v1.core.sched.scheduler"))
    metrics = inspect.getsource(loggers)
    assert '"vllm:num_preemptions"' in metrics and '"vllm:kv_cache_usage_perc"' in metrics


def test_every_vllm_function_the_lesson_cites_exists():
    """Each `file` (`function`) the notebook's Follows line names is in vLLM 0.33."""
    need_vllm()
    cited = {"vllm.v1.core.kv_cache_utils": ("get_max_concurrency_for_kv_cache_config", "update_kv_cache_capacity"),
             "vllm.v1.worker.gpu_worker": ("Worker.determine_available_memory",),
             "vllm.v1.worker.gpu_model_runner": ("GPUModelRunner.profile_run",),
             "vllm.v1.core.kv_cache_planning": ("_check_enough_kv_cache_memory", "estimate_max_model_len"),
             "vllm.v1.core.sched.scheduler": ("Scheduler.schedule", "Scheduler._preempt_request"),
             "vllm.v1.core.block_pool": ("BlockPool.get_usage", "BlockPool.cache_full_blocks", "BlockPool.free_blocks"),
             "vllm.v1.core.kv_cache_coordinator": ("HybridKVCacheCoordinator.find_longest_cache_hit",),
             "vllm.platforms.interface": ("Platform._align_hybrid_block_size",)}
    text = NOTEBOOK.read_text()
    for module, names in cited.items():
        loaded = importlib.import_module(module)
        for name in names:
            target = loaded
            for part in name.split("."):
                target = getattr(target, part)
            assert name.split(".")[-1] in text, name

"""What the cards, lessons and docs say vLLM 0.33 does, checked against vLLM 0.33's own classes.

Each test reads the words (a card of a shipped trace, a view's note, a lesson's cell or answer, a
doc's paragraph) and then asks vLLM's objects the same question: its `BlockPool`, `KVCacheManager`
over a full-attention and a sliding-window group (as vLLM's tests/v1/core builds them), its
`SingleTypeKVCacheManager`, `SlidingWindowSpec`, `CacheConfig`, `SchedulerConfig` and platforms. The
words are checked everywhere; vLLM's half skips with the install line where vLLM is absent.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from blockviz.lessons import lesson11
from blockviz.model import view
from blockviz.model.guide import Guide
from blockviz.model.trace import load_trace

ROOT = Path(__file__).resolve().parent.parent
INSTALL = "vLLM is not installed: pip install -e '.[vllm]' && pip install --no-deps vllm==0.33.0"
BLOCK = 4


def need_vllm():
    return pytest.importorskip("vllm", reason=INSTALL)


def lesson_text(number: str) -> str:
    (path,) = ROOT.glob(f"lessons/{number}_*.ipynb")
    return "\n".join("".join(cell["source"]) for cell in json.loads(path.read_text())["cells"])


def doc(name: str) -> str:
    return " ".join((ROOT / "docs" / name).read_text().split())


def cards(trace: str) -> list:
    loaded = load_trace(trace)
    guide = Guide(loaded.header.get("kv_manager", "v0"), header=loaded.header)
    guide.scan(loaded.events)
    guide.settle()
    return guide.cards


def said(card) -> str:
    return f"{card.title} {card.what} {card.why}"


# ---------------------------------------------------------------- vLLM's own KVCacheManager, small


def vllm_manager(num_blocks: int, window: int | None = None):
    """vLLM's KVCacheManager over `num_blocks` blocks of BLOCK tokens: one full-attention group,
    and a sliding-window group when `window` is given (vLLM's HybridKVCacheCoordinator)."""
    import torch
    from vllm.utils.hashing import sha256
    from vllm.v1.core.kv_cache_manager import KVCacheManager
    from vllm.v1.core.kv_cache_utils import init_none_hash
    from vllm.v1.kv_cache_interface import FullAttentionSpec, KVCacheConfig, KVCacheGroupSpec, SlidingWindowSpec

    shape = dict(block_size=BLOCK, num_kv_heads=1, head_size=1, dtype=torch.float32)
    groups = [KVCacheGroupSpec(["full"], FullAttentionSpec(**shape))]
    if window is not None:
        groups.append(KVCacheGroupSpec(["window"], SlidingWindowSpec(**shape, sliding_window=window)))
    config = KVCacheConfig(num_blocks=num_blocks, kv_cache_tensors=[], kv_cache_groups=groups)
    init_none_hash(sha256)
    return KVCacheManager(config, max_model_len=256, scheduler_block_size=BLOCK, hash_block_size=BLOCK,
                          enable_caching=True, max_in_flight_tokens=1)


def vllm_request(rid: int, num_tokens: int):
    from vllm.sampling_params import SamplingParams
    from vllm.utils.hashing import sha256
    from vllm.v1.core.kv_cache_utils import get_request_block_hasher
    from vllm.v1.request import Request

    return Request(str(rid), list(range(num_tokens)), SamplingParams(max_tokens=64), None,
                   block_hasher=get_request_block_hasher(BLOCK, sha256))


def free_queue(manager) -> list[int]:
    return [block.block_id for block in manager.block_pool.free_block_queue.get_all_free_blocks()]


# ---------------------------------------------------------------- the claims


def test_v1_copies_a_block_only_on_a_partial_hit():
    """vLLM 0.33 has a copy-on-write: a hit that ends inside a block gets a private copy of it
    (SingleTypeKVCacheManager._apply_cow; the scheduler frees the copy's pins,
    Scheduler._free_cow_retained_blocks). The pool note, the n = 2 card and lesson 04 say so."""
    words = [view.V1_NOTES["cow"], *(said(c) for c in cards("v1-story")), lesson_text("04"), lesson_text("10")]
    assert not any(re.search(r"no copy[- ]on[- ]write", text) for text in words)
    assert "partial-block hit" in view.V1_NOTES["cow"] and "_apply_cow" in lesson_text("04")
    assert any("partial-block hit" in said(c) for c in cards("v1-story") if c.idea == "prefix-hit")
    need_vllm()
    from vllm.v1.core.sched.scheduler import Scheduler

    assert callable(Scheduler._free_cow_retained_blocks)
    manager = vllm_manager(8)
    request = vllm_request(0, 6)
    (table,) = manager.allocate_slots(request, 6).get_block_ids()
    single = manager.coordinator.single_type_managers[0]
    source = single.req_to_blocks["0"][1]
    copy = manager.block_pool.get_new_blocks(1)[0]
    single._apply_cow("0", 1, source, copy)  # what allocate_new_blocks does for a partial hit
    assert [b.block_id for b in single.req_to_blocks["0"]] == [table[0], copy.block_id]
    assert single.take_pending_cow_copies() == [(source, copy)]


def test_a_freed_block_without_a_hash_joins_the_queue_head():
    """vLLM's BlockPool.free_blocks (PR #42656): a freed block with a hash goes to the free queue's
    tail, one without a hash to its head (prepend_n / append_n). The v1 eviction card says so."""
    (eviction,) = [c for c in cards("v1-story") if c.idea == "eviction"]
    assert "one without a hash, its head" in eviction.why and "#42656" in eviction.why
    assert "free the longest" not in eviction.what
    need_vllm()
    manager = vllm_manager(8)
    request = vllm_request(0, 10)  # 2 full blocks (hashed) and a partial one (no hash)
    (table,) = manager.allocate_slots(request, 10).get_block_ids()
    never_used = free_queue(manager)
    manager.free(request)
    hashed = {b.block_id for b in manager.block_pool.blocks if b.block_hash is not None}
    assert hashed == set(table[:2])
    assert free_queue(manager) == [table[2], *never_used, table[1], table[0]]


def test_the_window_admission_cap_counts_the_tokens_in_flight():
    """Lesson 11 exercise 4's "Correct" text: vLLM's SlidingWindowSpec.max_admission_blocks_per_request
    is cdiv(window - 1 + in flight, block_size) + 1, so 9 only with one token in flight."""
    praise = lesson11.check_window_blocks.fill_in(lesson11.check_window_blocks.praise)
    figures = [lesson11.admission_blocks(128, 16, n) for n in lesson11.IN_FLIGHT]
    assert figures[0] == lesson11.check_window_blocks.truth() == 9
    for n, blocks in zip(lesson11.IN_FLIGHT[1:], figures[1:]):
        assert f"{blocks} with {n:,}" in praise
    assert "gives the same 9" not in praise
    need_vllm()
    import torch
    from vllm.v1.kv_cache_interface import SlidingWindowSpec

    spec = SlidingWindowSpec(block_size=16, num_kv_heads=8, head_size=64, dtype=torch.bfloat16, sliding_window=128)
    assert figures == [spec.max_admission_blocks_per_request(max_in_flight_tokens=n, max_model_len=131_072)
                       for n in lesson11.IN_FLIGHT] == [9, 10, 137, 521]


def test_lesson11_names_the_prefix_match_unit_and_partial_entries():
    """vLLM 0.33 keys a prefix inside a block on a hybrid model with Mamba layers: CacheConfig's
    prefix_match_unit (--prefix-match-unit), partial_hash_hits_enabled, BlockPool.cache_partial_block.
    Lesson 11's cure for huge hybrid blocks names it; no text says the cache holds full blocks only."""
    text = lesson_text("11")
    for name in ("--prefix-match-unit", "CacheConfig.prefix_match_unit", "partial_hash_hits_enabled",
                 "BlockPool.cache_partial_block"):
        assert name in text, name
    from blockviz.lessons.checks import Exercise

    everything = text + " ".join(e.hint for e in vars(lesson11).values() if isinstance(e, Exercise))
    assert "full blocks** only" not in everything and "holds full blocks only" not in everything
    need_vllm()
    from vllm.config import CacheConfig
    from vllm.engine.arg_utils import EngineArgs
    from vllm.v1.core.block_pool import BlockPool
    from vllm.v1.core.kv_cache_utils import partial_hash_hits_enabled

    assert CacheConfig(prefix_match_unit=32).prefix_match_unit == 32 and CacheConfig().prefix_match_unit is None
    assert EngineArgs(prefix_match_unit=32).prefix_match_unit == 32
    assert callable(BlockPool.cache_partial_block)
    assert partial_hash_hits_enabled([], 16) is False  # no Mamba group in "align" mode: whole blocks only


def test_lesson11_ships_vllms_block_bytes():
    """Lesson 11's column of vLLM's figures: shipped (VLLM_BLOCK_BYTES) so the Jupyter install shows
    them; each is the lesson's formula, and vLLM's own spec classes give it when recomputed."""
    cell = next(c for c in json.loads(next(ROOT.glob("lessons/11_*.ipynb")).read_text())["cells"]
                if "vLLM's spec classes agree" in "".join(c["source"]))
    assert "VLLM_BLOCK_BYTES" in "".join(cell["source"]) and "not installed" not in "".join(cell["source"])
    assert set(lesson11.VLLM_BLOCK_BYTES) == set(lesson11.PUBLISHED)
    for name, figures in lesson11.VLLM_BLOCK_BYTES.items():
        for kv_dtype, dtype_bytes in lesson11.KV_DTYPE_BYTES.items():
            assert figures[kv_dtype] == lesson11.bytes_per_block(lesson11.shape_of(name), 16, dtype_bytes)
    need_vllm()
    for name, figures in lesson11.VLLM_BLOCK_BYTES.items():
        for kv_dtype in lesson11.KV_DTYPE_BYTES:
            assert lesson11.vllm_block_bytes(lesson11.shape_of(name), 16, kv_dtype) == figures[kv_dtype], name


def test_allocate_slots_lets_window_blocks_go_before_it_refuses():
    """Lesson 02's note: with one group allocate_slots gives all or returns None untouched; with a
    sliding-window group vLLM's allocate_slots runs remove_skipped_blocks before the capacity check,
    so a None can have freed blocks."""
    text = " ".join(lesson_text("02").split())
    assert "remove_skipped_blocks" in text and "even a `None` can have freed blocks" in text
    need_vllm()
    manager = vllm_manager(9, window=4)  # 8 blocks and the null block
    request = vllm_request(1, 10)
    full, window = manager.allocate_slots(request, 10).get_block_ids()
    free_before = manager.block_pool.get_num_free_blocks()
    request.num_computed_tokens = 10
    request.append_output_token_ids(5)
    assert manager.allocate_slots(request, 20) is None  # 20 more tokens do not fit
    assert manager.get_block_ids("1") == (full, [0, *window[1:]])  # the window's first block went all the same
    assert manager.block_pool.get_num_free_blocks() == free_before + 1


def test_the_hybrid_manager_is_off_on_the_unspecified_platform_not_the_cpu():
    """docs/vllm-core.md: CpuPlatform.support_hybrid_kv_cache() is True; the base Platform's (vLLM's
    UnspecifiedPlatform: a CUDA wheel that finds no GPU) is False."""
    text = doc("vllm-core.md")
    assert "off on the CPU" not in text and "`CpuPlatform` says True" in text and "`UnspecifiedPlatform`" in text
    need_vllm()
    from vllm.platforms.cpu import CpuPlatform
    from vllm.platforms.interface import UnspecifiedPlatform

    assert CpuPlatform.support_hybrid_kv_cache() is True
    assert UnspecifiedPlatform.support_hybrid_kv_cache() is False


def test_a_request_larger_than_the_pool_waits_with_the_gate_on():
    """docs/vllm-core.md: with scheduler_reserve_full_isl (vLLM 0.33's default) a request larger than
    the pool is never admitted (allocate_slots(full_sequence_must_fit=True) is None, nothing held);
    only with the gate off is it admitted on its first chunk (and so preempted again and again)."""
    text = doc("vllm-core.md")
    assert "would preempt such a request forever" not in text
    assert "only with the gate off is it admitted on its first chunk" in text
    need_vllm()
    from vllm.config import SchedulerConfig

    assert SchedulerConfig(max_model_len=256, is_encoder_decoder=False).scheduler_reserve_full_isl is True
    manager = vllm_manager(8)  # 7 blocks of 4: 28 tokens
    request = vllm_request(2, 40)
    assert manager.allocate_slots(request, 8, full_sequence_must_fit=True) is None
    assert manager.get_block_ids("2") == ([],) and manager.block_pool.get_num_free_blocks() == 7
    assert len(manager.allocate_slots(request, 8, full_sequence_must_fit=False).get_block_ids()[0]) == 2


def test_the_order_a_step_runs_in_and_when_a_window_block_goes():
    """vLLM 0.33 schedules asynchronously by default, and kv_manager="vllm" and engine/v1 run that
    order (vLLM's AsyncScheduler, the next step scheduled with a step's tokens in flight), so lesson
    11's window block goes in the third step; with async_scheduling=false (vLLM's
    --no-async-scheduling) no token is in flight at allocate_slots and it goes in the second. The lesson and docs/vllm-core.md say which order a run used."""
    for text in (" ".join(lesson_text("11").split()), doc("vllm-core.md")):
        assert "--no-async-scheduling" in text and "num_in_flight_tokens" in text and "third step" in text
    need_vllm()
    from vllm.config import SchedulerConfig
    from vllm.v1.core.sched.async_scheduler import AsyncScheduler

    from blockviz.lessons.engines import fresh
    from engine import events as ev
    from engine.sequence import SamplingParams

    assert SchedulerConfig(max_model_len=256, is_encoder_decoder=False).async_scheduling is None
    kept = {}
    for in_flight in (0, 10):  # the prefill's 10 tokens processed, or still in flight
        manager = vllm_manager(12, window=4)
        request = vllm_request(3, 10)
        manager.allocate_slots(request, 10)
        request.num_computed_tokens, request.num_in_flight_tokens = 10, in_flight
        request.append_output_token_ids(5)
        manager.allocate_slots(request, 1)
        kept[in_flight] = manager.get_block_ids("3")[1][0] != 0
    assert kept == {0: False, 10: True}
    for options, steps in (({"async_scheduling": True}, 2), ({"async_scheduling": False}, 1)):  # engine/v1 alike
        with fresh({**lesson11.hybrid_options(32), **options}) as viz:
            assert viz.llm.engine.async_scheduling is options["async_scheduling"]
            viz.add_request(lesson11.prompt_ids(viz.llm.engine.encode, 10),
                            SamplingParams(max_tokens=12, ignore_eos=True))
            skipped = viz.run_until(ev.BlocksSkipped.type)
            events = list(viz.events)
            assert skipped.logical_indices == (0,)
            assert sum(isinstance(e, ev.StepStarted) for e in events[:events.index(skipped)]) == steps
    for options, steps in (({}, 2), ({"async_scheduling": False}, 1)):
        with fresh({**lesson11.hybrid_options(32), "kv_manager": "vllm", "vllm_options": options}) as viz:
            scheduler = viz.llm.engine.scheduler.vllm
            assert isinstance(scheduler, AsyncScheduler) is (steps == 2)
            viz.add_request(lesson11.prompt_ids(viz.llm.engine.encode, 10),
                            SamplingParams(max_tokens=12, ignore_eos=True))
            skipped = viz.run_until(ev.BlocksSkipped.type)
            events = list(viz.events)
            steps_before = sum(isinstance(e, ev.StepStarted) for e in events[:events.index(skipped)])
            assert skipped.logical_indices == (0,) and steps_before == steps  # at that step's allocate_slots
            in_flight = [r.num_in_flight_tokens for r in scheduler.requests.values()]
            assert in_flight == ([1] if steps == 2 else [0])  # the step still running: its one token

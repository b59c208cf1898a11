"""Lesson 13 (lessons/13_two_designs_of_prefix_caching.ipynb): every SGLang fact it states, held against
SGLang 0.5.23's own RadixCache and allocators (built here on their own, outside our engine), and every
vLLM fact against vLLM 0.33's own classes and its core run on the same chat (`kv_manager="vllm"`);
each skipped with its install line where that project is absent. Running the notebook itself (blank,
key, slips) is tests/test_lessons.py's."""

from __future__ import annotations

import json
import re
from array import array
from dataclasses import replace
from pathlib import Path
from types import SimpleNamespace

import pytest
from optional_parts import needs_sglang, needs_vllm

from blockviz.lessons import lesson13 as lesson
from blockviz.lessons.key import KEY

ROOT = Path(__file__).resolve().parent.parent
NOTEBOOK = ROOT / "lessons" / "13_two_designs_of_prefix_caching.ipynb"
POOL_SLOTS = 112  # the slots each design's pool lends in the lesson


def key_value(exercise: str):
    """The value an answer-key entry gives (`my_x = 2  # why`)."""
    return eval(re.match(r"\w+ = ([^#]+)", KEY[exercise]).group(1))  # the key's own literal


def notebook_text() -> str:
    return "\n".join("".join(cell["source"]) for cell in json.loads(NOTEBOOK.read_text())["cells"])


# ---------------------------------------------------------------- the key and the runs


@pytest.mark.slow  # runs the lesson's engines
@needs_sglang
def test_the_key_is_each_runs_figure():
    """The key's answers are the figures the runs give (what the checks compare with), no stored
    slip is right, and the runs show what the text says of them."""
    from blockviz.lessons import load_all

    exercises = {i: ex for i, ex in load_all().items() if i.startswith("13.")}
    assert len(exercises) == 7
    for exercise_id, ex in exercises.items():
        assert ex.verdict(key_value(exercise_id)).correct, exercise_id
        assert all(not ex.verdict(slip.resolve()).correct for slip in ex.slips), exercise_id
    vllm, sglang, paged = lesson.run_chat(), lesson.run_chat("sglang"), lesson.run_chat("sglang", lesson.BLOCK_SIZE)
    assert vllm.prompt_tokens == sglang.prompt_tokens == paged.prompt_tokens
    assert vllm.slots == sglang.slots == paged.slots == POOL_SLOTS, "the same KV memory in both designs"
    # vLLM serves whole blocks, SGLang at page_size 1 every shared token; at page_size 16 they agree
    assert all(hit % lesson.BLOCK_SIZE == 0 for hit in vllm.hits) and sglang.hits[1] == lesson.SYSTEM
    assert all(s >= v for s, v in zip(sglang.hits, vllm.hits)) and paged.hits == vllm.hits
    # turn 2: SGLang serves turn 1's prompt and every answer token but the last, vLLM its full blocks
    assert sglang.hits[2] == len(lesson.first_turns()["A"]) + lesson.SAMPLED - 1
    assert vllm.hits[2] == sglang.hits[2] // lesson.BLOCK_SIZE * lesson.BLOCK_SIZE
    # free space: vLLM counts its cached blocks free, SGLang counts them out
    assert vllm.free_slots == vllm.slots and vllm.cached_slots > 0
    assert sglang.free_slots + sglang.cached_slots == sglang.slots
    # eviction: SGLang frees more than it was asked, vLLM only the blocks it handed out
    assert sglang.evicted_slots > sglang.asked > 0
    never_hashed = (vllm.slots - vllm.cached_slots) // lesson.BLOCK_SIZE
    assert len(vllm.evicted_runs) == -(-lesson.NEWCOMER // lesson.BLOCK_SIZE) - never_hashed
    # the system prompt outlives C in both designs
    assert vllm.system_hits_after == vllm.hits[1] and sglang.system_hits_after == lesson.SYSTEM
    # the figures the text states are the runs'
    text = notebook_text()
    assert f"the same {POOL_SLOTS} slots" in text and f"{POOL_SLOTS} token slots" in text
    assert f"SGLang was asked for {sglang.asked} slots" in text
    assert (f"the same system prompt ({lesson.SYSTEM} tokens). User A sends a message ({lesson.USER_A} tokens) after it, "
            f"user B another ({lesson.USER_B} tokens); each turn samples {lesson.SAMPLED} tokens") in text
    assert f"a follow-up message of {lesson.FOLLOW_UP} tokens" in text and f"C arrives: {lesson.NEWCOMER} tokens" in text
    assert f"vLLM needs {-(-lesson.NEWCOMER // lesson.BLOCK_SIZE)} blocks for C" in text
    assert f"give C its {-(-lesson.NEWCOMER // lesson.BLOCK_SIZE)} blocks" in text
    assert f"up to {lesson.BLOCK_SIZE - 1} tokens with blocks of {lesson.BLOCK_SIZE}" in text


# ---------------------------------------------------------------- SGLang's own objects


def sglang_cache(page_size: int, num_slots: int = POOL_SLOTS):
    """SGLang's RadixCache over its own allocator (TokenToKVPoolAllocator at page_size 1, else
    PagedTokenToKVPoolAllocator) and ReqToTokenPool, on the CPU, LRU eviction: no engine of ours."""
    import torch

    from engine.sglang_core.imports import sglang_classes

    sgl = sglang_classes()
    req_to_token_pool = sgl.ReqToTokenPool(size=4, max_context_len=256, device="cpu", enable_memory_saver=False)
    if page_size == 1:
        allocator = sgl.TokenToKVPoolAllocator(num_slots, torch.float32, "cpu", kvcache=None, need_sort=False)
    else:
        allocator = sgl.PagedTokenToKVPoolAllocator(num_slots, page_size, torch.float32, "cpu", kvcache=None,
                                                    need_sort=False)
    return sgl.RadixCache(sgl.CacheInitParams(disable=False, req_to_token_pool=req_to_token_pool,
                                              token_to_kv_pool_allocator=allocator, page_size=page_size,
                                              enable_kv_cache_events=False, eviction_policy="lru"))


def key_of(tokens: list[int]):
    from sglang.srt.mem_cache.radix_cache import RadixKey

    return RadixKey(array("q", tokens))


def match(cache, tokens: list[int]):
    from sglang.srt.mem_cache.base_prefix_cache import MatchPrefixParams

    return cache.match_prefix(MatchPrefixParams(key=key_of(tokens)))


def publish(cache, tokens: list[int]) -> int:
    """What SGLang does with a finished request's computed tokens: the cached prefix's slots, fresh
    slots from the allocator for the rest, `insert` (whole pages only; a partial last page's slots go
    back to the allocator). Returns the tokens the lookup matched."""
    import torch

    from sglang.srt.mem_cache.base_prefix_cache import InsertParams

    found = match(cache, tokens)
    prefix = cache.path_device_indices(found.last_device_node)[:found.device_prefix_len]
    page_size = cache.page_size
    rest = len(tokens) - found.device_prefix_len
    fresh = cache.token_to_kv_pool_allocator.alloc(-(-rest // page_size) * page_size)
    value = torch.cat([prefix.to(torch.int64), fresh[:rest].to(torch.int64)])
    aligned = len(tokens) // page_size * page_size
    cache.insert(InsertParams(key=key_of(tokens[:aligned]), value=value[:aligned]))
    if aligned < len(tokens):
        cache.token_to_kv_pool_allocator.free(fresh[aligned - found.device_prefix_len:])
    return found.device_prefix_len


def turn1(user: str) -> list[int]:
    """A user's turn 1 as SGLang publishes it at the end: the prompt and the answer's first SAMPLED - 1
    tokens (the last sampled token has no K/V); the answer's token ids do not matter to the tree."""
    return lesson.first_turns()[user] + list(range(2000, 2000 + lesson.SAMPLED - 1))


@pytest.mark.slow  # runs the lesson's engines
@needs_sglang
@pytest.mark.parametrize("page_size", [1, lesson.BLOCK_SIZE])
def test_sglang_matches_whole_pages_and_splits_a_node(page_size):
    """RadixCache.match_prefix of B's prompt against A's published turn 1 serves the system prompt cut
    to whole pages (page_aligned), and a match ending inside a node splits it: the system prompt is a
    node of its own afterwards. The lesson's run gives the same hit."""
    cache = sglang_cache(page_size)
    publish(cache, turn1("A"))
    found = match(cache, lesson.first_turns()["B"])
    assert found.device_prefix_len == lesson.SYSTEM // page_size * page_size
    assert found.device_prefix_len == lesson.run_chat("sglang", page_size).hits[1]
    assert len(found.last_device_node.key) == found.device_prefix_len, "the match split A's node at its end"
    assert found.last_device_node.parent is cache.root_node
    if page_size > 1:
        assert found.device_prefix_len == lesson.run_chat().hits[1], "whole pages of 16 hit as vLLM's blocks"


@pytest.mark.slow  # runs the lesson's engines
@needs_sglang
def test_sglang_keeps_a_partial_page_only_at_page_size_1():
    """A's turn 1 (57 computed tokens) published: at page_size 1 the tree holds every token, at 16 its
    three full pages; A's turn 2 matches as the lesson's runs say."""
    turn2 = turn1("A") + [2100] + list(range(700, 700 + lesson.FOLLOW_UP))
    for page_size, run in ((1, lesson.run_chat("sglang")), (lesson.BLOCK_SIZE, lesson.run_chat("sglang", 16))):
        cache = sglang_cache(page_size)
        publish(cache, turn1("A"))
        assert cache.evictable_size() == len(turn1("A")) // page_size * page_size
        assert match(cache, turn2).device_prefix_len == run.hits[2]


@needs_sglang
def test_sglang_counts_cached_slots_out_of_free_and_evicts_whole_leaves():
    """After both users' turn 1: the allocator's available_size leaves the tree's slots out, the tree's
    evictable_size holds them, and the two add up to the pool (the PrefillAdder's budget). Asked for
    fewer slots than a leaf holds, RadixCache.evict deletes a whole leaf, the least recently used,
    and frees more than asked; the system prompt's inner node stays."""
    cache = sglang_cache(1)  # imports SGLang's modules (engine/sglang_core/imports.py) before the line below
    from sglang.srt.mem_cache.base_prefix_cache import EvictParams

    publish(cache, turn1("A"))
    publish(cache, turn1("B"))
    allocator = cache.token_to_kv_pool_allocator
    held = len(turn1("A")) + len(turn1("B")) - lesson.SYSTEM  # the system prompt once, each user's rest
    assert cache.evictable_size() == held and allocator.available_size() == POOL_SLOTS - held
    a_leaf = len(turn1("A")) - lesson.SYSTEM
    result = cache.evict(EvictParams(num_tokens=1))
    assert result.num_tokens_evicted == a_leaf > 1, "A's leaf, used least recently, goes whole"
    assert allocator.available_size() == POOL_SLOTS - held + a_leaf
    assert match(cache, lesson.first_turns()["A"]).device_prefix_len == lesson.SYSTEM


@pytest.mark.slow  # runs the lesson's engines
@needs_sglang
def test_the_lessons_eviction_is_sglangs_evict(monkeypatch):
    """In the lesson's SGLang run, C's allocation asks RadixCache.evict first (D's, after it, asks
    again), for the shortfall the lesson computes (C's slots less available_size), and SGLang's own
    result is the slots the lesson counts from the events: more than asked."""
    from engine.sglang_core.imports import sglang_classes

    RadixCache = sglang_classes().RadixCache
    calls = []
    evict = RadixCache.evict

    def recording(self, params):
        result = evict(self, params)
        calls.append((params.num_tokens, result.num_tokens_evicted))
        return result

    monkeypatch.setattr(RadixCache, "evict", recording)
    chat = lesson.run_chat.__wrapped__("sglang")  # a run of its own, not the cached one
    assert calls[0] == (chat.asked, chat.evicted_slots)
    assert chat == lesson.run_chat("sglang")
    assert chat.evicted_slots > chat.asked


@needs_sglang
def test_sglang_sets_page_size_64_for_flashmla():
    """The text's claim: SGLang raises page_size to 64 for FlashMLA (_mla_backend_page_constraints)."""
    from engine.sglang_core.imports import sglang_classes

    sglang_classes()
    from sglang.srt.arg_groups import overrides

    view = SimpleNamespace(page_size=1, attention_backend="flashmla", decode_attention_backend=None,
                           prefill_attention_backend=None, speculative_draft_attention_backend=None)
    assert overrides._mla_backend_page_constraints(view) == {"page_size": 64}
    assert "`_mla_backend_page_constraints` in `sglang/srt/arg_groups/overrides.py`" in notebook_text()


@needs_sglang
def test_the_sglang_names_the_lesson_cites_exist():
    """Every SGLang function the lesson names is in SGLang 0.5.23, in the file it names."""
    from engine.sglang_core.imports import sglang_classes

    sglang_classes()
    import importlib

    cited = {"sglang.srt.mem_cache.radix_cache": ["RadixCache.match_prefix", "RadixCache._split_node",
                                                   "RadixCache.insert", "RadixCache.evict"],
             "sglang.srt.mem_cache.common": ["checkpoint_kv_cache", "release_kv_cache"],
             "sglang.srt.mem_cache.allocator.base": ["BaseTokenToKVPoolAllocator.evict_to_free_tokens"],
             "sglang.srt.mem_cache.prefill_budget": [],
             "sglang.srt.managers.schedule_policy": ["PrefillAdder", "SchedulePolicy.calc_priority"]}
    text = notebook_text()
    for module_name, names in cited.items():
        module = importlib.import_module(module_name)
        assert f"`{module_name.replace('.', '/')}.py`" in text or module_name.endswith("schedule_policy"), module_name
        for name in names:
            owner = module
            for part in name.split("."):
                owner = getattr(owner, part)
            assert f"`{name}`" in text or f"`{name.split('.')[-1]}`" in text, name


# ---------------------------------------------------------------- vLLM's own objects


@pytest.mark.slow  # runs the lesson's engines
@needs_vllm
def test_the_chat_on_vllms_own_core_gives_the_same_figures():
    """vLLM's own KVCacheManager and BlockPool (`kv_manager="vllm"`) serve, count free and evict as
    engine/v1 does in the lesson: whole blocks, cached blocks counted free (BlockPool.get_num_free_blocks),
    one block evicted per cached block handed out."""
    theirs = lesson.run_chat("vllm")
    assert replace(theirs, kv_manager="v1") == lesson.run_chat()
    assert theirs.hits[1] == key_value("13.vllm_hits") and len(theirs.evicted_runs) == key_value("13.vllm_evicted")


@needs_vllm
def test_the_vllm_names_the_lesson_cites_exist():
    """Every vLLM function and default the lesson names is vLLM 0.33's."""
    from vllm.config.scheduler import SchedulerConfig
    from vllm.v1.core.block_pool import BlockPool
    from vllm.v1.core.kv_cache_manager import KVCacheManager
    from vllm.v1.core.kv_cache_utils import FreeKVCacheBlockQueue

    for owner, name in ((KVCacheManager, "get_computed_blocks"), (BlockPool, "cache_full_blocks"),
                        (BlockPool, "get_new_blocks"), (BlockPool, "_maybe_evict_cached_block"),
                        (BlockPool, "get_num_free_blocks"), (BlockPool, "free_blocks")):
        assert callable(getattr(owner, name)), name
        assert f"`{owner.__name__}.{name}`" in notebook_text() or f"`{name}`" in notebook_text(), name
    assert FreeKVCacheBlockQueue.__name__ in notebook_text()
    assert SchedulerConfig.__dataclass_fields__["policy"].default == "fcfs"

"""The lessons' v1 figures, replayed on vLLM 0.33's own core (`kv_manager="vllm"`, engine/vllm_core/).

Lesson 10 runs every v1 workload the lessons discuss (the "In vLLM v1" notes of lessons 02, 04, 05, 06
and 07 point at it); here each one runs again with `kv_manager="vllm"`, so vLLM's own `Scheduler`,
`KVCacheManager` and `BlockPool` make every decision, and the figures the lessons state are checked
against what those objects did: the prefix-cache hits of n=2's second child (04, 10.1), the free
queue's order after a request finishes and the block it evicts first (07, 10.2), the recompute
preemption and what the cache serves back (06, 10.3), the `num_tokens - 1` cap and its duplicate
block (05, 10.4), chunked prefill (10.5) and the whole-prompt admission gate with no watermark (02).
Each figure is also the one `kv_manager="v1"` gives (what the lesson prints) and, for an exercise,
the answer key's.
"""

from __future__ import annotations

import re
from functools import cache
from pathlib import Path

import pytest
from optional_parts import lazy_importorskip

from blockviz.lessons import lesson10 as lesson
from blockviz.lessons.engines import events_of, fresh
from blockviz.lessons.key import KEY
from engine import events as ev
from engine.designs import V1, VLLM, get_design
from engine.sequence import SamplingParams

pytest.importorskip("vllm", reason="vLLM is not installed")
nbformat = lazy_importorskip("nbformat")  # imported by the first test that reads a notebook

LESSONS_DIR = Path(__file__).resolve().parent.parent / "lessons"
MODES = (V1.name, VLLM.name)


def key_value(exercise: str) -> int:
    """The number an answer-key entry gives (`my_x = 2  # why`)."""
    return int(re.match(r"\w+ = (\d+)", KEY[exercise]).group(1))


def vllm_core(viz):
    """The vLLM objects behind a `kv_manager="vllm"` run: (Scheduler, KVCacheManager, BlockPool)."""
    scheduler = viz.llm.engine.scheduler
    return scheduler.vllm, scheduler.kv_cache_manager, scheduler.block_pool


def vllm_free_queue(pool) -> list[int]:
    return [block.block_id for block in pool.free_block_queue.get_all_free_blocks()]


# ---------------------------------------------------------------- the notes name the release


def test_each_v1_note_names_the_release_and_the_file_it_describes():
    for number in ("02", "04", "05", "06", "07"):
        (path,) = LESSONS_DIR.glob(f"{number}_*.ipynb")
        (note,) = [c.source for c in nbformat.read(path, 4).cells if c.source.startswith("## In vLLM v1")]
        assert "vLLM 0.33" in note, path.name
        assert re.search(r"`vllm/v1/[\w/]+\.py`", note), f"{path.name}: the note names no vLLM file"
    ten = "\n".join(c.source for c in nbformat.read(LESSONS_DIR / "10_vllm_v1.ipynb", 4).cells)
    assert "vLLM 0.33" in ten and "`vllm/v1/core/kv_cache_manager.py`" in ten
    everything = "\n".join(c.source for p in sorted(LESSONS_DIR.glob("*.ipynb")) for c in nbformat.read(p, 4).cells)
    assert "no CPU pool" not in everything and "the CPU pool with it" not in everything
    assert "--kv-offloading-size" in everything and "vllm/v1/simple_kv_offload/manager.py" in everything
    assert "full_sequence_must_fit" in everything and "watermark" in everything
    assert '"vllm-none-hash"' in everything and "#42656" in everything


def test_the_notes_state_vllms_defaults():
    """What the notes say vLLM 0.33 does by default is what its configs hold."""
    from vllm.config import CacheConfig, SchedulerConfig
    from vllm.v1.core import kv_cache_utils

    scheduler = SchedulerConfig(max_model_len=256, is_encoder_decoder=False)
    assert scheduler.scheduler_reserve_full_isl is True and scheduler.watermark == 0.0
    assert scheduler.policy == "fcfs"
    cache_config = CacheConfig()
    assert cache_config.enable_prefix_caching is True and cache_config.prefix_caching_hash_algo == "sha256"
    assert cache_config.kv_offloading_size is None
    assert kv_cache_utils.DEFAULT_NONE_HASH_SEED == "vllm-none-hash"


# ---------------------------------------------------------------- lesson 10's workloads, in each mode


@cache
def children(mode: str) -> dict:
    """10.1 (and lesson 04's note): n=2 on the 10-token prompt, after the first step and at the end."""
    params = SamplingParams(n=2, temperature=1.0, seed=0, max_tokens=8)
    with fresh(lesson.options(mode), prompts=lesson.WINTER, sampling_params=params) as viz:
        viz.step()
        tables = {seq_id: viz.state.table_blocks(seq_id) for seq_id in viz.state.tables}
        figures = {"hits": viz.state.num_prefix_hits, "tables": tables}
        if get_design(mode) is VLLM:
            _, _, pool = vllm_core(viz)
            figures["ref_cnt"] = {n: pool.blocks[n].ref_cnt for t in tables.values() for n in t}
        outputs = viz.run_to_completion()
        figures["texts"] = [c.text for c in outputs[0].outputs]
        figures["copies"] = len(events_of(viz, ev.CopyOnWrite))
        return figures


def test_n2_second_child_hits_the_full_blocks_on_vllm():
    ours, theirs = children("v1"), children("vllm")
    assert theirs["hits"] == ours["hits"] == key_value("10.child_hits") == lesson.check_child_hits.truth()
    first, second = theirs["tables"].values()
    assert first[:2] == second[:2] and first[2] != second[2], "full blocks shared, the partial one each child's own"
    assert [theirs["ref_cnt"][n] for n in first] == [2, 2, 1] and theirs["ref_cnt"][second[2]] == 1
    assert theirs["copies"] == 0 and theirs["texts"] == ours["texts"]


@cache
def free_queue(mode: str) -> dict:
    """10.2 (and lesson 07's note): Hamlet on a 9-block pool, finished, then the 20-token line."""
    params = SamplingParams(max_tokens=4, ignore_eos=True)
    with fresh(lesson.options(mode, 9)) as viz:
        hamlet = viz.add_request(lesson.HAMLET, params)
        viz.run_to_completion()
        figures = {"table": lesson._table_of(viz, hamlet), "after_finish": list(viz.state.free_queue)}
        if get_design(mode) is VLLM:
            _, _, pool = vllm_core(viz)
            figures["vllm_after_finish"] = vllm_free_queue(pool)
            figures["hashed"] = {n for n in figures["after_finish"] if pool.blocks[n].block_hash is not None}
        viz.add_request(lesson.CITIZEN, params)
        figures["evicted"] = viz.run_until(ev.BlockEvicted.type).block
        if get_design(mode) is VLLM:
            figures["evicted_hash"] = pool.blocks[figures["evicted"]].block_hash
        return figures


def test_free_queue_order_and_first_eviction_on_vllm():
    ours, theirs = free_queue("v1"), free_queue("vllm")
    table = theirs["table"]
    assert table == ours["table"] and len(table) == 4
    # vLLM's own queue: the unhashed last block at the head, the hashed chain at the tail, last first
    assert theirs["vllm_after_finish"] == theirs["after_finish"] == ours["after_finish"]
    queue = theirs["vllm_after_finish"]
    assert queue[0] == table[3] and queue[-3:] == [table[2], table[1], table[0]]
    assert theirs["hashed"] == set(table[:3])
    # the answer key's block (hamlet_table[2], the chain's tail) is the first one vLLM evicts
    assert theirs["evicted"] == ours["evicted"] == table[2] == lesson.check_evicted.truth()
    assert theirs["evicted_hash"] is None, "vLLM dropped the hash when it handed the block out"


@cache
def preemption(mode: str) -> dict:
    """10.3 (and lesson 06's note): the two requests on a 14-block pool, too few for both."""
    params = SamplingParams(max_tokens=20, ignore_eos=True)
    with fresh(lesson.options(mode, 14), prompts=lesson.PREEMPT_PROMPTS, sampling_params=params) as viz:
        victim = viz.run_until(ev.Preempted.type)
        figures = {"victim": victim.seq_ids}
        if get_design(mode) is VLLM:
            scheduler, _, _ = vllm_core(viz)
            head = scheduler.waiting.peek_request()
            figures["waiting_head"] = (int(head.request_id), head.status.name, head.num_computed_tokens,
                                       head.num_preemptions)
            figures["running"] = [int(r.request_id) for r in scheduler.running]
        viz.run_to_completion()
    figures.update(lesson.preemption_run(mode))
    return figures


def test_recompute_preemption_and_what_the_cache_serves_back_on_vllm():
    ours, theirs = preemption("v1"), preemption("vllm")
    (victim,) = theirs["victim"]
    assert theirs["victim"] == ours["victim"] == (1,), "the last running request is the victim"
    # vLLM put it back at the front of its waiting queue, its K/V dropped (recompute)
    assert theirs["waiting_head"] == (victim, "PREEMPTED", 0, 1) and victim not in theirs["running"]
    assert theirs["lost"] == ours["lost"] and len(theirs["lost"]) == 1
    assert theirs["served"] == ours["served"] == key_value("10.served") == lesson.check_served.truth()
    assert 0 < theirs["served"] < theirs["lost"][0], "the cache serves back the head of the chain, not all of it"
    assert theirs["computed"] == ours["computed"]


@cache
def aligned(mode: str) -> dict:
    """10.4 (and lesson 05's note): the 12-token line, then again: at most num_tokens - 1 served."""
    with fresh(lesson.options(mode)) as viz:
        viz.add_request(lesson.HAMLET, SamplingParams(max_tokens=4))
        viz.run_to_completion()
        before = viz.state.num_prefix_hits
        again = viz.add_request(lesson.HAMLET, SamplingParams(max_tokens=4))
        viz.step()
        table = viz.state.table_blocks(viz.state.requests[again][0])
        figures = {"hits": viz.state.num_prefix_hits - before, "table": table}
        if get_design(mode) is VLLM:
            _, _, pool = vllm_core(viz)
            third = pool.blocks[table[2]].block_hash
            figures["same_hash"] = [b.block_id for b in pool.blocks if third is not None and b.block_hash == third]
        return figures


def test_num_tokens_minus_one_cap_and_the_duplicate_block_on_vllm():
    ours, theirs = aligned("v1"), aligned("vllm")
    assert theirs["hits"] == ours["hits"] == key_value("10.aligned_hits") == lesson.check_aligned_hits.truth()
    assert theirs["table"] == ours["table"]
    # vLLM never de-duplicates: two of its blocks now hold the third block's hash
    assert len(theirs["same_hash"]) == 2 and theirs["table"][2] in theirs["same_hash"]


@cache
def chunks(mode: str) -> list[tuple[int, int]]:
    """10.5: the 20-token line with a budget of 8 tokens a step: (computed, new) per prefill step."""
    with fresh(lesson.options(mode, max_num_batched_tokens=8), prompts=lesson.CITIZEN,
               sampling_params=SamplingParams(max_tokens=3)) as viz:
        viz.run_to_completion()
        return [(e.num_computed_tokens[0], e.num_new_tokens[0]) for e in events_of(viz, ev.TokensScheduled)
                if e.num_computed_tokens[0] < e.num_tokens[0] - 1]


def test_chunked_prefill_on_vllm():
    assert chunks("vllm") == chunks("v1") == [(0, 8), (8, 8), (16, 4)]
    assert len(chunks("vllm")) == key_value("10.chunk_steps") == lesson.check_chunk_steps.truth()


@cache
def admission(mode: str) -> dict:
    """Lesson 02's note: Hamlet runs on a 9-block pool with a budget of 8; the 20-token line arrives
    after two steps. Its first chunk fits beside Hamlet, its whole prompt (5 blocks) only when Hamlet is done."""
    params = SamplingParams(max_tokens=4, ignore_eos=True)
    with fresh(lesson.options(mode, 9, max_num_batched_tokens=8)) as viz:
        hamlet = viz.add_request(lesson.HAMLET, params)
        viz.step()
        viz.step()
        citizen = viz.add_request(lesson.CITIZEN, params)
        hamlet_seq, citizen_seq = viz.state.requests[hamlet][0], viz.state.requests[citizen][0]
        figures = {"free_while_waiting": []}
        if get_design(mode) is VLLM:
            scheduler, manager, pool = vllm_core(viz)
            figures["gate"] = (scheduler.scheduler_reserve_full_isl, manager.watermark_blocks)
        while viz.step() is not None:
            waited = not any(citizen_seq in e.seq_ids for e in events_of(viz, ev.TokensScheduled))
            if get_design(mode) is VLLM and waited and viz.state.seqs[hamlet_seq].status == "running":
                figures["free_while_waiting"].append(pool.get_num_free_blocks())

        def steps_of(seq_id: int) -> list[int]:
            return [e.step for e in events_of(viz, ev.TokensScheduled) if seq_id in e.seq_ids]

        figures.update(first_step=steps_of(citizen_seq)[0], hamlet_done=steps_of(hamlet_seq)[-1],
                       preemptions=len(events_of(viz, ev.Preempted)))
        return figures


def test_whole_prompt_admission_and_no_watermark_on_vllm():
    ours, theirs = admission("v1"), admission("vllm")
    assert theirs["gate"] == (True, 0), "vLLM 0.33's defaults: the whole-prompt gate on, no watermark"
    first_chunk_blocks, whole_prompt_blocks = 8 // 4, 20 // 4
    # while Hamlet ran, vLLM's pool had room for the first chunk but not for the whole prompt ...
    assert theirs["free_while_waiting"]
    assert all(first_chunk_blocks <= free < whole_prompt_blocks for free in theirs["free_while_waiting"])
    # ... so vLLM waited until Hamlet was done, and nothing was preempted,
    assert theirs["first_step"] > theirs["hamlet_done"] and theirs["preemptions"] == 0
    # and this repository's v1, on vLLM 0.33's defaults (EngineConfig.scheduler_reserve_full_isl), does the same
    assert ours["first_step"] > ours["hamlet_done"] and ours["preemptions"] == 0


# ---------------------------------------------------------------- lesson 11: why a hit rate is 0


@pytest.mark.parametrize("case", ["15 tokens", "16 tokens", "17 tokens", "shared 40, blocks of 16",
                                  "shared 40, blocks of 64"])
def test_lesson11_misses_are_vllms_own(case):
    """Lesson 11's one-block floor and big-block runs on vLLM's own core: the second request gets
    the prefix-cache hits (PrefixCacheHit events, as vLLM's KVCacheManager decided them) that
    kv_manager="v1" gives, that the explainer's lookup counts, and that the key answers."""
    from blockviz.lessons import lesson11

    args = {"15 tokens": (16, lesson11.SHORT), "16 tokens": (16, 16), "17 tokens": (16, 17),
            "shared 40, blocks of 16": (16, lesson11.SHARED, None, lesson11.QUESTIONS),
            "shared 40, blocks of 64": (64, lesson11.SHARED, None, lesson11.QUESTIONS)}[case]
    served = {}
    for mode in MODES:
        lookup, events = lesson11.hits_of_the_second(mode, *args)
        hits = [e for e in events if isinstance(e, ev.PrefixCacheHit) and lookup.seq_id in e.seq_ids]
        assert len(hits) * args[0] == lookup.num_hit_tokens, mode
        served[mode] = (lookup.num_hit_tokens, lookup.first_miss.verdict)
    assert served["v1"] == served["vllm"]
    if case == "15 tokens":
        assert served["vllm"][0] == key_value("11.floor_hits") == 0
    if case == "shared 40, blocks of 64":
        assert served["vllm"][0] == key_value("11.big_block_hits") == 0
    if case == "shared 40, blocks of 16":
        assert served["vllm"][0] == 32


def test_lesson11_window_tail_is_vllms_own():
    """Lesson 11's window-tail run on vLLM's own hybrid core (kv_manager="vllm": its
    HybridKVCacheCoordinator over two KV-cache groups): B is served the same 8 tokens, from the same
    blocks, as engine/v1 serves it, and the key's answer; request A's window frees and C's eviction
    are the same blocks too, in vLLM's default asynchronous order and in its synchronous one
    (engine/v1 in the same order each time)."""
    from blockviz.lessons import lesson11

    def run(mode, asynchronous):
        with fresh({**lesson11.hybrid_options(), "kv_manager": mode, "async_scheduling": asynchronous}) as viz:
            assert viz.llm.engine.async_scheduling is asynchronous
            b = lesson11.window_tail(viz)
            (seq_id,) = viz.state.requests[b]
            computed = next(e.num_computed_tokens[e.seq_ids.index(seq_id)] for e in events_of(viz, ev.TokensScheduled)
                            if seq_id in e.seq_ids)
            moves = [(type(e).__name__, e.block) for e in viz.events
                     if isinstance(e, (ev.BlockAllocated, ev.BlockFreed, ev.PrefixCacheHit, ev.BlockEvicted))]
            return computed, moves

    for asynchronous in (True, False):
        ours, theirs = run("v1", asynchronous), run("vllm", asynchronous)
        assert ours == theirs, asynchronous
        assert ours[0] == key_value("11.window_hit") == 8

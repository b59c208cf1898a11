"""Our v1 (engine/v1/: Scheduler over KVCacheManager) held to vLLM 0.33's own Scheduler and
KVCacheManager (engine/vllm_core/) step by step, on seeded random workloads.

Each workload (arrivals over several steps, prompts sharing openings over a small vocabulary, n > 1
fanned out into requests, pools from two blocks up so that preemption and refusal happen, token
budgets that chunk prefills, stop tokens, max_tokens, aborts mid-run) drives both schedulers
through the same loop as LLMEngine.step: schedule, a stand-in model's token for each row that
samples (a function of the sequence's tokens, so equal schedules give equal tokens), then one
update_from_output(plan, sampled_token_ids) that appends them and stops a request at its stop token,
its max_tokens or the model's context. After every step the two must agree on the
plan (per scheduled sequence: where it starts, its tokens, its block ids, in order), the
preemptions, the requests refused and why, every event emitted (hits, allocations, slots, hashes,
evictions, frees, preemptions, in order) and the free queue's order; and each side's reducer, fed
only its events, equals its manager (engine/v1's, or vLLM's own block pool and req_to_blocks).

Both sides run on their defaults, which are vLLM 0.33's: a waiting request is admitted only when its
whole sequence fits the free blocks (`SchedulerConfig.scheduler_reserve_full_isl = True`,
`KVCacheManager.allocate_slots(..., full_sequence_must_fit=True)`; engine/v1's `Scheduler(...,
scheduler_reserve_full_isl=True)` and EngineConfig's field), and the admission watermark is 0
(`SchedulerConfig.watermark` / engine/v1's `KVCacheManager(watermark=...)`). One workload in four
sets the gate off or a watermark, on both sides alike, so the other settings are compared too.

Both sides run in vLLM 0.33's default order, async scheduling (vLLM's `AsyncScheduler`; engine/v1's
`Scheduler(..., async_scheduling=True)`): the next step is scheduled with the last one's sampled
tokens in flight, then the last step's output is processed, then the new step's rows whose request
is still unfinished run (LLMEngine._step_async's order); and both again in the synchronous order
(`async_scheduling=False`, vLLM's plain `Scheduler`).

Deliberate differences, each set to vLLM's side here so the rest can be compared:
- vLLM's AsyncScheduler does not schedule a request whose token in flight reaches its `max_tokens`;
  the adapter hands vLLM a `max_tokens` past the model's context (our stop check ends every
  request), so neither side skips it: such a request is scheduled once more, its row discarded.
- vLLM's `long_prefill_token_threshold` has no counterpart in engine/v1: it stays at vLLM's default, 0.
- vLLM requires `max_num_batched_tokens >= max_num_seqs` (`SchedulerConfig.verify_max_model_len`);
  engine/v1 does not, so the workloads draw budgets within vLLM's rule.
- A request whose tokens need more blocks than the pool holds: vLLM never meets one
  (`check_enough_kv_cache_memory` refuses such a pool at start-up; its `schedule()` would preempt
  it forever). engine/v1 ignores it when its admission loop reaches it (`Scheduler._admit_waiting`);
  the adapter (engine/vllm_core/scheduler.py) when it is added and when it heads vLLM's waiting
  queue. The step a request is refused can therefore differ (a too-big prompt queued behind
  others: the adapter refuses it at once, v1 when it reaches the head), and what follows with it:
  a workload with a refusal is compared up to the step of its first refusal.
- NONE_HASH: both seed the first block's parent as vLLM 0.33 does (`resolve_none_hash_seed`:
  PYTHONHASHSEED when set, else "vllm-none-hash"), but for xxhash, where vLLM draws random bytes per
  process; engine/v1 keeps "vllm-none-hash" (kv_cache_utils.resolve_none_hash_seed) and the adapter
  seeds vLLM alike, so the hashes (sha256, xxhash and their CBOR forms, drawn per workload) compare
  equal.
- vLLM's `policy="priority"` (preempt the largest (priority, arrival)) has no counterpart in
  engine/v1; it runs only under kv_manager="vllm" (tests/test_vllm_core.py), not here.
"""

from __future__ import annotations

import importlib.util
import itertools
import random
from dataclasses import dataclass

import msgspec
import pytest

from engine.events import EventBus
from engine.scheduler import SchedulerConfig
from engine.sequence import SamplingParams, Sequence, SequenceGroup

pytestmark = pytest.mark.skipif(importlib.util.find_spec("vllm") is None, reason="vLLM is not installed")

NUM_WORKLOADS = 360  # at least 300 of them equal to the end
VOCAB = 12  # a small vocabulary: prompts and outputs share blocks often
MAX_MODEL_LEN = 48
MAX_STEPS = 400


@dataclass(frozen=True)
class Req:
    arrival: int
    prompt: tuple[int, ...]
    n: int
    max_tokens: int
    stop_token: int | None
    abort_at: int | None


@dataclass(frozen=True)
class Workload:
    block_size: int
    num_gpu_blocks: int
    max_num_seqs: int
    max_num_batched_tokens: int
    enable_caching: bool
    hash_algo: str
    reserve_full_isl: bool | None  # vLLM's whole-sequence admission gate, on both sides; None: the default
    watermark: float | None  # vLLM's admission watermark, on both sides; None: the default
    requests: tuple[Req, ...]


def make_workload(seed: int) -> Workload:
    rng = random.Random(seed)
    max_num_seqs = rng.randint(1, 4)
    openings = [tuple(rng.randrange(VOCAB) for _ in range(rng.randint(1, 12))) for _ in range(2)]
    requests = tuple(
        Req(arrival=rng.choice([0, 0, 1, 2, 3, 5]),
            prompt=rng.choice(openings) + tuple(rng.randrange(VOCAB) for _ in range(rng.randint(0, 8))),
            n=rng.choice([1, 1, 1, 2, 3]), max_tokens=rng.randint(1, 12),
            stop_token=rng.choice([None, None, rng.randrange(VOCAB)]),
            abort_at=rng.choice([None] * 5 + [rng.randint(0, 8)]))
        for _ in range(rng.randint(1, 5)))
    return Workload(block_size=rng.choice([1, 2, 3, 4]), num_gpu_blocks=rng.randint(2, 28), max_num_seqs=max_num_seqs,
                    max_num_batched_tokens=rng.randint(max_num_seqs, 24), enable_caching=rng.random() < 0.8,
                    hash_algo=rng.choice(["sha256", "xxhash", "sha256_cbor", "xxhash_cbor"]),
                    reserve_full_isl=None if seed % 4 else rng.random() < 0.5,
                    watermark=None if seed % 4 else rng.choice([0.0, 0.1, 0.25]), requests=requests)


def next_token(token_ids: list[int]) -> int:
    """The stand-in model: a function of the sequence's tokens."""
    return (token_ids[-1] * 7 + len(token_ids) * 3 + sum(token_ids[-3:])) % VOCAB


ORDERS = {"async": True, "sync": False}  # vLLM 0.33's default order (AsyncScheduler), --no-async-scheduling


def v1_side(w: Workload, events: EventBus, asynchronous: bool = True):
    from engine.v1.kv_cache_manager import KVCacheManager
    from engine.v1.scheduler import Scheduler

    options = {} if w.watermark is None else {"watermark": w.watermark}
    manager = KVCacheManager(w.block_size, w.num_gpu_blocks, MAX_MODEL_LEN, enable_caching=w.enable_caching,
                             hash_algo=w.hash_algo, events=events, **options)
    gate = {} if w.reserve_full_isl is None else {"scheduler_reserve_full_isl": w.reserve_full_isl}
    scheduler = Scheduler(SchedulerConfig(w.max_num_seqs, w.max_num_batched_tokens, MAX_MODEL_LEN), manager, **gate,
                          async_scheduling=asynchronous)
    return scheduler, lambda: [b.block_id for b in manager.block_pool.free_block_queue]


def spec_of(w: Workload):
    """The one full-attention layer spec both sides' pools are made of."""
    import torch

    from engine.v1.kv_cache_interface import FullAttentionSpec

    return FullAttentionSpec(w.block_size, num_kv_heads=2, head_size=16, dtype=torch.float32)


def vllm_side(w: Workload, events: EventBus, model_dir, asynchronous: bool = True):
    from engine.vllm_core.config import build_kv_cache_config, build_scheduler, build_vllm_config, make_block_hasher
    from engine.vllm_core.scheduler import VllmScheduler

    config = build_vllm_config(model_dir, block_size=w.block_size, num_gpu_blocks=w.num_gpu_blocks,
                               max_model_len=MAX_MODEL_LEN, max_num_seqs=w.max_num_seqs,
                               max_num_batched_tokens=w.max_num_batched_tokens, enable_prefix_caching=w.enable_caching,
                               prefix_caching_hash_algo=w.hash_algo,
                               options={**({} if asynchronous else {"async_scheduling": False}), **{
                                   name: value for name, value in (("scheduler_reserve_full_isl", w.reserve_full_isl),
                                                                   ("watermark", w.watermark)) if value is not None}})
    vllm = build_scheduler(config, build_kv_cache_config(config, [spec_of(w)], w.num_gpu_blocks), w.block_size)
    assert type(vllm).__name__ == ("AsyncScheduler" if asynchronous else "Scheduler")  # vLLM's default, or not
    scheduler = VllmScheduler(vllm, events, make_block_hasher(w.hash_algo, w.block_size), MAX_MODEL_LEN)
    pool = scheduler.block_pool
    return scheduler, lambda: [b.block_id for b in pool.free_block_queue.get_all_free_blocks()]


def drive(w: Workload, scheduler, free_queue, events: EventBus) -> list[dict]:
    """LLMEngine.step's loop over `scheduler` with the stand-in model; a record per step. After
    every step the reducer fed the events equals the manager (ours or vLLM's). Under async
    scheduling (`scheduler.async_scheduling`), the order of LLMEngine._step_async: schedule, then
    the last plan's update_from_output, then the new plan's rows whose sequence is still unfinished
    run and sample, their tokens in flight until the next step."""
    from blockviz.model.reducer import ReducerState
    from reducer_checks import check_reducer_matches_v1
    from engine.vllm_core.scheduler import VllmScheduler
    from tests.test_vllm_core import check_reducer_matches_vllm

    emitted: list = []
    events.subscribe(emitted.append)
    reducer = ReducerState(w.block_size, w.num_gpu_blocks, 0, "v1")
    events.subscribe(reducer.apply)
    seq_ids = itertools.count()
    groups: dict[int, SequenceGroup] = {}
    last_arrival = max(r.arrival for r in w.requests)
    records: list[dict] = []
    in_flight = None  # under async scheduling: the last plan and its sampled tokens
    for step in range(MAX_STEPS):
        del emitted[:]
        for index, r in enumerate(w.requests):
            if r.arrival == step:
                seqs = [Sequence(next(seq_ids), list(r.prompt), w.block_size) for _ in range(r.n)]
                params = SamplingParams(max_tokens=r.max_tokens, ignore_eos=True,
                                        stop_token_ids=() if r.stop_token is None else (r.stop_token,))
                groups[index] = SequenceGroup(str(index), seqs, params)
                scheduler.add_seq_group(groups[index])
            group = groups.get(index)
            if r.abort_at == step and group is not None and group.get_unfinished_seqs():
                scheduler.abort_seq_group(group)
        if step > last_arrival and not scheduler.has_unfinished_seqs() and in_flight is None:
            return records
        plan = scheduler.schedule()
        if in_flight is not None:
            scheduler.update_from_output(*in_flight)
            in_flight = None
        plan.scheduled = [s for s in plan.scheduled if not s.seq.is_finished()]  # vLLM discards their rows
        sampling = [s for s in plan.scheduled if s.samples]
        sampled = [[next_token(s.seq.get_token_ids())] if s.samples else [] for s in plan.scheduled]
        if not scheduler.async_scheduling:
            scheduler.update_from_output(plan, sampled)
        elif plan.scheduled:
            in_flight = (plan, sampled)
        elif plan.design_output is not None:  # every row finished: vLLM takes the batch back empty
            scheduler.update_from_output(plan, [])
        if isinstance(scheduler, VllmScheduler):
            check_reducer_matches_vllm(reducer, scheduler)
        else:
            check_reducer_matches_v1(reducer, scheduler.kv_cache_manager)
        records.append({
            "plan": [(s.seq.seq_id, s.num_computed_tokens, s.num_new_tokens, s.block_ids) for s in plan.scheduled],
            "preempted": list(plan.preempted_seq_ids),
            "ignored": [(g.request_id, tuple(q.seq_id for q in seqs), reason) for g, reason, seqs in plan.ignored_seq_groups],
            "events": [{"type": e.type, **{k: v for k, v in msgspec.structs.asdict(e).items() if k != "seq_no"}}
                       for e in emitted],
            "free_queue": free_queue(),
            "chunked": len(sampling) < len(plan.scheduled),  # a prefill chunk short of its end
        })
    raise AssertionError(f"{w} did not finish in {MAX_STEPS} steps")


def first_difference(ours: list[dict], theirs: list[dict]) -> tuple[int, str] | None:
    """(step, what differs) at the first step the runs differ, or None."""
    for step, (a, b) in enumerate(itertools.zip_longest(ours, theirs, fillvalue={})):
        for key in ("plan", "preempted", "ignored", "events", "free_queue"):
            if a.get(key) != b.get(key):
                return step, f"step {step}, {key}:\n  v1   {a.get(key)}\n  vllm {b.get(key)}"
    return None


def first_refusal(*runs: list[dict]) -> int | None:
    """The first step at which either run refused a request (ended it as ignored)."""
    steps = [step for run in runs for step, record in enumerate(run) if record["ignored"]]
    return min(steps) if steps else None


@pytest.mark.parametrize("order", ORDERS)
def test_v1_steps_as_vllm_on_seeded_random_workloads(tiny_gpt2_dir, order):
    """Every step of each workload equal, but for the documented difference: once either side
    refuses a request, the step it does so may differ; such a workload must be equal up to that
    step. At least 300 workloads are equal to the end. Both sides in vLLM 0.33's default order
    (async scheduling) and both in the synchronous one."""
    num_equal, num_steps, refusals = 0, 0, []
    for seed in range(NUM_WORKLOADS):
        w = make_workload(seed)
        ours_bus, theirs_bus = EventBus(), EventBus()
        ours = drive(w, *v1_side(w, ours_bus, ORDERS[order]), ours_bus)
        theirs = drive(w, *vllm_side(w, theirs_bus, tiny_gpt2_dir, ORDERS[order]), theirs_bus)
        num_steps += len(ours)
        step, difference = first_difference(ours, theirs) or (None, None)
        if difference is None:
            num_equal += 1
            continue
        refused = first_refusal(ours, theirs)
        assert refused is not None and refused <= step, f"seed {seed}: {w}\n{difference}"
        refusals.append(seed)
    assert num_equal >= 300 and num_steps > 10 * NUM_WORKLOADS, (num_equal, num_steps, refusals)


def test_none_hash_is_seeded_as_vllm_seeds_it(monkeypatch):
    """engine/v1's NONE_HASH is vLLM 0.33's init_none_hash result: from "vllm-none-hash", or from
    PYTHONHASHSEED when it is set."""
    from vllm.utils.hashing import sha256 as vllm_sha256
    from vllm.v1.core import kv_cache_utils as vllm_utils

    from engine.v1.kv_cache_utils import none_hash, sha256

    monkeypatch.setattr(vllm_utils, "NONE_HASH", None, raising=False)  # vLLM's global as it was, after the test
    for seed in (None, "7"):
        if seed is None:
            monkeypatch.delenv("PYTHONHASHSEED", raising=False)
        else:
            monkeypatch.setenv("PYTHONHASHSEED", seed)
        vllm_utils.init_none_hash(vllm_sha256)
        assert none_hash(sha256) == vllm_utils.NONE_HASH


def test_the_workloads_reach_what_they_are_meant_to(tiny_gpt2_dir):
    """The workloads preempt, hit, evict, chunk, ignore and abort (else the comparison proves little)."""
    seen: set[str] = set()
    for seed in range(60):
        w = make_workload(seed)
        bus = EventBus()
        for record in drive(w, *v1_side(w, bus), bus):
            seen |= {e["type"] for e in record["events"]}
            seen |= {"ignored"} if record["ignored"] else set()
            seen |= {"chunked"} if record["chunked"] else set()
    assert {"preempted", "prefix_cache_hit", "block_evicted", "ignored", "chunked"} <= seen

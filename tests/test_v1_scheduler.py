"""vLLM v1's scheduler (engine/v1/scheduler.py) without a model, after vLLM's
tests/v1/core/test_scheduler.py: one token budget with running requests first and chunked
prefills (test_schedule_partial_requests), recompute preemption of the last running request with
no admissions in that step, a request preempting itself, max_num_seqs, and n > 1 children hitting
the first child's blocks in the same step."""

from __future__ import annotations

from engine.events import EventBus
from engine.scheduler import SchedulerConfig
from engine.sequence import SamplingParams, Sequence, SequenceGroup, SequenceStatus
from engine.v1.invariants import check_kv_cache_invariants
from engine.v1.kv_cache_manager import KVCacheManager
from engine.v1.scheduler import Scheduler

BLOCK = 4


def make(num_blocks: int, budget: int, max_num_seqs: int = 8) -> tuple[Scheduler, list]:
    bus = EventBus()
    events: list = []
    bus.subscribe(events.append)
    manager = KVCacheManager(BLOCK, num_blocks, max_model_len=1000, events=bus)
    return Scheduler(SchedulerConfig(max_num_seqs, budget, 1000), manager), events


def add(scheduler: Scheduler, seq_id: int, tokens, n: int = 1) -> SequenceGroup:
    seqs = [Sequence(seq_id + i, list(tokens), BLOCK) for i in range(n)]
    group = SequenceGroup(f"r{seq_id}", seqs, SamplingParams(n=n))
    scheduler.add_seq_group(group)
    return group


def advance(scheduler: Scheduler, out) -> dict[int, int]:
    """What the engine does after the forward: one update_from_output with each row's sampled
    tokens (a sequence at its end samples token 7). Returns the step's {seq_id: tokens}."""
    scheduler.update_from_output(out, [[7] if s.samples else [] for s in out.scheduled])
    check_kv_cache_invariants(scheduler.kv_cache_manager)
    return dict(out.num_scheduled_tokens)


def test_one_budget_running_first_and_chunked_prefill():
    scheduler, _ = make(num_blocks=64, budget=10)
    for seq_id in (0, 10, 20):
        add(scheduler, seq_id, range(seq_id, seq_id + 8))
    assert advance(scheduler, scheduler.schedule()) == {0: 8, 10: 2}  # the second prompt is a chunk
    assert [s.seq_id for s in scheduler.waiting] == [20]
    out = scheduler.schedule()
    assert out.kind == "mixed"
    assert advance(scheduler, out) == {0: 1, 10: 6, 20: 3}  # decode, rest of the prompt, a new chunk
    assert advance(scheduler, scheduler.schedule()) == {0: 1, 10: 1, 20: 5}


def test_preemption_takes_the_last_running_request_and_admits_nothing_that_step():
    scheduler, events = make(num_blocks=7, budget=64)  # six usable blocks
    for seq_id in (0, 10, 20):
        add(scheduler, seq_id, range(seq_id, seq_id + 8))  # two blocks each: the pool is full
    assert advance(scheduler, scheduler.schedule()) == {0: 8, 10: 8, 20: 8}
    add(scheduler, 30, [1])  # waits
    out = scheduler.schedule()  # the first decode needs a third block for seq 0: seq 20 gives way
    assert out.preempted_seq_ids == [20]
    assert out.num_scheduled_tokens == {0: 1, 10: 1}
    assert [s.seq_id for s in scheduler.waiting] == [20, 30]  # back at the front; 30 not admitted
    (preempted,) = [e for e in events if e.type == "preempted"]
    assert preempted.mode == "recompute" and preempted.seq_ids == (20,) and preempted.num_tokens_lost == 8
    seq20 = scheduler.waiting[0]
    assert seq20.num_computed_tokens == 0 and seq20.status is SequenceStatus.WAITING
    advance(scheduler, out)
    assert not scheduler.kv_cache_manager.has_blocks(seq20)


def test_a_lone_request_that_cannot_grow_preempts_itself():
    scheduler, _ = make(num_blocks=3, budget=64)  # two usable blocks
    add(scheduler, 0, range(8))
    advance(scheduler, scheduler.schedule())
    out = scheduler.schedule()  # the ninth token needs a third block
    assert out.preempted_seq_ids == [0] and not out.scheduled
    out = scheduler.schedule()  # nine tokens need three blocks, the pool has two: ignored, no loop
    assert [g.request_id for g, _, _ in out.ignored_seq_groups] == ["r0"]
    assert not scheduler.has_unfinished_seqs()


def test_max_num_seqs_limits_admission():
    scheduler, _ = make(num_blocks=64, budget=64, max_num_seqs=2)
    for seq_id in (0, 10, 20):
        add(scheduler, seq_id, range(seq_id, seq_id + 3))
    assert set(advance(scheduler, scheduler.schedule())) == {0, 10}


def test_children_of_n_hit_the_first_childs_blocks_in_the_same_step():
    scheduler, events = make(num_blocks=64, budget=64)
    add(scheduler, 0, range(9), n=3)
    out = scheduler.schedule()
    assert out.num_scheduled_tokens == {0: 9, 1: 1, 2: 1}  # two full blocks cached by the first
    hits = [(e.seq_ids, e.block) for e in events if e.type == "prefix_cache_hit"]
    assert hits == [((1,), 1), ((1,), 2), ((2,), 1), ((2,), 2)]
    assert scheduler.kv_cache_manager.get_num_common_prefix_blocks(out.scheduled[0].seq, 3) == 2

"""The reasons a request is refused for good (finished as ignored) are one set of words across
designs (engine/scheduler_output.py NEVER_ADMITTED and pool_too_small_reason): v0's scheduler
(engine/scheduler.py) and v1's (engine/v1/scheduler.py) driven without a model."""

from __future__ import annotations

from engine.block_manager import BlockSpaceManager
from engine.events import EventBus
from engine.scheduler import Scheduler as V0Scheduler
from engine.scheduler import SchedulerConfig
from engine.scheduler_output import NEVER_ADMITTED, pool_too_small_reason
from engine.sequence import SamplingParams, Sequence, SequenceGroup
from engine.v1.kv_cache_manager import KVCacheManager
from engine.v1.scheduler import Scheduler as V1Scheduler

BLOCK = 4


def refuse(scheduler, num_tokens: int, n: int = 1) -> str:
    """Add one request of `num_tokens` tokens and return the reason its first schedule ignores it with."""
    scheduler.add_seq_group(SequenceGroup("r0", [Sequence(0, list(range(num_tokens)), BLOCK)], SamplingParams(n=n)))
    (ignored,) = scheduler.schedule().ignored_seq_groups
    group, reason, seqs = ignored
    assert group.request_id == "r0" and [s.seq_id for s in seqs] == [0]
    return reason


def test_a_request_larger_than_the_pool_is_refused_in_the_same_words_by_v0_and_v1():
    v0 = V0Scheduler(SchedulerConfig(8, 64, 1000), BlockSpaceManager(BLOCK, 3, 0, watermark=0.0, events=EventBus()))
    v1 = V1Scheduler(SchedulerConfig(8, 64, 1000), KVCacheManager(BLOCK, 4, max_model_len=1000, events=EventBus()))
    assert refuse(v0, 17) == "needs 5 blocks but the pool has 3 (watermark 0)"
    assert refuse(v1, 17) == "needs 5 blocks for 17 tokens but the pool has 3 (block 0 is the null block)"


def test_pool_too_small_reason_names_each_groups_count():
    assert pool_too_small_reason([3, 4], 6, "block 0 is the null block", num_tokens=12) == (
        "needs 7 blocks for 12 tokens (3 + 4 in its 2 KV-cache groups) but the pool has 6 (block 0 is the null block)")


def test_a_head_of_line_that_waits_forever_is_refused_as_never_admitted_by_v0():
    """Three sequences (n=3) under max_num_seqs 2: nothing runs and the request still cannot be
    admitted, so v0 ends it with NEVER_ADMITTED and the figures that keep it out."""
    scheduler = V0Scheduler(SchedulerConfig(2, 64, 1000), BlockSpaceManager(BLOCK, 8, 0, watermark=0.0, events=EventBus()))
    reason = refuse(scheduler, 9, n=3)
    assert reason == f"{NEVER_ADMITTED}: needs 3 blocks, 3 sequences (max_num_seqs 2), the pool has 8 blocks with a watermark of 0"

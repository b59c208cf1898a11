"""The v1 scheduler: one token budget per step, no prefill or decode phases (vLLM v1
`vllm/v1/core/sched/scheduler.py` `Scheduler.schedule`, FCFS).

Each request is one `Sequence`; a request with n > 1 is n sequences queued together, sharing the
prompt through the prefix cache. A step gives each request `num_scheduled_tokens`: running
requests first, in order, each the tokens it has not computed yet (one for a decode) cut to what
is left of the budget, so a long prompt is prefilled in chunks. When `allocate_slots` cannot give
a running request its slots, the last running request is preempted by recompute (its blocks freed,
back to the front of the waiting queue; the prefix cache usually serves most of it again), until
the request fits or preempts itself. Waiting requests are admitted, with their prefix-cache hits,
only when nothing was preempted in the step.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field

from engine.events import Preempted
from engine.scheduler import SchedulerConfig
from engine.sequence import Sequence, SequenceGroup, SequenceStatus
from engine.v1.kv_cache_manager import KVCacheManager, cdiv


@dataclass(slots=True)
class SchedulerOutput:
    """One step's plan (vLLM v1 SchedulerOutput): the requests scheduled, in order, and the tokens
    each computes. The fields the engine reads from v0's SchedulerOutputs are here too (no swaps or
    copies: v1 has neither)."""

    scheduled: list[tuple[SequenceGroup, Sequence]] = field(default_factory=list)
    num_scheduled_tokens: dict[int, int] = field(default_factory=dict)  # seq_id -> tokens this step
    preempted: list[Sequence] = field(default_factory=list)
    ignored_seq_groups: list[tuple[SequenceGroup, str, list[Sequence]]] = field(default_factory=list)
    blocks_to_swap_in: list[tuple[int, int]] = field(default_factory=list)
    blocks_to_swap_out: list[tuple[int, int]] = field(default_factory=list)
    blocks_to_copy: list[tuple[int, int]] = field(default_factory=list)

    @property
    def scheduled_seq_groups(self) -> list[SequenceGroup]:
        groups: list[SequenceGroup] = []
        for group, _ in self.scheduled:
            if not any(g is group for g in groups):
                groups.append(group)
        return groups

    def scheduled_seqs(self) -> list[tuple[SequenceGroup, Sequence]]:
        return self.scheduled

    @property
    def num_batched_tokens(self) -> int:
        return sum(self.num_scheduled_tokens.values())

    @property
    def num_preempted(self) -> int:
        return len(self.preempted)

    def is_chunk(self, seq: Sequence) -> bool:
        """Whether the sequence's tokens this step stop short of its end (a prefill chunk)."""
        return seq.num_computed_tokens + self.num_scheduled_tokens[seq.seq_id] < seq.get_len()

    @property
    def is_prefill(self) -> bool:
        return bool(self.scheduled) and all(n > 1 or self.is_chunk(s) for s, n in self._counts())

    @property
    def kind(self) -> str:
        """"prefill", "decode", or "mixed" (v1 batches both in one step)."""
        counts = list(self._counts())
        decodes = sum(1 for seq, n in counts if n == 1 and seq.num_computed_tokens == seq.get_len() - 1)
        return "decode" if decodes == len(counts) else "prefill" if decodes == 0 else "mixed"

    def _counts(self):
        return ((seq, self.num_scheduled_tokens[seq.seq_id]) for _, seq in self.scheduled)


class Scheduler:
    """FCFS over a waiting deque and a running list of sequences (vLLM v1 Scheduler)."""

    def __init__(self, config: SchedulerConfig, kv_cache_manager: KVCacheManager) -> None:
        self.config = config
        self.kv_cache_manager = kv_cache_manager
        self.block_manager = kv_cache_manager  # the name the engine uses for either design
        self.events = kv_cache_manager.events
        self.waiting: deque[Sequence] = deque()
        self.running: list[Sequence] = []
        self.groups: dict[int, SequenceGroup] = {}  # seq_id -> its request

    # ------------------------------------------------------------------ queues

    def add_seq_group(self, seq_group: SequenceGroup) -> None:
        """Queue each of the request's sequences (vLLM v1 add_request, one per child of n > 1)."""
        for seq in seq_group.get_seqs(SequenceStatus.WAITING):
            self.groups[seq.seq_id] = seq_group
            self.waiting.append(seq)

    def has_unfinished_seqs(self) -> bool:
        return bool(self.waiting or self.running)

    def get_num_unfinished_seq_groups(self) -> int:
        return len({id(self.groups[s.seq_id]) for s in (*self.waiting, *self.running)})

    def abort_seq_group(self, group: SequenceGroup) -> list[Sequence]:
        """Take the request's sequences out of the queues, free their blocks, finish the
        unfinished ones as aborted; returns those (vLLM finish_requests)."""
        aborted = group.get_unfinished_seqs()
        for seq in group.get_seqs():
            self._forget(seq)
        for seq in aborted:
            seq.status = SequenceStatus.FINISHED_ABORTED
        return aborted

    def _forget(self, seq: Sequence) -> None:
        if seq in self.waiting:
            self.waiting.remove(seq)
        if seq in self.running:
            self.running.remove(seq)
        if self.kv_cache_manager.has_blocks(seq):
            self.kv_cache_manager.free(seq)
        self.groups.pop(seq.seq_id, None)

    def free_finished_seq_groups(self) -> None:
        """Drop finished sequences from the running list (their blocks were freed as they ended)."""
        for seq in [s for s in self.running if s.is_finished()]:
            self.running.remove(seq)
            self.groups.pop(seq.seq_id, None)

    def preempt(self, request_id: str, mode=None) -> list[tuple[int, int]]:
        raise ValueError("vLLM v1 preempts by recompute only, when a step runs out of blocks; "
                         "there is no swap to ask for")

    # ------------------------------------------------------------------ scheduling

    def schedule(self) -> SchedulerOutput:
        """Running requests first, then waiting ones, within one token budget (vLLM v1 schedule)."""
        out = SchedulerOutput()
        token_budget = self.config.max_num_batched_tokens
        index = 0
        while index < len(self.running) and token_budget > 0:
            seq = self.running[index]
            num_new_tokens = min(seq.get_len() - seq.num_computed_tokens, token_budget)
            if not self._allocate_or_preempt(seq, num_new_tokens, out):
                break
            self._schedule(seq, num_new_tokens, out)
            token_budget -= num_new_tokens
            index += 1
        if not out.preempted:
            token_budget = self._admit_waiting(token_budget, out)
        if not out.scheduled and not out.preempted and self.waiting:
            self._ignore_stuck_head(out)
        return out

    def _allocate_or_preempt(self, seq: Sequence, num_new_tokens: int, out: SchedulerOutput) -> bool:
        """allocate_slots for a running request, preempting the last running request until it
        fits; False when the request preempted itself."""
        while self.kv_cache_manager.allocate_slots(seq, num_new_tokens) is None:
            victim = self.running.pop()
            self._preempt(victim, out)
            if victim is seq:
                return False
        return True

    def _admit_waiting(self, token_budget: int, out: SchedulerOutput) -> int:
        manager = self.kv_cache_manager
        while self.waiting and token_budget > 0 and len(self.running) < self.config.max_num_seqs:
            seq = self.waiting[0]
            needed = cdiv(seq.get_len(), manager.block_size)
            if needed > manager.num_usable_blocks or seq.get_len() > self.config.max_model_len:
                self._ignore(seq, f"needs {needed} blocks for {seq.get_len()} tokens but the pool has "
                                  f"{manager.num_usable_blocks} (block 0 is the null block)", out)
                continue
            computed_blocks, num_computed = manager.get_computed_blocks(seq)
            num_new_tokens = min(seq.get_len() - num_computed, token_budget)
            if manager.allocate_slots(seq, num_new_tokens, num_computed, computed_blocks) is None:
                break
            self.waiting.popleft()
            self.running.append(seq)
            seq.status = SequenceStatus.RUNNING
            seq.num_computed_tokens = num_computed
            seq.num_cached_tokens = num_computed
            self._schedule(seq, num_new_tokens, out)
            token_budget -= num_new_tokens
        return token_budget

    def _schedule(self, seq: Sequence, num_new_tokens: int, out: SchedulerOutput) -> None:
        out.scheduled.append((self.groups[seq.seq_id], seq))
        out.num_scheduled_tokens[seq.seq_id] = num_new_tokens

    def _preempt(self, seq: Sequence, out: SchedulerOutput) -> None:
        """Recompute preemption (vLLM v1 _preempt_request): free the blocks, back to the front of
        the waiting queue with nothing computed."""
        group = self.groups[seq.seq_id]
        lost = seq.num_computed_tokens
        if self.events.active:  # the cause before its effects (the frees)
            self.events.emit(Preempted, request_id=group.request_id, seq_ids=(seq.seq_id,), mode="recompute",
                             reason="no free block for the next step's tokens", num_tokens_lost=lost)
        self.kv_cache_manager.free(seq)
        seq.reset_for_recompute()
        self.waiting.appendleft(seq)
        out.preempted.append(seq)

    def _ignore(self, seq: Sequence, reason: str, out: SchedulerOutput) -> None:
        """Finish a waiting request that can never run as ignored."""
        self.waiting.remove(seq)
        group = self.groups.pop(seq.seq_id)
        seq.status = SequenceStatus.FINISHED_IGNORED
        out.ignored_seq_groups.append((group, reason, [seq]))

    def _ignore_stuck_head(self, out: SchedulerOutput) -> None:
        """Nothing runs and nothing was admitted: the head of the line waits on a limit that will
        not change (max_num_seqs with nothing running cannot be it), so end it with the reason."""
        if self.running:
            return
        seq = self.waiting[0]
        self._ignore(seq, "cannot be admitted even into an empty pool", out)

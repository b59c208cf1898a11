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

A step's tokens count as computed as soon as they are scheduled (vLLM v1
`Scheduler._update_after_schedule`), so the next step may be scheduled before this one's output is
processed: vLLM 0.33's default, asynchronous order (`AsyncScheduler`, `async_scheduling=True`),
which the engine runs as vLLM's batch queue does (engine/llm_engine.py `_step_async`). A step that
samples leaves an output placeholder on its request (`num_output_placeholders`): the next
schedule gives that token in flight its slot, and the step after caches its block. A request that
stops with a token in flight has been scheduled once more; its slot is freed with it. A request
preempted with a step in flight takes that step's token as stale output (`num_stale_output_tokens`):
appended, its counts left as the preemption reset them. Driven in the synchronous order (each
output processed before the next schedule) the same code is vLLM's plain `Scheduler`.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field

from engine.events import Preempted
from engine.output_processor import OutputProcessor, StopChecker
from engine.scheduler import SchedulerConfig
from engine.scheduler_output import NEVER_ADMITTED, ScheduledSequence, SchedulerOutput, step_kind
from engine.sequence import Sequence, SequenceGroup, SequenceStatus
from engine.v1.kv_cache_manager import KVCacheManager, too_big_reason


@dataclass(slots=True)
class _Scheduling:
    """What one schedule() call decided so far: the sequences with their token counts, in order,
    and the preempted ones; turned into the step plan (SchedulerOutput) at the end."""

    scheduled: list[tuple[SequenceGroup, Sequence, int]] = field(default_factory=list)
    preempted: list[Sequence] = field(default_factory=list)
    ignored_seq_groups: list[tuple[SequenceGroup, str, list[Sequence]]] = field(default_factory=list)


class Scheduler:
    """FCFS over a waiting deque and a running list of sequences (vLLM v1 Scheduler)."""

    def __init__(self, config: SchedulerConfig, kv_cache_manager: KVCacheManager,
                 scheduler_reserve_full_isl: bool = True, output_processor: OutputProcessor | None = None,
                 async_scheduling: bool = True) -> None:
        """`output_processor`: what the sampled tokens do (the engine's); None: stop at max_tokens or
        the model's context, no text. `async_scheduling`: the next step may be scheduled while
        this one's sampled tokens are in flight, each held by an output placeholder (vLLM 0.33's
        default, VllmConfig's async_scheduling: its AsyncScheduler); False: vLLM's plain
        Scheduler, each step's output processed before the next is scheduled."""
        self.config = config
        self.async_scheduling = async_scheduling
        # admit a waiting request only when its whole sequence fits, not just its first chunk
        # (vLLM 0.33's default gate, SchedulerConfig.scheduler_reserve_full_isl)
        self.scheduler_reserve_full_isl = scheduler_reserve_full_isl
        self.kv_cache_manager = kv_cache_manager
        self.events = kv_cache_manager.events
        self.waiting: deque[Sequence] = deque()
        self.running: list[Sequence] = []
        self.groups: dict[int, SequenceGroup] = {}  # seq_id -> its request
        self.output_processor = output_processor or OutputProcessor(StopChecker(None, config.max_model_len),
                                                                    events=self.events)

    # ------------------------------------------------------------------ queues

    def add_seq_group(self, seq_group: SequenceGroup) -> None:
        """Queue each of the request's sequences (vLLM v1 add_request, one per child of n > 1)."""
        for seq in seq_group.get_seqs(SequenceStatus.WAITING):
            self.groups[seq.seq_id] = seq_group
            self.waiting.append(seq)

    def has_unfinished_seqs(self) -> bool:
        return bool(self.waiting or self.running)

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

    def update_from_output(self, plan: SchedulerOutput, sampled_token_ids: list[list[int]]) -> list[SequenceGroup]:
        """The step ran and sampled (vLLM v1 Scheduler.update_from_output): each scheduled sequence's
        tokens are no longer in flight; each sampled token takes the slots given to it while it
        was in flight (KVCacheManager.fill_slots), is appended and stop-checked
        (OutputProcessor.process_outputs, vLLM's _update_request_with_output), and a finished
        sequence's blocks go back to the pool as it leaves the queues (vLLM v1 _free_request).
        Then each request still running that had a token in flight caches the blocks its
        processed tokens fill (vLLM's cache_blocks after _update_request_with_output). A row whose
        sequence finished since the plan was made (aborted, or stopped by the last update) is
        discarded; a preempted sequence's token is stale output: appended, its counts left as the
        preemption reset them. Returns the requests that finished."""
        manager = self.kv_cache_manager
        live_rows: list[ScheduledSequence] = []
        live_token_ids: list[list[int]] = []
        to_cache: list[Sequence] = []
        for s, token_ids in zip(plan.scheduled, sampled_token_ids):
            seq = s.seq
            if seq.is_finished():
                continue
            live_rows.append(s)
            live_token_ids.append(token_ids)
            seq.num_in_flight_tokens -= s.num_new_tokens
            stale = seq.num_stale_output_tokens > 0
            if stale:  # drained in lockstep, as vLLM does
                seq.num_stale_output_tokens -= s.num_new_tokens
            if not token_ids:
                continue
            manager.fill_slots(seq, seq.get_len(), token_ids[0])
            if not stale and seq.num_output_placeholders > 0:
                if seq.status is SequenceStatus.RUNNING:
                    to_cache.append(seq)
                seq.num_output_placeholders -= len(token_ids)
        live = plan if len(live_rows) == len(plan.scheduled) else SchedulerOutput(live_rows, plan.kind)
        finished = self.output_processor.process_outputs(live, live_token_ids, self._finish_stopped)
        for seq in to_cache:
            if not seq.is_finished():
                manager.cache_blocks(seq, seq.num_computed_tokens - seq.num_in_flight_tokens)
        return finished

    def _finish_stopped(self, seq: Sequence) -> None:
        """The stop check ended the sequence: its blocks go back to the pool and it leaves the
        queues (vLLM v1 _free_request; a preempted one holds no blocks)."""
        self._forget(seq)

    # ------------------------------------------------------------------ scheduling

    def schedule(self) -> SchedulerOutput:
        """Running requests first, then waiting ones, within one token budget (vLLM v1 schedule).
        Returns the step plan: each scheduled sequence's tokens and block table."""
        out = _Scheduling()
        token_budget = self.config.max_num_batched_tokens
        index = 0
        while index < len(self.running) and token_budget > 0:
            seq = self.running[index]
            # the tokens not yet scheduled, a token in flight counted by its placeholder, within the
            # model's context (vLLM: max_model_len - num_computed_tokens - 1, the token it samples)
            num_new_tokens = min(seq.get_len() + seq.num_output_placeholders - seq.num_computed_tokens, token_budget,
                                 self.config.max_model_len - seq.num_computed_tokens - 1)
            if num_new_tokens <= 0:  # its token in flight reaches the model's context: it stops there
                index += 1
                continue
            if not self._allocate_or_preempt(seq, num_new_tokens, out):
                break
            self._schedule(seq, num_new_tokens, out)
            token_budget -= num_new_tokens
            index += 1
        if not out.preempted:
            token_budget = self._admit_waiting(token_budget, out)
        if not out.scheduled and not out.preempted and self.waiting:
            self._ignore_stuck_head(out)
        plan = self._plan(out)
        self._update_after_schedule(out)
        return plan

    def _update_after_schedule(self, out: _Scheduling) -> None:
        """Each scheduled sequence's tokens count as computed now, in flight until its output is
        processed (vLLM v1 Scheduler._update_after_schedule); under async scheduling a step that
        reaches the sequence's end leaves a placeholder for the token it samples (vLLM
        AsyncScheduler._update_after_schedule)."""
        for _, seq, num_new_tokens in out.scheduled:
            seq.num_computed_tokens += num_new_tokens
            seq.num_in_flight_tokens += num_new_tokens
            if self.async_scheduling and seq.num_computed_tokens >= seq.get_len() + seq.num_output_placeholders:
                seq.num_output_placeholders += 1

    def _plan(self, out: _Scheduling) -> SchedulerOutput:
        """The step plan, with each sequence's block ids in every KV-cache group as allocate_slots
        left them (vLLM v1 SchedulerOutput: num_scheduled_tokens and the requests' block ids)."""
        manager = self.kv_cache_manager
        scheduled = [ScheduledSequence(group, seq, seq.num_computed_tokens, n,
                                       tuple(map(tuple, manager.get_block_ids_per_group(seq))))
                     for group, seq, n in out.scheduled]
        return SchedulerOutput(scheduled, step_kind(scheduled), announces_tokens=True, preempted_seq_ids=[seq.seq_id for seq in out.preempted],
                               ignored_seq_groups=out.ignored_seq_groups)

    def _allocate_or_preempt(self, seq: Sequence, num_new_tokens: int, out: _Scheduling) -> bool:
        """allocate_slots for a running request, preempting the last running request until it
        fits; False when the request preempted itself."""
        while self.kv_cache_manager.allocate_slots(seq, num_new_tokens) is None:
            victim = self.running.pop()
            self._preempt(victim, out)
            if victim is seq:
                return False
        return True

    def _admit_waiting(self, token_budget: int, out: _Scheduling) -> int:
        manager = self.kv_cache_manager
        while self.waiting and token_budget > 0 and len(self.running) < self.config.max_num_seqs:
            seq = self.waiting[0]
            needed = manager.get_num_blocks_needed(seq.get_len(), self.scheduler_reserve_full_isl)
            if sum(needed) > manager.num_usable_blocks or seq.get_len() > self.config.max_model_len:
                self._ignore(seq, too_big_reason(needed, seq.get_len(), manager.num_usable_blocks), out)
                continue
            computed_blocks, num_computed = manager.get_computed_blocks(seq)
            num_new_tokens = min(seq.get_len() - num_computed, token_budget)
            if manager.allocate_slots(seq, num_new_tokens, num_computed, computed_blocks,
                                      full_sequence_must_fit=self.scheduler_reserve_full_isl,
                                      apply_watermark=bool(self.running)) is None:
                break
            self.waiting.popleft()
            self.running.append(seq)
            seq.status = SequenceStatus.RUNNING
            seq.num_computed_tokens = num_computed
            seq.num_cached_tokens = num_computed
            self._schedule(seq, num_new_tokens, out)
            token_budget -= num_new_tokens
        return token_budget

    def _schedule(self, seq: Sequence, num_new_tokens: int, out: _Scheduling) -> None:
        out.scheduled.append((self.groups[seq.seq_id], seq, num_new_tokens))

    def _preempt(self, seq: Sequence, out: _Scheduling) -> None:
        """Recompute preemption (vLLM v1 _preempt_request): free the blocks, back to the front of
        the waiting queue with nothing computed."""
        group = self.groups[seq.seq_id]
        lost = seq.num_computed_tokens
        if self.events.active:  # the cause before its effects (the frees)
            self.events.emit(Preempted, request_id=group.request_id, seq_ids=(seq.seq_id,), mode="recompute",
                             reason="no free block for the next step's tokens", num_tokens_lost=lost)
        self.kv_cache_manager.free(seq)
        seq.reset_for_recompute()
        # the output of a step in flight comes back stale: appended, these counts left as they are
        seq.num_stale_output_tokens = seq.num_in_flight_tokens
        seq.num_output_placeholders = 0
        self.waiting.appendleft(seq)
        out.preempted.append(seq)

    def _ignore(self, seq: Sequence, reason: str, out: _Scheduling) -> None:
        """Finish a waiting request that can never run as ignored."""
        self.waiting.remove(seq)
        group = self.groups.pop(seq.seq_id)
        seq.status = SequenceStatus.FINISHED_IGNORED
        out.ignored_seq_groups.append((group, reason, [seq]))

    def _ignore_stuck_head(self, out: _Scheduling) -> None:
        """Nothing runs and nothing was admitted: the head of the line waits on a limit that will
        not change (max_num_seqs with nothing running cannot be it), so end it with the reason."""
        if self.running:
            return
        seq = self.waiting[0]
        self._ignore(seq, NEVER_ADMITTED, out)

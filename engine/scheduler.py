"""The scheduler: which sequences run this step (vLLM v0 `vllm/core/scheduler.py`).

Three queues, first come first served. A step is either all prefill (admitting waiting requests) or
all decode (running requests, plus swapped ones brought back when there is room), as in vLLM v0's
`Scheduler._schedule_default`. When a decode cannot get a slot, the newest running request is
preempted: swapped out if it runs several sequences, recomputed if it runs one (vLLM's default),
or as `preemption_mode` says.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass

from engine.block_manager import AllocStatus, BlockSpaceManager
from engine.config import PreemptionMode
from engine.events import Preempted
from engine.output_processor import OutputProcessor, StopChecker
from engine.scheduler_output import NEVER_ADMITTED, SchedulerOutput, plan_entry, pool_too_small_reason
from engine.sequence import Sequence, SequenceGroup, SequenceStatus


@dataclass(slots=True)
class SchedulerConfig:
    """Batch limits; `max_model_len` is the model's context (n_positions)."""

    max_num_seqs: int = 64
    max_num_batched_tokens: int = 4096
    max_model_len: int = 1024
    preemption_mode: PreemptionMode | None = None  # None: vLLM's rule

    def __post_init__(self) -> None:
        if self.max_num_seqs < 1:
            raise ValueError(f"max_num_seqs must be >= 1, got {self.max_num_seqs}")
        if self.max_num_batched_tokens < 1:
            raise ValueError(f"max_num_batched_tokens must be >= 1, got {self.max_num_batched_tokens}")
        if self.preemption_mode is not None:
            self.preemption_mode = PreemptionMode(self.preemption_mode)


class Scheduler:
    """FCFS scheduling over waiting / running / swapped queues (vLLM v0 Scheduler)."""

    def __init__(self, config: SchedulerConfig, block_manager: BlockSpaceManager,
                 output_processor: OutputProcessor | None = None) -> None:
        """`output_processor`: what the sampled tokens do (the engine's: its stop rules, tokenizer and
        seq ids); None: stop at max_tokens or the model's context, no text."""
        self.config = config
        self.block_manager = block_manager
        self.events = block_manager.events
        self.output_processor = output_processor or OutputProcessor(StopChecker(None, config.max_model_len),
                                                                    events=self.events)
        self.waiting: deque[SequenceGroup] = deque()
        self.running: deque[SequenceGroup] = deque()
        self.swapped: deque[SequenceGroup] = deque()

    # ------------------------------------------------------------------ queues

    def add_seq_group(self, seq_group: SequenceGroup) -> None:
        self.waiting.append(seq_group)

    def has_unfinished_seqs(self) -> bool:
        return bool(self.waiting or self.running or self.swapped)

    def abort_seq_group(self, group: SequenceGroup) -> list[Sequence]:
        """Take the request out of every queue, free its blocks and finish its unfinished
        sequences as aborted; returns those sequences. Safe on a request left half-scheduled by a
        failed step (vLLM's abort_seq_group)."""
        for queue in (self.waiting, self.running, self.swapped):
            if group in queue:
                queue.remove(group)
        aborted = group.get_unfinished_seqs()
        for seq in group.get_seqs():
            if seq.seq_id in self.block_manager.block_tables:
                self.block_manager.free(seq)
        for seq in aborted:
            seq.status = SequenceStatus.FINISHED_ABORTED
        return aborted

    def fork_seq(self, parent_seq: Sequence, child_seq: Sequence) -> None:
        """The child shares every block of the parent (vLLM v0 Scheduler.fork_seq)."""
        self.block_manager.fork(parent_seq, child_seq)

    def update_from_output(self, plan: SchedulerOutput, sampled_token_ids: list[list[int]]) -> list[SequenceGroup]:
        """The step ran and sampled (vLLM v1 Scheduler.update_from_output; vLLM v0's
        _process_model_outputs): the scheduled sequences' K/V are in their blocks, which may now
        serve prefix-cache hits (mark_blocks_as_computed), and their tokens are computed; then the
        sampled tokens per plan row, a request with n > 1 forking its branches after its prompt
        (OutputProcessor.process_outputs), a finished sequence's blocks freed (vLLM v0
        Scheduler.free_seq) and finished requests dropped from the running queue
        (free_finished_seq_groups). Returns the requests that finished."""
        for s in plan.scheduled:
            self.block_manager.mark_blocks_as_computed(s.seq)
            s.seq.num_computed_tokens = s.num_tokens
        finished = self.output_processor.process_outputs(plan, sampled_token_ids, self.block_manager.free,
                                                         self.fork_seq)
        if finished:  # a running request finishes only here (an abort takes it out of the queues)
            self.running = deque(group for group in self.running if not group.is_finished())
        return finished

    # ------------------------------------------------------------------ scheduling

    def _num_running_seqs(self) -> int:
        return sum(group.get_max_num_running_seqs() for group in self.running)

    def schedule(self) -> SchedulerOutput:
        """Admit prompts if nothing is swapped out and some fit; otherwise run a decode step.

        A request that can never run is finished as ignored with its reason; when nothing can run
        and nothing runs (no block will ever be freed), the request at the head of the line is
        ignored too, so the engine always makes progress and never loops on an empty step."""
        outputs = SchedulerOutput()
        if not self.swapped:
            scheduled = self._schedule_prefills(outputs.ignored_seq_groups)
            if scheduled:
                return self._plan(scheduled, outputs, is_prefill=True)
        self._schedule_decodes(outputs)
        if not self.running and not outputs.preempted_seq_ids and not outputs.ignored_seq_groups:
            self._ignore_stuck_head(outputs.ignored_seq_groups)
        return self._plan(list(self.running), outputs, is_prefill=False)

    def _plan(self, groups: list[SequenceGroup], outputs: SchedulerOutput, is_prefill: bool) -> SchedulerOutput:
        """The step plan over the groups' running sequences (vLLM v0 SequenceGroupMetadata):
        a prefill computes what the prefix cache did not serve (at least the last prompt token),
        a decode the newest token (token_chunk_size 1); each with its block table as it stands
        after this step's allocations and copy-on-writes."""
        outputs.kind = "prefill" if is_prefill else "decode"
        tables = self.block_manager.block_tables
        for group in groups:
            for seq in group.get_seqs(SequenceStatus.RUNNING):
                num_tokens = seq.get_len()
                start = min(seq.num_cached_tokens, num_tokens - 1) if is_prefill else num_tokens - 1
                table = [block.block_number for block in tables[seq.seq_id]]
                outputs.scheduled.append(plan_entry(group, seq, start, num_tokens - start, table))
        return outputs

    def _ignore_stuck_head(self, ignored: list) -> None:
        """Nothing is running, so every GPU block is free or cached: whatever waits now waits
        forever (the watermark, a batch limit). End the first such request with the reason."""
        manager = self.block_manager
        if self.swapped:
            group = self.swapped[0]
            seqs = group.get_seqs(SequenceStatus.SWAPPED)
            blocks = manager.num_blocks_to_swap_in(group) + len(seqs)
            reason = (f"cannot swap back in: needs {blocks} free blocks with the watermark of "
                      f"{manager.watermark_blocks} kept, and the pool has {manager.num_total_gpu_blocks}")
            self._ignore(group, reason, ignored, self.swapped)
        elif self.waiting:
            group = self.waiting[0]
            blocks = sum(seq.num_logical_blocks for seq in group.get_seqs(SequenceStatus.WAITING))
            reason = (f"{NEVER_ADMITTED}: needs {blocks} blocks, "
                      f"{group.get_max_num_running_seqs()} sequences (max_num_seqs "
                      f"{self.config.max_num_seqs}), the pool has {manager.num_total_gpu_blocks} "
                      f"blocks with a watermark of {manager.watermark_blocks}")
            self._ignore(group, reason, ignored)

    def _schedule_prefills(self, ignored: list) -> list[SequenceGroup]:
        """Admit waiting requests in order while they fit the pool and the batch limits."""
        scheduled: list[SequenceGroup] = []
        num_batched_tokens = 0
        num_seqs = self._num_running_seqs()
        while self.waiting:
            group = self.waiting[0]
            waiting_seqs = group.get_seqs(SequenceStatus.WAITING)
            num_prompt_tokens = sum(seq.get_len() for seq in waiting_seqs)
            longest = max(seq.get_len() for seq in waiting_seqs)
            if longest > self.config.max_model_len:
                reason = f"{longest} tokens exceed the model's context of {self.config.max_model_len}"
                self._ignore(group, reason, ignored)
                continue
            status = self.block_manager.can_allocate(group)
            if status is AllocStatus.NEVER:
                blocks = sum(seq.num_logical_blocks for seq in waiting_seqs)
                reason = pool_too_small_reason([blocks], self.block_manager.num_total_gpu_blocks,
                                               f"watermark {self.block_manager.watermark_blocks}")
                self._ignore(group, reason, ignored)
                continue
            if status is AllocStatus.LATER:
                break
            if num_prompt_tokens > self.config.max_num_batched_tokens and not scheduled:
                self._ignore(group, f"{num_prompt_tokens} prompt tokens exceed max_num_batched_tokens "
                                    f"{self.config.max_num_batched_tokens}", ignored)
                continue
            if num_batched_tokens + num_prompt_tokens > self.config.max_num_batched_tokens:
                break
            new_seqs = group.get_max_num_running_seqs()
            if num_seqs + new_seqs > self.config.max_num_seqs:
                break
            self.waiting.popleft()
            self.block_manager.allocate(group)
            for seq in waiting_seqs:
                seq.status = SequenceStatus.RUNNING
                num_batched_tokens += seq.get_len() - seq.num_cached_tokens
            self.running.append(group)
            scheduled.append(group)
            num_seqs += new_seqs
        return scheduled

    def _ignore(self, group: SequenceGroup, reason: str, ignored: list, queue: deque | None = None) -> None:
        """Finish the request's unfinished sequences as ignored (a sequence that already finished
        keeps its reason) and free any blocks they hold."""
        (queue if queue is not None else self.waiting).remove(group)
        seqs = group.get_unfinished_seqs()
        for seq in seqs:
            if seq.seq_id in self.block_manager.block_tables:
                self.block_manager.free(seq)
            seq.status = SequenceStatus.FINISHED_IGNORED
        ignored.append((group, reason, seqs))

    def _schedule_decodes(self, outputs: SchedulerOutput) -> None:
        """A slot for each running sequence's next token, preempting the newest requests while
        one does not fit; then swapped requests back in when nothing was preempted."""
        running = self.running
        self.running = deque()
        preempted = False
        while running:
            group = running.popleft()
            while not self.block_manager.can_append_slots(group):
                if running:
                    victim = running.pop()  # the newest request gives way
                    self._preempt(victim, outputs, "no free block for the next decode step")
                    preempted = True
                else:
                    self._preempt(group, outputs, "no free block for its own next token")
                    preempted = True
                    break
            else:
                self._append_slots(group, outputs)
                self.running.append(group)
        if not preempted:
            self._schedule_swap_ins(outputs)

    def _schedule_swap_ins(self, outputs: SchedulerOutput) -> None:
        num_seqs = self._num_running_seqs()
        while self.swapped:
            group = self.swapped[0]
            status = self.block_manager.can_swap_in(group)
            if status is AllocStatus.NEVER:
                blocks = self.block_manager.num_blocks_to_swap_in(group)
                reason = (f"cannot swap back in: {blocks} blocks plus one per sequence to grow "
                          f"exceed the pool of {self.block_manager.num_total_gpu_blocks}")
                self._ignore(group, reason, outputs.ignored_seq_groups, self.swapped)
                continue
            if status is not AllocStatus.OK:
                break
            if num_seqs + group.get_max_num_running_seqs() > self.config.max_num_seqs:
                break
            self.swapped.popleft()
            outputs.blocks_to_swap_in.extend(self.block_manager.swap_in(group))
            for seq in group.get_seqs(SequenceStatus.SWAPPED):
                seq.status = SequenceStatus.RUNNING
            self._append_slots(group, outputs)
            self.running.append(group)
            num_seqs += group.get_max_num_running_seqs()

    def _append_slots(self, group: SequenceGroup, outputs: SchedulerOutput) -> None:
        for seq in group.get_seqs(SequenceStatus.RUNNING):
            outputs.blocks_to_copy.extend(self.block_manager.append_slots(seq))

    # ------------------------------------------------------------------ preemption

    def preemption_mode_for(self, group: SequenceGroup) -> PreemptionMode:
        """vLLM's rule: recompute a lone sequence, swap a group; fall back when the swap pool is full."""
        mode = self.config.preemption_mode
        if mode is None:
            mode = PreemptionMode.RECOMPUTE if group.get_max_num_running_seqs() == 1 else PreemptionMode.SWAP
        if mode is PreemptionMode.SWAP and not self.block_manager.can_swap_out(group):
            mode = PreemptionMode.RECOMPUTE
        return mode

    def _preempt(self, group: SequenceGroup, outputs: SchedulerOutput, reason: str,
                 mode: PreemptionMode | None = None) -> PreemptionMode:
        """vLLM v0 Scheduler._preempt: swap the group out (_preempt_by_swap) or free its blocks to
        compute again (_preempt_by_recompute). `Preempted` is emitted first, the cause before its
        effects: the swap-out and the frees it causes come after it in the event stream."""
        mode = mode or self.preemption_mode_for(group)
        seqs = group.get_seqs(SequenceStatus.RUNNING)
        outputs.preempted_seq_ids.extend(seq.seq_id for seq in seqs)
        lost = 0 if mode is PreemptionMode.SWAP else sum(seq.num_computed_tokens for seq in seqs)
        if self.events.active:
            self.events.emit(Preempted, request_id=group.request_id, seq_ids=tuple(s.seq_id for s in seqs),
                             mode=mode.value, reason=reason, num_tokens_lost=lost)
        if mode is PreemptionMode.SWAP:
            outputs.blocks_to_swap_out.extend(self.block_manager.swap_out(group))
            for seq in seqs:
                seq.status = SequenceStatus.SWAPPED
            self.swapped.append(group)
        else:
            for seq in seqs:
                self.block_manager.free(seq)
                seq.reset_for_recompute()
            self.waiting.appendleft(group)
        return mode

    def preempt(self, request_id: str, mode: PreemptionMode = PreemptionMode.SWAP) -> list[tuple[int, int]]:
        """Preempt a running request now, between steps, as `_preempt` (vLLM v0 Scheduler._preempt)
        does when a step runs out of blocks, but chosen by the user; returns the swap-out pairs."""
        for group in self.running:
            if group.request_id == request_id:
                break
        else:
            raise ValueError(f"request {request_id!r} is not running")
        mode = PreemptionMode(mode)
        if mode is PreemptionMode.SWAP and not self.block_manager.can_swap_out(group):
            raise ValueError(f"the CPU swap pool has no room for request {request_id!r}")
        self.running.remove(group)
        outputs = SchedulerOutput()
        self._preempt(group, outputs, "preempted by the user", mode=mode)
        return outputs.blocks_to_swap_out

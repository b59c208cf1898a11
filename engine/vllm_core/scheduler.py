"""Our scheduler interface over vLLM 0.33's own v1 `Scheduler` (vllm/v1/core/sched/scheduler.py) and
the `KVCacheManager` it builds: the engine's step (engine/llm_engine.py) runs unchanged on vLLM's
decisions.

Each of our sequences is one vLLM `Request` whose id is the seq id as a string (n > 1 fans out into
n sequences, as vLLM's `ParentRequest` does). vLLM's `SchedulerOutput` becomes our step plan: per
request its `num_scheduled_tokens`, the `num_computed_tokens` the runner data carries, and its block
table per KV-cache group kept as vLLM's GPU model runner keeps it (`_update_states`: a new request's
`block_ids`, a running one's `new_block_ids` appended, a resumed one's replacing the table). A block
a sliding window let go keeps its old id there, as in vLLM's runner (vLLM's manager holds the null
block in its place): the attention never reads it.

The plan carries vLLM's SchedulerOutput (`SchedulerOutput.design_output`); the engine hands it back
with the sampled tokens in `update_from_output(plan, sampled_token_ids)`, which appends and
stop-checks them as every design does (engine/output_processor.py), then gives vLLM its own
`update_from_output(out, ModelRunnerOutput)`: each request still running hands back its newest
token, a prefill chunk short of its end none. The stop checks are ours: vLLM's requests ignore EOS
and get a `max_tokens` the model's context reaches first, and a sequence that stops is finished in
vLLM at once (`finish_requests(..., FINISHED_STOPPED)`), so its blocks are freed where our v1 frees
them. Aborts are `finish_requests(..., FINISHED_ABORTED)`, one
request at a time so the frees keep the order our v1 has (vLLM iterates a set of ids).

A recompute preemption (`Scheduler._preempt_request`) is announced (Preempted) before vLLM frees the
blocks, and resets our Sequence; block events come from the tap (engine/vllm_core/event_tap.py).
A request vLLM could never admit, whose tokens need more blocks than the pool has, ends as ignored
with its reason, as engine/v1 refuses it: when added, and when it heads the waiting queue (a
preempted request grown past the pool), before vLLM's schedule() would preempt it forever.

Block hashes are vLLM's, NONE_HASH seeded from engine/v1/kv_cache_utils.resolve_none_hash_seed (vLLM
0.33's own seed, fixed for xxhash too): the same prefix has the same hash in both.
"""

from __future__ import annotations

from typing import Any

from engine.events import EventBus, Preempted
from engine.output_processor import OutputProcessor, StopChecker
from engine.scheduler_output import NEVER_ADMITTED, ScheduledSequence, SchedulerOutput, step_kind
from engine.sequence import Sequence, SequenceGroup, SequenceStatus
from engine.v1.kv_cache_manager import get_num_blocks_needed, too_big_reason
from engine.v1.kv_cache_utils import resolve_none_hash_seed
from engine.vllm_core.event_tap import VllmEventTap
from engine.vllm_core.offload import CpuTier

class VllmScheduler:
    """add_seq_group / schedule / update_from_output / abort_seq_group / has_unfinished_seqs over one
    vLLM Scheduler."""

    def __init__(self, scheduler: Any, events: EventBus, block_hasher, max_model_len: int,
                 output_processor: OutputProcessor | None = None) -> None:
        """`output_processor`: what the sampled tokens do (the engine's); None: stop at max_tokens or
        the model's context, no text."""
        from vllm.sampling_params import SamplingParams as VllmSamplingParams

        self.vllm = scheduler
        # vLLM's order (VllmConfig's async_scheduling): the next step is scheduled before the last
        # one's output is processed, its tokens in flight (vLLM's AsyncScheduler and batch queue)
        self.async_scheduling = bool(scheduler.scheduler_config.async_scheduling)
        self.kv_cache_manager = scheduler.kv_cache_manager
        self.block_pool = self.kv_cache_manager.block_pool
        self.block_size = scheduler.block_size
        self.events = events
        self.tap = VllmEventTap(scheduler, events)
        # vLLM's CPU tier (kv_offloading_size): its scheduler side decides, we copy (offload.py)
        self.cpu_tier = (CpuTier(scheduler, events, self.tap, lambda request_id: self.groups[request_id].request_id)
                         if scheduler.connector is not None else None)
        self.block_hasher = block_hasher
        # our engine stops every request itself: the model's context comes before this
        self.sampling_params = VllmSamplingParams(max_tokens=max_model_len + 1, ignore_eos=True)
        self.seqs: dict[str, Sequence] = {}  # vLLM request id -> our sequence
        self.groups: dict[str, SequenceGroup] = {}  # vLLM request id -> its request
        self.block_ids: dict[str, tuple[list[int], ...]] = {}  # as the GPU model runner keeps them
        self._ignored: list[tuple[SequenceGroup, str, list[Sequence]]] = []  # reported by the next schedule()
        self._preempted: list[int] = []  # seq ids preempted in the schedule() running now, in order
        self.output_processor = output_processor or OutputProcessor(StopChecker(None, max_model_len), events=events)
        original = scheduler._preempt_request
        scheduler._preempt_request = lambda request, *args, **kwargs: self._preempt_request(original, request,
                                                                                             *args, **kwargs)

    @property
    def num_usable_blocks(self) -> int:
        """Blocks a request can ever hold: all but the null block."""
        return self.block_pool.num_gpu_blocks - 1

    # ------------------------------------------------------------------ queues

    def add_seq_group(self, seq_group: SequenceGroup) -> None:
        """One vLLM Request per waiting sequence (vLLM add_request; n > 1 as n requests). One that
        could never fit the pool is ignored now, reported by the next schedule()."""
        from vllm.v1.request import Request

        waiting = seq_group.get_seqs(SequenceStatus.WAITING)
        if waiting and self._too_big(waiting[0].get_len()):  # one entry per sequence, as engine/v1 ignores them
            for seq in waiting:
                seq.status = SequenceStatus.FINISHED_IGNORED
                self._ignored.append((seq_group, self._too_big_reason(seq), [seq]))
            return
        for seq in waiting:
            request_id = str(seq.seq_id)
            self.seqs[request_id] = seq
            self.groups[request_id] = seq_group
            self.vllm.add_request(Request(request_id=request_id, prompt_token_ids=list(seq.get_token_ids()),
                                          sampling_params=self.sampling_params, pooling_params=None,
                                          arrival_time=seq_group.arrival_time, block_hasher=self.block_hasher))

    def _num_blocks_needed(self, num_tokens: int) -> list[int]:
        """Per KV-cache group, the blocks vLLM's managers need at once for `num_tokens` tokens, as
        engine/v1 counts them (kv_cache_manager.get_num_blocks_needed, under vLLM's own gate)."""
        return get_num_blocks_needed(self.vllm.kv_cache_manager.coordinator.single_type_managers, num_tokens,
                                     self.vllm.max_model_len, self.vllm.scheduler_reserve_full_isl)

    def _too_big(self, num_tokens: int) -> bool:
        return sum(self._num_blocks_needed(num_tokens)) > self.num_usable_blocks

    def _too_big_reason(self, seq: Sequence) -> str:
        return too_big_reason(self._num_blocks_needed(seq.get_len()), seq.get_len(), self.num_usable_blocks)

    def has_unfinished_seqs(self) -> bool:
        """Requests to run, or (vLLM's Scheduler.has_requests) stores the CPU tier still has to copy."""
        return (bool(self._ignored) or self.vllm.has_unfinished_requests()
                or (self.cpu_tier is not None and self.cpu_tier.has_pending_stores()))

    def abort_seq_group(self, group: SequenceGroup) -> list[Sequence]:
        """Finish the request's sequences in vLLM as aborted, one at a time (vLLM finish_requests);
        returns the ones that were unfinished."""
        from vllm.v1.request import RequestStatus

        self._ignored = [entry for entry in self._ignored if entry[0] is not group]
        aborted = group.get_unfinished_seqs()
        for seq in group.get_seqs():
            request_id = str(seq.seq_id)
            if request_id in self.seqs:
                self.vllm.finish_requests(request_id, RequestStatus.FINISHED_ABORTED)
                self._forget(request_id)
        for seq in aborted:
            seq.status = SequenceStatus.FINISHED_ABORTED
        return aborted

    def _finish_stopped(self, seq: Sequence) -> None:
        """Our stop check ended the sequence: vLLM finishes the request and frees its blocks now."""
        from vllm.v1.request import RequestStatus

        status = (RequestStatus.FINISHED_LENGTH_CAPPED if seq.status is SequenceStatus.FINISHED_LENGTH_CAPPED
                  else RequestStatus.FINISHED_STOPPED)
        self.vllm.finish_requests(str(seq.seq_id), status)
        self._forget(str(seq.seq_id))

    def _forget(self, request_id: str) -> None:
        self.tap.forget_slots(int(request_id))
        self.seqs.pop(request_id, None)
        self.groups.pop(request_id, None)
        self.block_ids.pop(request_id, None)

    # ------------------------------------------------------------------ the step

    def schedule(self) -> SchedulerOutput:
        """vLLM's schedule(), as our step plan."""
        self._preempted = []
        ignored, self._ignored = self._ignored, []
        while len(self.vllm.waiting) and self._too_big_for_the_pool(self.vllm.waiting.peek_request()):
            ignored.append(self._ignore_head())
        out = self.vllm.schedule()
        stores, loads = CpuTier.moves(out)  # vLLM's CPU tier: loads before the forward, stores after
        if not out.num_scheduled_tokens:
            self._update_vllm(out, {})  # nothing runs: vLLM takes its (empty) output now
            if not self.vllm.running and not self._preempted and not loads and len(self.vllm.waiting):
                ignored.append(self._ignore_head())
            return SchedulerOutput([], "decode", announces_tokens=True, preempted_seq_ids=self._preempted,
                                   ignored_seq_groups=ignored, blocks_to_store=stores, blocks_to_swap_in=loads)
        num_computed = self._update_block_tables(out)
        scheduled: list[ScheduledSequence] = []
        for request_id, num_new_tokens in out.num_scheduled_tokens.items():
            seq = self.seqs[request_id]
            computed = num_computed[request_id]
            if seq.status is SequenceStatus.WAITING:  # admitted now, new or after a preemption
                seq.status = SequenceStatus.RUNNING
                seq.num_cached_tokens = computed
            seq.num_computed_tokens = computed
            table = tuple(tuple(ids) for ids in self.block_ids[request_id])
            scheduled.append(ScheduledSequence(self.groups[request_id], seq, computed, num_new_tokens, table))
        return SchedulerOutput(scheduled, step_kind(scheduled), announces_tokens=True, preempted_seq_ids=self._preempted,
                               ignored_seq_groups=ignored, blocks_to_store=stores, blocks_to_swap_in=loads,
                               design_output=out)

    def _update_block_tables(self, out: Any) -> dict[str, int]:
        """Each scheduled request's block table, updated as vLLM's GPU model runner does from the
        output (new requests' block_ids; running ones' new_block_ids appended; resumed ones'
        replacing), and its num_computed_tokens before the step."""
        num_computed: dict[str, int] = {}
        for data in out.scheduled_new_reqs:
            self.block_ids[data.req_id] = tuple(list(ids) for ids in data.block_ids)
            num_computed[data.req_id] = data.num_computed_tokens
        cached = out.scheduled_cached_reqs
        for index, request_id in enumerate(cached.req_ids):
            new_block_ids = cached.new_block_ids[index]
            if request_id in cached.resumed_req_ids:
                self.block_ids[request_id] = tuple(list(ids) for ids in new_block_ids)
            elif new_block_ids is not None:
                for ids, new_ids in zip(self.block_ids[request_id], new_block_ids):
                    ids.extend(new_ids)
            num_computed[request_id] = cached.num_computed_tokens[index]
        return num_computed

    def update_from_output(self, plan: SchedulerOutput, sampled_token_ids: list[list[int]]) -> list[SequenceGroup]:
        """The step ran and sampled (vLLM v1 Scheduler.update_from_output): each scheduled sequence
        computed its tokens; each sampled token is appended and stop-checked
        (OutputProcessor.process_outputs), a stopped sequence finished in vLLM at once; then vLLM's
        own update_from_output takes the plan's vLLM SchedulerOutput with the newest token of each
        request still running. Returns the requests that finished.

        Under async scheduling the next plan was scheduled first (vLLM EngineCore.step_with_batch_queue):
        a row whose sequence ended since (aborted) takes no token, and a sequence that plan preempted
        keeps its reset count of computed tokens while it takes its token (vLLM delivers a preempted
        request's in-flight output as stale, `num_stale_output_tokens`)."""
        live_rows: list[ScheduledSequence] = []
        live_token_ids: list[list[int]] = []
        fill_slots = self.tap.fill_slots
        for s, token_ids in zip(plan.scheduled, sampled_token_ids):
            seq = s.seq
            if seq.is_finished():
                continue
            live_rows.append(s)
            live_token_ids.append(token_ids)
            if seq.status is SequenceStatus.RUNNING:
                seq.num_computed_tokens = max(seq.num_computed_tokens, s.num_tokens)
            if token_ids:  # the slots allocated for this token while it was in flight
                fill_slots(seq.seq_id, seq.get_len(), token_ids[0])
        live = plan if len(live_rows) == len(plan.scheduled) else SchedulerOutput(live_rows, plan.kind)
        finished = self.output_processor.process_outputs(live, live_token_ids, self._finish_stopped)
        if plan.design_output is None:  # a plan that runs nothing: vLLM took its output in schedule()
            return finished
        self._update_vllm(plan.design_output, {str(s.seq.seq_id): token_ids[:1]
                                               for s, token_ids in zip(plan.scheduled, sampled_token_ids)})
        return finished

    def _update_vllm(self, out: Any, sampled: dict[str, list[int]]) -> None:
        """vLLM's update_from_output over its SchedulerOutput `out`, with `sampled` (request id -> the
        tokens its row sampled); a request our stop check finished is gone from vLLM and hands back
        none."""
        from vllm.v1.outputs import ModelRunnerOutput

        request_ids = list(out.num_scheduled_tokens)
        sampled_token_ids = [sampled.get(request_id, []) if request_id in self.seqs else []
                             for request_id in request_ids]
        self.vllm.update_from_output(out, ModelRunnerOutput(
            req_ids=request_ids, req_id_to_index={r: i for i, r in enumerate(request_ids)},
            sampled_token_ids=sampled_token_ids, logprobs=None, prompt_logprobs_dict={}, pooler_output=[],
            kv_connector_output=CpuTier.connector_output(out)))

    # ------------------------------------------------------------------ preemption and refusal

    def _preempt_request(self, original, request: Any, *args, **kwargs) -> None:
        """vLLM's _preempt_request, announced first (the cause before the frees it makes); our
        Sequence is reset for recompute after it."""
        seq = self.seqs[request.request_id]
        if self.events.active:
            self.events.emit(Preempted, request_id=self.groups[request.request_id].request_id,
                             seq_ids=(seq.seq_id,), mode="recompute",
                             reason="no free block for the next step's tokens",
                             num_tokens_lost=request.num_computed_tokens)
        original(request, *args, **kwargs)
        self.block_ids.pop(request.request_id, None)
        seq.reset_for_recompute()
        self._preempted.append(seq.seq_id)

    def _too_big_for_the_pool(self, request: Any) -> bool:
        return self._too_big(request.num_tokens)

    def _ignore_head(self) -> tuple[SequenceGroup, str, list[Sequence]]:
        """End the head of vLLM's waiting queue as ignored: its tokens (a preempted request's
        outputs too) need more blocks than the pool has, as engine/v1's _admit_waiting refuses at
        the head; or nothing runs, nothing was preempted this step and it was still not admitted
        into an empty pool (engine/v1's _ignore_stuck_head). vLLM itself never meets such a request:
        check_enough_kv_cache_memory refuses a pool smaller than one max_model_len request."""
        from vllm.v1.request import RequestStatus

        request = self.vllm.waiting.peek_request()
        request_id = request.request_id
        seq, group = self.seqs[request_id], self.groups[request_id]
        reason = (self._too_big_reason(seq) if self._too_big_for_the_pool(request)
                  else NEVER_ADMITTED)
        self.vllm.finish_requests(request_id, RequestStatus.FINISHED_IGNORED)
        self._forget(request_id)
        seq.status = SequenceStatus.FINISHED_IGNORED
        return group, reason, [seq]

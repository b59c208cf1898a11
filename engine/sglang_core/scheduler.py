"""Our scheduler interface over SGLang 0.5.23's own radix cache and scheduling policy: the engine's
step (engine/llm_engine.py) runs on SGLang's decisions.

SGLang's objects decide everything about memory and order: `RadixCache` (what is cached, matched,
locked and evicted), `TokenToKVPoolAllocator` / `PagedTokenToKVPoolAllocator` (which KV slots a
token gets), `ReqToTokenPool` (each request's row of slots), `SchedulePolicy.calc_priority` (the
waiting queue's order: lpm, dfs-weight, fcfs, ...), `PrefillAdder` (who is admitted, how far a
prompt is chunked), `ScheduleBatch.prepare_for_extend` / `check_decode_mem` / `retract_decode` /
`prepare_for_decode` (allocation, eviction, retraction), `checkpoint_kv_cache` / `release_kv_cache`
(what enters the tree and when). `schedule()` follows SGLang's `Scheduler.get_next_batch_to_run`
(sglang/srt/managers/scheduler.py) without a model worker: stash the chunked request, merge the
last prefill batch into the running batch, try a new prefill batch (`_get_new_batch_prefill_raw`),
else decode the running batch (`update_running_batch`). SGLang never mixes a prefill and a decode
in one batch unless asked (`enable_mixed_chunk`, not offered here).

A slot is a token's place in our KV pool: page p holds slots p * page_size ... p * page_size +
page_size - 1 and is our block p (page_size is the engine's block_size), so a request's row of
slots is a block table. Page 0 is SGLang's padding page, never handed out (the null block).

Each of our sequences is one SGLang `Req` (n > 1 fans out into n, as SGLang's parallel sampling
does). The sampled tokens are ours: the engine samples, the output processor stop-checks, and a
stopped request is finished in SGLang (`to_finish`) and released with its tokens into the tree, as
SGLang's `process_batch_result_prefill` / `_decode` do.

SGLang reads a process-wide config (`sglang.srt.runtime_context`); each scheduler owns its own
context (`create_context`) and activates it only around its calls into SGLang (`use_context`), so
engines with different options live side by side and nothing process-wide stays changed.
"""

from __future__ import annotations

from array import array
from typing import Any

import torch

from engine.events import EventBus, Preempted
from engine.output_processor import OutputProcessor, StopChecker
from engine.scheduler_output import NEVER_ADMITTED, ScheduledSequence, SchedulerOutput, pool_too_small_reason, step_kind
from engine.sequence import Sequence, SequenceGroup, SequenceStatus
from engine.sglang_core.event_tap import SglangEventTap
from engine.sglang_core.imports import sglang_classes
from engine.sglang_core.options import SglangOptions


class SglangScheduler:
    """add_seq_group / schedule / update_from_output / abort_seq_group / has_unfinished_seqs over
    SGLang's RadixCache, allocator, ReqToTokenPool, SchedulePolicy and PrefillAdder."""

    async_scheduling = False  # SGLang's overlap scheduler needs its worker's futures; not run here

    def __init__(self, options: SglangOptions, num_pages: int, max_num_seqs: int, max_model_len: int,
                 events: EventBus, output_processor: OutputProcessor | None = None, vocab_size: int = 1 << 20) -> None:
        """A pool of `num_pages` pages of `options.page_size` slots (our blocks 1 .. num_pages; block
        0 is SGLang's padding page), rows for `max_num_seqs` requests of up to `max_model_len` tokens."""
        sgl = self.sgl = sglang_classes()
        self.options = options
        self.page_size = options.page_size
        self.num_pages = num_pages
        self.max_model_len = max_model_len
        self.events = events
        self.output_processor = output_processor or OutputProcessor(StopChecker(None, max_model_len), events=events)
        self.context = sgl.create_context(options.server_args(), role="test", ranks=sgl.SpawnRanks(world_rank=0))
        with sgl.use_context(self.context):
            size = num_pages * self.page_size
            self.req_to_token_pool = sgl.ReqToTokenPool(size=max_num_seqs, max_context_len=max_model_len + 4,
                                                        device="cpu", enable_memory_saver=False)
            if self.page_size == 1:
                self.allocator = sgl.TokenToKVPoolAllocator(size, torch.float32, "cpu", kvcache=None, need_sort=False)
            else:
                self.allocator = sgl.PagedTokenToKVPoolAllocator(size, self.page_size, torch.float32, "cpu",
                                                                 kvcache=None, need_sort=False)
            self.tree_cache = sgl.RadixCache(sgl.CacheInitParams(
                disable=False, req_to_token_pool=self.req_to_token_pool, token_to_kv_pool_allocator=self.allocator,
                page_size=self.page_size, enable_kv_cache_events=False, eviction_policy=options.radix_eviction_policy))
            self.policy = sgl.SchedulePolicy(options.schedule_policy, self.tree_cache, False, False, False)
            self.new_token_ratio = sgl.NewTokenRatioTracker.from_config()
            self.running_batch = sgl.ScheduleBatch(reqs=[], batch_is_full=False)
        self.model_config = _ModelConfig(vocab_size)
        self.waiting_queue: list[Any] = []
        self.chunked_req: Any = None
        self.last_batch: Any = None
        self.reqs: dict[int, Any] = {}  # seq id -> its SGLang Req
        self.seqs: dict[str, Sequence] = {}  # Req.rid -> our sequence
        self.groups: dict[str, SequenceGroup] = {}  # Req.rid -> our request
        self._ignored: list[tuple[SequenceGroup, str, list[Sequence]]] = []
        self.kv_cache_manager = self  # what the engine holds as the design's manager
        self.tables: dict[int, tuple[int, ...]] = {}  # seq id -> the pages (our blocks) its row holds
        self.tap = SglangEventTap(self.tree_cache, events, self.page_size)
        self.tree_cache.evict = self._evict  # this cache's own calls, told to the tap (RadixEvict)

    def _evict(self, params: Any) -> Any:
        """SGLang's RadixCache.evict on this engine's tree (its allocator's shortfall in
        `params.num_tokens`, whole leaves freed), what it was asked and freed noted for the tap."""
        result = type(self.tree_cache).evict(self.tree_cache, params)
        self.tap.note_evict(params.num_tokens, result.num_tokens_evicted)
        return result

    # ------------------------------------------------------------------ queues

    def add_seq_group(self, seq_group: SequenceGroup) -> None:
        """One SGLang Req per waiting sequence (SGLang Scheduler.handle_generate_request); one whose
        prompt alone needs more pages than the pool has is ignored, reported by the next schedule()."""
        sgl = self.sgl
        for seq in seq_group.get_seqs(SequenceStatus.WAITING):
            if self._pages_for(seq.get_len()) > self.num_pages:
                seq.status = SequenceStatus.FINISHED_IGNORED
                self._ignored.append((seq_group, self._too_big_reason(seq.get_len()), [seq]))
                continue
            # our stop checks end the request (to_finish); ignore_eos as ours, since SGLang's admission
            # reserves a request's whole max_new_tokens only when it ignores EOS (PrefillAdder)
            params = sgl.SamplingParams(max_new_tokens=seq_group.sampling_params.max_tokens,
                                        ignore_eos=seq_group.sampling_params.ignore_eos)
            with sgl.use_context(self.context):
                params.normalize(None)
                req = sgl.Req(str(seq.seq_id), "", array("q", seq.get_token_ids()), params,
                              vocab_size=self.model_config.vocab_size)
            self.reqs[seq.seq_id] = req
            self.seqs[req.rid] = seq
            self.groups[req.rid] = seq_group
            self.waiting_queue.append(req)

    def _pages_for(self, num_tokens: int) -> int:
        return -(-num_tokens // self.page_size)

    def _too_big_reason(self, num_tokens: int) -> str:
        return pool_too_small_reason([self._pages_for(num_tokens)], self.num_pages,
                                     "page 0 is SGLang's padding page", num_tokens)

    def has_unfinished_seqs(self) -> bool:
        return bool(self._ignored or self.waiting_queue or self.chunked_req is not None
                    or not self.running_batch.is_empty()
                    or (self.last_batch is not None and any(not r.finished() for r in self.last_batch.reqs)))

    def abort_seq_group(self, group: SequenceGroup) -> list[Sequence]:
        """Finish the request's sequences in SGLang as aborted: a waiting one leaves the queue, a
        running one releases its row without publishing it (SGLang abort_request +
        release_kv_cache(checkpoint=False)). Returns the ones that were unfinished."""
        sgl = self.sgl
        self._ignored = [entry for entry in self._ignored if entry[0] is not group]
        aborted = group.get_unfinished_seqs()
        with sgl.use_context(self.context):
            for seq in group.get_seqs():
                req = self.reqs.pop(seq.seq_id, None)
                if req is None:
                    continue
                if req in self.waiting_queue:
                    self.waiting_queue.remove(req)
                elif not req.finished():
                    if req is self.chunked_req:
                        self.chunked_req = None
                    req.to_finish = sgl.FINISH_LENGTH(length=len(req.output_ids))
                    req.update_finish_state()
                    if req.kv.holds_kv:
                        sgl.release_kv_cache(req, self.tree_cache, checkpoint=False)
                self.tables.pop(seq.seq_id, None)
                self._forget(req)
            self._sync()
        for seq in aborted:
            seq.status = SequenceStatus.FINISHED_ABORTED
        return aborted

    def _forget(self, req: Any) -> None:
        self.seqs.pop(req.rid, None)
        self.groups.pop(req.rid, None)

    # ------------------------------------------------------------------ the step

    def schedule(self) -> SchedulerOutput:
        """The next batch, as SGLang's Scheduler.get_next_batch_to_run picks it: a prefill batch
        when the waiting queue admits one, else one decode step of the running batch."""
        ignored, self._ignored = self._ignored, []
        with self.sgl.use_context(self.context):
            self._merge_last_batch()
            batch = self._new_prefill_batch()
            preempted: list[int] = []
            if batch is None:
                batch, preempted = self._decode_batch()
            scheduled = self._plan(batch) if batch is not None and not batch.is_empty() else []
            self._sync({s.seq.seq_id: (s.seq.get_token_ids(), s.num_computed_tokens, s.num_new_tokens)
                        for s in scheduled})
        if not scheduled:
            if not preempted and self.running_batch.is_empty() and self.waiting_queue and self.chunked_req is None:
                ignored.append(self._ignore_head())
            return SchedulerOutput([], "decode", announces_tokens=True, preempted_seq_ids=preempted,
                                   ignored_seq_groups=ignored)
        return SchedulerOutput(scheduled, step_kind(scheduled), announces_tokens=True, preempted_seq_ids=preempted,
                               ignored_seq_groups=ignored, design_output=batch)

    def _merge_last_batch(self) -> None:
        """SGLang get_next_batch_to_run's first half: the chunked request publishes its chunk
        (stash_chunked_request) and stays out; the rest of the last prefill batch joins the running
        batch; finished requests leave it."""
        sgl = self.sgl
        exclude = []
        if self.chunked_req is not None:
            exclude.append(self.chunked_req)
            if self.chunked_req.extend_end > self.chunked_req.prefix_len:
                sgl.checkpoint_kv_cache(self.chunked_req, self.tree_cache)
        last, self.last_batch = self.last_batch, None
        if last is not None and last.forward_mode.is_extend():
            last.filter_batch(reqs_to_exclude=exclude)
            if not last.is_empty():
                if self.running_batch.is_empty():
                    self.running_batch = last
                else:
                    self.running_batch.merge_batch(last)
        size = self.running_batch.batch_size()
        self.running_batch.filter_batch()
        if self.running_batch.batch_size() < size:
            self.running_batch.batch_is_full = False

    def _new_prefill_batch(self) -> Any:
        """SGLang Scheduler._get_new_batch_prefill_raw without a worker: the policy orders the
        waiting queue, a PrefillAdder admits (the chunked request first), and the batch allocates
        its slots (prepare_for_extend, evicting through the tree when the pool is short)."""
        sgl, options = self.sgl, self.options
        running = self.running_batch
        if running.is_empty():
            running.batch_is_full = False
        if (running.batch_is_full or not self.waiting_queue) and self.chunked_req is None:
            return None
        if self.req_to_token_pool.available_size() <= 0 and self.chunked_req is None:
            running.batch_is_full = True
            return None
        self.policy.calc_priority(self.waiting_queue, running)
        adder = sgl.PrefillAdder(self.page_size, self.tree_cache, self.allocator, running,
                                 self.new_token_ratio.current, options.max_prefill_tokens,
                                 options.chunked_prefill_size if options.chunked_prefill_size > 0 else None, 0,
                                 max_running_requests=self.req_to_token_pool.size)
        if self.chunked_req is not None:
            self.chunked_req.init_next_round_input()
            self.chunked_req = adder.add_chunked_req(self.chunked_req)
        for req in self.waiting_queue:
            if adder.budget_state() == sgl.AddReqResult.OTHER:
                break
            held = sum(r.kv.holds_kv for r in adder.can_run_list)
            if len(adder.can_run_list) >= self.req_to_token_pool.available_size() + held:
                running.batch_is_full = True
                break
            req.init_next_round_input(self.tree_cache)
            result = adder.add_one_req(req, has_chunked_req=self.chunked_req is not None, truncation_align_size=None)
            if result != sgl.AddReqResult.CONTINUE:
                if result == sgl.AddReqResult.NO_TOKEN:
                    running.batch_is_full = bool(adder.can_run_list) or not running.is_empty()
                break
        if not adder.can_run_list:
            return None
        admitted = set(adder.can_run_list)
        self.waiting_queue = [req for req in self.waiting_queue if req not in admitted]
        if adder.new_chunked_req is not None:
            self.chunked_req = adder.new_chunked_req
        if self.chunked_req is not None:
            self.chunked_req.inflight_middle_chunks += 1
        batch = sgl.ScheduleBatch.init_new(adder.can_run_list, self.req_to_token_pool, self.allocator,
                                           self.tree_cache, self.model_config, False, sgl.SpeculativeAlgorithm.NONE,
                                           chunked_req=self.chunked_req)
        batch.prepare_for_extend()
        return batch

    def _decode_batch(self) -> tuple[Any, list[int]]:
        """SGLang Scheduler.update_running_batch: retract requests when the next decode step's slots
        do not fit (ScheduleBatch.retract_decode, each announced as Preempted), then allocate one
        slot per running request (prepare_for_decode)."""
        batch = self.running_batch
        if batch.is_empty():
            return None, []
        preempted: list[int] = []
        if not batch.check_decode_mem():
            before = {req.rid: len(req.origin_input_ids) + len(req.output_ids) - 1 for req in batch.reqs}
            retracted, ratio, _ = self._retract(batch, before, preempted)
            self.new_token_ratio.current = ratio
            self.waiting_queue.extend(retracted)
        else:
            self.new_token_ratio.decay_step()
        if batch.is_empty():
            batch.batch_is_full = False
            return None, preempted
        batch.batch_is_full = False if preempted else batch.batch_is_full
        batch.prepare_for_decode()
        return batch, preempted

    def _retract(self, batch: Any, computed: dict[str, int], preempted: list[int]):
        """ScheduleBatch.retract_decode, each retracted request announced (Preempted) and our
        sequence reset to recompute."""
        retracted, ratio, to_abort = batch.retract_decode()
        for req in retracted:
            seq = self.seqs[req.rid]
            if self.events.active:
                self.events.emit(Preempted, request_id=self.groups[req.rid].request_id, seq_ids=(seq.seq_id,),
                                 mode="recompute", reason="no free slot for the next decode step (SGLang retract_decode)",
                                 num_tokens_lost=computed[req.rid])
            seq.reset_for_recompute()
            self.tables.pop(seq.seq_id, None)
            preempted.append(seq.seq_id)
        return retracted, ratio, to_abort

    def _plan(self, batch: Any) -> list[ScheduledSequence]:
        """Each request of the batch as a scheduled sequence: where it starts, how many tokens it
        computes, and its block table (its row's slots, one page per block)."""
        scheduled: list[ScheduledSequence] = []
        extend = batch.forward_mode.is_extend()
        for index, req in enumerate(batch.reqs):
            seq = self.seqs[req.rid]
            if extend:
                computed, new = batch.prefix_lens[index], batch.extend_lens[index]
            else:
                computed, new = seq.get_len() - 1, 1
            if seq.status is SequenceStatus.WAITING:
                seq.status = SequenceStatus.RUNNING
                seq.num_cached_tokens = computed
            seq.num_computed_tokens = computed
            table = self.tables[seq.seq_id] = self.block_table(req, computed + new)
            scheduled.append(ScheduledSequence(self.groups[req.rid], seq, computed, new, (table,)))
        return scheduled

    def _sync(self, tokens: dict | None = None) -> None:
        """Each held row read again (inserting a request's tokens may point its row at the tree's
        slots for a prefix another request published first, freeing its own: RadixCache.insert),
        then the tap's events."""
        for seq_id, pages in self.tables.items():
            self.tables[seq_id] = self.block_table(self.reqs[seq_id], len(pages) * self.page_size)
        self.tap.sync(self.tables, tokens or {})

    def block_table(self, req: Any, num_tokens: int) -> tuple[int, ...]:
        """The pages of the request's first `num_tokens` slots (its ReqToTokenPool row), in order."""
        row = self.req_to_token_pool.req_to_token[req.kv.req_pool_idx, :num_tokens:self.page_size]
        return tuple(int(slot) // self.page_size for slot in row.tolist())

    def update_from_output(self, plan: SchedulerOutput, sampled_token_ids: list[list[int]]) -> list[SequenceGroup]:
        """The batch ran and sampled (SGLang process_batch_result_prefill / _decode): row by row,
        the token goes to the Req and to our sequence (appended, stop-checked); a stopped request
        is finished in SGLang and released into the tree (release_kv_cache, checkpoint), a
        prefilled one still running publishes its prompt (checkpoint_kv_cache), a prefill chunk
        short of its end samples nothing. Returns the requests that finished."""
        sgl, batch = self.sgl, plan.design_output
        finished: list[SequenceGroup] = []
        if batch is None:
            return finished
        extend = batch.forward_mode.is_extend()
        with sgl.use_context(self.context):
            for s, token_ids in zip(plan.scheduled, sampled_token_ids):
                req = self.reqs.get(s.seq.seq_id)
                if req is None or req.finished():
                    continue
                if req is self.chunked_req:
                    req.inflight_middle_chunks -= 1
                    continue
                if not token_ids:
                    continue
                req.output_ids.append(token_ids[0])
                row = SchedulerOutput([s], plan.kind)
                finished += [group for group in self.output_processor.process_outputs(
                    row, [token_ids[:1]], lambda seq, req=req: self._finish(req)) if group not in finished]
                if not req.finished() and extend:
                    sgl.checkpoint_kv_cache(req, self.tree_cache)
                    self._sync()  # each request's insert on its own: a split shows as one
        self.last_batch = batch if extend else None
        return finished

    def _finish(self, req: Any) -> None:
        """Our stop check ended the sequence: SGLang finishes the Req and releases its row, keeping
        its tokens in the tree (release_kv_cache with checkpoint)."""
        sgl = self.sgl
        req.to_finish = sgl.FINISH_LENGTH(length=len(req.output_ids))
        req.update_finish_state()
        sgl.release_kv_cache(req, self.tree_cache, checkpoint=True)
        self.reqs.pop(int(req.rid), None)
        self.tables.pop(int(req.rid), None)
        self._forget(req)
        self._sync()

    def _ignore_head(self) -> tuple[SequenceGroup, str, list[Sequence]]:
        """The head of the waiting queue ends as ignored: nothing runs and it was not admitted into
        an empty pool (SGLang would wait on it forever)."""
        req = self.waiting_queue.pop(0)
        seq, group = self.seqs[req.rid], self.groups[req.rid]
        num_tokens = len(req.origin_input_ids) + len(req.output_ids)
        reason = self._too_big_reason(num_tokens) if self._pages_for(num_tokens) > self.num_pages else NEVER_ADMITTED
        self.reqs.pop(seq.seq_id, None)
        self._forget(req)
        seq.status = SequenceStatus.FINISHED_IGNORED
        return group, reason, [seq]


class _ModelConfig:
    """What ScheduleBatch reads of SGLang's ModelConfig with no worker."""

    def __init__(self, vocab_size: int) -> None:
        self.vocab_size = vocab_size
        self.is_encoder_decoder = False

"""LLMEngine: schedule -> run -> postprocess, one step at a time (vLLM v0 `LLMEngine.step`;
nano-vllm's `LLMEngine.step`).

Initialisation follows vLLM v0's `LLMEngine.__init__`: load the model, size the KV pools (as
vLLM v1's `determine_available_memory`: engine/kv_sizing.py), build the CacheEngine and the
block manager and scheduler of the design `kv_manager` names (engine/designs.py). Every block
operation and every step is an event on `self.events`, so a subscriber sees one ordered story.
"""

from __future__ import annotations

import itertools
import logging
import time

import torch

from engine.cache_engine import CacheEngine
from engine.kv_sizing import BlockBudget, determine_num_blocks
from engine.config import EngineConfig, PreemptionMode  # noqa: F401 (EngineConfig re-exported)
from engine.designs import DesignBuild
from engine.events import (
    EventBus,
    KVDigest,
    RequestAdded,
    StepFinished,
    StepStarted,
    TokensScheduled,
)
from engine.model_loader import LoadedModel, load_model
from engine.model_source import check_kv_manager
from engine.outputs import CompletionOutput, RequestOutput
from engine.model_runner import ModelRunner
from engine.output_processor import Detokenizer, OutputProcessor, StopChecker
from engine.sampler import make_generator, sample
from engine.scheduler import SchedulerConfig
from engine.scheduler_output import SchedulerOutput, step_kind
from engine.sequence import SamplingParams, Sequence, SequenceGroup, SequenceStatus, as_token_ids
from engine.v1.kv_cache_interface import kv_cache_specs
from engine.vllm_core.config import offloading_bytes

logger = logging.getLogger("engine")

_DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}


class LLMEngine:
    """A paged-KV engine over one model (GPT-2, Llama, Qwen2 or Qwen3): add_request, step,
    has_unfinished_requests."""

    def __init__(self, config: EngineConfig, loaded: LoadedModel | None = None, events: EventBus | None = None):
        self.config = config
        self.events = events if events is not None else EventBus()
        dtype = _DTYPES[config.dtype] if config.dtype else None
        self.loaded = loaded if loaded is not None else load_model(config.model, config.device, dtype)
        self.model = self.loaded.model
        self.tokenizer = self.loaded.tokenizer
        self.device = self.loaded.device
        model_config = self.loaded.config
        # per layer, vLLM's FullAttentionSpec or SlidingWindowSpec (what each layer's attention reads)
        self.kv_cache_specs = kv_cache_specs(model_config, config.block_size, self.loaded.dtype)
        self.design = config.design  # the KV-cache design's registry entry (engine/designs.py)
        check_kv_manager(self.design, getattr(model_config, "layer_types", ()))
        self.max_model_len = model_config.max_model_len
        max_batched = config.max_num_batched_tokens or max(2048, self.max_model_len)
        cpu_tier = offloading_bytes(config.vllm_options)  # vLLM's CPU tier (kv_offloading_size) is the CPU pool
        scheduler_config = SchedulerConfig(config.max_num_seqs, max_batched, self.max_model_len,
                                           config.preemption_mode)
        self.eos_token_id = self._eos_token_id()
        self._seq_counter = itertools.count()
        # what the sampled tokens do, for every design's update_from_output
        self.output_processor = OutputProcessor(StopChecker(self.eos_token_id, self.max_model_len),
                                                Detokenizer(self.tokenizer), self.events, self._seq_counter)
        build = DesignBuild(config, scheduler_config, self.kv_cache_specs, self.loaded.path,
                            bool(getattr(self.model, "takes_layer_metadata", False)), self.events,
                            self.output_processor)
        # the layers' KV-cache groups, one block table per request each, known before the pool is sized
        # (vLLM EngineCore._initialize_kv_caches: the groups, then the blocks); their layer names are
        # layer indices; None for one block table per sequence (v0, a model that reads one metadata)
        groups = self.design.build_kv_cache_groups(build, max_batched)
        self.vllm_config = build.vllm_config  # kv_manager "vllm": vLLM's VllmConfig; None otherwise
        self.budget: BlockBudget = determine_num_blocks(
            self.model, model_config, config.block_size, self.device, self.loaded.dtype, max_batched,
            gpu_memory_utilization=config.gpu_memory_utilization,
            kv_cache_memory_bytes=config.kv_cache_memory_bytes, num_gpu_blocks=config.num_gpu_blocks,
            swap_space_bytes=cpu_tier or config.swap_space_bytes,
            num_cpu_blocks=None if cpu_tier else config.num_cpu_blocks if self.design.swap else 0,
            max_num_seqs=config.max_num_seqs, attention_backend=config.attention_backend, kv_cache_groups=groups,
        )
        if cpu_tier is not None and self.budget.num_cpu_blocks < 2:  # vLLM's tier is a BlockPool: block 0 is null
            raise ValueError(f"kv_offloading_size {config.vllm_options['kv_offloading_size']:g} GiB holds "
                             f"{self.budget.num_cpu_blocks} blocks of {self.budget.block_bytes:,} bytes: the CPU tier "
                             f"needs at least 2 (its null block and one to copy into)")
        # a block holds every layer's page, or with several groups one page per layer of the largest group
        self.cache_engine = CacheEngine(
            model_config.num_layers, model_config.num_kv_heads, model_config.head_dim, config.block_size,
            self.budget.num_gpu_blocks, self.budget.num_cpu_blocks, self.device, self.loaded.dtype, groups,
        )
        # the design's block manager and scheduler (the engine reaches the manager only through its
        # scheduler), and the KV-cache groups as the manager holds them (None: one table per sequence)
        self.kv_manager, self.scheduler, self.kv_cache_groups = self.design.build_scheduler(build, self.budget, groups)
        self.model_runner = ModelRunner(self.model, self.cache_engine, config.block_size, self.device,
                                        config.attention_backend,
                                        self.kv_cache_groups,
                                        max_num_seqs=config.max_num_seqs, enforce_eager=config.enforce_eager)
        # vLLM's asynchronous order (a design that has it, as this run's scheduler resolved it): a
        # plan and its sampled tokens wait in flight for the next step's update_from_output
        self.async_scheduling = self.design.async_scheduling and self.scheduler.async_scheduling
        self._in_flight: tuple[SchedulerOutput, list[list[int]]] | None = None
        self._request_counter = itertools.count()
        self._groups: dict[str, SequenceGroup] = {}  # unfinished requests
        self.num_steps = 0
        # K/V digests of the device blocks a step wrote go out at the end of that step, unless
        # set_kv_digests_per_step(False) holds them back for emit_kv_digests()
        self._kv_digests_per_step = True
        self._written: dict[int, None] = {}  # device blocks written since their last digest

    def _eos_token_id(self) -> int | None:
        hf = self.loaded.hf_config
        eos = getattr(hf, "eos_token_id", None) if hf is not None else None
        if eos is None:
            eos = getattr(self.tokenizer, "eos_token_id", None)
        if isinstance(eos, (list, tuple)):
            eos = eos[0] if eos else None
        return eos

    # ------------------------------------------------------------------ requests

    def encode(self, prompt: str) -> list[int]:
        return list(self.tokenizer.encode(prompt, add_special_tokens=False))

    def format_prompt(self, prompt: str) -> str:
        """The text a string prompt is run as: for an instruct model (a tokenizer with a chat
        template) the template around it as the user's one message, ready for the assistant's
        answer (HF `apply_chat_template(..., add_generation_prompt=True)`, as vLLM's `LLM.chat`);
        the prompt itself with `raw_prompt` or a model without a template."""
        if self.config.raw_prompt or not getattr(self.tokenizer, "chat_template", None):
            return prompt
        return self.tokenizer.apply_chat_template([{"role": "user", "content": prompt}], tokenize=False,
                                                  add_generation_prompt=True)

    def check_request(
        self, prompt: str | list[int] | dict, sampling_params: SamplingParams | None = None
    ) -> tuple[list[int], str | None, SamplingParams]:
        """Validate a request without queueing it: (prompt token ids, prompt text, params), or a
        ValueError saying what is wrong. A request the engine could never run (n above
        max_num_seqs, a prompt at the model's context) is refused here rather than left waiting."""
        params = sampling_params if sampling_params is not None else SamplingParams()
        if not isinstance(params, SamplingParams):
            raise ValueError(f"sampling_params must be a SamplingParams, got {type(params).__name__}")
        text: str | None
        if isinstance(prompt, dict):
            if "prompt_token_ids" not in prompt:
                raise ValueError("a dict prompt needs 'prompt_token_ids'")
            token_ids, text = as_token_ids(prompt["prompt_token_ids"]), prompt.get("prompt")
        elif isinstance(prompt, str):
            text = self.format_prompt(prompt)
            token_ids = self.encode(text)
        else:
            token_ids, text = as_token_ids(prompt), None
        if not token_ids:
            raise ValueError("the prompt is empty: give at least one token")
        vocab = self.loaded.config.vocab_size
        bad = [t for t in token_ids if not 0 <= t < vocab]
        if bad:
            raise ValueError(f"prompt token ids {bad[:5]} are outside the vocabulary of {vocab}")
        if len(token_ids) >= self.max_model_len:
            raise ValueError(
                f"the prompt has {len(token_ids)} tokens but the model's context is {self.max_model_len}: "
                f"shorten it to at most {self.max_model_len - 1}"
            )
        self.config.check_n(params.n)
        return token_ids, text, params

    def add_request(
        self,
        prompt: str | list[int] | dict,
        sampling_params: SamplingParams | None = None,
        request_id: str | None = None,
    ) -> str:
        """Queue a request (a string, a list of token ids, or {"prompt_token_ids": [...]})."""
        token_ids, text, params = self.check_request(prompt, sampling_params)
        if request_id is None:
            request_id = str(next(self._request_counter))
        elif request_id in self._groups:
            raise ValueError(f"request id {request_id!r} is already in use")
        seq = Sequence(next(self._seq_counter), token_ids, self.config.block_size)
        seed = params.seed if params.seed is not None else self.config.seed + int(seq.seq_id)
        seq.generator = None if params.greedy else make_generator(seed, 0)
        group = SequenceGroup(request_id, [seq], params, time.monotonic(), prompt=text, seed=seed)
        if self.design.fans_out_n:  # vLLM v1: n > 1 as n requests sharing the prompt through the cache
            for branch in range(1, params.n):
                child = Sequence(next(self._seq_counter), token_ids, self.config.block_size)
                child.branch = branch
                child.generator = None if params.greedy else make_generator(seed, branch)
                group.add(child)
        self._groups[request_id] = group
        self.scheduler.add_seq_group(group)
        if self.events.active:  # the token ids only: their texts are the subscriber's to decode
            self.events.emit(RequestAdded, request_id=request_id, seq_ids=group.seq_ids, prompt=text or "",
                             prompt_token_ids=tuple(token_ids), prompt_tokens_text=(),
                             n=params.n, max_tokens=params.max_tokens)
        return request_id

    def is_unfinished(self, request_id: str) -> bool:
        return request_id in self._groups

    def has_unfinished_requests(self) -> bool:
        return self.scheduler.has_unfinished_seqs() or self._in_flight is not None

    def abort_request(self, request_id: str, reason: str = "aborted by the caller") -> None:
        """Finish the request's unfinished sequences as aborted and free every block it holds."""
        group = self._groups.get(request_id)
        if group is None:
            raise KeyError(f"request {request_id!r} is not unfinished")
        for seq in self.scheduler.abort_seq_group(group):
            self.output_processor.finish(group, seq, reason)
        del self._groups[request_id]

    # ------------------------------------------------------------------ user-driven operations

    def fork(self, seq_id: int) -> int:
        """Fork a running sequence now, between steps (vLLM v0 BlockSpaceManager.fork, as a
        request with n > 1 forks after its prefill): the child shares all its blocks. Returns the
        child's seq id."""
        if not self.design.fork:
            raise ValueError(self.design.refusal("fork"))
        for group in self._groups.values():
            seq = group.seqs_dict.get(seq_id)
            if seq is not None and seq.status is SequenceStatus.RUNNING:
                return self._fork(group, seq).seq_id
        raise ValueError(f"sequence {seq_id} is not running")

    def preempt(self, request_id: str) -> list[tuple[int, int]]:
        """Preempt a running request now, between steps, by swapping it out (vLLM v0
        Scheduler._preempt by swap, chosen by the user); returns the (gpu, cpu) pairs moved."""
        if not self.design.swap:
            raise ValueError(self.design.refusal("swap"))
        pairs = self.scheduler.preempt(request_id, PreemptionMode.SWAP)
        self.cache_engine.swap_out(pairs)
        self._emit_digests("cpu", [dst for _, dst in pairs])
        return pairs

    def _fork(self, group: SequenceGroup, parent: Sequence) -> Sequence:
        child = self.output_processor.fork(group, parent, self.scheduler.fork_seq)
        if not group.sampling_params.greedy:
            child.generator = make_generator(group.seed, child.branch)
        return child

    # ------------------------------------------------------------------ the step

    def step(self) -> list[RequestOutput]:
        """One engine step (nano-vllm LLMEngine.step; vLLM v1 EngineCore.step): schedule, move blocks
        between and within the pools, run the model over the plan and sample, then one
        update_from_output with the sampled tokens (appends, stop checks, v0's forks, frees).
        Under async scheduling (`async_scheduling`), the order of vLLM's batch queue instead
        (`_step_async`)."""
        if self.async_scheduling:
            return self._step_async()
        start = time.perf_counter()
        plan = self.scheduler.schedule()
        finished = self._finish_ignored(plan.ignored_seq_groups)
        self._move_blocks(plan)
        if not plan.scheduled:
            self._store_blocks(plan)
            return self._outputs(plan.scheduled_seq_groups, finished)
        self._start_step(plan)
        sampled_token_ids = self._run(plan)
        finished += self.scheduler.update_from_output(plan, sampled_token_ids)
        if self._kv_digests_per_step:
            self.emit_kv_digests()
        self._end_step(plan, start)
        return self._outputs(plan.scheduled_seq_groups, finished)

    def _step_async(self) -> list[RequestOutput]:
        """One step in vLLM's asynchronous order (vLLM EngineCore.step_with_batch_queue with two
        batches, AsyncScheduler): the next plan is scheduled while the last one's sampled tokens are
        still in flight (vLLM's output placeholders stand in for them), then the last plan's one
        update_from_output takes those tokens, then the new plan runs and samples, its tokens in
        flight until the next step. The model runner has the last plan's tokens already, so the new
        forward runs after their update and reads them from the sequences, as vLLM's runner feeds
        them from the previous batch's sampled ids; a row whose request finished in that update is
        not run (vLLM discards its output). The outputs are the requests of the plan whose tokens
        were processed; the first step processes none."""
        start = time.perf_counter()
        plan = self.scheduler.schedule()
        finished = self._finish_ignored(plan.ignored_seq_groups)
        processed: list[SequenceGroup] = []
        if self._in_flight is not None:
            last, sampled, self._in_flight = *self._in_flight, None
            finished += self.scheduler.update_from_output(last, sampled)
            processed = last.scheduled_seq_groups
        self._move_blocks(plan)
        live = [s for s in plan.scheduled if not s.seq.is_finished()]
        if len(live) < len(plan.scheduled):
            plan.scheduled = live
            plan.kind = step_kind(live)
        if not plan.scheduled:
            self._store_blocks(plan)
            if plan.design_output is not None:  # every row finished: vLLM takes the batch back empty
                finished += self.scheduler.update_from_output(plan, [])
            return self._outputs(processed, finished)
        plan.kind = step_kind(plan.scheduled)  # the in-flight tokens are the sequences' now
        self._start_step(plan)
        self._in_flight = (plan, self._run(plan))
        if self._kv_digests_per_step:
            self.emit_kv_digests()
        self._end_step(plan, start)
        return self._outputs(processed, finished)

    def _finish_ignored(self, ignored: list[tuple[SequenceGroup, str, list[Sequence]]]) -> list[SequenceGroup]:
        """Requests the scheduler refused for good end now, with its reason (each request once, though
        v1 refuses n > 1's sequences one by one)."""
        for group, reason, seqs in ignored:
            for seq in seqs:
                self.output_processor.finish(group, seq, reason)
        return list({id(group): group for group, _, _ in ignored if group.is_finished()}.values())

    def _move_blocks(self, plan: SchedulerOutput) -> None:
        """The plan's swaps and copy-on-write copies, done on the cache before the forward."""
        cache = self.cache_engine
        if plan.blocks_to_swap_out:
            cache.swap_out(plan.blocks_to_swap_out)
            self._emit_digests("cpu", [dst for _, dst in plan.blocks_to_swap_out])
        if plan.blocks_to_swap_in:
            cache.swap_in(plan.blocks_to_swap_in)
            self._emit_digests("gpu", [dst for _, dst in plan.blocks_to_swap_in])
        if plan.blocks_to_copy:
            cache.copy(plan.blocks_to_copy)
            self._emit_digests("gpu", [dst for _, dst in plan.blocks_to_copy])

    def _store_blocks(self, plan: SchedulerOutput) -> None:
        """The plan's stores, copied after the forward (vLLM SimpleCPUOffloadWorker.wait_for_save):
        vLLM's CPU tier may store a block the step itself fills, under the hash it fills it with."""
        if plan.blocks_to_store:
            self.cache_engine.swap_out(plan.blocks_to_store)
            self._emit_digests("cpu", [dst for _, dst in plan.blocks_to_store])

    def _start_step(self, plan: SchedulerOutput) -> None:
        """StepStarted, then (v1's token budget) TokensScheduled: each sequence's tokens this step."""
        self.num_steps += 1
        if not self.events.active:
            return
        scheduled = plan.scheduled
        seq_ids = tuple(s.seq.seq_id for s in scheduled)
        self.events.emit(StepStarted, step=self.num_steps, kind=plan.kind, seq_ids=seq_ids,
                         num_tokens=plan.num_batched_tokens)
        if plan.announces_tokens:
            self.events.emit(TokensScheduled, step=self.num_steps, seq_ids=seq_ids,
                             num_computed_tokens=tuple(s.num_computed_tokens for s in scheduled),
                             num_new_tokens=tuple(s.num_new_tokens for s in scheduled),
                             num_tokens=tuple(s.seq.get_len() for s in scheduled))

    def _end_step(self, plan: SchedulerOutput, start: float) -> None:
        if self.events.active:
            self.events.emit(StepFinished, step=self.num_steps, kind=plan.kind,
                             num_tokens=plan.num_batched_tokens, duration_s=time.perf_counter() - start)

    def _run(self, plan: SchedulerOutput) -> list[list[int]]:
        """The forward over the plan, the plan's stores after it, and the sampled tokens per plan row
        (nano-vllm ModelRunner.run): [] for a prefill chunk short of its end; for a v0 prompt whose
        request forks n > 1 branches, n tokens from the prompt's row, the first its own and each
        other one drawn with the generator of the branch that will take it (vLLM v0's sampler draws
        best_of from a prompt row). The blocks written wait for their K/V digests."""
        logits = self.model_runner.execute_model(plan)
        self._store_blocks(plan)
        if self.events.active and self.config.kv_digests:
            self._note_written(plan)
        sampled_token_ids: list[list[int]] = [[] for _ in plan.scheduled]
        rows = [row for row, s in enumerate(plan.scheduled) if s.samples]
        if not rows:
            return sampled_token_ids
        if len(rows) < len(plan.scheduled):
            logits = logits[rows]
        sampling = [plan.scheduled[row] for row in rows]
        token_ids = self.model_runner.sample(logits, [s.seq for s in sampling],
                                             [s.group.sampling_params for s in sampling])
        for index, (row, s, token_id) in enumerate(zip(rows, sampling, token_ids)):
            sampled_token_ids[row].append(token_id)
            params, group = s.group.sampling_params, s.group
            for branch in range(1, s.num_samples):
                generator = None if params.greedy else group.generators.setdefault(
                    branch, make_generator(group.seed, branch))
                (branch_token_id,) = sample(logits[index : index + 1], [params], [generator])
                sampled_token_ids[row].append(branch_token_id)
        return sampled_token_ids

    def _note_written(self, plan: SchedulerOutput) -> None:
        """The blocks the step wrote K/V into, read from the plan's tables: those holding tokens
        num_computed_tokens .. num_tokens - 1 of each scheduled sequence."""
        bs = self.config.block_size
        written = self._written
        for s in plan.scheduled:
            for table in s.block_ids:  # every KV-cache group's
                written.update(dict.fromkeys(table[s.num_computed_tokens // bs : (s.num_tokens - 1) // bs + 1]))

    @property
    def kv_digests_per_step(self) -> bool:
        """Whether each step ends with the K/V digests of the device blocks it wrote."""
        return self._kv_digests_per_step

    def set_kv_digests_per_step(self, per_step: bool) -> None:
        """Digest the blocks each step wrote at the end of that step (True, the default), or hold
        the digests back until emit_kv_digests() (False: a subscriber that takes events in batches
        many steps long has each block written hashed once per batch, not every step). Turning it
        back on emits what was held back."""
        self._kv_digests_per_step = bool(per_step)
        if per_step:
            self.emit_kv_digests()

    def emit_kv_digests(self) -> None:
        """Emit the K/V digests of the device blocks written since their last digest (each block
        once, hashing what it holds now). step() calls this itself unless the digests are held
        back (set_kv_digests_per_step(False))."""
        if self._written:
            blocks = list(self._written)
            self._written.clear()
            self._emit_digests("gpu", blocks)

    def _emit_digests(self, device: str, blocks: list[int]) -> None:
        if not (self.events.active and self.config.kv_digests and blocks):
            return
        events = self.events
        for block, digest in zip(blocks, self.cache_engine.kv_digests(device, blocks)):
            events.publish(KVDigest(next(events.seq_nos), device=device, block=block, digest=digest))

    # ------------------------------------------------------------------ outputs

    def _outputs(self, scheduled: list[SequenceGroup], finished: list[SequenceGroup]) -> list[RequestOutput]:
        """The step's outputs: requests still running, then those that finished (now forgotten)."""
        outputs = [self._output(g) for g in scheduled if g not in finished]
        outputs += [self._output(g) for g in finished]
        for group in finished:
            self._groups.pop(group.request_id, None)
        return outputs

    def _output(self, group: SequenceGroup) -> RequestOutput:
        seqs = sorted(group.get_seqs(), key=lambda s: s.branch)
        completions = [
            CompletionOutput(i, seq.output_text, list(seq.output_token_ids), seq.status.finish_reason,
                             seq.finish_detail)
            for i, seq in enumerate(seqs)
        ]
        first = seqs[0]
        return RequestOutput(group.request_id, group.prompt, list(first.prompt_token_ids), completions,
                             group.is_finished(), first.num_cached_tokens)

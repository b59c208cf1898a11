"""LLMEngine: schedule -> run -> postprocess, one step at a time (vLLM v0 `LLMEngine.step`;
nano-vllm's `LLMEngine.step`).

Initialisation follows vLLM v0's `LLMEngine.__init__`: load the model, size the KV pools
(`determine_num_available_blocks`), build the CacheEngine and the scheduler over a
BlockSpaceManager, or, with `kv_manager="v1"`, vLLM v1's Scheduler over a KVCacheManager
(engine/v1/). Every block operation and every step is an event on `self.events`, so a
subscriber sees one ordered story.
"""

from __future__ import annotations

import itertools
import logging
import time

import torch

from engine.block_manager import BlockSpaceManager
from engine.cache_engine import BlockBudget, CacheEngine, determine_num_blocks
from engine.config import EngineConfig, PreemptionMode  # noqa: F401 (EngineConfig re-exported)
from engine.events import (
    EventBus,
    KVDigest,
    RequestAdded,
    SequenceFinished,
    StepFinished,
    StepStarted,
    TokenGenerated,
    TokensScheduled,
)
from engine.model_loader import LoadedModel, load_model
from engine.outputs import CompletionOutput, RequestOutput
from engine.model_runner import ModelRunner
from engine.output_processor import Detokenizer, StopChecker
from engine.sampler import make_generator
from engine.scheduler import Scheduler, SchedulerConfig, SchedulerOutputs
from engine.sequence import SamplingParams, Sequence, SequenceGroup, SequenceStatus, as_token_ids

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
        self.detokenizer = Detokenizer(self.tokenizer)
        self.device = self.loaded.device
        model_config = self.loaded.config
        self.max_model_len = model_config.max_model_len
        max_batched = config.max_num_batched_tokens or max(2048, self.max_model_len)
        self.budget: BlockBudget = determine_num_blocks(
            self.model, model_config, config.block_size, self.device, self.loaded.dtype, max_batched,
            gpu_memory_utilization=config.gpu_memory_utilization,
            kv_cache_memory_bytes=config.kv_cache_memory_bytes, num_gpu_blocks=config.num_gpu_blocks,
            swap_space_bytes=config.swap_space_bytes,
            num_cpu_blocks=0 if config.kv_manager == "v1" else config.num_cpu_blocks,  # v1 has no swap
        )
        self.cache_engine = CacheEngine(
            model_config.num_layers, model_config.num_kv_heads, model_config.head_dim, config.block_size,
            self.budget.num_gpu_blocks, self.budget.num_cpu_blocks, self.device, self.loaded.dtype,
        )
        scheduler_config = SchedulerConfig(config.max_num_seqs, max_batched, self.max_model_len,
                                           config.preemption_mode)
        self.block_manager, self.scheduler = self._make_scheduler(scheduler_config)
        self.model_runner = ModelRunner(self.model, self.cache_engine, self.block_manager, config.block_size,
                                        self.device, config.attention_backend)
        self.eos_token_id = self._eos_token_id()
        self.stop_checker = StopChecker(self.eos_token_id, self.max_model_len)
        self._seq_counter = itertools.count()
        self._request_counter = itertools.count()
        self._groups: dict[str, SequenceGroup] = {}  # unfinished requests
        self.num_steps = 0
        # K/V digests of the device blocks a step wrote go out at the end of that step, unless
        # set_kv_digests_per_step(False) holds them back for emit_kv_digests()
        self._kv_digests_per_step = True
        self._written: dict[int, None] = {}  # device blocks written since their last digest

    def _make_scheduler(self, scheduler_config: SchedulerConfig):
        """The block manager and scheduler of the design `config.kv_manager` names: vLLM v0's
        BlockSpaceManager and Scheduler, or vLLM v1's KVCacheManager and Scheduler (engine/v1/).
        Both take add_seq_group / schedule / abort_seq_group / free_finished_seq_groups, and
        both managers free(seq) and give get_block_table(seq)."""
        config = self.config
        if config.kv_manager == "v1":
            from engine.v1.kv_cache_manager import KVCacheManager
            from engine.v1.scheduler import Scheduler as V1Scheduler

            manager = KVCacheManager(config.block_size, self.budget.num_gpu_blocks, self.max_model_len,
                                     enable_caching=bool(config.enable_prefix_caching),
                                     hash_algo=config.prefix_caching_hash_algo, events=self.events)
            return manager, V1Scheduler(scheduler_config, manager)
        manager = BlockSpaceManager(
            config.block_size, self.budget.num_gpu_blocks, self.budget.num_cpu_blocks,
            watermark=config.watermark, enable_caching=config.enable_prefix_caching, events=self.events,
        )
        return manager, Scheduler(scheduler_config, manager)

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
        if params.n > self.config.max_num_seqs:
            raise ValueError(f"n={params.n} sequences can never run at once: max_num_seqs is "
                             f"{self.config.max_num_seqs}")
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
        if self.config.kv_manager == "v1":  # n > 1: n requests sharing the prompt through the cache
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
        return self.scheduler.has_unfinished_seqs()

    def abort_request(self, request_id: str, reason: str = "aborted by the caller") -> None:
        """Finish the request's unfinished sequences as aborted and free every block it holds."""
        group = self._groups.get(request_id)
        if group is None:
            raise KeyError(f"request {request_id!r} is not unfinished")
        for seq in self.scheduler.abort_seq_group(group):
            self._emit_finished(group, seq, reason)
        del self._groups[request_id]

    # ------------------------------------------------------------------ user-driven operations

    def fork(self, seq_id: int) -> int:
        """Fork a running sequence now, between steps (vLLM v0 BlockSpaceManager.fork, as a
        request with n > 1 forks after its prefill): the child shares all its blocks. Returns the
        child's seq id."""
        if self.config.kv_manager == "v1":
            raise ValueError("vLLM v1 has no fork: n > 1 runs as requests sharing the prompt's cached blocks")
        for group in self.scheduler.running:
            if seq_id in group.seqs_dict and group.seqs_dict[seq_id].status is SequenceStatus.RUNNING:
                return self._fork(group, group.seqs_dict[seq_id]).seq_id
        raise ValueError(f"sequence {seq_id} is not running")

    def preempt(self, request_id: str) -> list[tuple[int, int]]:
        """Preempt a running request now, between steps, by swapping it out (vLLM v0
        Scheduler._preempt by swap, chosen by the user); returns the (gpu, cpu) pairs moved."""
        pairs = self.scheduler.preempt(request_id, PreemptionMode.SWAP)
        self.cache_engine.swap_out(pairs)
        self._emit_digests("cpu", [dst for _, dst in pairs])
        return pairs

    def _fork(self, group: SequenceGroup, parent: Sequence) -> Sequence:
        child = parent.fork(next(self._seq_counter))
        group.add(child)
        self.block_manager.fork(parent, child)
        child.branch = len(group.seqs) - 1
        params = group.sampling_params
        child.generator = None if params.greedy else make_generator(group.seed, child.branch)
        return child

    # ------------------------------------------------------------------ the step

    def step(self) -> list[RequestOutput]:
        """One engine step (vLLM v0 / nano-vllm LLMEngine.step): schedule, move blocks between
        and within the pools, run the model over the scheduled sequences, process their tokens."""
        start = time.perf_counter()
        sched = self.scheduler.schedule()
        finished = self._finish_ignored(sched.ignored_seq_groups)
        self._move_blocks(sched)
        running = sched.scheduled_seqs()
        if running:
            seqs = [seq for _, seq in running]
            self._start_step(sched, seqs)
            counts = self._tokens_scheduled(sched, seqs)
            if counts is None:  # v0: whole prompts or one token each
                logits = self.model_runner.execute_model(seqs, sched.is_prefill)
            else:
                logits = self.model_runner.execute_model(seqs, sched.is_prefill, counts)
            finished += self._process_outputs(running, logits, sched.is_prefill, counts)
            self._end_step(sched, start)
        return self._outputs(sched.scheduled_seq_groups, finished)

    def _tokens_scheduled(self, sched, seqs: list[Sequence]) -> list[int] | None:
        """v1: the tokens each sequence computes this step (a prefill chunk, the rest of a prompt
        or one decode token), announced as TokensScheduled; None in v0."""
        num_scheduled = sched.num_scheduled_tokens
        if num_scheduled is None:
            return None
        counts = [num_scheduled[seq.seq_id] for seq in seqs]
        if self.events.active:
            self.events.emit(TokensScheduled, step=self.num_steps, seq_ids=tuple(s.seq_id for s in seqs),
                             num_computed_tokens=tuple(s.num_computed_tokens for s in seqs),
                             num_new_tokens=tuple(counts), num_tokens=tuple(s.get_len() for s in seqs))
        return counts

    def _finish_ignored(self, ignored: list[tuple[SequenceGroup, str, list[Sequence]]]) -> list[SequenceGroup]:
        """Requests the scheduler refused for good end now, with its reason."""
        for group, reason, seqs in ignored:
            for seq in seqs:
                self._emit_finished(group, seq, reason)
        return [group for group, _, _ in ignored if group.is_finished()]

    def _move_blocks(self, sched: SchedulerOutputs) -> None:
        """The scheduler's swaps and copy-on-write copies, done on the cache before the forward."""
        cache = self.cache_engine
        if sched.blocks_to_swap_out:
            cache.swap_out(sched.blocks_to_swap_out)
            self._emit_digests("cpu", [dst for _, dst in sched.blocks_to_swap_out])
        if sched.blocks_to_swap_in:
            cache.swap_in(sched.blocks_to_swap_in)
            self._emit_digests("gpu", [dst for _, dst in sched.blocks_to_swap_in])
        if sched.blocks_to_copy:
            cache.copy(sched.blocks_to_copy)
            self._emit_digests("gpu", [dst for _, dst in sched.blocks_to_copy])

    def _start_step(self, sched: SchedulerOutputs, seqs: list[Sequence]) -> None:
        self.num_steps += 1
        if self.events.active:
            self.events.emit(StepStarted, step=self.num_steps, kind=sched.kind,
                             seq_ids=tuple(s.seq_id for s in seqs), num_tokens=sched.num_batched_tokens)

    def _end_step(self, sched: SchedulerOutputs, start: float) -> None:
        if self.events.active:
            self.events.emit(StepFinished, step=self.num_steps, kind=sched.kind,
                             num_tokens=sched.num_batched_tokens, duration_s=time.perf_counter() - start)

    def _process_outputs(self, running: list[tuple[SequenceGroup, Sequence]], logits: torch.Tensor,
                         is_prefill: bool, num_new_tokens: list[int] | None = None) -> list[SequenceGroup]:
        """Append each sequence's sampled token; a request with n > 1 forks its other branches
        after its prefill, each sampling its own first token from the same logits (v0). With
        `num_new_tokens` (v1) a sequence whose tokens were a prefill chunk short of its end
        samples nothing yet. Returns the requests that finished."""
        if num_new_tokens is not None:
            running, logits = self._advance_v1(running, logits, num_new_tokens)
            if not running:
                self._after_tokens()
                return []
        token_ids = self.model_runner.sample(logits, [seq for _, seq in running],
                                             [group.sampling_params for group, _ in running])
        finished: list[SequenceGroup] = []
        for row, ((group, seq), token_id) in enumerate(zip(running, token_ids)):
            if num_new_tokens is None:
                self._mark_computed(seq, is_prefill)
            children = self._fork_branches(group, seq)
            self._append_token(group, seq, token_id)
            for child in children:
                (child_token_id,) = self.model_runner.sample(logits[row : row + 1], [child], [group.sampling_params])
                self._append_token(group, child, child_token_id)
            if group.is_finished() and group not in finished:
                finished.append(group)
        self._after_tokens()
        return finished

    def _after_tokens(self) -> None:
        if self._kv_digests_per_step:
            self.emit_kv_digests()
        self.scheduler.free_finished_seq_groups()

    def _advance_v1(self, running: list[tuple[SequenceGroup, Sequence]], logits: torch.Tensor,
                    num_new_tokens: list[int]) -> tuple[list[tuple[SequenceGroup, Sequence]], torch.Tensor]:
        """v1: each sequence computed its scheduled tokens (vLLM v1 update_from_output's
        num_computed_tokens); the ones now at their end sample, with their logits rows."""
        bs = self.config.block_size
        rows = []
        for row, ((_, seq), count) in enumerate(zip(running, num_new_tokens)):
            start = seq.num_computed_tokens
            seq.num_computed_tokens = start + count
            if self.events.active and self.config.kv_digests:
                table = self.block_manager.get_block_table(seq)
                self._written.update(dict.fromkeys(table[start // bs : (seq.num_computed_tokens - 1) // bs + 1]))
            if seq.num_computed_tokens == seq.get_len():
                rows.append(row)
        return [running[row] for row in rows], logits[rows]

    def _mark_computed(self, seq: Sequence, is_prefill: bool) -> None:
        """The forward wrote the sequence's K/V: its blocks may serve prefix-cache hits, and the
        blocks written wait for their K/V digests."""
        self.block_manager.mark_blocks_as_computed(seq)
        if self.events.active and self.config.kv_digests:
            table = self.block_manager.block_tables[seq.seq_id]
            first = seq.num_cached_tokens // self.config.block_size if is_prefill else len(table) - 1
            self._written.update(dict.fromkeys(b.block_number for b in table[first:]))
        seq.num_computed_tokens = seq.get_len()

    def _fork_branches(self, group: SequenceGroup, seq: Sequence) -> list[Sequence]:
        """A request with n > 1 forks its other n - 1 branches once its prompt is computed."""
        n = group.sampling_params.n
        if n > 1 and len(group.seqs) == 1 and seq.get_output_len() == 0:
            return [self._fork(group, seq) for _ in range(n - 1)]
        return []

    def _append_token(self, group: SequenceGroup, seq: Sequence, token_id: int) -> None:
        """Append a sampled token, detokenize it, and finish the sequence if it should stop."""
        seq.append_token_id(token_id)
        stop = self.stop_checker.stop_reason(seq, group.sampling_params)
        piece = self.detokenizer.decode_sequence_inplace(seq, final=stop is not None)
        if self.events.active:  # fields in order: seq_id, token_id, text, position
            self.events.emit(TokenGenerated, seq.seq_id, token_id, piece, seq.get_len() - 1)
        if stop is not None:
            seq.status, detail = stop
            self.block_manager.free(seq)
            self._emit_finished(group, seq, detail)

    def _emit_finished(self, group: SequenceGroup, seq: Sequence, detail: str) -> None:
        if seq.finish_detail:
            raise RuntimeError(f"sequence {seq.seq_id} finished twice ({seq.finish_detail!r}, then {detail!r})")
        seq.finish_detail = detail
        if self.events.active:
            self.events.emit(SequenceFinished, seq_id=seq.seq_id, request_id=group.request_id,
                             reason=seq.status.finish_reason or "", detail=detail)

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
        for block, digest in zip(blocks, self.cache_engine.kv_digests(device, blocks)):
            self.events.emit(KVDigest, device, block, digest)  # per written block: positional, as above

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

"""LLMEngine: schedule -> run -> postprocess, one step at a time (vLLM v0 `LLMEngine`, seed 003;
nano-vllm's `LLMEngine.step`).

Initialisation follows seed 003: load the model, size the KV pools (seed 001's formula), build the
CacheEngine and the scheduler over a BlockSpaceManager. Every block operation and every step is an
event on `self.events`, so a subscriber sees one ordered story.
"""

from __future__ import annotations

import itertools
import logging
import operator
import time
from dataclasses import dataclass
from typing import Any, Callable

import torch

from engine.attention import AttentionMetadata
from engine.block_manager import BlockSpaceManager
from engine.cache_engine import DEFAULT_SWAP_SPACE_BYTES, BlockBudget, CacheEngine, determine_num_blocks
from engine.events import (
    EventBus,
    KVDigest,
    RequestAdded,
    SequenceFinished,
    StepFinished,
    StepStarted,
    TokenGenerated,
)
from engine.model_loader import DEFAULT_MODEL, LoadedModel, load_model
from engine.outputs import CompletionOutput, RequestOutput
from engine.sampler import make_generator, sample
from engine.scheduler import Scheduler, SchedulerConfig
from engine.sequence import SamplingParams, Sequence, SequenceGroup, SequenceStatus

logger = logging.getLogger("engine")

_DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}


@dataclass(slots=True)
class EngineConfig:
    """Everything needed to build an engine; validated on construction."""

    model: str = DEFAULT_MODEL
    block_size: int = 16
    num_gpu_blocks: int | None = None
    num_cpu_blocks: int | None = None
    kv_cache_memory_bytes: int | None = None
    swap_space_bytes: int = DEFAULT_SWAP_SPACE_BYTES
    gpu_memory_utilization: float = 0.9
    enable_prefix_caching: bool = False
    preemption_mode: str | None = None
    device: str | None = None
    dtype: str | None = None
    seed: int = 0
    max_num_seqs: int = 64
    max_num_batched_tokens: int | None = None
    watermark: float = 0.01
    kv_digests: bool = True

    def __post_init__(self) -> None:
        if not isinstance(self.block_size, int) or self.block_size < 1:
            raise ValueError(f"block_size must be a positive integer, got {self.block_size!r}")
        if self.num_gpu_blocks is not None and self.num_gpu_blocks < 1:
            raise ValueError(f"num_gpu_blocks must be >= 1, got {self.num_gpu_blocks}")
        if self.num_cpu_blocks is not None and self.num_cpu_blocks < 0:
            raise ValueError(f"num_cpu_blocks must be >= 0, got {self.num_cpu_blocks}")
        if self.preemption_mode not in (None, "swap", "recompute"):
            raise ValueError(f"preemption_mode must be 'swap' or 'recompute', got {self.preemption_mode!r}")
        if self.dtype is not None and self.dtype not in _DTYPES:
            raise ValueError(f"dtype must be one of {', '.join(_DTYPES)}, got {self.dtype!r}")
        if self.max_num_seqs < 1:
            raise ValueError(f"max_num_seqs must be >= 1, got {self.max_num_seqs}")


def _token_ids(values: Any) -> list[int]:
    """A prompt's token ids as ints; anything else (a float, a string) is a ValueError."""
    if isinstance(values, (str, bytes)):
        raise ValueError(f"prompt token ids must be a list of integers, got {values!r}")
    token_ids = []
    for value in values:
        if isinstance(value, bool):
            raise ValueError(f"prompt token ids must be integers, got {value!r}")
        try:
            token_ids.append(operator.index(value))
        except TypeError:
            raise ValueError(f"prompt token ids must be integers, got {value!r}") from None
    return token_ids


def _decoder(tokenizer: Any) -> Callable[..., str]:
    """The tokenizer's decode without its public wrapper: `decode` first walks every id through
    `to_py_obj` (a generator and an `all()` per call), which was a fifth of a tiny model's decode
    step; `_decode` is the same decoding and clean-up that `decode` then calls."""
    inner = getattr(tokenizer, "_decode", None)
    return inner if callable(inner) else tokenizer.decode


class LLMEngine:
    """A paged-KV engine over one GPT-2 model: add_request, step, has_unfinished_requests."""

    def __init__(self, config: EngineConfig, loaded: LoadedModel | None = None, events: EventBus | None = None):
        self.config = config
        self.events = events if events is not None else EventBus()
        dtype = _DTYPES[config.dtype] if config.dtype else None
        self.loaded = loaded if loaded is not None else load_model(config.model, config.device, dtype)
        self.model = self.loaded.model
        self.tokenizer = self.loaded.tokenizer
        self._decode = _decoder(self.tokenizer)
        self.device = self.loaded.device
        model_config = self.loaded.config
        self.max_model_len = model_config.max_model_len
        max_batched = config.max_num_batched_tokens or max(2048, self.max_model_len)
        self.budget: BlockBudget = determine_num_blocks(
            self.model, model_config, config.block_size, self.device, self.loaded.dtype, max_batched,
            gpu_memory_utilization=config.gpu_memory_utilization,
            kv_cache_memory_bytes=config.kv_cache_memory_bytes, num_gpu_blocks=config.num_gpu_blocks,
            swap_space_bytes=config.swap_space_bytes, num_cpu_blocks=config.num_cpu_blocks,
        )
        self.cache_engine = CacheEngine(
            model_config.num_layers, model_config.num_kv_heads, model_config.head_dim, config.block_size,
            self.budget.num_gpu_blocks, self.budget.num_cpu_blocks, self.device, self.loaded.dtype,
        )
        self.block_manager = BlockSpaceManager(
            config.block_size, self.budget.num_gpu_blocks, self.budget.num_cpu_blocks,
            watermark=config.watermark, enable_caching=config.enable_prefix_caching, events=self.events,
        )
        self.scheduler = Scheduler(
            SchedulerConfig(config.max_num_seqs, max_batched, self.max_model_len, config.preemption_mode),
            self.block_manager,
        )
        self.eos_token_id = self._eos_token_id()
        self._seq_counter = itertools.count()
        self._request_counter = itertools.count()
        self._groups: dict[str, SequenceGroup] = {}  # unfinished requests
        self._group_by_seq: dict[int, SequenceGroup] = {}
        self._generators: dict[int, torch.Generator | None] = {}
        self._branch_of: dict[int, int] = {}
        self.num_steps = 0
        # K/V digests of the device blocks a step wrote go out at the end of that step; with this
        # False they wait, gathered, for emit_kv_digests() (a live UI free-running at full speed
        # digests once per batch it is sent: a block being filled is hashed once, not every step).
        self.kv_digests_per_step = True
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
            token_ids, text = _token_ids(prompt["prompt_token_ids"]), prompt.get("prompt")
        elif isinstance(prompt, str):
            token_ids, text = self.encode(prompt), prompt
        else:
            token_ids, text = _token_ids(prompt), None
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
        group = SequenceGroup(request_id, [seq], params, time.monotonic(), prompt=text, seed=seed)
        self._generators[seq.seq_id] = None if params.greedy else make_generator(seed, 0)
        self._branch_of[seq.seq_id] = 0
        self._groups[request_id] = group
        self._group_by_seq[seq.seq_id] = group
        self.scheduler.add_seq_group(group)
        if self.events.active:
            pieces = tuple(self.tokenizer.batch_decode([[t] for t in token_ids]))
            self.events.emit(RequestAdded, request_id=request_id, seq_ids=(seq.seq_id,), prompt=text or "",
                             prompt_token_ids=tuple(token_ids), prompt_tokens_text=pieces,
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
        self._forget(group)

    # ------------------------------------------------------------------ user-driven operations

    def fork_sequence(self, seq_id: int) -> int:
        """Fork a running sequence now (between steps): the child shares all its blocks."""
        for group in self.scheduler.running:
            if seq_id in group.seqs_dict and group.seqs_dict[seq_id].status is SequenceStatus.RUNNING:
                return self._fork(group, group.seqs_dict[seq_id]).seq_id
        raise ValueError(f"sequence {seq_id} is not running")

    def preempt_request(self, request_id: str) -> list[tuple[int, int]]:
        """Swap a running request out now (between steps); returns the (gpu, cpu) pairs moved."""
        pairs = self.scheduler.preempt_now(request_id, mode="swap")
        self.cache_engine.swap_out(pairs)
        self._emit_digests("cpu", [dst for _, dst in pairs])
        return pairs

    def _fork(self, group: SequenceGroup, parent: Sequence) -> Sequence:
        child = parent.fork(next(self._seq_counter))
        group.add(child)
        self._group_by_seq[child.seq_id] = group
        self.block_manager.fork(parent, child)
        branch = len(group.seqs) - 1
        self._branch_of[child.seq_id] = branch
        params = group.sampling_params
        self._generators[child.seq_id] = None if params.greedy else make_generator(group.seed, branch)
        return child

    # ------------------------------------------------------------------ the step

    def step(self) -> list[RequestOutput]:
        """One engine step: schedule, move blocks, run the model, sample, postprocess."""
        start = time.perf_counter()
        sched = self.scheduler.schedule()
        finished_groups: list[SequenceGroup] = []
        for group, reason, seqs in sched.ignored_seq_groups:
            for seq in seqs:
                self._emit_finished(group, seq, reason)
            finished_groups.append(group)
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
        groups = sched.scheduled_seq_groups
        if not groups:
            outputs = [self._output(g) for g in finished_groups]
            for group in finished_groups:
                self._forget(group)
            return outputs

        self.num_steps += 1
        seqs = [seq for group in groups for seq in group.get_seqs(SequenceStatus.RUNNING)]
        kind = "prefill" if sched.is_prefill else "decode"
        if self.events.active:
            self.events.emit(StepStarted, step=self.num_steps, kind=kind,
                             seq_ids=tuple(s.seq_id for s in seqs), num_tokens=sched.num_batched_tokens)
        logits = self._run_model(seqs, sched.is_prefill)
        seq_groups = [self._group_of(seq) for seq in seqs]
        params = [group.sampling_params for group in seq_groups]
        generators = [self._generators.get(seq.seq_id) for seq in seqs]
        next_tokens = sample(logits, params, generators)
        track_written = self.events.active and self.config.kv_digests
        written = self._written  # blocks this step wrote, for their K/V digests
        for row, (seq, group, token) in enumerate(zip(seqs, seq_groups, next_tokens)):
            self.block_manager.mark_blocks_as_computed(seq)
            if track_written:
                table = self.block_manager.block_tables[seq.seq_id]
                first = seq.num_cached_tokens // self.config.block_size if sched.is_prefill else len(table) - 1
                written.update(dict.fromkeys(b.block_number for b in table[first:]))
            seq.num_computed_tokens = seq.get_len()
            branches = [seq]
            if group.sampling_params.n > 1 and len(group.seqs) == 1 and seq.get_output_len() == 0:
                branches += [self._fork(group, seq) for _ in range(group.sampling_params.n - 1)]
            for i, branch in enumerate(branches):
                if i == 0:
                    token_id = token
                else:
                    token_id = sample(logits[row : row + 1], [group.sampling_params],
                                      [self._generators[branch.seq_id]])[0]
                self._append_token(group, branch, token_id)
            if group.is_finished() and group not in finished_groups:
                finished_groups.append(group)
        if self.kv_digests_per_step:
            self.emit_kv_digests()
        self.scheduler.free_finished_seq_groups()
        if self.events.active:
            self.events.emit(StepFinished, step=self.num_steps, kind=kind,
                             num_tokens=sched.num_batched_tokens, duration_s=time.perf_counter() - start)
        outputs = [self._output(g) for g in groups if g not in finished_groups]
        outputs += [self._output(g) for g in finished_groups]
        for group in finished_groups:
            self._forget(group)
        return outputs

    def _run_model(self, seqs: list[Sequence], is_prefill: bool) -> torch.Tensor:
        """Flatten the step's new tokens, build the attention metadata, return (num_seqs, vocab) logits."""
        tables = [self.block_manager.get_block_table(seq) for seq in seqs]
        input_ids: list[int] = []
        query_lens: list[int] = []
        context_lens: list[int] = []
        for seq in seqs:
            length = seq.get_len()
            if is_prefill:
                start = min(seq.num_cached_tokens, length - 1)
                input_ids.extend(seq.get_token_ids()[start:])
                query_lens.append(length - start)
            else:
                input_ids.append(seq.get_last_token_id())
                query_lens.append(1)
            context_lens.append(length)
        meta = AttentionMetadata.build(tables, query_lens, context_lens, self.config.block_size, self.device)
        tokens = torch.tensor(input_ids, dtype=torch.int64, device=self.device)  # (num_tokens,)
        hidden = self.model(tokens, meta.positions, self.cache_engine.gpu_cache, meta)  # (num_tokens, n_embd)
        return self.model.compute_logits(hidden[meta.last_token_indices])  # (num_seqs, vocab)

    def _append_token(self, group: SequenceGroup, seq: Sequence, token_id: int) -> None:
        old_text = seq.output_text
        seq.append_token_id(token_id)
        stop = self._stop_reason(group.sampling_params, seq, token_id)
        new_text = self._decode(seq.output_token_ids, skip_special_tokens=True)
        if new_text.endswith("\ufffd") and stop is None:
            piece = ""  # a multi-byte character split across tokens: wait for the rest
        else:
            piece = new_text[len(old_text):] if new_text.startswith(old_text) else new_text
            seq.output_text = new_text
        if self.events.active:
            # per token: field values in order (seq_id, token_id, text, position), no by-name call
            self.events.emit(TokenGenerated, seq.seq_id, token_id, piece, seq.get_len() - 1)
        if stop is not None:
            seq.status, detail = stop
            self.block_manager.free(seq)
            self._emit_finished(group, seq, detail)

    def _stop_reason(self, params: SamplingParams, seq: Sequence, token_id: int):
        """vLLM's stop checks: EOS (unless ignore_eos), a stop token, max_tokens, the model's context."""
        if not params.ignore_eos and token_id == self.eos_token_id:
            return SequenceStatus.FINISHED_STOPPED, "end of text"
        if token_id in params.stop_token_ids:
            return SequenceStatus.FINISHED_STOPPED, f"stop token {token_id}"
        if seq.get_output_len() >= params.max_tokens:
            return SequenceStatus.FINISHED_LENGTH_CAPPED, f"max_tokens {params.max_tokens}"
        if seq.get_len() >= self.max_model_len:
            return SequenceStatus.FINISHED_LENGTH_CAPPED, f"model context {self.max_model_len}"
        return None

    def _emit_finished(self, group: SequenceGroup, seq: Sequence, detail: str) -> None:
        if seq.finish_detail:
            raise RuntimeError(f"sequence {seq.seq_id} finished twice ({seq.finish_detail!r}, then {detail!r})")
        seq.finish_detail = detail
        if self.events.active:
            self.events.emit(SequenceFinished, seq_id=seq.seq_id, request_id=group.request_id,
                             reason=seq.status.finish_reason or "", detail=detail)

    def emit_kv_digests(self) -> None:
        """Emit the K/V digests of the device blocks written since their last digest (each block
        once, hashing what it holds now). step() calls this itself unless kv_digests_per_step is
        False; whoever turned that off calls it when it wants the digests (EngineBridge: before
        it sends a batch of events)."""
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

    def _group_of(self, seq: Sequence) -> SequenceGroup:
        return self._group_by_seq[seq.seq_id]

    def _forget(self, group: SequenceGroup) -> None:
        self._groups.pop(group.request_id, None)
        for seq_id in group.seqs_dict:
            self._group_by_seq.pop(seq_id, None)
            self._generators.pop(seq_id, None)
            self._branch_of.pop(seq_id, None)

    def _output(self, group: SequenceGroup) -> RequestOutput:
        seqs = sorted(group.get_seqs(), key=lambda s: self._branch_of.get(s.seq_id, 0))
        completions = [
            CompletionOutput(i, seq.output_text, list(seq.output_token_ids), seq.status.finish_reason,
                             seq.finish_detail)
            for i, seq in enumerate(seqs)
        ]
        first = seqs[0]
        return RequestOutput(group.request_id, group.prompt, list(first.prompt_token_ids), completions,
                             group.is_finished(), first.num_cached_tokens)

    def trace_header(self) -> dict:
        """The run's configuration and the block-count formula's figures (for traces and lessons)."""
        b = self.budget
        return {
            "model": self.config.model, "block_size": self.config.block_size,
            "num_gpu_blocks": b.num_gpu_blocks, "num_cpu_blocks": b.num_cpu_blocks,
            "enable_prefix_caching": self.config.enable_prefix_caching,
            "preemption_mode": self.config.preemption_mode, "device": str(self.device),
            "dtype": str(self.loaded.dtype).removeprefix("torch."), "block_bytes": b.block_bytes,
            "budget_source": b.source, "total_bytes": b.total_bytes, "peak_bytes": b.peak_bytes,
            "gpu_memory_utilization": b.utilization, "max_model_len": self.max_model_len,
            "num_layers": self.loaded.config.num_layers, "num_kv_heads": self.loaded.config.num_kv_heads,
            "head_dim": self.loaded.config.head_dim,
        }

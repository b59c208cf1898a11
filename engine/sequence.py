"""Sequences, sequence groups and sampling parameters (vLLM v0's `vllm/sequence.py`).

A `Sequence` owns its logical blocks; `block_size` is passed in (nano-vllm keeps it as a class-level
global, which is exactly what we avoid). A `SequenceGroup` is one request: the sequences that share
its prompt (n > 1 forks them after prefill, so they share the prompt's physical blocks).
"""

from __future__ import annotations

import enum
import math
import operator
from dataclasses import dataclass, field
from typing import Any

from engine.block import LogicalTokenBlock


_SAMPLING_EPS = 1e-5  # temperatures below this are greedy, as vLLM's SamplingParams


class SequenceStatus(enum.Enum):
    """Lifecycle of a sequence, as vLLM v0's SequenceStatus."""

    WAITING = "waiting"
    RUNNING = "running"
    SWAPPED = "swapped"
    FINISHED_STOPPED = "finished_stopped"
    FINISHED_LENGTH_CAPPED = "finished_length_capped"
    FINISHED_ABORTED = "finished_aborted"
    FINISHED_IGNORED = "finished_ignored"

    def __init__(self, value: str) -> None:
        self.is_finished = value.startswith("finished")

    @property
    def finish_reason(self) -> str | None:
        return {
            SequenceStatus.FINISHED_STOPPED: "stop",
            SequenceStatus.FINISHED_LENGTH_CAPPED: "length",
            SequenceStatus.FINISHED_ABORTED: "abort",
            SequenceStatus.FINISHED_IGNORED: "ignored",
        }.get(self)


@dataclass(slots=True)
class SamplingParams:
    """How to pick tokens and when to stop (vLLM's SamplingParams, the subset this engine runs).

    temperature 0 is greedy; top_k 0 (or -1) and top_p 1.0 disable those filters.
    """

    n: int = 1
    temperature: float = 0.0
    top_p: float = 1.0
    top_k: int = 0
    max_tokens: int = 16
    seed: int | None = None
    ignore_eos: bool = False
    stop_token_ids: tuple[int, ...] = ()

    def __post_init__(self) -> None:
        for name in ("n", "top_k", "max_tokens", "seed"):
            value = getattr(self, name)
            if value is not None or name != "seed":
                setattr(self, name, _integer(name, value))
        if self.n < 1:
            raise ValueError(f"n must be at least 1, got {self.n!r}")
        if isinstance(self.temperature, bool) or not isinstance(self.temperature, (int, float)):
            raise ValueError(f"temperature must be a number, got {self.temperature!r}")
        if not math.isfinite(self.temperature) or self.temperature < 0:
            raise ValueError(f"temperature must be a finite number >= 0, got {self.temperature!r}")
        if self.temperature < _SAMPLING_EPS:
            self.temperature = 0.0  # vLLM: below 1e-5 is greedy (dividing logits by it overflows)
        if isinstance(self.top_p, bool) or not isinstance(self.top_p, (int, float)) or not 0.0 < self.top_p <= 1.0:
            raise ValueError(f"top_p must be in (0, 1], got {self.top_p!r}")
        if self.top_k < -1:
            raise ValueError(f"top_k must be -1, 0 (off) or positive, got {self.top_k!r}")
        if self.max_tokens < 1:
            raise ValueError(f"max_tokens must be at least 1, got {self.max_tokens!r}")
        if isinstance(self.ignore_eos, int) and not isinstance(self.ignore_eos, bool):
            self.ignore_eos = bool(self.ignore_eos)
        if not isinstance(self.ignore_eos, bool):
            raise ValueError(f"ignore_eos must be True or False, got {self.ignore_eos!r}")
        try:
            stop = tuple(self.stop_token_ids)
        except TypeError:
            raise ValueError(f"stop_token_ids must be a sequence of integers, got {self.stop_token_ids!r}") from None
        self.stop_token_ids = tuple(_integer("stop_token_ids", t) for t in stop)

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0


def as_token_ids(values: object) -> list[int]:
    """A prompt's token ids as ints (numpy integers are fine); a string, a float or a bool is a
    ValueError."""
    if isinstance(values, (str, bytes)):
        raise ValueError(f"prompt token ids must be a list of integers, got {values!r}")
    return [_integer("each prompt token id", value) for value in values]


def _integer(name: str, value: object) -> int:
    """`value` as an int (a numpy integer is fine); a bool, float or string is a ValueError naming
    the field."""
    if isinstance(value, bool):
        raise ValueError(f"{name} must be an integer, got {value!r}")
    try:
        return operator.index(value)
    except TypeError:
        raise ValueError(f"{name} must be an integer, got {value!r}") from None


class Sequence:
    """One token stream: prompt plus generated tokens, chopped into logical blocks.

    `num_cached_tokens` is how many leading prompt tokens the prefix cache served (set by the
    block manager on allocation); `num_computed_tokens` how many tokens have K/V in the cache, or
    will once the steps in flight ran (engine/v1 counts a step's tokens when it schedules them, as
    vLLM v1's `Scheduler._update_after_schedule`). Under vLLM's async scheduling (engine/v1's
    Scheduler) `num_in_flight_tokens` of those belong to steps whose output is not processed yet,
    `num_output_placeholders` counts the sampled tokens on their way (not yet appended), and
    `num_stale_output_tokens` the in-flight tokens a preemption made stale: all three as vLLM's
    `Request` counts them.
    `branch` is the sequence's index in its request (0 for the first, i for the i-th fork of
    n > 1) and `generator` the torch.Generator it samples with (None when greedy): set by the engine's
    add_request for a request's sequences, by OutputProcessor.fork for a fork.
    """

    def __init__(self, seq_id: int, prompt_token_ids: list[int], block_size: int) -> None:
        if block_size <= 0:
            raise ValueError(f"block_size must be positive, got {block_size}")
        if not prompt_token_ids:
            raise ValueError(f"sequence {seq_id} needs at least one prompt token")
        self.seq_id = seq_id
        self.block_size = block_size
        self.prompt_token_ids = list(prompt_token_ids)
        self.output_token_ids: list[int] = []
        self.output_text = ""
        self.logical_token_blocks: list[LogicalTokenBlock] = []
        self.status = SequenceStatus.WAITING
        self.num_cached_tokens = 0
        self.num_computed_tokens = 0
        self.num_in_flight_tokens = 0
        self.num_output_placeholders = 0
        self.num_stale_output_tokens = 0
        self.finish_detail = ""
        self.branch = 0
        self.generator: Any = None
        self._append_tokens_to_blocks(self.prompt_token_ids)

    def _append_tokens_to_blocks(self, token_ids: list[int]) -> None:
        """Fill the last logical block, then open new ones (vLLM v0's _append_tokens_to_blocks)."""
        cursor = 0
        while cursor < len(token_ids):
            if not self.logical_token_blocks or self.logical_token_blocks[-1].is_full():
                self._append_logical_block()
            last = self.logical_token_blocks[-1]
            num_taken = min(last.get_num_empty_slots(), len(token_ids) - cursor)
            last.append_tokens(token_ids[cursor : cursor + num_taken])
            cursor += num_taken

    def _append_logical_block(self) -> LogicalTokenBlock:
        block = LogicalTokenBlock(len(self.logical_token_blocks), self.block_size)
        self.logical_token_blocks.append(block)
        return block

    def append_token_id(self, token_id: int) -> None:
        """Add one generated token (vLLM's append_token_id); finished sequences refuse."""
        if self.status.is_finished:
            raise ValueError(f"sequence {self.seq_id} is finished ({self.status.value}); cannot append")
        self.output_token_ids.append(token_id)
        last = self.logical_token_blocks[-1]
        if last.is_full():
            last = self._append_logical_block()
        last.token_ids.append(token_id)

    def get_len(self) -> int:
        return len(self.prompt_token_ids) + len(self.output_token_ids)

    def get_output_len(self) -> int:
        return len(self.output_token_ids)

    def get_token_ids(self) -> list[int]:
        return self.prompt_token_ids + self.output_token_ids

    def get_token_ids_between(self, start: int, end: int) -> list[int]:
        """Tokens start..end-1, without joining prompt and output when they lie in one of them
        (a decode step's one token)."""
        num_prompt = len(self.prompt_token_ids)
        if start >= num_prompt:
            return self.output_token_ids[start - num_prompt : end - num_prompt]
        if end <= num_prompt:
            return self.prompt_token_ids[start:end]
        return self.prompt_token_ids[start:] + self.output_token_ids[: end - num_prompt]

    def get_last_token_id(self) -> int:
        return self.output_token_ids[-1] if self.output_token_ids else self.prompt_token_ids[-1]

    @property
    def num_logical_blocks(self) -> int:
        return len(self.logical_token_blocks)

    def is_finished(self) -> bool:
        return self.status.is_finished

    def fork(self, new_seq_id: int) -> "Sequence":
        """A child with the same tokens and the same logical blocks (copied, not shared)."""
        child = Sequence.__new__(Sequence)
        child.seq_id = new_seq_id
        child.block_size = self.block_size
        child.prompt_token_ids = list(self.prompt_token_ids)
        child.output_token_ids = list(self.output_token_ids)
        child.output_text = self.output_text
        child.logical_token_blocks = []
        for block in self.logical_token_blocks:
            copy = LogicalTokenBlock(block.block_number, block.block_size)
            copy.token_ids = block.get_token_ids()
            child.logical_token_blocks.append(copy)
        child.status = self.status
        child.num_cached_tokens = self.num_cached_tokens
        child.num_computed_tokens = self.num_computed_tokens
        child.finish_detail = ""
        child.branch = self.branch
        child.generator = None
        return child

    def reset_for_recompute(self) -> None:
        """Recompute preemption: everything becomes prompt again (vLLM v0's reset_state_for_recompute
        keeps the tokens; the KV is gone)."""
        self.status = SequenceStatus.WAITING
        self.num_cached_tokens = 0
        self.num_computed_tokens = 0

    def __repr__(self) -> str:
        return (
            f"Sequence(seq_id={self.seq_id}, status={self.status.value}, "
            f"num_blocks={self.num_logical_blocks}, len={self.get_len()})"
        )


@dataclass
class SequenceGroup:
    """One request: its sequences (n > 1 once forked), sampling params and arrival time."""

    request_id: str
    seqs: list[Sequence]
    sampling_params: SamplingParams = field(default_factory=SamplingParams)
    arrival_time: float = 0.0
    prompt: str | None = None
    seed: int = 0  # base of the per-branch sampling generators
    # branch -> the generator a branch drew its first token with before it was forked (v0's n > 1:
    # the prompt's row samples every branch's first token); its fork takes it
    generators: dict[int, Any] = field(default_factory=dict, repr=False, compare=False)

    def __post_init__(self) -> None:
        if not self.seqs:
            raise ValueError(f"request {self.request_id!r} has no sequences")
        self.seqs_dict = {seq.seq_id: seq for seq in self.seqs}

    def get_seqs(self, status: SequenceStatus | None = None) -> list[Sequence]:
        if status is None:
            return list(self.seqs_dict.values())
        return [seq for seq in self.seqs_dict.values() if seq.status == status]

    def num_seqs(self, status: SequenceStatus | None = None) -> int:
        return len(self.get_seqs(status))

    def get_unfinished_seqs(self) -> list[Sequence]:
        return [seq for seq in self.seqs_dict.values() if not seq.is_finished()]

    def add(self, seq: Sequence) -> None:
        if seq.seq_id in self.seqs_dict:
            raise ValueError(f"sequence {seq.seq_id} is already in request {self.request_id!r}")
        self.seqs_dict[seq.seq_id] = seq
        self.seqs.append(seq)

    def get_max_num_running_seqs(self) -> int:
        """Upper bound of sequences this group will run at once (n before forking)."""
        if self.sampling_params.n > 1 and self.num_seqs() == 1 and not self.is_finished():
            return self.sampling_params.n
        return len(self.get_unfinished_seqs())

    def is_finished(self) -> bool:
        return all(seq.is_finished() for seq in self.seqs_dict.values())

    @property
    def seq_ids(self) -> tuple[int, ...]:
        return tuple(self.seqs_dict)

"""The step plan: what a scheduler hands the model runner for one step (vLLM v1
`vllm/v1/core/sched/output.py` `SchedulerOutput`; vLLM v0's list of `SequenceGroupMetadata`
with `token_chunk_size` and `block_tables`; nano-vllm's `Scheduler.schedule` returning the
sequences the runner prepares).

Both schedulers (v0's `engine/scheduler.py`, v1's `engine/v1/scheduler.py`) return one
`SchedulerOutput`. Per scheduled sequence it says where the step starts (`num_computed_tokens`),
how many tokens it computes (`num_new_tokens`: a whole prompt, a prefill chunk or one decode token)
and the block table those tokens attend over, one per KV-cache group (as vLLM's
`NewRequestData.block_ids: tuple[list[int], ...]`: one table for a full-attention model, one per
group for a hybrid one under engine/v1). The block moves the cache engine
makes first (swaps, copy-on-write copies) and the requests refused for good travel with it. The
model runner computes from the plan alone; it never reads a block manager.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from engine.sequence import Sequence, SequenceGroup

STEP_KINDS = ("prefill", "decode", "mixed")


@dataclass(slots=True, frozen=True)
class ScheduledSequence:
    """One sequence's part of a step (vLLM v1 `num_scheduled_tokens[req_id]` with the request's
    block ids; vLLM v0 `SequenceGroupMetadata.token_chunk_size` and `block_tables[seq_id]`)."""

    group: SequenceGroup
    seq: Sequence
    num_computed_tokens: int  # tokens with K/V in the cache before the step: the step starts here
    num_new_tokens: int  # tokens the step computes, from num_computed_tokens on
    block_ids: tuple[tuple[int, ...], ...]  # the sequence's block table, one per KV-cache group

    @property
    def num_tokens(self) -> int:
        """Tokens with K/V once the step ran: the context the new tokens attend over."""
        return self.num_computed_tokens + self.num_new_tokens

    @property
    def samples(self) -> bool:
        """Whether the step reaches the sequence's last token, so it samples the next one (a
        prefill chunk short of its end samples nothing: vLLM v1 discards that row)."""
        return self.num_tokens == self.seq.get_len()

    @property
    def num_samples(self) -> int:
        """Tokens the step samples from the sequence's row: none short of its last token, n for
        the prompt of a request with n > 1 that forks its branches after it (vLLM v0's sampler
        draws n from a prompt's row), else one. A design that fans n out as n sequences queues all
        n at once, so it samples one per row."""
        if not self.samples:
            return 0
        n = self.group.sampling_params.n
        return n if n > 1 and len(self.group.seqs) == 1 and self.seq.get_output_len() == 0 else 1


@dataclass(slots=True)
class SchedulerOutput:
    """One step's plan (vLLM v1 SchedulerOutput): the sequences scheduled, in order, each with its
    tokens and block table; the block moves to make before the forward (and the stores
    after it); the requests that can
    never run. `kind` is "prefill", "decode" or "mixed" (v1 batches both in one step).
    `announces_tokens`: the scheduler scheduled token counts per request (v1's token budget), so
    the step announces them as TokensScheduled; v0's whole prompts or one token each do not."""

    scheduled: list[ScheduledSequence] = field(default_factory=list)
    kind: str = "decode"
    announces_tokens: bool = False
    blocks_to_swap_in: list[tuple[int, int]] = field(default_factory=list)
    blocks_to_swap_out: list[tuple[int, int]] = field(default_factory=list)
    blocks_to_copy: list[tuple[int, int]] = field(default_factory=list)
    # (gpu, cpu) pairs copied after the forward (vLLM's CPU tier stores: SimpleCPUOffloadWorker
    # issues them in wait_for_save, so a block the step writes is stored with what it wrote)
    blocks_to_store: list[tuple[int, int]] = field(default_factory=list)
    preempted_seq_ids: list[int] = field(default_factory=list)  # vLLM's preempted_req_ids
    # requests that can never run, with the reason and the sequences finished as ignored just now
    ignored_seq_groups: list[tuple[SequenceGroup, str, list[Sequence]]] = field(default_factory=list)
    # the design's own record of the step, handed back to it in update_from_output (kv_manager
    # "vllm": vLLM's SchedulerOutput, which vLLM's update_from_output takes); None for ours
    design_output: Any = None

    @property
    def num_batched_tokens(self) -> int:
        """Tokens the step computes, over every scheduled sequence."""
        return sum(s.num_new_tokens for s in self.scheduled)

    @property
    def num_scheduled_tokens(self) -> dict[int, int]:
        """seq_id -> the tokens it computes this step (vLLM v1's num_scheduled_tokens)."""
        return {s.seq.seq_id: s.num_new_tokens for s in self.scheduled}

    @property
    def scheduled_seq_groups(self) -> list[SequenceGroup]:
        """The requests scheduled, once each, in order."""
        groups: dict[int, SequenceGroup] = {}
        for s in self.scheduled:
            groups.setdefault(id(s.group), s.group)
        return list(groups.values())


def is_decode(num_computed_tokens: int, num_new_tokens: int, num_tokens: int) -> bool:
    """Whether a sequence's part of a step computes only its newest token (of `num_tokens`)."""
    return num_new_tokens == 1 and num_computed_tokens == num_tokens - 1


def step_kind(scheduled: list[ScheduledSequence]) -> str:
    """"decode" when every scheduled sequence computes only its newest token, "prefill" when none
    does, "mixed" otherwise (vLLM v1 batches both in one step)."""
    decodes = sum(1 for s in scheduled if is_decode(s.num_computed_tokens, s.num_new_tokens, s.seq.get_len()))
    return "decode" if decodes == len(scheduled) else "prefill" if decodes == 0 else "mixed"


NEVER_ADMITTED = "cannot be admitted even into an empty pool"  # the reason of a head of line that waits forever


def pool_too_small_reason(needed: list[int], num_pool_blocks: int, pool_note: str,
                          num_tokens: int | None = None) -> str:
    """Why a request needing more blocks than the pool has is refused, in every design's words:
    "needs N blocks [for T tokens] but the pool has P (pool_note)", each KV-cache group's count
    named when `needed` holds several groups' (vLLM v0 `Scheduler._schedule_prefills` ignores such
    a request on `AllocStatus.NEVER`; vLLM v1 refuses such a pool at start-up,
    `check_enough_kv_cache_memory`)."""
    tokens = f" for {num_tokens} tokens" if num_tokens is not None else ""
    groups = f" ({' + '.join(map(str, needed))} in its {len(needed)} KV-cache groups)" if len(needed) > 1 else ""
    return f"needs {sum(needed)} blocks{tokens}{groups} but the pool has {num_pool_blocks} ({pool_note})"


def plan_entry(group: SequenceGroup, seq: Sequence, num_computed_tokens: int, num_new_tokens: int,
               block_ids: list[int]) -> ScheduledSequence:
    """A scheduled sequence over one KV-cache group's table."""
    return ScheduledSequence(group, seq, num_computed_tokens, num_new_tokens, (tuple(block_ids),))

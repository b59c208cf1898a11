"""What preemption cost, and where memory goes: figures derived from the event stream alone.

- `preemption_ledger(events)`: each preemption (vLLM v0 Scheduler._preempt) with its victim, mode,
  the blocks it swapped out or freed, the computed tokens it threw away, and how many engine steps
  passed until it ran again (None while it has not).
- `memory_truth(state, max_tokens)`: per pool and per sequence, block utilization (blocks in use /
  pool) beside token utilization (slots holding tokens / slots in used blocks), internal
  fragmentation (empty slots in each sequence's last block), and what a contiguous reservation of
  prompt + max_tokens slots per sequence would hold for the same sequences (the vLLM paper's
  comparison).
No torch, no textual: the TUI, the widgets and the CLI can all show them.
"""

from __future__ import annotations

from dataclasses import dataclass

from engine.reducer import USED, ReducerState


@dataclass(slots=True)
class Preemption:
    """One preemption and what it cost."""

    seq_no: int  # the preempted event's number
    step: int  # the engine step it happened before (the last step started)
    request_id: str
    seq_ids: tuple[int, ...]
    mode: str  # "swap" or "recompute"
    reason: str
    blocks_swapped: int  # GPU blocks copied to the CPU pool (swap)
    blocks_freed: int  # GPU blocks the victim let go of (ref count dropped)
    tokens_lost: int  # computed tokens to compute again (recompute)
    resumed_step: int | None = None  # the step at which it ran again

    @property
    def steps_until_resumed(self) -> int | None:
        return None if self.resumed_step is None else self.resumed_step - self.step


def preemption_ledger(events) -> list[Preemption]:
    """Every preemption in `events`, in order, with its cost and when it resumed."""
    ledger: list[Preemption] = []
    step = 0
    window: list = []  # events since the last step ended: where a preemption's moves are
    waiting: dict[int, Preemption] = {}  # seq_id -> its open preemption
    for event in events:
        kind = event.type
        if kind == "step_started":
            step = event.step
            for seq_id in event.seq_ids:
                entry = waiting.pop(seq_id, None)
                if entry is not None and entry.resumed_step is None:
                    entry.resumed_step = step
        elif kind == "preempted":
            seqs = set(event.seq_ids)
            swapped = [e for e in window if e.type == "swap_out" and e.request_id == event.request_id]
            freed = {e.block for e in window if e.type == "block_freed" and e.device == "gpu" and e.seq_id in seqs}
            entry = Preemption(event.seq_no, step, event.request_id, event.seq_ids, event.mode, event.reason,
                               len(swapped[-1].mapping) if swapped else 0, len(freed), event.num_tokens_lost)
            ledger.append(entry)
            waiting.update(dict.fromkeys(event.seq_ids, entry))
        window.append(event)
        if kind == "step_finished":
            window = []
    return ledger


@dataclass(slots=True)
class PoolTruth:
    num_blocks: int
    used_blocks: int
    slots_used: int  # slots holding tokens, in used blocks
    slots_allocated: int  # slots of the used blocks

    @property
    def block_utilization(self) -> float:
        return self.used_blocks / self.num_blocks if self.num_blocks else 0.0

    @property
    def token_utilization(self) -> float:
        return self.slots_used / self.slots_allocated if self.slots_allocated else 0.0


@dataclass(slots=True)
class SeqTruth:
    seq_id: int
    num_tokens: int  # tokens its table holds (a block shared with another sequence counts for both)
    num_blocks: int
    empty_in_last_block: int  # internal fragmentation
    reserved_slots: int  # what a contiguous prompt + max_tokens reservation would hold


@dataclass(slots=True)
class MemoryTruth:
    pools: dict[str, PoolTruth]
    seqs: dict[int, SeqTruth]

    @property
    def internal_fragmentation(self) -> int:
        return sum(s.empty_in_last_block for s in self.seqs.values())

    @property
    def reserved_slots(self) -> int:
        return sum(s.reserved_slots for s in self.seqs.values())

    def reservation_waste(self) -> float:
        """Share of a contiguous prompt + max_tokens reservation that would hold no token now."""
        held = sum(s.num_tokens for s in self.seqs.values())
        return 1 - held / self.reserved_slots if self.reserved_slots else 0.0

    def paged_waste(self) -> float:
        """Share of the GPU slots in used blocks that hold no token now."""
        return 1 - self.pools["gpu"].token_utilization if self.pools["gpu"].slots_allocated else 0.0


def memory_truth(state: ReducerState, max_tokens: dict[int, int]) -> MemoryTruth:
    """The figures at `state`; `max_tokens[seq_id]` is its request's max_tokens (request_added)."""
    size = state.block_size
    pools = {}
    for device, blocks in state.pools.items():
        used = [b for b in blocks if b.state == USED]
        pools[device] = PoolTruth(len(blocks), len(used), sum(len(b.token_ids) for b in used), len(used) * size)
    seqs = {}
    for seq_id, table in state.tables.items():
        tokens = [len(state.pools[device][number].token_ids) for device, number in table]
        seq = state.seqs.get(seq_id)
        prompt = seq.num_prompt_tokens if seq is not None else 0
        seqs[seq_id] = SeqTruth(seq_id, sum(tokens), len(table), size - tokens[-1] if tokens else 0,
                                prompt + max_tokens.get(seq_id, 0))
    return MemoryTruth(pools, seqs)


def max_tokens_of(events) -> dict[int, int]:
    """Each sequence's max_tokens from the request_added events (a forked child gets its parent's)."""
    out: dict[int, int] = {}
    for event in events:
        if event.type == "request_added":
            out.update(dict.fromkeys(event.seq_ids, event.max_tokens))
        elif event.type == "fork" and event.parent_seq_id in out:
            out[event.child_seq_id] = out[event.parent_seq_id]
    return out

"""What preemption cost, and where memory goes: figures derived from the event stream alone.

- `preemption_ledger(events)`: each preemption (vLLM v0 Scheduler._preempt) with its victim, mode,
  the blocks it swapped out or freed, the computed tokens it threw away, and how many engine steps
  passed until it ran again (None while it has not).
- `memory_truth(state, max_tokens)`: per pool and per sequence, block utilization (blocks in use /
  pool) beside token utilization (slots holding tokens / slots in used blocks), internal
  fragmentation (empty slots in each sequence's last block), and what a contiguous reservation of
  prompt + max_tokens slots per sequence would hold for the same sequences (the vLLM paper's
  comparison).
With KV-cache groups (a hybrid model) a sequence has a table per group: its figures count every
group's blocks once each (a block belongs to one group), the null block in a window's freed slots
never; a preemption's freed blocks are counted per group, and blocks a sliding window let go
mid-request (BlocksSkipped) are no preemption's cost.
No torch, no textual: the TUI, the widgets and the CLI can all show them.
"""

from __future__ import annotations

import bisect
import re
from collections import Counter
from dataclasses import dataclass, field, replace

from blockviz.model.design import KVCacheGroup, kv_cache_groups_of, kv_manager_of
from blockviz.model.narration import plural
from blockviz.model.reducer import NULL, NULL_CODE, USED_CODE, ReducerState
from blockviz.model.radix_view import RadixHistory
from engine import events as ev


@dataclass(slots=True)
class Preemption:
    """One preemption and what it cost."""

    seq_no: int  # the preempted event's number
    step: int  # the engine step it belongs to, as narration.cursor_step counts (scheduling is the next step's)
    request_id: str
    seq_ids: tuple[int, ...]
    mode: str  # "swap" or "recompute"
    reason: str
    blocks_swapped: int  # GPU blocks copied to the CPU pool (swap)
    blocks_freed: int  # GPU blocks the victim let go of (ref count dropped)
    tokens_lost: int  # computed tokens to compute again (recompute)
    resumed_step: int | None = None  # the step it came back in: swapped in, or admitted again to recompute
    position: int = 0  # events fed up to and including the preempted event (Ledger)
    resumed_position: int | None = None  # events fed up to its swap-in, re-admission or resuming step_started
    # Where its moves came (events fed up to each): the engine announces a preemption before its
    # swap-out and frees, so a cursor between them has seen only some (old traces: all before).
    swap_positions: tuple[tuple[int, int], ...] = ()  # (position, blocks swapped out)
    free_positions: tuple[tuple[int, int, int], ...] = ()  # (position, GPU block freed, its KV-cache group)
    blocks_freed_per_group: tuple[tuple[int, int], ...] = ()  # (group, blocks freed there), groups in order

    def as_of(self, position: int) -> "Preemption":
        """This preemption as a cursor at `position` sees it: the moves made by then, resumed or not."""
        swapped = [count for at, count in self.swap_positions if at <= position]
        freed = {block: group for at, block, group in self.free_positions if at <= position}
        resumed = self.resumed_position is not None and self.resumed_position <= position
        return replace(self, blocks_swapped=swapped[-1] if swapped else 0, blocks_freed=len(freed),
                       blocks_freed_per_group=tuple(sorted(Counter(freed.values()).items())),
                       resumed_step=self.resumed_step if resumed else None,
                       resumed_position=self.resumed_position if resumed else None)

    @property
    def steps_until_resumed(self) -> int | None:
        return None if self.resumed_step is None else self.resumed_step - self.step


class Ledger:
    """The preemption ledger, built as events arrive (`feed(event)`); `entries` in order."""

    def __init__(self) -> None:
        self.entries: list[Preemption] = []
        self._step = 0
        self._running = False  # between a step_started and its step_finished
        self._fed = 0
        self._window: list = []  # (position, event) since the last step ended: where a preemption's moves are
        self._announced: list[Preemption] = []  # the preemptions announced since the last step ended
        self._waiting: dict[int, Preemption] = {}  # seq_id -> its open preemption
        self._slid: set[tuple[int, int]] = set()  # (seq_id, block) a sliding window let go, its free to come

    def feed(self, event) -> None:
        self._fed += 1
        if isinstance(event, ev.StepStarted):
            self._step, self._running = event.step, True
            self._resume(event.seq_ids)
        elif isinstance(event, ev.SwappedIn):  # the swap-in is its return: it runs in the step being scheduled
            self._resume(event.seq_ids)
        elif isinstance(event, (ev.BlockAllocated, ev.PrefixCacheHit)):
            self._resume(event.seq_ids)  # admitted again, to compute its tokens again
        elif isinstance(event, ev.Preempted):
            self._preempted(event)
        elif isinstance(event, ev.BlocksSkipped):
            self._slid.update((event.seq_id, block) for block in event.blocks)
        elif isinstance(event, ev.BlockFreed) and (event.seq_id, event.block) in self._slid:
            self._slid.discard((event.seq_id, event.block))  # a window's free, never a preemption's move
            return
        elif isinstance(event, (ev.SwappedOut, ev.BlockFreed)):
            self._moved(event)
        self._end(event)

    def _end(self, event) -> None:
        self._window.append((self._fed, event))
        if isinstance(event, ev.StepFinished):
            self._running = False
            self._window, self._announced = [], []

    @property
    def step(self) -> int:
        """The step the events being fed belong to: the running one, or, while the scheduler
        works between two steps, the next (narration.cursor_step's numbering)."""
        return self._step if self._running else self._step + 1

    def _resume(self, seq_ids) -> None:
        for seq_id in seq_ids:
            entry = self._waiting.pop(seq_id, None)
            if entry is not None and entry.resumed_step is None:
                entry.resumed_step, entry.resumed_position = self.step, self._fed

    def rebase(self, shift: int) -> None:
        """Count positions from `shift` events later (a capped timeline dropped them): entries
        before then are dropped, unless still waiting to run again."""
        self._fed -= shift
        kept = []
        for entry in self.entries:
            if entry.position <= shift and entry.resumed_step is not None:
                continue
            entry.position = max(entry.position - shift, 0)
            if entry.resumed_position is not None:
                entry.resumed_position -= shift
            entry.swap_positions = tuple((at - shift, count) for at, count in entry.swap_positions)
            entry.free_positions = tuple((at - shift, block, group) for at, block, group in entry.free_positions)
            kept.append(entry)
        self.entries = kept
        self._window = [(at - shift, event) for at, event in self._window]

    def forget_waiting(self) -> None:
        """Forget the open preemptions: events that would resume them were dropped unseen."""
        self._waiting.clear()
        self._window = []

    def _preempted(self, event) -> None:
        """A preemption: its moves already in this step's window (traces recorded before the engine
        announced preemptions first) count now, later ones as they come (`_moved`)."""
        entry = Preemption(event.seq_no, self.step, event.request_id, event.seq_ids, event.mode, event.reason,
                           0, 0, event.num_tokens_lost, position=self._fed)
        self.entries.append(entry)
        self._announced.append(entry)
        self._waiting.update(dict.fromkeys(event.seq_ids, entry))
        for position, moved in self._window:
            self._count_move(entry, moved, position)
        self._settle(entry)

    def _moved(self, event) -> None:
        """A swap-out or a free after a preemption announced in this step: one of its moves."""
        for entry in reversed(self._announced):
            if self._count_move(entry, event, self._fed):
                self._settle(entry)
                return

    def _settle(self, entry: Preemption) -> None:
        """The entry's totals: every move counted so far."""
        moved = entry.as_of(self._fed)
        entry.blocks_swapped, entry.blocks_freed = moved.blocks_swapped, moved.blocks_freed
        entry.blocks_freed_per_group = moved.blocks_freed_per_group

    @staticmethod
    def _count_move(entry: Preemption, event, position: int) -> bool:
        if isinstance(event, ev.SwappedOut) and event.request_id == entry.request_id:
            entry.swap_positions += ((position, len(event.mapping)),)
            return True
        if isinstance(event, ev.BlockFreed) and event.device == "gpu" and event.seq_id in entry.seq_ids:
            entry.free_positions += ((position, event.block, event.group),)
            return True
        return False


def preemption_ledger(events) -> list[Preemption]:
    """Every preemption in `events`, in order, with its cost and when it resumed."""
    ledger = Ledger()
    for event in events:
        ledger.feed(event)
    return ledger.entries


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
    num_tokens: int  # tokens its tables hold (a block shared with another sequence counts for both)
    num_blocks: int  # blocks in its tables, every group's, the null block not
    empty_in_last_block: int  # internal fragmentation (each group's table's last block)
    reserved_slots: int  # what a contiguous prompt + max_tokens reservation would hold (one per group)
    blocks_per_group: tuple[int, ...] = ()  # num_blocks by KV-cache group
    last_blocks: tuple[tuple[str, int, int], ...] = ()  # (device, block, empty slots) of each table's last block


@dataclass(slots=True)
class MemoryTruth:
    pools: dict[str, PoolTruth]
    seqs: dict[int, SeqTruth]
    blocks_per_group: dict[int, int] = field(default_factory=dict)  # GPU blocks in use by KV-cache group

    @property
    def internal_fragmentation(self) -> int:
        """Empty slots in the last blocks, a block shared by several sequences (n > 1, a prefix hit)
        counted once."""
        return sum({(device, block): empty for s in self.seqs.values()
                    for device, block, empty in s.last_blocks}.values())

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


_USED = re.compile(re.escape(USED_CODE.encode("ascii")))
_NULL = NULL_CODE.encode("ascii")


def memory_truth(state: ReducerState, max_tokens: dict[int, int]) -> MemoryTruth:
    """The figures at `state`; `max_tokens[seq_id]` is its request's max_tokens (request_added)."""
    size = state.block_size
    pools = {}
    used_of = {}
    for device, blocks in state.pools.items():
        # the reducer's state codes find the used blocks without a Python pass over the pool
        codes = state.codes[device]
        used_of[device] = used = [blocks[m.start()] for m in _USED.finditer(codes)]
        usable = len(blocks) - codes.count(_NULL)  # vLLM v1's null block is never counted
        pools[device] = PoolTruth(usable, len(used), sum(len(b.token_ids) for b in used), len(used) * size)
    seqs = {}
    groups = range(state.num_kv_cache_groups)
    seq_ids = dict.fromkeys(seq_id for g in groups for seq_id in state.tables_of(g))
    for seq_id in seq_ids:
        tables = [[(device, number) for device, number in table if state.pools[device][number].state != NULL]
                  for table in state.seq_tables(seq_id)]
        held = [[len(state.pools[device][number].token_ids) for device, number in table] for table in tables]
        seq = state.seqs.get(seq_id)
        prompt = seq.num_prompt_tokens if seq is not None else 0
        num_tables = sum(1 for g in groups if seq_id in state.tables_of(g))
        seqs[seq_id] = SeqTruth(seq_id, sum(map(sum, held)), sum(map(len, held)),
                                sum(size - tokens[-1] for tokens in held if tokens),
                                (prompt + max_tokens.get(seq_id, 0)) * num_tables, tuple(map(len, held)),
                                tuple((*table[-1], size - tokens[-1]) for table, tokens in zip(tables, held) if tokens))
    used_groups = Counter(b.group for b in used_of.get("gpu", ()))
    return MemoryTruth(pools, seqs, dict(sorted(used_groups.items())))


def max_tokens_of(events) -> dict[int, int]:
    """Each sequence's max_tokens from the request_added events (a forked child gets its parent's)."""
    out: dict[int, int] = {}
    for event in events:
        note_max_tokens(out, event)
    return out


def note_max_tokens(out: dict[int, int], event) -> None:
    """Keep `out` (seq_id -> max_tokens) up to date with one event."""
    if isinstance(event, ev.RequestAdded):
        out.update(dict.fromkeys(event.seq_ids, event.max_tokens))
    elif isinstance(event, ev.Forked) and event.parent_seq_id in out:
        out[event.child_seq_id] = out[event.parent_seq_id]


@dataclass(slots=True, frozen=True)
class MemoryPoint:
    """The GPU's memory figures at the end of one engine step (one point of the sparklines)."""

    step: int
    position: int  # events up to and including the step_finished
    block_utilization: float
    token_utilization: float
    internal_fragmentation: int
    reservation_waste: float


class Insights:
    """The prefix-hit explainer, the preemption ledger and the memory series over one growing event
    list (a Timeline's), fed lazily: `sync(events)` feeds what it has not seen yet. Queries take a
    cursor `position` (events applied) and answer as of then, so time travel shows the past."""

    def __init__(self, block_size: int, num_gpu_blocks: int, num_cpu_blocks: int,
                 enable_prefix_caching: bool = True, kv_manager: str = "v0", hash_algo: str = "sha256",
                 kv_cache_groups: tuple[KVCacheGroup, ...] = ()) -> None:
        from blockviz.model.explain import Explainer

        self.state = ReducerState.from_header({"block_size": block_size, "num_gpu_blocks": num_gpu_blocks,
                                                "num_cpu_blocks": num_cpu_blocks, "kv_manager": kv_manager,
                                                "kv_cache_groups": kv_cache_groups})
        self.explainer = Explainer(enable_prefix_caching, kv_manager, hash_algo, kv_cache_groups)
        self.radix = RadixHistory()  # SGLang's tree over time (kv_manager "sglang"): blockviz.model.radix_view
        self._ledger = Ledger()
        self.max_tokens: dict[int, int] = {}
        self.series: list[MemoryPoint] = []
        self._series_ends: list[int] = []  # each point's position, for bisect
        self.fed = 0
        self.dropped = 0  # events the followed timeline dropped from its front (a capped live one)

    @classmethod
    def for_header(cls, header: dict) -> "Insights":
        """For a trace header (or a live engine's): pool sizes and whether prefix caching is on."""
        return cls(header["block_size"], header["num_gpu_blocks"], header["num_cpu_blocks"],
                   bool(header.get("enable_prefix_caching", True)), kv_manager_of(header),
                   header.get("prefix_caching_hash_algo") or "sha256", kv_cache_groups_of(header))

    def sync(self, source) -> None:
        """Feed what it has not seen yet of `source`: a Timeline (whose capped front may have been
        dropped since: see `_follow_drop`) or a plain list that only ever grows."""
        events = getattr(source, "events", source)
        dropped = getattr(source, "dropped_events", 0)
        if dropped > self.dropped:
            self._follow_drop(source, dropped - self.dropped)
        state, explainer, ledger, radix = self.state, self.explainer, self._ledger, self.radix
        for event in events[self.fed:]:
            explainer.feed(event, state)
            radix.feed(event, state, self.fed + 1)
            state.apply(event)
            ledger.feed(event)
            self.fed += 1
            note_max_tokens(self.max_tokens, event)
            if isinstance(event, ev.StepFinished):
                truth = memory_truth(state, self.max_tokens)
                gpu = truth.pools["gpu"]
                self.series.append(MemoryPoint(event.step, self.fed, gpu.block_utilization, gpu.token_utilization,
                                               truth.internal_fragmentation, truth.reservation_waste()))
                self._series_ends.append(self.fed)

    def _follow_drop(self, timeline, shift: int) -> None:
        """The timeline dropped its oldest `shift` events: keep what is about the events it kept,
        with positions counted from its new front, and forget the finished requests it forgot. Had
        not every dropped event been fed, start again from the timeline's first kept state."""
        self.dropped += shift
        if self.fed < shift:  # as if fed up to the timeline's new front
            self.state = timeline.base_state()
            self.fed = self.explainer._fed = self._ledger._fed = shift
            self._ledger.forget_waiting()
        self.fed -= shift
        self.state.forget_finished()
        kept = {seq_id for seq_id in self.state.seqs}
        self.max_tokens = {seq_id: n for seq_id, n in self.max_tokens.items() if seq_id in kept}
        self.explainer.rebase(shift)
        self._ledger.rebase(shift)
        self.radix.rebase(shift, self.state)
        points = [replace(p, position=p.position - shift) for p in self.series if p.position > shift]
        self.series, self._series_ends = points, [p.position for p in points]

    def explanations(self, position: int) -> list:
        """The requests explained by `position` (allocated by then), in order of arrival."""
        return [e for e in self.explainer.explained if e.position <= position]

    def explanation_of(self, request_id: str, position: int, seq_id: int | None = None):
        """The explanation of `request_id`'s latest prefix lookup by `position` (a request preempted
        by recompute looks up again when admitted), of sequence `seq_id` where it has its own
        (vLLM v1's n > 1 children), else None."""
        mine = [e for e in self.explanations(position) if e.request_id == request_id]
        own = [e for e in mine if e.seq_id == seq_id]
        return (own or mine or [None])[-1]

    def ledger(self, position: int) -> list[Preemption]:
        """The preemptions by `position`; one that resumed later shows as not resumed yet."""
        return [e.as_of(position) for e in self._ledger.entries if e.position <= position]

    def memory_series(self, position: int) -> list[MemoryPoint]:
        """The memory figures at each step end by `position`."""
        return self.series[:bisect.bisect_right(self._series_ends, position)]


def ledger_totals(entries: list[Preemption]) -> str:
    """The ledger in one line: how many, by mode, blocks swapped or freed, tokens lost, waiting."""
    if not entries:
        return "no preemptions"
    swaps = [e for e in entries if e.mode == "swap"]
    text = f"preemptions {len(entries)}: {len(swaps)} swap ({plural(sum(e.blocks_swapped for e in swaps), 'block')} out)"
    recomputes = [e for e in entries if e.mode != "swap"]
    if recomputes:
        text += f", {len(recomputes)} recompute ({plural(sum(e.tokens_lost for e in recomputes), 'token')} lost)"
    waiting = sum(e.resumed_step is None for e in entries)
    return text + (f", {waiting} waiting" if waiting else "")

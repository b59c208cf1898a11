"""Engine operations: the runs of events that one call of the block manager or scheduler makes, and
the boundaries between them, where the drawn state is one the engine can be in.

The engine emits one event per mutation, so between two events of one call the reducer's picture
can be a state the engine never has: after a swap-out's copy but before its frees, the victim's
blocks sit in both pools; after a sequence's frees but before its table goes, its table points at
freed blocks; after an eviction but before the allocation it served, a block is drawn empty that the
same call hands out. The events carry no marker for where a call ends, so this module derives it
from their order, as the calls emit them:

- a preemption (`Preempted`) and its moves: the CPU blocks its swap-out evicted, the victim's
  `SwappedOut`, the CPU blocks hashed, its GPU `BlockFreed` and `SequenceFreed` (vLLM v0
  Scheduler._preempt_by_swap / _preempt_by_recompute, v1 Scheduler._preempt_request);
- a swap-out with no preemption announced, the CPU blocks hashed and its frees (BlockSpaceManager.swap_out);
- a swap-in and what follows it: the GPU blocks re-hashed, the CPU blocks freed (swap_in);
- a sequence's frees: its `BlockFreed` events and its `SequenceFreed` (BlockSpaceManager.free,
  KVCacheManager.free);
- a sliding window letting blocks go: its `BlocksSkipped` and the `BlockFreed` of each block it
  names (SingleTypeKVCacheManager.remove_skipped_blocks);
- an allocation for one sequence group: its `PrefixCacheHit` and `BlockAllocated` events and the
  hashes of the blocks it took (BlockSpaceManager.allocate, KVCacheManager.allocate_slots);
- an eviction and the allocation it served: `BlockEvicted` events, then the allocation, copy or
  swap-in that took the evicted blocks (CachedBlockAllocator.allocate → LRUEvictor.evict, v1
  BlockPool.get_new_blocks).

Every other event is an operation by itself. Cursors, cards, moments, breakpoints and exports land
on boundaries; stepping one event at a time still shows the inside and says it is inside
(`Operation.label`). `drawn_state_problems` states what a boundary guarantees; tests walk every
shipped trace and a live run with it.

No textual import: the model layer, read by the Timeline (blockviz/model/timeline.py).
"""

from __future__ import annotations

import bisect
from dataclasses import dataclass, field

from engine import events as ev

# What each operation is called where the views say a cursor is inside one.
KIND_WORDS = {
    "preemption": "a preemption and its moves",
    "swap-out": "a swap-out and its frees",
    "swap-in": "a swap-in and its frees",
    "free": "a sequence's frees",
    "window": "a sliding window's frees",
    "allocation": "an allocation and its hits",
    "eviction": "an eviction and the allocation it served",
}


@dataclass(frozen=True, slots=True)
class Operation:
    """One engine operation: events [start, end) of the stream (counted from its start, dropped
    events included); `end` None while it may still grow."""

    kind: str  # one of KIND_WORDS, or "event" for an event that is an operation by itself
    start: int
    end: int | None

    def label(self, position: int) -> str:
        """Where a cursor at `position` (same counting) stands inside it, in words."""
        done = position - self.start
        total = "" if self.end is None else f" of {self.end - self.start}"
        return f"inside {KIND_WORDS.get(self.kind, self.kind)} (event {done}{total}): not a state the engine stops in"


@dataclass(slots=True)
class _Open:
    """The operation being read: its kind, first event, and what it has touched so far."""

    kind: str
    start: int
    first: ev.Event
    seq_ids: frozenset[int] = frozenset()
    blocks: set[tuple[str, int]] = field(default_factory=set)  # blocks it took (allocations, swap-in)
    evicted: set[tuple[str, int]] = field(default_factory=set)
    swapped_in: ev.SwappedIn | None = None
    length: int = 1


def _begin(e: ev.Event, index: int) -> _Open | None:
    """The operation `e` opens (None: `e` is an operation by itself)."""
    if isinstance(e, ev.Preempted):
        return _Open("preemption", index, e, frozenset(e.seq_ids))
    if isinstance(e, ev.SwappedOut):
        return _Open("swap-out", index, e, frozenset(e.seq_ids), {("cpu", c) for _, c in e.mapping})
    if isinstance(e, ev.SwappedIn):
        return _Open("swap-in", index, e, frozenset(e.seq_ids), {("gpu", g) for _, g in e.mapping}, swapped_in=e)
    if isinstance(e, ev.BlockFreed):
        return _Open("free", index, e, frozenset({e.seq_id}))
    if isinstance(e, ev.BlocksSkipped):
        return _Open("window", index, e, frozenset({e.seq_id}), {("gpu", b) for b in e.blocks})
    if isinstance(e, (ev.BlockAllocated, ev.PrefixCacheHit)):
        return _Open("allocation", index, e, frozenset(e.seq_ids), {(e.device, e.block)})
    if isinstance(e, ev.BlockEvicted):
        return _Open("eviction", index, e, evicted={(e.device, e.block)})
    return None


# The event classes _begin opens no operation for (a token, a step's start or end, a digest, ...),
# noted as events are read, so each such event is passed by one set lookup.
_OPENS_NOTHING: set[type] = set()


def _swap_in_follower(op: _Open, e: ev.Event) -> bool:
    """A swap-in's re-hash of a GPU block it filled, or its free of a CPU block."""
    return ((isinstance(e, ev.BlockHashed) and ("gpu", e.block) in op.blocks)
            or (isinstance(e, ev.BlockFreed) and e.device == "cpu" and e.seq_id in op.seq_ids))


def _swap_out_follower(op: _Open, e: ev.Event) -> bool:
    """A swap-out's hash of a CPU block it filled, or its victim's GPU frees."""
    return ((isinstance(e, ev.BlockHashed) and (e.device, e.block) in op.blocks)
            or (isinstance(e, ev.BlockFreed) and e.device == "gpu" and e.seq_id in op.seq_ids)
            or (isinstance(e, ev.SequenceFreed) and e.seq_id in op.seq_ids))


def _continues(op: _Open, e: ev.Event) -> bool:
    """Whether `e` belongs to `op` (and, if so, note what it touched)."""
    kind = op.kind
    if kind in ("preemption", "swap-out"):
        if isinstance(e, ev.SwappedOut) and kind == "preemption" and e.request_id == op.first.request_id:
            op.blocks |= {("cpu", c) for _, c in e.mapping}
            return True
        if isinstance(e, ev.BlockEvicted) and kind == "preemption" and e.device == "cpu" and not op.blocks:
            return True  # the swap-out's CPU allocation made room
        return _swap_out_follower(op, e)
    if kind == "free":
        return ((isinstance(e, ev.BlockFreed) and e.seq_id in op.seq_ids and e.device == op.first.device)
                or (isinstance(e, ev.SequenceFreed) and e.seq_id in op.seq_ids))
    if kind == "swap-in":
        return _swap_in_follower(op, e)
    if kind == "window":
        return isinstance(e, ev.BlockFreed) and e.seq_id in op.seq_ids and (e.device, e.block) in op.blocks
    if kind == "allocation":
        if isinstance(e, (ev.BlockAllocated, ev.PrefixCacheHit)) and frozenset(e.seq_ids) == op.seq_ids:
            op.blocks.add((e.device, e.block))
            return True
        if isinstance(e, ev.BlockHashed) and (e.device, e.block) in op.blocks:
            return True
        return False
    # an eviction: more evictions, then what took the evicted blocks
    if isinstance(e, ev.BlockEvicted) and op.swapped_in is None:
        op.evicted.add((e.device, e.block))
        return True
    if op.swapped_in is not None and _swap_in_follower(op, e):
        return True
    if isinstance(e, ev.BlockAllocated) and ((e.device, e.block) in op.evicted or frozenset(e.seq_ids) == op.seq_ids):
        op.seq_ids = frozenset(e.seq_ids)
        op.blocks.add((e.device, e.block))
        return True
    if isinstance(e, ev.CopyOnWrite) and (e.device, e.dst_block) in op.evicted:
        return True
    if isinstance(e, ev.SwappedIn) and op.swapped_in is None and {("gpu", g) for _, g in e.mapping} & op.evicted:
        op.swapped_in, op.seq_ids = e, frozenset(e.seq_ids)
        op.blocks |= {("gpu", g) for _, g in e.mapping}
        return True
    if isinstance(e, ev.SwappedOut) and op.swapped_in is None and {("cpu", c) for _, c in e.mapping} & op.evicted:
        op.kind, op.seq_ids = "swap-out", frozenset(e.seq_ids)  # the swap-out it made room for goes on
        op.blocks |= {("cpu", c) for _, c in e.mapping}
        return True
    if isinstance(e, ev.BlockHashed) and (e.device, e.block) in op.blocks:
        return True
    return False


class Operations:
    """The operations of a growing event stream, read once as events arrive (Timeline.extend).

    Only operations of more than one event are kept (`_spans`); every other position is a
    boundary. Positions count from the stream's start; a capped timeline subtracts what it dropped.
    """

    def __init__(self) -> None:
        self._spans: list[tuple[int, int, str]] = []  # (start, end, kind) of each closed multi-event operation
        self._starts: list[int] = []
        self._open: _Open | None = None
        self.num_events = 0

    def add(self, e: ev.Event) -> bool:
        """Read the next event of the stream; returns whether it begins an operation (so the one
        before it has ended: a boundary lies just before it)."""
        index = self.num_events
        self.num_events += 1
        op = self._open
        if op is not None:
            if _continues(op, e):
                op.length += 1
                return False
            self.close()
        if type(e) in _OPENS_NOTHING:
            self._open = None
        else:
            self._open = _begin(e, index)
            if self._open is None:  # _begin asks only what class `e` is: no event of this class opens one
                _OPENS_NOTHING.add(type(e))
        return True

    def skip_to(self, index: int) -> None:
        """The stream's events before `index` were dropped unread (a capped live timeline): what
        was open has ended, and reading goes on from there."""
        if index > self.num_events:
            self.close()
            self.num_events = index

    def forget_before(self, index: int) -> None:
        """Forget the closed operations that end at or before stream position `index` (a capped
        timeline dropped their events), so what is kept is bounded by the cap, not the session."""
        keep = bisect.bisect_left(self._starts, index)
        if keep and self._spans[keep - 1][1] > index:
            keep -= 1  # it straddles the cut: a cursor may still land inside it
        del self._spans[:keep]
        del self._starts[:keep]

    def close(self) -> None:
        """The open operation has ended (the next event is not part of it, or the stream ended)."""
        op, self._open = self._open, None
        if op is not None and op.length > 1:
            self._spans.append((op.start, op.start + op.length, op.kind))
            self._starts.append(op.start)

    def at(self, position: int, settled: bool = False) -> Operation | None:
        """The operation a cursor at `position` (events applied) is inside, if any: past its first
        event, before its last. `settled`: the stream has ended, so the open operation is whole."""
        op = self._open
        if op is not None and op.start < position:
            end = op.start + op.length
            if position < end or (not settled and position == end):
                return Operation(op.kind, op.start, end if settled else None)
        index = bisect.bisect_left(self._starts, position) - 1
        if index >= 0:
            start, end, kind = self._spans[index]
            if start < position < end:
                return Operation(kind, start, end)
        return None


def drawn_state_problems(state) -> list[str]:
    """What is wrong with `state` (a ReducerState) as a picture of an engine at rest: a sequence's
    blocks in two pools, a ref count that is not the number of tables holding the block (and the
    copies to or from vLLM's CPU tier that pin it: `state.pinned`), a freed block in a table (every
    KV-cache group's; the null block in a window's slots is no block). Empty at every operation
    boundary."""
    from blockviz.model.reducer import FREE, NULL, USED

    problems = []
    holders: dict[tuple[str, int], set[int]] = {}
    tables = [item for group in range(state.num_kv_cache_groups) for item in state.tables_of(group).items()]
    for seq_id, table in tables:
        if len({device for device, _ in table}) > 1:
            problems.append(f"seq {seq_id}'s table spans both pools: {table}")
        for device, number in table:
            if state.pools[device][number].state == NULL:
                continue
            holders.setdefault((device, number), set()).add(seq_id)
            if state.pools[device][number].state != USED:
                problems.append(f"seq {seq_id}'s table holds {device} {number}, which is {state.pools[device][number].state}")
    for device, pool in state.pools.items():
        for block in pool:
            if block.state == NULL:
                continue
            seqs = holders.get((device, block.number), set())
            pins = state.pinned.get(block.number, 0) if device == "gpu" else 0
            if block.ref_count != len(seqs) + pins:
                problems.append(f"{device} {block.number} has ref count {block.ref_count} but {len(seqs)} tables hold it"
                                + (f" and {pins} copies pin it" if pins else ""))
            if (block.state == USED) != bool(seqs or pins):
                problems.append(f"{device} {block.number} is {block.state} and held by {sorted(seqs)}")
            if block.state == FREE and block.owners:
                problems.append(f"{device} {block.number} is free but owned by {sorted(block.owners)}")
    return problems

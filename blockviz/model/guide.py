"""Guided playback: where the story stops, and the card it shows there.

The first time an idea of paged KV-cache management happens in an event stream — a fork, a
copy-on-write, a prefix-cache hit, a swap out, a swap in, a recompute, an eviction, a request that
can never run — the guide makes a `Card`: a title, what happened (with the blocks, device and
number), one line of why, and the vLLM function that did it (v0's BlockSpaceManager, or v1's
KVCacheManager / BlockPool in v1 mode). An idea can span several events (a preemption's swap-out and
frees, a run of prefix hits, a run of evictions): its card's `position` is the cursor just after the
last of them, so the pools show the whole move when playback stops there.

`Guide.scan(events)` reads a growing event list (a live timeline's) once; an idea whose run may
still grow is open until an event that is not part of it arrives (`settle()` closes it at a
trace's end). Dispatch is by the event's record class. No textual import: the TUI and the notebook
draw the same cards.
"""

from __future__ import annotations

import bisect
from dataclasses import dataclass, field
from typing import Callable

from engine import events as ev

# The ideas, in the order a learner meets them in the default story.
IDEAS = ("forking", "copy-on-write", "prefix-hit", "swap-out", "eviction", "swap-in", "recompute", "never-runs")
# The event records an idea starts at: the TUI's default breakpoints (`]` plays to the next one).
GUIDE_KINDS: frozenset[type[ev.Event]] = frozenset({
    ev.Forked, ev.CopyOnWrite, ev.PrefixCacheHit, ev.Preempted, ev.SwappedOut, ev.SwappedIn, ev.BlockEvicted})

# The upstream function that does each idea (vLLM v0: vllm/core/block_manager_v1.py and
# vllm/core/scheduler.py; v1: vllm/v1/core/kv_cache_manager.py, block_pool.py, sched/scheduler.py).
FUNCTIONS = {
    "v0": {
        "forking": "BlockSpaceManager.fork",
        "copy-on-write": "BlockSpaceManager.append_slots (copy-on-write)",
        "prefix-hit": "BlockSpaceManager.allocate → CachedBlockAllocator.allocate(block_hash)",
        "swap-out": "Scheduler._preempt_by_swap → BlockSpaceManager.swap_out",
        "swap-in": "Scheduler._swap_in → BlockSpaceManager.swap_in",
        "recompute": "Scheduler._preempt_by_recompute → BlockSpaceManager.free",
        "eviction": "CachedBlockAllocator.allocate → LRUEvictor.evict",
        "never-runs": "BlockSpaceManager.can_allocate → AllocStatus.NEVER (Scheduler._schedule_prefills)",
    },
    "v1": {
        "prefix-hit": "KVCacheManager.get_computed_blocks",
        "recompute": "Scheduler._preempt_request → KVCacheManager.free",
        "eviction": "BlockPool.get_new_blocks → BlockPool._maybe_evict_cached_block",
        "never-runs": "Scheduler.schedule (the request cannot fit the pool)",
    },
}


@dataclass(frozen=True, slots=True)
class Card:
    """One stop of guided playback: the first time `idea` happened."""

    idea: str  # one of IDEAS
    title: str
    what: str  # what happened, with the blocks involved
    why: str  # one line of why
    function: str  # the vLLM function that did it
    blocks: tuple[tuple[str, int], ...]  # (device, number) of the blocks involved
    seq_no: int  # the first event of the idea
    start: int  # the index of that event in the stream (from its start, dropped events included)
    position: int  # the cursor where playback stops: just after the idea's last event (the same way)

    def blocks_on(self, device: str) -> frozenset[int]:
        return frozenset(number for d, number in self.blocks if d == device)


def _numbers(blocks) -> str:
    return ", ".join(str(b) for b in blocks)


def _plural(count: int, word: str) -> str:
    return f"{count} {word}{'' if count == 1 else 's'}"


@dataclass(slots=True)
class _Run:
    """An idea being read: its first event, the events that continue it, where it ends."""

    idea: str
    first: ev.Event
    follows: Callable[["_Run", ev.Event], bool]
    events: list[ev.Event] = field(default_factory=list)
    end: int = 0  # index just after its last event


# ---------------------------------------------------------------------------------- what continues an idea


def _moves_of_preemption(run: _Run, e: ev.Event) -> bool:
    p = run.first
    return ((isinstance(e, ev.SwappedOut) and e.request_id == p.request_id)
            or (isinstance(e, ev.BlockFreed) and e.device == "gpu" and e.seq_id in p.seq_ids))


def _swap_in_follows(run: _Run, e: ev.Event) -> bool:
    first = run.first
    return ((isinstance(e, ev.BlockFreed) and e.device == "cpu" and e.seq_id in first.seq_ids)
            or (isinstance(e, ev.BlockHashed) and any(e.block == gpu for _, gpu in first.mapping)))


def _more_hits(run: _Run, e: ev.Event) -> bool:
    return isinstance(e, ev.PrefixCacheHit) and e.seq_ids == run.first.seq_ids


def _more_evictions(run: _Run, e: ev.Event) -> bool:
    return isinstance(e, ev.BlockEvicted)


def _alone(run: _Run, e: ev.Event) -> bool:
    return False


def _starts(e: ev.Event) -> tuple[str, Callable[[_Run, ev.Event], bool]] | None:
    """The idea an event starts, with what continues it (None: it starts none)."""
    if isinstance(e, ev.Forked):
        return "forking", _alone
    if isinstance(e, ev.CopyOnWrite):
        return "copy-on-write", _alone
    if isinstance(e, ev.PrefixCacheHit):
        return "prefix-hit", _more_hits
    if isinstance(e, ev.Preempted):
        return ("swap-out" if e.mode == "swap" else "recompute"), _moves_of_preemption
    if isinstance(e, ev.SwappedOut):  # a swap-out with no preemption announced (a user's `p` in old traces)
        return "swap-out", _alone
    if isinstance(e, ev.SwappedIn):
        return "swap-in", _swap_in_follows
    if isinstance(e, ev.BlockEvicted):
        return "eviction", _more_evictions
    if isinstance(e, ev.SequenceFinished) and e.reason == "ignored":
        return "never-runs", _alone
    return None


# ---------------------------------------------------------------------------------- the cards


def _card(run: _Run, kv_manager: str) -> Card:
    title, what, why, blocks = _WORDS[run.idea](run.first, run.events)
    function = FUNCTIONS.get(kv_manager, {}).get(run.idea) or FUNCTIONS["v0"][run.idea]
    return Card(run.idea, title, what, why, function, tuple(blocks), run.first.seq_no,
                run.end - len(run.events), run.end)


def _fork_words(e: ev.Forked, events):
    return ("Fork: two samples, one prompt",
            f"seq {e.parent_seq_id} forked seq {e.child_seq_id}: both block tables now point at "
            f"{e.device} {_numbers(e.blocks)}, each block's ref count went up by one; nothing was copied",
            "the samples share a prompt, so they share its K/V until one of them writes",
            [(e.device, b) for b in e.blocks])


def _cow_words(e: ev.CopyOnWrite, events):
    return ("Copy-on-write",
            f"seq {e.seq_id} was about to write into {e.device} block {e.src_block}, which it shared: "
            f"its {_plural(len(e.token_ids), 'token')} were copied to block {e.dst_block}, which seq {e.seq_id} "
            f"owns alone; block {e.src_block} keeps {_plural(e.src_ref_count, 'other reference')}",
            "a shared block must never change under another sequence: the writer gets its own copy, "
            "only when it writes",
            [(e.device, e.src_block), (e.device, e.dst_block)])


def _hit_words(e: ev.PrefixCacheHit, events):
    blocks = [h.block for h in events]
    tokens = sum(len(h.token_ids) for h in events)
    return ("Prefix-cache hit",
            f"seq {', '.join(map(str, e.seq_ids))}'s prompt starts as an earlier one did: "
            f"{_plural(len(blocks), 'block')} ({e.device} {_numbers(blocks)}) found by their hash and shared, so "
            f"{_plural(tokens, 'token')} {'is' if tokens == 1 else 'are'} not computed again",
            "a full block's hash chains its tokens and every token before them: an equal hash means equal K/V",
            [(e.device, b) for b in blocks])


def _preempt_words(e: ev.Preempted | ev.SwappedOut, events):
    swaps = [m for m in events if isinstance(m, ev.SwappedOut)]
    freed = sorted({m.block for m in events if isinstance(m, ev.BlockFreed)})
    if isinstance(e, ev.SwappedOut) or e.mode == "swap":
        mapping = [pair for s in swaps for pair in s.mapping]
        request = e.request_id
        why = (f"{e.reason}: " if isinstance(e, ev.Preempted) else "") + \
            "the newest request gives way; its K/V waits in the CPU pool instead of being computed again"
        return ("Swap out (preemption)",
                f"request {request} was preempted by swap: GPU blocks {_numbers(g for g, _ in mapping)} copied "
                f"to CPU blocks {_numbers(c for _, c in mapping)}, and the GPU blocks freed",
                why, [("gpu", g) for g, _ in mapping] + [("cpu", c) for _, c in mapping])
    return ("Recompute (preemption)",
            f"request {e.request_id} was preempted by recompute: its GPU "
            f"{_plural(len(freed), 'block')} {_numbers(freed)} freed and "
            f"{_plural(e.num_tokens_lost, 'computed token')} thrown away, to compute again later",
            f"{e.reason}: a lone sequence costs less to compute again than to copy out and back",
            [("gpu", b) for b in freed])


def _swap_in_words(e: ev.SwappedIn, events):
    return ("Swap in",
            f"request {e.request_id} came back: CPU blocks {_numbers(c for c, _ in e.mapping)} copied to GPU "
            f"blocks {_numbers(g for _, g in e.mapping)}; it decodes on from where it stopped",
            "blocks freed up, and a swapped request goes before the waiting ones",
            [("cpu", c) for c, _ in e.mapping] + [("gpu", g) for _, g in e.mapping])


def _eviction_words(e: ev.BlockEvicted, events):
    blocks = [x.block for x in events]
    return ("Eviction",
            f"{_plural(len(blocks), 'block')} ({e.device} {_numbers(blocks)}) were free but still cached; the pool "
            f"needed room, so the least recently used lost {'its hash' if len(blocks) == 1 else 'their hashes'} "
            "and were taken",
            "a cached block is kept only while nobody needs the space: a later prompt with its tokens misses",
            [(e.device, b) for b in blocks])


def _never_words(e: ev.SequenceFinished, events):
    return ("A request that can never run",
            f"seq {e.seq_id} (request {e.request_id}) finished as ignored: {e.detail or 'it cannot fit'}",
            "waiting would never help: the engine says so and goes on, it never waits forever",
            [])


_WORDS = {
    "forking": _fork_words, "copy-on-write": _cow_words, "prefix-hit": _hit_words, "swap-out": _preempt_words,
    "recompute": _preempt_words, "swap-in": _swap_in_words, "eviction": _eviction_words,
    "never-runs": _never_words,
}


class Guide:
    """The cards of an event stream, one per idea at its first occurrence, read as events arrive."""

    def __init__(self, kv_manager: str = "v0") -> None:
        self.kv_manager = "v1" if kv_manager == "vllm" else kv_manager  # vLLM's own manager: v1's functions
        self.cards: list[Card] = []
        self._positions: list[int] = []  # each card's position, for bisect
        self._seen: set[str] = set()
        self._open: _Run | None = None
        self._scanned = 0
        # Events a capped live timeline dropped from its front (Timeline.dropped_events): cards
        # count positions from the stream's start, the methods below from the timeline's front
        self.offset = 0

    def scan(self, events: list[ev.Event], offset: int = 0) -> None:
        """Read what is new in `events`, the stream after its first `offset` events (the list
        grows; a capped timeline drops its front and says how many in `offset`)."""
        self.offset = offset
        if offset > self._scanned and self._open is not None:
            self._close()  # dropped before it was read to its end
        for index in range(max(self._scanned, offset), offset + len(events)):
            e = events[index - offset]
            run = self._open
            if run is not None:
                if run.follows(run, e):
                    run.events.append(e)
                    run.end = index + 1
                    continue
                self._close()
            started = _starts(e)
            if started is not None and started[0] not in self._seen:
                idea, follows = started
                self._seen.add(idea)
                self._open = _Run(idea, e, follows, [e], index + 1)
                if follows is _alone:
                    self._close()
        self._scanned = max(self._scanned, offset + len(events))

    def settle(self) -> None:
        """The stream has ended: close the idea still open."""
        if self._open is not None:
            self._close()

    def _close(self) -> None:
        run, self._open = self._open, None
        card = _card(run, self.kv_manager)
        self.cards.append(card)
        self._positions.append(card.position)

    def stop_of(self, card: Card) -> int:
        """Where playback stops for `card`, counted from the timeline's front."""
        return card.position - self.offset

    @property
    def open_start(self) -> int | None:
        """Where the idea still being read starts (its first event's index), if one is open."""
        run = self._open
        return None if run is None else run.end - len(run.events) - self.offset

    def next_stop(self, start: int, stop: int) -> int | None:
        """The first card position in (start, stop]."""
        index = bisect.bisect_right(self._positions, start + self.offset)
        if index < len(self._positions) and self._positions[index] <= stop + self.offset:
            return self._positions[index] - self.offset
        return None

    def spanning(self, position: int) -> Card | None:
        """The card whose idea is under way at `position` (past its first event, before its last)."""
        position += self.offset
        index = bisect.bisect_right(self._positions, position)
        if index < len(self.cards) and self.cards[index].start < position:
            return self.cards[index]
        return None

    def card_at(self, position: int) -> Card | None:
        """The card whose stop is `position`, if any."""
        index = bisect.bisect_left(self._positions, position + self.offset)
        if index < len(self._positions) and self._positions[index] == position + self.offset:
            return self.cards[index]
        return None

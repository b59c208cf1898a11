"""What vLLM told us: the state rebuilt from its KV-cache events alone (the model layer of
`blockviz attach`; no textual, no zmq, no torch).

vLLM's events say which hashed blocks entered and left its prefix cache, per data-parallel rank.
From them: the hash-chain forest (each stored block under its parent, with its token ids), which
blocks are cached now on each rank, stores and removals over time, and eviction churn. Nothing
else: vLLM does not send physical block ids, block tables, ref counts, hits or preemptions, so
those are `NotSent` values here, never guessed.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field

from blockviz.kvevents.protocol import AllBlocksCleared, BlockHash, BlockRemoved, BlockStored, UnknownEvent
from blockviz.kvevents.subscriber import ClientUpdate, Gap, Received

NOT_SENT_BY_VLLM = "not sent by vLLM"
MAX_TIMELINE = 10_000  # batches kept for the over-time view (the oldest go first)


class NotSent:
    """A value vLLM's KV events do not carry (falsy; its repr says so)."""

    __slots__ = ("what",)

    def __init__(self, what: str) -> None:
        self.what = what

    def __bool__(self) -> bool:
        return False

    def __repr__(self) -> str:
        return f"<{self.what}: {NOT_SENT_BY_VLLM}>"


# What the teaching engine shows and vLLM's events cannot: (name, why it is not there).
NOT_SENT = (
    ("physical block ids", "events name blocks by content hash only"),
    ("block tables", "which request holds which block is never published"),
    ("ref counts", "sharing between running requests is never published"),
    ("prefix-cache hits", "a reused block produces no event"),
    ("preemptions", "the scheduler's decisions are not KV-cache events"),
)


@dataclass(slots=True)
class HashNode:
    """One stored block, known by its hash: its parent, tokens, and the ranks caching it now."""

    block_hash: BlockHash
    parent_hash: BlockHash | None
    token_ids: tuple[int, ...]
    block_size: int
    medium: str | None
    ranks: set[int] = field(default_factory=set)
    times_stored: int = 0
    times_removed: int = 0

    @property
    def cached(self) -> bool:
        return bool(self.ranks)


@dataclass(slots=True)
class RankStats:
    """Per data-parallel rank: cache size now, block stores and removals, batches seen."""

    rank: int
    num_cached: int = 0
    num_stored: int = 0
    num_removed: int = 0
    num_cleared: int = 0
    num_batches: int = 0
    last_seq: int = -1

    @property
    def churn(self) -> float:
        """Removals per store: near 0 the cache keeps what it computes, near 1 it evicts as fast."""
        return self.num_removed / self.num_stored if self.num_stored else 0.0


@dataclass(frozen=True, slots=True)
class TimelinePoint:
    """One batch as applied: blocks stored and removed by it, the rank's cache size after it."""

    rank: int
    seq: int
    ts: float
    num_stored: int
    num_removed: int
    num_cached: int
    replayed: bool


class KVEventState:
    """The picture vLLM's events allow; feed it `apply_update(client.poll(...))` or `apply(received)`."""

    def __init__(self) -> None:
        self.nodes: dict[BlockHash, HashNode] = {}
        self.children: dict[BlockHash | None, list[BlockHash]] = {}
        self.cached: dict[int, set[BlockHash]] = {}  # rank -> hashes cached there now
        self.ranks: dict[int, RankStats] = {}
        self.timeline: deque[TimelinePoint] = deque(maxlen=MAX_TIMELINE)
        self.log: list[tuple[str, int, BlockHash]] = []  # ("stored" | "removed", rank, hash), in order
        self.gaps: list[Gap] = []
        self.notices: list[str] = []
        self.num_batches = 0
        self.num_unknown_events = 0
        self.num_removed_unseen = 0  # removals of hashes whose store was never seen

    # ------------------------------------------------------------------ what vLLM does not send

    block_ids = NotSent("physical block ids")
    block_tables = NotSent("block tables")
    ref_counts = NotSent("ref counts")
    hits = NotSent("prefix-cache hits")
    preemptions = NotSent("preemptions")

    # ------------------------------------------------------------------ applying events

    def apply_update(self, update: ClientUpdate) -> None:
        for received in update.received:
            self.apply(received)
        self.gaps += update.gaps
        self.notices += update.notices

    def apply(self, received: Received) -> None:
        """Apply one batch's events in order, for the rank that sent it."""
        rank = received.rank
        stats = self.ranks.setdefault(rank, RankStats(rank))
        cached = self.cached.setdefault(rank, set())
        stored = removed = 0
        for event in received.batch.events:
            if isinstance(event, BlockStored):
                stored += self._store(event, rank, cached)
            elif isinstance(event, BlockRemoved):
                removed += self._remove(event.block_hashes, rank, cached)
            elif isinstance(event, AllBlocksCleared):
                removed += self._remove(tuple(cached), rank, cached)
                stats.num_cleared += 1
            elif isinstance(event, UnknownEvent):
                self.num_unknown_events += 1
        stats.num_stored += stored
        stats.num_removed += removed
        stats.num_cached = len(cached)
        stats.num_batches += 1
        stats.last_seq = max(stats.last_seq, received.seq)
        self.num_batches += 1
        self.timeline.append(TimelinePoint(rank, received.seq, received.batch.ts, stored, removed,
                                           len(cached), received.replayed))

    def _store(self, event: BlockStored, rank: int, cached: set[BlockHash]) -> int:
        for block_hash, parent, token_ids in event.blocks():
            node = self.nodes.get(block_hash)
            if node is None:
                node = self.nodes[block_hash] = HashNode(block_hash, parent, token_ids, event.block_size, event.medium)
                self.children.setdefault(parent, []).append(block_hash)
            node.ranks.add(rank)
            node.times_stored += 1
            cached.add(block_hash)
            self.log.append(("stored", rank, block_hash))
        return len(event.block_hashes)

    def _remove(self, hashes: tuple[BlockHash, ...], rank: int, cached: set[BlockHash]) -> int:
        for block_hash in hashes:
            node = self.nodes.get(block_hash)
            if node is None:
                self.num_removed_unseen += 1
            else:
                node.ranks.discard(rank)
                node.times_removed += 1
            cached.discard(block_hash)
            self.log.append(("removed", rank, block_hash))
        return len(hashes)

    # ------------------------------------------------------------------ queries

    @property
    def num_cached(self) -> int:
        """Blocks cached now, summed over ranks."""
        return sum(len(hashes) for hashes in self.cached.values())

    def stored_hashes(self) -> set[BlockHash]:
        return {h for kind, _, h in self.log if kind == "stored"}

    def removed_hashes(self) -> set[BlockHash]:
        return {h for kind, _, h in self.log if kind == "removed"}

    def roots(self) -> list[BlockHash]:
        """Hashes whose parent is None (a prompt's first block) or was never seen stored."""
        return [h for h, node in self.nodes.items() if node.parent_hash is None or node.parent_hash not in self.nodes]

    def children_of(self, block_hash: BlockHash) -> list[BlockHash]:
        return self.children.get(block_hash, [])

    def chain_tokens(self, block_hash: BlockHash) -> tuple[int, ...]:
        """The token ids of the whole prefix ending with this block (as far as its parents are known)."""
        chunks, seen, node = [], set(), self.nodes.get(block_hash)
        while node is not None and node.block_hash not in seen:  # a malformed stream could loop
            seen.add(node.block_hash)
            chunks.append(node.token_ids)
            node = self.nodes.get(node.parent_hash) if node.parent_hash is not None else None
        return tuple(t for chunk in reversed(chunks) for t in chunk)

    @property
    def num_lost_batches(self) -> int:
        """Batches missed and not recovered through replay."""
        return sum(gap.num_lost for gap in self.gaps)

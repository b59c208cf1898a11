"""What vLLM told us: the state rebuilt from its KV-cache events alone (the model layer of
`blockviz attach`; no textual, no zmq, no torch).

vLLM's events say which hashed blocks entered and left its prefix cache, per data-parallel rank,
and in which tier (`medium`: GPU, CPU, ...; `locality`: local or remote to the publisher). From
them: the hash-chain forest (each stored block under its parent, with its token ids), which blocks
are cached now where, stores and removals over time, eviction churn, and the wire format seen.
Nothing else: vLLM does not send physical block ids, block tables, ref counts, hits or
preemptions, so those are `NotSent` values here, never guessed.

Memory is bounded for a session of any length and any publisher: the forest keeps the blocks
cached now, at most MAX_CACHED_BLOCKS placements (a block in one rank, tier and KV-cache group),
plus the MAX_REMOVED_KEPT most recently removed ones (older removed blocks are forgotten); a rank's
blocks live in at most MAX_PLACES_PER_RANK (tier, group) places; stores past either cap are
dropped, counted (num_dropped_blocks) and said in a notice. Each block's bytes are bounded too:
at most MAX_TOKENS_PER_BLOCK of its token ids are kept, and MAX_TOKENS_KEPT over the forest; a
string field kept (`medium`, `locality`, `session_id`, the cache-spec kind) is cut to
MAX_FIELD_CHARS; a block hash sent as more than MAX_HASH_BYTES bytes is kept as its BLAKE2b digest
(the same hash always gives the same digest, so its removal still finds it). Each of these is
counted and said by `limits_summary()`. The store and removal log, the timeline, the gaps and the
notices keep their newest entries only. A batch's work is proportional
to its events (the counts per tier are kept as blocks come and go, never recounted).
"""

from __future__ import annotations

import hashlib
from collections import OrderedDict, deque
from dataclasses import dataclass, field

from blockviz.kvevents.protocol import (
    MEDIUM_GPU,
    AllBlocksCleared,
    BlockHash,
    BlockRemoved,
    BlockStored,
    SGLANG_TOO,
    WIRE_FORMATS,
    UnknownEvent,
    WireShape,
    release_text,
)
from blockviz.kvevents.subscriber import ClientUpdate, Gap, Received

NOT_SENT_BY_VLLM = "not sent by vLLM"
MAX_TIMELINE = 10_000  # batches kept for the over-time view (the oldest go first)
MAX_REMOVED_KEPT = 10_000  # removed blocks the forest still shows (the longest removed are forgotten)
MAX_LOG = 100_000  # stores and removals kept in the log
MAX_GAPS = 1_000  # gaps kept for the view (all are counted)
MAX_NOTICES = 1_000  # notices kept for the view (all are counted)
MAX_CACHED_BLOCKS = 1 << 18  # blocks cached now, summed over places (stores past it are dropped)
MAX_PLACES_PER_RANK = 256  # (tier, KV-cache group) places per rank (vLLM has a few groups per model)
MAX_TOKENS_PER_BLOCK = 1024  # token ids kept per block (a block's size in tokens is vLLM's block_size)
MAX_TOKENS_KEPT = 1 << 22  # token ids kept over the whole forest (a node past it keeps none)
MAX_FIELD_CHARS = 64  # characters kept of a string field (vLLM's media, kinds and session ids are short)
MAX_HASH_BYTES = 64  # a bytes block hash longer than this is kept as its digest (vLLM's are 32 bytes)

Tier = tuple[str, str | None]
"""Where a cached block lives: (medium, locality), e.g. ("GPU", None) or ("CPU", "REMOTE")."""


def tier_of(medium: str | None, locality: str | None) -> Tier:
    """An event's tier; no medium (vLLM 0.9 sent none) is the GPU, where vLLM's own pool is."""
    return (medium or MEDIUM_GPU, locality)


def tier_label(tier: Tier) -> str:
    """The medium, and the locality when one was sent: "GPU", "CPU remote"."""
    medium, locality = tier
    return medium if locality is None else f"{medium} {locality.lower()}"


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
    """One stored block, known by its hash: its parent, tokens, and where it is cached now
    (a set of (rank, tier, KV-cache group))."""

    block_hash: BlockHash
    parent_hash: BlockHash | None
    token_ids: tuple[int, ...]
    block_size: int
    medium: str | None
    places: set[tuple[int, Tier, int | None]] = field(default_factory=set)
    times_stored: int = 0
    times_removed: int = 0
    session_id: str | None = None

    @property
    def cached(self) -> bool:
        return bool(self.places)

    @property
    def ranks(self) -> set[int]:
        """The data-parallel ranks caching it now (in any tier)."""
        return {rank for rank, _, _ in self.places}

    @property
    def tiers(self) -> set[Tier]:
        """The tiers holding it now (on any rank)."""
        return {tier for _, tier, _ in self.places}


@dataclass(slots=True)
class RankStats:
    """Per data-parallel rank: cache size now (per tier too), block stores and removals, batches
    seen, publisher restarts, and the wire shape its batches came in."""

    rank: int
    num_cached: int = 0
    num_stored: int = 0
    num_removed: int = 0
    num_cleared: int = 0
    num_batches: int = 0
    num_restarts: int = 0
    last_seq: int = -1
    cached_by_tier: dict[Tier, int] = field(default_factory=dict)
    group_kinds: dict[int, str] = field(default_factory=dict)  # KV-cache group -> its spec kind
    shape: WireShape | None = None

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

    def __init__(self, max_removed_kept: int = MAX_REMOVED_KEPT, max_cached: int = MAX_CACHED_BLOCKS,
                 max_places_per_rank: int = MAX_PLACES_PER_RANK, max_tokens_kept: int = MAX_TOKENS_KEPT) -> None:
        self.nodes: dict[BlockHash, HashNode] = {}
        self.children: dict[BlockHash | None, dict[BlockHash, None]] = {}  # parent -> children, in order
        self.cached: dict[tuple[int, Tier, int | None], set[BlockHash]] = {}  # (rank, tier, group) -> hashes
        self.places_of_rank: dict[int, set[tuple[int, Tier, int | None]]] = {}  # rank -> its keys of `cached`
        self.num_cached = 0  # blocks cached now, summed over ranks, tiers and groups
        self.max_cached = max_cached
        self.max_places_per_rank = max_places_per_rank
        self.num_dropped_blocks = 0  # stores dropped: past max_cached, or into a place past max_places_per_rank
        self.max_tokens_kept = max_tokens_kept
        self.num_tokens_kept = 0  # token ids the forest's nodes hold
        self.num_dropped_tokens = 0  # token ids sent and not kept (past MAX_TOKENS_PER_BLOCK or max_tokens_kept)
        self.num_cut_fields = 0  # string fields cut to MAX_FIELD_CHARS
        self.num_digested_hashes = 0  # bytes hashes longer than MAX_HASH_BYTES kept as their digest
        self.removed: OrderedDict[BlockHash, None] = OrderedDict()  # nodes cached nowhere, oldest first
        self.max_removed_kept = max_removed_kept
        self.num_forgotten = 0  # removed nodes dropped from the forest to bound its size
        self.ranks: dict[int, RankStats] = {}
        self.timeline: deque[TimelinePoint] = deque(maxlen=MAX_TIMELINE)
        self.log: deque[tuple[str, int, BlockHash]] = deque(maxlen=MAX_LOG)  # ("stored" | "removed", rank, hash)
        self.gaps: deque[Gap] = deque(maxlen=MAX_GAPS)
        self.notices: deque[str] = deque(maxlen=MAX_NOTICES)
        self.num_gaps = 0
        self.num_notices = 0
        self.num_lost_batches = 0  # batches missed and not recovered through replay
        self.num_batches = 0
        self.num_unknown_events = 0
        self.num_removed_unseen = 0  # removals of hashes whose store was never seen
        self.replay_topic: bool | None = None  # whether replay answers carried a topic frame

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
        for gap in update.gaps:
            self.gaps.append(gap)
            self.num_lost_batches += gap.num_lost
        self.num_gaps += len(update.gaps)
        self.notices.extend(update.notices)
        self.num_notices += len(update.notices)
        if update.replay_topic is not None:
            self.replay_topic = update.replay_topic

    def apply(self, received: Received) -> None:
        """Apply one batch's events in order, for the rank that sent it."""
        rank = received.rank
        stats = self.ranks.setdefault(rank, RankStats(rank))
        if received.restarted:
            self.reset_rank(rank)
        if received.shape is not None and (received.shape.event_arrays is not None or stats.shape is None):
            stats.shape = received.shape  # a batch with no events does not say how events come
        stored = removed = 0
        for event in received.batch.events:
            if isinstance(event, BlockStored):
                stored += self._store(event, rank)
            elif isinstance(event, BlockRemoved):
                removed += self._remove(tuple(map(self._hash, event.block_hashes)), rank,
                                        tier_of(self._cut(event.medium), self._cut(event.locality)), event.group_idx)
            elif isinstance(event, AllBlocksCleared):
                removed += self._clear(rank)
                stats.num_cleared += 1
            elif isinstance(event, UnknownEvent):
                self.num_unknown_events += 1
        stats.num_stored += stored
        stats.num_removed += removed
        stats.num_batches += 1
        if received.followed:
            stats.last_seq = received.seq if received.restarted else max(stats.last_seq, received.seq)
        self.num_batches += 1
        self.timeline.append(TimelinePoint(rank, received.seq, received.batch.ts, stored, removed,
                                           stats.num_cached, received.replayed))
        self._forget_removed()

    def reset_rank(self, rank: int) -> None:
        """The rank's publisher restarted: what it cached before is gone (not counted as removals)."""
        stats = self.ranks.setdefault(rank, RankStats(rank))
        for place in self.places_of_rank.pop(rank, set()):
            hashes = self.cached.pop(place)
            self._uncount(place, len(hashes))
            for block_hash in hashes:
                self._leave(block_hash, place)
        stats.num_restarts += 1
        stats.last_seq = -1

    def _place(self, place: tuple[int, Tier, int | None]) -> set[BlockHash] | None:
        """The hashes cached at `place`, a new empty set for a new place, or None when the rank
        already has max_places_per_rank places (a notice says so once)."""
        cached = self.cached.get(place)
        if cached is None:
            places = self.places_of_rank.setdefault(place[0], set())
            if len(places) >= self.max_places_per_rank:
                return None
            places.add(place)
            cached = self.cached[place] = set()
        return cached

    def _uncount(self, place: tuple[int, Tier, int | None], count: int) -> None:
        """`count` blocks left `place`: the rank's counts (per tier and in all) and the state's."""
        stats = self.ranks[place[0]]
        tier = place[1]
        left = stats.cached_by_tier.get(tier, 0) - count
        if left:
            stats.cached_by_tier[tier] = left
        else:
            stats.cached_by_tier.pop(tier, None)
        stats.num_cached -= count
        self.num_cached -= count

    def _drop(self, count: int, why: str) -> None:
        """`count` stored blocks not kept; the first drop is a notice."""
        if not self.num_dropped_blocks:
            self.notices.append(f"stores dropped from here on: {why} (attach keeps its memory bounded)")
            self.num_notices += 1
        self.num_dropped_blocks += count

    def _cut(self, text: str | None) -> str | None:
        """A string field as kept: its first MAX_FIELD_CHARS characters (a longer one is counted)."""
        if text is None or len(text) <= MAX_FIELD_CHARS:
            return text
        self.num_cut_fields += 1
        return text[:MAX_FIELD_CHARS - 1] + "…"

    def _hash(self, block_hash: BlockHash | None) -> BlockHash | None:
        """A block hash as kept: a bytes hash longer than MAX_HASH_BYTES as its BLAKE2b digest."""
        if isinstance(block_hash, bytes) and len(block_hash) > MAX_HASH_BYTES:
            self.num_digested_hashes += 1
            return hashlib.blake2b(block_hash, digest_size=32).digest()
        return block_hash

    def _store(self, event: BlockStored, rank: int) -> int:
        medium = self._cut(event.medium)
        place = (rank, tier_of(medium, self._cut(event.locality)), event.group_idx)
        cached = self._place(place)
        if cached is None:
            self._drop(len(event.block_hashes), f"rank {rank} has {self.max_places_per_rank} (tier, "
                                                 "KV-cache group) places, the most attach keeps")
            return len(event.block_hashes)
        stats = self.ranks[rank]
        kind = self._cut(event.kv_cache_spec_kind)
        if event.group_idx is not None and kind is not None and (
                event.group_idx in stats.group_kinds or len(stats.group_kinds) < self.max_places_per_rank):
            stats.group_kinds[event.group_idx] = kind
        session_id = self._cut(event.session_id)
        size = max(event.block_size, 1)
        for index, (block_hash, parent, token_ids) in enumerate(event.blocks(MAX_TOKENS_PER_BLOCK)):
            block_hash, parent = self._hash(block_hash), self._hash(parent)
            sent = max(0, min(size, len(event.token_ids) - index * size))
            if block_hash not in cached and self.num_cached >= self.max_cached:
                self._drop(1, f"{self.max_cached:,} blocks are cached, the most attach keeps")
                continue
            node = self.nodes.get(block_hash)
            if node is None:
                token_ids = token_ids[:max(0, self.max_tokens_kept - self.num_tokens_kept)]
                self.num_tokens_kept += len(token_ids)
                self.num_dropped_tokens += sent - len(token_ids)
                node = self.nodes[block_hash] = HashNode(block_hash, parent, token_ids, event.block_size, medium)
                self.children.setdefault(parent, {})[block_hash] = None
            node.places.add(place)
            node.times_stored += 1
            node.session_id = session_id or node.session_id
            self.removed.pop(block_hash, None)
            if block_hash not in cached:
                cached.add(block_hash)
                stats.cached_by_tier[place[1]] = stats.cached_by_tier.get(place[1], 0) + 1
                stats.num_cached += 1
                self.num_cached += 1
            self.log.append(("stored", rank, block_hash))
        return len(event.block_hashes)

    def _remove(self, hashes: tuple[BlockHash, ...], rank: int, tier: Tier, group: int | None) -> int:
        place = (rank, tier, group)
        cached = self.cached.get(place, set())
        for block_hash in hashes:
            node = self.nodes.get(block_hash)
            if node is None:
                self.num_removed_unseen += 1
            else:
                node.times_removed += 1
            if block_hash in cached:
                cached.discard(block_hash)
                self._uncount(place, 1)
            self._leave(block_hash, place)
            self.log.append(("removed", rank, block_hash))
        if place in self.cached and not cached:  # an empty place no longer counts against the cap
            del self.cached[place]
            self.places_of_rank[rank].discard(place)
        return len(hashes)

    def _clear(self, rank: int) -> int:
        """AllBlocksCleared: every tier of the rank (vLLM BlockPool.reset_prefix_cache)."""
        removed = 0
        for place in self.places_of_rank.pop(rank, set()):
            hashes = self.cached.pop(place)
            self._uncount(place, len(hashes))
            for block_hash in hashes:
                node = self.nodes.get(block_hash)
                if node is not None:
                    node.times_removed += 1
                self._leave(block_hash, place)
                self.log.append(("removed", rank, block_hash))
            removed += len(hashes)
        return removed

    def _leave(self, block_hash: BlockHash, place: tuple[int, Tier, int | None]) -> None:
        node = self.nodes.get(block_hash)
        if node is None:
            return
        node.places.discard(place)
        if not node.places:
            self.removed[block_hash] = None
            self.removed.move_to_end(block_hash)

    def _forget_removed(self) -> None:
        """Drop the longest-removed nodes beyond max_removed_kept (the forest stays bounded)."""
        while len(self.removed) > self.max_removed_kept:
            block_hash, _ = self.removed.popitem(last=False)
            node = self.nodes.pop(block_hash)
            self.num_tokens_kept -= len(node.token_ids)
            siblings = self.children.get(node.parent_hash)
            if siblings is not None:
                siblings.pop(block_hash, None)
                if not siblings and node.parent_hash not in self.nodes:
                    del self.children[node.parent_hash]
            if not self.children.get(block_hash):
                self.children.pop(block_hash, None)
            self.num_forgotten += 1

    # ------------------------------------------------------------------ queries

    def limits_summary(self) -> str:
        """One line on what the caps left out (stores dropped, removed blocks forgotten, token ids
        not kept, string fields cut, long hashes digested), or ""."""
        parts = []
        if self.num_dropped_blocks:
            parts.append(f"{self.num_dropped_blocks:,} stored blocks dropped (caps: {self.max_cached:,} cached "
                         f"blocks, {self.max_places_per_rank} places per rank)")
        if self.num_forgotten:
            parts.append(f"{self.num_forgotten:,} removed blocks forgotten (the newest {self.max_removed_kept:,} kept)")
        if self.num_dropped_tokens:
            parts.append(f"{self.num_dropped_tokens:,} token ids not kept (caps: {MAX_TOKENS_PER_BLOCK:,} per block, "
                         f"{self.max_tokens_kept:,} in all)")
        if self.num_cut_fields:
            parts.append(f"{self.num_cut_fields:,} string fields cut to {MAX_FIELD_CHARS} characters")
        if self.num_digested_hashes:
            parts.append(f"{self.num_digested_hashes:,} block hashes over {MAX_HASH_BYTES} bytes kept as their digest")
        return "; ".join(parts)

    def stored_hashes(self) -> set[BlockHash]:
        """Hashes stored, as far back as the log goes."""
        return {h for kind, _, h in self.log if kind == "stored"}

    def removed_hashes(self) -> set[BlockHash]:
        """Hashes removed, as far back as the log goes."""
        return {h for kind, _, h in self.log if kind == "removed"}

    def roots(self) -> list[BlockHash]:
        """Hashes whose parent is None (a prompt's first block) or is not in the forest."""
        return [h for h, node in self.nodes.items() if node.parent_hash is None or node.parent_hash not in self.nodes]

    def children_of(self, block_hash: BlockHash) -> list[BlockHash]:
        return list(self.children.get(block_hash, ()))

    def chain_tokens(self, block_hash: BlockHash) -> tuple[int, ...]:
        """The token ids of the whole prefix ending with this block (as far as its parents are known)."""
        chunks, seen, node = [], set(), self.nodes.get(block_hash)
        while node is not None and node.block_hash not in seen:  # a malformed stream could loop
            seen.add(node.block_hash)
            chunks.append(node.token_ids)
            node = self.nodes.get(node.parent_hash) if node.parent_hash is not None else None
        return tuple(t for chunk in reversed(chunks) for t in chunk)

    @property
    def shapes(self) -> set[WireShape]:
        """The wire shapes batches came in, over all ranks."""
        return {stats.shape for stats in self.ranks.values() if stats.shape is not None}

    def wire_summary(self) -> str:
        """What the wire said about the sender's vLLM: the batch shape, and the replay framing
        once a replay answered ("vLLM 0.26 or later: array batch, map events, topic in replay")."""
        shapes = self.shapes
        if not shapes:
            return "no batch yet"
        if len(shapes) > 1:
            return "mixed: " + "; ".join(sorted(shape.describe() for shape in shapes))
        shape = next(iter(shapes))
        if self.replay_topic is None or not shape.batch_array or shape.event_arrays is not False:
            return shape.describe()
        if self.replay_topic:
            return (f"vLLM {release_text(WIRE_FORMATS[2].first)} or later: array batch, map events, topic in replay"
                    f"{SGLANG_TOO}")
        return f"{WIRE_FORMATS[1].releases}: array batch, map events, no topic in replay"

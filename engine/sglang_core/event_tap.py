"""blockviz's events from SGLang's real state: what changed in the RadixCache's tree and in the
requests' rows of KV slots since the last look (engine/sglang_core/scheduler.py looks after each
SGLang call that changes them).

The tree: every TreeNode under `RadixCache.root_node` as (parent id, token run, slots, lock_ref),
compared with the last look. A new node that took the head of an old node's run (same parent, a
prefix of its tokens) is a split (RadixCache._split_node); any other new node an insert; a node
whose lock_ref moved a lock change (inc_lock_ref / dec_lock_ref); a node gone an eviction (leaves
first), after each call of RadixCache.evict since the last look (`note_evict`: what it was asked
to free and what it freed). Node ids are SGLang's TreeNode.id counted from the cache's root
(never reused within a run).

The pages (our blocks): a page in a request's table is held by it (ref_count: the requests holding
it); a page of the tree is cached, its hash a digest of the whole prefix up to the page's end
(as vLLM's chained block hash names a prefix: SGLang keys pages by their tokens, so the hash is
ours, only a name for the views). From the two, the events every view draws: BlockHashed when a
page enters the tree, BlockEvicted when it leaves it unheld, BlockFreed when a request lets it go
(cached when the tree keeps it), PrefixCacheHit when a request's new page was the tree's,
BlockAllocated for a fresh one, SlotAppended for a token written into a page it held already.
"""

from __future__ import annotations

import hashlib
import struct
from typing import Any, NamedTuple

from engine.events import (BlockAllocated, BlockEvicted, BlockFreed, BlockHashed, EventBus, PrefixCacheHit,
                           RadixEvict, RadixLockRef, RadixNodeEvicted, RadixNodeInserted, RadixNodeSplit,
                           SequenceFreed, SlotAppended)

GPU = "gpu"


class Node(NamedTuple):
    """One TreeNode as the events describe it."""

    parent_id: int | None  # None: a child of the root
    token_ids: tuple[int, ...]
    slots: tuple[int, ...]
    lock_ref: int


class CachedPage(NamedTuple):
    """A page the tree holds: its prefix's hash, the previous page's, and its tokens."""

    block_hash: int
    parent_hash: int | None
    token_ids: tuple[int, ...]


def tree_nodes(cache: Any, base: int | None = None) -> dict[int, Node]:
    """Every node of SGLang's RadixCache but the root, by its TreeNode.id less `base` (the root's
    id when the cache was built, the default): SGLang numbers nodes from one counter for the whole
    process (TreeNode.counter), so ids counted from the cache's own root are the same for the same
    run whatever ran before it in the process."""
    root = cache.root_node
    base = root.id if base is None else base
    nodes: dict[int, Node] = {}
    stack = [root]
    while stack:
        node = stack.pop()
        parent_id = None if node is root else node.id - base
        for child in node.children.values():
            nodes[child.id - base] = Node(parent_id, tuple(child.key.token_ids), tuple(child.value.tolist()),
                                          child.lock_ref)
            stack.append(child)
    return nodes


def prefix_hash(prior: bytes, token_ids: tuple[int, ...]) -> bytes:
    """SHA-256 over the previous page's digest and this page's token ids (little-endian int64)."""
    return hashlib.sha256(prior + struct.pack(f"<{len(token_ids)}q", *token_ids)).digest()


def page_name(digest: bytes) -> int:
    """A page's hash as the events carry it: the first 8 bytes of its prefix's digest, made positive."""
    return int.from_bytes(digest[:8], "little") >> 1


def cached_pages(nodes: dict[int, Node], page_size: int) -> dict[int, CachedPage]:
    """page -> its CachedPage, for every page of the tree's nodes (SGLang keeps node runs page
    aligned: a run holds whole pages)."""
    children: dict[int | None, list[int]] = {}
    for node_id, node in nodes.items():
        children.setdefault(node.parent_id, []).append(node_id)
    pages: dict[int, CachedPage] = {}
    stack: list[tuple[int | None, bytes, int | None]] = [(None, b"", None)]
    while stack:
        parent, digest, parent_hash = stack.pop()
        for node_id in children.get(parent, ()):
            node = nodes[node_id]
            node_digest, node_parent = digest, parent_hash
            for start in range(0, len(node.slots), page_size):
                token_ids = node.token_ids[start:start + page_size]
                node_digest = prefix_hash(node_digest, token_ids)
                block_hash = page_name(node_digest)
                pages[node.slots[start] // page_size] = CachedPage(block_hash, node_parent, token_ids)
                node_parent = block_hash
            stack.append((node_id, node_digest, node_parent))
    return pages


class SglangEventTap:
    """Emits the tree's and the pages' changes since the last `sync`."""

    def __init__(self, cache: Any, events: EventBus, page_size: int) -> None:
        self.cache = cache
        self.base = cache.root_node.id  # node ids are counted from it (tree_nodes)
        self.events = events
        self.page_size = page_size
        self.nodes: dict[int, Node] = {}
        self.pages: dict[int, CachedPage] = {}
        self.tables: dict[int, tuple[int, ...]] = {}  # seq id -> its pages, as last emitted
        self.evictions: list[tuple[int, int]] = []  # RadixCache.evict calls since the last sync: (asked, freed)

    def note_evict(self, num_tokens: int, num_tokens_evicted: int) -> None:
        """RadixCache.evict was called (EvictParams.num_tokens) and freed `num_tokens_evicted`
        slots (EvictResult): emitted as RadixEvict by the next sync, before the leaves it took."""
        self.evictions.append((num_tokens, num_tokens_evicted))

    def sync(self, tables: dict[int, tuple[int, ...]], tokens: dict[int, tuple[list[int], int, int]]) -> None:
        """Emit what changed: the tree's nodes, then the pages. `tables`: seq id -> its pages now
        (a sequence left out holds none); `tokens`: seq id -> (its token ids, the first token the
        step writes, the tokens written after it), for the sequences a step runs."""
        nodes = tree_nodes(self.cache, self.base)
        evictions, self.evictions = self.evictions, []
        if not self.events.active:
            self.nodes, self.tables = nodes, dict(tables)
            self.pages = cached_pages(nodes, self.page_size)
            return
        self._emit_tree(nodes, evictions)
        self._emit_pages(cached_pages(nodes, self.page_size), tables, tokens)

    # ------------------------------------------------------------------ the tree

    def _emit_tree(self, nodes: dict[int, Node], evictions: list[tuple[int, int]]) -> None:
        emit, work = self.events.emit, dict(self.nodes)
        new_ids = sorted(node_id for node_id in nodes if node_id not in work)
        inserted = []
        for node_id in new_ids:
            node = nodes[node_id]
            split = next((old_id for old_id, old in work.items()
                          if old_id in nodes and old.parent_id == node.parent_id
                          and len(old.token_ids) > len(node.token_ids)
                          and old.token_ids[:len(node.token_ids)] == node.token_ids
                          and old.slots[:len(node.slots)] == node.slots), None)
            if split is None:
                inserted.append(node_id)
                continue
            old, size = work[split], len(node.token_ids)
            emit(RadixNodeSplit, node_id=split, new_node_id=node_id, num_tokens=size)
            work[node_id] = Node(old.parent_id, old.token_ids[:size], old.slots[:size], old.lock_ref)
            work[split] = Node(node_id, old.token_ids[size:], old.slots[size:], old.lock_ref)
        for node_id in sorted(inserted, key=lambda node_id: _depth(nodes, node_id)):  # parents first
            node = work[node_id] = nodes[node_id]
            emit(RadixNodeInserted, node_id=node_id, parent_id=node.parent_id, token_ids=node.token_ids,
                 slots=node.slots, lock_ref=node.lock_ref)
        for node_id, node in nodes.items():
            if work[node_id].lock_ref != node.lock_ref:
                emit(RadixLockRef, node_id=node_id, lock_ref=node.lock_ref)
        for num_tokens, num_tokens_evicted in evictions:
            emit(RadixEvict, num_tokens=num_tokens, num_tokens_evicted=num_tokens_evicted)
        gone = [node_id for node_id in work if node_id not in nodes]
        for node_id in sorted(gone, key=lambda node_id: -_depth(work, node_id)):
            emit(RadixNodeEvicted, node_id=node_id, token_ids=work[node_id].token_ids, slots=work[node_id].slots)
        self.nodes = nodes

    # ------------------------------------------------------------------ the pages

    def _emit_pages(self, pages: dict[int, CachedPage], tables: dict[int, tuple[int, ...]],
                    tokens: dict[int, tuple[list[int], int, int]]) -> None:
        emit, old_tables, old_pages = self.events.emit, self.tables, self.pages
        ref = _ref_counts(old_tables)
        for page, cached in old_pages.items():  # left the tree unheld: evicted
            if pages.get(page) != cached and not ref.get(page):
                emit(BlockEvicted, device=GPU, block=page, block_hash=cached.block_hash)
        for page, cached in pages.items():  # entered the tree
            if old_pages.get(page) != cached:
                emit(BlockHashed, device=GPU, block=page, block_hash=cached.block_hash,
                     parent_hash=cached.parent_hash, token_ids=cached.token_ids,
                     num_hashed_tokens=len(cached.token_ids), registered=True)
        for seq_id, old in old_tables.items():  # let go (or replaced by the tree's page), last first
            new = tables.get(seq_id, ())
            for index in reversed(range(len(old))):
                if index < len(new) and new[index] == old[index]:
                    continue
                page = old[index]
                ref[page] -= 1
                emit(BlockFreed, device=GPU, block=page, seq_id=seq_id, ref_count=ref[page], cached=page in pages)
            if not new:
                emit(SequenceFreed, seq_id=seq_id)
        size = self.page_size
        for seq_id, new in tables.items():
            old = old_tables.get(seq_id, ())
            token_ids, start, count = tokens.get(seq_id, ((), 0, 0))
            for index, page in enumerate(new):
                first, end = max(start, index * size), min(start + count, (index + 1) * size)
                if index < len(old) and old[index] == page:  # held already: the step's tokens in it
                    for pos in range(first, end):
                        emit(SlotAppended, seq_id=seq_id, device=GPU, logical_index=index, block=page,
                             offset=pos % size, token_id=token_ids[pos])
                    continue
                ref[page] = ref.get(page, 0) + 1
                cached = pages.get(page)  # the tree's page (an evicted one handed out again is fresh)
                if cached is not None and (old_pages.get(page) == cached or ref[page] > 1):
                    emit(PrefixCacheHit, device=GPU, block=page, seq_ids=(seq_id,), logical_index=index,
                         ref_count=ref[page], block_hash=cached.block_hash, token_ids=cached.token_ids)
                else:
                    emit(BlockAllocated, device=GPU, block=page, seq_ids=(seq_id,), logical_index=index,
                         ref_count=ref[page], block_hash=None, token_ids=tuple(token_ids[first:end]))
        self.pages, self.tables = pages, dict(tables)


def _depth(nodes: dict[int, Node], node_id: int) -> int:
    depth, parent = 0, nodes[node_id].parent_id
    while parent is not None:
        depth, parent = depth + 1, nodes[parent].parent_id
    return depth


def _ref_counts(tables: dict[int, tuple[int, ...]]) -> dict[int, int]:
    ref: dict[int, int] = {}
    for pages in tables.values():
        for page in pages:
            ref[page] = ref.get(page, 0) + 1
    return ref

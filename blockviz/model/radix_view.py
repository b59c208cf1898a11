"""The radix tree's record (kv_manager "sglang"): SGLang's RadixCache (sglang/srt/mem_cache/
radix_cache.py) as the reducer keeps it (`ReducerState.radix_nodes`), computed once at a cursor and
drawn by every front end (the TUI's widgets/radix_panel.py, the notebook's static/radix.js through
`to_json()`, the SVG export), as blockviz.model.insight_view does for the insight panels.

`RadixHistory` follows the events (fed by blockviz.model.insights.Insights.sync) for what the tree at
one cursor does not hold: each node's last access, the splits and evictions, each request's hits.
Last access is derived from the events: SGLang refreshes a node's `last_access_time` on every walk
from the root that reaches it (`_match_prefix_helper`, `_insert_helper`), so a node counts as
accessed at the step of the last event that touched it or a node below it: inserted, split, its
lock_ref changed (`inc_lock_ref` follows a match, `dec_lock_ref` follows the insert at a request's
finish), or a request hit one of its pages. A lookup that changes nothing (`SchedulePolicy`'s lpm
matching the waiting queue) leaves no event, so SGLang's own time can be later than the one shown.

`radix_record(state, history, position, ...)` costs what the tree holds (its nodes, the requests
running), never a pass over the events; it shows at most MAX_RADIX_NODES nodes, those the cursor's
event or card is about first, and says how many more.
"""

from __future__ import annotations

import bisect
from dataclasses import dataclass, field
from typing import Any

from blockviz.model.names import RequestNames
from blockviz.model.palette import show_tokens
from blockviz.model.record import Record
from blockviz.model.reducer import RadixNode, ReducerState
from engine import events as ev

MAX_RADIX_NODES = 48  # nodes drawn (the ones the cursor is about first); the rest counted
MAX_NODE_TOKENS = 32  # tokens and slots listed per node (its length always given)
MAX_EVICTABLE_LISTED = 4  # other evictable leaves named beside an eviction
TREE_EVENTS = (ev.RadixNodeInserted, ev.RadixNodeSplit, ev.RadixLockRef, ev.RadixNodeEvicted)


# ------------------------------------------------------------------------------------ history


@dataclass(slots=True)
class SplitEntry:
    position: int  # events applied once the split is
    step: int
    node_id: int
    new_node_id: int
    num_tokens: int
    token_ids: tuple[int, ...]  # the node's run before the split


@dataclass(slots=True)
class EvictionEntry:
    position: int
    step: int
    node_id: int
    token_ids: tuple[int, ...]
    slots: tuple[int, ...]
    last_access: int | None
    others: list[tuple[int, int | None]]  # the other unlocked leaves then: (node id, last access), oldest first
    parent_id: int | None = None
    asked: int | None = None  # the RadixCache.evict call that took it: tokens asked for (RadixEvict), and freed
    freed: int | None = None
    taken: tuple[int, ...] = ()  # the leaves that call took, this one last


class RadixHistory:
    """What the events say about SGLang's tree over time (RadixCache's last_access_time, _split_node,
    evict, match_prefix's hits), answered as of a cursor `position` (events applied). `feed(event,
    state, position)` is called before `state` (the reducer) applies the event."""

    def __init__(self) -> None:
        self.step = 0
        self.touches: dict[int, list[tuple[int, int]]] = {}  # node id -> (position, step) of each access
        self.splits: list[SplitEntry] = []
        self.evictions: list[EvictionEntry] = []
        self._split_ends: list[int] = []  # each split's position, for bisect
        self._eviction_ends: list[int] = []
        self.hits: dict[int, list[tuple[int, int, int]]] = {}  # seq id -> (position, logical index, page); -1: freed
        self.node_of_page: dict[int, int] = {}
        self._call: tuple[ev.RadixEvict, list[int]] | None = None  # the latest RadixCache.evict call, its leaves

    def feed(self, event: ev.Event, state: ReducerState, position: int) -> None:
        if isinstance(event, ev.StepStarted):
            self.step = event.step
        elif isinstance(event, ev.RadixNodeInserted):
            self._map_pages(event.node_id, event.slots, state.block_size)
            self._touch(event.node_id, event.parent_id, state, position)
        elif isinstance(event, ev.RadixNodeSplit):
            node = state.radix_nodes[event.node_id]
            self.splits.append(SplitEntry(position, self.step, event.node_id, event.new_node_id, event.num_tokens,
                                          node.token_ids))
            self._split_ends.append(position)
            self._map_pages(event.new_node_id, node.slots[:event.num_tokens], state.block_size)
            self._touch(event.node_id, None, state, position)
            self._touch(event.new_node_id, node.parent_id, state, position)
        elif isinstance(event, ev.RadixLockRef):
            self._touch(event.node_id, None, state, position)
        elif isinstance(event, ev.RadixEvict):
            self._call = (event, [])
        elif isinstance(event, ev.RadixNodeEvicted):
            self._evicted(event, state, position)
        elif isinstance(event, ev.PrefixCacheHit) and state.radix_nodes:
            for seq_id in event.seq_ids:
                self.hits.setdefault(seq_id, []).append((position, event.logical_index, event.block))
            node_id = self.node_of_page.get(event.block)
            if node_id is not None:
                self._touch(node_id, None, state, position)
        elif isinstance(event, ev.SequenceFreed) and event.seq_id in self.hits:
            self.hits[event.seq_id].append((position, -1, -1))  # it holds no pages from here on

    def _map_pages(self, node_id: int, slots: tuple[int, ...], page_size: int) -> None:
        for slot in slots[::page_size]:
            self.node_of_page[slot // page_size] = node_id

    def _touch(self, node_id: int, parent_id: int | None, state: ReducerState, position: int) -> None:
        """An access of `node_id` and, as SGLang's walk from the root passes them, its ancestors (from
        `parent_id`, or the node's parent in `state` when None)."""
        nodes = state.radix_nodes
        at = (position, self.step)
        self.touches.setdefault(node_id, []).append(at)
        up = parent_id if parent_id is not None or node_id not in nodes else nodes[node_id].parent_id
        while up is not None:
            self.touches.setdefault(up, []).append(at)
            up = nodes[up].parent_id if up in nodes else None

    def _evicted(self, event: ev.RadixNodeEvicted, state: ReducerState, position: int) -> None:
        parents = {node.parent_id for node in state.radix_nodes.values()}
        others = sorted(((node_id, self.last_access(node_id, position))
                         for node_id, node in state.radix_nodes.items()
                         if node_id != event.node_id and node.lock_ref == 0 and node_id not in parents),
                        key=lambda pair: (pair[1] if pair[1] is not None else -1, pair[0]))
        leaf = state.radix_nodes.get(event.node_id)
        call, taken = self._call if self._call is not None else (None, [])
        taken.append(event.node_id)
        self.evictions.append(EvictionEntry(position, self.step, event.node_id, event.token_ids, event.slots,
                                            self.last_access(event.node_id, position), others,
                                            leaf.parent_id if leaf is not None else None,
                                            call.num_tokens if call is not None else None,
                                            call.num_tokens_evicted if call is not None else None, tuple(taken)))
        self._eviction_ends.append(position)
        for slot in event.slots[::state.block_size]:
            if self.node_of_page.get(slot // state.block_size) == event.node_id:
                del self.node_of_page[slot // state.block_size]

    def last_access(self, node_id: int, position: int) -> int | None:
        """The step of `node_id`'s last access by `position` (None: none seen)."""
        touches = self.touches.get(node_id, ())
        index = bisect.bisect_right(touches, (position, float("inf")))
        return touches[index - 1][1] if index else None

    def last_split(self, position: int) -> SplitEntry | None:
        index = bisect.bisect_right(self._split_ends, position)
        return self.splits[index - 1] if index else None

    def last_eviction(self, position: int) -> EvictionEntry | None:
        index = bisect.bisect_right(self._eviction_ends, position)
        return self.evictions[index - 1] if index else None

    def hits_of(self, seq_id: int, position: int) -> list[tuple[int, int]]:
        """(logical index, page) of each page `seq_id` was served from the tree by `position`, since it
        last held no pages."""
        out = []
        for at, index, page in self.hits.get(seq_id, ()):
            if at > position:
                break
            if index < 0:
                out.clear()
            else:
                out.append((index, page))
        return out

    def rebase(self, shift: int, state: ReducerState) -> None:
        """The followed timeline dropped its oldest `shift` events: positions count from its new front;
        only the newest access of each node and the newest split and eviction before it are kept."""
        def moved(entries: list) -> list:
            for entry in entries:
                entry.position -= shift
            before = [e for e in entries if e.position <= 0]
            return before[-1:] + [e for e in entries if e.position > 0]

        def kept(touches: list[tuple[int, int]]) -> list[tuple[int, int]]:
            before = [(0, step) for at, step in touches if at <= shift]
            return before[-1:] + [(at - shift, step) for at, step in touches if at > shift]

        self.splits, self.evictions = moved(self.splits), moved(self.evictions)
        self._split_ends = [e.position for e in self.splits]
        self._eviction_ends = [e.position for e in self.evictions]
        self.touches = {node_id: kept(touches) for node_id, touches in self.touches.items()
                        if node_id in state.radix_nodes}
        self.hits = {seq_id: [(at - shift, index, page) for at, index, page in hits]
                     for seq_id, hits in self.hits.items() if seq_id in state.seqs}


# ------------------------------------------------------------------------------------ record


@dataclass(slots=True)
class RadixNodeRow(Record):
    """One node drawn: its id, its parent's (None: the root), its depth below the root, its run of
    tokens as text (the first MAX_NODE_TOKENS; `num_tokens` all), their slots and the pages (blocks,
    slot // page_size) holding them, its lock_ref and the requests whose tables hold its pages,
    its last access (a step), whether it is a leaf and evictable (an unlocked leaf), and whether the
    cursor's event or card is about it."""

    id: int
    parent: int | None
    depth: int
    num_tokens: int
    tokens: list[str]
    slots: list[int]
    blocks: list[int]
    lock_ref: int
    holders: list[str]
    last_access: int | None
    leaf: bool
    evictable: bool
    about: bool = False


@dataclass(slots=True)
class RadixSplit(Record):
    """The last split by the cursor (RadixCache._split_node): `node` kept the tail, `new_node` took
    the first `at` tokens (`head`), at `step`."""

    step: int
    node: int
    new_node: int
    at: int
    head: list[str]
    tail: list[str]


@dataclass(slots=True)
class RadixEviction(Record):
    """The last leaf evicted by the cursor (RadixCache.evict): its tokens, slots and pages, its last
    access, and why it went first (`why`, in words; `others`: the unlocked leaves left then, [node id,
    last access], oldest first); the evict call that took it: `asked` tokens, `freed` tokens (None:
    the trace has no RadixEvict), and `taken`, the leaves it took, this one last; `recent`: it ran in
    the cursor's step."""

    step: int
    node: int
    num_tokens: int
    tokens: list[str]
    slots: list[int]
    blocks: list[int]
    last_access: int | None
    policy: str
    why: str
    others: list[list]
    asked: int | None = None
    freed: int | None = None
    taken: list[int] = field(default_factory=list)
    recent: bool = False


@dataclass(slots=True)
class RadixMatch(Record):
    """A request's row: the pages its table holds (its row of SGLang's ReqToTokenPool, slots by the
    page), its status, and its prefix served by the tree (RadixCache.match_prefix): its tokens,
    their slots, and the nodes holding them."""

    seq: int
    name: str
    num_tokens: int
    slots: list[int]
    nodes: list[int]
    pages: list[int] = field(default_factory=list)
    status: str = ""


@dataclass(slots=True)
class RadixRecord(Record):
    """SGLang's radix tree at a cursor: the nodes drawn in depth-first order (at most
    MAX_RADIX_NODES; `num_more` not drawn), the tokens cached in all, SGLang's evictable_size_ and
    protected_size_ (tokens of unlocked and of locked nodes), the last split and eviction, each
    running request's match, `about`: the nodes the cursor's event or card is about, and `requests`:
    the rows of the requests a card is about (drawn above the tree, so a card's request and its
    pages stay on screen while the tree scrolls)."""

    page_size: int
    nodes: list[RadixNodeRow]
    num_nodes: int
    num_more: int
    num_tokens: int
    evictable_size: int
    protected_size: int
    last_split: RadixSplit | None = None
    last_evicted: RadixEviction | None = None
    matches: list[RadixMatch] = field(default_factory=list)
    about: list[int] = field(default_factory=list)
    requests: list[RadixMatch] = field(default_factory=list)


def radix_record(state: ReducerState, history: RadixHistory, position: int, *, event: ev.Event | None = None,
                 about_seqs: tuple[int, ...] = (), vocab: dict[int, str] | None = None,
                 policy: str = "lru", limit: int = MAX_RADIX_NODES) -> RadixRecord:
    """The tree at `position` (`state` the reducer there, `history` fed up to it): `event` the one at
    the cursor and `about_seqs` a card's sequences mark the nodes they are about (drawn first when the
    tree has more than `limit`); `vocab` token id -> text; `policy` SGLang's radix_eviction_policy."""
    vocab = vocab or {}
    nodes, page_size = state.radix_nodes, state.block_size
    children: dict[int | None, list[int]] = {}
    for node_id in sorted(nodes):
        children.setdefault(nodes[node_id].parent_id, []).append(node_id)
    holders = _holders(state)
    about = _about(state, history, position, event, about_seqs, holders)
    order = _preorder(children)
    shown = _shown(order, nodes, about, limit)
    names = RequestNames(state)
    rows = [_row(node_id, nodes[node_id], depth, page_size, children, holders, names, history, position, vocab, node_id in about)
            for node_id, depth in order if node_id in shown]
    page_node = {slot // page_size: node_id for node_id, node in nodes.items() for slot in node.slots[::page_size]}
    locked = sum(len(n.token_ids) for n in nodes.values() if n.lock_ref > 0)
    total = sum(len(n.token_ids) for n in nodes.values())
    return RadixRecord(page_size, rows, len(nodes), len(nodes) - len(rows), total, total - locked, locked,
                       _split(history.last_split(position), vocab),
                       _eviction(history.last_eviction(position), page_size, vocab, policy, state.step),
                       _matches(state, history, position, names, page_node), sorted(about),
                       [_match(seq_id, state, history, position, names, page_node)
                        for seq_id in dict.fromkeys(about_seqs) if seq_id in state.seqs])


def _holders(state: ReducerState) -> dict[int, list[int]]:
    """page -> the sequences whose tables hold it."""
    out: dict[int, list[int]] = {}
    for seq_id, table in sorted(state.tables.items()):
        for device, page in table:
            if device == "gpu":
                out.setdefault(page, []).append(seq_id)
    return out


def _about(state: ReducerState, history: RadixHistory, position: int, event: ev.Event | None,
           about_seqs: tuple[int, ...], holders: dict[int, list[int]]) -> set[int]:
    """The nodes `event` (the cursor's) is about (an evicted leaf's parent, the leaf gone) and those
    holding pages of `about_seqs` (a card's sequences)."""
    nodes, about = state.radix_nodes, set()
    if isinstance(event, ev.RadixNodeEvicted):
        evicted = history.last_eviction(position)
        if evicted is not None and evicted.node_id == event.node_id and evicted.parent_id is not None:
            about.add(evicted.parent_id)
    elif isinstance(event, ev.RadixNodeSplit):
        about |= {event.node_id, event.new_node_id}
    elif isinstance(event, (ev.RadixNodeInserted, ev.RadixLockRef)):
        about.add(event.node_id)
    if about_seqs:
        wanted = set(about_seqs)
        for node_id, node in nodes.items():
            if node.slots and wanted & set(holders.get(node.slots[0] // state.block_size, ())):
                about.add(node_id)
    return {node_id for node_id in about if node_id in nodes}


def _preorder(children: dict[int | None, list[int]]) -> list[tuple[int, int]]:
    """(node id, depth) depth first from the root, children by id (their order of insertion)."""
    out, stack = [], [(child, 0) for child in reversed(children.get(None, []))]
    while stack:
        node_id, depth = stack.pop()
        out.append((node_id, depth))
        stack.extend((child, depth + 1) for child in reversed(children.get(node_id, [])))
    return out


def _shown(order: list[tuple[int, int]], nodes: dict[int, RadixNode], about: set[int], limit: int) -> set[int]:
    """The nodes drawn: all when they fit, else the `about` nodes with their ancestors, then the rest
    in depth-first order, up to `limit`."""
    if len(order) <= limit:
        return {node_id for node_id, _ in order}
    shown: set[int] = set()
    for node_id in sorted(about):
        path = []
        while node_id is not None and node_id not in shown:
            path.append(node_id)
            node_id = nodes[node_id].parent_id
        if len(shown) + len(path) > limit:
            break
        shown.update(path)
    for node_id, _ in order:
        if len(shown) >= limit:
            break
        shown.add(node_id)
    return shown


def _texts(token_ids, vocab: dict[int, str]) -> list[str]:
    return show_tokens([vocab.get(t, f"<{t}>") for t in token_ids])


def _pages(slots, page_size: int) -> list[int]:
    return list(dict.fromkeys(slot // page_size for slot in slots))


def _row(node_id: int, node: RadixNode, depth: int, page_size: int, children: dict, holders: dict[int, list[int]],
         names: RequestNames, history: RadixHistory, position: int, vocab: dict[int, str], about: bool) -> RadixNodeRow:
    leaf = node_id not in children
    held = holders.get(node.slots[0] // page_size, []) if node.slots else []
    return RadixNodeRow(node_id, node.parent_id, depth, len(node.token_ids),
                        _texts(node.token_ids[:MAX_NODE_TOKENS], vocab), list(node.slots[:MAX_NODE_TOKENS]),
                        _pages(node.slots, page_size)[:MAX_NODE_TOKENS], node.lock_ref,
                        [names((seq_id,)) for seq_id in held], history.last_access(node_id, position), leaf,
                        leaf and node.lock_ref == 0, about)


def _split(entry: SplitEntry | None, vocab: dict[int, str]) -> RadixSplit | None:
    if entry is None:
        return None
    head, tail = entry.token_ids[:entry.num_tokens], entry.token_ids[entry.num_tokens:]
    return RadixSplit(entry.step, entry.node_id, entry.new_node_id, entry.num_tokens,
                      _texts(head[-MAX_NODE_TOKENS:], vocab), _texts(tail[:MAX_NODE_TOKENS], vocab))


def _eviction(entry: EvictionEntry | None, page_size: int, vocab: dict[int, str], policy: str,
              step: int) -> RadixEviction | None:
    if entry is None:
        return None
    return RadixEviction(entry.step, entry.node_id, len(entry.token_ids), _texts(entry.token_ids[:MAX_NODE_TOKENS], vocab),
                         list(entry.slots[:MAX_NODE_TOKENS]), _pages(entry.slots, page_size)[:MAX_NODE_TOKENS],
                         entry.last_access, policy, eviction_reason(entry, policy),
                         [list(pair) for pair in entry.others[:MAX_EVICTABLE_LISTED]], entry.asked, entry.freed,
                         list(entry.taken or (entry.node_id,)), entry.step == step)


def eviction_reason(entry: EvictionEntry, policy: str) -> str:
    """Why evict() took this leaf, in words: an unlocked leaf, and under lru (SGLang's default
    radix_eviction_policy) the one accessed longest ago, compared with the leaves left."""
    seen = "never seen accessed" if entry.last_access is None else f"last accessed at step {entry.last_access}"
    if not entry.others:
        return f"the only unlocked leaf ({seen})"
    if policy != "lru":
        return f"an unlocked leaf first in {policy} order ({seen})"
    following = next(((node_id, at) for node_id, at in entry.others if at is not None), None)
    if following is None or entry.last_access is None:
        return f"the least recently used unlocked leaf by SGLang's clock ({seen})"
    node_id, at = following
    if entry.last_access < at:
        return f"the least recently used unlocked leaf ({seen}; the next, #{node_id}, at step {at})"
    if entry.last_access == at:
        return (f"the least recently used unlocked leaf ({seen}, as was #{node_id}: SGLang's clock orders "
                "the accesses within a step)")
    return f"the least recently used unlocked leaf by SGLang's clock ({seen})"


def _matches(state: ReducerState, history: RadixHistory, position: int, names: RequestNames,
             page_node: dict[int, int]) -> list[RadixMatch]:
    """Each running sequence's row (_match)."""
    return [_match(seq_id, state, history, position, names, page_node)
            for seq_id in sorted(seq_id for seq_id, table in state.tables.items() if table)]


def _match(seq_id: int, state: ReducerState, history: RadixHistory, position: int, names: RequestNames,
           page_node: dict[int, int]) -> RadixMatch:
    """`seq_id`'s row: the pages its table holds, and the pages served by the tree (its
    prefix_cache_hit events since it last held none), at token granularity: every slot of a hit page."""
    page_size = state.block_size
    hits = sorted(history.hits_of(seq_id, position))
    slots = [page * page_size + i for _, page in hits for i in range(page_size)]
    nodes = list(dict.fromkeys(n for n in (page_node.get(page) for _, page in hits) if n is not None))
    pages = [page for device, page in state.tables.get(seq_id, ()) if device == "gpu"]
    return RadixMatch(seq_id, names((seq_id,)), len(slots), slots[:MAX_NODE_TOKENS * 2], nodes,
                      pages[:MAX_NODE_TOKENS], state.seqs[seq_id].status if seq_id in state.seqs else "")


def number_ranges(numbers: list[int]) -> str:
    """Numbers as runs: [2, 3, 4, 7] -> "2-4,7" (slots and pages of a node)."""
    runs: list[list[int]] = []
    for number in numbers:
        if runs and number == runs[-1][1] + 1:
            runs[-1][1] = number
        else:
            runs.append([number, number])
    return ",".join(str(a) if a == b else f"{a}-{b}" for a, b in runs) or "—"


def eviction_policy(header: dict[str, Any]) -> str:
    """SGLang's radix_eviction_policy a run used (its trace header's sglang_options; lru by default)."""
    return str((header.get("sglang_options") or {}).get("radix_eviction_policy", "lru"))


def radix_history(header: dict[str, Any], events: list) -> RadixHistory:
    """A RadixHistory fed every one of `events` (a trace's, from its header's empty pools): for a
    picture of any cursor of a trace without an Insights."""
    state, history = ReducerState.from_header(header), RadixHistory()
    for position, event in enumerate(events, start=1):
        history.feed(event, state, position)
        state.apply(event)
    return history

"""Rebuild what the engine's memory looks like from its events alone.

Every view (TUI, widgets, trace replay) draws `BlockState` / `ReducerState`, never engine objects. A
test feeds the reducer nothing but events and checks it equals the real BlockSpaceManager after every
operation; that is what makes "every picture is the engine's real state" true.
"""

from __future__ import annotations

import copy
from collections import Counter
from dataclasses import dataclass, field, fields
from operator import attrgetter
from typing import Any, Callable, NamedTuple

from blockviz.model.design import KV_DESIGNS, SLIDING_WINDOW, KVCacheGroup, kv_cache_groups_of, kv_manager_of
from engine import events as ev

FREE, USED, CACHED = "free", "used", "cached"  # block states: free / in use / free-but-cached
NULL = "null"  # vLLM v1's block 0: a placeholder, never allocated, freed or counted
# A block's state code, one character (view.STATE_CODES): the state every view colours it by.
USED_CODE, CACHED_CODE, FREE_CODE, NULL_CODE = "u", "c", "f", "n"
OFFLOAD_PIN = -1  # the seq_id of a BlockFreed in which vLLM's CPU tier releases a block it pinned for a copy


@dataclass(slots=True)
class BlockState:
    """One physical block as the views see it."""

    device: str
    number: int
    ref_count: int = 0
    owners: set[int] = field(default_factory=set)
    block_hash: int | None = None
    parent_hash: int | None = None
    num_hashed_tokens: int = 0
    token_ids: tuple[int, ...] = ()
    state: str = FREE
    registered: bool = False
    digest: str | None = None
    num_hits: int = 0
    digest_slots: int = 0  # slots the block held when `digest` was taken (it may have grown since)
    group: int = 0  # the KV-cache group whose table or prefix cache holds it (vLLM kv_cache_group_id)

    def clear(self) -> None:
        self.ref_count = 0
        self.owners = set()
        self.block_hash = None
        self.parent_hash = None
        self.num_hashed_tokens = 0
        self.token_ids = ()
        self.state = FREE
        self.registered = False
        self.digest = None
        self.digest_slots = 0
        self.group = 0


class RadixNode(NamedTuple):
    """A node of SGLang's radix tree (kv_manager "sglang"; engine/events.py's Radix* events): its
    parent (None: the root), its run of tokens, their KV slots, and its lock_ref."""

    parent_id: int | None
    token_ids: tuple[int, ...]
    slots: tuple[int, ...]
    lock_ref: int


def state_code(block: BlockState) -> str:
    """The block's state code: u in use, n vLLM v1's null block (BlockPool.null_block), c free but
    still hashed (a prefix-cache hit can revive it until it is evicted), f free. The one rule every
    view colours a block by (view.block_state names it)."""
    if block.state == USED:
        return USED_CODE
    if block.state == NULL:
        return NULL_CODE
    return CACHED_CODE if block.block_hash is not None else FREE_CODE


@dataclass(slots=True)
class SeqState:
    """A sequence as the views see it: request, tokens and text pieces, status."""

    seq_id: int
    request_id: str
    token_ids: list[int] = field(default_factory=list)
    token_texts: list[str] = field(default_factory=list)
    num_prompt_tokens: int = 0
    status: str = "waiting"
    finish_reason: str | None = None
    num_cached_tokens: int = 0
    parent_seq_id: int | None = None
    num_computed_tokens: int = 0  # v1: tokens with K/V, from TokensScheduled (a chunked prefill's progress)
    # why a waiting sequence holds blocks, until its next step: "preempted" (recompute: its frees
    # follow the Preempted event), "loading" (vLLM's CPU tier copies its prefix back first: vLLM's
    # RequestStatus.WAITING_FOR_REMOTE_KVS); "" otherwise
    waits_on: str = ""


class ReducerState:
    """Pools, block tables, hash map and the story of requests, rebuilt event by event.

    `kv_manager` is the design that ran (a trace header's "kv_manager", "v0" when absent). With
    "v1" block 0 is the null block, `free_queue` holds the free blocks in eviction order (head
    first: a freed block with a hash joins the tail, one without the head; an allocation or a hit
    takes a block out), and a hash may sit on several blocks (`hash_blocks`, in the order they were
    cached), `hash_map` naming the first, as vLLM v1's BlockPool looks them up.

    KV-cache groups (`kv_cache_groups`, a hybrid model's, from its header; () for one group): a
    sequence has one table per group, `tables` holding group 0's (every view's table in a run with
    one group) and `group_tables[g]` group g's; a slot a sliding window let go holds the null block
    (BlocksSkipped); each block knows its group (`BlockState.group`), and a hash is looked up per
    group (`cached_block`), as vLLM keys its prefix cache by (hash, group).
    """

    def __init__(self, block_size: int, num_gpu_blocks: int, num_cpu_blocks: int, kv_manager: str = "v0",
                 kv_cache_groups: tuple[KVCacheGroup, ...] = ()) -> None:
        self.block_size = block_size
        self.kv_manager = kv_manager
        self.design = KV_DESIGNS[kv_manager]
        self.pools: dict[str, list[BlockState]] = {
            "gpu": [BlockState("gpu", i) for i in range(num_gpu_blocks)],
            "cpu": [BlockState("cpu", i) for i in range(num_cpu_blocks)],
        }
        self.free_queue: list[int] = []  # v1: free gpu blocks, the next evicted first
        self.hash_blocks: dict[int, tuple[int, ...]] = {}  # v1: block_hash -> blocks holding it
        if self.design.null_block and num_gpu_blocks:
            self.pools["gpu"][0].state = NULL
            self.free_queue = list(range(1, num_gpu_blocks))
        if self.design.null_block and num_cpu_blocks:  # vLLM's CPU tier is a BlockPool too: block 0 is null
            self.pools["cpu"][0].state = NULL
        # Per device a state code (state_code) per block, kept as events change blocks (_recode), so a
        # view of a pool of any size reads its states and counts without a pass over its blocks.
        self.codes: dict[str, bytearray] = {device: bytearray(FREE_CODE * len(pool), "ascii")
                                            for device, pool in self.pools.items()}
        for device, pool in self.pools.items():
            if pool and pool[0].state == NULL:
                self.codes[device][0] = ord(NULL_CODE)
        self.hashed_gpu_blocks: set[int] = set()  # the GPU blocks holding a hash (the hash chains')
        self.cpu_hash_map: dict[int, int] = {}  # the CPU pool's (vLLM's CPU tier, v0's swap pool): block_hash -> cpu block
        self.pinned: dict[int, int] = {}  # vLLM's CPU tier: gpu block -> its copies in flight (a ref each)
        self.tables: dict[int, list[tuple[str, int]]] = {}
        self.kv_cache_groups = tuple(kv_cache_groups)
        self.group_tables: dict[int, dict[int, list[tuple[str, int]]]] = {g: {} for g in range(1, len(kv_cache_groups))}
        self.hash_map: dict[int, int] = {}  # block_hash -> gpu block number
        self.seqs: dict[int, SeqState] = {}
        self.requests: dict[str, tuple[int, ...]] = {}
        self.counts: dict[str, int] = {}
        self.num_events = 0
        self.last_seq_no = -1
        self.step = 0
        self.step_kind = ""
        self.num_prompt_blocks_looked_up = 0  # the full blocks of each lookup's tokens
        # prompt blocks served by the prefix cache (and vLLM's CPU tier): one per block of a lookup's hit,
        # however many KV-cache groups hold it (blockviz.model.explain counts a request's hit the same way)
        self.num_prefix_hits = 0
        # vLLM v1 PrefixCacheStats: tokens new requests' lookups asked for (queries) and found on the GPU (hits)
        self.prefix_cache_queries = 0
        self.prefix_cache_hits = 0
        self._lookups: dict[int, bool] = {}  # seq_id -> whether its coming lookup is a preempted request's
        self._looked_up: dict[int, int] = {}  # seq_id of a new request's lookup, until it runs -> hit tokens so far
        self._hit_indices: dict[int, set[int]] = {}  # seq_id of a lookup, until it runs -> its hit blocks' indices
        self.num_preemptions = 0
        self.num_tokens_generated = 0
        self.step_time_s = 0.0
        self.num_scheduled_tokens: dict[int, int] = {}  # v1: seq_id -> tokens the last step computed
        self.radix_nodes: dict[int, RadixNode] = {}  # sglang: SGLang's radix tree, by node id (TreeNode.id from the root)

    @classmethod
    def from_header(cls, header: dict) -> "ReducerState":
        """An empty state for a trace or live run with this header (older traces: v0)."""
        return cls(header["block_size"], header["num_gpu_blocks"], header["num_cpu_blocks"],
                   kv_manager_of(header), kv_cache_groups_of(header))

    # ------------------------------------------------------------------ queries

    def num_free(self, device: str) -> int:
        return sum(1 for b in self.pools[device] if b.state == FREE or b.state == CACHED)

    def num_used(self, device: str) -> int:
        return sum(1 for b in self.pools[device] if b.state == USED)

    def block(self, device: str, number: int) -> BlockState:
        return self.pools[device][number]

    def table_blocks(self, seq_id: int) -> list[int]:
        return [number for _, number in self.tables[seq_id]]

    @property
    def num_kv_cache_groups(self) -> int:
        """The header's groups, or as many as the events named (a state made without a header)."""
        return max(len(self.kv_cache_groups), 1 + max(self.group_tables, default=0))

    def groups_holding_blocks(self) -> tuple[int, ...]:
        """Group 0 and each other KV-cache group that holds blocks now: a sequence's table in it is
        not empty, or a block of its prefix cache is hashed (vLLM keys cached blocks by group). The
        views draw tables and legends for these groups only, so a header declaring many groups
        costs what the events use."""
        held = {g for g, tables in self.group_tables.items() if any(tables.values())}
        gpu = self.pools["gpu"]
        held.update(gpu[number].group for number in self.hashed_gpu_blocks)
        held.discard(0)
        return (0, *sorted(held))

    def tables_of(self, group: int) -> dict[int, list[tuple[str, int]]]:
        """seq_id -> its table in KV-cache group `group`."""
        return self.tables if group == 0 else self.group_tables.setdefault(group, {})

    def seq_tables(self, seq_id: int) -> tuple[list[tuple[str, int]], ...]:
        """The sequence's table in each group (vLLM KVCacheManager.get_blocks), [] where it has none."""
        return tuple(self.tables_of(g).get(seq_id, []) for g in range(self.num_kv_cache_groups))

    def is_window_group(self, group: int) -> bool:
        return group < len(self.kv_cache_groups) and self.kv_cache_groups[group].kind == SLIDING_WINDOW

    def history_table(self, seq_id: int) -> list[tuple[str, int]]:
        """The sequence's table in the first group that keeps every token (a full-attention group:
        a window group lets its oldest blocks go), group 0's when every group slides: where the
        views find the block that holds a token."""
        group = next((g for g in range(self.num_kv_cache_groups) if not self.is_window_group(g)), 0)
        return self.tables_of(group).get(seq_id, [])

    def cached_block(self, block_hash: int, group: int = 0) -> int | None:
        """The block a lookup of `block_hash` in `group` returns now: the first cached for that
        group (vLLM BlockPool.get_cached_block), or None."""
        if not self.kv_cache_groups and not self.group_tables:  # one group: the first block cached
            return self.hash_map.get(block_hash)
        gpu = self.pools["gpu"]
        return next((n for n in self.hash_blocks.get(block_hash, ()) if gpu[n].group == group), None)

    def kv_utilization(self) -> float:
        """Slots holding tokens over slots allocated, on the GPU."""
        used = [b for b in self.pools["gpu"] if b.state == USED]
        if not used:
            return 0.0
        return sum(len(b.token_ids) for b in used) / (len(used) * self.block_size)

    def size(self) -> int:
        """How many items a snapshot of this state holds: blocks, sequences' tokens, requests."""
        return (sum(map(len, self.pools.values())) + sum(len(seq.token_ids) for seq in self.seqs.values())
                + len(self.requests))

    def forget_finished(self) -> set[str]:
        """Drop the requests whose every sequence has finished and let go of its blocks (their
        sequences and figures): what a capped live timeline no longer shows once the events that
        made them are dropped. Returns their ids."""
        gone = {request_id for request_id, seq_ids in self.requests.items()
                if all(self.seqs[s].status == "finished" and not self.tables.get(s) for s in seq_ids if s in self.seqs)}
        for request_id in gone:
            self.forget(request_id)
        return gone

    def forget(self, request_id: str) -> None:
        """Drop one request and its sequences from the picture (they hold no block any more)."""
        for seq_id in self.requests.pop(request_id, ()):
            self.seqs.pop(seq_id, None)
            self.tables.pop(seq_id, None)
            for tables in self.group_tables.values():
                tables.pop(seq_id, None)
            self.num_scheduled_tokens.pop(seq_id, None)
            self._lookups.pop(seq_id, None)
            self._looked_up.pop(seq_id, None)
            self._hit_indices.pop(seq_id, None)

    @property
    def prefix_hit_unit(self) -> str:
        """What the hit rate counts: tokens in vLLM v1 (PrefixCacheStats.queries and hits), prompt
        blocks in v0 (its allocator's block lookups)."""
        return "tokens" if self.design.prefix_stats_in_tokens else "blocks"

    def prefix_hit_rate(self) -> float:
        """Hits over lookups, in `prefix_hit_unit`: v1 as vLLM's PrefixCacheStats (new requests'
        lookups at admission: their tokens queried, the tokens the GPU's prefix cache served), v0 the
        full blocks of every lookup's tokens and those served."""
        if self.design.prefix_stats_in_tokens:
            return self.prefix_cache_hits / self.prefix_cache_queries if self.prefix_cache_queries else 0.0
        return self.num_prefix_hits / self.num_prompt_blocks_looked_up if self.num_prompt_blocks_looked_up else 0.0

    def _note_lookup(self, seq_ids) -> None:
        """A placement: the first of a lookup's (vLLM KVCacheManager.get_computed_blocks at admission;
        sequences placed together share one) counts its tokens once, as queries in a new request's."""
        placed = [seq_id for seq_id in seq_ids if seq_id in self._lookups]
        if not placed:
            return
        preempted = [self._lookups.pop(seq_id) for seq_id in placed][0]
        seq = self.seqs.get(placed[0])
        num_tokens = len(seq.token_ids) if seq is not None else 0
        self.num_prompt_blocks_looked_up += num_tokens // self.block_size
        for seq_id in placed:
            self._hit_indices[seq_id] = set()
        if not preempted:
            self.prefix_cache_queries += num_tokens
            self._looked_up.update(dict.fromkeys(placed, 0))

    def copy(self) -> "ReducerState":
        """An independent deep copy (through freeze and thaw)."""
        return ReducerState.thaw(self.freeze())

    def freeze(self) -> tuple:
        """This state as nested tuples of plain values, for time travel's snapshots: far cheaper
        than copy.deepcopy, and the garbage collector stops tracking plain tuples, so the snapshots of a long live run do not make every full collection longer.
        thaw() makes a state again. Attributes without a fast path go through deepcopy, so fields
        the reducer gains later are still kept."""
        return tuple((name, _FREEZE.get(name, _deepcopy)(value)) for name, value in vars(self).items())

    @classmethod
    def thaw(cls, frozen: tuple) -> "ReducerState":
        """A state from freeze()'s tuples (independent of them)."""
        state = object.__new__(cls)
        for name, value in frozen:
            setattr(state, name, _THAW.get(name, _deepcopy)(value))
        return state

    # ------------------------------------------------------------------ state codes

    def block_codes(self, device: str, start: int = 0, stop: int | None = None) -> str:
        """One state code (state_code) per block of `device` from `start` to `stop`."""
        return self.codes[device][start:stop].decode("ascii")

    def _recode(self, device: str, number: int) -> None:
        """Keep block `number`'s state code, and whether it is a hashed GPU block, after a change."""
        block = self.pools[device][number]
        self.codes[device][number] = ord(state_code(block))
        if device == "gpu":
            if block.block_hash is None:
                self.hashed_gpu_blocks.discard(number)
            else:
                self.hashed_gpu_blocks.add(number)

    # ------------------------------------------------------------------ applying events

    def apply(self, event: ev.Event) -> None:
        """Fold one event into the state."""
        handler = _HANDLERS.get(type(event))
        if handler is not None:
            handler(self, event)
            recode = _RECODES[type(event)]
            if recode is not None:
                recode(self, event)
        self.counts[event.type] = self.counts.get(event.type, 0) + 1
        self.num_events += 1
        self.last_seq_no = event.seq_no

    def apply_all(self, events) -> "ReducerState":
        """apply() each event in order, with the bookkeeping done once per batch: a live run at
        full speed folds thousands of events a second on the UI's side."""
        events = events if isinstance(events, (list, tuple)) else list(events)
        if not events:
            return self
        handlers, recodes = _HANDLERS, _RECODES
        for event in events:
            handler = handlers.get(type(event))
            if handler is not None:
                handler(self, event)
                recode = recodes[type(event)]
                if recode is not None:
                    recode(self, event)
        counts = self.counts
        for cls, count in Counter(map(type, events)).items():
            counts[cls.type] = counts.get(cls.type, 0) + count
        self.num_events += len(events)
        self.last_seq_no = events[-1].seq_no
        return self

    def _place(self, seq_id: int, index: int, device: str, number: int, group: int = 0) -> None:
        """Block `number` at `index` of the sequence's table in `group`; the slots before it that
        nothing filled hold the null block (a sliding window's prefix hit needs only its last
        blocks: vLLM add_local_computed_blocks puts the null block in the others)."""
        table = self.tables_of(group).setdefault(seq_id, [])
        if index == len(table):
            table.append((device, number))
        elif index > len(table):
            table.extend([("gpu", 0)] * (index - len(table)))
            table.append((device, number))
        else:
            table[index] = (device, number)

    def _leave_queue(self, device: str, number: int) -> None:
        if device == "gpu" and number in self.free_queue:
            self.free_queue.remove(number)

    def _on_allocated(self, e: ev.BlockAllocated) -> None:
        block = self.pools[e.device][e.block]
        self._leave_queue(e.device, e.block)
        block.clear()
        block.ref_count = e.ref_count
        block.owners = set(e.seq_ids)
        block.token_ids = e.token_ids
        block.state = USED
        block.group = e.group
        self._note_lookup(e.seq_ids)
        for seq_id in e.seq_ids:
            self._place(seq_id, e.logical_index, e.device, e.block, e.group)

    def _on_hit(self, e: ev.PrefixCacheHit) -> None:
        block = self.pools[e.device][e.block]
        self._leave_queue(e.device, e.block)
        block.ref_count = e.ref_count
        block.owners |= set(e.seq_ids)
        block.state = USED
        block.num_hits += 1
        block.group = e.group
        self._note_lookup(e.seq_ids)
        self._count_hit(e.seq_ids, e.logical_index)
        served = (e.logical_index + 1) * self.block_size  # every group's hit ends at the same block
        for seq_id in e.seq_ids:
            self._place(seq_id, e.logical_index, e.device, e.block, e.group)
            if seq_id in self.seqs:
                self.seqs[seq_id].num_cached_tokens = served
        counted = [self._looked_up[seq_id] for seq_id in e.seq_ids if seq_id in self._looked_up]
        if counted and served > counted[0]:
            self.prefix_cache_hits += served - counted[0]
            self._looked_up.update(dict.fromkeys((s for s in e.seq_ids if s in self._looked_up), served))

    def _count_hit(self, seq_ids, index: int) -> None:
        """One prompt block served, counted once per block of a lookup: a hybrid model's groups each
        hit their own block at the same index (vLLM HybridKVCacheCoordinator.find_longest_cache_hit
        returns one hit length for all groups), and the request is served that block's tokens once."""
        lookups = [self._hit_indices[seq_id] for seq_id in seq_ids if seq_id in self._hit_indices]
        if lookups and index in lookups[0]:
            return
        self.num_prefix_hits += 1
        for indices in lookups:
            indices.add(index)

    def _on_hashed(self, e: ev.BlockHashed) -> None:
        block = self.pools[e.device][e.block]
        block.block_hash = e.block_hash
        if e.parent_hash is not None:  # None: a root block, or one swapped in (its parent came with it)
            block.parent_hash = e.parent_hash
        block.num_hashed_tokens = e.num_hashed_tokens
        block.registered = e.registered
        if e.device == "cpu":  # v0's swap pool keeps its own hash map (BlockSpaceManager._swap)
            if e.registered:
                self.cpu_hash_map[e.block_hash] = e.block
        elif self.design.shared_hashes:
            holders = self.hash_blocks.get(e.block_hash, ()) + (e.block,)
            self.hash_blocks[e.block_hash] = holders
            self.hash_map[e.block_hash] = holders[0]
        elif e.registered:
            self.hash_map[e.block_hash] = e.block

    def _on_slot(self, e: ev.SlotAppended) -> None:
        block = self.pools[e.device][e.block]
        block.token_ids = block.token_ids[: e.offset] + (e.token_id,)

    def _on_cow(self, e: ev.CopyOnWrite) -> None:
        src = self.pools[e.device][e.src_block]
        dst = self.pools[e.device][e.dst_block]
        dst.clear()
        dst.ref_count = 1
        dst.owners = {e.seq_id}
        dst.token_ids = e.token_ids
        dst.state = USED
        dst.digest, dst.digest_slots = src.digest, src.digest_slots
        src.ref_count = e.src_ref_count
        src.owners.discard(e.seq_id)
        self._place(e.seq_id, e.logical_index, e.device, e.dst_block)

    def _on_fork(self, e: ev.Forked) -> None:
        self.tables[e.child_seq_id] = list(self.tables.get(e.parent_seq_id, []))
        for device, number in self.tables[e.child_seq_id]:
            block = self.pools[device][number]
            block.ref_count += 1
            block.owners.add(e.child_seq_id)
        parent = self.seqs.get(e.parent_seq_id)
        if parent is not None:
            self.seqs[e.child_seq_id] = SeqState(
                e.child_seq_id, parent.request_id, list(parent.token_ids), list(parent.token_texts),
                parent.num_prompt_tokens, parent.status, None, parent.num_cached_tokens, e.parent_seq_id,
            )
            request = self.requests.get(parent.request_id, ())
            self.requests[parent.request_id] = request + (e.child_seq_id,)

    def _move(self, seq_ids: tuple[int, ...], mapping, src_device: str, dst_device: str, status: str) -> None:
        """Each table's blocks to their destinations: a free one takes the source's tokens, hash
        and digest; a cached one (a block found by hash) is revived as it is; one in use is shared."""
        where = dict(mapping)
        for seq_id in seq_ids:
            new_table = []
            for _, number in self.tables.get(seq_id, []):
                src = self.pools[src_device][number]
                dst = self.pools[dst_device][where[number]]
                if dst.state == CACHED:
                    dst.state = USED
                elif dst.state != USED:
                    dst.clear()
                    dst.token_ids = src.token_ids
                    dst.block_hash = src.block_hash
                    dst.parent_hash = src.parent_hash
                    dst.num_hashed_tokens = src.num_hashed_tokens
                    dst.digest, dst.digest_slots = src.digest, src.digest_slots
                    dst.state = USED
                dst.ref_count += 1
                dst.owners.add(seq_id)
                new_table.append((dst_device, dst.number))
            self.tables[seq_id] = new_table
            if seq_id in self.seqs:
                self.seqs[seq_id].status = status

    def _on_swap_out(self, e: ev.SwappedOut) -> None:
        self._move(e.seq_ids, e.mapping, "gpu", "cpu", "swapped")

    def _on_swap_in(self, e: ev.SwappedIn) -> None:
        self._move(e.seq_ids, e.mapping, "cpu", "gpu", "running")

    def _on_freed(self, e: ev.BlockFreed) -> None:
        block = self.pools[e.device][e.block]
        block.ref_count = e.ref_count
        if e.seq_id == OFFLOAD_PIN:
            self._unpin(e.block)
        block.owners.discard(e.seq_id)
        if e.ref_count == 0:
            if e.cached:
                block.state = CACHED
            else:
                hash_map = self.cpu_hash_map if e.device == "cpu" else self.hash_map
                if block.registered and hash_map.get(block.block_hash) == block.number:
                    del hash_map[block.block_hash]
                block.clear()
            if self.design.free_queue and e.device == "gpu":
                if e.cached:
                    self.free_queue.append(e.block)
                else:
                    self.free_queue.insert(0, e.block)

    def _on_seq_freed(self, e: ev.SequenceFreed) -> None:
        self.tables.pop(e.seq_id, None)
        for tables in self.group_tables.values():
            tables.pop(e.seq_id, None)

    def _on_skipped(self, e: ev.BlocksSkipped) -> None:
        """A sliding window let blocks go: their slots hold the null block (the frees follow)."""
        table = self.tables_of(e.group)[e.seq_id]
        for index in e.logical_indices:
            table[index] = ("gpu", 0)

    def _on_evicted(self, e: ev.BlockEvicted) -> None:
        block = self.pools[e.device][e.block]
        if e.device == "cpu":  # the CPU pool's own hash map: vLLM's CPU tier, or v0's swap pool
            if self.design.null_block:
                self._drop_cpu_hash(e.block_hash, e.block)
            elif self.cpu_hash_map.get(e.block_hash) == e.block:
                del self.cpu_hash_map[e.block_hash]
            block.clear()
            return
        self._leave_queue(e.device, e.block)  # v1: popped from the free queue's head
        if self.design.shared_hashes:  # another holder of its hash may take over
            holders = tuple(b for b in self.hash_blocks.get(e.block_hash, ()) if b != e.block)
            if holders:
                self.hash_blocks[e.block_hash] = holders
                self.hash_map[e.block_hash] = holders[0]
            else:
                self.hash_blocks.pop(e.block_hash, None)
                self.hash_map.pop(e.block_hash, None)
        elif self.hash_map.get(e.block_hash) == e.block:
            del self.hash_map[e.block_hash]
        block.clear()

    def _on_radix_inserted(self, e: ev.RadixNodeInserted) -> None:
        self.radix_nodes[e.node_id] = RadixNode(e.parent_id, e.token_ids, e.slots, e.lock_ref)

    def _on_radix_split(self, e: ev.RadixNodeSplit) -> None:
        """The head of the node's run becomes a new node in its place; the node keeps the tail
        under it (SGLang RadixCache._split_node)."""
        node, size = self.radix_nodes[e.node_id], e.num_tokens
        self.radix_nodes[e.new_node_id] = RadixNode(node.parent_id, node.token_ids[:size], node.slots[:size],
                                                    node.lock_ref)
        self.radix_nodes[e.node_id] = RadixNode(e.new_node_id, node.token_ids[size:], node.slots[size:],
                                                node.lock_ref)

    def _on_radix_lock_ref(self, e: ev.RadixLockRef) -> None:
        self.radix_nodes[e.node_id] = self.radix_nodes[e.node_id]._replace(lock_ref=e.lock_ref)

    def _on_radix_evicted(self, e: ev.RadixNodeEvicted) -> None:
        self.radix_nodes.pop(e.node_id, None)

    def _drop_cpu_hash(self, block_hash: int, number: int) -> None:
        if self.cpu_hash_map.get(block_hash) == number:
            del self.cpu_hash_map[block_hash]
            others = [b.number for b in self.pools["cpu"] if b.block_hash == block_hash and b.number != number]
            if others:
                self.cpu_hash_map[block_hash] = others[0]

    def _on_offload_store(self, e: ev.OffloadStored) -> None:
        """vLLM's CPU tier: each GPU block pinned for its copy, each CPU block a cached copy of it."""
        for (gpu_number, cpu_number), block_hash, parent_hash, token_ids in zip(
                e.mapping, e.block_hashes, e.parent_hashes, e.token_ids):
            src, dst = self.pools["gpu"][gpu_number], self.pools["cpu"][cpu_number]
            src.ref_count += 1
            self.pinned[gpu_number] = self.pinned.get(gpu_number, 0) + 1
            dst.clear()
            dst.block_hash, dst.parent_hash, dst.token_ids = block_hash, parent_hash, token_ids
            dst.num_hashed_tokens = src.num_hashed_tokens
            dst.digest, dst.digest_slots = src.digest, src.digest_slots
            dst.state, dst.registered = CACHED, True
            self.cpu_hash_map.setdefault(block_hash, cpu_number)

    def _on_offload_load(self, e: ev.OffloadLoaded) -> None:
        """vLLM's CPU tier: each GPU block pinned for its load, holding its CPU block's K/V; each
        block a prefix-cache hit served from the CPU; the request waits for the load."""
        if (seq := self.seqs.get(e.seq_id)) is not None:
            seq.waits_on = "loading"
        for cpu_number, gpu_number in e.mapping:
            src, dst = self.pools["cpu"][cpu_number], self.pools["gpu"][gpu_number]
            dst.ref_count += 1
            self.pinned[gpu_number] = self.pinned.get(gpu_number, 0) + 1
            dst.digest, dst.digest_slots = src.digest, src.digest_slots
            src.num_hits += 1
        self.num_prefix_hits += len(e.mapping)
        seq = self.seqs.get(e.seq_id)
        table = self.tables.get(e.seq_id, [])
        if seq is not None and e.mapping and ("gpu", e.mapping[-1][1]) in table:
            seq.num_cached_tokens = (table.index(("gpu", e.mapping[-1][1])) + 1) * self.block_size

    def _unpin(self, number: int) -> None:
        """vLLM's CPU tier released one pin of a GPU block (its copy is done)."""
        pins = self.pinned.get(number, 0) - 1
        if pins > 0:
            self.pinned[number] = pins
        else:
            self.pinned.pop(number, None)

    def _on_request(self, e: ev.RequestAdded) -> None:
        self.requests[e.request_id] = e.seq_ids
        # An engine's own stream carries no prompt texts (the engine session adds them): ids stand in.
        texts = e.prompt_tokens_text or tuple(f"<{token_id}>" for token_id in e.prompt_token_ids)
        for seq_id in e.seq_ids:
            self.seqs[seq_id] = SeqState(
                seq_id, e.request_id, list(e.prompt_token_ids), list(texts), len(e.prompt_token_ids),
            )
        self._lookups.update(dict.fromkeys(e.seq_ids, False))

    def _on_step(self, e: ev.StepStarted) -> None:
        self.step = e.step
        self.step_kind = e.kind
        for seq_id in e.seq_ids:
            if seq_id in self.seqs:
                self.seqs[seq_id].status = "running"
                self.seqs[seq_id].waits_on = ""
            self._looked_up.pop(seq_id, None)
            self._hit_indices.pop(seq_id, None)

    def _on_token(self, e: ev.TokenGenerated) -> None:
        seq = self.seqs.get(e.seq_id)
        if seq is not None:
            seq.token_ids.append(e.token_id)
            seq.token_texts.append(e.text)
        self.num_tokens_generated += 1

    def _on_preempted(self, e: ev.Preempted) -> None:
        self.num_preemptions += 1
        for seq_id in e.seq_ids:
            if seq_id in self.seqs:
                self.seqs[seq_id].status = "swapped" if e.mode == "swap" else "waiting"
                if e.mode != "swap":
                    self.seqs[seq_id].num_computed_tokens = 0
                    self.seqs[seq_id].waits_on = ev.Preempted.type  # "preempted": its frees are still to come
                    self._lookups[seq_id] = True  # admitted again, it looks up all its tokens

    def _on_finished(self, e: ev.SequenceFinished) -> None:
        seq = self.seqs.get(e.seq_id)
        if seq is not None:
            seq.status = "finished"
            seq.finish_reason = e.reason if not e.detail else f"{e.reason}: {e.detail}"

    def _on_digest(self, e: ev.KVDigest) -> None:
        block = self.pools[e.device][e.block]
        block.digest = e.digest
        block.digest_slots = len(block.token_ids)

    def _on_step_finished(self, e: ev.StepFinished) -> None:
        self.step_time_s = e.duration_s

    def _on_tokens_scheduled(self, e: ev.TokensScheduled) -> None:
        """v1: which sequences computed how many tokens this step (a prefill chunk or a decode)."""
        self.num_scheduled_tokens = dict(zip(e.seq_ids, e.num_new_tokens))
        for seq_id, done, new in zip(e.seq_ids, e.num_computed_tokens, e.num_new_tokens):
            if seq_id in self.seqs:
                self.seqs[seq_id].num_computed_tokens = done + new


_HANDLERS = {
    ev.BlockAllocated: ReducerState._on_allocated,
    ev.PrefixCacheHit: ReducerState._on_hit,
    ev.BlockHashed: ReducerState._on_hashed,
    ev.SlotAppended: ReducerState._on_slot,
    ev.CopyOnWrite: ReducerState._on_cow,
    ev.Forked: ReducerState._on_fork,
    ev.SwappedOut: ReducerState._on_swap_out,
    ev.SwappedIn: ReducerState._on_swap_in,
    ev.BlockFreed: ReducerState._on_freed,
    ev.SequenceFreed: ReducerState._on_seq_freed,
    ev.BlocksSkipped: ReducerState._on_skipped,
    ev.BlockEvicted: ReducerState._on_evicted,
    ev.RequestAdded: ReducerState._on_request,
    ev.StepStarted: ReducerState._on_step,
    ev.TokenGenerated: ReducerState._on_token,
    ev.Preempted: ReducerState._on_preempted,
    ev.SequenceFinished: ReducerState._on_finished,
    ev.KVDigest: ReducerState._on_digest,
    ev.StepFinished: ReducerState._on_step_finished,
    ev.TokensScheduled: ReducerState._on_tokens_scheduled,
    ev.OffloadStored: ReducerState._on_offload_store,
    ev.OffloadLoaded: ReducerState._on_offload_load,
    ev.RadixNodeInserted: ReducerState._on_radix_inserted,
    ev.RadixNodeSplit: ReducerState._on_radix_split,
    ev.RadixLockRef: ReducerState._on_radix_lock_ref,
    ev.RadixNodeEvicted: ReducerState._on_radix_evicted,
}


def _mapping_blocks(e: ev.SwappedOut | ev.SwappedIn) -> dict[str, frozenset[int]]:
    src, dst = ("gpu", "cpu") if isinstance(e, ev.SwappedOut) else ("cpu", "gpu")
    return {src: frozenset(a for a, _ in e.mapping), dst: frozenset(b for _, b in e.mapping)}


# The events that change other blocks than their own `block` (the rest change that one, or none).
_CHANGES: dict[type[ev.Event], Callable[[Any], dict[str, frozenset[int]]]] = {
    ev.CopyOnWrite: lambda e: {e.device: frozenset((e.src_block, e.dst_block))},
    ev.Forked: lambda e: {e.device: frozenset(e.blocks)},
    ev.SwappedOut: _mapping_blocks,
    ev.SwappedIn: _mapping_blocks,
    ev.OffloadStored: lambda e: {"gpu": frozenset(g for g, _ in e.mapping), "cpu": frozenset(c for _, c in e.mapping)},
    ev.OffloadLoaded: lambda e: {"cpu": frozenset(c for c, _ in e.mapping), "gpu": frozenset(g for _, g in e.mapping)},
    ev.BlocksSkipped: lambda e: {"gpu": frozenset(e.blocks)},
}


def touched_blocks(event: ev.Event | None) -> dict[str, frozenset[int]]:
    """The blocks an event changed, per device: the reducer recodes them (_RECODES), the views
    underline them."""
    if event is None:
        return {}
    changes = _CHANGES.get(type(event))
    if changes is not None:
        return changes(event)
    block = getattr(event, "block", None)
    return {event.device: frozenset((block,))} if block is not None else {}


# Events whose handler changes no block's state or hash (ref counts, tokens, digests only).
_CODES_KEPT = frozenset({ev.SlotAppended, ev.KVDigest, ev.Forked, ev.OffloadLoaded})


def _recode_one(state: ReducerState, event: Any) -> None:
    state._recode(event.device, event.block)


def _recoder(changes: Callable[[Any], dict[str, frozenset[int]]]) -> Callable[[ReducerState, Any], None]:
    def recode(state: ReducerState, event: Any) -> None:
        for device, numbers in changes(event).items():
            for number in numbers:
                state._recode(device, number)
    return recode


# Per handled event class, what recodes the blocks its handler changed (touched_blocks), or None:
# ReducerState.apply runs it after the handler. An event class the reducer gains is recoded too.
_RECODES: dict[type[ev.Event], Callable[[ReducerState, Any], None] | None] = {
    cls: None if cls in _CODES_KEPT else _recoder(_CHANGES[cls]) if cls in _CHANGES
    else _recode_one if "block" in cls.__struct_fields__ else None
    for cls in _HANDLERS}


def _deepcopy(value):
    """Scalars as they are; anything else (a field without a fast path) deep-copied."""
    return value if isinstance(value, (int, float, str, bool, type(None))) else copy.deepcopy(value)


class _Snapshot:
    """Freeze a slots dataclass to the tuple of its fields' values and back, by the names
    dataclasses.fields() gives (a reordered or added field is kept right); `mutable` names the
    fields holding a container, with how to freeze it and how to thaw it."""

    def __init__(self, cls: type, **mutable: tuple[Callable, Callable]) -> None:
        names = [f.name for f in fields(cls)]
        self._cls = cls
        self._values = attrgetter(*names)
        self._mutable = [(names.index(name), freeze, thaw) for name, (freeze, thaw) in mutable.items()]

    def freeze(self, obj: Any) -> tuple:
        values = list(self._values(obj))
        for index, freeze, _ in self._mutable:
            values[index] = freeze(values[index])
        return tuple(values)

    def thaw(self, frozen: tuple) -> Any:
        values = list(frozen)
        for index, _, thaw in self._mutable:
            values[index] = thaw(values[index])
        return self._cls(*values)


_BLOCKS = _Snapshot(BlockState, owners=(tuple, set))
_SEQS = _Snapshot(SeqState, token_ids=(tuple, list), token_texts=(tuple, list))
_DICTS = ("hash_map", "requests", "counts", "hash_blocks", "num_scheduled_tokens", "pinned",
          "radix_nodes")  # values immutable
# How ReducerState.freeze / thaw turn each container attribute into tuples and back.
_FREEZE = {
    "pools": lambda pools: tuple((device, tuple(map(_BLOCKS.freeze, blocks))) for device, blocks in pools.items()),
    "tables": lambda tables: tuple((seq_id, tuple(table)) for seq_id, table in tables.items()),
    "seqs": lambda seqs: tuple(map(_SEQS.freeze, seqs.values())),
    "free_queue": tuple,
    "group_tables": lambda groups: tuple((g, _FREEZE["tables"](tables)) for g, tables in groups.items()),
    "kv_cache_groups": lambda groups: groups,  # a tuple of NamedTuples
    "design": lambda design: design,  # frozen: shared by every snapshot
    "codes": lambda codes: tuple((device, bytes(device_codes)) for device, device_codes in codes.items()),
    "hashed_gpu_blocks": tuple,
    **{name: lambda mapping: tuple(mapping.items()) for name in _DICTS},
}
_THAW = {
    "pools": lambda pools: {device: list(map(_BLOCKS.thaw, blocks)) for device, blocks in pools},
    "tables": lambda tables: {seq_id: list(table) for seq_id, table in tables},
    "seqs": lambda seqs: {seq.seq_id: seq for seq in map(_SEQS.thaw, seqs)},
    "free_queue": list,
    "group_tables": lambda groups: {g: _THAW["tables"](tables) for g, tables in groups},
    "kv_cache_groups": lambda groups: groups,
    "design": lambda design: design,
    "codes": lambda codes: {device: bytearray(device_codes) for device, device_codes in codes},
    "hashed_gpu_blocks": set,
    **{name: dict for name in _DICTS},
}

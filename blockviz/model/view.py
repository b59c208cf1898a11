"""The view model: the records every front end draws, computed from the reducer state at a cursor.

One pure function per panel, used by the TUI (blockviz/tui/widgets) and the notebook
(blockviz/jupyter, whose JavaScript only draws what these return): the pools (`block_cell`,
`pool_columns`, `pool_counts`, `pool_record`: a big pool or a range of it through
blockviz.model.pool_zoom), the block tables (`tables`), the hash chains (`hash_chains`), the
block inspector (`inspect_block`), the event log (`log_row`, `LogIndex`, `event_log`) and the
playback line (`cursor_line`, with the narration). The records Python reads (a table row and its
progress, a hash-chain row, the inspector, the free queue) are dataclasses (blockviz.model.record);
`snapshot()` puts every record, as JSON (`to_json()`), into one compact frame (a 4,096-block pool is a few tens of kilobytes), so a test can compare any view
with the reducer without a terminal or a browser, and a browser test can compare the page with the
kernel. No textual, no ipywidgets.
"""

from __future__ import annotations

import bisect
from dataclasses import dataclass, field
from typing import Any, NamedTuple

from blockviz.model.design import SLIDING_WINDOW
from blockviz.model.glossary import DEFINITIONS
from blockviz.model.names import RequestNames
from blockviz.model.narration import FILTERS, describe, narrate, step_label
from blockviz.model.palette import event_number, group_colour, group_mark, short_hash, show_tokens
from blockviz.model.pool_zoom import MAX_BLOCK_CELLS, cell_counts, check_range, zoom_level
from blockviz.model.record import Record
from blockviz.model.reducer import (CACHED_CODE, FREE_CODE, NULL, NULL_CODE, USED, USED_CODE, BlockState, ReducerState,
                                    state_code, touched_blocks)
from engine import events as ev

STATE_CODES = {"used": USED_CODE, "cached": CACHED_CODE, "free": FREE_CODE, "null": NULL_CODE}  # "state"'s characters
CODE_STATES = {code: name for name, code in STATE_CODES.items()}
USED_BYTE, CACHED_BYTE, FREE_BYTE = (code.encode("ascii") for code in (USED_CODE, CACHED_CODE, FREE_CODE))
STATE_LABELS = {"used": "used", "cached": "cached-free", "free": "free", "null": "null block"}  # the words for each state
MAX_TABLES = 32  # sequences shown in the notebook's block tables (those holding blocks first)
MAX_HASHES = 128  # hashed blocks shown in the notebook's hash chains
MAX_LOG_ROWS = 200  # events shown in the notebook's log, ending at the cursor
MAX_LOG_SCAN = 20_000  # events looked at, going back from the cursor, to fill a filtered log
FREE_QUEUE_SHOWN = 12  # blocks of vLLM v1's free queue the views list, head first
WINDOW_SLOT_NOTE = "∅ null block: the window slid past, the block went back to the pool"  # a freed window slot
NULL_BLOCK_NOTE = ("vLLM v1's null block: a placeholder a block table can point at for a block it skips "
                   "(sliding-window layers); never allocated, freed, cached or counted as free")
# What a v1 run says where a v0 view would stand empty, one line each (v1_notes).
V1_NOTES = {
    "swap": "vLLM v1 never swaps: it recomputes",  # short: it fits the CPU pool box at 80x24
    # vLLM 0.33 copies a block only for a hit that ends inside it (a partial-block hit:
    # SingleTypeKVCacheManager._apply_cow), which this engine's v1 never makes
    "cow": "vLLM v1 copies a block only on a partial-block hit",
}
# The same lines for a radix-tree run (SGLang's RadixCache): no CPU tier here, and pages are shared
# whole (RadixCache.match_prefix stops at a page boundary), never copied.
RADIX_NOTES = {
    "swap": "SGLang has no CPU tier here: it retracts",  # ScheduleBatch.retract_decode, then recompute
    "cow": "SGLang shares whole pages, never copies",
}
# The note (V1_NOTES) a guide card's idea (blockviz/model/guide.py IDEAS) is about in a v1 run.
NOTE_OF_IDEA = {"recompute": "swap", "swap-out": "swap", "swap-in": "swap", "prefix-hit": "cow", "forking": "cow",
                "copy-on-write": "cow"}


# ------------------------------------------------------------------------------------ blocks and pools


def block_state(block: BlockState) -> str:
    """"used", "cached" (free but still hashed: a prefix-cache hit can revive it until it is
    evicted), "free", or "null" (vLLM v1's block 0, BlockPool.null_block): the one rule every view
    colours a block by (reducer.state_code, named)."""
    return CODE_STATES[state_code(block)]


class BlockCell(NamedTuple):
    """What a pool draws for one block: its state, ref count, slots filled (0 when free), and its
    first and second owner by sequence id (-1 when none)."""

    state: str
    ref: int
    fill: int
    owner: int
    owner2: int


_FREE_CELL = BlockCell("free", 0, 0, -1, -1)
_NULL_CELL = BlockCell("null", 0, 0, -1, -1)
_cell = tuple.__new__  # BlockCell(...) without NamedTuple's Python-level __new__: pools draw thousands


def block_cell(block: BlockState) -> BlockCell:
    """The cell of one block (BlockCell)."""
    if block.state == USED:
        owners = block.owners
        if len(owners) > 1:
            first, second = sorted(owners)[:2]
        else:
            first, second = (next(iter(owners)) if owners else -1), -1
        return _cell(BlockCell, ("used", block.ref_count, len(block.token_ids), first, second))
    if block.block_hash is not None:
        return _cell(BlockCell, ("cached", 0, len(block.token_ids), -1, -1))
    return _NULL_CELL if block.state == NULL else _FREE_CELL


def pool_columns(pool: list[BlockState]) -> dict[str, Any]:
    """A pool as columns of its cells (block_cell): per block its state code, ref count, slots
    filled, first and second owner."""
    if not pool:
        return {"n": 0, "state": "", "ref": [], "fill": [], "owner": [], "owner2": []}
    states, refs, fills, owners, owners2 = zip(*map(block_cell, pool))
    return {"n": len(pool), "state": "".join(map(STATE_CODES.__getitem__, states)),
            "ref": list(refs), "fill": list(fills), "owner": list(owners), "owner2": list(owners2)}


def pool_counts(state: ReducerState) -> dict[str, tuple[int, int, int]]:
    """Per device: (used, cached-free, free) blocks, counted in the reducer's state codes (v1's null
    block is none of them: vLLM v1 never counts it)."""
    return {device: _counts(state, device) for device in state.pools}


def _counts(state: ReducerState, device: str) -> tuple[int, int, int]:
    codes = state.codes[device]
    return codes.count(USED_BYTE), codes.count(CACHED_BYTE), codes.count(FREE_BYTE)


def pool_record(state: ReducerState, device: str, start: int | None = None, stop: int | None = None) -> dict[str, Any]:
    """One pool as every front end draws it: `n` (its blocks), the used / cached / free counts and
    the `empty_line`; then, for a pool of at most MAX_BLOCK_CELLS blocks and no range, its columns
    (pool_columns); for a range (`start` to `stop`) or a bigger pool, `start`, `stop` and
    `per_cell` (pool_zoom.zoom_level): a range of at most MAX_BLOCK_CELLS blocks has the columns of
    those blocks (index i is block start + i), a bigger one per cell its counts of each state
    (`cells`, pool_zoom.cell_counts) and in `state` the state most of its blocks are in."""
    pool = state.pools[device]
    counts = _counts(state, device)
    if start is None and stop is None and len(pool) <= MAX_BLOCK_CELLS:
        return {**pool_columns(pool), "used": counts[0], "cached": counts[1], "free": counts[2],
                "empty_line": empty_pool_line(state, device, counts), **_group_column(state, pool)}
    start, stop = check_range(start or 0, len(pool) if stop is None else stop, len(pool))
    per_cell = zoom_level(stop - start)
    record = {"n": len(pool), "start": start, "stop": stop, "per_cell": per_cell, "used": counts[0],
              "cached": counts[1], "free": counts[2], "empty_line": empty_pool_line(state, device, counts)}
    if per_cell == 1:
        return {**pool_columns(pool[start:stop]), **record, **_group_column(state, pool[start:stop])}
    cells = cell_counts(state.block_codes(device, start, stop), start, per_cell)
    return {**record, "state": cells.codes(), "cells": cells.to_json()}


def has_groups(state: ReducerState) -> bool:
    """Whether the run has several KV-cache groups (a hybrid model's): only then do the views name
    and mark groups; a one-group run shows no group marks."""
    return state.num_kv_cache_groups > 1


def block_group(block: BlockState) -> int:
    """The KV-cache group a block is marked with: its group while used or cached-free (a table or
    the prefix cache of that group holds it), -1 when free or the null block (no group's)."""
    return block.group if state_code(block) in (USED_CODE, CACHED_CODE) else -1


def _group_column(state: ReducerState, blocks: list[BlockState]) -> dict[str, Any]:
    """`group`: per block its block_group, in a run with several KV-cache groups; nothing else."""
    return {"group": [block_group(block) for block in blocks]} if has_groups(state) else {}


@dataclass(slots=True)
class KVCacheGroupInfo(Record):
    """One KV-cache group as the views name it: its number, label ("group 1 · sliding window 4"),
    mark (palette.group_mark) and colour (palette.group_colour)."""

    group: int
    label: str
    mark: str
    colour: str


def group_label(state: ReducerState, group: int) -> str:
    """"group 1 · sliding window 4" or "group 0 · full attention" (vLLM KVCacheGroupSpec's kind
    and window, from the run's header)."""
    groups = state.kv_cache_groups
    if group < len(groups) and groups[group].kind == SLIDING_WINDOW:
        return f"group {group} · sliding window {groups[group].sliding_window}"
    return f"group {group} · full attention"


def kv_cache_groups(state: ReducerState) -> list[KVCacheGroupInfo]:
    """The run's KV-cache groups that hold blocks (ReducerState.groups_holding_blocks) as
    KVCacheGroupInfo, [] for a run with one group."""
    if not has_groups(state):
        return []
    return [KVCacheGroupInfo(g, group_label(state, g), group_mark(g), group_colour(g))
            for g in state.groups_holding_blocks()]


@dataclass(slots=True)
class FreeQueue(Record):
    """vLLM v1's free queue head first: `blocks` as [block, cached] (cached: still hashed, so taking
    it evicts its hash), `num_free` and `num_cached` over the whole queue."""

    blocks: list[list]
    num_free: int
    num_cached: int


def free_queue(state: ReducerState, limit: int | None = FREE_QUEUE_SHOWN) -> FreeQueue | None:
    """vLLM v1's free queue (FreeKVCacheBlockQueue) head first, the order get_new_blocks takes
    blocks in, its first `limit` blocks (FreeQueue). None for a design without one (v0)."""
    if not state.design.free_queue:
        return None
    pool = state.pools["gpu"]
    queue = state.free_queue if limit is None else state.free_queue[:limit]
    # A cached-free GPU block is in the queue (still hashed): the reducer's codes count them.
    return FreeQueue([[number, pool[number].block_hash is not None] for number in queue], len(state.free_queue),
                     state.codes["gpu"].count(CACHED_BYTE))


def v1_notes(state: ReducerState, ideas: tuple[str, ...] = ()) -> dict[str, str]:
    """One line for each view a v1 run has nothing to show in (V1_NOTES: the CPU pool and swap,
    copy-on-write; RADIX_NOTES in an SGLang run); empty for a v0 run. The note a guide card's
    `ideas` are about comes first, so a screen with room for one line shows that one."""
    lacks = {"swap": not state.design.swap and not state.pools["cpu"],  # vLLM's CPU tier is a CPU pool
             "cow": not state.design.copy_on_write}
    about = {NOTE_OF_IDEA[idea] for idea in ideas if idea in NOTE_OF_IDEA}
    notes = RADIX_NOTES if state.design.radix_tree else V1_NOTES
    return {view: notes[view] for view in sorted(notes, key=lambda view: view not in about) if lacks[view]}


def empty_pool_line(state: ReducerState, device: str, counts: tuple[int, int, int]) -> str:
    """The one line a swap pool with nothing in it collapses to ("CPU pool: 2048 blocks, never
    used" when nothing was ever swapped out to it), or "" when it holds a block. The GPU pool is
    always drawn: its free blocks are the lesson. `counts`: pool_counts' (used, cached, free)."""
    pool = state.pools[device]
    if device != "cpu" or not pool or counts[0] or counts[1]:
        return ""
    swapped = state.counts.get(ev.SwappedOut.type, 0)
    if not swapped:
        return f"CPU pool: {len(pool)} blocks, never used"
    return f"CPU pool: {len(pool)} blocks, empty ({swapped} swap-out{'s' if swapped > 1 else ''}, all swapped back in)"


def block_token_texts(state: ReducerState, block: BlockState, vocab: dict[int, str] | None = None) -> list[str]:
    """The text piece of each token in `block`, read from an owner sequence when there is one
    (its position gives the exact piece), else from the id -> text map of the run."""
    for seq_id in sorted(block.owners):
        table = state.tables_of(block.group).get(seq_id)
        seq = state.seqs.get(seq_id)
        if not table or seq is None:
            continue
        for index, where in enumerate(table):
            if where == (block.device, block.number):
                start = index * state.block_size
                texts = seq.token_texts[start:start + len(block.token_ids)]
                if len(texts) == len(block.token_ids):
                    return texts
    vocab = vocab or {}
    return [vocab.get(token_id, f"<{token_id}>") for token_id in block.token_ids]


# ------------------------------------------------------------------------------------ block tables


def _slot_texts(state: ReducerState, seq_id: int, index: int, block: BlockState,
                vocab: dict[int, str] | None) -> list[str]:
    seq = state.seqs.get(seq_id)
    start = index * state.block_size
    if seq is not None:
        texts = seq.token_texts[start:start + len(block.token_ids)]
        if len(texts) == len(block.token_ids):
            return show_tokens(texts)
    return show_tokens(block_token_texts(state, block, vocab))


@dataclass(slots=True)
class Progress(Record):
    """vLLM v1's chunked-prefill progress of a sequence (see `progress`)."""

    computed: int
    num_tokens: int
    prompt: int
    scheduled: int
    prefilling: bool
    text: str = ""


@dataclass(slots=True)
class GroupTable(Record):
    """A sequence's block table in one more KV-cache group (vLLM KVCacheManager.get_blocks per
    group): the group, its label (group_label), `blocks` as TableRow's, and `skipped`: the logical
    blocks whose slot holds the null block (a sliding window let the block go: vLLM
    SlidingWindowManager.remove_skipped_blocks)."""

    group: int
    label: str
    blocks: list[list]
    skipped: list[int]


@dataclass(slots=True)
class TableRow(Record):
    """One sequence's block table: per logical block [device, block, ref count, the token text in
    each slot]; `num_tokens` the tokens in its slots (num_slotted_tokens); `progress` in a design
    with chunked prefill (v1) while the sequence runs. In a run
    with several KV-cache groups `blocks` is group 0's table, `label` names group 0 (group_label),
    `groups` holds the other groups' tables (GroupTable); `skipped` the logical blocks of group 0
    that hold the null block; `name` the sequence as every panel names it (blockviz.model.names:
    "request 3", "request 3 (seq 4)" where the request has several)."""

    seq: int
    request: str
    status: str
    finish: str
    num_tokens: int
    blocks: list[list]
    progress: Progress | None = None
    label: str = ""
    skipped: list[int] = field(default_factory=list)
    groups: list[GroupTable] = field(default_factory=list)
    name: str = ""


def tables(state: ReducerState, limit: int | None = MAX_TABLES,
           vocab: dict[int, str] | None = None) -> list[TableRow]:
    """Each sequence's block table (vLLM v0 BlockSpaceManager.block_tables: logical index ->
    device, block, ref count, the token text in each slot), by sequence id; with a `limit`, the
    sequences holding blocks first, then the rest by id."""
    seq_ids = set(state.seqs) | set(state.tables)
    if limit is not None:
        seq_ids = sorted(seq_ids, key=lambda s: (s not in state.tables, s))[:limit]
    rows = []
    groups = state.groups_holding_blocks()[1:] if has_groups(state) else None
    names = RequestNames(state)
    for seq_id in sorted(seq_ids):
        seq = state.seqs.get(seq_id)
        blocks, skipped = _group_blocks(state, seq_id, state.tables.get(seq_id, ()), vocab)
        row = TableRow(seq_id, seq.request_id if seq else "?", status_word(state, seq_id),
                       (seq.finish_reason or "") if seq else "", num_slotted_tokens(state, seq_id), blocks,
                       progress(state, seq_id) if state.design.chunked_prefill else None, skipped=skipped,
                       name=names((seq_id,)))
        if groups is not None:
            row.label = group_label(state, 0)
            row.groups = [GroupTable(g, group_label(state, g),
                                     *_group_blocks(state, seq_id, state.tables_of(g).get(seq_id, ()), vocab))
                          for g in groups]
        rows.append(row)
    return rows


def status_word(state: ReducerState, seq_id: int) -> str:
    """A sequence's status as its table says it: the reducer's (vLLM's SequenceStatus /
    RequestStatus words), except that a sequence holding blocks is never "waiting": "preempted"
    while a recompute preemption's frees are still to come, "loading" while vLLM's CPU tier copies
    its prefix back (WAITING_FOR_REMOTE_KVS), else "running" (its blocks placed by this step's
    schedule, before the step starts: vLLM's Scheduler.schedule makes it RUNNING there)."""
    seq = state.seqs.get(seq_id)
    if seq is None:
        return "?"
    if seq.status != "waiting" or not holds_blocks(state, seq_id):
        return seq.status
    return seq.waits_on or "running"


def num_slotted_tokens(state: ReducerState, seq_id: int) -> int:
    """The tokens a table counts: while the sequence holds blocks, the tokens in their slots (a
    token sampled this step has none until the next step's append_slots / allocate_slots gives it
    one; a chunked prompt's later chunks none until scheduled), a slot a sliding window let go
    (the null block) counted full; the most any of its KV-cache groups holds. A sequence holding
    none (waiting, finished): all its tokens."""
    seq = state.seqs.get(seq_id)
    size = state.block_size
    counts = [sum(size if block.state == NULL else len(block.token_ids)
                  for block in (state.pools[device][number] for device, number in table))
              for table in state.seq_tables(seq_id) if table]
    if counts:
        return max(counts)
    return len(seq.token_ids) if seq is not None else 0


def holds_blocks(state: ReducerState, seq_id: int) -> bool:
    """Whether any of the sequence's tables (every KV-cache group's) holds a block other than the null block."""
    return any(state.pools[device][number].state != NULL
               for table in state.seq_tables(seq_id) for device, number in table)


def _group_blocks(state: ReducerState, seq_id: int, table, vocab: dict[int, str] | None) -> tuple[list[list], list[int]]:
    """One table's blocks ([device, block, ref count, slot texts]) and the logical blocks holding
    vLLM v1's null block (a slot a sliding window let go: no texts)."""
    blocks, skipped = [], []
    for index, (device, number) in enumerate(table):
        block = state.pools[device][number]
        if block.state == NULL:
            skipped.append(index)
            blocks.append([device, number, 0, []])
            continue
        blocks.append([device, number, block.ref_count, _slot_texts(state, seq_id, index, block, vocab)])
    return blocks, skipped


def progress(state: ReducerState, seq_id: int) -> Progress | None:
    """vLLM v1's chunked-prefill progress of a sequence (Request.num_computed_tokens against its
    tokens, and SchedulerOutput.num_scheduled_tokens of the last step): `computed` of
    `num_tokens` tokens have K/V, `scheduled` were computed by the last step (0: not scheduled),
    `prefilling` while more than the next token is still to compute (a prefill cut into chunks,
    or one recomputed after a preemption), `text` all that in words. None once the sequence
    finished."""
    seq = state.seqs.get(seq_id)
    if seq is None or seq.status == "finished":
        return None
    computed, num_tokens = seq.num_computed_tokens, len(seq.token_ids)
    info = Progress(computed, num_tokens, seq.num_prompt_tokens, state.num_scheduled_tokens.get(seq_id, 0),
                    num_tokens - computed > 1)
    # tokens the prefix cache served it, placed in its table but not yet scheduled (an admission's hits)
    served = seq.num_cached_tokens if seq_id in state.tables and seq.num_cached_tokens > computed else 0
    info.text = _progress_text(info, served)
    return info


def _progress_text(info: Progress, served: int = 0) -> str:
    """A sequence's progress in words, as both front ends write it; `served`: tokens the prefix
    cache has just served it, before a step computes the rest (they are not waiting)."""
    done = f"{info.computed}/{info.num_tokens}"
    if info.prefilling:
        if served and not info.scheduled:
            return f"prefill {done} · {served} from the cache"
        return f"prefill {done} · " + (f"chunk +{info.scheduled}" if info.scheduled else "waits")
    return f"{done} computed" + (f" · +{info.scheduled} this step" if info.scheduled else "")


# ------------------------------------------------------------------------------------ hash chains


@dataclass(slots=True)
class HashRow(Record):
    """One hashed GPU block in the hash chains: its number, short hash and parent's ("" for a
    root), indent and branch mark, ref count, hits, whether the current event hit it, its state
    (block_state), whether its hash is in the map, its tokens as text."""

    block: int
    hash: str
    parent: str
    depth: int
    branch: str
    ref: int
    hits: int
    hit_now: bool
    state: str
    registered: bool
    tokens: list[str]


@dataclass(slots=True)
class HashSummary(Record):
    """The prefix cache in numbers: hashes in the map, prompt blocks that hit (one per block of a
    request's hit, however many KV-cache groups hold it: the explainer's "prefix hit: N blocks"),
    prompt blocks looked up; both over every request's lookups."""

    in_map: int
    hits: int
    looked_up: int


def hash_chains(state: ReducerState, limit: int | None = MAX_HASHES, *, current: ev.Event | None = None,
                vocab: dict[int, str] | None = None) -> list[HashRow]:
    """The hashed GPU blocks (nano-vllm's compute_hash chain: each block's hash covers its parent's
    hash and its tokens) in chain order, each after its parent. A chain runs straight down; where
    it branches the children indent: `depth` is the indent and `branch` "├" / "└" marks a branch.
    `hit_now` marks the block the `current` event hit."""
    pool = state.pools["gpu"]
    hashed = [pool[number] for number in state.hashed_gpu_blocks]
    known = {b.block_hash for b in hashed}
    children: dict[int | None, list[BlockState]] = {}
    for block in hashed:
        children.setdefault(block.parent_hash if block.parent_hash in known else None, []).append(block)
    hit_block = current.block if isinstance(current, ev.PrefixCacheHit) else None
    stack: list[tuple[BlockState, int, str]] = []

    def push(parent: int | None, depth: int) -> None:
        kids = sorted(children.get(parent, ()), key=lambda b: b.number)
        branching = len(kids) > 1
        for position in range(len(kids) - 1, -1, -1):
            branch = ("└" if position == len(kids) - 1 else "├") if branching else ""
            stack.append((kids[position], depth, branch))

    rows: list[HashRow] = []
    seen: set[int] = set()
    push(None, 0)
    while stack and (limit is None or len(rows) < limit):
        block, depth, branch = stack.pop()
        if block.number in seen:
            continue
        seen.add(block.number)
        rows.append(HashRow(block.number, short_hash(block.block_hash),
                            short_hash(block.parent_hash) if block.parent_hash is not None else "", depth, branch,
                            block.ref_count, block.num_hits, block.number == hit_block, block_state(block),
                            block.registered, show_tokens(block_token_texts(state, block, vocab))))
        push(block.block_hash, depth + 1 if branch else depth)
    return rows


def hash_summary(state: ReducerState) -> HashSummary:
    """The prefix cache in numbers (HashSummary)."""
    return HashSummary(len(state.hash_map), state.num_prefix_hits, state.num_prompt_blocks_looked_up)


# ------------------------------------------------------------------------------------ inspector


@dataclass(slots=True)
class BlockInfo(Record):
    """The inspector's record of one block (see inspect_block); `note` and `queue` are vLLM v1's
    (what the null block is, a free block's place in the free queue), None where they say nothing."""

    device: str
    number: int
    state: str
    ref: int
    owners: list[int]
    fill: int
    block_size: int
    hash: str
    parent: str
    registered: bool
    hits: int
    tokens: list[str]
    digest: str
    digest_slots: int
    digest_current: bool
    same_kv: list[str]
    bytes: str
    note: str | None = None
    queue: str | None = None
    group: str | None = None  # the KV-cache group holding it (group_label), in a run with several
    kv_cache_group_id: int | None = None  # that group's number (vLLM kv_cache_group_id)
    owner_names: list[str] = field(default_factory=list)  # each owner as the tables name it (blockviz.model.names)


def inspect_block(state: ReducerState, device: str, number: int,
                  vocab: dict[int, str] | None = None, geometry: str = "") -> BlockInfo:
    """Everything about one block: state, refs, owners, fill, hash, parent, hits, tokens, the digest
    of its real K/V, and the other blocks holding the same digest ("same K/V" while the digest
    covers every slot the block holds, "same digest" otherwise), and what every block of the pool
    holds in bytes (`geometry`: trace.kv_geometry of the run's header)."""
    block = state.pools[device][number]
    name = block_state(block)
    filled = len(block.token_ids) if name != "free" else 0
    same = []
    if block.digest:
        same = [f"{b.device} {b.number}" for pool in state.pools.values() for b in pool
                if b.digest == block.digest and b is not block and block_state(b) != "free"]
    info = BlockInfo(
        device, number, name, block.ref_count, sorted(block.owners), filled, state.block_size,
        short_hash(block.block_hash, 16) if block.block_hash is not None else "",
        short_hash(block.parent_hash, 16) if block.parent_hash is not None else "",
        block.registered, block.num_hits,
        show_tokens(block_token_texts(state, block, vocab)) if filled else [],
        block.digest or "", block.digest_slots, block.digest_slots == filled, same, geometry)
    names = RequestNames(state)
    info.owner_names = [names((seq_id,)) for seq_id in info.owners]
    if has_groups(state) and block_group(block) >= 0:
        info.group, info.kv_cache_group_id = group_label(state, block.group), block.group
    if block.state == NULL:  # vLLM v1's null block
        info.note = NULL_BLOCK_NOTE
    elif device == "gpu" and state.design.free_queue and number in state.free_queue:
        place = state.free_queue.index(number)
        info.queue = ("next to go" if place == 0 else f"{place + 1} of {len(state.free_queue)}") + " in the free queue"
    return info


def snapshot(state: ReducerState, *, current: ev.Event | None = None,
             selected: tuple[str, int] | None = None, vocab: dict[int, str] | None = None,
             geometry: str = "", ranges: dict[str, tuple[int, int]] | None = None) -> dict[str, Any]:
    """The picture of `state`: pools (pool_record: columns or zoomed-out cells, and counts),
    tables, hash chains, the inspected block.

    `current` is the event the cursor just passed (its blocks are marked touched); `selected` the
    (device, number) the inspector shows; `vocab` words tokens no sequence holds any more;
    `ranges` the (start, stop) blocks a pool is zoomed into, per device (a range outside the pool
    is left out)."""
    pools = {}
    for device in state.pools:
        span = (ranges or {}).get(device)
        try:
            pools[device] = pool_record(state, device, *(span or (None, None)))
        except ValueError:  # a range the pool no longer holds: the whole pool
            pools[device] = pool_record(state, device)
    touched = {device: sorted(blocks) for device, blocks in touched_blocks(current).items()}
    if selected is not None:
        device, number = selected
        if not 0 <= number < len(state.pools.get(device, ())):
            selected = None
    return {
        "block_size": state.block_size,
        "pools": pools,
        "touched": touched,
        "selected": list(selected) if selected else None,
        "tables": [row.to_json() for row in tables(state, vocab=vocab)],
        "hashes": [row.to_json() for row in hash_chains(state, current=current, vocab=vocab)],
        "hash_summary": hash_summary(state).to_json(),
        "inspector": inspect_block(state, *selected, vocab=vocab, geometry=geometry).to_json() if selected else None,
        "step": state.step,
        "step_kind": state.step_kind,
        "num_preemptions": state.num_preemptions,
        "num_tokens_generated": state.num_tokens_generated,
        "kv_manager": state.kv_manager,
        "free_queue": queue.to_json() if (queue := free_queue(state)) is not None else None,
        "notes": v1_notes(state),
        **({"kv_cache_groups": [g.to_json() for g in kv_cache_groups(state)]} if has_groups(state) else {}),
    }


# ------------------------------------------------------------------------------------ event log


def log_keeps(kinds: frozenset[type[ev.Event]] | None, event: ev.Event) -> bool:
    """Whether a log filter (a narration.FILTERS value: event records, None for all) keeps `event`."""
    return kinds is None or type(event) in kinds


def log_row(event: ev.Event, vocab: dict[int, str] | None = None, names: RequestNames | None = None) -> list[Any]:
    """One line of the log: [event number (palette.event_number), kind, words (narration.describe,
    its sequences named by `names`, the requests at the cursor, as the tables name them)]."""
    return [event_number(event.seq_no), event.type, describe(event, vocab, names)]


class LogIndex:
    """The indices of the events a filter keeps, kept up to date as the event list grows (each
    event is looked at once), so a log of 100,000 events draws only the lines on screen."""

    def __init__(self, kinds: frozenset[type[ev.Event]] | None = None) -> None:
        self.kinds = kinds
        self.indices: list[int] = []
        self.scanned = 0

    def update(self, events: list[ev.Event]) -> None:
        kinds, indices = self.kinds, self.indices
        for index in range(self.scanned, len(events)):
            if log_keeps(kinds, events[index]):
                indices.append(index)
        self.scanned = len(events)

    def visible(self, position: int) -> int:
        """How many kept events lie before the cursor at `position`."""
        return bisect.bisect_left(self.indices, position)


def event_log(events: list[ev.Event], position: int, filter_name: str = "all events",
              vocab: dict[int, str] | None = None, limit: int = MAX_LOG_ROWS,
              names: RequestNames | None = None) -> list[list[Any]]:
    """The last `limit` events up to the cursor that the filter (a narration.FILTERS name) keeps,
    oldest first, as log rows (log_row; `names`: RequestNames of the state at the cursor)."""
    kinds = FILTERS.get(filter_name)
    rows = []
    stop = max(0, position - MAX_LOG_SCAN)
    for index in range(position - 1, stop - 1, -1):
        event = events[index]
        if log_keeps(kinds, event):
            rows.append(log_row(event, vocab, names))
            if len(rows) >= limit:
                break
    rows.reverse()
    return rows


def summary_text(state: ReducerState, *, title: str = "", position: int = 0, length: int = 0,
                 current: ev.Event | None = None, max_tables: int = 12, step: str = "") -> str:
    """A plain-text picture (for a notebook without widgets, or nbconvert to text); `step`:
    narration.step_label at the cursor."""
    lines = [f"{title or 'blockviz'} · event {position}/{length}" + (f" · {step}" if step else "")]
    notes = v1_notes(state)
    for device, (used, cached, free) in pool_counts(state).items():
        if not state.pools[device] and notes:
            lines.append(f"{device.upper()} pool: {notes['swap']}")
            continue
        lines.append(f"{device.upper()} pool: {len(state.pools[device])} blocks · {used} used · "
                     f"{cached} cached · {free} free")
    queue = free_queue(state)
    if queue is not None:
        more = queue.num_free - len(queue.blocks)
        lines.append("free queue (next to go first): " + (" ".join(
            f"{number}{'c' if cached else ''}" for number, cached in queue.blocks) or "empty")
            + (f" … +{more}" if more > 0 else ""))
    groups = state.groups_holding_blocks()
    names = RequestNames(state)
    for seq_id in sorted(state.tables)[:max_tables]:
        seq = state.seqs.get(seq_id)
        status = status_word(state, seq_id) if seq else "?"
        for group in groups:
            table = state.tables_of(group).get(seq_id, [])
            where = " ".join(f"{d}:{n}" + (f"(ref {state.pools[d][n].ref_count})" if state.pools[d][n].ref_count > 1
                                           else "") for d, n in table)
            label = f" group {group}" if has_groups(state) else ""
            lines.append(f"  {names((seq_id,))}{label} ({status}): {where or '-'}")
    if len(state.tables) > max_tables:
        lines.append(f"  … {len(state.tables) - max_tables} more block tables")
    if state.hash_map:
        unit = "pages" if state.design.radix_tree else "blocks"  # SGLang's tree holds pages, keyed by tokens
        lines.append(f"prefix cache: {len(state.hash_map)} {'cached pages' if state.design.radix_tree else 'hashes'}"
                     f" · hits {state.num_prefix_hits}/{state.num_prompt_blocks_looked_up} prompt {unit}")
    if current is not None:
        lines.append(f"last event: {describe(current, names=names)}")
    return "\n".join(lines)


def card_record(card, counter: str = "") -> dict[str, Any] | None:
    """A guided stop's card (blockviz.model.guide.Card) as the notebook draws it under its controls:
    the idea, what happened with which blocks, one line of why, the upstream function (`upstream`:
    whose, "vLLM" or "SGLang"), and which card
    it is (`counter`: Guide.counter, "card 2 of 6"), the sequences it is about (`seqs`: the block
    tables scroll to the first); None for none."""
    if card is None:
        return None
    return {"idea": card.idea, "ideas": list(card.ideas), "title": card.title, "what": card.what, "why": card.why,
            "function": card.function, "upstream": card.upstream,
            "blocks": [list(block) for block in card.blocks], "counter": counter,
            "position": card.position, "terms": [[term, DEFINITIONS[term]] for term in card.terms],
            "seqs": list(card.seqs)}


def cursor_line(timeline, player, *, title: str = "", error: str = "", finished: bool = False) -> dict[str, Any]:
    """What the controls show: position, length, step, playing, speed, what the last event did (one
    sentence, blockviz.model.narration, as the TUI's status bar says it), and an engine error (one line)
    if there was one. `timeline` / `player`: blockviz.model.timeline's and blockviz.model.player's."""
    current = timeline.current_event
    inside = timeline.operation_at()
    return {
        "title": title,
        "position": timeline.position,
        "length": len(timeline),
        "step": step_label(timeline),
        "steps_done": timeline.dropped_steps + timeline.num_steps_done(),
        "num_steps": timeline.dropped_steps + len(timeline.step_ends),
        "dropped": timeline.dropped_note(),
        "live": player.live,
        "guided": player.guide is not None and player.guided,
        "playing": player.playing,
        "finished": finished,
        "speed_index": player.speed_index,
        "speed": player.speed_label,
        "current": narrate(current, timeline.state, timeline.token_texts),
        "current_type": current.type if current is not None else "",
        "inside": inside.label(timeline.position) if inside is not None else "",
        "error": error,
    }

"""One frame of the widgets: a compact, JSON-ready picture of the reducer state.

`snapshot(state, ...)` is a pure function of a `ReducerState` (plus what the cursor just passed and
the selected block): the pools as columns (one character of state, a ref count, a fill and up to
two owners per block, so a 4,096-block pool is a few tens of kilobytes), the block tables with the
token text of each slot, the hash chains, the inspected block, and the counts. `event_log()` and
`cursor()` add the log and the playback line. The JavaScript only draws what these return, so a
test can compare them with the reducer without a browser, and a browser test can compare the page
(each pool canvas's data-states / data-refs, written as it paints) with the kernel.
"""

from __future__ import annotations

from typing import Any

from blockviz.model.narration import narrate
from blockviz.model.palette import (
    FILTERS,
    block_token_texts,
    describe,
    event_number,
    pool_counts,
    short_hash,
    show_token,
    touched_blocks,
)
from engine import events as ev
from blockviz.model.reducer import USED, BlockState, ReducerState

STATE_CODES = {"used": "u", "cached": "c", "free": "f"}  # one character per block in "state"
MAX_TABLES = 32  # sequences shown in the block tables (those holding blocks first)
MAX_HASHES = 128  # hashed blocks shown in the hash chains
MAX_LOG_ROWS = 200  # events shown in the log, ending at the cursor
MAX_LOG_SCAN = 20_000  # events looked at, going back from the cursor, to fill a filtered log


def block_state(block: BlockState) -> str:
    """"used", "cached" (free but still hashed: a prefix-cache hit can revive it) or "free"."""
    if block.state == USED:
        return "used"
    return "cached" if block.block_hash is not None else "free"


def pool_columns(pool: list[BlockState]) -> dict[str, Any]:
    """A pool as columns: per block its state code, ref count, slots filled, first and second owner."""
    states, refs, fills, owners, owners2 = [], [], [], [], []
    for block in pool:
        name = block_state(block)
        states.append(STATE_CODES[name])
        refs.append(block.ref_count)
        fills.append(len(block.token_ids) if name != "free" else 0)
        ids = sorted(block.owners) if block.owners else ()
        owners.append(ids[0] if ids else -1)
        owners2.append(ids[1] if len(ids) > 1 else -1)
    return {"n": len(pool), "state": "".join(states), "ref": refs, "fill": fills, "owner": owners,
            "owner2": owners2}


def _slot_texts(state: ReducerState, seq_id: int, index: int, block: BlockState) -> list[str]:
    seq = state.seqs.get(seq_id)
    start = index * state.block_size
    if seq is not None:
        texts = seq.token_texts[start:start + len(block.token_ids)]
        if len(texts) == len(block.token_ids):
            return [show_token(t) for t in texts]
    return [show_token(t) for t in block_token_texts(state, block)]


def tables(state: ReducerState, limit: int = MAX_TABLES) -> list[dict[str, Any]]:
    """Each sequence's block table (logical index -> device, block, the token text in each slot),
    sequences holding blocks first, then the rest by id, at most `limit`."""
    seq_ids = sorted(set(state.seqs) | set(state.tables), key=lambda s: (s not in state.tables, s))[:limit]
    rows = []
    for seq_id in sorted(seq_ids):
        seq = state.seqs.get(seq_id)
        blocks = []
        for index, (device, number) in enumerate(state.tables.get(seq_id, ())):
            block = state.pools[device][number]
            blocks.append([device, number, block.ref_count, _slot_texts(state, seq_id, index, block)])
        rows.append({
            "seq": seq_id,
            "request": seq.request_id if seq else "?",
            "status": seq.status if seq else "?",
            "finish": (seq.finish_reason or "") if seq else "",
            "num_tokens": len(seq.token_ids) if seq else 0,
            "blocks": blocks,
        })
    return rows


def hash_chains(state: ReducerState, limit: int = MAX_HASHES) -> list[dict[str, Any]]:
    """The hashed GPU blocks in chain order (each after its parent), with the depth of each."""
    hashed = [b for b in state.pools["gpu"] if b.block_hash is not None]
    known = {b.block_hash for b in hashed}
    children: dict[int | None, list[BlockState]] = {}
    for block in hashed:
        children.setdefault(block.parent_hash if block.parent_hash in known else None, []).append(block)
    rows: list[dict[str, Any]] = []
    seen: set[int] = set()
    stack = [(b, 0) for b in sorted(children.get(None, []), key=lambda b: -b.number)]
    while stack and len(rows) < limit:
        block, depth = stack.pop()
        if block.number in seen:
            continue
        seen.add(block.number)
        rows.append({
            "block": block.number,
            "hash": short_hash(block.block_hash),
            "parent": short_hash(block.parent_hash) if block.parent_hash is not None else "",
            "depth": depth,
            "ref": block.ref_count,
            "hits": block.num_hits,
            "state": block_state(block),
            "registered": block.registered,
            "tokens": [show_token(t) for t in block_token_texts(state, block)],
        })
        stack.extend((b, depth + 1) for b in sorted(children.get(block.block_hash, []), key=lambda b: -b.number))
    return rows


def inspect_block(state: ReducerState, device: str, number: int) -> dict[str, Any]:
    """Everything about one block: state, refs, owners, fill, hash, parent, hits, tokens, K/V digest."""
    block = state.pools[device][number]
    name = block_state(block)
    filled = len(block.token_ids) if name != "free" else 0
    same = []
    if block.digest:
        same = [f"{b.device} {b.number}" for pool in state.pools.values() for b in pool
                if b.digest == block.digest and b is not block and block_state(b) != "free"]
    return {
        "device": device, "number": number, "state": name, "ref": block.ref_count,
        "owners": sorted(block.owners), "fill": filled, "block_size": state.block_size,
        "hash": short_hash(block.block_hash, 16) if block.block_hash is not None else "",
        "parent": short_hash(block.parent_hash, 16) if block.parent_hash is not None else "",
        "registered": block.registered, "hits": block.num_hits,
        "tokens": [show_token(t) for t in block_token_texts(state, block)] if filled else [],
        "digest": block.digest or "", "digest_current": block.digest_slots == filled,
        "same_kv": same,
    }


def snapshot(state: ReducerState, *, current: ev.Event | None = None,
             selected: tuple[str, int] | None = None) -> dict[str, Any]:
    """The picture of `state`: pools (columns and counts), tables, hash chains, the inspected block.

    `current` is the event the cursor just passed (its blocks are marked touched); `selected` the
    (device, number) the inspector shows."""
    counts = pool_counts(state)
    pools = {}
    for device, pool in state.pools.items():
        used, cached, free = counts[device]
        pools[device] = {**pool_columns(pool), "used": used, "cached": cached, "free": free}
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
        "tables": tables(state),
        "hashes": hash_chains(state),
        "hash_summary": {"in_map": len(state.hash_map), "hits": state.num_prefix_hits,
                         "looked_up": state.num_prompt_blocks_looked_up},
        "inspector": inspect_block(state, *selected) if selected else None,
        "step": state.step,
        "step_kind": state.step_kind,
        "num_preemptions": state.num_preemptions,
        "num_tokens_generated": state.num_tokens_generated,
    }


def event_log(events: list[ev.Event], position: int, filter_name: str = "all events",
              vocab: dict[int, str] | None = None, limit: int = MAX_LOG_ROWS) -> list[list[Any]]:
    """The last `limit` events up to the cursor whose kind the filter (a palette.FILTERS name)
    keeps, oldest first, as [event number (palette.event_number), kind, words]."""
    kinds = FILTERS.get(filter_name)
    rows = []
    stop = max(0, position - MAX_LOG_SCAN)
    for index in range(position - 1, stop - 1, -1):
        event = events[index]
        if kinds is None or event.type in kinds:
            rows.append([event_number(event.seq_no), event.type, describe(event, vocab)])
            if len(rows) >= limit:
                break
    rows.reverse()
    return rows


def summary_text(state: ReducerState, *, title: str = "", position: int = 0, length: int = 0,
                 current: ev.Event | None = None, max_tables: int = 12) -> str:
    """A plain-text picture (for a notebook without widgets, or nbconvert to text)."""
    lines = [f"{title or 'blockviz'} · event {position}/{length}"
             + (f" · step {state.step} ({state.step_kind})" if state.step_kind else "")]
    for device, (used, cached, free) in pool_counts(state).items():
        lines.append(f"{device.upper()} pool: {len(state.pools[device])} blocks · {used} used · "
                     f"{cached} cached · {free} free")
    for seq_id in sorted(state.tables)[:max_tables]:
        seq = state.seqs.get(seq_id)
        where = " ".join(f"{d}:{n}" + (f"(ref {state.pools[d][n].ref_count})" if state.pools[d][n].ref_count > 1
                                       else "") for d, n in state.tables[seq_id])
        status = f"req {seq.request_id}, {seq.status}" if seq else "?"
        lines.append(f"  seq {seq_id} ({status}): {where or '-'}")
    if len(state.tables) > max_tables:
        lines.append(f"  … {len(state.tables) - max_tables} more block tables")
    if state.hash_map:
        lines.append(f"prefix cache: {len(state.hash_map)} hashes · hits {state.num_prefix_hits}"
                     f"/{state.num_prompt_blocks_looked_up} prompt blocks")
    if current is not None:
        lines.append(f"last event: {describe(current)}")
    return "\n".join(lines)


def cursor_line(timeline, player, *, title: str = "", error: str = "", finished: bool = False) -> dict[str, Any]:
    """What the controls show: position, length, step, playing, speed, what the last event did (one
    sentence, blockviz.model.narration, as the TUI's status bar says it), and an engine error (one line)
    if there was one. `timeline` / `player` are history's."""
    current = timeline.current_event
    return {
        "title": title,
        "position": timeline.position,
        "length": len(timeline),
        "steps_done": timeline.num_steps_done(),
        "num_steps": len(timeline.step_ends),
        "live": player.live,
        "playing": player.playing,
        "finished": finished,
        "speed_index": player.speed_index,
        "speed": player.speed_label,
        "current": narrate(current, timeline.state),
        "current_type": current.type if current is not None else "",
        "error": error,
    }

""""What just happened", in one plain sentence: the line a teacher reads out while the engine steps.

`narrate(event, state)` turns the event the cursor just passed, and the reducer's state after it,
into a sentence that says what the block manager did and why it matters (a fork shares blocks, a
copy-on-write gives a branch its own copy, a hit skips computation...). The event log keeps the
terse form (blockviz.widgets.palette.describe); both views and the Jupyter widgets can show this.
No textual import: a pure function, tested without a terminal.
"""

from __future__ import annotations

from engine import events as ev
from engine.reducer import ReducerState


def _blocks(numbers) -> str:
    numbers = list(numbers)
    return ("block " if len(numbers) == 1 else "blocks ") + " ".join(str(n) for n in numbers)


def _seqs(seq_ids) -> str:
    seq_ids = list(seq_ids)
    return ("seq " if len(seq_ids) == 1 else "seqs ") + ", ".join(str(s) for s in seq_ids)


def narrate(event: ev.Event | None, state: ReducerState) -> str:
    """One sentence about `event`, given the state right after it ("" before the first event)."""
    if event is None:
        return ""
    e = event
    kind = e.type
    if kind == "request_added":
        many = f", {e.n} samples" if e.n > 1 else ""
        return f"request {e.request_id} arrives: {len(e.prompt_token_ids)} prompt tokens{many}; it waits to be admitted"
    if kind == "block_allocated":
        if e.ref_count > 1:
            return (f"{_seqs(e.seq_ids)} get {e.device} block {e.block} together for logical block "
                    f"{e.logical_index} (ref {e.ref_count})")
        return (f"seq {e.seq_ids[0]} gets {e.device} block {e.block} for logical block {e.logical_index}"
                f" ({len(e.token_ids)}/{state.block_size} slots used)")
    if kind == "prefix_cache_hit":
        return (f"prefix-cache hit: {_seqs(e.seq_ids)} reuse block {e.block} for logical block "
                f"{e.logical_index}, same tokens and same parent hash, now ref {e.ref_count}: "
                f"{len(e.token_ids)} tokens not computed again")
    if kind == "block_hashed":
        if not e.registered:
            return f"block {e.block} is full; an equal block is already in the hash map, so the map is unchanged"
        parent = "no parent (first block)" if e.parent_hash is None else "its parent's hash"
        return f"block {e.block} is full: hashed over {parent} and its tokens, now findable by later prompts"
    if kind == "slot_appended":
        filled = e.offset + 1
        note = " (block now full)" if filled == state.block_size else ""
        return (f"seq {e.seq_id}'s new token goes into slot {e.offset} of block {e.block}"
                f" ({filled}/{state.block_size}){note}")
    if kind == "copy_on_write":
        return (f"copy-on-write: seq {e.seq_id} writes into block {e.src_block}, shared with "
                f"{e.src_ref_count} other sequence{'s' if e.src_ref_count != 1 else ''}: its "
                f"{len(e.token_ids)} tokens are copied to block {e.dst_block}, which seq {e.seq_id} owns alone")
    if kind == "fork":
        refs = sorted({state.block(e.device, b).ref_count for b in e.blocks}) if e.blocks else []
        ref = f" (ref {refs[0]})" if len(refs) == 1 else ""
        return f"seq {e.child_seq_id} forked from seq {e.parent_seq_id}: {_blocks(e.blocks)} now shared{ref}, nothing copied"
    if kind == "swap_out":
        return (f"swap out request {e.request_id}: {len(e.mapping)} block{'s' if len(e.mapping) != 1 else ''} "
                f"copied GPU to CPU ({' '.join(f'{a}→{b}' for a, b in e.mapping)}), the GPU blocks freed")
    if kind == "swap_in":
        return (f"swap in request {e.request_id}: {len(e.mapping)} block{'s' if len(e.mapping) != 1 else ''} "
                f"copied back CPU to GPU ({' '.join(f'{a}→{b}' for a, b in e.mapping)})")
    if kind == "block_freed":
        if e.ref_count > 0:
            return f"seq {e.seq_id} lets go of block {e.block}; {e.ref_count} other reference{'s' if e.ref_count != 1 else ''} keep it"
        if e.cached:
            return f"block {e.block} is free but stays in the prefix cache: a later prompt can revive it"
        return f"block {e.block} is free again"
    if kind == "sequence_freed":
        return f"seq {e.seq_id} finished with its block table"
    if kind == "block_evicted":
        return f"evicted block {e.block}: the least recently used cached block, its hash forgotten, to make room"
    if kind == "step_started":
        what = "prefill (whole prompts)" if e.kind == "prefill" else "decode (one token each)"
        return f"step {e.step}: {what} for {_seqs(e.seq_ids)}, {e.num_tokens} tokens through the model"
    if kind == "token_generated":
        return f"seq {e.seq_id} sampled {e.text!r}"
    if kind == "preempted":
        if e.mode == "swap":
            cost = "its blocks go to the CPU pool and come back later"
        else:
            cost = f"its blocks are freed and {e.num_tokens_lost} tokens must be computed again"
        return f"preempted request {e.request_id} ({e.reason}): {cost}"
    if kind == "sequence_finished":
        return f"seq {e.seq_id} finished: {e.detail or e.reason}"
    if kind == "kv_digest":
        return f"K/V digest of {e.device} block {e.block}: {e.digest} (a fingerprint of the real tensors)"
    if kind == "step_finished":
        used = state.num_used("gpu")
        return f"step {e.step} done: {used} of {len(state.pools['gpu'])} GPU blocks in use"
    return kind.replace("_", " ")

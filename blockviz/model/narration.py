""""What just happened", in one plain sentence: the line a teacher reads out while the engine steps.

`narrate(event, state)` turns the event the cursor just passed, and the reducer's state after it,
into a sentence that says what the block manager did and why it matters (a fork shares blocks, a
copy-on-write gives a branch its own copy, a hit skips computation...). The event log keeps the
terse form (blockviz.model.palette.describe); both views and the Jupyter widgets can show this.
No textual import: a pure function, tested without a terminal.
"""

from __future__ import annotations

from engine import events as ev
from blockviz.model.reducer import ReducerState


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
    sentence = _SENTENCES.get(event.type)
    return sentence(event, state) if sentence is not None else event.type.replace("_", " ")


def _plural(count: int, word: str) -> str:
    return f"{count} {word}{'' if count == 1 else 's'}"


def _request(e, state):
    many = f", {e.n} samples" if e.n > 1 else ""
    return f"request {e.request_id} arrives: {len(e.prompt_token_ids)} prompt tokens{many}; it waits to be admitted"


def _allocated(e, state):
    if e.ref_count > 1:
        return (f"{_seqs(e.seq_ids)} get {e.device} block {e.block} together for logical block "
                f"{e.logical_index} (ref {e.ref_count})")
    return (f"seq {e.seq_ids[0]} gets {e.device} block {e.block} for logical block {e.logical_index}"
            f" ({len(e.token_ids)}/{state.block_size} slots used)")


def _hit(e, state):
    return (f"prefix-cache hit: {_seqs(e.seq_ids)} reuse block {e.block} for logical block "
            f"{e.logical_index}, same tokens and same parent hash, now ref {e.ref_count}: "
            f"{len(e.token_ids)} tokens not computed again")


def _hashed(e, state):
    if not e.registered:
        return f"block {e.block} is full; an equal block is already in the hash map, so the map is unchanged"
    parent = "no parent (first block)" if e.parent_hash is None else "its parent's hash"
    return f"block {e.block} is full: hashed over {parent} and its tokens, now findable by later prompts"


def _slot(e, state):
    full = " (block now full)" if e.offset + 1 == state.block_size else ""
    return f"seq {e.seq_id}'s new token goes into slot {e.offset} of block {e.block} ({e.offset + 1}/{state.block_size}){full}"


def _cow(e, state):
    return (f"copy-on-write: seq {e.seq_id} writes into block {e.src_block}, shared with "
            f"{_plural(e.src_ref_count, 'other sequence')}: its {len(e.token_ids)} tokens are copied "
            f"to block {e.dst_block}, which seq {e.seq_id} owns alone")


def _fork(e, state):
    refs = sorted({state.block(e.device, b).ref_count for b in e.blocks})
    ref = f" (ref {refs[0]})" if len(refs) == 1 else ""
    return f"seq {e.child_seq_id} forked from seq {e.parent_seq_id}: {_blocks(e.blocks)} now shared{ref}, nothing copied"


def _swap(e, state):
    pairs = " ".join(f"{a}→{b}" for a, b in e.mapping)
    if e.type == "swap_out":
        return (f"swap out request {e.request_id}: {_plural(len(e.mapping), 'block')} copied GPU to CPU "
                f"({pairs}), the GPU blocks freed")
    return f"swap in request {e.request_id}: {_plural(len(e.mapping), 'block')} copied back CPU to GPU ({pairs})"


def _freed(e, state):
    if e.ref_count > 0:
        return f"seq {e.seq_id} lets go of block {e.block}; {_plural(e.ref_count, 'other reference')} keep it"
    if e.cached:
        return f"block {e.block} is free but stays in the prefix cache: a later prompt can revive it"
    return f"block {e.block} is free again"


def _step(e, state):
    what = "prefill (whole prompts)" if e.kind == "prefill" else "decode (one token each)"
    return f"step {e.step}: {what} for {_seqs(e.seq_ids)}, {e.num_tokens} tokens through the model"


def _scheduled(e, state):
    parts = []
    for seq_id, done, new, total in zip(e.seq_ids, e.num_computed_tokens, e.num_new_tokens, e.num_tokens):
        if done + new < total:
            parts.append(f"seq {seq_id} a prefill chunk of {new} (tokens {done}-{done + new - 1} of {total})")
        elif done == total - 1 and new == 1:
            parts.append(f"seq {seq_id} 1 (decode)")
        else:
            parts.append(f"seq {seq_id} {new} (the rest of its prompt)")
    return f"step {e.step} spends its token budget: " + "; ".join(parts)


def _preempted(e, state):
    if e.mode == "swap":
        cost = "its blocks go to the CPU pool and come back later"
    else:
        cost = f"its blocks are freed and {e.num_tokens_lost} tokens must be computed again"
    return f"preempted request {e.request_id} ({e.reason}): {cost}"


def _step_finished(e, state):
    return f"step {e.step} done: {state.num_used('gpu')} of {len(state.pools['gpu'])} GPU blocks in use"


_SENTENCES = {
    "request_added": _request,
    "block_allocated": _allocated,
    "prefix_cache_hit": _hit,
    "block_hashed": _hashed,
    "slot_appended": _slot,
    "copy_on_write": _cow,
    "fork": _fork,
    "swap_out": _swap,
    "swap_in": _swap,
    "block_freed": _freed,
    "sequence_freed": lambda e, state: f"seq {e.seq_id} finished with its block table",
    "block_evicted": lambda e, state: (f"evicted block {e.block}: the least recently used cached block, "
                                       f"its hash forgotten, to make room"),
    "step_started": _step,
    "token_generated": lambda e, state: f"seq {e.seq_id} sampled {e.text!r}",
    "tokens_scheduled": _scheduled,
    "preempted": _preempted,
    "sequence_finished": lambda e, state: f"seq {e.seq_id} finished: {e.detail or e.reason}",
    "kv_digest": lambda e, state: (f"K/V digest of {e.device} block {e.block}: {e.digest} "
                                   f"(a fingerprint of the real tensors)"),
    "step_finished": _step_finished,
}

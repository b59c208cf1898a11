"""Each event in words: one text per event, the line the log shows and the narration starts with.

`describe(event)` words an event the way vLLM's code names what happened (allocate, append_slot,
copy-on-write, fork, swap_out / swap_in, free, prefix-cache hit, evict); `narrate(event, state)` is
the same text plus, where there is one, a sentence of what it means given the reducer's state right
after it (a fork copies nothing, a hit skips computation, a freed block stays cached...): the line a
teacher reads out while the engine steps. `FILTERS` are the log's named sets of event records.

Dispatch is by the event's record class, in one registry per function (`_TEXTS`, `_MEANINGS`).
No textual import: pure functions, tested without a terminal.
"""

from __future__ import annotations

from typing import Callable

from blockviz.model.names import RequestNames
from blockviz.model.palette import short_hash, show_token
from blockviz.model.radix_view import number_ranges
from blockviz.model.reducer import ReducerState
from engine import events as ev
from engine.scheduler_output import is_decode


def plural(count: int, word: str) -> str:
    """"1 block", "2 blocks"."""
    return f"{count} {word}{'' if count == 1 else 's'}"


def were(count: int) -> str:
    """The verb for `count` things: "was" for one, "were" for more."""
    return "was" if count == 1 else "were"


def _ids(ids) -> str:
    return ",".join(str(i) for i in ids)


# ---------------------------------------------------------------------------------- the text


def describe(event: ev.Event, vocab: dict[int, str] | None = None, names: RequestNames | None = None) -> str:
    """One line of plain words for an event (the log's line; the narration starts with it).
    `vocab` (token id -> text) words a slot's token; `names` (blockviz.model.names) names its
    sequences by their requests as the tables at the cursor do ("seq 4" without)."""
    text = _TEXTS.get(type(event))
    line = text(event, vocab or {}, names or _NO_NAMES) if text is not None else event.type.replace("_", " ")
    group = getattr(event, "group", 0)  # a run with KV-cache groups: which table or cache
    return f"{line} [group {group}]" if group and not isinstance(event, ev.BlocksSkipped) else line


_NO_NAMES = RequestNames()


def _skipped(e: ev.BlocksSkipped, vocab, names) -> str:
    slots = ", ".join(f"L{index}" for index in e.logical_indices)
    return f"window of {names((e.seq_id,))} [group {e.group}] lets go of gpu {_ids(e.blocks)}: {slots} now the null block"


def _allocated(e: ev.BlockAllocated, vocab, names) -> str:
    return (f"allocate {e.device} {e.block} → {names(e.seq_ids)} L{e.logical_index} "
            f"ref {e.ref_count} ({plural(len(e.token_ids), 'token')})")


def _hit(e: ev.PrefixCacheHit, vocab, names) -> str:
    return (f"prefix-cache HIT {e.device} {e.block} #{short_hash(e.block_hash)} → {names(e.seq_ids)} "
            f"L{e.logical_index} ref {e.ref_count}")


def _hashed(e: ev.BlockHashed, vocab, names) -> str:
    parent = f"#{short_hash(e.parent_hash)}" if e.parent_hash is not None else "root"
    return (f"hash {e.device} {e.block} #{short_hash(e.block_hash)} ← {parent}"
            + ("" if e.registered else " (duplicate: map unchanged)"))


def _slot(e: ev.SlotAppended, vocab, names) -> str:
    piece = show_token(vocab.get(e.token_id, f"<{e.token_id}>"))
    return f"append_slot {names((e.seq_id,))} L{e.logical_index} → {e.device} {e.block}[{e.offset}] '{piece}'"


def _cow(e: ev.CopyOnWrite, vocab, names) -> str:
    return (f"copy-on-write {names((e.seq_id,))} L{e.logical_index}: {e.device} {e.src_block} → "
            f"{e.device} {e.dst_block} (src ref {e.src_ref_count})")


def _fork(e: ev.Forked, vocab, names) -> str:
    return f"fork {names((e.parent_seq_id,))} → {names((e.child_seq_id,))} shares {e.device} {_ids(e.blocks)}"


def _swap(e: ev.SwappedOut | ev.SwappedIn, vocab, names) -> str:
    src, dst = ("gpu", "cpu") if isinstance(e, ev.SwappedOut) else ("cpu", "gpu")
    pairs = " ".join(f"{a}→{b}" for a, b in e.mapping)
    revived = f" (found by hash: {dst} {_ids(e.revived)})" if e.revived else ""
    return f"{e.type} {names.request(e.request_id, e.seq_ids)}: {src}→{dst} {pairs}{revived}"


def _swap_means(e: ev.SwappedOut | ev.SwappedIn, state) -> str:
    pool = "the CPU pool" if isinstance(e, ev.SwappedOut) else "the GPU pool"
    if not e.revived:
        return f"the request's K/V copied {'to' if isinstance(e, ev.SwappedOut) else 'back to'} {pool}"
    return (f"blocks of {pool} still holding the same hashes are taken back, nothing copied into them; "
            "the rest of the K/V is copied")


def _offload(e: ev.OffloadStored | ev.OffloadLoaded, vocab, names) -> str:
    pairs = " ".join(f"{a}→{b}" for a, b in e.mapping)
    if isinstance(e, ev.OffloadStored):
        return f"offload store gpu→{e.medium.lower()} {pairs}"
    return f"offload LOAD {names.request(e.request_id, (e.seq_id,))}: {e.medium.lower()}→gpu {pairs} ({plural(e.num_tokens, 'token')})"


def _freed(e: ev.BlockFreed, vocab, names) -> str:
    left = "free-but-cached" if e.cached and e.ref_count == 0 else ("free" if e.ref_count == 0 else "kept")
    if e.seq_id < 0:  # vLLM's CPU tier releasing the pin of a copy
        return f"free {e.device} {e.block} by the CPU tier's copy: ref {e.ref_count} ({left})"
    return f"free {e.device} {e.block} by {names((e.seq_id,))}: ref {e.ref_count} ({left})"


def _request(e: ev.RequestAdded, vocab, names) -> str:
    prompt = show_token(e.prompt)[:40]
    return (f"request {e.request_id} added: '{prompt}' ({plural(len(e.prompt_token_ids), 'token')}, "
            f"seq {_ids(e.seq_ids)}, n {e.n}, max {e.max_tokens})")


def _preempted(e: ev.Preempted, vocab, names) -> str:
    return (f"PREEMPT {names.request(e.request_id, e.seq_ids)} by {e.mode}: {e.reason}"
            + (f" ({plural(e.num_tokens_lost, 'token')} to recompute)" if e.num_tokens_lost else ""))


def _scheduled(e: ev.TokensScheduled, vocab, names) -> str:
    parts = []
    for seq_id, done, new, total in zip(e.seq_ids, e.num_computed_tokens, e.num_new_tokens, e.num_tokens):
        kind = "chunk" if done + new < total else "decode" if is_decode(done, new, total) else "prefill"
        parts.append(f"{names((seq_id,))} {done}+{new}/{total} {kind}")
    return f"step {e.step} schedules " + ", ".join(parts)


def _run(token_ids, vocab: dict[int, str], limit: int = 12) -> str:
    """A radix node's run of tokens as text (its first `limit`), '' where `vocab` lacks them."""
    if not all(t in vocab for t in token_ids[:limit]):
        return ""
    text = show_token("".join(vocab[t] for t in token_ids[:limit]))
    return f" '{text}{'…' if len(token_ids) > limit else ''}'"


def _slots(slots) -> str:
    return f"slots {number_ranges(list(slots))}"


def _radix_inserted(e: ev.RadixNodeInserted, vocab, names) -> str:
    parent = "the root" if e.parent_id is None else f"node {e.parent_id}"
    return (f"radix insert node {e.node_id} under {parent}: {plural(len(e.token_ids), 'token')}{_run(e.token_ids, vocab)}, "
            f"{_slots(e.slots)}, lock_ref {e.lock_ref}")


def _radix_evict(e: ev.RadixEvict, vocab, names) -> str:
    more = e.num_tokens_evicted - e.num_tokens
    return (f"RadixCache.evict asked for {plural(e.num_tokens, 'token')}, freed {e.num_tokens_evicted}"
            + (f" ({more} more than asked)" if more > 0 else ""))


def _radix_node_evicted(e: ev.RadixNodeEvicted, vocab, names) -> str:
    return f"radix evict node {e.node_id}: {plural(len(e.token_ids), 'token')}{_run(e.token_ids, vocab)}, {_slots(e.slots)} freed"


_TEXTS: dict[type[ev.Event], Callable[..., str]] = {
    ev.BlockAllocated: _allocated,
    ev.PrefixCacheHit: _hit,
    ev.BlockHashed: _hashed,
    ev.SlotAppended: _slot,
    ev.CopyOnWrite: _cow,
    ev.Forked: _fork,
    ev.SwappedOut: _swap,
    ev.SwappedIn: _swap,
    ev.OffloadStored: _offload,
    ev.OffloadLoaded: _offload,
    ev.BlockFreed: _freed,
    ev.SequenceFreed: lambda e, vocab, names: f"{names((e.seq_id,))}: block table freed",
    ev.BlocksSkipped: _skipped,
    ev.BlockEvicted: lambda e, vocab, names: f"evict {e.device} {e.block} #{short_hash(e.block_hash)} (LRU)",
    ev.RequestAdded: _request,
    ev.StepStarted: lambda e, vocab, names: f"step {e.step} {e.kind}: {names(e.seq_ids)} ({plural(e.num_tokens, 'token')})",
    ev.TokensScheduled: _scheduled,
    ev.TokenGenerated: lambda e, vocab, names: f"{names((e.seq_id,))} sampled '{show_token(e.text)}' at position {e.position}",
    ev.Preempted: _preempted,
    ev.SequenceFinished: lambda e, vocab, names: f"{names((e.seq_id,))} finished: {e.reason}" + (f" ({e.detail})" if e.detail else ""),
    ev.KVDigest: lambda e, vocab, names: f"K/V digest {e.device} {e.block} = {e.digest}",
    ev.StepFinished: lambda e, vocab, names: f"step {e.step} {e.kind} done ({plural(e.num_tokens, 'token')})",
    ev.RadixNodeInserted: _radix_inserted,
    ev.RadixNodeSplit: lambda e, vocab, names: (f"radix split node {e.node_id}: new node {e.new_node_id} takes its first "
                                                f"{plural(e.num_tokens, 'token')}, node {e.node_id} keeps the rest under it"),
    ev.RadixLockRef: lambda e, vocab, names: f"radix node {e.node_id} lock_ref {e.lock_ref}",
    ev.RadixEvict: _radix_evict,
    ev.RadixNodeEvicted: _radix_node_evicted,
}


# ---------------------------------------------------------------------------------- the meaning


def narrate(event: ev.Event | None, state: ReducerState, vocab: dict[int, str] | None = None) -> str:
    """The event's text (`describe`) and, where there is one, what it means given the state right
    after it ("" before the first event)."""
    if event is None:
        return ""
    text = describe(event, vocab or {}, RequestNames(state))
    meaning = _MEANINGS.get(type(event))
    sentence = meaning(event, state) if meaning is not None else ""
    return f"{text}: {sentence}" if sentence else text


def _allocated_means(e: ev.BlockAllocated, state: ReducerState) -> str:
    if e.ref_count > 1:
        return f"{RequestNames(state)(e.seq_ids)} share it from the start"
    return f"{len(e.token_ids)}/{state.block_size} slots used"


def _hit_means(e: ev.PrefixCacheHit, state: ReducerState) -> str:
    return (f"same tokens and same parent hash, so {plural(len(e.token_ids), 'token')} "
            f"{'is' if len(e.token_ids) == 1 else 'are'} not computed again")


def _hashed_means(e: ev.BlockHashed, state: ReducerState) -> str:
    if not e.registered:
        return "an equal block is already in the hash map"
    return "the block is full, now findable by later prompts"


def _slot_means(e: ev.SlotAppended, state: ReducerState) -> str:
    full = ", the block is now full" if e.offset + 1 == state.block_size else ""
    return f"slot {e.offset + 1} of {state.block_size}{full}"


def _cow_means(e: ev.CopyOnWrite, state: ReducerState) -> str:
    copied = "was" if len(e.token_ids) == 1 else "were"
    return (f"{RequestNames(state)((e.seq_id,))} was about to write into a block it shared, so its "
            f"{plural(len(e.token_ids), 'token')} {copied} copied to block {e.dst_block}, which it owns alone; "
            f"block {e.src_block} keeps {plural(e.src_ref_count, 'other reference')}")


def _fork_means(e: ev.Forked, state: ReducerState) -> str:
    refs = sorted({state.block(e.device, b).ref_count for b in e.blocks})
    ref = f" (ref {refs[0]})" if len(refs) == 1 else ""
    return f"nothing copied, every block now shared{ref}"


def _freed_means(e: ev.BlockFreed, state: ReducerState) -> str:
    if e.ref_count > 0:
        return f"{plural(e.ref_count, 'other reference')} {'keeps' if e.ref_count == 1 else 'keep'} it"
    if e.cached:
        return "it stays in the prefix cache: a later prompt can revive it"
    return ""


def _scheduled_means(e: ev.TokensScheduled, state: ReducerState) -> str:
    chunks = [seq_id for seq_id, done, new, total in
              zip(e.seq_ids, e.num_computed_tokens, e.num_new_tokens, e.num_tokens) if done + new < total]
    if not chunks:
        return "one token budget, every sequence gets all it needs"
    return f"one token budget: {RequestNames(state)(chunks)} prefill a chunk now and the rest in later steps"


def _preempted_means(e: ev.Preempted, state: ReducerState) -> str:
    """Said at the preempted event, before its moves: the scheduler's decision, not its effects."""
    if e.mode == "swap":
        return "it gives way, its K/V kept for later (swap)"
    if state.design.radix_tree:
        return f"SGLang retracts it: {plural(e.num_tokens_lost, 'computed token')} to compute again"
    return f"it gives way, {plural(e.num_tokens_lost, 'computed token')} to compute again (recompute)"


_MEANINGS: dict[type[ev.Event], Callable[[ev.Event, ReducerState], str]] = {
    ev.RequestAdded: lambda e, state: "it waits to be admitted",
    ev.BlockAllocated: _allocated_means,
    ev.PrefixCacheHit: _hit_means,
    ev.BlockHashed: _hashed_means,
    ev.SlotAppended: _slot_means,
    ev.CopyOnWrite: _cow_means,
    ev.Forked: _fork_means,
    ev.SwappedOut: _swap_means,
    ev.SwappedIn: _swap_means,
    ev.OffloadStored: lambda e, state: "copies of full blocks kept in vLLM's CPU tier, keyed by their hashes",
    ev.OffloadLoaded: lambda e, state: "blocks the GPU had evicted come back from the CPU tier: hits, not recomputed",
    ev.BlockFreed: _freed_means,
    ev.BlocksSkipped: lambda e, state: ("no later token's sliding window reads them, so they go back to the pool "
                                        "mid-request; the table keeps its positions"),
    ev.BlockEvicted: lambda e, state: "the least recently used cached block, its hash forgotten, to make room",
    ev.StepStarted: lambda e, state: ("whole prompts through the model" if e.kind == "prefill"
                                      else "one new token for each sequence"),
    ev.Preempted: _preempted_means,
    ev.TokensScheduled: _scheduled_means,
    ev.KVDigest: lambda e, state: "a fingerprint of the real tensors",
    ev.StepFinished: lambda e, state: (f"{state.num_used('gpu')}/{len(state.pools['gpu'])} GPU blocks used"),
    ev.RadixEvict: lambda e, state: ("it takes whole unlocked leaves in its eviction policy's order (lru: least "
                                     "recently used first), so it can free more than asked"),
    ev.RadixLockRef: lambda e, state: ("held by a running request: protected from eviction" if e.lock_ref
                                       else "no request holds it: evictable once it is a leaf"),
}


# ---------------------------------------------------------------------------------- per step


def cursor_step(timeline) -> tuple[int, str, int]:
    """The engine step whose events are at the cursor of `timeline` (a Timeline): its number, its
    kind ("scheduling" while its step_started has not come yet; a step's block moves come before
    it) and the index of its first event. Step 0 before any event."""
    position, done = timeline.position, timeline.num_steps_done()
    if position == 0 and not timeline.dropped_steps:
        return 0, "", 0
    if isinstance(timeline.current_event, ev.StepFinished):
        step, start = done, timeline.step_ends[done - 2] if done >= 2 else 0
    else:
        step, start = done + 1, timeline.step_ends[done - 1] if done >= 1 else 0
    step += timeline.dropped_steps  # a capped live timeline's dropped steps still count
    state = timeline.state
    return step, state.step_kind if state.step == step else "scheduling", start


def end_of_trace_note(state) -> str:
    """What a replay says at its last event: "end of trace", or, for a trace cut off mid-run (a
    recording stopped early), that it ends before its requests finished."""
    unfinished = {seq.request_id for seq in state.seqs.values() if seq.status != "finished"}
    if not unfinished:
        return "end of trace"
    return (f"end of trace: it stops before {len(unfinished)} request{'' if len(unfinished) == 1 else 's'} "
            "finished (cut off mid-run)")


def step_label(timeline) -> str:
    """The step at the cursor in words, "step 33 scheduling" / "step 32 decode": the one figure
    the TUI's status bar, the notebook's controls, a moment, the SVG export and the ledger agree on
    (cursor_step's numbering; "step 0" before any event)."""
    step, kind, _ = cursor_step(timeline)
    return f"step {step} {kind}".rstrip()


def narrate_step(timeline) -> str:
    """What the step at the cursor did up to the cursor, in one sentence: "step 12 decode: 4 tokens;
    seq 1 copied block 9 on write (→ 10); 2 new blocks". Playback at speed says this rather than
    every event; at a step's end it names the whole step."""
    step, kind, start = cursor_step(timeline)
    if step == 0:
        return ""
    events = timeline.events[start:timeline.position]
    done = isinstance(timeline.current_event, ev.StepFinished)
    names = RequestNames(timeline.state)
    parts = [part for e in events if (part := _step_part(e, names)) is not None]
    counts = [(kind_, count) for kind_, count in _step_counts(events) if count]
    said = parts + [plural(count, word) + rest for (word, rest), count in counts]
    head = f"step {step} {kind}".rstrip() + ("" if done or kind == "scheduling" else " so far")
    return f"{head}: " + "; ".join(said) if said else head


_COUNTED = (  # events a step summary counts rather than names: (word, rest of the phrase)
    (ev.TokenGenerated, ("token", "")),
    (ev.BlockAllocated, ("new block", "")),
    (ev.PrefixCacheHit, ("prefix-cache hit", "")),
    (ev.BlockEvicted, ("cached block", " evicted")),
)


def _step_counts(events) -> list[tuple[tuple[str, str], int]]:
    counts = {cls: 0 for cls, _ in _COUNTED}
    freed = 0
    for e in events:
        if type(e) in counts:
            counts[type(e)] += 1
        elif isinstance(e, ev.BlockFreed) and e.ref_count == 0 and e.device == "gpu":
            freed += 1
    return [(words, counts[cls]) for cls, words in _COUNTED] + [(("GPU block", " freed"), freed)]


def _step_part(e: ev.Event, names: RequestNames) -> str | None:
    """The events a step summary names one by one."""
    if isinstance(e, ev.CopyOnWrite):
        return f"{names((e.seq_id,))} copied block {e.src_block} on write (→ {e.dst_block})"
    if isinstance(e, ev.Forked):
        return f"{names((e.parent_seq_id,))} forked {names((e.child_seq_id,))} (sharing {plural(len(e.blocks), 'block')})"
    if isinstance(e, ev.Preempted):
        return f"request {e.request_id} preempted by {e.mode}"
    if isinstance(e, (ev.SwappedOut, ev.SwappedIn)):
        moved = "swapped out" if isinstance(e, ev.SwappedOut) else "swapped in"
        return f"request {e.request_id} {moved} ({plural(len(e.mapping), 'block')})"
    if isinstance(e, ev.RequestAdded):
        return f"request {e.request_id} arrived"
    if isinstance(e, ev.SequenceFinished):
        return f"{names((e.seq_id,))} finished ({e.reason})"
    return None


# ---------------------------------------------------------------------------------- the log's filters

MEMORY = frozenset({ev.BlockAllocated, ev.PrefixCacheHit, ev.BlockHashed, ev.SlotAppended, ev.CopyOnWrite,
                    ev.Forked, ev.SwappedOut, ev.SwappedIn, ev.BlockFreed, ev.SequenceFreed, ev.BlockEvicted})
FILTERS: dict[str, frozenset[type[ev.Event]] | None] = {
    "all events": None,
    "no slots/tokens/digests": frozenset(ev.EVENT_TYPES.values()) - {ev.SlotAppended, ev.TokenGenerated, ev.KVDigest},
    "memory (block manager)": MEMORY,
    "sharing: fork, CoW, hits": frozenset({ev.Forked, ev.CopyOnWrite, ev.PrefixCacheHit, ev.BlockHashed,
                                           ev.BlockEvicted}),
    "swap & preemption": frozenset({ev.SwappedOut, ev.SwappedIn, ev.Preempted, ev.KVDigest}),
    "requests & steps": frozenset({ev.RequestAdded, ev.StepStarted, ev.StepFinished, ev.SequenceFinished,
                                   ev.Preempted}),
    **{kind: frozenset({cls}) for kind, cls in ev.EVENT_TYPES.items()},
}

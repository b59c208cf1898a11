"""Guided playback: where the story stops, and the card it shows there.

The first time an idea of paged KV-cache management happens in an event stream — a fork, a
copy-on-write, a prefix-cache hit, a swap out, a swap in, a recompute, an eviction, a request that
can never run — the guide makes a `Card`: a title, what happened (with the blocks, device and
number), one line of why, and the vLLM function that did it (v0's BlockSpaceManager, or v1's
KVCacheManager / BlockPool in v1 mode). An idea happens inside one engine operation
(blockviz/model/operation.py: a preemption and its moves, an admission with its hits, an eviction
and the allocation it served): its card's `position` is the cursor at that operation's end, so the
pools show the whole move, in a state the engine can be in, when playback stops there. One
operation that shows two ideas first (an eviction, then the swap-in it made room for) makes one card.

A run with KV-cache groups (a hybrid model: sliding-window and full-attention layers, the header's
"kv_cache_groups") has two ideas of its own: the window slides (a sliding-window group lets blocks
go while its request runs: vLLM's remove_skipped_blocks) and a prefix hit cut short by a window
group (the explainer's "window tail freed": vLLM's HybridKVCacheCoordinator.find_longest_cache_hit).
The second needs the cache as the lookup saw it: given the run's header, the guide keeps its own
reducer and explainer (blockviz/model/explain.py) for such a run.

A run with vLLM's CPU tier (`--kv-manager vllm --kv-offloading-size`) has two more: a store to the
CPU tier (vLLM's SimpleCPUOffloadScheduler copies full blocks as they are computed) and a load back
from it (a request's prefix, gone from the GPU, copied back as hits: vLLM v1's answer to v0's
swap-in). A run on vLLM's own scheduler says so on its opening card (design.attribution).

`Guide.scan(events)` reads a growing event list (a live timeline's) once; an operation that may
still grow is open until an event that is not part of it arrives (`settle()` closes it at a
trace's end). Dispatch is by the event's record class. No textual import: the TUI and the notebook
draw the same cards.
"""

from __future__ import annotations

import bisect
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from blockviz.model.design import (
    DEFAULT, KV_DESIGNS, SLIDING_WINDOW, TINY_HYBRID, KVCacheGroup, KVDesign, attribution, has_cpu_tier,
    has_random_weights, kv_cache_groups_of,
)
from blockviz.model.explain import WINDOW_TAIL, Explainer, Explanation
from blockviz.model.glossary import terms_in
from blockviz.model.names import request_name
from blockviz.model.narration import plural, were
from blockviz.model.operation import Operations
from engine import events as ev

if TYPE_CHECKING:
    from blockviz.model.reducer import ReducerState

# The ideas, in the order a learner meets them in the default story.
IDEAS = ("forking", "copy-on-write", "prefix-hit", "swap-out", "eviction", "swap-in", "recompute", "never-runs",
         "chunked-prefill", "window-slides", "window-tail", "offload-store", "offload-load",
         "radix-split", "radix-lock", "page-floor", "lpm-order")
# The event records an idea starts at: the TUI's default breakpoints (`]` plays to the next one).
GUIDE_KINDS: frozenset[type[ev.Event]] = frozenset({
    ev.Forked, ev.CopyOnWrite, ev.PrefixCacheHit, ev.Preempted, ev.SwappedOut, ev.SwappedIn, ev.BlockEvicted,
    ev.BlocksSkipped, ev.OffloadStored, ev.OffloadLoaded, ev.RadixNodeSplit})

# The upstream function that does each idea (vLLM v0: vllm/core/block_manager_v1.py and
# vllm/core/scheduler.py; v1: vllm/v1/core/kv_cache_manager.py, block_pool.py, sched/scheduler.py,
# and for KV-cache groups single_type_kv_cache_manager.py and kv_cache_coordinator.py).
FUNCTIONS = {
    "v0": {
        "forking": "BlockSpaceManager.fork",
        "copy-on-write": "BlockSpaceManager.append_slots (copy-on-write)",
        "prefix-hit": "BlockSpaceManager.allocate → CachedBlockAllocator.allocate(block_hash)",
        "swap-out": "Scheduler._preempt_by_swap → BlockSpaceManager.swap_out",
        "swap-in": "Scheduler._swap_in → BlockSpaceManager.swap_in",
        "recompute": "Scheduler._preempt_by_recompute → BlockSpaceManager.free",
        "eviction": "CachedBlockAllocator.allocate → LRUEvictor.evict",
        "never-runs": "BlockSpaceManager.can_allocate → AllocStatus.NEVER (Scheduler._schedule_prefills)",
    },
    "v1": {
        "prefix-hit": "KVCacheManager.get_computed_blocks",
        "recompute": "Scheduler._preempt_request → KVCacheManager.free",
        "eviction": "BlockPool.get_new_blocks → BlockPool._maybe_evict_cached_block",
        "never-runs": "Scheduler.schedule (the request cannot fit the pool)",
        "chunked-prefill": "Scheduler.schedule (num_new_tokens capped by the token budget) → KVCacheManager.allocate_slots",
        "window-slides": "KVCacheManager.allocate_slots → SingleTypeKVCacheManager.remove_skipped_blocks "
                         "(SlidingWindowManager.get_num_skipped_tokens; vllm/v1/core/single_type_kv_cache_manager.py)",
        "window-tail": "KVCacheManager.get_computed_blocks → HybridKVCacheCoordinator.find_longest_cache_hit "
                       "(vllm/v1/core/kv_cache_coordinator.py) → SlidingWindowManager.find_longest_cache_hit",
        "offload-store": "Scheduler.schedule → SimpleCPUOffloadScheduler.build_connector_meta → "
                         "_prepare_eager_store_specs (vllm/v1/simple_kv_offload/manager.py); the worker copies after "
                         "the step's forward (SimpleCPUOffloadWorker.wait_for_save)",
        "offload-load": "SimpleCPUOffloadScheduler.get_num_new_matched_tokens → update_state_after_alloc "
                        "(vllm/v1/simple_kv_offload/manager.py); SimpleCPUOffloadWorker.start_load_kv copies before "
                        "the forward",
    },
    # SGLang 0.5.23 (kv_manager "sglang"): sglang/srt/mem_cache/radix_cache.py, allocator/base.py,
    # managers/schedule_policy.py and schedule_batch.py
    "sglang": {
        "prefix-hit": "RadixCache.match_prefix (sglang/srt/mem_cache/radix_cache.py)",
        "radix-split": "RadixCache.match_prefix → _match_prefix_helper → _split_node (sglang/srt/mem_cache/radix_cache.py)",
        "radix-lock": "RadixCache.inc_lock_ref, from the request's last node up to the root "
                      "(sglang/srt/mem_cache/radix_cache.py)",
        "page-floor": "RadixCache.match_prefix / insert → RadixKey.page_aligned (sglang/srt/mem_cache/radix_cache.py)",
        "lpm-order": "SchedulePolicy.calc_priority → _compute_prefix_matches → _sort_by_longest_prefix "
                     "(sglang/srt/managers/schedule_policy.py)",
        "eviction": "BaseTokenToKVPoolAllocator.evict_to_free_tokens (sglang/srt/mem_cache/allocator/base.py) → "
                    "RadixCache.evict (sglang/srt/mem_cache/radix_cache.py)",
        "chunked-prefill": "PrefillAdder.add_one_req (chunked_prefill_size; sglang/srt/managers/schedule_policy.py)",
        "recompute": "ScheduleBatch.retract_decode (sglang/srt/managers/schedule_batch.py)",
        "never-runs": "PrefillAdder.add_one_req (the request cannot fit the pool; sglang/srt/managers/schedule_policy.py)",
    },
}
UPSTREAM = {"sglang": "SGLang"}  # whose functions a design's FUNCTIONS name (the others: vLLM's)


@dataclass(frozen=True, slots=True)
class Card:
    """One stop of guided playback: the first time `idea` happened."""

    idea: str  # one of IDEAS
    title: str
    what: str  # what happened, with the blocks involved
    why: str  # one line of why
    function: str  # the vLLM function that did it
    blocks: tuple[tuple[str, int], ...]  # (device, number) of the blocks involved
    seq_no: int  # the first event of the idea
    start: int  # the index of that event in the stream (from its start, dropped events included)
    position: int  # the cursor where playback stops: the end of the operation the idea ran in (the same way)
    ideas: tuple[str, ...] = ()  # every idea the stop shows first, `idea` first (an eviction, then the swap-in it served)
    terms: tuple[str, ...] = ()  # the glossary's words it uses (blockviz/model/glossary.py), which `?` defines
    seqs: tuple[int, ...] = ()  # the sequences it is about: the block tables show theirs first
    upstream: str = "vLLM"  # whose code `function` names: "vLLM", "SGLang" (kv_manager "sglang"), or both

    def blocks_on(self, device: str) -> frozenset[int]:
        return frozenset(number for d, number in self.blocks if d == device)


def _who(ctx: _Context, seq_id: int) -> str:
    """A sequence named as every view names it: its request, with the sequence where the request
    has several (n > 1): "request 3", "request 3 (seq 4)"; "seq 4" when its request is not known."""
    request = ctx.request_of.get(seq_id)
    if request is None:
        return f"seq {seq_id}"
    return request_name(request, (seq_id,), len(ctx.siblings.get(seq_id, ())))


def _whose(ctx: _Context, seq_ids) -> str:
    return ", ".join(_who(ctx, seq) for seq in seq_ids)


def _numbers(blocks) -> str:
    return ", ".join(str(b) for b in blocks)


def _starts(e: ev.Event) -> str | None:
    """The idea an event starts (None: it starts none)."""
    if isinstance(e, ev.Forked):
        return "forking"
    if isinstance(e, ev.CopyOnWrite):
        return "copy-on-write"
    if isinstance(e, ev.PrefixCacheHit):
        return "prefix-hit"
    if isinstance(e, ev.Preempted):
        return "swap-out" if e.mode == "swap" else "recompute"
    if isinstance(e, ev.SwappedOut):  # a swap-out with no preemption announced (a user's `p` in old traces)
        return "swap-out"
    if isinstance(e, ev.SwappedIn):
        return "swap-in"
    if isinstance(e, ev.BlockEvicted):
        return "eviction"
    if isinstance(e, ev.SequenceFinished) and e.reason == "ignored":
        return "never-runs"
    if isinstance(e, ev.BlocksSkipped) and e.blocks:
        return "window-slides"
    if isinstance(e, ev.OffloadStored) and e.mapping:
        return "offload-store"
    if isinstance(e, ev.OffloadLoaded) and e.mapping:
        return "offload-load"
    if isinstance(e, ev.TokensScheduled) and any(
            done + new < total for done, new, total in zip(e.num_computed_tokens, e.num_new_tokens, e.num_tokens)):
        return "chunked-prefill"
    return None


# ---------------------------------------------------------------------------------- the cards


@dataclass(slots=True)
class _Context:
    """What a card's words may need beyond its events: the run's design, and each sequence's request."""

    design: KVDesign
    siblings: dict[int, tuple[int, ...]]  # seq_id -> every seq_id of its request (RequestAdded)
    groups: tuple[KVCacheGroup, ...] = ()  # the run's KV-cache groups (its header's), () for one group
    cpu_tier: bool = False  # the run's CPU pool is vLLM's CPU tier (design.has_cpu_tier)
    holders: dict[int, tuple[int, ...]] = field(default_factory=dict)  # gpu block -> the seqs it was last placed for
    preempted: set[int] = field(default_factory=set)  # seqs preempted by recompute so far
    gpu_hits: dict[int, int] = field(default_factory=dict)  # seq_id -> GPU prefix hits of its latest lookup
    # a lookup cut short by a window group: its first placement event -> (its Explanation, how
    # many leading prompt blocks every full-attention group held then)
    window_tails: dict[int, tuple[Explanation, int]] = field(default_factory=dict)
    request_of: dict[int, str] = field(default_factory=dict)  # seq_id -> its request's id (RequestAdded)
    # a run on SGLang's radix tree (design.radix_tree): the run's state as the events rebuild it (its
    # tree in radix_nodes), its waiting queue's order (schedule_policy), the sequences scheduled so
    # far, the RadixCache.evict calls of the latest eviction and the leaves each took, and the
    # sequences each radix card is about (by its first event's seq_no)
    tree: ReducerState | None = None
    schedule_policy: str = "fcfs"
    scheduled: set[int] = field(default_factory=set)
    evicts: list[tuple[ev.RadixEvict, list[ev.RadixNodeEvicted]]] = field(default_factory=list)
    evicts_done: bool = False
    about: dict[int, tuple[int, ...]] = field(default_factory=dict)
    texts: dict[int, str] = field(default_factory=dict)  # token id -> its text, as the run's events give it
    overtaken: dict[int, tuple[int, tuple[int, ...]]] = field(default_factory=dict)  # lpm: seq_no -> (first, waited)


def _card(ideas: list[tuple[str, int, list[ev.Event]]], end: int, kv_manager: str, ctx: _Context) -> Card:
    """The card of the ideas one operation (blockviz/model/operation.py) showed first: each as
    (idea, index of its first event, the operation's events from there). Two in one operation (an
    eviction and the swap-in it made room for) make one card telling both, in the order they ran."""
    said, upstreams = [], []
    for idea, _, events in ideas:
        title, what, why, blocks = _WORDS[idea](events[0], events, ctx)
        function = FUNCTIONS.get(kv_manager, {}).get(idea) or FUNCTIONS["v0"].get(idea) or FUNCTIONS["v1"][idea]
        said.append((title, what, why, function, blocks))
        upstreams.append(UPSTREAM.get(kv_manager, "vLLM") if idea in FUNCTIONS.get(kv_manager, {}) else "vLLM")
    idea, start, events = ideas[0]
    if len(said) == 1:
        title, what, why, function, blocks = said[0]
    elif [i for i, _, _ in ideas] == ["eviction", "swap-in"]:  # one move: the swap-in took the evicted blocks
        title, what, why, function, blocks = _evicted_for_swap_in(ideas[0][2], ideas[1][2][0])
        function = "; ".join(part[3] for part in said)
    else:
        title = ", then ".join(part[0] for part in said)
        what = "; then ".join(part[1] for part in said)
        why = "; ".join(part[2] for part in said)
        function = "; ".join(part[3] for part in said)
        blocks = list(dict.fromkeys(b for part in said for b in part[4]))
    seqs = tuple(dict.fromkeys(seq for _, _, events in ideas for seq in _seqs_of(events[0], ctx)))
    return Card(idea, title, what, why, function, tuple(blocks), events[0].seq_no, start, end,
                tuple(i for i, _, _ in ideas), terms_in(what, why), seqs, " / ".join(dict.fromkeys(upstreams)))


def _seqs_of(e: ev.Event, ctx: _Context) -> tuple[int, ...]:
    """The sequences an idea's first event is about (the one that hit, forked, wrote, moved; the
    holders of the blocks a CPU-tier store copied; those a radix card names)."""
    if e.seq_no in ctx.about:
        return ctx.about[e.seq_no]
    if isinstance(e, ev.OffloadStored):
        return tuple(dict.fromkeys(seq for gpu, _ in e.mapping for seq in ctx.holders.get(gpu, ())))
    if isinstance(e, ev.OffloadLoaded):
        return (e.seq_id,)
    if isinstance(e, ev.Forked):
        return (e.child_seq_id, e.parent_seq_id)
    if isinstance(e, (ev.CopyOnWrite, ev.SequenceFinished)):
        return (e.seq_id,)
    if isinstance(e, (ev.PrefixCacheHit, ev.BlockAllocated, ev.Preempted, ev.SwappedOut, ev.SwappedIn,
                      ev.TokensScheduled)):
        return tuple(e.seq_ids)
    if isinstance(e, ev.BlocksSkipped):
        return (e.seq_id,)
    return ()


def opening_card(random_weights: bool = False, drivers: str = "") -> Card:
    """The story's first card, before any event: what a KV cache is, why it grows per token, and why
    vLLM hands it out in fixed-size blocks rather than one reservation per request. `random_weights`:
    the run's model is tiny-hybrid (design.has_random_weights), and the card says what that means.
    `drivers`: whose code drives the run when it is not all blockviz's (design.attribution), said
    first."""
    what = ("Each token a model reads leaves its K/V (a key and a value vector per layer), read again for "
            "every later token: the KV cache grows one slot per token. Reserving a request's longest length "
            "up front wastes most of it (the PagedAttention paper measured how much); vLLM hands out "
            "fixed-size blocks as a sequence grows, and a block table maps each sequence's blocks into the pool.")
    if random_weights:
        what += (f" This run's model ({TINY_HYBRID}) has random weights: the text it writes is noise, the memory "
                 "it takes is real.")
    if drivers:
        what = f"{drivers}. {what}"
    why = "a block is taken only when a token needs it, and can be shared (its ref count): more requests fit"
    return Card("kv-cache", "What the cells are: a KV cache in blocks", what, why,
                "the PagedAttention paper (Kwon et al., SOSP 2023); vLLM's BlockSpaceManager / KVCacheManager",
                (), -1, 0, 0, ("kv-cache",), terms_in(what, why))


def _fork_words(e: ev.Forked, events, ctx):
    return ("Fork: two samples, one prompt",
            f"{_who(ctx, e.parent_seq_id)} forked {_who(ctx, e.child_seq_id)}: both block tables now point at "
            f"{e.device} {_numbers(e.blocks)}, each block's ref count went up by one; nothing was copied",
            "the samples share a prompt, so they share its K/V until one of them writes",
            [(e.device, b) for b in e.blocks])


def _cow_words(e: ev.CopyOnWrite, events, ctx):
    return ("Copy-on-write",
            f"{_who(ctx, e.seq_id)} was about to write into {e.device} block {e.src_block}, which it shared: "
            f"its {plural(len(e.token_ids), 'token')} {were(len(e.token_ids))} copied to block {e.dst_block}, which it "
            f"owns alone; block {e.src_block} keeps {plural(e.src_ref_count, 'other reference')}",
            "a shared block must never change under another sequence: the writer gets its own copy, "
            "only when it writes",
            [(e.device, e.src_block), (e.device, e.dst_block)])


def _hit_words(e: ev.PrefixCacheHit, events, ctx):
    hits = [h for h in events if isinstance(h, ev.PrefixCacheHit) and h.seq_ids == e.seq_ids]
    blocks = [h.block for h in hits]
    tokens = sum(len(h.token_ids) for h in hits)
    owners = {seq for h in hits for seq in ctx.siblings.get(h.seq_ids[0], ())} - set(e.seq_ids)
    if not ctx.design.copy_on_write and owners:  # vLLM v1: no fork; n samples share their prompt through the cache
        return ("n = 2 without a fork: the prompt shared through the cache",
                f"{_whose(ctx, e.seq_ids)} is another sample of the same request as "
                f"{_whose(ctx, sorted(owners))}: vLLM v1 runs each sample as its own request, and this one "
                f"found {plural(len(blocks), 'block')} ({e.device} {_numbers(blocks)}) of the prompt by their hash, "
                f"so {plural(tokens, 'token')} {'is' if tokens == 1 else 'are'} not computed again",
                "v1 has no fork: the prefix cache does the sharing, block by full block (vLLM 0.33 copies a block "
                "only for a hit that ends inside it, a partial-block hit)",
                [(e.device, b) for b in blocks])
    if len(ctx.groups) > 1 or len({h.group for h in hits}) > 1:  # KV-cache groups: the hit holds in every group
        return _group_hit_words(e, hits, ctx)
    return ("Prefix-cache hit",
            f"{_whose(ctx, e.seq_ids)}'s prompt starts as an earlier one did: "
            f"{plural(len(blocks), 'block')} ({e.device} {_numbers(blocks)}) found by their hash and shared, so "
            f"{plural(tokens, 'token')} {'is' if tokens == 1 else 'are'} not computed again",
            "a full block's hash chains its tokens and every token before them: an equal hash means equal K/V",
            [(e.device, b) for b in blocks])


def _group_hit_words(e: ev.PrefixCacheHit, hits: list[ev.PrefixCacheHit], ctx):
    """A prefix hit in a run with KV-cache groups: as long in every group (vLLM
    HybridKVCacheCoordinator.find_longest_cache_hit), a sliding-window group's only the blocks the
    window still reads, the null block before them."""
    by_group: dict[int, list[ev.PrefixCacheHit]] = {}
    for h in hits:
        by_group.setdefault(h.group, []).append(h)
    num_blocks = max(h.logical_index for h in hits) + 1
    tokens = num_blocks * len(e.token_ids)
    parts = []
    for g, group_hits in sorted(by_group.items()):
        kind = ""
        if g < len(ctx.groups):
            kind = " (sliding window)" if ctx.groups[g].kind == SLIDING_WINDOW else " (full attention)"
        parts.append(f"group {g}{kind}: {e.device} {_numbers(h.block for h in group_hits)}")
    return ("Prefix-cache hit in every group",
            f"{_whose(ctx, e.seq_ids)}'s prompt starts as an earlier one did: its first "
            f"{plural(num_blocks, 'block')} ({plural(tokens, 'token')}) hit in every KV-cache group, found by their "
            f"hash ({'; '.join(parts)}), so they are not computed again",
            "a hit must hold in every group: full attention needs every block of the prefix, a sliding-window group "
            "only the last ones its window reads (the null block stands before them); a block it let go but the "
            "pool has not evicted still counts",
            [(e.device, h.block) for h in hits])


def _preempt_words(e: ev.Preempted | ev.SwappedOut, events, ctx):
    swaps = [m for m in events if isinstance(m, ev.SwappedOut)]
    freed = sorted({m.block for m in events if isinstance(m, ev.BlockFreed)})  # every block it let go
    returned = {m.block for m in events if isinstance(m, ev.BlockFreed) and m.ref_count == 0}  # back in the pool
    if isinstance(e, ev.SwappedOut) or e.mode == "swap":
        mapping = [pair for s in swaps for pair in s.mapping]
        request = e.request_id
        why = (f"{e.reason}: " if isinstance(e, ev.Preempted) else "") + \
            "the newest request gives way; its K/V waits in the CPU pool instead of being computed again"
        return ("Swap out (preemption)",
                f"request {request} was preempted by swap: GPU blocks {_numbers(g for g, _ in mapping)} copied "
                f"to CPU blocks {_numbers(c for _, c in mapping)}, and the GPU blocks freed",
                why, [("gpu", g) for g, _ in mapping] + [("cpu", c) for _, c in mapping])
    if ctx.design.radix_tree:
        return _retract_words(e, freed, returned)
    return ("Recompute (preemption)",
            f"request {e.request_id} was preempted by recompute: its "
            f"{plural(len(freed), 'GPU block')} ({_numbers(freed)}) "
            + ("freed" if len(returned) == len(freed) else
               f"let go ({len(returned)} freed to the pool, {len(freed) - len(returned)} still shared and kept)")
            + " and "
            f"{plural(e.num_tokens_lost, 'computed token')} thrown away, to compute again later",
            f"{e.reason}: " + ("vLLM v1 never swaps: the freed full blocks keep their hashes in the free queue, "
                               "and when it is admitted again the prefix cache serves back those not evicted "
                               "meanwhile; the rest is computed again"
                               if not ctx.design.swap else
                               "a lone sequence costs less to compute again than to copy out and back"),
            [("gpu", b) for b in freed])


def _retract_words(e: ev.Preempted, freed: list[int], returned: list[int]):
    """SGLang's preemption (ScheduleBatch.retract_decode → release_req → release_kv_cache with
    checkpoint=False): the request's own slots go back to the allocator without entering the tree,
    its lock on the prefix it matched is dropped, and it waits to be prefilled again."""
    kept = len(freed) - len(returned)
    return ("Retraction (preemption)",
            f"request {e.request_id} was retracted: its {plural(len(freed), 'page')} ({_numbers(freed)}) let go"
            + (f" ({len(returned)} freed to the pool, {kept} kept in the radix tree)" if kept else ", freed to the pool")
            + f" and {plural(e.num_tokens_lost, 'computed token')} thrown away; it waits to be prefilled again",
            f"{e.reason}: SGLang retracts, it never swaps: retract_decode takes requests back to the waiting queue "
            "(the fewest output tokens first), frees their own slots without putting them in the tree and unlocks "
            "the prefix they matched there, which stays cached (evictable) for their next prefill",
            [("gpu", b) for b in freed])


def _swap_in_words(e: ev.SwappedIn, events, ctx):
    blocks = [("cpu", c) for c, _ in e.mapping] + [("gpu", g) for _, g in e.mapping]
    if not e.revived:
        return ("Swap in",
                f"request {e.request_id} came back: CPU blocks {_numbers(c for c, _ in e.mapping)} copied to GPU "
                f"blocks {_numbers(g for _, g in e.mapping)}; it decodes on from where it stopped",
                "blocks freed up, and a swapped request goes before the waiting ones", blocks)
    revived = set(e.revived)
    found = [(c, g) for c, g in e.mapping if g in revived]
    copied = [(c, g) for c, g in e.mapping if g not in revived]
    what = (f"request {e.request_id} came back: GPU {plural(len(found), 'block')} {_numbers(g for _, g in found)} "
            f"(for CPU {_numbers(c for c, _ in found)}) still held the same {'hash' if len(found) == 1 else 'hashes'}, "
            f"so {'it was' if len(found) == 1 else 'they were'} taken back by hash: nothing copied, nothing evicted")
    if copied:
        what += (f"; CPU {_numbers(c for c, _ in copied)} {were(len(copied))} copied to GPU "
                 f"{_numbers(g for _, g in copied)}")
    return ("Swap in, by hash", what + "; it decodes on from where it stopped",
            "blocks freed up, and a swapped request goes before the waiting ones; with prefix caching a swap "
            "allocates each block by its hash, so a block still cached is revived, not evicted", blocks)


def _eviction_words(e: ev.BlockEvicted, events, ctx):
    if ctx.evicts:  # SGLang's RadixCache.evict said what it was asked and freed
        return _radix_eviction_words(e, events, ctx)
    blocks = [x.block for x in events if isinstance(x, ev.BlockEvicted)]
    if ctx.design.free_queue:  # v1: the free queue's head goes first
        taken = [x for x in events if isinstance(x, ev.BlockAllocated) and x.block in blocks]
        who = f" for {_whose(ctx, [s for x in taken for s in x.seq_ids])}" if taken else ""
        return ("Eviction from the free queue's head",
                f"{plural(len(blocks), 'block')} ({e.device} {_numbers(blocks)}) stood at the head of the free queue: "
                f"the next to hand out, still cached (v1 frees a request's blocks last first, so a prompt's tail "
                f"goes before its head); BlockPool took {'it' if len(blocks) == 1 else 'them'}{who}, "
                f"dropping {'its hash' if len(blocks) == 1 else 'their hashes'}",
                "a freed block with a hash joins the queue's tail (one without a hash, its head: vLLM PR #42656), "
                "so the head's cached blocks are the least recently used; a later prompt with its tokens misses", [(e.device, b) for b in blocks])
    return ("Eviction",
            f"{plural(len(blocks), 'block')} ({e.device} {_numbers(blocks)}) {were(len(blocks))} "
            f"free but still cached; the pool needed room, so the least recently used lost "
            f"{'its hash and was' if len(blocks) == 1 else 'their hashes and were'} taken",
            "a cached block is kept only while nobody needs the space: a later prompt with its tokens misses",
            [(e.device, b) for b in blocks])


def _evicted_for_swap_in(events, swap_in: ev.SwappedIn):
    """An eviction and the swap-in it made room for, told as the one move they are."""
    evicted = [x.block for x in events if isinstance(x, ev.BlockEvicted)]
    blocks = "block" if len(swap_in.mapping) == 1 else "blocks"
    return ("Eviction, then swap in",
            f"request {swap_in.request_id} came back from the CPU pool: its CPU {blocks} "
            f"{_numbers(c for c, _ in swap_in.mapping)} {were(len(swap_in.mapping))} copied to GPU {blocks} "
            f"{_numbers(g for _, g in swap_in.mapping)}; {len(evicted)} of those "
            f"({_numbers(evicted)}) {were(len(evicted))} free but still cached, so the least recently used "
            f"{'lost its hash' if len(evicted) == 1 else 'lost their hashes'}",
            "a swapped request goes before the waiting ones; a cached block is kept only while nobody needs the space",
            None, [("cpu", c) for c, _ in swap_in.mapping] + [("gpu", g) for _, g in swap_in.mapping])


def _chunk_words(e: ev.TokensScheduled, events, ctx):
    """vLLM v1's first chunked prefill: a prompt computed over several steps, a chunk per step."""
    i = next(i for i, (done, new, total) in enumerate(zip(e.num_computed_tokens, e.num_new_tokens, e.num_tokens))
             if done + new < total)
    seq, done, new, total = e.seq_ids[i], e.num_computed_tokens[i], e.num_new_tokens[i], e.num_tokens[i]
    return ("Chunked prefill",
            f"{_who(ctx, seq)}'s prompt is {plural(total, 'token')}, more than step {e.step}'s budget allows: it computes "
            f"{plural(new, 'token')} now ({done + new} of {total} done), the rest in the next steps, and holds blocks "
            "only for the tokens computed so far",
            f"a step has a token budget ({'chunked_prefill_size' if ctx.design.radix_tree else 'max_num_batched_tokens'}): "
            "a long prompt waits less, and decodes keep running beside it", [])


def _window_words(e: ev.BlocksSkipped, events, ctx):
    """A sliding-window group's first blocks let go mid-request (vLLM remove_skipped_blocks)."""
    freed = [x for x in events if isinstance(x, ev.BlockFreed) and x.block in e.blocks and x.group == e.group]
    window = ctx.groups[e.group].sliding_window if e.group < len(ctx.groups) else None
    layers = f"its sliding-window layers (group {e.group}" + (f", a window of {window} tokens)" if window else ")")
    n = len(e.blocks)
    cached = sum(x.cached for x in freed)
    back = "back in the free queue" + (", still cached (a later prompt with these tokens can hit them until "
                                       "they are evicted)" if cached else "")
    slots = ", ".join(f"L{i}" for i in e.logical_indices)
    return ("The window slides: blocks go back mid-request",
            f"{_who(ctx, e.seq_id)} is still running, but {layers} will never read {slots} again: "
            f"{plural(n, 'block')} ({_numbers(e.blocks)}) left that table, the null block (block 0) took "
            f"{'its slot' if n == 1 else 'their slots'}, and {'it is' if n == 1 else 'they are'} {back}"
            + ("; the full-attention group keeps every block of the request"
               if any(group.kind != SLIDING_WINDOW for group in ctx.groups) else ""),
            "a sliding layer reads only the last window of tokens, so a block wholly before it is dead weight: "
            "vLLM frees it at the start of the next allocate_slots, and a long request holds about "
            "window / block_size blocks in that group instead of its whole length",
            [("gpu", b) for b in e.blocks])


def _window_tail_words(e, events, ctx):
    """A prefix hit cut short by a window group (the explainer's "window tail freed")."""
    explanation, held = ctx.window_tails[e.seq_no]
    miss = explanation.first_miss
    hits = [h for h in events if isinstance(h, ev.PrefixCacheHit) and explanation.seq_id in h.seq_ids]
    hit_blocks = explanation.num_hit_blocks
    hit = (f"the hit is {plural(hit_blocks, 'block')} ({plural(explanation.num_hit_tokens, 'token')})" if hit_blocks
           else "there is no hit at all")
    return ("A prefix hit cut short by the window group" if hit_blocks else "A prefix hit lost to the window group",
            f"{_who(ctx, explanation.seq_id)}'s prompt starts as an earlier one did, and the full-attention group still "
            f"holds {plural(held, 'block')} of it, but {hit}: {miss.detail}. The tokens from L{miss.index} on are "
            "computed again, in every group",
            "a prefix hit must hold in every group: a sliding-window group needs, cached, the blocks the window of "
            "the next token reads (the blocks it let go and the pool then evicted are gone), so the hit ends "
            "where that group still has them",
            list(dict.fromkeys((h.device, h.block) for h in hits)))


def _store_words(e: ev.OffloadStored, events, ctx):
    """vLLM's CPU tier taking its first copies (SimpleCPUOffloadScheduler, eager stores)."""
    seqs = _seqs_of(e, ctx)
    whose = f" of {_whose(ctx, seqs)}" if seqs else ""
    n = len(e.mapping)
    return ("Store to the CPU tier",
            f"{plural(n, 'full block')}{whose} computed in an earlier step {were(n)} copied to vLLM's CPU tier: GPU "
            f"{_numbers(g for g, _ in e.mapping)} to CPU {_numbers(c for _, c in e.mapping)}, each kept in the CPU pool "
            f"under its hash; a GPU block is pinned (its ref count + 1) until its copy is done, then let go",
            "vLLM v1 has no swap; its answer is a second prefix cache in CPU memory, filled as blocks are computed, "
            "so a block the GPU later evicts can be copied back instead of computed again",
            [("gpu", g) for g, _ in e.mapping] + [("cpu", c) for _, c in e.mapping])


def _load_words(e: ev.OffloadLoaded, events, ctx):
    """A request's prefix copied back from vLLM's CPU tier (its blocks count as hits)."""
    came = "came back after its preemption" if e.seq_id in ctx.preempted else "was admitted"
    hits = ctx.gpu_hits.get(e.seq_id, 0)
    gpu = (f"its first {plural(hits, 'block')} hit on the GPU, the next were gone from it" if hits
           else "none of its prefix was left on the GPU")
    n = len(e.mapping)
    return ("Loaded back from the CPU tier",
            f"{_who(ctx, e.seq_id)} {came}: {gpu}; the CPU tier held copies of "
            f"{plural(n, 'block')}, CPU {_numbers(c for c, _ in e.mapping)}, copied into its new GPU blocks "
            f"{_numbers(g for _, g in e.mapping)}: {plural(e.num_tokens, 'token')} count as prefix hits, not computed again",
            "v0 swapped a preempted request out and back in; v1 frees and recomputes, and the tier's copies "
            "(found by hash) turn that recompute into a copy: the request waits a step (WAITING_FOR_REMOTE_KVS)",
            [("cpu", c) for c, _ in e.mapping])  # its GPU blocks are in its table: the tier's pool is the news


def _recompute_words(e: ev.Preempted, events, ctx):
    """A recompute preemption; in a run with vLLM's CPU tier, what the tier keeps of it."""
    title, what, why, blocks = _preempt_words(e, events, ctx)
    if ctx.cpu_tier and not ctx.design.radix_tree:
        why = (f"{e.reason}: vLLM v1 never swaps, but its CPU tier keeps copies of the full blocks it stored, so "
               "what the GPU evicts meanwhile can be copied back when the request is admitted again")
    return title, what, why, blocks


def _never_words(e: ev.SequenceFinished, events, ctx):
    return ("A request that can never run",
            f"{_who(ctx, e.seq_id)} finished as ignored: {e.detail or 'it cannot fit'}",
            "waiting would never help: the engine says so and goes on, it never waits forever",
            [])


# ---------------------------------------------------------------- SGLang's radix tree (kv_manager "sglang")


def _run_text(ctx: _Context, token_ids, limit: int = 24) -> str:
    """A run of tokens as text, quoted, cut at `limit` characters ("…")."""
    texts = ctx.texts
    text = "".join(texts.get(t, f"<{t}>") for t in token_ids).replace("\n", " ")
    return repr(text if len(text) <= limit else text[:limit - 1] + "…")


def _pages(slots, page_size: int) -> list[int]:
    """The pages (our blocks) a run of KV slots lies in, in order."""
    return list(dict.fromkeys(slot // page_size for slot in slots))


def _page_list(pages) -> str:
    return f"page {pages[0]}" if len(pages) == 1 else f"pages {_numbers(pages)}"


def _path(ctx: _Context, node_id: int) -> list[int]:
    """The node and its parents up to the root's child, deepest first."""
    path, nodes = [], ctx.tree.radix_nodes
    while node_id is not None:
        path.append(node_id)
        node_id = nodes[node_id].parent_id
    return path


def _tree_match(ctx: _Context, token_ids) -> int:
    """How many leading tokens of `token_ids` the tree holds, token by token (the page floor not
    applied)."""
    nodes = ctx.tree.radix_nodes
    children: dict[int | None, list[int]] = {}
    for node_id, node in nodes.items():
        children.setdefault(node.parent_id, []).append(node_id)
    matched, parent = 0, None
    while True:
        child = next((c for c in children.get(parent, ()) if matched < len(token_ids)
                      and nodes[c].token_ids[0] == token_ids[matched]), None)
        if child is None:
            return matched
        run = nodes[child].token_ids
        k = 0
        while k < len(run) and matched + k < len(token_ids) and run[k] == token_ids[matched + k]:
            k += 1
        matched += k
        if k < len(run):
            return matched
        parent = child


def _shared(ctx: _Context, seq_id: int) -> tuple[int, int | None]:
    """The most leading prompt tokens of `seq_id` another sequence's tokens start with, and that
    sequence (the first such)."""
    seqs = ctx.tree.seqs
    prompt = seqs[seq_id].token_ids[:seqs[seq_id].num_prompt_tokens]
    best, who = 0, None
    for other, seq in seqs.items():
        if other == seq_id:
            continue
        k = 0
        while k < len(prompt) and k < len(seq.token_ids) and seq.token_ids[k] == prompt[k]:
            k += 1
        if k > best:
            best, who = k, other
    return best, who


def _page_hit(ctx: _Context, seq_id: int) -> int:
    """The tokens of `seq_id`'s prompt a page-aligned match finds in the tree now (RadixKey.page_aligned)."""
    seq = ctx.tree.seqs[seq_id]
    return _tree_match(ctx, seq.token_ids[:seq.num_prompt_tokens]) // ctx.tree.block_size * ctx.tree.block_size


def _radix_idea(e: ev.Event, ctx: _Context, seen: set[str]) -> str | None:
    """The radix idea an event of an SGLang run starts, before the event is applied (None: none):
    a split; a request's first hit past a page boundary it cannot cross ("page-floor") or else
    its path locked ("radix-lock"); a request scheduled before one that waited longer ("lpm-order")."""
    if ctx.tree is None:
        return None
    if isinstance(e, ev.RadixNodeSplit):
        return "radix-split"
    if isinstance(e, ev.PrefixCacheHit) and e.logical_index == 0 and e.seq_ids[0] in ctx.tree.seqs:
        seq_id = e.seq_ids[0]
        shared, _ = _shared(ctx, seq_id)
        hit = _page_hit(ctx, seq_id)
        if "page-floor" not in seen and hit < shared < hit + ctx.tree.block_size:
            return "page-floor"
        return "radix-lock"
    if isinstance(e, ev.TokensScheduled):
        overtaken = _overtaken(e, ctx) if ctx.schedule_policy in ("lpm", "dfs-weight") else None
        ctx.scheduled.update(e.seq_ids)
        if overtaken is not None:
            ctx.overtaken[e.seq_no] = overtaken
            return "lpm-order"
    return None


def _overtaken(e: ev.TokensScheduled, ctx: _Context) -> tuple[int, tuple[int, ...]] | None:
    """The first sequence this step schedules for the first time, and the sequences still waiting,
    never scheduled, that arrived before it (None: none did)."""
    first = next((seq for seq in e.seq_ids if seq not in ctx.scheduled), None)
    if first is None or first not in ctx.request_of:
        return None
    order = list(ctx.request_of)
    waited = tuple(seq for seq in order[:order.index(first)] if seq not in ctx.scheduled and seq not in e.seq_ids
                   and ctx.tree.seqs.get(seq) is not None and ctx.tree.seqs[seq].status == "waiting")
    return (first, waited) if waited else None


def _split_words(e: ev.RadixNodeSplit, events, ctx):
    """A node split where a new prompt left it (RadixCache._split_node)."""
    page_size = ctx.tree.block_size if ctx.tree is not None else 1
    head, tail = ctx.tree.radix_nodes[e.new_node_id], ctx.tree.radix_nodes[e.node_id]
    prefix = [t for node_id in reversed(_path(ctx, e.new_node_id)) for t in ctx.tree.radix_nodes[node_id].token_ids]
    who = next((seq for seq, s in ctx.tree.seqs.items() if seq not in ctx.scheduled and s.status == "waiting"
                and s.token_ids[:len(prefix)] == prefix), None)
    ctx.about[e.seq_no] = (who,) if who is not None else ()
    whose = f"{_who(ctx, who)}'s prompt" if who is not None else "a new prompt"
    head_pages, tail_pages = _pages(head.slots, page_size), _pages(tail.slots, page_size)
    return ("A radix node splits",
            f"{whose} matches the tree for {plural(len(prefix), 'token')} and leaves it inside node {e.node_id}: SGLang "
            f"split that node at token {e.num_tokens}. Node {e.new_node_id} takes its first {e.num_tokens} "
            f"{_run_text(ctx, head.token_ids)} ({_page_list(head_pages)}) in its place; node {e.node_id} keeps the "
            f"other {len(tail.token_ids)} ({_page_list(tail_pages)}) under it. Nothing is copied",
            "a radix tree shares a prefix of any length: where two prompts part, one node becomes two and each "
            "keeps its own pages (vLLM keeps a flat map of block hashes, never split)",
            [("gpu", b) for b in head_pages + tail_pages])


def _lock_words(e: ev.PrefixCacheHit, events, ctx):
    """A request's matched path locked up to the root (RadixCache.inc_lock_ref)."""
    seq_id, page_size = e.seq_ids[0], ctx.tree.block_size
    hits = [h.block for h in events if isinstance(h, ev.PrefixCacheHit) and h.seq_ids == e.seq_ids]
    node_of = {slot // page_size: node_id for node_id, node in ctx.tree.radix_nodes.items() for slot in node.slots}
    path = _path(ctx, node_of[hits[-1]]) if hits[-1] in node_of else []
    nodes = ctx.tree.radix_nodes
    steps = " → ".join(f"node {n} (lock_ref {nodes[n].lock_ref})" for n in path)
    protected = sum(len(n.token_ids) for n in nodes.values() if n.lock_ref > 0)
    evictable = sum(len(n.token_ids) for n in nodes.values() if n.lock_ref == 0)
    ctx.about[e.seq_no] = (seq_id,)
    return ("A lock along the path",
            f"{_who(ctx, seq_id)} found {plural(len(hits) * page_size, 'token')} of its prompt in the tree (pages "
            f"{_numbers(hits)}) and locked its path: {steps} → root, one more on each. Protected (lock_ref > 0): "
            f"{plural(protected, 'token')}; evictable: {evictable}",
            "SGLang counts holders per node along a path, not per block (vLLM's ref_count): evict never takes a node "
            "whose lock_ref is above 0, so a running request's prefix stays",
            [("gpu", b) for b in hits])


def _floor_words(e: ev.PrefixCacheHit, events, ctx):
    """A hit that stops at a page boundary (page_size > 1: RadixKey.page_aligned)."""
    seq_id, page_size = e.seq_ids[0], ctx.tree.block_size
    hits = [h.block for h in events if isinstance(h, ev.PrefixCacheHit) and h.seq_ids == e.seq_ids]
    hit = len(hits) * page_size
    shared, other = _shared(ctx, seq_id)
    held = _tree_match(ctx, ctx.tree.seqs[seq_id].token_ids[:shared])
    table = ctx.tree.tables.get(other, [])
    partial = table[hit // page_size][1] if held <= hit and hit // page_size < len(table) else None
    ctx.about[e.seq_no] = (seq_id, other)
    what = (f"{_who(ctx, seq_id)}'s prompt starts with the same {shared} tokens as {_who(ctx, other)}'s, but its hit "
            f"is {plural(hit, 'token')} ({plural(len(hits), 'page')} of {page_size}: {_numbers(hits)}): ")
    if partial is not None:
        what += (f"{_who(ctx, other)}'s tokens {hit + 1} to {shared} lie in its partial last page, block {partial}, "
                 "which SGLang never puts in the tree")
    else:
        what += f"the tree holds {held} of them, and a match stops at a page boundary"
    what += f"; {plural(shared - hit, 'token')} {'is' if shared - hit == 1 else 'are'} computed again"
    return ("The page floor: a hit stops at a page boundary",
            what,
            f"with page_size {page_size} a match, an insert and an eviction are whole pages (vLLM's full-blocks-only "
            "rule); at page_size 1 SGLang shares every token",
            [("gpu", b) for b in hits] + ([("gpu", partial)] if partial is not None else []))


def _lpm_words(e: ev.TokensScheduled, events, ctx):
    """A request scheduled before one that arrived earlier: the waiting queue sorted by cached prefix."""
    first, waited = ctx.overtaken[e.seq_no]
    index = e.seq_ids.index(first)
    cached = e.num_computed_tokens[index]
    others = ", ".join(f"{_who(ctx, seq)} {_page_hit(ctx, seq)}" for seq in waited)
    ctx.about[e.seq_no] = (first, *waited)
    cached_pages = [number for _, number in ctx.tree.tables.get(first, [])][:cached // ctx.tree.block_size]
    return (f"{ctx.schedule_policy}: the longest cached prefix runs first",
            f"{_whose(ctx, waited)} arrived before {_who(ctx, first)}, yet {_who(ctx, first)} runs first (step "
            f"{e.step}) and {_whose(ctx, waited)} waits: schedule_policy={ctx.schedule_policy} sorts the waiting queue by "
            f"the tokens the tree holds of each prompt: {_who(ctx, first)} has {cached}"
            + (f" ({_page_list(cached_pages)})" if cached_pages else "") + f", {others}",
            "a request with its prefix in the tree costs only its new tokens, and runs while that prefix is cached; "
            "vLLM's scheduler keeps arrival order (FCFS) with no prefix-aware order",
            [("gpu", b) for b in cached_pages])


def _radix_eviction_words(e: ev.BlockEvicted, events, ctx):
    """SGLang's RadixCache.evict: whole unlocked leaves, least recently used first."""
    evicted = [x.block for x in events if isinstance(x, ev.BlockEvicted)]
    asked = sum(call.num_tokens for call, _ in ctx.evicts)
    freed = sum(call.num_tokens_evicted for call, _ in ctx.evicts)
    leaves = [leaf for _, taken in ctx.evicts for leaf in taken]
    taken = [x for x in events if isinstance(x, ev.BlockAllocated) and x.block in evicted]
    who = _whose(ctx, list(dict.fromkeys(s for x in taken for s in x.seq_ids))) if taken else "This step's allocation"
    names = "; ".join(f"node {leaf.node_id} ({plural(len(leaf.token_ids), 'token')} {_run_text(ctx, leaf.token_ids)})"
                      for leaf in leaves)
    more = f"{freed - asked} more than asked" if freed > asked else "no more than asked"
    return ("Eviction: whole leaves, more than asked" if freed > asked else "Eviction of a leaf",
            f"{who} needed {plural(asked, 'slot')} more than were free: RadixCache.evict was asked for {asked} and freed "
            f"{freed} ({more}), taking whole leaves with lock_ref 0, least recently used first: {names}; pages "
            f"{_numbers(evicted)} went back to the pool",
            "a leaf goes whole: its run of tokens is one node, so SGLang frees a node's pages together; vLLM evicts "
            "one block at a time, as its free queue hands them out",
            [(e.device, b) for b in evicted])


_WORDS = {
    "forking": _fork_words, "copy-on-write": _cow_words, "prefix-hit": _hit_words, "swap-out": _preempt_words,
    "recompute": _recompute_words, "swap-in": _swap_in_words, "eviction": _eviction_words,
    "never-runs": _never_words, "chunked-prefill": _chunk_words, "window-slides": _window_words,
    "window-tail": _window_tail_words, "offload-store": _store_words, "offload-load": _load_words,
    "radix-split": _split_words, "radix-lock": _lock_words, "page-floor": _floor_words, "lpm-order": _lpm_words,
}


class _Lookups:
    """The prefix lookups of a run with a sliding-window group, as the explainer sees them (the cache
    as each lookup saw it): which one a window group cut short."""

    def __init__(self, header: dict) -> None:
        from blockviz.model.design import kv_manager_of
        from blockviz.model.reducer import ReducerState

        self.state = ReducerState.from_header(header)
        self.explainer = Explainer(bool(header.get("enable_prefix_caching", True)), kv_manager_of(header),
                                   header.get("prefix_caching_hash_algo") or "sha256", self.state.kv_cache_groups)

    def feed(self, e: ev.Event) -> tuple[Explanation, int] | None:
        """Apply `e`; when it is the first placement of a lookup whose first miss is "window tail
        freed", that Explanation and how many leading blocks every
        full-attention group held then."""
        before = len(self.explainer.explained)
        self.explainer.feed(e, self.state)
        found = None
        if len(self.explainer.explained) > before:
            explanation = self.explainer.explained[-1]
            miss = explanation.first_miss
            if miss is not None and miss.verdict == WINDOW_TAIL:
                found = (explanation, self._held(explanation))
        self.state.apply(e)
        return found

    def _held(self, explanation: Explanation) -> int:
        """How many leading blocks of the lookup every full-attention group caches now."""
        full = [g for g, group in enumerate(self.state.kv_cache_groups) if group.kind != SLIDING_WINDOW]
        held = 0
        for row in explanation.blocks:
            if row.block_hash is None or any(self.state.cached_block(row.block_hash, g) is None for g in full):
                break
            held += 1
        return held


class Guide:
    """The cards of an event stream, one per operation that shows an idea first, read as events arrive."""

    def __init__(self, kv_manager: str = "v0", opening: bool = False, header: dict | None = None) -> None:
        """`opening`: the guide starts with opening_card() at position 0 (a guided story). `header`:
        the run's (a trace's or a session's); with KV-cache groups the guide also finds the lookups a
        window group cut short, with a reducer and an explainer of its own."""
        design = KV_DESIGNS.get(kv_manager, DEFAULT)
        # whose functions the cards name: vLLM's (its own manager: v1's), or SGLang's for its radix tree
        self.kv_manager = "sglang" if design.radix_tree else design.vllm_api
        self.cards: list[Card] = [opening_card(has_random_weights(header or {}), attribution(header or {}))
                                  ] if opening else []
        self._positions: list[int] = [0] if opening else []  # each card's position, for bisect
        self._seen: set[str] = set()
        self._operations = Operations()
        groups = kv_cache_groups_of(header or {})
        self._ctx = _Context(design, {}, groups, has_cpu_tier(header or {}))
        self._lookups = _Lookups(header) if any(g.kind == SLIDING_WINDOW for g in groups) else None
        if design.radix_tree and header:  # the radix cards read the tree and the requests' tokens
            from blockviz.model.reducer import ReducerState

            self._ctx.tree = ReducerState.from_header(header)
            self._ctx.schedule_policy = (header.get("sglang_options") or {}).get("schedule_policy", "fcfs")
        self._pending: list[tuple[int, ev.Event, str | None]] = []  # the open operation's (index, event, idea)
        self._new_idea = False  # whether the open operation shows an idea first
        self._scanned = 0
        self.settled = False  # the stream has ended: every card is known
        self.expected: int | None = None  # the cards a live run's story is known to show (scenario.story_cards)
        # Events a capped live timeline dropped from its front (Timeline.dropped_events): cards
        # count positions from the stream's start, the methods below from the timeline's front
        self.offset = 0

    def scan(self, events: list[ev.Event], offset: int = 0) -> None:
        """Read what is new in `events`, the stream after its first `offset` events (the list
        grows; a capped timeline drops its front and says how many in `offset`)."""
        self.offset = offset
        if offset > self._scanned:  # dropped before it was read to its end
            self._close()
            self._operations.skip_to(offset)
            self._lookups = None  # its cache is no longer known: no window-tail cards after a drop
            self._ctx.tree = None  # nor the radix tree: no radix cards that read it
        for index in range(max(self._scanned, offset), offset + len(events)):
            e = events[index - offset]
            if self._operations.add(e):
                self._close()
            if isinstance(e, ev.RequestAdded):
                self._ctx.siblings.update(dict.fromkeys(e.seq_ids, e.seq_ids))
                self._ctx.request_of.update(dict.fromkeys(e.seq_ids, e.request_id))
            if isinstance(e, ev.Forked) and e.parent_seq_id in self._ctx.request_of:  # v0: n > 1 grows by forks
                family = (*self._ctx.siblings.get(e.parent_seq_id, (e.parent_seq_id,)), e.child_seq_id)
                self._ctx.siblings.update(dict.fromkeys(family, family))
                self._ctx.request_of[e.child_seq_id] = self._ctx.request_of[e.parent_seq_id]
            self._note(e)
            idea = _starts(e)
            if self._ctx.design.radix_tree:
                idea = self._radix(e, idea)
            if self._lookups is not None and (tail := self._lookups.feed(e)) is not None:
                self._ctx.window_tails[e.seq_no] = tail
                idea = "window-tail" if "window-tail" not in self._seen else idea
            self._pending.append((index, e, idea))
            if idea is not None and idea not in self._seen:
                self._new_idea = True
        self._scanned = max(self._scanned, offset + len(events))

    def _radix(self, e: ev.Event, idea: str | None) -> str | None:
        """An SGLang run's idea for `e` (its radix ideas before the generic ones they stand for: a
        hit is a lock or the page floor, not vLLM's hash hit), then `e` applied to the guide's tree."""
        ctx = self._ctx
        radix = _radix_idea(e, ctx, self._seen)
        if isinstance(e, ev.PrefixCacheHit):
            idea = radix
        elif radix is not None and radix not in self._seen:
            idea = radix
        if ctx.tree is not None:
            ctx.tree.apply(e)
        return idea

    def _note(self, e: ev.Event) -> None:
        """What the CPU tier's cards say besides their own events: whose blocks a store copies, who
        was preempted, how far a lookup hit on the GPU."""
        ctx = self._ctx
        if isinstance(e, (ev.BlockAllocated, ev.PrefixCacheHit)) and e.device == "gpu":
            ctx.holders[e.block] = tuple(e.seq_ids)
            if isinstance(e, ev.PrefixCacheHit):
                for seq in e.seq_ids:
                    ctx.gpu_hits[seq] = ctx.gpu_hits.get(seq, 0) + 1
        elif isinstance(e, ev.RadixEvict):
            if ctx.evicts_done:
                ctx.evicts, ctx.evicts_done = [], False
            ctx.evicts.append((e, []))
        elif isinstance(e, ev.RadixNodeEvicted) and ctx.evicts:
            ctx.evicts[-1][1].append(e)
        elif isinstance(e, ev.BlockEvicted):
            ctx.evicts_done = True
        elif isinstance(e, ev.RequestAdded) and e.prompt_tokens_text:
            ctx.texts.update(zip(e.prompt_token_ids, e.prompt_tokens_text))
        elif isinstance(e, ev.TokenGenerated):
            ctx.texts[e.token_id] = e.text
        elif isinstance(e, ev.Preempted):
            ctx.preempted.update(e.seq_ids)
            for seq in e.seq_ids:
                ctx.gpu_hits.pop(seq, None)

    def settle(self) -> None:
        """The stream has ended: close the operation still open."""
        self.settled = True
        self._close()
        self._operations.close()

    def _close(self) -> None:
        """The open operation has ended: a card for the ideas it showed first."""
        pending, self._pending = self._pending, []
        if not self._new_idea:
            return
        self._new_idea = False
        ideas = []
        for k, (index, e, idea) in enumerate(pending):
            if idea is not None and idea not in self._seen:
                self._seen.add(idea)
                ideas.append((idea, index, [event for _, event, _ in pending[k:]]))
        card = _card(ideas, pending[-1][0] + 1, self.kv_manager, self._ctx)
        self.cards.append(card)
        self._positions.append(card.position)

    def counter(self, card: Card) -> str:
        """Which card this is, in words: "card 2 of 6" once the stream has ended (a replay) or while
        more may come in a live run of a story whose cards are `expected`, "card 2" otherwise. The
        one counter every front end shows."""
        number = self.cards.index(card) + 1
        total = len(self.cards) if self.settled else self.expected
        return f"card {number} of {total}" if total is not None and number <= total else f"card {number}"

    def stop_of(self, card: Card) -> int:
        """Where playback stops for `card`, counted from the timeline's front."""
        return card.position - self.offset

    @property
    def open_start(self) -> int | None:
        """Where the operation still being read starts, if it shows an idea first."""
        if not self._new_idea or not self._pending:
            return None
        return self._pending[0][0] - self.offset
    def next_stop(self, start: int, stop: int) -> int | None:
        """The first card position in (start, stop]."""
        index = bisect.bisect_right(self._positions, start + self.offset)
        if index < len(self._positions) and self._positions[index] <= stop + self.offset:
            return self._positions[index] - self.offset
        return None

    def spanning(self, position: int) -> Card | None:
        """The card whose idea is under way at `position` (past its first event, before its last)."""
        position += self.offset
        index = bisect.bisect_right(self._positions, position)
        if index < len(self.cards) and self.cards[index].start < position:
            return self.cards[index]
        return None

    def card_at(self, position: int) -> Card | None:
        """The card whose stop is `position`, if any."""
        index = bisect.bisect_left(self._positions, position + self.offset)
        if index < len(self._positions) and self._positions[index] == position + self.offset:
            return self.cards[index]
        return None

"""Why did a prefix lookup hit or miss? The prefix-cache explainer, from the event stream alone.

For each request, at the moment its prompt was allocated: its chain of blocks (nano-vllm's
compute_hash over the parent's hash and the block's tokens) against the cache as it was then, the
hit length in blocks and tokens, and for the first block that missed, the reason:
- "partial block": the prompt ends inside it, so it has no hash yet;
- "last prompt block": a full block the cache holds, but the prompt's last one, which is always
  computed so that the step has a token to sample from (the one-block floor);
- "evicted": an equal block was cached but evicted before this request came (the event is named);
- "different parent": the cache holds a block with these tokens, after a different prefix;
- "different tokens": nothing cached holds these tokens here;
- "not cached: the cache is empty": no block was cached when the lookup ran (the first request, or
  every earlier block freed uncached), so there was nothing to compare with;
- "window tail freed" (a model with KV-cache groups): every full-attention group holds the block,
  but a sliding-window group no longer caches one of the blocks just before it that the window of
  the next token reads (its last cdiv(sliding_window - 1, block_size) blocks), so the hit must end
  earlier: a prefix hit holds only as far as it holds in every group (vLLM
  HybridKVCacheCoordinator.find_longest_cache_hit, SlidingWindowManager.find_longest_cache_hit).
  The detail names the group and the block; the window slide that let the block go
  (blocks_skipped) and the event that evicted it afterwards are named each, when there was one.
Blocks after the first miss are not looked up (the engine stops at the first miss, as vLLM does),
unless vLLM's CPU tier serves them (`--kv-manager vllm --kv-offloading-size`): the blocks an
offload_load copies back from the tier are hits too, "hit from the CPU tier" (vLLM
SimpleCPUOffloadScheduler.get_num_new_matched_tokens looks up, after the GPU's hit, the blocks the CPU
pool holds), and the lookup's first miss is the first block neither holds.
Pure functions over events: no torch, no textual; `blockviz explain` prints them.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from blockviz.model.design import KV_DESIGNS, SLIDING_WINDOW, KVCacheGroup
from blockviz.model.narration import plural
from blockviz.model.palette import event_number, short_hash  # as every view shows them
from engine import events as ev
from engine.block_allocator import compute_block_hash
from engine.v1.kv_cache_utils import external_block_hash, get_hash_fn_by_name, hash_block_tokens
from engine.sglang_core.event_tap import page_name, prefix_hash
from blockviz.model.reducer import ReducerState

MAX_EVICTIONS_KEPT = 4096  # evictions remembered for "why missed" once a capped timeline drops its front
HIT = "hit"
CPU_HIT = "hit from the CPU tier"  # a block vLLM's CPU tier copied back (offload_load): counted as a hit
HITS = (HIT, CPU_HIT)
PARTIAL, LAST_BLOCK, EVICTED = "partial block", "last prompt block", "evicted"
DIFFERENT_PARENT, DIFFERENT_TOKENS = "different parent", "different tokens"
NOT_CACHED = "not cached: the cache is empty"
WINDOW_TAIL = "window tail freed"
AFTER_A_MISS, CACHING_OFF = "not looked up: after the first miss", "not looked up: prefix caching is off"


@dataclass(slots=True)
class BlockVerdict:
    """One logical block of a prompt: its tokens, hash, and hit (with the physical block) or why not."""

    index: int
    token_ids: tuple[int, ...]
    block_hash: int | None
    verdict: str  # HIT, CPU_HIT or one of the reasons above
    block: int | None = None  # the cached physical block it hit (a CPU block for CPU_HIT)
    evicted_by: int | None = None  # seq_no of the block_evicted event, for EVICTED (and WINDOW_TAIL, when one was)
    freed_by: int | None = None  # for WINDOW_TAIL: seq_no of the window slide (blocks_skipped) that let the block go
    detail: str = ""  # for WINDOW_TAIL: which group lost which block; for CPU_HIT: where the copy went


@dataclass(slots=True)
class Explanation:
    """A request's prefix lookup, block by block, as it happened."""

    request_id: str
    seq_id: int
    num_prompt_tokens: int
    block_size: int
    blocks: list[BlockVerdict] = field(default_factory=list)
    position: int = 0  # events up to and including its first allocation (Explainer)
    recomputed: bool = False  # the lookup of a request preempted by recompute, admitted again

    @property
    def num_hit_blocks(self) -> int:
        return sum(b.verdict in HITS for b in self.blocks)

    @property
    def num_cpu_hit_blocks(self) -> int:
        """The hits vLLM's CPU tier served (loaded back), the rest are the GPU's."""
        return sum(b.verdict == CPU_HIT for b in self.blocks)

    @property
    def num_hit_tokens(self) -> int:
        return self.num_hit_blocks * self.block_size

    @property
    def first_miss(self) -> BlockVerdict | None:
        return next((b for b in self.blocks if b.verdict not in HITS), None)

    def lines(self) -> list[str]:
        """The explanation as text, one line per block and a summary line."""
        what = "tokens again after a recompute preemption" if self.recomputed else "prompt tokens"
        out = [f"request {self.request_id} (seq {self.seq_id}): {self.num_prompt_tokens} {what}, "
               f"{plural(len(self.blocks), 'block')} of {self.block_size}"]
        for b in self.blocks:
            digest = f"#{short_hash(b.block_hash)}" if b.block_hash is not None else "(no hash)"
            what = f"hit: gpu block {b.block}" if b.verdict == HIT else b.verdict
            if b.detail:
                what += f": {b.detail}"
            if b.freed_by is not None:
                what += f" (window slide: blocks_skipped, event {event_number(b.freed_by)})"
            if b.evicted_by is not None:
                what += f" (block_evicted, event {event_number(b.evicted_by)})"
            out.append(f"  L{b.index} {digest:>9} {len(b.token_ids):>3} tokens  {what}")
        miss = self.first_miss
        reason = f"; first miss at L{miss.index}: {miss.verdict}" if miss is not None else ""
        cpu = f" ({self.num_cpu_hit_blocks} from the CPU tier)" if self.num_cpu_hit_blocks else ""
        out.append(f"  prefix hit: {plural(self.num_hit_blocks, 'block')}, {plural(self.num_hit_tokens, 'token')}"
                   f"{cpu}{reason}")
        return out

    def loaded_from_cpu(self, rows: dict[int, tuple[int, int]], state: ReducerState,
                        evicted_at: dict[int, int]) -> None:
        """vLLM's CPU tier copied blocks of this lookup back (an offload_load: logical index ->
        (cpu block, gpu block)): they are hits from the CPU tier, and the first block after them,
        which the lookup had not reached, gets the reason it missed in both (`state` the cache now)."""
        for row in self.blocks:
            if row.index in rows:
                cpu, gpu = rows[row.index]
                row.verdict, row.block, row.evicted_by = CPU_HIT, cpu, None
                row.detail = f"cpu block {cpu}, loaded into gpu block {gpu}"
        miss = self.first_miss
        if miss is None or miss.verdict != AFTER_A_MISS:
            return
        if len(miss.token_ids) < self.block_size:
            miss.verdict = PARTIAL
        elif miss.index == len(self.blocks) - 1 and (state.hash_map.get(miss.block_hash) is not None
                                                     or miss.block_hash in state.cpu_hash_map):
            miss.verdict = LAST_BLOCK
        else:
            miss.verdict, miss.evicted_by = _why_missed(miss.token_ids, miss.block_hash, None, state, evicted_at)


class Explainer:
    """Explains each request as its events arrive: `feed(event, state)` with the reducer state
    BEFORE the event is applied (the cache as the lookup saw it); `explained` grows in order of
    arrival, each with `position`, the number of events fed up to its allocation. With KV-cache
    groups (`kv_cache_groups`, the run header's), a lookup holds only as far as every group's does."""

    def __init__(self, enable_prefix_caching: bool = True, kv_manager: str = "v0", hash_algo: str = "sha256",
                 kv_cache_groups: tuple[KVCacheGroup, ...] = ()) -> None:
        self.caching = enable_prefix_caching
        self.design = KV_DESIGNS[kv_manager]
        self.kv_cache_groups = tuple(kv_cache_groups)
        self.hashes = (_radix_hashes if self.design.radix_tree
                       else _v1_hashes(hash_algo) if self.design.run_hash_algo else _v0_hashes)
        self.explained: list[Explanation] = []
        # seq_id -> (request id, the tokens it will look up, recomputed), until its first block is placed
        self._pending: dict[int, tuple[str, tuple[int, ...], bool]] = {}
        self._evicted_at: dict[int, int] = {}  # block_hash -> seq_no of its latest eviction (full attention)
        self._window_evicted_at: dict[tuple[int, int], int] = {}  # (block_hash, group) -> the same, in a window group
        self._window_freed_at: dict[tuple[int, int], int] = {}  # (block_hash, group) -> seq_no of the slide that freed it
        self._fed = 0

    def rebase(self, shift: int) -> None:
        """Count positions from `shift` events later (a capped timeline dropped them): the
        explanations of requests allocated before then, and evictions before its first kept
        event, are dropped."""
        self._fed = max(self._fed - shift, 0)
        self.explained = [e for e in self.explained if e.position > shift]
        for explanation in self.explained:
            explanation.position -= shift
        if len(self._evicted_at) > MAX_EVICTIONS_KEPT:
            newest = sorted(self._evicted_at.items(), key=lambda item: item[1])[-MAX_EVICTIONS_KEPT:]
            self._evicted_at = dict(newest)

    def feed(self, event: ev.Event, state: ReducerState) -> None:
        self._fed += 1
        if isinstance(event, ev.RequestAdded):  # every sequence: v1's n > 1 children look up one by one
            for seq_id in event.seq_ids:
                self._pending[seq_id] = (event.request_id, tuple(event.prompt_token_ids), False)
        elif isinstance(event, ev.Preempted) and event.mode != "swap":  # it will look up all its tokens again
            for seq_id in event.seq_ids:
                if (seq := state.seqs.get(seq_id)) is not None:
                    self._pending[seq_id] = (event.request_id, tuple(seq.token_ids), True)
        elif isinstance(event, (ev.BlockAllocated, ev.PrefixCacheHit)) and (event.logical_index == 0
                                                                             or self.kv_cache_groups):
            # a window group's hit may start past its null head: a hybrid run's first placement is the lookup's
            placed = [(seq_id, self._pending.pop(seq_id)) for seq_id in event.seq_ids if seq_id in self._pending]
            # a recomputed sequence looks up the tokens it has now: under async scheduling the token
            # in flight at its preemption is appended after it (vLLM's stale output)
            placed = [(seq_id, (request_id, tuple(state.seqs[seq_id].token_ids), True))
                      if recomputed and seq_id in state.seqs else (seq_id, (request_id, tokens, recomputed))
                      for seq_id, (request_id, tokens, recomputed) in placed]
            if placed and self.kv_cache_groups:
                seq_id, (request_id, tokens, recomputed) = placed[0]
                explanation = _explain_groups(request_id, tokens, seq_id, state, self._evicted_at,
                                              self._window_evicted_at, self.caching, self.hashes,
                                              self._window_freed_at)
                explanation.position, explanation.recomputed = self._fed, recomputed
                self.explained.append(explanation)
            elif placed:  # sequences placed together share one lookup (v0's n > 1 before a fork)
                seq_id, (request_id, tokens, recomputed) = placed[0]
                explanation = _explain(request_id, tokens, seq_id, state, self._evicted_at, self.caching,
                                       self.hashes, collision_guard=self.design.hash_collision_guard)
                explanation.position, explanation.recomputed = self._fed, recomputed
                self.explained.append(explanation)
        elif isinstance(event, ev.OffloadLoaded):
            self._loaded_from_cpu(event, state)
        elif isinstance(event, ev.BlocksSkipped):  # a window slide: the blocks it lets go, by hash
            for number in event.blocks:
                block_hash = state.pools["gpu"][number].block_hash
                if block_hash is not None:
                    self._window_freed_at[(block_hash, event.group)] = event.seq_no
        elif isinstance(event, ev.BlockEvicted) and self._is_window(event.group):
            self._window_evicted_at[(event.block_hash, event.group)] = event.seq_no
        elif isinstance(event, ev.BlockEvicted):
            self._evicted_at[event.block_hash] = event.seq_no

    def _loaded_from_cpu(self, event: ev.OffloadLoaded, state: ReducerState) -> None:
        """The request's latest lookup (made at its first placement, in the same admission): the
        blocks the load fills, found in its table, are hits from the CPU tier."""
        explanation = next((x for x in reversed(self.explained) if x.seq_id == event.seq_id), None)
        table = state.tables.get(event.seq_id, [])
        rows = {table.index(("gpu", gpu)): (cpu, gpu) for cpu, gpu in event.mapping if ("gpu", gpu) in table}
        if explanation is not None and rows:
            explanation.loaded_from_cpu(rows, state, self._evicted_at)

    def _is_window(self, group: int) -> bool:
        return group < len(self.kv_cache_groups) and self.kv_cache_groups[group].kind == SLIDING_WINDOW


def explain_requests(events, block_size: int, num_gpu_blocks: int, num_cpu_blocks: int,
                     enable_prefix_caching: bool = True, kv_manager: str = "v0",
                     hash_algo: str = "sha256", kv_cache_groups: tuple[KVCacheGroup, ...] = ()) -> list[Explanation]:
    """An Explanation per request, at its prompt's first allocation, in order of arrival."""
    state = ReducerState.from_header({"block_size": block_size, "num_gpu_blocks": num_gpu_blocks,
                                      "num_cpu_blocks": num_cpu_blocks, "kv_manager": kv_manager,
                                      "kv_cache_groups": kv_cache_groups})
    explainer = Explainer(enable_prefix_caching, kv_manager, hash_algo, kv_cache_groups)
    for event in events:
        explainer.feed(event, state)
        state.apply(event)
    return explainer.explained


def _v0_hashes(chunks: list[tuple[int, ...]], size: int) -> list[int | None]:
    """Each full block's hash as v0's BlockSpaceManager chains it (engine.block_allocator)."""
    out, parent = [], None
    for chunk in chunks:
        parent = compute_block_hash(chunk, parent) if len(chunk) == size else None
        out.append(parent)
    return out


def _v1_hashes(hash_algo: str):
    """Each full block's hash as vLLM v1 chains it (hash_block_tokens with the run's algorithm),
    as its events carry it (external_block_hash)."""
    hash_fn = get_hash_fn_by_name(hash_algo)

    def hashes(chunks: list[tuple[int, ...]], size: int) -> list[int | None]:
        out, parent = [], None
        for chunk in chunks:
            if len(chunk) < size:
                out.append(None)
                continue
            parent = hash_block_tokens(hash_fn, parent, chunk)
            out.append(external_block_hash(parent))
        return out

    return hashes


def _radix_hashes(chunks: list[tuple[int, ...]], size: int) -> list[int | None]:
    """Each full page's hash as the SGLang adapter names it (engine/sglang_core/event_tap.py:
    SGLang keys pages by their tokens; the events name each page by a digest of its whole prefix)."""
    out, digest = [], b""
    for chunk in chunks:
        if len(chunk) < size:
            out.append(None)
            continue
        digest = prefix_hash(digest, chunk)
        out.append(page_name(digest))
    return out


def _explain(request_id: str, tokens: tuple[int, ...], seq_id: int, state: ReducerState,
             evicted_at: dict[int, int], caching: bool, hashes=_v0_hashes, collision_guard: bool = True) -> Explanation:
    """The lookup as the engine makes it (v0's BlockSpaceManager.allocate, v1's
    KVCacheManager.get_computed_blocks), against the cache now. Both leave the prompt's last block
    to be computed (v1: a hit covers at most num_tokens - 1 tokens); v0 also compares a hit's tokens
    (its collision guard), v1 trusts the hash."""
    size = state.block_size
    chunks = [tuple(tokens[i:i + size]) for i in range(0, len(tokens), size)]
    explanation = Explanation(request_id, seq_id, len(tokens), size)
    looking = caching
    for index, (chunk, block_hash) in enumerate(zip(chunks, hashes(chunks, size))):
        full = len(chunk) == size
        verdict, block, evicted_by = HIT, None, None
        if not looking:
            verdict = AFTER_A_MISS if caching else CACHING_OFF
        elif not full:
            verdict = PARTIAL
        else:
            block = state.hash_map.get(block_hash)
            if collision_guard and block is not None and state.pools["gpu"][block].token_ids != chunk:
                block = None  # a hash collision is a miss
            if block is None or index == len(chunks) - 1:
                verdict, evicted_by = _why_missed(chunk, block_hash, block, state, evicted_at)
                block = None
        if verdict != HIT:
            looking = False
        explanation.blocks.append(BlockVerdict(index, chunk, block_hash, verdict, block, evicted_by))
    return explanation


def _why_missed(chunk, block_hash: int, cached: int | None, state: ReducerState, evicted_at: dict[int, int]):
    if cached is not None:
        return LAST_BLOCK, None
    if block_hash in evicted_at:
        return EVICTED, evicted_at[block_hash]
    if not state.hash_map:
        return NOT_CACHED, None
    if any(state.pools["gpu"][number].token_ids == chunk for number in state.hash_map.values()):
        return DIFFERENT_PARENT, None
    return DIFFERENT_TOKENS, None


def _explain_groups(request_id: str, tokens: tuple[int, ...], seq_id: int, state: ReducerState,
                    evicted_at: dict[int, int], window_evicted_at: dict[tuple[int, int], int], caching: bool,
                    hashes, window_freed_at: dict[tuple[int, int], int] | None = None) -> Explanation:
    """The lookup of a run with KV-cache groups (vLLM v1 get_computed_blocks through
    HybridKVCacheCoordinator): the hit is the longest prefix of at most num_tokens - 1 tokens that
    every group accepts (hybrid_hit_blocks). Its first missing block is a window-tail miss when
    every full-attention group holds it (a model of windows only: every group), and the prompt goes
    on past it; else the reasons of a single group's lookup, in the full-attention groups."""
    size = state.block_size
    chunks = [tuple(tokens[i:i + size]) for i in range(0, len(tokens), size)]
    block_hashes = hashes(chunks, size)
    groups = state.kv_cache_groups
    full = [g for g, group in enumerate(groups) if group.kind != SLIDING_WINDOW]
    shown = full[0] if full else 0  # the group whose block a hit row names
    max_blocks = (len(tokens) - 1) // size
    num_hit = hybrid_hit_blocks(block_hashes, max_blocks, state) if caching else 0
    explanation = Explanation(request_id, seq_id, len(tokens), size)
    for index, (chunk, block_hash) in enumerate(zip(chunks, block_hashes)):
        row = BlockVerdict(index, chunk, block_hash, HIT)
        if index < num_hit:
            row.block = state.cached_block(block_hash, shown)
        elif not caching:
            row.verdict = CACHING_OFF
        elif index > num_hit:
            row.verdict = AFTER_A_MISS
        elif len(chunk) < size:
            row.verdict = PARTIAL
        elif any(state.cached_block(block_hash, g) is None for g in full or range(len(groups))):
            cached = state.cached_block(block_hash, shown)
            evictions = evicted_at if full else {h: at for (h, _), at in window_evicted_at.items()}
            row.verdict, row.evicted_by = _why_missed(chunk, block_hash, cached, state, evictions)
        elif index >= max_blocks:
            row.verdict = LAST_BLOCK
        else:
            row.verdict = WINDOW_TAIL
            row.detail, row.evicted_by, row.freed_by = _window_tail(block_hashes, index + 1, state, window_evicted_at,
                                                                    window_freed_at or {})
        explanation.blocks.append(row)
    return explanation


def hybrid_hit_blocks(block_hashes: list[int | None], max_blocks: int, state: ReducerState) -> int:
    """How many leading blocks a lookup serves in every KV-cache group of `state`, as vLLM's
    HybridKVCacheCoordinator.find_longest_cache_hit finds them: groups of one spec looked up
    together, full attention first (its hit from the left bounds the windows'), each window group
    then keeping the longest prefix that ends in cdiv(sliding_window - 1, block_size) blocks it
    caches (SlidingWindowManager.find_longest_cache_hit), until no group shortens it."""
    specs: dict[tuple[str, int | None], list[int]] = {}
    for g, group in enumerate(state.kv_cache_groups):
        specs.setdefault((group.kind, group.sliding_window), []).append(g)
    ordered = sorted(specs.items(), key=lambda item: item[0][0] == SLIDING_WINDOW)
    length = max_blocks
    while True:
        current = length
        for (kind, window), group_ids in ordered:
            current = _group_hit_blocks(block_hashes, current, group_ids, window if kind == SLIDING_WINDOW else None,
                                        state)
        if current >= length:
            return length
        length = current


def _group_hit_blocks(block_hashes, max_blocks: int, group_ids: list[int], window: int | None,
                      state: ReducerState) -> int:
    def cached(index: int) -> bool:
        block_hash = block_hashes[index]
        return block_hash is not None and all(state.cached_block(block_hash, g) is not None for g in group_ids)

    if window is None:  # full attention: from the left, to the first miss
        return next((i for i in range(max_blocks) if not cached(i)), max_blocks)
    needed = -(-(window - 1) // state.block_size)
    run = 0
    for index in range(max_blocks - 1, -1, -1):
        if not cached(index):
            run = 0
            continue
        run += 1
        if run >= needed:
            return index + run
    return run


def _window_tail(block_hashes, end: int, state: ReducerState, window_evicted_at: dict[tuple[int, int], int],
                 window_freed_at: dict[tuple[int, int], int]) -> tuple[str, int | None, int | None]:
    """Which window group misses which of the blocks a hit ending at block `end` needs (the last
    one it lacks), the event that evicted it there if one did, and the window slide (blocks_skipped)
    that freed it if one did."""
    for g, group in enumerate(state.kv_cache_groups):
        if group.kind != SLIDING_WINDOW:
            continue
        needed = -(-(group.sliding_window - 1) // state.block_size)
        for index in range(end - 1, max(end - needed, 0) - 1, -1):
            block_hash = block_hashes[index]
            if state.cached_block(block_hash, g) is None:
                return (f"group {g} (window {group.sliding_window}) no longer caches L{index}; a hit ending after "
                        f"L{end - 1} needs its last {plural(needed, 'block')} there",
                        window_evicted_at.get((block_hash, g)), window_freed_at.get((block_hash, g)))
    return "", None, None

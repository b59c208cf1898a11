"""Check a trace's events against the state they are applied to, before any view draws them.

A trace file can parse and still not make sense: a line dropped or moved, a field retyped, a block
freed that its sequence never held. `TraceChecker.check(event)` raises ValueError naming the first
thing wrong with an event, given the picture of memory the earlier events built (a ReducerState,
the same one the views draw), then applies it. The rules are the block manager's own: a block is
allocated only when free, a ref count moves by one per reference, a sequence appends into its own
table, a hit names a registered hash, an eviction a free-but-cached block. With KV-cache groups
(the header's "kv_cache_groups"), every block event names a group the run has, a block stays in
the group that took it, a sequence places blocks in that group's own table, a hit names the block a
lookup in its group returns, and only a sliding-window group puts the null block in a table (after
a prefix hit's skipped head, or BlocksSkipped in the slots of blocks it still held).

A trace may come from anyone, so the checks also keep what it can ask of the reader in proportion
to the file: every integer is a non-negative 64-bit value (a token id below the vocabulary's
size), a block belongs only to sequences a request added, a request has at most
MAX_SEQS_PER_REQUEST sequences, and the tokens the reducer copies into sequences (a prompt per
sequence, a parent's tokens per fork) stay within MIN_SEQ_TOKENS plus one per byte of the file.

No torch, no textual: blockviz/model/trace.py calls it on every event it reads.
"""

from __future__ import annotations

import math

from engine import events as ev
from blockviz.model.reducer import CACHED, FREE, NULL, OFFLOAD_PIN, USED, ReducerState
from blockviz.model.design import KV_DESIGNS, KVCacheGroup
from engine.vllm_core.offload import MEDIUM_CPU

MAX_ID = (1 << 63) - 1  # ids, counts, positions: a signed 64-bit integer's range, without negatives
MAX_HASH = (1 << 64) - 1  # block hashes are unsigned 64-bit (xxh64)
MAX_TOKEN_ID = (1 << 31) - 1  # when the header gives no vocab_size
MAX_SEQS_PER_REQUEST = 1 << 12
MIN_SEQ_TOKENS = 1 << 22  # tokens copied into sequences that any trace may ask for (limits, not measurements)
TOKEN_FIELDS = ("token_id", "token_ids", "prompt_token_ids")
HASH_FIELDS = ("block_hash", "parent_hash", "block_hashes", "parent_hashes")


class TraceChecker:
    """Checks events one by one against a ReducerState built from the events before them.

    `vocab_size` (from the trace header, when it gives one) bounds token ids; `file_bytes`, the
    trace file's size, bounds the tokens copied into sequences; `kv_manager` (the header's, "v0"
    when absent) is the design whose rules apply (in v1 block 0 is the null block)."""

    def __init__(self, block_size: int, num_gpu_blocks: int, num_cpu_blocks: int, *,
                 vocab_size: int | None = None, file_bytes: int | None = None, kv_manager: str = "v0",
                 kv_cache_groups: tuple[KVCacheGroup, ...] = ()) -> None:
        design = KV_DESIGNS.get(kv_manager)
        if design is None:
            raise ValueError(f"header field 'kv_manager' must be one of {', '.join(map(repr, KV_DESIGNS))}, "
                             f"got {kv_manager!r}")
        if design.null_block and num_gpu_blocks < 2:
            raise ValueError("a v1 pool has at least 2 blocks (block 0 is the null block)")
        if kv_cache_groups and not design.groups:
            raise ValueError("header field 'kv_cache_groups' is for a v1 run (kv_manager \"v1\"): v0 has one group")
        self.state = ReducerState.from_header({"block_size": block_size, "num_gpu_blocks": num_gpu_blocks,
                                                "num_cpu_blocks": num_cpu_blocks, "kv_manager": kv_manager,
                                                "kv_cache_groups": kv_cache_groups})
        self.last_seq_no: int | None = None
        self.limits = {**dict.fromkeys(TOKEN_FIELDS, vocab_size - 1 if vocab_size else MAX_TOKEN_ID),
                       **dict.fromkeys(HASH_FIELDS, MAX_HASH)}
        self.max_seq_tokens = MIN_SEQ_TOKENS + (file_bytes or 0)
        self.num_seq_tokens = 0
        self.swapped: set[tuple[str, int]] = set()  # blocks the last swap filled, each hashed again once at most

    def check(self, event: ev.Event) -> None:
        """Raise ValueError saying what is wrong with `event` here; else apply it. (Field types are
        checked when the event is decoded: engine.events.event_from_dict.)"""
        if self.last_seq_no is not None and event.seq_no != self.last_seq_no + 1:
            raise ValueError(f"event number {event.seq_no} does not follow {self.last_seq_no} "
                             f"(events are numbered 0, 1, 2, ...: a line is missing, repeated or moved)")
        pools = self.state.pools
        for device in {getattr(event, "device", "gpu"), "gpu"}:
            if device not in pools:
                raise ValueError(f"unknown device {device!r}")
        if not isinstance(event, (ev.BlockHashed, ev.SwappedIn, ev.SwappedOut)):
            self.swapped.clear()
        if getattr(event, "group", 0):
            self._group(event.group)
        rule = _RULES.get(type(event))
        if rule is not None:
            rule(self, event)
        self._in_range(event)
        self.state.apply(event)
        self.last_seq_no = event.seq_no

    # ------------------------------------------------------------------ helpers

    def _in_range(self, event: ev.Event) -> None:
        """Every integer field (and every integer in a tuple field) within 0..its limit; a float
        finite and non-negative."""
        for name in event.__struct_fields__:
            value = getattr(event, name)
            if isinstance(value, tuple):
                if value and isinstance(value[0], tuple):
                    value = [number for pair in value for number in pair]
                value = [number for number in value if number is not None]  # a root block's parent_hashes
                if not value or not isinstance(value[0], int):
                    continue
                low, high = min(value), max(value)
            elif isinstance(value, float):
                if not math.isfinite(value) or value < 0:
                    raise ValueError(f"{name} {value} is not a finite, non-negative number")
                continue
            elif isinstance(value, int):
                low = high = value
            else:
                continue
            limit = self.limits.get(name, MAX_ID)
            if name == "seq_id" and low == OFFLOAD_PIN and isinstance(event, ev.BlockFreed):
                continue  # vLLM's CPU tier releasing a pin (checked in _freed)
            if low < 0 or high > limit:
                what = "token id" if name in TOKEN_FIELDS else name
                bad = low if low < 0 else high
                raise ValueError(f"{what} {bad} is outside 0..{limit}"
                                 + (" (the vocabulary)" if name in TOKEN_FIELDS else ""))

    def _copy_tokens(self, count: int, what: str) -> None:
        """Count `count` more tokens copied into sequences; past the budget, refuse."""
        self.num_seq_tokens += count
        if self.num_seq_tokens > self.max_seq_tokens:
            raise ValueError(f"{what} takes the sequences past {self.max_seq_tokens} tokens, "
                             "more than a trace of this size may hold")

    def _block(self, device: str, number: int, what: str = "block"):
        pool = self.state.pools[device]
        if not 0 <= number < len(pool):
            raise ValueError(f"{what} {number} is outside the {device} pool of {len(pool)} blocks")
        if pool[number].state == NULL:
            raise ValueError(f"{what} {number} is the null block, which is never allocated, freed or hashed")
        return pool[number]

    def _group(self, group: int) -> None:
        num_groups = self.state.num_kv_cache_groups if self.state.kv_cache_groups else 1
        if not 0 <= group < num_groups:
            raise ValueError(f"group {group} is outside the run's {num_groups} KV-cache group(s)")

    def _same_group(self, block, group: int) -> None:
        """A block in use or cached stays in the group that took it."""
        if block.state != FREE and block.group != group:
            raise ValueError(f"{block.device} block {block.number} is in group {block.group}, not group {group}")

    def _table(self, seq_id: int, group: int = 0) -> list[tuple[str, int]]:
        table = self.state.tables_of(group).get(seq_id)
        if table is None:
            raise ValueError(f"seq {seq_id} has no block table here" + (f" in group {group}" if group else ""))
        return table

    def _logical(self, seq_id: int, index: int, group: int = 0) -> tuple[str, int]:
        table = self._table(seq_id, group)
        if not 0 <= index < len(table):
            raise ValueError(f"logical index {index} is outside seq {seq_id}'s table of {len(table)} blocks")
        return table[index]

    def _next_index(self, seq_ids, index: int, group: int = 0, skips: bool = False) -> None:
        """A block joins the end of each table, and only once the block before it is full; with
        `skips` (a sliding window's prefix hit) it may leave the null block in the slots before it."""
        for seq_id in seq_ids:
            table = self.state.tables_of(group).get(seq_id, ())
            if index < len(table) and self._let_go(seq_id, table[index]):
                continue
            if index != len(table) and not (skips and index > len(table)):
                raise ValueError(f"logical index {index} for seq {seq_id}, whose table has {len(table)} blocks")
            if table and index == len(table) and table[-1] != ("gpu", 0):  # a slot a window let go: empty
                last = self.state.pools[table[-1][0]][table[-1][1]]
                if len(last.token_ids) != self.state.block_size:
                    raise ValueError(f"seq {seq_id} gets logical block {index} while block {last.number} "
                                     f"holds {len(last.token_ids)} of {self.state.block_size} tokens")

    def _fits(self, token_ids, what: str) -> None:
        if len(token_ids) > self.state.block_size:
            raise ValueError(f"{what} holds {len(token_ids)} tokens, more than the block size {self.state.block_size}")

    # ------------------------------------------------------------------ rules, one per event kind

    def _radix(self, e: ev.Event) -> None:
        """A radix-tree event: the run's design keeps SGLang's tree; the node it names exists (an
        insert's or a split's new node does not, yet); an insert's parent exists; a run's slots are
        the pool's (page 0 is the padding page) and as many as its tokens; a split leaves tokens
        on both sides."""
        if not self.state.design.radix_tree:
            raise ValueError(f"a {e.type} event in a run of kv_manager {self.state.kv_manager!r}, which has no radix tree")
        nodes = self.state.radix_nodes
        new = e.node_id if isinstance(e, ev.RadixNodeInserted) else getattr(e, "new_node_id", None)
        if new is not None and new in nodes:
            raise ValueError(f"radix node {new} is already in the tree")
        if not isinstance(e, ev.RadixNodeInserted) and e.node_id not in nodes:
            raise ValueError(f"radix node {e.node_id} is not in the tree")
        if isinstance(e, ev.RadixNodeInserted):
            if e.parent_id is not None and e.parent_id not in nodes:
                raise ValueError(f"radix node {e.node_id}'s parent {e.parent_id} is not in the tree")
            num_slots = self.state.block_size * len(self.state.pools["gpu"])
            if len(e.slots) != len(e.token_ids) or not e.slots or not all(
                    self.state.block_size <= slot < num_slots for slot in e.slots):
                raise ValueError(f"radix node {e.node_id} holds {len(e.token_ids)} tokens in slots outside "
                                 f"{self.state.block_size}..{num_slots - 1} or not one each")
            self._copy_tokens(len(e.token_ids), f"radix node {e.node_id}")
        if isinstance(e, ev.RadixNodeSplit) and not 0 < e.num_tokens < len(nodes[e.node_id].token_ids):
            raise ValueError(f"radix node {e.node_id} of {len(nodes[e.node_id].token_ids)} tokens split at {e.num_tokens}")

    def _radix_evict(self, e: ev.RadixEvict) -> None:
        """A call of SGLang's RadixCache.evict: only in a run whose design keeps the tree."""
        if not self.state.design.radix_tree:
            raise ValueError(f"a {e.type} event in a run of kv_manager {self.state.kv_manager!r}, which has no radix tree")

    def _let_go(self, seq_id: int, entry: tuple[str, int]) -> bool:
        """Whether a radix-tree design's sequence let the block at this place of its table go just
        before: SGLang's RadixCache.insert points a request's row at the tree's copy of a prefix
        another request published first, and frees the request's own (the event places the copy)."""
        device, number = entry
        return self.state.design.radix_tree and seq_id not in self.state.pools[device][number].owners

    def _allocated(self, e: ev.BlockAllocated) -> None:
        self._known_seqs(e)
        block = self._block(e.device, e.block)
        if block.state != FREE:
            raise ValueError(f"{e.device} block {e.block} is allocated while {block.state}")
        if e.ref_count != len(e.seq_ids) or not e.seq_ids:
            raise ValueError(f"ref count {e.ref_count} for {len(e.seq_ids)} sequence(s)")
        self._next_index(e.seq_ids, e.logical_index, e.group)
        self._fits(e.token_ids, "the block")

    def _hit(self, e: ev.PrefixCacheHit) -> None:
        self._known_seqs(e)
        block = self._block(e.device, e.block)
        if self.state.cached_block(e.block_hash, e.group) != e.block or block.state == FREE:
            raise ValueError(f"prefix-cache hit on {e.device} block {e.block}, which does not hold hash {e.block_hash}"
                             + (f" in group {e.group}" if self.state.kv_cache_groups else ""))
        if e.ref_count != block.ref_count + len(e.seq_ids):
            raise ValueError(f"ref count {e.ref_count} after a hit on block {e.block} with ref count {block.ref_count}")
        self._next_index(e.seq_ids, e.logical_index, e.group, skips=self.state.is_window_group(e.group))

    def _hashed(self, e: ev.BlockHashed) -> None:
        block = self._block(e.device, e.block)
        if block.state != USED or len(block.token_ids) != self.state.block_size:
            raise ValueError(f"{e.device} block {e.block} is hashed while not a full block in use")
        self._same_group(block, e.group)
        if e.parent_hash == e.block_hash:
            raise ValueError(f"hash {e.block_hash} is its own parent")
        # a block is hashed once; right after a swap, v0 registers each block it filled with its
        # hash again (BlockSpaceManager._swap: the same hash, no parent, the chain came with it)
        again = (e.device, e.block) in self.swapped and e.parent_hash is None and e.block_hash == block.block_hash
        if block.block_hash is not None and not again:
            raise ValueError(f"{e.device} block {e.block} is hashed again (it holds hash {block.block_hash})")
        self.swapped.discard((e.device, e.block))

    def _slot(self, e: ev.SlotAppended) -> None:
        group = self._block(e.device, e.block).group  # a slot in each group's block: the block says which
        if self._logical(e.seq_id, e.logical_index, group) != (e.device, e.block):
            raise ValueError(f"seq {e.seq_id}'s logical block {e.logical_index} is not {e.device} block {e.block}")
        filled = len(self._block(e.device, e.block).token_ids)
        if e.offset != filled:
            raise ValueError(f"offset {e.offset} in block {e.block}, which holds {filled} tokens")
        if not 0 <= e.offset < self.state.block_size:
            raise ValueError(f"offset {e.offset} is outside a block of {self.state.block_size} slots")

    def _cow(self, e: ev.CopyOnWrite) -> None:
        if self._logical(e.seq_id, e.logical_index) != (e.device, e.src_block):
            raise ValueError(f"seq {e.seq_id}'s logical block {e.logical_index} is not block {e.src_block}")
        src, dst = self._block(e.device, e.src_block), self._block(e.device, e.dst_block, "dst_block")
        if dst.state != FREE:
            raise ValueError(f"copy-on-write into {e.device} block {e.dst_block}, which is {dst.state}")
        if src.ref_count < 2 or e.src_ref_count != src.ref_count - 1:
            raise ValueError(f"copy-on-write of block {e.src_block} with ref count {src.ref_count} "
                             f"leaves ref count {e.src_ref_count}")
        self._fits(e.token_ids, "the copy")

    def _fork(self, e: ev.Forked) -> None:
        table = self._table(e.parent_seq_id)
        if e.child_seq_id in self.state.tables:
            raise ValueError(f"seq {e.child_seq_id} already has a block table")
        if e.child_seq_id in self.state.seqs:
            raise ValueError(f"seq {e.child_seq_id} is added twice")
        parent = self.state.seqs.get(e.parent_seq_id)
        if parent is None:
            raise ValueError(f"seq {e.parent_seq_id} was never added")
        if len(self.state.requests.get(parent.request_id, ())) >= MAX_SEQS_PER_REQUEST:
            raise ValueError(f"request {parent.request_id!r} gets more than {MAX_SEQS_PER_REQUEST} sequences")
        self._copy_tokens(len(parent.token_ids), f"forking seq {e.parent_seq_id}")
        if tuple(number for _, number in table) != tuple(e.blocks):
            raise ValueError(f"fork lists blocks {list(e.blocks)}, seq {e.parent_seq_id} holds "
                             f"{[n for _, n in table]}")

    def _swap(self, e, src: str, dst: str) -> None:
        """Every block of the moved tables is mapped; a destination is free, or one `revived` lists
        (found by hash): holding the hash and tokens of each block mapped to it, in the hash map."""
        mapping = dict(e.mapping)
        for seq_id in e.seq_ids:
            for device, number in self._table(seq_id):
                if device != src or number not in mapping:
                    raise ValueError(f"seq {seq_id}'s {device} block {number} is not in the {e.type} mapping")
        revived = set(e.revived)
        if len(revived) != len(e.revived) or not revived <= set(mapping.values()):
            raise ValueError(f"{e.type} revives a {dst} block twice, or one it does not map to")
        hash_map = self.state.cpu_hash_map if dst == "cpu" else self.state.hash_map
        for number in mapping:
            self._block(src, number, f"{src} block")
        for src_number, number in mapping.items():
            block = self._block(dst, number, f"{dst} block")
            if number not in revived:
                if block.state != FREE:
                    raise ValueError(f"{e.type} into {dst} block {number}, which is not free")
                continue
            source = self.state.pools[src][src_number]
            if (block.state == FREE or source.block_hash is None or hash_map.get(source.block_hash) != number
                    or block.token_ids != source.token_ids):
                raise ValueError(f"{e.type} revives {dst} block {number}, which does not hold {src} block "
                                 f"{src_number}'s hash and tokens")
        self.swapped = {(dst, number) for number in mapping.values() if number not in revived}

    def _freed(self, e: ev.BlockFreed) -> None:
        block = self._block(e.device, e.block)
        if e.seq_id == OFFLOAD_PIN and block.state == USED and block.ref_count > len(block.owners):
            pass  # vLLM's CPU tier lets go of a block it pinned for a copy (an offload store or load)
        elif block.state != USED or e.seq_id not in block.owners:
            raise ValueError(f"seq {e.seq_id} frees {e.device} block {e.block}, which it does not hold")
        self._same_group(block, e.group)
        if e.ref_count != block.ref_count - 1:
            raise ValueError(f"ref count {e.ref_count} after freeing block {e.block} with ref count {block.ref_count}")

    def _evicted(self, e: ev.BlockEvicted) -> None:
        block = self._block(e.device, e.block)
        if block.state != CACHED or block.block_hash != e.block_hash:
            raise ValueError(f"eviction of {e.device} block {e.block}, which is not free-but-cached with that hash")
        self._same_group(block, e.group)

    def _skipped(self, e: ev.BlocksSkipped) -> None:
        """Only a sliding-window group lets blocks go mid-request, each one its table holds, in use."""
        self._known_seqs(e)
        if not self.state.is_window_group(e.group):
            raise ValueError(f"blocks_skipped in group {e.group}, which is not a sliding-window group")
        if len(e.logical_indices) != len(e.blocks) or not e.blocks:
            raise ValueError("blocks_skipped lists differ in length, or are empty")
        if len(set(e.blocks)) != len(e.blocks) or len(set(e.logical_indices)) != len(e.logical_indices):
            raise ValueError("blocks_skipped lists a block or a logical index twice")
        for index, number in zip(e.logical_indices, e.blocks):
            if self._logical(e.seq_id, index, e.group) != ("gpu", number) or self._block("gpu", number).state != USED:
                raise ValueError(f"seq {e.seq_id}'s logical block {index} in group {e.group} is not gpu block {number}")
        # the window the header names: only a block wholly before the last `window` tokens goes
        # (vLLM SlidingWindowManager.get_num_skipped_tokens: num_computed_tokens - window + 1)
        window = self.state.kv_cache_groups[e.group].sliding_window
        seq = self.state.seqs[e.seq_id]
        num_skippable = max(0, len(seq.token_ids) - window + 1) // self.state.block_size
        if max(e.logical_indices) >= num_skippable:
            raise ValueError(f"blocks_skipped lets logical block {max(e.logical_indices)} of seq {e.seq_id} go, "
                             f"which the header's window of {window} tokens still reads")

    def _offload(self, e) -> None:
        """Offload events come only from vLLM's CPU tier: the vllm design with a CPU pool, its medium."""
        if not (self.state.design.cpu_tier and len(self.state.pools["cpu"])):
            raise ValueError(f"{e.type} in a {self.state.design.name} run without a CPU tier "
                             "(only kv_manager \"vllm\" with --kv-offloading-size offloads)")
        if e.medium != MEDIUM_CPU:
            raise ValueError(f"{e.type} medium {_cut(e.medium)!r} is not the CPU tier's {MEDIUM_CPU!r}")
        if not e.mapping:
            raise ValueError(f"{e.type} maps no blocks")

    def _offload_store(self, e: ev.OffloadStored) -> None:
        self._offload(e)
        if not len(e.mapping) == len(e.block_hashes) == len(e.parent_hashes) == len(e.token_ids):
            raise ValueError("offload_store lists differ in length")
        for (gpu_number, cpu_number), block_hash, token_ids in zip(e.mapping, e.block_hashes, e.token_ids):
            src = self._block("gpu", gpu_number, "gpu block")
            if src.state != USED or src.block_hash != block_hash:
                raise ValueError(f"offload store of gpu block {gpu_number}, which is not a block in use with "
                                 f"hash {block_hash}")
            if self._block("cpu", cpu_number, "cpu block").state != FREE:
                raise ValueError(f"offload store into cpu block {cpu_number}, which is not free")
            self._fits(token_ids, "the stored block")

    def _offload_load(self, e: ev.OffloadLoaded) -> None:
        self._offload(e)
        self._known_seqs(e)
        request_id = self.state.seqs[e.seq_id].request_id
        if e.request_id != request_id:
            raise ValueError(f"offload_load names request {_cut(e.request_id)!r} for seq {e.seq_id}, "
                             f"which is request {_cut(request_id)!r}'s")
        if not 1 <= e.num_tokens <= len(e.mapping) * self.state.block_size:
            raise ValueError(f"offload_load brings back {e.num_tokens} tokens in {len(e.mapping)} blocks of "
                             f"{self.state.block_size} slots")
        table = self._table(e.seq_id)
        for cpu_number, gpu_number in e.mapping:
            if self._block("cpu", cpu_number, "cpu block").state != CACHED:
                raise ValueError(f"offload load from cpu block {cpu_number}, which holds no cached copy")
            if ("gpu", gpu_number) not in table:
                raise ValueError(f"offload load into gpu block {gpu_number}, which seq {e.seq_id} does not hold")

    def _seq_freed(self, e: ev.SequenceFreed) -> None:
        tables = [t for t in self.state.seq_tables(e.seq_id) if t] or [self._table(e.seq_id)]
        for device, number in (entry for table in tables for entry in table):  # a look at each, not the pools
            if e.seq_id in self.state.pools[device][number].owners:
                raise ValueError(f"seq {e.seq_id}'s table is freed while it still holds {device} block {number}")

    def _finished(self, e: ev.SequenceFinished) -> None:
        self._known_seqs(e)
        if any(e.seq_id in self.state.tables_of(g) for g in range(self.state.num_kv_cache_groups)):
            raise ValueError(f"seq {e.seq_id} finishes while it still holds a block table")

    def _request(self, e: ev.RequestAdded) -> None:
        if e.request_id in self.state.requests:
            raise ValueError(f"request {e.request_id!r} is added twice")
        if not 1 <= len(e.seq_ids) <= MAX_SEQS_PER_REQUEST:
            raise ValueError(f"a request with {len(e.seq_ids)} sequences (1..{MAX_SEQS_PER_REQUEST})")
        if len(set(e.seq_ids)) != len(e.seq_ids):
            raise ValueError("a sequence is listed twice in the request")
        for seq_id in e.seq_ids:
            if seq_id in self.state.seqs:
                raise ValueError(f"seq {seq_id} is added twice")
        if e.prompt_tokens_text and len(e.prompt_tokens_text) != len(e.prompt_token_ids):  # none: an engine's own stream
            raise ValueError(f"{len(e.prompt_tokens_text)} token texts for {len(e.prompt_token_ids)} prompt tokens")
        self._copy_tokens(len(e.prompt_token_ids) * len(e.seq_ids), f"request {e.request_id!r}")

    def _scheduled(self, e: ev.TokensScheduled) -> None:
        self._known_seqs(e)
        counts = (e.num_computed_tokens, e.num_new_tokens, e.num_tokens)
        if any(len(c) != len(e.seq_ids) for c in counts):
            raise ValueError("tokens_scheduled lists differ in length")
        for seq_id, done, new, total in zip(e.seq_ids, *counts):
            if done < 0 or new < 1 or done + new > total:
                raise ValueError(f"seq {seq_id} computes tokens {done}..{done + new} of {total}")

    def _known_seqs(self, e) -> None:
        for seq_id in getattr(e, "seq_ids", None) or (e.seq_id,):
            if seq_id not in self.state.seqs:
                raise ValueError(f"seq {seq_id} was never added")


def _cut(text: str, limit: int = 40) -> str:
    """A string from a trace as an error line quotes it: at most `limit` characters."""
    return text if len(text) <= limit else text[:limit] + "…"


_RULES = {
    ev.BlockAllocated: TraceChecker._allocated,
    ev.PrefixCacheHit: TraceChecker._hit,
    ev.BlockHashed: TraceChecker._hashed,
    ev.SlotAppended: TraceChecker._slot,
    ev.CopyOnWrite: TraceChecker._cow,
    ev.Forked: TraceChecker._fork,
    ev.SwappedOut: lambda self, e: self._swap(e, "gpu", "cpu"),
    ev.SwappedIn: lambda self, e: self._swap(e, "cpu", "gpu"),
    ev.BlockFreed: TraceChecker._freed,
    ev.SequenceFreed: TraceChecker._seq_freed,
    ev.BlockEvicted: TraceChecker._evicted,
    ev.BlocksSkipped: TraceChecker._skipped,
    ev.RequestAdded: TraceChecker._request,
    ev.TokenGenerated: TraceChecker._known_seqs,
    ev.SequenceFinished: TraceChecker._finished,
    ev.Preempted: TraceChecker._known_seqs,
    ev.TokensScheduled: TraceChecker._scheduled,
    ev.KVDigest: lambda self, e: self._block(e.device, e.block),
    ev.OffloadStored: TraceChecker._offload_store,
    ev.OffloadLoaded: TraceChecker._offload_load,
    ev.RadixNodeInserted: TraceChecker._radix,
    ev.RadixNodeSplit: TraceChecker._radix,
    ev.RadixLockRef: TraceChecker._radix,
    ev.RadixNodeEvicted: TraceChecker._radix,
    ev.RadixEvict: TraceChecker._radix_evict,
}

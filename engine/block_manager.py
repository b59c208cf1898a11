"""BlockSpaceManager: maps each sequence's logical blocks to physical blocks (vLLM v0's
BlockSpaceManagerV1, vllm/core/block_manager_v1.py; prefix caching after nano-vllm's BlockManager,
nanovllm/engine/block_manager.py).

It only plans: it decides which physical block holds which tokens and returns (src, dst) pairs for
copy-on-write and swaps; the CacheEngine moves the data. Every mutation emits an event.
"""

from __future__ import annotations

import enum

from engine.block import Device, PhysicalTokenBlock
from engine.block_allocator import CachedBlockAllocator, UncachedBlockAllocator, compute_block_hash
from engine.events import (
    BlockAllocated,
    BlockFreed,
    BlockHashed,
    CopyOnWrite,
    EventBus,
    Forked,
    PrefixCacheHit,
    SequenceFreed,
    SlotAppended,
    SwappedIn,
    SwappedOut,
)
from engine.sequence import Sequence, SequenceGroup, SequenceStatus

BlockTable = list[PhysicalTokenBlock]


class AllocStatus(enum.Enum):
    """Answer of can_allocate / can_swap_in: OK now, LATER when blocks free up, NEVER (too big)."""

    OK = enum.auto()
    LATER = enum.auto()
    NEVER = enum.auto()


class BlockSpaceManager:
    """Manages the mapping between logical and physical token blocks (vLLM v0 BlockSpaceManagerV1).

    `watermark` keeps a fraction of GPU blocks in reserve so admitting a prompt does not force an
    immediate swap (vLLM's watermark_blocks = int(watermark * num_gpu_blocks)).
    """

    def __init__(
        self,
        block_size: int,
        num_gpu_blocks: int,
        num_cpu_blocks: int,
        watermark: float = 0.01,
        enable_caching: bool = False,
        events: EventBus | None = None,
    ) -> None:
        if not isinstance(block_size, int) or block_size <= 0:
            raise ValueError(f"block_size must be a positive integer, got {block_size!r}")
        if num_gpu_blocks < 0 or num_cpu_blocks < 0:
            raise ValueError(
                f"pool sizes must be >= 0, got num_gpu_blocks={num_gpu_blocks}, "
                f"num_cpu_blocks={num_cpu_blocks}"
            )
        if watermark < 0:
            raise ValueError(f"watermark must be >= 0, got {watermark}")
        self.block_size = block_size
        self.num_total_gpu_blocks = num_gpu_blocks
        self.num_total_cpu_blocks = num_cpu_blocks
        self.watermark = watermark
        self.watermark_blocks = int(watermark * num_gpu_blocks)
        self.enable_caching = enable_caching
        self.events = events if events is not None else EventBus()
        # With prefix caching both pools keep a hash map, as vLLM v0's: a swap finds a block by its
        # hash in the other pool (_swap); only the GPU pool serves prompts' prefix-cache hits.
        allocator = CachedBlockAllocator if enable_caching else UncachedBlockAllocator
        self.gpu_allocator = allocator(Device.GPU, block_size, num_gpu_blocks, self.events)
        self.cpu_allocator = allocator(Device.CPU, block_size, num_cpu_blocks, self.events)
        self.block_tables: dict[int, BlockTable] = {}
        self._num_slots: dict[int, int] = {}  # seq_id -> tokens that have a slot
        self._clock = 0  # logical time for LRU (deterministic: no wall clock)

    # ------------------------------------------------------------------ allocation (prefill)

    def can_allocate(self, seq_group: SequenceGroup) -> AllocStatus:
        """Whether the group's prompt fits now (OK), after others finish (LATER) or never."""
        tables = self._distinct_prompts(seq_group)
        num_required_blocks = sum(seqs[0].num_logical_blocks for seqs in tables)
        num_free_gpu_blocks = self.gpu_allocator.get_num_free_blocks()
        if self.num_total_gpu_blocks - num_required_blocks < self.watermark_blocks:
            return AllocStatus.NEVER
        if num_free_gpu_blocks - num_required_blocks >= self.watermark_blocks:
            return AllocStatus.OK
        return AllocStatus.LATER

    @staticmethod
    def _distinct_prompts(seq_group: SequenceGroup) -> list[list[Sequence]]:
        """Waiting sequences grouped by identical tokens: each group shares one block table. A new
        request is one group; a recomputed multi-sequence request has one per diverged branch."""
        by_tokens: dict[tuple[int, ...], list[Sequence]] = {}
        for seq in seq_group.get_seqs(SequenceStatus.WAITING):
            by_tokens.setdefault(tuple(seq.get_token_ids()), []).append(seq)
        if not by_tokens:
            raise ValueError(f"request {seq_group.request_id!r} has no waiting sequence to allocate")
        return list(by_tokens.values())

    def allocate(self, seq_group: SequenceGroup) -> None:
        """Give the group's waiting sequences their block tables, sequences with equal tokens
        sharing one (ref count = number of sequences), as vLLM v0 allocate.

        With prefix caching the leading full blocks are looked up by chained hash; the prompt's last
        block is never a hit, so at least one token is always computed.
        """
        prompts = self._distinct_prompts(seq_group)
        for seqs in prompts:
            for seq in seqs:
                if seq.seq_id in self.block_tables:
                    raise ValueError(f"sequence {seq.seq_id} already has a block table")
        num_required = sum(seqs[0].num_logical_blocks for seqs in prompts)
        if num_required > self.gpu_allocator.get_num_free_blocks():
            raise ValueError(
                f"cannot allocate {num_required} blocks for request {seq_group.request_id!r}: "
                f"{self.gpu_allocator.get_num_free_blocks()} free (call can_allocate first)"
            )
        self._clock += 1
        for seqs in prompts:
            self._allocate_shared(seqs)

    def _allocate_shared(self, waiting: list[Sequence]) -> None:
        seq = waiting[0]
        seq_ids = tuple(s.seq_id for s in waiting)
        num_seqs = len(waiting)
        logical_blocks = seq.logical_token_blocks
        emit = self.events.emit if self.events.active else None
        table: BlockTable = []
        parent_hash: int | None = None
        may_hit = self.enable_caching
        num_hits = 0
        for index, logical in enumerate(logical_blocks):
            token_ids = tuple(logical.get_token_ids())
            block_hash = None
            if self.enable_caching and logical.is_full():
                block_hash = compute_block_hash(token_ids, parent_hash)
            hit = None
            if may_hit and block_hash is not None and index < len(logical_blocks) - 1:
                hit = self.gpu_allocator.lookup(block_hash, token_ids)
            if hit is not None:
                self.gpu_allocator.take(hit)
                hit.ref_count += num_seqs - 1
                hit.last_accessed = self._clock
                table.append(hit)
                num_hits += 1
                if emit:
                    emit(PrefixCacheHit, device="gpu", block=hit.block_number, seq_ids=seq_ids,
                         logical_index=index, ref_count=hit.ref_count, block_hash=block_hash,
                         token_ids=token_ids)
            else:
                may_hit = False
                block = self.gpu_allocator.allocate()
                block.ref_count = num_seqs
                block.token_ids = token_ids
                block.last_accessed = self._clock
                table.append(block)
                if emit:
                    emit(BlockAllocated, device="gpu", block=block.block_number, seq_ids=seq_ids,
                         logical_index=index, ref_count=num_seqs, block_hash=None, token_ids=token_ids)
                if block_hash is not None:
                    self._hash_block(block, block_hash, parent_hash, (index + 1) * self.block_size)
            parent_hash = block_hash
        num_cached_tokens = num_hits * self.block_size
        for s in waiting:
            self.block_tables[s.seq_id] = table.copy()
            self._num_slots[s.seq_id] = s.get_len()
            s.num_cached_tokens = num_cached_tokens

    def _hash_block(
        self, block: PhysicalTokenBlock, block_hash: int, parent_hash: int | None, num_hashed: int
    ) -> None:
        block.block_hash = block_hash
        block.num_hashed_tokens = num_hashed
        registered = self.gpu_allocator.register(block)
        if self.events.active:
            self.events.emit(BlockHashed, device="gpu", block=block.block_number, block_hash=block_hash,
                             parent_hash=parent_hash, token_ids=block.token_ids,
                             num_hashed_tokens=num_hashed, registered=registered)

    def mark_blocks_as_computed(self, seq: Sequence) -> None:
        """The engine wrote this sequence's K/V: its blocks may now serve prefix-cache hits."""
        for block in reversed(self.block_tables[seq.seq_id]):
            if block.computed:
                break
            block.computed = True

    # ------------------------------------------------------------------ decode

    def can_append_slots(self, seq_group: SequenceGroup) -> bool:
        """One free block per running sequence is enough for any decode step (vLLM v0)."""
        num_seqs = seq_group.num_seqs(SequenceStatus.RUNNING)
        return num_seqs <= self.gpu_allocator.get_num_free_blocks()

    def append_slots(self, seq: Sequence) -> list[tuple[int, int]]:
        """Give the sequence's newest token a slot (vLLM v0 append_slots): a fresh block when the
        last one is full, a copy of the last one when it is shared. Returns [(src, dst)] for that
        copy-on-write, else []."""
        seq_id = seq.seq_id
        table = self.block_tables[seq_id]
        num_slots = self._num_slots[seq_id]
        num_tokens = seq.get_len()
        if num_tokens == num_slots:
            return []
        if num_tokens != num_slots + 1:
            raise ValueError(f"sequence {seq_id} gained {num_tokens - num_slots} tokens since its last slot")
        if table[0].device is not self.gpu_allocator.device:
            raise ValueError(f"sequence {seq_id} is swapped out; swap it in before appending")
        self._num_slots[seq_id] = num_tokens
        index = num_slots // self.block_size
        offset = num_slots % self.block_size
        cow = []
        if index == len(table):
            self._append_block(seq_id, table)
        elif table[index].ref_count > 1:
            cow.append(self._copy_on_write(seq_id, table, index, offset))
        block = table[index]  # holds this sequence's first `offset` tokens of the block, and no other
        token_id = seq.get_last_token_id()
        block.token_ids += (token_id,)
        if self.events.active:
            events = self.events
            events.publish(SlotAppended(next(events.seq_nos), seq_id=seq_id, device="gpu", logical_index=index,
                                        block=block.block_number, offset=offset, token_id=token_id))
        if self.enable_caching and offset == self.block_size - 1:
            parent_hash = table[index - 1].block_hash if index else None
            self._hash_block(block, compute_block_hash(block.token_ids, parent_hash), parent_hash, num_tokens)
        return cow

    def _append_block(self, seq_id: int, table: BlockTable) -> None:
        """A fresh block for the token that starts a new logical block."""
        block = self.gpu_allocator.allocate()
        table.append(block)
        events = self.events
        if events.active:
            events.publish(BlockAllocated(next(events.seq_nos), device="gpu", block=block.block_number,
                                          seq_ids=(seq_id,), logical_index=len(table) - 1, ref_count=1,
                                          block_hash=None, token_ids=()))

    def _copy_on_write(self, seq_id: int, table: BlockTable, index: int, offset: int) -> tuple[int, int]:
        """The shared block at `index` is replaced in this table by a fresh copy of its first
        `offset` tokens (vLLM v0 _maybe_promote_last_block); returns (src, dst) block numbers."""
        src = table[index]
        block = self.gpu_allocator.allocate()
        block.token_ids = src.token_ids[:offset]
        self._clock += 1
        self.gpu_allocator.free(src, self._clock)
        table[index] = block
        if self.events.active:
            self.events.emit(CopyOnWrite, seq_id=seq_id, device="gpu", logical_index=index,
                             src_block=src.block_number, dst_block=block.block_number,
                             src_ref_count=src.ref_count, token_ids=block.token_ids)
        return src.block_number, block.block_number

    def fork(self, parent_seq: Sequence, child_seq: Sequence) -> None:
        """The child shares every block of the parent (ref count +1 each), vLLM v0 fork."""
        if parent_seq.seq_id not in self.block_tables:
            raise KeyError(f"sequence {parent_seq.seq_id} has no block table to fork")
        if child_seq.seq_id in self.block_tables:
            raise ValueError(f"sequence {child_seq.seq_id} already has a block table")
        table = self.block_tables[parent_seq.seq_id]
        for block in table:
            block.ref_count += 1
        self.block_tables[child_seq.seq_id] = table.copy()
        self._num_slots[child_seq.seq_id] = self._num_slots[parent_seq.seq_id]
        if self.events.active:
            self.events.emit(Forked, parent_seq_id=parent_seq.seq_id, child_seq_id=child_seq.seq_id,
                             device=table[0].device.value if table else "gpu",
                             blocks=tuple(b.block_number for b in table))

    # ------------------------------------------------------------------ swapping

    def _group_blocks(self, seq_group: SequenceGroup, status: SequenceStatus) -> list[PhysicalTokenBlock]:
        unique: dict[int, PhysicalTokenBlock] = {}
        for seq in seq_group.get_seqs(status):
            for block in self.block_tables[seq.seq_id]:
                unique.setdefault(id(block), block)
        return list(unique.values())

    def num_blocks_to_swap_in(self, seq_group: SequenceGroup) -> int:
        """Distinct CPU blocks the group's swapped sequences hold (a shared block counts once)."""
        return len(self._group_blocks(seq_group, SequenceStatus.SWAPPED))

    def can_swap_in(self, seq_group: SequenceGroup) -> AllocStatus:
        """Room on the GPU for the swapped group's blocks plus one block per sequence to grow."""
        blocks = self._group_blocks(seq_group, SequenceStatus.SWAPPED)
        num_required = len(blocks) + seq_group.num_seqs(SequenceStatus.SWAPPED)
        if self.num_total_gpu_blocks < num_required:
            return AllocStatus.NEVER
        if self.gpu_allocator.get_num_free_blocks() - num_required >= self.watermark_blocks:
            return AllocStatus.OK
        return AllocStatus.LATER

    def swap_in(self, seq_group: SequenceGroup) -> list[tuple[int, int]]:
        """Move the group's swapped sequences back to the GPU; returns (cpu, gpu) pairs."""
        seqs = seq_group.get_seqs(SequenceStatus.SWAPPED)
        blocks = self._group_blocks(seq_group, SequenceStatus.SWAPPED)
        if len(blocks) > self.gpu_allocator.get_num_free_blocks():
            raise ValueError(f"not enough free GPU blocks to swap in request {seq_group.request_id!r}")
        return self._swap(seq_group, seqs, self.cpu_allocator, self.gpu_allocator, SwappedIn)

    def can_swap_out(self, seq_group: SequenceGroup) -> bool:
        blocks = self._group_blocks(seq_group, SequenceStatus.RUNNING)
        return len(blocks) <= self.cpu_allocator.get_num_free_blocks()

    def swap_out(self, seq_group: SequenceGroup) -> list[tuple[int, int]]:
        """Move the group's running sequences to the CPU pool; returns (gpu, cpu) pairs."""
        seqs = seq_group.get_seqs(SequenceStatus.RUNNING)
        if not self.can_swap_out(seq_group):
            raise ValueError(f"not enough free CPU blocks to swap out request {seq_group.request_id!r}")
        return self._swap(seq_group, seqs, self.gpu_allocator, self.cpu_allocator, SwappedOut)

    def _swap(self, seq_group, seqs, src_allocator, dst_allocator, event_cls) -> list[tuple[int, int]]:
        """Move `seqs`' tables from one pool to the other (vLLM v0 _swap_block_table): each source
        block gets one destination, shared by every table that held it. With prefix caching the
        destination is allocated by the source block's hash (vLLM v0 `dest_allocator.allocate(
        from_block.block_hash, from_block.num_hashed_tokens)`): a block with that hash and those
        tokens there, free but cached (revived, as v0's CachedBlockAllocator takes it back from its
        evictor) or in use (shared), already holds the K/V; any other is a fresh block, hashed and
        registered. Returns the (src, dst) pairs whose K/V must be copied: vLLM v0 copies the found
        ones too, the same K/V over itself."""
        self._clock += 1
        mapping: dict[int, PhysicalTokenBlock] = {}  # src block number -> dst block
        revived: dict[int, None] = {}  # dst blocks found by hash, in order
        fresh: set[int] = set()  # dst blocks this swap allocated
        hashed: list[tuple[PhysicalTokenBlock, bool]] = []  # fresh dst blocks with a hash, and whether registered
        released: list[tuple[int, PhysicalTokenBlock]] = []
        for seq in seqs:
            new_table: BlockTable = []
            for src in self.block_tables[seq.seq_id]:
                dst = mapping.get(src.block_number)
                if dst is not None:
                    dst.ref_count += 1
                else:
                    dst, found = self._allocate_like(src, dst_allocator)
                    if not found:
                        fresh.add(dst.block_number)
                        if self.enable_caching and dst.block_hash is not None:  # found by the next equal block
                            hashed.append((dst, dst_allocator.register(dst)))
                    elif dst.block_number not in fresh:  # it held the K/V before this swap: no copy
                        revived[dst.block_number] = None
                    dst.computed = True
                    dst.last_accessed = self._clock
                    mapping[src.block_number] = dst
                new_table.append(dst)
                released.append((seq.seq_id, src))
            self.block_tables[seq.seq_id] = new_table
        pairs = [(src, dst.block_number) for src, dst in mapping.items()]
        emit = self.events.emit if self.events.active else None
        if emit:
            emit(event_cls, request_id=seq_group.request_id, seq_ids=tuple(seq.seq_id for seq in seqs),
                 mapping=tuple(pairs), revived=tuple(revived))
            for dst, registered in hashed:
                emit(BlockHashed, device=dst.device.value, block=dst.block_number, block_hash=dst.block_hash,
                     parent_hash=None, token_ids=dst.token_ids, num_hashed_tokens=dst.num_hashed_tokens,
                     registered=registered)
        for seq_id, src in released:
            self._release(src_allocator, src, seq_id)
        copies: dict[int, int] = {}  # dst -> the first src mapped to it: its K/V copied once
        for src, dst in pairs:
            if dst not in revived:
                copies.setdefault(dst, src)
        return [(src, dst) for dst, src in copies.items()]

    @staticmethod
    def _allocate_like(
        src: PhysicalTokenBlock, allocator: UncachedBlockAllocator
    ) -> tuple[PhysicalTokenBlock, bool]:
        """A block of `allocator`'s pool for `src`'s K/V, and whether it was found by hash: the
        registered one with its hash and tokens (one more reference), else a fresh one carrying
        its tokens and hash (vLLM v0 CachedBlockAllocator.allocate(block_hash, num_hashed_tokens))."""
        if src.block_hash is not None:
            found = allocator.lookup(src.block_hash, src.token_ids)
            if found is not None:
                allocator.take(found)
                return found, True
        dst = allocator.allocate()
        dst.token_ids = src.token_ids
        dst.block_hash = src.block_hash
        dst.num_hashed_tokens = src.num_hashed_tokens
        return dst, False

    def _release(self, allocator: UncachedBlockAllocator, block: PhysicalTokenBlock, seq_id: int) -> None:
        cached = allocator.free(block, self._clock)
        if self.events.active:
            self.events.emit(BlockFreed, device=block.device.value, block=block.block_number,
                             seq_id=seq_id, ref_count=block.ref_count, cached=cached)

    # ------------------------------------------------------------------ freeing

    def free(self, seq: Sequence) -> None:
        """Release every block of the sequence's table, last block first (nano-vllm deallocate)."""
        if seq.seq_id not in self.block_tables:
            raise KeyError(f"sequence {seq.seq_id} has no block table (never allocated, or already freed)")
        self._clock += 1
        table = self.block_tables[seq.seq_id]
        for block in reversed(table):
            allocator = self.gpu_allocator if block.device is Device.GPU else self.cpu_allocator
            self._release(allocator, block, seq.seq_id)
        del self.block_tables[seq.seq_id]
        del self._num_slots[seq.seq_id]
        if self.events.active:
            self.events.emit(SequenceFreed, seq_id=seq.seq_id)

    # ------------------------------------------------------------------ queries

    def get_block_table(self, seq: Sequence) -> list[int]:
        """Physical block numbers of the sequence's logical blocks, in order."""
        if seq.seq_id not in self.block_tables:
            raise KeyError(f"sequence {seq.seq_id} has no block table")
        return [block.block_number for block in self.block_tables[seq.seq_id]]

    def get_num_free_gpu_blocks(self) -> int:
        return self.gpu_allocator.get_num_free_blocks()

    def get_num_free_cpu_blocks(self) -> int:
        return self.cpu_allocator.get_num_free_blocks()

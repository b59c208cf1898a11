"""KVCacheManager: a request's blocks, from prefix-cache lookup to free (vLLM v1
`vllm/v1/core/kv_cache_manager.py`).

A request here is one `Sequence` (n > 1 runs as n sequences that share the prompt through the
prefix cache). The scheduler asks `get_computed_blocks` which leading blocks are cached, then
`allocate_slots` for the tokens it schedules: all or nothing, None before allocating anything when
the pool cannot hold them. Full blocks are hashed and cached as soon as their tokens have slots,
so a request admitted later in the same step already hits them. The block hashes of each request
are kept here, extended as its tokens grow (vLLM 0.8's req_to_block_hashes; newer vLLM keeps them
on the Request).

The layers' KV-cache groups (engine/v1/kv_cache_interface.py) each keep a table per request, over
one BlockPool, through a KVCacheCoordinator (engine/v1/kv_cache_coordinator.py). A full-attention
model has one group, and then the blocks handed in and out are that group's list, as in vLLM
before hybrid models; with several groups they are a tuple of lists, one per group (vLLM's
KVCacheBlocks.blocks). Block numbers are unique over the groups (one pool); the events that place,
cache, evict or free a block name its group (`group`, vLLM's kv_cache_group_id), and a sliding
window's frees follow a BlocksSkipped naming the slots that now hold the null block.
"""

from __future__ import annotations

from collections.abc import Sequence as Seq

from engine.events import BlockAllocated, EventBus, PrefixCacheHit, SequenceFreed, SlotAppended
from engine.scheduler_output import pool_too_small_reason
from engine.sequence import Sequence
from engine.v1.block_pool import GPU
from engine.v1.kv_cache_coordinator import BlocksPerGroup, get_kv_cache_coordinator
from engine.v1.kv_cache_interface import FullAttentionSpec, KVCacheGroupSpec, cdiv, max_admission_blocks_per_request
from engine.v1.kv_cache_utils import BlockHash, KVCacheBlock, external_block_hash, get_hash_fn_by_name, hash_block_tokens

__all__ = ["KVCacheManager", "cdiv"]


def get_num_blocks_needed(managers, num_tokens: int, max_model_len: int | None,
                          full_sequence_must_fit: bool) -> list[int]:
    """Blocks a request of `num_tokens` tokens needs at once in each KV-cache group, as vLLM
    counts them: a full-attention group one per block of tokens; a sliding-window group no more
    than its admission cap (vLLM SlidingWindowSpec.max_admission_blocks_per_request, the
    whole-sequence gate's count, `manager.max_admission_blocks_per_request`) or, admitted on its
    first chunk (no gate), than a decode step holds (the same formula for one token in flight).
    Works on engine/v1's managers and on vLLM's own (their block_size, kv_cache_spec and
    max_admission_blocks_per_request); a request needing more than the pool's usable blocks can
    never run."""
    needed = []
    for manager in managers:
        num_blocks = cdiv(num_tokens, manager.block_size)
        cap = manager.max_admission_blocks_per_request
        if cap is not None and not full_sequence_must_fit:
            cap = max_admission_blocks_per_request(manager.kv_cache_spec, 1, max_model_len or num_tokens)
        needed.append(num_blocks if cap is None else min(num_blocks, cap))
    return needed


def too_big_reason(needed: list[int], num_tokens: int, num_usable_blocks: int) -> str:
    """Why a request that can never fit a v1 pool (its usable blocks: all but the null block) is
    refused, each KV-cache group's count named when there are several."""
    return pool_too_small_reason(needed, num_usable_blocks, "block 0 is the null block", num_tokens)


class KVCacheManager:
    """Block tables over a BlockPool, with prefix caching, for one or more KV-cache groups (vLLM
    v1 KVCacheManager)."""

    def __init__(self, block_size: int, num_gpu_blocks: int, max_model_len: int | None = None,
                 enable_caching: bool = True, hash_algo: str = "sha256", events: EventBus | None = None,
                 watermark: float = 0.0, kv_cache_groups: Seq[KVCacheGroupSpec] | None = None,
                 max_in_flight_tokens: int | None = None) -> None:
        """kv_cache_groups: the model's groups, each of `block_size` tokens a block; None is one
        full-attention group. max_in_flight_tokens: the most tokens a step schedules, which
        bounds what a sliding-window group holds at once (vLLM's max_in_flight_tokens, by
        default max_model_len)."""
        if not isinstance(block_size, int) or block_size <= 0:
            raise ValueError(f"block_size must be a positive integer, got {block_size!r}")
        if kv_cache_groups is None:
            kv_cache_groups = [KVCacheGroupSpec(["*"], FullAttentionSpec(block_size))]
        if any(group.kv_cache_spec.block_size != block_size for group in kv_cache_groups):
            raise ValueError(f"every KV-cache group must have block_size {block_size}")
        self.block_size = block_size
        self.max_model_len = max_model_len
        self.enable_caching = enable_caching
        self.hash_fn = get_hash_fn_by_name(hash_algo)
        self.events = events if events is not None else EventBus()
        self.kv_cache_groups = list(kv_cache_groups)
        self.coordinator = get_kv_cache_coordinator(self.kv_cache_groups, num_gpu_blocks, enable_caching, self.events,
                                                    max_model_len, max_in_flight_tokens)
        self.block_pool = self.coordinator.block_pool
        # blocks kept free when admitting a waiting request beside running ones (vLLM 0.33's
        # KVCacheManager.watermark_blocks, SchedulerConfig.watermark; 0 unless asked for)
        self.watermark_blocks = int(watermark * num_gpu_blocks)
        self.req_to_block_hashes: dict[int, list[BlockHash]] = {}
        # under async scheduling, slots allocate_slots gave a token still in flight (vLLM's output
        # placeholder): (seq id, position) -> [(group, block id)], announced by fill_slots once
        # the token is sampled
        self.pending_slots: dict[tuple[int, int], list[tuple[int, int]]] = {}
        self._no_blocks = ((),) * len(self.kv_cache_groups)
        self._one_group = len(self.kv_cache_groups) == 1

    @property
    def num_kv_cache_groups(self) -> int:
        return len(self.kv_cache_groups)

    @property
    def req_to_blocks(self) -> dict[int, list[KVCacheBlock]]:
        """seq_id -> its table in the first KV-cache group (the only one of a full-attention
        model; what the views draw)."""
        return self.coordinator.single_type_managers[0].req_to_blocks

    @property
    def num_total_gpu_blocks(self) -> int:
        return self.block_pool.num_gpu_blocks

    @property
    def num_usable_blocks(self) -> int:
        """Blocks a request can ever hold: all but the null block."""
        return self.block_pool.num_gpu_blocks - 1

    def get_num_blocks_needed(self, num_tokens: int, full_sequence_must_fit: bool = True) -> list[int]:
        """Blocks a request of `num_tokens` tokens needs at once, per KV-cache group
        (get_num_blocks_needed)."""
        return get_num_blocks_needed(self.coordinator.single_type_managers, num_tokens, self.max_model_len,
                                     full_sequence_must_fit)

    def _per_group(self, blocks) -> BlocksPerGroup:
        """Blocks as handed in (one group's list, or one list per group) as one list per group
        (no blocks: an empty tuple per group, read only)."""
        if blocks is None:
            return self._no_blocks
        return (blocks,) if self._one_group else tuple(blocks)

    def _as_given(self, blocks_per_group: tuple):
        """One list per group as handed out: the list itself when there is one group."""
        return blocks_per_group[0] if self._one_group else blocks_per_group

    # ------------------------------------------------------------------ hashes

    def block_hashes(self, seq: Sequence) -> list[BlockHash]:
        """The chained hashes of the sequence's full blocks, extended to its current tokens
        (vLLM's request.block_hashes, built by hash_request_tokens / the request's block hasher)."""
        hashes = self.req_to_block_hashes.setdefault(seq.seq_id, [])
        num_full = seq.get_len() // self.block_size
        if len(hashes) < num_full:
            token_ids = seq.get_token_ids()
            bs = self.block_size
            for index in range(len(hashes), num_full):
                parent = hashes[index - 1] if index else None
                hashes.append(hash_block_tokens(self.hash_fn, parent, token_ids[index * bs : (index + 1) * bs]))
        return hashes

    # ------------------------------------------------------------------ the scheduler's calls

    def get_computed_blocks(self, seq: Sequence):
        """The longest prefix of the sequence whose blocks are cached in every group, and the
        tokens it holds (vLLM get_computed_blocks). At most num_tokens - 1 tokens are served, so a
        block-aligned prompt still computes its last block (its logits are needed). A lookup,
        nothing changes: allocate_slots takes the blocks.

        Returns:
            The hit blocks (the group's list, or one list per group; a sliding-window group's
            list holds the null block where the hit's early blocks are not needed) and the hit
            tokens.
        """
        if not self.enable_caching:
            return self._as_given(tuple([] for _ in self.kv_cache_groups)), 0
        blocks, num_computed_tokens = self.coordinator.find_longest_cache_hit(self.block_hashes(seq), seq.get_len() - 1)
        return self._as_given(blocks), num_computed_tokens

    def allocate_slots(self, seq: Sequence, num_new_tokens: int, num_new_computed_tokens: int = 0,
                       new_computed_blocks=None, full_sequence_must_fit: bool = False, apply_watermark: bool = False):
        """Slots for `num_new_tokens` more tokens of `seq` (vLLM allocate_slots): first each
        sliding-window group frees the blocks out of its window (even when the answer is None),
        then, if the pool holds the tokens, the hits are taken and new blocks allocated in every
        group, and the full blocks cached.

        Args:
            seq: the request.
            num_new_tokens: tokens to compute this step (after any cached ones).
            num_new_computed_tokens: tokens `new_computed_blocks` hold (a waiting request's hits).
            new_computed_blocks: the cached blocks get_computed_blocks found.
            full_sequence_must_fit: admit only if the free blocks hold the whole sequence, not just
                this step's tokens (vLLM 0.33's admission gate, SchedulerConfig.scheduler_reserve_full_isl).
            apply_watermark: keep watermark_blocks free besides (a waiting request admitted while
                others run, as vLLM 0.33 applies it).

        Returns:
            The blocks newly allocated (the group's list, or one list per group), or None when the
            free blocks (cached hits with ref 0 count against them) cannot hold the tokens; then
            no block was allocated or taken.
        """
        if num_new_tokens <= 0:
            raise ValueError(f"num_new_tokens must be positive, got {num_new_tokens}")
        seq_id = seq.seq_id
        computed_blocks = self._per_group(new_computed_blocks)
        num_local_computed_tokens = seq.num_computed_tokens + num_new_computed_tokens
        total_computed_tokens = num_local_computed_tokens
        if self.max_model_len is not None:
            total_computed_tokens = min(total_computed_tokens, self.max_model_len)
        watermark_blocks = self.watermark_blocks if apply_watermark else 0
        coordinator = self.coordinator
        if full_sequence_must_fit:
            full_num_tokens = seq.get_len() if self.max_model_len is None else min(seq.get_len(), self.max_model_len)
            if (coordinator.get_num_blocks_to_allocate(seq_id, full_num_tokens, computed_blocks, total_computed_tokens,
                                                       apply_admission_cap=True)
                    > self.block_pool.get_num_free_blocks() - watermark_blocks):
                return None
        num_tokens_need_slot = total_computed_tokens + num_new_tokens
        if self.max_model_len is not None:
            num_tokens_need_slot = min(num_tokens_need_slot, self.max_model_len)
        # on the processed tokens: a step in flight still reads the blocks its window started in
        coordinator.remove_skipped_blocks(seq_id, max(0, total_computed_tokens - seq.num_in_flight_tokens))
        if (coordinator.get_num_blocks_to_allocate(seq_id, num_tokens_need_slot, computed_blocks, num_local_computed_tokens)
                > self.block_pool.get_num_free_blocks() - watermark_blocks):
            return None

        if any(computed_blocks):
            coordinator.allocate_new_computed_blocks(seq_id, computed_blocks, num_local_computed_tokens)
            if self.events.active:
                for group, (blocks, hits) in enumerate(zip(coordinator.get_blocks(seq_id), computed_blocks)):
                    self._emit_hits(seq, blocks, len(blocks) - len(hits), group)
        new_blocks = coordinator.allocate_new_blocks(seq_id, num_tokens_need_slot)
        if self.events.active:
            for group, (blocks, new) in enumerate(zip(coordinator.get_blocks(seq_id), new_blocks)):
                self._emit_slots(seq, blocks, len(blocks) - len(new), num_local_computed_tokens, num_tokens_need_slot,
                                 group)
        # only tokens known now: a token in flight is cached once it is sampled
        self.cache_blocks(seq, min(total_computed_tokens + num_new_tokens, seq.get_len()))
        return self._as_given(new_blocks)

    def cache_blocks(self, seq: Sequence, num_computed_tokens: int) -> None:
        """Cache the sequence's full blocks among its first `num_computed_tokens` tokens, in every
        group (vLLM KVCacheManager.cache_blocks; the scheduler calls it when a token sampled in
        flight completes a block)."""
        if self.enable_caching:
            self.coordinator.cache_blocks(seq, num_computed_tokens, self.block_hashes)

    def free(self, seq: Sequence) -> None:
        """Release the sequence's blocks, group after group, each last first, so a chain's tail is
        evicted before its head (vLLM free)."""
        if not self.has_blocks(seq):
            raise KeyError(f"sequence {seq.seq_id} holds no blocks")
        self.coordinator.free(seq.seq_id)
        self.req_to_block_hashes.pop(seq.seq_id, None)
        for key in [key for key in self.pending_slots if key[0] == seq.seq_id]:
            del self.pending_slots[key]
        if self.events.active:
            self.events.emit(SequenceFreed, seq_id=seq.seq_id)

    def get_num_common_prefix_blocks(self, seq: Sequence, num_running_requests: int) -> int:
        """How many leading blocks of `seq` every running request holds (vLLM
        get_num_common_prefix_blocks, for cascade attention): those with ref_cnt equal to the
        number of running requests."""
        num_common = 0
        for block in self.req_to_blocks.get(seq.seq_id, []):
            if block.ref_cnt != num_running_requests:
                break
            num_common += 1
        return num_common

    # ------------------------------------------------------------------ what the step plan reads

    def get_block_ids(self, seq: Sequence):
        """The sequence's block table as block ids: the group's list, or one list per group (vLLM
        get_block_ids)."""
        return self._as_given(self.get_block_ids_per_group(seq))

    def get_block_ids_per_group(self, seq: Sequence) -> tuple[list[int], ...]:
        """The sequence's block ids in each group, the null block (0) where a window let a block go."""
        return tuple([block.block_id for block in blocks] for blocks in self.coordinator.get_blocks(seq.seq_id))

    def has_blocks(self, seq: Sequence) -> bool:
        return seq.seq_id in self.req_to_blocks

    @property
    def usage(self) -> float:
        return self.block_pool.get_usage()

    def get_num_free_gpu_blocks(self) -> int:
        return self.block_pool.get_num_free_blocks()

    # ------------------------------------------------------------------ events

    def _emit_hits(self, seq: Sequence, blocks: list[KVCacheBlock], first: int, group: int = 0) -> None:
        if not self.events.active:
            return
        token_ids = seq.get_token_ids()
        bs = self.block_size
        for index, block in enumerate(blocks[first:], start=first):
            if block.is_null:  # a hit before the window: never taken
                continue
            assert block.block_hash is not None
            self.events.emit(PrefixCacheHit, device=GPU, block=block.block_id, seq_ids=(seq.seq_id,),
                             logical_index=index, ref_count=block.ref_cnt,
                             block_hash=external_block_hash(block.block_hash),
                             token_ids=tuple(token_ids[index * bs : (index + 1) * bs]), group=group)

    def fill_slots(self, seq: Sequence, pos: int, token_id: int) -> None:
        """The token at `pos` of `seq` was sampled: SlotAppended for each slot allocate_slots gave
        it while it was in flight (async scheduling's output placeholder), in every group whose
        table still holds that block there (a slot a window let go since is dropped)."""
        slots = self.pending_slots.pop((seq.seq_id, pos), ())
        if not slots or not self.events.active:
            return
        tables = self.coordinator.get_blocks(seq.seq_id)
        index = pos // self.block_size
        for group, block_id in slots:
            table = tables[group]
            if index < len(table) and table[index].block_id == block_id:
                self.events.emit(SlotAppended, seq_id=seq.seq_id, device=GPU, logical_index=index, block=block_id,
                                 offset=pos % self.block_size, token_id=token_id)

    def _emit_slots(self, seq: Sequence, blocks: list[KVCacheBlock], num_old_blocks: int,
                    start: int, end: int, group: int = 0) -> None:
        """Tokens start..end-1 got slots: those in blocks the sequence held already are
        SlotAppended, each new block is BlockAllocated with the tokens it holds. A slot for a token
        still in flight (past the sequence's tokens) waits in pending_slots for fill_slots."""
        bs = self.block_size
        prompt, output = seq.prompt_token_ids, seq.output_token_ids
        known = len(prompt) + len(output)
        events = self.events
        for pos in range(start, min(end, num_old_blocks * bs)):  # a decode: one token, no list copy
            if pos >= known:
                self.pending_slots.setdefault((seq.seq_id, pos), []).append((group, blocks[pos // bs].block_id))
                continue
            token_id = prompt[pos] if pos < len(prompt) else output[pos - len(prompt)]
            events.publish(SlotAppended(next(events.seq_nos), seq_id=seq.seq_id, device=GPU, logical_index=pos // bs,
                                        block=blocks[pos // bs].block_id, offset=pos % bs, token_id=token_id))
        token_ids = seq.get_token_ids() if len(blocks) > num_old_blocks else []
        for index in range(num_old_blocks, len(blocks)):
            block = blocks[index]
            held = tuple(token_ids[max(start, index * bs) : min(end, (index + 1) * bs)])
            self.events.emit(BlockAllocated, device=GPU, block=block.block_id, seq_ids=(seq.seq_id,),
                             logical_index=index, ref_count=block.ref_cnt, block_hash=None, token_ids=held,
                             group=group)
            for pos in range(max(start, index * bs, known), min(end, (index + 1) * bs)):
                self.pending_slots.setdefault((seq.seq_id, pos), []).append((group, block.block_id))

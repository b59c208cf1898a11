"""KVCacheManager: a request's blocks, from prefix-cache lookup to free (vLLM v1
`vllm/v1/core/kv_cache_manager.py`, one full-attention KV cache group).

A request here is one `Sequence` (n > 1 runs as n sequences that share the prompt through the
prefix cache). The scheduler asks `get_computed_blocks` which leading blocks are cached, then
`allocate_slots` for the tokens it schedules: all or nothing, None before touching anything when
the pool cannot hold them. Full blocks are hashed and cached as soon as their tokens have slots,
so a request admitted later in the same step already hits them. The block hashes of each request
are kept here, extended as its tokens grow (vLLM 0.8's req_to_block_hashes; newer vLLM keeps them
on the Request).
"""

from __future__ import annotations

from engine.events import BlockAllocated, EventBus, PrefixCacheHit, SequenceFreed, SlotAppended
from engine.sequence import Sequence
from engine.v1.block_pool import GPU, BlockPool
from engine.v1.kv_cache_utils import BlockHash, KVCacheBlock, external_block_hash, get_hash_fn_by_name, hash_block_tokens


def cdiv(a: int, b: int) -> int:
    return -(-a // b)


class KVCacheManager:
    """Block tables over a BlockPool, with prefix caching (vLLM v1 KVCacheManager)."""

    def __init__(self, block_size: int, num_gpu_blocks: int, max_model_len: int | None = None,
                 enable_caching: bool = True, hash_algo: str = "sha256", events: EventBus | None = None,
                 watermark: float = 0.0) -> None:
        if not isinstance(block_size, int) or block_size <= 0:
            raise ValueError(f"block_size must be a positive integer, got {block_size!r}")
        self.block_size = block_size
        self.max_model_len = max_model_len
        self.enable_caching = enable_caching
        self.hash_fn = get_hash_fn_by_name(hash_algo)
        self.events = events if events is not None else EventBus()
        self.block_pool = BlockPool(num_gpu_blocks, enable_caching, self.events)
        # blocks kept free when admitting a waiting request beside running ones (vLLM 0.33's
        # KVCacheManager.watermark_blocks, SchedulerConfig.watermark; 0 unless asked for)
        self.watermark_blocks = int(watermark * num_gpu_blocks)
        self.req_to_blocks: dict[int, list[KVCacheBlock]] = {}
        self.req_to_block_hashes: dict[int, list[BlockHash]] = {}
        self.num_cached_block: dict[int, int] = {}  # seq_id -> its leading blocks already hashed

    @property
    def num_total_gpu_blocks(self) -> int:
        return self.block_pool.num_gpu_blocks

    @property
    def num_usable_blocks(self) -> int:
        """Blocks a request can ever hold: all but the null block."""
        return self.block_pool.num_gpu_blocks - 1

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

    def get_computed_blocks(self, seq: Sequence) -> tuple[list[KVCacheBlock], int]:
        """The longest run of cached full blocks at the start of the sequence, and the tokens they
        hold (vLLM get_computed_blocks). At most num_tokens - 1 tokens are served, so a
        block-aligned prompt still computes its last block (its logits are needed). A lookup,
        nothing changes: allocate_slots takes the blocks."""
        if not self.enable_caching:
            return [], 0
        max_cache_hit_length = seq.get_len() - 1
        computed: list[KVCacheBlock] = []
        for block_hash in self.block_hashes(seq)[: max_cache_hit_length // self.block_size]:
            block = self.block_pool.get_cached_block(block_hash)
            if block is None:
                break
            computed.append(block)
        return computed, len(computed) * self.block_size

    def allocate_slots(self, seq: Sequence, num_new_tokens: int, num_new_computed_tokens: int = 0,
                       new_computed_blocks: list[KVCacheBlock] | None = None, full_sequence_must_fit: bool = False,
                       apply_watermark: bool = False) -> list[KVCacheBlock] | None:
        """Slots for `num_new_tokens` more tokens of `seq` (vLLM allocate_slots).

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
            The blocks newly allocated, or None when the free blocks (cached hits with ref 0
            count against them) cannot hold the tokens; then nothing has changed.
        """
        if num_new_tokens <= 0:
            raise ValueError(f"num_new_tokens must be positive, got {num_new_tokens}")
        computed_blocks = new_computed_blocks or []
        num_computed_tokens = seq.num_computed_tokens + num_new_computed_tokens
        num_tokens_need_slot = num_computed_tokens + num_new_tokens
        if self.max_model_len is not None:
            num_tokens_need_slot = min(num_tokens_need_slot, self.max_model_len)
        req_blocks = self.req_to_blocks.get(seq.seq_id)
        if req_blocks is None:
            req_blocks = self.req_to_blocks[seq.seq_id] = []
        num_new_blocks = cdiv(num_tokens_need_slot, self.block_size) - len(req_blocks) - len(computed_blocks)
        num_evictable_computed_blocks = sum(1 for b in computed_blocks if b.ref_cnt == 0) if computed_blocks else 0
        num_free = self.block_pool.get_num_free_blocks() - num_evictable_computed_blocks
        num_needed = num_new_blocks
        if apply_watermark:
            num_free -= self.watermark_blocks
        if full_sequence_must_fit:
            full_num_tokens = seq.get_len() if self.max_model_len is None else min(seq.get_len(), self.max_model_len)
            num_needed = max(num_needed, cdiv(full_num_tokens, self.block_size) - len(req_blocks) - len(computed_blocks))
        if num_needed > num_free:
            if not req_blocks:
                del self.req_to_blocks[seq.seq_id]  # nothing changed: not even an empty table
            return None

        if computed_blocks:
            self.block_pool.touch(computed_blocks)
            first = len(req_blocks)
            req_blocks.extend(computed_blocks)
            self._emit_hits(seq, computed_blocks, first)
        num_old_blocks = len(req_blocks)
        new_blocks = self.block_pool.get_new_blocks(num_new_blocks) if num_new_blocks > 0 else []
        req_blocks.extend(new_blocks)
        if self.events.active:
            self._emit_slots(seq, req_blocks, num_old_blocks, num_computed_tokens, num_tokens_need_slot)
        if self.enable_caching:
            num_tokens_to_cache = min(num_computed_tokens + num_new_tokens, seq.get_len())
            self.cache_blocks(seq, num_tokens_to_cache)
        return new_blocks

    def cache_blocks(self, seq: Sequence, num_computed_tokens: int) -> None:
        """Hash and cache the sequence's blocks that `num_computed_tokens` tokens fill (vLLM
        cache_blocks)."""
        num_cached = self.num_cached_block.get(seq.seq_id, 0)
        num_full = num_computed_tokens // self.block_size
        if num_full <= num_cached:
            return
        self.block_pool.cache_full_blocks(self.req_to_blocks[seq.seq_id], self.block_hashes(seq), num_cached,
                                          num_full, seq.get_token_ids(), self.block_size)
        self.num_cached_block[seq.seq_id] = num_full

    def free(self, seq: Sequence) -> None:
        """Release the sequence's blocks, last first, so a chain's tail is evicted before its
        head (vLLM free: block_pool.free_blocks(reversed(blocks)))."""
        blocks = self.req_to_blocks.pop(seq.seq_id, None)
        if blocks is None:
            raise KeyError(f"sequence {seq.seq_id} holds no blocks")
        self.block_pool.free_blocks(reversed(blocks), seq.seq_id)
        self.num_cached_block.pop(seq.seq_id, None)
        self.req_to_block_hashes.pop(seq.seq_id, None)
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

    def get_block_ids(self, seq: Sequence) -> list[int]:
        """The sequence's block table as block ids (vLLM get_block_ids)."""
        return [block.block_id for block in self.req_to_blocks.get(seq.seq_id, [])]

    def has_blocks(self, seq: Sequence) -> bool:
        return seq.seq_id in self.req_to_blocks

    @property
    def usage(self) -> float:
        return self.block_pool.get_usage()

    def get_num_free_gpu_blocks(self) -> int:
        return self.block_pool.get_num_free_blocks()

    # ------------------------------------------------------------------ events

    def _emit_hits(self, seq: Sequence, blocks: list[KVCacheBlock], first: int) -> None:
        if not self.events.active:
            return
        token_ids = seq.get_token_ids()
        bs = self.block_size
        for index, block in enumerate(blocks, start=first):
            assert block.block_hash is not None
            self.events.emit(PrefixCacheHit, device=GPU, block=block.block_id, seq_ids=(seq.seq_id,),
                             logical_index=index, ref_count=block.ref_cnt,
                             block_hash=external_block_hash(block.block_hash),
                             token_ids=tuple(token_ids[index * bs : (index + 1) * bs]))

    def _emit_slots(self, seq: Sequence, blocks: list[KVCacheBlock], num_old_blocks: int,
                    start: int, end: int) -> None:
        """Tokens start..end-1 got slots: those in blocks the sequence held already are
        SlotAppended, each new block is BlockAllocated with the tokens it holds."""
        bs = self.block_size
        prompt, output = seq.prompt_token_ids, seq.output_token_ids
        events = self.events
        for pos in range(start, min(end, num_old_blocks * bs)):  # a decode: one token, no list copy
            token_id = prompt[pos] if pos < len(prompt) else output[pos - len(prompt)]
            events.publish(SlotAppended(next(events.seq_nos), seq_id=seq.seq_id, device=GPU, logical_index=pos // bs,
                                        block=blocks[pos // bs].block_id, offset=pos % bs, token_id=token_id))
        token_ids = seq.get_token_ids() if len(blocks) > num_old_blocks else []
        for index in range(num_old_blocks, len(blocks)):
            block = blocks[index]
            held = tuple(token_ids[max(start, index * bs) : min(end, (index + 1) * bs)])
            self.events.emit(BlockAllocated, device=GPU, block=block.block_id, seq_ids=(seq.seq_id,),
                             logical_index=index, ref_count=block.ref_cnt, block_hash=None, token_ids=held)

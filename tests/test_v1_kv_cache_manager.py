"""vLLM v1's block pool and KV cache manager (engine/v1/), scenario by scenario, after vLLM's own
tests/v1/core/test_kv_cache_utils.py (the free queue, the hash) and test_prefix_caching.py (free
order, lazy eviction, hits, no de-duplication, the num_tokens - 1 cap). The reducer, fed only the
events, matches the manager after every operation."""

from __future__ import annotations

import pytest

from blockviz.model.reducer import NULL, ReducerState
from reducer_checks import check_reducer_matches_v1
from engine.events import BlockEvicted, EventBus
from engine.sequence import Sequence
from engine.v1 import BlockPool, FreeKVCacheBlockQueue, KVCacheBlock, KVCacheManager, hash_block_tokens
from engine.v1.invariants import check_kv_cache_invariants
from engine.v1.kv_cache_utils import external_block_hash, none_hash, sha256, xxhash_128


class Harness:
    """A manager on a bus, a reducer and an event list fed from it."""

    def __init__(self, block_size: int = 4, num_blocks: int = 10, enable_caching: bool = True) -> None:
        self.bus = EventBus()
        self.events: list = []
        self.bus.subscribe(self.events.append)
        self.reducer = ReducerState(block_size, num_blocks, 0, "v1")
        self.bus.subscribe(self.reducer.apply)
        self.manager = KVCacheManager(block_size, num_blocks, enable_caching=enable_caching, events=self.bus)
        self.pool = self.manager.block_pool

    def check(self) -> None:
        check_kv_cache_invariants(self.manager)
        check_reducer_matches_v1(self.reducer, self.manager)

    def queue(self) -> list[int]:
        return [b.block_id for b in self.pool.free_block_queue]

    def admit(self, seq: Sequence) -> list[int]:
        """What the v1 scheduler does for a waiting request: hits, then slots for the rest."""
        blocks, num_computed = self.manager.get_computed_blocks(seq)
        new = self.manager.allocate_slots(seq, seq.get_len() - num_computed, num_computed, blocks)
        assert new is not None
        seq.num_computed_tokens = seq.get_len()
        self.check()
        return self.manager.get_block_ids(seq)

    def free(self, seq: Sequence) -> None:
        self.manager.free(seq)
        self.check()


def seq(seq_id: int, tokens, block_size: int = 4) -> Sequence:
    return Sequence(seq_id, list(tokens), block_size)


# ---------------------------------------------------------------- FreeKVCacheBlockQueue


def test_free_queue_links_pops_removes_and_inserts():
    blocks = [KVCacheBlock(i) for i in range(6)]
    queue = FreeKVCacheBlockQueue(blocks)
    assert [b.block_id for b in queue] == [0, 1, 2, 3, 4, 5] and queue.num_free_blocks == 6
    assert queue.popleft().block_id == 0
    queue.remove(blocks[3])  # out of the middle, O(1)
    assert [b.block_id for b in queue] == [1, 2, 4, 5] and blocks[3].prev_free_block is None
    queue.append(blocks[3])
    queue.prepend_n([blocks[0]])
    assert [b.block_id for b in queue] == [0, 1, 2, 4, 5, 3]
    assert [b.block_id for b in queue.popleft_n(3)] == [0, 1, 2]
    queue.prepend_n([blocks[2], blocks[1]])  # blocks[0] of the list becomes the head
    assert [b.block_id for b in queue.get_all_free_blocks()] == [2, 1, 4, 5, 3] and queue.num_free_blocks == 5
    with pytest.raises(ValueError):
        queue.popleft_n(6)
    with pytest.raises(ValueError):
        queue.remove(blocks[0])  # not in the queue


# ---------------------------------------------------------------- the hash


def test_block_hash_chains_parent_tokens_and_extra_keys():
    first = hash_block_tokens(sha256, None, [1, 2, 3, 4])
    assert first == sha256((none_hash(sha256), (1, 2, 3, 4), None))  # NONE_HASH stands in for no parent
    second = hash_block_tokens(sha256, first, [5, 6, 7, 8])
    assert second == sha256((first, (5, 6, 7, 8), None))
    assert hash_block_tokens(sha256, None, [5, 6, 7, 8]) != second  # the parent is part of it
    assert hash_block_tokens(sha256, None, [1, 2, 3, 4], ("lora",)) != first  # so are extra keys
    assert hash_block_tokens(xxhash_128, None, [1, 2, 3, 4]) != first and len(xxhash_128(1)) == 16
    assert external_block_hash(first) == int.from_bytes(first[-8:], "big")


def test_hash_algo_option_changes_the_hashes():
    tokens = list(range(8))
    hashes = {}
    for algo in ("sha256", "xxhash"):
        manager = KVCacheManager(4, 8, hash_algo=algo)
        hashes[algo] = manager.block_hashes(seq(1, tokens))
        assert len(hashes[algo]) == 2
    assert hashes["sha256"] != hashes["xxhash"]
    with pytest.raises(ValueError, match="prefix_caching_hash_algo"):
        KVCacheManager(4, 8, hash_algo="md5")


# ---------------------------------------------------------------- the null block


def test_null_block_is_never_allocated_freed_or_counted():
    h = Harness(num_blocks=5)
    assert h.pool.null_block.block_id == 0 and h.pool.null_block.is_null
    assert h.pool.get_num_free_blocks() == 4 and h.queue() == [1, 2, 3, 4]
    assert h.reducer.pools["gpu"][0].state == NULL and h.reducer.num_free("gpu") == 4
    got = h.pool.get_new_blocks(4)
    assert sorted(b.block_id for b in got) == [1, 2, 3, 4] and h.pool.get_usage() == 1.0
    with pytest.raises(ValueError):
        h.pool.get_new_blocks(1)  # block 0 is not there to take
    h.pool.free_blocks([h.pool.null_block])  # freeing the null block does nothing
    assert h.pool.get_num_free_blocks() == 0 and h.pool.null_block.ref_cnt == 0
    h.pool.free_blocks(got)
    assert h.pool.get_num_free_blocks() == 4 and 0 not in h.queue()


# ---------------------------------------------------------------- free order and eviction


def test_free_puts_hashed_blocks_at_the_tail_in_reverse_and_the_partial_block_at_the_head():
    h = Harness(num_blocks=10)
    a = seq(1, range(14))  # three full blocks and one holding 2 tokens
    assert h.admit(a) == [1, 2, 3, 4]
    assert h.queue() == [5, 6, 7, 8, 9]
    h.free(a)
    assert h.queue() == [4, 5, 6, 7, 8, 9, 3, 2, 1]
    assert [b.block_hash is not None for b in h.pool.blocks[1:5]] == [True, True, True, False]


def test_eviction_is_lazy_from_the_head_and_takes_a_chains_tail_first():
    h = Harness(num_blocks=10)
    a = seq(1, range(14))
    h.admit(a)
    h.free(a)  # queue [4, 5, 6, 7, 8, 9, 3, 2, 1]
    b = seq(2, range(100, 124))  # six blocks, no hit: pops 4..9, none of them cached
    assert h.admit(b) == [4, 5, 6, 7, 8, 9]
    assert not any(isinstance(e, BlockEvicted) for e in h.events)
    assert all(h.pool.blocks[i].block_hash is not None for i in (1, 2, 3))  # still cached while free
    c = seq(3, range(200, 202))  # one block: pops 3, the chain's last block
    assert h.admit(c) == [3]
    evicted = [e.block for e in h.events if isinstance(e, BlockEvicted)]
    assert evicted == [3] and h.pool.blocks[3].block_hash is None  # c's block holds 2 tokens: no hash
    again = seq(4, range(14))
    blocks, num_computed = h.manager.get_computed_blocks(again)
    assert [x.block_id for x in blocks] == [1, 2] and num_computed == 8  # the head of the chain survived


def test_a_hit_on_a_free_cached_block_takes_it_out_of_the_queue():
    h = Harness(num_blocks=10)
    a = seq(1, range(14))
    h.admit(a)
    h.free(a)
    free_before = h.pool.get_num_free_blocks()
    b = seq(2, range(14))
    assert h.admit(b) == [1, 2, 3, 4]  # three hits (13 tokens at most) and the queue's head
    assert [h.pool.blocks[i].ref_cnt for i in (1, 2, 3)] == [1, 1, 1]
    assert not {1, 2, 3} & set(h.queue())
    assert h.pool.get_num_free_blocks() == free_before - 4


def test_allocate_slots_returning_none_changes_nothing():
    h = Harness(num_blocks=8)
    a = seq(1, range(8))
    h.admit(a)
    h.free(a)  # blocks 1, 2 free but cached at the tail
    filler = seq(2, range(50, 61))  # three blocks
    h.admit(filler)
    assert h.pool.get_num_free_blocks() == 4  # two plain free blocks and the cached 2, 1
    b = seq(3, list(range(8)) + list(range(70, 79)))  # hits blocks 1, 2; needs 3 more
    blocks, num_computed = h.manager.get_computed_blocks(b)
    assert [x.block_id for x in blocks] == [1, 2]
    before = (h.queue(), [(x.ref_cnt, x.block_hash) for x in h.pool.blocks], dict(h.manager.req_to_blocks),
              h.pool.get_num_free_blocks(), len(h.events))
    # the two hits are free blocks themselves: 3 new > 4 free - 2 evictable hits
    assert h.manager.allocate_slots(b, b.get_len() - num_computed, num_computed, blocks) is None
    after = (h.queue(), [(x.ref_cnt, x.block_hash) for x in h.pool.blocks], dict(h.manager.req_to_blocks),
             h.pool.get_num_free_blocks(), len(h.events))
    assert after == before and b.seq_id not in h.manager.req_to_blocks
    h.check()


def test_two_blocks_may_hold_one_hash_and_a_lookup_returns_the_first():
    h = Harness(num_blocks=10)
    tokens = list(range(8))
    a = seq(1, tokens[:6])  # block 1 full, block 2 holds two tokens
    h.admit(a)
    b = seq(2, tokens)  # hits block 1; its own block 3 holds tokens 4..7 and is cached
    assert h.admit(b) == [1, 3]
    for token in tokens[6:]:  # a decodes the same two tokens: its block 2 fills up with them
        a.append_token_id(token)
        assert h.manager.allocate_slots(a, 1) == []
        a.num_computed_tokens += 1
        h.check()
    block_hash = h.manager.block_hashes(a)[1]
    assert h.pool.blocks[2].block_hash == h.pool.blocks[3].block_hash == block_hash  # not de-duplicated
    assert list(h.pool.cached_block_hash_to_block[block_hash]) == [3, 2]
    assert h.pool.get_cached_block(block_hash).block_id == 3
    c = seq(3, tokens + [99])
    blocks, _ = h.manager.get_computed_blocks(c)
    assert [x.block_id for x in blocks] == [1, 3]
    h.free(b)  # 3 goes to the tail still cached; a lookup still finds 3 first
    assert h.pool.get_cached_block(block_hash).block_id == 3


def test_a_block_aligned_prompt_recomputes_its_last_block():
    h = Harness(num_blocks=10)
    a = seq(1, range(8))
    h.admit(a)
    h.free(a)
    same = seq(2, range(8))
    blocks, num_computed = h.manager.get_computed_blocks(same)
    assert [b.block_id for b in blocks] == [1] and num_computed == 4  # capped at num_tokens - 1
    longer = seq(3, list(range(8)) + [42])
    blocks, num_computed = h.manager.get_computed_blocks(longer)
    assert [b.block_id for b in blocks] == [1, 2] and num_computed == 8


def test_common_prefix_blocks_of_running_requests():
    h = Harness(num_blocks=12)
    a, b = seq(1, list(range(10)) + [1]), seq(2, list(range(10)) + [2])
    h.admit(a)
    h.admit(b)  # shares blocks 1, 2 with a
    assert h.manager.get_num_common_prefix_blocks(a, 2) == 2
    assert h.manager.get_num_common_prefix_blocks(a, 3) == 0


def test_no_caching_means_no_hashes_and_no_hits():
    h = Harness(num_blocks=10, enable_caching=False)
    a = seq(1, range(9))
    h.admit(a)
    h.free(a)
    assert all(b.block_hash is None for b in h.pool.blocks)
    assert h.queue()[:3] == [3, 2, 1]  # unhashed: prepended in the reverse of the table
    assert h.manager.get_computed_blocks(seq(2, range(9))) == ([], 0)


def test_block_pool_needs_room_beside_the_null_block():
    with pytest.raises(ValueError, match="null block"):
        BlockPool(1, True)

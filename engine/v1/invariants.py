"""check_kv_cache_invariants(manager): what a v1 KVCacheManager keeps true after every operation
(the properties vLLM v1's tests/v1/core/test_prefix_caching.py checks case by case).

Used by the hypothesis state machine and the engine tests after every step. Raises AssertionError
naming the first broken invariant.
"""

from __future__ import annotations

from collections import Counter


def check_kv_cache_invariants(manager) -> None:
    """Every non-null block is either in the free queue with ref_cnt 0 or out of it with ref_cnt
    > 0; ref_cnt is the number of tables holding it, over every KV-cache group; the null block is
    not in the queue, and in no table but a sliding window's (in the slots it let go, at the
    table's head); the queue's links agree both ways and with its count; the hash map holds
    exactly the blocks that have a hash, under that hash, each cached for the group whose table
    holds it."""
    pool = manager.block_pool
    queue = pool.free_block_queue
    forward = list(queue)
    backward = []
    block = queue.fake_free_list_tail.prev_free_block
    while block is not None and block is not queue.fake_free_list_head:
        backward.append(block)
        block = block.prev_free_block
    assert forward == backward[::-1], "the free queue's links disagree"
    assert len(forward) == queue.num_free_blocks, f"free queue holds {len(forward)}, counts {queue.num_free_blocks}"
    in_queue = {b.block_id for b in forward}
    assert len(in_queue) == len(forward), "a block is in the free queue twice"

    refs: Counter[int] = Counter()
    group_of: dict[int, int] = {}
    for group_id, single in enumerate(manager.coordinator.single_type_managers):
        for seq_id, blocks in single.req_to_blocks.items():
            ids = [b.block_id for b in blocks if not b.is_null]
            assert len(set(ids)) == len(ids), f"sequence {seq_id} holds a block twice: {ids}"
            assert all(b is pool.blocks[b.block_id] for b in blocks), f"sequence {seq_id} holds a foreign block"
            num_null = len(blocks) - len(ids)
            assert not num_null or (hasattr(single, "sliding_window") and all(b.is_null for b in blocks[:num_null])), (
                f"sequence {seq_id} holds the null block in group {group_id} outside a window's head")
            refs.update(ids)
            group_of.update(dict.fromkeys(ids, group_id))

    null = pool.null_block
    assert null.block_id == 0 and null.is_null, "block 0 is not the null block"
    assert 0 not in in_queue, "the null block is in the free queue"
    for block in pool.blocks[1:]:
        if block.block_id in in_queue:
            assert block.ref_cnt == 0, f"block {block.block_id} is free with ref_cnt {block.ref_cnt}"
        else:
            assert block.ref_cnt > 0, f"block {block.block_id} is neither free nor held"
        assert block.ref_cnt == refs[block.block_id], (
            f"block {block.block_id}: ref_cnt {block.ref_cnt}, held by {refs[block.block_id]} tables")

    hashed = {b.block_id for b in pool.blocks if b.block_hash is not None}
    mapped = set()
    for block_hash, blocks in pool.cached_block_hash_to_block.items():
        assert blocks, "an empty entry in the hash map"
        for block_id, block in blocks.items():
            assert block.block_id == block_id and block.block_hash == block_hash, (
                f"hash map entry for block {block_id} does not match its hash")
            mapped.add(block_id)
    assert mapped == hashed, f"blocks with a hash {sorted(hashed)} differ from the hash map's {sorted(mapped)}"
    assert set(pool.cached_block_group_ids) == hashed, "the cached blocks' groups do not match the hash map"
    for block_id, group_id in pool.cached_block_group_ids.items():
        assert group_of.get(block_id, group_id) == group_id, f"block {block_id} is cached for another group"
    if not manager.enable_caching:
        assert not hashed, "blocks were hashed with prefix caching off"

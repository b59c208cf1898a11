"""The reducer checked against the engine: a ReducerState fed only a block manager's events holds
that manager's picture (tests/test_block_manager*.py, tests/test_v1_kv_cache_manager*.py,
tests/test_engine_v1.py and the engines' correctness tests call these after every operation).
"""

from __future__ import annotations

from blockviz.model.reducer import CACHED, NULL, USED, ReducerState, state_code
from engine.v1.kv_cache_utils import external_block_hash


def check_state_codes(reducer: ReducerState) -> None:
    """The state codes and hashed GPU blocks a ReducerState keeps as events arrive equal the ones
    recomputed from its blocks (state_code of each)."""
    for device, pool in reducer.pools.items():
        assert reducer.block_codes(device) == "".join(map(state_code, pool)), f"{device} state codes differ from its blocks'"
    assert reducer.hashed_gpu_blocks == {b.number for b in reducer.pools["gpu"] if b.block_hash is not None}, (
        "the hashed GPU blocks differ from the blocks holding a hash")


def check_reducer_matches(reducer, manager) -> None:
    """A ReducerState fed only the manager's events holds the manager's picture: block tables,
    ref counts, owners, tokens, free / used / free-but-cached blocks and the hash map."""
    assert reducer.tables == {
        seq_id: [(b.device.value, b.block_number) for b in table]
        for seq_id, table in manager.block_tables.items()
    }, "reducer's block tables differ from the manager's"
    for allocator in (manager.gpu_allocator, manager.cpu_allocator):
        device = allocator.device.value
        pool = reducer.pools[device]
        assert [b.ref_count for b in pool] == [b.ref_count for b in allocator.blocks], (
            f"reducer's {device} ref counts differ from the manager's"
        )
        assert reducer.num_free(device) == allocator.get_num_free_blocks()
        for view, block in zip(pool, allocator.blocks):
            if block.ref_count:
                assert view.state == USED and view.token_ids == block.token_ids, (
                    f"{device} block {block.block_number}: reducer {view.state} {view.token_ids}, "
                    f"manager {block.token_ids}"
                )
                owners = {s for s, t in manager.block_tables.items() if block in t}
                assert view.owners == owners, f"{device} block {block.block_number} owners differ"
    if manager.enable_caching:
        for allocator, hash_map in ((manager.gpu_allocator, reducer.hash_map), (manager.cpu_allocator, reducer.cpu_hash_map)):
            device = allocator.device.value
            cached = {b.block_number for b in allocator.evictable.values()}
            assert {b.number for b in reducer.pools[device] if b.state == CACHED} == cached, (
                f"reducer's free-but-cached {device} blocks differ from the manager's")
            assert hash_map == {h: b.block_number for h, b in allocator.cached_blocks.items()}, (
                f"reducer's {device} hash map differs from the manager's")
    check_state_codes(reducer)


def check_reducer_matches_v1(reducer, manager) -> None:
    """The same for vLLM v1's KVCacheManager (engine/v1/): each KV-cache group's block tables (the
    null block where a window let a block go), ref counts, owners and every block's group, the
    null block, free / used / free-but-cached blocks, the free queue's order and the hash map
    (each hash's first cached block, and per group the block a lookup returns)."""
    pool = manager.block_pool
    managers = manager.coordinator.single_type_managers
    group_of: dict[int, int] = dict(pool.cached_block_group_ids)
    for group, single in enumerate(managers):
        assert reducer.tables_of(group) == {
            seq_id: [("gpu", b.block_id) for b in blocks] for seq_id, blocks in single.req_to_blocks.items()
        }, f"reducer's block tables differ from the manager's in group {group}"
        for blocks in single.req_to_blocks.values():
            group_of.update((b.block_id, group) for b in blocks if not b.is_null)
    view = reducer.pools["gpu"]
    assert view[0].state == NULL, "block 0 is not shown as the null block"
    assert [b.ref_count for b in view[1:]] == [b.ref_cnt for b in pool.blocks[1:]], "ref counts differ"
    assert reducer.num_free("gpu") == pool.get_num_free_blocks()
    assert reducer.free_queue == [b.block_id for b in pool.free_block_queue], (
        f"free queue: reducer {reducer.free_queue}, manager {[b.block_id for b in pool.free_block_queue]}")
    for block in pool.blocks[1:]:
        shown = view[block.block_id]
        if block.ref_cnt:
            owners = {s for single in managers for s, t in single.req_to_blocks.items() if any(b is block for b in t)}
            assert shown.state == USED and shown.owners == owners, f"block {block.block_id} differs"
        else:
            assert shown.state == (CACHED if block.block_hash is not None else "free"), (
                f"free block {block.block_id}: reducer {shown.state}")
        if block.block_id in group_of:
            assert shown.group == group_of[block.block_id], (
                f"block {block.block_id}: reducer's group {shown.group}, manager's {group_of[block.block_id]}")
    expected = {external_block_hash(h): next(iter(blocks)) for h, blocks in pool.cached_block_hash_to_block.items()}
    assert reducer.hash_map == expected, "reducer's hash map differs from the manager's"
    for block_hash in pool.cached_block_hash_to_block:
        for group in range(len(managers)):
            found = pool.get_cached_block(block_hash, group)
            assert reducer.cached_block(external_block_hash(block_hash), group) == (found and found.block_id), (
                f"a lookup in group {group} differs")
    check_state_codes(reducer)

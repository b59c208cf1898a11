"""check_invariants(manager): the properties a BlockSpaceManager must keep after every operation.

Used by the hypothesis stateful tests and by the engine tests after every step. Raises
AssertionError naming the first broken invariant.
"""

from __future__ import annotations

from collections import Counter

from engine.block import Device
from engine.block_allocator import CachedBlockAllocator


def check_invariants(manager) -> None:
    """Ref counts equal table references; free and used blocks partition each pool; the hash map
    points only at matching blocks; no block table mixes devices."""
    refs: dict[Device, Counter] = {Device.GPU: Counter(), Device.CPU: Counter()}
    for seq_id, table in manager.block_tables.items():
        devices = {block.device for block in table}
        assert len(devices) <= 1, f"sequence {seq_id}'s block table mixes devices: {devices}"
        numbers = [block.block_number for block in table]
        assert len(set(numbers)) == len(numbers), f"sequence {seq_id} holds a block twice: {numbers}"
        for block in table:
            refs[block.device][block.block_number] += 1

    for allocator in (manager.gpu_allocator, manager.cpu_allocator):
        device = allocator.device
        free_list = list(allocator.free_block_numbers)
        assert len(set(free_list)) == len(free_list), f"{device.value} free list has duplicates"
        evictable = set(getattr(allocator, "evictable", {}))
        free = set(free_list) | evictable
        assert not set(free_list) & evictable, f"{device.value}: block both free and cached-free"
        for block in allocator.blocks:
            expected = refs[device][block.block_number]
            assert block.ref_count == expected, (
                f"{device.value} block {block.block_number}: ref_count {block.ref_count} but "
                f"{expected} table reference(s)"
            )
            in_use = block.ref_count > 0
            assert in_use != (block.block_number in free), (
                f"{device.value} block {block.block_number}: ref_count {block.ref_count} but "
                f"{'on' if block.block_number in free else 'off'} the free lists"
            )
        assert len(free) == allocator.get_num_free_blocks()

        if isinstance(allocator, CachedBlockAllocator):
            for block_hash, block in allocator.cached_blocks.items():
                assert block.block_hash == block_hash, (
                    f"hash map entry {block_hash:x} points at block {block.block_number} "
                    f"whose hash is {block.block_hash}"
                )
                assert len(block.token_ids) == allocator.block_size, (
                    f"hashed block {block.block_number} is not full: {block.token_ids}"
                )
            for number, block in allocator.evictable.items():
                assert allocator.is_registered(block) and block.computed, (
                    f"cached-free block {number} is not a registered, computed block"
                )

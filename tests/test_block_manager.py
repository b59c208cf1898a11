"""Block-manager scenarios ported from vLLM v0's tests/core/test_block_manager.py, plus the prefix
cache (seed 002) and bad input. Pure Python: no torch."""

from __future__ import annotations

import itertools

import pytest

from engine import AllocStatus, BlockSpaceManager, EventBus, Sequence, SequenceGroup, SequenceStatus
from engine.block_allocator import compute_block_hash
from engine.events import BlockAllocated, SlotAppended
from reducer_checks import check_reducer_matches
from engine.invariants import check_invariants
from blockviz.model.reducer import ReducerState

_ids = itertools.count()


def make_group(prompt_len: int, block_size: int, *, tokens=None, n_seqs: int = 1, request_id=None):
    tokens = list(tokens) if tokens is not None else list(range(prompt_len))
    seqs = [Sequence(next(_ids), tokens, block_size) for _ in range(n_seqs)]
    return SequenceGroup(request_id or f"r{seqs[0].seq_id}", seqs)


def run(group: SequenceGroup, manager: BlockSpaceManager) -> None:
    manager.allocate(group)
    for seq in group.get_seqs():
        seq.status = SequenceStatus.RUNNING
    for seq in group.get_seqs():
        manager.mark_blocks_as_computed(seq)


def test_can_allocate_single_block_prompts_until_not_ok():
    block_size, num_gpu_blocks = 4, 16
    manager = BlockSpaceManager(block_size, num_gpu_blocks, 0, watermark=0.0)
    for _ in range(num_gpu_blocks):
        group = make_group(block_size, block_size)
        assert manager.can_allocate(group) is AllocStatus.OK
        manager.allocate(group)
    assert manager.can_allocate(make_group(block_size, block_size)) is AllocStatus.LATER
    assert manager.get_num_free_gpu_blocks() == 0


def test_can_allocate_with_watermark():
    block_size, num_gpu_blocks, watermark = 4, 100, 0.1
    manager = BlockSpaceManager(block_size, num_gpu_blocks, 0, watermark=watermark)
    watermark_blocks = int(watermark * num_gpu_blocks)
    num_allocated = 0
    while True:
        group = make_group(block_size, block_size)
        status = manager.can_allocate(group)
        if status is not AllocStatus.OK:
            break
        manager.allocate(group)
        num_allocated += 1
    assert status is AllocStatus.LATER
    assert manager.get_num_free_gpu_blocks() == watermark_blocks
    assert num_allocated == num_gpu_blocks - watermark_blocks
    # A prompt that would eat into the watermark even on an empty pool is never admitted.
    too_big = make_group(block_size * (num_gpu_blocks - watermark_blocks + 1), block_size)
    assert manager.can_allocate(too_big) is AllocStatus.NEVER


def test_allocate_shares_prompt_blocks_across_waiting_seqs():
    manager = BlockSpaceManager(4, 8, 0, watermark=0.0)
    group = make_group(6, 4, n_seqs=3)
    manager.allocate(group)
    tables = [manager.get_block_table(seq) for seq in group.get_seqs()]
    assert tables[0] == tables[1] == tables[2]
    assert [manager.gpu_allocator.blocks[b].ref_count for b in tables[0]] == [3, 3]
    assert manager.get_num_free_gpu_blocks() == 6
    check_invariants(manager)


def test_append_slots_needs_no_block_until_block_fills():
    block_size = 4
    manager = BlockSpaceManager(block_size, 10, 0, watermark=0.0)
    group = make_group(block_size - 1, block_size)
    run(group, manager)
    seq = group.get_seqs()[0]
    free_before = manager.get_num_free_gpu_blocks()
    seq.append_token_id(100)  # fills the first block
    assert manager.can_append_slots(group)
    assert manager.append_slots(seq) == []
    assert manager.get_num_free_gpu_blocks() == free_before
    seq.append_token_id(101)  # needs a second block
    assert manager.append_slots(seq) == []
    assert manager.get_num_free_gpu_blocks() == free_before - 1
    assert len(manager.get_block_table(seq)) == 2
    check_invariants(manager)


def test_fork_then_append_gives_one_copy_on_write_pair():
    block_size = 4
    manager = BlockSpaceManager(block_size, 10, 0, watermark=0.0)
    group = make_group(block_size - 1, block_size)
    run(group, manager)
    parent = group.get_seqs()[0]
    child = parent.fork(next(_ids))
    group.add(child)
    manager.fork(parent, child)
    assert manager.get_block_table(parent) == manager.get_block_table(child)
    free_before = manager.get_num_free_gpu_blocks()

    child.append_token_id(7)
    cows = manager.append_slots(child)
    assert len(cows) == 1
    src, dst = cows[0]
    assert src != dst
    assert src == manager.get_block_table(parent)[-1]
    assert dst == manager.get_block_table(child)[-1]
    assert manager.get_num_free_gpu_blocks() == free_before - 1
    assert manager.get_block_table(parent) != manager.get_block_table(child)
    # The parent now owns its last block alone: appending needs no copy.
    parent.append_token_id(8)
    assert manager.append_slots(parent) == []
    check_invariants(manager)


def test_swap_out_and_in_move_exactly_the_table():
    block_size, num_gpu, num_cpu = 4, 8, 8
    manager = BlockSpaceManager(block_size, num_gpu, num_cpu, watermark=0.0)
    group = make_group(block_size * 2 - 1, block_size, n_seqs=1)
    run(group, manager)
    seq = group.get_seqs()[0]
    seq.append_token_id(9)
    manager.append_slots(seq)
    gpu_table = manager.get_block_table(seq)

    gpu_free, cpu_free = manager.get_num_free_gpu_blocks(), manager.get_num_free_cpu_blocks()
    assert manager.can_swap_out(group)
    mapping = manager.swap_out(group)
    assert [src for src, _ in mapping] == gpu_table
    assert manager.get_num_free_gpu_blocks() == gpu_free + len(gpu_table)
    assert manager.get_num_free_cpu_blocks() == cpu_free - len(gpu_table)
    assert manager.get_block_table(seq) == [dst for _, dst in mapping]
    seq.status = SequenceStatus.SWAPPED
    check_invariants(manager)

    cpu_table = manager.get_block_table(seq)
    gpu_free, cpu_free = manager.get_num_free_gpu_blocks(), manager.get_num_free_cpu_blocks()
    assert manager.can_swap_in(group) is AllocStatus.OK
    mapping = manager.swap_in(group)
    assert [src for src, _ in mapping] == cpu_table
    assert manager.get_num_free_gpu_blocks() == gpu_free - len(cpu_table)
    assert manager.get_num_free_cpu_blocks() == cpu_free + len(cpu_table)
    check_invariants(manager)


def test_swap_copies_a_shared_block_once():
    manager = BlockSpaceManager(4, 8, 8, watermark=0.0)
    group = make_group(6, 4)
    run(group, manager)
    parent = group.get_seqs()[0]
    child = parent.fork(next(_ids))
    group.add(child)
    manager.fork(parent, child)
    mapping = manager.swap_out(group)
    assert len(mapping) == 2  # two shared blocks, copied once each
    cpu_table = manager.get_block_table(parent)
    assert cpu_table == manager.get_block_table(child)
    assert [manager.cpu_allocator.blocks[b].ref_count for b in cpu_table] == [2, 2]
    check_invariants(manager)


def test_with_prefix_caching_a_swap_revives_the_blocks_its_hashes_left_cached_in_either_pool():
    """vLLM v0 _swap_block_table allocates each destination by the source block's hash: a swap-in
    takes back the GPU blocks its swap-out left free but cached (no eviction, no copy), and a
    second swap-out takes back the CPU blocks the swap-in left cached."""
    from blockviz.model.trace_check import TraceChecker
    from engine.events import BlockEvicted, RequestAdded, SwappedIn, SwappedOut

    block_size, num_gpu, num_cpu = 4, 6, 6
    bus = EventBus()
    events = []
    bus.subscribe(events.append)
    checker = TraceChecker(block_size, num_gpu, num_cpu)
    reducer = ReducerState(block_size, num_gpu, num_cpu)
    manager = BlockSpaceManager(block_size, num_gpu, num_cpu, watermark=0.0, enable_caching=True, events=bus)
    group = make_group(block_size * 2 + 1, block_size)  # two full, hashed blocks and one partly filled
    seq = group.get_seqs()[0]
    bus.emit(RequestAdded, request_id=group.request_id, seq_ids=(seq.seq_id,), prompt="",
             prompt_token_ids=tuple(seq.get_token_ids()), prompt_tokens_text=(), n=1, max_tokens=8)
    run(group, manager)
    gpu_table = manager.get_block_table(seq)

    copied_out = manager.swap_out(group)
    seq.status = SequenceStatus.SWAPPED
    assert len(copied_out) == 3  # nothing on the CPU held these hashes yet
    assert {b.block_number for b in manager.gpu_allocator.evictable.values()} == set(gpu_table[:2])
    copied_in = manager.swap_in(group)
    seq.status = SequenceStatus.RUNNING
    assert manager.get_block_table(seq)[:2] == gpu_table[:2]  # the cached blocks, taken back by hash
    assert [dst for _, dst in copied_in] == manager.get_block_table(seq)[2:]  # only the unhashed one copied
    cpu_cached = {b.block_number for b in manager.cpu_allocator.evictable.values()}
    assert len(cpu_cached) == 2
    copied_out = manager.swap_out(group)
    assert set(manager.get_block_table(seq)[:2]) == cpu_cached and len(copied_out) == 1

    swaps = [e for e in events if isinstance(e, (SwappedOut, SwappedIn))]
    assert [len(e.revived) for e in swaps] == [0, 2, 2]
    assert set(swaps[1].revived) == set(gpu_table[:2]) and set(swaps[2].revived) == cpu_cached
    assert not any(isinstance(e, BlockEvicted) for e in events)
    for e in events:
        checker.check(e)
        reducer.apply(e)
    check_invariants(manager)
    check_reducer_matches(reducer, manager)


def test_a_swap_in_shares_a_block_in_use_with_its_hash():
    """vLLM v0 CachedBlockAllocator.allocate returns the block in use with that hash, one more
    reference: a request swapped in beside another holding its opening shares that block."""
    manager = BlockSpaceManager(4, 8, 8, watermark=0.0, enable_caching=True)
    first = make_group(9, 4, tokens=range(9))
    run(first, manager)
    manager.swap_out(first)
    first.get_seqs()[0].status = SequenceStatus.SWAPPED
    second = make_group(9, 4, tokens=[*range(8), 99])
    run(second, manager)  # hits the two cached blocks the swap-out left
    shared = manager.get_block_table(second.get_seqs()[0])[:2]
    manager.swap_in(first)
    assert manager.get_block_table(first.get_seqs()[0])[:2] == shared
    assert [manager.gpu_allocator.blocks[b].ref_count for b in shared] == [2, 2]
    check_invariants(manager)


def test_free_returns_every_block_and_forgets_the_table():
    manager = BlockSpaceManager(4, 8, 0, watermark=0.0)
    group = make_group(10, 4)
    run(group, manager)
    seq = group.get_seqs()[0]
    before = manager.get_num_free_gpu_blocks()
    num_blocks = len(manager.get_block_table(seq))
    manager.free(seq)
    assert manager.get_num_free_gpu_blocks() == before + num_blocks == 8
    with pytest.raises(KeyError):
        manager.get_block_table(seq)
    check_invariants(manager)


def test_prefix_cache_hits_leading_blocks_but_never_the_last():
    block_size = 4
    manager = BlockSpaceManager(block_size, 16, 0, watermark=0.0, enable_caching=True)
    prefix = list(range(100, 100 + 3 * block_size))  # three full blocks
    first = make_group(0, block_size, tokens=prefix + [1, 2])
    run(first, manager)
    second = make_group(0, block_size, tokens=prefix + [3])
    manager.allocate(second)
    t1 = manager.get_block_table(first.get_seqs()[0])
    t2 = manager.get_block_table(second.get_seqs()[0])
    assert t2[:3] == t1[:3]
    assert [manager.gpu_allocator.blocks[b].ref_count for b in t2[:3]] == [2, 2, 2]
    assert t2[3] != t1[3]
    assert second.get_seqs()[0].num_cached_tokens == 3 * block_size

    # A prompt that is exactly the cached three blocks: its last block is recomputed, not hit.
    third = make_group(0, block_size, tokens=prefix)
    manager.allocate(third)
    t3 = manager.get_block_table(third.get_seqs()[0])
    assert t3[:2] == t1[:2] and t3[2] != t1[2]
    assert third.get_seqs()[0].num_cached_tokens == 2 * block_size
    check_invariants(manager)


def test_requests_allocated_in_one_step_share_a_common_prefix_before_it_is_computed():
    """vLLM v0 / nano-vllm: a registered full block hits at once, K/V written or not."""
    block_size, num_blocks = 4, 8
    bus = EventBus()
    reducer = ReducerState(block_size, num_blocks, 0)
    bus.subscribe(reducer.apply)
    manager = BlockSpaceManager(block_size, num_blocks, 0, watermark=0.0, enable_caching=True, events=bus)
    prefix = list(range(100, 100 + 3 * block_size))  # three full blocks in common
    a = make_group(0, block_size, tokens=prefix + [1, 2, 3, 4])
    b = make_group(0, block_size, tokens=prefix + [5, 6, 7, 8])
    manager.allocate(a)  # no step between: a's blocks hold no K/V yet
    manager.allocate(b)
    ta, tb = manager.get_block_table(a.get_seqs()[0]), manager.get_block_table(b.get_seqs()[0])
    assert tb[:3] == ta[:3] and tb[3] != ta[3]
    assert [manager.gpu_allocator.blocks[n].ref_count for n in ta] == [2, 2, 2, 1]
    assert b.get_seqs()[0].num_cached_tokens == 3 * block_size
    assert len(manager.gpu_allocator.cached_blocks) == 5  # each hash registered once
    check_invariants(manager)
    check_reducer_matches(reducer, manager)
    assert [reducer.pools["gpu"][n].ref_count for n in tb] == [2, 2, 2, 1]

    # The step's forward writes them. Another request holds two blocks throughout, so once a and b
    # are freed the free blocks are the five cached ones and one that never held a hash.
    for group in (a, b):
        for seq in group.get_seqs():
            manager.mark_blocks_as_computed(seq)
    holder = make_group(0, block_size, tokens=[9] * (2 * block_size - 1))
    run(holder, manager)
    manager.free(a.get_seqs()[0])
    manager.free(b.get_seqs()[0])
    (hashless,) = manager.gpu_allocator.free_block_numbers
    assert sorted(x.block_number for x in manager.gpu_allocator.evictable.values()) == sorted(ta + tb[3:])
    check_reducer_matches(reducer, manager)

    # A fresh two-block prompt takes the hashless block, then evicts the least recently used
    # cached block: a's fourth (a was freed before b dropped the shared ones; deepest in its chain).
    evicted = []
    bus.subscribe(lambda e: evicted.append(e.block) if e.type == "block_evicted" else None)
    fresh = make_group(0, block_size, tokens=[7] * (2 * block_size))
    manager.allocate(fresh)
    assert manager.get_block_table(fresh.get_seqs()[0]) == [hashless, ta[3]]
    assert evicted == [ta[3]]
    # The rest of the chain still hits.
    again = make_group(0, block_size, tokens=prefix + [9])
    manager.allocate(again)
    assert manager.get_block_table(again.get_seqs()[0])[:3] == ta[:3]
    assert again.get_seqs()[0].num_cached_tokens == 3 * block_size
    check_invariants(manager)
    check_reducer_matches(reducer, manager)


def test_eviction_heap_stays_bounded_when_cached_blocks_are_revived_over_and_over():
    block_size = 2
    manager = BlockSpaceManager(block_size, 12, 0, watermark=0.0, enable_caching=True)
    prefix = list(range(10 * block_size))  # a 10-block shared opening
    for _ in range(2_000):
        group = make_group(0, block_size, tokens=prefix + [1])
        run(group, manager)
        manager.free(group.get_seqs()[0])
    allocator = manager.gpu_allocator
    assert len(allocator.evictable) == 10
    assert len(allocator._evict_heap) <= 2 * len(allocator.evictable) + 16 + 10
    # LRU order still right after compactions: a filler evicts the prefix deepest-first.
    evicted = []
    manager.events.subscribe(lambda e: evicted.append(e.block_hash) if e.type == "block_evicted" else None)
    run(make_group(0, block_size, tokens=[50 + i for i in range(12 * block_size)]), manager)
    chain = []
    parent = None
    for i in range(10):
        parent = compute_block_hash(tuple(prefix[i * block_size:(i + 1) * block_size]), parent)
        chain.append(parent)
    assert evicted == chain[::-1]
    check_invariants(manager)


def test_freed_cached_blocks_are_reused_then_evicted_in_lru_order():
    block_size, num_blocks = 2, 6
    manager = BlockSpaceManager(block_size, num_blocks, 0, watermark=0.0, enable_caching=True)
    old = make_group(0, block_size, tokens=[1, 2, 3, 4, 5])  # blocks: [1,2] [3,4] [5]
    run(old, manager)
    newer = make_group(0, block_size, tokens=[7, 8, 9])  # blocks: [7,8] [9]
    run(newer, manager)
    old_table = manager.get_block_table(old.get_seqs()[0])
    newer_table = manager.get_block_table(newer.get_seqs()[0])
    manager.free(old.get_seqs()[0])
    manager.free(newer.get_seqs()[0])
    assert manager.get_num_free_gpu_blocks() == num_blocks
    # Free-but-cached: the same prefix is a hit again, revived from the evictor.
    again = make_group(0, block_size, tokens=[1, 2, 3, 4, 6])
    manager.allocate(again)
    assert manager.get_block_table(again.get_seqs()[0])[:2] == old_table[:2]
    manager.free(again.get_seqs()[0])

    bus = manager.events
    evicted = []
    bus.subscribe(lambda e: evicted.append(e.block) if e.type == "block_evicted" else None)
    filler = make_group(0, block_size, tokens=list(range(50, 50 + 6 * block_size)))
    manager.allocate(filler)
    # Unhashed free blocks go first, then cached ones from least to most recently used; within one
    # free() the block with more hashed tokens (deeper in the chain) is evicted first.
    assert evicted == [newer_table[0], old_table[1], old_table[0]]
    check_invariants(manager)


def test_block_hash_is_chained_xxh64():
    import xxhash
    from array import array

    parent = compute_block_hash((1, 2, 3, 4), None)
    assert parent == xxhash.xxh64(array("q", [1, 2, 3, 4]).tobytes()).intdigest()
    child = compute_block_hash((5, 6, 7, 8), parent)
    expected = xxhash.xxh64(parent.to_bytes(8, "little") + array("q", [5, 6, 7, 8]).tobytes())
    assert child == expected.intdigest()
    assert compute_block_hash((5, 6, 7, 8), None) != child


def test_hash_collision_is_not_a_hit(monkeypatch):
    import engine.block_manager as bm

    monkeypatch.setattr(bm, "compute_block_hash", lambda token_ids, parent: 42)
    manager = BlockSpaceManager(2, 8, 0, watermark=0.0, enable_caching=True)
    a = make_group(0, 2, tokens=[1, 2, 3])
    run(a, manager)
    b = make_group(0, 2, tokens=[9, 9, 3])
    manager.allocate(b)
    assert b.get_seqs()[0].num_cached_tokens == 0
    assert manager.get_block_table(b.get_seqs()[0])[0] != manager.get_block_table(a.get_seqs()[0])[0]


# ---------------------------------------------------------------- bad input


def test_bad_configuration_is_rejected():
    with pytest.raises(ValueError, match="block_size"):
        BlockSpaceManager(0, 4, 4)
    with pytest.raises(ValueError, match="block_size"):
        BlockSpaceManager(-2, 4, 4)
    with pytest.raises(ValueError, match="pool sizes"):
        BlockSpaceManager(4, -1, 4)
    with pytest.raises(ValueError, match="pool sizes"):
        BlockSpaceManager(4, 4, -1)
    with pytest.raises(ValueError, match="block_size"):
        Sequence(1, [1, 2], 0)


def _snapshot(manager):
    return (
        {k: [b.block_number for b in v] for k, v in manager.block_tables.items()},
        [b.ref_count for b in manager.gpu_allocator.blocks],
        list(manager.gpu_allocator.free_block_numbers),
    )


def test_double_free_and_unknown_sequence_raise_without_corrupting_state():
    manager = BlockSpaceManager(4, 8, 0, watermark=0.0)
    group = make_group(5, 4)
    run(group, manager)
    seq = group.get_seqs()[0]
    other = make_group(3, 4)
    run(other, manager)
    manager.free(seq)
    before = _snapshot(manager)
    with pytest.raises(KeyError, match=f"sequence {seq.seq_id}"):
        manager.free(seq)
    with pytest.raises(KeyError, match="sequence 987654"):
        manager.free(Sequence(987654, [1], 4))
    assert _snapshot(manager) == before
    block = manager.gpu_allocator.blocks[manager.get_block_table(other.get_seqs()[0])[0]]
    manager.free(other.get_seqs()[0])
    with pytest.raises(ValueError, match="Double free"):
        manager.gpu_allocator.free(block, 0)
    after = _snapshot(manager)
    with pytest.raises(ValueError, match="Double free"):
        manager.gpu_allocator.free(block, 0)
    assert _snapshot(manager) == after
    check_invariants(manager)


def test_appending_to_a_finished_sequence_raises():
    seq = Sequence(1, [1, 2, 3], 4)
    seq.status = SequenceStatus.FINISHED_STOPPED
    with pytest.raises(ValueError, match="finished"):
        seq.append_token_id(5)
    assert seq.get_len() == 3


def test_allocating_twice_or_beyond_the_pool_raises_cleanly():
    manager = BlockSpaceManager(4, 2, 0, watermark=0.0)
    group = make_group(4, 4)
    manager.allocate(group)
    before = _snapshot(manager)
    with pytest.raises(ValueError, match="already has a block table"):
        manager.allocate(group)
    big = make_group(12, 4)
    assert manager.can_allocate(big) is AllocStatus.NEVER
    with pytest.raises(ValueError, match="cannot allocate"):
        manager.allocate(big)
    assert _snapshot(manager) == before


# ---------------------------------------------------------------- events


def test_events_rebuild_the_state_and_round_trip_through_json():
    from engine.events import event_from_json

    bus = EventBus()
    received = []
    bus.subscribe(received.append)
    manager = BlockSpaceManager(2, 6, 4, watermark=0.0, enable_caching=True, events=bus)
    group = make_group(0, 2, tokens=[1, 2, 3])
    run(group, manager)
    parent = group.get_seqs()[0]
    child = parent.fork(next(_ids))
    group.add(child)
    manager.fork(parent, child)
    child.append_token_id(4)
    manager.append_slots(child)
    manager.swap_out(group)
    types = [e.type for e in received]
    assert types[:3] == ["block_allocated", "block_hashed", "block_allocated"]
    assert "fork" in types and "copy_on_write" in types and "swap_out" in types
    assert [e.seq_no for e in received] == list(range(len(received)))
    for event in received:
        assert event_from_json(event.to_json()) == event
    state = ReducerState(2, 6, 4).apply_all(received)
    assert state.tables == {
        seq_id: [(b.device.value, b.block_number) for b in table]
        for seq_id, table in manager.block_tables.items()
    }


def test_raising_subscriber_is_detached_and_engine_goes_on():
    bus = EventBus()
    good = []

    def bad(event):
        raise RuntimeError("broken view")

    bus.subscribe(bad)
    bus.subscribe(good.append)
    manager = BlockSpaceManager(4, 4, 0, watermark=0.0, events=bus)
    group = make_group(5, 4)
    manager.allocate(group)
    assert len(good) == 2 and bus.num_subscribers == 1
    assert len(bus.errors) == 1 and isinstance(bus.errors[0][1], RuntimeError)
    assert manager.get_num_free_gpu_blocks() == 2


def test_unsubscribed_bus_builds_no_events(monkeypatch):
    import engine.events as events_module

    bus = EventBus()
    unsubscribe = bus.subscribe(lambda e: None)
    unsubscribe()
    assert not bus.active
    built = []
    monkeypatch.setattr(events_module.EventBus, "emit", lambda self, cls, **fields: built.append(cls))
    monkeypatch.setattr(events_module.EventBus, "publish", lambda self, event: built.append(type(event)))
    manager = BlockSpaceManager(4, 4, 0, watermark=0.0, events=bus)
    group = make_group(5, 4)
    run(group, manager)
    seq = group.get_seqs()[0]
    for token in range(4):  # fills the second block, then needs a third
        seq.append_token_id(token)
        manager.append_slots(seq)
    manager.free(seq)
    assert built == []
    bus.subscribe(lambda e: None)  # the same run with a subscriber does build them
    group = make_group(5, 4)
    run(group, manager)
    seq = group.get_seqs()[0]
    seq.append_token_id(7)
    manager.append_slots(seq)
    assert SlotAppended in built
    for token in range(4):  # and the block a decode slot opens
        seq.append_token_id(token)
        manager.append_slots(seq)
    assert BlockAllocated in built


def test_events_are_frozen_structs_of_plain_values():
    import copy
    import pickle

    import msgspec

    event = SlotAppended(3, seq_id=1, device="gpu", logical_index=0, block=5, offset=2, token_id=42)
    assert isinstance(event, msgspec.Struct) and event.type == "slot_appended"
    assert [f.name for f in msgspec.structs.fields(event)] == [
        "seq_no", "seq_id", "device", "logical_index", "block", "offset", "token_id"]
    assert (event.seq_no, event.block, event.token_id) == (3, 5, 42)
    with pytest.raises(AttributeError):
        event.block = 6
    with pytest.raises(AttributeError):
        event.extra = 1
    assert not hasattr(event, "__dict__")
    assert pickle.loads(pickle.dumps(event)) == event == copy.deepcopy(event)
    moved = msgspec.structs.replace(event, block=6)
    assert moved.block == 6 and event.block == 5 and moved != event
    assert repr(event).startswith("SlotAppended(seq_no=3, seq_id=1,")
    assert event.to_dict() == {"type": "slot_appended", "seq_no": 3, "seq_id": 1, "device": "gpu",
                               "logical_index": 0, "block": 5, "offset": 2, "token_id": 42}
    # field values in declaration order build the same event as values by name
    built = SlotAppended(3, 1, "gpu", 0, 5, 2, 42)
    assert type(built) is SlotAppended and built == event and hash(built) == hash(event)
    with pytest.raises(TypeError, match="Missing required argument 'token_id'"):
        SlotAppended(3, 1, "gpu", 0, 5, 2)
    with pytest.raises(TypeError, match="Unexpected keyword argument 'colour'"):
        SlotAppended(3, 1, "gpu", 0, 5, 2, 42, colour="red")


def test_emit_takes_fields_by_name_and_numbers_events():
    bus = EventBus()
    received = []
    bus.subscribe(received.append)
    with pytest.raises(TypeError):  # fields by name only: a positional emit cannot swap two ints unseen
        bus.emit(SlotAppended, 1, "gpu", 0, 5, 2, 42)
    with pytest.raises(TypeError, match="Missing required argument 'token_id'"):
        bus.emit(SlotAppended, seq_id=1, device="gpu", logical_index=0, block=5, offset=2)
    first = bus.emit(SlotAppended, seq_id=1, device="gpu", logical_index=0, block=5, offset=2, token_id=42)
    second = bus.publish(SlotAppended(next(bus.seq_nos), seq_id=1, device="gpu", logical_index=0, block=5,
                                      offset=3, token_id=43))
    assert received == [first, second] and second.seq_no == first.seq_no + 1 and second.offset == 3


def test_a_sole_subscriber_raising_on_a_decode_slot_is_detached_and_state_is_intact():
    bus = EventBus()
    seen = []

    def picky(event):
        seen.append(event.type)
        if event.type == "slot_appended":
            raise RuntimeError("broken view")

    bus.subscribe(picky)
    manager = BlockSpaceManager(4, 4, 0, watermark=0.0, events=bus)
    group = make_group(5, 4)
    run(group, manager)
    seq = group.get_seqs()[0]
    for token in range(4):
        seq.append_token_id(token)
        assert manager.append_slots(seq) == []
    assert seen.count("slot_appended") == 1 and not bus.active
    assert len(bus.errors) == 1 and bus.errors[0][0] is picky
    assert len(manager.get_block_table(seq)) == 3
    check_invariants(manager)
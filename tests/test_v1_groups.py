"""KV-cache groups in engine/v1 without a model (issue 41, item 2): the layers grouped as vLLM
groups them, a sliding window giving blocks back mid-request (and the reducer following from the
events alone), a prefix hit cut short by the window group, one full-attention group on the unitary
coordinator with one block list, and the step plan and model runner carrying one table per group,
each layer reading its group's."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from blockviz.model.reducer import ReducerState
from engine.events import BlockFreed, EventBus, SequenceFreed
from engine.model_runner import ModelRunner
from engine.scheduler import SchedulerConfig
from engine.sequence import Sequence, SequenceGroup
from engine.v1 import KVCacheManager
from engine.v1.invariants import check_kv_cache_invariants
from engine.v1.kv_cache_coordinator import HybridKVCacheCoordinator, UnitaryKVCacheCoordinator
from engine.v1.kv_cache_interface import (
    FullAttentionSpec,
    KVCacheGroupSpec,
    SlidingWindowSpec,
    get_kv_cache_groups,
    kv_cache_specs,
)
from engine.v1.scheduler import Scheduler

# per layer: None for full attention, else the window
LAYOUTS = {
    "all full": [None] * 4,
    "all one window": [8] * 3,
    "1 full : 1 window": [None, 8] * 3,
    "2 full : 4 windows (1:2)": [None, 8, 8] * 2,
    "Gemma-3-like 5 windows : 1 full": ([8] * 5 + [None]) * 2,
    "gpt-oss-like 12 windows, 13 full": [8, None] * 12 + [None],
    "two windows and full": [None, 8, 16, 8, 16, None],
}


def hybrid(block_size: int, num_gpu_blocks: int, window: int, events: EventBus | None = None) -> KVCacheManager:
    groups = [KVCacheGroupSpec(["0"], FullAttentionSpec(block_size)),
              KVCacheGroupSpec(["1"], SlidingWindowSpec(block_size, sliding_window=window))]
    return KVCacheManager(block_size, num_gpu_blocks, kv_cache_groups=groups, events=events)


@pytest.mark.parametrize("layout", LAYOUTS)
def test_layers_group_as_vllm_groups_them(layout):
    """get_kv_cache_groups gives vLLM 0.33's groups: one group when every layer is alike, else
    _get_kv_cache_groups_uniform_page_size's (same layer names, same order, same kinds)."""
    vllm_interface = pytest.importorskip("vllm.v1.kv_cache_interface")
    planning = pytest.importorskip("vllm.v1.core.kv_cache_planning")
    windows = LAYOUTS[layout]
    ours = get_kv_cache_groups([FullAttentionSpec(4) if w is None else SlidingWindowSpec(4, sliding_window=w)
                                for w in windows])
    shape = dict(block_size=4, num_kv_heads=2, head_size=8, dtype=torch.float16)
    specs = {str(i): vllm_interface.FullAttentionSpec(**shape) if w is None
             else vllm_interface.SlidingWindowSpec(**shape, sliding_window=w) for i, w in enumerate(windows)}
    if planning.is_kv_cache_spec_uniform(specs) or vllm_interface.UniformTypeKVCacheSpecs.from_specs(specs):
        theirs = [(list(specs), getattr(next(iter(specs.values())), "sliding_window", None))]
    else:
        theirs = [(g.layer_names, getattr(g.kv_cache_spec, "sliding_window", None))
                  for g in planning._get_kv_cache_groups_uniform_page_size(specs)]
    assert [(g.layer_names, getattr(g.kv_cache_spec, "sliding_window", None)) for g in ours] == theirs
    assert len(ours) == 1 or layout not in ("all full", "all one window")


def model_config(**fields) -> SimpleNamespace:
    """The fields of a model config (engine.models) that kv_cache_specs reads."""
    return SimpleNamespace(num_kv_heads=2, head_dim=8, **fields)


def test_a_model_config_gives_its_groups():
    """A config's `sliding_windows` (one per layer, None for full attention) gives its groups;
    a config without them (GPT-2) one full-attention group over every layer."""
    groups = get_kv_cache_groups(kv_cache_specs(model_config(num_layers=4, sliding_windows=(None, 8, 8, None)), 4))
    assert [(g.layer_names, type(g.kv_cache_spec).__name__) for g in groups] == [
        (["0", "3"], "FullAttentionSpec"), (["1", "2"], "SlidingWindowSpec")]
    assert groups[1].kv_cache_spec.sliding_window == 8
    (group,) = get_kv_cache_groups(kv_cache_specs(model_config(num_layers=3), 16, torch.float16))
    assert group.layer_names == ["0", "1", "2"]
    assert group.kv_cache_spec == FullAttentionSpec(16, num_kv_heads=2, head_size=8, dtype=torch.float16)
    assert group.kv_cache_spec.page_size_bytes == 2 * 16 * 2 * 8 * 2


def test_one_group_is_unitary_and_hands_out_lists():
    """A full-attention model: the unitary coordinator, and blocks handed out as one list."""
    manager = KVCacheManager(4, 10)
    assert isinstance(manager.coordinator, UnitaryKVCacheCoordinator) and manager.num_kv_cache_groups == 1
    seq = Sequence(0, list(range(9)), 4)
    blocks, num_computed = manager.get_computed_blocks(seq)
    assert blocks == [] and num_computed == 0
    new = manager.allocate_slots(seq, 9, num_computed, blocks)
    assert [b.block_id for b in new] == [1, 2, 3] == manager.get_block_ids(seq)
    assert manager.get_block_ids_per_group(seq) == ([1, 2, 3],)
    assert isinstance(hybrid(4, 10, 4).coordinator, HybridKVCacheCoordinator)


@pytest.mark.parametrize("block_size,window", [(4, 1), (4, 3), (4, 5), (4, 9), (1, 2), (8, 20)])
def test_a_window_lets_blocks_go_mid_request_and_the_reducer_follows(block_size, window):
    """As a request grows one token at a time, its window table holds the null block for every
    block wholly before the window of the next token, the full table holds every block, the
    blocks let go are BlockFreed for the request before it ends, and a reducer fed only the
    events keeps the pool's ref counts and free queue."""
    bus = EventBus()
    events: list = []
    bus.subscribe(events.append)
    reducer = ReducerState(block_size, 40, 0, "v1")
    bus.subscribe(reducer.apply)
    manager = hybrid(block_size, 40, window, bus)
    seq = Sequence(0, [7] * 3, block_size)
    assert manager.allocate_slots(seq, 3) is not None
    seq.num_computed_tokens = 3
    for token in range(30):
        seq.append_token_id(token % 5)
        assert manager.allocate_slots(seq, 1) is not None
        seq.num_computed_tokens += 1
        full, window_table = manager.get_block_ids_per_group(seq)
        num_skipped_blocks = max(0, seq.num_computed_tokens - 1 - window + 1) // block_size
        assert window_table[:num_skipped_blocks] == [0] * num_skipped_blocks and 0 not in window_table[num_skipped_blocks:]
        assert 0 not in full and len(full) == len(window_table)
        check_kv_cache_invariants(manager)
        pool = manager.block_pool
        assert [b.ref_count for b in reducer.pools["gpu"][1:]] == [b.ref_cnt for b in pool.blocks[1:]]
        assert reducer.free_queue == [b.block_id for b in pool.free_block_queue]
    freed_mid_request = [e.block for e in events if isinstance(e, BlockFreed)]
    assert len(freed_mid_request) == window_table.count(0) > 0
    assert all(e.seq_id == 0 and e.ref_count == 0 for e in events if isinstance(e, BlockFreed))
    manager.free(seq)
    assert isinstance(events[-1], SequenceFreed) and reducer.free_queue == [b.block_id for b in pool.free_block_queue]


def test_a_hit_is_cut_short_where_the_window_group_lost_its_tail():
    """Request A (16 tokens, then a decode) lets its window blocks 0-2 go; C's allocation evicts
    window block 2 from the cache while A still holds its full blocks. B shares A's first 12
    tokens: the full group could serve 12 tokens, but the window group (window 4: a hit needs the
    block just before its end) only 8, so the hit is 8 tokens, with the null block where the
    window does not need the prefix. One full-attention group alone serves all 12."""
    prompt = list(range(16))
    hits = {}
    for name, manager in (("hybrid", hybrid(4, 12, 4)), ("full", KVCacheManager(4, 12))):
        a = Sequence(0, prompt, 4)
        assert manager.allocate_slots(a, 16) is not None
        a.num_computed_tokens = 16
        a.append_token_id(99)
        assert manager.allocate_slots(a, 1) is not None
        a.num_computed_tokens = 17
        c = Sequence(1, [50, 51, 52, 53], 4)
        assert manager.allocate_slots(c, 4) is not None
        b = Sequence(2, prompt[:12] + [77], 4)
        blocks, hits[name] = manager.get_computed_blocks(b)
        check_kv_cache_invariants(manager)
        if name == "hybrid":
            a_full, a_window = manager.get_block_ids_per_group(a)
            assert a_window[:3] == [0, 0, 0]  # A's window blocks 0-2 went back to the pool
            hit_full, hit_window = ([block.block_id for block in group] for group in blocks)
            assert hit_full == a_full[:2] and hit_window[0] == 0 and hit_window[1] not in (0, *a_window)
    assert hits == {"hybrid": 8, "full": 12}


def test_the_plan_and_the_runner_carry_one_table_per_group():
    """The v1 scheduler's plan holds each sequence's table in every group (the null block where
    the window let a block go), and the model runner hands each layer the metadata of its group:
    its new tokens' slots lie in that group's blocks."""
    groups = get_kv_cache_groups(kv_cache_specs(model_config(num_layers=4, sliding_windows=(None, 5, 5, None)), 4))
    manager = KVCacheManager(4, 30, max_model_len=64, kv_cache_groups=groups)
    scheduler = Scheduler(SchedulerConfig(4, 64, 64), manager)
    seq = Sequence(0, list(range(10)), 4)
    scheduler.add_seq_group(SequenceGroup("r", [seq]))

    class StandIn:
        """A model that records the metadata each layer is given."""

        def __call__(self, tokens, positions, kv_caches, meta):
            self.meta = meta
            return torch.zeros(len(tokens), 2)

        def compute_logits(self, hidden):
            return hidden

    model = StandIn()
    runner = ModelRunner(model, SimpleNamespace(gpu_cache=None), 4, torch.device("cpu"), "torch", groups)
    for _ in range(12):
        plan = scheduler.schedule()
        (s,) = plan.scheduled
        assert s.block_ids == tuple(map(tuple, manager.get_block_ids_per_group(seq)))
        runner.execute_model(plan)
        assert len(model.meta) == 4
        for layer, layer_group in enumerate((0, 1, 1, 0)):
            table = s.block_ids[layer_group]
            slots = [table[pos // 4] * 4 + pos % 4 for pos in range(s.num_computed_tokens, s.num_tokens)]
            assert model.meta[layer].slot_mapping.tolist() == slots
        scheduler.update_from_output(plan, [[1]])
    full, window = s.block_ids
    assert window[0] == 0 and 0 not in full and full != window

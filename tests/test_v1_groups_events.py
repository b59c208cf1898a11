"""Events and traces of a run with several KV-cache groups (issue 41, item 3).

engine/v1's KVCacheManager over a full-attention and sliding-window groups, driven beside vLLM
0.33's own (tests/test_v1_groups_vs_vllm.py's Differential): after every operation a reducer fed
only our events holds each group's tables (the null block where a window let a block go), every
block's group, the ref counts, free queue and hash map (check_reducer_matches_v1), and what
blockviz publishes for the operation, decoded by vLLM's own decoder, equals vLLM's take_events():
each group's stores with its group_idx, kv_cache_spec_kind and kv_cache_spec_sliding_window, its
removals with its group_idx. A run's events then go through a trace (header with its groups,
version 2), are read back with every event checked, and replay to the same state; the checker
refuses events that break a group's rules. The explainer names a hit cut short by a window group's
lost tail, and the insights count each group's blocks once.
"""

from __future__ import annotations

import json

import msgspec
import pytest

from blockviz.model.design import kv_cache_groups_header, kv_cache_groups_of
from blockviz.model.explain import HIT, LAST_BLOCK, WINDOW_TAIL, explain_requests
from blockviz.model.palette import event_number
from blockviz.model.insights import memory_truth, preemption_ledger
from blockviz.model.reducer import NULL, ReducerState
from reducer_checks import check_reducer_matches_v1
from blockviz.model.trace import TraceError, make_header, read_trace, write_trace
from blockviz.model.trace_check import TraceChecker
from engine import events as ev
from engine.events import EventBus, RequestAdded
from engine.sequence import Sequence
from engine.v1 import KVCacheManager
from engine.v1.kv_cache_interface import FullAttentionSpec, KVCacheGroupSpec, SlidingWindowSpec
from engine.designs import V1, VLLM, get_design


def groups_of(block_size: int, windows: list[int | None]) -> list[KVCacheGroupSpec]:
    return [KVCacheGroupSpec([f"layer.{i}"], FullAttentionSpec(block_size) if w is None
                             else SlidingWindowSpec(block_size, sliding_window=w)) for i, w in enumerate(windows)]


def groups_header(block_size: int, windows: list[int | None]) -> list[dict]:
    """The header's "kv_cache_groups" of these groups (as the engine session writes it)."""
    return kv_cache_groups_header(("full_attention", None, g.layer_names) if w is None
                                  else ("sliding_window", w, g.layer_names)
                                  for g, w in zip(groups_of(block_size, windows), windows))


def header_of(block_size: int, num_blocks: int, windows: list[int | None], **extra) -> dict:
    """A v1 run's header as the engine session writes it (the groups only where there are)."""
    groups = groups_header(block_size, windows)
    return make_header({"block_size": block_size, "num_gpu_blocks": num_blocks, "num_cpu_blocks": 0,
                        "kv_manager": V1.name, "enable_prefix_caching": True,
                        **({"kv_cache_groups": groups} if groups else {})}, **extra)


class Run:
    """A hybrid KVCacheManager with a reducer and a list of its events; requests added as the
    engine adds them (RequestAdded), so a trace of it passes the checker."""

    def __init__(self, block_size: int, num_blocks: int, windows: list[int | None]) -> None:
        self.bus = EventBus()
        self.events: list[ev.Event] = []
        self.bus.subscribe(self.events.append)
        self.header = header_of(block_size, num_blocks, windows)
        self.reducer = ReducerState.from_header(self.header)
        self.bus.subscribe(self.reducer.apply)
        self.manager = KVCacheManager(block_size, num_blocks, kv_cache_groups=groups_of(block_size, windows),
                                      events=self.bus)
        self.block_size = block_size

    def add(self, seq_id: int, prompt: list[int]) -> Sequence:
        self.bus.emit(RequestAdded, request_id=f"r{seq_id}", seq_ids=(seq_id,), prompt="",
                      prompt_token_ids=tuple(prompt), prompt_tokens_text=(), n=1, max_tokens=64)
        return Sequence(seq_id, list(prompt), self.block_size)

    def admit(self, seq: Sequence) -> bool:
        blocks, hit = self.manager.get_computed_blocks(seq)
        if self.manager.allocate_slots(seq, seq.get_len() - hit, hit, blocks) is None:
            return False
        seq.num_computed_tokens = seq.get_len()
        return True

    def decode(self, seq: Sequence, token: int) -> None:
        seq.append_token_id(token)
        assert self.manager.allocate_slots(seq, 1) is not None
        seq.num_computed_tokens += 1


def window_hit_run() -> tuple[Run, dict[str, Sequence]]:
    """tests/test_v1_groups.py's cut-short hit: A (16 tokens, a decode) lets its window blocks
    L0-L2 go (cached, at the free queue's tail); C (9 tokens) takes the 5 fresh blocks and evicts
    window block L2, then ends; B shares A's first 12 tokens and hits 8 of them."""
    run = Run(4, 16, [None, 4])
    prompt = list(range(16))
    a = run.add(0, prompt)
    assert run.admit(a)
    run.decode(a, 99)
    c = run.add(1, list(range(50, 59)))
    assert run.admit(c)
    run.manager.free(c)
    b = run.add(2, prompt[:12] + [77])
    assert run.admit(b)
    return run, {"a": a, "b": b, "c": c}


# ---------------------------------------------------------------- events, reducer, trace


def test_a_one_group_run_writes_its_events_as_before():
    """No `group` on disk for group 0; a full-attention run's header names no groups (version 1)."""
    run = Run(4, 10, [None])
    assert "kv_cache_groups" not in run.header and run.header["version"] == 1
    assert groups_header(4, [None]) == []
    assert run.admit(run.add(0, list(range(9))))
    assert all('"group"' not in event.to_json() for event in run.events)
    assert any(isinstance(event, ev.BlockAllocated) for event in run.events)


def test_hybrid_events_name_their_group_and_the_window_puts_the_null_block_in_its_slots():
    """Every placement, hash and free names its group; a window's BlocksSkipped names the slots
    now null, before the frees of those blocks; the reducer's tables are the manager's per group."""
    run, seqs = window_hit_run()
    assert run.header["version"] == 2 and [g.kind for g in kv_cache_groups_of(run.header)] == [
        "full_attention", "sliding_window"]
    placed = [e for e in run.events if isinstance(e, (ev.BlockAllocated, ev.PrefixCacheHit))]
    assert {e.group for e in placed} == {0, 1}
    (skip,) = [e for e in run.events if isinstance(e, ev.BlocksSkipped)]
    assert (skip.seq_id, skip.group, skip.logical_indices) == (0, 1, (0, 1, 2))
    after = run.events[run.events.index(skip) + 1:][:3]
    assert sorted((e.type, e.block, e.group) for e in after) == sorted(("block_freed", b, 1) for b in skip.blocks)
    check_reducer_matches_v1(run.reducer, run.manager)
    full, window = run.reducer.seq_tables(0)
    assert window[:3] == [("gpu", 0)] * 3 and ("gpu", 0) not in full
    assert all(run.reducer.block("gpu", n).group == 1 for _, n in window[3:])
    assert run.reducer.block("gpu", 0).state == NULL
    hit_full, hit_window = run.reducer.seq_tables(2)
    assert hit_window[0] == ("gpu", 0) and hit_full[:2] == full[:2]  # B's window hit: the null block at its head


def test_the_log_names_a_blocks_group_and_a_windows_null_slots():
    from blockviz.model.narration import describe

    run, _ = window_hit_run()
    skip = next(e for e in run.events if isinstance(e, ev.BlocksSkipped))
    assert describe(skip) == (f"window of seq 0 [group 1] lets go of gpu {','.join(map(str, skip.blocks))}: "
                              "L0, L1, L2 now the null block")
    lines = [describe(e) for e in run.events if isinstance(e, ev.BlockAllocated)]
    assert any(line.endswith("[group 1]") for line in lines) and any("[group" not in line for line in lines)


def test_a_hybrid_trace_round_trips_checked_and_replays_to_the_same_state(tmp_path):
    run, _ = window_hit_run()
    path = tmp_path / "hybrid.jsonl"
    write_trace(path, run.header, run.events)
    assert json.loads(path.read_text().splitlines()[0])["kv_cache_groups"][1] == {
        "kind": "sliding_window", "sliding_window": 4, "layer_names": ["layer.1"]}
    trace = read_trace(path)  # every event checked against the state before it
    assert trace.events == run.events
    replayed = ReducerState.from_header(trace.header).apply_all(trace.events)
    assert replayed.freeze() == run.reducer.freeze()
    assert ReducerState.thaw(replayed.freeze()).seq_tables(0) == run.reducer.seq_tables(0)


def test_a_windows_frees_are_one_operation_and_every_boundary_is_a_state_the_engine_has():
    """BlocksSkipped and the frees it causes are drawn whole (blockviz/model/operation.py); at every
    boundary of a hybrid run each group's tables hold what the ref counts say."""
    from test_operations import walk

    from blockviz.model.timeline import Timeline

    run, _ = window_hit_run()
    timeline = Timeline.for_header(run.header)
    timeline.extend(run.events)
    skip = next(i for i, e in enumerate(run.events) if isinstance(e, ev.BlocksSkipped))
    operation = timeline.operation_at(skip + 1)
    assert operation is not None and operation.kind == "window" and operation.end == skip + 1 + len(run.events[skip].blocks)
    boundaries, inside_wrong = walk(run.events, run.header, timeline)
    assert boundaries >= 10 and inside_wrong > 0  # walk asserted each boundary; inside, the checker sees problems


@pytest.mark.parametrize("field,value,message", [
    ("kv_cache_groups", [{"kind": "full_attention"}], "'kv_cache_groups' must be"),
    ("kv_cache_groups", [{"kind": "sliding_window", "layer_names": ["0"]}], "'kv_cache_groups' must be"),
    ("kv_cache_groups", [{"kind": "full_attention", "sliding_window": 4}, {"kind": "sliding_window",
                                                                         "sliding_window": 4}], "'kv_cache_groups' must be"),
    ("version", 1, "'kv_cache_groups' needs format version 2"),
    ("kv_manager", "v0", "'kv_cache_groups' is for a v1 run"),
])
def test_a_bad_groups_header_is_one_line_naming_the_field(tmp_path, field, value, message):
    header = {**header_of(4, 10, [None, 4]), field: value}
    path = tmp_path / "bad.jsonl"
    path.write_text(json.dumps(header) + "\n")
    with pytest.raises(TraceError, match=message) as raised:
        read_trace(path)
    assert "\n" not in str(raised.value) and "line 1" in str(raised.value)


def _checker_after(run: Run, count: int) -> TraceChecker:
    checker = TraceChecker(4, run.header["num_gpu_blocks"], 0, kv_manager=V1.name,
                           kv_cache_groups=kv_cache_groups_of(run.header))
    for event in run.events[:count]:
        checker.check(event)
    return checker


def _broken(event: ev.Event, **changes) -> ev.Event:
    return msgspec.structs.replace(event, **changes)


@pytest.mark.parametrize("case", ["group out of range", "hit in the other group", "free in the other group",
                                  "skip in a full group", "skip of a slot it does not hold", "hash in the other group"])
def test_the_checker_refuses_events_that_break_a_groups_rules(case):
    run, _ = window_hit_run()
    kinds = {"group out of range": ev.BlockAllocated, "hit in the other group": ev.PrefixCacheHit,
             "free in the other group": ev.BlockFreed, "skip in a full group": ev.BlocksSkipped,
             "skip of a slot it does not hold": ev.BlocksSkipped, "hash in the other group": ev.BlockHashed}
    index, event = next((i, e) for i, e in enumerate(run.events) if type(e) is kinds[case]
                        and getattr(e, "group", 1) == 1)
    bad = {"group out of range": {"group": 2}, "hit in the other group": {"group": 0},
           "free in the other group": {"group": 0}, "skip in a full group": {"group": 0},
           "skip of a slot it does not hold": {"blocks": (event.blocks[0] + 1,) + event.blocks[1:]}
           if isinstance(event, ev.BlocksSkipped) else {},
           "hash in the other group": {"group": 0}}[case]
    checker = _checker_after(run, index)
    with pytest.raises(ValueError):
        checker.check(_broken(event, **bad))
    _checker_after(run, len(run.events))  # the run itself passes


# ---------------------------------------------------------------- explainer and insights


def test_the_explainer_names_a_hit_cut_short_by_the_window_groups_lost_tail():
    """B: the full group holds L0-L2, the window group (window 4: a hit needs the block just before
    its end) lost L2, so 8 tokens hit and L2 is a window-tail miss naming the group, the block and
    the eviction; a one-group reading of the same events would have hit 12."""
    run, _ = window_hit_run()
    explained = explain_requests(run.events, 4, 16, 0, True, "v1", kv_cache_groups=kv_cache_groups_of(run.header))
    b = next(x for x in explained if x.request_id == "r2")
    assert [row.verdict for row in b.blocks[:3]] == [HIT, HIT, WINDOW_TAIL] and b.num_hit_tokens == 8
    miss = b.blocks[2]
    (evicted,) = [e for e in run.events if isinstance(e, ev.BlockEvicted) and e.block_hash == miss.block_hash]
    assert evicted.group == 1 and miss.evicted_by == evicted.seq_no and "group 1 (window 4)" in miss.detail and "L2" in miss.detail
    (slide,) = [e for e in run.events if isinstance(e, ev.BlocksSkipped)]  # A's window slid past L0-L2
    assert miss.freed_by == slide.seq_no != miss.evicted_by  # the slide named, and the eviction apart
    (line,) = [line for line in b.lines() if "window tail freed: group 1" in line]
    assert f"blocks_skipped, event {event_number(slide.seq_no)}" in line
    assert f"block_evicted, event {event_number(evicted.seq_no)}" in line
    a = next(x for x in explained if x.request_id == "r0")
    assert a.num_hit_blocks == 0 and a.blocks[0].verdict != WINDOW_TAIL


def test_a_block_aligned_prompt_still_misses_its_last_block_in_a_hybrid_run():
    """The one-block floor holds with groups: the last block is computed, not a window-tail miss."""
    run = Run(4, 20, [None, 8])
    assert run.admit(run.add(0, list(range(8))))
    assert run.admit(run.add(1, list(range(8))))
    explained = explain_requests(run.events, 4, 20, 0, True, "v1", kv_cache_groups=kv_cache_groups_of(run.header))
    assert [row.verdict for row in explained[1].blocks] == [HIT, LAST_BLOCK]


def test_memory_truth_counts_each_groups_blocks_once_and_window_frees_are_no_preemption():
    run, seqs = window_hit_run()
    truth = memory_truth(run.reducer, {})
    groups = [run.manager.coordinator.single_type_managers[g].req_to_blocks for g in range(2)]
    for seq_id in (0, 2):
        per_group = tuple(sum(not b.is_null for b in groups[g][seq_id]) for g in range(2))
        assert truth.seqs[seq_id].blocks_per_group == per_group and truth.seqs[seq_id].num_blocks == sum(per_group)
    in_use = [b for b in run.manager.block_pool.blocks[1:] if b.ref_cnt]
    assert sum(truth.blocks_per_group.values()) == len(in_use) == truth.pools["gpu"].used_blocks
    assert truth.blocks_per_group[1] < truth.blocks_per_group[0]  # the window gave blocks back
    assert truth.seqs[0].empty_in_last_block == 2 * 3  # 17 tokens: 3 empty slots in each group's last block
    assert preemption_ledger(run.events) == []


def test_a_preemptions_frees_are_counted_per_group_without_the_windows_earlier_frees():
    run, seqs = window_hit_run()
    a = seqs["a"]
    for token in range(3):
        run.decode(a, token)  # more window blocks go
    num_window_frees = sum(1 for e in run.events if isinstance(e, ev.BlockFreed) and e.seq_id == 0)
    run.bus.emit(ev.Preempted, request_id="r0", seq_ids=(0,), mode="recompute", reason="test", num_tokens_lost=20)
    held = [sum(not b.is_null for b in run.manager.coordinator.single_type_managers[g].req_to_blocks[0])
            for g in range(2)]
    run.manager.free(a)
    (entry,) = preemption_ledger(run.events)
    assert entry.blocks_freed_per_group == ((0, held[0]), (1, held[1])) and entry.blocks_freed == sum(held)
    assert num_window_frees > 0


# ---------------------------------------------------------------- against vLLM's own


vllm_groups = pytest.importorskip("test_v1_groups_vs_vllm", reason="vLLM 0.33 is not installed")
kv_events = pytest.importorskip("vllm.distributed.kv_events")

from test_kv_events_v1 import assert_same_kv_events, decoder, recorded  # noqa: E402

from blockviz.kvevents.mapping import V1KVEventMapper  # noqa: E402
from blockviz.kvevents.protocol import encode_batch  # noqa: E402


class GroupEventDifferential(vllm_groups.Differential):
    """Both managers over the same groups; after every operation our reducer equals our manager and
    our published events, through vLLM's decoder, equal vLLM's take_events()."""

    def __init__(self, block_size: int, num_blocks: int, windows: list[int | None], *args, **kwargs) -> None:
        super().__init__(block_size, num_blocks, windows, *args, **kwargs)
        self.theirs.pool.enable_kv_cache_events = True
        header = {"block_size": block_size, "num_gpu_blocks": num_blocks, "num_cpu_blocks": 0, "kv_manager": V1.name,
                  "kv_cache_groups": groups_header(block_size, windows)}
        self.mapper = V1KVEventMapper(block_size, kv_cache_groups_of(header))
        self.reducer = ReducerState.from_header(header)
        self.ours.bus.subscribe(self.mapper)
        self.ours.bus.subscribe(self.reducer.apply)
        self.hash_pairs: dict = {}
        self.reverse_pairs: dict = {}
        self.published: list = []

    def check(self) -> None:
        super().check()
        check_reducer_matches_v1(self.reducer, self.ours.manager)
        ours = decoder.decode(encode_batch(self.mapper.take_events())).events
        theirs = self.theirs.manager.take_events()
        where = self._where("KV events")
        # vLLM's cache_full_blocks stores nothing, yet publishes an empty BlockStored, for a window
        # of one token (its reachable_block_mask masks every block); ours caches none and is silent
        empty = [e for e in theirs if isinstance(e, kv_events.BlockStored) and not e.block_hashes]
        assert all(e.kv_cache_spec_sliding_window == 1 for e in empty), (where, empty)
        assert_same_kv_events(ours, [e for e in theirs if e not in empty], self._pair, where)
        self.published.extend(ours)

    def _pair(self, ours, theirs, where: str) -> None:
        assert self.hash_pairs.setdefault(ours, theirs) == theirs, where
        assert self.reverse_pairs.setdefault(theirs, ours) == ours, where


@pytest.fixture
def group_differential(monkeypatch):
    return recorded(monkeypatch, vllm_groups, GroupEventDifferential)


@pytest.mark.parametrize("layout", vllm_groups.LAYOUTS)
def test_hybrid_reducer_and_kv_events_equal_the_engines_and_vllms_after_every_operation(group_differential, layout):
    """Seeded sequences per layout: the reducer holds our manager's every group, and our events,
    decoded by vLLM, are vLLM's own, group and cache-spec kind included."""
    for seed in range(30):
        vllm_groups.run_sequence(seed, layout)
    published = [e for d in group_differential for e in d.published]
    stored = [e for e in published if isinstance(e, kv_events.BlockStored)]
    if layout != "window":
        assert {e.group_idx for e in stored} >= {0, 1}
        assert {(e.kv_cache_spec_kind, e.kv_cache_spec_sliding_window is None) for e in stored} == {
            ("full_attention", True), ("sliding_window", False)}
    assert any(isinstance(e, kv_events.BlockRemoved) and e.group_idx == (0 if layout == "window" else 1)
               for e in published)


# ---------------------------------------------------------------- a real hybrid checkpoint


@pytest.fixture(scope="module")
def hybrid_llama(tmp_path_factory):
    """A tiny random Llama checkpoint whose layers mix sliding (window 6) and full attention, with
    a tokenizer (save_pretrained into a temp dir), loaded once."""
    import torch
    import transformers
    from conftest import build_tokenizer

    from engine.model_loader import load_model

    tokenizer = build_tokenizer()
    eos = tokenizer.eos_token_id
    config = transformers.LlamaConfig(
        hidden_size=64, intermediate_size=128, num_hidden_layers=4, max_position_embeddings=256, num_attention_heads=4,
        num_key_value_heads=2, layer_types=["sliding_attention", "full_attention", "sliding_attention", "full_attention"],
        sliding_window=6, vocab_size=len(tokenizer), bos_token_id=eos, eos_token_id=eos)
    torch.manual_seed(0)
    path = tmp_path_factory.mktemp("hybrid") / "llama-hybrid"
    transformers.AutoModelForCausalLM.from_config(config).save_pretrained(path)
    tokenizer.save_pretrained(path)
    return path, load_model(path, "cpu", torch.float32)


def check_reducer_matches_vllm_groups(reducer: ReducerState, manager) -> None:
    """A reducer fed only the event tap's events holds vLLM's own manager's picture: each group's
    tables (vLLM's req_to_blocks, the null block where its window let a block go), every held
    block's group, the ref counts and the free queue."""
    pool = manager.block_pool
    for group, single in enumerate(manager.coordinator.single_type_managers):
        tables = {int(r): [("gpu", b.block_id) for b in blocks] for r, blocks in single.req_to_blocks.items() if blocks}
        assert reducer.tables_of(group) == tables, f"group {group}'s tables differ from vLLM's"
        for blocks in single.req_to_blocks.values():
            assert all(reducer.block("gpu", b.block_id).group == group for b in blocks if not b.is_null)
    assert [b.ref_count for b in reducer.pools["gpu"][1:]] == [b.ref_cnt for b in pool.blocks[1:]]
    assert reducer.free_queue == [b.block_id for b in pool.free_block_queue.get_all_free_blocks()]


@pytest.mark.parametrize("kv_manager", [V1.name, VLLM.name])
def test_a_hybrid_llama_run_through_the_engine_keeps_the_reducer_equal_and_its_trace_round_trips(
        hybrid_llama, tmp_path, kv_manager):
    """LLMEngine on a checkpoint with sliding and full layers, under engine/v1 and under vLLM's own
    hybrid manager (the event tap): two KV-cache groups; after every step a reducer fed only the
    engine's events holds each group's tables and every block's group; the window lets blocks go
    mid-request and a shared prompt hits the cache in both groups; the run's trace (the session's
    header, naming the groups) is read back checked and replays to the same state."""
    from blockviz.session.engine_session import trace_header
    from engine import SamplingParams
    from engine.config import EngineConfig
    from engine.llm_engine import LLMEngine

    if get_design(kv_manager).requires:
        pytest.importorskip(get_design(kv_manager).requires, reason="vLLM 0.33 is not installed")
    path, loaded = hybrid_llama
    engine = LLMEngine(EngineConfig(model=str(path), block_size=4, num_gpu_blocks=48, kv_manager=kv_manager,
                                    device="cpu", enable_prefix_caching=True), loaded=loaded)
    manager = engine.kv_manager
    if engine.design is V1 and manager.num_kv_cache_groups == 1:
        pytest.skip("the Llama model does not take per-layer metadata yet: one KV-cache group")
    header = make_header(trace_header(engine))
    assert header["version"] == 2 and [g["kind"] for g in header["kv_cache_groups"]] == ["sliding_window", "full_attention"]
    assert header["kv_cache_groups"][0]["sliding_window"] == 6
    reducer = ReducerState.from_header(header)
    events: list = []
    engine.events.subscribe(events.append)
    engine.events.subscribe(reducer.apply)
    check = check_reducer_matches_v1 if engine.design is V1 else check_reducer_matches_vllm_groups
    opening = "To be, or not to be, that is the question: whether tis nobler"
    params = SamplingParams(max_tokens=12, ignore_eos=True)
    engine.add_request(opening, params)
    for step in range(40):
        if step == 6:
            engine.add_request(opening + " in the mind", params)
        if not engine.has_unfinished_requests() and step > 6:
            break
        engine.step()
        check(reducer, manager)
    assert any(isinstance(e, ev.BlocksSkipped) for e in events)
    assert {e.group for e in events if isinstance(e, ev.PrefixCacheHit)} == {0, 1}
    out = tmp_path / "hybrid-run.jsonl"
    write_trace(out, header, events)
    trace = read_trace(out)
    # a reader gets the events made safe to draw (blockviz/model/safe_text.py): the same state as
    # the run's events made safe, and, but for the token texts' escapes, as the run's own
    from blockviz.model.safe_text import safe_struct
    written = ReducerState.from_header(header).apply_all([safe_struct(e) for e in events])
    assert ReducerState.from_header(trace.header).apply_all(trace.events).freeze() == written.freeze()
    assert written.tables == reducer.tables and written.hash_map == reducer.hash_map

"""`--kv-manager v1`'s KV events against vLLM's own: blockviz's v1 KVCacheManager and vLLM 0.33's
`vllm.v1.core.KVCacheManager` (with `enable_kv_cache_events`) run the seeded random operation
sequences of tests/test_v1_vs_vllm.py; after every operation, what blockviz publishes for it
(blockviz.kvevents.mapping.V1KVEventMapper, encoded as `blockviz publish` writes it and decoded
by vLLM's own `Decoder(type=KVEventBatch)`) must equal what vLLM's `take_events()` returns: one
BlockStored per `cache_full_blocks` call with its parent, duplicates included, one BlockRemoved per
eviction, the same tokens, block size, medium, group and cache-spec kind. Hash values differ by
design (blockviz's own chain), so hashes are paired one to one across the whole sequence.

Also: a live `--kv-manager v1` run, published and decoded by vLLM's decoder, stores each full
block once per request that computed it (duplicates present) and removes only what was evicted.
"""

from __future__ import annotations

import msgspec
import pytest

kv_events = pytest.importorskip(
    "vllm.distributed.kv_events",
    reason="vLLM is not installed (.ci/run installs it: pip install --no-deps vllm==0.33.0 and its pure-Python deps)")
v1_vs_vllm = pytest.importorskip("test_v1_vs_vllm", reason="vLLM's v1 KV cache manager is not importable")

from blockviz.kvevents.mapping import V1KVEventMapper  # noqa: E402
from blockviz.kvevents.protocol import WIRE_FORMATS, encode_batch  # noqa: E402
from engine.designs import V1

decoder = msgspec.msgpack.Decoder(type=kv_events.KVEventBatch)
SAME_FIELDS = ("token_ids", "block_size", "lora_id", "medium", "lora_name", "extra_keys", "group_idx",
               "kv_cache_spec_kind", "kv_cache_spec_sliding_window", "session_id", "lookahead_token_ids")


class EventDifferential(v1_vs_vllm.Differential):
    """tests/test_v1_vs_vllm.py's Differential with vLLM's KV events on and blockviz's mapped,
    compared after every operation (its `check`)."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.theirs.pool.enable_kv_cache_events = True
        self.mapper = V1KVEventMapper(self.block_size)
        self.ours.bus.subscribe(self.mapper)
        self.hash_pairs: dict = {}
        self.reverse_pairs: dict = {}
        self.stored: list = []  # every hash stored, in order (ours)
        self.num_removed = 0

    def check(self) -> None:
        super().check()
        ours = decoder.decode(encode_batch(self.mapper.take_events())).events  # through vLLM's decoder
        theirs = self.theirs.manager.take_events()
        assert_same_kv_events(ours, theirs, self._pair, self._where("KV events"))
        assert all((e.medium, e.group_idx) == ("GPU", 0) for e in ours)  # one group
        self.stored.extend(h for e in ours if isinstance(e, kv_events.BlockStored) for h in e.block_hashes)
        self.num_removed += sum(len(e.block_hashes) for e in ours if isinstance(e, kv_events.BlockRemoved))

    def _pair(self, ours, theirs, where: str) -> None:
        """Our hash and vLLM's name the same block content: one to one over the whole sequence."""
        assert self.hash_pairs.setdefault(ours, theirs) == theirs, where
        assert self.reverse_pairs.setdefault(theirs, ours) == ours, where


def assert_same_kv_events(ours, theirs, pair, where: str) -> None:
    """Our events (decoded by vLLM's decoder) are vLLM's: the same kinds in order, the same number
    of hashes each, paired one to one by `pair(ours, theirs, where)`, parents likewise, and every
    other field (SAME_FIELDS: tokens, tier, group, cache-spec kind and window, ...) equal."""
    assert [type(e).__name__ for e in ours] == [type(e).__name__ for e in theirs], (where, ours, theirs)
    for mine, vllms in zip(ours, theirs):
        assert len(mine.block_hashes) == len(vllms.block_hashes), (where, mine, vllms)
        for a, b in zip(mine.block_hashes, vllms.block_hashes):
            pair(a, b, where)
        assert (mine.medium, mine.group_idx) == (vllms.medium, vllms.group_idx), (where, mine, vllms)
        if isinstance(mine, kv_events.BlockStored):
            assert (mine.parent_block_hash is None) == (vllms.parent_block_hash is None), where
            if mine.parent_block_hash is not None:
                pair(mine.parent_block_hash, vllms.parent_block_hash, where)
            for name in SAME_FIELDS:
                assert getattr(mine, name) == getattr(vllms, name), (where, name, mine, vllms)


def recorded(monkeypatch, module, cls) -> list:
    """Make `module.Differential` a `cls` that records each instance, for module.run_sequence."""
    made: list = []

    class Recorded(cls):
        def __init__(self, *args, **kwargs) -> None:
            super().__init__(*args, **kwargs)
            made.append(self)

    monkeypatch.setattr(module, "Differential", Recorded)
    return made


@pytest.fixture
def event_differential(monkeypatch):
    """run_sequence of tests/test_v1_vs_vllm.py, its Differential checking the KV events too."""
    return recorded(monkeypatch, v1_vs_vllm, EventDifferential)


@pytest.mark.parametrize("chunk", range(3))
def test_v1_kv_events_equal_vllms_own_after_every_operation(event_differential, chunk):
    """120 seeded sequences in three chunks (admit with hits and chunked prefill, decode, free,
    running out of blocks): after every operation blockviz's events, decoded by vLLM, are vLLM's."""
    for seed in range(chunk, 120, 3):
        v1_vs_vllm.run_sequence(seed)
    diffs = event_differential
    assert diffs and all(d.stored for d in diffs[:1])


def test_the_sequences_store_duplicates_and_remove_on_eviction(event_differential):
    """Across the sequences a hash is stored twice (vLLM v1 caches a block even when another one
    holds its hash already) and evicted blocks are removed: the cases the v0 mapping differs on."""
    for seed in range(40):
        v1_vs_vllm.run_sequence(seed)
    duplicates = sum(len(d.stored) - len(set(d.stored)) for d in event_differential)
    removed = sum(d.num_removed for d in event_differential)
    assert duplicates > 0 and removed > 0, (duplicates, removed)


@pytest.mark.parametrize("wire", WIRE_FORMATS, ids=lambda w: w.releases)
def test_every_wire_format_carries_the_group_and_kind(wire):
    """group_idx and kv_cache_spec_kind are written in every release's shape blockviz writes (0.23's
    tagged arrays hold them at their places; older decoders ignore trailing fields)."""
    from blockviz.kvevents.protocol import BlockRemoved, BlockStored, decode_batch

    stored = BlockStored((1, 2), None, (5, 6, 7, 8), 2, medium="GPU", group_idx=0, kv_cache_spec_kind="full_attention")
    removed = BlockRemoved((2,), medium="GPU", group_idx=0)
    decoded = decode_batch(encode_batch([stored, removed], wire=wire)).events
    assert decoded == (stored, removed)
    if not wire.event_arrays:  # the map shapes: vLLM 0.33's own decoder reads them
        theirs = decoder.decode(encode_batch([stored, removed], wire=wire)).events
        assert (theirs[0].group_idx, theirs[0].kv_cache_spec_kind, theirs[1].group_idx) == (0, "full_attention", 0)


def _story_v1():
    """`blockviz run`'s scenario in v1 mode (`publish --live --kv-manager v1`'s run): n=2 as two
    requests, shared openings, a pool small enough to evict."""
    from blockviz.session.scenario import DEFAULT_SCENARIO, DEFAULT_SCENARIO_OPTIONS
    from blockviz.session.spec import EngineSpec

    options = {**DEFAULT_SCENARIO_OPTIONS, "kv_manager": V1.name, "preemption_mode": None}
    return EngineSpec.of(**options, prompts=(), arrivals=DEFAULT_SCENARIO)


def _calls(engine_events) -> list[list]:
    """The engine's cache_full_blocks calls: each run of block_hashed events with nothing between."""
    calls, previous = [], None
    for event in engine_events:
        if event.type == "block_hashed":
            if previous is None or previous.type != "block_hashed":
                calls.append([])
            calls[-1].append(event)
        previous = event
    return calls


def test_a_live_v1_run_publishes_a_store_per_cache_full_blocks_duplicates_and_removals_on_eviction():
    from blockviz.kvevents.mapping import external_hash
    from blockviz.kvevents.publishing import live_batches

    engine_events: list = []
    batches = list(live_batches(_story_v1(), on_event=engine_events.append))
    sent = [e for batch in batches for e in decoder.decode(encode_batch(batch)).events]  # vLLM's decoder
    stores = [e for e in sent if isinstance(e, kv_events.BlockStored)]
    calls = _calls(engine_events)
    assert len(stores) == len(calls) > 0  # one BlockStored per cache_full_blocks call
    for store, call in zip(stores, calls):
        assert list(store.block_hashes) == [external_hash(e.block_hash) for e in call]
        first = call[0]
        assert store.parent_block_hash == (None if first.parent_hash is None else external_hash(first.parent_hash))
        assert list(store.token_ids) == [t for e in call for t in e.token_ids]
        assert (store.group_idx, store.kv_cache_spec_kind, store.medium) == (0, "full_attention", "GPU")
    stored = [h for e in stores for h in e.block_hashes]
    assert len(stored) > len(set(stored))  # duplicates published: two blocks cached under one hash
    assert any(not e.registered for e in engine_events if e.type == "block_hashed")
    removed = [h for e in sent if isinstance(e, kv_events.BlockRemoved) for h in e.block_hashes]
    evicted = [external_hash(e.block_hash) for e in engine_events if e.type == "block_evicted"]
    assert removed == evicted and evicted  # removals on eviction, and only then
    freed_cached = [e for e in engine_events if e.type == "block_freed" and e.ref_count == 0 and e.cached]
    assert len(freed_cached) > len(removed)  # freeing a cached block removes nothing (lazy eviction)


def test_blockviz_publish_live_kv_manager_v1_sends_the_v1_mapping(tmp_path):
    """The command line chooses the v1 mapping: what a subscriber receives from `blockviz publish
    --live --kv-manager v1` is what the same run maps to in this process."""
    from blockviz.kvevents.publishing import live_batches
    from blockviz.kvevents.state import KVEventState
    from blockviz.kvevents.subscriber import KVEventClient
    from test_kv_round_trip import collect, logged, publishing, wait_for_line

    batches = list(live_batches(_story_v1()))
    stored = [h for batch in batches for e in batch if type(e).__name__ == "BlockStored" for h in e.block_hashes]
    removed = [h for batch in batches for e in batch if type(e).__name__ == "BlockRemoved" for h in e.block_hashes]
    with publishing("--live", tmp_path / "publish.log", "--kv-manager", "v1", "--exit-when-done") as (endpoint, replay, log):
        with KVEventClient(endpoint, replay) as client:
            state = KVEventState()
            collect(client, state, len(batches))
        assert "published" in wait_for_line(log, "published")
    assert (logged(state, "stored"), logged(state, "removed")) == (stored, removed)
    assert len(stored) > len(set(stored))
